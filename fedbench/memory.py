"""Keeping freed memory for reuse inside the process (glibc's allocator).

Every local step gathers its minibatch into a fresh tensor (S·b rows of d floats: 0.8 MB for FedMiD's Lasso at
S = 10, 8 MB at S = 100) and frees it when the step ends. glibc hands a block that large back to the kernel,
through `munmap` (above M_MMAP_THRESHOLD) or by trimming the top of the heap (above M_TRIM_THRESHOLD, 128 KB once
any threshold is set), and the next step pays the page faults of fresh memory again: measured here, the bare
gather-and-products of a Lasso round took 42–52 ms at S = 100 and 4.2–5.0 ms at S = 10 so, against 14–19 ms and
1.0–1.9 ms with both thresholds raised (3 alternations, one process each). Whether a given process hit the trim
depended on where its heap's top happened to be, which made timings bimodal from one process to the next.
`keep_freed_memory` raises both thresholds, so freed blocks stay in the process and the next step reuses them; the
process keeps the memory of its peak. Called where fedbench starts its runs (each Ray trial, `fedbench run`, the
benchmarks); a no-op away from glibc.
"""
from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
KEEP_BELOW = 1 << 30  # blocks under 1 GiB come from the heap, which is not trimmed while less than this is free


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; whether they were set (False off glibc)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BELOW)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BELOW))
