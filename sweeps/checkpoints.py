"""Mid-run checkpoints: a program's whole state (`fedbench.engine.runs.RoundProgram.state_dict`: its state, each run's
record with its random streams' states, the schedule's own) and the rows it has yielded, saved every `every_seconds` of
running or `every_rounds` rounds, whichever comes first, at a safe point between two rounds.

A checkpoint belongs to one program, named by its runs, (config hash, seed) each: a sweep run again resumes the
program from it (the planner keeps a checkpointed program's runs together, `saved_programs`), and the rest of its
curve is bit for bit the never-stopped one's (`tests/sweeps/test_checkpoints.py`). A program that ends removes its file.
Files are written whole and renamed into place, so a kill leaves the previous checkpoint or the new one, never half
of one. They live in `checkpoints/<experiment>/` beside the tracking store (`Store.folder`); on a cluster, that
folder must be one the nodes share, else a run resumes only on the node that saved it.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedbench.engine.runs import RoundProgram
from .recipe import Recipe, Trial, stable_hash


@dataclass(frozen=True)
class Policy:
    """Where and how often the programs of a sweep (or of `fedbench run`) save checkpoints; `folder` None: never."""
    folder: str | None
    every_seconds: float = 60.0  # 0: not by time
    every_rounds: int = 0  # 0: not by rounds

    @property
    def active(self) -> bool:
        return self.folder is not None and (self.every_seconds > 0 or self.every_rounds > 0)


def policy_of(recipe: Recipe, tracking: str | None) -> Policy:
    """The recipe's checkpoints block, with its files in `checkpoints/<experiment>/` beside the store of the
    tracking URI `tracking` (`database.store_folder`)."""
    from .database import store_folder  # MLflow, imported by the commands that track only

    folder = store_folder(tracking) / "checkpoints" / recipe.name.replace("/", "_")
    return Policy(str(folder), recipe.checkpoints.every_seconds, recipe.checkpoints.every_rounds)


def runs_of(trials: list[Trial]) -> list[list]:
    return [[trial.config_hash, trial.seed] for trial in trials]


def _indexes(folder: str | Path | None) -> list[tuple[Path, list[tuple[str, int]], int | None]]:
    """Every checkpoint index in `folder`: its path, its program's runs ((config hash, seed) each) and the round it
    had reached (None where the index predates the count)."""
    if folder is None or not Path(folder).is_dir():
        return []
    found = []
    for index in sorted(Path(folder).glob("*.json")):
        try:
            saved = json.loads(index.read_text())
            found.append((index, [(config_hash, int(seed)) for config_hash, seed in saved["runs"]],
                          saved.get("rounds")))
        except (ValueError, KeyError, OSError):  # a file being replaced, or not ours
            continue
    return found


def saved_programs(folder: str | Path | None) -> list[list[tuple[str, int]]]:
    """The runs of every program with a checkpoint in `folder`, (config hash, seed) each."""
    return [runs for _, runs, _ in _indexes(folder)]


def interrupted(policy: Policy, trials: list[Trial]) -> list[tuple[Path, int | None]]:
    """The checkpoints in `policy`'s folder of programs that hold any of `trials`' runs, with the round each had
    reached (None where its index predates the count): what an interrupted `fedbench run` of them left."""
    if not policy.active:
        return []
    ours = {(config_hash, seed) for config_hash, seed in runs_of(trials)}
    return [(index.with_suffix(".pt"), rounds) for index, runs, rounds in _indexes(policy.folder)
            if ours.intersection(runs) and index.with_suffix(".pt").is_file()]


class Checkpoint:
    """The checkpoint of one program of `trials` (its runs, in the program's order) under `policy`."""

    def __init__(self, policy: Policy, trials: list[Trial]):
        self.policy = policy
        runs = runs_of(trials)
        name = stable_hash(runs)
        self.runs = runs
        self.path = Path(policy.folder) / f"{name}.pt" if policy.folder else None
        self.index = self.path.with_suffix(".json") if self.path else None
        self._mark(0)

    def restore(self, program: RoundProgram) -> dict[str, list] | None:
        """The program as its checkpoint left it, and the rows and training seconds by row it had yielded then
        (`{"rows": [...], "seconds": [...]}`, one list per run); None without a checkpoint."""
        if self.path is None or not self.path.is_file():
            return None
        saved = torch.load(self.path, map_location=program.device, weights_only=True)
        if saved["runs"] != self.runs:
            return None
        program.load_state_dict(saved["program"])
        self._mark(program.rounds_progress())
        return {"rows": saved["rows"], "seconds": saved["seconds"]}

    def _mark(self, rounds: int) -> None:
        """The next checkpoint is due at these moments (infinite: not by that measure)."""
        policy = self.policy
        self.due_time = time.monotonic() + policy.every_seconds if policy.every_seconds > 0 else math.inf
        self.due_round = rounds + policy.every_rounds if policy.every_rounds > 0 else math.inf

    def due(self, program: RoundProgram) -> bool:
        """Whether a checkpoint is due (asked between every two rounds: one clock reading)."""
        return time.monotonic() >= self.due_time or (self.due_round < math.inf
                                                     and program.rounds_progress() >= self.due_round)

    def save(self, program: RoundProgram, rows: list[list[dict[str, float]]], seconds: list[list[float]]) -> None:
        """The program's state and rows so far, written whole then renamed over the previous checkpoint."""
        assert self.path is not None and self.index is not None  # saved only under a policy with a folder
        self.path.parent.mkdir(parents=True, exist_ok=True)
        index = {"runs": self.runs, "rounds": program.rounds_progress()}
        _replace(self.index, lambda f: f.write(json.dumps(index).encode()))
        state: dict[str, Any] = {"runs": self.runs, "program": program.state_dict(), "rows": rows,
                                 "seconds": seconds}
        _replace(self.path, lambda f: torch.save(state, f))
        self._mark(program.rounds_progress())

    def remove(self) -> None:
        for path in (self.path, self.index):
            if path is not None:
                path.unlink(missing_ok=True)


def _replace(path: Path, write) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    with open(partial, "wb") as f:
        write(f)
    os.replace(partial, path)
