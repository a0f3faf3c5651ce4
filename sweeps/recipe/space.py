"""The `tune:` block's search space: each `tune.space` entry checked against the parameters the problem, the
federation and the recipe's algorithms declare, and resolved into a `Dimension` (which algorithms it varies,
its distribution and range). A float hyperparameter is searched as itself, or, where the recipe gives it a schedule,
by a field of that schedule (`client_lr.init`). Inside the federation, the space takes the paths a grid takes
(`--set federation.uplink.0.top_k=[...]`): each axis of the registry `fedbench.axes.registry.AXES` set there: the
parameter of a chain's step (`federation.uplink.0.top_k`), a mapping's (`federation.adversaries.fraction`,
`federation.participation.p`, `federation.local_steps.high`, `federation.server_optimizer.lr`, ...).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedbench.algorithms import ALGORITHMS
from fedbench.axes.registry import AXES, Chain, Held, Mapped, in_federation
from fedbench.axes.transforms import TRANSFORMS
from fedbench.hparams import Param
from fedbench.problems import PROBLEMS
from fedbench.schedules import FIELDS, Schedule
from .loading import RecipeError, closest, unknown
from .schema import DISTRIBUTIONS, Dimension
from .trials import FEDERATION_PARAMS

if TYPE_CHECKING:
    from .grid import Recipe


def check_space(recipe: Recipe) -> tuple[Dimension, ...]:
    """Each entry of the recipe's `tune.space` names a declared parameter and a valid range of it:
    `problem.X`, `federation.X`, `algorithms.A.X`, or a bare `X` for every algorithm declaring X; `X.FIELD` (bare
    or of `algorithms.A`) a field of the schedule that the recipe gives X; for an axis of the registry
    `fedbench.axes.registry.AXES`, `federation.LINK.I.T` the parameter of the step T at index I of every algorithm's
    chain LINK (`federation.uplink.0.top_k`), `federation.KEY.X` a parameter of a mapping's that every algorithm's
    mapping reads (`mapping_param`: `federation.participation.p`)."""
    assert recipe.tune is not None  # called for a recipe with a tune block
    dimensions = []
    for key, spec in recipe.tune.space.items():
        where = f"tune.space.{key}"
        section, _, name = key.rpartition(".")
        field = None  # `X.FIELD` or `algorithms.A.X.FIELD`: a field of the schedule of the hyperparameter X
        if name in FIELDS and (section.count(".") == 0 and section not in ("", "problem", "federation")
                               or section.startswith("algorithms.") and section.count(".") == 2):
            field, (section, _, name) = name, section.rpartition(".")
        owners = _owners(recipe, where, section, name)
        params = [by_name[name] for by_name in owners.values() if name in by_name]
        if not params:
            known = sorted({n for by_name in owners.values() for n in by_name})
            raise unknown(recipe.source, where, f"unknown parameter{closest(name, known)}", known)
        if field is not None:
            params = _schedule_fields(recipe, where, owners, name, field, params)
        distribution, bounds = _checked_range(recipe.source, where, spec, params, name, field)
        applies = (tuple(recipe.algorithms) if None in owners
                   else tuple(a for a in owners if a is not None and name in owners[a]))
        top, _, rest = key.partition(".")
        own = tuple(a for a in applies if rest.split(".")[0] in recipe.overrides.get(a, {}).get(top, {}))
        dimensions.append(Dimension(key, applies, distribution, tuple(bounds), own))
    return tuple(dimensions)


def _owners(recipe: Recipe, where: str, section: str, name: str) -> dict[str | None, dict[str, Param]]:
    """The parameters a space entry's `section` declares, by owner: an algorithm's name, or None (the problem's, the
    federation's, and what every algorithm's federation gives)."""
    source, algorithms = recipe.source, recipe.algorithms
    if section in ("problem", "federation"):
        declared = PROBLEMS[recipe.problem].params if section == "problem" else FEDERATION_PARAMS
        return {None: {p.name: p for p in declared}}
    key = section.removeprefix("federation.").split(".")[0]
    axis = AXES.get(key) if section.startswith("federation.") else None
    if isinstance(axis, Chain) and section.count(".") == 2:
        return {None: {name: step_param(recipe, where, section.removeprefix("federation."), name)}}
    if isinstance(axis, (Mapped, Held)) and section.count(".") == 1:
        return {None: mapping_param(recipe, where, axis, name)}
    if section.startswith("algorithms.") and section.count(".") == 1:
        algorithm = section.split(".")[1]
        if algorithm not in algorithms:
            raise RecipeError(source, where, f"the recipe has no algorithm {algorithm!r}; expected one of "
                              f"{', '.join(algorithms)}{closest(algorithm, algorithms)}")
        return {algorithm: {p.name: p for p in ALGORITHMS[algorithm].hparams}}
    if not section:
        return {a: {p.name: p for p in ALGORITHMS[a].hparams} for a in algorithms}
    paths = [f"{axis.path}.I.TRANSFORM" if isinstance(axis, Chain) else f"{axis.path}.NAME" for axis in in_federation()]
    raise RecipeError(source, where, f"expected problem.NAME, federation.NAME, {', '.join(paths)}, "
                      "algorithms.ALGO.NAME or a hyperparameter name")


def _schedule_fields(recipe: Recipe, where: str, owners: dict[str | None, dict[str, Param]], name: str, field: str,
                     params: list[Param]) -> list[Param]:
    """The parameters of the schedules' `field` of the hyperparameter `name`: each algorithm's one schedule of it must
    have the field."""
    algorithms = recipe.algorithms
    for algorithm in [a for a in algorithms if a in owners and name in owners[a]]:
        values = algorithms[algorithm].get(name, [])
        if not (len(values) == 1 and isinstance(values[0], Schedule) and field in values[0].own_fields()):
            found = ", ".join(map(str, values)) or "its default"
            raise RecipeError(recipe.source, where, f"algorithms.{algorithm}.{name} is {found}; expected one "
                              f"schedule that has the field {field}")
    return [Schedule.field_param(field, param) for param in params]


def _checked_range(source: str, where: str, spec: Any, params: list[Param], name: str,
                   field: str | None) -> tuple[str, Any]:
    """A space entry's distribution and its range (`spec`), checked against the parameters it searches."""
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
    return distribution, bounds


def mapping_param(recipe: Recipe, where: str, axis: Mapped | Held, name: str) -> dict[str, Param]:
    """The parameter `name` of a federation's mapping `axis` (`fedbench.axes.registry.AXES`), by its name, where every
    algorithm's federation gives that field as one mapping that reads it (`reads`: the participation model's, uneven
    local work's distribution, the server optimizer's rule), or, for an axis that reads every field, as a mapping or
    not at all: a search sets the field in that mapping, which must then make a run. All of them where there is no
    such parameter (refused as unknown, with the closest); refused at `where` where a federation's mapping does not
    read it."""
    params = {p.name: p for p in axis.params}
    if name not in params:
        return params
    for algorithm in recipe.algorithms:
        path = recipe.field(algorithm, "federation", axis.key)
        spec: Any = recipe.document
        for part in path.split("."):
            spec = spec.get(part) if isinstance(spec, dict) else None
        if axis.reads is None and spec is None:
            continue  # the search makes the mapping (`sweeps.recipe.assigned`)
        if not isinstance(spec, dict):
            raise RecipeError(recipe.source, where, f"found no mapping in {path}, expected one that reads {name}")
        reads = tuple(params) if axis.reads is None else axis.reads(spec)
        if name not in reads:
            raise RecipeError(recipe.source, where, f"found {path} reading {', '.join(reads) or 'none of its fields'}, "
                              f"expected one that reads {name}")
    return {name: params[name]}


def step_param(recipe: Recipe, where: str, at: str, name: str) -> Param:
    """The parameter of the step `name` at `at` (`uplink.0`) of a chain, which every algorithm's chain (the recipe's,
    or the algorithm's own) must have there: refused at `where` otherwise, or where the transform has no parameter."""
    link, index = at.split(".")
    for algorithm in recipe.algorithms:
        chains, path = recipe.grids(algorithm)[1].get(link, [()]), recipe.field(algorithm, "federation", link)
        if len({tuple(step.name for step in steps) for steps in chains}) > 1:
            raise RecipeError(recipe.source, where, f"found a grid over chains in {path}, expected one chain to "
                              "search a step of")
        steps = chains[0]  # its grids vary the steps' values, not which transforms they are
        if not (index.isdigit() and int(index) < len(steps)):
            expected = f"an index 0 to {len(steps) - 1}" if steps else "a chain to search a step of"
            raise RecipeError(recipe.source, where, f"found step {index} of {path}, which has {len(steps)} steps; "
                              f"expected {expected}")
        if steps[int(index)].name != name:
            raise RecipeError(recipe.source, where, f"found {name}, expected {steps[int(index)].name}, the step "
                              f"{index} of {path}")
    if not TRANSFORMS[name].params:
        raise RecipeError(recipe.source, where, f"{name} has no parameter; expected a step that has one")
    return TRANSFORMS[name].params[0]
