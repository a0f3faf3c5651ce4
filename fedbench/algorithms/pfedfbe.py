"""pFedFBE, personalized federated composite learning with forward-backward envelopes (the pFedFBE paper, an
anonymous ICLR 2023 submission, §2.1–2.2, Algorithm 1). Each client's composite loss f_i + h is replaced by its FBE

    F_i(w) = f_i(w) − ‖∇f_i(w)‖²/(2λ) + M_{λh}(w − ∇f_i(w)/λ)                                       (eq. 5)

whose gradient (λI − ∇²f_i(w))(w − T_i(w)), T_i(w) = prox_{h/λ}(w − ∇f_i(w)/λ) (eq. 6) the clients follow:

    client i, local step t (minibatches D, D̂):
        g ← ∇f̃_i(w; D);   θ ← prox_{h/λ}(w − g/λ);   u ← w − θ
        w ← w − η (λu − ∇²f̃_i(w; D̂) u)                                                            (eq. 9)
    server: w ← Σ π̂_i w_i  (Algorithm 1: the plain average; `aggregation: uniform`, the federation's default)

The personal model of client i is θ_i(w) = prox_{h/λ}(w − ∇f_i(w)/λ) on its full training data (eq. (8)
with the 1/λ on ∇f_i that its print omits, as Algorithm 1 and eq. (6) have it), computed for every client at
evaluation, at the global w (`personal_point: global`) or at the client's last local iterate (`last_local`), per
run with its own λ. Rows also carry the FBE objective F(w) = mean_i F_i(w) (eq. 5) at the global w.

Hessian-vector products (`hvp`): `finite_diff` (∇f̃(w + τu; D̂) − ∇f̃(w; D̂))/τ with τ = ε/max(‖u‖, 1e-12),
ε = 1e-3 in float32 and 1e-6 in float64 (the paper, §2.2, asks only for a small τ > 0); `autograd` (torch.func's
HVP); `exact` (the problem's closed form, least squares); `none` (g = λu: the first-order estimate, §2.2).
`hvp_batch`: `same` (D̂ = D: the paper's "two minibatch gradient evaluations", §2.2) or `independent`
(Algorithm 1 literally).

F_i is C¹ only when λ > L (the clients' smoothness; the paper, §2.1): before the first round the algorithm
estimates L by power iteration on every client's full-data Hessian at w₀ and refuses λ ≤ L (`allow_small_lambda`
runs anyway). On the paper's Lasso (§4.1) with an unhalved MSE, L ≈ 2.1e3 exceeds the paper's λ = 2000, and a
simulation of pFedFBE there diverged.
"""
from __future__ import annotations

import torch

from fedbench.algorithms.base import CLIENT_LR, Algorithm, aggregate, per_client_copies
from fedbench.hparams import Param
from fedbench.metrics import Metric
from fedbench.oracle import Minibatch
from fedbench.rng import generator

FINITE_DIFF_EPS = {torch.float32: 1e-3, torch.float64: 1e-6}


class PFedFBE(Algorithm):
    name = "pfedfbe"
    title = "pFedFBE"
    personalized = True
    hparams = (
        CLIENT_LR,
        Param("lam", "float", 2000.0, "FBE parameter λ (> L); the prox step is 1/λ", low=0, low_open=True, log=True),
        Param("hvp", "choice", "exact", "Hessian-vector product: finite_diff, autograd, exact (closed form), none "
              "(first order)", choices=("finite_diff", "autograd", "exact", "none")),
        Param("hvp_batch", "choice", "same", "D̂: the gradient's batch D (same) or an independent one",
              choices=("same", "independent")),
        Param("personal_point", "choice", "global", "θ_i at the global w or at the client's last local iterate",
              choices=("global", "last_local")),
        Param("allow_small_lambda", "bool", False, "run even when λ ≤ the estimated smoothness L"),
        Param("power_iterations", "int", 30, "power-iteration steps of the smoothness estimate (full-data HVPs of "
              "every client)", low=1),
    )

    @classmethod
    def requirements(cls, hp):
        needs = {"full_data", "hvp"}  # θ_i on full local data; power iteration through the HVP
        return super().requirements(hp) | needs | ({"exact_hvp"} if hp["hvp"] == "exact" else set())

    @classmethod
    def declared_metrics(cls, hp):
        return (Metric("fbe_objective", "FBE objective F(w) (eq. 5)", "min"),)

    def __init__(self, problem, **hyperparameters):
        super().__init__(problem, **hyperparameters)
        self._at_global = None  # (the server's w, forward_backward there)

    def derive(self, hp):
        return {"prox_step": 1 / hp.lam}  # 1/λ, the step of prox_{h/λ}

    @classmethod
    def minibatches(cls, hp):
        if hp["hvp"] == "none":
            return (Minibatch("D"),)
        return (Minibatch("D"), Minibatch("D_hat", same_as="D" if hp["hvp_batch"] == "same" else None))

    def init_server(self, w0):
        if not self.hp.allow_small_lambda:
            smoothness = self.estimate_smoothness(w0, self.hp.power_iterations)
            lam = self.hp.lam
            if lam <= smoothness:
                raise ValueError(f"pfedfbe: λ = {lam:g} must exceed the clients' smoothness L ≈ {smoothness:.4g} "
                                 "(power iteration on the full-data Hessians at w₀), or the FBE is not smooth and "
                                 "the method diverges (pFedFBE paper §2.1); raise lam, or set allow_small_lambda: true")
        return {"w": w0.clone()}

    def init_clients(self, w0, num_clients):
        return {"w_last": per_client_copies(w0, num_clients)} if self.hp.personal_point == "last_local" else {}

    def client_step(self, local, batches, rnd, hp):
        w = local["w"]
        g = batches.D.grad(w)
        u = w - self.reg.prox(w - g / hp.lam, hp.prox_step)
        return {"w": w - hp.client_lr * (hp.lam * u - self.hessian_times(batches, w, u, g, hp))}

    def hessian_times(self, batches, w, u, g, hp):
        """∇²f̃(w; D̂) u as `hvp` says (0 for the first-order estimate)."""
        if hp.hvp == "none":
            return 0.0
        oracle = batches.D_hat
        if hp.hvp == "exact":
            return oracle.hvp(w, u)
        if hp.hvp == "autograd":
            return oracle.autograd_hvp(w, u)
        base = g if hp.hvp_batch == "same" else oracle.grad(w)
        tau = FINITE_DIFF_EPS[w.dtype] / torch.linalg.vector_norm(u, dim=-1, keepdim=True).clamp_min(1e-12)
        return (oracle.grad(w + tau * u) - base) / tau

    def client_final(self, local, rnd, hp):
        return {"w": local["w"]}, ({"w_last": local["w"]} if hp.personal_point == "last_local" else {})

    def server_update(self, server, message, weights, rnd, hp):
        return {"w": aggregate(message["w"], weights)}

    # -- the personal models and the FBE --------------------------------------------------------------
    def personal_params(self, server, clients):
        """θ_i = prox_{h/λ}(p_i − ∇f_i(p_i)/λ) on client i's full data, p_i the global w or its last iterate."""
        if self.hp.personal_point == "last_local":
            return self.forward_backward(clients["w_last"])[0]
        return self.at_global(server)[0]

    def forward_backward(self, points):
        """(T_i(p_i), f_i(p_i), ∇f_i(p_i)) for every client, `points` `[N, d]`."""
        everyone = torch.arange(self.problem.num_clients, device=points.device)
        losses, grads = self.problem.client_loss_and_grad(points, everyone)
        return self.reg.prox(points - grads / self.hp.lam, self.hp.prox_step), losses, grads

    def at_global(self, server):
        """`forward_backward` at the server's w for every client, computed once per server state (the personal
        models and the FBE objective of one evaluation share it)."""
        if self._at_global is None or self._at_global[0] is not server["w"]:
            self._at_global = (server["w"], self.forward_backward(per_client_copies(server["w"],
                                                                                    self.problem.num_clients)))
        return self._at_global[1]

    def evaluate(self, server, clients):
        """F(w) = mean_i [f_i(w) − ‖∇f_i(w)‖²/(2λ) + h(T_i) + (λ/2)‖T_i − (w − ∇f_i(w)/λ)‖²] (eq. 5)."""
        targets, losses, grads = self.at_global(server)
        lam = self.hp.lam
        shifted = server["w"] - grads / lam
        envelope = self.reg.value(targets) + lam / 2 * (targets - shifted).square().sum(-1)
        fbe = losses - grads.square().sum(-1) / (2 * lam) + envelope
        return {"fbe_objective": float(fbe.mean())}

    def estimate_smoothness(self, w0, iterations: int) -> float:
        """max_i λ_max(∇²f_i(w₀)) by power iteration on all clients' full-data Hessians at once (a fixed
        start, so every trial of an instance gets the same estimate)."""
        problem = self.problem
        everyone = torch.arange(problem.num_clients, device=w0.device)
        points = per_client_copies(w0, problem.num_clients)
        v = torch.randn(points.shape, generator=generator(0, "power-iteration"), dtype=w0.dtype).to(w0.device)
        for _ in range(iterations):
            v = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(1e-30)
            hv = problem.client_hvp(points, v, everyone)
            largest = (v * hv).sum(-1)  # the Rayleigh quotient of the normalized v
            v = hv
        return float(largest.max())
