"""Robust aggregation rules and attacks (`fedbench.robust`) against per-run, per-client NumPy transcriptions of their
papers' definitions: coordinate-wise median and trimmed mean (Yin et al., ICML 2018, Defs. 1-2; numpy.median and
scipy.stats.trim_mean), Krum and Multi-Krum (Blanchard et al., NeurIPS 2017, §4)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from fedbench import robust


def np_krum(values: np.ndarray, f: int, keep: int) -> np.ndarray:
    """One run's Krum / Multi-Krum by the paper's loops: each client's score over its S − f − 2 nearest others."""
    s = len(values)
    scores = []
    for i in range(s):
        distances = sorted(float(np.sum((values[i] - values[j]) ** 2)) for j in range(s) if j != i)
        scores.append(sum(distances[: s - f - 2]))
    chosen = np.argsort(scores, kind="stable")[:keep]
    return values[chosen].mean(axis=0)


@pytest.fixture
def uploads():
    gen = torch.Generator().manual_seed(3)
    return torch.randn(3, 9, 4, 5, generator=gen, dtype=torch.float64)  # R = 3 runs, S = 9 clients of 4x5 entries


@pytest.mark.parametrize("clients", [9, 8])
def test_median_is_numpys_per_run(uploads, clients):
    values = uploads[:, :clients]
    got = robust.median(values)
    assert got.shape == (3, 1, 4, 5)
    for run in range(3):
        np.testing.assert_array_equal(got[run, 0].numpy(), np.median(values[run].numpy(), axis=0))


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.25, 0.4])
def test_trimmed_mean_is_scipys_per_run(uploads, beta):
    got = robust.trimmed_mean(uploads, beta)
    for run in range(3):
        np.testing.assert_allclose(got[run, 0].numpy(), stats.trim_mean(uploads[run].numpy(), beta, axis=0),
                                   rtol=1e-14, atol=1e-15)


def test_a_trim_leaving_no_client_is_refused(uploads):
    with pytest.raises(ValueError, match="leaves none"):
        robust.trimmed_mean(uploads[:, :4], 0.5)


@pytest.mark.parametrize("f", [0, 2, 3])
def test_krum_and_multi_krum_are_the_papers_loops(uploads, f):
    uploads = uploads.clone()
    uploads[:, 0] += 50.0  # an outlier Krum must never pick
    for rule, keep in (("krum", 1), ("multi_krum", 9 - f)):
        got = robust.aggregate_robustly(uploads, rule, byzantine=f)
        for run in range(3):
            np.testing.assert_allclose(got[run, 0].numpy(), np_krum(uploads[run].numpy(), f, keep), rtol=1e-14)
    assert not torch.equal(robust.krum(uploads, f), uploads[:, :1])


def test_krum_with_too_many_byzantine_clients_is_refused(uploads):
    with pytest.raises(ValueError, match=r"S > 2f \+ 2"):
        robust.krum(uploads, 4)  # S = 9 = 2·4 + 1


def test_attacks_change_the_adversaries_updates_only(uploads):
    adversarial = torch.zeros(3, 9, dtype=torch.bool)
    adversarial[0, 2] = adversarial[2, 7] = True
    noise = torch.randn(uploads.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = {"sign_flip": -2.0 * uploads, "scaled": 2.0 * uploads, "gaussian": 2.0 * noise}
    for kind, attacked in expected.items():
        got = robust.attack(uploads, adversarial, kind, 2.0, noise)
        assert torch.equal(got[adversarial], attacked[adversarial]), kind
        assert torch.equal(got[~adversarial], uploads[~adversarial]), kind


def test_adversarial_clients_are_a_seeded_fraction():
    first = robust.adversarial_clients(50, 0.2, torch.Generator().manual_seed(4))
    again = robust.adversarial_clients(50, 0.2, torch.Generator().manual_seed(4))
    other = robust.adversarial_clients(50, 0.2, torch.Generator().manual_seed(5))
    assert int(first.sum()) == 10 and torch.equal(first, again) and not torch.equal(first, other)
