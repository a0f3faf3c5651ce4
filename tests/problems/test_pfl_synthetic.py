"""The synthetic data of Hanzely, Zhao, Kolar (TMLR 2023, §5.1–5.2) against the constants the authors' code
(`Synthetic/MX2/`, `Synthetic/EWS/`) computes on it, recomputed from their generator: the code's μ' at the true models
for S1, its row-sliced 𝓛' for S2, shapes and label balance."""
from __future__ import annotations

import numpy as np
import pytest

from fedbench.data import pfl_synthetic


@pytest.mark.parametrize("sigma_h, mu_prime", [(0.1, 5.33e-4), (0.3, 7.38e-4), (1.0, 6.07e-4)])
def test_mx2_data_give_the_codes_strong_convexity(sigma_h, mu_prime):
    data = pfl_synthetic.mx2(sigma_h)
    assert data.x.shape == (20, 1000, 15) and data.beta_true.shape == (20, 15)
    assert data.x.min() >= 0.2 and data.x.max() <= 0.5 and np.all((data.w_true >= 0.49) & (data.w_true <= 0.51))
    centres = (data.beta_true - data.w_true).mean(1)  # each device's μ_m, to ±0.01
    assert centres.std() == pytest.approx(sigma_h, rel=0.4)
    # the code's μ' (np.linalg.eig(H)[0][-1], LAPACK's last eigenvalue; §5.1 says the smallest one) to 3
    # digits: the data are the authors' to the bit; the true smallest eigenvalue lies a little below it
    hessian = pfl_synthetic.logistic_hessian(data, data.beta_true)
    assert np.linalg.eig(hessian)[0][-1] == pytest.approx(mu_prime, abs=5e-7)
    assert 0.9 * mu_prime < np.linalg.eigvalsh(hessian)[0] < mu_prime
    # the code's 𝓛' = max ‖x‖ / 4 (not squared as in §5.1): 0.4333
    assert np.linalg.norm(data.x, axis=-1).max() / 4 == pytest.approx(0.4333, abs=1e-4)


def test_mx2_is_reproducible_and_the_levels_share_w_true():
    a, b = pfl_synthetic.mx2(0.3), pfl_synthetic.mx2(0.3)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert np.array_equal(pfl_synthetic.mx2(1.0).w_true, a.w_true)


def test_ews_data_give_the_codes_row_sliced_smoothness():
    data = pfl_synthetic.ews(5.0)
    assert data.x.shape == (20, 1000, 15) and data.beta_true.shape == (20, 5) and data.w_true.shape == (10,)
    norms = np.linalg.norm(data.x, axis=-1)  # [M, n]
    # the EWS code's `mathcal_L_fun` slices each device's rows instead of its columns: 𝓛'_w = max ‖x‖ over every
    # device's first 10 samples, 𝓛'_β over the remaining ones (neither squared nor divided by 4)
    assert norms[:, :10].max() == pytest.approx(0.2758, abs=1e-4)
    assert norms[:, 10:].max() == pytest.approx(0.3154, abs=1e-4)
    assert 0.3 < data.y.mean() < 0.7
