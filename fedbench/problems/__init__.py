"""Problem registry: name -> class."""
from __future__ import annotations

from typing import Any

from fedbench.problems.base import Problem
from fedbench.problems.emnist import EMNIST
from fedbench.problems.lasso import Lasso
from fedbench.problems.lowrank import LowRank
from fedbench.problems.pauc import PartialAUC

PROBLEMS: dict[str, type[Problem]] = {cls.name: cls for cls in (Lasso, LowRank, EMNIST, PartialAUC)}


def make_problem(name: str, seed: int = 0, device: str = "cpu", **config: Any) -> Problem:
    cls = PROBLEMS[name]
    return cls(cls.resolve_config(config), seed=seed, device=device)


__all__ = ["PROBLEMS", "Problem", "make_problem"]
