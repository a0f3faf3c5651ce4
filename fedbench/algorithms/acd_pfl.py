"""ACD-PFL, accelerated block-coordinate descent with full local gradients (Hanzely, Zhao, Kolar, TMLR 2023,
§4.2, Algorithm 2, Theorem 7), the minimax-optimal method (√(L^w/μ) communications):

    ν = μ/(√L^w + √L^β)²,  θ = (√(ν² + 4ν) − ν)/2,  η = 1/θ,  p_w = √L^w/(√L^w + √L^β)
    x = (1 − θ) y + θ z                                                        (both blocks)
    with probability p_w (a communication round):   G_w = ∇_w F(x) = (1/M) Σ_m ∇_w f_m(x)
        w_y = w_x − G_w/L^w;   w_z = (w_z + ην w_x − η G_w/(√L^w(√L^w + √L^β)))/(1 + ην)
        β_z = (β_z + ην β_x)/(1 + ην);   β_y = β_x (or kept: `unsampled_y`)
    else (every device):   G_m = ∇_{β_m} F(x) = (1/M) ∇_β f_m(x)
        β_y = β_x − G_m/L^β;   β_z = (β_z + ην β_x − η G_m/(√L^β(√L^w + √L^β)))/(1 + ην)
        w_z = (w_z + ην w_x)/(1 + ην);   w_y = w_x (or kept)

Typos of the printed Alg. 2 corrected: the w-update happens with probability p_w (it sits under "ξ = 0"), and
the β-step uses ∇_{β_m}F = (1/M)∇_β f_m for F's constant L^β. The problem's 𝓛^w, 𝓛^β (finite-sum component
constants, ≥ L^w, L^β) stand in for L^w, L^β. The un-sampled block moves without communication, so every
device runs the w-recursion; participation = "all" and the round's aggregation of G_w is the mean over the client
axis (an all-reduce), after which the w-block goes up as the round's message. Its parameters are the problem's
constants alone (no float hyperparameter): the runs of a batch share them.
"""
from __future__ import annotations

import math

import torch

from fedbench.algorithms.base import Upload, coin_flips_to_success
from fedbench.algorithms.pfl_rules import BlockMethod, zeros_beta, zeros_w
from fedbench.hparams import Param


class ACDPFL(BlockMethod):
    name = "acd_pfl"
    title = "ACD-PFL"
    # A w-update all-reduces the devices' full w-gradients: each device sends a d_w-vector, and then computes the
    # w-block itself (`replicated`)
    uploads = (Upload("w", all_reduced=True),)
    replicated = ("w_z",)
    keeps = ("beta", "beta_z")
    requires = frozenset({"block_objective", "full_data"})
    hparams = (Param("unsampled_y", "choice", "x", "y of the block not updated: its x (textbook ACD) or kept",
                     choices=("x", "keep")),)

    def derive(self, hp):
        """Thm 7's parameters: constants of the problem, the same for every run."""
        c = self.problem.constants
        root_w, root_beta = math.sqrt(c.smooth_w), math.sqrt(c.smooth_beta)
        nu = c.mu / (root_w + root_beta) ** 2
        theta = (math.sqrt(nu**2 + 4 * nu) - nu) / 2
        eta = 1 / theta
        return {"theta": theta, "eta_nu": eta * nu, "one_plus_eta_nu": 1 + eta * nu,
                "p_w": root_w / (root_w + root_beta), "step_w": 1 / c.smooth_w, "step_beta": 1 / c.smooth_beta,
                "mirror_w": eta / (root_w * (root_w + root_beta)),
                "mirror_beta": eta / (root_beta * (root_w + root_beta))}

    def round_length(self, local_steps, gen):
        return coin_flips_to_success(self.hp.p_w, gen)

    def init_server(self, w0):
        return {"w": zeros_w(self.problem), "w_z": zeros_w(self.problem)}

    def init_clients(self, w0, num_clients):
        return {"beta": zeros_beta(self.problem, num_clients), "beta_z": zeros_beta(self.problem, num_clients)}

    def client_init(self, server, rows, rnd, hp):
        return {**server, **rows}

    def sampled(self, x, z, gradient, step, mirror, hp):
        """(y, z) of the block that takes the gradient step."""
        return x - step * gradient, (z + hp.eta_nu * x - mirror * gradient) / hp.one_plus_eta_nu

    def unsampled(self, x, y, z, hp):
        return (x if hp.unsampled_y == "x" else y), (z + hp.eta_nu * x) / hp.one_plus_eta_nu

    def client_step(self, local, batches, rnd, hp):
        problem = self.problem
        w_x = local["w"] + hp.theta * (local["w_z"] - local["w"])  # [R, 1, d_w]
        beta_x = local["beta"] + hp.theta * (local["beta_z"] - local["beta"])  # [R, M, d_β]
        everyone = torch.arange(beta_x.shape[1], device=beta_x.device)
        g_w, g_beta = problem.client_block_grads(w_x, beta_x, everyone)
        if rnd.is_last_step:  # the w-update: G_w all-reduced over the devices
            w, w_z = self.sampled(w_x, local["w_z"], g_w.mean(1, keepdim=True), hp.step_w, hp.mirror_w, hp)
            beta, beta_z = self.unsampled(beta_x, local["beta"], local["beta_z"], hp)
        else:
            beta, beta_z = self.sampled(beta_x, local["beta_z"], problem.beta_scale * g_beta, hp.step_beta,
                                        hp.mirror_beta, hp)
            w, w_z = self.unsampled(w_x, local["w"], local["w_z"], hp)
        return {"w": w, "w_z": w_z, "beta": beta, "beta_z": beta_z}

    def server_update(self, server, message, weights, rnd, hp):
        return dict(message)  # the w-block every device holds after the round's all-reduce
