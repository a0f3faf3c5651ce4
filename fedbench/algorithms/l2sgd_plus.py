"""L2SGD+ (Hanzely & Richtárik 2020, "Federated learning of a mixture of global and local models", Algorithm 2,
in its fixed version, see below), the baseline of Hanzely, Zhao, Kolar (TMLR 2023, §5.1) for their mixture
objective (9) min_X (1/M) Σ f'_m(x_m) + (λ/(2M)) Σ ‖x_m − x̄‖², on the devices' models x_m in natural variables:

    with probability 1 − p (local step, each device, one sample j):  γ = ∇f'_{m,j}(x_m)
        g_m = (γ − J_m[j])/(M(1 − p)) + (1/(Mn)) Σ_l J_m[l] + Ψ_m/M;   x_m ← x_m − α g_m;   J_m[j] ← γ
    with probability p (averaging step, a communication round):  x̄ = (1/M) Σ x_m
        g_m = (λ/(Mp))(x_m − x̄) − ((1/p − 1)/M) Ψ_m + (1/(Mn)) Σ_l J_m[l];   x_m ← x_m − α g_m
        Ψ_m ← λ(x_m − x̄) at the x_m used (the paper) or the updated one (the code; `psi`)

J_m is a SAGA table of raw per-sample gradients (not divided by M: the two lines commit 8f32ac3 deleted from the
authors' code made the stored curves converge to a wrong point). The losses are linear models' (logistic,
softmax), whose sample gradient is its residual ∂ℓ/∂outputs (k numbers) times its features: the table stores the
residuals, n·k numbers a device instead of n·d (15x fewer on S1, 785x on the image problems), and
γ − J_m[j] = (r − r_j)·x_j with the sample's own features. α and p default to ASVRCD's η and p_w on the
problem (as Hanzely, Zhao, Kolar set them, §5.1), λ is the problem's. A round is the local steps up to and
including the next averaging step; its x̄ is the mean over the client axis (participation = "all", an
all-reduce). The row's global model is the devices' mean, so that the objective evaluated is (9) at X. α, p and
the factors of g_m that follow from them are each run's own (`derive`).
"""
from __future__ import annotations

import torch

from fedbench.algorithms.base import Algorithm, Upload, coin_flips_to_success
from fedbench.algorithms.pfl_rules import rules
from fedbench.hparams import Param
from fedbench.oracle import Minibatch


class L2SGDPlus(Algorithm):
    name = "l2sgd_plus"
    title = "L2SGD+"
    personalized = True
    requires = frozenset({"mixture", "linear_model"})
    participation = "all"
    # The averaging step's all-reduce: each device sends its x_m (d floats); x̄ becomes the server's w
    uploads = (Upload("w", all_reduced=True),)
    keeps = ("x", "table", "table_mean", "psi")
    hparams = (
        Param("eta", "float", None, "step size α (None: ASVRCD's η on the problem)", low=0, low_open=True,
              log=True, nullable=True),
        Param("p", "float", None, "averaging probability (None: ASVRCD's p_w on the problem)", low=0, high=1,
              low_open=True, nullable=True),
        Param("psi", "choice", "paper", "Ψ_m after averaging from the x_m used (paper) or the updated one (code)",
              choices=("paper", "code")),
    )

    def derive(self, hp):
        theory, devices, lam = rules(self.problem), self.problem.num_clients, self.problem.mixture_penalty
        prob = theory.p_w if hp.p is None else hp.p
        return {"alpha": theory.eta if hp.eta is None else hp.eta, "prob": prob,
                "local_divisor": devices * (1 - prob),  # M(1 − p)
                "pull_gain": lam / (devices * prob),  # λ/(Mp)
                "psi_gain": (1 / prob - 1) / devices}  # (1/p − 1)/M

    @classmethod
    def minibatches(cls, hp):
        return (Minibatch("D", size=1),)  # one index j per device, the SAGA table's entry

    def round_length(self, local_steps, gen):
        return coin_flips_to_success(self.hp.prob, gen)

    def init_clients(self, w0, num_clients):
        models = w0.expand(num_clients, -1).clone()
        residuals = models.new_zeros(num_clients, self.problem.max_size, self.problem.base.residual_width)
        return {"x": models, "table": residuals,
                "table_mean": torch.zeros_like(models), "psi": torch.zeros_like(models)}

    def client_init(self, server, rows, rnd, hp):
        return dict(rows)

    def client_step(self, local, batches, rnd, hp):
        x, table, table_mean, psi = local["x"], local["table"], local["table_mean"], local["psi"]  # x `[R, M, d]`
        devices, lam = x.shape[1], self.problem.mixture_penalty
        if rnd.is_last_step:  # the averaging step
            x_bar = x.mean(1, keepdim=True)
            g = hp.pull_gain * (x - x_bar) - hp.psi_gain * psi + table_mean / devices
            x_new = x - hp.alpha * g
            return {**local, "x": x_new, "psi": lam * ((x if hp.psi == "paper" else x_new) - x_bar)}
        oracle = batches.D
        sample = oracle.rows[..., 0] - self.problem.client_offsets[rnd.clients]  # j_m of each device `[R, M]`
        entry = sample[..., None, None].expand(*sample.shape, 1, table.shape[-1])  # its row of the device's table
        residual = oracle.residuals(x)  # [R, M, 1, k]: γ = ∇f'_{m,j}(x_m) is residual ⊗ x_j
        delta = oracle.grad_of_residuals(residual - table.gather(-2, entry))  # γ − J_m[j]
        g = delta / hp.local_divisor + (table_mean + psi) / devices
        table.scatter_(-2, entry, residual)  # in place: the round's table, which client_final hands back
        return {**local, "x": x - hp.alpha * g, "table_mean": table_mean + delta / table.shape[-2]}

    def client_final(self, local, rnd, hp):
        return {"w": local["x"].mean(1, keepdim=True)}, {k: local[k] for k in self.keeps}

    def server_update(self, server, message, weights, rnd, hp):
        return dict(message)

    def personal_params(self, server, clients):
        return clients["x"]
