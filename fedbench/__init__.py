"""fedbench: batched federated optimization simulation (engine only: PyTorch, no Ray/MLflow/YAML).

    import fedbench
    problem = fedbench.make_problem("lasso", seed=0)   # the Lasso of Bao et al. (ICML 2022), §4, Figure 1
    result = fedbench.run("fedmid", problem, rounds=2000, client_lr=1e-3)
    result.final                                                            # last evaluated metrics
    curves = fedbench.run_seeds(problem, "fedmid", Federation(2000), range(30), client_lr=1e-3)  # as one program
    fedbench.run("fedmid", problem, rounds=2000, client_lr=Cosine(init=1e-2, final=1e-4))  # fedbench.schedules
    fedbench.run("fedmid", problem, rounds=2000, uplink=[{"top_k": 0.05}, {"error_feedback": "ef21"}])  # compressed

`run` is one run in this process; `run_seeds` runs several seeds as one batched program, each as it runs alone.
Your own algorithms and problems are registered by `fedbench.plugins` and then run by name like the built-in ones.
A float hyperparameter may follow a schedule (`fedbench.schedules`: `Cosine`, `Step`, ...), a value per round.
A stored run's model comes back with `fedbench.load_model(RUN_ID)`, its problem with `fedbench.problem_of(model)`.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from fedbench.algorithms import ALGORITHMS, Algorithm
from fedbench.axes.participation import LocalSteps, Participation
from fedbench.axes.server_optimizers import ServerOptimizer
from fedbench.engine.saved import load_model, problem_of
from fedbench.engine.simulate import Federation, Result, Simulation, run_batch, run_seeds, simulate
from fedbench.problems import PROBLEMS, Problem, make_problem


def make_algorithm(name: str, problem: Problem, **hyperparameters: Any) -> Algorithm:
    """One run's configuration of the registered algorithm `name` on `problem`: its hyperparameters by name, the
    others at their defaults, each checked (ValueError, KeyError for an unknown name), and the algorithm's
    requirements against what the problem provides (`IncompatibleError`).

    Example:
        ```python
        algorithm = fedbench.make_algorithm("fedmid", problem, client_lr=1e-3)
        ```
    """
    return ALGORITHMS[name](problem, **hyperparameters)


def run(algorithm: str, problem: Problem, rounds: int = 100, clients_per_round: int = 10,
        local_steps: int | Mapping[str, Any] = 10, batch_size: int = 10, aggregation: str = "uniform",
        seed: int | None = None, eval_every: int = 10, uplink: Sequence = (), downlink: Sequence = (),
        participation: Mapping[str, Any] | None = None, server_optimizer: Mapping[str, Any] | None = None,
        compile: str = "auto", **hyperparameters: Any) -> Result:
    """One run of the registered algorithm `algorithm` on `problem`, in this process: `Federation(rounds,
    clients_per_round, local_steps, batch_size, aggregation, uplink, downlink, participation=participation,
    server_optimizer=server_optimizer)` (the chains of transforms, the participation model, uneven local steps and the
    server optimizer as a recipe writes them, `fedbench.axes.transforms`, `fedbench.axes.participation`,
    `fedbench.axes.server_optimizers`), the run's random streams from `seed` (default: the problem's),
    a metrics row every `eval_every` rounds, its local steps compiled or not (`compile`: auto, on or off,
    `fedbench.engine.compiling`), and the algorithm's `hyperparameters` (by name; the others at their defaults).

    Returns:
        The run's `Result`: its rows, status, final global model (and personal models).

    Example:
        ```python
        problem = fedbench.make_problem("lasso", seed=0)
        result = fedbench.run("fedmid", problem, rounds=2000, client_lr=1e-3)
        result.final["objective"], result.status                    # the last row's value, 'finished'
        fedbench.run("fedmid", problem, rounds=2000, uplink=[{"top_k": 0.05}, {"error_feedback": "ef21"}])
        fedbench.run("fedavg", problem, participation={"model": "cyclic", "groups": 4},
                     local_steps={"distribution": "uniform", "low": 1, "high": 10})
        fedbench.run("scaffold", problem, server_optimizer={"name": "adam", "lr": 0.03})   # SCAFFOLD with FedAdam
        ```
    """
    steps = local_steps if isinstance(local_steps, int) else LocalSteps.given(local_steps)
    optimizer = None if server_optimizer is None else ServerOptimizer.given(server_optimizer)
    federation = Federation(rounds, clients_per_round, steps, batch_size, aggregation, tuple(uplink), tuple(downlink),
                            participation=Participation.given(participation or {}), server_optimizer=optimizer)
    seed = problem.seed if seed is None else seed
    return simulate(problem, make_algorithm(algorithm, problem, **hyperparameters), federation, seed, eval_every,
                    compile=compile)


__all__ = ["ALGORITHMS", "PROBLEMS", "Federation", "Result", "Simulation", "load_model", "make_algorithm",
           "make_problem", "problem_of", "run", "run_batch", "run_seeds", "simulate"]
