"""`fedbench ui`: the MLflow UI started on a SQLite store (a tracking server serves its own), on a free port, and
the pages of an experiment's runs printed once it answers; stopped with `fedbench ui` (Ctrl-C or SIGTERM), server
and workers."""
from __future__ import annotations

import collections
import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import webbrowser
from pathlib import Path
from typing import Callable, Iterator, Optional
from urllib.parse import urlencode

import typer

from .console import fail, load_recipe, open_store, recipe_file, say

UI_PORT = 5000  # MLflow's own default
PORTS_TRIED = 100  # without --port: the default and the ports after it, until one is free
UI_STOP_SECONDS = 10  # how long a stopped `fedbench ui` waits for the MLflow server to end before killing it


@contextlib.contextmanager
def noted_stops() -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM noted in the list yielded, not raised, while inside; the handlers set before are set
    again at its end. An exception raised from a handler is lost where the signal lands in a weakref callback
    (SQLAlchemy's, while `ui` queried its store: the UI then served on, 4 of 26 stops here), and a blocking
    waitpid is not woken by a signal that another of the process's threads takes."""
    noted: list[int] = []
    before = {number: signal.signal(number, lambda received, _: noted.append(received))
              for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield noted
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def browse(recipe_path: Optional[Path], experiment: Optional[str], open_browser: bool, tracking_uri: Optional[str],
           host: str, port: Optional[int], stopped_by: list[int]) -> None:
    """`ui`, its stops noted in `stopped_by` and looked at where it waits: before the server starts, while it
    starts and while it serves (`serve`)."""
    from .database import sqlite_path, tracking_uri as resolve_uri

    if recipe_path is not None and experiment is not None:
        fail("give RECIPE or --experiment, not both")
    if recipe_path is not None:  # a misspelt name first, before the store is looked for
        recipe_path = recipe_file(recipe_path)
    uri = resolve_uri(tracking_uri)
    path = sqlite_path(uri)
    if path is not None and not path.exists():
        fail(f"no MLflow store at {path}; run `fedbench sweep` or `fedbench run` here first, or pass --tracking-uri")
    name = load_recipe(recipe_path, None).name if recipe_path is not None else experiment
    store = open_store(uri)
    if name is None:  # the store's one fedbench experiment, if there is just one
        found = [e.name for e in store.client.search_experiments() if e.name != "Default"]
        name = found[0] if len(found) == 1 else None
    elif store.client.get_experiment_by_name(name) is None:
        fail(f"no experiment {name!r} in {uri}; run `fedbench sweep` on its recipe first")
    if path is not None:
        port = listen_port(host, port)
    base = uri.rstrip("/") if path is None else f"http://{host}:{port}"
    experiment_id = store.experiment(name) if name else None  # also marks an older experiment's kind
    table = runs_url(base, experiment_id)

    def pages() -> None:
        say(f"runs:   {table}")
        if experiment_id is not None:
            say(f"charts: {runs_url(base, experiment_id, charts=True)}")
            say(run_counts(store, experiment_id, name))

    if path is None:  # a tracking server serves its own UI
        pages()
        if open_browser:
            webbrowser.open(table)
        return
    assert port is not None  # listen_port chose it
    if stopped_by:
        raise typer.Exit(128 + stopped_by[0])
    serve(path, uri, host, port, pages, table if open_browser else None, stopped_by)


def serve(path: Path, uri: str, host: str, port: int, pages: Callable[[], None], open_page: Optional[str],
          stopped_by: list[int]) -> None:
    """The MLflow UI server on the SQLite store at `path`, on host:port, until it ends or a stop is noted in
    `stopped_by`; once it answers, its `pages` printed and `open_page` opened in the browser. Exits with the server's
    code, or 128 + the signal that stopped it."""
    from .database import last_line

    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{path.resolve()}",
               "--host", host, "--port", str(port)]
    # The server's own lines, unless `fedbench -v`: in the system's temporary folder, not the researcher's
    log = Path(tempfile.gettempdir()) / f"fedbench-ui-{port}.log"
    output = None if os.environ.get("FEDBENCH_VERBOSE") == "1" else log.open("w")
    # One worker serves one researcher; its own process group, so that stopping `fedbench ui` (Ctrl-C or
    # SIGTERM) stops the server's workers too instead of leaving them running (~250 MB each).
    server = subprocess.Popen(command + ["--workers", "1"], env={**os.environ, "MLFLOW_TRACKING_URI": uri},
                              stdout=output, stderr=subprocess.STDOUT if output else None, start_new_session=True)
    # Its start takes 10-60 s (imports, the store's check): said at once, the links when it answers
    say(f"starting the MLflow UI server on {host}:{port} (its log: {log if output else 'below'}); its links follow "
        "once it answers, Ctrl-C stops it")
    try:
        if serving(server, host, port, stopping=lambda: bool(stopped_by)):
            pages()  # once the server answers: a page opened before (~30 s here) was an error page
            say(f"serving (its log: {log if output else 'above'}); Ctrl-C stops it")
            if open_page is not None:
                webbrowser.open(open_page)
            while server.poll() is None and not stopped_by:
                time.sleep(0.2)
        elif not stopped_by:
            lines = log.read_text(errors="replace").splitlines()[-20:] if output else []
            last = f" ({last_line(chr(10).join(lines))})" if lines else ""
            fail(f"the MLflow UI server did not start on {host}:{port}{last}; its log: {log if output else 'above'}",
                 " | ".join(lines))
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=UI_STOP_SECONDS)
            except subprocess.TimeoutExpired:  # its job consumers can outlast a SIGTERM by minutes: not ours to wait
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    raise typer.Exit(128 + stopped_by[0] if stopped_by else server.returncode)  # 130 after Ctrl-C, 143 SIGTERM


def runs_url(base: str, experiment_id: str | None, charts: bool = False) -> str:
    """The MLflow UI page of an experiment's runs: the model-training view (`workflowType`; otherwise MLflow 3
    may open its GenAI view) in the stored `VIEW`, as the table or the chart view (`compareRunsMode`). Without
    an experiment: the list of experiments."""
    from .store import VIEW_KEY

    if experiment_id is None:
        return f"{base}/#/experiments?workflowType=machine_learning"
    query = {"workflowType": "machine_learning", "viewStateShareKey": VIEW_KEY}
    if charts:
        query["compareRunsMode"] = "CHART"
    return f"{base}/#/experiments/{experiment_id}/runs?{urlencode(query)}"


def run_counts(store, experiment_id: str, name: str | None) -> str:
    """How many runs the page lists, and the parent runs that group them, which MLflow's own counts include (a
    15-run sweep is 16 runs there) and the page filters out."""
    roles = collections.Counter(run.data.tags.get("role", "other") for run in store.search(experiment_id, ""))
    parents = roles.pop("sweep", 0) + roles.pop("tune", 0)
    listed = sum(roles.values())
    return (f"experiment {name!r}: {listed} run{'s' if listed != 1 else ''} listed"
            + (f", and {parents} parent run{'s' if parents != 1 else ''} (a sweep or tuning session, tag role) that "
               f"group them, which the page filters out and MLflow's own counts include" if parents else ""))


def listen_port(host: str, port: Optional[int]) -> int:
    """The port `ui` serves on: the one given, refused (exit 2) when it is in use, for the page would be the
    other program's; without --port the default, or the first free port after it, said so."""
    import errno

    chosen = port
    if chosen is None:
        chosen = next((p for p in range(UI_PORT, UI_PORT + PORTS_TRIED) if listen_error(host, p) is None), UI_PORT)
        if chosen != UI_PORT:
            say(f"port {UI_PORT} is in use; serving on port {chosen} instead")
    error = listen_error(host, chosen)
    if error is not None and error.errno == errno.EADDRINUSE:
        fail(f"port {chosen} of {host} is in use by another program; choose another with --port")
    if error is not None:
        fail(f"cannot serve on {host}:{chosen} ({error.strerror or error}); choose another --host or --port")
    return chosen


def listen_error(host: str, port: int) -> Optional[OSError]:
    """Why a server could not listen on host:port now (None: it could). Bound and let go at once, with
    SO_REUSEADDR as MLflow's uvicorn binds, so that a port an earlier `fedbench ui` just closed is free."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as err:
        return err
    return None


def serving(server: subprocess.Popen, host: str, port: int, stopping: Callable[[], bool] = lambda: False,
            timeout: float | None = None) -> bool:
    """Wait until the UI server we started answers as MLflow (False if it exited, `stopping()` said so or `timeout`
    seconds ran out). Without a timeout, as long as the server lives: its start took 25-64 s on a loaded machine, past
    the 60 s this waited once, and a server that has not failed is still starting (Ctrl-C stops it). A connection
    alone proves nothing: another program could hold the port, our server failing to bind it; so MLflow's /version
    must answer with this MLflow's version, and our server must still run."""
    import http.client

    from mlflow.version import VERSION

    address = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # the wildcard, reached on loopback
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    while server.poll() is None and not stopping() and time.monotonic() < deadline:
        connection = http.client.HTTPConnection(address, port, timeout=2)  # not urllib: no proxy in between
        try:
            connection.request("GET", "/version")
            response = connection.getresponse()
            if response.status == 200 and response.read().decode(errors="replace").strip() == VERSION:
                return server.poll() is None
        except (OSError, http.client.HTTPException):  # not listening yet, or not speaking HTTP
            pass
        finally:
            connection.close()
        time.sleep(0.2)
    return False
