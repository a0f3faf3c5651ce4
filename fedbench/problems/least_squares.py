"""Federated least squares with a shifted Gaussian design, shared by the Lasso and low-rank problems.

Client k draws a fixed feature shift m_k and samples x = m_k + z, z ~ N(0, Σ) with the AR(1)
covariance Σ_ij = ρ^|i−j| (ρ = 0: identity), and labels y = ⟨x, w_k⟩ + ε, ε ~ N(0, σ²). This is
the design of Bao et al. (ICML 2022, §4: Example 3.1, the Lasso, δ_k = m_k; Example 3.2, trace regression on
vec(X)), and of the pFedFBE paper (ICLR 2023 submission, §4.1–4.2: settings (I)/(II) and matrix completion,
where w_k may differ per client).

Per-sample loss f(w; x, y) = ½(⟨x, w⟩ − y)²; global objective Σ_k π_k L_k(w) + h(w) with
L_k the client's empirical mean and π_k = n_k / N (Bao et al., Examples 3.1–3.2; equal to 1/N_c for equal n_k,
the equal weights of the pFedFBE paper's eq. (1)). Training loss metric: plain MSE over all samples, no ½ (as
Bao et al.'s released `eval_metric_lasso.m` and `eval_metric_nuc.m`).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
from torch import Tensor

from fedbench.hparams import Param
from fedbench.metrics import Metric
from fedbench.oracle import Oracle, RunAxisOracle
from fedbench.problems.base import Layout, Problem
from fedbench.prox import Regularizer
from fedbench.rng import generator

COMMON_PARAMS = (
    Param("clients", "int", 64, "number of clients N_c", low=1),
    Param("samples_per_client", "int", 128, "samples n_k held by each client", low=1),
    Param("shift", "float", 1.0, "scale of each client's feature shift m_k (feature heterogeneity)", low=0),
    Param("noise", "float", 1.0, "standard deviation of the label noise ε", low=0),
    Param("intercept", "bool", False, "fit an unpenalized intercept (the b of the pFedFBE paper)"),
    Param("init", "choice", "randn", "initial point: N(0, I) shared by all methods (Bao et al.'s code) or zeros",
          choices=("randn", "zeros")),
    Param("domain_radius", "float", None, "‖w‖₂ ≤ radius domain of the theory (None: unconstrained)",
          low=0, low_open=True, nullable=True),
    Param("test_samples_per_client", "int", 0, "held-out samples per client, drawn from the client's distribution "
          "after the training data, for a test MSE (0: none)", low=0),
    Param("data_seed", "int", None, "seed of the data (None: the trial's seed)", low=0, nullable=True),
)

SIZE_PARAMS = ("clients", "samples_per_client", "test_samples_per_client")  # and the subclass's dimensions
TRAIN_MSE = Metric("train_mse", "training loss (mean squared error)", "min")
TEST_MSE = Metric("test_mse", "test mean squared error (held-out samples)", "min")


class LeastSquares(Problem):
    feature_dim: int  # penalized coordinates (the intercept, if any, comes after)
    provides = frozenset({"hvp", "exact_hvp", "full_data", "personal_evaluation", "norm_ball"})
    recovery: tuple[Metric, ...]  # the subclass's recovery metrics, as `recovery_metrics` returns them
    oracles_take_runs = True  # `LeastSquaresOracle`: FedMiD's Lasso steps are ~0.5 ms, the lifting ~20 µs of them

    @classmethod
    def declared_layout(cls, config, read_data=False):
        return Layout(config["clients"], config["samples_per_client"], "samples_per_client")

    @classmethod
    def declared_dim(cls, config: dict[str, Any]) -> int:
        """The penalized coordinates a config makes (`feature_dim`), without building the problem."""
        raise NotImplementedError

    @classmethod
    def run_bytes(cls, config):
        d = cls.declared_dim(config) + config["intercept"]
        rows = config["clients"] * (config["samples_per_client"] + config["test_samples_per_client"])
        # float64: the samples' features and the draws they are made from (three copies at the peak, with the AR(1)
        # transposes), the clients' shifts and truths, the objective's d × d Hessian and the reference solver's copy
        return 8 * (3 * rows * d + 2 * config["clients"] * d + 2 * d * d)

    @classmethod
    def metrics(cls, config):
        return (*cls._mse(config), Metric("objective", "objective F(w) = f(w) + h(w)", "min"),
                Metric("objective_gap", "objective gap F(w) − F*", "min"), *cls.recovery)

    @classmethod
    def personal_metrics(cls, config):
        return (*cls._mse(config), *cls.recovery)

    @staticmethod
    def _mse(config) -> tuple[Metric, ...]:
        return (TRAIN_MSE, TEST_MSE) if config["test_samples_per_client"] else (TRAIN_MSE,)

    def __init__(self, config: dict[str, Any], seed: int, device="cpu"):
        super().__init__(config, seed, device)
        n_clients, n = config["clients"], config["samples_per_client"]
        self.dtype = torch.float64
        gen = generator(self.data_seed, "data")
        p = self.feature_dim
        shifts = config["shift"] * torch.randn(n_clients, p, generator=gen, dtype=self.dtype)
        if config.get("shared_shift"):
            shifts = shifts[-1:].expand(n_clients, p)  # the `Mu_set{m}` of Bao et al.'s NuclearRun.m
        z = ar1_gaussian(torch.randn(n_clients * n, p, generator=gen, dtype=self.dtype), self.ar_rho)
        features = shifts[:, None, :] + z.view(n_clients, n, p)
        self.truth = self.make_truth(gen).to(self.dtype)  # [N, p]
        labels = (features * self.truth[:, None, :]).sum(-1)
        labels += config["noise"] * torch.randn(n_clients, n, generator=gen, dtype=self.dtype)
        self.features, self.labels = self._rows(features, labels)
        self.dim = self.features.shape[-1]
        self.test_features = self.test_labels = None
        n_test = config["test_samples_per_client"]
        if n_test:  # drawn after everything else: the training data stay those of the same seed without a test set
            z = ar1_gaussian(torch.randn(n_clients * n_test, p, generator=gen, dtype=self.dtype), self.ar_rho)
            test = shifts[:, None, :] + z.view(n_clients, n_test, p)
            test_labels = (test * self.truth[:, None, :]).sum(-1)
            test_labels += config["noise"] * torch.randn(n_clients, n_test, generator=gen, dtype=self.dtype)
            self.test_features, self.test_labels = self._rows(test, test_labels)
        self.truth = self.truth.to(self.device)
        self.shared_truth = bool((self.truth == self.truth[:1]).all())  # every client's model is the same
        self._set_clients(torch.full((n_clients,), n, dtype=torch.long))
        self.client_weights = (self.client_sizes / self.client_sizes.sum()).to(self.dtype)
        self.regularizer = self.make_regularizer()
        self._quadratic: tuple[Tensor, Tensor, Tensor] | None = None

    def _rows(self, features: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """`[N, n, p]` features (with the intercept's column of ones appended) and `[N, n]` labels as flat rows."""
        n_clients, n, _ = features.shape
        if self.config["intercept"]:
            features = torch.cat([features, features.new_ones(n_clients, n, 1)], dim=-1)
        return features.reshape(n_clients * n, -1).to(self.device), labels.reshape(-1).to(self.device)

    # -- subclass hooks ------------------------------------------------------------------------
    ar_rho = 0.0

    def make_truth(self, gen: torch.Generator) -> Tensor:
        raise NotImplementedError

    def make_regularizer(self) -> Regularizer:
        raise NotImplementedError

    def recovery_metrics(self, models: Tensor, truth: Tensor | None = None) -> dict[str, Tensor]:
        """Per-client recovery metrics of `models` `[N, p]` against `truth` (default `self.truth` `[N, p]`), each
        `[N]`."""
        raise NotImplementedError

    # -- engine interface ----------------------------------------------------------------------
    def init_params(self, gen: torch.Generator) -> Tensor:
        if self.config["init"] == "zeros":
            return torch.zeros(self.dim, dtype=self.dtype, device=self.device)
        return torch.randn(self.dim, generator=gen, dtype=self.dtype).to(self.device)

    def gather(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """Features `[..., b, d]` and labels `[..., b]` of `rows` `[..., b]`, whatever their leading axes."""
        flat = rows.reshape(-1)
        return (self.features.index_select(0, flat).view(*rows.shape, self.dim),
                self.labels.index_select(0, flat).view(rows.shape))

    def step_oracle(self, rows: Tensor, noise: Tensor | None = None) -> LeastSquaresOracle:
        return LeastSquaresOracle(self, rows)

    def minibatch_loss(self, w: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        """½ mean (⟨x, w⟩ − y)² of one client's batch."""
        x, y = batch
        return 0.5 * (x @ w - y).square().mean()

    # `loss`, `grad` and `hvp` take points `[..., d]` with the batch's leading axes (`[S]`, or `[R, S]` on the run
    # axis: `oracles_take_runs`), or `[R, 1, d]` shared by a run's clients. Row layout (w as `[C, 1, d]` times Xᵀ):
    # measured ~2x faster than `[C, b, d] @ [C, d, 1]` on CPU; the leading axes folded into one for `bmm`, which a
    # `matmul` of 4-D operands reaches through extra reshapes (+4-7 µs a product, ~10% of a Lasso step at p = 1024).
    def loss(self, w: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        residual = torch.bmm(_points(w, x), _rows(x).transpose(1, 2)).view(y.shape) - y
        return 0.5 * residual.square().mean(-1)

    def grad(self, w: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        """(1/b) Xᵀ(Xw − y) per client."""
        x, y = batch
        rows = _rows(x)
        residual = torch.bmm(_points(w, x), rows.transpose(1, 2)) - y.view(-1, 1, y.shape[-1])
        return _per_client(torch.bmm(residual, rows), x) / x.shape[-2]

    def hvp(self, w: Tensor, v: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        """(1/b) Xᵀ X v: the Hessian of the ½-MSE does not depend on w."""
        x, _ = batch
        rows = _rows(x)
        return _per_client(torch.bmm(torch.bmm(_points(v, x), rows.transpose(1, 2)), rows), x) / x.shape[-2]

    # -- the centralized objective -------------------------------------------------------------
    def quadratic(self) -> tuple[Tensor, Tensor, Tensor]:
        """(H, c, κ) with Σ_k π_k L_k(w) = ½ wᵀHw − cᵀw + κ, computed once."""
        if self._quadratic is None:
            row_weight = (self.client_weights / self.client_sizes).repeat_interleave(self.client_sizes)
            weighted = self.features * row_weight[:, None]
            hessian = weighted.T @ self.features
            linear = weighted.T @ self.labels
            constant = 0.5 * (row_weight * self.labels**2).sum()
            self._quadratic = (hessian, linear, constant)
        return self._quadratic

    def smooth_value(self, w: Tensor) -> Tensor:
        hessian, linear, constant = self.quadratic()
        return 0.5 * w @ (hessian @ w) - linear @ w + constant

    def objective(self, w: Tensor) -> Tensor:
        return self.smooth_value(w) + self.regularizer.value(w)

    def instance_key(self) -> str:
        """Identifies the data and objective (not the trial seed beyond the data it generates)."""
        config = {**self.config, "data_seed": self.data_seed, "init": None}
        text = json.dumps([self.name, config, str(self.dtype)], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def evaluate_global(self, w: Tensor) -> dict[str, float]:
        from fedbench.reference import solve  # reference imports problems for typing only

        objective = self.objective(w)
        metrics = {"train_mse": (self.features @ w - self.labels).square().mean()}
        if self.test_features is not None and self.test_labels is not None:
            metrics["test_mse"] = (self.test_features @ w - self.test_labels).square().mean()
        metrics["objective"] = objective
        metrics["objective_gap"] = objective - solve(self).objective
        # the global model against each client's truth; one comparison when the truths are all equal (the low-rank
        # problem's recovery metrics are two SVDs per comparison: 64 of the same matrix took 45% of an evaluation)
        if self.shared_truth:
            return self._floats(metrics, w.unsqueeze(0), self.truth[:1])
        return self._floats(metrics, w.expand(self.num_clients, self.dim))

    def evaluate_personal(self, models: Tensor) -> dict[str, float]:
        """Client k's model on client k's samples (MSE pooled over all samples) and against its own truth."""
        metrics = {"train_mse": self._personal_mse(models, self.features, self.labels)}
        if self.test_features is not None and self.test_labels is not None:
            metrics["test_mse"] = self._personal_mse(models, self.test_features, self.test_labels)
        return self._floats(metrics, models)

    def _personal_mse(self, models: Tensor, features: Tensor, labels: Tensor) -> Tensor:
        x = features.view(self.num_clients, -1, self.dim)
        residual = torch.bmm(models.unsqueeze(1), x.transpose(1, 2)).reshape(-1) - labels
        return residual.square().mean()

    def _floats(self, metrics: dict[str, Tensor], models: Tensor, truth: Tensor | None = None) -> dict[str, float]:
        """`metrics` and the recovery metrics of `models` `[N, d]` against the clients' truths (or of `[1, d]`
        against the truth they all share) averaged over clients, in one host transfer."""
        for name, per_client in self.recovery_metrics(models[:, : self.feature_dim], truth).items():
            metrics[name] = per_client.mean()
        names = list(metrics)
        values = torch.stack([torch.as_tensor(metrics[k], dtype=self.dtype) for k in names]).tolist()
        return dict(zip(names, values))


def _rows(x: Tensor) -> Tensor:
    """Each client's minibatch `[..., b, d]` as `[C, b, d]`."""
    return x.view(-1, x.shape[-2], x.shape[-1])


def _points(w: Tensor, x: Tensor) -> Tensor:
    """Each client's point `[C, 1, d]` from `w` `[..., d]`, given per client or shared (`[R, 1, d]`)."""
    if w.shape[:-1] != x.shape[:-2]:
        w = w.expand(*x.shape[:-2], w.shape[-1])
    return w.reshape(-1, 1, w.shape[-1])


def _per_client(products: Tensor, x: Tensor) -> Tensor:
    """`[C, 1, d]` products back to the clients' leading axes, `[..., d]`."""
    return products.view(*x.shape[:-2], products.shape[-1])


def ar1_gaussian(e: Tensor, rho: float) -> Tensor:
    """Rows of N(0, Σ) with Σ_ij = ρ^|i−j| from i.i.d. N(0,1) rows `e`, by the recursion
    z_1 = e_1, z_j = ρ z_{j−1} + √(1−ρ²) e_j (Bao et al., ICML 2022, §4: ρ = 0.5)."""
    if rho == 0:
        return e
    columns = e.T.contiguous()
    scale = (1 - rho**2) ** 0.5
    for j in range(1, columns.shape[0]):
        columns[j].mul_(scale).add_(columns[j - 1], alpha=rho)
    return columns.T.contiguous()


class LeastSquaresOracle(RunAxisOracle):
    """One local step's minibatch of the sampled clients, rows `[S, b]` or `[R, S, b]` of R runs
    (`Problem.oracles_take_runs`): the closed forms take a point the clients share as it is (they copy it to each
    client themselves, `_points`), so only torch's derivatives (`autograd_hvp`) need the oracle to copy it."""

    def __init__(self, problem: LeastSquares, rows: Tensor):
        super().__init__(problem, problem.gather(rows))
        self.clients = rows.shape[:-1]

    loss, grad, hvp = Oracle.loss, Oracle.grad, Oracle.hvp
