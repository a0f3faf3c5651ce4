"""The driver of a sweep (`fedbench sweep`): every (config, seed) of a recipe not yet finished in the store, claimed
(`sweeps.claims`), planned into programs (`fedbench.engine.planning`) and packed into Ray trials (`sweeps.packing`), run
on Ray Tune (`sweeps.worker.run_pack`); the trials' events (`sweeps.events`) become MLflow runs through one writer
thread (`writer.SweepLog`) and a live progress display. Resume is content-addressed: a (config hash, seed) that finished
in the recipe's experiment is skipped, and a program that saved a checkpoint resumes from it."""
from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .checkpoints import Policy, policy_of, saved_programs
from .claims import Lease
from .cluster import cluster_for
from .database import first_line
from .events import Runs
from .packing import plan_packs
from .recipe import Recipe, Trial
from .report import headline_metrics
from .store import INTERRUPTED, Store
from .worker import Program, run_pack
from .writer import SweepLog

Progress = Callable[[str, dict[str, Any]], None]


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


def sweep(recipe: Recipe, overrides: list[str] | None = None, tracking: str | None = None,
          address: str | None = None, max_concurrent: int | None = None, progress: Progress | None = None,
          parent_tags: dict[str, str] | None = None) -> SweepSummary:
    """Run every (config, seed) of the recipe not yet finished in the store, on Ray Tune. A metric the
    recipe names that the problem does not evaluate, and a run that building would refuse (`Recipe.check_builds`),
    are refused (RecipeError) before anything runs."""
    trials = recipe.trials()
    recipe.check_builds(trials)  # what building a run would refuse: refused before Ray starts or the store is made
    store = Store(tracking)
    experiment_id = store.experiment(recipe.name, headline_metrics(recipe))
    done = store.completed(experiment_id)
    to_run = [trial for trial in trials if (trial.config_hash, trial.seed) not in done]
    store.check_room(to_run)  # their curves: refused before Ray starts where the store's disk cannot hold them
    with cluster_for(recipe, address, max_concurrent, needed=bool(to_run)) as slot_count:
        parent_id = store.open_sweep(experiment_id, recipe, overrides or [], parent_tags)
        lease = Lease(store, experiment_id, parent_id, recipe.recipe_hash)
        try:
            return sweep_claimed(recipe, trials, done, store, experiment_id, parent_id, lease, tracking, slot_count,
                                 max_concurrent, progress)
        finally:
            lease.release()


def sweep_claimed(recipe: Recipe, trials: list[Trial], done: set[tuple[str, int]], store: Store, experiment_id: str,
                  parent_id: str, lease: Lease, tracking: str | None, slot_count: int, max_concurrent: int | None,
                  progress: Progress | None) -> SweepSummary:
    """The runs of the sweep not finished in the store (`done`, as read before) that this sweep could claim
    (`sweeps.claims`), on Ray Tune; those that another live sweep holds are left to it (`SweepSummary.elsewhere`)."""
    pending, summary, unfinished = claim(trials, done, store, experiment_id, parent_id, lease)
    checkpoints = policy_of(recipe, tracking)
    if not pending:
        close_parent(store, lease, parent_id, "FINISHED", {**summary.counts, "skipped": summary.skipped})
        return summary

    start = time.perf_counter()
    log = SweepLog(store, experiment_id, parent_id)
    runs = Runs(log, tags={"recipe_hash": recipe.recipe_hash}, reopen=unfinished, counts=summary.counts)
    for key, trial in pending:
        runs.add(key, trial)
    try:
        packs = plan_packs(pending, recipe.resources.pack, slot_count, recipe.resources.batch_runs,
                           saved_programs(checkpoints.folder))
        summary.ray_trials = len(packs)
        if progress is not None:
            progress("start", {"total": len(pending), "skipped": summary.skipped})
        summary.interrupted = fit_packs(recipe, packs, checkpoints, runs, max_concurrent, progress)
        summary.interrupted = summary.interrupted or len(runs.ended) < len(pending)
    finally:
        close(summary, runs, log, store, lease, parent_id, start)
    return summary


def claim(trials: list[Trial], done: set[tuple[str, int]], store: Store, experiment_id: str, parent_id: str,
          lease: Lease) -> tuple[list[tuple[int, Trial]], SweepSummary, dict[tuple[str, int], str]]:
    """The runs this sweep claimed and has to run, (key, trial) each; its summary so far; the unfinished MLflow runs
    of an earlier attempt, resumed as the same runs. Stale runs of an earlier attempt of the claimed are failed."""
    mine, elsewhere = lease.claim([(trial.config_hash, trial.seed) for trial in trials
                                   if (trial.config_hash, trial.seed) not in done])
    done = store.completed(experiment_id)  # finished by a sweep that released its claim meanwhile
    claimed = set(mine) - done
    pending = [(key, trial) for key, trial in enumerate(trials) if (trial.config_hash, trial.seed) in claimed]
    summary = SweepSummary(total=len(trials), skipped=len(trials) - len(pending) - len(elsewhere),
                           experiment_id=experiment_id, parent_run_id=parent_id,
                           elsewhere=sorted(set(elsewhere.values())), elsewhere_runs=len(elsewhere))
    store.fail_stale(experiment_id, parent_id, claimed)
    return pending, summary, store.unfinished(experiment_id, parent_id)


def fit_packs(recipe: Recipe, packs: list[list[Program]], checkpoints: Policy, runs: Runs,
              max_concurrent: int | None, progress: Progress | None) -> bool:
    """The packs run as Ray trials (`worker.run_pack`), their events handed to `runs`: whether Ctrl-C interrupted
    them. A pack whose actor died: its running run failed; its unstarted runs wait for a re-run."""
    from ray import tune

    from .relay import Relay

    def on_result(trial, result: dict[str, Any]) -> None:
        runs.on_event(result)
        if progress is not None:
            progress("update", {**runs.counts, "running": len(runs.running),
                                "in_flight": runs.in_flight(lambda key: runs.trials[key].federation.rounds)})

    def on_end(trial, failed: bool) -> None:
        if failed:  # every run of a completed pack has reported its end
            runs.died([key for program in packs[trial.config["pack"]] for key, _ in program], trial.error_file)

    resources = recipe.resources
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
        return True
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    return False


def close(summary: SweepSummary, runs: Runs, log: SweepLog, store: Store, lease: Lease, parent_id: str,
          start: float) -> None:
    """The sweep's end: runs still going abandoned, the queued writes stored, the summary completed and the parent
    run closed (`close_parent`; what the store refuses goes to `summary.tracking_errors`)."""
    for key in runs.running:
        log.abandoned(key, INTERRUPTED)
    try:
        summary.tracking_errors = log.close()
    except KeyboardInterrupt:  # Ctrl-C again while the queued writes are stored: stop waiting for them
        summary.interrupted = True
        summary.tracking_errors = [*log.errors, f"{log.queue.qsize()} queued writes were not stored "
                                                "(Ctrl-C while they were): run the same command again"]
    summary.unstored = len(runs.ends) - log.ends_stored
    summary.compute_seconds = runs.compute_seconds
    summary.failures = [Failure(runs.trials[key].algorithm, runs.trials[key].hyperparameters, runs.trials[key].seed,
                                line, log.run_ids.get(key)) for key, line in sorted(runs.failed.items())]
    summary.wall_seconds = time.perf_counter() - start
    status = "FINISHED" if summary.ok else ("KILLED" if summary.interrupted else "FAILED")
    try:
        close_parent(store, lease, parent_id, status, {**summary.counts, "skipped": summary.skipped})
    except Exception as error:  # the store failed (full, gone): the summary says so, no traceback
        summary.tracking_errors.append(f"the sweep's parent run was not closed: {first_line(error)}")


def close_parent(store: Store, lease: Lease, parent_id: str, status: str, counts: dict[str, int]) -> None:
    """The parent run closed with this sweep's status and counts, unless another sweep of the recipe that shares it
    is still going (`sweeps.claims`): then it stays RUNNING, as that sweep's runs are, and that sweep closes it at its
    end. The claims are released first, so that of two sweeps ending at once the later sees the other gone."""
    lease.release()
    if not lease.others_alive():
        store.close_sweep(parent_id, status, counts)
