"""The pAUC metric and the synthetic partial-AUC problem (Guo, Jin, Luo, Yang, ICML 2023 "FeDXL", §4: the KL-OPAUC
objective, the clients' feature noise, McClish-standardised pAUC as the released code computes it; the synthetic data
are our stand-in)."""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import fedbench
from fedbench.engine.simulate import Federation, Simulation
from fedbench.metrics import partial_auc
from fedbench.rng import generator


def small(**config):
    defaults = dict(clients=4, positives_per_client=6, negatives_per_client=30, features=5, test_size=300)
    return fedbench.make_problem("pauc", seed=0, **{**defaults, **config})


def test_partial_auc_equals_sklearn_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(100):
        n = int(rng.integers(6, 50))
        y = np.r_[0, 1, rng.integers(0, 2, n - 2)]
        s = np.round(rng.normal(size=n) + y, int(rng.integers(0, 3)))  # rounding makes ties
        for beta in (0.1, 0.3, 0.5):
            assert partial_auc(y, s, beta) == pytest.approx(roc_auc_score(y, s, max_fpr=beta), abs=1e-12)
        assert partial_auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_partial_auc_hand_computed_and_limits():
    y, s = np.array([1, 0, 1, 0]), np.array([0.9, 0.8, 0.3, 0.1])
    # ROC (0,0) (0,½) (½,½) (½,1) (1,1): area over FPR ≤ ½ is ¼; McClish: ½(1 + (¼ − ⅛)/(½ − ⅛)) = ⅔
    assert partial_auc(y, s, 0.5) == pytest.approx(2 / 3, abs=1e-12)
    assert partial_auc(y, s) == pytest.approx(0.75, abs=1e-12)
    assert partial_auc(y, np.where(y == 1, 1.0, 0.0), 0.3) == 1.0
    assert partial_auc(y, np.zeros(4), 0.3) == pytest.approx(0.5)


def test_batches_are_class_balanced_and_inside_each_client():
    problem = small(split="dirichlet")
    clients = torch.tensor([0, 2, 3])
    rows = problem.draw_minibatches(clients, 5, 8, generator(0, "minibatches"))
    assert rows.shape == (5, 3, 8)
    labels = problem.labels[rows]
    assert (labels[..., :4] == 1).all() and (labels[..., 4:] == 0).all()
    owners = problem.row_client[rows]
    assert (owners == clients[None, :, None]).all()


def test_fresh_client_noise_on_every_draw():
    """The noise is drawn on the stream it is given (a simulation's `feature-noise`, following the run's seed)."""
    problem = small()
    rows = torch.arange(8).view(2, 4)
    gen = generator(0, "feature-noise")
    (x1, _), (x2, _) = (problem.gather(rows, problem.minibatch_noise(rows, gen)) for _ in range(2))
    assert not torch.equal(x1, x2)
    again = generator(0, "feature-noise")
    assert torch.equal(problem.gather(rows, problem.minibatch_noise(rows, again))[0], x1)
    clean = small(noise_scale=0.0)
    x, y = clean.gather(rows)
    torch.testing.assert_close(x, clean.features[rows])
    assert torch.equal(y, clean.labels[rows])


@pytest.mark.parametrize("model", ["linear", "mlp"])
def test_grad_is_the_per_client_cross_entropy_gradient(model):
    problem = small(model=model, hidden=7)
    rows = problem.draw_minibatches(torch.tensor([1, 3]), 1, 6, generator(1, "minibatches"))[0]
    batch = problem.gather(rows)
    w = torch.randn(2, problem.dim, generator=generator(2, "w")) * 0.3
    got = problem.grad(w, batch)
    for k in range(2):  # one client at a time, written out
        wk = w[k].clone().requires_grad_(True)
        x, y = batch[0][k], batch[1][k]
        d = x.shape[1]
        if model == "linear":
            logits = x @ wk[:d] + wk[d]
        else:
            h = 7
            hidden = torch.relu(x @ wk[: d * h].view(d, h) + wk[d * h: d * h + h])
            logits = hidden @ wk[d * h + h: d * h + 2 * h] + wk[-1]
        p = torch.sigmoid(logits)
        loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
        torch.testing.assert_close(got[k], torch.autograd.grad(loss, wk)[0], rtol=1e-5, atol=1e-6)


def test_kl_opauc_objective_written_out():
    problem = small(kl_lambda=2.0)
    w = torch.randn(problem.dim, generator=generator(3, "w"))
    h = torch.sigmoid(problem.features @ w[:-1] + w[-1]).double().numpy()
    y = problem.labels.numpy()
    want = np.mean([2.0 * math.log(np.mean([math.exp(max(0.0, 1 - (hp - hn)) ** 2 / 2.0) for hn in h[y == 0]]))
                    for hp in h[y == 1]])
    assert problem.pooled_objective(w) == pytest.approx(want, rel=1e-5)


def test_local_sgd_ce_learns_a_ranking_and_data_are_deterministic():
    problem = small(split="dirichlet")
    again = small(split="dirichlet")
    assert torch.equal(problem.features, again.features) and torch.equal(problem.positive_counts, again.positive_counts)
    assert problem.positive_counts.min() >= 1
    result = fedbench.run("fedavg", problem, rounds=20, clients_per_round=4, local_steps=8, batch_size=8, eval_every=20,
                          client_lr=0.3, subgradient=False)
    start, end = result.rows[0], result.rows[-1]
    assert start["test_auc"] == pytest.approx(0.5) and end["test_auc"] > 0.75
    assert end["test_pauc_0.3"] > 0.6 and end["objective"] < start["objective"]


def test_auc_task_flips_labels_and_uses_the_psm_loss():
    clean = small(task="auc")
    noisy = small(task="auc", flip_rate=0.2)
    assert int(noisy.labels.sum()) == 4 * (6 - round(0.2 * 6) + round(0.2 * 30))  # per client: kept + flipped in
    assert torch.equal(noisy.test_labels, clean.test_labels)  # test labels stay clean
    a, b = torch.tensor([0.9, 0.2]), torch.tensor([0.1, 0.7])
    torch.testing.assert_close(noisy.pair_loss(a, b), 1 / (1 + torch.exp(a - b)))
    torch.testing.assert_close(noisy.outer_grad(a), torch.ones(2))
    w = torch.randn(noisy.dim, generator=generator(4, "w"))
    h = torch.sigmoid(noisy.features @ w[:-1] + w[-1])
    want = torch.sigmoid(h[noisy.labels == 0][None, :] - h[noisy.labels == 1][:, None]).mean()
    assert noisy.pooled_objective(w) == pytest.approx(float(want), rel=1e-6)


# -- the FEMNIST data source (data: femnist) ------------------------------------------------------------------

def write_writers(path, writers: dict[str, tuple[list[int], list[int]]], seed=0):
    """An npz in the shipped format, writers in the given (unsorted) order: {id: (train labels, test labels)};
    every image is distinct random grey levels, so a row's source sample can be found back."""
    rng = np.random.default_rng(seed)
    labels = [y for train, test in writers.values() for y in (*train, *test)]
    sizes = [len(train) + len(test) for train, test in writers.values()]
    np.savez_compressed(
        path, x=rng.integers(0, 256, (len(labels), 784)).astype(np.uint8), y=np.array(labels, dtype=np.uint8),
        writer_offsets=np.r_[0, np.cumsum(sizes)].astype(np.int64), writer_ids=np.array(list(writers)),
        is_test=np.concatenate([[False] * len(train) + [True] * len(test) for train, test in writers.values()]))
    return path


# Label 1 is positive. Sorted ids: w0 (2 pos, 10 neg), w1 (no positive), w2 (6 pos, 5 neg), w3 (no negative),
# w4 (3 pos, 15 neg); with positive_ratio 1/6 a client keeps ⌊n₋/5⌋ of its positives at most.
TINY = {"w3": ([1] * 4, [1, 0]), "w0": ([1, 1] + [0] * 10, [1, 0, 0]), "w4": ([1] * 3 + [0] * 15, [0]),
        "w1": ([0] * 6, [1, 0, 2]), "w2": ([1] * 6 + [2] * 5, [1])}


def tiny(tmp_path, **config):
    path = write_writers(tmp_path / "tiny.npz", TINY)
    return fedbench.make_problem("pauc", seed=0, data="femnist", path=str(path),
                                 **{"positive_classes": [1], "clients": 0, **config})


def source_samples(tmp_path):
    """{pixel bytes: (writer id, label, is_test)} of the tiny file."""
    with np.load(tmp_path / "tiny.npz") as f:
        writer = np.repeat(f["writer_ids"], np.diff(f["writer_offsets"]))
        return {row.tobytes(): (w, int(y), bool(t)) for row, w, y, t in zip(f["x"], writer, f["y"], f["is_test"])}


@pytest.mark.parametrize(("clients", "ratio", "writers", "positives", "negatives"), [
    (0, 1 / 6, [["w0"], ["w2"], ["w4"]], [2, 1, 3], [10, 5, 15]),  # w1 and w3 dropped: one class only
    (2, 1 / 6, [["w0", "w1", "w2"], ["w3", "w4"]], [4, 3], [21, 15]),  # sorted ids dealt into 2 contiguous groups
    (2, None, [["w0", "w1", "w2"], ["w3", "w4"]], [8, 7], [21, 15]),  # null: every positive kept
    (5, 1.0, [["w0"], ["w2"], ["w4"]], [2, 6, 3], [10, 5, 15]),  # r = 1: no limit either
])
def test_femnist_clients_are_writers_or_groups_with_positives_subsampled(tmp_path, clients, ratio, writers, positives,
                                                                         negatives):
    problem = tiny(tmp_path, clients=clients, positive_ratio=ratio)
    assert problem.num_clients == len(writers) and problem.dropped_clients == (2 if clients != 2 else 0)
    assert problem.positive_counts.tolist() == positives and problem.negative_counts.tolist() == negatives
    samples = source_samples(tmp_path)
    kept = sorted(w for group in writers for w in group)
    assert list(problem.writer_ids) == kept
    for k, group in enumerate(writers):
        rows = range(int(problem.client_offsets[k]), int(problem.client_offsets[k + 1]))
        assert problem.labels[list(rows)].tolist() == [1.0] * positives[k] + [0.0] * negatives[k]  # positives first
        for row in rows:
            writer, label, is_test = samples[problem.features[row].numpy().tobytes()]
            assert writer in group and not is_test and (label == 1) == bool(problem.labels[row])
    # test + validation: every test sample of the kept writers, binarised, none subsampled or dropped
    want = sorted((w, y == 1) for w, y, t in samples.values() if t and w in kept)
    held_out = zip(torch.cat([problem.test_features, problem.val_features]),
                   torch.cat([problem.test_labels, problem.val_labels]))
    got = sorted((samples[x.numpy().tobytes()][0], bool(y)) for x, y in held_out)
    assert got == want and 0 < len(problem.val_labels) <= len(problem.test_labels)


def test_femnist_features_are_normalised_pixels_with_the_client_noise(tmp_path):
    clean = tiny(tmp_path, noise_scale=0.0)
    rows = torch.tensor([[0, 3, 5], [12, 7, 1]])
    x, y = clean.gather(rows)
    torch.testing.assert_close(x, clean.features[rows].float() * 2 / 255 - 1)  # Normalize(0.5, 0.5)
    assert torch.equal(y, clean.labels[rows])
    noisy = tiny(tmp_path, noise_scale=3.0)
    many = torch.zeros(2, 400, dtype=torch.long)
    many[1] = int(noisy.client_offsets[2])  # one row of client 0 and one of client 2, drawn 400 times
    shift = noisy.gather(many, noisy.minibatch_noise(many, generator(0, "feature-noise")))[0] - clean.gather(many)[0]
    mean = shift.mean((1, 2))
    torch.testing.assert_close(mean, 3.0 * torch.tensor([-0.08, -0.08 + 0.16 * 2 / 3]), atol=0.005, rtol=0)
    torch.testing.assert_close(shift.std((1, 2)), torch.full((2,), 0.6), rtol=0.01, atol=0)
    w = torch.randn(clean.dim, generator=generator(5, "w"))
    torch.testing.assert_close(clean.all_scores(w, clean.test_features),
                               torch.sigmoid((clean.test_features.float() * 2 / 255 - 1) @ w[:-1] + w[-1]))


def test_noise_mean_is_spread_evenly_for_any_number_of_clients():
    assert small(clients=16, positives_per_client=1, negatives_per_client=1).noise_mean.tolist() == \
        (-0.08 + 0.01 * torch.arange(16, dtype=torch.float32)).tolist()  # the paper's μ_i, bit for bit
    torch.testing.assert_close(small(clients=4, noise_scale=2.0).noise_mean, 2.0 * torch.tensor([-0.08, -0.04, 0, 0.04]))


def test_femnist_errors_name_the_parameter(tmp_path):
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "femnist" / "femnist_sample10.npz"))):
        fedbench.make_problem("pauc", data="femnist", data_dir=str(tmp_path))
    for bad, expected in ((70, "expected a non-empty list of integers, found 70"),
                          ([], "expected a non-empty list of integers, found []"),
                          ([3, 62], "expected ints in [0, 61], found 62"),
                          ([1.5], "expected an integer in [0, 61], found 1.5"),
                          ([1, 4, 1], "label 1 is listed more than once")):
        with pytest.raises(ValueError, match=re.escape(f"pauc.positive_classes: {expected}")):
            tiny(tmp_path, positive_classes=bad)
    with pytest.raises(ValueError, match=r"pauc.positive_classes: no client keeps both a positive and a negative"):
        tiny(tmp_path, positive_classes=[7])  # no writer has a 7
    with pytest.raises(ValueError, match=r"pauc.positive_classes: no client keeps both"):
        tiny(tmp_path, positive_classes=[0, 1, 2])  # nothing negative
    with pytest.raises(ValueError, match=r"pauc.positive_classes: .* test samples hold no positive"):
        tiny(tmp_path, positive_classes=[2])  # w2's 2s are the only positives; its test sample is a 1
    with pytest.raises(ValueError, match=r"pauc.clients: found 6, expected at most the data's 5 writers"):
        tiny(tmp_path, clients=6)
    with pytest.raises(ValueError, match=r"pauc.clients: found 0 \(one client per writer\), which needs data: femnist"):
        small(clients=0)


@pytest.fixture(scope="module")
def sample10():
    if not (Path(os.environ.get("FEDBENCH_DATA", "")) / "femnist" / "femnist_sample10.npz").is_file():
        pytest.skip("the shipped FEMNIST sample is not at $FEDBENCH_DATA/femnist/femnist_sample10.npz")
    return fedbench.make_problem("pauc", seed=0, preset="guo2023_femnist", clients=4, model="linear")


def test_femnist_sample_class_ratio_test_set_and_objective_subsample(sample10):
    problem = sample10
    positives, negatives = problem.positive_counts, problem.negative_counts
    assert problem.num_clients == 4 and problem.features.dtype == torch.uint8
    with np.load(Path(os.environ["FEDBENCH_DATA"]) / "femnist" / "femnist_sample10.npz") as f:
        y, is_test, ids = f["y"], f["is_test"], f["writer_ids"]
        writer = np.repeat(np.arange(len(ids)), np.diff(f["writer_offsets"]))
    classes = problem.config["positive_classes"]
    client = (np.argsort(np.argsort(ids, kind="stable")) * 4 // len(ids))[writer]  # sorted ids in 4 groups
    available = np.bincount(client[~is_test & np.isin(y, classes)], minlength=4)
    # ⌊(r/(1−r))·n₋⌋ positives at r = 1/6, or all where the writers have fewer
    assert positives.tolist() == np.minimum(available, negatives.numpy() // 5).tolist()
    assert (positives / (positives + negatives) <= 1 / 6 + 1e-6).all()
    assert (positives / (positives + negatives) > 0.15).all()
    assert list(problem.writer_ids) == sorted(ids) and np.bincount(problem.writer_client).tolist() == [90] * 4
    test_y = y[is_test]
    # all 360 writers kept: every test sample, 2000 of them for validation
    assert len(problem.test_labels) + len(problem.val_labels) == len(test_y) == 8051 and len(problem.val_labels) == 2000
    assert int(problem.test_labels.sum() + problem.val_labels.sum()) == int(np.isin(test_y, classes).sum())
    assert problem.objective_pairs is not None and small().objective_pairs is None  # synthetic: exact
    pos_idx, neg_idx = problem.objective_pairs
    assert len(pos_idx) * len(neg_idx) <= 2**22
    assert len(pos_idx) / len(neg_idx) == pytest.approx(float(positives.sum() / negatives.sum()), rel=0.01)
    w = torch.randn(problem.dim, generator=generator(6, "w")) * 0.01
    h_pos, h_neg = problem.scores_by_class(w)
    a, b = h_pos[pos_idx].double()[:, None], h_neg[neg_idx].double()[None, :]
    want = torch.log(torch.exp((1 - (a - b)).clamp_min(0) ** 2).mean(1)).mean()
    assert problem.pooled_objective(w) == pytest.approx(float(want), rel=1e-5)


def test_femnist_one_client_per_writer_and_determinism(sample10):
    writers = fedbench.make_problem("pauc", seed=0, data="femnist", clients=0)
    assert writers.num_clients + writers.dropped_clients == 360 and writers.num_clients > 350
    assert len(writers.noise_mean) == writers.num_clients
    again = fedbench.make_problem("pauc", seed=0, preset="guo2023_femnist", clients=4, model="linear")
    assert torch.equal(again.features, sample10.features) and torch.equal(again.labels, sample10.labels)
    other = fedbench.make_problem("pauc", seed=0, preset="guo2023_femnist", clients=4, model="mlp", data_seed=1)
    assert torch.equal(other.positive_counts, sample10.positive_counts)  # the same counts, other positives
    assert not torch.equal(other.features, sample10.features)
    assert other.dim == 784 * 64 + 64 + 64 + 1 and other.config["positive_classes"] == [0, 1, 2, 3, 4]


def test_femnist_short_run_learns(sample10):
    problem = sample10  # linear, w₀ = 0: every score ½, so AUC ½ and objective λ log exp(1) = 1 at the start
    sim = Simulation(problem, fedbench.make_algorithm("local_sgd_ce", problem, client_lr=0.1), Federation(4, 4, 8, 32),
                     seed=0)
    for _ in range(4):
        sim.run_round()
    end = problem.evaluate(sim.algorithm.global_params(sim.server))
    assert end["test_auc"] > 0.65 and end["test_pauc_0.3"] > 0.58 and end["objective"] < 1.0
