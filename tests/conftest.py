"""Shared test set-up: every test gets its own reference-solution disk cache (FEDBENCH_CACHE), so tests
never read or write ~/.cache/fedbench and never see each other's cached files."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_reference_cache(tmp_path, monkeypatch):
    cache = tmp_path / "fedbench-cache"
    monkeypatch.setenv("FEDBENCH_CACHE", str(cache))
    return cache
