"""FedAvg (McMahan et al. 2017) on the smooth part, optionally with a subgradient of h — the
"FedAvg" baseline of the pFedFBE paper (ICLR 2023 submission, §4) and the "FedAvg(∂)" of Yuan et al. (2021).

    client:  u ← w;  repeat E times:  u ← u − η_c (∇f(u; minibatch) [+ g],  g ∈ ∂h(u))
    server:  w ← w + η_s Σ_k π̂_k (u_k − w)

With all clients, one local step and full batches this is gradient descent with step η_s·η_c.
"""
from __future__ import annotations

from fedbench.algorithms.base import CLIENT_LR, SERVER_LR, Algorithm, aggregate
from fedbench.hparams import Param


class FedAvg(Algorithm):
    name = "fedavg"
    title = "FedAvg"
    hparams = (
        CLIENT_LR,
        SERVER_LR,
        Param("subgradient", "bool", True, "add a subgradient of h to each local step (FedAvg(∂))"),
    )

    # downloads w, uploads its own u = w after the local steps (the defaults: `Algorithm.uploads`)

    def client_step(self, local, batches, rnd, hp):
        u = local["w"]
        if hp.subgradient and self.reg.lam:  # h = 0: no zero subgradient to build and add (`composite_step`)
            return {"w": u - hp.client_lr * (batches.D.grad(u) + self.reg.subgradient(u))}
        return {"w": batches.D.descend(u, hp.client_lr)}  # u - lr·∇f(u), the problem's shortest path to it

    def server_update(self, server, message, weights, rnd, hp):
        w = server["w"]
        return {"w": w + hp.server_lr * (aggregate(message["w"], weights) - w)}
