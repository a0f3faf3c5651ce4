"""Executors: turn a Trial into a running simulation (in-process here; on Ray Tune in `sweep`)."""
from __future__ import annotations

import torch

from fedbench.algorithms import ALGORITHMS
from fedbench.problems import PROBLEMS
from fedbench.simulate import Simulation
from sweeps.recipe import Trial


def resolve_device(requested: str) -> str:
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {requested!r} requested but CUDA is not available on this machine")
    return requested


def build_simulation(trial: Trial, device: str | None = None) -> Simulation:
    problem = PROBLEMS[trial.problem](trial.problem_config, seed=trial.seed,
                                      device=resolve_device(device or trial.device))
    algorithm = ALGORITHMS[trial.algorithm](problem, **trial.hyperparameters)
    return Simulation(problem, algorithm, trial.federation, trial.seed, trial.eval_every)
