"""Drawing and writing: the PNGs (one per metric, the papers' multi-panel figure), the tables (CSV, Markdown,
HTML) and the report page."""
from __future__ import annotations

import csv
import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .query import Histories
from .settings import Settings
from .statistics import Configuration, curve, spread

LOG_SPAN = 10 ** 1.5  # max/min of the plotted values from which the y-axis is logarithmic
STYLES: tuple[Any, ...] = ("-", "--", ":", "-.", (0, (3, 1, 1, 1, 1, 1)), (0, (8, 2)), (0, (1, 4)))  # matplotlib's
Colors = dict[tuple[str, str], Any]  # each drawn configuration's color, by (algorithm, config hash)
X_LABELS = {"rounds": "communication round", "comm": "floats communicated (uploads + downloads, all clients)",
            "comm_bits": "bits communicated (uploads + downloads, all clients)",
            "comm_up_bits": "bits sent to the server (all clients)",
            "comm_down_bits": "bits sent to clients (all clients)",
            "iterations": "local iterations per client", "seconds": "training seconds (wall clock)"}


def draw_panel(ax, metric: str, drawn: list[Configuration], colors: Colors, settings: Settings,
               histories: Histories) -> None:
    plotted = []
    for config in drawn:
        line = curve(config.runs, metric, histories, settings.x)
        if not len(line.x):
            continue
        color = colors[config.algorithm, config.config_hash]
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


def legend_handles(drawn: list[Configuration], colors: Colors):
    from matplotlib.lines import Line2D

    handles = []
    for config in drawn:
        note = "" if not config.unfinished else f" [{config.status}]"
        handles.append(Line2D([], [], color=colors[config.algorithm, config.config_hash],
                              linestyle=STYLES[config.rank % len(STYLES)],
                              linewidth=1.6, label=config.name + note))
    if any(run.data.tags.get("status") == "diverged" for config in drawn for run in config.runs):
        handles.append(Line2D([], [], color="0.3", marker="x", markersize=8, markeredgewidth=2, linestyle="none",
                              label="last evaluation of a diverged run"))
    return handles


def band_note(drawn: list[Configuration]) -> str:
    seeds = sorted({len(config.runs) for config in drawn})
    count = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}–{seeds[-1]}"
    return f"mean over {count} seed{'s' if seeds[-1] > 1 else ''}, shaded ±1 standard error"


def save_metric(path: Path, title: str, metric: str, drawn: list[Configuration], colors: Colors,
                settings: Settings, histories: Histories) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    draw_panel(ax, metric, drawn, colors, settings, histories)
    ax.set_title(f"{title}: {settings.label(metric)}\n{band_note(drawn)}", fontsize=11)
    ax.legend(handles=legend_handles(drawn, colors), fontsize=8, loc="best", framealpha=0.85)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Title": f"{title}: {settings.label(metric)}"})
    plt.close(fig)


def save_figure(path: Path, title: str, drawn: list[Configuration], colors: Colors, settings: Settings,
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
    fig.suptitle(f"{title}\n{band_note(drawn)}", fontsize=12)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, legend_inches / height, 1, 1))
    fig.savefig(path, dpi=110, metadata={"Title": title})
    plt.close(fig)


def fmt(value: float, digits: int = 4) -> str:
    return "–" if math.isnan(value) else f"{value:.{digits}g}"


def mean_text(values: list[float], interval: str = "sd", digits: int = 4) -> str:
    """Mean ± spread (`spread`); one value alone, with n = 1: one run has no spread, and "± 0" would say it has
    none."""
    mean, spread_ = spread(values, interval)
    return f"{fmt(mean, digits)} (n = 1)" if len(values) == 1 else f"{fmt(mean, digits)} ± {fmt(spread_, 2)}"


def final_text(config: Configuration, metric: str, interval: str = "sd") -> str:
    """A configuration's final value of `metric`: mean ± its spread over the runs that did not fail, and how many
    failed runs that leaves out (their partial curves are no result)."""
    if not config.finals[metric]:
        return f"– (all {len(config.runs)} runs failed)" if config.failed == len(config.runs) else "–"
    failed = f" ({config.failed} failed run{'s' if config.failed > 1 else ''} left out)" if config.failed else ""
    return f"{mean_text(config.finals[metric], interval)}{failed}"


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
                 str(len(config.runs)), config.status, mean_text(config.seconds, digits=3)]
        for metric in settings.table_metrics:
            cells.append(final_text(config, metric, settings.interval))
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
                row += ([repr(v) for v in spread(config.finals[metric])]
                        + [repr(spread(config.finals[metric], "ci95")[1])])
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
             *(f"![figure]({figure})" for figure in page.figures), "## Best configuration per algorithm",
             markdown_table(*page.best)]
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
