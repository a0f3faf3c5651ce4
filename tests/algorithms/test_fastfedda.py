"""Fast-FedDA, C-FedDA, MC-FedDA (Bao, Crawshaw, Luo, Liu, ICML 2022, §2.1 and §3.3–3.4, Algorithms 1–3) against
their definitions:

* the closed-form Prox_t / CProx_r equal a numeric argmin of the stated objectives (ℓ1 and nuclear),
  and the exact ℓ1 ball-constrained prox equals a numeric constrained argmin;
* with α ≡ 1 and one client, Fast-FedDA equals a NumPy transcription of Algorithm 1, step for step;
* λ = 0, μ = 0: Fast-FedDA and C-FedDA (code γ) reduce to FedAvg with client step 1/γ (the prox is then
  w₀ − z/γ, a gradient step of 1/γ on the accumulated gradients);
* MC-FedDA with one stage and an infinite radius equals C-FedDA; stages restart at the last iterate;
* communication: Fast-FedDA uploads 2p floats per client, C-FedDA p.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

import fedbench
from fedbench.algorithms.dual_averaging import cumulative_alpha, dual_averaging_prox
from fedbench.engine.simulate import Federation, simulate
from fedbench.prox import L1, Nuclear
from helpers import client_data, full_gradient, initial_point, np_prox
from small_problems import small_lasso, small_lowrank


def run(problem, name, federation, seed=0, eval_every=None, **hp):
    return simulate(problem, fedbench.make_algorithm(name, problem, **hp), federation, seed=seed,
                    eval_every=eval_every or max(1, federation.rounds))


# -- the prox operators ------------------------------------------------------------------------------------------

def numeric_l1_min(linear, quadratic, tau, anchor=None, radius=None):
    """argmin_w ⟨w, linear⟩ + quadratic‖w‖²/2 + tau‖w‖₁ [s.t. ‖w − anchor‖₁ ≤ radius], by SLSQP on the
    split variables w = p − q, w − anchor = s − t (all ≥ 0), which make it a smooth constrained problem."""
    d = len(linear)

    def parts(x):
        return x[:d], x[d:2 * d], x[2 * d:3 * d], x[3 * d:]

    def fun(x):
        p, q, s, t = parts(x)
        w = p - q
        return linear @ w + quadratic * w @ w / 2 + tau * (p + q).sum()

    constraints = []
    if radius is not None:
        constraints = [{"type": "eq", "fun": lambda x: parts(x)[0] - parts(x)[1] - anchor - parts(x)[2] + parts(x)[3]},
                       {"type": "ineq", "fun": lambda x: radius - parts(x)[2].sum() - parts(x)[3].sum()}]
    best = None
    for start in range(4):
        x0 = np.random.default_rng(start).uniform(0, 1, 4 * d)
        res = minimize(fun, x0, method="SLSQP", bounds=[(0, None)] * (4 * d), constraints=constraints,
                       options={"ftol": 1e-15, "maxiter": 2000})
        if best is None or res.fun < best.fun:
            best = res
    p, q, _, _ = parts(best.x)
    return p - q


def numeric_nuclear_min(linear, quadratic, tau):
    """argmin_W ⟨W, linear⟩ + quadratic‖W‖²/2 + tau‖W‖_nuc through W = ABᵀ, ‖W‖_nuc = min ½(‖A‖² + ‖B‖²)."""
    p1, p2 = linear.shape
    k = min(p1, p2)

    def fun(x):
        a, b = x[: p1 * k].reshape(p1, k), x[p1 * k:].reshape(p2, k)
        w = a @ b.T
        gw = linear + quadratic * w
        value = np.sum(linear * w) + quadratic * np.sum(w * w) / 2 + tau * (np.sum(a * a) + np.sum(b * b)) / 2
        return value, np.r_[(gw @ b + tau * a).ravel(), (gw.T @ a + tau * b).ravel()]

    best = None
    for start in range(6):
        x0 = np.random.default_rng(start).standard_normal((p1 + p2) * k)
        res = minimize(fun, x0, jac=True, method="L-BFGS-B", options={"ftol": 1e-16, "gtol": 1e-12, "maxiter": 20000})
        if best is None or res.fun < best.fun:
            best = res
    a, b = best.x[: p1 * k].reshape(p1, k), best.x[p1 * k:].reshape(p2, k)
    return a @ b.T


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dual_averaging_prox_l1_is_the_argmin_of_its_definition(seed):
    """Prox_t(z) = argmin ⟨w, z − γw₀⟩ + (μA/2 + γ)‖w‖²/2 + A·λ‖w‖₁ (§2.1)."""
    rng = np.random.default_rng(seed)
    z, w0 = rng.standard_normal(6) * 3, rng.standard_normal(6)
    mu, gamma, total, lam = 0.3, 0.8, 4.0, 0.5
    got = dual_averaging_prox(L1(lam, 6), torch.tensor(z), torch.tensor(w0), total, mu, gamma).numpy()
    want = numeric_l1_min(z - gamma * w0, mu * total / 2 + gamma, total * lam)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert (got == 0).any() and (got != 0).any()  # the threshold is active on some coordinates only


@pytest.mark.parametrize("seed", [0, 1])
def test_dual_averaging_prox_nuclear_is_the_argmin_of_its_definition(seed):
    rng = np.random.default_rng(seed)
    z, w0 = rng.standard_normal((4, 3)) * 3, rng.standard_normal((4, 3))
    mu, gamma, total, lam = 0.3, 0.8, 4.0, 0.4
    got = dual_averaging_prox(Nuclear(lam, (4, 3)), torch.tensor(z.ravel()), torch.tensor(w0.ravel()), total, mu,
                              gamma).numpy().reshape(4, 3)
    want = numeric_nuclear_min(z - gamma * w0, mu * total / 2 + gamma, total * lam)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.linalg.matrix_rank(got, tol=1e-8) < 3  # some singular values were cut


def cprox(algorithm, g, wt, w0, round_index, local_steps):
    """The algorithm's CProx_r(g − μE w̃/2) of round r, at one run's values (its Python hyperparameters)."""
    server = {"wt": torch.tensor(wt), "anchor": torch.tensor(w0)}
    terms = algorithm.round_prox(server, round_index, local_steps, algorithm.hp)
    return algorithm.cprox(torch.tensor(g), terms, round_index, local_steps, algorithm.hp).numpy()


def test_c_fedda_prox_is_cprox_of_the_paper():
    """CProx_r(z) = argmin ⟨w, z − γEw₀⟩ + (μA_r/2 + γ)E‖w‖²/2 + A_r E λ‖w‖₁: C-FedDA's prox of z/E (paper γ)."""
    rng = np.random.default_rng(3)
    g, wt, w0 = rng.standard_normal(5) * 4, rng.standard_normal(5), rng.standard_normal(5)
    mu, gamma, lam, local_steps, r = 0.2, 0.7, 0.3, 3, 2
    problem = small_lasso(dim=5, support=2, lam=lam)
    algorithm = fedbench.make_algorithm("c_fedda", problem, mu=mu, gamma=gamma, gamma_convention="paper")
    got = cprox(algorithm, g, wt, w0, r, local_steps)
    total = r + 1.0  # A_r with α ≡ 1
    z = g - mu * local_steps * wt / 2
    want = numeric_l1_min(z - gamma * local_steps * w0, (mu * total / 2 + gamma) * local_steps,
                          total * local_steps * lam)
    np.testing.assert_allclose(got, want, atol=1e-6)
    code = fedbench.make_algorithm("c_fedda", problem, mu=mu, gamma=gamma * local_steps, gamma_convention="code")
    np.testing.assert_allclose(cprox(code, g, wt, w0, r, local_steps), got, rtol=1e-12,
                               atol=1e-12)  # γ_code = γ_paper · E (the released code's per-step γ)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_l1_ball_prox_is_the_constrained_argmin(seed):
    rng = np.random.default_rng(seed)
    v, anchor = rng.standard_normal(6) * 3, rng.standard_normal(6)
    step, lam = 0.7, 0.5
    free = np.sign(v) * np.maximum(np.abs(v) - step * lam, 0)
    radius = 0.5 * np.abs(free - anchor).sum()  # binding
    reg = L1(lam, 6)
    got = reg.prox_in_ball(torch.tensor(v), step, torch.tensor(anchor), radius, exact=True).numpy()
    want = numeric_l1_min(-v, 1.0, step * lam, anchor, radius)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert abs(np.abs(got - anchor).sum() - radius) < 1e-8
    sequential = reg.prox_in_ball(torch.tensor(v), step, torch.tensor(anchor), radius).numpy()
    assert np.abs(sequential - anchor).sum() <= radius + 1e-9  # feasible, though only approximately optimal
    loose = 10 * np.abs(free - anchor).sum()  # not binding: both are the plain prox
    for exact in (False, True):
        np.testing.assert_allclose(reg.prox_in_ball(torch.tensor(v), step, torch.tensor(anchor), loose, exact).numpy(),
                                   free, atol=1e-12)


def test_sequential_nuclear_ball_prox_projects_around_the_anchor():
    rng = np.random.default_rng(4)
    v, anchor = rng.standard_normal(12) * 3, rng.standard_normal(12)
    reg = Nuclear(0.2, (4, 3))
    free = reg.prox(torch.tensor(v), 1.0)
    radius = 0.3 * float(reg.norm(free - torch.tensor(anchor)))
    got = reg.prox_in_ball(torch.tensor(v), 1.0, torch.tensor(anchor), radius)
    assert float(reg.norm(got - torch.tensor(anchor))) == pytest.approx(radius, rel=1e-9)
    np.testing.assert_allclose(got - torch.tensor(anchor), reg.project_norm_ball(free - torch.tensor(anchor), radius))


def test_quadratic_weights_cumulative_sum():
    for a in (0.0, 1.5, 4.0):
        for t in (0, 1, 7, 30):
            assert cumulative_alpha(t, "quadratic", a) == pytest.approx(sum((i + a) ** 2 for i in range(t + 1)))
    assert cumulative_alpha(9, "const", 3.0) == 10


# -- Fast-FedDA step for step ------------------------------------------------------------------------------------

def numpy_fast_fedda(problem, w0, rounds, local_steps, mu, gamma, order, compat):
    """§2.1, Algorithm 1 with α ≡ 1, one client and full-batch gradients, written out."""
    x, y = client_data(problem)

    def prox(z, n):
        c = mu * n / 2 + gamma
        return np_prox(problem, (gamma * w0 - z) / c, n / c)

    g, wt, w = np.zeros_like(w0), w0.copy(), w0.copy()
    for r in range(rounds):
        gk, wtk, u = g.copy(), wt.copy(), w.copy()
        for j in range(local_steps):
            n = r * local_steps + j + 1
            if order == "prox_then_grad":
                u = prox(gk - mu * wtk / 2, n)
                gk = gk + full_gradient(x, y, u)
                wtk = wtk + u
                continue
            gk = gk + full_gradient(x, y, u)
            if j < local_steps - 1 or compat:
                u = prox(gk - mu * wtk / 2, n)
                wtk = wtk + u
        g, wt = gk, wtk
        w = prox(g - mu * wt / 2, (r + 1) * local_steps)
        wt = wt + w
    return w


@pytest.mark.parametrize("order,compat", [("grad_then_prox", True), ("grad_then_prox", False),
                                          ("prox_then_grad", True)])
@pytest.mark.parametrize("make", [small_lasso, small_lowrank])
def test_fast_fedda_one_client_matches_numpy_transcription(make, order, compat):
    problem = make(clients=1)
    n = int(problem.client_sizes[0])
    mu, gamma, rounds, local_steps = 0.1, 3.0, 6, 3
    result = run(problem, "fast_fedda", Federation(rounds, 1, local_steps, n), seed=2, mu=mu, gamma=gamma,
                 local_order=order, reference_compat=compat)
    want = numpy_fast_fedda(problem, initial_point(problem, 2), rounds, local_steps, mu, gamma, order, compat)
    np.testing.assert_allclose(result.params.numpy(), want, rtol=1e-9, atol=1e-9)
    assert not np.allclose(want, initial_point(problem, 2))


def numpy_c_fedda(problem, w0, rounds, local_steps, mu, gamma_code, order):
    """§3.3, Algorithm 2 with α ≡ 1, the code's γ (paper γ = γ_code / E), one client, full batch."""
    x, y = client_data(problem)
    gamma = gamma_code / local_steps

    def cprox(g, wt, total):
        c = mu * total / 2 + gamma
        return np_prox(problem, (gamma * w0 + mu * wt / 2 - g / local_steps) / c, total / c)

    g, wt, w = np.zeros_like(w0), w0.copy(), w0.copy()
    for r in range(rounds):
        gk, u = g.copy(), w.copy()
        for j in range(local_steps):
            if order == "prox_then_grad":
                u = cprox(gk, wt, r + 1)
                gk = gk + full_gradient(x, y, u)
            else:
                gk = gk + full_gradient(x, y, u)
                if j < local_steps - 1:
                    u = cprox(gk, wt, r + 1)
        g = gk
        w = cprox(g, wt, r + 1)
        wt = wt + w
    return w


@pytest.mark.parametrize("order", ["grad_then_prox", "prox_then_grad"])
@pytest.mark.parametrize("make", [small_lasso, small_lowrank])
def test_c_fedda_one_client_matches_numpy_transcription(make, order):
    problem = make(clients=1)
    n = int(problem.client_sizes[0])
    result = run(problem, "c_fedda", Federation(6, 1, 3, n), seed=2, mu=0.1, gamma=9.0, local_order=order)
    want = numpy_c_fedda(problem, initial_point(problem, 2), 6, 3, 0.1, 9.0, order)
    np.testing.assert_allclose(result.params.numpy(), want, rtol=1e-9, atol=1e-9)


# -- reductions ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,gamma_key", [("fast_fedda", {}), ("c_fedda", {"gamma_convention": "code"})])
def test_lambda_and_mu_zero_reduce_to_fedavg_with_step_one_over_gamma(name, gamma_key):
    problem = small_lasso(lam=0.0)
    federation = Federation(rounds=6, clients_per_round=3, local_steps=4, batch_size=5)
    gamma = 20.0
    hp = dict(mu=0.0, gamma=gamma, **gamma_key)
    if name == "fast_fedda":
        hp["reference_compat"] = False  # the released code's extra iterate only touches w̃, which μ = 0 ignores
    ours = run(problem, name, federation, seed=5, eval_every=2, **hp)
    fedavg = run(problem, "fedavg", federation, seed=5, eval_every=2, client_lr=1 / gamma, server_lr=1.0,
                 subgradient=False)
    np.testing.assert_allclose(ours.params.numpy(), fedavg.params.numpy(), rtol=1e-10, atol=1e-10)
    for a, b in zip(ours.rows, fedavg.rows):
        assert a["objective"] == pytest.approx(b["objective"], rel=1e-10)


def test_mc_fedda_with_one_unbounded_stage_is_c_fedda():
    problem = small_lasso()
    federation = Federation(rounds=8, clients_per_round=3, local_steps=3, batch_size=5)
    common = dict(mu=0.1, gamma=30.0)
    c = run(problem, "c_fedda", federation, seed=1, eval_every=2, **common)
    mc = run(problem, "mc_fedda", federation, seed=1, eval_every=2, stage_rounds=[8], stage_lams=[0.05],
             stage_radii=[math.inf], **common)
    assert c.rows == mc.rows
    np.testing.assert_array_equal(c.params.numpy(), mc.params.numpy())


def test_mc_fedda_restarts_each_stage_at_the_last_iterate():
    """Stage 2 of MC-FedDA = C-FedDA with λ₂ started (anchor, w̃, w) from stage 1's last iterate, g = 0,
    and the round counter back at 0."""
    problem = small_lasso()
    algorithm = fedbench.make_algorithm("mc_fedda", problem, mu=0.1, gamma=30.0, stage_rounds=[3, 4],
                                        stage_lams=[0.2, 0.05], stage_radii=[50.0, 20.0])
    from fedbench.engine.simulate import Simulation

    sim = Simulation(problem, algorithm, Federation(5, 3, 2, 5), seed=0)
    for _ in range(3):
        sim.run_round()
    server = sim.server
    torch.testing.assert_close(server["anchor"], server["w"])
    torch.testing.assert_close(server["wt"], server["w"])
    assert not server["g"].any()
    hp = algorithm.hp
    assert algorithm.stage_round(3, hp) == 0 and algorithm.stage_regularizer(3, hp).lam == 0.05
    assert algorithm.stage_radius(3, hp) == 20.0 and algorithm.stage_radius(2, hp) == 50.0
    sim.run_round()
    assert float(problem.regularizer.norm(sim.server["w"] - server["anchor"])) <= 20.0 + 1e-9


def test_mc_fedda_refuses_stage_lists_of_different_lengths():
    with pytest.raises(ValueError, match="one entry per stage"):
        fedbench.make_algorithm("mc_fedda", small_lasso(), stage_rounds=[5, 5], stage_lams=[0.1], stage_radii=[1, 2])


@pytest.mark.parametrize("name,floats_up", [("fast_fedda", 2), ("c_fedda", 1), ("mc_fedda", 1), ("fedda", 1)])
def test_communication_per_round(name, floats_up):
    problem = small_lasso()
    result = simulate(problem, fedbench.make_algorithm(name, problem), Federation(2, 3, 2, 5), seed=0, eval_every=1)
    assert result.rows[1]["comm_up"] == 3 * floats_up * problem.dim
