"""What the runs of a program know of their current round (`Round`, the `rnd` of every round function), and the
error it raises where the engine's schedule does not define what an algorithm asks.

Randomness inside a round goes through the round: `rnd.draw(lambda gen: torch.rand(3, generator=gen))` draws on
each run's own stream of the algorithm (`Algorithm.random_stream`) and stacks the runs' draws on axis 0. What a
schedule does not define raises (`ScheduleError`): an iteration-wise program's runs are at different rounds, so its
inner steps have no `rnd.index`, `rnd.iteration` or `rnd.step` (only `rnd.is_last_step`, False there), and draw
nothing; a round of uneven local work (`fedbench.axes.participation`) has no one length, last step or iteration count.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor


class ScheduleError(RuntimeError):
    """An algorithm asked its round for what the engine's schedule does not define there."""


class Round:
    """What the runs of a program know of their current round, the `rnd` of every round function. `clients` `[R, S]`
    is always defined; `index` (r, from 0), `iteration` (local iterations before this round), `local_steps` (E, or
    this round's drawn length), `step` (the local step, from 0), `is_last_step` and `client_steps` where the
    schedule defines them, and raise `ScheduleError` where it does not; `draw` where the runs' streams are bound. Where
    each client takes its own number of local steps (uneven local work, `fedbench.axes.participation`), the round has no
    one length: `local_steps`, `iteration` and `is_last_step` are not defined, and `client_steps` holds each client's.

    Example:
        Fast-FedDA's local step weighs its gradient by the global iteration t = rE + j and, as the paper's
        Algorithm 1 (Bao et al., ICML 2022), takes no prox after a round's last step (j = E − 1):

        ```python
        def client_step(self, local, batches, rnd, hp):
            t = rnd.iteration + rnd.step
            g = local["g"] + self._weighted(t, batches.D.grad(local["u"]), hp)
            if not rnd.is_last_step:
                ...
        ```
    """

    __slots__ = ("clients", "_index", "_iteration", "_local_steps", "_step", "_streams", "_where", "_last",
                 "_client_steps")
    clients: Tensor
    """The clients of the round, `[R, S]` (indices into the problem's clients; every client, `[R, N]`, where the
    algorithm's `participation` is "all")."""

    def __init__(self, clients: Tensor, index: int | None = None, local_steps: int | None = None,
                 iteration: int | None = None, step: int | None = None,
                 streams: tuple[torch.Generator, ...] | None = None, where: str = "", last: bool | None = None,
                 client_steps: Tensor | None = None):
        self.clients, self._index, self._local_steps, self._iteration = clients, index, local_steps, iteration
        self._step, self._streams, self._where, self._client_steps = step, streams, where, client_steps
        # whether `step` ends the round: from the length where it is defined, else given (an iteration-wise end); no
        # one step ends it where each client has its own count
        self._last = None if client_steps is not None else last if last is not None else (
            step is not None and local_steps is not None and step == local_steps - 1)

    def _defined(self, name: str, value):
        if value is None:
            raise ScheduleError(f"rnd.{name} is not defined {self._where or 'here'}")
        return value

    @property
    def index(self) -> int:
        """The round r, from 0, where the runs of a program share it (not in an iteration-wise program's inner
        steps)."""
        return self._defined("index", self._index)

    @property
    def iteration(self) -> int:
        """Local iterations each client of the runs has taken before this round."""
        return self._defined("iteration", self._iteration)

    @property
    def local_steps(self) -> int:
        """This round's local steps: the federation's E, or the length `round_length` drew."""
        return self._defined("local_steps", self._local_steps)

    @property
    def step(self) -> int:
        """The local step being taken in `client_step`, from 0 to `local_steps − 1`."""
        return self._defined("step", self._step)

    @property
    def is_last_step(self) -> bool:
        """Whether this local step ends the round (False in an iteration-wise program's inner steps)."""
        return self._defined("is_last_step", self._last)

    @property
    def client_steps(self) -> Tensor | int:
        """Each client's local steps this round: `[R, S, 1]` in the state's dtype (it broadcasts against the local
        state `[R, S, d]`) where the federation gives its participants uneven local work, else `local_steps`, the same
        for every client.

        Example:
            SCAFFOLD's control variate divides the client's progress by its own K steps:

            ```python
            c_new = c_i - c + (x - y) / (rnd.client_steps * hp.client_lr)
            ```
        """
        return self.local_steps if self._client_steps is None else self._client_steps

    def at(self, step: int) -> Round:
        """This round at local step `step`."""
        return Round(self.clients, self._index, self._local_steps, self._iteration, step, self._streams, self._where,
                     client_steps=self._client_steps)

    def draw(self, sample: Callable[[torch.Generator], Tensor]) -> Tensor:
        """`sample(gen)` on each run's own stream of the algorithm (`random_stream`), stacked on a leading run axis
        `[R, ...]`, so that every run draws exactly what it draws alone. The generators live on the CPU: move the
        draw to the state's device (`.to(x.device)`).

        Example:
            A uniform [0, 1) value per run, broadcast against `[R, S, d]` state:

            ```python
            u = rnd.draw(lambda gen: torch.rand((), generator=gen)).to(x.device).view(-1, 1, 1)  # [R, 1, 1]
            ```
        """
        if self._streams is None:
            raise ScheduleError(f"rnd.draw is not allowed {self._where or 'here'}")
        if len(self._streams) == 1:
            return sample(self._streams[0]).unsqueeze(0)
        return torch.stack([sample(gen) for gen in self._streams])
