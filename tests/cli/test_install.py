"""fedbench as a user installs it (`pip install .`, not editable), used from a folder that is no checkout: the
installed names are `fedbench` and `fedbench_sweeps` only (no top-level `cli` or `sweeps` to clash with another
project's), the shipped recipes are package data that `fedbench recipes` lists and `fedbench sweep NAME` runs by
name, its Ray workers importing the installed package.

The venv reuses this interpreter's installed dependencies through a .pth file (no network); the repository is
copied first, so that building it leaves nothing in the checkout. The sweep starts Ray (`ray`); the first test
builds the venv, which its recorded duration counts (`heavy`: tests/durations.json).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "cli.py", "fedbench", "sweeps", "recipes")
# bao2022_lasso shortened: 20 rounds, one seed, mc_fedda's three stages within them (five runs of a few seconds)
SHORT = ["federation.rounds=20", "seeds=1", "eval_every=10", "algorithms.mc_fedda.stage_rounds=[5,5,10]"]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would let a child see the checkout or change its output."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FEDBENCH_VERBOSE", "VIRTUAL_ENV")}
    return {**env, "COLUMNS": "200", **extra}


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("install")
    source = base / "src"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        else:
            shutil.copy(ROOT / name, source / name)
    env = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, env=clean_env()).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))  # torch, ray, mlflow, pip
    (Path(site) / "fedbench_test_dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    installed = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                                "--no-index", "--disable-pip-version-check", str(source)],
                               capture_output=True, text=True, timeout=600, cwd=base, env=clean_env())
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return env


def run(venv: Path, where: Path, *command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """A program of the venv (`fedbench`, `python`) run in the empty folder `where`, PYTHONPATH unset."""
    where.mkdir(exist_ok=True)
    return subprocess.run([str(venv / "bin" / command[0]), *command[1:]], cwd=where, env=clean_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_only_fedbench_and_fedbench_sweeps_are_installed(venv, tmp_path):
    found = run(venv, tmp_path, "python", "-c", "import fedbench, fedbench_sweeps.cli; print(fedbench.__file__, "
                "fedbench_sweeps.__file__)")
    assert found.returncode == 0, found.stderr
    site = Path(found.stdout.split()[0]).parents[1]
    assert site.is_relative_to(venv), found.stdout  # the installed copy, not the checkout's
    for name in ("cli", "sweeps"):
        missing = run(venv, tmp_path, "python", "-c", f"import {name}")
        assert missing.returncode != 0 and "ModuleNotFoundError" in missing.stderr, (name, missing.stderr)
    # every module of the checkout's packages is installed, and every recipe and data file beside them
    for package, installed in (("fedbench", "fedbench"), ("sweeps", "fedbench_sweeps"),
                               ("recipes", "fedbench_sweeps/recipes")):
        for path in (ROOT / package).rglob("*"):
            if path.suffix in (".py", ".yaml", ".json") and "__pycache__" not in path.parts:
                assert (site / installed / path.relative_to(ROOT / package)).is_file(), path


def test_fedbench_recipes_lists_the_installed_recipes(venv, tmp_path):
    listed = run(venv, tmp_path, "fedbench", "recipes")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "papers/bao2022_lasso" in listed.stdout and "5 × 3 = 15" in listed.stdout, listed.stdout
    assert str(venv) in " ".join(listed.stdout.split()), listed.stdout  # the package data, not the checkout


@pytest.mark.ray
def test_a_shipped_recipe_sweeps_by_name_from_an_empty_folder(venv, tmp_path, free_tcp_port):
    """Ray's workers unpickle the trials by the installed module names (fedbench_sweeps.*). Then, as a researcher
    goes on from there (issue 47): `report` of the recipe by name without repeating the sweep's --set, and `ui`; no
    traceback anywhere, and the folder holds the store and the reports, nothing else."""
    import urllib.request

    from mlflow.tracking import MlflowClient

    work = tmp_path / "work"
    store = f"sqlite:///{work / 'mlflow.db'}"
    sets = [arg for item in SHORT for arg in ("--set", item)]
    swept = run(venv, work, "fedbench", "sweep", "papers/bao2022_lasso", *sets, "--tracking-uri", store,
                "--no-report", timeout=600)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    reported = run(venv, work, "fedbench", "report", "papers/bao2022_lasso", "--tracking-uri", store)
    assert reported.returncode == 0 and "reporting the runs of" in reported.stdout, reported.stdout + reported.stderr
    assert (work / "reports" / "bao2022-lasso" / "index.html").is_file()
    ui = subprocess.Popen([str(venv / "bin" / "fedbench"), "ui", "papers/bao2022_lasso", "--tracking-uri", store,
                           "--port", str(free_tcp_port)], cwd=work, env=clean_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        # said at once, then the links once the server answers (no deadline: under load it took over a minute); a
        # line read, not the rest, in the message: the rest is there only once the UI has stopped
        starting, links = ui.stdout.readline(), ui.stdout.readline()
        assert starting.startswith("starting the MLflow UI server on 127.0.0.1:"), starting + links
        assert links.startswith("runs:"), starting + links
        with urllib.request.urlopen(f"http://127.0.0.1:{free_tcp_port}/health", timeout=5) as response:
            assert response.status == 200
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)
    for output in (swept.stdout, swept.stderr, reported.stdout, reported.stderr, ui.stdout.read()):
        assert "Traceback" not in output, output
    assert sorted(path.name for path in work.iterdir()) == ["mlartifacts", "mlflow.db", "reports"]
    assert "fedbench ui papers/bao2022_lasso" in swept.stdout, swept.stdout  # the command to browse, by name
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("bao2022-lasso")
    runs = client.search_runs([experiment.experiment_id], "tags.role = 'trial'")
    assert sorted(run.data.tags["algorithm"] for run in runs) == sorted(
        ["fedmid", "fedda", "fast_fedda", "c_fedda", "mc_fedda"])
    assert {run.info.status for run in runs} == {"FINISHED"}
    sweeps = client.search_runs([experiment.experiment_id], "tags.role = 'sweep'")
    assert all(run.data.tags["recipe"].startswith(str(venv)) for run in sweeps), "the sweep read the installed recipe"
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert {run.data.tags["git_commit"] for run in sweeps} == {f"fedbench {version}"}  # not some repository's commit

    refused = run(venv, tmp_path / "work", "fedbench", "validate", "papers/bao2022_laso")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "closest: papers/bao2022_lasso" in refused.stderr and len(refused.stderr.splitlines()) == 1, refused.stderr
