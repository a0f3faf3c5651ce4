"""FedDA / FedDualAvg, federated dual averaging (Yuan, Zaheer, Reddi, ICML 2021), a baseline of Bao et al.
(ICML 2022, §4) and the pFedFBE paper's "FedDual" (§4.1). The server keeps a dual vector z (z₀ = w₀); primal
points are retrieved by a prox whose strength is the learning rate elapsed so far.

    client k, round r:  z_k ← z
        for j = 0..E−1:  η̃ ← η_s η_c (r + o) E + η_c (j + o)
                         u ← prox_{η̃ h}(z_k);   z_k ← z_k − η_c ∇f(u; minibatch)
    server:  z ← z + η_s Σ_k π̂_k (z_k − z);   w ← prox_{η_s η_c (r + 1 + o) E · h}(z)

Offset o: `bao` o = 1, the released code of Bao et al. (1-indexed
rounds; one extra round of shrinkage) [default]; `yuan` o = 0, Yuan et al.'s paper and code.
The elapsed learning rate is a function of the round index, so clients need only z (p floats); clients compute
those of the round's E steps at its start (`elapsed`, `[E, R, 1, 1]`: step j's per run), in the order above.
"""
from __future__ import annotations

import functools

import torch

from fedbench.algorithms.base import CLIENT_LR, SERVER_LR, Algorithm, Upload, aggregate, broadcast
from fedbench.hparams import Param


def offset(hp) -> int:
    """o: 1 for Bao's code, 0 for Yuan's."""
    return 1 if hp.offset == "bao" else 0


def round_elapsed(hp, round_index: int, local_steps: int):
    """η_s η_c (r + o) E: the learning rate elapsed before round r (per run)."""
    return hp.server_lr * hp.client_lr * (round_index + offset(hp)) * local_steps


@functools.lru_cache(maxsize=16)
def step_offsets(local_steps: int, o: int, dtype: torch.dtype, device) -> torch.Tensor:
    """j + o for the round's steps j = 0..E−1, `[E, 1, 1, 1]` (against per-run values `[R, 1, 1]`)."""
    return torch.arange(o, local_steps + o, dtype=dtype, device=device).view(-1, 1, 1, 1)


class FedDA(Algorithm):
    name = "fedda"
    title = "FedDA"
    hparams = (
        CLIENT_LR,
        SERVER_LR,
        Param("offset", "choice", "bao", "elapsed-LR offset of the prox: Bao's code (bao) or Yuan's (yuan)",
              choices=("bao", "yuan")),
    )
    downloads = ("z",)
    uploads = (Upload("z", relative_to="z"),)

    def init_server(self, w0):
        return {"z": w0.clone(), "w": w0.clone()}

    def client_init(self, server, rows, rnd, hp):
        z = server["z"]
        steps = step_offsets(rnd.local_steps, offset(hp), z.dtype, z.device)
        return {"z": broadcast(z, rnd), "elapsed": round_elapsed(hp, rnd.index, rnd.local_steps) + hp.client_lr * steps}

    def client_step(self, local, batches, rnd, hp):
        z = local["z"]
        u = self.reg.prox(z, local["elapsed"][rnd.step])
        return {"z": z - hp.client_lr * batches.D.grad(u), "elapsed": local["elapsed"]}

    def server_update(self, server, message, weights, rnd, hp):
        z = server["z"]
        z = z + hp.server_lr * (aggregate(message["z"], weights) - z)
        return {"z": z, "w": self.reg.prox(z, round_elapsed(hp, rnd.index + 1, rnd.local_steps))}
