"""`Recipe`, a recipe as validated: its grids (the problem's, the federation's, each algorithm's, with an
algorithm's own `problem:` / `federation:` entries), expanded into trials (`trials`, `single_trial`), each checked
by the rules building its run applies (`check`, `check_builds`).
"""
from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Optional

from fedbench import plugins
from fedbench.algorithms import ALGORITHMS
from fedbench.axes import privacy, registry
from fedbench.axes.participation import LocalSteps
from fedbench.axes.transforms import chain_text
from fedbench.engine import checks
from fedbench.engine.federation import Federation
from fedbench.engine.simulate import Simulation
from fedbench.hparams import ParamError, PerRound, resolve
from fedbench.metrics import Metric
from fedbench.problems import PROBLEMS
from fedbench.sources import Source
from .loading import RecipeError, closest, in_bytes
from .schema import Checkpoints, Dimension, ReportSpec, Resources, TuneSpec, is_seed
from .trials import Trial, metrics_of, stable_hash

# Runs of one recipe, whatever max_runs: building and checking each takes ~60 µs and ~2 KB here, so that validating
# this many takes seconds; a grid above it is refused from its count (`Recipe.runs`) before any trial is built.
MAX_RUNS = 100_000


@dataclass
class Recipe:
    source: str
    name: str
    problem: str
    problem_grid: dict[str, list[Any]]
    federation_grid: dict[str, list[Any]]
    algorithms: dict[str, dict[str, list[Any]]]
    seeds: list[int]
    eval_every: int
    device: str
    divergence_factor: float
    resources: Resources
    tune: Optional[TuneSpec]
    document: dict[str, Any]  # the validated YAML after overrides, as written
    dimensions: tuple[Dimension, ...] = ()  # the tune block's search space, resolved
    report: ReportSpec = field(default_factory=ReportSpec)
    overrides: dict[str, dict[str, dict[str, list[Any]]]] = field(default_factory=dict)  # algorithm -> section -> grid
    # config hashes `check_builds` has passed: the CLI checks every recipe before the first runs, and the entry points
    # it calls (`sweep.sweep`, `tuning.tune_recipe`) check again for callers from Python; the data index is read once
    built: set[str] = field(default_factory=set, repr=False, compare=False)
    checkpoints: Checkpoints = field(default_factory=Checkpoints)
    max_runs: int = 2000  # the most runs `fedbench sweep` starts without --yes
    models_every: int = 0  # `tracking.models_every`: a run's model stored every this many rounds (0: the final only)
    # the top-level axes' values as validated, by key (`fedbench.axes.registry.sections`: `privacy`, `compile`); absent:
    # default
    sections: dict[str, Any] = field(default_factory=dict)

    @property
    def delta(self) -> Optional[float]:
        """`privacy.delta`: the δ of the rows' ε in runs with DP-FedAvg's noise (None: no privacy section)."""
        section = self.sections.get("privacy")
        return None if section is None else section.delta

    @property
    def accountant(self) -> str:
        """`privacy.accountant`: what computes the rows' ε (`fedbench.axes.privacy`)."""
        section = self.sections.get("privacy")
        return privacy.ACCOUNTANTS[0] if section is None else section.accountant

    @property
    def compile(self) -> str:
        """`compile`: whether runs' local steps are compiled (`fedbench.engine.compiling`)."""
        return self.sections.get("compile", registry.COMPILE_MODES[0])

    @property
    def recipe_hash(self) -> str:
        """Of what runs: the report block only changes how results are drawn, the checkpoints block how often
        runs save their state, the tracking block what they store beside their curves, max_runs how many a sweep
        starts unasked and compile how the runs' steps are computed (their numbers only by rounding, as the device),
        so a sweep is found again (and resumed) after any of them is edited."""
        return stable_hash({key: value for key, value in self.document.items()
                            if key not in ("report", "checkpoints", "tracking", "max_runs", "compile")})

    def runs(self) -> int:
        """How many trials `trials` makes, counted from the grids' lengths without building them."""
        configurations = sum(math.prod(len(values) for grid in (*self.grids(algo), hp_grid) for values in grid.values())
                             for algo, hp_grid in self.algorithms.items())
        return configurations * len(self.seeds)

    def trials(self) -> list[Trial]:
        """The grid expanded: algorithm × problem point × federation point × hyperparameter point × seed."""
        trials = []
        for algo, hp_grid in self.algorithms.items():
            problem_grid, federation_grid = self.grids(algo)
            for problem_values, federation_values, hps in itertools.product(
                    grid_points(problem_grid), grid_points(federation_grid), grid_points(hp_grid)):
                trials += [self._trial(problem_values, federation_values, algo, hps, seed) for seed in self.seeds]
        return trials

    def single_trial(self, algorithm: str | None = None, seed: int | None = None,
                     fixed: dict[str, Any] | None = None) -> Trial:
        """The one trial `fedbench run` runs: every parameter must have exactly one value, except those
        `fixed` gives (by recipe path, e.g. `problem.lam` or `algorithms.fedmid.client_lr`; a field inside a chain
        or a schedule, as a tuned trial sets it: `sweeps.recipe.assigned`)."""
        if algorithm is None:
            if len(self.algorithms) != 1:
                raise RecipeError(self.source, "algorithms",
                                  f"the recipe compares {', '.join(self.algorithms)}; choose one with --algorithm")
            algorithm = next(iter(self.algorithms))
        if algorithm not in self.algorithms:
            raise not_run(self.source, algorithm, list(self.algorithms))
        if seed is not None and not is_seed(seed):
            raise RecipeError(self.source, "--seed", f"found {seed!r}, expected an integer >= 0 (as each of seeds)")
        fixed = fixed or {}
        problem_grid, federation_grid = self.grids(algorithm)
        sections = {"problem": problem_grid, "federation": federation_grid,
                    f"algorithms.{algorithm}": self.algorithms[algorithm]}
        chosen: dict[str, dict[str, Any]] = {}
        for section, grid in sections.items():
            chosen[section] = {}
            for key, values in grid.items():
                if f"{section}.{key}" not in fixed and len(values) != 1:
                    found, pick = values, key
                    if section == "federation" and isinstance(registry.AXES.get(key), registry.Chain):  # uplink.0.top_k
                        found, pick = [chain_text(v) for v in values], f"{key}.N.NAME"
                    elif section == "federation" and key in registry.AXES and not all(
                            isinstance(v, int) for v in values):  # a field of the mapping, or one of a list whole
                        listed = isinstance(self.document.get("federation", {}).get(key), list)
                        found, pick = [str(v) for v in values], key if listed else f"{key}.NAME"
                    raise RecipeError(self.source, f"{section}.{key}", f"found {len(values)} values {found}, "
                                      f"expected one for a single run; pick one with --set {section}.{pick}=VALUE")
                chosen[section][key] = values[0]
            for path, value in fixed.items():
                if path.startswith(section + "."):
                    chosen[section][path.removeprefix(section + ".")] = value
        return self._trial(chosen["problem"], chosen["federation"], algorithm,
                           chosen[f"algorithms.{algorithm}"], self.seeds[0] if seed is None else seed)

    def only(self, names: list[str]) -> Recipe:
        """The recipe's runs of the algorithms `names` alone (`-a NAME` of sweep and tune): the same recipe (its
        document, hash, experiment and sweep), a part of its runs. A name it does not list is refused (`not_run`)."""
        for name in names:
            if name not in self.algorithms:
                raise not_run(self.source, name, list(self.algorithms))
        return replace(self, algorithms={name: grid for name, grid in self.algorithms.items() if name in names})

    def code_sources(self) -> set[Source]:
        """The sources of the code outside fedbench that its runs use: its plugins' (problem and algorithms) and what
        its problem configurations name (a network: `Problem.carried_code`)."""
        problem = PROBLEMS[self.problem]
        named = {source for algorithm in self.algorithms for values in grid_points(self.grids(algorithm)[0])
                 for source in problem.carried_code(problem.resolve_config(values))}
        return named | {source for kind, names in (("problem", [self.problem]), ("algorithm", self.algorithms))
                        for name in names for source in plugins.sources(kind, name)}

    def grids(self, algorithm: str) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """The problem and federation grids of one algorithm: the recipe's, with the algorithm's own
        `problem:` / `federation:` entries in their place (e.g. the centralized reference on pooled data)."""
        own = self.overrides.get(algorithm, {})
        return {**self.problem_grid, **own.get("problem", {})}, {**self.federation_grid, **own.get("federation", {})}

    def _trial(self, problem_values, federation_values, algorithm, hyperparameters, seed) -> Trial:
        federation_values = dict(federation_values)
        iterations = federation_values.pop("iterations", None)
        if iterations is not None:  # a budget of local iterations: rounds = iterations / K
            steps = federation_values["local_steps"]
            if isinstance(steps, LocalSteps):
                raise RecipeError(self.source, "federation.iterations", f"found {iterations} with uneven local_steps "
                                  f"{steps}; expected rounds (a round's length varies)")
            if "rounds" in federation_values:
                raise RecipeError(self.source, "federation.iterations", f"found {iterations} with local_steps "
                                  f"{steps} and rounds; expected one of rounds and iterations")
            if iterations % steps:
                raise RecipeError(self.source, "federation.iterations", f"found {iterations} with local_steps "
                                  f"{steps}; expected a multiple of local_steps")
            federation_values["rounds"] = iterations // steps
        own, held = registry.held_axes(federation_values)
        federation = Federation(**own, axes=held)
        problem_config = PROBLEMS[self.problem].resolve_config(problem_values)
        trial = Trial(self.name, self.problem, problem_config, algorithm,
                      resolve(ALGORITHMS[algorithm].hparams, hyperparameters, algorithm, per_round=True), federation,
                      seed, self.eval_every, self.device, self.divergence_factor,
                      plugins.sources("problem", self.problem) + plugins.sources("algorithm", algorithm),
                      self.models_every, self.delta if privacy.gaussian_step(federation.uplink) is not None else None,
                      self.compile, self.accountant, PROBLEMS[self.problem].carried_code(problem_config))
        self.check(trial)
        return trial

    def check(self, trial: Trial, read_data: bool = False) -> None:
        """Refuse (RecipeError, naming the recipe field) a trial whose run building would refuse, by the rules the
        engine applies then (`fedbench.engine.checks.check_run`: the problem's and the algorithm's own, the contract
        between them, and the federation against the algorithm and the problem's clients as the config declares them,
        and with `read_data` as the index of the data does), this machine's memory (`check_memory`) and the rules of the
        recipe's top-level axes (`check_sections`)."""
        try:
            checks.check_run(PROBLEMS[trial.problem], trial.problem_config, ALGORITHMS[trial.algorithm],
                             trial.hyperparameters, trial.federation, read_data)
        except checks.Refusal as err:
            raise RecipeError(self.source, self.path(trial.algorithm, err), err.message, err.detail) from None
        self.check_memory(trial)
        self.check_sections(trial)

    def path(self, algorithm: str, refusal: checks.Refusal) -> str:
        """A refusal's field in the runs of `algorithm`: a problem's or federation's field in its own entry if it has
        one (`field`)."""
        if refusal.section in ("problem", "federation"):
            return self.field(algorithm, refusal.section, refusal.name)
        return refusal.path

    def check_sections(self, trial: Trial) -> None:
        """Refuse a trial that the rules of the recipe's top-level axes (`fedbench.axes.registry.sections`: privacy
        accounting where the uplink adds DP-FedAvg's noise, the compile mode) refuse with its federation, at the field
        they name (a field of the federation in the algorithm's own entry where it has one, `field`)."""
        for axis in registry.sections():
            try:
                axis.check(self.sections.get(axis.key), trial.federation)
            except ParamError as err:
                section, _, name = err.name.partition(".")
                path = self.field(trial.algorithm, section, name) if section == "federation" else err.name
                raise RecipeError(self.source, path, err.message) from None

    def check_builds(self, trials: list[Trial] | None = None) -> None:
        """`check` every distinct configuration of `trials` (default: the recipe's) with the index of its data
        read: what `validate`, `run`, `sweep` and `tune` do before anything runs (before Ray starts, or the
        tracking store is touched), so that what building a run would refuse is refused first, with its field. A
        configuration with a schedule is built too (`check_schedules`)."""
        problems: dict[str, Any] = {}
        for trial in self.trials() if trials is None else trials:
            if trial.config_hash not in self.built:
                self.check(trial, read_data=True)
                if any(isinstance(value, PerRound) for value in trial.hyperparameters.values()):
                    self.check_schedules(trial, problems)
                self.built.add(trial.config_hash)

    def check_schedules(self, trial: Trial, problems: dict[str, Any]) -> None:
        """Refuse a trial whose algorithm reads a hyperparameter that follows a schedule where it holds one value for
        the whole run (`derive`, or `self.hp` in `init_server` and `init_clients`): its run built, on the CPU, on one
        problem instance per problem configuration (`problems`, by hash), as only the algorithm's code can say
        what it reads."""
        key = stable_hash(trial.config()["problem"])
        try:
            if key not in problems:
                problems[key] = PROBLEMS[trial.problem](trial.problem_config, seed=trial.seed, device="cpu")
            algorithm = ALGORITHMS[trial.algorithm](problems[key], **trial.hyperparameters)
            Simulation(problems[key], algorithm, trial.federation, trial.seed)
        except ParamError as err:
            if err.name in trial.hyperparameters:
                raise RecipeError(self.source, f"algorithms.{trial.algorithm}.{err.name}", err.message) from None
            raise RecipeError(self.source, f"algorithms.{trial.algorithm}", str(err)) from None
        except ValueError as err:  # what else building the run refuses (pfedfbe's λ below the clients' smoothness)
            raise RecipeError(self.source, f"algorithms.{trial.algorithm}", str(err)) from None

    def caveats(self, trials: list[Trial] | None = None) -> list[str]:
        """What runs of `trials` (default: the recipe's) would do that their hyperparameters do not say
        (`Algorithm.caveats`: MC-FedDA's stages beyond the run's rounds), one line each, as `fedbench` warns of them:
        valid runs, so warned of, not refused (a shortened run is the first rounds of the full one)."""
        lines: dict[str, None] = {}
        for trial in self.trials() if trials is None else trials:
            caveats = ALGORITHMS[trial.algorithm].caveats(trial.hyperparameters, trial.federation.rounds)
            for name, message in caveats.items():
                lines[f"{self.source}: algorithms.{trial.algorithm}.{name}: {message}"] = None
        return list(lines)

    def check_memory(self, trial: Trial) -> None:
        """Refuse a run whose estimate exceeds this machine's memory: building it, or keeping its curve, would die
        allocating, at run time. The estimate is its data and state (`Problem.run_bytes`, and `Problem.state_bytes`
        where the problem estimates it: a deep network's parameters × the vectors the algorithm keeps per client,
        its activations × the batch), refused at the size parameter whose default would lower it most (the one to
        lower), and the curve it keeps whole
        (`CURVE_VALUE_BYTES` a value of each row it logs), refused at `federation.rounds` where the curve is the
        larger part (`federation.rounds: 1e12` passed)."""
        problem, config = PROBLEMS[trial.problem], trial.problem_config
        kept = len(ALGORITHMS[trial.algorithm].routing(trial.hyperparameters).keeps)
        federation = trial.federation

        def estimate(config: dict[str, Any]) -> int | None:  # the run's data and state, where the problem says
            sampled = federation.clients_per_round or problem.declared_clients(config) or 0
            parts = [problem.run_bytes(config), problem.state_bytes(config, kept, sampled, federation.batch_size)]
            return None if parts == [None, None] else sum(part or 0 for part in parts)

        data, available = estimate(config), machine_memory()
        curve = CURVE_VALUE_BYTES * (len(trial.metrics()) + 1) * trial.rows_logged()  # + 1: the row's round
        needed = (data or 0) + curve
        if available is None or needed <= available:
            return
        if data is None or curve >= data:
            raise RecipeError(self.source, self.field(trial.algorithm, "federation", "rounds"),
                              f"found {trial.federation.rounds}: a run needs ~{in_bytes(needed)} (its curve: "
                              f"{trial.rows_logged()} rows, one every {trial.eval_every} rounds), this machine has "
                              f"{in_bytes(available)}")
        defaults = {p.name: p.default for p in problem.params}
        name = min(problem.size_params, key=lambda size: estimate({**config, size: defaults[size]}) or 0)
        raise RecipeError(self.source, self.field(trial.algorithm, "problem", name), f"found {config[name]}: a run "
                          f"needs ~{in_bytes(needed)}, this machine has {in_bytes(available)}")

    def field(self, algorithm: str, section: str, name: str) -> str:
        """The path of a problem or federation parameter (or of a part of a federation's chain, `uplink.0.top_k`) in
        the runs of `algorithm`: its own entry, if it has one."""
        own = name.split(".")[0] in self.overrides.get(algorithm, {}).get(section, {})
        return f"algorithms.{algorithm}.{section}.{name}" if own else f"{section}.{name}"

    def metrics(self) -> dict[str, Metric]:
        """Every metric the recipe's runs evaluate, by name (the union over its algorithms and grid points)."""
        return metrics_of(self.trials())


# A run keeps its curve whole, each row a dict of floats: measured (tracemalloc, CPython 3.11) 803 B a row of a Lasso
# run's 16 values (its round and 15 metrics), ~50 B a value
CURVE_VALUE_BYTES = 50


@cache
def machine_memory() -> int | None:
    """This machine's memory in bytes (None where the system does not say): what a run's estimate is held to. On a
    Ray cluster it is the driver's, where a recipe is checked; a GPU run's data pass through it too."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or no such name
        return None


def not_run(source: str, algorithm: str, listed: list[str]) -> RecipeError:
    """The refusal of `-a NAME` for an algorithm the recipe does not list: which it does, and how to add a known one
    (or that none is named so, and the closest name the recipe runs)."""
    hint = (f"; --set algorithms.{algorithm}={{}} adds it" if algorithm in ALGORITHMS
            else f"; no algorithm is named {algorithm!r}{closest(algorithm, listed)}")
    return RecipeError(source, "--algorithm", f"the recipe does not run {algorithm!r}; it runs {', '.join(listed)}"
                       f"{hint}")


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
