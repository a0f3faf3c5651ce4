"""The recipe's `report:` block resolved against the metrics the runs have."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fedbench.algorithms import ALGORITHMS
from fedbench.metrics import EPSILON, Metric
from fedbench.problems import metric_catalog
from ..recipe import Recipe, ReportSpec, SelectSpec, check_metrics
from .query import ReportError


def declarations(recipe: Optional[Recipe]) -> dict[str, Metric]:
    """Each metric's label and direction as the problems declare them: the recipe's own where there is one,
    else every shipped problem's (`fedbench.problems.metric_catalog`)."""
    return {**metric_catalog(), **(recipe.metrics() if recipe is not None else {})}



@dataclass
class Settings:
    """The report block resolved against the metrics the runs have."""
    metrics: list[str]  # the figure's panels
    select: SelectSpec
    targets: dict[str, float]
    x: str  # the main figure's x-axis
    log: dict[str, bool]
    labels: dict[str, str]
    curves: int
    declared: dict[str, Metric]
    interval: str = "sd"
    also_x: list[str] = field(default_factory=list)  # the figure again over these x-axes

    @property
    def table_metrics(self) -> list[str]:
        return list(dict.fromkeys([self.select.metric, *self.metrics]))

    def label(self, name: str) -> str:
        """A metric's or an algorithm's name in figures and tables: the recipe's `labels`, else the declared one
        (a metric's label, an algorithm's `title`), else the name itself."""
        declared = self.declared.get(name)
        algorithm = ALGORITHMS.get(name)
        return self.labels.get(name) or (declared.label if declared else
                                         getattr(algorithm, "title", None) or name)


def resolve_settings(recipe: Optional[Recipe], available: list[str], x: Optional[str]) -> Settings:
    spec = recipe.report if recipe is not None else ReportSpec()
    if recipe is not None:
        check_metrics(recipe, available)
    declared = declarations(recipe)
    ranked = [m for m in available if m in declared and declared[m].direction]  # metrics with a better way
    select = spec.select
    if select is None and recipe is not None and recipe.tune is not None:
        select = SelectSpec(metric=recipe.tune.metric, mode=recipe.tune.mode)
    if select is None:  # not ε, which the noise and the rounds fix: it would rank every configuration of a σ alike
        first = [m for m in ("objective_gap", "objective") if m in ranked] + [m for m in ranked if m != EPSILON]
        if not first:
            raise ReportError(f"no metric of {', '.join(available)} is declared with a direction (lower or higher "
                              "is better); set report.select: {metric: NAME, mode: min|max} in the recipe")
        select = SelectSpec(metric=first[0], mode=declared[first[0]].direction)
    panels = spec.metrics or list(dict.fromkeys([select.metric, *ranked]))[:4]
    axes = [x] if x else list(spec.x)
    return Settings(panels, select, dict(spec.target), axes[0], dict(spec.log), dict(spec.labels), spec.curves,
                    declared, spec.interval, axes[1:])


def headline_metrics(recipe: Recipe) -> list[str]:
    """The panels of the recipe's report figure, as `fedbench report` picks them (`report.metrics`, else the
    selection metric and the first metrics with a direction), from the metrics the recipe's runs declare: the
    charts that `fedbench ui` shows first (`store.Store.experiment`)."""
    try:
        return resolve_settings(recipe, sorted(recipe.metrics()), None).metrics
    except ReportError:  # no metric to rank configurations by: the report refuses such runs
        return list(recipe.report.metrics)
