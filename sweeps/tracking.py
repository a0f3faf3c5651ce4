"""MLflow tracking: one parent run per sweep, one nested run per (config, seed).

Layout. Experiment = recipe name. The sweep's parent run carries the recipe (file and resolved YAML as
artifacts), its hash, the tool's git commit and the host; it is found again by recipe hash, so a resumed
sweep keeps one parent. Each (config, seed) is a nested run (tag `mlflow.parentRunId`) with flattened
params, tags `role=trial, problem, algorithm, seed, config_hash, configuration, status` (and `accountant`, pld or
rdp, where its rows carry ε) and the per-round curve as metrics with `step=round`.

Speed and safety. On SQLite one `log_metric` costs ~10-30 ms; the curve goes out with `log_batch` in
chunks of 1000 (~0.5 ms per value), or faster straight into MLflow's SQL store (`sweeps.mlflow_fast`). During a
sweep all writes are made by one background thread on the driver (`SweepLog`), so parallel trials never contend
for the database ("database is locked"). Several fedbench processes may open one new SQLite store at once: its
creation is serialized by a lock of its folder (`open_sqlite`, `store_lock`).
"""
from __future__ import annotations

import concurrent.futures
import fcntl
import hashlib
import importlib.metadata
import itertools
import json
import os
import pickle
import platform
import queue
import shlex
import shutil
import sqlite3
import subprocess
import tempfile
import threading
import time
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import urlencode

import sqlalchemy.exc
import yaml


def telemetry_off(environ=os.environ) -> None:
    """MLflow sends usage telemetry unless told not to; fedbench tells it not to, for its own tracking and for
    the UI server it starts, unless the user set either switch (MLFLOW_DISABLE_TELEMETRY, DO_NOT_TRACK). Through a
    tracking server MLflow also prints a run's link when the run ends, after reading the whole run back for it: a
    request and a line per run, thousands in a sweep, the sweep's own links printed instead."""
    if "MLFLOW_DISABLE_TELEMETRY" not in environ and "DO_NOT_TRACK" not in environ:
        environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


telemetry_off()  # before MLflow is imported: its telemetry client reads the switch when it starts

from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from . import mlflow_fast  # noqa: E402
from .mlflow_fast import EndedRun, NewRun  # noqa: E402
from .recipe import Recipe, Trial  # noqa: E402
from .recipe.loading import in_bytes  # noqa: E402

DEFAULT_URI = "sqlite:///mlflow.db"
BATCH = 1000  # MLflow's limit of metrics per log_batch call (100 for params and tags)
PARENT_TAG = "mlflow.parentRunId"
INTERRUPTED = "interrupted: the sweep stopped while this run was going"
# MLflow 3's UI opens an experiment in its GenAI (traces) view unless the experiment says it holds model
# training runs: the experiment tag its frontend reads to choose the view, and the value its kind selector sets.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# The view of the runs that `fedbench ui` links to, stored as MLflow's "shared view" experiment tag (what the
# UI's share button writes; the URL names it with `viewStateShareKey`): the runs that are compared, i.e. not the
# sweep and tuning parents, whose bookkeeping is in tags, grouped by configuration so that each group holds its
# seeds, and the charts drawing each group's mean curve. Grouping is also what makes nested runs visible: the
# plain table shows a sweep's runs collapsed under its parent, and its charts only the runs shown.
VIEW_KEY = "fedbench"
VIEW = {"searchFilter": "tags.role != 'sweep' and tags.role != 'tune'",
        "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": "configuration"}]},
        "useGroupedValuesInCharts": True}
# How long a new sweep parent waits for one that another sweep of the recipe wrote at the same moment (`open_sweep`)
SETTLE_SECONDS = 1.0
HEADLINE_TAG = "fedbench.headline"  # the metrics the view charts first (json list), for `fedbench ui` to keep them
SUMMARY_METRICS = ("train_seconds", "eval_seconds", "wall_seconds")  # per run, at its last round (train_seconds also
# by every evaluated round where the run recorded it)


def tracking_uri(given: str | None = None) -> str:
    """The store: `given`, else MLFLOW_TRACKING_URI, else `DEFAULT_URI`; a PostgreSQL one with a driver that is
    installed (`with_driver`)."""
    return with_driver(given or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI)


def installed(module: str) -> bool:
    """Whether a module can be imported here (looked up, not imported)."""
    import importlib.util

    return importlib.util.find_spec(module) is not None


def with_driver(uri: str, has: Callable[[str], bool] = installed) -> str:
    """`postgresql://` names SQLAlchemy's default PostgreSQL driver, psycopg (3) since SQLAlchemy 2.1, which MLflow
    does not install (`No module named 'psycopg'` at the first query): where it is absent and psycopg2 is installed,
    the URI names psycopg2 instead (`postgresql+psycopg2://`, `driver_note` says so); with neither, refused in one
    line (StoreError). Any other URI is as given."""
    if not uri.startswith("postgresql://") or has("psycopg"):
        return uri
    if has("psycopg2"):
        return "postgresql+psycopg2://" + uri.removeprefix("postgresql://")
    raise StoreError("postgresql://: no PostgreSQL driver is installed (SQLAlchemy's default for postgresql:// is "
                     "psycopg 3); pip install psycopg2-binary (then postgresql:// works) or psycopg")


def driver_note(uri: str) -> str | None:
    """What `with_driver` does to a store's URI, in a line without the URI (it may hold a password); None: nothing."""
    if with_driver(uri) == uri:
        return None
    return ("postgresql:// stands for SQLAlchemy's default driver, psycopg 3, which is not installed: using psycopg2 "
            "(postgresql+psycopg2://) instead")


def sqlite_path(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def store_folder(uri: str | None) -> Path:
    """Where files that belong with a store go (Optuna studies, reports, checkpoints): beside a SQLite store, in the
    working directory for a server."""
    path = sqlite_path(tracking_uri(uri))
    return path.resolve().parent if path is not None else Path.cwd()


MODEL_FOLDER, MODEL_FILE = "model", "final.pt"  # a run's saved final model (`fedbench.saved`), an artifact


def round_model(round_: int) -> str:
    """The artifact file of a run's model at a round (`tracking.models_every`), in its folder `model/`."""
    return f"round_{round_}.pt"


class StoreError(ValueError):
    """A tracking store that cannot be used as it is; the message is one line: the file, what is wrong, what to do."""


_READY: set[Path] = set()  # SQLite stores this process has checked: opened again without a check


def open_sqlite(path: Path, uri: str, write: bool = True) -> MlflowClient:
    """A client of a SQLite store, checked the first time in this process (`check_sqlite`), and made first if new
    (`make_sqlite`): under the store's lock (`store_lock`), so that processes opening one new store at once make it
    once."""
    key = path.resolve()
    if key not in _READY:
        if not made(path):
            with store_lock(path):
                if not made(path):
                    make_sqlite(path)
        if older_schema(path, check_sqlite(path, write), write):
            with store_lock(path):
                found = check_sqlite(path, write)
                if older_schema(path, found, write):  # not upgraded meanwhile by the process that held the lock
                    upgrade_sqlite(path, found)
        _READY.add(key)
    return MlflowClient(uri)


@contextmanager
def store_lock(path: Path) -> Iterator[None]:
    """The lock of the processes that make or upgrade a store: an exclusive flock of the store's folder itself, so
    that no lock file is left beside the store (`<store>.lock` was, in the researcher's folder); released when
    closed, also if its holder dies holding it."""
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)


def made(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def make_sqlite(path: Path) -> None:
    """A new store made whole in a file beside `path`, then moved into place: MLflow creates and migrates a store's
    schema the first time it opens it, ~7 s of DDL statements that SQLite commits one by one, so a process killed
    meanwhile would leave a half-made store (`table logged_models already exists` ever after). What a killed maker
    left is removed first: the caller holds the lock, so no one is making it now."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    for left in path.parent.glob(f".{path.name}.new-*"):
        left.unlink(missing_ok=True)
    temporary = path.with_name(f".{path.name}.new-{os.getpid()}")
    uri = f"sqlite:///{temporary}"
    try:
        store = SqlAlchemyStore(uri, (path.resolve().parent / "mlartifacts").as_uri())
    except MlflowException as error:
        raise StoreError(f"{path}: a new MLflow store could not be made ({first_line(error)}); "
                         "check the folder's free space and permissions") from None
    # Its connections closed before the file moves: SQLite names a journal after the file it opened.
    store.engine.dispose()
    SqlAlchemyStore._engine_map.pop(uri, None)
    os.replace(temporary, path)


def upgrade_sqlite(path: Path, found: str) -> None:
    """A store of an older MLflow's schema, upgraded as a new one is made: MLflow's migrations run on a copy
    beside it (they are not transactional; killed midway they would leave the store half-migrated), and the copy
    replaces the store at once. The store as it was stays beside it as `<store>.before-upgrade-<version>`, the backup
    MLflow asks for before an upgrade. The caller holds the store's lock."""
    from mlflow.store.db.utils import _upgrade_db

    for left in path.parent.glob(f".{path.name}.upgrade-*"):
        left.unlink(missing_ok=True)
    temporary = path.with_name(f".{path.name}.upgrade-{os.getpid()}")
    backup = path.with_name(f"{path.name}.before-upgrade-{found}")
    try:
        with closing(sqlite3.connect(path, timeout=60)) as source, closing(sqlite3.connect(temporary)) as copy:
            source.backup(copy)  # a consistent snapshot, even while another process reads the store
        engine = sqlalchemy.create_engine(f"sqlite:///{temporary}")
        try:
            _upgrade_db(engine)
        finally:
            engine.dispose()
        backup.unlink(missing_ok=True)
        os.link(path, backup)  # the store as it was, kept under a second name: no copy, no moment without a store
    except (OSError, sqlite3.Error, sqlalchemy.exc.SQLAlchemyError) as error:
        temporary.unlink(missing_ok=True)
        raise StoreError(f"{path}: the MLflow store of schema version {found} could not be upgraded "
                         f"({first_line(error)}); back it up, then run `mlflow db upgrade sqlite:///{path}`") from None
    os.replace(temporary, path)


def check_sqlite(path: Path, write: bool) -> str:
    """Refuse, in one line, a store that every later step would answer with a traceback: damaged (truncated,
    overwritten), half-migrated, or, for a command that writes (`write`), one it cannot write (a read-only file or
    folder, a full disk). Opened for writing where it can be, so that SQLite itself rolls back a hot journal a
    killed writer left (read-only it cannot: 'attempt to write a readonly database')."""
    try:
        with closing(sqlite3.connect(path, timeout=60)) as db:
            problem = db.execute("PRAGMA quick_check(1)").fetchone()[0]
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            version = (db.execute("SELECT version_num FROM alembic_version").fetchone()
                       if "alembic_version" in tables else None)
            if write:
                db.execute("BEGIN IMMEDIATE")  # the write lock, as a transaction takes it; nothing is written
                db.execute("ROLLBACK")
    except sqlite3.DatabaseError as error:
        what = str(error)
        if "readonly" in what or "unable to open" in what or "disk I/O" in what or "full" in what:
            raise StoreError(f"{path}: the MLflow store cannot be written ({what}); make the file and its folder "
                             "writable, free some space, or give another --tracking-uri") from None
        raise StoreError(f"{path}: not a usable MLflow store ({what}); move it aside (or restore a backup) "
                         "and run again") from None
    if problem != "ok":  # SQLite's text may span lines ("*** in database main ***", then the page): one here
        found = cut("; ".join(line.strip() for line in problem.splitlines() if line.strip()), 120)
        raise StoreError(f"{path}: the MLflow store is damaged ({found}); move it aside (or restore a backup) and "
                         "run again")
    left = sorted(name for name in tables if name.startswith("_alembic_tmp_"))
    if "experiments" not in tables and not left:
        raise StoreError(f"{path}: not an MLflow store (an SQLite file without MLflow's tables); give another "
                         "--tracking-uri or move it aside")
    if left or version is None:
        found = f"table {left[0]} left over" if left else "no schema version"
        raise StoreError(f"{path}: MLflow store half-migrated ({found}); move it aside (or restore a backup) "
                         "and run again")
    if write:
        writable_folder(path)
    return version[0]


def older_schema(path: Path, found: str, write: bool) -> bool:
    """Whether a store of schema version `found` (its Alembic revision) is an older MLflow's, to be upgraded
    (`upgrade_sqlite`); a newer MLflow's store, or an older one opened by a command that only reads, is refused in one
    line (MLflow would refuse it at its first use, in a traceback)."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError
    from mlflow.store.db.utils import _get_alembic_config, _get_latest_schema_revision

    expected = _get_latest_schema_revision()
    if found == expected:
        return False
    try:
        known = ScriptDirectory.from_config(_get_alembic_config(f"sqlite:///{path}")).get_revision(found) is not None
    except CommandError:
        known = False
    if not known:
        raise StoreError(f"{path}: an MLflow store of a newer schema version ({found}; this MLflow's is {expected}); "
                         "open it with the MLflow that made it, or give another --tracking-uri")
    if not write:
        raise StoreError(f"{path}: an MLflow store of an older schema version ({found}; this MLflow's is {expected}); "
                         "a command that writes (`fedbench run` or `sweep`) upgrades it, keeping a backup")
    return True


MIN_FREE_BYTES = 2**20  # free space a store's disk needs for any command that writes: its journal, a few runs' tags
# A metric value's cost in a SQLite store (a row of MLflow's `metrics` and its indexes): measured 257 B a value, the
# file's growth over 16,000 and 64,000 values of Lasso runs' curves (16 a round, names of 6-16 characters, `log_rows`);
# rounded up for longer names (`personal_...`). What the runs of a command will write is checked against it
# (`Store.check_room`).
STORED_VALUE_BYTES = 300


def free_bytes(folder: Path) -> int:
    """Free space on the disk of `folder`, or of its nearest folder that exists (one to be made)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def writable_folder(path: Path) -> None:
    """SQLite writes its journal beside the store: a folder it cannot write, or a full disk, fails the first write,
    after a run has been computed."""
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.probe-"):
            pass
        free = shutil.disk_usage(path.parent).free
    except OSError as error:
        raise StoreError(f"{path.parent}: the MLflow store's folder cannot be written ({error.strerror}); make it "
                         "writable or give another --tracking-uri") from None
    if free < MIN_FREE_BYTES:
        raise StoreError(f"{path.parent}: the MLflow store's disk is full ({in_bytes(free)} free, at least "
                         f"{in_bytes(MIN_FREE_BYTES)} needed); free some space or give another --tracking-uri")


def stored_values(trials: Iterable[Trial]) -> int:
    """The metric values the runs of `trials` store: each row's metrics and train_seconds, and the summary metrics."""
    return sum(trial.rows_logged() * (len(trial.metrics()) + 1) + len(SUMMARY_METRICS) for trial in trials)


def first_line(error: BaseException, limit: int = 160) -> str:
    """What went wrong, in one line: the first of the message of the error at the root of `error`'s causes (MLflow
    wraps SQLAlchemy's, which wraps the database's: 'database or disk is full')."""
    while error.__cause__ is not None:
        error = error.__cause__
    return cut((str(error).strip().splitlines() or [type(error).__name__])[0], limit)


def last_line(text: str, limit: int = 160) -> str:
    """What a traceback's text says went wrong: its last line, cut to `limit` characters."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return cut(lines[-1] if lines else "no error text", limit)


def cut(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[:limit - 1] + "…"


def tool_commit() -> str:
    """The fedbench that ran: a checkout's git commit (+dirty), or an installed package's version (its folder may
    sit inside someone else's git repository, whose commit would say nothing of fedbench)."""
    here = Path(__file__).resolve().parent
    if not (here.parent / "pyproject.toml").is_file():  # installed: site-packages/fedbench_sweeps
        try:
            return f"fedbench {importlib.metadata.version('fedbench')}"
        except importlib.metadata.PackageNotFoundError:
            return "unknown"
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def runs_url(base: str, experiment_id: str | None, charts: bool = False) -> str:
    """The MLflow UI page of an experiment's runs: the model-training view (`workflowType`; otherwise MLflow 3
    may open its GenAI view) in the stored `VIEW`, as the table or the chart view (`compareRunsMode`). Without
    an experiment: the list of experiments."""
    if experiment_id is None:
        return f"{base}/#/experiments?workflowType=machine_learning"
    query = {"workflowType": "machine_learning", "viewStateShareKey": VIEW_KEY}
    if charts:
        query["compareRunsMode"] = "CHART"
    return f"{base}/#/experiments/{experiment_id}/runs?{urlencode(query)}"


def view(headline: list[str]) -> dict:
    """`VIEW`, its charts opening with a chart of each headline metric, in order. MLflow adds a chart of each
    other metric to the section named after the metric's prefix ("Model metrics" for a name without `/`; found by
    name): by name among the section's charts, or after them where the section is marked reordered (as dragging
    a chart does), as this one is."""
    if not headline:
        return VIEW
    section: dict[str, Any] = {"uuid": "fedbench-model-metrics", "name": "Model metrics", "isReordered": True,
                               "display": True}  # shown: an absent `display` hides the section's charts
    return {**VIEW, "compareRunSections": [section],
            "compareRunCharts": [line_chart(metric, section["uuid"]) for metric in headline]}


def line_chart(metric: str, section: str) -> dict:
    """MLflow's chart of one metric's curves (a LINE chart card of its UI's runs view), with only the fields
    that it draws and behaves like MLflow's own chart of the metric with: the others take their defaults."""
    return {"uuid": f"fedbench-{metric}",  # what the UI edits, moves or deletes a chart by
            "type": "LINE", "metricKey": metric, "metricSectionId": section,
            # The x-axis and the line smoothing the user sets for all charts (the charts' settings menu); without
            # these the chart keeps the step axis whatever that says, and an absent smoothing smooths the curve.
            "useGlobalXaxisKey": True, "useGlobalLineSmoothing": True}


PUBLIC_WRITERS = 8  # runs written at once through MLflow's API to a tracking server


def chunks(items: list, size: int) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class Store:
    """One MLflow tracking store (SQLite file or server) and the fedbench layout inside it."""

    def __init__(self, uri: str | None = None, write: bool = True):
        """`write`: the command writes to the store (a sweep, a run), which is then checked writable first."""
        self.uri = tracking_uri(uri)
        path = sqlite_path(self.uri)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(self.uri) if path is None else open_sqlite(path, self.uri, write)
        self.fast = mlflow_fast.probe(self.client)  # None: MLflow's public API only, for the life of this Store
        self.recovered = self.store_spilled() if write else []

    def folder(self) -> Path:
        return store_folder(self.uri)

    def check_room(self, trials: list[Trial]) -> None:
        """Refuse (StoreError), before they run, runs whose curves a SQLite store's disk cannot hold: their
        `stored_values` at `STORED_VALUE_BYTES` each, beyond `MIN_FREE_BYTES`. A server's disk is not seen from here."""
        path = sqlite_path(self.uri)
        if path is None or not trials:
            return
        values = stored_values(trials)
        needed, free = MIN_FREE_BYTES + STORED_VALUE_BYTES * values, shutil.disk_usage(path.parent).free
        if free < needed:
            runs = f"{len(trials)} run{'s' if len(trials) != 1 else ''}"
            raise StoreError(f"{path.parent}: the MLflow store's disk has {in_bytes(free)} free, {runs} will write "
                             f"~{in_bytes(needed)} ({values} metric values); free some space or give another "
                             "--tracking-uri")

    def experiment(self, name: str, headline: list[str] | None = None) -> str:
        """The experiment's id, created if new, with the tags of `EXPERIMENT_KIND` and of the runs view, whose
        charts show the `headline` metrics first; without `headline`, those the experiment has (`HEADLINE_TAG`)."""
        found = self.client.get_experiment_by_name(name)
        if headline is None:
            headline = json.loads(found.tags.get(HEADLINE_TAG, "[]")) if found is not None else []
        tags = dict([EXPERIMENT_KIND, (f"mlflow.sharedViewState.{VIEW_KEY}", json.dumps(view(headline))),
                     (HEADLINE_TAG, json.dumps(headline))])
        if found is not None:
            for key, value in tags.items():  # an experiment of an older fedbench, or made by hand
                if found.tags.get(key) != value:
                    self.client.set_experiment_tag(found.experiment_id, key, value)
            return found.experiment_id
        path = sqlite_path(self.uri)
        # Artifacts next to the database rather than in whatever directory the command ran from.
        location = (path.resolve().parent / "mlartifacts" / name.replace("/", "_")).as_uri() if path else None
        try:
            return self.client.create_experiment(name, artifact_location=location, tags=tags)
        except MlflowException as err:
            found = self.client.get_experiment_by_name(name)  # made meanwhile by another process, with the tags
            if err.error_code != "RESOURCE_ALREADY_EXISTS" or found is None:
                raise
            return found.experiment_id

    def search(self, experiment_id: str, filter_string: str) -> list:
        runs, token = [], None
        while True:
            page = self.client.search_runs([experiment_id], filter_string, max_results=1000, page_token=token)
            runs += list(page)
            token = page.token
            if not token:
                return runs

    def completed(self, experiment_id: str) -> set[tuple[str, int]]:
        """(config hash, seed) of every sweep run that ran to its end (finished or diverged)."""
        runs = self.search(experiment_id, "tags.role = 'trial' and attributes.status = 'FINISHED'")
        return {(run.data.tags["config_hash"], int(run.data.tags["seed"]))
                for run in runs if PARENT_TAG in run.data.tags}

    def fail_stale(self, experiment_id: str, parent_id: str, claimed: set[tuple[str, int]]) -> int:
        """Runs of an earlier attempt of this sweep left RUNNING (the sweep was killed) become FAILED: those of the
        `claimed` (config hash, seed), whose owner is gone; a live sweep's runs are its own."""
        stale = [run for run in self.search(experiment_id, f"tags.`{PARENT_TAG}` = '{parent_id}' and "
                                                           "attributes.status = 'RUNNING'")
                 if (run.data.tags.get("config_hash"), int(run.data.tags.get("seed", -1))) in claimed]
        for run in stale:
            self.fail_run(run.info.run_id, INTERRUPTED)
        return len(stale)

    def fail_run(self, run_id: str, reason: str) -> None:
        """A run that started but will not end: status failed, with the reason."""
        self.client.log_batch(run_id, tags=[RunTag("status", "failed"), RunTag("error", reason)])
        self.client.set_terminated(run_id, "FAILED")

    def open_sweep(self, experiment_id: str, recipe: Recipe, overrides: list[str],
                   tags: dict[str, str] | None = None) -> str:
        """The sweep's parent run: the earliest of an earlier attempt of the same recipe (its `attempts` tag counted
        up), or a new one. Sweeps of one recipe started together on one store must agree on it, for their claims
        are its params (`sweeps.claims`): a new parent is kept only if, `SETTLE_SECONDS` after it was written, no
        earlier one has appeared; otherwise it is deleted and the earliest used."""
        previous = self.sweep_parents(experiment_id, recipe.recipe_hash)
        if not previous:
            made = self.open_parent(experiment_id, recipe, overrides, f"sweep {recipe.name}",
                                    {"role": "sweep", "attempts": "0", **(tags or {})})
            time.sleep(SETTLE_SECONDS)
            previous = self.sweep_parents(experiment_id, recipe.recipe_hash)
            if previous[0].info.run_id != made:
                self.client.delete_run(made)
        run_id = previous[0].info.run_id
        self.client.update_run(run_id, status="RUNNING")
        self.client.set_tag(run_id, "attempts", str(int(previous[0].data.tags.get("attempts", "0")) + 1))
        return run_id

    def sweep_parents(self, experiment_id: str, recipe_hash: str) -> list:
        """The sweep parent runs of a recipe, earliest first (ties broken by run id, as every process sees them)."""
        runs = self.search(experiment_id, f"tags.role = 'sweep' and tags.recipe_hash = '{recipe_hash}'")
        return sorted(runs, key=lambda run: (run.info.start_time, run.info.run_id))

    def open_parent(self, experiment_id: str, recipe: Recipe, overrides: list[str], name: str,
                    tags: dict[str, str]) -> str:
        """A run that groups others: the recipe (file and resolved) as artifacts, and provenance tags."""
        run = self.client.create_run(experiment_id, run_name=name, tags={
            "recipe_hash": recipe.recipe_hash, "recipe": recipe.source, "overrides": shlex.join(overrides),
            "git_commit": tool_commit(), "host": platform.node(), **tags})
        run_id = run.info.run_id
        if Path(recipe.source).is_file():
            self.client.log_artifact(run_id, recipe.source)
        self.client.log_text(run_id, yaml.safe_dump(recipe.document, sort_keys=False), "recipe.resolved.yaml")
        return run_id

    def artifact_text(self, run_id: str, path: str) -> str:
        return self.artifact_bytes(run_id, path).decode()

    def artifact_bytes(self, run_id: str, path: str) -> bytes:
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one small file, no bar
        with tempfile.TemporaryDirectory() as scratch:
            return Path(self.client.download_artifacts(run_id, path, scratch)).read_bytes()

    def log_models(self, models: dict[str, bytes], name: str = MODEL_FILE) -> None:
        """Each run's model (the bytes of its file, `fedbench.saved`) as its artifact `model/<name>`: the final one
        `model/final.pt`, that of round r `model/round_<r>.pt` (`tracking.models_every`)."""
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / name
            for run_id, data in models.items():
                path.write_bytes(data)
                self.client.log_artifact(run_id, str(path), MODEL_FOLDER)

    def run(self, run_id: str):
        """A stored run; one this store does not hold is refused in one line (StoreError)."""
        try:
            return self.client.get_run(run_id)
        except MlflowException:
            raise StoreError(f"no run {run_id!r} in {self.uri}") from None

    def children(self, run) -> list:
        """The runs a sweep's or tuning session's parent run groups (tag `mlflow.parentRunId`)."""
        return self.search(run.info.experiment_id, f"tags.`{PARENT_TAG}` = '{run.info.run_id}'")

    def run_model(self, run_id: str, round_: int | None = None) -> bytes:
        """The bytes of a run's saved model (`log_models`): its final one, or that of round `round_`; one it does not
        have is refused in one line, with the rounds it has."""
        run = self.run(run_id)
        names = {item.path.rpartition("/")[2] for item in self.client.list_artifacts(run_id, MODEL_FOLDER)}
        name = MODEL_FILE if round_ is None else round_model(round_)
        if name not in names:
            rounds = sorted(int(n[6:-3]) for n in names if n.startswith("round_") and n.endswith(".pt"))
            status = run.data.tags.get("status") or run.info.status
            raise StoreError(f"run {run_id} has no saved model" + (f" of round {round_}" if round_ is not None else "")
                             + (f" (rounds saved: {', '.join(map(str, rounds))})" if rounds else
                                f" (status {status}; runs that failed, and runs stored before models were saved, "
                                "have none)"))
        return self.artifact_bytes(run_id, f"{MODEL_FOLDER}/{name}")

    def close_sweep(self, run_id: str, status: str, counts: dict[str, int]) -> None:
        """The latest attempt's counts as tags `runs_<count>` (tags, not metrics: the UI's chart view plots every
        metric of every listed run, and these would crowd out the curves) and the parent's status."""
        self.client.log_batch(run_id, tags=[RunTag(f"runs_{k}", str(v)) for k, v in counts.items()])
        self.client.set_terminated(run_id, status)

    def log_summary(self, run_id: str, params: dict[str, Any], metrics: dict[str, float]) -> None:
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now_ms(), 0) for k, v in metrics.items()],
                              params=[Param(k, str(v)) for k, v in params.items()])

    def final_values(self, experiment_id: str, trials: list[Trial], metric: str, mode: str,
                     objective: str) -> list[float]:
        """The metric of each trial's finished sweep run: its last value, or its best over the curve."""
        values = []
        for trial in trials:
            runs = self.search(experiment_id, f"tags.role = 'trial' and tags.config_hash = '{trial.config_hash}' "
                                              f"and tags.seed = '{trial.seed}' and attributes.status = 'FINISHED'")
            for run in runs[:1]:
                if objective == "final":
                    values.append(run.data.metrics[metric])
                else:
                    curve = [value for _, value in self.metric_histories([run.info.run_id], metric)[run.info.run_id]]
                    values.append(min(curve) if mode == "min" else max(curve))
        return values

    def start_trial(self, experiment_id: str, trial: Trial, parent_id: str | None, start_time: float,
                    tags: dict[str, str], role: str = "trial") -> str:
        """A run of one (config, seed): role `trial` in a sweep, `tune_trial` in a tuning session, `run`
        for `fedbench run`."""
        return self.start_trials(experiment_id, [(trial, new_run(trial, parent_id, start_time, tags, role))])[0]

    def start_trials(self, experiment_id: str, starts: list[tuple[Trial, NewRun]]) -> list[str]:
        """Runs of trials begun (`new_run`), in one transaction where the store allows (`mlflow_fast`), with each
        plugin's code as the run ran it: their ids."""
        if not starts:
            return []
        runs = [run for _, run in starts]
        ids = self._fast_or(lambda fast: fast.create_runs(experiment_id, runs),
                            lambda: self._each_run(lambda run: self._create_run(experiment_id, run), runs))
        for (trial, _), run_id in zip(starts, ids):
            # the code of its plugins and of what its problem names (a network file), with the modules each imports
            # from its folder, which its sha256 (the tag plugin_sha256, code_sha256) covers
            for folder, sources in (("plugins", trial.plugins), ("code", trial.code)):
                for source in sources:
                    text = (source.text if source.text is not None
                            else Path(source.path).read_text() if source.path else None)
                    if text is not None and source.path is not None:  # a text comes with its path
                        self.client.log_text(run_id, text, f"{folder}/{Path(source.path).name}")
                    for relative, module_text in source.modules:
                        self.client.log_text(run_id, module_text, f"{folder}/{relative}")
        return ids

    def _create_run(self, experiment_id: str, run: NewRun) -> str:
        run_id = self.client.create_run(experiment_id, start_time=run.start_time, run_name=run.name,
                                        tags=run.tags).info.run_id
        for part in chunks([Param(k, v) for k, v in run.params.items()], 100):
            self.client.log_batch(run_id, params=part)
        return run_id

    def log_run(self, experiment: str, headline: list[str], trial: Trial, outcome: dict[str, Any],
                tags: dict[str, str]) -> str:
        """A run of `fedbench run` that has ended, stored whole: its MLflow run id."""
        experiment_id = self.experiment(experiment, headline)
        start_time = outcome["end_time"] - outcome["wall_seconds"]
        run_id = self.start_trial(experiment_id, trial, None, start_time, tags, role="run")
        self.finish_trial(run_id, outcome)
        if outcome.get("model"):
            self.log_models({run_id: outcome["model"]})
        for round_, data in (outcome.get("models") or {}).items():
            self.log_models({run_id: data}, round_model(round_))
        return run_id

    def store_spilled(self) -> list[str]:
        """Store the results that commands kept beside this store when it failed them (`spill`), oldest first; the
        ids of the runs made. A file is removed once its run is stored."""
        stored = []
        for path in sorted((path for folder in spill_folders(self.uri) for path in folder.glob("*.pickle")),
                           key=lambda path: path.name):
            with path.open("rb") as file:
                kept = pickle.load(file)
            stored.append(self.log_run(**kept))
            path.unlink()
        return stored

    def unfinished(self, experiment_id: str, parent_id: str) -> dict[tuple[str, int], str]:
        """The run of each (config hash, seed) of this sweep that an interruption stopped (a kill, Ctrl-C: marked
        so by `fail_stale` or at the interruption): a re-run resumes it as the same MLflow run (`reopen_trial`), the
        latest where an older fedbench left several. A run that failed (an error, its Ray trial's death) stays the
        record of that failure; a re-run makes a new one."""
        runs = self.search(experiment_id, f"tags.`{PARENT_TAG}` = '{parent_id}' and tags.role = 'trial' "
                                          "and attributes.status != 'FINISHED'")
        return {(run.data.tags["config_hash"], int(run.data.tags["seed"])): run.info.run_id
                for run in sorted(runs, key=lambda run: run.info.start_time)
                if run.info.status == "RUNNING" or run.data.tags.get("error") == INTERRUPTED}

    def reopen_trial(self, run_id: str, tags: dict[str, str]) -> int:
        """An unfinished run (`unfinished`) going again: RUNNING, its tags as at a start; the last round of its
        curve already stored (-1: none), whose rows the resumed run does not store twice."""
        self.client.update_run(run_id, status="RUNNING")
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in {"status": "running", **tags}.items()])
        if "error" in self.client.get_run(run_id).data.tags:  # the reason it stopped before
            self.client.delete_tag(run_id, "error")
        history = self.metric_histories([run_id], CURVE_KEY)[run_id]
        return max((step for step, _ in history), default=-1)

    def log_rows(self, runs: dict[str, tuple[list[dict[str, float]], list[float], int]]) -> dict[str, int]:
        """The rows of several runs' curves, each `run_id: (rows, seconds, after)` beyond round `after` (one metric
        per row key, step = round; train_seconds by row), in one write; the last round of each stored then."""
        stamp = now_ms()
        self.log_metrics({run_id: curve(rows, seconds, after, stamp)
                          for run_id, (rows, seconds, after) in runs.items()})
        return {run_id: max(after, int(rows[-1]["round"])) if rows else after
                for run_id, (rows, _, after) in runs.items()}

    def finish_trial(self, run_id: str, outcome: dict[str, Any], after: int = -1) -> None:
        self.finish_trials([ended_run(run_id, outcome, after)])

    def finish_trials(self, ended: list[EndedRun]) -> None:
        """Runs' ends (`ended_run`): in one transaction where the store allows (`mlflow_fast`), else run by run,
        their metrics in one write each."""
        if not ended:
            return

        def end(run: EndedRun) -> None:
            parts = list(chunks(run.metrics, BATCH)) or [[]]
            for part in parts[:-1]:
                self.client.log_batch(run.run_id, metrics=part)
            self.client.log_batch(run.run_id, metrics=parts[-1], tags=[RunTag(k, v) for k, v in run.tags.items()])
            self.client.set_terminated(run.run_id, run.status, end_time=run.end_time)

        self._fast_or(lambda fast: fast.end_runs(ended), lambda: self._each_run(end, ended))

    def log_metrics(self, by_run: dict[str, list[Metric]]) -> None:
        """Runs' metrics, as `log_batch` would store them: into a SQL store (SQLite by default) in one statement for
        all of them (`mlflow_fast`, ~6× faster); elsewhere (a tracking server), with an MLflow whose internals the
        fast path does not know, or if the database refuses the statement, `log_batch` per run in chunks of
        `BATCH`. `tests/test_tracking.py` holds the paths to the same stored history."""
        def public() -> None:
            for run_id, metrics in by_run.items():
                for part in chunks(metrics, BATCH):
                    self.client.log_batch(run_id, metrics=part)

        self._fast_or(lambda fast: fast.insert_metrics(by_run), public)

    def metric_histories(self, run_ids: list[str], key: str) -> dict[str, list[tuple[int, float]]]:
        """Each run's (step, value) of every stored value of a metric, in MLflow's order (timestamp, step, value),
        as `get_metric_history` gives them: from a SQL store in one query per 500 runs (`mlflow_fast`; a query per
        run takes 13 s of the report of 150 runs × 3 curves of 1001 points), otherwise `get_metric_history` per
        run."""
        return self._fast_or(lambda fast: fast.select_histories(list(run_ids), key),
                             lambda: {run_id: [(m.step, m.value) for m in self.client.get_metric_history(run_id, key)]
                                      for run_id in run_ids})

    def _each_run(self, write: Callable[[Any], Any], runs: list) -> list:
        """`write(run)` of each run through MLflow's API: to a tracking server several runs at once, as it answers
        requests in parallel (the requests of one run stay in order); to a file, one after another, as SQLite takes
        one writer at a time. What the first failing run raised is raised."""
        if sqlite_path(self.uri) is not None or len(runs) <= 1:
            return [write(run) for run in runs]
        with concurrent.futures.ThreadPoolExecutor(min(PUBLIC_WRITERS, len(runs)), "fedbench-store") as pool:
            return list(pool.map(write, runs))

    def _fast_or(self, direct: Callable[[mlflow_fast.FastPath], Any], public: Callable[[], Any]) -> Any:
        """`direct(fast path)` where the store has one; else, or where the database refuses the statement (a schema
        of another MLflow: MLflow's session wraps the database's error and rolls the transaction back whole),
        `public()`, through MLflow's API."""
        if self.fast is not None:
            try:
                return direct(self.fast)
            except MlflowException as error:
                if not isinstance(error.__cause__, sqlalchemy.exc.SQLAlchemyError):
                    raise
        return public()


SPILLED = "unstored"  # the folder beside a store of results it failed to take (`spill`)


def spill_folders(uri: str) -> list[Path]:
    """Where a store's refused results are kept: beside it, else (that folder full or not writable) in the system's
    temporary folder, under a name of the store's."""
    return [store_folder(uri) / SPILLED,
            Path(tempfile.gettempdir()) / f"fedbench-{SPILLED}" / hashlib.sha256(uri.encode()).hexdigest()[:16]]


def spill(uri: str, experiment: str, headline: list[str], trial: Trial, outcome: dict[str, Any],
          tags: dict[str, str]) -> Path:
    """A run's result that the store `uri` refused (full, damaged, gone), kept in a file for `Store.store_spilled`,
    which the next command that opens the store for writing calls: the path. Kept where its disk has room for it and
    `MIN_FREE_BYTES` more: a store's disk that was full is, and filling it up helps no one; nowhere, refused in one
    line (StoreError) saying where to free space."""
    kept = pickle.dumps({"experiment": experiment, "headline": headline, "trial": trial, "outcome": outcome,
                         "tags": tags})
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{trial.config_hash}-{trial.seed}-{os.getpid()}.pickle"
    folders = spill_folders(uri)
    for folder in folders:
        try:
            if free_bytes(folder) < len(kept) + MIN_FREE_BYTES:
                continue
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, delete=False) as file:  # whole or not at all
                file.write(kept)
            os.replace(file.name, folder / name)
            return folder / name
        except OSError:
            continue
    raise StoreError(f"{store_folder(uri)}: the run could not be kept either: no room for its {in_bytes(len(kept))} "
                     f"and {in_bytes(MIN_FREE_BYTES)} more in {folders[0]} nor {folders[1]}; free space on either "
                     "disk and run again")


CURVE_KEY = "comm_up"  # an engine column: every row of every run has it (the rounds of a stored curve)


def curve(rows: list[dict[str, float]], seconds: list[float], after: int, stamp: int) -> list[Metric]:
    """The metrics of the rows beyond round `after`: one per row key at step = round, and train_seconds by row."""
    metrics = []
    for row, by_then in itertools.zip_longest(rows, seconds[:len(rows)]):
        step = int(row["round"])
        if step <= after:
            continue
        metrics += [Metric(key, float(value), stamp, step) for key, value in row.items() if key != "round"]
        if by_then is not None:
            metrics.append(Metric("train_seconds", float(by_then), stamp, step))
    return metrics


def new_run(trial: Trial, parent_id: str | None, start_time: float, tags: dict[str, str], role: str) -> NewRun:
    """The MLflow run of a trial as it begins: its name, tags and params."""
    hp = ", ".join(f"{k}={v}" for k, v in trial.hyperparameters.items())
    configuration = f"{trial.algorithm} ({hp})"  # what the UI's runs view groups the seeds by
    run_tags = {"role": role, "problem": trial.problem, "algorithm": trial.algorithm, "seed": str(trial.seed),
                "config_hash": trial.config_hash, "configuration": configuration, "status": "running", **tags}
    if trial.delta is not None:
        run_tags["accountant"] = trial.accountant  # what computed its rows' ε (`fedbench.privacy`)
    if trial.plugins:
        run_tags["plugin_sha256"] = " ".join(source.sha256 for source in trial.plugins)
    if trial.code:
        run_tags["code_sha256"] = " ".join(source.sha256 for source in trial.code)
    if parent_id:
        run_tags[PARENT_TAG] = parent_id
    return NewRun(f"{configuration} seed {trial.seed}", int(start_time * 1000), run_tags,
                  {k: str(v) for k, v in trial.params().items()})


def load_run_model(run_id: str, uri: str | None = None, round_: int | None = None) -> dict[str, Any]:
    """A stored run's final model (or that of round `round_`, `tracking.models_every`), in `fedbench.saved`'s format,
    read from the store at `uri` (default as the CLI's: `MLFLOW_TRACKING_URI`, else `./mlflow.db`): what
    `fedbench.load_model(run_id, uri, round_)` reads."""
    from fedbench.saved import load_model

    return load_model(run_id, uri, round_)


def ended_run(run_id: str, outcome: dict[str, Any], after: int = -1) -> EndedRun:
    """A run's end from its outcome: the curve beyond round `after` (the rows streamed while the run went, `log_rows`,
    are stored already; a Ray trial's outcome carries only the rows it had not streamed), the summary metrics, the
    tags and the final status."""
    stamp = now_ms()
    rows = outcome["rows"]
    seconds = outcome.get("seconds") or []  # train_seconds by each row: a history whose last point is the total
    last_round = max(after, int(rows[-1]["round"]) if rows else 0)
    metrics = curve(rows, seconds, after, stamp)
    has_history = bool(seconds) or after >= 0  # train_seconds by row, in this outcome or streamed
    metrics += [Metric(key, float(outcome[key]), stamp, last_round)
                for key in SUMMARY_METRICS if not (key == "train_seconds" and has_history)]
    tags = {"status": outcome["status"], "device": outcome["device"],
            "runs_in_batch": str(outcome.get("runs_in_batch", 1)),  # as run: memory-bound ones alone
            "compiled": str(outcome.get("compiled", False)).lower(),  # its local steps (recipe field compile)
            **(outcome.get("choices") or {})}  # what its problem chose to run it (a deep network's layout)
    if outcome.get("error"):
        tags["error"] = outcome["error"][-5000:]
    return EndedRun(run_id, metrics, tags, "FAILED" if outcome["status"] == "failed" else "FINISHED",
                    int(outcome["end_time"] * 1000))


def now_ms() -> int:
    return int(time.time() * 1000)


DRAIN = 500  # events one write of `SweepLog` takes at most: its transactions grow with it


class SweepLog:
    """Every write of a running sweep, by one background thread, in the order given. What is queued when the thread is
    free is written together: its starts in one transaction, its rows in one, its ends in one (`Store.start_trials`,
    `log_rows`, `finish_trials`), so that the store keeps pace however many runs Ray ends at once. A run's events
    keep their order: each drained set is written starts first, then rows, then ends."""

    def __init__(self, store: Store, experiment_id: str, parent_id: str):
        self.store, self.experiment_id, self.parent_id = store, experiment_id, parent_id
        self.run_ids: dict[Any, str] = {}
        self.stored: dict[Any, int] = {}  # the last round of each run's curve in the store
        self.ends_stored = 0  # runs whose end the store holds
        self.errors: list[str] = []
        self.queue: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._work, name="fedbench-mlflow", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        closing = False
        while not closing:
            events = [self.queue.get()]
            while len(events) < DRAIN and not self.queue.empty():
                events.append(self.queue.get())
            closing = events[-1] is None  # `close` puts None last
            self._write([event for event in events if event is not None])

    def _write(self, events: list[tuple]) -> None:
        for kind, write in (("start", self._starts), ("rows", self._rows), ("model", self._models),
                            ("end", self._ends), ("abandon", self._abandons)):
            batch = [event[1:] for event in events if event[0] == kind]
            if batch:
                try:
                    write(batch)
                except Exception as err:  # keep the sweep going; the summary reports tracking errors
                    self.errors.append(f"{type(err).__name__}: {first_line(err, 300)}")

    def _starts(self, starts: list[tuple]) -> None:
        fresh = [(key, trial, new_run(trial, self.parent_id, start_time, tags, role))
                 for key, trial, start_time, tags, role, reopen in starts if reopen is None]
        ids = self.store.start_trials(self.experiment_id, [(trial, run) for _, trial, run in fresh])
        for (key, _, _), run_id in zip(fresh, ids):
            self.run_ids[key], self.stored[key] = run_id, -1
        for key, _, _, tags, _, reopen in starts:
            if reopen is not None:
                self.run_ids[key], self.stored[key] = reopen, self.store.reopen_trial(reopen, tags)

    def _rows(self, batches: list[tuple]) -> None:
        runs: dict[Any, tuple[list, list]] = {}
        for (held,) in batches:
            for key, (rows, seconds) in held.items():
                if key in self.run_ids:  # else its start was not stored (a tracking error says why)
                    runs.setdefault(key, ([], []))
                    runs[key][0].extend(rows)
                    runs[key][1].extend(seconds)
        ids = {self.run_ids[key]: key for key in runs}
        stored = self.store.log_rows({self.run_ids[key]: (rows, seconds, self.stored[key])
                                      for key, (rows, seconds) in runs.items()})
        self.stored.update({ids[run_id]: last for run_id, last in stored.items()})

    def _ends(self, ends: list[tuple]) -> None:
        self.store.finish_trials([ended_run(self.run_ids[key], outcome, self.stored.get(key, -1))
                                  for key, outcome in ends if key in self.run_ids])
        self.ends_stored += sum(key in self.run_ids for key, _ in ends)
        self.store.log_models({self.run_ids[key]: outcome["model"] for key, outcome in ends
                               if key in self.run_ids and outcome.get("model")})

    def _models(self, models: list[tuple]) -> None:
        for key, round_, data in models:
            if key in self.run_ids:
                self.store.log_models({self.run_ids[key]: data}, round_model(round_))

    def _abandons(self, abandoned: list[tuple]) -> None:
        for key, reason in abandoned:
            if key in self.run_ids:
                self.store.fail_run(self.run_ids[key], reason)

    def started(self, key: Any, trial: Trial, start_time: float, tags: dict[str, str], role: str = "trial",
                reopen: str | None = None) -> None:
        """A run begins: a new MLflow run, or the unfinished one `reopen` of an earlier attempt going again."""
        self.queue.put(("start", key, trial, start_time, tags, role, reopen))

    def rows(self, runs: dict[Any, tuple[list[dict[str, float]], list[float]]]) -> None:
        """Rows of in-flight runs, by key, beyond those each has stored (a resumed run hands over its checkpoint's
        again): a trial's runs stream together."""
        self.queue.put(("rows", runs))

    def model(self, key: Any, round_: int, data: bytes) -> None:
        """A run's model at a round (`tracking.models_every`)."""
        self.queue.put(("model", key, round_, data))

    def ended(self, key: Any, outcome: dict[str, Any]) -> None:
        self.queue.put(("end", key, outcome))

    def abandoned(self, key: Any, reason: str) -> None:
        """A run that started but will not end (its Ray trial died, or the sweep was interrupted)."""
        self.queue.put(("abandon", key, reason))

    def close(self) -> list[str]:
        self.queue.put(None)
        self.thread.join()
        return self.errors
