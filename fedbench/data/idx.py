"""The standard IDX files of MNIST-format image datasets (MNIST, Fashion-MNIST, KMNIST, ...): a folder holding
`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`,
each gzip-compressed (`.gz`, as distributed) or not. Read with gzip and NumPy only; the header (magic number
0x00000803 for uint8 images of 3 dimensions, 0x00000801 for labels, then the big-endian sizes) is checked, and
a missing or malformed file raises a ValueError naming it and what was expected.

Hanzely, Zhao, Kolar (TMLR 2023, §6) use MNIST, KMNIST and Fashion-MNIST in this format (Fashion-MNIST:
`shared/data/fashion-mnist/`, its SOURCE.md).
"""
from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SPLITS = {"train": "train", "test": "t10k"}
IMAGES_MAGIC, LABELS_MAGIC = 0x0803, 0x0801  # uint8 data, 3 and 1 dimensions


@dataclass(frozen=True)
class ImageSplits:
    x_train: np.ndarray  # [n, rows·cols] uint8, row-major
    y_train: np.ndarray  # [n] int64
    x_test: np.ndarray
    y_test: np.ndarray


def load_folder(folder: str | Path) -> ImageSplits:
    folder = existing(folder)
    parts = {}
    for split, prefix in SPLITS.items():
        images = read(find(folder, f"{prefix}-images-idx3-ubyte"), IMAGES_MAGIC)
        labels = read(find(folder, f"{prefix}-labels-idx1-ubyte"), LABELS_MAGIC)
        if len(images) != len(labels):
            raise ValueError(f"{folder}: {prefix} has {len(images)} images but {len(labels)} labels")
        parts[split] = images.reshape(len(images), -1), labels.astype(np.int64)
    return ImageSplits(*parts["train"], *parts["test"])


def train_labels(folder: str | Path) -> np.ndarray:
    """The training split's labels `[n]` int64 alone (its images are not read): what partitions of the pool need."""
    return read(find(existing(folder), f"{SPLITS['train']}-labels-idx1-ubyte"), LABELS_MAGIC).astype(np.int64)


def existing(folder: str | Path) -> Path:
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such folder; expected one holding the four IDX files "
                         f"{', '.join(f'{p}-{{images-idx3,labels-idx1}}-ubyte[.gz]' for p in SPLITS.values())}")
    return folder


def find(folder: Path, name: str) -> Path:
    for candidate in (folder / f"{name}.gz", folder / name):
        if candidate.is_file():
            return candidate
    raise ValueError(f"{folder}: no {name}.gz or {name}; expected the four standard IDX files of an MNIST-format "
                     "dataset")


def read(path: Path, magic: int) -> np.ndarray:
    """The array of one IDX file: `[n, rows, cols]` images or `[n]` labels, uint8."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as stream:
            data = stream.read()
    except (OSError, EOFError) as err:
        raise ValueError(f"{path}: unreadable ({err}); expected an IDX file, "
                         "gzip-compressed if it ends in .gz") from None
    dims = magic & 0xFF
    header = 4 + 4 * dims
    found = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
    if found != magic or len(data) < header:
        raise ValueError(f"{path}: IDX magic number {found!r}, expected {magic:#010x} (uint8 data of {dims} "
                         "dimension(s))")
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims))
    if len(data) - header != int(np.prod(shape)):
        raise ValueError(f"{path}: {len(data) - header} bytes of data for the shape {shape} in its header")
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape)
