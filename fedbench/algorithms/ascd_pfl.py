"""ASCD-PFL, accelerated stochastic coordinate descent on (w, β) (Hanzely, Zhao, Kolar, Algorithm 5; spec 003 §3.4):
ASVRCD-PFL without control variates, one sample j_m per device per iteration:

    x = θ z + (1 − θ) y                                                  (both blocks)
    ζ = w with probability p_w:   g_w = (1/(p_w M)) Σ_m ∇_w f_{m,j_m}(x)     (a communication round)
                                  w_y = w_x − η g_w;  w_z = ν w_z + (1 − ν) w_x + (γ/η)(w_y − w_x)
    else (every device):          g_m = (1/(p_β M)) ∇_β f_{m,j_m}(x)
                                  β_y = β_x − η g_m;  β_z = ν β_z + (1 − ν) β_x + (γ/η)(β_y − β_x)

The un-sampled block keeps y and z. η, γ, ν follow Thm 8/9 with ρ = p_w/n (`pfl_rules`), θ = min{0.8, 1/η}.
The runs of a batch may differ in p_w, η, ρ and θ: each run's rules are its own (`run_derived`).
A round is the β-iterations up to and including the next w-iteration: its length is the number of p_w-coin
flips to the first success; the devices' shares of g_w go up at its end and the server moves w.
"""
from __future__ import annotations

import torch

from fedbench.algorithms.base import add_scaled, aggregate, coin_flips_to_success, per_run
from fedbench.algorithms.pfl_rules import ETA, P_W, RHO, BlockMethod, rules, zeros_beta, zeros_w
from fedbench.hparams import Param


class ASCDPFL(BlockMethod):
    name = "ascd_pfl"
    runs_axis = True
    run_hparams = ("p_w", "eta", "rho", "theta")
    run_derived = ("rules", "coupling")
    hparams = (P_W, ETA, RHO, Param("theta", "float", None, "coupling θ; None: min{0.8, 1/η}", low=0, high=1,
                                    nullable=True))

    def __init__(self, problem, **hyperparameters):
        super().__init__(problem, **hyperparameters)
        self.rules = rules(problem, self.p_w, self.eta, self.rho)
        self.coupling = min(0.8, 1 / self.rules.eta) if self.theta is None else self.theta

    def round_length(self, local_steps, gen):
        return coin_flips_to_success(self.rules.p_w, gen)

    def init_server(self, w0):
        return {"w": zeros_w(self.problem), "w_z": zeros_w(self.problem)}

    def init_clients(self, w0, num_clients):
        return {"beta": zeros_beta(self.problem, num_clients), "beta_z": zeros_beta(self.problem, num_clients)}

    def couple(self, y, z):
        return torch.lerp(y, z, per_run(self.coupling, y))

    def accelerated_step(self, x, z, g):
        """(y', z') from the coupled point x and the estimate g: y' = x − ηg and
        z' = νz + (1 − ν)x + (γ/η)(y' − x), written with y' − x = −ηg."""
        r = self.rules
        return add_scaled(x, -r.eta, g), add_scaled(torch.lerp(x, z, per_run(r.nu, x)), -r.gamma, g)

    def client_init(self, server, rows, rnd):
        return {"w_x": self.couple(server["w"], server["w_z"]), **rows}

    def client_step(self, local, batches, rnd, step):
        beta_x = self.couple(local["beta"], local["beta_z"])
        if step == rnd.local_steps - 1:  # ζ = w: the device's share of g_w at x
            g_w, _ = batches.D.block_grads(local["w_x"], beta_x)
            return {**local, "g_w": g_w}
        _, g = batches.D.block_grads(local["w_x"], beta_x, need_w=False)
        scale = self.problem.beta_scale / per_run(self.rules.p_beta, g)
        beta, beta_z = self.accelerated_step(beta_x, local["beta_z"], scale * g)
        return {**local, "beta": beta, "beta_z": beta_z}

    def client_final(self, local, rnd):
        return {"g_w": local["g_w"]}, {"beta": local["beta"], "beta_z": local["beta_z"]}

    def server_update(self, server, message, weights, rnd):
        w_x = self.couple(server["w"], server["w_z"])
        g_w = aggregate(message["g_w"], weights)
        w, w_z = self.accelerated_step(w_x, server["w_z"], g_w / per_run(self.rules.p_w, g_w))
        return {"w": w, "w_z": w_z}
