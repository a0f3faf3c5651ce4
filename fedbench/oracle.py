"""What an algorithm's local step receives: one oracle per declared minibatch.

An oracle binds a problem to one gathered minibatch of the S sampled clients (or to the clients' whole
local data, `Problem.full_data`) and answers, at any batched point `w` `[S, d]`:

    oracle.loss(w)     -> [S]       the mean loss of each client's batch
    oracle.grad(w)     -> [S, d]    its gradient
    oracle.hvp(w, v)   -> [S, d]    its Hessian at w times v

The problem computes them (`Problem.loss/grad/hvp`: by default torch.func's vmap of its per-client batch loss
and backward passes through it, hand-written where that is faster). An algorithm declares its minibatches
(`Minibatch`); the engine draws each one that is not a reuse of another, and hands them to `client_step` as
`Batches`, so that `batches.D.grad(u)` reads like the paper's ∇f̃(u; D).

In `client_step` the oracles take the run axis too (the engine lifts them, or the problem's take it,
`Problem.oracles_take_runs`): `batches.D.grad(u)` at `u` `[R, S, d]` is `[R, S, d]`, `batches.D.loss(u)` `[R, S]`,
and a point the clients of a run share, `[R, 1, d]`, is each client's (`[R, S, d]` gradients). The loss is the
smooth f alone: h is the algorithm's to handle (`self.reg`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from torch import Tensor

Method = TypeVar("Method", bound=Callable[..., Any])


def over_runs(method: Method) -> Method:
    """A problem's full-data oracle (`client_grad(w, clients)`: points `[C, ...]`, clients `[C]`) lifted over a
    leading run axis as the minibatch oracles are: points `[R, C, ...]`, or `[R, 1, ...]` (each run's, every
    client's), with clients `[R, C]`, or `[C]` (the same in every run), give results `[R, C, ...]`. The runs' clients
    are one batch of R·C, each with its run's point: a client's values reduce over its own data only, so each run
    gets the numbers it gets alone.

    Example:
        How `Problem.client_grad` is declared:

        ```python
        @over_runs
        def client_grad(self, w, clients):          # [C, d], [C] -> [C, d]
            ...
        ```
    """
    @functools.wraps(method)
    def lifted(problem, *args):
        *points, clients = args
        if clients.dim() == 1 and all(point.dim() < 3 for point in points):
            return method(problem, *points, clients)
        run_count = clients.shape[0] if clients.dim() == 2 else next(p.shape[0] for p in points if p.dim() == 3)
        clients = clients.expand(run_count, -1)
        client_count = clients.shape[1]
        result = method(problem, *(point.expand(run_count, client_count, *point.shape[2:]).flatten(0, 1)
                                   for point in points), clients.flatten())

        def unfolded(value: Tensor) -> Tensor:
            return value.view(run_count, client_count, *value.shape[1:])

        return tuple(map(unfolded, result)) if isinstance(result, tuple) else unfolded(result)

    return lifted  # type: ignore[return-value]


@dataclass(frozen=True)
class Minibatch:
    """One minibatch an algorithm draws per local step (`Algorithm.minibatches`), by the name `client_step` reads
    it by (`batches.D`). `size`: the hyperparameter holding its size, or a fixed size (None: the federation's
    `batch_size`); `same_as`: another declared batch whose draw it reuses (no second draw).

    Example:
        A batch sized by the hyperparameter `outer_batch`, one of a single sample, and one that reuses D1's draw:

        ```python
        (Minibatch("D1", size="outer_batch"), Minibatch("J", size=1), Minibatch("D2", same_as="D1"))
        ```
    """
    name: str
    size: str | int | None = None
    same_as: str | None = None


class Oracle:
    """A problem bound to one gathered minibatch of the clients (`Problem.step_oracle`) or to their whole data
    (`Problem.full_data`). Its methods take a point per client, `[S, d]` (in `client_step`, `[R, S, d]` or `[R, 1,
    d]`: the module's docstring), and evaluate the smooth loss f only.

    Example:
        A gradient step and a Hessian-vector product on the step's batch `D`:

        ```python
        u = u - hp.client_lr * batches.D.grad(u)       # [R, S, d]
        hv = batches.D.hvp(u, v)                       # needs the problem's `hvp` capability
        ```
    """

    def __init__(self, problem, batch: Any):
        """The oracle of `problem` on `batch`, `gather`'s tuple."""
        self.problem = problem
        """The problem whose loss it evaluates."""
        self.batch = batch
        """The gathered data (`Problem.gather`'s tuple, leading axes the clients')."""

    def loss(self, w: Tensor) -> Tensor:
        """Each client's loss on its batch at its point: `w` `[S, d]` -> `[S]` (`Problem.loss`)."""
        return self.problem.loss(w, self.batch)

    def grad(self, w: Tensor) -> Tensor:
        """Each client's gradient of its batch loss at its point: `w` `[S, d]` -> `[S, d]` (`Problem.grad`)."""
        return self.problem.grad(w, self.batch)

    def descend(self, w: Tensor, lr: Tensor | float) -> Tensor:
        """Each client's gradient step on its batch from its point, `w - lr * grad(w)`: `w` `[S, d]`, `lr` a float or
        a tensor broadcasting against `[S, 1]` (one per client, or one value) -> `[S, d]`. A problem's oracle may take
        a shorter path to the same numbers bit for bit (the `vision` problem's in its `loop` layout writes each
        client's step in place of gathering its gradient into `[S, d]`)."""
        return w - lr * self.grad(w)

    def hvp(self, w: Tensor, v: Tensor) -> Tensor:
        """∇²f(w_k; batch_k) v_k for each client, `w`, `v` `[S, d]` -> `[S, d]`: the problem's HVP, a closed form
        where it has one (`exact_hvp`), else autograd's. An algorithm that calls it declares that it `requires`
        `hvp`."""
        return self.problem.hvp(w, v, self.batch)

    def autograd_hvp(self, w: Tensor, v: Tensor) -> Tensor:
        """autograd's HVP (`Problem.autograd_hvp`), whatever closed form the problem has."""
        return self.problem.autograd_hvp(w, v, self.batch)


class RunAxisOracle(Oracle):
    """An oracle of a problem whose step oracles take the run axis (`Problem.oracles_take_runs`): built on the rows
    `[R, S, b]` of R runs' clients (or `[S, b]`), it answers at points `[R, S, ...]` and at points a run's clients
    share, `[R, 1, ...]`, which the derivatives see as each client's (a derivative through the sum of the clients'
    losses would otherwise add up the clients' gradients of a shared point). `clients` is the rows' leading
    shape."""

    clients: tuple[int, ...]
    """The rows' leading shape, `(R, S)` or `(S,)`, which a subclass sets."""

    def each_client(self, point: Tensor) -> Tensor:
        """A point as each client's: `[R, 1, d]` expanded to `[R, S, d]` (a client's own point as it is)."""
        return point.expand(*self.clients, point.shape[-1])

    def grad(self, w: Tensor) -> Tensor:
        """`Oracle.grad` at each client's point (`each_client`): `[R, S, d]`."""
        return super().grad(self.each_client(w))

    def hvp(self, w: Tensor, v: Tensor) -> Tensor:
        """`Oracle.hvp` at each client's points (`each_client`): `[R, S, d]`."""
        return super().hvp(self.each_client(w), self.each_client(v))

    def autograd_hvp(self, w: Tensor, v: Tensor) -> Tensor:
        """`Oracle.autograd_hvp` at each client's points (`each_client`): `[R, S, d]`."""
        return super().autograd_hvp(self.each_client(w), self.each_client(v))


class Batches:
    """The oracles of one local step, by declared name (`batches.D`, `batches["D"]`): `client_step`'s `batches`.
    An attribute no `Minibatch` declares raises AttributeError, naming those declared.

    Example:
        Per-FedAvg's first-order meta-gradient reads its inner batch D and its outer batch D1:

        ```python
        v = batches.D1.grad(w - hp.alpha * batches.D.grad(w))
        ```
    """

    def __init__(self, oracles: dict[str, Oracle]):
        """The oracles by minibatch name."""
        self._oracles = oracles
        self.__dict__.update(oracles)  # `batches.D` a plain attribute: it is read at every local step

    def __getattr__(self, name: str) -> Oracle:  # only for a name that was not declared
        raise AttributeError(f"no minibatch {name!r} was declared (declared: {', '.join(self._oracles)})")

    def __getitem__(self, name: str) -> Oracle:
        return self._oracles[name]


class RunOracle:
    """A problem's oracle of R runs' minibatches, lifted over the run axis for every method it has: tensor
    arguments `[R, S, ...]` are folded to the `[R·S, ...]` the problem's oracle of the flattened batch answers (a
    point shared by a run's clients, `[R, 1, ...]`, expanded to each client first), tensor answers unfolded, and a
    function argument (a surrogate loss) sees unfolded tensors and gives folded ones. `loss`, `grad` and `hvp`,
    which every oracle has and every local step calls, take a shorter path to the same result (the generic one
    costs ~8 µs a call, ~10% of a Lasso step at p = 1024)."""

    def __init__(self, inner, count: int, clients: int):
        self.inner, self.count, self.clients = inner, count, clients  # R runs of S clients

    def _fold(self, x: Any) -> Any:
        if isinstance(x, Tensor):
            if x.dim() >= 2 and x.shape[0] == self.count:
                if x.shape[1] == 1 and self.clients > 1:
                    x = x.expand(self.count, self.clients, *x.shape[2:])
                return x.flatten(0, 1)
            return x
        if callable(x):
            return lambda *args: self._fold(x(*[self._unfold(a) for a in args]))
        return x

    def _unfold(self, x: Any) -> Any:
        if isinstance(x, Tensor):
            return x.view(self.count, -1, *x.shape[1:])
        if isinstance(x, tuple):
            return tuple([self._unfold(item) for item in x])
        return x

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if not callable(value):
            return self._unfold(value)
        count, clients, fold, unfold = self.count, self.clients, self._fold, self._unfold

        def lifted(*args, **kwargs):
            # `_fold` and `_unfold` inline for the usual arguments (`[R, S, ...]` tensors, and points `[R, 1, ...]`
            # a run's clients share), flags, and the usual answer (a tuple of tensors): this runs at every step
            folded = []
            for a in args:
                if isinstance(a, Tensor) and a.dim() >= 2 and a.shape[0] == count:
                    if a.shape[1] == 1 and clients > 1:
                        a = a.expand(count, clients, *a.shape[2:])
                    folded.append(a.flatten(0, 1))
                else:
                    folded.append(fold(a))
            if kwargs:
                kwargs = {k: v if isinstance(v, (bool, int, float)) else fold(v) for k, v in kwargs.items()}
            out = value(*folded, **kwargs)
            if isinstance(out, tuple):
                return tuple([a.view(count, -1, *a.shape[1:]) if isinstance(a, Tensor) else unfold(a) for a in out])
            return unfold(out)
        self.__dict__[name] = lifted  # the next call of this oracle's method (ASVRCD makes two a step) skips the lookup
        return lifted

    def _point(self, w: Tensor) -> Tensor:
        if w.shape[1] != self.clients:
            w = w.expand(self.count, self.clients, *w.shape[2:])
        return w.flatten(0, 1)

    def loss(self, w: Tensor) -> Tensor:
        return self.inner.loss(self._point(w)).view(self.count, self.clients)

    def grad(self, w: Tensor) -> Tensor:
        point = w.flatten(0, 1) if w.shape[1] == self.clients else self._point(w)
        return self.inner.grad(point).view(w.shape[0], self.clients, *w.shape[2:])

    def descend(self, w: Tensor, lr: Tensor | float) -> Tensor:
        point = w.flatten(0, 1) if w.shape[1] == self.clients else self._point(w)
        if isinstance(lr, Tensor) and lr.dim() >= 2:  # per run, `[R, 1, 1]` (or one value, `[1, 1, 1]`)
            lr = lr.expand(self.count, self.clients, *lr.shape[2:]).flatten(0, 1)
        return self.inner.descend(point, lr).view(w.shape[0], self.clients, *w.shape[2:])

    def hvp(self, w: Tensor, v: Tensor) -> Tensor:
        return self.inner.hvp(self._point(w), self._point(v)).view(w.shape[0], self.clients, *w.shape[2:])
