"""C-FedDA, constrained federated dual averaging (Bao, Crawshaw, Luo, Liu, ICML 2022, Algorithm 2;
spec 002 §2.2): round-level weights α_r, an optional ℛ-ball around the anchor w₀, and a server-only
iterate history w̃_r, so that clients upload only g (p floats).

    CProx_r(z) = argmin_{ℛ(w − w₀) ≤ ε₀} ⟨w, z − γEw₀⟩ + (μA_r/2 + γ)E‖w‖²/2 + A_r E h(w)
               = dual-averaging prox of z/E with weight A_r (closed form, then the ball step)
    client k, round r:  g_k ← g;  u ← w̄_r
        for j = 0..E−1:  g_k ← g_k + α_r ∇f(u; minibatch);   if j < E−1:  u ← CProx_r(g_k − μE w̃_r/2)
    server:  g ← Σ π̂_k g_k;   w̄_{r+1} ← CProx_r(g − μE w̃_r/2);   w̃_{r+1} ← w̃_r + α_{r+1} w̄_{r+1}

Conventions (spec 002 §2.2, §2.7, §7 items 4–5):
* `gamma_convention`: `code` [default] — γ multiplies the per-step quadratic as in the released
  scripts, so the paper's γ is γ_code / E (Appendix F's "L = 600" is γ_code); `paper` — γ as written.
* `radius`: ε₀ of the ball (None: no ball, as every released C-FedDA run). `constrained_prox`:
  `sequential` (threshold then project, `l1_soft_cs` / `nuc_prox_cs`) [default] or `exact` (ℓ1 only).
* `alpha`: const α ≡ 1 [default, code] or quadratic (r + a)² per round.
* `local_order`: `grad_then_prox` [default] or `prox_then_grad` (NuclearRun.m: each step first
  computes u ← CProx_r(g_k − μE w̃_r/2) from the g_k it holds, then takes the gradient there).
The round counter r, the anchor and the weights restart with each MC-FedDA stage (`mc_fedda.py`).
"""
from __future__ import annotations

from fedbench.algorithms.base import aggregate, broadcast
from fedbench.algorithms.dual_averaging import (ALPHA, ALPHA_OFFSET, LOCAL_ORDER, MU, DualAveraging,
                                                cumulative_alpha, dual_averaging_prox)
from fedbench.hparams import Param

GAMMA_CONVENTION = Param("gamma_convention", "choice", "code", "γ per local step (code: paper γ = γ/E) or per round",
                         choices=("code", "paper"))
CONSTRAINED_PROX = Param("constrained_prox", "choice", "sequential",
                         "ball-constrained prox: threshold then project (code) or exact (ℓ1 only)",
                         choices=("sequential", "exact"))


class CFedDA(DualAveraging):
    name = "c_fedda"
    runs_axis = True
    hparams = (
        MU,
        Param("gamma", "float", 600.0, "anchor weight γ (see gamma_convention)", low=0, low_open=True, log=True),
        GAMMA_CONVENTION,
        ALPHA,
        ALPHA_OFFSET,
        LOCAL_ORDER,
        Param("radius", "float", None, "radius ε₀ of the ℛ-ball around the anchor (None: no ball; a radius requires norm_ball)", low=0,
              low_open=True, nullable=True),
        CONSTRAINED_PROX,
    )
    downloads = ("g", "wt", "w")

    @classmethod
    def requirements(cls, hp):
        return super().requirements(hp) | ({"norm_ball"} if hp.get("radius") is not None else set())

    # -- what a stage fixes: MC-FedDA overrides these three ------------------------------------
    def stage_round(self, round_index: int) -> int:
        return round_index

    def stage_regularizer(self, round_index: int):
        return self.reg

    def stage_radius(self, round_index: int) -> float | None:
        return self.radius

    def _cprox(self, g, wt, anchor, round_index: int, local_steps: int):
        """CProx_r(g − μE w̃_r/2) as the dual-averaging prox of (g − μE w̃_r/2)/E with weight A_r."""
        r = self.stage_round(round_index)
        gamma = self.gamma / local_steps if self.gamma_convention == "code" else self.gamma
        return dual_averaging_prox(self.stage_regularizer(round_index), g / local_steps - self.mu * wt / 2, anchor,
                                   cumulative_alpha(r, self.alpha, self.a), self.mu, gamma,
                                   self.stage_radius(round_index), self.constrained_prox == "exact")

    def client_init(self, server, rows, rnd):
        return {"g": broadcast(server["g"], rnd), "u": broadcast(server["w"], rnd), "wt": server["wt"].unsqueeze(-2),
                "anchor": server["anchor"].unsqueeze(-2)}

    def client_step(self, local, batches, rnd, step):
        weight = self._alpha(self.stage_round(rnd.index))
        if self.local_order == "prox_then_grad":
            u = self._cprox(local["g"], local["wt"], local["anchor"], rnd.index, rnd.local_steps)
            return {**local, "g": local["g"] + weight * batches.D.grad(u), "u": u}
        g = local["g"] + weight * batches.D.grad(local["u"])
        u = local["u"]
        if step < rnd.local_steps - 1:
            u = self._cprox(g, local["wt"], local["anchor"], rnd.index, rnd.local_steps)
        return {**local, "g": g, "u": u}

    def client_final(self, local, rnd):
        return {"g": local["g"]}, {}

    def server_update(self, server, message, weights, rnd):
        g = aggregate(message["g"], weights)
        w = self._cprox(g, server["wt"], server["anchor"], rnd.index, rnd.local_steps)
        wt = server["wt"] + self._alpha(self.stage_round(rnd.index) + 1) * w
        return {"g": g, "wt": wt, "w": w, "anchor": server["anchor"]}
