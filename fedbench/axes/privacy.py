"""Privacy accounting of DP-FedAvg's Gaussian uplink (a `clip`, then `gaussian`, `fedbench.axes.transforms`): ε after r
rounds at a given δ for the mechanism the engine runs, so that every metrics row of such a run carries its `epsilon`;
by default the tight ε of the privacy-loss distribution (PLD) of the mechanism's dominating pair, as an option the
looser Rényi DP (RDP) bound, both by Google's dp-accounting library (version 0.6.0).

The mechanism. Each round the engine samples S of the N clients uniformly without replacement, a fixed number
(`fedbench.axes.participation.sample_clients`), or takes all N (clients_per_round 0 or N, or an algorithm whose
participation is "all"). Each of the U uploads the algorithm declares is clipped per client to ℓ2 norm C, and the
server's mean of it with weights 1/S gains z ~ N(0, (σC/S)² I), a draw of its own (McMahan, Ramage, Talwar, Zhang 2018,
"Learning Differentially Private Recurrent Language Models", Algorithm 1, with S clients drawn without replacement
instead of each with probability q). The steps between the clip and the noise must keep the clipped norm
(`Transform.shortens`: top_k, sign), or C bounds nothing the noise covers (`check`). The one draw z is shared by the S
clients (`fedbench.axes.transforms.Gaussian`): it protects the noised mean only, so that an algorithm whose server uses
each client's upload (`Algorithm.uploads_averaged` False: FeDXL's pools) is refused the noise
(`fedbench.engine.federation.check_uploads`).

Adjacency: user level, replace-one. Two federations are neighbours when one client's data differ, all of it; the
number N of clients is public. ε bounds what the server receives and everything computed from it (the server's
iterates, its broadcasts: post-processing), not the clients' own state, nor the rows' metrics, which the experiment
measures on everyone's data outside the protocol.

Sensitivity. Replacing one client's data turns its clipped upload u (‖u‖₂ ≤ C) into any u′ (‖u′‖₂ ≤ C): the sum over
the S sampled clients moves by u′ − u, of norm up to 2C (at u′ = −u), and the mean by up to 2C/S, while the noise on
the mean has standard deviation σC/S: a ratio of σ/2 to the sensitivity. The U uploads' means together are one
Gaussian mechanism on their concatenation, of sensitivity 2C√U/S and the same noise on each coordinate: noise
multiplier m = σ/(2√U) (dp-accounting's `noise_multiplier`: "the ratio of the standard deviation of the Gaussian
noise to the l2-sensitivity of the function to which it is added"). (McMahan et al. account their z = σ with each
client sampled independently and one client added or removed, a sensitivity of C/S: the same σ has a smaller ε there,
for another sampling and another neighbouring relation.)

`pld` (the default): the dominating pair. With q = S/N, P = N(1, m²) and Q = N(0, m²) (the sum's shift by the
sensitivity, in its units), one round of sampling without replacement under replace-one is dominated by the pair
(qP + (1 − q)Q, Q) and by its reverse (Zhu, Dong, Wang 2022, "Optimal Accounting of Differential Privacy via
Characteristic Function", AISTATS: their pair for sampling without replacement under the replace-one relation): the
Poisson-subsampled Gaussian's pair of removing and of adding one element, at probability q and multiplier m, and no
more than that, as every other client's upload equal to u and the replaced one's −u realise both. dp-accounting's
`PoissonSampledDpEvent(q, GaussianDpEvent(m))` under `ADD_OR_REMOVE_ONE` is that pair (both of its orders, ε the
larger), and its `from_gaussian_mechanism` its PLD (Koskela, Jälkö, Honkela 2020; Doroshenko, Ghazi, Kamath, Kumar,
Manurangsi 2022, "Connect the Dots", the pessimistic estimate: the ε it gives is never below the true one). All N a
round (q = 1): the Gaussian pair (P, Q). r rounds compose: the r-fold convolution of the PLD (`self_compose`, by
FFT), and ε at δ is read off it (`get_epsilon_for_delta`). (dp-accounting's own `REPLACE_ONE` with a sampling
probability takes the pair (qP₋ + (1 − q)Q, qP + (1 − q)Q), u and u′ at ±C around the others' upload: a pair the
mechanism exceeds, not its dominating one.)

The PLD's loss values lie on a grid of spacing h, each round's PLD built pessimistically (on any grid, ε is never below
the pair's own; a finer grid comes closer). The rounds from 2^k to 2^(k+1) − 1 share one grid: h starts at a power of
two near 1/(10m) and halves until one more halving changes ε after 2^(k+1) rounds by less than a relative 1e-3 (`_grid`,
once per mechanism, δ and k), so that a row's ε depends on (mechanism, δ, round) alone and is within about that of the
limit (its error grows with the rounds: measured against a grid 16 times finer, 8e-5 to 6.5e-4 above it over q = 0.001
to 1, σ = 0.5 to 1,000, 10 and 1,000 rounds, but for an ε of 4e-5, q = 0.001 and σ = 1,000 after 1,000 rounds, 1e-6
below the finer grid's (2%)), where one grid for all would be too coarse for small q or too costly for small σ.

`rdp`: the Rényi DP accountant (`dp_accounting.rdp.RdpAccountant`, `REPLACE_ONE`). A round is
`SampledWithoutReplacementDpEvent(N, S, GaussianDpEvent(m))`, the subsampled Gaussian of Wang, Balle,
Kasiviswanathan 2019 ("Subsampled Rényi Differential Privacy and Analytical Moments Accountant", Theorem 27, for
replace-one neighbours), or `GaussianDpEvent(m)` when all N take part (Mironov 2017, "Rényi Differential Privacy",
Table II); r rounds add their RDP (Mironov 2017, Proposition 1), converted to ε at δ by Canonne, Kamath, Steinke 2020
("The Discrete Gaussian for Differential Privacy", Proposition 12) at the best of the library's default orders. Sound
but loose: 2.1 to 3.5 times the PLD's ε on the shipped privacy recipes (σ = 4: 7.95 against 3.36 after 200 rounds).

Cost: ε is computed at the rounds a run logs, once per (accountant, mechanism, δ, round) and then looked up, so that
the seeds of a program and a sweep's later configurations of the same mechanism share it. `pld`: the PLD of one round
and the grid once per mechanism and octave of rounds (a second or so), then for each new round its r-fold composition
and ε (milliseconds to tens of them; `bench/privacy_rows.py` measures it); `rdp`: the RDP of one round once per
mechanism (~0.3 s for a sampled one), then a tenth of a millisecond a round.
The library (~2 s to import, with SciPy's signal module) is imported where a first ε is computed.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fedbench.axes.transforms import TRANSFORMS, Clip, Gaussian, Step
from fedbench.hparams import Param, ParamError

if TYPE_CHECKING:
    from dp_accounting import DpEvent
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    from fedbench.algorithms.base import Algorithm

ACCOUNTANTS = ("pld", "rdp")  # the recipe's `privacy.accountant`, the default first
PARAMS = (  # the recipe's `privacy:` (`fedbench.axes.registry`)
    Param("delta", "float", None, "the δ of (ε, δ)-DP, e.g. 1.0e-5 (below 1/N, the clients' number, by custom); "
          "required", low=0, low_open=True, high=1, high_open=True, nullable=True),
    Param("accountant", "choice", ACCOUNTANTS[0], "pld: the privacy-loss distribution of the mechanism's dominating "
          "pair (tight); rdp: the Rényi DP bound (looser)", choices=ACCOUNTANTS))
TOLERANCE = 1e-3  # the PLD's ε: the relative change of one more halving of its grid at which it stops


def gaussian_step(uplink: Sequence[Step]) -> int | None:
    """The index of a chain's gaussian step (last where there is one, `check_chain`), or None."""
    return next((i for i, step in enumerate(uplink) if step.name == Gaussian.name), None)


def check(uplink: Sequence[Step]) -> None:
    """Refuse (ParamError at the step's path, `uplink.2.qsgd`) a checked uplink chain with a gaussian step
    (`fedbench.axes.transforms.check_chain`) whose ε cannot be accounted: σ = 0 (no noise: ε is infinite), or a step
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


def check_accounted(delta: float | None, uplink: Sequence[Step]) -> None:
    """The recipe's `privacy:` rule (`fedbench.axes.registry`): refuse (ParamError at the recipe's path of the gaussian
    step, `federation.uplink.2.gaussian`) an uplink that adds DP-FedAvg's noise without a δ to account ε at, or whose ε
    cannot be accounted (`check`)."""
    at = gaussian_step(uplink)
    if at is None:
        return
    if delta is None:
        raise ParamError(f"federation.uplink.{at}.gaussian", "found noise without a privacy section, expected "
                         "`privacy: {delta: 1.0e-5}` at the top level (ε at that δ in every row)")
    try:
        check(uplink)
    except ParamError as err:
        raise ParamError(f"federation.{err.name}", err.message) from None


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
    def of(cls, uplink: Sequence[Step], clients_per_round: int, algorithm: Algorithm, clients: int) -> Mechanism:
        """The mechanism of a run of `algorithm` on `clients` clients whose federation has the `uplink` chain (as
        `Federation.uplink` holds it) and samples `clients_per_round` clients a round (0: all); refused (ParamError of
        the federation, at the field) where the uplink has no gaussian step or `check` refuses it."""
        at = gaussian_step(uplink)
        if at is None:
            raise ParamError("uplink", "found no gaussian step, expected one after a clip: ε is accounted for "
                             "DP-FedAvg's noise", "federation")
        try:
            check(uplink)
        except ParamError as err:
            raise ParamError(err.name, err.message, "federation") from None
        everyone = algorithm.participation == "all" or clients_per_round in (0, clients)
        return cls(clients, clients if everyone else clients_per_round, float(dict(uplink[at].values)["sigma"]),
                   len(algorithm.uploads))

    @property
    def noise_multiplier(self) -> float:
        """m = σ/(2√U): the noise's standard deviation over the replace-one ℓ2 sensitivity of the U means."""
        return self.sigma / (2 * math.sqrt(self.uploads))

    def event(self) -> DpEvent:
        """One round as dp-accounting's event for its RDP accountant under `REPLACE_ONE`."""
        import dp_accounting

        gaussian = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if self.sampled == self.clients:
            return gaussian
        return dp_accounting.SampledWithoutReplacementDpEvent(self.clients, self.sampled, gaussian)

    def dominating_event(self) -> DpEvent:
        """One round as the event of its dominating pair (the module's docstring), for dp-accounting's PLD accountant
        under `ADD_OR_REMOVE_ONE`: the Poisson-subsampled Gaussian at q = S/N and multiplier m (all N: the Gaussian)."""
        import dp_accounting

        gaussian = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if self.sampled == self.clients:
            return gaussian
        return dp_accounting.PoissonSampledDpEvent(self.sampled / self.clients, gaussian)


@dataclass(frozen=True)
class Accountant:
    """ε at `delta` of a `mechanism` after a number of its rounds, by the `method` of `ACCOUNTANTS`: `pld` the
    privacy-loss distribution of the dominating pair (tight), `rdp` the Rényi DP bound.

    Example:
        ```python
        Accountant(Mechanism(clients=100, sampled=10, sigma=1.0), delta=1e-5).epsilon(500)
        ```
    """

    mechanism: Mechanism
    delta: float
    method: str = ACCOUNTANTS[0]

    def __post_init__(self) -> None:
        if not 0 < self.delta < 1:
            raise ParamError("delta", f"found {self.delta!r}, expected a δ in (0, 1)", "privacy")
        if self.method not in ACCOUNTANTS:
            raise ParamError("accountant", f"found {self.method!r}, expected one of {', '.join(ACCOUNTANTS)}",
                             "privacy")

    def epsilon(self, rounds: int) -> float:
        """ε after `rounds` rounds, the round composed `rounds` times (0 rounds: 0)."""
        return _epsilon(self, rounds)


@functools.lru_cache(maxsize=1 << 16)
def _epsilon(accountant: Accountant, rounds: int) -> float:
    if rounds == 0:
        return 0.0
    if accountant.method == "pld":
        return _pld_epsilon(accountant.mechanism, accountant.delta, rounds)
    from dp_accounting.rdp import compute_epsilon

    orders, rdp = _round_rdp(accountant.mechanism)
    # r rounds' RDP is r times one's, as the library's `compose(event, r)` makes it from zero
    return float(compute_epsilon(orders, rounds * rdp, accountant.delta)[0])


@functools.cache
def _round_rdp(mechanism: Mechanism) -> tuple[np.ndarray, np.ndarray]:
    """(the accountant's orders, the RDP of one round of `mechanism` at each)."""
    from dp_accounting import NeighboringRelation
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE).compose(mechanism.event())
    return accountant.orders, accountant.rdp


@functools.lru_cache(maxsize=64)
def _round_pld(mechanism: Mechanism, grid: float) -> PrivacyLossDistribution:
    """The PLD of one round's dominating pair on the grid `grid` (the PLD accountant's, for `dominating_event`)."""
    from dp_accounting.pld.privacy_loss_distribution import from_gaussian_mechanism

    return from_gaussian_mechanism(mechanism.noise_multiplier, value_discretization_interval=grid,
                                   sampling_prob=mechanism.sampled / mechanism.clients)


def _pld_epsilon(mechanism: Mechanism, delta: float, rounds: int) -> float:
    """ε at `delta` of the `rounds`-fold composition of the round's PLD, on the grid of its octave of rounds."""
    return _composed_epsilon(mechanism, delta, rounds, _grid(mechanism, delta, 1 << rounds.bit_length()))


@functools.lru_cache(maxsize=1 << 10)
def _grid(mechanism: Mechanism, delta: float, rounds: int) -> float:
    """The grid for the rounds below `rounds` (a power of two) down to its half: halved from ~1/(10m) until one more
    halving changes ε at `rounds` rounds by less than `TOLERANCE` (the module's docstring)."""
    grid = 2.0 ** math.floor(math.log2(1 / (10 * mechanism.noise_multiplier)))
    coarse = _composed_epsilon(mechanism, delta, rounds, grid)
    while True:
        fine = _composed_epsilon(mechanism, delta, rounds, grid / 2)
        if coarse - fine <= TOLERANCE * fine:
            return grid / 2
        grid, coarse = grid / 2, fine


def _composed_epsilon(mechanism: Mechanism, delta: float, rounds: int, grid: float) -> float:
    return float(_round_pld(mechanism, grid).self_compose(rounds).get_epsilon_for_delta(delta))
