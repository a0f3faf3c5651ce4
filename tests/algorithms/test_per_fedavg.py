"""Per-FedAvg's local step (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020: Algorithm 1 with the estimate of eq. (8), and
the first-order (FO) and Hessian-free (HF) versions of §5 and App. H): on least squares with full batches the exact
and HF directions equal the closed form (I − αA)(A(w − α(Aw − c)) − c) and FO equals A(w − α(Aw − c)) − c
(A = XᵀX/n, c = Xᵀy/n per client); with α = 0 every variant is FedAvg; on a non-quadratic loss (logistic) HF tends
to the exact HVP direction with an O(δ²) error; D, D′, D″ are three independent draws reproducible by seed."""
from __future__ import annotations

import pytest
import torch

from fedbench.algorithms import ALGORITHMS
from fedbench.engine.federation import RoundSampler
from fedbench.engine.simulate import Federation, simulate
from fedbench.oracle import Batches
from fedbench.problems import make_problem
from fedbench.rng import generator

CLIENTS, SAMPLES = 3, 20
ALPHA, BETA = 0.05, 0.1


def quadratic_problem():
    return make_problem("lasso", seed=0, clients=CLIENTS, samples_per_client=SAMPLES, dim=8, support=4, lam=0.0)


def full_batches(problem, variant, **hp):
    """One full-batch round of one local step: every declared batch holds all of a client's samples."""
    sizes = dict(inner_batch=SAMPLES, outer_batch=SAMPLES, hessian_batch=SAMPLES)
    return ALGORITHMS["per_fedavg"](problem, variant=variant, alpha=ALPHA, client_lr=BETA, **sizes, **hp)


def closed_form_round(problem, w, hessian_term: bool):
    """The server model after one round of one full-batch local step per client, from eq. (5) in closed form."""
    updated = []
    for k in range(CLIENTS):
        x = problem.features[k * SAMPLES:(k + 1) * SAMPLES]
        y = problem.labels[k * SAMPLES:(k + 1) * SAMPLES]
        a, c = x.T @ x / SAMPLES, x.T @ y / SAMPLES
        adapted = w - ALPHA * (a @ w - c)
        direction = a @ adapted - c
        if hessian_term:
            direction = direction - ALPHA * a @ direction
        updated.append(w - BETA * direction)
    return torch.stack(updated).mean(0)


@pytest.mark.parametrize("variant, hessian_term", [("exact", True), ("hf", True), ("fo", False)])
def test_full_batch_round_equals_the_closed_form_maml_step(variant, hessian_term):
    problem = quadratic_problem()
    federation = Federation(rounds=1, clients_per_round=CLIENTS, local_steps=1, batch_size=SAMPLES)
    result = simulate(problem, full_batches(problem, variant), federation, seed=0, eval_every=1)
    w0 = problem.init_params(generator(0, "init"))
    expected = closed_form_round(problem, w0, hessian_term)
    # HF is exact on a quadratic up to the rounding of the central difference (a Hessian ρ-Lipschitz with ρ = 0:
    # App. H's error term ρδ vanishes)
    assert torch.allclose(result.params, expected, rtol=1e-10 if variant != "hf" else 1e-7, atol=1e-12)


def test_zero_alpha_makes_every_variant_fedavg():
    problem = quadratic_problem()
    federation = Federation(rounds=3, clients_per_round=CLIENTS, local_steps=2, batch_size=SAMPLES)
    fedavg = simulate(problem, ALGORITHMS["fedavg"](problem, client_lr=BETA, subgradient=False), federation, seed=1)
    for variant in ("exact", "fo", "hf"):
        per = ALGORITHMS["per_fedavg"](problem, variant=variant, alpha=0.0, client_lr=BETA, inner_batch=SAMPLES,
                                       outer_batch=SAMPLES, hessian_batch=SAMPLES)
        assert torch.allclose(simulate(problem, per, federation, seed=1).params, fedavg.params, rtol=1e-12)


def logistic_batches(algorithm, seed=0):
    """Minibatches of the binary logistic loss f' of the S1 data of Hanzely, Zhao, Kolar (TMLR 2023, §5.1; 20
    clients, d = 15): a loss with a non-zero third derivative. The direction reads only the oracles, so the
    algorithm may be built on another problem."""
    sampler = RoundSampler(LOGISTIC, Federation(1, 0, 1, 1), seed, algorithm.minibatches(algorithm.hp), {"D": 7, "D1": 9, "D2": 11})
    clients, rows = sampler.draw(1, everyone=True)
    return sampler.step_batches(rows, 0), rows


LOGISTIC = make_problem("pfl_synthetic", preset="s1", sigma_h=1.0)


def per_fedavg(**hp):
    return ALGORITHMS["per_fedavg"](quadratic_problem(), **hp)


def test_hf_tends_to_the_exact_direction_with_second_order_error():
    w = 0.5 * torch.randn(LOGISTIC.num_clients, LOGISTIC.dim, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(3))
    exact = per_fedavg(variant="exact", alpha=0.5)
    batches, _ = logistic_batches(exact)
    reference = exact.direction(w, batches, exact.hp)
    errors = []
    for delta in (1e-1, 5e-2, 2.5e-2):
        hf = per_fedavg(variant="hf", alpha=0.5, delta=delta)
        errors.append(float((hf.direction(w, batches, hf.hp) - reference).norm() / reference.norm()))
    assert errors[0] < 1e-2
    for coarse, fine in zip(errors, errors[1:]):
        assert 3.5 < coarse / fine < 4.5  # halving δ quarters the error: O(δ²)


def test_three_independent_batches_reproducible_by_seed():
    algorithm = per_fedavg(variant="hf")
    _, rows = logistic_batches(algorithm, seed=5)
    _, again = logistic_batches(algorithm, seed=5)
    assert set(rows) == {"D", "D1", "D2"} and [r.shape[-1] for r in rows.values()] == [7, 9, 11]
    assert all(torch.equal(rows[k], again[k]) for k in rows)
    assert not torch.equal(rows["D"][..., :7], rows["D1"][..., :7])
    shared = per_fedavg(variant="hf", hessian_batch_as_outer=True)
    batches, _ = logistic_batches(shared)
    assert isinstance(batches, Batches) and batches.D2 is batches.D1
    assert "hvp" in ALGORITHMS["per_fedavg"].requirements({**{p.name: p.default for p in algorithm.hparams},
                                                             "variant": "exact"})
