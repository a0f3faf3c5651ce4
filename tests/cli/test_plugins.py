"""A researcher's own algorithm in a file beside a recipe (`plugins: [my_method.py]`) or added to a shipped paper
recipe with `--with`: validated by its own declarations, run, swept on Ray, tuned and reported as a built-in one;
its code and sha256 on each run; an edit re-runs its runs only; a plugin that cannot be registered refused at
`validate` in one line (exit 2)."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from helpers import invoke

ROOT = Path(__file__).resolve().parents[2]
# FedAvg with heavy-ball server momentum: with beta = 0 it is FedAvg with server_lr = 1, which the test checks.
MY_METHOD = '''\
"""FedAvg with server momentum: m <- beta m + (w - mean_k u_k), w <- w - m."""
from fedbench.algorithms.base import CLIENT_LR, Algorithm, Upload, aggregate, broadcast
from fedbench.hparams import Param


class MyMethod(Algorithm):
    name = "my_method"
    hparams = (CLIENT_LR, Param("beta", "float", 0.9, "server momentum", low=0.0, high=1.0))
    uploads = (Upload("u", relative_to="w"),)  # what client_final sends

    def init_server(self, w0):
        return {"w": w0.clone(), "m": 0 * w0}

    def client_init(self, server, rows, rnd, hp):
        return {"u": broadcast(server["w"], rnd)}

    def client_step(self, local, batches, rnd, hp):
        return {"u": local["u"] - hp.client_lr * batches.D.grad(local["u"])}

    def client_final(self, local, rnd, hp):
        return {"u": local["u"]}, {}

    def server_update(self, server, message, weights, rnd, hp):
        m = hp.beta * server["m"] + (server["w"] - aggregate(message["u"], weights))
        return {"w": server["w"] - m, "m": m}
'''
PROBLEM = """\
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation: {rounds: 6, clients_per_round: 4, local_steps: 2, batch_size: 5}
eval_every: 2
"""
RECIPE = "name: mine\nplugins: [my_method.py]\n" + PROBLEM + """\
algorithms: {fedavg: {client_lr: 0.02, subgradient: false}, my_method: {client_lr: [0.02], beta: [0.0, 0.5]}}
seeds: 2
"""


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "my_method.py").write_text(MY_METHOD)
    (tmp_path / "r.yaml").write_text(RECIPE)
    return tmp_path


def refused(result, *phrases):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    for phrase in phrases:
        assert phrase in result.output, (phrase, result.output)
    return result.output


# -- validate and run --------------------------------------------------------------------------------------

def test_a_plugin_beside_the_recipe_validates_and_runs_its_update_rule(folder):
    ok = invoke("validate", folder / "r.yaml")
    assert ok.exit_code == 0 and "my_method" in ok.output, ok.output
    rows = {}
    for name, sets in (("fedavg", []), ("mine", ["--set", "algorithms.my_method.beta=0.0"])):
        json_path = folder / f"{name}.json"
        result = invoke("run", folder / "r.yaml", "--algorithm", "fedavg" if name == "fedavg" else "my_method",
                        *sets, "--no-track", "--json", json_path)
        assert result.exit_code == 0, result.output
        rows[name] = json.loads(json_path.read_text())
    # beta = 0: w - (w - mean u) = mean u, FedAvg's server step with server_lr 1, on the same draws
    assert [r["objective"] for r in rows["mine"]] == pytest.approx([r["objective"] for r in rows["fedavg"]],
                                                                     rel=1e-12)
    momentum = folder / "momentum.json"
    assert invoke("run", folder / "r.yaml", "-a", "my_method", "--set", "algorithms.my_method.beta=0.5",
                  "--no-track", "--json", momentum).exit_code == 0
    assert json.loads(momentum.read_text())[-1]["objective"] != rows["mine"][-1]["objective"]


def test_a_plugins_declarations_validate_the_recipe(folder):
    refused(invoke("validate", folder / "r.yaml", "--set", "algorithms.my_method.bta=0.1"),
            "algorithms.my_method.bta: unknown parameter (did you mean 'beta'?)")
    refused(invoke("validate", folder / "r.yaml", "--set", "algorithms.my_method.beta=2"),
            "algorithms.my_method.beta", "2")
    (folder / "pairs.py").write_text(MY_METHOD.replace('"my_method"', '"pairs_only"').replace(
        "    hparams =", '    requires = frozenset({"pair_scores"})\n    hparams ='))
    (folder / "p.yaml").write_text("plugins: [pairs.py]\n" + PROBLEM + "algorithms: {pairs_only: {}}\n")
    refused(invoke("validate", folder / "p.yaml"), "algorithms.pairs_only: pairs_only requires pair_scores",
            "problem lasso does not provide")


def test_list_shows_a_plugin_and_where_it_came_from(folder):
    result = invoke("list", "algorithms", "--with", folder / "my_method.py")
    assert result.exit_code == 0, result.output
    text = "".join(result.output.split())  # the table titles as printed, wrapped at the console's width
    assert f"algorithmmy_method(plugin:{folder / 'my_method.py'})" in text
    assert "algorithmfedavg(plugin" not in text and "algorithmfedavg" in text


# -- refusals ------------------------------------------------------------------------------------------------

BROKEN = {
    "clash with a built-in": (MY_METHOD.replace('"my_method"', '"fedavg"'),
                              "plugin bad.py: algorithm name 'fedavg' is taken by the built-in algorithm"),
    "syntax error": (MY_METHOD.replace("def client_step(self,", "def client_step(self"),
                     "plugin bad.py: does not import: SyntaxError"),
    "missing dependency": ("import zzqq_not_installed\n" + MY_METHOD,
                           "plugin bad.py: does not import: ModuleNotFoundError: No module named 'zzqq_not_installed'"),
    "no component": ("X = 1\n", "plugin bad.py: defines no algorithm or problem"),
    "a method missing": (MY_METHOD.replace("def client_step", "def client_stepp"),
                         "plugin bad.py: algorithm my_method does not define client_step"),
    "parameters not declared as Param": (MY_METHOD.replace("hparams = (", "hparams = ('client_lr', "),
                                         "plugin bad.py: algorithm my_method: `hparams` must be a tuple of"),
    # issue 47 item 7: both were accepted and then read as something else (the kind as a float, the direction as
    # neither way)
    "a Param kind misspelled": (MY_METHOD.replace('Param("beta", "float"', 'Param("beta", "flaot"'),
                                "plugin bad.py: does not import: ValueError: Param 'beta': kind 'flaot' is not one "
                                "of float, int, bool, choice, floats, ints, str (did you mean 'float'?)"),
    "a metric direction misspelled": ("from fedbench.metrics import Metric\nSCORE = Metric('score', 'score', "
                                      "'minimize')\n" + MY_METHOD,
                                      "plugin bad.py: does not import: ValueError: Metric 'score': direction "
                                      "'minimize' is not one of 'min', 'max' or None"),
    "a default outside its range": (MY_METHOD.replace('0.9, "server momentum"', '1.5, "server momentum"'),
                                    "plugin bad.py: does not import: ValueError: Param 'beta': the default 1.5 fails the declaration's own check: expected "
                                    "float in [0, 1], found 1.5"),
}


@pytest.mark.parametrize("text, phrase", BROKEN.values(), ids=BROKEN)
def test_a_plugin_that_cannot_be_registered_is_refused_in_one_line(tmp_path, text, phrase):
    (tmp_path / "bad.py").write_text(text)
    path = tmp_path / "r.yaml"
    path.write_text("plugins: [bad.py]\n" + PROBLEM + "algorithms: {fedavg: {}}\n")
    refused(invoke("validate", path), f"{path}: plugins[0]: {phrase}")


def test_two_plugins_giving_one_name_are_refused(folder):
    (folder / "other.py").write_text(MY_METHOD)
    (folder / "two.yaml").write_text("plugins: [my_method.py, other.py]\n" + PROBLEM + "algorithms: {fedavg: {}}\n")
    refused(invoke("validate", folder / "two.yaml"),
            "plugins[1]: plugin other.py: algorithm name 'my_method' is taken by plugin my_method.py")


def test_a_module_plugin_that_is_no_component_is_refused(folder):
    (folder / "m.yaml").write_text("plugins: ['json:JSONDecoder']\n" + PROBLEM + "algorithms: {fedavg: {}}\n")
    refused(invoke("validate", folder / "m.yaml"), "plugins[0]: plugin json:JSONDecoder: JSONDecoder is not an "
                                                   "algorithm or problem")
    (folder / "n.yaml").write_text("plugins: [zzqq_mod.methods]\n" + PROBLEM + "algorithms: {fedavg: {}}\n")
    refused(invoke("validate", folder / "n.yaml"), "plugin zzqq_mod.methods: does not import: ModuleNotFoundError")


# -- sweep, resume after an edit, provenance, report, tune -----------------------------------------------

def sweep_runs(uri, name):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    return [run for run in client.search_runs([experiment.experiment_id], max_results=1000)
            if run.data.tags.get("role") == "trial"]


@pytest.mark.ray
def test_sweep_records_the_plugins_code_and_an_edit_reruns_its_runs_only(ray_local, folder, tracking_uri):
    # --no-report: the report of the plugin's runs is the `report` command's below (a sweep's own report is that
    # command's code run at its end; two more would cost seconds each and show nothing more)
    first = invoke("sweep", folder / "r.yaml", "--tracking-uri", tracking_uri, "--no-report")
    assert first.exit_code == 0, first.output
    runs = sweep_runs(tracking_uri, "mine")
    assert len(runs) == 6
    client, digest = MlflowClient(tracking_uri), hashlib.sha256(MY_METHOD.encode()).hexdigest()
    for run in runs:
        if run.data.tags["algorithm"] == "my_method":
            assert run.data.tags["plugin_sha256"] == digest
            stored = Path(client.download_artifacts(run.info.run_id, "plugins/my_method.py", str(folder / "dl")))
            assert hashlib.sha256(stored.read_bytes()).hexdigest() == digest
        else:
            assert "plugin_sha256" not in run.data.tags
    report = folder / "report"
    shown = invoke("report", folder / "r.yaml", "--tracking-uri", tracking_uri, "--out", report)
    assert shown.exit_code == 0 and "my_method" in shown.output, shown.output
    assert "my_method" in (report / "report.md").read_text()

    (folder / "my_method.py").write_text(MY_METHOD.replace("server momentum:", "server momentum (edited):"))
    again = invoke("sweep", folder / "r.yaml", "--tracking-uri", tracking_uri, "--no-report")
    assert again.exit_code == 0, again.output
    runs = sweep_runs(tracking_uri, "mine")
    by_algorithm = {name: [r for r in runs if r.data.tags["algorithm"] == name] for name in ("fedavg", "my_method")}
    assert len(by_algorithm["fedavg"]) == 2  # skipped: its configuration did not change
    assert len(by_algorithm["my_method"]) == 8  # its 4 runs again, under the edited code's hash
    assert len({r.data.tags["plugin_sha256"] for r in by_algorithm["my_method"]}) == 2


@pytest.mark.ray
def test_with_adds_a_method_to_a_shipped_paper_recipe_and_tune_gives_it_the_budget(ray_local, folder, tracking_uri):
    paper = ROOT / "recipes" / "papers" / "bao2022_lasso.yaml"
    ok = invoke("validate", paper, "--with", folder / "my_method.py",
                "--set", "algorithms.my_method.client_lr=[1e-3,1e-2]")
    assert ok.exit_code == 0 and "my_method" in ok.output and "fedmid" in ok.output, ok.output
    recipe = folder / "tuned.yaml"
    recipe.write_text(PROBLEM + """\
name: tuned
algorithms: {fedavg: {}}
tune: {space: {client_lr: {log_uniform: [1.0e-3, 1.0e-1]}}, metric: objective, mode: min, trials: 3}
""")
    tuned = invoke("tune", recipe, "--with", folder / "my_method.py", "--tracking-uri", tracking_uri)
    assert tuned.exit_code == 0, tuned.output
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("tuned")
    trials = [run for run in client.search_runs([experiment.experiment_id], max_results=1000)
              if run.data.tags.get("role") == "tune_trial"]
    counts = {name: sum(run.data.tags["algorithm"] == name for run in trials) for name in ("fedavg", "my_method")}
    assert counts == {"fedavg": 3, "my_method": 3}


# -- a file plugin's sibling modules: hashed and shipped (issue 44) ---------------------------------------

# MY_METHOD with its server step in a helper module beside it, which imports another one (transitively found).
HELPED = MY_METHOD.replace('"my_method"', '"helped"').replace(
    "from fedbench.hparams import Param\n", "from fedbench.hparams import Param\nfrom helped_steps import momentum\n"
).replace('m = hp.beta * server["m"] + (server["w"] - aggregate(message["u"], weights))',
          'm = momentum(hp.beta, server["m"], server["w"] - aggregate(message["u"], weights))')
STEPS = "import helped_scale\n\n\ndef momentum(beta, m, delta):\n    return beta * m + helped_scale.SCALE * delta\n"
HELPED_RECIPE = "name: helped\nplugins: [helped.py]\n" + PROBLEM + """\
algorithms: {fedavg: {client_lr: 0.02}, helped: {client_lr: [0.02], beta: [0.5]}}
seeds: 1
"""


@pytest.fixture
def helped(tmp_path, monkeypatch):
    """A plugin folder; sys.path and the sibling modules this test imports are restored after it."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / "helped.py").write_text(HELPED)
    (folder / "helped_steps.py").write_text(STEPS)
    (folder / "helped_scale.py").write_text("SCALE = 1.0\n")
    (folder / "notes.py").write_text("NOTE = 1\n")  # in the folder, imported by nothing
    (folder / "r.yaml").write_text(HELPED_RECIPE)
    yield folder
    for name in set(sys.modules) - before:
        if name.partition(".")[0] in ("helped_steps", "helped_scale"):
            del sys.modules[name]


def helped_trial(folder):
    from sweeps.recipe import load as load_recipe

    [trial] = [trial for trial in load_recipe(folder / "r.yaml").trials() if trial.algorithm == "helped"]
    return trial


def test_editing_a_file_plugins_sibling_module_changes_its_hash(helped, monkeypatch):
    """The issue's case: the plugin's folder importable in the driver (its working directory, PYTHONPATH), a helper
    edited between two sweeps: the plugin's sha256, and so its runs' config hash, must change (its runs re-run);
    an edit of a file the plugin does not import changes neither."""
    from fedbench import plugins

    monkeypatch.syspath_prepend(str(helped))
    first = helped_trial(helped)
    (helped / "notes.py").write_text("NOTE = 2\n")
    (helped / "other.txt").write_text("unrelated\n")
    assert helped_trial(helped).config_hash == first.config_hash
    (helped / "helped_scale.py").write_text("SCALE = 2.0\n")  # imported by helped_steps, not by the plugin
    second = helped_trial(helped)
    assert second.config_hash != first.config_hash
    assert second.plugins[0].sha256 != first.plugins[0].sha256
    # ... and the plugin runs the edited helper, not the one this process imported first
    assert sys.modules[second.plugins[0].module].momentum(0.5, 2.0, 1.0) == 3.0
    (helped / "helped_steps.py").write_text(STEPS.replace("beta * m", "beta * m * 1"))
    assert helped_trial(helped).config_hash not in (first.config_hash, second.config_hash)
    assert plugins.sources("algorithm", "helped")[0].sha256 == helped_trial(helped).plugins[0].sha256


def test_a_file_plugins_sibling_modules_travel_to_a_worker(helped, tmp_path, monkeypatch):
    """A worker-like process (another working directory, the plugin's folder on no sys.path) given the pickled
    trial loads the plugin and runs it, helpers included, to the driver's numbers."""
    import pickle
    import subprocess

    from sweeps.driving import build_simulation, drive

    monkeypatch.syspath_prepend(str(helped))  # as in the issue: the driver imports the helper, a worker cannot
    trial = helped_trial(helped)
    expected = [row["objective"] for row in drive(build_simulation(trial)).rows]
    (tmp_path / "trial.pkl").write_bytes(pickle.dumps(trial))
    elsewhere = tmp_path / "worker"
    elsewhere.mkdir()
    worker = f"""
import json, pickle, sys
from sweeps.driving import build_simulation, drive
assert not any(path and path.startswith({str(helped)!r}) for path in sys.path), sys.path
trial = pickle.loads(open({str(tmp_path / 'trial.pkl')!r}, "rb").read())
print(json.dumps([row["objective"] for row in drive(build_simulation(trial)).rows]))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FEDBENCH_VERBOSE")}
    env["PYTHONPATH"] = str(ROOT)  # fedbench and sweeps, as every node has them; not the plugin's folder
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", worker], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == pytest.approx(expected, rel=1e-12)


@pytest.mark.ray
def test_a_plugin_that_fails_only_in_the_workers_is_named_on_the_console(ray_local, folder, tracking_uri,
                                                                        monkeypatch):
    """Runs that raise in a Ray worker (here: a plugin whose set-up fails in any process but the driver, as one
    whose helper is missing there) are each named on stderr with their error's line and where the rest is; before,
    the console said `failed 2` and nothing else."""
    monkeypatch.setenv("DRIVER_PID", str(os.getpid()))
    (folder / "my_method.py").write_text(MY_METHOD.replace(
        "    def init_server(self, w0):\n",
        "    def init_server(self, w0):\n        import os\n"
        "        if os.environ.get('DRIVER_PID') != str(os.getpid()):\n"
        "            raise RuntimeError('the helper is missing on this worker')\n"))
    result = invoke("sweep", folder / "r.yaml", "--tracking-uri", tracking_uri, "--no-report")
    assert result.exit_code == 1, result.output
    named = [line for line in result.output.splitlines() if line.startswith("failed: my_method")]
    assert len(named) == 4, result.output
    run_ids = {line.rpartition("fedbench show ")[2] for line in named}
    assert all("RuntimeError: the helper is missing on this worker" in line for line in named)
    client = MlflowClient(tracking_uri)
    assert all("the helper is missing" in client.get_run(run_id).data.tags["error"] for run_id in run_ids)


@pytest.mark.ray
def test_a_run_that_raises_mid_sweep_is_shown_whole_and_left_out_of_the_means(ray_local, folder, tracking_uri):
    """Issue 47 item 2: a run that raised showed as "failed 1", its reason in a tag nothing pointed to, and the
    summary table gave its partial curve's mean. The console names the command that prints the whole traceback
    (`fedbench show RUN_ID`, which prints the run's configuration too), and the means leave failed runs out and
    say how many."""
    (folder / "my_method.py").write_text(MY_METHOD.replace(
        "    def server_update(self, server, message, weights, rnd, hp):\n",
        "    def server_update(self, server, message, weights, rnd, hp):\n"
        "        if rnd.index == 3:\n"
        "            raise FloatingPointError('the momentum overflowed at round 3')\n"))
    result = invoke("sweep", folder / "r.yaml", "--tracking-uri", tracking_uri)
    assert result.exit_code == 1, result.output
    named = [line for line in result.output.splitlines() if line.startswith("failed: my_method")]
    assert len(named) == 4 and all("FloatingPointError: the momentum overflowed at round 3" in line for line in named)
    run_id = named[0].rpartition("; the whole traceback: fedbench show ")[2]
    shown = invoke("show", run_id, "--tracking-uri", tracking_uri)
    assert shown.exit_code == 0, shown.output
    assert "my_method seed" in shown.output and "status failed" in shown.output
    assert "algorithm.beta = " in shown.output and "Traceback (most recent call last)" in shown.output
    assert shown.output.rstrip().endswith("FloatingPointError: the momentum overflowed at round 3")
    best = [line for line in result.output.splitlines() if "2 failed" in line]  # the best configuration's row
    assert best and "– (all 2 runs failed)" in best[0], result.output
    missing = invoke("show", "nosuchrun", "--tracking-uri", tracking_uri)
    assert missing.exit_code == 2 and "no run 'nosuchrun'" in missing.output and "Traceback" not in missing.output


# A plugin whose message depends on a hyperparameter: with `reduce`, its devices all-reduce the model inside the
# round (one value every device holds), on which no uplink chain can act.
REDUCING = '''\
from fedbench.algorithms.base import CLIENT_LR, MODEL, Algorithm, Routing, Upload, aggregate
from fedbench.hparams import Param


class Reducing(Algorithm):
    name = "reducing"
    hparams = (CLIENT_LR, Param("reduce", "bool", False, "all-reduce the model inside the round"))

    @classmethod
    def routing(cls, hp):
        return Routing(("w",), (Upload("w", all_reduced=True),) if hp["reduce"] else (MODEL,), ())

    def client_step(self, local, batches, rnd, hp):
        return {"w": local["w"] - hp.client_lr * batches.D.grad(local["w"])}

    def server_update(self, server, message, weights, rnd, hp):
        return {"w": aggregate(message["w"], weights)}
'''


@pytest.mark.heavy
def test_what_crosses_the_network_by_a_hyperparameter_is_what_validate_and_the_run_check(tmp_path):
    """`routing(hp)` is the one declaration of what crosses the network: `fedbench validate` refuses an uplink
    chain on the upload the hyperparameters make all-reduced, as building the run refuses it, and accepts the other."""
    import fedbench
    from fedbench import plugins
    from fedbench.engine.simulate import Federation, Simulation
    from fedbench.hparams import ParamError

    (tmp_path / "reducing.py").write_text(REDUCING)
    chained = PROBLEM.replace("batch_size: 5}", "batch_size: 5, uplink: [sign]}")
    recipe = tmp_path / "r.yaml"
    why = "found a chain for reducing, which all-reduces its upload 'w' (no message per client); expected none"
    recipe.write_text("plugins: [reducing.py]\n" + chained + "algorithms: {reducing: {reduce: true}}\n")
    refused(invoke("validate", recipe), f"federation.uplink: {why}")
    recipe.write_text("plugins: [reducing.py]\n" + chained + "algorithms: {reducing: {reduce: false}}\n")
    assert invoke("validate", recipe).exit_code == 0
    plugins.load(str(tmp_path / "reducing.py"))
    problem = fedbench.make_problem("lasso", seed=0, clients=8, samples_per_client=20, dim=30, support=10, lam=0.05)
    federation = Federation(2, 4, 2, 5, uplink=["sign"])
    for reduce in (True, False):
        algorithm = fedbench.make_algorithm("reducing", problem, reduce=reduce)
        assert algorithm.uploads == type(algorithm).routing({"reduce": reduce}).uploads
        if reduce:
            with pytest.raises(ParamError, match=why.replace("(", r"\(").replace(")", r"\)")):
                Simulation(problem, algorithm, federation, 0)
        else:
            assert len(list(Simulation(problem, algorithm, federation, 0))) > 1
