"""The op-by-op check behind `pullback check`.

Every primitive, on each backend and float dtype: gradcheck through the fused
backward kernels and, separately, through the rules (transpose of the JVP);
the derivative of the vjp (along random directions when its Jacobian is large, and on
the threaded backend, see FULL_SECOND_ORDER); and the adjoint test between jvp and vjp.
Primitives without a gradient only run forward, against NumPy where the
spec names a reference. Each primitive's spec is declared beside it in the ops
layer (`ops.checks.declare_check`); a primitive without one is a failure.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..backend import CpuBackend, ThreadedCpuBackend
from ..backend.current import use_backend
from ..ops import PRIMITIVES
from ..ops.checks import Spec
from ..tensor import Tensor, tensor
from ..tensor.backward import fused_kernels
from .gradcheck import adjoint_check, measure
from .problem import Finding, Problem

DTYPES = ("float32", "float64")

# The second derivative's whole Jacobian costs, per input element, a vjp of the vjp, a
# jvp of it and two differences of it: for conv2d's sample (a 64,080-entry Jacobian) that
# was half of the suite's `pullback check` time. Beyond this many entries it is compared
# along random directions instead, as PyTorch's gradgradcheck fast mode does; a failure
# there is still localized entry by entry. First derivatives are always compared whole.
# On the threaded backend, which splits every op of a sample over its threads (3-4x the
# time per evaluation), second derivatives are always compared along random
# directions: its kernels are the CPU backend's, compared whole at first order there
# and here, and its second derivatives whole on the CPU backend.
FULL_SECOND_ORDER = 20_000
FULL_SECOND_ORDER_BACKENDS = ("cpu",)


def _threaded() -> ThreadedCpuBackend:
    backend = ThreadedCpuBackend(num_threads=2)
    # The samples are small: split them anyway, so the threaded kernels are what runs.
    backend.parallel_threshold = 1
    return backend


BACKENDS: dict[str, Callable[[], Any]] = {"cpu": CpuBackend, "threaded": _threaded}


@dataclass(frozen=True)
class Row:
    """One line of the table: a check of one primitive on one backend and dtype."""

    op: str
    backend: str
    dtype: str
    check: str
    error: float | None
    tolerance: float | None
    passed: bool
    detail: str = ""


def declared_specs(primitives: Mapping[str, Any]) -> dict[str, Spec]:
    """The specs the primitives declare, by name; those without one are left out (and
    fail in `run_checks`)."""
    return {name: prim.check for name, prim in primitives.items() if prim.check is not None}


def run_checks(
    names: Iterable[str] | None = None,
    backends: Iterable[str] = ("cpu", "threaded"),
    *,
    primitives: Mapping[str, Any] | None = None,
    specs: Mapping[str, Spec] | None = None,
) -> list[Row]:
    """Check the named primitives (all of them by default) on the named backends, with
    the specs they declare unless `specs` replaces them."""
    primitives = PRIMITIVES if primitives is None else primitives
    specs = declared_specs(primitives) if specs is None else specs
    chosen = sorted(primitives) if names is None else list(dict.fromkeys(names))
    unknown = [n for n in chosen if n not in primitives]
    if unknown:
        raise KeyError(f"no primitive named {', '.join(map(repr, unknown))}; "
                       f"known: {', '.join(sorted(primitives))}")
    rows = []
    if names is None:
        rows += [Row(n, "-", "-", "spec", None, None, False, "a spec names no primitive")
                 for n in sorted(set(specs) - set(primitives))]
    for backend_name in backends:
        backend = BACKENDS[backend_name]()
        try:
            for name in chosen:
                if name not in specs:
                    rows.append(Row(name, backend_name, "-", "spec", None, None, False,
                                    "no sample inputs: declare them with "
                                    "pullback.ops.checks.declare_check beside the primitive"))
                    continue
                for dtype in DTYPES:
                    with use_backend(backend):
                        rows += _check_op(name, primitives[name], specs[name], backend_name,
                                          dtype)
        finally:
            close = getattr(backend, "close", None)
            if close is not None:
                close()
    return rows


def _check_op(name: str, prim: Any, spec: Spec, backend: str, dtype: str) -> list[Row]:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    arrays = [a.astype(dtype) if a.dtype.kind == "f" else a for a in spec.sample(rng)]
    seed = zlib.crc32(f"{name}/{dtype}".encode())

    def row(check: str, run: Callable[[], Finding | None]) -> Row:
        try:
            found = run()
        except Exception as err:  # a crash is a failure of this check, not of the table
            return Row(name, backend, dtype, check, None, None, False,
                       f"{type(err).__name__}: {err}")
        if found is None:
            return Row(name, backend, dtype, check, None, None, True)
        return Row(name, backend, dtype, check, found.error, found.allowed, found.passed,
                   "" if found.passed else found.message())

    if not prim.differentiable:
        return [row("forward", lambda: _forward(spec, arrays))]

    def grad(fused: bool, order: int = 1) -> Callable[[], Finding | None]:
        def run() -> Finding | None:
            with fused_kernels(fused):
                mode = _second_order_mode(backend, spec, arrays) if order == 2 else "full"
                return measure(spec.fn, arrays, seed=seed, mode=mode, order=order,
                               min_order=order)

        return run

    rows = [row("grad", grad(True))]
    if prim.vjp is not None:
        rows.append(row("grad-rules", grad(False)))
    if spec.order >= 2:
        rows.append(row("grad2", grad(True, order=2)))
    rows.append(row("adjoint", lambda: adjoint_check(spec.fn, arrays, seed=seed)))
    return rows


def _second_order_mode(backend: str, spec: Spec, arrays: list[np.ndarray]
                       ) -> Literal["fast", "full"]:
    """How a second derivative is compared: whole, or along random directions (see
    FULL_SECOND_ORDER)."""
    if backend not in FULL_SECOND_ORDER_BACKENDS:
        return "fast"
    return "full" if Problem(spec.fn, arrays).jacobian_size <= FULL_SECOND_ORDER else "fast"


def _forward(spec: Spec, arrays: list[np.ndarray]) -> Finding | None:
    """Run forward; with a reference, count the elements that differ from NumPy's."""
    out = spec.fn(*[tensor(a, dtype=a.dtype) for a in arrays])
    if not isinstance(out, Tensor):
        raise TypeError(f"the forward returned {type(out).__name__}, not a tensor")
    if spec.reference is None:
        return None
    expected = np.asarray(spec.reference(*arrays))
    got = out.numpy()
    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise AssertionError(f"forward gave shape {got.shape} and dtype {got.dtype}, NumPy "
                             f"gives {expected.shape} and {expected.dtype}")
    wrong = np.flatnonzero(got.ravel() != expected.ravel())
    first = int(wrong[0]) if wrong.size else 0
    where = f"element {np.unravel_index(first, got.shape)} (of {wrong.size} that differ)"
    return Finding("the forward", where, float(got.ravel()[first]),
                   float(expected.ravel()[first]), float(wrong.size), 0.0,
                   labels=("pullback", "NumPy"), against="NumPy's")


def format_table(rows: list[Row]) -> str:
    """The rows as an aligned table, then the failures' details."""
    header = ("op", "backend", "dtype", "check", "max error", "tolerance", "result")
    lines = [header] + [
        (r.op, r.backend, r.dtype, r.check, _number(r.error), _number(r.tolerance),
         "pass" if r.passed else "FAIL")
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            for line in lines]
    failures = [f"FAIL {r.op} on {r.backend}, {r.dtype}, {r.check}: {r.detail}"
                for r in rows if not r.passed]
    return "\n".join(text + ([""] + failures if failures else []))


def summary(rows: list[Row], seconds: float) -> str:
    failed = sum(not r.passed for r in rows)
    ops = len({r.op for r in rows})
    verdict = "all passed" if not failed else f"{failed} FAILED"
    return (f"pullback check: {len(rows)} checks of {ops} primitives, {len(rows) - failed} "
            f"passed, {verdict} ({seconds:.1f} s)")


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"
