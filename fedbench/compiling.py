"""Local steps compiled with `torch.compile` where that wins: a run's `compile` mode, `on`, `off` or `auto`.

A program (`fedbench.runs`) runs each local step as one call: the oracles of the step's minibatches (their rows
gathered) and the algorithm's `client_step`. Compiled, the call's tensor operations are traced into graphs whose
chains of elementwise operations Inductor fuses into a few loops, and the Python between them (the algorithm's, the
oracle's) no longer runs at each step. Whether that pays depends on the
step: on 2 CPU cores an EMNIST-62 step of ℓ1-logistic regression (p = 48,608) ran 1.5-6x faster compiled, a
Lasso step (p = 1024, two small matrix products) slower. So `auto` compiles a program's steps where the table
`bench/compile.py` measured says they win (`auto_compiles`), and `on` and `off` decide for every program.

Compiled steps give eager's results up to rounding (Inductor fuses and reorders the floating-point operations:
~1e-6 relative per step in float32, ~1e-15 in float64; `tests/test_compiling.py`); `off` is the eager engine bit for
bit. Each program compiles its own copy of its step (`compiled`), once, at its first steps (and again where a
step's shapes or a Python value it reads change, e.g. a run leaving the batch): that time is part of its training
seconds.
"""
from __future__ import annotations

import functools
import json
import math
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from fedbench.planning import step_bytes

if TYPE_CHECKING:
    from fedbench.simulate import Simulation

MODES = ("auto", "on", "off")
TABLE = Path(__file__).with_name("compile_table.json")  # written by bench/compile.py (its `command` says how)
# A measured row speaks for programs whose local step gathers within this factor of its bytes (`step_bytes` of all
# its runs); beyond, `auto` does not extrapolate and runs eager.
SIZE_REACH = 4.0
# The smallest measured speedup of a local step that `auto` compiles for: below, the gain is within the spread of
# repeated timings on a shared machine (±5-10% here).
MIN_SPEEDUP = 1.2


def check_mode(mode: str) -> None:
    """Refuse (ValueError) a mode that is not one of MODES."""
    if mode not in MODES:
        raise ValueError(f"compile: found {mode!r}, expected one of {', '.join(MODES)}")


@dataclass(frozen=True)
class Measured:
    """One row of the table: a program of `runs` runs of `algorithm` on `problem` on a `device` type, whose local steps
    gather `step_bytes` (all its runs'), timed by round (`local_steps` steps) eager and compiled, and the seconds its
    compilation took (a fresh process, nothing cached), as measured on the shipped `recipe`."""
    problem: str
    algorithm: str
    device: str
    runs: int
    step_bytes: int
    local_steps: int
    eager_ms: float
    compiled_ms: float
    compile_s: float
    recipe: str = ""

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.compiled_ms

    def seconds_saved(self, steps: int) -> float:
        """What compiling saves over `steps` local steps, net of the compilation."""
        return steps * (self.eager_ms - self.compiled_ms) / self.local_steps / 1e3 - self.compile_s


@functools.lru_cache(maxsize=1)
def table() -> tuple[Measured, ...]:
    """The rows of TABLE."""
    return tuple(Measured(**row) for row in json.loads(TABLE.read_text())["rows"])


def nearest(problem: str, algorithm: str, device: str, size: int) -> Measured | None:
    """The measured row of this problem, algorithm and device type nearest `size` (a program's `step_bytes`), within
    SIZE_REACH of it (None: none)."""
    rows = [row for row in table() if (row.problem, row.algorithm, row.device) == (problem, algorithm, device)]
    distance = lambda row: abs(math.log(row.step_bytes / size))  # noqa: E731
    best = min(rows, key=distance, default=None)
    return best if best is not None and distance(best) <= math.log(SIZE_REACH) else None


def auto_compiles(sims: list[Simulation]) -> bool:
    """Whether `auto` compiles the local steps of a program of these runs: where the table holds a row of their problem,
    algorithm and device type at about their size (`nearest`), whose compiled step was at least MIN_SPEEDUP times
    faster, and whose compilation their remaining local steps pay back."""
    first = sims[0]
    size = step_bytes(first) * len(sims)
    row = nearest(first.problem.name, first.algorithm.name, first.problem.device.type, size)
    steps = (first.federation.rounds - first.rounds_done) * first.federation.local_steps
    return row is not None and row.speedup >= MIN_SPEEDUP and row.seconds_saved(steps) > 0


def compiles(sims: list[Simulation]) -> bool:
    """Whether a program of these runs compiles its local steps, by their mode (`Simulation.compile`)."""
    mode = sims[0].compile
    return mode == "on" or (mode == "auto" and auto_compiles(sims))


def compiled(method: Callable) -> Callable:
    """A bound method compiled by torch.compile, as a copy with a code object of its own: torch.compile keeps its
    graphs per code object and counts their recompilations against `torch._dynamo.config.recompile_limit`, beyond
    which it runs eager, so that each program (the method's object) compiles for itself, whatever programs of the
    same algorithm ran before in the process (a sweep's worker runs many one after another)."""
    function = method.__func__  # type: ignore[attr-defined]  # a bound method
    own = types.FunctionType(function.__code__.replace(), function.__globals__, function.__name__,
                             function.__defaults__, function.__closure__)
    return torch.compile(types.MethodType(own, method.__self__))  # type: ignore[attr-defined]
