"""Hyperparameter schedules (`fedbench.schedules`): each kind's values against its formula written in NumPy; FedMiD
with scheduled step sizes against an independent per-round NumPy loop fed the same draws; runs with different
schedules as one program (round-wise and iteration-wise) equal to each run alone; resumed from a checkpoint equal to
never stopped; a constant schedule equal to the plain float; the recipe's grids, hashes and MLflow params; and the
refusals, at `fedbench validate`, one line with the field path."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fedbench
from fedbench.algorithms.l2sgd_plus import L2SGDPlus
from fedbench.engine.federation import RoundSampler
from fedbench.engine.planning import plan, why_not_batchable
from fedbench.engine.runs import IterationProgram, programs
from fedbench.engine.simulate import Federation, Simulation, run_batch
from fedbench.hparams import HParams, Param, ParamError
from fedbench.rng import generator
from fedbench.schedules import BadField, Constant, Cosine, Exponential, InverseSqrt, Step, make
from helpers import assert_same, interrupted, invoke, np_prox, pfl, refused, rows_by_run, rows_of
from small_problems import small_lasso
from sweeps.recipe import assigned, load

# -- each kind's values --------------------------------------------------------------------------------------------


def np_values(kind: str, rounds: int, init, warmup=0, warmup_init=0.0, **own):
    """The kind's formula at rounds 0 .. rounds-1, written from its definition in NumPy, whole arrays at once."""
    r = np.arange(rounds, dtype=np.float64)
    k, horizon = r - warmup, max(rounds - warmup, 1)
    decayed = {
        "constant": lambda: np.full(rounds, init),
        "step": lambda: init * np.power(own["factor"], np.floor(k / own["every"])),
        "exponential": lambda: init * np.power(own["rate"], k),
        "inverse_sqrt": lambda: init / np.sqrt(1 + k / own.get("scale", 1.0)),  # scale defaults to 1
        "cosine": lambda: own["final"] + (init - own["final"]) * (1 + np.cos(np.pi * k / horizon)) / 2,
    }[kind]()
    warming = warmup_init + (init - warmup_init) * r / max(warmup, 1)
    return np.where(r < warmup, warming, decayed)


VALUE_CASES = [
    Constant(init=0.3),
    Constant(init=0.3, warmup=4, warmup_init=0.05),
    Step(init=0.5, every=3, factor=0.1),
    Step(init=0.5, every=1, factor=2.0, warmup=2),
    Exponential(init=0.2, rate=0.9),
    Exponential(init=0.2, rate=0.97, warmup=5),
    InverseSqrt(init=1.0),
    InverseSqrt(init=1.0, scale=7.5, warmup=3, warmup_init=0.1),
    Cosine(init=0.1, final=0.001),
    Cosine(init=0.1, final=0.02, warmup=6),
]


@pytest.mark.parametrize("schedule", VALUE_CASES, ids=str)
def test_values_follow_the_formula(schedule):
    rounds = 25
    fields = {k: v for k, v in schedule.as_config().items() if k != "schedule"}
    expected = np_values(schedule.kind, rounds, **fields)
    got = np.array([schedule.value(r, rounds) for r in range(rounds)])
    np.testing.assert_allclose(got, expected, rtol=1e-14, atol=0)
    assert got[schedule.warmup] == pytest.approx(schedule.init, rel=1e-15)  # the warm-up ends at init
    if schedule.warmup:
        assert got[0] == schedule.warmup_init


def test_the_cosine_reaches_final_one_round_after_the_last():
    schedule = Cosine(init=1.0, final=0.25)
    assert schedule.value(10, 10) == 0.25 and schedule.value(9, 10) > 0.25
    assert schedule.value(5, 10) == pytest.approx(0.625, rel=1e-15)  # halfway: the mean of init and final


def test_fields_are_checked_where_they_are_given():
    with pytest.raises(BadField, match="every: expected an integer"):
        Step(init=0.1, every=1.5, factor=0.5)
    with pytest.raises(BadField, match="rate: expected float in \\(0, inf\\)"):
        Exponential(init=0.1, rate=0.0)
    with pytest.raises(BadField, match="init: expected a finite float"):
        Constant(init=float("inf"))
    with pytest.raises(BadField, match="final: a cosine schedule needs it"):
        make("cosine", init=0.1)
    with pytest.raises(BadField, match="did you mean 'factor'"):
        make("step", init=0.1, every=2, factr=0.5)
    with pytest.raises(ValueError, match="did you mean 'cosine'"):
        make("cosin", init=0.1, final=0.01)
    assert Step(init=1, every=2.0, factor=1).every == 2 and isinstance(Step(init=1, every=2, factor=1).init, float)


def test_a_float_parameter_takes_a_schedule_in_its_range_and_no_other_parameter_takes_one():
    param = Param("lr", "float", 0.1, "a step size", low=0, low_open=True)
    assert param.check(Cosine(init=0.1, final=0.01)) == Cosine(init=0.1, final=0.01)
    assert param.check(Cosine(init=0.1, final=0.01, warmup=2)).warmup_init == 0.0  # a warm-up may start at 0
    with pytest.raises(BadField, match="final: expected float in \\(0, inf\\), found 0.0"):
        param.check(Cosine(init=0.1, final=0.0))
    with pytest.raises(ValueError, match="a schedule is for a float"):
        Param("steps", "int", 1, "local steps", low=1).check(Constant(init=1.0))


# -- FedMiD with schedules against a NumPy loop --------------------------------------------------------------------

def np_fedmid(problem, federation, seed, client_lr, server_lr):
    """FedMiD (Bao et al.'s server threshold η_s·η_c) written out in NumPy, one client after another, its step sizes
    `client_lr[r]` and `server_lr[r]` at round r, on the draws of the run's own sampler: the iterate after each
    round."""
    x, y = problem.features.numpy(), problem.labels.numpy()
    sampler = RoundSampler(problem, federation, seed)
    w = problem.init_params(generator(seed, "init")).numpy()
    iterates = []
    for r in range(federation.rounds):
        clients, draws = sampler.draw(federation.local_steps)
        eta, eta_s = client_lr[r], server_lr[r]
        uploads = []
        for k in range(len(clients)):
            u = w.copy()
            for rows in draws["D"][:, k].numpy():
                gradient = x[rows].T @ (x[rows] @ u - y[rows]) / len(rows)
                u = np_prox(problem, u - eta * gradient, eta)
            uploads.append(u)
        w = np_prox(problem, w + eta_s * (np.mean(uploads, axis=0) - w), eta_s * eta)
        iterates.append(w)
    return iterates


def test_fedmid_with_schedules_equals_a_numpy_loop_round_by_round():
    problem = small_lasso(lam=0.1)
    federation = Federation(rounds=14, clients_per_round=3, local_steps=3, batch_size=5)
    client_lr = Cosine(init=0.08, final=0.005, warmup=3, warmup_init=0.01)
    server_lr = Exponential(init=1.0, rate=0.93)
    sim = Simulation(problem, fedbench.make_algorithm("fedmid", problem, client_lr=client_lr, server_lr=server_lr),
                     federation, seed=5)
    expected = np_fedmid(problem, federation, 5, np_values("cosine", 14, init=0.08, warmup=3, warmup_init=0.01,
                                                           final=0.005),
                         np_values("exponential", 14, init=1.0, rate=0.93))
    for r, w in enumerate(expected):
        sim.run_round()
        np.testing.assert_allclose(sim.server["w"].numpy(), w, rtol=1e-12, atol=1e-12, err_msg=f"round {r}")
    constant = np_fedmid(problem, federation, 5, [0.08] * 14, [1.0] * 14)[-1]
    assert not np.allclose(expected[-1], constant, atol=1e-6)  # the schedules changed the iterates


# -- runs with schedules as one program ----------------------------------------------------------------------------

SAMPLED = Federation(rounds=12, clients_per_round=3, local_steps=3, batch_size=5)
GRID = [Cosine(init=0.05, final=0.001), Cosine(init=0.02, final=0.001, warmup=4), Step(init=0.05, every=3, factor=0.5),
        Exponential(init=0.03, rate=0.9)]


def fedmid_runs(problem, schedules, seeds, eval_every=3):
    return [Simulation(problem, fedbench.make_algorithm("fedmid", problem, client_lr=s), SAMPLED, seed, eval_every)
            for s in schedules for seed in seeds]


def test_runs_with_different_schedules_form_one_program_equal_to_each_run_alone():
    problem = small_lasso(lam=0.05)
    sims = fedmid_runs(problem, GRID, [0, 3])
    [(runs, program)] = programs(sims)
    assert len(runs) == len(sims) and type(program).__name__ == "RoundProgram"
    batched = rows_by_run(run_batch(sims), len(sims))
    alone = [list(sim) for sim in fedmid_runs(problem, GRID, [0, 3])]
    assert batched == alone  # bit for bit
    assert len({row["objective"] for curve in alone for row in curve[-1:]}) == len(sims)  # every run its own


def test_a_constant_schedule_is_the_plain_float_bit_for_bit():
    problem = small_lasso(lam=0.05)
    scheduled = Simulation(problem, fedbench.make_algorithm("fedmid", problem, client_lr=Constant(init=0.03)),
                           SAMPLED, 2, 3)
    plain = Simulation(problem, fedbench.make_algorithm("fedmid", problem, client_lr=0.03), SAMPLED, 2, 3)
    assert list(scheduled) == list(plain)
    assert torch.equal(scheduled.server["w"], plain.server["w"])


def test_a_schedule_and_a_float_of_one_hyperparameter_do_not_share_a_program():
    problem = small_lasso(lam=0.05)
    sims = [Simulation(problem, fedbench.make_algorithm("fedmid", problem, client_lr=lr), SAMPLED, 0)
            for lr in (0.03, Constant(init=0.03))]
    assert "not in client_lr" in why_not_batchable(sims)


def test_a_resumed_program_of_schedules_gives_the_rows_of_one_never_stopped():
    problem = small_lasso(lam=0.05)

    def make():
        [(_, program)] = programs(fedmid_runs(problem, GRID, [1]))
        return program
    expected = rows_of(make())
    for at in (1, 7):  # after the first round, and in the cosine's warm-up's last round
        resumed, _ = interrupted(make, at)
        assert resumed == expected


class ScaledL2SGD(L2SGDPlus):
    """L2SGD+ (random rounds, every client: an iteration-wise program) whose step size α is scaled by a float
    hyperparameter, to schedule: the test's algorithm."""
    name = "l2sgd_scaled"
    hparams = (*L2SGDPlus.hparams, Param("scale", "float", 1.0, "multiplies the step size α", low=0, low_open=True))

    def client_step(self, local, batches, rnd, hp):
        return super().client_step(local, batches, rnd, HParams({**hp, "alpha": hp.alpha * hp.scale}))


ITERATION_WISE = Federation(rounds=6, clients_per_round=0, local_steps=1, batch_size=1)
# each with its own seed: its rounds' lengths, so that the runs are at different rounds
SCALED = [(Cosine(init=1.5, final=0.2), 0), (Step(init=1.0, every=2, factor=0.6, warmup=2), 4),
          (Exponential(init=1.2, rate=0.85), 9)]


def scaled_runs(problem, runs):
    return [Simulation(problem, ScaledL2SGD(problem, scale=scale), ITERATION_WISE, seed, 3) for scale, seed in runs]


@pytest.fixture(scope="module")
def problem():
    return pfl()  # the synthetic problem of Hanzely et al., shared by the iteration-wise tests


def test_an_iteration_wise_program_gives_each_run_its_own_rounds_values(problem):
    """The runs of an iteration-wise program are at different rounds: each takes its own schedule's value at its own
    round (against each run alone, round by round), at a round's opening, its steps and its end."""
    sims = scaled_runs(problem, SCALED)
    [(runs, program)] = programs(sims)
    assert isinstance(program, IterationProgram) and len(runs) == len(sims)
    alone = [list(sim) for sim in scaled_runs(problem, SCALED)]
    assert_same(alone, rows_by_run(program, len(sims)), 1e-12)
    assert len({sim.iterations for sim in sims}) == len(sims)  # rounds of different lengths: at different rounds
    constant = list(scaled_runs(problem, [(1.5, 0)])[0])
    assert alone[0][-1]["objective"] != constant[-1]["objective"]  # the schedule mattered


def test_an_iteration_wise_constant_schedule_is_the_plain_float_and_resumes(problem):
    plain = rows_by_run(programs(scaled_runs(problem, [(0.8, 0), (0.8, 4)]))[0][1], 2)
    scheduled = rows_by_run(programs(scaled_runs(problem, [(Constant(init=0.8), 0), (Constant(init=0.8), 4)]))[0][1], 2)
    assert scheduled == plain

    def make():
        [(_, program)] = programs(scaled_runs(problem, SCALED))
        return program
    expected = rows_of(make())
    resumed, _ = interrupted(make, 9)
    assert resumed == expected


# -- what reads a scheduled hyperparameter outside the rounds ------------------------------------------------------

def test_a_schedule_that_derive_or_a_per_run_hook_reads_is_refused_as_the_run_is_built():
    problem = small_lasso()
    with pytest.raises(ParamError, match="client_lr: follows a schedule, but ditto reads it in derive"):
        fedbench.make_algorithm("ditto", problem, client_lr=Cosine(init=0.1, final=0.01))
    # with its own personal_lr, Ditto's derive does not read client_lr
    assert fedbench.make_algorithm("ditto", problem, client_lr=Cosine(init=0.1, final=0.01), personal_lr=0.05)
    algorithm = fedbench.make_algorithm("fast_fedda", problem, a=Constant(init=2.0), alpha="quadratic")
    with pytest.raises(ParamError, match="reads it outside its rounds"):
        Simulation(problem, algorithm, SAMPLED, 0)  # init_server reads self.hp.a


# -- recipes -------------------------------------------------------------------------------------------------------

RECIPE = """\
name: scheduled
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05, data_seed: 0}
federation: {rounds: 10, clients_per_round: 4, local_steps: 2, batch_size: 5}
algorithms:
  fedmid: {client_lr: {schedule: cosine, init: [0.05, 0.02], final: 0.001, warmup: 2}}
seeds: 2
eval_every: 5
"""


def write(tmp_path, text=RECIPE):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


def test_lists_in_a_schedule_are_a_grid_that_plans_as_one_program(tmp_path):
    recipe = load(write(tmp_path))
    schedules = [trial.hyperparameters["client_lr"] for trial in recipe.trials()]
    assert schedules == [Cosine(init=init, final=0.001, warmup=2) for init in (0.05, 0.05, 0.02, 0.02)]
    assert len(plan(list(enumerate(recipe.trials())), cap=8).programs) == 1  # grid points and seeds together
    overridden = load(write(tmp_path), ["algorithms.fedmid.client_lr.init=[0.1, 0.2, 0.3]"])
    assert [t.hyperparameters["client_lr"].init for t in overridden.trials()][::2] == [0.1, 0.2, 0.3]
    axis = load(write(tmp_path), ["algorithms.fedmid.client_lr=[0.01, {schedule: step, init: 0.1, every: 2, "
                                  "factor: [0.5, 0.9]}]"])
    assert [str(t.hyperparameters["client_lr"]) for t in axis.trials()][::2] == [
        "0.01", "step(init=0.1, every=2, factor=0.5)", "step(init=0.1, every=2, factor=0.9)"]


def test_the_configuration_hash_tells_schedules_apart_and_keeps_a_float_recipes():
    hashes = {str(schedule): load_trial(schedule).config_hash
              for schedule in (0.05, Cosine(init=0.05, final=0.001), Cosine(init=0.05, final=0.002),
                               Step(init=0.05, every=2, factor=0.5), Constant(init=0.05))}
    assert len(set(hashes.values())) == len(hashes)
    # a recipe without schedules hashes as it did before them: its stored runs are found again
    shipped = {t.algorithm: t.config_hash for t in load("recipes/papers/bao2022_lasso.yaml").trials()}
    assert shipped["fedmid"] == "57db67c37ca9" and shipped["fedda"] == "a4b1eefdb8a7"


def load_trial(client_lr):
    from sweeps.recipe import parse

    document = {"problem": {"name": "lasso", "clients": 8, "samples_per_client": 20, "dim": 30, "support": 10},
                "federation": {"clients_per_round": 4},
                "algorithms": {"fedmid": {"client_lr": client_lr if isinstance(client_lr, float)
                                          else client_lr.as_config()}}}
    return parse(document, "r.yaml").single_trial()


def test_fedbench_run_of_a_scheduled_recipe_gives_the_engine_rows_and_logs_the_schedule(tmp_path, tracking_uri):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "rows.json"
    result = invoke("run", write(tmp_path), "--set", "algorithms.fedmid.client_lr.init=0.05", "--json", out,
                    "--tracking-uri", tracking_uri)
    assert result.exit_code == 0, result.output
    assert "cosine(init=0.05, final=0.001, warmup=2)" in result.output
    problem = fedbench.make_problem("lasso", seed=0, clients=8, samples_per_client=20, dim=30, support=10, lam=0.05,
                                    data_seed=0)
    algorithm = fedbench.make_algorithm("fedmid", problem, client_lr=Cosine(init=0.05, final=0.001, warmup=2))
    engine = list(Simulation(problem, algorithm, Federation(10, 4, 2, 5), 0, 5))
    assert json.loads(out.read_text()) == engine
    (run,) = MlflowClient(tracking_uri).search_runs(
        [MlflowClient(tracking_uri).get_experiment_by_name("scheduled").experiment_id])
    assert run.data.params["algorithm.client_lr"] == "cosine(init=0.05, final=0.001, warmup=2)"


TUNED = RECIPE.replace("init: [0.05, 0.02]", "init: 0.05") + """\
tune:
  space: {client_lr.init: {log_uniform: [1.0e-3, 1.0e-1]}, algorithms.fedmid.client_lr.warmup: {int: [0, 5]}}
  metric: objective
"""


def test_tune_searches_a_field_of_a_schedule(tmp_path):
    from sweeps.tuning import best_recipe

    recipe = load(write(tmp_path, TUNED))
    assert [(d.path("fedmid"), d.distribution, d.bounds) for d in recipe.dimensions] == [
        ("algorithms.fedmid.client_lr.init", "log_uniform", (1e-3, 0.1)),
        ("algorithms.fedmid.client_lr.warmup", "int", (0, 5))]
    sampled = {"algorithms.fedmid.client_lr.init": 0.03, "algorithms.fedmid.client_lr.warmup": 4}
    assert assigned(recipe, sampled).single_trial("fedmid").hyperparameters["client_lr"] == Cosine(
        init=0.03, final=0.001, warmup=4)
    best = best_recipe(recipe, "fedmid", {"client_lr.init": 0.03, "algorithms.fedmid.client_lr.warmup": 4}, [1])
    assert best.trials()[0].hyperparameters["client_lr"] == Cosine(init=0.03, final=0.001, warmup=4)
    for space, where, phrase in [
            ("{client_lr.init: {uniform: [-1, 1]}}", "tune.space.client_lr.init.uniform[0]", "expected float in (0"),
            ("{client_lr.every: {int: [1, 4]}}", "tune.space.client_lr.every: algorithms.fedmid.client_lr is cosine(",
             "expected one schedule that has the field every"),
            ("{client_lr.warmup: {uniform: [1, 4]}}", "tune.space.client_lr.warmup.uniform: client_lr.warmup is int",
             "")]:
        path = write(tmp_path, TUNED)
        refused(invoke("validate", path, "--set", f"tune.space={space}"), f"{path}: {where}", phrase)


def test_list_names_the_kinds_with_their_formulas():
    listing = invoke("list", "schedules")
    assert listing.exit_code == 0
    assert "cosine: final + (init − final)·(1 + cos(πk/H))/2  (init, final, [warmup]" in listing.output


REFUSALS = {  # the fedmid entry (or the algorithms block) -> the refusal's path and what it says
    "unknown kind": ("fedmid: {client_lr: {schedule: cosin, init: 0.1, final: 0.01}}",
                     "algorithms.fedmid.client_lr.schedule: found 'cosin'", "did you mean 'cosine'?"),
    "missing field": ("fedmid: {client_lr: {schedule: step, init: 0.1, every: 2}}",
                      "algorithms.fedmid.client_lr: a step schedule needs factor", "decay"),
    "unknown field": ("fedmid: {client_lr: {schedule: cosine, init: 0.1, fnal: 0.01}}",
                      "algorithms.fedmid.client_lr.fnal: unknown field of a cosine schedule", "did you mean 'final'?"),
    "no kind": ("fedmid: {client_lr: {init: 0.1}}", "algorithms.fedmid.client_lr: found a mapping without schedule:",
                "cosine"),
    "init out of the range": ("fedmid: {client_lr: {schedule: cosine, init: [0.1, 0], final: 0.01}}",
                              "algorithms.fedmid.client_lr.init[1]: expected float in (0, inf), found 0", ""),
    "field out of its own range": ("fedmid: {client_lr: {schedule: step, init: 0.1, every: 0, factor: 0.5}}",
                                   "algorithms.fedmid.client_lr.every: expected int in [1, inf), found 0", ""),
    "warm-up start below the range": (
        "fedmid: {client_lr: {schedule: constant, init: 0.1, warmup: 2, warmup_init: -0.1}}",
        "algorithms.fedmid.client_lr.warmup_init: expected float in [0, inf), found -0.1", ""),
    "non-float": ("fedmid: {server_threshold: {schedule: constant, init: 1.0}}",
                  "algorithms.fedmid.server_threshold: found a schedule, expected choice", "a schedule is for a float"),
    "read by derive": ("ditto: {client_lr: {schedule: exponential, init: 0.1, rate: 0.99}}",
                       "algorithms.ditto.client_lr: follows a schedule, but ditto reads it in derive", "one value"),
    "read by init_server": ("fast_fedda: {alpha: quadratic, a: {schedule: constant, init: 2.0}}",
                            "algorithms.fast_fedda.a: follows a schedule", "outside its rounds"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_validate_refuses_a_bad_schedule_in_one_line_with_its_field(tmp_path, case):
    entry, where, phrase = REFUSALS[case]
    text = RECIPE.replace("  fedmid: {client_lr: {schedule: cosine, init: [0.05, 0.02], final: 0.001, warmup: 2}}",
                          f"  {entry}")
    path = write(tmp_path, text)
    refused(invoke("validate", path), f"{path}: {where}", phrase)


def test_a_problem_parameter_takes_no_schedule(tmp_path):
    path = write(tmp_path)
    refused(invoke("validate", path, "--set", "problem.lam={schedule: constant, init: 0.1}"),
            f"{path}: problem.lam: found a mapping, expected float", "only an algorithm's hyperparameters")
    with pytest.raises(ValueError, match="lasso.lam: found the schedule constant\\(init=0.1\\), expected one value"):
        fedbench.make_problem("lasso", lam=Constant(init=0.1))
