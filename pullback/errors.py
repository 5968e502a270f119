"""The errors layer: the exception types every layer raises, importing nothing.

Every invalid op call, from a backend kernel or from an op's shape rule, raises
`KernelError` naming the op as the public API spells it, the shapes as Python
prints them, and the dtypes: "matmul: (3, 4) and (5, 2): inner dimensions 4
and 5 differ (dtypes float32 and float32)".
"""

from __future__ import annotations

from typing import Any


def describe(value: Any) -> tuple[Any, str]:
    """(shape, dtype name) of an array, a tensor, an abstract value or a scalar."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None:
        return (), type(value).__name__
    return tuple(shape), str(dtype)


class KernelError(ValueError):
    """An op was called with shapes, dtypes or arguments it does not accept."""

    def __init__(self, op: str, operands: tuple | list, reason: str):
        self.op = op
        described = [describe(v) for v in operands]
        self.shapes = tuple(s for s, _ in described)
        self.dtypes = tuple(d for _, d in described)
        self.reason = reason
        shapes = " and ".join(str(s) for s in self.shapes)
        dtypes = " and ".join(self.dtypes)
        head = f"{op}: {shapes}: " if described else f"{op}: "
        tail = f" (dtype{'s' if len(self.dtypes) > 1 else ''} {dtypes})" if described else ""
        super().__init__(f"{head}{reason}{tail}")


class KernelIndexError(KernelError, IndexError):
    """An index out of range: a KernelError that is also the IndexError Python's
    sequence protocols (and `except IndexError`) expect, as NumPy and PyTorch raise."""


def index_error(op: str, operands: tuple | list, reason: str, cause: Exception) -> KernelError:
    """The KernelError for a failed indexing: a KernelIndexError when `cause` is one."""
    cls = KernelIndexError if isinstance(cause, IndexError) else KernelError
    return cls(op, operands, reason)
