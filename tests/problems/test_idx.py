"""The IDX reader of MNIST-format image folders (the image data of Hanzely, Zhao, Kolar, TMLR 2023, §6): written-out
files, gzip or not, the malformed ones refused with the file named, and the shipped Fashion-MNIST as its SOURCE.md
describes it."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fedbench.data import idx, images
from helpers import write_folder, write_idx


@pytest.mark.parametrize("compress", [True, False])
def test_reads_written_idx_files(tmp_path, compress):
    arrays = write_folder(tmp_path / "data", compress=compress)
    splits = idx.load_folder(tmp_path / "data")
    np.testing.assert_array_equal(splits.x_train, arrays["train"][0].reshape(12, 784))
    np.testing.assert_array_equal(splits.y_test, arrays["t10k"][1])
    assert splits.x_test.dtype == np.uint8 and splits.y_train.dtype == np.int64


def test_malformed_folders_are_refused_with_the_file_named(tmp_path):
    with pytest.raises(ValueError, match="no such folder"):
        idx.load_folder(tmp_path / "absent")
    folder = tmp_path / "data"
    write_folder(folder)
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(ValueError, match="no t10k-labels-idx1-ubyte.gz or t10k-labels-idx1-ubyte"):
        idx.load_folder(folder)
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros(4), idx.LABELS_MAGIC, True)  # 4 labels, 5 images
    with pytest.raises(ValueError, match="t10k has 5 images but 4 labels"):
        idx.load_folder(folder)
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros(5), idx.IMAGES_MAGIC, True)  # wrong magic
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte.gz: IDX magic number 2051, expected 0x00000801"):
        idx.load_folder(folder)
    (folder / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.gz: unreadable"):
        idx.load_folder(folder)


def test_the_shipped_fashion_mnist():
    root = Path(os.environ.get("FEDBENCH_DATA", "/nonexistent")) / "fashion-mnist"
    if not root.is_dir():
        pytest.skip("needs $FEDBENCH_DATA/fashion-mnist")
    splits = idx.load_folder(root)
    assert splits.x_train.shape == (60000, 784) and splits.x_test.shape == (10000, 784)
    assert np.bincount(splits.y_train).tolist() == [6000] * 10 and np.bincount(splits.y_test).tolist() == [1000] * 10
    assert splits.x_train.mean() == pytest.approx(72.94, abs=0.01)  # SOURCE.md: 0.2860 × 255


def test_fashion_mnist_as_nchw_tensors(tmp_path):
    """`images.load("fashion_mnist", folder)`: the IDX images as uint8 [n, 1, 28, 28], labels int64; on the shipped
    files, the normalisation constants are the training split's mean and std to their 4 decimals."""
    write_folder(tmp_path, 5, 3)
    splits = idx.load_folder(tmp_path)
    data = images.load("fashion_mnist", tmp_path)
    assert data.x_train.shape == (5, 1, 28, 28) and data.x_test.shape == (3, 1, 28, 28)
    assert data.x_train.dtype == torch.uint8 and data.y_test.dtype == torch.int64
    np.testing.assert_array_equal(data.x_train.numpy().reshape(5, 28, 28), splits.x_train.reshape(5, 28, 28))
    np.testing.assert_array_equal(data.y_train.numpy(), splits.y_train)
    root = Path(os.environ.get("FEDBENCH_DATA", "/nonexistent")) / "fashion-mnist"
    if not root.is_dir():
        pytest.skip("needs $FEDBENCH_DATA/fashion-mnist")
    shipped = images.load("fashion_mnist")
    assert shipped.source == "fashion_mnist: 60,000 training and 10,000 test images (fashion-mnist)"
    pixels = shipped.x_train.to(torch.float64) / 255
    assert abs(pixels.mean().item() - shipped.mean[0]) < 5e-5 and abs(pixels.std().item() - shipped.std[0]) < 5e-5
