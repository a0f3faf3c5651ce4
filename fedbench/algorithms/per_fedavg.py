"""Per-FedAvg, personalized FedAvg via MAML (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020; spec 004 §2.1–2.5). The
clients run local steps on the meta-function F_i(w) = f_i(w − α∇f_i(w)) (eq. 4), whose gradient is
(I − α∇²f_i(w)) ∇f_i(w − α∇f_i(w)) (eq. 5), estimated with three independent minibatches D, D′, D″ (eq. 8):

    w̃ = w − α ∇f̃(w; D)                 (the one-step adapted model)
    v = ∇f̃(w̃; D′)
    exact (Alg. 1):  direction = v − α ∇²f̃(w; D″) v                         (an HVP at the un-adapted w)
    fo   (§2.4):     direction = v                                           (FO-MAML, the Hessian term dropped)
    hf   (§2.5):     direction = v − α (∇f̃(w + δv; D″) − ∇f̃(w − δv; D″))/(2δ)  (App. H eqs. 119–121; the
                     main text's "/δ" and its u are typos)
    local step:  w ← w − β direction,  τ times;   server:  w ← the plain average of the participants' w

The same batch D″ serves both HF evaluations (its noise cancels). D″ = D′ with `hessian_batch_as_outer`
(one draw). With α = 0 every variant is FedAvg on D′.
"""
from __future__ import annotations

from fedbench.algorithms.base import Algorithm, aggregate, broadcast, per_run
from fedbench.hparams import Param
from fedbench.oracle import Batches, Minibatch


class PerFedAvg(Algorithm):
    name = "per_fedavg"
    runs_axis = True
    run_hparams = ("alpha", "client_lr", "delta")
    hparams = (
        Param("variant", "choice", "hf", "meta-gradient estimate: exact HVP, first order, or Hessian-free",
              choices=("exact", "fo", "hf")),
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

    def minibatches(self):
        batches = (Minibatch("D", size="inner_batch"), Minibatch("D1", size="outer_batch"))
        if self.variant == "fo":
            return batches
        third = Minibatch("D2", same_as="D1") if self.hessian_batch_as_outer else Minibatch("D2", size="hessian_batch")
        return (*batches, third)

    def direction(self, w, batches: Batches):
        """The stochastic meta-gradient of eq. (8) (or its FO / HF estimate) at w `[S, d]`."""
        alpha, delta = per_run(self.alpha, w), per_run(self.delta, w)
        v = batches.D1.grad(w - alpha * batches.D.grad(w))
        if self.variant == "fo":
            return v
        if self.variant == "exact":
            return v - alpha * batches.D2.hvp(w, v)
        difference = batches.D2.grad(w + delta * v) - batches.D2.grad(w - delta * v)
        return v - (alpha / (2 * delta)) * difference

    def client_init(self, server, rows, rnd):
        return {"u": broadcast(server["w"], rnd)}

    def client_step(self, local, batches, rnd, step):
        u = local["u"]
        return {"u": u - per_run(self.client_lr, u) * self.direction(u, batches)}

    def client_final(self, local, rnd):
        return {"u": local["u"]}, {}

    def server_update(self, server, message, weights, rnd):
        return {"w": aggregate(message["u"], weights)}
