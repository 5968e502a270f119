"""Fused elementwise chains in plans: one kernel per chain, results as eager, and
nothing fused away that a later step or the backward pass reads."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import nn
from pullback.backend import Backend, BackwardOps, CpuBackend, KernelError
from pullback.kernels.core import ElementwiseKernel
from pullback.lower import epilogue
from pullback.lower.fuse import MAX_MEMBERS, MIN_ELEMENTS

TRAINING = pb.LoweringMode.TRAINING
TOL = {np.float32: {"rtol": 2e-6, "atol": 1e-6}, np.float64: {"rtol": 1e-13, "atol": 1e-14}}

# CpuBackend's forward ops on a backend that is not a CpuBackend: fused chains must run
# there member by member.
NotCpu = type("NotCpu", (BackwardOps, Backend), {
    name: vars(CpuBackend)[name] for name, value in vars(Backend).items()
    if callable(value) and not name.startswith("_")})


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _fused_steps(plan) -> list:
    return [step for step in plan._schedule if step.fused]


def _assert_plan_matches_eager(plan, loss_fn, model, x, y, rtol=1e-5, atol=1e-6) -> None:
    """The plan's loss and gradients are eager autograd's, to float tolerance."""
    for p in model.parameters():
        p.grad = None
    loss = plan(x, y).item()
    planned = [p.grad.numpy().copy() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    eager = loss_fn(pb.tensor(x), y)
    eager.backward()
    assert loss == pytest.approx(eager.item(), rel=1e-6)
    for got, p in zip(planned, model.parameters()):
        np.testing.assert_allclose(got, p.grad.numpy(), rtol=rtol, atol=atol)


def chain(x, b):
    """Every fusible op once, in one chain, broadcast over rows, with Python scalars."""
    h = pb.tanh(-(pb.relu(x + b) * 0.5 - b) / 3.0)
    return pb.exp(pb.sigmoid(h)) * x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_chain_becomes_one_kernel_and_matches_eager(dtype) -> None:
    x = _rng().standard_normal((64, 128)).astype(dtype)
    b = _rng(1).standard_normal(128).astype(dtype)
    plan = pb.compile(chain, x, b)
    (step,) = _fused_steps(plan)
    assert [e.primitive.name for e in step.eqns][:2] == ["add", "relu"]
    assert len(plan._schedule) == 1
    x2 = _rng(2).standard_normal((64, 128)).astype(dtype)
    want = chain(pb.tensor(x2), pb.tensor(b)).numpy()
    got = plan(x2, b).numpy()
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, **TOL[dtype])
    assert "fused(add, relu" in plan.explain()


def test_a_value_read_twice_is_kept_and_the_chain_stops_there() -> None:
    x = _rng().standard_normal((64, 128)).astype(np.float32)

    def fn(x):
        h = x * 2.0 + 1.0  # read by both branches below
        return pb.relu(h) - pb.exp(h)

    plan = pb.compile(fn, x)
    chains = [[e.primitive.name for e in step.eqns] for step in plan._schedule]
    assert chains == [["mul", "add"], ["exp"], ["relu", "sub"]]
    h = plan._schedule[0].out  # stored: both later steps read it
    assert all(h in step.args for step in plan._schedule[1:])
    np.testing.assert_allclose(plan(x).numpy(), fn(pb.tensor(x)).numpy(), **TOL[np.float32])


def test_small_chains_are_left_to_numpy() -> None:
    x = _rng().standard_normal(MIN_ELEMENTS // 2).astype(np.float32)
    plan = pb.compile(lambda x: pb.relu(x + 1.0) * 2.0, x)
    assert not _fused_steps(plan)


def test_integer_operands_are_not_fused() -> None:
    x = _rng().standard_normal((64, 128)).astype(np.float32)
    k = np.arange(128)
    plan = pb.compile(lambda x, k: pb.relu(x + k) * 2.0, x, k)
    names = [step.name for step in plan._schedule]
    assert names[0] == "add" and all("add" not in n for n in names[1:])
    np.testing.assert_allclose(plan(x, k).numpy(), np.maximum(x + k, 0) * 2.0, rtol=1e-6)


@pytest.mark.parametrize("epilogues", [False, True])
def test_training_plan_fuses_only_what_backward_does_not_read(epilogues, monkeypatch) -> None:
    # With every product an epilogue's (MIN_PRODUCT 0: these are below it), each dense
    # layer's product takes its bias, and relu (backward reads relu's output, not the
    # add's); sigmoid's step stays its own.
    monkeypatch.setattr(epilogue, "MIN_PRODUCT", 0 if epilogues else epilogue.MIN_PRODUCT)
    pb.manual_seed(0)
    model = nn.Sequential(nn.Dense(32, 256), nn.ReLU(), nn.Dense(256, 128), nn.Sigmoid(),
                          nn.Dense(128, 4))
    x = _rng().standard_normal((32, 32)).astype(np.float32)
    y = np.arange(32) % 4

    def loss_fn(x, y):
        return nn.cross_entropy(model(x), y)

    plan = pb.compile(loss_fn, x, y, mode=TRAINING)
    fused = _fused_steps(plan)
    assert [[e.primitive.name for e in s.eqns] for s in fused] == ([
        ["matmul", "add", "relu"], ["matmul", "add"], ["matmul", "add"]] if epilogues
        else [["add", "relu"], ["add", "sigmoid"]])
    for step in fused:  # the chain's inner values are never read by backward
        assert not {e.out.index for e in step.eqns[:-1]} & plan._saved
    _assert_plan_matches_eager(plan, loss_fn, model, x, y)


def test_other_backends_run_the_members_one_by_one() -> None:
    x = _rng().standard_normal((64, 128))
    b = _rng(1).standard_normal(128)
    plan = pb.compile(chain, x, b)
    assert _fused_steps(plan)
    with pb.use_backend(NotCpu()):
        members = plan(x, b).numpy()
    np.testing.assert_allclose(members, plan(x, b).numpy(), **TOL[np.float64])
    np.testing.assert_allclose(members, chain(pb.tensor(x), pb.tensor(b)).numpy(),
                               rtol=1e-15, atol=0)


def test_buffers_are_shared_by_values_whose_lives_do_not_overlap() -> None:
    pb.manual_seed(0)
    model = nn.Sequential(*[nn.Dense(128, 128, bias=False) for _ in range(6)])
    x = _rng().standard_normal((64, 128)).astype(np.float32)
    plan = pb.compile(model, x)
    assert len(plan._owner) == 5  # every matmul but the last, whose result is returned
    assert len(plan._buffers) == 2  # two alternate: each layer reads one, writes the other
    first = plan(x)
    kept = first.numpy().copy()
    x2 = _rng(1).standard_normal((64, 128)).astype(np.float32)
    second = plan(x2)  # reuses the buffers: the first result must not change
    np.testing.assert_array_equal(first.numpy(), kept)
    np.testing.assert_allclose(second.numpy(), model(pb.tensor(x2)).numpy(), rtol=1e-5,
                               atol=1e-6)
    assert "buffers: 2 preallocated" in plan.explain()


def test_a_training_plan_keeps_saved_values_in_buffers_of_their_own() -> None:
    pb.manual_seed(0)
    model = nn.Sequential(nn.Dense(64, 128), nn.Tanh(), nn.Dense(128, 128), nn.ReLU(),
                          nn.Dense(128, 4))
    y = np.arange(64) % 4

    def loss_fn(x, y):
        return nn.cross_entropy(model(x), y)

    plan = pb.compile(loss_fn, _rng().standard_normal((64, 64)).astype(np.float32), y,
                      mode=TRAINING)
    saved = [i for i in plan._owner if i in plan._saved]
    assert saved and len({plan._owner[i] for i in saved}) == len(saved)
    for seed in (1, 2):  # the second call overwrites the first call's buffers
        x = _rng(seed).standard_normal((64, 64)).astype(np.float32)
        _assert_plan_matches_eager(plan, loss_fn, model, x, y)


def test_threaded_backend_splits_fused_chains_over_its_pool() -> None:
    x = _rng().standard_normal((512, 256))
    b = _rng(1).standard_normal(256)
    plan = pb.compile(chain, x, b)
    backend = pb.ThreadedCpuBackend(num_threads=2)
    calls = []
    original = backend._map
    backend._map = lambda *a, **k: calls.append(a[0]) or original(*a, **k)
    with pb.use_backend(backend):
        threaded = plan(x, b).numpy()
    assert calls and all(isinstance(k, ElementwiseKernel) for k in calls)
    np.testing.assert_array_equal(threaded, plan(x, b).numpy())


def _viewed_buffer_loss(w1, w2):
    def loss(x):
        r = pb.reshape(x @ w1, (64, 2, 64))  # a view of a buffered matmul result
        h = pb.tanh(x @ w2)  # same shape: it would take that buffer if views were ignored
        return pb.sum(r * r * 0.5) + pb.sum(h)

    return loss


def test_a_value_something_views_keeps_its_buffer() -> None:
    w1, w2 = (pb.tensor(_rng(i).standard_normal((128, 128)).astype(np.float32) * 0.1,
                        requires_grad=True) for i in (1, 2))
    loss = _viewed_buffer_loss(w1, w2)
    x = _rng(3).standard_normal((64, 128)).astype(np.float32)
    plan = pb.compile(loss, x, mode=TRAINING)
    got = plan(x).item()
    planned = [w1.grad.numpy().copy(), w2.grad.numpy().copy()]
    w1.grad = w2.grad = None
    eager = loss(pb.tensor(x))
    eager.backward()
    assert got == pytest.approx(eager.item(), rel=1e-5)
    for g, w in zip(planned, (w1, w2)):
        np.testing.assert_allclose(g, w.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_a_returned_view_of_a_buffered_value_is_never_overwritten() -> None:
    w = pb.tensor(_rng(1).standard_normal((128, 128)).astype(np.float32))
    x1, x2 = (_rng(i).standard_normal((64, 128)).astype(np.float32) for i in (2, 3))
    plan = pb.compile(lambda x: pb.reshape(x @ w, (-1,)), x1)
    first = plan(x1)
    kept = first.numpy().copy()
    plan(x2)
    np.testing.assert_array_equal(first.numpy(), kept)


def test_long_chains_are_split_into_kernels_of_bounded_size() -> None:
    x = _rng().standard_normal((64, 128))

    def long_chain(x):
        for _ in range(3 * MAX_MEMBERS):
            x = pb.tanh(x) * 1.5
        return x

    plan = pb.compile(long_chain, x)
    sizes = [len(step.eqns) for step in plan._schedule]
    assert sum(sizes) == 6 * MAX_MEMBERS and max(sizes) == MAX_MEMBERS
    np.testing.assert_allclose(plan(x).numpy(), long_chain(pb.tensor(x)).numpy(),
                               **TOL[np.float64])


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_before_max_pool_folds_into_the_pool_backward(dtype, bias) -> None:
    # With the convolution's bias, the add before the relu folds in too: the pool's
    # step sums its masked upstream per channel for the bias.
    pb.manual_seed(0)
    conv = nn.Conv2d(2, 4, 3, padding=1, bias=bias, dtype=dtype)
    head = nn.Dense(4 * 4 * 4, 3, dtype=dtype)

    def loss_fn(x, y):
        h = pb.max_pool2d(pb.relu(conv(x)), 2)
        return nn.cross_entropy(head(pb.reshape(h, (x.shape[0], -1))), y)

    x = _rng().standard_normal((5, 2, 8, 8)).astype(dtype)
    x[:, :, :4, :4] = -50.0  # windows whose maximum relu clips to 0: the mask matters
    y = np.arange(5) % 3
    plan = pb.compile(loss_fn, x, y, mode=TRAINING)
    text = plan.explain()
    assert len(plan._pool_relu) == 1 and len(plan._pool_bias) == int(bias)
    assert ("the relu and the bias add before it folded in" in text) == bias
    assert ("the relu before it folded in" in text) == (not bias)
    model = nn.Sequential(conv, head)
    tol = {"rtol": 1e-4, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-10, "atol": 0}
    _assert_plan_matches_eager(plan, loss_fn, model, x, y, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_bias_add_before_a_relu_folds_into_the_relu_backward(dtype) -> None:
    # The digits CNN's shape of layer: conv2d with a bias, relu, no pool. The relu's
    # step hands its cotangent to the convolution and sums it per channel for the bias;
    # where the bias add's result has another reader (the second conv's, below), its
    # step stays.
    pb.manual_seed(0)
    first = nn.Conv2d(2, 4, 3, dtype=dtype)
    second = nn.Conv2d(4, 3, 3, dtype=dtype)
    head = nn.Dense(3 * 2 * 2, 3, dtype=dtype)

    def loss_fn(x, y):
        h = pb.relu(first(x))
        pre = second(h)
        out = pb.relu(pre) + 0.5 * pre  # the add's result read twice: not folded
        return nn.cross_entropy(head(pb.reshape(out, (x.shape[0], -1))), y)

    x = _rng().standard_normal((5, 2, 6, 6)).astype(dtype)
    y = np.arange(5) % 3
    plan = pb.compile(loss_fn, x, y, mode=TRAINING)
    assert len(plan._relu_bias) == 1 and "the bias add before it folded in" in plan.explain()
    model = nn.Sequential(first, second, head)
    tol = {"rtol": 1e-4, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-10, "atol": 0}
    _assert_plan_matches_eager(plan, loss_fn, model, x, y, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [8, 2048])  # the weight gradient whole, and split
def test_a_dense_layers_product_folds_into_its_bias_adds_backward(dtype, rows) -> None:
    # Dense layers' products and biases on (N, T, features) rows: each bias add's step
    # computes the product's gradients and the bias's. Not folded: a product another op
    # reads too (`shared`), and a bias add of a constant (nothing to sum for it).
    pb.manual_seed(0)
    first, second = nn.Dense(96, 160, dtype=dtype), nn.Dense(160, 5, dtype=dtype)
    w = nn.Parameter(_rng(4).standard_normal((160, 160)).astype(dtype) * 0.1)
    shift = _rng(5).standard_normal(160).astype(dtype)

    def loss_fn(x, y):
        h = pb.relu(first(x))
        shared = pb.matmul(h, w)
        h = pb.tanh(shared + shift) + 0.1 * shared
        return nn.cross_entropy(pb.reshape(second(h), (-1, 5)), y)

    x = _rng().standard_normal((rows // 2, 2, 96)).astype(dtype)
    y = np.arange(rows) % 5
    plan = pb.compile(loss_fn, x, y, mode=TRAINING)
    assert len(plan._matmul_bias) == 2
    text = plan.explain()
    assert text.count("the product before it folded in") == 2
    assert text.count("folded into the bias add after it: no work of its own") == 2
    model = nn.Sequential(first, second)
    model.w = w
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-12}
    _assert_plan_matches_eager(plan, loss_fn, model, x, y, **tol)


@pytest.mark.parametrize("mode", [pb.LoweringMode.INFERENCE, TRAINING])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_residual_connection_joins_its_dense_layers_epilogue(dtype, mode, monkeypatch) -> None:
    # x + Dense(h) (a transformer block's, its product above MIN_PRODUCT here): the
    # residual add runs in the product's step, on each block of its result; in training
    # plans backward reads none of the partial results. The second residual add reads a
    # product's result that another op reads too: not an epilogue's.
    monkeypatch.setattr(epilogue, "MIN_PRODUCT", 0)
    pb.manual_seed(0)
    first, second = nn.Dense(24, 24, dtype=dtype), nn.Dense(24, 24, dtype=dtype)
    head = nn.Dense(24, 3, dtype=dtype)

    def forward(x):
        h = x + first(pb.tanh(x))
        return head(h + pb.relu(h + second(h)))

    def loss_fn(x, y):
        return nn.cross_entropy(forward(x), y)

    x = _rng().standard_normal((16, 24)).astype(dtype)
    y = np.arange(16) % 3
    plan = pb.compile(loss_fn, x, y, mode=mode) if mode is TRAINING else \
        pb.compile(forward, x)
    roles = [[role for *_, role, _ in members] for members in
             (epilogue.matmul_epilogues(plan.graph, set())).values()]
    assert sorted(roles) == sorted([[None, epilogue.BIAS, epilogue.RESIDUAL],
                                    [None, epilogue.BIAS, epilogue.RESIDUAL, epilogue.RELU],
                                    [None, epilogue.BIAS]])
    model = nn.Sequential(first, second, head)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 0}
    if mode is TRAINING:
        _assert_plan_matches_eager(plan, loss_fn, model, x, y, **tol)
    else:
        x2 = _rng(3).standard_normal((16, 24)).astype(dtype)
        np.testing.assert_allclose(plan(x2).numpy(), forward(pb.tensor(x2)).numpy(), **tol)


def test_a_subclass_that_overrides_an_op_is_not_bypassed() -> None:
    class LeakyCpu(CpuBackend):
        def relu(self, x):
            return np.where(x > 0, x, 0.1 * x)

        def matmul(self, a, b):
            return np.matmul(a, b) * 2.0

    w = pb.tensor(_rng(1).standard_normal((128, 128)))
    x = _rng(2).standard_normal((64, 128))
    b = _rng(3).standard_normal(128)
    fn = lambda x, b: pb.relu(x @ w + b) * 3.0
    plan = pb.compile(fn, x, b)
    assert _fused_steps(plan) and plan._owner  # a fused chain, and a matmul into a buffer
    with pb.use_backend(LeakyCpu()):
        got = plan(x, b).numpy()
        want = fn(pb.tensor(x), pb.tensor(b)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert (got < 0).any()  # the override ran


def test_convolutions_and_pools_write_into_buffers() -> None:
    pb.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 8, 3, padding=1), nn.Flatten(), nn.Dense(8 * 8 * 8, 4))

    def fn(x):
        return model(pb.avg_pool2d(x, 2))

    x = _rng().standard_normal((4, 3, 32, 32)).astype(np.float32)
    plan = pb.compile(fn, x)
    # (The convolutions run with their bias and relu as one step, conv2d first; the
    # dense layer's product and bias make the result, which the caller keeps.)
    buffered = {step.eqns[0].primitive.name for step in plan._schedule
                if step.out.index in plan._owner}
    assert {"avg_pool2d", "conv2d", "max_pool2d"} <= buffered
    for scale in (1.0, -2.0):  # the second call overwrites the first's buffers
        np.testing.assert_allclose(plan(x * scale).numpy(),
                                   fn(pb.tensor(x * scale)).numpy(), rtol=1e-5, atol=1e-6)
    with pb.use_backend(NotCpu()):  # another backend: its own ops, no buffers
        np.testing.assert_allclose(plan(x).numpy(), fn(pb.tensor(x)).numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_window_ops_check_the_buffer_they_are_given() -> None:
    from pullback.backend import conv as window_ops

    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(KernelError, match=r"max_pool2d: .*out= must be a C-contiguous float32"):
        window_ops.max_pool2d(x, (2, 2), (2, 2), (0, 0), out=np.empty((1, 1, 3, 3), np.float32))
    # The backward passes a training plan's gradient buffers go to check theirs too.
    up = np.ones((1, 1, 2, 2), np.float32)
    wrong = np.empty((1, 1, 4, 4), np.float64)
    with pytest.raises(KernelError, match=r"max_pool2d_backward: .*out= must be"):
        window_ops.max_pool2d_backward(up, x, up, (2, 2), (2, 2), (0, 0), out=wrong)
    with pytest.raises(KernelError, match=r"avg_pool2d_backward: .*out= must be"):
        window_ops.avg_pool2d_backward(up, x.shape, (2, 2), (2, 2), (0, 0), out=wrong)
    w = np.ones((1, 1, 3, 3), np.float32)
    with pytest.raises(KernelError, match=r"conv2d_input_backward: .*out= must be"):
        window_ops.conv2d_input_backward(up, w, x.shape, (1, 1), (0, 0),
                                         out=np.empty((1, 1, 4, 4), np.float32).T)
    out = np.full((1, 1, 4, 4), np.nan, np.float32)  # every position is written
    assert window_ops.avg_pool2d_backward(up, x.shape, (2, 2), (2, 2), (0, 0), out=out) is out
    np.testing.assert_array_equal(out, np.full((1, 1, 4, 4), 0.25, np.float32))


def test_wide_layers_run_by_columns_without_copies() -> None:
    # A batch narrower than the layers: the matmuls' results are laid out by columns
    # (backend.gemm), the bias+relu chains write the same way, and the values and
    # gradients are eager's, each gradient laid out like its parameter.
    pb.manual_seed(0)
    model = nn.Sequential(nn.Dense(96, 256), nn.ReLU(), nn.Dense(256, 256), nn.ReLU(),
                          nn.Dense(256, 10))
    x = _rng().standard_normal((32, 96)).astype(np.float32)
    y = _rng(1).integers(0, 10, 32)

    def loss_fn(x, y):
        return nn.cross_entropy(model(x), y)

    plan = pb.compile(loss_fn, x, y, mode=TRAINING)
    orders = {plan._buffers[b].order for b in plan._owner.values()}
    assert orders == {"C", "F"}  # the 10-class logits stay by rows
    assert "(by columns)" in plan.explain()
    for p in model.parameters():
        p.grad = None
    plan(x, y)
    assert all(p.grad.numpy().flags.c_contiguous for p in model.parameters())
    _assert_plan_matches_eager(plan, loss_fn, model, x, y)
    inference = pb.compile(model, x)
    np.testing.assert_allclose(inference(x).numpy(), model(x).numpy(), **TOL[np.float32])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sin_and_cos_fuse_through_their_declared_templates(dtype) -> None:
    x = _rng().standard_normal((64, 128)).astype(dtype) * 4.0

    def fn(x):
        return pb.cos(pb.sin(x * 2.0) + 0.5) * 3.0

    plan = pb.compile(fn, x)
    (step,) = _fused_steps(plan)
    assert {"sin", "cos"} <= {e.primitive.name for e in step.eqns}
    x2 = _rng(2).standard_normal((64, 128)).astype(dtype) * 4.0
    np.testing.assert_allclose(plan(x2).numpy(), fn(pb.tensor(x2)).numpy(), **TOL[dtype])


def _conv_bn_relu(dtype, affine: bool = True):
    pb.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1, bias=False, dtype=dtype),
                         nn.BatchNorm2d(6, affine=affine, dtype=dtype), nn.ReLU(),
                         nn.Flatten(), nn.Dense(6 * 5 * 5, 3, dtype=dtype))


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_training_batch_norm_and_its_relu_are_one_step(dtype, affine, monkeypatch) -> None:
    """The step is the batch norm's kernel writing relu's result: bit for bit the two
    ops one by one (plan without the fold), and eager autograd's loss and gradients."""
    x = _rng().standard_normal((4, 3, 5, 5)).astype(dtype)
    y = np.arange(4) % 3
    results = {}
    for fold in (True, False):
        if not fold:
            monkeypatch.setattr(pb.lower.fuse, "_relus_after_norms", lambda *a: {})
        model = _conv_bn_relu(dtype, affine)
        loss_fn = lambda x, y, model=model: nn.cross_entropy(model(x), y)
        plan = pb.compile(loss_fn, x, y, mode=TRAINING)
        norm_relu = [s for s in plan._schedule if s.norm_relu]
        assert len(norm_relu) == int(fold)
        assert ("1 batch norms with the relu after them" in plan.explain()) == fold
        losses = [plan(x * k, y).item() for k in (1.0, -3.0)]  # the buffer is rewritten
        results[fold] = (losses, [p.grad.numpy().copy() for p in model.parameters()],
                         model[1].running_mean.numpy().copy())
        if fold:
            for p in model.parameters():
                p.grad = None
            _assert_plan_matches_eager(plan, loss_fn, model, x, y)
    assert results[True][0] == results[False][0]
    for got, want in zip(results[True][1], results[False][1]):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(results[True][2], results[False][2])


def test_a_batch_norm_whose_result_something_else_reads_keeps_its_relu_apart() -> None:
    pb.manual_seed(0)
    norm = nn.BatchNorm2d(3)

    def fn(x):
        h = norm(x)
        return pb.sum(pb.relu(h) * h)

    x = _rng().standard_normal((4, 3, 5, 5)).astype(np.float32)
    plan = pb.compile(fn, x, mode=TRAINING)
    assert not [s for s in plan._schedule if s.norm_relu]
    assert plan(x).item() == pytest.approx(fn(pb.tensor(x)).item(), rel=1e-5)


def test_a_batch_norm_and_relu_step_runs_on_other_backends_through_their_ops() -> None:
    model = _conv_bn_relu(np.float64)
    x = _rng().standard_normal((4, 3, 5, 5))
    y = np.arange(4) % 3
    plan = pb.compile(lambda x, y: nn.cross_entropy(model(x), y), x, y, mode=TRAINING)
    assert [s for s in plan._schedule if s.norm_relu]
    want = plan(x, y).item()
    with pb.use_backend(NotCpu()):  # no FusedOps: the defaults, relu through its relu
        got = plan(x, y).item()
    assert got == pytest.approx(want, rel=1e-12)


def test_an_eval_mode_batch_norm_and_its_relu_are_one_step_too() -> None:
    """A frozen batch norm (eval mode) in a training plan: its affine map, then relu."""
    model = _conv_bn_relu(np.float64)
    model[1].eval()
    x = _rng().standard_normal((4, 3, 5, 5))
    y = np.arange(4) % 3
    loss_fn = lambda x, y: nn.cross_entropy(model(x), y)
    plan = pb.compile(loss_fn, x, y, mode=TRAINING)
    assert [s for s in plan._schedule if s.norm_relu]
    _assert_plan_matches_eager(plan, loss_fn, model, x, y)
