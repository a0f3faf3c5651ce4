"""CODASCA (Yuan, Guo, Xu, Ying, Yang, ICML 2021), federated min-max AUC maximization with control
variates: the FeDXL paper's "CODASCA (min-max AUC)" baseline (Guo, Jin, Luo, Yang, ICML 2023, §4; LibAUC's
example script is the reference, its defaults where the FeDXL paper states none).

Objective (AUC-M, square loss with margin m), over the primal v = (w, a, b) and the dual α ≥ 0, with p
the share of positives in the training data:

    L = p(1−p) [ mean₊ (h − a)² + mean₋ (h − b)² + 2α (m + mean₋ h − mean₊ h) − α² ]

This is LibAUC's per-sample Lz averaged over the data, written with class-conditional means because the
`pauc` problem draws class-balanced minibatches (b/2 positives, b/2 negatives): the means are unbiased
for the population objective whatever the batch's class ratio.

Local step (PESG with SCAFFOLD-style corrections; ĝ the minibatch gradient, the w part clipped to
[−clip, clip] element-wise; c, c_i the global and the client's control variates of (w, a, b, α)):

    v ← v − η [ĝ_v − c_i + c + (v − v_ref)/γ] − η·wd·v
    α ← clip_[0, 999](α + η [2(m + b − a) − 2α − c_i + c])          (LibAUC's simplified α-gradient)

Each round (K local steps): c_i ← (Σ of the round's K gradients)/K; the server averages v and α over the
sampled clients and sets c to the mean of all clients' c_i (c ← c + Σ_sampled Δc_i / N, exact under
partial participation). Every `decay_every` local iterations a stage ends: η ← η·decay and v_ref ← the
average of the stage's round-end global iterates (LibAUC averages local iterates; the server only sees
these; `decay_every` should be a multiple of K).
Before the first stage ends, v_ref is the initial point (LibAUC draws it at random).
"""
from __future__ import annotations

import torch

from fedbench.algorithms.base import CLIENT_LR, Algorithm, Upload, aggregate, broadcast
from fedbench.algorithms.xrisk import DECAY, DECAY_EVERY, stage, step_size
from fedbench.hparams import Param

ALPHA_MAX = 999.0  # LibAUC's clip of the dual variable


class CODASCA(Algorithm):
    name = "codasca"
    title = "CODASCA"
    requires = frozenset({"pair_scores"})
    hparams = (
        CLIENT_LR,
        Param("gamma", "float", 500.0, "γ of the proximal term (v − v_ref)/γ toward the stage's reference point "
              "(LibAUC's default)", low=0, low_open=True, log=True),
        Param("weight_decay", "float", 1e-5, "weight decay of w, a and b (LibAUC's default)", low=0),
        Param("margin", "float", 1.0, "margin m of the AUC-M square loss", low=0),
        Param("clip", "float", 1.0, "element-wise clip of the w-gradient (LibAUC's default)", low=0, low_open=True),
        DECAY_EVERY,
        DECAY,
    )
    downloads = ("v", "alpha", "c", "ref")
    uploads = (Upload("v", relative_to="v"), Upload("alpha", relative_to="alpha"), Upload("dc"))

    def derive(self, hp):
        # p(1 − p), p the share of positives in the training data: a constant of the data, the same for every run
        positives = float(self.problem.positive_counts.sum())
        p = positives / (positives + float(self.problem.negative_counts.sum()))
        return {"scale": p * (1 - p)}

    def init_server(self, w0):
        v0 = torch.cat([w0, w0.new_zeros(2)])  # (w, a, b)
        return {"v": v0, "alpha": w0.new_zeros(1), "c": w0.new_zeros(len(v0) + 1), "ref": v0.clone(),
                "stage_mean": v0.clone(), "stage_rounds": w0.new_zeros(())}

    def init_clients(self, w0, num_clients):
        return {"c_i": w0.new_zeros(num_clients, len(w0) + 3)}

    def client_init(self, server, rows, rnd, hp):
        return {"v": broadcast(server["v"], rnd), "alpha": broadcast(server["alpha"], rnd),
                "correction": server["c"] - rows["c_i"], "c_i": rows["c_i"], "ref": server["ref"],
                "grad_sum": torch.zeros_like(rows["c_i"])}

    def client_step(self, local, batches, rnd, hp):
        oracle = batches.D
        v, alpha = local["v"], local["alpha"]
        a, b = v[..., -2:-1], v[..., -1:]

        scale = hp.scale[..., 0]  # [R, 1], against the losses' [R, S]

        def square_loss(pos, neg):  # L without its α² term, [R, S]; a, b, α are constants here
            return scale * (((pos - a) ** 2).mean(-1) + ((neg - b) ** 2).mean(-1)
                                 + 2 * alpha[..., 0] * (neg.mean(-1) - pos.mean(-1)))

        grad_w, scores = oracle.surrogate_grad(v[..., :-2], square_loss)
        pos, neg = scores[..., : oracle.positives], scores[..., oracle.positives:]
        grad_a = -2 * hp.scale * (pos - a).mean(-1, keepdim=True)
        grad_b = -2 * hp.scale * (neg - b).mean(-1, keepdim=True)
        grad_alpha = 2 * (hp.margin + b - a) - 2 * alpha
        grad = torch.cat([grad_w.clamp(-hp.clip, hp.clip), grad_a, grad_b, grad_alpha], dim=-1)
        corrected = grad + local["correction"]
        lr = step_size(hp.client_lr, hp.decay, hp.decay_every, rnd)
        v_new = v - lr * (corrected[..., :-1] + (v - local["ref"]) / hp.gamma) - lr * hp.weight_decay * v
        alpha_new = (alpha + lr * corrected[..., -1:]).clamp(0.0, ALPHA_MAX)
        return {**local, "v": v_new, "alpha": alpha_new, "grad_sum": local["grad_sum"] + grad}

    def client_final(self, local, rnd, hp):
        c_i = local["grad_sum"] / rnd.local_steps
        return {"v": local["v"], "alpha": local["alpha"], "dc": c_i - local["c_i"]}, {"c_i": c_i}

    def server_update(self, server, message, weights, rnd, hp):
        v = aggregate(message["v"], weights)
        stage_rounds = server["stage_rounds"] + 1
        stage_mean = server["stage_mean"] + (v - server["stage_mean"]) / stage_rounds[..., None]
        stage_ends = stage(hp.decay_every, rnd.iteration + rnd.local_steps) > stage(hp.decay_every, rnd.iteration)
        return {"v": v, "alpha": aggregate(message["alpha"], weights),
                "c": server["c"] + message["dc"].sum(1, keepdim=True) / self.problem.num_clients,
                "ref": stage_mean if stage_ends else server["ref"], "stage_mean": stage_mean,
                "stage_rounds": torch.zeros_like(stage_rounds) if stage_ends else stage_rounds}

    def global_params(self, server):
        return server["v"][..., :-2]
