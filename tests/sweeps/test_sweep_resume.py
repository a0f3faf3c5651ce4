"""A sweep killed with SIGKILL (driver, Ray and all) and run again completes with no duplicated and no
lost runs; the runs the kill interrupted go on as the same MLflow runs (from their checkpoints where they saved one,
`tests/sweeps/test_sweep_checkpoints.py`), none left RUNNING or FAILED."""
from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import joined_env
from helpers import HUNG

pytestmark = pytest.mark.ray  # every test sweeps on a local Ray
ROOT = Path(__file__).resolve().parents[2]
RECIPE = """\
name: resume
problem: {name: lasso, clients: 8, samples_per_client: 40, dim: 60, support: 10, lam: 0.05}
federation: {rounds: 5000, clients_per_round: 4, local_steps: 5, batch_size: 5}
algorithms:
  fedmid: {client_lr: [1e-2, 2e-2]}
  fedda: {client_lr: [1e-3, 1e-2]}
seeds: 2
eval_every: 500
resources: {pack: 1}
"""
# The same with shared data: the seeds of each fedmid configuration run as one program (fedbench.engine.runs), three
# programs of three runs, so the kill lands while whole batches have finished and another is running.
BATCHED = """\
name: resume
problem: {name: lasso, clients: 8, samples_per_client: 40, dim: 60, support: 10, lam: 0.05, data_seed: 0}
federation: {rounds: 8000, clients_per_round: 4, local_steps: 5, batch_size: 5}
algorithms:
  fedmid: {client_lr: [1e-2, 2e-2, 3e-2]}
seeds: 3
eval_every: 500
resources: {batch_runs: 3}
"""


def runs(uri):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("resume")
    return [] if experiment is None else client.search_runs([experiment.experiment_id], max_results=10_000)


def by_role(uri, role):
    return [run for run in runs(uri) if run.data.tags.get("role") == role]


def killed_while_running(command: list[str], tracking_uri: str) -> list | None:
    """The trial runs in the store after the sweep `command`, started in a session of its own, was killed with
    SIGKILL (the CLI and the Ray it started) once some runs had finished while others were going; None where the
    sweep ended first (on a quiet machine, the last runs can finish between two looks at the store)."""
    first = subprocess.Popen(command, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + HUNG
    try:
        while time.monotonic() < deadline:
            statuses = Counter(run.info.status for run in by_role(tracking_uri, "trial"))
            if statuses["FINISHED"] >= 2 and statuses["RUNNING"] >= 1:
                break
            if first.poll() is not None:
                return None
            time.sleep(0.2)
        else:
            raise AssertionError(f"no kill point reached: {statuses}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    return by_role(tracking_uri, "trial")


@pytest.mark.parametrize("recipe, total", [(RECIPE, 8), (BATCHED, 9)], ids=["alone", "batched"])
def test_sigkill_then_rerun_completes_the_sweep(tmp_path, tracking_uri, ray_address, recipe, total):
    path = tmp_path / "resume.yaml"
    path.write_text(recipe)
    command = [sys.executable, "-m", "cli", "sweep", str(path), "--tracking-uri", tracking_uri]
    store = Path(tracking_uri.removeprefix("sqlite:///"))
    empty = store.read_bytes()
    finished_before: set[str] = set()
    running_before: set[str] = set()
    # a kill that lands after the runs it saw going have finished, or a sweep that ended first, proves nothing: again
    for _ in range(3):
        for journal in store.parent.glob(store.name + "-*"):  # a killed writer's -wal/-shm/-journal
            journal.unlink()
        store.write_bytes(empty)
        killed = killed_while_running(command, tracking_uri)
        if killed is None:
            continue
        finished_before = {run.info.run_id for run in killed if run.info.status == "FINISHED"}
        running_before = {run.info.run_id for run in killed if run.info.status == "RUNNING"}
        if len(finished_before) >= 2 and running_before:
            break
    assert finished_before and running_before, "no attempt was killed while runs had finished and others were going"
    assert by_role(tracking_uri, "sweep")[0].info.status == "RUNNING"

    # the rerun on the session's Ray (the killed attempts each start their own, which the kill takes down with them)
    second = subprocess.run(command, cwd=ROOT, env=joined_env(ray_address), capture_output=True, text=True,
                            timeout=HUNG)
    assert second.returncode == 0, second.stdout + second.stderr

    trials = by_role(tracking_uri, "trial")
    finished = [run for run in trials if run.info.status == "FINISHED"]
    failed = [run for run in trials if run.info.status == "FAILED"]
    assert len(finished) == total  # every (config, seed)
    assert len({(run.data.tags["config_hash"], run.data.tags["seed"]) for run in finished}) == total  # no duplicates
    assert finished_before <= {run.info.run_id for run in finished}  # not run again
    assert running_before <= {run.info.run_id for run in finished}  # interrupted, then resumed as the same run
    assert not failed and all(run.data.tags["status"] in ("finished", "diverged") for run in finished)
    assert len(trials) == total  # nothing RUNNING, nothing else
    parents = by_role(tracking_uri, "sweep")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED" and parents[0].data.tags["attempts"] == "2"


def started_sweep(tmp_path: Path, tracking_uri: str, recipe: str) -> tuple[list[str], subprocess.Popen]:
    """`fedbench sweep` of `recipe` started in a session of its own (as a terminal's foreground job), its output
    piped: the command and the process."""
    path = tmp_path / "resume.yaml"
    path.write_text(recipe)
    command = [sys.executable, "-m", "cli", "sweep", str(path), "--tracking-uri", tracking_uri, "--no-report"]
    return command, subprocess.Popen(command, cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)


def interrupt_while_running(tmp_path: Path, tracking_uri: str, presses: int) -> tuple[subprocess.CompletedProcess, float]:
    """Ctrl-C (SIGINT to the sweep's process group, as a terminal sends it) `presses` times, 0.5 s apart, once runs
    are going: the sweep's output and the seconds from the first press to its exit."""
    command, sweep = started_sweep(tmp_path, tracking_uri, RECIPE)
    deadline = time.monotonic() + HUNG
    while not any(run.info.status == "RUNNING" for run in by_role(tracking_uri, "trial")):
        assert sweep.poll() is None and time.monotonic() < deadline, "no run started"
        time.sleep(0.2)
    pressed = time.monotonic()
    for _ in range(presses):
        os.killpg(sweep.pid, signal.SIGINT)
        time.sleep(0.5)
    try:
        output = sweep.communicate(timeout=60)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sweep.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(command, sweep.returncode, output), time.monotonic() - pressed


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_the_sweep_marks_its_runs_and_says_so(tmp_path, tracking_uri, presses):
    """One Ctrl-C: the sweep stops launching, stores what it has, marks the runs it stopped and the parent, prints its
    summary and an interrupted line, within ~10 s. A second: it exits at once, the parent still marked."""
    result, seconds = interrupt_while_running(tmp_path, tracking_uri, presses)
    assert result.returncode not in (0, None) and seconds < 15, (seconds, result.stdout)
    assert "interrupted" in result.stdout and "Traceback" not in result.stdout, result.stdout
    parents = by_role(tracking_uri, "sweep")
    assert [parent.info.status for parent in parents] == ["KILLED"], result.stdout
    if presses == 1:
        assert "sweep resume" in result.stdout  # the summary table's title
        assert not [run for run in by_role(tracking_uri, "trial") if run.info.status == "RUNNING"]


# Many runs that each take milliseconds: Ray ends them faster than one store writer stored them before issue 44
# (Ray 36.5 s, the store 310 s for 3,000), so Ctrl-C lands while the driver catches up with what Ray has finished.
MANY = """\
name: resume
problem: {name: lasso, clients: 4, samples_per_client: 10, dim: 10, support: 2}
federation: {rounds: 20, clients_per_round: 2}
algorithms:
  fedavg: {client_lr: 0.01}
seeds: 3000
max_runs: 3000
eval_every: 2
"""


def finished_runs(uri: str) -> int:
    with contextlib.closing(sqlite3.connect(uri.removeprefix("sqlite:///"), timeout=30)) as db:
        return db.execute("SELECT COUNT(*) FROM runs WHERE status = 'FINISHED'").fetchone()[0]


@pytest.mark.slow
def test_ctrl_c_while_the_store_catches_up_with_ray_stops_within_seconds(tmp_path, tracking_uri):
    """Ctrl-C once the store holds 1,000 of 3,000 runs (of 11 rows each, as in issue 44): the sweep stores what Ray
    has handed over, marks the rest, prints its summary and an interrupted line within ~10 s, and the store holds a
    run once per (config, seed)."""
    _, sweep = started_sweep(tmp_path, tracking_uri, MANY)
    deadline = time.monotonic() + HUNG
    try:
        while finished_runs(tracking_uri) < 1000:  # a query: MLflow's search of thousands of runs takes seconds
            assert sweep.poll() is None and time.monotonic() < deadline, "the sweep ended before 1,000 runs were stored"
            time.sleep(0.5)
        pressed = time.monotonic()
        os.killpg(sweep.pid, signal.SIGINT)
        output = sweep.communicate(timeout=120)[0]
        seconds = time.monotonic() - pressed
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sweep.pid, signal.SIGKILL)
    assert sweep.returncode not in (0, None) and seconds < 15, (seconds, output[-2000:])
    assert "interrupted" in output and "Traceback" not in output, output[-2000:]
    trials = by_role(tracking_uri, "trial")
    assert not [run for run in trials if run.info.status == "RUNNING"]
    finished = [run for run in trials if run.info.status == "FINISHED"]
    assert 1000 <= len(finished) < 3000
    assert len({(run.data.tags["config_hash"], run.data.tags["seed"]) for run in finished}) == len(finished)
    assert [parent.info.status for parent in by_role(tracking_uri, "sweep")] == ["KILLED"]
