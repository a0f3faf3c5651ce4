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

import csv
import html
import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import numpy as np
from mlflow.exceptions import MlflowException

from fedbench.metrics import Metric
from fedbench.problems import metric_catalog
from sweeps.recipe import Recipe, ReportSpec, SelectSpec, check_metrics, parse, yaml_value
from sweeps.tracking import PARENT_TAG, SUMMARY_METRICS, Store

COMM = ("comm_up", "comm_down")  # the x-axis of --x comm, not curves of their own
AXES = (*COMM, "iterations")  # x-axis columns
RUN_ROLES = ("trial", "tune_trial", "run")
LOG_SPAN = 10 ** 1.5  # max/min of the plotted values from which the y-axis is logarithmic
STYLES = ("-", "--", ":", "-.", (0, (3, 1, 1, 1, 1, 1)))
X_LABELS = {"rounds": "communication round", "comm": "floats communicated (uploads + downloads, all clients)",
            "iterations": "local iterations per client", "seconds": "training seconds (wall clock)"}
INTERVALS = {"sd": "sample standard deviation over the configuration's runs (seeds)",
             "ci95": "95% confidence interval over the configuration's runs (seeds), 1.96 standard errors"}

def declarations(recipe: Optional[Recipe]) -> dict[str, Metric]:
    """Each metric's label and direction as the problems declare them: the recipe's own where there is one,
    else every shipped problem's (`fedbench.problems.metric_catalog`)."""
    return {**metric_catalog(), **(recipe.metrics() if recipe is not None else {})}


class ReportError(ValueError):
    """Nothing to report: no such experiment or run, or no runs with curves."""


# -- what is reported ---------------------------------------------------------------------------------

@dataclass
class Source:
    """The runs of one sweep, tuning session or experiment, and the recipe that says how to draw them."""
    name: str
    runs: list
    recipe: Optional[Recipe]
    parent_id: Optional[str] = None  # where the report's artifacts go
    description: str = ""


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
                run_id: Optional[str] = None) -> Source:
    """The runs of a recipe's sweep, of a parent run (sweep or tuning session), or of a whole experiment."""
    if run_id is not None:
        try:
            parent = store.client.get_run(run_id)
        except MlflowException:
            raise ReportError(f"no run {run_id!r} in {store.uri}") from None
        role = parent.data.tags.get("role")
        if role not in ("sweep", "tune"):
            raise ReportError(f"run {run_id} is a {role or 'untagged'} run, not a sweep or tuning session; "
                              f"pass its parent with --run, or the experiment with --experiment")
        stored = stored_recipe(store, parent)
        return Source(stored.name, parent_runs(store, parent, stored), stored, run_id, f"{role} run {run_id}")
    name = recipe.name if recipe is not None else experiment
    found = store.client.get_experiment_by_name(name)
    if found is None:
        hint = f"; run `fedbench sweep {recipe.source}` first" if recipe is not None else ""
        raise ReportError(f"no experiment {name!r} in {store.uri}{hint}")
    experiment_id = found.experiment_id
    if recipe is not None:
        # Artifacts only on the sweep of exactly this recipe: another recipe may share some configurations.
        sweeps = store.search(experiment_id, f"tags.role = 'sweep' and tags.recipe_hash = '{recipe.recipe_hash}'")
        return Source(name, recipe_runs(store, experiment_id, recipe), recipe,
                      sweeps[0].info.run_id if sweeps else None, f"the runs of {recipe.source}")
    every = store.search(experiment_id, "")  # newest first
    parents = [run for run in every if run.data.tags.get("role") in ("sweep", "tune")]
    return Source(name, one_per_seed([run for run in every if run.data.tags.get("role") in RUN_ROLES]),
                  stored_recipe(store, parents[0]) if parents else None, None, f"every run of experiment {name!r}")


# -- settings -----------------------------------------------------------------------------------------

@dataclass
class Settings:
    """The report block resolved against the metrics the runs have."""
    metrics: list[str]  # the figure's panels
    select: SelectSpec
    targets: dict[str, float]
    x: str  # the main figure's x-axis
    log: dict[str, bool]
    labels: dict[str, str]
    curves: int
    declared: dict[str, Metric]
    interval: str = "sd"
    also_x: list[str] = field(default_factory=list)  # the figure again over these x-axes

    @property
    def table_metrics(self) -> list[str]:
        return list(dict.fromkeys([self.select.metric, *self.metrics]))

    def label(self, name: str) -> str:
        declared = self.declared.get(name)
        return self.labels.get(name) or (declared.label if declared else name)


def resolve_settings(recipe: Optional[Recipe], available: list[str], x: Optional[str]) -> Settings:
    spec = recipe.report if recipe is not None else ReportSpec()
    if recipe is not None:
        check_metrics(recipe, available)
    declared = declarations(recipe)
    ranked = [m for m in available if m in declared and declared[m].direction]  # metrics with a better way
    select = spec.select
    if select is None and recipe is not None and recipe.tune is not None:
        select = SelectSpec(metric=recipe.tune.metric, mode=recipe.tune.mode)
    if select is None:
        first = [m for m in ("objective_gap", "objective") if m in ranked] + ranked
        if not first:
            raise ReportError(f"no metric of {', '.join(available)} is declared with a direction (lower or higher "
                              "is better); set report.select: {metric: NAME, mode: min|max} in the recipe")
        select = SelectSpec(metric=first[0], mode=declared[first[0]].direction)
    panels = spec.metrics or list(dict.fromkeys([select.metric, *ranked]))[:4]
    axes = [x] if x else list(spec.x)
    return Settings(panels, select, dict(spec.target), axes[0], dict(spec.log), dict(spec.labels), spec.curves,
                    declared, spec.interval, axes[1:])


# -- curves and statistics ----------------------------------------------------------------------------

class Histories:
    """Metric histories (finite points only, by round), read from the store on first use, for every run of the
    report at once (`Store.metric_histories`). A run of a non-personalized method has no `personal_X`: its
    personal model is its global model (spec 000 §2.3), so its `X` stands in, and methods compare on one panel."""

    def __init__(self, store: Store, runs: list = ()):
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
        """The x of a run's points: their rounds, the local iterations, the training seconds or the floats
        communicated by then."""
        if axis == "rounds":
            return steps
        if axis in ("iterations", "seconds"):
            return np.interp(steps, *self(run, "iterations" if axis == "iterations" else "train_seconds"))
        total = 0.0
        for name in COMM:
            comm_steps, comm = self(run, name)
            total = total + np.interp(steps, comm_steps, comm)
        return total


@dataclass
class Curve:
    x: np.ndarray
    mean: np.ndarray
    se: np.ndarray  # standard error over the seeds present at each point
    ends: list[tuple[float, float]]  # last point of each diverged run


def curve(runs: list, metric: str, histories: Histories, axis: str) -> Curve:
    """Mean and standard error over the runs evaluated at each round: a run that stopped early (diverged)
    leaves the band to the others after its last point."""
    per_run = []
    for run in runs:
        steps, values = histories(run, metric)
        if len(steps):
            per_run.append((run, dict(zip(steps, values)), dict(zip(steps, histories.x(run, steps, axis)))))
    steps = sorted(set().union(*(points for _, points, _ in per_run)))
    xs, means, ses = [], [], []
    for step in steps:
        values = np.array([points[step] for _, points, _ in per_run if step in points])
        xs.append(np.mean([where[step] for _, points, where in per_run if step in points]))
        means.append(values.mean())
        ses.append(values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else 0.0)
    ends = [(where[max(points)], points[max(points)]) for run, points, where in per_run
            if run.data.tags.get("status") == "diverged"]
    return Curve(np.array(xs), np.array(means), np.array(ses), ends)


def rounds_to(steps: np.ndarray, values: np.ndarray, target: float) -> Optional[float]:
    """First evaluated round at which the metric has come to the target from the side it started on."""
    if not len(values):
        return None
    reached = values <= target if values[0] > target else values >= target
    return float(steps[np.argmax(reached)]) if reached.any() else None


def spread(values: list[float], interval: str = "sd") -> tuple[float, float]:
    """Mean and sample standard deviation, or (`ci95`) the half-width 1.96 s.e. of the mean's 95% confidence
    interval, as Per-FedAvg's Table 1 (0 for one value, NaN for none)."""
    if not values:
        return math.nan, math.nan
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return float(np.mean(values)), (sd if interval == "sd" else 1.96 * sd / math.sqrt(len(values)))


def per_thousand_rounds(run, steps: np.ndarray) -> float:
    """Training plus evaluation seconds per 1000 communication rounds (the papers' wall-clock tables, e.g. seed
    003's Tables 4–5, which include evaluating after every round), from the run's summary metrics."""
    metrics, rounds = run.data.metrics, (steps[-1] if len(steps) else 0)
    if rounds <= 0 or "train_seconds" not in metrics:
        return math.nan
    return 1000 * (metrics["train_seconds"] + metrics.get("eval_seconds", 0.0)) / rounds


def statuses(runs: list) -> str:
    """How the runs ended, finished first: `2 finished, 1 diverged`."""
    counts = Counter(run.data.tags.get("status", "unknown") for run in runs)
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items(), key=lambda kv: kv[0] != "finished"))


def short(value: Optional[str]) -> str:
    """A parameter as MLflow holds it (a string), numbers to 4 digits: tuned step sizes have 17."""
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return str(value)


@dataclass
class Configuration:
    """One (algorithm, config hash) and its runs, one per seed, with what the table says of it."""
    algorithm: str
    config_hash: str
    runs: list
    params: dict[str, str]  # the flattened configuration, seed excluded
    finals: dict[str, list[float]] = field(default_factory=dict)  # metric -> last finite value of each run
    seconds: list[float] = field(default_factory=list)  # each run's training + evaluation seconds per 1000 rounds
    reached: dict[str, list[Optional[float]]] = field(default_factory=dict)  # target metric -> rounds per run
    varying: str = ""  # the hyperparameters that vary between the algorithm's configurations, with their values
    name: str = ""  # algorithm label and varying
    best: bool = False
    rank: int = 0  # within its algorithm, best first: its curve's line style, and whether it is drawn

    @property
    def status(self) -> str:
        return statuses(self.runs)

    @property
    def unfinished(self) -> int:
        return sum(run.data.tags.get("status") != "finished" for run in self.runs)

    def rank_key(self, select: SelectSpec) -> tuple[int, float]:
        """Configurations whose runs all finished first, then by the mean final value of the metric."""
        mean = spread(self.finals[select.metric])[0]
        score = math.inf if math.isnan(mean) else (mean if select.mode == "min" else -mean)
        return self.unfinished, score


def configurations(runs: list, order: list[str], settings: Settings, histories: Histories) -> list[Configuration]:
    """Runs grouped by (algorithm, config hash), in the recipe's algorithm order, each algorithm's best first."""
    groups: dict[tuple[str, str], list] = {}
    for run in sorted(runs, key=lambda r: int(r.data.tags.get("seed", 0))):
        groups.setdefault((run.data.tags["algorithm"], run.data.tags["config_hash"]), []).append(run)
    configs = []
    for (algorithm, config_hash), members in groups.items():
        params = {k: v for k, v in members[0].data.params.items() if k != "seed"}
        config = Configuration(algorithm, config_hash, members, params)
        for metric in settings.table_metrics:
            config.finals[metric] = [histories(run, metric)[1][-1] for run in members if len(histories(run, metric)[0])]
        config.seconds = [per_thousand_rounds(run, histories(run, settings.select.metric)[0]) for run in members]
        for metric, target in settings.targets.items():
            config.reached[metric] = [rounds_to(*histories(run, metric), target) for run in members]
        configs.append(config)
    algorithms = [a for a in order if any(c.algorithm == a for c in configs)]
    algorithms += sorted({c.algorithm for c in configs} - set(algorithms))
    ordered = []
    for algorithm in algorithms:
        mine = sorted((c for c in configs if c.algorithm == algorithm), key=lambda c: c.rank_key(settings.select))
        mine[0].best = True
        for rank, config in enumerate(mine):
            config.rank = rank
        varying = [k for k in mine[0].params if len({c.params.get(k) for c in mine}) > 1]
        for config in mine:
            config.varying = ", ".join(f"{k.removeprefix('algorithm.')}={short(config.params.get(k))}"
                                       for k in varying)
            config.name = settings.label(algorithm) + (f" ({config.varying})" if config.varying else "")
        ordered += mine
    return ordered


# -- plots --------------------------------------------------------------------------------------------

def draw_panel(ax, metric: str, drawn: list[Configuration], colors: dict[str, Any], settings: Settings,
               histories: Histories) -> None:
    plotted = []
    for config in drawn:
        line = curve(config.runs, metric, histories, settings.x)
        if not len(line.x):
            continue
        color = colors[config.algorithm]
        style = STYLES[config.rank % len(STYLES)]
        ax.plot(line.x, line.mean, color=color, linestyle=style, linewidth=1.6)
        ax.fill_between(line.x, line.mean - line.se, line.mean + line.se, color=color, alpha=0.18, linewidth=0)
        for x, y in line.ends:
            ax.plot([x], [y], marker="x", color=color, markersize=9, markeredgewidth=2, linestyle="none")
        plotted += [*line.mean, *(y for _, y in line.ends)]
    values = np.array(plotted)
    automatic = bool(len(values)) and values.min() > 0 and values.max() / values.min() >= LOG_SPAN
    if settings.log.get(metric, automatic):
        ax.set_yscale("log")
    ax.set_xlabel(X_LABELS[settings.x])
    ax.set_ylabel(settings.label(metric) + (" (log scale)" if ax.get_yscale() == "log" else ""))
    ax.grid(True, which="major", alpha=0.3)


def legend_handles(drawn: list[Configuration], colors: dict[str, Any]):
    from matplotlib.lines import Line2D

    handles = []
    for config in drawn:
        note = "" if not config.unfinished else f" [{config.status}]"
        handles.append(Line2D([], [], color=colors[config.algorithm], linestyle=STYLES[config.rank % len(STYLES)],
                              linewidth=1.6, label=config.name + note))
    if any(run.data.tags.get("status") == "diverged" for config in drawn for run in config.runs):
        handles.append(Line2D([], [], color="0.3", marker="x", markersize=8, markeredgewidth=2, linestyle="none",
                              label="last evaluation of a diverged run"))
    return handles


def band_note(drawn: list[Configuration]) -> str:
    seeds = sorted({len(config.runs) for config in drawn})
    count = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}–{seeds[-1]}"
    return f"mean over {count} seed{'s' if seeds[-1] > 1 else ''}, shaded ±1 standard error"


def save_metric(path: Path, title: str, metric: str, drawn: list[Configuration], colors: dict[str, Any],
                settings: Settings, histories: Histories) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    draw_panel(ax, metric, drawn, colors, settings, histories)
    ax.set_title(f"{title}: {settings.label(metric)}\n{band_note(drawn)}", fontsize=11)
    ax.legend(handles=legend_handles(drawn, colors), fontsize=8, loc="best", framealpha=0.85)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_figure(path: Path, title: str, drawn: list[Configuration], colors: dict[str, Any], settings: Settings,
                histories: Histories) -> None:
    """The papers' multi-panel figure: one panel per chosen metric, one legend for all."""
    import matplotlib.pyplot as plt

    count = len(settings.metrics)
    cols = count if count <= 3 else (2 if count == 4 else 3)
    rows = math.ceil(count / cols)
    handles = legend_handles(drawn, colors)
    width = 5.2 * cols
    longest = max(len(handle.get_label()) for handle in handles)
    ncol = max(1, min(len(handles), int(width * 13 // (longest + 6))))  # ~13 characters per inch at 9 pt
    legend_inches = 0.25 * math.ceil(len(handles) / ncol) + 0.2
    height = 3.9 * rows + 0.5 + legend_inches
    fig, axes = plt.subplots(rows, cols, figsize=(width, height), squeeze=False)
    for ax, metric in zip(axes.flat, settings.metrics):
        draw_panel(ax, metric, drawn, colors, settings, histories)
        ax.set_title(settings.label(metric), fontsize=11)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    fig.suptitle(f"{title} ({band_note(drawn)})", fontsize=12)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, legend_inches / height, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- tables and pages ---------------------------------------------------------------------------------

def fmt(value: float, digits: int = 4) -> str:
    return "–" if math.isnan(value) else f"{value:.{digits}g}"


def reach_text(rounds: list[Optional[float]]) -> str:
    hit = [r for r in rounds if r is not None]
    mean = f"{np.mean(hit):.0f}" if hit else "never"
    return mean if len(hit) == len(rounds) else f"{mean} ({len(hit)}/{len(rounds)} runs)"


def table(configs: list[Configuration], settings: Settings) -> tuple[list[str], list[list[str]]]:
    """Header and rows for people: mean ± std (or ± the 95% CI) of each metric's final value, rounds to each
    target."""
    header = ["algorithm", "configuration", "runs", "status", "seconds per 1000 rounds"]
    bound = "95% CI" if settings.interval == "ci95" else "sd"
    header += [f"{settings.label(m)}: final (± {bound})" for m in settings.table_metrics]
    header += [f"rounds until {settings.label(m)} reaches {t:g}" for m, t in settings.targets.items()]
    rows = []
    for config in configs:
        cells = [settings.label(config.algorithm) + (" ★" if config.best else ""), config.varying or "–",
                 str(len(config.runs)), config.status, "{} ± {}".format(*map(fmt, spread(config.seconds), (3, 2)))]
        for metric in settings.table_metrics:
            mean, interval = spread(config.finals[metric], settings.interval)
            cells.append(f"{fmt(mean)} ± {fmt(interval, 2)}")
        cells += [reach_text(config.reached[m]) for m in settings.targets]
        rows.append(cells)
    return header, rows


def write_csv(path: Path, configs: list[Configuration], settings: Settings) -> None:
    """The same table with full-precision numbers, one column per statistic."""
    columns = ["algorithm", "configuration", "config_hash", "best", "runs", "status", "seconds_per_1000_rounds_mean",
               "seconds_per_1000_rounds_std"]
    columns += [f"{m}_{stat}" for m in settings.table_metrics for stat in ("mean", "std", "ci95")]
    columns += [f"rounds_to_{m}_{stat}" for m in settings.targets for stat in ("mean", "reached")]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for config in configs:
            row = [config.algorithm, config.varying, config.config_hash, config.best, len(config.runs), config.status,
                   *map(repr, spread(config.seconds))]
            for metric in settings.table_metrics:
                row += [repr(v) for v in spread(config.finals[metric])] + [repr(spread(config.finals[metric], "ci95")[1])]
            for metric in settings.targets:
                hit = [r for r in config.reached[metric] if r is not None]
                row += [repr(float(np.mean(hit))) if hit else "", f"{len(hit)}/{len(config.reached[metric])}"]
            writer.writerow(row)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    def line(cells):
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *map(line, rows)])


def html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass
class Page:
    """What report.md and index.html both say, in order."""
    title: str
    facts: list[str]
    figures: list[str]  # the main figure first
    best: tuple[list[str], list[list[str]]]
    every: tuple[list[str], list[list[str]]]
    metric_pngs: list[tuple[str, str]]  # (metric label, file name)
    notes: list[str]


def write_markdown(path: Path, page: Page) -> None:
    parts = [f"# {page.title}", "\n".join(f"- {fact}" for fact in page.facts),
             *(f"![figure]({figure})" for figure in page.figures), "## Best configuration per algorithm", markdown_table(*page.best)]
    if page.every[1] != page.best[1]:
        parts += ["## All configurations", markdown_table(*page.every)]
    parts += ["\n".join(f"- {note}" for note in page.notes), "## Every metric"]
    parts += [f"### {label}\n\n![{label}]({name})" for label, name in page.metric_pngs]
    path.write_text("\n\n".join(parts) + "\n")


def write_html(path: Path, page: Page) -> None:
    esc = html.escape
    metrics = "".join(f'<h3>{esc(label)}</h3><img src="{esc(name)}" alt="{esc(label)}">'
                      for label, name in page.metric_pngs)
    path.write_text(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(page.title)}</title>
<style>body{{font-family:sans-serif;max-width:1300px;margin:2em auto;padding:0 1em}}
table{{border-collapse:collapse;margin:1em 0;font-size:14px}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}
th{{background:#f3f3f3}}img{{max-width:100%}}</style></head><body>
<h1>{esc(page.title)}</h1><ul>{"".join(f"<li>{esc(fact)}</li>" for fact in page.facts)}</ul>
{"".join(f'<img src="{esc(figure)}" alt="figure">' for figure in page.figures)}
<h2>Best configuration per algorithm</h2>{html_table(*page.best)}
{"" if page.every[1] == page.best[1] else f"<h2>All configurations</h2>{html_table(*page.every)}"}
<ul>{"".join(f"<li>{esc(note)}</li>" for note in page.notes)}</ul>
<h2>Every metric</h2>{metrics}
</body></html>
""")


# -- the whole report ---------------------------------------------------------------------------------

@dataclass
class Report:
    out: Path
    files: list[Path]
    configurations: list[Configuration]
    settings: Settings
    source: Source  # its parent run, if any, holds the files as artifacts




def write_report(store: Store, source: Source, out: Optional[Path] = None, x: Optional[str] = None) -> Report:
    """Draw, tabulate and write every file; log them on the source's parent run, if it has one."""
    import matplotlib

    matplotlib.use("Agg")
    runs = [run for run in source.runs if set(run.data.metrics) - set(SUMMARY_METRICS)]
    if not runs:
        raise ReportError(f"{source.description} in {store.uri}: no run with a curve to report "
                          f"(runs: {statuses(source.runs) or 'none'})")
    histories = Histories(store, runs)
    available = sorted(set().union(*(run.data.metrics for run in runs)) - set(SUMMARY_METRICS) - set(AXES))
    settings = resolve_settings(source.recipe, available, x)
    order = list(source.recipe.algorithms) if source.recipe is not None else []
    configs = configurations(runs, order, settings, histories)
    colors = {}
    for config in configs:
        colors.setdefault(config.algorithm, f"C{len(colors) % 10}")
    drawn = [config for config in configs if config.rank < settings.curves]

    out = out or store.folder() / "reports" / re.sub(r"[^\w.-]+", "_", source.name)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    metric_pngs = []
    for metric in available:
        path = out / f"metric_{metric}.png"
        save_metric(path, source.name, metric, drawn, colors, settings, histories)
        files.append(path)
        metric_pngs.append((settings.label(metric), path.name))
    figures = [out / "figure.png", *(out / f"figure_{axis}.png" for axis in settings.also_x)]
    for path, axis in zip(figures, [settings.x, *settings.also_x]):
        save_figure(path, source.name, drawn, colors, replace(settings, x=axis), histories)
    csv_path = out / "table.csv"
    write_csv(csv_path, configs, settings)

    page = make_page(store, source, configs, settings, [path.name for path in figures], metric_pngs)
    write_markdown(out / "report.md", page)
    write_html(out / "index.html", page)
    files += [*figures, csv_path, out / "report.md", out / "index.html"]

    if source.parent_id is not None:
        for path in files:
            store.client.log_artifact(source.parent_id, str(path), "report")
    return Report(out, files, configs, settings, source)


def make_page(store: Store, source: Source, configs: list[Configuration], settings: Settings, figures: list[str],
              metric_pngs: list[tuple[str, str]]) -> Page:
    header, rows = table(configs, settings)
    best_rows = [row for row, config in zip(rows, configs) if config.best]
    select = settings.select
    facts = [f"source: {source.description} (experiment {source.name!r}, store {store.uri})",
             f"runs: {len(source.runs)} ({statuses(source.runs)}) in {len(configs)} configurations",
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
    return Page(f"Report: {source.name}", facts, figures, (header, best_rows), (header, rows), metric_pngs, notes)


def report(store: Store, recipe: Optional[Recipe] = None, experiment: Optional[str] = None,
           run_id: Optional[str] = None, out: Optional[Path] = None, x: Optional[str] = None) -> Report:
    """`fedbench report`: exactly one of a recipe, an experiment name or a parent run id."""
    return write_report(store, find_source(store, recipe, experiment, run_id), out, x)
