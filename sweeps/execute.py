"""Executors: one trial in-process (`fedbench run`), or a whole sweep on Ray Tune (`fedbench sweep`).

A sweep is a list of (config, seed) runs. Ray Tune costs ~0.35 s per trial even with actors reused,
which is as long as a small federated run, so runs of one algorithm are packed into one Ray trial
(`resources.pack`, by default enough packs to keep every slot busy about four times over), and the seeds of
one configuration run as one program where the algorithm and problem allow it (`fedbench.runs`, at most
`resources.batch_runs` per program), a Ray trial of its own. A Ray trial reports `start`, `rows` and `end`
events per run, from a thread of its own (`Reporter`); the driver turns them into MLflow runs through one
writer thread (`tracking.SweepLog`) and a live progress display. Resume is content-addressed: a (config hash,
seed) that finished in the recipe's experiment is skipped.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import logging
import math
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from fedbench import plugins
from fedbench.algorithms import ALGORITHMS
from fedbench.memory import keep_freed_memory
from fedbench.problems import PROBLEMS
from fedbench.runs import programs
from fedbench.simulate import Simulation
from .checkpoints import Checkpoint, Policy, saved_programs
from .recipe import Recipe, Trial, stable_hash

PACKS_PER_SLOT = 4


class ClusterError(ValueError):
    """The cluster cannot run the sweep as asked (e.g. GPUs requested where there are none)."""


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
    if problem is None:
        problem = PROBLEMS[trial.problem](trial.problem_config, seed=trial.seed,
                                          device=resolve_device(device or trial.device))
    algorithm = ALGORITHMS[trial.algorithm](problem, **trial.hyperparameters)
    return Simulation(problem, algorithm, trial.federation, trial.seed, trial.eval_every, trial.divergence_factor)


def batch_key(trial: Trial) -> str:
    """The configurations whose seeds may share one program: the same but for the algorithm's float
    hyperparameters (per-run values, `fedbench.runs.batch_hparams`)."""
    config = trial.config()
    config["algorithm"] = {k: v for k, v in config["algorithm"].items() if not isinstance(v, float)}
    return stable_hash(config)


def batchable(trial: Trial) -> bool:
    """Whether this trial's seeds can share a problem instance, and so a program (`fedbench.runs`; the engine
    refuses what it cannot batch once the runs are built, `why_not_batchable`, and they then run alone)."""
    return PROBLEMS[trial.problem].shared_by_seeds(trial.problem_config)


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


OnRow = Callable[[int, dict[str, float], float], None]  # (run index, row, the run's training seconds by then)


def drive(simulation: Simulation, on_row: Callable[[dict[str, float]], None] | None = None) -> Outcome:
    """Run a built simulation to its end."""
    return drive_batch([simulation], None if on_row is None else lambda i, row, seconds: on_row(row))[0]


def build_batch(trials: list[Trial], device: str | None = None) -> list[Simulation]:
    """The simulations of the seeds of one configuration on one problem instance, for `drive_batch`."""
    first = trials[0]
    plugins.ensure(first.plugins)
    problem = PROBLEMS[first.problem](first.problem_config, seed=first.seed,
                                      device=resolve_device(device or first.device))
    return [build_simulation(trial, problem=problem) for trial in trials]


def drive_batch(sims: list[Simulation], on_row: OnRow | None = None, checkpoints: Policy | None = None,
                trials: list[Trial] | None = None, tick: Callable[[], None] | None = None) -> list[Outcome]:
    """Run simulations (a run alone, or the seeds of one configuration from `build_batch`) in their programs
    (`fedbench.runs.programs`: one where they can share one and are not memory-bound, else one after another);
    each run's outcome as `drive` gives it alone (its training seconds: its share of its program's). With a
    `checkpoints` policy (and the runs' `trials`, which name each program's checkpoint), a program resumes from its
    checkpoint, whose rows go to `on_row` again first, and saves checkpoints by the policy (`sweeps.checkpoints`).
    `tick()` is called between rounds (a row stream's timer, `RowStream`)."""
    start = time.perf_counter()
    rows: list[list[dict[str, float]]] = [[] for _ in sims]
    seconds: list[list[float]] = [[] for _ in sims]
    groups = programs(sims)
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
        if checkpoint is not None:
            checkpoint.remove()
    wall = (time.perf_counter() - start) / len(sims)
    together = {i: len(runs) for runs, _ in groups for i in runs}
    return [Outcome(rows[i], sim.status, str(sim.problem.device), seconds[i], sim.train_seconds, sim.eval_seconds,
                    wall, runs_in_batch=together[i]) for i, sim in enumerate(sims)]


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


STREAM_ROWS = 2000  # rows a Ray trial's stream holds at most before handing them to the driver
STREAM_SECONDS = 2.0  # ... and seconds


class RowStream:
    """The rows of a Ray trial's in-flight runs, sent to the driver (`send`, a `Reporter`) in one `rows` event for
    all of them, every STREAM_ROWS rows or STREAM_SECONDS seconds, whichever comes first, checked at each row and
    between rounds (`tick`): each event costs the driver a store transaction, so a program of 30 runs evaluated
    every round must not send one per run, nor one per few rows. What is still held when a run ends travels in its
    `end` event's outcome, so that a run shorter than STREAM_SECONDS sends none."""

    def __init__(self, send: Callable[[dict[str, Any]], None], keys: list[int]):
        self.send, self.keys = send, keys
        self.held: dict[int, tuple[list, list]] = {}
        self.count = 0
        self.sent_at = time.monotonic()

    def add(self, i: int, row: dict[str, float], seconds: float) -> None:
        rows, by_row = self.held.setdefault(self.keys[i], ([], []))
        rows.append(row)
        by_row.append(seconds)
        self.count += 1
        self.tick()

    def tick(self) -> None:
        if self.count and (self.count >= STREAM_ROWS or time.monotonic() - self.sent_at >= STREAM_SECONDS):
            self.send({"event": "rows", "key": None, "runs": self.held})
            self.held, self.count, self.sent_at = {}, 0, time.monotonic()

    def take(self, i: int) -> tuple[list, list]:
        """Run i's rows not sent yet and their seconds, no longer held: what its end event carries."""
        rows, by_row = self.held.pop(self.keys[i], ([], []))
        self.count -= len(rows)
        return rows, by_row


class Reporter:
    """A Ray trial's events handed to the driver (`report`, `tune.report`) by a thread of their own, in order.
    `tune.report` holds its caller until the driver has taken the event and acted on it (its store writes
    included; a function trainable reports synchronously), tens to hundreds of ms on a busy machine: a trial's
    rounds must not wait for that every STREAM_SECONDS. Rows events queued behind one another while the driver
    was busy go as one. What reporting raised is raised by the next event sent (the trial stops, as it did when it
    reported itself) and by `close()`, which waits for every event to be reported."""

    _CLOSE, _NOTHING = object(), object()

    def __init__(self, report: Callable[[dict[str, Any]], None]):
        self.report = report
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._send, name="fedbench-reporter", daemon=True)
        self.thread.start()

    def __call__(self, event: dict[str, Any]) -> None:
        if self.error is not None:
            raise self.error
        self.events.put(event)

    def _send(self) -> None:
        try:
            taken: Any = self._NOTHING
            while True:
                event = self.events.get() if taken is self._NOTHING else taken
                if event is self._CLOSE:
                    return
                taken = self._merge_rows(event) if event["event"] == "rows" else self._NOTHING
                self.report(event)
        except BaseException as error:  # SystemExit included (a trial Tune stops): close() raises it
            self.error = error

    def _merge_rows(self, event: dict[str, Any]) -> Any:
        """Fold the rows events queued behind `event` into it; return the first other event taken (_NOTHING if
        none was queued)."""
        while True:
            try:
                following = self.events.get_nowait()
            except queue.Empty:
                return self._NOTHING
            if following is self._CLOSE or following["event"] != "rows":
                return following
            for key, (rows, seconds) in following["runs"].items():
                held_rows, held_seconds = event["runs"].setdefault(key, ([], []))
                held_rows.extend(rows)
                held_seconds.extend(seconds)

    def close(self) -> None:
        self.events.put(self._CLOSE)
        self.thread.join()
        if self.error is not None:
            raise self.error


# -- inside a Ray trial -------------------------------------------------------------------------------

Unit = list[tuple[int, Trial]]  # runs executed together: one run, or the seeds of one configuration as one program


def prepare_worker(cpus: float) -> None:
    """A Ray trial's process set up for runs: a PyTorch thread per reserved CPU, freed memory kept for reuse."""
    torch.set_num_threads(max(1, int(cpus)))
    keep_freed_memory()


def run_pack(config: dict[str, Any], packs: list[list[Unit]], checkpoints: Policy) -> None:
    """Function trainable: run one pack's units one after another, reporting each run's start, its rows as they
    come (`RowStream`) and its end; each program resumes from its checkpoint and saves them by `checkpoints`."""
    import ray
    from ray import tune

    gpu_ids = ",".join(map(str, ray.get_gpu_ids()))
    node = ray.get_runtime_context().get_node_id()
    prepare_worker(config["cpus"])
    send = Reporter(tune.report)
    try:
        for unit in packs[config["pack"]]:
            tags = {"node": node, "gpu_ids": gpu_ids, "runs_in_batch": str(len(unit))}
            for key, _ in unit:
                send({"event": "start", "key": key, "time": time.time(), "tags": tags})
            start = time.perf_counter()
            device = resolve_device(unit[0][1].device, bool(gpu_ids))
            trials = [trial for _, trial in unit]
            stream = RowStream(send, [key for key, _ in unit])
            try:
                sims = [build_simulation(trials[0], device)] if len(unit) == 1 else build_batch(trials, device)
                outcomes = drive_batch(sims, stream.add, checkpoints, trials, stream.tick)
            except Exception:  # failing runs are recorded and the pack goes on
                wall = (time.perf_counter() - start) / len(unit)
                outcomes = [Outcome([], "failed", trial.device, wall_seconds=wall, error=traceback.format_exc(),
                                    runs_in_batch=len(unit)) for _, trial in unit]
            for j, ((key, _), outcome) in enumerate(zip(unit, outcomes)):
                # the rows streamed already are not sent twice (the curve of a run evaluated every round is most
                # of what a trial sends)
                rows, seconds = stream.take(j)
                send({"event": "end", "key": key, "outcome": asdict(replace(outcome, rows=rows, seconds=seconds))})
    finally:
        send.close()


# -- on the driver ----------------------------------------------------------------------------------

@dataclass
class Failure:
    """A run of a sweep that failed: its configuration and seed, the line of its error that says what went wrong
    (a traceback's last), and its MLflow run (None if it was never stored), whose tag `error` holds the whole."""
    algorithm: str
    hyperparameters: dict[str, Any]
    seed: int
    line: str
    run_id: str | None


@dataclass
class SweepSummary:
    total: int
    skipped: int
    ray_trials: int = 0  # packs the pending runs went into
    counts: dict[str, int] = field(default_factory=lambda: {"finished": 0, "diverged": 0, "failed": 0})
    compute_seconds: float = 0.0  # sum of in-trial wall time of the runs that ended
    wall_seconds: float = 0.0
    interrupted: bool = False
    tracking_errors: list[str] = field(default_factory=list)
    parent_run_id: str = ""
    experiment_id: str = ""
    elsewhere_runs: int = 0  # runs another live sweep of the recipe holds (`sweeps.claims`): left to it
    elsewhere: list[str] = field(default_factory=list)  # those sweeps
    failures: list[Failure] = field(default_factory=list)
    unstored: int = 0  # runs computed whose end the store did not take (`tracking_errors` says why): run again

    @property
    def ok(self) -> bool:
        return not (self.counts["failed"] or self.interrupted or self.tracking_errors)


def slots(resources, nodes: list[dict], max_concurrent: int | None) -> int:
    """How many trials the cluster can run at once; ClusterError if not even one fits on a node."""
    cpus, gpus = resources.cpus_per_trial, resources.gpus_per_trial
    per_node = [min(math.floor(node.get("CPU", 0) / cpus + 1e-9),
                    math.floor(node.get("GPU", 0) / gpus + 1e-9) if gpus else math.inf) for node in nodes]
    total = int(sum(per_node))
    if total == 0:  # the field to change: the one that no node can hold, else the two together
        most_cpus, most_gpus = (max((node.get(kind, 0) for node in nodes), default=0) for kind in ("CPU", "GPU"))
        if gpus > most_gpus:
            raise ClusterError(f"resources.gpus_per_trial: found {gpus:g} GPU per trial, expected at most "
                               f"{most_gpus:g} (no node of the Ray cluster has more)")
        if cpus > most_cpus:
            raise ClusterError(f"resources.cpus_per_trial: found {cpus:g} CPU per trial, expected at most "
                               f"{most_cpus:g} (no node of the Ray cluster has more)")
        raise ClusterError(f"resources: found {cpus:g} CPU and {gpus:g} GPU per trial, but no node of the Ray "
                           "cluster has both; expected fewer CPUs or GPUs")
    return min(total, max_concurrent or total)


def plan_batches(runs: list[tuple[int, Trial]], cap: int, slot_count: int = 1,
                 saved: Sequence[list[tuple[str, int]]] = ()) -> tuple[list[Unit], list[tuple[int, Trial]]]:
    """Which runs share a program (the one planner of `fedbench run --all-seeds`, `sweep` and `tune`): (batches,
    singles): first the programs with a checkpoint (`saved`, their runs as (config hash, seed)) whose runs are all
    to run, as they were, so that they resume from it; then the seeds of each batchable configuration with the
    values of its float hyperparameters (`batch_key`), in batches of at most `cap` runs, split further so that
    there are at least as many batches as slots where the runs allow; the other runs alone (a tune trial is one
    run: alone)."""
    by_run = {(trial.config_hash, trial.seed): (key, trial) for key, trial in runs} if saved else {}
    resumed = [[by_run[run] for run in program] for program in saved
               if len(program) > 1 and all(run in by_run for run in program)]
    taken = {key for program in resumed for key, _ in program}
    groups: dict[tuple[str, str], Unit] = {}
    singles = []
    for key, trial in [run for run in runs if run[0] not in taken]:
        if cap > 1 and batchable(trial):
            groups.setdefault((batch_key(trial), trial.device), []).append((key, trial))
        else:
            singles.append((key, trial))
    batches: list[Unit] = []
    for group in groups.values():
        if len(group) == 1:
            singles.extend(group)
            continue
        count = min(len(group), max(math.ceil(len(group) / cap), math.ceil(slot_count / len(groups))))
        size = math.ceil(len(group) / count)
        batches.extend(group[i:i + size] for i in range(0, len(group), size))
    return resumed + batches, sorted(singles, key=lambda run: run[0])


def plan_packs(runs: list[tuple[int, Trial]], pack: int | str, slot_count: int, batch_runs: int = 1,
               saved: Sequence[list[tuple[str, int]]] = ()) -> list[list[Unit]]:
    """Ray trials: every batch of seeds its own; the other runs in chunks of one algorithm each, `auto` making
    about PACKS_PER_SLOT packs per slot. The chunks are submitted longest first (the remainders of each algorithm's
    runs last), so that short packs fill the slots at the end instead of one long pack running alone there:
    on bao2022_lowrank.yaml (15 runs of ~20 s, packs of 2 and 1) ~176 s instead of ~182 s of runs on 2 slots."""
    batches, singles = plan_batches(runs, batch_runs, slot_count, saved)
    size = int(pack) if pack != "auto" else max(1, math.ceil(len(singles) / (PACKS_PER_SLOT * slot_count)))
    by_algorithm: dict[str, list[tuple[int, Trial]]] = {}
    for key, trial in singles:
        by_algorithm.setdefault(trial.algorithm, []).append((key, trial))
    chunks = [[[run] for run in group[i:i + size]]
              for group in by_algorithm.values() for i in range(0, len(group), size)]
    return [[batch] for batch in batches] + sorted(chunks, key=len, reverse=True)


def checkpoint_policy(recipe: Recipe, tracking: str | None) -> Policy:
    """The recipe's checkpoints block, with its files in `checkpoints/<experiment>/` beside the store of the
    tracking URI `tracking` (`tracking.store_folder`)."""
    from .tracking import store_folder

    folder = store_folder(tracking) / "checkpoints" / recipe.name.replace("/", "_")
    return Policy(str(folder), recipe.checkpoints.every_seconds, recipe.checkpoints.every_rounds)


def connect(address: str | None, recipes: Iterable[Recipe] = ()) -> bool:
    """Join the given cluster, or start a local Ray, shipping with the job the code of the recipes' module plugins
    that its nodes may lack (`shipped_code`); True when this call started Ray (and must stop it). A Ray this
    process has already joined is used as it is (its job's runtime environment is fixed)."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage-stats notice, nothing sent
    # Ray's runtime environment only where there is code to ship: each worker then waits for its copy.
    ship = shipped_code(recipes)
    # "local": a fresh Ray of our own, never whatever cluster `ray start` left on this machine. Ray's own log
    # lines and the workers' output only with `fedbench -v` (FEDBENCH_VERBOSE): the progress display says
    # what matters, and a trial's error goes to its MLflow run.
    ray.init(address=address or "local", log_to_driver=verbose(), include_dashboard=False, configure_logging=True,
             logging_level=logging.INFO if verbose() else logging.ERROR,
             runtime_env={"py_modules": ship} if ship else None)
    return True


def shipped_code(recipes: Iterable[Recipe]) -> list[str]:
    """What a Ray job ships to its workers on every node (`py_modules` of Ray's runtime environment, which puts
    its copy on their sys.path): the folder of the top-level package, or the file of the top-level module, of each
    module plugin the recipes use (`plugins: [my_pkg.methods]`) that is not installed here, i.e. that this process
    imports from a folder on its sys.path (the working directory, PYTHONPATH) which another node may not have.
    Nothing to ship for a file plugin (its text travels in each trial: `Trial.plugins`, `plugins.ensure`), nor
    for an entry point or an installed module: every node must have those installed, as it has fedbench itself."""
    needed = {source for recipe in recipes for kind, names in (("problem", [recipe.problem]),
                                                               ("algorithm", recipe.algorithms))
              for name in names for source in plugins.sources(kind, name)}
    paths: list[str] = []
    for source in sorted(needed, key=lambda source: source.spec):
        if source.text is not None or source.from_entry_point:
            continue
        top = source.spec.partition(":")[0].split(".")[0]
        if top in sys.stdlib_module_names or top in importlib.metadata.packages_distributions():
            continue  # installed: a distribution's (an editable install too), or Python's own
        module = importlib.import_module(top)  # imported already, when the recipe was loaded
        where = [str(path) for path in getattr(module, "__path__", None) or [module.__file__]]
        if any(part in ("site-packages", "dist-packages") for path in where for part in Path(path).parts):
            continue  # installed without a distribution's record
        paths.extend(path for path in where if path not in paths)
    return paths


def verbose() -> bool:
    """`fedbench -v`: show Ray's and MLflow's own log lines."""
    return os.environ.get("FEDBENCH_VERBOSE") == "1"


def open_cluster(recipe: Recipe, address: str | None, max_concurrent: int | None,
                 recipes: list[Recipe] | None = None) -> tuple[bool, int]:
    """Join or start Ray and count the trials it can run at once: (whether Ray was started here, slots). Ray
    started or joined here ships the code of the module plugins of `recipes`, every recipe it will run (default:
    this one). Raises ClusterError, with Ray stopped again, when the recipe's per-trial resources fit on no node."""
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # our tracker records everything
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray

    resources = recipe.resources
    if recipe.device.startswith("cuda") and not resources.gpus_per_trial:
        raise ClusterError(f"{recipe.source}: resources.gpus_per_trial: found 0 with device {recipe.device}; "
                           "expected a GPU share > 0 (e.g. --set resources.gpus_per_trial=0.25: four trials a GPU)")
    started = connect(address, recipes or [recipe])
    for name in ("ray", "ray.tune", "mlflow"):  # the progress display says what matters
        logging.getLogger(name).setLevel(logging.INFO if verbose() else logging.ERROR)
    try:
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        return started, slots(resources, nodes, max_concurrent or resources.max_concurrent)
    except ClusterError as err:
        if started:
            ray.shutdown()
        raise ClusterError(f"{recipe.source}: {err}") from None


@contextlib.contextmanager
def one_cluster(recipes: list[Recipe], address: str | None, max_concurrent: int | None) -> Iterator[None]:
    """Ray for several sweeps in a row (`fedbench sweep A.yaml B.yaml`): joined or started once, not once per
    recipe (with the module plugins of all of them shipped, `shipped_code`), and every recipe's resources checked
    against it before the first runs (ClusterError); stopped at the end when started here."""
    import ray

    started = False
    try:
        for recipe in recipes:
            started = open_cluster(recipe, address, max_concurrent, recipes)[0] or started
        yield
    finally:
        if started:
            ray.shutdown()


def sweep(recipe: Recipe, overrides: list[str] | None = None, tracking: str | None = None,
          address: str | None = None, max_concurrent: int | None = None,
          progress: Callable[[str, dict[str, Any]], None] | None = None,
          parent_tags: dict[str, str] | None = None) -> SweepSummary:
    """Run every (config, seed) of the recipe not yet finished in the store, on Ray Tune. A metric the
    recipe names that the problem does not evaluate, and a run that building would refuse (`Recipe.check_builds`),
    are refused (RecipeError) before anything runs."""
    import ray

    from .claims import Lease
    from .tracking import Store, headline_metrics

    trials = recipe.trials()
    recipe.check_builds(trials)  # what building a run would refuse: refused before Ray starts or the store is made
    store = Store(tracking)
    experiment_id = store.experiment(recipe.name, headline_metrics(recipe))
    done = store.completed(experiment_id)
    to_run = any((trial.config_hash, trial.seed) not in done for trial in trials)
    started_ray, slot_count = open_cluster(recipe, address, max_concurrent) if to_run else (False, 1)
    try:
        parent_id = store.open_sweep(experiment_id, recipe, overrides or [], parent_tags)
        lease = Lease(store, experiment_id, parent_id, recipe.recipe_hash)
        try:
            return sweep_claimed(recipe, trials, done, store, experiment_id, parent_id, lease, tracking, slot_count,
                                 max_concurrent, progress)
        finally:
            lease.release()
    finally:
        if started_ray:
            ray.shutdown()


def sweep_claimed(recipe: Recipe, trials: list[Trial], done: set[tuple[str, int]], store, experiment_id: str,
                  parent_id: str, lease, tracking: str | None, slot_count: int, max_concurrent: int | None,
                  progress: Callable[[str, dict[str, Any]], None] | None) -> SweepSummary:
    """The runs of the sweep not finished in the store (`done`, as read before) that this sweep could claim
    (`sweeps.claims`), on Ray Tune; those that another live sweep holds are left to it (`SweepSummary.elsewhere`)."""
    from ray import tune

    from .relay import Relay
    from .tracking import INTERRUPTED, SweepLog, first_line, last_line

    resources = recipe.resources
    mine, elsewhere = lease.claim([(trial.config_hash, trial.seed) for trial in trials
                                   if (trial.config_hash, trial.seed) not in done])
    done = store.completed(experiment_id)  # finished by a sweep that released its claim meanwhile
    claimed = set(mine) - done
    pending = [(key, trial) for key, trial in enumerate(trials) if (trial.config_hash, trial.seed) in claimed]
    summary = SweepSummary(total=len(trials), skipped=len(trials) - len(pending) - len(elsewhere),
                           experiment_id=experiment_id, parent_run_id=parent_id,
                           elsewhere=sorted(set(elsewhere.values())), elsewhere_runs=len(elsewhere))
    store.fail_stale(experiment_id, parent_id, claimed)
    unfinished = store.unfinished(experiment_id, parent_id)  # resumed as the same MLflow runs
    checkpoints = checkpoint_policy(recipe, tracking)
    if not pending:
        store.close_sweep(parent_id, "FINISHED", {**summary.counts, "skipped": summary.skipped})
        return summary

    start = time.perf_counter()
    log = SweepLog(store, experiment_id, parent_id)
    state: dict[str, set[int]] = {"running": set(), "ended": set()}
    reached: dict[int, float] = {}  # the last round each in-flight run has reported
    failed: dict[int, str] = {}  # the runs that failed, each with the line that says why
    ends: list[int] = []  # the runs that ended, in the order they did
    by_key = dict(pending)
    try:
        packs = plan_packs(pending, resources.pack, slot_count, resources.batch_runs,
                           saved_programs(checkpoints.folder))
        summary.ray_trials = len(packs)

        def on_result(trial, result: dict[str, Any]) -> None:
            key = result["key"]
            if result["event"] == "rows":
                for key, (rows, _) in result["runs"].items():
                    reached[key] = rows[-1]["round"]
                log.rows(result["runs"])
            elif result["event"] == "start":
                state["running"].add(key)
                run = by_key[key]
                log.started(key, run, result["time"], {**result["tags"], "recipe_hash": recipe.recipe_hash},
                            reopen=unfinished.get((run.config_hash, run.seed)))
            else:
                state["running"].discard(key)
                state["ended"].add(key)
                reached.pop(key, None)
                outcome = result["outcome"]
                ends.append(key)
                summary.counts[outcome["status"]] += 1
                if outcome["status"] == "failed":
                    failed[key] = last_line(outcome["error"] or "")
                summary.compute_seconds += outcome["wall_seconds"]
                log.ended(key, outcome)
            if progress is not None:
                progress("update", {**summary.counts, "running": len(state["running"]),
                                    "in_flight": {key: (reached.get(key, 0), by_key[key].federation.rounds)
                                                  for key in sorted(state["running"])}})

        def on_end(trial, died: bool) -> None:
            """A pack whose actor died: its running run failed; its unstarted runs wait for a re-run."""
            if not died:  # every run of a completed pack has reported its end
                return
            for key, _ in [run for unit in packs[trial.config["pack"]] for run in unit]:
                if key in state["running"]:
                    state["running"].discard(key)
                    log.abandoned(key, f"the Ray trial running it died: {trial.error_file or 'no error file'}")
                if key not in state["ended"]:
                    state["ended"].add(key)
                    summary.counts["failed"] += 1
                    failed[key] = f"the Ray trial running it died ({trial.error_file or 'no error file'})"

        if progress is not None:
            progress("start", {"total": len(pending), "skipped": summary.skipped})
        storage = tempfile.mkdtemp(prefix="fedbench-tune-")
        trainable = tune.with_resources(tune.with_parameters(run_pack, packs=packs, checkpoints=checkpoints),
                                        {"cpu": resources.cpus_per_trial, "gpu": resources.gpus_per_trial})
        tuner = tune.Tuner(
            trainable,
            param_space={"pack": tune.grid_search(list(range(len(packs)))), "cpus": resources.cpus_per_trial},
            tune_config=tune.TuneConfig(reuse_actors=True,
                                        max_concurrent_trials=max_concurrent or resources.max_concurrent),
            run_config=tune.RunConfig(name=f"{recipe.name}-{recipe.recipe_hash}", storage_path=storage, verbose=0,
                                      callbacks=[Relay(on_result, on_end)],
                                      failure_config=tune.FailureConfig(max_failures=0)),
        )
        try:
            tuner.fit()
        except KeyboardInterrupt:
            summary.interrupted = True
        finally:
            shutil.rmtree(storage, ignore_errors=True)
        summary.interrupted = summary.interrupted or len(state["ended"]) < len(pending)
    finally:
        for key in state["running"]:
            log.abandoned(key, INTERRUPTED)
        try:
            summary.tracking_errors = log.close()
        except KeyboardInterrupt:  # Ctrl-C again while the queued writes are stored: stop waiting for them
            summary.interrupted = True
            summary.tracking_errors = [*log.errors, f"{log.queue.qsize()} queued writes were not stored "
                                                    "(Ctrl-C while they were): run the same command again"]
        summary.unstored = len(ends) - log.ends_stored
        summary.failures = [Failure(by_key[key].algorithm, by_key[key].hyperparameters, by_key[key].seed, line,
                                    log.run_ids.get(key)) for key, line in sorted(failed.items())]
        summary.wall_seconds = time.perf_counter() - start
        status = "FINISHED" if summary.ok else ("KILLED" if summary.interrupted else "FAILED")
        try:
            store.close_sweep(parent_id, status, {**summary.counts, "skipped": summary.skipped})
        except Exception as error:  # the store failed (full, gone): the summary says so, no traceback
            summary.tracking_errors.append(f"the sweep's parent run was not closed: {first_line(error)}")
    return summary
