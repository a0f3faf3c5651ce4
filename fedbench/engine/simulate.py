"""Running a run: alone (`simulate`, iterating a `Simulation`) or with others (`run_batch`, `run_seeds`) in the
programs of `fedbench.engine.runs`. A `Simulation` is a run's record (`fedbench.engine.record.RunRecord`: its streams,
state, counters and status) that runs itself; its federation and random draws are `fedbench.engine.federation`'s
(`Federation`, `RoundSampler`).

    sim = Simulation(problem, FedMiD(problem, client_lr=1e-3), Federation(2000, 10, 10, 10), seed=0)
    for row in sim:            # {'round': r, metric: value, ...} every `eval_every` rounds
        ...
    sim.status                 # 'finished' or 'diverged'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from torch import Tensor

from fedbench.algorithms import ALGORITHMS
from fedbench.algorithms.base import Algorithm
from fedbench.axes.privacy import ACCOUNTANTS
from fedbench.engine.compiling import check_mode
from fedbench.engine.federation import DIVERGENCE_FACTOR, Federation
from fedbench.engine.record import RunRecord
from fedbench.engine.round_wise import RoundProgram, evaluate_rows
from fedbench.engine.runs import programs
from fedbench.problems.base import Problem


class Simulation(RunRecord):
    """One run that runs itself: its record (`fedbench.engine.record.RunRecord`: its problem, algorithm configuration,
    federation and streams, its state without the run axis, counters and status), and iterating it runs it to
    `federation.rounds` or divergence (a non-finite metric, or an objective above `divergence_factor` times its value
    at the start; the partial curve is kept either way) as a program of one run (`fedbench.engine.runs`). With
    `delta`, a run whose uplink adds DP-FedAvg's noise (a `gaussian` step) has in each row its `epsilon`: ε at δ
    after the row's rounds by the `accountant` (`fedbench.axes.privacy.ACCOUNTANTS`: pld, the tight default, or rdp).
    `compile` (`auto`, `on`, `off`): whether its program's local steps run compiled by torch.compile
    (`fedbench.engine.compiling`; `auto`: where the measured table says that wins).

    Example:
        ```python
        sim = Simulation(problem, FedMiD(problem, client_lr=1e-3), Federation(2000, 10, 10, 10), seed=0)
        rows = list(sim)                  # {'round': r, metric: value, ..., 'comm_up': ...} every eval_every rounds
        sim.status, sim.algorithm.global_params(sim.server)
        ```
    """

    def __init__(self, problem: Problem, algorithm: Algorithm, federation: Federation, seed: int,
                 eval_every: int = 10, divergence_factor: float = DIVERGENCE_FACTOR, delta: float | None = None,
                 compile: str = "auto", accountant: str = ACCOUNTANTS[0]):
        check_mode(compile)
        super().__init__(problem, algorithm, federation, seed, eval_every, divergence_factor, delta, compile,
                         accountant)
        self._program: RoundProgram | None = None  # `run_round`'s

    def __iter__(self) -> Iterator[dict[str, float]]:
        for _, row in RoundProgram([self]):
            yield row

    def run_round(self) -> None:
        """One round of this run, from its state on `server` and `clients` (where it leaves the new state), by its
        program of one (`fedbench.engine.runs`), kept from one call to the next."""
        if self._program is None:
            self._program = RoundProgram([self])
        self._program.resume_from_runs()
        self._program.run_round()
        self._program.sync_run(0)

    def evaluate(self, failed: bool = False) -> dict[str, float]:
        """The metrics row; all metrics NaN when the iterate is beyond evaluation (overflowed)."""
        return evaluate_rows([self], failed)[0]


@dataclass
class Result:
    """A finished run (`simulate`, `fedbench.run`)."""

    rows: list[dict[str, float]]
    """Its metrics rows, at round 0, every `eval_every` rounds and at the last: `round`, the problem's metrics,
    `comm_up`, `comm_down` (floats), `iterations`, `comm_up_bits`, `comm_down_bits` (as the links encode them), and
    `epsilon` (ε at the run's δ, where its uplink is accounted)."""
    status: str
    """"finished", or "diverged" (the rows stop where it did)."""
    params: Tensor
    """The final global model `[d]` (`Algorithm.global_params`)."""
    personal: Tensor | None
    """The final per-client models `[N, d]` of a personalized algorithm, else None."""
    train_seconds: float
    """Seconds spent in rounds."""
    eval_seconds: float
    """Seconds spent evaluating."""

    @property
    def final(self) -> dict[str, float]:
        """The last row."""
        return self.rows[-1]


def simulate(problem: Problem, algorithm: Algorithm, federation: Federation, seed: int = 0,
             eval_every: int = 10, divergence_factor: float = DIVERGENCE_FACTOR, delta: float | None = None,
             compile: str = "auto", accountant: str = ACCOUNTANTS[0]) -> Result:
    """One run of `algorithm` (a configured instance) on `problem` with `federation`, its random streams from
    `seed`, evaluated every `eval_every` rounds, ended early where it diverges (a non-finite metric, or an
    objective above `divergence_factor` times its start); with `delta`, the rows of a federation whose uplink adds
    DP-FedAvg's noise carry `epsilon`, ε at that δ by the `accountant` (`fedbench.axes.privacy`); its local steps
    compiled or not (`compile`, `fedbench.engine.compiling`).

    Example:
        ```python
        result = simulate(problem, FedMiD(problem, client_lr=1e-3), Federation(rounds=2000), seed=0)
        ```
    """
    sim = Simulation(problem, algorithm, federation, seed, eval_every, divergence_factor, delta, compile, accountant)
    rows = list(sim)
    return Result(rows, sim.status, algorithm.global_params(sim.server), sim.personal_params(), sim.train_seconds,
                  sim.eval_seconds)


def run_batch(sims: list[Simulation]) -> Iterable[tuple[int, dict[str, float]]]:
    """(run index, row) of these simulations, in their programs (`programs`)."""
    return ((runs[i], row) for runs, each in programs(sims) for i, row in each)


def run_seeds(problem, algorithm_name: str, federation, seeds, eval_every: int = 10, compile: str = "auto",
              **hyperparameters) -> list[list[dict[str, float]]]:
    """The rows of one algorithm run with each of `seeds` on `problem`, as one program where they can share one:
    `run_seeds(...)[k]` is seed k's curve."""
    seeds = list(seeds)
    sims = [Simulation(problem, ALGORITHMS[algorithm_name](problem, **hyperparameters), federation, seed, eval_every,
                       compile=compile) for seed in seeds]
    rows: list[list[dict[str, float]]] = [[] for _ in seeds]
    for i, row in run_batch(sims):
        rows[i].append(row)
    return rows
