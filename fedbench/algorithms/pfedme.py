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

λ is `hp.moreau_lam` (`derive`: the declared λ, or the problem's mixture λ), and the pull η λ of the local copy is
derived once per run (`hp.pull`).
"""
from __future__ import annotations

import torch

from fedbench.algorithms.base import H_MODE, Algorithm, HParams, aggregate, broadcast, composite_step, per_client_copies
from fedbench.hparams import Param

HIDDEN_DECAY = 1e-3  # pFedMeOptimizer's default weight decay inside the inner step


class PFedMe(Algorithm):
    name = "pfedme"
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

    def derive(self, hp):
        lam = float(self.problem.mixture_penalty) if hp.lam is None else hp.lam
        return {"moreau_lam": lam, "pull": hp.client_lr * lam}  # λ, and η λ of the local copy's step

    def init_clients(self, w0, num_clients):
        return {"theta": per_client_copies(w0, num_clients)}

    def client_init(self, server, rows, rnd, hp):
        start = broadcast(server["w"], rnd)
        return {"w_loc": start, "theta": start.clone()}

    def inner_step(self, theta, anchor, grad, hp: HParams):
        """One step on f(θ) + h(θ) + (λ/2)‖θ − anchor‖², `grad` ∇f(θ), with the runs' values `hp` (one run's
        own, `self.hp`, on its `[N, d]` without the run axis)."""
        direction = grad + hp.moreau_lam * (theta - anchor)
        if hp.hidden_decay:
            direction = direction + HIDDEN_DECAY * theta
        return composite_step(self.reg, hp.h_mode, theta, direction, hp.personal_lr)

    def client_step(self, local, batches, rnd, hp):
        theta, w_loc = local["theta"], local["w_loc"]
        for _ in range(hp.inner_steps):
            theta = self.inner_step(theta, w_loc, batches.D.grad(theta), hp)
        return {"w_loc": w_loc - hp.pull * (w_loc - theta), "theta": theta}

    def client_final(self, local, rnd, hp):
        return {"w_loc": local["w_loc"]}, {"theta": local["theta"]}

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
