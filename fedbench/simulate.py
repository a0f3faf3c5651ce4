"""A run: its federation, its random draws (`RoundSampler`) and its record (`Simulation`); the round loop that
advances runs is `fedbench.runs`.

    sim = Simulation(problem, FedMiD(problem, client_lr=1e-3), Federation(2000, 10, 10, 10), seed=0)
    for row in sim:            # {'round': r, metric: value, ...} every `eval_every` rounds
        ...
    sim.status                 # 'finished' or 'diverged'

Random streams (see `fedbench.rng`): "init" (initial point), "clients" (who is sampled each round),
"minibatches" (local minibatches), the algorithm's own (`Algorithm.random_stream`, default "algorithm":
coins, round lengths); the problem's data use its own "data" stream. Evaluation draws from none of them,
so the curve's schedule (`eval_every`) never changes a run.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import torch
from torch import Tensor

from fedbench.algorithms.base import Algorithm
from fedbench.hparams import Param, ParamError
from fedbench.oracle import Batches, Minibatch
from fedbench.problems.base import Layout, Problem
from fedbench.rng import generator

if TYPE_CHECKING:
    from fedbench.runs import RunBatch

DIVERGENCE_FACTOR = 1e4


@dataclass(frozen=True)
class Federation:
    rounds: int = 100
    clients_per_round: int = 10
    local_steps: int = 10
    batch_size: int = 10
    aggregation: str = "uniform"  # "uniform": π̂_k = 1/S; "samples": π̂_k ∝ n_k over the sampled set

    params = (
        Param("rounds", "int", 100, "communication rounds R", low=0),
        Param("clients_per_round", "int", 10, "clients sampled per round S (0: every client, whatever their number)",
              low=0),
        Param("local_steps", "int", 10, "local steps E per round (an algorithm may draw its rounds' lengths)",
              low=1),
        Param("batch_size", "int", 10, "minibatch size b", low=1),
        Param("aggregation", "choice", "uniform", "server weights over the sampled clients",
              choices=("uniform", "samples")),
    )

    def check(self, layout: Layout, batch_sizes: Mapping[str, int] | None = None) -> None:
        """Refuse (ParamError, naming the field) a federation that cannot run on clients laid out as `layout` with
        minibatches of `batch_sizes` (by the field that sets each, `minibatch_sizes`; default: `batch_size`
        alone): the rule of the engine on a built problem and of a recipe's validator on a problem's declared layout
        (where a part unknown is not checked)."""
        for param in self.params:
            try:
                param.check(getattr(self, param.name))
            except ValueError as err:
                raise ParamError(param.name, str(err), "federation") from None
        if layout.clients is not None and self.clients_per_round > layout.clients:
            raise ParamError("clients_per_round", f"found {self.clients_per_round}, expected at most the problem's "
                             f"{layout.clients} clients (or 0: all)", "federation")
        for name, size in ({"batch_size": self.batch_size} if batch_sizes is None else batch_sizes).items():
            if layout.smallest is not None and size > layout.smallest:  # the problem does not cap it at n_k
                bound = (f"problem.{layout.smallest_field} = {layout.smallest}" if layout.smallest_field else
                         f"{layout.smallest}, the training samples of the smallest client")
                raise ParamError(name, f"found {size}, expected at most {bound}",
                                 "federation" if name == "batch_size" else "")  # else the algorithm's


def minibatch_sizes(minibatches: tuple[Minibatch, ...], hp: Mapping[str, Any],
                    batch_size: int) -> tuple[dict[str, int], dict[str, int]]:
    """The sizes of the minibatches with draws of their own: by minibatch name (what `RoundSampler` draws), and by
    the field that sets each (the federation's `batch_size` or a hyperparameter of the algorithm; an algorithm's
    fixed size is no field), what `Federation.check` checks."""
    sizes, fields = {}, {}
    for mb in minibatches:
        if mb.same_as is not None:
            continue
        if isinstance(mb.size, int):
            sizes[mb.name] = mb.size
        else:
            field = mb.size or "batch_size"
            sizes[mb.name] = fields[field] = hp[mb.size] if mb.size else batch_size
    return sizes, fields


PERMUTATION_LIMIT = 4096  # clients up to which a round's clients are a prefix of a random permutation


def sample_clients(count: int, size: int, gen: torch.Generator) -> Tensor:
    """`size` distinct clients of `count`, uniformly, in draw order. Up to PERMUTATION_LIMIT clients, the first
    `size` of a random permutation (the draws every recorded curve was made with); beyond, each next client uniform
    over those not yet drawn, by rejecting repeats of `randint` draws: O(size) work instead of the permutation's
    O(count) (430 µs a round at 10⁵ clients here, more than a small round's arithmetic)."""
    if count <= PERMUTATION_LIMIT or size * 4 > count:
        return torch.randperm(count, generator=gen)[:size]
    drawn: dict[int, None] = {}
    while len(drawn) < size:
        for client in torch.randint(count, (size,), generator=gen).tolist():
            drawn.setdefault(client)
            if len(drawn) == size:
                break
    return torch.tensor(list(drawn))


class RoundSampler:
    """Each round's random draws: the participating clients (S sampled without replacement, or all of them)
    and, for every local step, the rows of each minibatch the algorithm declares (a batch declared
    `same_as` another reuses its draw)."""

    def __init__(self, problem: Problem, federation: Federation, seed: int,
                 minibatches: tuple[Minibatch, ...] = (Minibatch("D"),), sizes: dict[str, int] | None = None):
        self.problem, self.federation = problem, federation
        self.minibatches = minibatches
        self.sizes = sizes or {mb.name: federation.batch_size for mb in minibatches}
        self.drawn = tuple(mb for mb in minibatches if mb.same_as is None)  # those with draws of their own
        self.client_gen = generator(seed, "clients")
        self.batch_gen = generator(seed, "minibatches")
        self.noise_gen = generator(seed, "feature-noise")  # the problem's minibatch_noise, if it has any

    def draw(self, local_steps: int, everyone: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
        """(clients [S], rows `[local_steps, S, b]` per drawn minibatch name)."""
        count = self.problem.num_clients
        if everyone:
            clients = torch.arange(count)
        else:
            clients = sample_clients(count, self.federation.clients_per_round or count, self.client_gen)
        rows = {mb.name: self.problem.draw_minibatches(clients, local_steps, self.sizes[mb.name], self.batch_gen)
                for mb in self.drawn}
        return clients.to(self.problem.device), rows

    def step_batches(self, rows: dict[str, Tensor], step: int) -> Batches:
        """The oracles of local step `step` of this run alone (points `[S, d]`, no run axis)."""
        return Batches(step_oracles(self.problem, self.minibatches, {k: v[step] for k, v in rows.items()},
                                    lambda rows: self.problem.minibatch_noise(rows, self.noise_gen)))


def step_oracles(problem: Problem, minibatches: tuple[Minibatch, ...], rows: dict[str, Tensor],
                 noise: Callable[[Tensor], Tensor | None]) -> dict[str, Any]:
    """The problem's oracle of each declared minibatch of one local step, on its rows `[C, b]` (every client of every
    run in the step, flattened) with their `noise(rows)`; a batch declared `same_as` another shares its oracle."""
    oracles: dict[str, Any] = {}
    for mb in minibatches:
        if mb.same_as is not None:
            oracles[mb.name] = oracles[mb.same_as]
        else:
            oracles[mb.name] = problem.step_oracle(rows[mb.name], noise(rows[mb.name]))
    return oracles


class Simulation:
    """One run's record: its problem, algorithm configuration, federation and streams, its state (without the run
    axis: server entries as `init_server` makes them, per-client `[N, ...]`), counters and status. Iterating runs
    it to `federation.rounds` or divergence (a non-finite metric, or an objective above `divergence_factor` times
    its value at the start; the partial curve is kept either way) as a program of one run (`fedbench.runs`)."""

    def __init__(self, problem: Problem, algorithm: Algorithm, federation: Federation, seed: int,
                 eval_every: int = 10, divergence_factor: float = DIVERGENCE_FACTOR):
        minibatches = algorithm.minibatches(algorithm.hp)
        sizes, fields = minibatch_sizes(minibatches, algorithm.hp, federation.batch_size)
        federation.check(problem.layout(), fields)
        self.problem, self.algorithm, self.federation = problem, algorithm, federation
        self.eval_every = max(1, int(eval_every))
        self.divergence_factor = divergence_factor
        self.start_objective: float | None = None
        self.sampler = RoundSampler(problem, federation, seed, minibatches, sizes)
        self.algorithm_gen = generator(seed, algorithm.random_stream)
        w0 = problem.init_params(generator(seed, "init"))
        self.server = algorithm.init_server(w0)
        self.clients = algorithm.init_clients(w0, problem.num_clients)
        self.rounds_done = 0
        self.iterations = 0  # local iterations per client so far
        self.comm_up = 0
        self.comm_down = 0
        self.train_seconds = 0.0
        self.eval_seconds = 0.0
        self.status = "running"
        self.metric_names: list[str] = []
        self._program: RunBatch | None = None  # `run_round`'s

    def __iter__(self) -> Iterator[dict[str, float]]:
        from fedbench.runs import RunBatch
        for _, row in RunBatch([self]):
            yield row

    def run_round(self) -> None:
        """One round of this run, from its state on `server` and `clients` (where it leaves the new state), by its
        program of one (`fedbench.runs`), kept from one call to the next."""
        from fedbench.runs import RunBatch
        if self._program is None:
            self._program = RunBatch([self])
        self._program.resume_from_runs()
        self._program.run_round()
        self._program._sync(0)

    RECORD = ("rounds_done", "iterations", "comm_up", "comm_down", "train_seconds", "eval_seconds", "status",
              "start_objective", "metric_names")

    def streams(self) -> dict[str, torch.Generator]:
        """Every random stream of the run by name (see the module's docstring)."""
        return {"clients": self.sampler.client_gen, "minibatches": self.sampler.batch_gen,
                "feature-noise": self.sampler.noise_gen, "algorithm": self.algorithm_gen}

    def state_dict(self) -> dict[str, Any]:
        """The run's record: its state as it holds it, each stream's state and its counters (a program's
        checkpoint holds its runs' records, `fedbench.runs.RunBatch.state_dict`)."""
        return {"server": self.server, "clients": self.clients,
                "streams": {name: gen.get_state() for name, gen in self.streams().items()},
                **{name: getattr(self, name) for name in self.RECORD}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server, self.clients = state["server"], state["clients"]
        for name, gen in self.streams().items():
            gen.set_state(state["streams"][name].cpu())  # the generators live on the CPU (`fedbench.rng`)
        for name in self.RECORD:
            setattr(self, name, state[name])

    def exploded(self, row: dict[str, float]) -> bool:
        if not all(math.isfinite(v) for v in row.values()):
            return True
        start = self.start_objective
        return start is not None and row["objective"] > self.divergence_factor * max(abs(start), 1e-12)

    def count_round(self, uploaded: int, downloaded: int, steps: int) -> None:
        """A round that the engine ended for this run: its floats up and down, its local steps."""
        self.comm_up += uploaded
        self.comm_down += downloaded
        self.rounds_done += 1
        self.iterations += steps

    def aggregation_weights(self, clients: Tensor) -> Tensor:
        """The server's weights `[S]` over this run's sampled clients `clients` `[S]`."""
        from fedbench.runs import aggregation_weights
        dtype = self.server[self.algorithm.downloads[0]].dtype
        return aggregation_weights(self.problem, self.federation, clients[None], dtype)[0]

    def evaluate(self, failed: bool = False) -> dict[str, float]:
        """The metrics row; all metrics NaN when the iterate is beyond evaluation (overflowed)."""
        return evaluate_rows([self], failed)[0]

    def row(self, metrics: dict[str, float] | None) -> dict[str, float]:
        if metrics is None:
            metrics = dict.fromkeys(self.metric_names, math.nan)
        else:
            self.metric_names = list(metrics)
        return {"round": self.rounds_done, **metrics, "comm_up": float(self.comm_up),
                "comm_down": float(self.comm_down), "iterations": float(self.iterations)}


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
                _stack([sim.algorithm.personal_params(sim.server, sim.clients) for sim in sims]))
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


@dataclass
class Result:
    rows: list[dict[str, float]]
    status: str
    params: Tensor
    personal: Tensor | None
    train_seconds: float
    eval_seconds: float

    @property
    def final(self) -> dict[str, float]:
        return self.rows[-1]


def simulate(problem: Problem, algorithm: Algorithm, federation: Federation, seed: int = 0,
             eval_every: int = 10, divergence_factor: float = DIVERGENCE_FACTOR) -> Result:
    sim = Simulation(problem, algorithm, federation, seed, eval_every, divergence_factor)
    rows = list(sim)
    return Result(rows, sim.status, algorithm.global_params(sim.server),
                  algorithm.personal_params(sim.server, sim.clients), sim.train_seconds, sim.eval_seconds)
