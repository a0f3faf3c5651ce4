"""Federated multinomial ℓ1-logistic regression on FEMNIST writers (Bao et al., ICML 2022, §4 and App. F).

Clients are NIST writers, read by `fedbench.data.femnist` (the shipped npz files, TFF HDF5 or LEAF JSON)
and filtered as the released `process_femnist.py`: labels < C, then writers with at least `min_train`
train and `min_test` test samples. The shipped 10% writer sample gives EMNIST-10: 358 writers, 36,639
train / 4,082 test samples; EMNIST-62: 360 writers, 72,493 / 8,051 (the paper's own LEAF sample had
367 / 379 writers, §4).

Model (§4 and the authors' released code): W ∈ R^{784×C} stored row-major as the leading 784·C coordinates
(then, with `bias`, C unpenalized bias entries, as Yuan et al.'s code; Bao et al.'s code has none), logits Wᵀx
(+ bias), loss = mean softmax cross-entropy, h = λ‖W‖₁, W0 = 0, π_k = n_k / N. Features: stored value/255
(`raw`: background ≈ 1, no normalization, as Bao et al.'s code) or 1 − value/255 (`inverted`: ink = 1).

Minibatches are capped at n_k (as in Bao et al.'s code): a client with fewer than b train samples uses all of
them; the missing picks are row −1 and get zero weight in the gradient.

Preset `bao2022`: the defaults, §4 and App. F (the federation gives S = 36, b = 25, E = 40 for C = 10 or
10 for C = 62, and `aggregation: samples` for π̂_k ∝ n_k).

Metrics (§4, Figs. 3–4; as the released `eval_metric_emnist.m`) of the global model, pooled over all clients'
samples: train/test loss (mean CE, no penalty), train/test accuracy (argmax of Wᵀx), objective = train loss +
λ‖W‖₁ (the pooled mean is Σ π_k L_k for π_k ∝ n_k), sparsity (fraction of exact zeros in W) and nonzeros.
Personal models (one per writer) get the four loss/accuracy metrics with each writer's samples scored by its own model,
pooled over all samples.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedbench.data import femnist
from fedbench.hparams import Param, ParamError
from fedbench.metrics import Metric
from fedbench.networks.mlp import MLP, own_data_scores
from fedbench.problems.base import Layout, Problem, padded_rows
from fedbench.prox import L1

EVAL_CHUNK = 8192  # samples per evaluation matmul: ~26 MB of float32 features, whatever the data size


LOSS_AND_ACCURACY = (Metric("train_loss", "training cross-entropy", "min"),
                     Metric("test_loss", "test cross-entropy", "min"),
                     Metric("train_accuracy", "training accuracy (fraction correct)", "max"),
                     Metric("test_accuracy", "test accuracy (fraction correct)", "max"))


class EMNIST(Problem):
    name = "emnist"
    caps_batches = True
    provides = frozenset({"hvp", "full_data", "personal_evaluation", "norm_ball"})
    row_elements = femnist.PIXELS
    params = (
        Param("preset", "choice", "bao2022", "paper setting whose defaults to start from", choices=("bao2022",)),
        Param("classes", "choice", 10, "C: 10 (digits, EMNIST-10) or 62 (digits and letters, EMNIST-62)",
              choices=(10, 62)),
        *femnist.SOURCE_PARAMS,
        Param("min_train", "int", 10, "drop writers with fewer train samples after the label filter", low=1),
        Param("min_test", "int", 1, "drop writers with fewer test samples after the label filter", low=0),
        Param("pixels", "choice", "raw", "features: raw = value/255 (background ≈ 1, the paper's code) or "
              "inverted = 1 − value/255 (ink = 1)", choices=("raw", "inverted")),
        Param("bias", "bool", False, "add an unpenalized per-class bias after the weights (Yuan et al.'s code)"),
        Param("lam", "float", 1e-4, "ℓ1 weight λ of h = λ‖W‖₁", low=0, log=True),
    )
    presets = {"bao2022": {}}

    @classmethod
    def metrics(cls, config):
        return (*LOSS_AND_ACCURACY, Metric("objective", "objective F(w) = f(w) + h(w)", "min"),
                Metric("sparsity", "fraction of zero weights"), Metric("nonzeros", "number of non-zero weights"))

    @classmethod
    def personal_metrics(cls, config):
        return LOSS_AND_ACCURACY

    @classmethod
    def declared_layout(cls, config, read_data=False):
        if not read_data:
            return Layout(None)
        index = cls.read_index(config, femnist.load_index, config["source"], config["path"], config["data_dir"],
                               config["classes"], config["writers_fraction"])
        return Layout(len(cls.select(config, index).writer_ids))

    @staticmethod
    def select(config: dict[str, Any], images: femnist.WriterImages) -> femnist.Clients:
        """The writers that are clients (`femnist.select_clients`), of the images or of their index alone."""
        clients = femnist.select_clients(images, config["classes"], config["min_train"], config["min_test"])
        if not len(clients.writer_ids):
            raise ParamError("min_train", f"no writer has {config['min_train']}+ train and {config['min_test']}+ test "
                             f"samples with labels below {config['classes']}", "emnist")
        if not clients.test_sizes.sum():
            raise ParamError("min_test", "the kept writers have no test sample (min_test = 0); the test metrics "
                             "need one", "emnist")
        return clients

    def __init__(self, config: dict[str, Any], seed: int, device="cpu"):
        super().__init__(config, seed, device)
        self.classes = config["classes"]
        clients = self.select(config, femnist.load(config["source"], config["path"], config["data_dir"],
                                                   self.classes, config["writers_fraction"]))
        assert clients.x_train is not None and clients.x_test is not None  # loaded with its pixels
        self.writer_ids = clients.writer_ids
        self.feature_dim = femnist.PIXELS * self.classes
        self.model = MLP((femnist.PIXELS, self.classes), bias=config["bias"])
        self.dim = self.model.dim
        self.dtype = torch.float32
        # Pixels stay uint8 (a quarter of float32) and become features per gathered batch or chunk.
        self.scale = 1.0 / femnist.white(clients.x_train)
        self.x_train, self.x_test = (self._stored(x) for x in (clients.x_train, clients.x_test))
        self.y_train, self.y_test = (torch.from_numpy(y).to(self.device) for y in (clients.y_train, clients.y_test))
        self._set_clients(torch.from_numpy(clients.train_sizes))
        self.test_sizes = torch.from_numpy(clients.test_sizes).to(self.device)
        self.client_weights = self.client_sizes / self.client_sizes.sum().double()
        self.regularizer = L1(config["lam"], self.feature_dim)

    def _stored(self, x: np.ndarray) -> Tensor:
        if self.config["pixels"] == "inverted":
            x = x.dtype.type(femnist.white(x)) - x  # in the stored dtype: 255 − v stays uint8
        return torch.from_numpy(x).to(self.device)

    def _features(self, pixels: Tensor) -> Tensor:
        # A float copy scaled in place: ~10x faster than the type-promoting `pixels * scale` (measured).
        return pixels.to(torch.float32, copy=True).mul_(self.scale)

    # -- engine interface ----------------------------------------------------------------------
    def init_params(self, gen: torch.Generator) -> Tensor:
        return torch.zeros(self.dim, dtype=self.dtype, device=self.device)

    def gather(self, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(features [S, b, 784], labels [S, b], row weights [S, b]: 1/b_valid, 0 for padding)."""
        flat, weight = padded_rows(rows)  # every client has n_k >= min_train >= 1
        x = self._features(self.x_train.index_select(0, flat)).view(*rows.shape, femnist.PIXELS)
        return x, self.y_train[flat].view(rows.shape), weight

    def minibatch_loss(self, w: Tensor, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """Weighted mean cross-entropy of one client's batch (padding rows weigh 0)."""
        x, y, weight = batch
        return (weight * F.cross_entropy(self.model(w, x), y, reduction="none")).sum()

    def grad(self, w: Tensor, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        x, y, weight = batch
        s = w.shape[0]
        logits = self.model(w, x)
        # d(weighted mean CE)/d logits = weight · (softmax − onehot): padded picks drop out here.
        residual = torch.softmax(logits, dim=-1).mul_(weight.unsqueeze(-1))
        residual.scatter_add_(-1, y.unsqueeze(-1), -weight.unsqueeze(-1))
        grad_w = torch.bmm(x.transpose(1, 2), residual).view(s, self.feature_dim)
        if self.dim == self.feature_dim:
            return grad_w
        return torch.cat([grad_w, residual.sum(1)], dim=1)

    def evaluate_global(self, w: Tensor) -> dict[str, float]:
        """Metrics of the global model `w` (see the module docstring)."""
        train_loss, train_accuracy = self._pooled(w, self.x_train, self.y_train)
        test_loss, test_accuracy = self._pooled(w, self.x_test, self.y_test)
        zeros = int((w[: self.feature_dim] == 0).sum())
        return {
            "train_loss": train_loss,
            "test_loss": test_loss,
            "train_accuracy": train_accuracy,
            "test_accuracy": test_accuracy,
            "objective": train_loss + float(self.regularizer.value(w.double())),
            "sparsity": zeros / self.feature_dim,
            "nonzeros": float(self.feature_dim - zeros),
        }

    def evaluate_personal(self, models: Tensor) -> dict[str, float]:
        train_loss, train_accuracy = self._per_client(models, self.x_train, self.y_train, self.client_sizes_cpu)
        test_loss, test_accuracy = self._per_client(models, self.x_test, self.y_test, self.test_sizes.cpu())
        return {"train_loss": train_loss, "test_loss": test_loss, "train_accuracy": train_accuracy,
                "test_accuracy": test_accuracy}

    def _pooled(self, w: Tensor, pixels: Tensor, labels: Tensor) -> tuple[float, float]:
        """(mean CE, accuracy) of `w` over all rows, in chunks so that the full data fit in memory."""
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.long, device=self.device)
        for start in range(0, len(labels), EVAL_CHUNK):
            y = labels[start: start + EVAL_CHUNK]
            logits = self.model(w, self._features(pixels[start: start + EVAL_CHUNK]))
            loss += (logits.logsumexp(-1) - logits.gather(1, y[:, None]).squeeze(1)).sum(dtype=torch.float64)
            correct += (logits.argmax(-1) == y).sum()
        return float(loss) / len(labels), int(correct) / len(labels)

    def _per_client(self, models: Tensor, pixels: Tensor, labels: Tensor, sizes: Tensor) -> tuple[float, float]:
        """(mean cross-entropy, accuracy) over every client's rows, each scored by the client's own model."""
        return own_data_scores(self.model, models, lambda rows: self._features(pixels[rows]), labels, sizes, EVAL_CHUNK)
