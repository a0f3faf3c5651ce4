"""MC-FedDA, multi-stage C-FedDA (Bao, Crawshaw, Luo, Liu, ICML 2022, Algorithm 3; spec 002 §2.3):
C-FedDA restarted in stages with a decreasing λ_m and a shrinking ℛ-ball ε_m around each stage's anchor
(a homotopy).

    for m = 0..M−1:  ŵ_{m+1} ← C-FedDA(anchor = ŵ_m, R_m rounds, λ_m, ε_m)

Restart semantics of the released code (spec 002 §2.3): at a stage start the anchor and w̃ become the
last server iterate ŵ_m (not a weighted average), g ← 0, and the round counter (so A_r and the γ terms)
restarts. The ball step is applied in every client and server prox. Stages are given explicitly
(`stage_rounds`, `stage_lams`, `stage_radii`), as the experiments do, rather than by the theory's
λ_m = 2^{−m}λ₀ and ×4 stage growth; the last stage runs on if the federation has more rounds. The
problem's λ is not used (λ_m replaces it).
"""
from __future__ import annotations

import bisect
import itertools

from fedbench.algorithms.c_fedda import CFedDA
from fedbench.hparams import Param


class MCFedDA(CFedDA):
    name = "mc_fedda"
    requires = frozenset({"norm_ball"})  # the homotopy replaces λ of h = λ·ℛ and restricts to ℛ-balls
    hparams = tuple(p for p in CFedDA.hparams if p.name != "radius") + (
        Param("stage_rounds", "floats", [250, 250, 1500], "rounds R_m of each stage", low=1),
        Param("stage_lams", "floats", [0.125, 0.0625, 0.03125], "λ_m of each stage", low=0),
        Param("stage_radii", "floats", [5000, 2500, 1250], "radius ε_m of each stage's ℛ-ball (.inf: no ball)",
              low=0, low_open=True, infinite=True),
    )

    def __init__(self, problem, **hyperparameters):
        super().__init__(problem, **hyperparameters)
        if not len(self.stage_rounds) == len(self.stage_lams) == len(self.stage_radii):
            raise ValueError(f"mc_fedda: stage_rounds, stage_lams and stage_radii must have one entry per stage, "
                             f"found {len(self.stage_rounds)}, {len(self.stage_lams)}, {len(self.stage_radii)}")
        if any(not float(r).is_integer() for r in self.stage_rounds):
            raise ValueError(f"mc_fedda.stage_rounds: expected whole numbers of rounds, found {self.stage_rounds}")
        self.stage_starts = list(itertools.accumulate([0] + [int(r) for r in self.stage_rounds[:-1]]))
        self.stage_regs = [self.reg.with_lam(lam) for lam in self.stage_lams]

    def _stage(self, round_index: int) -> int:
        return bisect.bisect_right(self.stage_starts, round_index) - 1

    def stage_round(self, round_index):
        return round_index - self.stage_starts[self._stage(round_index)]

    def stage_regularizer(self, round_index):
        return self.stage_regs[self._stage(round_index)]

    def stage_radius(self, round_index):
        radius = self.stage_radii[self._stage(round_index)]
        return None if radius == float("inf") else radius

    def server_update(self, server, message, weights, rnd):
        server = super().server_update(server, message, weights, rnd)
        if self._stage(rnd.index + 1) != self._stage(rnd.index):  # restart at the last iterate
            w = server["w"]
            server = {"g": w.new_zeros(w.shape), "wt": self._alpha(0) * w, "w": w, "anchor": w.clone()}
        return server
