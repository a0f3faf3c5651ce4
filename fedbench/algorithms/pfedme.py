"""pFedMe, personalized FL with Moreau envelopes (T Dinh, Tran, Nguyen, NeurIPS 2020, Algorithm 1), a baseline
of the pFedFBE paper (ICLR 2023 submission, §2 eqs. (2)–(3), §4) and of Hanzely, Zhao, Kolar (TMLR 2023, §5.1).
Client i approximately solves the Moreau subproblem
θ_i(w) = argmin_θ f_i(θ) + h(θ) + (λ/2)‖θ − w‖² around its local copy and pulls the copy toward it:

    client i, round k:  w_loc ← w_k;  θ ← w_k
        for t = 0..R−1 (one minibatch D each):
            repeat K_in times:  θ ← θ − η_p (∇f̃(θ; D) + ∂h(θ) + λ(θ − w_loc) [+ 0.001·θ])
            w_loc ← w_loc − η λ (w_loc − θ)
        upload w_loc;   the personal model θ_i is the last θ
    server:  w ← (1 − β) w + β Σ π̂_i w_loc,i

θ is warm-started across the local steps. Where the official pFedMe code (github.com/CharlieDinh/pFedMe) and the
pFedMe of the released code of Hanzely, Zhao, Kolar (`Synthetic/MX2/pFedMe.py`, the MX2 code) part, a
hyperparameter says which:
* `theta_start`: θ starts each round at the round's w (`round`: the pFedMe code), or where the device's last
  round left it (`carried`: the MX2 code, whose θ starts at 0 and is warm-started across rounds);
* `minibatch`: ∇f̃(θ; D) averages D's rows as drawn, with replacement, a repeated row counted each time
  (`drawn`), or its distinct rows only (`distinct`: the MX2 code draws with replacement then dedups with set(...));
  computed from the rows' residuals (a linear model's loss, `linear_model`), the repeats weighted 0.
Other conventions:
* `h_mode`: the inner step uses a subgradient of h (as the pFedFBE paper, §1, extends smooth-FL methods) or, with
  `prox`, takes the step on the smooth part then prox_{η_p h};
* `hidden_decay`: the pFedMe code's pFedMeOptimizer adds 0.001·θ to the inner gradient (default off);
* sample-weighted averaging (the pFedMe code) is the federation's `aggregation: samples`; the default
  `uniform` is Algorithm 1 of the pFedFBE paper's comparison;
* personal models of unsampled clients at evaluation: `personal_eval: stale` keeps each client's last θ
  (w₀ before it is first sampled); `resolve` runs the K_in-step inner solver for every client from the
  current w on its full local data (as in the pFedMe code, which trains every client every round).

λ is `hp.moreau_lam` (`derive`: the declared λ, or the problem's mixture λ), and the pull η λ of the local copy is
derived once per run (`hp.pull`).
"""
from __future__ import annotations

import torch

from fedbench.algorithms.base import (
    H_MODE,
    Algorithm,
    HParams,
    Upload,
    aggregate,
    broadcast,
    composite_step,
    per_client_copies,
)
from fedbench.hparams import Param

HIDDEN_DECAY = 1e-3  # pFedMeOptimizer's default weight decay inside the inner step


class PFedMe(Algorithm):
    name = "pfedme"
    title = "pFedMe"
    uploads = (Upload("w_loc", relative_to="w"),)  # the local model after the personalized steps
    keeps = ("theta",)  # the personal model θ_i
    personalized = True
    hparams = (
        Param("client_lr", "float", 0.005, "step η of the local copy toward θ", low=0, low_open=True, log=True),
        Param("personal_lr", "float", 0.09, "inner step size η_p", low=0, low_open=True, log=True),
        Param("lam", "float", 15.0, "Moreau weight λ (pFedMe's λ; None: the problem's mixture λ, as in Hanzely "
              "et al. §5.1)", low=0, low_open=True, log=True, nullable=True),
        Param("inner_steps", "int", 5, "inner steps K_in per local step", low=1),
        Param("beta", "float", 1.0, "server mixing β (1: plain averaging)", low=0, low_open=True),
        H_MODE,
        Param("hidden_decay", "bool", False, "add the pFedMe code's 0.001·θ to the inner gradient"),
        Param("personal_eval", "choice", "stale", "unsampled clients' personal models at evaluation: their last θ, "
              "or re-solved from the current w on full data", choices=("stale", "resolve")),
        Param("theta_start", "choice", "round", "θ at a round's start: the round's w (the pFedMe code) or "
              "the device's θ as its last round left it (Hanzely et al.'s MX2 code)", choices=("round", "carried")),
        Param("minibatch", "choice", "drawn", "∇f̃(θ; D) over D's rows as drawn, repeats counted, or over "
              "its distinct rows (Hanzely et al.'s MX2 code dedups)", choices=("drawn", "distinct")),
    )

    @classmethod
    def requirements(cls, hp):
        return (super().requirements(hp) | ({"full_data"} if hp["personal_eval"] == "resolve" else set())
                | ({"mixture"} if hp["lam"] is None else set())
                | ({"linear_model"} if hp["minibatch"] == "distinct" else set()))

    def derive(self, hp):
        lam = float(self.problem.mixture_penalty) if hp.lam is None else hp.lam
        return {"moreau_lam": lam, "pull": hp.client_lr * lam}  # λ, and η λ of the local copy's step

    def init_clients(self, w0, num_clients):
        return {"theta": per_client_copies(w0, num_clients)}

    def client_init(self, server, rows, rnd, hp):
        start = broadcast(server["w"], rnd)
        return {"w_loc": start, "theta": rows["theta"] if hp.theta_start == "carried" else start.clone()}

    def inner_step(self, theta, anchor, grad, hp: HParams):
        """One step on f(θ) + h(θ) + (λ/2)‖θ − anchor‖², `grad` ∇f(θ), with the runs' values `hp` (one run's
        own, `self.hp`, on its `[N, d]` without the run axis)."""
        direction = grad + hp.moreau_lam * (theta - anchor)
        if hp.hidden_decay:
            direction = direction + HIDDEN_DECAY * theta
        return composite_step(self.reg, hp.h_mode, theta, direction, hp.personal_lr)

    def minibatch_gradient(self, oracle, hp):
        """θ ↦ ∇f̃(θ; D): the mean over D's rows as drawn, or over its distinct rows (`minibatch`)."""
        if hp.minibatch == "drawn":
            return oracle.grad
        weights = distinct_weights(oracle.rows, self.problem.dtype)
        return lambda theta: oracle.grad_of_residuals(oracle.residuals(theta) * weights)

    def client_step(self, local, batches, rnd, hp):
        theta, w_loc = local["theta"], local["w_loc"]
        gradient = self.minibatch_gradient(batches.D, hp)
        for _ in range(hp.inner_steps):
            theta = self.inner_step(theta, w_loc, gradient(theta), hp)
        return {"w_loc": w_loc - hp.pull * (w_loc - theta), "theta": theta}

    def server_update(self, server, message, weights, rnd, hp):
        w = server["w"]
        return {"w": (1 - hp.beta) * w + hp.beta * aggregate(message["w_loc"], weights)}

    def personal_params(self, server, clients):
        if self.hp.personal_eval == "stale":
            return clients["theta"]
        problem = self.problem
        everyone = torch.arange(problem.num_clients, device=server["w"].device)
        anchor = per_client_copies(server["w"], problem.num_clients)
        theta = anchor.clone()
        for _ in range(self.hp.inner_steps):
            theta = self.inner_step(theta, anchor, problem.client_grad(theta, everyone), self.hp)
        return theta


def distinct_weights(rows, dtype):
    """Weights `[..., b, 1]` of a minibatch's rows `[..., b]` that turn the mean over its b rows into the mean over
    its distinct rows: b / (distinct rows) at each row's first occurrence, 0 at its repeats."""
    order = rows.argsort(-1)
    ranked = rows.gather(-1, order)
    first = torch.ones(rows.shape, dtype=dtype, device=rows.device)
    first[..., 1:] = (ranked[..., 1:] != ranked[..., :-1]).to(dtype)
    weights = first * (rows.shape[-1] / first.sum(-1, keepdim=True))
    return torch.zeros_like(weights).scatter(-1, order, weights).unsqueeze(-1)
