"""SCAFFOLD (Karimireddy et al. 2020, Algorithm 1) against a written-out loop over the sampled clients on the same
draws (float64, 1e-12), for both client control updates; and on the run axis, a batch of seeds and step sizes
equals its runs alone."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fedbench
from fedbench.engine.runs import RoundProgram
from fedbench.engine.simulate import Federation, Simulation
from helpers import assert_same, rows_by_run
from small_problems import small_lasso

ROUNDS, CLIENTS, STEPS, BATCH = 4, 3, 3, 5


def written_out(problem, control: str, client_lr: float, server_lr: float, seed: int):
    """Algorithm 1 client by client: (x, c, c_i) after ROUNDS rounds on the draws of a replayed sampler."""
    replay = Simulation(problem, fedbench.make_algorithm("scaffold", problem), Federation(ROUNDS, CLIENTS, STEPS,
                                                                                          BATCH), seed)
    x = replay.server["w"].clone()
    n = problem.config["samples_per_client"]
    features = problem.features.view(problem.num_clients, n, -1)
    labels = problem.labels.view(problem.num_clients, n)
    c = torch.zeros_like(x)
    c_i = torch.zeros(problem.num_clients, len(x), dtype=x.dtype)
    reg = problem.regularizer
    for _ in range(ROUNDS):
        clients, rows = replay.sampler.draw(STEPS)
        dy, dc = [], []
        for j, k in enumerate(clients.tolist()):
            y = x.clone()
            for step in range(STEPS):
                a, b = problem.gather(rows["D"][step, j: j + 1])
                grad = a[0].T @ (a[0] @ y - b[0]) / BATCH
                y = y - client_lr * (grad - c_i[k] + c + reg.subgradient(y))
            if control == "I":
                c_new = features[k].T @ (features[k] @ x - labels[k]) / n
            else:
                c_new = c_i[k] - c + (x - y) / (STEPS * client_lr)
            dy.append(y - x)
            dc.append(c_new - c_i[k])
            c_i[k] = c_new
        x = x + server_lr * torch.stack(dy).mean(0)
        c = c + torch.stack(dc).sum(0) / problem.num_clients
    return x, c, c_i


@pytest.mark.parametrize("control", ["I", "II"])
def test_scaffold_equals_a_written_out_loop_over_clients(control):
    problem = small_lasso()
    hp = dict(client_lr=0.02, server_lr=0.8, control=control)
    sim = Simulation(problem, fedbench.make_algorithm("scaffold", problem, **hp),
                     Federation(ROUNDS, CLIENTS, STEPS, BATCH), seed=5)
    for _ in range(ROUNDS):
        sim.run_round()
    x, c, c_i = written_out(problem, control, 0.02, 0.8, seed=5)
    torch.testing.assert_close(sim.server["w"], x, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sim.server["c"], c, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sim.clients["c"], c_i, rtol=1e-12, atol=1e-12)
    assert c.abs().max() > 0 and (c_i != 0).any(-1).sum() >= CLIENTS  # the control variates moved


def test_scaffold_with_zero_control_variates_makes_its_first_round_a_fedavg_round():
    """Round 1 starts with c = c_i = 0, so its local steps are FedAvg's: the same server model after it."""
    problem, federation = small_lasso(), Federation(1, CLIENTS, STEPS, BATCH)
    scaffold = fedbench.simulate(problem, fedbench.make_algorithm("scaffold", problem, client_lr=0.02), federation, 1)
    fedavg = fedbench.simulate(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.02), federation, 1)
    torch.testing.assert_close(scaffold.params, fedavg.params, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("control", ["I", "II"])
def test_scaffold_runs_in_a_batch_give_their_curves_alone(control):
    """Seeds and step sizes in one program, one run diverging (client_lr far too large): each run's curve alone."""
    problem, federation = small_lasso(), Federation(12, CLIENTS, 4, BATCH)
    runs = [(0, 0.02), (3, 5.0), (7, 0.01), (11, 0.03)]

    def sims():
        return [Simulation(problem, fedbench.make_algorithm("scaffold", problem, client_lr=lr, control=control),
                           federation, seed, 3) for seed, lr in runs]

    alone = [list(sim) for sim in sims()]
    batch = sims()
    batched = rows_by_run(RoundProgram(batch), len(runs))
    assert_same(alone, batched, 1e-12)
    assert [sim.status for sim in batch] == ["finished", "diverged", "finished", "finished"]


def test_the_design_page_shows_the_scaffold_file_as_it_is():
    """The site's "Engine design" page (docs/design.md) lists scaffold.py's class whole: it cannot drift from the
    code."""
    root = Path(__file__).resolve().parents[2]
    source = (root / "fedbench/algorithms/scaffold.py").read_text()
    listing = source[source.index("class SCAFFOLD"):].rstrip()
    assert f"```python\n{listing}\n```" in (root / "docs" / "design.md").read_text()
