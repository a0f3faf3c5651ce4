"""The trial side, in a Ray worker: a Ray trial runs its planned programs one after another (`run_programs`) and reports
each run's start, rows and end (`sweeps.events`). Two trainables: a sweep's pack of programs (`run_pack`) and a tuning
session's one run, scored for its scheduler (`run_tuned`)."""
from __future__ import annotations

import time
import traceback
from dataclasses import asdict
from typing import Any, Callable

import torch

from fedbench.memory import keep_freed_memory
from .checkpoints import Policy
from .driving import Outcome, build_planned, drive_batch, resolve_device
from .events import Reporter, RowStream, Score
from .recipe import Trial

Program = list[tuple[Any, Trial]]  # the runs of one planned program, (key, trial) each: one run, or several as one


def prepare_worker(cpus: float) -> None:
    """A Ray trial's process set up for runs: a PyTorch thread per reserved CPU, freed memory kept for reuse."""
    torch.set_num_threads(max(1, int(cpus)))
    keep_freed_memory()


def run_program(program: Program, send: Callable[[dict[str, Any]], None], checkpoints: Policy | None,
                gpu_ids: str, node: str, score: Score | None = None, report_rounds: tuple[float, ...] = ()) -> None:
    """One planned program's runs, built and driven here, each run's start, rows (`RowStream`) and end sent; a program
    that fails is recorded as its runs' failure (the trial goes on). With `checkpoints`, the program resumes from its
    checkpoint and saves them by the policy."""
    tags = {"node": node, "gpu_ids": gpu_ids, "runs_in_batch": str(len(program))}
    trials = [trial for _, trial in program]
    stream = RowStream(send, [key for key, _ in program], score, report_rounds)
    try:
        device = resolve_device(trials[0].device, bool(gpu_ids))
    except ValueError:  # no CUDA here: raised once the runs have started, which the driver then fails
        device = None
    for key, _ in program:
        stream.start(key, tags, device or trials[0].device)
    start = time.perf_counter()
    device = device or resolve_device(trials[0].device, bool(gpu_ids))
    try:
        outcomes = drive_batch(build_planned(trials, device), stream.add, checkpoints, trials, stream.tick,
                               on_model=stream.model)
    except Exception:  # failing runs are recorded and the pack goes on
        wall = (time.perf_counter() - start) / len(program)
        outcomes = [Outcome([], "failed", trial.device, wall_seconds=wall, error=traceback.format_exc(),
                            runs_in_batch=len(program)) for trial in trials]
    for j, outcome in enumerate(outcomes):
        stream.end(j, asdict(outcome))


def in_ray_trial(cpus: float) -> tuple[Reporter, str, str]:
    """A Ray trial's process prepared (`prepare_worker`): its reporter, its GPU ids and its node."""
    import ray
    from ray import tune

    prepare_worker(cpus)
    return (Reporter(tune.report), ",".join(map(str, ray.get_gpu_ids())),
            ray.get_runtime_context().get_node_id())


def run_pack(config: dict[str, Any], packs: list[list[Program]], checkpoints: Policy) -> None:
    """A sweep's function trainable: run one pack's programs one after another; each program resumes from its
    checkpoint and saves them by `checkpoints`."""
    send, gpu_ids, node = in_ray_trial(config["cpus"])
    try:
        for program in packs[config["pack"]]:
            run_program(program, send, checkpoints, gpu_ids, node)
    finally:
        send.close()


def run_tuned(config: dict[str, Any]) -> None:
    """A tuning session's function trainable: one run (a program of one), its events stamped with its score
    (`config["score"]`: metric, mode, objective) for the scheduler, its rows sent at each of the scheduler's rounds
    (`config["report_rounds"]`)."""
    send, gpu_ids, node = in_ray_trial(config["cpus"])
    try:
        run_program([(config["key"], config["trial"])], send, None, gpu_ids, node, Score(*config["score"]),
                    tuple(config["report_rounds"]))
    finally:
        send.close()
