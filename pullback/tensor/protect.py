"""Saved arrays are read-only while a pending backward needs them (rule 6).

Recording a node marks each array it saves as not writeable, so a write
through a tensor or through `.numpy()` raises at the write. The mark is
counted (one array may be saved by several nodes) and lifted when the last
node that saved it is released or freed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ad import Node

# id(array) -> [count, name of the first op that saved it]
_protected: dict[int, list] = {}


def protect(array: Any, op: str) -> None:
    if type(array) is not np.ndarray:
        return
    entry = _protected.get(id(array))
    if entry is not None:
        entry[0] += 1
        return
    if not array.flags.writeable:
        return  # read-only already (a broadcast view, a user's frozen array): not ours to lift
    array.flags.writeable = False
    _protected[id(array)] = [1, op]


def unprotect(array: Any) -> None:
    entry = _protected.get(id(array))
    if entry is None:
        return
    if entry[0] > 1:
        entry[0] -= 1
        return
    del _protected[id(array)]
    array.flags.writeable = True


def saved_by(array: Any) -> str | None:
    """The op whose pending backward keeps `array` read-only, if any."""
    entry = _protected.get(id(array))
    if entry is None and isinstance(array, np.ndarray) and array.base is not None:
        entry = _protected.get(id(array.base))
    return entry[1] if entry else None


class TensorNode(Node):
    """A recorded node whose saved arrays are protected until it is released or freed."""

    __slots__ = ()

    def protect_saved(self) -> None:
        name = self.primitive.name
        if self.inputs is not None:
            for array in self.inputs:
                protect(array, name)
        if self.output is not None:
            protect(self.output, name)

    def _unprotect_saved(self) -> None:
        if self.inputs is not None:
            for array in self.inputs:
                unprotect(array)
        if self.output is not None:
            unprotect(self.output)

    def release(self) -> None:
        self._unprotect_saved()
        super().release()

    def __del__(self) -> None:
        if self.inputs is not None or self.output is not None:
            self._unprotect_saved()
