"""fedbench against a real MLflow tracking server backed by PostgreSQL (`tests/servers.py`; issue 44): a sweep stores
every run once, and no (run, metric, step) twice. Skipped only where PostgreSQL cannot be installed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from servers import duplicated_metric_rows

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
RECIPE = """\
name: {name}
problem: {{name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}}
federation: {{rounds: 20, clients_per_round: 4, local_steps: 3, batch_size: 5}}
algorithms:
  fedmid: {{client_lr: 1e-2}}
seeds: 2
eval_every: 5
"""


def runs(uri: str, experiment: str, role: str) -> list:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else [run for run in client.search_runs([found.experiment_id])
                                     if run.data.tags.get("role") == role]


def test_a_sweep_into_the_server_stores_each_run_and_each_point_once(tmp_path, mlflow_server):
    name = "server-sweep"  # the session's server is shared: an experiment (recipe name) of this test's own
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE.format(name=name))
    done = subprocess.run([sys.executable, "-m", "cli", "sweep", str(path), "--tracking-uri", mlflow_server.uri],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr

    trials = runs(mlflow_server.uri, name, "trial")
    assert sorted(run.info.status for run in trials) == ["FINISHED", "FINISHED"]
    assert sorted(run.data.tags.get("seed") for run in trials) == ["0", "1"]
    history = MlflowClient(mlflow_server.uri).get_metric_history(trials[0].info.run_id, "objective")
    assert sorted(metric.step for metric in history) == [0, 5, 10, 15, 20]  # the curve reached the server
    assert [run.info.status for run in runs(mlflow_server.uri, name, "sweep")] == ["FINISHED"]
    assert duplicated_metric_rows(mlflow_server) == {}


@pytest.mark.slow
def test_a_3000_run_sweep_into_the_server_stores_each_run_once(tmp_path, fresh_mlflow_server):
    """Issue 44's 3,000 small runs (11 rows each) through the server: each (config, seed) once, FINISHED, no
    duplicated (run, metric, step). Its pace is the server's: ~60 ms of its CPU per run here (bench/store_throughput.py
    --tracking-uri), so on a 2-core machine that also runs Ray it stores ~20 runs/s, not Ray's ~80."""
    name = "server-3000"
    path = tmp_path / "recipe.yaml"
    path.write_text(f"""\
name: {name}
problem: {{name: lasso, clients: 4, samples_per_client: 10, dim: 10, support: 2}}
federation: {{rounds: 20, clients_per_round: 2}}
algorithms:
  fedavg: {{client_lr: 0.01}}
seeds: 3000
max_runs: 3000
eval_every: 2
""")
    done = subprocess.run([sys.executable, "-m", "cli", "sweep", str(path), "--tracking-uri", fresh_mlflow_server.uri,
                           "--no-report"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(fresh_mlflow_server.uri)
    experiment = client.get_experiment_by_name(name).experiment_id
    trials = client.search_runs([experiment], "tags.role = 'trial'", max_results=10_000)
    assert len(trials) == 3000 and {run.info.status for run in trials} == {"FINISHED"}
    assert {int(run.data.tags["seed"]) for run in trials} == set(range(3000))
    assert duplicated_metric_rows(fresh_mlflow_server) == {}
