"""Many runs as one program: a run axis `[R, S, ...]` above the clients' axis.

R simulations of one algorithm with one configuration on one problem instance (the same data), differing in their
seeds (initial point, client sampling, minibatches, the algorithm's coins) and in per-run hyperparameters, advance
round by round as one batched tensor program:

    sims = [Simulation(problem, FedMiD(problem, client_lr=1e-3), federation, seed) for seed in range(30)]
    for run, row in RunBatch(sims):   # each run's rows, exactly as `for row in sims[run]` would yield them
        ...
    sims[run].status                  # 'finished' or 'diverged', per run

* Draws. Every run keeps its own `Simulation`, whose generators draw on the host exactly what the run draws
  alone (round length, clients, minibatch rows), in the same order; only the arithmetic is batched.
* Layout. The server state gains a leading run axis (`[R, d]`), per-client state too (`[R, N, d]`), the local
  state of a round is `[R, S, d]`. Algorithms that declare `runs_axis` are written for it (reductions over the
  client axis −2, `broadcast`/`aggregate` between server and clients); the oracles they call fold the run axis
  into the client axis (`RunOracle`), so problems need nothing new.
* Hyperparameters. The runs may differ in the continuous hyperparameters the algorithm declares `run_hparams`
  (e.g. FedAvg's and FedMiD's step sizes): the batch's algorithm holds them as `[R]` tensors of the runs it
  advances, which the algorithm broadcasts over its tensors' run axis (`per_run`). Everything else is shared.
* Rounds. Of fixed length, the runs advance round by round together (`RunBatch`). Of random length (coin-flip
  communication, seed 003's block methods, every device in every round), the runs advance iteration by
  iteration, each through its own rounds (`IterationBatch`): round-synchronous runs would each wait for the
  longest of R geometric lengths, about ln R times the mean.
* Divergence. A run that diverges stops, as alone: its partial curve is kept, its final state is stored on its
  Simulation, and it leaves the batched arithmetic (the live runs are selected every round). A round in which an
  SVD fails (an iterate that overflowed between two evaluations) is replayed run by run on the same draws: the
  runs whose SVD fails end diverged there, as alone, and the others go on.
* Evaluation. On the same schedule as alone, the runs due together in one `Problem.evaluate_runs` call on views
  of the batch (`evaluate_rows`, which evaluates a run alone too, as a batch of one).

Why explicit and not `torch.func.vmap` over runs (tried first): on this CPU vmap costs ~2x per elementwise op and
~30x per gather (index_select with a batched index: 380 µs against 12 µs), where the runs of seed 003's
problems are streams of ~10 µs ops; the explicit layout's ops on `[R, S, d]` cost about what `[S, d]` costs.
Identity with runs alone: bit for bit where the batched kernels reduce in the same order as the unbatched ones,
else within 1e-12 relative (the server average is a batched matrix product); `tests/test_runs.py` per algorithm.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any, Iterable, Iterator

import torch
from torch import Tensor

from fedbench.algorithms import ALGORITHMS
from fedbench.algorithms.base import Algorithm, Round, RunStreams
from fedbench.oracle import Batches
from fedbench.simulate import Simulation, evaluate_rows


GATHER_BUDGET = 4 * 2**20  # bytes of minibatch rows one batched local step gathers (see RunBatch.chunk)
# Bytes of minibatch rows a run gathers per local step beyond which its runs go one after another (`run_batch`): the
# step is then bound by memory traffic, which a batch does not reduce, and the batch's bookkeeping costs ~5%.
# Measured here (FedMiD, Lasso with S·b = 100 rows, R = 16): 50 KB a run 1.7x, 200 KB 1.15x, 800 KB (spec 002's
# p = 1024) 0.91-1.05x whatever the chunk size.
MEMORY_BOUND_RUN_BYTES = 512 * 2**10
STREAM_BYTES = 2**20  # rows of the iterations an iteration-wise batch draws ahead for all its runs at a time


def step_bytes(sim: Simulation) -> int:
    """Bytes of minibatch rows one local step of this run gathers."""
    federation, problem = sim.federation, sim.problem
    clients = federation.clients_per_round or problem.num_clients
    samples = sum(sim.sampler.sizes[mb.name] for mb in sim.sampler.drawn)
    itemsize = sim.server[sim.algorithm.downloads[0]].element_size()
    return clients * samples * (problem.row_elements or problem.dim) * itemsize


class NotBatchable(ValueError):
    """These simulations cannot run as one program (the message says why)."""


def _random_rounds(algorithm_type: type[Algorithm]) -> bool:
    return algorithm_type.round_length is not Algorithm.round_length


def why_not_batchable(sims: list[Simulation]) -> str | None:
    """Why these simulations cannot form one batch (None: they can)."""
    first = sims[0]
    if not type(first.algorithm).batchable_runs(first.algorithm.hp):
        return f"{first.algorithm.name} is not written for the run axis with these settings (Algorithm.runs_axis)"
    if _random_rounds(type(first.algorithm)) and (why := _not_iteration_wise(first)):
        return why
    for sim in sims[1:]:
        if sim.problem is not first.problem:
            return "the runs must share one problem instance (the same data)"
        if type(sim.algorithm) is not type(first.algorithm):
            return "the runs must run one algorithm"
        differ = sorted(k for k in first.algorithm.hp if sim.algorithm.hp[k] != first.algorithm.hp[k])
        per_run = type(first.algorithm).run_hparams
        if any(k not in per_run or not isinstance(sim.algorithm.hp[k], float) for k in differ):
            return (f"the runs may differ only in {', '.join(per_run)} (per-run values), not in "
                    f"{', '.join(k for k in differ if k not in per_run)}" if per_run else
                    f"{first.algorithm.name} takes no per-run hyperparameters (none declared): the runs must share "
                    "them")
        if (sim.federation, sim.eval_every, sim.sampler.sizes, sim.divergence_factor) != (
                first.federation, first.eval_every, first.sampler.sizes, first.divergence_factor):
            return "the runs must share the federation, batch sizes, evaluation schedule and divergence rule"
    return None


def _run_values(values: list, dtype: torch.dtype, device) -> Tensor | Any:
    """The runs' values of one attribute as a `[R]` tensor; of a dataclass of floats, the dataclass of the `[R]`
    tensors of its fields."""
    if dataclasses.is_dataclass(values[0]):
        fields = {f.name: _run_values([getattr(v, f.name) for v in values], dtype, device)
                  for f in dataclasses.fields(values[0])}
        return dataclasses.replace(values[0], **fields)
    return torch.tensor([float(v) for v in values], dtype=dtype, device=device)


def _runs_of(values: Tensor | Any, runs: Tensor) -> Tensor | Any:
    """The rows `runs` of `_run_values`."""
    if dataclasses.is_dataclass(values):
        return dataclasses.replace(values, **{f.name: getattr(values, f.name).index_select(0, runs)
                                              for f in dataclasses.fields(values)})
    return values.index_select(0, runs)


def _not_iteration_wise(sim: Simulation) -> str | None:
    """Why runs like this one, whose rounds have random lengths, cannot be an `IterationBatch` (None: they can)."""
    name, problem = sim.algorithm.name, sim.problem.name
    if sim.algorithm.participation != "all":
        return f"{name} has rounds of random length with sampled clients"
    if sim.problem.noisy_minibatches:  # the steps wasted on runs between rounds would draw their noise
        return f"{name} has rounds of random length, and {problem}'s minibatches carry noise"
    if not sim.problem.draws_by_step or len(sim.sampler.drawn) != 1:
        return f"{name} has rounds of random length, and {problem} does not draw one minibatch a step, step by step"
    return None


def _rows_replaced(held: Tensor, runs: Tensor, values: Tensor) -> Tensor:
    """`held` `[R, ...]` with the rows of `runs` replaced by `values`; where the round changed the entry's shape
    (FeDXL's score pools go from every sample's score to the last rounds' records), the other rows are zeros
    until their own chunk of the round writes them (a run that has left the batch keeps its state on its
    Simulation)."""
    if held.shape[1:] != values.shape[1:]:
        held = values.new_zeros(len(held), *values.shape[1:])
    return held.index_copy(0, runs, values)


class RunOracle:
    """An oracle of R runs' minibatches: points `[R, S, d]` are folded to the `[R·S, d]` the problem's oracle of
    the flattened batch answers, and its answers unfolded. A point shared by a run's clients (`[R, d]`, e.g. a
    block method's w) is expanded to every client first."""

    def __init__(self, inner, runs: int, rows: Tensor):
        self.inner, self.runs, self.rows = inner, runs, rows  # rows `[R, S, b]`

    def _fold(self, x: Tensor) -> Tensor:
        return x.flatten(0, 1)

    def _unfold(self, x: Tensor | None) -> Tensor | None:
        return None if x is None else x.view(self.runs, -1, *x.shape[1:])

    def loss(self, w):
        return self._unfold(self.inner.loss(self._fold(w)))

    def grad(self, w):
        return self._unfold(self.inner.grad(self._fold(w)))

    def hvp(self, w, v):
        return self._unfold(self.inner.hvp(self._fold(w), self._fold(v)))

    def _per_client(self, w: Tensor, like: Tensor) -> Tensor:
        return w.unsqueeze(-2).expand(*like.shape[:-1], w.shape[-1]) if w.dim() < like.dim() else w

    def block_grads(self, w, beta, need_w: bool = True):
        g_w, g_beta = self.inner.block_grads(self._fold(self._per_client(w, beta)), self._fold(beta), need_w)
        return self._unfold(g_w), self._unfold(g_beta)

    def block_loss(self, w, beta):
        return self._unfold(self.inner.block_loss(self._fold(self._per_client(w, beta)), self._fold(beta)))

    def residuals(self, w):
        return self._unfold(self.inner.residuals(self._fold(w)))

    # pair oracles (X-risk problems): the step's positives/negatives per client, and the surrogate's gradient
    @property
    def positives(self) -> int:
        return self.inner.positives

    @property
    def negatives(self) -> int:
        return self.inner.negatives

    @property
    def positive_index(self) -> Tensor:
        return self._unfold(self.inner.positive_index)

    def surrogate_grad(self, w, surrogate):
        """The inner oracle's, on the flattened batch; `surrogate` sees the scores `[R, S, b]` and gives `[R, S]`."""
        grad, scores = self.inner.surrogate_grad(
            self._fold(w), lambda a, b: surrogate(self._unfold(a), self._unfold(b)).flatten())
        return self._unfold(grad), self._unfold(scores)

    def grad_of_residuals(self, residuals):
        return self._unfold(self.inner.grad_of_residuals(self._fold(residuals)))


class RunBatch:
    def __init__(self, sims: list[Simulation]):
        if not sims:
            raise NotBatchable("no simulations")
        reason = why_not_batchable(sims)
        if reason:
            raise NotBatchable(reason)
        first = sims[0]
        self.sims = sims
        self.problem, self.federation, self.algorithm = first.problem, first.federation, first.algorithm
        dtype = first.server[self.algorithm.downloads[0]].dtype
        self.per_run = {k: torch.tensor([float(s.algorithm.hp[k]) for s in sims], dtype=dtype, device=self.problem.device)
                        for k in type(self.algorithm).run_hparams
                        if any(s.algorithm.hp[k] != first.algorithm.hp[k] for s in sims)}
        if self.per_run:  # a copy whose hyperparameters that differ are the live runs' values (`_hparams_of`)
            self.per_run.update({name: _run_values([getattr(s.algorithm, name) for s in sims], dtype,
                                                   self.problem.device) for name in self.algorithm.run_derived})
            self.algorithm = copy.copy(self.algorithm)
        self.everyone = self.algorithm.participation == "all"
        self.server = {k: torch.stack([s.server[k] for s in sims]) for k in first.server}
        self.clients = {k: torch.stack([s.clients[k] for s in sims]) for k in first.clients}
        self.live = list(range(len(sims)))
        self.rounds_done = 0
        self.train_seconds = 0.0  # the whole batch's
        self._uploaded = 0  # floats each run uploaded in the last round
        # Runs per batched kernel: a local step gathers S·b rows per run; beyond GATHER_BUDGET bytes the gathered
        # batch leaves the cache and the batch runs slower than its runs one after another (spec 002's Lasso,
        # 800 KB a run: 1.2x at R = 4, 0.4x at R = 64, before `run_batch` sent such runs one after another), so
        # larger batches go through the round in chunks.
        self.chunk = max(1, GATHER_BUDGET // step_bytes(first))

    def __len__(self) -> int:
        return len(self.sims)

    # -- one round of every live run ----------------------------------------------------------------------
    def _draw(self):
        """Every live run's draws of this round on its own streams, in the order of `Simulation.run_round`."""
        lengths, clients, rows = [], [], []
        for i in self.live:
            sim = self.sims[i]
            steps = sim.algorithm.round_length(self.federation.local_steps, sim.algorithm_gen)
            c, r = sim.sampler.draw(steps, everyone=self.everyone)
            lengths.append(steps)
            clients.append(c)
            rows.append(r)
        rows = {k: torch.stack([r[k] for r in rows], 1) for k in rows[0]}  # [steps, R, S, b]
        return torch.stack(clients), rows, lengths[0], lengths  # every run's round has the federation's length

    def _step_batches(self, step_rows: dict[str, Tensor], ids: list[int]) -> Batches:
        """The oracles of one local step of the runs `ids` on their rows `[R, S, b]` of each drawn minibatch, with
        each run's minibatch noise drawn on its own stream (for problems that have noise)."""
        oracles = {}
        for mb in self.sims[0].sampler.minibatches:
            if mb.same_as is not None:
                oracles[mb.name] = oracles[mb.same_as]
                continue
            rows, noise = step_rows[mb.name], None
            if self.problem.noisy_minibatches:
                noise = torch.cat([self.problem.minibatch_noise(run_rows, self.sims[i].sampler.noise_gen)
                                   for run_rows, i in zip(rows, ids)])
            oracles[mb.name] = RunOracle(self.problem.step_oracle(rows.flatten(0, 1), noise), len(ids), rows)
        return Batches(oracles)

    def _weights(self, clients: Tensor, dtype) -> Tensor:
        if self.federation.aggregation == "uniform":
            return torch.full(clients.shape, 1.0 / clients.shape[-1], dtype=dtype, device=clients.device)
        sizes = self.problem.client_sizes[clients].to(dtype)
        return sizes / sizes.sum(-1, keepdim=True)

    def run_round(self) -> list[int]:
        """One round of every live run; the runs whose round failed (an SVD of an overflowed iterate raised
        LinAlgError) are returned: the batch then replays the round run by run on the same draws, so that
        only the failing runs fail."""
        draws = self._draw()
        # what each sampled client downloads: the server state before the round (FeDXL's pools change size in it)
        down = draws[0].shape[-1] * sum(self.server[k][0].numel() for k in self.algorithm.downloads)
        start = (self.server, self.clients)  # every chunk starts from the state before the round
        failed = []
        for first in range(0, len(self.live), self.chunk):
            positions = list(range(first, min(first + self.chunk, len(self.live))))
            try:
                self._advance(draws, positions, start)
            except torch.linalg.LinAlgError:
                for position in positions:
                    try:
                        self._advance(draws, [position], start)
                    except torch.linalg.LinAlgError:
                        failed.append(self.live[position])
        for i, n in zip(self.live, draws[-1]):
            self.sims[i].count_round(self._uploaded, down, n)
        self.rounds_done += 1
        return failed

    def _advance(self, draws, positions: list[int], start: tuple[dict, dict]) -> None:
        """The round of the live runs at `positions` (indices into `self.live`) on their draws, from their state in
        `start` (server, clients) at the round's beginning."""
        clients, rows, steps, _ = draws
        algorithm, runs = self.algorithm, len(positions)
        if runs < len(self.live):
            chosen = torch.tensor(positions, device=self.problem.device)
            clients = clients[chosen]
            rows = {k: v[:, chosen] for k, v in rows.items()}
        ids = [self.live[p] for p in positions]
        whole = runs == len(self.sims)
        live = torch.tensor(ids, device=self.problem.device)
        pick = (lambda t: t) if whole else (lambda t: t.index_select(0, live))
        server = {k: pick(v) for k, v in start[0].items()}
        state = {k: pick(v) for k, v in start[1].items()}
        run_index = torch.arange(runs, device=self.problem.device)[:, None]
        gathered = state if self.everyone else {k: v[run_index, clients] for k, v in state.items()}
        self._hparams_of(live, whole)
        rnd = Round(self.rounds_done, clients, steps, self.sims[ids[0]].iterations,
                    RunStreams(self.sims[i].algorithm_gen for i in ids))
        local = algorithm.client_init(server, gathered, rnd)
        for step in range(steps):
            local = algorithm.client_step(local, self._step_batches({k: v[step] for k, v in rows.items()}, ids),
                                          rnd, step)
        message, updated = algorithm.client_final(local, rnd)
        weights = self._weights(clients, server[algorithm.downloads[0]].dtype)
        server = algorithm.server_update(server, message, weights, rnd)
        for key, value in updated.items():
            if self.everyone:
                state[key] = value
            else:
                state[key] = state[key].clone()
                state[key][run_index, clients] = value
        if whole:
            self.server, self.clients = server, state
        else:
            self.server = {k: _rows_replaced(self.server[k], live, v) for k, v in server.items()}
            self.clients = {k: _rows_replaced(self.clients[k], live, v) for k, v in state.items()}
        self._uploaded = sum(m.numel() for m in message.values()) // runs

    def _hparams_of(self, live: Tensor, whole: bool) -> None:
        """The batch's algorithm takes the per-run hyperparameter (and derived) values of the runs it advances
        (`live`)."""
        for key, values in self.per_run.items():
            setattr(self.algorithm, key, values if whole else _runs_of(values, live))

    # -- evaluation and the loop --------------------------------------------------------------------------
    def _sync(self, i: int) -> None:
        """Run i's state onto its Simulation (views of the batch's tensors)."""
        sim = self.sims[i]
        sim.server = {k: v[i] for k, v in self.server.items()}
        sim.clients = {k: v[i] for k, v in self.clients.items()}

    def evaluate(self, runs: list[int] | None = None) -> dict[int, dict[str, float]]:
        """The rows of `runs` (default: every live run), evaluated together (`evaluate_rows`)."""
        runs = list(self.live) if runs is None else runs
        for i in runs:
            self._sync(i)
        return dict(zip(runs, evaluate_rows([self.sims[i] for i in runs])))

    def _stop(self, i: int, status: str) -> None:
        """Run i ends: its state stays on its Simulation (copied out of the batch), and it leaves the batch."""
        sim = self.sims[i]
        self._sync(i)
        sim.server = {k: v.clone() for k, v in sim.server.items()}
        sim.clients = {k: v.clone() for k, v in sim.clients.items()}
        sim.status = status
        self.live.remove(i)

    def __iter__(self) -> Iterator[tuple[int, dict[str, float]]]:
        for i, row in self.evaluate().items():
            self.sims[i].start_objective = row.get("objective")
            yield i, row
        eval_every = self.sims[0].eval_every
        while self.live and self.rounds_done < self.federation.rounds:
            start = time.perf_counter()
            failed = self.run_round()
            elapsed = time.perf_counter() - start
            self.train_seconds += elapsed
            for i in self.live:  # each run is charged its share of the batch's time
                self.sims[i].train_seconds += elapsed / len(self.live)
            for i in failed:
                self._sync(i)
                yield i, self.sims[i].evaluate(failed=True)
                self._stop(i, "diverged")
            if self.rounds_done % eval_every == 0 or self.rounds_done == self.federation.rounds:
                for i, row in self.evaluate().items():
                    if self.sims[i].exploded(row):
                        self._stop(i, "diverged")
                    yield i, row
        for i in list(self.live):
            self._stop(i, "finished")


class IterationBatch(RunBatch):
    """The run axis for rounds of random length (coin-flip communication, every device every round): the runs
    advance iteration by iteration, each through its own rounds, instead of round by round. A round-synchronous
    batch would run every round as long as the longest of R geometric lengths (about ln R times the mean); here
    no iteration is wasted.

    Every live run takes a local step at every iteration, so a run's k-th iteration is the batch's. Its rows are
    drawn ahead, for many iterations at a time (`_draw_ahead`): a round's rows are the next iterations' of the
    run's own stream, which the problem draws step after step (`Problem.draws_by_step`), so that the run draws
    exactly what it draws alone round by round, and a local step's rows are one slice of the batch's buffer.

    At each iteration, first the runs at their round's last step end their rounds: together (last step,
    client_final, server_update on the batch's rows of these runs) where the algorithm draws nothing there, else
    one by one exactly as alone (the run's own algorithm and generator, its own round index and iteration count,
    on views of the batch); then every row of the batch takes a local step at once (wasted on the rows of runs
    that just ended a round or stopped, cheaper than selecting the others); the runs that go on then draw their
    next round's length and take their local states together (client_init). A round ends for about
    R/(mean length) runs per iteration, so the batched step carries the cost. In that step an algorithm reads
    `step` only to tell the round's last step (`step == rnd.local_steps - 1`, never true there), draws nothing and
    reads neither `rnd.index` nor `rnd.iteration` (they differ between runs): `Algorithm.batchable_runs` says so.
    Per-run hyperparameters (`run_hparams`, `run_derived`) are those of the rows each call advances."""

    def __init__(self, sims: list[Simulation]):
        super().__init__(sims)
        if why := _not_iteration_wise(sims[0]):
            raise NotBatchable(why)
        sampler = sims[0].sampler
        self.rows_per_step = self.problem.num_clients * sampler.sizes[sampler.drawn[0].name]
        self.length = [0] * len(sims)
        self.iteration = 0  # the batch's iterations so far
        self.ends: dict[int, list[int]] = {}  # batch iteration -> the runs whose round's last step it is
        self.share = 0.0  # Σ over iterations of the iteration's seconds / live runs: each live run's time share
        self.settled = [0.0] * len(sims)  # `share` when each run was last charged (`_settle`)
        self.ahead: dict[str, Tensor] = {}  # [R, A, S, b]: each run's rows of the iterations `drawn` to `drawn + A`
        self.ahead_steps = max(1, STREAM_BYTES // (8 * self.rows_per_step * len(sims)))  # A
        self.drawn = 0
        self.ids = list(range(len(sims)))
        self.every = torch.arange(len(sims), device=self.problem.device)
        self.local: dict[str, Tensor] = {}
        self.clients_all = torch.arange(self.problem.num_clients, device=self.problem.device)
        self.inside = Round(-1, self.clients_all.expand(len(sims), -1), 2, -1, None)  # step 0 is not the last

    def _round_of(self, i: int) -> Round:
        sim = self.sims[i]
        return Round(sim.rounds_done, self.clients_all, self.length[i], sim.iterations, sim.algorithm_gen)

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

    def _open_rounds(self, opening: list[int]) -> None:
        """The next round of each run in `opening`: its length on its own stream (as alone); then their local
        states together (client_init on the batch's rows of these runs: it reads neither `rnd.index` nor
        `rnd.iteration`, as the batched steps). Their first step is the next iteration."""
        for i in opening:
            sim = self.sims[i]
            steps = sim.algorithm.round_length(self.federation.local_steps, sim.algorithm_gen)
            self.length[i] = steps
            self.ends.setdefault(self.iteration + steps - 1, []).append(i)
        runs = torch.tensor(opening, device=self.problem.device)
        rnd = Round(-1, self.clients_all.expand(len(opening), -1), 2, -1, None)
        self._hparams_of(runs, whole=False)
        local = self.algorithm.client_init({k: v.index_select(0, runs) for k, v in self.server.items()},
                                           {k: v.index_select(0, runs) for k, v in self.clients.items()}, rnd)
        for key, value in local.items():
            if key not in self.local:
                self.local[key] = value.new_zeros(len(self.sims), *value.shape[1:])
            self.local[key].index_copy_(0, runs, value)

    def _settle(self, i: int) -> None:
        """Run i's share of the batch's seconds since it was last charged, onto its training seconds."""
        self.sims[i].train_seconds += self.share - self.settled[i]
        self.settled[i] = self.share

    def _end_rounds(self, ending: list[int], rows: dict[str, Tensor]) -> None:
        """The last local step, client_final and server_update of the runs in `ending`, together (a round's last
        step of 1: step 0), for algorithms that draw nothing there; one by one (`_end_round`) for the others."""
        if self.algorithm.draws_at_round_end:
            for i in ending:
                self._end_round(i, {name: value[i].unsqueeze(0) for name, value in rows.items()})
            return
        runs = torch.tensor(ending, device=self.problem.device)
        self._hparams_of(runs, whole=False)
        local = {k: v.index_select(0, runs) for k, v in self.local.items()}
        server = {k: v.index_select(0, runs) for k, v in self.server.items()}
        clients = self.clients_all.expand(len(ending), -1)
        rnd = Round(-1, clients, 1, -1, None)
        oracles = self._step_batches({name: value.index_select(0, runs) for name, value in rows.items()}, ending)
        local = self.algorithm.client_step(local, oracles, rnd, 0)
        message, updated = self.algorithm.client_final(local, rnd)
        weights = self._weights(clients, server[self.algorithm.downloads[0]].dtype)
        server = self.algorithm.server_update(server, message, weights, rnd)
        for key, value in server.items():
            self.server[key].index_copy_(0, runs, value)
        for key, value in updated.items():
            self.clients[key].index_copy_(0, runs, value)
        up = sum(m.numel() for m in message.values()) // len(ending)
        down = len(self.clients_all) * sum(server[k][0].numel() for k in self.algorithm.downloads)
        for i in ending:
            self.sims[i].count_round(up, down, self.length[i])

    def _end_round(self, i: int, step_rows: dict[str, Tensor]) -> None:
        """Run i's last local step on its rows `[1, S, b]`, client_final and server_update, as
        `Simulation.run_round` does them (with the run's own algorithm, its hyperparameters floats)."""
        sim, algorithm = self.sims[i], self.sims[i].algorithm
        self._sync(i)
        local = {k: v[i] for k, v in self.local.items()}
        rnd = self._round_of(i)
        local = algorithm.client_step(local, sim.sampler.step_batches(step_rows, 0), rnd, self.length[i] - 1)
        message, updated = algorithm.client_final(local, rnd)
        server = algorithm.server_update(sim.server, message, sim.aggregation_weights(self.clients_all), rnd)
        for key, value in server.items():
            self.server[key][i] = value
        for key, value in updated.items():
            self.clients[key][i] = value
        down = len(self.clients_all) * sum(server[k].numel() for k in self.algorithm.downloads)
        sim.count_round(sum(m.numel() for m in message.values()), down, self.length[i])

    def _stop(self, i: int, status: str) -> None:
        """As `RunBatch._stop`; the run's rows then take a live run's values, so that the batch, which steps every
        row, stays finite whatever the stopped run's iterate was."""
        self._settle(i)
        super()._stop(i, status)
        if self.live:
            donor = self.live[0]
            for state in (self.local, self.server, self.clients):
                for key in state:
                    state[key][i] = state[key][donor]

    def __iter__(self) -> Iterator[tuple[int, dict[str, float]]]:
        """Each iteration: the runs at their round's last step end their rounds; then every row takes a local
        step (wasted on the rows of runs that just ended a round or stopped: cheaper than selecting the others);
        the ended rounds are evaluated on schedule and the next ones drawn and opened."""
        for i, row in self.evaluate().items():
            self.sims[i].start_objective = row.get("objective")
            yield i, row
        if self.federation.rounds == 0:
            for i in list(self.live):
                self._stop(i, "finished")
            return
        start = time.perf_counter()
        self._draw_ahead()
        self._open_rounds(list(self.live))
        self.share += (time.perf_counter() - start) / len(self.live)
        eval_every, rounds = self.sims[0].eval_every, self.federation.rounds
        while self.live:
            start = time.perf_counter()
            ending = self.ends.pop(self.iteration, [])
            rows = self._step_rows()
            if ending:
                self._end_rounds(ending, rows)
            if len(ending) < len(self.live):
                self._hparams_of(self.every, whole=True)
                self.local = self.algorithm.client_step(self.local, self._step_batches(rows, self.ids), self.inside, 0)
            self.iteration += 1
            elapsed = time.perf_counter() - start
            self.train_seconds += elapsed
            self.share += elapsed / len(self.live)
            due = self.evaluate([i for i in ending if self.sims[i].rounds_done % eval_every == 0
                                 or self.sims[i].rounds_done == rounds])
            opening = []
            for i in ending:
                sim = self.sims[i]
                if i in due:
                    self._settle(i)
                    if sim.exploded(due[i]):
                        self._stop(i, "diverged")
                    yield i, due[i]
                if i not in self.live:
                    continue
                if sim.rounds_done == rounds:
                    self._stop(i, "finished")
                else:
                    opening.append(i)
            if opening:
                start = time.perf_counter()
                self._open_rounds(opening)
                self.share += (time.perf_counter() - start) / len(self.live)


def one_program(sims: list[Simulation]) -> bool:
    """Whether `run_batch` runs these (batchable) simulations as one program, rather than one after another: more
    than one, and not memory-bound (`MEMORY_BOUND_RUN_BYTES`)."""
    return len(sims) > 1 and step_bytes(sims[0]) <= MEMORY_BOUND_RUN_BYTES


def run_batch(sims: list[Simulation]) -> Iterable[tuple[int, dict[str, float]]]:
    """The batch for these simulations: iteration by iteration where rounds have random lengths and every client
    takes part (`IterationBatch`), else round by round (`RunBatch`). One simulation runs alone (the same rows,
    without the batch's selections), and so do, one after another, runs whose local steps are memory-bound
    (`MEMORY_BOUND_RUN_BYTES`)."""
    if not one_program(sims):
        return ((i, row) for i, sim in enumerate(sims) for row in sim)
    return (IterationBatch if _random_rounds(type(sims[0].algorithm)) else RunBatch)(sims)


def run_seeds(problem, algorithm_name: str, federation, seeds, eval_every: int = 10,
              **hyperparameters) -> list[list[dict[str, float]]]:
    """The rows of one algorithm run with each of `seeds` on `problem`, as one program (runs alone where the
    algorithm is not written for the run axis): `run_seeds(...)[k]` is seed k's curve."""
    seeds = list(seeds)
    sims = [Simulation(problem, ALGORITHMS[algorithm_name](problem, **hyperparameters), federation, seed, eval_every)
            for seed in seeds]
    if why_not_batchable(sims):
        return [list(sim) for sim in sims]
    rows: list[list[dict[str, float]]] = [[] for _ in seeds]
    for i, row in run_batch(sims):
        rows[i].append(row)
    return rows
