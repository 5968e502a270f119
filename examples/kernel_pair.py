"""Write a kernel pair: a forward kernel that names its backward kernel.

`softsign(x) = x / (1 + |x|)` is written once as scalar Python; `@kernel` compiles
it with Numba for float32 and float64 and applies it with NumPy broadcasting. Its
backward kernel takes `upstream` first, then what it reads, named as the forward's
parameter (`x`) or `forward_output`; pullback saves exactly that. Called on
tensors the forward is a trainable op. The script checks the pair three ways:
against NumPy on arrays, against the same function composed of pullback's ops
(whose gradient comes from their rules), and with `pb.gradcheck`.

Run: python examples/kernel_pair.py
"""

from __future__ import annotations

import numpy as np

import pullback as pb
from pullback.kernels import kernel


@kernel
def softsign_backward(upstream, x):
    d = 1.0 + abs(x)
    return upstream / (d * d)


@kernel(backward=softsign_backward)
def softsign(x):
    return x / (1.0 + abs(x))


def softsign_composed(x: pb.Tensor) -> pb.Tensor:
    """The same function from pullback's ops: its gradient comes from their rules."""
    return x / (1.0 + pb.abs(x))


def main() -> None:
    # On NumPy arrays a kernel is a compiled ufunc-like function.
    a = np.linspace(-3.0, 3.0, 7)
    np.testing.assert_allclose(softsign(a), a / (1 + np.abs(a)), rtol=1e-15)
    np.testing.assert_allclose(softsign_backward(np.ones_like(a), a),
                               1 / (1 + np.abs(a)) ** 2, rtol=1e-15)

    # On tensors it records; its backward kernel runs in reverse mode.
    x = pb.randn(4, 5, dtype=pb.float64, seed=0, requires_grad=True)
    (softsign(x) * pb.cos(x)).sum().backward()
    assert x.grad is not None  # backward() filled it (a type checker cannot know)
    by_kernel = x.grad.numpy()
    by_rules = pb.grad(lambda x: (softsign_composed(x) * pb.cos(x)).sum())(x.detach())
    difference = np.abs(by_kernel - by_rules.numpy()).max()
    print(f"kernel pair vs the rules: largest gradient difference {difference:.1e}")
    assert difference < 1e-12

    pb.gradcheck(lambda x: softsign(x).sum(), (x.detach(),))
    print("gradcheck passed")


if __name__ == "__main__":
    main()
