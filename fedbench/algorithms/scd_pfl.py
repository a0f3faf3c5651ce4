"""SCD-PFL, stochastic coordinate descent on (w, β) (Hanzely, Zhao, Kolar, Appendix A, Algorithm 6; spec 003 §3.5):
one sample j_m per device per iteration, and

    ζ = w with probability p_w:   w ← w − η (1/(p_w M)) Σ_m ∇_w f_{m,j_m}(w, β_m)      (a communication round)
    else (every device):          β_m ← β_m − η (1/(p_β M)) ∇_β f_{m,j_m}(w, β_m)

It is ASCD-PFL with θ = 0 (x = y) and no z-sequence; η and p_w follow the same rules (Thm 8/9, `pfl_rules`).
"""
from __future__ import annotations

from fedbench.algorithms.ascd_pfl import ASCDPFL
from fedbench.algorithms.base import Algorithm, add_scaled
from fedbench.algorithms.pfl_rules import ETA, P_W, rules


class SCDPFL(ASCDPFL):
    name = "scd_pfl"
    hparams = (P_W, ETA)
    run_hparams = ("p_w", "eta")
    run_derived = ("rules",)

    def __init__(self, problem, **hyperparameters):
        Algorithm.__init__(self, problem, **hyperparameters)
        self.rules = rules(problem, self.p_w, self.eta)
        self.coupling = 0.0

    def accelerated_step(self, x, z, g):
        return add_scaled(x, -self.rules.eta, g), z  # plain SGD; z stays at 0, unused
