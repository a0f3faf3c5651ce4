"""The synthetic logistic data of Hanzely, Zhao, Kolar (TMLR 2023, §5.1–5.2), generated with NumPy's
legacy global RNG in the order of the authors' released code (github.com/boxinz17/PFL-Unified-Framework,
`Synthetic/MX2/` and `Synthetic/EWS/`), which reproduces their data bit for bit (seed 111 by default).

* S1 (`mx2`, objective (11)): w* ~ U[0.49, 0.51]^15; per device β*_m = w* + U[μ_m ± 0.01]^15 with
  μ_m ~ N(0, σ_h²); x ~ U[0.2, 0.5]^15; y ~ Bernoulli(σ(xᵀβ*_m)) (the code's sign; the paper prints the
  opposite one).
* S2 (`ews`, objective (16)): w* ~ N(0, 1)^10 (global block); β*_m ~ U[μ_m ± 0.01]^5 (local block);
  x ~ U[0, 0.1]^15; y ~ Bernoulli(σ(xᵀ[w*; β*_m])).

RNG order (that code's): `seed(seed)`; w*; then `seed(seed)` again; μ (20 normals); every β*_m; then every
device's X and Y in turn. The legacy `np.random` functions are used through one `RandomState`, which draws the
same numbers as the module-level calls after `np.random.seed`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit

DEVICES, SAMPLES = 20, 1000


@dataclass(frozen=True)
class DeviceData:
    w_true: np.ndarray  # [d_w] (S1: the mean of the personal truths' centre; S2: the shared block)
    beta_true: np.ndarray  # [M, d_β]
    x: np.ndarray  # [M, n, d] float64
    y: np.ndarray  # [M, n] float64 in {0, 1}


def mx2(sigma_h: float, seed: int = 111, devices: int = DEVICES, samples: int = SAMPLES) -> DeviceData:
    """S1: personal models β*_m around a common w* (Hanzely et al., TMLR 2023, §5.1)."""
    rng = np.random.RandomState(seed)
    w_true = rng.uniform(0.49, 0.51, 15)
    rng = np.random.RandomState(seed)
    centres = rng.normal(0, sigma_h, devices)
    beta = np.stack([w_true + rng.uniform(mu - 0.01, mu + 0.01, 15) for mu in centres])
    x, y = _features_and_labels(rng, beta, 0.2, 0.5, samples)
    return DeviceData(w_true, beta, x, y)


def ews(sigma_h: float, seed: int = 111, devices: int = DEVICES, samples: int = SAMPLES) -> DeviceData:
    """S2: a shared block w* (10) and a local block β*_m (5) per device (Hanzely et al., TMLR 2023, §5.2)."""
    rng = np.random.RandomState(seed)
    w_true = rng.normal(0, 1, 10)
    rng = np.random.RandomState(seed)
    centres = rng.normal(0, sigma_h, devices)
    local = np.stack([rng.uniform(mu - 0.01, mu + 0.01, 5) for mu in centres])
    full = np.concatenate([np.broadcast_to(w_true, (devices, 10)), local], axis=1)
    x, y = _features_and_labels(rng, full, 0.0, 0.1, samples)
    return DeviceData(w_true, local, x, y)


def _features_and_labels(rng: np.random.RandomState, models: np.ndarray, low: float, high: float,
                         samples: int) -> tuple[np.ndarray, np.ndarray]:
    """For each device in turn: X ~ U[low, high]^(n×d), then Y ~ Bernoulli(σ(X m))."""
    xs, ys = [], []
    for model in models:
        x = rng.uniform(low, high, (samples, models.shape[1]))
        xs.append(x)
        ys.append(rng.binomial(1, expit(x @ model)).astype(np.float64))
    return np.stack(xs), np.stack(ys)


def logistic_hessian(data: DeviceData, models: np.ndarray) -> np.ndarray:
    """(1/(nM)) Σ σ(1 − σ) x xᵀ at the models `models` `[M, d]`: the Hessian of the mean logistic loss over all
    devices' samples, whose smallest eigenvalue at the true models is the μ' of Hanzely et al. (TMLR 2023, §5.1)
    (the authors' code takes `np.linalg.eig(H)[0][-1]`, an eigenvalue in LAPACK's order, 1–7% above the smallest
    here)."""
    p = expit(np.einsum("mnd,md->mn", data.x, models))
    weights = (p * (1 - p)).reshape(-1)
    x = data.x.reshape(-1, data.x.shape[-1])
    return (x * weights[:, None]).T @ x / len(x)
