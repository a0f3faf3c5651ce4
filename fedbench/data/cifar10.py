"""CIFAR-10 (Krizhevsky 2009) from its official distribution folders, for Per-FedAvg
(Fallah et al., NeurIPS 2020, §5 and Appendix I).

Two layouts are read, NumPy only:
* the **binary version** `cifar-10-batches-bin/`: `data_batch_<k>.bin` and `test_batch.bin`, each a run of
  3,073-byte records — one label byte (0–9), then 3,072 pixel bytes: the 1,024 red values, then green, then
  blue, each a 32×32 image in row-major order (the shared `cifar10/` folder, its SOURCE.md);
* the **python version** `cifar-10-batches-py/` (what torchvision downloads): `data_batch_<k>` and
  `test_batch`, each a pickled dict with b"data" uint8 [n, 3072] in the same plane order and b"labels".

`load` returns an `ImageSplits` whose x rows are the 3,072 bytes as stored, i.e. a flattened (3, 32, 32)
image (`x.reshape(-1, *SHAPE)`), and y int64; `load_labels` the labels alone (of the binary version, without
reading the pixels). Every training batch present is read, in the order of its
number, then the test batch; a missing or malformed batch raises a ValueError naming the path and what was
expected.
"""
from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Callable

import numpy as np

from fedbench.data.femnist import data_root
from fedbench.data.idx import ImageSplits

CLASSES = 10
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
SHAPE = (3, 32, 32)  # channel (R, G, B), row, column
PIXELS = 3 * 32 * 32
RECORD = 1 + PIXELS  # bytes of one record of the binary version
DEFAULT_FOLDER = "cifar10"  # under the data root
SUBFOLDERS = ("cifar-10-batches-bin", "cifar-10-batches-py")
# The file names of each layout: training batches (their number captured) and the test batch.
LAYOUTS = {"bin": (re.compile(r"data_batch_(\d+)\.bin"), "data_batch_<k>.bin", "test_batch.bin"),
           "py": (re.compile(r"data_batch_(\d+)"), "data_batch_<k>", "test_batch")}
EXPECTED = ("the CIFAR-10 batches data_batch_<k>.bin and test_batch.bin (binary version) or data_batch_<k> and "
            "test_batch (python version), in the folder itself or its subfolder "
            f"{' or '.join(SUBFOLDERS)}")


def load(folder: str | Path | None = None) -> ImageSplits:
    """CIFAR-10 from `folder` (None: `$FEDBENCH_DATA/cifar10`; a relative folder is taken under the data root)."""
    read, numbered, test = batches(folder)
    train = [read(path) for path in numbered]
    x_test, y_test = read(test)
    return ImageSplits(np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]),
                       np.ascontiguousarray(x_test), y_test)


def load_labels(folder: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The (training, test) labels of `folder` as `load` reads them: of the binary version the label bytes alone
    (the pixels are not read); the python version's batches are read whole."""
    read, numbered, test = batches(folder)
    label = read_bin_labels if read is read_bin else (lambda path: read_pickle(path)[1])
    return np.concatenate([label(path) for path in numbered]), label(test)


def batches(folder: str | Path | None) -> tuple[Callable[[Path], tuple[np.ndarray, np.ndarray]], list[Path], Path]:
    """(the reader of the layout found, the training batches in the order of their numbers, the test batch)."""
    folder = resolve(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such folder; expected one holding {EXPECTED}")
    for candidate in (folder, *(folder / sub for sub in SUBFOLDERS)):
        if not candidate.is_dir():
            continue
        for layout, (train_pattern, train_name, test_name) in LAYOUTS.items():
            numbered = sorted((int(m.group(1)), path) for path in candidate.iterdir()
                              if path.is_file() and (m := train_pattern.fullmatch(path.name)))
            test = candidate / test_name
            if not numbered and not test.is_file():
                continue
            if not numbered:
                raise ValueError(f"{candidate}: {test_name} but no training batch; expected {train_name} "
                                 "beside it")
            if not test.is_file():
                raise ValueError(f"{candidate}: training batches but no {test_name}; expected the test batch "
                                 "beside them")
            return read_bin if layout == "bin" else read_pickle, [path for _, path in numbered], test
    raise ValueError(f"{folder}: no CIFAR-10 batches found; expected {EXPECTED}")


def resolve(folder: str | Path | None) -> Path:
    chosen = Path(folder).expanduser() if folder is not None else Path(DEFAULT_FOLDER)
    return chosen if chosen.is_absolute() else data_root(holds=f"{chosen}/ (the CIFAR-10 batches)") / chosen


def read_bin(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Pixels [n, 3072] uint8 and labels [n] int64 of one batch of the binary version."""
    records = bin_records(path, np.fromfile(path, np.uint8))
    return records[:, 1:], checked_labels(path, records[:, 0])


def read_bin_labels(path: Path) -> np.ndarray:
    """The labels [n] int64 of one batch of the binary version, its pixels mapped but never read."""
    mapped = np.memmap(path, np.uint8, mode="r") if path.stat().st_size else np.empty(0, np.uint8)  # none to map
    return checked_labels(path, bin_records(path, mapped)[:, 0])


def bin_records(path: Path, data: np.ndarray) -> np.ndarray:
    if data.size == 0 or data.size % RECORD:
        raise ValueError(f"{path}: {data.size} bytes, not a positive multiple of {RECORD}; expected records of "
                         f"1 label byte and {PIXELS} pixel bytes (CIFAR-10 binary version)")
    return data.reshape(-1, RECORD)


def read_pickle(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Pixels [n, 3072] uint8 and labels [n] int64 of one batch of the python version."""
    expected = f"a pickled dict with b'data' uint8 [n, {PIXELS}] and b'labels' [n] (CIFAR-10 python version)"
    # pickle is used only for the official CIFAR-10 python batches, a local dataset file the user supplied.
    try:
        with open(path, "rb") as stream:
            batch = pickle.load(stream, encoding="bytes")
    except Exception as err:  # any unpickling failure: not a CIFAR batch
        raise ValueError(f"{path}: unreadable ({type(err).__name__}: {err}); expected {expected}") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{path}: no b'data' and b'labels' entries; expected {expected}")
    x, y = np.asarray(batch[b"data"]), np.asarray(batch[b"labels"])
    if x.ndim != 2 or x.shape[1] != PIXELS or x.shape[0] == 0 or y.shape != (x.shape[0],):
        raise ValueError(f"{path}: data of shape {x.shape} and labels of shape {y.shape}; expected {expected}")
    if x.dtype != np.uint8:
        if x.dtype.kind not in "iu" or x.min() < 0 or x.max() > 255:
            raise ValueError(f"{path}: data of dtype {x.dtype}; expected {expected}")
        x = x.astype(np.uint8)
    if y.dtype.kind not in "iu":
        raise ValueError(f"{path}: labels of dtype {y.dtype}; expected integer labels 0–{CLASSES - 1}")
    return x, checked_labels(path, y)


def checked_labels(path: Path, labels: np.ndarray) -> np.ndarray:
    labels = labels.astype(np.int64)
    bad = (labels < 0) | (labels >= CLASSES)
    if bad.any():
        first = int(np.argmax(bad))
        raise ValueError(f"{path}: label {labels[first]} at record {first} ({int(bad.sum())} outside 0–"
                         f"{CLASSES - 1}); expected CIFAR-10 labels 0–{CLASSES - 1}")
    return labels
