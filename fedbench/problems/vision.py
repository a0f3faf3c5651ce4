"""Federated image classification with a deep network: any torch `nn.Module` (`fedbench.networks.module_model`) on
Fashion-MNIST, CIFAR-10 or FEMNIST, the clients still one batch of the engine.

Data (from the data root, `FEDBENCH_DATA`, or `path`): Fashion-MNIST's IDX files (`fashion-mnist/`, 60,000 training
and 10,000 test images, 1×28×28), CIFAR-10's batches (`cifar10/`, every training batch present and the test batch,
3×32×32), or FEMNIST's writers (the shipped npz `femnist/femnist_sample10.npz`, 62 classes, 1×28×28, ink = 1).
Pixels are kept as stored (uint8) and standardised per gathered batch, by channel: Fashion-MNIST and CIFAR-10, read
by `fedbench.data.images.load`, with the mean and standard deviation of their full training split (the usual
torchvision constants, whatever subset a run keeps); FEMNIST with its kept writers' own (computed once). With
`augment: crop_flip` (CIFAR-10), each image of a step's training minibatch is zero-padded by 4 pixels, cropped back
to 32×32 at a random offset and mirrored with probability ½ (He et al., CVPR 2016, §4.2;
`fedbench.data.images.crop_flip`), drawn per row on the run's "feature-noise" stream (`minibatch_noise`, as the
dropout seeds): batched seeds draw each its own; evaluation sees the images as stored. `train_size` / `test_size`
keep a random subset of the pools (drawn by the data seed; for short runs and tests), after which Fashion-MNIST and
CIFAR-10 are split over `clients` by `partition` (`fedbench.data.partitions`, on the data seed's "partition"
stream): `iid` (parts of ⌊n/N⌋ or ⌈n/N⌉ images), `dirichlet` label skew Dir(`alpha`), `label_quantity` #C =
`classes_per_client`, or McMahan et al.'s `shards` (`shards_per_client`), each client holding at least `min_size`
images. Validation draws the same split on the labels alone (with the data seed, or seed 0 where the data follow the
trial's seed) and refuses what it refuses. A client holding fewer than b images takes all of them in each step
(`caps_batches`). FEMNIST's clients are its writers, each with its own training images (`clients`: the first that
many writers; null: all), with `partition: writers`. The test metrics pool the test set (FEMNIST: every kept
writer's test images).

Model: `model` names a built-in network (`cnn`: two 5×5 convolutions of 16 and 32 channels, each with ReLU and 2×2
max pooling, then a linear layer to the classes; with `dropout` > 0 a dropout layer before it) or a researcher's
class, `module.path:Class` or `file.py:Class` (in a recipe, relative to the recipe's folder; on the command line,
`--set`, to the working directory; a file's text travels with each run to the Ray worker that runs it, a module
that is not installed is shipped with the Ray job, as a module plugin is), built without arguments and given the
data's shape by its own code. Loss: the mean softmax cross-entropy of a client's minibatch; h = 0; π_k ∝ n_k.
Initial point: the module's own initialisation, drawn with the run's "init" stream.

Layout (`fedbench.networks.module_model`): `vmap` or `loop`, the same numbers to float32 rounding; `auto` picks by the
table `bench/deep_layouts.py` measured for the model (or one of about its size) on the device type. The chosen
layout is printed when a run starts and tagged on it (`choices`).

Memory, estimated at validation (`run_bytes`, `state_bytes`): the kept images' pixels, and float32 copies of the
network's parameters (as many per client as the algorithm keeps vectors, a few per sampled client and for the
server) and of its leaf layers' outputs for each sampled client's batch.

Metrics of the global model: `test_loss` and `test_accuracy` over the pooled test set, evaluated in eval mode
(dropout off) in chunks of EVAL_CHUNK images; with `train_metrics`, `train_loss` and `train_accuracy` over every
client's training images too (one forward pass over the whole pool: the longest part of an evaluation). A model
with a non-finite output (diverged) has NaN loss and accuracy, so that its run ends diverged there.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedbench.data import cifar10, femnist, idx, images
from fedbench.data.partitions import SCHEMES, Partition
from fedbench.hparams import Param, ParamError
from fedbench.metrics import Metric
from fedbench.networks import NETWORKS, check_module, load_network
from fedbench.networks.module_model import LAYOUTS, ModuleModel, choose_layout
from fedbench.oracle import Oracle
from fedbench.problems.base import Layout, Problem, padded_rows
from fedbench.problems.traces import transformed
from fedbench.prox import NoRegularizer
from fedbench.rng import generator
from fedbench.sources import Source

EVAL_CHUNK = 2048  # images per evaluation forward pass
DATASETS = ("fashion_mnist", "cifar10", "femnist")
SHAPES = {"fashion_mnist": (1, 28, 28), "cifar10": cifar10.SHAPE, "femnist": (1, 28, 28)}
CLASSES = {"fashion_mnist": 10, "cifar10": cifar10.CLASSES, "femnist": femnist.LABELS}
DEFAULT_FOLDERS = {"fashion_mnist": "fashion-mnist", "cifar10": cifar10.DEFAULT_FOLDER}
AUGMENTATIONS = ("none", "crop_flip")
CROP_PADDING = 4  # pixels of zero padding before CIFAR's random 32×32 crop (He et al., CVPR 2016, §4.2)
POOLS = {"fashion_mnist": (60000, 10000), "cifar10": (50000, 10000)}  # training and test images (memory estimate)
# Model-sized float32 vectors a run holds beside those its algorithm keeps per client (the memory estimate): per
# sampled client, its point, gradient, upload and the algorithm's local state; for the server, its model, the mean
# upload and the algorithm's server state. A step keeps each layer's output for its backward pass, and its gradient.
LOCAL_COPIES, SERVER_COPIES, ACTIVATION_COPIES = 4, 4, 2


class SmallCNN(nn.Module):
    """Two 5×5 convolutions (16 and 32 channels, padding 2), each followed by ReLU and 2×2 max pooling, then a linear
    layer to the classes (with `dropout` > 0, a dropout layer before it)."""

    def __init__(self, shape: tuple[int, int, int] = (1, 28, 28), classes: int = 10, dropout: float = 0.0):
        super().__init__()
        channels, height, width = shape
        self.conv1 = nn.Conv2d(channels, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.fc = nn.Linear(32 * (height // 4) * (width // 4), classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(self.dropout(x.flatten(-3)))


BUILT_IN_MODELS: dict[str, Callable[..., nn.Module]] = {"cnn": SmallCNN}
"""The built-in networks by name, each built as `factory(shape, classes, dropout)`."""


def model_factory(spec: str, shape: tuple[int, int, int], classes: int, dropout: float) -> Callable[[], nn.Module]:
    """The factory of the network `spec` names: the built-in `cnn` (with `dropout`), a shipped network of
    `fedbench.networks` for the data's shape and classes, or a researcher's class (`load_network`), built without
    arguments; ParamError (field `model`) where it names none."""
    if spec in BUILT_IN_MODELS:
        return functools.partial(BUILT_IN_MODELS[spec], shape, classes, dropout)
    if spec in NETWORKS:
        return functools.partial(NETWORKS[spec].build, shape, classes)
    return load_network(spec)[0]


def network_code_hashes(spec: str) -> dict[str, str]:
    """{"model": the sha256 of a researcher's network's code} (`load_network`), nothing for a built-in or shipped
    one: what a problem with a `model` field returns as its `code_hashes`."""
    if spec in BUILT_IN_MODELS or spec in NETWORKS:
        return {}
    return {"model": load_network(spec)[1].sha256}


def network_sources(spec: str) -> tuple[Source, ...]:
    """A researcher's network, which a run carries: a file (its text and the modules it imports from its folder) or a
    module (shipped with a Ray job where this machine imports it from a folder); a problem's `carried_code`."""
    if spec in BUILT_IN_MODELS or spec in NETWORKS:
        return ()
    return (load_network(spec)[1],)


def channel_statistics(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FEMNIST's normalisation (`fedbench.data.images` has no full-split constants of it): per-channel mean and
    (population) standard deviation of the intensities pixels/255 `[n, channels, h·w]`, by float64 sums over chunks
    of images (no float copy of the whole pool)."""
    sums, squares = np.zeros(pixels.shape[1]), np.zeros(pixels.shape[1])
    for start in range(0, len(pixels), EVAL_CHUNK):
        chunk = pixels[start: start + EVAL_CHUNK].astype(np.float64) / 255
        sums += chunk.sum((0, 2))
        squares += (chunk * chunk).sum((0, 2))
    count = len(pixels) * pixels.shape[2]
    mean = sums / count
    return mean, np.sqrt(np.maximum(squares / count - mean * mean, 0.0))


@functools.lru_cache(maxsize=64)
def network_sizes(model: str, data: str, dropout: float, source_sha256: str | None) -> tuple[int, int]:
    """(parameters, leaf layers' output values for one image) of a network on a data set's images, once per network
    (and file content: `source_sha256`) in a process: a recipe's trials share them."""
    network = Vision.network({"model": model, "data": data, "dropout": dropout})
    return network.dim, network.activations(SHAPES[data])


class Vision(Problem):
    name = "vision"
    provides = frozenset({"hvp", "full_data"})
    caps_batches = True  # a skewed split's small client takes all its images each step
    compute_bound_steps = True  # a network's forward and backward passes, not the gather, set a step's time
    size_params = ("clients",)
    params = (
        Param("data", "choice", "fashion_mnist", "data set: Fashion-MNIST, CIFAR-10 or FEMNIST's writers",
              choices=DATASETS),
        Param("path", "str", None, "folder (Fashion-MNIST, CIFAR-10) or npz file (FEMNIST) of the data, relative ones "
              "under the data root (None: fashion-mnist/, cifar10/, femnist/femnist_sample10.npz)", nullable=True),
        Param("model", "str", "cnn", "the network: cnn (built in), a shipped network (fedbench list), "
              "file.py:Class or module:Class (an nn.Module built without arguments)"),
        Param("dropout", "float", 0.0, "dropout rate before the built-in cnn's last layer", low=0, high=1,
              high_open=True),
        Param("clients", "int", 10, "number of clients N (FEMNIST: the first N writers; null: all)", low=1,
              nullable=True),
        Param("partition", "choice", "iid", "how the pool is split (fedbench.data.partitions; FEMNIST: writers, "
              "each its own)", choices=(*SCHEMES, "writers")),
        Param("alpha", "float", None, "dirichlet: the concentration α of each class's Dir(α·1_N) over the clients",
              low=0, low_open=True, nullable=True),
        Param("classes_per_client", "int", None, "label_quantity: the labels #C = k each client holds", low=1,
              nullable=True),
        Param("shards_per_client", "int", None, "shards: the shards of label-sorted images each client gets", low=1,
              nullable=True),
        Param("min_size", "int", 1, "the images each client holds at least (dirichlet tops a draw up to it)", low=0),
        Param("train_size", "int", None, "Fashion-MNIST, CIFAR-10: keep a random subset of this many training "
              "images (null: all)", low=1,
              nullable=True),
        Param("test_size", "int", None, "Fashion-MNIST, CIFAR-10: keep a random subset of this many test images "
              "(null: all)", low=1,
              nullable=True),
        Param("layout", "choice", "auto", "how the clients' forward passes run: vmap, a loop inside the program, "
              "or auto (the measured table)", choices=("auto", *LAYOUTS)),
        Param("augment", "choice", "none", "CIFAR-10: crop_flip, each training image of a step padded by 4, "
              "cropped back at a random offset and mirrored with probability 1/2 (He et al. 2016); none: as stored",
              choices=AUGMENTATIONS),
        Param("train_metrics", "bool", False, "also evaluate the training loss and accuracy (a pass over the pool)"),
        Param("data_seed", "int", None, "seed of the subsets and the split (None: the trial's seed)", low=0,
              nullable=True),
    )

    @classmethod
    def check(cls, config: dict[str, Any]) -> None:
        femnist_data = config["data"] == "femnist"
        if femnist_data != (config["partition"] == "writers"):
            raise ParamError("partition", f"found {config['partition']} with data {config['data']}, expected "
                             f"{'writers' if femnist_data else ' | '.join(SCHEMES)}", cls.name)
        if not femnist_data and config["clients"] is not None:
            cls.partition(config)  # a scheme's missing or misplaced parameter refused here
        for size in ("train_size", "test_size"):
            if femnist_data and config[size] is not None:
                raise ParamError(size, f"found {config[size]} with data femnist, expected null (each writer keeps "
                                 "its own images)", cls.name)
        if config["augment"] != "none" and config["data"] != "cifar10":
            raise ParamError("augment", f"found {config['augment']} with data {config['data']}, expected none "
                             "(crop_flip is CIFAR-10's augmentation: a mirrored character or garment changes class "
                             "or look)", cls.name)
        if not femnist_data and config["clients"] is None:
            raise ParamError("clients", f"found null with data {config['data']}, expected a number of clients",
                             cls.name)
        cls.network(config)  # a network that does not import, or that the clients cannot share, refused here

    @classmethod
    def code_hashes(cls, config: dict[str, Any]) -> dict[str, str]:
        """The sha256 of a researcher's network's code (`load_network`: a file with the modules it imports from its
        folder, or a module's package)."""
        return network_code_hashes(config["model"])

    @classmethod
    def carried_code(cls, config: dict[str, Any]) -> tuple[Source, ...]:
        """A researcher's network: a file (its text and the modules it imports from its folder) or a module."""
        return network_sources(config["model"])

    @classmethod
    def run_bytes(cls, config: dict[str, Any]) -> int | None:
        """The stored pixels (uint8) of Fashion-MNIST's and CIFAR-10's kept images (FEMNIST: not estimated)."""
        if config["data"] not in POOLS:
            return None
        train, test = (pool if size is None else min(size, pool)
                       for pool, size in zip(POOLS[config["data"]], (config["train_size"], config["test_size"])))
        return (train + test) * math.prod(SHAPES[config["data"]])

    @classmethod
    def state_bytes(cls, config: dict[str, Any], kept: int, clients_per_round: int, batch_size: int) -> int | None:
        """float32 values: the network's d parameters `kept` times per client, LOCAL_COPIES times per sampled client
        and SERVER_COPIES times for the server, and ACTIVATION_COPIES times its activations for each sampled
        client's batch."""
        dim, activations = network_sizes(config["model"], config["data"], config["dropout"],
                                         cls.code_hashes(config).get("model"))
        vectors = kept * (cls.declared_clients(config) or 0) + LOCAL_COPIES * clients_per_round + SERVER_COPIES
        return 4 * (dim * vectors + ACTIVATION_COPIES * clients_per_round * batch_size * activations)

    @classmethod
    def network(cls, config: dict[str, Any]) -> ModuleModel:
        """The config's network on flat vectors; ParamError (field `model`) where it cannot be built, does not run on
        the data's images, or keeps buffers its forward pass updates (`fedbench.networks.check_module`)."""
        shape = SHAPES[config["data"]]
        network = ModuleModel(model_factory(config["model"], shape, CLASSES[config["data"]], config["dropout"]))
        check_module(network.module, torch.zeros(2, *shape))  # BatchNorm refused, with the alternative
        return network

    @classmethod
    def metrics(cls, config: dict[str, Any]) -> tuple[Metric, ...]:
        test = (Metric("test_loss", "test cross-entropy", "min"),
                Metric("test_accuracy", "test accuracy (fraction correct)", "max"))
        if not config["train_metrics"]:
            return test
        return (Metric("train_loss", "training cross-entropy", "min"),
                Metric("train_accuracy", "training accuracy (fraction correct)", "max"), *test)

    @classmethod
    def declared_layout(cls, config: dict[str, Any], read_data: bool = False) -> Layout:
        if config["data"] == "femnist":
            if not read_data:
                return Layout(config["clients"])
            index = cls.read_index(config, femnist.load_index, "sample10", config["path"])
            writers = len(femnist.select_clients(index, femnist.LABELS, 1, 0).writer_ids)
            return Layout(writers if config["clients"] is None else min(writers, config["clients"]))
        if read_data:  # the split drawn on the labels alone, as building draws it: what it refuses, refused here
            read = idx.train_labels if config["data"] == "fashion_mnist" else lambda f: cifar10.load_labels(f)[0]
            labels = cls.read_index(config, lambda: read(cls.folder(config)))
            cls.split(config, labels, config["data_seed"] if config["data_seed"] is not None else 0)
        elif config["train_size"] is not None and config["train_size"] < config["clients"]:
            raise ParamError("clients", f"found {config['clients']}, more than the {config['train_size']} training "
                             "images", cls.name)
        return Layout(config["clients"])

    @classmethod
    def partition(cls, config: dict[str, Any]) -> Partition:
        """The config's split of the pool (`fedbench.data.partitions`), its parameters checked."""
        try:
            return Partition(config["partition"], config["clients"], config["alpha"], config["classes_per_client"],
                             config["shards_per_client"], config["min_size"])
        except ParamError as err:  # a field of this problem's
            raise ParamError(err.name if err.name in config else "partition", err.message, cls.name) from None

    @classmethod
    def split(cls, config: dict[str, Any], labels: np.ndarray, data_seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(the kept training rows of the pool `labels` in client order, each client's size [N]): `train_size` rows
        drawn by the data seed, split by the config's partition on its own stream."""
        rng = np.random.default_rng(int(torch.randint(2**62, (1,), generator=generator(data_seed, "data"))))
        kept = rng.permutation(len(labels))[: config["train_size"]]
        try:
            parts = cls.partition(config).split(torch.from_numpy(labels[kept]), generator(data_seed, "partition"))
        except ParamError as err:
            raise ParamError(err.name, err.message, cls.name) from None
        return kept[torch.cat(parts).numpy()], np.array([len(part) for part in parts], dtype=np.int64)

    @staticmethod
    def folder(config: dict[str, Any]) -> Path:
        """The folder of Fashion-MNIST's or CIFAR-10's files: `path`, relative ones under the data root."""
        default = DEFAULT_FOLDERS[config["data"]]
        chosen = Path(config["path"] or default).expanduser()
        return chosen if chosen.is_absolute() else femnist.data_root(None, default) / chosen

    def __init__(self, config: dict[str, Any], seed: int, device="cpu"):
        super().__init__(config, seed, device)
        data = config["data"]
        self.shape, self.classes = SHAPES[data], CLASSES[data]
        self.row_elements = math.prod(self.shape)  # type: ignore[misc]  # a ClassVar elsewhere: pixels of an image
        x_train, y_train, sizes, x_test, y_test, (self.pixel_mean, self.pixel_std) = self._read(config)
        self.x_train = x_train.view(-1, *self.shape).to(self.device)
        self.x_test = x_test.view(-1, *self.shape).to(self.device)
        self.y_train, self.y_test = y_train.to(self.device), y_test.to(self.device)
        self.augment = config["augment"] != "none"
        self._set_clients(sizes)
        self.client_weights = self.client_sizes / self.client_sizes.sum().double()
        self.regularizer = NoRegularizer()
        self.model = self.network(config).to(self.device)
        self.dim = self.model.dim
        # each client's dropout seed per step (minibatch_noise), where the configured network has dropout
        # and each training image's crop and flip (`augment`)
        self.noisy_minibatches = self.model.has_dropout or self.augment  # type: ignore[misc]  # a ClassVar elsewhere
        self.layout_name = (choose_layout(config["model"], self.dim, self.device.type) if config["layout"] == "auto"
                            else config["layout"])

    def _read(self, config: dict[str, Any]) -> tuple[Any, ...]:
        """(training pixels [n, ...] uint8 in client order, labels, each client's size [N], test pixels, labels,
        (per-channel mean, std) of pixel/255 for `_features`): Fashion-MNIST's and CIFAR-10's by
        `fedbench.data.images` with its full training split's constants, FEMNIST's kept writers' own."""
        if config["data"] == "femnist":
            clients = femnist.select_clients(femnist.load("sample10", config["path"]), femnist.LABELS, 1, 0)
            assert clients.x_train is not None and clients.x_test is not None  # read with its pixels
            kept = len(clients.writer_ids) if config["clients"] is None else min(config["clients"],
                                                                                  len(clients.writer_ids))
            train_end, test_end = int(clients.train_sizes[:kept].sum()), int(clients.test_sizes[:kept].sum())
            ink = lambda x: (np.uint8(255) - x) if x.dtype == np.uint8 else (255 * (1 - x)).round().astype(np.uint8)  # noqa: E731
            x_train = ink(clients.x_train[:train_end])
            statistics = channel_statistics(x_train.reshape(len(x_train), self.shape[0], -1))
            return (torch.from_numpy(x_train), torch.from_numpy(clients.y_train[:train_end]),
                    torch.from_numpy(clients.train_sizes[:kept]), torch.from_numpy(ink(clients.x_test[:test_end])),
                    torch.from_numpy(clients.y_test[:test_end]), tuple(tuple(map(float, v)) for v in statistics))
        data = self.read_index(config, lambda: images.load(config["data"], self.folder(config)))
        x_test, y_test = data.x_test, data.y_test
        if config["test_size"] is not None:
            rng = np.random.default_rng(int(torch.randint(2**62, (1,), generator=generator(self.data_seed, "test"))))
            keep = torch.from_numpy(rng.permutation(len(y_test))[: config["test_size"]])
            x_test, y_test = x_test[keep], y_test[keep]
        rows, sizes = self.split(config, data.y_train.numpy(), self.data_seed)
        rows_t = torch.from_numpy(rows)
        return (data.x_train[rows_t], data.y_train[rows_t], torch.from_numpy(sizes), x_test, y_test,
                (data.mean, data.std))

    # -- what a run records --------------------------------------------------------------------
    def choices(self) -> dict[str, str]:
        """The layout this instance runs its clients in (module docstring), `auto`'s choice marked so."""
        return {"layout": self.layout_name + (" (auto)" if self.config["layout"] == "auto" else "")}

    # -- engine interface ----------------------------------------------------------------------
    def init_params(self, gen: torch.Generator) -> Tensor:
        return self.model.init(gen).to(self.device)

    def _features(self, pixels: Tensor) -> Tensor:
        return images.normalize(pixels, self.pixel_mean, self.pixel_std)

    def gather(self, rows: Tensor, crops: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(images [S, b, c, h, w], labels [S, b], row weights [S, b]: 1/b_valid, 0 for padding rows −1); with
        `crops` [S, b, 3] (`fedbench.data.images.crop_flip_draws`), each image cropped and flipped as drawn."""
        flat, weight = padded_rows(rows)
        pixels = self.x_train.index_select(0, flat).view(*rows.shape, *self.shape)
        if crops is not None:
            pixels = images.crop_flip(pixels, crops.view(*rows.shape, 3), CROP_PADDING)
        return self._features(pixels), self.y_train[flat].view(rows.shape), weight

    def minibatch_noise(self, rows: Tensor, gen: torch.Generator) -> Tensor | None:
        """Per row [n, k], in the rows' order: a dropout seed where the network has dropout (a client's masks in a
        step follow its first row's seed), then (dy, dx, flip) with `augment` (`images.crop_flip_draws`: the row's
        image cropped and flipped); None where there is neither."""
        parts = []
        if self.model.has_dropout:
            parts.append(torch.randint(2**62, (rows.numel(), 1), generator=gen))
        if self.augment:
            parts.append(images.crop_flip_draws((rows.numel(),), gen, CROP_PADDING))
        return torch.cat(parts, dim=1) if parts else None

    def step_oracle(self, rows: Tensor, noise: Tensor | None = None) -> Oracle:
        """An oracle on the gathered rows, its images cropped and flipped by their noise with `augment`, and with
        each client's dropout seed of the step (its first row's noise) as the batch's fourth part where the network
        has dropout: every call on the batch (a gradient, a Hessian-vector product) runs the same masks and images.
        Evaluation and full-data oracles see the images as stored."""
        if noise is None:
            return NetworkOracle(self, self.gather(rows))
        noise = noise.view(*rows.shape, -1)
        batch = self.gather(rows, noise[..., -3:] if self.augment else None)
        return NetworkOracle(self, (*batch, noise[..., 0].reshape(-1, rows.shape[-1])[:, 0])
                             if self.model.has_dropout else batch)

    def minibatch_loss(self, w: Tensor, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """Weighted mean cross-entropy of one client's batch (dropout off)."""
        return self.loss(w.unsqueeze(0), tuple(part.unsqueeze(0) for part in batch))[0]

    def loss(self, w: Tensor, batch: tuple[Tensor, ...]) -> Tensor:
        """Each client's weighted mean cross-entropy `[S]` at its point `w` `[S, d]`, in the chosen layout (with
        dropout where the batch carries the clients' seeds, `step_oracle`)."""
        x, y, weight = batch[:3]
        seeds = batch[3] if len(batch) > 3 else None
        if self.layout_name == "loop" and w.device.type == "cpu":  # clients one after another: skip those without a
            active = (weight > 0).any(-1)  # real row (past an epoch's last step); a GPU would sync to learn it
            if not bool(active.all()):
                kept = active.nonzero().squeeze(1)
                logits = self.model.forward(w, x, "loop", seeds, kept.tolist())
                part = self._weighted(logits, y[kept], weight[kept])
                return torch.zeros(len(w), dtype=part.dtype).index_put((kept,), part)
        return self._weighted(self.model.forward(w, x, self.layout_name, seeds), y, weight)

    def descend(self, w: Tensor, lr: Tensor | float, batch: tuple[Tensor, ...]) -> Tensor:
        """`w - lr * grad(w, batch)` (`NetworkOracle.descend`); in the `loop` layout on the CPU, the module's
        (`ModuleModel.descend`: no gradient gathered into `[S, d]`), run by the clients with a real row alone (as
        `loss` runs them)."""
        if self.layout_name != "loop" or w.device.type != "cpu" or w.requires_grad or transformed():
            return w - lr * self.grad(w, batch)
        x, y, weight = batch[:3]
        kept = (weight > 0).any(-1).nonzero().squeeze(1).tolist()
        return self.model.descend(w, lr, x, lambda logits, run: self._weighted(logits, y[run], weight[run]).sum(),
                                  batch[3] if len(batch) > 3 else None, kept)

    @staticmethod
    def _weighted(logits: Tensor, y: Tensor, weight: Tensor) -> Tensor:
        """Each client's weighted cross-entropy `[C]` of its logits `[C, b, classes]`."""
        losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(weight)
        return (weight * losses).sum(-1)

    # -- metrics -------------------------------------------------------------------------------
    def test_set(self) -> tuple[Tensor, Tensor]:
        """The pooled test images as the network takes them (standardised per channel) and their labels: what
        `test_accuracy` is measured on, e.g. by a module that an exported model's `parameters` were loaded into."""
        return self._features(self.x_test), self.y_test

    def evaluate_global(self, w: Tensor) -> dict[str, float]:
        metrics = {}
        if self.config["train_metrics"]:
            metrics["train_loss"], metrics["train_accuracy"] = self._scores(w, self.x_train, self.y_train)
        metrics["test_loss"], metrics["test_accuracy"] = self._scores(w, self.x_test, self.y_test)
        return metrics

    def _scores(self, w: Tensor, pixels: Tensor, labels: Tensor) -> tuple[float, float]:
        """(mean cross-entropy, accuracy) of the model `w` `[d]` over the images, in chunks, in eval mode; both NaN
        where an output is not finite (a diverged model: argmax would name a class anyway, the first NaN logit's,
        and report the share of that class as its accuracy)."""
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.long, device=self.device)
        finite = torch.ones((), dtype=torch.bool, device=self.device)
        for start in range(0, len(labels), EVAL_CHUNK):
            y = labels[start: start + EVAL_CHUNK]
            logits = self.model.evaluate(w, self._features(pixels[start: start + EVAL_CHUNK]))
            loss += F.cross_entropy(logits, y, reduction="sum").double()
            correct += (logits.argmax(-1) == y).sum()
            finite &= torch.isfinite(logits).all()
        if not bool(finite):
            return math.nan, math.nan
        return float(loss) / len(labels), int(correct) / len(labels)

    def parameters(self, w: Tensor) -> dict[str, Tensor]:
        """The model `[d]` by the module's parameter names and shapes (views of `w`), as its `state_dict` names
        them."""
        return self.model.unflatten(w)


class NetworkOracle(Oracle):
    """The `vision` problem's oracle of a step's minibatch: its gradient step takes the network's shorter path
    (`Vision.descend`)."""

    problem: Vision

    def descend(self, w: Tensor, lr: Tensor | float) -> Tensor:
        return self.problem.descend(w, lr, self.batch)
