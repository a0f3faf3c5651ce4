"""Long runs in a sweep: their curves reach the store while they run (a second process sees an in-flight run's curve
grow, the run RUNNING), and a sweep killed with SIGKILL at random moments and run again after each kill resumes
every interrupted program from its checkpoint as the same MLflow runs: every run finishes once, none is
duplicated, and every final curve is bit for bit an uninterrupted sweep's."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import joined_env
from helpers import HUNG

pytestmark = pytest.mark.ray  # every test sweeps on a local Ray
ROOT = Path(__file__).resolve().parents[2]
# Three programs of three seeds (the data fixed, `data_seed`), each ~12 s of rounds here, checkpointed every 0.5 s.
BATCHED = """\
name: longruns
problem: {name: lasso, clients: 8, samples_per_client: 40, dim: 60, support: 10, lam: 0.05, data_seed: 0}
federation: {rounds: 20000, clients_per_round: 4, local_steps: 5, batch_size: 5}
algorithms:
  fedmid: {client_lr: [1.0e-2, 2.0e-2, 3.0e-2]}
seeds: 3
eval_every: 500
resources: {batch_runs: 3, pack: 1}
checkpoints: {every_seconds: 0.5}
"""
# Per-FedAvg (HF) on CIFAR-10 as Table 1's row C1 runs it, shortened to 150 rounds (~30 s a run on 2 cores); its
# runs cannot share a program (each seed deals its own users), so each is a program alone.
CIFAR = """\
name: longruns
problem: {name: ab_users, preset: fallah2020_cifar10, adapt_step: 0.001}
federation: {rounds: 150, clients_per_round: 10, local_steps: 10, batch_size: 40}
algorithms:
  per_fedavg: {variant: hf, alpha: 0.001, client_lr: 0.001, delta: 1.0e-3}
seeds: 4
eval_every: 10
checkpoints: {every_seconds: 3}
"""
TIMED = {"train_seconds", "eval_seconds", "wall_seconds"}  # wall-clock metrics: no two runs agree on them


def trials(uri: str) -> list:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("longruns")
    if experiment is None:
        return []
    return [run for run in client.search_runs([experiment.experiment_id]) if run.data.tags.get("role") == "trial"]


def curves(uri: str) -> dict:
    """Every stored curve but the wall-clock ones, by (config hash, seed, metric): [(step, value)] by step."""
    client = MlflowClient(uri)
    found = {}
    for run in trials(uri):
        for key in set(run.data.metrics) - TIMED:
            history = client.get_metric_history(run.info.run_id, key)
            found[run.data.tags["config_hash"], run.data.tags["seed"], key] = sorted((m.step, m.value)
                                                                                   for m in history)
    return found


def sweep(path: Path, uri: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "sweep", str(path), "--tracking-uri", uri], cwd=ROOT,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            **popen)


def stored_rounds(uri: str) -> dict[str, int]:
    """The rounds stored so far of each RUNNING trial's curve."""
    client = MlflowClient(uri)
    return {run.info.run_id: len(client.get_metric_history(run.info.run_id, "comm_up"))
            for run in trials(uri) if run.info.status == "RUNNING"}


def killed_and_resumed(tmp_path: Path, recipe: str, kills: int, total: int, seed: int, window: tuple[float, float],
                       ray_address: str, watch_growth: bool = True) -> None:
    """`kills` attempts of the sweep, each killed at a moment drawn from `window` (seconds after a run is in flight),
    then one to its end; with `watch_growth`, this process watches the in-flight runs' stored curves between. The
    sweep never killed and the last attempt join the Ray at `ray_address`; the killed ones start their own, which
    the kill takes down with them."""
    path = tmp_path / "longruns.yaml"
    path.write_text(recipe)
    clean_uri = f"sqlite:///{tmp_path / 'clean' / 'mlflow.db'}"
    uri = f"sqlite:///{tmp_path / 'killed' / 'mlflow.db'}"
    clean = sweep(path, clean_uri, env=joined_env(ray_address))
    _, err = clean.communicate(timeout=HUNG)
    assert clean.returncode == 0, err

    moments = random.Random(seed)
    growth: list[dict[str, int]] = []
    for _ in range(kills):
        attempt = sweep(path, uri)
        try:
            deadline = time.monotonic() + HUNG
            while not stored_rounds(uri) and attempt.poll() is None:  # a run in flight: then a random moment
                assert time.monotonic() < deadline, "no run started"
                time.sleep(0.2)
            kill_at = time.monotonic() + moments.uniform(*window)
            while time.monotonic() < kill_at and attempt.poll() is None:
                growth.append(stored_rounds(uri))
                time.sleep(0.3)
        finally:
            if attempt.poll() is None:
                os.killpg(attempt.pid, signal.SIGKILL)  # the CLI and the Ray it started, mid-write or not
            attempt.wait()
        assert attempt.returncode == -signal.SIGKILL, "the sweep ended before its kill"
    last = sweep(path, uri, env=joined_env(ray_address))
    _, err = last.communicate(timeout=HUNG)
    assert last.returncode == 0, err

    runs = trials(uri)
    assert len(runs) == total and all(run.info.status == "FINISHED" for run in runs)  # once each, none twice
    assert len({(run.data.tags["config_hash"], run.data.tags["seed"]) for run in runs}) == total
    assert curves(uri) == curves(clean_uri)  # bit for bit
    # a second process (this one) saw an in-flight run's stored curve grow while it was RUNNING
    assert not watch_growth or any(later.get(run, 0) > count > 0 for earlier, later in zip(growth, growth[1:])
               for run, count in earlier.items())
    assert not list((tmp_path / "killed" / "checkpoints" / "longruns").glob("*.pt"))  # ended programs clean up


def test_killed_sweep_resumes_batched_runs_from_checkpoints(tmp_path, ray_address):
    killed_and_resumed(tmp_path, BATCHED, kills=3, total=9, seed=0, window=(0.5, 6.0), ray_address=ray_address)


@pytest.mark.slow
def test_killed_cifar10_sweep_resumes_at_ten_random_moments(tmp_path, ray_address):
    if not (Path(os.environ.get("FEDBENCH_DATA", ROOT.parent / "shared" / "data")) / "cifar10").is_dir():
        pytest.skip("CIFAR-10's binary batches are not under the data root")
    # kills anywhere in a run's ~30 s (the growth of a curve is watched by the test above)
    killed_and_resumed(tmp_path, CIFAR, kills=10, total=4, seed=1, window=(1.0, 25.0), ray_address=ray_address,
                       watch_growth=False)
