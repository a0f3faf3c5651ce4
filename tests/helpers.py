"""Helpers shared by several test modules, in one place: no test module imports from another (a `test_*.py` is
collected, not imported). `small_problems.py` (small instances of the shipped problems), `fingerprint_runs.py`
(the recorded runs) and `servers.py` (a PostgreSQL-backed MLflow server) are helper modules of their own.

- The run axis: `CASES`, every algorithm written for it with a small problem, a federation, hyperparameters and
  the tolerance of its batched curves against its runs alone (`tests/engine/test_runs.py`, `test_checkpoints.py`,
  `test_gpu.py`); `curves_alone`, `rows_by_run`, `assert_same`.
- Refusals: `refused`, a command's one-line refusal (`tests/cli/test_refusals.py`, `test_schedules.py`).
- Checkpoints: `build` (a program of seeds), `rows_of` (its rows by run), `interrupted` (its rows when stopped at a
  safe point and resumed from the state saved there: `tests/sweeps/test_checkpoints.py`, `test_schedules.py`,
  `test_transforms.py`).
- numpy transcriptions of the lasso/low-rank problems' data, gradient and prox (`tests/algorithms/test_algorithms.py`,
  `test_fastfedda.py`), and of FedAvg's and FedMiD's rounds on a Lasso (`test_transforms.py`, `test_robust.py`).
- Data files written out: an EMNIST npz in the shipped format (`write_npz`, `npz_problem`) and an MNIST-format
  IDX folder (`write_folder`).
- `HUNG`: the one hang guard of the waits of the tests that run commands (sweeps, runs) as subprocesses.
- `deviation_holds`: a paper-size test's check of a paper claim that does not reproduce, against its declaration
  in `sweeps/deviations.py`.
"""
from __future__ import annotations

import gzip
import importlib.util
import io
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import fedbench
from fedbench.data import femnist, idx
from fedbench.engine.runs import programs
from fedbench.engine.simulate import Federation, Simulation
from fedbench.rng import generator
from small_problems import small_lasso, small_lowrank
from sweeps.deviations import DEVIATIONS

# -- a hang guard -----------------------------------------------------------------------------------------------

# Seconds after which a command a test runs (a sweep, a run), or a wait for what it does, is taken for hung: a guard
# against a hang, not a speed bound, so never a wait whose length a test asserts. Generous: a sweep of
# tests/sweeps/test_sweep_concurrency.py took over 400 s on a loaded 2-core CI machine (load average 9-14), which
# missed guards of 120-400 s there.
HUNG = 1800

# -- the run axis ------------------------------------------------------------------------------------------------

SEEDS = [0, 3, 7, 11]


def pfl(**config):
    return fedbench.make_problem("pfl_synthetic", preset="s1", sigma_h=1.0, **config)


def pauc(**config):
    return fedbench.make_problem("pauc", seed=0, clients=4, positives_per_client=10, negatives_per_client=50,
                                 features=6, test_size=600, **config)


PAIRS = Federation(8, 3, 4, 8)
# pAUC is float32: the losses agree within ~2e-7 relative; a (p)AUC is a count of ranked pairs, which a near tie
# flipped by the last bit moves by one pair's weight (1/(P·N) ~ 1e-4 on the pooled problem): absolute 1e-3 there
FLOAT32 = (5e-5, 1e-3)


SAMPLED = Federation(12, 3, 4, 5)
SMALL_BATCHES = {"inner_batch": 5, "outer_batch": 5, "hessian_batch": 5}
CASES = {  # algorithm[:case]: (problem maker, taking `device=`, federation, hyperparameters, tolerance)
    "fedavg": (small_lasso, SAMPLED, {"client_lr": 0.01}, 1e-12),
    "fedmid": (small_lasso, SAMPLED, {"client_lr": 0.01}, 1e-12),
    "fedprox": (small_lasso, SAMPLED, {"client_lr": 0.01}, 1e-12),
    "ditto": (small_lasso, SAMPLED, {"client_lr": 0.01}, 1e-12),
    "fedda": (small_lasso, SAMPLED, {"client_lr": 0.01}, 1e-12),
    "fedda:lowrank": (small_lowrank, SAMPLED, {"client_lr": 0.01}, 1e-12),
    "fast_fedda": (small_lasso, SAMPLED, {}, 1e-12),
    "fast_fedda:lowrank": (small_lowrank, SAMPLED, {}, 1e-12),
    "c_fedda:ball": (small_lasso, SAMPLED, {"radius": 0.5}, 1e-12),
    "c_fedda:lowrank": (small_lowrank, SAMPLED, {"radius": 0.5}, 1e-12),
    "mc_fedda": (small_lasso, SAMPLED, {"stage_rounds": [4, 4, 4], "stage_lams": [0.1, 0.05, 0.02],
                                                  "stage_radii": [1.0, 0.5, 0.2]}, 1e-12),
    "pfedfbe": (small_lasso, SAMPLED, {"lam": 200.0}, 1e-12),
    "pfedfbe:last_local": (small_lasso, SAMPLED, {"lam": 200.0, "personal_point": "last_local",
                                                            "hvp_batch": "independent"}, 1e-12),
    # a finite difference divides the last-bit differences of two gradients by τ ~ 1e-8: ~1e-11 on the curves
    "pfedfbe:finite_diff": (small_lasso, SAMPLED, {"lam": 200.0, "hvp": "finite_diff"}, 1e-9),
    "per_fedavg": (small_lasso, SAMPLED, SMALL_BATCHES, 1e-12),
    "per_fedavg:exact": (small_lasso, SAMPLED, {"variant": "exact", **SMALL_BATCHES}, 1e-12),
    "per_fedavg:fo": (small_lasso, SAMPLED, {"variant": "fo", **SMALL_BATCHES}, 1e-12),
    "lsgd_pfl": (pfl, Federation(12, 0, 5, 1), {}, 0.0),
    "ascd_pfl": (pfl, Federation(12, 0, 1, 1), {}, 1e-12),
    "l2sgd_plus": (pfl, Federation(12, 0, 1, 1), {}, 1e-12),
    "asvrcd_pfl": (pfl, Federation(12, 0, 1, 1), {"rho": 0.05}, 1e-12),  # refreshes exercised
    "acd_pfl": (pfl, Federation(12, 0, 1, 1), {}, 1e-12),
    "scd_pfl": (pfl, Federation(12, 0, 1, 1), {}, 1e-12),
    "svrcd_pfl": (pfl, Federation(12, 0, 1, 1), {"rho": 0.05}, 1e-12),
    "acd_pfl:keep": (pfl, Federation(12, 0, 1, 1), {"unsampled_y": "keep"}, 1e-12),
    "pfedme": (pfl, Federation(12, 0, 4, 5), {"lam": None, "client_lr": 0.005, "personal_lr": 1.0}, 1e-12),
    "pfedme:sampled": (small_lasso, Federation(12, 3, 3, 5), {"client_lr": 0.005}, 1e-12),
    # the pair-score methods of FeDXL (Guo et al. 2023): each run's feature noise and passive draws on its own streams
    "fedxl2": (pauc, PAIRS, {"client_lr": 0.5}, FLOAT32),
    "fedxl2:mlp": (lambda **device: pauc(model="mlp", hidden=5, **device), PAIRS,
                   {"client_lr": 0.5, "average_momentum": False}, FLOAT32),
    "fedxl1": (lambda **device: pauc(preset="guo2023_noisy_auc", **device), PAIRS, {"client_lr": 2.0}, FLOAT32),
    "local_pair": (pauc, PAIRS, {"client_lr": 0.5}, FLOAT32),
    "codasca": (pauc, PAIRS, {"client_lr": 0.5, "decay_every": 8}, FLOAT32),  # a stage ends at round 2
    "centralized": (lambda **device: pauc(pooled=True, **device), Federation(8, 1, 4, 8), {"client_lr": 0.5}, FLOAT32),
    "local_sgd_ce": (pauc, PAIRS, {"client_lr": 0.5}, FLOAT32),
}


def curves_alone(problem, name, federation, hp, seeds, eval_every=3):
    return [list(Simulation(problem, fedbench.make_algorithm(name, problem, **hp), federation, seed, eval_every))
            for seed in seeds]


def rows_by_run(batch, runs: int) -> list[list[dict]]:
    """A batch's (run index, row) stream as one curve per run."""
    curves = [[] for _ in range(runs)]
    for i, row in batch:
        curves[i].append(row)
    return curves


def assert_same(alone, batched, tolerance):
    """Equal curves within `tolerance` relative, or (relative, absolute for the (p)AUC counts of ranked pairs)."""
    tolerance, pairs = tolerance if isinstance(tolerance, tuple) else (tolerance, None)
    assert len(alone) == len(batched)
    for a, b in zip(alone, batched):
        assert [row["round"] for row in a] == [row["round"] for row in b]
        for x, y in zip(a, b):
            assert x.keys() == y.keys()
            for key in x:
                if math.isnan(x[key]):
                    assert math.isnan(y[key]), key
                elif pairs is not None and "auc" in key:
                    assert abs(x[key] - y[key]) <= pairs, (key, x[key], y[key])
                else:
                    assert abs(x[key] - y[key]) <= tolerance * max(abs(x[key]), 1e-300), (key, x[key], y[key])


# -- checkpoints ------------------------------------------------------------------------------------------------

class Stop(Exception):
    """The kill: raised from the safe point after the checkpoint was taken."""


def build(problem, name, federation, hp, seeds):
    sims = [Simulation(problem, fedbench.make_algorithm(name, problem, **hp), federation, seed, 3) for seed in seeds]
    [(runs, program)] = programs(sims)  # one program for the batch (or the run alone)
    return program


def rows_of(program, rows=None):
    """A program's rows, one list per run (appended to `rows`, the rows a resumed program's runs had before)."""
    rows = rows if rows is not None else [[] for _ in program.sims]
    for i, row in program:
        rows[i].append(row)
    return rows


def interrupted(make_program, at: int, edit=lambda state: None):
    """The rows of a program stopped at its `at`-th safe point, then resumed from the checkpoint taken there by a
    program built anew (through `torch.save`, as a checkpoint file holds it; `edit` given the program's saved state
    first), and its runs' statuses."""
    program, rows, saved, count = make_program(), None, io.BytesIO(), [0]

    def safe_point(program):
        count[0] += 1
        if count[0] == at:
            torch.save({"program": program.state_dict(), "rows": rows}, saved)
            raise Stop

    rows = [[] for _ in program.sims]
    program.safe_point = safe_point
    with pytest.raises(Stop):
        rows_of(program, rows)
    saved.seek(0)
    checkpoint = torch.load(saved, weights_only=False)
    again = make_program()
    edit(checkpoint["program"])
    again.load_state_dict(checkpoint["program"])
    return rows_of(again, checkpoint["rows"]), [sim.status for sim in again.sims]


# -- the CLI ----------------------------------------------------------------------------------------------------

def invoke(*args):
    """`fedbench ARGS` in this process (Typer's runner), FEDBENCH_VERBOSE unset for the call and restored after it:
    `-v` sets it in this process's environment."""
    from typer.testing import CliRunner

    from cli import app

    return CliRunner().invoke(app, [str(a) for a in args], env={"FEDBENCH_VERBOSE": None})


# -- refusals ---------------------------------------------------------------------------------------------------

def refused(result, *expected: str) -> str:
    """The refusal's first line, after checking exit 2, no traceback and the expected phrases in that line."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    first = result.output.splitlines()[0]
    for phrase in expected:
        assert phrase in first, (phrase, result.output)
    return first


# -- numpy transcriptions of the lasso and low-rank problems ------------------------------------------

def initial_point(problem, seed):
    return problem.init_params(generator(seed, "init")).numpy()


def client_data(problem):
    n = problem.num_clients
    x = problem.features.numpy().reshape(n, -1, problem.dim)
    y = problem.labels.numpy().reshape(n, -1)
    return x, y


def full_gradient(x, y, w):
    """Mean over clients of each client's mean gradient of ½(xᵀw − y)²."""
    return np.mean([xk.T @ (xk @ w - yk) / len(yk) for xk, yk in zip(x, y)], axis=0)


def np_soft(v, tau, size):
    out = v.copy()
    out[:size] = np.sign(v[:size]) * np.maximum(np.abs(v[:size]) - tau, 0.0)
    return out


def np_svt(v, tau, shape):
    u, s, vt = np.linalg.svd(v.reshape(shape), full_matrices=False)
    return (u @ np.diag(np.maximum(s - tau, 0.0)) @ vt).ravel()


def np_prox(problem, v, step):
    """prox_{step·h}(v) for the problem's regularizer, written from the definition's closed forms."""
    lam = problem.config["lam"]
    if problem.name == "lasso":
        return np_soft(v, step * lam, problem.feature_dim)
    return np_svt(v, step * lam, problem.shape)


def np_local(problem, name, start, rows, hp):
    """FedAvg's (plain gradient steps) or FedMiD's (proximal steps) local iterate on a Lasso from `start` on rows
    `[E, b]` (`tests/axes/test_transforms.py`, `test_robust.py`)."""
    features, labels = problem.features.numpy(), problem.labels.numpy()
    u, lr = start.copy(), hp["client_lr"]
    for step_rows in rows:
        x, y = features[step_rows], labels[step_rows]
        u = u - lr * x.T @ (x @ u - y) / len(step_rows)
        if name == "fedmid":
            u = np_prox(problem, u, lr)
    return u


def np_server(problem, name, w, mean, hp):
    """FedAvg's or FedMiD's server step from the clients' `mean` (or what stands for it)."""
    w = w + hp["server_lr"] * (mean - w)
    return np_prox(problem, w, hp["server_lr"] * hp["client_lr"]) if name == "fedmid" else w


# -- data files written out -------------------------------------------------------------------------------------

def grey_levels(rng, n):
    return rng.integers(0, 256, (n, femnist.PIXELS))


def write_npz(path: Path, train_sizes, test_sizes, seed=0, classes=10, drop=()):
    """An npz in the shipped format; writer k's test samples follow its train samples."""
    rng = np.random.default_rng(seed)
    sizes = np.array(train_sizes) + np.array(test_sizes)
    arrays = {
        "x": grey_levels(rng, sizes.sum()).astype(np.uint8),
        "y": rng.integers(0, classes, sizes.sum()).astype(np.uint8),
        "writer": np.repeat(np.arange(len(sizes)), sizes).astype(np.int32),
        "writer_ids": np.array([f"f{k:04d}_00" for k in range(len(sizes))]),
        "writer_offsets": np.r_[0, sizes.cumsum()].astype(np.int64),
        "is_test": np.repeat(np.tile([False, True], len(sizes)), np.column_stack([train_sizes, test_sizes]).ravel()),
    }
    np.savez_compressed(path, **{k: v for k, v in arrays.items() if k not in drop})
    return path


def npz_problem(tmp_path, train_sizes, test_sizes=None, **config):
    path = write_npz(tmp_path / "mini.npz", train_sizes, test_sizes or [2] * len(train_sizes))
    return fedbench.make_problem("emnist", path=str(path), min_train=1, **config)


def write_idx(path: Path, array: np.ndarray, magic: int, compress: bool) -> None:
    header = magic.to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    (gzip.open if compress else open)(path, "wb").write(data)


def write_folder(folder: Path, n_train=12, n_test=5, compress=True, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    arrays = {"train": (rng.integers(0, 256, (n_train, 28, 28)), rng.integers(0, 10, n_train)),
              "t10k": (rng.integers(0, 256, (n_test, 28, 28)), rng.integers(0, 10, n_test))}
    folder.mkdir(exist_ok=True)
    suffix = ".gz" if compress else ""
    for prefix, (images, labels) in arrays.items():
        write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", images, idx.IMAGES_MAGIC, compress)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", labels, idx.LABELS_MAGIC, compress)
    return arrays


# -- paper claims that do not reproduce (sweeps/deviations.py) -------------------------------------------------

def deviation_holds(key: str, measured: dict[str, float]) -> None:
    """The paper claim declared as deviation `key` still does not reproduce as declared: each measured value within
    the declaration's tolerance of the declared one, measured by the test the declaration names. Otherwise the test
    fails saying that the deviation no longer holds: update `sweeps/deviations.py` (the gallery reads it), or find
    out why the value moved; no assertion pins the old value."""
    declared = DEVIATIONS[key]
    current = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0].split("[")[0]
    assert current == declared.test, f"deviation {key!r} is declared as measured by {declared.test}, not {current}"
    unknown = set(measured) - set(declared.measured)
    assert not unknown, f"deviation {key!r} declares no value {sorted(unknown)}: {sorted(declared.measured)}"
    moved = {name: value for name, value in measured.items()
             if not abs(value - declared.measured[name]) <= declared.tolerance}
    if moved:
        pytest.fail(f"deviation {key!r} no longer holds as declared ({declared.figure}: the paper claims "
                    f"{declared.claim}; it reports {declared.reports}): "
                    + "; ".join(f"{name} measured {value:.4g}, declared {declared.measured[name]:g} ± "
                                f"{declared.tolerance:g}" for name, value in moved.items())
                    + ". If the paper's claim now reproduces, remove the deviation from sweeps/deviations.py; if "
                    "the value only moved, update it there (the gallery page shows it).", pytrace=False)


def how_to_problem(folder: Path, **config):
    """The problem of docs/how-to/write-a-problem.md (least squares with client drift), from its `my_problem.py`
    block as a reader writes it, with the page's defaults (20 clients of 50 samples, d = 10)."""
    page = (Path(__file__).parents[1] / "docs" / "how-to" / "write-a-problem.md").read_text()
    (folder / "my_problem.py").write_text(re.search(r'^```python title="my_problem.py"\n(.*?)^```', page,
                                                    re.S | re.M).group(1))
    spec = importlib.util.spec_from_file_location("my_problem", folder / "my_problem.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    defaults = {p.name: p.default for p in module.DriftingLeastSquares.params}
    return module.DriftingLeastSquares({**defaults, "data_seed": 0, **config}, 0)
