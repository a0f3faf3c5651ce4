"""Paper-size runs of the synthetic experiments of Hanzely, Zhao, Kolar (TMLR 2023, §5.1–5.2) from the shipped
recipes recipes/papers/hanzely2023_s1.yaml (MX2, Fig. 1 / Table 4) and hanzely2023_s2.yaml (EWS, Fig. 2 / Table 5),
full size (M = 20, n = 1000, 1000 communication rounds, metrics after each), REPEATS repetitions per method
(the paper: 30; 3–5 suffice, the standard errors of the paper's curves being 1e-4 to 2e-3). Run with
`pytest -m slow -s` (about 20 minutes on 2 cores), which prints the tables of the note of issue 14.

The checks (S1 items 1–7, S2 items 1–5) are the paper's claims on Figs. 1–2 and Tables 4–5 with the values of the
curves stored in the authors' repository (`Synthetic/MX2/result/`, `Synthetic/EWS/result/`; F* by L-BFGS on the
same data). Each is asserted as measured; where one does not hold here, the test says so and asserts the measured
relation instead, and where that is a claim of the paper's it compares the measured value with the deviation
declared in sweeps/deviations.py (`deviation_holds`).
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from fedbench.problems import make_problem
from fedbench.reference import solve
from helpers import deviation_holds
from sweeps.driving import build_simulation, drive
from sweeps.recipe import load

pytestmark = pytest.mark.slow
PAPERS = Path(__file__).resolve().parents[2] / "recipes" / "papers"
REPEATS = 5
S1_LEVELS, S2_LEVELS = (0.1, 0.3, 1.0), (5.0, 10.0, 15.0)
CHECKPOINTS = (0, 10, 50, 100, 200, 500, 1000)


@cache
def runs(recipe: str, sigma_h: float) -> dict[str, dict[str, np.ndarray]]:
    """Per algorithm: objective and estimation-error curves `[repeats, 1001]` and seconds per 1000 rounds."""
    loaded = load(PAPERS / recipe)
    out = {}
    for algorithm in loaded.algorithms:
        curves, errors, seconds = [], [], []
        for seed in range(REPEATS):
            trial = loaded.single_trial(algorithm, seed, fixed={"problem.sigma_h": sigma_h})
            outcome = drive(build_simulation(trial, "cpu"))
            assert outcome.status == "finished", (algorithm, sigma_h, seed, outcome.status)
            curves.append([row["objective"] for row in outcome.rows])
            errors.append([row["estimation_error"] for row in outcome.rows])
            seconds.append(outcome.train_seconds + outcome.eval_seconds)
        out[algorithm] = {"objective": np.array(curves), "error": np.array(errors), "seconds": np.array(seconds)}
        mean = out[algorithm]["objective"].mean(0)
        print(f"\n{recipe} σ_h={sigma_h} {algorithm:11s} {np.mean(seconds):6.1f} s/1000 rounds  loss "
              + " ".join(f"{r}:{mean[r]:.4f}" for r in CHECKPOINTS)
              + f"  se@1000 {out[algorithm]['objective'][:, -1].std(ddof=1) / np.sqrt(REPEATS):.1e}"
              + f"  est.err@1000 {out[algorithm]['error'][:, -1].mean():.2f}")
    return out


def optimum(preset: str, sigma_h: float) -> float:
    return solve(make_problem("pfl_synthetic", preset=preset, sigma_h=sigma_h)).objective


def mean_curve(result, algorithm):
    return result[algorithm]["objective"].mean(0)


@pytest.mark.parametrize("sigma_h", S1_LEVELS)
def test_s1_final_losses_and_orderings(sigma_h):
    result, f_star = runs("hanzely2023_s1.yaml", sigma_h), optimum("s1", sigma_h)
    final = {a: mean_curve(result, a)[-1] for a in result}
    last100 = {a: mean_curve(result, a)[-100:].mean() for a in result}
    print(f"\nS1 σ_h={sigma_h} F*={f_star:.6f} final " + " ".join(f"{a}:{v - f_star:+.4f}" for a, v in final.items()))
    # S1 item 1: the fixed L2SGD+ ends within 1e-3 of F*
    assert final["l2sgd_plus"] - f_star < 1e-3
    # item 2: ASVRCD's last-100-round mean within 0.008 of F* (2e-3 at σ_h = 1.0)
    assert last100["asvrcd_pfl"] - f_star < (2e-3 if sigma_h == 1.0 else 8e-3)
    # item 3: ASCD within F* + 0.01 by round 50, then a plateau above F* (no variance reduction)
    ascd = mean_curve(result, "ascd_pfl")
    assert ascd[50] - f_star < 0.012 and 0.004 < last100["ascd_pfl"] - f_star < 0.012
    # item 4: LSGD (η = 0.01, τ = 5) far above the others: final ≈ 0.37 / 0.42 / 0.38
    assert final["lsgd_pfl"] == pytest.approx({0.1: 0.3664, 0.3: 0.4183, 1.0: 0.3764}[sigma_h], abs=0.01)
    # item 5: pFedMe plateaus about F* + 0.01
    assert 0.003 < last100["pfedme"] - f_star < 0.02
    # item 6: L2SGD+ ≲ ASVRCD ≲ ASCD ≈ pFedMe ≪ LSGD (last-100 means)
    assert last100["l2sgd_plus"] <= last100["asvrcd_pfl"] + 1e-4
    assert last100["asvrcd_pfl"] < last100["ascd_pfl"] + 2e-3
    assert max(last100["ascd_pfl"], last100["pfedme"]) + 0.05 < last100["lsgd_pfl"]


@pytest.mark.parametrize("sigma_h", S1_LEVELS)
def test_s1_early_rounds(sigma_h):
    """S1 item 3's early ordering (ASCD below ASVRCD at r = 10 and r = 50 for every σ_h) holds at σ_h = 0.1 only,
    and the test asserts what the authors' current code gives. That check rests on the curves stored with the
    paper (the authors' pickles behind its Fig. 1); the authors' current ASVRCD code on the same data does not
    produce them, and ours (Algorithm 4 with the parameters of Thm 8/9, checked against a transcription in
    test_pfl_vr) agrees
    with the current code: the stored curves come from an earlier, slower-starting version of their ASVRCD (a
    declared deviation, hanzely2023-s1-early-asvrcd, with the values at σ_h = 1.0, r = 10).
    So at σ_h = 0.3 ASCD is below at r = 10 but not at r = 50, at σ_h = 1.0 at neither. ASVRCD below ASCD from r = 200 on at
    σ_h ∈ {0.3, 1.0} holds on average over those rounds (pointwise the noisy curves cross at σ_h = 0.3)."""
    result = runs("hanzely2023_s1.yaml", sigma_h)
    ascd, asvrcd = mean_curve(result, "ascd_pfl"), mean_curve(result, "asvrcd_pfl")
    print(f"\nS1 σ_h={sigma_h} r=10: ASCD {ascd[10]:.4f} ASVRCD {asvrcd[10]:.4f}; r=50: {ascd[50]:.4f} {asvrcd[50]:.4f}")
    if sigma_h == 1.0:
        deviation_holds("hanzely2023-s1-early-asvrcd", {"ASVRCD's objective at σ_h = 1.0, r = 10": asvrcd[10]})
    below = {0.1: (True, True), 0.3: (True, False), 1.0: (False, False)}[sigma_h]
    assert ((ascd[10] < asvrcd[10]), (ascd[50] < asvrcd[50])) == below, \
        "the early ordering moved: see the deviation hanzely2023-s1-early-asvrcd (sweeps/deviations.py)"
    if sigma_h != 0.1:  # pointwise the noisy curves cross now and then (σ_h = 0.3): compared on average
        assert asvrcd[200:].mean() < ascd[200:].mean()


def test_s1_wall_clock_ordering():
    """S1 item 7 (Table 4): per 1000 rounds ASCD ≲ L2SGD+ < ASVRCD < pFedMe, and the CD methods cost more as σ_h grows
    (p_w shrinks, so more iterations per communication). Asserted: ASCD < ASVRCD, ASCD ≲ L2SGD+, the growth
    with σ_h, and pFedMe above ASCD and L2SGD+. ASVRCD against pFedMe depends on the machine's load here (both
    ~40k gradient evaluations per 1000 rounds once vectorised: 24.6 vs 25.7 s loaded at σ_h = 1.0)."""
    seconds = {s: {a: r["seconds"].mean() for a, r in runs("hanzely2023_s1.yaml", s).items()} for s in S1_LEVELS}
    for s, row in seconds.items():
        print(f"\nTable 4 here, σ_h={s}: " + " ".join(f"{a}:{v:.1f}s" for a, v in row.items()))
    for row in seconds.values():
        assert row["ascd_pfl"] < row["asvrcd_pfl"]
        assert row["ascd_pfl"] < 1.5 * row["l2sgd_plus"]
        assert max(row["ascd_pfl"], row["l2sgd_plus"]) < row["pfedme"] * 1.5
    for algorithm in ("ascd_pfl", "asvrcd_pfl", "l2sgd_plus"):
        assert seconds[0.1][algorithm] < seconds[1.0][algorithm]


@pytest.mark.parametrize("sigma_h", S2_LEVELS)
def test_s2(sigma_h):
    result, f_star = runs("hanzely2023_s2.yaml", sigma_h), optimum("s2", sigma_h)
    ascd, asvrcd, lsgd = (mean_curve(result, a) for a in ("ascd_pfl", "asvrcd_pfl", "lsgd_pfl"))
    print(f"\nS2 σ_h={sigma_h} F*={f_star:.6f} final ASCD {ascd[-1] - f_star:+.4f} ASVRCD {asvrcd[-1] - f_star:+.4f} "
          f"LSGD {lsgd[-1]:.4f}")
    # S2 item 1: ASCD below ASVRCD for r ≤ 100 (from r = 10: in the first rounds both sit at ~ln 2 and cross)
    assert np.all(ascd[10:101] < asvrcd[10:101])
    # item 2: ASVRCD ends ≤ ASCD, within 0.002–0.007 of F*; ASCD ends 0.006–0.009 above
    assert asvrcd[-1] <= ascd[-1] + 5e-4 and asvrcd[-1] - f_star < 0.008
    assert 0.003 < ascd[-1] - f_star < 0.012
    # item 3: LSGD ≥ 0.61 at r = 1000
    assert lsgd[-1] > 0.6
    # item 4: the CD methods' estimation error dips, then rises (over-fitting) at the smallest heterogeneity
    if sigma_h == 5.0:
        error = result["ascd_pfl"]["error"].mean(0)
        assert error.min() < 0.8 * error[-1]


def test_s2_wall_clock_ordering():
    """S2 item 5 (Table 5): ASCD < ASVRCD ≪ LSGD per 1000 rounds. Both CD methods are cheaper than LSGD here
    (p_w = 0.47: about two iterations per round against LSGD's five); ASCD against ASVRCD is within the machine's noise
    (2.8 vs 2.3 s at σ_h = 5, 3.0 vs 3.7 s at σ_h = 15 on a loaded 2-core machine), so only the first holds."""
    for s in S2_LEVELS:
        row = {a: r["seconds"].mean() for a, r in runs("hanzely2023_s2.yaml", s).items()}
        print(f"\nTable 5 here, σ_h={s}: " + " ".join(f"{a}:{v:.1f}s" for a, v in row.items()))
        assert max(row["ascd_pfl"], row["asvrcd_pfl"]) < row["lsgd_pfl"]


@pytest.mark.parametrize("objective", ["mt2", "mx2", "apfl2"])
def test_r1_fashion_mnist_k2_ordering(objective):
    """R1 at K = 2 on Fashion-MNIST (§6.1, Figs. 3–5: the round-1000 values of the curves stored in the authors'
    repository, `CV/Algorithms_Comparions/`), one run with the code's data choices. The code's plotted loss is the
    objective/50 (its per-batch scaling), so its round-1000 values ×50 are the targets: ASCD and LSGD land on them
    (MX2: ASCD 0.88 vs 0.0176·50, LSGD 1.53 vs 0.0307·50). ASVRCD does not: the code's ∇F(v) (`F_grads`, with the
    same per-batch scaling) was ~50× too small, and ours ends between ASCD and LSGD instead of above LSGD. The
    ordering that holds: ASCD < ASVRCD < LSGD at round 1000 (the stored curves: ASCD < LSGD < ASVRCD)."""
    loaded = load(PAPERS / "hanzely2023_r1_fashion_mnist.yaml")
    final = {}
    for algorithm in loaded.algorithms:
        trial = loaded.single_trial(algorithm, 111, fixed={"problem.classes": 2, "problem.objective": objective})
        outcome = drive(build_simulation(trial, "cpu"))
        final[algorithm] = outcome.rows[-1]
    print(f"\nR1 FMNIST K=2 {objective}: " + " ".join(
        f"{a}:{r['objective']:.4f}/{r['test_accuracy']:.3f}" for a, r in final.items()))
    stored = {"mt2": (0.0560, 0.0658), "mx2": (0.0176, 0.0307), "apfl2": (0.0233, 0.0390)}[objective]
    assert final["ascd_pfl"]["objective"] == pytest.approx(50 * stored[0], rel=0.05)
    assert final["lsgd_pfl"]["objective"] == pytest.approx(50 * stored[1], rel=0.05)
    assert final["ascd_pfl"]["objective"] < final["asvrcd_pfl"]["objective"] < final["lsgd_pfl"]["objective"]
