"""`fedbench report`: convergence curves, best-configuration tables and a paper-style figure, drawn from
what the MLflow store holds (never from a live sweep), so any sweep, tuning session or experiment can be
reported again later, on another machine, with another `report:` block.

What it writes into one folder (and, for a sweep or tuning session, onto its parent run as artifacts under
`report/`, so they show in the MLflow UI):
- `metric_<name>.png`: one per metric, one curve per configuration (algorithm, config hash): the mean over
  its seeds at each evaluated round, with a shaded band of ±1 standard error over the seeds present there.
  A run that diverged keeps its partial curve; its last evaluation is marked with an ×, and the band
  after it covers the seeds that went on.
- `figure.png`: the recipe's chosen metrics as the panels of one figure, as the papers draw them; with several
  x-axes (`report.x: [rounds, seconds]`), `figure_<axis>.png` draws it again over each further one.
- `table.csv`: every configuration: run statuses, the final value (at each run's last finite
  evaluation) mean, standard deviation and 95% CI half-width (1.96 s.e.) over seeds for the selection metric and
  the figure's metrics (the tables for people show the one `report.interval` names),
  rounds to each target; `best` marks each algorithm's best configuration.
- `report.md` and `index.html`: the figure, the tables and every PNG on one page.

Colours name algorithms (the same in every panel and file); line styles tell an algorithm's
configurations apart, best first. The y-axis is logarithmic where the values span 1.5 decades or more
(`report.log` overrides that per metric).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from ..recipe import Recipe
from ..store import Store
from ..writer import SUMMARY_METRICS
from .query import AXES, Histories, ReportError, Source, find_source
from .render import (
    Colors,
    Page,
    final_text,
    fmt,
    save_figure,
    save_metric,
    table,
    write_csv,
    write_html,
    write_markdown,
)
from .settings import Settings, headline_metrics, resolve_settings
from .statistics import Configuration, configurations, curve, rounds_to, spread, statuses

# The package's jobs, one module each: query (what the store holds), settings (the report block resolved),
# statistics (pure functions of runs and histories), render (PNGs, tables, pages); this module puts them together.
__all__ = ["Report", "ReportError", "Histories", "curve", "curve_colors", "fmt", "final_text", "headline_metrics",
           "report", "resolve_settings", "rounds_to", "spread", "write_report"]

INTERVALS = {"sd": "sample standard deviation over the configuration's runs (seeds)",
             "ci95": "95% confidence interval over the configuration's runs (seeds), 1.96 standard errors"}


@dataclass
class Report:
    out: Path
    files: list[Path]
    configurations: list[Configuration]
    settings: Settings
    source: Source  # its parent run, if any, holds the files as artifacts
    logged: str = ""  # where the files were logged in the store, or why not


def curve_colors(drawn: list[Configuration]) -> Colors:
    """Each drawn configuration's color, by (algorithm, config hash): its algorithm's, the line style telling its
    configurations apart; where one algorithm is drawn, a color per configuration (seven chains of one method read
    better in seven colors than in seven dash patterns)."""
    algorithms = list(dict.fromkeys(config.algorithm for config in drawn))
    if len(algorithms) == 1:
        return {(c.algorithm, c.config_hash): f"C{i % 10}" for i, c in enumerate(drawn)}
    return {(c.algorithm, c.config_hash): f"C{algorithms.index(c.algorithm) % 10}" for c in drawn}


def write_report(store: Store, source: Source, out: Optional[Path] = None, x: Optional[str] = None) -> Report:
    """Draw, tabulate and write every file; log them on the source's parent run, if it has one."""
    import matplotlib

    matplotlib.use("Agg")
    runs = [run for run in source.runs if set(run.data.metrics) - set(SUMMARY_METRICS)]
    if not runs:
        raise ReportError(f"{source.description} in {store.uri}: no run with a curve to report "
                          f"(runs: {statuses(source.runs) or 'none'}){source.hint}")
    histories = Histories(store, runs)
    available = sorted(set().union(*(run.data.metrics for run in runs)) - set(SUMMARY_METRICS) - set(AXES))
    settings = resolve_settings(source.recipe, available, x)
    order = list(source.recipe.algorithms) if source.recipe is not None else []
    configs = configurations(runs, order, settings, histories)
    drawn = [config for config in configs if config.rank < settings.curves]
    colors = curve_colors(drawn)

    out = out or default_folder(store, source.name)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    metric_pngs = []
    for metric in available:
        path = out / f"metric_{metric}.png"
        save_metric(path, source.title, metric, drawn, colors, settings, histories)
        files.append(path)
        metric_pngs.append((settings.label(metric), path.name))
    figures = [out / "figure.png", *(out / f"figure_{axis}.png" for axis in settings.also_x)]
    for path, axis in zip(figures, [settings.x, *settings.also_x]):
        save_figure(path, source.title, drawn, colors, replace(settings, x=axis), histories)
    csv_path = out / "table.csv"
    write_csv(csv_path, configs, settings)

    page = make_page(store, source, configs, settings, [path.name for path in figures], metric_pngs)
    write_markdown(out / "report.md", page)
    write_html(out / "index.html", page)
    files += [*figures, csv_path, out / "report.md", out / "index.html"]

    logged = ""
    if source.parent_id is not None:
        try:
            for path in files:
                store.client.log_artifact(source.parent_id, str(path), "report")
            logged = f"logged on run {source.parent_id} under report/"
        except OSError as error:  # a read-only store is reported all the same, from its files
            logged = f"not logged on the parent run: {error.strerror or error}"
    return Report(out, files, configs, settings, source, logged)


def default_folder(store: Store, name: str) -> Path:
    """reports/<name>/ beside the store, refused (ReportError) where the name would leave reports/: an experiment
    that no recipe made may be named `..` (a recipe's name is checked), whose report would overwrite the store's
    folder's files."""
    reports = store.folder() / "reports"
    folder = reports / re.sub(r"[^\w.-]+", "_", name)
    if reports.resolve() not in folder.resolve().parents:
        raise ReportError(f"{folder}: not inside {reports} (the experiment is named {name!r}); pass --out FOLDER")
    return folder


def make_page(store: Store, source: Source, configs: list[Configuration], settings: Settings, figures: list[str],
              metric_pngs: list[tuple[str, str]]) -> Page:
    header, rows = table(configs, settings)
    best_rows = [row for row, config in zip(rows, configs) if config.best]
    select = settings.select
    facts = [f"source: {source.description} (experiment {source.name!r}, store {store.uri})",
             f"runs: {len(source.runs)} ({statuses(source.runs)}) in {len(configs)} configurations"
             + (f", made with {source.made_with}" if source.made_with else ""),
             f"best configuration (★): the {'lowest' if select.mode == 'min' else 'highest'} mean final "
             f"{settings.label(select.metric)}; one with a run that did not finish ranks below all whose runs did",
             f"written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"]
    notes = ["final: the value at each run's last finite evaluation (a diverged run's is where it stopped); "
             f"mean ± {INTERVALS[settings.interval]}",
             "curves: mean over seeds with a band of ±1 standard error; × marks where a diverged run ended",
             f"at most {settings.curves} configurations per algorithm are drawn (its best); the tables list all"]
    if settings.targets:
        notes.append("rounds to target: the first evaluated round at which a run's metric reached the value from "
                     "the side it started on, averaged over the runs that reached it")
    return Page(f"Report: {source.title}", facts, figures, (header, best_rows), (header, rows), metric_pngs, notes)


def report(store: Store, recipe: Optional[Recipe] = None, experiment: Optional[str] = None,
           run_id: Optional[str] = None, out: Optional[Path] = None, x: Optional[str] = None,
           overridden: bool = False) -> Report:
    """`fedbench report`: exactly one of a recipe (`overridden`: given --set), an experiment name or a parent run
    id."""
    return write_report(store, find_source(store, recipe, experiment, run_id, overridden), out, x)
