"""FedYogi: Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2 with Yogi's second moment

    v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²)

on the round's average client change Δ_t: v moves toward Δ_t² by a step of (1 − β2) Δ_t², whatever v's size
(Adam's moves by (1 − β2)(v_{t−1} − Δ_t²)), so a large v shrinks slowly. Local SGD, m_t and the server step are
`FedOpt`'s.
"""
from __future__ import annotations

import torch

from fedbench_fedopt.fedopt import FedOpt


class FedYogi(FedOpt):
    name = "fedyogi"

    def second_moment(self, v, delta_sq, hp):
        return v - (1 - hp.beta2) * delta_sq * torch.sign(v - delta_sq)
