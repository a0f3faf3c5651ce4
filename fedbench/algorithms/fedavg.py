"""FedAvg (McMahan et al. 2017) on the smooth part, optionally with a subgradient of h — the
"FedAvg(∂)" baseline of spec 000 §2.3(a) and of Yuan et al. (2021).

    client:  u ← w;  repeat E times:  u ← u − η_c (∇f(u; minibatch) [+ g],  g ∈ ∂h(u))
    server:  w ← w + η_s Σ_k π̂_k (u_k − w)

With all clients, one local step and full batches this is gradient descent with step η_s·η_c.
"""
from __future__ import annotations

from fedbench.algorithms.base import CLIENT_LR, SERVER_LR, Algorithm, aggregate, broadcast, per_run
from fedbench.hparams import Param


class FedAvg(Algorithm):
    name = "fedavg"
    runs_axis = True
    run_hparams = ("client_lr", "server_lr")
    hparams = (
        CLIENT_LR,
        SERVER_LR,
        Param("subgradient", "bool", True, "add a subgradient of h to each local step (FedAvg(∂))"),
    )

    def client_init(self, server, rows, rnd):
        return {"u": broadcast(server["w"], rnd)}

    def client_step(self, local, batches, rnd, step):
        u = local["u"]
        direction = batches.D.grad(u)
        if self.subgradient:
            direction = direction + self.reg.subgradient(u)
        return {"u": u - per_run(self.client_lr, u) * direction}

    def client_final(self, local, rnd):
        return {"u": local["u"]}, {}

    def server_update(self, server, message, weights, rnd):
        w = server["w"]
        return {"w": w + per_run(self.server_lr, w) * (aggregate(message["u"], weights) - w)}
