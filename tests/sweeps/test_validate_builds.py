"""`fedbench validate` agrees with `fedbench run`: what building a run refuses, validation refuses first, with the
recipe file and the field path; `sweep` and `tune` refuse it before Ray starts or the MLflow store is touched; command
line options obey the rules of the recipe fields they stand for."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from fedbench.algorithms import ALGORITHMS
from fedbench.problems import PROBLEMS
from sweeps.driving import build_simulation
from sweeps.recipe import RecipeError, parse

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("FEDBENCH_DATA", ROOT.parent / "shared" / "data"))
# the shared data sets: FEMNIST (femnist, digits), CIFAR-10 and Fashion-MNIST
needs_data = pytest.mark.skipif(not all((DATA / name).is_dir() for name in ("femnist", "cifar10", "fashion-mnist")),
                                reason="no shared data sets")

SMALL_LASSO = "{name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10}"
SMALL_FEDERATION = "{rounds: 2, clients_per_round: 4, local_steps: 2, batch_size: 5}"


def recipe_text(problem: str, algorithms: str, federation: str = SMALL_FEDERATION) -> str:
    return f"problem: {problem}\nfederation: {federation}\nalgorithms: {algorithms}\n"


# (problem, algorithms, federation) that building a run refuses; the field path and a fragment of the message
REFUSED = {
    "per_fedavg's default batches above the clients' samples": (
        SMALL_LASSO, "{per_fedavg: {}}", SMALL_FEDERATION, "algorithms.per_fedavg.inner_batch",
        "found 40, expected at most problem.samples_per_client = 20"),
    "per_fedavg's outer batch above the clients' samples": (
        SMALL_LASSO, "{per_fedavg: {variant: fo, inner_batch: 5}}", SMALL_FEDERATION,
        "algorithms.per_fedavg.outer_batch", "found 40, expected at most problem.samples_per_client = 20"),
    "lasso support above the dimension": (
        "{name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 40}", "{fedavg: {}}", SMALL_FEDERATION,
        "problem.support", "expected at most dim = 30"),
    "lasso personal support beyond the dimension": (
        "{name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 29, personal_support: 2}",
        "{fedavg: {}}", SMALL_FEDERATION, "problem.personal_support", "expected at most dim - support = 1"),
    "lowrank rank above the matrix size": (
        "{name: lowrank, clients: 8, samples_per_client: 20, rows: 4, cols: 6, rank: 5}", "{fedavg: {}}",
        SMALL_FEDERATION, "problem.rank", "expected at most min(rows, cols) = 4"),
    "mc_fedda stage lists of different lengths": (
        SMALL_LASSO, "{mc_fedda: {stage_rounds: [1, 1], stage_lams: [0.1, 0.05, 0.01], stage_radii: [5, 2]}}",
        SMALL_FEDERATION, "algorithms.mc_fedda.stage_lams", "found 3 stages, expected 2"),
    "mc_fedda fractional stage rounds": (
        SMALL_LASSO, "{mc_fedda: {stage_rounds: [1.5, 1], stage_lams: [0.1, 0.05], stage_radii: [5, 2]}}",
        SMALL_FEDERATION, "algorithms.mc_fedda.stage_rounds", "whole numbers of rounds"),
    "pfl_synthetic objective of the other preset": (
        "{name: pfl_synthetic, objective: ews}", "{lsgd_pfl: {}}", SMALL_FEDERATION, "problem.objective",
        "expected ews exactly with s2"),
    "synthetic pauc with one client per writer": (
        "{name: pauc, clients: 0}", "{fedavg: {}}", SMALL_FEDERATION, "problem.clients", "needs data: femnist"),
    "pauc positive classes repeated": (
        "{name: pauc, data: femnist, positive_classes: [1, 1]}", "{fedavg: {}}", SMALL_FEDERATION,
        "problem.positive_classes", "listed more than once"),
    "ab_users users not a multiple of ten": (
        "{name: ab_users, users: 15}", "{fedavg: {}}", SMALL_FEDERATION, "problem.users", "multiple of 10"),
    "pfl_images batch above the devices' training images": (
        "{name: pfl_images, preset: r4}", "{lsgd_pfl: {}}", "{rounds: 2, clients_per_round: 4, batch_size: 31}",
        "federation.batch_size", "found 31, expected at most problem.train = 30"),
}
REFUSED_ON_DATA = {
    "emnist: more clients per round than writers": (
        "{name: emnist}", "{fedavg: {}}", "{rounds: 2, clients_per_round: 400}", "federation.clients_per_round",
        "found 400, expected at most the problem's 358 clients"),
    "emnist: no writer kept": (
        "{name: emnist, min_train: 100000}", "{fedavg: {}}", SMALL_FEDERATION, "problem.min_train",
        "no writer has 100000+ train"),
    "pauc on femnist, one client per writer: more clients per round than writers": (
        "{name: pauc, preset: guo2023_femnist, clients: 0}", "{fedavg: {}}", "{rounds: 2, clients_per_round: 400}",
        "federation.clients_per_round", "found 400, expected at most the problem's"),
    "pauc on femnist: more clients than writers": (
        "{name: pauc, preset: guo2023_femnist, clients: 400}", "{fedavg: {}}", SMALL_FEDERATION, "problem.clients",
        "found 400, expected at most the data's 360 writers"),
    "digits: a pool below the first images of its pairs": (
        "{name: digits, per_label: 30}", "{fedavg: {}}", SMALL_FEDERATION, "problem.per_label",
        "found 30, expected at least 40"),
    "ab_users on digits: a partition larger than the pool": (
        "{name: ab_users, a: 3000}", "{fedavg: {}}", SMALL_FEDERATION, "problem.a", "the partition needs"),
    "ab_users: per_fedavg's batches above the smallest user's images": (
        "{name: ab_users, a: 6, a_test: 2}", "{per_fedavg: {inner_batch: 5}}", SMALL_FEDERATION,
        "algorithms.per_fedavg.outer_batch", "found 40, expected at most 15, the training samples of the smallest"),
    "ab_users on CIFAR-10: a partition larger than the pool": (
        "{name: ab_users, preset: fallah2020_cifar10, a: 1000}", "{fedavg: {}}", SMALL_FEDERATION, "problem.a",
        "the partition needs"),
    "pfl_images: devices' images beyond the pool": (
        "{name: pfl_images, devices: 2, classes: 1, train: 5000, test: 2000}", "{lsgd_pfl: {}}",
        "{rounds: 2, clients_per_round: 2}",
        "problem.train", "fewer than train + test = 7000"),
}


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_refused(result, file: Path, path: str, fragment: str) -> None:
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "Traceback" not in message and len(message.splitlines()) == 1, message
    assert f"{file}: {path}: " in message and fragment in message, message
    assert len(message.replace(str(file.parent), "")) <= 160, message  # one line at a glance, paths aside


@pytest.mark.parametrize("case", [*sorted(REFUSED), *(pytest.param(case, marks=needs_data)
                                                       for case in sorted(REFUSED_ON_DATA))])
def test_validate_refuses_what_building_refuses(case, tmp_path):
    problem, algorithms, federation, path, fragment = {**REFUSED, **REFUSED_ON_DATA}[case]
    file = tmp_path / "recipe.yaml"
    file.write_text(recipe_text(problem, algorithms, federation))
    assert_refused(invoke("validate", file), file, path, fragment)
    assert_refused(invoke("run", file, "--no-track"), file, path, fragment)


@needs_data
def test_missing_data_files_are_refused_naming_the_file(tmp_path):
    file = tmp_path / "recipe.yaml"
    file.write_text(recipe_text(f"{{name: emnist, data_dir: {tmp_path / 'nowhere'}}}", "{fedavg: {}}"))
    expected = tmp_path / "nowhere" / "femnist" / "femnist_sample10.npz"
    assert_refused(invoke("validate", file), file, "problem.data_dir", f"{expected}: no such file")


def test_per_fedavg_whose_batches_fit_validates_and_builds(tmp_path):
    """The batches a run draws are the ones checked: FO's (inner, outer), not the federation's unused batch_size."""
    file = tmp_path / "recipe.yaml"
    file.write_text(recipe_text(SMALL_LASSO, "{per_fedavg: {variant: fo, inner_batch: 20, outer_batch: 20}}",
                                "{rounds: 1, clients_per_round: 4, batch_size: 50}"))
    assert invoke("validate", file).exit_code == 0
    assert invoke("run", file, "--no-track").exit_code == 0


# -- sweep and tune refuse before Ray and MLflow ----------------------------------------------------------------

def cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "FEDBENCH_DATA": str(DATA)}, timeout=300)


def assert_refused_before_tracking(proc, file: Path, store: Path, path: str, fragment: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = (proc.stdout + proc.stderr).strip()
    assert "Traceback" not in message and len(message.splitlines()) == 1, message
    assert f"{file}: {path}: " in message and fragment in message, message
    assert not store.exists() and not list(store.parent.glob("*.db")), "the MLflow store was touched"


@needs_data
@pytest.mark.parametrize("command", ["sweep", "tune"])
def test_sweep_and_tune_refuse_before_ray_and_mlflow(command, tmp_path):
    file = tmp_path / "bad.yaml"
    file.write_text(recipe_text("{name: emnist}", "{fedavg: {client_lr: 0.1}}", "{rounds: 2, clients_per_round: 400}")
                    + "tune: {space: {client_lr: {log_uniform: [1.0e-3, 1.0]}}, metric: objective, trials: 2}\n")
    store = tmp_path / "x" / "mlflow.db"
    proc = cli(command, file, "--tracking-uri", f"sqlite:///{store}", cwd=tmp_path)
    assert_refused_before_tracking(proc, file, store, "federation.clients_per_round", "the problem's 358 clients")


def test_sweep_of_missing_data_is_refused_before_ray_and_mlflow(tmp_path):
    file = tmp_path / "bad.yaml"
    file.write_text(recipe_text(f"{{name: emnist, path: {tmp_path / 'gone.npz'}}}", "{fedavg: {}}"))
    store = tmp_path / "x" / "mlflow.db"
    proc = cli("sweep", file, "--tracking-uri", f"sqlite:///{store}", cwd=tmp_path)
    assert_refused_before_tracking(proc, file, store, "problem.path", f"{tmp_path / 'gone.npz'}: no such file")


# -- command-line options obey their recipe fields' rules ------------------------------------------------------

@pytest.fixture
def small(tmp_path) -> Path:
    file = tmp_path / "small.yaml"
    file.write_text(recipe_text(SMALL_LASSO, "{fedmid: {}}"))
    return file


@pytest.mark.parametrize("args, option, fragment", [
    (["run", "--no-track", "--seed", "-1"], "--seed", "found -1, expected an integer >= 0"),
    (["run", "--no-track", "--seed", "3", "--seed", "-2"], "--seed", "found -2, expected an integer >= 0"),
    (["run", "--no-track", "--device", "tpu"], "--device", "found 'tpu', expected auto, cpu or cuda[:N]"),
    (["sweep", "--max-concurrent", "0"], "--max-concurrent", "found 0, expected"),
    (["sweep", "--device", "gpu"], "--device", "found 'gpu', expected auto, cpu or cuda[:N]"),
])
def test_options_obey_the_rules_of_their_recipe_fields(small, args, option, fragment):
    result = invoke(args[0], small, *args[1:])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "Traceback" not in message and len(message.splitlines()) == 1, message
    assert f"{small}: {option}: " in message and fragment in message, message


@pytest.mark.parametrize("option, value", [("--rerun-best", "-1"), ("--device", "gpu")])
def test_tune_options_obey_the_rules_of_their_recipe_fields(small, option, value):
    small.write_text(small.read_text() + "tune: {space: {client_lr: {log_uniform: [1.0e-3, 1.0]}}, metric: objective}\n")
    result = invoke("tune", small, option, value)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert f"{small}: {option}: found {value if value.startswith('-') else repr(value)}" in result.output, result.output


# -- property: what validates, builds ---------------------------------------------------------------------------

def generated_problem(rng: random.Random) -> dict:
    """A small problem of every kind that builds in milliseconds, its sizes at and around their bounds."""
    kinds = ["lasso", "lowrank", "pauc", "pfl_synthetic"]
    kind = rng.choice(kinds + ["pfl_images"] if (DATA / "fashion-mnist").is_dir() else kinds)  # its pool: 0.5 s once
    small = rng.randint
    if kind == "lasso":
        dim = small(1, 8)
        return {"name": kind, "clients": small(1, 5), "samples_per_client": small(1, 45), "dim": dim,
                "support": small(0, dim + 1), "personal_support": small(0, 2), "intercept": rng.random() < 0.3,
                "test_samples_per_client": rng.choice([0, 3])}
    if kind == "lowrank":
        rows, cols = small(1, 4), small(1, 4)
        return {"name": kind, "clients": small(1, 5), "samples_per_client": small(1, 45), "rows": rows, "cols": cols,
                "rank": small(0, min(rows, cols) + 1), "personal_value": rng.choice([0.0, 0.25])}
    if kind == "pauc":
        return {"name": kind, "clients": small(0, 4), "positives_per_client": small(1, 4),
                "negatives_per_client": small(1, 8), "features": small(2, 4), "test_size": small(6, 30),
                "val_size": small(0, 12), "pooled": rng.random() < 0.2, "task": rng.choice(["pauc", "auc"]),
                "model": rng.choice(["linear", "mlp"]), "hidden": 3}
    if kind == "pfl_synthetic":
        preset = rng.choice(["s1", "s2"])
        return {"name": kind, "preset": preset, "objective": rng.choice(["ews", "mx2", "mt2"] if preset == "s1" else ["ews"])}
    return {"name": kind, "devices": small(1, 4), "classes": small(1, 3), "train": small(1, 45), "test": small(0, 5)}


def near_bounds(rng: random.Random, param):
    """A value of `param` at or inside its declared range, or now and then just outside it (which validation
    refuses)."""
    if param.kind in ("choice", "bool"):
        return rng.choice(list(param.choices) if param.kind == "choice" else [True, False])
    if param.kind == "str":
        return param.default
    if param.kind in ("floats", "ints"):
        return [rng.choice([1, 2, 0.5, 3]) for _ in range(rng.randint(1, 3))]
    low = param.low if param.low is not None else -1
    outside = rng.random() < 0.15
    if param.kind == "int":
        return low - 1 if outside else rng.choice([low, low + 1, rng.randint(max(low, 1), 50)])
    if outside:
        return param.low if param.low_open else low - 0.5
    inside = [0.5 * (low + param.high)] if param.high is not None else [low + 1e-3, low + 0.5, low + 10.0]
    return rng.choice([param.default if param.default is not None else inside[0], *inside])


def generated_recipe(rng: random.Random) -> dict:
    problem = generated_problem(rng)
    cls = PROBLEMS[problem["name"]]
    try:
        provided = cls.capabilities(cls.resolve_config({k: v for k, v in problem.items() if k != "name"}))
    except ValueError:  # a value out of range: validation refuses it whatever the algorithm
        provided = set()
    names = sorted(ALGORITHMS)
    # mostly algorithms the problem can run (else validation refuses them, which says nothing about building)
    runnable = [n for n in names if ALGORITHMS[n].requirements(
        {p.name: p.default for p in ALGORITHMS[n].hparams}) <= provided]
    algorithms = {}
    for name in rng.sample(runnable or names, min(2, len(runnable or names))):
        params = ALGORITHMS[name].hparams
        hps = {p.name: near_bounds(rng, p) for p in rng.sample(params, min(len(params), rng.randint(0, 4)))}
        if name == "pfedfbe":  # λ > L needs the built data's Hessians at w₀: the one rule left to the run's start
            hps["allow_small_lambda"] = True
        algorithms[name] = hps
    clients = problem.get("clients", problem.get("devices", 20))
    federation = {"rounds": rng.randint(0, 2), "clients_per_round": rng.randint(0, (clients or 3) + 1),
                  "local_steps": rng.randint(1, 3), "batch_size": rng.randint(1, 50)}
    return {"problem": problem, "federation": federation, "algorithms": algorithms, "eval_every": 1}


def test_what_validates_builds():
    """For a few hundred generated recipes (random problems, algorithms, hyperparameters at and around their
    bounds, federation sizes): validation's ok means building every run, as `fedbench run` and `sweep` build it,
    refuses nothing."""
    rng = random.Random(27)
    accepted = refused = 0
    for case in range(400):
        raw = generated_recipe(rng)
        try:
            recipe = parse(raw, f"generated-{case}.yaml")
            recipe.check_builds()
        except RecipeError:
            refused += 1
            continue
        accepted += 1
        for trial in recipe.trials():
            try:
                build_simulation(trial, "cpu")
            except Exception as err:  # noqa: BLE001 - any refusal breaks the property
                pytest.fail(f"case {case} validated but building {trial.algorithm} refused: {err}\n"
                            f"{yaml.safe_dump(raw, default_flow_style=True)}")
    assert accepted >= 60 and refused >= 60, (accepted, refused)


REAL_DATA_CONFIGS = {  # per problem on real data, a draw of the parameters that decide its clients
    "emnist": lambda rng: {"classes": rng.choice([10, 62]), "min_train": rng.choice([1, 10, 150, 300, 10**5]),
                           "min_test": rng.choice([0, 1, 30, 10**4])},
    "pauc": lambda rng: {"preset": "guo2023_femnist", "clients": rng.choice([0, 1, 16, 358, 360, 361]),
                         "positive_classes": rng.choice([[0], [0, 1, 2, 3, 4], [61], list(range(62))]),
                         "positive_ratio": rng.choice([None, 1 / 6, 0.005])},
    "digits": lambda rng: {"clients": rng.choice([1, 20, 300, 2000]), "labels_per_client": rng.choice([1, 2, 10]),
                           "per_label": rng.choice([None, 10, 60, 7000])},
    "ab_users": lambda rng: {"preset": "fallah2020_cifar10", "users": rng.choice([10, 50, 100]),
                             "a": rng.choice([2, 14, 68, 150]), "a_test": rng.choice([2, 14, 100, 200])},
    "pfl_images": lambda rng: {**dict(zip(("devices", "train", "test"), rng.choice(
                                   [(1, 1, 0), (20, 100, 300), (3, 3000, 2000), (3, 3000, 4000), (2, 5000, 1500)]))),
                               "classes": rng.choice([1, 2, 10]), "label_draw": rng.choice(["code", "paper"]),
                               "selection": rng.choice(["code", "random"])},
}


@needs_data
def test_the_cheap_check_of_real_data_is_building():
    """What validation reads of real data (their index: labels and writers, never the images) decides as building
    does: for generated configs of every problem on real data, the declared layout refuses exactly what building
    the problem refuses, and otherwise has the built problem's clients and smallest client. (The digits pool of
    ab_users and pfl_images, all of FEMNIST's digits, takes seconds to build: CIFAR-10 and Fashion-MNIST stand in.)"""
    import fedbench
    from fedbench.hparams import ParamError

    rng = random.Random(27)
    for name, draw in REAL_DATA_CONFIGS.items():
        cls = PROBLEMS[name]
        for _ in range(5):
            given = draw(rng)
            config = cls.resolve_config(given)
            try:
                cls.check(config)
                declared, refused = cls.declared_layout(config, read_data=True), None
            except ParamError as err:
                declared, refused = None, err
            try:
                built, failed = fedbench.make_problem(name, **given).layout(), None
            except ValueError as err:
                built, failed = None, err
            assert (refused is None) == (failed is None), (name, given, refused, failed)
            if refused is None:
                assert (declared.clients, declared.smallest) == (built.clients, built.smallest), (name, given)
            else:
                assert refused.message in str(failed), (name, given, refused, failed)
