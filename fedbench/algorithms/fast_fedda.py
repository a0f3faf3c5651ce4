"""Fast-FedDA (Bao, Crawshaw, Luo, Liu, ICML 2022, §2.1, Algorithm 1): federated dual
averaging whose prox adds strong-convexity quadratics centred at past iterates. Clients exchange the
α-weighted cumulative gradient g and the α-weighted cumulative iterate w̃ (2p floats each way).

    Prox_t(z) = argmin_w ⟨w, z − γw₀⟩ + (μA_t/2 + γ)‖w‖²/2 + A_t h(w)          (§2.1; eq. (13), App. B.2)
    client k, round r (t = rE + j):  g_k ← g;  w̃_k ← w̃;  u ← w
        for j = 0..E−1:  g_k ← g_k + α_t ∇f(u; minibatch)
                         if j < E−1:  u ← Prox_t(g_k − μw̃_k/2);  w̃_k ← w̃_k + α_{t+1} u
    server:  g ← Σ π̂_k g_k;  w̃ ← Σ π̂_k w̃_k;  w ← Prox_{(r+1)E−1}(g − μw̃/2);  w̃ ← w̃ + α_{(r+1)E} w

Conventions (the paper's theory against the authors' released MATLAB scripts):
* `alpha`: const α ≡ 1 (released code, default) or quadratic (t + a)² (theory; γ = 2μa³ there, here γ
  is free).
* `local_order`: `grad_then_prox` (LassoRun.m, EmnistRun.m) [default] or `prox_then_grad`
  (NuclearRun.m: every step first recomputes u ← Prox(g_k − μw̃_k/2) from the g_k it holds, with
  A = t + 1, then takes the gradient there and adds u to w̃_k).
* `reference_compat` (grad_then_prox only): the released scripts also prox and add to w̃_k at the
  last local step, so w̃ gains one extra iterate per round [default true, as the code].
γ here is the paper's γ (Appendix F's "L = 550" is this γ: it is the variable `gamma` of the released code).
The anchor term γw₀ of the prox is the same all round: clients compute it once (`pull`).
"""
from __future__ import annotations

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


class FastFedDA(DualAveraging):
    name = "fast_fedda"
    title = "Fast-FedDA"
    hparams = (
        MU,
        Param("gamma", "float", 550.0, "anchor weight γ (paper convention)", low=0, low_open=True, log=True),
        ALPHA,
        ALPHA_OFFSET,
        LOCAL_ORDER,
        Param("reference_compat", "bool", True, "prox and w̃ update at the last local step too (released code)"),
    )
    downloads = ("g", "wt")  # w is recomputable from them
    uploads = (Upload("g", relative_to="g"), Upload("wt", relative_to="wt"))

    def _prox(self, g, wt, t: int, pull, hp):
        """Prox_t(g − μw̃/2) = prox_{(A_t/c)·h}((γw₀ − g + μw̃/2)/c), c = μA_t/2 + γ; `pull` = γw₀."""
        total = cumulative_alpha(t, hp.alpha, hp.a)
        c = hp.half_mu * total + hp.gamma
        return self.reg.prox((pull - (g - hp.half_mu * wt)) / c, divide(total, c))

    @staticmethod
    def _weighted(t: int, x, hp):
        """α_t·x (x itself for α ≡ 1: the same float)."""
        return x if hp.alpha == "const" else alpha(t, hp.alpha, hp.a) * x

    def client_init(self, server, rows, rnd, hp):
        return {"g": broadcast(server["g"], rnd), "wt": broadcast(server["wt"], rnd), "u": broadcast(server["w"], rnd),
                "pull": hp.gamma * server["anchor"]}

    def client_step(self, local, batches, rnd, hp):
        t = rnd.iteration + rnd.step
        g, wt, u, pull = local["g"], local["wt"], local["u"], local["pull"]
        if hp.local_order == "prox_then_grad":
            u = self._prox(g, wt, t, pull, hp)
            return {"g": g + self._weighted(t, batches.D.grad(u), hp), "wt": wt + self._weighted(t, u, hp), "u": u,
                    "pull": pull}
        g = g + self._weighted(t, batches.D.grad(u), hp)
        if not rnd.is_last_step or hp.reference_compat:
            u = self._prox(g, wt, t, pull, hp)
            wt = wt + self._weighted(t + 1, u, hp)
        return {"g": g, "wt": wt, "u": u, "pull": pull}

    def server_update(self, server, message, weights, rnd, hp):
        end = rnd.iteration + rnd.local_steps
        g, wt = aggregate(message["g"], weights), aggregate(message["wt"], weights)
        w = self._prox(g, wt, end - 1, hp.gamma * server["anchor"], hp)
        return {"g": g, "wt": wt + self._weighted(end, w, hp), "w": w, "anchor": server["anchor"]}
