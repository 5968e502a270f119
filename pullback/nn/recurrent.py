"""Recurrent layers: LSTM and GRU, PyTorch's gate orders, parameter names and init.

Per layer, the input of every step is projected by one matmul up front; the time
loop is one primitive (`ops.lstm_sequence` / `ops.gru_sequence`), whose result holds
every step's states. Differences from PyTorch: `batch_first`
defaults to True (pullback's API), and there is no dropout, bidirectional or
proj_size.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .. import ops
from ..errors import KernelError
from ..ops.hints import DTypeLike, TensorLike
from ..tensor import Tensor
from .layers import check_sizes, uniform
from .module import Module


class _Recurrent(Module):
    """What LSTM and GRU share: parameters per layer, input and state checks, layout."""

    gates: int  # gate blocks per weight: 4 (LSTM) or 3 (GRU)
    # Layer 0's input weight; every layer's parameters are set by name (`_layer` reads them).
    weight_ih_l0: Tensor

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = True, dtype: DTypeLike = np.float32
                 ) -> None:
        super().__init__()
        name = type(self).__name__
        check_sizes(name, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers)
        if num_layers < 1 or hidden_size < 1:
            raise ValueError(f"{name}: hidden_size and num_layers must be at least 1, got "
                             f"{hidden_size} and {num_layers}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first = bool(bias), bool(batch_first)
        rows, bound = self.gates * hidden_size, 1.0 / math.sqrt(hidden_size)
        # PyTorch's order and names: weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0, ...
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size
            setattr(self, f"weight_ih_l{layer}", uniform((rows, width), bound, dtype))
            setattr(self, f"weight_hh_l{layer}", uniform((rows, hidden_size), bound, dtype))
            if bias:
                setattr(self, f"bias_ih_l{layer}", uniform((rows,), bound, dtype))
                setattr(self, f"bias_hh_l{layer}", uniform((rows,), bound, dtype))

    def _layer(self, layer: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        get = getattr
        return (get(self, f"weight_ih_l{layer}"), get(self, f"weight_hh_l{layer}"),
                get(self, f"bias_ih_l{layer}", None), get(self, f"bias_hh_l{layer}", None))

    def _time_major(self, x: TensorLike) -> tuple[Tensor | NDArray[Any], bool]:
        """x as (T, N, input_size) and whether it came unbatched, or a KernelError."""
        name = type(self).__name__
        x = x if isinstance(x, Tensor) else np.asarray(x)
        shape, dtype = tuple(x.shape), np.dtype(x.dtype)
        layout = "(N, T, input_size)" if self.batch_first else "(T, N, input_size)"
        if len(shape) not in (2, 3):
            raise KernelError(name, (x,), f"expected a 3-D input {layout} or a 2-D unbatched "
                              f"input (T, input_size), got {len(shape)}-D")
        if shape[-1] != self.input_size:
            raise KernelError(name, (x,), f"input has {shape[-1]} features in its last axis "
                              f"but input_size is {self.input_size}")
        if dtype != self.weight_ih_l0.dtype:
            raise KernelError(name, (x, self.weight_ih_l0), "input and parameters must share "
                              "one dtype (convert the input, or the module with its dtype)")
        if shape[-2 if self.batch_first or len(shape) == 2 else 0] == 0:
            raise KernelError(name, (x,), "the sequence length must be at least 1")
        if len(shape) == 2:  # unbatched: (T, input_size), batch_first or not, as PyTorch
            return ops.reshape(x, (shape[0], 1, shape[1])), True
        return (ops.transpose(x, (1, 0, 2)) if self.batch_first else x), False

    def _states(self, x: Tensor | NDArray[Any], given: Tensor | None, unbatched: bool,
                what: str) -> list[TensorLike]:
        """Per layer, the initial state (N, H): from `given` (num_layers, N, H), or
        (num_layers, H) for an unbatched input, or zeros."""
        n, h = x.shape[1], self.hidden_size
        if given is None:
            zeros = np.zeros((n, h), self.weight_ih_l0.dtype)
            return [zeros] * self.num_layers
        want = (self.num_layers, h) if unbatched else (self.num_layers, n, h)
        if tuple(given.shape) != want:
            raise KernelError(type(self).__name__, (x, given), f"{what} must have shape "
                              f"(num_layers, {'' if unbatched else 'N, '}hidden_size) = {want}")
        if unbatched:
            given = ops.reshape(given, (self.num_layers, 1, h))
        return [ops.getitem(given, layer) for layer in range(self.num_layers)]

    def _output(self, out: Tensor, unbatched: bool) -> Tensor:
        if unbatched:
            return ops.reshape(out, (out.shape[0], out.shape[2]))
        return ops.transpose(out, (1, 0, 2)) if self.batch_first else out

    def _final(self, states: list[Tensor], unbatched: bool) -> Tensor:
        stacked = ops.stack(states, 0)
        return ops.reshape(stacked, (self.num_layers, self.hidden_size)) if unbatched \
            else stacked

    @staticmethod
    def _project(x: TensorLike, w_ih: Tensor, bias: Tensor | None) -> Tensor:
        # Every step's input projection in one matmul.
        xp = ops.matmul(x, ops.swap_last(w_ih))
        return xp if bias is None else ops.add(xp, bias)

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        if not self.bias:
            text += ", bias=False"
        return text + f", batch_first={self.batch_first}"


class LSTM(_Recurrent):
    """Long short-term memory, as torch.nn.LSTM: gates i f g o, c' = f c + i g,
    h' = o tanh(c'). `forward(input, hx=None)` returns `(output, (h_n, c_n))`: output
    (N, T, H) (batch_first) or (T, N, H), states (num_layers, N, H); an unbatched
    input (T, input_size) gives (T, H) and (num_layers, H)."""

    gates = 4

    def forward(self, input: TensorLike, hx: tuple[Tensor, Tensor] | None = None
                ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        x: Tensor | NDArray[Any]
        x, unbatched = self._time_major(input)
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise TypeError("LSTM: hx must be a pair (h_0, c_0)")
        h0s = self._states(x, None if hx is None else hx[0], unbatched, "h_0")
        c0s = self._states(x, None if hx is None else hx[1], unbatched, "c_0")
        hs: list[Tensor] = []
        cs: list[Tensor] = []
        for layer in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = self._layer(layer)
            bias = None if b_ih is None or b_hh is None else ops.add(b_ih, b_hh)
            y = ops.lstm_sequence(self._project(x, w_ih, bias), h0s[layer], c0s[layer], w_hh)
            x = out = ops.getitem(y, 0)  # the next layer's input; the last one's is the output
            hs.append(ops.getitem(y, (0, -1)))
            cs.append(ops.getitem(y, (1, -1)))
        return self._output(out, unbatched), (self._final(hs, unbatched),
                                            self._final(cs, unbatched))


class GRU(_Recurrent):
    """Gated recurrent unit, as torch.nn.GRU: gates r z n, n = tanh(W_in x + b_in +
    r (W_hn h + b_hn)), h' = (1 - z) n + z h. `forward(input, hx=None)` returns
    `(output, h_n)`, shapes as LSTM's."""

    gates = 3

    def forward(self, input: TensorLike, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x: Tensor | NDArray[Any]
        x, unbatched = self._time_major(input)
        h0s = self._states(x, hx, unbatched, "hx")
        hs: list[Tensor] = []
        for layer in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = self._layer(layer)
            # The recurrent bias sits inside r * (...): without biases, zeros stand in.
            recurrent_bias: TensorLike = b_hh if b_hh is not None else np.zeros(
                (self.gates * self.hidden_size,), w_hh.dtype)
            x = out = ops.gru_sequence(self._project(x, w_ih, b_ih), h0s[layer], w_hh,
                                       recurrent_bias)  # the next layer's input
            hs.append(ops.getitem(out, -1))
        return self._output(out, unbatched), self._final(hs, unbatched)
