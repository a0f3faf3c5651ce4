"""Round transforms of what crosses the network: compression, error feedback, clipping and Gaussian noise, which the
engine applies to every algorithm's declared uploads (the uplink chain) and broadcasts (the downlink chain), and the
bits each message then costs as its transform encodes it. The engine's side (state, draws, the round) is
`fedbench.engine.links`; the algorithm knows nothing of either.

A chain is a list of transforms, as a recipe writes it under `federation:`: each a name (its defaults), `{name: v}`
(v its first parameter) or `{name: {param: v, ...}}`, e.g.

    uplink: [{clip: 1.0}, {top_k: 0.05}, {error_feedback: ef21}]     # or [sign, error_feedback]
    downlink: [{qsgd: 8}]

Uplink. For each declared upload of each of a round's S clients (`fedbench.algorithms.base.Upload`), the chain acts on
the flat vector x `[d]`: the update x = upload − ŝ[relative_to] where the upload declares the server entry it is a new
value of (ŝ: the server's entries as the client received them, through the downlink), else the upload itself. The
server then receives s[relative_to] + y (or y), the update added to its own entry s (= ŝ without a downlink). The
steps apply left to right, each to what the one before gave, per client and per upload (a clip bounds each upload's
norm on its own):

* a compressor C, at most one a chain (its encoding is what the message costs):
  - `top_k` k: the K = max(1, round(k·d)) coordinates of largest magnitude, the others 0 (Stich, Cordonnier, Jaggi
    2018, "Sparsified SGD with Memory", top_k); biased.
  - `rand_k` k: K coordinates drawn uniformly without replacement, scaled by d/K, the others 0 (Stich et al.'s
    rand_k, scaled so that E C(x) = x).
  - `qsgd` s: Q_s of Alistarh, Grubic, Li, Tomioka, Vojnovic 2017 (QSGD, NeurIPS, §3): ‖x‖₂ · sgn(x_i) · ξ_i, where
    ξ_i = (l + 1)/s with probability s|x_i|/‖x‖₂ − l and l/s otherwise, l = ⌊s|x_i|/‖x‖₂⌋; unbiased.
  - `sign`: (‖x‖₁/d) · sign(x), the scaled sign of Karimireddy, Rebjock, Stich, Jaggi 2019 ("Error Feedback Fixes
    SignSGD and other Gradient Compression Schemes", Algorithm 1).
* `error_feedback` (kind), right after the compressor, which it wraps; each client keeps a vector `[d]`, 0 at the
  start and carried from one of its rounds to its next:
  - `ef`: a residual e: p = x + e, y = C(p), e ← p − y (Seide, Fu, Droppo, Li, Yu 2014, "1-Bit Stochastic Gradient
    Descent"; Karimireddy et al. 2019, Algorithm 2, whose p = γg + e is here x + e on the update x).
  - `ef21`: an estimate g: y = g + C(x − g), g ← y (Richtárik, Sokolov, Fatkhullin 2021, "EF21", Algorithm 1: the
    client sends C(x − g), from which the server, which holds each g it has built, makes g + C(x − g)).
    With g = 0 at the start, the first round sends C(x): Algorithm 1 with g_i⁰ = C(∇f_i(x⁰)). Under partial
    participation (S of N clients a round) the server's mean is over the round's participants' estimates alone, each
    g_i as the client left it at its last round: not EF21-PP (Fatkhullin, Sokolov, Gorbunov, Li, Richtárik 2021,
    "EF21 with Bells & Whistles"), whose server keeps every client's g_i and averages all N of them, the absent
    clients' unchanged.
* `clip` norm: y = x · min(1, C/‖x‖₂), C = norm (McMahan, Ramage, Talwar, Zhang 2018, "Learning Differentially
  Private Recurrent Language Models", Algorithm 1, flat clipping).
* `gaussian` sigma: the last step, after a clip (whose C it takes), with uniform aggregation: y = x + z with one
  z ~ N(0, (σC/S)² I) a run, upload and round, the same for all S clients of the run, so that the server's mean with
  weights 1/S gains exactly z: DP-FedAvg's noise on the average (McMahan et al. 2018, Algorithm 1: σ = zS/(qW), with
  weights w_k = 1 and qW = S; their z is this σ, their S this C). The draw is shared: it protects the noised mean
  only, not each client's upload (whose differences from the others' carry no noise), so that an algorithm whose
  server uses each client's upload (`Algorithm.uploads_averaged` False) is refused it (`fedbench.engine.links`). Its
  privacy loss ε at a δ, in every row of a run given one: `fedbench.axes.privacy`, which requires the steps between the
  clip and the noise to keep the clipped norm (`shortens`: top_k, sign).

Downlink: EF21-P (Gruntkowska, Tyurin, Richtárik 2023, "EF21-P and Friends", Algorithm 1). Each download goes
through a compressor (`top_k` or `qsgd`) as a difference to what the clients last received: the server keeps its own
w and a copy ŵ of what it has broadcast per run (ŵ = the initial state at the start, which every client knows from
the run's seed), at each round's start sets ŵ ← ŵ + C(w − ŵ) and sends C(w − ŵ); the round's clients start from ŵ
(Algorithm 1's w^t, at which the gradients are taken; its x^t is the server's w here). An upload that is a new value of
the download comes back as an update from ŵ, which the server adds to its own w (above): FedAvg's server step is then
w ← w + η·mean(u_k − ŵ), Algorithm 1's x^{t+1} = x^t − γ∇f(w^t) with local steps, and what C left out of w − ŵ is
sent in later rounds, never dropped. A download whose shape is not its copy's (FeDXL's score pools while they fill)
goes whole, and becomes the copy. Every client holds the one copy ŵ, which folds in every round's message: a client
that missed rounds receives their messages too when it next takes part, or ŵ whole where that is fewer bits
(`comm_down_bits`, `fedbench.engine.links.Links.catch_up`).

Bits of one client's message of d values of b bits (b: the width of the run's dtype), `Transform.bits`:
top_k K·b + min(K·⌈log₂ d⌉, d), the kept values and where they are: K indices of ⌈log₂ d⌉ bits, or a mask of d
bits where that is fewer (from k ≈ 1/⌈log₂ d⌉ up: at k = 25%, d = 1,024, 1,024 bits, not 2,560); rand_k K·b, the
mask drawn from the run's uplink stream, which the server replays (a seed shared at the start; Konečný et al. 2016,
"Federated Learning: Strategies for Improving Communication Efficiency", §2, send the seed with each message
instead); qsgd b + d·(1 + ⌈log₂(s + 1)⌉), the norm at the values' width (the run keeps it at that precision), and
each coordinate's sign and level in a fixed-length code (Alistarh et al.'s Elias code is shorter for small s; not
counted here); sign d + b, a bit per coordinate and the scale; error feedback, clip and gaussian change nothing
(EF21 sends C(x − g)). Without a compressor a message costs d·b.

Randomness: rand_k, qsgd and gaussian draw on the run's own stream of their link ("uplink", "downlink"), which
exists only where the link has a random transform (runs without one keep exactly the streams they had); the draws
are made on the host (`fedbench.rng`) and moved to the device, for each upload (declared order) and random step
(chain order) in turn.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import torch
from torch import Tensor

from fedbench.hparams import Param, ParamError
from fedbench.rng import largest_keys

LINKS = ("uplink", "downlink")

FRACTION = Param("k", "float", 0.01, "fraction of the d coordinates kept: K = max(1, round(k·d))", low=0,
                 low_open=True, high=1, log=True)


class Transform:
    """One step of a chain: its declared parameters (`Param`s: validation, reference pages and `fedbench list` read
    them), what it is (a compressor, allowed on the downlink, random, keeping a per-client vector), and its maths on a
    batch: `apply(x, kept, drawn)` on the flat messages x `[R, S, d]` of R runs' S clients."""

    name: ClassVar[str]
    """Its name in a chain (`top_k`)."""
    help: ClassVar[str]
    """What it does and what a message then costs, in a line (the reference's table, `fedbench list`)."""
    params: ClassVar[tuple[Param, ...]] = ()
    """Its parameters; a recipe's `{name: value}` sets the first."""
    compressor: ClassVar[bool] = False
    """A compressor: at most one a chain, what `error_feedback` wraps and what encodes the message (`bits`)."""
    on_downlink: ClassVar[bool] = False
    """Allowed on the downlink."""
    random = False
    """It draws each round (`draw`), on its link's stream of each run."""
    keeps = False
    """It holds a vector `[d]` per client from one of the client's rounds to its next (error feedback)."""
    shortens: ClassVar[bool] = False
    """‖y‖₂ ≤ ‖x‖₂ whatever x: after a clip, the clip's bound C still holds (what DP-FedAvg's noise is calibrated on,
    `fedbench.axes.privacy`)."""

    def __init__(self, **values: Any):
        for param in self.params:
            setattr(self, param.name, values[param.name])

    def draw(self, gen: torch.Generator, clients: int, numel: int, dtype: torch.dtype) -> Tensor:
        """One run's draws for a round's messages of `clients` clients of `numel` values, on its stream `gen`."""
        raise NotImplementedError

    def apply(self, x: Tensor, kept: Tensor | None, drawn: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """(y, the clients' new kept vectors or None) of messages x `[R, S, d]`, with the clients' kept vectors
        `[R, S, d]` (None where it keeps none) and the runs' draws stacked `[R, ...]` (None where it draws none)."""
        raise NotImplementedError

    def bits(self, numel: int, value_bits: int) -> int | None:
        """Bits of one client's message of `numel` values of `value_bits` bits as this step encodes it (None: it
        leaves the encoding as it is)."""
        return None

    @classmethod
    def step(cls, values: dict[str, Any]) -> Step:
        """The step of this transform with the given parameters' values (checked), the others' defaults."""
        return Step(cls.name, tuple((p.name, values.get(p.name, p.default)) for p in cls.params))


class Compressor(Transform):
    """A compressor C: `compress(x, drawn)` of a batch of messages, its step C(x) (error feedback calls it on what it
    makes of x)."""

    compressor = True

    def compress(self, x: Tensor, drawn: Tensor | None) -> Tensor:
        """C of each message x `[R, S, d]`, with the runs' draws stacked `[R, ...]` (None where it draws none)."""
        raise NotImplementedError

    def apply(self, x, kept, drawn):
        return self.compress(x, drawn), None


def kept_count(fraction: float, numel: int) -> int:
    """K = max(1, round(k·d)), Python's rounding (half to even)."""
    return max(1, round(fraction * numel))


def index_bits(numel: int) -> int:
    """⌈log₂ numel⌉: the bits of an index into `numel` values."""
    return (numel - 1).bit_length()


class TopK(Compressor):
    name = "top_k"
    help = ("the K = max(1, round(k·d)) coordinates of largest magnitude (biased); K·b + min(K·⌈log₂ d⌉, d) bits "
            "(their indices, or a d-bit mask where fewer)")
    params = (FRACTION,)
    on_downlink = True
    shortens = True  # a subset of x's coordinates
    k: float

    def compress(self, x, drawn):
        kept = x.abs().topk(kept_count(self.k, x.shape[-1]), dim=-1, sorted=False).indices
        return torch.zeros_like(x).scatter_(-1, kept, x.gather(-1, kept))

    def bits(self, numel, value_bits):
        kept = kept_count(self.k, numel)
        return kept * value_bits + min(kept * index_bits(numel), numel)  # indices, or a mask of the d coordinates


class RandK(Compressor):
    name = "rand_k"
    help = "K uniformly random coordinates scaled by d/K (unbiased); K·b bits (the mask from a shared seed)"
    params = (FRACTION,)
    random = True
    k: float

    def draw(self, gen, clients, numel, dtype):
        # the K largest of i.i.d. uniform keys are a uniform K-subset; float64 keys leave no ties to break
        keys = torch.rand(clients, numel, dtype=torch.float64, generator=gen)
        return largest_keys(keys, kept_count(self.k, numel))

    def compress(self, x, drawn):
        assert drawn is not None  # random: the engine draws for it
        return torch.zeros_like(x).scatter_(-1, drawn, x.gather(-1, drawn) * (x.shape[-1] / drawn.shape[-1]))

    def bits(self, numel, value_bits):
        return kept_count(self.k, numel) * value_bits


class QSGD(Compressor):
    name = "qsgd"
    help = "stochastic quantization to s levels of |x_i|/‖x‖₂ (unbiased); b + d·(1 + ⌈log₂(s+1)⌉) bits"
    params = (Param("levels", "int", 4, "quantization levels s", low=1),)
    on_downlink = True
    random = True
    levels: int

    def draw(self, gen, clients, numel, dtype):
        return torch.rand(clients, numel, dtype=dtype, generator=gen)

    def compress(self, x, drawn):
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        scaled = x.abs() / norm.clamp_min(torch.finfo(x.dtype).tiny) * self.levels  # in [0, s]; 0 for x = 0
        level = scaled.floor()
        level = level + (drawn < scaled - level)  # one level up with probability scaled − level
        return norm * x.sign() * level / self.levels

    def bits(self, numel, value_bits):
        return value_bits + numel * (1 + self.levels.bit_length())  # bit_length(s) = ⌈log₂(s + 1)⌉


class Sign(Compressor):
    name = "sign"
    help = "(‖x‖₁/d)·sign(x), the scaled sign; d + b bits"
    shortens = True  # its norm is ‖x‖₁/√d ≤ ‖x‖₂ (Cauchy–Schwarz)

    def compress(self, x, drawn):
        return x.abs().mean(-1, keepdim=True) * x.sign()

    def bits(self, numel, value_bits):
        return numel + value_bits


class ErrorFeedback(Transform):
    name = "error_feedback"
    help = ("wraps the compressor C right before it: ef, a residual e (y = C(x + e), e ← x + e − y); ef21, an "
            "estimate g (y = g + C(x − g), g ← y); a vector per client")
    params = (Param("kind", "choice", "ef", "classic error feedback (Seide et al. 2014; Karimireddy et al. 2019) or "
                    "EF21 (Richtárik, Sokolov, Fatkhullin 2021)", choices=("ef", "ef21")),)
    keeps = True
    kind: str
    compressor_of: Compressor

    def wrap(self, compressor: Compressor) -> None:
        self.compressor_of, self.random = compressor, compressor.random

    def draw(self, gen, clients, numel, dtype):
        return self.compressor_of.draw(gen, clients, numel, dtype)

    def apply(self, x, kept, drawn):
        assert kept is not None  # keeps: the engine holds its vectors
        if self.kind == "ef":
            p = x + kept
            y = self.compressor_of.compress(p, drawn)
            return y, p - y
        y = kept + self.compressor_of.compress(x - kept, drawn)
        return y, y

    def bits(self, numel, value_bits):
        return self.compressor_of.bits(numel, value_bits)


class Clip(Transform):
    name = "clip"
    help = "scales each client's upload to ℓ2 norm at most C = norm"
    params = (Param("norm", "float", 1.0, "the bound C on each client's ℓ2 norm", low=0, low_open=True, log=True),)
    shortens = True
    norm: float

    def apply(self, x, kept, drawn):
        return x * (self.norm / torch.linalg.vector_norm(x, dim=-1, keepdim=True)).clamp(max=1.0), None


class Gaussian(Transform):
    name = "gaussian"
    help = "adds z ~ N(0, (σC/S)² I), one draw a run and round shared by its clients (DP-FedAvg's: on their mean)"
    params = (Param("sigma", "float", 1.0, "noise multiplier σ, on the clip's C", low=0),)
    random = True
    sigma: float
    clip: float  # C, the norm of the clip before it

    def draw(self, gen, clients, numel, dtype):
        return torch.randn(1, numel, dtype=dtype, generator=gen)  # one for the run's clients

    def apply(self, x, kept, drawn):
        return x + drawn * (self.sigma * self.clip / x.shape[1]), None


TRANSFORMS: dict[str, type[Transform]] = {t.name: t for t in (TopK, RandK, QSGD, Sign, ErrorFeedback, Clip, Gaussian)}
"""Every transform by its name in a chain."""


@dataclass(frozen=True)
class Step:
    """A transform of a chain as configured: its name and the value of each of its parameters (declared order)."""
    name: str
    values: tuple[tuple[str, Any], ...] = ()

    def __str__(self) -> str:
        return self.name + (f"({', '.join(f'{k}={v}' for k, v in self.values)})" if self.values else "")

    def transform(self) -> Transform:
        return TRANSFORMS[self.name](**dict(self.values))


def chain_text(steps: Sequence[Step]) -> str:
    """A chain as a run's configuration records it: `clip(norm=1.0) → top_k(k=0.05) → error_feedback(kind=ef21)`."""
    return " → ".join(map(str, steps))


class UnknownName(ParamError):
    """A chain's transform or parameter that is none of `options`."""

    def __init__(self, name: str, message: str, options: Sequence[str]):
        super().__init__(name, message)
        self.options = options


def _unknown(where: str, what: str, found: str, options: Sequence[str]) -> UnknownName:
    near = difflib.get_close_matches(found, options, n=1)
    return UnknownName(where, f"found {found!r}, expected {what}" + (f" (did you mean {near[0]!r}?)" if near else ""),
                       options)


def entry(given: Any, where: str) -> tuple[type[Transform], dict[str, tuple[str, Any]]]:
    """A chain's entry as written (a name, `{name: value}` or `{name: {param: value}}`), at field `where`
    (`uplink.0`): its transform and each given parameter's (field path, value), unchecked (a recipe's value may be
    a grid axis). Refused (ParamError at the path of what is wrong): anything else, an unknown transform or
    parameter (UnknownName)."""
    if isinstance(given, Step):
        given = {given.name: dict(given.values)}
    if isinstance(given, str):
        name, value = given, None
    elif isinstance(given, dict) and len(given) == 1:
        [(name, value)] = given.items()
    else:
        raise ParamError(where, f"found {given!r}, expected a transform's name or {{name: value}}")
    if name not in TRANSFORMS:
        raise _unknown(where, "a transform", str(name), list(TRANSFORMS))
    cls, path = TRANSFORMS[name], f"{where}.{name}"
    if value is None:
        return cls, {}
    if isinstance(value, dict):
        names = [p.name for p in cls.params]
        for key in value:
            if key not in names:
                raise _unknown(f"{path}.{key}", f"a parameter of {name}", str(key), names)
        return cls, {key: (f"{path}.{key}", v) for key, v in value.items()}
    if not cls.params:
        raise ParamError(path, f"found {value!r}, expected nothing: {name} has no parameters")
    return cls, {cls.params[0].name: (path, value)}


def chain(spec: Any, link: str) -> tuple[Step, ...]:
    """The steps of a chain written as a recipe writes it (`[{top_k: 0.05}, {error_feedback: ef21}]`, or as steps),
    each parameter checked; refused (ParamError at the field's path, `uplink.0.top_k`) otherwise. Its order is
    checked with the federation (`check_chain`)."""
    if not isinstance(spec, (list, tuple)):
        raise ParamError(link, f"found {spec!r}, expected a list of transforms, e.g. [{{top_k: 0.05}}]")
    steps = []
    for i, given in enumerate(spec):
        cls, values = entry(given, f"{link}.{i}")
        params = {p.name: p for p in cls.params}
        checked = {}
        for name, (path, value) in values.items():
            try:
                checked[name] = params[name].check(value)
            except ValueError as err:
                raise ParamError(path, str(err)) from None
        steps.append(cls.step(checked))
    return tuple(steps)


def check_chain(steps: Sequence[Step], link: str, aggregation: str) -> None:
    """Refuse (ParamError at the step's path, `uplink.1.error_feedback`) a chain (of checked steps, `chain`) in an
    order no run can have: on the uplink a second compressor, error feedback not right after a compressor, a
    gaussian without a clip before it, not last or with `samples` aggregation; on the downlink anything but one
    top_k or qsgd."""
    for i, step in enumerate(steps):
        path, cls = f"{link}.{i}.{step.name}", TRANSFORMS[step.name]
        before = [TRANSFORMS[s.name] for s in steps[:i]]
        if link == "downlink":
            if not cls.on_downlink or i > 0:
                allowed = " or ".join(t.name for t in TRANSFORMS.values() if t.on_downlink)
                raise ParamError(path, f"found {step.name} as step {i} of the downlink, expected one {allowed}")
        elif cls.compressor and any(t.compressor for t in before):
            raise ParamError(path, "found a second compressor, expected one at most (its encoding is what a message "
                             "costs)")
        elif cls is ErrorFeedback and not (before and before[-1].compressor):
            raise ParamError(path, "found no compressor right before error feedback, expected the one it wraps")
        elif cls is Gaussian:
            if Clip not in before:
                raise ParamError(path, "found no clip before gaussian, expected one: the noise σC/S is on its C")
            if i != len(steps) - 1:
                raise ParamError(path, f"found gaussian as step {i} of {len(steps)}, expected it last (the noise on "
                                 "the server's mean)")
            if aggregation != "uniform":
                raise ParamError(path, f"found aggregation {aggregation}, expected uniform: σC/S is DP-FedAvg's noise "
                                 "on a mean weighted 1/S")


def draws(steps: Sequence[Step]) -> bool:
    """Whether a chain draws (and its runs need that link's stream)."""
    return any(TRANSFORMS[step.name].random for step in steps)


def compiled(steps: Sequence[Step]) -> list[Transform]:
    """A checked chain's transforms, each error feedback holding the compressor it wraps (in its place) and each
    gaussian the C of the clip before it."""
    transforms: list[Transform] = []
    for step in steps:
        transform = step.transform()
        if isinstance(transform, ErrorFeedback):
            wrapped = transforms.pop()
            assert isinstance(wrapped, Compressor)  # `check_chain`: right after a compressor
            transform.wrap(wrapped)
        if isinstance(transform, Gaussian):
            transform.clip = next(t.norm for t in reversed(transforms) if isinstance(t, Clip))
        transforms.append(transform)
    return transforms


def message_bits(transforms: Sequence[Transform], numel: int, value_bits: int) -> int:
    """Bits of one client's message of `numel` values of `value_bits` bits through a compiled chain: as its
    compressor encodes it, else the values at their width."""
    for transform in transforms:
        counted = transform.bits(numel, value_bits)
        if counted is not None:
            return counted
    return numel * value_bits
