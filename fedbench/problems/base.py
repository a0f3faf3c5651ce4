"""What a federated problem provides to the engine: the contract a problem writes (`Problem`).

A problem owns its federated data, the smooth loss f (one client's minibatch loss, `minibatch_loss`:
torch.func's vmap lifts it to every client's loss at once, and the gradients and Hessian-vector products that
oracles serve are backward passes through that batched loss, the gradient's replayed from a trace of it
(`fedbench.problems.traces`); problems override `loss`/`grad`/`hvp` where a hand-written form is faster), the
regularizer h, the initial point, its declared metrics and their evaluation, and the capabilities it provides beyond
minibatch gradients (`fedbench.contract`). Parameters are flat vectors `[d]`; a batch of clients is `[S, d]`. The
engine lifts the oracles over its runs, so that an algorithm's local step calls them at `[R, S, d]`
(`fedbench.oracle`), and a problem sees clients alone unless it declares `oracles_take_runs`.

`Problem` is assembled from its parts: what is read before it is built (`fedbench.problems.spec.ProblemSpec`), its
clients' rows and the draws of minibatches from them (`fedbench.problems.sampling.ClientRows`) and the oracles over
each client's whole data (`fedbench.problems.full_data.FullDataOracles`); this module holds the instance's own hooks.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.func import vmap

from fedbench.networks.mlp import MLP
from fedbench.oracle import Oracle
from fedbench.problems.full_data import FULL_DATA_CHUNK, FullDataOracles
from fedbench.problems.sampling import ClientRows, padded_rows
from fedbench.problems.spec import Layout, ProblemSpec
from fedbench.problems.traces import SLOT, replayed
from fedbench.prox import Regularizer

__all__ = ["CONTRACT", "FULL_DATA_CHUNK", "Layout", "Problem", "ProblemSpec", "padded_rows"]

CONTRACT = ("name", "params", "metrics", "init_params", "gather", "minibatch_loss", "evaluate_global")
"""The names every problem writes itself; the engine derives the rest from them, or has a default for it. A plugin
that lacks one of them is refused (`fedbench.plugins`)."""


class Problem(ProblemSpec, ClientRows, FullDataOracles):
    """A federated problem: its data split over N clients, one client's smooth minibatch loss f (from which
    every client's loss, gradient and Hessian-vector products are derived at once), the regularizer h, the
    initial point, its metrics, and the capabilities it provides (`fedbench.contract`). The objective is
    F(w) = Σ_k π_k L_k(w) + h(w), L_k client k's loss over its training samples.

    The contract (`CONTRACT`): a problem writes seven names.

    - `name`, `params`: what recipes call it and may set (class attributes, `ProblemSpec`);
    - `metrics(config)`: the metrics of a global model, each with the direction that is better (a classmethod,
      `ProblemSpec`);
    - `init_params(gen)`: a run's initial point `[d]`;
    - `gather(rows)`: the data of row indices `[S, b]`, as a tuple of tensors with those leading axes;
    - `minibatch_loss(w, batch)`: one client's smooth loss on its minibatch, a scalar;
    - `evaluate_global(w)`: the metrics' values at one run's global model (a problem whose rows need per-client
      blocks, `evaluates_global_model = False`, overrides `evaluate` instead, as the block problems of `pfl` do).

    An instance is built from a resolved config (`resolve_config`), a seed and a device: its `__init__` calls
    `super().__init__(config, seed, device)`, then builds its data and sets `dim`, `regularizer`, `client_weights`
    and the clients' layout by `self._set_clients(sizes)` (`sizes` `[N]`, the samples of each client, whose rows
    are contiguous in the flat data: client k's are `client_offsets[k]` to `client_offsets[k + 1] − 1`).

    Every other name has a default, which its docstring states: the declarations and config hooks read before
    building (`ProblemSpec`: `presets`, `provides`, `check`, `declared_layout`, `capabilities`, the memory a run
    holds, ...), the draws of minibatches (`ClientRows`), the full-data oracles (`FullDataOracles`), and here a
    batched `loss`/`grad`/`hvp`, `step_oracle` and `minibatch_noise`, `evaluate_personal`, `parameters`.

    Example:
        The how-to's least squares (`docs/how-to/write-a-problem.md`), in outline:

        ```python
        class DriftingLeastSquares(Problem):
            name = "drifting_lsq"
            params = (Param("clients", "int", 20, "number of clients N", low=1), ...)

            def __init__(self, config, seed, device="cpu"):
                super().__init__(config, seed, device)
                ...                                                   # x [N·n, d], y [N·n]
                self._set_clients(torch.full((n_clients,), n, dtype=torch.long))
                self.client_weights = torch.full((n_clients,), 1 / n_clients, dtype=torch.float64)
                self.regularizer = NoRegularizer()

            def gather(self, rows):                                   # [S, b] -> ([S, b, d], [S, b])
                return self.features[rows], self.labels[rows]

            def minibatch_loss(self, w, batch):                       # one client: w [d], x [b, d], y [b]
                x, y = batch
                return 0.5 * (x @ w - y).square().mean()
        ```
    """

    dim: int
    """d, the length of the flat parameter vector."""
    regularizer: Regularizer
    """h, the regularizer (`fedbench.prox`: `NoRegularizer`, `L1`, the nuclear norm, ...), `Algorithm.reg`."""
    client_weights: Tensor
    """`[N]`: π_k of the global objective Σ π_k L_k + h, summing to 1."""

    def __init__(self, config: dict[str, Any], seed: int, device: str | torch.device = "cpu"):
        """The problem of a resolved `config` (checked by `check`) and a trial `seed` on `device`."""
        self.check(config)
        self.config = config
        """The resolved config, by parameter name."""
        self.seed = seed
        """The trial seed."""
        self.data_seed = seed if config.get("data_seed") is None else config["data_seed"]
        """The seed of the data: the config's `data_seed` where it sets one, else the trial seed."""
        self.device = torch.device(device)
        """The device its data and the runs' state live on."""

    def __getstate__(self) -> dict[str, Any]:
        """Its attributes, for pickling (a Ray worker's copy, a deep copy), without the traces of its default gradient
        (`grad`), which the copy makes anew."""
        return {name: value for name, value in vars(self).items() if name != SLOT}

    # -- the contract: what every problem writes (with `name`, `params` and `metrics`) ---------------------------------
    def init_params(self, gen: torch.Generator) -> Tensor:
        """A run's initial point. No default: every problem defines it.

        Args:
            gen: the run's "init" stream.

        Returns:
            The initial point `[d]`, on the problem's device, in its dtype.

        Example:
            ```python
            def init_params(self, gen):
                return torch.zeros(self.dim, dtype=torch.float64, device=self.device)
            ```
        """
        raise NotImplementedError

    def gather(self, rows: Tensor) -> Any:
        """The data of the rows, for `minibatch_loss` (and the problem's oracles). No default: every problem
        defines it.

        Row −1 is padding: `full_data` pads each client's rows to the largest client's n_k with −1, and
        `caps_batches` fills a short client's minibatch with it. So a problem whose clients hold different numbers
        of samples and that provides `full_data` (or `caps_batches`) must accept row −1 and give it zero weight in
        the loss; one whose clients are of equal size never sees it.

        Args:
            rows: row indices into the flat data, `[S, b]` for a local step's minibatch (`[R·S, b]` for R runs; `[R,
                S, b]` where `oracles_take_runs`), or `[C, n_max]` for the whole data of C clients (`full_data`).

        Returns:
            A tuple of tensors with the rows' leading axes, e.g. features `[S, b, d]` and labels `[S, b]`.

        Example:
            Row weights that are zero on padding, so that the loss is each client's mean over its real rows
            (`fedbench/problems/classification.py`):

            ```python
            def gather(self, rows):
                valid = rows >= 0
                flat = rows.clamp_min(0).reshape(-1)
                x = self.x_train.index_select(0, flat).view(*rows.shape, self.x_train.shape[-1])
                return x, self.y_train[flat].view(rows.shape), valid / valid.sum(-1, keepdim=True)
            ```
        """
        raise NotImplementedError

    def minibatch_loss(self, w: Tensor, batch: Any) -> Tensor:
        """The smooth loss f of one client's minibatch, a scalar; torch.func's vmap lifts it to `loss` for all
        clients at once, which `grad` and `hvp` differentiate (so it must be written with torch operations on these
        tensors alone: no `.item()`, no Python branch on their values). No default: every problem defines it (or
        overrides `loss`). h is not part of it.

        Args:
            w: the client's point `[d]`.
            batch: `gather`'s tuple without its leading axes (e.g. `[b, d]` features, `[b]` labels).

        Returns:
            A scalar tensor.

        Example:
            ```python
            def minibatch_loss(self, w, batch):
                x, y = batch
                return 0.5 * (x @ w - y).square().mean()
            ```
        """
        raise NotImplementedError

    def evaluate_global(self, w: Tensor) -> dict[str, float]:
        """The values of `metrics` at the global model. No default: every problem defines it.

        Args:
            w: one run's global model `[d]` (`Algorithm.global_params`).

        Returns:
            A float per declared metric, by name.

        Example:
            ```python
            def evaluate_global(self, w):
                mse = (self.features @ w - self.labels).square().mean()
                return {"train_mse": float(mse), "distance": float(torch.linalg.vector_norm(w - self.center))}
            ```
        """
        raise NotImplementedError

    # -- the loss and its derivatives, batched over clients (defaults) -------------------------------------------------
    def loss(self, w: Tensor, batch: Any) -> Tensor:
        """The minibatch loss of every client at its point: `w` `[S, d]` -> `[S]`. Default: `minibatch_loss` lifted
        by `torch.func.vmap`; a problem overrides it where a batched form is faster.

        Example:
            A hand-written least-squares loss, ½ mean (⟨x, w⟩ − y)² per client:

            ```python
            def loss(self, w, batch):
                x, y = batch                                             # [S, b, d], [S, b]
                return 0.5 * (torch.einsum("sbd,sd->sb", x, w) - y).square().mean(-1)
            ```
        """
        return vmap(self.minibatch_loss)(w, batch)

    def grad(self, w: Tensor, batch: Any) -> Tensor:
        """The minibatch gradient of the smooth loss of every client at its point: `w` `[S, d]` -> `[S, d]`.
        Default: `autograd_grad` (one backward pass over the sum of the clients' losses), replayed from its trace
        (`fedbench.problems.traces`: the ATen operations it runs, recorded by make_fx for each layout of `w` and the
        batch once its untraced calls have cost as much, traced anew once any attribute of the problem is reassigned,
        the same values bit for bit; untraced where the loss draws random numbers, reads a tensor's value into
        Python or does not trace). On the least squares of the how-to "Write a problem" at S = 20, b = 50, d = 10
        (`bench/plugin_grad.py`, one thread of a loaded 2-core CPU, median of ten runs) it takes 1.2x the time of
        the hand-written einsum below, against 6.8x untraced and 9.6x for torch.func's `vmap(grad(minibatch_loss))`.
        A problem overrides it where its loss reads state that changes inside an attribute (a list's element), or
        to be fast from the first call (or overrides `loss` with a batched form, which the default goes through).

        Example:
            A hand-written least-squares gradient, (1/b) Xᵀ(Xw − y) per client:

            ```python
            def grad(self, w, batch):
                x, y = batch                                             # [S, b, d], [S, b]
                residual = torch.einsum("sbd,sd->sb", x, w) - y
                return torch.einsum("sbd,sb->sd", x, residual) / x.shape[-2]
            ```
        """
        return replayed(self, self.autograd_grad, w, batch)

    def autograd_grad(self, w: Tensor, batch: Any) -> Tensor:
        """The minibatch gradient of every client by one backward pass over the sum of their losses (`loss`: client
        k's loss depends on row k of w alone, so row k of the sum's gradient is its gradient), as `grad` computes it
        without its trace; faster than torch.func's `vmap(grad(minibatch_loss))`, which gives the same values
        (`bench/plugin_grad.py`).

        Example:
            ```python
            torch.testing.assert_close(problem.grad(w, batch), problem.autograd_grad(w, batch))
            ```
        """
        point = w.detach().requires_grad_(True)
        with torch.enable_grad():
            return torch.autograd.grad(self.loss(point, batch).sum(), point)[0]

    def hvp(self, w: Tensor, v: Tensor, batch: Any) -> Tensor:
        """∇²f(w_k; batch_k) v_k for every client: `w`, `v` `[S, d]` -> `[S, d]`. Default: `autograd_hvp`; problems
        with a closed form override it (and provide `exact_hvp`).

        Example:
            Least squares, (1/b) XᵀX v per client, whatever w:

            ```python
            def hvp(self, w, v, batch):
                x, _ = batch                                             # [S, b, d]
                return torch.einsum("sbd,sb->sd", x, torch.einsum("sbd,sd->sb", x, v)) / x.shape[-2]
            ```
        """
        return self.autograd_hvp(w, v, batch)

    def autograd_hvp(self, w: Tensor, v: Tensor, batch: Any) -> Tensor:
        """∇²f(w_k; batch_k) v_k by double backward through the batched loss: the clients' losses are
        independent, so ∇_w ⟨∇_w Σ_k f(w_k), v⟩ holds every client's product (measured 2x faster here than
        torch.func's vmapped forward-over-reverse jvp of the gradient, which gives the same values).

        Example:
            A closed form checked against it:

            ```python
            torch.testing.assert_close(problem.hvp(w, v, batch), problem.autograd_hvp(w, v, batch))
            ```
        """
        point = w.detach().requires_grad_(True)
        with torch.enable_grad():
            gradient = torch.autograd.grad(self.loss(point, batch).sum(), point, create_graph=True)[0]
            return torch.autograd.grad((gradient * v).sum(), point)[0]

    # -- a local step's oracle -----------------------------------------------------------------------------------------
    def minibatch_noise(self, rows: Tensor, gen: torch.Generator) -> Tensor | None:
        """The random perturbation a step's minibatch `rows` `[S, b]` carries (pAUC's per-client feature noise), one
        entry per row in the rows' order, whatever their leading axes (the engine concatenates the runs' noise,
        each drawn on its run's stream); drawn on the simulation's own stream (`RoundSampler`), so that it follows
        the run's seed and not the problem instance's. `step_oracle` receives it. Default None, for problems
        without one (`noisy_minibatches`).

        Example:
            pAUC's ε ~ N(0, I) per row:

            ```python
            def minibatch_noise(self, rows, gen):
                return torch.randn(rows.numel(), self.feature_dim, generator=gen, dtype=self.dtype).to(self.device)
            ```
        """
        return None

    def step_oracle(self, rows: Tensor, noise: Tensor | None = None) -> Oracle:
        """The oracle of one declared minibatch of one local step, with its `minibatch_noise` (X-risk problems
        return a richer oracle). Default: an `Oracle` on `gather(rows)`.

        Args:
            rows: the step's rows `[S, b]` (`[R·S, b]` for R runs; `[R, S, b]` where `oracles_take_runs`).
            noise: the rows' `minibatch_noise`, or None.

        Returns:
            The oracle `client_step` sees as `batches.D` (lifted over the run axis by the engine).

        Example:
            Least squares serves a hand-written oracle on the rows:

            ```python
            def step_oracle(self, rows, noise=None):
                return LeastSquaresOracle(self, rows)
            ```
        """
        return Oracle(self, self.gather(rows))

    # -- evaluation ----------------------------------------------------------------------------------------------------
    def evaluate(self, w: Tensor, personal: Tensor | None = None) -> dict[str, float]:
        """A metrics row: those of the global model `w` `[d]` (`evaluate_global`), then, given per-client models
        `personal` `[N, d]`, those of `evaluate_personal` with the `personal_` prefix.

        Example:
            ```python
            row = problem.evaluate(result.params, result.personal)    # {"objective": ..., "personal_...": ...}
            ```
        """
        metrics = self.evaluate_global(w)
        if personal is not None:
            metrics.update({f"personal_{k}": v for k, v in self.evaluate_personal(personal).items()})
        return metrics

    def evaluate_runs(self, ws: Tensor, personals: Tensor | None = None) -> list[dict[str, float]]:
        """The metrics of K runs' models (`ws` `[K, d]`, `personals` `[K, N, d]`), e.g. the runs of a batch
        (`fedbench.engine.runs`). Default: one `evaluate` each; a problem overrides it to evaluate all runs in one pass
        over its data.

        Example:
            ```python
            rows = problem.evaluate_runs(torch.stack([w_seed0, w_seed1]))    # [row of seed 0, row of seed 1]
            ```
        """
        return [self.evaluate(w, None if personals is None else personals[k]) for k, w in enumerate(ws)]

    def evaluate_personal(self, models: Tensor) -> dict[str, float]:
        """The values of `personal_metrics`: each client's model on its own data, averaged as the problem's
        metrics are. Default: refused (NotImplementedError), for problems without `personal_evaluation`.

        Args:
            models: one run's per-client models `[N, d]` (`Algorithm.personal_params`).

        Returns:
            A float per personal metric, by name (without the `personal_` prefix).

        Example:
            Each client's model on its own rows, the squared errors pooled over all samples:

            ```python
            def evaluate_personal(self, models):
                x = self.features.view(self.num_clients, -1, self.dim)          # [N, n, d]
                residual = torch.einsum("knd,kd->kn", x, models).reshape(-1) - self.labels
                return {"train_mse": float(residual.square().mean())}
            ```
        """
        raise NotImplementedError(f"{self.name} does not evaluate personal models")
    def parameters(self, w: Tensor) -> dict[str, Tensor]:
        """A model `[d]` in the problem's own shapes, by name (views of `w`; a saved model's `parameters`,
        `fedbench.engine.saved`): the layers of its MLP (`layer1.weight` `[in, out]`, `layer1.bias` `[out]`, ...) where
        it has one, else the vector itself as `w`.

        Example:
            A problem whose model is one matrix, without an intercept:

            ```python
            def parameters(self, w):
                return {"W": w.view(*self.shape)}
            ```
        """
        model = getattr(self, "model", None)
        if not isinstance(model, MLP):
            return {"w": w}
        named = {}
        for depth, (weight, bias) in enumerate(model.layers(w), 1):
            named[f"layer{depth}.weight"] = weight
            if bias is not None:
                named[f"layer{depth}.bias"] = bias
        return named

    # -- what the instance says of itself ------------------------------------------------------------------------------
    def choices(self) -> dict[str, str]:
        """What this instance chose for itself among equivalent ways to run (the same numbers to rounding), by
        name: a run prints them when it starts and records them as tags. Default: none.

        Example:
            A deep network's layout over the clients (`fedbench/problems/vision.py`):

            ```python
            def choices(self):
                return {"layout": self.layout_name}
            ```
        """
        return {}

    def layout(self) -> Layout:
        """The clients of this instance: their number and, unless the problem `caps_batches`, the smallest one's
        samples.

        Example:
            ```python
            federation.check(problem.layout())       # refuses a batch_size above the smallest client's samples
            ```
        """
        return Layout(self.num_clients, None if self.caps_batches else int(self.client_sizes_cpu.min()))
