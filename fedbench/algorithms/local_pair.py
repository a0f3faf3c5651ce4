"""Local Pair, the FeDXL paper's baseline without cross-client pairs (Guo, Jin, Luo, Yang, ICML 2023, §4): each client
optimizes the same compositional X-risk on the pairs inside its own minibatches, by SOX (Wang & Yang
2022): u moving averages for its positives, momentum β, and FedAvg of the model every round.

    u[idx] ← (1 − γ) u[idx] + γ mean_q ℓ(a_p, b_q);   G ← (1 − β) G + β ∇[mean_p ∇f(u_p) mean_q ℓ(a_p, b_q)]
    w ← w − η G  (K steps);   server: w̄ ← mean_i w_i

As the released code, the momentum stays on each client (not averaged; `average_momentum` to average
it) and u stays local. With one client this is centralized SOX.
"""
from __future__ import annotations

import torch

from fedbench.algorithms.base import CLIENT_LR, MODEL, Algorithm, Routing, Upload, aggregate
from fedbench.algorithms.xrisk import (
    BETA,
    DECAY,
    DECAY_EVERY,
    GAMMA,
    U_INIT,
    client_tables,
    local_pair_surrogate,
    moving_average_rates,
    pair_means,
    scatter_last,
    step_size,
    updated_u,
)
from fedbench.hparams import Param


class LocalPair(Algorithm):
    name = "local_pair"
    title = "Local Pair"
    requires = frozenset({"pair_scores"})
    hparams = (
        CLIENT_LR,
        BETA,
        GAMMA,
        U_INIT,
        Param("average_momentum", "bool", False, "the server averages the momentum too (the code does not)"),
        DECAY_EVERY,
        DECAY,
    )

    @classmethod
    def routing(cls, hp):
        if hp["average_momentum"]:  # the momentum goes down and up with the model
            return Routing(("w", "G"), (MODEL, Upload("G", relative_to="G")), keeps=("u",))
        return Routing(("w",), (MODEL,), keeps=("u", "G"))  # each client keeps its own

    def derive(self, hp):
        return moving_average_rates(hp)

    def init_server(self, w0):
        return {"w": w0.clone(), "G": torch.zeros_like(w0)}

    def init_clients(self, w0, num_clients):
        return client_tables(self.problem, self.hp.u_init, self.hp.average_momentum, w0)

    def client_step(self, local, batches, rnd, hp):
        oracle = batches.D
        fresh = {}

        def surrogate(a, b):
            fresh["u"] = updated_u(local["u"], oracle.positive_index, pair_means(self.problem, a, b), hp)
            return local_pair_surrogate(self.problem, a, b, self.problem.outer_grad(fresh["u"]))

        direction, _ = oracle.surrogate_grad(local["w"], surrogate)
        momentum = hp.one_minus_beta * local["G"] + hp.beta * direction
        lr = step_size(hp.client_lr, hp.decay, hp.decay_every, rnd)
        return {"w": local["w"] - lr * momentum, "G": momentum,
                "u": scatter_last(local["u"], oracle.positive_index, fresh["u"])}

    def server_update(self, server, message, weights, rnd, hp):
        momentum = aggregate(message["G"], weights) if hp.average_momentum else server["G"]
        return {"w": aggregate(message["w"], weights), "G": momentum}
