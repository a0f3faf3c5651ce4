"""Local steps compiled with torch.compile (`fedbench.engine.compiling`) against eager, for the programs of the shipped
recipes, and the table `compile: auto` decides by.

For each shipped recipe (or those named) and each of its algorithms (default: its first; `--algorithms all`: every
one), the first program a sweep of the recipe plans for that algorithm (`fedbench.engine.planning.plan`: its first
configuration, the seeds that share one program, or a run alone) is built twice, one copy eager and one compiled, on
the device and with the PyTorch threads of one of the recipe's trials (`resources.cpus_per_trial`). Timed: the
seconds of a round (an iteration-wise program: a round's worth of iterations, per run), eager and compiled
alternately, `--repeats` times, the medians compared; and the compilation, from a fresh start (Inductor's caches
off): the compiled copy's first rounds less as many compiled rounds. Programs alike (the same problem configuration,
algorithm, hyperparameters, clients, batch size, local steps and runs) are measured once.

The machine is shared, so only the ratios mean anything (on the CPU, of CPU seconds: another process's load drops
out). `--write PATH` writes the table (`fedbench.engine.compiling.TABLE` is fedbench/engine/compile_table.json): its
rows of the device type measured, with the command that measured them, in place of those the file held (another device
type's are kept); `auto` compiles where rows of a program's problem, algorithm and device type, at about its size, say
that compiled steps win and the run is long enough to pay the compilation back. Usage: FEDBENCH_DATA=../shared/data
python bench/compile.py [--recipes papers/bao2022_lasso ...]
       [--algorithms all] [--repeats 5] [--device cpu] [--write fedbench/engine/compile_table.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from fedbench.engine.compiling import Measured, step_work
from fedbench.engine.planning import plan
from fedbench.engine.runs import IterationProgram, RoundProgram, programs
from fedbench.memory import keep_freed_memory
from sweeps import shipped
from sweeps.driving import build_planned
from sweeps.recipe import Trial, load

SAMPLE_SECONDS = 0.3  # about this long a timing (whole rounds), so that the clock's and the load's jitter average out
COMPILE_ROUNDS = 3  # the compiled copy's first rounds, which hold its compilations (its steps' Python ints change then)


def planned_programs(recipe, algorithms: str, slots: int) -> list[list[Trial]]:
    """The first program a sweep plans for each of the recipe's algorithms (`algorithms`: `first` or `all`)."""
    trials = recipe.trials()
    planned = plan(list(enumerate(trials)), recipe.resources.batch_runs, slots)
    wanted = list(recipe.algorithms)[:1] if algorithms == "first" else list(recipe.algorithms)
    chosen: dict[str, list[Trial]] = {}
    for program in [*planned.programs, *[[run] for run in sorted(planned.alone, key=lambda run: run[0])]]:
        runs = [trial for _, trial in program]
        if runs[0].algorithm in wanted and runs[0].algorithm not in chosen:
            chosen[runs[0].algorithm] = runs
    return [chosen[name] for name in wanted if name in chosen]


def case_key(runs: list[Trial]) -> str:
    first = runs[0]
    federation = dataclasses.replace(first.federation, rounds=0)
    return json.dumps([first.problem, first.problem_config, first.algorithm, first.hyperparameters,
                       dataclasses.asdict(federation), len(runs)], sort_keys=True, default=str)


def built(runs: list[Trial], device: str, mode: str) -> RoundProgram:
    """The first program of these runs' simulations (`fedbench.engine.runs.programs`), its steps eager or compiled
    (`mode`), for as many rounds as timing takes (never evaluated, but an iteration-wise program at every round end: it
    advances from one row to the next)."""
    long = [dataclasses.replace(trial, federation=dataclasses.replace(trial.federation, rounds=10**6),
                                eval_every=10**6, compile=mode) for trial in runs]
    sims = build_planned(long, device)
    program = programs(sims)[0][1]
    if isinstance(program, IterationProgram):
        for sim in program.sims:
            sim.eval_every = 1
    return program


class Clock:
    """Rounds of one program, timed: a round-wise program round by round (`run_round`), in the process's CPU seconds on
    the CPU (so that other processes' load on a shared machine drops out; a recipe's trial runs on one thread), in
    wall seconds to the device's end on a GPU; an iteration-wise one by its rows, its training seconds counted (wall
    seconds, not its evaluations)."""

    def __init__(self, program: RoundProgram, device: str):
        self.program, self.device = program, device
        self.rows = iter(program) if isinstance(program, IterationProgram) else None

    def seconds(self, rounds: int) -> float:
        """Seconds of the next `rounds` rounds."""
        program = self.program
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        if self.rows is not None:
            start, target = program.train_seconds, program.rounds_progress() + rounds
            while program.rounds_progress() < target:
                next(self.rows)
            return program.train_seconds - start
        clock = time.perf_counter if self.device.startswith("cuda") else time.process_time
        start = clock()
        for _ in range(rounds):
            program.run_round()
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        return clock() - start


def measure(recipe: str, runs: list[Trial], device: str, repeats: int) -> tuple[Measured, float]:
    """The row of the table for this program of the shipped `recipe`, and the largest relative difference of the two
    copies' server states after the same rounds."""
    torch._dynamo.reset()  # nothing compiled before (the frames beyond a graph break are the algorithm's own)
    eager, compiled = Clock(built(runs, device, "off"), device), Clock(built(runs, device, "on"), device)
    began = time.perf_counter()  # in wall seconds: Inductor compiles in worker processes
    compiled.seconds(COMPILE_ROUNDS)
    start = time.perf_counter() - began
    warm = eager.seconds(1)
    rounds = max(1, math.ceil(SAMPLE_SECONDS / warm))
    eager.seconds(COMPILE_ROUNDS - 1)  # both copies at the same round
    differences = [float((a - b).abs().max() / a.abs().max().clamp_min(1e-30))
                   for a, b in zip(eager.program.server.values(), compiled.program.server.values())]
    samples: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(repeats):
        samples["eager"].append(eager.seconds(rounds) / rounds)
        samples["compiled"].append(compiled.seconds(rounds) / rounds)
    eager_s, compiled_s = (statistics.median(samples[way]) for way in ("eager", "compiled"))
    first = compiled.program.sims[0]
    row = Measured(first.problem.name, first.algorithm.name, first.problem.device.type, len(compiled.program),
                   step_work(compiled.program.sims), first.federation.local_steps,
                   round(eager_s * 1e3, 4), round(compiled_s * 1e3, 4),
                   round(max(0.0, start - COMPILE_ROUNDS * compiled_s), 2), recipe)
    return row, max(differences, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=shipped.names(), help="shipped recipes' names or files")
    parser.add_argument("--algorithms", choices=("first", "all"), default="first")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timings per way; the medians compared")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--slots", type=int, default=2, help="trials a sweep runs at once (as the planner splits)")
    parser.add_argument("--write", type=Path, help="write the table here (fedbench/engine/compile_table.json)")
    args = parser.parse_args()
    # Every compilation from a fresh start, as a run's first on a machine: what `auto` must pay back
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    keep_freed_memory()
    torch.compile(torch.sin)(torch.ones(1))  # Inductor's start, once a process (a sweep's worker pays it once)
    print(f"eager / compiled local steps, device={args.device}, torch {torch.__version__}, "
          f"{platform.machine()} with {torch.get_num_threads()} threads available")
    print(f"{'recipe':32} {'algorithm':12} {'runs':>4} {'work':>9} {'eager ms':>10} {'compiled ms':>11} "
          f"{'ratio':>6} {'compile s':>9} {'rel. diff':>9}")
    rows, seen = [], set()
    for name in args.recipes:
        recipe = load(shipped.find(name) or name)
        recipe = dataclasses.replace(recipe, device=args.device)
        torch.set_num_threads(max(1, int(recipe.resources.cpus_per_trial)))
        for runs in planned_programs(recipe, args.algorithms, args.slots):
            key = case_key(runs)
            if key in seen:
                continue
            seen.add(key)
            try:
                row, difference = measure(shipped.name_of(name), runs, args.device, args.repeats)
            except Exception:  # a program that fails to compile is left out of the table: `auto` runs it eager
                print(f"{shipped.name_of(name):32} {runs[0].algorithm:12} failed:\n{traceback.format_exc(limit=-3)}")
                continue
            rows.append(row)
            print(f"{shipped.name_of(name):32} {row.algorithm:12} {row.runs:4} {row.work:9.2g} "
                  f"{row.eager_ms:10.3f} {row.compiled_ms:11.3f} {row.speedup:6.2f} {row.compile_s:9.1f} "
                  f"{difference:9.1e}", flush=True)
    if args.write:
        command = "python bench/compile.py " + shlex.join(sys.argv[1:])
        args.write.write_text(table_text(args.write, torch.device(args.device).type, command, rows))
        print(f"written to {args.write}")


def table_text(path: Path, device: str, command: str, rows: list[Measured]) -> str:
    """The table's file (JSON, one row a line) with these rows of the `device` type, the command that measured them,
    and the rows and commands of other device types that the file at `path` holds."""
    measured = {device: {"command": command, "torch": torch.__version__, "machine": (
        f"{platform.machine()}, {os.cpu_count()} cores; each program on its recipe's cpus_per_trial threads"
        if device == "cpu" else torch.cuda.get_device_name())}}
    if path.is_file():
        old = json.loads(path.read_text())
        measured = {**{k: v for k, v in old["measured"].items() if k != device}, **measured}
        rows = [Measured(**row) for row in old["rows"] if row["device"] != device] + rows
    lines = ",\n".join(json.dumps(dataclasses.asdict(row)) for row in rows)
    return json.dumps({"measured": measured})[:-1] + f', "rows": [\n{lines}\n]}}\n'


if __name__ == "__main__":
    main()
