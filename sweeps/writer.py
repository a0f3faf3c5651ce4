"""What a run writes to the store: its MLflow run as it begins (`new_run`), its curve (`curve`), its end
(`ended_run`); and `SweepLog`, the one background thread that makes every write of a running sweep, so that parallel
trials never contend for the database ("database is locked").
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Any, Iterable, Protocol

# first: it turns MLflow's telemetry off, which MLflow reads when it is imported
from .database import first_line

# isort: split
from mlflow.entities import Metric

from .mlflow_fast import EndedRun, NewRun
from .recipe import Trial

BATCH = 1000  # MLflow's limit of metrics per log_batch call (100 for params and tags)
PARENT_TAG = "mlflow.parentRunId"
SUMMARY_METRICS = ("train_seconds", "eval_seconds", "wall_seconds")  # per run, at its last round (train_seconds also
# by every evaluated round where the run recorded it)


def round_model(round_: int) -> str:
    """The artifact file of a run's model at a round (`tracking.models_every`), in its folder `model/`."""
    return f"round_{round_}.pt"


def chunks(items: list, size: int) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


CURVE_KEY = "comm_up"  # an engine column: every row of every run has it (the rounds of a stored curve)


def curve(rows: list[dict[str, float]], seconds: list[float], after: int, stamp: int) -> list[Metric]:
    """The metrics of the rows beyond round `after`: one per row key at step = round, and train_seconds by row."""
    metrics = []
    for row, by_then in itertools.zip_longest(rows, seconds[:len(rows)]):
        step = int(row["round"])
        if step <= after:
            continue
        metrics += [Metric(key, float(value), stamp, step) for key, value in row.items() if key != "round"]
        if by_then is not None:
            metrics.append(Metric("train_seconds", float(by_then), stamp, step))
    return metrics


def new_run(trial: Trial, parent_id: str | None, start_time: float, tags: dict[str, str], role: str) -> NewRun:
    """The MLflow run of a trial as it begins: its name, tags and params."""
    hp = ", ".join(f"{k}={v}" for k, v in trial.hyperparameters.items())
    configuration = f"{trial.algorithm} ({hp})"  # what the UI's runs view groups the seeds by
    run_tags = {"role": role, "problem": trial.problem, "algorithm": trial.algorithm, "seed": str(trial.seed),
                "config_hash": trial.config_hash, "configuration": configuration, "status": "running", **tags}
    if trial.delta is not None:
        run_tags["accountant"] = trial.accountant  # what computed its rows' ε (`fedbench.axes.privacy`)
    if trial.plugins:
        run_tags["plugin_sha256"] = " ".join(source.sha256 for source in trial.plugins)
    if trial.code:
        run_tags["code_sha256"] = " ".join(source.sha256 for source in trial.code)
    if parent_id:
        run_tags[PARENT_TAG] = parent_id
    return NewRun(f"{configuration} seed {trial.seed}", int(start_time * 1000), run_tags,
                  {k: str(v) for k, v in trial.params().items()})


def ended_run(run_id: str, outcome: dict[str, Any], after: int = -1) -> EndedRun:
    """A run's end from its outcome: the curve beyond round `after` (the rows streamed while the run went, `log_rows`,
    are stored already; a Ray trial's outcome carries only the rows it had not streamed), the summary metrics, the
    tags and the final status."""
    stamp = now_ms()
    rows = outcome["rows"]
    seconds = outcome.get("seconds") or []  # train_seconds by each row: a history whose last point is the total
    last_round = max(after, int(rows[-1]["round"]) if rows else 0)
    metrics = curve(rows, seconds, after, stamp)
    has_history = bool(seconds) or after >= 0  # train_seconds by row, in this outcome or streamed
    metrics += [Metric(key, float(outcome[key]), stamp, last_round)
                for key in SUMMARY_METRICS if not (key == "train_seconds" and has_history)]
    tags = {"status": outcome["status"], "device": outcome["device"],
            "runs_in_batch": str(outcome.get("runs_in_batch", 1)),  # as run: memory-bound ones alone
            "compiled": str(outcome.get("compiled", False)).lower(),  # its local steps (recipe field compile)
            **(outcome.get("choices") or {})}  # what its problem chose to run it (a deep network's layout)
    if outcome.get("error"):
        tags["error"] = outcome["error"][-5000:]
    return EndedRun(run_id, metrics, tags, "FAILED" if outcome["status"] == "failed" else "FINISHED",
                    int(outcome["end_time"] * 1000))


def now_ms() -> int:
    return int(time.time() * 1000)


DRAIN = 500  # events one write of `SweepLog` takes at most: its transactions grow with it


class RunStore(Protocol):
    """The writes `SweepLog` makes, as `sweeps.store.Store` provides them (a protocol, so that the store, which
    builds its records here, is not imported back)."""

    def start_trials(self, experiment_id: str, starts: list[tuple[Trial, NewRun]]) -> list[str]: ...
    def reopen_trial(self, run_id: str, tags: dict[str, str]) -> int: ...
    def log_rows(self, runs: dict[str, tuple[list[dict[str, float]], list[float], int]]) -> dict[str, int]: ...
    def finish_trials(self, ended: list[EndedRun]) -> None: ...
    def log_models(self, models: dict[str, bytes], name: str = ...) -> None: ...
    def fail_run(self, run_id: str, reason: str) -> None: ...


class SweepLog:
    """Every write of a running sweep, by one background thread, in the order given. What is queued when the thread is
    free is written together: its starts in one transaction, its rows in one, its ends in one (`Store.start_trials`,
    `log_rows`, `finish_trials`), so that the store keeps pace however many runs Ray ends at once. A run's events
    keep their order: each drained set is written starts first, then rows, then ends."""

    def __init__(self, store: RunStore, experiment_id: str, parent_id: str):
        self.store, self.experiment_id, self.parent_id = store, experiment_id, parent_id
        self.run_ids: dict[Any, str] = {}
        self.stored: dict[Any, int] = {}  # the last round of each run's curve in the store
        self.ends_stored = 0  # runs whose end the store holds
        self.errors: list[str] = []
        self.queue: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._work, name="fedbench-mlflow", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        closing = False
        while not closing:
            events = [self.queue.get()]
            while len(events) < DRAIN and not self.queue.empty():
                events.append(self.queue.get())
            closing = events[-1] is None  # `close` puts None last
            self._write([event for event in events if event is not None])

    def _write(self, events: list[tuple]) -> None:
        for kind, write in (("start", self._starts), ("rows", self._rows), ("model", self._models),
                            ("end", self._ends), ("abandon", self._abandons)):
            batch = [event[1:] for event in events if event[0] == kind]
            if batch:
                try:
                    write(batch)
                except Exception as err:  # keep the sweep going; the summary reports tracking errors
                    self.errors.append(f"{type(err).__name__}: {first_line(err, 300)}")

    def _starts(self, starts: list[tuple]) -> None:
        fresh = [(key, trial, new_run(trial, self.parent_id, start_time, tags, role))
                 for key, trial, start_time, tags, role, reopen in starts if reopen is None]
        ids = self.store.start_trials(self.experiment_id, [(trial, run) for _, trial, run in fresh])
        for (key, _, _), run_id in zip(fresh, ids):
            self.run_ids[key], self.stored[key] = run_id, -1
        for key, _, _, tags, _, reopen in starts:
            if reopen is not None:
                self.run_ids[key], self.stored[key] = reopen, self.store.reopen_trial(reopen, tags)

    def _rows(self, batches: list[tuple]) -> None:
        runs: dict[Any, tuple[list, list]] = {}
        for (held,) in batches:
            for key, (rows, seconds) in held.items():
                if key in self.run_ids:  # else its start was not stored (a tracking error says why)
                    runs.setdefault(key, ([], []))
                    runs[key][0].extend(rows)
                    runs[key][1].extend(seconds)
        ids = {self.run_ids[key]: key for key in runs}
        stored = self.store.log_rows({self.run_ids[key]: (rows, seconds, self.stored[key])
                                      for key, (rows, seconds) in runs.items()})
        self.stored.update({ids[run_id]: last for run_id, last in stored.items()})

    def _ends(self, ends: list[tuple]) -> None:
        self.store.finish_trials([ended_run(self.run_ids[key], outcome, self.stored.get(key, -1))
                                  for key, outcome in ends if key in self.run_ids])
        self.ends_stored += sum(key in self.run_ids for key, _ in ends)
        self.store.log_models({self.run_ids[key]: outcome["model"] for key, outcome in ends
                               if key in self.run_ids and outcome.get("model")})

    def _models(self, models: list[tuple]) -> None:
        for key, round_, data in models:
            if key in self.run_ids:
                self.store.log_models({self.run_ids[key]: data}, round_model(round_))

    def _abandons(self, abandoned: list[tuple]) -> None:
        for key, reason in abandoned:
            if key in self.run_ids:
                self.store.fail_run(self.run_ids[key], reason)

    def started(self, key: Any, trial: Trial, start_time: float, tags: dict[str, str], role: str = "trial",
                reopen: str | None = None) -> None:
        """A run begins: a new MLflow run, or the unfinished one `reopen` of an earlier attempt going again."""
        self.queue.put(("start", key, trial, start_time, tags, role, reopen))

    def rows(self, runs: dict[Any, tuple[list[dict[str, float]], list[float]]]) -> None:
        """Rows of in-flight runs, by key, beyond those each has stored (a resumed run hands over its checkpoint's
        again): a trial's runs stream together."""
        self.queue.put(("rows", runs))

    def model(self, key: Any, round_: int, data: bytes) -> None:
        """A run's model at a round (`tracking.models_every`)."""
        self.queue.put(("model", key, round_, data))

    def ended(self, key: Any, outcome: dict[str, Any]) -> None:
        self.queue.put(("end", key, outcome))

    def abandoned(self, key: Any, reason: str) -> None:
        """A run that started but will not end (its Ray trial died, or the sweep was interrupted)."""
        self.queue.put(("abandon", key, reason))

    def close(self) -> list[str]:
        self.queue.put(None)
        self.thread.join()
        return self.errors
