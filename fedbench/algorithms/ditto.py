"""Ditto (Li, Hu, Beirami, Smith, ICML 2021; spec 000 §2.3(e)): FedAvg for the global model plus a
persistent personal model v_k per client, pulled towards the global model.

    client k (when sampled), for each of E local steps on one minibatch:
        u   ← u   − η_c (∇f(u; D) + g(u))                          # global-model local solver
        v_k ← v_k − η_p (∇f(v_k; D) + g(v_k) + λ_d (v_k − w))      # personal model, anchored at w
    server: w ← w + η_s Σ_k π̂_k (u_k − w)

g is a subgradient of h (spec 000's default treatment of the nonsmooth part) or, with
`h_mode: prox`, the step is followed by prox_{η h} instead. v_k starts at w₀ and lives across rounds
(`[N, d]` client state); metrics evaluate the personal models. Defaults λ_d = 0.1, η_p = η_c
(spec 000's proposal).
"""
from __future__ import annotations

from fedbench.algorithms.base import (CLIENT_LR, H_MODE, SERVER_LR, Algorithm, aggregate, broadcast, composite_step,
                                      per_client_copies, per_run)
from fedbench.hparams import Param


class Ditto(Algorithm):
    name = "ditto"
    runs_axis = True
    run_hparams = ("client_lr", "server_lr", "personal_lr", "ditto_lambda")
    personalized = True
    hparams = (
        CLIENT_LR,
        SERVER_LR,
        Param("personal_lr", "float", None, "personal step size η_p (None: client_lr)",
              low=0, low_open=True, log=True, nullable=True),
        Param("ditto_lambda", "float", 0.1, "pull λ_d of the personal model towards the global one",
              low=0, log=True),
        H_MODE,
    )

    def init_clients(self, w0, num_clients):
        return {"v": per_client_copies(w0, num_clients)}

    def client_init(self, server, rows, rnd):
        return {"u": broadcast(server["w"], rnd), "v": rows["v"], "w": server["w"].unsqueeze(-2)}

    def client_step(self, local, batches, rnd, step):
        u, v, w = local["u"], local["v"], local["w"]
        personal_lr = self.client_lr if self.personal_lr is None else self.personal_lr
        pulled = batches.D.grad(v) + per_run(self.ditto_lambda, v) * (v - w)
        return {
            "u": composite_step(self.reg, self.h_mode, u, batches.D.grad(u), self.client_lr),
            "v": composite_step(self.reg, self.h_mode, v, pulled, personal_lr),
            "w": w,
        }

    def client_final(self, local, rnd):
        return {"u": local["u"]}, {"v": local["v"]}

    def server_update(self, server, message, weights, rnd):
        w = server["w"]
        return {"w": w + per_run(self.server_lr, w) * (aggregate(message["u"], weights) - w)}

    def personal_params(self, server, clients):
        return clients["v"]
