"""FedMiD, federated mirror descent with the Euclidean mirror map (Yuan, Zaheer, Reddi, ICML 2021), a baseline
of Bao et al. (ICML 2022, §4) and the pFedFBE paper's "Fedmirror" (§4.1): client proximal SGD, then primal
averaging and a server prox.

    client:  u ← w;  repeat E times:  u ← prox_{η_c h}(u − η_c ∇f(u; minibatch))
    server:  Δ ← Σ_k π̂_k (u_k − w);   w ← prox_{τ_s h}(w + η_s Δ)

Server threshold τ_s:
* `bao`  — η_s·η_c, the released code of Bao et al. (2022) [default, reproduces their Figures 1–2];
* `yuan` — η_s·η_c·E, Yuan et al.'s own implementation (the round's total client learning rate);
* `none` — plain averaging, no server prox (how this project reads the pFedFBE paper's "Fedmirror", which
  states no server step).
"""
from __future__ import annotations

from fedbench.algorithms.base import CLIENT_LR, SERVER_LR, Algorithm, aggregate
from fedbench.hparams import Param


class FedMiD(Algorithm):
    name = "fedmid"
    title = "FedMiD"
    hparams = (
        CLIENT_LR,
        SERVER_LR,
        Param("server_threshold", "choice", "bao", "server prox step: η_s·η_c (bao), η_s·η_c·E (yuan), none",
              choices=("bao", "yuan", "none")),
    )

    # downloads w, uploads its own u = w after the local steps (the defaults: `Algorithm.uploads`)

    def client_step(self, local, batches, rnd, hp):
        u = local["w"]
        return {"w": self.reg.prox(u - hp.client_lr * batches.D.grad(u), hp.client_lr)}

    def server_update(self, server, message, weights, rnd, hp):
        w = server["w"]
        w = w + hp.server_lr * (aggregate(message["w"], weights) - w)
        if hp.server_threshold == "none":
            return {"w": w}
        step = hp.server_lr * hp.client_lr
        if hp.server_threshold == "yuan":
            step = step * rnd.local_steps
        return {"w": self.reg.prox(w, step)}
