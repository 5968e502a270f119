"""Sliding-window kernels on NCHW arrays, compiled with Numba per dtype (float32,
float64): im2col (`unfold`) into any window layout whose last two axes are (OH, OW),
its adjoint col2im (`fold`), max and average pooling with their backward passes, and a
tiled 2-D transpose (small-map convolutions put the batch innermost with it).

Each kernel is a serial loop that releases the GIL. The windows are described by one
int64 array, `geometry` (see `geometry()`); loops skip padding by computing
each kernel column's valid output range once, which keeps the inner loops branch-free
and contiguous. Results are bit for bit those of NumPy loops over kernel offsets.

One file on purpose: Numba's disk cache notices an edit to a kernel's own file only,
not to the helpers it calls, so the bodies and their helpers live together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pullback.errors import KernelError
from pullback.kernels import jit
from pullback.kernels.base import _SUPPORTED, SUPPORTED_DTYPES


def geometry(kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
             dilation: Sequence[int], out_hw: Sequence[int], windows: np.ndarray | None = None,
             base: int = 0) -> np.ndarray:
    """The `geometry` array the kernels read: kernel, stride, padding and dilation pairs
    (kh kw sh sw ph pw dh dw), the output size (oh ow), then, for the window array
    (blocks, OH, OW) of unfold and fold, the strides of its (n, c, i, j) axes in blocks
    and the block of the first window (s_n s_c s_i s_j base). `windows` is the window
    array as (N, C, kh, kw, OH, OW), any view of a C-contiguous buffer whose last two
    axes are contiguous (N first or C first); pooling needs none."""
    strides: tuple[int, ...] = (0,) * 4
    if windows is not None:
        block = windows.itemsize * out_hw[0] * out_hw[1]
        strides = tuple(s // block for s in windows.strides[:4])
    return np.array([*kernel, *stride, *padding, *dilation, *out_hw, *strides, base],
                    dtype=np.int64)


# ---------------------------------------------------------------- kernel bodies
# Plain Python, compiled by `compiled`. Arrays are read and written as flat memory at
# unsigned offsets (U): a signed index makes Numba check it for wraparound per element,
# which stops LLVM vectorizing the short rows these loops copy (im2col of 64x32x16x16
# took 4.8 ms over 2-D views, 2.5 ms flat and unsigned). Unsigned values are only
# combined with unsigned ones: Numba types int64 + uint64 as float64.

U = np.uint64


def _spans(kw, sw, dw, pw, w_, ow_):
    """For each kernel column j, the range [lo, hi) of output columns t whose input
    column t sw + j dw - pw lies inside [0, w_): computed once per call, as integer
    divisions in the row loops cost more than the rows' own work."""
    spans = np.empty((kw, 2), dtype=np.int64)
    for j in range(kw):
        start = j * dw - pw
        lo = 0 if start >= 0 else (sw - 1 - start) // sw
        hi = 0 if start > w_ - 1 else (w_ - 1 - start) // sw + 1
        lo = min(lo, ow_)
        spans[j, 0] = lo
        spans[j, 1] = max(lo, min(hi, ow_))
    return spans


def unfold_body(x, out, g, pad_value, k0, k1):
    """out[base + n s_n + c s_c + i s_i + j s_j, r, t] = x[n, c, r sh + i dh - ph,
    t sw + j dw - pw], pad_value outside x, for the window rows (c, i, j) k0 to k1
    (c kh kw + i kw + j); out is (blocks, OH, OW)."""
    kh, kw, sh, sw, ph, pw, dh, dw = g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    oh_, ow_, s_n, s_c, s_i, s_j, base = g[8], g[9], g[10], g[11], g[12], g[13], g[14]
    n_, c_, h_, w_ = x.shape
    spans = _spans(kw, sw, dw, pw, w_, ow_)
    src = x.reshape(x.size)
    dst = out.reshape(out.size)
    step, width = U(sw), U(ow_)
    # "Same" windows at stride 1 (3x3 with padding 1): an output row is as wide as an
    # input row, so a whole block of windows is one contiguous run of x, shifted; copy
    # it at once and then write the padding columns (those the run wrapped around).
    same = sh == 1 and sw == 1 and ow_ == w_
    for n in range(n_):
        for k in range(k0, k1):  # the (c, i, j) blocks k0 to k1 of each sample
            c, i, j = k // (kh * kw), k // kw % kh, k % kw
            plane = (n * c_ + c) * h_ * w_
            block = (base + n * s_n + c * s_c + i * s_i + j * s_j) * oh_ * ow_
            col0 = j * dw - pw
            lo, hi = spans[j, 0], spans[j, 1]
            if same:
                shift = i * dh - ph  # input row = output row + shift
                first = min(max(0, -shift), oh_)
                stop = max(first, min(oh_, h_ - shift))
                for t in range(U(first * w_)):
                    dst[U(block) + t] = pad_value
                for t in range(U(stop * w_), U(oh_ * w_)):
                    dst[U(block) + t] = pad_value
                if stop > first and hi > lo:
                    to = U(block + first * w_ + lo)
                    start = U(plane + (first + shift) * w_ + lo + col0)
                    for t in range(U((stop - first - 1) * w_ + hi - lo)):
                        dst[to + t] = src[start + t]
                for r in range(first, stop):
                    at = U(block + r * w_)
                    for t in range(U(lo)):
                        dst[at + t] = pad_value
                    for t in range(U(hi), width):
                        dst[at + t] = pad_value
                continue
            if sw > 1 and dw == 1 and j >= sw and k - sw >= k0 and ow_ > 1:
                # Tap j reads tap j - sw's columns one window later: its block (written
                # above, in this part) shifted by one, a contiguous copy in place of
                # strided reads; each row's last window read anew. (A stem's 7x7
                # windows at stride 2 on one thread: 0.74 -> 0.60 ms.)
                earlier = block - sw * s_j * oh_ * ow_
                for t in range(U(oh_ * ow_ - 1)):
                    dst[U(block) + t] = dst[U(earlier + 1) + t]
                last = (ow_ - 1) * sw + col0  # the input column of a row's last window
                for r in range(oh_):
                    h = r * sh + i * dh - ph
                    inside = 0 <= h < h_ and 0 <= last < w_
                    dst[block + r * ow_ + ow_ - 1] = src[plane + h * w_ + last] \
                        if inside else pad_value
                continue
            for r in range(oh_):
                h = r * sh + i * dh - ph
                at = U(block + r * ow_)
                if h < 0 or h >= h_:
                    for t in range(width):
                        dst[at + t] = pad_value
                    continue
                for t in range(U(lo)):
                    dst[at + t] = pad_value
                to = at + U(lo)
                start = U(plane + h * w_ + lo * sw + col0)
                if sw == 1:
                    for t in range(U(hi - lo)):
                        dst[to + t] = src[start + t]
                else:
                    for t in range(U(hi - lo)):
                        dst[to + t] = src[start + t * step]
                for t in range(U(hi), width):
                    dst[at + t] = pad_value


def fold_body(cols, out, g):
    """out[n, c] = the sum of the windows in cols (blocks, OH, OW), laid out as
    unfold_body writes them, over the positions they cover; offsets added in
    row-major (i, j) order, as NumPy's loop of `out[window] += cols[i, j]`."""
    kh, kw, sh, sw, ph, pw, dh, dw = g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    oh_, ow_, s_n, s_c, s_i, s_j, base = g[8], g[9], g[10], g[11], g[12], g[13], g[14]
    n_, c_, h_, w_ = out.shape
    spans = _spans(kw, sw, dw, pw, w_, ow_)
    src = cols.reshape(cols.size)
    dst = out.reshape(out.size)
    step = U(sw)
    # Row by row, for every window shape. (Adding a "same" block as one contiguous run,
    # then restoring the row-edge positions the run wrapped onto, measured slower:
    # 64x32x16x16, 3x3, padding 1: 1.39 ms against 1.04; 32x32x4x4: 0.19 against 0.13.)
    for n in range(n_):
        for c in range(c_):
            plane = (n * c_ + c) * h_ * w_
            for t in range(U(h_ * w_)):
                dst[U(plane) + t] = 0
            for i in range(kh):
                for j in range(kw):
                    block = (base + n * s_n + c * s_c + i * s_i + j * s_j) * oh_ * ow_
                    col0 = j * dw - pw
                    lo, hi = spans[j, 0], spans[j, 1]
                    for r in range(oh_):
                        h = r * sh + i * dh - ph
                        if h < 0 or h >= h_:
                            continue
                        start = U(block + r * ow_ + lo)
                        to = U(plane + h * w_ + lo * sw + col0)
                        if sw == 1:
                            for t in range(U(hi - lo)):
                                dst[to + t] += src[start + t]
                        else:
                            for t in range(U(hi - lo)):
                                dst[to + t * step] += src[start + t]


def _running_max(src, dst, start, to, count, step):
    """dst[to + t] = max(dst[to + t], src[start + t step]) for t < count, NaN winning
    (np.maximum). Inlined, so a constant `step` reaches LLVM, which then vectorizes
    the strided reads."""
    for t in range(count):
        v = src[start + t * step]
        a = dst[to + t]
        dst[to + t] = v if (v > a) | (v != v) else a


def max_pool_body(x, out, g, lowest, c0, c1):
    """out[n, c, r, t] = the maximum of its window, NaN if the window holds one, as
    np.maximum over the window's offsets in turn, for channels c0 to c1; padding
    (`lowest`, -inf) changes nothing, so it is skipped."""
    kh, kw, sh, sw, ph, pw, dh, dw = g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    oh_, ow_ = g[8], g[9]
    n_, c_, h_, w_ = x.shape
    spans = _spans(kw, sw, dw, pw, w_, ow_)
    src = x.reshape(x.size)
    dst = out.reshape(out.size)
    width = U(ow_)
    for n in range(n_):
        for c in range(c0, c1):
            plane = (n * c_ + c) * h_ * w_
            for r in range(oh_):
                at = U(((n * c_ + c) * oh_ + r) * ow_)
                for t in range(width):
                    dst[at + t] = lowest
                for i in range(kh):
                    h = r * sh + i * dh - ph
                    if h < 0 or h >= h_:
                        continue
                    for j in range(kw):
                        lo, hi = spans[j, 0], spans[j, 1]
                        to = at + U(lo)
                        start = U(plane + h * w_ + lo * sw + j * dw - pw)
                        if sw == 2:
                            _running_max(src, dst, start, to, U(hi - lo), U(2))
                        elif sw == 1:
                            _running_max(src, dst, start, to, U(hi - lo), U(1))
                        else:
                            _running_max(src, dst, start, to, U(hi - lo), U(sw))
    return out


def _pad_match(peak, first, at, row, lo, hi, lowest):
    # Windows at [lo, hi) of a row reading padding at this tap: padding equals a -inf
    # maximum, and a window whose first maximum is padding routes nothing.
    for t in range(lo, hi):
        first[row + t] = -1 if peak[at + t] == lowest else first[row + t]


def max_pool_backward_body(upstream, x, y, grad, g, lowest):
    """grad[n, c] = upstream routed to the first position of each window (row-major,
    padding reading as `lowest`) where x equals the window's maximum, overlapping
    windows adding in the order of the NumPy code's loop over offsets; a window without
    a match (a NaN maximum) routes nothing, and a NaN or infinite upstream spreads over
    its window as NaN (u * 0 at its other taps).

    Per plane, in passes that never store with a stride: which tap of each window is
    its first maximum, and where (backwards through the taps, vectorized along each row
    of windows: the last match kept is the first); the windows then ordered by that tap
    (a counting sort), so that routing them adds in the offset loop's order, one add a
    window; then, only for an upstream that is not finite, NaN at the window's other
    taps. The loop over offsets also adds u - u = 0 at every other tap, which changes
    nothing for a finite u: the gradient starts at +0 and no sum reaches -0. (Storing
    every tap with the window's stride took ResNet's 3x3, stride-2 pool of 64x112x112
    10 ms, against 0.3 for PyTorch's, which saves the maxima's indices.)"""
    kh, kw, sh, sw, ph, pw, dh, dw = g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    oh_, ow_ = g[8], g[9]
    n_, c_, h_, w_ = x.shape
    spans = _spans(kw, sw, dw, pw, w_, ow_)
    src = x.reshape(x.size)
    peak = y.reshape(y.size)
    up = upstream.reshape(upstream.size)
    dst = grad.reshape(grad.size)
    windows = oh_ * ow_
    taps = kh * kw
    first = np.empty(windows, dtype=np.int32)  # per window: its first maximum's tap, or -1
    where = np.empty(windows, dtype=np.int64)  # ... and its position in the plane
    reach = np.empty(taps, dtype=np.int64)  # per tap: its offset from its window's corner
    for i in range(kh):
        for j in range(kw):
            reach[i * kw + j] = i * dh * w_ + j * dw
    order = np.empty(windows, dtype=np.int64)  # the windows by that tap
    starts = np.empty(taps + 1, dtype=np.int64)
    for p in range(n_ * c_):
        plane = p * h_ * w_
        at = p * windows
        for k in range(U(h_ * w_)):
            dst[U(plane) + k] = 0
        for r in range(oh_):
            row = U(r * ow_)
            for t in range(U(ow_)):
                first[row + t] = -1
            for i in range(kh - 1, -1, -1):
                h = r * sh + i * dh - ph
                for j in range(kw - 1, -1, -1):
                    lo, hi = spans[j, 0], spans[j, 1]
                    if h < 0 or h >= h_:
                        lo = hi = ow_
                    at_row = U(at) + row
                    _pad_match(peak, first, at_row, row, U(0), U(lo), lowest)
                    _pad_match(peak, first, at_row, row, U(hi), U(ow_), lowest)
                    if hi <= lo:
                        continue
                    start = U(plane + h * w_ + lo * sw + j * dw - pw)
                    tap = np.int32(i * kw + j)
                    a0, r0, count = at_row + U(lo), row + U(lo), U(hi - lo)
                    # The windows whose maximum is this tap's value take it. Written out
                    # per stride, not as a helper: LLVM kept a helper a call here, and
                    # only a constant stride vectorizes (64x112x112, 3x3, stride 2: 5.0
                    # -> 2.0 ms).
                    if sw == 1:
                        for t in range(count):
                            hit = src[start + t] == peak[a0 + t]
                            first[r0 + t] = tap if hit else first[r0 + t]
                    elif sw == 2:
                        for t in range(count):
                            hit = src[start + U(2) * t] == peak[a0 + t]
                            first[r0 + t] = tap if hit else first[r0 + t]
                    else:
                        for t in range(count):
                            hit = src[start + U(sw) * t] == peak[a0 + t]
                            first[r0 + t] = tap if hit else first[r0 + t]
        for k in range(taps + 1):
            starts[k] = 0
        for w in range(windows):
            starts[first[w] + 1] += 1
        total = 0
        for k in range(taps + 1):
            count = starts[k]
            starts[k] = total
            total += count
        routed = starts[1]  # the windows before are those that route nothing
        for r in range(oh_):  # where each routed window's maximum lies
            corner = (r * sh - ph) * w_ - pw
            for t in range(ow_):
                f = first[r * ow_ + t]
                where[r * ow_ + t] = corner + t * sw + reach[max(f, 0)]
        for w in range(windows):
            b = first[w] + 1
            order[starts[b]] = w
            starts[b] += 1
        for k in range(routed, windows):
            w = order[k]
            dst[U(plane + where[w])] += up[at + w]
        spread = False
        for w in range(U(windows)):
            u = up[U(at) + w]
            spread = spread | (u - u != 0)  # NaN for an infinite or NaN u
        if spread:
            _spread_nan(up, dst, first, g, h_, w_, plane, at)
    return grad


def max_pool_backward_inner_body(upstream, x, y, grad, g, lowest):
    """max_pool_backward_body's result with the planes innermost: upstream and y (OH,
    OW, P), x and grad (H, W, P) for P planes. The NumPy code's loop over offsets as it
    is (the first maximum not yet routed takes u, every other tap adds u - u), each
    window's taps a run over the planes, which vectorizes however small the maps."""
    kh, kw, sh, sw, ph, pw, dh, dw = g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    oh_, ow_ = g[8], g[9]
    h_, w_, p_ = x.shape
    src = x.reshape(x.size)
    peak = y.reshape(y.size)
    up = upstream.reshape(upstream.size)
    dst = grad.reshape(grad.size)
    planes = U(p_)
    taken = np.zeros(oh_ * ow_ * p_, dtype=np.bool_)  # per window and plane: routed
    for k in range(U(dst.size)):
        dst[k] = 0
    for i in range(kh):
        for j in range(kw):
            for r in range(oh_):
                h = r * sh + i * dh - ph
                for t in range(ow_):
                    col = t * sw + j * dw - pw
                    at = U((r * ow_ + t) * p_)
                    if h < 0 or h >= h_ or col < 0 or col >= w_:
                        for q in range(planes):  # padding equals a -inf maximum
                            taken[at + q] = taken[at + q] | (peak[at + q] == lowest)
                        continue
                    pos = U((h * w_ + col) * p_)
                    for q in range(planes):
                        done = taken[at + q]
                        hit = (src[pos + q] == peak[at + q]) & (not done)
                        u = up[at + q]
                        dst[pos + q] += u if hit else u - u
                        taken[at + q] = done | hit
    return grad


def _spread_nan(up, dst, first, g, h_, w_, plane, at):
    # u - u (NaN) at every tap inside x but the first maximum's, for the windows of a
    # plane whose upstream u is not finite.
    kh, kw, sh, sw, ph, pw, dh, dw = g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    oh_, ow_ = g[8], g[9]
    for r in range(oh_):
        for t in range(ow_):
            u = up[at + r * ow_ + t]
            if u - u == 0:
                continue
            for i in range(kh):
                h = r * sh + i * dh - ph
                for j in range(kw):
                    col = t * sw + j * dw - pw
                    if 0 <= h < h_ and 0 <= col < w_ and i * kw + j != first[r * ow_ + t]:
                        dst[U(plane + h * w_ + col)] += u - u


def avg_pool_body(x, out, g, scale):
    """out[n, c, r, t] = scale * the sum of its window (padding adds nothing), offsets
    summed in row-major order, as NumPy's loop over offsets."""
    kh, kw, sh, sw, ph, pw, dh, dw = g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    oh_, ow_ = g[8], g[9]
    n_, c_, h_, w_ = x.shape
    spans = _spans(kw, sw, dw, pw, w_, ow_)
    src = x.reshape(x.size)
    dst = out.reshape(out.size)
    step, width = U(sw), U(ow_)
    for n in range(n_):
        for c in range(c_):
            plane = (n * c_ + c) * h_ * w_
            for r in range(oh_):
                at = U(((n * c_ + c) * oh_ + r) * ow_)
                for t in range(width):
                    dst[at + t] = 0
                for i in range(kh):
                    h = r * sh + i * dh - ph
                    if h < 0 or h >= h_:
                        continue
                    for j in range(kw):
                        col0 = j * dw - pw
                        lo, hi = spans[j, 0], spans[j, 1]
                        to = at + U(lo)
                        start = U(plane + h * w_ + lo * sw + col0)
                        if sw == 2:
                            for t in range(U(hi - lo)):
                                dst[to + t] += src[start + t * U(2)]
                        else:
                            for t in range(U(hi - lo)):
                                dst[to + t] += src[start + t * step]
                for t in range(width):
                    dst[at + t] = dst[at + t] * scale
    return out


def avg_pool_global_body(x, out, scale):
    """out[n, c, 0, 0] = scale * the sum of the plane x[n, c], for one window covering
    each plane (a global average pool): the plane's positions summed in row-major
    order from zero, the general body's order of offsets, so bit for bit its result.
    Eight planes' sums run side by side, in registers: each alone is a chain of
    dependent adds (ResNet-20's 64 x 64 planes of 8 x 8: 300 us as a loop over an array
    of eight sums, or over one plane at a time)."""
    m, p = x.shape[0] * x.shape[1], x.shape[2] * x.shape[3]
    src = x.reshape(m * p)
    dst = out.reshape(m)
    zero = out.dtype.type(0)
    whole = m - m % 8
    for first in range(0, whole, 8):
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
        at = first * p
        for k in range(p):
            s0 += src[at + k]
            s1 += src[at + p + k]
            s2 += src[at + 2 * p + k]
            s3 += src[at + 3 * p + k]
            s4 += src[at + 4 * p + k]
            s5 += src[at + 5 * p + k]
            s6 += src[at + 6 * p + k]
            s7 += src[at + 7 * p + k]
        dst[first] = s0 * scale
        dst[first + 1] = s1 * scale
        dst[first + 2] = s2 * scale
        dst[first + 3] = s3 * scale
        dst[first + 4] = s4 * scale
        dst[first + 5] = s5 * scale
        dst[first + 6] = s6 * scale
        dst[first + 7] = s7 * scale
    for plane in range(whole, m):
        total = zero
        for k in range(p):
            total += src[plane * p + k]
        dst[plane] = total * scale
    return out


def avg_pool_global_backward_body(upstream, grad, scale):
    """grad[n, c] = scale * upstream[n, c, 0, 0] at every position of the plane, for one
    window covering each plane: zero plus the window's one share, as the general body
    adds it (so -0.0 upstream gives +0.0 there too), bit for bit; one store per position
    where the general body's loops run over the window's offsets (ResNet-20's 64 x 64
    planes of 8 x 8: 2 ms)."""
    m, p = grad.shape[0] * grad.shape[1], grad.shape[2] * grad.shape[3]
    up = upstream.reshape(m)
    dst = grad.reshape(m * p)
    zero = grad.dtype.type(0)
    for plane in range(m):
        share = zero + up[plane] * scale
        for k in range(p):
            dst[plane * p + k] = share
    return grad


def avg_pool_backward_body(upstream, grad, g, scale):
    """grad[n, c] = the sum, over the windows covering each position, of scale *
    upstream; offsets in row-major order, as NumPy's loop of `grad[window] += share`."""
    kh, kw, sh, sw, ph, pw, dh, dw = g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    oh_, ow_ = g[8], g[9]
    n_, c_, h_, w_ = grad.shape
    spans = _spans(kw, sw, dw, pw, w_, ow_)
    up = upstream.reshape(upstream.size)
    dst = grad.reshape(grad.size)
    step = U(sw)
    for n in range(n_):
        for c in range(c_):
            plane = (n * c_ + c) * h_ * w_
            windows = (n * c_ + c) * oh_ * ow_
            for t in range(U(h_ * w_)):
                dst[U(plane) + t] = 0
            for i in range(kh):
                for j in range(kw):
                    col0 = j * dw - pw
                    lo, hi = spans[j, 0], spans[j, 1]
                    for r in range(oh_):
                        h = r * sh + i * dh - ph
                        if h < 0 or h >= h_:
                            continue
                        at = U(windows + r * ow_ + lo)
                        to = U(plane + h * w_ + lo * sw + col0)
                        for t in range(U(hi - lo)):
                            dst[to + t * step] += up[at + t] * scale
    return grad


def transpose_body(src, dst):
    """dst = src.T for a C-contiguous (A, B) src and (B, A) dst: blocks of BLOCK x
    BLOCK values (a SIMD vector's lanes: 8 float32, 4 float64) each moved by
    `transpose_block`, the edges value by value. Small-map convolutions move the batch
    innermost and back with it (a 576 x 128 float32 transpose: NumPy's strided copy
    about 110 us, 8 x 8 tiles of scalar moves 31, vector blocks (compiled) 10-12).

    Blocks go two at a time along dst's rows (each row of dst then gets a whole cache
    line in one go, not half of one now and half after a sweep over all of src), or,
    where a row of dst is a multiple of 512 bytes, two at a time down its columns: a
    block's rows that far apart fall into the same few sets of the L1 cache and evict
    each other (512 x 128 float32: 27.8 against 12.2 us)."""
    a_, b_ = src.shape
    s = src.reshape(src.size)
    d = dst.reshape(dst.size)
    a8 = a_ - a_ % BLOCK
    b8 = b_ - b_ % BLOCK
    if a_ % (16 * BLOCK) == 0:  # 16 * BLOCK values: 512 bytes
        for b0 in range(0, b8, 2 * BLOCK):
            for a0 in range(0, a8, BLOCK):
                transpose_block(s, a0 * b_ + b0, b_, d, b0 * a_ + a0, a_)
                if b0 + BLOCK < b8:
                    transpose_block(s, a0 * b_ + b0 + BLOCK, b_, d, (b0 + BLOCK) * a_ + a0, a_)
    else:
        for a0 in range(0, a8, 2 * BLOCK):
            for b0 in range(0, b8, BLOCK):
                transpose_block(s, a0 * b_ + b0, b_, d, b0 * a_ + a0, a_)
                if a0 + BLOCK < a8:
                    transpose_block(s, (a0 + BLOCK) * b_ + b0, b_, d, b0 * a_ + a0 + BLOCK, a_)
    for b in range(b8, b_):  # the edges: src's last columns, then its last rows
        for a in range(a8):
            d[U(b * a_ + a)] = s[U(a * b_ + b)]
    for a in range(a8, a_):
        for b in range(b_):
            d[U(b * a_ + a)] = s[U(a * b_ + b)]


BLOCK = 8  # transpose_body's blocks (rebound to the dtype's SIMD lanes when compiled)


def transpose_block(s, at_s, row_s, d, at_d, row_d):
    """d[at_d + j row_d + i] = s[at_s + i row_s + j] for i, j < BLOCK (compiled: BLOCK
    vector loads, a butterfly of shuffles, BLOCK vector stores: `_transpose_intrinsic`)."""
    for i in range(BLOCK):
        for j in range(BLOCK):
            d[at_d + j * row_d + i] = s[at_s + i * row_s + j]


def _transpose_intrinsic(lanes: int) -> Any:
    """`transpose_block` for lanes x lanes blocks in LLVM IR: row i loaded as one vector,
    then log2(lanes) stages pairing rows i and i + w (w = 1, 2, 4), each new pair taking
    the blocks of w lanes at even places from both rows and those at odd places from
    both (shufflevector), which leaves row i holding column i."""
    from llvmlite import ir  # type: ignore[import-untyped]  # llvmlite ships no type information
    from numba import types
    from numba.extending import intrinsic

    def typer(typingctx, s, at_s, row_s, d, at_d, row_d):
        return types.void(s, types.intp, types.intp, d, types.intp, types.intp), codegen

    def codegen(context, builder, signature, args):
        s, at_s, row_s, d, at_d, row_d = args
        sty = signature.args[0]
        ps = jit.item_pointer(context, builder, sty, s, at_s)
        pd = jit.item_pointer(context, builder, signature.args[3], d, at_d)
        scalar = context.get_value_type(sty.dtype)
        size = np.dtype(str(sty.dtype)).itemsize
        vptr = ir.VectorType(scalar, lanes).as_pointer()
        i32 = ir.IntType(32)
        rows = [builder.load(builder.bitcast(builder.gep(ps, [builder.mul(
            row_s, ir.Constant(row_s.type, i))]), vptr), align=size) for i in range(lanes)]
        w = 1
        while w < lanes:
            low = [k if (k // w) % 2 == 0 else lanes + k - w for k in range(lanes)]
            high = [k + w if (k // w) % 2 == 0 else lanes + k for k in range(lanes)]
            paired = list(rows)
            for i in range(lanes):
                if (i // w) % 2 == 0:
                    a, b = rows[i], rows[i + w]
                    paired[i] = builder.shuffle_vector(a, b, ir.Constant(
                        ir.VectorType(i32, lanes), low))
                    paired[i + w] = builder.shuffle_vector(a, b, ir.Constant(
                        ir.VectorType(i32, lanes), high))
            rows, w = paired, 2 * w
        for i, row in enumerate(rows):
            at = builder.gep(pd, [builder.mul(row_d, ir.Constant(row_d.type, i))])
            builder.store(row, builder.bitcast(at, vptr), align=size)
        return context.get_dummy_value()

    return intrinsic(typer)


def transposed_equal_body(src, dst):
    """Whether the (B, A) dst holds the (A, B) src transposed, for arrays of unsigned
    integers (floats' bits: equal bits, equal floats, signed zeros and NaNs alike), in
    8 x 8 tiles of constant size (LLVM unrolls them), stopping after the first band of 8
    rows that differs."""
    a_, b_ = src.shape
    if src.size == 0:
        return True
    s = src.reshape(src.size)
    d = dst.reshape(dst.size)
    a8 = a_ - a_ % 8
    b8 = b_ - b_ % 8
    for a0 in range(0, a8, 8):
        differ = s[0] ^ s[0]
        for b0 in range(0, b8, 8):
            for b in range(8):
                for a in range(8):
                    differ |= d[U((b0 + b) * a_ + a0 + a)] ^ s[U((a0 + a) * b_ + b0 + b)]
        for b in range(b8, b_):
            for a in range(8):
                differ |= d[U(b * a_ + a0 + a)] ^ s[U((a0 + a) * b_ + b)]
        if differ:
            return False
    for a in range(a8, a_):
        for b in range(b_):
            if d[U(b * a_ + a)] != s[U(a * b_ + b)]:
                return False
    return True


# ---------------------------------------------------------------- tiling windows
# Pools whose windows tile the input (stride = kernel, no padding or dilation: the
# MaxPool2d(k) of most CNNs) take one pass per output, with the window's taps in the
# inner loops. Those loops unroll only for constant kernel sizes, and unrolled they
# let LLVM vectorize across outputs: MaxPool2d(2) of 64x32x32x32 took 0.2 ms this way,
# 2 ms with the general loops above. So these bodies are closures over kh, kw (and
# the dtype's zero), compiled per size; Numba's cache keys them by those values.
TILE_SIZES = range(1, 5)  # kh and kw with their own compiled tile kernels


def tile_bodies(kh: int, kw: int, zero: Any, width: int = 0) -> dict[str, Callable]:
    """Tile pooling bodies for a kh x kw window; zero is 0 in the kernel's dtype; a
    `width` other than 0 is the output rows' width, a constant of the compiled kernel
    (SHORT_ROWS)."""

    def max_forward(x, out, lowest):
        """out = the maximum of each window, NaN winning, taps in row-major order."""
        n_, c_, h_, w_ = x.shape
        oh_, ow_ = out.shape[2], out.shape[3]
        src = x.reshape(x.size)
        dst = out.reshape(out.size)
        for p in range(n_ * c_):
            for r in range(oh_):
                at = U((p * oh_ + r) * ow_)
                base = U(p * h_ * w_ + r * kh * w_)
                for t in range(U(ow_)):
                    a = lowest
                    for i in range(kh):
                        for j in range(kw):
                            v = src[base + U(i * w_ + j) + t * U(kw)]
                            a = v if (v > a) | (v != v) else a
                    dst[at + t] = a
        return out

    def max_backward(upstream, x, y, grad):
        """grad = upstream at the first tap of each window equal to its maximum, and
        0 + u * 0 at the others: the NumPy mask product, bit for bit. Two passes per
        output row, each vectorizable: which tap is the first maximum (none: kh kw),
        then every tap of the input rows, written once."""
        n_, c_, h_, w_ = x.shape
        oh_, ow_ = y.shape[2], y.shape[3]
        src = x.reshape(x.size)
        peak = y.reshape(y.size)
        up = upstream.reshape(upstream.size)
        dst = grad.reshape(grad.size)
        first = np.empty(ow_, dtype=np.int32)
        for p in range(n_ * c_):
            _zero_uncovered(dst, p * h_ * w_, h_, w_, oh_ * kh, ow_ * kw, zero)
            for r in range(oh_):
                at = U((p * oh_ + r) * ow_)
                base = U(p * h_ * w_ + r * kh * w_)
                for t in range(U(ow_)):
                    m = peak[at + t]
                    k = kh * kw
                    for i in range(kh - 1, -1, -1):  # backwards: the first match wins
                        for j in range(kw - 1, -1, -1):
                            v = src[base + U(i * w_ + j) + t * U(kw)]
                            k = i * kw + j if v == m else k
                    first[t] = k
                for i in range(kh):
                    row = base + U(i * w_)
                    for t in range(U(ow_)):
                        u = up[at + t]
                        k = first[t]
                        for j in range(kw):
                            share = u if k == i * kw + j else u * zero
                            dst[row + t * U(kw) + U(j)] = share + zero
        return grad

    def max_forward_short(x, out, lowest):
        """max_forward for windows that cover x exactly in output rows of `width`
        windows, the arrays as one plane (`_one_plane`), the row's loop unrolled over
        its constant width (SHORT_ROWS)."""
        rows = out.shape[2]
        w_ = width * kw
        src = x.reshape(x.size)
        dst = out.reshape(out.size)
        for r in range(rows):
            at = r * width
            base = r * kh * w_
            for t in range(width):
                a = lowest
                for i in range(kh):
                    for j in range(kw):
                        v = src[base + i * w_ + t * kw + j]
                        a = v if (v > a) | (v != v) else a
                dst[at + t] = a
        return out

    def max_backward_short(upstream, x, y, grad):
        """max_backward for windows that cover x exactly in output rows of `width`
        windows, the arrays as one plane (`_one_plane`): window by window, the first
        maximum's tap and then the window's taps written, the row's loops unrolled over
        its constant width (SHORT_ROWS)."""
        rows = y.shape[2]
        w_ = width * kw
        src = x.reshape(x.size)
        peak = y.reshape(y.size)
        up = upstream.reshape(upstream.size)
        dst = grad.reshape(grad.size)
        for r in range(rows):
            at = r * width
            base = r * kh * w_
            for t in range(width):
                m = peak[at + t]
                k = kh * kw
                for i in range(kh - 1, -1, -1):  # backwards: the first match wins
                    for j in range(kw - 1, -1, -1):
                        v = src[base + i * w_ + t * kw + j]
                        k = i * kw + j if v == m else k
                u = up[at + t]
                for i in range(kh):
                    for j in range(kw):
                        share = u if k == i * kw + j else u * zero
                        dst[base + i * w_ + t * kw + j] = share + zero
        return grad

    def avg_forward(x, out, scale):
        """out = scale * the sum of each window, taps in row-major order."""
        n_, c_, h_, w_ = x.shape
        oh_, ow_ = out.shape[2], out.shape[3]
        src = x.reshape(x.size)
        dst = out.reshape(out.size)
        for p in range(n_ * c_):
            for r in range(oh_):
                at = U((p * oh_ + r) * ow_)
                base = U(p * h_ * w_ + r * kh * w_)
                for t in range(U(ow_)):
                    a = zero
                    for i in range(kh):
                        for j in range(kw):
                            a += src[base + U(i * w_ + j) + t * U(kw)]
                    dst[at + t] = a * scale
        return out

    def avg_backward(upstream, grad, scale):
        """grad = 0 + upstream * scale at every tap of its window."""
        n_, c_, h_, w_ = grad.shape
        oh_, ow_ = upstream.shape[2], upstream.shape[3]
        up = upstream.reshape(upstream.size)
        dst = grad.reshape(grad.size)
        for p in range(n_ * c_):
            _zero_uncovered(dst, p * h_ * w_, h_, w_, oh_ * kh, ow_ * kw, zero)
            for r in range(oh_):
                at = U((p * oh_ + r) * ow_)
                base = U(p * h_ * w_ + r * kh * w_)
                for t in range(U(ow_)):
                    share = up[at + t] * scale + zero
                    for i in range(kh):
                        for j in range(kw):
                            dst[base + U(i * w_ + j) + t * U(kw)] = share
        return grad

    bodies: dict[str, Callable[..., Any]] = {
        "max_forward": max_forward, "max_backward": max_backward,
        "max_forward_short": max_forward_short, "max_backward_short": max_backward_short,
        "avg_forward": avg_forward, "avg_backward": avg_backward}
    for body in bodies.values():
        # A name per size and dtype: Numba names a compiled function (and the
        # environment holding its constants) after its qualified name, so closures of
        # one name loaded together from the disk cache could read each other's, and a
        # returned array then fails to box ("'descr' is NULL").
        body.__qualname__ = (f"{body.__name__}_{kh}x{kw}_{np.asarray(zero).dtype.name}"
                             + (f"_w{width}" if width else ""))
    return bodies


def _zero_uncovered(dst, plane, h_, w_, covered_h, covered_w, zero):
    # Zero the rows and columns of a plane past the last tiling window.
    for h in range(h_):
        first = 0 if h >= covered_h else covered_w
        for t in range(U(first), U(w_)):
            dst[U(plane + h * w_) + t] = zero


_TILE_KINDS = {
    "max_forward": ("in4", "out4", "value"),
    "max_backward": ("in4", "in4", "in4", "out4"),
    "max_forward_short": ("in4", "out4", "value"),
    "max_backward_short": ("in4", "in4", "in4", "out4"),
    "avg_forward": ("in4", "out4", "value"),
    "avg_backward": ("in4", "out4", "value"),
}


# ---------------------------------------------------------------- compiling


# Argument kinds: "in4" a read-only 4-D array, "out4"/"out3" writable arrays, "geo" the
# geometry, "value" a scalar of the kernel's dtype.
_KINDS: dict[Callable, tuple[str, ...]] = {
    unfold_body: ("in4", "out3", "geo", "value", "int", "int"),
    fold_body: ("in3", "out4", "geo"),
    max_pool_body: ("in4", "out4", "geo", "value", "int", "int"),
    max_pool_backward_body: ("in4", "in4", "in4", "out4", "geo", "value"),
    max_pool_backward_inner_body: ("in3", "in3", "in3", "out3", "geo", "value"),
    avg_pool_body: ("in4", "out4", "geo", "value"),
    avg_pool_global_body: ("in4", "out4", "value"),
    avg_pool_global_backward_body: ("in4", "out4", "value"),
    avg_pool_backward_body: ("in4", "out4", "geo", "value"),
    transpose_body: ("in2", "out2"),
    transposed_equal_body: ("in2", "in2"),
}
_registered = False


def _signature(dtype: np.dtype, kinds: Sequence[str]) -> tuple:
    nb = jit.numba()
    types = []
    for kind in kinds:
        if kind == "geo":
            types.append(jit.array_type(np.dtype(np.int64), 1, "C", readonly=True))
        elif kind == "value":
            types.append(nb.from_dtype(dtype))
        elif kind == "int":
            types.append(nb.int64)
        else:
            types.append(jit.array_type(dtype, int(kind[-1]), "C", readonly=kind[:2] == "in"))
    return tuple(types)


def _register_helpers(nb: Any) -> None:
    global _registered
    if not _registered:  # the helpers the bodies call, callable from Numba
        for helper in (_spans, _running_max, _pad_match, _spread_nan, _zero_uncovered):
            nb.extending.register_jitable(error_model="numpy")(helper)
        _registered = True


def _make(body: Callable, dtype: np.dtype) -> tuple[Callable, tuple]:
    _register_helpers(jit.numba())
    signature = _signature(dtype, _KINDS[body])
    if body is transpose_body:  # its blocks: the dtype's SIMD vectors, in LLVM IR
        lanes = 32 // dtype.itemsize
        body = jit.rebound(body, dict(body.__globals__, BLOCK=lanes,
                                      transpose_block=_transpose_intrinsic(lanes)))
    return body, signature


def _make_tile(kind: str, kh: int, kw: int, dtype: np.dtype, width: int
               ) -> tuple[Callable, tuple]:
    _register_helpers(jit.numba())
    return (tile_bodies(kh, kw, dtype.type(0), width)[kind],
            _signature(dtype, _TILE_KINDS[kind]))


def compiled(body: Callable, dtype: np.dtype) -> Any:
    """`body` compiled for `dtype` (one explicit signature; inputs may be read-only),
    cached on disk by Numba; compiled once per process."""
    return jit.compiled_once((body, dtype), _make, body, dtype)


def unfold_parts(x, out, g, pad_value, parts):
    """unfold_body of every window row (channel and kernel offset), cut into `parts`
    parts run at once on Numba's threads: each row's windows are its own, whichever
    thread writes them (a stem's 3 channels of 7 x 7 offsets split evenly so)."""
    k_ = x.shape[1] * g[0] * g[1]
    for t in prange(parts):
        serial(x, out, g, pad_value, k_ * t // parts, k_ * (t + 1) // parts)


def max_pool_parts(x, out, g, lowest, parts):
    """max_pool_body of every channel, cut into `parts` parts run at once on Numba's
    threads."""
    c_ = x.shape[1]
    for t in prange(parts):
        pool_serial(x, out, g, lowest, c_ * t // parts, c_ * (t + 1) // parts)


# In plain Python a parts driver runs its body's parts in turn; compiled, prange is
# numba.prange and `serial` / `pool_serial` the bodies' compiled kernels.
prange, serial, pool_serial = range, unfold_body, max_pool_body


_PARTS = {unfold_parts: (unfold_body, "serial"),
          max_pool_parts: (max_pool_body, "pool_serial")}


def _make_parts(driver: Callable, dtype: np.dtype) -> tuple[Callable, tuple]:
    nb = jit.numba()
    body, name = _PARTS[driver]
    bound = jit.rebound(driver, dict(driver.__globals__, prange=nb.prange,
                                     **{name: compiled(body, dtype)}))
    bound.__qualname__ = f"{driver.__name__}_{dtype.name}"
    return bound, (*_signature(dtype, _KINDS[body])[:-2], nb.int64)


def _compiled_parts(driver: Callable, dtype: np.dtype) -> Any:
    """A parts driver (unfold_parts, max_pool_parts) for dtype, a parallel loop."""
    return jit.compiled_once((driver, dtype), _make_parts, driver, dtype, parallel=True)


def compiled_tile(kind: str, kh: int, kw: int, dtype: np.dtype, width: int = 0) -> Any:
    """The tile pooling body `kind` for a kh x kw window, compiled for dtype (and for
    output rows `width` windows wide, where not 0)."""
    return jit.compiled_once(("conv tile", kind, kh, kw, dtype, width), _make_tile, kind, kh,
                             kw, dtype, width)


def check_dtype(op: str, arrays: Sequence[np.ndarray]) -> np.dtype:
    """The one supported float dtype of arrays, or a KernelError naming op."""
    dtype = arrays[0].dtype
    if any(a.dtype != dtype for a in arrays):
        names = " and ".join(sorted({a.dtype.name for a in arrays}))
        raise KernelError(op, list(arrays), f"mixed dtypes {names}; {_SUPPORTED}")
    if dtype not in SUPPORTED_DTYPES:
        raise KernelError(op, list(arrays), f"unsupported dtype {dtype.name}; {_SUPPORTED}")
    return dtype


# ---------------------------------------------------------------- entry points
# Callers (pullback.backend.conv) validate shapes and geometry; these only run loops.


def _blocks(buffer: np.ndarray, geo: np.ndarray) -> np.ndarray:
    # A C-contiguous window buffer as (blocks, OH, OW), without a copy.
    return buffer.reshape(-1, int(geo[8]), int(geo[9]))


def unfold(x: np.ndarray, buffer: np.ndarray, geo: np.ndarray, pad_value: Any,
           threads: int = 0) -> np.ndarray:
    """Write the windows of x (N, C, H, W) into `buffer` (C-contiguous, at the block
    strides `geo` names), padding reading as pad_value, its window rows (channel and
    kernel offset) over `threads` of Numba's threads where more than one; returns
    buffer."""
    dtype = check_dtype("unfold2d", [x, buffer])
    if not buffer.flags.c_contiguous:
        raise KernelError("unfold2d", [buffer], "the window buffer must be C-contiguous")
    args = (np.ascontiguousarray(x), _blocks(buffer, geo), geo, dtype.type(pad_value))
    rows = x.shape[1] * int(geo[0]) * int(geo[1])
    parts = min(threads, rows)
    if parts > 1:
        _compiled_parts(unfold_parts, dtype)(*args, parts)
    else:
        compiled(unfold_body, dtype)(*args, 0, rows)
    return buffer


def fold(buffer: np.ndarray, out: np.ndarray, geo: np.ndarray) -> np.ndarray:
    """Sum the windows in `buffer` (C-contiguous, at the block strides `geo` names)
    into `out` (N, C, H, W), overwriting it; returns out."""
    dtype = check_dtype("fold2d", [buffer, out])
    compiled(fold_body, dtype)(_blocks(np.ascontiguousarray(buffer), geo), out, geo)
    return out


def transpose(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Write the (A, B) matrix src transposed into the C-contiguous (B, A) dst;
    returns dst."""
    dtype = check_dtype("transpose", [src, dst])
    compiled(transpose_body, dtype)(np.ascontiguousarray(src), dst)
    return dst


_BITS: dict[np.dtype[Any], np.dtype[Any]] = {np.dtype(np.float32): np.dtype(np.uint32),
                                            np.dtype(np.float64): np.dtype(np.uint64)}


def transposed_equal(src: np.ndarray, dst: np.ndarray) -> bool:
    """Whether the C-contiguous (B, A) dst is the (A, B) matrix src transposed, bit for
    bit (compared as the floats' bits: 0.0 is not -0.0, a NaN equals the same NaN)."""
    bits = _BITS[check_dtype("transpose", [src, dst])]
    return bool(compiled(transposed_equal_body, bits)(
        np.ascontiguousarray(src).view(bits), dst.view(bits)))


def _tiles(geo: np.ndarray) -> bool:
    """Whether the windows tile the input with a size that has its own kernels."""
    kh, kw, sh, sw, ph, pw, dh, dw = (int(v) for v in geo[:8])
    return (sh == kh and sw == kw and ph == pw == 0 and dh == dw == 1
            and kh in TILE_SIZES and kw in TILE_SIZES)


def _covered(x: np.ndarray, y: np.ndarray, geo: np.ndarray) -> bool:
    """Whether the windows of y (N, C, OH, OW) cover x's planes exactly (no rows or
    columns past the last window)."""
    return x.shape[2] == y.shape[2] * int(geo[0]) and x.shape[3] == y.shape[3] * int(geo[1])


def _one_plane(arrays: Sequence[np.ndarray], geo: np.ndarray) -> list[np.ndarray]:
    """C-contiguous (N, C, H, W) arrays of tiling windows that cover their planes
    exactly, as one (1, 1, N C H, W) plane: the same windows, and the same arithmetic,
    without a kernel's per-plane work, which dominates on small maps (MaxPool2d(2) of
    32x32x8x8: backward 264 -> 188 us, of 32x64x4x4 forward 25 -> 16 us)."""
    if not _covered(arrays[0], arrays[1], geo):
        return list(arrays)
    return [a.reshape(1, 1, a.shape[0] * a.shape[1] * a.shape[2], a.shape[3])
            for a in arrays]


def max_pool(x: np.ndarray, out: np.ndarray, geo: np.ndarray, threads: int = 0
             ) -> np.ndarray:
    """out (N, C, OH, OW) = the maximum of each window of x; returns out. With `threads`,
    windows that are not tiles (a stride other than the kernel) run their channels on
    as many of Numba's threads."""
    dtype = check_dtype("max_pool2d", [x, out])
    x = np.ascontiguousarray(x)
    lowest = dtype.type(-np.inf)
    if _tiles(geo):
        short = out.shape[3] <= SHORT_ROWS and _covered(x, out, geo)
        compiled_tile("max_forward_short" if short else "max_forward", int(geo[0]),
                      int(geo[1]), dtype, out.shape[3] if short else 0)(
            *_one_plane([x, out], geo), lowest)
        return out
    parts = min(threads, x.shape[1])
    if parts > 1:
        _compiled_parts(max_pool_parts, dtype)(x, out, geo, lowest, parts)
        return out
    return compiled(max_pool_body, dtype)(x, out, geo, lowest, 0, x.shape[1])


def max_pool_backward(upstream: np.ndarray, x: np.ndarray, y: np.ndarray, grad: np.ndarray,
                      geo: np.ndarray) -> np.ndarray:
    """grad (N, C, H, W) = upstream routed to each window's first maximum; returns grad."""
    dtype = check_dtype("max_pool2d_backward", [upstream, x, y, grad])
    args = (np.ascontiguousarray(upstream), np.ascontiguousarray(x), np.ascontiguousarray(y),
            grad)
    tiles = _tiles(geo)
    if tiles and _covered(x, y, geo):
        short = y.shape[3] <= SHORT_ROWS
        x1, y1, up1, grad1 = _one_plane([args[1], args[2], args[0], grad], geo)
        compiled_tile("max_backward_short" if short else "max_backward", int(geo[0]),
                      int(geo[1]), dtype, y.shape[3] if short else 0)(up1, x1, y1, grad1)
        return grad
    if (x.shape[0] * x.shape[1] >= INNER_PLANES and grad.flags.c_contiguous
            and y.shape[3] < (INNER_TILING_BELOW if tiles else INNER_BELOW)):
        return _max_backward_inner(*args, geo, dtype)
    if tiles:  # rows or columns past the last window: plane by plane
        compiled_tile("max_backward", int(geo[0]), int(geo[1]), dtype)(*args)
        return grad
    return compiled(max_pool_backward_body, dtype)(*args, geo, dtype.type(-np.inf))


# Tiling windows that cover their input exactly run as one plane of rows (`_one_plane`);
# rows of at most this many windows through kernels compiled for their width, whose
# loops over a row unroll (the "_short" tile bodies): MaxPool2d(2) of 32x64x4x4 (rows
# of 2) took 4.7 us forward and 9.8 backward so, against 12.5 and 47.5 with the rows'
# loops of the tile kernels. Those won from rows of 4 (32x32x8x8: 16.4 and 30.7 us,
# against 24.6 and 50.2), and tied at 3 (one thread, hot, interleaved).
SHORT_ROWS = 3
# Other windows' gradients are routed with the planes innermost
# (max_pool_backward_inner_body) where their output rows are shorter than this many
# windows and they have at least INNER_PLANES planes: per plane, rows of a few windows
# cost more in loop setup than in work; the transposes in and out cost most of the rest.
# 3x3, stride-2 windows (padding 1) measured 21.2 -> 8.3 ms on 64x32x32x32, 15.4 -> 6.0
# on 8x64x56x56, 1.09 -> 0.62 on 1x64x64x64 (32 wide), and 4.6 against 6.7 on
# 2x64x112x112 (56 wide).
INNER_BELOW = 33
# ... and tiling windows (MaxPool2d(k)) with rows or columns past their last window
# below this many: the tile kernel, plane by plane, vectorizes from 8 windows
# (32x32x16x16: 109 us against 394 planes innermost), and under it took 173 against 103
# us on 32x32x8x8, 230 against 96 on 128x32x4x4 (measured whole, as one plane now runs).
INNER_TILING_BELOW = 8
INNER_PLANES = 8


def _max_backward_inner(upstream: np.ndarray, x: np.ndarray, y: np.ndarray,
                        grad: np.ndarray, geo: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """max_pool_backward through max_pool_backward_inner_body: x, y and upstream
    transposed to (pixels, planes), the gradient transposed back into grad."""
    n, c, h, w = x.shape
    oh, ow = y.shape[2], y.shape[3]
    planes = n * c

    def planes_inner(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
        return transpose(a.reshape(planes, rows * cols),
                         np.empty((rows * cols, planes), dtype)).reshape(rows, cols, planes)

    inner_grad = np.empty((h, w, planes), dtype)
    compiled(max_pool_backward_inner_body, dtype)(
        planes_inner(upstream, oh, ow), planes_inner(x, h, w), planes_inner(y, oh, ow),
        inner_grad, geo, dtype.type(-np.inf))
    transpose(inner_grad.reshape(h * w, planes), grad.reshape(planes, h * w))
    return grad


def avg_pool(x: np.ndarray, out: np.ndarray, geo: np.ndarray) -> np.ndarray:
    """out (N, C, OH, OW) = the mean of each window of x, padding counted; returns out."""
    dtype = check_dtype("avg_pool2d", [x, out])
    x = np.ascontiguousarray(x)
    scale = dtype.type(1.0 / (geo[0] * geo[1]))
    if _tiles(geo):
        return compiled_tile("avg_forward", int(geo[0]), int(geo[1]), dtype)(x, out, scale)
    if _global(x, geo):
        # ResNet-50's 2048 planes of 7x7: 0.44 ms in the general body, whose loops run
        # over one output position per plane.
        return compiled(avg_pool_global_body, dtype)(x, out, scale)
    return compiled(avg_pool_body, dtype)(x, out, geo, scale)


def _global(x: np.ndarray, geo: np.ndarray) -> bool:
    """Whether one unpadded, undilated window covers each whole plane of x."""
    kh, kw, _, _, ph, pw, dh, dw, oh, ow = (int(v) for v in geo[:10])
    return ((kh, kw) == x.shape[2:] and ph == pw == 0 and dh == dw == 1
            and oh == ow == 1 and x.size > 0)


def avg_pool_backward(upstream: np.ndarray, grad: np.ndarray, geo: np.ndarray) -> np.ndarray:
    """grad (N, C, H, W) = upstream / (kh kw) spread over each window; returns grad."""
    dtype = check_dtype("avg_pool2d_backward", [upstream, grad])
    upstream = np.ascontiguousarray(upstream)
    scale = dtype.type(1.0 / (geo[0] * geo[1]))
    if _tiles(geo):
        return compiled_tile("avg_backward", int(geo[0]), int(geo[1]), dtype)(upstream, grad,
                                                                               scale)
    if _global(grad, geo):
        return compiled(avg_pool_global_backward_body, dtype)(upstream, grad, scale)
    return compiled(avg_pool_backward_body, dtype)(upstream, grad, geo, scale)
