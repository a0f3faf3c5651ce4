"""The rules the engine enforces instead of documenting them (`fedbench.algorithms.base`, `fedbench.engine.runs`):
randomness inside a round goes through `rnd.draw`, bound to each run's stream; a round refuses what its schedule
does not define (no placeholder values); every oracle method of a problem is lifted over the run axis without
being listed anywhere; hyperparameters arrive as inputs, shaped to broadcast."""
from __future__ import annotations

import pytest
import torch

import fedbench
from fedbench.algorithms.base import HParams, Round, ScheduleError
from fedbench.algorithms.fedavg import FedAvg
from fedbench.algorithms.scd_pfl import SCDPFL
from fedbench.engine.runs import IterationProgram, RoundProgram
from fedbench.engine.simulate import Federation, Simulation
from fedbench.oracle import Oracle, RunOracle
from helpers import SEEDS, curves_alone, pfl, rows_by_run
from small_problems import small_lasso


class ReadsTheRoundIndex(SCDPFL):
    """SCD-PFL whose local step reads the round's index: defined round by round, not inside an iteration-wise
    batch, whose runs are at different rounds."""
    name = "scd_pfl"

    def client_step(self, local, batches, rnd, hp):
        assert rnd.index >= 0
        return super().client_step(local, batches, rnd, hp)


class DrawsInEveryStep(SCDPFL):
    name = "scd_pfl"

    def client_step(self, local, batches, rnd, hp):
        rnd.draw(lambda gen: torch.rand((), generator=gen))
        return super().client_step(local, batches, rnd, hp)


@pytest.mark.parametrize("algorithm", [ReadsTheRoundIndex, DrawsInEveryStep])
def test_an_iteration_wise_batch_refuses_what_its_inner_steps_do_not_define(algorithm):
    problem = pfl()
    sims = [Simulation(problem, algorithm(problem), Federation(4, 0, 1, 1), seed) for seed in SEEDS]
    with pytest.raises(ScheduleError, match="iteration-wise program's inner steps"):
        list(IterationProgram(sims))
    alone = Simulation(problem, algorithm(problem), Federation(4, 0, 1, 1), 0)  # round by round: defined
    assert alone.status == "running" and len(list(alone)) == 1 + 4 // 10 + 1


def test_a_round_says_what_it_does_not_define():
    rnd = Round(torch.zeros(2, 3, dtype=torch.long), where="here, for the test")
    for name in ("index", "iteration", "local_steps", "step"):
        with pytest.raises(ScheduleError, match=f"rnd.{name} is not defined here, for the test"):
            getattr(rnd, name)
    assert rnd.is_last_step is False
    with pytest.raises(ScheduleError, match="rnd.draw is not allowed"):
        rnd.draw(lambda gen: torch.rand((), generator=gen))
    defined = Round(rnd.clients, 3, 4, 12).at(3)
    assert (defined.index, defined.local_steps, defined.iteration, defined.step, defined.is_last_step) == (
        3, 4, 12, 3, True)


def test_draws_inside_a_round_are_each_runs_own():
    """`rnd.draw` gives every run of a program the draw it makes alone, on its own stream."""
    streams = tuple(torch.Generator().manual_seed(seed) for seed in SEEDS)
    drawn = Round(torch.zeros(len(SEEDS), 1, dtype=torch.long), streams=streams).draw(
        lambda gen: torch.rand(3, generator=gen))
    assert drawn.shape == (len(SEEDS), 3)
    for row, seed in zip(drawn, SEEDS):
        assert torch.equal(row, torch.rand(3, generator=torch.Generator().manual_seed(seed)))


def test_any_oracle_method_is_lifted_over_runs():
    """A method a problem's oracle gains is lifted by the generic mechanism: folded arguments (a `[R, 1, d]` point
    expanded to the clients), unfolded answers (tuples too), and a function argument seeing unfolded tensors."""
    class Richer(Oracle):
        def shifted(self, w, by):
            return w + by, w.sum(-1)

        def through(self, w, f):
            return f(w * 2)

    lifted = RunOracle(Richer(None, None), count=2, clients=3)
    w = torch.arange(2 * 3 * 5, dtype=torch.float64).view(2, 3, 5)
    shift = torch.ones(2, 1, 5)
    plus, total = lifted.shifted(w, shift)
    assert plus.shape == (2, 3, 5) and torch.equal(plus, w + 1) and torch.equal(total, w.sum(-1))
    seen = []
    out = lifted.through(w, lambda x: seen.append(x.shape) or x.sum(-1))
    assert seen == [(2, 3, 5)] and torch.equal(out, (2 * w).sum(-1))


def test_hyperparameters_arrive_per_run_and_static_values_stay_python():
    """A batch's round functions get each float as a `[R, 1, 1]` tensor of its runs' values (`[1, 1, 1]` where the
    runs share it) and every other kind as the runs' shared Python value; the algorithm object holds no batch's
    values."""
    problem, federation = small_lasso(), Federation(2, 3, 2, 5)
    seen = []

    class Recording(FedAvg):
        def client_step(self, local, batches, rnd, hp):
            seen.append(hp)
            return super().client_step(local, batches, rnd, hp)

    sims = [Simulation(problem, Recording(problem, client_lr=lr, subgradient=False), federation, seed)
            for seed, lr in ((0, 0.01), (1, 0.02), (2, 0.04))]
    rows_by_run(RoundProgram(sims), 3)
    hp = seen[0]
    assert isinstance(hp, HParams)
    assert hp.client_lr.shape == (3, 1, 1) and hp.client_lr.flatten().tolist() == [0.01, 0.02, 0.04]
    assert hp.subgradient is False
    assert hp.server_lr.shape == (1, 1, 1) and float(hp.server_lr) == 1.0  # shared by the runs: broadcasts alike
    assert [sim.algorithm.hp.client_lr for sim in sims] == [0.01, 0.02, 0.04]  # each run's own, untouched
    with pytest.raises(AttributeError, match="read-only"):
        hp.client_lr = 0.5


def test_a_run_alone_is_a_program_of_one():
    """`Simulation` iterates the same engine as a batch: its rows equal a RoundProgram of it alone, bit for bit."""
    problem, federation = small_lasso(), Federation(6, 3, 2, 5)
    make = lambda: Simulation(problem, fedbench.make_algorithm("fedmid", problem, client_lr=0.01), federation, 4, 2)  # noqa: E731
    assert list(make()) == rows_by_run(RoundProgram([make()]), 1)[0]
    assert curves_alone(problem, "fedmid", federation, {"client_lr": 0.01}, [4], eval_every=2)[0] == list(make())
