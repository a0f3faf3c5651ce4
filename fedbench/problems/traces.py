"""A problem's default minibatch gradient replayed from a trace (`Problem.grad`): the ATen operations of one backward
pass through its batched loss, recorded by `make_fx` for the inputs' layout (their shapes, strides, dtypes and
devices, and the batch's structure), then called without vmap's and autograd's cost per operation, which the few
small kernels of a plugin problem's gradient do not hide (`bench/plugin_grad.py`). A layout is traced once its
untraced calls have taken as long as tracing takes (IMPORT_SECONDS, TRACE_SECONDS), and gives the same values either
way: the replay runs the same kernels on the same operands.

A replay computes what the traced function computes, because a trace is used only where it cannot go stale:

- it holds the problem's tensors themselves, not copies, so that a change of one in place is seen;
- reassigning any attribute of the problem (`problem.center = ...`, a float too) discards its traces;
- a function that reads a tensor's value into Python (`.item()`, a branch on a value), draws random numbers, gives
  a result whose shape depends on values, or changes the problem's attributes is not traced: it runs as it is, as
  does one that `make_fx` cannot trace, and every call under `torch.compile` or a torch.func transform, or with
  inputs that require gradients.

What it does not see is a change inside a Python object the function reads without reassigning it (an element
of a list attribute, a key of a dict, an attribute of an attribute), nor a global: a loss that reads such changing
state belongs in a problem that overrides `grad`.
"""
from __future__ import annotations

import operator
import sys
import time
from typing import Any, Callable

import torch
from torch import Tensor
from torch.fx import GraphModule, Node, map_arg
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

SLOT = "_grad_traces"  # the problem's attribute that holds them; `Problem.__getstate__` leaves it out
LAYOUTS = 8  # layouts traced per problem; inputs of any other layout run untraced
# What a trace costs, in seconds of one CPU core: make_fx's first call in a process imports torch._dynamo and
# torch._inductor (1.15 s of CPU time here, 2.4-4 s of wall time on 2 cores under a load of 6-7), and a trace of the
# how-to's least squares takes 25-130 ms. A layout is traced once its untraced calls have taken as long (so that a
# short run, which would not win the import back, never pays it, and a long one pays at most about twice what the
# best choice would have).
IMPORT_SECONDS = 1.2
TRACE_SECONDS = 0.05
aten = torch.ops.aten
# Operations that return their input (or a view of it with the same shape and strides) where the shapes agree:
# dropped from a trace, where each costs a call.
SAME_SHAPE_ALIASES = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                                aten.expand.default, aten.permute.default, aten.alias.default, aten.detach.default})
# Operations whose result depends on their input's shape alone: the seed of a backward pass (`ones_like` of the loss).
SHAPE_ONLY = frozenset({aten.ones_like.default, aten.zeros_like.default, aten.full_like.default})
# What a replay would not repeat faithfully: a value read into Python, a result of data-dependent shape, a draw.
UNTRACEABLE_TAGS = frozenset({torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape,
                              torch.Tag.nondeterministic_seeded})


class Untraceable(Exception):
    """An operation whose trace a replay would not repeat faithfully."""


class RefuseUntraceable(TorchDispatchMode):
    """Raises `Untraceable` at an operation tagged as one of UNTRACEABLE_TAGS, before it runs (so that a refused
    trace draws nothing)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if UNTRACEABLE_TAGS.intersection(func.tags):
            raise Untraceable(str(func))
        return func(*args, **(kwargs or {}))


class Traces:
    """The traces of one problem: by layout, a graph, or None where the function was not traceable there; the
    seconds its untraced calls have taken by layout, until it is traced; and the problem's attribute values when
    these were counted (held, so that no other object takes their ids)."""

    def __init__(self) -> None:
        self.attributes: tuple = ()
        self.graphs: dict[tuple, GraphModule | None] = {}
        self.untraced_seconds: dict[tuple, float] = {}
        self.enabled = True  # False once tracing changed the problem's attributes: never traced again


def transformed() -> bool:
    """Whether this call runs inside torch.compile's tracing or a `torch.func` transform (vmap, grad), where a
    computation must stay functional: torch 2.13 has no public test for the latter, so this private call is the one
    place that asks (a torch upgrade that moves it breaks here, and only here)."""
    return torch.compiler.is_compiling() or torch._C._functorch.peek_interpreter_stack() is not None


def replayed(problem: Any, function: Callable[[Tensor, Any], Tensor], w: Tensor, batch: Tensor | tuple) -> Tensor:
    """`function(w, batch)`, a function of the problem's point `w` and its batch (a tensor or a tuple of tensors,
    `gather`'s), replayed from its trace for the inputs' layout, traced once the layout's untraced calls have taken
    as long as tracing takes (IMPORT_SECONDS, TRACE_SECONDS; see the module's docstring for what runs untraced
    instead; a batch of another structure does too).

    Example:
        ```python
        def grad(self, w, batch):
            return replayed(self, self.autograd_grad, w, batch)
        ```
    """
    if transformed():
        return function(w, batch)
    inputs = (w, batch) if type(batch) is Tensor else (w, *batch) if type(batch) is tuple else ()
    traces = vars(problem).get(SLOT)
    if traces is None:
        traces = vars(problem)[SLOT] = Traces()
    if not (traces.enabled and inputs and all(type(tensor) is Tensor and not tensor.requires_grad
                                              for tensor in inputs)):
        return function(w, batch)
    attributes = tuple(vars(problem).values())
    if not same_objects(attributes, traces.attributes):
        traces.attributes, traces.graphs, traces.untraced_seconds = attributes, {}, {}
    layout = (type(batch), *((tensor.shape, tensor.stride(), tensor.dtype, tensor.device) for tensor in inputs))
    graph = traces.graphs.get(layout)
    if graph is not None:
        return graph.forward(*inputs)
    if layout in traces.graphs or len(traces.graphs) >= LAYOUTS:
        return function(w, batch)
    spent = traces.untraced_seconds.get(layout, 0.0)
    if spent < TRACE_SECONDS + (0.0 if "torch._dynamo" in sys.modules else IMPORT_SECONDS):
        start = time.perf_counter()
        result = function(w, batch)
        traces.untraced_seconds[layout] = spent + time.perf_counter() - start
        return result
    graph = traces.graphs[layout] = trace(function, type(batch) is tuple, inputs)
    if not same_objects(tuple(vars(problem).values()), attributes):
        traces.enabled, traces.graphs, graph = False, {}, None
    return function(w, batch) if graph is None else graph.forward(*inputs)


def same_objects(these: tuple, those: tuple) -> bool:
    """Whether two tuples hold the same objects, by identity (never comparing tensors' values)."""
    return len(these) == len(those) and all(map(operator.is_, these, those))


def trace(function: Callable[[Tensor, Any], Tensor], batch_is_tuple: bool, inputs: tuple[Tensor, ...]
          ) -> GraphModule | None:
    """`function`'s graph of ATen operations on `inputs`, a point and its batch (a tuple of the others where
    `batch_is_tuple`, else one tensor), without what depends on shapes alone (`fold_shape_constants`) nor the
    operations that return their input unchanged; None where it does not trace (an untraceable operation, or any
    failure: the call then runs untraced, and raises there if the function itself fails)."""
    def flat(w: Tensor, *batch: Tensor) -> Tensor:
        with RefuseUntraceable():
            return function(w, batch if batch_is_tuple else batch[0])

    try:
        graph = make_fx(flat)(*inputs)
        fold_shape_constants(graph)
        for node in list(graph.graph.nodes):
            if node.op == "call_function" and node.target in SAME_SHAPE_ALIASES:
                value, source = node.meta.get("val"), node.args[0].meta.get("val")
                if (isinstance(value, Tensor) and isinstance(source, Tensor) and value.shape == source.shape
                        and value.stride() == source.stride()):
                    node.replace_all_uses_with(node.args[0])
                    graph.graph.erase_node(node)
    except Exception:
        return None
    graph.graph.eliminate_dead_code()
    for node in graph.graph.nodes:
        node.meta.clear()  # the trace's fake tensors and stack traces, which the replay does not need
    graph.recompile()
    return graph


def fold_shape_constants(graph: GraphModule) -> None:
    """Replaces by its value, computed once, each result of a trace that depends on shapes alone, not on any input's
    or tensor attribute's values: the seed of the backward pass (`ones_like` of the loss) and what is computed from
    it alone (the scaling of a mean), so that the loss's value, which the gradient does not need, is no longer
    computed. Not in a graph that changes a tensor in place, and never a result that the graph returns (its caller
    may change that in place)."""
    nodes = [node for node in graph.graph.nodes if node.op == "call_function"]
    if not all(node.target is operator.getitem or isinstance(node.target, torch._ops.OpOverload)
               and not node.target._schema.is_mutable for node in nodes):
        return
    values: dict[Node, Any] = {}  # of the nodes that depend on shapes alone, in topological order

    def stand_in(node: Node) -> Any:  # a tensor of the node's shape, strides, dtype and device (traced as fakes)
        fake = node.meta["val"]
        return torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype, device=fake.device)

    for node in nodes:
        if node.target in SHAPE_ONLY or all(arg in values for arg in node.all_input_nodes):
            inputs = map_arg((node.args, node.kwargs), stand_in if node.target in SHAPE_ONLY else values.__getitem__)
            values[node] = node.target(*inputs[0], **inputs[1])
    for index, (node, value) in enumerate(values.items()):
        if (type(value) is Tensor and not all(user in values for user in node.users)
                and not any(user.op == "output" for user in node.users)):
            graph.register_buffer(f"_shape_constant{index}", value)
            with graph.graph.inserting_before(node):
                node.replace_all_uses_with(graph.graph.get_attr(f"_shape_constant{index}"))
