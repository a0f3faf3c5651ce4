"""Robust aggregation rules and the attacks of adversarial clients, batched over runs and clients.

Every function takes the sampled clients' uploads of R runs as `values` `[R, S, ...]` (the trailing axes are one
vector per client) and answers for each run at once; no loop over runs or clients.

Aggregation rules (unweighted, as Flower's FedMedian, FedTrimmedAvg and Krum strategies):

* `median`: the coordinate-wise median (Yin, Chen, Ramchandran, Bartlett, ICML 2018, Def. 1); for an even S the
  mean of the two middle values, as `numpy.median`.
* `trimmed_mean`: per coordinate, the ⌊βS⌋ largest and ⌊βS⌋ smallest values left out and the rest averaged
  (Yin et al. 2018, Def. 2; `scipy.stats.trim_mean(values, β)`), 0 ≤ β < 1/2.
* `krum`: the upload whose sum of squared distances to its S − f − 2 nearest other uploads is least (Blanchard,
  El Mhamdi, Guerraoui, Stainer, NeurIPS 2017, §4), for S > 2f + 2; `multi_krum`: the mean of the m = S − f uploads
  with the least such scores (their §4, "Multi-Krum").

Attacks (`attack`), on the uploads of the adversarial clients only, as updates (what each upload changes of the
server's entry it is a new value of): `sign_flip` sends −scale times its update, `scaled` scale times it, and
`gaussian` noise of standard deviation `scale` in its place (the "Gaussian attack" of Blanchard et al., §5).
"""
from __future__ import annotations

import torch
from torch import Tensor

RULES = ("median", "trimmed_mean", "krum", "multi_krum")
ATTACKS = ("sign_flip", "scaled", "gaussian")


def median(values: Tensor) -> Tensor:
    """The coordinate-wise median over clients, `[R, S, ...]` -> `[R, 1, ...]`."""
    ordered = values.sort(dim=1).values
    middle = (values.shape[1] - 1) // 2
    if values.shape[1] % 2:
        return ordered[:, middle: middle + 1]
    return (ordered[:, middle: middle + 1] + ordered[:, middle + 1: middle + 2]) / 2


def trimmed_mean(values: Tensor, beta: float) -> Tensor:
    """The coordinate-wise β-trimmed mean over clients, `[R, S, ...]` -> `[R, 1, ...]`."""
    cut = int(beta * values.shape[1])
    if 2 * cut >= values.shape[1]:
        raise ValueError(f"trimming {cut} of {values.shape[1]} clients from each side leaves none")
    ordered = values.sort(dim=1).values
    return ordered[:, cut: values.shape[1] - cut].mean(dim=1, keepdim=True)


def krum_scores(values: Tensor, byzantine: int) -> Tensor:
    """Each upload's Krum score `[R, S]`: the sum of its squared distances to its S − f − 2 nearest other uploads."""
    clients = values.shape[1]
    if clients <= 2 * byzantine + 2:  # Blanchard et al.'s condition n > 2f + 2
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


def aggregate_robustly(values: Tensor, rule: str, beta: float = 0.0, byzantine: int = 0) -> Tensor:
    """`values` `[R, S, ...]` aggregated by `rule` (one of RULES) to `[R, 1, ...]`."""
    if rule == "median":
        return median(values)
    if rule == "trimmed_mean":
        return trimmed_mean(values, beta)
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
    chosen = torch.randperm(count, generator=gen)[: int(fraction * count)]
    return torch.zeros(count, dtype=torch.bool).index_fill_(0, chosen, True)
