"""Two sweeps of one recipe on one store (`sweeps.claims`): started together, or the second while the first has runs
in flight, every (configuration, seed) is computed once, no (run, metric, step) row is stored twice, and both exit 0.
"""
from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import joined_env
from helpers import HUNG
from servers import duplicated_metric_rows

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
RECIPE = """\
name: NAME
problem: {name: lasso, clients: 8, samples_per_client: 40, dim: 60, support: 10, lam: 0.05}
federation: {rounds: 1500, clients_per_round: 4, local_steps: 5, batch_size: 5}
algorithms:
  fedmid: {client_lr: [1e-2, 2e-2]}
  fedda: {client_lr: [1e-3]}
seeds: 2
eval_every: 100
resources: {pack: 1}
"""
RUNS = 6


def written(tmp_path: Path) -> tuple[Path, str]:
    """The recipe written in tmp_path under a name of the test's own (its folder's; its experiment on a server the
    session's tests share): its path and that name."""
    path = tmp_path / "twice.yaml"
    path.write_text(RECIPE.replace("NAME", tmp_path.name))
    return path, tmp_path.name


def trials(uri: str, name: str) -> list:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    return [] if experiment is None else [run for run in client.search_runs([experiment.experiment_id])
                                          if run.data.tags.get("role") == "trial"]



def sweep(path: Path, uri: str, ray_address: str) -> subprocess.Popen:
    """`fedbench sweep` on the session's Ray: the race is on the store, whichever Ray the runs go to."""
    return subprocess.Popen([sys.executable, "-m", "cli", "sweep", str(path), "--tracking-uri", uri, "--no-report"],
                            cwd=ROOT, env=joined_env(ray_address), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def check_once(uri: str, name: str, outputs: list[str], database=None) -> None:
    """Every run once, finished, each (run, metric, step) once (in the SQLite store, or the server's `database`)."""
    runs = trials(uri, name)
    keys = Counter((run.data.tags["config_hash"], run.data.tags["seed"]) for run in runs)
    assert len(keys) == RUNS and set(keys.values()) == {1}, (keys, outputs)
    assert all(run.info.status == "FINISHED" for run in runs), ([run.info.status for run in runs], outputs)
    assert not duplicated_metric_rows(database or uri)
    client = MlflowClient(uri)
    parents = [run for run in client.search_runs([runs[0].info.experiment_id]) if run.data.tags["role"] == "sweep"]
    assert len(parents) == 1, outputs
    assert parents[0].info.status == "FINISHED", outputs  # closed by the later of the two to end


def together(tmp_path: Path, uri: str, ray_address: str, database=None) -> None:
    path, name = written(tmp_path)
    both = [sweep(path, uri, ray_address), sweep(path, uri, ray_address)]
    outputs = [process.communicate(timeout=HUNG)[0] for process in both]
    assert [process.returncode for process in both] == [0, 0], outputs
    check_once(uri, name, outputs, database)


def staggered(tmp_path: Path, uri: str, ray_address: str, database=None) -> None:
    path, name = written(tmp_path)
    first = sweep(path, uri, ray_address)
    deadline = time.monotonic() + HUNG
    while not any(run.info.status == "RUNNING" for run in trials(uri, name)):  # the second starts while runs are going
        assert first.poll() is None and time.monotonic() < deadline, "the first sweep ended before the second began"
        time.sleep(0.2)
    second = sweep(path, uri, ray_address)
    outputs = [process.communicate(timeout=HUNG)[0] for process in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outputs
    check_once(uri, name, outputs, database)


def test_two_sweeps_started_together_compute_each_run_once(tmp_path, ray_address):
    together(tmp_path, f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}", ray_address)  # a new store: its creation races too


def test_a_second_sweep_started_while_runs_are_in_flight_computes_none_twice(tmp_path, tracking_uri, ray_address):
    staggered(tmp_path, tracking_uri, ray_address)


def test_two_sweeps_together_on_a_tracking_server_compute_each_run_once(tmp_path, mlflow_server, ray_address):
    together(tmp_path, mlflow_server.uri, ray_address, mlflow_server)


def test_a_second_sweep_on_a_tracking_server_while_runs_are_in_flight(tmp_path, mlflow_server, ray_address):
    staggered(tmp_path, mlflow_server.uri, ray_address, mlflow_server)


@pytest.mark.slow
@pytest.mark.parametrize("repetition", range(10))
def test_two_sweeps_together_10_times_on_a_tracking_server(tmp_path, mlflow_server, ray_address, repetition):
    together(tmp_path, mlflow_server.uri, ray_address, mlflow_server)


@pytest.mark.slow
@pytest.mark.parametrize("repetition", range(10))
def test_two_sweeps_staggered_10_times_on_a_tracking_server(tmp_path, mlflow_server, ray_address, repetition):
    staggered(tmp_path, mlflow_server.uri, ray_address, mlflow_server)


@pytest.mark.slow
@pytest.mark.parametrize("repetition", range(10))
def test_two_sweeps_together_10_times(tmp_path, ray_address, repetition):
    together(tmp_path, f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}", ray_address)


@pytest.mark.slow
@pytest.mark.parametrize("repetition", range(10))
def test_two_sweeps_staggered_10_times(tmp_path, tracking_uri, ray_address, repetition):
    staggered(tmp_path, tracking_uri, ray_address)


def killed_then_rerun(tmp_path: Path, after: float | None, ray_address: str, uri: str | None = None,
                      database=None) -> None:
    """A sweep SIGKILLed (with the Ray it started) `after` seconds in (on a new SQLite store unless `uri`: its
    creation, the parent's, the claims or the runs), or (`after` None) once a run is going; the re-run (on the
    session's Ray) completes with each run once."""
    import os
    import signal

    path, name = written(tmp_path)
    uri = uri or f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    first = subprocess.Popen([sys.executable, "-m", "cli", "sweep", str(path), "--tracking-uri", uri, "--no-report"],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    if after is not None:
        time.sleep(after)
    deadline = time.monotonic() + HUNG
    while after is None and not any(run.info.status == "RUNNING" for run in trials(uri, name)):
        assert first.poll() is None and time.monotonic() < deadline, "no run started"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    rerun = sweep(path, uri, ray_address)
    output = rerun.communicate(timeout=HUNG)[0]
    assert rerun.returncode == 0, output
    check_once(uri, name, [output], database)


def test_a_sweep_on_a_tracking_server_killed_while_runs_go_completes_on_a_rerun(tmp_path, mlflow_server, ray_address):
    killed_then_rerun(tmp_path, None, ray_address, mlflow_server.uri, mlflow_server)


@pytest.mark.parametrize("after", [10.0])  # ~3 s of imports, ~7 s making the store, then the claims
def test_a_sweep_killed_in_its_first_seconds_on_a_new_store_completes_on_a_rerun(tmp_path, ray_address, after):
    killed_then_rerun(tmp_path, after, ray_address)


@pytest.mark.slow
@pytest.mark.parametrize("moment", range(20))
def test_sigkill_at_20_random_moments_of_the_first_3_s(tmp_path, ray_address, moment):
    import random

    killed_then_rerun(tmp_path, random.Random(moment).uniform(0.0, 3.0), ray_address)
