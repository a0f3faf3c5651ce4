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
from sweeps.driving import build_simulation, drive
from sweeps.recipe import load
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
