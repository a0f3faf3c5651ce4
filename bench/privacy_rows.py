"""What logging ε in every row costs (`fedbench.axes.privacy`): a DP-FedAvg program of 8 seeds on a small Lasso, a row
every round (the worst case: eval_every 1), run without δ and with it, alternately in the same process. Printed:
the median ratio of wall times to the run without δ, and, robust to a loaded machine, the median share of each run's
wall time spent getting ε (timed around `Accountant.epsilon` within the run), for

  with δ, new rounds   the cache of ε per (mechanism, δ, round) emptied before the run: each round's ε is computed
                       once (the library's RDP-to-ε conversion), then found by the other 7 seeds;
  with δ, cached       the cache as the run before left it: every row a lookup (a sweep's later configurations of
                       the same mechanism, or its resumed runs).

with the recipe's default accountant (PLD) or `--accountant rdp`. The one-off cost of a mechanism (importing
dp-accounting, the first ε) is timed apart. Then, apart from any run, what ε costs over a long run by each accountant:
every logged row's ε computed once (caches emptied), rows every `--every` rounds up to `--long` rounds, for the
mechanisms of the shipped privacy recipes (recipes/privacy.yaml: S = 100 of N = 1,000 at σ = 1, 2, 4), with the
total, the median and the largest cost of a row, and one ε looked up.
Usage: python bench/privacy_rows.py [--rounds 200] [--repeats 5] [--accountant pld] [--long 5000] [--every 10]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fedbench  # noqa: E402
from fedbench.axes import privacy  # noqa: E402
from fedbench.engine.simulate import Federation, Simulation, run_batch  # noqa: E402

SEEDS = range(8)


SPENT = [0.0]  # seconds inside `Accountant.epsilon` since the last run began
EPSILON = privacy.Accountant.epsilon


def timed_epsilon(self, rounds):
    start = time.perf_counter()
    try:
        return EPSILON(self, rounds)
    finally:
        SPENT[0] += time.perf_counter() - start


def run(problem, federation: Federation, delta: float | None, accountant: str) -> tuple[float, float]:
    """(wall seconds of the program, the share of them spent getting ε)."""
    sims = [Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.05), federation, seed, 1,
                       delta=delta, accountant=accountant) for seed in SEEDS]
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
    parser.add_argument("--accountant", choices=privacy.ACCOUNTANTS, default=privacy.ACCOUNTANTS[0])
    parser.add_argument("--long", type=int, default=5000)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    if args.repeats:
        in_runs(args)
    long_runs(args.long, args.every)


def in_runs(args) -> None:
    problem = fedbench.make_problem("lasso", seed=0, clients=64, samples_per_client=32, dim=64, support=16, lam=0.01)
    federation = Federation(args.rounds, 16, 5, 10, uplink=[{"clip": 0.5}, {"gaussian": 1.0}])
    mechanism = privacy.Mechanism(64, 16, 1.0)
    start = time.perf_counter()
    privacy.Accountant(mechanism, 1e-5, args.accountant).epsilon(1)
    print(f"a mechanism's first ε (import dp-accounting, one round's RDP): {time.perf_counter() - start:.2f} s")
    privacy.Accountant.epsilon = timed_epsilon
    timings: dict[str, list[tuple[float, float]]] = {"without δ": [], "with δ, new rounds": [], "with δ, cached": []}
    run(problem, federation, None, args.accountant)  # warm-up: torch's first calls
    for _ in range(args.repeats):
        timings["without δ"].append(run(problem, federation, None, args.accountant))
        privacy._epsilon.cache_clear()
        timings["with δ, new rounds"].append(run(problem, federation, 1e-5, args.accountant))
        timings["with δ, cached"].append(run(problem, federation, 1e-5, args.accountant))
    base = statistics.median(wall for wall, _ in timings["without δ"])
    rows = args.rounds * len(SEEDS)
    print(f"{len(SEEDS)} seeds × {args.rounds} rounds, a row every round ({rows} rows), median of {args.repeats}:")
    for name, runs in list(timings.items())[1:]:
        print(f"  {name:<20} {statistics.median(wall for wall, _ in runs) / base:.3f} × the wall time without δ; "
              f"{100 * statistics.median(share for _, share in runs):.2f}% of it getting ε")
    privacy.Accountant.epsilon = EPSILON


def long_runs(rounds: int, every: int) -> None:
    rows = range(every, rounds + 1, every)
    print(f"ε at {len(rows)} rows (every {every} rounds to {rounds}), each computed once:")
    for sigma in (1.0, 2.0, 4.0):
        for method in privacy.ACCOUNTANTS:
            accountant = privacy.Accountant(privacy.Mechanism(1000, 100, sigma), 1e-5, method)
            privacy._epsilon.cache_clear()
            privacy._round_pld.cache_clear()
            privacy._round_rdp.cache_clear()
            privacy._grid.cache_clear()
            costs = []
            for r in rows:
                start = time.perf_counter()
                epsilon = accountant.epsilon(r)
                costs.append(time.perf_counter() - start)
            start = time.perf_counter()
            accountant.epsilon(rows[-1])
            found = time.perf_counter() - start
            median = statistics.median(costs)
            print(f"  σ = {sigma:g}, {method}: {sum(costs):7.2f} s in all, a row {1e3 * median:7.2f} ms (median), "
                  f"{1e3 * max(costs):7.1f} ms (largest, the first with the one-off), looked up "
                  f"{1e6 * found:.1f} µs; ε({rows[-1]}) = {epsilon:.4g}", flush=True)


if __name__ == "__main__":
    main()
