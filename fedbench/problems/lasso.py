"""Federated sparse linear regression (the Lasso).

Presets:
* `bao2022` — Bao et al. (ICML 2022, §4, Example 3.1, Figure 1): 64 clients × 128 samples,
  p = 1024, w* = (1_512, 0_512), AR(1) covariance 0.5^|i−j|, client shifts δ_k ~ N(0, I),
  λ = 0.5⁵, initial point N(0, I) (the authors' released `LassoRun.m`).
* `fbe_iid` — setting (I) of the pFedFBE paper (ICLR 2023 submission, §4.1): 30 clients × 128, shared
  w_real = (1_992, 0_32), identity covariance, client means m_j ~ N(0, I), λ = 0.1 (the paper's ℓ1 weight, which
  it also calls λ beside its FBE λ), an unpenalized intercept b (b_real = 0); initial point 0 and 128 held-out
  samples per client for the test MSE are our choices (the paper gives neither).
* `fbe_personalized` — setting (II) of the pFedFBE paper (§4.1): client j's truth has 1 on the 8 shared
  coordinates and 0.5 on 2 client-specific coordinates drawn without replacement from the rest.

Metrics (Bao et al., §4, as the released `eval_metric_lasso.m`; the pFedFBE paper, §4.1): ℓ2 / ℓ1 error to the
(client's) truth; support precision, recall, F1, density and support accuracy ((TP + TN)/p, one reading of the
pFedFBE paper's "test accuracy", which it does not define; the test MSE is the other) with the support
{j : |w_j| > threshold}, threshold 0.01; all averaged over clients (identical to the single value when the truth
and the model are shared).
"""
from __future__ import annotations

import torch
from torch import Tensor

from fedbench.hparams import Param, ParamError
from fedbench.metrics import Metric
from fedbench.problems.least_squares import COMMON_PARAMS, SIZE_PARAMS, LeastSquares
from fedbench.prox import L1


class Lasso(LeastSquares):
    name = "lasso"
    params = (
        Param("preset", "choice", "bao2022", "paper setting whose defaults to start from",
              choices=("bao2022", "fbe_iid", "fbe_personalized")),
        *COMMON_PARAMS,
        Param("dim", "int", 1024, "dimension p", low=1),
        Param("support", "int", 512, "leading coordinates of the truth equal to 1 (shared support)", low=0),
        Param("personal_support", "int", 0, "extra client-specific non-zeros per client", low=0),
        Param("personal_value", "float", 0.5, "value of the client-specific non-zeros"),
        Param("ar_rho", "float", 0.5, "AR(1) correlation ρ of the design, Σ_ij = ρ^|i−j|", low=0, high=0.999),
        Param("lam", "float", 0.03125, "ℓ1 weight λ of h = λ‖w‖₁", low=0, log=True),
        Param("support_threshold", "float", 0.01, "|w_j| above this counts as non-zero", low=0),
    )
    presets = {
        "bao2022": {},
        "fbe_iid": {"clients": 30, "support": 992, "ar_rho": 0.0, "lam": 0.1, "init": "zeros", "intercept": True,
                    "test_samples_per_client": 128},
        "fbe_personalized": {"clients": 30, "support": 8, "personal_support": 2, "ar_rho": 0.0,
                             "lam": 0.1, "init": "zeros", "intercept": True, "test_samples_per_client": 128},
    }

    recovery = (Metric("l2_error", "ℓ2 error ‖w − w*‖₂", "min"), Metric("l1_error", "ℓ1 error ‖w − w*‖₁", "min"),
                Metric("precision", "support recovery precision", "max"),
                Metric("recall", "support recovery recall", "max"), Metric("f1", "support recovery F1 score", "max"),
                Metric("density", "fraction of non-zero coordinates"),
                Metric("support_accuracy", "support accuracy (zero/non-zero coordinates right)", "max"))
    size_params = ("dim", *SIZE_PARAMS)

    @classmethod
    def declared_dim(cls, config):
        return config["dim"]

    @classmethod
    def check(cls, config):
        dim, support, extra = config["dim"], config["support"], config["personal_support"]
        if support > dim:
            raise ParamError("support", f"found {support}, expected at most dim = {dim}", cls.name)
        if support + extra > dim:
            raise ParamError("personal_support", f"found {extra} with support {support}, expected at most "
                             f"dim - support = {dim - support}", cls.name)

    def __init__(self, config, seed, device="cpu"):
        self.feature_dim = config["dim"]
        self.ar_rho = config["ar_rho"]
        super().__init__(config, seed, device)

    def make_truth(self, gen: torch.Generator) -> Tensor:
        n_clients, p, s = self.config["clients"], self.config["dim"], self.config["support"]
        truth = torch.zeros(n_clients, p, dtype=torch.float64)
        truth[:, :s] = 1.0
        extra = self.config["personal_support"]
        if extra:
            picks = torch.rand(n_clients, p - s, generator=gen).argsort(-1)[:, :extra] + s
            truth.scatter_(1, picks, self.config["personal_value"])
        return truth

    def make_regularizer(self):
        return L1(self.config["lam"], self.feature_dim, self.config["domain_radius"])

    def recovery_metrics(self, models: Tensor, truth: Tensor | None = None) -> dict[str, Tensor]:
        truth = self.truth if truth is None else truth
        error = models - truth
        estimated = models.abs() > self.config["support_threshold"]
        true = truth != 0
        hits = (estimated & true).sum(-1).to(models.dtype)
        n_estimated = estimated.sum(-1).to(models.dtype)
        precision = torch.where(n_estimated > 0, hits / n_estimated.clamp_min(1), 0.0)
        recall = hits / true.sum(-1).clamp_min(1)
        f1 = torch.where(hits > 0, 2 * precision * recall / (precision + recall).clamp_min(1e-300), 0.0)
        return {
            "l2_error": torch.linalg.vector_norm(error, dim=-1),
            "l1_error": error.abs().sum(-1),
            "precision": precision,
            "recall": recall,
            "f1": f1,
            "density": n_estimated / models.shape[-1],
            "support_accuracy": (estimated == true).sum(-1).to(models.dtype) / models.shape[-1],
        }
