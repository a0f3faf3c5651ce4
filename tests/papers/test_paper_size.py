"""Paper-size runs from the shipped recipes in recipes/papers/ (minutes; Reddi et al.'s hours): run with
`pytest -m slow -s`, which prints every number asserted on. Bao et al. (ICML 2022, §4, Figures 1–4):

* Lasso (Figure 1): each of Fast-FedDA, C-FedDA, MC-FedDA first reaches ℓ2 error ≤ 1 in at least 20%
  fewer rounds than both FedMiD and FedDA (a NumPy port of the released LassoRun.m: ≈590–710 vs ≈910–925),
  3 seeds.
* Low-rank (Figure 2): FedMiD's final rank stays far above 16; the other four end at exactly 16.
* EMNIST-10 (Figure 3) on the shipped 10% writer sample, CPU-sized (1,500 rounds): Fast-FedDA ends with
  a lower training loss than FedMiD and FedDA, and final test accuracies lie in the 0.84–0.90 window of
  the paper's plots (the y-range of Figure 3 in the released plotting script).
* EMNIST-62 (Figure 4), CPU-sized (3,000 of the paper's 75,000 rounds): Fast-FedDA and MC-FedDA end with a
  lower training loss and a higher test accuracy than FedMiD and FedDA, and Fast-FedDA leads at every evaluated
  round (the paper's claim on Figure 4, §4).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import deviation_holds
from sweeps.driving import build_simulation, drive
from sweeps.recipe import load

pytestmark = pytest.mark.slow
PAPERS = Path(__file__).resolve().parents[2] / "recipes" / "papers"
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
    crossing, finals = {}, {}
    for algorithm in BASELINES + PROPOSED:
        outcome, wall = run_recipe("bao2022_lasso.yaml", algorithm, seed)
        finals[algorithm] = final = outcome.rows[-1]
        crossing[algorithm] = first_round(outcome.rows, lambda row: row["l2_error"] <= 1)
        print(f"\nlasso seed {seed} {algorithm:10s}: l2 <= 1 at round {crossing[algorithm]}, F1 >= 0.99 at "
              f"{first_round(outcome.rows, lambda row: row['f1'] >= 0.99)}; final l2 {final['l2_error']:.3f} "
              f"l1 {final['l1_error']:.2f} F1 {final['f1']:.3f} mse {final['train_mse']:.3f}; {wall:.1f} s")
        assert 0.3 <= final["l2_error"] <= 0.55, algorithm
    for algorithm in ("fedda",) + PROPOSED:
        assert finals[algorithm]["f1"] >= 0.99, algorithm
    # The paper has FedMiD fail to recover the support: declared as a deviation (sweeps/deviations.py)
    deviation_holds("bao2022-lasso-fedmid-support", {"FedMiD's final F1": finals["fedmid"]["f1"]})
    slowest_proposed = max(crossing[a] for a in PROPOSED)
    fastest_baseline = min(crossing[a] for a in BASELINES)
    assert slowest_proposed <= 0.8 * fastest_baseline, crossing
    assert 800 <= crossing["fedmid"] <= 1100  # the NumPy port of LassoRun.m: 912 (seed 0), 909 (seed 1)


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


def needs_the_femnist_sample():
    if not (Path(os.environ.get("FEDBENCH_DATA", "/nonexistent")) / "femnist" / "femnist_sample10.npz").is_file():
        pytest.skip("needs $FEDBENCH_DATA/femnist/femnist_sample10.npz")


def print_emnist_final(name, seed, algorithm, final, wall):
    print(f"\n{name} seed {seed} {algorithm:10s}: final train loss {final['train_loss']:.4f} test loss "
          f"{final['test_loss']:.4f} train acc {final['train_accuracy']:.4f} test acc {final['test_accuracy']:.4f} "
          f"nonzeros {final['nonzeros']:.0f}; {wall:.1f} s")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cpu_sized_emnist10_fast_fedda_trains_lowest(seed):
    needs_the_femnist_sample()
    finals = {}
    for algorithm in ("fast_fedda",) + BASELINES:
        outcome, wall = run_recipe("bao2022_emnist10_cpu.yaml", algorithm, seed)
        finals[algorithm] = outcome.rows[-1]
        print_emnist_final("emnist10", seed, algorithm, outcome.rows[-1], wall)
    assert finals["fast_fedda"]["train_loss"] < min(finals[a]["train_loss"] for a in BASELINES)
    for algorithm, final in finals.items():
        assert 0.84 <= final["test_accuracy"] <= 0.90, algorithm


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cpu_sized_emnist62_fast_fedda_and_mc_fedda_beat_the_baselines(seed):
    """The paper's claim for Figure 4 (the two methods it singles out; C-FedDA is left out to save 4 minutes a
    seed). Its plot windows (loss 1.35-1.60, accuracy 0.60-0.66) are for 75,000 rounds: at 3,000 the proposed
    methods' training loss is inside and their test accuracy at the lower edge (0.599-0.605 in the sweep of
    2026-11-27), so only the loss window is asserted, the accuracy one from 0.59."""
    needs_the_femnist_sample()
    curves, finals = {}, {}
    for algorithm in ("fast_fedda", "mc_fedda") + BASELINES:
        outcome, wall = run_recipe("bao2022_emnist62_cpu.yaml", algorithm, seed)
        curves[algorithm] = [row["train_loss"] for row in outcome.rows[1:]]  # round 0 is W0 = 0 for all
        finals[algorithm] = outcome.rows[-1]
        print_emnist_final("emnist62", seed, algorithm, outcome.rows[-1], wall)
    for algorithm in ("fast_fedda", "mc_fedda"):
        assert finals[algorithm]["train_loss"] < min(finals[a]["train_loss"] for a in BASELINES), algorithm
        assert finals[algorithm]["test_accuracy"] > max(finals[a]["test_accuracy"] for a in BASELINES), algorithm
        assert 1.35 <= finals[algorithm]["train_loss"] <= 1.60 and finals[algorithm]["test_accuracy"] >= 0.59
    for algorithm in ("mc_fedda",) + BASELINES:
        assert all(fast < other for fast, other in zip(curves["fast_fedda"], curves[algorithm])), algorithm


# -- Guo, Jin, Luo, Yang (ICML 2023) "FeDXL", §4 and App. C.3: every run of a recipe, final test metrics ---

def final_rows(name: str, key) -> dict:
    """{key(trial): [final row of each seed]} for every trial of the recipe, printed as a table."""
    finals = {}
    for trial in load(PAPERS / name).trials():
        outcome = drive(build_simulation(trial))
        assert outcome.status == "finished", (trial.algorithm, trial.seed)
        finals.setdefault(key(trial), []).append(outcome.rows[-1])
    print(f"\n{name}: mean ± std over {len(next(iter(finals.values())))} seeds of the final averaged model")
    for label, rows in finals.items():
        cells = "  ".join(f"{m} {np.mean([r[m] for r in rows]):.4f}±{np.std([r[m] for r in rows]):.4f}"
                          for m in rows[0] if m.startswith("test_"))
        print(f"  {str(label):14s} {cells}")
    return finals


def mean(rows, metric="test_pauc_0.3") -> float:
    return float(np.mean([row[metric] for row in rows]))


def test_synthetic_pauc_fedxl2_matches_centralized_and_beats_ce_and_codasca():
    """Table 2's pattern (§4: FeDXL2 above the local methods, competitive with Centralized) on SynthPAUC (our
    stand-in for the paper's image data sets): FeDXL2 within 0.01 of centralized SOX, at least
    Local Pair's pAUC (within 0.002: under the paper-faithful weak heterogeneity both see every class on
    every client and the gap is expected to be small), above Local SGD (CE) and CODASCA, at FPR ≤ 0.3."""
    finals = final_rows("guo2023_pauc_synthetic.yaml", lambda trial: trial.algorithm)
    fedxl2 = mean(finals["fedxl2"])
    assert abs(fedxl2 - mean(finals["centralized"])) <= 0.01
    assert fedxl2 >= mean(finals["local_pair"]) - 0.002
    assert fedxl2 > mean(finals["local_sgd_ce"]) and fedxl2 > mean(finals["codasca"])


def test_k_ablation_moderate_k_does_not_hurt():
    """Figure 2 left (App. C.3: a moderate K does not harm): at an equal budget of local iterations, communicating every
    K = 32 steps loses at most 0.005 test pAUC(0.3) against communicating every step."""
    finals = final_rows("guo2023_pauc_ablation_k.yaml", lambda trial: trial.federation.local_steps)
    assert mean(finals[32]) >= mean(finals[1]) - 0.005
    assert mean(finals[16]) >= mean(finals[1]) - 0.005


def test_n_ablation_more_clients_help():
    """Figure 2 right (App. C.3: more machines help): with each client's data fixed, more clients give a higher
    test pAUC(0.3)."""
    finals = final_rows("guo2023_pauc_ablation_n.yaml", lambda trial: trial.problem_config["clients"])
    pauc = [mean(finals[n]) for n in (1, 4, 16)]
    assert pauc[0] < pauc[1] < pauc[2]


def test_noisy_labels_auc_symmetric_loss_beats_cross_entropy():
    """Table 3's pattern (§4) with 20% flipped training labels: FeDXL1 on the symmetric
    PSM loss within 0.01 of centralized SGD on it and above Local SGD on cross-entropy, which over-fits
    the flipped labels. The paper also has FeDXL1 above CODASCA: a declared deviation (sweeps/deviations.py,
    guo2023-noisy-labels-codasca)."""
    finals = final_rows("guo2023_auc_noisy.yaml", lambda trial: trial.algorithm)
    fedxl1 = mean(finals["fedxl1"], "test_auc")
    assert abs(fedxl1 - mean(finals["centralized"], "test_auc")) <= 0.01
    assert fedxl1 > mean(finals["local_sgd_ce"], "test_auc") + 0.005
    deviation_holds("guo2023-noisy-labels-codasca",
                    {"FeDXL1 − CODASCA, test AUC": fedxl1 - mean(finals["codasca"], "test_auc")})


def test_femnist_pauc_fedxl2_beats_ce_and_codasca():
    """Table 2's pattern on real handwriting (digits 0–4 against the rest, 1:5, 16 clients of writers): FeDXL2
    above Local SGD (CE) and CODASCA in test pAUC(0.3) and at least Local Pair's (within 0.005). Measured
    (3 seeds): FeDXL2 0.829, Local Pair 0.825, CE 0.775, CODASCA 0.649 (LibAUC's defaults, step size not
    tuned), centralized SOX 0.853. The paper's "within ~0.01 of centralized" does not hold at this short budget: a
    declared deviation (sweeps/deviations.py, guo2023-femnist-centralized-gap)."""
    if not (Path(os.environ.get("FEDBENCH_DATA", "/nonexistent")) / "femnist" / "femnist_sample10.npz").is_file():
        pytest.skip("needs $FEDBENCH_DATA/femnist/femnist_sample10.npz")
    finals = final_rows("guo2023_pauc_femnist.yaml", lambda trial: trial.algorithm)
    fedxl2 = mean(finals["fedxl2"])
    assert fedxl2 > mean(finals["local_sgd_ce"]) and fedxl2 > mean(finals["codasca"])
    assert fedxl2 >= mean(finals["local_pair"]) - 0.005
    deviation_holds("guo2023-femnist-centralized-gap",
                    {"centralized SOX − FeDXL2, test pAUC(0.3)": mean(finals["centralized"]) - fedxl2})


def test_cifar10_cnn_pauc_fedxl2_beats_ce_and_codasca():
    """Table 2's CIFAR-10 row, CPU-sized (binary imbalanced CIFAR-10 from batches 1–2, 16 clients, NIID-Bench's LeNet
    for ResNet-18, 320 of 20,000 iterations, one seed): FeDXL2 above Local SGD (CE) and CODASCA in test pAUC at FPR
    ≤ 0.3 and ≤ 0.5 (the paper: +0.076 and +0.029 at 0.3), and Local SGD (CE) below Local Pair (the paper's worst
    or second-worst). Measured: centralized SOX 0.675, Local Pair 0.614, FeDXL2 0.611, CE 0.589, CODASCA 0.570.
    FeDXL2 above Local Pair, within ~0.01 of centralized, and CODASCA above CE do not reproduce at this budget:
    declared deviations (sweeps/deviations.py, guo2023-cifar10-*)."""
    if not (Path(os.environ.get("FEDBENCH_DATA", "/nonexistent")) / "cifar10").is_dir():
        pytest.skip("needs $FEDBENCH_DATA/cifar10 (the CIFAR-10 batches)")
    finals = final_rows("guo2023_pauc_cifar10_cnn.yaml", lambda trial: trial.algorithm)
    for metric in ("test_pauc_0.3", "test_pauc_0.5"):
        fedxl2 = mean(finals["fedxl2"], metric)
        assert fedxl2 > mean(finals["local_sgd_ce"], metric) + 0.01 and fedxl2 > mean(finals["codasca"], metric) + 0.01
        assert mean(finals["local_sgd_ce"], metric) < mean(finals["local_pair"], metric)
    fedxl2 = mean(finals["fedxl2"])
    deviation_holds("guo2023-cifar10-local-pair", {"FeDXL2 − Local Pair, test pAUC(0.3)": fedxl2 - mean(finals["local_pair"])})
    deviation_holds("guo2023-cifar10-centralized-gap",
                    {"centralized SOX − FeDXL2, test pAUC(0.3)": mean(finals["centralized"]) - fedxl2})
    deviation_holds("guo2023-cifar10-codasca-ce", {"CODASCA − Local SGD (CE), test pAUC(0.3)":
                                                   mean(finals["codasca"]) - mean(finals["local_sgd_ce"])})


REDDI_FEDADAM = ["federation.server_optimizer={name: adam, lr: 0.00316, tau: 1.0e-4, form: optax}",
                 "algorithms.fedavg.client_lr=0.0316"]


@pytest.mark.parametrize("method, overrides", [("FedAvg", []), ("FedAdam", REDDI_FEDADAM)])
def test_reddi2021_emnist_cr_reaches_table_1(method, overrides):
    """Reddi et al. (ICLR 2021), Table 1's EMNIST CR column, the shipped recipe at full size (all 3,597 FEMNIST
    writers, 1,500 rounds of 10 clients, one epoch at b = 20; about 2.5-3 h per method on one CPU core): the final
    test accuracy at or above the table's column less 1.5 points (about 85 % for every method; the per-method values
    could not be read here: docs/gallery/reddi2021.md). Measured at round 1,500: FedAvg 0.853, FedAdam 0.866, the
    latter 1.6 points above 85 %, which a two-sided band would call a miss though the model is better."""
    if not (Path(os.environ.get("FEDBENCH_DATA", "/nonexistent")) / "femnist" / "femnist_full.npz").is_file():
        pytest.skip("needs $FEDBENCH_DATA/femnist/femnist_full.npz")
    trial = load(PAPERS / "reddi2021_emnist_cr.yaml", overrides).single_trial("fedavg", 0)
    outcome = drive(build_simulation(trial))
    final = outcome.rows[-1]
    print(f"\nReddi et al. EMNIST CR {method}: round {final['round']:g}, test accuracy {final['test_accuracy']:.4f}")
    assert outcome.status == "finished" and final["round"] == 1500
    assert final["test_accuracy"] >= 0.85 - 0.015
