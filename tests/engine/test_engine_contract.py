"""The engine's contract with algorithms and problems (issue 12): oracles (loss, gradient, Hessian-vector
products) derived from the clients' loss by default and the hand-written overrides agreeing with them, full-data
client gradients, minibatch declarations, the algorithm's own random stream, rounds of random length, and the
capability contract over every algorithm × problem pair."""
from __future__ import annotations

import copy
import itertools
import time
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
import torch

import fedbench
from fedbench.algorithms import ALGORITHMS
from fedbench.algorithms.base import coin_flips_to_success
from fedbench.algorithms.fedavg import FedAvg
from fedbench.contract import CAPABILITIES, IncompatibleError
from fedbench.engine.simulate import Federation, Simulation, simulate
from fedbench.hparams import Param
from fedbench.oracle import Minibatch, RunOracle
from fedbench.problems import PROBLEMS, traces
from fedbench.problems.base import Problem
from fedbench.problems.traces import SLOT
from fedbench.rng import generator
from helpers import how_to_problem, npz_problem, write_npz
from small_problems import small_lasso, small_lowrank
from sweeps.driving import build_simulation
from sweeps.recipe import RecipeError, parse


def draw_batch(problem, clients, size, seed=0):
    rows = problem.draw_minibatches(torch.as_tensor(clients), 1, size, generator(seed, "test"))[0]
    return problem.gather(rows)


# -- oracles ------------------------------------------------------------------------------------------------------

def test_least_squares_hand_written_grad_and_hvp_equal_the_defaults():
    problem = small_lasso()
    batch = draw_batch(problem, [0, 3, 5], 7)
    w = torch.randn(3, problem.dim, dtype=torch.float64, generator=generator(1, "w"))
    v = torch.randn(3, problem.dim, dtype=torch.float64, generator=generator(2, "v"))
    torch.testing.assert_close(problem.grad(w, batch), Problem.grad(problem, w, batch), rtol=1e-12, atol=1e-12)
    closed_form = problem.hvp(w, v, batch)
    torch.testing.assert_close(closed_form, Problem.hvp(problem, w, v, batch), rtol=1e-12, atol=1e-12)
    x, _ = batch  # (1/b) XᵀX v, written out per client
    for k in range(3):
        torch.testing.assert_close(closed_form[k], x[k].T @ (x[k] @ v[k]) / 7, rtol=1e-12, atol=1e-12)
    losses = problem.loss(w, batch)
    assert losses.shape == (3,)
    torch.testing.assert_close(losses[1], 0.5 * (x[1] @ w[1] - batch[1][1]).square().mean())


def test_mlp_hvp_equals_central_finite_differences():
    """The default HVP (a double backward pass) of the pAUC MLP's cross-entropy, in float64, against
    central differences of its gradient."""
    problem = fedbench.make_problem("pauc", seed=0, clients=4, features=6, model="mlp", hidden=8, test_size=60,
                                    val_size=0)
    x, y = draw_batch(problem, [0, 2], 16)
    batch = (x.double(), y.double())
    w = problem.init_params(generator(0, "init")).double().expand(2, -1).clone()
    w[1] += 0.1 * torch.randn(problem.dim, dtype=torch.float64, generator=generator(3, "w"))
    v = torch.randn(2, problem.dim, dtype=torch.float64, generator=generator(4, "v"))
    hvp = problem.hvp(w, v, batch)
    eps = 1e-6
    central = (problem.grad(w + eps * v, batch) - problem.grad(w - eps * v, batch)) / (2 * eps)
    torch.testing.assert_close(hvp, central, rtol=1e-6, atol=1e-8)
    # and the hand-written batched BCE gradient is the default one
    torch.testing.assert_close(problem.grad(w, batch), Problem.grad(problem, w, batch), rtol=1e-12, atol=1e-14)


def test_emnist_hand_written_grad_equals_the_default_with_padding(tmp_path):
    problem = npz_problem(tmp_path, [3, 12, 6], bias=True)
    batch = draw_batch(problem, [0, 1, 2], 8)  # client 0 has 3 samples: 5 padded picks
    assert (batch[2][0] == 0).sum() == 5
    w = 0.01 * torch.randn(3, problem.dim, generator=generator(5, "w"))
    torch.testing.assert_close(problem.grad(w, batch), Problem.grad(problem, w, batch), rtol=1e-5, atol=1e-7)


def least_squares_gradients(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(1/b) X_kᵀ(X_k w_k − y_k) for each client k, in NumPy."""
    x, y, w = x.numpy(), y.numpy(), w.numpy()
    return torch.from_numpy(np.stack([x[k].T @ (x[k] @ w[k] - y[k]) / x.shape[1] for k in range(len(w))]))


def test_the_default_gradient_of_the_how_to_problem_is_its_least_squares_gradient(tmp_path):
    """At the issue's [20, 50, 10] (every client's whole data), at points a run's clients share (stride 0) and
    lifted over 3 runs as the engine lifts it."""
    problem = how_to_problem(tmp_path)
    assert "grad" not in vars(type(problem))  # the default, as a reader's problem has it
    x, y = batch = problem.gather(torch.arange(1000).view(20, 50))
    w = torch.randn(20, 10, dtype=torch.float64, generator=generator(1, "w"))
    torch.testing.assert_close(problem.grad(w, batch), least_squares_gradients(x, y, w), rtol=1e-12, atol=1e-12)
    shared = w[:1].expand(20, -1)
    torch.testing.assert_close(problem.grad(shared, batch), least_squares_gradients(x, y, shared.contiguous()),
                               rtol=1e-12, atol=1e-12)
    rows = problem.draw_minibatches(torch.arange(20).expand(3, 20).reshape(-1), 1, 7, generator(2, "rows"))[0]
    oracle = RunOracle(problem.step_oracle(rows), 3, 20)
    points = torch.randn(3, 20, 10, dtype=torch.float64, generator=generator(3, "w"))
    x, y = problem.gather(rows)
    torch.testing.assert_close(oracle.grad(points), least_squares_gradients(x, y, points.flatten(0, 1)).view(3, 20, 10),
                               rtol=1e-12, atol=1e-12)


def test_the_default_gradient_and_hvp_go_through_a_batched_loss(tmp_path):
    """A problem that writes its clients' losses batched (`loss`) gets its gradient and HVPs by backward passes
    through that form: `minibatch_loss` is not called."""
    base = type(how_to_problem(tmp_path))

    class BatchedLoss(base):
        def minibatch_loss(self, w, batch):
            raise AssertionError("the batched loss is the one to differentiate")

        def loss(self, w, batch):
            x, y = batch
            return 0.5 * (torch.einsum("sbd,sd->sb", x, w) - y).square().mean(-1)

    problem = BatchedLoss({p.name: p.default for p in base.params} | {"data_seed": 0}, 0)
    x, y = batch = problem.gather(torch.arange(250).view(5, 50))
    w = torch.randn(5, 10, dtype=torch.float64, generator=generator(4, "w"))
    v = torch.randn(5, 10, dtype=torch.float64, generator=generator(5, "v"))
    torch.testing.assert_close(problem.grad(w, batch), least_squares_gradients(x, y, w), rtol=1e-12, atol=1e-12)
    hvp = torch.stack([x[k].T @ (x[k] @ v[k]) / 50 for k in range(5)])
    torch.testing.assert_close(problem.hvp(w, v, batch), hvp, rtol=1e-12, atol=1e-12)


def ridge_problem(folder: Path):
    """The how-to problem with a loss that reads two attributes, the tensor `scale` `[d]` and the float `ridge`:
    f(w) = ½ mean (⟨x, scale ⊙ w⟩ − y)² + ridge ‖w‖². `Ridge.losses` counts the calls of its `minibatch_loss`."""
    base = type(how_to_problem(folder))

    class Ridge(base):
        losses: list = []  # a class attribute: appending to it changes no attribute of the instance

        def minibatch_loss(self, w, batch):
            self.losses.append(1)
            x, y = batch
            return 0.5 * (x @ (self.scale * w) - y).square().mean() + self.ridge * w.square().sum()

    problem = Ridge({p.name: p.default for p in base.params} | {"data_seed": 0}, 0)
    problem.scale, problem.ridge = torch.ones(problem.dim, dtype=torch.float64), 0.1
    return problem


def ridge_gradients(problem, x, y, w):
    """scale ⊙ (1/b) X_kᵀ(X_k (scale ⊙ w_k) − y_k) + 2 ridge w_k for each client k, in NumPy (X_k diag(scale) is the
    least squares' features)."""
    scale = problem.scale.double()
    return least_squares_gradients(x.double() * scale, y.double(), w.double()) + 2 * problem.ridge * w.double()


def test_the_default_gradient_replays_its_trace_exact_in_float64_and_float32(tmp_path, trace_at_once):
    """Issue 59 item 11: the default gradient runs the loss through vmap and autograd once for a layout of its
    inputs (make_fx's trace), then replays the trace's ATen operations without calling the loss, and gives the
    analytic gradient: float64 to 1e-12, float32 to its rounding."""
    problem = ridge_problem(tmp_path)
    x, y = batch = problem.gather(torch.arange(1000).view(20, 50))
    w = torch.randn(20, 10, dtype=torch.float64, generator=generator(6, "w"))
    for point in (w, 2 * w, w.flip(0)):
        torch.testing.assert_close(problem.grad(point, batch), ridge_gradients(problem, x, y, point), rtol=1e-12,
                                   atol=1e-12)
    assert len(problem.losses) == 1  # traced at the first call, replayed at every call
    torch.testing.assert_close(problem.grad(w, batch), problem.autograd_grad(w, batch), rtol=0, atol=0)
    problem.scale = problem.scale.float()
    batch32 = (x.float(), y.float())
    for point in (w.float(), 2 * w.float()):
        got = problem.grad(point, batch32)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), ridge_gradients(problem, x, y, point), rtol=1e-5, atol=1e-5)
    assert len(problem.losses) == 2 + 1  # the untraced gradient's call above, and one trace
    torch.testing.assert_close(problem.grad(w.float(), batch32), problem.autograd_grad(w.float(), batch32), rtol=0,
                               atol=0)


def test_a_traced_gradient_that_depends_on_shapes_alone_is_a_new_tensor_at_each_call(tmp_path, trace_at_once):
    """The trace computes once what depends on shapes alone, but never the result it returns: a caller may change
    that in place (`u -= lr * g`) without changing the next call's."""
    base = type(how_to_problem(tmp_path))

    class Linear(base):
        def minibatch_loss(self, w, batch):  # ∇ = (2, ..., 2) whatever w
            return (2.0 * w).sum()

    problem = Linear({p.name: p.default for p in base.params} | {"data_seed": 0}, 0)
    batch = problem.gather(torch.arange(250).view(5, 50))
    w = torch.zeros(5, 10, dtype=torch.float64)
    for _ in range(3):
        gradient = problem.grad(w, batch)
        torch.testing.assert_close(gradient, torch.full((5, 10), 2.0, dtype=torch.float64), rtol=0, atol=0)
        gradient.mul_(7.0)
    assert any(vars(problem)[SLOT].graphs.values())


def test_a_layout_is_traced_once_its_untraced_calls_have_cost_a_trace(tmp_path, monkeypatch):
    """So that a short run never pays for tracing; a reassigned attribute starts the count anew."""
    monkeypatch.setattr(traces, "IMPORT_SECONDS", 0.0)
    monkeypatch.setattr(traces, "TRACE_SECONDS", 0.02)
    problem = ridge_problem(tmp_path)
    x, y = batch = problem.gather(torch.arange(250).view(5, 50))
    w = torch.randn(5, 10, dtype=torch.float64, generator=generator(11, "w"))
    for _ in range(2):
        start, calls = time.perf_counter(), 0
        while calls == 0 or not vars(problem)[traces.SLOT].graphs:
            torch.testing.assert_close(problem.grad(w, batch), ridge_gradients(problem, x, y, w), rtol=1e-12,
                                       atol=1e-12)
            calls += 1
        assert time.perf_counter() - start >= 0.02 and len(problem.losses) == calls > 2  # untraced calls, a trace
        problem.losses.clear()
        problem.grad(w, batch)
        assert problem.losses == []
        problem.ridge = 0.2
        problem.losses.clear()


def test_the_traced_gradient_follows_reassigned_attributes_and_in_place_changes(tmp_path, trace_at_once):
    """A float the loss reads is part of its trace, so reassigning it (or any attribute) traces anew; a tensor
    attribute is held by the trace itself, so an in-place change of it is seen."""
    problem = ridge_problem(tmp_path)
    x, y = batch = problem.gather(torch.arange(250).view(5, 50))
    w = torch.randn(5, 10, dtype=torch.float64, generator=generator(7, "w"))
    problem.grad(w, batch)
    problem.ridge = 0.3
    torch.testing.assert_close(problem.grad(w, batch), ridge_gradients(problem, x, y, w), rtol=1e-12, atol=1e-12)
    problem.scale = torch.linspace(0.5, 1.5, 10, dtype=torch.float64)
    torch.testing.assert_close(problem.grad(w, batch), ridge_gradients(problem, x, y, w), rtol=1e-12, atol=1e-12)
    traced = len(problem.losses)
    problem.scale.mul_(2.0)
    torch.testing.assert_close(problem.grad(w, batch), ridge_gradients(problem, x, y, w), rtol=1e-12, atol=1e-12)
    assert len(problem.losses) == traced == 3  # the in-place change replayed, each reassignment traced


def test_a_loss_that_draws_is_not_traced_and_draws_anew_at_each_call(tmp_path, trace_at_once):
    """Dropout in a batched loss (vmap refuses draws in `minibatch_loss`): every call draws its own mask, and the
    first call draws what the untraced gradient draws from the same state (tracing drew nothing)."""
    base = type(how_to_problem(tmp_path))

    class Dropout(base):
        def loss(self, w, batch):
            x, y = batch
            return 0.5 * (torch.nn.functional.dropout(torch.einsum("sbd,sd->sb", x, w), 0.5) - y).square().mean(-1)

    problem = Dropout({p.name: p.default for p in base.params} | {"data_seed": 0}, 0)
    batch = problem.gather(torch.arange(250).view(5, 50))
    w = torch.randn(5, 10, dtype=torch.float64, generator=generator(8, "w"))
    torch.manual_seed(5)
    first = problem.grad(w, batch)
    torch.manual_seed(5)
    torch.testing.assert_close(first, problem.autograd_grad(w, batch), rtol=0, atol=0)
    assert not torch.equal(problem.grad(w, batch), problem.grad(w, batch))


def test_a_loss_that_branches_on_a_value_or_changes_the_problem_runs_untraced(tmp_path, trace_at_once):
    """A Python branch on a tensor's value would be frozen into a trace at the first call's branch (make_fx refuses
    one on the inputs, not on a tensor attribute, which is a constant to it); a loss that changes an attribute of the
    problem would change it once: both run as written at every call."""
    base = type(how_to_problem(tmp_path))

    class Branching(base):
        def loss(self, w, batch):  # twice the least squares while `sign` is positive
            x, y = batch
            factor = 2.0 if float(self.sign) > 0 else 1.0
            return factor * 0.5 * (torch.einsum("sbd,sd->sb", x, w) - y).square().mean(-1)

    class Counting(base):
        def minibatch_loss(self, w, batch):
            self.calls = getattr(self, "calls", 0) + 1
            return super().minibatch_loss(w, batch)

    config = {p.name: p.default for p in base.params} | {"data_seed": 0}
    branching, counting = Branching(config, 0), Counting(config, 0)
    branching.sign = torch.tensor(1.0)
    x, y = batch = branching.gather(torch.arange(250).view(5, 50))
    w = torch.randn(5, 10, dtype=torch.float64, generator=generator(9, "w"))
    for factor in (2.0, 1.0):
        torch.testing.assert_close(branching.grad(w, batch), factor * least_squares_gradients(x, y, w), rtol=1e-12,
                                   atol=1e-12)
        branching.sign.neg_()
    counting.grad(w, batch)
    before = counting.calls
    torch.testing.assert_close(counting.grad(w, batch), least_squares_gradients(x, y, w), rtol=1e-12, atol=1e-12)
    assert counting.calls == before + 1


def test_a_problem_pickles_and_copies_without_its_traces(tmp_path, trace_at_once):
    """Ray pickles a problem for its workers (cloudpickle, the plugin's class by value): its traces stay behind,
    and the copy traces its own."""
    problem = ridge_problem(tmp_path)
    batch = problem.gather(torch.arange(250).view(5, 50))
    w = torch.randn(5, 10, dtype=torch.float64, generator=generator(10, "w"))
    want = problem.grad(w, batch)
    assert vars(problem)[SLOT].graphs
    for copied in (cloudpickle.loads(cloudpickle.dumps(problem)), copy.deepcopy(problem)):
        assert SLOT not in vars(copied)
        torch.testing.assert_close(copied.grad(w, batch), want, rtol=0, atol=0)
        assert vars(copied)[SLOT].graphs


# -- full local data --------------------------------------------------------------------------------------------------

def per_sample_mean_grad(problem, w, rows):
    """Mean over the rows of per-sample autograd gradients, one sample at a time."""
    grads = []
    for row in rows:
        point = w.detach().clone().requires_grad_(True)
        batch = problem.gather(torch.tensor([[row]]))
        Problem.loss(problem, point[None], batch).sum().backward()
        grads.append(point.grad)
    return torch.stack(grads).mean(0)


def test_full_data_gradients_are_per_sample_means_ragged_clients_included(tmp_path):
    problem = npz_problem(tmp_path, [3, 12, 6], bias=True)
    clients = torch.tensor([2, 0, 1])
    w = 0.01 * torch.randn(3, problem.dim, generator=generator(6, "w"))
    full = problem.client_grad(w, clients)
    losses = problem.client_loss(w, clients)
    for k, client in enumerate(clients.tolist()):
        start, end = int(problem.client_offsets[client]), int(problem.client_offsets[client + 1])
        torch.testing.assert_close(full[k], per_sample_mean_grad(problem, w[k], range(start, end)),
                                   rtol=1e-5, atol=1e-7)
        x, y, _ = problem.gather(torch.arange(start, end)[None])
        want = torch.nn.functional.cross_entropy(problem.model(w[k], x[0]), y[0])
        torch.testing.assert_close(losses[k], want, rtol=1e-5, atol=1e-7)


def test_full_data_gradients_of_least_squares_are_the_pooled_quadratic():
    problem = small_lowrank()
    clients = torch.arange(problem.num_clients)
    w = torch.randn(len(clients), problem.dim, dtype=torch.float64, generator=generator(7, "w"))
    full = problem.client_grad(w, clients)
    n = problem.config["samples_per_client"]
    x = problem.features.view(len(clients), n, -1)
    y = problem.labels.view(len(clients), n)
    for k in clients.tolist():
        torch.testing.assert_close(full[k], x[k].T @ (x[k] @ w[k] - y[k]) / n, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(full[k], per_sample_mean_grad(problem, w[k], range(k * n, (k + 1) * n)),
                                   rtol=1e-12, atol=1e-12)


# -- declared minibatches -------------------------------------------------------------------------------------------

class ThreeBatches(FedAvg):
    """Per step: D (federation batch size), D2 of its own size, and D3 reusing D's draw."""
    name = "three_batches_test"
    hparams = (*FedAvg.hparams, Param("second_batch", "int", 4, "size of D2", low=1))
    seen: list

    @classmethod
    def minibatches(cls, hp):
        return (Minibatch("D"), Minibatch("D2", size="second_batch"), Minibatch("D3", same_as="D"))

    def client_step(self, local, batches, rnd, hp):
        self.seen.append((batches.D, batches.D2, batches.D3))
        return super().client_step(local, batches, rnd, hp)


def test_declared_minibatches_are_drawn_once_each_and_reuse_is_not_a_draw():
    problem = small_lasso()
    algorithm = ThreeBatches(problem, client_lr=0.01, second_batch=6)
    algorithm.seen = []
    sim = Simulation(problem, algorithm, Federation(2, 3, 2, 5), seed=0)
    sim.run_round()
    d, d2, d3 = algorithm.seen[0]
    assert d3 is d
    # one run's batch, lifted over the run axis (R = 1)
    assert d.batch[0].shape == (1, 3, 5, problem.dim) and d2.batch[0].shape == (1, 3, 6, problem.dim)
    # the first declared batch is drawn exactly as a one-batch algorithm's (same stream, same draws)
    plain = Simulation(problem, fedbench.make_algorithm("fedavg", problem, client_lr=0.01), Federation(2, 3, 2, 5),
                       seed=0)
    _, rows = plain.sampler.draw(2)
    torch.testing.assert_close(problem.gather(rows["D"][0])[0], d.batch[0][0])
    with pytest.raises(AttributeError, match="no minibatch 'E'"):
        _ = sim.sampler.step_batches(sim.sampler.draw(1)[1], 0).E
    with pytest.raises(ValueError, match="second_batch: found 30"):  # larger than a client's 20 samples
        Simulation(problem, ThreeBatches(problem, second_batch=30), Federation(2, 3, 2, 5), seed=0)


# -- the algorithm's random stream and rounds of random length ------------------------------------------------------

class CoinRounds(FedAvg):
    """FedAvg whose clients communicate when a p-coin says so: each round has a geometric number of steps."""
    name = "coin_rounds_test"
    hparams = (*FedAvg.hparams, Param("p", "float", 0.3, "communication probability", low=0, low_open=True, high=1))

    def round_length(self, local_steps, gen):
        return coin_flips_to_success(self.hp.p, gen)


def coin_run(seed, eval_every, rounds=30):
    problem = small_lasso()
    return simulate(problem, CoinRounds(problem, client_lr=0.01, p=0.3), Federation(rounds, 3, 1, 5), seed=seed,
                    eval_every=eval_every)


def test_geometric_rounds_reproduce_by_seed_and_count_one_communication_per_success():
    first, again, other = coin_run(4, 5), coin_run(4, 5), coin_run(5, 5)
    assert first.rows == again.rows
    assert [r["iterations"] for r in first.rows] != [r["iterations"] for r in other.rows]
    gen = generator(4, "algorithm")  # the coins replayed from the algorithm's stream
    lengths = [coin_flips_to_success(0.3, gen) for _ in range(30)]
    assert min(lengths) >= 1 and max(lengths) > 1
    problem = small_lasso()
    for row in first.rows:
        rounds = row["round"]
        assert row["iterations"] == sum(lengths[:rounds])  # iterations done so far
        assert row["comm_up"] == rounds * 3 * problem.dim  # one upload per success, nothing per local step
        assert row["comm_down"] == rounds * 3 * problem.dim
    long = coin_run(4, 50, rounds=2000)
    assert long.final["iterations"] / 2000 == pytest.approx(1 / 0.3, rel=0.1)


def test_the_algorithms_coins_do_not_depend_on_the_evaluation_schedule():
    every, sparse = coin_run(4, 1), coin_run(4, 7)
    by_round = {row["round"]: row for row in every.rows}
    for row in sparse.rows:
        assert by_round[row["round"]] == row
    torch.testing.assert_close(every.params, sparse.params, rtol=0, atol=0)
    # FeDXL2 draws its passive scores from the algorithm's stream too
    problem = fedbench.make_problem("pauc", seed=0, clients=4, test_size=60, val_size=0)
    runs = [simulate(problem, fedbench.make_algorithm("fedxl2", problem), Federation(6, 2, 3, 8), seed=1,
                     eval_every=e) for e in (1, 3)]
    assert runs[0].rows[-1] == runs[1].rows[-1]


# -- the capability contract: every algorithm × problem pair --------------------------------------------------------

def emnist_config(tmp_path):
    path = write_npz(tmp_path / "mini.npz", [12, 12, 8, 15], [3, 3, 3, 3])
    return {"name": "emnist", "path": str(path), "min_train": 1}


PROBLEM_CASES = {
    "lasso": lambda tmp: {"name": "lasso", "clients": 4, "samples_per_client": 20, "dim": 12, "support": 4},
    "lowrank": lambda tmp: {"name": "lowrank", "rows": 4, "cols": 3, "rank": 1, "clients": 4,
                            "samples_per_client": 20},
    "emnist": emnist_config,
    "pauc": lambda tmp: {"name": "pauc", "clients": 4, "test_size": 60, "val_size": 0},
    "pauc_auc_task": lambda tmp: {"name": "pauc", "preset": "guo2023_noisy_auc", "clients": 4, "test_size": 60,
                                  "val_size": 0},
    "pauc_pooled": lambda tmp: {"name": "pauc", "clients": 4, "test_size": 60, "val_size": 0, "pooled": True},
    "digits": lambda tmp: {"name": "digits", "path": str(write_npz(tmp / "digits.npz", [60] * 4, [20] * 4)),
                           "clients": 4, "hidden": 8},
}


# every case as it is, and the problems that can fit an intercept (an unpenalized last coordinate) with one
@pytest.mark.parametrize("case, intercept", [*((case, False) for case in PROBLEM_CASES), ("lasso", True),
                                             ("lowrank", True)])
def test_a_models_named_parameters_are_its_coordinates_each_once(case, intercept, tmp_path):
    """`Problem.parameters` (what a saved model holds by name, `fedbench.engine.saved`) views every coordinate of w once, in
    order: a sweep saves every run's model this way, and a view that misses the intercept failed every run of the
    pFedFBE matrix-completion recipe."""
    config = PROBLEM_CASES[case](tmp_path)
    if intercept:
        config["intercept"] = True
    problem = fedbench.make_problem(config.pop("name"), seed=0, **config)
    w = torch.arange(problem.dim, dtype=problem.init_params(generator(0, "init")).dtype)
    assert torch.equal(torch.cat([value.reshape(-1) for value in problem.parameters(w).values()]), w)


SMALL_BATCHES = {"per_fedavg": {"inner_batch": 4, "outer_batch": 4, "hessian_batch": 4}}  # tiny cases' clients


@pytest.mark.parametrize("algorithm, case", list(itertools.product(ALGORITHMS, PROBLEM_CASES)))
def test_validate_refuses_exactly_the_pairs_the_declarations_rule_out(algorithm, case, tmp_path):
    problem = PROBLEM_CASES[case](tmp_path)
    clients = 1 if problem.get("pooled") else 2
    raw = {"problem": problem, "federation": {"rounds": 1, "clients_per_round": clients, "local_steps": 2,
                                              "batch_size": 4}, "algorithms": {algorithm: SMALL_BATCHES.get(algorithm, {})}}
    cls, problem_cls = ALGORITHMS[algorithm], PROBLEMS[problem["name"]]
    config = problem_cls.resolve_config({k: v for k, v in problem.items() if k != "name"})
    missing = sorted(cls.requirements({p.name: p.default for p in cls.hparams})
                     - problem_cls.capabilities(config))
    if missing:
        with pytest.raises(RecipeError) as refused:
            parse(raw, "table.yaml")
        message = str(refused.value)
        assert f"algorithms.{algorithm}" in message and missing[0] in message and problem["name"] in message
        return
    recipe = parse(raw, "table.yaml")
    trial = recipe.single_trial()
    rows = list(build_simulation(trial, "cpu"))
    assert [row["round"] for row in rows] == [0, 1]
    assert set(rows[-1]) == {"round", *(m.name for m in trial.metrics())}


def test_the_contract_holds_in_the_python_api_too():
    problem = small_lasso()
    with pytest.raises(IncompatibleError, match="fedxl2 requires pair_scores"):
        fedbench.make_algorithm("fedxl2", problem)
    pauc = fedbench.make_problem("pauc", seed=0, clients=4, test_size=60, val_size=0)
    with pytest.raises(IncompatibleError, match="ditto requires personal_evaluation"):
        fedbench.make_algorithm("ditto", pauc)
    with pytest.raises(IncompatibleError, match="c_fedda requires norm_ball"):
        fedbench.make_algorithm("c_fedda", pauc, radius=10.0)
    fedbench.make_algorithm("c_fedda", pauc)  # without a ball it needs no norm


def test_every_declared_capability_is_known_and_used():
    declared = set()
    for cls in ALGORITHMS.values():
        declared |= cls.requirements({p.name: p.default for p in cls.hparams})
    for cls in PROBLEMS.values():
        for preset in cls.presets:
            declared |= cls.capabilities(cls.resolve_config({"preset": preset}))
    assert declared <= set(CAPABILITIES)
    assert {"pair_scores", "personal_evaluation", "norm_ball", "one_client", "linear_outer"} <= declared


# -- problem-declared metrics -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [small_lasso, small_lowrank,
                                  lambda: fedbench.make_problem("pauc", seed=0, clients=4, test_size=60)])
def test_evaluate_returns_exactly_the_declared_metrics_in_order(make):
    problem = make()
    w = problem.init_params(generator(0, "init"))
    assert list(problem.evaluate(w)) == [m.name for m in problem.metrics(problem.config)]
    if "personal_evaluation" in problem.capabilities(problem.config):
        personal = w.expand(problem.num_clients, -1)
        declared = problem.declared_metrics(problem.config, personal=True)
        values = problem.evaluate(w, personal)
        assert list(values) == [m.name for m in declared]
        for metric in problem.personal_metrics(problem.config):  # identical models: identical values
            if metric.name != "objective":
                assert values[f"personal_{metric.name}"] == pytest.approx(values[metric.name], rel=1e-12)


def test_emnist_personal_metrics_score_each_writer_with_its_own_model(tmp_path):
    problem = npz_problem(tmp_path, [5, 12, 6], test_sizes=[2, 4, 3])
    models = 0.01 * torch.randn(3, problem.dim, generator=generator(8, "w"))
    values = problem.evaluate(models[0], models)
    correct = total = 0
    loss = 0.0
    test_offsets = np.r_[0, np.cumsum(problem.test_sizes.numpy())]
    for k in range(3):
        x = problem._features(problem.x_test[test_offsets[k]: test_offsets[k + 1]])
        y = problem.y_test[test_offsets[k]: test_offsets[k + 1]]
        logits = problem.model(models[k], x)
        correct += int((logits.argmax(-1) == y).sum())
        loss += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
        total += len(y)
    assert values["personal_test_accuracy"] == pytest.approx(correct / total)
    assert values["personal_test_loss"] == pytest.approx(loss / total, rel=1e-5)
    assert values["test_accuracy"] == problem.evaluate(models[0])["test_accuracy"]
