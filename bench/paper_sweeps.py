"""Whole paper sweeps through `fedbench sweep` end to end (Ray start, every run, MLflow logging, the report), each
in a fresh working directory with its own SQLite store:

  bao2022    recipes/papers/bao2022_lasso.yaml + bao2022_lowrank.yaml (5 methods × 3 seeds each, full rounds), as
             one command, `fedbench sweep bao2022_lasso.yaml bao2022_lowrank.yaml` (one Ray for both);
  s1         recipes/papers/hanzely2023_s1.yaml at σ_h = 1.0 (5 methods × 30 repetitions, metrics every round).

With `--compare`, each sweep runs a second time with `resources.batch_runs=1` (every run alone, as before the run
axis) and the ratio of the two wall times is printed: the machine is shared, so that ratio, measured in the same
run, is what to read; the absolute seconds are for the record.
Usage: FEDBENCH_DATA=../shared/data python bench/paper_sweeps.py [--only bao2022 s1] [--compare] [--set k=v ...]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAPERS = ROOT / "recipes" / "papers"
SWEEPS = {  # name: (recipes, overrides), run as one `fedbench sweep` command (several recipes share one Ray)
    "bao2022": ([PAPERS / "bao2022_lasso.yaml", PAPERS / "bao2022_lowrank.yaml"], []),
    "s1": ([PAPERS / "hanzely2023_s1.yaml"], ["problem.sigma_h=1.0"]),
}


def timed_sweep(recipes: list[Path], sets: list[str]) -> float:
    """Wall seconds of one `fedbench sweep` command on the recipes, in a fresh directory."""
    with tempfile.TemporaryDirectory(prefix="fedbench-paper-sweep-") as workdir:
        start = time.perf_counter()
        command = [sys.executable, str(ROOT / "cli.py"), "sweep", *map(str, recipes), "--tracking-uri",
                   f"sqlite:///{workdir}/mlflow.db"]
        for item in sets:
            command += ["--set", item]
        done = subprocess.run(command, cwd=workdir, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(r.name for r in recipes)} failed:\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-3000:]}")
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=list(SWEEPS), choices=list(SWEEPS))
    parser.add_argument("--compare", action="store_true", help="also run every run alone (batch_runs=1)")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="an override for every recipe")
    args = parser.parse_args()
    for name in args.only:
        recipes, sets = SWEEPS[name]
        batched = timed_sweep(recipes, sets + args.sets)
        line = f"{name:8s} fedbench sweep, report included: {batched:7.1f} s"
        if args.compare:
            alone = timed_sweep(recipes, sets + args.sets + ["resources.batch_runs=1"])
            line += f"   every run alone: {alone:7.1f} s   ratio {alone / batched:4.1f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
