"""einsum, composed from transpose, reshape, getitem (for diagonals), sum, broadcast_to
and matmul: its gradients and higher derivatives are theirs, and a plan lowers it as
those ops. Operands are contracted left to right, two at a time, each pair as one
(batched) matmul after summing out the subscripts no later term needs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import KernelError
from .hints import TensorLike
from .linalg import matmul
from .reduce import sum as reduce_sum
from .registry import dtype_of, is_float, shape_of
from .shape import broadcast_to, getitem, reshape, transpose

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["einsum"]

_ELLIPSIS_BASE = 0x2460  # subscripts standing for the dimensions an ellipsis covers


class _Term:
    """An operand and the subscript of each of its axes."""

    def __init__(self, subscripts: str, value: Any):
        self.subscripts = subscripts
        self.value = value

    def sizes(self) -> dict[str, int]:
        return dict(zip(self.subscripts, shape_of(self.value), strict=True))


def einsum(spec: str, *operands: TensorLike | Sequence[TensorLike]) -> Tensor:
    """Einstein summation as torch.einsum: `einsum("bij,bjk->bik", a, b)`; without "->"
    the output has the subscripts that appear once, in alphabetical order. "..." stands
    for the dimensions the subscripts do not name (broadcast against each other);
    a subscript repeated in one operand takes its diagonal; dimensions of size 1
    broadcast. A list of operands is accepted too."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(spec, str):
        raise KernelError("einsum", operands, f"the equation must be a string, not {spec!r}")
    if not operands:
        raise KernelError("einsum", (), "needs at least one operand")
    floats = {str(dtype_of(x)) for x in operands if is_float(dtype_of(x))}
    if len(floats) > 1:
        raise KernelError("einsum", operands, "operands have different floating dtypes; cast "
                          "one with astype")
    subscripts, output = _parse(spec, operands)
    terms = [_diagonals(_Term(s, x), operands) for s, x in zip(subscripts, operands, strict=True)]
    sizes = _sizes(terms, operands)
    for term in terms:
        shape = tuple(sizes[c] for c in term.subscripts)
        if shape != shape_of(term.value):  # size-1 dimensions broadcast
            term.value = broadcast_to(term.value, shape)
    result = terms[0]
    for i in range(1, len(terms)):
        later = set(output).union(*(t.subscripts for t in terms[i + 1:]))
        left = _sum_out(result, later | set(terms[i].subscripts))
        right = _sum_out(terms[i], later | set(left.subscripts))
        result = _contract(left, right, later, sizes)
    result = _sum_out(result, set(output))
    return transpose(result.value, tuple(result.subscripts.index(c) for c in output))


def _parse(spec: str, operands: tuple[Any, ...]) -> tuple[list[str], str]:
    """Each operand's subscripts and the output's, with an ellipsis spelled out as one
    subscript per dimension it covers (right-aligned across operands, as broadcasting)."""
    spec = spec.replace(" ", "")
    lhs, arrow, rhs = spec.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise KernelError("einsum", operands, f"the equation {spec!r} names {len(terms)} "
                          f"operands, but {len(operands)} were given")
    covered = []
    for i, (term, x) in enumerate(zip(terms, operands, strict=True)):
        named = _letters(term, spec, operands)
        ndim = len(shape_of(x))
        if "..." in term and ndim >= len(named):
            covered.append(ndim - len(named))
        elif "..." not in term and ndim == len(named):
            covered.append(0)
        else:
            raise KernelError("einsum", operands, f"operand {i} has {ndim} dimensions, but "
                              f"its subscripts {term!r} name {len(named)}")
    width = max(covered)
    dots = "".join(chr(_ELLIPSIS_BASE + i) for i in range(width))
    subscripts = [term.replace("...", dots[width - n:]) for term, n in zip(terms, covered)]
    if arrow:
        named = _letters(rhs, spec, operands)
        if len(set(named)) != len(named):
            raise KernelError("einsum", operands, f"the output {rhs!r} repeats a subscript")
        known = set("".join(terms))
        unknown = [c for c in named if c not in known]
        if unknown:
            raise KernelError("einsum", operands, f"the output subscript {unknown[0]!r} is not "
                              "among the operands'")
        if "..." in rhs:
            return subscripts, rhs.replace("...", dots)
        if width:
            raise KernelError("einsum", operands, "the operands have '...' but the output "
                              "does not")
        return subscripts, rhs
    letters = "".join(terms).replace(".", "")
    return subscripts, dots + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))


def _letters(term: str, spec: str, operands: tuple[Any, ...]) -> str:
    rest = term.replace("...", "", 1)
    if not all(c.isascii() and c.isalpha() for c in rest):
        raise KernelError("einsum", operands, f"cannot read {spec!r}: subscripts are letters, "
                          "with at most one '...' per term")
    return rest


def _diagonals(term: _Term, operands: tuple[Any, ...]) -> _Term:
    """A subscript repeated in one operand takes the diagonal over those axes."""
    subs = term.subscripts
    for c in dict.fromkeys(subs):
        while subs.count(c) > 1:
            first = subs.index(c)
            second = subs.index(c, first + 1)
            shape = shape_of(term.value)
            if shape[first] != shape[second]:
                raise KernelError("einsum", operands, f"subscript {c!r} repeats over axes of "
                                  f"sizes {shape[first]} and {shape[second]}")
            others = [a for a in range(len(subs)) if a not in (first, second)]
            moved = transpose(term.value, (first, second, *others))
            diagonal = np.arange(shape[first])
            term.value = getitem(moved, (diagonal, diagonal))
            subs = c + "".join(subs[a] for a in others)
    term.subscripts = subs
    return term


def _sizes(terms: list[_Term], operands: tuple[Any, ...]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for term in terms:
        for c, n in term.sizes().items():
            if sizes.get(c, 1) not in (1, n) and n != 1:
                shown = "..." if ord(c) >= _ELLIPSIS_BASE else repr(c)
                raise KernelError("einsum", operands, f"subscript {shown} has sizes "
                                  f"{sizes[c]} and {n}, which do not broadcast")
            sizes[c] = n if sizes.get(c, 1) == 1 else sizes[c]
    return sizes


def _sum_out(term: _Term, keep: set[str]) -> _Term:
    axes = tuple(a for a, c in enumerate(term.subscripts) if c not in keep)
    if not axes:
        return term
    return _Term("".join(c for c in term.subscripts if c in keep),
                 reduce_sum(term.value, axes))


def _contract(left: _Term, right: _Term, later: set[str], sizes: dict[str, int]) -> _Term:
    """The two terms multiplied and summed over the subscripts they share that no later
    term needs, as one matmul of (batch, rows, shared) by (batch, shared, columns)."""
    shared = [c for c in left.subscripts if c in right.subscripts]
    batch = "".join(c for c in shared if c in later)
    summed = "".join(c for c in shared if c not in later)
    rows = "".join(c for c in left.subscripts if c not in right.subscripts)
    cols = "".join(c for c in right.subscripts if c not in left.subscripts)

    def size(subs: str) -> int:
        return int(np.prod([sizes[c] for c in subs], dtype=np.int64))

    def arranged(term: _Term, order: str, shape: tuple[int, ...]) -> Tensor:
        perm = tuple(term.subscripts.index(c) for c in order)
        return reshape(transpose(term.value, perm), shape)

    lead = (size(batch),) if batch else ()
    a = arranged(left, batch + rows + summed, lead + (size(rows), size(summed)))
    b = arranged(right, batch + summed + cols, lead + (size(summed), size(cols)))
    out = batch + rows + cols
    return _Term(out, reshape(matmul(a, b), tuple(sizes[c] for c in out)))
