"""Winograd F(4x4, 3x3) tile transforms, compiled with Numba per dtype (float32,
float64): the input transform B^T d B of a convolution's overlapping 6x6 input tiles,
the output transform A^T m A back to 4x4 output tiles (Lavin and Gray, 2015), and its
adjoint A dY A^T of 4x4 upstream tiles, for the weight gradient.
The weight transform G g G^T is one small product done in NumPy by the caller
(pullback.backend.winograd).

Each tile's transform is written out as sums and small multiples (most entries of
B^T and A^T are 0 or +-1): the input's rows, then its columns; the products' columns,
then their rows. Arrays are addressed as flat
memory at unsigned offsets, as in pullback.kernels.conv, so LLVM keeps the loops
free of wraparound checks.

One file on purpose: Numba's disk cache notices an edit to a kernel's own file only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pullback.kernels import jit
from pullback.kernels.conv import check_dtype

U = np.uint64
TILE = 4  # output tile side: F(4x4, 3x3)
ALPHA = TILE + 2  # input tile side, 6
POSITIONS = ALPHA * ALPHA  # 36 products per tile

# B^T, G and A^T of F(4x4, 3x3), the points 0, +-1, +-2 and infinity. The kernel bodies
# spell out B^T and A^T (tests/backend/test_backend_winograd.py checks them against
# these); G is the caller's weight transform.
BT = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
               [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64)
G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
              [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64)
AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
               [0, 1, -1, 8, -8, 1]], np.float64)


# From this many tiles a row, the input transform takes a plane at a time by rows
# (input_rows_body); narrower maps gather every tile entry of the chunk through one table
# (input_table_body): on short rows the rows' loops cost more in setup than in work.
# Measured per transformed entry, float32, one thread, the two taking turns chunk by
# chunk (bench/RESULTS.md), rows against table: 32x32 maps (8 tiles a row) 0.48-0.61 ns
# against 0.70-0.84, 56x56 0.56-0.68 against 0.83-1.01, 28x28 (7) 0.75 against
# 0.76-0.78; 20x20 (5) 0.81-0.87 against 0.73-0.80, 14x14 (4) 0.79-0.98 against
# 0.72-0.88, 8x8 1.41-1.43 against 0.68-0.70.
ROWS_FROM_TILES = 7


def input_rows_body(x, v, ph, pw, tiles_h, tiles_w, stride, c0, c1):
    """v[a stride + c P + (n tiles_h + ty) tiles_w + tx] = (B^T d B)[a] for the 6x6
    tile d of x (m, C, H, W) at rows 4 ty - ph.., columns 4 tx - pw.., zero outside x,
    where P = m tiles_h tiles_w: v holds 36 (C, P) matrices `stride` apart. For maps of
    at least ROWS_FROM_TILES tiles a row; input_table_body is the same for any width.

    A plane (one channel of one sample) at a time, through arrays that stay in cache (a
    56x56 plane's take 35 KiB), in three passes:
    1. the plane's rows into q, zero-padded and split into their four column phases:
       column 4 j + p of padded row r at q[p span + r (tiles_w + 1) + j]. A tile's
       columns 0-3 are then four runs, and its columns 4, 5 the runs of phases 0 and 1
       one tile on. Entries outside x are never written: they stay zero for every plane.
    2. d B of every padded row, one flat loop over all rows' tiles (the one column past
       each row's last tile is computed and never read): a loop per row would run a
       handful of tiles, and its setup would cost more than its work;
    3. B^T t per tile row, each of the 36 positions written as a run of its tiles.
    Each padded row is transformed once, where taking tiles row by row (tiles overlap
    by two rows) would transform rows 4 and 5 twice."""
    m_, c_, h_, w_ = x.shape
    tiles = tiles_h * tiles_w
    p_ = U(m_ * tiles)
    src = x.reshape(x.size)
    dst = v
    position = U(stride)
    tw = U(tiles_w)
    tw1 = tw + U(1)  # a padded row's entries per phase: the last tile's columns 4, 5 too
    span = U(4 * tiles_h + 2) * tw1  # a phase of the padded plane, a position of t
    q = np.zeros(4 * span + U(1), dtype=x.dtype)  # + 1: the flat loop reads one past
    t = np.empty(6 * span, dtype=x.dtype)  # d B as (position b, padded row, tile)
    r_lo, r_hi = ph, min(ph + h_, 4 * tiles_h + 2)  # padded rows and columns inside x
    c_lo, c_hi = pw, min(pw + w_, 4 * (tiles_w + 1))
    for c in range(c0, c1):
        for n in range(m_):
            plane = U((n * c_ + c) * h_ * w_)
            for r in range(r_lo, r_hi):
                start = plane + U((r - ph) * w_) - U(pw)
                row = U(r) * tw1
                for k in range(c_lo, c_hi):
                    q[U(k & 3) * span + row + U(k >> 2)] = src[start + U(k)]
            for k in range(span - U(1)):  # rows: d B
                d0, d1, d2, d3 = q[k], q[span + k], q[U(2) * span + k], q[U(3) * span + k]
                d4, d5 = q[k + U(1)], q[span + k + U(1)]
                t[k] = 4.0 * d0 - 5.0 * d2 + d4
                t[span + k] = d3 + d4 - 4.0 * (d1 + d2)
                t[U(2) * span + k] = d4 - d3 + 4.0 * (d1 - d2)
                t[U(3) * span + k] = d4 - d2 + 2.0 * (d3 - d1)
                t[U(4) * span + k] = d4 - d2 + 2.0 * (d1 - d3)
                t[U(5) * span + k] = 4.0 * d1 - 5.0 * d3 + d5
            first = U(c) * p_ + U(n * tiles)
            for ty in range(tiles_h):  # columns: B^T t, each position to its own matrix
                top = U(4 * ty) * tw1
                to = first + U(ty) * tw
                for b in range(6):
                    at = top + U(b) * span
                    o0 = to + U(b) * position
                    for tx in range(tw):
                        d0, d1, d2 = t[at + tx], t[at + tw1 + tx], t[at + U(2) * tw1 + tx]
                        d3, d4 = t[at + U(3) * tw1 + tx], t[at + U(4) * tw1 + tx]
                        d5 = t[at + U(5) * tw1 + tx]
                        dst[o0 + tx] = 4.0 * d0 - 5.0 * d2 + d4
                        dst[o0 + U(6) * position + tx] = d3 + d4 - 4.0 * (d1 + d2)
                        dst[o0 + U(12) * position + tx] = d4 - d3 + 4.0 * (d1 - d2)
                        dst[o0 + U(18) * position + tx] = d4 - d2 + 2.0 * (d3 - d1)
                        dst[o0 + U(24) * position + tx] = d4 - d2 + 2.0 * (d1 - d3)
                        dst[o0 + U(30) * position + tx] = 4.0 * d1 - 5.0 * d3 + d5
    return v


def input_table_body(x, v, ph, pw, tiles_h, tiles_w, stride, c0, c1):
    """The input transform of input_rows_body, for any width (the one for narrow maps).

    A channel at a time, in three passes whose inner loops run over all the chunk's
    tiles: the 36 entries (i, j) of every tile into contiguous runs, e[(6 i + j) P +
    tile], gathered through one table of where each lies; then d B (rows), then B^T t
    (columns), each transform position a contiguous run. The table indexes a copy of
    the chunk's planes of the channel side by side (samples lie C planes apart: at 8x8
    and 64 channels, 16 KiB, and planes that far apart share cache sets) followed by a
    zero, which every entry outside x reads."""
    m_, c_, h_, w_ = x.shape
    tiles = tiles_h * tiles_w
    p_ = U(m_ * tiles)
    src = x.reshape(x.size)
    dst = v
    e = np.empty(36 * p_, dtype=x.dtype)  # entry (i, j) of every tile
    t = np.empty(36 * p_, dtype=x.dtype)  # d B as (row i, position b, tile)
    position = U(stride)
    plane = U(h_ * w_)
    planes = np.zeros(m_ * h_ * w_ + 1, dtype=x.dtype)
    where = np.empty(36 * p_, dtype=np.int64)
    for i in range(6):
        for j in range(6):
            for n in range(m_):
                for ty in range(tiles_h):
                    r, at = ty * 4 - ph + i, (i * 6 + j) * p_ + n * tiles + ty * tiles_w
                    for tx in range(tiles_w):
                        col = tx * 4 - pw + j
                        inside = 0 <= r < h_ and 0 <= col < w_
                        where[at + tx] = n * plane + r * w_ + col if inside else planes.size - 1
    for c in range(c0, c1):
        for n in range(m_):
            at, to = U((n * c_ + c) * h_ * w_), U(n) * plane
            for k in range(plane):
                planes[to + k] = src[at + k]
        for k in range(36 * p_):
            e[k] = planes[where[k]]
        for i in range(6):  # rows: d B
            row = U(i * 6) * p_
            for k in range(p_):
                d0, d1, d2 = e[row + k], e[row + p_ + k], e[row + U(2) * p_ + k]
                d3, d4 = e[row + U(3) * p_ + k], e[row + U(4) * p_ + k]
                d5 = e[row + U(5) * p_ + k]
                t[row + k] = 4.0 * d0 - 5.0 * d2 + d4
                t[row + p_ + k] = d3 + d4 - 4.0 * (d1 + d2)
                t[row + U(2) * p_ + k] = d4 - d3 + 4.0 * (d1 - d2)
                t[row + U(3) * p_ + k] = d4 - d2 + 2.0 * (d3 - d1)
                t[row + U(4) * p_ + k] = d4 - d2 + 2.0 * (d1 - d3)
                t[row + U(5) * p_ + k] = 4.0 * d1 - 5.0 * d3 + d5
        at = U(c) * p_
        for j in range(6):  # columns: B^T t, each position to its own matrix
            o0, o1 = at + U(j) * position, at + U(6 + j) * position
            o2, o3 = at + U(12 + j) * position, at + U(18 + j) * position
            o4, o5 = at + U(24 + j) * position, at + U(30 + j) * position
            col = U(j) * p_
            for k in range(p_):
                d0, d1, d2 = t[col + k], t[U(6) * p_ + col + k], t[U(12) * p_ + col + k]
                d3, d4 = t[U(18) * p_ + col + k], t[U(24) * p_ + col + k]
                d5 = t[U(30) * p_ + col + k]
                dst[o0 + k] = 4.0 * d0 - 5.0 * d2 + d4
                dst[o1 + k] = d3 + d4 - 4.0 * (d1 + d2)
                dst[o2 + k] = d4 - d3 + 4.0 * (d1 - d2)
                dst[o3 + k] = d4 - d2 + 2.0 * (d3 - d1)
                dst[o4 + k] = d4 - d2 + 2.0 * (d1 - d3)
                dst[o5 + k] = 4.0 * d1 - 5.0 * d3 + d5
    return v


def output_transform_body(products, out, tiles_h, tiles_w, stride, c0, c1):
    """out[n, o, 4 ty + i, 4 tx + j] = (A^T M A)[i, j] for the 36 products M of tile
    (n, ty, tx) and output channel o, read as the input transform writes them (36
    (O, P) matrices `stride` apart in products), for output channels c0 to c1; the
    positions of edge tiles past out's (m, O, OH, OW) are dropped.

    An output channel at a time, the inner loops over all its tiles: A^T M from 6
    contiguous runs per column, then t A, each of the 16 outputs of a tile in its own
    contiguous run, then those runs interleaved into out's rows up to their width."""
    m_, o_, oh_, ow_ = out.shape
    tiles = tiles_h * tiles_w
    p_ = U(m_ * tiles)
    src = products
    dst = out.reshape(out.size)
    t = np.empty(24 * p_, dtype=out.dtype)  # A^T M as (row i, column b, tile)
    y = np.empty(16 * p_, dtype=out.dtype)  # output (i, j) of every tile
    position = U(stride)
    for o in range(c0, c1):
        at = U(o) * p_
        for j in range(6):  # columns: t = A^T M
            i0, i1 = at + U(j) * position, at + U(6 + j) * position
            i2, i3 = at + U(12 + j) * position, at + U(18 + j) * position
            i4, i5 = at + U(24 + j) * position, at + U(30 + j) * position
            col = U(j) * p_
            for k in range(p_):
                s0, s1, s2 = src[i0 + k], src[i1 + k], src[i2 + k]
                s3, s4, s5 = src[i3 + k], src[i4 + k], src[i5 + k]
                t[col + k] = s0 + (s1 + s2) + (s3 + s4)
                t[U(6) * p_ + col + k] = (s1 - s2) + 2.0 * (s3 - s4)
                t[U(12) * p_ + col + k] = (s1 + s2) + 4.0 * (s3 + s4)
                t[U(18) * p_ + col + k] = (s1 - s2) + 8.0 * (s3 - s4) + s5
        for i in range(4):  # rows: y = t A
            row = U(i * 6) * p_
            to = U(i * 4) * p_
            for k in range(p_):
                s0, s1, s2 = t[row + k], t[row + p_ + k], t[row + U(2) * p_ + k]
                s3, s4 = t[row + U(3) * p_ + k], t[row + U(4) * p_ + k]
                s5 = t[row + U(5) * p_ + k]
                y[to + k] = s0 + (s1 + s2) + (s3 + s4)
                y[to + p_ + k] = (s1 - s2) + 2.0 * (s3 - s4)
                y[to + U(2) * p_ + k] = (s1 + s2) + 4.0 * (s3 + s4)
                y[to + U(3) * p_ + k] = (s1 - s2) + 8.0 * (s3 - s4) + s5
        for n in range(m_):
            plane = U((n * o_ + o) * oh_ * ow_)
            for ty in range(tiles_h):
                first = U(n * tiles + ty * tiles_w)
                for i in range(min(4, oh_ - ty * 4)):
                    to = plane + U((ty * 4 + i) * ow_)
                    for k in range(U(ow_)):
                        dst[to + k] = y[(U(i * 4) + (k & U(3))) * p_ + first + (k >> U(2))]
    return out


def upstream_transform_body(up, u, tiles_h, tiles_w, stride):
    """u[a stride + o P + (n tiles_h + ty) tiles_w + tx] = (A dY A^T)[a] for the 4x4
    tile dY of up (m, O, OH, OW) at rows 4 ty.., columns 4 tx.., zero past up's edges:
    36 (O, P) matrices `stride` apart, as the input transform lays out its own. It is
    the adjoint of output_transform_body (A = (A^T)^T), which is what a weight
    gradient multiplies with the input's transformed tiles.

    An upstream channel at a time, the inner loops over all its tiles: the channel's
    rows deinterleaved into one contiguous run per tile position (i, j) (positions
    past the edges stay zero: they are the same for every channel), then A dY, then
    its columns times A^T, each of the 36 results a contiguous run."""
    m_, o_, oh_, ow_ = up.shape
    tiles = tiles_h * tiles_w
    p_ = U(m_ * tiles)
    src = up.reshape(up.size)
    dst = u
    y = np.zeros(16 * p_, dtype=up.dtype)  # dY (i, j) of every tile
    t = np.empty(24 * p_, dtype=up.dtype)  # A dY as (row a, column j, tile)
    position = U(stride)
    for o in range(o_):
        for n in range(m_):
            plane = U((n * o_ + o) * oh_ * ow_)
            for ty in range(tiles_h):
                first = U(n * tiles + ty * tiles_w)
                for i in range(min(4, oh_ - ty * 4)):
                    start = plane + U((ty * 4 + i) * ow_)
                    for k in range(U(ow_)):
                        y[(U(i * 4) + (k & U(3))) * p_ + first + (k >> U(2))] = src[start + k]
        for j in range(4):  # rows: t = A dY, column j of every tile
            col = U(j) * p_
            for k in range(p_):
                d0, d1 = y[col + k], y[U(4) * p_ + col + k]
                d2, d3 = y[U(8) * p_ + col + k], y[U(12) * p_ + col + k]
                t[col + k] = d0
                t[U(4) * p_ + col + k] = (d0 + d2) + (d1 + d3)
                t[U(8) * p_ + col + k] = (d0 + d2) - (d1 + d3)
                t[U(12) * p_ + col + k] = (d0 + 4.0 * d2) + 2.0 * (d1 + 4.0 * d3)
                t[U(16) * p_ + col + k] = (d0 + 4.0 * d2) - 2.0 * (d1 + 4.0 * d3)
                t[U(20) * p_ + col + k] = d3
        at = U(o) * p_
        for a in range(6):  # columns: t A^T, position 6 a + b to its own matrix
            row = U(a * 4) * p_
            o0 = at + U(a * 6) * position
            for k in range(p_):
                d0, d1 = t[row + k], t[row + p_ + k]
                d2, d3 = t[row + U(2) * p_ + k], t[row + U(3) * p_ + k]
                dst[o0 + k] = d0
                dst[o0 + position + k] = (d0 + d2) + (d1 + d3)
                dst[o0 + U(2) * position + k] = (d0 + d2) - (d1 + d3)
                dst[o0 + U(3) * position + k] = (d0 + 4.0 * d2) + 2.0 * (d1 + 4.0 * d3)
                dst[o0 + U(4) * position + k] = (d0 + 4.0 * d2) - 2.0 * (d1 + 4.0 * d3)
                dst[o0 + U(5) * position + k] = d3
    return u


# ---------------------------------------------------------------- compiling

# Argument kinds, as in pullback.kernels.conv: "in4" a read-only 4-D array, "out1" a
# writable 1-D one, "int" an int64.
_KINDS: dict[Callable, tuple[str, ...]] = {
    input_rows_body: ("in4", "out1", "int", "int", "int", "int", "int", "int", "int"),
    input_table_body: ("in4", "out1", "int", "int", "int", "int", "int", "int", "int"),
    output_transform_body: ("in1", "out4", "int", "int", "int", "int", "int"),
    upstream_transform_body: ("in4", "out1", "int", "int", "int"),
}
def _signature(dtype: np.dtype, kinds: tuple[str, ...]) -> tuple:
    nb = jit.numba()
    return tuple(nb.int64 if kind == "int" else
                 jit.array_type(dtype, int(kind[-1]), "C", readonly=kind[:2] == "in")
                 for kind in kinds)


def compiled(body: Callable, dtype: np.dtype) -> Any:
    """`body` compiled for `dtype`, its float literals in that dtype (a float64 literal
    would run a float32 kernel in float64), cached on disk; once per process."""
    return jit.compiled_once((body, dtype), _make, body, dtype)


def _make(body: Callable, dtype: np.dtype) -> tuple[Callable, tuple]:
    typed = jit.in_precision(body, dtype)
    # A name per dtype: Numba names a compiled function after its qualified name.
    typed.__qualname__ = f"{body.__name__}_{dtype.name}"
    return typed, _signature(dtype, _KINDS[body])


def input_parts(x, v, ph, pw, tiles_h, tiles_w, stride, parts):
    """An input transform (`input_serial`) of every channel, cut into `parts` parts run
    at once on Numba's threads: each channel's tiles are its own, whichever thread runs
    it."""
    c_ = x.shape[1]
    for t in prange(parts):
        input_serial(x, v, ph, pw, tiles_h, tiles_w, stride, c_ * t // parts,
                     c_ * (t + 1) // parts)


def output_parts(products, out, tiles_h, tiles_w, stride, parts):
    """output_transform_body (`output_serial`) of every output channel, in `parts`
    parts at once."""
    o_ = out.shape[1]
    for t in prange(parts):
        output_serial(products, out, tiles_h, tiles_w, stride, o_ * t // parts,
                      o_ * (t + 1) // parts)


# In plain Python a parts driver runs its body's parts in turn; compiled, prange is
# numba.prange and the serial names the bodies' compiled kernels.
prange, input_serial, output_serial = range, input_rows_body, output_transform_body


def parts_compiled(driver: Callable, body: Callable, dtype: np.dtype) -> Any:
    """`driver` (input_parts or output_parts) around `body` compiled for `dtype`, as a
    parallel loop; cached on disk, once per process."""
    return jit.compiled_once((driver, body, dtype), _make_parts, driver, body, dtype,
                             parallel=True)


def _make_parts(driver: Callable, body: Callable, dtype: np.dtype) -> tuple[Callable, tuple]:
    nb = jit.numba()
    name = "input_serial" if driver is input_parts else "output_serial"
    bound = jit.rebound(driver, dict(driver.__globals__, prange=nb.prange,
                                     **{name: compiled(body, dtype)}))
    bound.__qualname__ = f"{driver.__name__}_{body.__name__}_{dtype.name}"
    return bound, (*_signature(dtype, _KINDS[body])[:-2], nb.int64)


# ---------------------------------------------------------------- entry points
# The caller (pullback.backend.winograd) validates shapes; these only run loops.


def input_transform(x: np.ndarray, v: np.ndarray, padding: tuple[int, int],
                    tiles: tuple[int, int], stride: int, threads: int = 0) -> np.ndarray:
    """Write the transformed 6x6 tiles of x (m, C, H, W), padded by `padding`, into the
    flat v as 36 (C, m tiles_h tiles_w) matrices `stride` elements apart, the channels
    over `threads` of Numba's threads where more than one; returns v."""
    dtype = check_dtype("conv2d", [x, v])
    body = input_rows_body if tiles[1] >= ROWS_FROM_TILES else input_table_body
    args = (np.ascontiguousarray(x), v, padding[0], padding[1], tiles[0], tiles[1], stride)
    parts = min(threads, x.shape[1])
    if parts > 1:
        parts_compiled(input_parts, body, dtype)(*args, parts)
    else:
        compiled(body, dtype)(*args, 0, x.shape[1])
    return v


def output_transform(products: np.ndarray, out: np.ndarray, tiles: tuple[int, int],
                     stride: int, threads: int = 0) -> np.ndarray:
    """Write the 4x4 output tiles of the flat products, 36 (O, m tiles_h tiles_w)
    matrices `stride` elements apart, into out (m, O, OH, OW), C-contiguous, the
    channels over `threads` of Numba's threads where more than one; returns out."""
    dtype = check_dtype("conv2d", [products, out])
    args = (products, out, tiles[0], tiles[1], stride)
    parts = min(threads, out.shape[1])
    if parts > 1:
        parts_compiled(output_parts, output_transform_body, dtype)(*args, parts)
    else:
        compiled(output_transform_body, dtype)(*args, 0, out.shape[1])
    return out


def upstream_transform(up: np.ndarray, u: np.ndarray, tiles: tuple[int, int],
                       stride: int) -> np.ndarray:
    """Write A dY A^T of the 4x4 tiles of up (m, O, OH, OW) into the flat u as 36
    (O, m tiles_h tiles_w) matrices `stride` elements apart; returns u."""
    dtype = check_dtype("conv2d_weight_backward", [up, u])
    compiled(upstream_transform_body, dtype)(np.ascontiguousarray(up), u, tiles[0], tiles[1],
                                             stride)
    return u
