"""What an editor and mypy see when a user calls pullback: `tests/test_types.py` type-checks
this file together with the package (it is never run). Each `assert_type` fails the check
when a public name's type changes; each `# type: ignore[...]` is an error mypy must still
report (unused ignores are errors here)."""

# mypy: warn-unused-ignores

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import pullback as pb
from pullback import nn, optim
from pullback.lower import Plan

if TYPE_CHECKING:
    from typing_extensions import assert_type

Tensor = pb.Tensor


def ops_and_methods(x: Tensor, a: np.ndarray) -> None:
    assert_type(pb.tanh(x), Tensor)
    assert_type(pb.tanh(a), Tensor)
    assert_type(pb.add(x, 1.0), Tensor)
    assert_type(pb.sum(x, axis=(0, 1), keepdims=True), Tensor)
    assert_type(pb.matmul(x, a), Tensor)
    assert_type(x.exp().sum(), Tensor)
    assert_type(x + 1, Tensor)
    assert_type(2.0 * x, Tensor)
    assert_type(x @ x, Tensor)
    assert_type(x[0], Tensor)
    assert_type(x.shape, tuple[int, ...])
    assert_type(x.reshape(2, -1).T, Tensor)
    assert_type(x.size(0), int)
    assert_type(x.item(), int | float)
    assert_type(x.grad, Tensor | None)
    assert_type(x.topk(2), tuple[Tensor, Tensor])
    pb.sum(x, axis="rows")  # type: ignore[arg-type]


def transforms(x: Tensor) -> None:
    def f(t: Tensor) -> Tensor:
        return (t * t).sum()

    assert_type(pb.grad(f)(x), Tensor)
    assert_type(pb.grad(f, argnums=(0,))(x), tuple[Tensor, ...])
    assert_type(pb.value_and_grad(f)(x), tuple[Tensor, Tensor])
    assert_type(pb.jvp(f, (x,), (x,)), tuple[Tensor, Tensor])
    pb.grad(f)(x, x)  # type: ignore[call-arg]
    out, vjp_fn = pb.vjp(f, x)
    assert_type(out, Tensor)
    assert_type(vjp_fn(pb.ones_like(out)), tuple[Tensor, ...])
    assert_type(pb.checkpoint(f)(x), Tensor)
    plan = pb.compile(f, x)
    assert_type(plan, Plan[Tensor])
    assert_type(plan(x), Tensor)

    @pb.no_grad()
    def g(t: Tensor, k: int) -> Tensor:
        return t * k

    assert_type(g(x, 2), Tensor)
    g(x, "2")  # type: ignore[arg-type]


def modules(x: Tensor) -> None:
    assert_type(nn.Dense(4, 3)(x), Tensor)
    assert_type(nn.LSTM(4, 5)(x), tuple[Tensor, tuple[Tensor, Tensor]])
    assert_type(nn.Sequential(nn.Dense(4, 3), nn.ReLU())(x), Tensor)
    assert_type(nn.Dense(4, 3).train(), nn.Dense)
    model: nn.Module = nn.Dense(4, 3)
    assert_type(model(x), Any)
    assert_type(model.state_dict(), dict[str, Tensor])
    nn.Dense(4, 3)(x, 3)  # type: ignore[call-arg]
    layers = nn.ModuleList([nn.Dense(4, 4), nn.Dense(4, 4)])
    assert_type(layers[0], nn.Dense)
    assert_type(layers[1](x), Tensor)
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    optimizer.zero_grad()
