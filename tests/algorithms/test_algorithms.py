"""Algorithms (fedbench/algorithms/*) against independent transcriptions of their update rules.

* FedAvg with full participation, one local full-batch step = gradient descent on the pooled objective;
* λ = 0 reductions: FedMiD ≡ FedDA ≡ FedAvg (with h = 0 every prox is the identity);
* the batched engine ≡ the per-client loop implementation (tests/loop_reference.py);
* FedMiD and FedDA (Yuan, Zaheer, Reddi, ICML 2021, as Bao et al.'s and Yuan et al.'s code run them) and Ditto
  (Li, Hu, Beirami, Smith, ICML 2021) rounds written out in numpy;
* hyperparameter validation.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fedbench
from fedbench.engine.simulate import Federation, Simulation, simulate
from helpers import client_data, full_gradient, initial_point, np_prox
from loop_reference import loop_simulate
from small_problems import small_lasso, small_lowrank


def run(problem, name, federation, seed=0, **hp):
    return simulate(problem, fedbench.make_algorithm(name, problem, **hp), federation, seed=seed,
                    eval_every=max(1, federation.rounds))




def np_subgradient(problem, w):
    lam = problem.config["lam"]
    assert problem.name == "lasso"
    g = np.zeros_like(w)
    g[: problem.feature_dim] = lam * np.sign(w[: problem.feature_dim])
    return g


# -- (a) FedAvg = gradient descent ------------------------------------------------------------------------------

@pytest.mark.parametrize("lam,subgradient", [(0.0, True), (0.05, False), (0.05, True)])
def test_fedavg_full_participation_one_full_batch_step_is_gradient_descent(lam, subgradient):
    problem = small_lasso(lam=lam)
    client_lr, server_lr, rounds = 0.05, 0.7, 6
    federation = Federation(rounds, problem.num_clients, 1, 20)
    result = run(problem, "fedavg", federation, seed=3, client_lr=client_lr, server_lr=server_lr,
                 subgradient=subgradient)
    x, y = client_data(problem)
    w = initial_point(problem, 3)
    for _ in range(rounds):
        direction = full_gradient(x, y, w)
        if subgradient:
            direction = direction + np_subgradient(problem, w)
        w = w - server_lr * client_lr * direction
    np.testing.assert_allclose(result.params.numpy(), w, rtol=1e-12, atol=1e-12)
    assert not np.allclose(w, initial_point(problem, 3))  # it moved


# -- (b) λ = 0: FedMiD ≡ FedDA ≡ FedAvg -------------------------------------------------------------------------

@pytest.mark.parametrize("server_lr", [1.0, 0.5])
def test_lambda_zero_fedmid_and_fedda_equal_fedavg(server_lr):
    problem = small_lasso(lam=0.0)
    federation = Federation(rounds=7, clients_per_round=3, local_steps=3, batch_size=5)
    hp = dict(client_lr=0.05, server_lr=server_lr)
    baseline = run(problem, "fedavg", federation, seed=1, **hp).params
    assert not torch.equal(baseline, torch.from_numpy(initial_point(problem, 1)))
    variants = [("fedmid", {"server_threshold": s}) for s in ("bao", "yuan", "none")]
    variants += [("fedda", {"offset": o}) for o in ("bao", "yuan")]
    for name, extra in variants:
        params = run(problem, name, federation, seed=1, **hp, **extra).params
        assert torch.equal(params, baseline), f"{name} {extra} differs from FedAvg at lam=0"


# -- (c) batched engine ≡ per-client loop ---------------------------------------------------------------------

LOOP_CASES = [("fedavg", {}), ("fedavg", {"subgradient": False})]
LOOP_CASES += [("fedmid", {"server_threshold": s}) for s in ("bao", "yuan", "none")]
LOOP_CASES += [("fedda", {"offset": o}) for o in ("bao", "yuan")]


@pytest.mark.parametrize("problem_name", ["lasso", "lowrank"])
@pytest.mark.parametrize("server_lr", [1.0, 0.5])
def test_batched_engine_equals_loop_reference(problem_name, server_lr):
    problem = small_lasso(lam=0.1) if problem_name == "lasso" else small_lowrank(lam=0.3)
    federation = Federation(rounds=6, clients_per_round=3, local_steps=3, batch_size=5)
    finals = {}
    for name, extra in LOOP_CASES:
        hp = dict(client_lr=0.05, server_lr=server_lr, **extra)
        batched = run(problem, name, federation, seed=2, **hp).params
        looped = loop_simulate(name, problem, federation, 2, **hp)
        np.testing.assert_allclose(batched.numpy(), looped.numpy(), rtol=0, atol=1e-10,
                                   err_msg=f"{problem_name} {name} {extra}")
        finals[(name, tuple(extra.items()))] = batched
    # the variants really differ, so the comparison above can tell them apart
    values = list(finals.values())
    for i in range(len(values)):
        for j in range(i + 1, len(values)):
            assert not torch.allclose(values[i], values[j], atol=1e-8)


# -- (d) FedMiD and FedDA rounds by hand (Yuan, Zaheer, Reddi, ICML 2021) --------------------------------------

def single_client(problem_name):
    if problem_name == "lasso":
        return small_lasso(clients=1, lam=0.3)
    return small_lowrank(clients=1, lam=0.5)


@pytest.mark.parametrize("problem_name", ["lasso", "lowrank"])
@pytest.mark.parametrize("threshold", ["bao", "yuan", "none"])
def test_fedmid_rounds_by_hand(problem_name, threshold):
    problem = single_client(problem_name)
    eta_c, eta_s, local_steps, rounds = 0.04, 0.7, 2, 3
    n = problem.config["samples_per_client"]
    result = run(problem, "fedmid", Federation(rounds, 1, local_steps, n), seed=4,
                 client_lr=eta_c, server_lr=eta_s, server_threshold=threshold)
    x, y = client_data(problem)
    w = initial_point(problem, 4)
    for _ in range(rounds):
        u = w.copy()
        for _ in range(local_steps):
            u = np_prox(problem, u - eta_c * full_gradient(x, y, u), eta_c)
        moved = w + eta_s * (u - w)
        tau = {"bao": eta_s * eta_c, "yuan": eta_s * eta_c * local_steps, "none": 0.0}[threshold]
        w = np_prox(problem, moved, tau)
    np.testing.assert_allclose(result.params.numpy(), w, rtol=0, atol=1e-11)


@pytest.mark.parametrize("problem_name", ["lasso", "lowrank"])
@pytest.mark.parametrize("offset", ["bao", "yuan"])
def test_fedda_rounds_by_hand(problem_name, offset):
    problem = single_client(problem_name)
    eta_c, eta_s, local_steps, rounds = 0.04, 0.7, 2, 3
    n = problem.config["samples_per_client"]
    sim = Simulation(problem, fedbench.make_algorithm("fedda", problem, client_lr=eta_c, server_lr=eta_s,
                                                      offset=offset), Federation(rounds, 1, local_steps, n), seed=4)
    x, y = client_data(problem)
    z = initial_point(problem, 4)
    for r in range(rounds):
        sim.run_round()
        z_k = z.copy()
        for j in range(local_steps):
            if offset == "bao":  # Bao's code, 1-indexed rounds r' = r + 1 and steps j + 1
                elapsed = eta_s * eta_c * (r + 1) * local_steps + eta_c * (j + 1)
            else:  # Yuan et al.
                elapsed = eta_s * eta_c * r * local_steps + eta_c * j
            u = np_prox(problem, z_k, elapsed)
            z_k = z_k - eta_c * full_gradient(x, y, u)
        z = z + eta_s * (z_k - z)
        server_elapsed = eta_s * eta_c * ((r + 2) if offset == "bao" else (r + 1)) * local_steps
        w = np_prox(problem, z, server_elapsed)
        np.testing.assert_allclose(sim.server["z"].numpy(), z, rtol=0, atol=1e-11, err_msg=f"z after round {r}")
        np.testing.assert_allclose(sim.server["w"].numpy(), w, rtol=0, atol=1e-11, err_msg=f"w after round {r}")
        np.testing.assert_allclose(fedbench.make_algorithm("fedda", problem).global_params(sim.server).numpy(), w,
                                   rtol=0, atol=1e-11)


def test_fedda_primal_is_sparse_and_differs_from_dual():
    problem = single_client("lasso")
    sim = Simulation(problem, fedbench.make_algorithm("fedda", problem, client_lr=0.04), Federation(2, 1, 2, 20), seed=4)
    sim.run_round()
    sim.run_round()
    assert not torch.equal(sim.server["w"], sim.server["z"])


# -- (e) Ditto ---------------------------------------------------------------------------------------------------

def test_ditto_unsampled_clients_keep_their_personal_rows():
    problem = small_lasso()
    sim = Simulation(problem, fedbench.make_algorithm("ditto", problem, client_lr=0.05),
                     Federation(rounds=5, clients_per_round=3, local_steps=2, batch_size=5), seed=0)
    draws = []
    original_draw = sim.sampler.draw_round

    def recording_draw(*args, **kwargs):
        draw = original_draw(*args, **kwargs)
        draws.append(draw.clients.clone())
        return draw

    sim.sampler.draw_round = recording_draw
    w0 = sim.server["w"].clone()
    assert torch.equal(sim.clients["v"], w0.expand(problem.num_clients, -1))  # v_k starts at w0
    for _ in range(5):
        before = sim.clients["v"].clone()
        sim.run_round()
        sampled = set(draws[-1].tolist())
        assert len(sampled) == 3
        for k in range(problem.num_clients):
            if k in sampled:
                assert not torch.equal(sim.clients["v"][k], before[k]), f"sampled client {k} did not move"
            else:
                assert torch.equal(sim.clients["v"][k], before[k]), f"unsampled client {k} changed"


@pytest.mark.parametrize("h_mode", ["prox", "subgradient"])
def test_ditto_rounds_by_hand(h_mode):
    """Ditto (Li, Hu, Beirami, Smith, ICML 2021) with a subgradient of h, as the pFedFBE paper's "pFedditto" (§1,
    §4.1): u ← u − η(∇f(u) + ∂h(u)); v ← v − η_p(∇f(v) + ∂h(v) + λ_d(v − w));
    server w ← w + η_s(u − w); with h_mode prox the ∂h term is replaced by prox_{η h} after the step."""
    problem = small_lasso(clients=1, lam=0.3)
    eta, eta_p, lam_d, eta_s, local_steps, rounds = 0.04, 0.03, 0.5, 0.7, 2, 3
    result = run(problem, "ditto", Federation(rounds, 1, local_steps, 20), seed=5, client_lr=eta,
                 personal_lr=eta_p, ditto_lambda=lam_d, server_lr=eta_s, h_mode=h_mode)
    x, y = client_data(problem)

    def step(point, direction, lr):
        if h_mode == "prox":
            return np_prox(problem, point - lr * direction, lr)
        return point - lr * (direction + np_subgradient(problem, point))

    w = initial_point(problem, 5)
    v = w.copy()
    for _ in range(rounds):
        u = w.copy()
        for _ in range(local_steps):
            u = step(u, full_gradient(x, y, u), eta)
            v = step(v, full_gradient(x, y, v) + lam_d * (v - w), eta_p)
        w = w + eta_s * (u - w)
    np.testing.assert_allclose(result.params.numpy(), w, rtol=0, atol=1e-11)
    assert result.personal is not None
    np.testing.assert_allclose(result.personal.numpy(), v[None, :], rtol=0, atol=1e-11)


def test_ditto_metrics_evaluate_the_personal_models():
    problem = small_lasso(personal_support=2)
    federation = Federation(rounds=10, clients_per_round=4, local_steps=3, batch_size=5)
    result = run(problem, "ditto", federation, seed=0, client_lr=0.05, ditto_lambda=0.2)
    assert result.personal is not None
    assert result.personal.shape == (problem.num_clients, problem.dim)
    expected = problem.evaluate(result.params, result.personal)
    global_only = problem.evaluate(result.params)
    for key, value in expected.items():
        assert result.final[key] == value, key
    # the global model's metrics under their own names, the personal models' beside them with a prefix
    assert {k: result.final[k] for k in global_only} == global_only
    assert set(expected) - set(global_only) == {f"personal_{k}" for k in ("train_mse", "l2_error", "l1_error",
                                                                            "precision", "recall", "f1", "density",
                                                                            "support_accuracy")}
    x = problem.features.view(problem.num_clients, -1, problem.dim)
    residual = torch.einsum("knd,kd->kn", x, result.personal).reshape(-1) - problem.labels
    assert result.final["personal_train_mse"] == pytest.approx(float(residual.square().mean()), rel=1e-12)
    l2 = torch.linalg.vector_norm(result.personal - problem.truth, dim=1).mean()
    assert result.final["personal_l2_error"] == pytest.approx(float(l2), rel=1e-12)
    assert result.final["personal_l2_error"] != result.final["l2_error"]
    # non-personalized methods have no personal models
    assert run(problem, "fedmid", federation, client_lr=0.05).personal is None


# -- (f) hyperparameter validation --------------------------------------------------------------------------------

def test_unknown_hyperparameter_raises_key_error():
    problem = small_lasso()
    with pytest.raises(KeyError, match="server_threshhold"):
        fedbench.make_algorithm("fedmid", problem, server_threshhold="bao")
    with pytest.raises(KeyError):
        fedbench.make_algorithm("fedavg", problem, offset="bao")  # FedDA's, not FedAvg's


@pytest.mark.parametrize("name,hp", [
    ("fedmid", {"client_lr": -1}),
    ("fedmid", {"client_lr": 0.0}),
    ("fedavg", {"server_lr": -0.5}),
    ("fedmid", {"server_threshold": "foo"}),
    ("fedda", {"offset": "foo"}),
    ("fedavg", {"subgradient": 1}),
    ("ditto", {"h_mode": "proximal"}),
    ("ditto", {"ditto_lambda": -0.1}),
    ("fedmid", {"client_lr": float("nan")}),
    ("fedmid", {"client_lr": "1e-3"}),
])
def test_out_of_range_hyperparameter_raises_value_error(name, hp):
    with pytest.raises(ValueError):
        fedbench.make_algorithm(name, small_lasso(), **hp)


def test_default_hyperparameters():
    problem = small_lasso()
    assert fedbench.make_algorithm("fedmid", problem).hp == {"client_lr": 1e-3, "server_lr": 1.0, "server_threshold": "bao"}
    assert fedbench.make_algorithm("fedda", problem).hp == {"client_lr": 1e-3, "server_lr": 1.0, "offset": "bao"}
    ditto = fedbench.make_algorithm("ditto", problem)
    assert ditto.hp["ditto_lambda"] == 0.1 and ditto.hp["personal_lr"] is None
