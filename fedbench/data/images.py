"""Image classification data sets as NCHW tensors for convolutional networks, and CIFAR's crop-and-flip
augmentation batched over clients.

`load(name, folder)` reads `fashion_mnist` (the IDX files, `fedbench.data.idx`; 60,000 + 10,000 images of 1×28×28)
or `cifar10` (every training batch present, then the test batch, `fedbench.data.cifar10`; 3×32×32) into an
`ImageTensors`: uint8 pixels [n, C, H, W] as stored (a quarter of float32's memory: 50,000 CIFAR images are 154 MB),
int64 labels, the per-channel mean and standard deviation of the data set's full training split (of pixel/255), and
a one-line account of the files read. `normalize` maps uint8 pixels to (x/255 − mean)/std, the usual
`ToTensor()` + `Normalize(mean, std)` of torchvision recipes; the constants are those of the full training split
(CIFAR-10: all 50,000 images, whichever batches are present, so a run's inputs do not depend on them).

Augmentation (the standard CIFAR recipe: He, Zhang, Ren, Sun, CVPR 2016, §4.2, "4 pixels are padded on each side,
and a 32×32 crop is randomly sampled from the padded image or its horizontal flip"; torchvision's
`RandomCrop(32, padding=4)` + `RandomHorizontalFlip()`): `crop_flip_draws(shape, generator, padding)` draws, for
every image of a step's minibatches [..., b], its offsets (dy, dx) uniform in {0, …, 2·padding} and a flip with
probability ½, from one generator in the rows' order, as a problem's `minibatch_noise` draws on the run's stream;
`crop_flip(x, draws, padding)` applies them to images [..., C, H, W] on their device, batched: the H×W window at
(dy, dx) of the image zero-padded by `padding` on each side (pad the uint8 pixels, before `normalize`, for
torchvision's black border), mirrored left–right where drawn. `random_crop_flip` is the two in one.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedbench.data import cifar10, idx
from fedbench.data.femnist import data_root

# name -> (default folder under the data root, image shape, per-channel mean and std of the full training split).
# CIFAR-10: over the 50,000 training images of all five batches; Fashion-MNIST: over its 60,000 (its SOURCE.md:
# mean 72.94/255 = 0.2860).
DATASETS = {
    "fashion_mnist": ("fashion-mnist", (1, 28, 28), (0.2860,), (0.3530,)),
    "cifar10": ("cifar10", cifar10.SHAPE, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}


@dataclass(frozen=True)
class ImageTensors:
    """A data set's training and test images as uint8 NCHW tensors, with its normalisation constants and the files
    it was read from."""

    x_train: Tensor  # [n, C, H, W] uint8, as stored
    y_train: Tensor  # [n] int64
    x_test: Tensor
    y_test: Tensor
    mean: tuple[float, ...]  # per channel, of pixel/255, over the data set's full training split
    std: tuple[float, ...]
    source: str  # the files read, e.g. "cifar10: 2 of the 5 training batches (data_batch 1, 2: 20,000 images) and …"


def load(name: str, folder: str | Path | None = None) -> ImageTensors:
    """Data set `name` (one of DATASETS) from `folder` (None: its default folder under `$FEDBENCH_DATA`; a relative
    folder is taken under the data root)."""
    if name not in DATASETS:
        raise ValueError(f"unknown image data set {name!r}; expected one of {' | '.join(DATASETS)}")
    default, shape, mean, std = DATASETS[name]
    if name == "cifar10":
        _, numbered, _ = cifar10.batches(folder)
        splits = cifar10.load(folder)
        numbers = ", ".join(path.name.removesuffix(".bin").removeprefix("data_batch_") for path in numbered)
        source = (f"cifar10: {len(numbered)} of the 5 training batches (data_batch {numbers}: "
                  f"{len(splits.y_train):,} images) and the test batch ({len(splits.y_test):,})")
    else:
        chosen = Path(folder).expanduser() if folder is not None else Path(default)
        location = chosen if chosen.is_absolute() else data_root(holds=f"{chosen}/ (the IDX files)") / chosen
        splits = idx.load_folder(location)
        source = f"{name}: {len(splits.y_train):,} training and {len(splits.y_test):,} test images ({location.name})"
    def tensor(array: np.ndarray) -> Tensor:  # a copy only of a read-only array (the IDX bytes), which torch refuses
        return torch.from_numpy(np.require(array, requirements="W"))

    return ImageTensors(tensor(splits.x_train.reshape(-1, *shape)), tensor(splits.y_train),
                        tensor(splits.x_test.reshape(-1, *shape)), tensor(splits.y_test), mean, std, source)


def normalize(x: Tensor, mean: tuple[float, ...], std: tuple[float, ...], dtype: torch.dtype = torch.float32) -> Tensor:
    """uint8 pixels [..., C, H, W] -> (x/255 − mean_c)/std_c in `dtype`, on x's device."""
    shape = (len(mean), 1, 1)
    mean_t = torch.tensor(mean, dtype=dtype, device=x.device).view(shape)
    std_t = torch.tensor(std, dtype=dtype, device=x.device).view(shape)
    return (x.to(dtype) / 255 - mean_t) / std_t


def crop_flip_draws(shape: tuple[int, ...], generator: torch.Generator, padding: int = 4) -> Tensor:
    """int64 [*shape, 3]: each image's (dy, dx) uniform in {0, …, 2·padding}, then flip (1 with probability ½);
    drawn on the CPU generator, offsets first (all images), then flips."""
    offsets = torch.randint(2 * padding + 1, (*shape, 2), generator=generator)
    flips = torch.randint(2, (*shape, 1), generator=generator)
    return torch.cat([offsets, flips], dim=-1)


def crop_flip(x: Tensor, draws: Tensor, padding: int = 4) -> Tensor:
    """Images x [..., C, H, W] cropped at their (dy, dx) from the zero-padded image and flipped where drawn
    (`draws` [..., 3], as `crop_flip_draws`), on x's device."""
    *lead, channels, height, width = x.shape
    flat = torch.nn.functional.pad(x.reshape(-1, channels, height, width), (padding,) * 4)
    draws = draws.reshape(-1, 3).to(x.device)
    dy, dx, flip = draws[:, :1], draws[:, 1:2], draws[:, 2:].bool()
    rows = dy + torch.arange(height, device=x.device)  # [M, H]
    columns = torch.arange(width, device=x.device)
    columns = dx + torch.where(flip, width - 1 - columns, columns)  # [M, W]: read right to left where flipped
    count, padded_width = len(flat), width + 2 * padding
    picked = flat.gather(2, rows[:, None, :, None].expand(count, channels, height, padded_width))
    out = picked.gather(3, columns[:, None, None, :].expand(count, channels, height, width))
    return out.reshape(*lead, channels, height, width)


def random_crop_flip(x: Tensor, generator: torch.Generator, padding: int = 4) -> Tensor:
    """`crop_flip(x, crop_flip_draws(x.shape[:-3], generator, padding), padding)`: x [S, b, C, H, W] (any leading
    axes), one draw per image, in the rows' order."""
    return crop_flip(x, crop_flip_draws(tuple(x.shape[:-3]), generator, padding), padding)
