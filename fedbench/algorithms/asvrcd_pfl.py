"""ASVRCD-PFL, accelerated variance-reduced coordinate descent on (w, β) (Hanzely, Zhao, Kolar, Algorithm 4 with
the parameters of Theorems 8/9; spec 003 §3.3). One sample j_m per device per iteration, the same at x and v:

    x = θ1 z + θ2 v + (1 − θ1 − θ2) y                                           (both blocks)
    with probability ρ: v ← y, recompute ∇F(v)           (the code flips this coin first, before g, x from the old v)
    ζ = w with probability p_w:
        g_w = (1/p_w)(1/M) Σ_m [∇_w f_{m,j}(x) − ∇_w f_{m,j}(v)] + ∇_w F(v);   g_m = ∇_{β_m} F(v)
    else:
        g_w = ∇_w F(v);   g_m = (1/p_β)(1/M)[∇_β f_{m,j}(x) − ∇_β f_{m,j}(v)] + ∇_{β_m} F(v)
    y' = x − η g;   z' = ν z + (1 − ν) x + (γ/η)(y' − x)                        (both blocks, every iteration)

(Alg. 3's Z-update with Y^{k+1} − Y^k is a typo; Alg. 4 and the code use y' − x.) Both blocks move every
iteration; the un-sampled one by the cached ∇F(v) alone, which needs no communication, so every device runs
the w-recursion itself. A communication is an iteration that aggregates over devices: ζ = w, and (with
`count_refresh`, the synthetic code) a refresh, whose ∇_w F(v) is a full aggregation; the CV code counts only
ζ = w, and its refreshes then happen inside rounds. participation = "all": the round's aggregation is the mean
over the client axis (an all-reduce), after which every device holds the same w-block, which goes up as the
round's message.
"""
from __future__ import annotations

import torch

from fedbench.algorithms.base import add_scaled, coin_flips_to_success, per_run
from fedbench.algorithms.pfl_rules import ETA, P_W, RHO, BlockMethod, rules, zeros_beta, zeros_w
from fedbench.hparams import Param

W_BLOCK = ("w", "w_z", "w_v", "w_gv")  # y, z, v and ∇_w F(v) of the global block
BETA_BLOCK = ("beta", "beta_z", "beta_v", "beta_gv")


class ASVRCDPFL(BlockMethod):
    name = "asvrcd_pfl"
    requires = frozenset({"block_objective", "full_data"})
    hparams = (P_W, ETA, RHO, Param("count_refresh", "bool", True, "a refresh of v ends a communication round (the "
                                    "synthetic code, §3.0) or happens inside one (the CV code)"))

    runs_axis = True
    draws_at_round_end = True  # the refresh and ζ coins (`coins`)
    run_hparams = ("p_w", "eta", "rho")
    run_derived = ("rules",)  # the coins (`any_event`) are drawn by each run's own algorithm, at its round's end

    @classmethod
    def batchable_runs(cls, hp):
        return hp["count_refresh"]  # else a ρ-coin at every iteration, drawn inside the batched steps

    def __init__(self, problem, **hyperparameters):
        super().__init__(problem, **hyperparameters)
        self.rules = rules(problem, self.p_w, self.eta, self.rho)
        r = self.rules
        self.any_event = 1 - (1 - r.rho) * (1 - r.p_w) if self.count_refresh else r.p_w

    # -- coins ---------------------------------------------------------------------------------------
    def round_length(self, local_steps, gen):
        return coin_flips_to_success(self.any_event, gen)

    def coins(self, rnd, step) -> tuple[bool, bool]:
        """(refresh, ζ = w) of this iteration. Counting refreshes, only the round's last iteration has an event,
        drawn given that one happened; else refreshes are ρ-coins at every iteration and ζ = w ends the round."""
        r, last = self.rules, step == rnd.local_steps - 1
        if not self.count_refresh:
            return bool(torch.rand((), generator=rnd.gen) < r.rho), last
        if not last:
            return False, False
        refresh = bool(torch.rand((), generator=rnd.gen) < r.rho / self.any_event)
        return refresh, (not refresh) or bool(torch.rand((), generator=rnd.gen) < r.p_w)

    # -- state -----------------------------------------------------------------------------------------
    def init_server(self, w0):
        problem = self.problem
        w, everyone = zeros_w(problem), torch.arange(problem.num_clients, device=problem.device)
        g_w, _ = problem.client_block_grads(w, zeros_beta(problem, problem.num_clients), everyone)
        return {"w": w, "w_z": w.clone(), "w_v": w.clone(), "w_gv": g_w.mean(0)}

    def init_clients(self, w0, num_clients):
        problem = self.problem
        beta, everyone = zeros_beta(problem, num_clients), torch.arange(num_clients, device=problem.device)
        _, g_beta = problem.client_block_grads(zeros_w(problem), beta, everyone)
        return {"beta": beta, "beta_z": beta.clone(), "beta_v": beta.clone(), "beta_gv": problem.beta_scale * g_beta}

    def client_init(self, server, rows, rnd):
        return {**server, **rows}

    def couple(self, y, z, v):
        theta1, theta2 = per_run(self.rules.theta1, y), per_run(self.rules.theta2, y)
        return theta1 * z + theta2 * v + (1 - theta1 - theta2) * y

    def accelerated_step(self, x, z, g):
        """y' = x − ηg, z' = νz + (1 − ν)x + (γ/η)(y' − x) = lerp(x, z, ν) − γg."""
        r = self.rules
        return add_scaled(x, -r.eta, g), add_scaled(torch.lerp(x, z, per_run(r.nu, x)), -r.gamma, g)

    # -- one iteration ---------------------------------------------------------------------------------------
    def client_step(self, local, batches, rnd, step):
        refresh, update_w = self.coins(rnd, step)
        s = dict(local)
        w_x = self.couple(s["w"], s["w_z"], s["w_v"])
        beta_x = self.couple(s["beta"], s["beta_z"], s["beta_v"])
        if refresh:
            s.update(self.refresh(s["w"], s["beta"]))
        r, oracle, scale = self.rules, batches.D, self.problem.beta_scale
        gx_w, gx_beta = oracle.block_grads(w_x, beta_x, need_w=update_w)
        gv_w, gv_beta = oracle.block_grads(s["w_v"], s["beta_v"], need_w=update_w)
        if update_w:  # the all-reduce of the devices' control-variate differences
            g_w, g_beta = (gx_w - gv_w).mean(0) / r.p_w + s["w_gv"], s["beta_gv"]
        else:
            g_w, g_beta = s["w_gv"], (scale / per_run(r.p_beta, gx_beta)) * (gx_beta - gv_beta) + s["beta_gv"]
        s["w"], s["w_z"] = self.accelerated_step(w_x, s["w_z"], g_w)
        s["beta"], s["beta_z"] = self.accelerated_step(beta_x, s["beta_z"], g_beta)
        return s

    def refresh(self, w, beta) -> dict:
        """v ← y and ∇F(v) on every device's full data; ∇_w F(v) is the all-reduced mean."""
        g_w, g_beta = self.problem.client_block_grads(w, beta, torch.arange(len(beta), device=beta.device))
        return {"w_v": w, "w_gv": g_w.mean(0), "beta_v": beta, "beta_gv": self.problem.beta_scale * g_beta}

    def client_final(self, local, rnd):
        return {k: local[k] for k in W_BLOCK}, {k: local[k] for k in BETA_BLOCK}

    def server_update(self, server, message, weights, rnd):
        return dict(message)  # the w-block every device holds after the round's all-reduce
