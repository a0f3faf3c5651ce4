"""A FedAvg round of a deep network in each layout (`fedbench.networks.module_model`: `vmap`, `loop`) against the floor,
a plain `torch.nn` + `torch.optim.SGD` loop over the same clients: the table `layout: auto` reads.

For each model, data set and batch size b: the `vision` problem on a random subset of the data's training pool
(`--train-size` images split IID over 100 clients), S = `--clients` clients a round, `--steps` local steps of b
images, client_lr 0.05. Each layout runs the engine's rounds (`Simulation.run_round`: draws, gathers, the clients'
steps as one program, the server update); the floor runs the same rounds' draws one client after another, each
client an `nn.Module` loaded with the server model and trained by `torch.optim.SGD` on its gathered batches, the
uploads averaged. Rounds are timed in turn (interleaved repeats, medians: the machine is shared) and printed as
milliseconds and as ratios to the floor measured in the same run.

`--write PATH` writes the table (`fedbench.networks.module_model.TABLE` is fedbench/networks/deep_layouts.json): its
rows of the device type measured, with the command that measured them, in place of those the file held (another device
type's rows are kept). No GPU was lent where the shipped table was measured: its GPU rows are empty, so `auto` picks
`module_model.DEFAULT_LAYOUT` (vmap) on CUDA until `--device cuda` fills them (bench/gpu_session.sh).

Usage: OMP_NUM_THREADS=1 FEDBENCH_DATA=... python bench/deep_layouts.py [--device cpu] [--repeats 5]
       [--batch-sizes 20 50] [--write fedbench/networks/deep_layouts.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from fedbench.algorithms import ALGORITHMS
from fedbench.engine.federation import aggregation_weights
from fedbench.engine.simulate import Federation, Simulation
from fedbench.memory import keep_freed_memory
from fedbench.networks.module_model import LAYOUTS
from fedbench.problems import make_problem

sys.path.insert(0, str(Path(__file__).parent))
from round_timing import median_round_seconds  # noqa: E402

CASES = {"cnn-fashion_mnist": ("cnn", "fashion_mnist"), "cnn-cifar10": ("cnn", "cifar10"),
         "emnist_cnn-femnist": ("emnist_cnn", "femnist")}  # (model, data) by case name: Reddi et al.'s EMNIST CNN
LR = 0.05


class PlainLoop:
    """The floor: the rounds of a FedAvg run drawn as the engine draws them, each client an `nn.Module` (in training
    mode: dropout on) trained by `torch.optim.SGD` at `lr` on its real rows of each step (a short batch's padding
    left out, a step past its epoch skipped), one client after another; the uploads averaged with the federation's
    aggregation weights."""

    def __init__(self, problem, federation: Federation, seed: int, lr: float = LR):
        self.problem, self.federation, self.lr = problem, federation, lr
        self.sampler = Simulation(problem, ALGORITHMS["fedavg"](problem), federation, seed).sampler
        self.net = problem.model.factory().to(problem.device)
        self.w = problem.init_params(torch.Generator().manual_seed(seed))

    def run_round(self) -> None:
        draw = self.sampler.draw_round(None if self.federation.uneven else self.federation.local_steps)
        weights = aggregation_weights(self.problem, self.federation, draw.clients[None], self.w.dtype)[0]
        uploads = []
        for k in range(len(draw.clients)):
            vector_to_parameters(self.w, self.net.parameters())
            optimizer = torch.optim.SGD(self.net.parameters(), lr=self.lr)
            for rows in draw.rows["D"][:, k]:
                rows = rows[rows >= 0]
                if not len(rows):
                    continue
                optimizer.zero_grad()
                x = self.problem._features(self.problem.x_train[rows])
                F.cross_entropy(self.net(x), self.problem.y_train[rows]).backward()
                optimizer.step()
            uploads.append(parameters_to_vector(self.net.parameters()).detach())
        self.w = weights @ torch.stack(uploads)


def measure(model: str, data: str, batch: int, args) -> dict:
    federation = Federation(rounds=10**6, clients_per_round=args.clients, local_steps=args.steps, batch_size=batch)
    ways: dict = {}
    problem = None
    for layout in LAYOUTS:
        sizes = ({"partition": "writers"} if data == "femnist" else
                 {"partition": "iid", "train_size": args.train_size, "test_size": 100})
        problem = make_problem("vision", seed=0, device=args.device, data=data, model=model, clients=100,
                               layout=layout, **sizes)
        ways[layout] = Simulation(problem, ALGORITHMS["fedavg"](problem, client_lr=LR), federation, seed=0,
                                  compile="off")
    assert problem is not None
    ways["plain"] = PlainLoop(problem, federation, seed=0)
    ms = {way: seconds * 1e3 for way, seconds in
          median_round_seconds(ways, args.rounds, args.repeats, args.device).items()}
    return {"model": model, "data": data, "dim": problem.dim, "device": torch.device(args.device).type,
            "batch_size": batch, "clients": args.clients, "local_steps": args.steps, "threads": torch.get_num_threads(),
            "ms": {name: round(value, 2) for name, value in ms.items()},
            "ratios": {layout: round(ms[layout] / ms["plain"], 3) for layout in LAYOUTS}}


def table_text(path: Path, device: str, command: str, rows: list[dict]) -> str:
    """The table's file (JSON, one row a line) with these rows of the `device` type and the command that measured them,
    and the rows the file at `path` holds of other cases (model, data, device type, batch size, clients) and their
    commands."""
    measured = {device: [{"command": command, "torch": torch.__version__, "machine": (
        f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads" if device == "cpu"
        else torch.cuda.get_device_name())}]}
    if path.is_file():
        old = json.loads(path.read_text())
        measured = {**old["measured"], device: old["measured"].get(device, []) + measured[device]}
        case = lambda row: (row["model"], row["data"], row["device"], row["batch_size"], row["clients"])  # noqa: E731
        rows = [row for row in old["rows"] if case(row) not in set(map(case, rows))] + rows
    if not any(row["device"] == "cuda" for row in rows):
        measured["cuda"] = [{"note": "no GPU was lent where this table was measured: no cuda rows (auto picks vmap)"}]
    lines = ",\n".join(json.dumps(row) for row in rows)
    return json.dumps({"measured": measured})[:-1] + f', "rows": [\n{lines}\n]}}\n'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES)[:2])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[20, 50])
    parser.add_argument("--clients", type=int, default=10, help="S, clients a round")
    parser.add_argument("--steps", type=int, default=5, help="local steps a round")
    parser.add_argument("--train-size", type=int, default=5000, help="training images kept (split over 100 clients)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per timing")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timings per way; the medians compared")
    parser.add_argument("--write", type=Path, help="write the table here (fedbench/networks/deep_layouts.json)")
    args = parser.parse_args()
    keep_freed_memory()
    print(f"FedAvg round, S = {args.clients}, {args.steps} local steps, device={args.device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms (median of {args.repeats}) and ratio to "
          "the plain torch.nn loop")
    print(f"{'model':8} {'data':14} {'dim':>8} {'b':>4} {'plain ms':>9} "
          + " ".join(f"{layout + ' ms':>9} {'ratio':>6}" for layout in LAYOUTS))
    rows = []
    for model, data in map(CASES.__getitem__, args.cases):
        for batch in args.batch_sizes:
            row = measure(model, data, batch, args)
            rows.append(row)
            print(f"{model:8} {data:14} {row['dim']:8} {batch:4} {row['ms']['plain']:9.1f} "
                  + " ".join(f"{row['ms'][layout]:9.1f} {row['ratios'][layout]:6.2f}" for layout in LAYOUTS),
                  flush=True)
    if args.write:
        command = "python bench/deep_layouts.py " + shlex.join(sys.argv[1:])
        args.write.write_text(table_text(args.write, torch.device(args.device).type, command, rows))
        print(f"written to {args.write}")


if __name__ == "__main__":
    main()
