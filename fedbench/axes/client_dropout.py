"""Client dropout (`federation.client_dropout: p`): each client sampled in a round trains, then fails to upload with
probability p, independently of the others and of the rounds before; its upload is missing from the aggregate.

A dropped client is a participant whose upload is lost (`fedbench.axes.slots.Slots.lose`): it downloads the server's
state, takes its local steps and keeps its per-client state as its algorithm defines it (SCAFFOLD's control variate c_i,
Ditto's personal model), but the server hears nothing from it: the server's mean is over the clients that uploaded
(weights renormalised over them), a round where none uploads leaves the server state unchanged, a dropped client's
error-feedback vector stays as it was (its message never arrived), and its download is counted but not its upload. The
coins are drawn on the run's own stream "client-dropout" after the round's participants, so that every other draw is the
same with and without dropout; with p = 0 nothing is drawn and the run is the run without the axis. What cannot take a
varying number of uploads is refused, as for a varying participation model: a robust aggregation rule, an algorithm
whose server uses each client's uploads or that takes every client every round, and DP-FedAvg's noise (accounted for S
of N clients drawn uniformly).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedbench.axes.privacy import gaussian_step
from fedbench.axes.robust import RULES
from fedbench.hparams import Param, ParamError


@dataclass(frozen=True)
class ClientDropout:
    """Each sampled client's upload lost with probability `p` (an `fedbench.axes.registry.Axis`)."""

    p: float = 0.0

    key: ClassVar[str] = "client_dropout"
    example: ClassVar[str] = "0.1"
    scalar: ClassVar[bool] = True
    stream: ClassVar[str | None] = "client-dropout"
    params: ClassVar[tuple[Param, ...]] = (
        Param("p", "float", 0.0, "the probability that a sampled client, having trained, fails to upload", low=0,
              high=1),)

    def check(self, federation: Any, algorithm: Any, layout: Any) -> None:
        try:
            self.params[0].check(self.p)
        except ValueError as err:
            raise ParamError(self.key, str(err)) from None
        if self.p == 0:
            return
        why = None
        if federation.aggregation in RULES:
            why = f"with aggregation {federation.aggregation} (a rule of S uploads)"
        elif algorithm.participation == "all":
            why = f"for {algorithm.name}, which takes every client every round"
        elif not algorithm.uploads_averaged:
            why = f"for {algorithm.name}, whose server uses each client's uploads (not only their mean)"
        elif gaussian_step(federation.uplink) is not None:
            why = "with DP-FedAvg's noise (accounted for S of N drawn uniformly)"
        if why:
            raise ParamError(self.key, f"found {self.p} {why}; expected 0")

    def __str__(self) -> str:  # as a recipe writes it (a refusal lists the values so)
        return str(self.p)

    def config(self) -> float | None:
        return self.p or None

    def lost(self, present: Tensor | None, slots: int, generator: torch.Generator | None) -> Tensor | None:
        """The slots `[S]` bool whose uploads go missing this round, among those that take part (`present`, None:
        every slot); None where p = 0 (nothing drawn)."""
        if self.p == 0:
            return None
        assert generator is not None  # the run's "client-dropout" stream (`stream`)
        lost = torch.rand(slots, generator=generator, dtype=torch.float64) < self.p  # p = 1: all
        return lost if present is None else present & lost
