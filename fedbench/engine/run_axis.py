"""The run axis of a program (`fedbench.engine.runs`): how R runs' values lie along it and how rows of it are taken.
Float hyperparameters and derived values are `[R, 1, 1]` (`batch_hparams`, `per_run`; `[1, 1, 1]` where every run has
the same), state entries `[R, ...]` (the rows of some runs: `select_runs`, written back by `write_runs` and
`rows_replaced`), a round's draws stacked on the axis (`RoundDraws`, its slots a `fedbench.axes.slots.Slots`), and the
replay of a batch's computation run by run after it failed (`failing_alone`)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch import Tensor

from fedbench.algorithms.base import HParams
from fedbench.algorithms.maths import per_run
from fedbench.axes.slots import Slots
from fedbench.engine.federation import Draw
from fedbench.engine.planning import NotBatchable
from fedbench.engine.record import RunRecord


def batch_hparams(sims: list[RunRecord], dtype: torch.dtype, device) -> HParams:
    """The hyperparameters and derived values of these runs, as a round's functions receive them."""
    return HParams({key: per_run([sim.algorithm.hp[key] for sim in sims], dtype, device)
                    for key in sims[0].algorithm.hp})


def differs(value: Any) -> bool:
    """Whether a per-run value (`per_run`) differs between runs."""
    if isinstance(value, Tensor):
        return value.shape[0] > 1
    return dataclasses.is_dataclass(value) and any(differs(getattr(value, f.name))
                                                   for f in dataclasses.fields(value))


def rows_of(value: Any, runs: Tensor) -> Any:
    """The rows `runs` of a per-run value that differs between runs (`differs`)."""
    if isinstance(value, Tensor):
        return value.index_select(0, runs) if value.shape[0] > 1 else value
    return dataclasses.replace(value, **{f.name: rows_of(getattr(value, f.name), runs)
                                         for f in dataclasses.fields(value)})


def select_runs(state: dict[str, Tensor], group: list[int], runs: Tensor) -> dict[str, Tensor]:
    """The rows of the runs `group` (`runs` as a tensor) of each entry: a view for one run, else a copy. Writing
    through such a view (L2SGD+ updates its SAGA table in place) touches only the rows of a round that is ending,
    which the engine writes back or opens anew."""
    if len(group) == 1:
        return {k: v[group[0]: group[0] + 1] for k, v in state.items()}
    return {k: v.index_select(0, runs) for k, v in state.items()}


def write_runs(state: dict[str, Tensor], values: dict[str, Tensor], group: list[int], runs: Tensor) -> None:
    """The rows of the runs `group` of each entry of `state` set to `values` (a value that is the row itself, a view
    `select_runs` gave and the round left unchanged, stays)."""
    for key, value in values.items():
        if len(group) == 1:
            row = state[key][group[0]: group[0] + 1]
            if row.data_ptr() != value.data_ptr():
                row.copy_(value)
        else:
            state[key].index_copy_(0, runs, value)


def rows_replaced(held: Tensor, runs: Tensor, values: Tensor) -> Tensor:
    """`held` `[R, ...]` with the rows of `runs` replaced by `values`; where the round changed the entry's shape
    (FeDXL's score pools go from every sample's score to the last rounds' records), the other rows are zeros
    until their own chunk of the round writes them (a run that has left the batch keeps its state on its
    RunRecord)."""
    if held.shape[1:] != values.shape[1:]:
        held = values.new_zeros(len(held), *values.shape[1:])
    return held.index_copy(0, runs, values)


def failing_alone(units: list[int], alone: Callable[[int], None]) -> list[int]:
    """After a computation of the runs `units` together raised LinAlgError (an SVD of an iterate that overflowed):
    `alone(unit)` for each of them, from the same state on the same draws, so that only the runs failing alone fail;
    those are returned. Both schedules replay so; neither writes anything before all it computes has succeeded."""
    failed = []
    for unit in units:
        try:
            alone(unit)
        except torch.linalg.LinAlgError:
            failed.append(unit)
    return failed


def stacked(tensors: list[Tensor], dim: int = 0) -> Tensor:
    """The runs' tensors on a new run axis `dim` (a view for one run)."""
    return tensors[0].unsqueeze(dim) if len(tensors) == 1 else torch.stack(tensors, dim)


@dataclasses.dataclass
class RoundDraws:
    """The live runs' draws of one round, batched (`RoundProgram._draw`): their `Draw`s stacked on a run axis, their
    clients as the round's slots (`fedbench.axes.slots.Slots`)."""

    slots: Slots  # [R, S]: the clients, which of them take part, each one's local steps
    rows: dict[str, Tensor]  # [steps, R, S, b] per drawn minibatch
    steps: int  # the local steps the round runs: the longest of its runs'
    lengths: list[int]  # each run's own (its iterations grow by it)

    @classmethod
    def of(cls, draws: list[Draw], device, sizes: Tensor | None, dtype: torch.dtype, everyone: bool) -> RoundDraws:
        """The runs' draws stacked, their slots weighed by `sizes` (`Slots`) in `dtype`, every client in each
        (`everyone`) where the algorithm takes them all."""
        lengths = [draw.steps for draw in draws]
        steps = max(lengths)
        if draws[0].counts is None and min(lengths) != steps:
            raise NotBatchable("runs of one round-wise program drew rounds of different lengths")
        rows = {k: stacked([_padded(draw.rows[k], steps) for draw in draws], 1) for k in draws[0].rows}
        present, counts, least = _stacked_masks(draws, "present"), _stacked_masks(draws, "counts"), steps
        participants = [len(draws[0].clients)] * len(draws) if present is None else present.sum(-1).tolist()
        if counts is not None:
            least = int(counts.min())
        slots = Slots(stacked([draw.clients for draw in draws]), participants, sizes, dtype,
                      None if present is None else present.to(device), None if counts is None else counts.to(device),
                      least, everyone)
        lost = _stacked_lost(draws)
        if lost is not None:  # uploads that go missing (a client dropout): whose the server hears, by run on the host
            heard = ~lost if present is None else present & ~lost
            slots.lose(lost.to(device), heard.sum(-1).tolist())
        return cls(slots, rows, steps, lengths)

    def select(self, positions: list[int], device) -> RoundDraws:
        """The draws of the runs at `positions` (indices into the batch's runs)."""
        chosen = torch.tensor(positions, device=device)
        return RoundDraws(self.slots.select(positions, chosen), {k: v[:, chosen] for k, v in self.rows.items()},
                          self.steps, [self.lengths[p] for p in positions])


def _stacked_masks(draws: list[Draw], name: str) -> Tensor | None:
    """The runs' `present` or `counts` `[R, S]` on the host (None where the draws have none)."""
    values = [getattr(draw, name) for draw in draws]
    return None if values[0] is None else stacked(values)


def _stacked_lost(draws: list[Draw]) -> Tensor | None:
    """The runs' lost uploads `[R, S]` on the host (`Draw.lost`; a run that loses none: no slot), None where none
    does."""
    if all(draw.lost is None for draw in draws):
        return None
    return stacked([torch.zeros(len(draw.clients), dtype=torch.bool) if draw.lost is None else draw.lost
                    for draw in draws])


def _padded(rows: Tensor, steps: int) -> Tensor:
    """A run's rows `[L, S, b]` of a round of `steps` ≥ L steps: its last step's again in the steps it does not take
    (its clients are past their counts there: never used)."""
    if len(rows) == steps:
        return rows
    return torch.cat([rows, rows[-1:].expand(steps - len(rows), *rows.shape[1:])])
