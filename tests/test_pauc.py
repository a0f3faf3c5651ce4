"""The pAUC metric and the synthetic partial-AUC problem (spec 001 §1.4, §3.2, §3.5, §5.2)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import fedbench
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
    problem = small()
    rows = torch.arange(8).view(2, 4)
    (x1, _), (x2, _) = problem.gather(rows), problem.gather(rows)
    assert not torch.equal(x1, x2)
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
