"""What `make test` tells whoever runs it (issue 47 item 12): a test skipped for want of Chromium, or any other
reason, is skipped with its reason printed at the end even under `-q`; the README says what the browser tests
need and how long the install and the suite take."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
