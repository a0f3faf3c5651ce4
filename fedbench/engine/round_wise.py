"""The round-wise program (`RoundProgram`): every live run of a program through one round at a time, rounds of the
federation's length (or, for one run, of its drawn length), and the rows of its runs evaluated together
(`evaluate_rows`). `fedbench.engine.runs` says how a program lays out, draws, evaluates and stops its runs; the
iteration-wise program (`fedbench.engine.iteration_wise`) builds on this one."""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator, TypeVar

import torch
from torch import Tensor

from fedbench.algorithms.base import HParams, Round, upload_floats
from fedbench.axes.slots import State
from fedbench.engine.compiling import compiled, compiles
from fedbench.engine.federation import step_oracles, weighing_sizes
from fedbench.engine.links import Links
from fedbench.engine.narrowed_steps import NarrowedSteps, no_noise
from fedbench.engine.planning import NotBatchable, step_bytes, why_not_batchable
from fedbench.engine.record import RunRecord
from fedbench.engine.run_axis import (
    RoundDraws,
    batch_hparams,
    differs,
    failing_alone,
    per_run,
    rows_of,
    rows_replaced,
    stacked,
)
from fedbench.engine.server_steps import ServerSteps
from fedbench.oracle import Batches, RunOracle

GATHER_BUDGET = 4 * 2**20  # bytes of minibatch rows one batched local step gathers (see RoundProgram.chunk)
UNEVEN = "in a round of uneven local work (each client's own count: rnd.client_steps)"
Counted = TypeVar("Counted")  # what `RoundProgram._counted` remembers


class RoundProgram(NarrowedSteps):
    """The round-wise schedule: every live run through one round at a time, rounds of the federation's length (or,
    for one run, of its drawn length)."""

    def __init__(self, sims: list[RunRecord]):
        if not sims:
            raise NotBatchable("no simulations")
        reason = why_not_batchable(sims)
        if reason:
            raise NotBatchable(reason)
        first = sims[0]
        self.sims = sims
        self.problem, self.federation, self.algorithm = first.problem, first.federation, first.algorithm
        self.device = self.problem.device
        self.dtype = first.server[self.algorithm.downloads[0]].dtype
        self.hp = batch_hparams(sims, self.dtype, self.device)
        self.differing = [key for key, value in self.hp.items() if differs(value)]  # selected per sub-batch
        self._hp_alone: dict[int, HParams] = {}  # `_hp_of` one run
        self.scheduled = list(self.algorithm.schedules)  # hyperparameters that follow a schedule (`_at_rounds`)
        self.everyone = self.algorithm.participation == "all"
        self.sizes = weighing_sizes(self.problem, self.federation)  # how the server weighs a round's slots (`Slots`)
        given = self.federation.local_steps
        self.local_steps = given if isinstance(given, int) else None  # E; None: each participant its own (uneven)
        self.minibatches = first.sampler.minibatches
        self.compiled = compiles(sims)  # whether its local steps run compiled (`fedbench.engine.compiling`)
        self.local_step = compiled(self._local_step) if self.compiled else self._local_step
        # uneven local work on the CPU, uncompiled, of steps that draw nothing: a step runs the slots still taking it
        # alone (`_uneven_steps`)
        self.narrows_steps = self.device.type == "cpu" and not self.compiled and not any(
            type(sim.algorithm).draws_in_steps(sim.algorithm.declared) for sim in sims)
        self.resume_from_runs()
        self.links = Links(sims, self.server)
        self.server_steps = ServerSteps(sims, self.server) if self.federation.server_optimizer else None
        self.live = list(range(len(sims)))
        self.train_seconds = 0.0  # the whole batch's
        self.share = 0.0  # Σ over steps of the step's seconds / live runs: each live run's share of the time
        self.settled = [0.0] * len(sims)  # `share` when each run was last charged (`_settle`)
        self._uploaded = (0, 0)  # floats and bits one participant uploaded in the last round
        self._counts: dict[tuple, Any] = {}  # by message shapes (`_counted`)
        # Runs per batched kernel: a local step gathers S·b rows per run; beyond GATHER_BUDGET bytes the gathered
        # batch leaves the cache and the batch runs slower than its runs one after another (Bao et al.'s Lasso,
        # 800 KB a run: 1.2x at R = 4, 0.4x at R = 64, before `plan` sent such runs one after another), so
        # larger batches go through the round in chunks.
        self.chunk = max(1, GATHER_BUDGET // step_bytes(first))
        # Called with the program at each safe point: between two rounds (an iteration-wise program: two
        # iterations), every row before it yielded, where `state_dict` is whole (a checkpoint is taken there)
        self.safe_point: Callable[[RoundProgram], None] | None = None
        self.resumed = False  # `load_state_dict` given: the rows at the start were yielded before

    def __len__(self) -> int:
        return len(self.sims)

    def resume_from_runs(self) -> None:
        """The batch's state and round counter from its runs' records (views for a run alone)."""
        self.server = {k: stacked([s.server[k] for s in self.sims]).unsqueeze(1) for k in self.sims[0].server}
        self.clients = {k: stacked([s.clients[k] for s in self.sims]) for k in self.sims[0].clients}
        self.rounds_done = self.sims[0].rounds_done

    # -- what every schedule shares -----------------------------------------------------------------------
    def _hp_of(self, ids: list[int], runs: Tensor | None) -> HParams:
        """The per-run values of the runs `ids` (`runs` as a tensor; None: every run of the batch). A run's own
        are kept: an iteration-wise program asks for them at each of its round ends."""
        if runs is None or not self.differing:
            return self.hp
        if len(ids) == 1 and ids[0] in self._hp_alone:
            return self._hp_alone[ids[0]]
        hp = HParams({**self.hp, **{k: rows_of(self.hp[k], runs) for k in self.differing}})
        if len(ids) == 1:
            self._hp_alone[ids[0]] = hp
        return hp

    def _at_rounds(self, hp: HParams, ids: list[int]) -> HParams:
        """`hp` of the runs `ids` with each scheduled hyperparameter's value at each run's current round
        (`fedbench.schedules`), as a float's (`per_run`); `hp` itself where nothing follows a schedule. Computed on
        the host from each run's own schedule and round counter, so that a run's values are the same alone and in a
        batch."""
        if not self.scheduled:
            return hp
        rounds = self.federation.rounds
        return HParams({**hp, **{name: per_run([self.sims[i].algorithm.schedules[name].value(
            self.sims[i].rounds_done, rounds) for i in ids], self.dtype, self.device) for name in self.scheduled}})

    def _layout(self, rows: dict[str, Tensor]) -> dict[str, Tensor]:
        """Rows `[..., R, S, b]` of each drawn minibatch as the problem's step oracles take them: as they are where
        the oracles take the run axis (`Problem.oracles_take_runs`), else with it folded into the clients'
        `[..., R·S, b]`."""
        return rows if self.problem.oracles_take_runs else {k: v.flatten(-3, -2) for k, v in rows.items()}

    def _batches(self, rows: dict[str, Tensor], count: int, clients: int, noise) -> Batches:
        """The oracles of one local step of `count` runs of `clients` clients each, on their rows of each drawn
        minibatch (`_layout`) with their minibatch noise (`_noise`): the problem's oracles themselves where they take
        the run axis, else lifted over it (`RunOracle`)."""
        oracles = step_oracles(self.problem, self.minibatches, rows, noise)
        if self.problem.oracles_take_runs:
            return Batches(oracles)
        lifted: dict[str, RunOracle] = {}
        for mb in self.minibatches:  # a batch `same_as` another shares its lifted oracle too
            lifted[mb.name] = lifted[mb.same_as] if mb.same_as else RunOracle(oracles[mb.name], count, clients)
        return Batches(lifted)  # type: ignore[arg-type]  # a RunOracle answers as the Oracle it lifts

    def _local_step(self, local: dict[str, Tensor], rows: dict[str, Tensor], count: int, clients: int, noise,
                    rnd: Round, hp: HParams) -> dict[str, Tensor]:
        """One local step of `count` runs of `clients` clients each on their rows of each drawn minibatch (`_batches`):
        the algorithm's `client_step` (the program calls it as `local_step`, compiled or as it is)."""
        return self.algorithm.client_step(local, self._batches(rows, count, clients, noise), rnd, hp)

    def _noise(self, ids: list[int]):
        """The minibatch noise of the runs `ids`' rows (`_layout`), each run's on its own stream, one entry per row
        in the rows' order (`Problem.minibatch_noise`)."""
        if not self.problem.noisy_minibatches:
            return no_noise
        gens = [self.sims[i].sampler.noise_gen for i in ids]
        if len(gens) == 1:
            return lambda rows: self.problem.minibatch_noise(rows, gens[0])
        return lambda rows: torch.cat([self.problem.minibatch_noise(run_rows, gen)  # type: ignore[misc]  # noisy: no None
                                       for run_rows, gen in zip(rows.view(len(gens), -1, rows.shape[-1]), gens)])

    def _streams(self, ids: list[int]) -> tuple[torch.Generator, ...]:
        return tuple(self.sims[i].algorithm_gen for i in ids)

    def _downloaded(self) -> tuple[int, tuple[tuple[str, int, int], ...]]:
        """Floats one participant downloads (the server state before the round) and each download's message
        (`Links.download_messages`: what `Links.catch_up` counts the bits of). Counted once per shapes
        (`_counted`)."""
        downloads, copies = self.algorithm.downloads, self.links.copies
        shapes = tuple((self.server[k].shape, self.server[k].dtype, copies[k].shape if k in copies else None)
                       for k in downloads)
        return self._counted(("down", shapes), lambda: (sum(self.server[k][0].numel() for k in downloads),
                                                         self.links.download_messages(self.server, downloads)))

    def _uploaded_by(self, message: dict[str, Tensor]) -> tuple[int, int]:
        """Floats and bits (as the uplink encodes them) one participant uploads: `message`. Counted once per shapes
        (`_counted`), its entries checked against the declared uploads then (`upload_floats`)."""
        shapes = tuple((k, v.shape, v.dtype) for k, v in message.items())
        return self._counted(("up", shapes), lambda: (upload_floats(self.algorithm, message),
                                                       self.links.upload_bits(message)))

    def _counted(self, shapes: tuple, count: Callable[[], Counted]) -> Counted:
        """`count()` of a message of these shapes and dtypes, remembered: the counts follow from them and the
        program's links alone, and counting them anew each round took 35 µs of a 1.7 ms round under the profiler
        (ASCD-PFL on Fashion-MNIST)."""
        counted = self._counts.get(shapes)
        if counted is None:
            counted = self._counts[shapes] = count()
        return counted

    # -- one round of every live run ----------------------------------------------------------------------
    def _draw(self) -> RoundDraws:
        """Every live run's draws of this round on its own streams, in the order a run alone draws them."""
        draws = []
        for i in self.live:
            sim = self.sims[i]
            given = self.local_steps
            steps = None if given is None else sim.algorithm.round_length(given, sim.algorithm_gen)
            draws.append(sim.sampler.draw_round(steps, self.everyone, sim.rounds_done))
        return RoundDraws.of(draws, self.device, self.sizes, self.dtype, self.everyone)

    def run_round(self) -> list[int]:
        """One round of every live run; the runs whose round failed (an SVD of an overflowed iterate raised
        LinAlgError) are returned: the batch then replays the round run by run on the same draws, so that
        only the failing runs fail."""
        draws = self._draw()
        down, messages = self._downloaded()
        start = (self.server, self.clients)  # every chunk starts from the state before the round
        failed = []
        for first in range(0, len(self.live), self.chunk):
            positions = list(range(first, min(first + self.chunk, len(self.live))))
            try:
                self._advance(draws, positions, start)
            except torch.linalg.LinAlgError:
                failed += [self.live[p] for p in failing_alone(positions, lambda p: self._advance(draws, [p], start))]
        self._count(draws, down, messages)
        self.rounds_done += 1
        return failed

    def _advance(self, draws: RoundDraws, positions: list[int], start: tuple[State, State]) -> None:
        """The round of the live runs at `positions` (indices into `self.live`) on their draws, from their state in
        `start` (server, clients) at the round's beginning: its pipeline, the round's slots
        (`fedbench.axes.slots.Slots`) applying every rule of who takes part, takes a step and is heard."""
        algorithm, ids = self.algorithm, [self.live[p] for p in positions]
        if len(ids) < len(self.live):
            draws = draws.select(positions, self.device)
        slots, runs = draws.slots, self._runs(ids)
        server, state = self._rows_of(start, runs)
        hp, rnd = self._at_rounds(self._hp_of(ids, runs), ids), self._round_of(draws, ids)
        received = self.links.receive(server, ids)  # the broadcast, through the downlink
        gathered = slots.gather(state)
        local = self._local_steps(algorithm.client_init(received, gathered, rnd, hp), draws, ids, rnd, hp)
        message, updated = algorithm.client_final(local, rnd, hp)
        self._uploaded = self._uploaded_by(message)
        message = self.links.send(message, server, received, slots)  # attacks, the uplink, a robust rule
        if self.server_steps:
            message = self.server_steps.step(message, server, slots, ids)
        new = algorithm.server_update(server, slots.heard_uploads(message), slots.weights, rnd, hp)
        # The scatter comes last, after everything that may raise: a replayed chunk finds its rows as they were.
        slots.scatter(state, slots.present_rows(updated, gathered))
        self._write(runs, slots.server_state(new, server), state)
        self._commit()

    def _runs(self, ids: list[int]) -> Tensor | None:
        """The runs `ids` as a tensor on the device; None where they are the whole batch."""
        return None if len(ids) == len(self.sims) else torch.tensor(ids, device=self.device)

    def _rows_of(self, start: tuple[State, State], runs: Tensor | None) -> tuple[State, State]:
        """The rows of the runs `runs` (None: all) of the server and per-client state `start`."""
        if runs is None:
            return start
        server, state = ({k: v.index_select(0, runs) for k, v in part.items()} for part in start)
        return server, state

    def _write(self, runs: Tensor | None, server: State, state: State) -> None:
        """The new server and per-client rows of the runs `runs` (None: all) written into the program's state."""
        if runs is None:
            self.server, self.clients = server, state
        else:
            self.server = {k: rows_replaced(self.server[k], runs, v) for k, v in server.items()}
            self.clients = {k: rows_replaced(self.clients[k], runs, v) for k, v in state.items()}

    def _round_of(self, draws: RoundDraws, ids: list[int], taking: Tensor | None = None) -> Round:
        """The round of the runs `ids` as the algorithm's functions see it: its length, or each slot's own count; of
        the slots `taking` alone where given (`_uneven_steps` narrows a round of uneven local work to them)."""
        sim, slots = self.sims[ids[0]], draws.slots
        client_steps = slots.client_steps()
        if client_steps is None:
            return Round(slots.clients, sim.rounds_done, draws.steps, sim.iterations, streams=self._streams(ids))
        clients = slots.clients
        if taking is not None:
            clients, client_steps = clients[:, taking], client_steps[:, taking]
        return Round(clients, sim.rounds_done, streams=self._streams(ids), where=UNEVEN, client_steps=client_steps)

    def _local_steps(self, local: State, draws: RoundDraws, ids: list[int], rnd: Round, hp: HParams) -> State:
        """The round's local steps of the runs `ids` from their local state `local`, each on its rows of `draws`; a
        slot past its own count keeps its state (`Slots.stepped`)."""
        slots, rows = draws.slots, self._layout(draws.rows)
        names, noise, count = list(rows), self._noise(ids), len(ids)
        # each step's rows `[R, S, b]` (or `[R·S, b]`, `_layout`), sliced in one call per minibatch. A step's
        # oracles are freed as the step ends, before the next step gathers its minibatch: the allocator then hands
        # the next gather the block still in cache (a Lasso step at p = 1024 gathers 800 KB; its gathers took ~10%
        # longer otherwise)
        if slots.counts is not None and self.narrows_steps:
            return self._uneven_steps(local, draws.rows, slots.counts, noise, hp,
                                      lambda taking: self._round_of(draws, ids, taking))
        for step, step_rows in enumerate(zip(*[v.unbind(0) for v in rows.values()])):
            stepped = self.local_step(local, dict(zip(names, step_rows)), count, slots.width, noise, rnd.at(step), hp)
            local = slots.stepped(local, stepped, step)
        return local

    def _count(self, draws: RoundDraws, down: int, messages: tuple[tuple[str, int, int], ...]) -> None:
        """Each live run's round counted on its record: its participants' downloads and the uploads its server hears
        (floats, bits; a lost upload is not counted) and its local steps."""
        slots = draws.slots
        down_bits = self.links.catch_up(self.live, slots, messages)
        for i, taking, heard, length, bits in zip(self.live, slots.participants, slots.heard_counts, draws.lengths,
                                                  down_bits):
            self.sims[i].count_round(of_clients(self._uploaded, heard), (down * taking, bits), length)

    def _commit(self) -> None:
        """The round of the runs in progress has succeeded: the links' and the server optimizer's new state written."""
        self.links.commit()
        if self.server_steps:
            self.server_steps.commit()

    # -- checkpoints ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What the program needs to go on as if it had never stopped, at a safe point (`safe_point`): its state and
        counters, and each run's record (`RunRecord.state_dict`: streams, counters, status, a stopped run's
        state). Tensors are the program's own; `torch.save` copies them."""
        return {"server": self.server, "clients": self.clients, "live": list(self.live),
                "rounds_done": self.rounds_done, "train_seconds": self.train_seconds, "uploaded": self._uploaded,
                "runs": [sim.state_dict() for sim in self.sims], **self.links.state_dict(),
                **(self.server_steps.state_dict() if self.server_steps else {})}

    def rounds_progress(self) -> int:
        """Rounds the program's runs have gone through (of an iteration-wise program, on average)."""
        return self.rounds_done

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The program as `state_dict` left it; iterating it then yields the rows after that point."""
        for sim, record in zip(self.sims, state["runs"], strict=True):
            sim.load_state_dict(record)
        self.server, self.clients, self.live = state["server"], state["clients"], list(state["live"])
        self.rounds_done, self.train_seconds, self._uploaded = (state["rounds_done"], state["train_seconds"],
                                                                state["uploaded"])
        self.links.load_state_dict(state)
        if self.server_steps:
            self.server_steps.load_state_dict(state)
        self.resumed = True

    # -- evaluation and the loop --------------------------------------------------------------------------
    def sync_run(self, i: int) -> None:
        """Run i's state onto its RunRecord (views of the batch's tensors, without the run axis)."""
        sim = self.sims[i]
        sim.server = {k: v[i, 0] for k, v in self.server.items()}
        sim.clients = {k: v[i] for k, v in self.clients.items()}

    def evaluate(self, runs: list[int] | None = None) -> dict[int, dict[str, float]]:
        """The rows of `runs` (default: every live run), evaluated together (`evaluate_rows`)."""
        runs = list(self.live) if runs is None else runs
        for i in runs:
            self.sync_run(i)
        return dict(zip(runs, evaluate_rows([self.sims[i] for i in runs])))

    def _charge(self, seconds: float) -> None:
        """Seconds the batch computed, shared by its live runs (`_settle` moves a run's share onto its record)."""
        self.train_seconds += seconds
        self.share += seconds / len(self.live)

    def _settle(self, i: int) -> None:
        """Run i's share of the batch's seconds since it was last charged, onto its training seconds."""
        self.sims[i].train_seconds += self.share - self.settled[i]
        self.settled[i] = self.share

    def _rows_due(self, ended: list[int]) -> list[tuple[int, dict[str, float]]]:
        """The runs `ended`, which have just ended a round: their rows due on the evaluation schedule (every
        `eval_every` rounds, and the last), evaluated together; a run whose row diverged stops. Both schedules
        keep their books here."""
        eval_every, last = self.sims[0].eval_every, self.federation.rounds
        due = self.evaluate([i for i in ended if self.sims[i].rounds_done % eval_every == 0
                             or self.sims[i].rounds_done == last])
        for i, row in due.items():
            self._settle(i)
            if self.sims[i].exploded(row):
                self._stop(i, "diverged")
        return list(due.items())

    def _rows_failed(self, failed: list[int]) -> list[tuple[int, dict[str, float]]]:
        """The runs `failed`, whose computation failed alone (`failing_alone`), end diverged, each with a row of
        NaN metrics. Both schedules keep their books here."""
        rows = []
        for i in failed:
            self.sync_run(i)
            rows.append((i, evaluate_rows([self.sims[i]], failed=True)[0]))
            self._stop(i, "diverged")
        return rows

    def _stop(self, i: int, status: str) -> None:
        """Run i ends: its state stays on its RunRecord (copied out of the batch), and it leaves the batch."""
        sim = self.sims[i]
        self._settle(i)
        self.sync_run(i)
        if len(self.sims) > 1:
            sim.server = {k: v.clone() for k, v in sim.server.items()}
            sim.clients = {k: v.clone() for k, v in sim.clients.items()}
        sim.status = status
        self.live.remove(i)

    def step(self) -> list[tuple[int, dict[str, float]]]:
        """One round of every live run, and the rows it makes: those due on the evaluation schedule, and those of
        runs that diverged (which then stop)."""
        start = time.perf_counter()
        failed = self.run_round()
        self._charge(time.perf_counter() - start)
        for i in self.live:  # charged every round: a caller of `run_round` reads its run's seconds
            self._settle(i)
        return self._rows_failed(failed) + self._rows_due(list(self.live))

    def _start(self) -> Iterator[tuple[int, dict[str, float]]]:
        """The rows at the start (their objective is each run's divergence reference); none on a resumed program."""
        if self.resumed:
            return
        for i, row in self.evaluate().items():
            self.sims[i].start_objective = row.get("objective")
            yield i, row

    def __iter__(self) -> Iterator[tuple[int, dict[str, float]]]:
        yield from self._start()
        while self.live and self.rounds_done < self.federation.rounds:
            yield from self.step()
            if self.safe_point is not None:
                self.safe_point(self)
        for i in list(self.live):
            self._stop(i, "finished")


def of_clients(counted: tuple[int, int], clients: int) -> tuple[int, int]:
    """Floats and bits of `clients` clients, from those of one."""
    return counted[0] * clients, counted[1] * clients


def evaluate_rows(sims: list[RunRecord], failed: bool = False) -> list[dict[str, float]]:
    """The rows of simulations of one algorithm on one problem instance (a run alone, or the live runs of a
    batch), their metrics from one `Problem.evaluate_runs` call, so that a run's row comes from the same kernels
    alone and in a batch. A run whose iterate is beyond evaluation (an SVD of an overflowed iterate) gets NaN."""
    if not sims:
        return []
    start = time.perf_counter()
    metrics: list[dict[str, float] | None] = [None] * len(sims)
    if not failed:
        try:
            rows = sims[0].problem.evaluate_runs(
                torch.stack([sim.algorithm.global_params(sim.server) for sim in sims]),
                _stack([sim.personal_params() for sim in sims]))
            for sim, row in zip(sims, rows):
                row.update(sim.algorithm.evaluate(sim.server, sim.clients))
            metrics = list(rows)
        except torch.linalg.LinAlgError:
            if len(sims) > 1:  # only the runs that fail alone fail
                return [row for sim in sims for row in evaluate_rows([sim])]
    share = (time.perf_counter() - start) / len(sims)
    for sim in sims:
        sim.eval_seconds += share
    return [sim.row(m) for sim, m in zip(sims, metrics)]


def _stack(tensors: list[Tensor | None]) -> Tensor | None:
    return None if tensors[0] is None else torch.stack(tensors)  # type: ignore[arg-type]  # all None or none
