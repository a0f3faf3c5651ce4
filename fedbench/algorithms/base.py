"""The shape every federated algorithm takes: small functions on batched client state.

The engine (`fedbench.simulate`) owns client sampling, minibatches, gathering and scattering of
per-client state, evaluation and communication accounting. An algorithm says what one round does,
for the S sampled clients at once (every local tensor has a leading `[S, ...]` axis):

    local            = client_init(server, rows, rnd)          # rows: per-client state of the sampled
    local            = client_step(local, grad, rnd, step)      # run E times; grad(u [S,d]) -> [S,d]
    message, rows    = client_final(local, rnd)                 # message: what clients upload
    server           = server_update(server, message, weights, rnd)

State that lives across rounds for every client (personal models, control variates, dual variables)
is declared by `init_clients` as `[N, ...]` tensors; the engine gathers the sampled rows before
`client_init` and scatters the rows returned by `client_final`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from torch import Tensor

from fedbench.hparams import Param, resolve

State = dict[str, Tensor]
Grad = Callable[[Tensor], Tensor]

CLIENT_LR = Param("client_lr", "float", 1e-3, "client step size η_c", low=0, low_open=True, log=True)
SERVER_LR = Param("server_lr", "float", 1.0, "server step size η_s", low=0, low_open=True, log=True)


@dataclass(frozen=True)
class Round:
    index: int  # r, from 0
    clients: Tensor  # [S] sampled client ids, on the compute device
    local_steps: int  # E


class Algorithm:
    name: ClassVar[str]
    hparams: ClassVar[tuple[Param, ...]]
    downloads: ClassVar[tuple[str, ...]] = ("w",)  # server entries every sampled client receives
    personalized: ClassVar[bool] = False

    def __init__(self, problem, **hyperparameters: Any):
        self.problem = problem
        self.reg = problem.regularizer
        self.hp = resolve(self.hparams, hyperparameters, self.name)
        for key, value in self.hp.items():
            setattr(self, key, value)

    def init_server(self, w0: Tensor) -> State:
        return {"w": w0.clone()}

    def init_clients(self, w0: Tensor, num_clients: int) -> State:
        return {}

    def client_init(self, server: State, rows: State, rnd: Round) -> State:
        raise NotImplementedError

    def client_step(self, local: State, grad: Grad, rnd: Round, step: int) -> State:
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
    """The server vector as a fresh `[S, d]` local copy for the sampled clients."""
    return w.expand(len(rnd.clients), *w.shape).clone()


def aggregate(values: Tensor, weights: Tensor) -> Tensor:
    """Σ_k π̂_k values_k over the sampled clients (weights `[S]` sum to 1)."""
    return weights @ values


def per_client_copies(w0: Tensor, num_clients: int) -> Tensor:
    """`[N, d]` rows all equal to w0, e.g. personal models that start at the initial point."""
    return w0.expand(num_clients, *w0.shape).clone()
