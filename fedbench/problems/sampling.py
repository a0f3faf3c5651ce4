"""The clients' rows of a built problem and the minibatches drawn from them: client k's training samples are the
contiguous rows `client_offsets[k]` to `client_offsets[k + 1] − 1` of the flat data (`ClientRows._set_clients`), and
a local step's minibatch is a tensor of row indices `[steps, S, b]`, row −1 padding (`padded_rows`).
"""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from fedbench.rng import largest_keys


def padded_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """A gather's rows `[..., b]`, padding −1 included, as flat indices into the pool `[... · b]` (padding reads row
    0) and each row's weight `[..., b]`: 1/b_valid, 0 on padding, so that a loss is each client's mean over its real
    rows (a client without any, past its last step of an epoch, weighs nothing)."""
    valid = rows >= 0
    return rows.clamp_min(0).reshape(-1), valid / valid.sum(-1, keepdim=True).clamp_min(1)


class ClientRows:
    """The layout of a problem's clients over its flat data, and the draws of their minibatches and epochs
    (`draw_minibatches`, `draw_epochs`), which the engine makes on each run's "minibatches" stream. Part of
    `fedbench.problems.base.Problem`, whose `__init__` sets the layout by `_set_clients`."""

    caps_batches: ClassVar[bool]  # `ProblemSpec.caps_batches`
    device: torch.device  # `Problem.device`
    num_clients: int
    """N, the number of clients (`_set_clients`)."""
    client_sizes: Tensor
    """`[N]`: the training samples n_k of each client (`_set_clients`)."""
    client_offsets: Tensor
    """`[N + 1]`: client k's rows of the flat data are `client_offsets[k]` to `client_offsets[k + 1] − 1`."""
    client_sizes_cpu: Tensor
    """`client_sizes` on the CPU, where the draws are made."""
    client_offsets_cpu: Tensor
    """`client_offsets` on the CPU."""
    max_size: int
    """The largest client's n_k."""
    equal_sizes: bool
    """Whether every client holds `max_size` samples."""

    def draw_minibatches(self, clients: Tensor, steps: int, batch_size: int, gen: torch.Generator) -> Tensor:
        """Row indices into the flat data: for every step and sampled client, a minibatch drawn without
        replacement from that client's samples (as in the released code of Bao et al., ICML 2022). With
        `caps_batches`, a client with n_k < b takes all its n_k samples and the missing picks are row −1 (zero
        weight in `gather`). A problem overrides it to draw otherwise (pAUC's class-balanced batches).

        Args:
            clients: the sampled clients `[S]` (CPU).
            steps: the local steps to draw for.
            batch_size: b.
            gen: the run's "minibatches" stream.

        Returns:
            Rows `[steps, S, b]`, on the problem's device.

        Example:
            The rows of E = 10 local steps of the clients 3 and 7, 5 samples each:

            ```python
            rows = problem.draw_minibatches(torch.tensor([3, 7]), 10, 5, generator(0, "minibatches"))  # [10, 2, 5]
            ```
        """
        width = min(batch_size, self.max_size) if self.caps_batches else batch_size
        # The b largest of i.i.d. uniform keys are a uniform subset: a topk (an nth_element per row), ~4x cheaper than
        # an argsort here on fresh keys (85 µs against 370 µs at E = S = 10, n_k = 128) and most of a round's draws.
        keys = torch.rand(steps, len(clients), self.max_size, generator=gen)
        if not self.equal_sizes:  # padding positions beyond a client's n_k are never picked
            keys.masked_fill_(torch.arange(self.max_size) >= self.client_sizes_cpu[clients][:, None], -1.0)
        picks = largest_keys(keys, width)
        rows = (self.client_offsets_cpu[clients][:, None] + picks).to(self.device)
        if not self.caps_batches:
            return rows
        ends = self.client_offsets_cpu[clients + 1].to(self.device)
        rows.masked_fill_(rows >= ends[:, None], -1)  # the picks of padding positions
        return F.pad(rows, (0, batch_size - width), value=-1)

    def draw_epochs(self, clients: Tensor, epochs: int, steps: int, batch_size: int, gen: torch.Generator) -> Tensor:
        """Row indices of `epochs` passes over each sampled client's samples (`federation.local_steps: {epochs: E}`,
        `fedbench.axes.participation`): client k's E·n_k picks are its passes one after another, each pass a fresh
        uniform permutation of its samples, cut into consecutive batches of b; its last batch is short and its steps
        past ⌈E·n_k / b⌉ are all padding (row −1, weighing nothing in `gather`).

        Args:
            clients: the sampled clients `[S]` (CPU).
            epochs: E.
            steps: the round's steps, at least the most any of the clients takes.
            batch_size: b.
            gen: the run's "minibatches" stream.

        Returns:
            Rows `[steps, S, b]`, on the problem's device.
        """
        sizes = self.client_sizes_cpu[clients][:, None]  # [S, 1]
        keys = torch.rand(epochs, len(clients), self.max_size, generator=gen)
        keys.masked_fill_(torch.arange(self.max_size) >= sizes, 2.0)  # a client's padding positions sort last
        orders = keys.argsort(-1)  # [E, S, n_max]: each pass, a uniform permutation of the client's positions first
        place = torch.arange(steps * batch_size)  # a pick's place in the client's sequence of passes
        passes, within = place // sizes, place % sizes  # [S, steps · b]
        picks = orders[passes.clamp_max(epochs - 1), torch.arange(len(clients))[:, None], within]
        rows = torch.where(passes < epochs, self.client_offsets_cpu[clients][:, None] + picks, -1)
        return rows.view(len(clients), steps, batch_size).transpose(0, 1).contiguous().to(self.device)

    def _set_clients(self, sizes: Tensor) -> None:
        """The clients' layout from their training samples `sizes` `[N]` (rows of a client contiguous in the flat
        data, in client order): `num_clients`, `client_sizes`, `client_offsets` (and their CPU copies), `max_size`."""
        self.client_sizes_cpu = sizes.cpu()
        self.client_offsets_cpu = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)]).cpu()
        self.num_clients = len(sizes)
        self.max_size = int(sizes.max())
        self.equal_sizes = bool((sizes == self.max_size).all())
        self.client_sizes = sizes.to(self.device)
        self.client_offsets = self.client_offsets_cpu.to(self.device)
