"""The cost of one pFedFBE round over one FedAvg round on pFedFBE's federated Lasso, setting (II) (anonymous ICLR 2023
submission, §4.1; recipes/papers/pfedfbe_lasso2.yaml: 30 clients × 128, p = 1024 + intercept, S = 10, R = 20, b = 50),
measured in the same run.

pFedFBE's local step takes a gradient, a prox and a Hessian-vector product; with the exact (closed-form)
HVP that is two gradient-sized batched products per step, so the target is ≤ 2.5× FedAvg(∂)'s round.
`autograd` (torch.func's forward-over-reverse HVP) and `finite_diff` (one more gradient) are timed beside it.
Times are medians over interleaved repetitions; the machine is shared, so only the ratios mean anything.
Usage: python bench/pfedfbe_round.py [--device cuda] [--rounds 10] [--repeats 7]
"""
from __future__ import annotations

import argparse

import torch

import fedbench
from fedbench.engine.simulate import Federation, Simulation
from round_timing import median_round_seconds

WAYS = {
    "fedavg": {},
    "pfedfbe exact": {"hvp": "exact"},
    "pfedfbe autograd": {"hvp": "autograd"},
    "pfedfbe finite_diff": {"hvp": "finite_diff"},
    "pfedfbe none": {"hvp": "none"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    problem = fedbench.make_problem("lasso", preset="fbe_personalized", seed=0, device=args.device)
    federation = Federation(10**6, 10, 20, 50)
    sims = {}
    for way, hp in WAYS.items():
        name = way.split()[0]
        extra = {"lam": 2000.0, **hp} if name == "pfedfbe" else {}
        sims[way] = Simulation(problem, fedbench.make_algorithm(name, problem, client_lr=5e-4, **extra), federation,
                               seed=0)

    medians = median_round_seconds(sims, args.rounds, args.repeats, args.device)
    print(f"one round, pFedFBE Lasso (II) p=1025 S=10 R=20 b=50, device={args.device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    for way, seconds in medians.items():
        print(f"{way:22s} {seconds / medians['fedavg']:5.2f}x FedAvg   ({seconds * 1e3:.2f} ms per round)")


if __name__ == "__main__":
    main()
