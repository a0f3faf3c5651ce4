"""The recipe parser: a document's names and values checked against the engine's own declarations of problems,
algorithms, hyperparameters (and their schedules), the federation's fields, mappings and link transforms, each grid
axis expanded, each refusal a `RecipeError` at its field's path (`parse`); a file read with `--with` plugins and
`--set` overrides (`load`); a command-line option that stands for a recipe field checked by its rule (`check_option`);
a tuned trial's recipe (`assigned`)."""
from __future__ import annotations

import copy
import dataclasses
import itertools
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fedbench import plugins, schedules
from fedbench.algorithms import ALGORITHMS
from fedbench.axes import participation, registry, transforms
from fedbench.axes.transforms import Step
from fedbench.hparams import LIST_KINDS, Param, ParamError
from fedbench.problems import PROBLEMS
from fedbench.schedules import Schedule
from .grid import MAX_RUNS, Recipe, grid_points
from .loading import RecipeError, apply_overrides, closest, in_words, read_yaml, set_field, shown, unknown
from .metrics import check_metrics, default_modes
from .schema import NAME_RULE, SECTIONS, RecipeModel, ReportSpec, schema_error
from .space import check_space
from .trials import FEDERATION_PARAMS, metrics_of

FEDERATION_BY_NAME = {p.name: p for p in FEDERATION_PARAMS}


def _check_values(source: str, path: str, param: Param, value: Any, per_round: bool) -> list[Any]:
    """A list is a grid axis, a scalar one value; each value checked. For a list-valued parameter
    (kind `floats` or `ints`, e.g. a per-stage schedule) one list is one value and a list of lists a grid axis. With
    `per_round` (an algorithm's hyperparameters), a mapping is a schedule (`_schedules`), itself a grid where its
    fields are lists."""
    if param.kind in LIST_KINDS:
        is_grid = isinstance(value, list) and bool(value) and all(isinstance(v, list) for v in value)
    else:
        is_grid = isinstance(value, list)
    values = value if is_grid else [value]
    if not values:
        raise RecipeError(source, path, "found an empty list, expected at least one value")
    checked = []
    for i, v in enumerate(values):
        where = f"{path}[{i}]" if is_grid else path
        if isinstance(v, dict) and per_round:
            checked += _schedules(source, where, param, v)
            continue
        if isinstance(v, dict):
            raise RecipeError(source, where, f"found a mapping, expected {param.kind} in {param.describe_range()}: "
                              "only an algorithm's hyperparameters (and the server optimizer's lr) follow schedules")
        try:
            checked.append(param.check(v))
        except ValueError as err:  # the engine's message holds the value whole: shown cut, as the recipe's checks do
            raise RecipeError(source, where, str(err).replace(repr(v), shown(v))) from None
    return checked


def _schedules(source: str, path: str, param: Param, given: dict) -> list[Schedule]:
    """The schedules of a mapping `{schedule: KIND, field: value, ...}` (`fedbench.schedules`): a list in a field is
    a grid axis, as for a float; each field checked where it is written, the values of the hyperparameter (init,
    final, warmup_init) against its range."""
    if param.kind != "float":
        raise RecipeError(source, path, f"found a schedule, expected {param.kind} in {param.describe_range()}: "
                          "a schedule is for a float")
    if "schedule" not in given:
        raise RecipeError(source, path, "found a mapping without schedule:, expected a number or a schedule "
                          f"{{schedule: KIND, init: ...}} (KIND one of {', '.join(schedules.KINDS)})")
    if isinstance(given["schedule"], list):
        raise RecipeError(source, f"{path}.schedule", "found a list, expected one schedule (a grid over schedules is a "
                          "list of them: [{schedule: ..., ...}, {schedule: ..., ...}])")
    try:
        kind = schedules.kind_of(given["schedule"])
    except ValueError as err:
        raise RecipeError(source, f"{path}.schedule", str(err)) from None
    fields = {name: value for name, value in given.items() if name != "schedule"}
    for name in schedules.unknown_fields(kind, fields):
        raise RecipeError(source, f"{path}.{name}", f"unknown field of a {kind.kind} schedule"
                          f"{closest(name, kind.own_fields())}; expected one of {', '.join(kind.own_fields())}")
    for name in kind.required():
        if name not in fields:
            raise RecipeError(source, path, f"a {kind.kind} schedule needs {name}: {schedules.FIELDS[name].help}")
    grid: dict[str, list[Any]] = {}
    for name, value in fields.items():
        values = value if isinstance(value, list) else [value]
        if not values:
            raise RecipeError(source, f"{path}.{name}", "found an empty list, expected at least one value")
        grid[name] = []
        for i, v in enumerate(values):
            try:
                grid[name].append(kind.check_field(name, v, param))
            except ValueError as err:
                raise RecipeError(source, f"{path}.{name}[{i}]" if isinstance(value, list) else f"{path}.{name}",
                                  str(err).replace(repr(v), shown(v))) from None
    return [schedules.make(kind.kind, **point) for point in grid_points(grid)]


def _check_params(source, path, declared, given: dict, per_round: bool = False) -> dict[str, list[Any]]:
    by_name = {p.name: p for p in declared}
    grid = {}
    for key, value in given.items():
        if key not in by_name:
            raise unknown(source, f"{path}.{key}", f"unknown parameter{closest(key, by_name)}", by_name)
        grid[key] = _check_values(source, f"{path}.{key}", by_name[key], value, per_round)
    return grid


def _check_federation(source: str, path: str, given: dict) -> dict[str, list[Any]]:
    """The federation's grid (a section at `path`): its parameters' values (a list is a grid axis), then what each
    axis of the registry `fedbench.axes.registry.AXES` set there makes: a link's chains (`_check_chain`) or a mapping's
    values (`_check_mapping`: the adversaries, the participation model, uneven local steps where `local_steps` holds a
    mapping, ...)."""
    given = dict(given)
    nested: dict[str, list[Any]] = {}
    for axis in registry.in_federation():
        if axis.key in given and (not axis.plain or _holds_mapping(given[axis.key])):
            read = _check_chain if isinstance(axis, registry.Chain) else _check_mapping
            nested[axis.key] = read(source, f"{path}.{axis.key}", axis.key, given.pop(axis.key))
    return {**_check_params(source, path, FEDERATION_PARAMS, given), **nested}


def _holds_mapping(value: Any) -> bool:
    return isinstance(value, dict) or isinstance(value, list) and any(isinstance(v, dict) for v in value)


def _check_mapping(source: str, path: str, name: str, spec: Any) -> list[Any]:
    """What a federation's axis `name` (`fedbench.axes.registry.AXES`: adversaries, participation, uneven local steps,
    ...) makes from its mapping (or, where the axis is `scalar`, its first parameter's value alone, `client_dropout:
    0.1`): one, or where a field is given a list (a grid axis, `{fraction: [0.1, 0.2]}`), one for each point of the
    product of those lists; a list of mappings is a grid axis of them (`[{model: uniform}, {model: cyclic, groups: 4}]`;
    of `local_steps`, integers E among them; of a scalar axis, its values). Each value is checked at its field's path
    (`federation.adversaries.fraction[1]`, `federation.participation[1].groups`), what they must be together with the
    trial's federation by the axis's `check` (`fedbench.engine.checks.check_federation`)."""
    axis = registry.AXES[name]
    assert isinstance(axis, (registry.Mapped, registry.Held))  # `_check_federation` reads a chain by `_check_chain`
    cls, example, scalar = axis.made, axis.example, axis.scalar
    if isinstance(spec, list) and not spec:
        raise RecipeError(source, path, "found an empty list, expected at least one value")
    made: list[Any] = []
    for i, item in enumerate(spec if isinstance(spec, list) else [spec]):
        where = f"{path}[{i}]" if isinstance(spec, list) else path
        if axis.plain and not isinstance(item, dict):  # the federation's own value among the mappings: E
            made += _check_values(source, where, FEDERATION_BY_NAME[name], item, per_round=False)
            continue
        if scalar and not isinstance(item, dict):  # its first parameter's value alone
            made += [cls(value) for value in _check_values(source, where, cls.params[0], item, per_round=False)]
            continue
        if not isinstance(item, dict):
            raise RecipeError(source, where, f"found {in_words(item)}, expected a mapping, e.g. {example}")
        grid = _check_params(source, where, cls.params, item, per_round=axis.schedules)  # an lr
        for field in participation.FILES:  # a file of per-client values, as a plugin's, by the recipe's folder
            if field in grid:
                grid[field] = [value if value is None else str(Path(source).parent / Path(value).expanduser())
                               for value in grid[field]]
        try:
            made += [cls(**point) for point in grid_points(grid)]
        except ParamError as err:  # a file that cannot be read
            raise RecipeError(source, f"{where}.{err.name.partition('.')[2]}", err.message) from None
    return made


def _check_chain(source: str, path: str, link: str, spec: Any) -> list[tuple[Step, ...]]:
    """The chains a link's list of transforms (`federation.uplink`) makes: one, or where a step's parameter is given
    a list (a grid axis, `{top_k: [0.01, 0.05]}`), one for each point of the product of those lists. A list of such
    lists is a grid axis over chains, as a list of lists is for a list-valued parameter (`[[], [{top_k: 0.01}],
    [{top_k: 0.01}, {error_feedback: ef21}]]`: no transform, top-k alone, top-k with EF21), each list's chains in
    turn. Each value is checked at its field's path (`federation.uplink.0.top_k[1]`, in a grid over chains
    `federation.uplink[2].0.top_k`); the chain's order with each trial's federation."""
    if not isinstance(spec, list):
        raise RecipeError(source, path, f"found {in_words(spec)}, expected a list of transforms, e.g. "
                          "[{top_k: 0.05}]")
    if spec and all(isinstance(chain, list) for chain in spec):
        return [steps for j, chain in enumerate(spec) for steps in _ordered(source, path, link, j, chain)]
    return _chains(source, path, link, spec)


def _ordered(source: str, path: str, link: str, j: int, spec: list) -> list[tuple[Step, ...]]:
    """The chains of the `j`-th list of a grid over chains, each refused here, at `federation.uplink[j].i.NAME`, in
    an order no run can have (`transforms.check_chain`; the aggregation's own rule is checked with each trial, where
    the aggregation is known)."""
    chains = _chains(source, path, f"{link}[{j}]", spec)
    for steps in chains:
        try:
            transforms.check_chain(steps, link, "uniform")
        except ParamError as err:
            where = f"{link}[{j}]{err.name[len(link):]}"  # the step's path within the j-th chain
            raise RecipeError(source, f"{path.rpartition('.')[0]}.{where}", err.message) from None
    return chains


def _chains(source: str, path: str, at: str, spec: list) -> list[tuple[Step, ...]]:
    """The chains of one list of transforms, at `at` (`uplink`, or `uplink[2]` in a grid over chains) of the
    federation section at `path` (`federation.uplink`)."""
    section = path.rpartition(".")[0]
    options = []
    for i, given in enumerate(spec):
        try:
            transform, values = transforms.entry(given, f"{at}.{i}")
        except transforms.UnknownName as err:
            raise unknown(source, f"{section}.{err.name}", err.message, err.options) from None
        except ParamError as err:
            raise RecipeError(source, f"{section}.{err.name}", err.message.replace(repr(given), shown(given))) from None
        params = {p.name: p for p in transform.params}
        grid = {name: _check_values(source, f"{section}.{where}", params[name], value, per_round=False)
                for name, (where, value) in values.items()}
        options.append([transform.step(point) for point in grid_points(grid)])
    return [tuple(steps) for steps in itertools.product(*options)]


def load_plugins(source: str, specs: list[str]) -> None:
    """Register the components of installed packages' entry points and of the recipe's `plugins` (a file relative
    to the recipe's folder, or a module); a plugin that cannot be registered is refused with its field."""
    plugins.discover()
    for i, spec in enumerate(specs):
        try:
            plugins.load(spec, Path(source).parent)
        except plugins.PluginError as err:
            raise RecipeError(source, f"plugins[{i}]", str(err)) from None


def nested_fields(raw: dict[str, Any]) -> dict[str, list[str]]:
    """Each field name of the recipe's sections with its paths (`rounds` -> [`federation.rounds`]; `client_lr` ->
    the paths of every algorithm of the recipe that has one), for a name given at the top level by mistake."""
    places: dict[str, list[str]] = {}

    def add(section: str, names) -> None:
        for name in names:
            places.setdefault(name, []).append(f"{section}.{name}")

    problem, algorithms = raw.get("problem"), raw.get("algorithms")
    if isinstance(problem, dict) and isinstance(problem.get("name"), str) and problem["name"] in PROBLEMS:
        add("problem", [p.name for p in PROBLEMS[problem["name"]].params])
    add("federation", [p.name for p in FEDERATION_PARAMS] + [axis.key for axis in registry.in_federation()])
    for algorithm in algorithms if isinstance(algorithms, dict) else ():
        if isinstance(algorithm, str) and algorithm in ALGORITHMS:
            add(f"algorithms.{algorithm}", [p.name for p in ALGORITHMS[algorithm].hparams])
    for section, model in SECTIONS.items():
        if section:
            add(".".join(section), model.model_fields)
    return places


def parse(raw: dict[str, Any], source: str) -> Recipe:
    """The recipe of a document (`source`: the file it came from, which refusals name), its names and values checked
    against the engine's declarations, and every run it makes checked valid (`_check_runs`)."""
    try:
        model = RecipeModel.model_validate(raw)
    except ValidationError as err:
        raise schema_error(source, err, nested_fields(raw)) from None

    load_plugins(source, model.plugins)
    problem = dict(model.problem)
    problem_name = problem.pop("name", None)
    if why := plugins.broken("problem", problem_name):
        raise RecipeError(source, "problem.name", why)
    if problem_name not in PROBLEMS:
        raise unknown(source, "problem.name", f"found {problem_name!r}, expected a problem"
                      f"{closest(problem_name, PROBLEMS)}", PROBLEMS)
    problem_grid = _check_params(source, "problem", PROBLEMS[problem_name].params, problem)

    federation_grid = _check_federation(source, "federation", model.federation)
    algorithms, overrides = _check_algorithms(source, problem_name, model.algorithms)

    name = model.name or Path(source).stem
    if model.name is None and name in (".", ".."):  # a file named `...yaml`: its reports would leave their folder
        raise RecipeError(source, "name", f"found {name!r} (the file's name), expected {NAME_RULE}; set name:")
    recipe = Recipe(source, name, problem_name, problem_grid, federation_grid, algorithms, model.seeds,
                    model.eval_every, model.device, model.divergence_factor, model.resources, model.tune, raw,
                    report=model.report or ReportSpec(), overrides=overrides, checkpoints=model.checkpoints,
                    max_runs=model.max_runs, models_every=model.tracking.models_every,
                    sections={axis.key: getattr(model, axis.key) for axis in registry.sections()})
    if model.tune:  # its space read against the grids as validated: a chain's steps, an algorithm's own entries
        recipe.dimensions = check_space(recipe)
    _check_runs(recipe)
    return recipe


def _check_algorithms(source: str, problem_name: str, entries: dict[str, Any]
                      ) -> tuple[dict[str, dict[str, list[Any]]], dict[str, dict[str, dict[str, list[Any]]]]]:
    """Each algorithm's grid of hyperparameters, and the grids of the problem's and the federation's parameters it
    replaces the recipe's with (`algorithms.ALGO.problem`, `algorithms.ALGO.federation`)."""
    sections = {"problem": PROBLEMS[problem_name].params, "federation": FEDERATION_PARAMS}
    algorithms: dict[str, dict[str, list[Any]]] = {}
    overrides: dict[str, dict[str, dict[str, list[Any]]]] = {}  # algorithm -> section -> grid
    for algo, hps in entries.items():
        if why := plugins.broken("algorithm", algo):
            raise RecipeError(source, f"algorithms.{algo}", why)
        if algo not in ALGORITHMS:
            raise unknown(source, f"algorithms.{algo}", f"unknown algorithm{closest(algo, ALGORITHMS)}", ALGORITHMS)
        hps = dict(hps or {})
        overrides[algo] = {}
        for section in [name for name in sections if name in hps]:
            given = hps.pop(section)
            if not isinstance(given, dict):
                raise RecipeError(source, f"algorithms.{algo}.{section}", f"found {shown(given)}, expected a mapping "
                                  f"of {section} parameters that replace the recipe's for {algo}")
            path = f"algorithms.{algo}.{section}"
            overrides[algo][section] = (_check_federation(source, path, given) if section == "federation"
                                        else _check_params(source, path, sections[section], given))
        algorithms[algo] = _check_params(source, f"algorithms.{algo}", ALGORITHMS[algo].hparams, hps, per_round=True)
    return algorithms, overrides


def _check_runs(recipe: Recipe) -> None:
    """Refuse a recipe of more than `MAX_RUNS` runs (counted, not built: a grid of millions is refused before it takes
    minutes and GBs), then one whose grid points do not all make a valid trial (e.g. clients_per_round <= clients),
    or whose tune and report blocks name metrics its runs do not declare."""
    source = recipe.source
    runs = recipe.runs()
    if runs > MAX_RUNS:
        seeds = len(recipe.seeds)
        raise RecipeError(source, "", f"found {runs // seeds} configurations × {seeds} seeds = {runs} runs, expected "
                          f"at most {MAX_RUNS}")
    trials = recipe.trials()
    if recipe.delta is not None and all(trial.delta is None for trial in trials):
        raise RecipeError(source, "privacy", "found no run with DP-FedAvg's noise, expected a gaussian step (after a "
                          "clip) in federation.uplink")
    declared = metrics_of(trials)
    check_metrics(recipe, list(declared))
    default_modes(recipe, declared)


# Command-line options that stand for a recipe field (for one call), checked by that field's rule (`check_option`).
OPTION_FIELDS = {"--device": "device", "--max-concurrent": "resources.max_concurrent",
                 "--rerun-best": "tune.rerun_best"}


def check_option(recipe: Recipe, option: str, value: Any) -> None:
    """Refuse (RecipeError naming the option) a value of a command-line option that the recipe field it stands
    for (OPTION_FIELDS) would refuse; None, an option not given, stands for the recipe's own value."""
    if value is None:
        return
    document = copy.deepcopy(recipe.document)
    *sections, name = OPTION_FIELDS[option].split(".")
    node = document
    for section in sections:
        node = node.setdefault(section, {})
    node[name] = value
    try:
        RecipeModel.model_validate(document)
    except ValidationError as err:
        raise RecipeError(recipe.source, option, schema_error(recipe.source, err).message) from None


def assigned(recipe: Recipe, values: dict[str, Any], document: dict[str, Any] | None = None) -> Recipe:
    """The recipe whose fields at the paths of `values` (`federation.uplink.0.top_k`, `algorithms.fedmid.client_lr`)
    hold those values, set in `document` (default: a copy of the recipe's own) as `--set` sets them and validated
    again: a tuned trial's recipe (`sweeps.tuning`). On the recipe's device, which is an option, not a field."""
    document = copy.deepcopy(recipe.document) if document is None else document
    for path, value in values.items():
        set_field(document, path.split("."), value, recipe.source, path)
    return dataclasses.replace(parse(document, recipe.source), device=recipe.device)


def load(path: str | Path, overrides: list[str] | None = None, algorithm: str | None = None,
         with_plugins: list[str] | None = None) -> Recipe:
    """The recipe of a file, with `with_plugins`' algorithms joining it (`add_plugins`), then `overrides` applied."""
    source = str(path)
    raw = locate_networks(add_plugins(read_yaml(path), with_plugins or [], source), Path(path).parent)
    raw = locate_networks(apply_overrides(raw, overrides or [], source, algorithm), Path.cwd())
    return parse(raw, source)


def locate_networks(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """The recipe with each network file it names (`problem.model: my_nets.py:Net`, a grid's too) made absolute
    relative to `base`, as plugin files are: the recipe's own relative to its folder, `--set`'s relative to the
    working directory (a path made absolute already stays as it is). A Ray worker runs elsewhere."""
    problem = raw.get("problem")
    if not isinstance(problem, dict) or not isinstance(problem.get("model"), (str, list)):
        return raw

    def located(model: Any) -> Any:
        where, colon, name = model.rpartition(":") if isinstance(model, str) else ("", "", "")
        return f"{plugins.located(where, base)}:{name}" if colon and plugins.is_file(where) else model

    model = problem["model"]
    return {**raw, "problem": {**problem, "model": [located(m) for m in model] if isinstance(model, list)
                               else located(model)}}


def add_plugins(raw: dict[str, Any], specs: list[str], source: str) -> dict[str, Any]:
    """`--with`: each plugin (a file, relative to the working directory, or a module) joins the recipe's `plugins`,
    and each algorithm it defines joins the recipe's algorithms with its default hyperparameters, which `--set`
    can then make a grid: a researcher's method beside a paper's, in the paper's own experiment."""
    if not specs:
        return raw
    raw = copy.deepcopy(raw)
    for spec in specs:
        given = plugins.located(spec)  # a file by its absolute path: the recipe may be in another folder
        try:
            registered = plugins.load(given)
        except plugins.PluginError as err:
            raise RecipeError(source, "--with", str(err)) from None
        raw["plugins"] = [*(raw.get("plugins") or []), given]
        algorithms = raw.setdefault("algorithms", {})
        if isinstance(algorithms, dict):  # else the schema refuses it, naming the field
            for kind, name in registered:
                if kind == "algorithm" and algorithms.get(name) is None:
                    algorithms[name] = {}
    return raw
