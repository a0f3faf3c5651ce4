"""The default minibatch gradient of a problem that writes only `minibatch_loss` (a plugin problem), timed
against a hand-written one on the problem of docs/how-to/write-a-problem.md (least squares with client drift,
its `my_problem.py` block read from the page), float64 on the CPU. Options, each `w` `[S, d]` -> `[S, d]`:

  hand             the einsum gradient (1/b) Xᵀ(Xw − y) per client (`Problem.grad`'s docstring example);
  default          `Problem.grad` as it is now: `summed_backward` replayed from its trace
                   (`fedbench.problems.traces`: make_fx's ATen graph, shape-only results folded, no-op views
                   dropped);
  summed_backward  one `torch.autograd.grad` of the sum of the clients' losses `vmap(minibatch_loss)`
                   (`Problem.autograd_grad`, as `ImageClassification.grad` does), the default untraced;
  vmap_grad        torch.func's `vmap(grad(minibatch_loss))`, the default before issue 59 item 11;
  func_grad_sum    torch.func's `grad` of the sum of the clients' losses;
  batched_loss     one backward pass over a hand-written batched loss (einsum): what the untraced default gives a
                   problem that overrides `loss`;
  traced_vmap_grad `vmap_grad` traced as the default traces `summed_backward` (the other graph to replay);
  make_fx_vmap_grad `vmap_grad` traced by make_fx, its graph as it comes (nothing folded nor dropped).

Shapes [S, b, d]: the how-to recipe's round (5 clients of batches of 10), the issue's [20, 50, 10] (every client
of the problem's defaults, whole data) and a wider [20, 50, 200]. Each option's median microseconds per call over
interleaved repetitions, and its ratio to `hand` measured in the same run (the machine is shared: read the
ratios). The default's layouts are traced at their first call here, timed (the first in a process imports
torch._dynamo; in a run, a layout is traced once its untraced calls have cost as much as that). Then, end to end,
FedAvg on the how-to's recipe federation, the default gradient against the hand-written one and the untraced
default, milliseconds per round (10 local steps; 3x the repetitions: a round is noisier).

Usage: OMP_NUM_THREADS=1 python bench/plugin_grad.py [--repeats 7] [--threads 1]
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.func import grad as func_grad, vmap
from torch.fx.experimental.proxy_tensor import make_fx

from fedbench.algorithms import ALGORITHMS
from fedbench.engine.simulate import Federation, Simulation
from fedbench.problems import traces
from fedbench.problems.base import Problem
from fedbench.problems.traces import trace
from fedbench.rng import generator

sys.path.insert(0, str(Path(__file__).parent))
from round_timing import median_round_seconds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HOW_TO = ROOT / "docs" / "how-to" / "write-a-problem.md"
SHAPES = ((5, 10, 10), (20, 50, 10), (20, 50, 200))
WITHIN = 3.0  # the bound on default / hand


def how_to_problem_class():
    """`DriftingLeastSquares`, from the page's `my_problem.py` block as a reader writes it."""
    code = re.search(r'^```python title="my_problem.py"\n(.*?)^```', HOW_TO.read_text(), re.S | re.M).group(1)
    path = Path(tempfile.mkdtemp()) / "my_problem.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("my_problem", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DriftingLeastSquares


def hand(problem, w, batch):
    x, y = batch
    residual = torch.einsum("sbd,sd->sb", x, w) - y
    return torch.einsum("sbd,sb->sd", x, residual) / x.shape[-2]


def vmap_grad(problem, w, batch):
    return vmap(func_grad(problem.minibatch_loss))(w, batch)


def func_grad_sum(problem, w, batch):
    return func_grad(lambda point: vmap(problem.minibatch_loss)(point, batch).sum())(w)


def batched_loss(problem, w, batch):
    x, y = batch
    point = w.detach().requires_grad_(True)
    with torch.enable_grad():
        losses = 0.5 * (torch.einsum("sbd,sd->sb", x, point) - y).square().mean(-1)
        return torch.autograd.grad(losses.sum(), point)[0]


def replay(graph):
    return lambda problem, w, batch: graph.forward(w, *batch)


def traced_vmap_grad(problem, w, batch):
    return replay(trace(lambda point, batch: vmap_grad(problem, point, batch), True, (w, *batch)))


def make_fx_vmap_grad(problem, w, batch):
    return replay(make_fx(lambda point, x, y: vmap_grad(problem, point, (x, y)))(w, *batch))


def time_calls(options: dict, problem, w, batch, repeats: int) -> dict[str, float]:
    """Median µs per call of each option, interleaved; each call count sized to ~20 ms."""
    calls = {}
    for name, option in options.items():
        option(problem, w, batch)
        start = time.perf_counter()
        option(problem, w, batch)
        calls[name] = max(20, int(0.02 / max(time.perf_counter() - start, 1e-6)))
    samples: dict[str, list[float]] = {name: [] for name in options}
    for _ in range(repeats):
        for name, option in options.items():
            start = time.perf_counter()
            for _ in range(calls[name]):
                option(problem, w, batch)
            samples[name].append((time.perf_counter() - start) / calls[name] * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    traces.IMPORT_SECONDS = traces.TRACE_SECONDS = 0.0  # each layout traced at its first call: the steady state
    problem_class = how_to_problem_class()
    print(f"torch {torch.__version__}, {args.threads} thread(s), float64; µs per call (median of {args.repeats}), "
          "ratio to hand")
    for clients, b, d in SHAPES:
        problem = problem_class({"clients": clients, "samples_per_client": b, "dim": d, "heterogeneity": 0.5,
                                 "data_seed": 0}, 0)
        batch = problem.gather(torch.arange(clients * b).view(clients, b))
        w = torch.randn(clients, d, dtype=torch.float64, generator=generator(0, "w"))
        start = time.perf_counter()
        Problem.grad(problem, w, batch)  # traced at once (the first in the process imports torch._dynamo)
        print(f"[S, b, d] = [{clients}, {b}, {d}]: the default's first call, which traces: "
              f"{time.perf_counter() - start:.3f} s")
        options = {"hand": hand, "default": Problem.grad, "summed_backward": Problem.autograd_grad,
                   "vmap_grad": vmap_grad, "func_grad_sum": func_grad_sum, "batched_loss": batched_loss,
                   "traced_vmap_grad": traced_vmap_grad(problem, w, batch),
                   "make_fx_vmap_grad": make_fx_vmap_grad(problem, w, batch)}
        want = hand(problem, w, batch)
        for name, option in options.items():
            torch.testing.assert_close(option(problem, w, batch), want, rtol=1e-12, atol=1e-12, msg=name)
        micros = time_calls(options, problem, w, batch, args.repeats)
        print(f"[S, b, d] = [{clients}, {b}, {d}]:  " + "  ".join(
            f"{name} {value:.0f} ({value / micros['hand']:.1f}x)" for name, value in micros.items()))
        ratio = micros["default"] / micros["hand"]
        print(f"  default within {WITHIN:g}x of hand: {'yes' if ratio <= WITHIN else 'no'} ({ratio:.1f}x); "
              f"untraced (summed_backward): {micros['summed_backward'] / micros['hand']:.1f}x")

    class HandWritten(problem_class):
        def grad(self, w, batch):
            return hand(self, w, batch)

    class Untraced(problem_class):
        def grad(self, w, batch):
            return self.autograd_grad(w, batch)

    config = {"clients": 20, "samples_per_client": 50, "dim": 10, "heterogeneity": 1.0, "data_seed": 0}
    federation = Federation(rounds=10**6, clients_per_round=5, local_steps=10, batch_size=10)
    sims = {name: Simulation(cls(config, 0), ALGORITHMS["fedavg"](cls(config, 0), client_lr=0.03), federation, 0,
                             eval_every=10**6)
            for name, cls in (("hand", HandWritten), ("default", problem_class), ("summed_backward", Untraced))}
    seconds = median_round_seconds(sims, rounds=20, repeats=3 * args.repeats, device="cpu")  # noisier than a call
    print("FedAvg, S = 5, b = 10, E = 10, ms per round: " + "  ".join(
        f"{name} {value * 1e3:.2f} ({value / seconds['hand']:.1f}x)" for name, value in seconds.items()))


if __name__ == "__main__":
    main()
