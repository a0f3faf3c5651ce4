"""A round's local steps under uneven local work on the CPU, each step run by the slots still taking it alone
(`RoundProgram._local_steps` calls it where `narrows_steps`): the finished slots' state is neither computed on nor
copied at every step, which a step over every slot followed by `Slots.stepped` does."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from fedbench.algorithms.base import HParams, Round
from fedbench.axes.slots import along, has_client_rows
from fedbench.problems.base import Problem


def no_noise(rows: Tensor) -> None:
    """The minibatch noise of a problem whose minibatches draw none."""
    return None


class NarrowedSteps:
    """`RoundProgram`'s narrowed local steps (a mixin: they use its `local_step`, `_layout`, `problem`,
    `minibatches` and `device`)."""

    local_step: Callable[..., dict[str, Tensor]]
    _layout: Callable[[dict[str, Tensor]], dict[str, Tensor]]
    problem: Problem
    minibatches: Any
    device: torch.device

    def _uneven_steps(self, local: dict[str, Tensor], rows: dict[str, Tensor], counts: Tensor, noise,
                      hp: HParams, round_of: Callable[[Tensor], Round]) -> dict[str, Tensor]:
        """The local steps of a round of uneven local work (`counts` `[R, S]`, each slot's own number of steps), each
        run by the slots (client columns) that some run still takes it in, alone: the state of the others is neither
        computed on nor copied (a step over every slot, the finished ones' rows then put back by `Slots.stepped`:
        7.8% of a profiled FedAvg round of the EMNIST CNN on FEMNIST's writers, where most slots finish long before
        the round's longest). The slots taking a step only shrink from step to step: a slot's rows are
        written back into the whole state once, as it leaves them. The same numbers as stepping every slot: each
        client's step reads its own rows and its own minibatch noise (drawn, as before, for every slot's rows) alone,
        and `round_of(slots)`, the round of those slots, gives their clients and counts."""
        count, sampled = counts.shape
        whole: dict[str, Tensor] | None = None  # every slot's state, its rows written as the slot leaves
        rowed = {key for key, value in local.items() if has_client_rows(value, counts)}
        slots = torch.arange(sampled, device=self.device)
        round_ = round_of(slots)
        for step, step_rows in enumerate(zip(*[v.unbind(0) for v in self._layout(rows).values()])):
            taking = counts[:, slots] > step  # [R, slots]
            staying = taking.any(0)
            if not bool(staying.all()):  # slots have finished: their rows leave the working state
                if whole is None:  # new tensors: `local` may hold the program's own state
                    whole = {key: torch.empty_like(local[key]) for key in rowed}
                for position in (~staying).nonzero().squeeze(1).tolist():  # a slot's rows copied as it leaves
                    for key in rowed:
                        whole[key][:, int(slots[position])].copy_(local[key][:, position])
                slots = slots[staying]
                local = {key: value[:, staying] if key in rowed else value for key, value in local.items()}
                round_, taking = round_of(slots), taking[:, staying]
            whole_rows = dict(zip(rows, step_rows))
            slots_rows = {name: self._slots_of(value, count, sampled, slots) for name, value in whole_rows.items()}
            stepped = self.local_step(local, slots_rows, count, len(slots),
                                      self._noise_of(noise, whole_rows, slots_rows, count, sampled, slots),
                                      round_.at(step), hp)
            local = stepped if bool(taking.all()) else {  # runs that have ended their steps in a slot keep its rows
                key: torch.where(along(taking, value), value, local[key]) if key in rowed else value
                for key, value in stepped.items()}
        if whole is None:
            return local
        for key in rowed:
            whole[key][:, slots] = local[key]
        return {key: whole[key] if key in rowed else value for key, value in local.items()}

    def _slots_of(self, rows: Tensor, count: int, sampled: int, slots: Tensor) -> Tensor:
        """A step's rows of every slot, as `_layout` lays them out (`[R, S, b]` or `[R·S, b]`), of `slots` alone."""
        if len(slots) == sampled:
            return rows
        if self.problem.oracles_take_runs:
            return rows[:, slots]
        return rows.view(count, sampled, -1)[:, slots].flatten(0, 1)

    def _noise_of(self, noise, whole_rows: dict[str, Tensor], slots_rows: dict[str, Tensor], count: int,
                  sampled: int, slots: Tensor):
        """The minibatch noise of the rows `slots_rows` of some slots (`_uneven_steps`): each row's entry as `noise`
        draws it for the rows of every slot, `whole_rows`, so that each run's stream draws what a step of every slot
        draws."""
        if noise is no_noise or len(slots) == sampled:
            return noise
        drawn = {}
        for mb in self.minibatches:  # in the order `step_oracles` draws them
            if mb.same_as is None:
                entries = noise(whole_rows[mb.name])  # [R·S·b, k], in the rows' order
                drawn[id(slots_rows[mb.name])] = entries.view(count, sampled, -1, entries.shape[-1])[:, slots].reshape(
                    -1, entries.shape[-1])
        return lambda rows: drawn[id(rows)]
