"""One run, fully specified: `Trial` (a problem instance, one algorithm with one value per hyperparameter, a
federation, a seed), its `stable_hash`ed configuration, and the federation's declared parameters
(`FEDERATION_PARAMS`: the engine's, plus a budget of local iterations instead of rounds).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedbench.algorithms import ALGORITHMS
from fedbench.axes.privacy import ACCOUNTANTS
from fedbench.axes.registry import in_federation
from fedbench.engine.federation import DIVERGENCE_FACTOR, Federation
from fedbench.hparams import Param, PerRound
from fedbench.metrics import ENGINE_COLUMNS, Metric, epsilon_metric
from fedbench.plugins import Source, is_file
from fedbench.problems import PROBLEMS


@dataclass(frozen=True)
class Trial:
    """One fully specified run: a problem instance, one algorithm with one value per hyperparameter, a seed."""
    recipe: str
    problem: str
    problem_config: dict[str, Any]
    algorithm: str
    hyperparameters: dict[str, Any]
    federation: Federation
    seed: int
    eval_every: int
    device: str
    divergence_factor: float = DIVERGENCE_FACTOR
    # the code of its algorithm and problem where they are plugins (`fedbench.plugins`)
    plugins: tuple[Source, ...] = ()
    models_every: int = 0  # its model stored every this many rounds beside the final one (not in its config: it
    # changes what is stored, not the run)
    # the recipe's `privacy.delta` where its uplink adds DP-FedAvg's noise (its rows' `epsilon` is ε at it), else None
    delta: float | None = None
    compile: str = "auto"  # whether its local steps run compiled (`engine.compiling`; not in its config: as the
    # device, it changes how the run is computed, its numbers only by rounding)
    accountant: str = ACCOUNTANTS[0]  # the recipe's `privacy.accountant`: what computes its rows' ε (with a δ only)
    # code its problem's config names, carried to the worker (a network file: `Problem.carried_code`); its sha256 is
    # in the config (`Problem.code_hashes`)
    code: tuple[Source, ...] = ()

    def config(self) -> dict[str, Any]:
        """Everything that determines the run except the seed (and the device it runs on, and whether its steps are
        compiled), as data: a schedule as the recipe writes it (a mapping, `PerRound.as_config`); for a plugin's
        run, the sha256 of the plugin's code too, so that an edited plugin's runs run again (a built-in's config is
        as it was), and of a file its problem names (a network: `Problem.code_hashes`), that file by its name alone.
        A run accounted at a δ has it as `privacy.delta`, and its accountant as `privacy.accountant`:
        neither changes an iterate, but both every row's `epsilon`, and a store that holds the curve of a config must
        hold the curve at its δ by its accountant (as `eval_every` changes only which rows there are); a run without
        noise is recorded (and hashed) as before privacy existed."""
        hyperparameters = {k: v.as_config() if isinstance(v, PerRound) else v for k, v in self.hyperparameters.items()}
        problem = {"name": self.problem, **self.problem_config}
        config: dict[str, Any] = {"problem": problem, "federation": self.federation.config(),
                                  "algorithm": {"name": self.algorithm, **hyperparameters},
                                  "eval_every": self.eval_every, "divergence_factor": self.divergence_factor}
        if self.delta is not None:
            config["privacy"] = {"delta": self.delta, "accountant": self.accountant}
        if self.plugins:
            config["plugins"] = sorted(source.sha256 for source in self.plugins)
        code = PROBLEMS[self.problem].code_hashes(self.problem_config)  # a network's file, say
        if code:
            config["code"] = code
            # a file by its name alone: its sha256 says which code it is, and the same file in another folder (on
            # another machine) is the same run
            problem.update({field: file_named(problem[field]) for field in code})
        return config

    @property
    def config_hash(self) -> str:
        return stable_hash(self.config())

    def metrics(self) -> tuple[Metric, ...]:
        """What the run's rows hold beside `round`: the problem's declared metrics (with the `personal_` ones
        where the algorithm reports them on this problem), then the engine's columns, and `epsilon` where the run is
        accounted at a δ."""
        algorithm, problem_class = ALGORITHMS[self.algorithm], PROBLEMS[self.problem]
        personal = algorithm.reports_personal(problem_class.capabilities(self.problem_config))
        problem = problem_class.declared_metrics(self.problem_config, personal)
        privacy = (epsilon_metric(self.delta),) if self.delta is not None else ()
        return problem + algorithm.declared_metrics(self.hyperparameters) + ENGINE_COLUMNS + privacy

    def rows_logged(self) -> int:
        """The rows of the run's curve, where it does not diverge: at round 0, every `eval_every` rounds and at the
        last."""
        rounds = self.federation.rounds
        return rounds // self.eval_every + 1 + (rounds % self.eval_every != 0)

    def params(self) -> dict[str, Any]:
        """The configuration flattened to dotted names, plus the seed: what the tracker records (a schedule as it
        reads, `cosine(init=0.1, final=0.001)`)."""
        flat = {}
        for section, values in self.config().items():
            if isinstance(values, dict):
                flat.update({f"{section}.{key}": value for key, value in values.items()})
            else:
                flat[section] = values
        scheduled = {f"algorithm.{k}": v for k, v in self.hyperparameters.items() if isinstance(v, PerRound)}
        return {**flat, **scheduled, "seed": self.seed}


def file_named(spec: Any) -> Any:
    """A code spec with its file by name only (`/home/me/study/my_nets.py:Net` -> `my_nets.py:Net`); a module's
    spec as it is."""
    where, colon, name = spec.rpartition(":") if isinstance(spec, str) else ("", "", "")
    return f"{Path(where).name}:{name}" if colon and is_file(where) else spec


def metrics_of(trials: list[Trial]) -> dict[str, Metric]:
    """Every metric the runs' rows hold, by name (the first declaration of each)."""
    declared: dict[str, Metric] = {}
    for trial in trials:
        for metric in trial.metrics():
            declared.setdefault(metric.name, metric)
    return declared


def stable_hash(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


# A federation may give a budget of local iterations per client instead of rounds (rounds = iterations / K),
# so that a grid over local_steps compares methods at equal work (the FeDXL paper's K ablation).
FEDERATION_PARAMS = (*Federation.params, Param("iterations", "int", None, "instead of rounds: local iterations per "
                                               "client, rounds = iterations / local_steps", low=1))
# and the axes of the registry set under `federation:` (`fedbench.axes.registry.AXES`: the chains, the mappings, ...)
FEDERATION_NAMES = {p.name for p in FEDERATION_PARAMS} | {axis.key for axis in in_federation()}
