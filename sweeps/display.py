"""What the commands show, beyond a line: progress bars while they run (a run's rounds, a sweep's runs, a tuning
session's trials) and tables when they end (a run's last row by seed, a sweep's counts, the tuned configurations,
each algorithm's best configuration in a report, a stored run and a parent's runs, the shipped recipes)."""
from __future__ import annotations

import collections
import math
import statistics
from pathlib import Path
from typing import List, Optional

import typer
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from .console import console, errors, fail, open_store, program, say

FEW_SEEDS = 4  # up to this many seeds, `fedbench run` shows a column per seed; more, their statistics


def run_title(trials: list, together: bool) -> str:
    """The line above `fedbench run`'s progress bar: the configuration and its seeds."""
    trial = trials[0]
    hp = ", ".join(f"{k}={v}" for k, v in trial.hyperparameters.items())
    listed = ", ".join(str(t.seed) for t in trials) if len(trials) <= FEW_SEEDS else (
        f"{trials[0].seed} … {trials[-1].seed} ({len(trials)})")
    seed_text = f"seed {trial.seed}" if len(trials) == 1 else (
        f"seeds {listed}" + (" as one program" if together else " one after another"))
    return f"[bold]{trial.recipe}[/]: {trial.problem} / {trial.algorithm} ({hp}), {seed_text}"


def drive_with_progress(recipe, trials: list, sims: list, tracking_uri: Optional[str], resume: bool) -> list:
    """`fedbench run`'s runs driven (`sweeps.driving.drive_runs`) under one progress bar for all seeds."""
    from .driving import drive_runs

    with Progress(TextColumn("rounds"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, transient=False) as progress:
        task = progress.add_task("rounds", total=trials[0].federation.rounds * len(trials))  # one bar for all seeds
        reached = [0.0] * len(trials)

        def advance(i: int, row: dict[str, float], seconds: float) -> None:
            reached[i] = row["round"]
            progress.update(task, completed=sum(reached))

        return drive_runs(recipe, trials, sims, tracking_uri, resume, advance, say)


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


def show_outcomes(trials: list, outcomes: list) -> None:
    """`fedbench run`'s end: the last row of each seed's run (`final_table`), and where the time went."""
    console.print(final_table([t.seed for t in trials], outcomes))
    wall = sum(o.wall_seconds for o in outcomes)
    compiled = " (local steps compiled)" if any(o.compiled for o in outcomes) else ""
    console.print(f"{wall:.1f} s wall: {sum(o.train_seconds for o in outcomes):.1f} s training{compiled}, "
                  f"{sum(o.eval_seconds for o in outcomes):.1f} s evaluation "
                  f"({sum(len(o.rows) for o in outcomes)} evaluations)", highlight=False)


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


FAILURES_SHOWN = 5  # failed runs a sweep's console names, with the line that says why


def sweep_one(recipe, recipe_path: Path, sets: Optional[List[str]], address: Optional[str],
              tracking_uri: Optional[str], max_concurrent: Optional[int], write_report: bool) -> bool:
    """One recipe's sweep, its summary table, report and UI command; whether every run finished."""
    summary = sweep_with_progress(recipe, sets, address, tracking_uri, max_concurrent)
    show_sweep(recipe, summary, tracking_uri)
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


def sweep_with_progress(recipe, sets: Optional[List[str]], address: Optional[str], tracking_uri: Optional[str],
                        max_concurrent: Optional[int]):
    """The recipe swept (`sweeps.sweep.sweep`) under a progress bar of its runs: its summary."""
    from .cluster import ClusterError
    from .database import StoreError
    from .recipe import RecipeError
    from .sweep import sweep as run_sweep

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
            return run_sweep(recipe, sets or [], tracking_uri, address, max_concurrent, progress)
        except (ClusterError, RecipeError, StoreError) as err:
            bar.stop()
            fail(str(err), getattr(err, "detail", ""))
        except KeyboardInterrupt:  # pressed again while Ray stopped: what was stored stays, the rest runs again
            bar.stop()
            errors.print("the sweep was interrupted; run the same command again to finish it", highlight=False)
            raise typer.Exit(130) from None


def show_sweep(recipe, summary, tracking_uri: Optional[str]) -> None:
    """A sweep's counts as a table, where it is tracked, and what did not go as it should: runs left to another
    sweep, failed runs (the first `FAILURES_SHOWN`, each with the line that says why), tracking errors, runs not
    stored."""
    from .database import tracking_uri as resolve_uri

    table = Table(title=f"sweep {recipe.name}", show_header=True)
    for column in ("runs", "skipped (done before)", "finished", "diverged", "failed", "wall s", "compute s"):
        table.add_column(column, justify="right")
    counts = summary.counts
    table.add_row(str(summary.total), str(summary.skipped), str(counts["finished"]), str(counts["diverged"]),
                  str(counts["failed"]), f"{summary.wall_seconds:.1f}", f"{summary.compute_seconds:.1f}")
    console.print(table)
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


def tune_with_progress(recipe, chosen: list[str], sets: Optional[List[str]], tracking_uri: Optional[str],
                       address: Optional[str], max_concurrent: Optional[int], fresh: bool, rerun_best: Optional[int]):
    """The recipe's algorithms tuned (`sweeps.tuning.tune_recipe`) under a progress bar per algorithm: the summary."""
    from .cluster import ClusterError
    from .database import StoreError
    from .recipe import RecipeError
    from .tuning import tune_recipe

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
            return tune_recipe(recipe, chosen, sets or [], tracking_uri, address, max_concurrent, fresh, rerun_best,
                               progress)
        except (ClusterError, RecipeError, StoreError) as err:
            bar.stop()
            fail(str(err), getattr(err, "detail", ""))


def show_tuned(recipe, summary) -> None:
    """`tune`'s summary: this call's trials by how they ended, apart from the study's trials over every call (what
    its best is the best of); the best values whole, one line per algorithm below the table (a table column cut
    `client_lr=0.000123` to `client_lr=0.…` at 80 columns); then where the studies and runs are, and tracking errors."""
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
    console.print(f"studies in {summary.storage} (optuna-dashboard {summary.storage}); runs under parent "
                  f"{summary.parent_run_id} in experiment {recipe.name!r}", highlight=False)
    for error in summary.tracking_errors:
        errors.print(f"tracking error: {error}", highlight=False)


def make_report(tracking_uri: Optional[str], **source):
    """The report (`sweeps.report.report`) of runs in the store, as `source` names them."""
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


def show_run(store, run_id: str) -> None:
    """`fedbench show`: a stored run (its role, algorithm, seed, status, params, last values and error), and the runs
    of a sweep's or tuning session's parent run (`children_table`)."""
    from .claims import CLAIM
    from .database import StoreError

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


WIDE_TABLE = 140  # columns from which `fedbench recipes` is a table: below, its five columns cut the text


def show_recipes() -> None:
    """`fedbench recipes`: each shipped recipe's paper, what it reproduces, its runs and its times, as a table on a
    wide terminal, else a block per recipe."""
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
