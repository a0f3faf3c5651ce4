"""Who takes part in a round and how many local steps each participant takes: the federation's participation model
(`federation.participation`) and uneven local work (`federation.local_steps` as a mapping), for any algorithm, drawn
on each run's own streams on the host, so that a run draws the same alone and in a batch of runs.

Participation models (`federation.participation: {model: ..., ...}`; S = `clients_per_round`, N the clients):

* `uniform` (the default): S of the N clients, uniformly without replacement, every round
  (`sample_clients`), the draws every recorded curve was made with.
* `cyclic` (`groups` K): the clients are split once per run into K groups by a random permutation (the first
  N mod K groups of ⌈N/K⌉ clients, the others of ⌊N/K⌋); round r draws S clients uniformly without replacement from
  group r mod K, so that each client is available once every K rounds (cyclic client participation: Cho, Sharma,
  Joshi, Xu, Kale, Zhang, ICML 2023, "On the Convergence of Federated Averaging with Cyclic Client Participation").
  S is at most the smallest group's ⌊N/K⌋.
* `bernoulli`: each client is available in each round independently with its probability p_k: `p` for every client,
  p_k drawn once per run uniformly in [`p_low`, `p_high`], or the N values of a file `p_file` (a `.npy` array or a
  `.csv` of numbers, in the clients' order; in a recipe, a relative path is the recipe's folder's).
* `markov` (`p_on`, `p_off`): each client's availability is a two-state Markov chain, from off to on with
  probability p_on and from on to off with p_off at each round, started from its stationary law (on with probability
  p_on / (p_on + p_off)). Independent and stationary, mixing participation patterns are among those Wang and Ji
  analyse (NeurIPS 2022, "A Unified Analysis of Federated Learning with Arbitrary Client Participation").

With `bernoulli` and `markov` a round's participants are its available clients, at most S of them (S drawn uniformly
among them where more are available; `clients_per_round: 0`: all the available ones), so that their number varies
from round to round, and may be zero.

How a round of a varying number of participants runs, batched (`fedbench.axes.slots.Slots` applies the rules of this
paragraph and the next, in one place): its clients keep a fixed axis of S slots (N with `clients_per_round: 0`), the
participants first, then clients that do not take part, so that every slot holds a distinct client; a mask `[R, S]` says
which slots hold a participant. The engine, not the algorithm, makes an absent slot count for nothing: the aggregation
weights are zero there and renormalised over the present slots (uniform: 1/S' over the S' participants; by samples: n_k
over theirs), the absent slots' uploads are zeros before the server's update (so that a sum over the clients, SCAFFOLD's
Σ Δc_k / N, is the participants' sum), their per-client state and their error-feedback vectors are left as they were, a
run whose round has no participant keeps its server state, and only the participants' uploads and downloads are counted.
The computation of an absent slot is done and discarded (cheaper than a batch of another shape each round). What takes S
clients a round cannot take a varying number and is refused at validation: the robust aggregation rules, an algorithm
whose server uses each client's uploads (FeDXL's pools) or that takes every client every round (the block methods), and
DP-FedAvg's noise, whose privacy is accounted for S of N clients drawn uniformly (`fedbench.axes.privacy`).

Uneven local work (`federation.local_steps` a mapping instead of the integer E): each participant takes its own
number of local steps in a round, as clients of different speed do (the heterogeneous local work of Wang, Liu,
Liang, Joshi, Poor, NeurIPS 2020, "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization"):

* `{distribution: uniform, low: 1, high: 10}`: each slot's count drawn every round uniformly among the integers of
  [low, high];
* `{counts: [...]}` or `{file: steps.npy}`: each client's own count, always the same (N integers, in the clients'
  order; a file as for `p_file`);
* `{epochs: E}`: E passes over each client's own samples, as FedAvg's experiments run it (McMahan et al., AISTATS
  2017, Algorithm 1; Reddi et al., ICLR 2021, §5: one epoch at b = 20): client k takes ⌈E·n_k / b⌉ steps whose
  minibatches are its E passes, each in the order of a fresh permutation, cut into consecutive batches of b
  (`Problem.draw_epochs`; the last batch short). Only a problem whose minibatches may be short (`caps_batches`, row
  −1 weighing nothing) takes it.

The round runs as many steps as its longest count, batched; a client past its count keeps its local state (every
entry with a client axis, `torch.where`), and an algorithm's maths that needs a client's count reads `rnd.client_steps`
(`[R, S, 1]`; SCAFFOLD's control variate divides by it). An algorithm takes uneven local work where its maths reads
neither the round's length nor its last step nor the iterations before it (FedDA's and Fast-FedDA's weights and prox,
FedMiD's `yuan` threshold, CODASCA's averages read them), as a dry round of it finds (`fedbench.engine.dry_round`), else
it is refused at validation. A run counts its rounds' lengths (its longest count each round) in its `iterations`.

Streams (`fedbench.rng`): the participation model draws on the run's "clients" stream, its one-time draws (the
groups, the p_k of [p_low, p_high], the chains' start) first; the counts of `distribution: uniform` on its own stream
"local-steps" (existing only then), so that the same seed samples the same clients with and without uneven local
work. The Markov chains' states `[N]` are part of the run's record and its checkpoint.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import torch
from torch import Tensor

from fedbench.axes.privacy import gaussian_step
from fedbench.axes.robust import RULES
from fedbench.hparams import Param, ParamError
from fedbench.problems.base import Layout

if TYPE_CHECKING:
    from fedbench.algorithms.base import Algorithm

MODELS = ("uniform", "cyclic", "bernoulli", "markov")
VARYING = ("bernoulli", "markov")  # the models whose rounds have a varying number of participants
READS = {"uniform": (), "cyclic": ("groups",), "bernoulli": ("p", "p_low", "p_high", "p_file"),
         "markov": ("p_on", "p_off")}  # the fields each model reads
TABLE_SUFFIXES = (".npy", ".csv")
FILES = ("p_file", "file")  # the fields that name a file of per-client values


def read_table(path: str, field: str) -> tuple[float, ...]:
    """The numbers of the file at `path` (a `.npy` array or a `.csv` of numbers, in the clients' order), flat; refused
    (ParamError at `field`, naming the file) where it cannot be read so."""
    chosen = Path(path).expanduser()
    if chosen.suffix not in TABLE_SUFFIXES:
        raise ParamError(field, f"found {path!r}, expected a .npy or .csv file")
    try:
        data = chosen.read_bytes()
        values = (np.load(io.BytesIO(data), allow_pickle=False) if chosen.suffix == ".npy"
                  else np.loadtxt(io.StringIO(data.decode()), delimiter=",", ndmin=1))
        return tuple(np.asarray(values, dtype=np.float64).reshape(-1).tolist())
    except OSError as err:
        raise ParamError(field, f"cannot read {path} ({err.strerror})") from None
    except ValueError as err:  # not numbers, a malformed array, a pickled object
        raise ParamError(field, f"{path}: {str(err).splitlines()[0]}; expected numbers") from None


def digest(values: tuple[float, ...]) -> str:
    """The first 12 hex digits of the sha256 of per-client values (as float64): what a run's configuration records."""
    return hashlib.sha256(np.asarray(values, dtype=np.float64).tobytes()).hexdigest()[:12]


def _check_table(values: tuple[float, ...], where: str, field: str, clients: int | None, integers: bool) -> None:
    """Refuse a file's per-client values (`where` names it) that are not `clients` of them (where known), each in
    [0, 1] (probabilities) or an integer ≥ 1 (local steps)."""
    if clients is not None and len(values) != clients:
        raise ParamError(field, f"{where}found {len(values)} values, expected one per client, {clients}")
    array = np.asarray(values)
    bad = ~((array >= 1) & (array == np.round(array))) if integers else ~((array >= 0) & (array <= 1))
    if bad.any():
        expected = "integers ≥ 1" if integers else "probabilities in [0, 1]"
        raise ParamError(field, f"{where}found {array[bad][0]:g} at client {int(np.argmax(bad))}, expected "
                         f"{expected}")


def _given(cls, spec: Any, field: str, example: str):
    """An instance of the dataclass `cls` from a mapping as a recipe writes it; refused (ParamError at `field` or
    `field.NAME`) where it is no such mapping, or its file cannot be read. Its values are checked by the instance's
    `check`."""
    if isinstance(spec, cls):
        return spec
    if not isinstance(spec, Mapping):
        raise ParamError(field, f"found {spec!r}, expected a mapping, e.g. {example}")
    names = [p.name for p in cls.params]
    for name in spec:
        if name not in names:
            raise ParamError(f"{field}.{name}", f"found {name!r}, expected one of {', '.join(names)}")
    return cls(**spec)


def _check_params(item, field: str) -> None:
    for param in item.params:
        try:
            param.check(getattr(item, param.name))
        except ValueError as err:
            raise ParamError(f"{field}.{param.name}", str(err)) from None


def _one_form(field: str, given: dict[str, bool], context: str, expected: str) -> str:
    """The one form of a mapping that takes exactly one of several (`given`: each form's name, whether it is given);
    none or several refused (ParamError at `field`, "found p and p_low{context}, expected {expected}")."""
    forms = [name for name, present in given.items() if present]
    if len(forms) != 1:
        found = " and ".join(forms) if forms else "none of them"
        raise ParamError(field, f"found {found}{context}, expected {expected}")
    return forms[0]


def _text(name: str, given: dict[str, Any]) -> str:
    return f"{name}({', '.join(f'{key}={value}' for key, value in given.items())})"


@dataclass(frozen=True)
class Participation:
    """`federation.participation`: which clients may take part in each round (the module's docstring says what each
    model draws); only the fields its `model` reads are given. A `p_file` is read where the model is made: its values
    are `table`, with which the runs go (a file edited later changes no run made before)."""

    model: str = "uniform"
    groups: int | None = None
    p: float | None = None
    p_low: float | None = None
    p_high: float | None = None
    p_file: str | None = None
    p_on: float | None = None
    p_off: float | None = None
    table: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)  # p_file's values, read when given

    params = (
        Param("model", "choice", "uniform", "who may take part in a round: S uniformly (uniform), S of the round's "
              "group (cyclic), or each client when available (bernoulli, markov)", choices=MODELS),
        Param("groups", "int", None, "cyclic: the K groups the clients are split into once per run", low=1,
              nullable=True),
        Param("p", "float", None, "bernoulli: each client's probability of being available in a round", low=0,
              high=1, nullable=True),
        Param("p_low", "float", None, "bernoulli: each client's p_k drawn once per run uniformly in [p_low, p_high]",
              low=0, high=1, nullable=True),
        Param("p_high", "float", None, "bernoulli: the upper end of p_low's range", low=0, high=1, nullable=True),
        Param("p_file", "str", None, "bernoulli: a .npy or .csv file of the N clients' p_k (a relative path: the "
              "recipe's folder's)", nullable=True),
        Param("p_on", "float", None, "markov: an unavailable client's probability of being available at the next "
              "round", low=0, high=1, nullable=True),
        Param("p_off", "float", None, "markov: an available client's probability of being unavailable at the next "
              "round", low=0, high=1, nullable=True),
    )

    @classmethod
    def given(cls, spec: Any) -> Participation:
        """From a mapping as a recipe writes it (`{model: bernoulli, p: 0.3}`); refused (ParamError at `participation`
        or `participation.NAME`) where it is no such mapping."""
        return _given(cls, spec, "participation", "{model: bernoulli, p: 0.3}")

    def __post_init__(self) -> None:
        if self.p_file is not None and self.table is None:
            object.__setattr__(self, "table", read_table(self.p_file, "participation.p_file"))

    @property
    def varying(self) -> bool:
        """Whether its rounds have a varying number of participants (bernoulli, markov)."""
        return self.model in VARYING

    def _values(self) -> dict[str, Any]:
        """Its fields given beside the model (not None), by name."""
        return {p.name: getattr(self, p.name) for p in self.params if p.name != "model"
                and getattr(self, p.name) is not None}

    def __str__(self) -> str:
        """As a run's configuration records it: `bernoulli(p=0.3)`, `cyclic(groups=4)`, a file by its name and its
        values' sha256 (`bernoulli(p_file=avail.npy, sha256=…)`): an edited file's runs run again, a moved one's
        not."""
        given = self._values()
        if self.p_file is not None and self.table is not None:
            given.update(p_file=Path(self.p_file).name, sha256=digest(self.table))
        return _text(self.model, given)

    def check(self, clients: int | None, sampled: int) -> None:
        """Refuse (ParamError at `participation.NAME`, or at `clients_per_round`) a model without its parameters,
        with another model's, a value out of its range, and, on `clients` clients (None: unknown, not checked) with
        `sampled` S a round (0: all), more groups than clients, S above the smallest group, and a file of
        probabilities that is not one per client in [0, 1]."""
        _check_params(self, "participation")
        reads = READS[self.model]
        for name, value in self._values().items():
            if name not in reads:
                also = f"which reads {', '.join(reads)}" if reads else "which reads no other field"
                raise ParamError(f"participation.{name}", f"found {value!r} with model {self.model}, {also}")
        if self.model == "cyclic":
            if self.groups is None:
                raise ParamError("participation.groups", "found none, expected K groups, e.g. {model: cyclic, groups: "
                                 "4}")
            if clients is not None and self.groups > clients:
                raise ParamError("participation.groups", f"found {self.groups}, expected at most the problem's "
                                 f"{clients} clients")
            if clients is not None and not 1 <= sampled <= clients // self.groups:
                raise ParamError("clients_per_round", f"found {sampled} with cyclic participation, expected 1 to "
                                 f"{clients // self.groups}, the smallest of {self.groups} groups of {clients} clients")
        elif self.model == "bernoulli":
            ranged = self.p_low is not None or self.p_high is not None
            form = _one_form("participation", {"p": self.p is not None, "p_low": ranged,
                                               "p_file": self.p_file is not None},
                             " for bernoulli", "one of p, p_low with p_high, or p_file")
            if form == "p_low":
                if self.p_low is None or self.p_high is None:
                    missing = "p_high" if self.p_high is None else "p_low"
                    raise ParamError(f"participation.{missing}", "found none, expected p_low and p_high together")
                if self.p_low > self.p_high:
                    raise ParamError("participation.p_high", f"found {self.p_high}, expected at least p_low "
                                     f"{self.p_low}")
            if self.table is not None:
                _check_table(self.table, f"{self.p_file}: ", "participation.p_file", clients, integers=False)
        elif self.model == "markov":
            for name in ("p_on", "p_off"):
                if getattr(self, name) is None:
                    raise ParamError(f"participation.{name}", "found none, expected both, e.g. {model: markov, p_on: "
                                     "0.2, p_off: 0.1}")
            if self.p_on + self.p_off == 0:  # type: ignore[operator]  # both given (above)
                raise ParamError("participation.p_on", "found p_on = p_off = 0, expected p_on + p_off > 0 (the "
                                 "chains' stationary law)")

    def availability(self, count: int, gen: torch.Generator) -> Tensor:
        """The clients' probabilities p_k `[count]` (float64) of a bernoulli model: drawn on `gen` where given as a
        range, the first draws of the run's stream."""
        if self.p is not None:
            return torch.full((count,), self.p, dtype=torch.float64)
        if self.table is not None:
            return torch.tensor(self.table, dtype=torch.float64)
        assert self.p_low is not None and self.p_high is not None  # `check`
        return self.p_low + (self.p_high - self.p_low) * torch.rand(count, generator=gen, dtype=torch.float64)


@dataclass(frozen=True)
class LocalSteps:
    """`federation.local_steps` as a mapping: uneven local work, each participant's own number of local steps (the
    module's docstring); one of `distribution` (with `low` and `high`), `counts`, `file` or `epochs`. A `file` is read
    where the mapping is made: its values are `table`, with which the runs go."""

    distribution: str | None = None
    low: int | None = None
    high: int | None = None
    counts: tuple[int, ...] | None = None
    file: str | None = None
    epochs: int | None = None
    table: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)  # the file's, read when given

    params = (
        Param("distribution", "choice", None, "each participant's count drawn every round: uniform, an integer in "
              "[low, high]", choices=("uniform",), nullable=True),
        Param("low", "int", None, "uniform: the fewest local steps", low=1, nullable=True),
        Param("high", "int", None, "uniform: the most local steps", low=1, nullable=True),
        Param("counts", "ints", None, "each client's own local steps, one per client in their order", low=1,
              nullable=True),
        Param("file", "str", None, "a .npy or .csv file of each client's local steps (a relative path: the recipe's "
              "folder's)", nullable=True),
        Param("epochs", "int", None, "passes over each client's own samples: ⌈epochs·n_k / b⌉ steps, each pass in "
              "the order of a fresh permutation cut into batches of b (the last one short)", low=1, nullable=True),
    )

    def __post_init__(self) -> None:
        if self.counts is not None and not isinstance(self.counts, tuple):
            object.__setattr__(self, "counts", tuple(self.counts))
        if self.file is not None and self.table is None:
            object.__setattr__(self, "table", read_table(self.file, "local_steps.file"))

    @classmethod
    def given(cls, spec: Any) -> LocalSteps:
        """From a mapping as a recipe writes it (`{distribution: uniform, low: 1, high: 10}`); refused (ParamError at
        `local_steps` or `local_steps.NAME`) where it is no such mapping."""
        return _given(cls, spec, "local_steps", "{distribution: uniform, low: 1, high: 10}")

    def __str__(self) -> str:
        """As a run's configuration records it: `uniform(low=1, high=10)`; per-client counts by their values'
        sha256 (`counts(sha256=…)`; a file's with its name, `file(steps.npy, sha256=…)`)."""
        if self.distribution is not None:
            return _text(self.distribution, {"low": self.low, "high": self.high})
        if self.counts is not None:
            return f"counts(sha256={digest(self.counts)})"
        if self.epochs is not None:
            return _text("epochs", {"epochs": self.epochs})
        assert self.file is not None and self.table is not None  # `check`
        return f"file({Path(self.file).name}, sha256={digest(self.table)})"

    def check(self, clients: int | None) -> None:
        """Refuse (ParamError at `local_steps` or `local_steps.NAME`) none or more than one form, a value out of its
        range, low above high, and per-client counts (on `clients` clients; None: unknown, not checked) that are not
        one integer ≥ 1 per client."""
        _check_params(self, "local_steps")
        drawn = self.distribution is not None or self.low is not None or self.high is not None
        form = _one_form("local_steps", {"distribution": drawn, "counts": self.counts is not None,
                                         "file": self.file is not None, "epochs": self.epochs is not None},
                         "", "one of distribution (with low and high), counts, file or epochs")
        if form == "distribution":
            for name in ("distribution", "low", "high"):
                if getattr(self, name) is None:
                    raise ParamError(f"local_steps.{name}", "found none, expected all three, e.g. {distribution: "
                                     "uniform, low: 1, high: 10}")
            if self.low > self.high:  # type: ignore[operator]  # both given (above)
                raise ParamError("local_steps.high", f"found {self.high}, expected at least low {self.low}")
        if self.counts is not None and clients is not None and len(self.counts) != clients:
            raise ParamError("local_steps.counts", f"found {len(self.counts)} counts, expected one per client, "
                             f"{clients}")
        if self.table is not None:
            _check_table(self.table, f"{self.file}: ", "local_steps.file", clients, integers=True)

    def per_client(self, sizes: Tensor | None = None, batch_size: int | None = None) -> Tensor | None:
        """Each client's count `[N]` (int64) where the counts are per client, else None (drawn each round); for
        `epochs`, ⌈epochs·n_k / b⌉ of the clients' `sizes` n_k `[N]` and the batch size b (None where not given)."""
        if self.epochs is not None:
            if sizes is None or batch_size is None:
                return None
            return torch.div(self.epochs * sizes.long() + batch_size - 1, batch_size, rounding_mode="floor")
        values = self.counts if self.counts is not None else self.table
        return None if values is None else torch.tensor(values, dtype=torch.float64).long()

    def most(self, sizes: Tensor | None = None, batch_size: int | None = None) -> int:
        """The most local steps a client takes in a round (for `epochs`, of clients of `sizes` at batch size b)."""
        table = self.per_client(sizes, batch_size)
        if table is None and self.epochs is not None:
            raise ValueError("the local steps of epochs depend on the clients' sizes and the batch size")
        return int(self.high) if table is None else int(table.max())  # type: ignore[arg-type]  # `check`


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


class Participants:
    """One run's participants of each round under its federation's participation model, drawn on the run's "clients"
    stream `gen` (the module's docstring): `draw` gives a round's clients in S slots and which slots hold a
    participant. Its state beyond the stream (the Markov chains') is in `state_dict`."""

    def __init__(self, participation: Participation, count: int, sampled: int, gen: torch.Generator):
        self.model, self.count, self.gen = participation.model, count, gen
        self.slots = sampled or count  # S, or every client
        self.groups: tuple[Tensor, ...] = ()
        self.probability = torch.zeros(0, dtype=torch.float64)  # bernoulli's p_k [N]
        self.on = self.off = 0.0  # markov's switching probabilities
        self.available = torch.zeros(0, dtype=torch.bool)  # markov's chains [N]
        if self.model == "cyclic":
            assert participation.groups is not None  # `Participation.check`
            self.groups = torch.tensor_split(torch.randperm(count, generator=gen), participation.groups)
        elif self.model == "bernoulli":
            self.probability = participation.availability(count, gen)
        elif self.model == "markov":
            self.on, self.off = float(participation.p_on), float(participation.p_off)  # type: ignore[arg-type]
            self.available = torch.rand(count, generator=gen, dtype=torch.float64) < self.on / (self.on + self.off)

    def draw(self, index: int) -> tuple[Tensor, Tensor | None]:
        """Round `index`'s clients `[S]` and which slots hold a participant (`[S]` bool; None: every slot)."""
        if self.model == "uniform":
            return sample_clients(self.count, self.slots, self.gen), None
        if self.model == "cyclic":
            group = self.groups[index % len(self.groups)]
            return group[torch.randperm(len(group), generator=self.gen)[:self.slots]], None
        if self.model == "bernoulli":
            available = torch.rand(self.count, generator=self.gen, dtype=torch.float64) < self.probability
        else:  # markov: this round's states, then each chain's step to the next round
            available = self.available
            switch = torch.rand(self.count, generator=self.gen, dtype=torch.float64)
            self.available = torch.where(available, switch >= self.off, switch < self.on)
        return self._slots(available)

    def _slots(self, available: Tensor) -> tuple[Tensor, Tensor]:
        """The available clients in the slots, at most S of them (S drawn uniformly without replacement where more
        are available), then clients that do not take part in index order: every slot a distinct client."""
        chosen = available.nonzero().flatten()
        if len(chosen) > self.slots:
            chosen = chosen[torch.randperm(len(chosen), generator=self.gen)[:self.slots]]
        taking = torch.zeros(self.count, dtype=torch.bool).index_fill_(0, chosen, True)
        clients = torch.cat([chosen, (~taking).nonzero().flatten()])[:self.slots]
        return clients, torch.arange(self.slots) < len(chosen)

    def state_dict(self) -> dict[str, Tensor]:
        """The state beyond the stream: the Markov chains' `[N]` (nothing for the other models)."""
        return {"available": self.available} if self.model == "markov" else {}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        if self.model == "markov":
            self.available = state["available"]


class StepCounts:
    """One run's local steps of each round's slots under uneven local work: drawn on its "local-steps" stream (a
    distribution), or each client's own (counts, a file, or epochs over its `sizes` `[N]` in batches of b)."""

    def __init__(self, local_steps: LocalSteps, gen: torch.Generator | None, sizes: Tensor | None = None,
                 batch_size: int | None = None):
        low, high = local_steps.low, local_steps.high
        self.table, self.gen = local_steps.per_client(sizes, batch_size), gen
        self.span = (0, 0) if low is None or high is None else (low, high + 1)  # a distribution's [low, high + 1)

    def draw(self, clients: Tensor) -> Tensor:
        """The counts `[S]` (int64) of the round's clients `clients` `[S]` (on the host)."""
        if self.table is not None:
            return self.table[clients]
        return torch.randint(*self.span, (len(clients),), generator=self.gen)


def check_participation(federation: Any, algorithm: type[Algorithm], hp: Mapping[str, Any], layout: Layout) -> None:
    """`federation.participation`'s rules (`fedbench.axes.registry`): the model's own (`Participation.check`); refused,
    any but uniform for an algorithm taking every client or with DP-FedAvg's noise (accounted for S of N drawn
    uniformly), and a varying number of participants for a server using each client's uploads (not only their mean) or a
    robust rule."""
    given, aggregation, name = federation.participation, federation.aggregation, algorithm.name
    if given.model != "uniform" and algorithm.participation == "all":
        raise ParamError("participation.model", f"found {given.model} for {name}, which takes every client every "
                         "round; expected uniform")
    if given.varying and not algorithm.uploads_averaged:
        raise ParamError("participation.model", f"found {given.model} for {name}, whose server uses each client's "
                         "uploads (not only their mean), for a varying number of participants; expected uniform or "
                         "cyclic")
    given.check(layout.clients, federation.clients_per_round)
    if given.varying and aggregation in RULES:
        raise ParamError("participation.model", f"found {given.model} with aggregation {aggregation} (a rule of S "
                         "uploads); expected uniform or cyclic")
    if given.model != "uniform" and gaussian_step(federation.uplink) is not None:
        raise ParamError("participation.model", f"found {given.model} with DP-FedAvg's noise (accounted for S of N "
                         "drawn uniformly); expected uniform")


def check_local_steps(federation: Any, algorithm: type[Algorithm], hp: Mapping[str, Any], layout: Layout) -> None:
    """Uneven `federation.local_steps`' own rules (`fedbench.axes.registry`): its own (`LocalSteps.check`), epochs where
    minibatches cannot be short. Whether the algorithm takes uneven work at all is found by a dry round of it, above
    the axes (`fedbench.engine.checks.check_uneven_work`)."""
    steps = federation.local_steps
    if not isinstance(steps, LocalSteps):
        return
    steps.check(layout.clients)
    if steps.epochs is not None and layout.smallest is not None:
        raise ParamError("local_steps.epochs", f"found {steps.epochs} for a problem whose minibatches cannot be "
                         "short; expected counts, file or distribution")
