"""Orchestration overhead of `fedbench sweep` on a 48-run grid of small Lasso trials
(3 algorithms × 4 step sizes × 4 seeds), against a naive Ray Tune + MLflow set-up, in the same run:

  ours    `sweeps.sweep.sweep`: runs packed into Ray trials, actors reused, curves written by one
          driver thread with `log_batch`;
  naive   (run first, with Tune's default logger callbacks) one Ray trial per (config, seed) without actor reuse,
          each logging its curve from inside the trial with one `log_metric` call per metric per evaluation (the
          common hand-written set-up).

For each it prints (sweep wall time) / (sum of in-trial compute time), where compute is the wall time of
building and running the simulations. Below 1 means the slots ran in parallel; the target for ours is
<= 1.3. Both stores are migrated before the clock starts; "with start-up" also counts starting Ray.
Usage: python bench/sweep_overhead.py [--rounds 300] [--slots 2]
"""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

import ray
import torch
from mlflow.tracking import MlflowClient
from ray import tune

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's sweeps/ (installed: fedbench_sweeps)

from sweeps.driving import build_simulation, drive  # noqa: E402
from sweeps.recipe import parse  # noqa: E402
from sweeps.sweep import sweep  # noqa: E402

RECIPE = {
    "name": "overhead",
    "problem": {"name": "lasso", "clients": 16, "samples_per_client": 64, "dim": 100, "support": 20, "lam": 0.05},
    "federation": {"rounds": 300, "clients_per_round": 8, "local_steps": 5, "batch_size": 10},
    "algorithms": {name: {"client_lr": [1e-3, 3e-3, 1e-2, 3e-2]} for name in ("fedmid", "fedda", "fedavg")},
    "seeds": 4,
    "eval_every": 10,
}


def naive_trial(config):
    """One (config, seed) per Ray trial, logging each value with its own call, as tutorials do."""
    torch.set_num_threads(1)
    client = MlflowClient(config["uri"])
    run_id = client.create_run(config["experiment"]).info.run_id
    start = time.perf_counter()
    outcome = drive(build_simulation(config["trial"], "cpu"))
    compute = time.perf_counter() - start
    for row in outcome.rows:
        for key, value in row.items():
            if key != "round":
                client.log_metric(run_id, key, value, step=int(row["round"]))
    client.set_terminated(run_id)
    tune.report({"compute": compute})


def fresh_store(template: Path, folder: Path, name: str) -> str:
    path = folder / f"{name}.db"
    shutil.copy(template, path)
    return f"sqlite:///{path}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--slots", type=int, default=2, help="CPUs given to Ray (one trial per CPU)")
    args = parser.parse_args()
    logging.getLogger("ray").setLevel(logging.ERROR)
    RECIPE["federation"]["rounds"] = args.rounds
    recipe = parse(RECIPE, "bench/sweep_overhead.py")
    trials = recipe.trials()
    folder = Path(tempfile.mkdtemp(prefix="fedbench-bench-"))
    template = folder / "template.db"
    MlflowClient(f"sqlite:///{template}").search_experiments()  # schema migration, outside the clock

    uri = fresh_store(template, folder, "naive")
    experiment = MlflowClient(uri).create_experiment("naive", artifact_location=(folder / "artifacts").as_uri())
    start = time.perf_counter()
    ray.init(address="local", num_cpus=args.slots, include_dashboard=False, log_to_driver=False)
    naive_startup = time.perf_counter() - start
    results = tune.Tuner(
        naive_trial,
        param_space={"trial": tune.grid_search(trials), "uri": uri, "experiment": experiment},
        tune_config=tune.TuneConfig(reuse_actors=False),
        run_config=tune.RunConfig(storage_path=str(folder / "ray"), verbose=0),
    ).fit()
    naive_wall = time.perf_counter() - start
    naive_compute = sum(result.metrics["compute"] for result in results)
    ray.shutdown()
    start = time.perf_counter()
    ray.init(address="local", num_cpus=args.slots, include_dashboard=False, log_to_driver=False)
    startup = time.perf_counter() - start
    ours = sweep(recipe, tracking=fresh_store(template, folder, "ours"))
    ours_wall = time.perf_counter() - start
    ray.shutdown()

    shutil.rmtree(folder, ignore_errors=True)

    print(f"{len(trials)} runs ({ours.counts}), {args.rounds} rounds each, {args.slots} slots; "
          f"ours packed them into {ours.ray_trials} Ray trials, naive used {len(trials)}")
    print(f"{'':8}{'wall s':>9}{'compute s':>11}{'ratio':>8}{'ratio with start-up':>22}")
    for name, wall, boot, compute in (("ours", ours_wall, startup, ours.compute_seconds),
                                      ("naive", naive_wall, naive_startup, naive_compute)):
        print(f"{name:8}{wall - boot:9.1f}{compute:11.1f}{(wall - boot) / compute:8.2f}{wall / compute:22.2f}")
    print(f"naive wall / ours wall: {(naive_wall - naive_startup) / (ours_wall - startup):.1f}x")


if __name__ == "__main__":
    main()
