"""Regularizers, proximal maps, projections and subgradients (fedbench/prox.py) against their definitions.

prox(v, step) must be argmin_w ½‖w − v‖² + step·h(w) (prox_{step·h} as the pFedFBE paper, ICLR 2023 submission,
§1, defines prox_h), optionally over the ball ‖w‖₂ ≤ radius (the 𝒲 of Bao et al., ICML 2022, §3.1). Every closed
form is compared with a numerical minimization of that definition (scipy), written without reference to the closed
form: ℓ1 through the smooth split w = p − n, p, n ≥ 0; the nuclear norm through the variational form
‖W‖_* = min_{W = ABᵀ} ½(‖A‖² + ‖B‖²).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from fedbench.prox import L1, NoRegularizer, Nuclear, project_l1_ball, project_l2_ball, project_nuclear_ball

DT = torch.float64


def t(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=DT)


# -- numerical argmins of the definitions ------------------------------------------------------------

def numeric_l1_prox(v: np.ndarray, tau: float, size: int, radius: float | None = None) -> np.ndarray:
    """argmin_w ½‖w − v‖² + tau·‖w[:size]‖₁ (s.t. ‖w‖₂ ≤ radius), by the split w[:size] = p − n, p, n ≥ 0."""
    d, k = len(v), size

    def unpack(x):
        return np.r_[x[:k] - x[k:2 * k], x[2 * k:]]

    def fun(x):
        r = unpack(x) - v
        value = 0.5 * r @ r + tau * x[: 2 * k].sum()
        grad = np.r_[r[:k] + tau, -r[:k] + tau, r[k:]]
        return value, grad

    x0 = np.r_[np.maximum(v[:k], 0), np.maximum(-v[:k], 0), v[k:]]
    bounds = [(0.0, None)] * (2 * k) + [(None, None)] * (d - k)
    if radius is None:
        res = minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 20000, "maxcor": 50})
    else:
        def ball(x):
            w = unpack(x)
            return radius**2 - w @ w

        def ball_jac(x):
            w = unpack(x)
            return -2 * np.r_[w[:k], -w[:k], w[k:]]

        res = minimize(fun, 0.5 * x0, jac=True, method="SLSQP", bounds=bounds,
                       constraints=[{"type": "ineq", "fun": ball, "jac": ball_jac}],
                       options={"ftol": 1e-16, "maxiter": 2000})
    return unpack(res.x)


def l1_prox_objective(w, v, tau, size):
    return 0.5 * np.sum((w - v) ** 2) + tau * np.abs(w[:size]).sum()


def nuclear_norm(a: np.ndarray) -> float:
    return float(np.linalg.svd(a, compute_uv=False).sum())


def _factor_starts(p1, p2, k, rng, count):
    return [rng.standard_normal((p1 + p2) * k) for _ in range(count)]


def numeric_nuclear_prox(v: np.ndarray, tau: float, radius: float | None = None, seed: int = 0) -> np.ndarray:
    """argmin_W ½‖W − V‖² + tau‖W‖_* (s.t. ‖W‖_F ≤ radius) through W = ABᵀ and
    ‖W‖_* = min ½(‖A‖² + ‖B‖²); best of several random starts."""
    p1, p2 = v.shape
    k = min(p1, p2)
    rng = np.random.default_rng(seed)

    def split(x):
        return x[: p1 * k].reshape(p1, k), x[p1 * k:].reshape(p2, k)

    def fun(x):
        a, b = split(x)
        r = a @ b.T - v
        value = 0.5 * np.sum(r * r) + 0.5 * tau * (np.sum(a * a) + np.sum(b * b))
        grad = np.r_[(r @ b + tau * a).ravel(), (r.T @ a + tau * b).ravel()]
        return value, grad

    best = None
    for x0 in _factor_starts(p1, p2, k, rng, 6):
        if radius is None:
            res = minimize(fun, x0, jac=True, method="L-BFGS-B",
                           options={"ftol": 1e-16, "gtol": 1e-12, "maxiter": 50000, "maxcor": 50})
        else:
            def ball(x):
                a, b = split(x)
                w = a @ b.T
                return radius**2 - np.sum(w * w)

            res = minimize(fun, 0.1 * x0, jac=True, method="SLSQP",
                           constraints=[{"type": "ineq", "fun": ball}], options={"ftol": 1e-16, "maxiter": 3000})
            if ball(res.x) < -1e-9:
                continue
        a, b = split(res.x)
        w = a @ b.T
        value = 0.5 * np.sum((w - v) ** 2) + tau * nuclear_norm(w)
        if best is None or value < best[0]:
            best = (value, w)
    return best[1]


def nuclear_prox_objective(w, v, tau):
    return 0.5 * np.sum((w - v) ** 2) + tau * nuclear_norm(w)


def numeric_projection(u: np.ndarray, kind: str, radius: float, seed: int = 0) -> np.ndarray:
    """argmin_x ½‖x − u‖² s.t. ‖x‖ ≤ radius (ℓ2, ℓ1 or nuclear), by SLSQP on a smooth reformulation."""
    rng = np.random.default_rng(seed)
    if kind == "l2":
        res = minimize(lambda x: (0.5 * np.sum((x - u) ** 2), x - u), np.zeros_like(u), jac=True, method="SLSQP",
                       constraints=[{"type": "ineq", "fun": lambda x: radius**2 - x @ x, "jac": lambda x: -2 * x}],
                       options={"ftol": 1e-16, "maxiter": 1000})
        return res.x
    if kind == "l1":
        d = len(u)

        def fun(x):
            r = x[:d] - x[d:] - u
            return 0.5 * r @ r, np.r_[r, -r]

        res = minimize(fun, np.zeros(2 * d), jac=True, method="SLSQP", bounds=[(0.0, None)] * (2 * d),
                       constraints=[{"type": "ineq", "fun": lambda x: radius - x.sum(), "jac": lambda x: -np.ones(2 * d)}],
                       options={"ftol": 1e-16, "maxiter": 1000})
        return res.x[:d] - res.x[d:]
    assert kind == "nuclear"
    p1, p2 = u.shape
    k = min(p1, p2)

    def split(x):
        return x[: p1 * k].reshape(p1, k), x[p1 * k:].reshape(p2, k)

    def fun(x):
        a, b = split(x)
        r = a @ b.T - u
        return 0.5 * np.sum(r * r), np.r_[(r @ b).ravel(), (r.T @ a).ravel()]

    def ball(x):  # ½(‖A‖² + ‖B‖²) ≤ radius  <=>  ABᵀ ranges over the nuclear ball of that radius
        return radius - 0.5 * x @ x

    best = None
    for x0 in _factor_starts(p1, p2, k, rng, 6):
        res = minimize(fun, 0.1 * x0, jac=True, method="SLSQP",
                       constraints=[{"type": "ineq", "fun": ball, "jac": lambda x: -x}],
                       options={"ftol": 1e-16, "maxiter": 3000})
        a, b = split(res.x)
        x = a @ b.T
        if nuclear_norm(x) > radius + 1e-8:
            continue
        value = 0.5 * np.sum((x - u) ** 2)
        if best is None or value < best[0]:
            best = (value, x)
    return best[1]


# -- ℓ1 --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("step", [0.05, 0.4, 1.3])
def test_l1_prox_is_the_argmin_of_its_definition(seed, step):
    rng = np.random.default_rng(seed)
    lam, d = 0.7, 9
    v = rng.standard_normal(d) * 1.5
    v[0] = 0.0  # a coordinate at the kink
    w = L1(lam, d).prox(t(v), step).numpy()
    w_num = numeric_l1_prox(v, step * lam, d)
    tau = step * lam
    assert l1_prox_objective(w, v, tau, d) <= l1_prox_objective(w_num, v, tau, d) + 1e-12
    np.testing.assert_allclose(w, w_num, atol=1e-6, rtol=0)
    # Optimality (exact): v − w ∈ tau·∂‖w‖₁.
    residual = v - w
    nonzero = w != 0
    np.testing.assert_allclose(residual[nonzero], tau * np.sign(w[nonzero]), atol=1e-12)
    assert np.all(np.abs(residual[~nonzero]) <= tau + 1e-12)
    assert nonzero.sum() < d  # the threshold actually zeroed something (v[0] = 0 at least)


def test_l1_prox_tensor_step_broadcasts_over_a_batch():
    rng = np.random.default_rng(1)
    lam = 0.5
    v = rng.standard_normal((2, 3, 7)) * 1.5
    steps = np.array([[0.1, 0.8, 2.0], [0.0, 0.4, 1.1]])[..., None]  # [2, 3, 1], one step per row
    out = L1(lam, 7).prox(t(v), t(steps)).numpy()
    assert out.shape == v.shape
    for i in range(2):
        for j in range(3):
            w_num = numeric_l1_prox(v[i, j], steps[i, j, 0] * lam, 7)
            np.testing.assert_allclose(out[i, j], w_num, atol=1e-6, rtol=0)
            # and the row equals the float-step prox of that row
            np.testing.assert_array_equal(out[i, j], L1(lam, 7).prox(t(v[i, j]), float(steps[i, j, 0])).numpy())
    np.testing.assert_array_equal(out[1, 0], v[1, 0])  # step 0 is the identity


@pytest.mark.parametrize("tensor_step", [False, True])
def test_l1_prox_leaves_trailing_intercept_coordinates_free(tensor_step):
    rng = np.random.default_rng(2)
    lam, d, size = 0.6, 8, 6
    v = rng.standard_normal((3, d)) * 1.5
    v[:, size:] = [[0.1, -0.2], [3.0, -4.0], [0.0, 0.05]]  # small values a wrong threshold would zero
    steps = np.array([0.5, 1.0, 2.0])
    step = t(steps[:, None]) if tensor_step else 1.0
    out = L1(lam, size).prox(t(v), step).numpy()
    for i in range(3):
        s = steps[i] if tensor_step else 1.0
        w_num = numeric_l1_prox(v[i], s * lam, size)
        np.testing.assert_allclose(out[i], w_num, atol=1e-6, rtol=0)
        np.testing.assert_array_equal(out[i, size:], v[i, size:])


@pytest.mark.parametrize("size", [7, 5])
@pytest.mark.parametrize("radius_factor", [0.3, 0.8, 5.0])
def test_l1_prox_with_radius_is_the_constrained_argmin(size, radius_factor):
    """Threshold-then-rescale must be the exact argmin over the ℓ2 ball (ℓ1 is positively homogeneous), also with free
    trailing coordinates; radius_factor 5 leaves the ball inactive (plain prox)."""
    rng = np.random.default_rng(size)
    lam, step, d = 0.4, 1.5, 7
    v = rng.standard_normal(d) * 2
    plain = L1(lam, size).prox(t(v), step).numpy()
    radius = radius_factor * np.linalg.norm(plain)
    w = L1(lam, size, radius=radius).prox(t(v), step).numpy()
    w_num = numeric_l1_prox(v, step * lam, size, radius=radius)
    assert np.linalg.norm(w) <= radius * (1 + 1e-12)
    np.testing.assert_allclose(w, w_num, atol=2e-6, rtol=0)
    assert l1_prox_objective(w, v, step * lam, size) <= l1_prox_objective(w_num, v, step * lam, size) + 1e-10
    if radius_factor > 1:
        np.testing.assert_allclose(w, plain, atol=1e-15, rtol=0)
    else:
        assert np.linalg.norm(w) == pytest.approx(radius, rel=1e-12)


# -- nuclear norm ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(3, 3), (2, 3), (3, 2)])
@pytest.mark.parametrize("step", [0.1, 0.7])
@pytest.mark.parametrize("seed", range(2))
def test_nuclear_prox_is_the_argmin_of_its_definition(shape, step, seed):
    rng = np.random.default_rng(10 + seed)
    lam = 0.9
    v = rng.standard_normal(shape) * 1.5
    w = Nuclear(lam, shape).prox(t(v.ravel()), step).numpy().reshape(shape)
    tau = step * lam
    w_num = numeric_nuclear_prox(v, tau, seed=seed)
    assert nuclear_prox_objective(w, v, tau) <= nuclear_prox_objective(w_num, v, tau) + 1e-10
    np.testing.assert_allclose(w, w_num, atol=1e-5, rtol=0)
    # Optimality (exact): V − W ∈ tau ∂‖W‖_*  <=>  ‖V − W‖_op ≤ tau and ⟨V − W, W⟩ = tau‖W‖_*.
    residual = v - w
    assert np.linalg.norm(residual, 2) <= tau * (1 + 1e-12)
    assert np.sum(residual * w) == pytest.approx(tau * nuclear_norm(w), rel=1e-10, abs=1e-12)


def test_nuclear_prox_kills_small_singular_values():
    u, _ = np.linalg.qr(np.random.default_rng(3).standard_normal((3, 3)))
    vt, _ = np.linalg.qr(np.random.default_rng(4).standard_normal((3, 3)))
    v = u @ np.diag([3.0, 1.0, 0.2]) @ vt.T
    w = Nuclear(0.5, (3, 3)).prox(t(v.ravel()), 1.0).numpy().reshape(3, 3)
    np.testing.assert_allclose(np.linalg.svd(w, compute_uv=False), [2.5, 0.5, 0.0], atol=1e-12)


def test_nuclear_prox_batched_float_step_and_free_intercept():
    rng = np.random.default_rng(5)
    lam, shape = 0.8, (2, 3)
    v = rng.standard_normal((2, 4, 7)) * 1.5  # 6 matrix coordinates + 1 intercept
    out = Nuclear(lam, shape).prox(t(v), 0.6).numpy()
    assert out.shape == v.shape
    for i in range(2):
        for j in range(4):
            w_num = numeric_nuclear_prox(v[i, j, :6].reshape(shape), 0.6 * lam, seed=i + j)
            np.testing.assert_allclose(out[i, j, :6].reshape(shape), w_num, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(out[..., 6], v[..., 6])


def test_nuclear_prox_tensor_step_broadcasts_over_a_batch():
    """`Regularizer.prox` documents `step` as 'a float or a tensor broadcastable to [..., 1]' (L1 honours it)."""
    rng = np.random.default_rng(6)
    lam, shape = 0.8, (2, 3)
    v = rng.standard_normal((4, 6)) * 1.5
    steps = np.array([0.1, 0.5, 1.0, 2.0])[:, None]  # [4, 1]
    try:
        out = Nuclear(lam, shape).prox(t(v), t(steps)).numpy()
    except RuntimeError as err:  # fedbench/prox.py Nuclear._prox unsqueezes a [B, 1] threshold to [B, 1, 1]
        pytest.fail(f"Nuclear.prox with a [B, 1] tensor step raised instead of broadcasting per row: {err}")
    assert out.shape == v.shape
    for i in range(4):
        w_num = numeric_nuclear_prox(v[i].reshape(shape), steps[i, 0] * lam, seed=i)
        np.testing.assert_allclose(out[i].reshape(shape), w_num, atol=1e-5, rtol=0)


@pytest.mark.parametrize("radius_factor", [0.4, 5.0])
def test_nuclear_prox_with_radius_is_the_constrained_argmin(radius_factor):
    rng = np.random.default_rng(7)
    lam, step, shape = 0.5, 1.0, (2, 3)
    v = rng.standard_normal(shape) * 2
    plain = Nuclear(lam, shape).prox(t(v.ravel()), step).numpy().reshape(shape)
    radius = radius_factor * np.linalg.norm(plain)
    w = Nuclear(lam, shape, radius=radius).prox(t(v.ravel()), step).numpy().reshape(shape)
    w_num = numeric_nuclear_prox(v, step * lam, radius=radius)
    assert np.linalg.norm(w) <= radius * (1 + 1e-12)
    assert nuclear_prox_objective(w, v, step * lam) <= nuclear_prox_objective(w_num, v, step * lam) + 1e-9
    np.testing.assert_allclose(w, w_num, atol=1e-4, rtol=0)


# -- no regularizer ----------------------------------------------------------------------------------------

def test_no_regularizer_is_zero_and_its_prox_the_identity():
    rng = np.random.default_rng(8)
    v = t(rng.standard_normal((3, 5)))
    reg = NoRegularizer(lam=0.7, size=5)  # the arguments are ignored: h ≡ 0
    np.testing.assert_array_equal(reg.prox(v, 3.0).numpy(), v.numpy())
    np.testing.assert_array_equal(reg.prox(v, t(np.ones((3, 1)))).numpy(), v.numpy())
    assert torch.equal(reg.value(v), torch.zeros(3, dtype=DT))
    assert torch.equal(reg.subgradient(v), torch.zeros_like(v))
    # argmin_w ½‖w − v‖² (+ 0) is v: the numeric argmin with tau = 0 agrees
    np.testing.assert_allclose(numeric_l1_prox(v[0].numpy(), 0.0, 5), v[0].numpy(), atol=1e-8)
    # with a radius the prox is the plain projection onto the ball
    ball = NoRegularizer(radius=1.0).prox(v, 1.0)
    np.testing.assert_allclose(ball.numpy(), (v / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(1)).numpy(),
                               atol=1e-15)


# -- projections --------------------------------------------------------------------------------------------

def _check_variational_inequality(u, p, feasible):
    """Projection onto a convex set C: ⟨u − P(u), x − P(u)⟩ ≤ 0 for every x ∈ C."""
    for x in feasible:
        assert np.sum((u - p) * (x - p)) <= 1e-9


def test_project_l2_ball_matches_constrained_argmin_batched():
    rng = np.random.default_rng(9)
    radius = 1.3
    u = rng.standard_normal((2, 3, 5)) * np.array([0.2, 1.0, 3.0])[None, :, None]
    out = project_l2_ball(t(u), radius).numpy()
    assert out.shape == u.shape
    for i in range(2):
        for j in range(3):
            x_num = numeric_projection(u[i, j], "l2", radius)
            np.testing.assert_allclose(out[i, j], x_num, atol=1e-7)
            assert np.linalg.norm(out[i, j]) <= radius * (1 + 1e-12)
            if np.linalg.norm(u[i, j]) <= radius:
                np.testing.assert_array_equal(out[i, j], u[i, j])
            feasible = rng.standard_normal((50, 5))
            feasible *= radius * rng.uniform(0, 1, (50, 1)) / np.linalg.norm(feasible, axis=1, keepdims=True)
            _check_variational_inequality(u[i, j], out[i, j], feasible)
    assert np.all(np.linalg.norm(u, axis=-1)[:, 0] < radius)  # the identity case was exercised
    np.testing.assert_array_equal(project_l2_ball(torch.zeros(4, dtype=DT), 1.0).numpy(), np.zeros(4))


def test_project_l1_ball_matches_constrained_argmin_batched():
    rng = np.random.default_rng(10)
    radius = 1.5
    u = rng.standard_normal((2, 3, 6)) * np.array([0.1, 1.0, 3.0])[None, :, None]
    u[1, 2, :3] = [2.0, -2.0, 2.0]  # ties in magnitude
    u[1, 1, 0] = 0.0
    out = project_l1_ball(t(u), radius).numpy()
    assert out.shape == u.shape
    for i in range(2):
        for j in range(3):
            x_num = numeric_projection(u[i, j], "l1", radius)
            np.testing.assert_allclose(out[i, j], x_num, atol=1e-7)
            assert np.abs(out[i, j]).sum() <= radius * (1 + 1e-12)
            if np.abs(u[i, j]).sum() <= radius:
                np.testing.assert_array_equal(out[i, j], u[i, j])
            else:
                assert np.abs(out[i, j]).sum() == pytest.approx(radius, rel=1e-12)
            feasible = rng.standard_normal((50, 6))
            feasible *= radius * rng.uniform(0, 1, (50, 1)) / np.abs(feasible).sum(1, keepdims=True)
            vertices = radius * np.vstack([np.eye(6), -np.eye(6)])
            _check_variational_inequality(u[i, j], out[i, j], np.vstack([feasible, vertices]))
    assert np.all(np.abs(u[:, 0]).sum(-1) < radius)  # the identity case was exercised


def test_project_nuclear_ball_matches_constrained_argmin_batched():
    rng = np.random.default_rng(11)
    radius = 2.0
    a = rng.standard_normal((2, 2, 2, 3)) * np.array([0.15, 2.0])[None, :, None, None]
    out = project_nuclear_ball(t(a), radius).numpy()
    assert out.shape == a.shape
    for i in range(2):
        for j in range(2):
            x_num = numeric_projection(a[i, j], "nuclear", radius, seed=i + j)
            np.testing.assert_allclose(out[i, j], x_num, atol=1e-5)
            assert nuclear_norm(out[i, j]) <= radius * (1 + 1e-12)
            if nuclear_norm(a[i, j]) <= radius:
                np.testing.assert_allclose(out[i, j], a[i, j], atol=1e-14)
            feasible = []
            for _ in range(50):
                x = rng.standard_normal((2, 3))
                feasible.append(x * radius * rng.uniform(0, 1) / nuclear_norm(x))
            _check_variational_inequality(a[i, j], out[i, j], feasible)
    assert all(nuclear_norm(a[i, 0]) < radius for i in range(2))  # the identity case was exercised
    assert all(nuclear_norm(a[i, 1]) > radius for i in range(2))


# -- subgradients ---------------------------------------------------------------------------------------------

def _subgradient_points(rng, x, count=200):
    directions = rng.standard_normal((count, x.size))
    scales = np.geomspace(1e-6, 10, count)[:, None]
    return np.vstack([x.ravel() + scales * directions, np.zeros(x.size), 2 * x.ravel(), rng.standard_normal((50, x.size))])


def test_l1_subgradient_inequality_with_kinks_and_free_coordinates():
    rng = np.random.default_rng(12)
    lam, size, d = 0.3, 6, 8
    reg = L1(lam, size)
    x = rng.standard_normal(d)
    x[[1, 4]] = 0.0  # kinks: the subgradient must stay within [−λ, λ] there
    g = reg.subgradient(t(x)).numpy()
    np.testing.assert_array_equal(g[size:], 0.0)

    def h(y):
        return lam * np.abs(y[:size]).sum()

    for y in _subgradient_points(rng, x):
        assert h(y) >= h(x) + g @ (y - x) - 1e-12
    # exact characterisation of ∂(λ‖·‖₁)(x): ‖g‖_∞ ≤ λ and ⟨g, x⟩ = λ‖x‖₁
    assert np.abs(g).max() <= lam
    assert g @ x == pytest.approx(h(x), rel=1e-14)
    # the element the subgradient baselines take (the pFedFBE paper, §1, names none): λ·sign(w), 0 at the kinks
    np.testing.assert_array_equal(g[:size], lam * np.sign(x[:size]))
    assert g[1] == 0.0 and g[4] == 0.0
    # batched: rows independent
    xs = rng.standard_normal((3, d))
    np.testing.assert_array_equal(reg.subgradient(t(xs)).numpy()[:, :size], lam * np.sign(xs[:, :size]))


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_nuclear_subgradient_inequality(rank):
    rng = np.random.default_rng(13 + rank)
    lam, shape = 0.4, (3, 3)
    x = rng.standard_normal((3, rank)) @ rng.standard_normal((rank, 3)) if rank else np.zeros(shape)
    reg = Nuclear(lam, shape)
    g = reg.subgradient(t(x.ravel())).numpy().reshape(shape)

    def h(y):
        return lam * nuclear_norm(y.reshape(shape))

    for y in _subgradient_points(rng, x):
        assert h(y) >= h(x) + np.sum(g * (y.reshape(shape) - x)) - 1e-11
    assert np.linalg.norm(g, 2) <= lam * (1 + 1e-12)
    assert np.sum(g * x) == pytest.approx(h(x), rel=1e-10, abs=1e-13)
    # the element the subgradient baselines take: λ·U₊V₊ᵀ from the singular vectors with σ > 0 only
    u, s, vt = np.linalg.svd(x)
    positive = s > 1e-10
    np.testing.assert_allclose(g, lam * u[:, positive] @ vt[positive], atol=1e-10)


def test_nuclear_subgradient_batched_with_free_intercept():
    rng = np.random.default_rng(14)
    lam, shape = 0.4, (2, 3)
    x = rng.standard_normal((5, 7))
    g = Nuclear(lam, shape).subgradient(t(x)).numpy()
    np.testing.assert_array_equal(g[:, 6], 0.0)
    for i in range(5):
        m = x[i, :6].reshape(shape)
        u, _, vt = np.linalg.svd(m, full_matrices=False)
        np.testing.assert_allclose(g[i, :6].reshape(shape), lam * u @ vt, atol=1e-12)


# -- value, norm, dual norm --------------------------------------------------------------------------------------

def test_l1_value_norm_dual_norm_match_numpy():
    rng = np.random.default_rng(15)
    lam, size = 0.25, 5
    w = rng.standard_normal((4, 7))
    reg = L1(lam, size)
    np.testing.assert_allclose(reg.norm(t(w)).numpy(), np.abs(w[:, :size]).sum(-1), rtol=1e-14)
    np.testing.assert_allclose(reg.value(t(w)).numpy(), lam * np.abs(w[:, :size]).sum(-1), rtol=1e-14)
    np.testing.assert_allclose(reg.dual_norm(t(w)).numpy(), np.abs(w[:, :size]).max(-1), rtol=1e-14)
    assert reg.value(t(w[0])).shape == ()


def test_nuclear_value_norm_dual_norm_match_numpy():
    rng = np.random.default_rng(16)
    lam, shape = 0.25, (2, 3)
    w = rng.standard_normal((4, 7))  # + one free coordinate
    reg = Nuclear(lam, shape)
    sv = np.linalg.svd(w[:, :6].reshape(4, *shape), compute_uv=False)
    np.testing.assert_allclose(reg.norm(t(w)).numpy(), sv.sum(-1), rtol=1e-13)
    np.testing.assert_allclose(reg.value(t(w)).numpy(), lam * sv.sum(-1), rtol=1e-13)
    np.testing.assert_allclose(reg.dual_norm(t(w)).numpy(), sv.max(-1), rtol=1e-13)
    # the flat vector is read row-major as a `shape` matrix: the shape matters
    x = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])  # (2,3): [[1,0,0],[1,0,0]], rank 1, nuclear norm √2
    assert float(Nuclear(1.0, (2, 3)).norm(t(x))) == pytest.approx(np.sqrt(2.0), rel=1e-14)
    assert float(Nuclear(1.0, (3, 2)).norm(t(x))) == pytest.approx(2.0, rel=1e-14)  # [[1,0],[0,1],[0,0]]
