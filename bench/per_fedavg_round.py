"""The cost of one Per-FedAvg round over one FedAvg round at the digits size of Fallah, Mokhtari, Ozdaglar (NeurIPS
2020, §5, Table 1 rows M1-M2; Appendix I): n = 50 users of types A and B (real handwritten digits), 10 users a round,
tau = 10 local steps, D = D' = D'' = 40, the MLP 784 -> 80 -> 60 -> 10, measured in the same run.

Per local step FedAvg takes one gradient; FO two (at w on D, at the adapted model on D'); HF four (two more on D'' at
w +- delta*v); exact two gradients and a Hessian-vector product (double backward, about two more). By those counts HF
should take about 4x and exact about 3–4x FedAvg's round. Training only (no evaluation), sampling and minibatch draws
included. Times are medians over interleaved repetitions; the machine is shared, so only the ratios mean anything.
Usage: FEDBENCH_DATA=../shared/data python bench/per_fedavg_round.py [--device cuda] [--rounds 10] [--repeats 5]
"""
from __future__ import annotations

import argparse

import torch

import fedbench
from fedbench.engine.simulate import Federation, Simulation
from fedbench.memory import keep_freed_memory
from round_timing import median_round_seconds

WAYS = {"fedavg": ("fedavg", {}), "per_fedavg fo": ("per_fedavg", {"variant": "fo"}),
        "per_fedavg hf": ("per_fedavg", {"variant": "hf"}), "per_fedavg exact": ("per_fedavg", {"variant": "exact"})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    keep_freed_memory()  # as every fedbench run does
    problem = fedbench.make_problem("ab_users", preset="fallah2020_digits", seed=0, device=args.device)
    federation = Federation(10**6, 10, 10, 40)
    sims = {way: Simulation(problem, fedbench.make_algorithm(name, problem, client_lr=1e-3, **hp), federation, seed=0)
            for way, (name, hp) in WAYS.items()}

    medians = median_round_seconds(sims, args.rounds, args.repeats, args.device)
    print(f"one training round, Per-FedAvg digits (n=50, 10 users/round, tau=10, batches 40, MLP 784-80-60-10), "
          f"device={args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    for way, seconds in medians.items():
        print(f"{way:18s} {seconds / medians['fedavg']:5.2f}x FedAvg   ({seconds * 1e3:.1f} ms per round)")


if __name__ == "__main__":
    main()
