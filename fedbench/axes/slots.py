"""The client slots of a round (`Slots`): the S slots of each of R runs, the client each holds, and every rule that
makes a slot count for less than a full participant, applied in one place.

A round's clients lie on a fixed axis `[R, S]` (`fedbench.axes.participation` says why and how they are drawn). What the
round loop (`fedbench.engine.round_wise`) does with them goes through this object alone:

* which slots hold a participant (`present`, `[R, S]` bool; None: every slot): an absent slot's computation is done
  and discarded, its per-client state written back as it was (`present_rows`);
* whose uploads the server hears (`heard`: `present`, narrowed by `lose`): their aggregation weights (`weights`:
  uniform or by samples, renormalised over the heard slots), their uploads (the others' zeros before the server's
  update: `heard_uploads`), their error-feedback vectors (`fedbench.engine.links`: `where_heard`); a run that hears no
  one keeps its server state (`server_state`) and its server optimizer's (`if_heard`). A rule under which a participant
  trains but its upload goes missing (a client dropout) narrows `heard` through `lose`, where the slots are made: every
  consumer of the uploads reads `heard`;
* how many local steps each slot takes under uneven local work (`counts`): a slot past its count keeps its local
  state (`stepped`), and the algorithm reads the counts as `Round.client_steps` (`client_steps`);
* the gather of the slots' per-client state `[R, N, ...] -> [R, S, ...]` and its scatter back (`gather`, `scatter`);
* the participants' numbers on the host (`participants`, whose downloads the round counts) and the heard ones
  (`heard_counts`, whose uploads it counts).

Every mask is drawn on the host and moved to the device once, where the slots are made; nothing here reads the
device back (a run's host-side counts decide what the host decides, e.g. whether any run heard no one)."""
from __future__ import annotations

from functools import cached_property
from typing import Any

import torch
from torch import Tensor

State = dict[str, Tensor]


def along(mask: Tensor, value: Tensor) -> Tensor:
    """A mask `[R, S]` (or `[R, 1]`) viewed to broadcast against `value` `[R, S, ...]`."""
    return mask.view(*mask.shape, *[1] * (value.dim() - mask.dim()))


def has_client_rows(value: Tensor, mask: Tensor) -> bool:
    """Whether `value` has the run and client axes of `mask` `[R, S]` (a client's entry, not a shared `[R, 1, ...]`)."""
    return value.shape[:2] == mask.shape


def slot_weights(clients: Tensor, sizes: Tensor | None, dtype: torch.dtype, heard: Tensor | None = None) -> Tensor:
    """π̂ `[R, S]` over each run's sampled clients `clients` `[R, S]`: by samples n_k over the sampled set (`sizes`
    the clients' n_k `[N]`), else uniform 1/S (None). With `heard` `[R, S]`, over the heard slots only: zero on the
    other slots, all zeros for a run that hears no one."""
    if sizes is None:
        if heard is None:
            return torch.full(clients.shape, 1.0 / clients.shape[-1], dtype=dtype, device=clients.device)
        mass = heard.to(dtype)
    else:
        mass = sizes[clients].to(dtype)
        if heard is None:
            return mass / mass.sum(-1, keepdim=True)
        mass = torch.where(heard, mass, 0.0)
    return mass / mass.sum(-1, keepdim=True).clamp_min(1.0)  # a sum of counts: ≥ 1 where anyone is heard


class Slots:
    """The slots `[R, S]` of a round of R runs (the module's docstring): `clients` `[R, S]` on the device (every client
    in order, `everyone`, where each run takes all of them), `present` `[R, S]` bool (None: every slot), each slot's
    local steps `counts` `[R, S]` under uneven local work (None: the round's length for all; `least` the fewest), the
    participants' numbers `participants` on the host, and the weighing: the clients' n_k `sizes` `[N]` where the
    server weighs by samples (None: uniformly), in `dtype`."""

    def __init__(self, clients: Tensor, participants: list[int], sizes: Tensor | None, dtype: torch.dtype,
                 present: Tensor | None = None, counts: Tensor | None = None, least: int = 0,
                 everyone: bool = False):
        self.clients, self.participants, self.sizes, self.dtype = clients, participants, sizes, dtype
        self.present, self.counts, self.least, self.everyone = present, counts, least, everyone
        self.heard, self.heard_counts = present, participants  # whose uploads arrive (`lose`), their numbers
        self.runs, self.width = clients.shape

    def lose(self, lost: Tensor, heard_counts: list[int]) -> None:
        """The uploads of the slots `lost` `[R, S]` bool (on the device, drawn on the host) go missing: those
        participants train and keep their per-client state, but the server hears them not (their weight zero, their
        uploads zeros, their error-feedback vectors as they were); `heard_counts`: each run's uploads that arrive, on
        the host. Call it before the round reads the weights."""
        self.heard = ~lost if self.present is None else self.present & ~lost
        self.heard_counts = heard_counts

    def select(self, positions: list[int], chosen: Tensor) -> Slots:
        """The slots of the runs at `positions` (`chosen` as a tensor on the device)."""
        pick = lambda value: None if value is None else value[chosen]  # noqa: E731
        slots = Slots(self.clients[chosen], [self.participants[p] for p in positions], self.sizes, self.dtype,
                      pick(self.present), pick(self.counts), self.least, self.everyone)
        if self.heard is not self.present:
            slots.lose(~pick(self.heard), [self.heard_counts[p] for p in positions])  # type: ignore[operator]
        return slots

    # -- the clients' state ----------------------------------------------------------------------------------------
    @cached_property
    def _run_index(self) -> Tensor:
        return torch.arange(self.runs, device=self.clients.device)[:, None]

    def gather(self, state: State) -> State:
        """The slots' rows `[R, S, ...]` of the per-client state `[R, N, ...]` (the state itself where every client
        takes part)."""
        if self.everyone or not state:
            return state
        return {k: v[self._run_index, self.clients] for k, v in state.items()}

    def present_rows(self, updated: State, gathered: State) -> State:
        """The slots' new per-client rows `updated`, an absent slot's as they were (`gathered`)."""
        present = self.present
        if present is None:
            return updated
        return {k: torch.where(along(present, v), v, gathered[k]) for k, v in updated.items()}

    def scatter(self, state: State, updated: State) -> None:
        """The slots' rows `updated` written into the per-client state `state` (in place; a whole entry where every
        client takes part)."""
        for key, value in updated.items():
            if self.everyone:
                state[key] = value
            else:
                state[key][self._run_index, self.clients] = value

    # -- uneven local work -----------------------------------------------------------------------------------------
    def client_steps(self) -> Tensor | None:
        """Each slot's local steps `[R, S, 1]` in `dtype` (`Round.client_steps`), None where all take the round's."""
        return None if self.counts is None else self.counts.to(self.dtype).unsqueeze(-1)

    def stepped(self, local: State, stepped: State, step: int) -> State:
        """The local state after local step `step`, `stepped` where every slot takes it; else each entry with a client
        axis keeps the rows of `local` of the slots past their count."""
        counts = self.counts
        if counts is None or step < self.least:
            return stepped
        active = counts > step
        return {key: torch.where(along(active, value), value, local[key])
                if key in local and has_client_rows(value, active) and local[key].shape == value.shape else value
                for key, value in stepped.items()}

    # -- the uploads -----------------------------------------------------------------------------------------------
    @cached_property
    def weights(self) -> Tensor:
        """The server's weights π̂ `[R, S]` over the heard slots (`slot_weights`)."""
        return slot_weights(self.clients, self.sizes, self.dtype, self.heard)

    def where_heard(self, new: Tensor, old: Tensor) -> Tensor:
        """Per-slot values `[R, S, ...]`: `new` where the slot's upload is heard, else `old` (an error-feedback vector
        whose message never arrived stays)."""
        return new if self.heard is None else torch.where(along(self.heard, new), new, old)

    def heard_uploads(self, message: State) -> State:
        """The message with every upload of a slot not heard zero (entries with a client axis), so that a sum over the
        clients (SCAFFOLD's Σ Δc_k / N) is the heard slots'."""
        heard = self.heard
        if heard is None:
            return message
        return {k: torch.where(along(heard, v), v, 0.0) if has_client_rows(v, heard) else v for k, v in message.items()}

    @cached_property
    def _anyone(self) -> Tensor | None:
        """`[R]` bool: whether the run hears anyone this round; None where every run does (known on the host)."""
        if self.heard is None or min(self.heard_counts) > 0:
            return None
        return self.heard.any(-1)

    def if_heard(self, new: Any, old: Any) -> Any:
        """`new` `[R, ...]`, or `old` (a tensor or a number) in the runs that hear no one this round: their server
        state and their server optimizer's stay as they were."""
        anyone = self._anyone
        return new if anyone is None else torch.where(anyone.view(-1, *[1] * (new.dim() - 1)), new, old)

    def server_state(self, new: State, old: State) -> State:
        """The server's new state `new`, a run's that hears no one this round as it was (`old`)."""
        if self._anyone is None:
            return new
        return {k: self.if_heard(v, old[k]) for k, v in new.items()}
