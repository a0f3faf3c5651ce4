"""Centralized reference of the FeDXL paper (Guo, Jin, Luo, Yang, ICML 2023, §4): one machine with all training data
running SOX (Wang & Yang 2022) for a compositional X-risk, or mini-batch SGD on the pairs (with
`beta: 1`) for a linear one. As the released code runs it (the same script with world size 1), this is
Local Pair on a problem with one client holding everything: `pauc` with `pooled: true`, where each
sample keeps its original client's feature noise, so that the data distribution is the federated one.
"""
from __future__ import annotations

from fedbench.algorithms.local_pair import LocalPair


class Centralized(LocalPair):
    name = "centralized"
    title = "Centralized"
    requires = frozenset({"pair_scores", "one_client"})  # pauc with pooled: true
