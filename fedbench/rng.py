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
