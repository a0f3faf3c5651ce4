"""The group-ℓ2 regularizer h(w) = λ Σ_g ‖w_g‖₂ (fedbench.prox.GroupL2; the non-squared "ℓ2 norm function on the
weights" of the pFedFBE paper's MLP, ICLR 2023 submission, §4.3) against its definitions.

prox(v, step) must be argmin_w ½‖w − v‖² + step·h(w): compared with a numerical minimization written without
the closed form (scipy's SLSQP on the smooth epigraph form min ½‖w − v‖² + step·λ Σ_g t_g s.t. t_g² ≥ ‖w_g‖²,
t_g ≥ 0). Subgradients must satisfy the subgradient inequality; batched calls must equal per-row calls.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from fedbench.prox import GroupL2

DT = torch.float64
# Two groups, the second made of two separate blocks; coordinates 3, 6, 7, 10 and 11 are free.
GROUPS = [[(0, 3)], [(4, 6), (8, 10)]]
DIM = 12
FREE = [3, 6, 7, 10, 11]


def members(group) -> list[int]:
    return [i for start, end in group for i in range(start, end)]


def h_numpy(w: np.ndarray, lam: float, groups=GROUPS) -> float:
    return lam * sum(np.linalg.norm(w[members(group)]) for group in groups)


def numeric_prox(v: np.ndarray, tau: float, groups=GROUPS) -> np.ndarray:
    """argmin_w ½‖w − v‖² + tau Σ_g ‖w_g‖₂ through the epigraph variables t_g ≥ ‖w_g‖₂."""
    d, k = len(v), len(groups)

    def fun(x):
        w, t = x[:d], x[d:]
        return 0.5 * np.sum((w - v) ** 2) + tau * t.sum(), np.r_[w - v, np.full(k, tau)]

    def cones(x):
        w, t = x[:d], x[d:]
        return np.array([t[g] ** 2 - np.sum(w[members(group)] ** 2) for g, group in enumerate(groups)])

    def cones_jac(x):
        w, t = x[:d], x[d:]
        jac = np.zeros((k, d + k))
        for g, group in enumerate(groups):
            jac[g, members(group)] = -2 * w[members(group)]
            jac[g, d + g] = 2 * t[g]
        return jac

    x0 = np.r_[v, [np.linalg.norm(v[members(group)]) + 1.0 for group in groups]]
    res = minimize(fun, x0, jac=True, method="SLSQP", bounds=[(None, None)] * d + [(0.0, None)] * k,
                   constraints=[{"type": "ineq", "fun": cones, "jac": cones_jac}],
                   options={"ftol": 1e-15, "maxiter": 2000})
    return res.x[:d]  # SLSQP may stop at its precision limit with success False: the comparison judges


def prox_objective(w, v, tau):
    return 0.5 * np.sum((w - v) ** 2) + h_numpy(w, tau)


def random_case(rng: np.random.Generator, tau: float) -> np.ndarray:
    """v whose first group has a norm below the threshold tau and whose second group's is above it."""
    v = rng.normal(size=DIM)
    first, second = members(GROUPS[0]), members(GROUPS[1])
    v[first] *= rng.uniform(0.1, 0.9) * tau / np.linalg.norm(v[first])
    v[second] *= rng.uniform(1.2, 4.0) * tau / np.linalg.norm(v[second])
    return v


@pytest.mark.parametrize("seed", range(6))
def test_prox_is_the_numeric_argmin(seed):
    rng = np.random.default_rng(seed)
    lam, step = rng.uniform(0.05, 2.0), rng.uniform(0.1, 2.0)
    tau = lam * step
    v = random_case(rng, tau) if seed % 2 else rng.normal(scale=2 * tau, size=DIM)
    closed = GroupL2(lam, GROUPS).prox(torch.as_tensor(v, dtype=DT), step).numpy()
    numeric = numeric_prox(v, tau)
    # strong convexity: ‖w − w*‖² ≤ 2 (F(w) − F(w*)), so the closed form must be at least as good
    assert prox_objective(closed, v, tau) <= prox_objective(numeric, v, tau) + 1e-10
    np.testing.assert_allclose(closed, numeric, atol=1e-5)
    np.testing.assert_array_equal(closed[FREE], v[FREE])  # free coordinates: the identity
    for group in GROUPS:
        norm = np.linalg.norm(v[members(group)])
        if norm <= tau:  # exactly zero, not merely small
            assert not closed[members(group)].any()
        else:
            np.testing.assert_allclose(closed[members(group)], (1 - tau / norm) * v[members(group)], rtol=1e-12)


def test_prox_at_the_threshold_zero_and_without_penalty():
    reg = GroupL2(0.5, GROUPS)
    v = torch.zeros(DIM, dtype=DT)
    v[members(GROUPS[1])] = torch.tensor([3.0, 0.0, 0.0, 4.0], dtype=DT)  # norm 5 = step·λ exactly
    v[FREE] = 1.0
    out = reg.prox(v, 10.0)
    assert not out[members(GROUPS[1])].any() and not out[members(GROUPS[0])].any()
    torch.testing.assert_close(out[FREE], v[FREE], rtol=0, atol=0)
    torch.testing.assert_close(reg.prox(v, 0.0), v, rtol=0, atol=0)
    torch.testing.assert_close(GroupL2(0.0, GROUPS).prox(v, 3.0), v, rtol=0, atol=0)


@pytest.mark.parametrize("seed", range(4))
def test_subgradient_satisfies_the_subgradient_inequality(seed):
    rng = np.random.default_rng(seed)
    lam = rng.uniform(0.1, 3.0)
    reg = GroupL2(lam, GROUPS)
    w = rng.normal(size=DIM)
    if seed % 2:
        w[members(GROUPS[seed // 2])] = 0.0  # a zero group: its subgradient is 0
    g = reg.subgradient(torch.as_tensor(w, dtype=DT)).numpy()
    assert not g[FREE].any()
    for group in GROUPS:
        block = w[members(group)]
        want = lam * block / np.linalg.norm(block) if block.any() else np.zeros_like(block)
        np.testing.assert_allclose(g[members(group)], want, rtol=1e-12, atol=0)
    for u in rng.normal(scale=3.0, size=(50, DIM)):
        assert h_numpy(u, lam) >= h_numpy(w, lam) + g @ (u - w) - 1e-12


def test_batched_calls_equal_per_row_calls():
    rng = np.random.default_rng(7)
    lam = 0.7
    reg = GroupL2(lam, GROUPS)
    v = torch.as_tensor(rng.normal(size=(3, 4, DIM)), dtype=DT)
    v[1, 2, members(GROUPS[0])] = 0.0
    steps = torch.as_tensor(rng.uniform(0.1, 3.0, size=(3, 4, 1)), dtype=DT)
    batched_prox, batched_sub = reg.prox(v, steps), reg.subgradient(v)
    values, norms, duals = reg.value(v), reg.norm(v), reg.dual_norm(v)
    assert values.shape == norms.shape == duals.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            row = v[i, j]
            torch.testing.assert_close(batched_prox[i, j], reg.prox(row, float(steps[i, j])), rtol=1e-14,
                                       atol=1e-15)  # reductions may sum in another order
            torch.testing.assert_close(batched_sub[i, j], reg.subgradient(row), rtol=0, atol=0)
            group_norms = [float(torch.linalg.vector_norm(row[members(group)])) for group in GROUPS]
            assert float(values[i, j]) == pytest.approx(lam * sum(group_norms), rel=1e-14)
            assert float(norms[i, j]) == pytest.approx(sum(group_norms), rel=1e-14)
            assert float(duals[i, j]) == pytest.approx(max(group_norms), rel=1e-14)


def test_the_base_class_api_algorithms_use():
    reg = GroupL2(0.2, GROUPS)
    v = torch.as_tensor(np.random.default_rng(3).normal(size=(2, DIM)), dtype=DT)
    other = reg.with_lam(0.05)
    assert other.lam == 0.05 and reg.lam == 0.2 and other.groups == reg.groups
    torch.testing.assert_close(other.value(v), 0.25 * reg.value(v))
    torch.testing.assert_close(reg.prox_in_ball(v, 0.3, v, None), reg.prox(v, 0.3))  # no ball: the plain prox
    assert reg.size == 10  # every coordinate from the last block's end on is free
    with pytest.raises(ValueError, match="non-empty"):
        GroupL2(0.1, [])
    with pytest.raises(NotImplementedError, match="group_l2"):
        reg.project_norm_ball(v, 1.0)
