"""Paper-size runs of Per-FedAvg's Table 1 (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020, §5) from the shipped recipes
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

CIFAR-10, 3 seeds (the tests run those 3; C1 from the sweep of 2026-11-26, C2-C4 of 2026-11-27; paper in brackets):
  C1 (tau = 10, alpha = 0.001): 66.44 ± 0.86 [40.49] / 64.86 ± 1.34 [46.98] / 65.48 ± 0.26 [50.44]
  C2 (tau = 4,  alpha = 0.001): 32.66 ± 1.40 [38.38] / 36.03 ± 2.17 [34.04] / 41.98 ± 4.81 [43.73]
  C3 (tau = 4,  alpha = 0.01):  61.43 ± 2.12 [35.97] / 59.40 ± 0.79 [25.32] / 59.79 ± 0.80 [46.32]
  C4 (C3, diff. hetero.):       67.07 ± 2.26 [58.59] / 67.08 ± 0.27 [37.71] / 67.29 ± 0.89 [71.25]
C2 reproduces the paper (FO and HF within 2 points, FedAvg 6 under; O1, O2, O8 hold; FO above FedAvg, where the
paper has it below). C1, C3 and C4 are another regime: raw CIFAR-10 images are nearly collinear (mean cosine
0.82), so one adaptation step moves every image's activations alike, towards the user's own labels; every method
lands at or above what each user scores by predicting its most frequent test label (50 % C1-C3, 60 % C4) and the
three tie (O1, O2, O5, O7 do not hold there; O6 and O8 do). At alpha = 0.01 one step from the untrained initial
model already reaches that baseline. Adapting on training samples instead (C1, FedAvg, seed 0: 63.9 %) shows the
test-sample leak of the literal protocol is not the cause.
The checks named here (orderings of the paper's Table 1 and §5, but O8, which is ours): O1 (HF above FedAvg +
update), O2 (HF >= FO), O8 (adaptation helps Per-FedAvg), O6 (tau = 10 beats tau = 4 for every method), O5 (raising
alpha hurts FO and not HF), O7 (diff. hetero. widens HF's lead); each test asserts those that hold, and compares
those that do not with the deviations declared in sweeps/deviations.py (`deviation_holds`), which the gallery page
lists.
"""
from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from helpers import deviation_holds
from sweeps.driving import build_simulation, drive
from sweeps.recipe import load

pytestmark = pytest.mark.slow
PAPERS = Path(__file__).resolve().parents[2] / "recipes" / "papers"
METHODS = ("fedavg", "fo", "hf")
CIFAR_SEEDS = 3
PAPER = {  # Table 1, % (mean; the CIs are 0.02–0.23)
    "m1": (75.96, 78.00, 79.85), "m2": (60.18, 64.55, 70.94), "c1": (40.49, 46.98, 50.44),
    "c2": (38.38, 34.04, 43.73), "c3": (35.97, 25.32, 46.32), "c4": (58.59, 37.71, 71.25)}
# Each user predicting its own most frequent test label, averaged over users (%): a type A user's five labels are
# equally frequent (20 %), a type B user's majority label is 80 % of its test images (C4's diff. hetero.: 100 %)
MAJORITY_LABEL = {"c1": 50.0, "c2": 50.0, "c3": 50.0, "c4": 60.0}


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


def table_row(row: str, scaling: str = "raw") -> dict[str, Measured]:
    """The row's methods at one input scaling (the digits rows run both: `input_scaling`), each row run once per
    session: `table_row("c2")` and `table_row("c2", "raw")` share the cache entry (an `lru_cache` on this function
    would key them apart and run the row twice)."""
    return _run_row(row, scaling)


@cache
def _run_row(row: str, scaling: str) -> dict[str, Measured]:
    # The CIFAR-10 rows run the 3 seeds measured (the recipes' 5 take about twice as long: ~1 h for C1 alone)
    recipe = load(PAPERS / f"fallah2020_{row}.yaml", [f"seeds={CIFAR_SEEDS}"] if row.startswith("c") else None)
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
    FedAvg +1.0..+1.5 points; M2: +2.0..+3.7 and +2.5..+3.2), O2 does not (HF and FO tie: a declared deviation).
    O8 holds by far: before adaptation HF's model scores 21.9 % (M1) and 28.3 % (M2), FO's 60.7 and 61.3 %, after
    one step 93.4 and 90.8 %."""
    assert (paired(row, "hf", "fedavg", "standardized") > 0).all(), "O1"
    assert (paired(row, "fo", "fedavg", "standardized") > 0).all(), "O4"
    deviation_holds("fallah2020-standardized-hf-fo",
                    {f"{row.upper()}: HF − FO": paired(row, "hf", "fo", "standardized").mean()})
    for method in ("fo", "hf"):
        measured = table_row(row, "standardized")[method]
        assert measured.mean > measured.before.mean() + 10.0, ("O8", method)


def test_m2_the_methods_tie_and_adaptation_still_helps():
    """At tau = 4 with raw pixels O1 and O2 do not reproduce (a declared deviation): the three methods tie and HF is
    below FedAvg on 4 seeds of 5. What holds: the one-step adaptation raises Per-FedAvg's accuracy (O8, +0.2 points
    for FO, +0.3 for HF)."""
    deviation_holds("fallah2020-m2-raw-tie", {"HF − FedAvg + update": paired("m2", "hf", "fedavg").mean(),
                                              "HF − FO": paired("m2", "hf", "fo").mean()})
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
    label; O1 and O2 do not (the three tie: a declared deviation)."""
    measured = table_row("c1")
    for method in METHODS:
        assert measured[method].mean > measured[method].before.mean() + 30, ("O8", method)
        assert measured[method].mean > MAJORITY_LABEL["c1"] + 5, method
    deviation_holds("fallah2020-c1-tie", {"HF − FedAvg + update": paired("c1", "hf", "fedavg").mean(),
                                          "HF − FO": paired("c1", "hf", "fo").mean()})


def test_c2_hf_beats_fo_beats_fedavg_on_every_seed_near_the_paper():
    """C2 (tau = 4, alpha = 0.001) is the row in the paper's regime and reproduces it: measured FedAvg / FO / HF
    32.66 ± 1.40 / 36.03 ± 2.17 / 41.98 ± 4.81 against the paper's 38.38 / 34.04 / 43.73. O1 beyond both CIs
    (HF - FedAvg +6.8, +8.5, +12.7 points by seed), O2 on every seed (HF - FO +4.6, +4.5, +8.8), O8 (+7.1 FO, +12.7
    HF). Where it differs from the paper: FO beats FedAvg + update on every seed (+2.2, +4.0, +3.9), where the paper
    has it 4.3 points below (Table 1): a declared deviation."""
    measured = table_row("c2")
    assert gap("c2", "hf", "fedavg") > 0, "O1"
    assert (paired("c2", "hf", "fo") > 0).all(), "O2"
    deviation_holds("fallah2020-c2-fo-above-fedavg", {"FO − FedAvg + update": paired("c2", "fo", "fedavg").mean()})
    for method in ("fo", "hf"):
        assert measured[method].mean > measured[method].before.mean() + 3, ("O8", method)
        assert abs(measured[method].mean - PAPER["c2"][METHODS.index(method)]) < 5, method


@pytest.mark.parametrize("row", ("c3", "c4"))
def test_at_the_larger_alpha_one_step_teaches_each_user_its_labels_and_the_methods_tie(row):
    """C3 and C4 (alpha = 0.01): one adaptation step on raw CIFAR-10 pixels (two images' mean cosine 0.82) shifts
    every image's activations alike, towards the user's own labels: from the untrained initial model it already
    scores each row's majority-label baseline (50 % C3, 60 % C4), and after training the three methods tie at or
    above it (measured C3 61.43 / 59.40 / 59.79, C4 67.07 / 67.08 / 67.29; the paper 35.97 / 25.32 / 46.32 and
    58.59 / 37.71 / 71.25). O1 does not hold, nor "FO stays poor" (O5, O7): a declared deviation. O8 holds by far
    (FO 12.0 and 10.0 % before its step)."""
    measured = table_row(row)
    for method in METHODS:
        assert measured[method].mean > MAJORITY_LABEL[row] + 5, method
        assert measured[method].mean > measured[method].before.mean() + 30, ("O8", method)
    name = row.upper()
    deviation_holds("fallah2020-c3-c4-tie", {f"{name}: HF − FedAvg + update": paired(row, "hf", "fedavg").mean(),
                                             f"{name}: HF − FO": paired(row, "hf", "fo").mean()})


def test_cifar_fewer_local_steps_lower_every_method():
    """O6 on CIFAR-10 holds: tau = 10 (C1) above tau = 4 (C2) for every method, by 23-34 points, but for C1's
    regime's reason (its adaptation step shifts each user's label prior) rather than more training."""
    for method in METHODS:
        assert table_row("c1")[method].mean > table_row("c2")[method].mean + 15, method


def test_a_larger_alpha_lifts_fo_where_the_paper_has_it_fall():
    """O5 does not hold (a declared deviation): from alpha = 0.001 (C2) to 0.01 (C3) FO rises (the paper: 34.04 ->
    25.32), and so do FedAvg + update and HF; HF does not degrade, as O5 says."""
    small, large = table_row("c2"), table_row("c3")
    names = {"fo": "FO", "fedavg": "FedAvg + update", "hf": "HF"}
    deviation_holds("fallah2020-c2-c3-larger-alpha",
                    {f"{names[method]}: C3 − C2": large[method].mean - small[method].mean for method in METHODS})
