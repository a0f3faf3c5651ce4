"""The MLflow store and fedbench's layout inside it (`Store`): one parent run per sweep, one nested run per (config,
seed).

Layout. Experiment = recipe name. The sweep's parent run carries the recipe (file and resolved YAML as
artifacts), its hash, the tool's git commit and the host; it is found again by recipe hash, so a resumed
sweep keeps one parent. Each (config, seed) is a nested run (tag `mlflow.parentRunId`) with flattened
params, tags `role=trial, problem, algorithm, seed, config_hash, configuration, status` (and `accountant`, pld or
rdp, where its rows carry ε) and the per-round curve as metrics with `step=round` (what each run's start, curve
and end write: `sweeps.writer`).

Speed. On SQLite one `log_metric` costs ~10-30 ms; the curve goes out with `log_batch` in chunks of 1000 (~0.5 ms
per value), or faster straight into MLflow's SQL store (`sweeps.mlflow_fast`). During a sweep all writes are made by
one background thread on the driver (`sweeps.writer.SweepLog`), so parallel trials never contend for the database
("database is locked"). The database itself (its URI, the SQLite file made, checked and upgraded) is
`sweeps.database`'s; the results a store refused, kept for the next command, `sweeps.spill`'s.
"""
from __future__ import annotations

import concurrent.futures
import importlib.metadata
import json
import os
import pickle
import platform
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import sqlalchemy.exc
import yaml

# first: it turns MLflow's telemetry off, which MLflow reads when it is imported
from .database import MIN_FREE_BYTES, StoreError, open_sqlite, sqlite_path, store_folder, tracking_uri

# isort: split
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from . import mlflow_fast
from .mlflow_fast import EndedRun, NewRun
from .recipe import Recipe, Trial
from .recipe.loading import in_bytes
from .spill import spill_folders
from .writer import (
    BATCH,
    CURVE_KEY,
    PARENT_TAG,
    SUMMARY_METRICS,
    chunks,
    curve,
    ended_run,
    new_run,
    now_ms,
    round_model,
)

INTERRUPTED = "interrupted: the sweep stopped while this run was going"
# MLflow 3's UI opens an experiment in its GenAI (traces) view unless the experiment says it holds model
# training runs: the experiment tag its frontend reads to choose the view, and the value its kind selector sets.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# The view of the runs that `fedbench ui` links to, stored as MLflow's "shared view" experiment tag (what the
# UI's share button writes; the URL names it with `viewStateShareKey`): the runs that are compared, i.e. not the
# sweep and tuning parents, whose bookkeeping is in tags, grouped by configuration so that each group holds its
# seeds, and the charts drawing each group's mean curve. Grouping is also what makes nested runs visible: the
# plain table shows a sweep's runs collapsed under its parent, and its charts only the runs shown.
VIEW_KEY = "fedbench"
VIEW = {"searchFilter": "tags.role != 'sweep' and tags.role != 'tune'",
        "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": "configuration"}]},
        "useGroupedValuesInCharts": True}
# How long a new sweep parent waits for one that another sweep of the recipe wrote at the same moment (`open_sweep`)
SETTLE_SECONDS = 1.0
HEADLINE_TAG = "fedbench.headline"  # the metrics the view charts first (json list), for `fedbench ui` to keep them

MODEL_FOLDER, MODEL_FILE = "model", "final.pt"  # a run's saved final model (`fedbench.engine.saved`), an artifact
# A metric value's cost in a SQLite store (a row of MLflow's `metrics` and its indexes): measured 257 B a value, the
# file's growth over 16,000 and 64,000 values of Lasso runs' curves (16 a round, names of 6-16 characters, `log_rows`);
# rounded up for longer names (`personal_...`). What the runs of a command will write is checked against it
# (`Store.check_room`).
STORED_VALUE_BYTES = 300


def stored_values(trials: Iterable[Trial]) -> int:
    """The metric values the runs of `trials` store: each row's metrics and train_seconds, and the summary metrics."""
    return sum(trial.rows_logged() * (len(trial.metrics()) + 1) + len(SUMMARY_METRICS) for trial in trials)


def tool_commit() -> str:
    """The fedbench that ran: a checkout's git commit (+dirty), or an installed package's version (its folder may
    sit inside someone else's git repository, whose commit would say nothing of fedbench)."""
    here = Path(__file__).resolve().parent
    if not (here.parent / "pyproject.toml").is_file():  # installed: site-packages/fedbench_sweeps
        try:
            return f"fedbench {importlib.metadata.version('fedbench')}"
        except importlib.metadata.PackageNotFoundError:
            return "unknown"
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def view(headline: list[str]) -> dict:
    """`VIEW`, its charts opening with a chart of each headline metric, in order. MLflow adds a chart of each
    other metric to the section named after the metric's prefix ("Model metrics" for a name without `/`; found by
    name): by name among the section's charts, or after them where the section is marked reordered (as dragging
    a chart does), as this one is."""
    if not headline:
        return VIEW
    section: dict[str, Any] = {"uuid": "fedbench-model-metrics", "name": "Model metrics", "isReordered": True,
                               "display": True}  # shown: an absent `display` hides the section's charts
    return {**VIEW, "compareRunSections": [section],
            "compareRunCharts": [line_chart(metric, section["uuid"]) for metric in headline]}


def line_chart(metric: str, section: str) -> dict:
    """MLflow's chart of one metric's curves (a LINE chart card of its UI's runs view), with only the fields
    that it draws and behaves like MLflow's own chart of the metric with: the others take their defaults."""
    return {"uuid": f"fedbench-{metric}",  # what the UI edits, moves or deletes a chart by
            "type": "LINE", "metricKey": metric, "metricSectionId": section,
            # The x-axis and the line smoothing the user sets for all charts (the charts' settings menu); without
            # these the chart keeps the step axis whatever that says, and an absent smoothing smooths the curve.
            "useGlobalXaxisKey": True, "useGlobalLineSmoothing": True}


PUBLIC_WRITERS = 8  # runs written at once through MLflow's API to a tracking server


class Store:
    """One MLflow tracking store (SQLite file or server) and the fedbench layout inside it."""

    def __init__(self, uri: str | None = None, write: bool = True):
        """`write`: the command writes to the store (a sweep, a run), which is then checked writable first."""
        self.uri = tracking_uri(uri)
        path = sqlite_path(self.uri)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(self.uri) if path is None else open_sqlite(path, self.uri, write)
        self.fast = mlflow_fast.probe(self.client)  # None: MLflow's public API only, for the life of this Store
        self.recovered = self.store_spilled() if write else []

    def folder(self) -> Path:
        return store_folder(self.uri)

    def check_room(self, trials: list[Trial]) -> None:
        """Refuse (StoreError), before they run, runs whose curves a SQLite store's disk cannot hold: their
        `stored_values` at `STORED_VALUE_BYTES` each, beyond `MIN_FREE_BYTES`. A server's disk is not seen from here."""
        path = sqlite_path(self.uri)
        if path is None or not trials:
            return
        values = stored_values(trials)
        needed, free = MIN_FREE_BYTES + STORED_VALUE_BYTES * values, shutil.disk_usage(path.parent).free
        if free < needed:
            runs = f"{len(trials)} run{'s' if len(trials) != 1 else ''}"
            raise StoreError(f"{path.parent}: the MLflow store's disk has {in_bytes(free)} free, {runs} will write "
                             f"~{in_bytes(needed)} ({values} metric values); free some space or give another "
                             "--tracking-uri")

    def experiment(self, name: str, headline: list[str] | None = None) -> str:
        """The experiment's id, created if new, with the tags of `EXPERIMENT_KIND` and of the runs view, whose
        charts show the `headline` metrics first; without `headline`, those the experiment has (`HEADLINE_TAG`)."""
        found = self.client.get_experiment_by_name(name)
        if headline is None:
            headline = json.loads(found.tags.get(HEADLINE_TAG, "[]")) if found is not None else []
        tags = dict([EXPERIMENT_KIND, (f"mlflow.sharedViewState.{VIEW_KEY}", json.dumps(view(headline))),
                     (HEADLINE_TAG, json.dumps(headline))])
        if found is not None:
            for key, value in tags.items():  # an experiment of an older fedbench, or made by hand
                if found.tags.get(key) != value:
                    self.client.set_experiment_tag(found.experiment_id, key, value)
            return found.experiment_id
        path = sqlite_path(self.uri)
        # Artifacts next to the database rather than in whatever directory the command ran from.
        location = (path.resolve().parent / "mlartifacts" / name.replace("/", "_")).as_uri() if path else None
        try:
            return self.client.create_experiment(name, artifact_location=location, tags=tags)
        except MlflowException as err:
            found = self.client.get_experiment_by_name(name)  # made meanwhile by another process, with the tags
            if err.error_code != "RESOURCE_ALREADY_EXISTS" or found is None:
                raise
            return found.experiment_id

    def search(self, experiment_id: str, filter_string: str) -> list:
        runs, token = [], None
        while True:
            page = self.client.search_runs([experiment_id], filter_string, max_results=1000, page_token=token)
            runs += list(page)
            token = page.token
            if not token:
                return runs

    def completed(self, experiment_id: str) -> set[tuple[str, int]]:
        """(config hash, seed) of every sweep run that ran to its end (finished or diverged)."""
        runs = self.search(experiment_id, "tags.role = 'trial' and attributes.status = 'FINISHED'")
        return {(run.data.tags["config_hash"], int(run.data.tags["seed"]))
                for run in runs if PARENT_TAG in run.data.tags}

    def fail_stale(self, experiment_id: str, parent_id: str, claimed: set[tuple[str, int]]) -> int:
        """Runs of an earlier attempt of this sweep left RUNNING (the sweep was killed) become FAILED: those of the
        `claimed` (config hash, seed), whose owner is gone; a live sweep's runs are its own."""
        stale = [run for run in self.search(experiment_id, f"tags.`{PARENT_TAG}` = '{parent_id}' and "
                                                           "attributes.status = 'RUNNING'")
                 if (run.data.tags.get("config_hash"), int(run.data.tags.get("seed", -1))) in claimed]
        for run in stale:
            self.fail_run(run.info.run_id, INTERRUPTED)
        return len(stale)

    def fail_run(self, run_id: str, reason: str) -> None:
        """A run that started but will not end: status failed, with the reason."""
        self.client.log_batch(run_id, tags=[RunTag("status", "failed"), RunTag("error", reason)])
        self.client.set_terminated(run_id, "FAILED")

    def open_sweep(self, experiment_id: str, recipe: Recipe, overrides: list[str],
                   tags: dict[str, str] | None = None) -> str:
        """The sweep's parent run: the earliest of an earlier attempt of the same recipe (its `attempts` tag counted
        up), or a new one. Sweeps of one recipe started together on one store must agree on it, for their claims
        are its params (`sweeps.claims`): a new parent is kept only if, `SETTLE_SECONDS` after it was written, no
        earlier one has appeared; otherwise it is deleted and the earliest used."""
        previous = self.sweep_parents(experiment_id, recipe.recipe_hash)
        if not previous:
            made = self.open_parent(experiment_id, recipe, overrides, f"sweep {recipe.name}",
                                    {"role": "sweep", "attempts": "0", **(tags or {})})
            time.sleep(SETTLE_SECONDS)
            previous = self.sweep_parents(experiment_id, recipe.recipe_hash)
            if previous[0].info.run_id != made:
                self.client.delete_run(made)
        run_id = previous[0].info.run_id
        self.client.update_run(run_id, status="RUNNING")
        self.client.set_tag(run_id, "attempts", str(int(previous[0].data.tags.get("attempts", "0")) + 1))
        return run_id

    def sweep_parents(self, experiment_id: str, recipe_hash: str) -> list:
        """The sweep parent runs of a recipe, earliest first (ties broken by run id, as every process sees them)."""
        runs = self.search(experiment_id, f"tags.role = 'sweep' and tags.recipe_hash = '{recipe_hash}'")
        return sorted(runs, key=lambda run: (run.info.start_time, run.info.run_id))

    def open_parent(self, experiment_id: str, recipe: Recipe, overrides: list[str], name: str,
                    tags: dict[str, str]) -> str:
        """A run that groups others: the recipe (file and resolved) as artifacts, and provenance tags."""
        run = self.client.create_run(experiment_id, run_name=name, tags={
            "recipe_hash": recipe.recipe_hash, "recipe": recipe.source, "overrides": shlex.join(overrides),
            "git_commit": tool_commit(), "host": platform.node(), **tags})
        run_id = run.info.run_id
        if Path(recipe.source).is_file():
            self.client.log_artifact(run_id, recipe.source)
        self.client.log_text(run_id, yaml.safe_dump(recipe.document, sort_keys=False), "recipe.resolved.yaml")
        return run_id

    def artifact_text(self, run_id: str, path: str) -> str:
        return self.artifact_bytes(run_id, path).decode()

    def artifact_bytes(self, run_id: str, path: str) -> bytes:
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one small file, no bar
        with tempfile.TemporaryDirectory() as scratch:
            return Path(self.client.download_artifacts(run_id, path, scratch)).read_bytes()

    def log_models(self, models: dict[str, bytes], name: str = MODEL_FILE) -> None:
        """Each run's model (the bytes of its file, `fedbench.engine.saved`) as its artifact `model/<name>`: the final
        one `model/final.pt`, that of round r `model/round_<r>.pt` (`tracking.models_every`)."""
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / name
            for run_id, data in models.items():
                path.write_bytes(data)
                self.client.log_artifact(run_id, str(path), MODEL_FOLDER)

    def run(self, run_id: str):
        """A stored run; one this store does not hold is refused in one line (StoreError)."""
        try:
            return self.client.get_run(run_id)
        except MlflowException:
            raise StoreError(f"no run {run_id!r} in {self.uri}") from None

    def children(self, run) -> list:
        """The runs a sweep's or tuning session's parent run groups (tag `mlflow.parentRunId`)."""
        return self.search(run.info.experiment_id, f"tags.`{PARENT_TAG}` = '{run.info.run_id}'")

    def run_model(self, run_id: str, round_: int | None = None) -> bytes:
        """The bytes of a run's saved model (`log_models`): its final one, or that of round `round_`; one it does not
        have is refused in one line, with the rounds it has."""
        run = self.run(run_id)
        names = {item.path.rpartition("/")[2] for item in self.client.list_artifacts(run_id, MODEL_FOLDER)}
        name = MODEL_FILE if round_ is None else round_model(round_)
        if name not in names:
            rounds = sorted(int(n[6:-3]) for n in names if n.startswith("round_") and n.endswith(".pt"))
            status = run.data.tags.get("status") or run.info.status
            raise StoreError(f"run {run_id} has no saved model" + (f" of round {round_}" if round_ is not None else "")
                             + (f" (rounds saved: {', '.join(map(str, rounds))})" if rounds else
                                f" (status {status}; runs that failed, and runs stored before models were saved, "
                                "have none)"))
        return self.artifact_bytes(run_id, f"{MODEL_FOLDER}/{name}")

    def close_sweep(self, run_id: str, status: str, counts: dict[str, int]) -> None:
        """The latest attempt's counts as tags `runs_<count>` (tags, not metrics: the UI's chart view plots every
        metric of every listed run, and these would crowd out the curves) and the parent's status."""
        self.client.log_batch(run_id, tags=[RunTag(f"runs_{k}", str(v)) for k, v in counts.items()])
        self.client.set_terminated(run_id, status)

    def log_summary(self, run_id: str, params: dict[str, Any], metrics: dict[str, float]) -> None:
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now_ms(), 0) for k, v in metrics.items()],
                              params=[Param(k, str(v)) for k, v in params.items()])

    def final_values(self, experiment_id: str, trials: list[Trial], metric: str, mode: str,
                     objective: str) -> list[float]:
        """The metric of each trial's finished sweep run: its last value, or its best over the curve."""
        values = []
        for trial in trials:
            runs = self.search(experiment_id, f"tags.role = 'trial' and tags.config_hash = '{trial.config_hash}' "
                                              f"and tags.seed = '{trial.seed}' and attributes.status = 'FINISHED'")
            for run in runs[:1]:
                if objective == "final":
                    values.append(run.data.metrics[metric])
                else:
                    curve = [value for _, value in self.metric_histories([run.info.run_id], metric)[run.info.run_id]]
                    values.append(min(curve) if mode == "min" else max(curve))
        return values

    def start_trial(self, experiment_id: str, trial: Trial, parent_id: str | None, start_time: float,
                    tags: dict[str, str], role: str = "trial") -> str:
        """A run of one (config, seed): role `trial` in a sweep, `tune_trial` in a tuning session, `run`
        for `fedbench run`."""
        return self.start_trials(experiment_id, [(trial, new_run(trial, parent_id, start_time, tags, role))])[0]

    def start_trials(self, experiment_id: str, starts: list[tuple[Trial, NewRun]]) -> list[str]:
        """Runs of trials begun (`new_run`), in one transaction where the store allows (`mlflow_fast`), with each
        plugin's code as the run ran it: their ids."""
        if not starts:
            return []
        runs = [run for _, run in starts]
        ids = self._fast_or(lambda fast: fast.create_runs(experiment_id, runs),
                            lambda: self._each_run(lambda run: self._create_run(experiment_id, run), runs))
        for (trial, _), run_id in zip(starts, ids):
            # the code of its plugins and of what its problem names (a network file), with the modules each imports
            # from its folder, which its sha256 (the tag plugin_sha256, code_sha256) covers
            for folder, sources in (("plugins", trial.plugins), ("code", trial.code)):
                for source in sources:
                    text = (source.text if source.text is not None
                            else Path(source.path).read_text() if source.path else None)
                    if text is not None and source.path is not None:  # a text comes with its path
                        self.client.log_text(run_id, text, f"{folder}/{Path(source.path).name}")
                    for relative, module_text in source.modules:
                        self.client.log_text(run_id, module_text, f"{folder}/{relative}")
        return ids

    def _create_run(self, experiment_id: str, run: NewRun) -> str:
        run_id = self.client.create_run(experiment_id, start_time=run.start_time, run_name=run.name,
                                        tags=run.tags).info.run_id
        for part in chunks([Param(k, v) for k, v in run.params.items()], 100):
            self.client.log_batch(run_id, params=part)
        return run_id

    def log_run(self, experiment: str, headline: list[str], trial: Trial, outcome: dict[str, Any],
                tags: dict[str, str]) -> str:
        """A run of `fedbench run` that has ended, stored whole: its MLflow run id."""
        experiment_id = self.experiment(experiment, headline)
        start_time = outcome["end_time"] - outcome["wall_seconds"]
        run_id = self.start_trial(experiment_id, trial, None, start_time, tags, role="run")
        self.finish_trial(run_id, outcome)
        if outcome.get("model"):
            self.log_models({run_id: outcome["model"]})
        for round_, data in (outcome.get("models") or {}).items():
            self.log_models({run_id: data}, round_model(round_))
        return run_id

    def store_spilled(self) -> list[str]:
        """Store the results that commands kept beside this store when it failed them (`spill`), oldest first; the
        ids of the runs made. A file is removed once its run is stored."""
        stored = []
        for path in sorted((path for folder in spill_folders(self.uri) for path in folder.glob("*.pickle")),
                           key=lambda path: path.name):
            with path.open("rb") as file:
                kept = pickle.load(file)
            stored.append(self.log_run(**kept))
            path.unlink()
        return stored

    def unfinished(self, experiment_id: str, parent_id: str) -> dict[tuple[str, int], str]:
        """The run of each (config hash, seed) of this sweep that an interruption stopped (a kill, Ctrl-C: marked
        so by `fail_stale` or at the interruption): a re-run resumes it as the same MLflow run (`reopen_trial`), the
        latest where an older fedbench left several. A run that failed (an error, its Ray trial's death) stays the
        record of that failure; a re-run makes a new one."""
        runs = self.search(experiment_id, f"tags.`{PARENT_TAG}` = '{parent_id}' and tags.role = 'trial' "
                                          "and attributes.status != 'FINISHED'")
        return {(run.data.tags["config_hash"], int(run.data.tags["seed"])): run.info.run_id
                for run in sorted(runs, key=lambda run: run.info.start_time)
                if run.info.status == "RUNNING" or run.data.tags.get("error") == INTERRUPTED}

    def reopen_trial(self, run_id: str, tags: dict[str, str]) -> int:
        """An unfinished run (`unfinished`) going again: RUNNING, its tags as at a start; the last round of its
        curve already stored (-1: none), whose rows the resumed run does not store twice."""
        self.client.update_run(run_id, status="RUNNING")
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in {"status": "running", **tags}.items()])
        if "error" in self.client.get_run(run_id).data.tags:  # the reason it stopped before
            self.client.delete_tag(run_id, "error")
        history = self.metric_histories([run_id], CURVE_KEY)[run_id]
        return max((step for step, _ in history), default=-1)

    def log_rows(self, runs: dict[str, tuple[list[dict[str, float]], list[float], int]]) -> dict[str, int]:
        """The rows of several runs' curves, each `run_id: (rows, seconds, after)` beyond round `after` (one metric
        per row key, step = round; train_seconds by row), in one write; the last round of each stored then."""
        stamp = now_ms()
        self.log_metrics({run_id: curve(rows, seconds, after, stamp)
                          for run_id, (rows, seconds, after) in runs.items()})
        return {run_id: max(after, int(rows[-1]["round"])) if rows else after
                for run_id, (rows, _, after) in runs.items()}

    def finish_trial(self, run_id: str, outcome: dict[str, Any], after: int = -1) -> None:
        self.finish_trials([ended_run(run_id, outcome, after)])

    def finish_trials(self, ended: list[EndedRun]) -> None:
        """Runs' ends (`ended_run`): in one transaction where the store allows (`mlflow_fast`), else run by run,
        their metrics in one write each."""
        if not ended:
            return

        def end(run: EndedRun) -> None:
            parts = list(chunks(run.metrics, BATCH)) or [[]]
            for part in parts[:-1]:
                self.client.log_batch(run.run_id, metrics=part)
            self.client.log_batch(run.run_id, metrics=parts[-1], tags=[RunTag(k, v) for k, v in run.tags.items()])
            self.client.set_terminated(run.run_id, run.status, end_time=run.end_time)

        self._fast_or(lambda fast: fast.end_runs(ended), lambda: self._each_run(end, ended))

    def log_metrics(self, by_run: dict[str, list[Metric]]) -> None:
        """Runs' metrics, as `log_batch` would store them: into a SQL store (SQLite by default) in one statement for
        all of them (`mlflow_fast`, ~6× faster); elsewhere (a tracking server), with an MLflow whose internals the
        fast path does not know, or if the database refuses the statement, `log_batch` per run in chunks of
        `BATCH`. `tests/sweeps/test_tracking.py` holds the paths to the same stored history."""
        def public() -> None:
            for run_id, metrics in by_run.items():
                for part in chunks(metrics, BATCH):
                    self.client.log_batch(run_id, metrics=part)

        self._fast_or(lambda fast: fast.insert_metrics(by_run), public)

    def metric_histories(self, run_ids: list[str], key: str) -> dict[str, list[tuple[int, float]]]:
        """Each run's (step, value) of every stored value of a metric, in MLflow's order (timestamp, step, value),
        as `get_metric_history` gives them: from a SQL store in one query per 500 runs (`mlflow_fast`; a query per
        run takes 13 s of the report of 150 runs × 3 curves of 1001 points), otherwise `get_metric_history` per
        run."""
        return self._fast_or(lambda fast: fast.select_histories(list(run_ids), key),
                             lambda: {run_id: [(m.step, m.value) for m in self.client.get_metric_history(run_id, key)]
                                      for run_id in run_ids})

    def _each_run(self, write: Callable[[Any], Any], runs: list) -> list:
        """`write(run)` of each run through MLflow's API: to a tracking server several runs at once, as it answers
        requests in parallel (the requests of one run stay in order); to a file, one after another, as SQLite takes
        one writer at a time. What the first failing run raised is raised."""
        if sqlite_path(self.uri) is not None or len(runs) <= 1:
            return [write(run) for run in runs]
        with concurrent.futures.ThreadPoolExecutor(min(PUBLIC_WRITERS, len(runs)), "fedbench-store") as pool:
            return list(pool.map(write, runs))

    def _fast_or(self, direct: Callable[[mlflow_fast.FastPath], Any], public: Callable[[], Any]) -> Any:
        """`direct(fast path)` where the store has one; else, or where the database refuses the statement (a schema
        of another MLflow: MLflow's session wraps the database's error and rolls the transaction back whole),
        `public()`, through MLflow's API."""
        if self.fast is not None:
            try:
                return direct(self.fast)
            except MlflowException as error:
                if not isinstance(error.__cause__, sqlalchemy.exc.SQLAlchemyError):
                    raise
        return public()


def load_run_model(run_id: str, uri: str | None = None, round_: int | None = None) -> dict[str, Any]:
    """A stored run's final model (or that of round `round_`, `tracking.models_every`), in `fedbench.engine.saved`'s
    format, read from the store at `uri` (default as the CLI's: `MLFLOW_TRACKING_URI`, else `./mlflow.db`): what
    `fedbench.load_model(run_id, uri, round_)` reads."""
    from fedbench.engine.saved import load_model

    return load_model(run_id, uri, round_)

