"""Saved arrays are read-only while a pending backward needs them (rule 6).

Recording a node marks each array it saves as not writeable, so a write
through a tensor or through `.numpy()` raises at the write. The mark is
counted (one array may be saved by several nodes) and lifted when the last
node that saved it is released or freed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..ad import Node

if TYPE_CHECKING:
    from numpy.typing import NDArray

# id(array) -> [count, name of the first op that saved it]
_protected: dict[int, list[Any]] = {}


def protect(array: NDArray[Any], op: str) -> None:
    """Make `array`, and the array it views if any, read-only on behalf of `op`."""
    base = array.base
    if base is not None and type(base) is np.ndarray:
        _protect_one(base, op)  # a write through the viewed array would change the view
    _protect_one(array, op)


def _protect_one(array: NDArray[Any], op: str) -> None:
    # Runs for every saved array of every recorded op: kept to a few dict operations.
    key = id(array)
    entry = _protected.get(key)
    if entry is not None:
        entry[0] += 1
    elif array.flags.writeable:
        array.setflags(write=False)
        _protected[key] = [1, op]
    # else: read-only already (a broadcast view, a user's frozen array): not ours to lift


def unprotect(array: NDArray[Any]) -> None:
    base = array.base
    if base is not None and type(base) is np.ndarray:
        _unprotect_one(base)  # first: a view can be writeable only if its base is
    _unprotect_one(array)


def _unprotect_one(array: NDArray[Any]) -> None:
    key = id(array)
    entry = _protected.get(key)
    if entry is None:
        return
    if entry[0] > 1:
        entry[0] -= 1
        return
    del _protected[key]
    try:
        array.setflags(write=True)
    except ValueError:
        return  # its base is still saved by another node: read-only until that one is done


def writeable_if_free(array: NDArray[Any]) -> bool:
    """Whether `array` may be written, lifting a stale read-only flag: a view made
    while its base was saved inherits the flag and keeps it after the base is freed."""
    if array.flags.writeable:
        return True
    base = array.base
    if id(array) in _protected or type(base) is not np.ndarray:
        return False
    if id(base) in _protected or not base.flags.writeable:
        return False
    try:
        array.flags.writeable = True
    except ValueError:
        return False  # read-only by nature (a broadcast view)
    return True


def saved_by(array: object) -> str | None:
    """The op whose pending backward keeps `array` read-only, if any."""
    entry = _protected.get(id(array))
    if entry is None and isinstance(array, np.ndarray) and array.base is not None:
        entry = _protected.get(id(array.base))
    return entry[1] if entry else None


class TensorNode(Node):
    """A recorded node whose saved arrays are protected until it is released or freed."""

    __slots__ = ()

    def release(self) -> None:
        # Inlined: this runs once per node in every backward.
        inputs = self.inputs
        if inputs is not None:
            if _protected:
                for array in inputs:
                    if type(array) is np.ndarray:
                        unprotect(array)
            self.inputs = None
        output = self.output
        if output is not None:
            if _protected:
                unprotect(output)
            self.output = None
        self.released = True

    def __del__(self) -> None:
        if self.inputs is not None or self.output is not None:
            self.release()
