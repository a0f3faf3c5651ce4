"""Local steps compiled with `torch.compile` where that wins: a run's `compile` mode, `on`, `off` or `auto`.

A program (`fedbench.engine.runs`) runs each local step as one call: the oracles of the step's minibatches (their rows
gathered) and the algorithm's `client_step`. Compiled, the call's tensor operations are traced into graphs whose
chains of elementwise operations Inductor fuses into a few loops, and the Python between them (the algorithm's, the
oracle's) no longer runs at each step. Whether that pays depends on the step. On one CPU thread (a sweep's trial), a
round of EMNIST-62's ℓ1-regularized logistic regression (p = 48,608, two batched matrix products and a dozen passes
over the clients' [S, p] state a step) took 1.35-1.54x less time compiled; a round of Bao et al.'s Lasso (p = 1024)
0.8-1.25x; FeDXL's pAUC steps, which break into several graphs (noise drawn on a run's own generator,
`torch.autograd.grad`), 0.44-1.35x. So `auto` compiles a program's steps where the table that `bench/compile.py`
measured on the shipped recipes' programs says they win (`auto_compiles`); `on` and `off` decide for every program.

Compiled steps give eager's results up to rounding (Inductor fuses and reorders floating-point operations: after 3
rounds, the table's programs' server states agree with eager's to 5e-15 relative in float64 and 2e-6 in float32;
`tests/engine/test_compiling.py`); `off` is the eager engine bit for bit. Each program compiles its own copy of its step
(`compiled`), at its first steps, and again where a step's shapes or a Python value it reads change (Fast-FedDA's
step index t once it changes, a run leaving the batch): that time is part of its training seconds.
"""
from __future__ import annotations

import functools
import json
import math
import statistics
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from fedbench.axes.registry import COMPILE_MODES

if TYPE_CHECKING:
    from fedbench.engine.record import RunRecord

MODES = COMPILE_MODES  # a recipe's `compile:` (`fedbench.axes.registry`)
TABLE = Path(__file__).with_name("compile_table.json")  # written by bench/compile.py (its `command` says how)
# A measured row speaks for programs whose local step is within this factor of its size (`step_work`); beyond,
# `auto` does not extrapolate and runs eager.
SIZE_REACH = 4.0
# The smallest measured speedup of a local step that `auto` compiles for: below, the gain is within the spread of the
# timings of programs alike on a shared machine (the same CIFAR-10 steps in four recipes: 1.15-1.18x; one Lasso step
# in two: 0.98x and 1.22x).
MIN_SPEEDUP = 1.2
# How many times over a program's remaining steps must save its compilation's seconds for `auto` to compile it: a
# compilation's time varies by half with the machine's load, so a run that would barely pay it back is left eager.
PAYBACK = 2.0


def check_mode(mode: str) -> None:
    """Refuse (ValueError) a mode that is not one of MODES."""
    if mode not in MODES:
        raise ValueError(f"compile: found {mode!r}, expected one of {', '.join(MODES)}")


@dataclass(frozen=True)
class Measured:
    """One row of the table: a program of `runs` runs of `algorithm` on `problem` on a `device` type, its local steps of
    size `work` (`step_work`), its rounds of `local_steps` steps timed eager and compiled (milliseconds a round: the
    process's CPU time on the CPU, wall time on a GPU), and the wall seconds its compilation took (nothing compiled or
    cached before), as `bench/compile.py` measured it on the shipped `recipe`."""
    problem: str
    algorithm: str
    device: str
    runs: int
    work: int
    local_steps: int
    eager_ms: float
    compiled_ms: float
    compile_s: float
    recipe: str = ""

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.compiled_ms

    def pays_back(self, steps: int) -> float:
        """How many times over the seconds compiling saves on `steps` local steps repay its compilation."""
        return steps * (self.eager_ms - self.compiled_ms) / self.local_steps / 1e3 / max(self.compile_s, 1e-3)


@functools.lru_cache(maxsize=1)
def table() -> tuple[Measured, ...]:
    """The rows of TABLE."""
    return tuple(Measured(**row) for row in json.loads(TABLE.read_text())["rows"])


def step_work(sims: list[RunRecord]) -> int:
    """The size of a program's local step: the multiply-adds of its minibatches against a model of the problem's
    dimension d, R·S·b·d over its R runs (a linear model's gradient; an MLP's is a small multiple), so that a step of
    more clients, rows or parameters is larger. (EMNIST-10 and -62 gather the same rows: their models differ 6x.)"""
    first = sims[0]
    clients = first.federation.clients_per_round or first.problem.num_clients
    return len(sims) * clients * sum(first.sampler.sizes.values()) * first.problem.dim


def nearest(problem: str, algorithm: str, device: str, work: int) -> list[Measured]:
    """The measured rows of this problem, algorithm and device type nearest a program's `work` (`step_work`), within
    SIZE_REACH of it: the nearest, and every other of about its size (within 10%: programs alike, measured in
    several recipes)."""
    rows = [row for row in table() if (row.problem, row.algorithm, row.device) == (problem, algorithm, device)]
    distance = lambda row: abs(math.log(row.work / work))  # noqa: E731
    best = min(map(distance, rows), default=math.inf)
    if best > math.log(SIZE_REACH):
        return []
    return [row for row in rows if distance(row) <= best + math.log(1.1)]


def auto_compiles(sims: list[RunRecord]) -> bool:
    """Whether `auto` compiles the local steps of a program of these runs: where the table holds rows of their problem,
    algorithm and device type at about their size (`nearest`) whose compiled steps were MIN_SPEEDUP times faster and
    whose compilation the runs' remaining local steps pay back PAYBACK times over (the medians of those rows)."""
    first = sims[0]
    rows = nearest(first.problem.name, first.algorithm.name, first.problem.device.type, step_work(sims))
    steps = (first.federation.rounds - first.rounds_done) * first.federation.most_steps(first.problem.client_sizes_cpu)
    return bool(rows) and (statistics.median(row.speedup for row in rows) >= MIN_SPEEDUP
                           and statistics.median(row.pays_back(steps) for row in rows) >= PAYBACK)


def compiles(sims: list[RunRecord]) -> bool:
    """Whether a program of these runs compiles its local steps, by their mode (`RunRecord.compile`)."""
    mode = sims[0].compile
    return mode == "on" or (mode == "auto" and auto_compiles(sims))


def compiled(method: Callable) -> Callable:
    """A bound method compiled by torch.compile, as a copy with a code object of its own: torch.compile keeps its
    graphs per code object and counts their recompilations against `torch._dynamo.config.recompile_limit`, beyond
    which it runs eager, so that each program (the method's object) compiles for itself, whatever programs of the
    same algorithm ran before in the process (a sweep's worker runs many one after another). Beyond a graph break (a
    branch on a tensor's value, as the constrained prox's test of its ball) the rest of a step runs in the
    algorithm's own functions, whose graphs every program shares."""
    function = method.__func__  # type: ignore[attr-defined]  # a bound method
    own = types.FunctionType(function.__code__.replace(), function.__globals__, function.__name__,
                             function.__defaults__, function.__closure__)
    return torch.compile(types.MethodType(own, method.__self__))  # type: ignore[attr-defined]
