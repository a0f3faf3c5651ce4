"""`fedbench tune`: an Optuna search per algorithm, its trials run in parallel on Ray Tune.

Why not Ray's `OptunaSearch`: it hard-codes Optuna's NopPruner, records a trial that ASHA stopped as
COMPLETE with an intermediate value, and has no notion of a diverged run. `StudySearcher` below is a
small Tune searcher over an Optuna study in SQLite (ask/tell from the driver, so one writer): it
reports every evaluated point as an intermediate value, tells a trial stopped early as PRUNED, and a
diverged one as COMPLETE with its last finite value (or the worst possible) and the user attribute
`diverged`, so the sampler learns where the step size blows up.

Protocol. Every algorithm of the recipe gets the same budget (`tune.trials` trials and
`tune.timeout_s` seconds per call), on the tuning seed (`tune.seed`, default the recipe's first). Studies
live in `optuna-<recipe>.db` beside the MLflow store and are named `<recipe>:<algorithm>`; a second call
adds trials to them (`--fresh` deletes them first). With `rerun_best: N` each algorithm's best
configuration is then run as an ordinary sweep on N seeds tuning never used.

MLflow: one parent run per call (role `tune`) with the study names, best params and values; one
nested run per Optuna trial (role `tune_trial`) with its params, curve and status: finished,
pruned, diverged or failed.
"""
from __future__ import annotations

import copy
import math
import shutil
import statistics
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

from .cluster import cluster_for
from .events import Runs, Score, worst
from .recipe import Dimension, Recipe, RecipeError, assigned, stable_hash
from .report import headline_metrics
from .store import Store
from .sweep import sweep
from .worker import run_tuned
from .writer import SweepLog


def study_storage(recipe: Recipe, store: Store) -> str:
    return f"sqlite:///{store.folder() / ('optuna-' + recipe.name.replace('/', '_') + '.db')}"


def study_name(recipe: Recipe, algorithm: str) -> str:
    return f"{recipe.name}:{algorithm}"


def search_identity(recipe: Recipe, algorithm: str, seed: int) -> str:
    """What a study's trials depend on; a later call may change the budget but not this."""
    document = recipe.document
    tune = {k: v for k, v in document["tune"].items() if k in ("space", "metric", "mode", "objective")}
    return stable_hash([document["problem"], document["federation"], document["algorithms"].get(algorithm),
                        document.get("eval_every"), document.get("divergence_factor"), tune, seed])


def make_sampler(kind: str, seed: int):
    import optuna

    samplers = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
                "cmaes": optuna.samplers.CmaEsSampler, "gp": optuna.samplers.GPSampler}
    return samplers[kind](seed=seed)


def suggest(trial, dimension: Dimension) -> Any:
    kind, bounds = dimension.distribution, dimension.bounds
    if kind == "categorical":
        return trial.suggest_categorical(dimension.key, list(bounds))
    if kind in ("int", "log_int"):
        return trial.suggest_int(dimension.key, bounds[0], bounds[1], log=kind == "log_int")
    return trial.suggest_float(dimension.key, bounds[0], bounds[1], log=kind == "log_uniform")


def rungs(pruner, rounds: int) -> list[float]:
    """The rounds at which ASHA (`scheduler`) decides whether a trial goes on, every one up to its `max_t`: a tuned
    trial sends its rows as soon as it reaches one (`sweeps.events.RowStream`); none without a pruner."""
    if pruner is None:
        return []
    found, rung = [], float(pruner.grace_rounds)
    while rung <= max(rounds, pruner.grace_rounds) + 1:
        found.append(rung)
        rung *= pruner.reduction_factor
    return found


def scheduler(spec, rounds: int):
    """ASHA on the trials' rounds where the recipe has a pruner, else first in, first out."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if not spec.pruner:
        return FIFOScheduler()
    # max_t beyond the last round: ASHA stops a trial that reaches max_t, before its final report.
    return ASHAScheduler(time_attr="round", metric="score", mode=spec.mode,
                         max_t=max(rounds, spec.pruner.grace_rounds) + 1, grace_period=spec.pruner.grace_rounds,
                         reduction_factor=spec.pruner.reduction_factor)


# -- on the driver ----------------------------------------------------------------------------------

def make_searcher(study, recipe: Recipe, algorithm: str, seed: int, report_rounds: list[float]):
    """A Tune searcher over the study (Tune pickles it: it holds nothing of the driver's): each new Tune trial asked of
    it; what the trial reports handed back (`took`, from the driver's events): every evaluated score an intermediate
    value, its end told."""
    from ray.tune.search import Searcher

    assert recipe.tune is not None and recipe.tune.mode is not None  # a tune block, its mode resolved at load
    tune_spec, mode = recipe.tune, recipe.tune.mode
    dimensions = [d for d in recipe.dimensions if algorithm in d.algorithms]

    class StudySearcher(Searcher):
        """Ask the study for each new Tune trial; report and tell it what the trial did."""

        def __init__(self):
            super().__init__(metric="score", mode=mode)
            self.live: dict[str, Any] = {}
            self.reported: dict[str, set[int]] = {}
            self.scores: dict[str, Score] = {}
            self.ends: dict[str, tuple[str, float]] = {}  # status and score of the trials that reported their end

        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            asked, trial = ask_valid(study, recipe, algorithm, seed, dimensions)
            self.live[trial_id] = asked
            self.reported[trial_id] = set()
            self.scores[trial_id] = Score(tune_spec.metric, mode, tune_spec.objective)
            return {"key": trial_id, "trial": trial, "number": asked.number, "cpus": recipe.resources.cpus_per_trial,
                    "score": (tune_spec.metric, mode, tune_spec.objective), "report_rounds": report_rounds}

        def took(self, trial_id: str, event: dict[str, Any]) -> None:
            """An event of the trial (`sweeps.events`): the score at each row it brings reported to the study, but
            for the row its scheduler stopped it at (`done`); its end kept for `on_trial_complete`."""
            if event["event"] == "rows":
                rows = event["runs"].get(trial_id, ([], []))[0]
                self.report(trial_id, rows[:-1] if event.get("done") else rows)
            elif event["event"] == "end":
                self.report(trial_id, event["outcome"]["rows"])
                self.ends[trial_id] = (event["outcome"]["status"], event["score"])

        def report(self, trial_id: str, rows: list[dict[str, float]]) -> None:
            for row in rows:
                step, score = int(row["round"]), self.scores[trial_id].add(row)
                if step not in self.reported[trial_id] and math.isfinite(score):
                    self.live[trial_id].report(score, step)
                    self.reported[trial_id].add(step)

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
            end = self.ends.pop(trial_id, None)
            tell_end(study, self.live.pop(trial_id), end, error or end is None and result is None, mode)

    return StudySearcher()


def ask_valid(study, recipe: Recipe, algorithm: str, seed: int, dimensions: list) -> tuple[Any, Any]:
    """A new trial asked of the study and the run its values make; values that make no valid run (a sampled
    clients_per_round above the clients) told failed, with their refusal, and asked again."""
    from optuna.trial import TrialState

    while True:
        asked = study.ask()
        values = {d.path(algorithm): suggest(asked, d) for d in dimensions}
        try:
            return asked, assigned(recipe, values).single_trial(algorithm, seed)
        except (RecipeError, ValueError) as err:
            asked.set_user_attr("error", str(err))
            study.tell(asked, state=TrialState.FAIL)


def tell_end(study, asked, end: tuple[str, float] | None, failed: bool, mode: str) -> None:
    """Tell the study how an asked trial ended: `end` its status and score as it reported them (None: it reported no
    end); failed (`failed`, or its status), pruned by its scheduler (no end reported, but a result), or its score (the
    mode's worst where it is not finite, a diverged trial marked)."""
    from optuna.trial import TrialState

    if failed or end is not None and end[0] == "failed":
        study.tell(asked, state=TrialState.FAIL)
    elif end is None:
        study.tell(asked, state=TrialState.PRUNED)
    else:
        status, score = end
        if status == "diverged":
            asked.set_user_attr("diverged", True)
        study.tell(asked, score if math.isfinite(score) else worst(mode))


@dataclass
class AlgorithmResult:
    algorithm: str
    study: str
    counts: dict[str, int] = field(default_factory=lambda: {"finished": 0, "pruned": 0, "diverged": 0, "failed": 0})
    best_params: dict[str, Any] = field(default_factory=dict)
    best_value: float = math.nan
    study_trials: int = 0  # over every call so far
    fresh_seeds: list[int] = field(default_factory=list)
    fresh_values: list[float] = field(default_factory=list)


@dataclass
class TuneSummary:
    storage: str
    parent_run_id: str
    results: list[AlgorithmResult]
    tracking_errors: list[str] = field(default_factory=list)


def fresh_seeds(count: int, used: int) -> list[int]:
    return [seed for seed in range(count + 1) if seed != used][:count]


def best_recipe(recipe: Recipe, algorithm: str, params: dict[str, Any], seeds: list[int]) -> Recipe:
    """The recipe with one algorithm at its tuned values, on the given seeds, without the tune block."""
    document = copy.deepcopy(recipe.document)
    document.pop("tune", None)
    document["algorithms"] = {algorithm: dict(document["algorithms"].get(algorithm) or {})}
    document["seeds"] = seeds
    return assigned(recipe, {d.path(algorithm): params[d.key] for d in recipe.dimensions if algorithm in d.algorithms},
                    document)


def tune_recipe(recipe: Recipe, algorithms: list[str], overrides: list[str] | None = None,
                tracking: str | None = None, address: str | None = None, max_concurrent: int | None = None,
                fresh: bool = False, rerun_best: int | None = None,
                progress: Callable[[str, dict[str, Any]], None] | None = None) -> TuneSummary:
    """An Optuna study per algorithm, its trials run on Ray Tune and tracked under one parent run; then, with
    `rerun_best` seeds, each best configuration swept on fresh seeds."""
    import optuna

    spec = recipe.tune
    assert spec is not None and spec.mode is not None  # a tune block, its mode resolved at load
    seed = recipe.seeds[0] if spec.seed is None else spec.seed
    rerun_best = spec.rerun_best if rerun_best is None else rerun_best
    recipe.check_builds()  # what building a run would refuse: refused before Ray starts or the store is made
    store = Store(tracking)
    experiment_id = store.experiment(recipe.name, headline_metrics(recipe))
    storage = study_storage(recipe, store)
    rounds = assigned(recipe, lowest(recipe, algorithms[0])).single_trial(algorithms[0], seed).federation.rounds
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    with cluster_for(recipe, address, max_concurrent) as slot_count:
        parent_id = store.open_parent(experiment_id, recipe, overrides or [], f"tune {recipe.name}", {
            "role": "tune", "study_storage": storage, "studies": ", ".join(study_name(recipe, a) for a in algorithms),
            "tuning_seed": str(seed)})
        session = Session(recipe, store, experiment_id, parent_id, storage, seed, rounds, slot_count, progress)
        results, tracking_errors = session.run(algorithms, fresh)
        for result in results:
            if rerun_best and result.best_params:
                result.fresh_seeds = fresh_seeds(rerun_best, seed)
                again = best_recipe(recipe, result.algorithm, result.best_params, result.fresh_seeds)
                sweep(again, overrides, tracking, address, max_concurrent,
                      parent_tags={"rerun_best_of": result.study, "tune_parent": parent_id})
                result.fresh_values = store.final_values(experiment_id, again.trials(), spec.metric, spec.mode,
                                                         spec.objective)
    return TuneSummary(storage, parent_id, results, tracking_errors)


@dataclass
class Session:
    """One call's studies, one algorithm after another, on a cluster of `slots` slots, tracked under `parent_id`."""
    recipe: Recipe
    store: Store
    experiment_id: str
    parent_id: str
    storage: str  # the studies' Optuna storage
    seed: int  # the tuning seed
    rounds: int
    slots: int
    progress: Callable[[str, dict[str, Any]], None] | None = None

    def run(self, algorithms: list[str], fresh: bool) -> tuple[list[AlgorithmResult], list[str]]:
        """Each algorithm's search, its result in the parent run; the results and the tracking errors."""
        import optuna

        log = SweepLog(self.store, self.experiment_id, self.parent_id)
        scratch = tempfile.mkdtemp(prefix="fedbench-tune-")
        results = []
        try:
            for algorithm in algorithms:
                study = self.study(algorithm, fresh)
                result = AlgorithmResult(algorithm, study.study_name)
                results.append(result)
                self.search(study, result, log, scratch)
                result.study_trials = len(study.trials)
                if any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials):
                    result.best_params, result.best_value = study.best_trial.params, study.best_value
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            tracking_errors = log.close()
            self.close(results, len(results) == len(algorithms))
        return results, tracking_errors

    def study(self, algorithm: str, fresh: bool):
        """The algorithm's study (`fresh`: its earlier trials deleted), refused when it was made for another search;
        its sampler seeded anew on each call, so that a resumed study does not replay the same start-up points."""
        import optuna

        spec, name = self.recipe.tune, study_name(self.recipe, algorithm)
        assert spec is not None  # a tune block
        if fresh and name in optuna.study.get_all_study_names(self.storage):
            optuna.delete_study(study_name=name, storage=self.storage)
        existing = optuna.create_study(study_name=name, storage=self.storage, load_if_exists=True,
                                       direction="minimize" if spec.mode == "min" else "maximize")
        identity = search_identity(self.recipe, algorithm, self.seed)
        if existing.user_attrs.setdefault("search", identity) != identity:
            raise RecipeError(self.recipe.source, "tune", f"study {name!r} in {self.storage} was made for another "
                              "problem, space, metric or seed; continue it with the same recipe, or pass --fresh")
        existing.set_user_attr("search", identity)
        return optuna.load_study(study_name=name, storage=self.storage,
                                 sampler=make_sampler(spec.sampler, spec.sampler_seed + len(existing.trials)))

    def search(self, study, result: AlgorithmResult, log: SweepLog, scratch: str) -> None:
        """One algorithm's trials on Ray Tune (`worker.run_tuned`), their events (`sweeps.events`) into the store and
        the study."""
        from ray import tune

        from .relay import Relay

        recipe, spec, algorithm = self.recipe, self.recipe.tune, result.algorithm
        assert spec is not None  # a tune block
        runs = Runs(log, role="tune_trial", tags={"recipe_hash": recipe.recipe_hash}, counts=result.counts)
        searcher = make_searcher(study, recipe, algorithm, self.seed, rungs(spec.pruner, self.rounds))

        def on_result(trial, event: dict[str, Any]) -> None:
            if event["event"] == "start":
                runs.add(trial.trial_id, trial.config["trial"],
                         {"study": study.study_name, "optuna_trial": str(trial.config["number"])})
            runs.on_event(event)
            searcher.took(trial.trial_id, event)

        def on_end(trial, failed: bool) -> None:
            key = trial.trial_id
            if failed:
                runs.died([key], trial.error_file)
            elif key not in runs.ended:  # stopped by its scheduler (or by the time budget)
                runs.stopped(key, "pruned" if key in runs.running else "failed")
            if self.progress is not None:
                self.progress("update", {"algorithm": algorithm, **result.counts})

        if self.progress is not None:
            self.progress("algorithm", {"algorithm": algorithm, "trials": spec.trials})
        tuner = tune.Tuner(
            tune.with_resources(run_tuned, {"cpu": recipe.resources.cpus_per_trial,
                                            "gpu": recipe.resources.gpus_per_trial}),
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler(spec, self.rounds),
                                        num_samples=spec.trials, reuse_actors=True, max_concurrent_trials=self.slots,
                                        time_budget_s=spec.timeout_s),
            run_config=tune.RunConfig(name=f"tune-{algorithm}", verbose=0, callbacks=[Relay(on_result, on_end)],
                                      storage_path=scratch, failure_config=tune.FailureConfig(max_failures=0)),
        )
        tuner.fit()

    def close(self, results: list[AlgorithmResult], complete: bool) -> None:
        """Each algorithm's best values and counts on the parent run, and the parent run's end."""
        for result in results:
            metrics = {f"best_{result.algorithm}": result.best_value} if math.isfinite(result.best_value) else {}
            metrics.update({f"{result.algorithm}_{k}": v for k, v in result.counts.items()})
            self.store.log_summary(self.parent_id,
                                   {f"best.{result.algorithm}.{k}": v for k, v in result.best_params.items()}, metrics)
        self.store.client.set_terminated(self.parent_id, "FINISHED" if complete else "FAILED")


def lowest(recipe: Recipe, algorithm: str) -> dict[str, Any]:
    """Placeholder values for the tuned fields, so that a trial (and its round count) can be built."""
    return {d.path(algorithm): d.bounds[0] for d in recipe.dimensions if algorithm in d.algorithms}


def describe(values: list[float]) -> str:
    """Mean ± sample standard deviation; one value alone, said so (no "± 0": one seed has no spread)."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.6g} (n = 1)"
    return f"{statistics.fmean(values):.6g} ± {statistics.stdev(values):.2g}"
