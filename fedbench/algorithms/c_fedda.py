"""C-FedDA, constrained federated dual averaging (Bao, Crawshaw, Luo, Liu, ICML 2022, §3.3,
Algorithm 2): round-level weights α_r, an optional ℛ-ball around the anchor w₀, and a server-only
iterate history w̃_r, so that clients upload only g (p floats).

    CProx_r(z) = argmin_{ℛ(w − w₀) ≤ ε₀} ⟨w, z − γEw₀⟩ + (μA_r/2 + γ)E‖w‖²/2 + A_r E h(w)
               = dual-averaging prox of z/E with weight A_r (closed form, then the ball step)
    client k, round r:  g_k ← g;  u ← w̄_r
        for j = 0..E−1:  g_k ← g_k + α_r ∇f(u; minibatch);   if j < E−1:  u ← CProx_r(g_k − μE w̃_r/2)
    server:  g ← Σ π̂_k g_k;   w̄_{r+1} ← CProx_r(g − μE w̃_r/2);   w̃_{r+1} ← w̃_r + α_{r+1} w̄_{r+1}

Conventions (the paper against its authors' MATLAB code, github.com/MingruiLiu-ML-Lab/Federated-Sparse-Learning):
* `gamma_convention`: `code` [default] — γ multiplies the per-step quadratic as in the released
  scripts, so the paper's γ is γ_code / E (Appendix F's "L = 600" is γ_code); `paper` — γ as written.
* `radius`: ε₀ of the ball (None: no ball, as every released C-FedDA run). `constrained_prox`:
  `sequential` (threshold then project, `l1_soft_cs` / `nuc_prox_cs`) [default] or `exact` (ℓ1 only).
* `alpha`: const α ≡ 1 [default, code] or quadratic (r + a)² per round.
* `local_order`: `grad_then_prox` [default] or `prox_then_grad` (NuclearRun.m: each step first
  computes u ← CProx_r(g_k − μE w̃_r/2) from the g_k it holds, then takes the gradient there).
CProx_r is the same map all round (w̃_r, w₀, A_r are the server's): what it fixes is computed once per round
(`round_prox`), clients' steps only divide, shift and threshold.
The round counter r, the anchor and the weights restart with each MC-FedDA stage (`mc_fedda.py`).
"""
from __future__ import annotations

from typing import ClassVar

from fedbench.algorithms.base import Upload, aggregate, broadcast
from fedbench.algorithms.dual_averaging import (
    ALPHA,
    ALPHA_OFFSET,
    LOCAL_ORDER,
    MU,
    DualAveraging,
    alpha,
    cumulative_alpha,
    divide,
)
from fedbench.hparams import Param

GAMMA_CONVENTION = Param("gamma_convention", "choice", "code", "γ per local step (code: paper γ = γ/E) or per round",
                         choices=("code", "paper"))
CONSTRAINED_PROX = Param("constrained_prox", "choice", "sequential",
                         "ball-constrained prox: threshold then project (code) or exact (ℓ1 only)",
                         choices=("sequential", "exact"))


class CFedDA(DualAveraging):
    name = "c_fedda"
    title = "C-FedDA"
    hparams: ClassVar[tuple[Param, ...]] = (
        MU,
        Param("gamma", "float", 600.0, "anchor weight γ (see gamma_convention)", low=0, low_open=True, log=True),
        GAMMA_CONVENTION,
        ALPHA,
        ALPHA_OFFSET,
        LOCAL_ORDER,
        Param("radius", "float", None,
              "radius ε₀ of the ℛ-ball around the anchor (None: no ball; a radius requires norm_ball)", low=0,
              low_open=True, nullable=True),
        CONSTRAINED_PROX,
    )
    downloads = ("g", "wt", "w")
    uploads = (Upload("g", relative_to="g"),)

    @classmethod
    def requirements(cls, hp):
        return super().requirements(hp) | ({"norm_ball"} if hp.get("radius") is not None else set())

    # -- what a stage fixes: MC-FedDA overrides these three ------------------------------------
    def stage_round(self, round_index: int, hp) -> int:
        return round_index

    def stage_regularizer(self, round_index: int, hp):
        return self.reg

    def stage_radius(self, round_index: int, hp):
        return hp.radius

    # -- CProx_r ----------------------------------------------------------------------------------
    def round_prox(self, server, round_index: int, local_steps: int, hp) -> dict:
        """What CProx_r fixes in round r, from the server's w̃_r and anchor w₀ `[R, 1, d]`: with γ' = γ/E (code) or
        γ (paper) and c = μA_r/2 + γ', the shift γ'w₀ (`pull`), the history term μw̃_r/2, c and the prox step
        A_r/c (`dual_averaging.dual_averaging_prox` of z/E, its terms in its order)."""
        gamma = hp.gamma / local_steps if hp.gamma_convention == "code" else hp.gamma
        total = cumulative_alpha(self.stage_round(round_index, hp), hp.alpha, hp.a)
        c = hp.half_mu * total + gamma
        return {"pull": gamma * server["anchor"], "history": hp.half_mu * server["wt"], "c": c,
                "step": divide(total, c), "anchor": server["anchor"]}

    def cprox(self, g, terms: dict, round_index: int, local_steps: int, hp):
        """CProx_r(g − μE w̃_r/2): the dual-averaging prox of z = g/E − μw̃_r/2 with weight A_r, in the ball."""
        z = g / local_steps - terms["history"]
        return self.stage_regularizer(round_index, hp).prox_in_ball(
            (terms["pull"] - z) / terms["c"], terms["step"], terms["anchor"], self.stage_radius(round_index, hp),
            hp.constrained_prox == "exact")

    def _weighted(self, round_index: int, x, hp):
        """α_r·x of the stage's round r (x itself for α ≡ 1: the same float)."""
        return x if hp.alpha == "const" else alpha(self.stage_round(round_index, hp), hp.alpha, hp.a) * x

    # -- the round --------------------------------------------------------------------------------
    def client_init(self, server, rows, rnd, hp):
        return {"g": broadcast(server["g"], rnd), "u": broadcast(server["w"], rnd),
                **self.round_prox(server, rnd.index, rnd.local_steps, hp)}

    def client_step(self, local, batches, rnd, hp):
        if hp.local_order == "prox_then_grad":
            u = self.cprox(local["g"], local, rnd.index, rnd.local_steps, hp)
            return {**local, "g": local["g"] + self._weighted(rnd.index, batches.D.grad(u), hp), "u": u}
        g = local["g"] + self._weighted(rnd.index, batches.D.grad(local["u"]), hp)
        u = local["u"]
        if not rnd.is_last_step:
            u = self.cprox(g, local, rnd.index, rnd.local_steps, hp)
        return {**local, "g": g, "u": u}

    def server_update(self, server, message, weights, rnd, hp):
        g = aggregate(message["g"], weights)
        w = self.cprox(g, self.round_prox(server, rnd.index, rnd.local_steps, hp), rnd.index, rnd.local_steps, hp)
        r = self.stage_round(rnd.index, hp)
        wt = server["wt"] + (w if hp.alpha == "const" else alpha(r + 1, hp.alpha, hp.a) * w)
        return {"g": g, "wt": wt, "w": w, "anchor": server["anchor"]}
