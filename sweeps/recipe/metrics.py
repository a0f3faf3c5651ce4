"""The metrics a recipe's runs evaluate (`trials.metrics_of`, what the problem and algorithms declare) and those its
`tune:` and `report:` blocks name: each must be one of them (`check_metrics`), and a block without `mode` takes
its metric's declared direction (`default_modes`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fedbench.algorithms import ALGORITHMS
from fedbench.metrics import Metric
from .loading import RecipeError, closest, unknown

if TYPE_CHECKING:
    from .grid import Recipe


def default_modes(recipe: Recipe, declared: dict[str, Metric]) -> None:
    """A tune or select block without `mode` takes its metric's declared direction."""
    for path, spec in (("tune", recipe.tune), ("report.select", recipe.report.select)):
        if spec is None or spec.mode is not None:
            continue
        spec.mode = declared[spec.metric].direction
        if spec.mode is None:
            raise RecipeError(recipe.source, f"{path}.mode", f"missing, and {spec.metric} is declared with no "
                              "direction (neither lower nor higher is better); expected min or max")


def named_metrics(recipe: Recipe) -> list[tuple[str, str]]:
    """(field path, name) of every metric the tune and report blocks name; a `report.labels` key that is
    no algorithm names a metric. A label of an algorithm the recipe does not run is no metric: a recipe cut to one
    of its algorithms (tune's best configuration, `--set`) keeps the labels of the others."""
    report = recipe.report
    named = [("tune.metric", recipe.tune.metric)] if recipe.tune else []
    named += [(f"report.metrics[{i}]", name) for i, name in enumerate(report.metrics)]
    named += [("report.select.metric", report.select.metric)] if report.select else []
    named += [(f"report.{section}.{name}", name) for section in ("target", "log") for name in getattr(report, section)]
    named += [(f"report.labels.{name}", name) for name in report.labels if name not in ALGORITHMS]
    return named


def check_metrics(recipe: Recipe, available: list[str]) -> None:
    """Every metric the tune and report blocks name must be one of `available`: the metrics the problem declares
    for the recipe's runs (nothing is built), or what stored runs hold."""
    for path, name in named_metrics(recipe):
        if name in available:
            continue
        if path.startswith("report.labels."):
            known = [*recipe.algorithms, *available]
            raise unknown(recipe.source, path, f"found {name!r}, expected an algorithm of the recipe or a "
                          f"metric{closest(name, known)}", known)
        raise unknown(recipe.source, path, f"found {name!r}, expected a metric of {recipe.problem}"
                      f"{closest(name, available)}", available)

