"""A torch `nn.Module` as a federated model on the engine's flat parameter vectors.

The engine's algorithms work on flat vectors, `w` `[R, S, d]`; a deep network is an `nn.Module` with named
parameters of their own shapes. `ModuleModel` holds the module and its parameters' names, shapes and places in the
flat vector (`named_parameters()` order, each tensor row-major), turns `[..., d]` into views by name (`unflatten`)
and back (`flatten`), draws an initial point with the module's own initialisation, and runs the clients' forward
passes: C clients' points `w` `[C, d]` on their inputs `x` `[C, b, ...]` give `[C, b, classes]`, differentiable in
`w` (twice: Hessian-vector products go through it), in one of two LAYOUTS:

* `vmap`: `torch.func.vmap` of `torch.func.functional_call` over the C stacked parameter sets, one batched program
  (convolutions become grouped ones, which a GPU serves well and the CPU's kernels badly);
* `loop`: a Python loop over the C clients inside the one program, `functional_call(module, unflatten(w[k]),
  x[k])` each; the caller sums the losses and takes one backward pass (client k's loss depends on row k of w only).

In the `loop` layout a plain gradient step (`descend`, FedAvg's local step through `Oracle.descend`) gives each
client's parameters leaves of their own viewing `w`'s memory and writes `lr` times each gradient, then the parameter
less it, into the new `[C, d]` rows' views: the same numbers bit for bit as `w - lr * grad`, without that path's two
copies of each gradient (into a client's `[d]`, then into `[C, d]`) nor its `[C, d]` product.

Both give the same outputs and gradients to float32 rounding (`tests/networks/test_deep.py`). Which is faster depends on
the model and the device: `bench/deep_layouts.py` measures it, `choose_layout` reads its table. Measured on this
project's 2-core CPU under load (one thread, S = 10, 5 local steps): a FedAvg round of the `vision` problem's small
CNN took 0.81-1.82x the time of a plain `torch.nn` + `torch.optim.SGD` loop over the same clients in `vmap` and
0.96-1.09x in `loop`; of Reddi et al.'s 1.2 M-parameter EMNIST CNN (`emnist_cnn`, with its dropout) at b = 20,
1.21x and 1.09x (1.54x and 1.07x without its dropout, in an earlier run); of that CNN on FEMNIST's writers with one
local epoch at b = 20 (uneven local work, `bench/emnist_round.py`), 1.15-1.19x in `loop` (three runs), 1.14x once
each local step ran only the clients still within their epoch (`RoundProgram._uneven_steps`; 6 paired rounds);
in CPU seconds, 1.12x before and 1.06x after `descend` (medians of 10 paired rounds each).

Dropout: a module with dropout layers runs them in training mode in the local steps, each client's masks drawn from
a seed of its own (`seeds` `[C]`, which the problem draws on the run's "feature-noise" stream, one per client per
step). In the `loop` layout client k's masks come from its seed alone, so they do not depend on the other clients in
the program (nor on the runs batched with its run); in the `vmap` layout one draw (`randomness="different"`, seeded
by the first client's seed) gives every client its own masks, not the loop's: the two layouts agree in distribution
only. Evaluation runs the module in eval mode (no dropout). The problem refuses a module whose forward pass updates
buffers (BatchNorm's running statistics, `fedbench.networks.check_module`): the clients would share one set.
"""
from __future__ import annotations

import contextlib
import json
import math
import statistics
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

LAYOUTS = ("vmap", "loop")
TABLE = Path(__file__).with_name("deep_layouts.json")  # written by bench/deep_layouts.py (its `command` says how)
DEFAULT_LAYOUT = {"cpu": "loop", "cuda": "vmap"}  # where the table has no row of a model's size on a device type
SIZE_REACH = 4.0  # a measured model speaks for models within this factor of its parameter count


class ModuleModel:
    """An `nn.Module` built by `factory` (a class, or a function of no arguments) on flat parameter vectors."""

    def __init__(self, factory: Callable[[], nn.Module], dtype: torch.dtype = torch.float32):
        self.factory = factory
        self.dtype = dtype
        self.module = factory().to(dtype)
        named = list(self.module.named_parameters())
        self.names = [name for name, _ in named]
        self.shapes = [tuple(p.shape) for _, p in named]
        self.numels = [p.numel() for _, p in named]
        self.dim = sum(self.numels)
        self.has_dropout = any(isinstance(m, nn.modules.dropout._DropoutNd) for m in self.module.modules())
        for p in self.module.parameters():  # the module's own tensors are never trained: w is
            p.requires_grad_(False)

    def to(self, device: torch.device) -> ModuleModel:
        """The module (its buffers) moved to `device`."""
        self.module.to(device)
        return self

    def unflatten(self, w: Tensor) -> dict[str, Tensor]:
        """Views of `w` `[..., d]` by parameter name, each `[..., *shape]`."""
        lead = w.shape[:-1]
        return {name: part.view(*lead, *shape)
                for name, part, shape in zip(self.names, w.split(self.numels, dim=-1), self.shapes)}

    def flatten(self, params: dict[str, Tensor]) -> Tensor:
        """The flat vector `[..., d]` of parameters by name (`unflatten`'s inverse): e.g. a `state_dict`."""
        lead = params[self.names[0]].shape[:len(params[self.names[0]].shape) - len(self.shapes[0])]
        return torch.cat([params[name].reshape(*lead, -1) for name in self.names], dim=-1)

    def init(self, gen: torch.Generator) -> Tensor:
        """A fresh module's parameters `[d]`, built by its factory (its own initialisation) with torch's global
        generator seeded from `gen` (the run's "init" stream), which is restored afterwards."""
        seed = int(torch.randint(2**62, (1,), generator=gen))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            fresh = self.factory()
        return self.flatten(dict(fresh.named_parameters())).detach().to(self.dtype)

    def forward(self, w: Tensor, x: Tensor, layout: str, seeds: Tensor | None = None,
                clients: list[int] | None = None) -> Tensor:
        """Outputs `[C, b, ...]` of C clients' points `w` `[C, d]` on their inputs `x` `[C, b, ...]` in `layout`, the
        module in training mode (dropout on, each client's masks from its `seeds` `[C]`, if given; module
        docstring). In the `loop` layout, `clients` (indices into the C) runs those alone: outputs `[len(clients),
        b, ...]`, whose gradients reach their rows of `w` without a copy of them (the other rows' are zeros)."""
        self.module.train(seeds is not None)
        with self._masks(w.device, seeds):
            if layout == "vmap":
                assert clients is None, "the vmap layout runs every client"
                if seeds is not None:
                    _seed(w.device, int(seeds[0]))
                call = lambda params, inputs: functional_call(self.module, params, (inputs,))  # noqa: E731
                return vmap(call, randomness="different" if seeds is not None else "error")(self.unflatten(w), x)
            points = w.unbind(0)
            return self._loop({k: self.unflatten(points[k]) for k in (range(len(w)) if clients is None else clients)},
                              x, seeds)

    def descend(self, w: Tensor, lr: Tensor | float, x: Tensor, loss: Callable[[Tensor, list[int]], Tensor],
                seeds: Tensor | None, clients: list[int]) -> Tensor:
        """`w - lr * ∇loss` `[C, d]`: C clients' gradient steps from their points `w` `[C, d]` on their inputs `x`
        `[C, b, ...]` in the `loop` layout, `loss(outputs, clients)` the sum of the losses of the outputs of
        `clients` (indices into the C, those that run; the others keep their rows), `lr` a float or one per client
        (`[C, 1]`, or one value). The same numbers as `w - lr * grad` through `forward`, without its two copies of
        each gradient (into a client's `[d]`, then into `[C, d]`) nor a `[C, d]` product: each client's parameters
        are leaves of their own viewing `w`'s memory, whose gradients autograd hands over as the kernels made them,
        and `lr` times each is written, then subtracted from the parameter, in place into the new rows' views."""
        points = w.detach().unbind(0)
        params = {k: {name: part.requires_grad_() for name, part in self.unflatten(points[k]).items()} for k in clients}
        self.module.train(seeds is not None)
        with torch.enable_grad(), self._masks(w.device, seeds):
            total = loss(self._loop(params, x, seeds), clients)
        grads = iter(torch.autograd.grad(total, [part for point in params.values() for part in point.values()],
                                         materialize_grads=True))
        new = torch.empty(w.shape, dtype=w.dtype, device=w.device)
        rates = lr.reshape(-1) if isinstance(lr, Tensor) else None
        with torch.no_grad():
            for k in range(len(w)):
                if k not in params:
                    new[k].copy_(w[k])
                    continue
                rate = lr if rates is None else rates[k if len(rates) > 1 else 0]
                for out, part in zip(self.unflatten(new[k]).values(), params[k].values()):
                    torch.mul(next(grads), rate, out=out)
                    torch.sub(part, out, out=out)
        return new

    def _masks(self, device: torch.device, seeds: Tensor | None) -> contextlib.AbstractContextManager:
        """Where dropout runs (`seeds` given), the global generators (the CPU's and `device`'s GPU's) serve the masks
        and are restored afterwards."""
        if seeds is None:
            return contextlib.nullcontext()
        return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])

    def _loop(self, params: dict[int, dict[str, Tensor]], x: Tensor, seeds: Tensor | None) -> Tensor:
        """The outputs of the clients `params` (by index into x's C clients, each its parameters by name) one after
        another, client k's dropout masks from `seeds[k]` alone."""
        inputs = x.unbind(0)
        outputs, seeded = [], None if seeds is None else seeds.tolist()
        for k, point in params.items():
            if seeded is not None:
                _seed(x.device, seeded[k])
            outputs.append(functional_call(self.module, point, (inputs[k],)))
        return torch.stack(outputs)

    def evaluate(self, w: Tensor, x: Tensor) -> Tensor:
        """Outputs `[n, ...]` of one model `w` `[d]` on inputs `x` `[n, ...]`, in eval mode, without gradients."""
        self.module.eval()
        with torch.no_grad():
            return functional_call(self.module, self.unflatten(w), (x,))

    def activations(self, shape: tuple[int, ...]) -> int:
        """The values the module's layers output for one input of `shape` (the leaf modules' outputs, summed): what
        a sample's forward pass keeps for its backward pass."""
        count = [0]
        leaves = [m for m in self.module.modules() if not list(m.children())]
        hooks = [m.register_forward_hook(lambda _, __, out: count.__setitem__(0, count[0] + out.numel()))
                 for m in leaves]
        try:
            self.evaluate(torch.zeros(self.dim, dtype=self.dtype), torch.zeros(1, *shape, dtype=self.dtype))
        finally:
            for hook in hooks:
                hook.remove()
        return count[0]

    def state_dict(self, w: Tensor) -> dict[str, Tensor]:
        """A model `[d]` as the module's `state_dict` (parameters as copies, buffers as the module holds them), which
        `module.load_state_dict` takes."""
        state = {name: value.detach().clone() for name, value in self.module.state_dict().items()}
        state.update({name: value.detach().clone() for name, value in self.unflatten(w).items()})
        return state


def _seed(device: torch.device, seed: int) -> None:
    """`torch.manual_seed(seed)` where it serves a tensor on `device`: on the CPU, its generator alone, since
    `torch.manual_seed` there also queues the seeding of the GPUs while CUDA is not initialised, with a formatted
    stack trace each time (~2 ms a call on this project's loaded CPU, once per client and step)."""
    if device.type == "cuda":
        torch.manual_seed(seed)  # CUDA is initialised: every generator seeded at once, none queued
    else:
        torch.default_generator.manual_seed(seed)


def table() -> list[dict]:
    """The rows of TABLE (none where it is absent)."""
    return json.loads(TABLE.read_text())["rows"] if TABLE.is_file() else []


def choose_layout(model: str, dim: int, device: str) -> str:
    """The layout `auto` runs: among the table's rows of this device type (those of the model by name where it has
    any), the rows nearest its `dim` parameters within SIZE_REACH (the same model on other data has other sizes),
    the layout with the smallest median time relative to the plain `torch.nn` loop; DEFAULT_LAYOUT where no row
    speaks for it."""
    rows = [row for row in table() if row["device"] == device]
    rows = [row for row in rows if row["model"] == model] or rows
    distance = lambda row: abs(math.log(row["dim"] / dim))  # noqa: E731
    nearest = min(map(distance, rows), default=math.inf)
    if nearest > math.log(SIZE_REACH):
        return DEFAULT_LAYOUT.get(device, "vmap")
    near = [row for row in rows if distance(row) <= nearest + 1e-9]
    medians = {layout: statistics.median(row["ratios"][layout] for row in near) for layout in LAYOUTS
               if all(layout in row["ratios"] for row in near)}
    return min(medians, key=medians.__getitem__) if medians else DEFAULT_LAYOUT.get(device, "vmap")
