"""Mid-run checkpoints of the engine's programs (`RunBatch.state_dict`, `IterationBatch.state_dict`): a program
stopped at a safe point and rebuilt from its saved state (through `torch.save`, as a checkpoint file holds it)
yields the rest of its rows bit for bit as the program that never stopped, for every algorithm's batch of seeds and
for a run alone."""
from __future__ import annotations

import io

import pytest
import torch

import fedbench
from fedbench.runs import programs
from fedbench.simulate import Simulation
from test_runs import CASES, SEEDS


class Stop(Exception):
    """The kill: raised from the safe point after the checkpoint was taken."""


def build(problem, name, federation, hp, seeds):
    sims = [Simulation(problem, fedbench.make_algorithm(name, problem, **hp), federation, seed, 3) for seed in seeds]
    [(runs, program)] = programs(sims)  # one program for the batch (or the run alone)
    return program


def rows_of(program, rows=None):
    rows = rows if rows is not None else [[] for _ in program.sims]
    for i, row in program:
        rows[i].append(row)
    return rows


def interrupted(make_program, at: int):
    """The rows of a program stopped at its `at`-th safe point, then resumed from the checkpoint taken there by a
    program built anew."""
    program, rows, saved, count = make_program(), None, io.BytesIO(), [0]

    def safe_point(program):
        count[0] += 1
        if count[0] == at:
            torch.save({"program": program.state_dict(), "rows": rows}, saved)
            raise Stop

    rows = [[] for _ in program.sims]
    program.safe_point = safe_point
    with pytest.raises(Stop):
        rows_of(program, rows)
    saved.seek(0)
    checkpoint = torch.load(saved, weights_only=False)
    again = make_program()
    again.load_state_dict(checkpoint["program"])
    return rows_of(again, checkpoint["rows"]), [sim.status for sim in again.sims]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_resumed_batch_gives_the_rows_of_one_never_stopped(name):
    make, federation, hp, _ = CASES[name]
    problem, algorithm = make(), name.partition(":")[0]
    whole, points = build(problem, algorithm, federation, hp, SEEDS), [0]
    whole.safe_point = lambda program: points.__setitem__(0, points[0] + 1)
    expected = rows_of(whole)
    for at in (1, points[0] // 2 + 1):  # after the first round (iteration), and midway (runs may diverge early)
        resumed, statuses = interrupted(lambda: build(problem, algorithm, federation, hp, SEEDS), at)
        assert resumed == expected
        assert statuses == [sim.status for sim in whole.sims]


@pytest.mark.parametrize("name", ["fedmid", "ascd_pfl", "fedxl2"])
def test_a_resumed_run_alone_gives_its_rows(name):
    make, federation, hp, _ = CASES[name]
    problem, algorithm = make(), name.partition(":")[0]
    expected = rows_of(build(problem, algorithm, federation, hp, [3]))
    resumed, _ = interrupted(lambda: build(problem, algorithm, federation, hp, [3]), 4)
    assert resumed == expected
