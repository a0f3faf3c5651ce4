"""Federated one-way partial-AUC maximization on imbalanced data (Guo, Jin, Luo, Yang, ICML 2023 "FeDXL";
spec 001 §1.4, §3.1–3.2, §5.2): the synthetic "SynthPAUC" benchmark, or a binary task on real FEMNIST.

Synthetic data (`data: synthetic`, spec 001 §5.2): d features; positives x ~ N(μ₊, I); negatives a mixture
of easy N(μ₋, I) and a fraction `hard_fraction` of hard negatives N(μ_h, 0.5² I) with μ₊ = e₁, μ₋ = −e₁,
μ_h = 0.8e₁ + 1.5e₂, so that the best full-AUC ranking differs from the best low-FPR one. Train pos:neg =
1:5 per client by default (`split: even`, as the paper's code cuts each class into N equal chunks, §3.2)
or positives spread by a Dirichlet(α) over clients (`split: dirichlet`, the stress variant; every client
keeps at least one positive). Test data: `test_size` clean samples of the same mixture, 1:5.

Real data (`data: femnist`, spec 001 §3.1 applied to `fedbench.data.femnist`, read from `source`/`path`/
`data_dir` as the `emnist` problem): the labels in `positive_classes` are positive, all others negative.
Clients: `clients: 0` makes one client per writer; `clients: N` deals the writers, in sorted-id order,
into N contiguous groups of ⌊W/N⌋ or ⌈W/N⌉ writers (writer j of W goes to client ⌊jN/W⌋). Then each
client's training positives are subsampled as LibAUC's ImbalancedDataGenerator does, to ⌊r/(1−r)·n₋⌋
of them beside its n₋ negatives (r = `positive_ratio`; pos/(pos+neg) ≈ r; a client with fewer positives
keeps all of them; null: no subsampling), which positives by uniform keys from the data seed. A client
left without a positive or without a negative training sample is dropped (the class-balanced draws need
both; `dropped_clients` counts them), and with it its writers' test samples; a ValueError naming the
parameter is raised when no client is left. Test and validation sets: the kept writers' test samples,
binarised the same way, not subsampled, `val_size` of them (at most half) drawn for validation. Features: the pixel intensity v/255 (background ≈ 1) normalised as the
paper's Normalize(0.5, 0.5), x = 2v/255 − 1 ∈ [−1, 1]; the pixels stay uint8 and are converted per
gathered batch or scoring chunk (54 MB instead of 216 MB of float32 for the 10% sample).

Heterogeneity (§3.2), both data sources: client i of N adds fresh N(μ_i, 0.2²) noise, μ_i = −0.08 +
0.16·i/N (the paper's −0.08 + 0.01·i for N = 16), to every feature of every training draw (after the
normalisation, as the paper), both scaled by `noise_scale`. Test data and the training metrics get none.

Model: a score h = σ(s(w, x)) ∈ [0, 1] (spec 001 §1.4, sigmoid output) with s linear (wᵀx + b) or an MLP
d → hidden → 1 (ReLU); parameters are one flat vector, evaluated for all sampled clients at once.

Minibatches are class-balanced, as the paper's code (§2.4): each step draws b/2 positives and b/2
negatives of the client, uniformly with replacement. `grad` is the gradient of the binary cross-entropy
on them, so FedAvg on this problem is the paper's "Local SGD (CE)" baseline.

Metrics on the averaged model: `test_pauc_0.3`, `test_pauc_0.5`, `test_auc` (McClish-standardised, as
`roc_auc_score(max_fpr)`, `fedbench.metrics`), the same on the training data and on the validation set
(`val_*`, `val_size` clean samples, for model selection as the paper's), and `objective`, the
pooled X-risk over the training pairs: KL-OPAUC mean₊ λ log mean₋ exp(ℓ̃/λ), ℓ̃ = (m − (h₊ − h₋))₊², for
`task: pauc`; for `task: auc` (preset `guo2023_noisy_auc`, spec 001 §1.5) the symmetric PSM loss
mean₊ mean₋ σ(h₋ − h₊) with a linear f, on training labels of which `flip_rate` of the positives and of
the negatives are flipped (test labels stay clean). The objective is exact over all n₊·n₋ pairs up to
OBJECTIVE_PAIRS = 2²² (the synthetic defaults have 2.0·10⁶); above that (FEMNIST: ~6·10⁸) it is taken
over a fixed subsample of the positives and of the negatives, both thinned by the same factor to at most
2²² pairs, drawn once from the data seed (`objective_pairs`), so that curves stay comparable (tens of ms).

Presets: `guo2023_synthetic` (the defaults), `guo2023_noisy_auc`, and `guo2023_femnist` (see `presets`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedbench.data import femnist
from fedbench.hparams import Param
from fedbench.metrics import partial_auc
from fedbench.problems.base import Problem
from fedbench.prox import NoRegularizer
from fedbench.rng import generator

OBJECTIVE_PAIRS = 2**22  # the pooled objective is exact up to this many (positive, negative) pairs
PAIR_CHUNK = 2**18  # pairs per pass of the objective: 1 MB temporaries (~4x faster than one pass over all)
EVAL_CHUNK = 8192  # rows per scoring pass over stored pixels: a reused 26 MB float32 buffer


class PartialAUC(Problem):
    name = "pauc"
    caps_batches = True  # class-balanced draws with replacement: any b works with any client size
    params = (
        Param("preset", "choice", "guo2023_synthetic", "paper setting whose defaults to start from",
              choices=("guo2023_synthetic", "guo2023_noisy_auc", "guo2023_femnist")),
        Param("data", "choice", "synthetic", "training and test data: synthetic (SynthPAUC, spec 001 §5.2) or "
              "femnist (real handwriting: positive_classes against the rest)", choices=("synthetic", "femnist")),
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
        *femnist.SOURCE_PARAMS,
        Param("positive_classes", "ints", [0, 1, 2, 3, 4], "femnist: the labels that are positive (0–9 digits, "
              "10–35 A–Z, 36–61 a–z); all others are negative", low=0, high=femnist.LABELS - 1),
        Param("positive_ratio", "float", 1 / 6, "femnist: each client's training positives subsampled to "
              "pos/(pos+neg) ≈ this, keeping ⌊r/(1−r)·n₋⌋ (LibAUC); null: keep all", low=0, low_open=True, high=1,
              nullable=True),
        Param("noise_scale", "float", 1.0, "multiplier of the per-client feature noise N(μ_i, 0.2²)", low=0),
        Param("pooled", "bool", False, "all clients' data on one client (the centralized reference), each sample "
              "keeping its client's noise"),
        Param("model", "choice", "linear", "score model: linear or a one-hidden-layer MLP", choices=("linear", "mlp")),
        Param("hidden", "int", 64, "hidden units of the MLP", low=1),
        Param("task", "choice", "pauc", "objective: pauc (KL-OPAUC, f = λ log) or auc (symmetric PSM loss, f linear)",
              choices=("pauc", "auc")),
        Param("flip_rate", "float", 0.0, "share of training positives and of negatives whose labels are flipped",
              low=0, high=0.5),
        Param("kl_lambda", "float", 1.0, "λ of the KL-OPAUC objective", low=0, low_open=True),
        Param("margin", "float", 1.0, "margin m of the squared hinge", low=0),
        Param("test_size", "int", 10000, "synthetic: clean test samples", low=2),
        Param("val_size", "int", 2000, "clean validation samples for model selection (synthetic: drawn after the "
              "test set; femnist: taken from the kept writers' test samples, at most half of them)", low=0),
        Param("data_seed", "int", None, "seed of the data (None: the trial's seed)", low=0, nullable=True),
    )
    presets = {
        "guo2023_synthetic": {},
        "guo2023_noisy_auc": {"task": "auc", "flip_rate": 0.2},
        # Real images as the paper's imbalanced binary tasks (§3.1–3.2): digits 0–4 against all other digits
        # and letters (hard negatives such as O/o, I/l, Z/z, S), pos:neg 1:5 on each of 16 clients of 22–23
        # writers, the 784 → 64 → 1 MLP (50,305 parameters). A linear scorer tops out near test pAUC(0.3)
        # 0.65 (centralized logistic regression on clean data: 0.66). After 50 rounds (K = 32, b = 64) the
        # MLP reaches 0.78 with local_sgd_ce and 0.82 with fedxl2 (both η = 0.03), still rising. A single digit
        # against the rest is too easy (0.94, linear); digits against letters gives 0.70 (linear).
        "guo2023_femnist": {"data": "femnist", "positive_classes": [0, 1, 2, 3, 4], "positive_ratio": 1 / 6,
                            "clients": 16, "model": "mlp"},
    }

    def __init__(self, config: dict[str, Any], seed: int, device="cpu"):
        super().__init__(config, seed, device)
        self.dtype = torch.float32
        self.pixel_scale = None  # femnist: stored pixels v become features v·pixel_scale − 1 ∈ [−1, 1]
        gen = generator(self.data_seed, "data")
        if config["data"] == "femnist":
            features, labels, positive_counts, sizes, test_features, test_labels, val = self._femnist(gen)
        elif config["clients"] == 0:
            raise ValueError("pauc.clients: 0 (one client per writer) needs data: femnist; synthetic data need "
                             "clients >= 1")
        else:
            features, labels, positive_counts, sizes, test_features, test_labels, val = self._synthetic(gen)
        n_clients = len(sizes)
        source = torch.repeat_interleave(torch.arange(n_clients), sizes)
        self.positive_counts = positive_counts
        self.negative_counts = sizes - positive_counts
        if config["pooled"]:  # one machine with everything, each sample keeping its writer's noise (§3.2)
            order = torch.argsort(-labels, stable=True)
            features, labels, source = features[order], labels[order], source[order]
            self.positive_counts = self.positive_counts.sum(0, keepdim=True)
            self.negative_counts = self.negative_counts.sum(0, keepdim=True)
        self.features, self.labels = features.to(self.device), labels.to(self.device)
        self.feature_dim = features.shape[1]
        sizes = self.positive_counts + self.negative_counts
        self._set_clients(sizes)
        self.client_weights = torch.full((len(sizes),), 1.0 / len(sizes), device=self.device)  # spec 001 §1.2
        self.row_client = torch.repeat_interleave(torch.arange(len(sizes)), sizes).to(self.device)
        self.row_source = source.to(self.device)  # whose feature noise a row gets
        scale = config["noise_scale"]
        # μ_i = −0.08 + 0.16·i/N, written as −0.08 + 0.01·(16i/N): for N = 16 exactly the paper's −0.08 + 0.01·i
        self.noise_mean = (scale * (-0.08 + 0.01 * (16 * torch.arange(n_clients, dtype=self.dtype) / n_clients))
                           ).to(self.device)
        self.noise_std = 0.2 * scale
        self.restart_noise()
        self.test_features, self.test_labels = test_features.to(self.device), test_labels.to(self.device)
        self.val_features, self.val_labels = (part.to(self.device) for part in val)
        self.objective_pairs = self._objective_subsample()
        self.hidden = config["hidden"] if config["model"] == "mlp" else 0
        d = self.feature_dim
        self.dim = d + 1 if not self.hidden else d * self.hidden + 2 * self.hidden + 1
        self.regularizer = NoRegularizer()

    @classmethod
    def declared_clients(cls, config: dict[str, Any]) -> int | None:
        if config["pooled"]:
            return 1
        return config["clients"] if config["data"] == "synthetic" else None  # femnist may drop clients

    def _synthetic(self, gen) -> tuple[Tensor, ...]:
        """SynthPAUC (spec 001 §5.2): (features, labels, positives per client, sizes, test features, test labels,
        (validation features, labels)), each client's rows positives first."""
        config = self.config
        n_clients = config["clients"]
        positives = self._positive_counts(gen)
        negatives = torch.full((n_clients,), config["negatives_per_client"], dtype=torch.long)
        blocks, labels, noisy_positives = [], [], []
        for k in range(n_clients):  # data generation only, once; the simulation never loops over clients
            x = torch.cat([self._draw(1, int(positives[k]), gen), self._draw(0, int(negatives[k]), gen)])
            y = torch.cat([torch.ones(int(positives[k])), torch.zeros(int(negatives[k]))])
            y = self._flip(y, gen)
            order = torch.argsort(-y, stable=True)  # (noisy) positives first: S1 is what the labels say
            blocks.append(x[order])
            labels.append(y[order])
            noisy_positives.append(int(y.sum()))
        test_features, test_labels = self._clean_sample(config["test_size"], gen)
        val = self._clean_sample(config["val_size"], gen)  # drawn after the test set: train and test stay as they were
        return (torch.cat(blocks), torch.cat(labels), torch.tensor(noisy_positives), positives + negatives,
                test_features, test_labels, val)

    def _clean_sample(self, size: int, gen) -> tuple[Tensor, Tensor]:
        """`size` noise-free samples of the mixture, positives:negatives 1:5 (features, labels)."""
        positives = size // 6
        features = torch.cat([self._draw(1, positives, gen), self._draw(0, size - positives, gen)])
        return features, torch.cat([torch.ones(positives), torch.zeros(size - positives)])

    def _femnist(self, gen) -> tuple[Tensor, ...]:
        """FEMNIST writers as a binary task (see the module docstring): the same tuple as `_synthetic`, with
        the stored pixels as features (uint8 where the source is; a quarter of float32): `gather` and
        `all_scores` turn them into [−1, 1]."""
        config = self.config
        classes = config["positive_classes"]
        repeated = sorted({c for c in classes if classes.count(c) > 1})
        if repeated:
            raise ValueError(f"pauc.positive_classes: label {repeated[0]} is listed more than once in {classes}")
        images = femnist.load(config["source"], config["path"], config["data_dir"], femnist.LABELS,
                              config["writers_fraction"])
        data = femnist.select_clients(images, femnist.LABELS, min_train=1, min_test=0)  # writers with training data
        writers = len(data.writer_ids)
        n_clients = config["clients"] or writers
        if n_clients > writers:
            raise ValueError(f"pauc.clients: {n_clients} clients but the data hold {writers} writers with training "
                             f"samples; expected at most {writers}, or 0 for one client per writer")
        by_id = np.argsort(data.writer_ids, kind="stable")
        rank = np.empty(writers, dtype=np.int64)  # writer → its place in sorted-id order
        rank[by_id] = np.arange(writers)
        writer_client = rank * n_clients // writers  # contiguous groups of ⌊W/N⌋ or ⌈W/N⌉ writers
        client = np.repeat(writer_client, data.train_sizes)
        positive = np.isin(data.y_train, classes)
        n_pos = np.bincount(client[positive], minlength=n_clients)
        n_neg = np.bincount(client[~positive], minlength=n_clients)
        kept_pos = np.minimum(n_pos, self._positive_quota(n_neg))
        # Which positives stay: each client's first kept_pos in the order of uniform keys from the data stream.
        keys = torch.rand(len(positive), generator=gen, dtype=torch.float64).numpy()
        rows = np.flatnonzero(positive)
        rows = rows[np.lexsort((keys[rows], client[rows]))]
        place = np.arange(len(rows)) - np.r_[0, np.cumsum(n_pos)][client[rows]]
        keep = ~positive
        keep[rows[place < kept_pos[client[rows]]]] = True
        usable = (kept_pos > 0) & (n_neg > 0)  # the class-balanced draws need both classes on every client
        if not usable.any():
            raise ValueError(f"pauc.positive_classes: no client keeps both a positive and a negative training "
                             f"sample (positive_classes {classes}, positive_ratio {config['positive_ratio']}, "
                             f"clients {config['clients']})")
        keep &= usable[client]
        rows = np.flatnonzero(keep)
        rows = rows[np.lexsort((~positive[rows], client[rows]))]  # by client, positives first, then stored order
        renumber = np.cumsum(usable) - 1
        by_id = by_id[usable[writer_client[by_id]]]
        self.writer_ids = data.writer_ids[by_id]  # the kept writers in sorted-id order, and their clients
        self.writer_client = torch.from_numpy(renumber[writer_client[by_id]])
        self.dropped_clients = int((~usable).sum())
        features = torch.from_numpy(data.x_train[rows])
        labels = torch.from_numpy(positive[rows]).to(self.dtype)
        positive_counts = torch.from_numpy(kept_pos[usable])
        sizes = torch.from_numpy((kept_pos + n_neg)[usable])
        if self.config["flip_rate"]:
            features, labels, positive_counts = self._flip_clients(features, labels, sizes, gen)
        test = usable[writer_client][np.repeat(np.arange(writers), data.test_sizes)]
        test_labels = np.isin(data.y_test[test], classes)
        if test_labels.all() or not test_labels.any():
            raise ValueError(f"pauc.positive_classes: the kept writers' {int(test.sum())} test samples hold "
                             f"{'no negative' if test_labels.any() else 'no positive'} (positive_classes {classes})")
        self.pixel_scale = 2.0 / femnist.white(data.x_train)
        held_out = torch.from_numpy(data.x_test[test]), torch.from_numpy(test_labels).to(self.dtype)
        # Validation: `val_size` of the held-out samples, picked by uniform keys from the data stream.
        order = torch.randperm(len(held_out[1]), generator=gen)
        size = min(self.config["val_size"], len(order) // 2)
        return (features, labels, positive_counts, sizes, *(part[order[size:]] for part in held_out),
                tuple(part[order[:size]] for part in held_out))

    def _positive_quota(self, negatives: np.ndarray) -> np.ndarray:
        """LibAUC's ImbalancedDataGenerator count ⌊r/(1−r)·n₋⌋ of positives kept beside n₋ negatives (no
        limit for r = 1 or null); the 1e-9 guards against r/(1−r) rounding just below an integer product."""
        ratio = self.config["positive_ratio"]
        if ratio is None or ratio >= 1:
            return np.full_like(negatives, np.iinfo(np.int64).max)
        return np.floor(ratio / (1 - ratio) * negatives + 1e-9).astype(np.int64)

    def _flip_clients(self, features: Tensor, labels: Tensor, sizes: Tensor, gen) -> tuple[Tensor, Tensor, Tensor]:
        """`_flip` within every client, each client's rows re-sorted (noisy) positives first: (features,
        labels, positives per client)."""
        orders, flipped, counts, start = [], [], [], 0
        for size in sizes.tolist():  # data preparation only, once
            y = self._flip(labels[start: start + size], gen)
            order = torch.argsort(-y, stable=True)
            orders.append(start + order)
            flipped.append(y[order])
            counts.append(int(y.sum()))
            start += size
        return features[torch.cat(orders)], torch.cat(flipped), torch.tensor(counts)

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
        return tuple(torch.randperm(n, generator=gen)[: max(1, int(n * factor))].sort().values.to(self.device)
                     for n in (n_pos, n_neg))

    def _positive_counts(self, gen) -> Tensor:
        n_clients, per_client = self.config["clients"], self.config["positives_per_client"]
        if self.config["split"] == "even":
            return torch.full((n_clients,), per_client, dtype=torch.long)
        seed = int(torch.randint(2**31 - 1, (1,), generator=gen))  # numpy draws the Dirichlet, seeded from the stream
        shares = torch.from_numpy(np.random.default_rng(seed).dirichlet([self.config["dirichlet_alpha"]] * n_clients))
        return torch.floor(shares * (n_clients * per_client - n_clients)).long() + 1

    def _flip(self, y: Tensor, gen) -> Tensor:
        """Flip round(rate·n) random positives and as many of the negatives (spec 001 §1.5)."""
        rate = self.config["flip_rate"]
        if not rate:
            return y
        flipped = y.clone()
        for label in (1.0, 0.0):
            members = torch.nonzero(y == label).squeeze(1)
            chosen = members[torch.randperm(len(members), generator=gen)[: round(rate * len(members))]]
            flipped[chosen] = 1.0 - label
        return flipped

    def _draw(self, label: int, count: int, gen) -> Tensor:
        d = self.config["features"]
        x = torch.randn(count, d, generator=gen)
        if label == 1:
            x[:, 0] += 1.0
            return x
        hard = torch.rand(count, generator=gen) < self.config["hard_fraction"]
        x[~hard, 0] -= 1.0
        x[hard] *= 0.5
        x[hard, 0] += 0.8
        x[hard, 1] += 1.5
        return x

    # -- the score model, for a batch of parameter vectors [S, dim] -----------------------------
    def logits(self, w: Tensor, x: Tensor) -> Tensor:
        """s(w, x) for w [S, dim] and x [S, b, d]: [S, b]."""
        d = x.shape[-1]
        if not self.hidden:
            return torch.baddbmm(w[:, d:].unsqueeze(-1), x, w[:, :d].unsqueeze(-1)).squeeze(-1)
        h = self.hidden
        first = w[:, : d * h].view(-1, d, h)
        bias1 = w[:, d * h: d * h + h]
        second = w[:, d * h + h: d * h + 2 * h]
        bias2 = w[:, -1:]
        hidden = torch.relu(torch.bmm(x, first) + bias1.unsqueeze(1))
        return torch.bmm(hidden, second.unsqueeze(-1)).squeeze(-1) + bias2

    def scores(self, w: Tensor, x: Tensor) -> Tensor:
        return torch.sigmoid(self.logits(w, x))

    def all_scores(self, w: Tensor, stored: Tensor) -> Tensor:
        """h(w, x) [n] of every stored row, for one parameter vector w [dim]. Stored pixels v become the
        features 2v/white − 1 (the paper's Normalize(0.5, 0.5), spec 001 §3.1) chunk by chunk, in one
        reused float buffer (converting all at once costs ~3x: fresh memory)."""
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
    def restart_noise(self) -> None:
        self.noise_gen = generator(self.seed, "feature-noise")

    def init_params(self, gen: torch.Generator) -> Tensor:
        """The initial point; also restarts the feature-noise stream, so that every simulation of this
        problem instance draws the same noise."""
        self.restart_noise()
        d = self.feature_dim
        if not self.hidden:
            return torch.zeros(self.dim, dtype=self.dtype, device=self.device)
        h = self.hidden  # PyTorch's default uniform(±1/√fan_in) for both layers
        parts = [(torch.rand(d * h + h, generator=gen) * 2 - 1) / math.sqrt(d),
                 (torch.rand(h + 1, generator=gen) * 2 - 1) / math.sqrt(h)]
        return torch.cat(parts).to(self.dtype).to(self.device)

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

    def gather(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """Features with each client's fresh noise N(μ_i, (0.2·scale)²) (spec 001 §3.2), and labels."""
        s, b = rows.shape
        flat = rows.reshape(-1)
        noise = torch.randn(s * b, self.feature_dim, generator=self.noise_gen, dtype=self.dtype).to(self.device)
        mean = self.noise_mean[self.row_source[flat]].unsqueeze(-1)
        if self.pixel_scale is None:
            noisy = self.features[flat] + mean + self.noise_std * noise
        else:  # pixels v: 2v/white − 1 + μ_i + σ·ε, in place on the noise (half the time of the expression)
            noisy = noise.mul_(self.noise_std).add_(mean - 1.0).add_(self.features[flat], alpha=self.pixel_scale)
        return noisy.view(s, b, -1), self.labels[flat].view(s, b)

    def grad(self, w: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        """Gradient of the mean binary cross-entropy of σ(s(w, x)), for every sampled client at once."""
        x, y = batch
        w = w.detach().requires_grad_(True)
        loss = F.binary_cross_entropy_with_logits(self.logits(w, x), y, reduction="none").mean(-1).sum()
        return torch.autograd.grad(loss, w)[0]

    def step_oracle(self, rows: Tensor) -> "PairMinibatch":
        return PairMinibatch(self, rows)

    # -- the X-risk (spec 001 §1.4): F(w) = mean₊ f(mean₋ ℓ(h₊, h₋)), f = λ log, ℓ = exp(ℓ̃/λ) ----------------
    def pair_loss(self, a: Tensor, b: Tensor) -> Tensor:
        """ℓ(a, b) for positive scores a and negative scores b (broadcast): exp((m − (a − b))₊² / λ) for
        the pAUC task (§1.4), the symmetric PSM loss σ(b − a) for the AUC task (§1.5)."""
        if self.config["task"] == "auc":
            return torch.sigmoid(b - a)
        lam, margin = self.config["kl_lambda"], self.config["margin"]
        return torch.exp((margin - (a - b)).clamp_min(0) ** 2 / lam)

    def outer_grad(self, u: Tensor) -> Tensor:
        """∇f(u): λ / u for f = λ log (pAUC); 1 for the linear f of the AUC task."""
        if self.config["task"] == "auc":
            return torch.ones_like(u)
        return self.config["kl_lambda"] / u

    def scores_by_class(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """Scores under w of every training positive and of every negative (by the training labels)."""
        h = self.all_scores(w, self.features)
        return h[self.labels == 1], h[self.labels == 0]

    def pooled_objective(self, w: Tensor) -> float:
        """The task's X-risk over all training pairs: mean₊ λ log mean₋ exp((m − (h₊ − h₋))₊²/λ) (pAUC),
        or mean₊ mean₋ σ(h₋ − h₊) (AUC), with the (possibly flipped) training labels; over the fixed
        subsample `objective_pairs` when there are more than OBJECTIVE_PAIRS pairs."""
        return self._objective(*self.scores_by_class(w))

    def _objective(self, positives: Tensor, negatives: Tensor) -> float:
        if self.objective_pairs is not None:
            positives, negatives = positives[self.objective_pairs[0]], negatives[self.objective_pairs[1]]
        rows = max(1, PAIR_CHUNK // len(negatives))
        inner = []  # per positive, in blocks of positives (for pAUC, the same arithmetic as one pass)
        for start in range(0, len(positives), rows):
            diff = positives[start: start + rows, None] - negatives[None, :]
            if self.config["task"] == "auc":  # Σ₋ σ(h₋ − h₊), summed in float64
                inner.append(torch.sigmoid(diff.neg_()).sum(1, dtype=torch.float64))
                continue
            lam, margin = self.config["kl_lambda"], self.config["margin"]
            hinge = diff.neg_().add_(margin).clamp_min_(0).square_().div_(lam)  # (m − (h₊ − h₋))₊² / λ
            inner.append(torch.logsumexp(hinge, dim=1))
        if self.config["task"] == "auc":
            return float(torch.cat(inner).sum() / (len(positives) * len(negatives)))
        return float((self.config["kl_lambda"] * (torch.cat(inner) - math.log(len(negatives)))).mean())

    def evaluate(self, w: Tensor, personal: Tensor | None = None) -> dict[str, float]:
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


class PairMinibatch:
    """One local step of the sampled clients: b₁ positives then b₂ negatives each. Callable as the
    cross-entropy gradient (what FedAvg uses); X-risk algorithms call `surrogate_grad` with a loss of
    the positive and negative scores and get its gradient for every client at once."""

    def __init__(self, problem: PartialAUC, rows: Tensor):
        self.problem = problem
        self.x, self.y = problem.gather(rows)
        self.positives = rows.shape[1] // 2
        owners = problem.row_client[rows[:, : self.positives]]
        self.positive_index = rows[:, : self.positives] - problem.client_offsets[owners]  # into each client's positives

    def __call__(self, w: Tensor) -> Tensor:
        return self.problem.grad(w, (self.x, self.y))

    def surrogate_grad(self, w: Tensor, surrogate) -> tuple[Tensor, Tensor]:
        """(∇_w Σ_clients surrogate(h₊ [S,b₁], h₋ [S,b₂]), the detached scores [S,b]); surrogate returns [S]."""
        w = w.detach().requires_grad_(True)
        h = self.problem.scores(w, self.x)
        loss = surrogate(h[:, : self.positives], h[:, self.positives:]).sum()
        return torch.autograd.grad(loss, w)[0], h.detach()
