"""Federated one-way partial-AUC maximization on imbalanced data (Guo, Jin, Luo, Yang, ICML 2023 "FeDXL",
§4 and App. C): the synthetic "SynthPAUC" benchmark, a binary task on real FEMNIST, or the paper's binary
imbalanced CIFAR-10 scored by a deep network.

Synthetic data (`data: synthetic`, our stand-in, not from the paper): d features; positives x ~ N(μ₊, I);
negatives a mixture of easy N(μ₋, I) and a fraction `hard_fraction` of hard negatives N(μ_h, 0.5² I) with
μ₊ = e₁, μ₋ = −e₁, μ_h = 0.8e₁ + 1.5e₂, so that the best full-AUC ranking differs from the best low-FPR one.
Train pos:neg = 1:5 (the paper's imbalance, §4) per client by default (`split: even`, as the authors' released
code cuts each class into N equal chunks) or positives spread by a Dirichlet(α) over clients (`split:
dirichlet`, the stress variant; every client keeps at least one positive). Test data: `test_size` clean
samples of the same mixture, 1:5.

Real data (`data: femnist`, the paper's imbalanced binary tasks (§4) built from `fedbench.data.femnist`, read
from `source`/`path`/`data_dir` as the `emnist` problem): the labels in `positive_classes` are positive, all
others negative. Clients: `clients: 0` makes one client per writer; `clients: N` deals the writers, in sorted-id order,
into N contiguous groups of ⌊W/N⌋ or ⌈W/N⌉ writers (writer j of W goes to client ⌊jN/W⌋). Then each
client's training positives are subsampled as LibAUC's ImbalancedDataGenerator does, to ⌊r/(1−r)·n₋⌋
of them beside its n₋ negatives (r = `positive_ratio`; pos/(pos+neg) ≈ r; a client with fewer positives
keeps all of them; null: no subsampling), which positives by uniform keys from the data seed. A client
left without a positive or without a negative training sample is dropped (the class-balanced draws need
both; `dropped_clients` counts them), and with it its writers' test samples; a ValueError naming the
parameter is raised when no client is left. Test and validation sets: the kept writers' test samples,
binarised the same way, not subsampled, `val_size` of them (at most half) drawn for validation. Features: the pixel
intensity v/255 (background ≈ 1) normalised as the released code's Normalize(0.5, 0.5), x = 2v/255 − 1 ∈ [−1, 1];
the pixels stay uint8 and are converted per gathered batch or scoring chunk (54 MB instead of 216 MB of float32 for the
10% sample).

CIFAR-10 (`data: cifar10`, the paper's Table 5 row, built by `pauc_data.cifar10_binary` from the batches present
in `path`, default cifar10/ under the data root): `val_size` training images held out for validation (the paper's
10,000 of 50,000), the rest binarised (`positive_classes` positive: LibAUC's 5–9 in the preset) and their positives
subsampled to pos:neg 1:5 (20,000 + 4,000 of all five batches, the paper's 24,000), each class cut into `clients`
equal chunks as the released code does; `train_size` keeps a random subset of the training pool first (short runs,
tests). Images stay uint8 and are standardised per channel per gathered batch (`fedbench.data.images.normalize`,
the full training split's constants); with `augment: crop_flip` each training image of a step is padded by 4,
cropped back at a random offset and mirrored with probability ½ before that (`images.crop_flip`, drawn per row
with the feature noise). The paper does not state its CIFAR augmentation; its code crops and flips ChestMNIST.

Heterogeneity (§4), every data source: client i of N adds fresh N(μ_i, 0.2²) noise, μ_i = −0.08 +
0.16·i/N (the paper's −0.08 + 0.01·i for N = 16), to every feature (pixel) of every training draw (after the
normalisation, as the released code), both scaled by `noise_scale`. Test data and the training metrics get
none.

Model: a score h = σ(s(w, x)) ∈ [0, 1] (the sigmoid output of the released code) with s linear (wᵀx + b)
or an MLP d → hidden → 1 (ReLU) on feature vectors; on CIFAR-10 images a deep network with one output
(`model`: a shipped network such as `niid_cnn_cifar` or `resnet18_gn`, the paper's ResNet-18 with GroupNorm in
place of BatchNorm, built for one class, or `file.py:Class`), run on flat parameter vectors by
`fedbench.module_model.ModuleModel` in the `layout` `auto` picks from the measured table (`vmap` or `loop`, the
same numbers to float32 rounding). A network with dropout is refused (no masks are drawn here), and so is one
with BatchNorm (`fedbench.networks.check_module`). Parameters are one flat vector, evaluated for all sampled
clients at once.

Minibatches are class-balanced, as in the authors' released code: each step draws b/2 positives and b/2
negatives of the client, uniformly with replacement. `grad` is the gradient of the binary cross-entropy
on them, so FedAvg on this problem is the paper's "Local SGD (CE)" baseline.

Metrics on the averaged model: `test_pauc_0.3`, `test_pauc_0.5`, `test_auc` (McClish-standardised, as
`roc_auc_score(max_fpr)`, `fedbench.metrics`), the same on the training data and on the validation set
(`val_*`, `val_size` clean samples, for model selection as the paper's), and `objective`, the
pooled X-risk over the training pairs: KL-OPAUC mean₊ λ log mean₋ exp(ℓ̃/λ), ℓ̃ = (m − (h₊ − h₋))₊², for
`task: pauc`; for `task: auc` (preset `guo2023_noisy_auc`, §4 and Table 3) the symmetric PSM loss
mean₊ mean₋ σ(h₋ − h₊) with a linear f, on training labels of which `flip_rate` of the positives and of
the negatives are flipped (test labels stay clean). The objective is exact over all n₊·n₋ pairs up to
OBJECTIVE_PAIRS = 2²² (the synthetic defaults have 2.0·10⁶); above that (FEMNIST: ~6·10⁸) it is taken
over a fixed subsample of the positives and of the negatives, both thinned by the same factor to at most
2²² pairs, drawn once from the data seed (`objective_pairs`), so that curves stay comparable (tens of ms).

Presets: `guo2023_synthetic` (the defaults), `guo2023_noisy_auc`, `guo2023_femnist` and `guo2023_cifar10` (see
`presets`).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedbench.data import cifar10, femnist, images
from fedbench.hparams import Param, ParamError
from fedbench.metrics import Metric, partial_auc
from fedbench.models import MLP
from fedbench.module_model import LAYOUTS, ModuleModel, choose_layout
from fedbench.networks import check_module, refused
from fedbench.oracle import RunAxisOracle
from fedbench.problems import pauc_data
from fedbench.problems.base import Layout, Problem
from fedbench.problems.vision import (
    AUGMENTATIONS,
    CROP_PADDING,
    model_factory,
    network_code_hashes,
    network_sources,
)
from fedbench.problems.xrisk_tasks import make_task
from fedbench.prox import NoRegularizer
from fedbench.rng import generator
from fedbench.sources import Source

OBJECTIVE_PAIRS = 2**22  # the pooled objective is exact up to this many (positive, negative) pairs
EVAL_CHUNK = 8192  # rows per scoring pass over stored pixels: a reused 26 MB float32 buffer
IMAGE_EVAL_CHUNK = 512  # images per scoring pass of a network (6 MB of float32 input; ~2x faster than 2048 here)
FEATURE_MODELS = ("linear", "mlp")  # the score models of feature vectors; any other `model` names a network


SPLIT_LABELS = {"train": "training", "val": "validation", "test": "test"}
SCORES = (("pauc_0.3", "pAUC, FPR ≤ 0.3 (McClish)"), ("pauc_0.5", "pAUC, FPR ≤ 0.5 (McClish)"), ("auc", "AUC"))


class PartialAUC(Problem):
    """Provides `pair_scores` (the FeDXL algorithms use these and nothing else of it): `pair_loss`,
    `outer_grad`, `scores_by_class`, `positive_counts`/`negative_counts`, and `PairOracle` minibatches."""
    name = "pauc"
    noisy_minibatches = True  # each client's feature noise, fresh at every draw
    oracles_take_runs = True  # `PairOracle`
    caps_batches = True  # class-balanced draws with replacement: any b works with any client size
    provides = frozenset({"hvp", "pair_scores"})
    params = (
        Param("preset", "choice", "guo2023_synthetic", "paper setting whose defaults to start from",
              choices=("guo2023_synthetic", "guo2023_noisy_auc", "guo2023_femnist", "guo2023_cifar10")),
        Param("data", "choice", "synthetic", "training and test data: synthetic (SynthPAUC, Gaussians), femnist "
              "(real handwriting) or cifar10 (images): positive_classes against the rest",
              choices=("synthetic", "femnist", "cifar10")),
        Param("clients", "int", 16, "number of clients N; femnist: the writers (in sorted-id order) dealt into N "
              "contiguous groups, 0 = one client per writer", low=0),
        Param("positives_per_client", "int", 40, "synthetic: positives per client (their total with split: "
              "dirichlet)", low=1),
        Param("negatives_per_client", "int", 200, "synthetic: negatives per client", low=1),
        Param("features", "int", 32, "synthetic: feature dimension d (at least 2; femnist has 784 pixels)", low=2),
        Param("hard_fraction", "float", 0.2, "synthetic: share of hard negatives near the positives", low=0, high=1),
        Param("split", "choice", "even", "synthetic: positives over clients: equal chunks or Dirichlet label skew",
              choices=("even", "dirichlet")),
        Param("dirichlet_alpha", "float", 0.3, "synthetic: concentration of the Dirichlet label skew", low=0,
              low_open=True),
        *(param for param in femnist.SOURCE_PARAMS if param.name != "path"),
        Param("path", "str", None, "file or folder of the data, relative ones under the data root (None: femnist/"
              "femnist_sample10.npz, femnist/femnist_full.npz, femnist/ for tff and leaf; cifar10: cifar10/)",
              nullable=True),
        Param("positive_classes", "ints", [0, 1, 2, 3, 4], "femnist, cifar10: the labels that are positive (femnist: "
              "0–9 digits, 10–35 A–Z, 36–61 a–z; cifar10: 0–9); all others are negative", low=0,
              high=femnist.LABELS - 1),
        Param("positive_ratio", "float", 1 / 6, "femnist, cifar10: training positives subsampled to pos/(pos+neg) ≈ "
              "this, keeping ⌊r/(1−r)·n₋⌋ (LibAUC; femnist per client); null: keep all", low=0, low_open=True,
              high=1, nullable=True),
        Param("train_size", "int", None, "cifar10: keep a random subset of this many training images before the "
              "validation hold-out (null: all present)", low=1, nullable=True),
        Param("noise_scale", "float", 1.0, "multiplier of the per-client feature noise N(μ_i, 0.2²)", low=0),
        Param("pooled", "bool", False, "all clients' data on one client (the centralized reference), each sample "
              "keeping its client's noise"),
        Param("model", "str", "linear", "score model: linear or mlp (one hidden layer) on feature vectors; for "
              "cifar10 a network with one output: cnn, a shipped network (fedbench list), file.py:Class or "
              "module:Class"),
        Param("hidden", "int", 64, "hidden units of the MLP", low=1),
        Param("layout", "choice", "auto", "a network's clients' forward passes: vmap, a loop inside the program, or "
              "auto (the measured table, fedbench.module_model)", choices=("auto", *LAYOUTS)),
        Param("augment", "choice", "none", "cifar10: crop_flip, each training image of a step padded by 4, cropped "
              "back at a random offset and mirrored with probability 1/2; none: as stored", choices=AUGMENTATIONS),
        Param("task", "choice", "pauc", "objective: pauc (KL-OPAUC, f = λ log) or auc (symmetric PSM loss, f linear)",
              choices=("pauc", "auc")),
        Param("flip_rate", "float", 0.0, "share of training positives and of negatives whose labels are flipped",
              low=0, high=0.5),
        Param("kl_lambda", "float", 1.0, "λ of the KL-OPAUC objective", low=0, low_open=True),
        Param("margin", "float", 1.0, "margin m of the squared hinge", low=0),
        Param("test_size", "int", 10000, "synthetic: clean test samples; cifar10: test images kept (of 10,000)",
              low=2),
        Param("val_size", "int", 2000, "clean validation samples for model selection (synthetic: drawn after the "
              "test set; femnist: taken from the kept writers' test samples, at most half of them; cifar10: "
              "training images held out, not subsampled)", low=0),
        Param("data_seed", "int", None, "seed of the data (None: the trial's seed)", low=0, nullable=True),
    )
    presets = {
        "guo2023_synthetic": {},
        "guo2023_noisy_auc": {"task": "auc", "flip_rate": 0.2},
        # Real images as the paper's imbalanced binary tasks (§4): digits 0–4 against all other digits
        # and letters (hard negatives such as O/o, I/l, Z/z, S), pos:neg 1:5 on each of 16 clients of 22–23
        # writers, the 784 → 64 → 1 MLP (50,305 parameters). A linear scorer tops out near test pAUC(0.3)
        # 0.65 (centralized logistic regression on clean data: 0.66). After 50 rounds (K = 32, b = 64) the
        # MLP reaches 0.78 with local_sgd_ce and 0.82 with fedxl2 (both η = 0.03), still rising. A single digit
        # against the rest is too easy (0.94, linear); digits against letters gives 0.70 (linear).
        "guo2023_femnist": {"data": "femnist", "positive_classes": [0, 1, 2, 3, 4], "positive_ratio": 1 / 6,
                            "clients": 16, "model": "mlp"},
        # The paper's CIFAR-10 row (§4, Table 5): LibAUC's classes 5–9 against 0–4, 10,000 training images held out
        # for validation, pos:neg 1:5 (24,000 images of all five batches), 16 clients, ResNet-18 (GroupNorm here:
        # the engine refuses BatchNorm's running statistics), crop and flip.
        "guo2023_cifar10": {"data": "cifar10", "positive_classes": [5, 6, 7, 8, 9], "positive_ratio": 1 / 6,
                            "clients": 16, "model": "resnet18_gn", "augment": "crop_flip", "val_size": 10000,
                            "test_size": 10000},
    }

    size_params = ("clients", "positives_per_client", "negatives_per_client", "features", "test_size", "val_size",
                   "hidden", "train_size")

    @classmethod
    def capabilities(cls, config):
        return super().capabilities(config) | ({"linear_outer"} if config["task"] == "auc" else set())

    @classmethod
    def run_bytes(cls, config):
        if config["data"] != "synthetic":  # FEMNIST's writers, as many as the file holds
            return None
        d = config["features"]
        rows = config["clients"] * (config["positives_per_client"] + config["negatives_per_client"])
        parameters = (d + 1) * config["hidden"] + config["hidden"] + 1 if config["model"] == "mlp" else d + 1
        # float32: the samples' features with the draws they are made from (two copies at the peak: a client's
        # blocks, then all of them at once), the clean test and validation samples, the model
        return 4 * (2 * rows * d + (config["test_size"] + config["val_size"]) * d + parameters)

    @classmethod
    def metrics(cls, config):
        splits = ("train", "test", "val") if config["val_size"] else ("train", "test")
        return (*(Metric(f"{split}_{name}", f"{SPLIT_LABELS[split]} {title}", "max")
                  for split in splits for name, title in SCORES),
                Metric("objective", "X-risk objective F(w) (pooled training pairs)", "min"))

    def __init__(self, config: dict[str, Any], seed: int, device="cpu"):
        super().__init__(config, seed, device)
        self.dtype = torch.float32
        data = pauc_data.build(config, generator(self.data_seed, "data"))
        self.pixel_scale = data.pixel_scale  # femnist: stored pixels v become features v·pixel_scale − 1
        self.image_stats = data.image_stats  # cifar10: stored images, standardised by channel
        self.augment = config["augment"] != "none"
        if config["data"] == "femnist":
            self.writer_ids, self.writer_client, self.dropped_clients = (data.writer_ids, data.writer_client,
                                                                         data.dropped_clients)
        features, labels, positive_counts, sizes = data.features, data.labels, data.positive_counts, data.sizes
        (test_features, test_labels), val = data.test, data.val
        n_clients = len(sizes)
        source = torch.repeat_interleave(torch.arange(n_clients), sizes)
        self.positive_counts = positive_counts
        self.negative_counts = sizes - positive_counts
        if config["pooled"]:  # one machine with everything, each sample keeping its writer's noise (not in the paper)
            order = torch.argsort(-labels, stable=True)
            features, labels, source = features[order], labels[order], source[order]
            self.positive_counts = self.positive_counts.sum(0, keepdim=True)
            self.negative_counts = self.negative_counts.sum(0, keepdim=True)
        self.features, self.labels = features.to(self.device), labels.to(self.device)
        self.feature_dim = math.prod(features.shape[1:])  # an image's pixels, for its noise
        sizes = self.positive_counts + self.negative_counts
        self._set_clients(sizes)
        self.client_weights = torch.full((len(sizes),), 1.0 / len(sizes), device=self.device)  # eqs. (3), (8)
        self.row_client = torch.repeat_interleave(torch.arange(len(sizes)), sizes).to(self.device)
        self.row_source = source.to(self.device)  # whose feature noise a row gets
        scale = config["noise_scale"]
        # μ_i = −0.08 + 0.16·i/N, written as −0.08 + 0.01·(16i/N): for N = 16 exactly the paper's −0.08 + 0.01·i
        self.noise_mean = (scale * (-0.08 + 0.01 * (16 * torch.arange(n_clients, dtype=self.dtype) / n_clients))
                           ).to(self.device)
        self.noise_std = 0.2 * scale
        self.test_features, self.test_labels = test_features.to(self.device), test_labels.to(self.device)
        self.val_features, self.val_labels = (part.to(self.device) for part in val)
        self.objective_pairs = self._objective_subsample()
        self.task = make_task(config)
        self.model: MLP | ModuleModel
        if config["model"] in FEATURE_MODELS:
            hidden = (config["hidden"],) if config["model"] == "mlp" else ()
            self.model = MLP((self.feature_dim, *hidden, 1))
        else:
            self.model = self.network(config).to(self.device)
            self.layout_name = (choose_layout(config["model"], self.model.dim, self.device.type)
                                if config["layout"] == "auto" else config["layout"])
        self.dim = self.model.dim
        self.regularizer = NoRegularizer()

    @classmethod
    def check(cls, config):
        data, model = config["data"], config["model"]
        if data != "femnist" and config["clients"] == 0:
            raise ParamError("clients", f"found 0 (one client per writer), which needs data: femnist; expected at "
                             f"least 1 for data {data}", cls.name)
        if data == "cifar10" and model in FEATURE_MODELS:
            raise ParamError("model", f"found {model} with data cifar10, expected a network that scores images (cnn, "
                             "niid_cnn_cifar, resnet18_gn, ... or file.py:Class)", cls.name)
        if data != "cifar10" and model not in FEATURE_MODELS:
            raise ParamError("model", f"found {model} with data {data}, expected linear or mlp (a network scores "
                             "images: data cifar10)", cls.name)
        image_only = (("augment", config["augment"] != "none"), ("train_size", config["train_size"] is not None))
        for field, used in image_only:
            if used and data != "cifar10":
                raise ParamError(field, f"found {config[field]} with data {data}, expected "
                                 f"{'none' if field == 'augment' else 'null'} (it applies to data cifar10)", cls.name)
        classes = config["positive_classes"]
        repeated = sorted({c for c in classes if classes.count(c) > 1})
        if data != "synthetic" and repeated:
            raise ParamError("positive_classes", f"label {repeated[0]} is listed more than once in {classes}", cls.name)
        if data == "cifar10" and max(classes) >= cifar10.CLASSES:
            raise ParamError("positive_classes", f"found label {max(classes)} with data cifar10, expected labels "
                             f"0–{cifar10.CLASSES - 1}", cls.name)
        if model not in FEATURE_MODELS:
            cls.network(config)  # a network that does not import, has dropout or more than one output, refused here

    @classmethod
    def network(cls, config: dict[str, Any]) -> ModuleModel:
        """The config's network for CIFAR-10's images with one output (the score's logit), on flat vectors;
        ParamError (field `model`) where it cannot be built, keeps buffers its forward pass updates
        (`fedbench.networks.check_module`), has dropout (this problem draws no masks) or does not give one value per
        image."""
        network = ModuleModel(model_factory(config["model"], cifar10.SHAPE, 1, 0.0))
        example = torch.zeros(2, *cifar10.SHAPE)
        check_module(network.module, example)
        name = type(network.module).__name__
        if network.has_dropout:
            raise refused(f"{name} has dropout layers, for which problem pauc draws no masks; expected a network "
                          "without dropout")
        shape = list(network.evaluate(torch.zeros(network.dim), example).shape)
        if shape != [2, 1]:
            raise refused(f"{name} gives outputs of shape {shape} for 2 images, expected [2, 1] (one score per image)")
        return network

    @classmethod
    def code_hashes(cls, config: dict[str, Any]) -> dict[str, str]:
        """The sha256 of a researcher's network's code (`fedbench.problems.vision.network_code_hashes`)."""
        return {} if config["model"] in FEATURE_MODELS else network_code_hashes(config["model"])

    @classmethod
    def carried_code(cls, config: dict[str, Any]) -> tuple[Source, ...]:
        """A researcher's network file, which a run carries to the worker that runs it."""
        return () if config["model"] in FEATURE_MODELS else network_sources(config["model"])

    def choices(self) -> dict[str, str]:
        """A network's layout over the clients (`fedbench.module_model`), `auto`'s choice marked so."""
        if self.config["model"] in FEATURE_MODELS:
            return {}
        return {"layout": self.layout_name + (" (auto)" if self.config["layout"] == "auto" else "")}

    @classmethod
    def declared_layout(cls, config, read_data=False):
        if config["data"] == "cifar10" and read_data:  # the split drawn on the labels alone: its refusal, here
            labels = cls.read_index(config, lambda: cifar10.load_labels(pauc_data.cifar10_folder(config))[0])
            seed = config["data_seed"] if config["data_seed"] is not None else 0
            pauc_data.cifar10_split(config, labels, generator(seed, "data"))
        if config["data"] != "femnist" or not read_data:
            return Layout(cls.declared_clients(config))
        index = cls.read_index(config, femnist.load_index, config["source"], config["path"], config["data_dir"],
                               femnist.LABELS, config["writers_fraction"])
        kept = int(pauc_data.binary_clients(config, index).usable.sum())
        return Layout(1 if config["pooled"] else kept)

    @classmethod
    def declared_clients(cls, config: dict[str, Any]) -> int | None:
        if config["pooled"]:
            return 1
        return None if config["data"] == "femnist" else config["clients"]  # femnist may drop clients

    def _objective_subsample(self) -> tuple[Tensor, Tensor] | None:
        """None when n₊·n₋ ≤ OBJECTIVE_PAIRS (the objective is exact), else fixed indices into the training
        positives and negatives, both classes thinned by the same factor to ≤ OBJECTIVE_PAIRS pairs, drawn once
        from the data seed."""
        n_pos = int(self.labels.sum())
        n_neg = len(self.labels) - n_pos
        if n_pos * n_neg <= OBJECTIVE_PAIRS:
            return None
        factor = math.sqrt(OBJECTIVE_PAIRS / (n_pos * n_neg))
        gen = generator(self.data_seed, "objective-pairs")
        pos, neg = (torch.randperm(n, generator=gen)[: max(1, int(n * factor))].sort().values.to(self.device)
                    for n in (n_pos, n_neg))
        return pos, neg

    # -- the score model, for a batch of parameter vectors [S, dim] -----------------------------
    def logits(self, w: Tensor, x: Tensor) -> Tensor:
        """s(w, x) for w [S, dim] and x [S, b, d] (images: [S, b, C, H, W]): [S, b] (or one client's [dim], [b, d]:
        [b]; any leading axes, e.g. runs', w's broadcast against x's). A network runs the points as one batch of
        clients in its layout."""
        if isinstance(self.model, MLP):
            return self.model(w, x).squeeze(-1)
        lead, samples = x.shape[:-4], x.shape[-4]  # images [..., b, C, H, W]
        out = self.model.forward(w.expand(*lead, self.dim).reshape(-1, self.dim), x.reshape(-1, *x.shape[-4:]),
                                 self.layout_name)
        return out.view(*lead, samples)

    def scores(self, w: Tensor, x: Tensor) -> Tensor:
        return torch.sigmoid(self.logits(w, x))

    def all_scores(self, w: Tensor, stored: Tensor) -> Tensor:
        """h(w, x) [n] of every stored row, for one parameter vector w [dim]. Images: standardised and scored by
        the network in eval mode, IMAGE_EVAL_CHUNK at a time. Stored pixels v become the features 2v/white − 1
        (Normalize(0.5, 0.5) of the authors' released code) chunk by chunk, in one reused float buffer (converting
        all at once costs ~3x: fresh memory)."""
        if isinstance(self.model, ModuleModel):  # images, standardised chunk by chunk, the network in eval mode
            chunks = (stored[start: start + IMAGE_EVAL_CHUNK] for start in range(0, len(stored), IMAGE_EVAL_CHUNK))
            return torch.cat([torch.sigmoid(self.model.evaluate(w, self._standardised(chunk)).squeeze(-1))
                              for chunk in chunks])
        if self.pixel_scale is None:
            return self.scores(w.unsqueeze(0), stored.unsqueeze(0))[0]
        buffer = torch.empty(min(EVAL_CHUNK, len(stored)), self.feature_dim, dtype=self.dtype, device=self.device)
        scores = []
        for start in range(0, len(stored), EVAL_CHUNK):
            pixels = stored[start: start + EVAL_CHUNK]
            x = buffer[: len(pixels)].copy_(pixels).mul_(self.pixel_scale).sub_(1.0)
            scores.append(self.scores(w.unsqueeze(0), x.unsqueeze(0))[0])
        return torch.cat(scores)

    # -- engine interface ----------------------------------------------------------------------
    def init_params(self, gen: torch.Generator) -> Tensor:
        """The initial point."""
        if self.config["model"] == "linear":
            return torch.zeros(self.dim, dtype=self.dtype, device=self.device)
        if isinstance(self.model, ModuleModel):  # the network's own initialisation
            return self.model.init(gen).to(self.device)
        return self.model.init(gen, self.dtype).to(self.device)  # PyTorch's default uniform(±1/√fan_in)

    def draw_minibatches(self, clients: Tensor, steps: int, batch_size: int, gen: torch.Generator) -> Tensor:
        """Rows `[steps, S, b]`: b//2 positives then b − b//2 negatives of each client, with replacement."""
        positives = batch_size // 2
        shape = (steps, len(clients))
        pos_keys = torch.rand(*shape, positives, generator=gen)
        neg_keys = torch.rand(*shape, batch_size - positives, generator=gen)
        offsets = self.client_offsets_cpu[clients][:, None]
        n_pos = self.positive_counts[clients][:, None]
        n_neg = self.negative_counts[clients][:, None]
        rows = torch.cat([offsets + (pos_keys * n_pos).long(), offsets + n_pos + (neg_keys * n_neg).long()], dim=-1)
        return rows.to(self.device)

    def minibatch_noise(self, rows: Tensor, gen: torch.Generator) -> Tensor:
        """ε ~ N(0, I) of every row's features `[S·b, features]`, fresh at every draw (as in the released
        code; Guo et al., §4); with `augment`, each row's crop and flip (dy, dx, flip) after them, drawn after all
        the rows' ε (`fedbench.data.images.crop_flip_draws`), as three more (whole) numbers of the row."""
        noise = torch.randn(rows.numel(), self.feature_dim, generator=gen, dtype=self.dtype)
        if self.augment:
            noise = torch.cat([noise, images.crop_flip_draws((rows.numel(),), gen, CROP_PADDING).to(self.dtype)], 1)
        return noise.to(self.device)

    def gather(self, rows: Tensor, noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Features with each client's noise μ_i + 0.2·scale·ε (Guo et al., §4; ε from `minibatch_noise`, None:
        ε = 0, the client's mean shift only), and labels."""
        flat = rows.reshape(-1)  # rows `[S, b]`, or `[R, S, b]` (`oracles_take_runs`)
        if noise is None:
            noise = torch.zeros(len(flat), self.feature_dim, dtype=self.dtype, device=self.device)
        if self.image_stats is not None:  # images: cropped and flipped (`augment`), standardised, then the noise
            pixels = self.features.index_select(0, flat)
            if noise.shape[1] > self.feature_dim:
                pixels = images.crop_flip(pixels, noise[:, self.feature_dim:].long(), CROP_PADDING)
            mean = self.noise_mean[self.row_source[flat]].view(-1, 1, 1, 1)
            noisy = self._standardised(pixels).add_(mean).add_(noise[:, : self.feature_dim].view_as(pixels)
                                                              .mul(self.noise_std))
            return noisy.view(*rows.shape, *pixels.shape[1:]), self.labels[flat].view(rows.shape)
        mean = self.noise_mean[self.row_source[flat]].unsqueeze(-1)
        if self.pixel_scale is None:  # (x + μ_i) + σ·ε in that order, in place on fresh tensors: 2.5x the expression
            noisy = self.features.index_select(0, flat).add_(mean).add_(noise.mul_(self.noise_std))
        else:  # pixels v: 2v/white − 1 + μ_i + σ·ε, in place on the noise (half the time of the expression)
            noisy = noise.mul_(self.noise_std).add_(mean - 1.0).add_(self.features[flat], alpha=self.pixel_scale)
        return noisy.view(*rows.shape, -1), self.labels[flat].view(rows.shape)

    def _standardised(self, pixels: Tensor) -> Tensor:
        """Stored images as the network takes them: (v/255 − mean)/std by channel (a fresh float tensor)."""
        assert self.image_stats is not None
        return images.normalize(pixels, *self.image_stats, dtype=self.dtype)

    def minibatch_loss(self, w: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        """Mean binary cross-entropy of σ(s(w, x)) on one client's class-balanced batch."""
        x, y = batch
        return F.binary_cross_entropy_with_logits(self.logits(w, x), y)

    def loss(self, w: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return F.binary_cross_entropy_with_logits(self.logits(w, x), y, reduction="none").mean(-1)

    def grad(self, w: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        """Gradient of the mean binary cross-entropy, for every sampled client at once (one backward pass
        over the sum of the clients' losses: ~2x faster here than torch.func's vmap of grad)."""
        w = w.detach().requires_grad_(True)
        return torch.autograd.grad(self.loss(w, batch).sum(), w)[0]

    def step_oracle(self, rows: Tensor, noise: Tensor | None = None) -> PairOracle:
        return PairOracle(self, rows, noise)

    # -- the X-risk (Guo et al., eq. (8)): F(w) = mean₊ f(mean₋ ℓ(h₊, h₋)), from the task (`xrisk_tasks`) ---------
    def pair_loss(self, a: Tensor, b: Tensor) -> Tensor:
        """ℓ(a, b) for positive scores a and negative scores b (broadcast)."""
        return self.task.pair_loss(a, b)

    def outer_grad(self, u: Tensor) -> Tensor:
        """∇f(u) of the task's outer function."""
        return self.task.outer_grad(u)

    def scores_by_class(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """Scores under w of every training positive and of every negative (by the training labels)."""
        h = self.all_scores(w, self.features)
        return h[self.labels == 1], h[self.labels == 0]

    def pooled_objective(self, w: Tensor) -> float:
        """The task's X-risk over all training pairs with the (possibly flipped) training labels; over the
        fixed subsample `objective_pairs` when there are more than OBJECTIVE_PAIRS pairs."""
        return self._objective(*self.scores_by_class(w))

    def _objective(self, positives: Tensor, negatives: Tensor) -> float:
        if self.objective_pairs is not None:
            positives, negatives = positives[self.objective_pairs[0]], negatives[self.objective_pairs[1]]
        return self.task.objective(positives, negatives)

    def evaluate_global(self, w: Tensor) -> dict[str, float]:
        metrics = {}
        splits = [("train", self.features, self.labels), ("test", self.test_features, self.test_labels)]
        if len(self.val_labels):
            splits.append(("val", self.val_features, self.val_labels))
        scores = {split: self.all_scores(w, x) for split, x, _ in splits}  # the training scores serve twice
        for split, _, y in splits:
            h, labels = scores[split].double().cpu().numpy(), y.cpu().numpy()
            for beta in (0.3, 0.5):
                metrics[f"{split}_pauc_{beta}"] = partial_auc(labels, h, beta)
            metrics[f"{split}_auc"] = partial_auc(labels, h)
        metrics["objective"] = self._objective(scores["train"][self.labels == 1], scores["train"][self.labels == 0])
        return metrics


class PairOracle(RunAxisOracle):
    """One local step of the sampled clients: b₁ positives then b₂ negatives each (rows `[S, b]`, or `[R, S, b]`
    of R runs, every tensor below then with the leading run axis). Its loss, gradient and HVP are the
    cross-entropy's (what FedAvg uses); X-risk algorithms call `surrogate_grad` with a loss of the positive and
    negative scores and get its gradient for every client at once, and read `positive_index` (each positive's
    place among its client's positives, for per-positive u tables)."""

    def __init__(self, problem: PartialAUC, rows: Tensor, noise: Tensor | None = None):
        super().__init__(problem, problem.gather(rows, noise))
        self.clients = rows.shape[:-1]
        self.positives = rows.shape[-1] // 2
        self.negatives = rows.shape[-1] - self.positives
        owners = problem.row_client[rows[..., : self.positives]]
        # each positive's place among its client's positives
        self.positive_index = rows[..., : self.positives] - problem.client_offsets[owners]

    def surrogate_grad(self, w: Tensor, surrogate) -> tuple[Tensor, Tensor]:
        """(∇_w Σ_clients surrogate(h₊ [S,b₁], h₋ [S,b₂]), the detached scores [S,b]); surrogate returns [S]."""
        w = self.each_client(w).detach().requires_grad_(True)
        h = self.problem.scores(w, self.batch[0])
        loss = surrogate(h[..., : self.positives], h[..., self.positives:]).sum()
        return torch.autograd.grad(loss, w)[0], h.detach()
