"""`fedbench sweep` on a real local Ray instance with a real MLflow SQLite store: grid expansion, one
parent and one nested run per (config, seed), curves equal to `fedbench run`, resume by skipping,
divergence, packing, and refusal of resources the cluster does not have."""
from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from cli import app
from sweeps.cluster import ClusterError, slots
from sweeps.packing import plan_packs
from sweeps.recipe import load
from sweeps.sweep import sweep

GRID = """\
name: grid
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation: {rounds: 30, clients_per_round: 4, local_steps: 3, batch_size: 5}
algorithms:
  fedmid: {client_lr: [1e-2, 3e-2]}
  fedda: {client_lr: [1e-3, 1e-2]}
  fedavg: {client_lr: [1e-3, 1e-2]}
seeds: [3, 4]
eval_every: 5
"""


def write(tmp_path, text, name="recipe.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def runs_of(uri, name, role=None):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    return [run for run in runs if role is None or run.data.tags.get("role") == role]


def histories(uri, run):
    client = MlflowClient(uri)
    return {key: [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key),
                                                     key=lambda m: m.step)]
            for key in run.data.metrics if key not in ("train_seconds", "eval_seconds", "wall_seconds")}


def test_grid_expands_into_trials_with_stable_config_hashes(tmp_path):
    recipe = load(write(tmp_path, GRID))
    trials = recipe.trials()
    assert len(trials) == 12
    assert [t.algorithm for t in trials[::4]] == ["fedmid", "fedda", "fedavg"]
    hashes = {(t.config_hash, t.seed) for t in trials}
    assert len(hashes) == 12 and len({t.config_hash for t in trials}) == 6
    again = load(write(tmp_path, GRID.replace("seeds: [3, 4]", "seeds: [4, 3]"), "again.yaml")).trials()
    assert {(t.config_hash, t.seed) for t in again} == hashes  # the hash is of content, not of position
    params = trials[0].params()
    assert params["algorithm.client_lr"] == 1e-2 and params["federation.rounds"] == 30 and params["seed"] == 3


@pytest.mark.ray
def test_sweep_logs_a_parent_and_a_nested_run_per_config_and_seed_equal_to_fedbench_run(
        ray_local, tmp_path, tracking_uri):
    path = write(tmp_path, GRID)
    result = CliRunner().invoke(app, ["sweep", str(path), "--tracking-uri", tracking_uri])
    assert result.exit_code == 0, result.output
    assert "12" in result.output

    parents = runs_of(tracking_uri, "grid", "sweep")
    nested = runs_of(tracking_uri, "grid", "trial")
    assert len(parents) == 1 and len(nested) == 12
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["recipe_hash"]
    assert parent.data.tags["git_commit"] and parent.data.tags["host"]
    artifacts = {a.path for a in MlflowClient(tracking_uri).list_artifacts(parent.info.run_id)}
    assert artifacts == {"recipe.yaml", "recipe.resolved.yaml", "report"}  # the report, written at the end
    assert {run.data.tags["mlflow.parentRunId"] for run in nested} == {parent.info.run_id}
    assert {(run.data.tags["algorithm"], run.data.params["algorithm.client_lr"], run.data.tags["seed"])
            for run in nested} == {(a, lr, s) for a, lrs in (("fedmid", ("0.01", "0.03")), ("fedda", ("0.001", "0.01")),
                                                              ("fedavg", ("0.001", "0.01")))
                                   for lr in lrs for s in ("3", "4")}
    assert all(run.info.status == "FINISHED" and run.data.tags["status"] == "finished" for run in nested)

    declared = {m.name for m in load(path).trials()[0].metrics()}
    for run in nested:
        curves = histories(tracking_uri, run)
        assert [step for step, _ in curves["objective"]] == [0, 5, 10, 15, 20, 25, 30]
        assert set(curves) == declared  # every metric of the lasso row, as the problem declares them

    # one run per algorithm, same config and seed, through `fedbench run`
    for algorithm, lr, seed in (("fedmid", 3e-2, 4), ("fedda", 1e-3, 3), ("fedavg", 1e-2, 4)):
        out = tmp_path / f"{algorithm}.json"
        single = CliRunner().invoke(app, ["run", str(path), "-a", algorithm, "--seed", str(seed),
                                          "--set", f"algorithm.client_lr={lr}", "--json", str(out), "--no-track"])
        assert single.exit_code == 0, single.output
        rows = json.loads(out.read_text())
        match = [run for run in nested if run.data.tags["algorithm"] == algorithm and
                 float(run.data.params["algorithm.client_lr"]) == lr and run.data.tags["seed"] == str(seed)]
        curves = histories(tracking_uri, match[0])
        for key, curve in curves.items():
            assert curve == [(row["round"], row[key]) for row in rows], key

    again = CliRunner().invoke(app, ["sweep", str(path), "--tracking-uri", tracking_uri])
    assert again.exit_code == 0, again.output
    assert len(runs_of(tracking_uri, "grid", "trial")) == 12 and len(runs_of(tracking_uri, "grid", "sweep")) == 1
    parent = runs_of(tracking_uri, "grid", "sweep")[0]
    assert parent.data.tags["attempts"] == "2" and parent.data.tags["runs_skipped"] == "12"


@pytest.mark.ray
def test_a_diverging_run_is_recorded_and_the_sweep_goes_on(ray_local, tmp_path, tracking_uri):
    text = GRID.replace("fedmid: {client_lr: [1e-2, 3e-2]}", "fedmid: {client_lr: [1e-2, 50.0]}")
    summary = sweep(load(write(tmp_path, text)), tracking=tracking_uri)
    assert summary.counts == {"finished": 10, "diverged": 2, "failed": 0} and summary.ok
    nested = runs_of(tracking_uri, "grid", "trial")
    diverged = [run for run in nested if run.data.tags["status"] == "diverged"]
    assert {run.data.params["algorithm.client_lr"] for run in diverged} == {"50.0"}
    for run in diverged:
        assert run.info.status == "FINISHED"  # ran to its (early) end; the tag says how
        steps = [step for step, _ in histories(tracking_uri, run)["objective"]]
        assert steps[0] == 0 and steps[-1] < 30  # the partial curve is kept, up to the divergence


@pytest.mark.ray
def test_divergence_factor_is_settable_from_the_recipe(ray_local, tmp_path, tracking_uri):
    """fedavg with a large step raises the objective without overflowing: a factor of 1.5 stops it."""
    text = GRID.split("algorithms:")[0] + "algorithms:\n  fedavg: {client_lr: 0.3}\nseeds: 1\ndivergence_factor: 1.5\n"
    summary = sweep(load(write(tmp_path, text)), tracking=tracking_uri)
    run = runs_of(tracking_uri, "grid", "trial")[0]
    curve = [value for _, value in histories(tracking_uri, run)["objective"]]
    assert summary.counts["diverged"] == 1 and run.data.tags["status"] == "diverged"
    assert all(v == v and abs(v) < float("inf") for v in curve) and curve[-1] > 1.5 * curve[0]


@pytest.mark.ray
def test_gpu_request_on_a_cluster_without_gpus_is_refused_up_front(ray_local, tmp_path, tracking_uri):
    path = write(tmp_path, GRID + "resources: {gpus_per_trial: 0.5}\n")
    result = CliRunner().invoke(app, ["sweep", str(path), "--tracking-uri", tracking_uri])
    assert result.exit_code == 2, result.output
    assert "0.5 GPU per trial" in result.output and "Traceback" not in result.output
    assert runs_of(tracking_uri, "grid", "trial") == []


@pytest.mark.ray
def test_several_recipes_run_in_one_command_each_with_its_experiment(ray_local, tmp_path, tracking_uri):
    """`fedbench sweep A.yaml B.yaml`: each recipe its experiment and report; a recipe the cluster cannot run, or a
    malformed one, anywhere in the list is refused before the first runs (exit 2, nothing tracked)."""
    first = write(tmp_path, GRID.replace("seeds: [3, 4]", "seeds: [3]"), "first.yaml")
    second = write(tmp_path, GRID.replace("name: grid", "name: second").replace("seeds: [3, 4]", "seeds: [4]")
                   .replace("  fedda: {client_lr: [1e-3, 1e-2]}\n", ""), "second.yaml")
    gpus = write(tmp_path, GRID.replace("name: grid", "name: gpus") + "resources: {gpus_per_trial: 0.5}\n", "gpus.yaml")
    malformed = write(tmp_path, GRID.replace("rounds: 30", "rounds: many"), "malformed.yaml")
    for bad, says in ((gpus, "0.5 GPU per trial"), (malformed, "federation.rounds")):
        refused = CliRunner().invoke(app, ["sweep", str(first), str(bad), "--tracking-uri", tracking_uri])
        assert refused.exit_code == 2 and says in refused.output and "Traceback" not in refused.output
        assert MlflowClient(tracking_uri).get_experiment_by_name("grid") is None  # the first did not run either
    result = CliRunner().invoke(app, ["sweep", str(first), str(second), "--tracking-uri", tracking_uri,
                                      "--set", "federation.rounds=10"])
    assert result.exit_code == 0, result.output
    assert len(runs_of(tracking_uri, "grid", "trial")) == 6 and len(runs_of(tracking_uri, "second", "trial")) == 4
    assert all(run.data.params["federation.rounds"] == "10" for run in runs_of(tracking_uri, "second", "trial"))
    assert (tmp_path / "reports" / "grid").is_dir() and (tmp_path / "reports" / "second").is_dir()
    assert result.output.count("browse the runs:") == 2


def test_slots_and_packs():
    recipe_resources = type("R", (), {"cpus_per_trial": 1.0, "gpus_per_trial": 0.5})
    assert slots(recipe_resources, [{"CPU": 8, "GPU": 2}], None) == 4
    assert slots(recipe_resources, [{"CPU": 8, "GPU": 2}, {"CPU": 1, "GPU": 1}], 3) == 3
    with pytest.raises(ClusterError, match="no node"):
        slots(recipe_resources, [{"CPU": 8}], None)
    runs = [(i, type("T", (), {"algorithm": "a" if i < 10 else "b"})) for i in range(14)]
    packs = plan_packs(runs, "auto", 2)  # 14 runs, 2 slots: packs of 2, never mixing algorithms
    assert [len(p) for p in packs] == [2, 2, 2, 2, 2, 2, 2]
    assert all(len({t.algorithm for unit in p for _, t in unit}) == 1 for p in packs)
    assert all(len(unit) == 1 for p in packs for unit in p)  # batch_runs = 1: every run alone
    assert [len(p) for p in plan_packs(runs, 5, 2)] == [5, 5, 4]


def test_a_trial_reports_from_its_own_thread_in_order_merging_queued_rows():
    """`Reporter`: the caller never waits for the driver; events reach `report` in the order sent, the rows events
    queued while the driver was busy arrive as one (every row once, in order), and `close` waits for the last."""
    import threading
    import time

    from sweeps.events import Reporter

    driver_free, reported = threading.Event(), []

    def report(event):  # a driver that takes the first event only when told to
        driver_free.wait()
        reported.append(event)

    send = Reporter(report)
    start = time.perf_counter()
    send({"event": "start", "key": 0})
    for r in range(5):
        send({"event": "rows", "key": None, "runs": {0: ([{"round": r}], [0.1 * r])}})
    send({"event": "end", "key": 0})
    assert time.perf_counter() - start < 0.5 and not reported  # nothing waited for the driver
    driver_free.set()
    send.close()
    assert [event["event"] for event in reported] == ["start", "rows", "end"]
    rows, seconds = reported[1]["runs"][0]
    assert rows == [{"round": r} for r in range(5)] and seconds == [0.1 * r for r in range(5)]


def test_what_reporting_raised_is_raised_by_the_next_event_and_by_close():
    from sweeps.events import Reporter

    def report(event):
        raise ConnectionError("the driver went away")

    send = Reporter(report)
    send({"event": "start", "key": 0})
    send.thread.join(timeout=10)  # the sender stops at the error
    with pytest.raises(ConnectionError, match="went away"):  # the trial's next event stops it
        send({"event": "end", "key": 0})
    with pytest.raises(ConnectionError, match="went away"):
        send.close()


def test_a_scored_stream_sends_its_rows_at_each_rung_stamped_with_round_and_score():
    """A tune trial's stream (`RowStream` with a `Score`): every event carries the round and score its scheduler reads,
    the rows go as soon as one reaches a rung (ASHA decides there as if every row were reported), the rest with the
    end; the `Reporter` does not merge such events."""
    import math

    from sweeps.events import Reporter, RowStream, Score

    sent = []
    stream = RowStream(sent.append, ["k"], Score("loss", "min"), report_rounds=[10.0, 30.0])
    stream.start("k", {}, "cpu")
    losses = {0: 1.0, 5: 0.5, 10: 0.7, 15: 0.2, 20: math.nan, 25: 0.3, 30: 0.25, 35: 0.1}
    for r, loss in losses.items():
        stream.add(0, {"round": float(r), "loss": loss}, 0.1 * r)
    stream.end(0, {"status": "finished"})
    assert [event["event"] for event in sent] == ["start", "rows", "rows", "end"]
    assert [(event["round"], event["score"]) for event in sent] == [(0.0, math.inf), (10.0, 0.5), (30.0, 0.2),
                                                                    (35.0, 0.1)]
    assert [row["round"] for row in sent[1]["runs"]["k"][0]] == [0, 5, 10]
    assert [row["round"] for row in sent[3]["outcome"]["rows"]] == [35]

    import threading

    driver_free, reported = threading.Event(), []

    def report(event):  # a driver busy until every event is queued
        driver_free.wait()
        reported.append(event)

    send = Reporter(report)
    for event in sent:
        send(event)
    driver_free.set()
    send.close()
    assert [(event["event"], event["round"]) for event in reported] == [("start", 0.0), ("rows", 10.0),
                                                                        ("rows", 30.0), ("end", 35.0)]


@pytest.mark.ray
def test_sweep_a_runs_only_the_algorithms_named(ray_local, tmp_path, tracking_uri):
    """Issue 59 item 10: `sweep` had no -a. `sweep -a fedda -a fedavg` runs their configurations alone, as a part of
    the recipe's sweep (its experiment and parent): the whole sweep after it runs only fedmid's."""
    path = write(tmp_path, GRID.replace("rounds: 30", "rounds: 5").replace("seeds: [3, 4]", "seeds: [3]"))
    result = CliRunner().invoke(app, ["sweep", str(path), "-a", "fedda", "-a", "fedavg", "--no-report",
                                      "--tracking-uri", tracking_uri])
    assert result.exit_code == 0, result.output
    assert sorted(run.data.tags["algorithm"] for run in runs_of(tracking_uri, "grid", "trial")) == ["fedavg"] * 2 + [
        "fedda"] * 2
    whole = sweep(load(path), tracking=tracking_uri)
    assert (whole.total, whole.skipped, whole.counts["finished"]) == (6, 4, 2)
    assert len(runs_of(tracking_uri, "grid", "sweep")) == 1
