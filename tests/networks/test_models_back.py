"""Models back (issue 47 item 8): every tracked run stores its final model (`fedbench.engine.saved`, the artifact
`model/final.pt`); `fedbench export` writes it out and `fedbench.load_model` reads it; the loaded model, evaluated
on the run's problem, gives the metrics of the run's last row."""
from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

import fedbench
from helpers import invoke
from sweeps.driving import build_simulation
from sweeps.recipe import load
from sweeps.store import load_run_model

LASSO = """\
name: models-lasso
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation: {rounds: 12, clients_per_round: 4, local_steps: 3, batch_size: 5}
algorithms: {fedmid: {client_lr: 1.0e-2}, fedda: {client_lr: 1.0e-2}}
seeds: [7, 8]
eval_every: 5
"""
S1 = """\
name: models-s1
problem: {name: pfl_synthetic, preset: s1, sigma_h: 1.0}
federation: {rounds: 6, clients_per_round: 0, local_steps: 1, batch_size: 1}
algorithms: {ascd_pfl: {}}
seeds: [0]
eval_every: 2
"""
# The pFedFBE paper's matrix completion (§4.2), shrunk: its model is a matrix W and an intercept b.
COMPLETION = """\
name: models-completion
problem: {name: lowrank, preset: fbe_completion, rows: 6, cols: 5, clients: 6, samples_per_client: 30,
          test_samples_per_client: 10}
federation: {rounds: 8, clients_per_round: 3, local_steps: 2, batch_size: 5}
algorithms: {fedmid: {client_lr: 1.0e-3, server_threshold: none}}
seeds: [3]
eval_every: 4
"""


def runs_of(uri: str, experiment: str, role: str) -> list:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    return [run for run in client.search_runs([found.experiment_id], max_results=1000)
            if run.data.tags.get("role") == role]


def assert_last_row(model: dict, recipe_path, algorithm: str, seed: int, run) -> None:
    """The saved model, evaluated on the run's own problem instance, gives the run's last logged metrics."""
    problem = build_simulation(load(recipe_path).single_trial(algorithm, seed=seed), "cpu").problem
    evaluated = problem.evaluate(model["global"], model["personal"])
    logged = run.data.metrics
    shared = [key for key in evaluated if key in logged and math.isfinite(logged[key])]
    assert len(shared) >= 3, (sorted(evaluated), sorted(logged))
    assert {k: evaluated[k] for k in shared} == pytest.approx({k: logged[k] for k in shared}, rel=1e-12, abs=1e-15)


def test_a_runs_model_is_exported_and_gives_its_last_rows_metrics(tmp_path, tracking_uri):
    recipe = tmp_path / "lasso.yaml"
    recipe.write_text(LASSO)
    assert invoke("run", recipe, "-a", "fedmid", "--seed", 7, "--tracking-uri", tracking_uri).exit_code == 0
    [run] = runs_of(tracking_uri, "models-lasso", "run")
    path = tmp_path / "fedmid.pt"
    exported = invoke("export", run.info.run_id, path, "--tracking-uri", tracking_uri)
    assert exported.exit_code == 0, exported.output
    assert f"{path}: fedmid on lasso, round 12 (finished): w [30]" in " ".join(exported.output.split())
    model = fedbench.load_model(path)
    assert model["format"] == 2 and model["round"] == 12 and model["personal"] is None
    assert model["global"].shape == (30,) and model["parameters"]["w"].equal(model["global"])
    assert_last_row(model, recipe, "fedmid", 7, run)
    assert load_run_model(run.info.run_id, tracking_uri)["global"].equal(model["global"])


def test_a_matrix_and_its_intercept_come_back_by_name(tmp_path, tracking_uri):
    recipe = tmp_path / "completion.yaml"
    recipe.write_text(COMPLETION)
    done = invoke("run", recipe, "--seed", 3, "--tracking-uri", tracking_uri)
    assert done.exit_code == 0, done.output
    [run] = runs_of(tracking_uri, "models-completion", "run")
    assert run.info.status == "FINISHED"
    model = load_run_model(run.info.run_id, tracking_uri)
    matrix, intercept = model["parameters"]["W"], model["parameters"]["b"]
    assert matrix.shape == (6, 5) and matrix.reshape(-1).equal(model["global"][:30])
    assert intercept.shape == (1,) and intercept.equal(model["global"][30:])
    assert_last_row(model, recipe, "fedmid", 3, run)


def test_a_personalized_runs_client_models_come_back_too(tmp_path, tracking_uri):
    recipe = tmp_path / "s1.yaml"
    recipe.write_text(S1)
    assert invoke("run", recipe, "--seed", 0, "--tracking-uri", tracking_uri).exit_code == 0
    [run] = runs_of(tracking_uri, "models-s1", "run")
    model = load_run_model(run.info.run_id, tracking_uri)
    problem = fedbench.make_problem("pfl_synthetic", preset="s1", sigma_h=1.0)
    assert model["personal"].shape == (problem.num_clients, problem.dim) and model["personal_left_out"] == ""
    assert_last_row(model, recipe, "ascd_pfl", 0, run)


def history_at(uri: str, run, round_: int) -> dict[str, float]:
    """The run's logged metrics at round `round_`, from their MLflow histories."""
    client = MlflowClient(uri)
    values = {}
    for key in run.data.metrics:
        points = [m.value for m in client.get_metric_history(run.info.run_id, key) if m.step == round_]
        if points:
            values[key] = points[-1]
    return values


def assert_row_at(model: dict, recipe_path, algorithm: str, seed: int, uri: str, run, round_: int) -> None:
    problem = build_simulation(load(recipe_path).single_trial(algorithm, seed=seed), "cpu").problem
    evaluated = problem.evaluate(model["global"], model["personal"])
    logged = history_at(uri, run, round_)
    shared = [key for key in evaluated if key in logged and math.isfinite(logged[key])]
    assert len(shared) >= 3 and model["round"] == round_, (sorted(evaluated), sorted(logged))
    assert {k: evaluated[k] for k in shared} == pytest.approx({k: logged[k] for k in shared}, rel=1e-12, abs=1e-15)


def test_models_every_k_rounds_come_back_with_their_rows_metrics(tmp_path, tracking_uri):
    """`tracking.models_every: 5` on a 12-round run: the models of rounds 5 and 10 beside the final one, each giving
    its round's row; the block changes neither the recipe's nor the run's hash (what resume finds)."""
    recipe = tmp_path / "lasso.yaml"
    recipe.write_text(LASSO)
    sets = ["--set", "tracking.models_every=5"]
    assert load(recipe, sets[1::2]).recipe_hash == load(recipe).recipe_hash
    assert load(recipe, sets[1::2]).single_trial("fedmid", seed=7).config_hash == \
        load(recipe).single_trial("fedmid", seed=7).config_hash
    assert invoke("run", recipe, "-a", "fedmid", "--seed", 7, *sets, "--tracking-uri", tracking_uri).exit_code == 0
    [run] = runs_of(tracking_uri, "models-lasso", "run")
    for round_ in (5, 10):
        assert_row_at(load_run_model(run.info.run_id, tracking_uri, round_), recipe, "fedmid", 7, tracking_uri, run,
                      round_)
    exported = invoke("export", run.info.run_id, tmp_path / "r5.pt", "--round", 5, "--tracking-uri", tracking_uri)
    assert exported.exit_code == 0 and fedbench.load_model(tmp_path / "r5.pt")["round"] == 5, exported.output
    missing = invoke("export", run.info.run_id, tmp_path / "r7.pt", "--round", 7, "--tracking-uri", tracking_uri)
    assert missing.exit_code == 2 and "has no saved model of round 7 (rounds saved: 5, 10)" in missing.output


def test_export_of_a_run_without_a_model_is_refused_in_one_line(tracking_uri, tmp_path):
    missing = invoke("export", "nosuchrun", tmp_path / "x.pt", "--tracking-uri", tracking_uri)
    assert missing.exit_code == 2 and "no run 'nosuchrun'" in missing.output and "Traceback" not in missing.output
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.ray
def test_every_run_of_a_sweep_stores_its_model(ray_local, tmp_path, tracking_uri):
    """Through Ray: the workers send each run's model with its end, and with `tracking.models_every` each round's as
    it is made; the driver stores them; the runs of one program (the two seeds of a configuration) each get their
    own."""
    recipe = tmp_path / "lasso.yaml"
    recipe.write_text(LASSO)
    assert invoke("sweep", recipe, "--set", "tracking.models_every=5", "--tracking-uri", tracking_uri,
                  "--no-report").exit_code == 0
    trials = runs_of(tracking_uri, "models-lasso", "trial")
    assert len(trials) == 4
    models = {}
    for run in trials:
        algorithm, seed = run.data.tags["algorithm"], int(run.data.tags["seed"])
        model = load_run_model(run.info.run_id, tracking_uri)
        models[(algorithm, seed)] = model
        assert_last_row(model, recipe, algorithm, seed, run)
        assert_row_at(load_run_model(run.info.run_id, tracking_uri, 5), recipe, algorithm, seed, tracking_uri, run, 5)
    assert not models[("fedmid", 7)]["global"].equal(models[("fedmid", 8)]["global"])


# -- a run's model by its id, with its problem (issue 59 item 9) ------------------------------------------------

def test_load_model_takes_a_run_id_and_problem_of_rebuilds_the_runs_problem(tmp_path, tracking_uri, monkeypatch):
    """`fedbench.load_model(RUN_ID)` finds the store as `fedbench export` does (MLFLOW_TRACKING_URI, or the
    tracking_uri given); the model holds the problem's settings and the seeds, and `fedbench.problem_of` builds the
    problem again: its evaluation of the model is the run's last logged test metric, for each seed of one
    `fedbench run` (one program)."""
    recipe = tmp_path / "lasso.yaml"
    recipe.write_text(LASSO.replace("lam: 0.05}", "lam: 0.05, test_samples_per_client: 10}"))
    done = invoke("run", recipe, "-a", "fedmid", "--seed", 7, "--seed", 8, "--tracking-uri", tracking_uri)
    assert done.exit_code == 0, done.output
    runs = runs_of(tracking_uri, "models-lasso", "run")
    assert sorted(int(run.data.tags["seed"]) for run in runs) == [7, 8]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    for run in runs:
        run_id, seed = run.info.run_id, int(run.data.tags["seed"])
        model = fedbench.load_model(run_id)
        assert invoke("export", run_id, tmp_path / "m.pt").exit_code == 0
        assert model["global"].equal(fedbench.load_model(tmp_path / "m.pt")["global"])
        trial = load(recipe).single_trial("fedmid", seed=seed)
        assert model["format"] == 2 and model["seed"] == seed and model["problem_config"] == trial.problem_config
        for source in (run_id, model):
            problem = fedbench.problem_of(source)
            assert problem.config == trial.problem_config and problem.seed == seed
            test_mse = problem.evaluate(model["global"], model["personal"])["test_mse"]
            assert test_mse == pytest.approx(run.data.metrics["test_mse"], rel=1e-12)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")
    assert fedbench.load_model(runs[0].info.run_id, tracking_uri)["seed"] == int(runs[0].data.tags["seed"])


def test_a_model_saved_before_format_2_still_loads_but_has_no_problem_to_rebuild(tmp_path):
    import torch

    old = {"format": 1, "algorithm": "fedmid", "problem": "lasso", "round": 3, "status": "finished",
           "global": torch.zeros(4), "parameters": {"w": torch.zeros(4)}, "personal": None, "personal_left_out": ""}
    torch.save(old, tmp_path / "old.pt")
    model = fedbench.load_model(tmp_path / "old.pt")
    assert model["format"] == 1 and model["global"].equal(old["global"])
    with pytest.raises(ValueError, match="does not hold its problem's settings: saved before format 2"):
        fedbench.problem_of(model)


def test_a_run_id_the_store_does_not_hold_is_refused_in_one_line(tracking_uri):
    with pytest.raises(ValueError, match=f"no run '{'0' * 32}' in {tracking_uri}"):
        fedbench.load_model("0" * 32, tracking_uri)


def test_the_engine_reads_a_run_id_through_the_store_an_installed_package_registers(monkeypatch):
    """`fedbench.load_model(RUN_ID)` finds the store by the entry points `fedbench.engine.saved.STORES` (fedbench_sweeps'
    MLflow store, pyproject.toml), importing nothing of fedbench_sweeps itself; with none registered, a ValueError
    says what is missing."""
    import importlib.metadata

    import fedbench.engine.saved
    from sweeps.store import Store

    [store] = importlib.metadata.entry_points(group=fedbench.engine.saved.STORES)
    assert store.load().__name__ == Store.__name__ and store.module == "fedbench_sweeps.store"
    monkeypatch.setattr(fedbench.engine.saved, "STORES", "fedbench.no_such_group")
    with pytest.raises(ValueError, match=f"^{'0' * 32} is a run id, and no store of runs is installed to read it"):
        fedbench.load_model("0" * 32)


def test_every_problems_settings_survive_a_weights_only_load(tmp_path):
    """A model's file is read with `weights_only=True` (no code runs): each problem's resolved config must be of the
    types it reads back, presets included."""
    import torch

    for name, cls in fedbench.PROBLEMS.items():
        for preset in cls.presets or [None]:
            config = cls.resolve_config({"preset": preset} if preset else {})
            torch.save({"config": config}, tmp_path / "c.pt")
            assert torch.load(tmp_path / "c.pt", weights_only=True)["config"] == config, (name, preset)
