"""Problems (data, presets, initial points) and the round loop (schedule, communication, determinism,
divergence, aggregation weights, federation checks)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fedbench
from fedbench.engine.simulate import Federation, Simulation, simulate
from fedbench.rng import generator, largest_keys
from small_problems import small_lasso, small_lowrank


def initial_server_point(problem, seed=0):
    """The initial point the engine actually uses (constructing a Simulation does not evaluate)."""
    sim = Simulation(problem, fedbench.make_algorithm("fedmid", problem), Federation(1, 1, 1, 1), seed=seed)
    return sim.server["w"]


# -- (a) initial state of the bao2022 problems (w0 ~ N(0, I), as the released LassoRun.m and NuclearRun.m) ------

def test_bao2022_lasso_random_init_f1_is_about_0_66():
    problem = fedbench.make_problem("lasso", seed=0)
    assert (problem.num_clients, problem.dim, problem.config["samples_per_client"]) == (64, 1024, 128)
    assert problem.config["lam"] == 0.5**5
    w0 = initial_server_point(problem)
    metrics = problem.recovery_metrics(w0.expand(problem.num_clients, -1))
    f1 = float(metrics["f1"].mean())
    print(f"initial F1 of the randn init: {f1:.4f}")
    assert f1 == pytest.approx(0.66, abs=0.02)
    assert float(metrics["recall"].mean()) > 0.97  # ~0.8% of N(0,1) entries are below 0.01
    assert float(metrics["precision"].mean()) == pytest.approx(0.5, abs=0.02)
    assert float(w0.std()) == pytest.approx(1.0, abs=0.1)


@pytest.mark.parametrize("make,personal", [(small_lasso, {}), (small_lowrank, {}),
                                            (small_lasso, {"personal_support": 2, "personal_value": 0.5}),
                                            (small_lowrank, {"personal_value": 0.5})])
def test_a_global_model_is_scored_once_against_a_truth_all_clients_share(make, personal):
    """A global model's recovery metrics are the mean over clients of its comparison with each client's truth;
    where the truths are all equal, `evaluate` makes one comparison: the same values."""
    problem = make(**personal)
    assert problem.shared_truth == (not personal)
    w = torch.randn(problem.dim, generator=torch.Generator().manual_seed(3), dtype=problem.dtype)
    row = problem.evaluate(w)
    for name, per_client in problem.recovery_metrics(w.expand(problem.num_clients, -1)).items():
        assert row[name] == pytest.approx(float(per_client.mean()), rel=1e-14, abs=0), name


def test_bao2022_lowrank_random_init_has_full_rank_32():
    problem = fedbench.make_problem("lowrank", seed=0)
    assert problem.shape == (32, 32) and problem.config["lam"] == 0.1
    w0 = initial_server_point(problem)
    metrics = problem.recovery_metrics(w0.expand(problem.num_clients, -1))
    assert float(metrics["rank"].mean()) == 32.0
    truth = problem.truth[0].reshape(32, 32)
    assert torch.equal(truth, torch.diag(torch.cat([torch.ones(16), torch.zeros(16)])).to(truth.dtype))
    assert int(torch.linalg.matrix_rank(truth)) == 16


# -- (b) AR(1) design ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rho", [0.5, 0.0, 0.8])
def test_ar1_design_covariance(rho):
    dim = 6
    problem = fedbench.make_problem("lasso", seed=0, clients=2, samples_per_client=20000, dim=dim, support=3,
                                    ar_rho=rho, shift=2.0)
    x = problem.features.numpy().reshape(2, -1, dim)
    centred = x - x.mean(axis=1, keepdims=True)  # remove the fixed per-client shift m_k
    covariance = np.einsum("kni,knj->ij", centred, centred) / (centred.shape[0] * centred.shape[1])
    i, j = np.indices((dim, dim))
    np.testing.assert_allclose(covariance, rho ** np.abs(i - j), atol=0.03)
    # and the client shifts are real: the two clients' means differ by O(shift)
    assert np.linalg.norm(x[0].mean(0) - x[1].mean(0)) > 1.0


def test_labels_follow_the_truth_with_unit_noise():
    problem = small_lasso(samples_per_client=2000, dim=5, support=2, clients=3)
    residual = problem.labels.numpy() - np.einsum(
        "kni,ki->kn", problem.features.numpy().reshape(3, -1, 5), problem.truth.numpy()).ravel()
    assert residual.std() == pytest.approx(1.0, abs=0.05)
    noiseless = small_lasso(samples_per_client=20, dim=5, support=2, clients=3, noise=0.0)
    x = noiseless.features.numpy().reshape(3, -1, 5)
    np.testing.assert_allclose(noiseless.labels.numpy(), np.einsum("kni,ki->kn", x, noiseless.truth.numpy()).ravel(),
                               atol=1e-12)


# -- (c) presets ------------------------------------------------------------------------------------------------------

def test_fbe_personalized_truths():
    problem = fedbench.make_problem("lasso", preset="fbe_personalized", seed=0)
    truth = problem.truth.numpy()
    assert truth.shape == (30, 1024)
    assert problem.config["lam"] == 0.1 and problem.config["ar_rho"] == 0.0
    np.testing.assert_array_equal(truth[:, :8], 1.0)
    extras = []
    for row in truth:
        support = np.flatnonzero(row)
        assert len(support) == 10
        extra = support[support >= 8]
        assert len(extra) == 2  # two distinct client-specific coordinates
        np.testing.assert_array_equal(row[extra], 0.5)
        extras.append(tuple(extra))
    assert len(set(extras)) > 20  # drawn per client
    assert torch.equal(initial_server_point(problem), torch.zeros(1025, dtype=torch.float64))  # w and b


def test_fbe_iid_truth_and_init():
    problem = fedbench.make_problem("lasso", preset="fbe_iid", seed=0)
    expected = np.r_[np.ones(992), np.zeros(32)]
    assert problem.truth.shape == (30, 1024)
    np.testing.assert_array_equal(problem.truth.numpy(), np.broadcast_to(expected, (30, 1024)))
    assert torch.equal(initial_server_point(problem), torch.zeros(1025, dtype=torch.float64))  # w and b
    assert problem.config["lam"] == 0.1 and problem.config["ar_rho"] == 0.0
    # an unpenalized intercept (b_real = 0) and 128 held-out samples per client from the same distributions
    assert problem.config["intercept"] and torch.equal(problem.features[:, -1], torch.ones(30 * 128, dtype=torch.float64))
    assert problem.test_features.shape == (30 * 128, 1025)
    x = problem.test_features.view(30, 128, 1025)[:, :, :1024]
    residual = problem.test_labels.view(30, 128) - x @ problem.truth[0]
    assert float(residual.std()) == pytest.approx(1.0, abs=0.05)  # label noise N(0, 1)
    train = problem.features.view(30, 128, 1025)[:, :, :1024]
    gap = (x.mean(1) - train.mean(1)).square().mean().sqrt()  # each client's shift m_j: both means estimate it
    assert float(gap) == pytest.approx((2 / 128) ** 0.5, rel=0.05)
    without = fedbench.make_problem("lasso", preset="fbe_iid", seed=0, test_samples_per_client=0)
    assert torch.equal(without.features, problem.features)  # the test draws come after the training data
    metrics = problem.evaluate(torch.zeros(1025, dtype=torch.float64))
    assert metrics["test_mse"] == pytest.approx(float(problem.test_labels.square().mean()))
    assert metrics["support_accuracy"] == pytest.approx(32 / 1024)  # all zero: only the 32 zeros are right


def test_fbe_completion_truths():
    problem = fedbench.make_problem("lowrank", preset="fbe_completion", seed=0)
    truths = problem.truth.numpy().reshape(30, 32, 32)
    positions = []
    for truth in truths:
        diagonal = np.diag(truth)
        np.testing.assert_array_equal(truth - np.diag(diagonal), 0.0)  # diagonal matrices
        np.testing.assert_array_equal(diagonal[:4], 1.0)
        extra = np.flatnonzero(diagonal[4:]) + 4
        assert len(extra) == 1 and 4 <= extra[0] <= 31
        assert diagonal[extra[0]] == 0.25
        assert np.linalg.matrix_rank(truth) == 5
        positions.append(int(extra[0]))
    assert len(set(positions)) > 5
    assert torch.equal(initial_server_point(problem), torch.zeros(1025, dtype=torch.float64))  # W and b
    assert problem.config["rank_tol"] == 0.01 and problem.test_features.shape == (30 * 128, 1025)


def test_fbe_completion_extra_entry_ranges_over_positions_4_to_31():
    positions = set()
    for seed in range(6):
        problem = fedbench.make_problem("lowrank", preset="fbe_completion", seed=seed, samples_per_client=1)
        diagonals = problem.truth.reshape(-1, 32, 32).diagonal(dim1=-2, dim2=-1)
        positions |= set((diagonals[:, 4:] != 0).nonzero()[:, 1].add(4).tolist())
    assert min(positions) == 4 and max(positions) == 31  # 1-based 5..32: d0 ∈ {5, …, 32} (pFedFBE paper, §4.2)


def test_shared_shift_gives_every_client_the_same_shift():
    def client_means(shared):
        problem = fedbench.make_problem("lowrank", seed=0, rows=2, cols=2, rank=1, clients=4, samples_per_client=4000,
                                        shared_shift=shared)
        return problem.features.numpy().reshape(4, -1, 4).mean(axis=1)

    shared = client_means(True)
    spread = np.abs(shared - shared.mean(0)).max()
    assert spread < 0.1  # equal shifts: client means differ only by sampling noise (~1/sqrt(4000))
    own = client_means(False)
    assert np.abs(own - own.mean(0)).max() > 0.5


# -- (d) evaluation schedule and communication -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["fedmid", "fedda", "fedavg", "ditto"])
def test_evaluation_schedule_and_communication(name):
    problem = small_lasso()
    s, d, rounds, eval_every = 3, problem.dim, 23, 5
    result = simulate(problem, fedbench.make_algorithm(name, problem, client_lr=0.01),
                      Federation(rounds, s, 2, 5), seed=0, eval_every=eval_every)
    assert [row["round"] for row in result.rows] == [0, 5, 10, 15, 20, 23]
    for row in result.rows:
        assert row["comm_up"] == s * d * row["round"]
        assert row["comm_down"] == s * d * row["round"]
    assert result.status == "finished"


def test_evaluation_schedule_when_rounds_is_a_multiple_and_zero_rounds():
    problem = small_lasso()
    algorithm = fedbench.make_algorithm("fedmid", problem)
    result = simulate(problem, algorithm, Federation(20, 2, 1, 5), seed=0, eval_every=10)
    assert [row["round"] for row in result.rows] == [0, 10, 20]
    result = simulate(problem, fedbench.make_algorithm("fedmid", problem), Federation(0, 2, 1, 5), seed=0)
    assert [row["round"] for row in result.rows] == [0] and result.status == "finished"


def test_rows_carry_the_metrics_of_the_current_server_iterate():
    problem = small_lasso()
    sim = Simulation(problem, fedbench.make_algorithm("fedda", problem, client_lr=0.02), Federation(4, 3, 2, 5),
                     seed=0, eval_every=2)
    for row in sim:
        expected = problem.evaluate(sim.server["w"])
        assert {k: row[k] for k in expected} == expected
    assert row["round"] == 4


# -- (e) determinism ------------------------------------------------------------------------------------------------------

def _rows(problem, name, seed):
    return simulate(problem, fedbench.make_algorithm(name, problem, client_lr=0.02),
                    Federation(12, 3, 3, 5), seed=seed, eval_every=3).rows


@pytest.mark.parametrize("name", ["fedmid", "fedda", "ditto"])
def test_same_seed_same_rows_different_seed_different_rows(name):
    problem = small_lasso()
    first, again = _rows(problem, name, 0), _rows(problem, name, 0)
    assert first == again  # exact equality of every metric value
    assert first == _rows(small_lasso(), name, 0)  # also through a freshly generated problem
    other = _rows(problem, name, 1)
    assert [r["round"] for r in other] == [r["round"] for r in first]
    assert all(a["objective"] != b["objective"] for a, b in zip(first, other))


def test_data_depend_on_data_seed_only_when_it_is_set():
    def data(problem):
        return problem.features, problem.labels, problem.truth

    a, b = small_lasso(seed=0, personal_support=2), small_lasso(seed=1, personal_support=2)
    assert not torch.equal(a.features, b.features)
    assert not torch.equal(a.labels, b.labels)
    c, d = small_lasso(seed=0, data_seed=7, personal_support=2), small_lasso(seed=1, data_seed=7, personal_support=2)
    for x, y in zip(data(c), data(d)):
        assert torch.equal(x, y)
    for x, y in zip(data(small_lasso(seed=7, personal_support=2)), data(c)):
        assert torch.equal(x, y)  # data_seed 7 = what seed 7 would generate
    # the trial seed still drives the initial point, sampling and minibatches on shared data
    assert not torch.equal(initial_server_point(c, seed=c.seed), initial_server_point(d, seed=d.seed))


# -- (f) divergence ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("eval_every", [1, 4])
@pytest.mark.parametrize("factor", [1e4, math.inf])
def test_diverging_step_size_is_reported(eval_every, factor):
    """Stopped when the objective exceeds `factor` × its start, or (factor = inf) when it overflows."""
    problem = small_lasso()
    rounds = 200
    result = simulate(problem, fedbench.make_algorithm("fedmid", problem, client_lr=1e3),
                      Federation(rounds, 4, 3, 5), seed=0, eval_every=eval_every, divergence_factor=factor)
    assert result.status == "diverged"
    assert result.final["round"] < rounds
    assert all(math.isfinite(v) for row in result.rows[:-1] for v in row.values())
    assert all(row["objective"] <= factor * result.rows[0]["objective"] for row in result.rows[:-1])
    if math.isfinite(factor):
        assert result.final["objective"] > factor * result.rows[0]["objective"]
    else:
        assert not all(math.isfinite(v) for v in result.final.values())


@pytest.mark.parametrize("name", ["fedmid", "fedda", "fedavg"])
def test_diverging_lowrank_run_is_reported_not_raised(name):
    """Between two evaluations the iterate overflows to inf/nan; the nuclear prox/subgradient SVD of a
    non-finite matrix must not crash the trial: the run should end as 'diverged' like the Lasso does."""
    problem = small_lowrank()
    try:
        result = simulate(problem, fedbench.make_algorithm(name, problem, client_lr=1e3),
                          Federation(200, 3, 3, 5), seed=0, eval_every=25)
    except torch.linalg.LinAlgError as err:
        pytest.fail(f"diverging {name} run on lowrank raised instead of ending with status 'diverged': {err}")
    assert result.status == "diverged"
    assert result.final["round"] < 200


# -- (g) aggregation weights --------------------------------------------------------------------------------------------

def test_aggregation_weights_uniform_and_by_samples():
    problem = small_lasso()
    algorithm = fedbench.make_algorithm("fedmid", problem)
    clients = torch.tensor([5, 0, 2])
    uniform = Simulation(problem, algorithm, Federation(1, 3, 1, 5), seed=0)
    weights = uniform.aggregation_weights(clients)
    assert weights.dtype == torch.float64
    np.testing.assert_array_equal(weights.numpy(), np.full(3, 1 / 3))
    by_samples = Simulation(problem, algorithm, Federation(1, 3, 1, 5, aggregation="samples"), seed=0)
    np.testing.assert_allclose(by_samples.aggregation_weights(clients).numpy(), np.full(3, 1 / 3), rtol=1e-15)
    # unequal client sizes (as for EMNIST writers): π̂_k ∝ n_k, renormalized over the sampled set
    sizes = torch.tensor([10, 20, 30, 40, 50, 60, 70, 80])
    problem.client_sizes = sizes
    weights = by_samples.aggregation_weights(clients)
    expected = np.array([60.0, 10.0, 30.0]) / 100.0
    np.testing.assert_allclose(weights.numpy(), expected, rtol=1e-15)
    assert float(weights.sum()) == pytest.approx(1.0, rel=1e-15)
    np.testing.assert_array_equal(uniform.aggregation_weights(clients).numpy(), np.full(3, 1 / 3))


def test_aggregation_weights_enter_the_server_average():
    """With weights ∝ client sizes the FedAvg server average is weighted (one full-batch step, all clients)."""
    problem = small_lasso(clients=3, lam=0.0)
    sim = Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.1),
                     Federation(1, 3, 1, 20, aggregation="samples"), seed=0)
    problem.client_sizes = torch.tensor([20, 60, 20])  # pretend sizes; only the weights read them
    w0 = sim.server["w"].numpy().copy()
    draws = []
    original = sim.sampler.draw_round

    def recording(*args, **kwargs):
        draw = original(*args, **kwargs)
        draws.append(draw.clients)
        return draw

    sim.sampler.draw_round = recording
    sim.run_round()
    x = problem.features.numpy().reshape(3, 20, -1)
    y = problem.labels.numpy().reshape(3, 20)
    local = [w0 - 0.1 * x[k].T @ (x[k] @ w0 - y[k]) / 20 for k in range(3)]
    expected = 0.2 * local[0] + 0.6 * local[1] + 0.2 * local[2]
    np.testing.assert_allclose(sim.server["w"].numpy(), expected, atol=1e-12)
    assert sorted(draws[0].tolist()) == [0, 1, 2]


# -- (h) federation checks ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("federation", [
    Federation(10, 9, 1, 5),  # more clients per round than clients (8)
    Federation(10, -1, 1, 5),
    Federation(10, 3, 1, 21),  # batch larger than a client's 20 samples
    Federation(10, 3, 1, 0),
    Federation(10, 3, 0, 5),
    Federation(-1, 3, 1, 5),
    Federation(10, 3, 1, 5, aggregation="average"),  # no such rule (median is one, fedbench.axes.robust)
])
def test_federation_check_rejects_invalid_settings(federation):
    """(clients_per_round 0 is valid: every client, see below.)"""
    problem = small_lasso()
    with pytest.raises(ValueError):
        federation.check(problem.layout())
    with pytest.raises(ValueError):
        Simulation(problem, fedbench.make_algorithm("fedmid", problem), federation, seed=0)


def test_federation_check_accepts_the_boundaries():
    problem = small_lasso()
    Federation(0, 8, 1, 20).check(problem.layout())
    Federation(1, 1, 1, 1, aggregation="samples").check(problem.layout())


def test_minibatches_are_drawn_without_replacement_within_each_client():
    problem = small_lasso()
    rows = problem.draw_minibatches(torch.tensor([3, 0, 7]), steps=4, batch_size=20, gen=generator(0, "minibatches"))
    assert rows.shape == (4, 3, 20)
    for k, client in enumerate([3, 0, 7]):
        for s in range(4):
            assert sorted(rows[s, k].tolist()) == list(range(20 * client, 20 * client + 20))
    partial_rows = problem.draw_minibatches(torch.tensor([1]), steps=50, batch_size=5, gen=generator(0, "minibatches"))
    assert all(len(set(r.tolist())) == 5 for r in partial_rows[:, 0])
    assert len(set(partial_rows.reshape(-1).tolist())) == 20  # fresh draws cover the client's data


def test_minibatches_of_unequal_clients_stay_inside_each_client():
    problem = small_lasso()
    sizes = torch.tensor([5, 30, 12, 20, 8, 25, 40, 20])  # 160 rows, as the data
    problem._set_clients(sizes)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    clients = torch.tensor([6, 0, 2, 4])
    rows = problem.draw_minibatches(clients, steps=200, batch_size=5, gen=generator(1, "minibatches"))
    assert rows.shape == (200, 4, 5)
    for k, client in enumerate(clients.tolist()):
        picks = rows[:, k]
        assert int(picks.min()) >= int(offsets[client]) and int(picks.max()) < int(offsets[client + 1])
        assert all(len(set(r.tolist())) == 5 for r in picks)
        assert len(set(picks.reshape(-1).tolist())) == int(sizes[client])  # every sample gets drawn


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [1, 10, 40, 127])  # 1 of 128 takes topk's partial sort, the others its nth_element
@pytest.mark.parametrize("sorted_", [False, True])
def test_largest_keys_picks_what_topk_picks_in_its_order(dtype, width, sorted_):
    """`largest_keys` selects on the keys' bits: the same indices in the same order as topk on the floats, with padding
    (−1) and ties among the keys (here on purpose: a float32 key is a multiple of 2⁻²⁴, so they happen)."""
    gen = generator(0, "keys")
    keys = torch.rand(6, 50, 128, generator=gen, dtype=dtype)
    keys[:2] = torch.randint(0, 16, (2, 50, 128), generator=gen).to(dtype) / 16  # many ties
    keys[2:4].masked_fill_(torch.arange(128) >= torch.randint(width, 129, (2, 50, 1), generator=gen), -1.0)
    expected = keys.topk(width, dim=-1, sorted=sorted_).indices
    assert torch.equal(largest_keys(keys, width, sorted=sorted_), expected)


# -- metrics ------------------------------------------------------------------------------------------------------------------

def test_lasso_metrics_match_their_definitions():
    """Bao et al. (ICML 2022, §4; the released eval_metric_lasso.m): ℓ2/ℓ1 error, support {|w_j| > 0.01}
    precision/recall/F1, density; MSE without ½."""
    problem = small_lasso()
    rng = np.random.default_rng(0)
    w = rng.standard_normal(30) * 0.05
    w[:10] += 1.0
    w[[3, 12, 20]] = [0.005, 0.5, -0.02]
    metrics = problem.evaluate(torch.from_numpy(w))
    truth = problem.truth[0].numpy()
    estimated, true = np.abs(w) > 0.01, truth != 0
    precision = (estimated & true).sum() / estimated.sum()
    recall = (estimated & true).sum() / true.sum()
    x, y = problem.features.numpy(), problem.labels.numpy()
    expected = {
        "l2_error": np.linalg.norm(w - truth), "l1_error": np.abs(w - truth).sum(),
        "precision": precision, "recall": recall, "f1": 2 * precision * recall / (precision + recall),
        "density": estimated.mean(), "train_mse": np.mean((x @ w - y) ** 2),
        "objective": 0.5 * np.mean((x @ w - y) ** 2) + 0.05 * np.abs(w).sum(),
    }
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-12), key
    assert 0 < recall < 1 and 0 < precision < 1
    from fedbench.reference import solve
    assert metrics["objective_gap"] == pytest.approx(metrics["objective"] - solve(problem).objective, rel=1e-12)
    assert metrics["objective_gap"] > 0


def test_lowrank_metrics_match_their_definitions():
    """Bao et al. (ICML 2022, §4; the released eval_metric_nuc.m): Frobenius and operator-norm error, MATLAB rank
    (σ > max(p1,p2)·eps(σ_max))."""
    problem = small_lowrank()
    sv = np.array([3.0, 1.0, 1e-13, 1e-17, 0.0])  # 6·eps(3) ≈ 2.7e-15: the first three count
    # signed permutations keep the singular values exact (no rounding noise near the tolerance)
    u = np.eye(6)[[2, 0, 5, 1, 3, 4]] * np.array([1, -1, 1, 1, -1, 1])[:, None]
    vt = np.eye(5)[[4, 2, 0, 3, 1]]
    w = (u[:, :5] @ np.diag(sv) @ vt).ravel()
    metrics = problem.evaluate(torch.from_numpy(w))
    error = w.reshape(6, 5) - problem.truth[0].numpy().reshape(6, 5)
    assert metrics["rank"] == 3.0
    assert metrics["fro_error"] == pytest.approx(np.linalg.norm(error), rel=1e-12)
    assert metrics["op_error"] == pytest.approx(np.linalg.norm(error, 2), rel=1e-12)
    loose = small_lowrank(rank_tol=0.5)
    assert loose.evaluate(torch.from_numpy(w))["rank"] == 2.0


def test_zero_clients_per_round_means_every_client():
    problem = small_lasso()
    everyone = Simulation(problem, fedbench.make_algorithm("fedmid", problem), Federation(3, 0, 2, 5), seed=0)
    assert len(everyone.sampler.draw(2)[0]) == problem.num_clients == 8
