"""Shared by the per-round cost benches: the median seconds of one training round of each simulation, the
simulations timed in turn (interleaved repeats, so the shared machine's load drifts over all of them alike)."""
from __future__ import annotations

import statistics
import time

import torch


def median_round_seconds(sims: dict, rounds: int, repeats: int, device: str) -> dict[str, float]:
    def timed(sim):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(rounds):
            sim.run_round()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / rounds

    for sim in sims.values():
        timed(sim)  # warm-up
    samples = {way: [] for way in sims}
    for _ in range(repeats):
        for way, sim in sims.items():
            samples[way].append(timed(sim))
    return {way: statistics.median(values) for way, values in samples.items()}
