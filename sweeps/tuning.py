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
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .execute import build_simulation, open_cluster, prepare_worker, resolve_device, sweep
from .recipe import Dimension, Recipe, RecipeError, parse, stable_hash
from .tracking import Store, SweepLog, headline_metrics


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


def worst(mode: str) -> float:
    return math.inf if mode == "min" else -math.inf


# -- inside a Ray trial -------------------------------------------------------------------------------

def run_tuned(config: dict[str, Any]) -> None:
    """Function trainable: one run, reporting its score at every evaluation (for ASHA and the study)."""
    import ray
    from ray import tune

    trial, metric, mode, objective = config["trial"], config["metric"], config["mode"], config["objective"]
    prepare_worker(config["cpus"])
    simulation = build_simulation(trial, resolve_device(trial.device, bool(ray.get_gpu_ids())))
    best = worst(mode)
    start = time.perf_counter()
    row = {}
    for row in simulation:
        value = row[metric]
        if math.isfinite(value):
            best = min(best, value) if mode == "min" else max(best, value)
        score = value if objective == "final" else best
        tune.report({"round": row["round"], "score": score, "row": row, "status": "running",
                     "device": str(simulation.problem.device), "time": time.time()})
    tune.report({"round": row["round"], "score": score, "status": simulation.status, "end": True,
                 "train_seconds": simulation.train_seconds, "eval_seconds": simulation.eval_seconds,
                 "wall_seconds": time.perf_counter() - start, "time": time.time()})


# -- on the driver ----------------------------------------------------------------------------------

def make_searcher(study, recipe: Recipe, algorithm: str, seed: int):
    from optuna.trial import TrialState
    from ray.tune.search import Searcher

    assert recipe.tune is not None and recipe.tune.mode is not None  # a tune block, its mode resolved at load
    tune_spec, mode = recipe.tune, recipe.tune.mode
    dimensions = [d for d in recipe.dimensions if algorithm in d.algorithms]

    class StudySearcher(Searcher):
        """Ask the study for each new Tune trial; report and tell it what the trial did."""

        def __init__(self):
            super().__init__(metric="score", mode=tune_spec.mode)
            self.live: dict[str, Any] = {}
            self.reported: dict[str, set[int]] = {}

        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            asked = study.ask()
            values = {d.path(algorithm): suggest(asked, d) for d in dimensions}
            try:
                trial = recipe.single_trial(algorithm, seed, fixed=values)
            except (RecipeError, ValueError) as err:  # e.g. a sampled clients_per_round above clients
                asked.set_user_attr("error", str(err))
                study.tell(asked, state=TrialState.FAIL)
                return self.suggest(trial_id)
            self.live[trial_id] = asked
            self.reported[trial_id] = set()
            return {"trial": trial, "number": asked.number, "metric": tune_spec.metric, "mode": tune_spec.mode,
                    "objective": tune_spec.objective, "cpus": recipe.resources.cpus_per_trial}

        def on_trial_result(self, trial_id: str, result: dict) -> None:
            step, score = int(result["round"]), result["score"]
            if step not in self.reported[trial_id] and math.isfinite(score):
                self.live[trial_id].report(score, step)
                self.reported[trial_id].add(step)

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
            asked = self.live.pop(trial_id)
            if error or result is None:
                study.tell(asked, state=TrialState.FAIL)
            elif not result.get("end"):
                study.tell(asked, state=TrialState.PRUNED)
            else:
                if result["status"] == "diverged":
                    asked.set_user_attr("diverged", True)
                score = result["score"]
                study.tell(asked, score if math.isfinite(score) else worst(mode))

    return StudySearcher()


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
    for dimension in recipe.dimensions:
        if algorithm in dimension.algorithms:
            section, name = dimension.path(algorithm).rsplit(".", 1)
            node = document
            for key in section.split("."):
                node = node[key]
            node[name] = params[dimension.key]
    return parse(document, recipe.source)


def tune_recipe(recipe: Recipe, algorithms: list[str], overrides: list[str] | None = None,
                tracking: str | None = None, address: str | None = None, max_concurrent: int | None = None,
                fresh: bool = False, rerun_best: int | None = None,
                progress: Callable[[str, dict[str, Any]], None] | None = None) -> TuneSummary:
    import optuna
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from .relay import Relay

    spec = recipe.tune
    assert spec is not None and spec.mode is not None  # a tune block, its mode resolved at load
    seed = recipe.seeds[0] if spec.seed is None else spec.seed
    rerun_best = spec.rerun_best if rerun_best is None else rerun_best
    recipe.check_builds()  # what building a run would refuse: refused before Ray starts or the store is made
    store = Store(tracking)
    experiment_id = store.experiment(recipe.name, headline_metrics(recipe))
    storage = study_storage(recipe, store)
    probe = recipe.single_trial(algorithms[0], seed, fixed=_lowest(recipe, algorithms[0]))
    rounds = probe.federation.rounds
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    started_ray, slot_count = open_cluster(recipe, address, max_concurrent)
    parent_id = store.open_parent(experiment_id, recipe, overrides or [], f"tune {recipe.name}", {
        "role": "tune", "study_storage": storage, "studies": ", ".join(study_name(recipe, a) for a in algorithms),
        "tuning_seed": str(seed)})
    log = SweepLog(store, experiment_id, parent_id)
    scratch = tempfile.mkdtemp(prefix="fedbench-tune-")
    results = []
    try:
        for algorithm in algorithms:
            name = study_name(recipe, algorithm)
            if fresh and name in optuna.study.get_all_study_names(storage):
                optuna.delete_study(study_name=name, storage=storage)
            existing = optuna.create_study(study_name=name, storage=storage, load_if_exists=True,
                                           direction="minimize" if spec.mode == "min" else "maximize")
            identity = search_identity(recipe, algorithm, seed)
            if existing.user_attrs.setdefault("search", identity) != identity:
                raise RecipeError(recipe.source, "tune", f"study {name!r} in {storage} was made for another problem, "
                                  "space, metric or seed; continue it with the same recipe, or pass --fresh")
            existing.set_user_attr("search", identity)
            # A new sampler seed per call: a resumed study must not replay the same start-up points.
            study = optuna.load_study(study_name=name, storage=storage,
                                      sampler=make_sampler(spec.sampler, spec.sampler_seed + len(existing.trials)))
            tally = AlgorithmResult(algorithm, name)
            results.append(tally)
            runs: dict[str, dict[str, Any]] = {}

            def on_result(trial, result: dict[str, Any]) -> None:
                run = runs.setdefault(trial.trial_id, {"rows": [], "end": None})
                if not run["rows"] and "row" in result:
                    run["device"] = result["device"]
                    log.started(trial.trial_id, trial.config["trial"], result["time"],
                                {"study": name, "optuna_trial": str(trial.config["number"]),
                                 "recipe_hash": recipe.recipe_hash}, role="tune_trial")
                if "row" in result:
                    run["rows"].append(result["row"])
                if result.get("end"):
                    run["end"] = result

            def on_end(trial, failed: bool) -> None:
                run = runs.get(trial.trial_id)
                if run is None or not run["rows"]:  # failed before its first evaluation
                    tally.counts["failed"] += 1
                    return
                error = f"the Ray trial failed: {trial.error_file or 'no error file'}" if failed else None
                end = run["end"] or {}
                status = "failed" if error else end.get("status", "pruned")
                tally.counts[status] += 1
                log.ended(trial.trial_id, {
                    "rows": run["rows"], "status": status, "device": run.get("device", "cpu"), "error": error,
                    "train_seconds": end.get("train_seconds", math.nan),
                    "eval_seconds": end.get("eval_seconds", math.nan),
                    "wall_seconds": end.get("wall_seconds", math.nan), "end_time": time.time()})
                if progress is not None:
                    progress("update", {"algorithm": algorithm, **tally.counts})

            if progress is not None:
                progress("algorithm", {"algorithm": algorithm, "trials": spec.trials})
            # max_t beyond the last round: ASHA stops a trial that reaches max_t, before its final report.
            scheduler = (ASHAScheduler(time_attr="round", metric="score", mode=spec.mode,
                                       max_t=max(rounds, spec.pruner.grace_rounds) + 1,
                                       grace_period=spec.pruner.grace_rounds,
                                       reduction_factor=spec.pruner.reduction_factor)
                         if spec.pruner else FIFOScheduler())
            tuner = tune.Tuner(
                tune.with_resources(run_tuned, {"cpu": recipe.resources.cpus_per_trial,
                                                "gpu": recipe.resources.gpus_per_trial}),
                tune_config=tune.TuneConfig(search_alg=make_searcher(study, recipe, algorithm, seed),
                                            scheduler=scheduler, num_samples=spec.trials, reuse_actors=True,
                                            max_concurrent_trials=slot_count, time_budget_s=spec.timeout_s),
                run_config=tune.RunConfig(name=f"tune-{algorithm}", verbose=0, callbacks=[Relay(on_result, on_end)],
                                          storage_path=scratch, failure_config=tune.FailureConfig(max_failures=0)),
            )
            tuner.fit()
            tally.study_trials = len(study.trials)
            if any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials):
                tally.best_params, tally.best_value = study.best_trial.params, study.best_value
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        tracking_errors = log.close()
        for result in results:
            metrics = {f"best_{result.algorithm}": result.best_value} if math.isfinite(result.best_value) else {}
            metrics.update({f"{result.algorithm}_{k}": v for k, v in result.counts.items()})
            store.log_summary(parent_id, {f"best.{result.algorithm}.{k}": v for k, v in result.best_params.items()},
                              metrics)
        store.client.set_terminated(parent_id, "FINISHED" if len(results) == len(algorithms) else "FAILED")

    try:
        for result in results:
            if rerun_best and result.best_params:
                result.fresh_seeds = fresh_seeds(rerun_best, seed)
                again = best_recipe(recipe, result.algorithm, result.best_params, result.fresh_seeds)
                sweep(again, overrides, tracking, address, max_concurrent,
                      parent_tags={"rerun_best_of": result.study, "tune_parent": parent_id})
                result.fresh_values = store.final_values(experiment_id, again.trials(), spec.metric, spec.mode,
                                                         spec.objective)
    finally:
        if started_ray:
            ray.shutdown()
    return TuneSummary(storage, parent_id, results, tracking_errors)


def _lowest(recipe: Recipe, algorithm: str) -> dict[str, Any]:
    """Placeholder values for the tuned fields, so that a trial (and its round count) can be built."""
    return {d.path(algorithm): d.bounds[0] for d in recipe.dimensions if algorithm in d.algorithms}


def describe(values: list[float]) -> str:
    if not values:
        return "-"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.6g} ± {spread:.2g}"
