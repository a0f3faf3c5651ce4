"""Writes and reads of curves straight into MLflow's SQL store: the only module that uses MLflow's private API.

MLflow's SQL store makes one ORM object per value in `log_batch` (~70 µs each: 0.5 s for a curve of 1000 rounds ×
7 keys, 75 CPU-s of the driver in a sweep of 150 such runs) and reads a run's metric by its key alone (the
table's index starts with the key). Here a curve goes in with one executemany, sanitised as MLflow does (NaN
stored as 0 with is_nan, ±inf as ±the largest float), after which MLflow's own routine updates the run's latest
values (~6× faster); and the curves of many runs come out in one query per 500 runs.

A sweep's runs are also started and ended here many to a transaction (`create_runs`, `end_runs`): MLflow's
`create_run`, `log_batch` and `set_terminated` commit one transaction each, five of ~5-10 ms for every run, so that
the driver stored a 3,000-run sweep in 310 s that Ray computed in 36.5 s (`bench/store_throughput.py`). The rows
written are those MLflow's own calls write (a run's row as `create_run` makes it, its `mlflow.runName` tag, its
params and tags, its status and end time as `set_terminated` sets them).

This leans on internals that any MLflow release may rename: the client's store, the store's session maker,
`_get_run`, `_check_run_is_active`, `_update_latest_metrics_if_necessary`, `sanitize_metric_value` and the
`SqlMetric`, `SqlRun`, `SqlTag` and `SqlParam` models. `probe` tries every one of them once, when a `Store` opens;
if anything is missing or behaves otherwise, it answers None and the store goes through MLflow's public API for
good.
"""
from __future__ import annotations

import inspect
import math
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy

if TYPE_CHECKING:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

COLUMNS = ("run_uuid", "key", "value", "timestamp", "step", "is_nan")  # of MLflow's metrics table, as written
RUN_COLUMNS = ("run_uuid", "name", "experiment_id", "artifact_uri", "source_type", "source_name", "entry_point_name",
               "user_id", "status", "start_time", "end_time", "deleted_time", "source_version", "lifecycle_stage")
RUN_NAME = "mlflow.runName"  # the tag MLflow's UI names a run by


@dataclass
class NewRun:
    """A run to create: what `MlflowClient.create_run` and a `log_batch` of its params are given."""
    name: str
    start_time: int  # epoch ms
    tags: dict[str, str]
    params: dict[str, str]


@dataclass
class EndedRun:
    """A run's end: its last metrics, tags and status, as `log_batch` and `set_terminated` store them."""
    run_id: str
    metrics: list[Metric]
    tags: dict[str, str]
    status: str  # FINISHED | FAILED | KILLED
    end_time: int  # epoch ms


class FastPath:
    """A SQL store behind an MLflow client, written and read directly."""

    def __init__(self, store, models):
        self.store = store
        self.metric_model, self.run_model, self.tag_model, self.param_model = models
        read_only = "read_only" in inspect.signature(store.ManagedSessionMaker).parameters
        self.writing = {"read_only": False} if read_only else {}  # MLflow ≥ 3.1x: sessions read-only unless told

    def insert_metrics(self, by_run: dict[str, list[Metric]]) -> None:
        """Each run's metrics as `log_batch` stores them: one executemany for all runs and MLflow's update of each
        run's latest values, in one transaction (rolled back whole if the database refuses a statement)."""
        with self.store.ManagedSessionMaker(**self.writing) as session:
            self._insert_metrics(session, by_run)

    def create_runs(self, experiment_id: str, runs: list[NewRun]) -> list[str]:
        """Runs as `create_run` makes them, with their params, all in one transaction: their ids."""
        from mlflow.utils.uri import append_to_uri_path

        location = self.store.get_experiment(experiment_id).artifact_location
        ids = [uuid.uuid4().hex for _ in runs]
        rows, tags, params = [], [], []
        for run_id, run in zip(ids, runs):
            rows.append({"run_uuid": run_id, "name": run.name, "experiment_id": int(experiment_id),
                         "artifact_uri": append_to_uri_path(location, run_id, "artifacts"),
                         "source_type": "UNKNOWN", "source_name": "", "entry_point_name": "", "user_id": "unknown",
                         "status": "RUNNING", "start_time": run.start_time, "end_time": None, "deleted_time": None,
                         "source_version": "", "lifecycle_stage": "active"})
            tags += [{"run_uuid": run_id, "key": k, "value": v} for k, v in {RUN_NAME: run.name, **run.tags}.items()]
            params += [{"run_uuid": run_id, "key": k, "value": v} for k, v in run.params.items()]
        with self.store.ManagedSessionMaker(**self.writing) as session:
            session.execute(sqlalchemy.insert(self.run_model.__table__), rows)
            for table, values in ((self.tag_model.__table__, tags), (self.param_model.__table__, params)):
                if values:
                    session.execute(sqlalchemy.insert(table), values)
        return ids

    def end_runs(self, ended: list[EndedRun]) -> None:
        """Runs' last metrics, tags (set: a tag given again replaces its value, as `log_batch` does) and status, all
        in one transaction."""
        run_table, tag_table = self.run_model.__table__, self.tag_model.__table__
        with self.store.ManagedSessionMaker(**self.writing) as session:
            self._insert_metrics(session, {run.run_id: run.metrics for run in ended})
            for run in ended:
                if run.tags:
                    session.execute(sqlalchemy.delete(tag_table).where(tag_table.c.run_uuid == run.run_id,
                                                                       tag_table.c.key.in_(list(run.tags))))
            session.execute(sqlalchemy.insert(tag_table), [{"run_uuid": run.run_id, "key": k, "value": v}
                                                           for run in ended for k, v in run.tags.items()])
            for run in ended:
                session.execute(sqlalchemy.update(run_table).where(run_table.c.run_uuid == run.run_id)
                                .values(status=run.status, end_time=run.end_time))

    def _insert_metrics(self, session, by_run: dict[str, list[Metric]]) -> None:
        store, rows = self.store, {}
        latest: dict[str, dict[str, Any]] = {}  # run -> metric -> (order, row) of its newest value
        for run_id, metrics in by_run.items():
            newest = latest.setdefault(run_id, {})
            for metric in metrics:
                is_nan, value = store.sanitize_metric_value(float(metric.value))
                row = {"run_uuid": run_id, "key": metric.key, "value": value, "timestamp": int(metric.timestamp),
                       "step": int(metric.step), "is_nan": is_nan}
                rows[(run_id, metric.key, row["timestamp"], row["step"], value, is_nan)] = row  # a repeat once
                order = (row["step"], row["timestamp"], value)  # MLflow's order of recency
                if metric.key not in newest or order > newest[metric.key][0]:
                    newest[metric.key] = (order, row)
        if not rows:
            return
        for run_id, newest in latest.items():
            if newest:
                store._check_run_is_active(store._get_run(run_uuid=run_id, session=session))
        session.execute(sqlalchemy.insert(self.metric_model.__table__), list(rows.values()))
        for newest in latest.values():  # MLflow's update reads and locks one run's latest values
            if newest:
                store._update_latest_metrics_if_necessary([self.metric_model(**row) for _, row in newest.values()],
                                                          session)

    def select_histories(self, run_ids: list[str], key: str) -> dict[str, list[tuple[int, float]]]:
        """Each run's (step, value) of every stored value of a metric, in `get_metric_history`'s order (timestamp,
        step, value), in one query per 500 runs (SQLite's limit of parameters in one statement)."""
        table = self.metric_model.__table__
        found: dict[str, list[tuple[int, float]]] = {run_id: [] for run_id in run_ids}
        with self.store.ManagedSessionMaker() as session:
            for start in range(0, len(run_ids), 500):
                query = (sqlalchemy.select(table.c.run_uuid, table.c.step, table.c.value, table.c.is_nan)
                         .where(table.c.key == key, table.c.run_uuid.in_(run_ids[start:start + 500]))
                         .order_by(table.c.run_uuid, table.c.timestamp, table.c.step, table.c.value))
                for run_id, step, value, is_nan in session.execute(query):
                    found[run_id].append((step, math.nan if is_nan else value))
        return found


def probe(client: MlflowClient) -> FastPath | None:
    """The fast path into the client's store, where it is a SQL store (SQLite by default) whose every internal
    used here is present and answers as expected; None for any other store (a tracking server) or on any failure."""
    try:
        from mlflow.store.tracking.dbmodels.models import SqlMetric, SqlParam, SqlRun, SqlTag
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        store = client._tracking_client.store
        if not isinstance(store, SqlAlchemyStore):
            return None
        fast = FastPath(store, (SqlMetric, SqlRun, SqlTag, SqlParam))
        if store.sanitize_metric_value(math.nan) != (True, 0) or store.sanitize_metric_value(-math.inf)[1] >= 0:
            return None
        inspect.signature(store._get_run).bind(run_uuid="", session=None)
        inspect.signature(store._check_run_is_active).bind(None)
        SqlMetric(**dict.fromkeys(COLUMNS))
        # A run's, tag's and param's rows hold exactly what `create_runs` writes: a column of a newer MLflow would
        # be left empty
        if (set(SqlRun.__table__.c.keys()) != set(RUN_COLUMNS)
                or any(set(model.__table__.c.keys()) != {"run_uuid", "key", "value"} for model in (SqlTag, SqlParam))):
            return None
        table = SqlMetric.__table__
        with store.ManagedSessionMaker() as session:  # the tables as the models describe them, read; no run's values
            session.execute(sqlalchemy.select(*(table.c[name] for name in COLUMNS)).where(sqlalchemy.false()))
            session.execute(sqlalchemy.select(*(SqlRun.__table__.c[name] for name in RUN_COLUMNS))
                            .where(sqlalchemy.false()))
            for model in (SqlTag, SqlParam):
                session.execute(sqlalchemy.select(*(model.__table__.c[name] for name in ("run_uuid", "key", "value")))
                                .where(sqlalchemy.false()))
            store._update_latest_metrics_if_necessary([], session)
        return fast
    except Exception:  # whatever broke, MLflow's public API still works
        return None

