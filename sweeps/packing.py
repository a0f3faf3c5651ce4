"""A sweep's runs packed into Ray trials. Ray Tune costs ~0.35 s per trial even with actors reused, as long as a small
federated run, so the runs that the planner (`fedbench.engine.planning.plan`) leaves alone are packed into Ray trials of
one algorithm each (`resources.pack`, by default enough packs to keep every slot busy about PACKS_PER_SLOT times over),
and each program it plans (at most `resources.batch_runs` runs) is a Ray trial of its own."""
from __future__ import annotations

import math
from typing import Sequence

from fedbench.engine.planning import plan
from .recipe import Trial
from .worker import Program

PACKS_PER_SLOT = 4


def plan_packs(runs: list[tuple[int, Trial]], pack: int | str, slot_count: int, batch_runs: int = 1,
               saved: Sequence[list[tuple[str, int]]] = ()) -> list[list[Program]]:
    """Ray trials, each a list of programs: every planned program its own; the runs alone in chunks of one algorithm
    each, `auto` making about PACKS_PER_SLOT packs per slot. The chunks are submitted longest first (the remainders of
    each algorithm's runs last), so that short packs fill the slots at the end instead of one long pack running alone
    there: on bao2022_lowrank.yaml (15 runs of ~20 s, packs of 2 and 1) ~176 s instead of ~182 s of runs on 2 slots."""
    programs, alone = plan(runs, batch_runs, slot_count, saved)
    size = int(pack) if pack != "auto" else max(1, math.ceil(len(alone) / (PACKS_PER_SLOT * slot_count)))
    by_algorithm: dict[str, list[tuple[int, Trial]]] = {}
    for key, trial in alone:
        by_algorithm.setdefault(trial.algorithm, []).append((key, trial))
    chunks = [[[run] for run in group[i:i + size]]
              for group in by_algorithm.values() for i in range(0, len(group), size)]
    return [[program] for program in programs] + sorted(chunks, key=len, reverse=True)
