"""The round's slots (`fedbench.axes.slots.Slots`): every rule of who takes part, takes a step and is heard, in closed form
on small tensors, and a lost upload through the engine against a NumPy loop over the heard participants."""
from __future__ import annotations

import numpy as np
import torch

import fedbench
from fedbench.axes.slots import Slots
from fedbench.engine.federation import RoundSampler
from fedbench.engine.run_axis import RoundDraws
from fedbench.engine.simulate import Federation, Simulation
from helpers import initial_point, np_local
from small_problems import small_lasso

HP = {"client_lr": 0.05, "server_lr": 0.8, "subgradient": False}


def two_runs() -> Slots:
    """Two runs of three slots over five clients: run 0 with two participants (slots 0, 1), run 1 with none; uneven
    local work, counts 1, 3, 2 and 2, 2, 2."""
    clients = torch.tensor([[4, 1, 2], [0, 3, 1]])
    present = torch.tensor([[True, True, False], [False, False, False]])
    return Slots(clients, [2, 0], torch.tensor([10, 20, 30, 40, 50]), torch.float64, present,
                 torch.tensor([[1, 3, 2], [2, 2, 2]]), least=1)


def test_the_slots_gather_keep_and_scatter_the_participants_rows():
    slots, state = two_runs(), {"c": torch.arange(10.0).view(2, 5, 1)}
    gathered = slots.gather(state)
    assert gathered["c"].flatten().tolist() == [4.0, 1.0, 2.0, 5.0, 8.0, 6.0]
    updated = {"c": -gathered["c"]}
    slots.scatter(state, slots.present_rows(updated, gathered))  # the absent slots' rows as they were
    assert state["c"].flatten().tolist() == [0.0, -1.0, 2.0, 3.0, -4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    assert slots.client_steps().flatten().tolist() == [1.0, 3.0, 2.0, 2.0, 2.0, 2.0]


def test_a_slot_past_its_count_keeps_its_local_state():
    slots = two_runs()
    local, stepped = {"y": torch.zeros(2, 3, 1), "w": torch.zeros(2, 1, 1)}, {"y": torch.ones(2, 3, 1),
                                                                            "w": torch.ones(2, 1, 1)}
    assert slots.stepped(local, stepped, 0) is stepped  # before the fewest count: every slot steps
    after = slots.stepped(local, stepped, 2)  # only the slot of count 3 takes step 2; a shared entry steps
    assert after["y"].flatten().tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert after["w"].flatten().tolist() == [1.0, 1.0]


def test_the_server_hears_the_present_slots_not_lost():
    slots = two_runs()
    assert slots.weights.tolist() == [[50 / 70, 20 / 70, 0.0], [0.0, 0.0, 0.0]]
    lost = torch.tensor([[False, True, False], [False, False, False]])
    slots = two_runs()
    slots.lose(lost, [1, 0])
    assert slots.weights.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    message = slots.heard_uploads({"w": torch.ones(2, 3, 2), "shared": torch.ones(2, 1, 2)})
    assert message["w"][..., 0].tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert message["shared"].sum() == 4  # no client axis: as it was
    server = slots.server_state({"w": torch.full((2, 1, 2), 7.0)}, {"w": torch.zeros(2, 1, 2)})
    assert server["w"][:, 0, 0].tolist() == [7.0, 0.0]  # run 1 heard no one: its state as it was
    assert slots.where_heard(torch.ones(2, 3, 1), torch.zeros(2, 3, 1)).flatten().tolist() == [1, 0, 0, 0, 0, 0]
    picked = slots.select([1], torch.tensor([1]))
    assert picked.heard_counts == [0] and not picked.heard.any() and picked.participants == [0]


def test_a_lost_upload_counts_for_nothing_on_the_server(monkeypatch):
    """FedAvg whose first slot's upload goes missing every round (`Slots.lose`, the hook of a client dropout): the
    server's mean is the other participants', as a NumPy loop over them computes it; the lost upload is not counted,
    its download is."""
    problem, federation, seed = small_lasso(), Federation(4, 3, 3, 5), 5
    made = RoundDraws.of

    def losing_the_first(*args) -> RoundDraws:
        draws = made(*args)
        lost = torch.zeros(draws.slots.clients.shape, dtype=torch.bool)
        lost[:, 0] = True
        draws.slots.lose(lost, [2] * draws.slots.runs)
        return draws

    monkeypatch.setattr(RoundDraws, "of", losing_the_first)
    sim = Simulation(problem, fedbench.make_algorithm("fedavg", problem, **HP), federation, seed)
    replayed, w = RoundSampler(problem, federation, seed), initial_point(problem, seed)
    for index in range(federation.rounds):
        rows = replayed.draw_round(federation.local_steps, False, index).rows["D"].numpy()
        w = w + HP["server_lr"] * np.mean([np_local(problem, "fedavg", w, rows[:, slot], HP) - w for slot in (1, 2)],
                                          axis=0)
        sim.run_round()
        np.testing.assert_allclose(sim.server["w"].numpy(), w, rtol=1e-12, atol=1e-12)
    assert sim.comm_up == federation.rounds * 2 * problem.dim and sim.comm_down == federation.rounds * 3 * problem.dim
