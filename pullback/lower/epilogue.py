"""Convolutions and matrix products with their epilogue, each run as one step.

A conv2d followed by an add, a multiply and an add per channel (a bias, an inference
plan's folded batch norm's scale and shift), a residual add and a relu (each optional,
in that order) runs as the backend's fused `conv2d_epilogue`, which applies them to
each chunk of the output while it is in cache instead of a pass over memory per op
afterwards. A product by a matrix (a dense layer's) followed by the add of a bias over
its last axis, and a relu (optional), runs as `matmul_epilogue`, which applies them to
each part's block of the product on its own thread, right after it.

A member joins only through a value with no other reader that is not a result of the
plan (nor state, nor saved for a training plan's backward: `pinned`), so no
intermediate is ever needed; the step runs where its last member was, when every
operand exists. Results are bit for bit the ops one by one. In a training plan a
convolution or dense layer, its bias and the relu after it are such a step (relu's
backward reads its own output, the bias add's nothing, a product's its operands); a
training batch norm is no member.
"""

from __future__ import annotations

import math
from typing import Any

from ..backend.fused import fused_ops
from ..kernels.core import SUPPORTED_DTYPES
from ..ops.conv import conv2d_p
from ..ops.elementwise import add_p, mul_p, relu_p
from ..ops.linalg import matmul_p
from .graph import Eqn, StaticGraph, Var

# The members' roles, in the only order they join.
BIAS, SCALE, SHIFT, RESIDUAL, RELU = range(5)


def conv_epilogues(graph: StaticGraph, pinned: set[int]) -> dict[int, list[tuple]]:
    """Per convolution that has an epilogue, keyed by id() of its last member: the
    members as (equation, role, its operand besides the convolution's partial result),
    the conv2d first (role and operand None)."""
    readers = graph.readers()
    groups: dict[int, list[tuple]] = {}
    # An add may follow two convolutions (a residual block's two branches): the first
    # takes it, with the other's result as its residual; the other stops before it.
    claimed: set[int] = set()
    for eqn in graph.eqns:
        if eqn.primitive is not conv2d_p or eqn.out.dtype not in SUPPORTED_DTYPES:
            continue
        members: list[tuple] = [(eqn, None, None)]
        value, next_role = eqn.out, BIAS
        while value.index not in pinned and len(readers.get(value.index, ())) == 1:
            (reader,) = readers[value.index]
            role = None if id(reader) in claimed else _role(reader, value, next_role)
            if role is None:
                break
            other = None if role == RELU else (
                reader.args[1] if reader.args[0] is value else reader.args[0])
            members.append((reader, role, other))
            value, next_role = reader.out, role + 1
        if len(members) > 1:
            groups[id(members[-1][0])] = members
            claimed.update(id(e) for e, _, _ in members)
    return groups


# A dense layer's product joins its bias (and relu) from this many multiply-adds: where
# it splits over the cores, each part's block is then in cache. Below, a fused chain of
# the add and the relu after the product was faster: the digits MLP's (128 x 64 x 256
# and 128 x 256 x 256) plan step took 2-2.5% longer as epilogues, GPT's (2048 x 128 x
# 128 and up) 3.3% less (bench/RESULTS.md).
MIN_PRODUCT = 1 << 24


def matmul_epilogues(graph: StaticGraph, pinned: set[int]) -> dict[int, list[tuple]]:
    """Per matrix product by a matrix (a dense layer's) of at least MIN_PRODUCT
    multiply-adds whose result an add of a bias over its last axis alone reads, maybe
    an add of a value of the result's shape after that (a residual connection's), and
    maybe a relu after that: keyed by id() of the last member, the members as
    `conv_epilogues` gives them (BIAS, RESIDUAL, then RELU)."""
    readers = graph.readers()

    def only_reader(value: Var) -> Eqn | None:
        found = readers.get(value.index, [])
        return found[0] if value.index not in pinned and len(found) == 1 else None

    groups: dict[int, list[tuple]] = {}
    for eqn in graph.eqns:
        a, b = (eqn.args + (None, None))[:2]
        value = eqn.out
        if (eqn.primitive is not matmul_p or value.dtype not in SUPPORTED_DTYPES
                or not isinstance(a, Var) or not isinstance(b, Var) or len(b.shape) != 2
                or len(a.shape) < 2 or math.prod(a.shape) * b.shape[1] < MIN_PRODUCT):
            continue
        add = only_reader(value)
        if (add is None or add.primitive is not add_p or len(add.args) != 2
                or value not in add.args or add.out.shape != value.shape
                or add.out.dtype != value.dtype):
            continue
        bias = add.args[1] if add.args[0] is value else add.args[0]
        if not isinstance(bias, Var) or bias.shape != value.shape[-1:] \
                or bias.dtype != value.dtype:
            continue
        members: list[tuple] = [(eqn, None, None), (add, BIAS, bias)]
        last = add.out
        residual = only_reader(last)
        if (residual is not None and residual.primitive is add_p and len(residual.args) == 2
                and last in residual.args and residual.out.shape == last.shape
                and residual.out.dtype == last.dtype):
            other = residual.args[1] if residual.args[0] is last else residual.args[0]
            if isinstance(other, Var) and other is not last and other.shape == last.shape \
                    and other.dtype == last.dtype:
                members.append((residual, RESIDUAL, other))
                last = residual.out
        relu = only_reader(last)
        if relu is not None and relu.primitive is relu_p:
            members.append((relu, RELU, None))
        groups[id(members[-1][0])] = members
    return groups


def _role(eqn: Eqn, value: Var, earliest: int) -> int | None:
    """What `eqn`, the only reader of the convolution's (partial) result `value`, does
    in an epilogue, if anything it may still do after the roles before `earliest`."""
    if eqn.out.shape != value.shape or eqn.out.dtype != value.dtype:
        return None
    if eqn.primitive is relu_p:
        return RELU
    if eqn.primitive not in (add_p, mul_p) or len(eqn.args) != 2 or value not in eqn.args:
        return None
    other = eqn.args[1] if eqn.args[0] is value else eqn.args[0]
    if not isinstance(other, Var) or other is value or other.dtype != value.dtype:
        return None
    channels = value.shape[1]
    per_channel = other.shape in ((1, channels, 1, 1), (channels, 1, 1))
    if eqn.primitive is mul_p:
        return SCALE if earliest <= SCALE and per_channel else None
    if per_channel and earliest <= SHIFT:
        return BIAS if earliest <= BIAS else SHIFT
    if earliest <= RESIDUAL and other.shape == value.shape:
        return RESIDUAL
    return None


def lower_epilogue(members: list[tuple], constants: set[int]) -> tuple[Any, tuple]:
    """The step's implementation (taking `out=`, a buffer) and its operands: the
    convolution's input and weights, then the bias and the residual where present; or
    a matrix product's operands and its bias (`matmul_epilogues`). `constants`: the
    constants lowering computed, which only the plan holds and nothing changes (a
    folded batch norm's weights): a backend may keep what it derives from such weights
    (`constant_weights`). A caller's arrays are not among them: changed in place, the
    plan reads their new values."""
    conv = members[0][0]
    if conv.primitive is matmul_p:
        return _lower_matmul(members)
    roles = {role: other for _, role, other in members[1:]}
    vectors = [role for role in (BIAS, SCALE, SHIFT) if role in roles]
    args = (*conv.args, *(roles[role] for role in vectors))
    has_residual = RESIDUAL in roles
    if has_residual:
        args += (roles[RESIDUAL],)
    relu = RELU in roles
    channels = conv.out.shape[1]
    stride, padding, dilation, groups = (conv.params[k] for k in
                                         ("stride", "padding", "dilation", "groups"))
    weights = conv.args[1]
    # Only where it holds: a backend's override written before the flag still runs.
    kept = {"constant_weights": True} if isinstance(weights, Var) and \
        weights.index in constants else {}

    def run(backend: Any, x: Any, w: Any, *rest: Any, out: Any = None) -> Any:
        given = dict(zip(vectors, rest))
        bias, scale, shift = (backend.reshape(given[role], (channels,)) if role in given
                              else None for role in (BIAS, SCALE, SHIFT))
        residual = rest[-1] if has_residual else None
        if out is not None and backend.runs_plan_kernels():
            return backend.conv2d_epilogue(x, w, bias, scale, shift, residual, relu, stride,
                                           padding, dilation, groups, out=out, **kept)
        return fused_ops(backend).conv2d_epilogue(x, w, bias, scale, shift, residual, relu,
                                                  stride, padding, dilation, groups, **kept)

    return run, args


def _lower_matmul(members: list[tuple]) -> tuple[Any, tuple]:
    roles = {role: other for _, role, other in members[1:]}
    relu = RELU in roles
    extra = (roles[RESIDUAL],) if RESIDUAL in roles else ()

    def run(backend: Any, a: Any, b: Any, bias: Any, *residual: Any, out: Any = None) -> Any:
        added = residual[0] if residual else None
        if backend.runs_plan_kernels():
            return backend.matmul_epilogue(a, b, bias, relu, out=out, residual=added)
        return fused_ops(backend).matmul_epilogue(a, b, bias, relu, residual=added)

    return run, (*members[0][0].args, roles[BIAS], *extra)
