"""The run's axes, in one registry (`AXES`) that the recipe's parser, the tuning space, `fedbench list`, the reference
pages and the build-time checks (`fedbench.engine.checks`) iterate: none of them names an axis of its own.

Registered, in the order `fedbench list` shows them and the parser reads them:
- under `federation:`, the links' chains `uplink` and `downlink` (`Chain`: lists of `fedbench.axes.transforms` steps);
  the adversaries, the participation model, uneven local steps and the server optimizer (`Mapped`: fields of
  `Federation` made from a mapping); client dropout (`Held`: a class behind the `Axis` protocol, held in
  `Federation.axes`);
- at the recipe's top level, privacy accounting (`privacy:`, `fedbench.axes.privacy`) and compiled steps (`compile:`,
  `fedbench.engine.compiling`) (`Section`: its recipe path is its key).

Each entry says its recipe path (`path`), its parameters (`params`), its recipe form (`what`, `example`), what
declares it (`declared`, which the reference pages document) and its build-time rules (`check`). Every refusal of an
axis under `federation:` is raised by its `check`, at its field's path below `federation` (`check_federation` calls
each in turn, then `Federation.check` its own fields); a top-level axis's by the recipe's validator
(`Recipe.check_sections`), which alone knows the recipe's value.

A new axis is one module, one line here, its test and its doc section: a class behind `Axis` (its `Param`s, recipe
form, `check`, random `stream` and round hook `lost`, as `fedbench.axes.client_dropout.ClientDropout`) registered as
`Held(TheClass)`. The parser then reads it as a mapping (or its first parameter's value alone where `scalar`), the
tuning space searches its parameters as `federation.KEY.NAME`, `fedbench list` and the reference show it (the
reference's section: its module's docstring), `check_federation` applies its `check` and the run draws its `stream`
and applies its `lost` each round.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Protocol

import torch
from torch import Tensor

from fedbench.axes import participation, privacy, robust, server_optimizers, transforms
from fedbench.axes.client_dropout import ClientDropout
from fedbench.axes.participation import LocalSteps, Participation
from fedbench.axes.robust import Adversaries
from fedbench.axes.server_optimizers import EXAMPLE, ServerOptimizer
from fedbench.hparams import Param, ParamError
from fedbench.problems.base import Layout

Rule = Callable[[Any, Any, Mapping[str, Any], Layout], None]  # (federation, algorithm, hp, layout): refuses or not


class Axis(Protocol):
    """One axis of the federation held in `Federation.axes` (`ClientDropout` is one)."""

    key: ClassVar[str]  # its recipe key: `federation.KEY`
    example: ClassVar[str]  # its recipe form, as `fedbench list` shows it
    params: ClassVar[tuple[Param, ...]]  # its fields
    scalar: ClassVar[bool]  # whether a recipe may give its first parameter's value alone
    stream: ClassVar[str | None]  # its random stream's name, where it draws

    def check(self, federation: Any, algorithm: Any, layout: Layout) -> None:
        """Refuse (ParamError at its field below `federation`) a federation or algorithm it cannot act on."""

    def config(self) -> Any:
        """As a run's configuration records it; None where it acts as no axis (left out of the record and hash)."""

    def lost(self, present: Tensor | None, slots: int, generator: torch.Generator | None) -> Tensor | None:
        """The round's participants whose uploads go missing `[S]` bool (`fedbench.axes.slots.Slots.lose`: they train
        and keep their state, the server hears them not), from those that take part (`present`, None: every slot) of the
        `slots`; None: none."""


def _class_of(algorithm: Any) -> Any:
    return algorithm if isinstance(algorithm, type) else type(algorithm)


@dataclass(frozen=True)
class Mapped:
    """An axis that is a field of `Federation` of its own, `made` from a mapping of its `params`, e.g. `example`;
    `what` it is, as `fedbench list` says; its `rule` (`Rule`, of the algorithm's class) refuses what cannot run.
    Where `plain`, the field also takes a value of `Federation`'s own parameter of its name in place of the mapping
    (`local_steps: 10`); where `schedules`, a field may follow a schedule (the server optimizer's lr); `reads`, the
    fields a mapping as a recipe writes it reads (a search sets only those; None: all of them)."""

    key: str
    made: Any
    example: str
    what: str = "a mapping"
    scalar: bool = False
    rule: Rule | None = None
    plain: bool = False
    schedules: bool = False
    reads: Callable[[dict], tuple[str, ...]] | None = None

    held: ClassVar[bool] = False
    path = property(lambda self: f"federation.{self.key}")
    params = property(lambda self: self.made.params)
    declared = property(lambda self: self.made)

    def check(self, federation: Any, algorithm: Any, hp: Mapping[str, Any], layout: Layout) -> None:
        if self.rule is not None:
            self.rule(federation, _class_of(algorithm), hp, layout)


@dataclass(frozen=True)
class Held:
    """An axis held in `Federation.axes` (an `Axis`): registered by its class alone; its `check` is the instance's
    that the federation holds (none: the axis is absent)."""

    made: Any

    held: ClassVar[bool] = True
    plain: ClassVar[bool] = False
    schedules: ClassVar[bool] = False
    reads: ClassVar[None] = None
    key = property(lambda self: self.made.key)
    path = property(lambda self: f"federation.{self.made.key}")
    params = property(lambda self: self.made.params)
    declared = property(lambda self: self.made)
    example = property(lambda self: self.made.example)
    scalar = property(lambda self: self.made.scalar)
    what = property(lambda self: f"{self.made.params[0].name} or a mapping" if self.made.scalar else "a mapping")

    def check(self, federation: Any, algorithm: Any, hp: Mapping[str, Any], layout: Layout) -> None:
        for axis in federation.axes:
            if axis.key == self.key:
                axis.check(federation, algorithm, layout)


@dataclass(frozen=True)
class Chain:
    """A link's chain of transforms (`federation.uplink`, `federation.downlink`): a list of steps of
    `fedbench.axes.transforms.TRANSFORMS`, held by `Federation` as steps; its rule `transforms.check_chain` (the order
    of its steps, with the aggregation)."""

    key: str
    what: str
    example: str

    held: ClassVar[bool] = False
    plain: ClassVar[bool] = False
    params: ClassVar[tuple[Param, ...]] = ()  # each step's are its transform's (`fedbench.axes.transforms.TRANSFORMS`)
    declared: ClassVar[Any] = transforms.TRANSFORMS
    path = property(lambda self: f"federation.{self.key}")

    def check(self, federation: Any, algorithm: Any, hp: Mapping[str, Any], layout: Layout) -> None:
        transforms.check_chain(getattr(federation, self.key), self.key, federation.aggregation)


@dataclass(frozen=True)
class Section:
    """An axis set at the recipe's top level (`privacy:`, `compile:`), not in `federation:`: its `params` (a mapping
    of them, or the first's value alone where `scalar`), written as `example`; `what` it is in a line, and in full
    (`detail`), as `fedbench list` says; `declared` by the module `module`; its `rule` refuses the recipe's value of it
    (None where absent) with a trial's built federation, a ParamError at the field's path in the recipe
    (`federation.uplink.1.gaussian`, `compile`)."""

    key: str
    params: tuple[Param, ...]
    example: str
    what: str
    module: str
    rule: Callable[[Any, Any], None]
    detail: str = ""
    scalar: bool = False

    held: ClassVar[bool] = False
    path = property(lambda self: self.key)
    declared = property(lambda self: self.module)

    def check(self, value: Any, federation: Any) -> None:
        self.rule(value, federation)


# `compile:`'s modes, auto first (the default): declared here, below the engine's `fedbench.engine.compiling`, which
# reads them
COMPILE_MODES = ("auto", "on", "off")


def _check_compile(mode: Any, federation: Any) -> None:
    if mode not in COMPILE_MODES:
        raise ParamError("compile", f"found {mode!r}, expected one of {', '.join(COMPILE_MODES)}")


def _participation_reads(spec: dict) -> tuple[str, ...]:
    model = spec.get("model", "uniform")
    return participation.READS.get(model, ()) if isinstance(model, str) else ()  # a grid over models: no one field


def _check_privacy(section: Any, federation: Any) -> None:
    privacy.check_accounted(None if section is None else section.delta, federation.uplink)


FederationAxis = Mapped | Held | Chain
AXES: dict[str, FederationAxis | Section] = {axis.key: axis for axis in (
    Chain("uplink", "a list of transforms of each client's uploads", "[{top_k: 0.05}, {error_feedback: ef21}]"),
    Chain("downlink", "a list of transforms of the server's broadcast", "[{qsgd: 8}]"),
    Mapped("adversaries", Adversaries, "{fraction: 0.2, attack: sign_flip}", rule=robust.check_adversaries),
    Mapped("participation", Participation, "{model: bernoulli, p: 0.3}", rule=participation.check_participation,
           reads=_participation_reads),
    Mapped("local_steps", LocalSteps, "{distribution: uniform, low: 1, high: 10}",
           "uneven local work, a mapping instead of E", rule=participation.check_local_steps, plain=True,
           reads=lambda spec: ("low", "high") if spec.get("distribution") is not None else ()),
    Mapped("server_optimizer", ServerOptimizer, EXAMPLE, rule=server_optimizers.check_server_optimizer,
           schedules=True, reads=ServerOptimizer.reads_of),
    Held(ClientDropout),
    Section("privacy", privacy.PARAMS, "{delta: δ, accountant: pld | rdp}",
            "ε at δ of the uplink's gaussian noise, in every row", "fedbench.axes.privacy", _check_privacy,
            "required with a gaussian step: each row's epsilon is ε at δ, user-level (one client's data replaced), S "
            "of N clients drawn without replacement a round, by dp-accounting's PLD accountant on the dominating pair "
            "(tight; the default) or its RDP bound (accountant: rdp, looser)"),
    Section("compile", (Param("compile", "choice", "auto", "local steps compiled with torch.compile: auto (where "
                              "bench/compile.py measured that they win), on or off", choices=COMPILE_MODES),),
            "auto | on | off", "whether a run's local steps are compiled", "fedbench.engine.compiling", _check_compile,
            "whether a run's local steps are compiled with torch.compile (their results equal eager's up to "
            "rounding): auto where bench/compile.py measured that they win, on, or off (the eager engine bit for "
            "bit)", scalar=True),
)}
"""The run's axes by recipe key, in the order `fedbench list` shows them."""


def in_federation() -> list[FederationAxis]:
    """The axes set under `federation:`, in the registry's order."""
    return [axis for axis in AXES.values() if not isinstance(axis, Section)]


def sections() -> list[Section]:
    """The axes set at the recipe's top level (`privacy:`, `compile:`)."""
    return [axis for axis in AXES.values() if isinstance(axis, Section)]


def held_axes(values: dict[str, Any]) -> tuple[dict[str, Any], tuple[Axis, ...]]:
    """A federation's values as a recipe gives them, split into `Federation`'s own fields and the axes it holds in
    `Federation.axes` (`Held`)."""
    axes = tuple(values[key] for key, axis in AXES.items() if axis.held and key in values)
    return {key: value for key, value in values.items() if key not in AXES or not AXES[key].held}, axes
