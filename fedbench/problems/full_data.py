"""The oracles over each client's whole training data (`FullDataOracles`): an `Oracle` on all rows of some clients
(`full_data`), and their losses, gradients and Hessian-vector products at a point per client, in chunks of clients
that bound the memory, lifted over the engine's runs (`fedbench.oracle.over_runs`).
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch
from torch import Tensor

from fedbench.oracle import Oracle, over_runs

FULL_DATA_CHUNK = 2**24  # elements of gathered features per chunk of clients in full-data oracles


class FullDataOracles:
    """The full-data oracles of `fedbench.problems.base.Problem` (what an algorithm that requires `full_data` calls:
    SCAFFOLD's option I control variates, the exact gradients of Hanzely et al.'s methods), built on its `gather`
    and its clients' rows (`fedbench.problems.sampling.ClientRows`)."""

    # what they read of the problem
    row_elements: ClassVar[int | None]
    dim: int
    device: torch.device
    max_size: int
    client_sizes: Tensor
    client_offsets: Tensor
    gather: Callable[[Tensor], Any]

    def full_data(self, clients: Tensor) -> Oracle:
        """An oracle over the whole training data of `clients` `[C]`: `gather` of rows `[C, n_max]`, each client's
        padded with row −1 to the largest client's n_k (built on the compute device, without a host
        synchronisation). For many clients use `client_loss`/`client_grad`, which bound the memory. A problem that
        provides `full_data` may override it (the block problems' oracle).

        Example:
            Every client's full-data gradient at its own point `w` `[C, d]`:

            ```python
            problem.full_data(clients).grad(w)                      # [C, d]
            ```
        """
        clients = clients.to(self.device)
        position = torch.arange(self.max_size, device=self.device)
        rows = self.client_offsets[clients][:, None] + position
        return Oracle(self, self.gather(rows.masked_fill(position >= self.client_sizes[clients][:, None], -1)))

    @over_runs
    def client_loss(self, w: Tensor, clients: Tensor) -> Tensor:
        """L_k(w_k), the smooth loss of each client on its whole training data (`minibatch_loss` of a batch of all
        its samples): h is not included (add `self.regularizer.value(w)` for the composite objective). Needs
        `full_data`.

        Args:
            w: a point per client, `[C, d]`; over runs (`over_runs`), `[R, C, d]`, or `[R, 1, d]` for every client's.
            clients: the clients `[C]`; over runs, `[R, C]` or `[C]` (the same in every run).

        Returns:
            `[C]`; over runs, `[R, C]`.

        Example:
            In a round, each sampled client's loss at the server model `[R, 1, d]`:

            ```python
            losses = self.problem.client_loss(server["w"], rnd.clients)    # [R, S]
            ```
        """
        return torch.cat(self._by_chunk(clients, Oracle.loss, w))

    @over_runs
    def client_grad(self, w: Tensor, clients: Tensor) -> Tensor:
        """∇L_k(w_k), the gradient of each client's smooth loss on its whole training data (h not included). Needs
        `full_data`.

        Args:
            w: a point per client, `[C, d]`; over runs (`over_runs`), `[R, C, d]`, or `[R, 1, d]` for every client's.
            clients: the clients `[C]`; over runs, `[R, C]` or `[C]`.

        Returns:
            `[C, d]`; over runs, `[R, C, d]`.

        Example:
            SCAFFOLD's option I control variate, at the server model (Algorithm 1 line 12):

            ```python
            c_new = self.problem.client_grad(local["x"], rnd.clients)    # x [R, 1, d] -> [R, S, d]
            ```
        """
        return torch.cat(self._by_chunk(clients, Oracle.grad, w))

    @over_runs
    def client_loss_and_grad(self, w: Tensor, clients: Tensor) -> tuple[Tensor, Tensor]:
        """`client_loss` and `client_grad` together, gathering each chunk of data once: `([C], [C, d])`, over runs
        `([R, C], [R, C, d])`.

        Example:
            ```python
            losses, grads = self.problem.client_loss_and_grad(points, everyone)    # points [N, d], everyone [N]
            ```
        """
        parts = self._by_chunk(clients, lambda oracle, point: (oracle.loss(point), oracle.grad(point)), w)
        return torch.cat([loss for loss, _ in parts]), torch.cat([grad for _, grad in parts])

    @over_runs
    def client_hvp(self, w: Tensor, v: Tensor, clients: Tensor) -> Tensor:
        """∇²L_k(w_k) v_k on each client's whole training data: `w`, `v` `[C, d]` (over runs, `[R, C, d]` or `[R, 1,
        d]`) -> `[C, d]` (`[R, C, d]`).

        Example:
            ```python
            products = self.problem.client_hvp(w, v, clients)
            ```
        """
        return torch.cat(self._by_chunk(clients, Oracle.hvp, w, v))

    def _by_chunk(self, clients: Tensor, compute, *per_client: Tensor) -> list:
        """`compute(full-data oracle, *rows)` on chunks of clients whose gathered data stay under FULL_DATA_CHUNK
        elements; `per_client` tensors `[C, ...]` are split alongside the clients."""
        step = max(1, FULL_DATA_CHUNK // (self.max_size * (self.row_elements or self.dim)))
        return [compute(self.full_data(clients[start: start + step]), *(t[start: start + step] for t in per_client))
                for start in range(0, len(clients), step)]
