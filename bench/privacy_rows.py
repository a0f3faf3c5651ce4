"""What logging ε in every row costs (`fedbench.privacy`): a DP-FedAvg program of 8 seeds on a small Lasso, a row
every round (the worst case: eval_every 1), run without δ and with it, alternately in the same process. Printed:
the median ratio of wall times to the run without δ, and, robust to a loaded machine, the median share of each run's
wall time spent getting ε (timed around `Accountant.epsilon` within the run), for

  with δ, new rounds   the cache of ε per (mechanism, δ, round) emptied before the run: each round's ε is computed
                       once (the library's RDP-to-ε conversion), then found by the other 7 seeds;
  with δ, cached       the cache as the run before left it: every row a lookup (a sweep's later configurations of
                       the same mechanism, or its resumed runs).

The one-off cost of a mechanism (importing dp-accounting, the RDP of one round) is timed apart, as is one ε
computed and one looked up.
Usage: python bench/privacy_rows.py [--rounds 200] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fedbench  # noqa: E402
from fedbench import privacy  # noqa: E402
from fedbench.simulate import Federation, Simulation, run_batch  # noqa: E402

SEEDS = range(8)


SPENT = [0.0]  # seconds inside `Accountant.epsilon` since the last run began
EPSILON = privacy.Accountant.epsilon


def timed_epsilon(self, rounds):
    start = time.perf_counter()
    try:
        return EPSILON(self, rounds)
    finally:
        SPENT[0] += time.perf_counter() - start


def run(problem, federation: Federation, delta: float | None) -> tuple[float, float]:
    """(wall seconds of the program, the share of them spent getting ε)."""
    sims = [Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.05), federation, seed, 1,
                       delta=delta) for seed in SEEDS]
    SPENT[0] = 0.0
    start = time.perf_counter()
    for _ in run_batch(sims):
        pass
    wall = time.perf_counter() - start
    return wall, SPENT[0] / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    problem = fedbench.make_problem("lasso", seed=0, clients=64, samples_per_client=32, dim=64, support=16, lam=0.01)
    federation = Federation(args.rounds, 16, 5, 10, uplink=[{"clip": 0.5}, {"gaussian": 1.0}])
    mechanism = privacy.Mechanism(64, 16, 1.0)
    start = time.perf_counter()
    privacy.Accountant(mechanism, 1e-5).epsilon(1)
    print(f"a mechanism's first ε (import dp-accounting, one round's RDP): {time.perf_counter() - start:.2f} s")
    privacy.Accountant.epsilon = timed_epsilon
    timings: dict[str, list[tuple[float, float]]] = {"without δ": [], "with δ, new rounds": [], "with δ, cached": []}
    run(problem, federation, None)  # warm-up: torch's first calls
    for _ in range(args.repeats):
        timings["without δ"].append(run(problem, federation, None))
        privacy._epsilon.cache_clear()
        timings["with δ, new rounds"].append(run(problem, federation, 1e-5))
        timings["with δ, cached"].append(run(problem, federation, 1e-5))
    base = statistics.median(wall for wall, _ in timings["without δ"])
    rows = args.rounds * len(SEEDS)
    print(f"{len(SEEDS)} seeds × {args.rounds} rounds, a row every round ({rows} rows), median of {args.repeats}:")
    for name, runs in list(timings.items())[1:]:
        print(f"  {name:<20} {statistics.median(wall for wall, _ in runs) / base:.3f} × the wall time without δ; "
              f"{100 * statistics.median(share for _, share in runs):.2f}% of it getting ε")
    privacy.Accountant.epsilon = EPSILON
    accountant = privacy.Accountant(mechanism, 1e-5)
    privacy._epsilon.cache_clear()
    start = time.perf_counter()
    for r in range(1, 1001):
        accountant.epsilon(r)
    computed = (time.perf_counter() - start) / 1000
    start = time.perf_counter()
    for r in range(1, 1001):
        accountant.epsilon(r)
    found = (time.perf_counter() - start) / 1000
    print(f"one ε computed: {computed * 1e6:.0f} µs, looked up: {found * 1e6:.1f} µs ({computed / found:.0f}×)")


if __name__ == "__main__":
    main()
