"""Pieces shared by the federated X-risk algorithms (Guo, Jin, Luo, Yang, ICML 2023 "FeDXL",
§3.1–3.2): the compositional surrogates whose autograd gives the paper's gradient estimators, the
moving-average update of the inner function u, and the server's pools of stale scores.

For F(w) = mean_{z∈S1} f(mean_{z'∈S2} ℓ(h(w,z), h(w,z'))):
* FeDXL2's estimator (eqs. (12)–(13)) is the gradient of
      mean_p c1_p · mean_q ℓ(a_p, hb_q)  +  mean_p' c2_p' · mean_q ℓ(ha_p', b_q)
  with active scores a (local positives), b (local negatives), passive stale scores ha, hb (constants)
  and c = ∇f(u) constants: c1 from the updated u of the local positives, c2 from the stored u paired
  with ha.
* Local Pair's (SOX on local pairs) is the gradient of mean_p c_p · mean_q ℓ(a_p, b_q), through both.
With ha = a, hb = b (no staleness) the two gradients coincide (tests/algorithms/test_fedxl.py).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedbench.algorithms.base import Algorithm, HParams, Round, State
from fedbench.hparams import Param

BETA = Param("beta", "float", 0.1, "weight β of the new gradient in the momentum average", low=0, low_open=True, high=1)
GAMMA = Param("gamma", "float", 0.1, "moving-average rate γ of the inner-function estimates u", low=0, low_open=True,
              high=1)
U_INIT = Param("u_init", "float", 1.0, "initial u of every positive (the code's 1; the paper's 0 breaks λ log)",
               low=0, low_open=True)
DECAY_EVERY = Param("decay_every", "int", 0, "multiply the step size by `decay` every this many local iterations "
                    "(the paper's T0 = 5000 of 20k; 0: never)", low=0)
DECAY = Param("decay", "float", 0.1, "step-size decay factor", low=0, low_open=True, high=1)


def pair_means(problem, a: Tensor, b: Tensor) -> Tensor:
    """mean_q ℓ(a_p, b_q) for a [..., S, P] and b [..., S, Q]: [..., S, P]."""
    return problem.pair_loss(a.unsqueeze(-1), b.unsqueeze(-2)).mean(-1)


def fedxl2_surrogate(problem, a, b, ha, hb, c1, c2) -> Tensor:
    """[R, S] per run and client; its gradient is FeDXL2's G1 + G2 (the passive ha, hb, c1, c2 carry none)."""
    return (c1 * pair_means(problem, a, hb)).mean(-1) + (c2 * pair_means(problem, ha, b)).mean(-1)


def local_pair_surrogate(problem, a, b, c) -> Tensor:
    """[R, S] per run and client; its gradient is SOX's on the client's own pairs, through both scores."""
    return (c * pair_means(problem, a, b)).mean(-1)


def updated_u(u_table: Tensor, index: Tensor, inner: Tensor, hp: HParams) -> Tensor:
    """(1 − γ) u[idx] + γ ĝ for the sampled positives (FeDXL's eq. (11)); the table is not modified. γ and
    1 − γ are the runs' `[R, 1, 1]` values (`moving_average_rates`)."""
    return hp.one_minus_gamma * u_table.gather(-1, index) + hp.gamma * inner.detach()


def scatter_last(u_table: Tensor, index: Tensor, fresh: Tensor) -> Tensor:
    """`u_table` with the sampled positives' fresh u (FeDXL's eq. (11)) written at `index` along the last axis. The
    positives are drawn with replacement and each draw has its own feature noise, so a positive drawn twice has two
    fresh values: the last one is kept, on every device. A CPU scatter writes in order (the last wins; ~3% of a
    FeDXL2 step saved by not deduplicating there) but a CUDA one in no defined order, so there each occurrence
    first takes the value of its index's last occurrence."""
    if u_table.is_cpu:
        return u_table.scatter(-1, index, fresh)
    same = index.unsqueeze(-1) == index.unsqueeze(-2)  # [..., b₁, b₁]
    positions = torch.arange(index.shape[-1], device=index.device)
    last = torch.where(same, positions, -1).amax(-1)
    return u_table.scatter(-1, index, fresh.gather(-1, last))


def moving_average_rates(hp: HParams) -> dict[str, float]:
    """1 − β and 1 − γ of the momentum and u averages, derived once per run (`Algorithm.derive`)."""
    return {"one_minus_beta": 1 - hp.beta, "one_minus_gamma": 1 - hp.gamma}


def stage(decay_every: int, iteration: int) -> int:
    """Which step-size stage local iteration t (from 0, counted on each client across rounds) is in."""
    return iteration // decay_every if decay_every else 0


def step_size(client_lr: Tensor, decay: Tensor, decay_every: int, rnd: Round) -> Tensor:
    """η·decay^stage (the runs' `[R, 1, 1]` values) at the local step `rnd.step` of round `rnd`: the paper's
    schedule in iterations (§4: ×0.1 every 5K iterations), so that it does not change with K."""
    k = stage(decay_every, rnd.iteration + rnd.step)
    return client_lr * decay ** k if k else client_lr


def client_tables(problem, u_init: float, average_momentum: bool, w0: Tensor) -> State:
    """Per-client state `[N, ...]`: u of every local positive (padding never indexed), and the momentum
    when it stays on the clients instead of being averaged."""
    tables = {"u": torch.full((problem.num_clients, int(problem.positive_counts.max())), u_init, dtype=problem.dtype,
                              device=problem.device)}
    if not average_momentum:
        tables["G"] = w0.new_zeros(problem.num_clients, *w0.shape)
    return tables


HISTORY_ROUNDS = Param("history_rounds", "int", 2, "rounds of merged scores kept in the passive pools (code 2, "
                       "paper 1)", low=1)


class StaleScores(Algorithm):
    """FeDXL's federated merging (the FeDXL paper, §3.1–3.2, Algorithms 1–2): the server keeps pools of the
    scores its clients recorded in the last `history_rounds` rounds, positives with their u values when `with_u`;
    each local step draws its passive values from them uniformly with replacement (the released code; the
    paper shuffles the previous round's list), a positive score and its u by one index. Before round 1
    the pools hold every training sample's score under w₀ (u = `u_init`)."""

    with_u = False
    requires = frozenset({"pair_scores"})
    random_stream = "passive-scores"  # rnd.draw: the passive draws, the stream's name kept from before issue 12
    uploads_averaged = False  # the server pools each client's scores (`merge_pools`): no robust rule stands for that

    def init_pools(self, w0: Tensor) -> State:
        """One run's pools `[P]` (the engine makes them server entries `[R, 1, P]`)."""
        positives, negatives = self.problem.scores_by_class(w0)
        pools = {"pool_pos": positives, "pool_neg": negatives}
        if self.with_u:
            pools["pool_u"] = torch.full_like(positives, self.hp.u_init)
        return pools

    def open_round(self, server: State, rnd) -> dict[str, Any]:
        """Empty score records `[R, S, 0]`, and the pools `[R, 1, P]` the clients received."""
        empty = server["w"].new_zeros(rnd.clients.shape + (0,))
        records = {"h_pos": empty, "h_neg": empty, **({"u_pos": empty} if self.with_u else {})}
        return {**records, "pools": {k: v for k, v in server.items() if k.startswith("pool_")}}

    def draw_passive(self, pools: State, oracle, rnd: Round) -> tuple:
        """(ha [R,S,b₁], its u or None, hb [R,S,b₂]): passive positive scores with their u, and negative scores,
        as many as the step's active positives and negatives, each run's from its own algorithm stream and its
        own pools `[R, 1, P]`."""
        def index(pool, count):
            shape = (rnd.clients.shape[-1], count)
            return rnd.draw(lambda gen: torch.randint(pool.shape[-1], shape, generator=gen)).to(pool.device)

        def take(pool, picks):  # pool [R, 1, P], picks [R, S, count]
            return pool.expand(-1, picks.shape[1], -1).gather(-1, picks)

        pair = index(pools["pool_pos"], oracle.positives)
        paired_u = take(pools["pool_u"], pair) if self.with_u else None
        negatives = index(pools["pool_neg"], oracle.negatives)
        return take(pools["pool_pos"], pair), paired_u, take(pools["pool_neg"], negatives)

    def record(self, local: State, scores: Tensor, positives: int, u: Tensor | None = None) -> State:
        """The step's detached scores (and u of its positives) appended to the round's records."""
        records = {"h_pos": torch.cat([local["h_pos"], scores[..., :positives]], -1),
                   "h_neg": torch.cat([local["h_neg"], scores[..., positives:]], -1)}
        if u is not None:
            records["u_pos"] = torch.cat([local["u_pos"], u], -1)
        return records

    def merge_pools(self, server: State, message: State, hp: HParams) -> State:
        """The round's records of all sampled clients `[R, S, b]`, newest first, then up to τ − 1 earlier
        rounds: pools `[R, 1, kept]`."""
        pools = {}
        for key in [k for k in ("pos", "neg", "u") if f"pool_{k}" in server]:
            fresh = message[f"h_{key}" if key != "u" else "u_pos"]
            fresh = fresh.flatten(1).unsqueeze(1)  # [R, S, b] -> [R, 1, S·b]
            kept = hp.history_rounds * fresh.shape[-1]
            pools[f"pool_{key}"] = torch.cat([fresh, server[f"pool_{key}"]], -1)[..., :kept]
        return pools
