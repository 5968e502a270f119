"""pb.conv2d and pb.max_pool2d with bad dilation or groups raise a KernelError (a
ValueError) naming the op, the shapes and the dtypes, when the op is called."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback.backend import KernelError


def f32(*shape):
    return pb.tensor(np.zeros(shape, np.float32))


CASES = [
    ("groups_do_not_divide_input_channels",
     lambda: pb.conv2d(f32(1, 3, 5, 5), f32(4, 1, 3, 3), groups=2),
     "conv2d: (1, 3, 5, 5) and (4, 1, 3, 3): groups 2 must divide both the input channels 3 "
     "and the output channels 4"),
    ("groups_do_not_divide_output_channels",
     lambda: pb.conv2d(f32(1, 4, 5, 5), f32(3, 2, 3, 3), groups=2),
     "groups 2 must divide both the input channels 4 and the output channels 3"),
    ("weight_channels_not_per_group",
     lambda: pb.conv2d(f32(1, 4, 5, 5), f32(4, 4, 3, 3), groups=2),
     "weight has 4 input channels but input has 4 / groups 2 = 2"),
    ("groups_zero", lambda: pb.conv2d(f32(1, 4, 5, 5), f32(4, 4, 3, 3), groups=0),
     "conv2d: groups must be a positive int, not 0"),
    ("groups_bool", lambda: pb.conv2d(f32(1, 4, 5, 5), f32(4, 4, 3, 3), groups=True),
     "conv2d: groups must be a positive int, not True"),
    ("dilation_zero", lambda: pb.conv2d(f32(1, 1, 5, 5), f32(1, 1, 3, 3), dilation=(1, 0)),
     "conv2d: (1, 1, 5, 5) and (1, 1, 3, 3): dilation (1, 0) must be positive"),
    ("dilation_not_a_pair", lambda: pb.conv2d(f32(1, 1, 5, 5), f32(1, 1, 3, 3), dilation="2"),
     "conv2d: dilation must be an int or a pair of ints, not '2'"),
    ("dilated_kernel_larger_than_input",
     lambda: pb.conv2d(f32(1, 1, 5, 5), f32(1, 1, 3, 3), dilation=3),
     "kernel 3x3 dilated by (3, 3) (7x7) is larger than the padded input 5x5"),
    ("max_pool_dilation_zero", lambda: pb.max_pool2d(f32(1, 1, 5, 5), 2, dilation=0),
     "max_pool2d: (1, 1, 5, 5): dilation (0, 0) must be positive"),
]


@pytest.mark.parametrize(("name", "call", "text"), CASES, ids=[c[0] for c in CASES])
def test_bad_window_arguments_raise_kernel_errors(name, call, text):
    with pytest.raises(KernelError) as info:
        call()
    assert text in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(("name", "call", "text"), CASES, ids=[c[0] for c in CASES])
def test_bad_window_arguments_raise_when_traced_too(name, call, text):
    # Under pb.compile the shape rules see the arguments first: same words.
    with pytest.raises(KernelError) as info:
        pb.compile(lambda: call())
    assert text in str(info.value)


def test_conv2d_accepts_numpy_integers_for_its_parameters():
    x, w = f32(1, 4, 6, 6), f32(4, 2, 3, 3)
    y = pb.conv2d(x, w, stride=np.int64(1), padding=(np.int32(1), 1), dilation=np.int64(2),
                  groups=np.int64(2))
    assert y.shape == (1, 4, 4, 4)
