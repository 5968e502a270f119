"""A graph trace's own copy of the parameter values its recorded graph saved.

A module's traced forward records a graph whose nodes save the arrays their rules
read, and saved arrays are read-only while a backward still needs them (rule 9).
When those arrays are the parameters' own, the explicit loop
`traced_forward; backprop; update` could not update the parameters while the
trace is alive, and `backprop` may be run again on the same trace. So the trace
takes the values it was made with: each saved parameter array (or view of one)
is replaced in the graph by the same view of a copy, and the parameters
themselves stay writeable, with their identity (plans and `.numpy()` views keep
seeing the live values).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..ad import toposort
from ..tensor import Tensor
from ..tensor.protect import protect, unprotect


def own_saved_parameters(output: object, params: list[Tensor]) -> None:
    """Point every node below `output` that saved a parameter's array (or a view of
    one) at a copy of it taken now, moving the read-only mark to the copy."""
    node = output._node if isinstance(output, Tensor) else None
    if node is None or not params:
        return
    live = {id(p._data): p._data for p in params}
    copies: dict[int, NDArray[Any] | None] = {}
    remapped: dict[int, NDArray[Any]] = {}

    def own(value: object, op: str) -> object:
        if type(value) is not np.ndarray:
            return value
        done = remapped.get(id(value))
        if done is not None:
            return done
        param = live.get(id(value))
        if param is None and value.base is not None:
            param = live.get(id(value.base))
        if param is None:
            return value
        copy = _copy_of(param, copies)
        if copy is None:
            return value  # a layout the copy cannot mirror: the parameter stays guarded
        offset = value.__array_interface__["data"][0] - param.__array_interface__["data"][0]
        mine = copy if value is param else np.ndarray(
            value.shape, value.dtype, buffer=copy, offset=offset, strides=value.strides)
        unprotect(value)
        protect(mine, op)
        remapped[id(value)] = mine
        return mine

    for n in toposort([node]):
        if n.primitive is None:
            continue
        name = n.primitive.name
        if n.inputs is not None:
            n.inputs = tuple(own(v, name) for v in n.inputs)
        if n.output is not None:
            n.output = own(n.output, name)


def _copy_of(param: NDArray[Any], copies: dict[int, NDArray[Any] | None]
             ) -> NDArray[Any] | None:
    key = id(param)
    if key not in copies:
        copy = param.copy(order="K")
        # A view of the copy is made at the view's byte offset, which needs one
        # contiguous block laid out exactly as the parameter is.
        same = copy.strides == param.strides and (copy.flags.c_contiguous
                                                  or copy.flags.f_contiguous)
        copies[key] = copy if same else None
    return copies[key]
