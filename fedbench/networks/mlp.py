"""Fully-connected models on flat parameter vectors, functional and batched over clients.

A model is a list of layer sizes (in, hidden..., out). Its parameters are one vector `[dim]`: for each layer
the weight matrix `[in, out]` stored row-major, then (with `bias`) its bias `[out]`. The forward pass takes
one parameter vector per client, `w` `[S, dim]`, and each client's inputs `x` `[S, b, in]`, and returns
`[S, b, out]` with one batched matrix product per layer: no loop over clients, and torch.func can
differentiate it (twice, for Hessian-vector products) or vmap it over one client's `[dim]`.

A linear classifier is `MLP((784, 10))`; the FeDXL scorer is `MLP((d, 64, 1))`; Per-FedAvg's network is
`MLP((784, 80, 60, 10), activation="elu")`.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

ACTIVATIONS = {"relu": torch.relu, "elu": F.elu, "tanh": torch.tanh}


class MLP:
    def __init__(self, sizes: Sequence[int], bias: bool = True, activation: str = "relu"):
        if len(sizes) < 2:
            raise ValueError(f"an MLP needs at least input and output sizes, found {tuple(sizes)}")
        self.sizes = tuple(int(n) for n in sizes)
        self.bias = bias
        self.activation = ACTIVATIONS[activation]
        self.dim = sum(i * o + (o if bias else 0) for i, o in zip(self.sizes, self.sizes[1:]))

    def layers(self, w: Tensor) -> list[tuple[Tensor, Tensor | None]]:
        """(weight `[..., in, out]`, bias `[..., out]` or None) of every layer: views into `w` `[..., dim]`."""
        out, start = [], 0
        lead = w.shape[:-1]
        for fan_in, fan_out in zip(self.sizes, self.sizes[1:]):
            weight = w[..., start: start + fan_in * fan_out].reshape(*lead, fan_in, fan_out)
            start += fan_in * fan_out
            bias = None
            if self.bias:
                bias = w[..., start: start + fan_out]
                start += fan_out
            out.append((weight, bias))
        return out

    def __call__(self, w: Tensor, x: Tensor) -> Tensor:
        """Outputs `[S, b, out]` for parameters `w` `[S, dim]` and inputs `x` `[S, b, in]`; or `[b, out]` for
        one client's `w` `[dim]` and `x` `[b, in]` (what torch.func's vmap sees)."""
        layers = self.layers(w)
        for depth, (weight, bias) in enumerate(layers):
            x = torch.matmul(x, weight)
            if bias is not None:
                x = x + bias.unsqueeze(-2)
            if depth < len(layers) - 1:
                x = self.activation(x)
        return x

    def init(self, gen: torch.Generator, dtype: torch.dtype = torch.float32) -> Tensor:
        """PyTorch's default initialisation of nn.Linear, in distribution: weight and bias of each layer
        uniform in ±1/√fan_in (one draw of the layer's fan_in·fan_out + fan_out values, in storage order)."""
        parts = []
        for fan_in, fan_out in zip(self.sizes, self.sizes[1:]):
            count = fan_in * fan_out + (fan_out if self.bias else 0)
            parts.append((torch.rand(count, generator=gen) * 2 - 1) / math.sqrt(fan_in))
        return torch.cat(parts).to(dtype)


def own_data_scores(model: MLP, models: Tensor, features: Callable[[Tensor], Tensor], labels: Tensor, sizes: Tensor,
                    chunk: int) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of a classifier over every client's rows, each client's rows scored by its
    own parameters `models[k]`, pooled over all rows. Rows are contiguous per client (`sizes` `[N]` on the CPU);
    `features(rows)` turns row indices into inputs. Clients go in chunks of about `chunk` padded rows, each chunk
    one batched forward pass."""
    offsets = sizes.cumsum(0) - sizes  # each client's first row
    width = max(1, int(sizes.max()))
    position = torch.arange(width)
    device = models.device
    loss = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    step = max(1, chunk // width)
    for start in range(0, len(sizes), step):
        valid = position < sizes[start: start + step, None]
        rows = (offsets[start: start + step, None] + position).masked_fill(~valid, 0).to(device)
        valid = valid.to(device)
        logits = model(models[start: start + step], features(rows))
        y = labels[rows]
        losses = logits.logsumexp(-1) - logits.gather(-1, y.unsqueeze(-1)).squeeze(-1)
        loss += (losses * valid).sum(dtype=torch.float64)
        correct += ((logits.argmax(-1) == y) & valid).sum()
    total = int(sizes.sum())
    return float(loss) / total, int(correct) / total
