"""The `pauc` problem on CIFAR-10 images with a deep network (Guo, Jin, Luo, Yang, ICML 2023, §4: binary imbalanced
CIFAR-10 scored by a network): the data built as the paper's Table 5 describes, FeDXL2 rounds in each layout equal to
an independent `torch.nn` transcription on the same draws (images cropped, flipped, standardised and noised by
hand; scores, pools, u tables, momentum and gradients written out), and the combinations it cannot run refused at
their field in one line."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import fedbench
from fedbench.data import cifar10
from fedbench.engine.federation import RoundSampler
from fedbench.engine.simulate import Federation, Simulation
from fedbench.networks import NETWORKS
from fedbench.rng import generator
from helpers import invoke, refused

SMALL = dict(preset="guo2023_cifar10", model="niid_cnn_cifar", clients=4, train_size=1200, val_size=200,
             test_size=60)
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)  # CIFAR-10's 50,000 training images, per channel


@pytest.fixture(scope="module")
def problems():
    """The small CIFAR-10 problem with crop and flip in each layout, built when a test asks for it."""
    class Problems(dict):
        def __missing__(self, layout):
            self[layout] = fedbench.make_problem("pauc", seed=0, layout=layout, augment="crop_flip", **SMALL)
            return self[layout]

    return Problems()


def test_the_binary_imbalanced_split_is_the_papers(problems):
    """Table 5's construction: `val_size` images held out unsubsampled, classes 5–9 positive, positives cut to
    ⌊0.2·n₋⌋, each class in equal chunks over the clients, each client's positives first."""
    problem = problems["loop"]
    labels = cifar10.load_labels(cifar10.resolve(None))[0]
    order = torch.randperm(len(labels), generator=generator(0, "data")).numpy()[:1200]
    pool = order[200:]
    negatives = int((labels[pool] < 5).sum())
    assert int(problem.positive_counts.sum()) == negatives // 5 and int(problem.negative_counts.sum()) == negatives
    assert problem.positive_counts.max() - problem.positive_counts.min() <= 1
    assert problem.negative_counts.max() - problem.negative_counts.min() <= 1
    for k in range(4):
        start, pos = int(problem.client_offsets[k]), int(problem.positive_counts[k])
        assert problem.labels[start: start + pos].eq(1).all() and problem.labels[start + pos:
                                                                                  start + problem.client_sizes[k]].eq(0).all()
    assert len(problem.val_labels) == 200 and torch.equal(problem.val_labels,
                                                          torch.from_numpy(labels[np.sort(order[:200])] >= 5).float())
    assert len(problem.test_labels) == 60
    assert problem.dim == NETWORKS["niid_cnn_cifar"].parameters - 9 * 85  # its last layer 84 → 1 instead of 84 → 10


def standardised(pixels):
    """(v/255 − mean)/std by channel, written out."""
    return (pixels.float() / 255 - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)


def transformed(problem, row, eps, dy, dx, flip):
    """One training image as the released code's transforms make it: zero-padded by 4, cropped at (dy, dx), mirrored
    where drawn, standardised, plus its client's noise μ_i + 0.2 ε (μ_i = −0.08 + 0.01·16i/N)."""
    padded = torch.zeros(3, 40, 40, dtype=torch.uint8)
    padded[:, 4:36, 4:36] = problem.features[row]
    image = padded[:, dy: dy + 32, dx: dx + 32]
    if flip:
        image = image.flip(-1)
    client = int(torch.searchsorted(problem.client_offsets, torch.tensor(row), right=True)) - 1
    return standardised(image) + (-0.08 + 0.01 * 16 * client / problem.num_clients) + 0.2 * eps.view(3, 32, 32)


def pair_loss(a, b):  # KL-OPAUC, λ = 1, m = 1: exp((1 − (a − b))₊²)
    return torch.exp((1 - (a[:, None] - b[None, :])).clamp_min(0) ** 2)


def reference_fedxl2(problem, fed, seed, lr, beta, gamma, history):
    """FeDXL2 (Algorithm 2, the released code's pools of `history` rounds drawn with replacement, u₀ = 1) with a
    `torch.nn` module per client, on the engine's client and row draws and its streams' noise and passive draws."""
    net = problem.model.factory()
    w = problem.init_params(generator(seed, "init"))
    G = torch.zeros_like(w)

    def scores(point, x):
        vector_to_parameters(point, net.parameters())
        return torch.sigmoid(net(x)).squeeze(-1)

    with torch.no_grad():
        h0 = scores(w.clone(), standardised(problem.features))
    pool_pos, pool_neg = h0[problem.labels == 1], h0[problem.labels == 0]
    pool_u = torch.ones_like(pool_pos)
    u = torch.ones(problem.num_clients, int(problem.positive_counts.max()))
    sampler = RoundSampler(problem, fed, seed)
    noise_gen, passive_gen = generator(seed, "feature-noise"), generator(seed, "passive-scores")
    half = fed.batch_size // 2
    for _ in range(fed.rounds):
        clients, rows = sampler.draw(fed.local_steps)
        points, momenta = [w.clone() for _ in clients], [G.clone() for _ in clients]
        records = [([], [], []) for _ in clients]
        for step in range(fed.local_steps):
            n = len(clients) * fed.batch_size
            eps = torch.randn(n, 3072, generator=noise_gen)
            offsets, flips = torch.randint(9, (n, 2), generator=noise_gen), torch.randint(2, (n, 1), generator=noise_gen)
            pair = torch.randint(len(pool_pos), (len(clients), half), generator=passive_gen)
            picks = torch.randint(len(pool_neg), (len(clients), half), generator=passive_gen)
            for k, client in enumerate(clients.tolist()):
                step_rows = rows["D"][step, k].tolist()
                x = torch.stack([transformed(problem, row, eps[k * fed.batch_size + j], *offsets[k * fed.batch_size + j],
                                             flips[k * fed.batch_size + j, 0]) for j, row in enumerate(step_rows)])
                vector_to_parameters(points[k].clone(), net.parameters())
                h = torch.sigmoid(net(x)).squeeze(-1)
                a, b = h[:half], h[half:]
                ha, uo, hb = pool_pos[pair[k]], pool_u[pair[k]], pool_neg[picks[k]]
                index = torch.tensor(step_rows[:half]) - int(problem.client_offsets[client])
                fresh = (1 - gamma) * u[client, index] + gamma * pair_loss(a, hb).mean(1).detach()
                loss = ((1 / fresh) * pair_loss(a, hb).mean(1)).mean() + ((1 / uo) * pair_loss(ha, b).mean(1)).mean()
                grad = parameters_to_vector(torch.autograd.grad(loss, list(net.parameters())))
                momenta[k] = (1 - beta) * momenta[k] + beta * grad
                points[k] = points[k] - lr * momenta[k]
                for p, value in zip(index.tolist(), fresh.tolist()):  # a positive drawn twice keeps its last u
                    u[client, p] = value
                for record, value in zip(records[k], (a, fresh, b)):
                    record.append(value.detach())
        w, G = torch.stack(points).mean(0), torch.stack(momenta).mean(0)
        fresh_pos, fresh_u, fresh_neg = (torch.cat([torch.cat(r[i]) for r in records]) for i in range(3))
        pool_pos = torch.cat([fresh_pos, pool_pos])[: history * len(fresh_pos)]
        pool_u = torch.cat([fresh_u, pool_u])[: history * len(fresh_u)]
        pool_neg = torch.cat([fresh_neg, pool_neg])[: history * len(fresh_neg)]
    return w, G, u, pool_pos, pool_u


@pytest.mark.parametrize("layout", ["loop", "vmap"])
def test_fedxl2_rounds_on_cifar10_equal_a_torch_nn_transcription(problems, layout):
    problem = problems[layout]
    fed, hp = Federation(rounds=2, clients_per_round=3, local_steps=2, batch_size=8), dict(beta=0.5, gamma=0.3)
    sim = Simulation(problem, fedbench.make_algorithm("fedxl2", problem, client_lr=0.5, history_rounds=1, **hp),
                     fed, seed=4)
    for _ in range(fed.rounds):
        sim.run_round()
    w, G, u, pool_pos, pool_u = reference_fedxl2(problem, fed, 4, 0.5, history=1, **hp)
    close = dict(rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(sim.server["w"], w, **close)
    torch.testing.assert_close(sim.server["G"], G, **close)
    torch.testing.assert_close(sim.server["pool_pos"], pool_pos, **close)
    torch.testing.assert_close(sim.server["pool_u"], pool_u, **close)
    torch.testing.assert_close(sim.clients["u"], u, **close)
    assert not torch.equal(w, problem.init_params(generator(4, "init"))) and (u != 1).any()


def test_evaluation_scores_the_stored_images_with_the_network_in_eval_mode(problems):
    problem = problems["loop"]
    w = problem.init_params(generator(1, "init"))
    net = problem.model.factory()
    vector_to_parameters(w.clone(), net.parameters())
    with torch.no_grad():
        want = torch.sigmoid(net(standardised(problem.test_features))).squeeze(-1)
    torch.testing.assert_close(problem.all_scores(w, problem.test_features), want, rtol=1e-5, atol=1e-6)
    metrics = problem.evaluate_global(w)
    from sklearn.metrics import roc_auc_score
    assert metrics["test_pauc_0.3"] == pytest.approx(roc_auc_score(problem.test_labels.numpy(), want.double().numpy(),
                                                                   max_fpr=0.3), abs=1e-6)


@pytest.mark.parametrize("config, field, phrase", [
    ({**SMALL, "model": "mlp"}, "model", "found mlp with data cifar10, expected a network"),
    ({"model": "niid_cnn_cifar"}, "model", "found niid_cnn_cifar with data synthetic, expected linear or mlp"),
    ({**SMALL, "model": "pfl_cifar10_cnn"}, "model", "ConvDropoutCNN has dropout layers"),
    ({"augment": "crop_flip"}, "augment", "found crop_flip with data synthetic"),
    ({"train_size": 100}, "train_size", "found 100 with data synthetic"),
    ({**SMALL, "positive_classes": [5, 12]}, "positive_classes", "found label 12 with data cifar10"),
    ({**SMALL, "clients": 400}, "clients", "found 400, more than the"),
])
def test_what_the_images_cannot_run_is_refused_at_its_field_in_one_line(tmp_path, config, field, phrase):
    body = ", ".join(f"{k}: {v}" for k, v in config.items())
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"problem: {{name: pauc, {body}}}\nfederation: {{rounds: 1, clients_per_round: 2, local_steps: 1, "
                      "batch_size: 8}\nalgorithms: {fedxl2: {}}\n")
    first = refused(invoke("validate", recipe), f"problem.{field}: ", phrase)
    assert str(recipe) in first
