"""Every model of onnx's bundled `light`, `pytorch-converted`, `pytorch-operator` and
`simple` test folders either matches its expected outputs at the tolerances of onnx's
own runner, or is expected to be unsupported and raises UnsupportedOperatorError."""

from __future__ import annotations

import inspect

import pytest
from conformance import cases, run_case

import pullback as pb
import pullback.onnx

#: Models expected to be unsupported, with a word from the reason. Empty: all are supported.
EXPECTED_UNSUPPORTED: dict[str, str] = {}

# Grouped and dilated convolutions wait for pb.conv2d's `dilation` and `groups` (being
# added in the conv layer); until they land these models fail, and are marked so.
_CONV_FEATURES = {"dilation", "groups"} <= set(inspect.signature(pb.conv2d).parameters)
NEEDS_CONV_FEATURES = {
    "light/bvlc_alexnet", "light/shufflenet",
    "pytorch-converted/test_Conv1d_dilated", "pytorch-converted/test_Conv1d_groups",
    "pytorch-converted/test_Conv2d_depthwise", "pytorch-converted/test_Conv2d_depthwise_padded",
    "pytorch-converted/test_Conv2d_depthwise_strided",
    "pytorch-converted/test_Conv2d_depthwise_with_multiplier",
    "pytorch-converted/test_Conv2d_dilated", "pytorch-converted/test_Conv2d_groups",
    "pytorch-converted/test_Conv2d_groups_thnn", "pytorch-converted/test_Conv3d_dilated",
    "pytorch-converted/test_Conv3d_dilated_strided", "pytorch-converted/test_Conv3d_groups",
}

ALL_CASES = cases()


def _param(case):
    marks = []
    if case.name in NEEDS_CONV_FEATURES and not _CONV_FEATURES:
        marks.append(pytest.mark.xfail(reason="pb.conv2d has no dilation/groups yet",
                                       raises=pullback.onnx.NodeError, strict=True))
    return pytest.param(case, id=case.name, marks=marks)


def test_the_bundled_folders_are_all_found():
    folders = {c.name.split("/")[0] for c in ALL_CASES}
    assert folders == {"light", "pytorch-converted", "pytorch-operator", "simple"}
    assert len(ALL_CASES) == 149


@pytest.mark.parametrize("case", [_param(c) for c in ALL_CASES])
def test_bundled_model(case):
    if case.name in EXPECTED_UNSUPPORTED:
        with pytest.raises(pullback.onnx.UnsupportedOperatorError,
                           match=EXPECTED_UNSUPPORTED[case.name]):
            run_case(case)
    else:
        run_case(case)
