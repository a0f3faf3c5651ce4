"""pFedFBE (the pFedFBE paper, ICLR 2023 submission, §2.1–2.2, Algorithm 1), pFedMe (T Dinh, Tran, Nguyen,
NeurIPS 2020, Algorithm 1) and FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, MLSys 2020): the pFedFBE
direction is the gradient of the FBE (eq. 5–6) with full batches, its HVP options agree, it reduces to FedMiD's
client step with η = 1/λ and no Hessian term, it refuses λ ≤ L; pFedMe's inner loop solves the Moreau subproblem;
FedProx with μ = 0 is FedAvg; the personal models are what the papers define."""
from __future__ import annotations

import pytest
import torch

import fedbench
from fedbench.algorithms.base import per_client_copies
from fedbench.engine.simulate import Federation, Simulation, simulate
from fedbench.rng import generator
from small_problems import small_lasso, small_lowrank


def one_client_problem(lam=0.05, **overrides):
    """A Lasso whose single client's full batch is 40 samples (so a local step sees f_i exactly; more samples than
    the 30 coordinates, so that the reference solver's optimum is unique with h = 0 too)."""
    return small_lasso(clients=1, samples_per_client=40, lam=lam, **overrides)


def fbe(problem, w, lam):
    """F_1(w) of eq. (5) for the single client, written out with autograd-able ops (the ℓ1 prox is smooth away
    from its kinks)."""
    x, y = problem.features, problem.labels
    loss = 0.5 * (x @ w - y).square().mean()
    grad = torch.autograd.grad(loss, w, create_graph=True)[0]
    shifted = w - grad / lam
    target = problem.regularizer.prox(shifted, 1 / lam)
    return loss - grad.square().sum() / (2 * lam) + problem.regularizer.value(target) + lam / 2 * (
        target - shifted).square().sum()


@pytest.mark.parametrize("h_weight", [0.0, 0.05])
def test_full_batch_direction_is_the_gradient_of_the_fbe(h_weight):
    problem = one_client_problem(lam=h_weight)
    lam, lr = 400.0, 1e-3
    algorithm = fedbench.make_algorithm("pfedfbe", problem, client_lr=lr, lam=lam, hvp="exact")
    sim = Simulation(problem, algorithm, Federation(1, 1, 1, 40), seed=0)
    w0 = sim.server["w"].clone()
    sim.run_round()
    direction = (w0 - sim.server["w"]) / lr
    point = w0.clone().requires_grad_(True)
    want = torch.autograd.grad(fbe(problem, point, lam), point)[0]
    torch.testing.assert_close(direction, want, rtol=1e-9, atol=1e-9)
    # the logged FBE objective is eq. (5) at the global w
    assert sim.evaluate()["fbe_objective"] == pytest.approx(float(fbe(problem, sim.server["w"].clone()
                                                                         .requires_grad_(True), lam)), rel=1e-12)


def test_hvp_options_agree_on_least_squares():
    problem = small_lasso()

    def final(hvp, hvp_batch="same"):
        algorithm = fedbench.make_algorithm("pfedfbe", problem, client_lr=1e-3, lam=300.0, hvp=hvp,
                                            hvp_batch=hvp_batch)
        return simulate(problem, algorithm, Federation(3, 4, 5, 6), seed=1).params

    exact = final("exact")
    torch.testing.assert_close(final("autograd"), exact, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final("finite_diff"), exact, rtol=1e-6, atol=1e-6)
    independent = final("exact", "independent")  # an independent D̂ changes the iterates
    assert not torch.allclose(independent, exact)
    torch.testing.assert_close(final("finite_diff", "independent"), independent, rtol=1e-6, atol=1e-6)


def test_first_order_pfedfbe_with_step_one_over_lambda_is_fedmids_client_step():
    """With η = 1/λ (as in every experiment of the pFedFBE paper, §4) and no Hessian term, the step of eq. (9) is
    w⁺ = w − η·λ(w − T(w)) = prox_{h/λ}(w − ∇f̃/λ)."""
    problem = small_lasso()
    lam = 250.0
    federation = Federation(4, 3, 5, 6)
    fbe_run = simulate(problem, fedbench.make_algorithm("pfedfbe", problem, client_lr=1 / lam, lam=lam, hvp="none"),
                       federation, seed=2)
    mid_run = simulate(problem, fedbench.make_algorithm("fedmid", problem, client_lr=1 / lam,
                                                        server_threshold="none"), federation, seed=2)
    torch.testing.assert_close(fbe_run.params, mid_run.params, rtol=1e-12, atol=1e-12)


def test_personal_models_are_one_prox_gradient_step_on_full_data():
    problem = small_lasso(personal_support=2)
    lam = 300.0
    algorithm = fedbench.make_algorithm("pfedfbe", problem, client_lr=1e-3, lam=lam)
    result = simulate(problem, algorithm, Federation(3, 4, 2, 5), seed=0)
    n = problem.config["samples_per_client"]
    x = problem.features.view(problem.num_clients, n, -1)
    y = problem.labels.view(problem.num_clients, n)
    w = result.params
    for k in range(problem.num_clients):
        grad = x[k].T @ (x[k] @ w - y[k]) / n
        torch.testing.assert_close(result.personal[k], problem.regularizer.prox(w - grad / lam, 1 / lam),
                                   rtol=1e-12, atol=1e-12)
    assert "personal_f1" in result.final and "fbe_objective" in result.final


def test_pfedfbe_refuses_lambda_below_the_smoothness():
    problem = small_lasso()
    hessian_max = max(float(torch.linalg.eigvalsh(x.T @ x / x.shape[0])[-1])
                      for x in problem.features.view(problem.num_clients, -1, problem.dim))
    algorithm = fedbench.make_algorithm("pfedfbe", problem, lam=0.9 * hessian_max)
    with pytest.raises(ValueError, match=r"λ = [\d.]+ must exceed the clients' smoothness L ≈ ([\d.]+)") as refused:
        Simulation(problem, algorithm, Federation(1, 2, 1, 5), seed=0)
    estimate = float(refused.value.args[0].split("L ≈ ")[1].split(" ")[0])
    assert estimate == pytest.approx(hessian_max, rel=1e-3)
    anyway = fedbench.make_algorithm("pfedfbe", problem, lam=0.9 * hessian_max, allow_small_lambda=True)
    Simulation(problem, anyway, Federation(1, 2, 1, 5), seed=0)
    Simulation(problem, fedbench.make_algorithm("pfedfbe", problem, lam=1.1 * hessian_max), Federation(1, 2, 1, 5),
               seed=0)


def test_last_local_personal_point_uses_each_clients_last_iterate():
    problem = small_lasso()
    algorithm = fedbench.make_algorithm("pfedfbe", problem, client_lr=1e-3, lam=300.0, personal_point="last_local")
    sim = Simulation(problem, algorithm, Federation(2, 3, 2, 5), seed=0)
    w0 = sim.server["w"].clone()
    sim.run_round()
    moved = (sim.clients["w_last"] != w0).any(-1)
    assert int(moved.sum()) == 3  # the sampled clients' rows hold their last local iterate
    targets = algorithm.forward_backward(sim.clients["w_last"])[0]
    torch.testing.assert_close(algorithm.personal_params(sim.server, sim.clients), targets)


# -- pFedMe -------------------------------------------------------------------------------------------------------------

def test_pfedme_inner_loop_converges_to_the_moreau_prox_of_a_quadratic():
    """With h = 0, θ ← θ − η_p(∇f(θ) + λ(θ − w)) on full data solves (H + λI)θ = Hw* ... in closed form."""
    problem = small_lowrank(lam=0.0)
    lam = 5.0
    algorithm = fedbench.make_algorithm("pfedme", problem, lam=lam, personal_lr=0.02)
    everyone = torch.arange(problem.num_clients)
    anchor = torch.randn(problem.num_clients, problem.dim, dtype=torch.float64, generator=generator(0, "w"))
    theta = anchor.clone()
    for _ in range(3000):
        theta = algorithm.inner_step(theta, anchor, problem.client_grad(theta, everyone), algorithm.hp)
    n = problem.config["samples_per_client"]
    x = problem.features.view(problem.num_clients, n, -1)
    y = problem.labels.view(problem.num_clients, n)
    eye = torch.eye(problem.dim, dtype=torch.float64)
    for k in range(problem.num_clients):
        closed = torch.linalg.solve(x[k].T @ x[k] / n + lam * eye, x[k].T @ y[k] / n + lam * anchor[k])
        torch.testing.assert_close(theta[k], closed, rtol=1e-9, atol=1e-9)


def test_pfedme_round_matches_a_written_out_loop():
    problem = small_lasso()
    hp = dict(client_lr=0.01, personal_lr=0.02, lam=3.0, inner_steps=3, beta=0.7, hidden_decay=True)
    algorithm = fedbench.make_algorithm("pfedme", problem, **hp)
    federation = Federation(1, 3, 2, 5)
    sim = Simulation(problem, algorithm, federation, seed=0)
    w0 = sim.server["w"].clone()
    replay = Simulation(problem, fedbench.make_algorithm("pfedme", problem, **hp), federation, seed=0)
    clients, rows = replay.sampler.draw(2)
    sim.run_round()
    uploads = []
    for j, client in enumerate(clients.tolist()):
        w_loc, theta = w0.clone(), w0.clone()
        for step in range(2):
            x, y = problem.gather(rows["D"][step, j: j + 1])
            for _ in range(3):
                grad = x[0].T @ (x[0] @ theta - y[0]) / 5
                theta = theta - 0.02 * (grad + problem.regularizer.subgradient(theta) + 3.0 * (theta - w_loc)
                                        + 1e-3 * theta)
            w_loc = w_loc - 0.01 * 3.0 * (w_loc - theta)
        uploads.append(w_loc)
        torch.testing.assert_close(sim.clients["theta"][client], theta, rtol=1e-12, atol=1e-12)
    expected = 0.3 * w0 + 0.7 * torch.stack(uploads).mean(0)
    torch.testing.assert_close(sim.server["w"], expected, rtol=1e-12, atol=1e-12)
    untouched = [k for k in range(problem.num_clients) if k not in clients.tolist()]
    assert torch.equal(sim.clients["theta"][untouched], per_client_copies(w0, len(untouched)))


def test_pfedme_resolved_personal_models_start_from_the_current_global_model():
    problem = small_lasso()
    algorithm = fedbench.make_algorithm("pfedme", problem, personal_eval="resolve", lam=2.0, personal_lr=0.01)
    sim = Simulation(problem, algorithm, Federation(1, 3, 2, 5), seed=0)
    sim.run_round()
    everyone = torch.arange(problem.num_clients)
    theta = per_client_copies(sim.server["w"], problem.num_clients)
    anchor = theta.clone()
    for _ in range(algorithm.hp.inner_steps):
        theta = algorithm.inner_step(theta, anchor, problem.client_grad(theta, everyone), algorithm.hp)
    torch.testing.assert_close(algorithm.personal_params(sim.server, sim.clients), theta)


# -- FedProx ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("h_mode", ["subgradient", "prox"])
def test_fedprox_with_zero_mu_is_fedavg(h_mode):
    problem = small_lasso()
    federation = Federation(5, 3, 4, 5)
    prox = simulate(problem, fedbench.make_algorithm("fedprox", problem, client_lr=0.01, prox_mu=0.0,
                                                     h_mode=h_mode), federation, seed=3)
    if h_mode == "subgradient":
        avg = simulate(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.01), federation, seed=3)
    else:  # FedAvg with prox local steps is FedMiD without a server prox
        avg = simulate(problem, fedbench.make_algorithm("fedmid", problem, client_lr=0.01, server_threshold="none"),
                       federation, seed=3)
    torch.testing.assert_close(prox.params, avg.params, rtol=1e-12, atol=1e-12)


def test_fedprox_personal_model_is_the_last_local_iterate_or_the_global_model():
    problem = small_lasso()
    algorithm = fedbench.make_algorithm("fedprox", problem, client_lr=0.01, prox_mu=0.1)
    sim = Simulation(problem, algorithm, Federation(1, 3, 2, 5), seed=0)
    replay = Simulation(problem, fedbench.make_algorithm("fedprox", problem, client_lr=0.01, prox_mu=0.1),
                        Federation(1, 3, 2, 5), seed=0)
    clients = replay.sampler.draw(2)[0].tolist()
    sim.run_round()
    personal = algorithm.personal_params(sim.server, sim.clients)
    for k in range(problem.num_clients):
        if k in clients:
            assert not torch.equal(personal[k], sim.server["w"])
            torch.testing.assert_close(personal[k], sim.clients["last"][k])
        else:
            assert torch.equal(personal[k], sim.server["w"])
