"""`GatherOps`: `take` and `take_along_axis` and the scatter-adds that are their
transposes, defaulting to a backend's `getitem` and `scatter_add` (as `FusedOps`
defaults to forward ops), and `CpuGatherOps`, NumPy's gathers and a Numba scatter-add
(pullback.kernels.gather) for the CPU backends.

Indices are integer arrays; a negative one counts from the end of the axis, as in
NumPy; one outside [-size, size) is a `KernelIndexError` naming the op and the range.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pullback.backend.base import Array, Backend, Mixin, Shape
from pullback.errors import KernelIndexError
from pullback.kernels import gather as compiled
from pullback.kernels.base import SUPPORTED_DTYPES


def out_of_range(op: str, operands: list[Any], indices: Array, size: int, axis: int) -> \
        KernelIndexError | None:
    """The error for `indices` outside [-size, size) along `axis`, or None when they fit."""
    if not indices.size:
        return None
    lo, hi = int(indices.min()), int(indices.max())
    if -size <= lo and hi < size:
        return None
    return KernelIndexError(op, operands, f"indices must lie in [{-size}, {size}) along axis "
                            f"{axis} (of size {size}), got values from {lo} to {hi}")


def _check(op: str, operands: list[Any], indices: Array, size: int, axis: int) -> None:
    error = out_of_range(op, operands, indices, size, axis)
    if error is not None:
        raise error


def _with_axis(shape: Shape, axis: int, size: int) -> Shape:
    return shape[:axis] + (size,) + shape[axis + 1:]


class GatherOps(Mixin):
    """Gathers along one axis and their transposes, written in a backend's forward ops."""

    def take(self, x: Array, indices: Array, axis: int) -> Array:
        """x's slices along `axis` at `indices`: shape x.shape[:axis] + indices.shape +
        x.shape[axis + 1:], as np.take."""
        _check("take", [x, indices], indices, x.shape[axis], axis)
        return self.getitem(x, (slice(None),) * axis + (indices,))

    def take_scatter_add(self, values: Array, indices: Array, axis: int, size: int) -> Array:
        """The transpose of take: zeros with `size` along `axis` and each slice of values
        added at its index, repeated indices accumulating."""
        _check("take", [values, indices], indices, size, axis)
        shape = _with_axis(tuple(values.shape[:axis]), axis, size) + \
            tuple(values.shape[axis + indices.ndim:])
        return self.scatter_add(values, (slice(None),) * axis + (indices,), shape)

    def _along(self, shape: Shape, indices: Array, axis: int) -> tuple[Array, ...]:
        # The advanced index that picks indices[..., j, ...] along axis and walks every
        # other axis of `shape`: how np.take_along_axis builds it.
        ndim = len(shape)
        index = []
        for d, n in enumerate(shape):
            if d == axis:
                index.append(indices)
            else:
                ramp = self.arange(0, n, 1, "int64")
                index.append(self.reshape(ramp, tuple(n if e == d else 1 for e in range(ndim))))
        return tuple(index)

    def take_along_axis(self, x: Array, indices: Array, axis: int) -> Array:
        """x[..., indices[..., j, ...], ...] along `axis`, indices and x broadcast together
        on the other axes, as np.take_along_axis."""
        _check("take_along_axis", [x, indices], indices, x.shape[axis], axis)
        return self.getitem(x, self._along(tuple(x.shape), indices, axis))

    def take_along_axis_scatter_add(self, values: Array, indices: Array, axis: int,
                                    size: int) -> Array:
        """The transpose of take_along_axis into values' shape with `size` along `axis`
        (indices broadcast to values' shape), repeated indices accumulating."""
        _check("take_along_axis", [values, indices], indices, size, axis)
        shape = tuple(values.shape)
        index = self._along(shape, indices, axis)
        return self.scatter_add(values, index, _with_axis(shape, axis, size))


class CpuGatherOps(GatherOps):
    """NumPy's gathers; the scatter-adds as one Numba pass for float32 and float64."""

    def take(self, x: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
        try:
            return np.take(x, indices, axis=axis)
        except IndexError:
            _check("take", [x, indices], indices, x.shape[axis], axis)
            raise

    def take_along_axis(self, x: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
        try:
            return np.take_along_axis(x, indices, axis=axis)
        except IndexError:
            _check("take_along_axis", [x, indices], indices, x.shape[axis], axis)
            raise

    def take_scatter_add(self, values: np.ndarray, indices: np.ndarray, axis: int,
                         size: int) -> np.ndarray:
        if values.dtype not in SUPPORTED_DTYPES:
            return super().take_scatter_add(values, indices, axis, size)
        _check("take", [values, indices], indices, size, axis)
        pre, post = values.shape[:axis], values.shape[axis + indices.ndim:]
        out = np.zeros(pre + (size,) + post, dtype=values.dtype)
        rows, columns = math.prod(pre), math.prod(post)
        compiled.scatter_add(values.reshape(rows, indices.size, columns),
                             indices.reshape(1, indices.size, 1),
                             out.reshape(rows, size, columns))
        return out

    def take_along_axis_scatter_add(self, values: np.ndarray, indices: np.ndarray, axis: int,
                                    size: int) -> np.ndarray:
        if values.dtype not in SUPPORTED_DTYPES:
            return super().take_along_axis_scatter_add(values, indices, axis, size)
        _check("take_along_axis", [values, indices], indices, size, axis)
        shape = values.shape
        out = np.zeros(_with_axis(shape, axis, size), dtype=values.dtype)
        rows, columns = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        # Indices broadcast over values' other axes: one index per element, as (P, J, Q).
        spread = np.broadcast_to(indices, shape)
        compiled.scatter_add(values.reshape(rows, shape[axis], columns),
                             spread.reshape(rows, shape[axis], columns),
                             out.reshape(rows, size, columns))
        return out


class _Defaults(GatherOps):
    """GatherOps' defaults over the forward ops of a backend without GatherOps."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def gather_ops(backend: Backend) -> GatherOps:
    """The backend's gathers: its own, or the defaults written in its forward ops."""
    return backend if isinstance(backend, GatherOps) else _Defaults(backend)
