"""Federated least squares with heterogeneous clients, whose optimum is known in closed form.

Client k holds n samples x = m_k + z, z ~ N(0, I_d), with its own feature mean m_k ~ N(0, shift² I) and its own
solution w_k = 1 + heterogeneity · N(0, I), and labels y = ⟨x, w_k⟩ + noise · N(0, 1). With A_k, b_k its samples,

    F(w) = Σ_k π_k L_k(w),   L_k(w) = (1/2n) ‖A_k w − b_k‖²,   π_k = 1/N   (equal clients)
         = ½ wᵀHw − cᵀw + κ,  H = Σ_k (π_k/n) A_kᵀA_k,  c = Σ_k (π_k/n) A_kᵀb_k

so that w* = H⁻¹c (H is positive definite when the clients hold at least d samples in all, which `check` asks)
and the objective gap is exact, without an iterative reference solver: F(w) − F* = ½ (w − w*)ᵀ H (w − w*).
No client's own minimizer H_k⁻¹c_k is w* (the clients drift apart when they take many local steps), which is
what SCAFFOLD and the adaptive server optimizers address. h = 0; the initial point is 0.

Metrics: `objective` F(w), `objective_gap` F(w) − F*, `distance` ‖w − w*‖₂.
"""
from __future__ import annotations

import torch

from fedbench.hparams import Param, ParamError
from fedbench.metrics import Metric
from fedbench.problems.base import Layout, Problem
from fedbench.prox import NoRegularizer
from fedbench.rng import generator


class Quadratic(Problem):
    name = "quadratic"
    params = (
        Param("clients", "int", 16, "number of clients N", low=1),
        Param("samples_per_client", "int", 32, "samples n held by each client", low=1),
        Param("dim", "int", 20, "dimension d", low=1),
        Param("shift", "float", 0.5, "scale of each client's feature mean m_k (feature heterogeneity)", low=0),
        Param("heterogeneity", "float", 1.0, "spread of the clients' own solutions w_k around 1", low=0),
        Param("noise", "float", 0.1, "standard deviation of the label noise", low=0),
        Param("data_seed", "int", None, "seed of the data (None: the trial's seed)", low=0, nullable=True),
    )

    @classmethod
    def check(cls, config):
        if config["clients"] * config["samples_per_client"] < config["dim"]:
            raise ParamError("samples_per_client", f"found {config['samples_per_client']}: clients × "
                             f"samples_per_client must be at least dim = {config['dim']} for a unique optimum",
                             cls.name)

    @classmethod
    def declared_layout(cls, config, read_data=False):
        return Layout(config["clients"], config["samples_per_client"], "samples_per_client")

    @classmethod
    def metrics(cls, config):
        return (Metric("objective", "objective F(w)", "min"),
                Metric("objective_gap", "objective gap F(w) − F* (exact)", "min"),
                Metric("distance", "distance to the optimum ‖w − w*‖₂", "min"))

    def __init__(self, config, seed, device="cpu"):
        super().__init__(config, seed, device)
        n_clients, n, d = config["clients"], config["samples_per_client"], config["dim"]
        self.dtype, self.dim = torch.float64, d
        gen = generator(self.data_seed, "data")
        means = config["shift"] * torch.randn(n_clients, 1, d, generator=gen, dtype=self.dtype)
        features = means + torch.randn(n_clients, n, d, generator=gen, dtype=self.dtype)
        solutions = 1 + config["heterogeneity"] * torch.randn(n_clients, d, generator=gen, dtype=self.dtype)
        labels = (features * solutions[:, None, :]).sum(-1)
        labels += config["noise"] * torch.randn(n_clients, n, generator=gen, dtype=self.dtype)
        self._set_clients(torch.full((n_clients,), n, dtype=torch.long))
        self.client_weights = torch.full((n_clients,), 1.0 / n_clients, dtype=self.dtype, device=self.device)
        self.regularizer = NoRegularizer()
        self.features = features.reshape(n_clients * n, d).to(self.device)  # rows of client k: k·n … (k+1)·n − 1
        self.labels = labels.reshape(-1).to(self.device)
        # the objective as a quadratic form: each row weighs π_k / n
        row_weight = (self.client_weights / self.client_sizes).repeat_interleave(self.client_sizes)
        self.hessian = (self.features * row_weight[:, None]).T @ self.features
        self.linear = (self.features * row_weight[:, None]).T @ self.labels
        self.constant = 0.5 * (row_weight * self.labels.square()).sum()
        self.optimum = torch.linalg.solve(self.hessian, self.linear)
        self.optimal_value = self.value(self.optimum)

    def value(self, w):
        """F(w) = ½ wᵀHw − cᵀw + κ."""
        return 0.5 * w @ (self.hessian @ w) - self.linear @ w + self.constant

    # -- what the engine needs ---------------------------------------------------------------
    def init_params(self, gen):
        return torch.zeros(self.dim, dtype=self.dtype, device=self.device)

    def gather(self, rows):
        s, b = rows.shape
        flat = rows.reshape(-1)
        return self.features.index_select(0, flat).view(s, b, self.dim), self.labels[flat].view(s, b)

    def minibatch_loss(self, w, batch):
        """½ mean (⟨x, w⟩ − y)² of one client's batch; torch.func derives the gradients."""
        x, y = batch
        return 0.5 * (x @ w - y).square().mean()

    def evaluate_global(self, w):
        error = w - self.optimum
        values = torch.stack([self.value(w), 0.5 * error @ (self.hessian @ error), torch.linalg.vector_norm(error)])
        return dict(zip(("objective", "objective_gap", "distance"), values.tolist()))
