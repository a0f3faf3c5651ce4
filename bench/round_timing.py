"""Shared by the per-round cost benches: the seconds of training rounds of each simulation, the simulations timed in
turn (interleaved repeats, so the shared machine's load drifts over all of them alike), as samples or medians."""
from __future__ import annotations

import statistics
import time

import torch


def round_seconds(sims: dict, rounds: int, repeats: int, device: str, warm_up: bool = True) -> dict[str, list[float]]:
    """Each simulation's `repeats` timings of `rounds` rounds (seconds a round), taken in turn: the k-th timings of
    simulations drawn alike ran the same rounds. With `warm_up`, each first runs `rounds` untimed rounds."""
    def timed(sim):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(rounds):
            sim.run_round()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / rounds

    if warm_up:
        for sim in sims.values():
            timed(sim)
    samples: dict[str, list[float]] = {way: [] for way in sims}
    for _ in range(repeats):
        for way, sim in sims.items():
            samples[way].append(timed(sim))
    return samples


def median_round_seconds(sims: dict, rounds: int, repeats: int, device: str) -> dict[str, float]:
    return {way: statistics.median(values) for way, values in round_seconds(sims, rounds, repeats, device).items()}
