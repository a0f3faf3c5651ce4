"""The plugin package examples/fedbench-fedopt (the tutorial "Compare your own method" runs as shown in
tests/cli/test_docs_tutorials.py).

- FedAvg with the server optimizer (`federation.server_optimizer`: FedAdam, FedYogi; Reddi et al. 2021, Algorithm 2)
  on the package's problem against a NumPy transcription of the algorithm on the same data (full participation, full
  batches: no draw matters), to 1e-12 in float64, alone and as two runs of one batch; its reduction to FedAvg.
- The package's problem: its closed-form optimum has zero gradient, and its gap is exact.
- The package installed (`pip install --target`): `list` shows its problem as an entry point of fedbench-fedopt,
  `sweep` runs its recipes' algorithms on it with its code's sha256; without it, a recipe naming quadratic is refused.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from cli import app
from fedbench.algorithms import ALGORITHMS
from fedbench.engine.simulate import Federation, Simulation, run_batch
from fedbench.problems import PROBLEMS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fedbench-fedopt"
PACKAGE = EXAMPLE / "fedbench_fedopt"


@pytest.fixture(scope="module")
def quadratic():
    """The package's problem module, imported from the source tree (not registered: the class is used directly)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLE))
        yield importlib.import_module("fedbench_fedopt.quadratic")


@pytest.fixture(scope="module")
def problem(quadratic):
    cls = quadratic.Quadratic
    return cls(cls.resolve_config({"clients": 6, "samples_per_client": 12, "dim": 8}), seed=3)


# -- Algorithm 2 against NumPy ---------------------------------------------------------------------------------

def numpy_fedopt(problem, rule, rounds, local_steps, client_lr, server_lr, beta1, beta2, tau):
    """Reddi et al. 2021, Algorithm 2, written out: every client takes local_steps full-batch gradient steps from
    x_t; Δ_t the clients' mean change; m, v and x as the paper's lines (m_{-1} = 0, v_{-1} = τ²). x after each
    round."""
    n_clients, n, d = problem.num_clients, int(problem.client_sizes[0]), problem.dim
    a = problem.features.numpy().reshape(n_clients, n, d)
    b = problem.labels.numpy().reshape(n_clients, n)
    x, m, v = np.zeros(d), np.zeros(d), np.full(d, tau**2)
    states = []
    for _ in range(rounds):
        changes = []
        for k in range(n_clients):
            y = x.copy()
            for _ in range(local_steps):
                y = y - client_lr * a[k].T @ (a[k] @ y - b[k]) / n
            changes.append(y - x)
        delta = np.mean(changes, axis=0)
        m = beta1 * m + (1 - beta1) * delta
        if rule == "adam":
            v = beta2 * v + (1 - beta2) * delta**2
        else:
            v = v - (1 - beta2) * delta**2 * np.sign(v - delta**2)
        x = x + server_lr * m / (np.sqrt(v) + tau)
        states.append(x)
    return states


HP = {"client_lr": 0.05, "server_lr": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
LOCAL_STEPS, ROUNDS = 4, 3


def fedopt(problem, rule, hp, rounds=ROUNDS, seed=0, eval_every=10):
    """FedAvg (server step 1) with the server optimizer `rule` at `hp`: every client, every round, on its whole
    data."""
    optimizer = {"name": rule, "lr": hp["server_lr"], **{k: hp[k] for k in ("beta1", "beta2", "tau")}}
    federation = Federation(rounds, clients_per_round=0, local_steps=LOCAL_STEPS,
                            batch_size=int(problem.client_sizes[0]), server_optimizer=optimizer)
    algorithm = ALGORITHMS["fedavg"](problem, client_lr=hp["client_lr"], subgradient=False)
    return Simulation(problem, algorithm, federation, seed, eval_every)


@pytest.mark.parametrize("rule", ["adam", "yogi"])
def test_fedadam_and_fedyogi_match_a_numpy_transcription_of_algorithm_2(problem, rule):
    sim = fedopt(problem, rule, HP)
    expected = numpy_fedopt(problem, rule, ROUNDS, LOCAL_STEPS, **HP)
    for t in range(ROUNDS):
        sim.run_round()
        x = sim.server["w"].numpy()
        assert np.abs(x - expected[t]).max() < 1e-12, (rule, t)
    assert np.abs(x).max() > 0.1  # the check compares real steps, not zeros


def test_runs_of_one_batch_keep_their_own_optimizer_floats(problem):
    """Two FedYogi runs with different β1, β2, τ, η as one program ([R, 1, 1] per-run values): each as NumPy."""
    other = {**HP, "beta1": 0.5, "beta2": 0.9, "tau": 1e-2, "server_lr": 0.03}
    sims = [fedopt(problem, "yogi", hp, eval_every=1) for hp in (HP, other)]
    assert len(list(run_batch(sims))) == 2 * (ROUNDS + 1)
    for sim, hp in zip(sims, (HP, other)):
        expected = numpy_fedopt(problem, "yogi", ROUNDS, LOCAL_STEPS, **hp)[-1]
        assert np.abs(sim.server["w"].numpy() - expected).max() < 1e-12


def test_with_beta1_0_and_beta2_1_both_are_fedavg(problem):
    """β2 = 1 keeps v = τ², β1 = 0 makes m = Δ: x + η Δ / (2τ), FedAvg's server step 1 for η = 2τ; on sampled
    clients and minibatches (the same draws for every server optimizer of a seed)."""
    tau = 1e-3
    finals = {}
    for rule in ("adam", "yogi"):
        optimizer = {"name": rule, "lr": 2 * tau, "beta1": 0.0, "beta2": 1.0, "tau": tau}
        sim = Simulation(problem, ALGORITHMS["fedavg"](problem, client_lr=0.05),
                         Federation(8, clients_per_round=3, local_steps=3, batch_size=4, server_optimizer=optimizer), 1)
        list(sim)
        finals[rule] = sim.server["w"].reshape(-1)
    sim = Simulation(problem, ALGORITHMS["fedavg"](problem, client_lr=0.05, server_lr=1.0),
                     Federation(8, clients_per_round=3, local_steps=3, batch_size=4), seed=1)
    list(sim)
    fedavg = sim.server["w"].reshape(-1)
    assert float(fedavg.abs().max()) > 0.1
    for rule, w in finals.items():
        assert float((w - fedavg).abs().max()) < 1e-12, rule


# -- the package's problem ---------------------------------------------------------------------------------------

def test_the_closed_form_optimum_is_a_zero_of_the_gradient_and_the_gap_is_exact(problem):
    n_clients, d = problem.num_clients, problem.dim
    optimum = problem.optimum
    gradients = problem.client_grad(optimum.expand(n_clients, d), torch.arange(n_clients))  # ∇L_k(w*) per client
    assert float(gradients.norm(dim=1).min()) > 1e-2  # no client is at its own optimum: they disagree
    assert float((problem.client_weights @ gradients).abs().max()) < 1e-12  # Σ π_k ∇L_k(w*) = 0
    at_optimum = problem.evaluate(optimum)
    assert at_optimum["objective_gap"] == 0.0 and at_optimum["distance"] == 0.0

    def objective(w):  # Σ_k π_k (1/2n) ‖A_k w − b_k‖² from the data, not from the quadratic form
        return float(0.5 * (problem.features @ w - problem.labels).square().mean())

    gen = torch.Generator().manual_seed(0)
    for scale in (1e-3, 1.0):
        w = optimum + scale * torch.randn(d, generator=gen, dtype=torch.float64)
        row = problem.evaluate(w)
        assert row["objective_gap"] > 0
        assert row["objective_gap"] == pytest.approx(objective(w) - objective(optimum), rel=1e-6 if scale < 1 else 1e-12)
        assert row["objective"] == pytest.approx(objective(w), rel=1e-12)


def test_a_config_without_a_unique_optimum_is_refused(quadratic):
    from fedbench.hparams import ParamError

    cls = quadratic.Quadratic
    with pytest.raises(ParamError, match="samples_per_client"):
        cls.check(cls.resolve_config({"clients": 2, "samples_per_client": 3, "dim": 10}))


# -- installed: entry points -------------------------------------------------------------------------------------

TINY = """\
name: fedopt-tiny
problem: {name: quadratic, clients: 8, samples_per_client: 16, dim: 10}
federation:
  rounds: 10
  clients_per_round: 4
  local_steps: 3
  batch_size: 4
  server_optimizer: [{name: sgd}, {name: adam, lr: 0.03}]
algorithms:
  fedavg: {client_lr: 0.03, subgradient: false}
  scaffold: {client_lr: 0.03, subgradient: false}
seeds: 2
eval_every: 5
"""


def fresh_env(pythonpath) -> dict[str, str]:
    """This environment for a fresh process that sees `pythonpath` (and no -v)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FEDBENCH_VERBOSE", "PYTHONPATH")}
    return {**env, "PYTHONPATH": os.pathsep.join(map(str, pythonpath)), "COLUMNS": "200"}


def cli(*args, cwd, pythonpath, timeout=600):
    """`python cli.py ARGS` in a fresh process that sees `pythonpath` (and no -v)."""
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *map(str, args)], cwd=cwd, env=fresh_env(pythonpath),
                          capture_output=True, text=True, timeout=timeout)


# Each command's (exit code, output), as JSON on the last line: the CLI's app invoked by Typer's runner (as
# tests/helpers.py's `invoke` does), the commands one after another in one process, as a script calling them would
ONE_PROCESS = """\
import json, sys
from typer.testing import CliRunner
from cli import app
print(json.dumps([(result.exit_code, result.output) for result in (CliRunner().invoke(app, args)
                                                                   for args in json.loads(sys.argv[1]))]))
"""


def cli_in_one_process(*commands, cwd, pythonpath) -> list[tuple[int, str]]:
    """Each `cli.py ARGS` of `commands` in ONE fresh process that sees `pythonpath` (and no -v): its exit code and
    output. A process per command would cost Python's start and fedbench's imports each time (~5 s of CPU)."""
    done = subprocess.run([sys.executable, "-c", ONE_PROCESS, json.dumps([list(map(str, c)) for c in commands])],
                          cwd=cwd, env=fresh_env([ROOT, *pythonpath]), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return [tuple(result) for result in json.loads(done.stdout.splitlines()[-1])]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def package_sha256(folder: Path) -> str:
    """A package plugin's hash: every Python file of its package, by relative name and content, in name order."""
    digest = hashlib.sha256()
    for file in sorted(folder.rglob("*.py")):
        digest.update(str(file.relative_to(folder)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


@pytest.mark.ray
def test_the_installed_package_is_listed_and_its_sweep_records_its_codes_sha256(tmp_path, tracking_uri):
    source, site = tmp_path / "src", tmp_path / "site"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                                "--no-index", "--disable-pip-version-check", "--target", str(site), str(source)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    path = [site, ROOT]

    (listed_code, listed), *validated = cli_in_one_process(
        ("list", "algorithms", "problems"),
        *(("validate", EXAMPLE / "recipes" / recipe) for recipe in ("compare.yaml", "compare_lasso.yaml")),
        cwd=tmp_path, pythonpath=path)
    assert listed_code == 0, listed
    shown = " ".join(listed.split())
    assert "problem quadratic (plugin: entry point fedbench.problems:quadratic (fedbench-fedopt))" in shown, shown
    assert [code for code, _ in validated] == [0, 0], validated  # the shipped recipes are valid

    (tmp_path / "tiny.yaml").write_text(TINY)
    swept = cli("sweep", "tiny.yaml", "--tracking-uri", tracking_uri, "--no-report", cwd=tmp_path, pythonpath=path)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("fedopt-tiny")
    runs = [run for run in client.search_runs([experiment.experiment_id], max_results=100)
            if run.data.tags.get("role") == "trial"]
    assert sorted((run.data.tags["algorithm"], run.data.params["federation.server_optimizer"], run.data.tags["seed"])
                  for run in runs) == [(name, rule, seed) for name in ("fedavg", "scaffold")
                                       for rule in ("adam(lr=0.03, beta1=0.9, beta2=0.99, tau=0.001, form=paper)",
                                                    "sgd(lr=1.0)") for seed in ("0", "1")]
    package = package_sha256(PACKAGE)  # the problem's package: every file's edits count
    for run in runs:
        assert run.data.tags["status"] == "finished", run.data.tags
        assert run.data.metrics["objective_gap"] >= 0
        assert set(run.data.tags["plugin_sha256"].split()) == {package}, run.data.tags
        stored = client.download_artifacts(run.info.run_id, "plugins/quadratic.py", str(tmp_path / run.info.run_id))
        assert sha256(Path(stored)) == sha256(PACKAGE / "quadratic.py")  # the problem's code as it ran


def test_without_the_package_a_recipe_naming_quadratic_is_refused(tmp_path):
    if any(point.name == "quadratic" for point in importlib.metadata.entry_points(group="fedbench.problems")):
        pytest.skip("fedbench-fedopt is installed in this environment")
    assert "quadratic" not in PROBLEMS
    recipe = tmp_path / "r.yaml"
    recipe.write_text("problem: {name: quadratic, clients: 4}\nalgorithms: {fedavg: {}}\n")
    result = CliRunner().invoke(app, ["validate", str(recipe)], env={"FEDBENCH_VERBOSE": None})
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output, result.output
    assert f"{recipe}: problem.name: found 'quadratic', expected a problem" in result.output, result.output
