"""Curves and statistics over runs, as pure functions of the runs and their histories: the mean curve with its
standard-error band, final values, rounds to a target, and the configurations ranked within each algorithm."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from fedbench.algorithms import ALGORITHMS
from ..recipe import SelectSpec
from .query import Histories
from .settings import Settings


def shown_value(algorithm: str, key: str, value: Optional[str]) -> str:
    """A varying hyperparameter of a configuration as its name shows it: a choice's display name where its
    declaration gives one (`Param.labels`: Per-FedAvg's `HF`), else `name=value`."""
    name = key.removeprefix("algorithm.")
    declared = {param.name: param for param in getattr(ALGORITHMS.get(algorithm), "hparams", ())}.get(name)
    return (declared.label_of(value) if declared is not None else None) or f"{name}={short(value)}"


# The fields a run's configuration leaves out at their default (`Federation.config`, so that runs made before the
# field existed keep their config hash), by parameter name: what a configuration without one has.
LEFT_OUT = {"federation.participation": "uniform"}


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
        run_steps, values = histories(run, metric)
        if len(run_steps):
            per_run.append((run, dict(zip(run_steps, values)), dict(zip(run_steps, histories.x(run, run_steps, axis)))))
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
        return f"{float(value):.4g}"  # type: ignore[arg-type]  # None: the TypeError below
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
    def failed(self) -> int:
        """Runs that raised: their partial curves are left out of the means (`counted`)."""
        return len(self.runs) - len(self.counted)

    @property
    def counted(self) -> list:
        """The runs the means are over: all but those that failed (raised) before their end."""
        return [run for run in self.runs if run.data.tags.get("status") != "failed"]

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
        counted = config.counted
        for metric in settings.table_metrics:
            config.finals[metric] = [histories(run, metric)[1][-1] for run in counted if len(histories(run, metric)[0])]
        config.seconds = [per_thousand_rounds(run, histories(run, settings.select.metric)[0]) for run in counted]
        for metric, target in settings.targets.items():
            config.reached[metric] = [rounds_to(*histories(run, metric), target) for run in counted]
        configs.append(config)
    algorithms = [a for a in order if any(c.algorithm == a for c in configs)]
    algorithms += sorted({c.algorithm for c in configs} - set(algorithms))
    ordered = []
    for algorithm in algorithms:
        mine = sorted((c for c in configs if c.algorithm == algorithm), key=lambda c: c.rank_key(settings.select))
        mine[0].best = True
        for rank, config in enumerate(mine):
            config.rank = rank
        # a field some configurations leave out (no uplink chain, no adversaries) varies too: "none" where it is out,
        # or the default a run's configuration leaves out (`Federation.config`)
        keys = dict.fromkeys(k for c in mine for k in c.params)
        varying = [k for k in keys if len({c.params.get(k) for c in mine}) > 1]
        for config in mine:
            values = {k: config.params.get(k, LEFT_OUT.get(k, "none")) for k in varying}
            config.varying = ", ".join(f"{k.removeprefix('algorithm.')}={short(v)}" for k, v in values.items())
            shown = ", ".join(shown_value(algorithm, k, v) for k, v in values.items())
            config.name = settings.label(algorithm) + (f" ({shown})" if shown else "")
        ordered += mine
    return ordered
