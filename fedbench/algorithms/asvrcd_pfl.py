"""ASVRCD-PFL, accelerated variance-reduced coordinate descent on (w, β) (Hanzely, Zhao, Kolar, TMLR 2023, §4.3,
Algorithm 4 with the parameters of Theorems 8/9). One sample j_m per device per iteration, the same at x and v:

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
round's message. Thm 8/9's parameters are each run's own (`derive`: `hp.rules`), so the runs of a batch may
differ in p_w, η and ρ; the coins are each run's own draws (`rnd.draw`) and decide in Python which blocks move, so
the engine ends rounds one run at a time (`draws_at_round_end`), and with the CV code's counting, whose ρ-coin is
flipped at every iteration, runs one run a program (`draws_in_steps`).
"""
from __future__ import annotations

import torch

from fedbench.algorithms.base import Upload, coin_flips_to_success
from fedbench.algorithms.pfl_rules import ETA, P_W, RHO, BlockMethod, rules, zeros_beta, zeros_w
from fedbench.hparams import Param

W_BLOCK = ("w", "w_z", "w_v", "w_gv")  # y, z, v and ∇_w F(v) of the global block
BETA_BLOCK = ("beta", "beta_z", "beta_v", "beta_gv")


class ASVRCDPFL(BlockMethod):
    name = "asvrcd_pfl"
    title = "ASVRCD-PFL"
    # A round's all-reduce (of the control-variate differences at ζ = w, of ∇_w f_m(v) at a refresh): each device
    # sends a d_w-vector, then computes the w-block itself (`replicated`)
    uploads = (Upload("w", all_reduced=True),)
    replicated = W_BLOCK[1:]
    keeps = BETA_BLOCK
    requires = frozenset({"block_objective", "full_data"})
    hparams = (P_W, ETA, RHO, Param("count_refresh", "bool", True, "a refresh of v ends a communication round (the "
                                    "authors' synthetic code) or happens inside one (their CV code)"))
    draws_at_round_end = True  # the refresh and ζ coins (`coins`), branched on in Python

    @classmethod
    def draws_in_steps(cls, hp):
        return not hp["count_refresh"]  # a ρ-coin at every iteration

    def derive(self, hp):
        r = rules(self.problem, hp.p_w, hp.eta, hp.rho)
        # a round ends at ζ = w, or at a refresh too when refreshes count as communications
        any_event = 1 - (1 - r.rho) * (1 - r.p_w) if hp.count_refresh else r.p_w
        return {"rules": r, "any_event": any_event, "refresh_given_event": r.rho / any_event,
                "theta_y": 1 - r.theta1 - r.theta2,  # x's weight on y
                "beta_gain": self.problem.beta_scale / r.p_beta}  # (1/p_β)·∇_{β_m}F's scale

    # -- coins ---------------------------------------------------------------------------------------
    def round_length(self, local_steps, gen):
        return coin_flips_to_success(self.hp.any_event, gen)

    @staticmethod
    def coin(rnd, probability) -> bool:
        """A `probability`-coin on the run's own stream (the draw in float32, as `torch.rand` gives it). The
        engine draws these one run at a time (`draws_at_round_end`, `draws_in_steps`): `probability` is `[1, 1, 1]`,
        on the problem's device, brought to the host draw's (the branch on it is in Python anyway)."""
        u = rnd.draw(lambda gen: torch.rand((), generator=gen))
        return bool(u < probability.view(-1).to(u))

    def coins(self, rnd, hp) -> tuple[bool, bool]:
        """(refresh, ζ = w) of this iteration. Counting refreshes, only the round's last iteration has an event,
        drawn given that one happened; else refreshes are ρ-coins at every iteration and ζ = w ends the round."""
        last = rnd.is_last_step
        if not hp.count_refresh:
            return self.coin(rnd, hp.rules.rho), last
        if not last:
            return False, False
        refresh = self.coin(rnd, hp.refresh_given_event)
        return refresh, (not refresh) or self.coin(rnd, hp.rules.p_w)

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

    def client_init(self, server, rows, rnd, hp):
        return {**server, **rows}

    def couple(self, y, z, v, hp):
        """x = θ1 z + θ2 v + (1 − θ1 − θ2) y."""
        return hp.rules.theta1 * z + hp.rules.theta2 * v + hp.theta_y * y

    def accelerated_step(self, x, z, g, rules):
        """y' = x − ηg, z' = νz + (1 − ν)x + (γ/η)(y' − x) = lerp(x, z, ν) − γg."""
        return (torch.addcmul(x, rules.eta, g, value=-1),
                torch.addcmul(torch.lerp(x, z, rules.nu), rules.gamma, g, value=-1))

    # -- one iteration ---------------------------------------------------------------------------------------
    def client_step(self, local, batches, rnd, hp):
        refresh, update_w = self.coins(rnd, hp)
        s = dict(local)
        w_x = self.couple(s["w"], s["w_z"], s["w_v"], hp)
        beta_x = self.couple(s["beta"], s["beta_z"], s["beta_v"], hp)
        if refresh:
            s.update(self.refresh(s["w"], s["beta"]))
        r, oracle = hp.rules, batches.D
        gx_w, gx_beta = oracle.block_grads(w_x, beta_x, need_w=update_w)
        gv_w, gv_beta = oracle.block_grads(s["w_v"], s["beta_v"], need_w=update_w)
        if update_w:  # the all-reduce of the devices' control-variate differences
            g_w, g_beta = (gx_w - gv_w).mean(1, keepdim=True) / r.p_w + s["w_gv"], s["beta_gv"]
        else:
            g_w, g_beta = s["w_gv"], hp.beta_gain * (gx_beta - gv_beta) + s["beta_gv"]
        s["w"], s["w_z"] = self.accelerated_step(w_x, s["w_z"], g_w, r)
        s["beta"], s["beta_z"] = self.accelerated_step(beta_x, s["beta_z"], g_beta, r)
        return s

    def refresh(self, w, beta) -> dict:
        """v ← y and ∇F(v) on every device's full data (w `[R, 1, d_w]`, β `[R, M, d_β]`); ∇_w F(v) is the
        all-reduced mean."""
        everyone = torch.arange(beta.shape[1], device=beta.device)
        g_w, g_beta = self.problem.client_block_grads(w, beta, everyone)
        return {"w_v": w, "w_gv": g_w.mean(1, keepdim=True),
                "beta_v": beta, "beta_gv": self.problem.beta_scale * g_beta}

    def server_update(self, server, message, weights, rnd, hp):
        return dict(message)  # the w-block every device holds after the round's all-reduce
