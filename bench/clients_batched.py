"""Clients as a batch dimension: one FedMiD round on the federated Lasso design of Bao, Crawshaw, Luo, Liu (ICML 2022,
§4, Fig. 1: p = 1024, b = 10, E = 10) timed four ways in the same run, at S = 10 and S = 100 sampled clients:

  engine     `Simulation.run_round` (sampling, minibatch draws, gathers, E batched steps, server prox,
             communication accounting);
  loop       the same round with a Python loop over clients (`tests/loop_reference.py`), as the papers'
             scripts and most FL frameworks run it;
  floor      the bare kernel: for each step only the minibatch gather, the two batched matrix-vector
             products and the soft-threshold, on pre-drawn indices — nothing else. Each round gathers the rows
             of another round's draws (a cycle of DRAWN_ROUNDS), as the engine's rounds do: rows gathered again
             and again would be read from the cache (at S = 10 the floor then took ~25% less);
  draws      the round's random draws alone (`RoundSampler.draw`: clients, and the minibatch rows as the b largest
             of uniform keys), which every recorded curve was made with and which the floor leaves out.

Prints `loop/engine` (the batching speed-up), `engine/floor` (the engine's own overhead) and
`(engine-draws)/floor` (the same without the draws, which no arithmetic change can shorten: they are the runs'
random streams). Times are medians over interleaved repetitions; the machine is shared, so only the ratios mean
anything.
Freed memory stays in the process (`fedbench.memory.keep_freed_memory`, as in every fedbench run): otherwise a
step's fresh 8 MB gather output may be faulted in anew at every step, in some processes and not others.
Usage: python bench/clients_batched.py [--device cuda] [--rounds 20] [--repeats 5]
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch

import fedbench
from fedbench.engine.simulate import Federation, Simulation
from fedbench.memory import keep_freed_memory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the loop implementation is a test oracle
from loop_reference import loop_round  # noqa: E402

CLIENT_LR, LAM = 1e-3, 0.03125
DRAWN_ROUNDS = 32  # rounds of draws the floor cycles through: 8 MB of rows each at S = 10, the whole design twice


def floor_round(features, labels, rows, u, lr, threshold):
    s, b = rows.shape[1], rows.shape[2]
    for step_rows in rows:
        flat = step_rows.reshape(-1)
        x = features.index_select(0, flat).view(s, b, -1)
        y = labels[flat].view(s, b)
        residual = torch.bmm(u.unsqueeze(1), x.transpose(1, 2)).squeeze(1) - y
        u = u - lr * torch.bmm(residual.unsqueeze(1), x).squeeze(1) / b
        u = u - u.clamp(-threshold, threshold)
    return u


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, rounds, device):
    sync(device)
    start = time.perf_counter()
    for _ in range(rounds):
        fn()
    sync(device)
    return (time.perf_counter() - start) / rounds


def bench(clients_per_round: int, device: str, rounds: int, repeats: int) -> dict[str, float]:
    # 128 clients so that S = 100 is possible; otherwise Bao et al.'s Fig. 1 design (64 x 128 at paper size).
    problem = fedbench.make_problem("lasso", seed=0, device=device, clients=128)
    federation = Federation(10**6, clients_per_round, 10, 10)
    sim = Simulation(problem, fedbench.make_algorithm("fedmid", problem, client_lr=CLIENT_LR), federation, seed=0)
    hp = {"client_lr": CLIENT_LR}
    state = {"w": sim.server["w"].clone(), "r": 0}

    def loop():
        clients, rows = sim.sampler.draw(federation.local_steps)
        rows = rows["D"]
        state["w"] = loop_round("fedmid", problem, state["w"], clients, rows, state["r"], hp)
        state["r"] += 1

    drawn = [sim.sampler.draw(federation.local_steps)[1]["D"] for _ in range(DRAWN_ROUNDS)]
    u0 = sim.server["w"].expand(clients_per_round, -1).clone()
    floor_rounds = itertools.cycle(drawn)

    def floor():
        floor_round(problem.features, problem.labels, next(floor_rounds), u0, CLIENT_LR, CLIENT_LR * LAM)

    def draws():
        sim.sampler.draw(federation.local_steps)

    ways = {"engine": sim.run_round, "loop": loop, "floor": floor, "draws": draws}
    for fn in ways.values():
        timed(fn, 2, device)  # warm-up
    samples = {name: [] for name in ways}
    for _ in range(repeats):
        for name, fn in ways.items():
            samples[name].append(timed(fn, rounds, device))
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    keep_freed_memory()  # as every fedbench run does
    print(f"one FedMiD round, lasso p=1024 b=10 E=10, device={args.device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    for s in (10, 100):
        t = bench(s, args.device, args.rounds, args.repeats)
        print(f"S={s:<4d} loop/engine {t['loop'] / t['engine']:.1f}x   engine/floor {t['engine'] / t['floor']:.2f}x   "
              f"(engine-draws)/floor {(t['engine'] - t['draws']) / t['floor']:.2f}x   "
              f"(per round: engine {t['engine'] * 1e3:.2f} ms, loop {t['loop'] * 1e3:.2f} ms, "
              f"floor {t['floor'] * 1e3:.2f} ms, draws {t['draws'] * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
