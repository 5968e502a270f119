"""The error table: each invalid call raises `pb.KernelError` (a ValueError) whose message
starts with the op's public name and the operands' shapes as Python prints them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import pullback as pb


def f32(*shape: int) -> pb.Tensor:
    return pb.tensor(np.ones(shape, np.float32))


def f64(*shape: int) -> pb.Tensor:
    return pb.tensor(np.ones(shape, np.float64))


def mask(*shape: int) -> pb.Tensor:
    return pb.tensor(np.ones(shape, bool))


# (case, the invalid call, the start of the message, further text the message must hold)
ERRORS: list[tuple[str, Callable[[], object], str, tuple[str, ...]]] = [
    ("add_shapes_do_not_broadcast", lambda: pb.add(f32(3), f32(4)), "add: (3,) and (4,)", ()),
    ("add_operator_shapes_do_not_broadcast", lambda: f32(2, 3) + f32(2), "add: (2, 3) and (2,)",
     ()),
    ("sub_shapes_do_not_broadcast", lambda: pb.sub(f32(2, 3), f32(3, 2)),
     "sub: (2, 3) and (3, 2)", ()),
    ("mul_shapes_do_not_broadcast", lambda: f32(2, 3) * f32(3, 2), "mul: (2, 3) and (3, 2)", ()),
    ("div_shapes_do_not_broadcast", lambda: pb.div(f32(2, 3), f32(2, 2)),
     "div: (2, 3) and (2, 2)", ()),
    ("pow_shapes_do_not_broadcast", lambda: pb.pow(f32(2, 3), f32(4)), "pow: (2, 3) and (4,)", ()),
    ("maximum_shapes_do_not_broadcast", lambda: pb.maximum(f32(2, 3), f32(4)),
     "maximum: (2, 3) and (4,)", ()),
    ("minimum_shapes_do_not_broadcast", lambda: pb.minimum(f32(2, 3), f32(4)),
     "minimum: (2, 3) and (4,)", ()),
    ("where_shapes_do_not_broadcast", lambda: pb.where(mask(2), f32(3), f32(3)), "where: ",
     ("(2,)", "(3,)")),
    ("matmul_inner_dimensions_differ", lambda: pb.matmul(f32(3, 4), f32(5, 2)),
     "matmul: (3, 4) and (5, 2)", ("4", "5")),
    ("matmul_operator_inner_dimensions_differ", lambda: f32(3, 4) @ f32(5, 2),
     "matmul: (3, 4) and (5, 2)", ()),
    ("matmul_vectors_differ_in_length", lambda: pb.matmul(f32(3), f32(4)),
     "matmul: (3,) and (4,)", ()),
    ("matmul_batch_dimensions_do_not_broadcast", lambda: pb.matmul(f32(2, 3, 4), f32(3, 4, 5)),
     "matmul: (2, 3, 4) and (3, 4, 5)", ()),
    ("matmul_zero_dim_operand", lambda: pb.matmul(f32(), f32(4)), "matmul: () and (4,)", ()),
    ("conv2d_channels_differ", lambda: pb.conv2d(f32(1, 3, 5, 5), f32(4, 2, 3, 3)),
     "conv2d: (1, 3, 5, 5) and (4, 2, 3, 3)", ()),
    ("conv2d_input_not_4d", lambda: pb.conv2d(f32(3, 5, 5), f32(4, 3, 3, 3)),
     "conv2d: (3, 5, 5) and (4, 3, 3, 3)", ()),
    ("conv2d_weight_not_4d", lambda: pb.conv2d(f32(1, 3, 5, 5), f32(4, 3, 3)),
     "conv2d: (1, 3, 5, 5) and (4, 3, 3)", ()),
    ("conv2d_kernel_larger_than_input", lambda: pb.conv2d(f32(1, 3, 2, 2), f32(4, 3, 3, 3)),
     "conv2d: (1, 3, 2, 2) and (4, 3, 3, 3)", ()),
    ("conv2d_bias_shape", lambda: pb.conv2d(f32(1, 3, 5, 5), f32(4, 3, 3, 3), f32(3)),
     "conv2d: (1, 3, 5, 5) and (4, 3, 3, 3) and (3,)", ()),
    ("reshape_size_mismatch", lambda: pb.reshape(f32(2, 3), (4,)), "reshape: (2, 3)", ("(4,)",)),
    ("reshape_minus_one_does_not_divide", lambda: pb.reshape(f32(2, 3), (4, -1)),
     "reshape: (2, 3)", ("(4, -1)",)),
    ("transpose_too_few_axes", lambda: pb.transpose(f32(2, 3, 4), (0, 1)),
     "transpose: (2, 3, 4)", ("(0, 1)",)),
    ("transpose_repeated_axis", lambda: pb.transpose(f32(2, 3, 4), (0, 0, 1)),
     "transpose: (2, 3, 4)", ("(0, 0, 1)",)),
    ("transpose_axis_out_of_range", lambda: pb.transpose(f32(2, 3), (0, 2)), "transpose: (2, 3)",
     ()),
    ("broadcast_to_incompatible_shape", lambda: pb.broadcast_to(f32(3), (4,)),
     "broadcast_to: (3,)", ("(4,)",)),
    ("concatenate_shapes_differ_off_axis", lambda: pb.concatenate([f32(2, 3), f32(3, 4)], 0),
     "concatenate: (2, 3) and (3, 4)", ()),
    ("concatenate_ranks_differ", lambda: pb.concatenate([f32(2, 3), f32(2, 3, 1)], 1),
     "concatenate: (2, 3) and (2, 3, 1)", ()),
    ("concatenate_axis_out_of_range", lambda: pb.concatenate([f32(2, 3), f32(2, 3)], 2),
     "concatenate: (2, 3) and (2, 3)", ()),
    ("stack_shapes_differ", lambda: pb.stack([f32(2, 3), f32(2, 4)]), "stack: (2, 3) and (2, 4)",
     ()),
    ("max_pool2d_kernel_larger_than_input", lambda: pb.max_pool2d(f32(1, 1, 2, 2), 3),
     "max_pool2d: (1, 1, 2, 2)", ()),
    ("max_pool2d_input_not_4d", lambda: pb.max_pool2d(f32(2, 2), 2), "max_pool2d: (2, 2)", ()),
    ("avg_pool2d_kernel_larger_than_input", lambda: pb.avg_pool2d(f32(1, 1, 2, 2), 3),
     "avg_pool2d: (1, 1, 2, 2)", ()),
    ("softmax_axis_out_of_range", lambda: pb.softmax(f32(3, 4), axis=2), "softmax: (3, 4)",
     ("2",)),
    ("log_softmax_negative_axis_out_of_range", lambda: pb.log_softmax(f32(3, 4), axis=-3),
     "log_softmax: (3, 4)", ("-3",)),
    ("sum_axis_out_of_range", lambda: pb.sum(f32(2, 3), axis=2), "sum: (2, 3)", ()),
    ("mean_repeated_axis", lambda: pb.mean(f32(2, 3), axis=(0, 0)), "mean: (2, 3)", ()),
    ("max_axis_out_of_range", lambda: pb.max(f32(2, 3), axis=-3), "max: (2, 3)", ()),
    # Two floating dtypes never mix silently: the caller casts.
    ("add_float32_with_float64", lambda: pb.add(f32(3), f64(3)), "add: (3,) and (3,)",
     ("float32", "float64")),
    ("mul_operator_float64_with_float32", lambda: f64(2, 1) * f32(3), "mul: (2, 1) and (3,)",
     ("float64", "float32")),
    ("maximum_float32_with_float64", lambda: pb.maximum(f32(3), f64(3)),
     "maximum: (3,) and (3,)", ("float32", "float64")),
    ("conv2d_float32_with_float64", lambda: pb.conv2d(f32(1, 3, 5, 5), f64(4, 3, 3, 3)),
     "conv2d: (1, 3, 5, 5) and (4, 3, 3, 3)", ("float32", "float64")),
    ("matmul_float32_with_float64", lambda: pb.matmul(f32(2, 3), f64(3, 2)),
     "matmul: (2, 3) and (3, 2)", ("float32", "float64")),
    ("concatenate_float32_with_float64", lambda: pb.concatenate([f32(2, 3), f64(2, 3)], 0),
     "concatenate: (2, 3) and (2, 3)", ("float32", "float64")),
    ("where_float32_with_float64", lambda: pb.where(mask(3), f32(3), f64(3)), "where: ",
     ("float32", "float64")),
    # sin, cos, logsumexp and cumsum name themselves as the other ops do.
    ("sin_of_ints", lambda: pb.sin(pb.tensor(np.arange(3))), "sin: (3,)",
     ("expected a floating dtype",)),
    ("cos_of_bools", lambda: pb.cos(mask(2)), "cos: (2,)", ("expected a floating dtype",)),
    ("logsumexp_axis_out_of_range", lambda: pb.logsumexp(f32(2, 3), axis=2),
     "logsumexp: (2, 3)", ("axis 2 is out of range for 2 dimensions",)),
    ("logsumexp_repeated_axis", lambda: pb.logsumexp(f32(2, 3), axis=(1, -1)),
     "logsumexp: (2, 3)", ("repeats an axis",)),
    ("logsumexp_of_ints", lambda: pb.logsumexp(pb.tensor(np.arange(3)), 0), "logsumexp: (3,)",
     ("expected a floating dtype",)),
    ("cumsum_axis_out_of_range", lambda: pb.cumsum(f32(2, 3), -3), "cumsum: (2, 3)",
     ("axis -3 is out of range for 2 dimensions",)),
    ("cumsum_axis_not_an_int", lambda: pb.cumsum(f32(2, 3), (0, 1)), "cumsum: (2, 3)",
     ("axis must be an int, not (0, 1)",)),
]


@pytest.mark.parametrize(("call", "start", "also"), [pytest.param(*e[1:], id=e[0]) for e in ERRORS])
def test_invalid_call_raises_kernel_error_naming_op_and_shapes(
        call: Callable[[], object], start: str, also: tuple[str, ...]) -> None:
    with pytest.raises(pb.KernelError) as info:
        call()
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert message.startswith(start), message
    for text in also:
        assert text in message, f"{text!r} not in {message!r}"
