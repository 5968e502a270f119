"""PyTorch's spellings on pullback tensors, against PyTorch: the methods (`x.permute`,
`x.view`, `x.float()`, `x.topk()`, ...), `x.size` as both NumPy's element count and
PyTorch's `x.size()`, the integer results (argmax, argsort, sort and topk indices),
any and all, sorting inside plans, DLPack in both directions, randint and multinomial.
Gradients and values of the differentiable ops are in the op table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb

X = np.random.default_rng(12).permutation(24).reshape(2, 3, 4).astype(np.float32) - 11.5


def both(array: np.ndarray = X) -> tuple[pb.Tensor, torch.Tensor]:
    return pb.tensor(array), torch.tensor(array)


def same(got: object, want: torch.Tensor) -> None:
    got = np.asarray(got)
    assert got.shape == tuple(want.shape)
    assert got.dtype == want.numpy().dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- methods


METHODS = [
    ("permute", lambda x: x.permute(0, 2, 1), lambda x: x.permute(0, 2, 1)),
    ("permute_tuple", lambda x: x.permute((2, 0, 1)), lambda x: x.permute((2, 0, 1))),
    ("view", lambda x: x.view(-1, 4), lambda x: x.view(-1, 4)),
    ("view_ints", lambda x: x.view(4, 6), lambda x: x.view(4, 6)),
    ("unsqueeze", lambda x: x.unsqueeze(1), lambda x: x.unsqueeze(1)),
    ("squeeze", lambda x: x[:1, :, 1:2].squeeze(), lambda x: x[:1, :, 1:2].squeeze()),
    ("flatten", lambda x: x.flatten(), lambda x: x.flatten()),
    ("float", lambda x: x.double().float(), lambda x: x.double().float()),
    ("double", lambda x: x.double(), lambda x: x.double()),
    ("long", lambda x: x.long(), lambda x: x.long()),
    ("int", lambda x: x.int(), lambda x: x.int()),
    ("bool", lambda x: (x > 0).long().bool(), lambda x: (x > 0).long().bool()),
    ("min", lambda x: x.min(), lambda x: x.min()),
    ("var", lambda x: x.var(), lambda x: x.var()),
    ("std_axis", lambda x: x.std(1), lambda x: x.std(1)),
    ("argmax", lambda x: x.argmax(), lambda x: x.argmax()),
    ("argmin_axis", lambda x: x.argmin(1), lambda x: x.argmin(1)),
    ("argsort", lambda x: x.argsort(), lambda x: x.argsort()),
    ("topk_values", lambda x: x.topk(2)[0], lambda x: x.topk(2)[0]),
    ("topk_indices", lambda x: x.topk(2)[1], lambda x: x.topk(2)[1]),
    ("masked_fill", lambda x: x.masked_fill(x > 3, 0.5), lambda x: x.masked_fill(x > 3, 0.5)),
    ("norm", lambda x: x.norm(), lambda x: x.norm()),
    ("prod", lambda x: (x / 10).prod(), lambda x: (x / 10).prod()),
    ("any", lambda x: (x > 11).any(), lambda x: (x > 11).any()),
    ("all", lambda x: (x > -12).all(), lambda x: (x > -12).all()),
    ("sort_values", lambda x: x.sort()[0], lambda x: x.sort()[0]),
    ("sort_indices", lambda x: x.sort()[1], lambda x: x.sort()[1]),
    ("split", lambda x: x.split(1, 2)[3], lambda x: x.split(1, 2)[3]),
    ("chunk", lambda x: x.chunk(2, 2)[1], lambda x: x.chunk(2, 2)[1]),
    ("unbind", lambda x: x.unbind(1)[2], lambda x: x.unbind(1)[2]),
    ("tril", lambda x: x.tril(), lambda x: x.tril()),
    ("triu", lambda x: x.triu(1), lambda x: x.triu(1)),
]


@pytest.mark.parametrize(("pb_fn", "torch_fn"), [pytest.param(f, g, id=n) for n, f, g in METHODS])
def test_method_matches_pytorch(pb_fn, torch_fn) -> None:
    x, y = both()
    same(pb_fn(x), torch_fn(y))


def test_size_is_the_element_count_and_called_the_shape() -> None:
    x = pb.zeros(2, 3, 4)
    assert x.size == 24 and isinstance(x.size, int) and np.zeros(x.size).shape == (24,)
    assert x.size() == (2, 3, 4) == tuple(torch.zeros(2, 3, 4).size())
    assert x.size(1) == 3 and x.size(-1) == 4
    assert pb.tensor(1.0).size == 1 and pb.tensor(1.0).size() == ()
    with pytest.raises(IndexError, match="axis 3 is out of range for 3 dimensions"):
        x.size(3)


def test_conversions_of_a_tensor_that_requires_grad_keep_float_gradients() -> None:
    x = pb.tensor(X, requires_grad=True)
    (x.double() * 2.0).sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad.numpy(), np.full(X.shape, 2.0, np.float32))
    assert not x.long().requires_grad


# ---------------------------------------------------------------- integer results


TIES = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [np.nan, 1.0, np.nan, 5.0]])


@pytest.mark.parametrize("keepdims", [False, True])
def test_argmax_and_argmin_take_the_first_of_ties_and_nan_as_pytorch(keepdims) -> None:
    x, y = both(TIES)
    for axis in (None, 0, 1):
        same(pb.argmax(x, axis, keepdims), torch.argmax(y, axis, keepdims))
        same(pb.argmin(x[:2], axis, keepdims), torch.argmin(y[:2], axis, keepdims))
    assert not pb.argmax(pb.tensor(X, requires_grad=True)).requires_grad


def test_sort_is_stable_both_ways_and_puts_nan_last_ascending() -> None:
    x, y = both(TIES)
    for descending in (False, True):
        values, indices = pb.sort(x, axis=1, descending=descending)
        want = torch.sort(y, dim=1, descending=descending, stable=True)
        same(values, want.values)
        same(indices, want.indices)
        same(pb.argsort(x, 0, descending=descending),
             torch.argsort(y, dim=0, descending=descending, stable=True))


def test_topk_and_sort_of_a_zero_dim_tensor_are_itself() -> None:
    values, indices = pb.topk(pb.tensor(2.5), 1)
    assert values.item() == 2.5 and indices.item() == 0 and indices.dtype == np.int64
    assert pb.sort(pb.tensor(2.5))[0].item() == 2.5


@pytest.mark.parametrize("axis", [None, 0, (0, 2)])
def test_any_and_all_match_pytorch_with_nan_and_empty(axis) -> None:
    data = np.array([[[0.0, np.nan], [0.0, 0.0]], [[1.0, 2.0], [0.0, 3.0]]])
    x, y = both(data)
    dim = tuple(range(3)) if axis is None else axis
    same(pb.any(x, axis), torch.any(y, dim=dim))
    same(pb.all(x, axis, keepdims=True), torch.all(y, dim=dim, keepdim=True))
    empty, empty_t = both(np.zeros((0, 3)))
    same(pb.any(empty, 0), torch.any(empty_t, 0))
    same(pb.all(empty, 0), torch.all(empty_t, 0))


def test_prod_of_ints_is_int64_as_pytorch() -> None:
    x, y = both(np.arange(1, 7, dtype=np.int32).reshape(2, 3))
    same(pb.prod(x, axis=1), torch.prod(y, 1))
    same(pb.prod(pb.tensor([True, False])), torch.prod(torch.tensor([True, False])))


def test_var_with_no_degrees_of_freedom_is_nan_or_inf_as_pytorch() -> None:
    x, y = both(np.array([[1.5], [2.0]]))
    with pytest.warns(RuntimeWarning):  # NumPy's, as PyTorch warns of 0 degrees of freedom
        same(pb.var(x, axis=1), torch.var(y, 1))
    same(pb.var(x, correction=2), torch.var(y, correction=2))


def test_sort_in_a_plan_follows_each_call_s_data() -> None:
    # The indices are an operand the plan computes on each call, not a constant.
    weights = pb.tensor(np.arange(4.0), requires_grad=True)

    def loss(x: pb.Tensor) -> pb.Tensor:
        values, _ = pb.topk(x * weights, 2)
        return (values * pb.tensor([1.0, 10.0], dtype=pb.float64)).sum()

    step = pb.compile(loss, np.zeros(4), mode=pb.LoweringMode.TRAINING)
    plan = pb.compile(lambda x: pb.sort(x, descending=True)[1], np.zeros(4))
    for data in (np.array([1.0, 1.0, 1.0, 1.0]), np.array([1.0, -5.0, 4.0, 0.1])):
        weights.grad = None
        got = step(data)
        w = torch.tensor(np.arange(4.0), requires_grad=True)
        want = (torch.topk(torch.tensor(data) * w, 2)[0] * torch.tensor([1.0, 10.0])).sum()
        want.backward()
        assert got.item() == pytest.approx(want.item())
        np.testing.assert_allclose(weights.grad.numpy(), w.grad.numpy())
        same(plan(data), torch.sort(torch.tensor(data), descending=True, stable=True)[1])


# ---------------------------------------------------------------- DLPack


def test_torch_from_dlpack_shares_memory_with_a_tensor_both_ways() -> None:
    t = pb.zeros(3)
    shared = torch.from_dlpack(t)
    shared[0] = 5.0
    t.numpy()[1] = 7.0
    np.testing.assert_array_equal(t.numpy(), [5.0, 7.0, 0.0])
    np.testing.assert_array_equal(shared.numpy(), [5.0, 7.0, 0.0])
    assert t.__dlpack_device__() == shared.__dlpack_device__()


def test_pb_from_dlpack_shares_memory_with_a_torch_tensor_both_ways() -> None:
    source = torch.arange(4, dtype=torch.float64)
    t = pb.from_dlpack(source)
    assert t.dtype == np.float64 and t.shape == (4,)
    source[0] = -1.0
    t.numpy()[3] = 9.0
    np.testing.assert_array_equal(t.numpy(), [-1.0, 1.0, 2.0, 9.0])
    np.testing.assert_array_equal(source.numpy(), [-1.0, 1.0, 2.0, 9.0])


def test_a_tensor_a_pending_backward_needs_is_not_shared() -> None:
    x = pb.tensor(np.ones(3, np.float32), requires_grad=True)
    y = pb.exp(x)  # exp saves its output for backward
    with pytest.raises(BufferError, match="a pending backward of exp needs its values"):
        torch.from_dlpack(y)
    y.sum().backward()
    np.testing.assert_allclose(torch.from_dlpack(y).numpy(), np.exp(np.ones(3)), rtol=1e-6)


def test_from_dlpack_refuses_what_it_cannot_read() -> None:
    with pytest.raises(TypeError, match="from_dlpack"):
        pb.from_dlpack([1.0, 2.0])
    with pytest.raises(TypeError, match="from_dlpack"):
        pb.from_dlpack(torch.zeros(2, dtype=torch.complex64))


# ---------------------------------------------------------------- randint and multinomial


def test_randint_draws_from_the_half_open_range_and_repeats_per_seed() -> None:
    x = pb.randint(-2, 3, (50, 40), seed=5)
    assert x.dtype == np.int64 and x.shape == (50, 40)
    assert set(np.unique(x.numpy())) == {-2, -1, 0, 1, 2}
    np.testing.assert_array_equal(x.numpy(), pb.randint(-2, 3, (50, 40), seed=5).numpy())
    assert not np.array_equal(x.numpy(), pb.randint(-2, 3, (50, 40), seed=6).numpy())
    assert pb.randint(0, 10, 7, dtype=pb.int32).dtype == np.int32
    with pytest.raises(ValueError, match="randint: low"):
        pb.randint(3, 3, (2,))


def test_multinomial_with_replacement_draws_in_proportion() -> None:
    probs = pb.tensor([[0.5, 1.0, 3.5, 0.0], [0.0, 0.0, 0.0, 2.0]])  # unnormalized rows
    draws = pb.multinomial(probs, 20000, seed=3, replacement=True).numpy()
    assert draws.dtype == np.int64 and draws.shape == (2, 20000)
    freq = np.bincount(draws[0], minlength=4) / draws.shape[1]
    # Five standard deviations of a binomial frequency: sqrt(p (1 - p) / n) <= 0.0036.
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.7, 0.0], atol=0.018)
    assert (draws[1] == 3).all()
    again = pb.multinomial(probs, 20000, seed=3, replacement=True).numpy()
    np.testing.assert_array_equal(draws, again)


def test_multinomial_without_replacement_draws_each_category_once_per_row() -> None:
    probs = pb.tensor(np.tile([0.1, 0.2, 0.7, 0.0], (4000, 1)))
    draws = pb.multinomial(probs, 3, seed=4).numpy()
    assert draws.shape == (4000, 3)
    assert all(len(set(row)) == 3 for row in draws) and not (draws == 3).any()
    first = np.bincount(draws[:, 0], minlength=4) / len(draws)
    np.testing.assert_allclose(first, [0.1, 0.2, 0.7, 0.0], atol=0.04)  # 5 sd at n=4000
    np.testing.assert_array_equal(draws, pb.multinomial(probs, 3, seed=4).numpy())
    with pytest.raises(ValueError, match="without replacement"):
        pb.multinomial(probs, 4, seed=4)
    with pytest.raises(ValueError, match="non-negative"):
        pb.multinomial(pb.tensor([0.5, -0.1]), 1)
