"""`fedbench run / validate / list` end to end, and refusal of malformed recipes (exit 2, one line)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fedbench
from cli import app
from helpers import invoke
from sweeps import catalogue

SMALL = """\
name: small-lasso
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation: {rounds: 12, clients_per_round: 4, local_steps: 3, batch_size: 5}
algorithms:
  fedmid: {client_lr: 1e-2, server_lr: 1.0}
  fedda: {client_lr: [1e-3, 1e-2]}
seeds: [7, 8]
eval_every: 5
"""


@pytest.fixture
def recipe(tmp_path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return path


def test_run_writes_rows_equal_to_the_engine(recipe, tmp_path):
    out = tmp_path / "rows.json"
    result = invoke("run", recipe, "--algorithm", "fedmid", "--json", out, "--no-track")
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["round"] for r in rows] == [0, 5, 10, 12]
    assert "objective_gap" in result.output and "finished" in result.output

    problem = fedbench.make_problem("lasso", seed=7, clients=8, samples_per_client=20, dim=30, support=10, lam=0.05)
    direct = fedbench.run("fedmid", problem, rounds=12, clients_per_round=4, local_steps=3, batch_size=5,
                          eval_every=5, client_lr=1e-2)
    assert rows == direct.rows


def test_set_overrides_and_seed(recipe, tmp_path):
    out = tmp_path / "rows.json"
    result = invoke("run", recipe, "-a", "fedda", "--seed", "3", "--set", "algorithm.client_lr=1e-3",
                    "--set", "federation.rounds=4", "--set", "eval_every=2", "--json", out, "--no-track")
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["round"] for r in rows] == [0, 2, 4]
    problem = fedbench.make_problem("lasso", seed=3, clients=8, samples_per_client=20, dim=30, support=10, lam=0.05)
    direct = fedbench.run("fedda", problem, rounds=4, clients_per_round=4, local_steps=3, batch_size=5,
                          eval_every=2, client_lr=1e-3)
    assert rows == direct.rows


def test_run_over_several_seeds_gives_each_seed_its_run(recipe, tmp_path, tracking_uri):
    """The Lasso's data follow the seed: the seeds run one after another, each equal to its run alone."""
    from mlflow.tracking import MlflowClient

    out = tmp_path / "rows.json"
    result = invoke("run", recipe, "-a", "fedmid", "--seed", 3, "--seed", 5, "--json", out,
                    "--tracking-uri", tracking_uri)
    assert result.exit_code == 0, result.output
    assert "seeds 3, 5 one after another" in result.output
    rows = json.loads(out.read_text())
    for seed in (3, 5):
        problem = fedbench.make_problem("lasso", seed=seed, clients=8, samples_per_client=20, dim=30, support=10,
                                        lam=0.05)
        direct = fedbench.run("fedmid", problem, rounds=12, clients_per_round=4, local_steps=3, batch_size=5,
                              eval_every=5, client_lr=1e-2)
        assert rows[str(seed)] == direct.rows
    runs = MlflowClient(tracking_uri).search_runs(
        [MlflowClient(tracking_uri).get_experiment_by_name("small-lasso").experiment_id])
    assert sorted(run.data.tags["seed"] for run in runs) == ["3", "5"]


def test_run_over_several_seeds_as_one_program(tmp_path):
    """Seeds sharing their data (S1 of Hanzely, Zhao, Kolar) run as one batched program; each seed's rows are its
    run alone (within 1e-12 relative, tests/engine/test_runs.py)."""
    recipe = tmp_path / "s1.yaml"
    recipe.write_text("name: s1-short\nproblem: {name: pfl_synthetic, preset: s1, sigma_h: 1.0}\n"
                      "federation: {rounds: 6, clients_per_round: 0, local_steps: 1, batch_size: 1}\n"
                      "algorithms: {ascd_pfl: {}}\nseeds: 6\neval_every: 2\n")
    out = tmp_path / "rows.json"
    result = invoke("run", recipe, "--all-seeds", "--json", out, "--no-track")
    assert result.exit_code == 0, result.output
    assert "seeds 0 … 5 (6) as one program" in result.output and "(6 finished)" in result.output
    assert all(head in result.output for head in ("mean", "std", "min", "max"))  # many seeds: their statistics
    few = invoke("run", recipe, "--seed", 0, "--seed", 1, "--no-track")
    assert "seeds 0, 1 as one program" in few.output and "seed 1" in few.output and "mean" not in few.output
    rows = json.loads(out.read_text())
    problem = fedbench.make_problem("pfl_synthetic", preset="s1", sigma_h=1.0)
    for seed in (0, 1, 2):
        alone = fedbench.run("ascd_pfl", problem, rounds=6, clients_per_round=0, local_steps=1, batch_size=1,
                             eval_every=2, seed=seed).rows
        assert [r["round"] for r in rows[str(seed)]] == [r["round"] for r in alone] == [0, 2, 4, 6]
        for got, want in zip(rows[str(seed)], alone):
            assert got.keys() == want.keys()
            assert all(abs(got[k] - want[k]) <= 1e-12 * abs(want[k]) for k in want)
    assert invoke("run", recipe, "--all-seeds", "--seed", 1, "--no-track").exit_code == 2


def test_run_logs_its_trial_to_mlflow(recipe, tmp_path, tracking_uri):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "rows.json"
    result = invoke("run", recipe, "-a", "fedda", "--set", "algorithm.client_lr=1e-2", "--json", out,
                    "--tracking-uri", tracking_uri)
    assert result.exit_code == 0, result.output
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("small-lasso")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["role"] == "run" and "mlflow.parentRunId" not in run.data.tags
    assert run.data.tags["algorithm"] == "fedda" and run.data.tags["seed"] == "7" and run.data.tags["status"] == "finished"
    assert run.data.params["algorithm.client_lr"] == "0.01" and run.data.params["federation.rounds"] == "12"
    rows = json.loads(out.read_text())
    history = client.get_metric_history(run.info.run_id, "objective_gap")
    assert [(m.step, m.value) for m in history] == [(row["round"], row["objective_gap"]) for row in rows]


def test_ui_prints_its_pages_once_served_and_leaves_nothing_beside_the_store(recipe, tmp_path, free_tcp_port):
    """Issue 47 item 6: `ui` printed the runs' page ~28 s before the server answered, left `mlflow-ui.log` and
    `mlflow.db.lock` in the researcher's folder, and nothing said why MLflow counts one run more than the sweep ran
    (its parent). The page is printed once the server answers (fetched at once, here), with the runs it lists and
    the parents it leaves out; the folder holds what `fedbench run` made, nothing more. Issue 59: a line at once says
    that the server is starting and where its log is (nothing was printed for the 25-64 s of its start)."""
    import urllib.request

    folder = tmp_path / "work"
    folder.mkdir()
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    assert invoke("run", recipe, "-a", "fedmid", "--tracking-uri", uri).exit_code == 0  # makes the store
    from sweeps.recipe import load
    from sweeps.store import Store

    store = Store(uri)  # a parent, as a sweep opens one: MLflow counts it among the experiment's runs
    store.open_parent(store.experiment("small-lasso"), load(recipe), [], "sweep small-lasso", {"role": "sweep"})
    made = sorted(path.name for path in folder.iterdir())
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parents[2] / "cli.py"), "ui",
                             "--tracking-uri", uri, "--port", str(free_tcp_port)], cwd=folder,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = []
        while not (lines and lines[-1].startswith("runs:")):
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        assert lines[0].startswith(f"starting the MLflow UI server on 127.0.0.1:{free_tcp_port} (its log: "), lines
        with urllib.request.urlopen(f"http://127.0.0.1:{free_tcp_port}/health", timeout=5) as response:
            assert response.status == 200  # at once: the page printed is served
        lines += [proc.stdout.readline(), proc.stdout.readline()]
        assert lines[-2].startswith("charts:") and lines[-1].startswith(
            "experiment 'small-lasso': 1 run listed, and 1 parent run (a sweep or tuning session, tag role) that group "
            "them, which the page filters out and MLflow's own counts include"), lines
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stdout.read()
    assert sorted(path.name for path in folder.iterdir()) == made and "mlflow.db.lock" not in made, made


def test_ui_notes_ctrl_c_and_sigterm_instead_of_raising_them():
    """`fedbench ui` served on after 4 SIGTERMs of 26 here: the SystemExit its handler raised was lost in a SQLAlchemy
    weakref callback, and a blocking waitpid is not woken by a signal another thread takes. Its handlers now note
    the signal for its waits to see, and give the handlers before back when it ends."""
    from sweeps.ui import noted_stops

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with noted_stops() as stopped_by:
        signal.raise_signal(signal.SIGTERM)  # its handler has run when this returns
        signal.raise_signal(signal.SIGINT)  # a KeyboardInterrupt here would fail the test
        assert stopped_by == [signal.SIGTERM, signal.SIGINT]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_ui_without_a_store_says_so(tmp_path):
    result = invoke("ui", "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}")
    assert result.exit_code == 2 and "no MLflow store" in result.output


def test_validate_and_list(recipe):
    result = invoke("validate", recipe)
    assert result.exit_code == 0 and "3 configurations × 2 seeds" in result.output
    listing = invoke("list", "problems", "algorithms")
    assert listing.exit_code == 0
    for name in ("lasso", "lowrank", "fedavg", "fedmid", "fedda", "server_threshold", "offset", "client_lr"):
        assert name in listing.output


BAD = {
    "unknown problem": ("problem: {name: laso}", "problem.name", "did you mean 'lasso'"),
    "unknown algorithm": ("algorithms: {fedmd: {client_lr: 0.1}}", "algorithms.fedmd", "did you mean 'fedmid'"),
    "misspelt hyperparameter": ("algorithms: {fedmid: {server_treshold: bao}}",
                                "algorithms.fedmid.server_treshold", "did you mean 'server_threshold'"),
    "negative lr in grid": ("algorithms: {fedmid: {client_lr: [0.1, 0.01, -1]}}", "algorithms.fedmid.client_lr[2]",
                            "found -1"),
    "wrong type": ("algorithms: {fedmid: {client_lr: fast}}", "algorithms.fedmid.client_lr", "found 'fast'"),
    "bad choice": ("algorithms: {fedda: {offset: middle}}", "algorithms.fedda.offset", "bao | yuan"),
    "empty grid": ("algorithms: {fedmid: {client_lr: []}}", "algorithms.fedmid.client_lr", "empty list"),
    "negative rounds": ("federation: {rounds: -5, clients_per_round: 4, local_steps: 3, batch_size: 5}",
                        "federation.rounds", "found -5"),
    "too many clients per round": ("federation: {rounds: 5, clients_per_round: 40, local_steps: 3, batch_size: 5}",
                                   "federation.clients_per_round", "at most the problem's 8 clients"),
    "batch larger than client": ("federation: {rounds: 5, clients_per_round: 4, local_steps: 3, batch_size: 50}",
                                 "federation.batch_size", "at most problem.samples_per_client = 20"),
    "iterations and rounds": ("federation: {rounds: 5, iterations: 30, clients_per_round: 4, local_steps: 3, "
                              "batch_size: 5}", "federation.iterations", "expected one of rounds and iterations"),
    "iterations not a multiple of K": ("federation: {iterations: 10, clients_per_round: 4, local_steps: 3, batch_size: 5}",
                                       "federation.iterations", "expected a multiple of local_steps"),
    "per-algorithm problem not a mapping": ("algorithms: {fedmid: {client_lr: 0.1, problem: 3}}",
                                            "algorithms.fedmid.problem", "expected a mapping"),
    "per-algorithm federation misspelt": ("algorithms: {fedmid: {federation: {local_stesp: 2}}}",
                                          "algorithms.fedmid.federation.local_stesp", "did you mean 'local_steps'"),
    "per-algorithm clients per round": ("algorithms: {fedmid: {federation: {clients_per_round: 9}}}",
                                        "algorithms.fedmid.federation.clients_per_round",
                                        "at most the problem's 8 clients"),
    "unknown top-level field": ("seedz: 3", "seedz", "did you mean 'seeds'"),
    "bad seeds": ("seeds: 0", "seeds", "found 0"),
    "python tag": ("name: !!python/object/apply:os.system ['echo hacked']", "", "!!python tag is refused"),
    "bad problem param": ("problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, ar_rho: 2.0}",
                          "problem.ar_rho", "found 2.0"),
    "empty name": ('name: ""', "name", "expected a non-empty string"),
    "federation not a mapping": ("federation: [1, 2]", "federation", "expected a mapping"),
    "no algorithms": ("algorithms: {}", "algorithms", "at least one"),
    "eval_every zero": ("eval_every: 0", "eval_every", "greater than or equal to 1"),
    "eval_every as a string": ('eval_every: "5"', "eval_every", "found '5', expected an integer"),
    "unknown device": ("device: tpu", "device", "found 'tpu'"),
    "unknown compile mode": ("compile: fast", "compile", "found 'fast', expected auto, on or off"),
    "negative cpus": ("resources: {cpus_per_trial: -1}", "resources.cpus_per_trial", "found -1"),
    "gpu fraction above one": ("resources: {gpus_per_trial: 1.5}", "resources.gpus_per_trial", "whole number"),
    "misspelt resources field": ("resources: {cpu_per_trial: 1}", "resources.cpu_per_trial",
                                 "did you mean 'cpus_per_trial'"),
    "zero pack": ("resources: {pack: 0}", "resources.pack", "found 0"),
    "tune mode": ("tune: {space: {client_lr: {log_uniform: [1e-4, 1e-1]}}, metric: objective, mode: up}",
                  "tune.mode", "found 'up'"),
    "tune empty space": ("tune: {space: {}, metric: objective}", "tune.space", "at least one"),
    "divergence factor below one": ("divergence_factor: 0.5", "divergence_factor", "found 0.5"),
    "repeated seeds": ("seeds: [1, 1]", "seeds", "repeated"),
    "negative seed": ("seeds: [1, -2]", "seeds", "found [1, -2]"),
    "bool local steps": ("federation: {rounds: 5, clients_per_round: 4, local_steps: true, batch_size: 5}",
                         "federation.local_steps", "found True"),
    "zero batch size": ("federation: {rounds: 5, clients_per_round: 4, local_steps: 3, batch_size: 0}",
                        "federation.batch_size", "found 0"),
    "fractional rounds": ("federation: {rounds: 2.5, clients_per_round: 4, local_steps: 3, batch_size: 5}",
                          "federation.rounds", "found 2.5"),
    "bad aggregation": ("federation: {rounds: 5, clients_per_round: 4, local_steps: 3, batch_size: 5, "
                        "aggregation: mean}", "federation.aggregation", "uniform | samples"),
    "misspelt federation field": ("federation: {rounds: 5, clients_per_round: 4, local_step: 3, batch_size: 5}",
                                  "federation.local_step", "did you mean 'local_steps'"),
    "algorithm the problem cannot run": ("algorithms: {fedxl2: {client_lr: 0.1}}", "algorithms.fedxl2",
                                         "fedxl2 requires pair_scores"),
    "tune mode of a metric with no direction": ("tune: {space: {client_lr: {uniform: [0.1, 1]}}, metric: density}",
                                                "tune.mode", "declared with no direction"),
    "problem without a name": ("problem: {clients: 8}", "problem.name", "found None"),
    "string in a grid": ('algorithms: {fedmid: {client_lr: [0.1, "x"]}}', "algorithms.fedmid.client_lr[1]",
                         "found 'x'"),
    "bool flag as a word": ("algorithms: {fedavg: {subgradient: maybe}}", "algorithms.fedavg.subgradient",
                            "expected true or false"),
    "hyperparameters not a mapping": ("algorithms: {fedmid: 0.1}", "algorithms.fedmid", "expected a mapping"),
    "missing federation": ("federation: null", "federation", "found None, expected a mapping"),
    "tune unknown hyperparameter": ("tune: {space: {client_rl: {log_uniform: [1e-4, 1e-1]}}, metric: objective}",
                                    "tune.space.client_rl", "did you mean 'client_lr'"),
    "tune empty range": ("tune: {space: {client_lr: {uniform: [0.1, 0.1]}}, metric: objective}",
                         "tune.space.client_lr.uniform", "empty range"),
    "tune log range from zero": ("tune: {space: {problem.lam: {log_uniform: [0, 1]}}, metric: objective}",
                                 "tune.space.problem.lam.log_uniform", "low > 0"),
    "tune unknown distribution": ("tune: {space: {client_lr: {loguniform: [1e-4, 1]}}, metric: objective}",
                                  "tune.space.client_lr", "log_uniform"),
    "tune bound outside the declared range": ("tune: {space: {server_lr: {uniform: [-1, 1]}}, metric: objective}",
                                              "tune.space.server_lr.uniform[0]", "found -1"),
    "tune int distribution for a float": ("tune: {space: {client_lr: {int: [1, 3]}}, metric: objective}",
                                          "tune.space.client_lr.int", "expected a uniform or log_uniform distribution"),
    "tune algorithm not in the recipe": ("tune: {space: {algorithms.fedavg.client_lr: {uniform: [0.1, 1]}}, "
                                         "metric: objective}", "tune.space.algorithms.fedavg.client_lr",
                                         "no algorithm 'fedavg'"),
    "tune sampler": ("tune: {space: {client_lr: {uniform: [0.1, 1]}}, metric: objective, sampler: bayes}",
                     "tune.sampler", "expected one of tpe, random, cmaes, gp"),
    "misspelt report field": ("report: {metric: [f1]}", "report.metric", "did you mean 'metrics'"),
    "report metrics not a list": ("report: {metrics: f1}", "report.metrics", "found 'f1', expected a list"),
    "report repeated metric": ("report: {metrics: [f1, f1]}", "report.metrics", "distinct metric names"),
    "report x axis": ("report: {x: time}", "report.x", "found 'time', expected one of rounds, comm"),
    "report select mode": ("report: {select: {metric: objective, mode: best}}", "report.select.mode",
                           "expected one of min, max"),
    "report select without a metric": ("report: {select: {mode: max}}", "report.select.metric",
                                       "missing required field"),
    "misspelt report select field": ("report: {select: {metric: f1, mod: max}}", "report.select.mod",
                                     "did you mean 'mode'"),
    "report target not a number": ("report: {target: {l2_error: low}}", "report.target.l2_error",
                                   "found 'low', expected a number"),
    "report log not a flag": ("report: {log: {objective: maybe}}", "report.log.objective",
                              "found 'maybe', expected true or false"),
    "report zero curves": ("report: {curves: 0}", "report.curves", "greater than or equal to 1"),
}
WHOLE_FILE = {
    "bad indentation": ("name: x\n  problem: 1\n", "", "malformed YAML: line 2"),
    "a list at the top": ("- a\n- b\n", "", "expected a mapping at the top level"),
    "missing algorithms": (SMALL.split("algorithms:")[0], "algorithms", "missing required field"),
    "personalized algorithm without personal metrics": ("problem: {name: pauc}\nalgorithms: {ditto: {}}\n",
                                                        "algorithms.ditto", "ditto requires personal_evaluation"),
}


def bad_recipe_text(case: str) -> str:
    if case in WHOLE_FILE:
        return WHOLE_FILE[case][0]
    replacement = BAD[case][0]
    key = replacement.split(":")[0]
    lines = [line for line in SMALL.splitlines() if not line.startswith(key + ":")]
    if key == "algorithms":  # drop the indented algorithm entries too
        lines = [line for line in lines if not line.startswith("  ")]
    return "\n".join(lines + [replacement]) + "\n"


@pytest.mark.parametrize("command", ["validate", "run", "sweep", "tune"])
@pytest.mark.parametrize("case", sorted(BAD) + sorted(WHOLE_FILE))
def test_malformed_recipe_is_refused_with_the_field(case, command, tmp_path):
    _, path, fragment = {**BAD, **WHOLE_FILE}[case]
    file = tmp_path / "bad.yaml"
    file.write_text(bad_recipe_text(case))
    result = invoke(command, file, *(["--no-track"] if command == "run" else []))
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "Traceback" not in message and len(message.splitlines()) == 1, message
    assert str(file) in message and fragment in message, message
    if path:
        assert f": {path}: " in message, message
    assert not (tmp_path / "mlflow.db").exists() and not list(tmp_path.glob("default-mlflow.db"))


def test_tune_refuses_an_unknown_metric_before_starting_ray(recipe, tmp_path):
    recipe.write_text(recipe.read_text() + "tune: {space: {client_lr: {log_uniform: [1e-4, 1]}}, metric: objective_gapp}\n")
    result = invoke("tune", recipe, "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}")
    assert result.exit_code == 2 and "tune.metric" in result.output and "did you mean 'objective_gap'" in result.output


def test_the_corpus_is_large():
    assert len(BAD) + len(WHOLE_FILE) >= 25


def test_malformed_yaml_names_the_line(tmp_path):
    file = tmp_path / "broken.yaml"
    file.write_text("name: x\nproblem: {name: lasso\nfederation: [\n")
    result = invoke("validate", file)
    assert result.exit_code == 2 and "malformed YAML: line" in result.output and "Traceback" not in result.output


def test_console_script_exit_code_and_no_traceback(tmp_path):
    file = tmp_path / "bad.yaml"
    file.write_text(SMALL.replace("name: lasso", "name: lasoo"))
    proc = subprocess.run([sys.executable, "-m", "cli", "run", str(file)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout and "problem.name" in proc.stderr


def test_a_minimal_recipe_validates_and_runs_with_every_default(tmp_path, tracking_uri):
    """problem, federation and algorithms only: the name is the file's, one seed (0), every other field its
    default; the federation may be left out too."""
    from mlflow.tracking import MlflowClient

    path = tmp_path / "minimal.yaml"
    path.write_text("problem: {name: lasso, clients: 12, samples_per_client: 20, dim: 16, support: 4}\n"
                    "federation: {rounds: 3}\nalgorithms: {fedmid: {}}\n")
    result = invoke("validate", path)
    assert result.exit_code == 0 and "1 configurations × 1 seeds" in result.output, result.output
    out = tmp_path / "rows.json"
    result = invoke("run", path, "--json", out, "--tracking-uri", tracking_uri)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["round"] for r in rows] == [0, 3] and rows[-1]["iterations"] == 30  # 10 local steps by default
    experiment = MlflowClient(tracking_uri).get_experiment_by_name("minimal")
    (run,) = MlflowClient(tracking_uri).search_runs([experiment.experiment_id])
    assert run.data.tags["seed"] == "0" and run.data.params["federation.clients_per_round"] == "10"
    path.write_text("problem: {name: lasso}\nalgorithms: {fedavg: null}\n")
    assert invoke("validate", path).exit_code == 0


# -- shipped recipes by name --------------------------------------------------------------------------------

def test_a_shipped_recipe_is_found_by_name_and_a_file_that_exists_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no recipes/ here
    for given in ("papers/bao2022_lasso", "papers/bao2022_lasso.yaml", "recipes/papers/bao2022_lasso.yaml"):
        result = invoke("validate", given)
        said = " ".join(result.output.split())
        assert result.exit_code == 0 and "problem lasso" in said and "5 configurations × 3 seeds" in said, said
    (tmp_path / "papers").mkdir()
    (tmp_path / "papers" / "bao2022_lasso.yaml").write_text(SMALL)  # a file at the path given: it is what runs
    result = invoke("validate", "papers/bao2022_lasso.yaml")
    said = " ".join(result.output.split())
    assert result.exit_code == 0 and "3 configurations × 2 seeds" in said, said


def test_a_name_neither_a_file_nor_shipped_is_refused_with_the_closest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for command in ("validate", "run", "sweep", "tune", "report", "ui"):
        result = CliRunner().invoke(app, [command, "papers/bao2022_laso"], env={"FEDBENCH_VERBOSE": None})
        assert result.exit_code == 2, (command, result.output)
        assert len(result.output.splitlines()) == 1 and "Traceback" not in result.output, result.output
        assert "closest: papers/bao2022_lasso" in result.output and "recipes` lists them" in result.output
    result = invoke("validate", "bao2022_lowrank")
    assert result.exit_code == 2 and "closest: papers/bao2022_lowrank" in result.output, result.output


@pytest.mark.parametrize("columns", ["80", None], ids=["80 columns", "piped"])
def test_recipes_and_list_cut_no_text_at_80_columns_or_piped(columns):
    """Issue 47 item 5: at 80 columns, or piped (which rich takes as 80), the recipe column took 37 columns and the
    paper and what it reproduces were cut to "Fast…", "repro…"; `list` cut long defaults and descriptions alike.
    Each recipe's paper and what it reproduces are now printed whole, and nothing ends in "…". (CliRunner's output
    is a pipe; COLUMNS=80 is a narrow terminal's width.)"""
    from sweeps.shipped import describe, find, names

    env = {"COLUMNS": columns} if columns else {"COLUMNS": None}
    listed = CliRunner().invoke(app, ["recipes"], env=env)
    assert listed.exit_code == 0 and "…" not in listed.output, listed.output
    for name in names():
        about = describe(find(name))
        assert f"paper: {about['paper']}" in listed.output and f"reproduces: {about['reproduces']}" in listed.output
    components = CliRunner().invoke(app, ["list"], env=env)
    assert components.exit_code == 0 and "…" not in components.output, components.output


def test_fedbench_recipes_lists_every_shipped_recipe_with_its_paper_and_runs():
    from sweeps.shipped import describe, find, names, root

    assert root() == Path(__file__).resolve().parents[2] / "recipes"  # a checkout: its own recipes/
    shipped = names()
    assert "papers/bao2022_lasso" in shipped and "lasso" in shipped and len(shipped) >= 30
    for name in shipped:  # the table's columns come from each recipe's first comment lines
        about = describe(find(name))
        assert about.get("paper") and about.get("reproduces"), name
    result = CliRunner().invoke(app, ["recipes"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines() if line.split()}
    assert set(shipped) <= set(rows), result.output
    assert "5 × 3 = 15" in rows["papers/bao2022_lasso"] and "~2 min" in rows["papers/bao2022_lasso"]
    assert "15 × 30 = 450" in rows["papers/hanzely2023_s1"], rows["papers/hanzely2023_s1"]


@pytest.mark.parametrize("page", ["docs/guide/sweeps.md", "docs/how-to/tune-with-optuna.md"])
def test_the_documented_whole_mapping_overrides_validate(page):
    """Issue 47 item 9: a built-in baseline added to a shipped recipe with `--set 'algorithms.X={...}'`, and a tune
    block given to a recipe that has none, worked and were documented nowhere; each such command on these pages
    validates as written."""
    import shlex

    text = (Path(__file__).resolve().parents[2] / page).read_text()
    commands = [line for line in text.splitlines() if "--set '" in line and line.lstrip().startswith(
        (".venv/bin/fedbench ", "fedbench "))]
    assert commands, page
    for command in commands:
        words = shlex.split(command)
        recipe, sets = words[2], [words[i + 1] for i, word in enumerate(words) if word == "--set"]
        result = CliRunner().invoke(app, ["validate", recipe, *[arg for s in sets for arg in ("--set", s)]])
        assert result.exit_code == 0 and ": ok — " in result.output, (command, result.output)


# -- fedbench list and --help at 80 columns (issue 59 item 8) ---------------------------------------------------

EVERY_SECTION = catalogue.SECTIONS  # the registry's top-level axes (privacy, compile) among them


def at_80(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "80", "FEDBENCH_VERBOSE": None})


def words(text: str) -> str:
    return " ".join(text.split())


def test_list_without_a_name_is_an_overview_of_every_entry_by_name():
    from fedbench.algorithms import ALGORITHMS
    from fedbench.axes.transforms import TRANSFORMS
    from fedbench.problems import PROBLEMS

    overview = at_80("list")
    assert overview.exit_code == 0, overview.output
    lines = overview.output.splitlines()
    assert len(lines) < 150 and max(map(len, lines)) <= 80, len(lines)
    starts = {line.split()[0] for line in lines if line.startswith("  ")}
    assert set(PROBLEMS) | set(ALGORITHMS) | set(TRANSFORMS) <= starts
    assert "list NAME...` prints them in full" in words(overview.output)


def test_list_by_section_wraps_at_word_boundaries_and_keeps_every_word_of_every_declaration():
    """Every parameter's meaning comes out whole, its words in order (a table's narrow column split them,
    `heterogenei ty`), square brackets included (Rich markup ate `[p_low, p_high]`), no line over 80 columns."""
    from sweeps.catalogue import entries

    listing = at_80("list", *EVERY_SECTION)
    assert listing.exit_code == 0, listing.output
    assert max(map(len, listing.output.splitlines())) <= 80
    text = words(listing.output)
    for entry in entries():
        assert words(entry.heading) in text, entry.heading
        for p in entry.params:
            assert words(p.help) in text, (entry.path, p.name)
            assert f"{p.name}: {p.kind}" in text, (entry.path, p.name)
    steps = words(at_80("list", "federation.local_steps").output)
    assert "each participant's count drawn every round: uniform, an integer in [low, high]" in steps
    p_low = at_80("list", "federation.participation.p_low")
    assert "p_low: float = None; [0, 1] bernoulli: each client's p_k drawn once per run uniformly in [p_low, " \
           "p_high]" in words(p_low.output)
    assert "p_high:" not in p_low.output and "p_on" not in p_low.output  # the field named, not its neighbours


def test_list_says_which_algorithms_take_uneven_local_work_as_their_dry_rounds_find():
    from fedbench.algorithms import ALGORITHMS
    from fedbench.engine.dry_round import takes_uneven_steps
    from fedbench.hparams import resolve

    overview = at_80("list").output.splitlines()
    marked = {line.split()[0] for line in overview if line.startswith("  ") and line.split()[1:2] == ["*"]}
    taking = {name for name, cls in ALGORITHMS.items() if takes_uneven_steps(cls, resolve(cls.hparams, {}, name))}
    assert marked == taking and {"fedavg", "fedprox", "scaffold"} <= taking and "fedda" not in taking
    fedmid = words(at_80("list", "fedmid").output)
    assert "uneven local work (federation.local_steps as a mapping): taken, but not with server_threshold: " \
           "yuan" in fedmid
    assert "uneven local work (federation.local_steps as a mapping): refused" in words(at_80("list", "fedda").output)


def test_list_of_an_unknown_name_is_refused_in_one_line_with_the_closest():
    refused = at_80("list", "fedavg", "fedavgg")
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
    assert "fedavgg: names no section, component or recipe field" in refused.output and "closest: fedavg" in \
        refused.output


def full_lines(lines: list[str], width: int) -> list[tuple[str, str]]:
    """The consecutive lines of a wrapped paragraph where the second's first word would have fit on the first: a
    line broken before its end (a docstring's hard line break)."""
    return [(a, b) for a, b in zip(lines, lines[1:]) if a.strip() and b.strip()
            and len(a.rstrip()) + 1 + len(b.split()[0]) <= width]


def test_every_help_at_80_columns_breaks_no_sentence_and_shows_no_bool_type():
    group = at_80("--help")
    assert group.exit_code == 0
    panel = group.output.split("Commands ")[1].splitlines()[1:]
    rows = [line[1:-1] for line in panel if line.startswith("│")]
    offset = rows[0].index(rows[0].split()[1])  # where the descriptions start
    width = len(rows[0]) - 1 - offset
    cells: list[list[str]] = []
    for row in rows:
        if row[:offset].strip():
            cells.append([])
        cells[-1].append(row[offset:])
    assert len(cells) >= 10
    for cell in cells:
        assert not full_lines(cell, width), cell
    for command in ((), ("run",), ("sweep",), ("tune",), ("report",), ("show",), ("export",), ("validate",),
                    ("list",), ("recipes",), ("ui",)):
        helped = at_80(*command, "--help")
        assert helped.exit_code == 0 and "<bool>" not in helped.output, helped.output
        description = helped.output.split("Usage:")[1].split("╭")[0].splitlines()[1:]
        paragraph: list[str] = []
        for line in [*description, ""]:
            if line.strip():
                paragraph.append(line[1:])
            else:
                assert not full_lines(paragraph, 78), (command, paragraph)
                paragraph = []


# -- fedbench show of a sweep's parent (issue 59 item 9) --------------------------------------------------------

@pytest.mark.ray
def test_show_of_a_sweeps_parent_lists_its_runs_and_leaves_out_its_claims(ray_local, recipe, tracking_uri):
    from mlflow.tracking import MlflowClient

    swept = invoke("sweep", recipe, "--tracking-uri", tracking_uri, "--no-report")
    assert swept.exit_code == 0, swept.output
    client = MlflowClient(tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("small-lasso").experiment_id])
    [parent] = [run for run in runs if run.data.tags.get("role") == "sweep"]
    children = [run for run in runs if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 6 and any(name.startswith("claim/") for name in parent.data.params)  # kept in the store
    shown = at_80("show", parent.info.run_id, "--tracking-uri", tracking_uri)
    assert shown.exit_code == 0 and "claim/" not in shown.output, shown.output
    lines = shown.output.splitlines()
    assert max(map(len, lines)) <= 80 and "6 runs" in shown.output
    header = next(line for line in lines if "run id" in line).split()
    assert header == ["algorithm", "configuration", "seed", "status", "run", "id"]
    for child in children:
        tags = child.data.tags
        [row] = [line.split() for line in lines if child.info.run_id in line]
        learning_rate = f"client_lr={float(child.data.params['algorithm.client_lr']):g}"
        assert row == [tags["algorithm"], learning_rate if tags["algorithm"] == "fedda" else "–", tags["seed"],
                       "finished", child.info.run_id], row


# -- issue 59 item 10: friction of a shipped recipe's command line ------------------------------------------------

def test_a_run_shorter_than_mc_feddas_stages_is_warned_of_them():
    """`--set federation.rounds=200` on papers/bao2022_lasso kept MC-FedDA's stages (250, 250, 1500 rounds): its
    runs never left their first stage, unwarned. They are valid runs (a shortened run is the first rounds of the full
    one, which bench/gallery.py times), so a warning names the algorithm, both numbers and stages that fit; stages
    that begin within the rounds are not warned of."""
    result = invoke("validate", "papers/bao2022_lasso", "--set", "federation.rounds=200")
    assert result.exit_code == 0, result.output
    warning = next(line for line in result.output.splitlines() if line.startswith("warning:"))
    assert ("algorithms.mc_fedda.stage_rounds: found [250, 250, 1500] for 200 rounds: the run ends in stage 1 of 3, "
            "stages 2–3 beginning at rounds 250, 500; in the same proportions: stage_rounds=[25,25,150]") in warning
    fitted = invoke("validate", "papers/bao2022_lasso", "--set", "federation.rounds=200",
                    "--set", "algorithms.mc_fedda.stage_rounds=[25,25,150]")
    assert fitted.exit_code == 0 and "warning" not in fitted.output, fitted.output
    assert "warning" not in invoke("validate", "papers/bao2022_lasso").output
    alone = invoke("run", "papers/bao2022_lasso", "-a", "fedmid", "--set", "federation.rounds=2", "--no-track")
    assert alone.exit_code == 0 and "warning" not in alone.output, alone.output  # a run of another algorithm


def test_mc_feddas_caveat_is_where_the_engines_stages_do_not_all_begin():
    """The warning's rule against the engine's own stage of each round (`MCFedDA._stage` on the starts `derive`
    makes): a run of R rounds (indices 0..R-1) is warned of exactly when its last round is not in the last stage."""
    from fedbench.algorithms.mc_fedda import MCFedDA
    from fedbench.hparams import HParams

    stages = [250.0, 250.0, 1500.0]
    hp = HParams({"stage_rounds": stages, "stage_starts": [0, 250, 500]})
    for rounds in (1, 200, 250, 251, 499, 500, 501, 2000):
        last_stage = MCFedDA._stage(rounds - 1, hp)
        assert bool(MCFedDA.caveats({"stage_rounds": stages}, rounds)) == (last_stage < 2), rounds
    assert MCFedDA.caveats({"stage_rounds": [3.0, 4.0]}, 2) == {
        "stage_rounds": "found [3, 4] for 2 rounds: the run ends in stage 1 of 2, stage 2 beginning at round 3; in "
                        "the same proportions: stage_rounds=[1,1]"}
    assert "proportions" not in MCFedDA.caveats({"stage_rounds": stages}, 2)["stage_rounds"]  # 3 stages in 2 rounds


def test_an_algorithm_the_recipe_does_not_run_is_refused_naming_those_it_runs(tmp_path):
    """`run -a fednova` read as if the recipe were wrong ("found 'fednova', expected one of ..."): it says the recipe
    does not run it and which it runs, how to add a known algorithm, and that no algorithm has an unknown name."""
    from helpers import refused

    listed = "it runs fedmid, fedda, fast_fedda, c_fedda, mc_fedda"
    refused(invoke("run", "papers/bao2022_lasso", "-a", "fednova", "--no-track"), "--algorithm: the recipe does not "
            f"run 'fednova'; {listed}; no algorithm is named 'fednova'")
    refused(invoke("run", "papers/bao2022_lasso", "-a", "fedavg", "--no-track"),
            f"the recipe does not run 'fedavg'; {listed}; --set algorithms.fedavg={{}} adds it")
    refused(invoke("sweep", "papers/bao2022_lasso", "-a", "fedmid", "-a", "scaffold"),
            f"the recipe does not run 'scaffold'; {listed}")
    refused(invoke("tune", "recipes/lasso.yaml", "-a", "fedad"), "the recipe does not run 'fedad'; it runs fedmid, "
            "fedda, fedavg; no algorithm is named 'fedad' (did you mean 'fedda'?)")
    added = invoke("run", "papers/bao2022_lasso", "-a", "fedavg", "--set", "algorithms.fedavg={}",
                   "--set", "federation.rounds=2", "--no-track")
    assert added.exit_code == 0, added.output


def test_setting_an_algorithm_of_the_recipe_to_null_is_refused():
    """`--set algorithms.fedda=null` was accepted and ran FedDA at its default hyperparameters (YAML's `fedda:`), not
    without it: refused, pointing at -a. An algorithm the recipe does not list joins it at its defaults, as before."""
    from helpers import refused

    refused(invoke("validate", "papers/bao2022_lasso", "--set", "algorithms.fedda=null"),
            "--set: algorithms.fedda=null: found null for an algorithm the recipe runs", "expected -a NAME")
    joined = invoke("validate", "papers/bao2022_lasso", "--set", "algorithms.fedavg=null")
    assert joined.exit_code == 0 and "mc_fedda, fedavg" in " ".join(joined.output.split()), joined.output


def test_no_two_shipped_recipes_share_an_experiment_name():
    """recipes/lasso.yaml and papers/bao2022_lasso (and lowrank.yaml and papers/bao2022_lowrank) were both experiment
    `bao2022-lasso` (`bao2022-lowrank`): a report of one drew the other's runs too."""
    from sweeps.recipe import read_yaml
    from sweeps.shipped import find, names

    experiments: dict[str, list[str]] = {}
    for name in names():
        path = find(name)
        assert path is not None
        experiments.setdefault(read_yaml(path).get("name") or path.stem, []).append(name)
    assert len(experiments) == len(names()) > 30, {e: n for e, n in experiments.items() if len(n) > 1}


@pytest.mark.parametrize("command", ["sweep", "tune"])
def test_without_address_a_sweep_joins_the_ray_that_ray_address_names(command, monkeypatch):
    """RAY_ADDRESS, as Ray's tools read it, is the default of --address (the tests' sweeps join the session's Ray so);
    --address wins over it, and with neither the command starts a Ray of its own (address None)."""
    import typer

    parse = typer.main.get_command(app).commands[command].make_context
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert parse(command, ["r.yaml"]).params["address"] is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert parse(command, ["r.yaml"]).params["address"] == "10.0.0.1:6379"
    assert parse(command, ["r.yaml", "--address", "10.0.0.2:6379"]).params["address"] == "10.0.0.2:6379"
