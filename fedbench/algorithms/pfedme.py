"""pFedMe, personalized FL with Moreau envelopes (T Dinh, Tran, Nguyen, NeurIPS 2020, Algorithm 1; spec 000
§1.3, §2.3(d); spec 003 §3.7). Client i approximately solves the Moreau subproblem
θ_i(w) = argmin_θ f_i(θ) + h(θ) + (λ/2)‖θ − w‖² around its local copy and pulls the copy toward it:

    client i, round k:  w_loc ← w_k;  θ ← w_k
        for t = 0..R−1 (one minibatch D each):
            repeat K_in times:  θ ← θ − η_p (∇f̃(θ; D) + ∂h(θ) + λ(θ − w_loc) [+ 0.001·θ])
            w_loc ← w_loc − η λ (w_loc − θ)
        upload w_loc;   the personal model θ_i is the last θ
    server:  w ← (1 − β) w + β Σ π̂_i w_loc,i

θ starts at the round's w and is warm-started across the local steps, as the pFedMe code. Conventions:
* `h_mode`: the inner step uses a subgradient of h (spec 000's default for smooth-FL baselines) or, with
  `prox`, takes the step on the smooth part then prox_{η_p h};
* `hidden_decay`: the pFedMe code's pFedMeOptimizer adds 0.001·θ to the inner gradient (default off);
* sample-weighted averaging (the pFedMe code) is the federation's `aggregation: samples`; the default
  `uniform` is Algorithm 1 of the pFedFBE paper's comparison;
* personal models of unsampled clients at evaluation: `personal_eval: stale` keeps each client's last θ
  (w₀ before it is first sampled); `resolve` runs the K_in-step inner solver for every client from the
  current w on its full local data (spec 000 §2.3(d): the pFedMe code trains every client every round).
"""
from __future__ import annotations

import torch

from fedbench.algorithms.base import (H_MODE, Algorithm, aggregate, broadcast, composite_step, per_client_copies,
                                      per_run)
from fedbench.hparams import Param

HIDDEN_DECAY = 1e-3  # pFedMeOptimizer's default weight decay inside the inner step


class PFedMe(Algorithm):
    name = "pfedme"
    runs_axis = True
    run_hparams = ("client_lr", "personal_lr", "lam", "beta")
    personalized = True
    hparams = (
        Param("client_lr", "float", 0.005, "step η of the local copy toward θ", low=0, low_open=True, log=True),
        Param("personal_lr", "float", 0.09, "inner step size η_p", low=0, low_open=True, log=True),
        Param("lam", "float", 15.0, "Moreau weight λ (pFedMe's λ; None: the problem's mixture λ, spec 003 §3.7)",
              low=0, low_open=True, log=True, nullable=True),
        Param("inner_steps", "int", 5, "inner steps K_in per local step", low=1),
        Param("beta", "float", 1.0, "server mixing β (1: plain averaging)", low=0, low_open=True),
        H_MODE,
        Param("hidden_decay", "bool", False, "add the pFedMe code's 0.001·θ to the inner gradient"),
        Param("personal_eval", "choice", "stale", "unsampled clients' personal models at evaluation: their last θ, "
              "or re-solved from the current w on full data", choices=("stale", "resolve")),
    )

    @classmethod
    def requirements(cls, hp):
        return (super().requirements(hp) | ({"full_data"} if hp["personal_eval"] == "resolve" else set())
                | ({"mixture"} if hp["lam"] is None else set()))

    def __init__(self, problem, **hyperparameters):
        super().__init__(problem, **hyperparameters)
        if self.lam is None:
            self.lam = problem.mixture_penalty

    def init_clients(self, w0, num_clients):
        return {"theta": per_client_copies(w0, num_clients)}

    def client_init(self, server, rows, rnd):
        start = broadcast(server["w"], rnd)
        return {"w_loc": start, "theta": start.clone()}

    def inner_step(self, theta, anchor, grad):
        """One step on f(θ) + h(θ) + (λ/2)‖θ − anchor‖², `grad` ∇f(θ)."""
        direction = grad + per_run(self.lam, theta) * (theta - anchor)
        if self.hidden_decay:
            direction = direction + HIDDEN_DECAY * theta
        return composite_step(self.reg, self.h_mode, theta, direction, self.personal_lr)

    def client_step(self, local, batches, rnd, step):
        theta, w_loc = local["theta"], local["w_loc"]
        for _ in range(self.inner_steps):
            theta = self.inner_step(theta, w_loc, batches.D.grad(theta))
        pull = per_run(self.client_lr, w_loc) * per_run(self.lam, w_loc)
        return {"w_loc": w_loc - pull * (w_loc - theta), "theta": theta}

    def client_final(self, local, rnd):
        return {"w_loc": local["w_loc"]}, {"theta": local["theta"]}

    def server_update(self, server, message, weights, rnd):
        w = server["w"]
        beta = per_run(self.beta, w)
        return {"w": (1 - beta) * w + beta * aggregate(message["w_loc"], weights)}

    def personal_params(self, server, clients):
        if self.personal_eval == "stale":
            return clients["theta"]
        problem = self.problem
        everyone = torch.arange(problem.num_clients, device=server["w"].device)
        anchor = per_client_copies(server["w"], problem.num_clients)
        theta = anchor.clone()
        for _ in range(self.inner_steps):
            theta = self.inner_step(theta, anchor, problem.client_grad(theta, everyone))
        return theta
