"""The shape every federated algorithm takes: small functions on batched state, hyperparameters as inputs.

The engine (`fedbench.runs`) owns client sampling, minibatch draws, gathering and scattering of per-client state,
each run's random streams, evaluation, communication accounting and divergence. An algorithm says what one round
does, for R ≥ 1 runs (seeds × grid points; a run alone is R = 1) and the S participating clients of each at once:

    local            = client_init(server, rows, rnd, hp)          # rows: per-client state of the sampled clients
    local            = client_step(local, batches, rnd, hp)        # rnd.local_steps times; rnd.step, rnd.is_last_step
    message, rows    = client_final(local, rnd, hp)                # message: what clients upload
    server           = server_update(server, message, weights, rnd, hp)

What crosses the network is declared, not inferred from dict keys: `downloads` (server entries every sampled client
receives), `uploads` (entries of the local state each client sends, `Upload`: with the server entry it is a new
value of, where it is one, so that a transform such as compression can act on the update `upload − server[entry]`)
and `keeps` (per-client state, `init_clients`, that a round reads and writes back). `client_init` and `client_final`
default to routing these names, so an algorithm whose maths is the identity there writes neither: a client starts
from its own copy of each download it uploads (`broadcast`) and shares the others read-only (`[R, 1, ...]`), with
its kept rows; it sends its uploads and keeps its `keeps`. A round's communication is counted from the declared
uploads' shapes: each of the S clients sends Σ_uploads (floats per client) (`upload_floats`).

One rank convention, so that the maths needs no helper: the server state is `[R, 1, ...]` (one row per run, a
singleton client axis), the round's local state `[R, S, ...]`, per-client state (`init_clients`) `[R, N, ...]`,
the aggregation weights `[R, S]`, and every float hyperparameter `hp.x` a `[R, 1, 1]` tensor (one value per run)
that broadcasts against all of them. Choice, integer, boolean and list hyperparameters are plain Python values,
the same for every run of a program. Values derived from the hyperparameters and the problem (step-size rules,
couplings) come from one declared pure function, `derive(hp)`, which the engine evaluates per run and hands in
with them (`hp.rules.eta`). Reductions over the clients are over axis 1 (`aggregate`, `.mean(1, keepdim=True)`).

`batches` holds one oracle per declared minibatch (`minibatches(hp)`, default one batch `D` of the federation's batch
size): `batches.D.grad(u)` is ∇f̃(u; D) for every run and client, `.loss`, `.hvp` and the problem's other oracle
methods too (`fedbench.oracle`); a point with a singleton client axis (`[R, 1, d]`) is every client's.

Randomness inside a round goes through the round: `rnd.draw(lambda gen: torch.rand(3, generator=gen))` draws on
each run's own stream of the algorithm (`random_stream`) and stacks the runs' draws on axis 0. What a schedule does
not define raises (`ScheduleError`): an iteration-wise program's runs are at different rounds, so its inner steps
have no `rnd.index`, `rnd.iteration` or `rnd.step` (only `rnd.is_last_step`, False there), and draw nothing.

Per run and outside the round loop, the algorithm object is one run's configuration: `self.hp` holds its
resolved hyperparameters and derived values as Python values, which `init_server`, `init_clients`,
`round_length` and the evaluation hooks (`global_params`, `personal_params`, `evaluate`, on one run's state
without the run axis: server `[...]`, clients `[N, ...]`) read.

Beyond that shape an algorithm may declare: `requires` (capabilities the problem must provide,
`fedbench.contract`), `participation = "all"` (every client every round instead of S sampled ones),
`round_length` (how many local iterations a round has, e.g. a geometric number for a p-coin), and
`draws_at_round_end` (its round's last step branches in Python on `rnd.draw`, so the engine ends such rounds one
run at a time).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import torch
from torch import Tensor

from fedbench import contract
from fedbench.hparams import HParams, Param, resolve
from fedbench.metrics import Metric
from fedbench.oracle import Batches, Minibatch

State = dict[str, Tensor]

CLIENT_LR = Param("client_lr", "float", 1e-3, "client step size η_c", low=0, low_open=True, log=True)
SERVER_LR = Param("server_lr", "float", 1.0, "server step size η_s", low=0, low_open=True, log=True)
H_MODE = Param("h_mode", "choice", "subgradient", "treatment of h in local steps: a subgradient added to the "
               "direction, or a prox after the step on the smooth part", choices=("subgradient", "prox"))


class ScheduleError(RuntimeError):
    """An algorithm asked its round for what the engine's schedule does not define there."""


class Round:
    """What the runs of a program know of their current round. `clients` `[R, S]` and `is_last_step` are always
    defined; `index` (r, from 0), `iteration` (local iterations before this round), `local_steps` (E, or this
    round's drawn length) and `step` (the local step, from 0) where the schedule defines them; `draw` where the
    runs' streams are bound."""

    __slots__ = ("clients", "_index", "_iteration", "_local_steps", "_step", "_streams", "_where", "_last")

    def __init__(self, clients: Tensor, index: int | None = None, local_steps: int | None = None,
                 iteration: int | None = None, step: int | None = None,
                 streams: tuple[torch.Generator, ...] | None = None, where: str = "", last: bool | None = None):
        self.clients, self._index, self._local_steps, self._iteration = clients, index, local_steps, iteration
        self._step, self._streams, self._where = step, streams, where
        # whether `step` ends the round: from the length where it is defined, else given (an iteration-wise end)
        self._last = last if last is not None else (step is not None and local_steps is not None
                                                    and step == local_steps - 1)

    def _defined(self, name: str, value):
        if value is None:
            raise ScheduleError(f"rnd.{name} is not defined {self._where or 'here'}")
        return value

    @property
    def index(self) -> int:
        return self._defined("index", self._index)

    @property
    def iteration(self) -> int:
        return self._defined("iteration", self._iteration)

    @property
    def local_steps(self) -> int:
        return self._defined("local_steps", self._local_steps)

    @property
    def step(self) -> int:
        return self._defined("step", self._step)

    @property
    def is_last_step(self) -> bool:
        """Whether this local step ends the round (False in an iteration-wise program's inner steps)."""
        return self._last

    def at(self, step: int) -> Round:
        """This round at local step `step`."""
        return Round(self.clients, self._index, self._local_steps, self._iteration, step, self._streams, self._where)

    def draw(self, sample: Callable[[torch.Generator], Tensor]) -> Tensor:
        """`sample(gen)` on each run's own stream of the algorithm, stacked on a leading run axis `[R, ...]`, so
        that every run draws exactly what it draws alone."""
        if self._streams is None:
            raise ScheduleError(f"rnd.draw is not allowed {self._where or 'here'}")
        if len(self._streams) == 1:
            return sample(self._streams[0]).unsqueeze(0)
        return torch.stack([sample(gen) for gen in self._streams])


@dataclass(frozen=True)
class Upload:
    """An entry of the local state that each client sends at a round's end (`name`), and the server entry it is a
    new value of (`relative_to`, e.g. FedMiD's local model as a new `w`; None where the upload is itself an update or
    has no server counterpart, e.g. SCAFFOLD's Δy). `all_reduced`: the devices combine it by an all-reduce inside the
    round, so that the entry is `[R, 1, ...]`, the one value every device then holds, not a message per client (the
    uplink's transforms, `fedbench.transforms`, cannot act on it)."""

    name: str
    relative_to: str | None = None
    all_reduced: bool = False


MODEL = Upload("w", relative_to="w")  # a client's local model, a new value of the server's w


class Algorithm:
    name: ClassVar[str]
    title: ClassVar[str | None] = None  # the method's name as its paper writes it, for reports (None: `name`)
    hparams: ClassVar[tuple[Param, ...]]
    # What crosses the network. An instance may set its own where a choice hyperparameter decides (the same for
    # every run of a program), e.g. whether the momentum is averaged (Local Pair, FeDXL2)
    downloads: tuple[str, ...] = ("w",)  # server entries every sampled client receives
    uploads: tuple[Upload, ...] = (MODEL,)  # what each client sends
    keeps: tuple[str, ...] = ()  # per-client state a round reads and writes back
    # Entries of the message beyond the uploads that every device computes itself after the round's all-reduce
    # (participation "all": the block methods' w-block), handed to `server_update` and not counted as sent
    replicated: ClassVar[tuple[str, ...]] = ()
    personalized: ClassVar[bool] = False  # personal_params gives per-client models: requires personal_evaluation
    requires: ClassVar[frozenset[str]] = frozenset()
    participation: ClassVar[str] = "sampled"  # or "all": every client takes part in every round
    random_stream: ClassVar[str] = "algorithm"  # name of the stream `rnd.draw` and `round_length` draw from
    # True: a round's last step branches in Python on `rnd.draw` (ASVRCD-PFL's coins), so that the engine ends such
    # rounds one run at a time
    draws_at_round_end: ClassVar[bool] = False

    def __init__(self, problem, **hyperparameters: Any):
        self.problem = problem
        self.reg = problem.regularizer
        declared = resolve(self.hparams, hyperparameters, self.name)
        self.check(declared)
        contract.check(self.name, self.requirements(declared), problem.name, problem.capabilities(problem.config))
        self.declared = declared  # the resolved hyperparameters alone (what a batch compares)
        self.hp = HParams({**declared, **self.derive(HParams(declared))})

    @classmethod
    def check(cls, hp: Mapping[str, Any]) -> None:
        """Refuse (ParamError) resolved hyperparameters `hp` that no run can have, by rules beyond each parameter's
        own range (e.g. lists that must agree in length); every instance is checked so, and a recipe's validator
        checks its configurations so before anything runs."""

    @classmethod
    def requirements(cls, hp: Mapping[str, Any]) -> set[str]:
        """The capabilities this algorithm needs with resolved hyperparameters `hp`."""
        return set(cls.requires) | {"personal_evaluation" if cls.personalized else "global_evaluation"}

    @classmethod
    def draws_in_steps(cls, hp: Mapping[str, Any]) -> bool:
        """Whether its local steps other than a round's last draw (`rnd.draw`) with these hyperparameters, which an
        iteration-wise program does not allow (its runs' steps then run one after another)."""
        return False

    @classmethod
    def declared_metrics(cls, hp: Mapping[str, Any]) -> tuple[Metric, ...]:
        """Metrics the algorithm itself adds to each row (e.g. the objective it minimizes), by `evaluate`."""
        return ()

    def derive(self, hp: HParams) -> dict[str, Any]:
        """Values derived from one run's hyperparameters `hp` and the problem (floats, or dataclasses of floats,
        are per-run values in a batch; anything else must follow from the non-float hyperparameters)."""
        return {}

    def evaluate(self, server: State, clients: State) -> dict[str, float]:
        """The values of `declared_metrics` at one run's state."""
        return {}

    @classmethod
    def minibatches(cls, hp: Mapping[str, Any]) -> tuple[Minibatch, ...]:
        """The minibatches each local step draws with resolved hyperparameters `hp` (names and sizes); `client_step`
        gets an oracle per name."""
        return (Minibatch("D"),)

    def round_length(self, local_steps: int, gen: torch.Generator) -> int:
        """Local iterations of one run's next round, given the federation's `local_steps` and the run's generator
        (drawn before the round's clients and minibatches)."""
        return local_steps

    def init_server(self, w0: Tensor) -> State:
        """One run's server state from its initial point `w0` `[d]` (the engine adds the run and client axes)."""
        return {"w": w0.clone()}

    def init_clients(self, w0: Tensor, num_clients: int) -> State:
        """One run's per-client state `[N, ...]` (the engine adds the run axis)."""
        return {}

    def client_init(self, server: State, rows: State, rnd: Round, hp: HParams) -> State:
        """The clients' local state at the round's start: their own copy `[R, S, ...]` of each download they upload,
        the other downloads shared `[R, 1, ...]`, and their kept rows."""
        uploaded = {upload.name for upload in self.uploads}
        local = {name: broadcast(server[name], rnd) if name in uploaded else server[name] for name in self.downloads}
        return {**local, **{name: rows[name] for name in self.keeps}}

    def client_step(self, local: State, batches: Batches, rnd: Round, hp: HParams) -> State:
        raise NotImplementedError

    def client_final(self, local: State, rnd: Round, hp: HParams) -> tuple[State, State]:
        """(message, rows): the declared uploads (and replicated entries), and the kept per-client state."""
        return {name: local[name] for name in self.message_names()}, {name: local[name] for name in self.keeps}

    def message_names(self) -> list[str]:
        """The entries of a round's message: the declared uploads, then the replicated entries."""
        return [upload.name for upload in self.uploads] + list(self.replicated)

    def server_update(self, server: State, message: State, weights: Tensor, rnd: Round, hp: HParams) -> State:
        raise NotImplementedError

    def global_params(self, server: State) -> Tensor:
        return server["w"]

    def personal_params(self, server: State, clients: State) -> Tensor | None:
        """Per-client models `[N, d]` that metrics evaluate, or None for a non-personalized method."""
        return None


class MessageError(ValueError):
    """A round's message that does not hold what the algorithm declares it sends."""


def upload_floats(algorithm: Algorithm, message: State) -> int:
    """Floats one client sends: the sizes of the declared uploads beyond the run and client axes (a `[R, 1, ...]`
    entry, one value every device holds after an all-reduce, is each device's share of that size). A message
    whose entries are not the declared `uploads` and `replicated` is refused: what is counted is what is sent."""
    if message.keys() != set(algorithm.message_names()):
        raise MessageError(f"{algorithm.name}: client_final sent {sorted(message)}, but the algorithm declares "
                           f"uploads {[upload.name for upload in algorithm.uploads]}"
                           + (f" and replicated {list(algorithm.replicated)}" if algorithm.replicated else "")
                           + "; declare what clients send as `uploads = (Upload(name, relative_to=...), ...)`")
    return sum(math.prod(message[upload.name].shape[2:]) for upload in algorithm.uploads)


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

