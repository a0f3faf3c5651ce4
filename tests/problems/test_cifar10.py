"""The CIFAR-10 reader (the data of Per-FedAvg, Fallah, Mokhtari, Ozdaglar, NeurIPS 2020, §5): written-out binary
and python-pickle batches read back exactly, in the folder itself or its cifar-10-batches-* subfolder; malformed ones
refused with the file named; and the shipped binary batches as their SOURCE.md describes them."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedbench.data import cifar10, images

SIZES = {"data_batch_1": 4, "data_batch_2": 3, "data_batch_10": 2, "test_batch": 5}  # 10 sorts after 2


def make_batches(seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return {name: (rng.integers(0, 256, (n, cifar10.PIXELS), dtype=np.uint8), rng.integers(0, 10, n))
            for name, n in SIZES.items()}


def write_bin(folder: Path, batches: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, (x, y) in batches.items():
        np.column_stack([y.astype(np.uint8), x]).tofile(folder / f"{name}.bin")


def write_py(folder: Path, batches: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, (x, y) in batches.items():
        with open(folder / name, "wb") as stream:  # as the official batches: labels a list, extra keys
            pickle.dump({b"batch_label": name.encode(), b"labels": [int(v) for v in y], b"data": x,
                         b"filenames": [b"img.png"] * len(y)}, stream, protocol=2)


def expected(batches: dict) -> tuple:
    train = [batches[name] for name in ("data_batch_1", "data_batch_2", "data_batch_10")]
    return (np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]), *batches["test_batch"])


@pytest.mark.parametrize("layout", ["bin", "py"])
@pytest.mark.parametrize("subfolder", [False, True])
def test_written_batches_round_trip(tmp_path, layout, subfolder):
    batches = make_batches()
    target = tmp_path / "cifar" / (f"cifar-10-batches-{layout}" if subfolder else "")
    (write_bin if layout == "bin" else write_py)(target, batches)
    splits = cifar10.load(tmp_path / "cifar")
    for got, want in zip((splits.x_train, splits.y_train, splits.x_test, splits.y_test), expected(batches)):
        np.testing.assert_array_equal(got, want)
    assert splits.x_train.dtype == splits.x_test.dtype == np.uint8
    assert splits.y_train.dtype == splits.y_test.dtype == np.int64
    assert splits.x_train.flags.c_contiguous and splits.x_test.flags.c_contiguous
    assert splits.x_train.shape == (9, 3072) and splits.x_test.shape == (5, 3072)


def test_pixels_keep_the_plane_order(tmp_path):
    image = np.arange(3 * 32 * 32).reshape(3, 32, 32) % 251  # channel c, row r, column k
    record = np.concatenate([[7], image.ravel()]).astype(np.uint8)
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    record.tofile(folder / "data_batch_1.bin")
    record.tofile(folder / "test_batch.bin")
    splits = cifar10.load(folder)
    np.testing.assert_array_equal(splits.x_train.reshape(-1, *cifar10.SHAPE)[0], image)
    assert splits.y_train.tolist() == [7] and splits.y_test.tolist() == [7]


def test_nchw_tensors_of_every_batch_present(tmp_path):
    """`images.load("cifar10")`: every training batch found, in the order of its number, as uint8 [n, 3, 32, 32]
    whose [c, r, k] is the record's byte c·1024 + r·32 + k; the batches read named in `source`."""
    batches = make_batches(2)
    write_bin(tmp_path / "cifar-10-batches-bin", batches)
    data = images.load("cifar10", tmp_path)
    x_train, y_train, x_test, y_test = expected(batches)
    assert data.x_train.shape == (9, 3, 32, 32) and data.x_test.shape == (5, 3, 32, 32)
    assert data.x_train.dtype == torch.uint8 and data.y_train.dtype == torch.int64
    for got, want in zip((data.x_train, data.y_train, data.x_test, data.y_test), (x_train, y_train, x_test, y_test)):
        np.testing.assert_array_equal(got.reshape(len(want), -1).numpy().squeeze(), want)
    c, r, k = 2, 17, 5
    assert data.x_train[4, c, r, k] == x_train[4, c * 1024 + r * 32 + k]
    assert data.source == ("cifar10: 3 of the 5 training batches (data_batch 1, 2, 10: 9 images) and the test batch "
                           "(5)")


def test_relative_folder_and_default_are_under_the_data_root(tmp_path, monkeypatch):
    batches = make_batches(1)
    write_bin(tmp_path / "cifar10" / "cifar-10-batches-bin", batches)
    write_py(tmp_path / "elsewhere", batches)
    monkeypatch.setenv("FEDBENCH_DATA", str(tmp_path))
    np.testing.assert_array_equal(cifar10.load().x_train, expected(batches)[0])
    np.testing.assert_array_equal(cifar10.load("elsewhere").y_test, batches["test_batch"][1])
    monkeypatch.delenv("FEDBENCH_DATA")
    with pytest.raises(ValueError, match=r"no data root: .* FEDBENCH_DATA to the folder that holds cifar10/ \(the CIFAR"):
        cifar10.load()  # names what CIFAR-10 needs, not FEMNIST's file


def test_malformed_inputs_are_refused_with_the_file_named(tmp_path):
    with pytest.raises(ValueError, match="absent: no such folder"):
        cifar10.load(tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"no CIFAR-10 batches found; expected .*data_batch_<k>\.bin and "
                                         r"test_batch\.bin .*cifar-10-batches-bin or cifar-10-batches-py"):
        cifar10.load(empty)

    folder = tmp_path / "bin"
    write_bin(folder, make_batches())
    (folder / "test_batch.bin").rename(folder / "moved")
    with pytest.raises(ValueError, match="training batches but no test_batch.bin"):
        cifar10.load(folder)
    (folder / "moved").rename(folder / "test_batch.bin")
    with open(folder / "data_batch_2.bin", "ab") as stream:
        stream.write(b"\0" * 10)
    with pytest.raises(ValueError, match=r"data_batch_2\.bin: 9229 bytes, not a positive multiple of 3073"):
        cifar10.load(folder)
    record = np.zeros(cifar10.RECORD, np.uint8)
    record[0] = 10
    record.tofile(folder / "data_batch_2.bin")
    with pytest.raises(ValueError, match=r"data_batch_2\.bin: label 10 at record 0 .*expected CIFAR-10 labels 0–9"):
        cifar10.load(folder)

    folder = tmp_path / "py"
    batches = make_batches()
    write_py(folder, batches)
    for name in ("data_batch_1", "data_batch_2", "data_batch_10"):
        (folder / name).unlink()
    with pytest.raises(ValueError, match="test_batch but no training batch; expected data_batch_<k>"):
        cifar10.load(folder)
    x, y = batches["test_batch"]
    with open(folder / "data_batch_1", "wb") as stream:
        pickle.dump({b"data": x, b"labels": [0, 1, 2, 3, -1]}, stream)
    with pytest.raises(ValueError, match=r"data_batch_1: label -1 at record 4"):
        cifar10.load(folder)
    with open(folder / "data_batch_1", "wb") as stream:
        pickle.dump({b"data": x[:, :100], b"labels": y.tolist()}, stream)
    with pytest.raises(ValueError, match=r"data_batch_1: data of shape \(5, 100\)"):
        cifar10.load(folder)
    with open(folder / "data_batch_1", "wb") as stream:
        pickle.dump({"data": x, "labels": y.tolist()}, stream)  # str keys, not the official bytes ones
    with pytest.raises(ValueError, match=r"data_batch_1: no b'data' and b'labels' entries"):
        cifar10.load(folder)
    (folder / "data_batch_1").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="data_batch_1: unreadable"):
        cifar10.load(folder)


# -- the shipped data ----------------------------------------------------------------------------------------------

def test_the_shipped_binary_batches():
    root = Path(os.environ.get("FEDBENCH_DATA", "/nonexistent")) / "cifar10"
    if not root.is_dir():
        pytest.skip(f"needs $FEDBENCH_DATA/cifar10 ({root} is absent)")
    splits = cifar10.load()
    assert splits.x_train.shape == (20000, 3072) and splits.x_test.shape == (10000, 3072)
    assert splits.x_train.dtype == splits.x_test.dtype == np.uint8
    assert splits.y_train.dtype == splits.y_test.dtype == np.int64
    train_counts = np.bincount(splits.y_train, minlength=10)
    assert len(train_counts) == 10 and train_counts.min() == 1925 and train_counts.max() == 2042  # SOURCE.md
    assert np.bincount(splits.y_test).tolist() == [1000] * 10
    direct = np.fromfile(root / "cifar-10-batches-bin" / "data_batch_1.bin", np.uint8, count=cifar10.RECORD)
    assert splits.y_train[0] == direct[0]
    np.testing.assert_array_equal(splits.x_train[0], direct[1:])


def test_the_shipped_batches_as_tensors_and_the_normalisation_constants():
    """The per-channel mean and std `images` normalises CIFAR-10 with are those of the full 50,000 training images:
    with all five batches present they are checked to their 4 decimals; with fewer (2 in the shared folder), to
    0.005, five times the spread of the present batches' own channel means (~1e-3)."""
    root = Path(os.environ.get("FEDBENCH_DATA", "/nonexistent")) / "cifar10"
    if not root.is_dir():
        pytest.skip(f"needs $FEDBENCH_DATA/cifar10 ({root} is absent)")
    data = images.load("cifar10")
    batches = len(cifar10.batches(None)[1])
    assert data.x_train.shape == (10_000 * batches, 3, 32, 32) and data.x_test.shape == (10_000, 3, 32, 32)
    assert data.source.startswith(f"cifar10: {batches} of the 5 training batches")
    pixels = data.x_train.to(torch.float64).div(255).transpose(0, 1).reshape(3, -1)
    tolerance = 5e-5 if batches == 5 else 5e-3
    np.testing.assert_allclose(pixels.mean(1).numpy(), data.mean, atol=tolerance)
    np.testing.assert_allclose(pixels.std(1).numpy(), data.std, atol=tolerance)
