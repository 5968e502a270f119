"""Winograd F(4x4, 3x3) convolution for CpuBackend: a 3x3, stride-1 cross-correlation
in 36 batched GEMMs over transformed tiles, 4x fewer multiplications than im2col's
GEMM (Lavin and Gray, 2015). pullback.backend.conv chooses it per shape (`_winograd`)
for conv2d, for conv2d_input_backward (the same kind of correlation with the weights
rotated and their channels swapped) and for conv2d_weight_backward (`weight_gradient`,
the forward's steps transposed).

Per chunk of the batch: the input transform writes each channel's overlapping 6x6
tiles as 36 rows (36, C, tiles); one batched GEMM multiplies them by the transformed
weights (36, O, C); the output transform writes the 4x4 output tiles into the NCHW
result. A chunk's tiles and products stay in cache between the three passes.

Float32 error: the transforms scale values by up to 10 (B) and 19 (A) a row, so the
result carries 8-45 times the rounding error of im2col's sums, about 1e-5 of the
output's largest value (bench/RESULTS.md; the bound is tested in
tests/backend/test_backend_winograd.py against a float64 reference).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from pullback.kernels import winograd as kernels

# Chunks of the batch whose tiles and products fit in about this many bytes: both
# stay in cache from the transform that writes them to the pass that reads them (half
# an L2 cache here: 2 MiB chunks ran up to 1.3x slower, 256 KiB ones no faster).
CHUNK_BYTES = 1 << 20


def tiles(out_hw: tuple[int, int]) -> tuple[int, int]:
    """Tiles of 4x4 covering an output of size out_hw (the last ones partial)."""
    return -(-out_hw[0] // kernels.TILE), -(-out_hw[1] // kernels.TILE)


def weight_transform(w: np.ndarray) -> np.ndarray:
    """G g G^T of each 3x3 kernel g of w (O, C, 3, 3), as (36, O, C) in w's dtype: one
    GEMM by the Kronecker product of G with itself (NumPy's matmul of G by each tiny
    kernel in turn took half a second on 512 x 512 kernels)."""
    o, c = w.shape[:2]
    u = np.matmul(KRONECKER[w.dtype.type], w.reshape(o * c, 9).T)  # (36, O C)
    return u.reshape(kernels.POSITIONS, o, c)


# (G kron G), (36, 9): row 6a + b maps a kernel's 9 taps to position (a, b) of G g G^T.
KRONECKER = {dtype: np.kron(kernels.G, kernels.G).astype(dtype)
             for dtype in (np.float32, np.float64)}


def _stride(elements: int, itemsize: int) -> int:
    """A distance between the 36 matrices of a transform, at least `elements`, that is
    an odd number of 64-byte lines: the transforms read or write all 36 at once, and
    36 streams a multiple of 4 KiB apart would share a few sets of the L1 cache."""
    lines = -(-elements * itemsize // 64)
    return (lines | 1) * 64 // itemsize


def _matrices(flat: np.ndarray, rows: int, cols: int, stride: int) -> np.ndarray:
    # The 36 (rows, cols) matrices `stride` elements apart in flat, as a (36, rows, cols)
    # view (NumPy refuses one that overruns flat). The ndarray constructor, not
    # as_strided, whose Python layers cost 10-30 us a view: convolutions make them per
    # chunk of a few samples.
    return np.ndarray((kernels.POSITIONS, rows, cols), flat.dtype, flat,
                      strides=(stride * flat.itemsize, cols * flat.itemsize, flat.itemsize))


def _tile_chunks(n: int, c: int, o: int, grid: tuple[int, int], dtype: np.dtype,
                 scratch: Callable[..., np.ndarray]) -> Iterator[tuple]:
    """The chunks of a batch of n samples whose transformed tiles (c rows per position)
    and products (o rows) fit in CHUNK_BYTES, as (start, stop, the flat c-row and o-row
    work arrays, their strides between positions, their (36, rows, tiles) views). Every
    chunk but the last has as many tiles: the views are made once per chunk size."""
    itemsize = np.dtype(dtype).itemsize
    per_sample = kernels.POSITIONS * (c + o) * grid[0] * grid[1] * itemsize
    size = max(1, min(n, CHUNK_BYTES // per_sample))
    most = size * grid[0] * grid[1]
    inputs = scratch("winograd tiles", kernels.POSITIONS * _stride(c * most, itemsize), dtype)
    outputs = scratch("winograd products", kernels.POSITIONS * _stride(o * most, itemsize),
                      dtype)
    views: dict[int, tuple] = {}
    for start in range(0, n, size):
        stop = min(n, start + size)
        count = (stop - start) * grid[0] * grid[1]
        if count not in views:
            c_stride, o_stride = _stride(c * count, itemsize), _stride(o * count, itemsize)
            views[count] = (c_stride, o_stride, _matrices(inputs, c, count, c_stride),
                            _matrices(outputs, o, count, o_stride))
        yield (start, stop, inputs, outputs, *views[count])


def correlate(x: np.ndarray, u: np.ndarray, padding: tuple[int, int], out: np.ndarray,
              scratch: Callable[..., np.ndarray],
              epilogue: Callable[..., None] | None = None,
              product: Callable[[np.ndarray, np.ndarray, np.ndarray], object] | None = None,
              threads: int = 0) -> np.ndarray:
    """out (N, O, OH, OW) = x (N, C, H, W), padded by `padding`, cross-correlated by the
    3x3 kernels whose transforms are u (36, O, C). `scratch(name, size, dtype)` lends
    the flat work arrays (pullback.backend.conv.scratch); `epilogue(rows, start, stop)`
    runs on each chunk of samples' output (m, O, OH OW) while it is in cache;
    `product(u, v, m)` multiplies the 36 pairs of matrices (NumPy's matmul when None);
    with `threads`, the transforms and the epilogue run on as many of Numba's threads."""
    n, c = x.shape[:2]
    o = u.shape[1]
    grid = tiles(out.shape[2:])
    x = np.ascontiguousarray(x)
    for start, stop, transformed, products, v_stride, m_stride, v, m in _tile_chunks(
            n, c, o, grid, x.dtype, scratch):
        kernels.input_transform(x[start:stop], transformed, padding, grid, v_stride, threads)
        if product is None:
            np.matmul(u, v, out=m)
        else:
            product(u, v, m)
        kernels.output_transform(products, out[start:stop], grid, m_stride, threads)
        if epilogue is not None:
            epilogue(out[start:stop].reshape(stop - start, o, -1), start, stop, threads)
    return out


def weight_gradient(x: np.ndarray, upstream: np.ndarray, padding: tuple[int, int],
                    scratch: Callable[..., np.ndarray]) -> np.ndarray:
    """The gradient (O, C, 3, 3) of the kernels w of out = x (N, C, H, W), padded by
    `padding`, cross-correlated by w, given the upstream (N, O, OH, OW): per position
    of the 6x6 tiles, the upstream's transformed tiles A dY A^T (O, tiles) times the
    input's B^T d B (C, tiles) transposed, summed over the batch, then taken back
    through the weight transform's transpose, (G kron G)^T. The transpose of the
    forward's three steps (`correlate`)."""
    n, c = x.shape[:2]
    o = upstream.shape[1]
    grid = tiles(upstream.shape[2:])
    x = np.ascontiguousarray(x)
    upstream = np.ascontiguousarray(upstream)
    total = np.zeros((kernels.POSITIONS, o, c), x.dtype)
    product = np.empty_like(total)
    for start, stop, transformed, transformed_up, v_stride, u_stride, v, m in _tile_chunks(
            n, c, o, grid, x.dtype, scratch):
        kernels.input_transform(x[start:stop], transformed, padding, grid, v_stride)
        kernels.upstream_transform(upstream[start:stop], transformed_up, grid, u_stride)
        total += np.matmul(m, v.transpose(0, 2, 1), out=product)
    grad = np.matmul(KRONECKER[x.dtype.type].T, total.reshape(kernels.POSITIONS, o * c))
    return np.ascontiguousarray(grad.reshape(3, 3, o, c).transpose(2, 3, 0, 1))
