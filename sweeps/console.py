"""The command line's console, and the steps its commands share, each refused on it in one line: plain lines
(`say`), a refusal with exit code 2 (`fail`); a recipe read (`recipe_file`, `load_recipe`) and its runs' builds
checked (`check_builds`); the store opened (`open_store`), the runs it has no room for refused (`check_room`);
`fedbench run`'s runs chosen and logged (`chosen_trials`, `log_runs`)."""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import List, NoReturn, Optional

import typer
from rich.console import Console

console = Console()
errors = Console(stderr=True)


def program() -> str:
    """How this command was called (`.venv/bin/fedbench` when the venv is not activated), for printed commands."""
    return sys.argv[0] if Path(sys.argv[0]).name == "fedbench" else "fedbench"


def say(message: str) -> None:
    """A line of plain output, never wrapped (run ids and paths stay whole, whatever the terminal's width)."""
    console.print(message, highlight=False, soft_wrap=True)


LONGEST_ERROR = 500  # characters of a refusal's line at most, whatever it embeds (two absolute paths fit)


def fail(message: str, detail: str = "") -> NoReturn:
    """Refuse: one line (kept short, ~160 characters), then with `fedbench -v` the detail that explains it."""
    if len(message) > LONGEST_ERROR:  # a message that embeds what it found whole (a path, a store's own error)
        message = message[:LONGEST_ERROR - 1] + "…"
    errors.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    if detail and os.environ.get("FEDBENCH_VERBOSE") == "1":
        errors.print(f"       {detail}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def open_store(uri: Optional[str], write: bool = True):
    """The MLflow store; one that cannot be used as it is (damaged, half-migrated; for a command that writes,
    read-only or full) is refused in one line. Results that an earlier command could not store are stored now."""
    from .database import StoreError
    from .store import Store

    try:
        store = Store(uri, write)
    except StoreError as err:
        fail(str(err))
    if store.recovered:
        say(f"stored {len(store.recovered)} run(s) that an earlier command kept when the store failed it")
    return store


def check_room(store, trials: list) -> None:
    """Refuse runs whose curves the store's disk cannot hold (`Store.check_room`), before they run."""
    from .database import StoreError

    try:
        store.check_room(trials)
    except StoreError as err:
        fail(str(err))


def check_not_interrupted(recipe_path: Path, recipe, trials: list, tracking_uri: Optional[str]) -> None:
    """Refuse to start at round 0, over its checkpoint, runs an interrupted `fedbench run` left: the choice between
    going on (--resume) and dropping the rounds done (--restart) is the researcher's."""
    from .checkpoints import interrupted, policy_of

    for path, rounds in interrupted(policy_of(recipe, tracking_uri), trials):
        reached = f"at round {rounds:,}" if rounds is not None else "mid-run"
        fail(f"{recipe_path}: an interrupted run of these runs saved a checkpoint {reached} ({path}); expected "
             "--resume to go on from it or --restart to start at round 0")


def use_data_dir(data_dir: Optional[Path]) -> None:
    """Real datasets are read from FEDBENCH_DATA; set before Ray starts, its workers inherit it."""
    if data_dir is not None:
        os.environ["FEDBENCH_DATA"] = str(data_dir.resolve())


def recipe_file(given: Path) -> Path:
    """RECIPE: a file that exists (it always wins), else the shipped recipe of that name (`fedbench recipes`, e.g.
    papers/bao2022_lasso, with or without .yaml); neither is refused in one line naming the closest shipped one."""
    if given.exists():
        return given
    from .shipped import closest, find

    found = find(given)
    if found is None:
        near = closest(given)
        fail(f"{given}: neither a file nor a shipped recipe ({f'closest: {near}; ' if near else ''}"
             f"`{program()} recipes` lists them)")
    return found


def load_recipe(path: Path, sets: Optional[List[str]], algorithm: Optional[str] = None,
                with_plugins: Optional[List[str]] = None, only: Optional[List[str]] = None):
    """The recipe at `path` with `sets` applied; with `only` (-a), its runs of those algorithms alone."""
    from .recipe import RecipeError, load

    try:
        recipe = load(recipe_file(path), sets or [], algorithm, with_plugins)
        return recipe.only(only) if only else recipe
    except RecipeError as err:
        fail(str(err), err.detail)


def on_device(recipe, device: Optional[str]):
    """The recipe with its runs on `device` (--device): where runs go is not what they are, so the recipe's hash,
    by which a sweep is found again and resumed, stays the same."""
    return recipe if device is None else dataclasses.replace(recipe, device=device)


def check_builds(recipe, trials=None, **options) -> None:
    """Refuse, before anything runs, what building the recipe's runs (or `trials`) would refuse, and command-line
    options (`--max-concurrent`, ...) that break the rules of the recipe fields they stand for."""
    from .recipe import RecipeError, check_option

    try:
        for option, value in options.items():
            check_option(recipe, option, value)
        recipe.check_builds(trials)
    except RecipeError as err:
        fail(str(err), err.detail)
    for caveat in recipe.caveats(trials):  # valid runs, whose hyperparameters do not say what they do
        errors.print(f"[bold yellow]warning:[/] {caveat}", highlight=False, soft_wrap=True)


def chosen_trials(recipe, algorithm: Optional[str], seeds: list[Optional[int]]) -> list:
    """The runs `fedbench run` runs: the algorithm's, with each of the seeds (None: the recipe's first)."""
    from .recipe import RecipeError

    try:
        return [recipe.single_trial(algorithm, seed) for seed in seeds]
    except RecipeError as err:
        fail(str(err), err.detail)


def log_runs(store, recipe, trials: list, outcomes: list, sets: list[str]) -> None:
    """`fedbench run`'s runs logged to the store, with the --set options that made them (a report's title says
    them); a run the store refuses is kept for the next command (`spill`)."""
    import shlex
    from dataclasses import asdict

    from .database import StoreError, first_line
    from .report import headline_metrics
    from .spill import spill

    for t, outcome in zip(trials, outcomes):
        try:
            run_id = store.log_run(recipe.name, headline_metrics(recipe), t, asdict(outcome),
                                   {"recipe_hash": recipe.recipe_hash, "overrides": shlex.join(sets)})
        except Exception as error:  # the store failed after the run: its result is kept, not lost
            try:
                kept = spill(store.uri, recipe.name, headline_metrics(recipe), t, asdict(outcome),
                             {"recipe_hash": recipe.recipe_hash, "overrides": shlex.join(sets)})
            except StoreError as nowhere:
                fail(f"{store.uri}: the run could not be stored ({first_line(error, 100)}); {nowhere}")
            fail(f"{store.uri}: the run could not be stored ({first_line(error, 100)}); its result is kept in "
                 f"{kept} and stored by the next fedbench command on this store")
        say(f"logged to {store.uri} (experiment {recipe.name!r}, run {run_id})")
