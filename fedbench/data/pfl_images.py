"""The real-image devices of Hanzely, Zhao, Kolar (TMLR 2023, §6.1, Figs. 3–5; the Λ study of §6.4, Fig. 8,
uses the same construction with 30 / 100 images per device): M devices, each given K of the 10 classes and
`train` + `test` images of them, carved out of one image pool.

Pool (`load_pool`): the *training* split of an MNIST-format folder, as the authors' released code (its test images are
carved from that split too): Fashion-MNIST by default, or any folder of the four IDX files
(the user's MNIST or KMNIST). MNIST itself cannot be fetched offline; its stand-in `digits` is the FEMNIST
digits (labels 0–9) of every writer, train and test samples pooled in file order.

Devices (`device_split`), each choice where the paper (§6.1) and the authors' code differ a switch whose
default is the code (github.com/boxinz17/PFL-Unified-Framework, `CV/`):
* labels: `np.random.RandomState(seed)`, K draws per device in device order, as the code's
  `np.random.seed(111)` then `np.random.choice(10, size=K)` per device: with replacement, so a device can hold
  fewer than K classes ("code"); "paper": K distinct classes (`replace=False`);
* images: the first `train` + `test` pool images, in pool order, whose label is among the device's: the
  first `train` for training, the next `test` for test, so devices drawing the same classes hold the same
  images ("code"); "random": as many distinct images drawn uniformly among those of the device's classes,
  from the same RandomState after every device's labels;
* normalisation: torchvision's `Normalize` with the dataset's scalar mean and std on pixel/255 ("code"), or
  every pixel standardised over all devices' training rows ("paper"); then each row is divided by its L2 norm
  either way, so ‖x‖ = 1, which is why the paper takes 𝓛' = 1 (§6.1–6.2).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedbench.data import femnist, idx

CLASSES = 10  # every device's labels are drawn from 0..9 (the code's np.random.choice(10, ...))
SOURCES = ("fashion-mnist", "idx", "digits")
LABEL_DRAWS = ("code", "paper")
SELECTIONS = ("code", "random")
NORMALIZATIONS = ("code", "paper")

# The scalar (mean, std) of pixel/255 over each training split, as the authors' code passes to torchvision's
# Normalize. `digits` stands in for MNIST and takes its constants.
SCALAR_STATS = {"mnist": (0.1307, 0.3081), "kmnist": (0.1918, 0.3483), "fashion-mnist": (0.2861, 0.3530)}
SCALAR_STATS["digits"] = SCALAR_STATS["mnist"]


@dataclass(frozen=True)
class DeviceImages:
    """Every device's images, unit-norm rows."""

    x_train: np.ndarray  # [M, train, d] float64
    y_train: np.ndarray  # [M, train] int64
    x_test: np.ndarray  # [M, test, d] float64
    y_test: np.ndarray  # [M, test] int64
    labels: list[np.ndarray]  # M arrays: each device's distinct classes, sorted (1 to K of them)
    train_rows: np.ndarray  # [M, train] int64: the pool rows of x_train
    test_rows: np.ndarray  # [M, test] int64


def load_pool(source: str, path: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The pool (pixels [N, 784] as grey levels 0..255 with 0 the background, labels [N] int64) of `source`:
    "fashion-mnist" (default folder fashion-mnist/), "idx" (the folder `path`, required) or "digits" (default
    file femnist/femnist_full.npz). A relative `path` is taken under the data root (FEDBENCH_DATA), as for
    every FEMNIST source."""
    if source == "digits":
        return _digits(path)
    splits = idx.load_folder(_idx_folder(source, path))
    return splits.x_train, splits.y_train


def pool_labels(source: str, path: str | None = None) -> np.ndarray:
    """The labels [N] of `load_pool`'s pool, without reading its images."""
    if source == "digits":
        labels = femnist.load_index("full", path).y
        return labels[labels < CLASSES]
    return idx.train_labels(_idx_folder(source, path))


def _idx_folder(source: str, path: str | None) -> Path:
    if source not in SOURCES:
        raise ValueError(f"unknown image source {source!r}; expected one of {' | '.join(SOURCES)}")
    if path is None and source == "idx":
        raise ValueError("source 'idx' needs path: a folder holding the four IDX files of an MNIST-format dataset")
    folder = Path(path or "fashion-mnist").expanduser()
    return folder if folder.is_absolute() else femnist.data_root(holds=f"{folder}/ (the IDX files)") / folder


def _digits(path: str | None) -> tuple[np.ndarray, np.ndarray]:
    images = femnist.load("full", path)
    assert images.x is not None  # loaded with its pixels
    keep = images.y < CLASSES
    x = images.x[keep]
    # FEMNIST stores the background as white (255, or 1.0 for float pixels) and the ink dark; MNIST the reverse.
    # Inverted to MNIST's polarity so that MNIST's scalar constants centre the background as they do on MNIST.
    np.subtract(x.dtype.type(femnist.white(x)), x, out=x)
    if x.dtype != np.uint8:  # float intensities in [0, 1]: the same grey levels as uint8 pools
        x *= 255.0
    return x, images.y[keep]


def draw_labels(rng: np.random.RandomState, devices: int, classes: int, label_draw: str = "code") -> np.ndarray:
    """[devices, classes] int64: each device's `classes` draws from 0..9, device by device from `rng`; with
    replacement ("code": np.random.choice(10, size=K)) or without ("paper")."""
    if label_draw not in LABEL_DRAWS:
        raise ValueError(f"label_draw: expected one of {' | '.join(LABEL_DRAWS)}, found {label_draw!r}")
    replace = label_draw == "code"
    return np.stack([rng.choice(CLASSES, size=classes, replace=replace) for _ in range(devices)]).astype(np.int64)


def device_split(x: np.ndarray, y: np.ndarray, devices: int = 20, classes: int = 2, train: int = 100,
                 test: int = 300, label_draw: str = "code", selection: str = "code", normalization: str = "code",
                 dataset_mean: float | None = None, dataset_std: float | None = None,
                 seed: int = 111) -> DeviceImages:
    """`devices` devices of `classes` (K) labels each, carved from the pool `x` [N, d] (grey levels 0..255),
    `y` [N] (module docstring). Normalisation "code" needs the pool's `dataset_mean`, `dataset_std` (of
    pixel/255; SCALAR_STATS)."""
    _check_arguments(x, y, devices, classes, train, test, selection, normalization, dataset_mean, dataset_std)
    draws, rows = device_rows(y, devices, classes, train, test, label_draw, selection, seed)
    features = x[rows].astype(np.float64)
    if normalization == "code":
        # ToTensor then Normalize; the std cancels in the row scaling below but is kept to be the code's features.
        features = (features / 255.0 - dataset_mean) / dataset_std
        x_train, x_test = features[:, :train], features[:, train:]
    else:
        x_train, x_test = _standardized(features[:, :train], features[:, train:])
    return DeviceImages(_unit_rows(x_train), y[rows[:, :train]], _unit_rows(x_test), y[rows[:, train:]],
                        [np.unique(drawn) for drawn in draws], rows[:, :train], rows[:, train:])


def device_rows(y: np.ndarray, devices: int, classes: int, train: int, test: int, label_draw: str = "code",
                selection: str = "code", seed: int = 111) -> tuple[np.ndarray, np.ndarray]:
    """(each device's label draws [M, K], its pool rows [M, train + test]) for a pool of labels `y` (module
    docstring): all `device_split` needs of the pool but its images."""
    rng = np.random.RandomState(seed)
    draws = draw_labels(rng, devices, classes, label_draw)
    need = train + test
    rows = np.empty((devices, need), dtype=np.int64)
    for m, drawn in enumerate(draws):
        candidates = np.flatnonzero(np.isin(y, drawn))
        if len(candidates) < need:
            raise ValueError(f"device {m} (classes {sorted(set(drawn.tolist()))}): the pool holds {len(candidates)} "
                             f"images of its classes, fewer than train + test = {need}")
        rows[m] = candidates[:need] if selection == "code" else rng.choice(candidates, size=need, replace=False)
    return draws, rows


def _check_arguments(x, y, devices, classes, train, test, selection, normalization, dataset_mean, dataset_std):
    if x.ndim != 2 or y.shape != (len(x),):
        raise ValueError(f"pool: expected pixels [N, d] and labels [N], found {list(x.shape)} and {list(y.shape)}")
    if not 1 <= classes <= CLASSES:
        raise ValueError(f"classes (K): expected an integer in 1..{CLASSES}, found {classes!r}")
    if devices < 1 or train < 1 or test < 0:
        raise ValueError(f"expected devices >= 1, train >= 1 and test >= 0; found {devices}, {train}, {test}")
    if selection not in SELECTIONS:
        raise ValueError(f"selection: expected one of {' | '.join(SELECTIONS)}, found {selection!r}")
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization: expected one of {' | '.join(NORMALIZATIONS)}, found {normalization!r}")
    if normalization == "code" and (dataset_mean is None or dataset_std is None or not dataset_std > 0):
        raise ValueError("normalization 'code' needs the pool's dataset_mean and a positive dataset_std "
                         f"(SCALAR_STATS: {SCALAR_STATS}); found {dataset_mean!r}, {dataset_std!r}")


def _standardized(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every column centred and scaled to unit (population) variance by the statistics of all devices' training
    rows (an image two devices hold counts twice), applied to the test rows too. A column constant over the training
    rows (a border pixel that is background in all of them) has nothing to scale: it becomes 0 in both, rather than
    a division by zero."""
    pooled = train.reshape(-1, train.shape[-1])
    mean, std = pooled.mean(0), pooled.std(0)
    scale = np.divide(1.0, std, out=np.zeros_like(std), where=std > 0)
    return (train - mean) * scale, (test - mean) * scale


def _unit_rows(features: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(features, axis=-1, keepdims=True)
    if (norms == 0).any():
        device, row = np.argwhere(norms[..., 0] == 0)[0]
        raise ValueError(f"device {device}, image {row}: all its features are 0 after the normalisation; it cannot "
                         "be scaled to unit norm")
    return features / norms
