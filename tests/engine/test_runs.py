"""The run axis (`fedbench.engine.runs`): R runs of one configuration with different seeds as one program give each run's
curve as it is alone, and a run that diverges or fails inside a batch leaves the others' curves unchanged.

Identity, per algorithm written for the run axis (`helpers.CASES`): bit for bit where every reduction of a round
is per run and per client (LSGD-PFL, and FedAvg/FedMiD on these instances), within 1e-12 relative where a server
average over clients is a batched matrix product against the vector product of a run alone (measured ≤ 2e-15
after a dozen rounds), 1e-9 where a finite-difference HVP divides those last-bit differences by τ ~ 1e-8 (measured
~1e-11). Round-synchronous programs (`RoundProgram`) for fixed-length rounds; iteration-wise programs
(`IterationProgram`) for ACD-PFL's, ASCD-PFL's, ASVRCD-PFL's and L2SGD+'s coin-flip rounds. Runs may differ in the
float hyperparameters (`MIXED_CASES`); in any other, they run in separate programs
(`why_not_batchable`). FeDXL's pair-score methods run in float32: within 5e-5 (a pAUC moves by one flipped
near-tied pair). Every shipped algorithm is on the run axis; ASVRCD-PFL only when counting refreshes (else a
ρ-coin at every iteration decides a full-data refresh inside the batched steps).
"""
from __future__ import annotations

import math

import pytest
import torch

import fedbench
from fedbench.algorithms.l2sgd_plus import L2SGDPlus
from fedbench.algorithms.pfl_rules import rules
from fedbench.engine.planning import NotBatchable, step_bytes, why_not_batchable
from fedbench.engine.runs import IterationProgram, RoundProgram, programs
from fedbench.engine.simulate import Federation, Simulation, run_batch, run_seeds
from fedbench.metrics import ENGINE_COLUMNS
from helpers import CASES, FLOAT32, PAIRS, SEEDS, SMALL_BATCHES, assert_same, curves_alone, pauc, pfl, rows_by_run
from small_problems import small_lasso, small_lowrank
from sweeps.driving import drive_batch

ENGINE = ("round", *(column.name for column in ENGINE_COLUMNS))  # the columns that stay finite in a diverged row


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_batch_of_seeds_gives_each_run_its_curve_alone(name):
    make, federation, hp, tolerance = CASES[name]
    problem, name = make(), name.partition(":")[0]
    alone = curves_alone(problem, name, federation, hp, SEEDS)
    batched = run_seeds(problem, name, federation, SEEDS, eval_every=3, **hp)
    assert_same(alone, batched, tolerance)
    if name in ("acd_pfl", "ascd_pfl", "scd_pfl", "l2sgd_plus", "asvrcd_pfl", "svrcd_pfl"):  # coin-flip rounds
        assert len({row["iterations"] for row in (curve[-1] for curve in alone)}) == len(SEEDS)


def test_a_batch_run_in_chunks_gives_each_run_its_curve_alone(monkeypatch):
    """Batches beyond the gather budget go through each round in chunks of runs, every chunk from the state at the
    round's start: FeDXL2's score pools change size in its first round (every sample's score, then the last rounds'
    records), which a chunk must not read from the one before it."""
    monkeypatch.setattr(fedbench.engine.round_wise, "GATHER_BUDGET", 1)  # one run per chunk
    problem = pauc()
    alone = curves_alone(problem, "fedxl2", PAIRS, {"client_lr": 0.5}, SEEDS)
    batch = RoundProgram([Simulation(problem, fedbench.make_algorithm("fedxl2", problem, client_lr=0.5), PAIRS, seed, 3)
                      for seed in SEEDS])
    assert batch.chunk == 1
    assert_same(alone, rows_by_run(batch, len(SEEDS)), FLOAT32)


def test_memory_bound_runs_go_one_after_another(monkeypatch):
    """Runs whose steps gather more than MEMORY_BOUND_RUN_BYTES run alone, one after another (a batch would not be
    faster): the same rows, run by run."""
    problem, federation = small_lasso(), Federation(6, 3, 2, 5)
    sims = [Simulation(problem, fedbench.make_algorithm("fedmid", problem), federation, seed, 2) for seed in SEEDS]
    assert step_bytes(sims[0]) == 3 * 5 * 30 * 8  # S·b rows of p = 30 float64 features
    monkeypatch.setattr(fedbench.engine.planning, "MEMORY_BOUND_RUN_BYTES", 3 * 5 * 30 * 8 - 1)
    order = [i for i, _ in run_batch(sims)]
    assert order == sorted(order)  # run 0 to its end, then run 1, ...
    assert [sim.status for sim in sims] == ["finished"] * len(SEEDS)
    assert_same(curves_alone(problem, "fedmid", federation, {}, SEEDS, eval_every=2),
                rows_by_run(run_batch([Simulation(problem, fedbench.make_algorithm("fedmid", problem), federation,
                                                  seed, 2) for seed in SEEDS]), len(SEEDS)), 0.0)
    # and the sweep's outcomes say so (the MLflow tag runs_in_batch): 1, each run alone
    outcomes = drive_batch([Simulation(problem, fedbench.make_algorithm("fedmid", problem), federation, seed, 2)
                            for seed in SEEDS])
    assert [outcome.runs_in_batch for outcome in outcomes] == [1] * len(SEEDS)
    monkeypatch.undo()
    outcomes = drive_batch([Simulation(problem, fedbench.make_algorithm("fedmid", problem), federation, seed, 2)
                            for seed in SEEDS])
    assert [outcome.runs_in_batch for outcome in outcomes] == [len(SEEDS)] * len(SEEDS)


MIXED = [(0, 0.02, 1.0), (3, 0.5, 1.0), (7, 0.02, 0.5), (11, 0.005, 1.0)]  # (seed, client_lr, server_lr)


MIXED_CASES = {  # algorithm:case -> (problem, fixed hyperparameters, the second per-run hyperparameter)
    "fedavg": (small_lasso, {}, "server_lr"),
    "fedmid:bao": (small_lasso, {"server_threshold": "bao"}, "server_lr"),
    "fedmid:yuan": (small_lasso, {"server_threshold": "yuan"}, "server_lr"),
    "fedmid:lowrank": (small_lowrank, {"server_threshold": "bao"}, "server_lr"),
    "fedprox": (small_lasso, {"h_mode": "prox"}, "prox_mu"),
    "ditto": (small_lasso, {"h_mode": "prox"}, "ditto_lambda"),
    "per_fedavg": (small_lasso, SMALL_BATCHES, "alpha"),
    "per_fedavg:exact": (small_lasso, {"variant": "exact", **SMALL_BATCHES}, "alpha"),
    "pfedme": (small_lasso, {"lam": 15.0}, "personal_lr"),
    "pfedme:lam": (small_lasso, {"personal_lr": 0.01}, "lam"),
}


@pytest.mark.parametrize("case", sorted(MIXED_CASES))
def test_runs_differing_in_seed_and_step_sizes_share_a_batch(case):
    """Per-run hyperparameters (every float one): each run of a program mixing seeds, step sizes and a second
    continuous hyperparameter gives its curve alone, the prox thresholds (client η_c, server η_s·η_c(·E)) per run
    too. Run 1's step size is too large: it diverges and leaves the batch, and the per-run values then follow the
    live runs."""
    make, fixed, second = MIXED_CASES[case]
    name, problem, federation = case.partition(":")[0], make(), Federation(12, 3, 4, 5)
    scale = {"alpha": 0.01, "personal_lr": 0.01, "lam": 15.0}.get(second, 1.0)  # values of their own scale

    def sims():
        return [Simulation(problem, fedbench.make_algorithm(name, problem, client_lr=lr, **{second: scale * value},
                                                            **fixed), federation, seed, 3)
                for seed, lr, value in MIXED]

    alone_sims = sims()
    alone = [list(sim) for sim in alone_sims]
    assert [sim.status for sim in alone_sims] == ["finished", "diverged", "finished", "finished"]
    batch = sims()
    batched = rows_by_run(RoundProgram(batch), len(MIXED))
    assert_same(alone, batched, 1e-12)
    assert [sim.status for sim in batch] == [sim.status for sim in alone_sims]
    assert len({curve[-1]["objective"] for curve in alone}) == len(MIXED)  # the runs really differ


def test_communication_and_iteration_counts_are_per_run():
    problem = pfl()
    federation = Federation(6, 0, 1, 1)
    sims = [Simulation(problem, fedbench.make_algorithm("ascd_pfl", problem), federation, seed, 2) for seed in SEEDS]
    list(run_batch(sims))
    alone = curves_alone(problem, "ascd_pfl", federation, {}, SEEDS, eval_every=2)
    for sim, curve in zip(sims, alone):
        assert (sim.iterations, sim.comm_up, sim.comm_down) == (curve[-1]["iterations"], curve[-1]["comm_up"],
                                                                curve[-1]["comm_down"])
        assert sim.status == "finished"


def test_a_diverging_run_inside_a_batch_leaves_the_others_unchanged():
    """Run 1 starts from a non-finite point (as after an overflow): it ends 'diverged' at its first evaluation with
    its partial curve, as alone, and the three others give their curves alone."""
    problem = small_lasso()
    federation, hp = Federation(30, 3, 4, 5), {"client_lr": 0.01}

    def sims():
        made = [Simulation(problem, fedbench.make_algorithm("fedavg", problem, **hp), federation, s, 3) for s in SEEDS]
        made[1].server["w"] = torch.full_like(made[1].server["w"], math.nan)
        return made

    alone = [list(sim) for sim in sims()]
    assert len(alone[1]) == 2 < len(alone[0])  # run 1 diverges alone at round 3
    batch = sims()
    batched = rows_by_run(RoundProgram(batch), len(SEEDS))
    assert_same(alone, batched, 1e-12)
    assert [sim.status for sim in batch] == ["finished", "diverged", "finished", "finished"]


def test_an_svd_failing_in_one_run_fails_that_run_only():
    """One run's iterate is non-finite at the start of a round, so the nuclear prox's SVD raises in the batched
    round; the round is replayed run by run on the same draws: that run ends diverged with a NaN row, the others
    go on exactly as alone."""
    problem = small_lowrank()
    federation, hp = Federation(9, 3, 3, 5), {"client_lr": 0.01}

    def sims():
        made = [Simulation(problem, fedbench.make_algorithm("fedmid", problem, **hp), federation, s, 3) for s in SEEDS]
        made[2].server["w"] = torch.full_like(made[2].server["w"], math.inf)
        return made

    alone = [list(sim) for sim in sims()]
    batch = sims()
    batched = rows_by_run(RoundProgram(batch), len(SEEDS))
    assert batch[2].status == "diverged" and all(math.isnan(v) for k, v in batched[2][-1].items()
                                                 if k not in ENGINE)
    assert_same([alone[i] for i in (0, 1, 3)], [batched[i] for i in (0, 1, 3)], 1e-12)


class SvdCheckedL2SGD(L2SGDPlus):
    """L2SGD+ whose local step first takes an SVD of each run's device models `[M, d]` (as a nuclear prox on them
    would): it raises LinAlgError on a run whose models are not finite."""

    def client_step(self, local, batches, rnd, hp):
        torch.linalg.svdvals(local["x"])
        return super().client_step(local, batches, rnd, hp)


def test_an_svd_failing_in_one_run_of_an_iteration_wise_program_fails_that_run_only():
    """As above, for coin-flip rounds advanced iteration by iteration (`IterationProgram`): run 2's models are not
    finite, so the batched local step raises; the step is replayed run by run on the same rows: run 2 ends diverged
    with a NaN row, the others go on exactly as alone."""
    problem, federation = pfl(), Federation(8, 0, 1, 1)

    def sims():
        made = [Simulation(problem, SvdCheckedL2SGD(problem), federation, seed, 2) for seed in SEEDS]
        made[2].clients["x"] = torch.full_like(made[2].clients["x"], math.inf)
        return made

    alone_sims = sims()
    alone = [list(sim) for sim in alone_sims]
    assert [sim.status for sim in alone_sims] == ["finished", "finished", "diverged", "finished"]
    [(_, program)] = programs(batch := sims())
    assert isinstance(program, IterationProgram)
    batched = rows_by_run(program, len(SEEDS))
    assert [sim.status for sim in batch] == ["finished", "finished", "diverged", "finished"]
    assert all(math.isnan(v) for k, v in batched[2][-1].items() if k not in ENGINE)
    assert_same([alone[i] for i in (0, 1, 3)], [batched[i] for i in (0, 1, 3)], 1e-12)


def test_what_cannot_share_a_batch_is_refused_with_the_reason():
    problem = small_lasso()
    federation = Federation(3, 3, 2, 5)

    def sim(name="fedavg", problem=problem, **hp):
        return Simulation(problem, fedbench.make_algorithm(name, problem, **hp), federation, 0)

    assert why_not_batchable([sim(), sim()]) is None
    assert why_not_batchable([sim(client_lr=0.1), sim(client_lr=0.2)]) is None  # a per-run hyperparameter
    assert "not in subgradient" in why_not_batchable([sim(subgradient=True), sim(subgradient=False)])
    assert why_not_batchable([sim("pfedme", client_lr=0.1), sim("pfedme", client_lr=0.2)]) is None
    assert why_not_batchable([sim("fedda", client_lr=0.1), sim("fedda", client_lr=0.2)]) is None  # every float
    assert "problem instance" in why_not_batchable([sim(), sim(problem=small_lasso())])
    blocks = pfl()  # ASVRCD-PFL with a refresh coin at every iteration draws inside an iteration-wise program's steps
    assert "draws inside its rounds' steps" in why_not_batchable([sim("asvrcd_pfl", blocks, count_refresh=False)] * 2)
    with pytest.raises(NotBatchable, match="draws inside its rounds' steps"):
        RoundProgram([sim("asvrcd_pfl", blocks, count_refresh=False)] * 2)
    assert why_not_batchable([sim("asvrcd_pfl", blocks, count_refresh=False)]) is None  # a run alone is a program


class RoundedSteps(fedbench.ALGORITHMS["fedavg"]):
    """FedAvg whose `derive` gives a non-float value from a float hyperparameter: a whole number of local steps per
    unit of step size, which a program cannot hold per run."""

    name = "rounded_steps"

    def derive(self, hp):
        return {"steps_per_unit": round(1 / hp.client_lr)}

    def client_step(self, local, batches, rnd, hp):
        w = local["w"]
        return {"w": w - hp.client_lr * batches.D.grad(w) * (hp.steps_per_unit / 10)}


def test_runs_whose_non_float_derived_values_differ_do_not_share_a_program():
    """A derived value that is not a float is one per program: runs where it differs run alone (before, a program
    took the first run's value for every run)."""
    problem, federation = small_lasso(), Federation(4, 3, 2, 5)

    def sims(rates):
        return [Simulation(problem, RoundedSteps(problem, client_lr=rate), federation, 0, 2) for rate in rates]

    assert why_not_batchable(sims([0.1, 0.1 + 1e-12])) is None  # the same derived value: one program
    assert "derived values steps_per_unit" in why_not_batchable(sims([0.1, 0.05]))
    with pytest.raises(NotBatchable, match="steps_per_unit"):
        RoundProgram(sims([0.1, 0.05]))
    from sweeps.driving import drive

    alone = [drive(sim).rows for sim in sims([0.1, 0.05])]
    assert [outcome.rows for outcome in drive_batch(sims([0.1, 0.05]))] == alone


def test_simulations_that_cannot_share_a_program_run_one_after_another():
    """`drive_batch` on simulations `why_not_batchable` refuses runs them alone instead of failing them all."""
    from sweeps.driving import drive, drive_batch

    problem, federation = small_lasso(), Federation(6, 3, 2, 5)

    def sims():
        return [Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.01, subgradient=sub),
                           federation, 0, 2) for sub in (True, False)]

    assert why_not_batchable(sims())
    seen = []
    outcomes = drive_batch(sims(), lambda i, row, seconds: seen.append(i))
    assert [o.rows for o in outcomes] == [drive(sim).rows for sim in sims()]
    assert [o.status for o in outcomes] == ["finished", "finished"] and seen == [0] * 4 + [1] * 4
    # run_seeds runs such an algorithm alone, seed by seed
    blocks, coins = pfl(), Federation(4, 0, 1, 1)
    rows = run_seeds(blocks, "asvrcd_pfl", coins, [0, 1], eval_every=1, count_refresh=False)
    assert rows == curves_alone(blocks, "asvrcd_pfl", coins, {"count_refresh": False}, [0, 1], eval_every=1)


BATCHED = """\
name: batched
problem: {name: pfl_synthetic, preset: s1, sigma_h: 1.0}
federation: {rounds: 8, clients_per_round: 0, local_steps: 1, batch_size: 1}
algorithms:
  ascd_pfl: {}
  lsgd_pfl: {client_lr: 0.01, federation: {local_steps: 5}}
  asvrcd_pfl: {count_refresh: false}
seeds: 4
eval_every: 2
"""


@pytest.mark.ray
def test_a_sweep_runs_the_seeds_of_a_configuration_as_one_program(ray_local, tmp_path, tracking_uri):
    """ASCD-PFL's and LSGD-PFL's four seeds run as one program each (tag runs_in_batch = 4) and log each seed's
    curve as it is alone; ASVRCD-PFL with the CV code's counting (a ρ-coin every iteration, drawn inside the
    batched steps: not on the run axis) runs seed by seed on the same recipe."""
    from mlflow.tracking import MlflowClient

    from sweeps.driving import build_simulation, drive
    from sweeps.recipe import load
    from sweeps.sweep import sweep

    path = tmp_path / "batched.yaml"
    path.write_text(BATCHED)
    recipe = load(path)
    summary = sweep(recipe, tracking=tracking_uri)
    assert summary.ok and summary.counts["finished"] == 12
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("batched")
    nested = [run for run in client.search_runs([experiment.experiment_id], max_results=100)
              if run.data.tags.get("role") == "trial"]
    assert {(run.data.tags["algorithm"], run.data.tags["runs_in_batch"]) for run in nested} == {
        ("ascd_pfl", "4"), ("lsgd_pfl", "4"), ("asvrcd_pfl", "1")}
    by_key = {(run.data.tags["algorithm"], int(run.data.tags["seed"])): run for run in nested}
    trials = recipe.trials()
    problem = build_simulation(trials[0], "cpu").problem  # the data do not follow the seed: one instance serves all
    for trial in trials:
        alone = drive(build_simulation(trial, problem=problem)).rows
        run = by_key[(trial.algorithm, trial.seed)]
        history = sorted(client.get_metric_history(run.info.run_id, "objective"), key=lambda m: m.step)
        assert [m.step for m in history] == [row["round"] for row in alone]
        for metric, row in zip(history, alone):
            assert metric.value == pytest.approx(row["objective"], rel=1e-12, abs=0)


GRID = """\
name: lr-grid
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05, data_seed: 1}
federation: {rounds: 8, clients_per_round: 4, local_steps: 3, batch_size: 5}
algorithms:
  fedmid: {client_lr: [1.0e-3, 3.0e-3, 1.0e-2]}
seeds: [5]
eval_every: 2
"""


@pytest.mark.ray
def test_a_sweep_batches_the_values_of_a_per_run_hyperparameter(ray_local, tmp_path, tracking_uri):
    """A step-size grid on shared data: the configurations differ only in FedMiD's client_lr, a per-run
    hyperparameter, so that they share programs (on 2 slots: one of 2 runs, one of 1); each logged curve is the
    run alone."""
    from mlflow.tracking import MlflowClient

    from sweeps.driving import build_simulation, drive
    from sweeps.recipe import load
    from sweeps.sweep import sweep

    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    recipe = load(path)
    summary = sweep(recipe, tracking=tracking_uri, max_concurrent=2)
    assert summary.ok and summary.counts["finished"] == 3
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("lr-grid")
    nested = [run for run in client.search_runs([experiment.experiment_id]) if run.data.tags.get("role") == "trial"]
    assert sorted(run.data.tags["runs_in_batch"] for run in nested) == ["1", "2", "2"]
    by_lr = {float(run.data.params["algorithm.client_lr"]): run for run in nested}
    for trial in recipe.trials():
        alone = drive(build_simulation(trial, "cpu")).rows
        history = sorted(client.get_metric_history(by_lr[trial.hyperparameters["client_lr"]].info.run_id,
                                                   "objective"), key=lambda m: m.step)
        assert [m.step for m in history] == [row["round"] for row in alone]
        for metric, row in zip(history, alone):
            assert metric.value == pytest.approx(row["objective"], rel=1e-12, abs=0)


@pytest.mark.parametrize("make", [pfl, lambda: fedbench.make_problem("pfl_images", classes=2, train=10, test=20)],
                         ids=["pfl_synthetic", "pfl_images"])
def test_block_problems_draw_step_after_step(make):
    """`draws_by_step`, on which iteration-wise programs rely to draw a run's rows ahead: 7 + 5 + 30 steps drawn
    one round after another are the 42 steps drawn at once."""
    problem = make()
    assert problem.draws_by_step
    clients = torch.arange(problem.num_clients)
    gen = torch.Generator().manual_seed(4)
    rounds = torch.cat([problem.draw_minibatches(clients, steps, 3, gen) for steps in (7, 5, 30)])
    assert torch.equal(rounds, problem.draw_minibatches(clients, 42, 3, torch.Generator().manual_seed(4)))


BLOCK_MIXED = [(0, 1.0, 1.0), (3, 1000.0, 1.0), (7, 1.0, 0.5), (11, 0.5, 2.0)]  # (seed, step factor, second factor)
BLOCK_MIXED_CASES = {  # Hanzely et al.'s methods -> (step size, the second per-run hyperparameter, its base value)
    "ascd_pfl": ("eta", "p_w", lambda problem: rules(problem).p_w),
    "scd_pfl": ("eta", "p_w", lambda problem: rules(problem).p_w),
    "asvrcd_pfl": ("eta", "rho", lambda problem: 0.05),  # refreshes exercised; ζ and refresh coins drawn per run
    "svrcd_pfl": ("eta", "rho", lambda problem: 0.05),
    "l2sgd_plus": ("eta", "p", lambda problem: rules(problem).p_w),
    "lsgd_pfl": ("client_lr", None, None),
}


@pytest.mark.parametrize("name", sorted(BLOCK_MIXED_CASES))
def test_block_methods_take_per_run_step_sizes_and_probabilities(name):
    """Hanzely, Zhao, Kolar's methods in one batch with each run's own η (and p_w, ρ or p): their Thm 8/9
    parameters follow per run (`run_derived`), and so do the lengths of the coin-flip rounds; each run gives its curve
    alone. Run 1's step is 1000x the rule's: it diverges and leaves the batch."""
    step, second, base = BLOCK_MIXED_CASES[name]
    problem, federation = pfl(), Federation(12, 0, 1 if name != "lsgd_pfl" else 5, 1)
    start = rules(problem).eta if step == "eta" else 10.0  # LSGD's logistic gradients are bounded: 1e4 diverges

    def sims():
        return [Simulation(problem, fedbench.make_algorithm(name, problem, **{step: start * factor},
                                                            **({second: base(problem) * other} if second else {})),
                           federation, seed, 3)
                for seed, factor, other in BLOCK_MIXED]

    alone_sims = sims()
    alone = [list(sim) for sim in alone_sims]
    assert [sim.status for sim in alone_sims] == ["finished", "diverged", "finished", "finished"]
    batch = sims()
    assert why_not_batchable(batch) is None
    batched = rows_by_run(run_batch(batch), len(BLOCK_MIXED))
    assert_same(alone, batched, 1e-12)
    assert [sim.status for sim in batch] == [sim.status for sim in alone_sims]
    assert len({curve[-1]["objective"] for curve in alone}) == len(BLOCK_MIXED)  # the runs really differ


@pytest.mark.parametrize("name", ["ascd_pfl", "asvrcd_pfl", "l2sgd_plus"])
def test_rows_drawn_ahead_a_few_iterations_at_a_time(monkeypatch, name):
    """An iteration-wise program draws its runs' rows ahead, here 7 iterations at a time: the draws that fall in the
    middle of rounds still give every run its rows alone."""
    problem, federation = pfl(), Federation(6, 0, 1, 1)
    monkeypatch.setattr(fedbench.engine.iteration_wise, "STREAM_BYTES", 8 * problem.num_clients * len(SEEDS) * 7)
    sims = [Simulation(problem, fedbench.make_algorithm(name, problem), federation, seed, 2) for seed in SEEDS]
    [(_, batch)] = programs(sims)
    assert batch.ahead_steps == 7
    assert_same(curves_alone(problem, name, federation, {}, SEEDS, eval_every=2), rows_by_run(batch, len(SEEDS)),
                1e-12)
    assert batch.iteration > 7 * 5


def test_a_step_size_grid_of_a_block_method_plans_one_program():
    """ASCD-PFL's η grid with two seeds on S1's data (which do not follow the seed): the six runs differ only in
    per-run hyperparameters, so that the sweep plans them as one program; a grid over a choice does not."""
    from fedbench.engine.planning import plan
    from sweeps.recipe import parse

    def planned(algorithms):
        recipe = parse({"name": "grid", "problem": {"name": "pfl_synthetic", "preset": "s1"},
                        "federation": {"rounds": 5, "clients_per_round": 0, "local_steps": 1, "batch_size": 1},
                        "algorithms": algorithms, "seeds": 2}, "grid.yaml")
        batches, singles = plan(list(enumerate(recipe.trials())), 64, 1)
        return sorted(len(batch) for batch in batches), len(singles)

    assert planned({"ascd_pfl": {"eta": [1.0, 3.0, 5.0]}}) == ([6], 0)
    assert planned({"ascd_pfl": {"eta": [1.0, 3.0], "p_w": [0.02, 0.05]}}) == ([8], 0)
    assert planned({"acd_pfl": {"unsampled_y": ["x", "keep"]}}) == ([2, 2], 0)
