"""A new MLflow store opened by several processes at once (`Store`): its schema is created once, every process
logs its run; a store left half-migrated is refused with one line."""
from __future__ import annotations

import contextlib
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from dataclasses import asdict
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import sweeps.events
from helpers import HUNG
from sweeps.driving import Outcome
from sweeps.events import RowStream
from sweeps.recipe import load
from sweeps.store import Store

ROOT = Path(__file__).resolve().parents[2]
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
from sweeps.driving import Outcome
from sweeps.recipe import load
from sweeps.store import Store

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


@pytest.mark.ray  # a race of four processes
def test_four_processes_start_on_one_new_store(workers, tmp_path):
    problems = race(workers, tmp_path, 3)
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.ray  # a race of four processes
def test_four_processes_start_on_one_new_store_20_times(workers, tmp_path):
    problems = race(workers, tmp_path, 20)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("damage, found", [
    ("CREATE TABLE _alembic_tmp_experiments (experiment_id INTEGER)", "table _alembic_tmp_experiments left over"),
    ("DELETE FROM alembic_version", "no schema version")])
def test_a_half_migrated_store_is_refused_in_one_line(tracking_uri, damage, found):
    from sweeps.database import StoreError, sqlite_path
    from sweeps.store import Store

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
    monkeypatch.setattr(sweeps.events, "STREAM_ROWS", 3)  # the third row sends the first three
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


# A process that opens a new store, as every fedbench command does first; killed at a moment of the test's choosing.
OPEN = "import sys; from sweeps.store import Store; print('imported', flush=True); Store(sys.argv[1])"


@pytest.mark.parametrize("after", [0.5, 2.0, 4.0])
def test_a_kill_while_a_new_store_is_made_leaves_a_store_the_next_command_opens(tmp_path, after):
    """SIGKILL `after` seconds into a new store's creation (~7 s of MLflow's migrations): the next command opens it
    (made complete, or made again), never a half-made store nor a hot journal it cannot recover."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opening = subprocess.Popen([sys.executable, "-c", OPEN, uri], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert opening.stdout.readline().strip() == "imported"
    time.sleep(after)
    opening.kill()
    opening.wait()
    store = Store(uri)
    experiment = store.experiment("after-a-kill")
    run_id = store.start_trial(experiment, load_race(tmp_path).trials()[0], None, time.time(), {}, role="run")
    store.finish_trial(run_id, asdict(Outcome([{"round": 0, "objective": 1.0}], "finished", "cpu")))
    assert MlflowClient(uri).get_run(run_id).info.status == "FINISHED"


def load_race(folder: Path):
    path = folder / "race.yaml"
    path.write_text(RECIPE)
    return load(path)


def test_a_hot_journal_is_recovered_by_sqlite_not_refused(tracking_uri):
    """A store whose writer died mid-transaction keeps a hot journal (`mlflow.db-journal`): SQLite rolls it back when
    the store is next opened for writing; opened read-only first, it answered 'attempt to write a readonly
    database'."""
    from sweeps.database import sqlite_path

    path = sqlite_path(tracking_uri)
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, os, signal\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('PRAGMA cache_size = 1')\n"  # pages spill to the file before the commit
        "db.execute('BEGIN')\n"
        "db.execute(\"UPDATE experiments SET name = name || 'x'\")\n"
        "db.execute('CREATE TABLE filler (x)')\n"
        "db.executemany('INSERT INTO filler VALUES (?)', [('y' * 1000,)] * 5000)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"), str(path)])
    writer.wait()
    assert path.with_name(path.name + "-journal").is_file()
    store = Store(tracking_uri)
    assert store.client.get_experiment("0").name == "Default"  # the dead writer's change rolled back


def damaged(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:len(data) // 3])
    elif how == "garbage":
        path.write_bytes(bytes(range(256)) * (len(data) // 256))
    else:  # partly overwritten: pages in the middle
        path.write_bytes(data[:8192] + b"\xff" * 65536 + data[8192 + 65536:])


@pytest.mark.parametrize("how", ["truncated", "garbage", "overwritten"])
@pytest.mark.parametrize("command", ["run", "sweep", "report"])
def test_a_damaged_store_is_refused_in_one_line_before_anything_runs(tmp_path, tracking_uri, how, command):
    from sweeps.database import sqlite_path

    path = sqlite_path(tracking_uri)
    damaged(path, how)
    recipe = load_race(tmp_path)
    result = subprocess.run([sys.executable, "-m", "cli", command, recipe.source, "--tracking-uri", tracking_uri],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stdout + result.stderr
    assert str(path) in lines[0] and "Traceback" not in result.stdout + result.stderr
    assert "round" not in result.stdout  # nothing computed: refused first


def test_a_store_whose_check_answers_in_two_lines_is_refused_in_one(tmp_path, tracking_uri):
    """Issue 59 item 6: a b-tree page's header overwritten, SQLite's quick_check answers '*** in database main ***'
    and the page on a second line, which the refusal printed as is: two lines."""
    from sweeps.database import sqlite_path

    path = sqlite_path(tracking_uri)
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")  # the page size, in the database header
    data[page:page + 8] = b"\x0d\x00\x00\xff\xff\x00\x00\x00"  # page 2: a leaf of 65535 cells, its content past the end
    path.write_bytes(data)
    with closing(sqlite3.connect(path)) as db:
        assert "\n" in db.execute("PRAGMA quick_check(1)").fetchone()[0]  # the damage this test is about
    result = subprocess.run([sys.executable, "-m", "cli", "run", load_race(tmp_path).source, "--tracking-uri",
                             tracking_uri], cwd=ROOT, capture_output=True, text=True, timeout=120)
    refused_in_one_line(result, f"{path}: the MLflow store is damaged (*** in database main ***; Page 2: ")


def test_a_result_the_store_refuses_is_kept_and_stored_by_the_next_command(tmp_path, tracking_uri, monkeypatch):
    """`fedbench run` computes, then the store fails (full, damaged meanwhile): the run's result is kept in a file
    beside the store, the one line says where, and the next command that opens the store stores it."""
    from typer.testing import CliRunner

    from cli import app
    from sweeps.database import sqlite_path
    from sweeps.spill import SPILLED

    recipe = load_race(tmp_path)

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    with monkeypatch.context() as patch:
        patch.setattr(Store, "log_run", full)
        refused = CliRunner().invoke(app, ["run", recipe.source, "--tracking-uri", tracking_uri])
    assert refused.exit_code == 2 and "database or disk is full" in refused.output, refused.output
    kept = list((sqlite_path(tracking_uri).parent / SPILLED).glob("*.pickle"))
    assert len(kept) == 1 and kept[0].name in refused.output.replace("\n", "")
    store = Store(tracking_uri)
    assert len(store.recovered) == 1 and not kept[0].exists()
    run = store.client.get_run(store.recovered[0])
    assert run.info.status == "FINISHED" and run.data.tags["seed"] == "0" and "objective" in run.data.metrics


@pytest.fixture
def small_disk(tmp_path, _migrated_store):
    """A 12 MiB file system of its own (tmpfs) holding a migrated store: filled, or remounted read-only, by a test;
    skipped where this machine lets no one mount one (root permissions bypass a file's mode, a mount's do not)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"no tmpfs can be mounted here: {mounted.stderr.decode().strip()[:100]}")
    try:
        shutil.copy(_migrated_store, folder / "mlflow.db")
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fedbench(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def refused_in_one_line(result: subprocess.CompletedProcess, *phrases: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr and "round" not in result.stdout
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


def test_a_full_disk_is_refused_in_one_line_before_anything_runs(tmp_path, small_disk):
    with contextlib.suppress(OSError), open(small_disk / "filler", "wb") as filler:
        while True:
            filler.write(b"\0" * 2**20)
    recipe = load_race(tmp_path)
    uri = f"sqlite:///{small_disk / 'mlflow.db'}"
    for command in ("run", "sweep"):
        refused_in_one_line(fedbench(command, recipe.source, "--tracking-uri", uri), "disk is full")


@pytest.mark.ray  # its first command sweeps
def test_a_read_only_store_is_refused_for_writing_and_read_for_a_report(tmp_path, small_disk):
    recipe = load_race(tmp_path)
    uri = f"sqlite:///{small_disk / 'mlflow.db'}"
    assert fedbench("sweep", recipe.source, "--tracking-uri", uri, "--no-report").returncode == 0
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    for command in ("run", "sweep"):
        refused_in_one_line(fedbench(command, recipe.source, "--tracking-uri", uri), "cannot be written")
    report = fedbench("report", recipe.source, "--tracking-uri", uri, "--out", str(tmp_path / "report"))
    assert report.returncode == 0 and "not logged on the parent run: Read-only" in report.stdout, report.stderr
    assert (tmp_path / "report" / "index.html").is_file()


LONGER = RECIPE.replace("rounds: 12", "rounds: 4000").replace("eval_every: 5", "eval_every: 400").replace(
    "seeds: 4", "seeds: 4\nresources: {pack: 1}")


@pytest.mark.ray  # the sweep starts Ray
def test_a_disk_that_fills_during_a_sweep_gives_a_summary_of_what_the_store_holds(tmp_path, small_disk):
    """The disk fills while runs are going: no traceback; the summary says how many computed runs the store did not
    take and the tracking errors; once space is freed, the same command completes every run once."""
    path = tmp_path / "race.yaml"
    path.write_text(LONGER)
    uri = f"sqlite:///{small_disk / 'mlflow.db'}"
    sweep = subprocess.Popen([sys.executable, "-m", "cli", "sweep", str(path), "--tracking-uri", uri, "--no-report"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HUNG
    while not any(run.info.status == "RUNNING" for run in runs_of(uri)):
        assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()
        time.sleep(0.2)
    with contextlib.suppress(OSError), open(small_disk / "filler", "wb") as filler:
        while True:
            filler.write(b"\0" * 2**16)
    out, err = sweep.communicate(timeout=HUNG)
    assert sweep.returncode == 1 and "Traceback" not in out + err, out + err
    assert "tracking error" in err and "not in the store" in err and len(err.splitlines()) < 20, err
    (small_disk / "filler").unlink()
    again = subprocess.run([sys.executable, "-m", "cli", "sweep", str(path), "--tracking-uri", uri, "--no-report"],
                           cwd=ROOT, capture_output=True, text=True, timeout=HUNG)
    assert again.returncode == 0, again.stdout + again.stderr
    finished = [run for run in runs_of(uri) if run.info.status == "FINISHED"]
    assert sorted(run.data.tags["seed"] for run in finished) == ["0", "1", "2", "3"]


def runs_of(uri: str) -> list:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name("race")
    return [] if found is None else [run for run in client.search_runs([found.experiment_id])
                                     if run.data.tags.get("role") == "trial"]


def old_store(path: Path, generations_back: int) -> str:
    """A store of the MLflow schema `generations_back` migrations before this MLflow's, as an older MLflow made it
    (its initial tables, then its migrations up to that revision), holding one experiment; its revision."""
    import sqlalchemy
    from alembic import command
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config
    from mlflow.store.tracking.dbmodels.initial_models import Base

    config = _get_alembic_config(f"sqlite:///{path}")
    revision = [step.revision for step in ScriptDirectory.from_config(config).walk_revisions()][generations_back]
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    Base.metadata.create_all(engine)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        connection.execute(sqlalchemy.text("INSERT INTO experiments (name, lifecycle_stage) VALUES ('kept', 'active')"))
    engine.dispose()
    return revision


def schema_version(path: Path) -> str:
    with closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT version_num FROM alembic_version").fetchone()[0]


def test_a_store_of_an_older_mlflow_schema_is_upgraded_keeping_a_backup(tmp_path):
    from mlflow.store.db.utils import _get_latest_schema_revision

    path = tmp_path / "mlflow.db"
    revision = old_store(path, generations_back=30)
    store = Store(f"sqlite:///{path}")
    assert schema_version(path) == _get_latest_schema_revision()
    assert MlflowClient(f"sqlite:///{path}").get_experiment_by_name("kept") is not None
    experiment = store.experiment("after-an-upgrade")
    run_id = store.start_trial(experiment, load_race(tmp_path).trials()[0], None, time.time(), {}, role="run")
    store.finish_trial(run_id, asdict(Outcome([{"round": 0, "objective": 1.0}], "finished", "cpu")))
    assert MlflowClient(f"sqlite:///{path}").get_run(run_id).info.status == "FINISHED"
    assert schema_version(tmp_path / f"mlflow.db.before-upgrade-{revision}") == revision
    assert not list(tmp_path.glob(".mlflow.db.upgrade-*"))


@pytest.mark.parametrize("after", [0.3, 0.8, 1.3])
def test_a_kill_while_a_store_is_upgraded_leaves_a_store_the_next_command_opens(tmp_path, after):
    """SIGKILL `after` seconds into the upgrade of a store of MLflow's first schema (its ~67 migrations, ~1 s here):
    the store is the old one or the upgraded one, never half-migrated, and the next command upgrades and opens it."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    path = tmp_path / "mlflow.db"
    old_store(path, generations_back=-1)
    opening = subprocess.Popen([sys.executable, "-c", OPEN, f"sqlite:///{path}"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    assert opening.stdout.readline().strip() == "imported"
    time.sleep(after)
    opening.kill()
    opening.wait()
    Store(f"sqlite:///{path}").experiment("after-a-kill")
    assert schema_version(path) == _get_latest_schema_revision()
    assert MlflowClient(f"sqlite:///{path}").get_experiment_by_name("kept") is not None


def test_an_older_store_opened_to_read_and_a_newer_store_are_refused_in_one_line(tmp_path, tracking_uri):
    from sweeps.database import StoreError, sqlite_path

    path = tmp_path / "old" / "mlflow.db"
    path.parent.mkdir()
    revision = old_store(path, generations_back=3)
    with pytest.raises(StoreError) as refused:
        Store(f"sqlite:///{path}", write=False)
    assert f"older schema version ({revision}" in str(refused.value) and "upgrades it" in str(refused.value)
    assert schema_version(path) == revision  # a command that only reads leaves the store as it is
    newer = sqlite_path(tracking_uri)
    with closing(sqlite3.connect(newer)) as db, db:
        db.execute("UPDATE alembic_version SET version_num = 'f00dfeedbeef'")  # a later MLflow's
    with pytest.raises(StoreError) as refused:
        Store(tracking_uri)
    assert "newer schema version (f00dfeedbeef" in str(refused.value) and "\n" not in str(refused.value)


# -- room on the store's disk for what the runs write (issue 59 item 7) -----------------------------------------

def test_a_store_grows_by_what_the_sizing_rule_allows_a_metric_value(tmp_path, tracking_uri):
    """`STORED_VALUE_BYTES` against the store's own growth: the curves of runs as `log_rows` stores them (measured
    257 B a value) cost at most that and at least 3/4 of it, so that a check by it neither refuses room that is
    enough by far nor passes a disk that fills."""
    from sweeps.database import sqlite_path
    from sweeps.store import STORED_VALUE_BYTES, stored_values

    trial = load_race(tmp_path).trials()[0]
    store = Store(tracking_uri)
    experiment = store.experiment("room")
    keys = [metric.name for metric in trial.metrics()]
    path = sqlite_path(tracking_uri)
    grown = []
    for rows in (1000, 3000):
        run_id = store.start_trial(experiment, trial, None, time.time(), {}, role="run")
        before = path.stat().st_size
        store.log_rows({run_id: ([{"round": r, **{k: 1 / (r + i + 1) for i, k in enumerate(keys)}} for r in range(rows)],
                                 [0.01 * r for r in range(rows)], -1)})
        grown.append((path.stat().st_size - before, rows * (len(keys) + 1)))
    per_value = (grown[1][0] - grown[0][0]) / (grown[1][1] - grown[0][1])
    assert 0.75 * STORED_VALUE_BYTES <= per_value <= STORED_VALUE_BYTES, per_value
    assert stored_values([trial]) == trial.rows_logged() * (len(keys) + 1) + 3  # and the 3 summary metrics


def test_runs_whose_curves_the_disk_cannot_hold_are_refused_before_they_run(tmp_path, small_disk):
    """The disk check wanted a fixed 8 MiB: a run of 3000 rows of 16 values (~12 MiB in the store) started on a disk
    of ~11 MiB free, to fill it. It is refused in one line, what it needs said, before anything runs."""
    path = tmp_path / "long.yaml"
    path.write_text(RECIPE.replace("rounds: 12", "rounds: 3000").replace("eval_every: 5", "eval_every: 1"))
    uri = f"sqlite:///{small_disk / 'mlflow.db'}"
    refused_in_one_line(fedbench("run", str(path), "--tracking-uri", uri), f"{small_disk}: the MLflow store's disk has ",
                        "1 run will write ~15 MiB (48019 metric values)")


def test_a_run_is_kept_off_a_nearly_full_disk_or_refused_where_no_disk_has_room(tmp_path, small_disk, monkeypatch):
    """The result a store refused was kept beside it, on the disk that had just filled, wherever the file fitted. It
    is kept where a disk has room for it and `MIN_FREE_BYTES` more; nowhere, refused in one line naming both
    folders."""
    from sweeps.database import MIN_FREE_BYTES, StoreError
    from sweeps.spill import spill, spill_folders

    with contextlib.suppress(OSError), open(small_disk / "filler", "wb") as filler:
        while True:
            filler.write(b"\0" * 2**16)
    with open(small_disk / "filler", "r+b") as filler:  # room for the file (a few KiB), not for a margin after it
        filler.truncate(filler.seek(0, 2) - MIN_FREE_BYTES // 2)
    uri = f"sqlite:///{small_disk / 'mlflow.db'}"
    trial = load_race(tmp_path).trials()[0]
    outcome = asdict(Outcome([{"round": 0, "objective": 1.0}], "finished", "cpu"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").mkdir()
    kept = spill(uri, "race", [], trial, outcome, {})
    assert kept.parent == spill_folders(uri)[1] and not (small_disk / "unstored").exists()
    monkeypatch.setattr(tempfile, "tempdir", str(small_disk / "tmp"))  # the other disk as full
    with pytest.raises(StoreError) as refused:
        spill(uri, "race", [], trial, outcome, {})
    message = str(refused.value)
    assert "\n" not in message and str(small_disk / "unstored") in message and str(small_disk / "tmp") in message
