"""What problem `pauc` (`fedbench.problems.pauc`, where its data, model and metrics are described) declares
before it is built: its parameters and presets, the rules a config must meet, the clients it makes, the memory a
run holds, its capabilities and metrics, and the network a config names."""
from __future__ import annotations

from typing import Any

import torch

from fedbench.data import cifar10, femnist
from fedbench.hparams import Param, ParamError
from fedbench.metrics import Metric
from fedbench.networks import check_module, refused
from fedbench.networks.module_model import LAYOUTS, ModuleModel
from fedbench.problems import pauc_data
from fedbench.problems.spec import Layout, ProblemSpec
from fedbench.problems.vision import AUGMENTATIONS, model_factory, network_code_hashes, network_sources
from fedbench.rng import generator
from fedbench.sources import Source

FEATURE_MODELS = ("linear", "mlp")  # the score models of feature vectors; any other `model` names a network
SPLIT_LABELS = {"train": "training", "val": "validation", "test": "test"}
SCORES = (("pauc_0.3", "pAUC, FPR ≤ 0.3 (McClish)"), ("pauc_0.5", "pAUC, FPR ≤ 0.5 (McClish)"), ("auc", "AUC"))


class PartialAUCSpec(ProblemSpec):
    """The declarations of `fedbench.problems.pauc.PartialAUC`, read from its class and a config alone."""
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
              "auto (the measured table, fedbench.networks.module_model)", choices=("auto", *LAYOUTS)),
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
