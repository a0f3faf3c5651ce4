"""FeDXL2, federated deep X-risk optimization for a nonlinear outer f (Guo, Jin, Luo, Yang, ICML 2023,
Algorithm 2; spec 001 §2.2), here the KL-OPAUC partial-AUC objective of the `pauc` problem.

    server:  w̄ ← mean_i w_i;  Ḡ ← mean_i G_i;  merge the clients' score lists H₁ (with their u) and H₂
    client i, round r:  w ← w̄;  G ← Ḡ;   for k = 0..K−1:
        a = h(w, Z₁), b = h(w, Z₂)                                  (active: local positives / negatives)
        hb ← B₂ passive negative scores;  (ha, uo) ← B₁ passive (positive score, its u) pairs
        u[idx] ← (1 − γ) u[idx] + γ mean_q ℓ(a_p, hb_q)               (eq. (11))
        G ← (1 − β) G + β ∇[mean_p ∇f(u_p) mean_q ℓ(a_p, hb_q) + mean_p' ∇f(uo_p') mean_q ℓ(ha_p', b_q)]
        w ← w − η G;   record a (with u[idx]) and b for the next round's pools
    upload w, G, and the round's scores and u values (all counted as communication)

Conventions (spec 001 §2.5–2.7), the released code's unless noted:
* passive scores are drawn uniformly with replacement from a pool holding the last `history_rounds`
  rounds of merged scores (code τ = 2; the paper's previous round only is τ = 1); the positive score and
  its u share one index;
* before round 1 the pools hold every training sample's score under w₀, with u = `u_init` (the code
  scores one bootstrap minibatch and updates its u once; the paper scores K samples per client);
* `u_init` = 1 (code; the paper's 0 is undefined for f = λ log); u lives on each client (`[N, n₊]` state);
* the server averages the momentum G as well as w (the paper; the released code averages only one
  tensor by a bug, spec 001 §2.7 item 3): `average_momentum`;
* the scores and u recorded are those of the update minibatch (no independent extra samples);
* step size η × `decay` every `decay_every` rounds (the paper: ×0.1 every 5k iterations).
"""
from __future__ import annotations

import torch

from fedbench.algorithms.base import CLIENT_LR, Algorithm, aggregate, broadcast
from fedbench.algorithms.xrisk import (BETA, DECAY, DECAY_EVERY, GAMMA, U_INIT, fedxl2_surrogate, pair_means,
                                       step_size, u_table, updated_u)
from fedbench.hparams import Param
from fedbench.rng import generator


class FeDXL2(Algorithm):
    name = "fedxl2"
    hparams = (
        CLIENT_LR,
        BETA,
        GAMMA,
        U_INIT,
        Param("history_rounds", "int", 2, "rounds of merged scores kept in the passive pools (code 2, paper 1)",
              low=1),
        Param("average_momentum", "bool", True, "the server averages the momentum G too (paper)"),
        DECAY_EVERY,
        DECAY,
    )
    downloads = ("w", "G", "pool_pos", "pool_u", "pool_neg")

    def __init__(self, problem, **hyperparameters):
        super().__init__(problem, **hyperparameters)
        self.passive_gen = generator(problem.seed, "passive-scores")

    def init_server(self, w0):
        positives, negatives = self.problem.bootstrap_scores(w0)
        return {"w": w0.clone(), "G": torch.zeros_like(w0), "pool_pos": positives,
                "pool_u": torch.full_like(positives, self.u_init), "pool_neg": negatives}

    def init_clients(self, w0, num_clients):
        clients = {"u": u_table(self.problem, self.u_init)}
        if not self.average_momentum:
            clients["G"] = torch.zeros(num_clients, *w0.shape, dtype=w0.dtype, device=w0.device)
        return clients

    def _draw(self, pool, shape):
        return torch.randint(len(pool), shape, generator=self.passive_gen).to(pool.device)

    def client_init(self, server, rows, rnd):
        momentum = rows["G"] if "G" in rows else broadcast(server["G"], rnd)
        empty = server["w"].new_zeros(len(rnd.clients), 0)
        return {"w": broadcast(server["w"], rnd), "G": momentum, "u": rows["u"], "h_pos": empty, "u_pos": empty,
                "h_neg": empty, "pools": (server["pool_pos"], server["pool_u"], server["pool_neg"])}

    def client_step(self, local, oracle, rnd, step):
        pool_pos, pool_u, pool_neg = local["pools"]
        s, positives = len(rnd.clients), oracle.positives
        negatives = oracle.x.shape[1] - positives
        hb = pool_neg[self._draw(pool_neg, (s, negatives))]
        pair = self._draw(pool_pos, (s, positives))
        ha, uo = pool_pos[pair], pool_u[pair]
        fresh = {}

        def surrogate(a, b):
            fresh["u"] = updated_u(local["u"], oracle.positive_index, pair_means(self.problem, a, hb), self.gamma)
            return fedxl2_surrogate(self.problem, a, b, ha, hb, self.problem.outer_grad(fresh["u"]),
                                    self.problem.outer_grad(uo))

        direction, scores = oracle.surrogate_grad(local["w"], surrogate)
        momentum = (1 - self.beta) * local["G"] + self.beta * direction
        lr = step_size(self.client_lr, self.decay, self.decay_every, rnd.index)
        return {**local, "w": local["w"] - lr * momentum, "G": momentum,
                "u": local["u"].scatter(1, oracle.positive_index, fresh["u"]),
                "h_pos": torch.cat([local["h_pos"], scores[:, :positives]], 1),
                "u_pos": torch.cat([local["u_pos"], fresh["u"]], 1),
                "h_neg": torch.cat([local["h_neg"], scores[:, positives:]], 1)}

    def client_final(self, local, rnd):
        message = {k: local[k] for k in ("w", "h_pos", "u_pos", "h_neg")}
        rows = {"u": local["u"]}
        if self.average_momentum:
            message["G"] = local["G"]
        else:
            rows["G"] = local["G"]
        return message, rows

    def server_update(self, server, message, weights, rnd):
        """Average w (and G); merge the round's scores into pools of the last τ rounds' worth, newest first."""
        pools = {}
        for key, part in (("pool_pos", "h_pos"), ("pool_u", "u_pos"), ("pool_neg", "h_neg")):
            fresh = message[part].reshape(-1)
            pools[key] = torch.cat([fresh, server[key]])[: self.history_rounds * len(fresh)]
        return {"w": aggregate(message["w"], weights),
                "G": aggregate(message["G"], weights) if self.average_momentum else server["G"], **pools}
