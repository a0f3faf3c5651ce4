"""`fedbench report` on a real small sweep (local Ray, MLflow SQLite): the PNGs are images, the table's
numbers are those of the MLflow metric histories, a diverged run shows with its status, the pages tie the
files together and the files are on the parent run; then the other sources (a parent run id, an experiment,
a tuning session) and the refusals."""
from __future__ import annotations

import csv
import math
import shutil

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from helpers import invoke
from sweeps.recipe import load
from sweeps.report import Histories, curve, resolve_settings, rounds_to
from sweeps.store import Store

# fedmid at client_lr 0.07 diverges on seed 0 (round 10) and finishes on seeds 1 and 2.
RECIPE = """\
name: report-grid
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation: {rounds: 30, clients_per_round: 4, local_steps: 3, batch_size: 5}
algorithms:
  fedmid: {client_lr: [1e-2, 0.07]}
  fedda: {client_lr: [1e-3, 1e-2]}
seeds: [0, 1, 2]
eval_every: 5
report:
  metrics: [objective_gap, l2_error, f1]
  target: {l2_error: 2.0}
  labels: {fedmid: FedMiD}
"""
TUNE = """\
name: report-tune
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation: {rounds: 20, clients_per_round: 4, local_steps: 3, batch_size: 5}
algorithms:
  fedmid: {}
seeds: [0]
eval_every: 5
tune: {space: {client_lr: {log_uniform: [1.0e-3, 1.0e-1]}}, metric: l2_error, mode: min, trials: 4}
report: {curves: 2}
"""


@pytest.fixture(scope="module")
def swept(ray_local, tmp_path_factory, _migrated_store):
    """One sweep for the module; `fedbench sweep` writes the report beside the store at its end."""
    folder = tmp_path_factory.mktemp("report")
    shutil.copy(_migrated_store, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    path = folder / "recipe.yaml"
    path.write_text(RECIPE)
    result = invoke("sweep", path, "--tracking-uri", uri)
    assert result.exit_code == 0, result.output
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("report-grid")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    return {"uri": uri, "path": path, "out": folder / "reports" / "report-grid", "output": result.output,
            "parent": next(r for r in runs if r.data.tags["role"] == "sweep"),
            "trials": [r for r in runs if r.data.tags["role"] == "trial"], "client": client}


def history(client, run, metric):
    points = sorted(client.get_metric_history(run.info.run_id, metric), key=lambda m: m.step)
    return [(m.step, m.value) for m in points if math.isfinite(m.value)]


def read_table(path):
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.ray
def test_every_png_is_an_image_of_a_sensible_size(swept):
    out = swept["out"]
    assert "report:" in swept["output"] and "index.html" in swept["output"]
    pngs = sorted(out.glob("*.png"))
    metrics = {"objective", "objective_gap", "train_mse", "l2_error", "l1_error", "precision", "recall", "f1",
               "density", "support_accuracy"}
    assert {p.name for p in pngs} == {"figure.png", *(f"metric_{m}.png" for m in metrics)}
    for png in pngs:
        with Image.open(png) as image:
            image.verify()
        with Image.open(png) as image:
            width, height = image.size
            assert 600 <= width <= 2500 and 400 <= height <= 2000, (png.name, image.size)
            assert len(np.unique(np.asarray(image.convert("L")))) > 20  # drawn, not blank
        assert png.stat().st_size < 400_000


@pytest.mark.ray
def test_table_means_and_stds_equal_the_mlflow_histories(swept):
    client, trials = swept["client"], swept["trials"]
    rows = read_table(swept["out"] / "table.csv")
    assert len(rows) == 4 and len(trials) == 12
    for row in rows:
        runs = [r for r in trials if r.data.tags["config_hash"] == row["config_hash"]]
        assert len(runs) == int(row["runs"]) == 3
        for metric in ("objective_gap", "l2_error", "f1"):  # the selection metric, then the figure's
            finals = [history(client, run, metric)[-1][1] for run in runs]
            assert float(row[f"{metric}_mean"]) == pytest.approx(np.mean(finals), rel=1e-12)
            assert float(row[f"{metric}_std"]) == pytest.approx(np.std(finals, ddof=1), rel=1e-12)
        reached = []
        for run in runs:
            points = history(client, run, "l2_error")
            assert points[0][1] > 2.0  # from above: the first round at or below the target
            reached += [step for step, value in points if value <= 2.0][:1]
        assert row["rounds_to_l2_error_reached"] == f"{len(reached)}/3"
        if reached:
            assert float(row["rounds_to_l2_error_mean"]) == pytest.approx(np.mean(reached))
    assert {row["best"] for row in rows} == {"True", "False"}
    assert sum(row["best"] == "True" for row in rows) == 2  # one per algorithm


@pytest.mark.ray
def test_a_diverged_run_appears_with_its_status(swept):
    diverged = [r for r in swept["trials"] if r.data.tags["status"] == "diverged"]
    assert [(r.data.params["algorithm.client_lr"], r.data.tags["seed"]) for r in diverged] == [("0.07", "0")]
    rows = read_table(swept["out"] / "table.csv")
    (row,) = [r for r in rows if r["config_hash"] == diverged[0].data.tags["config_hash"]]
    assert row["status"] == "2 finished, 1 diverged" and row["best"] == "False"
    assert row["configuration"] == "client_lr=0.07"
    markdown = (swept["out"] / "report.md").read_text()
    assert "| FedMiD | client_lr=0.07 | 3 | 2 finished, 1 diverged |" in markdown


@pytest.mark.ray
def test_a_diverged_seed_ends_its_curve_and_the_band_covers_the_seeds_left(swept):
    store = Store(swept["uri"])
    recipe = load(swept["path"])
    runs = [r for r in swept["trials"] if r.data.params["algorithm.client_lr"] == "0.07"]
    line = curve(runs, "l2_error", Histories(store), "rounds")
    ended = [r for r in runs if r.data.tags["status"] == "diverged"][0]
    last_step, last_value = history(swept["client"], ended, "l2_error")[-1]
    assert line.ends == [(last_step, last_value)]
    going_on = [r for r in runs if r is not ended]
    after = [dict(history(swept["client"], r, "l2_error"))[30] for r in going_on]
    assert line.x[-1] == 30 and line.mean[-1] == pytest.approx(np.mean(after))
    assert line.se[-1] == pytest.approx(np.std(after, ddof=1) / math.sqrt(2))
    comm = curve(runs, "l2_error", Histories(store), "comm")
    floats = [dict(history(swept["client"], r, "comm_up"))[30] + dict(history(swept["client"], r, "comm_down"))[30]
              for r in going_on]
    assert comm.x[-1] == pytest.approx(np.mean(floats)) and np.all(np.diff(comm.x) > 0)
    assert recipe.report.target == {"l2_error": 2.0}


@pytest.mark.ray
def test_pages_reference_every_png_and_the_files_are_on_the_parent_run(swept):
    out = swept["out"]
    pngs = {p.name for p in out.glob("*.png")}
    for page in ("report.md", "index.html"):
        text = (out / page).read_text()
        assert all(name in text for name in pngs), page
    assert "<table>" in (out / "index.html").read_text()
    client, parent = swept["client"], swept["parent"]
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    expected = {f"report/{name}" for name in (*pngs, "table.csv", "report.md", "index.html")}
    assert logged == expected


@pytest.mark.ray
def test_a_parent_run_an_experiment_and_a_recipe_give_the_same_table(swept, tmp_path):
    uri, parent = swept["uri"], swept["parent"].info.run_id
    tables = []
    for i, source in enumerate((["--run", parent], ["--experiment", "report-grid"], [swept["path"]])):
        out = tmp_path / str(i)
        result = invoke("report", *source, "--out", out, "--x", "comm", "--tracking-uri", uri)
        assert result.exit_code == 0, result.output
        assert "FedMiD" in result.output and (out / "figure.png").exists()
        tables.append(read_table(out / "table.csv"))
    assert tables[0] == tables[1] == tables[2]


@pytest.mark.ray
def test_training_seconds_are_a_history_and_an_axis(swept):
    """Each run records its training seconds at every evaluated round (nondecreasing, ending at its total), and
    `x: seconds` draws the curves over them."""
    client = swept["client"]
    for run in swept["trials"]:
        seconds = history(client, run, "train_seconds")
        assert [step for step, _ in seconds] == [step for step, _ in history(client, run, "objective")]
        values = [value for _, value in seconds]
        assert values[0] == 0 and np.all(np.diff(values) >= 0) and values[-1] == run.data.metrics["train_seconds"]
    runs = [r for r in swept["trials"] if r.data.params["algorithm.client_lr"] == "0.01"
            and r.data.tags["algorithm"] == "fedda"]
    line = curve(runs, "l2_error", Histories(Store(swept["uri"])), "seconds")
    at_end = [history(client, run, "train_seconds")[-1][1] for run in runs]
    assert line.x[-1] == pytest.approx(np.mean(at_end)) and np.all(np.diff(line.x) >= 0)


@pytest.mark.ray
def test_confidence_intervals_and_a_second_axis_from_the_report_block(swept, tmp_path):
    """`interval: ci95` puts mean ± 1.96 s.e. in the tables (Per-FedAvg's Table 1); `x: [rounds, seconds]` draws
    the figure again over training seconds (its Fig. 1(a)). The report block does not change which sweep it is."""
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE.replace("  labels: {fedmid: FedMiD}", "  labels: {fedmid: FedMiD}\n  interval: ci95\n"
                                   "  x: [rounds, seconds]"))
    out = tmp_path / "out"
    result = invoke("report", path, "--out", out, "--tracking-uri", swept["uri"])
    assert result.exit_code == 0, result.output
    assert (out / "figure.png").exists() and (out / "figure_seconds.png").exists()
    markdown = (out / "report.md").read_text()
    assert "![figure](figure_seconds.png)" in markdown and ": final (± 95% CI)" in markdown
    assert "95% confidence interval" in markdown
    runs = [r for r in swept["trials"] if r.data.tags["algorithm"] == "fedda"
            and r.data.params["algorithm.client_lr"] == "0.001"]
    finals = [history(swept["client"], run, "l2_error")[-1][1] for run in runs]
    (row,) = [r for r in read_table(out / "table.csv") if r["config_hash"] == runs[0].data.tags["config_hash"]]
    assert float(row["l2_error_ci95"]) == pytest.approx(1.96 * np.std(finals, ddof=1) / math.sqrt(3), rel=1e-12)
    assert f"{np.mean(finals):.4g} ± {1.96 * np.std(finals, ddof=1) / math.sqrt(3):.2g}" in markdown


@pytest.mark.ray
def test_a_tuning_session_is_reported_with_its_best_configurations(ray_local, tmp_path, tracking_uri):
    path = tmp_path / "tune.yaml"
    path.write_text(TUNE)
    assert invoke("tune", path, "--tracking-uri", tracking_uri).exit_code == 0
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("report-tune")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.role = 'tune'")
    result = invoke("report", "--run", parent.info.run_id, "--tracking-uri", tracking_uri)
    assert result.exit_code == 0, result.output
    rows = read_table(tmp_path / "reports" / "report-tune" / "table.csv")
    assert len(rows) == 4 and all(row["configuration"].startswith("client_lr=") for row in rows)
    finished = [row for row in rows if row["status"] == "1 finished"]
    best = min(finished, key=lambda row: float(row["l2_error_mean"]))  # the tune block's metric and mode
    assert best["best"] == "True" and sum(row["best"] == "True" for row in rows) == 1
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"report"}


def test_without_a_report_block_the_defaults_make_a_report():
    settings = resolve_settings(None, ["comm_up", "f1", "l2_error", "objective", "objective_gap", "rank"], None)
    assert (settings.select.metric, settings.select.mode) == ("objective_gap", "min")
    assert settings.metrics == ["objective_gap", "f1", "l2_error", "objective"] and settings.x == "rounds"


def test_rounds_to_target_from_either_side():
    steps = np.array([0.0, 5.0, 10.0, 15.0])
    assert rounds_to(steps, np.array([9.0, 4.0, 1.5, 0.5]), 2.0) == 10.0
    assert rounds_to(steps, np.array([0.6, 0.8, 0.95, 1.0]), 0.9) == 10.0
    assert rounds_to(steps, np.array([9.0, 8.0, 7.0, 6.0]), 2.0) is None


@pytest.mark.ray
def test_sweep_with_no_report_writes_none(ray_local, tmp_path, tracking_uri):
    path = tmp_path / "one.yaml"
    path.write_text(RECIPE.replace("fedmid: {client_lr: [1e-2, 0.07]}", "fedmid: {client_lr: 1e-2}")
                    .replace("  fedda: {client_lr: [1e-3, 1e-2]}\n", "").replace("seeds: [0, 1, 2]", "seeds: 1"))
    result = invoke("sweep", path, "--tracking-uri", tracking_uri, "--no-report")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "reports").exists() and "report:" not in result.output


@pytest.mark.parametrize("args, fragment", [
    ([], "give exactly one of RECIPE, --experiment NAME or --run"),
    (["--experiment", "a", "--run", "b"], "found --experiment, --run"),
    (["--experiment", "nowhere"], "no experiment 'nowhere'"),
    (["--run", "0123456789abcdef"], "no run '0123456789abcdef'"),
    (["--experiment", "report-grid", "--x", "time"], "'time' is not one of"),
])
@pytest.mark.ray
def test_report_refusals(swept, args, fragment):
    result = invoke("report", *args, "--tracking-uri", swept["uri"])
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output


@pytest.mark.ray
def test_report_refuses_a_trial_run_a_recipe_never_swept_and_a_misspelt_metric(swept, tmp_path):
    uri = swept["uri"]
    trial = swept["trials"][0].info.run_id
    result = invoke("report", "--run", trial, "--tracking-uri", uri)
    assert result.exit_code == 2 and "not a sweep or tuning session" in result.output

    unswept = tmp_path / "new.yaml"
    unswept.write_text(RECIPE.replace("name: report-grid", "name: never-swept"))
    result = invoke("report", unswept, "--tracking-uri", uri)
    assert result.exit_code == 2 and "no experiment 'never-swept'" in result.output
    assert "fedbench sweep" in result.output

    changed = tmp_path / "changed.yaml"
    changed.write_text(RECIPE.replace("seeds: [0, 1, 2]", "seeds: [7]"))
    result = invoke("report", changed, "--tracking-uri", uri)
    assert result.exit_code == 2 and "no run with a curve" in result.output
    parent = swept["parent"].info.run_id  # the other sweep of the experiment, and the command that reports it
    assert f"the newest is run {parent} (fedbench report --run {parent})" in result.output

    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text(RECIPE.replace("metrics: [objective_gap, l2_error, f1]", "metrics: [objective_gap, l2_eror]"))
    for command in ("report", "sweep"):  # a sweep refuses it before running anything
        result = invoke(command, misspelt, "--tracking-uri", uri)
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert f"{misspelt}: report.metrics[1]: found 'l2_eror'" in result.output
        assert "did you mean 'l2_error'" in result.output
    assert len(MlflowClient(uri).search_runs([swept["parent"].info.experiment_id], max_results=1000)) == 13


@pytest.mark.ray
def test_a_report_without_the_sweeps_overrides_reports_that_sweep(swept, tmp_path):
    """Issue 47 item 4: after `sweep R --set federation.rounds=10`, `report R` found no run ("runs: none") and said
    nothing of the --set. It now reports that sweep and says so; a report given other --set is told the sweep's
    overrides and the command."""
    path = tmp_path / "rounds.yaml"
    path.write_text(RECIPE.replace("name: report-grid", "name: report-rounds").replace("seeds: [0, 1, 2]", "seeds: [0]")
                    .replace("  fedda: {client_lr: [1e-3, 1e-2]}\n", ""))
    uri = swept["uri"]
    assert invoke("sweep", path, "--set", "federation.rounds=10", "--no-report", "--tracking-uri", uri).exit_code == 0
    result = invoke("report", path, "--tracking-uri", uri, "--out", tmp_path / "plain")
    assert result.exit_code == 0, result.output
    assert (f"reporting the runs of {path} swept with --set federation.rounds=10 (its newest sweep"
            in " ".join(result.output.split())), result.output
    assert (tmp_path / "plain" / "index.html").is_file()
    other = invoke("report", path, "--set", "federation.rounds=20", "--tracking-uri", uri)
    assert other.exit_code == 2 and "Traceback" not in other.output, other.output
    assert (f"the store holds a sweep of this recipe made with --set federation.rounds=10: give report the same "
            f"(fedbench report {path} --set federation.rounds=10)") in " ".join(other.output.split()), other.output
    again = invoke("report", path, "--set", "federation.rounds=10", "--tracking-uri", uri, "--out", tmp_path / "out")
    assert again.exit_code == 0, again.output
    for out in ("plain", "out"):  # issue 59 item 10: the figure says the --set of the sweep it draws
        assert Image.open(tmp_path / out / "figure.png").text["Title"] == "report-rounds (--set federation.rounds=10)"


def test_a_method_without_personal_models_is_drawn_with_its_global_metric(tmp_path, tracking_uri):
    """A non-personalized method's personal model is its global model (the pFedFBE paper, §4.1), so a `personal_X` panel
    shows its `X` (real runs through `fedbench run`, read back from MLflow)."""
    path = tmp_path / "personal.yaml"
    path.write_text("name: personal-panels\n"
                    "problem: {name: lasso, clients: 6, samples_per_client: 20, dim: 12, support: 3, personal_support: 1}\n"
                    "federation: {rounds: 4, clients_per_round: 3, local_steps: 2, batch_size: 5}\n"
                    "algorithms: {fedmid: {client_lr: 0.01}, ditto: {client_lr: 0.01}}\n"
                    "eval_every: 2\nreport: {metrics: [personal_f1, f1]}\n")
    for algorithm in ("fedmid", "ditto"):
        assert invoke("run", path, "-a", algorithm, "--tracking-uri", tracking_uri).exit_code == 0
    client = MlflowClient(tracking_uri)
    runs = {r.data.tags["algorithm"]: r for r in client.search_runs(
        [client.get_experiment_by_name("personal-panels").experiment_id])}
    histories = Histories(Store(tracking_uri))
    steps, stand_in = histories(runs["fedmid"], "personal_f1")
    assert list(steps) == [0, 2, 4] and np.array_equal(stand_in, histories(runs["fedmid"], "f1")[1])
    own = [m.value for m in sorted(client.get_metric_history(runs["ditto"].info.run_id, "personal_f1"),
                                   key=lambda m: m.step)]
    assert list(histories(runs["ditto"], "personal_f1")[1]) == own
    settings = resolve_settings(load(path), sorted(set(runs["ditto"].data.metrics)), None)
    assert settings.label("personal_f1") == "personalized support recovery F1 score"
    assert settings.declared["personal_f1"].direction == "max" and settings.select.metric == "objective_gap"


def test_configurations_are_named_as_the_declarations_say():
    """A method's title and a choice's display names come with their declarations (Per-FedAvg's variant hf reads
    `Per-FedAvg (HF)` in a legend), under the recipe's own labels; other varying values read name=value."""
    from sweeps.recipe import SelectSpec
    from sweeps.report.settings import Settings
    from sweeps.report.statistics import shown_value

    settings = Settings([], SelectSpec(metric="accuracy", mode="max"), {}, "rounds", {}, {"fedavg": "FedAvg + update"},
                        1, {})
    assert settings.label("per_fedavg") == "Per-FedAvg"
    assert settings.label("fedavg") == "FedAvg + update" and settings.label("fedmid") == "FedMiD"
    assert settings.label("not_installed") == "not_installed"
    assert [shown_value("per_fedavg", "algorithm.variant", v) for v in ("hf", "fo", "exact")] == ["HF", "FO",
                                                                                                  "exact HVP"]
    assert shown_value("per_fedavg", "algorithm.alpha", "0.0010000") == "alpha=0.001"
    assert shown_value("not_installed", "algorithm.variant", "hf") == "variant=hf"


def test_a_field_some_configurations_leave_out_varies_too():
    """A configuration without adversaries (or an uplink chain) records no such field: it still varies against those
    that have one, whichever configuration ranks first, and reads `none`."""
    from types import SimpleNamespace

    import numpy as np

    from sweeps.recipe import SelectSpec
    from sweeps.report.settings import Settings
    from sweeps.report.statistics import configurations

    def run(config_hash, params, loss):
        return SimpleNamespace(data=SimpleNamespace(tags={"algorithm": "fedavg", "config_hash": config_hash, "seed": "0",
                                                          "status": "finished"}, params=params, metrics={}), loss=loss)

    attacked = {"federation.aggregation": "median", "federation.adversaries": "sign_flip(fraction=0.2, scale=10.0)"}
    runs = [run("a", {"federation.aggregation": "median"}, 1.0), run("b", attacked, 2.0)]
    settings = Settings([], SelectSpec(metric="loss", mode="min"), {}, "rounds", {}, {}, 1, {})
    configs = configurations(runs, ["fedavg"], settings, lambda r, metric: (np.array([0, 1]), np.array([3.0, r.loss])))
    assert [c.varying for c in configs] == ["federation.adversaries=none",
                                            "federation.adversaries=sign_flip(fraction=0.2, scale=10.0)"]


def test_a_final_mean_leaves_failed_runs_out_and_says_how_many():
    """Issue 47 item 2: the mean of a configuration's final values is over its runs that did not fail."""
    from types import SimpleNamespace

    from sweeps.report.render import final_text
    from sweeps.report.statistics import Configuration

    def run(status):
        return SimpleNamespace(data=SimpleNamespace(tags={"status": status}))

    partly = Configuration("fedmid", "h", [run("finished"), run("failed"), run("diverged")], {},
                           finals={"loss": [1.0, 3.0]})
    assert partly.counted == partly.runs[::2] and final_text(partly, "loss") == "2 ± 1.4 (1 failed run left out)"
    wholly = Configuration("fedmid", "h", [run("failed"), run("failed")], {}, finals={"loss": []})
    assert final_text(wholly, "loss") == "– (all 2 runs failed)"


def test_one_algorithm_drawn_has_a_color_per_configuration_several_a_color_each():
    """Seven chains of one method are told apart by color; where several methods are drawn, the color is the method's
    and the line style tells its configurations apart, every one of up to seven in a style of its own."""
    from sweeps.report import curve_colors
    from sweeps.report.render import STYLES, legend_handles
    from sweeps.report.statistics import Configuration

    def configs(algorithm, count):
        return [Configuration(algorithm, f"{algorithm}{i}", [], {}, rank=i, name=f"{algorithm} {i}") for i in
                range(count)]

    alone = configs("fedmid", 7)
    assert [curve_colors(alone)[c.algorithm, c.config_hash] for c in alone] == [f"C{i}" for i in range(7)]
    both = configs("fedavg", 7) + alone
    colors = curve_colors(both)
    assert [colors[c.algorithm, c.config_hash] for c in both] == ["C0"] * 7 + ["C1"] * 7
    assert len(set(map(str, STYLES))) == 7  # a configuration's style is STYLES[its rank]
    assert [h.get_color() for h in legend_handles(both, colors)] == ["C0"] * 7 + ["C1"] * 7


def test_one_runs_final_value_is_shown_alone_not_plus_or_minus_zero():
    """Issue 59 item 10: a one-seed summary read "0.5 ± 0", a spread of none where one run has no spread; it reads
    the value with n = 1, in the final values and the seconds per 1000 rounds alike (two runs keep their ± sd)."""
    from types import SimpleNamespace

    from sweeps.recipe import SelectSpec
    from sweeps.report.render import final_text, table
    from sweeps.report.settings import Settings
    from sweeps.report.statistics import Configuration
    from sweeps.tuning import describe

    finished = SimpleNamespace(data=SimpleNamespace(tags={"status": "finished"}))
    alone = Configuration("fedmid", "h", [finished], {}, finals={"loss": [0.5]}, seconds=[12.0])
    assert final_text(alone, "loss") == final_text(alone, "loss", "ci95") == "0.5 (n = 1)"
    settings = Settings([], SelectSpec(metric="loss", mode="min"), {}, "rounds", {}, {}, 1, {})
    assert table([alone], settings)[1][0][4:] == ["12 (n = 1)", "0.5 (n = 1)"]
    pair = Configuration("fedmid", "h", [finished, finished], {}, finals={"loss": [0.5, 1.5]})
    assert final_text(pair, "loss") == "1 ± 0.71"
    assert describe([0.25]) == "0.25 (n = 1)" and describe([1.0, 3.0]) == "2 ± 1.4"


def test_uniform_participation_is_labelled_uniform():
    """A run drawn uniformly records no participation field (its config hash is as before the field existed, so
    stores made before read the same): against a cyclic configuration it read `participation=none`; it reads
    `participation=uniform`, from the same stored params."""
    from types import SimpleNamespace

    import numpy as np

    from sweeps.recipe import SelectSpec
    from sweeps.report.settings import Settings
    from sweeps.report.statistics import configurations

    def run(config_hash, params, loss):
        return SimpleNamespace(data=SimpleNamespace(tags={"algorithm": "fedavg", "config_hash": config_hash, "seed": "0",
                                                          "status": "finished"}, params=params, metrics={}), loss=loss)

    runs = [run("a", {"federation.rounds": "30"}, 2.0),
            run("b", {"federation.rounds": "30", "federation.participation": "cyclic(groups=4)"}, 1.0)]
    settings = Settings([], SelectSpec(metric="loss", mode="min"), {}, "rounds", {}, {}, 1, {})
    configs = configurations(runs, ["fedavg"], settings, lambda r, metric: (np.array([0, 1]), np.array([3.0, r.loss])))
    assert [c.varying for c in configs] == ["federation.participation=cyclic(groups=4)",
                                            "federation.participation=uniform"]


def test_a_reports_figures_say_the_set_options_that_made_its_runs(tmp_path, tracking_uri):
    """Issue 59 item 10: the figure of a sweep shortened by --set was titled as the recipe's own. Its titles (the
    drawn one and the PNG's Title) and the page say the --set options: here of `fedbench run`'s runs (tag
    `overrides`), reported as their experiment; a run made without --set has none."""
    path = tmp_path / "shortened.yaml"
    path.write_text(RECIPE.replace("name: report-grid", "name: report-set"))
    made = invoke("run", path, "-a", "fedmid", "--set", "federation.rounds=10", "--set", "algorithm.client_lr=0.01",
                  "--tracking-uri", tracking_uri)
    assert made.exit_code == 0, made.output
    result = invoke("report", "--experiment", "report-set", "--tracking-uri", tracking_uri, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    title = "report-set (--set federation.rounds=10 --set algorithm.client_lr=0.01)"
    assert Image.open(tmp_path / "out" / "figure.png").text["Title"] == title
    assert Image.open(tmp_path / "out" / "metric_l2_error.png").text["Title"].startswith(f"{title}: ")
    assert f"# Report: {title}" in (tmp_path / "out" / "report.md").read_text()

    plain = tmp_path / "plain.yaml"
    plain.write_text(RECIPE.replace("name: report-grid", "name: report-plain").replace("[1e-2, 0.07]", "1e-2")
                     .replace("rounds: 30", "rounds: 10"))
    assert invoke("run", plain, "-a", "fedmid", "--tracking-uri", tracking_uri).exit_code == 0
    assert invoke("report", "--experiment", "report-plain", "--tracking-uri", tracking_uri,
                  "--out", tmp_path / "plain").exit_code == 0
    assert Image.open(tmp_path / "plain" / "figure.png").text["Title"] == "report-plain"
