"""Scheduling on clusters this machine can stand up: two Ray nodes on one machine, and a node that
declares GPUs it does not have (Ray schedules by declared resources, so GPU shares are testable
without a GPU)."""
from __future__ import annotations

import pytest
import torch
from mlflow.tracking import MlflowClient

from sweeps.execute import resolve_device, sweep
from sweeps.recipe import load

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


def nested_runs(uri):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("cluster")
    return [run for run in client.search_runs([experiment.experiment_id]) if run.data.tags["role"] == "trial"]


def test_trials_land_on_both_nodes_of_a_two_node_cluster(tmp_path, tracking_uri):
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        path = tmp_path / "cluster.yaml"
        path.write_text(RECIPE.replace("ROUNDS", "3000") + "resources: {pack: 1}\n")
        summary = sweep(load(path), tracking=tracking_uri, address=cluster.address)
    finally:
        ray.shutdown()
        cluster.shutdown()
    runs = nested_runs(tracking_uri)
    assert summary.counts["finished"] == 8 and len(runs) == 8
    assert len({run.data.tags["node"] for run in runs}) == 2


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
