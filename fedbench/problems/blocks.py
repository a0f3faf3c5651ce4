"""The objectives of Hanzely, Zhao, Kolar, "Personalized Federated Learning: A Unified Framework and Universal
Optimization Techniques" (TMLR 2023): a global block w, a block β_m per device, and
F(w, β) = (1/M) Σ_m f_m(w, β_m) (eq. 1), each f_m built from the device's ordinary loss f'_m (§2.3–2.6):

    mx2    f_m = f'_m(β_m) + (λ/2)‖β_m − w̃‖²                        (11), L2-regularised mixture
    mt2    f_m = Λ f'_m(w̃) + f'_m(β_m) + (λ/2)‖β_m − w̃‖²            (8); without reparametrisation (7) with λ/2
    apfl2  f_m = Λ f'_m(w̃) + f'_m((1 − α) β_m + α w̃)               (14), mixing in parameter space (= logits)
    ews    f_m = f'_m([w̃; β_m])                                       (16), explicit weight sharing

where w̃ = w/√M with the reparametrisation by M^{-1/2} of §2 (eqs. 8, 11, 14, 16; §6.3 tests it) (`reparam`),
else w̃ = w. Everything here works in the natural variable w̃; the problem applies the chain-rule factor.
Constants (Lemmas 1–4, Table 2; where Table 2 disagrees, the Lemmas' and the authors' code's values, e.g. MT2
without Table 2's factor 1/2) refer to F, with 𝓛' the smoothness of one sample's f'.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

OBJECTIVES = ("mx2", "mt2", "apfl2", "ews")


@dataclass(frozen=True)
class Constants:
    """Strong convexity μ of F and the block smoothness 𝓛^w, 𝓛^β of F's finite-sum components (Assumptions 1–2), in
    the stored variables (with reparametrisation the w-constant carries the 1/M of the rescaling by M^{-1/2})."""
    mu: float
    smooth_w: float
    smooth_beta: float


@dataclass(frozen=True)
class BlockObjective:
    kind: str
    lam: float = 0.0  # λ of mx2 / mt2
    big_lambda: float = 1.0  # Λ of mt2 / apfl2
    alpha: float = 0.0  # α of apfl2 (the same for every device)
    global_features: int = 0  # ews: the first features multiply w̃, the rest β

    def models(self, w: Tensor, beta: Tensor) -> list[tuple[float, Tensor]]:
        """The points (c_t, θ_t) `[S, d]` where f' is evaluated: f_m = Σ_t c_t f'(θ_t) + penalty."""
        if self.kind == "ews":
            return [(1.0, _concat(w, beta))]
        w = w.expand_as(beta)  # a shared w̃ `[d]` is every device's
        if self.kind == "mx2":
            return [(1.0, beta)]
        if self.kind == "mt2":
            return [(self.big_lambda, w), (1.0, beta)]
        return [(self.big_lambda, w), (1.0, (1 - self.alpha) * beta + self.alpha * w)]

    def value(self, base_loss: Callable[[Tensor], Tensor], w: Tensor, beta: Tensor) -> Tensor:
        """f_m(w̃, β_m) per device `[S]` (w̃ `[S, d_w]` or `[d_w]`, β `[S, d_β]`), f' given by `base_loss`."""
        total: Tensor = sum(c * base_loss(theta) for c, theta in self.models(w, beta))  # type: ignore[assignment]  # never 0
        if self.kind in ("mx2", "mt2"):
            total = total + 0.5 * self.lam * (beta - w).square().sum(-1)
        return total

    def grads(self, base_grad: Callable[[Tensor], Tensor], w: Tensor, beta: Tensor,
              need_w: bool = True) -> tuple[Tensor | None, Tensor]:
        """(∇_w̃ f_m, ∇_β f_m) per device from ∇f' (`base_grad`); ∇_w̃ is None when not `need_w`, which saves
        mt2's and apfl2's gradient at w̃ on β-only steps."""
        kind = self.kind
        if kind != "ews":
            w = w.expand_as(beta)
        if kind == "ews":
            g = base_grad(_concat(w, beta))
            split = self.global_features
            return (g[..., :split] if need_w else None), g[..., split:]
        if kind == "mx2":
            pull = self.lam * (beta - w)
            return (-pull if need_w else None), base_grad(beta) + pull
        if kind == "mt2":
            pull = self.lam * (beta - w)
            return (self.big_lambda * base_grad(w) - pull if need_w else None), base_grad(beta) + pull
        g_mix = base_grad((1 - self.alpha) * beta + self.alpha * w)
        g_w = self.big_lambda * base_grad(w) + self.alpha * g_mix if need_w else None
        return g_w, (1 - self.alpha) * g_mix

    def constants(self, smooth: float | tuple[float, float], mu_prime: float, devices: int,
                  reparam: bool) -> Constants:
        """μ, 𝓛^w, 𝓛^β of F (Lemmas 1–4, as the authors' code sets them for §5.1–5.2 and §6.1). `smooth`
        is 𝓛' (for ews the pair (𝓛'_w, 𝓛'_β)). Without reparametrisation the w-constant is not divided by M (the
        authors' code for Fig. 7, §6.3)."""
        lam, big, alpha, m = self.lam, self.big_lambda, self.alpha, devices
        if self.kind == "ews":
            smooth_w, smooth_beta = smooth  # type: ignore[misc]  # ews is given the pair (𝓛'_w, 𝓛'_β)
            mu, w_const, beta_const = mu_prime / m, smooth_w, smooth_beta / m
        elif isinstance(smooth, tuple):
            raise TypeError(f"{self.kind}: 𝓛' is one number, not the pair {smooth}")
        elif self.kind == "mx2":
            mu, w_const, beta_const = mu_prime / (3 * m), lam, (smooth + lam) / m
        elif self.kind == "mt2":
            mu, w_const, beta_const = lam / (2 * m), big * smooth + lam, (smooth + lam) / m
        else:
            mu, w_const, beta_const = (mu_prime * (1 - alpha) ** 2 / m, (big + alpha**2) * smooth,
                                       (1 - alpha) ** 2 * smooth / m)
        return Constants(mu, w_const / m if reparam else w_const, beta_const)


def _concat(w: Tensor, beta: Tensor) -> Tensor:
    return torch.cat([w.expand(*beta.shape[:-1], w.shape[-1]), beta], dim=-1)
