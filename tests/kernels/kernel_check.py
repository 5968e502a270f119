"""Helpers for the kernel tests: sizes, tolerances, a float64 elementwise reference,
and a central-difference vector-Jacobian check for backward kernels."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from conftest import TEST_PARALLEL_THRESHOLD

SMALL = (3, 5)
LARGE = (40, 1024)  # 40960 elements: above the tests' threshold, so calls run in parallel
assert np.prod(LARGE) >= TEST_PARALLEL_THRESHOLD
# float32 kernels compute in float32; against a float64 reference a few ulp is expected.
TOL = {np.float32: {"rtol": 2e-6, "atol": 2e-7}, np.float64: {"rtol": 1e-13, "atol": 1e-15}}


def elementwise(fn: Callable, *arrays: np.ndarray) -> np.ndarray:
    """A kernel's Python body applied element by element in float64 (the reference)."""
    wide = np.broadcast_arrays(*[np.asarray(a, dtype=np.float64) for a in arrays])
    flat = [w.reshape(-1) for w in wide]
    values = [fn(*(float(f[i]) for f in flat)) for i in range(flat[0].size)]
    return np.array(values, dtype=np.float64).reshape(wide[0].shape)


def vjp_check(forward: Callable, backward_grads: Callable, inputs: list[np.ndarray],
              wrt: list[int], rng: np.random.Generator, eps: float = 1e-6,
              rtol: float = 1e-7, atol: float = 1e-9) -> None:
    """<u, J v> by central differences of `forward` along a random v, against
    <backward(u), v>: the vector-Jacobian check, in float64. `forward` returns one
    array (or a tuple, whose first entry is checked); `backward_grads(u)` returns the
    gradients of the inputs listed in `wrt`."""
    out = forward(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    upstream = rng.standard_normal(out.shape)
    grads = backward_grads(upstream)
    for index, grad in zip(wrt, grads):
        direction = rng.standard_normal(inputs[index].shape)
        plus = list(inputs)
        minus = list(inputs)
        plus[index] = inputs[index] + eps * direction
        minus[index] = inputs[index] - eps * direction
        f_plus = forward(*plus)
        f_minus = forward(*minus)
        f_plus = f_plus[0] if isinstance(f_plus, tuple) else f_plus
        f_minus = f_minus[0] if isinstance(f_minus, tuple) else f_minus
        numeric = np.sum(upstream * (f_plus - f_minus)) / (2 * eps)
        analytic = np.sum(grad * direction)
        np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol,
                                   err_msg=f"input {index}")
