"""Robust aggregation rules and the attacks of adversarial clients, batched over runs and clients, for any algorithm:
the engine applies them to the uploads an algorithm declares (`fedbench.engine.links`), which the algorithm never sees.

Every function takes the sampled clients' uploads of R runs as `values` `[R, S, ...]` (the trailing axes are one
vector per client) and answers for each run at once; no loop over runs or clients.

Aggregation rules (`federation.aggregation`; unweighted, as Flower's FedMedian, FedTrimmedAvg and Krum strategies):

* `median`: the coordinate-wise median (Yin, Chen, Ramchandran, Bartlett, ICML 2018, "Byzantine-Robust Distributed
  Learning: Towards Optimal Statistical Rates", Definition 1); for an even S the mean of the two middle values, as
  `numpy.median`.
* `trimmed_mean` (`federation.trim` β, 0 ≤ β < 1/2): per coordinate, the ⌊βS⌋ largest and ⌊βS⌋ smallest values
  left out and the rest averaged (Yin et al. 2018, Definition 2), ⌊βS⌋ of β as written (`floor_of`). This is
  `scipy.stats.trim_mean(values, β)` wherever scipy's cut, int(β·S) of the float product, is the same; it is not
  where that product falls just below an integer: at β = 0.29, S = 100 (28.999999999999996) scipy leaves out 28 at
  each end and this rule 29 (among β of two decimals and S ≤ 100, the only such pair).
* `krum` (`federation.byzantine` f, for S > 2f + 2): the upload whose sum of squared distances to its S − f − 2
  nearest other uploads is least (Blanchard, El Mhamdi, Guerraoui, Stainer, NeurIPS 2017, "Machine Learning with
  Adversaries: Byzantine Tolerant Gradient Descent", §4); `multi_krum`: the mean of the m = S − f uploads of least
  score (their §4, "Multi-Krum").

How the engine applies a rule, for every algorithm alike: on each declared upload as the server receives it (after
the uplink's transforms), the rule's aggregate `[R, 1, ...]` of the S clients' values replaces every client's
value, so that the algorithm's own mean over the clients (its weights sum to one; with a rule they are uniform)
gives the robust aggregate, up to rounding, and no algorithm changes. This fits an algorithm whose server takes each
upload in only through such a mean (`Algorithm.uploads_averaged`): every shipped one but FeDXL1/2, which pool the
clients' scores one by one, and the block methods whose devices all-reduce their upload inside the round (no
message per client); both are refused at validation. SCAFFOLD's and CODASCA's control variates, Σ_k Δc_k / N =
(S/N)·mean, become (S/N)·aggregate: the rule stands in for the mean there too. Each upload is aggregated on its own:
Krum may pick one client's model and another's control variate. Every rule is translation-equivariant
(median(ŝ + x_k) = ŝ + median(x_k), the Krum distances unchanged), so that aggregating the uploads or their
updates upload − ŝ gives the same (up to rounding).

Adversaries (`federation.adversaries: {fraction, attack, scale}`): ⌊fraction·N⌋ of the N clients, drawn once per
run at its start on its own stream "adversaries" (`adversarial_clients`), replace their uploads whenever they are
sampled, as updates x = upload − ŝ[relative_to] (ŝ the server entry the upload is a new value of, as the client
received it; the upload itself where it declares none), before the uplink's transforms (an attacker's message is
encoded like any other), by `attack`: `sign_flip` sends −scale·x, `scaled` scale·x, and `gaussian` scale·z, z ~ N(0,
I) in place of x (the "Gaussian" Byzantine workers of Blanchard et al., §5), drawn each round for every sampled client
on the run's "adversaries" stream, on the host, and moved to the device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping

import torch
from torch import Tensor

from fedbench.hparams import Param, ParamError

RULES = ("median", "trimmed_mean", "krum", "multi_krum")
KRUMS = ("krum", "multi_krum")  # the rules that read `byzantine`
ATTACKS = ("sign_flip", "scaled", "gaussian")


def floor_of(fraction: float, count: int) -> int:
    """⌊fraction·count⌋ of the decimal as written (0.29 · 100 = 29, where the float product is 28.999...)."""
    return math.floor(Fraction(repr(fraction)) * count)


def median(values: Tensor) -> Tensor:
    """The coordinate-wise median over clients, `[R, S, ...]` -> `[R, 1, ...]`."""
    ordered = values.sort(dim=1).values
    middle = (values.shape[1] - 1) // 2
    if values.shape[1] % 2:
        return ordered[:, middle: middle + 1]
    return (ordered[:, middle: middle + 1] + ordered[:, middle + 1: middle + 2]) / 2


def trimmed_mean(values: Tensor, beta: float) -> Tensor:
    """The coordinate-wise β-trimmed mean over clients, `[R, S, ...]` -> `[R, 1, ...]`, ⌊βS⌋ of β as written left out
    at each end: `scipy.stats.trim_mean` where its int(β·S) of the float product is that cut (not at β = 0.29,
    S = 100, where scipy's is 28; the module's docstring)."""
    cut = floor_of(beta, values.shape[1])
    if 2 * cut >= values.shape[1]:
        raise ValueError(f"trimming {cut} of {values.shape[1]} clients from each side leaves none")
    ordered = values.sort(dim=1).values
    return ordered[:, cut: values.shape[1] - cut].mean(dim=1, keepdim=True)


def krum_scores(values: Tensor, byzantine: int) -> Tensor:
    """Each upload's Krum score `[R, S]`: the sum of its squared distances to its S − f − 2 nearest other uploads."""
    clients = values.shape[1]
    if clients <= 2 * byzantine + 2:  # Blanchard et al.'s condition n > 2f + 2; refused at validation first
        raise ValueError(f"Krum needs S > 2f + 2 (found S = {clients}, f = {byzantine})")
    flat = values.flatten(2)
    # [R, S, S] from the differences themselves: the Gram-matrix shortcut loses the distance of close uploads
    distances = torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist").square()
    distances.diagonal(dim1=1, dim2=2).fill_(torch.inf)  # a client is not its own neighbour
    return distances.topk(clients - byzantine - 2, dim=-1, largest=False).values.sum(-1)


def krum(values: Tensor, byzantine: int, keep: int = 1) -> Tensor:
    """The mean of the `keep` uploads of least Krum score (1: Krum itself), `[R, S, ...]` -> `[R, 1, ...]`."""
    chosen = krum_scores(values, byzantine).topk(keep, dim=-1, largest=False).indices  # [R, keep]
    picked = values.gather(1, chosen.view(*chosen.shape, *[1] * (values.dim() - 2)).expand(-1, -1, *values.shape[2:]))
    return picked.mean(dim=1, keepdim=True)


def aggregate_robustly(values: Tensor, rule: str, trim: float = 0.0, byzantine: int = 0) -> Tensor:
    """`values` `[R, S, ...]` aggregated by `rule` (one of RULES) to `[R, 1, ...]`."""
    if rule == "median":
        return median(values)
    if rule == "trimmed_mean":
        return trimmed_mean(values, trim)
    if rule == "krum":
        return krum(values, byzantine)
    if rule == "multi_krum":
        return krum(values, byzantine, keep=values.shape[1] - byzantine)
    raise ValueError(f"unknown aggregation rule {rule!r} (expected one of {', '.join(RULES)})")


def attack(updates: Tensor, adversarial: Tensor, kind: str, scale: float, noise: Tensor | None = None) -> Tensor:
    """The updates `[R, S, ...]` with those of the adversarial clients (`adversarial` `[R, S]`, bool) replaced by
    the attack `kind` (one of ATTACKS); `noise` `[R, S, ...]` standard normal draws for `gaussian`."""
    if kind == "sign_flip":
        attacked = -scale * updates
    elif kind == "scaled":
        attacked = scale * updates
    elif kind == "gaussian":
        if noise is None:
            raise ValueError("the gaussian attack needs its standard normal draws")
        attacked = scale * noise
    else:
        raise ValueError(f"unknown attack {kind!r} (expected one of {', '.join(ATTACKS)})")
    return torch.where(adversarial.view(*adversarial.shape, *[1] * (updates.dim() - 2)), attacked, updates)


def adversarial_clients(count: int, fraction: float, gen: torch.Generator) -> Tensor:
    """Which of `count` clients are adversarial, `[count]` bool: ⌊fraction·count⌋ of them, uniformly, drawn once per
    run on its own stream."""
    chosen = torch.randperm(count, generator=gen)[: floor_of(fraction, count)]
    return torch.zeros(count, dtype=torch.bool).index_fill_(0, chosen, True)


@dataclass(frozen=True)
class Adversaries:
    """`federation.adversaries`: the fraction of a run's clients that attack, how, and how hard (the module's
    docstring says what each attack sends)."""

    fraction: float = 0.1
    attack: str = "sign_flip"
    scale: float = 1.0

    params = (
        Param("fraction", "float", 0.1, "the adversarial clients: ⌊fraction·N⌋ of the N, drawn once per run", low=0,
              high=1, high_open=True),
        Param("attack", "choice", "sign_flip", "what they send in place of their update x: −scale·x (sign_flip), "
              "scale·x (scaled), or scale·z, z ~ N(0, I) (gaussian)", choices=ATTACKS),
        Param("scale", "float", 1.0, "the attack's factor, or the gaussian attack's standard deviation", low=0),
    )

    def __str__(self) -> str:
        """As a run's configuration records it: `sign_flip(fraction=0.2, scale=10.0)`."""
        return f"{self.attack}(fraction={self.fraction}, scale={self.scale})"

    @classmethod
    def given(cls, spec: Any) -> Adversaries:
        """From a mapping as a recipe writes it (`{fraction: 0.2, attack: gaussian}`, the others their defaults);
        refused (ParamError at `adversaries` or `adversaries.NAME`) where it is no such mapping. Its values are
        checked with the federation's (`check`)."""
        if isinstance(spec, Adversaries):
            return spec
        if not isinstance(spec, Mapping):
            raise ParamError("adversaries", f"found {spec!r}, expected a mapping, e.g. {{fraction: 0.2, attack: "
                             "sign_flip}")
        names = [p.name for p in cls.params]
        for name in spec:
            if name not in names:
                raise ParamError(f"adversaries.{name}", f"found {name!r}, expected one of {', '.join(names)}")
        return cls(**spec)

    def check(self) -> None:
        """Refuse (ParamError at `adversaries.NAME`) a value out of its parameter's range."""
        for param in self.params:
            try:
                param.check(getattr(self, param.name))
            except ValueError as err:
                raise ParamError(f"adversaries.{param.name}", str(err)) from None


def check_adversaries(federation: Any, algorithm: Any, hp: Any, layout: Any) -> None:
    """`federation.adversaries`' rule (`fedbench.axes.registry`): their own (`Adversaries.check`); what they ask of an
    algorithm's uploads is `fedbench.engine.federation.check_uploads`'."""
    if federation.adversaries is not None:
        federation.adversaries.check()
