"""A run's model as fedbench saves it and reads it back: every tracked run stores its final model as the MLflow
artifact `model/final.pt` (`fedbench export RUN_ID PATH` copies it out); `load_model` reads such a file, or a
run's straight from the store by its run id, and `problem_of` rebuilds the problem it was trained on.

The file is a dict that `torch.save` writes and `torch.load(..., weights_only=True)` reads back (tensors, numbers
and strings only, so that loading runs no code), format 2:

    {"format": 2, "algorithm": "fedmid", "problem": "lasso", "round": 2000, "status": "finished",
     "problem_config": {name: value},   # the problem's resolved parameters (`Problem.config`)
     "problem_seed": 7,                 # the seed its instance was built with (`Problem.seed`)
     "seed": 7,                         # the run's seed (its sampling, minibatches and initial point)
     "global": Tensor [d],              # the model the run's global metrics evaluate (`Algorithm.global_params`)
     "parameters": {name: Tensor},      # the same values in the problem's own shapes (`Problem.parameters`):
                                        # an MLP's layer1.weight [in, out], layer1.bias [out], ...; a matrix W
                                        # (and its intercept b, where the problem fits one)
     "personal": Tensor [N, d] or None, # each client's own model, for personalized methods
     "personal_left_out": str}          # why `personal` is None for a personalized method (too large), else ""

Tensors are on the CPU, in the run's dtype. `problem_of(model).evaluate(model["global"], model["personal"])` gives
the metrics of the run's last row (a test checks it). Format 1, written before the problem's settings were saved,
has no `problem_config`, `problem_seed` or `seed`; `load_model` still reads it, `problem_of` cannot rebuild its
problem.
"""
from __future__ import annotations

import importlib.metadata
import io
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import torch

if TYPE_CHECKING:
    from fedbench.engine.record import RunRecord
    from fedbench.problems import Problem

FORMAT = 2
READ = (1, 2)  # the formats `load_model` reads: 1 lacks the problem's settings and the seeds
RUN_ID = re.compile(r"[0-9a-f]{32}")  # an MLflow run id, as `fedbench show` and a sweep's console print it
PERSONAL_LIMIT = 2**24  # values of per-client models saved at most (128 MiB in float64): N·d beyond is left out
# The entry points of the store a run id is read from: a class, `store(tracking_uri, write=False).run_model(run_id,
# round_)` the bytes of the run's model. fedbench_sweeps registers its MLflow store (pyproject.toml), which the engine
# thus reads without importing it.
STORES = "fedbench.stores"


def model_state(sim: RunRecord) -> dict[str, Any]:
    """A run's model now, in the saved format (see the module's docstring)."""
    w = sim.algorithm.global_params(sim.server).detach().to("cpu", copy=True)
    personal = sim.personal_params()
    left_out = ""
    if personal is not None and personal.numel() > PERSONAL_LIMIT:
        left_out = f"{personal.numel():,} values, more than the {PERSONAL_LIMIT:,} saved at most"
        personal = None
    return {"format": FORMAT, "algorithm": sim.algorithm.name, "problem": sim.problem.name,
            "problem_config": dict(sim.problem.config), "problem_seed": sim.problem.seed, "seed": sim.seed,
            "round": sim.rounds_done, "status": sim.status, "global": w,
            "parameters": {name: value.clone() for name, value in sim.problem.parameters(w).items()},
            "personal": None if personal is None else personal.detach().to("cpu", copy=True),
            "personal_left_out": left_out}


def model_bytes(sim: RunRecord) -> bytes:
    """`model_state` as the bytes of its file."""
    buffer = io.BytesIO()
    torch.save(model_state(sim), buffer)
    return buffer.getvalue()


def load_model(source: str | Path | bytes | BinaryIO, tracking_uri: str | None = None,
               round_: int | None = None) -> dict[str, Any]:
    """A saved model: a file's path, its bytes or an open file, or a run's id (32 hex digits, as `fedbench show` and
    a sweep's console print it; a file of that name wins), read from the MLflow store as `fedbench export` reads it
    (`tracking_uri`, default `MLFLOW_TRACKING_URI`, else `./mlflow.db`): its final model, or that of round `round_`
    (`tracking.models_every`). Returns the dict `{"format": 2, "algorithm", "problem", "problem_config",
    "problem_seed", "seed", "round", "status", "global": Tensor [d], "parameters": {name: Tensor}, "personal": Tensor
    [N, d] or None, "personal_left_out": str}` (`fedbench.engine.saved`'s docstring says each), on the CPU. A file that
    is not a fedbench model raises ValueError; a run the store does not hold, or one without a saved model,
    `fedbench_sweeps.database.StoreError` (a ValueError). The store is the one fedbench_sweeps registers (`STORES`,
    `stored_model`): the engine imports nothing of it.

    Example:
        ```python
        model = fedbench.load_model("0123456789abcdef0123456789abcdef")  # a run of ./mlflow.db, by its id
        model = fedbench.load_model("final.pt")                          # fedbench export RUN_ID final.pt
        fedbench.problem_of(model).evaluate(model["global"], model["personal"])  # the metrics of its last row
        ```
    """
    if isinstance(source, str) and RUN_ID.fullmatch(source) and not Path(source).exists():
        source = stored_model(source, tracking_uri, round_)
    elif tracking_uri is not None or round_ is not None:
        raise ValueError("tracking_uri and round_ choose a run's model in the store: give a run id, not a file")
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    model = torch.load(source, map_location="cpu", weights_only=True)
    if not isinstance(model, dict) or model.get("format") not in READ:
        raise ValueError(f"not a fedbench model of format {' or '.join(map(str, READ))}: {str(source)[:200]}")
    return model


def stored_model(run_id: str, tracking_uri: str | None = None, round_: int | None = None) -> bytes:
    """The bytes of a stored run's model (`load_model`'s arguments), read by the store an installed package registers
    under the entry points `STORES` (fedbench_sweeps' MLflow store; the first by name, were there several). Without
    one, a ValueError says what to install."""
    stores = sorted(importlib.metadata.entry_points(group=STORES), key=lambda point: point.name)
    if not stores:
        raise ValueError(f"{run_id} is a run id, and no store of runs is installed to read it (entry points "
                         f"{STORES!r}: fedbench_sweeps registers MLflow's); give a model file")
    return stores[0].load()(tracking_uri, write=False).run_model(run_id, round_)


def problem_of(run: str | Path | dict[str, Any], device: str = "cpu", tracking_uri: str | None = None) -> Problem:
    """The problem a saved model was trained on, built again (its registered class, resolved parameters and seed) on
    `device`: of a model `load_model` returned, or of what it reads (a run id, a file's path). A problem that reads
    real data reads it from FEDBENCH_DATA, as the run did. A model saved before the problem's settings were (format
    1) raises ValueError.

    Example:
        ```python
        model = fedbench.load_model(run_id)
        fedbench.problem_of(model).evaluate(model["global"], model["personal"])  # the run's last row's metrics
        ```
    """
    from fedbench.problems import PROBLEMS

    model = run if isinstance(run, dict) else load_model(run, tracking_uri)
    if "problem_config" not in model:
        raise ValueError(f"a model of format {model.get('format')} ({model.get('problem')}, round "
                         f"{model.get('round')}) does not hold its problem's settings: saved before format 2")
    return PROBLEMS[model["problem"]](model["problem_config"], seed=model["problem_seed"], device=device)
