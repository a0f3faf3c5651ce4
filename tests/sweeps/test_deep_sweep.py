"""A researcher's own network file in a sweep on Ray (issue 60): named in a recipe relative to the recipe's folder,
its text carried to the Ray workers, its sha256 tracked on each run, and each run's exported model loading into a
fresh instance of the researcher's class with the run's last test accuracy."""
from __future__ import annotations

import hashlib

import pytest
import torch
from mlflow.tracking import MlflowClient

import fedbench
from fedbench.networks import carry, load_network
from helpers import invoke
from sweeps.recipe import load

NETWORK = """\
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 5, stride=2)
        self.norm = nn.GroupNorm(2, 4)
        self.fc = nn.Linear(4 * 12 * 12, 10)

    def forward(self, x):
        return self.fc(self.norm(self.conv(x)).relu().flatten(-3))
"""
RECIPE = """\
name: own_net
problem: {name: vision, model: my_nets.py:Net, clients: 6, train_size: 240, test_size: 60}
federation: {rounds: 2, clients_per_round: 3, local_steps: 2, batch_size: 8}
algorithms: {fedavg: {client_lr: 0.1}, scaffold: {client_lr: 0.1}}
seeds: [0]
"""


@pytest.fixture
def recipe(tmp_path):
    """The recipe and its network in a folder of their own, not the working directory."""
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "my_nets.py").write_text(NETWORK)
    (folder / "own.yaml").write_text(RECIPE)
    return folder / "own.yaml"


@pytest.mark.ray
def test_a_network_file_sweeps_on_ray_is_tracked_and_its_export_gives_the_last_accuracy(ray_local, recipe,
                                                                                        tracking_uri):
    result = invoke("sweep", recipe, "--tracking-uri", tracking_uri, "--no-report")
    assert result.exit_code == 0, result.output
    client = MlflowClient(tracking_uri)
    runs = [run for run in client.search_runs([client.get_experiment_by_name("own_net").experiment_id])
            if run.data.tags.get("role") == "trial"]
    assert sorted(run.data.tags["algorithm"] for run in runs) == ["fedavg", "scaffold"]
    digest = hashlib.sha256(NETWORK.encode()).hexdigest()
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "finished"
        assert run.data.params["code.model"] == digest and run.data.tags["code_sha256"] == digest
        shown = invoke("show", run.info.run_id, "--tracking-uri", tracking_uri)
        assert shown.exit_code == 0 and digest in shown.output, shown.output
        model = fedbench.load_model(run.info.run_id, tracking_uri)
        problem = fedbench.problem_of(model)
        net = load_network(f"{recipe.parent / 'my_nets.py'}:Net")[0]()
        net.load_state_dict(model["parameters"])
        images, labels = problem.test_set()
        with torch.no_grad():
            accuracy = (net.eval()(images).argmax(-1) == labels).float().mean().item()
        assert accuracy == pytest.approx(run.data.metrics["test_accuracy"], abs=1e-6)


def test_an_edited_network_file_changes_the_config_hash(recipe):
    before = {trial.config_hash for trial in load(recipe).trials()}
    (recipe.parent / "my_nets.py").write_text(NETWORK.replace("GroupNorm(2, 4)", "GroupNorm(4, 4)"))
    after = {trial.config_hash for trial in load(recipe).trials()}
    assert len(before) == len(after) == 2 and not before & after


def test_the_same_network_file_in_another_folder_is_the_same_run(recipe, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("my_nets.py", "own.yaml"):
        (elsewhere / name).write_text((recipe.parent / name).read_text())
    here, there = (load(path).trials()[0] for path in (recipe, elsewhere / "own.yaml"))
    assert here.problem_config["model"] != there.problem_config["model"]  # each found in its own folder
    assert here.config_hash == there.config_hash
    assert here.params()["problem.model"] == "my_nets.py:Net"


def test_a_recipe_names_its_network_relative_to_its_folder_and_set_relative_to_the_working_directory(
        recipe, tmp_path, monkeypatch):
    (trial, *_) = load(recipe).trials()
    assert trial.problem_config["model"] == f"{recipe.parent / 'my_nets.py'}:Net"
    assert [source.text for source in trial.code] == [NETWORK]
    (tmp_path / "other.py").write_text(NETWORK.replace("Net", "Other"))
    monkeypatch.chdir(tmp_path)
    (trial, *_) = load(recipe, ["problem.model=other.py:Other"]).trials()
    assert trial.problem_config["model"] == f"{tmp_path / 'other.py'}:Other"


def test_a_carried_network_loads_where_its_file_is_gone(recipe):
    (trial, *_) = load(recipe).trials()
    (recipe.parent / "my_nets.py").unlink()  # as on a Ray worker of another machine
    carry(trial.code)
    cls, source = load_network(trial.problem_config["model"])
    assert source == trial.code[0] and cls.__name__ == "Net"
