"""The `digits` problem (the pFedFBE paper's MNIST experiment, ICLR 2023 submission, §4.3): pFedMe's 2-label split
of pooled EMNIST digits, per-pixel standardisation, the hand-written batched gradient, full-data gradients over ragged
clients, the global and personal metrics, the group-ℓ2 regularizer it builds, one round of FedAvg and Ditto, and the
shipped sample."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fedbench
from fedbench.data import femnist
from fedbench.engine.simulate import Federation, Simulation
from fedbench.metrics import ENGINE_COLUMNS
from fedbench.problems.base import Problem
from fedbench.problems.digits import CLASSES, FIRST_PER_PAIR, STD_EPS, client_labels, pfedme_counts
from fedbench.rng import generator
from helpers import write_npz

HIDDEN = 6  # a small MLP keeps the tests fast; the default (100) is exercised on the shipped sample


@pytest.fixture(scope="module")
def many_digits(tmp_path_factory):
    """30 writers, 12,000 random digits (~1,200 per label): enough for some of pFedMe's requests to be served."""
    return write_npz(tmp_path_factory.mktemp("digits") / "many.npz", [300] * 30, [100] * 30, seed=1)


def problem_on(path, **config):
    return fedbench.make_problem("digits", seed=0, path=str(path), hidden=HIDDEN, **config)


def source_rows(problem, path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's (train, test) rows of the npz, found by un-standardising its features back to the stored
    grey levels (random images are all distinct)."""
    images = femnist.load_npz(path)
    index = {row.tobytes(): k for k, row in enumerate(images.x)}
    scale = problem.pixel_std.astype(np.float32) + np.float32(STD_EPS)

    def rows(x, sizes):
        levels = np.rint(x.cpu().numpy() * scale + problem.pixel_mean).astype(np.uint8)
        found = np.array([index[row.tobytes()] for row in levels])
        return np.split(found, np.cumsum(sizes.numpy())[:-1])

    return rows(problem.x_train, problem.client_sizes_cpu), rows(problem.x_test, problem.test_sizes)


def test_every_client_holds_exactly_its_two_labels_in_disjoint_samples_split_three_to_one(many_digits):
    problem = problem_on(many_digits, per_label=None)
    images = femnist.load_npz(many_digits)
    train, test = source_rows(problem, many_digits)
    assert problem.num_clients == 20 and len(train) == 20
    everything = np.concatenate(train + test)
    assert len(np.unique(everything)) == len(everything)  # disjoint across clients and across train/test
    for u in range(20):
        assert set(images.y[np.r_[train[u], test[u]]]) == {u % 10, (u + 1) % 10}
        np.testing.assert_array_equal(problem.y_train.numpy()[problem.client_offsets_cpu[u]:
                                                               problem.client_offsets_cpu[u + 1]], images.y[train[u]])
        n = len(train[u]) + len(test[u])
        assert len(train[u]) == int(0.75 * n) and abs(len(train[u]) - 0.75 * n) <= 1
    sizes = problem.client_sizes_cpu + problem.test_sizes
    assert sizes.min() >= 2 * FIRST_PER_PAIR and len(set(sizes.tolist())) > 1  # ragged, some requests served


def test_the_split_depends_on_the_data_seed_only(many_digits):
    first, again = problem_on(many_digits, data_seed=3), problem_on(many_digits, data_seed=3)
    other = problem_on(many_digits, data_seed=4)
    torch.testing.assert_close(first.x_train, again.x_train, rtol=0, atol=0)
    assert not torch.equal(first.client_sizes_cpu, other.client_sizes_cpu)


def test_pfedme_counts_first_ten_then_doubled_requests_skipped_when_a_label_runs_out():
    labels = client_labels(20, 2)
    assert labels[13].tolist() == [3, 4] and labels[19].tolist() == [9, 0]
    plenty = np.full(CLASSES, 10**7)
    counts = pfedme_counts(plenty, 20, 2, np.random.default_rng(0))
    extra = counts - FIRST_PER_PAIR
    assert (extra >= 600).all() and (extra % 2 == 0).all()  # (⌊share⌋ + {300..600})·2 for N ≤ 20
    scarce = np.full(CLASSES, 4 * FIRST_PER_PAIR + 600)  # no request fits beside the first 10s
    np.testing.assert_array_equal(pfedme_counts(scarce, 20, 2, np.random.default_rng(0)), FIRST_PER_PAIR)
    mnist = np.array([6903, 7877, 6990, 7141, 6824, 6313, 6876, 7293, 6825, 6958])  # MNIST's 70,000
    for seed in range(5):
        counts = pfedme_counts(mnist, 20, 2, np.random.default_rng(seed))
        used = np.bincount(labels.ravel(), weights=counts.ravel(), minlength=CLASSES)
        assert (used < mnist).all() and (counts >= FIRST_PER_PAIR).all()
    many = pfedme_counts(np.full(CLASSES, 10**7), 40, 3, np.random.default_rng(1)) - FIRST_PER_PAIR
    assert many.min() >= 300 and (many % 2 == 1).any()  # N > 20: not doubled
    with pytest.raises(ValueError, match="digit 1 has 30 images"):
        pfedme_counts(np.r_[100, 30, np.full(8, 100)], 20, 2, np.random.default_rng(0))


def test_features_are_the_pool_standardised_per_pixel(tmp_path):
    # 10 clients × 2 labels take 2 × 10 images of every digit; capped at 20 per digit, every pooled image is dealt
    path = write_npz(tmp_path / "pool.npz", [90] * 4, [30] * 4, seed=2)
    problem = problem_on(path, clients=10, per_label=20)
    x = torch.cat([problem.x_train, problem.x_test]).double()
    assert len(x) == 10 * 20
    torch.testing.assert_close(x.mean(0), torch.zeros(784, dtype=torch.float64), rtol=0, atol=1e-5)
    std = torch.from_numpy(problem.pixel_std)
    assert (std > 0).all()
    torch.testing.assert_close(x.std(0, unbiased=False), std / (std + STD_EPS), rtol=1e-5, atol=0)
    # and the statistics are those of the pooled grey levels
    train, test = source_rows(problem, path)
    pooled = femnist.load_npz(path).x[np.concatenate(train + test)].astype(np.float64)
    np.testing.assert_allclose(problem.pixel_mean, pooled.mean(0), rtol=1e-12)
    np.testing.assert_allclose(problem.pixel_std, pooled.std(0), rtol=1e-9)


def test_per_label_caps_each_digit(many_digits):
    capped = problem_on(many_digits, per_label=700)
    y = torch.cat([capped.y_train, capped.y_test])
    assert (torch.bincount(y, minlength=CLASSES) <= 700).all()


def test_hand_written_gradient_equals_torch_func_and_full_data_gradients_are_sample_means(many_digits):
    problem = problem_on(many_digits)
    clients = torch.tensor([3, 0, 2])
    rows = problem.draw_minibatches(clients, 1, 9, generator(0, "test"))[0]
    batch = problem.gather(rows)
    gen = generator(1, "w")
    w = problem.init_params(gen) + 0.1 * torch.randn(3, problem.dim, generator=gen)
    torch.testing.assert_close(problem.grad(w, batch), Problem.grad(problem, w, batch))
    x, y, weight = batch
    batch64 = (x.double(), y, weight.double())
    torch.testing.assert_close(problem.grad(w.double(), batch64), Problem.grad(problem, w.double(), batch64),
                               rtol=1e-12, atol=1e-14)
    # full data: rows padded with −1 up to the largest client, weighing nothing
    full, losses = problem.client_grad(w, clients), problem.client_loss(w, clients)
    for k, client in enumerate(clients.tolist()):
        start, end = problem.client_offsets_cpu[client], problem.client_offsets_cpu[client + 1]
        point = w[k].detach().double().requires_grad_(True)
        loss = F.cross_entropy(problem.model(point, problem.x_train[start:end].double()), problem.y_train[start:end])
        loss.backward()
        torch.testing.assert_close(full[k].double(), point.grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(losses[k].double(), loss.detach(), rtol=1e-5, atol=1e-6)
    assert len(set(problem.client_sizes_cpu[clients].tolist())) == 3  # ragged


def constant_class_model(problem, predicted: int, confidence: float = 3.0) -> torch.Tensor:
    """Parameters of an MLP that outputs the logits `confidence`·e_predicted whatever the input."""
    w = torch.zeros(problem.dim)
    w[-CLASSES + predicted] = confidence  # the output layer's bias is the last block
    return w


def test_metrics_on_a_hand_made_case(tmp_path):
    # 2 clients of 1 label each, capped at 10 images: client k holds 7 training and 3 test images of digit k
    path = write_npz(tmp_path / "two.npz", [200], [50], seed=3)
    problem = problem_on(path, clients=2, labels_per_client=1, per_label=10)
    assert problem.client_sizes_cpu.tolist() == [7, 7] and problem.test_sizes.tolist() == [3, 3]
    right, wrong = np.log(np.exp(3.0) + 9) - 3.0, np.log(np.exp(3.0) + 9)
    zero = constant_class_model(problem, 0)
    models = torch.stack([zero, constant_class_model(problem, 1)])
    assert problem.evaluate_personal(models) == pytest.approx(
        {"train_loss": right, "test_loss": right, "test_accuracy": 1.0}, rel=1e-6)
    assert problem.evaluate_personal(torch.stack([zero, zero])) == pytest.approx(
        {"train_loss": (right + wrong) / 2, "test_loss": (right + wrong) / 2, "test_accuracy": 0.5}, rel=1e-6)
    assert list(problem.evaluate_global(zero)) == [m.name for m in problem.metrics(problem.config)]
    assert problem.evaluate_global(zero) == pytest.approx(
        {"train_loss": (right + wrong) / 2, "objective": (right + wrong) / 2, "test_loss": (right + wrong) / 2,
         "test_accuracy": 0.5}, rel=1e-6)


def test_objective_is_the_mean_of_client_means_plus_h_on_ragged_clients(many_digits):
    problem = problem_on(many_digits, lam=0.01)
    w = problem.init_params(generator(0, "init"))
    metrics = problem.evaluate_global(w)
    clients = torch.arange(problem.num_clients)
    client_means = problem.client_loss(w.expand(len(clients), -1), clients).double()
    assert metrics["objective"] == pytest.approx(float(client_means.mean() + problem.regularizer.value(w.double())),
                                                 rel=1e-5)
    pooled = float((client_means * problem.client_sizes).sum() / problem.client_sizes.sum())
    assert metrics["train_loss"] == pytest.approx(pooled, rel=1e-5)
    personal = problem.evaluate_personal(w.expand(problem.num_clients, -1))
    assert personal == pytest.approx({k: metrics[k] for k in personal}, rel=1e-6)


def test_group_l2_has_one_group_per_weight_matrix_and_leaves_biases_free(many_digits):
    per_tensor = problem_on(many_digits, lam=0.5)
    hidden_end = 784 * HIDDEN
    output = (hidden_end + HIDDEN, hidden_end + HIDDEN + HIDDEN * CLASSES)
    assert per_tensor.regularizer.groups == [[(0, hidden_end)], [output]]
    assert problem_on(many_digits, scope="global").regularizer.groups == [[(0, hidden_end), output]]
    biases = torch.cat([torch.arange(hidden_end, hidden_end + HIDDEN), torch.arange(output[1], per_tensor.dim)])
    w = per_tensor.init_params(generator(0, "init"))
    prox = per_tensor.regularizer.prox(w, 10.0)
    torch.testing.assert_close(prox[biases], w[biases], rtol=0, atol=0)
    assert not per_tensor.regularizer.subgradient(w)[biases].any()
    norms = [torch.linalg.vector_norm(w[:hidden_end]), torch.linalg.vector_norm(w[output[0]: output[1]])]
    torch.testing.assert_close(per_tensor.regularizer.value(w), 0.5 * sum(norms))


@pytest.mark.parametrize("algorithm", ["fedavg", "ditto"])
def test_one_round_through_the_simulation_gives_exactly_the_declared_metrics(many_digits, algorithm):
    problem = problem_on(many_digits)
    sim = Simulation(problem, fedbench.make_algorithm(algorithm, problem, client_lr=0.05), Federation(1, 4, 3, 10),
                     seed=0, eval_every=1)
    rows = list(sim)
    declared = problem.declared_metrics(problem.config, personal=algorithm == "ditto")
    assert [row["round"] for row in rows] == [0, 1] and sim.status == "finished"
    engine = ("round", *(column.name for column in ENGINE_COLUMNS))
    assert [k for k in rows[-1] if k not in engine] == [m.name for m in declared]
    assert any(m.name == "personal_test_accuracy" for m in declared) == (algorithm == "ditto")
    assert rows[-1]["objective"] < rows[0]["objective"]


def test_the_shipped_sample_gives_twenty_two_label_clients():
    problem = fedbench.make_problem("digits", seed=0)
    assert problem.dim == 784 * 100 + 100 + 100 * 10 + 10 and problem.num_clients == 20
    sizes = problem.client_sizes_cpu + problem.test_sizes
    assert 600 <= sizes.min() and sizes.max() <= 4000 and sizes.sum() > 25_000
    offsets, test_offsets = problem.client_offsets_cpu, torch.cat([torch.zeros(1, dtype=torch.long),
                                                                   problem.test_sizes.cumsum(0)])
    for u in range(20):
        held = torch.cat([problem.y_train[offsets[u]: offsets[u + 1]],
                          problem.y_test[test_offsets[u]: test_offsets[u + 1]]])
        assert set(held.tolist()) == {u % 10, (u + 1) % 10}
