"""What Fast-FedDA, C-FedDA and MC-FedDA share (Bao, Crawshaw, Luo, Liu, ICML 2022, §2.1 and §3.3–3.4):
the weights α and the closed-form prox of dual averaging with strong-convexity quadratics.

Weights: `const` α ≡ 1, as the authors' released code [default]; `quadratic` α_t = (t + a)², the
theory's choice (Thm 2.1), with A_t = Σ_{i=0}^{t} α_i.

Prox (the paper's Prox_t of §2.1, which its App. B.2 writes as dual averaging in eq. (13)):
    argmin_w ⟨w, z − γ w₀⟩ + (μA/2 + γ)‖w‖²/2 + A·h(w)  =  prox_{(A/c)·h}((γ w₀ − z)/c),  c = μA/2 + γ,
optionally restricted to the ℛ-ball ℛ(w − w₀) ≤ ε around the anchor w₀ (C-/MC-FedDA, the paper's §3.3).

In a round, μ, γ, a and ε are per-run `[R, 1, 1]` tensors (`fedbench.algorithms.base`); these functions take
them or Python floats alike. The algorithms use the derived μ/2 (`derive`): (μ/2)·x and (μ·x)/2 are the same
float (halving is exact), one operation fewer per local step.
"""
from __future__ import annotations

import torch
from torch import Tensor

from fedbench.algorithms.base import Algorithm
from fedbench.hparams import Param
from fedbench.prox import Regularizer

ALPHA = Param("alpha", "choice", "const", "weights α: const α ≡ 1 (released code) or quadratic (t + a)² (theory)",
              choices=("const", "quadratic"))
ALPHA_OFFSET = Param("a", "float", 1.0, "offset a of the quadratic weights (t + a)²", low=0)
LOCAL_ORDER = Param("local_order", "choice", "grad_then_prox",
                    "client step order: gradient then prox (lasso/EMNIST scripts) or prox then gradient (nuclear)",
                    choices=("grad_then_prox", "prox_then_grad"))
MU = Param("mu", "float", 0.1, "strong-convexity weight μ of the iterate-history quadratics", low=0, log=True)


def alpha(index: int, schedule: str, a):
    """α_index: 1 (const) or (index + a)² (quadratic; a float or a per-run tensor)."""
    return 1.0 if schedule == "const" else (index + a) ** 2


def cumulative_alpha(index: int, schedule: str, a):
    """A_index = Σ_{i=0}^{index} α_i, in closed form."""
    n = index + 1
    if schedule == "const":
        return float(n)
    return n * a * a + a * n * (n - 1) + (n - 1) * n * (2 * n - 1) / 6


def divide(numerator, denominator):
    """numerator / denominator, rounded once also for a float over a tensor (torch computes `float / tensor` as
    the float times the tensor's reciprocal, which rounds twice)."""
    if isinstance(denominator, Tensor) and not isinstance(numerator, Tensor):
        numerator = torch.tensor(numerator, dtype=denominator.dtype, device=denominator.device)
    return numerator / denominator


def dual_averaging_prox(reg: Regularizer, z: Tensor, anchor: Tensor, total_weight, mu, gamma, radius=None,
                        exact: bool = False) -> Tensor:
    """argmin_w ⟨w, z − γ·anchor⟩ + (μA/2 + γ)‖w‖²/2 + A·h(w) [s.t. ℛ(w − anchor) ≤ radius], A = total_weight."""
    c = mu * total_weight / 2 + gamma
    return reg.prox_in_ball((gamma * anchor - z) / c, divide(total_weight, c), anchor, radius, exact)


class DualAveraging(Algorithm):
    """The state Fast-FedDA and C-FedDA share: cumulative gradient g, cumulative iterate w̃ = α₀w₀,
    the primal w and the anchor w₀; and the weights α of the chosen schedule."""

    def derive(self, hp):
        return {"half_mu": hp.mu / 2}

    def init_server(self, w0):
        return {"g": w0.new_zeros(w0.shape), "wt": alpha(0, self.hp.alpha, self.hp.a) * w0, "w": w0.clone(),
                "anchor": w0.clone()}
