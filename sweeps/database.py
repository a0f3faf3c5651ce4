"""The database behind an MLflow store: its URI (`tracking_uri`: the default SQLite file, or a PostgreSQL one with a
driver that is installed), and a SQLite file opened checked (`open_sqlite`): made whole if new, upgraded from an
older MLflow's schema, refused in one line (`StoreError`) where it is damaged, half-migrated, or, for a command that
writes, read-only or full. Several fedbench processes may open one new SQLite store at once: its creation is
serialized by a lock of its folder (`store_lock`).

MLflow's telemetry is turned off here, before MLflow is imported (`telemetry_off`): import this module before any
module that imports MLflow.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import tempfile
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Callable, Iterator

import sqlalchemy.exc


def telemetry_off(environ=os.environ) -> None:
    """MLflow sends usage telemetry unless told not to; fedbench tells it not to, for its own tracking and for
    the UI server it starts, unless the user set either switch (MLFLOW_DISABLE_TELEMETRY, DO_NOT_TRACK). Through a
    tracking server MLflow also prints a run's link when the run ends, after reading the whole run back for it: a
    request and a line per run, thousands in a sweep, the sweep's own links printed instead."""
    if "MLFLOW_DISABLE_TELEMETRY" not in environ and "DO_NOT_TRACK" not in environ:
        environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


telemetry_off()  # before MLflow is imported: its telemetry client reads the switch when it starts

from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from .recipe.loading import in_bytes  # noqa: E402

DEFAULT_URI = "sqlite:///mlflow.db"


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


MODEL_FOLDER, MODEL_FILE = "model", "final.pt"  # a run's saved final model (`fedbench.engine.saved`), an artifact


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

