"""The federation's axes, in one registry (`AXES`) that the recipe's parser, `fedbench list`, the reference pages and
the build-time checks (`fedbench.engine.checks`) read, so that a new axis is one module and one line here.

An axis is one class behind the `Axis` protocol: its recipe key under `federation:`, its parameters (`Param`s) and
recipe form (a mapping of them, or its first parameter's value alone where `scalar`), its `check` (refusals at its
field's path, a ParamError naming the field below `federation`), its random stream (`stream`, drawn by the run's
`RoundSampler` and kept in its checkpoint with the run's other streams) and its round hook (`mask`: which of the
round's slots upload). A run's `Federation` holds such axes in `Federation.axes`.

The axes that came before the protocol are fields of `Federation` with their own rules (`Federation.check`,
`fedbench.engine.checks.check_federation`) and random streams (`fedbench.engine.federation.RoundSampler`): they are
registered here by their recipe form (`Mapped`), so that the parser, the listing and the reference read one registry.
Not yet registered (the parser, `fedbench list` and the reference still name them apart): the links' chains
(`fedbench.axes.transforms`), privacy accounting (`fedbench.axes.privacy`, a top-level section) and compiled steps
(`fedbench.engine.compiling`, a top-level field).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from fedbench.axes.client_dropout import ClientDropout
from fedbench.axes.participation import LocalSteps, Participation
from fedbench.axes.robust import Adversaries
from fedbench.axes.server_optimizers import EXAMPLE, ServerOptimizer
from fedbench.hparams import Param
from fedbench.problems.base import Layout


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


@dataclass(frozen=True)
class Mapped:
    """An axis that is a field of `Federation` of its own, registered by its recipe form: `made` from a mapping of
    its `params`, e.g. `example`; `what` it is, as `fedbench list` says."""

    key: str
    made: Any
    example: str
    what: str = "a mapping"
    scalar: bool = False

    @property
    def held(self) -> bool:
        return False


@dataclass(frozen=True)
class Held:
    """An axis held in `Federation.axes` (an `Axis`): registered by its class alone."""

    made: Any

    key = property(lambda self: self.made.key)
    example = property(lambda self: self.made.example)
    scalar = property(lambda self: self.made.scalar)
    what = property(lambda self: f"{self.made.params[0].name} or a mapping" if self.made.scalar else "a mapping")

    @property
    def held(self) -> bool:
        return True


AXES: dict[str, Mapped | Held] = {axis.key: axis for axis in (
    Mapped("adversaries", Adversaries, "{fraction: 0.2, attack: sign_flip}"),
    Mapped("participation", Participation, "{model: bernoulli, p: 0.3}"),
    Mapped("local_steps", LocalSteps, "{distribution: uniform, low: 1, high: 10}",
           "uneven local work, a mapping instead of E"),
    Mapped("server_optimizer", ServerOptimizer, EXAMPLE),
    Held(ClientDropout),
)}
"""The federation's axes by recipe key, in the order `fedbench list` shows them."""


def held_axes(values: dict[str, Any]) -> tuple[dict[str, Any], tuple[Axis, ...]]:
    """A federation's values as a recipe gives them, split into `Federation`'s own fields and the axes it holds in
    `Federation.axes` (`Held`)."""
    axes = tuple(values[key] for key, axis in AXES.items() if axis.held and key in values)
    return {key: value for key, value in values.items() if key not in AXES or not AXES[key].held}, axes
