"""The parameter rules of the block methods of Hanzely, Zhao, Kolar (TMLR 2023, Theorem 8 in §4.3 and Theorem 9
in App. B.9, with ρ = p_w/n as in their §5.1), from the problem's constants (`BlockProblem.constants`: μ, 𝓛^w,
𝓛^β of F) and the samples per device n, with per-run overrides:

    p_w = 𝓛^w/(𝓛^w + 𝓛^β)            𝓛 = 2·max(𝓛^w/p_w, 𝓛^β/p_β)        η = 1/(4𝓛)         ρ = p_w/n
    θ2 = 1/2    θ1 = min{1/2, √(ημ·max{1/2, θ2/ρ})}    γ = 1/max{2μ, 4θ1/η}    ν = 1 − γμ

and the hyperparameters every block method declares with them. A method's `derive` returns them as `rules`: in
its round functions each field is then a per-run `[R, 1, 1]` tensor (`hp.rules.eta`), in `self.hp` one run's float.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fedbench.algorithms.base import Algorithm
from fedbench.hparams import Param

P_W = Param("p_w", "float", None, "probability of a w-update (a communication); None: 𝓛^w/(𝓛^w+𝓛^β) (Thm 8/9)",
            low=0, high=1, low_open=True, high_open=True, nullable=True)  # the β-steps divide by p_β = 1 − p_w
ETA = Param("eta", "float", None, "step size η; None: 1/(4𝓛), 𝓛 = 2·max(𝓛^w/p_w, 𝓛^β/p_β) (Thm 8/9)", low=0,
            low_open=True, nullable=True, log=True)
RHO = Param("rho", "float", None, "probability of refreshing the reference point v; None: p_w/n", low=0, high=1,
            low_open=True, nullable=True, log=True)


@dataclass(frozen=True)
class Rules:
    """Thm 8/9's parameters of one run (floats; per-run `[R, 1, 1]` tensors in a round's `hp`)."""
    p_w: float
    smoothness: float  # 𝓛 of Lemma 15 (expected smoothness of the block estimator)
    eta: float
    rho: float
    theta1: float
    theta2: float
    gamma: float
    nu: float

    @property
    def p_beta(self) -> float:
        return 1.0 - self.p_w


def rules(problem, p_w: float | None = None, eta: float | None = None, rho: float | None = None) -> Rules:
    """Thm 8/9's parameters for `problem`; any of p_w, η, ρ given replaces its rule and the rest follow."""
    c = problem.constants
    p_w = c.smooth_w / (c.smooth_w + c.smooth_beta) if p_w is None else p_w
    smoothness = 2 * max(c.smooth_w / p_w, c.smooth_beta / (1 - p_w)) if p_w < 1 else 2 * c.smooth_w
    eta = 1 / (4 * smoothness) if eta is None else eta
    rho = p_w / problem.max_size if rho is None else rho
    theta2 = 0.5
    theta1 = min(0.5, math.sqrt(eta * c.mu * max(0.5, theta2 / rho)))
    gamma = 1 / max(2 * c.mu, 4 * theta1 / eta)
    return Rules(p_w, smoothness, eta, rho, theta1, theta2, gamma, 1 - gamma * c.mu)


def zeros_w(problem) -> Tensor:
    """The global block's start (every iterate starts at 0, as in the experiments of Hanzely, Zhao, Kolar, §5.1)."""
    return torch.zeros(problem.dim_w, dtype=problem.dtype, device=problem.device)


def zeros_beta(problem, devices: int) -> Tensor:
    return torch.zeros(devices, problem.dim_beta, dtype=problem.dtype, device=problem.device)


class BlockMethod(Algorithm):
    """What the block methods of Hanzely, Zhao, Kolar share: every device every round, the server's w (stored;
    the model is w_scale·w) as the global model and the devices' β as the personal ones. The server's blocks are
    `[R, 1, d_w]` in a round, the devices' `[R, M, d_β]`; the block oracles take the server's w as every device's."""
    personalized = True
    requires = frozenset({"block_objective"})
    participation = "all"

    def global_params(self, server):
        return self.problem.w_scale * server["w"]

    def personal_params(self, server, clients):
        return clients["beta"]
