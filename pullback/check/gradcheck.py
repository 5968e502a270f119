"""Gradient checking: a function's vjp and jvp against central differences.

`gradcheck` (`pb.gradcheck`) raises `GradcheckError` on a mismatch; `measure`
returns the worst comparison instead (the table behind `pullback check` shows
it); `adjoint_check` compares forward with reverse mode, no differences taken.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..tensor import jvp, vjp
from .problem import Finding, GradcheckError, Problem, Tolerance, worst

__all__ = ["Finding", "GradcheckError", "adjoint_check", "gradcheck", "measure"]

DIRECTIONS = 3  # random directions per fast check
FULL_LOCALIZE_LIMIT = 200_000  # Jacobian entries beyond which a fast failure is not localized

if TYPE_CHECKING:
    from ..ops.hints import TensorLike
    from ..tensor import Tensor

_DEFAULTS = {  # dtype: (eps, atol, rtol) for central differences
    "float32": (1e-3, 1e-3, 1e-2),
    "float64": (1e-6, 1e-7, 1e-5),
}
_ADJOINT = {"float32": (1e-7, 1e-5), "float64": (1e-15, 1e-12)}  # dtype: (atol, rtol)


def gradcheck(
    f: Callable[..., Tensor | Sequence[Tensor]],
    inputs: TensorLike | Sequence[object],
    *,
    eps: float | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    order: int = 1,
    mode: Literal["fast", "full"] = "fast",
) -> bool:
    """True if `f`'s vjp and jvp agree with central differences at `inputs`, else
    raise `GradcheckError` naming the input, the worst element and both values.

    `mode="fast"` compares along random directions (and, on a mismatch, builds
    the Jacobian to find the element); `mode="full"` builds the whole Jacobian.
    `order=2` also checks the derivatives of the vjp and of the jvp (along random
    directions). Non-floating inputs are passed to `f` unchanged and not checked.
    """
    found = measure(f, inputs, eps=eps, atol=atol, rtol=rtol, order=order, mode=mode)
    if found is not None and not found.passed:
        raise GradcheckError(found.message())
    return True


def measure(
    f: Callable[..., Tensor | Sequence[Tensor]],
    inputs: TensorLike | Sequence[object],
    *,
    eps: float | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    order: int = 1,
    mode: Literal["fast", "full"] = "fast",
    seed: int = 0,
    min_order: int = 1,
) -> Finding | None:
    """The worst comparison of derivatives of orders `min_order..order` (None if there
    was nothing to compare); raises `GradcheckError` for wrong gradient shapes or dtypes."""
    if mode not in ("fast", "full"):
        raise ValueError(f'gradcheck: mode must be "fast" or "full", not {mode!r}')
    if order < 1:
        raise ValueError(f"gradcheck: order must be at least 1, not {order}")
    problem = Problem(f, inputs)
    tol = _tolerance(problem, eps, atol, rtol)
    rng = np.random.default_rng(seed)
    return _measure(problem, tol, order, min_order, mode, rng, "")


def _tolerance(problem: Problem, eps: float | None, atol: float | None,
               rtol: float | None) -> Tolerance:
    d_eps, d_atol, d_rtol = _DEFAULTS[problem.lowest_precision]
    return Tolerance(eps if eps is not None else d_eps, atol if atol is not None else d_atol,
                     rtol if rtol is not None else d_rtol)


def _measure(problem: Problem, tol: Tolerance, order: int, min_order: int, mode: str,
             rng: np.random.Generator, label: str) -> Finding | None:
    found = []
    if min_order <= 1:
        check = _fast if mode == "fast" else _full
        found.append(check(problem, tol, rng, label))
    if order >= 2:
        for name, derivative in _derivatives(problem, rng):
            inner = Problem(derivative, problem.primals, numbers=problem.numbers)
            found.append(_measure(inner, tol, order - 1, min_order - 1, mode, rng,
                                  f"{label}the derivative of {name}: "))
    return worst(found)


def _derivatives(problem: Problem, rng: np.random.Generator) -> list[tuple[str, Callable]]:
    """The vjp (for a fixed random cotangent) and the jvp (for a fixed random tangent) as
    functions of the floating inputs, recorded so that they can themselves be
    differentiated, as HIPS autograd's check_grads recurses."""
    cotangent = problem.cotangent_arg(problem.random_outputs(rng))
    tangents = [t.astype(p.dtype)
                for t, p in zip(problem.random_inputs(rng), problem.primals, strict=True)]

    def reverse(*xs: Any) -> tuple:
        _, vjp_fn = vjp(problem, *xs)
        return tuple(vjp_fn(cotangent))

    def forward(*xs: Any) -> Any:
        _, tangent_out = jvp(problem, xs, tangents)
        return problem.floating(tangent_out)

    if not problem.has_forward_mode:
        return [("the vjp", reverse)]
    return [("the vjp", reverse), ("the jvp", forward)]


def _fast(problem: Problem, tol: Tolerance, rng: np.random.Generator,
          label: str) -> Finding | None:
    _, vjp_fn = vjp(problem, *problem.primals)
    found = []
    for _ in range(DIRECTIONS):
        u = problem.random_outputs(rng)
        norm = np.sqrt(sum(float(np.sum(c * c)) for c in u)) or 1.0
        u = [c / norm for c in u]
        v = problem.random_inputs(rng)
        plus, minus, step = problem.perturbed(v, tol.eps)
        out_plus, out_minus = problem.evaluate(plus), problem.evaluate(minus)
        differences = zip(u, out_plus, out_minus, strict=True)
        numerical = sum(float(np.sum(c * (p - m))) for c, p, m in differences) / (2 * tol.eps)
        noise = sum(float(np.sum(r)) for r in problem.rounding(u, out_plus, out_minus))
        noise /= 2 * tol.eps
        tangents = [s / (2 * tol.eps) for s in step]
        grads = problem.pullback(vjp_fn, u)
        reverse = sum(float(np.sum(g * t)) for g, t in zip(grads, tangents, strict=True))
        where = "a random direction (all inputs at once)"
        found.append(_scalar(f"{label}reverse mode (vjp)", where, reverse, numerical, noise, tol))
        if problem.has_forward_mode:
            pushed = problem.pushforward(tangents)
            forward = sum(float(np.sum(c * t)) for c, t in zip(u, pushed, strict=True))
            found.append(_scalar(f"{label}forward mode (jvp)", where, forward, numerical, noise,
                                 tol))
    result = worst(found)
    if result is not None and not result.passed and problem.jacobian_size <= FULL_LOCALIZE_LIMIT:
        located = _full(problem, tol, rng, label)
        if located is not None and not located.passed:
            return located
    return result


def _scalar(what: str, where: str, analytical: float, numerical: float, noise: float,
            tol: Tolerance) -> Finding:
    allowed = tol.atol + tol.rtol * max(abs(analytical), abs(numerical)) + noise
    return Finding(what, where, analytical, numerical, abs(analytical - numerical), allowed)


def _full(problem: Problem, tol: Tolerance, rng: np.random.Generator,
          label: str) -> Finding | None:
    """Compare the whole Jacobian, column by column from differences, row by row
    from the vjp and column by column from the jvp."""
    numerical, noise = problem.numerical_jacobian(tol.eps)
    reverse = problem.reverse_jacobian()
    forward = problem.forward_jacobian() if problem.has_forward_mode else None
    found = []
    for i in range(len(problem.primals)):
        modes = [("reverse mode (vjp)", reverse[i])]
        if forward is not None:
            modes.append(("forward mode (jvp)", forward[i]))
        for what, analytical in modes:
            found.append(_elementwise(problem, i, f"{label}{what}", analytical, numerical[i],
                                      noise[i], tol))
    return worst(found)


def _elementwise(problem: Problem, i: int, what: str, analytical: np.ndarray,
                 numerical: np.ndarray, noise: np.ndarray, tol: Tolerance) -> Finding | None:
    if analytical.size == 0:
        return None
    error = np.abs(analytical - numerical)
    allowed = tol.atol + tol.rtol * np.maximum(np.abs(analytical), np.abs(numerical)) + noise
    with np.errstate(divide="ignore", invalid="ignore"):  # atol=rtol=0 is allowed
        k, j = np.unravel_index(int(np.argmax(error / allowed)), error.shape)
    return Finding(what, problem.describe(i, int(j), int(k)), float(analytical[k, j]),
                   float(numerical[k, j]), float(error[k, j]), float(allowed[k, j]))


def adjoint_check(
    f: Callable[..., Tensor | Sequence[Tensor]],
    inputs: TensorLike | Sequence[object],
    *,
    atol: float | None = None,
    rtol: float | None = None,
    seed: int = 0,
) -> Finding | None:
    """The worst of `<ct, J t>` (jvp) against `<J^T ct, t>` (vjp) over random
    directions: forward and reverse mode must be each other's transpose."""
    problem = Problem(f, inputs)
    d_atol, d_rtol = _ADJOINT[problem.lowest_precision]
    tol = Tolerance(0.0, d_atol if atol is None else atol, d_rtol if rtol is None else rtol)
    rng = np.random.default_rng(seed)
    _, vjp_fn = vjp(problem, *problem.primals)
    found = []
    for _ in range(DIRECTIONS):
        u = problem.random_outputs(rng)
        t = [x.astype(p.dtype)
             for x, p in zip(problem.random_inputs(rng), problem.primals, strict=True)]
        pushed = problem.pushforward(t)
        grads = problem.pullback(vjp_fn, u)
        forward = [c * p for c, p in zip(u, pushed, strict=True)]
        reverse = [g * x.astype(np.float64) for g, x in zip(grads, t, strict=True)]
        scale = sum(float(np.sum(np.abs(a))) for a in forward + reverse)
        a = sum(float(np.sum(x)) for x in forward)
        b = sum(float(np.sum(x)) for x in reverse)
        allowed = tol.atol + tol.rtol * max(abs(a), abs(b), scale)
        found.append(Finding("reverse mode <vjp(ct), t>", "a random direction (all inputs at "
                             "once)", b, a, abs(a - b), allowed, labels=("vjp", "jvp"),
                             against="forward mode <ct, jvp(t)>"))
    return worst(found)

