"""A real MLflow tracking server backed by PostgreSQL, for tests that drive fedbench against a server (issue 44).

PostgreSQL comes from Debian's packages (`postgresql`, binaries in /usr/lib/postgresql/<version>/bin). `.ci/run`
installs it up front; where it is missing the set-up installs it itself (apt-get, as root or with passwordless
sudo; FEDBENCH_INSTALL_POSTGRES=0 turns that off) and the tests skip only where it cannot be installed, or fail
instead under FEDBENCH_REQUIRE_POSTGRES=1 (set by `.ci/run`).

- `Postgres`: a throwaway cluster in a temp folder (owned by the `postgres` user when running as root, since
  PostgreSQL refuses to run as root), on a free port of 127.0.0.1 with its unix socket in that folder, trust
  authentication, no fsync. `create_database(name, template=None)` takes 0.1-0.5 s.
- `TrackingServer`: `mlflow server` on one database of it, on a free port of 127.0.0.1, with two uvicorn workers and
  artifacts proxied to a temp folder (`--serve-artifacts`); `.uri` is the server's URL, `.database_url` the
  database's SQLAlchemy URL, for direct SQL checks (`duplicated_metric_rows`).
- Fixtures: `postgres` (session), `mlflow_server` (session: one server, shared by the session's tests; each test's
  recipe name is its own experiment) and `fresh_mlflow_server` (function: a server of its own on a new database
  copied from a migrated template, for tests that count everything in the store or kill the server).

Timings on 2 shared, busy cores (load 5-11; Debian 12, PostgreSQL 15, MLflow 3.17): cluster initdb + start 0.8-2.5 s;
`mlflow server` until /health answers 9-35 s, on an empty database (its schema migrations) or a migrated copy alike:
most of it is importing MLflow, in the CLI and in each worker; migrating the template 5-10 s; CREATE DATABASE ...
TEMPLATE 0.1-0.5 s; stopping the server ~2 s, the cluster ~3 s. Hence one server per session by default.
"""
from __future__ import annotations

import fcntl
import glob
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

DEBIAN_BINARIES = "/usr/lib/postgresql/*/bin"
SUPERUSER = "fedbench"  # the cluster's superuser (trust authentication on 127.0.0.1 and the socket)
TEMPLATE = "mlflow_template"  # a database migrated by MLflow once, copied for each fresh server


def postgres_binaries() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres: Debian's newest /usr/lib/postgresql/<version>/bin, else the
    folder of `pg_ctl` on PATH (other systems), else None."""
    def complete(folder: Path) -> bool:
        return all((folder / name).is_file() for name in ("initdb", "pg_ctl", "postgres"))

    found = sorted((Path(path) for path in glob.glob(DEBIAN_BINARIES)),
                   key=lambda path: [int(part) if part.isdigit() else 0 for part in path.parent.name.split(".")])
    for folder in reversed(found):
        if complete(folder):
            return folder
    on_path = shutil.which("pg_ctl")
    if on_path and complete(Path(os.path.realpath(on_path)).parent):
        return Path(os.path.realpath(on_path)).parent
    return None


def install_postgres() -> str | None:
    """Installs Debian's `postgresql` with apt-get where this process may (root, or passwordless sudo); returns
    None once installed, else why not (one line)."""
    if os.environ.get("FEDBENCH_INSTALL_POSTGRES") == "0":
        return "FEDBENCH_INSTALL_POSTGRES=0"
    if shutil.which("apt-get") is None:
        return "no apt-get here (not Debian)"
    if os.geteuid() == 0:
        sudo = []
    elif shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        sudo = ["sudo", "-n"]
    else:
        return "not root and no passwordless sudo"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"]
    # One installer at a time (parallel test sessions); apt's own lock would fail the second one instead.
    with open(os.path.join(tempfile.gettempdir(), "fedbench-postgres-install.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if postgres_binaries() is not None:
            return None
        done = subprocess.run(install, env=env, capture_output=True, text=True)
        if done.returncode != 0:  # package lists not fetched yet (a fresh image): fetch them and try again
            subprocess.run([*sudo, "apt-get", "update", "-qq"], env=env, capture_output=True)
            done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0 or postgres_binaries() is None:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        return f"apt-get install postgresql failed: {last[:160]}"
    return None


def postgres_or_skip() -> Path:
    """The binaries' folder, installed first if need be; skips the test where PostgreSQL cannot be installed (fails
    it under FEDBENCH_REQUIRE_POSTGRES=1, as in CI)."""
    folder = postgres_binaries()
    if folder is None:
        why = install_postgres()
        folder = postgres_binaries()
        if folder is None:
            message = (f"PostgreSQL is not installed and could not be ({why}): "
                       "install Debian's `postgresql` (.ci/run does)")
            if os.environ.get("FEDBENCH_REQUIRE_POSTGRES") == "1":
                pytest.fail(message)
            pytest.skip(message)
    return folder


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Postgres:
    """A PostgreSQL cluster of its own in a temp folder; `stop()` ends it and removes the folder."""

    def __init__(self, binaries: Path):
        self.binaries = binaries
        self.folder = Path(tempfile.mkdtemp(prefix="fedbench-pg-"))  # short: a socket path holds 107 characters
        self.data = self.folder / "data"
        self.log = self.folder / "postgres.log"
        self.port = 0
        self.template_ready = False  # `migrated_template` made TEMPLATE
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root: as Debian's `postgres` user then
            import pwd

            account = pwd.getpwnam("postgres")
            os.chown(self.folder, account.pw_uid, account.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *command: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self.as_user, *command], capture_output=True, text=True, cwd=self.folder)

    def start(self) -> Postgres:
        done = self._run(str(self.binaries / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                         "-E", "UTF8", "--locale=C", "--no-sync")
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{done.stdout}{done.stderr}")
        for _ in range(3):  # a free port may be taken between looking and listening: another one then
            self.port = free_port()
            options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c max_connections=300 "
                       "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
            done = self._run(str(self.binaries / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w",
                             "-t", "60", "-o", options, "start")
            if done.returncode == 0:
                return self
        raise RuntimeError(f"PostgreSQL did not start:\n{done.stdout}{done.stderr}\n{tail(self.log)}")

    def url(self, database: str) -> str:
        # The driver named: SQLAlchemy 2.1's default for postgresql:// is psycopg 3, the test extra installs psycopg2
        return f"postgresql+psycopg2://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def execute(self, statement: str) -> None:
        import psycopg2

        connection = psycopg2.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres")
        try:
            connection.autocommit = True  # CREATE DATABASE runs outside a transaction
            with connection.cursor() as cursor:
                cursor.execute(statement)
        finally:
            connection.close()

    def create_database(self, name: str, template: str | None = None) -> str:
        """A new database (a copy of `template` if given; no one may be connected to it); returns its URL."""
        self.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return self.url(name)

    def stop(self) -> None:
        if self.data.is_dir():
            self._run(str(self.binaries / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)


def healthy(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)  # not urllib: no proxy in between
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


class TrackingServer:
    """`mlflow server` on one PostgreSQL database; `stop()` ends it (its whole process group: the workers too)."""

    def __init__(self, database_url: str, folder: Path, workers: int = 2):
        self.database_url = database_url
        self.folder = folder
        self.workers = workers
        self.log = folder / "mlflow-server.log"
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.start_seconds = 0.0

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180) -> TrackingServer:
        artifacts = self.folder / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
        env.pop("MLFLOW_TRACKING_URI", None)
        began = time.monotonic()
        for _ in range(3):  # a free port may be taken between looking and listening: another one then
            self.port = free_port()
            command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.database_url,
                       "--serve-artifacts", "--artifacts-destination", str(artifacts),
                       "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers)]
            with open(self.log, "a") as log:
                self.process = subprocess.Popen(command, cwd=self.folder, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.process.poll() is None:
                if healthy(self.port):
                    self.start_seconds = time.monotonic() - began
                    return self
                time.sleep(0.1)
            alive = self.process.poll() is None
            self.stop()
            if alive:  # it ran past the timeout: no point in another port
                break
            if "address already in use" not in tail(self.log).lower():
                break
        raise RuntimeError(f"mlflow server did not answer /health on port {self.port}:\n{tail(self.log)}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def duplicated_metric_rows(store) -> dict[tuple[str, str, int], int]:
    """The (run_uuid, key, step) that have more than one row in MLflow's `metrics` table, with their row counts:
    empty when no point of a curve was written twice. `store`: a SQLite tracking URI (`sqlite:///path`), a database
    URL (`postgresql://...`), or an object with `.database_url` (a `TrackingServer`)."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    url = getattr(store, "database_url", store)
    if url.startswith(("http://", "https://")):
        raise ValueError(f"{url}: a server's URL says nothing of its database; pass the server or its database_url")
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise FileNotFoundError(url)  # not created by looking
    engine = sqlalchemy.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            rows = connection.execute(sqlalchemy.text(
                "SELECT run_uuid, key, step, count(*) FROM metrics GROUP BY run_uuid, key, step HAVING count(*) > 1"))
            return {(run, key, int(step)): int(count) for run, key, step, count in rows}
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL cluster of its own for the session, with the database `TEMPLATE` migrated by MLflow."""
    cluster = Postgres(postgres_or_skip()).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def migrated_template(cluster: Postgres, folder: Path) -> str:
    """The database TEMPLATE, created and given MLflow's schema the first time it is asked for: by the call that
    `mlflow server` makes before it serves (`initialize_backend_stores`), in a process of its own, which leaves no
    connection to it behind (a database is copied only while no one is connected to it)."""
    if not cluster.template_ready:
        url = cluster.create_database(TEMPLATE)
        folder.mkdir(parents=True, exist_ok=True)
        code = "import sys; from mlflow.server.handlers import initialize_backend_stores as init; init(*sys.argv[1:])"
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
        done = subprocess.run([sys.executable, "-c", code, url, url, str(folder / "artifacts")], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"MLflow's schema could not be created in {url}:\n{done.stderr[-3000:]}")
        cluster.template_ready = True
    return TEMPLATE


@pytest.fixture(scope="session")
def mlflow_server(postgres, tmp_path_factory) -> Iterator[TrackingServer]:
    """One MLflow tracking server for the session on its own database: tests on it use recipe names of their own."""
    server = TrackingServer(postgres.create_database("mlflow"), tmp_path_factory.mktemp("mlflow-server")).start()
    try:
        yield server
    finally:
        server.stop()


_count = iter(range(1_000_000))


@pytest.fixture
def fresh_mlflow_server(postgres, tmp_path_factory) -> Iterator[TrackingServer]:
    """A server of the test's own on a new database: the store holds only what the test wrote."""
    template = migrated_template(postgres, tmp_path_factory.mktemp("mlflow-template"))
    database = postgres.create_database(f"mlflow_{next(_count)}", template=template)
    server = TrackingServer(database, tmp_path_factory.mktemp("mlflow-server")).start()
    try:
        yield server
    finally:
        server.stop()
