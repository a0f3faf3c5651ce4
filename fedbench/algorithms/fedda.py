"""FedDA / FedDualAvg, federated dual averaging (Yuan, Zaheer, Reddi, ICML 2021; spec 002 §2.5,
spec 000 §2.3(c)). The server keeps a dual vector z (z₀ = w₀); primal points are retrieved by a prox
whose strength is the learning rate elapsed so far.

    client k, round r:  z_k ← z
        for j = 0..E−1:  η̃ ← η_s η_c (r + o) E + η_c (j + o)
                         u ← prox_{η̃ h}(z_k);   z_k ← z_k − η_c ∇f(u; minibatch)
    server:  z ← z + η_s Σ_k π̂_k (z_k − z);   w ← prox_{η_s η_c (r + 1 + o) E · h}(z)

Offset o (spec 002 §2.5 and §7 item 9): `bao` o = 1, the released code of Bao et al. (1-indexed
rounds; one extra round of shrinkage) [default]; `yuan` o = 0, Yuan et al.'s paper and code.
The elapsed learning rate is a function of the round index, so clients need only z (p floats).
"""
from __future__ import annotations

from fedbench.algorithms.base import CLIENT_LR, SERVER_LR, Algorithm, aggregate, broadcast
from fedbench.hparams import Param


class FedDA(Algorithm):
    name = "fedda"
    runs_axis = True
    hparams = (
        CLIENT_LR,
        SERVER_LR,
        Param("offset", "choice", "bao", "elapsed-LR offset of the prox: Bao's code (bao) or Yuan's (yuan)",
              choices=("bao", "yuan")),
    )
    downloads = ("z",)

    def init_server(self, w0):
        return {"z": w0.clone(), "w": w0.clone()}

    @property
    def _o(self) -> int:
        return 1 if self.offset == "bao" else 0

    def _round_elapsed(self, round_index: int, local_steps: int) -> float:
        return self.server_lr * self.client_lr * (round_index + self._o) * local_steps

    def client_init(self, server, rows, rnd):
        return {"z": broadcast(server["z"], rnd)}

    def client_step(self, local, batches, rnd, step):
        elapsed = self._round_elapsed(rnd.index, rnd.local_steps) + self.client_lr * (step + self._o)
        z = local["z"]
        return {"z": z - self.client_lr * batches.D.grad(self.reg.prox(z, elapsed))}

    def client_final(self, local, rnd):
        return {"z": local["z"]}, {}

    def server_update(self, server, message, weights, rnd):
        z = server["z"]
        z = z + self.server_lr * (aggregate(message["z"], weights) - z)
        return {"z": z, "w": self.reg.prox(z, self._round_elapsed(rnd.index + 1, rnd.local_steps))}
