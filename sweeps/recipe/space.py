"""The `tune:` block's search space: each `tune.space` entry checked against the parameters the problem, the
federation and the recipe's algorithms declare, and resolved into a `Dimension` (which algorithms it varies,
its distribution and range). A float hyperparameter is searched as itself, or, where the recipe gives it a schedule,
by a field of that schedule (`client_lr.init`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedbench.algorithms import ALGORITHMS
from fedbench.hparams import Param
from fedbench.problems import PROBLEMS
from fedbench.schedules import FIELDS, Schedule
from .loading import RecipeError, closest, unknown
from .schema import DISTRIBUTIONS, TuneSpec
from .trials import FEDERATION_PARAMS


@dataclass(frozen=True)
class Dimension:
    """One axis of the search space, as written in `tune.space` (`problem.lam`, `client_lr`,
    `algorithms.fedmid.server_lr`, `client_lr.init`), and the algorithms whose trials it varies."""
    key: str
    algorithms: tuple[str, ...]
    distribution: str
    bounds: tuple[Any, ...]  # (low, high), or the categories

    def path(self, algorithm: str) -> str:
        """The recipe field this dimension sets in `algorithm`'s trials."""
        return self.key if self.key.startswith(("problem.", "federation.", "algorithms.")) else (
            f"algorithms.{algorithm}.{self.key}")


def check_space(source: str, tune: TuneSpec, problem: str, algorithms: dict) -> tuple[Dimension, ...]:
    """Each `tune.space` entry names a declared parameter and a valid range of it:
    `problem.X`, `federation.X`, `algorithms.A.X`, or a bare `X` for every algorithm declaring X; `X.FIELD` (bare
    or of `algorithms.A`) a field of the schedule that the recipe gives X."""
    dimensions = []
    for key, spec in tune.space.items():
        where = f"tune.space.{key}"
        section, _, name = key.rpartition(".")
        field = None  # `X.FIELD` or `algorithms.A.X.FIELD`: a field of the schedule of the hyperparameter X
        if name in FIELDS and (section.count(".") == 0 and section not in ("", "problem", "federation")
                               or section.startswith("algorithms.") and section.count(".") == 2):
            field, (section, _, name) = name, section.rpartition(".")
        if section in ("problem", "federation"):
            declared = PROBLEMS[problem].params if section == "problem" else FEDERATION_PARAMS
            owners: dict[str | None, dict[str, Param]] = {None: {p.name: p for p in declared}}
        elif section.startswith("algorithms.") and section.count(".") == 1:
            algorithm = section.split(".")[1]
            if algorithm not in algorithms:
                raise RecipeError(source, where, f"the recipe has no algorithm {algorithm!r}; expected one of "
                                  f"{', '.join(algorithms)}{closest(algorithm, algorithms)}")
            owners = {algorithm: {p.name: p for p in ALGORITHMS[algorithm].hparams}}
        elif not section:
            owners = {a: {p.name: p for p in ALGORITHMS[a].hparams} for a in algorithms}
        else:
            raise RecipeError(source, where, "expected problem.NAME, federation.NAME, algorithms.ALGO.NAME or a "
                              "hyperparameter name")
        params = [by_name[name] for by_name in owners.values() if name in by_name]
        if not params:
            known = sorted({n for by_name in owners.values() for n in by_name})
            raise unknown(source, where, f"unknown parameter{closest(name, known)}", known)
        if field is not None:  # each algorithm's one schedule of `name` must have the field
            for algorithm in [a for a in algorithms if a in owners and name in owners[a]]:
                values = algorithms[algorithm].get(name, [])
                if not (len(values) == 1 and isinstance(values[0], Schedule) and field in values[0].own_fields()):
                    found = ", ".join(map(str, values)) or "its default"
                    raise RecipeError(source, where, f"algorithms.{algorithm}.{name} is {found}; expected one "
                                      f"schedule that has the field {field}")
            params = [Schedule.field_param(field, param) for param in params]
        if len(spec) != 1 or next(iter(spec)) not in DISTRIBUTIONS:
            raise RecipeError(source, where, f"found {spec!r}, expected one of {', '.join(DISTRIBUTIONS)} "
                              f"with its range, e.g. {{log_uniform: [1.0e-4, 1.0e-1]}}")
        distribution, bounds = next(iter(spec.items()))
        where = f"{where}.{distribution}"
        if distribution == "categorical":
            if not isinstance(bounds, list) or not bounds:
                raise RecipeError(source, where, f"found {bounds!r}, expected a non-empty list of values")
        else:
            if not (isinstance(bounds, list) and len(bounds) == 2):
                raise RecipeError(source, where, f"found {bounds!r}, expected [low, high]")
            if not bounds[0] < bounds[1]:
                raise RecipeError(source, where, f"found the empty range {bounds}, expected low < high")
            if distribution.startswith("log") and bounds[0] <= 0:
                raise RecipeError(source, where, f"found {bounds}, a log scale needs low > 0")
            wanted = "int" if distribution.endswith("int") else "float"
            if any(p.kind != wanted for p in params):
                kind = params[0].kind
                hint = {"int": "an int or log_int", "float": "a uniform or log_uniform"}.get(kind, "a categorical")
                raise RecipeError(source, where, f"{name}{f'.{field}' if field else ''} is {kind}; expected {hint} "
                                  "distribution")
        for param in params:
            for i, value in enumerate(bounds):
                try:
                    param.check(value)
                except ValueError as err:
                    raise RecipeError(source, f"{where}[{i}]", str(err)) from None
        applies = (tuple(algorithms) if None in owners
                   else tuple(a for a in owners if a is not None and name in owners[a]))
        dimensions.append(Dimension(key, applies, distribution, tuple(bounds)))
    return tuple(dimensions)
