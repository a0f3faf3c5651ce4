"""A new MLflow store opened by several processes at once (`Store`): its schema is created once, every process
logs its run; a store left half-migrated is refused with one line."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import asdict
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import sweeps.execute
from sweeps.execute import Outcome, RowStream
from sweeps.recipe import load
from sweeps.tracking import Store

ROOT = Path(__file__).resolve().parents[1]
RECIPE = """\
name: race
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation: {rounds: 12, clients_per_round: 4, local_steps: 3, batch_size: 5}
algorithms:
  fedmid: {client_lr: 1e-2, server_lr: 1.0}
seeds: 4
eval_every: 5
"""
# A process that logs one run as `fedbench run` does into each store it is given on stdin, one per line: it opens
# the store and says so, then on the next line (once every process opened it) makes the experiment and logs the
# run, and says how that went. Its imports (~4 s) are paid once, so that the repetitions cost what the store costs.
WORKER = """\
import sys, time
from dataclasses import asdict
from sweeps.execute import Outcome
from sweeps.recipe import load
from sweeps.tracking import Store

recipe = load(sys.argv[1])
trial = recipe.trials()[int(sys.argv[2])]
print("ready", flush=True)
for line in sys.stdin:
    try:
        store = Store(line.strip())
        print("opened", flush=True)
        sys.stdin.readline()
        experiment = store.experiment(recipe.name)
        run_id = store.start_trial(experiment, trial, None, time.time(), {"recipe_hash": recipe.recipe_hash},
                                   role="run")
        rows = [{"round": r, "objective": 1.0 / (1 + r)} for r in range(0, 13, 4)]
        store.finish_trial(run_id, asdict(Outcome(rows, "finished", "cpu", seconds=[0.1] * len(rows))))
        print("ok", run_id, flush=True)
    except Exception as err:
        print("error", type(err).__name__, str(err).replace(chr(10), " ")[:300], flush=True)
"""
PROCESSES = 4


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    """`PROCESSES` worker processes (seeds 0 to 3 of the recipe), shared by this module's races."""
    recipe = tmp_path_factory.mktemp("race") / "race.yaml"
    recipe.write_text(RECIPE)
    started = [subprocess.Popen([sys.executable, "-c", WORKER, str(recipe), str(i)], cwd=ROOT, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE) for i in range(PROCESSES)]
    try:
        assert [w.stdout.readline().strip() for w in started] == ["ready"] * PROCESSES
        yield started
    finally:
        for worker in started:
            worker.stdin.close()
            worker.wait(timeout=60)


def race(workers: list[subprocess.Popen], folder: Path, repetitions: int) -> list[str]:
    """`repetitions` times, every worker opens one new store at once, then they all make its experiment and log a
    run at once; what went wrong."""
    problems = []
    for repetition in range(repetitions):
        uri = f"sqlite:///{folder / f'store-{repetition}' / 'mlflow.db'}"
        answers = tell(workers, uri)
        opened = [w for w, answer in zip(workers, answers) if answer == "opened"]
        answers = [a for a in answers if a != "opened"] + tell(opened, "go")
        problems += [f"repetition {repetition}: {a}" for a in answers if not a.startswith("ok ")]
        problems += [f"repetition {repetition}: {p}" for p in recorded(uri, len(workers))]
    return problems


def tell(workers: list[subprocess.Popen], line: str) -> list[str]:
    """Each worker's answer to the line, given to all before any answer is read."""
    for worker in workers:
        worker.stdin.write(line + "\n")
        worker.stdin.flush()
    return [w.stdout.readline().strip() or "error: the process died" for w in workers]


def recorded(uri: str, expected: int) -> list[str]:
    """What is wrong with the store after a race: it does not open, or does not hold `expected` finished runs."""
    try:
        store = Store(uri)
        found = store.client.get_experiment_by_name("race")
        runs = store.search(found.experiment_id, "tags.role = 'run'") if found else []
    except Exception as err:
        return [f"the store does not open afterwards: {type(err).__name__}: {str(err)[:200]}"]
    seeds = sorted(run.data.tags["seed"] for run in runs
                   if run.info.status == "FINISHED" and run.data.metrics.get("objective") == 1 / 13)
    return [] if seeds == [str(seed) for seed in range(expected)] else [f"finished runs of seeds {seeds} recorded"]


def test_four_processes_start_on_one_new_store(workers, tmp_path):
    problems = race(workers, tmp_path, 3)
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_four_processes_start_on_one_new_store_20_times(workers, tmp_path):
    problems = race(workers, tmp_path, 20)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("damage, found", [
    ("CREATE TABLE _alembic_tmp_experiments (experiment_id INTEGER)", "table _alembic_tmp_experiments left over"),
    ("DELETE FROM alembic_version", "no schema version")])
def test_a_half_migrated_store_is_refused_in_one_line(tracking_uri, damage, found):
    from sweeps.tracking import Store, StoreError, sqlite_path

    path = sqlite_path(tracking_uri)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(damage)
    with pytest.raises(StoreError) as refused:
        Store(tracking_uri)
    message = str(refused.value)
    assert message == f"{path}: MLflow store half-migrated ({found}); move it aside (or restore a backup) and run again"
    assert "\n" not in message and len(message.replace(str(path), "mlflow.db")) < 160


def test_a_streamed_run_ends_with_the_rows_it_had_not_sent_each_round_once(tracking_uri, monkeypatch):
    """A Ray trial streams a run's rows (`RowStream`) and its end event carries only those still held: the store
    then has every round's metrics and train_seconds once, and the summary's wall_seconds at the last round."""
    recipe_path = Path(tracking_uri.removeprefix("sqlite:///")).with_name("race.yaml")
    recipe_path.write_text(RECIPE)
    recipe = load(recipe_path)
    store = Store(tracking_uri)
    run_id = store.start_trial(store.experiment(recipe.name), recipe.trials()[0], None, time.time(), {}, role="run")
    rows = [{"round": r, "objective": 1.0 / (1 + r)} for r in range(0, 13, 4)]
    seconds = [0.1 * (r + 1) for r in range(len(rows))]
    sent = []
    stream = RowStream(sent.append, ["key"])
    monkeypatch.setattr(sweeps.execute, "STREAM_ROWS", 3)  # the third row sends the first three
    for row, by_then in zip(rows[:3], seconds[:3]):
        stream.add(0, row, by_then)
    assert len(sent) == 1
    stored = store.log_rows({run_id: (*sent[-1]["runs"]["key"], -1)})[run_id]
    stream.add(0, rows[3], seconds[3])
    held_rows, held_seconds = stream.take(0)
    assert (held_rows, held_seconds, stream.count) == ([rows[3]], [seconds[3]], 0)
    outcome = Outcome(held_rows, "finished", "cpu", seconds=held_seconds, wall_seconds=2.5)  # as `run_pack` sends it
    store.finish_trial(run_id, asdict(outcome), stored)
    client = MlflowClient(tracking_uri)
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "objective")] == [
        (row["round"], row["objective"]) for row in rows]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train_seconds")] == [
        (row["round"], by_then) for row, by_then in zip(rows, seconds)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "wall_seconds")] == [(12, 2.5)]
