"""Client dropout (`federation.client_dropout: p`, `fedbench.axes.client_dropout`), an axis of the registry
`fedbench.axes.registry.AXES`: p = 0 is the run without the axis bit for bit (rows, iterate, configuration); p = 1 leaves the
server's iterate where it started, its downloads counted and no upload; for 0 < p < 1 FedAvg's and SCAFFOLD's
iterates equal a loop over the sampled clients in NumPy that drops each one's upload with the same coins (drawn from
the run's "client-dropout" stream), a dropped client having trained and kept its state (SCAFFOLD's c_i); a p outside
[0, 1] is refused in one line at its field; `fedbench list` shows it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fedbench
from fedbench.axes.client_dropout import ClientDropout
from fedbench.engine.runs import programs
from fedbench.engine.simulate import Federation, Simulation
from fedbench.rng import generator
from helpers import initial_point, invoke, np_local, refused, rows_by_run
from small_problems import small_lasso
from test_participation import HP, UNEVEN, Replayed, simulations

BASE = dict(rounds=6, clients_per_round=3, local_steps=2, batch_size=4)


def fedavg_run(federation: Federation, seed: int = 3) -> Simulation:
    problem = small_lasso()
    return Simulation(problem, fedbench.make_algorithm("fedavg", problem, **HP), federation, seed, eval_every=2)


def test_p_zero_is_the_run_without_the_axis_bit_for_bit():
    without, with_zero = Federation(**BASE), Federation(**BASE, axes=(ClientDropout(0.0),))
    plain, dropped = fedavg_run(without), fedavg_run(with_zero)
    rows_plain, rows_zero = list(plain), list(dropped)
    assert rows_plain == rows_zero
    assert torch.equal(plain.server["w"], dropped.server["w"])
    assert without.config() == with_zero.config()


def test_p_one_leaves_the_server_iterate_unchanged_and_counts_every_download_but_no_upload():
    sim = fedavg_run(Federation(**BASE, axes=(ClientDropout(1.0),)))
    start = sim.server["w"].clone()
    rows = list(sim)
    assert torch.equal(sim.server["w"], start) and sim.status == "finished"
    assert rows[-1]["comm_up"] == 0 and rows[-1]["round"] == BASE["rounds"]
    assert rows[-1]["comm_down"] == BASE["rounds"] * BASE["clients_per_round"] * sim.problem.dim  # they downloaded


@pytest.mark.parametrize("p", [0.3, 0.7])
def test_fedavg_with_dropout_equals_a_loop_over_the_uploading_clients_in_numpy(p):
    problem, seed = small_lasso(), 5
    federation = Federation(**BASE, axes=(ClientDropout(p),))
    sim = Simulation(problem, fedbench.make_algorithm("fedavg", problem, **HP), federation, seed)
    replayed, coins = Replayed(problem, federation, seed), generator(seed, "client-dropout")
    w, uploads = initial_point(problem, seed), []
    for index in range(federation.rounds):
        chosen, _, rows = replayed.round(index)
        kept = (torch.rand(len(chosen), generator=coins, dtype=torch.float64) >= p).tolist()
        updates = [np_local(problem, "fedavg", w, rows[:, slot], HP) - w for slot in range(len(chosen)) if kept[slot]]
        if updates:  # the mean over the clients that uploaded; none: w stays
            w = w + HP["server_lr"] * np.mean(updates, axis=0)
        uploads.append(len(updates))
        sim.run_round()
        np.testing.assert_allclose(sim.server["w"].numpy(), w, rtol=1e-12, atol=1e-12)
        assert sim.comm_up == sum(uploads) * problem.dim
        assert sim.comm_down == (index + 1) * BASE["clients_per_round"] * problem.dim  # every sampled client's
    assert 0 < sum(uploads) < len(uploads) * BASE["clients_per_round"]  # some dropped, some uploaded


def test_a_dropped_scaffold_client_trains_and_keeps_its_control_variate_the_server_hears_only_the_others():
    """SCAFFOLD's option II (Karimireddy et al., ICML 2020, Algorithm 1 lines 10-17) one sampled client after another
    in NumPy: every sampled client takes its K steps and sets c_i <- c_i - c + (x - y_i)/(K eta_l); the server's x and
    c move by the Δy_i, Δc_i of the clients whose coin kept their upload alone (x by their mean, c by their sum / N)."""
    problem, seed, p = small_lasso(), 4, 0.5
    hp = {"client_lr": 0.05, "server_lr": 0.8, "subgradient": False}
    federation = Federation(**BASE, axes=(ClientDropout(p),))
    sim = Simulation(problem, fedbench.make_algorithm("scaffold", problem, **hp), federation, seed)
    replayed, coins = Replayed(problem, federation, seed), generator(seed, "client-dropout")
    x, steps, dim = initial_point(problem, seed), BASE["local_steps"], problem.dim
    c, c_i = np.zeros(dim), np.zeros((problem.num_clients, dim))
    features, labels = problem.features.numpy(), problem.labels.numpy()
    dropped_moved, uploads = 0, 0
    for index in range(federation.rounds):
        chosen, _, rows = replayed.round(index)
        kept = (torch.rand(len(chosen), generator=coins, dtype=torch.float64) >= p).tolist()
        dy, dc = [], []
        for slot, k in enumerate(chosen):
            y = x.copy()
            for step_rows in rows[:, slot]:
                a, b = features[step_rows], labels[step_rows]
                y = y - hp["client_lr"] * (a.T @ (a @ y - b) / len(step_rows) - c_i[k] + c)
            c_new = c_i[k] - c + (x - y) / (steps * hp["client_lr"])
            if kept[slot]:
                dy.append(y - x)
                dc.append(c_new - c_i[k])
            else:
                dropped_moved += int(not np.array_equal(c_new, c_i[k]))
            c_i[k] = c_new  # kept by the client, heard or not
        if dy:
            x = x + hp["server_lr"] * np.mean(dy, axis=0)
            c = c + np.sum(dc, axis=0) / problem.num_clients
        uploads += len(dy)
        sim.run_round()
        np.testing.assert_allclose(sim.server["w"].numpy(), x, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(sim.server["c"].numpy(), c, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(sim.clients["c"].numpy(), c_i, rtol=1e-12, atol=1e-12)
        assert sim.comm_up == uploads * 2 * dim  # Δy and Δc of the heard clients
        assert sim.comm_down == (index + 1) * BASE["clients_per_round"] * 2 * dim  # x and c to every sampled client
    assert dropped_moved > 0 and 0 < uploads < federation.rounds * BASE["clients_per_round"]


def test_a_program_of_runs_with_dropout_gives_each_run_its_rows_alone_bit_for_bit():
    """SCAFFOLD under a bernoulli model, uneven local work and dropout: the runs' lost uploads stacked on the run axis
    (`RoundDraws.of`) and their slots selected (`Slots.select`) as each run alone loses them."""
    problem = small_lasso()
    federation = Federation(6, 3, UNEVEN, 5, participation={"model": "bernoulli", "p": 0.6},
                            axes=(ClientDropout(0.4),))
    [(runs, program)] = programs(simulations(problem, "scaffold", federation))
    alone = [list(sim) for sim in simulations(problem, "scaffold", federation)]
    assert rows_by_run(program, len(runs)) == alone and len(runs) > 1


def test_a_p_outside_the_unit_interval_is_refused_in_one_line_at_its_field(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10}\n"
                      "federation: {rounds: 2, clients_per_round: 3, client_dropout: [0.2, 1.5]}\n"
                      "algorithms: {fedavg: {client_lr: 0.01}}\n")
    first = refused(invoke("validate", recipe), "federation.client_dropout[1]", "found 1.5")
    assert first == f"error: {recipe}: federation.client_dropout[1]: expected float in [0, 1], found 1.5"


def test_a_robust_rule_with_dropout_is_refused_at_its_field(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10}\n"
                      "federation: {rounds: 2, clients_per_round: 3, aggregation: median, client_dropout: 0.2}\n"
                      "algorithms: {fedavg: {client_lr: 0.01}}\n")
    refused(invoke("validate", recipe), "federation.client_dropout", "found 0.2 with aggregation median")


def test_a_recipe_grid_over_p_makes_one_run_each_and_fedbench_list_shows_it(tmp_path):
    from fedbench_sweeps.recipe import load
    recipe = tmp_path / "r.yaml"
    recipe.write_text("problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10}\n"
                      "federation: {rounds: 2, clients_per_round: 3, client_dropout: [0.0, 0.25]}\n"
                      "algorithms: {fedavg: {client_lr: 0.01}}\nseeds: 1\n")
    trials = load(recipe).trials()
    assert [trial.federation.axes for trial in trials] == [(ClientDropout(0.0),), (ClientDropout(0.25),)]
    assert "client_dropout" not in trials[0].config()["federation"]  # p = 0: recorded as the run without it
    assert trials[1].config()["federation"]["client_dropout"] == 0.25
    listed = invoke("list", "federation.client_dropout")
    assert listed.exit_code == 0 and "p: float = 0.0" in listed.output, listed.output
