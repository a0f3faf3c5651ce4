"""Federated one-way partial-AUC maximization on imbalanced data (Guo, Jin, Luo, Yang, ICML 2023 "FeDXL",
§4 and App. C): the synthetic "SynthPAUC" benchmark, or a binary task on real FEMNIST.

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

Heterogeneity (§4), both data sources: client i of N adds fresh N(μ_i, 0.2²) noise, μ_i = −0.08 +
0.16·i/N (the paper's −0.08 + 0.01·i for N = 16), to every feature of every training draw (after the
normalisation, as the released code), both scaled by `noise_scale`. Test data and the training metrics get
none.

Model: a score h = σ(s(w, x)) ∈ [0, 1] (the sigmoid output of the released code) with s linear (wᵀx + b)
or an MLP d → hidden → 1 (ReLU); parameters are one flat vector, evaluated for all sampled clients at once.

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

Presets: `guo2023_synthetic` (the defaults), `guo2023_noisy_auc`, and `guo2023_femnist` (see `presets`).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedbench.data import femnist
from fedbench.hparams import Param, ParamError
from fedbench.metrics import Metric, partial_auc
from fedbench.models import MLP
from fedbench.oracle import RunAxisOracle
from fedbench.problems import pauc_data
from fedbench.problems.base import Layout, Problem
from fedbench.problems.xrisk_tasks import make_task
from fedbench.prox import NoRegularizer
from fedbench.rng import generator

OBJECTIVE_PAIRS = 2**22  # the pooled objective is exact up to this many (positive, negative) pairs
EVAL_CHUNK = 8192  # rows per scoring pass over stored pixels: a reused 26 MB float32 buffer


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
              choices=("guo2023_synthetic", "guo2023_noisy_auc", "guo2023_femnist")),
        Param("data", "choice", "synthetic", "training and test data: synthetic (SynthPAUC, Gaussians) or "
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
        # Real images as the paper's imbalanced binary tasks (§4): digits 0–4 against all other digits
        # and letters (hard negatives such as O/o, I/l, Z/z, S), pos:neg 1:5 on each of 16 clients of 22–23
        # writers, the 784 → 64 → 1 MLP (50,305 parameters). A linear scorer tops out near test pAUC(0.3)
        # 0.65 (centralized logistic regression on clean data: 0.66). After 50 rounds (K = 32, b = 64) the
        # MLP reaches 0.78 with local_sgd_ce and 0.82 with fedxl2 (both η = 0.03), still rising. A single digit
        # against the rest is too easy (0.94, linear); digits against letters gives 0.70 (linear).
        "guo2023_femnist": {"data": "femnist", "positive_classes": [0, 1, 2, 3, 4], "positive_ratio": 1 / 6,
                            "clients": 16, "model": "mlp"},
    }

    size_params = ("clients", "positives_per_client", "negatives_per_client", "features", "test_size", "val_size",
                   "hidden")

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
        self.feature_dim = features.shape[1]
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
        hidden = (config["hidden"],) if config["model"] == "mlp" else ()
        self.model = MLP((self.feature_dim, *hidden, 1))
        self.dim = self.model.dim
        self.regularizer = NoRegularizer()

    @classmethod
    def check(cls, config):
        if config["data"] == "synthetic" and config["clients"] == 0:
            raise ParamError("clients", "found 0 (one client per writer), which needs data: femnist; expected at "
                             "least 1 for synthetic data", cls.name)
        classes = config["positive_classes"]
        repeated = sorted({c for c in classes if classes.count(c) > 1})
        if config["data"] == "femnist" and repeated:
            raise ParamError("positive_classes", f"label {repeated[0]} is listed more than once in {classes}", cls.name)

    @classmethod
    def declared_layout(cls, config, read_data=False):
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
        return config["clients"] if config["data"] == "synthetic" else None  # femnist may drop clients

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
        """s(w, x) for w [S, dim] and x [S, b, d]: [S, b] (or one client's [dim], [b, d]: [b])."""
        return self.model(w, x).squeeze(-1)

    def scores(self, w: Tensor, x: Tensor) -> Tensor:
        return torch.sigmoid(self.logits(w, x))

    def all_scores(self, w: Tensor, stored: Tensor) -> Tensor:
        """h(w, x) [n] of every stored row, for one parameter vector w [dim]. Stored pixels v become the
        features 2v/white − 1 (Normalize(0.5, 0.5) of the authors' released code) chunk by chunk, in one
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
    def init_params(self, gen: torch.Generator) -> Tensor:
        """The initial point."""
        if self.config["model"] == "linear":
            return torch.zeros(self.dim, dtype=self.dtype, device=self.device)
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
        code; Guo et al., §4)."""
        return torch.randn(rows.numel(), self.feature_dim, generator=gen, dtype=self.dtype).to(self.device)

    def gather(self, rows: Tensor, noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Features with each client's noise μ_i + 0.2·scale·ε (Guo et al., §4; ε from `minibatch_noise`, None:
        ε = 0, the client's mean shift only), and labels."""
        flat = rows.reshape(-1)  # rows `[S, b]`, or `[R, S, b]` (`oracles_take_runs`)
        if noise is None:
            noise = torch.zeros(len(flat), self.feature_dim, dtype=self.dtype, device=self.device)
        mean = self.noise_mean[self.row_source[flat]].unsqueeze(-1)
        if self.pixel_scale is None:  # (x + μ_i) + σ·ε in that order, in place on fresh tensors: 2.5x the expression
            noisy = self.features.index_select(0, flat).add_(mean).add_(noise.mul_(self.noise_std))
        else:  # pixels v: 2v/white − 1 + μ_i + σ·ε, in place on the noise (half the time of the expression)
            noisy = noise.mul_(self.noise_std).add_(mean - 1.0).add_(self.features[flat], alpha=self.pixel_scale)
        return noisy.view(*rows.shape, -1), self.labels[flat].view(rows.shape)

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
