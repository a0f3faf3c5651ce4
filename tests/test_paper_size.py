"""Paper-size runs of Bao et al. (ICML 2022), from the shipped recipes in recipes/papers/ (spec 002 §3,
§5.3; minutes): run with `pytest -m slow -s`, which prints every number asserted on.

* Lasso (Figure 1): each of Fast-FedDA, C-FedDA, MC-FedDA first reaches ℓ2 error ≤ 1 in at least 20%
  fewer rounds than both FedMiD and FedDA (the spec's port: ≈590–710 vs ≈910–925), 3 seeds.
* Low-rank (Figure 2): FedMiD's final rank stays far above 16; the other four end at exactly 16.
* EMNIST-10 (Figure 3) on the shipped 10% writer sample, CPU-sized (1,500 rounds): Fast-FedDA ends with
  a lower training loss than FedMiD and FedDA, and final test accuracies lie in the 0.84–0.90 window of
  the paper's plots (spec 002 §4.4).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sweeps.execute import build_simulation, drive
from sweeps.recipe import load

pytestmark = pytest.mark.slow
PAPERS = Path(__file__).resolve().parents[1] / "recipes" / "papers"
PROPOSED, BASELINES = ("fast_fedda", "c_fedda", "mc_fedda"), ("fedmid", "fedda")


def run_recipe(name: str, algorithm: str, seed: int):
    trial = load(PAPERS / name).single_trial(algorithm, seed)
    start = time.perf_counter()
    outcome = drive(build_simulation(trial))
    assert outcome.status == "finished" and outcome.rows[-1]["round"] == trial.federation.rounds
    return outcome, time.perf_counter() - start


def first_round(rows, condition):
    return next((row["round"] for row in rows if condition(row)), None)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_full_size_lasso_proposed_methods_reach_l2_one_sooner(seed):
    crossing = {}
    for algorithm in BASELINES + PROPOSED:
        outcome, wall = run_recipe("bao2022_lasso.yaml", algorithm, seed)
        final = outcome.rows[-1]
        crossing[algorithm] = first_round(outcome.rows, lambda row: row["l2_error"] <= 1)
        print(f"\nlasso seed {seed} {algorithm:10s}: l2 <= 1 at round {crossing[algorithm]}, F1 >= 0.99 at "
              f"{first_round(outcome.rows, lambda row: row['f1'] >= 0.99)}; final l2 {final['l2_error']:.3f} "
              f"l1 {final['l1_error']:.2f} F1 {final['f1']:.3f} mse {final['train_mse']:.3f}; {wall:.1f} s")
        assert 0.3 <= final["l2_error"] <= 0.55 and final["f1"] >= 0.99
    slowest_proposed = max(crossing[a] for a in PROPOSED)
    fastest_baseline = min(crossing[a] for a in BASELINES)
    assert slowest_proposed <= 0.8 * fastest_baseline, crossing
    assert 800 <= crossing["fedmid"] <= 1100  # the spec's port: 912 (seed 0), 909 (seed 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_full_size_lowrank_only_fedmid_misses_rank_16(seed):
    finals = {}
    for algorithm in BASELINES + PROPOSED:
        outcome, wall = run_recipe("bao2022_lowrank.yaml", algorithm, seed)
        finals[algorithm] = final = outcome.rows[-1]
        print(f"\nlowrank seed {seed} {algorithm:10s}: rank 16 at round "
              f"{first_round(outcome.rows, lambda row: row['rank'] == 16)}, Fro <= 1 at "
              f"{first_round(outcome.rows, lambda row: row['fro_error'] <= 1)}; final rank {final['rank']:.0f} "
              f"Fro {final['fro_error']:.3f} op {final['op_error']:.3f} mse {final['train_mse']:.3f}; {wall:.1f} s")
    assert finals["fedmid"]["rank"] >= 24, "FedMiD's iterate should stay far above rank 16"
    for algorithm in ("fedda",) + PROPOSED:
        assert finals[algorithm]["rank"] == 16, algorithm


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cpu_sized_emnist10_fast_fedda_trains_lowest(seed):
    if not (Path(os.environ.get("FEDBENCH_DATA", "/nonexistent")) / "femnist" / "femnist_sample10.npz").is_file():
        pytest.skip("needs $FEDBENCH_DATA/femnist/femnist_sample10.npz")
    finals = {}
    for algorithm in ("fast_fedda",) + BASELINES:
        outcome, wall = run_recipe("bao2022_emnist10_cpu.yaml", algorithm, seed)
        finals[algorithm] = final = outcome.rows[-1]
        print(f"\nemnist10 seed {seed} {algorithm:10s}: final train loss {final['train_loss']:.4f} test loss "
              f"{final['test_loss']:.4f} train acc {final['train_accuracy']:.4f} test acc {final['test_accuracy']:.4f} "
              f"nonzeros {final['nonzeros']:.0f}; {wall:.1f} s")
    assert finals["fast_fedda"]["train_loss"] < min(finals[a]["train_loss"] for a in BASELINES)
    for algorithm, final in finals.items():
        assert 0.84 <= final["test_accuracy"] <= 0.90, algorithm
