"""The shape every federated algorithm takes: small functions on batched state, hyperparameters as inputs.

The engine (`fedbench.engine.runs`) owns client sampling, minibatch draws, gathering and scattering of per-client state,
each run's random streams, evaluation, communication accounting and divergence. An algorithm says what one round
does, for R ≥ 1 runs (seeds × grid points; a run alone is R = 1) and the S participating clients of each at once:

    local            = client_init(server, rows, rnd, hp)          # rows: per-client state of the sampled clients
    local            = client_step(local, batches, rnd, hp)        # rnd.local_steps times; rnd.step, rnd.is_last_step
    message, rows    = client_final(local, rnd, hp)                # message: what clients upload
    server           = server_update(server, message, weights, rnd, hp)

What crosses the network is declared, not inferred from dict keys: `downloads` (server entries every sampled client
receives), `uploads` (entries of the local state each client sends, `Upload`: with the server entry it is a new
value of, where it is one, so that its update is `upload − server[entry]`) and `keeps` (entries of the per-client
state, `init_clients`, that a client takes into its round and keeps at its end); where a hyperparameter decides them,
one classmethod of the hyperparameters, `routing(hp)`, which validation and the run both read. `client_init` and
`client_final`
default to routing these names, so an algorithm whose maths is the identity there writes neither: a client starts
from its own copy of each download it uploads (`broadcast`) and shares the others read-only (`[R, 1, ...]`), with
its kept rows; it sends its uploads and keeps its `keeps`. A round's communication is counted from the declared
uploads' shapes: each of the S clients sends Σ_uploads (floats per client) (`upload_floats`).

One rank convention, so that the maths needs no helper: the server state is `[R, 1, ...]` (one row per run, a
singleton client axis), the round's local state `[R, S, ...]`, per-client state (`init_clients`) `[R, N, ...]`,
the aggregation weights `[R, S]`, and every float hyperparameter `hp.x` a `[R, 1, 1]` tensor (one value per run;
`[1, 1, 1]` where the runs share it; for one that follows a schedule, `fedbench.schedules`, its value at the run's
round) that broadcasts against all of them. Choice, integer, boolean and list hyperparameters are plain Python
values, the same for every run of a program. Values derived from the hyperparameters and the problem (step-size
rules, couplings) come from one declared pure function, `derive(hp)`, which the engine evaluates per run and hands
in with them (`hp.rules.eta`). Reductions over the clients are over axis 1 (`aggregate`, `.mean(1, keepdim=True)`).

`batches` holds one oracle per declared minibatch (`minibatches(hp)`, default one batch `D` of the federation's batch
size): `batches.D.grad(u)` is ∇f̃(u; D) for every run and client, `.loss`, `.hvp` and the problem's other oracle
methods too (`fedbench.oracle`); a point with a singleton client axis (`[R, 1, d]`) is every client's.

Randomness inside a round goes through the round, `rnd.draw` (`fedbench.algorithms.rounds`), which raises what the
engine's schedule does not define there (`ScheduleError`).

Per run and outside the round loop, the algorithm object is one run's configuration: `self.hp` holds its
resolved hyperparameters and derived values as Python values, which `init_server`, `init_clients`,
`round_length` and the evaluation hooks (`global_params`, `personal_params`, `evaluate`, on one run's state
without the run axis: server `[...]`, clients `[N, ...]`) read. A hyperparameter that follows a schedule has no one
value there, nor in `derive`: reading it raises ParamError (`fedbench validate` refuses such a recipe).

Beyond that shape an algorithm may declare (`fedbench.algorithms.spec`, read from the class before anything is
built): `requires` (capabilities the problem must provide, `fedbench.contract`), `participation = "all"` (every
client every round instead of S sampled ones), and, as classmethods of the hyperparameters, what crosses the network
(`routing`), its requirements, minibatches and metrics; and `round_length` (how many local iterations a round has,
e.g. a geometric number for a p-coin). How the engine runs the maths (its random stream, draws that branch a round's
end, uneven local work) is apart, in `fedbench.algorithms.hints`. `Algorithm` inherits both. The helpers of a
round's maths (`aggregate`, `broadcast`, ...) are in `fedbench.algorithms.maths`; this module re-exports them, with
`Round`, `Upload` and `Routing`, so that an algorithm imports what it writes from here.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from fedbench import contract
from fedbench.algorithms.hints import EngineHints
from fedbench.algorithms.maths import aggregate, broadcast, coin_flips_to_success, composite_step, per_client_copies
from fedbench.algorithms.messages import MODEL, Routing, Upload
from fedbench.algorithms.rounds import Round, ScheduleError
from fedbench.algorithms.spec import AlgorithmSpec
from fedbench.hparams import HParams, Param, PerRound, resolve
from fedbench.oracle import Batches

State = dict[str, Tensor]
"""A state: tensors by name. In a round's functions the server's entries are `[R, 1, ...]`, the round's local state
`[R, S, ...]` (or `[R, 1, ...]` for an entry the clients share) and per-client rows `[R, S, ...]`; in `init_server`,
`init_clients` and the evaluation hooks, one run's, without the run axis."""

CLIENT_LR = Param("client_lr", "float", 1e-3, "client step size η_c", low=0, low_open=True, log=True)
"""The client step size η_c (default 1e-3, > 0, tuned on a log scale), as most algorithms declare it."""
SERVER_LR = Param("server_lr", "float", 1.0, "server step size η_s", low=0, low_open=True, log=True)
"""The server step size η_s (default 1, > 0, tuned on a log scale)."""
H_MODE = Param("h_mode", "choice", "subgradient", "treatment of h in local steps: a subgradient added to the "
               "direction, or a prox after the step on the smooth part", choices=("subgradient", "prox"))
"""How a smooth-FL baseline's local step treats h (`subgradient` or `prox`), the choice `composite_step` takes."""


__all__ = ["CLIENT_LR", "H_MODE", "MODEL", "SERVER_LR", "Algorithm", "MessageError", "Round", "Routing",
           "ScheduleError", "State", "Upload", "aggregate", "broadcast", "coin_flips_to_success", "composite_step",
           "per_client_copies", "upload_floats"]


class Algorithm(AlgorithmSpec, EngineHints):
    """A federated algorithm: the maths of one round as small functions on batched state (the module's docstring
    says the shapes), and declarations of what it needs and sends. An instance is one run's configuration
    (`Algorithm(problem, client_lr=1e-3)`); the engine calls its hooks for all the runs of a program at once. Its
    declarations, read from the class before anything is built, are `AlgorithmSpec`'s (`fedbench.algorithms.spec`);
    the engine's hints, `EngineHints`'s (`fedbench.algorithms.hints`).

    Each run, once: `init_server(w0)` and `init_clients(w0, N)`. Each round, on the S sampled clients of R runs:
    `client_init`, then `client_step` `rnd.local_steps` times, then `client_final`, then `server_update`. At each
    evaluation, on one run's state: `global_params`, `personal_params` and `evaluate`. A subclass defines `name`,
    `hparams`, `client_step` and `server_update` (a plugin that lacks one is refused, `fedbench.plugins`); every
    other hook has a default, which its docstring states.

    Example:
        FedAvg with a subgradient of h (`fedbench/algorithms/fedavg.py`, without its `subgradient` flag): the
        defaults download `w`, start each client from its own copy, and upload its local `w`:

        ```python
        class FedAvg(Algorithm):
            name = "fedavg"
            hparams = (CLIENT_LR, SERVER_LR)

            def client_step(self, local, batches, rnd, hp):
                u = local["w"]                                        # [R, S, d]
                return {"w": u - hp.client_lr * (batches.D.grad(u) + self.reg.subgradient(u))}

            def server_update(self, server, message, weights, rnd, hp):
                w = server["w"]                                       # [R, 1, d]
                return {"w": w + hp.server_lr * (aggregate(message["w"], weights) - w)}
        ```
    """

    def __init__(self, problem, **hyperparameters: Any):
        """One run's configuration on `problem`: `hyperparameters` by name (the others take their defaults), each
        checked against its `Param` and by `check`, and the algorithm's `requirements` against what the problem
        provides (`IncompatibleError`)."""
        self.problem = problem
        """The problem instance it runs on (its oracles beyond a step's minibatches, e.g. `client_grad`)."""
        self.reg = problem.regularizer
        """The problem's regularizer h (`fedbench.prox`): `self.reg.prox(v, step)`, `self.reg.subgradient(w)`."""
        declared = resolve(self.hparams, hyperparameters, self.name, per_round=True)
        self.check(declared)
        routing = self.routing(declared)  # the declaration validation reads too: the run sees the same
        self.downloads, self.uploads, self.keeps = routing.downloads, routing.uploads, routing.keeps
        capabilities = problem.capabilities(problem.config)
        contract.check(self.name, self.requirements(declared), problem.name, capabilities)
        self.personal = self.reports_personal(capabilities)
        """Whether its runs on this problem report `personal_` metrics (`reports_personal`): the engine evaluates
        and saves `personal_params` only then."""
        self.declared = declared
        """The resolved hyperparameters alone, by name (what a batch of runs compares)."""
        self.schedules = {name: value for name, value in declared.items() if isinstance(value, PerRound)}
        """The hyperparameters that follow a schedule (`fedbench.schedules`), by name: the engine hands the round
        functions their values at each round. `derive` and `self.hp` hold one value for the whole run, so there they
        have none: reading one raises ParamError."""
        fixed = {name: value for name, value in declared.items() if name not in self.schedules}

        def unset(where: str) -> dict[str, str]:
            why = f"follows a schedule, but {self.name} reads it {where}, which holds one value for the whole run"
            return dict.fromkeys(self.schedules, f"{why}: give it one value")
        self.hp = HParams({**fixed, **self.derive(HParams(fixed, unset("in derive")))},
                          unset("outside its rounds (self.hp: init_server, round_length, evaluation)"))
        """One run's hyperparameters and derived values (`derive`) as Python values, for the hooks that run outside
        the round loop (`init_server`, `round_length`, the evaluation hooks); the round functions get them per run
        as their `hp` argument."""

    def derive(self, hp: HParams) -> dict[str, Any]:
        """Values derived from one run's hyperparameters and the problem: step-size rules, couplings. The engine
        evaluates it per run and hands the values in with the hyperparameters (`hp.personal_step`, `hp.rules.eta`):
        floats, and dataclasses of floats, as per-run `[R, 1, 1]` tensors; anything else must follow from the
        non-float hyperparameters (it is the same for every run of a program). Default: none.

        Args:
            hp: one run's hyperparameters, as Python values.

        Returns:
            The derived values by name.

        Example:
            Ditto's personal step size defaults to the client's (`fedbench/algorithms/ditto.py`):

            ```python
            def derive(self, hp):
                return {"personal_step": hp.client_lr if hp.personal_lr is None else hp.personal_lr}
            ```
        """
        return {}

    def evaluate(self, server: State, clients: State) -> dict[str, float]:
        """The values of `declared_metrics` at one run's state. Default: none.

        Args:
            server: one run's server state, entries as `init_server` makes them (no run or client axis).
            clients: one run's per-client state, entries `[N, ...]`.

        Returns:
            A float per declared metric, by name.

        Example:
            The mean of the clients' full-data losses at the global model (`client_loss` leaves out h):

            ```python
            def evaluate(self, server, clients):
                w = server["w"]                                                           # [d]
                everyone = torch.arange(self.problem.num_clients, device=w.device)
                losses = self.problem.client_loss(per_client_copies(w, len(everyone)), everyone)  # [N]
                return {"mean_client_loss": float(losses.mean())}
            ```
        """
        return {}

    def round_length(self, local_steps: int, gen: torch.Generator) -> int:
        """Local iterations of one run's next round, drawn before the round's clients and minibatches. Default: the
        federation's `local_steps`, every round.

        Args:
            local_steps: the federation's E.
            gen: the run's generator of `random_stream`.

        Returns:
            The round's number of local steps (≥ 1), `rnd.local_steps` in the round's functions.

        Example:
            L2SGD+ communicates when a p-coin says so (Hanzely and Richtárik 2020, Algorithm 2):

            ```python
            def round_length(self, local_steps, gen):
                return coin_flips_to_success(self.hp.prob, gen)
            ```
        """
        return local_steps

    def init_server(self, w0: Tensor) -> State:
        """One run's server state at the start. The engine stacks the runs' and adds the client axis: a round's
        functions see each entry as `[R, 1, ...]`. Default: a copy of `w0` as `w`, the model, which the default
        `downloads`, `uploads` and `global_params` name.

        Args:
            w0: the run's initial point `[d]` (`Problem.init_params`).

        Returns:
            The server's entries by name, without the run axis.

        Example:
            The tutorial's FedAvgM keeps a server momentum beside the model:

            ```python
            def init_server(self, w0):
                return {"w": w0.clone(), "v": w0.new_zeros(w0.shape)}
            ```
        """
        return {"w": w0.clone()}

    def init_clients(self, w0: Tensor, num_clients: int) -> State:
        """One run's per-client state at the start: what each client keeps from one round it takes part in to the
        next. The engine adds the run axis (`[R, N, ...]`); a round reads the sampled clients' rows (`client_init`'s
        `rows`) and writes back what `client_final` gives. Default: none.

        Args:
            w0: the run's initial point `[d]`.
            num_clients: the problem's number of clients N.

        Returns:
            The per-client entries by name, each `[N, ...]`.

        Example:
            SCAFFOLD's control variates c_i, zero at the start:

            ```python
            def init_clients(self, w0, num_clients):
                return {"c": w0.new_zeros(num_clients, *w0.shape)}
            ```
        """
        return {}

    def client_init(self, server: State, rows: State, rnd: Round, hp: HParams) -> State:
        """The sampled clients' local state at the round's start. Default: a client's own copy `[R, S, ...]` of each
        download it uploads (`broadcast`), the other downloads shared `[R, 1, ...]`, and its `keeps` from `rows`.

        Args:
            server: the server's entries, `[R, 1, ...]` each.
            rows: the sampled clients' rows of every per-client entry (`init_clients`), `[R, S, ...]` each: row
                `[r, k]` is the state of client `rnd.clients[r, k]` of run r (with participation "all", every
                client's, `[R, N, ...]`); empty without per-client state.
            rnd: the round (`rnd.clients` `[R, S]`).
            hp: the runs' hyperparameters: floats `[R, 1, 1]`, the others plain values.

        Returns:
            The local state, entries `[R, S, ...]` (a client's own) or `[R, 1, ...]` (the same for a run's clients).

        Example:
            SCAFFOLD's: the local model y, the server's x and c shared, and the client's own c_i:

            ```python
            def client_init(self, server, rows, rnd, hp):
                return {"y": broadcast(server["w"], rnd), "x": server["w"], "c": server["c"], "c_i": rows["c"]}
            ```
        """
        uploaded = {upload.name for upload in self.uploads}
        local = {name: broadcast(server[name], rnd) if name in uploaded else server[name] for name in self.downloads}
        return {**local, **{name: rows[name] for name in self.keeps}}

    def client_step(self, local: State, batches: Batches, rnd: Round, hp: HParams) -> State:
        """One local step of every sampled client of every run, `rnd.local_steps` times a round (`rnd.step` from
        0). No default: every algorithm defines it.

        Args:
            local: the local state, entries `[R, S, ...]` or `[R, 1, ...]`.
            batches: an oracle per declared minibatch (`minibatches`), drawn for this step: `batches.D.grad(u)` at
                `u` `[R, S, d]` (or `[R, 1, d]`, every client's) is `[R, S, d]`, `batches.D.loss(u)` `[R, S]`.
            rnd: the round, at this step (`rnd.step`, `rnd.is_last_step`).
            hp: the runs' hyperparameters: floats `[R, 1, 1]`, the others plain values.

        Returns:
            The whole new local state: every entry a later step or `client_final` reads (carry the unchanged
            ones, `{**local, "y": y}`).

        Example:
            SCAFFOLD's corrected step, with a subgradient of h:

            ```python
            def client_step(self, local, batches, rnd, hp):
                y = local["y"]
                direction = batches.D.grad(y) - local["c_i"] + local["c"] + self.reg.subgradient(y)
                return {**local, "y": y - hp.client_lr * direction}
            ```
        """
        raise NotImplementedError

    def client_final(self, local: State, rnd: Round, hp: HParams) -> tuple[State, State]:
        """What the sampled clients send, and what they keep, at the round's end. Default: the declared uploads
        (and `replicated` entries) from the local state, and the `keeps`.

        Args:
            local: the local state after the round's last step.
            rnd: the round.
            hp: the runs' hyperparameters: floats `[R, 1, 1]`, the others plain values.

        Returns:
            Two dicts. The message: exactly the `uploads` (and `replicated`) by name, `[R, S, ...]` each (or `[R, 1,
            ...]` for a value every device holds after an all-reduce), which `server_update` receives. The rows:
            entries of the per-client state (`init_clients`), `[R, S, ...]` each, written back into the sampled
            clients' rows of the per-client state (with participation "all", replacing the entry, `[R, N, ...]`);
            an entry it leaves out is left as it was.

        Example:
            SCAFFOLD's: the updates Δy and Δc go up, the new c_i stays on the client:

            ```python
            def client_final(self, local, rnd, hp):
                x, y, c, c_i = local["x"], local["y"], local["c"], local["c_i"]
                c_new = c_i - c + (x - y) / (rnd.client_steps * hp.client_lr)
                return {"dy": y - x, "dc": c_new - c_i}, {"c": c_new}
            ```
        """
        return {name: local[name] for name in self.message_names()}, {name: local[name] for name in self.keeps}

    def message_names(self) -> list[str]:
        """The entries of a round's message: the declared uploads, then the replicated entries (what `client_final`
        must send, `MessageError`).

        Example:
            SCAFFOLD's:

            ```python
            algorithm.message_names()          # ['dy', 'dc']
            ```
        """
        return [upload.name for upload in self.uploads] + list(self.replicated)

    def server_update(self, server: State, message: State, weights: Tensor, rnd: Round, hp: HParams) -> State:
        """The server's new state from the round's messages. No default: every algorithm defines it.

        Args:
            server: the server's entries at the round's start, `[R, 1, ...]` each.
            message: `client_final`'s message, `[R, S, ...]` per upload.
            weights: the aggregation weights π̂ `[R, S]` over each run's sampled clients, summing to 1 (the
                federation's `aggregation`: uniform 1/S, or by samples).
            rnd: the round.
            hp: the runs' hyperparameters: floats `[R, 1, 1]`, the others plain values.

        Returns:
            The whole new server state, `[R, 1, ...]` per entry: every entry of `server`, changed or not.

        Example:
            SCAFFOLD's (Algorithm 1 lines 16–17): x by the weighted mean of Δy, c by the sum of Δc over N:

            ```python
            def server_update(self, server, message, weights, rnd, hp):
                return {"w": server["w"] + hp.server_lr * aggregate(message["dy"], weights),
                        "c": server["c"] + message["dc"].sum(1, keepdim=True) / self.problem.num_clients}
            ```
        """
        raise NotImplementedError

    def global_params(self, server: State) -> Tensor:
        """The global model the problem's metrics evaluate (and a run saves). Default: `server["w"]`.

        Args:
            server: one run's server state, entries as `init_server` makes them (no run or client axis).

        Returns:
            The model `[d]`.

        Example:
            CODASCA keeps the model w and the scalars a, b of its min-max objective in one vector v = (w, a, b):

            ```python
            def global_params(self, server):
                return server["v"][..., :-2]
            ```
        """
        return server["w"]

    def personal_params(self, server: State, clients: State) -> Tensor | None:
        """Per-client models, which the problem's `personal_` metrics evaluate on each client's own data. Default:
        None (no personal models; a `personalized` algorithm defines it).

        Args:
            server: one run's server state, entries as `init_server` makes them.
            clients: one run's per-client state, entries `[N, ...]`.

        Returns:
            The models `[N, d]`, or None.

        Example:
            Ditto's personal models are per-client state:

            ```python
            def personal_params(self, server, clients):
                return clients["v"]
            ```
        """
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
