"""Paper-size runs of Per-FedAvg's Table 1 (seed 004, spec 004 §3.4, §4.1, §5.3) from the shipped recipes
recipes/papers/fallah2020_{m1,m2,c1,c2,c3,c4}.yaml: n = 50 users, K = 1000 rounds, 10 users a round, D = D' = D'' =
40, beta = 0.001, five seeds of the whole pipeline (partition, initialisation, sampling), each method scored by the
mean over users of the test accuracy after one local step of size alpha. Run with `pytest -m slow -s`, which prints
every row beside the paper's (mean ± 1.96 s.e. over the seeds, in %).

Measured on the digits rows (2-core CPU, one thread; FedAvg / FO / HF, paper in brackets), from the sweep of these
recipes on 2026-11-26 (adapting on the users' test samples, the recipes' protocol), both input scalings:
  M1 raw (tau = 10, alpha = 0.01):          57.57 ± 3.1 [75.96] / 59.47 ± 3.3 [78.00] / 61.61 ± 3.2 [79.85]
  M1 standardized:                          92.13 ± 0.25        / 93.38 ± 0.37        / 93.37 ± 0.23
  M2 raw (tau = 4,  alpha = 0.01):          43.74 ± 2.01 [60.18] / 43.34 ± 2.33 [64.55] / 42.83 ± 2.08 [70.94]
  M2 standardized:                          88.03 ± 0.48        / 90.82 ± 0.30        / 90.81 ± 0.42
(adapting on training samples instead moved the raw rows by 0-1.5 points: M2 raw was 43.71 / 43.30 / 42.72.)
With raw pixels (the paper's preprocessing) the absolute accuracies are 16-28 points below the paper's: the
FEMNIST digits carry ~3.5x less ink than MNIST, so plain SGD at beta = 0.001 under-trains the MLP more; standardized
pixels train faster than the paper's MNIST did (13-28 points above it); the paper's regime lies between. With raw
pixels at tau = 10 the paper's ordering holds seed by seed (the seeds are paired: the same partition and
initialisation for every method), by ~2 points each step; its CIs (0.02-0.03) are far narrower than the
seed-to-seed spread here (± 3), so "beyond the CI" (O1) is checked on the paired differences. At tau = 4 the three
methods tie within ±1.5 points (HF below FedAvg on 4 seeds of 5): O1 and O2 do not reproduce there. Standardized,
both Per-FedAvg variants beat FedAvg on every seed at both tau, but HF and FO tie (O2 does not hold).
Cost: M1 about 50 and M2 about 25 minutes on 2 cores for both scalings' 30 runs each (in-trial seconds, 2 trials).

CIFAR-10, C1 (tau = 10, alpha = 0.001), 3 seeds from the sweep of 2026-11-26 (paper in brackets):
  66.44 ± 0.86 [40.49] / 64.86 ± 1.34 [46.98] / 65.48 ± 0.26 [50.44]; before adaptation 26.6 / 17.1 / 12.8.
Every method is 16-26 points above the paper and above each user predicting its own most frequent test label
(50.0 % on every seed); the methods tie (HF below FedAvg on all three seeds, by 0.4-1.9 points), so O1, O2 and O4
do not hold at C1; O8 holds by 40-53 points: the under-trained models' logits are nearly tied, and one step on 35
of the very test images they are scored on (the paper's literal protocol) moves them to each user's labels.
C2-C4 are still running (about 37 minutes per row for 3 seeds on 2 cores); until their rows exist, their tests
assert the paper's claims (spec §5.3) as expectations.
Checks: O1 (HF above FedAvg + update), O2 (HF >= FO), O8 (adaptation helps Per-FedAvg), O6 (tau = 10 beats
tau = 4 for every method), O5 (raising alpha hurts FO and not HF), O7 (diff. hetero. widens HF's lead).
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from sweeps.execute import build_simulation, drive
from sweeps.recipe import load

pytestmark = pytest.mark.slow
PAPERS = Path(__file__).resolve().parents[1] / "recipes" / "papers"
METHODS = ("fedavg", "fo", "hf")
PAPER = {  # Table 1, % (mean; the CIs are 0.02–0.23)
    "m1": (75.96, 78.00, 79.85), "m2": (60.18, 64.55, 70.94), "c1": (40.49, 46.98, 50.44),
    "c2": (38.38, 34.04, 43.73), "c3": (35.97, 25.32, 46.32), "c4": (58.59, 37.71, 71.25)}


class Measured:
    """One method's final accuracies (%) over the seeds."""

    def __init__(self, adapted: list[float], before: list[float], seconds: list[float]):
        self.adapted, self.before, self.seconds = np.array(adapted), np.array(before), np.array(seconds)

    @property
    def mean(self) -> float:
        return float(self.adapted.mean())

    @property
    def ci(self) -> float:
        return 1.96 * float(self.adapted.std(ddof=1)) / math.sqrt(len(self.adapted))

    def text(self) -> str:
        return f"{self.mean:6.2f} ± {self.ci:4.2f}"


@lru_cache(maxsize=None)
def table_row(row: str, scaling: str = "raw") -> dict[str, Measured]:
    """The row's methods at one input scaling (the digits rows run both: `input_scaling`)."""
    recipe = load(PAPERS / f"fallah2020_{row}.yaml")
    found: dict[str, tuple[list, list, list]] = {method: ([], [], []) for method in METHODS}
    for trial in recipe.trials():
        if trial.problem_config["input_scaling"] != scaling:
            continue
        outcome = drive(build_simulation(trial, "cpu"))
        assert outcome.status == "finished" and outcome.rows[-1]["round"] == 1000, (row, trial.algorithm, trial.hyperparameters, trial.seed)
        method = trial.hyperparameters.get("variant", "fedavg")
        adapted, before, seconds = found[method]
        adapted.append(100 * outcome.rows[-1]["adapted_accuracy"])
        before.append(100 * outcome.rows[-1]["accuracy"])
        seconds.append(outcome.train_seconds)
    measured = {method: Measured(*lists) for method, lists in found.items()}
    print(f"\n{row.upper()} {scaling} (mean ± 1.96 s.e. over {len(measured['hf'].adapted)} seeds, %; paper in brackets; "
          "before adaptation; training seconds)")
    for method, paper in zip(METHODS, PAPER[row]):
        m = measured[method]
        print(f"  {method:6s} {m.text()} [{paper:5.2f}]   before {m.before.mean():6.2f}   {m.seconds.mean():6.0f} s   seeds {np.round(m.adapted, 2).tolist()}")
    return measured


def gap(row: str, better: str, worse: str) -> float:
    """How far `better` is above `worse` beyond both CIs (positive: separated)."""
    measured = table_row(row)
    high, low = measured[better], measured[worse]
    return (high.mean - high.ci) - (low.mean + low.ci)


def paired(row: str, better: str, worse: str, scaling: str = "raw") -> np.ndarray:
    """Seed-by-seed differences of the adapted accuracy (the same partition and initialisation per seed)."""
    measured = table_row(row, scaling)
    return measured[better].adapted - measured[worse].adapted


def test_m1_hf_beats_fo_beats_fedavg_on_every_seed_and_adaptation_helps():
    """O1, O2, O4 and O8 at tau = 10, raw pixels (measured: HF - FedAvg +3.4..+4.9, HF - FO +1.7..+2.7, FO - FedAvg
    +1.6..+2.5 points on each of the five seeds; adaptation +3.0 (FO) and +3.5 (HF) points)."""
    assert (paired("m1", "hf", "fedavg") > 0).all(), "O1"
    assert (paired("m1", "hf", "fo") > 0).all(), "O2"
    assert (paired("m1", "fo", "fedavg") > 0).all(), "O4"
    for method in ("fo", "hf"):
        assert table_row("m1")[method].mean > table_row("m1")[method].before.mean() + 1.0, ("O8", method)


@pytest.mark.parametrize("row", ("m1", "m2"))
def test_standardized_both_variants_beat_fedavg_on_every_seed_but_hf_and_fo_tie(row):
    """Standardized pixels: O1 and O4 hold on every seed at both tau (measured M1: HF - FedAvg +1.1..+1.5, FO -
    FedAvg +1.0..+1.5 points; M2: +2.0..+3.7 and +2.5..+3.2), O2 does not (HF - FO within 0.6 points, means -0.01
    and -0.01). O8 holds by far: before adaptation HF's model scores 21.9 % (M1) and 28.3 % (M2), FO's 60.7 and
    61.3 %, after one step 93.4 and 90.8 %."""
    assert (paired(row, "hf", "fedavg", "standardized") > 0).all(), "O1"
    assert (paired(row, "fo", "fedavg", "standardized") > 0).all(), "O4"
    assert abs(paired(row, "hf", "fo", "standardized").mean()) < 1.0, "HF and FO tie"
    for method in ("fo", "hf"):
        measured = table_row(row, "standardized")[method]
        assert measured.mean > measured.before.mean() + 10.0, ("O8", method)


def test_m2_the_methods_tie_and_adaptation_still_helps():
    """At tau = 4 with raw pixels O1 and O2 do not reproduce: the three methods are within 1.5 points of each other
    on average (measured HF - FedAvg -0.91, HF - FO -0.51 points) and HF is below FedAvg on 4 seeds of 5. What
    holds: the one-step adaptation raises Per-FedAvg's accuracy (O8, +0.2 points for FO, +0.3 for HF)."""
    assert abs(paired("m2", "hf", "fedavg").mean()) < 1.5 and abs(paired("m2", "hf", "fo").mean()) < 1.5
    for method in ("fo", "hf"):
        assert table_row("m2")[method].mean > table_row("m2")[method].before.mean(), ("O8", method)


def test_fewer_local_steps_lower_every_method_on_digits():
    """O6: at fixed K, tau = 10 (M1) beats tau = 4 (M2) for every method, by 14-19 points with raw pixels and
    2.6-4.1 standardized."""
    for method in METHODS:
        assert table_row("m1")[method].mean > table_row("m2")[method].mean + 5, method
        assert table_row("m1", "standardized")[method].mean > table_row("m2", "standardized")[method].mean + 1, method


# -- CIFAR-10 ----------------------------------------------------------------------------------------------------

def test_c1_the_methods_tie_above_the_paper_and_adaptation_lifts_them_from_near_chance():
    """What holds at C1 (measured over 3 seeds): O8 by 40-53 points (before adaptation 26.6 / 17.1 / 12.8 %, after
    66.4 / 64.9 / 65.5 %); every method above 50 %, what each user scores by predicting its own most frequent test
    label; O1 and O2 do not (HF - FedAvg -0.97 on average and negative on every seed, HF - FO +0.62)."""
    measured = table_row("c1")
    for method in METHODS:
        assert measured[method].mean > measured[method].before.mean() + 30, ("O8", method)
        assert measured[method].mean > 55, method
    assert abs(paired("c1", "hf", "fedavg").mean()) < 3 and abs(paired("c1", "hf", "fo").mean()) < 3


# C2-C4 are not measured yet: the paper's expectations (spec §5.3)
@pytest.mark.parametrize("row", ("c2", "c3", "c4"))
def test_cifar_hf_beats_fedavg_and_fo_and_adaptation_helps(row):
    """O1, O2, O8 in the other CIFAR-10 rows (paper: all hold)."""
    measured = table_row(row)
    assert gap(row, "hf", "fedavg") > 0, "O1"
    assert measured["hf"].mean >= measured["fo"].mean, "O2"
    for method in ("fo", "hf"):
        assert measured[method].mean > measured[method].before.mean(), ("O8", method)


def test_cifar_fewer_local_steps_lower_every_method():
    """O6 on CIFAR-10: tau = 10 (C1) beats tau = 4 (C2)."""
    for method in METHODS:
        assert table_row("c1")[method].mean > table_row("c2")[method].mean, method


def test_larger_alpha_hurts_fo_not_hf():
    """O5 on CIFAR-10, tau = 4: alpha 0.001 (C2) -> 0.01 (C3)."""
    small, large = table_row("c2"), table_row("c3")
    assert large["fo"].mean < small["fo"].mean
    assert large["hf"].mean >= small["hf"].mean - small["hf"].ci - large["hf"].ci


def test_more_heterogeneity_widens_hf_lead():
    """O7: diff. hetero. (C4) against the base partition (C3)."""
    base, diff = table_row("c3"), table_row("c4")
    assert diff["hf"].mean - diff["fedavg"].mean > base["hf"].mean - base["fedavg"].mean
    assert diff["fo"].mean < diff["hf"].mean
