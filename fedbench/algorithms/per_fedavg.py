"""Per-FedAvg, personalized FedAvg via MAML (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020, §3 and §5). The
clients run local steps on the meta-function F_i(w) = f_i(w − α∇f_i(w)) (eq. 4), whose gradient is
(I − α∇²f_i(w)) ∇f_i(w − α∇f_i(w)) (eq. 5), estimated with three independent minibatches D, D′, D″ (eq. 8):

    w̃ = w − α ∇f̃(w; D)                 (the one-step adapted model)
    v = ∇f̃(w̃; D′)
    exact (Alg. 1):  direction = v − α ∇²f̃(w; D″) v                         (an HVP at the un-adapted w)
    fo   (§5 (i)):   direction = v                                           (FO-MAML, the Hessian term dropped)
    hf   (§5 (ii)):  direction = v − α (∇f̃(w + δv; D″) − ∇f̃(w − δv; D″))/(2δ)  (App. H eqs. 119–121; the
                     main text's "/δ" and its u are typos)
    local step:  w ← w − β direction,  τ times;   server:  w ← the plain average of the participants' w

The same batch D″ serves both HF evaluations (its noise cancels). D″ = D′ with `hessian_batch_as_outer`
(one draw). With α = 0 every variant is FedAvg on D′. α, β, δ are per-run values (`hp`); the HF coefficient
α/(2δ) is derived once per run (`derive`).
"""
from __future__ import annotations

from fedbench.algorithms.base import Algorithm, HParams, aggregate
from fedbench.hparams import Param
from fedbench.oracle import Batches, Minibatch


class PerFedAvg(Algorithm):
    name = "per_fedavg"
    title = "Per-FedAvg"
    hparams = (
        Param("variant", "choice", "hf", "meta-gradient estimate: exact HVP, first order, or Hessian-free",
              choices=("exact", "fo", "hf"), labels=(("exact", "exact HVP"), ("fo", "FO"), ("hf", "HF"))),
        Param("alpha", "float", 0.01, "personalization step α (inner step and the test-time step)", low=0),
        Param("client_lr", "float", 0.001, "outer (local) step β", low=0, low_open=True, log=True),
        Param("delta", "float", 1e-3, "HF finite-difference radius δ (perturbation δ·v)", low=0, low_open=True,
              log=True),
        Param("inner_batch", "int", 40, "|D|, the inner step's batch", low=1),
        Param("outer_batch", "int", 40, "|D′|, the batch of the gradient at the adapted model", low=1),
        Param("hessian_batch", "int", 40, "|D″|, the batch of the Hessian term (exact, hf)", low=1),
        Param("hessian_batch_as_outer", "bool", False, "D″ = D′ (no third draw)"),
    )

    @classmethod
    def requirements(cls, hp):
        return super().requirements(hp) | ({"hvp"} if hp["variant"] == "exact" else set())

    def derive(self, hp):
        return {"hf_scale": hp.alpha / (2 * hp.delta)}  # α/(2δ), the central difference's coefficient

    @classmethod
    def minibatches(cls, hp):
        batches = (Minibatch("D", size="inner_batch"), Minibatch("D1", size="outer_batch"))
        if hp["variant"] == "fo":
            return batches
        third = (Minibatch("D2", same_as="D1") if hp["hessian_batch_as_outer"]
                 else Minibatch("D2", size="hessian_batch"))
        return (*batches, third)

    def direction(self, w, batches: Batches, hp: HParams):
        """The stochastic meta-gradient of eq. (8) (or its FO / HF estimate) at w `[R, S, d]`, with the runs'
        values `hp` (or at one run's `[S, d]` with its own, `self.hp`)."""
        v = batches.D1.grad(w - hp.alpha * batches.D.grad(w))
        if hp.variant == "fo":
            return v
        if hp.variant == "exact":
            return v - hp.alpha * batches.D2.hvp(w, v)
        difference = batches.D2.grad(w + hp.delta * v) - batches.D2.grad(w - hp.delta * v)
        return v - hp.hf_scale * difference

    def client_step(self, local, batches, rnd, hp):  # from its own copy of w, which it uploads (the defaults)
        u = local["w"]
        return {"w": u - hp.client_lr * self.direction(u, batches, hp)}

    def server_update(self, server, message, weights, rnd, hp):
        return {"w": aggregate(message["w"], weights)}
