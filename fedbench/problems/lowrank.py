"""Federated low-rank matrix estimation (trace regression with dense Gaussian sensing matrices).

Presets:
* `bao2022` — Bao et al. (ICML 2022, §4, Example 3.2, Figure 2): 64 clients × 128 samples, 32×32,
  W* = diag(1_16, 0), X = Z_k + A with per-client Z_k ~ N(0,1) entries (`shared_shift: true` mimics the
  authors' released `NuclearRun.m`, where every client uses the last client's Z), λ = 0.1, initial point
  N(0, I) (the released code).
* `fbe_completion` — matrix completion of the pFedFBE paper (ICLR 2023 submission, §4.2): 30 clients × 128,
  client truth W_j = diag(1,1,1,1, 0, …) plus 0.25 on one diagonal entry drawn per client from positions 5..32
  (rank 5), λ = 0.1 (the paper's nuclear-norm weight), an unpenalized intercept; initial point 0, 128 held-out
  samples per client and the rank threshold 0.01 are our choices (the paper gives none of them).

Metrics (Bao et al., §4, as the released `eval_metric_nuc.m`; the pFedFBE paper, §4.2): Frobenius and
operator-norm error to the (client's) truth, numerical rank (default tolerance MATLAB's `rank`:
max(p1,p2)·eps(σ_max); `fbe_completion` uses 0.01), averaged over clients.
"""
from __future__ import annotations

import torch
from torch import Tensor

from fedbench.hparams import Param, ParamError
from fedbench.metrics import Metric
from fedbench.problems.least_squares import COMMON_PARAMS, SIZE_PARAMS, LeastSquares
from fedbench.prox import Nuclear


class LowRank(LeastSquares):
    name = "lowrank"
    params = (
        Param("preset", "choice", "bao2022", "paper setting whose defaults to start from",
              choices=("bao2022", "fbe_completion")),
        *COMMON_PARAMS,
        Param("rows", "int", 32, "p1", low=1),
        Param("cols", "int", 32, "p2", low=1),
        Param("rank", "int", 16, "leading diagonal entries of the truth equal to 1 (shared)", low=0),
        Param("personal_value", "float", 0.0,
              "value of one client-specific diagonal entry beyond `rank` (0: none)"),
        Param("shared_shift", "bool", False, "all clients use one shift Z (the released script's bug)"),
        Param("lam", "float", 0.1, "nuclear-norm weight λ of h = λ‖W‖_nuc", low=0, log=True),
        Param("rank_tol", "float", None, "singular values above this count (None: MATLAB's default)",
              low=0, low_open=True, nullable=True),
    )
    presets = {
        "bao2022": {},
        "fbe_completion": {"clients": 30, "rank": 4, "personal_value": 0.25, "init": "zeros", "intercept": True,
                           "test_samples_per_client": 128, "rank_tol": 0.01},
    }

    recovery = (Metric("fro_error", "Frobenius error ‖W − W*‖_F", "min"),
                Metric("op_error", "operator-norm error ‖W − W*‖₂", "min"), Metric("rank", "numerical rank of W"))
    size_params = ("rows", "cols", *SIZE_PARAMS)

    @classmethod
    def declared_dim(cls, config):
        return config["rows"] * config["cols"]

    @classmethod
    def check(cls, config):
        size, rank = min(config["rows"], config["cols"]), config["rank"]
        if rank + (config["personal_value"] != 0) > size:
            personal = " and the personal entry beyond it (personal_value is not 0)" if rank <= size else ""
            raise ParamError("rank", f"found {rank}{personal}, expected at most min(rows, cols) = {size} diagonal "
                             "entries", cls.name)

    def __init__(self, config, seed, device="cpu"):
        self.shape = (config["rows"], config["cols"])
        self.feature_dim = self.shape[0] * self.shape[1]
        super().__init__(config, seed, device)

    def make_truth(self, gen: torch.Generator) -> Tensor:
        n_clients, r = self.config["clients"], self.config["rank"]
        diagonal = torch.zeros(n_clients, min(self.shape), dtype=torch.float64)
        diagonal[:, :r] = 1.0
        if self.config["personal_value"]:
            picks = torch.randint(r, min(self.shape), (n_clients, 1), generator=gen)
            diagonal.scatter_(1, picks, self.config["personal_value"])
        truth = torch.zeros(n_clients, *self.shape, dtype=torch.float64)
        truth.diagonal(dim1=-2, dim2=-1).copy_(diagonal)
        return truth.reshape(n_clients, -1)

    def make_regularizer(self):
        return Nuclear(self.config["lam"], self.shape, self.config["domain_radius"])

    def parameters(self, w: Tensor) -> dict[str, Tensor]:
        """The model as the matrix it estimates, `W` `[rows, cols]`, and its intercept `b` `[1]` where it has one
        (`fbe_completion`: the pFedFBE paper's ⟨W, X⟩ + b)."""
        matrix = {"W": w[: self.feature_dim].view(*self.shape)}
        return matrix if self.dim == self.feature_dim else {**matrix, "b": w[self.feature_dim:]}

    def recovery_metrics(self, models: Tensor, truth: Tensor | None = None) -> dict[str, Tensor]:
        truth = self.truth if truth is None else truth
        matrices = models.reshape(-1, *self.shape)
        error_sv = torch.linalg.svdvals(matrices - truth.reshape(-1, *self.shape))
        model_sv = torch.linalg.svdvals(matrices)
        tol = self.config["rank_tol"]
        if tol is None:
            top = model_sv[:, :1]
            tol = max(self.shape) * (torch.nextafter(top, torch.full_like(top, float("inf"))) - top)
        return {
            "fro_error": torch.linalg.vector_norm(error_sv, dim=-1),
            "op_error": error_sv[:, 0],
            "rank": (model_sv > tol).sum(-1).to(models.dtype),
        }
