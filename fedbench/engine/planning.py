"""The planner: which runs form one program (`fedbench.engine.runs`), the one rule of `fedbench run`, `sweep` and
`tune`.

A program advances R ≥ 1 runs as one batched tensor program. The rule has two stages, one before the runs are built
and one after:

* Before building (`plan`), from each run's specification (`RunSpec`: what a sweep's `Trial` holds): the seeds of one
  configuration may share one problem instance, and so one program, where the problem allows it (`shares_problem`:
  its data do not follow the seed), and runs whose configurations differ only in the algorithm's float
  hyperparameters or their schedules (per-run values) may too (`program_key`); at most `cap` runs a program, split
  further so that there are at least as many programs as slots to run them in where the runs allow; a program that
  saved a checkpoint is planned again as it was, so that it resumes from it.
* After building (`groups`), from the simulations: what the engine can batch (`why_not_batchable`: one problem
  instance, one algorithm, static hyperparameters and schedule alike, one federation but for the server optimizer's
  floats; rounds of random length only where every
  client takes part, `not_iteration_wise`) and what gains from it (`one_program`: on the CPU a run whose local step
  gathers more than `MEMORY_BOUND_RUN_BYTES` is memory-bound and runs alone, unless its steps are compute-bound: a
  deep network's). Runs refused here run alone, one
  after another.

The engine code only (no Ray, MLflow or YAML): `sweeps` packs the planned programs into Ray trials.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import TYPE_CHECKING, Any, Hashable, NamedTuple, Protocol, Sequence, TypeVar

import torch
from torch import Tensor

from fedbench.algorithms.base import Algorithm
from fedbench.axes.server_optimizers import ServerOptimizer
from fedbench.hparams import PerRound
from fedbench.problems import PROBLEMS

if TYPE_CHECKING:
    from fedbench.engine.federation import Federation
    from fedbench.engine.record import RunRecord

# Bytes of minibatch rows a run gathers per local step beyond which its runs go one after another on the CPU
# (`one_program`): the step is then bound by memory traffic, which a batch does not reduce, and the batch's bookkeeping
# costs ~5%. Measured on 2 CPU cores (FedMiD, Lasso with S·b = 100 rows, R = 16): 50 KB a run 1.7x, 200 KB 1.15x,
# 800 KB (Bao et al.'s Lasso, p = 1024) 0.91-1.05x whatever the chunk size. A GPU step of that size is bound by kernel
# launches, which a batch shares: there the runs always form one program. A rule of steps that read each row once
# (linear models): a deep network's step is compute-bound whatever it gathers (`Problem.compute_bound_steps`), and
# its runs form one program on the CPU too. Measured on 2 loaded CPU cores, seeds alone over seeds in one program
# (CPU seconds, medians of 3 alternations): NIID-Bench's CNN, 10 clients × b = 64 (2 MB a step, once run alone),
# 0.97x for 2 seeds and 1.05x for 4; the built-in cnn, 10 × 10 (313 KB), 1.09x for 2.
MEMORY_BOUND_RUN_BYTES = 512 * 2**10


# -- before building: runs by their specification -------------------------------------------------------------

class RunSpec(Protocol):
    """What the planner reads of a run before it is built (a sweep's `Trial` is one: frozen, so read-only here)."""

    @property
    def problem(self) -> str: ...

    @property
    def problem_config(self) -> dict[str, Any]: ...

    @property
    def device(self) -> str: ...

    @property
    def seed(self) -> int: ...

    @property
    def federation(self) -> Federation: ...

    @property
    def config_hash(self) -> str: ...

    def config(self) -> dict[str, Any]: ...  # everything that determines the run but its seed and device


def shared(federation: Federation) -> Federation:
    """The federation as the runs of one program share it: the server optimizer's floats left out (per run)."""
    optimizer = federation.server_optimizer
    if optimizer is None:
        return federation
    kept = ServerOptimizer(optimizer.name, form="optax" if optimizer.optax else None)
    return dataclasses.replace(federation, server_optimizer=kept)


K = TypeVar("K", bound=Hashable)
R = TypeVar("R", bound=RunSpec)


class Plan(NamedTuple):
    """Which runs form one program: `programs` (two or more runs each, to be built on one problem instance) and the
    runs `alone` (in key order), each run as its (key, spec)."""
    programs: list[list[tuple[Any, Any]]]
    alone: list[tuple[Any, Any]]


def shares_problem(run: RunSpec) -> bool:
    """Whether this run's seeds can share a problem instance, and so a program (the engine refuses what it cannot
    batch once the runs are built, `why_not_batchable`, and they then run alone)."""
    return PROBLEMS[run.problem].shared_by_seeds(run.problem_config)


def program_key(run: RunSpec) -> str:
    """The configurations whose seeds may share one program: the same but for the algorithm's float hyperparameters
    and schedules (per-run values, `fedbench.engine.run_axis.batch_hparams`; a schedule is a mapping in a run's
    configuration, `PerRound.as_config`) and the server optimizer's floats (`shared`)."""
    config = run.config()
    config["algorithm"] = {k: "schedule" if isinstance(v, dict) else v for k, v in config["algorithm"].items()
                           if not isinstance(v, float)}
    config["federation"] = shared(run.federation).config()
    return json.dumps(config, sort_keys=True, default=str)


def plan(runs: Sequence[tuple[K, R]], cap: int, slots: int = 1,
         saved: Sequence[Sequence[tuple[str, int]]] = ()) -> Plan:
    """Which of `runs` ((key, spec) each) form one program: first the programs that saved a checkpoint (`saved`, their
    runs as (config hash, seed)) whose runs are all to run, as they were, so that they resume from it; then the seeds
    of each configuration that `shares_problem`, with the values of its float hyperparameters (`program_key`, on one
    device), in programs of at most `cap` runs, split further so that there are at least as many programs as
    `slots` where the runs allow; the other runs alone."""
    by_run = {(spec.config_hash, spec.seed): (key, spec) for key, spec in runs} if saved else {}
    resumed = [[by_run[run] for run in program] for program in saved
               if len(program) > 1 and all(run in by_run for run in program)]
    taken = {key for program in resumed for key, _ in program}
    together: dict[tuple[str, str], list[tuple[K, R]]] = {}
    alone = []
    for key, spec in [run for run in runs if run[0] not in taken]:
        if cap > 1 and shares_problem(spec):
            together.setdefault((program_key(spec), spec.device), []).append((key, spec))
        else:
            alone.append((key, spec))
    programs: list[list[tuple[K, R]]] = []
    for group in together.values():
        if len(group) == 1:
            alone.extend(group)
            continue
        count = min(len(group), max(math.ceil(len(group) / cap), math.ceil(slots / len(together))))
        size = math.ceil(len(group) / count)
        programs.extend(group[i:i + size] for i in range(0, len(group), size))
    return Plan(resumed + programs, sorted(alone, key=lambda run: run[0]))


# -- after building: the simulations --------------------------------------------------------------------------

class NotBatchable(ValueError):
    """These runs cannot run as one program (the message says why, `why_not_batchable`)."""


def step_bytes(sim: RunRecord) -> int:
    """Bytes of minibatch rows one local step of this run gathers."""
    federation, problem = sim.federation, sim.problem
    clients = federation.clients_per_round or problem.num_clients
    samples = sum(sim.sampler.sizes[mb.name] for mb in sim.sampler.drawn)
    itemsize = sim.server[sim.algorithm.downloads[0]].element_size()
    return clients * samples * (problem.row_elements or problem.dim) * itemsize


def random_rounds(algorithm_type: type[Algorithm]) -> bool:
    """Whether the algorithm's rounds have a drawn length (`Algorithm.round_length`)."""
    return algorithm_type.round_length is not Algorithm.round_length


def why_not_batchable(sims: Sequence[RunRecord]) -> str | None:
    """Why these simulations cannot form one program (None: they can). One simulation always can."""
    first = sims[0]
    if len(sims) > 1 and random_rounds(type(first.algorithm)) and (why := not_iteration_wise(first)):
        return why
    for sim in sims[1:]:
        if sim.problem is not first.problem:
            return "the runs must share one problem instance (the same data)"
        if type(sim.algorithm) is not type(first.algorithm):
            return "the runs must run one algorithm"
        differ = sorted(k for k in first.algorithm.declared if sim.algorithm.declared[k] != first.algorithm.declared[k])
        static = [k for k in differ if not varies_per_run(sim.algorithm.declared[k], first.algorithm.declared[k])]
        if static:
            return (f"the runs may differ only in float hyperparameters and schedules (per-run values), not in "
                    f"{', '.join(static)}")
        derived = sorted(k for k in first.algorithm.hp if k not in first.algorithm.declared
                         and fixed_part_differs(sim.algorithm.hp[k], first.algorithm.hp[k]))
        if derived:
            return (f"the runs' derived values {', '.join(derived)} differ in more than floats (per-run values): "
                    "a program holds one value of anything else")
        if (shared(sim.federation), sim.eval_every, sim.sampler.sizes, sim.divergence_factor, sim.compile) != (
                shared(first.federation), first.eval_every, first.sampler.sizes, first.divergence_factor,
                first.compile):
            return ("the runs must share the federation (but for the server optimizer's floats), batch sizes, "
                    "evaluation schedule, divergence rule and compile mode")
    if len(sims) > 1 and first.federation.uneven and first.problem.noisy_minibatches:
        # a run's round is as long as its longest count: in a batch, the steps beyond it would draw its noise
        return f"uneven local work, and {first.problem.name}'s minibatches carry noise"
    return None


def varies_per_run(a: Any, b: Any) -> bool:
    """Whether two runs' values of a hyperparameter may differ in one program: both floats, or both schedules (the
    engine evaluates each run's own at each round, `fedbench.engine.round_wise.RoundProgram._at_rounds`)."""
    return all(isinstance(v, float) for v in (a, b)) or all(isinstance(v, PerRound) for v in (a, b))


def fixed_part_differs(a: Any, b: Any, floats_per_run: bool = True) -> bool:
    """Whether two runs' values of a derived quantity (`Algorithm.derive`) differ where a program holds one value
    for all its runs (`fedbench.engine.runs`): anything but floats and a dataclass's float fields, which are per run.
    Lists, dicts and objects (e.g. MC-FedDA's regularizer per stage) are one value: compared whole, floats included."""
    if dataclasses.is_dataclass(a) and type(a) is type(b):
        return any(fixed_part_differs(getattr(a, f.name), getattr(b, f.name), floats_per_run)
                   for f in dataclasses.fields(a))
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return not (isinstance(a, Tensor) and isinstance(b, Tensor) and torch.equal(a, b))
    if isinstance(a, (list, tuple)) and type(a) is type(b):
        return len(a) != len(b) or any(fixed_part_differs(x, y, False) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() != b.keys() or any(fixed_part_differs(a[k], b[k], False) for k in a)
    if hasattr(a, "__dict__") and type(a) is type(b) and not isinstance(a, type):
        return fixed_part_differs(vars(a), vars(b), False)
    if floats_per_run and isinstance(a, float) and isinstance(b, float):
        return False
    return bool(a != b)


def not_iteration_wise(sim: RunRecord) -> str | None:
    """Why runs like this one, whose rounds have random lengths, cannot be an `IterationProgram` (None: they can)."""
    name, problem = sim.algorithm.name, sim.problem.name
    if sim.algorithm.participation != "all":
        return f"{name} has rounds of random length with sampled clients"
    if type(sim.algorithm).draws_in_steps(sim.algorithm.declared):
        return f"{name} draws inside its rounds' steps with these hyperparameters"
    if sim.problem.noisy_minibatches:  # the steps wasted on runs between rounds would draw their noise
        return f"{name} has rounds of random length, and {problem}'s minibatches carry noise"
    if not sim.problem.draws_by_step or len(sim.sampler.drawn) != 1:
        return f"{name} has rounds of random length, and {problem} does not draw one minibatch a step, step by step"
    return None


def one_program(sims: Sequence[RunRecord]) -> bool:
    """Whether these (batchable) simulations run as one program rather than one after another: more than one,
    and on a GPU, or with compute-bound steps (`Problem.compute_bound_steps`), or not memory-bound
    (`MEMORY_BOUND_RUN_BYTES`)."""
    first, problem = sims[0], sims[0].problem
    return len(sims) > 1 and (problem.device.type != "cpu" or problem.compute_bound_steps
                              or step_bytes(first) <= MEMORY_BOUND_RUN_BYTES)


def groups(sims: Sequence[RunRecord]) -> list[list[int]]:
    """The runs (indices into `sims`) of each program these simulations run in: all of them in one where they can
    share one and are not memory-bound (`one_program`), else each alone, to run one after another."""
    if why_not_batchable(sims) or not one_program(sims):
        return [[i] for i in range(len(sims))]
    return [list(range(len(sims)))]
