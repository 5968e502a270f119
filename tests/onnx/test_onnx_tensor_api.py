"""The tensor API of today's models through ONNX: min, prod, norm, argmax and argmin
export (ReduceMin, ReduceProd, ReduceL1/ReduceL2, ArgMax, ArgMin) and run in
onnxruntime and in pullback alike; ops composed of where, reshape and transpose
(tril, masked_fill, squeeze, unsqueeze, permute, flatten, einsum) export as those; and
the converters read the same ONNX ops, checked against onnxruntime one node at a time."""

from __future__ import annotations

import numpy as np
import pytest
from graphs import node_model, run_onnxruntime
from test_onnx_export import _check_export, _ops

import pullback as pb
import pullback.onnx

rng = np.random.default_rng(12)


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_reductions_and_index_reductions_export(tmp_path):
    def fn(x):
        a = pb.min(x, axis=(0, 2), keepdims=True) + x.prod(axis=1, keepdims=True)
        b = pb.norm(x, axis=-1) + pb.norm(x, 1, axis=0).sum() + pb.norm(x, 3, axis=(1, 2))[:, None]
        return a, b, pb.argmax(x, axis=1), x.argmin(), pb.argmax(x, keepdims=True)

    proto = _check_export(fn, f32(2, 3, 4), tmp_path=tmp_path)
    assert {"ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1", "ArgMax", "ArgMin"} <= _ops(proto)


def test_shape_and_mask_spellings_export_as_the_ops_they_are_made_of(tmp_path):
    def fn(x, y):
        a = pb.tril(x, -1) + pb.triu(x, 1) * 2.0
        b = pb.masked_fill(a, a > 0.5, -1.0).unsqueeze(0).permute(1, 0, 2).flatten(1)
        c = pb.einsum("bij,bjk->bik", pb.squeeze(y, 1), pb.unsqueeze(x, 0).permute(1, 2, 0))
        return b, c, pb.var(x, axis=1), sum(pb.split(x, [1, 2], axis=0)[1])

    proto = _check_export(fn, f32(3, 3), f32(3, 1, 2, 3), tmp_path=tmp_path)
    assert {"Where", "Transpose", "MatMul"} <= _ops(proto)


def i64(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


TIES = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.5]], np.float32)
CASES = [
    ("reduce_min_13_attr", "ReduceMin", {"x": f32(2, 3, 4)}, {"axes": [0, 2], "keepdims": 0},
     13, {}),
    ("reduce_min_18_input", "ReduceMin", {"x": f32(2, 3, 4)}, {}, 18, {"a": i64(-1)}),
    ("reduce_prod_13_all", "ReduceProd", {"x": f32(2, 3)}, {}, 13, {}),
    ("reduce_l1_13_attr", "ReduceL1", {"x": f32(2, 3, 4)}, {"axes": [1]}, 13, {}),
    ("reduce_l2_18_input", "ReduceL2", {"x": f32(2, 3, 4)}, {"keepdims": 0}, 18,
     {"a": i64(0, 2)}),
    ("argmax_first_of_ties", "ArgMax", {"x": TIES}, {"axis": 1}, 13, {}),
    ("argmax_last_of_ties", "ArgMax", {"x": TIES}, {"axis": -1, "select_last_index": 1,
                                                     "keepdims": 0}, 13, {}),
    ("argmin_axis_0", "ArgMin", {"x": TIES}, {"keepdims": 0}, 13, {}),
]


@pytest.mark.parametrize(("op_type", "inputs", "attrs", "opset", "constants"),
                         [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_converter_matches_onnxruntime(op_type, inputs, attrs, opset, constants):
    types = [np.int64] if op_type.startswith("Arg") else None
    model_bytes = node_model(op_type, inputs, attrs, opset=opset, constants=constants,
                             output_types=types)
    (expected,) = run_onnxruntime(model_bytes, inputs)
    (actual,) = pullback.onnx.load(model_bytes)(*inputs.values())
    actual = np.asarray(actual)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
