# Two commands do all set-up on a fresh machine:
#   make demo   install, then sweep a shipped paper recipe (Bao et al. 2022, Lasso: 5 methods x 3 seeds) on a
#               local Ray into ./mlflow.db, write its report and print the command that opens the runs
#   make test   install, then run the test suite (paper-size runs: make test-slow; no Ray, no browser, no test of
#               4 s or more: make test-fast; the times that decide those: make durations)
# make docs builds the documentation site (docs/, mkdocs.yml) into site/, strictly: a warning fails it.
# make lint runs ruff and mypy as pyproject.toml configures them ([tool.ruff], [tool.mypy]); both must pass.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch first, so that nothing pulls the CUDA wheels (a GPU user installs their own).
TORCH ?= torch==2.13.0

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test,docs]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/fedbench sweep recipes/papers/bao2022_lasso.yaml

# The suite in two parts, side by side: the tests that start Ray or drive Chromium, one at a time (each uses every
# core in bursts: a sweep's trials, the server races, the browser), in the background into $(SERIAL_LOG); meanwhile
# the tests that run in this process (and the CLI commands they start), two at a time on pytest-xdist's workers,
# which fill the cores the first part leaves idle (~30 % of its time: Ray's start, a browser's page load). The first
# part's output follows when both have ended; either part failing fails the target. One thread per process. The
# `fedbench sweep` commands the Ray tests start join one Ray that their session shares (tests/conftest.py:
# ray_address), but for those killed to test what a kill leaves.
SERIAL_LOG ?= .pytest-ray-browser.log
test: install
	@echo "the Ray and browser tests run meanwhile, one at a time; their output follows (log: $(SERIAL_LOG))"
	@(OMP_NUM_THREADS=1 $(PY) -m pytest -q -m 'not slow and (ray or browser)' > $(SERIAL_LOG) 2>&1; \
	  echo $$? > $(SERIAL_LOG).status) & \
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 -m 'not slow and not ray and not browser'; inprocess=$$?; \
	wait; echo "-- the Ray and browser tests:"; cat $(SERIAL_LOG); serial=$$(cat $(SERIAL_LOG).status); \
	rm -f $(SERIAL_LOG).status; [ $$inprocess = 0 ] && [ $$serial = 0 ]

test-fast: install
	$(PY) -m pytest -q -m 'not slow and not ray and not browser and not heavy'

# Each test's time into tests/durations.json (commit it): a test recorded at 4 s or more is `heavy`, which
# test-fast leaves out (tests/durations.py). make test's two parts, one after the other.
durations: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 -m 'not slow and not ray and not browser' --record-durations
	$(PY) -m pytest -q -m 'not slow and (ray or browser)' --record-durations

# Strict: a broken link, a missing anchor or a page outside the nav fails the build; the reference pages are written
# from the code by docs/hooks/reference.py. NO_MKDOCS_2_WARNING quiets Material's notice about its successor.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# ruff over the whole checkout (no `ruff format`: the code keeps its own layout), mypy over fedbench/, sweeps/, cli.py
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/python .ci/import_cycles.py  # no import cycle, no import up a layer; TYPE_CHECKING imports counted

test-slow: install
	$(PY) -m pytest -q -m slow -s

bench: install
	$(PY) bench/clients_batched.py
	$(PY) bench/sweep_overhead.py
	$(PY) bench/store_throughput.py --runs 1000
	$(PY) bench/privacy_rows.py
	FEDBENCH_DATA=$${FEDBENCH_DATA:-../shared/data} $(PY) bench/per_fedavg_round.py

.PHONY: install demo test test-fast durations test-slow docs lint bench
