"""The data of the `pauc` problem (Guo et al., ICML 2023, §4): binary training data per client, a clean test set
and a validation set, from the synthetic SynthPAUC mixture, from real FEMNIST writers or from CIFAR-10's images (the
paper's binary imbalanced CIFAR-10, Table 5). Each builder reads the
problem's resolved config and draws from the data stream; `fedbench.problems.pauc` describes the parameters.
A new data source is one more function returning `BinaryData`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedbench.data import cifar10, femnist, images
from fedbench.hparams import ParamError


@dataclass
class BinaryData:
    """Training rows grouped by client, each client's positives first; test and validation sets."""
    features: Tensor  # [n, d] float32, or stored uint8 pixels: `pixel_scale`, or images [n, C, H, W]: `image_stats`
    labels: Tensor  # [n] float32 training labels (possibly flipped), 1 = positive
    positive_counts: Tensor  # [N] positives per client
    sizes: Tensor  # [N] samples per client
    test: tuple[Tensor, Tensor]  # (features, labels), clean
    val: tuple[Tensor, Tensor]  # (features, labels), clean, possibly empty
    pixel_scale: float | None = None  # stored pixels v become the features v·pixel_scale − 1 ∈ [−1, 1]
    writer_ids: np.ndarray | None = None  # femnist: the kept writers in sorted-id order
    writer_client: Tensor | None = None  # femnist: each kept writer's client
    dropped_clients: int = 0  # femnist: clients dropped for lacking a class
    image_stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # cifar10: per-channel (mean, std) of v/255
    source: str = ""  # cifar10: the files read (`fedbench.data.images.ImageTensors.source`)


def build(config: dict[str, Any], gen: torch.Generator) -> BinaryData:
    if config["data"] == "femnist":
        return femnist_binary(config, gen)
    if config["data"] == "cifar10":
        return cifar10_binary(config, gen)
    return synthetic(config, gen)


def cifar10_folder(config: dict[str, Any]) -> Path:
    """The folder of CIFAR-10's batches: `path` (default cifar10/), relative ones under `data_dir` or the data root."""
    chosen = Path(config["path"] or cifar10.DEFAULT_FOLDER).expanduser()
    return chosen if chosen.is_absolute() else femnist.data_root(config["data_dir"], chosen) / chosen


def synthetic(config: dict[str, Any], gen: torch.Generator) -> BinaryData:
    """SynthPAUC (the `pauc` problem's Gaussian mixture, not from the paper), each client's rows positives first."""
    n_clients = config["clients"]
    positives = positive_counts(config, gen)
    negatives = torch.full((n_clients,), config["negatives_per_client"], dtype=torch.long)
    blocks, labels, noisy_positives = [], [], []
    for k in range(n_clients):  # data generation only, once; the simulation never loops over clients
        x = torch.cat([draw(config, 1, int(positives[k]), gen), draw(config, 0, int(negatives[k]), gen)])
        y = torch.cat([torch.ones(int(positives[k])), torch.zeros(int(negatives[k]))])
        y = flip(config, y, gen)
        order = torch.argsort(-y, stable=True)  # (noisy) positives first: S1 is what the labels say
        blocks.append(x[order])
        labels.append(y[order])
        noisy_positives.append(int(y.sum()))
    test_features, test_labels = clean_sample(config, config["test_size"], gen)
    val = clean_sample(config, config["val_size"], gen)  # drawn after the test set: train and test stay as they were
    return BinaryData(torch.cat(blocks), torch.cat(labels), torch.tensor(noisy_positives), positives + negatives,
                      (test_features, test_labels), val)


def clean_sample(config: dict[str, Any], size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """`size` noise-free samples of the mixture, positives:negatives 1:5 (features, labels)."""
    positives = size // 6
    features = torch.cat([draw(config, 1, positives, gen), draw(config, 0, size - positives, gen)])
    return features, torch.cat([torch.ones(positives), torch.zeros(size - positives)])


@dataclass
class BinaryClients:
    """How `femnist_binary` makes clients of the writers with training samples (`writers`), from their labels alone:
    each writer's and each training sample's client, which samples are positive, per client its training positives,
    negatives, positives kept and whether it is kept (it holds both classes), and which test samples are kept (their
    writer's client is)."""
    writers: femnist.Clients
    writer_client: np.ndarray  # [W]
    client: np.ndarray  # [n] of every training sample
    positive: np.ndarray  # [n] bool
    positives: np.ndarray  # [N]
    negatives: np.ndarray  # [N]
    kept_positives: np.ndarray  # [N]
    usable: np.ndarray  # [N] bool
    test: np.ndarray  # [n_test] bool


def binary_clients(config: dict[str, Any], images: femnist.WriterImages) -> BinaryClients:
    """The clients of the writers of `images` (their labels are all it reads: the index will do); ParamError naming
    the parameter where the data cannot give them: more clients than writers, no client with both classes, a test
    set of one class."""
    classes = config["positive_classes"]
    data = femnist.select_clients(images, femnist.LABELS, min_train=1, min_test=0)  # writers with training data
    writers = len(data.writer_ids)
    n_clients = config["clients"] or writers
    if n_clients > writers:
        raise ParamError("clients", f"found {n_clients}, expected at most the data's {writers} writers with training "
                         "samples (or 0: one client per writer)", "pauc")
    rank = np.empty(writers, dtype=np.int64)  # writer → its place in sorted-id order
    rank[np.argsort(data.writer_ids, kind="stable")] = np.arange(writers)
    writer_client = rank * n_clients // writers  # contiguous groups of ⌊W/N⌋ or ⌈W/N⌉ writers
    client = np.repeat(writer_client, data.train_sizes)
    positive = np.isin(data.y_train, classes)
    n_pos = np.bincount(client[positive], minlength=n_clients)
    n_neg = np.bincount(client[~positive], minlength=n_clients)
    kept_pos = np.minimum(n_pos, positive_quota(config, n_neg))
    usable = (kept_pos > 0) & (n_neg > 0)  # the class-balanced draws need both classes on every client
    if not usable.any():
        raise ParamError("positive_classes", f"no client keeps both a positive and a negative training sample "
                         f"(positive_classes {classes}, positive_ratio {config['positive_ratio']}, clients "
                         f"{config['clients']})", "pauc")
    test = usable[writer_client][np.repeat(np.arange(writers), data.test_sizes)]
    test_labels = np.isin(data.y_test[test], classes)
    if test_labels.all() or not test_labels.any():
        raise ParamError("positive_classes", f"the kept writers' {int(test.sum())} test samples hold "
                         f"{'no negative' if test_labels.any() else 'no positive'} (positive_classes {classes})",
                         "pauc")
    return BinaryClients(data, writer_client, client, positive, n_pos, n_neg, kept_pos, usable, test)


def femnist_binary(config: dict[str, Any], gen: torch.Generator) -> BinaryData:
    """FEMNIST writers as a binary task (see the module docstring), with the stored pixels as features (uint8
    where the source is; a quarter of float32): `pixel_scale` says how they become [−1, 1]."""
    made = binary_clients(config, femnist.load(config["source"], config["path"], config["data_dir"], femnist.LABELS,
                                               config["writers_fraction"]))
    data = made.writers
    assert data.x_train is not None and data.x_test is not None  # loaded with its pixels
    writer_client, client, positive, n_pos, kept_pos, usable = (made.writer_client, made.client, made.positive,
                                                                made.positives, made.kept_positives, made.usable)
    by_id = np.argsort(data.writer_ids, kind="stable")
    # Which positives stay: each client's first kept_pos in the order of uniform keys from the data stream.
    keys = torch.rand(len(positive), generator=gen, dtype=torch.float64).numpy()
    rows = np.flatnonzero(positive)
    rows = rows[np.lexsort((keys[rows], client[rows]))]
    place = np.arange(len(rows)) - np.r_[0, np.cumsum(n_pos)][client[rows]]
    keep = ~positive
    keep[rows[place < kept_pos[client[rows]]]] = True
    keep &= usable[client]
    rows = np.flatnonzero(keep)
    rows = rows[np.lexsort((~positive[rows], client[rows]))]  # by client, positives first, then stored order
    renumber = np.cumsum(usable) - 1
    by_id = by_id[usable[writer_client[by_id]]]
    features = torch.from_numpy(data.x_train[rows])
    labels = torch.from_numpy(positive[rows]).to(torch.float32)
    positive_counts = torch.from_numpy(kept_pos[usable])
    sizes = torch.from_numpy((kept_pos + made.negatives)[usable])
    if config["flip_rate"]:
        features, labels, positive_counts = flip_clients(config, features, labels, sizes, gen)
    held_out = (torch.from_numpy(data.x_test[made.test]),
                torch.from_numpy(np.isin(data.y_test[made.test], config["positive_classes"])).to(torch.float32))
    # Validation: `val_size` of the held-out samples, picked by uniform keys from the data stream.
    order = torch.randperm(len(held_out[1]), generator=gen)
    size = min(config["val_size"], len(order) // 2)
    test_rows, val_rows = order[size:], order[:size]
    return BinaryData(features, labels, positive_counts, sizes, (held_out[0][test_rows], held_out[1][test_rows]),
                      (held_out[0][val_rows], held_out[1][val_rows]), pixel_scale=2.0 / femnist.white(data.x_train),
                      writer_ids=data.writer_ids[by_id],  # the kept writers in sorted-id order, and their clients
                      writer_client=torch.from_numpy(renumber[writer_client[by_id]]),
                      dropped_clients=int((~usable).sum()))


def cifar10_binary(config: dict[str, Any], gen: torch.Generator) -> BinaryData:
    """CIFAR-10 as the paper's binary imbalanced task (`cifar10_split`), the test set `test_size` images of the test
    batch (by uniform keys from the data stream after the split's; all for 10,000), binarised. Pixels stay uint8
    `[n, 3, 32, 32]`; `image_stats` are the full training split's per-channel constants (`fedbench.data.images`)."""
    data = images.load("cifar10", cifar10_folder(config))
    split = cifar10_split(config, data.y_train.numpy(), gen)
    rows = torch.from_numpy(split.rows)
    features, positive_counts = data.x_train[rows], split.positives
    labels = torch.from_numpy(split.positive[split.rows]).to(torch.float32)
    if config["flip_rate"]:
        features, labels, positive_counts = flip_clients(config, features, labels, split.sizes, gen)
    test_rows = torch.randperm(len(data.y_test), generator=gen)[: config["test_size"]].sort().values
    held = torch.from_numpy(split.held)

    def binary(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return x, torch.from_numpy(np.isin(y.numpy(), config["positive_classes"])).to(torch.float32)

    return BinaryData(features, labels, positive_counts, split.sizes, binary(data.x_test[test_rows],
                                                                             data.y_test[test_rows]),
                      binary(data.x_train[held], data.y_train[held]),
                      image_stats=(data.mean, data.std), source=data.source)


@dataclass
class BinarySplit:
    """Which training images `cifar10_split` keeps for which client: `rows` by client, each client's positives first;
    `positive` [n_pool] whether each image of the pool is positive; per client its positives and size; `held` the
    validation rows (sorted)."""
    rows: np.ndarray
    positive: np.ndarray
    positives: Tensor
    sizes: Tensor
    held: np.ndarray


def cifar10_split(config: dict[str, Any], labels: np.ndarray, gen: torch.Generator) -> BinarySplit:
    """The paper's binary imbalanced CIFAR-10 (§4 and Table 5, as LibAUC's ImbalancedDataGenerator builds it), from
    the training labels alone: of the images present (`train_size` of them, drawn by uniform keys from the data
    stream; null: all), `val_size` are held out for validation (the paper's 20%: 10,000 of 50,000), binarised and
    not subsampled; the rest are binarised (`positive_classes` positive) and their positives subsampled to
    ⌊r/(1−r)·n₋⌋ beside the n₋ negatives (r = `positive_ratio`: of all five batches' 40,000, 20,000 + 4,000, the
    paper's 24,000), both classes in the order of the same keys; then each class is cut into `clients` contiguous
    chunks (sizes ⌊n/N⌋ or ⌈n/N⌉), client k holding chunk k of each (the authors' released code). ParamError where a
    client would lack a class."""
    order = torch.randperm(len(labels), generator=gen).numpy()[: config["train_size"]]
    held, pool = order[: config["val_size"]], order[config["val_size"]:]
    positive = np.isin(labels, config["positive_classes"])
    negatives = pool[~positive[pool]]
    positives = pool[positive[pool]][: int(positive_quota(config, np.array([len(negatives)]))[0])]
    n_clients = config["clients"]
    if min(len(positives), len(negatives)) < n_clients:
        raise ParamError("clients", f"found {n_clients}, more than the {len(positives)} training positives or "
                         f"{len(negatives)} negatives left of {len(order)} images after validation "
                         f"({config['val_size']}) and subsampling; expected every client to hold both classes", "pauc")
    parts = list(zip(np.array_split(positives, n_clients), np.array_split(negatives, n_clients)))
    return BinarySplit(np.concatenate([np.concatenate(part) for part in parts]), positive,
                       torch.tensor([len(p) for p, _ in parts]), torch.tensor([len(p) + len(n) for p, n in parts]),
                       np.sort(held))


def positive_quota(config: dict[str, Any], negatives: np.ndarray) -> np.ndarray:
    """LibAUC's ImbalancedDataGenerator count ⌊r/(1−r)·n₋⌋ of positives kept beside n₋ negatives (no
    limit for r = 1 or null); the 1e-9 guards against r/(1−r) rounding just below an integer product."""
    ratio = config["positive_ratio"]
    if ratio is None or ratio >= 1:
        return np.full_like(negatives, np.iinfo(np.int64).max)
    return np.floor(ratio / (1 - ratio) * negatives + 1e-9).astype(np.int64)


def flip_clients(config: dict[str, Any], features: Tensor, labels: Tensor, sizes: Tensor,
                 gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """`_flip` within every client, each client's rows re-sorted (noisy) positives first: (features,
    labels, positives per client)."""
    orders, flipped, counts, start = [], [], [], 0
    for size in sizes.tolist():  # data preparation only, once
        y = flip(config, labels[start: start + size], gen)
        order = torch.argsort(-y, stable=True)
        orders.append(start + order)
        flipped.append(y[order])
        counts.append(int(y.sum()))
        start += size
    return features[torch.cat(orders)], torch.cat(flipped), torch.tensor(counts)


def positive_counts(config: dict[str, Any], gen: torch.Generator) -> Tensor:
    n_clients, per_client = config["clients"], config["positives_per_client"]
    if config["split"] == "even":
        return torch.full((n_clients,), per_client, dtype=torch.long)
    seed = int(torch.randint(2**31 - 1, (1,), generator=gen))  # numpy draws the Dirichlet, seeded from the stream
    shares = torch.from_numpy(np.random.default_rng(seed).dirichlet([config["dirichlet_alpha"]] * n_clients))
    return torch.floor(shares * (n_clients * per_client - n_clients)).long() + 1


def flip(config: dict[str, Any], y: Tensor, gen: torch.Generator) -> Tensor:
    """Flip round(rate·n) random positives and as many of the negatives (Guo et al., §4: 20% of each)."""
    rate = config["flip_rate"]
    if not rate:
        return y
    flipped = y.clone()
    for label in (1.0, 0.0):
        members = torch.nonzero(y == label).squeeze(1)
        chosen = members[torch.randperm(len(members), generator=gen)[: round(rate * len(members))]]
        flipped[chosen] = 1.0 - label
    return flipped


def draw(config: dict[str, Any], label: int, count: int, gen: torch.Generator) -> Tensor:
    d = config["features"]
    x = torch.randn(count, d, generator=gen)
    if label == 1:
        x[:, 0] += 1.0
        return x
    hard = torch.rand(count, generator=gen) < config["hard_fraction"]
    x[~hard, 0] -= 1.0
    x[hard] *= 0.5
    x[hard, 0] += 0.8
    x[hard, 1] += 1.5
    return x
