"""The ordinary losses f'_m of the devices in Hanzely et al.'s block problems (`fedbench.problems.pfl`), on a linear
model θ of one sample's features: binary logistic regression (`BinaryLogistic`, the authors' synthetic data) and
softmax regression (`Softmax`, their image code). Each gives the loss, the residuals ∂ℓ/∂outputs and the gradient as
their product with the features, batched over clients (`[S, b, ...]` rows) and over runs (`[K, S, D]` points).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

SOFTPLUS_IDENTITY = 50.0  # e^{-50}/50 ~ 4e-24: beyond, log(1 + e^z) is z in float64 (PyTorch's default cut is 20)


class BinaryLogistic:
    """f'(θ; x, y) = binary cross-entropy of σ(xᵀθ) (the authors' synthetic model, no bias)."""

    def __init__(self, features: int):
        self.dim = features
        self.residual_width = 1

    def logits(self, theta: Tensor, x: Tensor) -> Tensor:
        """xᵀθ of every row: θ `[S, d]` on each client's rows x `[S, b, d]`, or the θ `[K, S, d]` of K runs on
        the same rows (evaluation): one matrix product per client for all runs, [S, b, d]·[S, d, K] (on all of a
        device's 1000 rows ~2.5x one vecdot at K = 1, ~20x per run at K = 30, measured here), as a `[K, S, b]`
        view of the product. A minibatch of one row (the coordinate methods') takes one vecdot (~1.6x the
        multiply-and-sum); of several rows, one matrix-vector product per client (pFedMe's 20 rows in a batch of
        30 runs, [30, 20, 20, 15]: 105 µs against vecdot's 172 µs here; alone, the same)."""
        if theta.dim() == x.dim():
            return torch.bmm(x, theta.permute(1, 2, 0)).permute(2, 0, 1)
        if x.shape[-2] > 1:
            return torch.matmul(x, theta.unsqueeze(-1)).squeeze(-1)
        return torch.linalg.vecdot(x, theta.unsqueeze(-2))

    def loss(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """The cross-entropy of labels y ∈ {0, 1} as softplus((1 − 2y)·z) = log(1 + e^{−(2y−1)z}): one
        transcendental kernel where binary_cross_entropy_with_logits takes several (the evaluation of 30 runs on
        S1's 20 000 rows: 6.9 → 4.3 ms here). The logits are made contiguous whatever the product's layout, so
        that a run's mean over its rows reduces in one order alone and in a batch (bit for bit); softplus is z
        itself only beyond SOFTPLUS_IDENTITY, where log(1 + e^z) rounds to z."""
        signed = self.logits(theta, x).contiguous().mul_(1 - 2 * y)
        return F.softplus(signed, threshold=SOFTPLUS_IDENTITY).mean(-1)

    def residuals(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        return torch.sigmoid(self.logits(theta, x)).sub_(y).unsqueeze(-1)

    def grad_of_residuals(self, residuals: Tensor, x: Tensor) -> Tensor:
        terms = residuals * x
        # one row (the coordinate methods' single samples): the mean is the row itself, without a reduction
        # kernel (~25 µs on [1280, 1, 15] here, for nothing)
        return terms.squeeze(-2) if x.shape[-2] == 1 else terms.mean(-2)

    def grad(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        return self.grad_of_residuals(self.residuals(theta, x, y), x)

    def correct(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        return (self.logits(theta, x) > 0).to(y.dtype) == y


class Softmax:
    """f'(Θ; x, y) = cross-entropy of softmax(W x + b), Θ = (W [C, p], b [C]) flattened row by row
    (`nn.Linear(784, 10)` of the authors' image code)."""

    def __init__(self, features: int, classes: int):
        self.features, self.classes = features, classes
        self.dim = classes * (features + 1)
        self.residual_width = classes

    def logits(self, theta: Tensor, x: Tensor) -> Tensor:
        """Θ `[S, D]` on each client's rows x `[S, b, p]`, or the Θ `[K, S, D]` of K runs on the same rows."""
        table = theta.reshape(*theta.shape[:-1], self.classes, self.features + 1)
        return torch.einsum("...bp,...cp->...bc", x, table[..., :-1]) + table[..., -1].unsqueeze(-2)

    def loss(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        logits = self.logits(theta, x)
        labels = y.expand(logits.shape[:-1])
        return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none").view(labels.shape).mean(-1)

    def residuals(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        probabilities = torch.softmax(self.logits(theta, x), -1)
        return probabilities - F.one_hot(y, self.classes).to(probabilities.dtype)

    def grad_of_residuals(self, residuals: Tensor, x: Tensor) -> Tensor:
        weights = torch.einsum("...bc,...bp->...cp", residuals, x) / x.shape[-2]
        return torch.cat([weights, residuals.mean(-2).unsqueeze(-1)], -1).flatten(-2)

    def grad(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        return self.grad_of_residuals(self.residuals(theta, x, y), x)

    def correct(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        return self.logits(theta, x).argmax(-1) == y
