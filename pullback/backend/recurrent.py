"""`RecurrentOps`: a whole LSTM or GRU sequence as one forward op and one backward op.

The input projection of every step is the caller's (one matmul up front); these run
the recurrence over T steps and return its states: an LSTM's h and c per step (2, T,
N, H), a GRU's h (T, N, H). `CpuRecurrentOps` computes them within the sequence's
whole state array (pullback.kernels.recurrent: the gates per step beside them) and
returns a view of it, so that its backward finds the gates there (`_saved`) and
recomputes nothing; given states that are not such a view (a copy), it runs the
forward again for them, bit for bit the same. Defaults are written in forward ops on `self`
(forward) or derived from the primitives' rules (backward: `derive_default`);
`CpuRecurrentOps` runs each step as one product with the recurrent weight, packed once
for all steps (pullback.kernels.tiles), and one Numba kernel; a batch large enough
splits over the cores by rows, each part running every step of its rows (SPLIT_MACS).
A small recurrence runs every step in one Numba kernel (SMALL_PRODUCT). The backward's
weight gradient is one BLAS product over all steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from pullback.backend import gemm, split
from pullback.backend.backward_ops import from_rule
from pullback.backend.base import Array, Backend, Mixin
from pullback.errors import KernelError
from pullback.kernels import recurrent as kernels
from pullback.kernels import tiles

LSTM_GATES, GRU_GATES = 4, 3
# The whole state array's leading axis (h, c, i, f, g, o / h, r, z, n, hn); an LSTM's
# result is its first LSTM_OUTPUTS slots (h, c), a GRU's its first slot (h).
LSTM_STATES, GRU_STATES = 6, 5
LSTM_OUTPUTS = 2
# Up to this many multiply-adds in a step's recurrent product (N x gates H x H), the
# whole sequence runs in one Numba kernel, its products as loops; above it, one kernel
# per part of the batch, its products on the weight packed once (register tiles), which
# costs a packing and the tiles' edges. Forward + backward, T=16, one thread, median us
# (bench/RESULTS.md): LSTM N=1, H=32 (4,096) loops 58-59 against tiles 94, GRU N=1
# 60-65 against 95; LSTM N=8, H=32 (32,768) 205-233 against 189, GRU 168-170 against
# 175; LSTM N=4, H=64 (65,536) 334-348 against 248.
SMALL_PRODUCT = 16384
# A recurrence above SMALL_PRODUCT splits its batch over the cores where each part's
# step product (its rows x gates H x H) has at least this many multiply-adds and at
# least a tile's rows (kernels.tiles.MR). LSTM, T=32, forward + backward, two threads,
# whole against split: N=8, H=256 (parts of 4 rows) 5.9 -> 3.8 ms; N=16, H=128 3.3 ->
# 2.3; N=32, H=256 19.1 -> 11.7; but N=8, H=64 (4 x 256 x 64 a part) 0.42 -> 0.80.
SPLIT_MACS = 1 << 18
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _shape(value: Any) -> tuple:
    return tuple(getattr(value, "shape", ()))


def _check(op: str, xp: Array, state: Array, w_hh: Array, gates: int,
           extra: tuple[Array, ...]) -> tuple[int, int, int]:
    """(T, N, H) of a recurrence on xp (T, N, gates H) from `state` (N, H) with w_hh
    (gates H, H); `extra` are further operands that must be (N, H) (LSTM's c0) or
    (gates H,) (GRU's b_hh). A KernelError naming op and every operand otherwise."""
    operands = (xp, state, w_hh, *extra)
    shape, h_shape, w_shape = _shape(xp), _shape(state), _shape(w_hh)
    if len(h_shape) != 2:
        raise KernelError(op, operands, "the initial state must be (N, H)")
    n, h = h_shape
    if len(shape) != 3 or shape[1:] != (n, gates * h):
        raise KernelError(op, operands, f"the projected input must be (T, N, {gates} H) = "
                          f"(T, {n}, {gates * h}) for states (N, H) = {h_shape}")
    if w_shape != (gates * h, h):
        raise KernelError(op, operands, f"the recurrent weight must be ({gates} H, H) = "
                          f"({gates * h}, {h})")
    for value in extra:
        want = h_shape if gates == LSTM_GATES else (gates * h,)
        if _shape(value) != want:
            what = "initial cell state" if gates == LSTM_GATES else "recurrent bias"
            raise KernelError(op, operands, f"the {what} must have shape {want}")
    # Dtype objects compared, not their names: str(dtype) is a Python call in NumPy,
    # and this check runs on every forward and backward of a (small) sequence.
    dtype = getattr(xp, "dtype", None)
    if dtype not in _FLOATS or any(getattr(v, "dtype", None) != dtype for v in operands):
        raise KernelError(op, operands, "operands must share one floating dtype")
    return shape[0], n, h


def check_lstm(op: str, xp: Array, h0: Array, c0: Array, w_hh: Array) -> tuple[int, int, int]:
    """(T, N, H) of an LSTM sequence, or a KernelError naming op (see `_check`)."""
    return _check(op, xp, h0, w_hh, LSTM_GATES, (c0,))


def check_gru(op: str, xp: Array, h0: Array, w_hh: Array, b_hh: Array) -> tuple[int, int, int]:
    """(T, N, H) of a GRU sequence, or a KernelError naming op (see `_check`)."""
    return _check(op, xp, h0, w_hh, GRU_GATES, (b_hh,))


def _check_upstream(op: str, upstream: Any, y: Any) -> None:
    if _shape(upstream) != _shape(y):
        raise KernelError(op, (upstream, y), "upstream must have the shape of the sequence's "
                          "states")


class RecurrentOps(Mixin):
    """Whole-sequence LSTM and GRU, forward and backward; defaults in forward ops."""

    def lstm_sequence(self, xp: Array, h0: Array, c0: Array, w_hh: Array) -> Array:
        """y (2, T, N, H): h and c per step, from the projected input xp (T, N, 4H:
        x W_ih^T + b_ih + b_hh), the initial states h0, c0 (N, H) and the recurrent
        weight w_hh (4H, H), PyTorch's gate order i f g o."""
        steps, n, h = check_lstm("lstm_sequence", xp, h0, c0, w_hh)
        wt = self.transpose(w_hh, (1, 0))
        hidden: list[Array] = []
        cells: list[Array] = []
        hs, cs = h0, c0
        for t in range(steps):
            a = self.add(self.getitem(xp, t), self.matmul(hs, wt))
            i, f, g, o = (self.getitem(a, (slice(None), slice(k * h, (k + 1) * h)))
                          for k in range(LSTM_GATES))
            i, f, g, o = self.sigmoid(i), self.sigmoid(f), self.tanh(g), self.sigmoid(o)
            cs = self.add(self.mul(f, cs), self.mul(i, g))
            hs = self.mul(o, self.tanh(cs))
            hidden.append(hs)
            cells.append(cs)
        return self._stacked(hidden + cells, (LSTM_OUTPUTS, steps, n, h), xp.dtype)

    def lstm_sequence_backward(self, upstream: Array, xp: Array, h0: Array, c0: Array,
                               w_hh: Array, y: Array, needed: tuple[bool, ...] | None = None
                               ) -> tuple[Array | None, ...]:
        """The cotangents of (xp, h0, c0, w_hh) from upstream, the cotangent of the
        states y; None for an operand not `needed`."""
        check_lstm("lstm_sequence_backward", xp, h0, c0, w_hh)
        _check_upstream("lstm_sequence_backward", upstream, y)
        return from_rule(self, "lstm_sequence_backward", upstream, (xp, h0, c0, w_hh), y,
                         tuple(_shape(v) for v in (xp, h0, c0, w_hh)), needed)

    def gru_sequence(self, xp: Array, h0: Array, w_hh: Array, b_hh: Array) -> Array:
        """y (T, N, H): h per step, from the projected input xp (T, N, 3H: x W_ih^T +
        b_ih), h0 (N, H), w_hh (3H, H) and b_hh (3H,), PyTorch's gate order r z n and
        its n = tanh(x_n + r (W_hn h + b_hn))."""
        steps, n, h = check_gru("gru_sequence", xp, h0, w_hh, b_hh)
        wt = self.transpose(w_hh, (1, 0))
        states: list[Array] = []
        hs = h0
        for t in range(steps):
            a = self.getitem(xp, t)
            hw = self.add(self.matmul(hs, wt), b_hh)
            (ar, az, an), (hr, hz, hn) = (
                tuple(self.getitem(v, (slice(None), slice(k * h, (k + 1) * h)))
                      for k in range(GRU_GATES)) for v in (a, hw))
            r, z = self.sigmoid(self.add(ar, hr)), self.sigmoid(self.add(az, hz))
            g = self.tanh(self.add(an, self.mul(r, hn)))
            hs = self.add(g, self.mul(z, self.sub(hs, g)))
            states.append(hs)
        return self._stacked(states, (steps, n, h), xp.dtype)

    def gru_sequence_backward(self, upstream: Array, xp: Array, h0: Array, w_hh: Array,
                              b_hh: Array, y: Array, needed: tuple[bool, ...] | None = None
                              ) -> tuple[Array | None, ...]:
        """The cotangents of (xp, h0, w_hh, b_hh) from upstream, the cotangent of the
        states y; None for an operand not `needed`."""
        check_gru("gru_sequence_backward", xp, h0, w_hh, b_hh)
        _check_upstream("gru_sequence_backward", upstream, y)
        return from_rule(self, "gru_sequence_backward", upstream, (xp, h0, w_hh, b_hh), y,
                         tuple(_shape(v) for v in (xp, h0, w_hh, b_hh)), needed)

    def _stacked(self, values: list[Array], shape: tuple[int, ...], dtype: DTypeLike
                 ) -> Array:
        # The (N, H) values, in order, stacked into `shape`.
        if not values:
            return self.zeros(shape, dtype)
        one = (1, *shape[-2:])
        return self.reshape(self.concatenate([self.reshape(v, one) for v in values], 0),
                            shape)


class CpuRecurrentOps(RecurrentOps):
    """RecurrentOps on NumPy arrays: per step one packed-weight product and one Numba
    kernel, or for a small recurrence the whole sequence in one Numba kernel."""

    def lstm_sequence(self, xp: np.ndarray, h0: np.ndarray, c0: np.ndarray,
                      w_hh: np.ndarray) -> np.ndarray:
        return self._lstm_states(xp, h0, c0, w_hh)[:LSTM_OUTPUTS]

    def _lstm_states(self, xp: np.ndarray, h0: np.ndarray, c0: np.ndarray,
                     w_hh: np.ndarray) -> np.ndarray:
        """The whole state array (6, T, N, H): h, c and the gates per step."""
        steps, n, h = check_lstm("lstm_sequence", xp, h0, c0, w_hh)
        dtype = kernels.check_dtype("lstm_sequence", [xp, h0, c0, w_hh])
        xp = np.ascontiguousarray(xp)
        y = np.empty((LSTM_STATES, steps, n, h), dtype)
        hw = np.empty((n, LSTM_GATES * h), dtype)
        wt = np.ascontiguousarray(w_hh.T)  # once: T products read it
        hs, cs = np.ascontiguousarray(h0), np.ascontiguousarray(c0)
        if n * LSTM_GATES * h * h <= SMALL_PRODUCT:
            kernels.compiled(kernels.lstm_sequence, dtype)(xp, hs, cs, wt, hw, y)
            return y
        run, panels = kernels.compiled(kernels.lstm_rows, dtype), _packed(wt)

        def rows(first: int, stop: int) -> None:
            run(xp, hs, cs, panels, tiles.edge_buffer(panels), hw, y, first, stop)

        _over_rows(n, LSTM_GATES * h * h, rows)
        return y

    def lstm_sequence_backward(self, upstream: np.ndarray, xp: np.ndarray, h0: np.ndarray,
                               c0: np.ndarray, w_hh: np.ndarray, y: np.ndarray,
                               needed: tuple[bool, ...] | None = None
                               ) -> tuple[np.ndarray | None, ...]:
        steps, n, h = check_lstm("lstm_sequence_backward", xp, h0, c0, w_hh)
        _check_upstream("lstm_sequence_backward", upstream, y)
        dtype = kernels.check_dtype("lstm_sequence_backward", [upstream, xp, h0, c0, w_hh, y])
        upstream, c0 = np.ascontiguousarray(upstream), np.ascontiguousarray(c0)
        states = _saved(y, LSTM_STATES)
        if states is None:
            states = self._lstm_states(xp, h0, c0, w_hh)
        da = np.empty((steps, n, LSTM_GATES * h), dtype)
        carry, dc = np.zeros((n, h), dtype), np.zeros((n, h), dtype)
        if n * LSTM_GATES * h * h <= SMALL_PRODUCT:
            kernels.compiled(kernels.lstm_sequence_backward, dtype)(
                upstream, states, c0, np.ascontiguousarray(w_hh), carry, dc, da)
        else:
            run = kernels.compiled(kernels.lstm_rows_backward, dtype)
            panels = _packed(w_hh)

            def rows(first: int, stop: int) -> None:
                run(upstream, states, c0, panels, tiles.edge_buffer(panels), carry, dc, da,
                    first, stop)

            _over_rows(n, LSTM_GATES * h * h, rows)
        grads = (da, carry, dc, self._weight_grad(da, h0, states, _wants(needed, 3)))
        return _only_needed(grads, needed)

    def gru_sequence(self, xp: np.ndarray, h0: np.ndarray, w_hh: np.ndarray,
                     b_hh: np.ndarray) -> np.ndarray:
        return self._gru_states(xp, h0, w_hh, b_hh)[0]

    def _gru_states(self, xp: np.ndarray, h0: np.ndarray, w_hh: np.ndarray,
                    b_hh: np.ndarray) -> np.ndarray:
        """The whole state array (5, T, N, H): h and the gates per step."""
        steps, n, h = check_gru("gru_sequence", xp, h0, w_hh, b_hh)
        dtype = kernels.check_dtype("gru_sequence", [xp, h0, w_hh, b_hh])
        xp, b_hh = np.ascontiguousarray(xp), np.ascontiguousarray(b_hh)
        y = np.empty((GRU_STATES, steps, n, h), dtype)
        hw = np.empty((n, GRU_GATES * h), dtype)
        wt = np.ascontiguousarray(w_hh.T)  # once: T products read it
        hs = np.ascontiguousarray(h0)
        if n * GRU_GATES * h * h <= SMALL_PRODUCT:
            kernels.compiled(kernels.gru_sequence, dtype)(xp, hs, wt, b_hh, hw, y)
            return y
        run, panels = kernels.compiled(kernels.gru_rows, dtype), _packed(wt)

        def rows(first: int, stop: int) -> None:
            run(xp, hs, panels, tiles.edge_buffer(panels), b_hh, hw, y, first, stop)

        _over_rows(n, GRU_GATES * h * h, rows)
        return y

    def gru_sequence_backward(self, upstream: np.ndarray, xp: np.ndarray, h0: np.ndarray,
                              w_hh: np.ndarray, b_hh: np.ndarray, y: np.ndarray,
                              needed: tuple[bool, ...] | None = None
                              ) -> tuple[np.ndarray | None, ...]:
        steps, n, h = check_gru("gru_sequence_backward", xp, h0, w_hh, b_hh)
        _check_upstream("gru_sequence_backward", upstream, y)
        dtype = kernels.check_dtype("gru_sequence_backward", [upstream, xp, h0, w_hh, b_hh, y])
        upstream, h0 = np.ascontiguousarray(upstream), np.ascontiguousarray(h0)
        states = _saved(y, GRU_STATES)
        if states is None:
            states = self._gru_states(xp, h0, w_hh, b_hh)
        dxp = np.empty((steps, n, GRU_GATES * h), dtype)
        dhw = np.empty((steps, n, GRU_GATES * h), dtype)
        carry, through_w = np.zeros((n, h), dtype), np.empty((n, h), dtype)
        if n * GRU_GATES * h * h <= SMALL_PRODUCT:
            kernels.compiled(kernels.gru_sequence_backward, dtype)(
                upstream, states, h0, np.ascontiguousarray(w_hh), carry, through_w, dxp, dhw)
        else:
            run = kernels.compiled(kernels.gru_rows_backward, dtype)
            panels = _packed(w_hh)

            def rows(first: int, stop: int) -> None:
                run(upstream, states, h0, panels, tiles.edge_buffer(panels), carry,
                    through_w, dxp, dhw, first, stop)

            _over_rows(n, GRU_GATES * h * h, rows)
        grads = (dxp, carry, self._weight_grad(dhw, h0, states, _wants(needed, 2)),
                 dhw.reshape(steps * n, GRU_GATES * h).sum(axis=0))
        return _only_needed(grads, needed)

    @staticmethod
    def _weight_grad(da: np.ndarray, h0: np.ndarray, y: np.ndarray,
                     wanted: bool) -> np.ndarray | None:
        """The recurrent weight's gradient, da[t]^T h_{t-1} summed over steps: one GEMM
        over all T N rows."""
        if not wanted:
            return None
        steps, n, width = da.shape
        h_prev = np.concatenate([h0[None], y[0, :steps - 1]]) if steps else y[0]
        return gemm.c_product(da.reshape(steps * n, width).T,
                              h_prev.reshape(steps * n, y.shape[-1]))


def _saved(states: np.ndarray, count: int) -> np.ndarray | None:
    """The whole state array (count, T, N, H) whose leading slots `states` are (the view
    CpuRecurrentOps' forward returns), or None where `states` is not such a view (a
    copy, or another backend's result)."""
    whole = states.base
    if (not isinstance(whole, np.ndarray) or whole.ndim != 4 or whole.shape[0] != count
            or whole.shape[1:] != states.shape[-3:] or whole.dtype != states.dtype
            or not whole.flags.c_contiguous or states.strides[-3:] != whole.strides[1:]):
        return None
    first = states.__array_interface__["data"][0]
    return whole if first == whole.__array_interface__["data"][0] else None


def _packed(w: np.ndarray) -> np.ndarray:
    """w packed once for a recurrence's per-step products (pullback.kernels.tiles: a
    few rows at a time, where BLAS would repack w per call), which its row kernels run
    between steps without returning to Python."""
    return tiles.pack(w).panels


def _over_rows(n: int, row_macs: int, rows: Callable[[int, int], None]) -> None:
    """rows(first, stop) over the batch's n rows, whose step products take `row_macs`
    multiply-adds a row: split over the cores where SPLIT_MACS says (a sequence's rows
    are independent, so each part runs all T steps of its rows, with no wait between
    steps: split.over_parts); else whole, on this thread."""
    parts = len(split.parts(n))
    least = n // parts
    if parts > 1 and least >= tiles.MR and least * row_macs >= SPLIT_MACS:
        split.over_parts(n, rows)
    else:
        rows(0, n)


def _wants(needed: tuple[bool, ...] | None, index: int) -> bool:
    return needed is None or bool(needed[index])


def _only_needed(grads: tuple[np.ndarray | None, ...], needed: tuple[bool, ...] | None
                 ) -> tuple[np.ndarray | None, ...]:
    return grads if needed is None else tuple(g if wanted else None
                                              for g, wanted in zip(grads, needed))


def recurrent_ops(backend: Backend) -> RecurrentOps:
    """The backend's recurrent ops: its own, or the defaults written in its forward ops."""
    return backend if isinstance(backend, RecurrentOps) else _Defaults(backend)


class _Defaults(RecurrentOps):
    """RecurrentOps' defaults over the forward ops of a backend without RecurrentOps."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)
