"""Paper-size runs of pFedFBE (the pFedFBE paper, ICLR 2023 submission, §4.1–4.3: its claims on Figs. 1–6) from the
shipped recipes in recipes/papers/ (minutes): run with `pytest -m slow -s`, which prints every number asserted on.

Each baseline's client step is picked as the paper does (only that is tuned): the recipe's grid is run on a
tuning seed (100) and the step with the lowest final training objective is kept; pFedFBE keeps the paper's
η = 0.0005, λ = 2000. Then every method runs on seeds 0–2 and the final metrics are averaged. The assertions
state what holds here (the note of issue 13 gives the tables); where the paper's claim does not reproduce, the
test compares what it measures with the deviation declared in sweeps/deviations.py (`deviation_holds`), which the
gallery page lists.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from helpers import deviation_holds
from sweeps.driving import build_simulation, drive
from sweeps.recipe import load

pytestmark = pytest.mark.slow
PAPERS = Path(__file__).resolve().parents[2] / "recipes" / "papers"
TUNING_SEED, SEEDS = 100, (0, 1, 2)


def final_row(recipe: str, algorithm: str, seed: int, lr: float | None = None) -> dict:
    fixed = {f"algorithms.{algorithm}.client_lr": lr} if lr is not None else {}
    outcome = drive(build_simulation(load(PAPERS / recipe).single_trial(algorithm, seed, fixed=fixed), "cpu"))
    return {"status": outcome.status, **outcome.rows[-1]}


@cache
def tuned(recipe: str) -> dict[str, float | None]:
    """Each algorithm's client step: the grid's best final objective on the tuning seed (None: fixed)."""
    loaded = load(PAPERS / recipe)
    chosen = {}
    for algorithm, grid in loaded.algorithms.items():
        steps = grid["client_lr"]
        if len(steps) == 1:
            chosen[algorithm] = None
            continue
        finals = {lr: final_row(recipe, algorithm, TUNING_SEED, lr) for lr in steps}
        finite = {lr: row["objective"] for lr, row in finals.items() if row["status"] == "finished"}
        chosen[algorithm] = min(finite, key=finite.get)
        print(f"\n{recipe} {algorithm}: objective by step {({lr: round(v, 4) for lr, v in finite.items()})} "
              f"-> {chosen[algorithm]}")
    return chosen


@cache
def results(recipe: str) -> dict[str, dict[str, float]]:
    """Per algorithm, every final metric averaged over the seeds (at its tuned step)."""
    means = {}
    for algorithm, lr in tuned(recipe).items():
        rows = [final_row(recipe, algorithm, seed, lr) for seed in SEEDS]
        assert all(row["status"] == "finished" for row in rows), (algorithm, [row["status"] for row in rows])
        means[algorithm] = {key: float(np.mean([row[key] for row in rows])) for key in rows[0] if key != "status"}
    return means


def show(recipe: str, metrics: list[str]) -> dict[str, dict[str, float]]:
    table = results(recipe)
    print(f"\n{recipe}, mean of seeds {SEEDS}:")
    for algorithm, row in table.items():
        values = "  ".join(f"{m} {row.get(m, row.get(m.removeprefix('personal_'), float('nan'))):.4f}" for m in metrics)
        print(f"  {algorithm:8s} {values}")
    return table


def own(row: dict, metric: str) -> float:
    """A personal metric, or the global one for a method without personal models (whose personalized parameter the
    pFedFBE paper sets to the global one, §4.1)."""
    return row.get(metric, row[metric.removeprefix("personal_")])


def test_lasso_setting_one_global_parameters():
    table = show("pfedfbe_lasso1.yaml", ["precision", "recall", "f1", "density", "support_accuracy", "test_mse",
                                         "objective"])
    # With the printed truth (§4.1: 992 ones of 1024) support metrics cannot separate the methods (measured F1
    # 0.989–0.996, recall 1 for all).
    assert all(row["f1"] >= 0.98 and row["recall"] >= 0.99 for row in table.values())
    # pFedFBE ≈ Fedmirror on the support (the paper's claim; F1 0.990 vs 0.994). FedMiD's tuned step (1e-3, twice
    # pFedFBE's 5e-4) trains further in 200 rounds (objective 97.1 vs 106.5); at pFedFBE's step FedMiD reaches 106.2.
    assert abs(table["pfedfbe"]["f1"] - table["fedmid"]["f1"]) <= 0.01
    assert table["pfedfbe"]["objective"] <= 1.15 * table["fedmid"]["objective"]
    # "FedDual clearly worse than Fedmirror" does not reproduce with a tuned step (a declared deviation); their
    # objectives are equal to 0.1%.
    deviation_holds("pfedfbe-lasso1-feddual", {"FedDA − FedMiD, F1": table["fedda"]["f1"] - table["fedmid"]["f1"]})
    assert table["fedda"]["objective"] == pytest.approx(table["fedmid"]["objective"], rel=0.01)


def test_lasso_setting_two_personalized_parameters():
    table = show("pfedfbe_lasso2.yaml", ["personal_precision", "personal_recall", "personal_f1", "personal_density",
                                         "personal_support_accuracy", "personal_train_mse", "objective"])
    fbe, ditto, fedmid = table["pfedfbe"], table["ditto"], table["fedmid"]
    # Ditto: recall near 1 and a much lower precision (it marks zeros as non-zeros), as the paper says
    # (measured: R 0.96, P 0.05).
    assert ditto["personal_recall"] >= 0.9 and ditto["personal_precision"] <= 0.1
    # The paper's P = R = 1 for pFedFBE does not reproduce (nor in a separate NumPy run of setting (II)): a declared
    # deviation.
    deviation_holds("pfedfbe-lasso2-personal-support", {"pFedFBE's personal precision": fbe["personal_precision"],
                                                        "pFedFBE's personal recall": fbe["personal_recall"]})
    # What holds of "lowest train loss": its personal models fit their clients better than the global FedMiD model
    # (measured 2.00 vs 2.21), though Ditto's and pFedMe's personal models fit better still (0.51, 1.43).
    assert fbe["personal_train_mse"] < own(fedmid, "personal_train_mse")


def test_matrix_completion_personalized_parameters():
    table = show("pfedfbe_matrix.yaml", ["personal_rank", "personal_fro_error", "personal_train_mse", "objective"])
    fbe = table["pfedfbe"]
    # The paper: only pFedFBE's personalized matrices reach the true rank 5, with the lowest recovery error. Not
    # reproduced (a declared deviation): after 200 rounds no method is near rank 5 (singular values above 0.01), and
    # FedAvg/FedMiD/FedProx at their tuned step (1e-3) recover the truths better (Frobenius 0.47) than pFedFBE at
    # the paper's 5e-4 (0.65).
    ranks = {name: own(row, "personal_rank") for name, row in table.items()}
    deviation_holds("pfedfbe-matrix-rank", {"pFedFBE's personal rank": ranks["pfedfbe"],
                                            "the lowest rank of any method": min(ranks.values())})
    # What holds: pFedFBE's personal models are of lower rank than the other personalized methods' (15.7 against
    # pFedMe 21.4, Ditto 20.8, pFedprox 17.1) and recover the truths far better than Ditto's (0.65 vs 1.78).
    assert fbe["personal_rank"] < min(table[name]["personal_rank"] for name in ("pfedme", "ditto", "fedprox"))
    assert fbe["personal_fro_error"] < table["ditto"]["personal_fro_error"]


def test_digits_personalized_accuracy_above_global():
    if not (Path(__import__("os").environ.get("FEDBENCH_DATA", "/nonexistent")) / "femnist").is_dir():
        pytest.skip("needs $FEDBENCH_DATA/femnist")
    table = show("pfedfbe_digits.yaml", ["test_accuracy", "personal_test_accuracy", "train_loss", "objective"])
    for name in ("pfedfbe", "pfedme", "ditto"):  # 2-label clients: a personal model beats the global one
        assert table[name]["personal_test_accuracy"] > table[name]["test_accuracy"], name
    # The paper's "pFedFBE best" does not reproduce here (a declared deviation): with λ = 200 its personal step of
    # 1/λ barely moves the global model (measured 0.749 vs 0.741), far below Ditto's and pFedMe's personal models.
    personal = {name: table[name]["personal_test_accuracy"] for name in ("pfedfbe", "ditto", "pfedme")}
    deviation_holds("pfedfbe-digits-best", {"pFedFBE's personal test accuracy": personal["pfedfbe"],
                                            "Ditto's": personal["ditto"], "pFedMe's": personal["pfedme"]})
    # Why: at the paper's η = 0.005 its global model trails the baselines tuned to η = 0.02 (0.741 vs 0.877).
    others = [row for name, row in table.items() if name != "pfedfbe"]
    assert table["pfedfbe"]["test_accuracy"] < min(row["test_accuracy"] for row in others)
