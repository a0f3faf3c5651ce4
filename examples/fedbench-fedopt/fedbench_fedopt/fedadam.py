"""FedAdam: Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2 with Adam's second moment

    v_t = β2 v_{t−1} + (1 − β2) Δ_t²

on the round's average client change Δ_t; local SGD, m_t and the server step are `FedOpt`'s.
"""
from __future__ import annotations

from fedbench_fedopt.fedopt import FedOpt


class FedAdam(FedOpt):
    name = "fedadam"

    def second_moment(self, v, delta_sq, hp):
        return hp.beta2 * v + (1 - hp.beta2) * delta_sq
