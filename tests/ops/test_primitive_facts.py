"""Facts a primitive carries for the other layers (fusion template, aliasing, buffer
writers, Tensor method, ONNX exporter): registered beside its declaration, read by
lowering, the tensor layer and export from the primitive itself."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback.ad import defjvp
from pullback.backend import CpuBackend, ThreadedCpuBackend
from pullback.kernels import scalar_math
from pullback.ops.elementwise import mul
from pullback.ops.registry import PRIMITIVES, Fusion, declare, dtype_of, shape_of


def _square() -> object:
    prim = declare("square_for_test", lambda backend, x: backend.mul(x, x),
                   lambda x: (shape_of(x), dtype_of(x)), register=False, aliasing="fresh",
                   fusion=Fusion("{0} * {0}"))
    defjvp(prim, lambda t, out, x: mul(mul(t, x), 2.0))
    return prim


def test_a_primitive_declaring_a_fusion_template_is_fused_with_no_edit_to_lowering():
    square = _square()
    x = np.random.default_rng(0).standard_normal((128, 64))

    def fn(x):
        return pb.tanh(square.bind(x)) * 2.0

    plan = pb.compile(fn, x)
    fused = [step for step in plan._schedule if step.fused]
    assert [[e.primitive.name for e in step.eqns] for step in fused] == [
        ["square_for_test", "tanh", "mul"]]
    np.testing.assert_allclose(plan(x).numpy(), fn(pb.tensor(x)).numpy(), rtol=1e-13)


def test_a_primitive_without_a_fusion_template_is_never_fused():
    prim = declare("plain_for_test", lambda backend, x: backend.mul(x, x),
                   lambda x: (shape_of(x), dtype_of(x)), register=False)
    x = np.random.default_rng(1).standard_normal((128, 64))
    plan = pb.compile(lambda x: pb.tanh(prim.bind(x)), x)
    assert not any(step.fused and any(e.primitive is prim for e in step.eqns)
                   for step in plan._schedule)


def test_declaration_refuses_facts_it_cannot_read():
    rule = lambda x: (shape_of(x), dtype_of(x))
    with pytest.raises(ValueError, match="aliasing must be one of"):
        declare("bad_aliasing", lambda backend, x: x, rule, register=False, aliasing="never")
    with pytest.raises(TypeError, match="fusion must be a Fusion"):
        declare("bad_fusion", lambda backend, x: x, rule, register=False, fusion="{0}")
    # A fused chain's scalar functions share one scope: a name stands for one function.
    with pytest.raises(ValueError, match="'tanh' already stands for another function"):
        declare("bad_scope", lambda backend, x: x, rule, register=False,
                fusion=Fusion("tanh({0})", {"tanh": scalar_math.exp}))


def test_tensor_methods_are_the_functions_their_primitives_declare():
    declared = {p.method.__name__: p.method for p in PRIMITIVES.values() if p.method}
    assert {"tanh", "softplus", "relu", "softmax", "max", "clip", "maximum"} <= set(declared)
    for name, fn in declared.items():
        assert getattr(pb.Tensor, name) is fn


def test_primitives_that_may_return_a_view_do_not_claim_a_fresh_result():
    assert PRIMITIVES["reshape"].aliasing == PRIMITIVES["transpose"].aliasing == "view"
    assert PRIMITIVES["getitem"].aliasing == PRIMITIVES["astype"].aliasing == "may"
    assert PRIMITIVES["matmul"].aliasing == PRIMITIVES["tanh"].aliasing == "fresh"


def test_only_the_cpu_backends_themselves_run_plan_kernels():
    class Subclass(CpuBackend):
        pass

    assert CpuBackend().runs_plan_kernels()
    assert ThreadedCpuBackend(num_threads=2).runs_plan_kernels()
    assert not Subclass().runs_plan_kernels()
    assert not pb.Backend().runs_plan_kernels()


@pytest.mark.parametrize("backend", [CpuBackend(), ThreadedCpuBackend(num_threads=2)],
                         ids=["cpu", "threaded"])
def test_relu_backward_writes_into_the_buffer_it_is_given(backend):
    rng = np.random.default_rng(2)
    upstream, y = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    out = np.empty_like(upstream)
    assert backend.relu_backward(upstream, y, out=out) is out
    np.testing.assert_array_equal(out, backend.relu_backward(upstream, y))
