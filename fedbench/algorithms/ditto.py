"""Ditto (Li, Hu, Beirami, Smith, ICML 2021), the pFedFBE paper's "pFedditto" baseline (§4.1): FedAvg for the
global model plus a persistent personal model v_k per client, pulled towards the global model.

    client k (when sampled), for each of E local steps on one minibatch:
        u   ← u   − η_c (∇f(u; D) + g(u))                          # global-model local solver
        v_k ← v_k − η_p (∇f(v_k; D) + g(v_k) + λ_d (v_k − w))      # personal model, anchored at w
    server: w ← w + η_s Σ_k π̂_k (u_k − w)

g is a subgradient of h (how the pFedFBE paper, §1, extends smooth-FL methods to h) or, with
`h_mode: prox`, the step is followed by prox_{η h} instead. v_k starts at w₀ and lives across rounds
(`[N, d]` client state); metrics evaluate the personal models. Defaults λ_d = 0.1 (from the Ditto paper's grid
{0.05, 0.1, 0.2, 0.5, 1, 2}) and η_p = η_c, the pFedFBE paper giving neither (`derive` gives η_p as
`hp.personal_step`).
"""
from __future__ import annotations

from fedbench.algorithms.base import (
    CLIENT_LR,
    H_MODE,
    SERVER_LR,
    Algorithm,
    Upload,
    aggregate,
    broadcast,
    composite_step,
    per_client_copies,
)
from fedbench.hparams import Param


class Ditto(Algorithm):
    name = "ditto"
    title = "Ditto"
    uploads = (Upload("u", relative_to="w"),)  # the local copy of the global model
    keeps = ("v",)  # the personal model
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

    def derive(self, hp):
        return {"personal_step": hp.client_lr if hp.personal_lr is None else hp.personal_lr}  # η_p

    def init_clients(self, w0, num_clients):
        return {"v": per_client_copies(w0, num_clients)}

    def client_init(self, server, rows, rnd, hp):
        return {"u": broadcast(server["w"], rnd), "v": rows["v"], "w": server["w"]}  # w `[R, 1, d]`: every client's

    def client_step(self, local, batches, rnd, hp):
        u, v, w = local["u"], local["v"], local["w"]
        pulled = batches.D.grad(v) + hp.ditto_lambda * (v - w)
        return {
            "u": composite_step(self.reg, hp.h_mode, u, batches.D.grad(u), hp.client_lr),
            "v": composite_step(self.reg, hp.h_mode, v, pulled, hp.personal_step),
            "w": w,
        }

    def server_update(self, server, message, weights, rnd, hp):
        w = server["w"]
        return {"w": w + hp.server_lr * (aggregate(message["u"], weights) - w)}

    def personal_params(self, server, clients):
        return clients["v"]
