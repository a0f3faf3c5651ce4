"""The tracking store's fast write and read of a curve (`Store.log_metrics`, `Store.metric_histories`) store and read
what MLflow's `log_batch` and `get_metric_history` do; the runs view an experiment is tagged with."""
import json
import math

import pytest
import sqlalchemy
from mlflow.entities import Metric

from sweeps.store import VIEW, VIEW_KEY, Store


def comparable(value: float) -> float | str:
    return "nan" if math.isnan(value) else value  # NaN != NaN


def stored(store: Store, run_id: str) -> tuple[dict, dict]:
    """The run's every stored value by key (step, timestamp, value) and its latest values."""
    run = store.client.get_run(run_id)
    history = {key: sorted((m.step, m.timestamp, comparable(m.value))
                           for m in store.client.get_metric_history(run_id, key)) for key in run.data.metrics}
    return history, {key: comparable(value) for key, value in run.data.metrics.items()}


def test_curve_inserted_in_one_statement_equals_log_batch(tmp_path, monkeypatch):
    store = Store(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = store.experiment("curves")
    values = [0.5, -2.0, math.nan, math.inf, -math.inf, 1e-300, 3.0]
    # 2500 values (more than one log_batch), a NaN and infinities, a value repeated exactly (stored once), a key
    # whose last step is not its last in the list and two values at one step (the latest: by timestamp, then value)
    metrics = [Metric(key, values[(step + k) % len(values)] + step, 1000 + step, step)
               for step in range(500) for k, key in enumerate(["objective", "accuracy", "gap", "norm"])]
    metrics += [Metric("objective", 7.0, 1000, 3)] * 2 + [Metric("late", 2.0, 5, 9), Metric("late", 1.0, 4, 10),
                                                          Metric("late", 4.0, 6, 9), Metric("tie", 1.0, 7, 2),
                                                          Metric("tie", 3.0, 7, 2)]
    fast, beside = (store.client.create_run(experiment).info.run_id for _ in range(2))
    beside_metrics = metrics[::-7]  # a second run in the same write, its values in another order
    with monkeypatch.context() as patched:  # the statement of its own, not log_batch
        patched.setattr(store.client, "log_batch", lambda *args, **kwargs: pytest.fail("log_batch called"))
        store.log_metrics({fast: metrics, beside: beside_metrics})
    reference, beside_reference = (store.client.create_run(experiment).info.run_id for _ in range(2))
    for start in range(0, len(metrics), 1000):
        store.client.log_batch(reference, metrics=metrics[start:start + 1000])
    store.client.log_batch(beside_reference, metrics=beside_metrics)
    history, latest = stored(store, fast)
    assert (history, latest) == stored(store, reference)
    assert stored(store, beside) == stored(store, beside_reference) != (history, latest)
    assert len(history["objective"]) == 501 and latest["late"] == 1.0 and latest["tie"] == 3.0
    assert {"nan", 1.7976931348623157e308, -1.7976931348623157e308} <= {v for _, _, v in history["gap"]}
    for key in history:  # the read of several runs in one query gives what get_metric_history gives, in its order
        read = store.metric_histories([fast, reference, "no-such-run"], key)
        assert read["no-such-run"] == []
        for run_id in (fast, reference):
            assert ([(step, comparable(value)) for step, value in read[run_id]]
                    == [(m.step, comparable(m.value)) for m in store.client.get_metric_history(run_id, key)])
    # a second curve onto the same run updates the latest values as log_batch does
    more = [Metric("objective", -1.0, 2000, 600), Metric("accuracy", 9.0, 1, 0)]
    store.log_metrics({fast: more})
    store.client.log_batch(reference, metrics=more)
    assert stored(store, fast) == stored(store, reference)


def test_a_finished_run_refuses_a_curve(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = store.client.create_run(store.experiment("curves")).info.run_id
    store.client.set_terminated(run_id, "FINISHED")
    store.client.delete_run(run_id)
    with pytest.raises(Exception, match="active"):
        store.log_metrics({run_id: [Metric("objective", 1.0, 0, 0)]})


def test_a_statement_the_database_refuses_falls_back_to_log_batch(tmp_path, monkeypatch):
    """Where the SQL store refuses the insert and the query (here: the table of another MLflow's schema), the
    transaction is rolled back and `log_batch` stores the curve, which `get_metric_history` reads back. (A refusal
    that is not the database's, an inactive run, still raises: the test above.)"""
    from mlflow.store.tracking.dbmodels.models import SqlMetric

    store = Store(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = store.client.create_run(store.experiment("curves")).info.run_id
    elsewhere = sqlalchemy.Table("metrics_of_another_schema", sqlalchemy.MetaData(),
                                 *[sqlalchemy.Column(c.name, c.type) for c in SqlMetric.__table__.columns])
    monkeypatch.setattr(store.fast, "metric_model", type("SqlMetric", (), {"__table__": elsewhere}))
    store.log_metrics({run_id: [Metric("objective", 1.0, 5, 0), Metric("objective", 0.5, 6, 1)]})
    assert store.metric_histories([run_id], "objective")[run_id] == [(0, 1.0), (1, 0.5)]  # read back the same way
    assert store.client.get_run(run_id).data.metrics == {"objective": 0.5}
    monkeypatch.undo()
    assert store.metric_histories([run_id], "objective")[run_id] == [(0, 1.0), (1, 0.5)]


def test_an_mlflow_without_an_internal_of_the_fast_path_gets_the_public_api(tracking_uri, monkeypatch):
    """An MLflow that renamed an internal the fast path uses (here its metric model) is found out when a store
    opens, and that store goes through `log_batch` and `get_metric_history`, to the same stored values."""
    import mlflow.store.tracking.dbmodels.models

    metrics = [Metric("objective", 1.0 / (1 + step), 1000 + step, step) for step in range(1500)]
    metrics += [Metric("gap", math.nan, 5, 0), Metric("gap", math.inf, 6, 1), Metric("gap", 0.5, 7, 1)]
    fast_store = Store(tracking_uri)
    experiment = fast_store.experiment("curves")
    monkeypatch.delattr(mlflow.store.tracking.dbmodels.models, "SqlMetric")
    store = Store(tracking_uri)
    assert fast_store.fast is not None and store.fast is None
    public, fast = (store.client.create_run(experiment).info.run_id for _ in range(2))
    store.log_metrics({public: metrics})
    read = store.metric_histories([public], "objective")[public]
    fast_store.log_metrics({fast: metrics})
    assert stored(store, public) == stored(fast_store, fast)
    assert read == fast_store.metric_histories([fast], "objective")[fast] == [(m.step, m.value) for m in metrics[:1500]]


def test_the_headline_charts_come_first_and_stay_when_the_experiment_is_tagged_again(tracking_uri):
    """`experiment(name, headline)` (a sweep, a tuning session, `fedbench run`) tags the runs view with a chart of
    each headline metric first, in order; `experiment(name)` (`fedbench ui`) keeps them, also where the
    view tag was rewritten without them (an older fedbench); an experiment never given any gets the plain view."""
    store = Store(tracking_uri)
    key = f"mlflow.sharedViewState.{VIEW_KEY}"

    def charts(experiment: str) -> list[str]:
        view = json.loads(store.client.get_experiment(experiment).tags[key])
        return [chart["metricKey"] for chart in view.get("compareRunCharts", [])]

    experiment = store.experiment("curves", headline=["objective_gap", "f1"])
    assert charts(experiment) == ["objective_gap", "f1"]
    assert store.experiment("curves") == experiment and charts(experiment) == ["objective_gap", "f1"]
    store.client.set_experiment_tag(experiment, key, json.dumps(VIEW))
    store.experiment("curves")
    assert charts(experiment) == ["objective_gap", "f1"]
    assert store.experiment("curves", headline=["f1"]) == experiment and charts(experiment) == ["f1"]
    plain = store.experiment("plain")
    assert json.loads(store.client.get_experiment(plain).tags[key]) == VIEW


def test_runs_started_and_ended_many_to_a_transaction_equal_mlflows_own_calls(tmp_path, tracking_uri, monkeypatch):
    """`Store.start_trials` / `finish_trials` write several runs in one transaction each (`mlflow_fast.create_runs`,
    `end_runs`): what MLflow then reads of each run (its info but for ids and paths, params, tags, metrics and their
    histories) equals what `create_run`, `log_batch` and `set_terminated` store for the same run."""
    from dataclasses import asdict

    from sweeps.driving import Outcome
    from sweeps.recipe import load
    from sweeps.writer import ended_run, new_run

    path = tmp_path / "r.yaml"
    path.write_text("name: many\nproblem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10}\n"
                    "federation: {rounds: 20, clients_per_round: 4}\nalgorithms: {fedavg: {client_lr: [0.01, 0.02]}}\n"
                    "seeds: 2\neval_every: 10\n")
    trials = load(path).trials()
    fast_store = Store(tracking_uri)
    experiment = fast_store.experiment("many")
    starts = [(trial, new_run(trial, "parent", 1000.0 + i, {"node": "n"}, "trial")) for i, trial in enumerate(trials)]
    outcomes = [asdict(Outcome([{"round": r, "objective": 1.0 / (1 + r + i)} for r in (0, 10, 20)],
                               "failed" if i == 3 else "finished", "cpu", seconds=[0.1, 0.2, 0.3 + i],
                               wall_seconds=1.0 + i, error="Traceback ...\nValueError: no" if i == 3 else None,
                               end_time=2000.0 + i)) for i in range(len(trials))]
    with monkeypatch.context() as patched:  # one transaction each, not MLflow's calls per run
        for name in ("create_run", "log_batch", "set_terminated"):
            patched.setattr(fast_store.client, name, lambda *args, name=name, **kwargs: pytest.fail(f"{name} called"))
        fast = fast_store.start_trials(experiment, starts)
        fast_store.finish_trials([ended_run(run_id, outcome) for run_id, outcome in zip(fast, outcomes)])
    monkeypatch.setattr(fast_store, "fast", None)  # MLflow's public API, run by run
    public = fast_store.start_trials(experiment, starts)
    fast_store.finish_trials([ended_run(run_id, outcome) for run_id, outcome in zip(public, outcomes)])

    def seen(run_id: str) -> tuple:
        run = fast_store.client.get_run(run_id)
        info = {k: v for k, v in vars(run.info).items() if k not in ("_run_id", "_run_uuid", "_artifact_uri")}
        history = stored(fast_store, run_id)[0]
        return info, run.data.params, run.data.tags, run.data.metrics, {k: [(s, v) for s, _, v in h]
                                                                          for k, h in history.items()}

    for mine, theirs in zip(fast, public):
        assert seen(mine) == seen(theirs)
        assert fast_store.client.get_run(mine).info.artifact_uri.endswith(f"{mine}/artifacts")
    assert fast_store.client.get_run(fast[3]).info.status == "FAILED"


# -- a PostgreSQL store named postgresql:// (issue 59 item 7) --------------------------------------------------

@pytest.mark.parametrize("present, uri", [
    ({"psycopg", "psycopg2"}, "postgresql://u:p@db:5432/mlflow"),  # SQLAlchemy's default driver is there
    ({"psycopg2"}, "postgresql+psycopg2://u:p@db:5432/mlflow"),
    ({"psycopg"}, "postgresql://u:p@db:5432/mlflow")])
def test_a_postgresql_uri_names_a_driver_that_is_installed(present, uri):
    from sweeps.database import with_driver

    assert with_driver("postgresql://u:p@db:5432/mlflow", present.__contains__) == uri
    for other in ("sqlite:///mlflow.db", "http://host:5000", "postgresql+psycopg2://u@db/m", "mysql://u@db/m"):
        assert with_driver(other, present.__contains__) == other


def test_a_postgresql_uri_without_any_driver_is_refused_in_one_line_with_the_fix():
    from sweeps.database import StoreError, with_driver

    with pytest.raises(StoreError) as refused:
        with_driver("postgresql://u:secret@db/mlflow", lambda module: False)
    message = str(refused.value)
    assert "\n" not in message and "pip install psycopg2-binary" in message and "secret" not in message


def test_a_postgresql_uri_opens_the_store_with_psycopg2_and_says_so(postgres, tmp_path):
    """`postgresql://` failed at the first query (`No module named 'psycopg'`: SQLAlchemy 2.1's default driver, not
    installed); it now opens the store through psycopg2, and the command line says so, without the URI."""
    from typer.testing import CliRunner

    from cli import app
    from servers import migrated_template

    database = postgres.create_database("driverless", template=migrated_template(postgres, tmp_path / "template"))
    uri = database.replace("postgresql+psycopg2://", "postgresql://")
    store = Store(uri)
    experiment = store.client.get_experiment(store.experiment("through-psycopg2"))
    assert experiment.name == "through-psycopg2" and store.uri.startswith("postgresql+psycopg2://")
    shown = CliRunner().invoke(app, ["show", "no-such-run", "--tracking-uri", uri])
    assert shown.exit_code == 2 and shown.output.splitlines()[0] == (
        "postgresql:// stands for SQLAlchemy's default driver, psycopg 3, which is not installed: using psycopg2 "
        "(postgresql+psycopg2://) instead"), shown.output
    assert "no run 'no-such-run'" in shown.output
