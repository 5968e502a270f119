"""Write your own op in NumPy and verify its gradient with `pb.gradcheck`.

`SoftClip` squashes values smoothly into (-limit, limit): forward is
`limit * tanh(x / limit)`. Its backward reads only the saved output, since
d/dx = 1 - (y / limit)**2. The script checks the op with `pb.gradcheck`, shows
that a wrong backward is caught (the error names the input, the worst element
and both values), and trains through the op.

Run: python examples/custom_op.py [--steps N]
"""

from __future__ import annotations

import argparse

import numpy as np

import pullback as pb


class SoftClip(pb.CustomOp):
    """limit * tanh(x / limit), elementwise."""

    saves = ("output",)  # backward reads the output only; the input is not kept

    def __init__(self, limit: float = 2.0) -> None:
        self.limit = limit

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self.limit * np.tanh(x / self.limit)

    def backward(self, upstream: np.ndarray, inputs: tuple, output: np.ndarray) -> tuple:
        # One gradient per input, in the input's dtype.
        return (upstream * (1.0 - (output / self.limit) ** 2),)


class WrongSoftClip(SoftClip):
    """The same forward with a backward that forgot the square."""

    def backward(self, upstream: np.ndarray, inputs: tuple, output: np.ndarray) -> tuple:
        return (upstream * (1.0 - output / self.limit),)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    steps = parser.parse_args().steps

    # gradcheck compares the backward with central differences; float64 inputs keep
    # the differences accurate.
    x = pb.randn(3, 4, dtype=pb.float64, seed=0)
    pb.gradcheck(lambda x: SoftClip()(x * 3.0), (x,))
    print("gradcheck passed")

    try:
        pb.gradcheck(lambda x: WrongSoftClip()(x * 3.0), (x,))
    except pb.GradcheckError as error:
        print(f"wrong backward caught: {error}")
    else:
        raise SystemExit("the wrong backward was not caught")

    # The op records like any other: fit w so that SoftClip(w * x) matches a target.
    w = pb.tensor(0.1, dtype=pb.float64, requires_grad=True)
    inputs = pb.tensor(np.linspace(-1.0, 1.0, 9))
    target = SoftClip()(inputs * 1.5)
    for _ in range(steps):
        w.grad = None
        loss = ((SoftClip()(w * inputs) - target) ** 2).sum()
        loss.backward()
        assert w.grad is not None
        with pb.no_grad():
            w -= 0.5 * w.grad
    print(f"fitted w = {w.item():.4f} (target 1.5), final loss {loss.item():.2e}")


if __name__ == "__main__":
    main()
