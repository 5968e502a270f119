"""Converters on cases the bundled models do not reach (newer opsets, ceil_mode,
count_include_pad, asymmetric and SAME pads, negative steps, reflect pads...), each a
one-node model checked against onnxruntime."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from graphs import node_model, run_onnxruntime

import pullback.onnx

rng = np.random.default_rng(0)


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


@dataclass
class Case:
    name: str
    op_type: str
    inputs: dict
    attrs: dict = field(default_factory=dict)
    opset: int = 13
    constants: dict = field(default_factory=dict)
    order: list | None = None
    outputs: int = 1
    output_types: list | None = None


X4 = f32(2, 3, 7, 7)
CASES = [
    Case("softmax_13_axis1", "Softmax", {"x": f32(2, 3, 4)}, {"axis": 1}),
    Case("softmax_11_coerced", "Softmax", {"x": f32(2, 3, 4)}, {"axis": 1}, opset=11),
    Case("log_softmax_13_default", "LogSoftmax", {"x": f32(2, 3, 4)}),
    Case("split_13_input", "Split", {"x": f32(5, 6)}, {"axis": 1},
         constants={"s": i64(2, 4)}, outputs=2),
    Case("split_11_equal", "Split", {"x": f32(6, 2)}, opset=11, outputs=3),
    Case("squeeze_13_input", "Squeeze", {"x": f32(2, 1, 3, 1)}, constants={"a": i64(-1, 1)}),
    Case("unsqueeze_13_negative", "Unsqueeze", {"x": f32(2, 3)}, constants={"a": i64(-1, 0)}),
    Case("reduce_sum_13_input", "ReduceSum", {"x": f32(2, 3, 4)}, {"keepdims": 0},
         constants={"a": i64(0, -1)}),
    Case("reduce_sum_13_all", "ReduceSum", {"x": f32(2, 3, 4)}),
    Case("reduce_mean_13_attr", "ReduceMean", {"x": f32(2, 3, 4)}, {"axes": [1]}),
    Case("max_pool_ceil", "MaxPool", {"x": X4}, {"kernel_shape": [3, 3], "strides": [2, 2],
                                                "ceil_mode": 1}, opset=12),
    Case("max_pool_same_upper", "MaxPool", {"x": X4}, {"kernel_shape": [3, 2], "strides": [2, 2],
                                                      "auto_pad": "SAME_UPPER"}, opset=12),
    Case("max_pool_3d_dilated", "MaxPool", {"x": f32(1, 2, 6, 6, 6)},
         {"kernel_shape": [2, 2, 2], "dilations": [2, 1, 2], "pads": [1, 0, 0, 1, 1, 0]},
         opset=12),
    Case("max_pool_1d_asymmetric", "MaxPool", {"x": f32(2, 3, 9)},
         {"kernel_shape": [3], "pads": [0, 2], "strides": [2]}, opset=12),
    Case("avg_pool_include_pad", "AveragePool", {"x": X4},
         {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, opset=11),
    Case("avg_pool_exclude_asymmetric", "AveragePool", {"x": X4},
         {"kernel_shape": [3, 3], "pads": [0, 1, 2, 1], "strides": [2, 1]}, opset=11),
    Case("avg_pool_ceil", "AveragePool", {"x": X4},
         {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, opset=11),
    Case("avg_pool_3d_pads", "AveragePool", {"x": f32(1, 2, 5, 4, 4)},
         {"kernel_shape": [3, 2, 2], "pads": [1, 0, 1, 1, 1, 0]}, opset=11),
    Case("global_max_pool", "GlobalMaxPool", {"x": X4}),
    Case("conv_same_upper_strided", "Conv", {"x": X4}, {"auto_pad": "SAME_UPPER",
                                                       "strides": [2, 2]},
         constants={"w": f32(4, 3, 3, 2)}, opset=11),
    Case("conv_asymmetric_pads", "Conv", {"x": X4}, {"pads": [0, 1, 2, 0]},
         constants={"w": f32(4, 3, 3, 3), "b": f32(4)}, opset=11),
    Case("conv_3d_padded", "Conv", {"x": f32(1, 2, 4, 5, 5)}, {"pads": [1, 0, 1, 1, 0, 1],
                                                             "strides": [2, 1, 1]},
         constants={"w": f32(3, 2, 3, 2, 2)}, opset=11),
    Case("conv_transpose_1d", "ConvTranspose", {"x": f32(2, 3, 5)},
         {"strides": [2], "pads": [1, 0]}, constants={"w": f32(3, 2, 3)}, opset=11),
    Case("conv_transpose_groups", "ConvTranspose", {"x": f32(1, 4, 3, 3)},
         {"group": 2, "strides": [2, 2]}, constants={"w": f32(4, 3, 2, 2), "b": f32(6)},
         opset=11),
    Case("conv_transpose_output_shape", "ConvTranspose", {"x": f32(1, 2, 3, 3)},
         {"strides": [2, 2], "output_shape": [6, 5]}, constants={"w": f32(2, 2, 3, 3)},
         opset=11),
    Case("pad_11_reflect", "Pad", {"x": f32(2, 5, 4)}, {"mode": "reflect"},
         constants={"p": i64(0, 2, 3, 0, 4, 1)}, opset=11),
    Case("pad_11_edge", "Pad", {"x": f32(2, 3)}, {"mode": "edge"},
         constants={"p": i64(1, 2, 3, 0)}, opset=11),
    Case("pad_11_constant_value_and_crop", "Pad", {"x": f32(3, 4)},
         constants={"p": i64(1, -1, 0, 2), "v": np.asarray(1.5, np.float32)}, opset=11),
    Case("slice_negative_steps", "Slice", {"x": f32(5, 6, 4)},
         constants={"s": i64(-1, 4), "e": i64(-1000, 0), "a": i64(0, 1), "t": i64(-2, -1)}),
    Case("slice_clamped_ends", "Slice", {"x": f32(5, 6)},
         constants={"s": i64(1), "e": i64(2**62), "a": i64(1)}),
    Case("gather_negative_axis1", "Gather", {"x": f32(3, 5, 2)}, {"axis": 1},
         constants={"i": np.asarray([[-1, 0], [2, 2]], np.int64)}),
    Case("gather_scalar_index", "Gather", {"x": f32(4, 3)}, constants={"i": i64(2)[0]}),
    Case("clip_11_min_only", "Clip", {"x": f32(3, 4)},
         constants={"lo": np.asarray(-0.2, np.float32)}, opset=11),
    Case("lrn_size_3", "LRN", {"x": f32(2, 6, 3, 3)}, {"size": 3, "alpha": 0.1, "beta": 0.6,
                                                      "bias": 1.5}),
    Case("tile", "Tile", {"x": f32(2, 3)}, constants={"r": i64(2, 3)}),
    Case("expand_bidirectional", "Expand", {"x": f32(1, 3, 1)}, constants={"s": i64(2, 1, 4)}),
    Case("gemm_trans_alpha_beta", "Gemm", {"a": f32(4, 3), "b": f32(5, 4)},
         {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, constants={"c": f32(5)}),
    Case("batch_norm_15", "BatchNormalization", {"x": f32(2, 3, 4)}, {"epsilon": 1e-3},
         constants={"s": f32(3), "b": f32(3), "m": f32(3),
                    "v": np.abs(f32(3)).astype(np.float32) + 0.5}, opset=15),
    Case("instance_norm", "InstanceNormalization", {"x": f32(2, 3, 4, 5)},
         constants={"s": f32(3), "b": f32(3)}),
    Case("flatten_axis0", "Flatten", {"x": f32(2, 3, 4)}, {"axis": 0}),
    Case("flatten_negative_axis", "Flatten", {"x": f32(2, 3, 4)}, {"axis": -1}),
    Case("dropout_12_mask", "Dropout", {"x": f32(3, 4)}, opset=12, outputs=2,
         output_types=[np.float32, np.bool_]),
    Case("max_broadcast", "Max", {"a": f32(3, 1), "b": f32(1, 4), "c": f32(4)}),
    Case("pow_integer_exponent", "Pow", {"x": np.abs(f32(3, 4))}, constants={"e": i64(2)}),
    Case("shrink_with_infinities", "Shrink", {"x": np.asarray([-np.inf, -2, -0.3, 0, 0.4, 3,
                                                               np.inf], np.float32)},
         {"lambd": 0.5, "bias": 0.2}, opset=9),
    Case("elu_selu_leaky_inputs", "LeakyRelu", {"x": np.asarray([-np.inf, -1, 0, 2, np.inf],
                                                                np.float32)}, {"alpha": 0.2}),
    Case("cast_to_int", "Cast", {"x": f32(3, 4) * 4}, {"to": 7}, output_types=[np.int64]),
    Case("reshape_zero_and_minus_one", "Reshape", {"x": f32(2, 3, 4)},
         constants={"s": i64(0, -1)}),
    Case("transpose_default", "Transpose", {"x": f32(2, 3, 4)}),
    Case("f64_matmul_broadcast", "MatMul", {"a": rng.standard_normal((2, 3, 4)),
                                            "b": rng.standard_normal((4, 5))}),
    # Operators pullback's own export writes (opset 17), so that exported files load.
    Case("erf", "Erf", {"x": f32(3, 4) * 2}, opset=17),
    Case("less_broadcast", "Less", {"a": f32(3, 4), "b": f32(4)}, opset=17,
         output_types=[np.bool_]),
    Case("greater_or_equal", "GreaterOrEqual", {"a": f32(3, 4), "b": f32(3, 1)}, opset=17,
         output_types=[np.bool_]),
    Case("equal_ints", "Equal", {"a": i64(1, 2, 3), "b": i64(1, 0, 3)}, opset=17,
         output_types=[np.bool_]),
    Case("not", "Not", {"x": np.asarray([True, False, True])}, opset=17),
    Case("where_broadcast", "Where", {"c": f32(3, 1) > 0, "a": f32(3, 4), "b": f32(4)},
         opset=17, output_types=[np.float32]),
    Case("reduce_max_13_attr", "ReduceMax", {"x": f32(2, 3, 4)}, {"axes": [0, 2], "keepdims": 0},
         opset=17),
    Case("reduce_max_18_input", "ReduceMax", {"x": f32(2, 3, 4)}, constants={"a": i64(1)},
         opset=18),
    Case("layer_norm_last_axis", "LayerNormalization", {"x": f32(2, 3, 8)},
         {"epsilon": 1e-3}, constants={"s": f32(8), "b": f32(8)}, opset=17),
    Case("layer_norm_two_axes_no_bias", "LayerNormalization", {"x": f32(2, 3, 4)},
         {"axis": -2}, constants={"s": f32(3, 4)}, opset=17),
    Case("layer_norm_statistics", "LayerNormalization", {"x": f32(2, 5)},
         constants={"s": f32(5), "b": f32(5)}, opset=17, outputs=3),
    Case("layer_norm_f64_float_stash", "LayerNormalization", {"x": rng.standard_normal((3, 6))},
         constants={"s": rng.standard_normal(6), "b": rng.standard_normal(6)}, opset=17,
         outputs=3, output_types=[np.float64, np.float32, np.float32]),
    # sin, cos, logsumexp and cumsum: what their exporters write, and CumSum's attributes.
    Case("sin", "Sin", {"x": f32(3, 4) * 4}, opset=17),
    Case("cos", "Cos", {"x": f32(3, 4) * 4}, opset=17),
    Case("reduce_log_sum_exp_13_attr", "ReduceLogSumExp", {"x": f32(2, 3, 4) * 30},
         {"axes": [0, 2], "keepdims": 0}, opset=17),
    Case("reduce_log_sum_exp_18_input", "ReduceLogSumExp", {"x": f32(2, 3, 4)},
         constants={"a": i64(-1)}, opset=18),
    Case("cumsum", "CumSum", {"x": f32(3, 4)}, constants={"a": i64(1)}, opset=14),
    Case("cumsum_reverse_exclusive_0d_axis", "CumSum", {"x": f32(3, 4)},
         {"reverse": 1, "exclusive": 1}, constants={"a": np.asarray(-2, np.int64)}, opset=14),
    Case("cumsum_exclusive_int32", "CumSum", {"x": np.arange(12, dtype=np.int32).reshape(3, 4)},
         {"exclusive": 1}, constants={"a": i64(1)}, opset=14),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_converter_matches_onnxruntime(case):
    model_bytes = node_model(case.op_type, case.inputs, case.attrs, opset=case.opset,
                             constants=case.constants, outputs=case.outputs,
                             input_order=case.order, output_types=case.output_types)
    expected = run_onnxruntime(model_bytes, case.inputs)
    model = pullback.onnx.load(model_bytes)
    actual = model(*case.inputs.values())
    assert len(actual) == len(expected)
    for out, ref in zip(actual, expected):
        out = np.asarray(out)
        assert out.shape == ref.shape and out.dtype == ref.dtype
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    # The second call runs the plan (or the eager path) built by the first.
    again = model(*case.inputs.values())
    for out, ref in zip(again, expected):
        np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-6)
