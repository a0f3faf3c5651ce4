"""Named random streams: every draw of a trial comes from a generator seeded by (seed, stream).

Streams are independent of each other, so adding a draw to one stream (say, a new init scheme)
never shifts another (the data, the client sampling). Generators live on the CPU; what they draw is
moved to the compute device, so a trial draws the same numbers on every device.
"""
from __future__ import annotations

import hashlib

import torch


def stream_seed(seed: int, stream: str) -> int:
    digest = hashlib.blake2b(f"{seed}/{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def generator(seed: int, stream: str) -> torch.Generator:
    return torch.Generator().manual_seed(stream_seed(seed, stream))


# The integer type of each floating key type's width: `largest_keys` compares keys by their bits.
_SAME_WIDTH_INT = {torch.float64: torch.int64, torch.float32: torch.int32}


def largest_keys(keys: torch.Tensor, k: int, sorted: bool = False) -> torch.Tensor:
    """Indices of the `k` largest keys along the last axis, exactly as `keys.topk(k, dim=-1, sorted=sorted).indices`
    gives them, order included: a uniform k-subset when the keys are i.i.d. uniform.

    The keys must be uniform draws in [0, 1), some of them possibly set to one negative padding value (−1: never
    picked before a key). Such keys compare as the integers of their bits do (a non-negative IEEE float's bits grow
    with it; the one negative value's are below them all), so topk runs on the bits viewed as integers, on which
    its selection (an `nth_element` per row on the CPU) makes the same comparisons in the same order, without the
    float comparator's NaN tests and its float-to-double conversion: 85 µs against 110 µs for the E = S = 10 rows
    of 128 keys of a Lasso round, most of a round's draws. The order within a minibatch is part of every recorded
    curve's rounding, which is why the selection itself stays."""
    return keys.view(_SAME_WIDTH_INT[keys.dtype]).topk(k, dim=-1, sorted=sorted).indices
