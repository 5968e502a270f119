"""`pb.checkpoint` against PyTorch (torch.utils.checkpoint, non-reentrant, and plain
autograd) in f32 and f64: loss.backward, grad, vjp, jvp, grad of grad, nesting, and
TRAINING plans whose activation cache shrinks while their gradients stay the same."""

from __future__ import annotations

import gc
import itertools
import weakref

import numpy as np
import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint

import pullback as pb
from pullback import nn
from pullback.ad import DerivativeError

DTYPES = [np.float32, np.float64]
TOL = {np.float32: 2e-5, np.float64: 1e-11}  # relative to the largest magnitude


def _close(got, expected, dtype) -> None:
    got = got.numpy() if isinstance(got, pb.Tensor) else got
    expected = expected.detach().numpy() if isinstance(expected, torch.Tensor) else expected
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(got, expected, rtol=TOL[dtype], atol=TOL[dtype] * scale)


def _data(dtype, *shapes, seed=0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _mlp_block(lib, x, w1, b1, w2):
    """Two layers, the second reading parameters the region closes over."""
    act = pb.tanh if lib is pb else torch.tanh
    h = act(x @ w1 + b1)
    if lib is pb:
        return pb.relu(h @ w2) * h.sum(axis=-1, keepdims=True)
    return torch.relu(h @ w2) * h.sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_checkpoint_backward_matches_torch_checkpoint(dtype):
    x, w1, b1, w2 = _data(dtype, (5, 4), (4, 6), (6,), (6, 6))
    px, pw1, pb1, pw2 = (pb.tensor(a, requires_grad=True) for a in (x, w1, b1, w2))
    tx, tw1, tb1, tw2 = (torch.tensor(a, requires_grad=True) for a in (x, w1, b1, w2))

    y = pb.checkpoint(lambda v: _mlp_block(pb, v, pw1, pb1, pw2))(px)
    (y * y).sum().backward()
    ty = torch_checkpoint.checkpoint(lambda v: _mlp_block(torch, v, tw1, tb1, tw2), tx,
                                     use_reentrant=False)
    (ty * ty).sum().backward()
    _close(y, ty, dtype)
    for p, t in ((px, tx), (pw1, tw1), (pb1, tb1), (pw2, tw2)):
        assert p.grad.dtype == dtype
        _close(p.grad, t.grad, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_checkpoint_gives_the_gradients_of_the_plain_function(dtype):
    x, w1, b1, w2 = _data(dtype, (3, 4), (4, 5), (5,), (5, 5), seed=1)

    def f(v, a, b, c):
        return (_mlp_block(pb, v, a, b, c) ** 2).mean()

    plain = pb.grad(f, argnums=(0, 1, 2, 3))(x, w1, b1, w2)
    checked = pb.grad(lambda v, a, b, c: (pb.checkpoint(_mlp_block)(pb, v, a, b, c) ** 2)
                      .mean(), argnums=(0, 1, 2, 3))(x, w1, b1, w2)
    targs = [torch.tensor(a, requires_grad=True) for a in (x, w1, b1, w2)]
    (_mlp_block(torch, *targs) ** 2).mean().backward()
    for p, c, t in zip(plain, checked, targs):
        _close(c, p.numpy(), dtype)
        _close(c, t.grad, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_checkpoint_vjp_with_two_outputs(dtype):
    x, w = _data(dtype, (3, 4), (4, 2), seed=2)
    ct_a, ct_b = _data(dtype, (3, 2), (3,), seed=3)

    def two(v, m):
        h = pb.sigmoid(v @ m)
        return h * 3.0, (v * v).sum(axis=1)

    out, vjp_fn = pb.vjp(pb.checkpoint(two), x, w)
    gx, gw = vjp_fn((ct_a, ct_b))
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    th = torch.sigmoid(tx @ tw)
    ta, tb = th * 3.0, (tx * tx).sum(dim=1)
    torch.autograd.backward((ta, tb), (torch.tensor(ct_a), torch.tensor(ct_b)))
    _close(out[0], ta, dtype)
    _close(out[1], tb, dtype)
    _close(gx, tx.grad, dtype)
    _close(gw, tw.grad, dtype)
    gx2, _ = vjp_fn((ct_a, ct_b))  # the replay runs again: same answer
    _close(gx2, tx.grad, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_checkpoint_jvp_matches_torch(dtype):
    x, t, w = _data(dtype, (4, 3), (4, 3), (3, 3), seed=4)

    def f(v):
        return pb.softmax(pb.tanh(v @ w) * v, axis=-1)

    out, tangent = pb.jvp(pb.checkpoint(f), (x,), (t,))
    tw = torch.tensor(w)
    tout, ttangent = torch.func.jvp(
        lambda v: torch.softmax(torch.tanh(v @ tw) * v, dim=-1), (torch.tensor(x),),
        (torch.tensor(t),))
    _close(out, tout, dtype)
    _close(tangent, ttangent, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_grad_of_grad_through_checkpoint(dtype):
    (x,) = _data(dtype, (6,), seed=5)
    inner = pb.checkpoint(lambda v: pb.tanh(v) * v * v)
    dfdx = pb.grad(lambda v: inner(v).sum())
    second = pb.grad(lambda v: (dfdx(v) ** 2).sum())(x)
    tx = torch.tensor(x, requires_grad=True)
    (g,) = torch.autograd.grad((torch.tanh(tx) * tx * tx).sum(), tx, create_graph=True)
    (tsecond,) = torch.autograd.grad((g ** 2).sum(), tx)
    _close(second, tsecond, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_create_graph_through_checkpoint(dtype):
    (x,) = _data(dtype, (5,), seed=6)
    px = pb.tensor(x, requires_grad=True)
    y = pb.checkpoint(lambda v: pb.exp(v * 0.5) * pb.sigmoid(v))(px).sum()
    y.backward(create_graph=True)
    g = px.grad
    px.grad = None
    (g * g).sum().backward()
    tx = torch.tensor(x, requires_grad=True)
    (tg,) = torch.autograd.grad((torch.exp(tx * 0.5) * torch.sigmoid(tx)).sum(), tx,
                                create_graph=True)
    (tg * tg).sum().backward()
    _close(px.grad, tx.grad, dtype)


def test_nested_checkpoints():
    x, w = _data(np.float64, (3, 4), (4, 4), seed=7)
    pw = pb.tensor(w, requires_grad=True)
    inner = pb.checkpoint(lambda v: pb.tanh(v @ pw))
    outer = pb.checkpoint(lambda v: inner(inner(v)) + v)
    px = pb.tensor(x, requires_grad=True)
    outer(px).sum().backward()
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    def tinner(v):
        return torch.tanh(v @ tw)

    (tinner(tinner(tx)) + tx).sum().backward()
    _close(px.grad, tx.grad, np.float64)
    _close(pw.grad, tw.grad, np.float64)


def test_checkpoint_keeps_no_activation():
    """The region's intermediates are freed by the forward; only its operands stay."""
    x, w = _data(np.float64, (4, 4), (4, 4), seed=8)
    pw = pb.tensor(w, requires_grad=True)
    seen = []

    def region(v):
        h = pb.tanh(v @ pw)
        seen.append(weakref.ref(h))
        return pb.exp(h)

    px = pb.tensor(x, requires_grad=True)
    y = pb.checkpoint(region)(px)
    gc.collect()
    assert seen[0]() is None
    node = y._node
    assert node.primitive.name == "checkpoint"
    assert [p is not None for p in node.parents] == [True, True]
    y.sum().backward()
    expected = pb.grad(lambda v: pb.exp(pb.tanh(v @ w)).sum())(x)
    _close(px.grad, expected.numpy(), np.float64)


def test_checkpoint_replays_the_same_random_draws():
    pb.manual_seed(3)
    (x,) = _data(np.float64, (50,), seed=9)
    masks = []

    def dropout(v):
        keep = pb.rand(50, dtype=np.float64) > 0.5
        masks.append(keep.numpy())
        return pb.where(keep, v * 2.0, 0.0)

    px = pb.tensor(x, requires_grad=True)
    pb.checkpoint(dropout)(px).sum().backward()
    assert len(masks) == 1  # the function ran once; backward replayed what it did
    _close(px.grad, np.where(masks[0], 2.0, 0.0), np.float64)


def test_checkpoint_detach_inside_cuts_the_gradient():
    (x,) = _data(np.float64, (4,), seed=10)
    g = pb.grad(lambda v: pb.checkpoint(lambda u: u * pb.tanh(u).detach())(v).sum())(x)
    _close(g, np.tanh(x), np.float64)


def test_checkpoint_under_no_grad_is_the_function():
    px = pb.tensor(np.ones(3), requires_grad=True)
    with pb.no_grad():
        y = pb.checkpoint(lambda v: v * 2.0)(px)
    assert y._node is None
    _close(y, np.full(3, 2.0), np.float64)


def test_checkpoint_returning_an_input_passes_it_through():
    px = pb.tensor(np.ones(3), requires_grad=True)
    a, b = pb.checkpoint(lambda v: (v, v * 3.0))(px)
    assert a is px
    (a + b).sum().backward()
    _close(px.grad, np.full(3, 4.0), np.float64)


def test_checkpoint_refuses_what_it_cannot_do():
    with pytest.raises(TypeError, match="checkpoint: expected a function"):
        pb.checkpoint(3)
    with pytest.raises(TypeError, match="checkpoint: the function must return a tensor"):
        pb.checkpoint(lambda v: 3)(pb.tensor(np.ones(2), requires_grad=True))


class _BackwardOnly(pb.CustomOp):
    def forward(self, x):
        return x * 2.0

    def backward(self, upstream, inputs, output):
        return (upstream * 2.0,)


class _ForwardOnly(pb.CustomOp):
    def forward(self, x):
        return x * 2.0


def test_checkpoint_of_a_custom_op_with_a_backward_only():
    px = pb.tensor(np.arange(3.0), requires_grad=True)
    pb.checkpoint(lambda v: _BackwardOnly()(v) * v)(px).sum().backward()
    _close(px.grad, 4.0 * np.arange(3.0), np.float64)


def test_checkpoint_of_an_op_without_derivative_names_checkpoint():
    px = pb.tensor(np.ones(3), requires_grad=True)
    y = pb.checkpoint(lambda v: _ForwardOnly()(v) * v)(px)
    with pytest.raises(DerivativeError, match=r"_ForwardOnly has no derivative rule.*"
                                              r"inside pb.checkpoint"):
        y.sum().backward()


def test_checkpoint_saved_operands_are_read_only():
    px = pb.tensor(np.ones(3), requires_grad=True)
    x2 = px * 1.0
    y = pb.checkpoint(lambda v: pb.exp(v))(x2)
    with pytest.raises(ValueError, match="read-only"):
        x2.numpy()[0] = 5.0
    with pytest.raises(RuntimeError, match="pending backward of checkpoint"), pb.no_grad():
        x2[0] = 5.0
    y.sum().backward()
    x2.numpy()[0] = 5.0  # writable again once the backward is done


# ---------------------------------------------------------------- plans


def _wide_mlp(dtype, sizes=(64, 256, 256, 10)):
    pb.manual_seed(0)
    return [nn.Dense(a, b, dtype=dtype) for a, b in itertools.pairwise(sizes)]


def _xent(logits, labels):
    onehot = np.eye(logits.shape[-1], dtype=logits.dtype)[labels]
    return -(pb.log_softmax(logits, axis=-1) * onehot).sum() / logits.shape[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_checkpointed_training_plan_saves_less_and_gives_the_same_gradients(dtype):
    layers = _wide_mlp(dtype)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((32, 64)).astype(dtype)
    labels = rng.integers(0, 10, 32)

    def hidden(v):
        for layer in layers[:-1]:
            v = pb.relu(layer(v))
        return v

    def plain(v):
        return _xent(layers[-1](hidden(v)), labels)

    checked_hidden = pb.checkpoint(hidden)

    def checked(v):
        return _xent(layers[-1](checked_hidden(v)), labels)

    grads, saved = {}, {}
    for name, fn in (("plain", plain), ("checked", checked)):
        plan = pb.compile(fn, x, mode=pb.LoweringMode.TRAINING)
        text = plan.explain()
        saved[name] = _saved_bytes(text)
        for layer in layers:
            for p in layer.parameters():
                p.grad = None
        plan(x)
        plan(x)  # accumulates, as loss.backward() twice would
        grads[name] = [p.grad.numpy().copy() for layer in layers for p in layer.parameters()]
    assert "checkpoint" in text
    assert saved["checked"] < saved["plain"]
    for a, b in zip(grads["checked"], grads["plain"]):
        _close(a, b, dtype)
    # and against PyTorch's plain autograd
    tparams = [torch.tensor(p.numpy(), requires_grad=True) for layer in layers
               for p in (layer.weight, layer.bias)]
    tv = torch.tensor(x)
    for i in range(len(layers)):
        tv = tv @ tparams[2 * i].T + tparams[2 * i + 1]
        if i < len(layers) - 1:
            tv = torch.relu(tv)
    (2 * torch.nn.functional.cross_entropy(tv, torch.tensor(labels))).backward()
    for a, t in zip(grads["checked"], tparams):
        _close(a, t.grad, dtype)


def _saved_bytes(explain: str) -> float:
    line = next(ln for ln in explain.splitlines() if ln.startswith("saved activations"))
    number, unit = line.rsplit("(total ", 1)[1].rstrip(")").split()
    return float(number) * {"B": 1, "KiB": 1024, "MiB": 1024 ** 2}[unit]


def test_checkpoint_in_a_plan_reads_values_computed_from_each_call():
    """A `where` condition and a detached value computed inside the region are
    recomputed from each call's inputs, not baked in at trace time."""
    def f(v):
        return pb.checkpoint(lambda u: pb.where(u > 0, u * 2.0, u.detach() * -1.0))(v)

    x0 = np.array([1.0, -2.0, 3.0])
    plan = pb.compile(f, x0)
    x1 = np.array([-1.0, 2.0, -3.0])
    _close(plan(x1), np.array([1.0, 4.0, 3.0]), np.float64)
