"""The window kernels (pullback.kernels.conv) against NumPy references: im2col in both
window layouts, col2im, max and average pooling and their backwards, through the
general loops and the tile kernels, in float32 and float64.

The references are the loops over kernel offsets that CpuBackend ran before the
kernels, extended to dilation; the kernels must match them bit for bit (same
arithmetic in the same order), NaN and -inf included.
"""

from __future__ import annotations

import numpy as np
import pytest

from pullback.backend import KernelError
from pullback.backend.conv import check_windows
from pullback.kernels import conv as kc

FLOATS = [np.float32, np.float64]


# ---------------------------------------------------------------- NumPy references


def _taps(win):
    # For each kernel offset (i, j): the strided slice of the padded input it reads.
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = win.kernel, win.stride, win.dilation, win.out_hw
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
            yield i, j, (..., rows, slice(j * dw, j * dw + sw * (ow - 1) + 1, sw))


def _pad(x, padding, value):
    (ph, pw) = padding
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=value)


def ref_unfold(x, win, pad_value):
    xp = _pad(x, win.padding, pad_value)
    out = np.empty((*x.shape[:2], *win.kernel, *win.out_hw), dtype=x.dtype)
    for i, j, tap in _taps(win):
        out[:, :, i, j] = xp[tap]
    return out


def ref_fold(cols, shape, win):
    (ph, pw), (h, w) = win.padding, shape[2:]
    out = np.zeros((*shape[:2], h + 2 * ph, w + 2 * pw), dtype=cols.dtype)
    for i, j, tap in _taps(win):
        out[tap] += cols[:, :, i, j]
    return out[:, :, ph:ph + h, pw:pw + w]


def ref_max_pool(x, win):
    xp = _pad(x, win.padding, -np.inf)
    out = None
    for _, _, tap in _taps(win):
        out = xp[tap].copy() if out is None else np.maximum(out, xp[tap], out=out)
    return out


def ref_max_pool_backward(upstream, x, y, win):
    (ph, pw), (h, w) = win.padding, x.shape[2:]
    xp = _pad(x, win.padding, -np.inf)
    grad = np.zeros(xp.shape, dtype=x.dtype)
    taken = np.zeros(y.shape, dtype=bool)
    for _, _, tap in _taps(win):
        hit = (xp[tap] == y) & ~taken
        taken |= hit
        grad[tap] += upstream * hit
    return grad[:, :, ph:ph + h, pw:pw + w]


def ref_avg_pool(x, win):
    xp = _pad(x, win.padding, 0.0)
    out = None
    for _, _, tap in _taps(win):
        out = xp[tap].copy() if out is None else np.add(out, xp[tap], out=out)
    out *= 1.0 / (win.kernel[0] * win.kernel[1])
    return out


def ref_avg_pool_backward(upstream, shape, win):
    share = upstream * (1.0 / (win.kernel[0] * win.kernel[1]))
    (ph, pw), (h, w) = win.padding, shape[2:]
    grad = np.zeros((*shape[:2], h + 2 * ph, w + 2 * pw), dtype=upstream.dtype)
    for _, _, tap in _taps(win):
        grad[tap] += share
    return grad[:, :, ph:ph + h, pw:pw + w]


# ---------------------------------------------------------------- cases

WINDOW_CASES = [
    # (N, C, H, W), kernel, stride, padding, dilation
    ((2, 3, 7, 6), (3, 3), (1, 1), (1, 1), (1, 1)),
    ((2, 3, 7, 6), (2, 3), (2, 1), (1, 0), (1, 1)),
    ((1, 2, 9, 8), (3, 2), (2, 3), (2, 1), (2, 3)),
    ((2, 1, 8, 8), (1, 1), (3, 3), (0, 0), (1, 1)),
    ((1, 2, 5, 11), (2, 2), (1, 4), (0, 3), (4, 1)),
    # "same" windows at stride 1 (output rows as wide as input rows): im2col's contiguous runs
    ((2, 2, 6, 7), (3, 3), (1, 1), (2, 2), (2, 2)),
    ((1, 3, 5, 6), (2, 3), (1, 1), (0, 1), (1, 1)),
    ((1, 1, 4, 5), (5, 5), (1, 1), (2, 2), (1, 1)),
    ((1, 1, 3, 4), (3, 3), (1, 1), (3, 1), (2, 1)),
]
POOL_CASES = [
    # windows that tile the input (the tile kernels), whole and with rows and columns over
    ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0), (1, 1)),
    ((2, 2, 7, 9), (2, 2), (2, 2), (0, 0), (1, 1)),
    ((1, 2, 9, 10), (3, 3), (3, 3), (0, 0), (1, 1)),
    ((1, 2, 8, 9), (4, 3), (4, 3), (0, 0), (1, 1)),
    ((1, 1, 5, 5), (1, 1), (1, 1), (0, 0), (1, 1)),
    # ... and with rows of INNER_TILING_BELOW windows or more (a row's kernel)
    ((2, 2, 6, 34), (2, 2), (2, 2), (0, 0), (1, 1)),
    ((1, 3, 7, 25), (3, 3), (3, 3), (0, 0), (1, 1)),
    # covering exactly in rows of at most SHORT_ROWS windows (kernels per width)
    ((3, 4, 4, 4), (2, 2), (2, 2), (0, 0), (1, 1)),
    ((2, 3, 6, 6), (3, 3), (3, 3), (0, 0), (1, 1)),
    ((9, 2, 2, 6), (2, 2), (2, 2), (0, 0), (1, 1)),
    ((1, 1, 3, 1), (1, 1), (1, 1), (0, 0), (1, 1)),
    # the general loops: overlaps, padding, dilation, strides past the kernel
    ((2, 2, 7, 9), (3, 3), (2, 2), (1, 1), (1, 1)),
    ((1, 2, 6, 7), (3, 2), (1, 2), (1, 0), (1, 1)),
    ((1, 2, 7, 8), (2, 2), (1, 1), (1, 1), (2, 3)),
    ((1, 2, 9, 9), (2, 2), (3, 3), (0, 0), (1, 1)),
    ((1, 2, 8, 8), (5, 5), (5, 5), (0, 0), (1, 1)),
    # taps a stride apart read the same columns a window apart (a stem's 7x7, stride 2)
    ((1, 3, 13, 12), (7, 7), (2, 2), (3, 3), (1, 1)),
    ((1, 1, 11, 14), (2, 7), (1, 3), (0, 2), (1, 1)),
    # one window covering each plane (a global pool): 33 planes, eight at a time and one
    ((3, 11, 7, 7), (7, 7), (1, 1), (0, 0), (1, 1)),
    ((2, 3, 4, 6), (4, 6), (2, 5), (0, 0), (1, 1)),
]


def _win(shape, kernel, stride, padding, dilation):
    return check_windows("test", np.empty(shape), kernel, stride, padding, dilation=dilation)


def _ids(cases):
    return [f"{s}-k{k}-s{st}-p{p}-d{d}" for s, k, st, p, d in cases]


# ---------------------------------------------------------------- im2col and col2im


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("channels_outer", [False, True])
@pytest.mark.parametrize("case", WINDOW_CASES, ids=_ids(WINDOW_CASES))
def test_unfold_writes_every_window_in_either_layout(rng, case, channels_outer, dtype):
    win = _win(*case)
    x = rng.standard_normal(case[0]).astype(dtype)
    n, c = case[0][:2]
    if channels_outer:
        buffer = np.empty((c, *win.kernel, n, *win.out_hw), dtype=dtype)
        view = buffer.transpose(3, 0, 1, 2, 4, 5)
    else:
        buffer = view = np.empty((n, c, *win.kernel, *win.out_hw), dtype=dtype)
    kc.unfold(x, buffer, win.geometry(view), -2.5)
    np.testing.assert_array_equal(view, ref_unfold(x, win, -2.5))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("channels_outer", [False, True])
@pytest.mark.parametrize("case", WINDOW_CASES, ids=_ids(WINDOW_CASES))
def test_fold_adds_windows_back_in_offset_order(rng, case, channels_outer, dtype):
    win = _win(*case)
    n, c = case[0][:2]
    cols = rng.standard_normal((n, c, *win.kernel, *win.out_hw)).astype(dtype)
    buffer = np.ascontiguousarray(cols.transpose(1, 2, 3, 0, 4, 5)) if channels_outer else cols
    view = buffer.transpose(3, 0, 1, 2, 4, 5) if channels_outer else buffer
    out = np.full(case[0], np.nan, dtype=dtype)  # every element must be overwritten
    kc.fold(buffer, out, win.geometry(view))
    np.testing.assert_array_equal(out, ref_fold(cols, case[0], win))


def test_unfold_of_a_batch_slice_writes_at_its_base(rng):
    win = _win((4, 2, 5, 5), (3, 3), (1, 1), (1, 1), (1, 1))
    x = rng.standard_normal((4, 2, 5, 5))
    buffer = np.zeros((2, 3, 3, 4, *win.out_hw))
    view = buffer.transpose(3, 0, 1, 2, 4, 5)
    geometry = win.geometry(view)
    geometry[-1] = 2 * geometry[10]  # start at sample 2
    kc.unfold(x[2:], buffer, geometry, 0.0)
    np.testing.assert_array_equal(view[2:], ref_unfold(x[2:], win, 0.0))
    assert not view[:2].any()


@pytest.mark.parametrize("dtype", FLOATS)
def test_unfold_in_parts_writes_each_parts_window_rows_alone(rng, dtype):
    # Parts run at once on Numba's threads: a part must not read a window row that
    # another part writes, even where its taps copy an earlier tap's shifted windows.
    win = _win((1, 2, 13, 12), (7, 7), (2, 2), (3, 3), (1, 1))
    x = rng.standard_normal((1, 2, 13, 12)).astype(dtype)
    reference = ref_unfold(x, win, 0.0).reshape(-1, *win.out_hw)
    body = kc.compiled(kc.unfold_body, np.dtype(dtype))
    for k0, k1 in [(0, 24), (24, 51), (51, 98), (3, 4), (9, 12)]:
        out = np.full((98, *win.out_hw), np.nan, dtype)
        body(x, out, win.geometry(out.reshape(1, 2, 7, 7, *win.out_hw)), dtype(0), k0, k1)
        np.testing.assert_array_equal(out[k0:k1], reference[k0:k1])
        assert np.isnan(out[:k0]).all() and np.isnan(out[k1:]).all()


def test_unfold_reads_read_only_and_non_contiguous_inputs(rng):
    win = _win((2, 3, 6, 6), (3, 3), (1, 1), (1, 1), (1, 1))
    x = rng.standard_normal((2, 6, 6, 3)).astype(np.float32).transpose(0, 3, 1, 2)
    x.flags.writeable = False
    out = np.empty((2, 3, 3, 3, 6, 6), dtype=np.float32)
    kc.unfold(x, out, win.geometry(out), 0.0)
    np.testing.assert_array_equal(out, ref_unfold(np.ascontiguousarray(x), win, 0.0))


# ---------------------------------------------------------------- pooling


def _pool_input(rng, shape, dtype):
    # Values on a coarse grid: windows see ties, so "the first maximum" is exercised.
    return (rng.integers(-3, 4, shape) * 0.5).astype(dtype)


# Pools of INNER_PLANES planes or more with short output rows: the gradient routed with
# the planes innermost (`_max_backward_inner`), tiling windows and the general ones.
INNER_CASES = [
    ((4, 3, 9, 8), (2, 2), (2, 2), (0, 0), (1, 1)),
    ((3, 5, 9, 7), (3, 3), (3, 3), (0, 0), (1, 1)),
    ((2, 6, 9, 11), (3, 3), (2, 2), (1, 1), (1, 1)),
    ((3, 4, 7, 8), (3, 2), (1, 2), (1, 0), (1, 1)),
    ((2, 5, 9, 8), (2, 2), (1, 1), (1, 1), (2, 3)),
]


def test_the_tiling_cases_take_both_kernels():
    tiling = [_win(*case) for case in POOL_CASES if case[1] == case[2] and case[3] == (0, 0)
              and case[4] == (1, 1) and max(case[1]) <= max(kc.TILE_SIZES)]
    widths = [win.out_hw[1] for win in tiling]
    assert min(widths) < kc.INNER_TILING_BELOW <= max(widths)
    assert min(n * c for (n, c, _, _), *_ in POOL_CASES) < kc.INNER_PLANES  # per plane


@pytest.mark.parametrize("case", POOL_CASES, ids=_ids(POOL_CASES))
def test_tiling_windows_that_cover_the_input_run_as_one_plane(rng, case, monkeypatch):
    # Which tile kernels run, and on what: one plane of rows where the windows cover the
    # input exactly, compiled for the rows' width where they are short; the other cases
    # of the table (their results checked above) never take a tile kernel for one plane.
    taken = []
    compiled_tile = kc.compiled_tile

    def spy(kind, kh, kw, dtype, width=0):
        kernel = compiled_tile(kind, kh, kw, dtype, width)
        return lambda *args: taken.append((kind, width, args[0].shape)) or kernel(*args)

    monkeypatch.setattr(kc, "compiled_tile", spy)
    win = _win(*case)
    x = _pool_input(rng, case[0], np.float32)
    y = np.empty((*case[0][:2], *win.out_hw), dtype=np.float32)
    kc.max_pool(x, y, win.geometry())
    kc.max_pool_backward(np.ones_like(y), x, y, np.empty_like(x), win.geometry())
    (n, c, h, w), (kh, kw), tiling = case[0], case[1], case[1] == case[2]
    exact = (tiling and case[3] == (0, 0) and case[4] == (1, 1)
             and max(case[1]) <= max(kc.TILE_SIZES) and h % kh == 0 and w % kw == 0)
    if not exact:  # plane by plane, if at all
        assert all(not kind.endswith("_short") and shape[:2] == (n, c)
                   for kind, _, shape in taken)
        return
    short = win.out_hw[1] <= kc.SHORT_ROWS
    suffix, width = ("_short", win.out_hw[1]) if short else ("", 0)
    assert taken == [("max_forward" + suffix, width, (1, 1, n * c * h, w)),
                     ("max_backward" + suffix, width, (1, 1, n * c * win.out_hw[0], win.out_hw[1]))]


def test_the_pool_cases_take_short_rows_and_long_ones():
    exact = [_win(*case).out_hw[1] for case in POOL_CASES
             if case[1] == case[2] and case[3] == (0, 0) and case[0][2] % case[1][0] == 0
             and case[0][3] % case[1][1] == 0]
    assert min(exact) <= kc.SHORT_ROWS < max(exact)
    assert {2, 3} <= set(exact)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", INNER_CASES, ids=_ids(INNER_CASES))
def test_max_pool_backward_planes_innermost_matches_the_offset_loops(rng, case, dtype,
                                                                    monkeypatch):
    taken = []
    inner = kc._max_backward_inner
    monkeypatch.setattr(kc, "_max_backward_inner", lambda *a: taken.append(1) or inner(*a))
    win = _win(*case)
    x = _pool_input(rng, case[0], dtype)
    y = np.empty((*case[0][:2], *win.out_hw), dtype=dtype)
    kc.max_pool(x, y, win.geometry())
    upstream = rng.standard_normal(y.shape).astype(dtype)
    grad = np.full(case[0], np.nan, dtype=dtype)
    kc.max_pool_backward(upstream, x, y, grad, win.geometry())
    np.testing.assert_array_equal(grad, ref_max_pool_backward(upstream, x, y, win))
    # NaN and infinite inputs, infinite and NaN upstream values
    x.flat[rng.choice(x.size, 3, replace=False)] = [np.nan, -np.inf, np.inf]
    kc.max_pool(x, y, win.geometry())
    upstream.flat[rng.choice(y.size, 2, replace=False)] = [np.inf, np.nan]
    with np.errstate(invalid="ignore"):
        kc.max_pool_backward(upstream, x, y, grad, win.geometry())
        want = ref_max_pool_backward(upstream, x, y, win)
    np.testing.assert_array_equal(grad, want)
    assert taken == [1, 1]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", POOL_CASES, ids=_ids(POOL_CASES))
def test_max_pool_and_backward_match_the_offset_loops(rng, case, dtype):
    win = _win(*case)
    x = _pool_input(rng, case[0], dtype)
    y = np.empty((*case[0][:2], *win.out_hw), dtype=dtype)
    kc.max_pool(x, y, win.geometry())
    np.testing.assert_array_equal(y, ref_max_pool(x, win))
    upstream = rng.standard_normal(y.shape).astype(dtype)
    grad = np.full(case[0], np.nan, dtype=dtype)
    kc.max_pool_backward(upstream, x, y, grad, win.geometry())
    np.testing.assert_array_equal(grad, ref_max_pool_backward(upstream, x, y, win))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", POOL_CASES, ids=_ids(POOL_CASES))
def test_max_pool_backward_with_nans_and_infinities_matches_the_offset_loops(rng, case,
                                                                             dtype):
    # NaN inputs (windows without a match), infinite inputs (maxima that padding ties),
    # and infinite or NaN upstream values (spread over their windows as NaN).
    win = _win(*case)
    x = _pool_input(rng, case[0], dtype)
    x.flat[rng.choice(x.size, 2, replace=False)] = [np.nan, -np.inf]
    y = np.empty((*case[0][:2], *win.out_hw), dtype=dtype)
    kc.max_pool(x, y, win.geometry())
    upstream = rng.standard_normal(y.shape).astype(dtype)
    upstream.flat[rng.choice(y.size, min(2, y.size), replace=False)] = [np.inf, np.nan][:y.size]
    grad = np.full(case[0], 7.0, dtype=dtype)
    with np.errstate(invalid="ignore"):
        kc.max_pool_backward(upstream, x, y, grad, win.geometry())
        want = ref_max_pool_backward(upstream, x, y, win)
    np.testing.assert_array_equal(grad, want)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", POOL_CASES, ids=_ids(POOL_CASES))
def test_avg_pool_and_backward_match_the_offset_loops(rng, case, dtype):
    win = _win(*case)
    x = rng.standard_normal(case[0]).astype(dtype)
    y = np.empty((*case[0][:2], *win.out_hw), dtype=dtype)
    kc.avg_pool(x, y, win.geometry())
    np.testing.assert_array_equal(y, ref_avg_pool(x, win))
    upstream = rng.standard_normal(y.shape).astype(dtype)
    grad = np.full(case[0], np.nan, dtype=dtype)
    kc.avg_pool_backward(upstream, grad, win.geometry())
    np.testing.assert_array_equal(grad, ref_avg_pool_backward(upstream, case[0], win))


@pytest.mark.parametrize("tiling", [True, False])
def test_max_pool_nan_wins_and_routes_nothing(tiling):
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 1, 0] = np.nan
    win = _win(x.shape, (2, 2), (2, 2) if tiling else (1, 1), (0, 0), (1, 1))
    y = np.empty((1, 1, *win.out_hw), dtype=np.float32)
    kc.max_pool(x, y, win.geometry())
    assert np.isnan(y[0, 0, 0, 0]) and not np.isnan(y[0, 0, -1, -1])
    grad = np.empty_like(x)
    upstream = np.ones_like(y)
    kc.max_pool_backward(upstream, x, y, grad, win.geometry())
    np.testing.assert_array_equal(grad, ref_max_pool_backward(upstream, x, y, win))
    assert grad[0, 0, :2, :2].sum() == 0  # the NaN window routed nothing


@pytest.mark.parametrize("tiling", [True, False])
def test_max_pool_nan_upstream_spreads_as_nan_times_zero(tiling):
    x = np.arange(16, dtype=np.float64).reshape(1, 1, 4, 4)
    win = _win(x.shape, (2, 2), (2, 2) if tiling else (1, 1), (0, 0), (1, 1))
    y = np.empty((1, 1, *win.out_hw))
    kc.max_pool(x, y, win.geometry())
    upstream = np.ones_like(y)
    upstream[0, 0, 0, 0] = np.inf
    grad = np.empty_like(x)
    kc.max_pool_backward(upstream, x, y, grad, win.geometry())
    np.testing.assert_array_equal(grad, ref_max_pool_backward(upstream, x, y, win))
    assert np.isnan(grad[0, 0, 0, 0])


def test_max_pool_of_minus_inf_routes_to_padding_first():
    # A window whose maximum is -inf matches the padding (-inf) before the input, so the
    # gradient goes nowhere, as the offset loops (and padding as -inf) say.
    x = np.full((1, 1, 2, 2), -np.inf, dtype=np.float32)
    win = _win(x.shape, (2, 2), (1, 1), (1, 1), (1, 1))
    y = np.empty((1, 1, *win.out_hw), dtype=np.float32)
    kc.max_pool(x, y, win.geometry())
    grad = np.empty_like(x)
    upstream = np.ones_like(y)
    kc.max_pool_backward(upstream, x, y, grad, win.geometry())
    np.testing.assert_array_equal(grad, ref_max_pool_backward(upstream, x, y, win))


def test_tile_kernels_agree_with_the_general_loops(rng):
    x = _pool_input(rng, (3, 4, 9, 11), np.float32)
    win = _win(x.shape, (2, 3), (2, 3), (0, 0), (1, 1))
    y_tile = np.empty((3, 4, *win.out_hw), dtype=np.float32)
    y_loop = np.empty_like(y_tile)
    kc.max_pool(x, y_tile, win.geometry())
    kc.compiled(kc.max_pool_body, np.dtype(np.float32))(x, y_loop, win.geometry(),
                                                        np.float32(-np.inf), 0, 4)
    np.testing.assert_array_equal(y_tile, y_loop)
    upstream = rng.standard_normal(y_tile.shape).astype(np.float32)
    tile, loop = np.empty_like(x), np.empty_like(x)
    kc.max_pool_backward(upstream, x, y_tile, tile, win.geometry())
    kc.compiled(kc.max_pool_backward_body, np.dtype(np.float32))(
        upstream, x, y_tile, loop, win.geometry(), np.float32(-np.inf))
    np.testing.assert_array_equal(tile, loop)


# ---------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", [np.float16, np.int32])
def test_unsupported_dtypes_raise_kernel_errors_naming_the_op(dtype):
    x = np.zeros((1, 1, 4, 4), dtype=dtype)
    win = _win(x.shape, (2, 2), (2, 2), (0, 0), (1, 1))
    y = np.empty((1, 1, 2, 2), dtype=dtype)
    with pytest.raises(KernelError, match=rf"max_pool2d: .*unsupported dtype {np.dtype(dtype)}"):
        kc.max_pool(x, y, win.geometry())


def test_mixed_dtypes_raise_kernel_errors():
    x = np.zeros((1, 1, 4, 4), dtype=np.float32)
    win = _win(x.shape, (2, 2), (2, 2), (0, 0), (1, 1))
    with pytest.raises(KernelError, match=r"unfold2d: .*mixed dtypes float32 and float64"):
        kc.unfold(x, np.empty((1, 1, 2, 2, 2, 2)), win.geometry(np.empty((1, 1, 2, 2, 2, 2))),
                  0.0)
