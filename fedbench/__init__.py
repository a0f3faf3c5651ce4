"""fedbench: batched federated optimization simulation (engine only: PyTorch, no Ray/MLflow/YAML).

    import fedbench
    problem = fedbench.make_problem("lasso", seed=0)   # the Lasso of Bao et al. (ICML 2022), §4, Figure 1
    result = fedbench.run("fedmid", problem, rounds=2000, client_lr=1e-3)
    result.final                                                            # last evaluated metrics
    curves = fedbench.run_seeds(problem, "fedmid", Federation(2000), range(30), client_lr=1e-3)  # as one program
"""
from __future__ import annotations

from typing import Any

from fedbench.algorithms import ALGORITHMS, Algorithm
from fedbench.problems import PROBLEMS, Problem, make_problem
from fedbench.saved import load_model
from fedbench.simulate import Federation, Result, Simulation, run_batch, run_seeds, simulate


def make_algorithm(name: str, problem: Problem, **hyperparameters: Any) -> Algorithm:
    return ALGORITHMS[name](problem, **hyperparameters)


def run(algorithm: str, problem: Problem, rounds: int = 100, clients_per_round: int = 10, local_steps: int = 10,
        batch_size: int = 10, aggregation: str = "uniform", seed: int | None = None, eval_every: int = 10,
        compile: str = "auto", **hyperparameters: Any) -> Result:
    federation = Federation(rounds, clients_per_round, local_steps, batch_size, aggregation)
    seed = problem.seed if seed is None else seed
    return simulate(problem, make_algorithm(algorithm, problem, **hyperparameters), federation, seed, eval_every,
                    compile=compile)


__all__ = ["ALGORITHMS", "PROBLEMS", "Federation", "Result", "Simulation", "load_model", "make_algorithm",
           "make_problem", "run", "run_batch", "run_seeds", "simulate"]
