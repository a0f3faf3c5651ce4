"""The real-image devices of Hanzely, Zhao, Kolar (TMLR 2023, §6.1, with the choices where the authors' code `CV/`
differs from it: labels drawn with replacement, images taken in order, scalar normalisation, the test images carved
from the training split): the code's sequential selection against a plain transcription of the authors' loop, the
label draws against NumPy's legacy RNG, both normalisations, the pool sources, and the shipped Fashion-MNIST and
FEMNIST digits."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fedbench.data import femnist
from fedbench.data.pfl_images import SCALAR_STATS, device_split, draw_labels, load_pool
from helpers import write_folder, write_npz

FMNIST_STATS = dict(zip(("dataset_mean", "dataset_std"), SCALAR_STATS["fashion-mnist"]))


@pytest.fixture(scope="module")
def pool() -> tuple[np.ndarray, np.ndarray]:
    """600 random images, labels drawn unevenly so that label sets differ in how deep the scan must go."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (600, 784)).astype(np.uint8)
    x[:, 0] = 0  # a border pixel: background in every image
    y = rng.choice(10, 600, p=np.r_[0.3, np.full(9, 0.7 / 9)]).astype(np.int64)
    return x, y


def authors_selection(y: np.ndarray, drawn: np.ndarray, need: int) -> list[int]:
    """The authors' `data_prepare` loop: scan the pool in order, keep an image whose label is among the drawn
    ones, stop at `need`."""
    kept = []
    for row, label in enumerate(y):
        if label in drawn:
            kept.append(row)
        if len(kept) >= need:
            break
    return kept


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


@pytest.mark.parametrize("classes", [1, 2, 4])
def test_code_selection_takes_the_first_images_of_the_devices_labels(pool, classes):
    x, y = pool
    split = device_split(x, y, devices=20, classes=classes, train=7, test=13, **FMNIST_STATS)
    draws = draw_labels(np.random.RandomState(111), 20, classes)
    for m, drawn in enumerate(draws):
        expected = authors_selection(y, drawn, 20)
        assert split.train_rows[m].tolist() == expected[:7] and split.test_rows[m].tolist() == expected[7:]
        np.testing.assert_array_equal(split.labels[m], np.unique(drawn))
        np.testing.assert_array_equal(split.y_train[m], y[expected[:7]])
        np.testing.assert_array_equal(split.y_test[m], y[expected[7:]])
    assert split.x_train.shape == (20, 7, 784) and split.x_test.shape == (20, 13, 784)
    assert split.x_train.dtype == np.float64 and split.y_train.dtype == np.int64
    # devices that drew the same classes hold the same images
    sets = [tuple(labels) for labels in split.labels]
    pairs = [(a, b) for a in range(20) for b in range(a) if sets[a] == sets[b]]
    assert pairs or classes > 1  # 20 devices of one class each share some class
    for a, b in pairs:
        np.testing.assert_array_equal(split.x_train[a], split.x_train[b])
        np.testing.assert_array_equal(split.x_test[a], split.x_test[b])


@pytest.mark.parametrize("classes", [2, 4, 8])
def test_label_draws_are_numpys_legacy_choice_device_by_device(classes):
    rng = np.random.RandomState(111)
    expected = [rng.choice(10, size=classes) for _ in range(20)]  # the code: np.random.seed(111), then per device
    np.testing.assert_array_equal(draw_labels(np.random.RandomState(111), 20, classes), expected)
    paper = draw_labels(np.random.RandomState(111), 20, classes, "paper")
    assert all(len(set(row)) == classes for row in paper.tolist())
    assert paper.min() >= 0 and paper.max() <= 9


def test_code_normalisation_is_torchvisions_normalize_then_unit_rows(pool):
    x, y = pool
    split = device_split(x, y, devices=5, classes=3, train=10, test=20, dataset_mean=0.5, dataset_std=0.25)
    np.testing.assert_allclose(split.x_train, unit((x[split.train_rows] / 255.0 - 0.5) / 0.25), rtol=1e-12)
    np.testing.assert_allclose(split.x_test, unit((x[split.test_rows] / 255.0 - 0.5) / 0.25), rtol=1e-12)


def test_paper_normalisation_standardises_the_pooled_training_rows_then_unit_rows(pool):
    x, y = pool
    x = x.copy()
    first = device_split(x, y, devices=6, classes=2, train=10, test=20, normalization="paper")
    # pixel 1: background in every training image, ink in one test image only
    x[:, 1] = 0
    x[np.setdiff1d(first.test_rows, first.train_rows)[0], 1] = 200
    split = device_split(x, y, devices=6, classes=2, train=10, test=20, normalization="paper")
    np.testing.assert_array_equal(split.train_rows, first.train_rows)  # the selection does not see the pixels
    train = x[split.train_rows].astype(np.float64)
    pooled = train.reshape(-1, 784)
    std = pooled.std(0)
    assert (std[:2] == 0).all() and (std[2:] > 0).all()
    scale = np.r_[0.0, 0.0, 1.0 / std[2:]]  # the constant pixels are 0 in every row, test rows included
    centred = (train - pooled.mean(0)) * scale
    np.testing.assert_allclose(centred.reshape(-1, 784).mean(0), 0.0, atol=1e-12)
    np.testing.assert_allclose(centred.reshape(-1, 784).std(0), np.r_[0.0, 0.0, np.ones(782)], rtol=1e-12)
    np.testing.assert_allclose(split.x_train, unit(centred), rtol=1e-10, atol=1e-15)
    test = (x[split.test_rows] - pooled.mean(0)) * scale
    np.testing.assert_allclose(split.x_test, unit(test), rtol=1e-10, atol=1e-15)
    assert (split.x_test[..., :2] == 0).all()


@pytest.mark.parametrize("normalization", ["code", "paper"])
@pytest.mark.parametrize("selection", ["code", "random"])
def test_every_row_has_unit_norm(pool, normalization, selection):
    x, y = pool
    split = device_split(x, y, devices=8, classes=3, train=10, test=15, normalization=normalization,
                         selection=selection, **FMNIST_STATS)
    for features in (split.x_train, split.x_test):
        np.testing.assert_allclose(np.linalg.norm(features, axis=-1), 1.0, rtol=1e-12)


def test_random_selection_draws_distinct_images_of_the_devices_labels_after_every_label_draw(pool):
    x, y = pool
    split = device_split(x, y, devices=10, classes=2, train=10, test=30, selection="random", seed=5, **FMNIST_STATS)
    rng = np.random.RandomState(5)
    draws = draw_labels(rng, 10, 2)
    for m, drawn in enumerate(draws):
        rows = rng.choice(np.flatnonzero(np.isin(y, drawn)), size=40, replace=False)
        np.testing.assert_array_equal(np.r_[split.train_rows[m], split.test_rows[m]], rows)
        assert len(set(rows.tolist())) == 40 and np.isin(y[rows], drawn).all()
    code = device_split(x, y, devices=10, classes=2, train=10, test=30, seed=5, **FMNIST_STATS)
    assert [labels.tolist() for labels in split.labels] == [labels.tolist() for labels in code.labels]
    assert not np.array_equal(split.train_rows, code.train_rows)


def test_bad_arguments_are_refused(pool):
    x, y = pool
    with pytest.raises(ValueError, match=r"the pool holds \d+ images of its classes, fewer than train \+ test = 900"):
        device_split(x, y, train=600, test=300, **FMNIST_STATS)
    for classes in (0, 11):
        with pytest.raises(ValueError, match=r"classes \(K\): expected an integer in 1..10"):
            device_split(x, y, classes=classes, **FMNIST_STATS)
    with pytest.raises(ValueError, match="normalization 'code' needs the pool's dataset_mean"):
        device_split(x, y, train=5, test=5)
    with pytest.raises(ValueError, match="label_draw: expected one of code | paper"):
        device_split(x, y, train=5, test=5, label_draw="replace", **FMNIST_STATS)
    with pytest.raises(ValueError, match="unknown image source 'mnist'"):
        load_pool("mnist")
    with pytest.raises(ValueError, match="source 'idx' needs path"):
        load_pool("idx")


def test_idx_pools_are_training_splits_relative_paths_under_the_data_root(tmp_path, monkeypatch):
    arrays = write_folder(tmp_path / "mine", n_train=12, n_test=5)
    x, y = load_pool("idx", str(tmp_path / "mine"))
    np.testing.assert_array_equal(x, arrays["train"][0].reshape(12, 784))
    np.testing.assert_array_equal(y, arrays["train"][1])
    monkeypatch.setenv("FEDBENCH_DATA", str(tmp_path))
    np.testing.assert_array_equal(load_pool("idx", "mine")[0], x)
    write_folder(tmp_path / "fashion-mnist", seed=1)
    assert load_pool("fashion-mnist")[0].shape == (12, 784)


def test_digits_pool_keeps_digits_in_file_order_inverted_to_mnists_polarity(tmp_path):
    path = write_npz(tmp_path / "writers.npz", [30, 40], [5, 6], classes=62)
    images = femnist.load_npz(path)
    x, y = load_pool("digits", str(path))
    digits = images.y < 10
    assert 0 < digits.sum() < len(digits)
    np.testing.assert_array_equal(y, images.y[digits])
    np.testing.assert_array_equal(x, 255 - images.x[digits])
    assert x.dtype == np.uint8 and y.dtype == np.int64


# -- the shipped data ----------------------------------------------------------------------------------------------

def shipped(relative: str) -> Path:
    path = Path(os.environ.get("FEDBENCH_DATA", "/nonexistent")) / relative
    if not path.exists():
        pytest.skip(f"needs $FEDBENCH_DATA/{relative} ({path} is absent)")
    return path


@pytest.fixture(scope="module")
def fashion_pool():
    shipped("fashion-mnist")
    return load_pool("fashion-mnist")


@pytest.mark.parametrize(("classes", "distinct"), [(2, 1.95), (4, 3.5), (8, 5.5)])
def test_fashion_mnist_devices(fashion_pool, classes, distinct):
    x, y = fashion_pool
    assert x.shape == (60000, 784) and np.bincount(y).tolist() == [6000] * 10  # the training split
    split = device_split(x, y, classes=classes, **FMNIST_STATS)
    assert split.x_train.shape == (20, 100, 784) and split.x_test.shape == (20, 300, 784)
    assert split.y_train.shape == (20, 100) and split.y_test.shape == (20, 300)
    for m, labels in enumerate(split.labels):
        assert np.isin(split.y_train[m], labels).all() and np.isin(split.y_test[m], labels).all()
        assert split.test_rows[m, -1] == np.flatnonzero(np.isin(y, labels))[399]  # the first 400 of its classes
    # drawn with replacement: seed 111 gives fewer than K classes on average (expected 1.9 / 3.4 / 5.7)
    assert np.mean([len(labels) for labels in split.labels]) == pytest.approx(distinct)
    np.testing.assert_allclose(np.linalg.norm(split.x_train, axis=-1), 1.0, rtol=1e-12)


def test_digits_pool_from_the_full_femnist_file():
    shipped("femnist/femnist_full.npz")
    x, y = load_pool("digits")
    assert x.shape == (404045, 784) and x.dtype == np.uint8  # SOURCE.md: 404,045 digits
    counts = np.bincount(y)
    assert len(counts) == 10 and counts.min() > 35000  # SOURCE.md: about 37k to 45k per class
    assert np.median(x) == 0  # the background, after inversion
    split = device_split(x, y, classes=2, **dict(zip(("dataset_mean", "dataset_std"), SCALAR_STATS["digits"])))
    assert split.x_train.shape == (20, 100, 784) and all(np.isin(split.y_test[m], split.labels[m]).all()
                                                         for m in range(20))


@pytest.mark.parametrize("objective", ["mx2", "mt2", "apfl2"])
def test_image_problem_block_gradients_and_a_few_ascd_rounds(objective):
    """The `pfl_images` problem on real Fashion-MNIST (small devices): the softmax block gradients equal
    autograd's (shared w̃ and per-device β), the round-0 objective is ln 10 per f' term (zero weights), and ASCD-PFL
    lowers it
    with finite local accuracies."""
    import math

    import torch

    from fedbench.algorithms import ALGORITHMS
    from fedbench.engine.simulate import Federation, simulate
    from fedbench.problems import make_problem

    shipped("fashion-mnist")
    problem = make_problem("pfl_images", objective=objective, classes=2, train=10, test=20)
    gen = torch.Generator().manual_seed(0)
    w = 0.1 * torch.randn(problem.dim_w, dtype=torch.float64, generator=gen)
    beta = 0.1 * torch.randn(problem.num_clients, problem.dim_beta, dtype=torch.float64, generator=gen)
    oracle = problem.step_oracle(torch.arange(problem.num_clients)[:, None] * 10 + torch.tensor([[0, 3, 7]]))
    g_w, g_beta = oracle.block_grads(w, beta)
    w_, beta_ = w.clone().requires_grad_(True), beta.clone().requires_grad_(True)
    auto_w, auto_beta = torch.autograd.grad(oracle.block_loss(w_, beta_).sum(), (w_, beta_))
    assert torch.allclose(g_w.sum(0), auto_w, atol=1e-12) and torch.allclose(g_beta, auto_beta, atol=1e-12)
    result = simulate(problem, ALGORITHMS["ascd_pfl"](problem), Federation(5, 0, 1, 1), seed=0, eval_every=1)
    # at zero every f' is ln 10: MX2 has one, MT2 and APFL2 have Λ + 1 = 2 (the code's plotted 0.0461 / 0.0921, ×50)
    assert result.rows[0]["objective"] == pytest.approx(math.log(10) * (1 if objective == "mx2" else 2))
    assert result.final["objective"] < result.rows[0]["objective"]
    assert 0 <= result.final["test_accuracy"] <= 1 and 0 <= result.final["train_accuracy"] <= 1
