"""Small instances of the shipped problems, shared by the fast tests."""
from __future__ import annotations

import fedbench


def small_lasso(seed=0, **overrides):
    config = dict(clients=8, samples_per_client=20, dim=30, support=10, lam=0.05)
    config.update(overrides)
    return fedbench.make_problem("lasso", seed=seed, **config)


def small_lowrank(seed=0, **overrides):
    config = dict(rows=6, cols=5, rank=2, clients=6, samples_per_client=30)
    config.update(overrides)
    return fedbench.make_problem("lowrank", seed=seed, **config)
