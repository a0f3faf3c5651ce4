"""What a federated problem provides to the engine.

A problem owns its federated data, the smooth per-sample loss f (whose minibatch gradient the
algorithms call, for all sampled clients at once), the regularizer h, the initial point and the
metrics. Parameters are flat vectors `[d]`; a batch of clients is `[S, d]`.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor

from fedbench.hparams import Param, resolve
from fedbench.prox import Regularizer


class Problem:
    name: ClassVar[str]
    params: ClassVar[tuple[Param, ...]]
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    # True: a client with n_k < b takes all its n_k samples (spec 002 §2.0) and the problem's
    # draw_minibatches/grad handle the short batches, so b may exceed the smallest client.
    caps_batches: ClassVar[bool] = False

    num_clients: int
    dim: int
    regularizer: Regularizer
    client_sizes: Tensor  # [N] samples per client
    client_offsets: Tensor  # [N+1] clients' rows are contiguous in the flat data
    client_weights: Tensor  # [N] π_k of the global objective Σ π_k L_k + h, summing to 1

    def __init__(self, config: dict[str, Any], seed: int, device: str | torch.device = "cpu"):
        self.config = config
        self.seed = seed
        self.data_seed = seed if config.get("data_seed") is None else config["data_seed"]
        self.device = torch.device(device)

    @classmethod
    def resolve_config(cls, given: dict[str, Any]) -> dict[str, Any]:
        """Declared defaults, overlaid by the chosen preset, overlaid by `given`; all checked."""
        given = dict(given)
        preset = given.get("preset", next(p.default for p in cls.params if p.name == "preset"))
        if preset not in cls.presets:
            raise ValueError(f"{cls.name}.preset: expected one of {' | '.join(cls.presets)}, found {preset!r}")
        return resolve(cls.params, {**cls.presets[preset], **given}, cls.name)

    @classmethod
    def declared_clients(cls, config: dict[str, Any]) -> int | None:
        """The number of clients a resolved config makes, where it is known without building the problem
        (synthetic data), so that a recipe is checked before anything runs; None where it is not."""
        return config.get("clients")

    # -- the engine's needs --------------------------------------------------------------------
    def init_params(self, gen: torch.Generator) -> Tensor:
        raise NotImplementedError

    def draw_minibatches(self, clients: Tensor, steps: int, batch_size: int, gen: torch.Generator) -> Tensor:
        """Row indices `[steps, S, b]` into the flat data: for every step and sampled client, a
        minibatch drawn without replacement from that client's samples (spec 002 §2.0)."""
        # The b largest of i.i.d. uniform keys are a uniform subset; topk is ~4x cheaper than argsort here.
        keys = torch.rand(steps, len(clients), self.max_size, generator=gen)
        if not self.equal_sizes:  # padding positions beyond a client's n_k are never picked
            keys.masked_fill_(torch.arange(self.max_size) >= self.client_sizes_cpu[clients][:, None], -1.0)
        picks = keys.topk(batch_size, dim=-1, sorted=False).indices
        return (self.client_offsets_cpu[clients][:, None] + picks).to(self.device)

    def gather(self, rows: Tensor) -> Any:
        """The minibatch of one local step for all sampled clients, from `rows` `[S, b]`."""
        raise NotImplementedError

    def step_oracle(self, rows: Tensor) -> Callable[[Tensor], Tensor]:
        """What `client_step` receives for one local step: `oracle(w [S,d]) -> [S,d]` is the minibatch
        gradient. Problems whose algorithms need more than a gradient (the scores of X-risk
        problems, `pauc.py`) return an object that is also callable this way."""
        return partial(self.grad, batch=self.gather(rows))

    def grad(self, w: Tensor, batch: Any) -> Tensor:
        """Minibatch gradient of the smooth loss at `w` `[S, d]`, one row per sampled client."""
        raise NotImplementedError

    def evaluate(self, w: Tensor, personal: Tensor | None = None) -> dict[str, float]:
        """Metrics of the global model `w` `[d]` (and of per-client models `personal` `[N, d]`)."""
        raise NotImplementedError

    def _set_clients(self, sizes: Tensor) -> None:
        self.client_sizes_cpu = sizes.cpu()
        self.client_offsets_cpu = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)]).cpu()
        self.num_clients = len(sizes)
        self.max_size = int(sizes.max())
        self.equal_sizes = bool((sizes == self.max_size).all())
        self.client_sizes = sizes.to(self.device)
        self.client_offsets = self.client_offsets_cpu.to(self.device)
