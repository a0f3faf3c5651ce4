"""Schedules: a float hyperparameter that takes one value per round, for any algorithm and any of its float
hyperparameters: in a recipe `client_lr: {schedule: cosine, init: 0.1, final: 0.001}`, in Python
`FedMiD(problem, client_lr=Cosine(init=0.1, final=0.001))`.

With r the round (from 0), T the run's rounds and W the warm-up's rounds (`warmup`, default 0), a schedule's value
at round r is the linear warm-up

    warmup_init + (init − warmup_init)·r/W                                      for r < W

(Goyal et al., "Accurate, Large Minibatch SGD", 2017, §2.2: from `warmup_init`, default 0, at round 0 to `init` at
round W), then its kind's decay over the rounds after it, at k = r − W of H = max(T − W, 1):

    constant       init
    step           init·factor^⌊k/every⌋
    exponential    init·rate^k
    inverse_sqrt   init/√(1 + k/scale)
    cosine         final + (init − final)·(1 + cos(πk/H))/2     (Loshchilov & Hutter, ICLR 2017, eq. (5), one cycle)

The cosine's `final` is reached at round T, one round after the last (as PyTorch's CosineAnnealingLR with
T_max = T rounds): every round takes a value above it.

The engine (`fedbench.engine.runs`) evaluates each run's schedules at the start of each of its rounds and hands the
round's functions their values as it hands a float's, `[R, 1, 1]` per run, so that algorithms need no change and runs
with different schedules share one program. A value is computed on the host in double precision, from the run's own
schedule and round counter (both on the host: nothing is read back from the device), and handed in the problem's dtype;
so a run's values are the same bits alone and in a batch (on the CPU a batched cos or pow takes SIMD kernels whose last
bit may differ from the scalar kernel of one value). An algorithm that derives values from a scheduled hyperparameter
(`Algorithm.derive`) or reads it outside its rounds (`self.hp`) is refused: those hold one value for the whole run. An
algorithm whose own step-size rule uses the round index (FedDA's elapsed time η·r·K) computes it with the round's value.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from fedbench.hparams import Param, PerRound


class BadField(ValueError):
    """A schedule's field that cannot hold the value given: `field` names it, `message` says what was expected."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


FIELDS = {p.name: p for p in (
    Param("init", "float", None, "the value at round 0 (with a warm-up: at its end, round W)"),
    Param("final", "float", None, "the value the cosine reaches at round T (every round takes a value above it)"),
    Param("every", "int", None, "rounds between two decays", low=1),
    Param("factor", "float", None, "what each decay multiplies the value by", low=0, low_open=True),
    Param("rate", "float", None, "what each round multiplies the value by", low=0, low_open=True),
    Param("scale", "float", 1.0, "rounds over which the value falls by √2", low=0, low_open=True),
    Param("warmup", "int", 0, "rounds of linear warm-up before the decay (W)", low=0),
    Param("warmup_init", "float", 0.0, "the warm-up's value at round 0 (then linear up to init)"),
)}
"""Each field of a schedule by name, declared once: what `check_field`, a recipe's refusals, `fedbench list` and the
reference read. The fields that are values of the hyperparameter (`VALUES`) take its range when the schedule is
given to one."""
VALUES = ("init", "final", "warmup_init")
"""The fields that are values of the hyperparameter the schedule is given to."""


@dataclass(frozen=True, kw_only=True)
class Schedule(PerRound):
    """A value per round: the warm-up, then the kind's `decay` (the module's docstring gives each formula). Frozen and
    made of numbers, so that a configuration holding one hashes, pickles and compares as one holding a float."""

    init: float
    warmup: int = 0
    warmup_init: float = 0.0
    kind: ClassVar[str]
    formula: ClassVar[str]  # the decay as the reference writes it

    def __post_init__(self) -> None:
        """Each field checked and coerced (`check_field`): a YAML integer is a float where the field is one."""
        for field in dataclasses.fields(self):
            try:
                object.__setattr__(self, field.name, self.check_field(field.name, getattr(self, field.name)))
            except ValueError as err:
                raise BadField(field.name, str(err)) from None

    @staticmethod
    def field_param(name: str, param: Param | None = None) -> Param:
        """The declaration that the values of field `name` obey: its own (`FIELDS`), or for a value of the
        hyperparameter (`VALUES`) given to `param`, a finite number in `param`'s range (a warm-up may start at its
        lower end: a step size from 0)."""
        if param is None or name not in VALUES:
            return FIELDS[name]
        return dataclasses.replace(param, name=name, default=None, nullable=False, infinite=False,
                                   low_open=param.low_open and name != "warmup_init")

    @classmethod
    def check_field(cls, name: str, value: Any, param: Param | None = None) -> Any:
        """`value` of the field `name` checked against `field_param` (ValueError saying what was expected) and
        coerced (a YAML integer is a float where the field is one)."""
        return cls.field_param(name, param).check(value)

    def checked(self, param: Param) -> Schedule:
        """This schedule, its values of the hyperparameter (`VALUES`) checked against `param`'s declaration (BadField
        naming the field); what `Param.check` does with a schedule given to a float."""
        for name in VALUES:
            if hasattr(self, name):
                try:
                    self.check_field(name, getattr(self, name), param)
                except ValueError as err:
                    raise BadField(name, str(err)) from None
        return self

    def value(self, index: int, rounds: int) -> float:
        """The value at round `index` (from 0) of a run of `rounds` rounds: the warm-up's, then `decay`'s."""
        if index < self.warmup:
            return self.warmup_init + (self.init - self.warmup_init) * index / self.warmup
        return self.decay(index - self.warmup, max(rounds - self.warmup, 1))

    def decay(self, k: int, horizon: int) -> float:
        """The value k rounds after the warm-up, of `horizon` rounds after it."""
        raise NotImplementedError

    @classmethod
    def own_fields(cls) -> list[str]:
        """The fields of this kind, in the order a recipe writes them: init, the kind's own, the warm-up's."""
        shared = [f.name for f in dataclasses.fields(Schedule)]
        return ["init"] + [f.name for f in dataclasses.fields(cls) if f.name not in shared] + shared[1:]

    @classmethod
    def required(cls) -> list[str]:
        """The fields this kind needs (those without a default)."""
        return [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]

    def as_config(self) -> dict[str, Any]:
        """As a recipe writes it, fields at their defaults left out: `{schedule: cosine, init: 0.1, final: 0.001}`."""
        given = {name: getattr(self, name) for name in self.own_fields()}
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return {"schedule": self.kind, **{k: v for k, v in given.items() if v != defaults[k]}}

    def __str__(self) -> str:
        """`cosine(init=0.1, final=0.001)`: how a run's parameters show it (MLflow, reports, titles)."""
        fields = list(self.as_config().items())[1:]
        return f"{self.kind}({', '.join(f'{k}={v!r}' for k, v in fields)})"


@dataclass(frozen=True, kw_only=True)
class Constant(Schedule):
    """`init` at every round (after the warm-up, if any): a float with a warm-up, or the float itself."""
    kind = "constant"
    formula = "init"

    def decay(self, k: int, horizon: int) -> float:
        return self.init


@dataclass(frozen=True, kw_only=True)
class Step(Schedule):
    """init·factor^⌊k/every⌋: multiplied by `factor` every `every` rounds (step decay)."""
    every: int
    factor: float
    kind = "step"
    formula = "init·factor^⌊k/every⌋"

    def decay(self, k: int, horizon: int) -> float:
        return self.init * self.factor ** (k // self.every)


@dataclass(frozen=True, kw_only=True)
class Exponential(Schedule):
    """init·rate^k: multiplied by `rate` every round (from init to final over H rounds: rate = (final/init)^(1/H))."""
    rate: float
    kind = "exponential"
    formula = "init·rate^k"

    def decay(self, k: int, horizon: int) -> float:
        return self.init * self.rate**k


@dataclass(frozen=True, kw_only=True)
class InverseSqrt(Schedule):
    """init/√(1 + k/scale): SGD's 1/√t rate, `scale` rounds to fall by √2 (1: init/√(k + 1))."""
    scale: float = 1.0
    kind = "inverse_sqrt"
    formula = "init/√(1 + k/scale)"

    def decay(self, k: int, horizon: int) -> float:
        return self.init / math.sqrt(1 + k / self.scale)


@dataclass(frozen=True, kw_only=True)
class Cosine(Schedule):
    """final + (init − final)·(1 + cos(πk/H))/2: half a cosine from init down to final, reached at round T."""
    final: float
    kind = "cosine"
    formula = "final + (init − final)·(1 + cos(πk/H))/2"

    def decay(self, k: int, horizon: int) -> float:
        return self.final + (self.init - self.final) * (1 + math.cos(math.pi * k / horizon)) / 2


KINDS: dict[str, type[Schedule]] = {cls.kind: cls for cls in (Constant, Step, Exponential, InverseSqrt, Cosine)}
"""Each kind of schedule by the name a recipe gives it (`schedule: cosine`)."""


def kind_of(name: Any) -> type[Schedule]:
    """The schedule kind `name`, or ValueError naming the closest one."""
    if isinstance(name, str) and name in KINDS:
        return KINDS[name]
    near = difflib.get_close_matches(str(name), KINDS, n=1)
    raise ValueError(f"found {name!r}, expected a schedule: one of {', '.join(KINDS)}"
                     + (f" (did you mean {near[0]!r}?)" if near else ""))


def unknown_fields(cls: type[Schedule], given: Mapping[str, Any]) -> list[str]:
    """The names in `given` that are no field of the kind `cls`."""
    return [name for name in given if name not in cls.own_fields()]


def make(kind: str, **fields: Any) -> Schedule:
    """The schedule of kind `kind` with these fields (ValueError: an unknown kind; BadField: a field unknown, missing
    or out of its range)."""
    cls = kind_of(kind)
    for name in unknown_fields(cls, fields):
        near = difflib.get_close_matches(name, cls.own_fields(), n=1)
        raise BadField(name, f"not a field of a {kind} schedule (fields: {', '.join(cls.own_fields())})"
                       + (f"; did you mean {near[0]!r}?" if near else ""))
    missing = [name for name in cls.required() if name not in fields]
    if missing:
        raise BadField(missing[0], f"a {kind} schedule needs it: {FIELDS[missing[0]].help}")
    return cls(**fields)
