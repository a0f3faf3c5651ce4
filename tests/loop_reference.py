"""Per-client-loop implementations of FedAvg, FedMiD and FedDA, written the way the papers' scripts
are: one client after another, one vector at a time.

They exist to check the batched engine (same random draws through `RoundSampler`, same numbers) and
as the baseline of `bench/clients_batched.py`: a test oracle, not part of the engine.
"""
from __future__ import annotations

import torch
from torch import Tensor

from fedbench.engine.federation import Federation, RoundSampler
from fedbench.rng import generator


def client_gradient(problem, w: Tensor, rows: Tensor) -> Tensor:
    """(1/b) Σ_i x_i (⟨x_i, w⟩ − y_i) for one client's minibatch `rows` `[b]`."""
    x, y = problem.features[rows], problem.labels[rows]
    return x.T @ (x @ w - y) / len(rows)


def local_fedavg(problem, w, rows, rnd_index, hp):
    u = w.clone()
    for step_rows in rows:
        direction = client_gradient(problem, u, step_rows)
        if hp.get("subgradient", True):
            direction = direction + problem.regularizer.subgradient(u)
        u = u - hp["client_lr"] * direction
    return u


def local_fedmid(problem, w, rows, rnd_index, hp):
    u = w.clone()
    for step_rows in rows:
        u = problem.regularizer.prox(u - hp["client_lr"] * client_gradient(problem, u, step_rows), hp["client_lr"])
    return u


def fedda_offset(hp) -> int:
    return 1 if hp.get("offset", "bao") == "bao" else 0


def local_fedda(problem, z, rows, rnd_index, hp):
    lr, o, steps = hp["client_lr"], fedda_offset(hp), len(rows)
    z_k = z.clone()
    for j, step_rows in enumerate(rows):
        elapsed = hp.get("server_lr", 1.0) * lr * (rnd_index + o) * steps + lr * (j + o)
        z_k = z_k - lr * client_gradient(problem, problem.regularizer.prox(z_k, elapsed), step_rows)
    return z_k


LOCAL_SOLVERS = {"fedavg": local_fedavg, "fedmid": local_fedmid, "fedda": local_fedda}


def loop_round(name: str, problem, server: Tensor, clients: Tensor, rows: Tensor, rnd_index: int, hp: dict) -> Tensor:
    """One round of `name` from server vector `server` (w, or z for FedDA), clients in a Python loop."""
    local = LOCAL_SOLVERS[name]
    uploads = [local(problem, server, rows[:, k], rnd_index, hp) for k in range(len(clients))]
    moved = server + hp.get("server_lr", 1.0) * (torch.stack(uploads).mean(0) - server)
    threshold = hp.get("server_threshold", "bao")
    if name == "fedmid" and threshold != "none":
        step = hp.get("server_lr", 1.0) * hp["client_lr"] * (rows.shape[0] if threshold == "yuan" else 1)
        return problem.regularizer.prox(moved, step)
    return moved


def loop_simulate(name: str, problem, federation: Federation, seed: int, **hp) -> Tensor:
    """Final global model after `federation.rounds` rounds (uniform aggregation)."""
    steps = federation.local_steps
    if not isinstance(steps, int) or federation.participation.model != "uniform":
        raise ValueError("the loop reference runs E steps of S uniformly sampled clients a round")
    sampler = RoundSampler(problem, federation, seed)
    server = problem.init_params(generator(seed, "init"))
    for r in range(federation.rounds):
        clients, draws = sampler.draw(steps)
        server = loop_round(name, problem, server, clients, draws["D"], r, hp)
    if name == "fedda":
        elapsed = hp.get("server_lr", 1.0) * hp["client_lr"] * (federation.rounds + fedda_offset(hp)) * steps
        return problem.regularizer.prox(server, elapsed)
    return server
