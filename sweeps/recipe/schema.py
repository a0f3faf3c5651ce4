"""The recipe's shape, as pydantic models (strict types, unknown fields refused): the top-level fields and the
`resources:`, `tune:` and `report:` blocks with their defaults and rules, a `tune.space` entry as resolved
(`Dimension`, which `space.check_space` makes), and `schema_error`, the first pydantic error as a `RecipeError` line.
What names a problem, algorithm or parameter may take is checked elsewhere, against the engine's declarations.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedbench.engine.compiling import MODES as COMPILE_MODES
from fedbench.engine.federation import DIVERGENCE_FACTOR
from .loading import RecipeError, closest, shown, unknown


class StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class Resources(StrictModel):
    """What one Ray trial holds, and how many (config, seed) runs it packs."""
    cpus_per_trial: float = Field(1.0, gt=0)  # CPUs a trial reserves (its PyTorch threads)
    gpus_per_trial: float = Field(0.0, ge=0)  # GPUs a trial reserves: a fraction shares one, whole numbers above 1
    max_concurrent: Optional[int] = Field(None, ge=1)  # most trials at once (default: as many as the slots hold)
    # (config, seed) runs one Ray trial goes through one after another; auto: enough to keep every slot busy
    pack: Any = "auto"
    batch_runs: int = Field(64, ge=1)  # most seeds of one configuration in one program (fedbench.engine.runs); 1: off

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
            raise ValueError(f"found {shown(value)}, expected 'auto' or an integer >= 1 (runs per Ray trial)")
        return value


class Checkpoints(StrictModel):
    """Mid-run checkpoints of each program of runs (`sweeps.checkpoints`): every `every_seconds` seconds of running
    or every `every_rounds` rounds, whichever comes first (0: not by that measure; both 0: none). The default, a
    minute, leaves runs shorter than that without any."""
    every_seconds: float = Field(60.0, ge=0)  # seconds of running between two checkpoints (0: not by time)
    every_rounds: int = Field(0, ge=0)  # rounds between two checkpoints (0: not by rounds)


class PrunerSpec(StrictModel):
    """Asynchronous successive halving (ASHA) on the evaluated curve, in rounds."""
    grace_rounds: int = Field(ge=1)  # rounds every trial runs before it may be stopped
    reduction_factor: float = Field(3.0, gt=1)  # 1/η of the trials go on at each rung


class TuneSpec(StrictModel):
    """The optional `tune:` block: an Optuna search per algorithm, each with the same budget."""
    # dotted field -> {distribution: [low, high]} (or categorical: [choices]), e.g. algorithms.fedavg.client_lr: a
    # hyperparameter (bare: of every algorithm declaring it) or a field of its schedule (client_lr.init), problem.X,
    # federation.X, a chain step's parameter as a grid reaches it (federation.uplink.0.top_k, downlink.0.qsgd) or
    # the adversaries' (federation.adversaries.fraction)
    space: dict[str, dict[str, Any]] = Field(min_length=1)
    metric: str = Field(min_length=1)  # the metric the study optimises
    mode: Optional[str] = None  # default: the metric's declared direction
    objective: str = "final"  # final value of the metric, or best value over the curve
    trials: int = Field(20, ge=1)  # per algorithm and per `fedbench tune` call
    timeout_s: Optional[float] = Field(None, gt=0)  # wall budget per algorithm
    sampler: str = "tpe"  # Optuna's sampler: tpe, random, cmaes or gp
    sampler_seed: int = Field(0, ge=0)  # the sampler's seed (a study is reproducible)
    seed: Optional[int] = Field(None, ge=0)  # the run seed while tuning (default: the recipe's first)
    pruner: Optional[PrunerSpec] = None  # stop poor trials early (`tune.pruner:` below); absent: none
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


@dataclass(frozen=True)
class Dimension:
    """One axis of the search space, as written in `tune.space` (`problem.lam`, `client_lr`,
    `algorithms.fedmid.server_lr`, `client_lr.init`), and the algorithms whose trials it varies."""
    key: str
    algorithms: tuple[str, ...]
    distribution: str
    bounds: tuple[Any, ...]  # (low, high), or the categories
    own: tuple[str, ...] = ()  # the algorithms whose own `problem:` / `federation:` entry holds the field it sets

    def path(self, algorithm: str) -> str:
        """The recipe field this dimension sets in `algorithm`'s trials: a problem or federation field in the
        algorithm's own entry where it has one (which replaces the recipe's for it)."""
        if algorithm in self.own or not self.key.startswith(("problem.", "federation.", "algorithms.")):
            return f"algorithms.{algorithm}.{self.key}"
        return self.key


class SelectSpec(StrictModel):
    """What "best configuration" means: the final value of `metric`, lowest (`min`) or highest (`max`)."""
    metric: str = Field(min_length=1)  # the metric whose final value ranks the configurations
    mode: Optional[str] = None  # default: the metric's declared direction

    @field_validator("mode")
    @classmethod
    def _mode(cls, value: str) -> str:
        return _one_of(value, ("min", "max"))


X_AXES = ("rounds", "comm", "comm_bits", "comm_up_bits", "comm_down_bits", "iterations", "seconds")


class ReportSpec(StrictModel):
    """The optional `report:` block: what `fedbench report` draws and how it ranks configurations.
    Every field has a default, so a recipe without the block still gets a report."""
    metrics: list[str] = Field(default_factory=list)  # panels of the paper-style figure, in order
    select: Optional[SelectSpec] = None  # default: the tune block's metric and mode, else the objective
    target: dict[str, float] = Field(default_factory=dict)  # metric -> value, for rounds-to-target
    # the figure's x-axis: rounds; comm: floats communicated (uploads + downloads); comm_bits, comm_up_bits,
    # comm_down_bits: bits communicated (both ways, up, down) as the uplink and downlink encode them; iterations: local
    # iterations; seconds: training wall-clock. A list draws the figure once per axis, the first being the main one.
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



MAX_SEEDS = 10_000  # seeds of one recipe: checked before a count is listed (`seeds: 100000000` would be 5 GB)
MAX_NAME = 500  # characters of a name: MLflow's limit on an experiment's and a run's name
# A name is a folder's (reports/, checkpoints/) and a file's (optuna-NAME.db) as well as MLflow's: parts of letters,
# digits, `-`, `_` and `.` between single `/`, none of them `.` or `..` (no part of a path may leave its folder).
NAME_PART = re.compile(r"[\w.-]+")
NAME_RULE = "letters, digits, - _ . in parts between single /, none . or .."


def check_name(name: str) -> str:
    """A recipe's `name:` as it is, or ValueError saying what was found and what is expected."""
    if len(name) > MAX_NAME:
        raise ValueError(f"found {name[:20]!r}… of {len(name)} characters, expected at most {MAX_NAME} (MLflow's "
                         f"limit)")
    if not all(NAME_PART.fullmatch(part) and part not in (".", "..") for part in name.split("/")):
        raise ValueError(f"found {shown(name)}, expected {NAME_RULE}")
    return name


class Tracking(StrictModel):
    """What each run stores beside its curve."""
    # also the run's model every this many rounds, as the artifact model/round_<r>.pt (0: the final model only,
    # model/final.pt, which every run stores)
    models_every: int = Field(0, ge=0)


class Privacy(StrictModel):
    """Privacy accounting of DP-FedAvg's noise (a `gaussian` step of `federation.uplink`, after a clip): every row of
    such a run has `epsilon`, ε at `delta` after the row's rounds, user-level with one client's data replaced, for the
    fixed number of clients each round draws without replacement (or all of them), by dp-accounting's `accountant`
    (`fedbench.axes.privacy`). Required where a run adds the noise, refused where none does."""
    delta: float = Field(gt=0, lt=1)  # the δ of (ε, δ)-DP, e.g. 1.0e-5 (below 1/N, the clients' number, by custom)
    # pld: the privacy-loss distribution of the mechanism's dominating pair (tight); rdp: the Rényi DP bound (looser)
    accountant: Literal["pld", "rdp"] = "pld"


class RecipeModel(StrictModel):
    name: Optional[str] = Field(None, min_length=1)  # default: the recipe file's name without .yaml
    plugins: list[str] = Field(default_factory=list)  # files (relative to the recipe) or modules of own components
    # the problem: `name`, an optional `preset`, and any of its parameters (a list is a grid axis)
    problem: dict[str, Any]
    # how rounds run, and what crosses the network (the `federation:` tables below)
    federation: dict[str, Any] = Field(default_factory=dict)
    # the algorithms to compare, each mapped to its hyperparameters (a list is a grid axis)
    algorithms: dict[str, Optional[dict[str, Any]]] = Field(min_length=1)
    # a count n (seeds 0..n-1) or a list of seeds, at most 10,000; every configuration runs on each
    seeds: Any = Field(1, validate_default=True)
    eval_every: int = Field(10, ge=1)  # evaluate every this many rounds (communication rounds)
    device: str = "auto"  # auto (CUDA where available), cpu, cuda or cuda:N
    # local steps compiled with torch.compile: auto (where bench/compile.py measured that they win), on, off
    compile: str = "auto"
    # a run whose objective exceeds this times its start stops as diverged
    divergence_factor: float = Field(DIVERGENCE_FACTOR, gt=1)
    resources: Resources = Field(default_factory=Resources)  # what each Ray trial holds (`resources:` below)
    # how often a program of runs saves its state (`checkpoints:` below)
    checkpoints: Checkpoints = Field(default_factory=Checkpoints)
    tracking: Tracking = Field(default_factory=Tracking)  # what each run stores beside its curve (`tracking:` below)
    # ε at this δ in every row of a run with DP-FedAvg's noise (`privacy:` below); absent: no such run
    privacy: Optional[Privacy] = None
    tune: Optional[TuneSpec] = None  # an Optuna search per algorithm (`tune:` below); absent: none
    report: Optional[ReportSpec] = None  # what `fedbench report` draws (`report:` below); absent: the defaults
    # the most runs (configurations × seeds) `fedbench sweep` starts without --yes
    max_runs: int = Field(2000, ge=1)

    @field_validator("name")
    @classmethod
    def _name(cls, value: Optional[str]) -> Optional[str]:
        return value if value is None else check_name(value)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: Any) -> list[int]:
        expected = f"expected a count from 1 to {MAX_SEEDS} or a list of at most {MAX_SEEDS} distinct integers >= 0"
        if is_seed(value) and 1 <= value <= MAX_SEEDS:
            return list(range(value))
        if isinstance(value, list) and 0 < len(value) <= MAX_SEEDS and all(map(is_seed, value)):
            if len(set(value)) != len(value):
                raise ValueError(f"found repeated seeds {shown(value)}")
            return value
        if isinstance(value, list) and len(value) > MAX_SEEDS:
            raise ValueError(f"found a list of {len(value)} seeds, {expected}")
        raise ValueError(f"found {shown(value)}, {expected}")

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value.split(":")[0] not in ("auto", "cpu", "cuda"):
            raise ValueError(f"found {value!r}, expected auto, cpu or cuda[:N]")
        return value


    @field_validator("compile", mode="before")
    @classmethod
    def _compile(cls, value: Any) -> str:
        # YAML reads a bare on / off as true / false: both spellings mean the mode
        mode = ("on" if value else "off") if isinstance(value, bool) else value
        if mode not in COMPILE_MODES:
            raise ValueError(f"found {shown(value)}, expected auto, on or off")
        return mode


def is_seed(value: Any) -> bool:
    """A trial seed: an integer >= 0 (the rule of each of `seeds`, and of `fedbench run --seed`)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


SECTIONS: dict[tuple[Any, ...], type[StrictModel]] = {
    (): RecipeModel, ("resources",): Resources, ("checkpoints",): Checkpoints, ("tracking",): Tracking,
    ("privacy",): Privacy, ("tune",): TuneSpec, ("tune", "pruner"): PrunerSpec, ("report",): ReportSpec,
    ("report", "select"): SelectSpec}


def schema_error(source: str, err: ValidationError, nested: dict[str, list[str]] | None = None) -> RecipeError:
    """The first pydantic error as one line: field path, what was found, what was expected. A top-level name that is
    a field of a section (`nested`: name -> its paths, `rounds` -> `federation.rounds`) is answered with its path."""
    error = err.errors()[0]
    loc = [part for part in error["loc"] if part != "[key]"]
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    kind = error["type"]
    if kind == "missing":
        return RecipeError(source, path, "missing required field")
    if kind == "extra_forbidden":
        places = (nested or {}).get(str(loc[-1]), []) if len(loc) == 1 else []
        if places:
            return RecipeError(source, path, f"unknown field at the top level; {path} is a field of "
                               f"{' and '.join(place.rpartition('.')[0] for place in places)} "
                               f"(did you mean {places[0]!r}?)")
        fields = list(SECTIONS.get(tuple(loc[:-1]), RecipeModel).model_fields)
        return unknown(source, path, f"unknown field{closest(str(loc[-1]), fields)}", fields)
    if kind == "value_error":
        return RecipeError(source, path, error["msg"].removeprefix("Value error, "))
    expected = PHRASES.get(kind) or error["msg"].removeprefix("Input should be ")
    return RecipeError(source, path, f"found {shown(error['input'])}, expected {expected}")


PHRASES = {"dict_type": "a mapping", "string_type": "a string", "string_too_short": "a non-empty string",
           "too_short": "at least one entry", "int_type": "an integer", "float_type": "a number",
           "list_type": "a list", "bool_type": "true or false"}
