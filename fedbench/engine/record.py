"""A run's record (`RunRecord`): its problem, algorithm configuration, federation and random streams, its state and
counters and status, the rules it is checked by when it is made, and its metrics rows. The programs of
`fedbench.engine.runs` advance records; `fedbench.engine.simulate.Simulation` is a record that runs itself.

Random streams (see `fedbench.rng`): "init" (initial point), "clients" (who is sampled each round, as the
federation's participation model draws it, `fedbench.axes.participation`), "minibatches" (local minibatches), the
algorithm's own (`Algorithm.random_stream`, default "algorithm": coins, round lengths), "uplink" / "downlink" where
the federation's chain there draws (`fedbench.axes.transforms`), "adversaries" where the federation has some (which
clients, at the start; the gaussian attack's noise, `fedbench.axes.robust`), and "local-steps" where each round draws
its participants' numbers of local steps, and each axis's of `fedbench.axes.registry` that draws ("client-dropout":
whose upload is lost); the problem's data use its own "data" stream. Evaluation draws from none of them, so the curve's
schedule (`eval_every`) never changes a run.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from fedbench.algorithms.base import Algorithm
from fedbench.axes.privacy import ACCOUNTANTS, Accountant, Mechanism
from fedbench.axes.robust import adversarial_clients
from fedbench.axes.transforms import LINKS, draws
from fedbench.engine.checks import check_federation
from fedbench.engine.federation import DIVERGENCE_FACTOR, Federation, RoundSampler, aggregation_weights, minibatch_sizes
from fedbench.metrics import EPSILON
from fedbench.problems.base import Problem
from fedbench.rng import generator


class RunRecord:
    """One run's record: its problem, algorithm configuration, federation and streams, its state (without the run
    axis: server entries as `init_server` makes them, per-client `[N, ...]`), counters and status; refused
    (`fedbench.engine.checks.Refusal`, a ParamError naming the field) where the federation cannot run the algorithm on
    the problem (`fedbench.engine.checks.check_federation`). With `delta`, a run whose uplink adds DP-FedAvg's noise (a
    `gaussian` step) has in each row its `epsilon`: ε at δ after the row's rounds by the `accountant`
    (`fedbench.axes.privacy.ACCOUNTANTS`: pld, the tight default, or rdp). A run ends at `federation.rounds` or where it
    diverges (a non-finite metric, or an objective above `divergence_factor` times its value at the start, `exploded`);
    `compile` (`auto`, `on`, `off`, which `fedbench.engine.simulate.Simulation` checks) says whether its program's local
    steps run compiled (`fedbench.engine.compiling`)."""

    def __init__(self, problem: Problem, algorithm: Algorithm, federation: Federation, seed: int,
                 eval_every: int = 10, divergence_factor: float = DIVERGENCE_FACTOR, delta: float | None = None,
                 compile: str = "auto", accountant: str = ACCOUNTANTS[0]):
        minibatches = algorithm.minibatches(algorithm.hp)
        sizes, _ = minibatch_sizes(minibatches, algorithm.hp, federation.batch_size)
        check_federation(federation, algorithm, algorithm.declared, problem.layout())
        self.problem, self.algorithm, self.federation = problem, algorithm, federation
        self.seed = seed
        """The run's seed: its sampling, minibatches, initial point and other draws."""
        self.accountant = (None if delta is None else
                           Accountant(Mechanism.of(federation.uplink, federation.clients_per_round, algorithm,
                                                   problem.num_clients), delta, accountant))
        """With `delta` (a gaussian uplink step's run), each row's `epsilon`: ε at δ after the row's rounds
        (`fedbench.axes.privacy`); else None."""
        self.eval_every = max(1, int(eval_every))
        self.divergence_factor = divergence_factor
        self.compile = compile  # whether its program's local steps are compiled (`fedbench.engine.compiling`)
        self.start_objective: float | None = None
        self.sampler = RoundSampler(problem, federation, seed, minibatches, sizes)
        self.algorithm_gen = generator(seed, algorithm.random_stream)
        self.link_streams = {link: generator(seed, link) for link in LINKS if draws(getattr(federation, link))}
        self.adversary_gen: torch.Generator | None = None
        self.adversarial = torch.zeros(problem.num_clients, dtype=torch.bool)
        """Which of the N clients are adversarial, `[N]` bool (none without the federation's adversaries)."""
        if federation.adversaries is not None:
            self.adversary_gen = generator(seed, "adversaries")
            self.adversarial = adversarial_clients(problem.num_clients, federation.adversaries.fraction,
                                                   self.adversary_gen)
        w0 = problem.init_params(generator(seed, "init"))
        self.server = algorithm.init_server(w0)
        """The run's server state, entries as `init_server` makes them (no run or client axis)."""
        self.clients = algorithm.init_clients(w0, problem.num_clients)
        """The run's per-client state, entries `[N, ...]`."""
        self.rounds_done = 0
        """Rounds the run has taken."""
        self.iterations = 0  # local iterations per client so far
        self.comm_up = 0
        self.comm_down = 0
        self.comm_up_bits = 0
        self.comm_down_bits = 0
        self.train_seconds = 0.0
        self.eval_seconds = 0.0
        self.status = "running"
        """"running", then "finished" or "diverged"."""
        self.metric_names: list[str] = []

    RECORD = ("rounds_done", "iterations", "comm_up", "comm_down", "comm_up_bits", "comm_down_bits", "train_seconds",
              "eval_seconds", "status", "start_objective", "metric_names")

    def streams(self) -> dict[str, torch.Generator]:
        """Every random stream of the run by name (the module's docstring says each)."""
        adversaries = {} if self.adversary_gen is None else {"adversaries": self.adversary_gen}
        steps = {} if self.sampler.steps_gen is None else {"local-steps": self.sampler.steps_gen}
        return {"clients": self.sampler.client_gen, "minibatches": self.sampler.batch_gen,
                "feature-noise": self.sampler.noise_gen, "algorithm": self.algorithm_gen, **self.link_streams,
                **adversaries, **steps, **self.sampler.axis_streams}

    def state_dict(self) -> dict[str, Any]:
        """The run's record: its state as it holds it, each stream's state, its counters and, where it has
        adversaries, which clients they are, and where its participation model keeps a state (the Markov chains),
        that state (a program's checkpoint holds its runs' records,
        `fedbench.engine.round_wise.RoundProgram.state_dict`)."""
        adversarial = {} if self.adversary_gen is None else {"adversarial": self.adversarial}
        chains = self.sampler.participants.state_dict()
        return {"server": self.server, "clients": self.clients,
                "streams": {name: gen.get_state() for name, gen in self.streams().items()},
                **{name: getattr(self, name) for name in self.RECORD}, **adversarial,
                **({"participation": chains} if chains else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The run as `state_dict` recorded it: its state, streams, counters, adversaries and participation state."""
        self.server, self.clients = state["server"], state["clients"]
        if "comm_up_bits" not in state:
            # a checkpoint from before the bit counters, made without transforms (there were none): every value went
            # at its dtype's width
            width = self.server[self.algorithm.downloads[0]].element_size() * 8
            state = {**state, "comm_up_bits": state["comm_up"] * width, "comm_down_bits": state["comm_down"] * width}
        for name, gen in self.streams().items():
            gen.set_state(state["streams"][name].cpu())  # the generators live on the CPU (`fedbench.rng`)
        for name in self.RECORD:
            setattr(self, name, state[name])
        if self.adversary_gen is not None:
            self.adversarial = state["adversarial"]
        if "participation" in state:
            self.sampler.participants.load_state_dict(state["participation"])

    def exploded(self, row: dict[str, float]) -> bool:
        if not all(math.isfinite(v) for v in row.values()):
            return True
        start = self.start_objective
        return start is not None and row["objective"] > self.divergence_factor * max(abs(start), 1e-12)

    def count_round(self, uploaded: tuple[int, int], downloaded: tuple[int, int], steps: int) -> None:
        """A round that the engine ended for this run: its (floats, bits) up and down, its local steps."""
        self.comm_up += uploaded[0]
        self.comm_up_bits += uploaded[1]
        self.comm_down += downloaded[0]
        self.comm_down_bits += downloaded[1]
        self.rounds_done += 1
        self.iterations += steps

    def aggregation_weights(self, clients: Tensor) -> Tensor:
        """The server's weights `[S]` over this run's sampled clients `clients` `[S]`."""
        dtype = self.server[self.algorithm.downloads[0]].dtype
        return aggregation_weights(self.problem, self.federation, clients[None], dtype)[0]

    def personal_params(self) -> Tensor | None:
        """The per-client models `[N, d]` its rows evaluate and its saved model holds: the algorithm's
        `personal_params` where its runs on this problem report personal metrics (`Algorithm.personal`), else None."""
        return self.algorithm.personal_params(self.server, self.clients) if self.algorithm.personal else None

    def row(self, metrics: dict[str, float] | None) -> dict[str, float]:
        if metrics is None:
            metrics = dict.fromkeys(self.metric_names, math.nan)
        else:
            self.metric_names = list(metrics)
        row = {"round": self.rounds_done, **metrics, "comm_up": float(self.comm_up),
               "comm_down": float(self.comm_down), "iterations": float(self.iterations),
               "comm_up_bits": float(self.comm_up_bits), "comm_down_bits": float(self.comm_down_bits)}
        if self.accountant is not None:
            row[EPSILON] = self.accountant.epsilon(self.rounds_done)
        return row
