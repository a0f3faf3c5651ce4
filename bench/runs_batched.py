"""Many runs as one program (`fedbench.engine.runs`): for R = 1, 4, 16, 64 seeds of one configuration, the time of the R
runs one after another (each a `Simulation`, as `fedbench sweep` ran them before the run axis) over the time of
the R runs as one program (`run_batch`), measured in the same process, with evaluation on the usual schedule:

  ascd_pfl   ASCD-PFL on Hanzely, Zhao, Kolar's S1 (TMLR 2023, §5.1, Fig. 1: MX2, σ_h = 1.0, 20 devices × 1000
             samples, d = 15), coin-flip rounds: iteration-wise program (`IterationProgram`); 100 communication
             rounds, metrics every 10;
  fedmid     FedMiD on Bao et al.'s Lasso (ICML 2022, §4, Fig. 1: p = 1024, 64 clients, S = 10, E = 10, b = 10), the
             data fixed (`data_seed: 0`) so that the seeds share them; 60 rounds, metrics every 10. Its steps gather
             800 KB a run, beyond `fedbench.engine.planning.MEMORY_BOUND_RUN_BYTES`: memory-bound on the CPU, so there
             `run_batch` runs them one after another (a round-synchronous program measured 0.91-1.05x here, whatever
             its chunking); on a GPU they form one program (2.5-3.4x on an H200);
  fedavg     FedAvg on recipes/papers/niid_bench_fmnist.yaml's problem (NIID-Bench's CNN on 6,000 Fashion-MNIST
             images, 10 clients by Dir(0.5), all sampled, E = 10, b = 64), the data fixed (`data_seed: 0`); 4 rounds,
             metrics at the end. Its steps gather 2 MB a run, but a network's step is compute-bound
             (`Problem.compute_bound_steps`): its runs form one program on the CPU too (0.97-1.09x on 2 loaded cores);
  fedxl2     FeDXL2 on FeDXL's synthetic pAUC with recipes/papers/guo2023_pauc_synthetic.yaml's federation and
             step size (16 clients all sampled, K = 32, b = 32, float32; metrics every 6 rounds, the paper code's
             ~200 iterations), the data fixed (`data_seed: 0`); each run's feature noise and passive-score draws on
             its own streams (R small draws per step on the host); round-synchronous program; 12 rounds. Its
             largest difference is in a (p)AUC: a near-tied pair flipped by float32 rounding.

The machine is shared, so only the ratios mean anything: each is the ratio of the medians of `--repeats`
interleaved timings (alone, batched, alone, ...), so that a drift of the load hits both alike. Prints identity
too: the largest relative difference between a run's rows alone and in the batch. A batch of one is the run
alone (`run_batch`), so R = 1 reads 1x up to noise.
Usage: FEDBENCH_DATA=../shared/data python bench/runs_batched.py [--device cuda] [--sizes 1 4 16 64] [--repeats 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

import fedbench
from fedbench.engine.planning import why_not_batchable
from fedbench.engine.simulate import Federation, Simulation, run_batch
from fedbench.memory import keep_freed_memory

CASES = {
    "ascd_pfl": (lambda device: fedbench.make_problem("pfl_synthetic", preset="s1", sigma_h=1.0, device=device),
                 Federation(100, 0, 1, 1), {}, 10),
    "fedmid": (lambda device: fedbench.make_problem("lasso", preset="bao2022", data_seed=0, device=device),
               Federation(60, 10, 10, 10), {"client_lr": 1e-3}, 10),
    "fedavg": (lambda device: fedbench.make_problem("vision", model="niid_cnn_mnist", clients=10, partition="dirichlet",
                                                    alpha=0.5, train_size=6000, test_size=2000, data_seed=0,
                                                    device=device),
               Federation(4, 10, 10, 64), {"client_lr": 0.05}, 4),
    "fedxl2": (lambda device: fedbench.make_problem("pauc", preset="guo2023_synthetic", data_seed=0, device=device),
               Federation(12, 16, 32, 32), {"client_lr": 0.1, "decay_every": 768}, 6),
}


def simulations(problem, name, federation, hp, eval_every, seeds):
    return [Simulation(problem, fedbench.make_algorithm(name, problem, **hp), federation, seed, eval_every)
            for seed in seeds]


def timed(work):
    start = time.perf_counter()
    result = work()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timings per way; the medians compared")
    args = parser.parse_args()
    keep_freed_memory()  # as every fedbench run does
    print(f"R runs one after another / R runs as one program, device={args.device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    for name in args.cases:
        make, federation, hp, eval_every = CASES[name]
        problem = make(args.device)
        list(simulations(problem, name, dataclasses.replace(federation, rounds=1), hp, 1, [0])[0])  # warm-up
        why = why_not_batchable(simulations(problem, name, federation, hp, eval_every, [0, 1]))
        for size in args.sizes:
            seeds = list(range(size))

            def alone():
                return [list(sim) for sim in simulations(problem, name, federation, hp, eval_every, seeds)]

            def together():
                rows = [[] for _ in seeds]
                for i, row in run_batch(simulations(problem, name, federation, hp, eval_every, seeds)):
                    rows[i].append(row)
                return rows

            if why:
                seconds, _ = timed(alone)
                print(f"{name:9s} R={size:3d}  not on the run axis ({why}): ratio 1 by construction "
                      f"({seconds:.2f} s for the R runs)")
                break
            times = {"alone": [], "together": []}
            for _ in range(args.repeats):
                for way, work in (("alone", alone), ("together", together)):
                    seconds, rows = timed(work)
                    times[way].append(seconds)
                    if way == "alone":
                        reference = rows
                    else:
                        batched_rows = rows
            worst = max(abs(a[k] - b[k]) / max(abs(a[k]), 1e-300) for x, y in zip(reference, batched_rows)
                        for a, b in zip(x, y) for k in a)
            sequential, batched = statistics.median(times["alone"]), statistics.median(times["together"])
            print(f"{name:9s} R={size:3d}  {sequential / batched:5.2f}x   (one after another {sequential:6.2f} s, "
                  f"one program {batched:6.2f} s, medians of {args.repeats}; largest relative difference "
                  f"{worst:.1e})", flush=True)


if __name__ == "__main__":
    main()
