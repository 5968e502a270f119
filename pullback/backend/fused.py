"""`FusedOps`: fused forward ops and their backward, each defaulting to forward ops on
`self`, as `BackwardOps` does for backward kernels.

Mix it into a forward-only backend and these work there too; `CpuBackend` overrides
them with one-pass Numba kernels (pullback.kernels) for float32 and float64. Rows are
over the last axis (batch norm's over every axis but the channel axis, 1);
`upstream` is the cotangent at the op's output.
"""

from __future__ import annotations

import math
from typing import Any

from pullback.backend.base import Array, Backend, Mixin, Pair
from pullback.errors import KernelError


def check_labels(op: str, logits: Array, labels: Array) -> None:
    """Logits (..., C) and integer labels (...) in [0, C), or a KernelError."""
    shape, label_shape = tuple(logits.shape), tuple(labels.shape)
    if logits.dtype.kind != "f":
        raise KernelError(op, [logits, labels], "expected floating logits")
    if not shape or label_shape != shape[:-1]:
        raise KernelError(op, [logits, labels], "logits (..., C) need labels of shape (...)")
    if labels.dtype.kind not in "iu":
        raise KernelError(op, [logits, labels], "labels must be integers")
    if labels.size and (labels.min() < 0 or labels.max() >= shape[-1]):
        raise KernelError(op, [logits, labels], f"labels must lie in [0, {shape[-1]})")


def check_channels(op: str, x: Array) -> None:
    """A floating array of shape (N, C, *spatial), or a KernelError."""
    if x.dtype.kind != "f":
        raise KernelError(op, [x], "expected a floating dtype")
    if len(tuple(x.shape)) < 2:
        raise KernelError(op, [x], "expected (N, C) or (N, C, *spatial)")


def check_rows(op: str, x: Array) -> None:
    """A floating array with a last axis to normalize over, or a KernelError."""
    if x.dtype.kind != "f":
        raise KernelError(op, [x], "expected a floating dtype")
    if not tuple(x.shape):
        raise KernelError(op, [x], "expected at least one dimension")


class FusedOps(Mixin):
    """Fused ops: cross-entropy, layer norm, batch norm, with backward; a convolution
    with its epilogue (forward only)."""

    def _rows_of(self, x: Array) -> tuple[tuple[int, ...], int]:
        shape = tuple(x.shape)
        return shape[:-1], shape[-1]

    # -- cross-entropy ----------------------------------------------------------------

    def _label_index(self, labels: Array, grid: tuple[int, ...]) -> tuple[Array, Array]:
        # (row numbers, labels) as an advanced index into (rows, C).
        rows = math.prod(grid)
        return (self.arange(rows, dtype="int64"), self.reshape(labels, (rows,)))

    def cross_entropy(self, logits: Array, labels: Array) -> Array:
        """-log softmax(logits)[label] per row: logits (..., C), integer labels (...)."""
        check_labels("cross_entropy", logits, labels)
        grid, width = self._rows_of(logits)
        logp = self.reshape(self.log_softmax(logits, -1), (math.prod(grid), width))
        return self.reshape(self.neg(self.getitem(logp, self._label_index(labels, grid))), grid)

    def cross_entropy_backward(self, upstream: Array, logits: Array, labels: Array) -> Array:
        """upstream (one per row, or one for all) * (softmax(logits) - onehot(labels))."""
        check_labels("cross_entropy_backward", logits, labels)
        grid, width = self._rows_of(logits)
        rows = math.prod(grid)
        onehot = self.scatter_add(self.ones((rows,), logits.dtype),
                                  self._label_index(labels, grid), (rows, width))
        diff = self.sub(self.softmax(logits, -1), self.reshape(onehot, tuple(logits.shape)))
        if tuple(getattr(upstream, "shape", ())):
            upstream = self.reshape(upstream, (*grid, 1))
        return self.mul(diff, upstream)

    # -- layer norm -------------------------------------------------------------------

    def layer_norm(self, x: Array, weight: Array | None, bias: Array | None,
                   eps: float) -> tuple[Array, Array, Array]:
        """(x - mean) * rstd * weight + bias over the last axis, rstd = 1/sqrt(var + eps);
        returns (y, mean, rstd), mean and rstd of shape x.shape[:-1]."""
        check_rows("layer_norm", x)
        mean, rstd = self.layer_norm_statistics(x, eps)
        keep = (*self._rows_of(x)[0], 1)
        y = self.mul(self.sub(x, self.reshape(mean, keep)), self.reshape(rstd, keep))
        if weight is not None:
            y = self.mul(y, weight)
        if bias is not None:
            y = self.add(y, bias)
        return y, mean, rstd

    def layer_norm_statistics(self, x: Array, eps: float) -> tuple[Array, Array]:
        """(mean, rstd) of layer_norm over the last axis, each of shape x.shape[:-1]: what
        its backward recomputes from the saved input rather than keeps."""
        check_rows("layer_norm_statistics", x)
        grid, width = self._rows_of(x)
        last = (len(grid),)
        mean = self.div(self.reduce_sum(x, last, True), width)
        centered = self.sub(x, mean)
        var = self.div(self.reduce_sum(self.mul(centered, centered), last, True), width)
        rstd = self.div(1.0, self.sqrt(self.add(var, eps)))
        return self.reshape(mean, grid), self.reshape(rstd, grid)

    def layer_norm_backward_of_input(self, upstream: Array, x: Array, weight: Array | None,
                                     eps: float) -> tuple[Array, Array, Array]:
        """layer_norm_backward with the mean and rstd computed from x
        (layer_norm_statistics): what layer_norm's backward runs, from its saved input."""
        mean, rstd = self.layer_norm_statistics(x, eps)
        return self.layer_norm_backward(upstream, x, weight, mean, rstd)

    def layer_norm_backward(self, upstream: Array, x: Array, weight: Array | None,
                            mean: Array, rstd: Array) -> tuple[Array, Array, Array]:
        """(grad_x, grad_weight, grad_bias) from the saved mean and rstd; the last two
        are what a weight and bias would get (summed over rows)."""
        check_rows("layer_norm_backward", x)
        grid, width = self._rows_of(x)
        last = (len(grid),)
        every_row = tuple(range(len(grid)))
        rstd_col = self.reshape(rstd, (*grid, 1))
        xhat = self.mul(self.sub(x, self.reshape(mean, (*grid, 1))), rstd_col)
        grad_weight = self.reduce_sum(self.mul(upstream, xhat), every_row, False)
        grad_bias = self.reduce_sum(upstream, every_row, False)
        g = self.mul(upstream, weight) if weight is not None else upstream
        mean_g = self.div(self.reduce_sum(g, last, True), width)
        mean_gx = self.div(self.reduce_sum(self.mul(g, xhat), last, True), width)
        grad_x = self.mul(rstd_col, self.sub(self.sub(g, mean_g), self.mul(xhat, mean_gx)))
        return grad_x, grad_weight, grad_bias


    # -- batch norm -------------------------------------------------------------------

    def _channel_geometry(self, x: Array) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        # (the axes but the channel axis, (1, C, 1, ...) to broadcast a (C,) vector,
        # the number of values per channel, at least 1)
        shape = tuple(x.shape)
        column = (1, shape[1]) + (1,) * (len(shape) - 2)
        # An empty batch has no statistics; dividing by 1 keeps its (empty) results free
        # of 0 / 0 warnings.
        count = max(math.prod(shape) // shape[1] if shape[1] else 0, 1)
        return (0, *range(2, len(shape))), column, count

    def batch_norm(self, x: Array, weight: Array | None, bias: Array | None,
                   eps: float, relu: bool = False) -> tuple[Array, Array, Array]:
        """(x - mean) / sqrt(var + eps) * weight + bias per channel (axis 1), with the
        batch's mean and biased variance over every other axis; returns (y, mean, var),
        mean and var of shape (C,). With `relu`, y is relu's of that (a training plan
        runs a batch norm and the relu after it as one step)."""
        check_channels("batch_norm", x)
        _, column, _ = self._channel_geometry(x)
        mean, var = self.batch_norm_statistics(x)
        centered = self.sub(x, self.reshape(mean, column))
        y = self.mul(centered, self.reshape(self.div(1, self.sqrt(self.add(var, eps))), column))
        if weight is not None:
            y = self.mul(y, self.reshape(weight, column))
        if bias is not None:
            y = self.add(y, self.reshape(bias, column))
        return (self.relu(y) if relu else y), mean, var

    def batch_norm_statistics(self, x: Array) -> tuple[Array, Array]:
        """(mean, var) of x per channel (axis 1) over every other axis, the variance
        biased, each of shape (C,): batch_norm's statistics, which the running
        statistics are updated with."""
        check_channels("batch_norm_statistics", x)
        axes, column, count = self._channel_geometry(x)
        mean = self.div(self.reduce_sum(x, axes, True), count)
        centered = self.sub(x, mean)
        var = self.div(self.reduce_sum(self.mul(centered, centered), axes, True), count)
        channels = column[1:2]
        return self.reshape(mean, channels), self.reshape(var, channels)

    def batch_norm_backward(self, upstream: Array, x: Array, weight: Array | None,
                            eps: float) -> tuple[Array, Array, Array]:
        """(grad_x, grad_weight, grad_bias) of batch_norm, its statistics recomputed from
        x; the last two are what a weight and bias would get."""
        check_channels("batch_norm_backward", x)
        axes, column, count = self._channel_geometry(x)
        mean = self.div(self.reduce_sum(x, axes, True), count)
        centered = self.sub(x, mean)
        var = self.div(self.reduce_sum(self.mul(centered, centered), axes, True), count)
        rstd = self.div(1, self.sqrt(self.add(var, eps)))
        xhat = self.mul(centered, rstd)
        grad_weight = self.reduce_sum(self.mul(upstream, xhat), axes, True)
        grad_bias = self.reduce_sum(upstream, axes, True)
        scale = self.mul(rstd, self.reshape(weight, column)) if weight is not None else rstd
        inner = self.sub(self.sub(upstream, self.div(grad_bias, count)),
                         self.mul(xhat, self.div(grad_weight, count)))
        channels = column[1:2]
        return (self.mul(scale, inner), self.reshape(grad_weight, channels),
                self.reshape(grad_bias, channels))


    # -- a matrix product with its epilogue ------------------------------------------------

    def matmul_epilogue(self, a: Array, b: Array, bias: Array, relu: bool,
                        residual: Array | None = None) -> Array:
        """relu(a @ b + bias + residual) (relu a flag, residual optional), bias (N,)
        added to every row of the product with a matrix b (K, N) and a residual of the
        product's shape after it: a dense layer's forward (and the residual connection
        around it), as a plan runs it in one step; a backend applies them to each block
        of rows while it is in cache (CpuBackend), these defaults op by op."""
        y = self.add(self.matmul(a, b), bias)
        y = y if residual is None else self.add(y, residual)
        return self.relu(y) if relu else y

    # -- convolution with its epilogue ---------------------------------------------------

    def conv2d_epilogue(self, x: Array, w: Array, bias: Array | None, scale: Array | None,
                        shift: Array | None, residual: Array | None, relu: bool,
                        stride: Pair, padding: Pair, dilation: Pair = (1, 1),
                        groups: int = 1, *, constant_weights: bool = False) -> Array:
        """relu(((conv2d(x, w) + bias) * scale + shift) + residual): bias, scale and shift
        (O,) per output channel (a convolution's bias, then a batch norm's affine map)
        and a residual of the output's shape, each optional, relu a flag. What an
        inference plan runs for a convolution and the elementwise ops after it; a
        backend applies them to each chunk of the output while it is in cache
        (CpuBackend), these defaults op by op. `constant_weights` promises that w is the
        same array holding the same values at every call (a constant the plan computed,
        which only it holds): a backend may then keep what it derives from w
        (CpuBackend: Winograd's transformed kernels) instead of deriving it again; the
        defaults derive nothing."""
        y = self.conv2d(x, w, stride, padding, dilation, groups)
        column = (1, w.shape[0], 1, 1)
        for op, vector in ((self.add, bias), (self.mul, scale), (self.add, shift)):
            if vector is not None:
                y = op(y, self.reshape(vector, column))
        if residual is not None:
            y = self.add(y, residual)
        return self.relu(y) if relu else y


class _Defaults(FusedOps):
    """FusedOps' defaults over the forward ops of a backend without FusedOps."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def fused_ops(backend: Backend) -> FusedOps:
    """The backend's fused ops: its own, or the defaults written in its forward ops."""
    return backend if isinstance(backend, FusedOps) else _Defaults(backend)
