"""A round's communication as each algorithm's paper counts it: the floats each participating client sends
(`comm_up`) per round, counted by the engine from the algorithm's declared uploads (`Algorithm.uploads`) and
their shapes (and without a transform on the links, bits: those floats at their dtype's width). Each entry says what
the paper's algorithm sends, where."""
from __future__ import annotations

import pytest
import torch

import fedbench
from fedbench.algorithms import ALGORITHMS
from fedbench.contract import IncompatibleError
from fedbench.engine.simulate import Federation, Simulation
from small_problems import small_lasso

ROUNDS, CLIENTS, STEPS, BATCH = 3, 3, 4, 8


def model(problem) -> int:
    return problem.dim


def scores(problem) -> int:  # the scores of a round's minibatches: positives and negatives of every local step
    return STEPS * BATCH


# algorithm -> (floats one client sends per round, what the paper sends)
SENT = {
    "fedavg": (model, "the local model (McMahan et al. 2017, Algorithm 1)"),
    "fedmid": (model, "the local model (Yuan, Zaheer, Reddi 2021, Algorithm 2)"),
    "fedda": (model, "the local dual state z (Yuan et al. 2021, Algorithm 3)"),
    "fast_fedda": (lambda p: 2 * p.dim, "g and w̃ (Bao, Crawshaw, Luo, Liu 2022, Algorithm 1)"),
    "c_fedda": (model, "the dual average g (Bao et al. 2022, Algorithm 2)"),
    "mc_fedda": (model, "the dual average g, as C-FedDA (Bao et al. 2022, Algorithm 3)"),
    "fedprox": (model, "the local model (Li et al. 2020, Algorithm 2)"),
    "scaffold": (lambda p: 2 * p.dim, "Δy_i and Δc_i (Karimireddy et al. 2020, Algorithm 1 line 13)"),
    "ditto": (model, "the local copy of the global model (Li et al. 2021, Algorithm 1)"),
    "pfedme": (model, "the local model w_{i,R} (T. Dinh et al. 2020, Algorithm 1)"),
    "pfedfbe": (model, "the local model (pFedFBE, anonymous ICLR submission, Algorithm 1)"),
    "per_fedavg": (model, "the local model (Fallah, Mokhtari, Ozdaglar 2020, Algorithm 1)"),
    "local_sgd_ce": (model, "the local model (Guo et al. 2023, FeDXL §4's Local SGD baseline)"),
    "local_pair": (model, "the local model; momentum stays local (Guo et al. 2023's released code)"),
    "centralized": (model, "the model of the one client (Guo et al. 2023's code at world size 1)"),
    "fedxl1": (lambda p: p.dim + scores(p), "the model and the round's prediction scores (Guo et al. 2023, Alg. 1)"),
    "fedxl2": (lambda p: 2 * p.dim + scores(p) + STEPS * BATCH // 2,
               "the model, its momentum G, the scores and the u of the positives (Guo et al. 2023, Algorithm 2)"),
    "codasca": (lambda p: 2 * p.dim + 6,
                "v = (w, a, b), α and Δc_i = (w, a, b, α) (Yuan et al. 2021, CODASCA, Algorithm 1)"),
    "lsgd_pfl": (lambda p: p.dim_w, "the local copy of w every τ steps (Hanzely et al. 2023, Algorithm 1)"),
    "acd_pfl": (lambda p: p.dim_w, "∇_w f_m at a w-update (Hanzely et al. 2023, Algorithm 2)"),
    "ascd_pfl": (lambda p: p.dim_w, "∇_w f_{m,j} at a w-update (Hanzely et al. 2023, Algorithm 5)"),
    "scd_pfl": (lambda p: p.dim_w, "∇_w f_{m,j} at a w-update (Hanzely et al. 2023, Algorithm 6)"),
    "asvrcd_pfl": (lambda p: p.dim_w, "the w-gradient difference at ζ = w, or ∇_w f_m(v) at a refresh "
                                      "(Hanzely et al. 2023, Algorithm 4)"),
    "svrcd_pfl": (lambda p: p.dim_w, "as ASVRCD-PFL, without acceleration (Hanzely et al. 2023, Algorithm 7)"),
    "l2sgd_plus": (model, "x_m at an averaging step (Hanzely & Richtárik 2020, Algorithm 2)"),
}


def candidates():
    yield small_lasso()
    yield fedbench.make_problem("pauc", seed=0, clients=4, positives_per_client=10, negatives_per_client=50,
                                features=6, test_size=60, val_size=0)
    yield fedbench.make_problem("pauc", seed=0, clients=4, positives_per_client=10, negatives_per_client=50,
                                features=6, test_size=60, val_size=0, pooled=True)
    yield fedbench.make_problem("pauc", seed=0, preset="guo2023_noisy_auc", clients=4, positives_per_client=10,
                                negatives_per_client=50, features=6, test_size=60, val_size=0)
    yield fedbench.make_problem("pfl_synthetic", preset="s1", sigma_h=1.0)
    yield fedbench.make_problem("pfl_synthetic", preset="s1", sigma_h=1.0, objective="mx2")


HYPERPARAMETERS = {"per_fedavg": {"inner_batch": BATCH, "outer_batch": BATCH, "hessian_batch": BATCH}}


def runnable(name: str):
    for problem in candidates():
        try:
            return problem, ALGORITHMS[name](problem, **HYPERPARAMETERS.get(name, {}))
        except IncompatibleError:
            continue
    raise AssertionError(f"{name}: no small problem it runs on")


def test_every_algorithm_has_its_papers_count():
    assert set(SENT) == set(ALGORITHMS)


@pytest.mark.parametrize("name", sorted(SENT))
def test_a_round_sends_what_the_paper_counts(name):
    problem, algorithm = runnable(name)
    clients = problem.num_clients if algorithm.participation == "all" else min(CLIENTS, problem.num_clients)
    sim = Simulation(problem, algorithm, Federation(ROUNDS, clients, STEPS, BATCH), seed=0)
    for _ in range(ROUNDS):
        sim.run_round()
    floats, _ = SENT[name]
    assert sim.comm_up == ROUNDS * clients * floats(problem), SENT[name][1]
    width = torch.finfo(problem.dtype).bits  # no transform: each float at its dtype's width
    assert (sim.comm_up_bits, sim.comm_down_bits) == (width * sim.comm_up, width * sim.comm_down)
