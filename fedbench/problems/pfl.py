"""Personalized-FL problems of Hanzely, Zhao, Kolar (TMLR 2023): a block objective F(w, β) = (1/M) Σ_m f_m(w, β_m)
(`fedbench.problems.blocks`) over M devices that all hold n samples, with logistic losses f'_m
(`fedbench.problems.pfl_models`).

The problem serves two kinds of algorithms:
* block methods (LSGD/ACD/ASCD/ASVRCD/SCD/SVRCD-PFL) ask a `BlockOracle` for ∇_w f_{m,j} and ∇_β f_{m,j} in the
  stored variables (w, with the chain-rule factor 1/√M of the reparametrisation, §2.3 and §6.3), and read the problem's
  constants (`constants`: μ, 𝓛^w, 𝓛^β) and `beta_scale` (∇_{β_m}F = beta_scale·∇_β f_m: 1/M, or 1 where the
  authors' EWS code (`Synthetic/EWS`) does not divide);
* methods on one model per device in the natural variables (pFedMe, L2SGD+) use the plain oracle of f'_m.

Either way a metric row evaluates the point (w̃, β) in natural variables: the global model w̃ (`global_params`)
and the per-device blocks (`personal_params`). The objective gap is against the reference optimum
(`fedbench.reference`, Newton on the joint variable).
"""
from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedbench.data import pfl_images, pfl_synthetic
from fedbench.hparams import Param, ParamError
from fedbench.metrics import Metric
from fedbench.oracle import RunAxisOracle, over_runs
from fedbench.problems.base import Layout, Problem
from fedbench.problems.blocks import OBJECTIVES, BlockObjective, Constants
from fedbench.problems.pfl_models import BinaryLogistic, Softmax
from fedbench.prox import NoRegularizer

RULE_SETTINGS = ("reparam", "smoothness", "mu_prime", "beta_gradients", "estimation_error")


class BlockOracle(RunAxisOracle):
    """An oracle of one minibatch of every device, for block objectives: at stored w (`[d_w]`, shared, or
    `[S, d_w]`) and β `[S, d_β]`, per device; on the rows `[R, S, b]` of R runs (`Problem.oracles_take_runs`), at w
    `[R, 1, d_w]` or `[R, S, d_w]` and β `[R, S, d_β]`, every formula broadcasting over the leading axes. `rows` are
    the batch's rows in the flat data (SAGA tables index them), None for full data."""

    def __init__(self, problem, batch, rows: Tensor | None = None):
        super().__init__(problem, batch)
        self.rows = rows
        self.clients = batch[1].shape[:-1]  # the labels' `[R, S]` (or `[S]`)

    def block_grads(self, w: Tensor, beta: Tensor, need_w: bool = True) -> tuple[Tensor | None, Tensor]:
        """(∇_w f_m(w, β_m; D), ∇_β f_m(w, β_m; D)); the first is None when not `need_w`."""
        return self.problem.block_grads(w, beta, self.batch, need_w)

    def block_loss(self, w: Tensor, beta: Tensor) -> Tensor:
        return self.problem.block_loss(w, beta, self.batch)

    def residuals(self, theta: Tensor) -> Tensor:
        """∂ℓ/∂outputs of each row at θ `[S, D]`: `[S, b, k]` (the gradient is their product with the features)."""
        return self.problem.base.residuals(theta, *self.batch)

    def grad_of_residuals(self, residuals: Tensor) -> Tensor:
        """The mean over the rows of residual ⊗ features `[S, D]`: the gradient whose rows have these residuals."""
        return self.problem.base.grad_of_residuals(residuals, self.batch[0])


class BlockProblem(Problem):
    """The shared machinery of Hanzely et al.'s problems: subclasses set the data (`x` `[M, n, p]`, `y` `[M, n]`),
    `base` (the model of f'), `objective` and `constants` through `_setup`."""
    provides = frozenset({"block_objective", "full_data", "personal_evaluation", "linear_model"})
    evaluates_global_model = False  # a row needs the per-device blocks too
    oracles_take_runs = True  # `BlockOracle`: the coordinate methods' one-sample steps are a few µs of arithmetic
    _instance_key: str | None = None

    objective: BlockObjective
    constants: Constants
    beta_scale: float
    w_scale: float
    dim_w: int
    dim_beta: int

    def _setup(self, x: Tensor, y: Tensor, base, objective: BlockObjective, reparam: bool, beta_scale: str) -> None:
        self.x, self.y, self.base, self.objective = x, y, base, objective
        devices, samples, _ = x.shape
        self.flat_x, self.flat_y = x.reshape(devices * samples, -1), y.reshape(-1)
        self._set_clients(torch.full((devices,), samples, dtype=torch.long))
        self.client_weights = torch.full((devices,), 1.0 / devices, dtype=x.dtype, device=self.device)
        self.regularizer = NoRegularizer()
        self.dim = base.dim
        self.dim_w = objective.global_features or base.dim
        self.dim_beta = base.dim - objective.global_features
        self.w_scale = devices**-0.5 if reparam else 1.0
        self.beta_scale = 1.0 / devices if beta_scale == "objective" else 1.0
        self.dtype = x.dtype

    @classmethod
    def capabilities(cls, config):
        return super().capabilities(config) | ({"mixture"} if config["objective"] == "mx2" else set())

    @property
    def mixture_penalty(self) -> float | None:
        """λ of the mixture objective (9)/(10)/(11) that pFedMe and L2SGD+ solve in natural variables, where the
        problem's objective is mx2 (None otherwise)."""
        return self.objective.lam if self.objective.kind == "mx2" else None

    # -- data and oracles ---------------------------------------------------------------------------
    def init_params(self, gen: torch.Generator) -> Tensor:
        # Every method starts at 0, as in the authors' code (§5.1 says so for pFedMe and L2SGD+).
        return torch.zeros(self.dim, dtype=self.dtype, device=self.device)

    draws_by_step = True  # one randint over [steps, S, b], drawn element by element on the CPU generator

    def draw_minibatches(self, clients: Tensor, steps: int, batch_size: int, gen: torch.Generator) -> Tensor:
        """Each device's samples drawn uniformly with replacement, as the authors' codes do (`np.random.choice(n,
        size=n)` per iteration; pFedMe's minibatch with replacement): one randint, where the base draw without
        replacement ranks n keys per pick (its cost dominated these one-sample iterations)."""
        picks = torch.randint(self.max_size, (steps, len(clients), batch_size), generator=gen)
        return (self.client_offsets_cpu[clients][:, None] + picks).to(self.device)

    def gather(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        flat = rows.reshape(-1)  # every device holds n samples: no padding rows
        return (self.flat_x.index_select(0, flat).view(*rows.shape, -1),
                self.flat_y.index_select(0, flat).view(rows.shape))

    def step_oracle(self, rows: Tensor, noise: Tensor | None = None) -> BlockOracle:
        return BlockOracle(self, self.gather(rows), rows)

    def full_data(self, clients: Tensor) -> BlockOracle:
        clients = clients.to(self.device)
        return BlockOracle(self, (self.x[clients], self.y[clients]))

    def minibatch_loss(self, w: Tensor, batch) -> Tensor:
        x, y = batch
        return self.base.loss(w.unsqueeze(0), x.unsqueeze(0), y.unsqueeze(0))[0]

    def loss(self, w: Tensor, batch) -> Tensor:
        return self.base.loss(w, *batch)

    def grad(self, w: Tensor, batch) -> Tensor:
        return self.base.grad(w, *batch)

    def block_loss(self, w: Tensor, beta: Tensor, batch) -> Tensor:
        return self.objective.value(lambda theta: self.base.loss(theta, *batch), self.w_scale * w, beta)

    def block_grads(self, w: Tensor, beta: Tensor, batch, need_w: bool = True) -> tuple[Tensor | None, Tensor]:
        g_w, g_beta = self.objective.grads(lambda theta: self.base.grad(theta, *batch), self.w_scale * w, beta,
                                           need_w)
        return (None if g_w is None else self.w_scale * g_w), g_beta

    @over_runs
    def client_block_grads(self, w: Tensor, beta: Tensor, clients: Tensor) -> tuple[Tensor, Tensor]:
        """(∇_w f_m, ∇_β f_m) on each device's full data at the stored w, shared `[d_w]` or each device's `[C, d_w]`,
        and β `[C, d_β]`; over runs (`over_runs`) w `[R, 1, d_w]` as a block method's server holds it and β
        `[R, C, d_β]`."""
        if w.dim() == 2:
            parts = self._by_chunk(clients, lambda oracle, w_part, b: oracle.block_grads(w_part, b), w, beta)
        else:
            parts = self._by_chunk(clients, lambda oracle, b: oracle.block_grads(w, b), beta)
        return torch.cat([g for g, _ in parts]), torch.cat([g for _, g in parts])

    # -- evaluation ---------------------------------------------------------------------------------
    def natural_objective(self, w: Tensor, beta: Tensor) -> Tensor:
        """F(w̃, β) = (1/M) Σ_m f_m on all data, in the natural variable w̃ (no reparametrisation); with a leading
        run axis (w̃ `[K, d_w]`, β `[K, M, d_β]`) one value per run."""
        loss = self.objective.value(lambda theta: self.base.loss(theta, self.x, self.y), w.unsqueeze(-2), beta)
        return loss.mean(-1)

    def flat_objective(self, z: Tensor) -> Tensor:
        """F at z = [w̃; β_1; …; β_M], for the reference solver."""
        return self.natural_objective(z[: self.dim_w], z[self.dim_w:].view(self.num_clients, self.dim_beta))

    def flat_gradient(self, z: Tensor) -> Tensor:
        """∇F at z (hand-written: its forward-mode derivative gives the reference solver's Hessian ~50x faster
        than double backward through the loss)."""
        w, beta = z[: self.dim_w], z[self.dim_w:].view(self.num_clients, self.dim_beta)
        g_w, g_beta = self.objective.grads(lambda theta: self.base.grad(theta, self.x, self.y), w, beta)
        assert g_w is not None  # need_w
        return torch.cat([g_w.mean(0), g_beta.flatten() / self.num_clients])

    def flat_hessian(self, z: Tensor) -> Tensor:
        """∇²F at z from d_w + d_β forward-mode derivatives of `flat_gradient` instead of one per coordinate: f_m
        depends on (w, β_m) only, so a direction e_i in every β_m at once gives each device's diagonal block
        H_{β_m β_m} e_i at its own rows, and the w-directions give H_ww and H_{β_m w} (H_{w β_m} by symmetry)."""
        d_w, devices, d_beta = self.dim_w, self.num_clients, self.dim_beta
        directions = torch.zeros(d_w + d_beta, len(z), dtype=z.dtype, device=z.device)
        directions[:d_w, :d_w] = torch.eye(d_w, dtype=z.dtype, device=z.device)
        directions[d_w:, d_w:] = torch.eye(d_beta, dtype=z.dtype, device=z.device).repeat(1, devices)
        columns = torch.vmap(lambda v: torch.func.jvp(self.flat_gradient, (z,), (v,))[1])(directions)
        hessian = torch.zeros(len(z), len(z), dtype=z.dtype, device=z.device)
        hessian[:, :d_w] = columns[:d_w].T
        hessian[:d_w, d_w:] = columns[:d_w, d_w:]
        beta_blocks = columns[d_w:, d_w:].view(d_beta, devices, d_beta).permute(1, 2, 0)  # [M, row, column]
        hessian[d_w:, d_w:] = torch.block_diag(*beta_blocks)
        return hessian

    def instance_key(self) -> str:
        """Identifies the natural objective F(w̃, β) (the reference solution's cache key): settings of the stored
        variables, the constants and the metrics do not change it. Kept once computed: every evaluation asks."""
        if self._instance_key is None:
            config = {k: v for k, v in self.config.items() if k not in RULE_SETTINGS}
            text = json.dumps([self.name, config, str(self.dtype)], sort_keys=True)
            self._instance_key = hashlib.sha256(text.encode()).hexdigest()[:24]
        return self._instance_key

    def evaluate(self, w: Tensor, personal: Tensor | None = None) -> dict[str, float]:
        """The metrics at (w̃, β): `personal` holds the devices' blocks β `[M, d_β]` (a method that keeps one
        model per device reports it as β, its global model as w̃)."""
        return self.evaluate_runs(w.unsqueeze(0), None if personal is None else personal.unsqueeze(0))[0]

    def evaluate_runs(self, ws: Tensor, personals: Tensor | None = None) -> list[dict[str, float]]:
        """K runs' metrics in one pass over the data (w̃ `[K, d_w]`, β `[K, M, d_β]`); a run alone is K = 1, so
        that its rows are computed by the same kernels alone and in a batch."""
        if personals is None:
            raise ValueError(f"{self.name} evaluates a global model with the devices' blocks")
        metrics = self.block_metrics(ws, personals)
        names = list(metrics)
        values = torch.stack([torch.as_tensor(metrics[k], dtype=self.dtype).expand(len(ws)) for k in names])
        return [dict(zip(names, run)) for run in values.T.tolist()]

    def block_metrics(self, w: Tensor, beta: Tensor) -> dict[str, Tensor | float]:
        """The metrics of K runs, each a `[K]` tensor (or a scalar shared by all): w̃ `[K, d_w]`, β `[K, M, d_β]`."""
        raise NotImplementedError


OBJECTIVE = Metric("objective", "objective F(w, β)", "min")
OBJECTIVE_GAP = Metric("objective_gap", "objective gap F(w, β) − F*", "min")

SYNTHETIC_METRICS = (OBJECTIVE, OBJECTIVE_GAP,
                     Metric("estimation_error", "estimation error of the true models", "min"))


class PFLSynthetic(BlockProblem):
    """The synthetic logistic data of Hanzely et al. (TMLR 2023, §5.1–5.2), generated bit for bit as the authors'
    code: S1 (`s1`, §5.1: devices' models around a common w*, objective MX2) and S2 (`s2`, §5.2: a shared block
    and a local block, objective EWS). The data seed is fixed (111); repetitions vary only the algorithms'
    randomness."""
    name = "pfl_synthetic"
    params = (
        Param("preset", "choice", "s1", "paper experiment: S1 (MX2, §5.1, Fig. 1) or S2 (EWS, §5.2, Fig. 2)",
              choices=("s1", "s2")),
        Param("sigma_h", "float", 1.0, "heterogeneity σ_h of the devices' true models", low=0, low_open=True),
        Param("objective", "choice", "mx2", "f_m of the objective (s2's data need ews)", choices=OBJECTIVES),
        Param("lam", "float", None, "penalty λ of mx2/mt2 (None: from lam_rule)", low=0, nullable=True, log=True),
        Param("lam_rule", "choice", "code", "λ when lam is None: the code's 1e-2/σ_h or the paper's σ_h·1e-2",
              choices=("code", "paper")),
        Param("big_lambda", "float", 1.0, "Λ of mt2/apfl2", low=0),
        Param("alpha", "float", 0.1, "α of apfl2", low=0, high=1, low_open=True),
        Param("reparam", "bool", True, "feed w/√M into f_m (§2.3)"),
        Param("smoothness", "choice", "code", "𝓛': the code's (s1: max‖x‖/4, unsquared; s2: max‖x‖ over row slices) "
              "or the paper's (max‖x‖²/4; s2 over the blocks' columns)", choices=("code", "paper")),
        Param("mu_prime", "choice", "code", "μ' of the Hessian at the truth: the code's `np.linalg.eig(H)[0][-1]` or "
              "the smallest eigenvalue", choices=("code", "smallest")),
        Param("beta_gradients", "choice", "objective", "∇_β of the block methods: ∇_{β_m}F = (1/M)∇_β f_m, or "
              "∇_β f_m as the EWS code", choices=("objective", "device")),
        Param("estimation_error", "choice", "code", "code: Σ‖β−β*‖² (s1), ‖w̃−w*‖² + (1/M)Σ‖β−β*‖² (s2); "
              "paper: ‖w̃−w*‖² + Σ‖β−β*‖²", choices=("code", "paper")),
        Param("data_seed", "int", 111, "seed of the authors' generator", low=0),
    )
    presets = {"s1": {}, "s2": {"sigma_h": 5.0, "objective": "ews", "beta_gradients": "device"}}

    @classmethod
    def check(cls, config):
        if (config["objective"] == "ews") != (config["preset"] == "s2"):
            raise ParamError("objective", f"found {config['objective']!r} with preset {config['preset']!r}, expected "
                             "ews exactly with s2 (its data have a global and a local block)", cls.name)

    @classmethod
    def declared_clients(cls, config):
        return pfl_synthetic.DEVICES

    @classmethod
    def declared_layout(cls, config, read_data=False):
        return Layout(pfl_synthetic.DEVICES, pfl_synthetic.SAMPLES)

    @classmethod
    def metrics(cls, config):
        return SYNTHETIC_METRICS

    def __init__(self, config: dict[str, Any], seed: int, device="cpu"):
        super().__init__(config, seed, device)
        s2 = config["preset"] == "s2"
        data = (pfl_synthetic.ews if s2 else pfl_synthetic.mx2)(config["sigma_h"], config["data_seed"])
        lam = config["lam"]
        if lam is None:
            lam = 1e-2 / config["sigma_h"] if config["lam_rule"] == "code" else 1e-2 * config["sigma_h"]
        objective = BlockObjective(config["objective"], lam=0.0 if s2 else lam, big_lambda=config["big_lambda"],
                                   alpha=config["alpha"], global_features=len(data.w_true) if s2 else 0)
        x, y = (torch.from_numpy(a).to(self.device) for a in (data.x, data.y))
        self._setup(x, y, BinaryLogistic(x.shape[-1]), objective, config["reparam"], config["beta_gradients"])
        self.w_true = torch.from_numpy(data.w_true).to(self.device)
        self.beta_true = torch.from_numpy(data.beta_true).to(self.device)
        truth = np.concatenate([np.broadcast_to(data.w_true, (len(data.beta_true), len(data.w_true))),
                                data.beta_true], 1) if s2 else data.beta_true
        hessian = pfl_synthetic.logistic_hessian(data, truth)
        self.mu_prime = float(np.linalg.eig(hessian)[0][-1].real if config["mu_prime"] == "code"
                              else np.linalg.eigvalsh(hessian)[0])
        self.smooth_prime = self._smoothness(data.x, config["smoothness"], s2, len(data.w_true))
        self.constants = objective.constants(self.smooth_prime, self.mu_prime, self.num_clients, config["reparam"])

    @staticmethod
    def _smoothness(x: np.ndarray, rule: str, s2: bool, split: int) -> float | tuple[float, float]:
        """𝓛' (the paper's max‖x‖²/4 of §5.1, or the authors' code: max‖x‖/4, and for s2 `mathcal_L_fun`'s
        norms of row slices)."""
        norms = np.linalg.norm(x, axis=-1)
        if not s2:
            return float(norms.max() / 4 if rule == "code" else norms.max() ** 2 / 4)
        if rule == "code":  # mathcal_L_fun slices each device's rows, not its columns
            return float(norms[:, :split].max()), float(norms[:, split:].max())
        return (float(np.square(x[..., :split]).sum(-1).max() / 4),
                float(np.square(x[..., split:]).sum(-1).max() / 4))

    def block_metrics(self, w: Tensor, beta: Tensor) -> dict[str, Tensor | float]:
        from fedbench.reference import solve  # the reference imports problems for typing only

        objective = self.natural_objective(w, beta)
        beta_error = (beta - self.beta_true).square().sum(-1)
        w_error = (w - self.w_true).square().sum(-1)
        if self.config["estimation_error"] == "paper":
            error = w_error + beta_error.sum(-1)
        elif self.config["preset"] == "s2":
            error = w_error + beta_error.mean(-1)
        else:
            error = beta_error.sum(-1)
        return {"objective": objective, "objective_gap": objective - solve(self).objective, "estimation_error": error}


@functools.lru_cache(maxsize=2)
def _pool(source: str, path: str | None) -> tuple[np.ndarray, np.ndarray]:
    return pfl_images.load_pool(source, path)  # a sweep's trials on one dataset read it once per process


class PFLImages(BlockProblem):
    """The real-image experiments of Hanzely et al. (TMLR 2023, §6.1–6.4): M devices with K classes each,
    multiclass logistic regression 784 → 10 with bias, objective MT2 (8), MX2 (11) or APFL2 (14) with the paper's
    λ = 1/K, Λ = 1, α = 0.05·K. `r1` is §6.1–6.3 (n = 100 training, 300 test images per device), `r4` the Λ sweep
    of Fig. 8 (§6.4) on (8), the rescaled (7) (K = 4, n = 30/100, λ = 0.1; `reparam: false` is (7) itself).
    Constants are the code's heuristic 𝓛' = 1 (unit-norm rows) and μ' = 0.01 (the problem is over-parametrised: μ'
    is really 0); no reference optimum."""
    name = "pfl_images"
    params = (
        Param("preset", "choice", "r1", "paper experiment: §6.1–6.3 (Figs. 3–7) or §6.4 (Fig. 8)",
              choices=("r1", "r4")),
        Param("source", "choice", "fashion-mnist", "image pool: Fashion-MNIST, FEMNIST digits (the offline MNIST) or "
              "an IDX folder (path)", choices=pfl_images.SOURCES),
        Param("path", "str", None, "the pool's folder or file (None: the source's default under FEDBENCH_DATA)",
              nullable=True),
        Param("devices", "int", 20, "devices M", low=1),
        Param("classes", "int", 2, "classes K drawn per device", low=1, high=pfl_images.CLASSES),
        Param("train", "int", 100, "training images per device n", low=1),
        Param("test", "int", 300, "test images per device n'", low=0),
        Param("objective", "choice", "mx2", "f_m of the objective", choices=("mx2", "mt2", "apfl2")),
        Param("lam", "float", None, "penalty λ of mx2/mt2 (None: 1/K)", low=0, nullable=True, log=True),
        Param("big_lambda", "float", 1.0, "Λ of mt2/apfl2", low=0),
        Param("alpha", "float", None, "α of apfl2 (None: 0.05·K)", low=0, high=1, low_open=True, nullable=True),
        Param("reparam", "bool", True, "feed w/√M into f_m (§2.3)"),
        Param("label_draw", "choice", "code", "device classes with replacement (code) or K distinct (paper)",
              choices=pfl_images.LABEL_DRAWS),
        Param("selection", "choice", "code", "the first matching pool images in order (code) or random ones",
              choices=pfl_images.SELECTIONS),
        Param("normalization", "choice", "code", "scalar dataset constants (code) or per-pixel standardisation "
              "(paper), then unit rows", choices=pfl_images.NORMALIZATIONS),
        Param("pixel_mean", "float", None, "mean of pixel/255 for code normalisation of an idx pool (None: the "
              "pool's own)", nullable=True),
        Param("pixel_std", "float", None, "std of pixel/255 (idx pool; None: the pool's own)", low=0,
              low_open=True, nullable=True),
        Param("mu_prime", "float", 0.01, "μ' of the parameter rules (the code's heuristic)", low=0, low_open=True,
              log=True),
        Param("smoothness", "float", 1.0, "𝓛' of the parameter rules (unit-norm rows)", low=0, low_open=True),
        Param("data_seed", "int", 111, "seed of the label draw (and of random selection)", low=0),
    )
    presets = {"r1": {}, "r4": {"classes": 4, "train": 30, "test": 100, "objective": "mt2", "lam": 0.1}}

    @classmethod
    def declared_clients(cls, config):
        return config["devices"]

    @classmethod
    def declared_layout(cls, config, read_data=False):
        if read_data:
            labels = cls.read_index(config, pfl_images.pool_labels, config["source"], config["path"])
            try:
                pfl_images.device_rows(labels, config["devices"], config["classes"], config["train"], config["test"],
                                       config["label_draw"], config["selection"], config["data_seed"])
            except ValueError as err:
                raise ParamError("train", str(err), cls.name) from None
        return Layout(config["devices"], config["train"], "train")

    @classmethod
    def metrics(cls, config):
        return (OBJECTIVE, Metric("test_accuracy", "test accuracy of each device's local model β_m (mean over "
                                                   "devices)", "max"),
                Metric("train_accuracy", "training accuracy of the local models β_m (mean over devices)", "max"))

    def __init__(self, config: dict[str, Any], seed: int, device="cpu"):
        super().__init__(config, seed, device)
        k = config["classes"]
        x, y = _pool(config["source"], config["path"])
        mean, std = pfl_images.SCALAR_STATS.get(config["source"], (config["pixel_mean"], config["pixel_std"]))
        if config["normalization"] == "code" and (mean is None or std is None):
            scaled = x / 255.0
            mean, std = (float(scaled.mean()) if mean is None else mean), (float(scaled.std()) if std is None else std)
        data = pfl_images.device_split(x, y, config["devices"], k, config["train"], config["test"],
                                       config["label_draw"], config["selection"], config["normalization"], mean, std,
                                       config["data_seed"])
        lam = 1.0 / k if config["lam"] is None else config["lam"]
        alpha = 0.05 * k if config["alpha"] is None else config["alpha"]
        objective = BlockObjective(config["objective"], lam=lam, big_lambda=config["big_lambda"], alpha=alpha)
        tensors = [torch.from_numpy(a).to(self.device) for a in (data.x_train, data.y_train, data.x_test, data.y_test)]
        self.x_test, self.y_test = tensors[2], tensors[3]
        self._setup(tensors[0], tensors[1], Softmax(x.shape[1], pfl_images.CLASSES), objective, config["reparam"],
                    "objective")
        self.labels = data.labels
        self.constants = objective.constants(config["smoothness"], config["mu_prime"], self.num_clients,
                                             config["reparam"])

    def block_metrics(self, w: Tensor, beta: Tensor) -> dict[str, Tensor | float]:
        accuracy: dict[str, Tensor | float] = {}
        for split, x, y in (("train", self.x, self.y), ("test", self.x_test, self.y_test)):
            accuracy[split] = self.base.correct(beta, x, y).to(self.dtype).mean((-2, -1)) if y.numel() else torch.nan
        return {"objective": self.natural_objective(w, beta), "test_accuracy": accuracy["test"],
                "train_accuracy": accuracy["train"]}
