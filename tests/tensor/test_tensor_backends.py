"""Choosing the backend (`get_backend`, `set_backend`, `use_backend`), and training on a
backend that has forward ops only: the rules supply every backward."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb

# CpuBackend's forward ops, and nothing of BackwardOps.
_FORWARD_OPS = {
    name: getattr(pb.CpuBackend, name)
    for name, value in vars(pb.Backend).items()
    if callable(value) and not name.startswith("_")
}
ForwardOnly = type("ForwardOnly", (pb.Backend,), {**_FORWARD_OPS, "name": "forward-only"})

RNG = np.random.default_rng(3)
X = RNG.standard_normal((5, 4))
PARAMS = (
    RNG.standard_normal((4, 6)),
    RNG.standard_normal(6),
    RNG.standard_normal((6, 3)),
)
LABEL_WEIGHTS = RNG.standard_normal((5, 3))


def _mlp_loss(w1, b1, w2):
    h = pb.relu(pb.matmul(pb.tensor(X), w1) + b1)
    logits = pb.tanh(h) @ w2
    p = pb.softmax(logits, axis=-1)
    return (p * pb.tensor(LABEL_WEIGHTS)).sum() + pb.log_softmax(logits).mean()


def test_forward_only_backend_has_no_backward_kernels() -> None:
    backend = ForwardOnly()
    assert not isinstance(backend, pb.BackwardOps)
    assert not hasattr(backend, "relu_backward")


@pytest.mark.parametrize("how", ["backward", "grad"])
def test_forward_only_backend_trains_like_the_cpu_backend(how) -> None:
    def gradients():
        if how == "grad":
            return pb.grad(_mlp_loss, argnums=(0, 1, 2))(*(pb.tensor(p) for p in PARAMS))
        params = [pb.tensor(p, requires_grad=True) for p in PARAMS]
        _mlp_loss(*params).backward()
        return [p.grad for p in params]

    with pb.use_backend(pb.CpuBackend()):
        reference = gradients()
    with pb.use_backend(ForwardOnly()) as backend:
        assert pb.get_backend() is backend
        got = gradients()
    for g, ref in zip(got, reference, strict=True):
        assert g.shape == ref.shape and g.dtype == ref.dtype
        np.testing.assert_allclose(g.numpy(), ref.numpy(), rtol=1e-12, atol=1e-12)
    assert any(np.abs(ref.numpy()).max() > 1e-3 for ref in reference)


def test_forward_only_backend_supports_second_derivatives() -> None:
    def f(x):
        return (pb.tanh(x) * pb.softmax(x)).sum()

    x0 = pb.tensor(X[0])
    reference = pb.grad(lambda x: pb.grad(f)(x).sum())(x0)
    with pb.use_backend(ForwardOnly()):
        got = pb.grad(lambda x: pb.grad(f)(x).sum())(x0)
    np.testing.assert_allclose(got.numpy(), reference.numpy(), rtol=1e-12, atol=1e-12)


def test_use_backend_restores_on_exit_and_on_exception() -> None:
    before = pb.get_backend()
    other = ForwardOnly()
    with pb.use_backend(other):
        assert pb.get_backend() is other
    assert pb.get_backend() is before
    with pytest.raises(KeyError), pb.use_backend(other):
        raise KeyError("inside")
    assert pb.get_backend() is before


def test_set_backend_replaces_the_current_backend() -> None:
    before = pb.get_backend()
    other = ForwardOnly()
    try:
        pb.set_backend(other)
        assert pb.get_backend() is other
        assert (pb.tensor([1.0, 2.0]) * 2.0).numpy().tolist() == [2.0, 4.0]
    finally:
        pb.set_backend(before)
    assert pb.get_backend() is before


@pytest.mark.parametrize(
    "choose",
    [pb.set_backend, lambda backend: pb.use_backend(backend).__enter__()],
    ids=["set_backend", "use_backend"],
)
def test_choosing_something_that_is_not_a_backend_raises(choose) -> None:
    before = pb.get_backend()
    with pytest.raises(TypeError, match="Backend"):
        choose(object())
    assert pb.get_backend() is before
