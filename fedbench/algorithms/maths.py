"""The helpers of a round's maths that algorithms share: a client's copy of a server entry (`broadcast`), the weighted
mean over the clients (`aggregate`), the smooth-FL baselines' treatment of h (`composite_step`), a p-coin's round
length (`coin_flips_to_success`), per-client copies of the initial point (`per_client_copies`), and the runs'
values of a hyperparameter as a round's functions read them (`per_run`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from fedbench.algorithms.rounds import Round


def broadcast(w: Tensor, rnd: Round) -> Tensor:
    """The server entry `[R, 1, ...]` as a fresh local copy `[R, S, ...]` for the round's clients."""
    return w.expand(-1, rnd.clients.shape[-1], *w.shape[2:]).clone()


def aggregate(values: Tensor, weights: Tensor) -> Tensor:
    """Σ_k π̂_k values_k over the clients: values `[R, S, ...]`, weights `[R, S]` (summing to 1) -> `[R, 1, ...]`."""
    if values.shape[0] == 1:  # a run alone: one vector-matrix product (~10 µs less than a batched one of one)
        return (weights[0] @ values[0].flatten(1)).view(1, 1, *values.shape[2:])
    return torch.matmul(weights.unsqueeze(1), values.flatten(2)).view(values.shape[0], 1, *values.shape[2:])


def composite_step(reg, h_mode: str, x: Tensor, direction: Tensor, lr) -> Tensor:
    """x − lr·(direction + g), g ∈ ∂h(x) (`subgradient`), or prox_{lr·h}(x − lr·direction) (`prox`): how the
    smooth-FL baselines treat the nonsmooth h (subgradients in place of gradients, as the pFedFBE paper, ICLR 2023
    submission, §1, extends them; `prox` is an alternative of this project)."""
    if h_mode == "prox":
        return reg.prox(x - lr * direction, lr)
    if not reg.lam:  # h = 0: no zero subgradient to build and add in the inner loops
        return x - lr * direction
    return x - lr * (direction + reg.subgradient(x))


def coin_flips_to_success(p: float, gen: torch.Generator) -> int:
    """Flips of a p-coin up to and including its first success (>= 1): the length of a round that ends when
    the coin says communicate (a geometric random variable with mean 1/p)."""
    return int(torch.empty(()).geometric_(p, generator=gen))


def per_client_copies(w0: Tensor, num_clients: int) -> Tensor:
    """`[N, d]` rows all equal to w0, e.g. personal models that start at the initial point."""
    return w0.expand(num_clients, *w0.shape).clone()


HP_RANK = 3  # float hyperparameters are [R, 1, 1]: they broadcast against [R, 1, d] and [R, S, d]


def _is_float(value: Any) -> bool:
    return isinstance(value, float)


def per_run(values: list, dtype: torch.dtype, device) -> Any:
    """The runs' values of one hyperparameter or derived value: floats as a `[R, 1, 1]` tensor (`[1, 1, 1]` where
    every run has the same value: it broadcasts alike, and selecting runs then costs nothing), a dataclass of floats
    as the dataclass of such tensors, anything else the first run's (the runs share it, `why_not_batchable`)."""
    first = values[0]
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return dataclasses.replace(first, **{f.name: per_run([getattr(v, f.name) for v in values], dtype, device)
                                             for f in dataclasses.fields(first)})
    if _is_float(first):
        return torch.tensor(values if len(set(values)) > 1 else values[:1], dtype=dtype,
                            device=device).view(-1, *[1] * (HP_RANK - 1))
    return first
