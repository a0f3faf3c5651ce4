"""SCD-PFL, stochastic coordinate descent on (w, β) (Hanzely, Zhao, Kolar, TMLR 2023, App. A, Alg. 6):
one sample j_m per device per iteration, and

    ζ = w with probability p_w:   w ← w − η (1/(p_w M)) Σ_m ∇_w f_{m,j_m}(w, β_m)      (a communication round)
    else (every device):          β_m ← β_m − η (1/(p_β M)) ∇_β f_{m,j_m}(w, β_m)

It is ASCD-PFL with θ = 0 (x = y) and no z-sequence; η and p_w follow the same rules (Thm 8/9, `pfl_rules`).
"""
from __future__ import annotations

import torch

from fedbench.algorithms.ascd_pfl import ASCDPFL
from fedbench.algorithms.pfl_rules import ETA, P_W, rules


class SCDPFL(ASCDPFL):
    name = "scd_pfl"
    title = "SCD-PFL"
    hparams = (P_W, ETA)

    def derive(self, hp):
        r = rules(self.problem, hp.p_w, hp.eta)
        return {"rules": r, "beta_gain": self.problem.beta_scale / r.p_beta}

    def couple(self, y, z, hp):
        return y  # θ = 0: x = y

    def accelerated_step(self, x, z, g, rules):
        return torch.addcmul(x, rules.eta, g, value=-1), z  # plain SGD; z stays at 0, unused
