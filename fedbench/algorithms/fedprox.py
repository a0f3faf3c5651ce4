"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, MLSys 2020): local steps on the
client loss plus a proximal pull toward the round's global model, then plain averaging.

    client:  w ← w_k;  repeat R times:  w ← w − η (∇f̃(w; D) + ∂h(w) + μ_p (w − w_k))
    server:  w_{k+1} ← Σ π̂_i w_i

`h_mode: prox` takes the step on the smooth part and the pull, then prox_{η h}. Its output is the global w (Li et
al. 2020, Algorithm 2; NIID-Bench, Li, Diao, Chen, He, ICDE 2022, evaluates it so). Where the problem evaluates
personal models, it also reports those of the pFedFBE paper's "pFedprox" (§4.2, which does not define them): each
client's own last local iterate, the model it ended its last sampled round with (the global w for a client never
sampled yet). Elsewhere (`vision`) it runs as the global method and keeps no per-client state.
With μ_p = 0 this is FedAvg(∂) with server step 1.
"""
from __future__ import annotations

import torch

from fedbench.algorithms.base import CLIENT_LR, H_MODE, Algorithm, aggregate, broadcast, composite_step
from fedbench.hparams import Param


class FedProx(Algorithm):
    name = "fedprox"
    title = "FedProx"
    personalized = True
    personal_optional = True  # the global w is FedProx's output; the last iterates an addition (pFedFBE §4.2)
    hparams = (
        CLIENT_LR,
        Param("prox_mu", "float", 0.01, "proximal weight μ_p (the FedProx grid: 0.001, 0.01, 0.1, 1)", low=0),
        H_MODE,
    )

    def init_clients(self, w0, num_clients):
        if not self.personal:  # the global method: N copies of the model would go unread
            return {}
        return {"last": w0.new_zeros(num_clients, *w0.shape), "sampled": w0.new_zeros(num_clients, 1)}

    def client_init(self, server, rows, rnd, hp):
        return {"w": broadcast(server["w"], rnd), "anchor": server["w"]}  # anchor `[R, 1, d]`: every client's

    def client_step(self, local, batches, rnd, hp):
        w = local["w"]
        direction = batches.D.grad(w) + hp.prox_mu * (w - local["anchor"])
        return {**local, "w": composite_step(self.reg, hp.h_mode, w, direction, hp.client_lr)}

    def client_final(self, local, rnd, hp):
        w = local["w"]
        return {"w": w}, ({"last": w, "sampled": w.new_ones(*w.shape[:-1], 1)} if self.personal else {})

    def server_update(self, server, message, weights, rnd, hp):
        return {"w": aggregate(message["w"], weights)}

    def personal_params(self, server, clients):
        """Each client's last local iterate, the global w `[d]` (one run's) for a client never sampled yet."""
        return torch.where(clients["sampled"] > 0, clients["last"], server["w"].unsqueeze(-2))
