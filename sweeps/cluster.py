"""Cluster set-up: Ray joined or started for a sweep or a tuning session (`open_cluster`; for several recipes in a row,
`one_cluster`), the code of module plugins and networks shipped to its nodes (`shipped_code`), and how many Ray
trials it runs at once (`slots`)."""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import logging
import math
import os
import sys
from pathlib import Path
from typing import Iterable, Iterator

from .recipe import Recipe


class ClusterError(ValueError):
    """The cluster cannot run the sweep as asked (e.g. GPUs requested where there are none)."""


def slots(resources, nodes: list[dict], max_concurrent: int | None) -> int:
    """How many trials the cluster can run at once; ClusterError if not even one fits on a node."""
    cpus, gpus = resources.cpus_per_trial, resources.gpus_per_trial
    per_node = [min(math.floor(node.get("CPU", 0) / cpus + 1e-9),
                    math.floor(node.get("GPU", 0) / gpus + 1e-9) if gpus else math.inf) for node in nodes]
    total = int(sum(per_node))
    if total == 0:  # the field to change: the one that no node can hold, else the two together
        most_cpus, most_gpus = (max((node.get(kind, 0) for node in nodes), default=0) for kind in ("CPU", "GPU"))
        if gpus > most_gpus:
            raise ClusterError(f"resources.gpus_per_trial: found {gpus:g} GPU per trial, expected at most "
                               f"{most_gpus:g} (no node of the Ray cluster has more)")
        if cpus > most_cpus:
            raise ClusterError(f"resources.cpus_per_trial: found {cpus:g} CPU per trial, expected at most "
                               f"{most_cpus:g} (no node of the Ray cluster has more)")
        raise ClusterError(f"resources: found {cpus:g} CPU and {gpus:g} GPU per trial, but no node of the Ray "
                           "cluster has both; expected fewer CPUs or GPUs")
    return min(total, max_concurrent or total)


def connect(address: str | None, recipes: Iterable[Recipe] = ()) -> bool:
    """Join the given cluster, or start a local Ray, shipping with the job the code of the recipes' module plugins
    and networks that its nodes may lack (`shipped_code`); True when this call started Ray (and must stop it). A Ray
    this process has already joined is used as it is (its job's runtime environment is fixed)."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage-stats notice, nothing sent
    # Ray's runtime environment only where there is code to ship: each worker then waits for its copy.
    ship = shipped_code(recipes)
    # "local": a fresh Ray of our own, never whatever cluster `ray start` left on this machine. Ray's own log
    # lines and the workers' output only with `fedbench -v` (FEDBENCH_VERBOSE): the progress display says
    # what matters, and a trial's error goes to its MLflow run.
    ray.init(address=address or "local", log_to_driver=verbose(), include_dashboard=False, configure_logging=True,
             logging_level=logging.INFO if verbose() else logging.ERROR,
             runtime_env={"py_modules": ship} if ship else None)
    return True


def shipped_code(recipes: Iterable[Recipe]) -> list[str]:
    """What a Ray job ships to its workers on every node (`py_modules` of Ray's runtime environment, which puts
    its copy on their sys.path): the folder of the top-level package, or the file of the top-level module, of each
    module plugin (`plugins: [my_pkg.methods]`) and module network (`model: my_pkg.nets:WideCNN`) the recipes use
    that is not installed here, i.e. that this process imports from a folder on its sys.path (the working
    directory, PYTHONPATH) which another node may not have. Nothing to ship for a file (its text travels in each
    trial: `Trial.plugins`, `plugins.ensure`; `Trial.code`, `networks.carry`), nor for an entry point or an
    installed module: every node must have those installed, as it has fedbench itself."""
    needed = {source for recipe in recipes for source in recipe.code_sources()}
    paths: list[str] = []
    for source in sorted(needed, key=lambda source: source.spec):
        if source.text is not None or source.from_entry_point:
            continue
        top = source.spec.partition(":")[0].split(".")[0]
        if top in sys.stdlib_module_names or top in importlib.metadata.packages_distributions():
            continue  # installed: a distribution's (an editable install too), or Python's own
        module = importlib.import_module(top)  # imported already, when the recipe was loaded
        where = [str(path) for path in getattr(module, "__path__", None) or [module.__file__]]
        if any(part in ("site-packages", "dist-packages") for path in where for part in Path(path).parts):
            continue  # installed without a distribution's record
        paths.extend(path for path in where if path not in paths)
    return paths


def verbose() -> bool:
    """`fedbench -v`: show Ray's and MLflow's own log lines."""
    return os.environ.get("FEDBENCH_VERBOSE") == "1"


def open_cluster(recipe: Recipe, address: str | None, max_concurrent: int | None,
                 recipes: list[Recipe] | None = None) -> tuple[bool, int]:
    """Join or start Ray and count the trials it can run at once: (whether Ray was started here, slots). Ray
    started or joined here ships the code of the module plugins of `recipes`, every recipe it will run (default:
    this one). Raises ClusterError, with Ray stopped again, when the recipe's per-trial resources fit on no node."""
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # our tracker records everything
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray

    resources = recipe.resources
    if recipe.device.startswith("cuda") and not resources.gpus_per_trial:
        raise ClusterError(f"{recipe.source}: resources.gpus_per_trial: found 0 with device {recipe.device}; "
                           "expected a GPU share > 0 (e.g. --set resources.gpus_per_trial=0.25: four trials a GPU)")
    started = connect(address, recipes or [recipe])
    for name in ("ray", "ray.tune", "mlflow"):  # the progress display says what matters
        logging.getLogger(name).setLevel(logging.INFO if verbose() else logging.ERROR)
    try:
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        return started, slots(resources, nodes, max_concurrent or resources.max_concurrent)
    except ClusterError as err:
        if started:
            ray.shutdown()
        raise ClusterError(f"{recipe.source}: {err}") from None


@contextlib.contextmanager
def one_cluster(recipes: list[Recipe], address: str | None, max_concurrent: int | None) -> Iterator[None]:
    """Ray for several sweeps in a row (`fedbench sweep A.yaml B.yaml`): joined or started once, not once per
    recipe (with the module plugins of all of them shipped, `shipped_code`), and every recipe's resources checked
    against it before the first runs (ClusterError); stopped at the end when started here."""
    import ray

    started = False
    try:
        for recipe in recipes:
            started = open_cluster(recipe, address, max_concurrent, recipes)[0] or started
        yield
    finally:
        if started:
            ray.shutdown()


@contextlib.contextmanager
def cluster_for(recipe: Recipe, address: str | None, max_concurrent: int | None, needed: bool = True) -> Iterator[int]:
    """Ray for one sweep or tuning session (`open_cluster`; not `needed`: none, one slot), stopped at the end when
    started here: the number of slots."""
    import ray

    started, slot_count = open_cluster(recipe, address, max_concurrent) if needed else (False, 1)
    try:
        yield slot_count
    finally:
        if started:
            ray.shutdown()
