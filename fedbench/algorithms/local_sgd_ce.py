"""Local SGD on cross-entropy, the FeDXL paper's "Local SGD (CE loss)" baseline (Guo, Jin, Luo, Yang, ICML 2023, §4):
each client runs plain SGD on the problem's minibatch gradient, which for `pauc` is the binary
cross-entropy of a class-balanced minibatch (b/2 positives + b/2 negatives, as the released code), and
the server averages the models every round (server step 1, no momentum). The step size is multiplied
by `decay` every `decay_every` local iterations, as for the FeDXL methods.
"""
from __future__ import annotations

from fedbench.algorithms.base import CLIENT_LR, aggregate
from fedbench.algorithms.fedavg import FedAvg
from fedbench.algorithms.xrisk import DECAY, DECAY_EVERY, step_size


class LocalSGDCE(FedAvg):
    name = "local_sgd_ce"
    title = "Local SGD (CE)"
    hparams = (CLIENT_LR, DECAY_EVERY, DECAY)

    def client_step(self, local, batches, rnd, hp):
        lr = step_size(hp.client_lr, hp.decay, hp.decay_every, rnd)
        return {"w": local["w"] - lr * batches.D.grad(local["w"])}

    def server_update(self, server, message, weights, rnd, hp):
        return {"w": aggregate(message["w"], weights)}
