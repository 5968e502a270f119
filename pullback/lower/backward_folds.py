"""Which backward steps of a training plan a step next to them can take over.

A dense layer's product and the bias added to it: their backward steps run as one
(`BackwardOps.matmul_bias_backward`), where the bias add's step would sum its
cotangent over the rows (a pass over the whole of it, usually from memory) and the
product's step then read it again. In one step the bias's column sums run beside the
weight gradient's product, on the columns each of its split parts has just read.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ops.elementwise import add_p
from ..ops.linalg import matmul_p
from .graph import Eqn, StaticGraph


@dataclass(frozen=True)
class MatmulBias:
    """A bias add (`add`) whose first operand only it reads, a product (`product`) of
    an operand of two or more dimensions by a matrix, and a bias of one value per
    column of the product."""

    add: Eqn
    product: Eqn


def matmul_bias_folds(graph: StaticGraph, active: set[int], kept: set[int]
                      ) -> dict[int, MatmulBias]:
    """Per bias add's output, the product it folds (see the module's docstring):
    `active` holds the values backward differentiates, `kept` the ones a caller reads
    (results and module state), whose own cotangents must stay as they are."""
    readers = {index: len(eqns) for index, eqns in graph.readers().items()}
    folds: dict[int, MatmulBias] = {}
    for eqn in graph.eqns:
        if eqn.primitive is not add_p or eqn.out.index not in active:
            continue
        product_out, bias = eqn.args
        product = getattr(product_out, "producer", None)
        if (product is None or product.primitive is not matmul_p
                or readers.get(product_out.index) != 1 or product_out.index in kept
                or product_out.index not in active
                or getattr(bias, "index", None) not in active):
            continue
        lhs, rhs = product.args
        if (len(getattr(rhs, "shape", ())) == 2 and len(getattr(lhs, "shape", ())) >= 2
                and bias.shape == product_out.shape[-1:] == eqn.out.shape[-1:]
                and bias.dtype == product_out.dtype == eqn.out.dtype
                and product_out.shape == eqn.out.shape):
            folds[eqn.out.index] = MatmulBias(eqn, product)
    return folds
