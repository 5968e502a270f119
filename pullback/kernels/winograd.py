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


# From this many tiles a row, input_transform_body reads the input a row at a time;
# narrower maps gather each tile entry through a table (a row of 2-4 tiles costs more in
# loop setup than in work). Measured per chunk, float32: 32x32 maps 0.54 ns an entry by
# rows against 0.74 gathered; 8x8 and 16x16 0.75 gathered against 1.26 and 0.80.
ROWS_FROM_TILES = 8


def input_transform_body(x, v, ph, pw, tiles_h, tiles_w, stride):
    """v[a stride + c P + (n tiles_h + ty) tiles_w + tx] = (B^T d B)[a] for the 6x6
    tile d of x (m, C, H, W) at rows 4 ty - ph.., columns 4 tx - pw.., zero outside x,
    where P = m tiles_h tiles_w: v holds 36 (C, P) matrices `stride` apart.

    A channel at a time, in three passes whose inner loops run over all the chunk's
    tiles but the first's: the 36 entries (i, j) of every tile into contiguous runs,
    e[(6 i + j) P + tile]; then d B (rows), then B^T t (columns), each transform
    position a contiguous run. Tiles overlap by two rows and two columns, so the first
    pass reads each input about 2.25 times. On maps of at least ROWS_FROM_TILES tiles a
    row it takes each input row once (rows 4 and 5 of a tile are rows 0 and 1 of the
    next: copied after), through a zero-padded line; on narrower ones it copies the
    chunk's planes of the channel side by side (samples lie C planes apart: at 8x8 and
    64 channels, 16 KiB, and planes that far apart share cache sets) followed by a zero,
    and gathers every entry through one table of where it lies there."""
    m_, c_, h_, w_ = x.shape
    tiles = tiles_h * tiles_w
    p_ = U(m_ * tiles)
    src = x.reshape(x.size)
    dst = v
    e = np.empty(36 * p_, dtype=x.dtype)  # entry (i, j) of every tile
    t = np.empty(36 * p_, dtype=x.dtype)  # d B as (row i, position b, tile)
    position = U(stride)
    tw = U(tiles_w)
    line = np.zeros(4 * (tw + U(1)), dtype=x.dtype)
    zero = line[0]
    lo, hi = U(min(pw, line.size)), U(min(pw + w_, line.size))  # the line's part in x
    by_rows = tiles_w >= ROWS_FROM_TILES
    plane = U(h_ * w_)
    planes = np.zeros(1 if by_rows else m_ * h_ * w_ + 1, dtype=x.dtype)
    where = np.empty(0 if by_rows else 36 * p_, dtype=np.int64)
    if not by_rows:
        for i in range(6):
            for j in range(6):
                for n in range(m_):
                    for ty in range(tiles_h):
                        r, at = ty * 4 - ph + i, (i * 6 + j) * p_ + n * tiles + ty * tiles_w
                        for tx in range(tiles_w):
                            col = tx * 4 - pw + j
                            inside = 0 <= r < h_ and 0 <= col < w_
                            where[at + tx] = n * plane + r * w_ + col if inside else planes.size - 1
    for c in range(c_):
        if by_rows:
            for n in range(m_):
                first = U(n * tiles)
                for rp in range(4 * tiles_h + 2):  # padded rows; the last two: rows 4, 5
                    ty, i = rp >> 2, rp & 3  # of the last tiles
                    if rp >= 4 * tiles_h:
                        ty, i = tiles_h - 1, i + 4
                    at = U(i * 6) * p_ + first + U(ty) * tw
                    r = rp - ph
                    if r < 0 or r >= h_:
                        for j in range(6):
                            for tx in range(tw):
                                e[at + U(j) * p_ + tx] = zero
                        continue
                    start = U((n * c_ + c) * h_ * w_) + U(r * w_) - lo
                    for k in range(lo, hi):
                        line[k] = src[start + k]
                    for tx in range(tw):
                        k = U(4) * tx
                        e[at + tx] = line[k]
                        e[at + p_ + tx] = line[k + U(1)]
                        e[at + U(2) * p_ + tx] = line[k + U(2)]
                        e[at + U(3) * p_ + tx] = line[k + U(3)]
                        e[at + U(4) * p_ + tx] = line[k + U(4)]
                        e[at + U(5) * p_ + tx] = line[k + U(5)]
                run = U((tiles_h - 1) * tiles_w)  # rows 4, 5 of the tiles above the last
                for i in range(2):
                    for j in range(6):
                        to = U((4 + i) * 6 + j) * p_ + first
                        at = U(i * 6 + j) * p_ + first + tw
                        for k in range(run):
                            e[to + k] = e[at + k]
        else:
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


def output_transform_body(products, out, tiles_h, tiles_w, stride):
    """out[n, o, 4 ty + i, 4 tx + j] = (A^T M A)[i, j] for the 36 products M of tile
    (n, ty, tx) and output channel o, read as input_transform_body writes them (36
    (O, P) matrices `stride` apart in products); the positions of edge tiles past
    out's (m, O, OH, OW) are dropped.

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
    for o in range(o_):
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
    36 (O, P) matrices `stride` apart, as input_transform_body lays out its own. It is
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
    input_transform_body: ("in4", "out1", "int", "int", "int", "int", "int"),
    output_transform_body: ("in1", "out4", "int", "int", "int"),
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


# ---------------------------------------------------------------- entry points
# The caller (pullback.backend.winograd) validates shapes; these only run loops.


def input_transform(x: np.ndarray, v: np.ndarray, padding: tuple[int, int],
                    tiles: tuple[int, int], stride: int) -> np.ndarray:
    """Write the transformed 6x6 tiles of x (m, C, H, W), padded by `padding`, into the
    flat v as 36 (C, m tiles_h tiles_w) matrices `stride` elements apart; returns v."""
    dtype = check_dtype("conv2d", [x, v])
    compiled(input_transform_body, dtype)(np.ascontiguousarray(x), v, padding[0], padding[1],
                                          tiles[0], tiles[1], stride)
    return v


def output_transform(products: np.ndarray, out: np.ndarray, tiles: tuple[int, int],
                     stride: int) -> np.ndarray:
    """Write the 4x4 output tiles of the flat products, 36 (O, m tiles_h tiles_w)
    matrices `stride` elements apart, into out (m, O, OH, OW), C-contiguous; returns
    out."""
    dtype = check_dtype("conv2d", [products, out])
    compiled(output_transform_body, dtype)(products, out, tiles[0], tiles[1], stride)
    return out


def upstream_transform(up: np.ndarray, u: np.ndarray, tiles: tuple[int, int],
                       stride: int) -> np.ndarray:
    """Write A dY A^T of the 4x4 tiles of up (m, O, OH, OW) into the flat u as 36
    (O, m tiles_h tiles_w) matrices `stride` elements apart; returns u."""
    dtype = check_dtype("conv2d_weight_backward", [up, u])
    compiled(upstream_transform_body, dtype)(np.ascontiguousarray(up), u, tiles[0], tiles[1],
                                             stride)
    return u
