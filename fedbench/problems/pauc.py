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
`fedbench.networks.module_model.ModuleModel` in the `layout` `auto` picks from the measured table (`vmap` or `loop`, the
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

from fedbench.data import images
from fedbench.metrics import partial_auc
from fedbench.networks.mlp import MLP
from fedbench.networks.module_model import ModuleModel, choose_layout
from fedbench.oracle import RunAxisOracle
from fedbench.problems import pauc_data
from fedbench.problems.base import Problem
from fedbench.problems.pauc_spec import FEATURE_MODELS, PartialAUCSpec
from fedbench.problems.vision import CROP_PADDING
from fedbench.problems.xrisk_tasks import make_task
from fedbench.prox import NoRegularizer
from fedbench.rng import generator

OBJECTIVE_PAIRS = 2**22  # the pooled objective is exact up to this many (positive, negative) pairs
EVAL_CHUNK = 8192  # rows per scoring pass over stored pixels: a reused 26 MB float32 buffer
IMAGE_EVAL_CHUNK = 512  # images per scoring pass of a network (6 MB of float32 input; ~2x faster than 2048 here)


class PartialAUC(PartialAUCSpec, Problem):
    """Provides `pair_scores` (the FeDXL algorithms use these and nothing else of it): `pair_loss`,
    `outer_grad`, `scores_by_class`, `positive_counts`/`negative_counts`, and `PairOracle` minibatches."""

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

    def choices(self) -> dict[str, str]:
        """A network's layout over the clients (`fedbench.networks.module_model`), `auto`'s choice marked so."""
        if self.config["model"] in FEATURE_MODELS:
            return {}
        return {"layout": self.layout_name + (" (auto)" if self.config["layout"] == "auto" else "")}

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
