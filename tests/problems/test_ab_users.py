"""Per-FedAvg's partition and evaluation (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020, §5 and App. I) on the real
FEMNIST digits: every user holds exactly its class pattern (Table 2: type A a of each label 0–4; type-B group j a/2
of label j and 2a of label j + 5; `diff` without the a/2), in disjoint shards, the same pattern with a_test in its
test data; the batched one-step adaptation equals a written-out per-user loop; the adaptation batches do not depend
on the evaluation schedule."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedbench.problems import make_problem
from fedbench.problems.ab_users import class_counts
from fedbench.rng import generator


def digits_problem(**config):
    if not (Path(os.environ.get("FEDBENCH_DATA", "/nonexistent")) / "femnist").exists():
        pytest.skip("needs $FEDBENCH_DATA/femnist")
    return make_problem("ab_users", seed=3, a=20, a_test=6, **config)


def test_class_counts_follow_table_2():
    counts = class_counts(50, 196, "base")
    assert (counts[:25] == [196] * 5 + [0] * 5).all()
    for user in range(25, 50):
        j = (user - 25) // 5
        expected = np.zeros(10, dtype=int)
        expected[j], expected[j + 5] = 98, 392
        assert (counts[user] == expected).all()
    assert counts[:25].sum(1).tolist() == [980] * 25 and counts[25:].sum(1).tolist() == [490] * 25
    diff = class_counts(50, 196, "diff")
    assert (diff[25:, :5] == 0).all() and (diff[25:, 5:].sum(1) == 392).all()
    with pytest.raises(ValueError, match="multiple of 10"):
        class_counts(45, 10, "base")


@pytest.mark.parametrize("heterogeneity", ["base", "diff"])
def test_users_hold_their_pattern_in_disjoint_shards(heterogeneity):
    problem = digits_problem(heterogeneity=heterogeneity)
    for split, labels, owner, a in (("train", problem.y_train, problem.train_owner, 20),
                                    ("test", problem.y_test, problem.test_owner, 6)):
        found = np.zeros((problem.num_clients, 10), dtype=int)
        np.add.at(found, (owner.numpy(), labels.numpy()), 1)
        assert (found == class_counts(problem.num_clients, a, heterogeneity)).all(), split
    # disjoint: no image appears twice across users, train and test together (the digits pool serves both)
    images = torch.cat([problem.x_train, problem.x_test])
    assert len(torch.unique(images, dim=0)) == len(images)


def test_batched_adaptation_equals_a_per_user_loop():
    problem = digits_problem(adapt_step=0.5)
    w = problem.init_params(generator(0, "init"))
    metrics = problem.evaluate_global(w)
    x, y, _ = problem._adaptation_batch()
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), problem.test_sizes.cumsum(0)])
    accuracies = []
    for user in range(problem.num_clients):
        point = w.clone().requires_grad_(True)
        loss = F.cross_entropy(problem.model(point, x[user]), y[user])
        adapted = w - 0.5 * torch.autograd.grad(loss, point)[0]
        rows = slice(int(offsets[user]), int(offsets[user + 1]))
        predictions = problem.model(adapted, problem.x_test[rows]).argmax(-1)
        accuracies.append(float((predictions == problem.y_test[rows]).double().mean()))
    assert metrics["adapted_accuracy"] == pytest.approx(np.mean(accuracies), abs=1e-6)
    assert metrics["adapted_accuracy"] != pytest.approx(metrics["accuracy"], abs=1e-3)  # the step moves them
    # the batch is each user's own training rows, the same at every evaluation
    again, _, _ = problem._adaptation_batch()
    assert torch.equal(x, again) and x.shape[:2] == (problem.num_clients, 40)


def test_standardized_inputs_use_the_training_splits_statistics():
    """`input_scaling: standardized`: the same users and rows as raw, the pixels shifted and scaled by the training
    split's mean and standard deviation (the training split then has mean 0 and deviation 1; the test split is
    scaled by the same two numbers, not its own)."""
    raw, standard = digits_problem(), digits_problem(input_scaling="standardized")
    assert torch.equal(raw.y_train, standard.y_train) and torch.equal(raw.y_test, standard.y_test)
    mean, std = raw.x_train.mean(), raw.x_train.std()
    torch.testing.assert_close(standard.x_train, (raw.x_train - mean) / std)
    torch.testing.assert_close(standard.x_test, (raw.x_test - mean) / std)
    assert abs(float(standard.x_train.mean())) < 1e-5 and float(standard.x_train.std()) == pytest.approx(1, abs=1e-5)
    assert 0 < float(raw.x_train.mean()) < 0.2  # the raw digits are mostly background, in [0, 1]
