"""MC-FedDA, multi-stage C-FedDA (Bao, Crawshaw, Luo, Liu, ICML 2022, §3.4, Algorithm 3):
C-FedDA restarted in stages with a decreasing λ_m and a shrinking ℛ-ball ε_m around each stage's anchor
(a homotopy).

    for m = 0..M−1:  ŵ_{m+1} ← C-FedDA(anchor = ŵ_m, R_m rounds, λ_m, ε_m)

Restart semantics of the authors' released MATLAB code: at a stage start the anchor and w̃ become the
last server iterate ŵ_m (not a weighted average), g ← 0, and the round counter (so A_r and the γ terms)
restarts. The ball step is applied in every client and server prox. Stages are given explicitly
(`stage_rounds`, `stage_lams`, `stage_radii`), as the experiments do, rather than by the theory's
λ_m = 2^{−m}λ₀ and ×4 stage growth; the last stage runs on if the federation has more rounds, and stages that
begin after the run's last round are warned of (`caveats`: a run shortened with its stages as they are). The
problem's λ is not used (λ_m replaces it). The stage lists are the same for every run of a program; the stages'
first rounds and regularizers h_m = λ_m·ℛ are derived from them (`derive`).
"""
from __future__ import annotations

import itertools

from fedbench.algorithms.c_fedda import CFedDA
from fedbench.algorithms.dual_averaging import alpha
from fedbench.hparams import Param, ParamError


class MCFedDA(CFedDA):
    name = "mc_fedda"
    title = "MC-FedDA"
    requires = frozenset({"norm_ball"})  # the homotopy replaces λ of h = λ·ℛ and restricts to ℛ-balls
    hparams = tuple(p for p in CFedDA.hparams if p.name != "radius") + (
        Param("stage_rounds", "floats", [250, 250, 1500], "rounds R_m of each stage", low=1),
        Param("stage_lams", "floats", [0.125, 0.0625, 0.03125], "λ_m of each stage", low=0),
        Param("stage_radii", "floats", [5000, 2500, 1250], "radius ε_m of each stage's ℛ-ball (.inf: no ball)",
              low=0, low_open=True, infinite=True),
    )

    @classmethod
    def check(cls, hp):
        stages = len(hp["stage_rounds"])
        for name in ("stage_lams", "stage_radii"):
            if len(hp[name]) != stages:
                raise ParamError(name, f"found {len(hp[name])} stages, expected {stages}, one entry per stage as "
                                 "stage_rounds has", cls.name)
        if any(not float(r).is_integer() for r in hp["stage_rounds"]):
            raise ParamError("stage_rounds", f"found {hp['stage_rounds']}, expected whole numbers of rounds", cls.name)

    @classmethod
    def caveats(cls, hp, rounds):
        stages = [int(r) for r in hp["stage_rounds"]]
        starts = list(itertools.accumulate([0] + stages[:-1]))
        reached = sum(start < rounds for start in starts)
        if reached == len(stages):
            return {}
        later, count = ", ".join(map(str, starts[reached:])), len(stages)
        unreached = f"stage {count} beginning at round" if reached == count - 1 else \
            f"stages {reached + 1}–{count} beginning at rounds"
        return {"stage_rounds": f"found {stages} for {rounds} rounds: the run ends in stage {reached} of {count}, "
                                f"{unreached} {later}{scaled(stages, rounds)}"}

    def derive(self, hp):
        return {**super().derive(hp),
                "stage_starts": list(itertools.accumulate([0] + [int(r) for r in hp.stage_rounds[:-1]])),
                "stage_regularizers": [self.reg.with_lam(lam) for lam in hp.stage_lams]}

    @staticmethod
    def _stage(round_index: int, hp) -> int:
        # the stages begun by round r, counted: `bisect` is C code, which a compiled step (`fedbench.engine.compiling`)
        # cannot trace
        return sum(start <= round_index for start in hp.stage_starts) - 1

    def stage_round(self, round_index, hp):
        return round_index - hp.stage_starts[self._stage(round_index, hp)]

    def stage_regularizer(self, round_index, hp):
        return hp.stage_regularizers[self._stage(round_index, hp)]

    def stage_radius(self, round_index, hp):
        radius = hp.stage_radii[self._stage(round_index, hp)]
        return None if radius == float("inf") else radius

    def server_update(self, server, message, weights, rnd, hp):
        server = super().server_update(server, message, weights, rnd, hp)
        if self._stage(rnd.index + 1, hp) != self._stage(rnd.index, hp):  # restart at the last iterate
            w = server["w"]
            server = {"g": w.new_zeros(w.shape), "wt": alpha(0, hp.alpha, hp.a) * w, "w": w, "anchor": w.clone()}
        return server


def scaled(stages: list[int], rounds: int) -> str:
    """The stage lengths in the same proportions within `rounds` rounds, each stage at least a round, as a
    suggestion (none where the stages do not fit)."""
    total = sum(stages)
    head = [max(1, stage * rounds // total) for stage in stages[:-1]]
    if sum(head) >= rounds:
        return ""
    return f"; in the same proportions: stage_rounds=[{','.join(map(str, [*head, rounds - sum(head)]))}]"
