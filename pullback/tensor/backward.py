"""The eager executor: how recorded graphs are run backwards on the current backend.

Per node it takes the cheapest correct path: the backend's fused backward
kernel (when the backend has `BackwardOps` and the backward is not itself
recorded), the primitive's own transpose rule (a linear primitive is its own
linearization), or the core's linearize-then-transpose.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ad import (
    BackwardExecutor,
    DerivativeError,
    GraphReleasedError,
    Leaf,
    LinearGraph,
    Node,
    Primitive,
    backward_pass,
    leaves_above,
    linearize_node,
    transpose_linear,
    transpose_node,
    transposes_directly,
)
from ..backend.backward_ops import BackwardOps
from ..backend.current import get_backend
from . import hooks
from .eager import Tensor, wrap
from .state import grad_mode

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from ..ops.hints import TensorLike

# Whether eager backward may use backends' fused kernels; off, every node goes through
# the primitive's rules (transpose of its JVP), which is what checks compare against.
_FUSED = [True]


@contextmanager
def fused_kernels(enabled: bool) -> Iterator[None]:
    """Allow or forbid fused backward kernels inside the block (for checking rules)."""
    previous = _FUSED[0]
    _FUSED[0] = enabled
    try:
        yield
    finally:
        _FUSED[0] = previous


class EagerExecutor(BackwardExecutor):
    """Executes the core's backward plans on arrays, or on recorded tensors for
    `create_graph`; memoizes each node's linearization when asked to (`vjp`
    functions called many times)."""

    def __init__(self, create_graph: bool = False, memoize: bool = False):
        self.backend = get_backend()
        self.create_graph = create_graph
        self.fused = _FUSED[0] and not create_graph and isinstance(self.backend, BackwardOps)
        self.memo: dict[int, Any] | None = {} if memoize else None

    def execute_forward(self, prim: Primitive, args: tuple[Any, ...], params: dict[str, Any]
                        ) -> Any:
        with grad_mode(self.create_graph):
            out = prim.bind(*args, **params)
        # Recorded for create_graph; otherwise an array, as the rules see saved values.
        return out if self.create_graph or type(out) is not Tensor else out._data

    def saved_operands(self, node: Node) -> tuple[Any, Any]:
        if node.released:
            raise GraphReleasedError(
                f"backward: the saved values of {node.primitive.name} were freed by an earlier "
                "backward; pass retain_graph=True to the first backward to go through the "
                "graph twice"
            )
        if not self.create_graph:
            return node.inputs, node.output
        # Higher order: the saved values must stay connected to the graph that made them.
        inputs = node.inputs
        if inputs is not None:
            inputs = tuple(
                wrap(v, p) if type(v) is np.ndarray else v for v, p in zip(inputs, node.parents)
            )
        output = wrap(node.output, node) if node.output is not None else None
        return inputs, output

    def linearize_recorded_graph(self, node: Node) -> Node | LinearGraph:
        """The node itself where its backward is one step (a fused kernel, a transpose
        rule), else its linearization (memoized when asked)."""
        prim = node.primitive
        if (self.fused and prim.vjp is not None) or transposes_directly(node):
            if node.released:
                self.saved_operands(node)  # raises the clear error
            return node
        memo = self.memo
        if memo is not None and id(node) in memo:
            graph: LinearGraph = memo[id(node)]
            return graph
        inputs, output = self.saved_operands(node)
        with grad_mode(self.create_graph):
            graph = linearize_node(node, inputs, output)
        if memo is not None:
            memo[id(node)] = graph
        return graph

    def run_transposed_linear(self, linearization: Node | LinearGraph, ct: Any
                              ) -> tuple[Any, ...]:
        if isinstance(linearization, LinearGraph):
            with grad_mode(self.create_graph):
                cts = transpose_linear(linearization, (ct,), self.add_operands)
            return self._unwrap(cts)
        node = linearization
        prim = node.primitive
        if self.fused and prim.vjp is not None:
            fused: tuple[Any, ...] = prim.vjp(self.backend, ct, node)
            return fused
        inputs, _ = self.saved_operands(node)
        with grad_mode(self.create_graph):
            return self._unwrap(transpose_node(node, inputs, ct))

    def _unwrap(self, cts: Sequence[Any]) -> tuple[Any, ...]:
        if self.create_graph:
            return tuple(cts)
        return tuple(c._data if type(c) is Tensor else c for c in cts)

    def add_operands(self, a: Any, b: Any) -> Any:
        if type(a) is np.ndarray and type(b) is np.ndarray:
            # Two constants (even under create_graph: nothing to record), through the
            # backend: NumPy's `+` turns a 0-d sum into a NumPy scalar.
            return self.backend.add(a, b)
        with grad_mode(self.create_graph):
            return a + b

    def derivative_error(self, node: Node, err: DerivativeError) -> Exception:
        return DerivativeError(
            f"backward: {err}, and it lies between {describe_leaves(node)} and the output; "
            "give the op a derivative rule, or keep it off the path to the loss "
            "(detach its input)"
        )


def describe_leaves(node: Node) -> str:
    """Name the differentiation inputs a node depends on, for error messages."""
    names = []
    for leaf in leaves_above(node):
        label = f"parameter {leaf.name}" if leaf.name else "the tensor"
        names.append(f"{label} of shape {leaf.shape} ({leaf.dtype})")
    return " and ".join(names[:3]) + (" and others" if len(names) > 3 else "") or "no input"


def run_backward(output: Tensor, grad: TensorLike | None, retain_graph: bool | None,
                 create_graph: bool) -> None:
    """`Tensor.backward`: push `grad` from `output` to every leaf's `.grad`."""
    node = output._node
    if node is None:
        raise RuntimeError(
            f"backward: this tensor (shape {output.shape}, {output.dtype}) does not require "
            "grad: none of the tensors it was computed from requires grad"
        )
    ct = initial_cotangent("backward", output, grad)
    if create_graph:
        ct = ct if isinstance(ct, Tensor) else wrap(ct, None)
    elif isinstance(ct, Tensor):
        ct = ct._data
    retain = create_graph if retain_graph is None else retain_graph
    executor = EagerExecutor(create_graph=create_graph)
    if hooks.active() and not create_graph:
        # Each leaf's gradient is handed over the moment it is final, so that the
        # gradient-ready hooks (an allreduce) overlap the rest of the backward.
        def ready(leaf: Leaf, leaf_ct: Any) -> None:
            owner = leaf.owner() if leaf.owner is not None else None
            if owner is not None:
                accumulate_grad(owner, leaf_ct, False)
                hooks.gradient_ready(owner)

        backward_pass([(node, ct)], executor, release=not retain, on_result=ready)
        return
    leaf_cts = backward_pass([(node, ct)], executor, release=not retain)
    for leaf, leaf_ct in leaf_cts.items():
        owner = leaf.owner() if leaf.owner is not None else None
        if owner is not None:
            accumulate_grad(owner, leaf_ct, create_graph)


def owned(arrays: list[Any], given: tuple[Any, ...] = ()) -> list[Any]:
    """Gradients handed to the caller, each with its own buffer: a cotangent may be
    passed through unchanged, so one array can reach two inputs, or be the caller's."""
    seen = {id(a) for a in given}
    result = []
    for a in arrays:
        if type(a) is np.ndarray:
            if id(a) in seen:
                a = a.copy()
            seen.add(id(a))
        result.append(a)
    return result


def initial_cotangent(op: str, output: Tensor, grad: TensorLike | None
                      ) -> NDArray[Any] | Tensor:
    """The cotangent a backward starts from: `grad` checked against the output (one for a
    one-element output when None), as an array, or a tensor when `grad` is recorded."""
    if grad is None:
        if output.size != 1:
            raise RuntimeError(
                f"{op}: grad can be left out only for a one-element output; this one has "
                f"shape {output.shape}: pass grad= with that shape"
            )
        return np.ones(output.shape, dtype=output.dtype)
    data = grad._data if isinstance(grad, Tensor) else np.asarray(grad, dtype=output.dtype)
    if data.shape != output.shape or data.dtype != output.dtype:
        raise ValueError(
            f"{op}: grad has shape {data.shape} and dtype {data.dtype}, but the output has "
            f"shape {output.shape} and dtype {output.dtype}"
        )
    return grad if isinstance(grad, Tensor) and grad._node is not None else data


def accumulate_grad(tensor: Tensor, ct: NDArray[Any] | Tensor, create_graph: bool) -> None:
    """Add a cotangent to a leaf's `.grad`, as PyTorch accumulates."""
    if create_graph:
        value = ct if isinstance(ct, Tensor) else wrap(ct, None)
        tensor.grad = value if tensor.grad is None else tensor.grad + value
        return
    if isinstance(ct, Tensor):
        ct = ct._data
    if tensor.grad is None:
        # Own the buffer (a cotangent may be a view or shared with another leaf), in C
        # order like the parameter: a transposed gradient would make every optimizer
        # pass over it strided.
        tensor.grad = wrap(np.array(ct, dtype=tensor.dtype, copy=True, order="C"), None)
    else:
        # Through the backend, not `+`: NumPy's operators turn a 0-d sum into a NumPy
        # scalar, and a tensor's data is always an array.
        tensor.grad = wrap(get_backend().add(tensor.grad._data, ct), None)


def backward(self: Tensor, grad: TensorLike | None = None, retain_graph: bool | None = None,
             create_graph: bool = False) -> None:
    """Accumulate d(self)/d(leaf) into each leaf's `.grad` (as PyTorch does).

    `grad` defaults to one for a one-element tensor. The graph's saved
    values are freed afterwards unless `retain_graph` (which
    `create_graph` implies); `create_graph` records the backward itself,
    for higher derivatives.
    """
    run_backward(self, grad, retain_graph, create_graph)


Tensor.backward = backward  # type: ignore[method-assign]  # declared in eager.py for type checkers
