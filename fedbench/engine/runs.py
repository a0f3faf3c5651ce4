"""The engine: one round loop over R ≥ 1 runs, each with its own random streams, as one batched tensor program.

R simulations of one algorithm with one configuration on one problem instance (the same data), differing in their
seeds (initial point, client sampling, minibatches, the algorithm's coins) and in their float hyperparameters,
advance as one program; a run alone is R = 1 through the same code:

    sims = [Simulation(problem, FedMiD(problem, client_lr=lr), federation, seed) for seed, lr in ...]
    for run, row in run_batch(sims):  # each run's rows, exactly as `for row in sims[run]` would yield them
        ...
    sims[run].status                  # 'finished' or 'diverged', per run

* Draws. Every run keeps its own record (`fedbench.engine.record.RunRecord`, which a `Simulation` is: streams, counters,
  status), whose generators draw on the host exactly what the run draws alone (round length, clients, minibatch
  rows), in the same order; only the arithmetic is batched. An algorithm's own draws go through `Round.draw`, bound
  to each run's stream.
* Layout (`fedbench.algorithms.base`). Server state `[R, 1, ...]`, per-client state `[R, N, ...]`, a round's local
  state `[R, S, ...]`, float hyperparameters and derived values `[R, 1, 1]` (`fedbench.engine.run_axis`). The problem's
  oracles see the run axis folded into the client axis (`fedbench.oracle.RunOracle`, for any oracle method), so
  problems need nothing new.
* Schedules. Rounds of fixed length (or of a drawn length, for one run) advance round by round (`RoundProgram`,
  `fedbench.engine.round_wise`). Rounds of random length where every client takes part (coin-flip communication, Hanzely
  et al.'s block methods) advance iteration by iteration, each run through its own rounds (`IterationProgram`,
  `fedbench.engine.iteration_wise`): round-synchronous runs would each wait for the longest of R geometric lengths,
  about ln R times the mean. Which runs share one: `fedbench.engine.planning`.
* Hyperparameter schedules (`fedbench.schedules`). A scheduled hyperparameter's value at each run's round is handed
  to the round's functions as a float's, `[R, 1, 1]` (`RoundProgram._at_rounds`, which the round-wise and the
  iteration-wise programs both call); runs whose schedules differ share a program as runs whose floats differ do.
* Divergence. A run that diverges stops, as alone: its partial curve is kept, its final state is stored on its
  record, and it leaves the batched arithmetic. A round in which an SVD fails (an iterate that overflowed
  between two evaluations) is replayed run by run on the same draws: the runs whose SVD fails end diverged there.
* Evaluation. On the same schedule as alone, the runs due together in one `Problem.evaluate_runs` call.
* Links. The federation's uplink and downlink transforms act between the algorithm's steps, on what crosses the
  network (`fedbench.engine.links`: receive before client_init, send between client_final and server_update, commit
  after the round is written); without chains they hand everything through.
* Server optimizer (`fedbench.axes.server_optimizers`). Between the links' `send` and the algorithm's `server_update`,
  the federation's server optimizer replaces every client's update of `w` by its step on their mean; its state is
  written with the links' at the round's end.
* Participation and uneven local work (`fedbench.axes.participation`). Where the number of a round's participants
  varies, its clients keep S slots and a mask `[R, S]` of those that take part: the engine makes an absent slot count
  for nothing (zero weight, a zero upload, its per-client and link state kept, a run without participants keeping its
  server state; no host sync: the mask is drawn on the host). Where each participant takes its own number of local
  steps, the round runs the longest count of its runs, and a client past its own keeps its local state (`torch.where` on
  every entry with a client axis); each run draws the rows of its own longest count, and the batch pads a shorter run's
  with its last step's, which its clients never use. One object applies all of these rules, the round's slots
  (`fedbench.axes.slots.Slots`): the round loop itself reads as its pipeline (`RoundProgram._advance`).

Why explicit and not `torch.func.vmap` over runs (tried first): on this CPU vmap costs ~2x per elementwise op and
~30x per gather (index_select with a batched index: 380 µs against 12 µs), where the runs of Hanzely et al.'s
problems are streams of ~10 µs ops; the explicit layout's ops on `[R, S, d]` cost about what `[S, d]` costs.
Identity of a run in a batch with the run alone: bit for bit where the batched kernels reduce in the same order,
else within 1e-12 relative; `tests/engine/test_runs.py` per algorithm.
"""
from __future__ import annotations

from typing import Sequence

from fedbench.engine.iteration_wise import IterationProgram
from fedbench.engine.planning import groups, random_rounds
from fedbench.engine.record import RunRecord
from fedbench.engine.round_wise import RoundProgram


def program(sims: list[RunRecord]) -> RoundProgram:
    """The program of these simulations: iteration by iteration where rounds have random lengths and every client
    takes part (`IterationProgram`), else round by round (`RoundProgram`; a run alone too)."""
    if len(sims) > 1 and random_rounds(type(sims[0].algorithm)):
        return IterationProgram(sims)
    return RoundProgram(sims)


def programs(sims: Sequence[RunRecord]) -> list[tuple[list[int], RoundProgram]]:
    """The programs these simulations run in, each with the indices of its runs, as the planner groups them
    (`fedbench.engine.planning.groups`: one for all of them where they can share one, else one per run)."""
    return [(runs, program([sims[i] for i in runs])) for runs in groups(sims)]
