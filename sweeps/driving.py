"""In-process driving: a trial's simulation built (`build_simulation`; the seeds of one configuration on one problem
instance, `build_batch`) and run to its end in its programs (`drive_batch`, as `fedbench.engine.planning` groups them),
each run's rows handed over as they come and its `Outcome` returned. `fedbench run` drives in its own process
(`build_runs`, `drive_runs`), a Ray trial in its worker (`sweeps.worker`)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from fedbench import networks, plugins
from fedbench.algorithms import ALGORITHMS
from fedbench.engine.planning import plan
from fedbench.engine.runs import RoundProgram, programs
from fedbench.engine.saved import model_bytes
from fedbench.engine.simulate import Simulation
from fedbench.problems import PROBLEMS
from .checkpoints import Checkpoint, Policy, policy_of
from .recipe import Recipe, Trial


def resolve_device(requested: str, holds_gpu: bool = True) -> str:
    """`auto` is `cuda` when CUDA is available and the trial holds a GPU (share), else `cpu`."""
    if requested == "auto":
        return "cuda" if holds_gpu and torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {requested!r} requested but CUDA is not available on this machine")
    return requested


def build_simulation(trial: Trial, device: str | None = None, problem=None) -> Simulation:
    """The trial's simulation, on a problem instance of its own or on `problem` (one shared by seeds). A plugin's
    code is loaded first where this process (a Ray worker, maybe on another machine) has not seen it."""
    plugins.ensure(trial.plugins)
    networks.carry(trial.code)
    if problem is None:
        problem = PROBLEMS[trial.problem](trial.problem_config, seed=trial.seed,
                                          device=resolve_device(device or trial.device))
    algorithm = ALGORITHMS[trial.algorithm](problem, **trial.hyperparameters)
    return Simulation(problem, algorithm, trial.federation, trial.seed, trial.eval_every, trial.divergence_factor,
                      trial.delta, trial.compile, trial.accountant)


def build_batch(trials: list[Trial], device: str | None = None) -> list[Simulation]:
    """The simulations of the runs of one planned program (`fedbench.engine.planning.plan`) on one problem instance, for
    `drive_batch`."""
    first = trials[0]
    plugins.ensure(first.plugins)
    networks.carry(first.code)
    problem = PROBLEMS[first.problem](first.problem_config, seed=first.seed,
                                      device=resolve_device(device or first.device))
    return [build_simulation(trial, problem=problem) for trial in trials]


def build_planned(trials: list[Trial], device: str | None = None) -> list[Simulation]:
    """The simulations of a planned program (two or more runs: `build_batch`), or of a run alone."""
    return build_batch(trials, device) if len(trials) > 1 else [build_simulation(trials[0], device)]


def build_runs(trials: list[Trial], device: str | None = None) -> tuple[bool, list[Simulation]]:
    """The simulations of `fedbench run`'s runs, and whether the planner (`fedbench.engine.planning.plan`) lets them
    form one program: then on one problem instance (`build_batch`). What needs the built data raises ValueError
    (pfedfbe's λ above the clients' smoothness, or no CUDA)."""
    together = bool(plan(list(enumerate(trials)), cap=len(trials)).programs)
    return together, (build_batch(trials, device) if together
                      else [build_simulation(trial, device) for trial in trials])


@dataclass
class Outcome:
    """What one (config, seed) run produced: its evaluated rows and how it ended."""
    rows: list[dict[str, float]]
    status: str  # finished | diverged | failed
    device: str
    seconds: list[float] = field(default_factory=list)  # training seconds by each row (the wall-clock x-axis)
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    wall_seconds: float = 0.0
    error: str | None = None
    end_time: float = field(default_factory=time.time)  # epoch seconds, where the run ran
    runs_in_batch: int = 1  # runs of the program it ran in (1: alone, or one after another)
    compiled: bool = False  # whether its program's local steps ran compiled (`fedbench.engine.compiling`)
    choices: dict[str, str] = field(default_factory=dict)  # what its problem chose to run it (`Problem.choices`)
    model: bytes | None = None  # its final model's file (`fedbench.engine.saved`), the artifact model/final.pt
    # its models by round (`tracking.models_every`) where its driver keeps them for the end (`fedbench run`; a Ray
    # trial sends each as it is made)
    models: dict[int, bytes] = field(default_factory=dict)


OnRow = Callable[[int, dict[str, float], float], None]  # (run index, row, the run's training seconds by then)
OnModel = Callable[[int, int, bytes], None]  # (run index, round, the file of its model then: `fedbench.engine.saved`)
Programs = list[tuple[list[int], RoundProgram]]  # `fedbench.engine.runs.programs`: each program, its runs' indices


def drive(simulation: Simulation, on_row: Callable[[dict[str, float]], None] | None = None) -> Outcome:
    """Run a built simulation to its end."""
    return drive_batch([simulation], None if on_row is None else lambda i, row, seconds: on_row(row))[0]


def drive_batch(sims: list[Simulation], on_row: OnRow | None = None, checkpoints: Policy | None = None,
                trials: list[Trial] | None = None, tick: Callable[[], None] | None = None,
                planned: Programs | None = None, on_model: OnModel | None = None) -> list[Outcome]:
    """Run simulations (a run alone, or the runs of one planned program from `build_batch`) in their programs
    (`planned`, default `fedbench.engine.runs.programs(sims)`: one where they can share one and are not memory-bound,
    else one after another); each run's outcome as `drive` gives it alone (its training seconds: its share of its
    program's). With a `checkpoints` policy (and the runs' `trials`, which name each program's checkpoint), a program
    resumes from its checkpoint, whose rows go to `on_row` again first, and saves checkpoints by the policy
    (`sweeps.checkpoints`). `tick()` is called between rounds (a row stream's timer, `sweeps.events.RowStream`). Where
    the runs' trials ask for it (`models_every`), `on_model` gets each run's model at every row of a round that is a
    multiple of it."""
    start = time.perf_counter()
    rows: list[list[dict[str, float]]] = [[] for _ in sims]
    seconds: list[list[float]] = [[] for _ in sims]
    groups = programs(sims) if planned is None else planned
    every = trials[0].models_every if trials and on_model is not None else 0
    for runs, program in groups:
        checkpoint = (Checkpoint(checkpoints, [trials[i] for i in runs])  # type: ignore[index]  # given with a policy
                      if checkpoints is not None and checkpoints.active else None)
        saved = checkpoint.restore(program) if checkpoint is not None else None
        for j, i in enumerate(runs if saved else ()):
            rows[i], seconds[i] = saved["rows"][j], saved["seconds"][j]  # type: ignore[index]  # saved: not None
            for row, by_then in zip(rows[i], seconds[i]):
                if on_row is not None:
                    on_row(i, row, by_then)
        program.safe_point = between_rounds(checkpoint, tick, [rows[i] for i in runs], [seconds[i] for i in runs])
        for j, row in program:
            i = runs[j]
            rows[i].append(row)
            seconds[i].append(sims[i].train_seconds)
            if on_row is not None:
                on_row(i, row, sims[i].train_seconds)
            if every and row["round"] and row["round"] % every == 0:
                if j in program.live:  # a stopped run's state is on its Simulation already (the batch's may be reused)
                    program.sync_run(j)
                on_model(i, int(row["round"]), model_bytes(sims[i]))  # type: ignore[misc]  # every > 0: given
        if checkpoint is not None:
            checkpoint.remove()
    wall = (time.perf_counter() - start) / len(sims)
    together = {i: len(runs) for runs, _ in groups for i in runs}
    compiled = {i: program.compiled for runs, program in groups for i in runs}
    return [Outcome(rows[i], sim.status, str(sim.problem.device), seconds[i], sim.train_seconds, sim.eval_seconds,
                    wall, runs_in_batch=together[i], compiled=compiled[i], choices=sim.problem.choices(),
                    model=model_bytes(sim))
            for i, sim in enumerate(sims)]


def between_rounds(checkpoint: Checkpoint | None, tick: Callable[[], None] | None, rows: list[list],
                   seconds: list[list]) -> Callable[[Any], None] | None:
    """A program's safe-point hook: the tick, then a checkpoint when one is due (None: nothing to do there)."""
    if checkpoint is None:
        return None if tick is None else lambda program: tick()

    def safe_point(program) -> None:
        if tick is not None:
            tick()
        if checkpoint.due(program):
            checkpoint.save(program, rows, seconds)
    return safe_point


def drive_runs(recipe: Recipe, trials: list[Trial], sims: list[Simulation], tracking_uri: str | None, resume: bool,
               on_row: OnRow, note: Callable[[str], None]) -> list[Outcome]:
    """`fedbench run`'s runs driven in their programs, built once (`fedbench.engine.runs.programs`); each program
    resumes from its checkpoint with `resume` (`note` says so where there is none), else starts at round 0. Each run's
    models by round (`tracking.models_every`) are kept on its outcome."""
    policy = policy_of(recipe, tracking_uri)
    planned = programs(sims)
    saved = [Checkpoint(policy, [trials[i] for i in runs]) for runs, _ in planned]
    if resume and not any(checkpoint.path is not None and checkpoint.path.is_file() for checkpoint in saved):
        note("no checkpoint of these runs: starting at round 0")
    for checkpoint in saved if not resume else ():  # an earlier interrupted run's is not this run's start
        checkpoint.remove()
    models: list[dict[int, bytes]] = [{} for _ in trials]
    outcomes = drive_batch(sims, on_row, policy, trials, planned=planned,
                           on_model=lambda i, round_, data: models[i].__setitem__(round_, data))
    for outcome, kept in zip(outcomes, models):
        outcome.models = kept
    return outcomes
