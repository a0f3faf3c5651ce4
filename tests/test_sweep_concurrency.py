"""Two sweeps of one recipe on one store (`sweeps.claims`): started together, or the second while the first has runs
in flight, every (configuration, seed) is computed once, no (run, metric, step) row is stored twice, and both exit 0.
"""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[1]
RECIPE = """\
name: twice
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


def trials(uri: str) -> list:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("twice")
    return [] if experiment is None else [run for run in client.search_runs([experiment.experiment_id])
                                          if run.data.tags.get("role") == "trial"]


def duplicated_rows(uri: str) -> list[tuple]:
    """(run, metric, step) stored more than once in a SQLite store."""
    with closing(sqlite3.connect(uri.removeprefix("sqlite:///"))) as db:
        return db.execute("SELECT run_uuid, key, step, count(*) FROM metrics GROUP BY run_uuid, key, step "
                          "HAVING count(*) > 1 LIMIT 5").fetchall()


def sweep(path: Path, uri: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "sweep", str(path), "--tracking-uri", uri, "--no-report"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def check_once(uri: str, outputs: list[str]) -> None:
    runs = trials(uri)
    keys = Counter((run.data.tags["config_hash"], run.data.tags["seed"]) for run in runs)
    assert len(keys) == RUNS and set(keys.values()) == {1}, (keys, outputs)
    assert all(run.info.status == "FINISHED" for run in runs), ([run.info.status for run in runs], outputs)
    assert not duplicated_rows(uri)
    client = MlflowClient(uri)
    parents = [run for run in client.search_runs([runs[0].info.experiment_id]) if run.data.tags["role"] == "sweep"]
    assert len(parents) == 1, outputs


def together(tmp_path: Path, uri: str) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text(RECIPE)
    both = [sweep(path, uri), sweep(path, uri)]
    outputs = [process.communicate(timeout=400)[0] for process in both]
    assert [process.returncode for process in both] == [0, 0], outputs
    check_once(uri, outputs)


def staggered(tmp_path: Path, uri: str) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text(RECIPE)
    first = sweep(path, uri)
    deadline = time.monotonic() + 180
    while not any(run.info.status == "RUNNING" for run in trials(uri)):  # the second starts while runs are going
        assert first.poll() is None and time.monotonic() < deadline, "the first sweep ended before the second began"
        time.sleep(0.2)
    second = sweep(path, uri)
    outputs = [process.communicate(timeout=400)[0] for process in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outputs
    check_once(uri, outputs)


def test_two_sweeps_started_together_compute_each_run_once(tmp_path):
    together(tmp_path, f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}")  # a new store: its creation races too


def test_a_second_sweep_started_while_runs_are_in_flight_computes_none_twice(tmp_path, tracking_uri):
    staggered(tmp_path, tracking_uri)


@pytest.mark.slow
@pytest.mark.parametrize("repetition", range(10))
def test_two_sweeps_together_10_times(tmp_path, repetition):
    together(tmp_path, f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}")


@pytest.mark.slow
@pytest.mark.parametrize("repetition", range(10))
def test_two_sweeps_staggered_10_times(tmp_path, tracking_uri, repetition):
    staggered(tmp_path, tracking_uri)


def killed_early_then_rerun(tmp_path: Path, after: float) -> None:
    """A sweep on a new store SIGKILLed (with the Ray it started) `after` seconds in: the store's creation, the
    parent's, the claims or the first runs; the re-run completes with each run once."""
    import os
    import signal

    path = tmp_path / "twice.yaml"
    path.write_text(RECIPE)
    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    first = subprocess.Popen([sys.executable, "-m", "cli", "sweep", str(path), "--tracking-uri", uri, "--no-report"],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    time.sleep(after)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    rerun = sweep(path, uri)
    output = rerun.communicate(timeout=400)[0]
    assert rerun.returncode == 0, output
    check_once(uri, [output])


@pytest.mark.parametrize("after", [6.0, 10.0])  # ~3 s of imports, then ~7 s making the store, then the claims
def test_a_sweep_killed_in_its_first_seconds_on_a_new_store_completes_on_a_rerun(tmp_path, after):
    killed_early_then_rerun(tmp_path, after)


@pytest.mark.slow
@pytest.mark.parametrize("moment", range(20))
def test_sigkill_at_20_random_moments_of_the_first_3_s(tmp_path, moment):
    import random

    killed_early_then_rerun(tmp_path, random.Random(moment).uniform(0.0, 3.0))
