"""`heavy` from measured times, not from hand-kept marks: `tests/durations.json` holds each test's last recorded
duration (its set-up, call and tear-down, in seconds, on 2 busy cores), and a test recorded at `HEAVY_SECONDS` or
more is marked `heavy` at collection (so `make test-fast` leaves it out). A test with no recorded time is not heavy
until it is recorded.

`make durations` runs the suite as `make test` does with `--record-durations`: each test's time replaces its entry
(tests run under pytest-xdist are counted in the controlling process), entries of the other tests are kept, and
those of test files that no longer exist are dropped. Commit the file it writes.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

HEAVY_SECONDS = 4.0
DURATIONS = Path(__file__).resolve().parent / "durations.json"


def pytest_addoption(parser):
    group = parser.getgroup("durations", "heavy from recorded test durations (tests/durations.py)")
    group.addoption("--durations-file", type=Path, default=DURATIONS,
                    help="the recorded durations read (and, with --record-durations, written); default: %(default)s")
    group.addoption("--record-durations", action="store_true",
                    help="write each test's duration (set-up + call + tear-down) into the durations file")


def recorded(path: Path) -> dict[str, float]:
    return json.loads(path.read_text()) if path.is_file() else {}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: `-m 'not heavy'` must see the marks
def pytest_collection_modifyitems(config, items):
    durations = recorded(config.getoption("durations_file"))
    for item in items:
        if durations.get(item.nodeid, 0.0) >= HEAVY_SECONDS:
            item.add_marker(pytest.mark.heavy)


class Recorder:
    """Sums the phases of each test's reports; writes the file at the end of the session."""

    def __init__(self, path: Path, rootdir: Path):
        self.path, self.rootdir = path, rootdir
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self):
        kept = {nodeid: seconds for nodeid, seconds in recorded(self.path).items()
                if (self.rootdir / nodeid.partition("::")[0]).is_file()}
        kept.update({nodeid: round(seconds, 2) for nodeid, seconds in self.seconds.items()})
        self.path.write_text(json.dumps(dict(sorted(kept.items())), indent=0) + "\n")


def pytest_configure(config):
    # in pytest-xdist's workers, nothing: their reports reach the controlling process, which records them
    if config.getoption("record_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Recorder(config.getoption("durations_file"), Path(config.rootpath)),
                                      "durations-recorder")
