"""The engine: one round loop over R ≥ 1 runs, each with its own random streams, as one batched tensor program.

R simulations of one algorithm with one configuration on one problem instance (the same data), differing in their
seeds (initial point, client sampling, minibatches, the algorithm's coins) and in their float hyperparameters,
advance as one program; a run alone is R = 1 through the same code:

    sims = [Simulation(problem, FedMiD(problem, client_lr=lr), federation, seed) for seed, lr in ...]
    for run, row in run_batch(sims):  # each run's rows, exactly as `for row in sims[run]` would yield them
        ...
    sims[run].status                  # 'finished' or 'diverged', per run

* Draws. Every run keeps its own `Simulation` (its record: streams, counters, status), whose generators draw on the
  host exactly what the run draws alone (round length, clients, minibatch rows), in the same order; only the
  arithmetic is batched. An algorithm's own draws go through `Round.draw`, bound to each run's stream.
* Layout (`fedbench.algorithms.base`). Server state `[R, 1, ...]`, per-client state `[R, N, ...]`, a round's local
  state `[R, S, ...]`, float hyperparameters and derived values `[R, 1, 1]` (`batch_hparams`). The problem's oracles
  see the run axis folded into the client axis (`RunOracle`, for any oracle method), so problems need nothing new.
* Schedules. Rounds of fixed length (or of a drawn length, for one run) advance round by round (`RoundProgram`). Rounds
  of random length where every client takes part (coin-flip communication, Hanzely et al.'s block methods) advance
  iteration by iteration, each run through its own rounds (`IterationProgram`): round-synchronous runs would each
  wait for the longest of R geometric lengths, about ln R times the mean. Which runs share one: `fedbench.planning`.
* Hyperparameter schedules (`fedbench.schedules`). A scheduled hyperparameter's value at each run's round is handed
  to the round's functions as a float's, `[R, 1, 1]` (`RoundProgram._at_rounds`, which the round-wise and the
  iteration-wise programs both call); runs whose schedules differ share a program as runs whose floats differ do.
* Divergence. A run that diverges stops, as alone: its partial curve is kept, its final state is stored on its
  Simulation, and it leaves the batched arithmetic. A round in which an SVD fails (an iterate that overflowed
  between two evaluations) is replayed run by run on the same draws: the runs whose SVD fails end diverged there.
* Evaluation. On the same schedule as alone, the runs due together in one `Problem.evaluate_runs` call.
* Links. The federation's uplink and downlink transforms act between the algorithm's steps, on what crosses the
  network (`fedbench.links`: receive before client_init, send between client_final and server_update, commit
  after the round is written); without chains they hand everything through.
* Server optimizer (`fedbench.server_optimizers`). Between the links' `send` and the algorithm's `server_update`, the
  federation's server optimizer replaces every client's update of `w` by its step on their mean; its state is
  written with the links' at the round's end.
* Participation and uneven local work (`fedbench.participation`). Where the number of a round's participants varies,
  its clients keep S slots and a mask `[R, S]` of those that take part: the engine makes an absent slot count for
  nothing (zero weight, a zero upload, its per-client and link state kept, a run without participants keeping its
  server state; no host sync: the mask is drawn on the host). Where each participant takes its own number of local
  steps, the round runs the longest count of its runs, and a client past its own keeps its local state
  (`torch.where` on every entry with a client axis); each run draws the rows of its own longest count, and the batch
  pads a shorter run's with its last step's, which its clients never use.

Why explicit and not `torch.func.vmap` over runs (tried first): on this CPU vmap costs ~2x per elementwise op and
~30x per gather (index_select with a batched index: 380 µs against 12 µs), where the runs of Hanzely et al.'s
problems are streams of ~10 µs ops; the explicit layout's ops on `[R, S, d]` cost about what `[S, d]` costs.
Identity of a run in a batch with the run alone: bit for bit where the batched kernels reduce in the same order,
else within 1e-12 relative; `tests/test_runs.py` per algorithm.
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

import torch
from torch import Tensor

from fedbench.algorithms.base import HParams, Round, upload_floats
from fedbench.compiling import compiled, compiles
from fedbench.federation import Draw, aggregation_weights, step_oracles
from fedbench.links import Links
from fedbench.oracle import Batches
from fedbench.planning import groups, not_iteration_wise, random_rounds, step_bytes, why_not_batchable
from fedbench.server_optimizers import ServerSteps

if TYPE_CHECKING:  # a program's runs; `fedbench.simulate` drives them through programs, so it imports this module
    from fedbench.simulate import Simulation

GATHER_BUDGET = 4 * 2**20  # bytes of minibatch rows one batched local step gathers (see RoundProgram.chunk)
STREAM_BYTES = 2**20  # rows of the iterations an iteration-wise program draws ahead for all its runs at a time
HP_RANK = 3  # float hyperparameters are [R, 1, 1]: they broadcast against [R, 1, d] and [R, S, d]
UNEVEN = "in a round of uneven local work (each client's own count: rnd.client_steps)"
Counted = TypeVar("Counted")  # what `RoundProgram._counted` remembers


class NotBatchable(ValueError):
    """These simulations cannot run as one program (the message says why)."""


def _is_float(value: Any) -> bool:
    return isinstance(value, float)


def _per_run(values: list, dtype: torch.dtype, device) -> Any:
    """The runs' values of one hyperparameter or derived value: floats as a `[R, 1, 1]` tensor (`[1, 1, 1]` where
    every run has the same value: it broadcasts alike, and selecting runs then costs nothing), a dataclass of floats
    as the dataclass of such tensors, anything else the first run's (the runs share it, `why_not_batchable`)."""
    first = values[0]
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return dataclasses.replace(first, **{f.name: _per_run([getattr(v, f.name) for v in values], dtype, device)
                                             for f in dataclasses.fields(first)})
    if _is_float(first):
        return torch.tensor(values if len(set(values)) > 1 else values[:1], dtype=dtype,
                            device=device).view(-1, *[1] * (HP_RANK - 1))
    return first


def batch_hparams(sims: list[Simulation], dtype: torch.dtype, device) -> HParams:
    """The hyperparameters and derived values of these runs, as a round's functions receive them."""
    return HParams({key: _per_run([sim.algorithm.hp[key] for sim in sims], dtype, device)
                    for key in sims[0].algorithm.hp})


def _differs(value: Any) -> bool:
    """Whether a per-run value (`_per_run`) differs between runs."""
    if isinstance(value, Tensor):
        return value.shape[0] > 1
    return dataclasses.is_dataclass(value) and any(_differs(getattr(value, f.name))
                                                   for f in dataclasses.fields(value))


def _rows_of(value: Any, runs: Tensor) -> Any:
    """The rows `runs` of a per-run value that differs between runs (`_differs`)."""
    if isinstance(value, Tensor):
        return value.index_select(0, runs) if value.shape[0] > 1 else value
    return dataclasses.replace(value, **{f.name: _rows_of(getattr(value, f.name), runs)
                                         for f in dataclasses.fields(value)})


def _rows(state: dict[str, Tensor], group: list[int], runs: Tensor) -> dict[str, Tensor]:
    """The rows of the runs `group` (`runs` as a tensor) of each entry: a view for one run, else a copy. Writing
    through such a view (L2SGD+ updates its SAGA table in place) touches only the rows of a round that is ending,
    which the engine writes back or opens anew."""
    if len(group) == 1:
        return {k: v[group[0]: group[0] + 1] for k, v in state.items()}
    return {k: v.index_select(0, runs) for k, v in state.items()}


def _write_rows(state: dict[str, Tensor], values: dict[str, Tensor], group: list[int], runs: Tensor) -> None:
    """The rows of the runs `group` of each entry of `state` set to `values` (a value that is the row itself, a view
    `_rows` gave and the round left unchanged, stays)."""
    for key, value in values.items():
        if len(group) == 1:
            row = state[key][group[0]: group[0] + 1]
            if row.data_ptr() != value.data_ptr():
                row.copy_(value)
        else:
            state[key].index_copy_(0, runs, value)


def _no_noise(rows: Tensor) -> None:
    return None


def _rows_replaced(held: Tensor, runs: Tensor, values: Tensor) -> Tensor:
    """`held` `[R, ...]` with the rows of `runs` replaced by `values`; where the round changed the entry's shape
    (FeDXL's score pools go from every sample's score to the last rounds' records), the other rows are zeros
    until their own chunk of the round writes them (a run that has left the batch keeps its state on its
    Simulation)."""
    if held.shape[1:] != values.shape[1:]:
        held = values.new_zeros(len(held), *values.shape[1:])
    return held.index_copy(0, runs, values)


def _failing_alone(units: list[int], alone: Callable[[int], None]) -> list[int]:
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


def _stacked(tensors: list[Tensor], dim: int = 0) -> Tensor:
    """The runs' tensors on a new run axis `dim` (a view for one run)."""
    return tensors[0].unsqueeze(dim) if len(tensors) == 1 else torch.stack(tensors, dim)


def _along(mask: Tensor, value: Tensor) -> Tensor:
    """A mask `[R, S]` viewed to broadcast against `value` `[R, S, ...]`."""
    return mask.view(*mask.shape, *[1] * (value.dim() - mask.dim()))


def _client_rows(value: Tensor, mask: Tensor) -> bool:
    """Whether `value` has the run and client axes of `mask` `[R, S]` (a client's entry, not a shared `[R, 1, ...]`)."""
    return value.shape[:2] == mask.shape


def _step_taken(local: dict[str, Tensor], stepped: dict[str, Tensor], active: Tensor) -> dict[str, Tensor]:
    """The local state after a step that only the clients within their count (`active` `[R, S]`) take: each entry with
    a client axis keeps the other clients' rows of `local`."""
    return {key: torch.where(_along(active, value), value, local[key])
            if key in local and _client_rows(value, active) and local[key].shape == value.shape else value
            for key, value in stepped.items()}


@dataclasses.dataclass
class RoundDraws:
    """The live runs' draws of one round, batched (`RoundProgram._draw`): their `Draw`s stacked on a run axis."""

    clients: Tensor  # [R, S], on the device
    rows: dict[str, Tensor]  # [steps, R, S, b] per drawn minibatch
    steps: int  # the local steps the round runs: the longest of its runs'
    lengths: list[int]  # each run's own (its iterations grow by it)
    participants: list[int]  # each run's participants, on the host (S where every slot takes part)
    present: Tensor | None = None  # [R, S] bool on the device: the slots that hold a participant (None: all)
    counts: Tensor | None = None  # [R, S] on the device: each slot's local steps under uneven local work
    least: int = 0  # the fewest local steps of any slot: every client takes the steps before it

    @classmethod
    def of(cls, draws: list[Draw], device) -> RoundDraws:
        lengths = [draw.steps for draw in draws]
        steps = max(lengths)
        if draws[0].counts is None and min(lengths) != steps:
            raise NotBatchable("runs of one round-wise program drew rounds of different lengths")
        rows = {k: _stacked([_padded(draw.rows[k], steps) for draw in draws], 1) for k in draws[0].rows}
        present, counts, least = _stacked_masks(draws, "present"), _stacked_masks(draws, "counts"), steps
        participants = [len(draws[0].clients)] * len(draws) if present is None else present.sum(-1).tolist()
        if counts is not None:
            least = int(counts.min())
        return cls(_stacked([draw.clients for draw in draws]), rows, steps, lengths, participants,
                   None if present is None else present.to(device), None if counts is None else counts.to(device),
                   least)

    def select(self, positions: list[int], device) -> RoundDraws:
        """The draws of the runs at `positions` (indices into the batch's runs)."""
        chosen = torch.tensor(positions, device=device)
        pick = lambda value: None if value is None else value[chosen]  # noqa: E731
        return RoundDraws(self.clients[chosen], {k: v[:, chosen] for k, v in self.rows.items()}, self.steps,
                          [self.lengths[p] for p in positions], [self.participants[p] for p in positions],
                          pick(self.present), pick(self.counts), self.least)


def _stacked_masks(draws: list[Draw], name: str) -> Tensor | None:
    """The runs' `present` or `counts` `[R, S]` on the host (None where the draws have none)."""
    values = [getattr(draw, name) for draw in draws]
    return None if values[0] is None else _stacked(values)


def _padded(rows: Tensor, steps: int) -> Tensor:
    """A run's rows `[L, S, b]` of a round of `steps` ≥ L steps: its last step's again in the steps it does not take
    (its clients are past their counts there: never used)."""
    if len(rows) == steps:
        return rows
    return torch.cat([rows, rows[-1:].expand(steps - len(rows), *rows.shape[1:])])


class RunOracle:
    """A problem's oracle of R runs' minibatches, lifted over the run axis for every method it has: tensor
    arguments `[R, S, ...]` are folded to the `[R·S, ...]` the problem's oracle of the flattened batch answers (a
    point shared by a run's clients, `[R, 1, ...]`, expanded to each client first), tensor answers unfolded, and a
    function argument (a surrogate loss) sees unfolded tensors and gives folded ones. `loss`, `grad` and `hvp`,
    which every oracle has and every local step calls, take a shorter path to the same result (the generic one
    costs ~8 µs a call, ~10% of a Lasso step at p = 1024)."""

    def __init__(self, inner, count: int, clients: int):
        self.inner, self.count, self.clients = inner, count, clients  # R runs of S clients

    def _fold(self, x: Any) -> Any:
        if isinstance(x, Tensor):
            if x.dim() >= 2 and x.shape[0] == self.count:
                if x.shape[1] == 1 and self.clients > 1:
                    x = x.expand(self.count, self.clients, *x.shape[2:])
                return x.flatten(0, 1)
            return x
        if callable(x):
            return lambda *args: self._fold(x(*[self._unfold(a) for a in args]))
        return x

    def _unfold(self, x: Any) -> Any:
        if isinstance(x, Tensor):
            return x.view(self.count, -1, *x.shape[1:])
        if isinstance(x, tuple):
            return tuple([self._unfold(item) for item in x])
        return x

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if not callable(value):
            return self._unfold(value)
        count, clients, fold, unfold = self.count, self.clients, self._fold, self._unfold

        def lifted(*args, **kwargs):
            # `_fold` and `_unfold` inline for the usual arguments (`[R, S, ...]` tensors, and points `[R, 1, ...]`
            # a run's clients share), flags, and the usual answer (a tuple of tensors): this runs at every step
            folded = []
            for a in args:
                if isinstance(a, Tensor) and a.dim() >= 2 and a.shape[0] == count:
                    if a.shape[1] == 1 and clients > 1:
                        a = a.expand(count, clients, *a.shape[2:])
                    folded.append(a.flatten(0, 1))
                else:
                    folded.append(fold(a))
            if kwargs:
                kwargs = {k: v if isinstance(v, (bool, int, float)) else fold(v) for k, v in kwargs.items()}
            out = value(*folded, **kwargs)
            if isinstance(out, tuple):
                return tuple([a.view(count, -1, *a.shape[1:]) if isinstance(a, Tensor) else unfold(a) for a in out])
            return unfold(out)
        self.__dict__[name] = lifted  # the next call of this oracle's method (ASVRCD makes two a step) skips the lookup
        return lifted

    def _point(self, w: Tensor) -> Tensor:
        if w.shape[1] != self.clients:
            w = w.expand(self.count, self.clients, *w.shape[2:])
        return w.flatten(0, 1)

    def loss(self, w: Tensor) -> Tensor:
        return self.inner.loss(self._point(w)).view(self.count, self.clients)

    def grad(self, w: Tensor) -> Tensor:
        point = w.flatten(0, 1) if w.shape[1] == self.clients else self._point(w)
        return self.inner.grad(point).view(w.shape[0], self.clients, *w.shape[2:])

    def hvp(self, w: Tensor, v: Tensor) -> Tensor:
        return self.inner.hvp(self._point(w), self._point(v)).view(w.shape[0], self.clients, *w.shape[2:])


class RoundProgram:
    """The round-wise schedule: every live run through one round at a time, rounds of the federation's length (or,
    for one run, of its drawn length)."""

    def __init__(self, sims: list[Simulation]):
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
        self.differing = [key for key, value in self.hp.items() if _differs(value)]  # selected per sub-batch
        self._hp_alone: dict[int, HParams] = {}  # `_hp_of` one run
        self.scheduled = list(self.algorithm.schedules)  # hyperparameters that follow a schedule (`_at_rounds`)
        self.everyone = self.algorithm.participation == "all"
        given = self.federation.local_steps
        self.local_steps = given if isinstance(given, int) else None  # E; None: each participant its own (uneven)
        self.minibatches = first.sampler.minibatches
        self.compiled = compiles(sims)  # whether its local steps run compiled (`fedbench.compiling`)
        self.local_step = compiled(self._local_step) if self.compiled else self._local_step
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
        self.server = {k: _stacked([s.server[k] for s in self.sims]).unsqueeze(1) for k in self.sims[0].server}
        self.clients = {k: _stacked([s.clients[k] for s in self.sims]) for k in self.sims[0].clients}
        self.rounds_done = self.sims[0].rounds_done

    # -- what every schedule shares -----------------------------------------------------------------------
    def _hp_of(self, ids: list[int], runs: Tensor | None) -> HParams:
        """The per-run values of the runs `ids` (`runs` as a tensor; None: every run of the batch). A run's own
        are kept: an iteration-wise program asks for them at each of its round ends."""
        if runs is None or not self.differing:
            return self.hp
        if len(ids) == 1 and ids[0] in self._hp_alone:
            return self._hp_alone[ids[0]]
        hp = HParams({**self.hp, **{k: _rows_of(self.hp[k], runs) for k in self.differing}})
        if len(ids) == 1:
            self._hp_alone[ids[0]] = hp
        return hp

    def _at_rounds(self, hp: HParams, ids: list[int]) -> HParams:
        """`hp` of the runs `ids` with each scheduled hyperparameter's value at each run's current round
        (`fedbench.schedules`), as a float's (`_per_run`); `hp` itself where nothing follows a schedule. Computed on
        the host from each run's own schedule and round counter, so that a run's values are the same alone and in a
        batch."""
        if not self.scheduled:
            return hp
        rounds = self.federation.rounds
        return HParams({**hp, **{name: _per_run([self.sims[i].algorithm.schedules[name].value(
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
            return _no_noise
        gens = [self.sims[i].sampler.noise_gen for i in ids]
        if len(gens) == 1:
            return lambda rows: self.problem.minibatch_noise(rows, gens[0])
        return lambda rows: torch.cat([self.problem.minibatch_noise(run_rows, gen)  # type: ignore[misc]  # noisy: no None
                                       for run_rows, gen in zip(rows.view(len(gens), -1, rows.shape[-1]), gens)])

    def _weights(self, clients: Tensor, present: Tensor | None = None) -> Tensor:
        """The server's weights `[R, S]` over each run's sampled clients `clients` `[R, S]` (those of the slots
        `present`, where only those take part)."""
        return aggregation_weights(self.problem, self.federation, clients, self.dtype, present)

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
        return RoundDraws.of(draws, self.device)

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
                failed += [self.live[p] for p in _failing_alone(positions, lambda p: self._advance(draws, [p], start))]
        down_bits = self.links.catch_up(self.live, draws.clients, draws.present, draws.participants, messages)
        for i, taking, length, bits in zip(self.live, draws.participants, draws.lengths, down_bits):
            self.sims[i].count_round(_times(self._uploaded, taking), (down * taking, bits), length)
        self.rounds_done += 1
        return failed

    def _advance(self, draws: RoundDraws, positions: list[int], start: tuple[dict, dict]) -> None:
        """The round of the live runs at `positions` (indices into `self.live`) on their draws, from their state in
        `start` (server, clients) at the round's beginning."""
        algorithm, count = self.algorithm, len(positions)
        if count < len(self.live):
            draws = draws.select(positions, self.device)
        clients, rows, present, counts = draws.clients, draws.rows, draws.present, draws.counts
        ids = [self.live[p] for p in positions]
        whole = count == len(self.sims)
        live = None if whole else torch.tensor(ids, device=self.device)
        server = start[0] if whole else {k: v.index_select(0, live) for k, v in start[0].items()}
        state = start[1] if whole else {k: v.index_select(0, live) for k, v in start[1].items()}
        run_index = torch.arange(count, device=self.device)[:, None] if state and not self.everyone else None
        gathered = state if run_index is None else {k: v[run_index, clients] for k, v in state.items()}
        hp = self._at_rounds(self._hp_of(ids, live), ids)
        sim = self.sims[ids[0]]
        if counts is None:
            rnd = Round(clients, sim.rounds_done, draws.steps, sim.iterations, streams=self._streams(ids))
        else:
            rnd = Round(clients, sim.rounds_done, streams=self._streams(ids), where=UNEVEN,
                        client_steps=counts.to(self.dtype).unsqueeze(-1))
        received = self.links.receive(server, ids)
        local = algorithm.client_init(received, gathered, rnd, hp)
        names, noise, sampled = list(rows), self._noise(ids), clients.shape[1]
        # each step's rows `[R, S, b]` (or `[R·S, b]`, `_layout`), sliced in one call per minibatch. A step's
        # oracles are freed as the step ends, before the next step gathers its minibatch: the allocator then hands
        # the next gather the block still in cache (a Lasso step at p = 1024 gathers 800 KB; its gathers took ~10%
        # longer otherwise)
        for step, step_rows in enumerate(zip(*[v.unbind(0) for v in self._layout(rows).values()])):
            stepped = self.local_step(local, dict(zip(names, step_rows)), count, sampled, noise, rnd.at(step), hp)
            local = stepped if counts is None or step < draws.least else _step_taken(local, stepped, counts > step)
        message, updated = algorithm.client_final(local, rnd, hp)
        self._uploaded = self._uploaded_by(message)
        message = self.links.send(message, server, received, clients, present)
        weights = self._weights(clients, present)
        if self.server_steps:
            message = self.server_steps.step(message, server, weights, ids, present)
        if present is None:
            server = algorithm.server_update(server, message, weights, rnd, hp)
        else:
            server = self._update_present(server, message, weights, rnd, hp, draws)
            updated = {k: torch.where(_along(present, v), v, gathered[k]) for k, v in updated.items()}
        # The scatter comes last, after everything that may raise: a replayed chunk finds its rows as they were.
        for key, value in updated.items():
            if self.everyone:
                state[key] = value
            else:
                state[key][run_index, clients] = value
        if live is None:  # whole
            self.server, self.clients = server, state
        else:
            self.server = {k: _rows_replaced(self.server[k], live, v) for k, v in server.items()}
            self.clients = {k: _rows_replaced(self.clients[k], live, v) for k, v in state.items()}
        self._commit()

    def _commit(self) -> None:
        """The round of the runs in progress has succeeded: the links' and the server optimizer's new state written."""
        self.links.commit()
        if self.server_steps:
            self.server_steps.commit()

    def _update_present(self, server: dict[str, Tensor], message: dict[str, Tensor], weights: Tensor, rnd: Round,
                        hp: HParams, draws: RoundDraws) -> dict[str, Tensor]:
        """The server's update from the participants of the slots `draws.present` alone: the other slots' uploads are
        zeros and their weights zero (`weights`, `aggregation_weights`), and a run without participants keeps its
        state."""
        present = draws.present
        assert present is not None  # a round of a varying number of participants
        message = {k: torch.where(_along(present, v), v, 0.0) if _client_rows(v, present) else v
                   for k, v in message.items()}
        updated = self.algorithm.server_update(server, message, weights, rnd, hp)
        if min(draws.participants) > 0:
            return updated
        anyone = present.any(-1).view(-1, 1)  # [R, 1]
        return {k: torch.where(_along(anyone, v), v, server[k]) for k, v in updated.items()}

    # -- checkpoints ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What the program needs to go on as if it had never stopped, at a safe point (`safe_point`): its state and
        counters, and each run's record (`Simulation.state_dict`: streams, counters, status, a stopped run's
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
        """Run i's state onto its Simulation (views of the batch's tensors, without the run axis)."""
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
        """The runs `failed`, whose computation failed alone (`_failing_alone`), end diverged, each with a row of
        NaN metrics. Both schedules keep their books here."""
        rows = []
        for i in failed:
            self.sync_run(i)
            rows.append((i, self.sims[i].evaluate(failed=True)))
            self._stop(i, "diverged")
        return rows

    def _stop(self, i: int, status: str) -> None:
        """Run i ends: its state stays on its Simulation (copied out of the batch), and it leaves the batch."""
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

    def __init__(self, sims: list[Simulation]):
        super().__init__(sims)
        if why := not_iteration_wise(sims[0]):
            raise NotBatchable(why)
        assert self.local_steps is not None  # every client takes part: no uneven local work (`check_algorithm`)
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
        received = self.links.receive(_rows(self.server, opening, runs), opening)
        local = self.algorithm.client_init(received, _rows(self.clients, opening, runs), self._round(opening),
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
                failed += _failing_alone(group, lambda i: self._end_round([i], rows))
        return failed

    def _end_round(self, group: list[int], rows: dict[str, Tensor]) -> None:
        runs = torch.tensor(group, device=self.device)
        hp = self._at_rounds(self._hp_of(group, runs), group)
        local, server = _rows(self.local, group, runs), _rows(self.server, group, runs)
        rnd = self._round(group, ending=True)
        local = self.local_step(local, self._layout(_rows(rows, group, runs)), len(group), len(self.clients_all),
                                self._noise(group), rnd, hp)
        message, updated = self.algorithm.client_final(local, rnd, hp)
        up = _times(self._uploaded_by(message), len(self.clients_all))
        message = self.links.send(message, server, self.links.received(server, group), rnd.clients)
        weights = self._weights(rnd.clients)
        if self.server_steps:
            message = self.server_steps.step(message, server, weights, group)
        server = self.algorithm.server_update(server, message, weights, rnd, hp)
        _write_rows(self.server, server, group, runs)
        _write_rows(self.clients, updated, group, runs)
        self._commit()
        down, messages = self._downloaded()
        down_bits = self.links.catch_up(group, self.clients_all.expand(len(group), -1), None,
                                        [len(self.clients_all)] * len(group), messages)
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
        local = self.local_step(_rows(self.local, [i], run), self._layout(_rows(rows, [i], run)), 1,
                                len(self.clients_all), self._noise([i]), inside,
                                self._at_rounds(self._hp_of([i], run), [i]))
        _write_rows(self.local, local, [i], run)

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
                    failed += _failing_alone(stepping, lambda i: self._step_run(i, rows))
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


def _times(counted: tuple[int, int], clients: int) -> tuple[int, int]:
    """Floats and bits of `clients` clients, from those of one."""
    return counted[0] * clients, counted[1] * clients


def program(sims: list[Simulation]) -> RoundProgram:
    """The program of these simulations: iteration by iteration where rounds have random lengths and every client
    takes part (`IterationProgram`), else round by round (`RoundProgram`; a run alone too)."""
    if len(sims) > 1 and random_rounds(type(sims[0].algorithm)):
        return IterationProgram(sims)
    return RoundProgram(sims)


def programs(sims: list[Simulation]) -> list[tuple[list[int], RoundProgram]]:
    """The programs these simulations run in, each with the indices of its runs, as the planner groups them
    (`fedbench.planning.groups`: one for all of them where they can share one, else one per run)."""
    return [(runs, program([sims[i] for i in runs])) for runs in groups(sims)]


def evaluate_rows(sims: list[Simulation], failed: bool = False) -> list[dict[str, float]]:
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
