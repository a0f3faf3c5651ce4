"""LSGD-PFL, local SGD on the global block with SGD on the device blocks (Hanzely, Zhao, Kolar, TMLR 2023, §3,
Algorithm 1): every device keeps a copy w_m of w, and

    every τ iterations (a communication round):  w ← (1/M) Σ_m w_m;  w_m ← w
    every iteration, each device:  (w_m, β_m) ← (w_m, β_m) − η (s_w ∇_w, s_β ∇_β) f̃_m(w_m, β_m; B samples)

τ is the federation's `local_steps`, B its `batch_size`. The gradient scales follow the authors' two codes
(`Synthetic/`, `CV/`): the problem's `beta_scale` for β (1/M, i.e. ∇_{β_m}F, or 1 in the EWS code) and `w_gradient`
for w: `device` (∇_w f_m, what the synthetic code's ∇_w F(w_m, β) averages to) or `objective` ((1/M)∇_w f_m, the
real-data code). The real-data code passes ASVRCD's η instead of the printed 0.01: `client_lr: null`. The steps of
the two blocks, η·s_w and η·s_β, are each run's own (`derive`).
"""
from __future__ import annotations

from fedbench.algorithms.base import aggregate
from fedbench.algorithms.pfl_rules import BlockMethod, rules, zeros_beta, zeros_w
from fedbench.hparams import Param


class LSGDPFL(BlockMethod):
    name = "lsgd_pfl"
    title = "LSGD-PFL"
    keeps = ("beta",)  # the personal block β_m; the local copy of w goes up (the defaults)
    hparams = (
        Param("client_lr", "float", 0.01, "step size η (None: ASVRCD's 1/(4𝓛), as the real-data code)", low=0,
              low_open=True, log=True, nullable=True),
        Param("w_gradient", "choice", "device", "scale of the w-gradient: ∇_w f_m (device) or (1/M)∇_w f_m",
              choices=("device", "objective")),
    )

    def derive(self, hp):
        step = rules(self.problem).eta if hp.client_lr is None else hp.client_lr
        w_scale = 1.0 if hp.w_gradient == "device" else 1.0 / self.problem.num_clients
        return {"w_step": step * w_scale, "beta_step": step * self.problem.beta_scale}  # η·s_w, η·s_β

    def init_server(self, w0):
        return {"w": zeros_w(self.problem)}

    def init_clients(self, w0, num_clients):
        return {"beta": zeros_beta(self.problem, num_clients)}

    def client_step(self, local, batches, rnd, hp):
        g_w, g_beta = batches.D.block_grads(local["w"], local["beta"])
        return {"w": local["w"] - hp.w_step * g_w, "beta": local["beta"] - hp.beta_step * g_beta}

    def server_update(self, server, message, weights, rnd, hp):
        return {"w": aggregate(message["w"], weights)}
