"""Scheduling on clusters this machine can stand up: two Ray nodes on one machine, and a node that
declares GPUs it does not have (Ray schedules by declared resources, so GPU shares are testable
without a GPU). A plugin's code reaches the workers of both nodes: a file's in each trial, a module only
the driver can import shipped with the Ray job."""
from __future__ import annotations

import hashlib
import os
import sys

import pytest
import torch
from mlflow.tracking import MlflowClient

from sweeps import cluster
from sweeps.cluster import shipped_code
from sweeps.driving import resolve_device
from sweeps.recipe import load
from sweeps.sweep import sweep

RECIPE = """\
name: cluster
problem: {name: lasso, clients: 8, samples_per_client: 40, dim: 60, support: 10, lam: 0.05}
federation: {rounds: ROUNDS, clients_per_round: 4, local_steps: 5, batch_size: 5}
algorithms:
  fedmid: {client_lr: [1e-2, 2e-2]}
  fedda: {client_lr: [1e-3, 1e-2]}
seeds: 2
eval_every: 50
"""


# FedMiD under a name of its own: a worker has this algorithm only from the plugin's code.
PLUGIN = '''\
from fedbench.algorithms.fedmid import FedMiD


class Renamed(FedMiD):
    name = "NAME"
'''
PLUGIN_RECIPE = """\
name: NAME
plugins: [SPEC]
problem: {name: lasso, clients: 8, samples_per_client: 40, dim: 60, support: 10, lam: 0.05}
federation: {rounds: 3000, clients_per_round: 4, local_steps: 5, batch_size: 5}
algorithms: {NAME: {client_lr: [1e-2, 2e-2]}}
seeds: 2
eval_every: 50
resources: {pack: 1, batch_runs: 1}
"""


def nested_runs(uri, name="cluster", status=None):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    return [run for run in client.search_runs([experiment.experiment_id]) if run.data.tags["role"] == "trial"
            and status in (None, run.data.tags["status"])]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, starts_ray):
    """Two Ray nodes of one CPU each on this machine, shared by the module's tests (each joins it as a job of its
    own); their workers use a cache of their own (they inherit the environment at start)."""
    from ray.cluster_utils import Cluster

    from conftest import stop_shared_ray

    stop_shared_ray()  # else the sweeps would join it, not the cluster
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDBENCH_CACHE", str(tmp_path_factory.mktemp("cluster-worker-cache")))
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.fixture
def own_plugins():
    """The test's module plugin package leaves with the test (its registrations do so for every test: conftest)."""
    modules = set(sys.modules)
    yield
    for name in set(sys.modules) - modules:
        if name.startswith("cluster_pkg"):
            del sys.modules[name]


@pytest.mark.ray
def test_trials_land_on_both_nodes_of_a_two_node_cluster(tmp_path, tracking_uri, two_nodes):
    import ray

    try:
        path = tmp_path / "cluster.yaml"
        path.write_text(RECIPE.replace("ROUNDS", "3000") + "resources: {pack: 1}\n")
        summary = sweep(load(path), tracking=tracking_uri, address=two_nodes.address)
    finally:
        ray.shutdown()
    runs = nested_runs(tracking_uri)
    assert summary.counts["finished"] == 8 and len(runs) == 8
    assert len({run.data.tags["node"] for run in runs}) == 2


@pytest.mark.ray
def test_a_plugin_file_travels_in_its_trials_to_both_nodes(tmp_path, tracking_uri, two_nodes, own_plugins):
    """The file is gone once the recipe is loaded: the workers have its code from the trials alone."""
    import ray

    plugin = tmp_path / "cluster_file_method.py"
    plugin.write_text(PLUGIN.replace("NAME", "cluster_file_method"))
    path = tmp_path / "file.yaml"
    path.write_text(PLUGIN_RECIPE.replace("NAME", "cluster_file_method").replace("SPEC", plugin.name))
    recipe = load(path)
    sha = hashlib.sha256(plugin.read_bytes()).hexdigest()
    plugin.unlink()
    assert shipped_code([recipe]) == []  # nothing but the trials carries a file plugin
    try:
        summary = sweep(recipe, tracking=tracking_uri, address=two_nodes.address)
    finally:
        ray.shutdown()
    runs = nested_runs(tracking_uri, "cluster_file_method")
    assert summary.counts["finished"] == 4 and len(runs) == 4, [run.data.tags.get("error") for run in runs]
    assert {run.data.tags["status"] for run in runs} == {"finished"}
    assert {run.data.tags["plugin_sha256"] for run in runs} == {sha}
    assert len({run.data.tags["node"] for run in runs}) == 2


@pytest.mark.ray
def test_a_module_plugin_only_the_driver_imports_is_shipped_with_the_job(tmp_path, tracking_uri, two_nodes,
                                                                         own_plugins, monkeypatch):
    """`plugins: [cluster_pkg.methods]`, its package in a folder on the driver's sys.path alone (not on
    PYTHONPATH, not the working directory that Ray puts on its workers' sys.path): shipped with the Ray job, the
    runs on both nodes import it; without it (the control) they fail to."""
    import ray

    folder = tmp_path / "pkgs"
    package = folder / "cluster_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "methods.py").write_text(PLUGIN.replace("NAME", "cluster_pkg_method"))
    monkeypatch.syspath_prepend(str(folder))
    assert str(folder) not in os.environ.get("PYTHONPATH", "") and not str(folder).startswith(os.getcwd())
    path = tmp_path / "module.yaml"
    path.write_text(PLUGIN_RECIPE.replace("NAME", "cluster_pkg_method").replace("SPEC", "cluster_pkg.methods"))
    recipe = load(path)
    assert shipped_code([recipe]) == [str(package)]
    try:
        with monkeypatch.context() as patch:  # the control: the same sweep with nothing shipped
            patch.setattr(cluster, "shipped_code", lambda recipes: [])
            control = sweep(recipe, tracking=tracking_uri, address=two_nodes.address)
        summary = sweep(recipe, tracking=tracking_uri, address=two_nodes.address)  # runs the failed runs again
    finally:
        ray.shutdown()
    failed = nested_runs(tracking_uri, "cluster_pkg_method", "failed")
    assert control.counts == {"finished": 0, "diverged": 0, "failed": 4} and len(failed) == 4
    for run in failed:
        assert "No module named 'cluster_pkg'" in run.data.tags["error"], run.data.tags["error"]
    runs = nested_runs(tracking_uri, "cluster_pkg_method", "finished")
    assert summary.counts["finished"] == 4 and len(runs) == 4, [run.data.tags.get("error") for run in runs]
    digest = hashlib.sha256()  # a module plugin's hash: every Python file of its package, by name and content
    for file in sorted(package.rglob("*.py")):
        digest.update(str(file.relative_to(package)).encode() + b"\0" + file.read_bytes())
    sha = digest.hexdigest()
    assert {run.data.tags["plugin_sha256"] for run in runs} == {sha}
    assert len({run.data.tags["node"] for run in runs}) == 2


@pytest.mark.ray
def test_half_gpu_trials_run_four_at_once_on_two_declared_gpus(tmp_path, tracking_uri, tmp_path_factory):
    from conftest import start_ray

    ray = start_ray(tmp_path_factory, num_cpus=4, num_gpus=2)
    try:
        path = tmp_path / "gpu.yaml"
        path.write_text(RECIPE.replace("ROUNDS", "5000") + "resources: {gpus_per_trial: 0.5, pack: 1}\n")
        summary = sweep(load(path), tracking=tracking_uri)
    finally:
        ray.shutdown()
    runs = nested_runs(tracking_uri)
    assert summary.counts["finished"] == 8
    events = sorted([(run.info.start_time, 1) for run in runs] + [(run.info.end_time, -1) for run in runs])
    running, most = 0, 0
    for _, change in events:
        running += change
        most = max(most, running)
    assert most == 4  # 2 GPUs / 0.5 per trial; CPUs (4) allow the same
    for run in runs:
        assert run.data.tags["gpu_ids"] != ""  # each trial holds a GPU share...
        assert run.data.tags["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")  # ...and used it if it could


@pytest.mark.parametrize("cuda", [True, False])
def test_device_follows_the_gpu_share(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_device("auto", holds_gpu=True) == ("cuda" if cuda else "cpu")
    assert resolve_device("auto", holds_gpu=False) == "cpu"
    assert resolve_device("cpu", holds_gpu=True) == "cpu"
