"""fedbench command line: `fedbench run | sweep | tune | report | validate | list | recipes | ui` (installed as
fedbench_sweeps.cli; in a checkout `python cli.py`, which imports it as sweeps.cli)."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import json
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import webbrowser
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterator, List, NoReturn, Optional

import typer
import typer.core
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table


def tidy_help(command: Any, ctx: Any) -> None:
    """What Typer's Rich help would print wrong, set right before it prints: a docstring's line breaks (kept in
    the commands' list and in a command's paragraphs after its first, they broke sentences mid-line) joined, and a
    flag's type (`<bool>`, as if it took a value) left out."""
    def joined(text: Optional[str]) -> str:
        return "\n\n".join(" ".join(paragraph.split()) for paragraph in inspect.cleandoc(text or "").split("\n\n"))

    command.help = joined(command.help)
    for sub in getattr(command, "commands", {}).values():
        sub.short_help = sub.short_help or joined(sub.help).split("\n\n")[0]
    for param in command.get_params(ctx):
        if getattr(param, "is_flag", False):
            param.metavar = ""


class Commands(typer.core.TyperGroup):
    def format_help(self, ctx: Any, formatter: Any) -> None:  # Click's types: Typer's own copy of Click, or Click
        tidy_help(self, ctx)
        super().format_help(ctx, formatter)


class Command(typer.core.TyperCommand):
    def format_help(self, ctx: Any, formatter: Any) -> None:
        tidy_help(self, ctx)
        super().format_help(ctx, formatter)


class App(typer.Typer):
    """fedbench's Typer app: its commands' help printed by `Command`."""

    def command(self, *args, **kwargs):
        kwargs.setdefault("cls", Command)
        return super().command(*args, **kwargs)


app = App(cls=Commands, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
          help="Declarative experiment sweeps for federated optimization research.")
console = Console()
errors = Console(stderr=True)

OR_SHIPPED = ", or a shipped recipe's name, e.g. papers/bao2022_lasso (fedbench recipes lists them)"
SetOption = typer.Option(None, "--set", "-s", help="Override a recipe field: path=value, e.g. algorithm.client_lr=1e-3")
WithOption = typer.Option(None, "--with", metavar="PLUGIN", help="A plugin (my_method.py, or my_pkg.module) whose "
                          "algorithms join the recipe's, with default hyperparameters (--set gives them a grid)")
DataOption = typer.Option(None, "--data-dir", envvar="FEDBENCH_DATA",
                          help="Root of real datasets (sets FEDBENCH_DATA for this run and its Ray workers)")
DeviceOption = typer.Option(None, "--device", help="auto, cpu, cuda or cuda:N (default: the recipe's device:)")


def tracking_driver(uri: Optional[str]) -> Optional[str]:
    """--tracking-uri (or MLFLOW_TRACKING_URI) as given; a PostgreSQL one whose default driver is not installed is
    said to use psycopg2 instead, or refused where neither is (`tracking.with_driver`)."""
    if uri is None or not uri.startswith("postgresql://"):
        return uri
    from .tracking import StoreError, driver_note

    try:
        note = driver_note(uri)
    except StoreError as err:
        fail(str(err))
    if note:
        say(note)
    return uri


TrackingOption = typer.Option(None, "--tracking-uri", envvar="MLFLOW_TRACKING_URI", callback=tracking_driver,
                              help="MLflow store (default sqlite:///mlflow.db in this directory; postgresql:// uses "
                              "psycopg2 where psycopg 3 is not installed)")


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v",
                                      help="Also print MLflow's, Ray's and the MLflow UI server's own log lines"),
         ) -> None:
    """Declarative experiment sweeps for federated optimization research."""
    if verbose:
        os.environ["FEDBENCH_VERBOSE"] = "1"
    else:  # read by MLflow when it is imported, i.e. after this (the commands import it lazily)
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # no "Creating initial MLflow database tables..."
        # MLflow logs each database error it raises with its whole traceback (a full disk: hundreds of lines); the
        # commands say what failed in one line each (refusals, tracking errors)
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


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
    from .tracking import Store, StoreError

    try:
        store = Store(uri, write)
    except StoreError as err:
        fail(str(err))
    if store.recovered:
        say(f"stored {len(store.recovered)} run(s) that an earlier command kept when the store failed it")
    return store


def check_room(store, trials: list) -> None:
    """Refuse runs whose curves the store's disk cannot hold (`Store.check_room`), before they run."""
    from .tracking import StoreError

    try:
        store.check_room(trials)
    except StoreError as err:
        fail(str(err))


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


@app.command()
def run(
    recipe_path: Path = typer.Argument(..., metavar="RECIPE", help=f"YAML recipe{OR_SHIPPED}"),
    algorithm: Optional[str] = typer.Option(None, "--algorithm", "-a", help="Which of the recipe's algorithms"),
    seeds: Optional[List[int]] = typer.Option(None, "--seed", help="Trial seed (default: the recipe's first); "
                                              "repeat it for several seeds, run as one batched program where "
                                              "the algorithm and problem allow"),
    all_seeds: bool = typer.Option(False, "--all-seeds", help="Run every seed of the recipe"),
    sets: Optional[List[str]] = SetOption,
    with_plugins: Optional[List[str]] = WithOption,
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write every evaluated row to this JSON file "
                                             "(with several seeds: an object of rows by seed)"),
    device: Optional[str] = DeviceOption,
    tracking_uri: Optional[str] = TrackingOption,
    track: bool = typer.Option(True, "--track/--no-track", help="Log the run(s) to MLflow"),
    resume: bool = typer.Option(False, "--resume", help="Go on from the checkpoint an interrupted run of this "
                                "configuration and seed(s) left (the recipe's checkpoints block says how often "
                                "runs save one); without it, a run starts at round 0"),
    data_dir: Optional[Path] = DataOption,
) -> None:
    """Run one configuration in-process (no Ray): one algorithm, one value per hyperparameter, one or more
    seeds."""
    use_data_dir(data_dir)
    from fedbench.memory import keep_freed_memory

    recipe = load_recipe(recipe_path, sets, algorithm, with_plugins)
    if all_seeds and seeds:
        fail("give --seed or --all-seeds, not both")
    chosen: list[Optional[int]] = (list(recipe.seeds) if all_seeds
                                   else list(dict.fromkeys(seeds)) if seeds else [None])
    trials = chosen_trials(recipe, algorithm, chosen)
    check_builds(recipe, trials, **{"--device": device})
    store = open_store(tracking_uri) if track else None  # one that cannot take the result: refused before computing
    if store is not None:
        check_room(store, trials)
    keep_freed_memory()
    together, sims = build_runs(recipe_path, trials, device)
    console.print(run_title(trials, together), highlight=False)
    for name, value in sims[0].problem.choices().items():  # e.g. a deep network's layout over the clients
        console.print(f"{name}: {value}", highlight=False)
    outcomes = drive_runs(recipe, trials, sims, tracking_uri, resume)
    console.print(final_table([t.seed for t in trials], outcomes))
    wall = sum(o.wall_seconds for o in outcomes)
    compiled = " (local steps compiled)" if any(o.compiled for o in outcomes) else ""
    console.print(f"{wall:.1f} s wall: {sum(o.train_seconds for o in outcomes):.1f} s training{compiled}, "
                  f"{sum(o.eval_seconds for o in outcomes):.1f} s evaluation "
                  f"({sum(len(o.rows) for o in outcomes)} evaluations)", highlight=False)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        rows = outcomes[0].rows if len(trials) == 1 else {str(t.seed): o.rows for t, o in zip(trials, outcomes)}
        json_path.write_text(json.dumps(rows, indent=1))
        say(f"rows written to {json_path}")
    if store is not None:
        log_runs(store, recipe, trials, outcomes, sets or [])
    if any(outcome.status == "diverged" for outcome in outcomes):
        raise typer.Exit(1)


def chosen_trials(recipe, algorithm: Optional[str], seeds: list[Optional[int]]) -> list:
    """The runs `fedbench run` runs: the algorithm's, with each of the seeds (None: the recipe's first)."""
    from .recipe import RecipeError

    try:
        return [recipe.single_trial(algorithm, seed) for seed in seeds]
    except RecipeError as err:
        fail(str(err), err.detail)


def build_runs(recipe_path: Path, trials: list, device: Optional[str]) -> tuple[bool, list]:
    """The simulations of `fedbench run`'s runs, and whether the planner (`fedbench.planning.plan`) lets them form one
    program: then on one problem instance (`build_batch`); what needs the built data is refused here (pfedfbe's λ
    above the clients' smoothness, or no CUDA)."""
    from fedbench.planning import plan
    from .driving import build_batch, build_simulation

    try:
        together = bool(plan(list(enumerate(trials)), cap=len(trials)).programs)
        return together, (build_batch(trials, device) if together
                          else [build_simulation(trial, device) for trial in trials])
    except ValueError as err:
        fail(f"{recipe_path}: {err}")


def run_title(trials: list, together: bool) -> str:
    """The line above `fedbench run`'s progress bar: the configuration and its seeds."""
    trial = trials[0]
    hp = ", ".join(f"{k}={v}" for k, v in trial.hyperparameters.items())
    listed = ", ".join(str(t.seed) for t in trials) if len(trials) <= FEW_SEEDS else (
        f"{trials[0].seed} … {trials[-1].seed} ({len(trials)})")
    seed_text = f"seed {trial.seed}" if len(trials) == 1 else (
        f"seeds {listed}" + (" as one program" if together else " one after another"))
    return f"[bold]{trial.recipe}[/]: {trial.problem} / {trial.algorithm} ({hp}), {seed_text}"


def drive_runs(recipe, trials: list, sims: list, tracking_uri: Optional[str], resume: bool) -> list:
    """`fedbench run`'s runs driven in their programs, built once (`fedbench.runs.programs`), under one progress bar
    for all seeds; each program resumes from its checkpoint with `--resume`, else starts at round 0."""
    from fedbench.runs import programs
    from .checkpoints import Checkpoint, policy_of
    from .driving import drive_batch

    with Progress(TextColumn("rounds"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, transient=False) as progress:
        task = progress.add_task("rounds", total=trials[0].federation.rounds * len(trials))  # one bar for all seeds
        reached = [0.0] * len(trials)

        def advance(i: int, row: dict[str, float], seconds: float) -> None:
            reached[i] = row["round"]
            progress.update(task, completed=sum(reached))

        policy = policy_of(recipe, tracking_uri)
        planned = programs(sims)
        saved = [Checkpoint(policy, [trials[i] for i in runs]) for runs, _ in planned]
        if resume and not any(checkpoint.path is not None and checkpoint.path.is_file() for checkpoint in saved):
            say("no checkpoint of these runs: starting at round 0")
        for checkpoint in saved if not resume else ():  # an earlier interrupted run's is not this run's start
            checkpoint.remove()
        models: list[dict[int, bytes]] = [{} for _ in trials]
        outcomes = drive_batch(sims, advance, policy, trials, planned=planned,
                               on_model=lambda i, round_, data: models[i].__setitem__(round_, data))
        for outcome, kept in zip(outcomes, models):
            outcome.models = kept
        return outcomes


def log_runs(store, recipe, trials: list, outcomes: list, sets: list[str]) -> None:
    """`fedbench run`'s runs logged to the store, with the --set options that made them (a report's title says
    them); a run the store refuses is kept for the next command (`spill`)."""
    import shlex
    from dataclasses import asdict

    from .report import headline_metrics
    from .tracking import StoreError, first_line, spill

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


IN_FLIGHT_SHOWN = 3  # running runs whose round the sweep's progress line shows


def sweep_progress(counts: dict) -> tuple[float, str]:
    """The sweep's progress from its counts: runs done, the runs in flight counted by their share of rounds done
    (so that the ETA moves while they run), and the line beside the bar, with the rounds the first in-flight runs
    have reached."""
    ended = counts["finished"] + counts["diverged"] + counts["failed"]
    in_flight = list(counts.get("in_flight", {}).values())  # (round reached, rounds) of each running run
    shown = ", ".join(f"r{reached:g}/{rounds}" for reached, rounds in in_flight[:IN_FLIGHT_SHOWN])
    more = " …" if len(in_flight) > IN_FLIGHT_SHOWN else ""
    done = ended + sum(reached / rounds for reached, rounds in in_flight if rounds)
    return done, (f"running {counts['running']}{f' ({shown}{more})' if shown else ''} · "
                  f"diverged {counts['diverged']} · failed {counts['failed']}")
FEW_SEEDS = 4  # up to this many seeds, `fedbench run` shows a column per seed; more, their statistics


def final_table(seeds: list[int], outcomes) -> Table:
    """The last row of each seed's run: a column per seed, or for many seeds mean, std, min and max."""
    final = [outcome.rows[-1] for outcome in outcomes]
    statuses = collections.Counter(o.status for o in outcomes)
    table = Table(title=f"round {final[0]['round']:g} ({', '.join(f'{n} {s}' for s, n in statuses.items())})"
                  if len(seeds) > 1 else f"round {final[0]['round']:g} ({outcomes[0].status})", show_header=True)
    table.add_column("metric")
    many = len(seeds) > FEW_SEEDS
    heads = (["mean", "std", "min", "max"] if many else [f"seed {seed}" for seed in seeds] if len(seeds) > 1
             else ["value"])
    for head in heads:
        table.add_column(head, justify="right")
    for key in final[0]:
        if key == "round":
            continue
        values = [row[key] for row in final]
        if many:
            values = [statistics.fmean(values), statistics.stdev(values), min(values), max(values)]
        table.add_row(key, *(f"{v:.6g}" if math.isfinite(v) else str(v) for v in values))
    return table


@app.command()
def sweep(
    recipe_paths: List[Path] = typer.Argument(..., metavar="RECIPE...", help="YAML recipe(s), or shipped recipes' "
                                              "names (fedbench recipes): several run one after another on one "
                                              "Ray, each with its experiment and report"),
    algorithms: Optional[List[str]] = typer.Option(None, "--algorithm", "-a", help="Sweep only this one of the "
                                                   "recipe's algorithms; repeat it for several"),
    sets: Optional[List[str]] = SetOption,
    with_plugins: Optional[List[str]] = WithOption,
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to join (default: start a local Ray)"),
    tracking_uri: Optional[str] = TrackingOption,
    max_concurrent: Optional[int] = typer.Option(None, "--max-concurrent",
                                                 help="At most this many Ray trials at once (>= 1)"),
    device: Optional[str] = DeviceOption,
    data_dir: Optional[Path] = DataOption,
    write_report: bool = typer.Option(True, "--report/--no-report", help="At the end, write the report "
                                      "(reports/<recipe name>/ beside the MLflow store) and log it on the parent run"),
    yes: bool = typer.Option(False, "--yes", help="Run a recipe of more runs than its max_runs: (default 2000)"),
) -> None:
    """Run every (config, seed) of the recipe on Ray Tune; runs already finished in the store are skipped. Several
    recipes are all checked before the first runs (--set and -a apply to each), and share one Ray."""
    use_data_dir(data_dir)
    from .cluster import ClusterError, one_cluster

    recipes = [load_recipe(path, sets, with_plugins=with_plugins, only=algorithms) for path in recipe_paths]
    for recipe in recipes:
        check_builds(recipe, **{"--max-concurrent": max_concurrent, "--device": device})
        if recipe.runs() > recipe.max_runs and not yes:  # a grid grown by a slip (a zero too many) is not started
            fail(f"{recipe.source}: max_runs: found {recipe.runs()} runs, above {recipe.max_runs}; pass --yes to run "
                 f"them all, or raise max_runs:")
    recipes = [on_device(recipe, device) for recipe in recipes]
    if len(recipes) == 1:
        ok = sweep_one(recipes[0], recipe_paths[0], sets, address, tracking_uri, max_concurrent, write_report)
    else:
        try:
            with one_cluster(recipes, address, max_concurrent):
                ok = all([sweep_one(recipe, path, sets, address, tracking_uri, max_concurrent, write_report)
                          for recipe, path in zip(recipes, recipe_paths)])
        except ClusterError as err:
            fail(str(err))
    if not ok:
        raise typer.Exit(1)


FAILURES_SHOWN = 5  # failed runs a sweep's console names, with the line that says why


def sweep_one(recipe, recipe_path: Path, sets: Optional[List[str]], address: Optional[str],
              tracking_uri: Optional[str], max_concurrent: Optional[int], write_report: bool) -> bool:
    """One recipe's sweep, its summary table, report and UI command; whether every run finished."""
    from .cluster import ClusterError
    from .recipe import RecipeError
    from .sweep import sweep as run_sweep
    from .tracking import StoreError

    columns = (TextColumn("runs"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[detail]}"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("runs", total=None, detail="starting Ray")

        def progress(event: str, counts: dict) -> None:
            if event == "start":
                skipped = f", {counts['skipped']} already done" if counts["skipped"] else ""
                bar.update(task, total=counts["total"], detail=f"to run{skipped}")
                return
            done, detail = sweep_progress(counts)
            bar.update(task, completed=done, detail=detail)

        try:
            summary = run_sweep(recipe, sets or [], tracking_uri, address, max_concurrent, progress)
        except (ClusterError, RecipeError, StoreError) as err:
            bar.stop()
            fail(str(err), getattr(err, "detail", ""))
        except KeyboardInterrupt:  # pressed again while Ray stopped: what was stored stays, the rest runs again
            bar.stop()
            errors.print("the sweep was interrupted; run the same command again to finish it", highlight=False)
            raise typer.Exit(130) from None
    table = Table(title=f"sweep {recipe.name}", show_header=True)
    for column in ("runs", "skipped (done before)", "finished", "diverged", "failed", "wall s", "compute s"):
        table.add_column(column, justify="right")
    counts = summary.counts
    table.add_row(str(summary.total), str(summary.skipped), str(counts["finished"]), str(counts["diverged"]),
                  str(counts["failed"]), f"{summary.wall_seconds:.1f}", f"{summary.compute_seconds:.1f}")
    console.print(table)
    from .tracking import tracking_uri as resolve_uri

    say(f"tracked in {resolve_uri(tracking_uri)} (experiment {recipe.name!r}, parent run {summary.parent_run_id})")
    if summary.elsewhere_runs:
        say(f"{summary.elsewhere_runs} runs left to another sweep of this recipe that is computing them "
            f"({', '.join(summary.elsewhere)}); run the same command after it ends to report them all")
    for failure in summary.failures[:FAILURES_SHOWN]:
        hp = ", ".join(f"{k}={v}" for k, v in failure.hyperparameters.items())
        where = (f"; the whole traceback: {program()} show {failure.run_id}" if failure.run_id
                 else "; set FEDBENCH_VERBOSE=1 (fedbench -v) to see the workers' output")
        errors.print(f"failed: {failure.algorithm} ({hp}) seed {failure.seed}: {failure.line}{where}",
                     highlight=False, soft_wrap=True)
    if len(summary.failures) > FAILURES_SHOWN:
        errors.print(f"... and {len(summary.failures) - FAILURES_SHOWN} more failed runs", highlight=False)
    for error, times in collections.Counter(summary.tracking_errors).items():
        errors.print(f"tracking error: {error}{f' ({times} times)' if times > 1 else ''}", highlight=False,
                     soft_wrap=True)
    if summary.unstored:
        errors.print(f"{summary.unstored} of the runs counted above were computed but are not in the store; run the "
                     "same command again to compute them again", highlight=False)
    if summary.interrupted:
        errors.print("the sweep was interrupted; run the same command again to finish it", highlight=False)
    elif write_report:
        from .report import ReportError

        try:
            show_report(make_report(tracking_uri, recipe=recipe))
        except ReportError as err:  # e.g. every run failed: the sweep's own exit code says the rest
            errors.print(f"no report: {err}", highlight=False)
    store = f" --tracking-uri {tracking_uri}" if tracking_uri else ""
    say(f"browse the runs: {program()} ui {recipe_path}{store} --open")
    return summary.ok


@app.command()
def tune(
    recipe_path: Path = typer.Argument(..., metavar="RECIPE", help=f"YAML recipe with a tune: block{OR_SHIPPED}"),
    algorithm: Optional[List[str]] = typer.Option(None, "--algorithm", "-a", help="Tune only these algorithms"),
    sets: Optional[List[str]] = SetOption,
    with_plugins: Optional[List[str]] = WithOption,
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to join (default: start a local Ray)"),
    tracking_uri: Optional[str] = TrackingOption,
    max_concurrent: Optional[int] = typer.Option(None, "--max-concurrent", help="At most this many Ray trials at "
                                                 "once (>= 1)"),
    fresh: bool = typer.Option(False, "--fresh", help="Delete the studies of an earlier call and start over"),
    rerun_best: Optional[int] = typer.Option(None, "--rerun-best",
                                             help="Re-run each best configuration on N >= 0 fresh seeds (default: "
                                             "tune.rerun_best)"),
    device: Optional[str] = DeviceOption,
    data_dir: Optional[Path] = DataOption,
) -> None:
    """Optuna search of the recipe's tune: space, the same budget for every algorithm, on Ray Tune."""
    use_data_dir(data_dir)
    from .cluster import ClusterError
    from .recipe import RecipeError
    from .tracking import StoreError
    from .tuning import tune_recipe

    recipe = load_recipe(recipe_path, sets, with_plugins=with_plugins, only=algorithm)
    if recipe.tune is None:
        fail(f"{recipe_path}: tune: missing; `fedbench tune` needs a tune: block (space, metric, mode, trials)")
    chosen = list(recipe.algorithms)
    check_builds(recipe, **{"--max-concurrent": max_concurrent, "--rerun-best": rerun_best, "--device": device})
    recipe = on_device(recipe, device)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[detail]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        tasks = {}

        def progress(event: str, info: dict) -> None:
            name = info["algorithm"]
            if event == "algorithm":
                tasks[name] = bar.add_task(name, total=info["trials"], detail="")
                return
            done = sum(info[k] for k in ("finished", "pruned", "diverged", "failed"))
            bar.update(tasks[name], completed=done, detail=f"pruned {info['pruned']} · diverged {info['diverged']} · "
                                                           f"failed {info['failed']}")

        try:
            summary = tune_recipe(recipe, chosen, sets or [], tracking_uri, address, max_concurrent, fresh,
                                  rerun_best, progress)
        except (ClusterError, RecipeError, StoreError) as err:
            bar.stop()
            fail(str(err), getattr(err, "detail", ""))
    show_tuned(recipe, summary)
    console.print(f"studies in {summary.storage} (optuna-dashboard {summary.storage}); runs under parent "
                  f"{summary.parent_run_id} in experiment {recipe.name!r}", highlight=False)
    for error in summary.tracking_errors:
        errors.print(f"tracking error: {error}", highlight=False)


def show_tuned(recipe, summary) -> None:
    """`tune`'s summary: this call's trials by how they ended, apart from the study's trials over every call (what
    its best is the best of); the best values whole, one line per algorithm below the table (a table column cut
    `client_lr=0.000123` to `client_lr=0.…` at 80 columns)."""
    from .tuning import describe

    spec = recipe.tune
    table = Table(title=f"tune {recipe.name}: {spec.objective} {spec.metric} ({spec.mode})")
    for column in ("algorithm", "this call's trials: ok / pruned / diverged / failed", "study's trials (all calls)",
                   "study's best", "fresh seeds: mean ± std"):
        table.add_column(column, overflow="fold")  # folded, never cut to "…"
    for result in summary.results:
        counts = result.counts
        reruns = (f"{describe(result.fresh_values)} ({','.join(map(str, result.fresh_seeds))})"
                  if result.fresh_seeds else "-")
        table.add_row(result.algorithm, f"{sum(counts.values())}: " + "/".join(str(counts[k]) for k in counts),
                      str(result.study_trials), f"{result.best_value:.4g}", reruns)
    console.print(table)
    for result in summary.results:
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in result.best_params.items())
        say(f"{result.algorithm}: study's best {params or '-'}")


class XAxis(str, Enum):
    rounds = "rounds"
    comm = "comm"
    comm_bits = "comm_bits"
    comm_up_bits = "comm_up_bits"
    comm_down_bits = "comm_down_bits"
    iterations = "iterations"
    seconds = "seconds"


def make_report(tracking_uri: Optional[str], **source):
    from .report import report

    return report(open_store(tracking_uri, write=False), **source)


def show_report(result) -> None:
    """Each algorithm's best configuration, and where the files went."""
    from .report import final_text

    settings = result.settings
    table = Table(title=f"best configuration per algorithm (final {settings.label(settings.select.metric)}, "
                        f"{settings.select.mode})")
    for column in ("algorithm", "configuration", "status", "final mean ± std"):
        table.add_column(column)
    for config in result.configurations:
        if config.best:
            table.add_row(settings.label(config.algorithm), config.varying or "–", config.status,
                          final_text(config, settings.select.metric))
    console.print(table)
    logged = f"; {result.logged}" if result.logged else ""
    say(f"report: {result.out / 'index.html'} ({len(result.files)} files){logged}")


@app.command()
def report(
    recipe_path: Optional[Path] = typer.Argument(None, metavar="[RECIPE]",
                                                 help=f"Report the sweep of this recipe{OR_SHIPPED} "
                                                 "(its runs in the store)"),
    experiment: Optional[str] = typer.Option(None, "--experiment", "-e", help="Report every run of this experiment"),
    run_id: Optional[str] = typer.Option(None, "--run", help="Report this sweep or tuning session (its parent run id)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o",
                                       help="Folder to write (default: reports/<name>/ beside the MLflow store)"),
    x: Optional[XAxis] = typer.Option(None, "--x", help="x-axis: rounds, floats communicated, bits communicated "
                                  "(both ways, up or down, as the uplink and downlink encode them), local iterations "
                                  "or training seconds (default: the recipe's report.x, else rounds)"),
    sets: Optional[List[str]] = SetOption,
    with_plugins: Optional[List[str]] = WithOption,
    tracking_uri: Optional[str] = TrackingOption,
) -> None:
    """Curves (mean ± standard error over seeds), a paper-style figure and best-configuration tables from
    the runs in MLflow; written to a folder and logged on the sweep's parent run."""
    from .recipe import RecipeError
    from .report import ReportError

    given = [name for name, value in (("RECIPE", recipe_path), ("--experiment", experiment), ("--run", run_id))
             if value is not None]
    if len(given) != 1:
        fail(f"give exactly one of RECIPE, --experiment NAME or --run PARENT_RUN_ID "
             f"(found {', '.join(given) or 'none'})")
    recipe = load_recipe(recipe_path, sets, with_plugins=with_plugins) if recipe_path is not None else None
    try:
        result = make_report(tracking_uri, recipe=recipe, experiment=experiment, run_id=run_id, out=out,
                             x=x.value if x else None, overridden=bool(sets))
    except (ReportError, RecipeError) as err:
        fail(str(err), getattr(err, "detail", ""))
    if recipe is not None and result.source.recipe is not recipe:  # the sweep made with --set it stands for
        say(f"reporting {result.source.description}")
    show_report(result)


@app.command()
def show(
    run_id: str = typer.Argument(..., metavar="RUN_ID", help="An MLflow run id, as a sweep's console names a failed "
                                                            "run, or a sweep's parent run"),
    tracking_uri: Optional[str] = TrackingOption,
) -> None:
    """One run: its algorithm, seed, status and configuration, its last metrics, and, for a run that failed, its
    whole error (the traceback the console cut to its last line); for a sweep's or tuning session's parent run, a
    table of its runs (algorithm, configuration, seed, status, run id)."""
    from .claims import CLAIM
    from .tracking import StoreError

    store = open_store(tracking_uri, write=False)
    try:
        run = store.run(run_id)
    except StoreError as err:
        fail(str(err))
    tags = run.data.tags
    what = f"{tags['algorithm']} seed {tags.get('seed', '–')}, " if "algorithm" in tags else ""  # not a parent's
    say(f"run {run_id} ({tags.get('role', 'untagged')}): {what}status {tags.get('status') or run.info.status.lower()}, "
        f"experiment {run.info.experiment_id}")
    for name, value in sorted(run.data.params.items()):
        if not name.startswith(f"{CLAIM}/"):  # a sweep's bookkeeping of which process runs what (`sweeps.claims`)
            say(f"  {name} = {value}")
    if run.data.metrics:
        say("last values: " + ", ".join(f"{name} {value:.6g}" for name, value in sorted(run.data.metrics.items())))
    if "error" in tags:
        say("error:")
        console.print(tags["error"], highlight=False, markup=False, soft_wrap=True)
    children = store.children(run) if tags.get("role") in ("sweep", "tune") else []
    if children:
        console.print(children_table(children))
        say(f"{len(children)} runs; `{program()} show RUN_ID` shows one")


def children_table(runs: list) -> Table:
    """A parent's runs, one row each, by algorithm, configuration and seed; a configuration as the hyperparameters
    that vary between its algorithm's runs (all of them in `fedbench show RUN_ID`)."""
    from .report.statistics import short

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    by_algorithm = collections.defaultdict(list)
    table_rows = []
    for run in runs:
        by_algorithm[run.data.tags.get("algorithm", "–")].append(run)
    for algorithm, mine in sorted(by_algorithm.items()):
        params = [{k: v for k, v in run.data.params.items() if k != "seed"} for run in mine]
        keys = dict.fromkeys(k for p in params for k in p)
        varying = [k for k in keys if len({p.get(k) for p in params}) > 1]
        rows = []
        for run, p in zip(mine, params):
            configuration = ", ".join(f"{k.removeprefix('algorithm.')}={short(p.get(k, 'none'))}" for k in varying)
            tags = run.data.tags
            rows.append((configuration or "–", int(tags.get("seed", -1)), tags.get("status") or run.info.status.lower(),
                         run.info.run_id))
        table_rows += [(algorithm, configuration, str(seed), status, run_id)
                       for configuration, seed, status, run_id in sorted(rows)]
    longest_word = max((len(word) for row in table_rows for word in row[1].split()), default=1)
    for column in ("algorithm", "configuration", "seed", "status", "run id"):  # a configuration wraps between words
        table.add_column(column, no_wrap=column != "configuration",
                         min_width=longest_word if column == "configuration" else None)
    for row in table_rows:
        table.add_row(*row)
    return table


@app.command()
def export(
    run_id: str = typer.Argument(..., metavar="RUN_ID", help="An MLflow run id (a run of a sweep or of fedbench run)"),
    path: Path = typer.Argument(..., metavar="PATH", help="The file to write (torch's format, see fedbench.saved)"),
    round_: Optional[int] = typer.Option(None, "--round", min=1, help="The model of this round (saved with the "
                                         "recipe's tracking.models_every), not the final one"),
    tracking_uri: Optional[str] = TrackingOption,
) -> None:
    """Write a run's final model to PATH: the global model, in the problem's own shapes too, and each client's
    model for a personalized method; `fedbench.load_model(PATH)` reads it back (`fedbench.load_model(RUN_ID)`
    straight from the store)."""
    from fedbench.saved import load_model
    from .tracking import StoreError

    store = open_store(tracking_uri, write=False)
    try:
        data = store.run_model(run_id, round_)
    except StoreError as err:
        fail(str(err))
    path.write_bytes(data)
    model = load_model(data)
    shapes = ", ".join(f"{name} {list(value.shape)}" for name, value in model["parameters"].items())
    personal = model["personal"]
    say(f"{path}: {model['algorithm']} on {model['problem']}, round {model['round']} ({model['status']}): {shapes}"
        + (f"; personal models {list(personal.shape)}" if personal is not None else "")
        + (f"; personal models left out ({model['personal_left_out']})" if model["personal_left_out"] else ""))


@app.command()
def validate(
    recipe_path: Path = typer.Argument(..., metavar="RECIPE", help=f"YAML recipe{OR_SHIPPED}"),
    sets: Optional[List[str]] = SetOption,
    with_plugins: Optional[List[str]] = WithOption,
) -> None:
    """Check a recipe without running anything: as building its runs would (the index of real data read, not
    the data)."""
    recipe = load_recipe(recipe_path, sets, with_plugins=with_plugins)
    check_builds(recipe)
    configurations = len(recipe.trials()) // len(recipe.seeds)
    console.print(f"{recipe_path}: ok — problem {recipe.problem}, algorithms {', '.join(recipe.algorithms)}, "
                  f"{configurations} configurations × {len(recipe.seeds)} seeds", highlight=False)


@app.command("list")
def list_components(
    names: Optional[List[str]] = typer.Argument(
        None, metavar="NAME", help="What to print in full: a section (problems, algorithms, federation, "
        "transforms, privacy, capabilities, schedules), a name (fedavg, lasso, top_k, participation), or a recipe "
        "field's path or its start (federation.local_steps, algorithms.fedavg.client_lr, algorithms.fedavg.client): "
        "the entries it names, with the parameters whose names start with the path's rest; repeatable"),
    with_plugins: Optional[List[str]] = WithOption,
) -> None:
    """What a recipe may name and set: without NAME an overview, with NAMEs those in full.

    Problems, algorithms (marked where they take uneven local work), the federation's fields (its adversaries,
    participation model and uneven local steps), the transforms its uplink and downlink may chain, privacy
    accounting, capabilities and schedules. Without NAME, each by name with a line about it; with NAMEs, those in
    full: each parameter with its type, default, valid values and meaning, and where each component came from
    (built in, or a plugin: installed packages' entry points, and those given with --with)."""
    from fedbench import plugins
    from .catalogue import closest, listing

    plugins.discover()
    for spec in with_plugins or []:
        try:
            plugins.load(spec)
        except plugins.PluginError as err:
            fail(f"--with: {err}")
    lines, unknown = listing(names or [], console.width, program())
    for name in unknown:
        near = ", ".join(closest(name))
        fail(f"{name}: names no section, component or recipe field of `{program()} list` "
             f"({f'closest: {near}; ' if near else ''}`{program()} list` without a name lists them)")
    for line in lines:  # wrapped already, between words; as written (a [range] is text, not Rich markup)
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for (title, name), why in sorted(plugins.broken_entry_points().items()):
        say(f"{title} {name}: not loaded: {why}")


WIDE_TABLE = 140  # columns from which `fedbench recipes` is a table: below, its five columns cut the text


@app.command("recipes")
def list_recipes() -> None:
    """The shipped recipes, each by the name that runs it from any folder (`fedbench sweep papers/bao2022_lasso`):
    the paper, what it reproduces, its runs (configurations × seeds) and, where measured, its time on 2 CPU cores and
    on one GPU."""
    from .recipe import RecipeError, load
    from .shipped import describe, find, names, root

    shipped = names()
    if not shipped:
        fail(f"no shipped recipes in {root()}")
    rows = []
    for name in shipped:
        path = find(name)
        assert path is not None  # a shipped name
        about = describe(path)
        try:
            recipe = load(path)
            count = len(recipe.trials())
            runs = f"{count // len(recipe.seeds)} × {len(recipe.seeds)} = {count}"
        except RecipeError:  # e.g. a plugin it names is not installed: `validate` says why
            runs = "?"
        rows.append((name, about.get("paper", "—"), about.get("reproduces", "—"), runs,
                     about.get("time on 2 cores", "—"), about.get("time on one GPU", "—")))
    if console.is_terminal and console.width >= WIDE_TABLE:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("recipe", no_wrap=True)
        table.add_column("paper")
        table.add_column("reproduces")
        table.add_column("runs", justify="right", no_wrap=True)
        table.add_column("time on 2 cores")
        table.add_column("time on one GPU")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    else:  # a narrow terminal or a pipe: a block per recipe, its text whole (a table cut it to "Fast…")
        for name, paper, reproduces, runs, time, gpu_time in rows:
            gpu = f"\n    time on one GPU: {gpu_time}" if gpu_time != "—" else ""
            console.print(f"{name}   {runs} runs   time on 2 cores: {time}\n    paper: {paper}\n"
                          f"    reproduces: {reproduces}{gpu}",
                          highlight=False, soft_wrap=True, markup=False)
    example = "papers/bao2022_lasso" if "papers/bao2022_lasso" in shipped else shipped[0]
    say(f"runs = configurations × seeds; from any folder: {program()} sweep {example} (also run, tune, validate, "
        f"report, ui); the files: {root()}")


UI_PORT = 5000  # MLflow's own default
PORTS_TRIED = 100  # without --port: the default and the ports after it, until one is free
UI_STOP_SECONDS = 10  # how long a stopped `fedbench ui` waits for the MLflow server to end before killing it


@app.command()
def ui(
    recipe_path: Optional[Path] = typer.Argument(None, metavar="[RECIPE]",
                                                 help=f"Land on this recipe's experiment{OR_SHIPPED}"),
    experiment: Optional[str] = typer.Option(None, "--experiment", "-e", help="Land on this experiment"),
    open_browser: bool = typer.Option(False, "--open", help="Open the page in the default browser once it is served"),
    tracking_uri: Optional[str] = TrackingOption,
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind (0.0.0.0 exposes it to the network)"),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535,
                                       help=f"Port (default {UI_PORT}, or the first free one after it)"),
) -> None:
    """Start the MLflow UI on the tracking store (telemetry off) and print the page of the experiment's runs:
    MLflow's model-training view, every run but the sweep parents listed, their per-round curves charted."""
    with noted_stops() as stopped_by:
        browse(recipe_path, experiment, open_browser, tracking_uri, host, port, stopped_by)


@contextlib.contextmanager
def noted_stops() -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM noted in the list yielded, not raised, while inside; the handlers set before are set
    again at its end. An exception raised from a handler is lost where the signal lands in a weakref callback
    (SQLAlchemy's, while `ui` queried its store: the UI then served on, 4 of 26 stops here), and a blocking
    waitpid is not woken by a signal that another of the process's threads takes."""
    noted: list[int] = []
    before = {number: signal.signal(number, lambda received, _: noted.append(received))
              for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield noted
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def browse(recipe_path: Optional[Path], experiment: Optional[str], open_browser: bool, tracking_uri: Optional[str],
           host: str, port: Optional[int], stopped_by: list[int]) -> None:
    """`ui`, its stops noted in `stopped_by` and looked at where it waits: before the server starts, while it
    starts and while it serves."""
    from .tracking import last_line, runs_url, sqlite_path, tracking_uri as resolve_uri

    if recipe_path is not None and experiment is not None:
        fail("give RECIPE or --experiment, not both")
    if recipe_path is not None:  # a misspelt name first, before the store is looked for
        recipe_path = recipe_file(recipe_path)
    uri = resolve_uri(tracking_uri)
    path = sqlite_path(uri)
    if path is not None and not path.exists():
        fail(f"no MLflow store at {path}; run `fedbench sweep` or `fedbench run` here first, or pass --tracking-uri")
    name = load_recipe(recipe_path, None).name if recipe_path is not None else experiment
    store = open_store(uri)
    if name is None:  # the store's one fedbench experiment, if there is just one
        found = [e.name for e in store.client.search_experiments() if e.name != "Default"]
        name = found[0] if len(found) == 1 else None
    elif store.client.get_experiment_by_name(name) is None:
        fail(f"no experiment {name!r} in {uri}; run `fedbench sweep` on its recipe first")
    if path is not None:
        port = listen_port(host, port)
    base = uri.rstrip("/") if path is None else f"http://{host}:{port}"
    experiment_id = store.experiment(name) if name else None  # also marks an older experiment's kind
    table = runs_url(base, experiment_id)

    def pages() -> None:
        say(f"runs:   {table}")
        if experiment_id is not None:
            say(f"charts: {runs_url(base, experiment_id, charts=True)}")
            say(run_counts(store, experiment_id, name))

    if path is None:  # a tracking server serves its own UI
        pages()
        if open_browser:
            webbrowser.open(table)
        return
    assert port is not None  # listen_port chose it
    if stopped_by:
        raise typer.Exit(128 + stopped_by[0])
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{path.resolve()}",
               "--host", host, "--port", str(port)]
    # The server's own lines, unless `fedbench -v`: in the system's temporary folder, not the researcher's
    log = Path(tempfile.gettempdir()) / f"fedbench-ui-{port}.log"
    output = None if os.environ.get("FEDBENCH_VERBOSE") == "1" else log.open("w")
    # One worker serves one researcher; its own process group, so that stopping `fedbench ui` (Ctrl-C or
    # SIGTERM) stops the server's workers too instead of leaving them running (~250 MB each).
    server = subprocess.Popen(command + ["--workers", "1"], env={**os.environ, "MLFLOW_TRACKING_URI": uri},
                              stdout=output, stderr=subprocess.STDOUT if output else None, start_new_session=True)
    # Its start takes 10-60 s (imports, the store's check): said at once, the links when it answers
    say(f"starting the MLflow UI server on {host}:{port} (its log: {log if output else 'below'}); its links follow "
        "once it answers, Ctrl-C stops it")
    try:
        if serving(server, host, port, stopping=lambda: bool(stopped_by)):
            pages()  # once the server answers: a page opened before (~30 s here) was an error page
            say(f"serving (its log: {log if output else 'above'}); Ctrl-C stops it")
            if open_browser:
                webbrowser.open(table)
            while server.poll() is None and not stopped_by:
                time.sleep(0.2)
        elif not stopped_by:
            lines = log.read_text(errors="replace").splitlines()[-20:] if output else []
            last = f" ({last_line(chr(10).join(lines))})" if lines else ""
            fail(f"the MLflow UI server did not start on {host}:{port}{last}; its log: {log if output else 'above'}",
                 " | ".join(lines))
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=UI_STOP_SECONDS)
            except subprocess.TimeoutExpired:  # its job consumers can outlast a SIGTERM by minutes: not ours to wait
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    raise typer.Exit(128 + stopped_by[0] if stopped_by else server.returncode)  # 130 after Ctrl-C, 143 SIGTERM


def run_counts(store, experiment_id: str, name: str | None) -> str:
    """How many runs the page lists, and the parent runs that group them, which MLflow's own counts include (a
    15-run sweep is 16 runs there) and the page filters out."""
    roles = collections.Counter(run.data.tags.get("role", "other") for run in store.search(experiment_id, ""))
    parents = roles.pop("sweep", 0) + roles.pop("tune", 0)
    listed = sum(roles.values())
    return (f"experiment {name!r}: {listed} run{'s' if listed != 1 else ''} listed"
            + (f", and {parents} parent run{'s' if parents != 1 else ''} (a sweep or tuning session, tag role) that "
               f"group them, which the page filters out and MLflow's own counts include" if parents else ""))


def listen_port(host: str, port: Optional[int]) -> int:
    """The port `ui` serves on: the one given, refused (exit 2) when it is in use, for the page would be the
    other program's; without --port the default, or the first free port after it, said so."""
    import errno

    chosen = port
    if chosen is None:
        chosen = next((p for p in range(UI_PORT, UI_PORT + PORTS_TRIED) if listen_error(host, p) is None), UI_PORT)
        if chosen != UI_PORT:
            say(f"port {UI_PORT} is in use; serving on port {chosen} instead")
    error = listen_error(host, chosen)
    if error is not None and error.errno == errno.EADDRINUSE:
        fail(f"port {chosen} of {host} is in use by another program; choose another with --port")
    if error is not None:
        fail(f"cannot serve on {host}:{chosen} ({error.strerror or error}); choose another --host or --port")
    return chosen


def listen_error(host: str, port: int) -> Optional[OSError]:
    """Why a server could not listen on host:port now (None: it could). Bound and let go at once, with
    SO_REUSEADDR as MLflow's uvicorn binds, so that a port an earlier `fedbench ui` just closed is free."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as err:
        return err
    return None


def serving(server: subprocess.Popen, host: str, port: int, stopping: Callable[[], bool] = lambda: False,
            timeout: float | None = None) -> bool:
    """Wait until the UI server we started answers as MLflow (False if it exited, `stopping()` said so or `timeout`
    seconds ran out). Without a timeout, as long as the server lives: its start took 25-64 s on a loaded machine, past
    the 60 s this waited once, and a server that has not failed is still starting (Ctrl-C stops it). A connection
    alone proves nothing: another program could hold the port, our server failing to bind it; so MLflow's /version
    must answer with this MLflow's version, and our server must still run."""
    import http.client

    from mlflow.version import VERSION

    address = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # the wildcard, reached on loopback
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    while server.poll() is None and not stopping() and time.monotonic() < deadline:
        connection = http.client.HTTPConnection(address, port, timeout=2)  # not urllib: no proxy in between
        try:
            connection.request("GET", "/version")
            response = connection.getresponse()
            if response.status == 200 and response.read().decode(errors="replace").strip() == VERSION:
                return server.poll() is None
        except (OSError, http.client.HTTPException):  # not listening yet, or not speaking HTTP
            pass
        finally:
            connection.close()
        time.sleep(0.2)
    return False


if __name__ == "__main__":
    app()
