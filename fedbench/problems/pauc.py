"""Federated one-way partial-AUC maximization on imbalanced data (Guo, Jin, Luo, Yang, ICML 2023 "FeDXL";
spec 001 §1.4, §3.2, §5.2): the synthetic "SynthPAUC" benchmark.

Data (spec 001 §5.2): d features; positives x ~ N(μ₊, I); negatives a mixture of easy N(μ₋, I) and a
fraction `hard_fraction` of hard negatives N(μ_h, 0.5² I) with μ₊ = e₁, μ₋ = −e₁, μ_h = 0.8e₁ + 1.5e₂, so
that the best full-AUC ranking differs from the best low-FPR one. Train pos:neg = 1:5 per client by
default (`split: even`, as the paper's code cuts each class into N equal chunks, §3.2) or positives
spread by a Dirichlet(α) over clients (`split: dirichlet`, the stress variant; every client keeps at
least one positive). Heterogeneity (§3.2): client i adds fresh N(μ_i, 0.2²) noise, μ_i = −0.08 + 0.01·i,
to every feature of every training draw, both scaled by `noise_scale`. Test data: clean, same mixture.

Model: a score h = σ(s(w, x)) ∈ [0, 1] (spec 001 §1.4, sigmoid output) with s linear (wᵀx + b) or an MLP
d → hidden → 1 (ReLU); parameters are one flat vector, evaluated for all sampled clients at once.

Minibatches are class-balanced, as the paper's code (§2.4): each step draws b/2 positives and b/2
negatives of the client, uniformly with replacement. `grad` is the gradient of the binary cross-entropy
on them, so FedAvg on this problem is the paper's "Local SGD (CE)" baseline.

Metrics on the averaged model: `test_pauc_0.3`, `test_pauc_0.5`, `test_auc` (McClish-standardised, as
`roc_auc_score(max_fpr)`, `fedbench.metrics`), the same on the training data, and `objective`, the
pooled X-risk over all training pairs: KL-OPAUC mean₊ λ log mean₋ exp(ℓ̃/λ), ℓ̃ = (m − (h₊ − h₋))₊², for
`task: pauc`; for `task: auc` (preset `guo2023_noisy_auc`, spec 001 §1.5) the symmetric PSM loss
mean₊ mean₋ σ(h₋ − h₊) with a linear f, on training labels of which `flip_rate` of the positives and of
the negatives are flipped (test labels stay clean).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedbench.hparams import Param
from fedbench.metrics import partial_auc
from fedbench.problems.base import Problem
from fedbench.prox import NoRegularizer
from fedbench.rng import generator


class PartialAUC(Problem):
    name = "pauc"
    caps_batches = True  # class-balanced draws with replacement: any b works with any client size
    params = (
        Param("preset", "choice", "guo2023_synthetic", "paper setting whose defaults to start from",
              choices=("guo2023_synthetic", "guo2023_noisy_auc")),
        Param("clients", "int", 16, "number of clients N", low=1),
        Param("positives_per_client", "int", 40, "positives per client (their total with split: dirichlet)", low=1),
        Param("negatives_per_client", "int", 200, "negatives per client", low=1),
        Param("features", "int", 32, "feature dimension d (at least 2)", low=2),
        Param("hard_fraction", "float", 0.2, "share of hard negatives near the positives", low=0, high=1),
        Param("split", "choice", "even", "positives over clients: equal chunks or Dirichlet label skew",
              choices=("even", "dirichlet")),
        Param("dirichlet_alpha", "float", 0.3, "concentration of the Dirichlet label skew", low=0, low_open=True),
        Param("noise_scale", "float", 1.0, "multiplier of the per-client feature noise N(μ_i, 0.2²)", low=0),
        Param("pooled", "bool", False, "all clients' data on one client (the centralized reference), each sample "
              "keeping its client's noise"),
        Param("model", "choice", "linear", "score model: linear or a one-hidden-layer MLP", choices=("linear", "mlp")),
        Param("hidden", "int", 64, "hidden units of the MLP", low=1),
        Param("task", "choice", "pauc", "objective: pauc (KL-OPAUC, f = λ log) or auc (symmetric PSM loss, f linear)",
              choices=("pauc", "auc")),
        Param("flip_rate", "float", 0.0, "share of training positives and of negatives whose labels are flipped",
              low=0, high=0.5),
        Param("kl_lambda", "float", 1.0, "λ of the KL-OPAUC objective", low=0, low_open=True),
        Param("margin", "float", 1.0, "margin m of the squared hinge", low=0),
        Param("test_size", "int", 10000, "clean test samples", low=2),
        Param("data_seed", "int", None, "seed of the data (None: the trial's seed)", low=0, nullable=True),
    )
    presets = {"guo2023_synthetic": {}, "guo2023_noisy_auc": {"task": "auc", "flip_rate": 0.2}}

    def __init__(self, config: dict[str, Any], seed: int, device="cpu"):
        super().__init__(config, seed, device)
        self.dtype = torch.float32
        gen = generator(self.data_seed, "data")
        n_clients, d = config["clients"], config["features"]
        positives = self._positive_counts(gen)
        negatives = torch.full((n_clients,), config["negatives_per_client"], dtype=torch.long)
        blocks, labels, noisy_positives = [], [], []
        for k in range(n_clients):  # data generation only, once; the simulation never loops over clients
            x = torch.cat([self._draw(1, int(positives[k]), gen), self._draw(0, int(negatives[k]), gen)])
            y = torch.cat([torch.ones(int(positives[k])), torch.zeros(int(negatives[k]))])
            y = self._flip(y, gen)
            order = torch.argsort(-y, stable=True)  # (noisy) positives first: S1 is what the labels say
            blocks.append(x[order])
            labels.append(y[order])
            noisy_positives.append(int(y.sum()))
        features, labels = torch.cat(blocks), torch.cat(labels)
        source = torch.repeat_interleave(torch.arange(n_clients), positives + negatives)
        self.positive_counts = torch.tensor(noisy_positives)
        self.negative_counts = positives + negatives - self.positive_counts
        if config["pooled"]:  # one machine with everything, each sample keeping its writer's noise (§3.2)
            order = torch.argsort(-labels, stable=True)
            features, labels, source = features[order], labels[order], source[order]
            self.positive_counts = self.positive_counts.sum(0, keepdim=True)
            self.negative_counts = self.negative_counts.sum(0, keepdim=True)
        self.features, self.labels = features.to(self.device), labels.to(self.device)
        sizes = self.positive_counts + self.negative_counts
        self._set_clients(sizes)
        self.client_weights = torch.full((len(sizes),), 1.0 / len(sizes), device=self.device)  # spec 001 §1.2
        self.row_client = torch.repeat_interleave(torch.arange(len(sizes)), sizes).to(self.device)
        self.row_source = source.to(self.device)  # whose feature noise a row gets
        scale = config["noise_scale"]
        self.noise_mean = (scale * (-0.08 + 0.01 * torch.arange(n_clients, dtype=self.dtype))).to(self.device)
        self.noise_std = 0.2 * scale
        self.restart_noise()
        test_positives = config["test_size"] // 6
        self.test_features = torch.cat([self._draw(1, test_positives, gen),
                                        self._draw(0, config["test_size"] - test_positives, gen)]).to(self.device)
        self.test_labels = torch.cat([torch.ones(test_positives),
                                      torch.zeros(config["test_size"] - test_positives)]).to(self.device)
        self.hidden = config["hidden"] if config["model"] == "mlp" else 0
        self.dim = d + 1 if not self.hidden else d * self.hidden + 2 * self.hidden + 1
        self.regularizer = NoRegularizer()

    def _positive_counts(self, gen) -> Tensor:
        n_clients, per_client = self.config["clients"], self.config["positives_per_client"]
        if self.config["split"] == "even":
            return torch.full((n_clients,), per_client, dtype=torch.long)
        seed = int(torch.randint(2**31 - 1, (1,), generator=gen))  # numpy draws the Dirichlet, seeded from the stream
        shares = torch.from_numpy(np.random.default_rng(seed).dirichlet([self.config["dirichlet_alpha"]] * n_clients))
        return torch.floor(shares * (n_clients * per_client - n_clients)).long() + 1

    def _flip(self, y: Tensor, gen) -> Tensor:
        """Flip round(rate·n) random positives and as many of the negatives (spec 001 §1.5)."""
        rate = self.config["flip_rate"]
        if not rate:
            return y
        flipped = y.clone()
        for label in (1.0, 0.0):
            members = torch.nonzero(y == label).squeeze(1)
            chosen = members[torch.randperm(len(members), generator=gen)[: round(rate * len(members))]]
            flipped[chosen] = 1.0 - label
        return flipped

    def _draw(self, label: int, count: int, gen) -> Tensor:
        d = self.config["features"]
        x = torch.randn(count, d, generator=gen)
        if label == 1:
            x[:, 0] += 1.0
            return x
        hard = torch.rand(count, generator=gen) < self.config["hard_fraction"]
        x[~hard, 0] -= 1.0
        x[hard] *= 0.5
        x[hard, 0] += 0.8
        x[hard, 1] += 1.5
        return x

    # -- the score model, for a batch of parameter vectors [S, dim] -----------------------------
    def logits(self, w: Tensor, x: Tensor) -> Tensor:
        """s(w, x) for w [S, dim] and x [S, b, d]: [S, b]."""
        d = x.shape[-1]
        if not self.hidden:
            return torch.baddbmm(w[:, d:].unsqueeze(-1), x, w[:, :d].unsqueeze(-1)).squeeze(-1)
        h = self.hidden
        first = w[:, : d * h].view(-1, d, h)
        bias1 = w[:, d * h: d * h + h]
        second = w[:, d * h + h: d * h + 2 * h]
        bias2 = w[:, -1:]
        hidden = torch.relu(torch.bmm(x, first) + bias1.unsqueeze(1))
        return torch.bmm(hidden, second.unsqueeze(-1)).squeeze(-1) + bias2

    def scores(self, w: Tensor, x: Tensor) -> Tensor:
        return torch.sigmoid(self.logits(w, x))

    # -- engine interface ----------------------------------------------------------------------
    def restart_noise(self) -> None:
        self.noise_gen = generator(self.seed, "feature-noise")

    def init_params(self, gen: torch.Generator) -> Tensor:
        """The initial point; also restarts the feature-noise stream, so that every simulation of this
        problem instance draws the same noise."""
        self.restart_noise()
        d = self.config["features"]
        if not self.hidden:
            return torch.zeros(self.dim, dtype=self.dtype, device=self.device)
        h = self.hidden  # PyTorch's default uniform(±1/√fan_in) for both layers
        parts = [(torch.rand(d * h + h, generator=gen) * 2 - 1) / math.sqrt(d),
                 (torch.rand(h + 1, generator=gen) * 2 - 1) / math.sqrt(h)]
        return torch.cat(parts).to(self.dtype).to(self.device)

    def draw_minibatches(self, clients: Tensor, steps: int, batch_size: int, gen: torch.Generator) -> Tensor:
        """Rows `[steps, S, b]`: b//2 positives then b − b//2 negatives of each client, with replacement."""
        positives = batch_size // 2
        shape = (steps, len(clients))
        pos_keys = torch.rand(*shape, positives, generator=gen)
        neg_keys = torch.rand(*shape, batch_size - positives, generator=gen)
        offsets = self.client_offsets_cpu[clients][:, None]
        n_pos = self.positive_counts[clients][:, None]
        n_neg = self.negative_counts[clients][:, None]
        rows = torch.cat([offsets + (pos_keys * n_pos).long(), offsets + n_pos + (neg_keys * n_neg).long()], dim=-1)
        return rows.to(self.device)

    def gather(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """Features with each client's fresh noise N(μ_i, (0.2·scale)²) (spec 001 §3.2), and labels."""
        s, b = rows.shape
        flat = rows.reshape(-1)
        noise = torch.randn(s * b, self.features.shape[1], generator=self.noise_gen, dtype=self.dtype)
        noisy = self.features[flat] + self.noise_mean[self.row_source[flat]].unsqueeze(-1) \
            + self.noise_std * noise.to(self.device)
        return noisy.view(s, b, -1), self.labels[flat].view(s, b)

    def grad(self, w: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        """Gradient of the mean binary cross-entropy of σ(s(w, x)), for every sampled client at once."""
        x, y = batch
        w = w.detach().requires_grad_(True)
        loss = F.binary_cross_entropy_with_logits(self.logits(w, x), y, reduction="none").mean(-1).sum()
        return torch.autograd.grad(loss, w)[0]

    def step_oracle(self, rows: Tensor) -> "PairMinibatch":
        return PairMinibatch(self, rows)

    # -- the X-risk (spec 001 §1.4): F(w) = mean₊ f(mean₋ ℓ(h₊, h₋)), f = λ log, ℓ = exp(ℓ̃/λ) ----------------
    def pair_loss(self, a: Tensor, b: Tensor) -> Tensor:
        """ℓ(a, b) for positive scores a and negative scores b (broadcast): exp((m − (a − b))₊² / λ) for
        the pAUC task (§1.4), the symmetric PSM loss σ(b − a) for the AUC task (§1.5)."""
        if self.config["task"] == "auc":
            return torch.sigmoid(b - a)
        lam, margin = self.config["kl_lambda"], self.config["margin"]
        return torch.exp((margin - (a - b)).clamp_min(0) ** 2 / lam)

    def outer_grad(self, u: Tensor) -> Tensor:
        """∇f(u): λ / u for f = λ log (pAUC); 1 for the linear f of the AUC task."""
        if self.config["task"] == "auc":
            return torch.ones_like(u)
        return self.config["kl_lambda"] / u

    def scores_by_class(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """Scores under w of every training positive and of every negative (by the training labels)."""
        h = self.scores(w.unsqueeze(0), self.features.unsqueeze(0))[0]
        return h[self.labels == 1], h[self.labels == 0]

    def pooled_objective(self, w: Tensor) -> float:
        """The task's X-risk over all training pairs: mean₊ λ log mean₋ exp((m − (h₊ − h₋))₊²/λ) (pAUC),
        or mean₊ mean₋ σ(h₋ − h₊) (AUC), with the (possibly flipped) training labels."""
        positives, negatives = self.scores_by_class(w)
        positives, negatives = positives[:, None], negatives[None, :]
        if self.config["task"] == "auc":
            return float(torch.sigmoid(negatives - positives).mean())
        lam, margin = self.config["kl_lambda"], self.config["margin"]
        hinge = (margin - (positives - negatives)).clamp_min(0) ** 2
        inner = torch.logsumexp(hinge / lam, dim=1) - math.log(hinge.shape[1])
        return float((lam * inner).mean())

    def evaluate(self, w: Tensor, personal: Tensor | None = None) -> dict[str, float]:
        metrics = {}
        for split, x, y in (("train", self.features, self.labels), ("test", self.test_features, self.test_labels)):
            scores = self.scores(w.unsqueeze(0), x.unsqueeze(0))[0].double().cpu().numpy()
            labels = y.cpu().numpy()
            for beta in (0.3, 0.5):
                metrics[f"{split}_pauc_{beta}"] = partial_auc(labels, scores, beta)
            metrics[f"{split}_auc"] = partial_auc(labels, scores)
        metrics["objective"] = self.pooled_objective(w)
        return metrics


class PairMinibatch:
    """One local step of the sampled clients: b₁ positives then b₂ negatives each. Callable as the
    cross-entropy gradient (what FedAvg uses); X-risk algorithms call `surrogate_grad` with a loss of
    the positive and negative scores and get its gradient for every client at once."""

    def __init__(self, problem: PartialAUC, rows: Tensor):
        self.problem = problem
        self.x, self.y = problem.gather(rows)
        self.positives = rows.shape[1] // 2
        owners = problem.row_client[rows[:, : self.positives]]
        self.positive_index = rows[:, : self.positives] - problem.client_offsets[owners]  # into each client's positives

    def __call__(self, w: Tensor) -> Tensor:
        return self.problem.grad(w, (self.x, self.y))

    def surrogate_grad(self, w: Tensor, surrogate) -> tuple[Tensor, Tensor]:
        """(∇_w Σ_clients surrogate(h₊ [S,b₁], h₋ [S,b₂]), the detached scores [S,b]); surrogate returns [S]."""
        w = w.detach().requires_grad_(True)
        h = self.problem.scores(w, self.x)
        loss = surrogate(h[:, : self.positives], h[:, self.positives:]).sum()
        return torch.autograd.grad(loss, w)[0], h.detach()
