"""Shared test set-up.

- Every test gets its own reference-solution disk cache (FEDBENCH_CACHE) and its own MLflow store
  (MLFLOW_TRACKING_URI in tmp_path), so tests never touch ~/.cache/fedbench or ./mlflow.db.
- `tracking_uri`: a real MLflow SQLite store in tmp_path, copied from one migrated at the start of the
  session (creating a fresh store runs ~8 s of schema migrations).
- `ray_local`: one real local Ray instance shared by a module's tests.
- FEDBENCH_DATA (the data root of real data sets, e.g. femnist/femnist_sample10.npz) defaults to the
  `shared/data` folder beside the repository, when it exists and the variable is unset.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
pytest_plugins = ["servers"]  # fixtures of a PostgreSQL-backed MLflow tracking server (tests/servers.py)


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
    """A local Ray whose workers use a cache of their own (they inherit the environment at start)."""
    import ray

    os.environ["FEDBENCH_CACHE"] = str(tmp_path_factory.mktemp("ray-worker-cache"))
    ray.init(address="local", include_dashboard=False, log_to_driver=False, **resources)
    return ray


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory):
    ray = start_ray(tmp_path_factory, num_cpus=2)
    yield ray
    ray.shutdown()


# `make test-fast` leaves out what starts Ray or a browser (markers `ray`, `browser`) and the heaviest single tests: these modules do throughout,
# elsewhere a test that takes the `ray_local` fixture or drives `fedbench sweep`/`tune`/`ui` (by its name) does.
RAY_MODULES = {"test_sweeps.py", "test_sweep_resume.py", "test_sweep_checkpoints.py", "test_sweep_cluster.py", "test_tuning.py", "test_store.py",
               "test_install.py"}
BROWSER_MODULES = {"test_browser.py"}
RAY_NAMES = ("sweep", "tune", "_ui", "ui_", "no_node_can_hold")
# Single tests of 4 s or more on 2 cores (measured with --durations), also left out by `make test-fast`; the
# default suite runs them.
HEAVY = {"test_rows_match_the_record[bao2022_lasso]", "test_rows_match_the_record[bao2022_lowrank]",
         "test_rows_match_the_record[bao2022_emnist10_cpu]", "test_users_hold_their_pattern_in_disjoint_shards[base]",
         "test_full_file_loads_and_one_round_runs_with_36_writers", "test_the_cheap_check_of_real_data_is_building"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.path.name
        if module in BROWSER_MODULES:
            item.add_marker(pytest.mark.browser)
        if (module in RAY_MODULES or "ray_local" in getattr(item, "fixturenames", ())
                or any(part in item.name for part in RAY_NAMES)):
            item.add_marker(pytest.mark.ray)
        if item.name in HEAVY:
            item.add_marker(pytest.mark.heavy)


@pytest.fixture(autouse=True)
def _plugin_registry():
    """Each test's plugins registered for that test only (algorithms, problems, their origins, the modules of
    their files): the registries are one per process, as in a command, where two files giving one name are
    refused (tests/test_plugins.py)."""
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
