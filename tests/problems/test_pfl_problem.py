"""The block problem `pfl_synthetic` of Hanzely, Zhao, Kolar (TMLR 2023, §2, §5.1–5.2): the block gradients
of every objective (mx2, mt2, apfl2, ews) against autograd of the block loss, with and without the
reparametrisation w/√M and its chain rule; the reference solver's gradient, Hessian and certified F* against
torch.func and an independent NumPy objective minimised by SciPy's L-BFGS; the equivalence of (9), (10) and (11)
at the optimum; the constants and Thm 8/9 parameter rules against the values the authors' code gives on its data;
the capability contract; and the metrics (objective, gap, both estimation errors) against NumPy."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.optimize
import torch
from scipy.special import expit

from fedbench.algorithms import ALGORITHMS
from fedbench.algorithms.pfl_rules import rules
from fedbench.contract import IncompatibleError
from fedbench.data import pfl_synthetic
from fedbench.problems import make_problem
from fedbench.reference import solve
from sweeps.recipe import RecipeError, load

M = pfl_synthetic.DEVICES

# (preset, objective, extra config, σ_h): every objective of the paper's §2 the problem offers, with two Λ for mt2 and
# two α for apfl2; ews only on S2's data
OBJECTIVE_CASES = {
    "mx2": ("s1", "mx2", {}, 0.3),
    "mt2-Λ1": ("s1", "mt2", {"big_lambda": 1.0}, 0.3),
    "mt2-Λ10": ("s1", "mt2", {"big_lambda": 10.0}, 0.3),
    "apfl2-α0.1": ("s1", "apfl2", {"alpha": 0.1}, 0.3),
    "apfl2-α0.3": ("s1", "apfl2", {"alpha": 0.3}, 0.3),
    "ews": ("s2", "ews", {}, 5.0),
}

# F* of (11) (S1, the code's λ = 1e-2/σ_h) and of (16) (S2) on the authors' data: L-BFGS, gradient norm < 1e-8
L_BFGS_OPTIMA = [("s1", 0.1, 0.275408), ("s1", 0.3, 0.340562), ("s1", 1.0, 0.280405),
               ("s2", 5.0, 0.583665), ("s2", 10.0, 0.440731), ("s2", 15.0, 0.339393)]


def problem_of(case: str, **config):
    preset, objective, extra, sigma_h = OBJECTIVE_CASES[case]
    return make_problem("pfl_synthetic", preset=preset, sigma_h=sigma_h, objective=objective, **{**extra, **config})


def rows_of(devices: list[int], batch: int, gen: torch.Generator) -> torch.Tensor:
    """Flat row indices `[S, b]`: `batch` random samples of each of `devices` (every device holds n rows)."""
    picks = torch.randint(pfl_synthetic.SAMPLES, (len(devices), batch), generator=gen)
    return torch.tensor(devices)[:, None] * pfl_synthetic.SAMPLES + picks


def random_point(problem, gen: torch.Generator, devices: int, scale: float = 1.0):
    w = scale * torch.randn(problem.dim_w, dtype=torch.float64, generator=gen)
    beta = scale * torch.randn(devices, problem.dim_beta, dtype=torch.float64, generator=gen)
    return w, beta


# -- an independent NumPy transcription of the objectives of the paper's §2 in natural variables ---------------
def numpy_objective(problem, z: np.ndarray) -> tuple[float, np.ndarray]:
    """F(w̃, β) = (1/M) Σ_m f_m and its gradient at z = [w̃; β_1; …; β_M], with f'_m the mean binary cross-entropy
    of σ(xᵀθ) (the authors' code's link; §5.1 prints the opposite sign) and f_m as written in the paper's §2, (8),
    (11), (14), (16)."""
    obj = problem.objective
    x, y = problem.x.numpy(), problem.y.numpy()
    devices, samples, _ = x.shape
    d_w = problem.dim_w
    w, beta = z[:d_w], z[d_w:].reshape(devices, -1)
    w_m = np.broadcast_to(w, (devices, d_w))

    def loss_and_grad(theta):  # f'_m(θ_m) [M], ∇f'_m(θ_m) [M, d]
        s = np.einsum("mnd,md->mn", x, theta)
        return (np.logaddexp(0, s) - y * s).mean(1), np.einsum("mn,mnd->md", expit(s) - y, x) / samples

    if obj.kind == "ews":
        f, g = loss_and_grad(np.concatenate([w_m, beta], 1))
        g_w, g_beta = g[:, :d_w], g[:, d_w:]
    elif obj.kind == "apfl2":
        f_w, g_w = loss_and_grad(w_m)
        f_mix, g_mix = loss_and_grad((1 - obj.alpha) * beta + obj.alpha * w_m)
        f = obj.big_lambda * f_w + f_mix
        g_w, g_beta = obj.big_lambda * g_w + obj.alpha * g_mix, (1 - obj.alpha) * g_mix
    else:  # mx2 and mt2: f'_m(β_m) [+ Λ f'_m(w̃)] + (λ/2)‖β_m − w̃‖²
        f, g_beta = loss_and_grad(beta)
        diff = beta - w_m
        f = f + 0.5 * obj.lam * np.square(diff).sum(1)
        g_w, g_beta = -obj.lam * diff, g_beta + obj.lam * diff
        if obj.kind == "mt2":
            f_w, g_ww = loss_and_grad(w_m)
            f, g_w = f + obj.big_lambda * f_w, g_w + obj.big_lambda * g_ww
    return float(f.mean()), np.concatenate([g_w.mean(0), g_beta.ravel() / devices])


def logistic_parts(x: np.ndarray, y: np.ndarray, theta: np.ndarray):
    """Per device: f'_m(θ_m), ∇f'_m(θ_m), ∇²f'_m(θ_m)."""
    s = np.einsum("mnd,md->mn", x, theta)
    p = expit(s)
    samples = x.shape[1]
    hessian = np.einsum("mn,mnd,mne->mde", p * (1 - p), x, x) / samples
    return (np.logaddexp(0, s) - y * s).mean(1), np.einsum("mn,mnd->md", p - y, x) / samples, hessian


def damped_newton(value_grad_hess, start: np.ndarray, iterations: int = 50) -> np.ndarray:
    z = start
    for _ in range(iterations):
        value, gradient, hessian = value_grad_hess(z)
        if np.abs(gradient).max() < 1e-13:
            break
        direction = -np.linalg.solve(hessian, gradient)
        step = 1.0
        while value_grad_hess(z + step * direction)[0] > value + 1e-4 * step * gradient @ direction and step > 1e-10:
            step /= 2
        z = z + step * direction
    return z


# -- 1. block gradients ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("reparam", [True, False], ids=["reparam", "plain"])
@pytest.mark.parametrize("case", list(OBJECTIVE_CASES))
def test_block_gradients_match_autograd_of_the_block_loss(case, reparam):
    problem = problem_of(case, reparam=reparam)
    assert problem.w_scale == (M**-0.5 if reparam else 1.0)
    gen = torch.Generator().manual_seed(3)
    for devices, batch in [(list(range(M)), 4), ([2, 5, 11], 1), ([0, 19], 7)]:
        oracle = problem.step_oracle(rows_of(devices, batch, gen))
        for shared in (True, False):
            w, beta = random_point(problem, gen, len(devices))
            if not shared:  # a per-device copy of the stored w [S, d_w], as the local methods keep
                w = w + 0.3 * torch.randn(len(devices), problem.dim_w, dtype=torch.float64, generator=gen)
            g_w, g_beta = oracle.block_grads(w, beta)
            assert g_w.shape == (len(devices), problem.dim_w) and g_beta.shape == beta.shape
            # ∂f_m/∂w of each device separately (a Jacobian of the [S] losses for a shared w), in stored variables
            if shared:
                expected_w = torch.func.jacrev(lambda u: oracle.block_loss(u, beta))(w)
            else:
                expected_w = torch.func.grad(lambda u: oracle.block_loss(u, beta).sum())(w)
            expected_beta = torch.func.grad(lambda b: oracle.block_loss(w, b).sum())(beta)  # f_m depends on β_m only
            torch.testing.assert_close(g_w, expected_w, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(g_beta, expected_beta, rtol=1e-12, atol=1e-12)
            assert g_w.abs().max() > 1e-3 and g_beta.abs().max() > 1e-3  # a point where the check has teeth
            no_w, beta_only = oracle.block_grads(w, beta, need_w=False)
            assert no_w is None
            torch.testing.assert_close(beta_only, g_beta, rtol=0, atol=1e-15)


@pytest.mark.parametrize("case", list(OBJECTIVE_CASES))
def test_reparametrisation_is_the_chain_rule(case):
    """§2 (eqs. 8, 11, 14, 16), §6.3: with reparam, f_m sees w/√M, so ∇_w = (1/√M)·(the plain gradient at
    w̃ = w/√M) and ∇_β and the loss are those of the plain problem at w̃."""
    reparam, plain = problem_of(case, reparam=True), problem_of(case, reparam=False)
    gen = torch.Generator().manual_seed(5)
    rows = rows_of(list(range(M)), 5, gen)
    w, beta = random_point(reparam, gen, M, scale=2.0)
    g_w, g_beta = reparam.step_oracle(rows).block_grads(w, beta)
    p_w, p_beta = plain.step_oracle(rows).block_grads(w / math.sqrt(M), beta)
    torch.testing.assert_close(g_w, p_w / math.sqrt(M), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_beta, p_beta, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(reparam.step_oracle(rows).block_loss(w, beta),
                               plain.step_oracle(rows).block_loss(w / math.sqrt(M), beta), rtol=1e-14, atol=0)
    # the full-data gradients in stored variables are the per-device parts of the natural flat gradient
    everyone = torch.arange(M)
    c_w, c_beta = reparam.client_block_grads(w, beta, everyone)
    flat = reparam.flat_gradient(torch.cat([w / math.sqrt(M), beta.flatten()]))
    torch.testing.assert_close(math.sqrt(M) * c_w.mean(0), flat[: reparam.dim_w], rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(c_beta.flatten() / M, flat[reparam.dim_w:], rtol=1e-12, atol=1e-15)


# -- 2. the reference solver's objective, gradient and Hessian -----------------------------------------------
@pytest.mark.parametrize("case", list(OBJECTIVE_CASES))
def test_flat_objective_gradient_and_hessian(case):
    problem = problem_of(case)
    gen = torch.Generator().manual_seed(7)
    z = 0.7 * torch.randn(problem.dim_w + M * problem.dim_beta, dtype=torch.float64, generator=gen)
    # the value and gradient on all data: torch.func and the NumPy transcription of the paper's §2
    value, gradient = numpy_objective(problem, z.numpy())
    assert float(problem.flat_objective(z)) == pytest.approx(value, rel=1e-13)
    torch.testing.assert_close(problem.flat_gradient(z), torch.func.grad(problem.flat_objective)(z),
                               rtol=1e-11, atol=1e-15)
    np.testing.assert_allclose(problem.flat_gradient(z).numpy(), gradient, rtol=1e-11, atol=1e-15)
    # the Hessian (d_w + d_β forward-mode derivatives) against torch.func.hessian, on 100 samples per device (the
    # same code path; the full-size dense Hessian by autograd takes ~15 s)
    problem.x, problem.y = problem.x[:, :100].contiguous(), problem.y[:, :100].contiguous()
    hessian = problem.flat_hessian(z)
    expected = torch.func.hessian(problem.flat_objective)(z)
    assert hessian.abs().max() > 1e-4
    torch.testing.assert_close(hessian, expected, rtol=1e-10, atol=1e-15)


# -- 3. the certified optimum --------------------------------------------------------------------------------
@pytest.mark.parametrize("preset, sigma_h", [("s1", 1.0), ("s2", 5.0)])
def test_newton_optimum_agrees_with_scipy_lbfgs(preset, sigma_h):
    problem = make_problem("pfl_synthetic", preset=preset, sigma_h=sigma_h)
    solution = solve(problem, use_disk=False)
    assert solution.gap <= 1e-10 * max(1.0, solution.objective)
    size = problem.dim_w + M * problem.dim_beta
    result = scipy.optimize.minimize(lambda z: numpy_objective(problem, z), np.zeros(size), method="L-BFGS-B",
                                     jac=True, options=dict(gtol=1e-12, ftol=1e-15, maxiter=20_000, maxcor=30))
    assert result.fun == pytest.approx(solution.objective, abs=1e-8)
    assert solution.objective <= result.fun + 1e-12  # the certified point is at least as good
    # F is strongly convex (μ ~ 1e-5): the minimisers agree too
    assert np.abs(result.x - solution.w.numpy()).max() < 1e-3
    assert float(problem.flat_gradient(solution.w).norm()) < 1e-9


@pytest.mark.parametrize("preset, sigma_h, optimum", L_BFGS_OPTIMA)
def test_reference_optimum_matches_an_independent_l_bfgs_solve(preset, sigma_h, optimum):
    """F* of (11) and (16) on the authors' data (Figs. 1–2) by an independent L-BFGS solve, also a check on the
    data generator: here to its 6 printed decimals."""
    problem = make_problem("pfl_synthetic", preset=preset, sigma_h=sigma_h)
    assert solve(problem, use_disk=False).objective == pytest.approx(optimum, abs=1e-6)


@pytest.mark.parametrize("sigma_h, optimum", [(0.1, 0.270455), (0.3, 0.331481)])
def test_the_papers_lambda_rule(sigma_h, optimum):
    """§5.1: the paper's λ = σ_h·1e-2 instead of the authors' code's 1e-2/σ_h; F* by L-BFGS on the same data."""
    problem = make_problem("pfl_synthetic", preset="s1", sigma_h=sigma_h, lam_rule="paper")
    assert problem.objective.lam == pytest.approx(1e-2 * sigma_h, rel=1e-15)
    assert problem.mixture_penalty == problem.objective.lam
    assert solve(problem, use_disk=False).objective == pytest.approx(optimum, abs=1e-6)


# -- 4. (9), (10) and (11) ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("sigma_h", [0.1, 0.3, 1.0])
def test_mixture_objectives_9_10_11_are_equivalent(sigma_h):
    """§2.4: at the optimum of (11) w̃* = β̄*; minimising (9) over β alone (independent NumPy Newton)
    gives the same value and the same β*; the inner problems of (10) at w̃* give β* back and the same value; and in
    stored variables with reparam the point (√M·β̄*, β*) is stationary."""
    problem = make_problem("pfl_synthetic", preset="s1", sigma_h=sigma_h, objective="mx2", reparam=True)
    lam, d = problem.objective.lam, problem.dim_beta
    solution = solve(problem, use_disk=False)
    w_star = solution.w[: problem.dim_w].numpy()
    beta_star = solution.w[problem.dim_w:].view(M, d).numpy()
    np.testing.assert_allclose(w_star, beta_star.mean(0), rtol=0, atol=1e-9)
    x, y = problem.x.numpy(), problem.y.numpy()

    def objective_9(flat):  # (1/M) Σ f'_m(β_m) + (λ/(2M)) Σ ‖β̄ − β_m‖², its gradient and Hessian
        beta = flat.reshape(M, d)
        centred = beta - beta.mean(0)
        f, g, h = logistic_parts(x, y, beta)
        value = f.mean() + lam / (2 * M) * np.square(centred).sum()
        hessian = scipy.linalg.block_diag(*h) / M + lam / M * np.kron(np.eye(M) - np.full((M, M), 1 / M), np.eye(d))
        return value, (g + lam * centred).ravel() / M, hessian

    beta_9 = damped_newton(objective_9, np.zeros(M * d)).reshape(M, d)
    assert objective_9(beta_star.ravel())[0] == pytest.approx(solution.objective, abs=1e-13)
    assert objective_9(beta_9.ravel())[0] == pytest.approx(solution.objective, abs=1e-12)
    np.testing.assert_allclose(beta_9, beta_star, rtol=0, atol=1e-6)

    def inner_10(flat):  # Σ_m [f'_m(β_m) + (λ/2)‖β_m − w̃*‖²]: the devices' independent problems of (10) at w̃*
        beta = flat.reshape(M, d)
        f, g, h = logistic_parts(x, y, beta)
        diff = beta - w_star
        return ((f + 0.5 * lam * np.square(diff).sum(1)).sum(), (g + lam * diff).ravel(),
                scipy.linalg.block_diag(*(h + lam * np.eye(d))))

    beta_10 = damped_newton(inner_10, np.zeros(M * d)).reshape(M, d)
    assert inner_10(beta_10.ravel())[0] / M == pytest.approx(solution.objective, abs=1e-12)
    np.testing.assert_allclose(beta_10, beta_star, rtol=0, atol=1e-6)

    # stored variables (§2.4): w = √M·w̃* = √M·β̄*; every block of ∇F vanishes there
    w_stored = math.sqrt(M) * torch.from_numpy(beta_star.mean(0))
    g_w, g_beta = problem.client_block_grads(w_stored, torch.from_numpy(beta_star), torch.arange(M))
    # (the certificate gap ≤ 1e-10 with λ_min(∇²F) ~ 1e-5 leaves ‖∇F‖ up to ~5e-8)
    assert float(g_w.mean(0).abs().max()) < 1e-9 and float(g_beta.abs().max()) / M < 1e-8
    loss = problem.full_data(torch.arange(M)).block_loss(w_stored, torch.from_numpy(beta_star)).mean()
    assert float(loss) == pytest.approx(solution.objective, abs=1e-13)


# -- 5. constants and parameter rules ----------------------------------------------------------------------------
# what the rules of the authors' code (`Synthetic/MX2/`) give on its data: σ_h → (λ, μ', p_w, ρ, 𝓛, η, θ1, γ,
# 1 − ν, ASCD θ)
S1_TABLE = {
    0.1: (0.1, 5.33e-4, 0.1579, 1.58e-4, 0.0633, 3.947, 0.333, 2.961, 2.6e-5, 0.253),
    0.3: (0.0333, 7.38e-4, 0.0667, 6.67e-5, 0.0500, 5.000, 0.5, 2.500, None, 0.200),
    1.0: (0.01, 6.07e-4, 0.0221, 2.21e-5, 0.0453, 5.515, 0.5, 2.757, None, 0.181),
}


@pytest.mark.parametrize("sigma_h", list(S1_TABLE))
def test_s1_constants_and_rules_give_the_authors_codes_values(sigma_h):
    lam, mu_prime, p_w, rho, smooth, eta, theta1, gamma, one_minus_nu, theta = S1_TABLE[sigma_h]
    problem = make_problem("pfl_synthetic", preset="s1", sigma_h=sigma_h)
    c, r = problem.constants, rules(problem)
    assert problem.objective.lam == pytest.approx(lam, rel=2e-3)
    assert problem.mu_prime == pytest.approx(mu_prime, rel=2e-3)
    assert problem.smooth_prime == pytest.approx(0.4333, abs=1e-4)  # the code's max‖x‖/4 (§5.1: max‖x‖²/4)
    # MX2 (Lemma 2 and §5.1): μ = μ'/(3M), 𝓛^w = λ/M, 𝓛^β = (𝓛'+λ)/M
    assert (c.mu, c.smooth_w, c.smooth_beta) == pytest.approx(
        (problem.mu_prime / (3 * M), problem.objective.lam / M, (problem.smooth_prime + problem.objective.lam) / M),
        rel=1e-14)
    got = (r.p_w, r.rho, r.smoothness, r.eta, r.theta1, r.gamma)
    assert got == pytest.approx((p_w, rho, smooth, eta, theta1, gamma), rel=2e-3)
    assert r.theta2 == 0.5 and r.smoothness == pytest.approx(2 * (c.smooth_w + c.smooth_beta), rel=1e-14)
    assert 1 - r.nu == pytest.approx(one_minus_nu if one_minus_nu else r.gamma * c.mu, rel=2e-2)
    assert 1 - r.nu < 1e-4  # ν ≈ 1
    assert min(0.8, 1 / r.eta) == pytest.approx(theta, rel=2e-3)
    assert ALGORITHMS["ascd_pfl"](problem).hp.coupling == pytest.approx(theta, rel=2e-3)


@pytest.mark.parametrize("sigma_h, theta1, gamma", [(5.0, 0.195, 5.43), (10.0, 0.166, 6.39), (15.0, 0.143, 7.41)])
def test_s2_constants_and_rules_give_the_authors_codes_values(sigma_h, theta1, gamma):
    """The authors' EWS code (`Synthetic/EWS/`, whose `mathcal_L_fun` slices rows, not columns): 𝓛'_w = 0.2758,
    𝓛'_β = 0.3154, 𝓛^w = 𝓛'_w/M, 𝓛^β = 𝓛'_β/M, μ = μ'/M."""
    problem = make_problem("pfl_synthetic", preset="s2", sigma_h=sigma_h)
    c, r = problem.constants, rules(problem)
    assert problem.smooth_prime == pytest.approx((0.2758, 0.3154), abs=1e-4)
    assert (c.mu, c.smooth_w, c.smooth_beta) == pytest.approx(
        (problem.mu_prime / M, problem.smooth_prime[0] / M, problem.smooth_prime[1] / M), rel=1e-14)
    assert problem.beta_scale == 1.0  # the EWS code's β-gradients are ∇_β f_m, not divided by M
    assert (r.p_w, r.rho, r.smoothness, r.eta) == pytest.approx((0.4665, 4.67e-4, 0.0591, 4.228), rel=2e-3)
    # to the 3 digits recorded (σ_h = 10: θ1 = 0.16548, recorded 0.166)
    assert r.theta1 == pytest.approx(theta1, abs=6e-4) and r.gamma == pytest.approx(gamma, abs=6e-3)
    assert min(0.8, 1 / r.eta) == pytest.approx(0.2365, rel=1e-3)
    # §5.1's rule max‖x‖²/4 over each block's columns: max‖x_g‖²/4 = 0.0185, max‖x_l‖²/4 = 0.0107
    paper = make_problem("pfl_synthetic", preset="s2", sigma_h=sigma_h, smoothness="paper")
    assert paper.smooth_prime == pytest.approx((0.0185, 0.0107), abs=1e-4)
    assert rules(paper).eta > 15 * r.eta  # "≈20× larger η"


def test_s1_paper_smoothness_squares_the_norm():
    """§5.1: 𝓛' = max‖x‖²/4 = 0.7511 with smoothness="paper" (the authors' code's is max‖x‖/4 = 0.4333)."""
    code = make_problem("pfl_synthetic", preset="s1", sigma_h=1.0)
    paper = make_problem("pfl_synthetic", preset="s1", sigma_h=1.0, smoothness="paper")
    assert paper.smooth_prime == pytest.approx(0.7511, abs=1e-4)
    assert paper.smooth_prime == pytest.approx(4 * code.smooth_prime**2, rel=1e-12)
    assert paper.constants.smooth_beta == pytest.approx((paper.smooth_prime + 0.01) / M, rel=1e-14)
    assert rules(paper).eta < rules(code).eta


@pytest.mark.parametrize("case", list(OBJECTIVE_CASES))
def test_lemma_constants_and_reparam_off_multiplies_the_w_constant_by_m(case):
    """Lemmas 1–4 (§2; the authors' code's values where a lemma and Table 2 differ) for every objective; without
    reparametrisation (§6.3, as the authors' code `CV/Reparametrization/` sets it) 𝓛^w is not divided by M, while μ
    and 𝓛^β are unchanged (p_w moves towards the w-block)."""
    problem, plain = problem_of(case), problem_of(case, reparam=False)
    obj, c, s, mu_p = problem.objective, problem.constants, problem.smooth_prime, problem.mu_prime
    lam, big, alpha = obj.lam, obj.big_lambda, obj.alpha
    if obj.kind == "mx2":
        expected = (mu_p / (3 * M), lam / M, (s + lam) / M)
    elif obj.kind == "mt2":
        expected = (lam / (2 * M), (big * s + lam) / M, (s + lam) / M)
    elif obj.kind == "apfl2":
        expected = (mu_p * (1 - alpha) ** 2 / M, (big + alpha**2) * s / M, (1 - alpha) ** 2 * s / M)
    else:
        expected = (mu_p / M, s[0] / M, s[1] / M)
    assert (c.mu, c.smooth_w, c.smooth_beta) == pytest.approx(expected, rel=1e-14)
    assert plain.constants.smooth_w == pytest.approx(M * c.smooth_w, rel=1e-14)
    assert (plain.constants.mu, plain.constants.smooth_beta) == (c.mu, c.smooth_beta)
    assert rules(plain).p_w > rules(problem).p_w


# -- 6. the capability contract --------------------------------------------------------------------------------
def test_incompatible_pairings_are_refused_naming_the_capability():
    pfl = make_problem("pfl_synthetic", preset="s1", sigma_h=1.0)
    with pytest.raises(IncompatibleError, match="fedavg requires global_evaluation"):
        ALGORITHMS["fedavg"](pfl)
    mt2 = make_problem("pfl_synthetic", preset="s1", sigma_h=1.0, objective="mt2")
    with pytest.raises(IncompatibleError, match="l2sgd_plus requires mixture"):
        ALGORITHMS["l2sgd_plus"](mt2)
    with pytest.raises(IncompatibleError, match="ascd_pfl requires block_objective"):
        ALGORITHMS["ascd_pfl"](make_problem("lasso"))
    # and the pairings that fit are accepted: L2SGD+ on mx2 (the mixture), ASCD on any block objective
    assert "mixture" in pfl.capabilities(pfl.config) and "mixture" not in mt2.capabilities(mt2.config)
    ALGORITHMS["l2sgd_plus"](pfl)
    ALGORITHMS["ascd_pfl"](mt2)


def test_a_recipe_pairing_fedavg_with_pfl_synthetic_is_refused(tmp_path):
    path = tmp_path / "fedavg_pfl.yaml"
    path.write_text("problem: {name: pfl_synthetic, preset: s1, sigma_h: 1.0}\n"
                    "federation: {rounds: 2, clients_per_round: 20, local_steps: 1, batch_size: 1}\n"
                    "algorithms:\n  fedavg: {client_lr: 0.01}\n")
    with pytest.raises(RecipeError) as refused:
        load(path)
    message = str(refused.value)
    assert "algorithms.fedavg" in message and "global_evaluation" in message and "pfl_synthetic" in message
    assert str(path) in message
    # the same recipe with a block method loads
    path.write_text(path.read_text().replace("fedavg: {client_lr: 0.01}", "ascd_pfl: {}"))
    assert [trial.algorithm for trial in load(path).trials()] == ["ascd_pfl"]


# -- 7. metrics --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset, sigma_h, rule", [("s1", 1.0, "code"), ("s2", 5.0, "code"), ("s1", 1.0, "paper"),
                                                   ("s2", 5.0, "paper")])
def test_evaluate_matches_numpy(preset, sigma_h, rule):
    """The authors' code: Σ_m‖β−β*_m‖² (s1, `Synthetic/MX2/`); ‖w̃−w*‖² + (1/M)Σ_m‖β−β*_m‖² (s2,
    `Synthetic/EWS/`); the paper (§5.1–5.2): ‖w̃−w*‖² + Σ_m‖β−β*_m‖²."""
    problem = make_problem("pfl_synthetic", preset=preset, sigma_h=sigma_h, estimation_error=rule)
    data = (pfl_synthetic.mx2 if preset == "s1" else pfl_synthetic.ews)(sigma_h)
    gen = np.random.default_rng(11)
    w = data.w_true + 0.5 * gen.standard_normal(data.w_true.shape)
    beta = data.beta_true + 0.5 * gen.standard_normal(data.beta_true.shape)
    row = problem.evaluate(torch.from_numpy(w), torch.from_numpy(beta))
    assert list(row) == ["objective", "objective_gap", "estimation_error"]
    value, _ = numpy_objective(problem, np.concatenate([w, beta.ravel()]))
    assert row["objective"] == pytest.approx(value, rel=1e-13)
    assert row["objective_gap"] == pytest.approx(value - solve(problem).objective, rel=1e-12)
    w_error, beta_errors = np.square(w - data.w_true).sum(), np.square(beta - data.beta_true).sum(1)
    expected = {("s1", "code"): beta_errors.sum(), ("s2", "code"): w_error + beta_errors.mean(),
                ("s1", "paper"): w_error + beta_errors.sum(), ("s2", "paper"): w_error + beta_errors.sum()}
    assert row["estimation_error"] == pytest.approx(expected[preset, rule], rel=1e-13)
    with pytest.raises(ValueError, match="devices' blocks"):
        problem.evaluate(torch.from_numpy(w))


@pytest.mark.parametrize("preset, sigma_h, error", [("s1", 0.1, 72.2), ("s1", 0.3, 79.3), ("s1", 1.0, 227.5),
                                                    ("s2", 5.0, 88.0), ("s2", 10.0, 332.1), ("s2", 15.0, 738.7)])
def test_metrics_at_the_zero_start(preset, sigma_h, error):
    """The curves stored with Figs. 1–2 (the authors' repository): every method starts at 0 (§5.1) with loss
    ln 2 = 0.6931 and these estimation errors (the code's definition)."""
    problem = make_problem("pfl_synthetic", preset=preset, sigma_h=sigma_h)
    start = problem.init_params(torch.Generator())
    assert not start.any()
    row = problem.evaluate(torch.zeros(problem.dim_w, dtype=torch.float64),
                           torch.zeros(M, problem.dim_beta, dtype=torch.float64))
    assert row["objective"] == pytest.approx(math.log(2), rel=1e-14)
    assert round(row["objective"], 4) == 0.6931
    optimum = {(p, s): f for p, s, f in L_BFGS_OPTIMA}[preset, sigma_h]
    assert row["objective_gap"] == pytest.approx(math.log(2) - optimum, abs=1e-6)
    # to the one decimal recorded (σ_h = 10: 332.0496, recorded 332.1)
    assert row["estimation_error"] == pytest.approx(error, abs=0.06)
