"""ASCD-PFL, accelerated stochastic coordinate descent on (w, β) (Hanzely, Zhao, Kolar, TMLR 2023, App. A, Alg. 5):
ASVRCD-PFL without control variates, one sample j_m per device per iteration:

    x = θ z + (1 − θ) y                                                  (both blocks)
    ζ = w with probability p_w:   g_w = (1/(p_w M)) Σ_m ∇_w f_{m,j_m}(x)     (a communication round)
                                  w_y = w_x − η g_w;  w_z = ν w_z + (1 − ν) w_x + (γ/η)(w_y − w_x)
    else (every device):          g_m = (1/(p_β M)) ∇_β f_{m,j_m}(x)
                                  β_y = β_x − η g_m;  β_z = ν β_z + (1 − ν) β_x + (γ/η)(β_y − β_x)

The un-sampled block keeps y and z. η, γ, ν follow Thm 8/9 with ρ = p_w/n (`pfl_rules`), θ = min{0.8, 1/η}:
`derive` gives each run its own (`hp.rules`, `hp.coupling`), so the runs of a batch may differ in p_w, η, ρ and θ.
A round is the β-iterations up to and including the next w-iteration: its length is the number of p_w-coin
flips to the first success; the devices' shares of g_w go up at its end and the server moves w.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from fedbench.algorithms.base import Upload, aggregate, coin_flips_to_success
from fedbench.algorithms.pfl_rules import ETA, P_W, RHO, BlockMethod, rules, zeros_beta, zeros_w
from fedbench.hparams import Param


class ASCDPFL(BlockMethod):
    name = "ascd_pfl"
    title = "ASCD-PFL"
    uploads = (Upload("g_w"),)  # each device's share of the w-gradient, all-reduced at a w-update
    keeps = ("beta", "beta_z")
    hparams: ClassVar[tuple[Param, ...]] = (
        P_W, ETA, RHO, Param("theta", "float", None, "coupling θ; None: min{0.8, 1/η}", low=0, high=1, nullable=True))

    def derive(self, hp):
        r = rules(self.problem, hp.p_w, hp.eta, hp.rho)
        return {"rules": r, "coupling": min(0.8, 1 / r.eta) if hp.theta is None else hp.theta,
                "beta_gain": self.problem.beta_scale / r.p_beta}  # g_m = beta_gain·∇_β f_{m,j}: (1/(p_β M)) or 1/p_β

    def round_length(self, local_steps, gen):
        return coin_flips_to_success(self.hp.rules.p_w, gen)

    def init_server(self, w0):
        return {"w": zeros_w(self.problem), "w_z": zeros_w(self.problem)}

    def init_clients(self, w0, num_clients):
        return {"beta": zeros_beta(self.problem, num_clients), "beta_z": zeros_beta(self.problem, num_clients)}

    def couple(self, y, z, hp):
        """x = θ z + (1 − θ) y."""
        return torch.lerp(y, z, hp.coupling)

    def accelerated_step(self, x, z, g, rules):
        """(y', z') from the coupled point x and the estimate g: y' = x − ηg and
        z' = νz + (1 − ν)x + (γ/η)(y' − x), written with y' − x = −ηg."""
        return (torch.addcmul(x, rules.eta, g, value=-1),
                torch.addcmul(torch.lerp(x, z, rules.nu), rules.gamma, g, value=-1))

    def client_init(self, server, rows, rnd, hp):
        return {"w_x": self.couple(server["w"], server["w_z"], hp), **rows}

    def client_step(self, local, batches, rnd, hp):
        beta_x = self.couple(local["beta"], local["beta_z"], hp)
        if rnd.is_last_step:  # ζ = w: the device's share of g_w at x
            g_w, _ = batches.D.block_grads(local["w_x"], beta_x)
            return {**local, "g_w": g_w}
        _, g = batches.D.block_grads(local["w_x"], beta_x, need_w=False)
        beta, beta_z = self.accelerated_step(beta_x, local["beta_z"], hp.beta_gain * g, hp.rules)
        return {**local, "beta": beta, "beta_z": beta_z}

    def server_update(self, server, message, weights, rnd, hp):
        w_x = self.couple(server["w"], server["w_z"], hp)
        g_w = aggregate(message["g_w"], weights)
        w, w_z = self.accelerated_step(w_x, server["w_z"], g_w / hp.rules.p_w, hp.rules)
        return {"w": w, "w_z": w_z}
