"""kernels.tiles: products with a packed right operand, against NumPy in float32 and
float64 at every edge of the tiling (rows not a multiple of the tile's, columns not a
multiple of a panel's, an empty inner dimension), the plain-Python oracle against the
compiled kernel, and bad operands refused naming the op."""

from __future__ import annotations

import numpy as np
import pytest

from pullback.errors import KernelError
from pullback.kernels import tiles

SHAPES = [(1, 1, 1), (4, 8, 24), (5, 7, 30), (3, 64, 23), (9, 33, 49), (32, 256, 1024),
          (32, 1024, 256), (7, 0, 5)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m, k, n", SHAPES)
def test_product_matches_numpy(m, k, n, dtype, rng):
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    out = np.full((m, n), np.nan, dtype)
    tiles.product(a, tiles.pack(b), out)
    want = a.astype(np.float64) @ b.astype(np.float64)
    tol = 2e-6 * max(k, 1) ** 0.5 if dtype == np.float32 else 1e-14 * max(k, 1)
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("width", [tiles.VECTOR_BYTES, tiles.WIDE_BYTES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_panels_and_tiles_take_either_vector_width(monkeypatch, dtype, width, rng):
    # 512-bit vectors where Numba's target has AVX-512, 256-bit ones elsewhere; each
    # width's kernel is its own (a stale one would read panels of the other's width).
    monkeypatch.setattr(tiles, "widest_bytes", lambda: width)
    assert tiles.panel_width(dtype) == tiles.VECTORS * width // np.dtype(dtype).itemsize
    for m, k, n in [(9, 33, 49), (32, 256, 1024)]:
        a = rng.standard_normal((m, k)).astype(dtype)
        b = rng.standard_normal((k, n)).astype(dtype)
        packed = tiles.pack(b)
        assert packed.panels.shape[2] == tiles.panel_width(dtype)
        out = tiles.product(a, packed, np.full((m, n), np.nan, dtype))
        tol = 2e-6 * k ** 0.5 if dtype == np.float32 else 1e-14 * k
        np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64),
                                   rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pack_lays_panels_of_columns_padded_with_zeros(dtype, rng):
    nr = tiles.panel_width(dtype)
    b = rng.standard_normal((3, nr + 2)).astype(dtype)
    packed, columns = tiles.pack(b)
    assert packed.shape == (2, 3, nr) and columns == nr + 2
    np.testing.assert_array_equal(packed[0], b[:, :nr])
    np.testing.assert_array_equal(packed[1, :, :2], b[:, nr:])
    assert not packed[1, :, 2:].any()


def test_rows_of_a_larger_array_give_the_bits_of_the_whole(rng):
    # Each result is its row times its column in k order, whichever rows go together:
    # a recurrence splits its batch so.
    a = rng.standard_normal((11, 40)).astype(np.float32)
    packed = tiles.pack(rng.standard_normal((40, 50)).astype(np.float32))
    whole = tiles.product(a, packed, np.empty((11, 50), np.float32))
    parts = np.empty((11, 50), np.float32)
    tiles.product(a[:3], packed, parts[:3])
    tiles.product(a[3:], packed, parts[3:])
    np.testing.assert_array_equal(parts, whole)


def test_the_python_oracle_matches_the_compiled_kernel(rng):
    a = rng.standard_normal((6, 5))
    packed = tiles.pack(rng.standard_normal((5, 14)))
    want = tiles.product(a, packed, np.empty((6, 14)))
    got = np.empty((6, 14))
    tiles.product_body(a, packed.panels, got, tiles.edge_buffer(packed.panels))
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("operands, message", [
    (lambda: (np.ones((2, 3), np.float32), tiles.pack(np.ones((3, 4), np.float64)),
              np.empty((2, 4), np.float32)), "mixed dtypes"),
    (lambda: (np.ones((2, 3)), tiles.pack(np.ones((4, 4))), np.empty((2, 4))),
     r"expected a \(M, K\) and out \(M, N\) for B \(K, N\) = \(4, 4\)"),
    (lambda: (np.ones((2, 3)), tiles.pack(np.ones((3, 4))), np.empty((2, 5))),
     r"for B \(K, N\) = \(3, 4\)"),
    (lambda: (np.ones((3, 2)).T, tiles.pack(np.ones((3, 4))), np.empty((2, 4))),
     "must be C-contiguous"),
    (lambda: (np.ones((2, 3)), tiles.Packed(tiles.pack(np.ones((3, 4))).panels[:, ::-1], 4),
              np.empty((2, 4))), "must be C-contiguous"),
    (lambda: (np.ones((2, 3), np.int64), tiles.pack(np.ones((3, 4))), np.empty((2, 4))),
     "mixed dtypes"),
])
def test_product_refuses_operands_that_do_not_fit(operands, message):
    with pytest.raises(KernelError, match=r"^packed_product: .*" + message):
        tiles.product(*operands())


def test_pack_refuses_what_is_not_a_float_matrix():
    with pytest.raises(KernelError, match=r"^pack: .*expected a matrix"):
        tiles.pack(np.ones((2, 3, 4)))
    with pytest.raises(KernelError, match=r"^pack: .*unsupported dtype int64"):
        tiles.pack(np.ones((2, 3), np.int64))
