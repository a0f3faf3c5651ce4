"""`fedbench tune` with real Optuna SQLite studies and a real local Ray: it finds a good step size,
continues its study, really prunes, and re-runs the best configuration on fresh seeds."""
from __future__ import annotations

import math
import warnings

import numpy as np
import optuna
import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from cli import app
from fedbench.axes.transforms import Step, index_bits, kept_count
from helpers import invoke, refused
from sweeps.driving import build_simulation, drive
from sweeps.recipe import assigned, load
from sweeps.tuning import best_recipe, make_sampler, study_name

RECIPE = """\
name: tune-lasso
problem: {name: lasso, clients: 8, samples_per_client: 40, dim: 30, support: 10, lam: 0.05}
federation: {rounds: 150, clients_per_round: 4, local_steps: 5, batch_size: 5}
algorithms:
  fedmid: {}
seeds: [0]
eval_every: 10
tune:
  space: {client_lr: {log_uniform: [1.0e-4, 1.0]}}
  metric: objective_gap
  mode: min
  trials: 20
"""


def write(tmp_path, text):
    path = tmp_path / "tune.yaml"
    path.write_text(text)
    return path


def tune(path, uri, *extra):
    result = CliRunner().invoke(app, ["tune", str(path), "--tracking-uri", uri, *map(str, extra)])
    assert result.exit_code == 0, result.output
    return result


def study(tmp_path, algorithm="fedmid"):
    return optuna.load_study(study_name=f"tune-lasso:{algorithm}",
                             storage=f"sqlite:///{tmp_path / 'optuna-tune-lasso.db'}")


def runs(uri, role):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("tune-lasso")
    return [run for run in client.search_runs([experiment.experiment_id], max_results=1000)
            if run.data.tags.get("role") == role]


@pytest.mark.ray
def test_tuned_step_size_is_within_ten_percent_of_a_dense_grid(ray_local, tmp_path, tracking_uri):
    path = write(tmp_path, RECIPE)
    output = tune(path, tracking_uri).output
    tuned = study(tmp_path)
    assert len(tuned.trials) == 20 and "fedmid" in output

    recipe = load(path)
    grid = []
    for lr in np.logspace(-4, 0, 12):  # the same range, dense, run in-process
        outcome = drive(build_simulation(recipe.single_trial("fedmid", 0, {"algorithms.fedmid.client_lr": float(lr)})))
        if outcome.status == "finished":
            grid.append(outcome.rows[-1]["objective_gap"])
    assert tuned.best_value <= 1.1 * min(grid), (tuned.best_params, tuned.best_value, min(grid))

    nested = runs(tracking_uri, "tune_trial")
    assert len(nested) == 20 and len(runs(tracking_uri, "tune")) == 1
    statuses = {run.data.tags["status"] for run in nested}
    assert statuses <= {"finished", "diverged"} and "diverged" in statuses  # lr near 1 blows up
    diverged = [t for t in tuned.trials if t.user_attrs.get("diverged")]
    assert diverged and all(t.state == optuna.trial.TrialState.COMPLETE for t in diverged)
    parent = runs(tracking_uri, "tune")[0]
    assert math.isclose(float(parent.data.params["best.fedmid.client_lr"]), tuned.best_params["client_lr"])
    assert parent.data.tags["studies"] == study_name(recipe, "fedmid")


@pytest.mark.ray
def test_a_second_call_continues_the_study_and_fresh_restarts_it(ray_local, tmp_path, tracking_uri):
    path = write(tmp_path, RECIPE.replace("trials: 20", "trials: 3"))
    tune(path, tracking_uri)
    first = {t.params["client_lr"] for t in study(tmp_path).trials}
    tune(path, tracking_uri)
    trials = study(tmp_path).trials
    assert len(trials) == 6 and len({t.params["client_lr"] for t in trials}) == 6  # no replayed points
    assert first <= {t.params["client_lr"] for t in trials}
    tune(path, tracking_uri, "--fresh")
    assert len(study(tmp_path).trials) == 3

    changed = write(tmp_path, RECIPE.replace("trials: 20", "trials: 3").replace("lam: 0.05", "lam: 0.1"))
    refused = CliRunner().invoke(app, ["tune", str(changed), "--tracking-uri", tracking_uri])
    assert refused.exit_code == 2 and "--fresh" in refused.output


@pytest.mark.ray
def test_aggressive_pruning_stops_trials_early(ray_local, tmp_path, tracking_uri):
    text = RECIPE.replace("trials: 20", "trials: 8\n  pruner: {grace_rounds: 10, reduction_factor: 4}")
    tune(write(tmp_path, text), tracking_uri, "--max-concurrent", 1)
    pruned = [t for t in study(tmp_path).trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned
    client = MlflowClient(tracking_uri)
    for run in runs(tracking_uri, "tune_trial"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "objective_gap")]
        if run.data.tags["status"] == "pruned":
            assert steps[-1] < 150  # stopped early, its partial curve logged
        elif run.data.tags["status"] == "finished":
            assert steps[-1] == 150
    assert sum(run.data.tags["status"] == "pruned" for run in runs(tracking_uri, "tune_trial")) == len(pruned)


@pytest.mark.ray
def test_rerun_best_logs_runs_on_fresh_seeds(ray_local, tmp_path, tracking_uri):
    path = write(tmp_path, RECIPE.replace("trials: 20", "trials: 4"))
    output = tune(path, tracking_uri, "--rerun-best", 3).output
    best = study(tmp_path).best_params["client_lr"]
    reruns = runs(tracking_uri, "trial")
    assert len(reruns) == 3
    assert {int(run.data.tags["seed"]) for run in reruns}.isdisjoint({0}) and len({r.data.tags["seed"] for r in reruns}) == 3
    assert all(math.isclose(float(run.data.params["algorithm.client_lr"]), best) for run in reruns)
    (sweep_parent,) = runs(tracking_uri, "sweep")
    assert sweep_parent.data.tags["rerun_best_of"] == "tune-lasso:fedmid"
    assert "±" in output


# The transforms' parameters searched as a grid reaches them (`--set federation.uplink.0.top_k=[...]`): top-k's
# fraction k of the d = 30 coordinates, in front of a bare-name error feedback (its defaults).
TOP_K = RECIPE.replace("batch_size: 5}", "batch_size: 5, uplink: [{top_k: 0.5}, error_feedback]}").replace(
    "rounds: 150", "rounds: 20").replace("fedmid: {}", "fedmid: {client_lr: 0.05}").replace(
    "{client_lr: {log_uniform: [1.0e-4, 1.0]}}", "{federation.uplink.0.top_k: {log_uniform: [0.02, 1.0]}}").replace(
    "trials: 20", "trials: 4")


@pytest.mark.ray
def test_tune_searches_top_k_and_each_run_records_and_sends_the_k_it_was_given(ray_local, tmp_path, tracking_uri):
    tune(write(tmp_path, TOP_K), tracking_uri, "--max-concurrent", 1)
    sampled = {str(t.number): t.params["federation.uplink.0.top_k"] for t in study(tmp_path).trials}
    assert len(sampled) == 4 and len(set(sampled.values())) == 4
    client = MlflowClient(tracking_uri)
    nested = runs(tracking_uri, "tune_trial")
    assert sorted(run.data.tags["optuna_trial"] for run in nested) == sorted(sampled)
    for run in nested:
        k = sampled[run.data.tags["optuna_trial"]]
        assert run.data.params["federation.uplink"] == f"top_k(k={k}) → error_feedback(kind=ef)"
        # what the run sent up is what K = max(1, round(k·d)) of d = 30 costs: K·64 + min(K·⌈log₂ 30⌉, 30) bits (the
        # indices, or a mask where fewer) per client and round, 4 clients a round for 20 rounds
        (last,) = [m for m in client.get_metric_history(run.info.run_id, "comm_up_bits") if m.step == 20]
        assert last.value == 20 * 4 * (kept_count(k, 30) * 64 + min(kept_count(k, 30) * index_bits(30), 30))


def test_a_tuned_step_is_set_where_its_algorithm_reads_its_chain(tmp_path):
    """`federation.uplink.0.top_k` sets the recipe's chain, or an algorithm's own where it has one; the best
    configuration re-run holds it; a bare-name step takes a searched value as `{name: value}`."""
    text = TOP_K.replace("fedmid: {client_lr: 0.05}", "fedmid: {client_lr: 0.05}\n  fedavg: {client_lr: 0.05, "
                         "federation: {uplink: [{top_k: 0.2}]}}")
    recipe = load(write(tmp_path, text))
    (dimension,) = recipe.dimensions
    assert (dimension.path("fedmid"), dimension.path("fedavg")) == (
        "federation.uplink.0.top_k", "algorithms.fedavg.federation.uplink.0.top_k")
    for algorithm, rest in [("fedmid", (Step("error_feedback", (("kind", "ef"),)),)), ("fedavg", ())]:
        trial = assigned(recipe, {dimension.path(algorithm): 0.3}).single_trial(algorithm, 0)
        assert trial.federation.uplink == (Step("top_k", (("k", 0.3),)), *rest)
        best = best_recipe(recipe, algorithm, {dimension.key: 0.3}, [1])
        assert best.trials()[0].federation.uplink == trial.federation.uplink and best.tune is None
    kind = assigned(recipe, {"federation.uplink.1.error_feedback": "ef21"}).single_trial("fedmid", 0)
    assert kind.federation.uplink[1] == Step("error_feedback", (("kind", "ef21"),))
    attacked = assigned(recipe, {"federation.adversaries.fraction": 0.25, "federation.adversaries.scale": 3.0,
                                 "federation.aggregation": "trimmed_mean", "federation.trim": 0.2})
    federation = attacked.single_trial("fedmid", 0).federation
    assert (federation.adversaries.fraction, federation.adversaries.scale, federation.trim) == (0.25, 3.0, 0.2)


@pytest.mark.parametrize("space, where, phrase", [
    ("{federation.uplink.2.top_k: {uniform: [0.1, 0.5]}}", "tune.space.federation.uplink.2.top_k",
     "found step 2 of federation.uplink, which has 2 steps; expected an index 0 to 1"),
    ("{federation.uplink.1.top_k: {uniform: [0.1, 0.5]}}", "tune.space.federation.uplink.1.top_k",
     "found top_k, expected error_feedback, the step 1 of federation.uplink"),
    ("{federation.uplink.0.top_k: {uniform: [0.1, 1.5]}}", "tune.space.federation.uplink.0.top_k.uniform[1]",
     "expected float in (0, 1], found 1.5"),
    ("{federation.uplink.0.top_k: {int: [1, 3]}}", "tune.space.federation.uplink.0.top_k.int",
     "top_k is float; expected a uniform or log_uniform distribution"),
    ("{federation.uplink.1.error_feedback: {categorical: [ef, ef22]}}",
     "tune.space.federation.uplink.1.error_feedback.categorical[1]", "expected one of ef | ef21, found 'ef22'"),
    ("{federation.uplink.1.error_feedback: {uniform: [0, 1]}}",
     "tune.space.federation.uplink.1.error_feedback.uniform", "error_feedback is choice; expected a categorical"),
    ("{federation.downlink.0.qsgd: {int: [2, 8]}}", "tune.space.federation.downlink.0.qsgd",
     "found step 0 of federation.downlink, which has 0 steps"),
    ("{federation.adversaries.fractio: {uniform: [0.0, 0.5]}}", "tune.space.federation.adversaries.fractio",
     "did you mean 'fraction'"),
    ("{federation.adversaries.fraction: {uniform: [0.0, 1.0]}}",
     "tune.space.federation.adversaries.fraction.uniform[1]", "expected float in [0, 1), found 1.0"),
    ("{federation.trim: {uniform: [0.1, 0.6]}}", "tune.space.federation.trim.uniform[1]", "found 0.6"),
    ("{federation.byzantine: {uniform: [0, 2]}}", "tune.space.federation.byzantine.uniform", "byzantine is int"),
    ("{federation.sidelink.0.qsgd: {int: [2, 8]}}", "tune.space.federation.sidelink.0.qsgd",
     "expected problem.NAME, federation.NAME, federation.uplink.I.TRANSFORM"),
])
def test_validate_refuses_a_transforms_search_as_a_grid_would(tmp_path, space, where, phrase):
    path = write(tmp_path, TOP_K)
    refused(invoke("validate", path, "--set", f"tune.space={space}"), f"{path}: {where}: ", phrase)


def test_validate_takes_each_federation_axis_in_its_range(tmp_path):
    path = write(tmp_path, TOP_K)
    for space in ["{federation.uplink.1.error_feedback: {categorical: [ef, ef21]}}",
                  "{federation.adversaries.fraction: {uniform: [0.0, 0.2]}, federation.adversaries.scale: "
                  "{log_uniform: [0.1, 10.0]}}", "{federation.trim: {uniform: [0.0, 0.3]}}",
                  "{federation.byzantine: {int: [0, 1]}}"]:
        result = invoke("validate", path, "--set", f"tune.space={space}")
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize("kind", ["tpe", "random", "cmaes", "gp"])
def test_every_sampler_minimizes_a_quadratic(kind):
    found = optuna.create_study(sampler=make_sampler(kind, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. CMA-ES on one dimension falls back to random sampling
        found.optimize(lambda t: (math.log10(t.suggest_float("lr", 1e-4, 1.0, log=True)) + 2) ** 2, n_trials=25)
    assert found.best_value < 0.1


@pytest.mark.parametrize("name", ["bao2022_lasso", "fallah2020_c1"])
def test_the_best_configuration_of_a_labelled_recipe_is_a_valid_recipe(name):
    """Issue 47 item 1: the recipe tune re-runs with the best values keeps one algorithm and the report's labels of
    the others, which were refused as unknown metrics after every trial had run (exit 2). Here the best
    configuration of each algorithm of a shipped recipe whose report labels its algorithms is built (no Ray)."""
    recipe = load(f"recipes/papers/{name}.yaml")
    assert len(recipe.algorithms) > 1 and set(recipe.algorithms) & set(recipe.report.labels)
    for algorithm in recipe.algorithms:
        best = best_recipe(recipe, algorithm, {}, [1])
        assert list(best.algorithms) == [algorithm] and best.seeds == [1]
        assert best.report.labels.get(algorithm) == recipe.report.labels.get(algorithm)


@pytest.mark.ray
def test_the_summary_keeps_this_calls_trials_apart_and_the_best_values_whole(ray_local, tmp_path, tracking_uri):
    """Issue 59 item 10: at 80 columns (a pipe's width, as here) the summary cut `client_lr=0.000123` to
    `client_lr=0.…`, and counted the study's trials of every call beside the ok/pruned of this one. A second call
    of 2 trials: this call's 2 by how they ended, the study's 4, and its best value whole on a line of its own."""
    path = write(tmp_path, RECIPE.replace("trials: 20", "trials: 2").replace("rounds: 150", "rounds: 20")
                 .replace("[1.0e-4, 1.0]", "[1.0e-4, 1.0e-3]"))
    tune(path, tracking_uri)
    output = tune(path, tracking_uri).output
    best = study(tmp_path).best_params["client_lr"]
    assert "…" not in output, output
    assert f"fedmid: study's best client_lr={best:.4g}" in output, output
    row = next(line for line in output.splitlines() if line.startswith("│ fedmid"))
    assert [cell.strip() for cell in row.strip("│").split("│")][1:3] == ["2: 2/0/0/0", "4"], output
    assert "this call's" in output and "study's trials" in " ".join(output.split()), output
