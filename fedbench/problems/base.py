"""What a federated problem provides to the engine.

A problem owns its federated data, the smooth loss f (one client's minibatch loss, `minibatch_loss`,
from which torch.func derives the batched loss, gradient and Hessian-vector products that oracles
serve; problems override `grad`/`hvp` where a hand-written form is faster), the regularizer h, the
initial point, its declared metrics and their evaluation, and the capabilities it provides beyond
minibatch gradients (`fedbench.contract`). Parameters are flat vectors `[d]`; a batch of clients is
`[S, d]`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import grad as func_grad, vmap

from fedbench.hparams import Param, ParamError, resolve
from fedbench.metrics import Metric
from fedbench.models import MLP
from fedbench.oracle import Oracle, over_runs
from fedbench.prox import Regularizer

FULL_DATA_CHUNK = 2**24  # elements of gathered features per chunk of clients in full-data oracles
T = TypeVar("T")


@dataclass(frozen=True)
class Layout:
    """The clients a problem instance has, as far as they are known: how many, and how many training samples the
    smallest holds where that bounds a minibatch (None: not known, or no bound, for problems that cap a batch at
    a client's samples), and the config field that sets that number, if one does. What `Federation.check` checks a
    federation against."""
    clients: int | None
    smallest: int | None = None
    smallest_field: str | None = None  # e.g. samples_per_client


class Problem:
    name: ClassVar[str]
    params: ClassVar[tuple[Param, ...]]
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    # True: a client with n_k < b takes all its n_k samples (as in the code of Bao et al., ICML 2022) and the
    # problem's draw_minibatches/grad handle the short batches, so b may exceed the smallest client.
    caps_batches: ClassVar[bool] = False
    provides: ClassVar[frozenset[str]] = frozenset()  # capabilities (fedbench.contract), whatever the config
    row_elements: ClassVar[int | None] = None  # features per gathered sample (None: dim), for memory budgets
    size_params: ClassVar[tuple[str, ...]] = ()  # config fields a run's memory grows with (`run_bytes`)
    evaluates_global_model: ClassVar[bool] = True  # False: a metric row needs per-client blocks too
    noisy_minibatches: ClassVar[bool] = False  # True: its minibatches carry noise (`minibatch_noise`)
    # True: `draw_minibatches` draws its steps one after another on the generator, so that drawing a + b steps
    # gives the draws of a steps then those of b (iteration-wise run batches draw a run's rows ahead, by iteration)
    draws_by_step: ClassVar[bool] = False
    # True: `step_oracle` takes the rows `[R, S, b]` of R runs' clients, and its oracle's methods take and give
    # tensors with that leading run axis (`[R, S, ...]`; a point a run's clients share as `[R, 1, ...]`) by
    # broadcasting, so that the engine hands them over as they are. False: the engine folds the run axis into the
    # clients' (`[R·S, b]` rows, `[R·S, ...]` points) around every call (`fedbench.runs.RunOracle`), which costs
    # a few µs a call, felt where a local step is a few small kernels (the one-sample coordinate steps of
    # Hanzely et al., TMLR 2023)
    oracles_take_runs: ClassVar[bool] = False

    num_clients: int
    dim: int
    regularizer: Regularizer
    client_sizes: Tensor  # [N] samples per client
    client_offsets: Tensor  # [N+1] clients' rows are contiguous in the flat data
    client_weights: Tensor  # [N] π_k of the global objective Σ π_k L_k + h, summing to 1

    def __init__(self, config: dict[str, Any], seed: int, device: str | torch.device = "cpu"):
        self.check(config)
        self.config = config
        self.seed = seed
        self.data_seed = seed if config.get("data_seed") is None else config["data_seed"]
        self.device = torch.device(device)

    @classmethod
    def resolve_config(cls, given: dict[str, Any]) -> dict[str, Any]:
        """Declared defaults, overlaid by the chosen preset (for a problem that has presets), overlaid by `given`;
        all checked."""
        given = dict(given)
        if not cls.presets:
            return resolve(cls.params, given, cls.name)
        preset = given.get("preset", next((p.default for p in cls.params if p.name == "preset"), None))
        if preset not in cls.presets:
            raise ValueError(f"{cls.name}.preset: expected one of {' | '.join(cls.presets)}, found {preset!r}")
        return resolve(cls.params, {**cls.presets[preset], **given}, cls.name)

    @classmethod
    def declared_clients(cls, config: dict[str, Any]) -> int | None:
        """The number of clients a resolved config makes, where it is known without building the problem
        (synthetic data), so that a recipe is checked before anything runs; None where it is not."""
        return config.get("clients")

    @classmethod
    def run_bytes(cls, config: dict[str, Any]) -> int | None:
        """About the bytes one run holds at its peak (its data and model state, in the dtype it uses), from a resolved
        config's sizes (`size_params`, which a problem that estimates declares), so that a recipe whose runs no
        machine holds is refused before anything runs; None: not estimated (data read from files, of their size)."""
        return None

    @classmethod
    def check(cls, config: dict[str, Any]) -> None:
        """Refuse (ParamError) a resolved config that the problem cannot be built with, by rules that need the
        config alone; every instance is checked so, and a recipe's validator checks its configs so before anything
        runs. Rules that need the data go in `declared_layout`."""

    @classmethod
    def declared_layout(cls, config: dict[str, Any], read_data: bool = False) -> Layout:
        """The clients a checked config makes, without building the problem: from the config alone, and with
        `read_data` also from the index of the data (labels, writers' sample counts; never the images), where the
        problem reads files. Reading them also refuses (ParamError) what building would refuse on those data: a
        missing file, a partition the data cannot give."""
        return Layout(cls.declared_clients(config))

    def layout(self) -> Layout:
        """The clients of this instance."""
        return Layout(self.num_clients, None if self.caps_batches else int(self.client_sizes_cpu.min()))

    @classmethod
    def read_index(cls, config: dict[str, Any], read: Callable[..., T], *args: Any) -> T:
        """`read(*args)`, a loader of the index of the config's data files, its refusal (a missing or malformed
        file, named in the message) a ParamError of the field that chose the files."""
        try:
            return read(*args)
        except ValueError as err:
            field = "path" if config.get("path") is not None or "data_dir" not in config else "data_dir"
            raise ParamError(field, str(err), cls.name) from None

    @classmethod
    def capabilities(cls, config: dict[str, Any]) -> set[str]:
        """What this problem provides with a resolved config: `provides`, `global_evaluation` unless its rows
        need per-client blocks, and `one_client` where the config makes a single client."""
        return (set(cls.provides) | ({"global_evaluation"} if cls.evaluates_global_model else set())
                | ({"one_client"} if cls.declared_clients(config) == 1 else set()))

    @classmethod
    def shared_by_seeds(cls, config: dict[str, Any]) -> bool:
        """Whether one instance serves every trial seed with this config, so that runs of several seeds can
        share it (`fedbench.runs`): the data do not follow the seed, and nothing else in the problem does."""
        return config.get("data_seed") is not None

    @classmethod
    def metrics(cls, config: dict[str, Any]) -> tuple[Metric, ...]:
        """The metrics `evaluate` returns for the global model, in row order."""
        raise NotImplementedError

    @classmethod
    def personal_metrics(cls, config: dict[str, Any]) -> tuple[Metric, ...]:
        """The metrics of per-client models (names without the `personal_` prefix), for problems that
        provide `personal_evaluation`."""
        return ()

    @classmethod
    def declared_metrics(cls, config: dict[str, Any], personal: bool = False) -> tuple[Metric, ...]:
        """Every metric of a row: the global ones, then (`personal`) the `personal_` ones."""
        extra = tuple(m.personal() for m in cls.personal_metrics(config)) if personal else ()
        return cls.metrics(config) + extra

    # -- the engine's needs --------------------------------------------------------------------
    def init_params(self, gen: torch.Generator) -> Tensor:
        raise NotImplementedError

    def draw_minibatches(self, clients: Tensor, steps: int, batch_size: int, gen: torch.Generator) -> Tensor:
        """Row indices `[steps, S, b]` into the flat data: for every step and sampled client, a
        minibatch drawn without replacement from that client's samples (as in the released code of Bao
        et al., ICML 2022). With `caps_batches`, a client with n_k < b takes all its n_k samples and the
        missing picks are row −1 (zero weight in `gather`)."""
        width = min(batch_size, self.max_size) if self.caps_batches else batch_size
        # The b largest of i.i.d. uniform keys are a uniform subset; topk is ~4x cheaper than argsort here.
        keys = torch.rand(steps, len(clients), self.max_size, generator=gen)
        if not self.equal_sizes:  # padding positions beyond a client's n_k are never picked
            keys.masked_fill_(torch.arange(self.max_size) >= self.client_sizes_cpu[clients][:, None], -1.0)
        picks = keys.topk(width, dim=-1, sorted=False).indices
        rows = (self.client_offsets_cpu[clients][:, None] + picks).to(self.device)
        if not self.caps_batches:
            return rows
        ends = self.client_offsets_cpu[clients + 1].to(self.device)
        rows.masked_fill_(rows >= ends[:, None], -1)  # the picks of padding positions
        return F.pad(rows, (0, batch_size - width), value=-1)

    def gather(self, rows: Tensor) -> Any:
        """The minibatch of one local step for all sampled clients, from `rows` `[S, b]` (a tuple of
        tensors with a leading client axis). Problems that provide `full_data` accept row −1 (padding
        beyond a client's n_k) and give it zero weight."""
        raise NotImplementedError

    def minibatch_noise(self, rows: Tensor, gen: torch.Generator) -> Tensor | None:
        """The random perturbation a step's minibatch `rows` `[S, b]` carries (pAUC's per-client feature noise), one
        entry per row in the rows' order, whatever their leading axes (the engine concatenates the runs' noise,
        each drawn on its run's stream); drawn on the simulation's own stream (`RoundSampler`), so that it follows
        the run's seed and not the problem instance's; None for problems without one."""
        return None

    def step_oracle(self, rows: Tensor, noise: Tensor | None = None) -> Oracle:
        """The oracle of one declared minibatch of one local step, with its `minibatch_noise` (X-risk problems
        return a richer oracle)."""
        return Oracle(self, self.gather(rows))

    def full_data(self, clients: Tensor) -> Oracle:
        """An oracle over the whole training data of `clients` `[C]` (rows padded to the largest client's n_k
        and masked; built on the compute device, without a host synchronisation); for many clients use
        `client_loss`/`client_grad`, which bound the memory."""
        clients = clients.to(self.device)
        position = torch.arange(self.max_size, device=self.device)
        rows = self.client_offsets[clients][:, None] + position
        return Oracle(self, self.gather(rows.masked_fill(position >= self.client_sizes[clients][:, None], -1)))

    @over_runs
    def client_loss(self, w: Tensor, clients: Tensor) -> Tensor:
        """L_k(w_k) on each client's full training data, `w` `[C, d]` -> `[C]` (over runs: `over_runs`)."""
        return torch.cat(self._by_chunk(clients, Oracle.loss, w))

    @over_runs
    def client_grad(self, w: Tensor, clients: Tensor) -> Tensor:
        """∇L_k(w_k) on each client's full training data, `w` `[C, d]` -> `[C, d]` (over runs: `over_runs`)."""
        return torch.cat(self._by_chunk(clients, Oracle.grad, w))

    @over_runs
    def client_loss_and_grad(self, w: Tensor, clients: Tensor) -> tuple[Tensor, Tensor]:
        """(L_k(w_k), ∇L_k(w_k)) on each client's full training data, gathering each chunk once."""
        parts = self._by_chunk(clients, lambda oracle, point: (oracle.loss(point), oracle.grad(point)), w)
        return torch.cat([loss for loss, _ in parts]), torch.cat([grad for _, grad in parts])

    @over_runs
    def client_hvp(self, w: Tensor, v: Tensor, clients: Tensor) -> Tensor:
        """∇²L_k(w_k) v_k on each client's full training data, `[C, d]`."""
        return torch.cat(self._by_chunk(clients, Oracle.hvp, w, v))

    def _by_chunk(self, clients: Tensor, compute, *per_client: Tensor) -> list:
        """`compute(full-data oracle, *rows)` on chunks of clients whose gathered data stay under FULL_DATA_CHUNK
        elements; `per_client` tensors `[C, ...]` are split alongside the clients."""
        step = max(1, FULL_DATA_CHUNK // (self.max_size * (self.row_elements or self.dim)))
        return [compute(self.full_data(clients[start: start + step]), *(t[start: start + step] for t in per_client))
                for start in range(0, len(clients), step)]

    # -- the loss and its derivatives, batched over clients ---------------------------------------
    def minibatch_loss(self, w: Tensor, batch: Any) -> Tensor:
        """The smooth loss of one client's minibatch at `w` `[d]`: `batch` is `gather`'s tuple without its
        client axis. torch.func lifts it to `loss`, `grad` and `hvp` for all clients at once."""
        raise NotImplementedError

    def loss(self, w: Tensor, batch: Any) -> Tensor:
        """Minibatch loss at `w` `[S, d]`, one value per client: `[S]`."""
        return vmap(self.minibatch_loss)(w, batch)

    def grad(self, w: Tensor, batch: Any) -> Tensor:
        """Minibatch gradient of the smooth loss at `w` `[S, d]`, one row per sampled client."""
        return vmap(func_grad(self.minibatch_loss))(w, batch)

    def hvp(self, w: Tensor, v: Tensor, batch: Any) -> Tensor:
        """∇²f(w_k; batch_k) v_k for every client; problems with a closed form override it (`exact_hvp`)."""
        return self.autograd_hvp(w, v, batch)

    def autograd_hvp(self, w: Tensor, v: Tensor, batch: Any) -> Tensor:
        """∇²f(w_k; batch_k) v_k by double backward through the batched loss: the clients' losses are
        independent, so ∇_w ⟨∇_w Σ_k f(w_k), v⟩ holds every client's product (measured 2x faster here than
        torch.func's vmapped forward-over-reverse jvp of the gradient, which gives the same values)."""
        point = w.detach().requires_grad_(True)
        with torch.enable_grad():
            gradient = torch.autograd.grad(self.loss(point, batch).sum(), point, create_graph=True)[0]
            return torch.autograd.grad((gradient * v).sum(), point)[0]

    def evaluate(self, w: Tensor, personal: Tensor | None = None) -> dict[str, float]:
        """The declared metrics of the global model `w` `[d]`, then, given per-client models `personal`
        `[N, d]`, those of `evaluate_personal` with the `personal_` prefix."""
        metrics = self.evaluate_global(w)
        if personal is not None:
            metrics.update({f"personal_{k}": v for k, v in self.evaluate_personal(personal).items()})
        return metrics

    def evaluate_runs(self, ws: Tensor, personals: Tensor | None = None) -> list[dict[str, float]]:
        """The metrics of K runs' models (`ws[k]`, `personals[k]`), e.g. the runs of a batch (`fedbench.runs`);
        one `evaluate` each unless the problem evaluates all runs in one pass over its data."""
        return [self.evaluate(w, None if personals is None else personals[k]) for k, w in enumerate(ws)]

    def evaluate_global(self, w: Tensor) -> dict[str, float]:
        raise NotImplementedError

    def parameters(self, w: Tensor) -> dict[str, Tensor]:
        """A model `[d]` in the problem's own shapes, by name (views of `w`; a saved model's `parameters`,
        `fedbench.saved`): the layers of its MLP (`layer1.weight` `[in, out]`, `layer1.bias` `[out]`, ...) where it
        has one, else the vector itself as `w`."""
        model = getattr(self, "model", None)
        if not isinstance(model, MLP):
            return {"w": w}
        named = {}
        for depth, (weight, bias) in enumerate(model.layers(w), 1):
            named[f"layer{depth}.weight"] = weight
            if bias is not None:
                named[f"layer{depth}.bias"] = bias
        return named

    def evaluate_personal(self, models: Tensor) -> dict[str, float]:
        """Each client's model `models[k]` on client k's own data, averaged as the problem's metrics are."""
        raise NotImplementedError(f"{self.name} does not evaluate personal models")

    def _set_clients(self, sizes: Tensor) -> None:
        self.client_sizes_cpu = sizes.cpu()
        self.client_offsets_cpu = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)]).cpu()
        self.num_clients = len(sizes)
        self.max_size = int(sizes.max())
        self.equal_sizes = bool((sizes == self.max_size).all())
        self.client_sizes = sizes.to(self.device)
        self.client_offsets = self.client_offsets_cpu.to(self.device)
