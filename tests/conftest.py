"""Shared test set-up.

- Every test gets its own reference-solution disk cache (FEDBENCH_CACHE) and its own MLflow store
  (MLFLOW_TRACKING_URI in tmp_path), so tests never touch ~/.cache/fedbench or ./mlflow.db.
- `tracking_uri`: a real MLflow SQLite store in tmp_path, copied from one migrated at the start of the
  session (creating a fresh store runs ~8 s of schema migrations).
- `ray_local`: one real local Ray instance shared by the tests and modules that ask for it.
- Markers (pyproject.toml lists them), never given by a test's name: `ray` on a test that starts Ray or a
  multi-process store race, `browser` on one that drives Chromium, both explicit on the tests and modules
  themselves; `heavy` given at collection to a test whose recorded duration is 4 s or more (tests/durations.json,
  written by `make durations`: tests/durations.py); `make test-fast` leaves those out.
  Two guards keep `ray` from drifting: collection stops when a test uses a fixture that starts Ray (one that
  requests `starts_ray`) without the marker, and a test without it that starts Ray in this process (`ray.init`)
  fails, naming itself. A test that starts Ray only in a subprocess (`fedbench sweep` as a command) is marked by
  hand.
- `ray_address`: that Ray's address, for the `fedbench sweep` commands a test starts to join (`joined_env`).
- FEDBENCH_DATA (the data root of real data sets, e.g. femnist/femnist_sample10.npz) defaults to the
  `shared/data` folder beside the repository, when it exists and the variable is unset.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
# fixtures of a PostgreSQL-backed MLflow tracking server (tests/servers.py); `heavy` from tests/durations.json
pytest_plugins = ["servers", "durations"]


@pytest.fixture(scope="session", autouse=True)
def _default_data_root():
    with pytest.MonkeyPatch.context() as patch:
        if "FEDBENCH_DATA" not in os.environ and SHARED_DATA.is_dir():
            patch.setenv("FEDBENCH_DATA", str(SHARED_DATA))
        yield


@pytest.fixture(autouse=True)
def _isolated_stores(tmp_path, monkeypatch):
    cache = tmp_path / "fedbench-cache"
    monkeypatch.setenv("FEDBENCH_CACHE", str(cache))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'default-mlflow.db'}")
    return cache


@pytest.fixture
def trace_at_once(monkeypatch):
    """The default gradient traced at a layout's first call, not once its untraced calls have cost what tracing
    costs (`fedbench.problems.traces`)."""
    from fedbench.problems import traces

    monkeypatch.setattr(traces, "IMPORT_SECONDS", 0.0)
    monkeypatch.setattr(traces, "TRACE_SECONDS", 0.0)


@pytest.fixture(scope="session")
def _migrated_store(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def tracking_uri(tmp_path, _migrated_store) -> str:
    path = tmp_path / "mlflow.db"
    shutil.copy(_migrated_store, path)
    return f"sqlite:///{path}"


def start_ray(tmp_path_factory, **resources):
    """A local Ray whose workers use a cache of their own (they inherit the environment at start); the shared one
    (`ray_local`) is stopped first, for a test that needs a Ray of its own."""
    import ray

    ray.shutdown()
    os.environ["FEDBENCH_CACHE"] = str(tmp_path_factory.mktemp("ray-worker-cache"))
    ray.init(address="local", include_dashboard=False, log_to_driver=False, **resources)
    return ray


def stop_shared_ray() -> None:
    """For a test that starts or joins a cluster of its own: a sweep joins the Ray this process has joined."""
    if "ray" in sys.modules:
        sys.modules["ray"].shutdown()


@pytest.fixture(scope="module")
def starts_ray():
    """Requested by every fixture that starts Ray, in this process or in a `fedbench sweep`/`tune` it runs: a test
    whose fixtures request it (directly or through another fixture) must carry the `ray` marker."""


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory, starts_ray):
    """One local Ray of 2 CPUs shared by the modules that ask for it (starting one costs 5-20 s on 2 busy cores): started
    at the first, left running for the next, stopped at the end of the session or by a test that needs a Ray of
    its own (`start_ray`, `stop_shared_ray`), and started again by the next module that asks."""
    import ray

    if not ray.is_initialized():
        start_ray(tmp_path_factory, num_cpus=2)
    return ray


@pytest.fixture(scope="module")
def ray_address(ray_local) -> str:
    """The shared Ray's address, for a `fedbench sweep`/`tune` command (or bench/gallery.py's) to join, given as
    `--address` or RAY_ADDRESS in its environment (`joined_env`), instead of starting a Ray of its own (20-30 s with
    its first worker on 2 busy cores; joining 0.3 s). Its workers run this checkout's venv with this session's
    environment, so a command that needs workers of another environment (another venv, a PYTHONPATH) must not join;
    nor a command killed to test that its own Ray dies with it."""
    return ray_local.get_runtime_context().gcs_address


def joined_env(address: str, **extra: str) -> dict[str, str]:
    """This process's environment, with RAY_ADDRESS set so that the fedbench commands it starts join that Ray."""
    return {**os.environ, "RAY_ADDRESS": address, **extra}


def pytest_sessionfinish(session):
    stop_shared_ray()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: a test-fast run must see the tests it would keep
def pytest_collection_modifyitems(config, items):
    unmarked = [item.nodeid for item in items
                if "starts_ray" in getattr(item, "fixturenames", ()) and item.get_closest_marker("ray") is None]
    if unmarked:
        raise pytest.UsageError(
            f"{len(unmarked)} test(s) use a fixture that starts Ray (it requests `starts_ray`) but are not marked "
            "`ray`: mark them @pytest.mark.ray (or the module: pytestmark = pytest.mark.ray), so that "
            "`make test-fast` leaves them out:\n  " + "\n  ".join(unmarked))


# -- a test that starts Ray in this process without the `ray` marker fails ------------------------------------

_RUNNING: list = []  # the test item running now
_STARTED_RAY_UNMARKED: set[str] = set()


def _guarded(init):
    @functools.wraps(init)
    def guarded_init(*args, **kwargs):
        if _RUNNING and _RUNNING[0].get_closest_marker("ray") is None:
            _STARTED_RAY_UNMARKED.add(_RUNNING[0].nodeid)
        return init(*args, **kwargs)
    return guarded_init


class _GuardRayInit(importlib.abc.MetaPathFinder):
    """Wraps `ray.init` when Ray is first imported (importing it up front would cost every run ~1 s)."""

    def find_spec(self, name, path, target=None):
        if name != "ray":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("ray")
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                module.init = _guarded(module.init)
            spec.loader.exec_module = exec_module
        return spec


if "ray" in sys.modules:
    sys.modules["ray"].init = _guarded(sys.modules["ray"].init)
else:
    sys.meta_path.insert(0, _GuardRayInit())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _RUNNING[:] = [item]
    yield
    _RUNNING.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if call.when == "teardown" and item.nodeid in _STARTED_RAY_UNMARKED:
        _STARTED_RAY_UNMARKED.discard(item.nodeid)
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} started Ray (ray.init) but is not marked `ray`: mark it "
                           "@pytest.mark.ray (or its module), so that `make test-fast` leaves it out")


@pytest.fixture(autouse=True)
def _plugin_registry():
    """Each test's plugins registered for that test only (algorithms, problems, their origins, the modules of
    their files): the registries are one per process, as in a command, where two files giving one name are
    refused (tests/cli/test_plugins.py)."""
    from fedbench import plugins

    saved = [(registry, dict(registry)) for registry in (*plugins.REGISTRIES.values(), plugins.ORIGINS)]
    modules = set(sys.modules)
    yield
    for registry, content in saved:
        registry.clear()
        registry.update(content)
    for name in set(sys.modules) - modules:
        if name.startswith("fedbench_plugin_"):
            del sys.modules[name]
