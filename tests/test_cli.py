"""`fedbench run / validate / list` end to end, and refusal of malformed recipes (exit 2, one line)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fedbench
from cli import app

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


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_run_writes_rows_equal_to_the_engine(recipe, tmp_path):
    out = tmp_path / "rows.json"
    result = invoke("run", recipe, "--algorithm", "fedmid", "--json", out)
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
                    "--set", "federation.rounds=4", "--set", "eval_every=2", "--json", out)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["round"] for r in rows] == [0, 2, 4]
    problem = fedbench.make_problem("lasso", seed=3, clients=8, samples_per_client=20, dim=30, support=10, lam=0.05)
    direct = fedbench.run("fedda", problem, rounds=4, clients_per_round=4, local_steps=3, batch_size=5,
                          eval_every=2, client_lr=1e-3)
    assert rows == direct.rows


def test_validate_and_list(recipe):
    result = invoke("validate", recipe)
    assert result.exit_code == 0 and "3 configurations × 2 seeds" in result.output
    listing = invoke("list")
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
                                   "federation.clients_per_round", "at most problem.clients = 8"),
    "batch larger than client": ("federation: {rounds: 5, clients_per_round: 4, local_steps: 3, batch_size: 50}",
                                 "federation.batch_size", "at most problem.samples_per_client = 20"),
    "unknown top-level field": ("seedz: 3", "seedz", "did you mean 'seeds'"),
    "bad seeds": ("seeds: 0", "seeds", "found 0"),
    "python tag": ("name: !!python/object/apply:os.system ['echo hacked']", "", "!!python tag is refused"),
    "bad problem param": ("problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, ar_rho: 2.0}",
                          "problem.ar_rho", "found 2.0"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_recipe_is_refused_with_the_field(case, tmp_path):
    replacement, path, fragment = BAD[case]
    key = replacement.split(":")[0]
    lines = [line for line in SMALL.splitlines() if not line.startswith(key + ":")]
    if key == "algorithms":  # drop the indented algorithm entries too
        lines = [line for line in lines if not line.startswith("  ")]
    file = tmp_path / "bad.yaml"
    file.write_text("\n".join(lines + [replacement]) + "\n")
    algorithm = ["--algorithm", "fedmid"] if "fedmid" in SMALL and key not in ("algorithms",) else []
    result = invoke("run", file, *algorithm)
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "Traceback" not in message and len(message.splitlines()) == 1, message
    assert str(file) in message and path in message and fragment in message, message


def test_malformed_yaml_names_the_line(tmp_path):
    file = tmp_path / "broken.yaml"
    file.write_text("name: x\nproblem: {name: lasso\nfederation: [\n")
    result = invoke("validate", file)
    assert result.exit_code == 2 and "malformed YAML: line" in result.output and "Traceback" not in result.output


def test_console_script_exit_code_and_no_traceback(tmp_path):
    file = tmp_path / "bad.yaml"
    file.write_text(SMALL.replace("name: lasso", "name: lasoo"))
    proc = subprocess.run([sys.executable, "-m", "cli", "run", str(file)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout and "problem.name" in proc.stderr
