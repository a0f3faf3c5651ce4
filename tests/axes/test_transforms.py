"""Round transforms (`fedbench.axes.transforms`, `fedbench.engine.links`): compression, error feedback, clipping and Gaussian noise
on any algorithm's uploads and broadcast, and the bits they cost.

* each transform against an independent loop over clients in NumPy (FedAvg and FedMiD on a small Lasso): the server's
  iterate after every round to 1e-12, the random ones on the same draws, read from the runs' own streams;
* classic error feedback and EF21 as their papers write them (Karimireddy et al. 2019, Algorithm 1, EF-SignSGD per
  worker; Richtárik, Sokolov, Fatkhullin 2021, Algorithm 1) on a least-squares problem with full gradients;
* a batch of seeds = each seed alone, round- and iteration-wise; a checkpoint resumed bit for bit;
* bits as each transform states its encoding; without a transform, a configuration as before;
* a recipe's chains: grid axes inside, `--set` into them, `fedbench run` end to end, a report over bits.
Refusals through the command line are in `tests/cli/test_refusals.py`.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import fedbench
from fedbench.algorithms.fedavg import FedAvg
from fedbench.axes.slots import Slots
from fedbench.axes.transforms import TRANSFORMS
from fedbench.engine.federation import RoundSampler
from fedbench.engine.links import Links
from fedbench.engine.runs import RoundProgram, programs
from fedbench.engine.simulate import Federation, Simulation, run_seeds
from fedbench.hparams import ParamError
from fedbench.rng import generator
from helpers import (
    FLOAT32,
    PAIRS,
    SEEDS,
    assert_same,
    build,
    curves_alone,
    interrupted,
    invoke,
    np_local,
    np_server,
    pauc,
    pfl,
    refused,
    rows_by_run,
    rows_of,
)
from small_problems import small_lasso
from sweeps.recipe import ReportSpec, load
from sweeps.report import Histories

# -- the transforms, one client at a time in NumPy ----------------------------------------------------------------


def np_compress(name: str, values: dict, x: np.ndarray, drawn) -> np.ndarray:
    """A compressor of `fedbench.axes.transforms` on one client's vector, from its definition."""
    d, y = len(x), np.zeros(len(x))
    if name == "top_k":
        kept = np.argsort(-np.abs(x), kind="stable")[:max(1, round(values["k"] * d))]
        y[kept] = x[kept]
    elif name == "rand_k":
        y[drawn] = x[drawn] * d / len(drawn)
    elif name == "qsgd":
        s, norm = values["levels"], np.linalg.norm(x)
        if norm > 0:
            level = np.floor(np.abs(x) / norm * s)
            level += drawn < np.abs(x) / norm * s - level
            y = norm * np.sign(x) * level / s
    else:
        assert name == "sign"
        y = np.abs(x).sum() / d * np.sign(x)
    return y


class NumpyChain:
    """A chain applied to one client's update at a time, as `fedbench.axes.transforms` defines it; `memory` holds each
    client's error-feedback vector, `clipped` counts the clips that bound."""

    def __init__(self, steps):
        self.steps = [(step.name, dict(step.values)) for step in steps]
        self.memory: dict[int, np.ndarray] = {}
        self.clipped = 0

    def random_steps(self):
        return [(name, values) for name, values in self.steps if TRANSFORMS[name].random]

    def __call__(self, x: np.ndarray, client: int, drawn: list, sampled: int) -> np.ndarray:
        """y of one client's x, with its draws of this round (one per random step, in chain order)."""
        drawn = list(drawn)
        clip = None
        i = 0
        while i < len(self.steps):
            name, values = self.steps[i]
            if name == "clip":
                clip = values["norm"]
                self.clipped += np.linalg.norm(x) > clip
                x = x * min(1.0, clip / np.linalg.norm(x))
            elif name == "gaussian":
                x = x + drawn.pop(0) * (values["sigma"] * clip / sampled)
            else:
                mine = drawn.pop(0) if TRANSFORMS[name].random else None
                compress = lambda v: np_compress(name, values, v, mine)  # noqa: E731
                if i + 1 < len(self.steps) and self.steps[i + 1][0] == "error_feedback":
                    kept = self.memory.get(client, np.zeros(len(x)))
                    if self.steps[i + 1][1]["kind"] == "ef":  # p = x + e, y = C(p), e <- p - y
                        p = x + kept
                        x = compress(p)
                        self.memory[client] = p - x
                    else:  # y = g + C(x - g), g <- y
                        x = kept + compress(x - kept)
                        self.memory[client] = x
                    i += 1
                else:
                    x = compress(x)
            i += 1
        return x


def draws_of(steps, gen, clients, numel):
    """One round's draws of the chain's random steps on the stream `gen`, as the engine makes them."""
    return [TRANSFORMS[name](**values).draw(gen, clients, numel, torch.float64).numpy() for name, values in steps]


CHAINS = {  # id: (uplink, downlink)
    "top_k": ([{"top_k": 0.2}], []),
    "rand_k": ([{"rand_k": 0.3}], []),
    "qsgd": ([{"qsgd": 2}], []),
    "sign": (["sign"], []),
    "ef top_k": ([{"top_k": 0.1}, {"error_feedback": "ef"}], []),
    "ef21 top_k": ([{"top_k": 0.1}, {"error_feedback": "ef21"}], []),
    "ef qsgd": ([{"qsgd": 1}, "error_feedback"], []),
    "ef21 rand_k": ([{"rand_k": 0.2}, {"error_feedback": "ef21"}], []),
    "ef sign": (["sign", "error_feedback"], []),
    "clip": ([{"clip": 1.5}], []),
    "dp": ([{"clip": 1.5}, {"rand_k": 0.5}, {"gaussian": 0.8}], []),
    "downlink top_k": ([], [{"top_k": 0.3}]),
    "both ways": ([{"top_k": 0.2}, {"error_feedback": "ef21"}], [{"qsgd": 4}]),
}
CASES = [("fedavg", chain) for chain in CHAINS] + [("fedmid", chain) for chain in ("ef21 top_k", "dp", "both ways")]
HP = {"client_lr": 0.05, "server_lr": 0.8}


@pytest.mark.parametrize("name, chain", CASES, ids=[f"{n}: {c}" for n, c in CASES])
def test_each_transform_equals_a_loop_over_clients_in_numpy(name, chain):
    problem, seed = small_lasso(lam=0.1), 5
    uplink, downlink = CHAINS[chain]
    federation = Federation(6, 3, 3, 5, uplink=uplink, downlink=downlink)
    hp = {**HP, **({"subgradient": False} if name == "fedavg" else {})}
    sim = Simulation(problem, fedbench.make_algorithm(name, problem, **hp), federation, seed)

    sampler, up = RoundSampler(problem, federation, seed), NumpyChain(federation.uplink)
    up_gen, down_gen = generator(seed, "uplink"), generator(seed, "downlink")
    w = problem.init_params(generator(seed, "init")).numpy()
    sent, d = w.copy(), problem.dim  # the clients' copy of the broadcast
    for _ in range(federation.rounds):
        clients, rows = sampler.draw(federation.local_steps)
        if downlink:  # the broadcast's difference through its compressor: the clients' copy moves by it
            [(compressor, values)] = [(step.name, dict(step.values)) for step in federation.downlink]
            drawn = draws_of([(compressor, values)], down_gen, 1, d)[0][0] if TRANSFORMS[compressor].random else None
            sent = sent + np_compress(compressor, values, w - sent, drawn)
        else:
            sent = w
        drawn = draws_of(up.random_steps(), up_gen, len(clients), d)
        received = []
        for k, client in enumerate(clients.tolist()):
            update = np_local(problem, name, sent, rows["D"][:, k].numpy(), HP) - sent
            mine = [draw[0] if draw.shape[0] == 1 else draw[k] for draw in drawn]  # gaussian: one for all
            received.append(w + up(update, client, mine, len(clients)))  # the update on the server's own w
        w = np_server(problem, name, w, np.mean(received, axis=0), HP)
        sim.run_round()
        np.testing.assert_allclose(sim.server["w"].numpy(), w, rtol=1e-12, atol=1e-12)
    plain = Simulation(problem, fedbench.make_algorithm(name, problem, **hp), replace(federation, uplink=(),
                                                                                       downlink=()), seed)
    *_, = plain
    assert not np.allclose(w, plain.server["w"].numpy(), rtol=1e-6)  # the transforms changed the run
    if chain in ("clip", "dp"):
        assert 0 < up.clipped < 18  # the bound binds for some clients, not all
    assert set(sim.clients) == set(sim.algorithm.init_clients(sim.server["w"], problem.num_clients))  # none of ours


# -- error feedback as its papers write it -------------------------------------------------------------------------

def full_batch(rounds, uplink):
    """FedAvg with one full-batch gradient step a round from every client, server step 1: w ← w + mean of the
    clients' transformed −γ∇f_i(w), on a least-squares problem (λ = 0) with n = 20 samples per client."""
    problem = small_lasso(lam=0.0)
    return problem, Federation(rounds, 0, 1, 20, uplink=uplink)


def gradients(problem, w):
    """∇f_i(w) = X_iᵀ(X_i w − y_i)/n of each client, `[N, d]`."""
    x = problem.features.numpy().reshape(problem.num_clients, -1, problem.dim)
    y = problem.labels.numpy().reshape(problem.num_clients, -1)
    return np.stack([xi.T @ (xi @ w - yi) / len(yi) for xi, yi in zip(x, y)])


def engine_iterates(problem, federation, gamma, seed):
    sim = Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=gamma, subgradient=False),
                     federation, seed)
    iterates = []
    for _ in range(federation.rounds):
        sim.run_round()
        iterates.append(sim.server["w"].numpy().copy())
    return iterates


def test_classic_error_feedback_is_ef_signsgd():
    """Karimireddy, Rebjock, Stich, Jaggi 2019, Algorithm 1 (EF-SignSGD), with a residual e_i per worker and the
    server averaging their δ_i: p_i = γ g_i + e_i, δ_i = (‖p_i‖₁/d) sign(p_i), x ← x − mean δ_i, e_i ← p_i − δ_i."""
    gamma, rounds, seed = 0.05, 12, 2
    problem, federation = full_batch(rounds, ["sign", {"error_feedback": "ef"}])
    x = problem.init_params(generator(seed, "init")).numpy()
    e = np.zeros((problem.num_clients, problem.dim))
    expected = []
    for _ in range(rounds):
        p = gamma * gradients(problem, x) + e
        delta = np.abs(p).sum(1, keepdims=True) / problem.dim * np.sign(p)
        x, e = x - delta.mean(0), p - delta
        expected.append(x)
    np.testing.assert_allclose(engine_iterates(problem, federation, gamma, seed), expected, rtol=1e-12, atol=1e-13)
    assert np.abs(e).max() > 0  # the residuals carry something


def test_ef21_is_its_algorithm_one():
    """Richtárik, Sokolov, Fatkhullin 2021, Algorithm 1 with C = top-k and g_i⁰ = C(∇f_i(x⁰)):
    x^{t+1} = x^t − γ g^t;  c_i = C(∇f_i(x^{t+1}) − g_i^t);  g_i^{t+1} = g_i^t + c_i;  g^{t+1} = g^t + mean c_i."""
    gamma, rounds, seed, k = 0.05, 12, 4, 0.2
    problem, federation = full_batch(rounds, [{"top_k": k}, {"error_feedback": "ef21"}])
    top_k = lambda v: np_compress("top_k", {"k": k}, v, None)  # noqa: E731
    x = problem.init_params(generator(seed, "init")).numpy()
    g_i = np.stack([top_k(g) for g in gradients(problem, x)])
    g = g_i.mean(0)
    expected = []
    for _ in range(rounds):
        x = x - gamma * g
        c = np.stack([top_k(v) for v in gradients(problem, x) - g_i])
        g_i, g = g_i + c, g + c.mean(0)
        expected.append(x)
    np.testing.assert_allclose(engine_iterates(problem, federation, gamma, seed), expected, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("server_lr", [1.0, 0.5])
def test_a_compressed_downlink_is_ef21p(server_lr):
    """Gruntkowska, Tyurin, Richtárik 2023 ("EF21-P and Friends"), Algorithm 1 with FedAvg's clients and C = top-k:
    the server keeps its w and the clients' shared copy ŵ (w⁰ at the start); each round ŵ ← ŵ + C(w − ŵ), the sampled
    clients run their local steps from ŵ, and the server steps w ← w + η · mean(u_k − ŵ). What C leaves out, w − ŵ,
    is sent in later rounds, never dropped: at η = 1 the server's w is not replaced by ŵ + the mean update."""
    problem, seed, k = small_lasso(), 3, 0.2
    federation = Federation(10, 3, 3, 5, downlink=[{"top_k": k}])
    hp = {"client_lr": 0.05, "server_lr": server_lr}
    sim = Simulation(problem, fedbench.make_algorithm("fedavg", problem, subgradient=False, **hp), federation, seed)
    sampler = RoundSampler(problem, federation, seed)
    w = problem.init_params(generator(seed, "init")).numpy()
    copy = w.copy()
    for _ in range(federation.rounds):
        clients, rows = sampler.draw(federation.local_steps)
        copy = copy + np_compress("top_k", {"k": k}, w - copy, None)
        updates = [np_local(problem, "fedavg", copy, rows["D"][:, j].numpy(), hp) - copy for j in range(len(clients))]
        w = w + server_lr * np.mean(updates, axis=0)
        sim.run_round()
        np.testing.assert_allclose(sim.server["w"].numpy(), w, rtol=1e-12, atol=1e-12)
    assert np.linalg.norm(w - copy) > 0.01 * np.linalg.norm(w)  # the error still to send is not negligible


# -- the run axis and checkpoints ---------------------------------------------------------------------------------

SAMPLED = Federation(9, 3, 3, 5)
BATCHED = {  # id: (problem maker, algorithm, federation, hyperparameters, tolerance as in `helpers.CASES`)
    "fedavg ef top_k, qsgd down": (small_lasso, "fedavg", replace(SAMPLED, uplink=[{"top_k": 0.2}, "error_feedback"],
                                                                  downlink=[{"qsgd": 2}]), HP, 1e-12),
    "fedmid ef21 rand_k": (small_lasso, "fedmid", replace(SAMPLED, uplink=[{"rand_k": 0.3}, {"error_feedback": "ef21"}]),
                           HP, 1e-12),
    "fedavg dp": (small_lasso, "fedavg", replace(SAMPLED, uplink=[{"clip": 0.3}, {"qsgd": 4}, {"gaussian": 1.0}]), HP,
                  1e-12),
    "scaffold ef sign": (small_lasso, "scaffold", replace(SAMPLED, uplink=["sign", "error_feedback"]), HP, 1e-12),
    # five uploads (the model, its momentum, three score vectors) and five downloads, the pools changing their shape
    "fedxl2 ef qsgd, top_k down": (pauc, "fedxl2", replace(PAIRS, uplink=[{"qsgd": 4}, "error_feedback"],
                                                           downlink=[{"top_k": 0.5}]), {"client_lr": 0.5}, FLOAT32),
    # iteration-wise (coin-flip rounds, every client): EF21 on the w-gradients the devices send
    "ascd_pfl ef21 top_k, top_k down": (pfl, "ascd_pfl", Federation(12, 0, 1, 1, uplink=[
        {"top_k": 0.3}, {"error_feedback": "ef21"}], downlink=[{"top_k": 0.5}]), {}, 1e-12),
}


@pytest.mark.parametrize("case", BATCHED)
def test_a_batch_of_seeds_gives_each_seed_its_curve_alone(case):
    make, name, federation, hp, tolerance = BATCHED[case]
    problem = make()
    sims = [Simulation(problem, fedbench.make_algorithm(name, problem, **hp), federation, seed, 3) for seed in SEEDS]
    assert [runs for runs, _ in programs(sims)] == [list(range(len(SEEDS)))]  # one program
    batched = run_seeds(problem, name, federation, SEEDS, eval_every=3, **hp)
    assert_same(curves_alone(problem, name, federation, hp, SEEDS), batched, tolerance)
    plain = run_seeds(problem, name, replace(federation, uplink=(), downlink=()), SEEDS[:1], eval_every=3, **hp)
    assert plain[0][-1]["objective"] != batched[0][-1]["objective"]  # the transforms changed the runs


class SvdCheckedFedAvg(FedAvg):
    """FedAvg whose server update then takes an SVD of each run's new model (as a nuclear prox would): it raises
    LinAlgError on a run whose model is not finite, after the round's links have drawn."""

    def server_update(self, server, message, weights, rnd, hp):
        server = super().server_update(server, message, weights, rnd, hp)
        torch.linalg.svdvals(server["w"].view(len(server["w"]), 5, 6))
        return server


def test_a_round_replayed_run_by_run_draws_nothing_anew():
    """Run 2's model is not finite, so the batched round fails in the server's SVD, after the downlink and the uplink
    have drawn; the round is replayed run by run on the same draws and link state: run 2 ends diverged, the others
    go on exactly as alone."""
    problem = small_lasso()
    federation = replace(SAMPLED, uplink=[{"rand_k": 0.3}, {"error_feedback": "ef21"}], downlink=[{"qsgd": 2}])

    def sims():
        made = [Simulation(problem, SvdCheckedFedAvg(problem, **HP), federation, seed, 3) for seed in SEEDS]
        made[2].server["w"] = torch.full_like(made[2].server["w"], math.nan)
        return made

    alone = [list(sim) for sim in sims()]
    batch = sims()
    batched = rows_by_run(RoundProgram(batch), len(SEEDS))
    assert [sim.status for sim in batch] == ["finished", "finished", "diverged", "finished"]
    assert_same([alone[i] for i in (0, 1, 3)], [batched[i] for i in (0, 1, 3)], 1e-12)


@pytest.mark.parametrize("case", ["fedavg ef top_k, qsgd down", "ascd_pfl ef21 top_k, top_k down"])
def test_a_resumed_batch_with_transforms_gives_the_rows_of_one_never_stopped(case):
    make, name, federation, hp, _ = BATCHED[case]
    problem = make()
    whole = build(problem, name, federation, hp, SEEDS)
    points = []
    whole.safe_point = lambda program: points.append(program.state_dict()["links"])
    expected = rows_of(whole)
    kept = next(iter(points[len(points) // 2]["kept"].values()))
    assert kept.shape[:2] == (len(SEEDS), problem.num_clients) and kept.abs().sum() > 0  # EF state in the checkpoint
    for at in (1, len(points) // 2 + 1):
        resumed, statuses = interrupted(lambda: build(problem, name, federation, hp, SEEDS), at)
        assert resumed == expected
        assert statuses == [sim.status for sim in whole.sims]


def test_without_transforms_the_checkpoint_and_the_streams_are_as_before():
    problem = small_lasso()
    sim = Simulation(problem, fedbench.make_algorithm("fedavg", problem), Federation(3, 3, 3, 5), 0)
    assert "links" not in build(problem, "fedavg", Federation(3, 3, 3, 5), {}, SEEDS).state_dict()
    assert set(sim.streams()) == {"clients", "minibatches", "feature-noise", "algorithm"}
    top_k = Federation(3, 3, 3, 5, uplink=[{"top_k": 0.1}], downlink=[{"qsgd": 2}])
    assert set(Simulation(problem, fedbench.make_algorithm("fedavg", problem), top_k, 0).streams()) == {
        "clients", "minibatches", "feature-noise", "algorithm", "downlink"}  # top_k draws nothing


# -- bits ---------------------------------------------------------------------------------------------------------

def kept(k, d):
    return max(1, round(k * d))


def top_k_bits(k, d, width):
    """K values and their K indices of ⌈log₂ d⌉ bits each, or a mask of d bits where that is fewer."""
    return kept(k, d) * width + min(kept(k, d) * math.ceil(math.log2(d)), d)


def synced_bits(problem, federation, seed, messages):
    """Bits to keep every participant's copy of a broadcast in sync, from each round's (message bits, copy's bits
    whole) in `messages`: a participant receives the round's message and each one it missed since it last took part
    (at its first, every one since the start), or the copy whole where that is fewer bits. The participants are read
    from the run's own draws."""
    participants, last, sent, total = RoundSampler(problem, federation, seed).participants, {}, [0], 0
    for t, (message, whole) in enumerate(messages):
        sent.append(sent[-1] + message)  # sent[t + 1]: the bits of rounds 0..t's messages
        clients, present = participants.draw(t)
        for client in (clients if present is None else clients[present]).tolist():
            total += min(sent[t + 1] - sent[last.get(client, -1) + 1], whole)
            last[client] = t
    return total


D, WIDTH = 30, 64  # small_lasso's model, in float64
BITS = {  # uplink, downlink -> bits of one client's message up, down (each a model of D values)
    "none": ([], [], D * WIDTH, D * WIDTH),
    "top_k": ([{"top_k": 0.1}], [], top_k_bits(0.1, D, WIDTH), D * WIDTH),
    "rand_k": ([{"rand_k": 0.25}], [], kept(0.25, D) * WIDTH, D * WIDTH),
    "qsgd": ([{"qsgd": 4}], [], WIDTH + D * (1 + math.ceil(math.log2(5))), D * WIDTH),
    "qsgd 1 level": ([{"qsgd": 1}], [], WIDTH + D * 2, D * WIDTH),
    "sign with ef": (["sign", "error_feedback"], [], D + WIDTH, D * WIDTH),
    "clip and noise": ([{"clip": 1.0}, {"gaussian": 1.0}], [], D * WIDTH, D * WIDTH),
    "downlink top_k": ([], [{"top_k": 0.5}], D * WIDTH, top_k_bits(0.5, D, WIDTH)),
    "downlink qsgd": ([], [{"qsgd": 8}], D * WIDTH, WIDTH + D * (1 + math.ceil(math.log2(9)))),
}


@pytest.mark.parametrize("case", BITS)
def test_bits_are_counted_as_each_transform_encodes_its_message(case):
    uplink, downlink, up, down = BITS[case]
    problem, rounds, sampled = small_lasso(), 4, 3
    federation = Federation(rounds, sampled, 2, 5, uplink=uplink, downlink=downlink)
    *_, last = Simulation(problem, fedbench.make_algorithm("fedavg", problem), federation, 0, eval_every=rounds)
    assert last["comm_up_bits"] == rounds * sampled * up
    assert last["comm_down_bits"] == synced_bits(problem, federation, 0, [(down, D * WIDTH)] * rounds)
    assert last["comm_up"] == last["comm_down"] == rounds * sampled * D  # floats keep their meaning


def test_top_k_sends_its_indices_or_a_mask_whichever_is_fewer_bits():
    """K indices of ⌈log₂ d⌉ bits, or a mask of d bits: at k = 25%, d = 1,024 the mask (1,024 bits, not 2,560)."""
    top_k = lambda k: TRANSFORMS["top_k"](k=k)  # noqa: E731
    assert top_k(0.25).bits(1024, 32) == 256 * 32 + 1024
    assert top_k(0.05).bits(1024, 32) == 51 * (32 + 10)  # 510 index bits < 1,024
    assert top_k(0.1).bits(1024, 32) == 102 * 32 + 1020 and top_k(0.1).bits(1000, 32) == 100 * 32 + 1000  # the tie
    assert top_k(1.0).bits(30, 64) == 30 * 64 + 30


@pytest.mark.parametrize("participation", [{"model": "uniform"}, {"model": "markov", "p_on": 0.3, "p_off": 0.5}])
def test_a_compressed_downlink_counts_what_keeps_every_copy_in_sync(participation):
    """S = 2 of 8 clients a round, a top-k downlink: a client that missed rounds starts from a copy that folds in their
    messages too, so it receives them (or the copy whole, where fewer bits). Counted against `synced_bits`, and
    against the participants' messages alone (uniform: 24,210 bits against their 15,840; 16,560 was counted before,
    top-k's indices then at ⌈log₂ d⌉ bits each)."""
    problem, rounds = small_lasso(), 8
    federation = Federation(rounds, 2, 2, 5, downlink=[{"top_k": 0.5}], participation=participation)
    sim = Simulation(problem, fedbench.make_algorithm("fedavg", problem), federation, 0, eval_every=rounds)
    *_, last = sim
    expected = synced_bits(problem, federation, 0, [(top_k_bits(0.5, D, WIDTH), D * WIDTH)] * rounds)
    assert last["comm_down_bits"] == expected
    participants = sim.comm_down // D
    assert expected > participants * top_k_bits(0.5, D, WIDTH)  # more than one message per participant
    everyone = Federation(rounds, 0, 2, 5, downlink=[{"top_k": 0.5}])  # every client, every round: one message each
    *_, last = Simulation(problem, fedbench.make_algorithm("fedavg", problem), everyone, 0, eval_every=rounds)
    assert last["comm_down_bits"] == rounds * problem.num_clients * top_k_bits(0.5, D, WIDTH)


def test_bits_of_a_float32_run_and_of_several_uploads():
    problem = fedbench.make_problem("pauc", seed=0, preset="guo2023_noisy_auc", clients=4, positives_per_client=10,
                                    negatives_per_client=50, features=6, test_size=60, val_size=0)
    federation = Federation(3, 3, 2, 8, uplink=[{"top_k": 0.5}])
    sim = Simulation(problem, fedbench.make_algorithm("fedxl1", problem), federation, 0)
    rows = list(Simulation(problem, fedbench.make_algorithm("fedxl1", problem), Federation(3, 3, 2, 8), 0))
    assert rows[-1]["comm_up_bits"] == 32 * rows[-1]["comm_up"]  # float32 values, no transform
    *_, last = sim
    sizes = [problem.dim, 8, 8]  # the model, the scores of the positives and of the negatives (2 steps of 8 samples)
    assert last["comm_up_bits"] == 3 * 3 * sum(top_k_bits(0.5, d, 32) for d in sizes)


def test_a_download_whose_shape_changed_goes_whole():
    """FeDXL's score pools grow over the first rounds: a pool whose shape is not the clients' copy's is sent whole
    (its values at their width), the others through the downlink's top-k; a client that missed rounds receives their
    messages too (`synced_bits`)."""
    problem = fedbench.make_problem("pauc", seed=0, preset="guo2023_noisy_auc", clients=4, positives_per_client=10,
                                    negatives_per_client=50, features=6, test_size=60, val_size=0)
    federation = Federation(4, 3, 2, 8, downlink=[{"top_k": 0.5}])
    sim = Simulation(problem, fedbench.make_algorithm("fedxl1", problem), federation, 0)
    copies = {name: sim.server[name].shape for name in sim.algorithm.downloads}
    messages: dict = {name: [] for name in copies}  # each round's (message, whole) of each download
    for _ in range(4):
        for name, copy in copies.items():
            shape, numel = sim.server[name].shape, sim.server[name].numel()
            messages[name].append((top_k_bits(0.5, numel, 32) if shape == copy else 32 * numel, 32 * numel))
            copies[name] = shape
        sim.run_round()
    assert sim.comm_down_bits == sum(synced_bits(problem, federation, 0, rounds) for rounds in messages.values())
    assert sum(message == whole for rounds in messages.values() for message, whole in rounds) >= 2  # sent whole


# -- what the engine refuses ----------------------------------------------------------------------------------------

def test_a_federation_refuses_a_chain_at_its_field():
    with pytest.raises(ParamError, match=r"federation\.uplink\.0\.top_k: expected float in \(0, 1\], found 2"):
        Federation(uplink=[{"top_k": 2}])
    lasso = small_lasso()  # the chain's rule is its axis's (`fedbench.axes.registry`), which a run's record applies
    with pytest.raises(ParamError, match=r"federation\.uplink\.1\.gaussian: found no clip"):
        Simulation(lasso, fedbench.make_algorithm("fedavg", lasso), Federation(uplink=[{"top_k": 0.1}, {"gaussian": 1.0}]),
                   0)
    problem = pfl()
    with pytest.raises(ParamError, match="federation.uplink: found a chain for l2sgd_plus, which all-reduces"):
        Simulation(problem, fedbench.make_algorithm("l2sgd_plus", problem), Federation(3, 0, 1, 1, uplink=["sign"]), 0)


def test_an_upload_whose_shape_differs_from_its_server_entry_is_refused_at_its_first_round():
    problem = small_lasso()
    algorithm = fedbench.make_algorithm("fedavg", problem)
    links = Links([SimpleNamespace(algorithm=algorithm, federation=Federation(uplink=["sign"]), link_streams={},
                                   problem=problem)], {"w": torch.zeros(1, 1, D, dtype=torch.float64)})
    message, server = {"w": torch.zeros(1, 3, D + 1, dtype=torch.float64)}, {"w": torch.zeros(1, 1, D,
                                                                                           dtype=torch.float64)}
    received = links.receive(server, [0])
    with pytest.raises(ValueError, match=r"federation.uplink: fedavg's upload 'w' \[31\] is declared a new value of "
                                         r"server entry 'w' \[30\]"):
        links.send(message, server, received, Slots(torch.zeros(1, 3, dtype=torch.long), [3], None, torch.float64))


# -- recipes ------------------------------------------------------------------------------------------------------

RECIPE = """\
name: uplink-lasso
problem: {name: lasso, clients: 8, samples_per_client: 20, dim: 30, support: 10, lam: 0.05}
federation:
  rounds: 6
  clients_per_round: 3
  local_steps: 3
  batch_size: 5
  uplink: [{clip: 2.0}, {top_k: 0.1}, {error_feedback: ef21}]
  downlink: [{qsgd: {levels: 8}}]
algorithms:
  fedavg: {client_lr: 0.05}
seeds: [3]
eval_every: 3
report: {x: comm_up_bits}
"""


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "uplink.yaml"
    path.write_text(RECIPE)
    return path


def test_fedbench_run_of_a_recipe_with_chains_gives_the_engines_rows(recipe, tmp_path):
    out = tmp_path / "rows.json"
    result = invoke("run", recipe, "--json", out, "--no-track")
    assert result.exit_code == 0, result.output
    problem = fedbench.make_problem("lasso", seed=3, clients=8, samples_per_client=20, dim=30, support=10, lam=0.05)
    federation = Federation(6, 3, 3, 5, uplink=[{"clip": 2.0}, {"top_k": 0.1}, {"error_feedback": "ef21"}],
                            downlink=[{"qsgd": {"levels": 8}}])
    direct = list(Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.05), federation, 3, 3))
    assert json.loads(out.read_text()) == direct
    assert direct[-1]["comm_up_bits"] == 6 * 3 * kept(0.1, D) * (WIDTH + math.ceil(math.log2(D)))


def test_a_steps_values_are_grid_axes_and_set_reaches_inside_the_chain(recipe):
    grid = load(recipe, ["federation.uplink.1.top_k=[0.01,0.05,0.1]", "federation.downlink.0.qsgd={levels: [2, 4]}"])
    chains = [(t.config()["federation"]["uplink"], t.config()["federation"]["downlink"]) for t in grid.trials()]
    assert len(set(chains)) == 6 and grid.runs() == 6
    assert ("clip(norm=2.0) → top_k(k=0.05) → error_feedback(kind=ef21)", "qsgd(levels=4)") in chains
    params = grid.trials()[0].params()
    assert params["federation.uplink"] == "clip(norm=2.0) → top_k(k=0.01) → error_feedback(kind=ef21)"
    added = load(recipe, ["federation.uplink.3={clip: 0.5}"]).trials()[0]  # the index past the end adds a step
    assert added.config()["federation"]["uplink"].endswith("error_feedback(kind=ef21) → clip(norm=0.5)")
    result = invoke("run", recipe, "--set", "federation.uplink.1.top_k=[0.01,0.05]", "--no-track")
    assert result.exit_code == 2 and "federation.uplink: found 2 values" in result.output
    assert "--set federation.uplink.N.NAME=VALUE" in result.output
    assert invoke("validate", recipe, "--set", "federation.uplink.1.top_k=[0.01,0.05,0.1]").exit_code == 0


def test_a_list_of_chains_is_a_grid_axis_over_chains(recipe):
    """`[[], [{top_k: [...]}], [{top_k: [...]}, {error_feedback: [...]}]]`: each chain's own grid in turn, the empty
    one recorded as a federation without a chain; a refusal names its chain and step."""
    grid = load(recipe, ["federation.uplink=[[], [{top_k: [0.01, 0.1]}], [{top_k: [0.01, 0.1]}, "
                         "{error_feedback: [ef, ef21]}]]"])
    chains = [t.config()["federation"].get("uplink") for t in grid.trials()]
    assert chains == [None, "top_k(k=0.01)", "top_k(k=0.1)",
                      *(f"top_k(k={k}) → error_feedback(kind={kind})" for k in (0.01, 0.1) for kind in ("ef", "ef21"))]
    assert grid.runs() == 7 and grid.trials()[0].config_hash == load(recipe, ["federation.uplink=[]"]).trials()[
        0].config_hash
    for chains_set, where, phrase in [
            ("[[], [{top_k: [0.01, 2]}]]", "federation.uplink[1].0.top_k[1]", "expected float in (0, 1], found 2"),
            ("[[{clip: 1.0}], [{topk: 0.1}]]", "federation.uplink[1].0", "found 'topk', expected a transform"),
            ("[[], {top_k: 0.1}]", "federation.uplink.0", "found [], expected a transform's name"),
            ("[[{top_k: 0.1}], [{error_feedback: ef21}]]", "federation.uplink[1].0.error_feedback",
             "found no compressor right before error feedback")]:
        refused(invoke("validate", recipe, "--set", f"federation.uplink={chains_set}"), f"{recipe}: {where}: ", phrase)


def test_a_recipe_without_chains_records_and_hashes_its_federation_as_before(recipe):
    plain = load(recipe, ["federation.uplink=[]", "federation.downlink=[]"]).trials()[0]
    assert plain.config()["federation"] == {"rounds": 6, "clients_per_round": 3, "local_steps": 3, "batch_size": 5,
                                            "aggregation": "uniform"}
    text = RECIPE.replace("  uplink: [{clip: 2.0}, {top_k: 0.1}, {error_feedback: ef21}]\n", "").replace(
        "  downlink: [{qsgd: {levels: 8}}]\n", "")
    recipe.write_text(text)
    assert load(recipe).trials()[0].config_hash == plain.config_hash


def test_a_report_draws_against_bits():
    assert ReportSpec(x="comm_up_bits").x == ["comm_up_bits"]

    class Store:
        def metric_histories(self, run_ids, metric):
            values = {"comm_up_bits": [(0, 0.0), (10, 100.0)], "comm_down_bits": [(0, 0.0), (10, 300.0)]}[metric]
            return {run_id: list(values) for run_id in run_ids}

    run = SimpleNamespace(info=SimpleNamespace(run_id="r"), data=SimpleNamespace(metrics={}))
    histories = Histories(Store(), [run])
    steps = np.array([0.0, 5.0, 10.0])
    np.testing.assert_allclose(histories.x(run, steps, "comm_up_bits"), [0, 50, 100])
    np.testing.assert_allclose(histories.x(run, steps, "comm_bits"), [0, 200, 400])
