"""The X-risk objectives of the `pauc` problem (Guo et al., ICML 2023, eq. (8) and §4): F(w) = mean₊ f(mean₋
ℓ(h₊, h₋)) over pairs of a positive score h₊ and a negative score h₋. A task gives the pair loss ℓ, the outer
function's derivative ∇f (what the FeDXL estimators weight by) and the exact pooled objective; a new X-risk is
one more class with these three.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

PAIR_CHUNK = 2**18  # pairs per pass of the objective: 1 MB temporaries (~4x faster than one pass over all)


def pair_differences(positives: Tensor, negatives: Tensor):
    """h₊ − h₋ for all pairs, in blocks of positives `[rows, n₋]` of about PAIR_CHUNK pairs (fresh tensors)."""
    rows = max(1, PAIR_CHUNK // len(negatives))
    for start in range(0, len(positives), rows):
        yield positives[start: start + rows, None] - negatives[None, :]


class PartialAUC:
    """One-way partial AUC as KL-OPAUC (Guo et al., eq. (14)): f = λ log, ℓ(a, b) = exp((m − (a − b))₊² / λ), the
    sign of the authors' released code (eq. (14) prints (h(w, z) + 1 − h(w, z'))₊², a sign slip)."""
    linear_outer = False

    def __init__(self, kl_lambda: float, margin: float):
        self.kl_lambda, self.margin = kl_lambda, margin

    def pair_loss(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.exp((self.margin - (a - b)).clamp_min(0) ** 2 / self.kl_lambda)

    def outer_grad(self, u: Tensor) -> Tensor:
        """∇f(u) = λ / u."""
        return self.kl_lambda / u

    def objective(self, positives: Tensor, negatives: Tensor) -> float:
        """mean₊ λ log mean₋ exp((m − (h₊ − h₋))₊² / λ), by log-sum-exp over each positive's row."""
        lam = self.kl_lambda
        inner = [torch.logsumexp(diff.neg_().add_(self.margin).clamp_min_(0).square_().div_(lam), dim=1)
                 for diff in pair_differences(positives, negatives)]
        return float((lam * (torch.cat(inner) - math.log(len(negatives)))).mean())


class AUC:
    """Full AUC with the symmetric PSM loss (Guo et al., §4): f linear, ℓ(a, b) = σ(b − a)."""
    linear_outer = True

    def pair_loss(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.sigmoid(b - a)

    def outer_grad(self, u: Tensor) -> Tensor:
        return torch.ones_like(u)

    def objective(self, positives: Tensor, negatives: Tensor) -> float:
        """mean₊ mean₋ σ(h₋ − h₊), summed in float64."""
        per_positive = [torch.sigmoid(diff.neg_()).sum(1, dtype=torch.float64)
                        for diff in pair_differences(positives, negatives)]
        return float(torch.cat(per_positive).sum() / (len(positives) * len(negatives)))


def make_task(config) -> PartialAUC | AUC:
    return AUC() if config["task"] == "auc" else PartialAUC(config["kl_lambda"], config["margin"])
