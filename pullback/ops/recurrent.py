"""lstm_sequence and gru_sequence: a recurrent layer's whole time loop as one primitive.

The layers (pullback.nn.recurrent) project every step's input with one matmul up
front and hand the recurrence to these: one node in a recorded graph or a plan, not
a dozen per step. lstm_sequence returns the hidden and cell states of every step, y
(2, T, N, H); gru_sequence the hidden states, y (T, N, H); the layers slice what they
return out of it.

Forward and backward run as the backend's `RecurrentOps` (CPU: a packed product and
a Numba kernel per step; the gates its backward reads are kept beside y, see
pullback.backend.recurrent). The JVP rules are written here in primitives, step by
step, the gates computed again from the states before them, so forward mode,
rule-derived gradients and second derivatives work as for every other op; the
backward kernels' defaults are those rules transposed, and the CPU kernels are tested
against them.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from ..ad import Zero, defjvp_full, defvjp
from ..backend.backward_ops import BackwardOps, derive_default
from ..backend.recurrent import (
    GRU_GATES,
    LSTM_GATES,
    LSTM_OUTPUTS,
    RecurrentOps,
    check_gru,
    check_lstm,
    recurrent_ops,
)
from .backward_defaults import rule_vjp
from .checks import declare_check, inputs, normal
from .elementwise import add, mul, sigmoid, sub, tanh
from .hints import TensorLike
from .linalg import matmul
from .registry import declare, dtype_of
from .shape import broadcast_to, getitem, scatter_add, stack, swap_last

if TYPE_CHECKING:
    from ..tensor import Tensor

#: Building blocks of nn.LSTM and nn.GRU, offered as `pullback.ops.<name>`, not `pb.<name>`.
__all__: list[str] = []


def _lstm_shape(xp: Any, h0: Any, c0: Any, w_hh: Any) -> tuple[Any, ...]:
    steps, n, h = check_lstm("lstm_sequence", xp, h0, c0, w_hh)
    return (LSTM_OUTPUTS, steps, n, h), dtype_of(xp)


def _gru_shape(xp: Any, h0: Any, w_hh: Any, b_hh: Any) -> tuple[Any, ...]:
    steps, n, h = check_gru("gru_sequence", xp, h0, w_hh, b_hh)
    return (steps, n, h), dtype_of(xp)


lstm_sequence_p = declare(
    "lstm_sequence",
    lambda backend, xp, h0, c0, w_hh: recurrent_ops(backend).lstm_sequence(xp, h0, c0, w_hh),
    _lstm_shape, saves_inputs=True, saves_output=True, aliasing="fresh")
gru_sequence_p = declare(
    "gru_sequence",
    lambda backend, xp, h0, w_hh, b_hh: recurrent_ops(backend).gru_sequence(xp, h0, w_hh, b_hh),
    _gru_shape, saves_inputs=True, saves_output=True, aliasing="fresh")


# ---------------------------------------------------------------- JVP rules


def _total(*terms: Any) -> Any:
    """The sum of the terms that are not None (a symbolic zero); None if all are."""
    found = [t for t in terms if t is not None]
    if not found:
        return None
    total = found[0]
    for t in found[1:]:
        total = add(total, t)
    return total


def _times(tangent: Any, primal: Any) -> Any:
    return None if tangent is None else mul(tangent, primal)


def _gates(a: Any, h: int, count: int) -> tuple[Any, ...]:
    """The `count` gate blocks (N, H) of a (N, count H) tangent, or Nones."""
    if a is None:
        return (None,) * count
    return tuple(getitem(a, (slice(None), slice(k * h, (k + 1) * h))) for k in range(count))


def _assemble(rows: list[list[Any]], shape: tuple[Any, ...]) -> Any:
    """The tangent of the states (K, T, N, H), or (T, N, H) for one row, from rows[k][t],
    each (N, H) or None (a zero): runs of steps stacked, placed into the states' shape
    where some are zero."""
    single = len(shape) == 3
    runs = []
    for k, row in enumerate(rows):
        t = 0
        while t < len(row):
            if row[t] is None:
                t += 1
                continue
            stop = t
            while stop < len(row) and row[stop] is not None:
                stop += 1
            index = slice(t, stop) if single else (k, slice(t, stop))
            runs.append((t, stop, index, stack(row[t:stop], 0)))
            t = stop
    if len(runs) == len(rows) and all(r[0] == 0 and r[1] == len(rows[0]) for r in runs):
        return runs[0][3] if single else stack([r[3] for r in runs], 0)
    return _total(*(scatter_add(block, index, shape) for _, _, index, block in runs))


def _active(tangents: tuple[Any, ...]) -> list[Any]:
    return [None if type(t) is Zero else t for t in tangents]


def _lstm_gates(x: Any, h_prev: Any, wt: Any, h: int) -> tuple[Any, ...]:
    """The gate activations i, f, g, o of a step from its projected input x (N, 4H),
    the state before it and the recurrent weight transposed."""
    i, f, g, o = _gates(add(x, matmul(h_prev, wt)), h, LSTM_GATES)
    return sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)


def _gru_gates(x: Any, h_prev: Any, wt: Any, b_hh: Any, h: int) -> tuple[Any, ...]:
    """The gate activations r, z, n and hn = W_hn h + b_hn of a step from its projected
    input x (N, 3H), the state before it, the recurrent weight transposed and bias."""
    (xr, xz, xn), (hr, hz, hn) = _gates(x, h, GRU_GATES), _gates(
        add(matmul(h_prev, wt), b_hh), h, GRU_GATES)
    r = sigmoid(add(xr, hr))
    return r, sigmoid(add(xz, hz)), tanh(add(xn, mul(r, hn))), hn


def _lstm_jvp(tangents: tuple[Any, ...], y: Any, operands: tuple[Any, ...]) -> Any:
    dxp, dh, dc, dw = _active(tangents)
    xp, h0, c0, w_hh = operands
    _, steps, _, h = y.shape
    wt, dwt = swap_last(w_hh), None if dw is None else swap_last(dw)
    rows: list[list[Any]] = [[] for _ in range(LSTM_OUTPUTS)]
    for t in range(steps):
        h_prev = h0 if t == 0 else getitem(y, (0, t - 1))
        c_prev = c0 if t == 0 else getitem(y, (1, t - 1))
        c = getitem(y, (1, t))
        i, f, g, o = _lstm_gates(getitem(xp, t), h_prev, wt, h)
        da = _total(None if dxp is None else getitem(dxp, t),
                    None if dh is None else matmul(dh, wt),
                    None if dwt is None else matmul(h_prev, dwt))
        dai, daf, dag, dao = _gates(da, h, LSTM_GATES)
        di = _times(dai, mul(i, sub(1.0, i)))
        df = _times(daf, mul(f, sub(1.0, f)))
        dg = _times(dag, sub(1.0, mul(g, g)))
        do = _times(dao, mul(o, sub(1.0, o)))
        dc = _total(_times(df, c_prev), _times(dc, f), _times(di, g), _times(dg, i))
        tc = tanh(c)
        dh = _total(_times(do, tc), _times(dc, mul(o, sub(1.0, mul(tc, tc)))))
        rows[0].append(dh)
        rows[1].append(dc)
    return _assemble(rows, tuple(y.shape))


def _gru_jvp(tangents: tuple[Any, ...], y: Any, operands: tuple[Any, ...]) -> Any:
    dxp, dh, dw, db = _active(tangents)
    xp, h0, w_hh, b_hh = operands
    steps, n, h = y.shape
    wt, dwt = swap_last(w_hh), None if dw is None else swap_last(dw)
    row: list[Any] = []
    for t in range(steps):
        h_prev = h0 if t == 0 else getitem(y, t - 1)
        r, z, g, hn = _gru_gates(getitem(xp, t), h_prev, wt, b_hh, h)
        dhw = _total(None if dh is None else matmul(dh, wt),
                     None if dwt is None else matmul(h_prev, dwt),
                     None if db is None else broadcast_to(db, (n, GRU_GATES * h)))
        dar, daz, dan = _gates(None if dxp is None else getitem(dxp, t), h, GRU_GATES)
        dhr, dhz, dhn = _gates(dhw, h, GRU_GATES)
        dr = _times(_total(dar, dhr), mul(r, sub(1.0, r)))
        dz = _times(_total(daz, dhz), mul(z, sub(1.0, z)))
        dg = _times(_total(dan, _times(dr, hn), _times(dhn, r)), sub(1.0, mul(g, g)))
        # h = g + z (h_prev - g)
        dh = _total(_times(dz, sub(h_prev, g)), _times(dg, sub(1.0, z)), _times(dh, z))
        row.append(dh)
    return _assemble([row], tuple(y.shape))


defjvp_full(lstm_sequence_p, _lstm_jvp)
defjvp_full(gru_sequence_p, _gru_jvp)


# ---------------------------------------------------------------- backward kernels


def _lstm_vjp(be: BackwardOps, g: Any, n: Any) -> tuple[Any, ...]:
    needed = tuple(p is not None for p in n.parents)
    xp, h0, c0, w_hh = n.inputs
    return recurrent_ops(be).lstm_sequence_backward(g, xp, h0, c0, w_hh, n.output, needed)


def _gru_vjp(be: BackwardOps, g: Any, n: Any) -> tuple[Any, ...]:
    needed = tuple(p is not None for p in n.parents)
    xp, h0, w_hh, b_hh = n.inputs
    return recurrent_ops(be).gru_sequence_backward(g, xp, h0, w_hh, b_hh, n.output, needed)


defvjp(lstm_sequence_p, _lstm_vjp)
defvjp(gru_sequence_p, _gru_vjp)
derive_default("lstm_sequence_backward", partial(rule_vjp, lstm_sequence_p),
               owner=RecurrentOps)
derive_default("gru_sequence_backward", partial(rule_vjp, gru_sequence_p), owner=RecurrentOps)


# ---------------------------------------------------------------- functions


def lstm_sequence(xp: TensorLike, h0: TensorLike, c0: TensorLike, w_hh: TensorLike) -> Tensor:
    """The LSTM's hidden and cell states y (2, T, N, H) (h and c per step) from the
    projected input xp (T, N, 4H) = x W_ih^T + b_ih + b_hh, the initial states h0, c0
    (N, H) and the recurrent weight w_hh (4H, H), PyTorch's gate order i f g o."""
    return lstm_sequence_p.bind(xp, h0, c0, w_hh)


def gru_sequence(xp: TensorLike, h0: TensorLike, w_hh: TensorLike, b_hh: TensorLike) -> Tensor:
    """The GRU's hidden states y (T, N, H) (h per step) from the projected input xp
    (T, N, 3H) = x W_ih^T + b_ih, h0 (N, H), w_hh (3H, H) and b_hh (3H,), PyTorch's
    gate order r z n."""
    return gru_sequence_p.bind(xp, h0, w_hh, b_hh)


# ---------------------------------------------------------------- samples for `pullback check`

# To first order: differentiating the rules of a T-step loop again records thousands of
# ops per evaluation; the op table holds their second derivatives to PyTorch's instead.
declare_check(lstm_sequence_p, lstm_sequence,
              inputs(normal(2, 1, 8), normal(1, 2), normal(1, 2), normal(8, 2)), order=1)
declare_check(gru_sequence_p, gru_sequence,
              inputs(normal(2, 1, 6), normal(1, 2), normal(6, 2), normal(6)), order=1)
