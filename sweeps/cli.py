"""fedbench command line: `fedbench run | sweep | tune | report | show | export | validate | list | recipes | ui`
(installed as fedbench_sweeps.cli; in a checkout `python cli.py`, which imports it as sweeps.cli).

The command table: each command's arguments and options, and the steps it takes, written elsewhere: the console
and the refusals the commands share (`sweeps.console`), `fedbench run`'s runs driven in-process
(`sweeps.driving`), what the commands show (`sweeps.display`), the MLflow UI (`sweeps.ui`) and what `fedbench list`
lists (`sweeps.catalogue`). Everything beyond Typer and Rich is imported by the command that needs it, so that
`fedbench --help` starts at once."""
from __future__ import annotations

import inspect
import json
import logging
import os
from enum import Enum
from pathlib import Path
from typing import Any, List, Optional

import typer
import typer.core

from .console import (
    check_builds,
    check_not_interrupted,
    check_room,
    chosen_trials,
    console,
    fail,
    load_recipe,
    log_runs,
    on_device,
    open_store,
    program,
    say,
    use_data_dir,
)
from .display import sweep_one
from .ui import UI_PORT, browse, noted_stops


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

OR_SHIPPED = ", or a shipped recipe's name, e.g. papers/bao2022_lasso (fedbench recipes lists them)"
SetOption = typer.Option(None, "--set", "-s", help="Override a recipe field: path=value, e.g. algorithm.client_lr=1e-3")
WithOption = typer.Option(None, "--with", metavar="PLUGIN", help="A plugin (my_method.py, or my_pkg.module) whose "
                          "algorithms join the recipe's, with default hyperparameters (--set gives them a grid)")
DataOption = typer.Option(None, "--data-dir", envvar="FEDBENCH_DATA",
                          help="Root of real datasets (sets FEDBENCH_DATA for this run and its Ray workers)")
DeviceOption = typer.Option(None, "--device", help="auto, cpu, cuda or cuda:N (default: the recipe's device:)")


def tracking_driver(uri: Optional[str]) -> Optional[str]:
    """--tracking-uri (or MLFLOW_TRACKING_URI) as given; a PostgreSQL one whose default driver is not installed is
    said to use psycopg2 instead, or refused where neither is (`database.with_driver`)."""
    if uri is None or not uri.startswith("postgresql://"):
        return uri
    from .database import StoreError, driver_note

    try:
        note = driver_note(uri)
    except StoreError as err:
        fail(str(err))
    if note:
        say(note)
    return uri


# RAY_ADDRESS as Ray itself reads it (and `ray job submit` sets it for its entrypoint): a Ray already running
AddressOption = typer.Option(None, "--address", envvar="RAY_ADDRESS",
                             help="Ray cluster to join (default: RAY_ADDRESS if set, else start a local Ray)")
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
    resume: Optional[bool] = typer.Option(None, "--resume/--restart", help="Go on from the checkpoint an "
                                          "interrupted run of this configuration and seed(s) left (the recipe's "
                                          "checkpoints block says how often runs save one), or start at round 0 "
                                          "and drop it; with neither, a run that finds one is refused"),
    data_dir: Optional[Path] = DataOption,
) -> None:
    """Run one configuration in-process (no Ray): one algorithm, one value per hyperparameter, one or more
    seeds."""
    use_data_dir(data_dir)
    from fedbench.memory import keep_freed_memory
    from .display import drive_with_progress, run_title, show_outcomes
    from .driving import build_runs

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
    if resume is None:
        check_not_interrupted(recipe_path, recipe, trials, tracking_uri)
    keep_freed_memory()
    try:  # what needs the built data is refused here (pfedfbe's λ above the clients' smoothness, or no CUDA)
        together, sims = build_runs(trials, device)
    except ValueError as err:
        fail(f"{recipe_path}: {err}")
    console.print(run_title(trials, together), highlight=False)
    for name, value in sims[0].problem.choices().items():  # e.g. a deep network's layout over the clients
        console.print(f"{name}: {value}", highlight=False)
    outcomes = drive_with_progress(recipe, trials, sims, tracking_uri, bool(resume))
    show_outcomes(trials, outcomes)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        rows = outcomes[0].rows if len(trials) == 1 else {str(t.seed): o.rows for t, o in zip(trials, outcomes)}
        json_path.write_text(json.dumps(rows, indent=1))
        say(f"rows written to {json_path}")
    if store is not None:
        log_runs(store, recipe, trials, outcomes, sets or [])
    if any(outcome.status == "diverged" for outcome in outcomes):
        raise typer.Exit(1)


@app.command()
def sweep(
    recipe_paths: List[Path] = typer.Argument(..., metavar="RECIPE...", help="YAML recipe(s), or shipped recipes' "
                                              "names (fedbench recipes): several run one after another on one "
                                              "Ray, each with its experiment and report"),
    algorithms: Optional[List[str]] = typer.Option(None, "--algorithm", "-a", help="Sweep only this one of the "
                                                   "recipe's algorithms; repeat it for several"),
    sets: Optional[List[str]] = SetOption,
    with_plugins: Optional[List[str]] = WithOption,
    address: Optional[str] = AddressOption,
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


@app.command()
def tune(
    recipe_path: Path = typer.Argument(..., metavar="RECIPE", help=f"YAML recipe with a tune: block{OR_SHIPPED}"),
    algorithm: Optional[List[str]] = typer.Option(None, "--algorithm", "-a", help="Tune only these algorithms"),
    sets: Optional[List[str]] = SetOption,
    with_plugins: Optional[List[str]] = WithOption,
    address: Optional[str] = AddressOption,
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
    from .display import show_tuned, tune_with_progress

    recipe = load_recipe(recipe_path, sets, with_plugins=with_plugins, only=algorithm)
    if recipe.tune is None:
        fail(f"{recipe_path}: tune: missing; `fedbench tune` needs a tune: block (space, metric, mode, trials)")
    chosen = list(recipe.algorithms)
    check_builds(recipe, **{"--max-concurrent": max_concurrent, "--rerun-best": rerun_best, "--device": device})
    recipe = on_device(recipe, device)
    summary = tune_with_progress(recipe, chosen, sets, tracking_uri, address, max_concurrent, fresh, rerun_best)
    show_tuned(recipe, summary)


class XAxis(str, Enum):
    rounds = "rounds"
    comm = "comm"
    comm_bits = "comm_bits"
    comm_up_bits = "comm_up_bits"
    comm_down_bits = "comm_down_bits"
    iterations = "iterations"
    seconds = "seconds"


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
    from .display import make_report, show_report
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
    from .display import show_run

    show_run(open_store(tracking_uri, write=False), run_id)


@app.command()
def export(
    run_id: str = typer.Argument(..., metavar="RUN_ID", help="An MLflow run id (a run of a sweep or of fedbench run)"),
    path: Path = typer.Argument(..., metavar="PATH", help="The file to write (torch's format: fedbench.engine.saved)"),
    round_: Optional[int] = typer.Option(None, "--round", min=1, help="The model of this round (saved with the "
                                         "recipe's tracking.models_every), not the final one"),
    tracking_uri: Optional[str] = TrackingOption,
) -> None:
    """Write a run's final model to PATH: the global model, in the problem's own shapes too, and each client's
    model for a personalized method; `fedbench.load_model(PATH)` reads it back (`fedbench.load_model(RUN_ID)`
    straight from the store)."""
    from fedbench.engine.saved import load_model
    from .database import StoreError

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
        None, metavar="NAME", help="What to print in full: a section (problems, algorithms, networks, federation, "
        "transforms, privacy, compile, capabilities, schedules), a name (fedavg, lasso, top_k, participation), or a "
        "recipe field's path or its start (federation.local_steps, algorithms.fedavg.client_lr, "
        "algorithms.fedavg.client): the entries it names, with the parameters whose names start with the path's "
        "rest; repeatable"),
    with_plugins: Optional[List[str]] = WithOption,
) -> None:
    """What a recipe may name and set: without NAME an overview, with NAMEs those in full.

    Problems, algorithms (marked where they take uneven local work), networks, the federation's fields and each axis
    of the registry `fedbench.axes.registry.AXES` (its chains, adversaries, participation model, uneven local steps,
    server optimizer, client dropout; privacy accounting and compiled steps at the top level), the transforms its uplink
    and downlink may chain, capabilities and schedules. Without NAME, each by name with a line about it; with NAMEs,
    those in full: each parameter with its type, default, valid values and meaning, and where each component came from
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


@app.command("recipes")
def list_recipes() -> None:
    """The shipped recipes, each by the name that runs it from any folder (`fedbench sweep papers/bao2022_lasso`):
    the paper, what it reproduces, its runs (configurations × seeds) and, where measured, its time on 2 CPU cores and
    on one GPU."""
    from .display import show_recipes

    show_recipes()


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


if __name__ == "__main__":
    app()
