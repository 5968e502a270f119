"""Winograd F(4x4, 3x3) tile transforms, compiled with Numba per dtype (float32,
float64): the input transform B^T d B of a convolution's overlapping 6x6 input tiles
and the output transform A^T m A back to 4x4 output tiles (Lavin and Gray, 2015).
The weight transform G g G^T is one small product done in NumPy by the caller
(pullback.backend.winograd).

Each tile's transform is written out as sums and small multiples (most entries of
B^T and A^T are 0 or +-1), rows first, then columns. Arrays are addressed as flat
memory at unsigned offsets, as in pullback.kernels.conv, so LLVM keeps the loops
free of wraparound checks.

One file on purpose: Numba's disk cache notices an edit to a kernel's own file only.
"""

from __future__ import annotations

import threading
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
# spell out B^T and A^T; these are their reference (tests, benchmarks) and G the
# caller's weight transform.
BT = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
               [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64)
G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
              [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64)
AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
               [0, 1, -1, 8, -8, 1]], np.float64)


def input_transform_body(x, v, ph, pw, tiles_h, tiles_w, stride):
    """v[a stride + c P + (n tiles_h + ty) tiles_w + tx] = (B^T d B)[a] for the 6x6
    tile d of x (m, C, H, W) at rows 4 ty - ph.., columns 4 tx - pw.., zero outside x,
    where P = m tiles_h tiles_w: v holds 36 (C, P) matrices `stride` apart."""
    m_, c_, h_, w_ = x.shape
    p_ = m_ * tiles_h * tiles_w
    src = x.reshape(x.size)
    dst = v
    d = np.zeros(36, dtype=x.dtype)
    t = np.empty(36, dtype=x.dtype)
    zero = d[0]
    position = U(stride)  # between transform positions in v
    for n in range(m_):
        for c in range(c_):
            plane = (n * c_ + c) * h_ * w_
            for ty in range(tiles_h):
                r0 = ty * 4 - ph
                for tx in range(tiles_w):
                    c0 = tx * 4 - pw
                    if r0 >= 0 and r0 + 6 <= h_ and c0 >= 0 and c0 + 6 <= w_:
                        for i in range(6):
                            at = U(plane + (r0 + i) * w_ + c0)
                            for j in range(6):
                                d[i * 6 + j] = src[at + U(j)]
                    else:  # an edge tile: what lies outside x reads as zero
                        for i in range(6):
                            r = r0 + i
                            for j in range(6):
                                col = c0 + j
                                inside = r >= 0 and r < h_ and col >= 0 and col < w_
                                d[i * 6 + j] = src[U(plane + r * w_ + col)] if inside else zero
                    for i in range(6):  # rows: t = d B
                        d0, d1, d2 = d[i * 6], d[i * 6 + 1], d[i * 6 + 2]
                        d3, d4, d5 = d[i * 6 + 3], d[i * 6 + 4], d[i * 6 + 5]
                        t[i * 6] = 4.0 * d0 - 5.0 * d2 + d4
                        t[i * 6 + 1] = d3 + d4 - 4.0 * (d1 + d2)
                        t[i * 6 + 2] = d4 - d3 + 4.0 * (d1 - d2)
                        t[i * 6 + 3] = d4 - d2 + 2.0 * (d3 - d1)
                        t[i * 6 + 4] = d4 - d2 + 2.0 * (d1 - d3)
                        t[i * 6 + 5] = 4.0 * d1 - 5.0 * d3 + d5
                    at = U(c * p_ + (n * tiles_h + ty) * tiles_w + tx)
                    for j in range(6):  # columns: B^T t, each position to its own row of v
                        d0, d1, d2 = t[j], t[6 + j], t[12 + j]
                        d3, d4, d5 = t[18 + j], t[24 + j], t[30 + j]
                        dst[at + U(j) * position] = 4.0 * d0 - 5.0 * d2 + d4
                        dst[at + U(6 + j) * position] = d3 + d4 - 4.0 * (d1 + d2)
                        dst[at + U(12 + j) * position] = d4 - d3 + 4.0 * (d1 - d2)
                        dst[at + U(18 + j) * position] = d4 - d2 + 2.0 * (d3 - d1)
                        dst[at + U(24 + j) * position] = d4 - d2 + 2.0 * (d1 - d3)
                        dst[at + U(30 + j) * position] = 4.0 * d1 - 5.0 * d3 + d5
    return v


def output_transform_body(products, out, tiles_h, tiles_w, stride):
    """out[n, o, 4 ty + i, 4 tx + j] = (A^T M A)[i, j] for the 36 products M of tile
    (n, ty, tx) and output channel o, read as input_transform_body writes them (36
    (O, P) matrices `stride` apart in products); the positions of edge tiles past
    out's (m, O, OH, OW) are dropped."""
    m_, o_, oh_, ow_ = out.shape
    p_ = m_ * tiles_h * tiles_w
    src = products
    dst = out.reshape(out.size)
    t = np.empty(24, dtype=out.dtype)
    y = np.empty(16, dtype=out.dtype)
    position = U(stride)
    for n in range(m_):
        for o in range(o_):
            plane = (n * o_ + o) * oh_ * ow_
            for ty in range(tiles_h):
                for tx in range(tiles_w):
                    at = U(o * p_ + (n * tiles_h + ty) * tiles_w + tx)
                    for j in range(6):  # columns: t = A^T M
                        s0, s1 = src[at + U(j) * position], src[at + U(6 + j) * position]
                        s2, s3 = src[at + U(12 + j) * position], src[at + U(18 + j) * position]
                        s4, s5 = src[at + U(24 + j) * position], src[at + U(30 + j) * position]
                        t[j] = s0 + (s1 + s2) + (s3 + s4)
                        t[6 + j] = (s1 - s2) + 2.0 * (s3 - s4)
                        t[12 + j] = (s1 + s2) + 4.0 * (s3 + s4)
                        t[18 + j] = (s1 - s2) + 8.0 * (s3 - s4) + s5
                    for i in range(4):  # rows: y = t A
                        s0, s1, s2 = t[i * 6], t[i * 6 + 1], t[i * 6 + 2]
                        s3, s4, s5 = t[i * 6 + 3], t[i * 6 + 4], t[i * 6 + 5]
                        y[i * 4] = s0 + (s1 + s2) + (s3 + s4)
                        y[i * 4 + 1] = (s1 - s2) + 2.0 * (s3 - s4)
                        y[i * 4 + 2] = (s1 + s2) + 4.0 * (s3 + s4)
                        y[i * 4 + 3] = (s1 - s2) + 8.0 * (s3 - s4) + s5
                    rows = min(4, oh_ - ty * 4)
                    cols = min(4, ow_ - tx * 4)
                    for i in range(rows):
                        to = U(plane + (ty * 4 + i) * ow_ + tx * 4)
                        for j in range(cols):
                            dst[to + U(j)] = y[i * 4 + j]
    return out


# ---------------------------------------------------------------- compiling

# Argument kinds, as in pullback.kernels.conv: "in4" a read-only 4-D array, "out1" a
# writable 1-D one, "int" an int64.
_KINDS: dict[Callable, tuple[str, ...]] = {
    input_transform_body: ("in4", "out1", "int", "int", "int", "int", "int"),
    output_transform_body: ("in1", "out4", "int", "int", "int"),
}
_lock = threading.Lock()
_compiled: dict[tuple, Any] = {}


def _signature(dtype: np.dtype, kinds: tuple[str, ...]) -> tuple:
    nb = jit.numba()
    return tuple(nb.int64 if kind == "int" else
                 jit.array_type(dtype, int(kind[-1]), "C", readonly=kind[:2] == "in")
                 for kind in kinds)


def compiled(body: Callable, dtype: np.dtype) -> Any:
    """`body` compiled for `dtype`, its float literals in that dtype (a float64 literal
    would run a float32 kernel in float64), cached on disk; once per process."""
    key = (body.__name__, dtype)
    found = _compiled.get(key)
    if found is not None:
        return found
    with _lock:
        found = _compiled.get(key)
        if found is None:
            typed = jit.in_precision(body, dtype)
            # A name per dtype: Numba names a compiled function after its qualified name.
            typed.__qualname__ = f"{body.__name__}_{dtype.name}"
            found = jit.numba().njit(cache=True, **jit.JIT_OPTIONS)(typed)
            found.compile(_signature(dtype, _KINDS[body]))
            found.disable_compile()
            _compiled[key] = found
    return found


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
