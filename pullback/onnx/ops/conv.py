"""Conv and ConvTranspose, 1-D to 3-D, built on pullback's 2-D convolution.

1-D convolutions are 2-D ones over a height of 1. A 3-D convolution is a sum
over the kernel's depth of 2-D convolutions, each over every output depth at
once (depth folded into the batch). Asymmetric pads are an explicit pad
first. ConvTranspose is the adjoint of convolution: a matmul with the weight
followed by `fold2d` (col2im), cropped by the pads.
"""

from __future__ import annotations

import functools
from typing import Any

from ... import ops
from ..errors import OnnxImportError
from ..interpreter import check_size
from ..registry import NodeView, converter
from .common import dtype, pad_nd, shape, window_pads

_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def conv2d(node: NodeView, x: Any, w: Any, stride: tuple, padding: tuple, dilation: tuple,
           groups: int) -> Any:
    """pb.conv2d, passing dilation and groups only where they are not the defaults.

    Beside its result, pb.conv2d works on one sample's windows (im2col) at a time unless
    the kernel is 1x1 at stride 1 without padding: a large kernel makes that work array
    far larger than the input or the result, so it is held to the memory budget too."""
    (c, h, wd), (kh, kw) = shape(x)[1:], shape(w)[2:]
    if (kh, kw, *stride, *padding) != (1, 1, 1, 1, 0, 0):
        out = [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, s, p, d in
               zip((h, wd), (kh, kw), stride, padding, dilation)]
        if min(out) > 0:
            check_size((c, kh, kw, *out), dtype(x), node.run.max_tensor_bytes,
                       "its convolution's im2col windows for one sample")
    extra: dict[str, Any] = {}
    if dilation != (1, 1):
        extra["dilation"] = dilation
    if groups != 1:
        extra["groups"] = groups
    return ops.conv2d(x, w, None, stride, padding, **extra)


def _window_attrs(node: NodeView, x: Any, kernel: tuple) -> tuple:
    nd = len(kernel)
    strides = tuple(node.attr("strides", [1] * nd))
    dilations = tuple(node.attr("dilations", [1] * nd))
    if len(strides) != nd or len(dilations) != nd:
        raise OnnxImportError(f"strides {strides} and dilations {dilations} must have {nd} "
                              "entries")
    if any(s < 1 for s in strides) or any(d < 1 for d in dilations):
        raise OnnxImportError("strides and dilations must be positive")
    pads = window_pads(node, shape(x)[2:], kernel, strides, dilations)
    return strides, dilations, pads


def _symmetric(x: Any, pads: list[int], nd: int) -> tuple[Any, tuple]:
    """x padded explicitly where begin and end pads differ; the symmetric pads left."""
    begins, ends = pads[:nd], pads[nd:]
    if begins == ends:
        return x, tuple(begins)
    x = pad_nd(x, [0, 0] + begins, [0, 0] + ends)
    return x, (0,) * nd


@converter("Conv", (1, 11), _CONV_ATTRS)
def _conv(node: NodeView, x: Any, w: Any, b: Any = None) -> Any:
    sx, sw = shape(x), shape(w)
    nd = len(sx) - 2
    if nd not in (1, 2, 3) or len(sw) != nd + 2:
        raise OnnxImportError(f"input {sx} and weight {sw} must be (N, C, D1..Dn) and "
                              f"(M, C/group, k1..kn) with n in 1..3")
    kernel = tuple(node.attr("kernel_shape", sw[2:]))
    if kernel != sw[2:]:
        raise OnnxImportError(f"kernel_shape {kernel} disagrees with the weight {sw}")
    groups = node.attr("group", 1)
    if sx[1] != sw[1] * groups or sw[0] % groups:
        raise OnnxImportError(f"input channels {sx[1]} and weight {sw} do not fit "
                              f"group={groups}")
    if dtype(x) != dtype(w):
        raise OnnxImportError(f"input and weight dtypes differ ({dtype(x)}, {dtype(w)})")
    strides, dilations, pads = _window_attrs(node, x, kernel)
    x, padding = _symmetric(x, pads, nd)
    if nd == 1:
        y = conv2d(node, ops.reshape(x, (sx[0], sx[1], 1, shape(x)[2])),
                   ops.reshape(w, (sw[0], sw[1], 1, sw[2])),
                   (1, strides[0]), (0, padding[0]), (1, dilations[0]), groups)
        y = ops.reshape(y, (shape(y)[0], shape(y)[1], shape(y)[3]))
    elif nd == 2:
        y = conv2d(node, x, w, strides, padding, dilations, groups)
    else:
        y = _conv3d(node, x, w, strides, padding, dilations, groups)
    if b is not None:
        if shape(b) != (sw[0],):
            raise OnnxImportError(f"bias must have shape ({sw[0]},), has {shape(b)}")
        y = ops.add(y, ops.reshape(b, (1, sw[0]) + (1,) * nd))
    return y


def _conv3d(node: NodeView, x: Any, w: Any, strides: tuple, padding: tuple, dilations: tuple,
            groups: int) -> Any:
    """Sum over kernel depth i of a 2-D conv of the depth slices i*d, i*d + s, ..."""
    if padding[0]:
        x = pad_nd(x, [0, 0, padding[0], 0, 0], [0, 0, padding[0], 0, 0])
    n, c, depth, h, wd = shape(x)
    o, kd = shape(w)[0], shape(w)[2]
    sd, dd = strides[0], dilations[0]
    od = (depth - (kd - 1) * dd - 1) // sd + 1
    if od < 1:
        raise OnnxImportError(f"kernel depth {kd} (dilation {dd}) exceeds the padded input "
                              f"depth {depth}")

    def depth_slice(i: int) -> Any:
        start = i * dd
        slices = ops.getitem(x, (slice(None), slice(None), slice(start, start + sd * (od - 1) + 1,
                                                                  sd)))
        batch = ops.reshape(ops.transpose(slices, (0, 2, 1, 3, 4)), (n * od, c, h, wd))
        return conv2d(node, batch, ops.getitem(w, (slice(None), slice(None), i)), strides[1:],
                      padding[1:], dilations[1:], groups)

    # The depth slices' convolutions summed one by one.
    total = functools.reduce(ops.add, (depth_slice(i) for i in range(kd)))
    oh, ow = shape(total)[2:]
    return ops.transpose(ops.reshape(total, (n, od, o, oh, ow)), (0, 2, 1, 3, 4))


@converter("ConvTranspose", (1, 11), _CONV_ATTRS + ("output_padding", "output_shape"))
def _conv_transpose(node: NodeView, x: Any, w: Any, b: Any = None) -> Any:
    sx, sw = shape(x), shape(w)
    nd = len(sx) - 2
    if nd not in (1, 2) or len(sw) != nd + 2:
        raise OnnxImportError(f"input {sx} and weight {sw}: only 1-D and 2-D transposed "
                              "convolutions are implemented")
    groups = node.attr("group", 1)
    if sx[1] != sw[0] or sw[0] % groups:
        raise OnnxImportError(f"input channels {sx[1]} and weight {sw} do not fit "
                              f"group={groups}")
    if dtype(x) != dtype(w):
        raise OnnxImportError(f"input and weight dtypes differ ({dtype(x)}, {dtype(w)})")
    kernel = sw[2:]
    strides = tuple(node.attr("strides", [1] * nd))
    dilations = tuple(node.attr("dilations", [1] * nd))
    if any(d != 1 for d in dilations):
        raise OnnxImportError(f"dilations {dilations} are not implemented for ConvTranspose")
    out_pad = list(node.attr("output_padding", [0] * nd))
    full = [s * (n - 1) + k + op for s, n, k, op in zip(strides, sx[2:], kernel, out_pad)]
    if "output_shape" in node.attrs:
        target = list(node.attr("output_shape"))[-nd:]
        total = [f - t for f, t in zip(full, target)]
        if any(t < 0 for t in total):
            raise OnnxImportError(f"output_shape {target} exceeds the full size {full}")
        # The ONNX spec puts the larger half first unless auto_pad is SAME_UPPER.
        upper = node.attr("auto_pad", "NOTSET") == "SAME_UPPER"
        begins = [t // 2 if upper else t - t // 2 for t in total]
        pads = begins + [t - bg for t, bg in zip(total, begins)]
    else:
        auto_pad = node.attr("auto_pad", "NOTSET")
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            total = [f - s * n for f, s, n in zip(full, strides, sx[2:])]
            begins = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
            pads = begins + [t - bg for t, bg in zip(total, begins)]
        else:
            pads = list(node.attr("pads", [0] * (2 * nd))) if auto_pad != "VALID" \
                else [0] * (2 * nd)
    if nd == 1:
        x = ops.reshape(x, (sx[0], sx[1], 1, sx[2]))
        w = ops.reshape(w, (sw[0], sw[1], 1, sw[2]))
        strides, kernel, full = (1,) + strides, (1,) + kernel, [1] + full
        pads = [0, pads[0], 0, pads[1]]
    y = _fold_transpose(x, w, strides, kernel, full, groups)
    begins, ends = pads[:2], pads[2:]
    y = ops.getitem(y, (slice(None), slice(None),
                        slice(begins[0], full[0] - ends[0]), slice(begins[1], full[1] - ends[1])))
    if nd == 1:
        y = ops.reshape(y, (shape(y)[0], shape(y)[1], shape(y)[3]))
    cout = sw[1] * groups
    if b is not None:
        if shape(b) != (cout,):
            raise OnnxImportError(f"bias must have shape ({cout},), has {shape(b)}")
        y = ops.add(y, ops.reshape(b, (1, cout) + (1,) * nd))
    return y


def _fold_transpose(x: Any, w: Any, strides: tuple, kernel: tuple, full: list[int],
                    groups: int) -> Any:
    """Each input pixel scatters weight * value over its window: cols = W^T x, folded."""
    n, cin, h, wd = shape(x)
    _, cout_g, kh, kw = shape(w)
    cin_g = cin // groups
    outs = []
    for g in range(groups):
        xg = ops.getitem(x, (slice(None), slice(g * cin_g, (g + 1) * cin_g)))
        wg = ops.getitem(w, slice(g * cin_g, (g + 1) * cin_g))
        w2 = ops.transpose(ops.reshape(wg, (cin_g, cout_g * kh * kw)))
        cols = ops.matmul(w2, ops.reshape(xg, (n, cin_g, h * wd)))
        cols = ops.reshape(cols, (n, cout_g, kh, kw, h, wd))
        outs.append(ops.fold2d(cols, (n, cout_g, full[0], full[1]), (kh, kw), tuple(strides),
                               (0, 0)))
    return outs[0] if groups == 1 else ops.concatenate(outs, 1)
