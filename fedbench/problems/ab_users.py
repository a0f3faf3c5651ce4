"""Per-FedAvg's heterogeneous users (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020, §5 and Appendix I).

Users (§5; Table 2 of App. I): n = `users` (50), the first half of type A, a images of each of labels 0–4; the second
half of type B in five equal groups, group j holding a/2 images of label j and 2a of label j + 5 (`heterogeneity:
diff`, the paper's "diff. hetero.", drops the a/2). The test data follow the same pattern with `a_test` (a
smaller a, which the paper does not give: MNIST's test split cannot give a = 196 per user). Every label's images
are dealt in a random order (data seed) without replacement, so shards are disjoint: training shards first, then
test shards from the same pool for `digits` (the FEMNIST digits of every writer, pooled: the offline MNIST,
inverted to MNIST's polarity); from the official training and test splits for `cifar10` (`fedbench.data.cifar10`).
Pixels in [0, 1].

Model (§5): the MLP input → 80 → ELU → 60 → ELU → 10 (`fedbench.networks.mlp.MLP`, PyTorch's default initialisation,
float32), mean softmax cross-entropy of a user's minibatch.

Metrics of the global model w (§5): every user adapts it by one SGD step of size `adapt_step` (α) on a batch of
`adapt_batch` of its own training samples (`adapt_on: test`, the paper's literal protocol, uses its test samples),
w_i = w − α∇f̃_i(w; B_i), batched over all users; `adapted_accuracy` is the mean over users of w_i's accuracy on
user i's test data (Table 1's metric), `adapted_accuracy_weighted` the same pooled over test samples, `accuracy` the
mean per-user accuracy of w itself (before adaptation), `train_loss` the pooled training cross-entropy. The
adaptation batches come from the trial seed's "adaptation" stream, drawn afresh at every evaluation from the same
seed: they do not depend on the evaluation schedule.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedbench.data import cifar10, pfl_images
from fedbench.hparams import Param, ParamError
from fedbench.metrics import Metric
from fedbench.networks.mlp import MLP
from fedbench.problems.base import Layout
from fedbench.problems.classification import ImageClassification
from fedbench.prox import NoRegularizer
from fedbench.rng import generator, largest_keys

CLASSES, FIRST = 10, 5  # labels 0–4 are the "first five classes"
PAPER_A = {"digits": (196, 32), "cifar10": (68, 14)}  # (a, a_test): a of Fallah et al., §5; a_test our choice


def class_counts(users: int, a: int, heterogeneity: str) -> np.ndarray:
    """[users, 10] images per label: type A users a of each first-five label; type-B group j (of five) a/2 of label
    j (none with `diff`) and 2a of label j + 5."""
    if users % (2 * FIRST):
        raise ParamError("users", f"found {users}, expected a multiple of {2 * FIRST} (two types, five type-B groups)",
                         "ab_users")
    counts = np.zeros((users, CLASSES), dtype=np.int64)
    half = users // 2
    counts[:half, :FIRST] = a
    group = np.arange(users - half) // ((users - half) // FIRST)
    if heterogeneity == "base":
        counts[half + np.arange(users - half), group] = a // 2
    counts[half + np.arange(users - half), group + FIRST] = 2 * a
    return counts


def check_pool(labels: np.ndarray, counts: list[np.ndarray], field: str) -> None:
    """ParamError of `field` where the pool of `labels` holds fewer images of a label than the count tables
    `[users, 10]` deal out in all."""
    have = np.bincount(labels, minlength=CLASSES)
    need = sum(table.sum(0) for table in counts)
    short = np.flatnonzero(need > have)
    if len(short):
        label = int(short[0])
        raise ParamError(field, f"label {label}: the pool holds {have[label]} images, "
                                f"the partition needs {need[label]}", "ab_users")


def deal(labels: np.ndarray, counts: list[np.ndarray], rng: np.random.Generator) -> list[list[np.ndarray]]:
    """Rows of `labels` dealt without replacement: for every count table `[users, 10]` in turn, each user's rows
    (label by label, then shuffled), every label's rows taken in one random order. The pool must hold them all
    (`check_pool`)."""
    order = {label: rng.permutation(np.flatnonzero(labels == label)) for label in range(CLASSES)}
    taken = dict.fromkeys(order, 0)
    dealt = []
    for table in counts:
        per_user: list[list[np.ndarray]] = [[] for _ in table]
        for label in range(CLASSES):
            need = int(table[:, label].sum())
            pieces = np.split(order[label][taken[label]: taken[label] + need], np.cumsum(table[:, label])[:-1])
            taken[label] += need
            for user, piece in enumerate(pieces):
                per_user[user].append(piece)
        dealt.append([rng.permutation(np.concatenate(parts)) for parts in per_user])
    return dealt


class ABUsers(ImageClassification):
    name = "ab_users"
    provides = frozenset({"hvp", "full_data"})
    params = (
        Param("preset", "choice", "fallah2020_digits", "paper setting", choices=("fallah2020_digits",
                                                                                 "fallah2020_cifar10")),
        Param("dataset", "choice", "digits", "images: FEMNIST digits (the offline MNIST) or CIFAR-10",
              choices=("digits", "cifar10")),
        Param("path", "str", None, "the dataset's file or folder (None: its default under FEDBENCH_DATA)",
              nullable=True),
        Param("users", "int", 50, "users n (half type A, half type B in five groups)", low=10),
        Param("a", "int", None, "images per label a (None: the paper's 196 digits / 68 CIFAR-10)", low=2,
              nullable=True),
        Param("a_test", "int", None, "the test data's a (None: 32 digits / 14 CIFAR-10)", low=2, nullable=True),
        Param("heterogeneity", "choice", "base", "the partition, or `diff`: type B without its a/2 images",
              choices=("base", "diff")),
        Param("adapt_step", "float", 0.01, "the test-time step α of the adapted accuracy", low=0),
        Param("adapt_batch", "int", 40, "samples of the test-time adaptation batch", low=1),
        Param("adapt_on", "choice", "train", "the adaptation batch's samples: the user's training data, or its "
              "test data (the paper's literal protocol)", choices=("train", "test")),
        Param("input_scaling", "choice", "raw", "pixels in [0, 1] (raw, the paper's code), or standardized by the "
              "training split's mean and standard deviation (one scalar each, over every training pixel)",
              choices=("raw", "standardized")),
        Param("data_seed", "int", None, "seed of the partition (None: the trial's seed)", low=0, nullable=True),
    )
    presets = {"fallah2020_digits": {}, "fallah2020_cifar10": {"dataset": "cifar10", "adapt_step": 0.001}}

    @classmethod
    def declared_clients(cls, config):
        return config["users"]

    @classmethod
    def metrics(cls, config):
        return (Metric("adapted_accuracy", "test accuracy after one local step (mean over users)", "max"),
                Metric("adapted_accuracy_weighted", "test accuracy after one local step (pooled samples)", "max"),
                Metric("accuracy", "test accuracy before adaptation (mean over users)", "max"),
                Metric("train_loss", "training cross-entropy (pooled)", "min"))

    @classmethod
    def tables(cls, config) -> tuple[np.ndarray, np.ndarray]:
        """The users' images per label `[users, 10]` of the training and of the test data."""
        a, a_test = (config["a"] or PAPER_A[config["dataset"]][0]), (config["a_test"] or PAPER_A[config["dataset"]][1])
        return (class_counts(config["users"], a, config["heterogeneity"]),
                class_counts(config["users"], a_test, config["heterogeneity"]))

    @classmethod
    def declared_layout(cls, config, read_data=False):
        train, test = cls.tables(config)
        if read_data and config["dataset"] == "digits":  # one pool, training shards dealt first
            check_pool(cls.read_index(config, pfl_images.pool_labels, "digits", config["path"]), [train, test], "a")
        elif read_data:
            train_labels, test_labels = cls.read_index(config, cifar10.load_labels, config["path"])
            check_pool(train_labels, [train], "a")
            check_pool(test_labels, [test], "a_test")
        return Layout(config["users"], int(train.sum(1).min()))

    @classmethod
    def shared_by_seeds(cls, config):
        return False  # the evaluation's adaptation batches follow the trial seed

    def __init__(self, config: dict[str, Any], seed: int, device="cpu"):
        super().__init__(config, seed, device)
        self.declared_layout(config, read_data=True)  # refuses a partition the pools cannot give, by their labels
        train_counts, test_counts = self.tables(config)
        rng = np.random.default_rng(int(torch.randint(2**63 - 1, (1,), generator=generator(self.data_seed, "data"))))
        if config["dataset"] == "digits":
            x, y = pfl_images.load_pool("digits", config["path"])
            train, test = deal(y, [train_counts, test_counts], rng)
            pools = (x, y), (x, y)
        else:
            splits = cifar10.load(config["path"])
            (train,), (test,) = deal(splits.y_train, [train_counts], rng), deal(splits.y_test, [test_counts], rng)
            pools = (splits.x_train, splits.y_train), (splits.x_test, splits.y_test)
        (self.x_train, self.y_train), (self.x_test, self.y_test) = (
            self._rows(pool, shards) for pool, shards in zip(pools, (train, test)))
        if config["input_scaling"] == "standardized":  # the training split's statistics, for both splits
            mean, std = self.x_train.mean(), self.x_train.std()
            self.x_train, self.x_test = (self.x_train - mean) / std, (self.x_test - mean) / std
        self._set_clients(torch.tensor([len(rows) for rows in train]))
        self.test_sizes = torch.tensor([len(rows) for rows in test])
        users = torch.arange(self.num_clients)
        self.train_owner, self.test_owner = (torch.repeat_interleave(users, sizes).to(self.device)
                                             for sizes in (self.client_sizes_cpu, self.test_sizes))
        self.client_weights = torch.full((self.num_clients,), 1.0 / self.num_clients, device=self.device)
        self.model = MLP((self.x_train.shape[-1], 80, 60, CLASSES), activation="elu")
        self.dim = self.model.dim
        self.regularizer = NoRegularizer()

    def _rows(self, pool: tuple[np.ndarray, np.ndarray], shards: list[np.ndarray]) -> tuple[Tensor, Tensor]:
        """Features in [0, 1] (float32) and labels of the users' rows, user after user."""
        rows = np.concatenate(shards)
        x, y = pool
        return (torch.from_numpy(x[rows].astype(np.float32) / 255.0).to(self.device),
                torch.from_numpy(y[rows].astype(np.int64)).to(self.device))

    # -- metrics -------------------------------------------------------------------------------------------------
    def evaluate_global(self, w: Tensor) -> dict[str, float]:
        adapted = w - self.config["adapt_step"] * self.grad(w.expand(self.num_clients, -1), self._adaptation_batch())
        train_sums, _ = self._pooled(w, self.x_train, self.y_train, self.train_owner)
        before = self._user_accuracy(w.expand(self.num_clients, -1))
        after = self._user_accuracy(adapted)
        sizes = self.test_sizes.to(self.device, after.dtype)
        return {"adapted_accuracy": float(after.mean()),
                "adapted_accuracy_weighted": float((after * sizes).sum() / sizes.sum()),
                "accuracy": float(before.mean()), "train_loss": float(train_sums.sum()) / len(self.y_train)}

    def _adaptation_batch(self) -> tuple[Tensor, Tensor, Tensor]:
        """Each user's adaptation batch B_i (a uniform subset of its training or test rows), from the trial seed."""
        on_test = self.config["adapt_on"] == "test"
        sizes = (self.test_sizes if on_test else self.client_sizes_cpu)
        offsets = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)[:-1]])
        keys = torch.rand(self.num_clients, int(sizes.max()), generator=generator(self.seed, "adaptation"))
        keys.masked_fill_(torch.arange(keys.shape[1]) >= sizes[:, None], -1.0)
        width = min(self.config["adapt_batch"], int(sizes.min()))
        rows = (offsets[:, None] + largest_keys(keys, width, sorted=True)).to(self.device)
        x, y = (self.x_test, self.y_test) if on_test else (self.x_train, self.y_train)
        flat = rows.reshape(-1)
        weight = torch.full(rows.shape, 1.0 / width, device=self.device)
        return x.index_select(0, flat).view(*rows.shape, x.shape[-1]), y[flat].view(rows.shape), weight

    def _user_accuracy(self, models: Tensor) -> Tensor:
        """Each user's accuracy `[n]` of its model `models[i]` on its own test rows (padded and masked)."""
        sizes = self.test_sizes
        offsets = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)[:-1]])
        position = torch.arange(int(sizes.max()))
        valid = (position < sizes[:, None]).to(self.device)
        rows = (offsets[:, None] + position).clamp_max(len(self.y_test) - 1).to(self.device)
        logits = self.model(models, self.x_test[rows])
        correct = (logits.argmax(-1) == self.y_test[rows]) & valid
        return correct.sum(-1) / valid.sum(-1)
