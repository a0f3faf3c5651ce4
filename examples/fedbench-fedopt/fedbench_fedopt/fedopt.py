"""The adaptive server optimizers of Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan, "Adaptive
Federated Optimization" (ICLR 2021), Algorithm 2: clients run local SGD; the server takes the clients' average
change as a pseudo-gradient and steps along its first moment, scaled per coordinate by its second moment.

    initialization:  x_0 (the problem's);  m_{-1} = 0;  v_{-1} = τ²
    round t, each sampled client i ∈ S:
        x_{i,0} = x_t;   x_{i,k+1} = x_{i,k} − η_l g_{i,k},  k = 0 … K−1      g_{i,k}: minibatch gradient [+ ∂h]
        Δ_i = x_{i,K} − x_t                                                     (uploaded)
    server:
        Δ_t = Σ_{i∈S} π_i Δ_i                           the paper's 1/|S|: the federation's `aggregation: uniform`
        m_t = β1 m_{t−1} + (1 − β1) Δ_t
        v_t = second_moment(v_{t−1}, Δ_t²)              FedAdam, FedYogi: the subclasses (squares are per coordinate)
        x_{t+1} = x_t + η m_t / (√v_t + τ)

Choices where the paper leaves one open: Algorithm 2 asks v_{−1} ≥ τ² and we take v_{−1} = τ²; m_{−1} = 0; there
is no bias correction (Algorithm 2 has none). Defaults are the paper's: β1 = 0.9, β2 = 0.99, τ = 1e-3 (τ sets the
adaptivity: the smaller, the more adaptive; the paper tunes it with η and η_l). β2 = 1 is allowed as a degenerate
point outside the paper's [0, 1): v then stays τ², and the server step is η m_t / (2τ), FedAvg with server momentum
(with β1 = 0 and η = 2τ exactly FedAvg with server step 1, which the tests check). On a composite problem
(h ≠ 0, e.g. the Lasso) the local steps add a subgradient of h, as fedbench's FedAvg(∂) does (`subgradient`).
"""
from __future__ import annotations

from fedbench.algorithms.base import CLIENT_LR, Algorithm, Upload, aggregate, broadcast
from fedbench.hparams import Param


class FedOpt(Algorithm):
    """Algorithm 2 without its second-moment rule, which each subclass gives (`second_moment`). It has no `name`
    of its own, so it is no component: fedbench registers only its subclasses."""

    hparams = (
        CLIENT_LR,  # η_l
        Param("server_lr", "float", 1e-2, "server step size η", low=0, low_open=True, log=True),
        Param("beta1", "float", 0.9, "first-moment decay β1", low=0, high=1, high_open=True),
        Param("beta2", "float", 0.99, "second-moment decay β2 (1: v stays τ², no adaptivity)", low=0, high=1),
        Param("tau", "float", 1e-3, "adaptivity τ: added to √v_t, and v_{-1} = τ²", low=0, low_open=True, log=True),
        Param("subgradient", "bool", True, "add a subgradient of h to each local step (composite problems)"),
    )
    uploads = (Upload("delta"),)  # Δ_i = x_{i,K} − x_t, an update already

    def second_moment(self, v, delta_sq, hp):
        """v_t from v_{t−1} `v` and Δ_t² `delta_sq` (both `[R, 1, d]`)."""
        raise NotImplementedError

    def init_server(self, w0):
        return {"w": w0.clone(), "m": w0.new_zeros(w0.shape), "v": w0.new_full(w0.shape, self.hp.tau ** 2)}

    def client_init(self, server, rows, rnd, hp):
        return {"x": broadcast(server["w"], rnd), "x_t": server["w"]}

    def client_step(self, local, batches, rnd, hp):
        x = local["x"]
        g = batches.D.grad(x)
        if hp.subgradient and self.reg.lam:
            g = g + self.reg.subgradient(x)
        return {**local, "x": x - hp.client_lr * g}

    def client_final(self, local, rnd, hp):
        return {"delta": local["x"] - local["x_t"]}, {}

    def server_update(self, server, message, weights, rnd, hp):
        x, delta = server["w"], aggregate(message["delta"], weights)
        m = hp.beta1 * server["m"] + (1 - hp.beta1) * delta
        v = self.second_moment(server["v"], delta.square(), hp)
        return {"w": x + hp.server_lr * m / (v.sqrt() + hp.tau), "m": m, "v": v}
