"""What `make test` tells whoever runs it (issue 47 item 12): a test skipped for want of Chromium, or any other
reason, is skipped with its reason printed at the end even under `-q`; the README says what the browser tests
need and how long the install and the suite take; `heavy` comes from the recorded durations (issue 61)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_skipped_tests_reason_is_printed_under_q(tmp_path):
    """`make test` runs `pytest -q` with the project's configuration: before, a module skipped for want of Chromium
    was one `s` among the dots."""
    (tmp_path / "test_needs_a_browser.py").write_text(
        "import pytest\npytest.skip('no Chromium at /usr/bin/chromium or on PATH', allow_module_level=True)\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pyproject.toml"),
                           "--rootdir", str(tmp_path), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 5, done.stdout + done.stderr  # pytest's "no test ran": the module was skipped
    lines = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED [1] ")]
    assert lines and lines[0].endswith("test_needs_a_browser.py:2: no Chromium at /usr/bin/chromium or on PATH"), \
        done.stdout


def test_the_readme_says_what_the_browser_tests_need_and_how_long_install_and_tests_take():
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "Debian's `chromium` package" in readme and "they are skipped" in readme
    assert "install into .venv (~3 minutes the first time)" in readme
    assert re.search(r"the test suite: ~\d+ minutes on 2 cores", readme), readme[:2000]


# -- `heavy` from tests/durations.json (tests/durations.py) ---------------------------------------------------------

TIMED_TESTS = """\
import time

import pytest


@pytest.fixture
def slow_set_up():
    time.sleep(0.2)


def test_long():
    pass


def test_short():
    pass


def test_new():
    pass


def test_sleeps(slow_set_up):
    time.sleep(0.1)
"""


def pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest on `folder` with tests/durations.py as its plugin, its durations file `folder/durations.json`."""
    (folder / "conftest.py").write_text('pytest_plugins = ["durations"]\n')
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    heavy: recorded at 4 s or more\n")
    (folder / "test_timed.py").write_text(TIMED_TESTS)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(folder),
                           "--durations-file", str(folder / "durations.json"), *args], cwd=folder,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_a_test_recorded_at_four_seconds_or_more_is_heavy_and_one_never_recorded_is_not(tmp_path):
    (tmp_path / "durations.json").write_text(json.dumps({"test_timed.py::test_long": 4.0,
                                                         "test_timed.py::test_short": 3.99}))
    heavy = pytest_in(tmp_path, "--collect-only", "-m", "heavy").stdout.split()
    light = pytest_in(tmp_path, "--collect-only", "-m", "not heavy").stdout.split()
    assert [name for name in heavy if "::" in name] == ["test_timed.py::test_long"]
    assert [name for name in light if "::" in name] == ["test_timed.py::test_short", "test_timed.py::test_new",
                                                        "test_timed.py::test_sleeps"]


def test_record_durations_writes_set_up_and_call_keeps_the_tests_not_run_and_drops_gone_files(tmp_path):
    """Under pytest-xdist (as `make durations` runs the in-process part), the controlling process records."""
    (tmp_path / "durations.json").write_text(json.dumps({"test_timed.py::test_long": 9.0,
                                                         "test_gone.py::test_old": 5.0}))
    pytest_in(tmp_path, "-n", "2", "-k", "sleeps or short", "--record-durations")
    durations = json.loads((tmp_path / "durations.json").read_text())
    assert list(durations) == ["test_timed.py::test_long", "test_timed.py::test_short", "test_timed.py::test_sleeps"]
    assert durations["test_timed.py::test_long"] == 9.0  # not run: kept
    assert 0.3 <= durations["test_timed.py::test_sleeps"] < 4.0  # its fixture's 0.2 s and its own 0.1 s
    assert durations["test_timed.py::test_short"] < 0.3
