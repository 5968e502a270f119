"""The `BackwardExecutor` boundary: how the core's graphs meet real operands.

The core owns traversal and accumulation; an executor supplies execution.
The defaults here are complete for any operand type whose primitives have an
evaluator installed, which is how the core is tested on Python floats.
"""

from __future__ import annotations

from typing import Any

from .core import DerivativeError, Primitive
from .graph import Node, leaves_above, linearize_node
from .linear import LinearGraph, transpose_linear


class BackwardExecutor:
    """Executes what the core plans: forward replays, transposed linear graphs, sums."""

    def execute_forward(self, prim: Primitive, args: tuple, params: dict) -> Any:
        """Apply a primitive to concrete operands: how a checkpointed region's forward
        is replayed during backward (`replay_jvp`)."""
        return prim.bind(*args, **params)

    def saved_operands(self, node: Node) -> tuple[Any, Any]:
        """The saved (inputs, output) of a node, as the rules should see them."""
        return node.inputs, node.output

    def linearize_recorded_graph(self, node: Node) -> Any:
        """The linearization of one recorded node; override to memoize or to fuse."""
        inputs, output = self.saved_operands(node)
        return linearize_node(node, inputs, output)

    def run_transposed_linear(self, linearization: Any, ct: Any) -> tuple:
        """Cotangents of a node's operands (None where inactive) from its output's."""
        graph: LinearGraph = linearization
        return transpose_linear(graph, (ct,), self.add_operands)

    def release_saved(self, node: Node) -> None:
        """Free what a node saved once backward is done with it (`release`)."""
        node.release()

    def add_operands(self, a: Any, b: Any) -> Any:
        """Sum two cotangents reaching the same node."""
        return a + b

    def derivative_error(self, node: Node, err: DerivativeError) -> Exception:
        """The error for a node without the rule backward needs (rule 5)."""
        leaves = leaves_above(node)
        return DerivativeError(f"backward: {err}; it lies between {leaves} and the output")
