"""Every backward kernel of the CPU backends against its primitive's rule, linearized and
transposed (`rule_vjp`), in float64 and float32: the fast kernels are the only second
copy of a derivative, and this is where they are held to the first.

A case is (primitive, operands, params, kernel): `kernel(backend, upstream, operands,
output)` returns one gradient per operand, as the primitive's vjp asks for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import pullback as pb
from pullback.backend import backward_ops
from pullback.ops import conv, elementwise, linalg, recurrent, reduce
from pullback.ops.backward_defaults import rule_vjp


@dataclass
class Case:
    name: str
    prim: Any
    shapes: tuple
    kernel: Callable[..., tuple]
    params: dict
    domain: tuple = (-2.0, 2.0)


UNARY = {"relu": "output", "sigmoid": "output", "tanh": "output", "exp": "output",
         "log": "input", "sqrt": "output", "abs": "input", "silu": "input",
         "softplus": "input"}
BROADCAST = [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((4,), ())]
MATMUL = [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
          ((2, 1, 3, 4), (5, 4, 2))]


def _unary(name: str, saved: str) -> Case:
    def kernel(be, u, xs, y):
        return (getattr(be, f"{name}_backward")(u, xs[0] if saved == "input" else y),)

    positive = name in ("log", "sqrt")
    return Case(name, getattr(elementwise, f"{name}_p"), ((3, 5),), kernel, {},
                (0.5, 2.0) if positive else (-2.0, 2.0))


def _binary(name: str, shapes: tuple) -> Case:
    def kernel(be, u, xs, y):
        if name in ("add", "sub"):
            return getattr(be, f"{name}_backward")(u, xs[0].shape, xs[1].shape)
        return getattr(be, f"{name}_backward")(u, *xs)

    return Case(f"{name}{shapes}", getattr(elementwise, f"{name}_p"), shapes, kernel, {},
                (0.5, 2.0) if name == "div" else (-2.0, 2.0))


def _cases() -> list[Case]:
    cases = [_unary(name, saved) for name, saved in UNARY.items()]
    for approximate in ("none", "tanh"):
        cases.append(Case(f"gelu[{approximate}]", elementwise.gelu_p, ((3, 5),),
                          lambda be, u, xs, y, a=approximate: (be.gelu_backward(u, xs[0], a),),
                          {"approximate": approximate}))
    for name in ("softmax", "log_softmax"):
        for axis in (0, 1):
            cases.append(Case(
                f"{name}[{axis}]", getattr(reduce, f"{name}_p"), ((3, 5),),
                lambda be, u, xs, y, a=axis, n=name: (getattr(be, f"{n}_backward")(u, y, a),),
                {"axis": axis}))
    for shape, axes, keep in [((2, 3, 4), (0, 2), False), ((2, 3, 4), (1,), True)]:
        params = {"axes": axes, "keepdims": keep}
        cases.append(Case(f"sum{shape}{axes}{keep}", reduce.reduce_sum_p, (shape,),
                          lambda be, u, xs, y, a=axes, k=keep:
                          (be.reduce_sum_backward(u, xs[0].shape, a, k),), params))
        cases.append(Case(f"max{shape}{axes}{keep}", reduce.reduce_max_p, (shape,),
                          lambda be, u, xs, y, a=axes, k=keep:
                          (be.reduce_max_backward(u, xs[0], y, a, k),), params))
    for name in ("add", "sub", "mul", "div", "maximum", "minimum"):
        cases.extend(_binary(name, shapes) for shapes in BROADCAST)
    cases.extend(Case(f"matmul{shapes}", linalg.matmul_p, shapes,
                      lambda be, u, xs, y: be.matmul_backward(u, *xs), {})
                 for shapes in MATMUL)
    for stride, padding, groups in [((1, 1), (0, 0), 1), ((2, 1), (1, 2), 1),
                                    ((1, 1), (1, 1), 2)]:
        geometry = {"stride": stride, "padding": padding, "dilation": (1, 1), "groups": groups}
        cases.append(Case(
            f"conv2d{stride}{padding}{groups}", conv.conv2d_p,
            ((2, 4, 7, 6), (4, 4 // groups, 3, 2)),
            lambda be, u, xs, y, g=geometry: (
                be.conv2d_input_backward(u, xs[1], xs[0].shape, *g.values()),
                be.conv2d_weight_backward(u, xs[0], xs[1].shape, *g.values())),
            geometry))
    for kernel, stride, padding in [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 1), (1, 1))]:
        window = {"kernel": kernel, "stride": stride, "padding": padding}
        cases.append(Case(
            f"max_pool2d{kernel}{stride}{padding}", conv.max_pool2d_p, ((2, 2, 7, 6),),
            lambda be, u, xs, y, w=window: (be.max_pool2d_backward(u, xs[0], y, *w.values()),),
            {**window, "dilation": (1, 1)}))
        cases.append(Case(
            f"avg_pool2d{kernel}{stride}{padding}", conv.avg_pool2d_p, ((2, 2, 7, 6),),
            lambda be, u, xs, y, w=window: (
                be.avg_pool2d_backward(u, xs[0].shape, *w.values()),),
            window))
    # The states' cotangents (h and c; a GRU's h), a 4-step sequence.
    cases.append(Case("lstm_sequence", recurrent.lstm_sequence_p,
                      ((4, 3, 8), (3, 2), (3, 2), (8, 2)),
                      lambda be, u, xs, y: be.lstm_sequence_backward(u, *xs, y), {}))
    cases.append(Case("gru_sequence", recurrent.gru_sequence_p,
                      ((4, 3, 6), (3, 2), (6, 2), (6,)),
                      lambda be, u, xs, y: be.gru_sequence_backward(u, *xs, y), {}))
    return cases


CASES = _cases()
BACKENDS = {"cpu": pb.CpuBackend(), "threaded": pb.ThreadedCpuBackend(2)}
TOL = {np.float32: {"rtol": 2e-5, "atol": 2e-6}, np.float64: {"rtol": 1e-10, "atol": 1e-12}}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_backward_kernel_matches_the_rule_transposed(case, backend, dtype):
    be = BACKENDS[backend]
    rng = np.random.default_rng(11)
    xs = [rng.uniform(*case.domain, size=s).astype(dtype) for s in case.shapes]
    y = case.prim.impl(be, *xs, **case.params)
    u = rng.standard_normal(np.shape(y)).astype(dtype)
    got = case.kernel(be, u, xs, y)
    want = rule_vjp(case.prim, be, u, tuple(xs), y, case.params,
                    tuple(np.shape(x) for x in xs))
    assert len(got) == len(want)
    for g, w, x in zip(got, want, xs, strict=True):
        assert g.shape == x.shape and g.dtype == dtype
        np.testing.assert_allclose(g, np.broadcast_to(w, x.shape), **TOL[dtype])


def test_derive_default_refuses_a_kernel_backward_ops_does_not_have():
    with pytest.raises(ValueError, match="no kernel named 'nope_backward'"):
        backward_ops.derive_default("nope_backward", lambda *args: None)
