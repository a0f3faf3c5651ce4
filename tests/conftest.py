"""Shared test set-up.

- Every test gets its own reference-solution disk cache (FEDBENCH_CACHE) and its own MLflow store
  (MLFLOW_TRACKING_URI in tmp_path), so tests never touch ~/.cache/fedbench or ./mlflow.db.
- `tracking_uri`: a real MLflow SQLite store in tmp_path, copied from one migrated at the start of the
  session (creating a fresh store runs ~8 s of schema migrations).
- `ray_local`: one real local Ray instance shared by a module's tests.
"""
from __future__ import annotations

import os
import shutil

import pytest


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
    ray.init(include_dashboard=False, log_to_driver=False, **resources)
    return ray


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory):
    ray = start_ray(tmp_path_factory, num_cpus=2)
    yield ray
    ray.shutdown()
