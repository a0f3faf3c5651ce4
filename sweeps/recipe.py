"""YAML recipes: read (safe_load only), override (`--set path=value`), validate against the engine's
own declarations of problems and hyperparameters, and turn into trials.

Every error is a `RecipeError` naming the file, the field path, what was found and what was expected,
and the closest valid name for a misspelt problem, algorithm or parameter.
"""
from __future__ import annotations

import copy
import difflib
import hashlib
import itertools
import json
import re
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedbench import contract
from fedbench.algorithms import ALGORITHMS
from fedbench.hparams import LIST_KINDS, Param, ParamError, resolve
from fedbench.metrics import ENGINE_COLUMNS, Metric
from fedbench.problems import PROBLEMS
from fedbench.simulate import DIVERGENCE_FACTOR, Federation, minibatch_sizes


class DuplicateKey(yaml.YAMLError):
    """A mapping that gives a key more than once: PyYAML would keep the last one without a word."""

    def __init__(self, path: str, lines: list[int]):
        self.path, self.lines = path, lines
        super().__init__(f"{path}: given {len(lines)} times")


class RecipeLoader(yaml.SafeLoader):
    """SafeLoader (no tags that build Python objects) that also reads `1e-3` as a float, as YAML 1.2
    does (YAML 1.1 wants `1.0e-3` and would hand the researcher a string), and refuses a key given twice
    in one mapping (DuplicateKey)."""

    def construct_document(self, node):
        self.paths = field_paths(node)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        lines: dict[Any, list[int]] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` then a key overrides base's, as meant
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable):  # an unhashable key is refused by SafeLoader itself
                lines.setdefault(key, []).append(key_node.start_mark.line + 1)
        for key, found in lines.items():
            if len(found) > 1:
                path = self.paths.get(id(node), "")
                raise DuplicateKey(f"{path}.{key}" if path else str(key), found)
        return super().construct_mapping(node, deep)


def field_paths(root: yaml.Node) -> dict[int, str]:
    """The field path (`algorithms.fedavg`, `report.metrics[0]`) of each node of a document, by node id."""
    paths: dict[int, str] = {}
    pending = [(root, "")]
    while pending:
        node, path = pending.pop()
        if id(node) in paths:  # an alias: the node is where its anchor is (and a recursive one ends here)
            continue
        paths[id(node)] = path
        if isinstance(node, yaml.MappingNode):
            pending += [(value, f"{path}.{key.value}" if path else key.value)
                        for key, value in node.value if isinstance(key, yaml.ScalarNode)]
        elif isinstance(node, yaml.SequenceNode):
            pending += [(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
    return paths


RecipeLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def yaml_value(text: str) -> Any:
    return yaml.load(text, Loader=RecipeLoader)


class RecipeError(ValueError):
    """One line (file, field path, what was found, what was expected), short enough to read at a glance;
    `detail`, what explains it further, is shown on a second line by `fedbench -v`."""

    def __init__(self, source: str, path: str, message: str, detail: str = ""):
        self.source, self.path, self.message, self.detail = source, path, message, detail
        super().__init__(f"{source}: {path}: {message}" if path else f"{source}: {message}")


def closest(name: str, options) -> str:
    match = difflib.get_close_matches(str(name), list(options), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def read_yaml(path: str | Path) -> dict[str, Any]:
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise RecipeError(source, "", f"cannot read the file ({err.strerror})") from None
    try:
        raw = yaml_value(text)
    except DuplicateKey as err:
        lines = sorted(set(err.lines))  # one line when a flow mapping ({a: 1, a: 2}) repeats it
        where = f"line {lines[0]}" if len(lines) == 1 else f"lines {', '.join(map(str, lines[:-1]))} and {lines[-1]}"
        count = "twice" if len(err.lines) == 2 else f"{len(err.lines)} times"
        raise RecipeError(source, err.path, f"given {count} ({where}); expected once") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if "python/" in problem:
            problem = "a !!python tag is refused (recipes are read with safe_load and never build objects)"
        raise RecipeError(source, "", f"malformed YAML: {where}{problem}") from None
    expected = "expected a mapping at the top level (problem:, algorithms:, federation:, seeds: ...)"
    if raw is None:  # nothing, only comments, a bare `---` (or a lone `null`)
        raise RecipeError(source, "", f"the file is empty; {expected}")
    if not isinstance(raw, dict):
        raise RecipeError(source, "", f"found {in_words(raw)}; {expected}")
    return raw


def in_words(value: Any) -> str:
    """What a YAML value is, for a `found ...` (not Python's type names: a researcher wrote YAML)."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value if len(value) <= 40 else value[:40] + '…'!r}"
    if isinstance(value, list):
        return "a list"
    return f"the {type(value).__name__} {value}"  # a date or a timestamp


def apply_overrides(raw: dict[str, Any], assignments: list[str], source: str, algorithm: str | None = None) -> dict:
    """`path=value` assignments (value parsed as YAML); `algorithm.x` means the selected algorithm's x."""
    for assignment in assignments:
        path, sep, text = assignment.partition("=")
        if not sep or not path:
            raise RecipeError(source, "--set", f"expected path=value, found {assignment!r}")
        keys = path.split(".")
        if keys[0] == "algorithm":
            listed = raw.get("algorithms")
            if algorithm is None and isinstance(listed, dict) and len(listed) == 1:
                algorithm = next(iter(listed))
            if algorithm is None:
                raise RecipeError(source, "--set", f"{path!r} needs a selected algorithm; write algorithms.NAME.{'.'.join(keys[1:])}")
            keys = ["algorithms", algorithm, *keys[1:]]
        try:
            value = yaml_value(text)
        except yaml.YAMLError:
            raise RecipeError(source, "--set", f"cannot parse the value of {path!r}: {text!r}") from None
        node = raw
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise RecipeError(source, path, "cannot set a field inside a non-mapping")
        node[keys[-1]] = value
    return raw


def _check_values(source: str, path: str, param: Param, value: Any) -> list[Any]:
    """A list is a grid axis, a scalar one value; each value checked. For a list-valued parameter
    (kind `floats` or `ints`, e.g. a per-stage schedule) one list is one value and a list of lists a grid axis."""
    if param.kind in LIST_KINDS:
        is_grid = isinstance(value, list) and bool(value) and all(isinstance(v, list) for v in value)
    else:
        is_grid = isinstance(value, list)
    values = value if is_grid else [value]
    if not values:
        raise RecipeError(source, path, "found an empty list, expected at least one value")
    checked = []
    for i, v in enumerate(values):
        try:
            checked.append(param.check(v))
        except ValueError as err:
            raise RecipeError(source, f"{path}[{i}]" if is_grid else path, str(err)) from None
    return checked


def _check_params(source, path, declared, given: dict) -> dict[str, list[Any]]:
    by_name = {p.name: p for p in declared}
    grid = {}
    for key, value in given.items():
        if key not in by_name:
            raise RecipeError(source, f"{path}.{key}", f"unknown parameter{closest(key, by_name)}; "
                              f"expected one of {', '.join(by_name)}")
        grid[key] = _check_values(source, f"{path}.{key}", by_name[key], value)
    return grid


@dataclass(frozen=True)
class Trial:
    """One fully specified run: a problem instance, one algorithm with one value per hyperparameter, a seed."""
    recipe: str
    problem: str
    problem_config: dict[str, Any]
    algorithm: str
    hyperparameters: dict[str, Any]
    federation: Federation
    seed: int
    eval_every: int
    device: str
    divergence_factor: float = DIVERGENCE_FACTOR

    def config(self) -> dict[str, Any]:
        """Everything that determines the run except the seed (and the device it runs on)."""
        return {"problem": {"name": self.problem, **self.problem_config},
                "federation": asdict(self.federation),
                "algorithm": {"name": self.algorithm, **self.hyperparameters},
                "eval_every": self.eval_every, "divergence_factor": self.divergence_factor}

    @property
    def config_hash(self) -> str:
        return stable_hash(self.config())

    def metrics(self) -> tuple[Metric, ...]:
        """What the run's rows hold beside `round`: the problem's declared metrics (with the `personal_` ones
        for a personalized algorithm), then the engine's columns."""
        algorithm = ALGORITHMS[self.algorithm]
        problem = PROBLEMS[self.problem].declared_metrics(self.problem_config, algorithm.personalized)
        return problem + algorithm.declared_metrics(self.hyperparameters) + ENGINE_COLUMNS

    def params(self) -> dict[str, Any]:
        """The configuration flattened to dotted names, plus the seed: what the tracker records."""
        flat = {}
        for section, values in self.config().items():
            if isinstance(values, dict):
                flat.update({f"{section}.{key}": value for key, value in values.items()})
            else:
                flat[section] = values
        return {**flat, "seed": self.seed}


def stable_hash(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


class StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class Resources(StrictModel):
    """What one Ray trial holds, and how many (config, seed) runs it packs."""
    cpus_per_trial: float = Field(1.0, gt=0)
    gpus_per_trial: float = Field(0.0, ge=0)
    max_concurrent: Optional[int] = Field(None, ge=1)
    pack: Any = "auto"
    batch_runs: int = Field(64, ge=1)  # most seeds of one configuration run as one program (fedbench.runs); 1: off

    @field_validator("gpus_per_trial")
    @classmethod
    def _whole_above_one(cls, value: float) -> float:
        if value > 1 and not float(value).is_integer():
            raise ValueError(f"found {value}, expected a fraction <= 1 or a whole number of GPUs")
        return value

    @field_validator("pack")
    @classmethod
    def _pack(cls, value: Any) -> Any:
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"found {value!r}, expected 'auto' or an integer >= 1 (runs per Ray trial)")
        return value


class PrunerSpec(StrictModel):
    """Asynchronous successive halving (ASHA) on the evaluated curve, in rounds."""
    grace_rounds: int = Field(ge=1)
    reduction_factor: float = Field(3.0, gt=1)


class TuneSpec(StrictModel):
    """The optional `tune:` block: an Optuna search per algorithm, each with the same budget."""
    space: dict[str, dict[str, Any]] = Field(min_length=1)
    metric: str = Field(min_length=1)
    mode: Optional[str] = None  # default: the metric's declared direction
    objective: str = "final"  # final value of the metric, or best value over the curve
    trials: int = Field(20, ge=1)  # per algorithm and per `fedbench tune` call
    timeout_s: Optional[float] = Field(None, gt=0)  # wall budget per algorithm
    sampler: str = "tpe"
    sampler_seed: int = Field(0, ge=0)
    seed: Optional[int] = Field(None, ge=0)  # the run seed while tuning (default: the recipe's first)
    pruner: Optional[PrunerSpec] = None
    rerun_best: int = Field(0, ge=0)  # fresh seeds on which each algorithm's best configuration is re-run

    @field_validator("mode")
    @classmethod
    def _mode(cls, value: str) -> str:
        return _one_of(value, ("min", "max"))

    @field_validator("objective")
    @classmethod
    def _objective(cls, value: str) -> str:
        return _one_of(value, ("final", "best"))

    @field_validator("sampler")
    @classmethod
    def _sampler(cls, value: str) -> str:
        return _one_of(value, SAMPLERS)


class SelectSpec(StrictModel):
    """What "best configuration" means: the final value of `metric`, lowest (`min`) or highest (`max`)."""
    metric: str = Field(min_length=1)
    mode: Optional[str] = None  # default: the metric's declared direction

    @field_validator("mode")
    @classmethod
    def _mode(cls, value: str) -> str:
        return _one_of(value, ("min", "max"))


X_AXES = ("rounds", "comm", "iterations", "seconds")


class ReportSpec(StrictModel):
    """The optional `report:` block: what `fedbench report` draws and how it ranks configurations.
    Every field has a default, so a recipe without the block still gets a report."""
    metrics: list[str] = Field(default_factory=list)  # panels of the paper-style figure, in order
    select: Optional[SelectSpec] = None  # default: the tune block's metric and mode, else the objective
    target: dict[str, float] = Field(default_factory=dict)  # metric -> value, for rounds-to-target
    # the figure's x-axis: rounds; comm: floats communicated (uploads + downloads); iterations: local iterations;
    # seconds: training wall-clock. A list draws the figure once per axis, the first being the main one.
    x: Union[str, list[str]] = Field("rounds", validate_default=True)
    interval: str = "sd"  # the tables' ± after each mean: sd, the sample standard deviation over seeds; ci95, 1.96 s.e.
    log: dict[str, bool] = Field(default_factory=dict)  # metric -> log scale, overriding the automatic choice
    labels: dict[str, str] = Field(default_factory=dict)  # algorithm or metric -> name shown in plots and tables
    curves: int = Field(4, ge=1)  # most configurations drawn per algorithm (its best ones)

    @field_validator("metrics")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if any(not name for name in value) or len(set(value)) != len(value):
            raise ValueError(f"found {value!r}, expected distinct metric names")
        return value

    @field_validator("x")
    @classmethod
    def _x(cls, value: Union[str, list[str]]) -> list[str]:
        axes = [value] if isinstance(value, str) else value
        if not axes or len(set(axes)) != len(axes):
            raise ValueError(f"found {value!r}, expected an axis or a list of distinct axes")
        return [_one_of(axis, X_AXES) for axis in axes]

    @field_validator("interval")
    @classmethod
    def _interval(cls, value: str) -> str:
        return _one_of(value, ("sd", "ci95"))


SAMPLERS = ("tpe", "random", "cmaes", "gp")
DISTRIBUTIONS = ("log_uniform", "uniform", "int", "log_int", "categorical")


def _one_of(value: str, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ValueError(f"found {value!r}, expected one of {', '.join(options)}{closest(value, options)}")
    return value


@dataclass(frozen=True)
class Dimension:
    """One axis of the search space, as written in `tune.space` (`problem.lam`, `client_lr`,
    `algorithms.fedmid.server_lr`), and the algorithms whose trials it varies."""
    key: str
    algorithms: tuple[str, ...]
    distribution: str
    bounds: tuple[Any, ...]  # (low, high), or the categories

    def path(self, algorithm: str) -> str:
        """The recipe field this dimension sets in `algorithm`'s trials."""
        return self.key if "." in self.key else f"algorithms.{algorithm}.{self.key}"


class RecipeModel(StrictModel):
    name: Optional[str] = Field(None, min_length=1)  # default: the recipe file's name without .yaml
    problem: dict[str, Any]
    federation: dict[str, Any] = Field(default_factory=dict)
    algorithms: dict[str, Optional[dict[str, Any]]] = Field(min_length=1)
    seeds: Any = Field(1, validate_default=True)
    eval_every: int = Field(10, ge=1)
    device: str = "auto"
    divergence_factor: float = Field(DIVERGENCE_FACTOR, gt=1)
    resources: Resources = Field(default_factory=Resources)
    tune: Optional[TuneSpec] = None
    report: Optional[ReportSpec] = None

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: Any) -> list[int]:
        if is_seed(value) and value >= 1:
            return list(range(value))
        if isinstance(value, list) and value and all(map(is_seed, value)):
            if len(set(value)) != len(value):
                raise ValueError(f"found repeated seeds {value}")
            return value
        raise ValueError(f"found {value!r}, expected a count >= 1 or a non-empty list of integers >= 0")

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value.split(":")[0] not in ("auto", "cpu", "cuda"):
            raise ValueError(f"found {value!r}, expected auto, cpu or cuda[:N]")
        return value


def is_seed(value: Any) -> bool:
    """A trial seed: an integer >= 0 (the rule of each of `seeds`, and of `fedbench run --seed`)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


SECTIONS = {(): RecipeModel, ("resources",): Resources, ("tune",): TuneSpec, ("tune", "pruner"): PrunerSpec,
            ("report",): ReportSpec, ("report", "select"): SelectSpec}


def _schema_error(source: str, err: ValidationError) -> RecipeError:
    """The first pydantic error as one line: field path, what was found, what was expected."""
    error = err.errors()[0]
    loc = [part for part in error["loc"] if part != "[key]"]
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    kind = error["type"]
    if kind == "missing":
        return RecipeError(source, path, "missing required field")
    if kind == "extra_forbidden":
        fields = list(SECTIONS.get(tuple(loc[:-1]), RecipeModel).model_fields)
        return RecipeError(source, path, f"unknown field{closest(loc[-1], fields)}; expected one of {', '.join(fields)}")
    if kind == "value_error":
        return RecipeError(source, path, error["msg"].removeprefix("Value error, "))
    expected = PHRASES.get(kind) or error["msg"].removeprefix("Input should be ")
    return RecipeError(source, path, f"found {error['input']!r}, expected {expected}")


PHRASES = {"dict_type": "a mapping", "string_type": "a string", "string_too_short": "a non-empty string",
           "too_short": "at least one entry", "int_type": "an integer", "float_type": "a number",
           "list_type": "a list", "bool_type": "true or false"}


@dataclass
class Recipe:
    source: str
    name: str
    problem: str
    problem_grid: dict[str, list[Any]]
    federation_grid: dict[str, list[Any]]
    algorithms: dict[str, dict[str, list[Any]]]
    seeds: list[int]
    eval_every: int
    device: str
    divergence_factor: float
    resources: Resources
    tune: Optional[TuneSpec]
    document: dict[str, Any]  # the validated YAML after overrides, as written
    dimensions: tuple[Dimension, ...] = ()  # the tune block's search space, resolved
    report: ReportSpec = field(default_factory=ReportSpec)
    overrides: dict[str, dict[str, dict[str, list[Any]]]] = field(default_factory=dict)  # algorithm -> section -> grid
    # config hashes `check_builds` has passed: the CLI checks every recipe before the first runs, and the entry points
    # it calls (`execute.sweep`, `tuning.tune_recipe`) check again for callers from Python; the data index is read once
    built: set[str] = field(default_factory=set, repr=False, compare=False)

    @property
    def recipe_hash(self) -> str:
        """Of what runs: the report block only changes how results are drawn, so a sweep is found again
        (and resumed) after it is edited."""
        return stable_hash({key: value for key, value in self.document.items() if key != "report"})

    def trials(self) -> list[Trial]:
        """The grid expanded: algorithm × problem point × federation point × hyperparameter point × seed."""
        trials = []
        for algo, hp_grid in self.algorithms.items():
            problem_grid, federation_grid = self.grids(algo)
            for problem_values, federation_values, hps in itertools.product(
                    grid_points(problem_grid), grid_points(federation_grid), grid_points(hp_grid)):
                trials += [self._trial(problem_values, federation_values, algo, hps, seed) for seed in self.seeds]
        return trials

    def single_trial(self, algorithm: str | None = None, seed: int | None = None,
                     fixed: dict[str, Any] | None = None) -> Trial:
        """The one trial `fedbench run` runs: every parameter must have exactly one value, except those
        `fixed` gives (by recipe path, e.g. `problem.lam` or `algorithms.fedmid.client_lr`)."""
        if algorithm is None:
            if len(self.algorithms) != 1:
                raise RecipeError(self.source, "algorithms",
                                  f"the recipe compares {', '.join(self.algorithms)}; choose one with --algorithm")
            algorithm = next(iter(self.algorithms))
        if algorithm not in self.algorithms:
            raise RecipeError(self.source, "--algorithm", f"found {algorithm!r}, expected one of "
                              f"{', '.join(self.algorithms)}{closest(algorithm, self.algorithms)}")
        if seed is not None and not is_seed(seed):
            raise RecipeError(self.source, "--seed", f"found {seed!r}, expected an integer >= 0 (as each of seeds)")
        fixed = fixed or {}
        problem_grid, federation_grid = self.grids(algorithm)
        sections = {"problem": problem_grid, "federation": federation_grid,
                    f"algorithms.{algorithm}": self.algorithms[algorithm]}
        chosen = {}
        for section, grid in sections.items():
            chosen[section] = {}
            for key, values in grid.items():
                if f"{section}.{key}" not in fixed and len(values) != 1:
                    raise RecipeError(self.source, f"{section}.{key}", f"found {len(values)} values {values}, "
                                      f"expected one for a single run; pick one with --set {section}.{key}=VALUE")
                chosen[section][key] = values[0]
            chosen[section].update({path.removeprefix(section + "."): value for path, value in fixed.items()
                                    if path.startswith(section + ".")})
        return self._trial(chosen["problem"], chosen["federation"], algorithm,
                           chosen[f"algorithms.{algorithm}"], self.seeds[0] if seed is None else seed)

    def grids(self, algorithm: str) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """The problem and federation grids of one algorithm: the recipe's, with the algorithm's own
        `problem:` / `federation:` entries in their place (e.g. the centralized reference on pooled data)."""
        own = self.overrides.get(algorithm, {})
        return {**self.problem_grid, **own.get("problem", {})}, {**self.federation_grid, **own.get("federation", {})}

    def _trial(self, problem_values, federation_values, algorithm, hyperparameters, seed) -> Trial:
        federation_values = dict(federation_values)
        iterations = federation_values.pop("iterations", None)
        if iterations is not None:  # a budget of local iterations: rounds = iterations / K
            steps = federation_values["local_steps"]
            if "rounds" in federation_values:
                raise RecipeError(self.source, "federation.iterations", f"found {iterations} with local_steps "
                                  f"{steps} and rounds; expected one of rounds and iterations")
            if iterations % steps:
                raise RecipeError(self.source, "federation.iterations", f"found {iterations} with local_steps "
                                  f"{steps}; expected a multiple of local_steps")
            federation_values["rounds"] = iterations // steps
        trial = Trial(self.name, self.problem, PROBLEMS[self.problem].resolve_config(problem_values), algorithm,
                      resolve(ALGORITHMS[algorithm].hparams, hyperparameters, algorithm),
                      Federation(**federation_values), seed, self.eval_every, self.device, self.divergence_factor)
        self.check(trial)
        return trial

    def check(self, trial: Trial, read_data: bool = False) -> None:
        """Refuse (RecipeError, naming the recipe field) a trial whose run building would refuse, by the rules the
        engine applies then: the problem's and the algorithm's own (`Problem.check`, `Algorithm.check`), the
        contract between them, and the federation and the algorithm's minibatches against the problem's clients
        (`Federation.check`) as the config declares them, and with `read_data` as the index of the data does."""
        problem, algorithm, hp = PROBLEMS[trial.problem], ALGORITHMS[trial.algorithm], trial.hyperparameters
        try:
            problem.check(trial.problem_config)
        except ParamError as err:
            raise RecipeError(self.source, self.field(trial.algorithm, "problem", err.name), err.message) from None
        try:
            algorithm.check(hp)
        except ParamError as err:
            raise RecipeError(self.source, f"algorithms.{trial.algorithm}.{err.name}", err.message) from None
        try:
            contract.check(trial.algorithm, algorithm.requirements(hp), trial.problem,
                           problem.capabilities(trial.problem_config))
        except contract.IncompatibleError as err:
            raise RecipeError(self.source, f"algorithms.{trial.algorithm}", str(err), err.detail) from None
        try:
            layout = problem.declared_layout(trial.problem_config, read_data)
        except ParamError as err:
            raise RecipeError(self.source, self.field(trial.algorithm, "problem", err.name), err.message) from None
        _, batch_sizes = minibatch_sizes(algorithm.minibatches(hp), hp, trial.federation.batch_size)
        try:
            trial.federation.check(layout, batch_sizes)
        except ParamError as err:  # a federation field, or a minibatch size among the hyperparameters
            path = (self.field(trial.algorithm, "federation", err.name) if err.name in FEDERATION_NAMES
                    else f"algorithms.{trial.algorithm}.{err.name}")
            raise RecipeError(self.source, path, err.message) from None

    def check_builds(self, trials: list[Trial] | None = None) -> None:
        """`check` every distinct configuration of `trials` (default: the recipe's) with the index of its data
        read: what `validate`, `run`, `sweep` and `tune` do before anything runs (before Ray starts, or the
        tracking store is touched), so that what building a run would refuse is refused first, with its field."""
        for trial in self.trials() if trials is None else trials:
            if trial.config_hash not in self.built:
                self.check(trial, read_data=True)
                self.built.add(trial.config_hash)

    def field(self, algorithm: str, section: str, name: str) -> str:
        """The path of a problem or federation parameter in the runs of `algorithm`: its own entry, if it has one."""
        own = name in self.overrides.get(algorithm, {}).get(section, {})
        return f"algorithms.{algorithm}.{section}.{name}" if own else f"{section}.{name}"

    def metrics(self) -> dict[str, Metric]:
        """Every metric the recipe's runs evaluate, by name (the union over its algorithms and grid points)."""
        return metrics_of(self.trials())


def metrics_of(trials: list[Trial]) -> dict[str, Metric]:
    declared = {}
    for trial in trials:
        for metric in trial.metrics():
            declared.setdefault(metric.name, metric)
    return declared


# A federation may give a budget of local iterations per client instead of rounds (rounds = iterations / K),
# so that a grid over local_steps compares methods at equal work (the FeDXL paper's K ablation).
FEDERATION_PARAMS = (*Federation.params, Param("iterations", "int", None, "instead of rounds: local iterations per "
                                               "client, rounds = iterations / local_steps", low=1))
FEDERATION_NAMES = {p.name for p in FEDERATION_PARAMS}


def parse(raw: dict[str, Any], source: str) -> Recipe:
    try:
        model = RecipeModel.model_validate(raw)
    except ValidationError as err:
        raise _schema_error(source, err) from None

    problem = dict(model.problem)
    problem_name = problem.pop("name", None)
    if problem_name not in PROBLEMS:
        raise RecipeError(source, "problem.name", f"found {problem_name!r}, expected one of "
                          f"{', '.join(PROBLEMS)}{closest(problem_name, PROBLEMS)}")
    problem_grid = _check_params(source, "problem", PROBLEMS[problem_name].params, problem)

    federation_grid = _check_params(source, "federation", FEDERATION_PARAMS, model.federation)
    sections = {"problem": PROBLEMS[problem_name].params, "federation": FEDERATION_PARAMS}
    algorithms, overrides = {}, {}
    for algo, hps in model.algorithms.items():
        if algo not in ALGORITHMS:
            raise RecipeError(source, f"algorithms.{algo}", f"unknown algorithm{closest(algo, ALGORITHMS)}; "
                              f"expected one of {', '.join(ALGORITHMS)}")
        hps = dict(hps or {})
        overrides[algo] = {}
        for section in [name for name in sections if name in hps]:
            given = hps.pop(section)
            if not isinstance(given, dict):
                raise RecipeError(source, f"algorithms.{algo}.{section}", f"found {given!r}, expected a mapping of "
                                  f"{section} parameters that replace the recipe's for {algo}")
            overrides[algo][section] = _check_params(source, f"algorithms.{algo}.{section}", sections[section], given)
        algorithms[algo] = _check_params(source, f"algorithms.{algo}", ALGORITHMS[algo].hparams, hps)

    dimensions = _check_space(source, model.tune, problem_name, algorithms) if model.tune else ()
    name = model.name or Path(source).stem
    recipe = Recipe(source, name, problem_name, problem_grid, federation_grid, algorithms, model.seeds,
                    model.eval_every, model.device, model.divergence_factor, model.resources, model.tune, raw,
                    dimensions, model.report or ReportSpec(), overrides)
    # Every grid point must make a valid trial (e.g. clients_per_round <= clients); their declared metrics are what
    # the tune and report blocks may name.
    declared = metrics_of(recipe.trials())
    check_metrics(recipe, list(declared))
    _default_modes(recipe, declared)
    return recipe


def _default_modes(recipe: Recipe, declared: dict[str, Metric]) -> None:
    """A tune or select block without `mode` takes its metric's declared direction."""
    for path, spec in (("tune", recipe.tune), ("report.select", recipe.report.select)):
        if spec is None or spec.mode is not None:
            continue
        spec.mode = declared[spec.metric].direction
        if spec.mode is None:
            raise RecipeError(recipe.source, f"{path}.mode", f"missing, and {spec.metric} is declared with no "
                              "direction (neither lower nor higher is better); expected min or max")


def _check_space(source: str, tune: TuneSpec, problem: str, algorithms: dict) -> tuple[Dimension, ...]:
    """Each `tune.space` entry names a declared parameter and a valid range of it:
    `problem.X`, `federation.X`, `algorithms.A.X`, or a bare `X` for every algorithm declaring X."""
    dimensions = []
    for key, spec in tune.space.items():
        where = f"tune.space.{key}"
        section, _, name = key.rpartition(".")
        if section in ("problem", "federation"):
            declared = PROBLEMS[problem].params if section == "problem" else FEDERATION_PARAMS
            owners = {None: {p.name: p for p in declared}}
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
            raise RecipeError(source, where, f"unknown parameter{closest(name, known)}; expected one of {', '.join(known)}")
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
                raise RecipeError(source, where, f"{name} is {kind}; expected {hint} distribution")
        for param in params:
            for i, value in enumerate(bounds):
                try:
                    param.check(value)
                except ValueError as err:
                    raise RecipeError(source, f"{where}[{i}]", str(err)) from None
        applies = tuple(algorithms) if None in owners else tuple(a for a in owners if name in owners[a])
        dimensions.append(Dimension(key, applies, distribution, tuple(bounds)))
    return tuple(dimensions)


def named_metrics(recipe: Recipe) -> list[tuple[str, str]]:
    """(field path, name) of every metric the tune and report blocks name; a `report.labels` key that is
    not one of the recipe's algorithms names a metric."""
    report = recipe.report
    named = [("tune.metric", recipe.tune.metric)] if recipe.tune else []
    named += [(f"report.metrics[{i}]", name) for i, name in enumerate(report.metrics)]
    named += [("report.select.metric", report.select.metric)] if report.select else []
    named += [(f"report.{section}.{name}", name) for section in ("target", "log") for name in getattr(report, section)]
    named += [(f"report.labels.{name}", name) for name in report.labels if name not in recipe.algorithms]
    return named


def check_metrics(recipe: Recipe, available: list[str]) -> None:
    """Every metric the tune and report blocks name must be one of `available`: the metrics the problem declares
    for the recipe's runs (nothing is built), or what stored runs hold."""
    for path, name in named_metrics(recipe):
        if name in available:
            continue
        if path.startswith("report.labels."):
            known = [*recipe.algorithms, *available]
            raise RecipeError(recipe.source, path, f"found {name!r}, expected an algorithm of the recipe or a "
                              f"metric: {', '.join(known)}{closest(name, known)}")
        raise RecipeError(recipe.source, path, f"found {name!r}, expected one of the metrics of {recipe.problem}: "
                          f"{', '.join(available)}{closest(name, available)}")


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
        raise RecipeError(recipe.source, option, _schema_error(recipe.source, err).message) from None


def load(path: str | Path, overrides: list[str] | None = None, algorithm: str | None = None) -> Recipe:
    source = str(path)
    raw = apply_overrides(read_yaml(path), overrides or [], source, algorithm)
    return parse(raw, source)
