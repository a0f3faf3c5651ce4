"""FeDXL1, federated X-risk optimization for a linear outer f (Guo, Jin, Luo, Yang, ICML 2023,
§3.1, Algorithm 1), e.g. AUC maximization with the symmetric PSM loss (`pauc` with
`task: auc`): plain local SGD on the active–passive decomposition, no momentum and no u.

    client i, round r:  w ← w̄;   for k = 0..K−1:
        a = h(w, Z₁), b = h(w, Z₂);  hb ← B₂ passive negative scores;  ha ← B₁ passive positive scores
        w ← w − η ∇[mean_{p,q} ℓ(a_p, hb_q) + mean_{p',q} ℓ(ha_p', b_q)]   (eqs. (5)–(6))
        record a and b for the next round's pools
    server:  w̄ ← mean_i w_i;  merge the score lists (pools of the last `history_rounds` rounds)

Algorithm 1 line 14 swaps B_{i,1} and B_{i,2}; G1 needs passive negatives and G2 passive positives
(eqs. (5)–(6)). Passive draws and the bootstrap pools as FeDXL2 (`xrisk.StaleScores`).
"""
from __future__ import annotations

from fedbench.algorithms.base import CLIENT_LR, MODEL, Upload, aggregate, broadcast
from fedbench.algorithms.xrisk import DECAY, DECAY_EVERY, HISTORY_ROUNDS, StaleScores, fedxl2_surrogate, step_size


class FeDXL1(StaleScores):
    name = "fedxl1"
    title = "FeDXL1"
    requires = frozenset({"pair_scores", "linear_outer"})  # a nonlinear f needs FeDXL2's u estimates
    hparams = (CLIENT_LR, HISTORY_ROUNDS, DECAY_EVERY, DECAY)
    downloads = ("w", "pool_pos", "pool_neg")
    uploads = (MODEL, Upload("h_pos"), Upload("h_neg"))  # the model, the round's scores

    def init_server(self, w0):
        return {"w": w0.clone(), **self.init_pools(w0)}

    def client_init(self, server, rows, rnd, hp):
        return {"w": broadcast(server["w"], rnd), **self.open_round(server, rnd)}

    def client_step(self, local, batches, rnd, hp):
        oracle = batches.D
        positives = oracle.positives
        ha, _, hb = self.draw_passive(local["pools"], oracle, rnd)
        one = ha.new_ones(())  # a linear f: ∇f ≡ 1
        direction, scores = oracle.surrogate_grad(
            local["w"], lambda a, b: fedxl2_surrogate(self.problem, a, b, ha, hb, one, one))
        lr = step_size(hp.client_lr, hp.decay, hp.decay_every, rnd)
        return {**local, "w": local["w"] - lr * direction, **self.record(local, scores, positives)}

    def server_update(self, server, message, weights, rnd, hp):
        return {"w": aggregate(message["w"], weights), **self.merge_pools(server, message, hp)}
