"""One time step of an LSTM or a GRU, forward and backward, as Numba kernels.

A recurrent layer's products (the input projection for every step, the state times
the recurrent weight per step, the weight's gradient over all steps) are its caller's
(pullback.backend.recurrent); what is left per step is elementwise: the gate activations, the new
cell and hidden state, and, backwards, the gates' cotangents. Each kernel does that
work in one pass over a range of the batch's rows (all of them, or a part's when the
caller splits the batch over the cores), and saves what the backward reads (the gate
activations) in the sequence's state array `y`:

- LSTM, gate order i f g o (PyTorch's): `y` is (6, T, N, H) holding h, c, i, f, g, o;
- GRU, gate order r z n: `y` is (5, T, N, H) holding h, r, z, n and hn = W_hn h + b_hn
  (PyTorch's n = tanh(x_n + r * hn)).

Only h and c (GRU: h) are the sequence op's result, so the backward kernels take the
cotangent of those alone, `upstream`: (2, T, N, H) for an LSTM, (T, N, H) for a GRU.
The gates' slots would only ever receive zeros, which cost a pass over memory to write
and another to read.

A small recurrence (see pullback.backend.recurrent.SMALL_PRODUCT) runs whole: one
kernel per direction loops over the steps, computing each step's recurrent product as
a loop (`product`) and calling the step kernels above, compiled into it, so that no
Python and no BLAS call runs between steps. A larger one runs so per part of its
batch (`lstm_rows`, `gru_rows` and their backwards: a part's rows through every step,
one part per core), each step's product through pullback.kernels.tiles' register
tiles on the weight packed once: the two parts never take turns for the GIL between
steps, as they did calling a step kernel and a product from Python per step (the
sequence's forward 0.5-0.9 ms faster of 10-13, its backward 0.1-0.3, paired).

Compiled per dtype (float32, float64) with one explicit signature each and kept in
Numba's disk cache; a float32 kernel computes in float32 (jit.in_precision).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pullback.errors import KernelError
from pullback.kernels import jit, tiles
from pullback.kernels.base import _SUPPORTED, SUPPORTED_DTYPES
from pullback.kernels.scalar_math import sigmoid, tanh

# ---------------------------------------------------------------- kernel bodies


def lstm_step(xp, hw, c_prev, y, t, first, stop):
    """Step t for the batch rows first..stop: gates = xp[t] + hw (pre-activations,
    N x 4H), then c = f c_prev + i g, h = o tanh(c), written with the gates into y[:, t]."""
    h_ = c_prev.shape[1]
    for n in range(first, stop):
        for j in range(h_):
            i = sigmoid(xp[t, n, j] + hw[n, j])
            f = sigmoid(xp[t, n, h_ + j] + hw[n, h_ + j])
            g = tanh(xp[t, n, 2 * h_ + j] + hw[n, 2 * h_ + j])
            o = sigmoid(xp[t, n, 3 * h_ + j] + hw[n, 3 * h_ + j])
            c = f * c_prev[n, j] + i * g
            y[0, t, n, j] = o * tanh(c)
            y[1, t, n, j] = c
            y[2, t, n, j] = i
            y[3, t, n, j] = f
            y[4, t, n, j] = g
            y[5, t, n, j] = o


def lstm_step_backward(upstream, y, c_prev, dh_carry, dc, da, t, first, stop):
    """Step t backwards for the batch rows first..stop: from upstream[:, t] (the
    cotangents of h_t and c_t), dh_carry (what step t + 1 sends h_t through the
    recurrent product) and dc (what it sends c_t), write the gates' pre-activation
    cotangents da[t] and, in place, dc for c_{t-1}."""
    h_ = c_prev.shape[1]
    tc = np.empty(h_, y.dtype)
    for n in range(first, stop):
        # tanh(c) in a pass of its own: the pass below then has no call in it
        for j in range(h_):
            tc[j] = tanh(y[1, t, n, j])
        for j in range(h_):
            i = y[2, t, n, j]
            f = y[3, t, n, j]
            g = y[4, t, n, j]
            o = y[5, t, n, j]
            dh = upstream[0, t, n, j] + dh_carry[n, j]
            dcv = upstream[1, t, n, j] + dc[n, j] + dh * o * (1.0 - tc[j] * tc[j])
            di = dcv * g
            df = dcv * c_prev[n, j]
            dg = dcv * i
            do = dh * tc[j]
            dc[n, j] = dcv * f
            da[t, n, j] = di * i * (1.0 - i)
            da[t, n, h_ + j] = df * f * (1.0 - f)
            da[t, n, 2 * h_ + j] = dg * (1.0 - g * g)
            da[t, n, 3 * h_ + j] = do * o * (1.0 - o)


def gru_step(xp, hw, b_hh, h_prev, y, t, first, stop):
    """Step t for the batch rows first..stop: r, z from xp[t] + hw + b_hh, hn = hw_n +
    b_hn, n = tanh(xp_n + r hn), h = (1 - z) n + z h_prev, written into y[:, t]; hw is
    h_prev @ W_hh^T."""
    h_ = h_prev.shape[1]
    for n in range(first, stop):
        for j in range(h_):
            r = sigmoid(xp[t, n, j] + hw[n, j] + b_hh[j])
            z = sigmoid(xp[t, n, h_ + j] + hw[n, h_ + j] + b_hh[h_ + j])
            hn = hw[n, 2 * h_ + j] + b_hh[2 * h_ + j]
            g = tanh(xp[t, n, 2 * h_ + j] + r * hn)
            y[0, t, n, j] = (1.0 - z) * g + z * h_prev[n, j]
            y[1, t, n, j] = r
            y[2, t, n, j] = z
            y[3, t, n, j] = g
            y[4, t, n, j] = hn


def gru_step_backward(upstream, y, h_prev, carry, dxp, dhw, t, first, stop):
    """Step t backwards for the batch rows first..stop: from upstream[t] (the cotangent
    of h_t) and `carry` (what step t + 1 sends h_t), write the cotangents of xp[t]
    (dxp[t]) and of the recurrent pre-activations hw + b_hh (dhw[t]), and replace carry
    by the direct part of h_{t-1}'s cotangent, z dh (the caller adds dhw[t] @ W_hh)."""
    h_ = h_prev.shape[1]
    for n in range(first, stop):
        for j in range(h_):
            r = y[1, t, n, j]
            z = y[2, t, n, j]
            g = y[3, t, n, j]
            hn = y[4, t, n, j]
            dh = upstream[t, n, j] + carry[n, j]
            dn = dh * (1.0 - z)
            dz = dh * (h_prev[n, j] - g)
            dan = dn * (1.0 - g * g)
            dr = dan * hn
            dar = dr * r * (1.0 - r)
            daz = dz * z * (1.0 - z)
            dxp[t, n, j] = dar
            dxp[t, n, h_ + j] = daz
            dxp[t, n, 2 * h_ + j] = dan
            dhw[t, n, j] = dar
            dhw[t, n, h_ + j] = daz
            dhw[t, n, 2 * h_ + j] = dan * r
            carry[n, j] = dh * z


def product(a, b, out):
    """out = a @ b for C-ordered matrices, as a loop: for the small products of a small
    recurrence, where calling BLAS from Python per step costs more than the product."""
    for n in range(out.shape[0]):
        for k in range(out.shape[1]):
            out[n, k] = 0.0
        for j in range(a.shape[1]):
            v = a[n, j]
            for k in range(out.shape[1]):
                out[n, k] += v * b[j, k]


def lstm_sequence(xp, h0, c0, wt, hw, y):
    """Every step of a small LSTM in one call: hw = h_{t-1} @ W_hh^T (wt), then
    `lstm_step`; no Python between steps."""
    for t in range(xp.shape[0]):
        if t == 0:
            product(h0, wt, hw)
            lstm_step(xp, hw, c0, y, t, 0, hw.shape[0])
        else:
            product(y[0, t - 1], wt, hw)
            lstm_step(xp, hw, y[1, t - 1], y, t, 0, hw.shape[0])


def lstm_sequence_backward(upstream, y, c0, w_hh, carry, dc, da):
    """Every step of a small LSTM backwards in one call: `lstm_step_backward`, then the
    cotangent h_{t-1} gets through the recurrent product, carry = da[t] @ W_hh."""
    for t in range(y.shape[1] - 1, -1, -1):
        if t == 0:
            lstm_step_backward(upstream, y, c0, carry, dc, da, t, 0, carry.shape[0])
        else:
            lstm_step_backward(upstream, y, y[1, t - 1], carry, dc, da, t, 0,
                               carry.shape[0])
        product(da[t], w_hh, carry)


def gru_sequence(xp, h0, wt, b_hh, hw, y):
    """Every step of a small GRU in one call: hw = h_{t-1} @ W_hh^T, then `gru_step`."""
    for t in range(xp.shape[0]):
        if t == 0:
            product(h0, wt, hw)
            gru_step(xp, hw, b_hh, h0, y, t, 0, hw.shape[0])
        else:
            product(y[0, t - 1], wt, hw)
            gru_step(xp, hw, b_hh, y[0, t - 1], y, t, 0, hw.shape[0])


def gru_sequence_backward(upstream, y, h0, w_hh, carry, through_w, dxp, dhw):
    """Every step of a small GRU backwards in one call: `gru_step_backward`, then
    carry += dhw[t] @ W_hh."""
    for t in range(y.shape[1] - 1, -1, -1):
        if t == 0:
            gru_step_backward(upstream, y, h0, carry, dxp, dhw, t, 0, carry.shape[0])
        else:
            gru_step_backward(upstream, y, y[0, t - 1], carry, dxp, dhw, t, 0,
                              carry.shape[0])
        product(dhw[t], w_hh, through_w)
        for n in range(carry.shape[0]):
            for j in range(carry.shape[1]):
                carry[n, j] += through_w[n, j]


def lstm_rows(xp, h0, c0, panels, edge, hw, y, first, stop):
    """Every step of an LSTM for the batch rows first..stop (a part of a large batch):
    hw = h_{t-1} @ W_hh^T (`packed_product`, W_hh^T packed once), then `lstm_step`; no
    Python between steps, so the parts on two threads never wait for each other's GIL."""
    for t in range(xp.shape[0]):
        if t == 0:
            packed_product(h0[first:stop], panels, hw[first:stop], edge)
            lstm_step(xp, hw, c0, y, t, first, stop)
        else:
            packed_product(y[0, t - 1, first:stop], panels, hw[first:stop], edge)
            lstm_step(xp, hw, y[1, t - 1], y, t, first, stop)


def lstm_rows_backward(upstream, y, c0, panels, edge, carry, dc, da, first, stop):
    """lstm_rows backwards: `lstm_step_backward`, then carry = da[t] @ W_hh."""
    for t in range(y.shape[1] - 1, -1, -1):
        if t == 0:
            lstm_step_backward(upstream, y, c0, carry, dc, da, t, first, stop)
        else:
            lstm_step_backward(upstream, y, y[1, t - 1], carry, dc, da, t, first, stop)
        packed_product(da[t, first:stop], panels, carry[first:stop], edge)


def gru_rows(xp, h0, panels, edge, b_hh, hw, y, first, stop):
    """Every step of a GRU for the batch rows first..stop: hw = h_{t-1} @ W_hh^T, then
    `gru_step`."""
    for t in range(xp.shape[0]):
        if t == 0:
            packed_product(h0[first:stop], panels, hw[first:stop], edge)
            gru_step(xp, hw, b_hh, h0, y, t, first, stop)
        else:
            packed_product(y[0, t - 1, first:stop], panels, hw[first:stop], edge)
            gru_step(xp, hw, b_hh, y[0, t - 1], y, t, first, stop)


def gru_rows_backward(upstream, y, h0, panels, edge, carry, through_w, dxp, dhw, first,
                      stop):
    """gru_rows backwards: `gru_step_backward`, then carry += dhw[t] @ W_hh."""
    for t in range(y.shape[1] - 1, -1, -1):
        if t == 0:
            gru_step_backward(upstream, y, h0, carry, dxp, dhw, t, first, stop)
        else:
            gru_step_backward(upstream, y, y[0, t - 1], carry, dxp, dhw, t, first, stop)
        packed_product(dhw[t, first:stop], panels, through_w[first:stop], edge)
        for n in range(first, stop):
            for j in range(carry.shape[1]):
                carry[n, j] += through_w[n, j]


def packed_product(a, panels, out, edge):
    """out = a @ W, W's columns packed in panels (pullback.kernels.tiles.pack) and `edge`
    a tile's scratch. Compiled, the bodies above call tiles' own `product_body` (its
    register tiles) in its place; this loop is its plain-Python meaning."""
    width = panels.shape[2]
    for n in range(out.shape[0]):
        for col in range(out.shape[1]):
            p, j = col // width, col % width
            total = 0.0
            for k in range(a.shape[1]):
                total += a[n, k] * panels[p, k, j]
            out[n, col] = total


# ---------------------------------------------------------------- compilation

# Each body's parameters: "inK"/"outK" an array of K dims (read-only or written), "t"
# an integer (the step number, the first and the stop of a range of batch rows).
_KINDS: dict[Callable, tuple[str, ...]] = {
    lstm_step: ("in3", "in2", "in2", "out4", "t", "t", "t"),
    lstm_step_backward: ("in4", "in4", "in2", "in2", "out2", "out3", "t", "t", "t"),
    gru_step: ("in3", "in2", "in1", "in2", "out4", "t", "t", "t"),
    gru_step_backward: ("in3", "in4", "in2", "out2", "out3", "out3", "t", "t", "t"),
    lstm_sequence: ("in3", "in2", "in2", "in2", "out2", "out4"),
    lstm_sequence_backward: ("in4", "in4", "in2", "in2", "out2", "out2", "out3"),
    gru_sequence: ("in3", "in2", "in2", "in1", "out2", "out4"),
    gru_sequence_backward: ("in3", "in4", "in2", "in2", "out2", "out2", "out3", "out3"),
    lstm_rows: ("in3", "in2", "in2", "in3", "out2", "out2", "out4", "t", "t"),
    lstm_rows_backward: ("in4", "in4", "in2", "in3", "out2", "out2", "out2", "out3", "t",
                         "t"),
    gru_rows: ("in3", "in2", "in3", "out2", "in1", "out2", "out4", "t", "t"),
    gru_rows_backward: ("in3", "in4", "in2", "in3", "out2", "out2", "out2", "out3", "out3",
                        "t", "t"),
}
# The bodies a whole-sequence body calls, compiled into it (inlined) in its dtype.
_CALLS: dict[Callable, tuple[Callable, ...]] = {
    lstm_sequence: (product, lstm_step),
    lstm_sequence_backward: (product, lstm_step_backward),
    gru_sequence: (product, gru_step),
    gru_sequence_backward: (product, gru_step_backward),
    lstm_rows: (packed_product, lstm_step),
    lstm_rows_backward: (packed_product, lstm_step_backward),
    gru_rows: (packed_product, gru_step),
    gru_rows_backward: (packed_product, gru_step_backward),
}


def _signature(dtype: np.dtype, kinds: tuple[str, ...]) -> tuple:
    nb = jit.numba()
    return tuple(nb.int64 if kind == "t" else
                 jit.array_type(dtype, int(kind[-1]), "C", readonly=kind.startswith("in"))
                 for kind in kinds)


def compiled(body: Callable, dtype: np.dtype) -> Any:
    """`body` compiled for `dtype` (computing in it), cached on disk; once per process."""
    return jit.compiled_once((body, dtype), _make, body, dtype)


def _make(body: Callable, dtype: np.dtype) -> tuple[Callable, tuple]:
    return _with_callees(body, dtype), _signature(dtype, _KINDS[body])


def check_dtype(op: str, arrays: list[np.ndarray]) -> np.dtype:
    """The one supported float dtype of `arrays`, or a KernelError naming op."""
    dtype = arrays[0].dtype
    if any(a.dtype != dtype for a in arrays) or dtype not in SUPPORTED_DTYPES:
        names = " and ".join(sorted({a.dtype.name for a in arrays}))
        raise KernelError(op, arrays, f"dtypes {names}: one float dtype is needed; {_SUPPORTED}")
    return dtype


def _with_callees(body: Callable, dtype: np.dtype) -> Callable:
    """`body` in `dtype` (jit.in_precision), the bodies it calls (`_CALLS`) bound in its
    scope as Numba functions in the same dtype, inlined where they are called."""
    fn = jit.in_precision(body, dtype)
    callees = _CALLS.get(body)
    if not callees:
        return fn
    nb = jit.numba()
    scope = dict(fn.__globals__)
    for callee in callees:
        source = tiles.body_in(dtype) if callee is packed_product else \
            jit.in_precision(callee, dtype)
        scope[callee.__name__] = nb.njit(inline="always", **jit.JIT_OPTIONS)(source)
    if packed_product in callees:  # tiles' register tiles compiled in
        return jit.depending_on(jit.rebound(fn, scope), tiles)
    return jit.rebound(fn, scope)
