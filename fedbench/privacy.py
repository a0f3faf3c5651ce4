"""Privacy accounting of DP-FedAvg's Gaussian uplink (a `clip`, then `gaussian`, `fedbench.transforms`): ε after r
rounds at a given δ for the mechanism the engine runs, by the Rényi DP accountant of Google's dp-accounting library
(`dp_accounting.rdp.RdpAccountant`, version 0.6.0), so that every metrics row of such a run carries its `epsilon`.

The mechanism. Each round the engine samples S of the N clients uniformly without replacement, a fixed number
(`fedbench.participation.sample_clients`), or takes all N (clients_per_round 0 or N, or an algorithm whose participation
is "all"). Each of the U uploads the algorithm declares is clipped per client to ℓ2 norm C, and the server's mean of
it with weights 1/S gains z ~ N(0, (σC/S)² I), a draw of its own (McMahan, Ramage, Talwar, Zhang 2018, "Learning
Differentially Private Recurrent Language Models", Algorithm 1, with S clients drawn without replacement instead of
each with probability q). The steps between the clip and the noise must keep the clipped norm (`Transform.shortens`:
top_k, sign), or C bounds nothing the noise covers (`check`).

Adjacency: user level, replace-one. Two federations are neighbours when one client's data differ, all of it; the
number N of clients is public. ε bounds what the server receives and everything computed from it (the server's
iterates, its broadcasts: post-processing), not the clients' own state, nor the rows' metrics, which the experiment
measures on everyone's data outside the protocol.

Sensitivity. Replacing one client's data turns its clipped upload u (‖u‖₂ ≤ C) into any u′ (‖u′‖₂ ≤ C): the sum over
the S sampled clients moves by u′ − u, of norm up to 2C (at u′ = −u), and the mean by up to 2C/S, while the noise on
the mean has standard deviation σC/S: a ratio of σ/2 to the sensitivity. The U uploads' means together are one
Gaussian mechanism on their concatenation, of sensitivity 2C√U/S and the same noise on each coordinate: ratio
m = σ/(2√U). dp-accounting's `noise_multiplier` is this ratio to the sensitivity under the accountant's own
neighbouring relation: with REPLACE_ONE it takes the Gaussian of multiplier m at RDP α/(2m²) as given ("the ratio of
the standard deviation of the Gaussian noise to the l2-sensitivity of the function to which it is added",
rdp_privacy_accountant.py) and doubles no per-client bound itself, so its events are given m, not σ. (McMahan et al.
account their z = σ with each client sampled independently and one client added or removed, a sensitivity of C/S:
the same σ has a smaller ε there, for another sampling and another neighbouring relation.)

The accounting. A round is `SampledWithoutReplacementDpEvent(N, S, GaussianDpEvent(m))`, the subsampled Gaussian of
Wang, Balle, Kasiviswanathan 2019 ("Subsampled Rényi Differential Privacy and Analytical Moments Accountant",
Theorem 27, for replace-one neighbours), or `GaussianDpEvent(m)` when all N take part (nothing amplifies it; Mironov
2017, "Rényi Differential Privacy", Table II). r rounds compose, RDP adding up (Mironov 2017, Proposition 1: adaptive
composition, each round's broadcast computed from the releases before it), and ε at δ is the library's conversion
(`dp_accounting.rdp.compute_epsilon`: Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for Differential
Privacy", Proposition 12) at the best of its default orders. Poisson sampling (each client with probability q, the
library's `PoissonSampledDpEvent` with ADD_OR_REMOVE_ONE) is not what the engine does and is not accounted.

Cost: the RDP of one round is computed once per mechanism (~0.3 s for a sampled one) and ε once per (mechanism, δ,
round), so that a row of a run whose configuration has run before costs a dictionary lookup. The library (~2 s to
import, with SciPy's signal module) is imported where a first ε is computed.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fedbench.hparams import ParamError
from fedbench.metrics import Metric
from fedbench.transforms import TRANSFORMS, Clip, Gaussian, Step

if TYPE_CHECKING:
    from dp_accounting import DpEvent

    from fedbench.algorithms.base import Algorithm
    from fedbench.federation import Federation

EPSILON = "epsilon"  # the rows' key


def epsilon_metric(delta: float | None = None) -> Metric:
    """The rows' `epsilon`, labelled with its δ (without one where the recipe is not at hand); lower is better."""
    return Metric(EPSILON, "ε" if delta is None else f"ε (δ = {delta:g})", "min")


def gaussian_step(uplink: Sequence[Step]) -> int | None:
    """The index of a chain's gaussian step (last where there is one, `check_chain`), or None."""
    return next((i for i, step in enumerate(uplink) if step.name == Gaussian.name), None)


def check(uplink: Sequence[Step]) -> None:
    """Refuse (ParamError at the step's path, `uplink.2.qsgd`) a checked uplink chain with a gaussian step
    (`fedbench.transforms.check_chain`) whose ε cannot be accounted: σ = 0 (no noise: ε is infinite), or a step
    between the last clip and the noise that may lengthen the clipped vector (rand_k's d/K scaling, qsgd's levels,
    error feedback's memory), beyond the C the noise is calibrated on."""
    at = gaussian_step(uplink)
    if at is None:
        return
    sigma = dict(uplink[at].values)["sigma"]
    if sigma == 0:
        raise ParamError(f"uplink.{at}.gaussian", "found sigma 0, expected sigma > 0 where privacy is accounted "
                         "(no noise: ε is infinite)")
    clip = max(i for i, step in enumerate(uplink[:at]) if step.name == Clip.name)
    for i, step in enumerate(uplink[clip + 1:at], clip + 1):
        if not TRANSFORMS[step.name].shortens:
            allowed = " or ".join(t.name for t in TRANSFORMS.values() if t.shortens and t is not Clip)
            raise ParamError(f"uplink.{i}.{step.name}", f"found {step.name} between the clip and the noise, expected "
                             f"only {allowed} there (the norm ≤ C): clip after it")


@dataclass(frozen=True)
class Mechanism:
    """One round of a run's Gaussian uplink (the module's docstring): `sampled` S of `clients` N clients without
    replacement (S = N: all of them), noise multiplier `sigma` σ on the clip's C, on each of `uploads` U uploads."""

    clients: int
    sampled: int
    sigma: float
    uploads: int = 1

    def __post_init__(self) -> None:
        if self.sigma <= 0:
            raise ParamError("sigma", f"found {self.sigma!r}, expected sigma > 0 (without noise ε is infinite)",
                             "gaussian")

    @classmethod
    def of(cls, federation: Federation, algorithm: Algorithm, clients: int) -> Mechanism:
        """The mechanism of a run of `algorithm` with `federation` on `clients` clients; refused (ParamError of the
        federation, at the field) where its uplink has no gaussian step or `check` refuses it."""
        at = gaussian_step(federation.uplink)
        if at is None:
            raise ParamError("uplink", "found no gaussian step, expected one after a clip: ε is accounted for "
                             "DP-FedAvg's noise", "federation")
        try:
            check(federation.uplink)
        except ParamError as err:
            raise ParamError(err.name, err.message, "federation") from None
        everyone = algorithm.participation == "all" or federation.clients_per_round in (0, clients)
        return cls(clients, clients if everyone else federation.clients_per_round,
                   float(dict(federation.uplink[at].values)["sigma"]), len(algorithm.uploads))

    @property
    def noise_multiplier(self) -> float:
        """m = σ/(2√U): the noise's standard deviation over the replace-one ℓ2 sensitivity of the U means."""
        return self.sigma / (2 * math.sqrt(self.uploads))

    def event(self) -> DpEvent:
        """One round as dp-accounting's event."""
        import dp_accounting

        gaussian = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if self.sampled == self.clients:
            return gaussian
        return dp_accounting.SampledWithoutReplacementDpEvent(self.clients, self.sampled, gaussian)


@dataclass(frozen=True)
class Accountant:
    """ε at `delta` of a `mechanism` after a number of its rounds.

    Example:
        ```python
        Accountant(Mechanism(clients=100, sampled=10, sigma=1.0), delta=1e-5).epsilon(500)
        ```
    """

    mechanism: Mechanism
    delta: float

    def __post_init__(self) -> None:
        if not 0 < self.delta < 1:
            raise ParamError("delta", f"found {self.delta!r}, expected a δ in (0, 1)", "privacy")

    def epsilon(self, rounds: int) -> float:
        """ε after `rounds` rounds: dp-accounting's RDP accountant's, the round's event composed `rounds` times."""
        return _epsilon(self, rounds)


@functools.cache
def _round_rdp(mechanism: Mechanism) -> tuple[np.ndarray, np.ndarray]:
    """(the accountant's orders, the RDP of one round of `mechanism` at each)."""
    from dp_accounting import NeighboringRelation
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE).compose(mechanism.event())
    return accountant.orders, accountant.rdp


@functools.lru_cache(maxsize=1 << 16)
def _epsilon(accountant: Accountant, rounds: int) -> float:
    from dp_accounting.rdp import compute_epsilon

    orders, rdp = _round_rdp(accountant.mechanism)
    # r rounds' RDP is r times one's, as the library's `compose(event, r)` makes it from zero
    return float(compute_epsilon(orders, rounds * rdp, accountant.delta)[0])
