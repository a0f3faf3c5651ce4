"""What a report reads from the MLflow store: the runs of a sweep, a tuning session or an experiment (`find_source`),
and their metric histories (`Histories`)."""
from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

import numpy as np
from mlflow.exceptions import MlflowException

from ..database import StoreError
from ..recipe import Recipe, parse, yaml_value
from ..store import Store
from ..writer import PARENT_TAG

COMM = ("comm_up", "comm_down")  # the x-axis of --x comm, not curves of their own
COMM_BITS = ("comm_up_bits", "comm_down_bits")  # of --x comm_bits, and each of its own --x
AXES = (*COMM, *COMM_BITS, "iterations")  # x-axis columns
RUN_ROLES = ("trial", "tune_trial", "run")


class ReportError(ValueError):
    """Nothing to report: no such experiment or run, or no runs with curves."""


@dataclass
class Source:
    """The runs of one sweep, tuning session or experiment, and the recipe that says how to draw them."""
    name: str
    runs: list
    recipe: Optional[Recipe]
    parent_id: Optional[str] = None  # where the report's artifacts go
    description: str = ""
    hint: str = ""  # where there are no runs: what the store holds instead, and the command that reports it
    made_with: str = ""  # the --set options that made its runs, as typed (`--set federation.rounds=200`)

    @property
    def title(self) -> str:
        """Its name, and the --set options that made its runs: a figure of a shortened sweep says so."""
        return f"{self.name} ({self.made_with})" if self.made_with else self.name


def one_per_seed(runs: list) -> list:
    """One run per (config hash, seed): a run that ran to its end over one that did not, then the latest."""
    chosen = {}
    for run in sorted(runs, key=lambda r: (r.info.status == "FINISHED", r.info.start_time)):
        chosen[key(run)] = run
    return list(chosen.values())


def key(run) -> tuple[str, str]:
    return run.data.tags.get("config_hash", ""), run.data.tags.get("seed", "")


def stored_recipe(store: Store, parent) -> Recipe:
    run_id = parent.info.run_id
    try:
        text = store.artifact_text(run_id, "recipe.resolved.yaml")
    except (MlflowException, OSError) as err:
        raise ReportError(f"run {run_id} has no readable recipe.resolved.yaml ({err})") from None
    return parse(yaml_value(text), f"recipe.resolved.yaml of run {run_id}")


def recipe_runs(store: Store, experiment_id: str, recipe: Recipe) -> list:
    """The sweep runs of the recipe's (config, seed) pairs, whichever attempt or parent ran them: a sweep
    skips what an earlier sweep of the same configurations already finished."""
    wanted = {(trial.config_hash, str(trial.seed)) for trial in recipe.trials()}
    runs = store.search(experiment_id, "tags.role = 'trial'")
    return one_per_seed([run for run in runs if key(run) in wanted])


def parent_runs(store: Store, parent, recipe: Recipe) -> list:
    """A sweep's runs; a tuning session's trials plus the sweeps that re-ran its best configurations."""
    experiment_id, run_id = parent.info.experiment_id, parent.info.run_id
    if parent.data.tags.get("role") == "sweep":
        return recipe_runs(store, experiment_id, recipe)
    runs = store.search(experiment_id, f"tags.`{PARENT_TAG}` = '{run_id}'")
    for rerun in store.search(experiment_id, f"tags.role = 'sweep' and tags.tune_parent = '{run_id}'"):
        runs += parent_runs(store, rerun, stored_recipe(store, rerun))
    return one_per_seed(runs)


def find_source(store: Store, recipe: Optional[Recipe] = None, experiment: Optional[str] = None,
                run_id: Optional[str] = None, overridden: bool = False) -> Source:
    """The runs of a recipe's sweep, of a parent run (sweep or tuning session), or of a whole experiment. A recipe
    given as its file alone (not `overridden` by --set) whose runs the store does not hold stands for its newest
    sweep made with --set: `fedbench report R` after `fedbench sweep R --set federation.rounds=200` reports that
    sweep, and says so."""
    if run_id is not None:
        try:
            parent = store.run(run_id)
        except StoreError as err:
            raise ReportError(str(err)) from None
        role = parent.data.tags.get("role")
        if role not in ("sweep", "tune"):
            raise ReportError(f"run {run_id} is a {role or 'untagged'} run, not a sweep or tuning session; "
                              f"pass its parent with --run, or the experiment with --experiment")
        stored = stored_recipe(store, parent)
        return Source(stored.name, parent_runs(store, parent, stored), stored, run_id, f"{role} run {run_id}",
                      made_with=set_options(parent))
    name = recipe.name if recipe is not None else experiment
    assert name is not None  # exactly one of recipe, experiment and run_id is given
    found = store.client.get_experiment_by_name(name)
    if found is None:
        hint = f"; run `fedbench sweep {recipe.source}` first" if recipe is not None else ""
        raise ReportError(f"no experiment {name!r} in {store.uri}{hint}")
    experiment_id = found.experiment_id
    if recipe is not None:
        # Artifacts only on the sweep of exactly this recipe: another recipe may share some configurations.
        sweeps = store.search(experiment_id, f"tags.role = 'sweep' and tags.recipe_hash = '{recipe.recipe_hash}'")
        runs = recipe_runs(store, experiment_id, recipe)
        swept = None if runs or overridden else swept_with_overrides(store, experiment_id, recipe)
        if swept is not None:
            stored = stored_recipe(store, swept)
            return Source(name, parent_runs(store, swept, stored), stored, swept.info.run_id,
                          f"the runs of {recipe.source} swept with {set_options(swept)} (its newest sweep; give "
                          "report other --set to report another)", made_with=set_options(swept))
        return Source(name, runs, recipe, sweeps[0].info.run_id if sweeps else None, f"the runs of {recipe.source}",
                      "" if runs else other_sweeps(store, experiment_id, recipe), made_with(sweeps))
    every = store.search(experiment_id, "")  # newest first
    parents = [run for run in every if run.data.tags.get("role") in ("sweep", "tune")]
    alone = [run for run in every if run.data.tags.get("role") == "run"]  # `fedbench run`'s: no parent
    return Source(name, one_per_seed([run for run in every if run.data.tags.get("role") in RUN_ROLES]),
                  stored_recipe(store, parents[0]) if parents else None, None, f"every run of experiment {name!r}",
                  made_with=made_with([*parents, *alone]))


def _other_sweeps(store: Store, experiment_id: str, recipe: Recipe) -> tuple[list, list]:
    """The sweeps of the recipe's experiment with other settings than the recipe's, and those of them made from its
    file, newest first."""
    others = [run for run in store.search(experiment_id, "tags.role = 'sweep'")  # newest first
              if run.data.tags.get("recipe_hash") != recipe.recipe_hash]
    return others, [run for run in others if run.data.tags.get("recipe") == recipe.source]


def set_options(sweep) -> str:
    """The --set options a sweep parent was made with (tagged by `shlex.join`), as one would type them again."""
    return " ".join(f"--set {shlex.quote(item)}" for item in shlex.split(sweep.data.tags.get("overrides", "")))


def made_with(makers: list) -> str:
    """The --set options of the runs that made a report's runs (sweep and tuning parents, `fedbench run`'s runs): the
    one they share, or a word that they differ."""
    found = {set_options(run) for run in makers}
    if len(found) > 1:
        return "runs made with different --set: each parent run's overrides tag says which"
    return found.pop() if found else ""


def swept_with_overrides(store: Store, experiment_id: str, recipe: Recipe):
    """The newest sweep of the recipe's file made with --set, if the store holds one."""
    return next((run for run in _other_sweeps(store, experiment_id, recipe)[1] if run.data.tags.get("overrides")), None)


def other_sweeps(store: Store, experiment_id: str, recipe: Recipe) -> str:
    """What a report of a recipe with no runs in the store can say: the overrides of the newest sweep of its file with
    other settings (a report given other --set than that sweep's is told its --set), or the parent run of the newest
    sweep of its experiment."""
    others, same_file = _other_sweeps(store, experiment_id, recipe)
    if not others:
        return ""
    newest = (same_file or others)[0]
    if same_file and newest.data.tags.get("overrides"):
        sets = set_options(newest)
        return (f"; the store holds a sweep of this recipe made with {sets}: give report the same "
                f"(fedbench report {recipe.source} {sets})")
    return (f"; the store holds {len(others)} sweep(s) of experiment {recipe.name!r} with other settings, the "
            f"newest is run {newest.info.run_id} (fedbench report --run {newest.info.run_id})")


class Histories:
    """Metric histories (finite points only, by round), read from the store on first use, for every run of the
    report at once (`Store.metric_histories`). A run of a non-personalized method has no `personal_X`: its
    personal model is its global model (as in the pFedFBE paper, §4.1), so its `X` stands in, and methods compare
    on one panel."""

    def __init__(self, store: Store, runs: Iterable = ()):
        self.store = store
        self.run_ids = [run.info.run_id for run in runs]  # read together with whichever run is asked for
        self.cache: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, run, metric: str) -> tuple[np.ndarray, np.ndarray]:
        if metric.startswith("personal_") and metric not in run.data.metrics:
            metric = metric.removeprefix("personal_")
        if (run.info.run_id, metric) not in self.cache:
            run_ids = list(dict.fromkeys([*self.run_ids, run.info.run_id]))
            for run_id, points in self.store.metric_histories(run_ids, metric).items():
                points.sort(key=lambda point: point[0])
                steps = np.array([step for step, _ in points], dtype=float)
                values = np.array([value for _, value in points], dtype=float)
                finite = np.isfinite(values)
                self.cache[run_id, metric] = steps[finite], values[finite]
        return self.cache[run.info.run_id, metric]

    def x(self, run, steps: np.ndarray, axis: str) -> np.ndarray:
        """The x of a run's points: their rounds, the local iterations, the training seconds, or the floats or bits
        communicated by then."""
        if axis == "rounds":
            return steps
        if axis in ("iterations", "seconds", *COMM_BITS):
            return np.interp(steps, *self(run, "train_seconds" if axis == "seconds" else axis))
        total = np.zeros_like(steps, dtype=float)
        for name in COMM if axis == "comm" else COMM_BITS:
            comm_steps, comm = self(run, name)
            total = total + np.interp(steps, comm_steps, comm)
        return total
