"""Two sweeps of one recipe on one store, in this process (`sweeps.claims`, no Ray): the shared parent run is closed
by the last of them to end, never while the other's runs are RUNNING."""
from __future__ import annotations

import time

from sweeps.claims import Lease
from sweeps.recipe import load
from sweeps.store import Store
from sweeps.sweep import close_parent, sweep_claimed

RECIPE = """\
name: shared
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation: {rounds: 12, clients_per_round: 4, local_steps: 3, batch_size: 5}
algorithms:
  fedmid: {client_lr: [1e-2, 2e-2]}
seeds: 2
eval_every: 5
"""


def test_a_sweep_that_finds_every_run_claimed_leaves_the_parent_running_for_the_other(tmp_path, tracking_uri):
    """Issue 59 item 6: the second sweep found every run claimed by the first and closed the parent FINISHED while
    the first one's runs were RUNNING. It now leaves the parent RUNNING; the first closes it at its end."""
    path = tmp_path / "shared.yaml"
    path.write_text(RECIPE)
    recipe = load(path)
    trials = recipe.trials()
    store = Store(tracking_uri)
    experiment_id = store.experiment(recipe.name)
    parent_id = store.open_sweep(experiment_id, recipe, [])
    first = Lease(store, experiment_id, parent_id, recipe.recipe_hash)
    mine, _ = first.claim([(trial.config_hash, trial.seed) for trial in trials])
    assert len(mine) == len(trials)
    for trial in trials:  # the first sweep's runs going
        store.start_trial(experiment_id, trial, parent_id, time.time(), {"recipe_hash": recipe.recipe_hash})

    second = Lease(store, experiment_id, store.open_sweep(experiment_id, recipe, []), recipe.recipe_hash)  # one parent
    try:
        summary = sweep_claimed(recipe, trials, set(), store, experiment_id, parent_id, second, tracking_uri, 1, None,
                                None)
    finally:
        second.release()
    assert summary.elsewhere_runs == len(trials) and summary.counts == {"finished": 0, "diverged": 0, "failed": 0}
    assert store.client.get_run(parent_id).info.status == "RUNNING"

    close_parent(store, first, parent_id, "FINISHED", {"finished": len(trials)})  # the first sweep ends
    parent = store.client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["runs_finished"] == str(len(trials))


def test_of_two_sweeps_ending_at_once_the_later_closes_the_parent(tmp_path, tracking_uri):
    """Each sweep releases its claims before it looks for another live one: whichever order they end in, the parent
    is closed (by the later), never left RUNNING by both."""
    path = tmp_path / "shared.yaml"
    path.write_text(RECIPE)
    recipe = load(path)
    store = Store(tracking_uri)
    experiment_id = store.experiment(recipe.name)
    parent_id = store.open_sweep(experiment_id, recipe, [])
    first, second = (Lease(store, experiment_id, parent_id, recipe.recipe_hash) for _ in range(2))
    assert first.others_alive() and second.others_alive()
    first.release()  # both released before either looks
    close_parent(store, second, parent_id, "FINISHED", {"finished": 2})
    assert store.client.get_run(parent_id).info.status == "FINISHED"
    store.client.update_run(parent_id, status="RUNNING")
    close_parent(store, first, parent_id, "FAILED", {"failed": 1})  # the first looks now: the second is gone too
    assert store.client.get_run(parent_id).info.status == "FAILED"
