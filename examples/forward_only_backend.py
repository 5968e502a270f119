"""Train on a backend that has forward ops only: BackwardOps' defaults supply every backward.

`NumpyForward` below implements, in plain NumPy, just the forward ops a small MLP
with a mean-squared-error loss calls. It has no backward kernel at all; pullback
derives each backward from the ops' derivative rules, run as forward ops on this
backend. The script trains the same model on `pb.CpuBackend()` (which has fused
backward kernels) and checks that both end with the same weights.

Run: python examples/forward_only_backend.py [--steps N]
"""

from __future__ import annotations

import argparse

import numpy as np

import pullback as pb
from pullback import nn, optim


class NumpyForward(pb.Backend):
    """Forward ops in NumPy; every other op raises a KernelError naming it."""

    name = "numpy-forward"

    # Creation and transfer.
    def asarray(self, data, dtype=None):
        return np.array(data, dtype=dtype)

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype)

    def ones(self, shape, dtype):
        return np.ones(shape, dtype)

    def full(self, shape, value, dtype=None):
        return np.full(shape, value, dtype)

    def to_numpy(self, x):
        return x

    # The arithmetic an MLP and its loss need, forward only.
    def add(self, a, b):
        return np.add(a, b)

    def sub(self, a, b):
        return np.subtract(a, b)

    def mul(self, a, b):
        return np.multiply(a, b)

    def div(self, a, b):
        return np.divide(a, b)

    def neg(self, x):
        return np.negative(x)

    def tanh(self, x):
        return np.tanh(x)

    def matmul(self, a, b, out=None):
        return np.matmul(a, b, out=out)

    def reduce_sum(self, x, axes, keepdims):
        return np.sum(x, axis=axes, keepdims=keepdims)

    def reshape(self, x, shape):
        return np.reshape(x, shape)

    def transpose(self, x, axes):
        return np.transpose(x, axes)

    def broadcast_to(self, x, shape):
        return np.broadcast_to(x, shape)

    def sum_to_shape(self, x, shape):
        lead = x.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
        return np.sum(x, axis=axes, keepdims=True).reshape(shape) if axes else x


def train(backend: pb.Backend, steps: int) -> nn.Module:
    """A small tanh MLP fitted to a fixed random regression by SGD, on `backend`."""
    with pb.use_backend(backend):
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
        rng = np.random.default_rng(1)  # the same start on every backend
        model.load_state_dict({name: rng.normal(0, 0.5, p.shape)
                               for name, p in model.named_parameters()})
        x = pb.tensor(np.random.default_rng(0).normal(size=(16, 4)))
        y = pb.tensor(np.sin(np.arange(16.0))[:, None])
        opt = optim.SGD(model.parameters(), lr=0.1)
        for step in range(steps):
            opt.zero_grad()
            loss = nn.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            if step in (0, steps - 1):
                print(f"{backend.name}: step {step} loss {loss.item():.4f}")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    steps = parser.parse_args().steps
    backend = NumpyForward()
    assert not isinstance(backend, pb.BackwardOps)  # no backward kernel of its own
    on_forward_only = train(backend, steps)
    on_cpu = train(pb.CpuBackend(), steps)
    difference = max(np.abs(a.numpy() - b.numpy()).max() for a, b in
                     zip(on_forward_only.parameters(), on_cpu.parameters()))
    print(f"largest weight difference from CpuBackend: {difference:.2e}")


if __name__ == "__main__":
    main()
