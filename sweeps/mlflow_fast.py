"""Writes and reads of curves straight into MLflow's SQL store: the only module that uses MLflow's private API.

MLflow's SQL store makes one ORM object per value in `log_batch` (~70 µs each: 0.5 s for a curve of 1000 rounds ×
7 keys, 75 CPU-s of the driver in a sweep of 150 such runs) and reads a run's metric by its key alone (the
table's index starts with the key). Here a curve goes in with one executemany, sanitised as MLflow does (NaN
stored as 0 with is_nan, ±inf as ±the largest float), after which MLflow's own routine updates the run's latest
values (~6× faster); and the curves of many runs come out in one query per 500 runs.

This leans on internals that any MLflow release may rename: the client's store, the store's session maker,
`_get_run`, `_check_run_is_active`, `_update_latest_metrics_if_necessary`, `sanitize_metric_value` and the
`SqlMetric` model. `probe` tries every one of them once, when a `Store` opens; if anything is missing or
behaves otherwise, it answers None and the store goes through MLflow's public API for good.
"""
from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING

import sqlalchemy

if TYPE_CHECKING:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

COLUMNS = ("run_uuid", "key", "value", "timestamp", "step", "is_nan")  # of MLflow's metrics table, as written


class FastPath:
    """A SQL store behind an MLflow client, written and read directly."""

    def __init__(self, store, metric_model):
        self.store, self.metric_model = store, metric_model
        read_only = "read_only" in inspect.signature(store.ManagedSessionMaker).parameters
        self.writing = {"read_only": False} if read_only else {}  # MLflow ≥ 3.1x: sessions read-only unless told

    def insert_metrics(self, by_run: dict[str, list[Metric]]) -> None:
        """Each run's metrics as `log_batch` stores them: one executemany for all runs and MLflow's update of each
        run's latest values, in one transaction (rolled back whole if the database refuses a statement)."""
        store, rows, latest = self.store, {}, {}
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
        with store.ManagedSessionMaker(**self.writing) as session:
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
        table, found = self.metric_model.__table__, {run_id: [] for run_id in run_ids}
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
        from mlflow.store.tracking.dbmodels.models import SqlMetric
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        store = client._tracking_client.store
        if not isinstance(store, SqlAlchemyStore):
            return None
        fast = FastPath(store, SqlMetric)
        if store.sanitize_metric_value(math.nan) != (True, 0) or store.sanitize_metric_value(-math.inf)[1] >= 0:
            return None
        inspect.signature(store._get_run).bind(run_uuid="", session=None)
        inspect.signature(store._check_run_is_active).bind(None)
        SqlMetric(**dict.fromkeys(COLUMNS))
        table = SqlMetric.__table__
        with store.ManagedSessionMaker() as session:  # the table as the model describes it, read; no run's values
            session.execute(sqlalchemy.select(*(table.c[name] for name in COLUMNS)).where(sqlalchemy.false()))
            store._update_latest_metrics_if_necessary([], session)
        return fast
    except Exception:  # whatever broke, MLflow's public API still works
        return None

