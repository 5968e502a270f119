"""Eager forward+backward of a chain of 100 small elementwise ops (shape (4,)).

Measures per-op Python overhead: pullback against PyTorch, against NumPy
written by hand (forward and backward ufunc calls, no framework) and, when it
is installed (`pip install autograd`), HIPS autograd, in one run on the same
data. Run: `python bench/chain.py`.
"""

from __future__ import annotations

import sys

from common import best_time, pin_threads

pin_threads(2)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import pullback as pb  # noqa: E402

N_OPS = 100  # mul, add, tanh, sigmoid repeated; the closing sum is not counted


def pullback_step(x0: np.ndarray) -> None:
    x = pb.tensor(x0, requires_grad=True)
    y = x
    for _ in range(N_OPS // 4):
        y = pb.sigmoid(pb.tanh(y * 1.01 + 0.1))
    y.sum().backward()


def torch_step(x0: torch.Tensor) -> None:
    x = x0.detach().requires_grad_(True)
    y = x
    for _ in range(N_OPS // 4):
        y = torch.sigmoid(torch.tanh(y * 1.01 + 0.1))
    y.sum().backward()


def numpy_step(x0: np.ndarray) -> None:
    saved = []
    y = x0
    for _ in range(N_OPS // 4):
        t = np.tanh(y * np.float32(1.01) + np.float32(0.1))
        s = 1.0 / (1.0 + np.exp(-t))
        saved.append((t, s))
        y = s
    g = np.ones_like(y)
    for t, s in reversed(saved):
        g = g * s * (1 - s)
        g = g * (1 - t * t)
        g = g * np.float32(1.01)


def autograd_step_maker() -> object:
    """HIPS autograd has no sigmoid primitive: a second tanh keeps the op count."""
    try:
        import autograd.numpy as anp
        from autograd import grad
    except ImportError:
        return None

    def f(x: np.ndarray) -> float:
        y = x
        for _ in range(N_OPS // 4):
            y = anp.tanh(anp.tanh(y * 1.01 + 0.1))
        return anp.sum(y)

    return grad(f)


def main() -> int:
    torch.set_num_threads(2)
    x0 = np.random.default_rng(0).standard_normal(4).astype(np.float32)
    xt = torch.from_numpy(x0.copy())
    times = {
        "pullback": best_time(lambda: pullback_step(x0)),
        "pytorch": best_time(lambda: torch_step(xt)),
        "numpy by hand": best_time(lambda: numpy_step(x0)),
    }
    autograd_grad = autograd_step_maker()
    if autograd_grad is not None:
        times["hips autograd"] = best_time(lambda: autograd_grad(x0))
    print(f"eager forward+backward, chain of {N_OPS} elementwise ops on shape (4,), float32")
    for name, t in times.items():
        print(f"  {name:14s} {t * 1e6 / N_OPS:6.2f} us per op")
    print(f"  ratio pullback / pytorch: {times['pullback'] / times['pytorch']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
