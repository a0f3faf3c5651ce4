"""Problem registry: name -> class."""
from __future__ import annotations

from typing import Any

from fedbench.metrics import ENGINE_COLUMNS, Metric, epsilon_metric
from fedbench.problems.ab_users import ABUsers
from fedbench.problems.base import Problem
from fedbench.problems.digits import Digits
from fedbench.problems.emnist import EMNIST
from fedbench.problems.lasso import Lasso
from fedbench.problems.lowrank import LowRank
from fedbench.problems.pauc import PartialAUC
from fedbench.problems.pfl import PFLImages, PFLSynthetic
from fedbench.problems.vision import Vision

PROBLEMS: dict[str, type[Problem]] = {cls.name: cls for cls in (Lasso, LowRank, EMNIST, PartialAUC, Digits,
                                                                  PFLSynthetic, PFLImages, ABUsers, Vision)}
"""Every registered problem class by name: the built-in ones, and the plugins registered in this process
(`fedbench.plugins`)."""


def metric_catalog() -> dict[str, Metric]:
    """Every metric any shipped problem declares (with every preset, personal ones included), and the engine's
    columns (`epsilon` without its δ, which the recipe gives), by name: how to label and rank a stored metric when
    its recipe is not at hand."""
    catalog: dict[str, Metric] = {epsilon_metric().name: epsilon_metric()}
    for cls in PROBLEMS.values():
        for preset in cls.presets:
            for metric in (*cls.declared_metrics(cls.resolve_config({"preset": preset}), personal=True),
                           *ENGINE_COLUMNS):
                catalog.setdefault(metric.name, metric)
    return catalog


def make_problem(name: str, seed: int = 0, device: str = "cpu", **config: Any) -> Problem:
    """The registered problem `name` built with its parameters `config` (by name; a `preset` among them; the others
    at their defaults, every value checked: `Problem.resolve_config`), the trial `seed` and the `device`.

    Example:
        ```python
        problem = fedbench.make_problem("lasso", seed=0, clients=32)
        problem.num_clients, problem.dim                              # 32, ...
        ```
    """
    cls = PROBLEMS[name]
    return cls(cls.resolve_config(config), seed=seed, device=device)


__all__ = ["PROBLEMS", "Problem", "make_problem", "metric_catalog"]
