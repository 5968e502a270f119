"""The recorded graph of eager ops, its traversals and its linearization.

Each eager op that involves an active operand records a `Node` holding exactly
what its rules need (see `Primitive.saves_inputs` / `saves_output`). A tensor
that is a differentiation input holds a `Leaf`. Traversals are iterative, so a
chain of any length differentiates without touching the recursion limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .core import DerivativeError, LinearVar, Primitive, Zero, jvp_of
from .linear import LinearGraph

if TYPE_CHECKING:
    from .executor import BackwardExecutor


class Node:
    """One recorded primitive application.

    `parents` has one entry per operand: the operand's node, or None for an
    inactive operand (a constant, a scalar, a tensor that needs no gradient).
    `inputs` and `output` hold the saved forward values, or None where the
    rules do not need them. `in_shapes` / `out_shape` / `dtype` describe the
    operands for symbolic zeros and broadcasting.
    """

    __slots__ = (
        "__weakref__",
        "dtype",
        "in_shapes",
        "inputs",
        "out_shape",
        "output",
        "params",
        "parents",
        "primitive",
        "released",
    )

    def __init__(
        self,
        primitive: Primitive,
        params: dict,
        parents: tuple,
        inputs: tuple | None,
        output: Any,
        in_shapes: tuple,
        out_shape: Any,
        dtype: Any,
    ):
        self.primitive = primitive
        self.params = params
        self.parents = parents
        self.inputs = inputs
        self.output = output
        self.in_shapes = in_shapes
        self.out_shape = out_shape
        self.dtype = dtype
        self.released = False

    def release(self) -> None:
        """Drop the saved forward values; a later backward through here is an error."""
        self.inputs = None
        self.output = None
        self.released = True

    def __repr__(self) -> str:
        return f"Node({self.primitive.name}, out={self.out_shape})"


class Leaf:
    """The node of a differentiation input: where cotangents stop and are collected."""

    __slots__ = ("__weakref__", "dtype", "name", "owner", "parents", "shape")
    primitive = None

    def __init__(self, shape: Any, dtype: Any, owner: Any = None, name: str | None = None):
        self.shape = shape
        self.dtype = dtype
        self.owner = owner  # set by the layer above: e.g. a weak reference to the tensor
        self.name = name  # a parameter's name, for error messages
        self.parents = ()

    def __repr__(self) -> str:
        return f"Leaf({self.shape}, {self.dtype})"


class GraphReleasedError(RuntimeError):
    """Backward reached a node whose saved values were freed by an earlier backward."""


def toposort(roots: Iterable[Any]) -> list:
    """Nodes reachable from `roots`, each after all of its parents."""
    order: list = []
    seen: set = set()
    for root in roots:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(root.parents))]
        while stack:
            node, parents = stack[-1]
            for parent in parents:
                if parent is not None and parent not in seen:
                    seen.add(parent)
                    stack.append((parent, iter(parent.parents)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def relevant_to(order: list, targets: Iterable[Any]) -> list:
    """The nodes of `order` (parents first) that depend on at least one target."""
    depends = {id(t) for t in targets}
    kept = []
    for node in order:
        if id(node) in depends or any(
            p is not None and id(p) in depends for p in node.parents
        ):
            depends.add(id(node))
            kept.append(node)
    return kept


def leaves_above(node: Any) -> list:
    """The leaves that `node` depends on, nearest first."""
    return [n for n in reversed(toposort([node])) if n.primitive is None]


def linearize_node(node: Node, inputs: tuple | None, output: Any) -> LinearGraph:
    """Trace a recorded node's JVP rule into a linear graph.

    The graph has one input per operand (None for an inactive operand, which
    gets no cotangent); its single output is the tangent of the node's output.
    """
    prim = node.primitive
    if node.released:
        raise GraphReleasedError(
            f"backward: the saved values of {prim.name} were freed by an earlier backward; "
            "pass retain_graph=True to the first backward to go through the graph twice"
        )
    graph = LinearGraph()
    tangents: list[Zero | LinearVar] = []
    for parent, shape in zip(node.parents, node.in_shapes):
        if parent is None:
            graph.inputs.append(None)  # one slot per operand; an inactive one gets no ct
            tangents.append(Zero(shape, node.dtype))
        else:
            tangents.append(graph.new_input(shape, node.dtype))
    if inputs is None:
        inputs = (None,) * len(tangents)
    out = jvp_of(prim, tuple(tangents), output, inputs, node.params)
    graph.outputs = [out if out is not None else Zero(node.out_shape, node.dtype)]
    return graph


def transposes_directly(node: Node) -> bool:
    """Whether the node's own transpose rule gives every needed cotangent: the
    primitive is linear in each active operand with the others held constant."""
    prim = node.primitive
    if prim.transpose is None:
        return False
    linear = prim.linear_args
    return all(p is None or i in linear for i, p in enumerate(node.parents))


def transpose_node(node: Node, inputs: tuple | None, ct: Any) -> list:
    """Cotangents of the operands of a node that `transposes_directly` (None where
    inactive), from its transpose rule alone: a linear primitive is its own
    linearization, so no JVP is traced. `inputs` are its saved operands."""
    prim = node.primitive
    transpose = prim.transpose
    assert transpose is not None  # the caller asked `transposes_directly` first
    n = len(node.parents)
    if inputs is None:
        inputs = (None,) * n
    if prim.bilinear:
        # Bilinear: transpose in each active operand with the other held constant.
        return [
            None if parent is None else transpose(ct, *(
                LinearVar(None, node.in_shapes[i], node.dtype) if i == index else inputs[i]
                for i in range(n)), **node.params)[index]
            for index, parent in enumerate(node.parents)
        ]
    # Jointly linear: one transpose; an inactive operand that was not saved is passed
    # as a symbolic zero, which carries its shape.
    args = tuple(
        LinearVar(None, node.in_shapes[i], node.dtype) if node.parents[i] is not None
        else inputs[i] if inputs[i] is not None
        else Zero(node.in_shapes[i], node.dtype)
        for i in range(n)
    )
    return [c if p is not None else None
            for c, p in zip(transpose(ct, *args, **node.params), node.parents)]


def linearize_graph(
    output_nodes: Sequence[Any], input_nodes: Sequence[Any], executor: BackwardExecutor
) -> LinearGraph:
    """One linear graph for a whole recorded computation: input tangents to output tangents.

    Each node's JVP rule is traced in order; `executor.saved_operands(node)`
    gives the values the rules see (so a higher-order executor can hand out
    values that are themselves recorded).
    """
    graph = LinearGraph()
    tangent: dict[int, Any] = {}
    for node in input_nodes:
        var = graph.new_input(_shape(node), node.dtype)
        tangent.setdefault(id(node), var)
    order = relevant_to(toposort(output_nodes), input_nodes)
    for node in order:
        if node.primitive is None or id(node) in tangent:
            continue
        tangents = tuple(
            tangent.get(id(p), Zero(shape, node.dtype)) if p is not None
            else Zero(shape, node.dtype)
            for p, shape in zip(node.parents, node.in_shapes)
        )
        inputs, output = executor.saved_operands(node)
        if inputs is None:
            inputs = (None,) * len(tangents)
        try:
            out = jvp_of(node.primitive, tangents, output, inputs, node.params)
        except DerivativeError as err:
            raise executor.derivative_error(node, err) from None
        if out is not None:
            tangent[id(node)] = out
    graph.outputs = [tangent.get(id(n), Zero(_shape(n), n.dtype)) for n in output_nodes]
    return graph


def _shape(node: Any) -> Any:
    return node.shape if node.primitive is None else node.out_shape
