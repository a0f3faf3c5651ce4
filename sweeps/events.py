"""The events of a Ray trial's runs, one protocol for a sweep and a tuning session: what the trial side sends
(`RowStream` through a `Reporter`, `sweeps.worker`) and what the driver makes of it (`Runs`, fed by
`sweeps.relay.Relay`). Each event is a dict reported with `ray.tune.report`:

* `{"event": "start", "key": K, "time": epoch seconds, "tags": {...}, "device": str}`: run K begins (the tags say where:
  node, GPU ids, runs in its program);
* `{"event": "rows", "key": None, "runs": {K: (rows, seconds), ...}}`: rows of the trial's in-flight runs, with each
  run's training seconds by each row, every STREAM_ROWS rows or STREAM_SECONDS seconds;
* `{"event": "end", "key": K, "outcome": asdict(Outcome)}`: run K ended, its outcome carrying the rows not streamed.

A trial that a scheduler reads (a tuning session's, one run) stamps every event with `round` (the last round
reported) and `score` (`Score`), and sends its rows as soon as a row reaches one of the scheduler's rounds
(`report_rounds`, ASHA's rungs): the scheduler then sees each run at each rung as if every row were reported.
"""
from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

STREAM_ROWS = 2000  # rows a Ray trial's stream holds at most before handing them to the driver
STREAM_SECONDS = 2.0  # ... and seconds


def worst(mode: str) -> float:
    return math.inf if mode == "min" else -math.inf


@dataclass
class Score:
    """A tuned run's score by each evaluated row: the row's `metric` (`objective` final), or the best value so far
    (`objective` best), by `mode`; a run that has evaluated no finite value scores the worst possible."""
    metric: str
    mode: str
    objective: str = "best"
    best: float = math.nan
    value: float = math.nan

    def __post_init__(self) -> None:
        self.best = self.value = worst(self.mode)

    def add(self, row: dict[str, float]) -> float:
        value = row[self.metric]
        if math.isfinite(value):
            self.best = min(self.best, value) if self.mode == "min" else max(self.best, value)
        self.value = value if self.objective == "final" else self.best
        return self.value


class RowStream:
    """The rows of a Ray trial's in-flight runs, sent to the driver (`send`, a `Reporter`) in one `rows` event for
    all of them, every STREAM_ROWS rows or STREAM_SECONDS seconds, whichever comes first, checked at each row and
    between rounds (`tick`): each event costs the driver a store transaction, so a program of 30 runs evaluated
    every round must not send one per run, nor one per few rows. What is still held when a run ends travels in its
    `end` event's outcome, so that a run shorter than STREAM_SECONDS sends none. With a `score` (a tuned trial: one
    run), every event is stamped with the run's round and score, and a row that reaches the next of `report_rounds`
    is sent at once."""

    def __init__(self, send: Callable[[dict[str, Any]], None], keys: list[Any], score: Score | None = None,
                 report_rounds: Iterable[float] = ()):
        self.send, self.keys, self.score = send, keys, score
        self.held: dict[Any, tuple[list, list]] = {}
        self.count = 0
        self.sent_at = time.monotonic()
        self.round = 0.0  # the last round the stream took (a scored stream's stamp)
        self.rungs = sorted(report_rounds)

    def stamped(self, event: dict[str, Any]) -> dict[str, Any]:
        """The event, with the round and score a scheduler reads where the stream is scored."""
        if self.score is not None:
            event.update({"round": self.round, "score": self.score.value})
        return event

    def add(self, i: int, row: dict[str, float], seconds: float) -> None:
        rows, by_row = self.held.setdefault(self.keys[i], ([], []))
        rows.append(row)
        by_row.append(seconds)
        self.count += 1
        if self.score is not None:
            self.score.add(row)
            self.round = row["round"]
            if self.rungs and self.round >= self.rungs[0]:
                while self.rungs and self.round >= self.rungs[0]:
                    self.rungs.pop(0)
                self.flush()
                return
        self.tick()

    def tick(self) -> None:
        if self.count and (self.count >= STREAM_ROWS or time.monotonic() - self.sent_at >= STREAM_SECONDS):
            self.flush()

    def flush(self) -> None:
        self.send(self.stamped({"event": "rows", "key": None, "runs": self.held}))
        self.held, self.count, self.sent_at = {}, 0, time.monotonic()

    def take(self, i: int) -> tuple[list, list]:
        """Run i's rows not sent yet and their seconds, no longer held: what its end event carries."""
        rows, by_row = self.held.pop(self.keys[i], ([], []))
        self.count -= len(rows)
        return rows, by_row

    def start(self, key: Any, tags: dict[str, str], device: str) -> None:
        self.send(self.stamped({"event": "start", "key": key, "time": time.time(), "tags": tags, "device": device}))

    def model(self, i: int, round_: int, data: bytes) -> None:
        """Run i's model at round `round_` (`tracking.models_every`), sent as it is made: stored as it comes, so that
        an interrupted run keeps the ones made before."""
        self.send(self.stamped({"event": "model", "key": self.keys[i], "round": round_, "model": data}))

    def end(self, i: int, outcome: dict[str, Any]) -> None:
        """Run i's end: its outcome (`asdict(Outcome)`), with the rows not streamed yet instead of all of them (the
        rows streamed already are not sent twice: the curve of a run evaluated every round is most of what a trial
        sends)."""
        rows, seconds = self.take(i)
        self.send(self.stamped({"event": "end", "key": self.keys[i],
                                "outcome": {**outcome, "rows": rows, "seconds": seconds}}))


class Reporter:
    """A Ray trial's events handed to the driver (`report`, `tune.report`) by a thread of their own, in order.
    `tune.report` holds its caller until the driver has taken the event and acted on it (its store writes
    included; a function trainable reports synchronously), tens to hundreds of ms on a busy machine: a trial's
    rounds must not wait for that every STREAM_SECONDS. Rows events queued behind one another while the driver
    was busy go as one, unless they carry a score (a scheduler reads each). What reporting raised is raised by the
    next event sent (the trial stops, as it did when it reported itself) and by `close()`, which waits for every
    event to be reported."""

    _CLOSE, _NOTHING = object(), object()

    def __init__(self, report: Callable[[dict[str, Any]], None]):
        self.report = report
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._send, name="fedbench-reporter", daemon=True)
        self.thread.start()

    def __call__(self, event: dict[str, Any]) -> None:
        if self.error is not None:
            raise self.error
        self.events.put(event)

    @staticmethod
    def mergeable(event: Any) -> bool:
        return isinstance(event, dict) and event["event"] == "rows" and "score" not in event

    def _send(self) -> None:
        try:
            taken: Any = self._NOTHING
            while True:
                event = self.events.get() if taken is self._NOTHING else taken
                if event is self._CLOSE:
                    return
                taken = self._merge_rows(event) if self.mergeable(event) else self._NOTHING
                self.report(event)
        except BaseException as error:  # SystemExit included (a trial Tune stops): close() raises it
            self.error = error

    def _merge_rows(self, event: dict[str, Any]) -> Any:
        """Fold the rows events queued behind `event` into it; return the first other event taken (_NOTHING if
        none was queued)."""
        while True:
            try:
                following = self.events.get_nowait()
            except queue.Empty:
                return self._NOTHING
            if not self.mergeable(following):
                return following
            for key, (rows, seconds) in following["runs"].items():
                held_rows, held_seconds = event["runs"].setdefault(key, ([], []))
                held_rows.extend(rows)
                held_seconds.extend(seconds)

    def close(self) -> None:
        self.events.put(self._CLOSE)
        self.thread.join()
        if self.error is not None:
            raise self.error


# -- on the driver ----------------------------------------------------------------------------------

DIED = "the Ray trial running it died"


class Runs:
    """The driver's side of the protocol: the runs of a sweep (or of one algorithm's tuning session) as their events
    come, written to the store through `log` (a `writer.SweepLog`, as runs of `role`, each with the tags its start
    event brings, `tags` and its own, `add`; an unfinished MLflow run of an earlier attempt, by (config hash, seed) in
    `reopen`, goes on) and counted by status in `counts`."""

    def __init__(self, log, role: str = "trial", tags: dict[str, str] | None = None,
                 reopen: dict[tuple[str, int], str] | None = None, counts: dict[str, int] | None = None):
        self.log, self.role, self.tags, self.reopen = log, role, tags or {}, reopen or {}
        self.counts = counts if counts is not None else {"finished": 0, "diverged": 0, "failed": 0}
        self.trials: dict[Any, Any] = {}  # key -> Trial
        self.own_tags: dict[Any, dict[str, str]] = {}
        self.devices: dict[Any, str] = {}
        self.running: set[Any] = set()
        self.ended: set[Any] = set()
        self.reached: dict[Any, float] = {}  # the last round each in-flight run has reported
        self.failed: dict[Any, str] = {}  # the runs that failed, each with the line that says why
        self.ends: list[Any] = []  # the runs that ended, in the order they did
        self.compute_seconds = 0.0  # in-trial wall time of the runs that ended

    def add(self, key: Any, trial, tags: dict[str, str] | None = None) -> None:
        self.trials[key] = trial
        if tags:
            self.own_tags[key] = tags

    def on_event(self, event: dict[str, Any]) -> None:
        if event["event"] == "rows":
            self.rows(event["runs"])
        elif event["event"] == "start":
            self.start(event["key"], event)
        elif event["event"] == "model":
            self.log.model(event["key"], event["round"], event["model"])
        else:
            self.end(event["key"], event["outcome"])

    def rows(self, runs: dict[Any, tuple[list, list]]) -> None:
        for key, (rows, _) in runs.items():
            if rows:
                self.reached[key] = rows[-1]["round"]
        self.log.rows(runs)

    def start(self, key: Any, event: dict[str, Any]) -> None:
        self.running.add(key)
        self.devices[key] = event.get("device", "cpu")
        trial = self.trials[key]
        self.log.started(key, trial, event["time"], {**event["tags"], **self.tags, **self.own_tags.get(key, {})},
                         role=self.role, reopen=self.reopen.get((trial.config_hash, trial.seed)))

    def end(self, key: Any, outcome: dict[str, Any]) -> None:
        from .database import last_line  # MLflow: the driver's

        self.running.discard(key)
        self.ended.add(key)
        self.reached.pop(key, None)
        self.ends.append(key)
        self.counts[outcome["status"]] += 1
        if outcome["status"] == "failed":
            self.failed[key] = last_line(outcome["error"] or "")
        self.compute_seconds += outcome["wall_seconds"]
        self.log.ended(key, outcome)

    def died(self, keys: Iterable[Any], error_file: str | None) -> None:
        """The Ray trial of these runs died: its running run failed, and so did those that had not ended."""
        for key in keys:
            if key in self.running:
                self.running.discard(key)
                self.log.abandoned(key, f"{DIED}: {error_file or 'no error file'}")
            if key not in self.ended:
                self.ended.add(key)
                self.counts["failed"] += 1
                self.failed[key] = f"{DIED} ({error_file or 'no error file'})"

    def stopped(self, key: Any, status: str) -> None:
        """A run its scheduler stopped before its end (`status`: pruned): its streamed curve is what it has."""
        self.running.discard(key)
        self.ended.add(key)
        self.reached.pop(key, None)
        self.counts[status] += 1
        self.log.ended(key, {"rows": [], "seconds": [], "status": status, "device": self.devices.get(key, "cpu"),
                             "error": None, "train_seconds": math.nan, "eval_seconds": math.nan,
                             "wall_seconds": math.nan, "end_time": time.time()})

    def in_flight(self, rounds: Callable[[Any], int]) -> dict[Any, tuple[float, int]]:
        """(round reached, rounds) of each running run, by key."""
        return {key: (self.reached.get(key, 0), rounds(key)) for key in sorted(self.running)}
