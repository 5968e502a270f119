"""Dtypes, creation functions, conversions, and errors that name the op, shapes and dtypes."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb

# ---------------------------------------------------------------- dtypes of data


@pytest.mark.parametrize(
    "data, dtype, expected",
    [
        ([1.0, 2.0], None, np.float32),
        (1.5, None, np.float32),
        (np.array([1.0, 2.0]), None, np.float64),
        (np.array([1.0], np.float32), None, np.float32),
        ([1, 2], None, np.int64),
        ([True, False], None, np.bool_),
        ([1.0, 2.0], pb.float64, np.float64),
        ([1, 2], pb.float32, np.float32),
    ],
    ids=["py_floats", "py_scalar", "f64_array", "f32_array", "ints", "bools", "f64_asked",
         "ints_to_f32"],
)
def test_tensor_dtype_follows_the_data(data, dtype, expected) -> None:
    assert pb.tensor(data, dtype=dtype).dtype == expected


@pytest.mark.parametrize("dtype", [pb.float32, pb.float64])
@pytest.mark.parametrize("scalar", [1.5, 2, True])
def test_python_scalar_takes_the_tensor_dtype(dtype, scalar) -> None:
    t = pb.tensor([1.0, 2.0], dtype=dtype)
    for result in (t + scalar, scalar * t, t / scalar, t - scalar, t**scalar):
        assert result.dtype == dtype


@pytest.mark.parametrize("data", [[1, 2], [True, False], np.arange(3, dtype=np.int32)])
def test_integer_and_bool_tensors_cannot_require_grad(data) -> None:
    with pytest.raises(TypeError, match="requires_grad"):
        pb.tensor(data, requires_grad=True)
    t = pb.tensor(data)
    with pytest.raises(TypeError):
        t.requires_grad = True


def test_comparison_gives_a_bool_tensor_without_grad() -> None:
    x = pb.tensor([1.0, 2.0], requires_grad=True)
    for result in (pb.tensor([1, 2]) < 2, x < 2.0, x >= x, x == 1.0, x != 1.0):
        assert result.dtype == pb.bool_
        assert not result.requires_grad
    np.testing.assert_array_equal((pb.tensor([1, 2]) < 2).numpy(), [True, False])


@pytest.mark.parametrize(
    "op, fn",
    [
        ("add", lambda a, b: a + b),
        ("mul", lambda a, b: a * b),
        ("div", lambda a, b: a / b),
        ("maximum", pb.maximum),
        ("matmul", lambda a, b: a.reshape(1, 2) @ b.reshape(2, 1)),
        ("concatenate", lambda a, b: pb.concatenate([a, b], 0)),
        ("stack", lambda a, b: pb.stack([a, b], 0)),
        ("where", lambda a, b: pb.where(a > 1.0, a, b)),
    ],
    ids=["add", "mul", "div", "maximum", "matmul", "concatenate", "stack", "where"],
)
def test_mixing_float32_and_float64_raises_kernel_error_naming_the_op(op, fn) -> None:
    a = pb.tensor([1.0, 2.0], dtype=pb.float32)
    b = pb.tensor([1.0, 2.0], dtype=pb.float64)
    with pytest.raises(pb.KernelError, match=rf"^{op}: .*float32.*float64"):
        fn(a, b)


# (x shape, w shape): gradients are reduced back to each input's shape.
BROADCASTS = [((3, 1), (1, 4)), ((2, 3), (3,)), ((), (2, 2)), ((4, 1, 3), (2, 1))]


@pytest.mark.parametrize("dtype", [pb.float32, pb.float64])
@pytest.mark.parametrize("x_shape, w_shape", BROADCASTS)
def test_gradients_have_their_input_dtype_and_shape(dtype, x_shape, w_shape) -> None:
    rng = np.random.default_rng(0)
    xv, wv = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    x = pb.tensor(xv, dtype=dtype, requires_grad=True)
    w = pb.tensor(wv, dtype=dtype, requires_grad=True)
    (pb.tanh(x * w) + 1.5).sum().backward()
    for t, v in ((x, xv), (w, wv)):
        assert t.grad.dtype == dtype
        assert t.grad.shape == v.shape
    # d/dx sum(tanh(x w)) = sum over broadcast axes of w (1 - tanh^2(x w)).
    full = wv * (1 - np.tanh(xv * wv) ** 2)
    lead = full.ndim - xv.ndim
    expected = full.sum(axis=tuple(range(lead)))
    expected = expected.sum(
        axis=tuple(i for i, d in enumerate(xv.shape) if d == 1), keepdims=True
    ).reshape(xv.shape)
    tol = 1e-5 if dtype == pb.float32 else 1e-12
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=tol, atol=tol)


# ---------------------------------------------------------------- conversions


def test_numpy_conversions_and_item() -> None:
    t = pb.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    np.testing.assert_array_equal(np.asarray(t), [[1, 2, 3], [4, 5, 6]])
    assert np.asarray(t).dtype == np.float32
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    assert t.size == 6 and t.ndim == 2 and t.shape == (2, 3)
    assert isinstance(t.shape, tuple)
    assert pb.tensor([2.5]).item() == 2.5
    assert pb.tensor(3).item() == 3
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        t.item()


# ---------------------------------------------------------------- creation

CREATORS = {
    "zeros": (lambda **kw: pb.zeros(2, 3, **kw), 0.0),
    "zeros_tuple": (lambda **kw: pb.zeros((2, 3), **kw), 0.0),
    "ones": (lambda **kw: pb.ones(2, 3, **kw), 1.0),
    "full": (lambda **kw: pb.full((2, 3), 2.5, **kw), 2.5),
    "zeros_like": (lambda **kw: pb.zeros_like(pb.ones(2, 3), **kw), 0.0),
    "ones_like": (lambda **kw: pb.ones_like(pb.zeros(2, 3), **kw), 1.0),
    "randn": (lambda **kw: pb.randn(2, 3, **kw), None),
    "rand": (lambda **kw: pb.rand(2, 3, **kw), None),
}


@pytest.mark.parametrize("name", list(CREATORS))
@pytest.mark.parametrize("dtype", [None, pb.float32, pb.float64])
def test_creation_functions_take_dtype_and_requires_grad(name, dtype) -> None:
    make, fill = CREATORS[name]
    t = make(dtype=dtype, requires_grad=True)
    assert t.shape == (2, 3)
    assert t.dtype == (dtype or pb.float32)
    assert t.requires_grad and t.is_leaf
    if fill is not None:
        np.testing.assert_array_equal(t.numpy(), np.full((2, 3), fill))
    assert not make(dtype=dtype).requires_grad


def test_like_functions_keep_the_dtype_of_their_argument() -> None:
    like = pb.ones(3, dtype=pb.float64)
    assert pb.zeros_like(like).dtype == pb.float64
    assert pb.ones_like(pb.tensor([1, 2])).dtype == pb.int64


@pytest.mark.parametrize(
    "args, kwargs, expected, dtype",
    [
        ((5,), {}, [0, 1, 2, 3, 4], np.int64),
        ((1, 7, 2), {}, [1, 3, 5], np.int64),
        ((0.0, 1.0, 0.25), {}, [0, 0.25, 0.5, 0.75], np.float32),
        ((3,), {"dtype": pb.float64}, [0, 1, 2], np.float64),
    ],
)
def test_arange(args, kwargs, expected, dtype) -> None:
    t = pb.arange(*args, **kwargs)
    assert t.dtype == dtype
    np.testing.assert_array_equal(t.numpy(), expected)


def test_arange_with_requires_grad() -> None:
    assert pb.arange(0.0, 2.0, requires_grad=True).requires_grad
    with pytest.raises(TypeError):
        pb.arange(3, requires_grad=True)


@pytest.mark.parametrize("make", [pb.randn, pb.rand], ids=["randn", "rand"])
def test_random_creation_with_a_seed_is_reproducible(make) -> None:
    a, b = make(3, seed=1), make(3, seed=1)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(a.numpy(), make(3, seed=2).numpy())
    pb.manual_seed(5)
    c = make(3)
    pb.manual_seed(5)
    np.testing.assert_array_equal(c.numpy(), make(3).numpy())


# ---------------------------------------------------------------- errors name op, shapes, dtypes


@pytest.mark.parametrize(
    "fn, expected",
    [
        (lambda: pb.matmul(pb.zeros(3, 4), pb.zeros(5, 2)), "matmul: (3, 4) and (5, 2)"),
        (lambda: pb.zeros(3, 4) + pb.zeros(2, 4), "add: (3, 4) and (2, 4)"),
        (lambda: pb.zeros(3) * pb.zeros(2), "mul: (3,) and (2,)"),
        (lambda: pb.reshape(pb.zeros(2, 3), (4, 2)), "reshape: (2, 3)"),
    ],
    ids=["matmul", "add", "mul", "reshape"],
)
def test_shape_errors_name_the_op_shapes_and_dtypes(fn, expected) -> None:
    with pytest.raises(pb.KernelError) as info:
        fn()
    message = str(info.value)
    assert message.startswith(expected)
    assert "float32" in message
