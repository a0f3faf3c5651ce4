"""FeDXL2, federated deep X-risk optimization for a nonlinear outer f (Guo, Jin, Luo, Yang, ICML 2023,
§3.2, Algorithm 2), e.g. the KL-OPAUC partial-AUC objective of the `pauc` problem.

    server:  w̄ ← mean_i w_i;  Ḡ ← mean_i G_i;  merge the clients' score lists H₁ (with their u) and H₂
    client i, round r:  w ← w̄;  G ← Ḡ;   for k = 0..K−1:
        a = h(w, Z₁), b = h(w, Z₂)                                  (active: local positives / negatives)
        hb ← B₂ passive negative scores;  (ha, uo) ← B₁ passive (positive score, its u) pairs
        u[idx] ← (1 − γ) u[idx] + γ mean_q ℓ(a_p, hb_q)               (eq. (11))
        G ← (1 − β) G + β ∇[mean_p ∇f(u_p) mean_q ℓ(a_p, hb_q) + mean_p' ∇f(uo_p') mean_q ℓ(ha_p', b_q)]
        w ← w − η G;   record a (with u[idx]) and b for the next round's pools
    upload w, G, and the round's scores and u values (all counted as communication)

Conventions, those of the authors' released code (`FeDXL/main.py`) unless noted: passive values from pools of the
last `history_rounds` rounds, drawn with replacement (`xrisk.StaleScores`); `u_init` = 1 (the paper's 0
is undefined for f = λ log), u on each client (`[N, n₊]` state); the server averages the momentum G as
well as w (the paper; by a bug in its all-reduce loop, the released code averages only one tensor):
`average_momentum`; the scores and u recorded are those of the update minibatch (no independent extra
samples); step size η × `decay` every `decay_every` local iterations (the paper: ×0.1 every 5k).
"""
from __future__ import annotations

import torch

from fedbench.algorithms.base import CLIENT_LR, MODEL, Routing, Upload, aggregate
from fedbench.algorithms.xrisk import (
    BETA,
    DECAY,
    DECAY_EVERY,
    GAMMA,
    HISTORY_ROUNDS,
    U_INIT,
    StaleScores,
    client_tables,
    fedxl2_surrogate,
    moving_average_rates,
    pair_means,
    scatter_last,
    step_size,
    updated_u,
)
from fedbench.hparams import Param


class FeDXL2(StaleScores):
    name = "fedxl2"
    title = "FeDXL2"
    with_u = True
    hparams = (
        CLIENT_LR,
        BETA,
        GAMMA,
        U_INIT,
        HISTORY_ROUNDS,
        Param("average_momentum", "bool", True, "the server averages the momentum G too (paper)"),
        DECAY_EVERY,
        DECAY,
    )

    @classmethod
    def routing(cls, hp):
        pools, scores = ("pool_pos", "pool_u", "pool_neg"), (Upload("h_pos"), Upload("u_pos"), Upload("h_neg"))
        if hp["average_momentum"]:  # the momentum goes down and up with the model
            return Routing(("w", "G", *pools), (MODEL, Upload("G", relative_to="G"), *scores), keeps=("u",))
        return Routing(("w", *pools), (MODEL, *scores), keeps=("u", "G"))  # each client keeps its own

    def derive(self, hp):
        return moving_average_rates(hp)

    def init_server(self, w0):
        return {"w": w0.clone(), "G": torch.zeros_like(w0), **self.init_pools(w0)}

    def init_clients(self, w0, num_clients):
        return client_tables(self.problem, self.hp.u_init, self.hp.average_momentum, w0)

    def client_init(self, server, rows, rnd, hp):
        return {**super().client_init(server, rows, rnd, hp), **self.open_round(server, rnd)}

    def client_step(self, local, batches, rnd, hp):
        oracle = batches.D
        positives = oracle.positives
        ha, uo, hb = self.draw_passive(local["pools"], oracle, rnd)
        fresh = {}

        def surrogate(a, b):
            fresh["u"] = updated_u(local["u"], oracle.positive_index, pair_means(self.problem, a, hb), hp)
            return fedxl2_surrogate(self.problem, a, b, ha, hb, self.problem.outer_grad(fresh["u"]),
                                    self.problem.outer_grad(uo))

        direction, scores = oracle.surrogate_grad(local["w"], surrogate)
        momentum = hp.one_minus_beta * local["G"] + hp.beta * direction
        lr = step_size(hp.client_lr, hp.decay, hp.decay_every, rnd)
        return {**local, "w": local["w"] - lr * momentum, "G": momentum,
                "u": scatter_last(local["u"], oracle.positive_index, fresh["u"]),
                **self.record(local, scores, positives, fresh["u"])}

    def server_update(self, server, message, weights, rnd, hp):
        return {"w": aggregate(message["w"], weights),
                "G": aggregate(message["G"], weights) if hp.average_momentum else server["G"],
                **self.merge_pools(server, message, hp)}
