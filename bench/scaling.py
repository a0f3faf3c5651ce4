"""How the engine's cost grows with the number of clients N, the dimension d and the number of runs R.

For each point, in a fresh process (so that its peak memory is its own): time per round (median of the rounds
after two warm-up rounds, evaluation excluded: it runs on a schedule) and peak resident memory, for FedAvg
(stateless: nothing per client) and SCAFFOLD (a control variate c_i `[N, d]` per client), on a Lasso with small
clients (4 samples each), S = 10 sampled clients, E = 5 local steps, b = 2:

  clients   N = 10², 10³, 10⁴, 10⁵ at d = 10, R = 1: a stateless method's round must not grow with N
            (no O(N) work per round); memory grows with the data and with declared per-client state only;
  dim       d = 10, 100, 1000 at N = 100, R = 1;
  runs      R = 1, 4, 16, 64 at N = 100, d = 10 (one program of R seeds): time per round per run.

Ratios are against the first point of each table, measured in this invocation. The machine is shared; compare
within one table only. Usage: python bench/scaling.py [--rounds 40] [--repeats 1]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

SAMPLES, CLIENTS_PER_ROUND, STEPS, BATCH = 4, 10, 5, 2


def one(point: dict) -> dict:
    """Time per round and peak memory of one (algorithm, N, d, R) point, in this process."""
    import torch

    import fedbench
    from fedbench.engine.runs import program
    from fedbench.engine.simulate import Federation, Simulation

    torch.set_num_threads(1)
    problem = fedbench.make_problem("lasso", clients=point["clients"], samples_per_client=SAMPLES, dim=point["dim"],
                                    support=max(1, point["dim"] // 2), data_seed=0)
    federation = Federation(point["rounds"] + 2, CLIENTS_PER_ROUND, STEPS, BATCH)
    sims = [Simulation(problem, fedbench.make_algorithm(point["algorithm"], problem, client_lr=0.01), federation,
                       seed, eval_every=10**9) for seed in range(point["runs"])]
    batch = program(sims)
    times = []
    for _ in range(point["rounds"] + 2):
        start = time.perf_counter()
        batch.run_round()
        times.append(time.perf_counter() - start)
    state = sum(v.numel() * v.element_size() for part in (batch.server, batch.clients) for v in part.values())
    return {"seconds": statistics.median(times[2:]), "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            / 1024, "state_mb": state / 2**20}


def measured(point: dict, repeats: int) -> dict:
    results = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, __file__, "--one", json.dumps(point)], capture_output=True, text=True,
                             check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {key: statistics.median(r[key] for r in results) for key in results[0]}


def table(title: str, axis: str, values: list[int], base: dict, rounds: int, repeats: int) -> None:
    print(f"\n{title}")
    print(f"{'algorithm':>10} {axis:>8} {'ms/round':>9} {'x first':>8} {'ms/run':>8} {'peak MB':>8} {'state MB':>9}")
    for algorithm in ("fedavg", "scaffold"):
        first = None
        for value in values:
            point = {**base, axis: value, "algorithm": algorithm, "rounds": rounds}
            result = measured(point, repeats)
            first = first or result["seconds"]
            print(f"{algorithm:>10} {value:>8} {1e3 * result['seconds']:>9.3f} {result['seconds'] / first:>8.2f} "
                  f"{1e3 * result['seconds'] / point['runs']:>8.3f} {result['peak_mb']:>8.0f} "
                  f"{result['state_mb']:>9.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    base = {"clients": 100, "dim": 10, "runs": 1}
    table("clients N (d = 10, R = 1)", "clients", [100, 1000, 10_000, 100_000], base, args.rounds, args.repeats)
    table("dimension d (N = 100, R = 1)", "dim", [10, 100, 1000], base, args.rounds, args.repeats)
    table("runs R (N = 100, d = 10; one program)", "runs", [1, 4, 16, 64], base, args.rounds, args.repeats)


if __name__ == "__main__":
    main()
