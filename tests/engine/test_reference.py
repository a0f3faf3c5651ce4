"""The centralized reference solver (fedbench/reference.py): its optimum against scikit-learn's Lasso, its
duality-gap certificate, the prox-gradient fixed point for the nuclear norm, and its caches."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import Lasso as SkLasso

import fedbench
from fedbench import reference
from fedbench.reference import minimize, solve
from small_problems import small_lasso, small_lowrank

LAM = 0.05




def pooled_objective(problem, w: np.ndarray) -> float:
    """(1/2N) ‖Xw − y‖² + λ‖w_P‖₁ on the pooled data (equal client sizes: the federated objective)."""
    x, y = problem.features.numpy(), problem.labels.numpy()
    r = x @ w - y
    return 0.5 * np.mean(r**2) + problem.config["lam"] * np.abs(w[: problem.feature_dim]).sum()


def test_lasso_optimum_matches_sklearn():
    problem = small_lasso()
    solution = minimize(problem)
    x, y = problem.features.numpy(), problem.labels.numpy()
    model = SkLasso(alpha=LAM, fit_intercept=False, tol=1e-12, max_iter=10**6).fit(x, y)
    w = solution.w.numpy()
    assert np.abs(w - model.coef_).max() <= 1e-6
    assert solution.objective == pytest.approx(pooled_objective(problem, model.coef_), abs=1e-6)
    assert solution.objective == pytest.approx(pooled_objective(problem, w), rel=1e-12)
    # a non-trivial instance: some coordinates are zero, some are not
    assert 0 < np.count_nonzero(w) < len(w)


def test_lasso_with_intercept_matches_sklearn():
    problem = small_lasso(intercept=True)
    assert problem.dim == 31 and problem.feature_dim == 30
    np.testing.assert_array_equal(problem.features[:, -1].numpy(), 1.0)
    solution = minimize(problem)
    x, y = problem.features.numpy(), problem.labels.numpy()
    model = SkLasso(alpha=LAM, fit_intercept=True, tol=1e-12, max_iter=10**6).fit(x[:, :-1], y)
    expected = np.r_[model.coef_, model.intercept_]
    w = solution.w.numpy()
    assert np.abs(w - expected).max() <= 1e-6
    assert abs(w[-1]) > 1e-3  # the intercept is really fitted (and not thresholded)
    assert solution.objective == pytest.approx(pooled_objective(problem, expected), abs=1e-6)


def ista(problem, w, iterations):
    hessian, linear, _ = problem.quadratic()
    step = 1.0 / float(torch.linalg.eigvalsh(hessian)[-1])
    best = float(problem.objective(w))
    for _ in range(iterations):
        w = problem.regularizer.prox(w - step * (hessian @ w - linear), step)
        best = min(best, float(problem.objective(w)))
    return w, best


@pytest.mark.parametrize("make", [small_lasso, lambda: small_lasso(intercept=True), lambda: small_lasso(lam=0.0),
                                  small_lowrank], ids=["lasso", "lasso-intercept", "lasso-lam0", "lowrank"])
def test_gap_certificate_and_ista_cannot_improve(make):
    problem = make()
    solution = minimize(problem)
    scale = max(1.0, abs(solution.objective))
    assert 0 <= solution.gap <= 1e-10 * scale
    assert solution.objective == pytest.approx(float(problem.objective(solution.w)), rel=1e-13)
    # long plain ISTA from the solution: never more than the certified gap below
    _, best = ista(problem, solution.w.clone(), 3000)
    assert best >= solution.objective - solution.gap - 1e-13 * scale
    # ... and long ISTA from zero does not find anything better either
    _, best_from_zero = ista(problem, torch.zeros_like(solution.w), 5000)
    assert best_from_zero >= solution.objective - solution.gap - 1e-13 * scale
    assert best_from_zero <= solution.objective + 1e-6 * scale  # sanity: ISTA gets there too


@pytest.mark.parametrize("intercept", [False, True])
def test_gap_certificate_equals_an_explicit_dual_gap(intercept):
    """The closed-form certificate (module docstring of fedbench/reference.py) against the duality gap of
    min ½‖Aw − ỹ‖² + λ‖w_P‖₁ computed with A and ỹ formed explicitly, at non-optimal points."""
    problem = small_lasso(intercept=intercept)
    solution = minimize(problem)
    hessian, linear, constant = problem.quadratic()
    certificate = reference._GapCertificate(hessian, linear, constant, problem.regularizer)
    x, y = problem.features.numpy(), problem.labels.numpy()
    root = np.sqrt(1.0 / len(y))  # π_k / n_k with equal clients
    a, y_tilde = root * x, root * y
    p = problem.feature_dim
    rng = np.random.default_rng(0)
    for scale in (1e-3, 1e-1, 1.0):
        w = solution.w.numpy() + scale * rng.standard_normal(problem.dim)
        primal = float(problem.objective(torch.from_numpy(w)))
        theta = y_tilde - a @ w
        if intercept:  # make θ orthogonal to the free column(s)
            free = a[:, p:]
            theta = theta - free @ np.linalg.solve(free.T @ free, free.T @ theta)
        dual_norm = np.abs(a[:, :p].T @ theta).max()
        s = min(1.0, LAM / dual_norm)
        dual = s * y_tilde @ theta - 0.5 * s**2 * theta @ theta
        gap = certificate.gap(torch.from_numpy(w), primal)
        assert gap == pytest.approx(primal - dual, rel=1e-9, abs=1e-12)
        assert gap >= primal - solution.objective - 1e-12  # a valid bound on the suboptimality


def test_lowrank_optimum_is_a_prox_gradient_fixed_point():
    problem = small_lowrank()
    solution = minimize(problem)
    hessian, linear, _ = problem.quadratic()
    lipschitz = float(torch.linalg.eigvalsh(hessian)[-1])
    w = solution.w
    mapped = problem.regularizer.prox(w - (hessian @ w - linear) / lipschitz, 1.0 / lipschitz)
    assert float((mapped - w).abs().max()) <= 1e-8
    # the nuclear norm is active: the optimum is low rank, close to the rank-2 truth
    sv = torch.linalg.svdvals(w.reshape(6, 5))
    assert int((sv > 1e-8).sum()) < 5


def test_lasso_optimum_is_a_prox_gradient_fixed_point_and_kkt():
    problem = small_lasso()
    w = minimize(problem).w
    hessian, linear, _ = problem.quadratic()
    gradient = (hessian @ w - linear).numpy()
    w = w.numpy()
    nonzero = w != 0
    # KKT of the Lasso: ∇f + λ sign(w) = 0 on the support, |∇f| ≤ λ off it
    np.testing.assert_allclose(gradient[nonzero], -LAM * np.sign(w[nonzero]), atol=1e-7)
    assert np.all(np.abs(gradient[~nonzero]) <= LAM + 1e-7)


def test_ball_domain_solution_is_feasible_and_a_fixed_point():
    free = minimize(small_lasso())
    radius = 0.5 * float(torch.linalg.vector_norm(free.w))
    problem = small_lasso(domain_radius=radius)
    solution = minimize(problem)
    assert float(torch.linalg.vector_norm(solution.w)) <= radius * (1 + 1e-12)
    assert np.isnan(solution.gap)
    assert solution.objective >= free.objective  # a constrained optimum cannot beat the free one
    hessian, linear, _ = problem.quadratic()
    step = 1.0 / float(torch.linalg.eigvalsh(hessian)[-1])
    w = solution.w
    mapped = problem.regularizer.prox(w - step * (hessian @ w - linear), step)
    assert float((mapped - w).abs().max()) <= 1e-6


def test_solve_caches_in_memory_and_on_disk(monkeypatch, _isolated_stores):
    monkeypatch.setattr(reference, "_MEMORY", {})
    problem = small_lasso()
    first = solve(problem)
    assert solve(problem) is first
    files = list(_isolated_stores.rglob("*.pt"))
    assert len(files) == 1
    assert files[0].parent == reference.cache_dir()
    # A fresh process (empty memory) reads the disk file instead of solving again.
    monkeypatch.setattr(reference, "_MEMORY", {})

    def no_solving(*args, **kwargs):
        raise AssertionError("solve() re-solved although a disk cache file exists")

    monkeypatch.setattr(reference, "minimize", no_solving)
    again = solve(small_lasso())  # a new instance of the same data shares the key
    assert again is not first
    assert torch.equal(again.w, first.w) and again.objective == first.objective and again.gap == first.gap
    # Different data (another data seed) is another key: it must be solved.
    with pytest.raises(AssertionError, match="re-solved"):
        solve(fedbench.make_problem("lasso", seed=1, clients=8, samples_per_client=20, dim=30, support=10, lam=LAM))


def test_instance_key_ignores_init_and_trial_seed_beyond_the_data():
    a = fedbench.make_problem("lasso", seed=0, clients=2, samples_per_client=5, dim=4, support=2, data_seed=3)
    b = fedbench.make_problem("lasso", seed=9, clients=2, samples_per_client=5, dim=4, support=2, data_seed=3,
                              init="zeros")
    c = fedbench.make_problem("lasso", seed=0, clients=2, samples_per_client=5, dim=4, support=2, data_seed=4)
    d = fedbench.make_problem("lasso", seed=0, clients=2, samples_per_client=5, dim=4, support=2, data_seed=3,
                              lam=0.5)
    assert a.instance_key() == b.instance_key()
    assert a.instance_key() != c.instance_key()
    assert a.instance_key() != d.instance_key()
