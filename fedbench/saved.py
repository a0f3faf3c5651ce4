"""A run's model as fedbench saves it and reads it back: every tracked run stores its final model as the MLflow
artifact `model/final.pt` (`fedbench export RUN_ID PATH` copies it out, `fedbench_sweeps.load_run_model(run_id)`
reads it from the store); `load_model` reads such a file.

The file is a dict that `torch.save` writes and `torch.load(..., weights_only=True)` reads back (tensors, numbers
and strings only, so that loading runs no code), format 1:

    {"format": 1, "algorithm": "fedmid", "problem": "lasso", "round": 2000, "status": "finished",
     "global": Tensor [d],              # the model the run's global metrics evaluate (`Algorithm.global_params`)
     "parameters": {name: Tensor},      # the same values in the problem's own shapes (`Problem.parameters`):
                                        # an MLP's layer1.weight [in, out], layer1.bias [out], ...; a matrix W
                                        # (and its intercept b, where the problem fits one)
     "personal": Tensor [N, d] or None, # each client's own model, for personalized methods
     "personal_left_out": str}          # why `personal` is None for a personalized method (too large), else ""

Tensors are on the CPU, in the run's dtype. `problem.evaluate(model["global"], model["personal"])` on the run's
problem instance gives the metrics of the run's last row (a test checks it).
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import torch

if TYPE_CHECKING:  # a run's record; `fedbench.simulate` does not need this module
    from fedbench.simulate import Simulation

FORMAT = 1
PERSONAL_LIMIT = 2**24  # values of per-client models saved at most (128 MiB in float64): N·d beyond is left out


def model_state(sim: Simulation) -> dict[str, Any]:
    """A run's model now, in the saved format (see the module's docstring)."""
    w = sim.algorithm.global_params(sim.server).detach().to("cpu", copy=True)
    personal = sim.algorithm.personal_params(sim.server, sim.clients)
    left_out = ""
    if personal is not None and personal.numel() > PERSONAL_LIMIT:
        left_out = f"{personal.numel():,} values, more than the {PERSONAL_LIMIT:,} saved at most"
        personal = None
    return {"format": FORMAT, "algorithm": sim.algorithm.name, "problem": sim.problem.name,
            "round": sim.rounds_done, "status": sim.status, "global": w,
            "parameters": {name: value.clone() for name, value in sim.problem.parameters(w).items()},
            "personal": None if personal is None else personal.detach().to("cpu", copy=True),
            "personal_left_out": left_out}


def model_bytes(sim: Simulation) -> bytes:
    """`model_state` as the bytes of its file."""
    buffer = io.BytesIO()
    torch.save(model_state(sim), buffer)
    return buffer.getvalue()


def load_model(source: str | Path | bytes | BinaryIO) -> dict[str, Any]:
    """A saved model (a file's path, its bytes or an open file): the dict `{"format": 1, "algorithm", "problem",
    "round", "status", "global": Tensor [d], "parameters": {name: Tensor}, "personal": Tensor [N, d] or None,
    "personal_left_out": str}` (`fedbench.saved`'s docstring says each), on the CPU. A file that is not a fedbench
    model of this format raises ValueError.

    Example:
        ```python
        model = fedbench.load_model("final.pt")               # fedbench export RUN_ID final.pt
        problem.evaluate(model["global"], model["personal"])  # the metrics of the run's last row, on its problem
        ```
    """
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    model = torch.load(source, map_location="cpu", weights_only=True)
    if not isinstance(model, dict) or model.get("format") != FORMAT:
        raise ValueError(f"not a fedbench model of format {FORMAT}: {str(source)[:200]}")
    return model
