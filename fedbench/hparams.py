"""One declaration per tunable parameter: type, default, valid range, tuning scale, help.

Algorithms and problems declare their parameters here once; the recipe schema, `fedbench list`,
validation messages and the Optuna search space all read the same declaration. `HParams` holds resolved values
(an algorithm's round functions receive them, `fedbench.algorithms.base`). A float parameter may hold a value per
round instead of one number (`PerRound`: a schedule, `fedbench.schedules`).
"""
from __future__ import annotations

import difflib
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

KINDS = ("float", "int", "bool", "choice", "floats", "ints", "str")
"""The kinds of value a `Param` declares."""
LIST_KINDS = ("floats", "ints")  # one value is a list (a grid over them is a list of lists)


@dataclass(frozen=True)
class Param:
    """One parameter of an algorithm (`Algorithm.hparams`), a problem (`Problem.params`) or the federation: its
    type, default, valid range, tuning scale and help. The recipe's validator, `--set`, `fedbench list`, the
    reference pages and a `tune:` block's search space all read it; a declaration that could not check a value (an
    unknown kind, a choice without choices, a default outside its own range) is refused where it is written.

    An algorithm's round functions receive a float parameter as a per-run `[R, 1, 1]` tensor (`hp.client_lr`), every
    other kind as its plain Python value, the same for every run of a program (`HParams`).

    Example:
        ```python
        Param("beta", "float", 0.9, "server momentum", low=0, high=1, high_open=True)    # β ∈ [0, 1)
        Param("control", "choice", "II", "client control update", choices=("I", "II"))
        Param("data_seed", "int", None, "seed of the data (null: the trial's seed)", low=0, nullable=True)
        ```
    """

    name: str
    """The name a recipe sets it by (`algorithms.fedavg.client_lr`) and `hp` holds it under."""
    kind: str
    """One of `KINDS`: "float", "int", "bool", "choice", "str" (any text, e.g. a path), or "floats"/"ints", a
    non-empty list of floats/integers (a per-stage schedule, a set of class labels), each element in the range."""
    default: Any
    """The value a recipe that does not set it gets (None only where `nullable`)."""
    help: str
    """What it is, in one line (shown by `fedbench list` and on the reference pages)."""
    low: float | None = None
    """The lower bound of a number's range, inclusive unless `low_open` (None: unbounded)."""
    high: float | None = None
    """The upper bound, inclusive unless `high_open` (None: unbounded)."""
    low_open: bool = False
    """Whether `low` itself is refused."""
    high_open: bool = False
    """Whether `high` itself is refused."""
    log: bool = False
    """Whether to tune it on a log scale."""
    choices: tuple[Any, ...] = ()
    """The values a "choice" may take."""
    nullable: bool = False
    """Whether None is a valid value (e.g. "derive from the trial seed")."""
    infinite: bool = False
    """Whether +inf is a valid value of a float (e.g. "no ball")."""
    labels: tuple[tuple[str, str], ...] = ()
    """Display names of a choice's values as the papers write them, (value, name) pairs: how a report names a
    configuration that differs in this choice (Per-FedAvg's variant hf: "Per-FedAvg (HF)")."""

    def __post_init__(self) -> None:
        """A declaration that could not check a value is refused where it is written (a plugin's misspelled kind
        was otherwise checked as a float, silently)."""
        def refuse(what: str) -> None:
            raise ValueError(f"Param {self.name!r}: {what}")
        if self.kind not in KINDS:
            near = difflib.get_close_matches(str(self.kind), KINDS, n=1)
            refuse(f"kind {self.kind!r} is not one of {', '.join(KINDS)}"
                   + (f" (did you mean {near[0]!r}?)" if near else ""))
        if self.kind == "choice" and not self.choices:
            refuse("a choice needs its choices (choices=(...))")
        if self.default is not None:
            try:
                self.check(self.default)
            except ValueError as err:
                refuse(f"the default {self.default!r} fails the declaration's own check: {err}")

    def label_of(self, value: Any) -> str | None:
        """The display name of a choice's value (None: it has none)."""
        return dict(self.labels).get(value)

    def describe_range(self) -> str:
        """The valid values in words, as messages and tables show them: `[0, 1)`, `I | II`, `true | false`."""
        if self.kind == "choice":
            return " | ".join(map(str, self.choices))
        if self.kind == "bool":
            return "true | false"
        if self.kind == "str":
            return "any string"
        if self.low is None and self.high is None:
            return "any"
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        closed_high = self.high is not None and not self.high_open
        return f"{'(' if self.low_open else '['}{lo}, {hi}{']' if closed_high else ')'}"

    def check(self, value: Any) -> Any:
        """Return the value coerced to this parameter's type, or raise ValueError saying what was expected. A float
        parameter may hold a value per round (`PerRound`), its values in the range."""
        if value is None and self.nullable:
            return None
        expected = f"{self.kind} in {self.describe_range()}"
        if isinstance(value, PerRound):
            if self.kind != "float":
                raise ValueError(f"expected {expected}, found the schedule {value}: a schedule is for a float")
            return value.checked(self)
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"expected true or false, found {value!r}")
            return value
        if self.kind == "str":
            if not isinstance(value, str):
                raise ValueError(f"expected a string, found {value!r}")
            return value
        if self.kind == "choice":
            if value not in self.choices:
                raise ValueError(f"expected one of {self.describe_range()}, found {value!r}")
            return value
        if self.kind in LIST_KINDS:
            cast, items = (float, "numbers") if self.kind == "floats" else (int, "integers")
            if not isinstance(value, (list, tuple)) or not value:
                raise ValueError(f"expected a non-empty list of {items}, found {value!r}")
            return [self._number(v, cast, expected) for v in value]
        return self._number(value, int if self.kind == "int" else float, expected)

    def _number(self, value: Any, cast: type, expected: str) -> float | int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected {expected}, found {value!r}")
        if cast is int and not float(value).is_integer():
            raise ValueError(f"expected an integer in {self.describe_range()}, found {value!r}")
        number = cast(value)
        if cast is float and not math.isfinite(number) and not (self.infinite and number == math.inf):
            raise ValueError(f"expected a finite {expected}, found {value!r}")
        too_low = self.low is not None and (number <= self.low if self.low_open else number < self.low)
        too_high = self.high is not None and (number >= self.high if self.high_open else number > self.high)
        if too_low or too_high:
            raise ValueError(f"expected {expected}, found {value!r}")
        return number


class PerRound(ABC):
    """A value of a float parameter that changes from round to round (a schedule, `fedbench.schedules`), given where
    a float is; the engine hands an algorithm's round functions its value at each round."""

    @abstractmethod
    def checked(self, param: Param) -> PerRound:
        """This value, its numbers checked against the declaration `param` (ValueError saying what was expected)."""

    @abstractmethod
    def value(self, index: int, rounds: int) -> float:
        """The value at round `index` (from 0) of a run of `rounds` rounds."""

    @abstractmethod
    def as_config(self) -> dict[str, Any]:
        """As a recipe writes it (a mapping of numbers and names): what a run's configuration, and its hash, hold."""


class ParamError(ValueError):
    """A value that building a run refuses, raised with the name of the parameter that holds it (of `owner`: a
    problem, an algorithm or the federation), so that a recipe's validator can name the field it came from."""

    def __init__(self, name: str, message: str, owner: str = ""):
        self.name, self.message = name, message
        super().__init__(f"{owner}.{name}: {message}" if owner else f"{name}: {message}")


def resolve(declared: Sequence[Param], given: dict[str, Any], owner: str, per_round: bool = False) -> dict[str, Any]:
    """Defaults overlaid with `given`, every value checked; a schedule (`PerRound`) only with `per_round` (an
    algorithm's hyperparameters: the engine evaluates them at each round). Unknown names raise KeyError."""
    by_name = {p.name: p for p in declared}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        raise KeyError(f"{owner} has no parameter {unknown[0]!r} (known: {', '.join(sorted(by_name))})")
    values = {}
    for p in declared:
        try:
            if isinstance(given.get(p.name), PerRound) and not per_round:
                raise ValueError(f"found the schedule {given[p.name]}, expected one value: only an algorithm's "
                                 "hyperparameters follow schedules")
            values[p.name] = p.check(given[p.name]) if p.name in given else p.default
        except ValueError as err:
            raise ValueError(f"{owner}.{p.name}: {err}") from None
    return values


class HParams(Mapping):
    """Hyperparameters and derived values by name, read as attributes (`hp.client_lr`) or items. In a round's
    functions, floats are per-run `[R, 1, 1]` tensors; in `self.hp`, one run's Python values. The values live in
    the instance's own attribute dictionary, so that reading one costs a plain attribute lookup (a round reads
    several per local step). A name in `unset` has no one value here (a hyperparameter that follows a schedule, in
    `derive` and `self.hp`): reading it raises ParamError with its message, which says why."""

    __slots__ = ("__dict__", "_unset")

    def __init__(self, values: Mapping[str, Any], unset: Mapping[str, str] | None = None):
        self.__dict__.update(values)
        object.__setattr__(self, "_unset", dict(unset or {}))

    def __getattr__(self, name: str) -> Any:  # only for names it does not hold
        if name != "_unset" and name in self._unset:
            raise ParamError(name, self._unset[name])
        raise AttributeError(f"no hyperparameter or derived value {name!r} (known: {', '.join(self.__dict__)})")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("hyperparameters are read-only")

    def __getitem__(self, name: str) -> Any:
        try:
            return self.__dict__[name]
        except KeyError:
            if name in self._unset:
                raise ParamError(name, self._unset[name]) from None
            raise

    def __iter__(self) -> Iterator[str]:
        return iter(self.__dict__)

    def __len__(self) -> int:
        return len(self.__dict__)

    def __repr__(self) -> str:
        return f"HParams({self.__dict__!r})"

    def __reduce__(self):
        return HParams, (dict(self.__dict__), self._unset)
