"""Invalid calls of the tensor API added for today's models (reductions, sorting, einsum,
PyTorch's reshapes and masks) raise `pb.KernelError` naming the op the user called and
the operands' shapes, as the other ops' errors do."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import pullback as pb


def f32(*shape: int) -> pb.Tensor:
    return pb.tensor(np.ones(shape, np.float32))


def ints(*shape: int) -> pb.Tensor:
    return pb.tensor(np.ones(shape, np.int64))


def mask(*shape: int) -> pb.Tensor:
    return pb.tensor(np.ones(shape, bool))


# (case, the invalid call, the start of the message, further text the message must hold)
ERRORS: list[tuple[str, Callable[[], object], str, tuple[str, ...]]] = [
    ("min_axis_out_of_range", lambda: pb.min(f32(2, 3), axis=2), "min: (2, 3)",
     ("axis 2 is out of range for 2 dimensions",)),
    ("min_of_an_empty_axis", lambda: f32(0, 3).min(axis=0), "min: (0, 3)",
     ("empty selection",)),
    ("prod_repeated_axis", lambda: pb.prod(f32(2, 3), axis=(0, -2)), "prod: (2, 3)",
     ("repeats an axis",)),
    ("argmax_axis_out_of_range", lambda: pb.argmax(f32(2, 3), axis=-3), "argmax: (2, 3)",
     ("axis -3 is out of range",)),
    ("argmax_axis_tuple", lambda: pb.argmax(f32(2, 3), axis=(0, 1)), "argmax: (2, 3)",
     ("axis must be an int or None",)),
    ("argmin_of_an_empty_tensor", lambda: pb.argmin(f32(2, 0)), "argmin: (2, 0)",
     ("empty selection",)),
    ("var_axis_out_of_range", lambda: pb.var(f32(4), axis=1), "var: (4,)",
     ("axis 1 is out of range",)),
    ("var_of_ints", lambda: pb.var(ints(3)), "var: (3,)", ("expected a floating dtype",)),
    ("std_of_ints", lambda: ints(3).std(), "std: (3,)", ("expected a floating dtype",)),
    ("norm_p_below_one", lambda: pb.norm(f32(3), 0.5), "norm: (3,)", ("p must be",)),
    ("norm_nuclear", lambda: f32(3, 3).norm("nuc"), "norm: (3, 3)", ("p must be",)),
    ("norm_of_ints", lambda: pb.norm(ints(3)), "norm: (3,)", ("expected a floating dtype",)),
    ("sort_axis_out_of_range", lambda: pb.sort(f32(2, 3), axis=2), "sort: (2, 3)",
     ("axis 2 is out of range",)),
    ("argsort_axis_not_an_int", lambda: pb.argsort(f32(2, 3), axis=None), "argsort: (2, 3)",
     ("axis must be an int",)),
    ("topk_k_larger_than_the_axis", lambda: pb.topk(f32(2, 3), 4), "topk: (2, 3)",
     ("k must be an int from 0 to 3",)),
    ("einsum_sizes_differ", lambda: pb.einsum("ij,jk->ik", f32(2, 3), f32(4, 5)),
     "einsum: (2, 3) and (4, 5)", ("subscript 'j' has sizes 3 and 4",)),
    ("einsum_operand_count", lambda: pb.einsum("ij,jk->ik", f32(2, 3)), "einsum: (2, 3)",
     ("names 2 operands, but 1 were given",)),
    ("einsum_subscripts_and_dimensions", lambda: pb.einsum("ijk->i", f32(2, 3)),
     "einsum: (2, 3)", ("operand 0 has 2 dimensions",)),
    ("einsum_unknown_output_subscript", lambda: pb.einsum("ij->ik", f32(2, 3)),
     "einsum: (2, 3)", ("'k' is not among the operands'",)),
    ("einsum_float32_with_float64",
     lambda: pb.einsum("i,i->", f32(3), pb.tensor(np.ones(3))), "einsum: (3,) and (3,)",
     ("float32", "float64")),
    ("split_sizes_do_not_add_up", lambda: pb.split(f32(5, 2), [2, 2]), "split: (5, 2)",
     ("add up to 4, not to 5",)),
    ("split_axis_out_of_range", lambda: f32(5, 2).split(2, axis=2), "split: (5, 2)",
     ("axis 2 is out of range",)),
    ("chunk_zero_chunks", lambda: pb.chunk(f32(4), 0), "chunk: (4,)",
     ("chunks must be a positive int",)),
    ("unbind_axis_out_of_range", lambda: pb.unbind(f32(2, 3), -3), "unbind: (2, 3)",
     ("axis -3 is out of range",)),
    ("squeeze_axis_out_of_range", lambda: pb.squeeze(f32(1, 3), 2), "squeeze: (1, 3)",
     ("axis 2 is out of range",)),
    ("unsqueeze_axis_out_of_range", lambda: f32(2, 3).unsqueeze(4), "unsqueeze: (2, 3)",
     ("axis 4 is out of range for 3 dimensions",)),
    ("flatten_start_after_end", lambda: pb.flatten(f32(2, 3, 4), 2, 1), "flatten: (2, 3, 4)",
     ("start_axis 2 comes after end_axis 1",)),
    ("permute_not_a_permutation", lambda: f32(2, 3, 4).permute(0, 0, 1), "permute: (2, 3, 4)",
     ("not a permutation of 3 dimensions",)),
    ("tril_of_a_vector", lambda: pb.tril(f32(3)), "tril: (3,)", ("at least two dimensions",)),
    ("triu_offset_not_an_int", lambda: pb.triu(f32(3, 3), 0.5), "triu: (3, 3)",
     ("k must be an int",)),
    ("masked_fill_mask_not_bool", lambda: pb.masked_fill(f32(2, 3), ints(2, 3), 0.0),
     "masked_fill: (2, 3) and (2, 3)", ("the mask must be a bool tensor",)),
    ("masked_fill_mask_does_not_broadcast", lambda: f32(2, 3).masked_fill(mask(2), 0.0),
     "masked_fill: (2, 3) and (2,)", ("cannot be broadcast",)),
    ("masked_fill_value_not_a_scalar", lambda: pb.masked_fill(f32(2, 3), mask(3), f32(3)),
     "masked_fill: (2, 3) and (3,)", ("a number or a 0-d tensor",)),
]


@pytest.mark.parametrize(("call", "start", "also"), [pytest.param(*e[1:], id=e[0]) for e in ERRORS])
def test_invalid_call_raises_kernel_error_naming_op_and_shapes(
        call: Callable[[], object], start: str, also: tuple[str, ...]) -> None:
    with pytest.raises(pb.KernelError) as info:
        call()
    message = str(info.value)
    assert message.startswith(start), message
    for text in also:
        assert text in message, f"{text!r} not in {message!r}"
