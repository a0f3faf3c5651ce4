"""SVRCD-PFL, variance-reduced coordinate descent on (w, β) (Hanzely, Zhao, Kolar, TMLR 2023, Appendix A,
Algorithm 7): ASVRCD-PFL with θ1 = θ2 = 0 and no z-sequence, so the estimate is taken at y itself:

    with probability ρ: v ← y, recompute ∇F(v)
    ζ = w with probability p_w:  g_w = (1/p_w)(1/M) Σ_m [∇_w f_{m,j}(y) − ∇_w f_{m,j}(v)] + ∇_w F(v),  g_β = ∇_β F(v)
    else:                        g_w = ∇_w F(v),  g_m = (1/p_β)(1/M)[∇_β f_{m,j}(y) − ∇_β f_{m,j}(v)] + ∇_{β_m} F(v)
    y ← y − η g

(the printed Alg. 7 lacks the "− ∇f_{m,j}(v)" terms; the code subtracts them, the SVRG form used here).
"""
from __future__ import annotations

import torch

from fedbench.algorithms.asvrcd_pfl import ASVRCDPFL


class SVRCDPFL(ASVRCDPFL):
    name = "svrcd_pfl"
    title = "SVRCD-PFL"

    def couple(self, y, z, v, hp):
        return y

    def accelerated_step(self, x, z, g, rules):
        return torch.addcmul(x, rules.eta, g, value=-1), z  # z stays at 0, unused
