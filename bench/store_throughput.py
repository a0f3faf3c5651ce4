"""How fast the driver stores a sweep's runs: `writer.SweepLog` fed the events of N runs (start, then the end with
its curve) as fast as Ray would hand them over, against a new SQLite store, without Ray or any computing. Prints
runs/s and rows/s of the writer, and the time Ray took for the same runs where given (`--ray-seconds`), as a ratio:
the store keeps pace with Ray when writer seconds / Ray seconds is at most ~1.1 (issue 44: a 3,000-run sweep took
Ray 36.5 s and the store 310 s).
With `--sweep`, a real `fedbench sweep` of that many tiny runs on a local Ray instead: Ray's time (until Ray Tune
ended) against the sweep's (until the store holds every run), and their ratio.
Usage: python bench/store_throughput.py [--runs 300] [--rows 11] [--ray-seconds 36.5] [--sweep] [--tracking-uri URI]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's sweeps/ (installed: fedbench_sweeps)

from sweeps.driving import Outcome  # noqa: E402
from sweeps.recipe import parse  # noqa: E402
from sweeps.store import Store  # noqa: E402
from sweeps.sweep import sweep  # noqa: E402
from sweeps.writer import SweepLog  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rows", type=int, default=11, help="evaluated rows per run")
    parser.add_argument("--ray-seconds", type=float, default=None, help="Ray's own time for these runs, if known")
    parser.add_argument("--sweep", action="store_true", help="a real sweep on a local Ray, not the writer alone")
    parser.add_argument("--tracking-uri", default=None, help="an MLflow server (default: a new SQLite store)")
    args = parser.parse_args()
    recipe = parse({"name": f"throughput-{int(time.time())}", "seeds": args.runs, "max_runs": args.runs,
                    "problem": {"name": "lasso", "clients": 4, "samples_per_client": 10, "dim": 10, "support": 2},
                    "federation": {"rounds": 10 * (args.rows - 1), "clients_per_round": 2},
                    "algorithms": {"fedavg": {"client_lr": 0.01}}, "eval_every": 10}, "bench")
    if args.sweep:
        ray_done = {}

        def progress(event: str, counts: dict) -> None:  # Ray's pace: when its last run's end reached the driver
            if event == "update" and counts["finished"] + counts["diverged"] + counts["failed"] == args.runs:
                ray_done.setdefault("at", time.perf_counter())

        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            summary = sweep(recipe, tracking=args.tracking_uri or f"sqlite:///{folder}/mlflow.db", progress=progress)
            stored = time.perf_counter()
        ray_seconds, store_seconds = ray_done["at"] - start, stored - start
        print(f"{args.runs} runs: Ray ended the last after {ray_seconds:.1f} s, the store held them all after "
              f"{store_seconds:.1f} s: store / Ray {store_seconds / ray_seconds:.2f}x ({summary.counts})")
        return
    trials = recipe.trials()
    with tempfile.TemporaryDirectory() as folder:
        store = Store(args.tracking_uri or f"sqlite:///{folder}/mlflow.db")
        experiment = store.experiment(recipe.name)
        parent = store.open_sweep(experiment, recipe, [])
        log = SweepLog(store, experiment, parent)
        rows = [{"round": 10 * r, "objective": 1.0 / (1 + r), "comm_up": float(r)} for r in range(args.rows)]
        start = time.perf_counter()
        for key, trial in enumerate(trials):
            log.started(key, trial, time.time(), {"recipe_hash": recipe.recipe_hash})
            log.ended(key, asdict(Outcome(rows, "finished", "cpu", seconds=[0.01] * len(rows), wall_seconds=0.1)))
        errors = log.close()
        seconds = time.perf_counter() - start
    assert not errors, errors
    print(f"{args.runs} runs of {args.rows} rows stored in {seconds:.1f} s: {args.runs / seconds:.1f} runs/s, "
          f"{args.runs * args.rows / seconds:.0f} rows/s")
    if args.ray_seconds:
        print(f"store / Ray: {seconds / args.ray_seconds:.2f}x (pace kept at <= 1.1x)")


if __name__ == "__main__":
    main()
