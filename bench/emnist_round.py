"""A FedAvg round of Reddi et al.'s EMNIST CNN on FEMNIST's writers as their §5 runs it (ICLR 2021: S = 10 clients a
round, one local epoch at b = 20), in fedbench against a plain `torch.nn` + `torch.optim.SGD` loop over the same
clients and, with `--flower`, against Flower's simulation of the same round (`bench/peers/flower_emnist.py`).

fedbench: the `vision` problem on FEMNIST's writers (`--path`, the data root's `femnist/femnist_sample10.npz` by
default: 360 writers, 10% of the full file's, the same distribution of writer sizes), `model: emnist_cnn` (dropout
on), `local_steps: {epochs: 1}` (client k takes ⌈n_k / 20⌉ steps over a fresh permutation of its images),
`aggregation: samples`, FedAvg with client_lr 0.1 and server lr 1, in each `--layouts` layout
(`Simulation.run_round`: draws, gathers, the clients' steps as one program, the server update). The floor
(`deep_layouts.PlainLoop`) runs the same rounds' draws: each client an `nn.Module` in training mode trained by
`torch.optim.SGD` on its real rows of each step, one client after another, the uploads weighted by samples: the same
real minibatches. Every way runs round after round in turn (round r of each way draws the same clients and rows, one
warm-up round first), so the k-th timings of the ways are paired: the ratios printed are the medians of the rounds'
ratios, beside each way's median seconds a round.

Flower (`--flower`, the peer venv's python, made by `bash bench/peers/setup_flower.sh`): after each block of
`--rounds` fedbench rounds, a subprocess runs Flower's simulation of those rounds (the same writers, one epoch,
b = 20, SGD lr 0.1, weighted by samples; one warm-up round left out): `--threads` Ray CPUs, as many client actors of
1 CPU and 1 torch thread each, against fedbench's `--threads` torch threads: the same cores for both. The ratio
printed is Flower's seconds over fedbench's on the same rounds (median over rounds).

Measured by `python bench/emnist_round.py --blocks 3 --rounds 4 --flower` (the 10% sample; torch 2.13.0, 1 thread;
this project's 2-core x86-64 CPU, two paper runs at a higher priority on both cores and other processes beside them,
load average 8-10, every process of the bench niced; docs/design.md): 12 paired rounds, fedbench `loop` 24.4 s a
round, plain 21.2 s, Flower 1.42.0 24.8 s (means); medians of the paired ratios: fedbench 1.15x the plain loop,
Flower 1.12x it and 0.96x fedbench.
Before the loop layout left a client past its epoch out of the gathers (and dropout's seeding and FedAvg's zero
subgradient at h = 0 were cut), fedbench took 1.31x and 1.23x the plain loop (two runs, 6 paired rounds, no Flower);
1.19x and 1.16x after. After a local step came to run only the clients still within their epoch
(`RoundProgram._uneven_steps`), `--blocks 2 --rounds 3 --flower` (6 paired rounds, load average 8-13): fedbench
1.14x the plain loop, Flower 1.20x it and 1.02x fedbench (still a tie within the noise). After FedAvg's local step came
to write each client's step without gathering its gradient into `[S, d]` (`ModuleModel.descend`), old and new code side
by side, each pairing its rounds with the plain loop's in CPU seconds: 1.12x before, 1.06x after (medians of 10 paired
rounds each; docs/design.md, with this script's wall-time ratios, alternated old and new). Then, on the machine with
nothing else running (load average 1.3), `--blocks 2 --rounds 3 --flower` and `--blocks 3 --rounds 4 --flower`:
fedbench 1.09x and 1.085x the plain loop (3.1 and 2.8 s a round), Flower 1.20x and 1.17x it, 1.02x and 1.07x
fedbench (medians of 6 and 12 paired rounds).

Usage: OMP_NUM_THREADS=1 FEDBENCH_DATA=... python bench/emnist_round.py [--layouts loop vmap] [--rounds 4]
       [--blocks 3] [--flower [PYTHON]] [--path femnist/femnist_full.npz]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from fedbench.algorithms import ALGORITHMS
from fedbench.data import femnist
from fedbench.engine.simulate import Federation, Simulation
from fedbench.memory import keep_freed_memory
from fedbench.networks.module_model import LAYOUTS
from fedbench.problems import make_problem

sys.path.insert(0, str(Path(__file__).parent))
from deep_layouts import PlainLoop  # noqa: E402
from round_timing import round_seconds  # noqa: E402

PEERS = Path(__file__).parent / "peers"
FLOWER_PYTHON = PEERS / ".venv-flower" / "bin" / "python"


def flower_seconds(python: Path, data: Path, rounds: list[list[int]], args, workdir: Path) -> dict:
    """Flower's simulation of `rounds` (each round's writers), one warm-up round first: its timed rounds' seconds."""
    plan, out = workdir / "plan.json", workdir / "flower.json"
    plan.write_text(json.dumps({"rounds": rounds[:1] + rounds, "warm_up": 1}))
    ran = subprocess.run([str(python), str(PEERS / "flower_emnist.py"), "--data", str(data), "--plan", str(plan),
                          "--clients", str(args.clients), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
                          "--cpus", str(args.threads), "--out", str(out)], capture_output=True, text=True)
    if ran.returncode != 0:
        sys.exit(f"Flower's simulation failed (exit {ran.returncode}):\n{ran.stderr[-4000:]}")
    return json.loads(out.read_text())


def paired_ratio(top: list[float], bottom: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(top, bottom))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=femnist.DEFAULT_PATHS["sample10"], help="FEMNIST npz, under the data root")
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=["loop"])
    parser.add_argument("--clients", type=int, default=10, help="S, clients a round")
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.1, help="client learning rate")
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds of each way in a block")
    parser.add_argument("--blocks", type=int, default=3, help="blocks of rounds (Flower runs after each)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch threads of fedbench; Flower's Ray CPUs (client actors)")
    parser.add_argument("--flower", nargs="?", type=Path, const=FLOWER_PYTHON,
                        help="time Flower too, with this python (default: the peer venv's)")
    args = parser.parse_args()
    if args.flower is not None and not args.flower.exists():
        sys.exit(f"{args.flower}: no such python; make it with: bash bench/peers/setup_flower.sh")
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    federation = Federation(rounds=10**6, clients_per_round=args.clients, local_steps={"epochs": 1},
                            batch_size=args.batch_size, aggregation="samples")
    ways: dict = {}
    problem = None
    for layout in args.layouts:
        problem = make_problem("vision", seed=0, data="femnist", path=args.path, model="emnist_cnn", clients=None,
                               partition="writers", layout=layout)
        ways[layout] = Simulation(problem, ALGORITHMS["fedavg"](problem, client_lr=args.lr), federation, seed=0,
                                  compile="off")
    assert problem is not None
    ways["plain"] = PlainLoop(problem, federation, seed=0, lr=args.lr)
    # the clients of the rounds every way runs: the same seed's draws
    sampler = Simulation(problem, ALGORITHMS["fedavg"](problem), federation, seed=0).sampler
    clients = [sampler.draw_round(None).clients.tolist() for _ in range(1 + args.blocks * args.rounds)]
    steps = [int(sum(-(-int(problem.client_sizes_cpu[k]) // args.batch_size) for k in round_)) for round_ in clients]
    print(f"FedAvg round of emnist_cnn ({problem.dim:,} parameters) on {args.path} ({problem.num_clients} writers), "
          f"S = {args.clients}, one epoch at b = {args.batch_size}, aggregation by samples; torch {torch.__version__}, "
          f"{args.threads} thread(s); {args.blocks} blocks of {args.rounds} rounds, ways in turn", flush=True)
    times: dict[str, list[float]] = {way: [] for way in ways}
    flower: list[float] = []
    with tempfile.TemporaryDirectory() as workdir:
        for block in range(args.blocks):
            for way, seconds in round_seconds(ways, 1, args.rounds, "cpu", warm_up=block == 0).items():
                times[way] += seconds
            if args.flower is not None:
                done = 1 + block * args.rounds
                got = flower_seconds(args.flower, femnist.resolve_path("sample10", args.path),
                                     clients[done: done + args.rounds], args, Path(workdir))
                flower += got["seconds"]
                peer = f"Flower {got['flwr']} (Ray {got['ray']})"
            print(f"block {block + 1}: " + ", ".join(f"{way} {statistics.median(values):.2f} s" for way, values in
                                                     times.items())
                  + (f", flower {statistics.median(flower):.2f} s" if flower else ""), flush=True)
    print(f"client steps a round (real minibatches): median {statistics.median(steps[1:])}, rounds' longest client "
          f"{max(max(-(-int(problem.client_sizes_cpu[k]) // args.batch_size) for k in r) for r in clients[1:])}")
    print(f"{'way':8} {'s/round':>8} {'ratio to plain':>15}")
    for way, values in times.items():
        print(f"{way:8} {statistics.median(values):8.3f} {paired_ratio(values, times['plain']):15.3f}")
    if flower:
        print(f"{'flower':8} {statistics.median(flower):8.3f} {paired_ratio(flower, times['plain']):15.3f}")
        for layout in args.layouts:
            print(f"{peer} / fedbench {layout}: {paired_ratio(flower, times[layout]):.2f}x a round "
                  f"(median over {len(flower)} paired rounds)")


if __name__ == "__main__":
    main()
