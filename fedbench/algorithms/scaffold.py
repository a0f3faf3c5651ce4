"""SCAFFOLD, stochastic controlled averaging (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020,
Algorithm 1): local steps corrected by control variates, the server's c and each client's c_i, which estimate
the clients' drift from the global update direction.

    client i ∈ S, round r:  y_i ← x
        repeat K times:  y_i ← y_i − η_l (g_i(y_i) + ∂h(y_i) − c_i + c)                  (Alg. 1 line 10)
        c_i⁺ ← g_i(x) on the client's whole data                     (option I, line 12: an extra pass)
             or c_i − c + (x − y_i)/(K η_l)                          (option II, line 12: no extra gradient)
        upload Δy_i = y_i − x,  Δc_i = c_i⁺ − c_i;   c_i ← c_i⁺                         (lines 13–14)
    server:  x ← x + η_g Σ_i π̂_i Δy_i;   c ← c + (1/N) Σ_{i∈S} Δc_i                    (lines 16–17)

g_i is the minibatch gradient of the smooth part; ∂h a subgradient of the regularizer (none where h = 0, the
paper's setting; `subgradient: false` drops it as FedAvg's flag does). π̂ is the federation's aggregation (the
paper's plain mean 1/|S| is `uniform`, the default). The control variates start at 0 (c = 0, c_i = 0); c_i is
per-client state `[N, d]`, so SCAFFOLD keeps one model-sized vector per client. Where clients take uneven local work
(`fedbench.axes.participation`), K in option II is each client's own number of steps K_i.
"""
from __future__ import annotations

from fedbench.algorithms.base import CLIENT_LR, SERVER_LR, Algorithm, Upload, aggregate, broadcast
from fedbench.hparams import Param


class SCAFFOLD(Algorithm):
    name = "scaffold"
    title = "SCAFFOLD"
    hparams = (
        CLIENT_LR,
        SERVER_LR,
        Param("control", "choice", "II", "client control update: I, the full-data gradient at the server model; "
              "II, c_i − c + (x − y_i)/(K η_l)", choices=("I", "II")),
        Param("subgradient", "bool", True, "add a subgradient of h to each local step"),
    )
    downloads = ("w", "c")
    uploads = (Upload("dy", update_of="w"), Upload("dc"))  # Δy_i and Δc_i (Alg. 1 line 13): updates already
    keeps = ("c",)

    @classmethod
    def requirements(cls, hp):
        return super().requirements(hp) | ({"full_data"} if hp["control"] == "I" else set())

    def init_server(self, w0):
        return {"w": w0.clone(), "c": w0.new_zeros(w0.shape)}

    def init_clients(self, w0, num_clients):
        return {"c": w0.new_zeros(num_clients, *w0.shape)}

    def client_init(self, server, rows, rnd, hp):
        return {"y": broadcast(server["w"], rnd), "x": server["w"], "c": server["c"], "c_i": rows["c"]}

    def client_step(self, local, batches, rnd, hp):
        y = local["y"]
        direction = batches.D.grad(y) - local["c_i"] + local["c"]
        if hp.subgradient:
            direction = direction + self.reg.subgradient(y)
        return {**local, "y": y - hp.client_lr * direction}

    def client_final(self, local, rnd, hp):
        x, y, c, c_i = local["x"], local["y"], local["c"], local["c_i"]
        if hp.control == "I":
            c_new = self.problem.client_grad(x, rnd.clients)  # at the server model, on each client's whole data
        else:
            c_new = c_i - c + (x - y) / (rnd.client_steps * hp.client_lr)
        return {"dy": y - x, "dc": c_new - c_i}, {"c": c_new}

    def server_update(self, server, message, weights, rnd, hp):
        return {"w": server["w"] + hp.server_lr * aggregate(message["dy"], weights),
                "c": server["c"] + message["dc"].sum(1, keepdim=True) / self.problem.num_clients}
