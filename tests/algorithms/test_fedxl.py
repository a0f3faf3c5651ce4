"""FeDXL2 and Local Pair (Guo, Jin, Luo, Yang, ICML 2023, §3.2, Algorithm 2, and the Local Pair baseline of §4) on
the `pauc` problem, against their definitions."""
from __future__ import annotations

import pytest
import torch

import fedbench
from fedbench.algorithms import ALGORITHMS
from fedbench.algorithms.xrisk import fedxl2_surrogate, local_pair_surrogate, pair_means, scatter_last
from fedbench.engine.federation import RoundSampler
from fedbench.engine.simulate import Federation, Simulation
from fedbench.rng import generator
from sweeps.driving import build_simulation
from sweeps.recipe import parse


def one_client(**config):
    defaults = dict(clients=1, positives_per_client=12, negatives_per_client=40, features=5, test_size=200)
    return fedbench.make_problem("pauc", seed=0, **{**defaults, **config})


@pytest.mark.parametrize("model", ["linear", "mlp"])
def test_fedxl2_without_staleness_is_the_gradient_of_the_pooled_compositional_objective(model):
    """With one client and passive scores equal to the current ones, G1 + G2 = ∇ mean_p f(mean_q ℓ(a_p, b_q))
    when u is the exact inner value (the active–passive decomposition of ∇F, §3.1–3.2)."""
    problem = one_client(model=model, hidden=6)
    oracle = problem.step_oracle(problem.draw_minibatches(torch.tensor([0]), 1, 16, generator(0, "mb"))[0])
    w = 0.5 * torch.randn(1, problem.dim, generator=generator(1, "w"))

    def pooled(a, b):  # F on this minibatch, with f = λ log
        return problem.config["kl_lambda"] * torch.log(pair_means(problem, a, b)).mean(-1)

    want, scores = oracle.surrogate_grad(w, pooled)
    a, b = scores[:, : oracle.positives], scores[:, oracle.positives:]
    c = problem.outer_grad(pair_means(problem, a, b))
    got, _ = oracle.surrogate_grad(w, lambda a_, b_: fedxl2_surrogate(problem, a_, b_, a, b, c, c))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    local, _ = oracle.surrogate_grad(w, lambda a_, b_: local_pair_surrogate(problem, a_, b_, c))
    torch.testing.assert_close(local, want, rtol=1e-5, atol=1e-7)  # Local Pair = FeDXL2 with no staleness
    assert got.abs().sum() > 0


def test_local_pair_with_one_client_is_centralized_sox():
    problem = one_client(noise_scale=0.0)
    lr, beta, gamma, rounds, steps, batch = 0.5, 0.1, 0.2, 3, 4, 8
    federation = Federation(rounds, 1, steps, batch)
    sim = Simulation(problem, fedbench.make_algorithm("local_pair", problem, client_lr=lr, beta=beta, gamma=gamma),
                     federation, seed=3)
    for _ in range(rounds):
        sim.run_round()

    sampler = RoundSampler(problem, federation, seed=3)  # the same draws, replayed
    w = problem.init_params(generator(3, "init")).clone()
    momentum = torch.zeros_like(w)
    u = torch.ones(12)
    lam = problem.config["kl_lambda"]
    for _ in range(rounds):
        rows = sampler.draw(steps)[1]["D"]
        for step in range(steps):
            x = problem.features[rows[step, 0]]
            pos = rows[step, 0, : batch // 2]
            wg = w.clone().requires_grad_(True)
            h = torch.sigmoid(x @ wg[:-1] + wg[-1])
            a, b = h[: batch // 2], h[batch // 2:]
            pairs = torch.exp((1 - (a[:, None] - b[None, :])).clamp_min(0) ** 2 / lam).mean(1)
            u_new = (1 - gamma) * u[pos] + gamma * pairs.detach()
            u[pos] = u_new
            (direction,) = torch.autograd.grad(((lam / u_new) * pairs).mean(), wg)
            momentum = (1 - beta) * momentum + beta * direction
            w = w - lr * momentum
    torch.testing.assert_close(sim.server["w"], w, rtol=1e-5, atol=1e-6)


def test_fedxl2_pools_communication_and_learning():
    problem = fedbench.make_problem("pauc", seed=0, clients=4, positives_per_client=10, negatives_per_client=50,
                                    features=6, test_size=600)
    s, k, b = 3, 5, 8
    result_sim = Simulation(problem, fedbench.make_algorithm("fedxl2", problem, client_lr=0.5, history_rounds=2),
                            Federation(6, s, k, b), seed=1, eval_every=6)
    rows = list(result_sim)
    fresh = s * k * b // 2
    server = result_sim.server
    assert len(server["pool_pos"]) == len(server["pool_u"]) == 2 * fresh and len(server["pool_neg"]) == 2 * fresh
    assert (server["pool_u"] > 0).all()
    d = problem.dim
    assert rows[-1]["comm_up"] == 6 * s * (2 * d + k * (b // 2) * 2 + k * (b - b // 2))  # w, G, scores, u
    assert rows[-1]["test_auc"] > rows[0]["test_auc"] and rows[-1]["objective"] < rows[0]["objective"]


def test_local_sgd_ce_is_fedavg_on_cross_entropy_and_decays_its_step():
    problem = one_client(clients=3, noise_scale=0.0)

    def final(name, rounds, **hp):
        sim = Simulation(problem, fedbench.make_algorithm(name, problem, **hp), Federation(rounds, 3, 3, 8), seed=2)
        list(sim)
        return sim.server["w"]

    torch.testing.assert_close(final("local_sgd_ce", 4, client_lr=0.2),
                               final("fedavg", 4, client_lr=0.2, subgradient=False))
    torch.testing.assert_close(final("local_sgd_ce", 2, client_lr=0.2, decay_every=6),
                               final("local_sgd_ce", 2, client_lr=0.2))  # the decay starts at iteration 6, round 2
    assert not torch.allclose(final("local_sgd_ce", 4, client_lr=0.2, decay_every=6),
                              final("local_sgd_ce", 4, client_lr=0.2))


def test_fedxl1_without_staleness_is_the_gradient_of_the_pooled_pairwise_objective():
    problem = one_client(task="auc", flip_rate=0.2)
    oracle = problem.step_oracle(problem.draw_minibatches(torch.tensor([0]), 1, 16, generator(0, "mb"))[0])
    w = 0.5 * torch.randn(1, problem.dim, generator=generator(1, "w"))
    want, scores = oracle.surrogate_grad(w, lambda a, b: torch.sigmoid(b[:, None, :] - a[:, :, None]).mean((1, 2)))
    a, b = scores[:, : oracle.positives], scores[:, oracle.positives:]
    one = torch.ones(())
    got, _ = oracle.surrogate_grad(w, lambda a_, b_: fedxl2_surrogate(problem, a_, b_, a, b, one, one))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_fedxl1_on_the_noisy_auc_task_communicates_scores_and_learns():
    problem = fedbench.make_problem("pauc", seed=0, preset="guo2023_noisy_auc", clients=4, positives_per_client=10,
                                    negatives_per_client=50, features=6, test_size=600)
    s, k, b = 3, 5, 8
    sim = Simulation(problem, fedbench.make_algorithm("fedxl1", problem, client_lr=2.0), Federation(6, s, k, b),
                     seed=1, eval_every=6)
    rows = list(sim)
    assert rows[-1]["comm_up"] == 6 * s * (problem.dim + k * b)  # w and every score of the round
    assert set(sim.server) == {"w", "pool_pos", "pool_neg"}
    assert rows[-1]["test_auc"] > rows[0]["test_auc"] and rows[-1]["objective"] < rows[0]["objective"]


def test_centralized_is_sox_on_the_pooled_data():
    federated = fedbench.make_problem("pauc", seed=0, clients=3, positives_per_client=5, negatives_per_client=20,
                                      features=4, test_size=300)
    pooled = fedbench.make_problem("pauc", seed=0, clients=3, positives_per_client=5, negatives_per_client=20,
                                   features=4, test_size=300, pooled=True)
    assert pooled.num_clients == 1 and int(pooled.positive_counts[0]) == 15 and len(pooled.features) == 75
    assert (pooled.labels[:15] == 1).all() and (pooled.labels[15:] == 0).all()
    # the same samples, each with its writer's noise mean
    key = lambda p: sorted(zip(p.features[:, 0].tolist(), p.row_source.tolist()))  # noqa: E731
    assert key(pooled) == key(federated)
    with pytest.raises(ValueError, match="centralized requires one_client") as refused:
        fedbench.make_algorithm("centralized", federated)
    assert "pooled" in refused.value.detail  # the longer explanation, shown under -v
    federation = Federation(3, 1, 4, 8)

    def final(name):
        sim = Simulation(pooled, fedbench.make_algorithm(name, pooled, client_lr=0.5), federation, seed=0)
        list(sim)
        return sim.server["w"]

    torch.testing.assert_close(final("centralized"), final("local_pair"))


def test_codasca_is_a_written_out_pesg_loop_with_control_variates():
    """Clients one by one, as LibAUC's CODASCA script runs them (the FeDXL paper's CODASCA baseline, §4), with the stage
    reference point moving every 2 rounds."""
    problem = fedbench.make_problem("pauc", seed=0, clients=3, positives_per_client=6, negatives_per_client=30,
                                    features=4, test_size=300, noise_scale=0.0)
    lr, gamma, wd, margin, rounds, steps, batch = 0.5, 2.0, 0.01, 1.0, 4, 3, 8
    federation = Federation(rounds, 2, steps, batch)
    sim = Simulation(problem, fedbench.make_algorithm("codasca", problem, client_lr=lr, gamma=gamma, weight_decay=wd,
                                                      clip=0.05, decay_every=2 * steps, decay=0.5),
                     federation, seed=4)
    for _ in range(rounds):
        sim.run_round()

    p = 1 / 6
    sampler = RoundSampler(problem, federation, seed=4)
    w = problem.init_params(generator(4, "init")).clone()
    a = b = alpha = 0.0
    ref, stage = (w.clone(), 0.0, 0.0), []
    c_i = [torch.zeros(problem.dim + 3) for _ in range(3)]
    c = torch.zeros(problem.dim + 3)
    for r in range(rounds):
        eta = lr * 0.5 ** (r // 2)
        clients, rows = sampler.draw(steps)
        rows = rows["D"]
        ends, updates = [], []
        for j, client in enumerate(clients.tolist()):
            wk, ak, bk, alk, total = w.clone(), a, b, alpha, torch.zeros(problem.dim + 3)
            for step in range(steps):
                x = problem.features[rows[step, j]]
                wg = wk.clone().requires_grad_(True)
                h = torch.sigmoid(x @ wg[:-1] + wg[-1])
                hp, hn = h[: batch // 2], h[batch // 2:]
                loss = p * (1 - p) * (((hp - ak) ** 2).mean() + ((hn - bk) ** 2).mean()
                                      + 2 * alk * (hn.mean() - hp.mean()))
                (gw,) = torch.autograd.grad(loss, wg)
                hp, hn = hp.detach(), hn.detach()
                g = torch.cat([gw.clamp(-0.05, 0.05), torch.tensor([-2 * p * (1 - p) * (hp - ak).mean(),
                                                                    -2 * p * (1 - p) * (hn - bk).mean(),
                                                                    2 * (margin + bk - ak) - 2 * alk])])
                total += g
                cg = g + c - c_i[client]
                wk = wk - eta * (cg[:-3] + (wk - ref[0]) / gamma) - eta * wd * wk
                ak, bk = (ak - eta * (float(cg[-3]) + (ak - ref[1]) / gamma) - eta * wd * ak,
                          bk - eta * (float(cg[-2]) + (bk - ref[2]) / gamma) - eta * wd * bk)
                alk = min(max(alk + eta * float(cg[-1]), 0.0), 999.0)
            updates.append((client, total / steps))
            ends.append((wk, ak, bk, alk))
        for client, new in updates:  # the round's new control variates count from the next round on
            c = c + (new - c_i[client]) / 3
            c_i[client] = new
        w = sum(e[0] for e in ends) / 2
        a, b, alpha = (sum(e[i] for e in ends) / 2 for i in (1, 2, 3))
        stage.append(torch.cat([w, torch.tensor([a, b])]))
        if r % 2 == 1:
            mean = sum(stage) / len(stage)
            ref, stage = (mean[:-2], float(mean[-2]), float(mean[-1])), []
    torch.testing.assert_close(sim.server["v"], torch.cat([w, torch.tensor([a, b])]).float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(sim.server["alpha"], torch.tensor([alpha]).float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(sim.server["c"], c.float(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(sim.server["c"], sim.clients["c_i"].mean(0), rtol=1e-4, atol=1e-6)
    assert sim.server["alpha"] > 0


def test_codasca_learns_and_counts_its_communication():
    problem = fedbench.make_problem("pauc", seed=0, clients=4, positives_per_client=10, negatives_per_client=50,
                                    features=6, test_size=600)
    s, k = 3, 5
    sim = Simulation(problem, fedbench.make_algorithm("codasca", problem, client_lr=0.5), Federation(8, s, k, 8),
                     seed=1, eval_every=8)
    rows = list(sim)
    d = problem.dim
    assert rows[-1]["comm_up"] == 8 * s * (2 * d + 6)  # v = (w, a, b), α, Δc_i = (w, a, b, α)
    assert rows[-1]["comm_down"] == 8 * s * (3 * d + 8)  # v, α, c, v_ref
    assert rows[-1]["test_auc"] > rows[0]["test_auc"] + 0.1


def test_a_positive_drawn_twice_keeps_its_last_fresh_u():
    """Positives are drawn with replacement and a repeated one has a fresh u per draw (its own feature noise): the
    table keeps the last, as a loop writing the draws in order does: a CPU scatter writes in order; on CUDA (no
    defined order among repeats) `scatter_last` makes every occurrence write that value first, and the curves agree
    between the devices (tests/engine/test_gpu.py)."""
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(3, 4, 6, generator=gen)
    index = torch.randint(6, (3, 4, 5), generator=gen)  # 5 draws of 6 positives: repeats on every client
    fresh = torch.rand(3, 4, 5, generator=gen)
    expected = u.clone()
    for run, client, draw in torch.cartesian_prod(torch.arange(3), torch.arange(4), torch.arange(5)).tolist():
        expected[run, client, index[run, client, draw]] = fresh[run, client, draw]
    assert (index.unsqueeze(-1) == index.unsqueeze(-2)).sum() > index.numel()  # the draws do repeat
    assert torch.equal(scatter_last(u, index, fresh), expected)


@pytest.mark.parametrize("name", ["local_pair", "fedxl2"])
@pytest.mark.parametrize("average_momentum", [True, False])
def test_validation_and_the_run_read_one_declaration_of_what_crosses_the_network(name, average_momentum):
    """Whether the momentum G goes down and up with the model is a hyperparameter: the downloads, uploads and kept
    rows that the recipe's validator checks (from the class and the trial's hyperparameters) are those the run built
    from the same trial sends and counts (they were the class's defaults at validation, the instance's in the run)."""
    raw = {"name": "routing", "seeds": [0], "eval_every": 1,
           "problem": {"name": "pauc", "clients": 4, "positives_per_client": 10, "negatives_per_client": 50,
                       "features": 6, "test_size": 100},
           "federation": {"rounds": 1, "clients_per_round": 3, "local_steps": 2, "batch_size": 8},
           "algorithms": {name: {"average_momentum": average_momentum}}}
    [trial] = parse(raw, "routing.yaml").trials()
    validated = ALGORITHMS[name].routing(trial.hyperparameters)
    sim = build_simulation(trial)
    assert (sim.algorithm.downloads, sim.algorithm.uploads, sim.algorithm.keeps) == (
        validated.downloads, validated.uploads, validated.keeps)
    assert ("G" in validated.downloads, "G" in validated.keeps) == (average_momentum, not average_momentum)
    sent = {}
    client_final = sim.algorithm.client_final

    def record(local, rnd, hp):
        message, rows = client_final(local, rnd, hp)
        sent.update(message=message, rows=rows)
        return message, rows

    sim.algorithm.client_final = record
    [_, row] = list(sim)
    assert list(sent["message"]) == [upload.name for upload in validated.uploads]
    assert set(sent["rows"]) == set(validated.keeps) <= set(sim.clients)
    assert row["comm_up"] == 3 * sum(tensor[0, 0].numel() for tensor in sent["message"].values())
