"""The shape every federated algorithm takes: small functions on batched client state.

The engine (`fedbench.simulate`) owns client sampling, minibatch draws, gathering and scattering of
per-client state, evaluation and communication accounting. An algorithm says what one round does,
for the S participating clients at once (every local tensor has a leading `[S, ...]` axis):

    local            = client_init(server, rows, rnd)            # rows: per-client state of the sampled
    local            = client_step(local, batches, rnd, step)     # run rnd.local_steps times
    message, rows    = client_final(local, rnd)                   # message: what clients upload
    server           = server_update(server, message, weights, rnd)

`batches` holds one oracle per declared minibatch (`minibatches()`, default one batch `D` of the
federation's batch size): `batches.D.grad(u)` is ∇f̃(u; D) for every client, `.loss` and `.hvp` too
(`fedbench.oracle`). State that lives across rounds for every client (personal models, control variates,
dual variables) is declared by `init_clients` as `[N, ...]` tensors; the engine gathers the sampled rows
before `client_init` and scatters the rows returned by `client_final`.

Beyond that shape an algorithm may declare: `requires` (capabilities the problem must provide,
`fedbench.contract`), `participation = "all"` (every client every round instead of S sampled ones),
`round_length` (how many local iterations a round has, e.g. a geometric number for a p-coin), and it
draws its own randomness from `rnd.gen`, a generator of (trial seed, `random_stream`) that nothing
else draws from. Hyperparameters are plain values used arithmetically, so that they could become
per-run tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor

from fedbench import contract
from fedbench.hparams import Param, resolve
from fedbench.metrics import Metric
from fedbench.oracle import Batches, Minibatch

State = dict[str, Tensor]

CLIENT_LR = Param("client_lr", "float", 1e-3, "client step size η_c", low=0, low_open=True, log=True)
SERVER_LR = Param("server_lr", "float", 1.0, "server step size η_s", low=0, low_open=True, log=True)
H_MODE = Param("h_mode", "choice", "subgradient", "treatment of h in local steps: a subgradient added to the "
               "direction, or a prox after the step on the smooth part", choices=("subgradient", "prox"))


@dataclass(frozen=True)
class Round:
    index: int  # r, from 0: communication rounds before this one
    clients: Tensor  # [S] participating client ids, on the compute device
    local_steps: int  # E, or this round's drawn length
    iteration: int  # local iterations each client did before this round (r·E for fixed-length rounds)
    gen: torch.Generator | RunStreams | None = None  # the algorithm's own random stream (coins, draws from pools)


class Algorithm:
    name: ClassVar[str]
    hparams: ClassVar[tuple[Param, ...]]
    downloads: ClassVar[tuple[str, ...]] = ("w",)  # server entries every sampled client receives
    personalized: ClassVar[bool] = False  # personal_params gives per-client models: requires personal_evaluation
    requires: ClassVar[frozenset[str]] = frozenset()
    participation: ClassVar[str] = "sampled"  # or "all": every client takes part in every round
    random_stream: ClassVar[str] = "algorithm"  # name of the stream rnd.gen is seeded from, with the trial seed
    # True: written for the run axis of `fedbench.runs` (state `[R, S, ...]` / server `[R, ...]`: reductions over
    # the client axis -2, `broadcast`/`aggregate` for server <-> clients, oracles as they come) and draws inside its
    # rounds only through `draw` (or at a coin-flip round's last step); checked by tests/test_runs.py against runs
    # alone
    runs_axis: ClassVar[bool] = False
    # True: a coin-flip round's last step draws from rnd.gen (and branches on the draws), so that the runs of an
    # iteration-wise batch end their rounds one by one; False: they end them together (`fedbench.runs`)
    draws_at_round_end: ClassVar[bool] = False
    # continuous hyperparameters used only as factors of tensors, through `per_run`: the runs of a batch may differ
    # in them, each run's value a row of a `[R]` tensor (`fedbench.runs`)
    run_hparams: ClassVar[tuple[str, ...]] = ()
    # attributes the algorithm derives from `run_hparams` when built (floats, or dataclasses of floats such as seed
    # 003's Thm 8/9 parameters) and uses only through `per_run`: a batch whose runs differ in those hyperparameters
    # holds each run's derived values too
    run_derived: ClassVar[tuple[str, ...]] = ()

    def __init__(self, problem, **hyperparameters: Any):
        self.problem = problem
        self.reg = problem.regularizer
        self.hp = resolve(self.hparams, hyperparameters, self.name)
        contract.check(self.name, self.requirements(self.hp), problem.name, problem.capabilities(problem.config))
        for key, value in self.hp.items():
            setattr(self, key, value)

    @classmethod
    def requirements(cls, hp: dict[str, Any]) -> set[str]:
        """The capabilities this algorithm needs with resolved hyperparameters `hp`."""
        return set(cls.requires) | {"personal_evaluation" if cls.personalized else "global_evaluation"}

    @classmethod
    def batchable_runs(cls, hp: dict[str, Any]) -> bool:
        """Whether runs with these resolved hyperparameters can share a batch (`fedbench.runs`): `runs_axis`."""
        return cls.runs_axis

    @classmethod
    def declared_metrics(cls, hp: dict[str, Any]) -> tuple[Metric, ...]:
        """Metrics the algorithm itself adds to each row (e.g. the objective it minimizes), by `evaluate`."""
        return ()

    def evaluate(self, server: State, clients: State) -> dict[str, float]:
        """The values of `declared_metrics` at the current state."""
        return {}

    def minibatches(self) -> tuple[Minibatch, ...]:
        """The minibatches each local step draws (names and sizes); `client_step` gets an oracle per name."""
        return (Minibatch("D"),)

    def round_length(self, local_steps: int, gen: torch.Generator) -> int:
        """Local iterations of the next round, given the federation's `local_steps` and the algorithm's
        generator (drawn before the round's clients and minibatches)."""
        return local_steps

    def init_server(self, w0: Tensor) -> State:
        return {"w": w0.clone()}

    def init_clients(self, w0: Tensor, num_clients: int) -> State:
        return {}

    def client_init(self, server: State, rows: State, rnd: Round) -> State:
        raise NotImplementedError

    def client_step(self, local: State, batches: Batches, rnd: Round, step: int) -> State:
        raise NotImplementedError

    def client_final(self, local: State, rnd: Round) -> tuple[State, State]:
        raise NotImplementedError

    def server_update(self, server: State, message: State, weights: Tensor, rnd: Round) -> State:
        raise NotImplementedError

    def global_params(self, server: State) -> Tensor:
        return server["w"]

    def personal_params(self, server: State, clients: State) -> Tensor | None:
        """Per-client models `[N, d]` that metrics evaluate, or None for a non-personalized method."""
        return None


def broadcast(w: Tensor, rnd: Round) -> Tensor:
    """The server vector as a fresh `[S, d]` local copy for the sampled clients (`[R, S, d]` from `[R, d]` when
    runs are batched, `fedbench.runs`)."""
    return w.unsqueeze(-2).expand(*w.shape[:-1], rnd.clients.shape[-1], w.shape[-1]).clone()


def aggregate(values: Tensor, weights: Tensor) -> Tensor:
    """Σ_k π̂_k values_k over the sampled clients (weights `[S]` sum to 1; `[R, S]` with values `[R, S, d]`
    when runs are batched)."""
    if weights.dim() == 1:
        return weights @ values
    return torch.matmul(weights.unsqueeze(-2), values).squeeze(-2)


def composite_step(reg, h_mode: str, x: Tensor, direction: Tensor, lr) -> Tensor:
    """x − lr·(direction + g), g ∈ ∂h(x) (`subgradient`), or prox_{lr·h}(x − lr·direction) (`prox`): how the
    smooth-FL baselines of spec 000 §2.3 treat the nonsmooth h. `lr` may be a batch's per-run values (`per_run`)."""
    lr = per_run(lr, x)
    if h_mode == "prox":
        return reg.prox(x - lr * direction, lr)
    if not reg.lam:  # h = 0: no zero subgradient to build and add in the inner loops
        return x - lr * direction
    return x - lr * (direction + reg.subgradient(x))


def add_scaled(x: Tensor, scale: float | Tensor, g: Tensor) -> Tensor:
    """x + scale·g, one kernel: `scale` a float (alone), or a batch's per-run values `[R]` (`per_run`)."""
    if isinstance(scale, Tensor):
        return torch.addcmul(x, per_run(scale, g), g)
    return torch.add(x, g, alpha=scale)


def per_run(value: float | Tensor, like: Tensor) -> float | Tensor:
    """A hyperparameter as a factor of `like`: a float as it is; the per-run values `[R]` of a batch (`run_hparams`)
    shaped to broadcast over `like`'s leading run axis `[R, ...]`."""
    return value.view(-1, *[1] * (like.dim() - 1)) if isinstance(value, Tensor) else value


class RunStreams(tuple):
    """`Round.gen` of a batch of runs (`fedbench.runs`): each run's own algorithm stream, in the batch's order."""


def draw(gen: torch.Generator | RunStreams, sample: Callable[[torch.Generator], Tensor]) -> Tensor:
    """A draw inside a round on the algorithm's stream: `sample(gen)` for a run alone; in a batch, each run's
    `sample` on its own stream, stacked on the run axis, so that every run draws exactly what it draws alone."""
    if isinstance(gen, RunStreams):
        return torch.stack([sample(one) for one in gen])
    return sample(gen)


def coin_flips_to_success(p: float, gen: torch.Generator) -> int:
    """Flips of a p-coin up to and including its first success (>= 1): the length of a round that ends when
    the coin says communicate (a geometric random variable with mean 1/p)."""
    return int(torch.empty(()).geometric_(p, generator=gen))


def per_client_copies(w0: Tensor, num_clients: int) -> Tensor:
    """`[N, d]` rows all equal to w0, e.g. personal models that start at the initial point."""
    return w0.expand(num_clients, *w0.shape).clone()
