"""Batch norm, and relu's backward with a per-channel bias's gradient, over (N, C, S)
arrays as they are (S the spatial axes flattened), compiled with Numba per dtype: a
channel's values are its N planes of S contiguous values, so no copy moves the
channels outermost first (CpuBackend takes these for inputs with spatial axes;
pullback.kernels.channels' row kernels, which need that copy, for (N, C)).

Per channel, in passes over its planes: the forward sums x, then (x - mean)^2, then
writes y; the statistics alone (what the running statistics are updated with) are the
forward's first two passes; the backward sums x and the upstream u, then (x - mean)^2
and u (x - mean), then writes the input gradient. The statistics are recomputed from x
rather than saved (the primitive keeps one output). Each channel is independent, so the
parallel twin (channels over `prange`) and parts of the channels run on other threads
(`over`) give the serial loop's results bit for bit.
Sums may be reassociated (vectorized partial sums), as the row kernels' are. Relu's
backward with the bias's gradient is one pass per channel: the mask, and its sum.

One file on purpose: Numba's disk cache notices an edit to a kernel's own file only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pullback.kernels import jit
from pullback.kernels.conv import check_dtype

# Sums in vectorized partial sums (reassoc), multiply-adds fused (contract).
_OPTIONS = {**jit.JIT_OPTIONS, "fastmath": {"contract", "reassoc"}}


def _moments(x, c):
    """Channel c's mean and biased variance: a sum, then the sum of squared deviations."""
    n_, _, s_ = x.shape
    zero = x.dtype.type(0)
    count = x.dtype.type(n_ * s_)
    total = zero
    for n in range(n_):
        for t in range(s_):
            total += x[n, c, t]
    m = total / count
    squares = zero
    for n in range(n_):
        for t in range(s_):
            d = x[n, c, t] - m
            squares += d * d
    return m, squares / count


def _forward_channel(x, weight, bias, eps, relu, y, mean, var, c):
    """Channel c of batch_norm: y = (x - mean) weight / sqrt(var + eps) + bias, and with
    `relu` relu(y) as relu computes it (NaN stays NaN)."""
    n_, _, s_ = x.shape
    m, v = _moments(x, c)
    scale = weight[c] / np.sqrt(v + eps)
    shift = bias[c]
    zero = x.dtype.type(0)
    if relu:
        for n in range(n_):
            for t in range(s_):
                value = (x[n, c, t] - m) * scale + shift
                y[n, c, t] = zero if value <= zero else value
    else:
        for n in range(n_):
            for t in range(s_):
                y[n, c, t] = (x[n, c, t] - m) * scale + shift
    mean[c] = m
    var[c] = v


def _backward_channel(upstream, x, weight, eps, grad_x, grad_weight, grad_bias, c):
    """Channel c of batch_norm_backward: the input gradient, and the sums of u xhat and
    of u (what the channel's weight and bias get)."""
    n_, _, s_ = x.shape
    zero = x.dtype.type(0)
    count = x.dtype.type(n_ * s_)
    total = zero
    total_u = zero
    for n in range(n_):
        for t in range(s_):
            total += x[n, c, t]
            total_u += upstream[n, c, t]
    m = total / count
    squares = zero
    moment = zero
    for n in range(n_):
        for t in range(s_):
            d = x[n, c, t] - m
            squares += d * d
            moment += upstream[n, c, t] * d
    rstd = x.dtype.type(1) / np.sqrt(squares / count + eps)
    g_weight = moment * rstd  # the sum of u xhat
    mean_u = total_u / count
    along = rstd * (g_weight / count)  # per unit of (x - mean): xhat's share
    scale = weight[c] * rstd
    for n in range(n_):
        for t in range(s_):
            grad_x[n, c, t] = scale * (upstream[n, c, t] - mean_u - (x[n, c, t] - m) * along)
    grad_weight[c] = g_weight
    grad_bias[c] = total_u


def relu_bias_backward_serial(upstream, y, grad, bias_grad):
    """grad = upstream where relu's output y > 0, else 0, as relu's backward multiplies
    by the mask (so a NaN or infinite upstream times 0 stays NaN); bias_grad[c] = the sum
    of channel c's grad: the gradient of a bias added per channel before the relu."""
    n_, c_, s_ = y.shape
    zero = y.dtype.type(0)
    one = y.dtype.type(1)
    for c in range(c_):
        bias_grad[c] = zero
    # In memory order (a channel's planes lie a sample apart): each plane's sum, then
    # the channel's sum of its planes' sums.
    for n in range(n_):
        for c in range(c_):
            total = zero
            for t in range(s_):
                value = upstream[n, c, t] * (one if y[n, c, t] > zero else zero)
                grad[n, c, t] = value
                total += value
            bias_grad[c] += total


# Numba reads a function's globals when it compiles it: `_compiled` puts numba.prange
# here first (importing Numba only then, as every kernel module does).
prange = range


# Batch norm's drivers run channels c0 to c1: a caller may cut the channels into parts, one a
# thread (pullback.backend.split), each part's results its channels' own, bit for bit.


def forward_serial(x, weight, bias, eps, relu, y, mean, var, c0, c1):
    for c in range(c0, c1):
        _forward_channel(x, weight, bias, eps, relu, y, mean, var, c)


def forward_parallel(x, weight, bias, eps, relu, y, mean, var, c0, c1):
    for c in prange(c0, c1):
        _forward_channel(x, weight, bias, eps, relu, y, mean, var, c)


def statistics_serial(x, mean, var, c0, c1):
    for c in range(c0, c1):
        mean[c], var[c] = _moments(x, c)


def statistics_parallel(x, mean, var, c0, c1):
    for c in prange(c0, c1):
        mean[c], var[c] = _moments(x, c)


def backward_serial(upstream, x, weight, eps, grad_x, grad_weight, grad_bias, c0, c1):
    for c in range(c0, c1):
        _backward_channel(upstream, x, weight, eps, grad_x, grad_weight, grad_bias, c)


def backward_parallel(upstream, x, weight, eps, grad_x, grad_weight, grad_bias, c0, c1):
    for c in prange(c0, c1):
        _backward_channel(upstream, x, weight, eps, grad_x, grad_weight, grad_bias, c)


# ---------------------------------------------------------------- compilation


def _kinds_signature(dtype: np.dtype, kinds: str) -> tuple:
    # "i3"/"o3": a read-only / writable C-contiguous array of that many axes; "s" a scalar,
    # "b" a flag, "n" an int64.
    nb = jit.numba()
    return tuple(nb.from_dtype(dtype) if kind == "s" else nb.boolean if kind == "b" else
                 nb.int64 if kind == "n" else
                 jit.array_type(dtype, int(kind[1]), "C", readonly=kind[0] == "i")
                 for kind in kinds.split())


_KINDS = {forward_serial: "i3 i1 i1 s b o3 o1 o1 n n",
          forward_parallel: "i3 i1 i1 s b o3 o1 o1 n n",
          backward_serial: "i3 i3 i1 s o3 o1 o1 n n", backward_parallel: "i3 i3 i1 s o3 o1 o1 n n",
          statistics_serial: "i3 o1 o1 n n", statistics_parallel: "i3 o1 o1 n n",
          relu_bias_backward_serial: "i3 i3 o3 o1"}
_registered = False


def _make(driver: Callable, dtype: np.dtype) -> tuple[Callable, tuple]:
    global _registered, prange
    if not _registered:
        nb = jit.numba()
        for helper in (_moments, _forward_channel, _backward_channel):
            nb.extending.register_jitable(**_OPTIONS)(helper)
        prange = nb.prange
        _registered = True
    return driver, _kinds_signature(dtype, _KINDS[driver])


def _compiled(driver: Any, dtype: np.dtype) -> Any:
    """`driver` compiled for dtype (one explicit signature), cached on disk by Numba."""
    return jit.compiled_once((driver, dtype), _make, driver, dtype,
                             parallel=driver.__name__.endswith("parallel"), **_OPTIONS)


# ---------------------------------------------------------------- entry points
# The caller (pullback.backend.cpu) validates shapes and dtypes; these only run loops.
# `over`, where given, cuts the channels into parts run at once: over(C, run) calls
# run(c0, c1) for contiguous ranges covering range(C) (pullback.backend.split.over_parts);
# `parallel` instead spreads them over Numba's threads (prange).

Over = Callable[[int, Callable[[int, int], Any]], Any]


def _run(driver: Any, over: Over | None, channels: int, *args: Any) -> None:
    """driver(*args, c0, c1) for every channel: in `over`'s parts, or in one call."""
    if over is None or channels < 2:
        driver(*args, 0, channels)
    else:
        over(channels, lambda c0, c1: driver(*args, c0, c1))


def batch_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float,
               parallel: bool = False, relu: bool = False, out: np.ndarray | None = None,
               over: Over | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, mean, var) of batch norm over the C-contiguous x (N, C, S), weight and bias
    (C,) of x's dtype, y relu'd with `relu` and written into `out` (C-contiguous, x's
    shape) when given."""
    dtype = check_dtype("batch_norm", [x, weight, bias])
    y = np.empty_like(x) if out is None else out
    mean, var = np.empty(x.shape[1], dtype), np.empty(x.shape[1], dtype)
    driver = _compiled(forward_parallel if parallel else forward_serial, dtype)
    _run(driver, None if parallel else over, x.shape[1], x, np.ascontiguousarray(weight),
         np.ascontiguousarray(bias), dtype.type(eps), bool(relu), y, mean, var)
    return y, mean, var


def batch_norm_statistics(x: np.ndarray, parallel: bool = False, over: Over | None = None
                          ) -> tuple[np.ndarray, np.ndarray]:
    """(mean, var) per channel of the C-contiguous x (N, C, S), the variance biased: the
    forward's own statistics, bit for bit."""
    dtype = check_dtype("batch_norm_statistics", [x])
    mean, var = np.empty(x.shape[1], dtype), np.empty(x.shape[1], dtype)
    driver = _compiled(statistics_parallel if parallel else statistics_serial, dtype)
    _run(driver, None if parallel else over, x.shape[1], x, mean, var)
    return mean, var


def batch_norm_backward(upstream: np.ndarray, x: np.ndarray, weight: np.ndarray, eps: float,
                        parallel: bool = False, out: np.ndarray | None = None,
                        over: Over | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grad_x, grad_weight, grad_bias) of batch norm for the C-contiguous upstream and x
    (N, C, S) and weight (C,) of one dtype, the statistics recomputed from x; grad_x
    written into `out` (C-contiguous, x's shape) when given."""
    dtype = check_dtype("batch_norm_backward", [upstream, x, weight])
    grad_x = np.empty_like(x) if out is None else out
    grad_weight, grad_bias = np.empty(x.shape[1], dtype), np.empty(x.shape[1], dtype)
    driver = _compiled(backward_parallel if parallel else backward_serial, dtype)
    _run(driver, None if parallel else over, x.shape[1], upstream, x,
         np.ascontiguousarray(weight), dtype.type(eps), grad_x, grad_weight, grad_bias)
    return grad_x, grad_weight, grad_bias


def relu_bias_backward(upstream: np.ndarray, y: np.ndarray, out: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(grad, bias_grad) of relu's backward for the C-contiguous upstream and relu output
    y (N, C, S) of one dtype, grad written into `out` (C-contiguous, y's shape) when
    given, bias_grad (C,) its per-channel sums."""
    dtype = check_dtype("relu_bias_backward", [upstream, y])
    grad = np.empty_like(y) if out is None else out
    bias_grad = np.empty(y.shape[1], dtype)
    _compiled(relu_bias_backward_serial, dtype)(upstream, y, grad, bias_grad)
    return grad, bias_grad
