"""A run's federation and its random draws: the rounds, clients per round, local steps and batch size, the server's
aggregation, the uplink and downlink transforms and the adversaries (`Federation`), the clients and minibatch rows a
round draws on the run's streams (`RoundSampler`), the oracles of a local step (`step_oracles`) and the server's
aggregation weights (`aggregation_weights`). The record of a run is `fedbench.simulate.Simulation`; the programs that
advance runs are `fedbench.runs`."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from fedbench.hparams import Param, ParamError
from fedbench.oracle import Batches, Minibatch
from fedbench.problems.base import Layout, Problem
from fedbench.rng import generator
from fedbench.robust import KRUMS, RULES, Adversaries
from fedbench.transforms import LINKS, Step, chain, chain_text, check_chain

DIVERGENCE_FACTOR = 1e4


@dataclass(frozen=True)
class Federation:
    """How a run's rounds go: `rounds`, `clients_per_round` S (0: every client), `local_steps` E, `batch_size` b, the
    server's `aggregation` (weights "uniform": π̂_k = 1/S, or "samples": π̂_k ∝ n_k over the sampled set; or a robust
    rule of `fedbench.robust`, with its `trim` β or `byzantine` f), the transforms of what crosses the network,
    `uplink` and `downlink` (`fedbench.transforms`, given as a recipe writes them and held as steps), and the
    `adversaries` (`fedbench.robust.Adversaries`, or None), as a recipe's `federation:` block sets them (the scalar
    ones declared in `params`).

    Example:
        ```python
        Federation(rounds=2000, clients_per_round=10, local_steps=10, batch_size=10)
        Federation(rounds=2000, uplink=[{"top_k": 0.05}, {"error_feedback": "ef21"}], downlink=[{"qsgd": 8}])
        ```
    """

    rounds: int = 100
    clients_per_round: int = 10
    local_steps: int = 10
    batch_size: int = 10
    aggregation: str = "uniform"  # "uniform", "samples" (weights) or one of `fedbench.robust.RULES`
    # transforms of each client's uploads and of the server's broadcast (`fedbench.transforms`); given as a recipe
    # writes them (`[{"top_k": 0.05}, {"error_feedback": "ef21"}]`) or as steps
    uplink: tuple[Step, ...] = ()
    downlink: tuple[Step, ...] = ()
    trim: float = 0.1  # β of trimmed_mean
    byzantine: int = 1  # f of krum and multi_krum
    # the clients that attack (`fedbench.robust`); given as a recipe writes it (`{"fraction": 0.2}`) or as one
    adversaries: Adversaries | None = None

    params = (
        Param("rounds", "int", 100, "communication rounds R", low=0),
        Param("clients_per_round", "int", 10, "clients sampled per round S (0: every client, whatever their number)",
              low=0),
        Param("local_steps", "int", 10, "local steps E per round (an algorithm may draw its rounds' lengths)",
              low=1),
        Param("batch_size", "int", 10, "minibatch size b", low=1),
        Param("aggregation", "choice", "uniform", "the server's mean over the sampled clients, weights uniform or by "
              "samples, or a robust rule in its place (fedbench.robust)", choices=("uniform", "samples", *RULES)),
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
        except ParamError as err:
            raise ParamError(err.name, err.message, "federation") from None

    def config(self) -> dict[str, Any]:
        """Its fields as a run's configuration records them, so that a federation with none of the later fields
        is recorded (and hashed) as it was before they existed: a chain as its text (`top_k(k=0.05) →
        error_feedback(kind=ef21)`), an empty one left out; the adversaries as their text (`sign_flip(fraction=0.2,
        scale=10.0)`), none left out; `trim` and `byzantine` with the rule that reads them, else only where they
        are not at their default (two federations that differ are never recorded alike)."""
        config = {f.name: getattr(self, f.name) for f in fields(self)
                  if f.name not in (*LINKS, *self.READ_BY, "adversaries")}
        defaults = {p.name: p.default for p in self.params}
        config.update({name: getattr(self, name) for name, rules in self.READ_BY.items()
                       if self.aggregation in rules or getattr(self, name) != defaults[name]})
        config.update({link: chain_text(getattr(self, link)) for link in LINKS if getattr(self, link)})
        if self.adversaries is not None:
            config["adversaries"] = str(self.adversaries)
        return config

    def check(self, layout: Layout, batch_sizes: Mapping[str, int] | None = None) -> None:
        """Refuse (ParamError, naming the field) a federation that cannot run on clients laid out as `layout` with
        minibatches of `batch_sizes` (by the field that sets each, `minibatch_sizes`; default: `batch_size`
        alone): the rule of the engine on a built problem and of a recipe's validator on a problem's declared layout
        (where a part unknown is not checked). Its chains are checked by `fedbench.transforms.check_chain`, its
        adversaries by `fedbench.robust.Adversaries.check`; what depends on the algorithm too (its uploads, how many
        clients a round it takes) by `fedbench.links.check_uploads`."""
        for param in self.params:
            try:
                param.check(getattr(self, param.name))
            except ValueError as err:
                raise ParamError(param.name, str(err), "federation") from None
        try:
            for link in LINKS:
                check_chain(getattr(self, link), link, self.aggregation)
            if self.adversaries is not None:
                self.adversaries.check()
        except ParamError as err:
            raise ParamError(err.name, err.message, "federation") from None
        if layout.clients is not None and self.clients_per_round > layout.clients:
            raise ParamError("clients_per_round", f"found {self.clients_per_round}, expected at most the problem's "
                             f"{layout.clients} clients (or 0: all)", "federation")
        for name, size in ({"batch_size": self.batch_size} if batch_sizes is None else batch_sizes).items():
            if layout.smallest is not None and size > layout.smallest:  # the problem does not cap it at n_k
                bound = (f"problem.{layout.smallest_field} = {layout.smallest}" if layout.smallest_field else
                         f"{layout.smallest}, the training samples of the smallest client")
                raise ParamError(name, f"found {size}, expected at most {bound}",
                                 "federation" if name == "batch_size" else "")  # else the algorithm's


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


PERMUTATION_LIMIT = 4096  # clients up to which a round's clients are a prefix of a random permutation


def sample_clients(count: int, size: int, gen: torch.Generator) -> Tensor:
    """`size` distinct clients of `count`, uniformly, in draw order. Up to PERMUTATION_LIMIT clients, the first
    `size` of a random permutation (the draws every recorded curve was made with); beyond, each next client uniform
    over those not yet drawn, by rejecting repeats of `randint` draws: O(size) work instead of the permutation's
    O(count) (430 µs a round at 10⁵ clients here, more than a small round's arithmetic)."""
    if count <= PERMUTATION_LIMIT or size * 4 > count:
        return torch.randperm(count, generator=gen)[:size]
    drawn: dict[int, None] = {}
    while len(drawn) < size:
        for client in torch.randint(count, (size,), generator=gen).tolist():
            drawn.setdefault(client)
            if len(drawn) == size:
                break
    return torch.tensor(list(drawn))


class RoundSampler:
    """Each round's random draws: the participating clients (S sampled without replacement, or all of them)
    and, for every local step, the rows of each minibatch the algorithm declares (a batch declared
    `same_as` another reuses its draw)."""

    def __init__(self, problem: Problem, federation: Federation, seed: int,
                 minibatches: tuple[Minibatch, ...] = (Minibatch("D"),), sizes: dict[str, int] | None = None):
        self.problem, self.federation = problem, federation
        self.minibatches = minibatches
        self.sizes = sizes or {mb.name: federation.batch_size for mb in minibatches}
        self.drawn = tuple(mb for mb in minibatches if mb.same_as is None)  # those with draws of their own
        self.client_gen = generator(seed, "clients")
        self.batch_gen = generator(seed, "minibatches")
        self.noise_gen = generator(seed, "feature-noise")  # the problem's minibatch_noise, if it has any

    def draw(self, local_steps: int, everyone: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
        """(clients [S], rows `[local_steps, S, b]` per drawn minibatch name)."""
        count = self.problem.num_clients
        if everyone:
            clients = torch.arange(count)
        else:
            clients = sample_clients(count, self.federation.clients_per_round or count, self.client_gen)
        rows = {mb.name: self.problem.draw_minibatches(clients, local_steps, self.sizes[mb.name], self.batch_gen)
                for mb in self.drawn}
        return clients.to(self.problem.device), rows

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


def aggregation_weights(problem, federation, clients: Tensor, dtype: torch.dtype) -> Tensor:
    """π̂ over each run's sampled clients `clients` `[R, S]`: by samples n_k over the sampled set, else uniform 1/S
    (a robust rule's uploads are all its aggregate, `fedbench.robust`)."""
    if federation.aggregation != "samples":
        return torch.full(clients.shape, 1.0 / clients.shape[-1], dtype=dtype, device=clients.device)
    sizes = problem.client_sizes[clients].to(dtype)
    return sizes / sizes.sum(-1, keepdim=True)
