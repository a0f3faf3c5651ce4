"""Splits of a labelled pool of samples over N clients: IID, Dirichlet label skew, label quantity #C = k, shards.

`split(labels, clients, scheme, generator, ...)` returns each client's row indices into the pool, **sorted
ascending** (a client's data is a set; its order is drawn later, by the minibatch sampler), every row in exactly
one client. `Partition` holds a scheme with its parameters, checked when it is made; its `describe()` is the
stable string a run records (and `digest()` its hash), and `fingerprint(parts)` hashes the split itself, so a run
can record both what was asked and what was drawn. Every scheme draws from the given `torch.Generator` alone, in a
fixed order, so one seed gives one split on every machine. A split that cannot be made is refused, before
anything is drawn where its parameters alone decide it, with a `ParamError` naming the field (`partition.FIELD`),
what was found and what was expected; no scheme loops until a draw happens to work.

Schemes (K classes: the labels' largest value + 1):
* `iid`: a uniform random permutation of the rows, cut into N contiguous parts of ⌊n/N⌋ or ⌈n/N⌉ rows.
* `dirichlet` (label skew; Hsu, Qi, Brown 2019, "Measuring the effects of non-identical data distribution",
  §3, as NIID-Bench implements it: Li, Diao, Chen, He, ICDE 2022, §4 "distribution-based label imbalance"): for
  each class c, proportions p_c ~ Dir(α·1_N) over the clients, independent across classes; class c's n_c rows,
  in a random order, are cut at ⌊n_c·(p_c1 + … + p_ci)⌋, so client i gets n_c·p_ci of them up to less than one
  row. Client i's share of class c thus follows Beta(α, (N−1)α): mean 1/N, variance (N−1)/(N²(Nα+1)).
  NIID-Bench redraws everything until each client holds `min_size` rows (10 in its code), a loop that need not
  end for small α and many clients; here the draw is kept and then **topped up**: clients below `min_size`, in
  index order, take rows from the client holding the most rows (lowest index among ties), of that donor's
  largest class, never bringing the donor below `min_size`. This always ends (a client below `min_size` while
  n ≥ N·min_size means the largest holds more than `min_size`) and moves at most N·min_size rows; only the
  clients topped up and their donors differ from the Dirichlet draw (none where every client already holds
  `min_size`). n < N·min_size is refused. NIID-Bench also zeroes the proportions of clients already holding n/N
  rows (a balancing step not in Hsu et al.); that is not done here, so the law above holds.
  Gamma variates for the Dirichlet are drawn in log space, G = Gamma(α+1)·U^{1/α} (Marsaglia and Tsang 2000,
  their boost for α < 1), with `torch._standard_gamma` and `torch.rand` on the generator: a direct Gamma(α) draw
  underflows below 1e-308 when U < 10^{−308α} (half the time at α = 0.001), where torch clamps it to the smallest
  normal, and a class whose N draws all underflow would be split evenly.
* `label_quantity` #C = k (NIID-Bench §4 "quantity-based label imbalance", its `noniid-#label{k}` code):
  client i holds label i mod K and k−1 further distinct labels drawn uniformly from the other K−1; each label's
  rows, in a random order, are split among its holders in client order into parts of ⌊n_c/t⌋ or ⌈n_c/t⌉ (the
  first ones larger), t the number of its holders. N < K is refused (a label would be held by no client, as the
  paper's assignment gives every label a holder), as is k > K; a draw that leaves some client fewer than
  `min_size` rows (labels with few rows shared by many holders) is refused naming the client.
* `shards` (McMahan, Moore, Ramage, Hampson, Agüera y Arcas, AISTATS 2017, §3 "pathological non-IID"): the rows
  sorted by label (random order within a label) are cut into S = N·s contiguous shards of ⌊n/S⌋ or ⌈n/S⌉ rows
  (the paper: 200 shards of 300 for 100 clients, s = 2), and each client gets s shards drawn without replacement.

Draw order (what a seed fixes): `iid` one randperm(n); `dirichlet` Gamma(α+1) [K, N], then U [K, N], then
randperm(n); `label_quantity` U [N, K], then randperm(n); `shards` randperm(n), then randperm(S).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedbench.hparams import ParamError

SCHEMES = ("iid", "dirichlet", "label_quantity", "shards")
"""The schemes `split` knows."""
# The parameter each scheme needs beside `clients` and `min_size`; a scheme refuses the others' parameters.
SCHEME_PARAMETER = {"iid": None, "dirichlet": "alpha", "label_quantity": "classes_per_client",
                    "shards": "shards_per_client"}
OWNER = "partition"


@dataclass(frozen=True)
class Partition:
    """A scheme and its parameters, checked when made (`ParamError` naming the field)."""

    scheme: str
    clients: int
    alpha: float | None = None
    classes_per_client: int | None = None
    shards_per_client: int | None = None
    min_size: int = 1

    def __post_init__(self):
        if self.scheme not in SCHEMES:
            raise ParamError("scheme", f"found {self.scheme!r}, expected one of {' | '.join(SCHEMES)}", OWNER)
        _check_int("clients", self.clients, 1)
        _check_int("min_size", self.min_size, 0)
        wanted = SCHEME_PARAMETER[self.scheme]
        for name in ("alpha", "classes_per_client", "shards_per_client"):
            value = getattr(self, name)
            if name != wanted and value is not None:
                users = [scheme for scheme, parameter in SCHEME_PARAMETER.items() if parameter == name]
                raise ParamError(name, f"found {value!r} with scheme {self.scheme}, expected it only with scheme "
                                 f"{users[0]} (null otherwise)", OWNER)
            if name == wanted and value is None:
                raise ParamError(name, f"found none, expected a value: scheme {self.scheme} needs it", OWNER)
        if self.scheme == "dirichlet":
            alpha = self.alpha
            if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (0 < alpha < math.inf):
                raise ParamError("alpha", f"found {alpha!r}, expected a finite concentration α > 0", OWNER)
        elif wanted is not None:
            _check_int(wanted, getattr(self, wanted), 1)

    def describe(self) -> str:
        """The scheme and the parameters it uses, e.g. `dirichlet(clients=500, alpha=0.05, min_size=1)`: stable
        across runs and versions, what a run records."""
        shown = [f"clients={self.clients}"]
        if self.alpha is not None:
            shown.append(f"alpha={float(self.alpha)!r}")  # 1 and 1.0 alike
        shown += [f"{name}={getattr(self, name)}" for name in ("classes_per_client", "shards_per_client")
                  if getattr(self, name) is not None]
        return f"{self.scheme}({', '.join([*shown, f'min_size={self.min_size}'])})"

    def digest(self) -> str:
        """A 16-hex-digit hash of `describe()`."""
        return hashlib.blake2b(self.describe().encode(), digest_size=8).hexdigest()

    def split(self, labels: Tensor, generator: torch.Generator) -> list[Tensor]:
        """Each client's row indices into `labels` ([n] int64, values in [0, K)), sorted ascending."""
        labels = _checked_labels(labels)
        n = len(labels)
        if n < self.clients * self.min_size:
            raise ParamError("clients", f"found {self.clients} clients of at least min_size {self.min_size} rows "
                             f"each, expected at most {n // max(self.min_size, 1)}: the pool holds {n} rows", OWNER)
        if self.scheme == "iid":
            return _sorted_parts(torch.tensor_split(torch.randperm(n, generator=generator), self.clients))
        if self.scheme == "dirichlet":
            counts = dirichlet_counts(torch.bincount(labels).numpy(), self.clients, float(self.alpha or 0.0),
                                      self.min_size, generator)
            return _deal(labels, counts, generator)
        if self.scheme == "label_quantity":
            return self._label_quantity(labels, generator)
        return self._shards(labels, generator)

    def _label_quantity(self, labels: Tensor, generator: torch.Generator) -> list[Tensor]:
        sizes = torch.bincount(labels).numpy()
        classes, k, clients = len(sizes), int(self.classes_per_client or 0), self.clients
        if k > classes:
            raise ParamError("classes_per_client", f"found {k}, expected at most the {classes} classes of the "
                             "labels", OWNER)
        if clients < classes:
            raise ParamError("clients", f"found {clients}, expected at least the {classes} classes of the labels: "
                             "label_quantity gives client i label i mod K first, so every label has a holder "
                             "(NIID-Bench, §4)", OWNER)
        holds = label_assignment(clients, classes, k, generator)
        holders = holds.sum(0)
        # Class c's rows go to its holders in client order, the first n_c mod t of them one row more.
        rank = np.cumsum(holds, 0) - 1  # among class c's holders, client i is the rank[i, c]-th
        counts = np.where(holds, sizes // np.maximum(holders, 1) + (rank < sizes % np.maximum(holders, 1)), 0)
        totals = counts.sum(1)
        if (totals < self.min_size).any():
            short = int(np.argmin(totals))
            raise ParamError("min_size", f"found client {short} with {totals[short]} rows (labels "
                             f"{np.flatnonzero(holds[short]).tolist()}, each shared among its holders), expected at "
                             f"least min_size {self.min_size}: use fewer clients or a larger classes_per_client",
                             OWNER)
        return _deal(labels, counts.T, generator)

    def _shards(self, labels: Tensor, generator: torch.Generator) -> list[Tensor]:
        n, per_client = len(labels), int(self.shards_per_client or 0)
        shards = self.clients * per_client
        smallest = (n // shards) * per_client
        if smallest < max(self.min_size, 1):
            raise ParamError("shards_per_client", f"found {self.shards_per_client} shards for each of "
                             f"{self.clients} clients: {shards} shards of {n} rows leave a client {smallest} rows, "
                             f"expected at least min_size {max(self.min_size, 1)}", OWNER)
        by_label = _shuffled_by_label(labels, generator)
        pieces = torch.tensor_split(by_label, shards)
        dealt = torch.randperm(shards, generator=generator).view(self.clients, -1)
        return _sorted_parts([torch.cat([pieces[j] for j in row.tolist()]) for row in dealt])


def split(labels: Tensor, clients: int, scheme: str, generator: torch.Generator, *, alpha: float | None = None,
          classes_per_client: int | None = None, shards_per_client: int | None = None,
          min_size: int = 1) -> list[Tensor]:
    """Each client's row indices into `labels`, sorted ascending: `Partition(...).split(labels, generator)`."""
    return Partition(scheme, clients, alpha, classes_per_client, shards_per_client, min_size).split(labels, generator)


def fingerprint(parts: list[Tensor]) -> str:
    """A hash of a split (the clients' sizes and rows, in order): equal splits, equal fingerprints."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(np.array([len(part) for part in parts], dtype="<i8").tobytes())
    for part in parts:
        digest.update(part.numpy().astype("<i8", copy=False).tobytes())
    return digest.hexdigest()


def dirichlet_proportions(classes: int, clients: int, alpha: float, generator: torch.Generator) -> Tensor:
    """[K, N] float64, each row p_c ~ Dir(α·1_N), independent: G_ci = Gamma(α+1)·U^{1/α} normalised, in log space."""
    shape = torch.full((classes, clients), alpha + 1.0, dtype=torch.float64)
    log_gamma = torch._standard_gamma(shape, generator=generator).log()
    uniform = torch.rand(classes, clients, dtype=torch.float64, generator=generator)
    log_g = log_gamma + uniform.clamp_min(torch.finfo(torch.float64).tiny).log() / alpha
    return torch.softmax(log_g, dim=1)


def dirichlet_counts(sizes: np.ndarray, clients: int, alpha: float, min_size: int,
                     generator: torch.Generator) -> np.ndarray:
    """[K, N] int64: how many rows of each class each client gets (the `dirichlet` scheme, top-up included)."""
    proportions = dirichlet_proportions(len(sizes), clients, alpha, generator).numpy()
    cuts = np.minimum(np.floor(np.cumsum(proportions, 1) * sizes[:, None]), sizes[:, None]).astype(np.int64)
    cuts[:, -1] = sizes
    counts = np.diff(cuts, axis=1, prepend=0)
    top_up(counts, min_size)
    return counts


def top_up(counts: np.ndarray, min_size: int) -> int:
    """Bring every client (column) of `counts` [K, N] to `min_size` rows in place, as the module says; returns
    the rows moved. Needs counts.sum() >= N·min_size."""
    totals = counts.sum(0)
    moved = 0
    for client in np.flatnonzero(totals < min_size):
        while totals[client] < min_size:
            donor = int(np.argmax(totals))  # holds more than min_size: see the module's docstring
            label = int(np.argmax(counts[:, donor]))
            take = min(min_size - totals[client], totals[donor] - min_size, counts[label, donor])
            counts[label, donor] -= take
            counts[label, client] += take
            totals[donor] -= take
            totals[client] += take
            moved += take
    return moved


def label_assignment(clients: int, classes: int, k: int, generator: torch.Generator) -> np.ndarray:
    """[N, K] bool: client i holds label i mod K and k−1 others, a uniform subset of the remaining K−1."""
    keys = torch.rand(clients, classes, dtype=torch.float64, generator=generator)
    first = torch.arange(clients) % classes
    keys[torch.arange(clients), first] = 2.0  # above every uniform key: always among the k largest
    holds = torch.zeros(clients, classes, dtype=torch.bool)
    holds.scatter_(1, keys.topk(k, dim=1).indices, True)
    return holds.numpy()


def _deal(labels: Tensor, counts: np.ndarray, generator: torch.Generator) -> list[Tensor]:
    """Rows for `counts` [K, N]: class c's rows, in a random order, go counts[c, 0] to client 0, then client 1, …"""
    by_label = _shuffled_by_label(labels, generator)
    clients = counts.shape[1]
    owner = torch.from_numpy(np.repeat(np.tile(np.arange(clients), len(counts)), counts.ravel()))
    ordered = by_label[torch.argsort(owner * len(labels) + by_label)]  # by client, then by row
    return list(torch.split(ordered, counts.sum(0).tolist()))


def _shuffled_by_label(labels: Tensor, generator: torch.Generator) -> Tensor:
    """The rows sorted by label, in a uniformly random order within each label."""
    shuffled = torch.randperm(len(labels), generator=generator)
    return shuffled[torch.argsort(labels[shuffled], stable=True)]


def _sorted_parts(parts) -> list[Tensor]:
    return [part.sort().values for part in parts]


def _checked_labels(labels: Tensor) -> Tensor:
    labels = torch.as_tensor(labels)
    if labels.ndim != 1 or labels.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8) or not len(labels):
        raise ValueError(f"labels: found {labels.dtype} {list(labels.shape)}, expected a non-empty [n] integer tensor")
    if labels.min() < 0:
        raise ValueError(f"labels: found {int(labels.min())}, expected class labels >= 0")
    return labels.to(torch.int64)


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ParamError(name, f"found {value!r}, expected an integer >= {low}", OWNER)
