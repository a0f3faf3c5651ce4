"""A run's federation and its random draws: the rounds, clients per round, local steps and batch size, the server's
aggregation, the uplink and downlink transforms, the adversaries and the participation model (`Federation`), the
clients, their local steps and the minibatch rows a round draws on the run's streams (`RoundSampler`), the oracles of a
local step (`step_oracles`), the server's aggregation weights (`aggregation_weights`) and what the federation's
uplink, aggregation and adversaries ask of an algorithm's uploads (`check_uploads`). The record of a run is
`fedbench.engine.record.RunRecord`; the programs that advance runs are `fedbench.engine.runs`."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

import torch
from torch import Tensor

from fedbench.axes.participation import LocalSteps, Participants, Participation, StepCounts
from fedbench.axes.privacy import gaussian_step
from fedbench.axes.robust import KRUMS, RULES, Adversaries
from fedbench.axes.server_optimizers import ServerOptimizer
from fedbench.axes.slots import slot_weights
from fedbench.axes.transforms import LINKS, Step, chain, chain_text
from fedbench.hparams import Param, ParamError
from fedbench.oracle import Batches, Minibatch
from fedbench.problems.base import Layout, Problem
from fedbench.rng import generator

if TYPE_CHECKING:
    from fedbench.algorithms.base import Algorithm

DIVERGENCE_FACTOR = 1e4


@dataclass(frozen=True)
class Federation:
    """How a run's rounds go: `rounds`, `clients_per_round` S (0: every client), `local_steps` E (or uneven local
    work, `fedbench.axes.participation.LocalSteps`, given as a recipe writes it), `batch_size` b, the server's
    `aggregation` (weights "uniform": π̂_k = 1/S, or "samples": π̂_k ∝ n_k over the sampled set; or a robust rule of
    `fedbench.axes.robust`, with its `trim` β or `byzantine` f), the transforms of what crosses the network, `uplink`
    and `downlink` (`fedbench.axes.transforms`, given as a recipe writes them and held as steps), the `adversaries`
    (`fedbench.axes.robust.Adversaries`, or None) and the `participation` model
    (`fedbench.axes.participation.Participation`, given as a recipe writes it) and the `server_optimizer`
    (`fedbench.axes.server_optimizers.ServerOptimizer`, given as a recipe writes it, or None: the algorithm's own server
    step alone) and the `axes` of the registry `fedbench.axes.registry` (`fedbench.axes.client_dropout.ClientDropout`),
    as a recipe's `federation:` block sets them (the scalar ones declared in `params`).

    Example:
        ```python
        Federation(rounds=2000, clients_per_round=10, local_steps=10, batch_size=10)
        Federation(rounds=2000, uplink=[{"top_k": 0.05}, {"error_feedback": "ef21"}], downlink=[{"qsgd": 8}])
        Federation(rounds=2000, participation={"model": "markov", "p_on": 0.2, "p_off": 0.1},
                   local_steps={"distribution": "uniform", "low": 1, "high": 10})
        Federation(rounds=2000, server_optimizer={"name": "adam", "lr": 0.01})     # FedAdam, of any algorithm
        Federation(rounds=2000, axes=(ClientDropout(0.1),))     # each sampled client's upload lost with p = 0.1
        ```
    """

    rounds: int = 100
    clients_per_round: int = 10
    # E, or each participant's own (`fedbench.axes.participation`): given as a recipe writes it, held as LocalSteps
    local_steps: int | LocalSteps = 10
    batch_size: int = 10
    aggregation: str = "uniform"  # "uniform", "samples" (weights) or one of `fedbench.axes.robust.RULES`
    # transforms of each client's uploads and of the server's broadcast (`fedbench.axes.transforms`); given as a recipe
    # writes them (`[{"top_k": 0.05}, {"error_feedback": "ef21"}]`) or as steps
    uplink: tuple[Step, ...] = ()
    downlink: tuple[Step, ...] = ()
    trim: float = 0.1  # β of trimmed_mean
    byzantine: int = 1  # f of krum and multi_krum
    # the clients that attack (`fedbench.axes.robust`); given as a recipe writes it (`{"fraction": 0.2}`) or as one
    adversaries: Adversaries | None = None
    # who may take part in each round (`fedbench.axes.participation`); given as a recipe writes it (`{"model": "cyclic",
    # "groups": 4}`) or as one
    participation: Participation = Participation()
    # the server's step on the round's mean update of w (`fedbench.axes.server_optimizers`); given as a recipe writes it
    # (`{"name": "adam", "lr": 0.01}`) or as one
    server_optimizer: ServerOptimizer | None = None
    # the axes registered behind `fedbench.axes.registry.Axis` (`federation.client_dropout`), as made from the recipe
    axes: tuple[Any, ...] = ()

    params = (
        Param("rounds", "int", 100, "communication rounds R", low=0),
        Param("clients_per_round", "int", 10, "clients sampled per round S (0: every client, whatever their number)",
              low=0),
        Param("local_steps", "int", 10, "local steps E per round (an algorithm may draw its rounds' lengths; a "
              "mapping: each participant's own, below)", low=1),
        Param("batch_size", "int", 10, "minibatch size b", low=1),
        Param("aggregation", "choice", "uniform", "the server's mean over the sampled clients, weights uniform or by "
              "samples, or a robust rule in its place (fedbench.axes.robust)", choices=("uniform", "samples", *RULES)),
        Param("trim", "float", 0.1, "β of trimmed_mean: the fraction of the clients left out at each end, per "
              "coordinate", low=0, high=0.5, high_open=True),
        Param("byzantine", "int", 1, "f of krum and multi_krum: the Byzantine clients tolerated (S > 2f + 2)", low=0),
    )
    READ_BY = {"trim": ("trimmed_mean",), "byzantine": KRUMS}  # a rule's parameter: the rules that read it

    def __post_init__(self) -> None:
        try:
            for link in LINKS:
                object.__setattr__(self, link, chain(getattr(self, link), link))
            if self.adversaries is not None:
                object.__setattr__(self, "adversaries", Adversaries.given(self.adversaries))
            object.__setattr__(self, "participation", Participation.given(self.participation))
            if self.server_optimizer is not None:
                object.__setattr__(self, "server_optimizer", ServerOptimizer.given(self.server_optimizer))
            if not isinstance(self.local_steps, int):
                object.__setattr__(self, "local_steps", LocalSteps.given(self.local_steps))
        except ParamError as err:
            raise ParamError(err.name, err.message, "federation") from None

    @property
    def uneven(self) -> bool:
        """Whether each participant takes its own number of local steps (`local_steps` a `LocalSteps`)."""
        return isinstance(self.local_steps, LocalSteps)

    def most_steps(self, sizes: Tensor | None = None) -> int:
        """The most local steps a client takes in a round: E, or the most of uneven local work (for epochs, over
        clients of `sizes` `[N]`)."""
        if isinstance(self.local_steps, LocalSteps):
            return self.local_steps.most(sizes, self.batch_size)
        return self.local_steps

    def config(self) -> dict[str, Any]:
        """Its fields as a run's configuration records them, so that a federation with none of the later fields
        is recorded (and hashed) as it was before they existed: a chain as its text (`top_k(k=0.05) →
        error_feedback(kind=ef21)`), an empty one left out; the adversaries as their text (`sign_flip(fraction=0.2,
        scale=10.0)`), none left out; `trim` and `byzantine` with the rule that reads them, else only where they
        are not at their default (two federations that differ are never recorded alike); the participation model as
        its text (`markov(p_on=0.2, p_off=0.1)`), uniform left out; uneven local steps as their text
        (`uniform(low=1, high=10)`); the server optimizer as its text (`adam(lr=0.01, beta1=0.9, beta2=0.99, tau=0.001,
        form=paper)`), none left out."""
        config = {f.name: getattr(self, f.name) for f in fields(self)
                  if f.name not in (*LINKS, *self.READ_BY, "adversaries", "participation", "server_optimizer", "axes")}
        defaults = {p.name: p.default for p in self.params}
        config.update({name: getattr(self, name) for name, rules in self.READ_BY.items()
                       if self.aggregation in rules or getattr(self, name) != defaults[name]})
        config.update({link: chain_text(getattr(self, link)) for link in LINKS if getattr(self, link)})
        if self.adversaries is not None:
            config["adversaries"] = str(self.adversaries)
        if self.participation.model != "uniform":
            config["participation"] = str(self.participation)
        if self.uneven:
            config["local_steps"] = str(self.local_steps)
        if self.server_optimizer is not None:
            config["server_optimizer"] = str(self.server_optimizer)
        config.update({axis.key: axis.config() for axis in self.axes if axis.config() is not None})
        return config

    def check(self, layout: Layout, batch_sizes: Mapping[str, int] | None = None) -> None:
        """Refuse (ParamError, naming the field) a federation whose own fields cannot run on clients laid out as
        `layout` with minibatches of `batch_sizes` (by the field that sets each, `minibatch_sizes`; default:
        `batch_size` alone): a value out of its parameter's range, more clients a round than the problem has, a
        minibatch above the smallest client's samples (where a part of the layout is unknown, it is not checked). The
        rules of its axes (its chains, adversaries, participation model, uneven local steps, server optimizer and
        `axes`) are each axis's own `check` in the registry `fedbench.axes.registry.AXES`;
        `fedbench.engine.checks.check_federation` applies them all, with what depends on the algorithm too
        (`check_uploads`), then this."""
        for param in self.params:
            if param.name == "local_steps" and self.uneven:
                continue  # a LocalSteps: its axis's rule (`fedbench.axes.participation.check_local_steps`)
            try:
                param.check(getattr(self, param.name))
            except ValueError as err:
                raise ParamError(param.name, str(err), "federation") from None
        if layout.clients is not None and self.clients_per_round > layout.clients:
            raise ParamError("clients_per_round", f"found {self.clients_per_round}, expected at most the problem's "
                             f"{layout.clients} clients (or 0: all)", "federation")
        for name, size in ({"batch_size": self.batch_size} if batch_sizes is None else batch_sizes).items():
            if layout.smallest is not None and size > layout.smallest:  # the problem does not cap it at n_k
                bound = (f"problem.{layout.smallest_field} = {layout.smallest}" if layout.smallest_field else
                         f"{layout.smallest}, the training samples of the smallest client")
                raise ParamError(name, f"found {size}, expected at most {bound}",
                                 "federation" if name == "batch_size" else "")  # else the algorithm's


def check_uploads(federation: Federation, algorithm: type[Algorithm], hp: Mapping[str, Any],
                  clients: int | None) -> None:
    """Refuse (ParamError at the federation's field) what acts on each client's uploads where the algorithm, with the
    hyperparameters `hp` (its `routing`), has no such message, on a problem of `clients` clients (None: unknown, not
    checked): an uplink chain or adversaries on an upload its devices all-reduce inside the round (`Upload.all_reduced`:
    the engine sees the one value they then all hold, not a message per client); a robust aggregation rule there too,
    or where the server does not take its uploads in through a mean (`Algorithm.uploads_averaged`), and there
    DP-FedAvg's `gaussian` step too (its one draw, shared by the clients, protects only their mean, not each client's
    upload: `fedbench.axes.transforms`); Krum and Multi-Krum with f too large for the clients a round, S ≤ 2f + 2
    (Blanchard et al. 2017, §4)."""
    name = algorithm.name
    reduced = [upload.name for upload in algorithm.routing(hp).uploads if upload.all_reduced]
    rule = federation.aggregation if federation.aggregation in RULES else None
    acting = {"uplink": ("a chain" if federation.uplink else None, "none"), "aggregation": (rule, "uniform or samples"),
              "adversaries": ("adversaries" if federation.adversaries else None, "none")}
    for field, (found, expected) in acting.items():
        if found and reduced:
            raise ParamError(field, f"found {found} for {name}, which all-reduces its upload {reduced[0]!r} (no "
                             f"message per client); expected {expected}", "federation")
    if rule and not algorithm.uploads_averaged:
        raise ParamError("aggregation", f"found {rule} for {name}, whose server uses each client's uploads (not "
                         "only their mean); expected uniform or samples", "federation")
    noise = gaussian_step(federation.uplink)
    if noise is not None and not algorithm.uploads_averaged:
        raise ParamError(f"uplink.{noise}.gaussian", f"found gaussian for {name}, whose server uses each client's "
                         "upload; expected none: its draw, shared by the clients, protects only their mean",
                         "federation")
    sampled = clients if algorithm.participation == "all" else federation.clients_per_round or clients
    f = federation.byzantine
    if rule in KRUMS and sampled is not None and sampled <= 2 * f + 2:
        most = f", f ≤ {(sampled - 3) // 2}" if sampled >= 3 else ""
        raise ParamError("byzantine", f"found {f} with {rule} on S = {sampled} clients a round; expected S > 2f + 2"
                         f"{most}", "federation")


def minibatch_sizes(minibatches: tuple[Minibatch, ...], hp: Mapping[str, Any],
                    batch_size: int) -> tuple[dict[str, int], dict[str, int]]:
    """The sizes of the minibatches with draws of their own: by minibatch name (what `RoundSampler` draws), and by
    the field that sets each (the federation's `batch_size` or a hyperparameter of the algorithm; an algorithm's
    fixed size is no field), what `Federation.check` checks."""
    sizes, fields = {}, {}
    for mb in minibatches:
        if mb.same_as is not None:
            continue
        if isinstance(mb.size, int):
            sizes[mb.name] = mb.size
        else:
            field = mb.size or "batch_size"
            sizes[mb.name] = fields[field] = hp[mb.size] if mb.size else batch_size
    return sizes, fields


class Draw(NamedTuple):
    """One run's draws of a round (`RoundSampler.draw_round`)."""

    clients: Tensor
    """The round's clients `[S]`, on the problem's device (every client, `[N]`, where all take part)."""
    rows: dict[str, Tensor]
    """The rows `[steps, S, b]` of each drawn minibatch."""
    steps: int
    """The round's local steps: E, the length the algorithm drew, or the most any slot takes (uneven local work)."""
    present: Tensor | None = None
    """Which slots hold a participant, `[S]` bool on the host, where their number varies (None: every slot)."""
    counts: Tensor | None = None
    """Each slot's local steps `[S]` (int64, on the host) under uneven local work (None: `steps` for every slot)."""
    lost: Tensor | None = None
    """Which participants' uploads go missing, `[S]` bool on the host (`fedbench.axes.registry.Axis.lost`; None:
    none)."""


class RoundSampler:
    """Each round's random draws: the participating clients (S sampled without replacement, all of them, or as the
    federation's participation model draws them, `fedbench.axes.participation`), each one's local steps under uneven
    local work and, for every local step, the rows of each minibatch the algorithm declares (a batch declared `same_as`
    another reuses its draw)."""

    def __init__(self, problem: Problem, federation: Federation, seed: int,
                 minibatches: tuple[Minibatch, ...] = (Minibatch("D"),), sizes: dict[str, int] | None = None):
        self.problem, self.federation = problem, federation
        self.minibatches = minibatches
        self.sizes = sizes or {mb.name: federation.batch_size for mb in minibatches}
        self.drawn = tuple(mb for mb in minibatches if mb.same_as is None)  # those with draws of their own
        self.client_gen = generator(seed, "clients")
        self.batch_gen = generator(seed, "minibatches")
        self.noise_gen = generator(seed, "feature-noise")  # the problem's minibatch_noise, if it has any
        count = problem.num_clients
        self.participants = Participants(federation.participation, count, federation.clients_per_round,
                                         self.client_gen)
        self.steps_gen: torch.Generator | None = None  # "local-steps": each round's counts, where they are drawn
        self.step_counts: StepCounts | None = None
        if isinstance(federation.local_steps, LocalSteps):
            if federation.local_steps.distribution is not None:
                self.steps_gen = generator(seed, "local-steps")
            self.step_counts = StepCounts(federation.local_steps, self.steps_gen, problem.client_sizes_cpu,
                                          federation.batch_size)
        self.epochs = federation.local_steps.epochs if isinstance(federation.local_steps, LocalSteps) else None
        # the streams of the axes that draw (`fedbench.axes.registry.Axis.stream`), and each axis's hook on the round's
        # slots
        self.axis_streams = {axis.stream: generator(seed, axis.stream) for axis in federation.axes if axis.stream}

    def draw(self, local_steps: int, everyone: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
        """(clients [S], rows `[local_steps, S, b]` per drawn minibatch name) of a round of `local_steps` steps for
        every client, uniformly sampled (or all of them, `everyone`): `draw_round`'s, where a federation has no other
        participation model and no uneven local work."""
        draw = self.draw_round(local_steps, everyone)
        return draw.clients, draw.rows

    def draw_round(self, local_steps: int | None, everyone: bool = False, index: int = 0) -> Draw:
        """Round `index`'s draws: its clients (all of them with `everyone`, else the participation model's, with the
        slots that hold a participant where their number varies, those whose uploads go missing), each slot's local
        steps under uneven local work (`local_steps` None), and the rows of as many local steps as the round has,
        `local_steps` or the most any slot takes."""
        lost = None
        if everyone:
            clients, present = torch.arange(self.problem.num_clients), None
        else:
            clients, present = self.participants.draw(index)
            for axis in self.federation.axes:  # whose uploads go missing (`fedbench.axes.registry.Axis.lost`)
                losing = axis.lost(present, len(clients), self.axis_streams.get(axis.stream))
                if losing is not None:
                    lost = losing if lost is None else lost | losing
        counts = None if self.step_counts is None else self.step_counts.draw(clients)
        steps = int(counts.max()) if counts is not None else local_steps
        assert steps is not None  # given where the counts are not drawn
        if self.epochs is not None:
            rows = {mb.name: self.problem.draw_epochs(clients, self.epochs, steps, self.sizes[mb.name], self.batch_gen)
                    for mb in self.drawn}
        else:
            rows = {mb.name: self.problem.draw_minibatches(clients, steps, self.sizes[mb.name], self.batch_gen)
                    for mb in self.drawn}
        return Draw(clients.to(self.problem.device), rows, steps, present, counts, lost)

    def step_batches(self, rows: dict[str, Tensor], step: int) -> Batches:
        """The oracles of local step `step` of this run alone (points `[S, d]`, no run axis)."""
        return Batches(step_oracles(self.problem, self.minibatches, {k: v[step] for k, v in rows.items()},
                                    lambda rows: self.problem.minibatch_noise(rows, self.noise_gen)))


def step_oracles(problem: Problem, minibatches: tuple[Minibatch, ...], rows: dict[str, Tensor],
                 noise: Callable[[Tensor], Tensor | None]) -> dict[str, Any]:
    """The problem's oracle of each declared minibatch of one local step, on its rows `[C, b]` (every client of every
    run in the step, flattened) with their `noise(rows)`; a batch declared `same_as` another shares its oracle."""
    oracles: dict[str, Any] = {}
    for mb in minibatches:
        if mb.same_as is not None:
            oracles[mb.name] = oracles[mb.same_as]
        else:
            oracles[mb.name] = problem.step_oracle(rows[mb.name], noise(rows[mb.name]))
    return oracles


def weighing_sizes(problem, federation) -> Tensor | None:
    """The clients' n_k `[N]` where the server weighs its clients by samples, else None (uniformly; a robust rule's
    uploads are all its aggregate, `fedbench.axes.robust`): how `fedbench.axes.slots.slot_weights` weighs a round's
    slots."""
    return problem.client_sizes if federation.aggregation == "samples" else None


def aggregation_weights(problem, federation, clients: Tensor, dtype: torch.dtype) -> Tensor:
    """π̂ over each run's sampled clients `clients` `[R, S]`, every one of them taking part: by samples n_k over the
    sampled set, else uniform 1/S (`fedbench.axes.slots.slot_weights`; `Slots.weights` over a round's heard slots)."""
    return slot_weights(clients, weighing_sizes(problem, federation), dtype)
