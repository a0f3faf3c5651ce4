"""The iteration-wise program (`IterationProgram`), for rounds of random length where every client takes part: each
run of the program through its own rounds, iteration by iteration (`fedbench.runs` says why)."""
from __future__ import annotations

import time
from typing import Any, Iterator

import torch
from torch import Tensor

from fedbench.algorithms.base import HParams, Round
from fedbench.planning import NotBatchable, not_iteration_wise
from fedbench.record import RunRecord
from fedbench.round_wise import RoundProgram, of_clients
from fedbench.run_axis import failing_alone, select_runs, write_runs
from fedbench.slots import Slots

STREAM_BYTES = 2**20  # rows of the iterations an iteration-wise program draws ahead for all its runs at a time


class IterationProgram(RoundProgram):
    """The iteration-wise schedule, for rounds of random length where every client takes part (coin-flip
    communication): the runs advance iteration by iteration, each through its own rounds, instead of round by
    round. A round-synchronous program would run every round as long as the longest of R geometric lengths (about
    ln R times the mean); here no iteration is wasted.

    Every live run takes a local step at every iteration, so a run's k-th iteration is the batch's. Its rows are
    drawn ahead, for many iterations at a time (`_draw_ahead`): a round's rows are the next iterations' of the
    run's own stream, which the problem draws step after step (`Problem.draws_by_step`), so that the run draws
    exactly what it draws alone round by round, and a local step's rows are one slice of the batch's buffer.

    At each iteration, first the runs at their round's last step end their rounds (last step, client_final,
    server_update on the batch's rows of these runs: together, or one run at a time where the algorithm branches on
    its draws there, `draws_at_round_end`); then every row of the batch takes a local step at once (wasted on the
    rows of runs that just ended a round or stopped, cheaper than selecting the others); the runs that go on then
    draw their next round's length and take their local states together (client_init). The runs are at different
    rounds, so the inner steps' round defines neither `index`, `iteration`, `local_steps` nor `step`
    (`is_last_step` is False there) and allows no draw; a round's end and start define what all its runs share."""

    INSIDE = "in an iteration-wise program's inner steps (its runs are at different rounds)"

    def __init__(self, sims: list[RunRecord]):
        super().__init__(sims)
        if why := not_iteration_wise(sims[0]):
            raise NotBatchable(why)
        assert self.local_steps is not None  # all take part, no uneven work (`participation.check_local_steps`)
        self.steps_given = self.local_steps  # E, which each run's `round_length` draws its rounds' lengths from
        sampler = sims[0].sampler
        self.rows_per_step = self.problem.num_clients * sampler.sizes[sampler.drawn[0].name]
        self.length = [0] * len(sims)
        self.iteration = 0  # the batch's iterations so far
        self.ends: dict[int, list[int]] = {}  # batch iteration -> the runs whose round's last step it is
        self.ahead: dict[str, Tensor] = {}  # [R, A, S, b]: each run's rows of the iterations `drawn` to `drawn + A`
        self.ahead_steps = max(1, STREAM_BYTES // (8 * self.rows_per_step * len(sims)))  # A
        self.drawn = 0
        self.ids = list(range(len(sims)))
        self.noise = self._noise(self.ids)  # every row's, for the steps of the whole batch
        self.local: dict[str, Tensor] = {}
        self.clients_all = torch.arange(self.problem.num_clients, device=self.device)
        self.inside = Round(self.clients_all.expand(len(sims), -1), where=self.INSIDE)
        self.every_hp: HParams | None = None  # every run's values at its current round, until a run opens a round

    def _draw_ahead(self) -> None:
        """The rows of every live run for the next iterations, on its own stream (`sampler.draw` of that many
        steps): the rows alone of its rounds from here on, one round after another (`Problem.draws_by_step`). A
        stopped run keeps its old rows, which the batch's wasted steps read."""
        for i in self.live:
            for name, rows in self.sims[i].sampler.draw(self.ahead_steps, everyone=True)[1].items():
                if name not in self.ahead:
                    self.ahead[name] = rows.new_zeros(len(self.sims), *rows.shape)
                self.ahead[name][i] = rows
        self.drawn = self.iteration

    def _step_rows(self) -> dict[str, Tensor]:
        """Every run's rows `[R, S, b]` of this iteration."""
        if self.iteration == self.drawn + self.ahead_steps:
            self._draw_ahead()
        return {name: rows[:, self.iteration - self.drawn] for name, rows in self.ahead.items()}

    def _round(self, runs: list[int], ending: bool = False) -> Round:
        """The round of the runs `runs` at its start, or at its last step (`ending`): what they share defined."""
        sims = [self.sims[i] for i in runs]
        shared = lambda values: values[0] if len(set(values)) == 1 else None  # noqa: E731
        length = shared([self.length[i] for i in runs])
        return Round(self.clients_all.expand(len(runs), -1), shared([s.rounds_done for s in sims]), length,
                     shared([s.iterations for s in sims]), length - 1 if ending and length else None,
                     self._streams(runs), "for runs of an iteration-wise program at different rounds", last=ending)

    def _open_rounds(self, opening: list[int]) -> None:
        """The next round of each run in `opening`: its length on its own stream (as alone); then their local
        states together (client_init). Their first step is the next iteration."""
        for i in opening:
            sim = self.sims[i]
            steps = sim.algorithm.round_length(self.steps_given, sim.algorithm_gen)
            self.length[i] = steps
            self.ends.setdefault(self.iteration + steps - 1, []).append(i)
        runs = torch.tensor(opening, device=self.device)
        received = self.links.receive(select_runs(self.server, opening, runs), opening)
        local = self.algorithm.client_init(received, select_runs(self.clients, opening, runs), self._round(opening),
                                           self._at_rounds(self._hp_of(opening, runs), opening))
        self.links.commit()
        self.every_hp = None  # these runs' values change (`_step_every_row`)
        for key, value in local.items():
            if key not in self.local:
                self.local[key] = value.new_zeros(len(self.sims), *value.shape[1:])
            self.local[key].index_copy_(0, runs, value)

    def _end_rounds(self, ending: list[int], rows: dict[str, Tensor]) -> list[int]:
        """The last local step, client_final and server_update of the runs in `ending`: together, or one run at a
        time for algorithms that branch on their draws there. The runs whose round failed alone are returned."""
        groups = [[i] for i in ending] if self.algorithm.draws_at_round_end else [ending]
        failed = []
        for group in groups:
            try:
                self._end_round(group, rows)
            except torch.linalg.LinAlgError:
                failed += failing_alone(group, lambda i: self._end_round([i], rows))
        return failed

    def _end_round(self, group: list[int], rows: dict[str, Tensor]) -> None:
        runs = torch.tensor(group, device=self.device)
        hp = self._at_rounds(self._hp_of(group, runs), group)
        local, server = select_runs(self.local, group, runs), select_runs(self.server, group, runs)
        rnd = self._round(group, ending=True)
        local = self.local_step(local, self._layout(select_runs(rows, group, runs)), len(group), len(self.clients_all),
                                self._noise(group), rnd, hp)
        message, updated = self.algorithm.client_final(local, rnd, hp)
        up = of_clients(self._uploaded_by(message), len(self.clients_all))
        slots = Slots(rnd.clients, [len(self.clients_all)] * len(group), self.sizes, self.dtype, everyone=True)
        message = self.links.send(message, server, self.links.received(server, group), slots)
        if self.server_steps:
            message = self.server_steps.step(message, server, slots, group)
        server = self.algorithm.server_update(server, message, slots.weights, rnd, hp)
        write_runs(self.server, server, group, runs)
        write_runs(self.clients, updated, group, runs)
        self._commit()
        down, messages = self._downloaded()
        down_bits = self.links.catch_up(group, slots, messages)
        for i, bits in zip(group, down_bits):
            self.sims[i].count_round(up, (down * len(self.clients_all), bits), self.length[i])

    def _step_every_row(self, rows: dict[str, Tensor]) -> None:
        """A local step of every row of the batch, in the middle of its run's round: the steps of the rows of runs that
        have just ended their round or stopped are wasted, cheaper than selecting the others."""
        if self.every_hp is None:
            self.every_hp = self._at_rounds(self.hp, self.ids)
        self.local = self.local_step(self.local, self._layout(rows), len(self.sims), len(self.clients_all), self.noise,
                                     self.inside, self.every_hp)

    def _step_run(self, i: int, rows: dict[str, Tensor]) -> None:
        """Run i's local step alone, on its own rows (a replay after `_step_every_row` failed)."""
        run = torch.tensor([i], device=self.device)
        inside = Round(self.clients_all.expand(1, -1), where=self.INSIDE)
        local = self.local_step(select_runs(self.local, [i], run), self._layout(select_runs(rows, [i], run)), 1,
                                len(self.clients_all), self._noise([i]), inside,
                                self._at_rounds(self._hp_of([i], run), [i]))
        write_runs(self.local, local, [i], run)

    def _stop(self, i: int, status: str) -> None:
        """As `RoundProgram._stop`; the run's rows then take a live run's values, so that the batch, which steps every
        row, stays finite whatever the stopped run's iterate was."""
        super()._stop(i, status)
        for runs in self.ends.values():  # a run that failed in mid-round ends no round
            if i in runs:
                runs.remove(i)
        if self.live:
            donor = self.live[0]
            for state in (self.local, self.server, self.clients):
                for key in state:
                    state[key][i] = state[key][donor]

    ITERATION_STATE = ("length", "iteration", "ends", "share", "settled", "ahead", "drawn", "local")

    def state_dict(self) -> dict[str, Any]:
        """`RoundProgram.state_dict` and the iteration-wise schedule's own: each run's round length and the iteration
        its round ends, the rows drawn ahead (already drawn from the runs' streams), the rounds' local states."""
        return {**super().state_dict(), **{name: getattr(self, name) for name in self.ITERATION_STATE}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for name in self.ITERATION_STATE:
            setattr(self, name, state[name])
        self.every_hp = None  # of the runs' rounds as loaded

    def rounds_progress(self) -> int:
        return sum(sim.rounds_done for sim in self.sims) // len(self.sims)

    def __iter__(self) -> Iterator[tuple[int, dict[str, float]]]:
        """Each iteration: the runs at their round's last step end their rounds; then every row takes a local
        step (wasted on the rows of runs that just ended a round or stopped: cheaper than selecting the others);
        the ended rounds are evaluated on schedule and the next ones drawn and opened."""
        yield from self._start()
        if self.federation.rounds == 0:
            for i in list(self.live):
                self._stop(i, "finished")
            return
        if not self.resumed:
            start = time.perf_counter()
            self._draw_ahead()
            self._open_rounds(list(self.live))
            self.share += (time.perf_counter() - start) / len(self.live)
        while self.live:
            start = time.perf_counter()
            ending = self.ends.pop(self.iteration, [])
            rows = self._step_rows()
            failed = self._end_rounds(ending, rows) if ending else []
            if len(ending) < len(self.live):
                try:
                    self._step_every_row(rows)
                except torch.linalg.LinAlgError:
                    stepping = [i for i in self.live if i not in ending]
                    failed += failing_alone(stepping, lambda i: self._step_run(i, rows))
            self.iteration += 1
            self._charge(time.perf_counter() - start)
            if failed:
                yield from self._rows_failed(sorted(failed))
                ending = [i for i in ending if i in self.live]
            if ending:
                yield from self._rows_due(ending)
            for i in [i for i in ending if i in self.live and self.sims[i].rounds_done == self.federation.rounds]:
                self._stop(i, "finished")
            opening = [i for i in ending if i in self.live]
            if opening:
                start = time.perf_counter()
                self._open_rounds(opening)
                self.share += (time.perf_counter() - start) / len(self.live)
            if self.safe_point is not None:
                self.safe_point(self)
