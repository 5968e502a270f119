"""Inputs that tensor creation must refuse, `pb.tensor` copying its data, and
`pb.from_numpy` sharing it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb

REFUSED_DTYPES = [np.complex64, object, "U3", "datetime64[s]", [("a", "f4")], np.float16,
                  np.longdouble]
REFUSED_IDS = ["complex", "object", "string", "datetime", "structured", "float16", "longdouble"]


@pytest.mark.parametrize("dtype", REFUSED_DTYPES, ids=REFUSED_IDS)
def test_tensor_refuses_arrays_of_unsupported_dtypes(dtype) -> None:
    array = np.zeros(2, dtype=dtype)
    with pytest.raises(TypeError, match=r"^tensor: .*not supported"):
        pb.tensor(array)
    with pytest.raises(TypeError, match=r"^tensor: .*not supported"):
        pb.tensor(array, requires_grad=True)
    with pytest.raises(TypeError, match=r"^from_numpy: .*not supported"):
        pb.from_numpy(array)


def test_tensor_refuses_an_object_array_holding_none() -> None:
    with pytest.raises(TypeError, match="object"):
        pb.tensor(np.array([[None]]))
    with pytest.raises(TypeError, match="tensor"):
        pb.tensor([[1.0, None]])


@pytest.mark.parametrize("dtype", [np.float16, np.longdouble, np.complex128], ids=str)
def test_tensor_refuses_unsupported_dtype_arguments(dtype) -> None:
    with pytest.raises(TypeError, match=r"^tensor: dtype"):
        pb.tensor([1.0], dtype=dtype)
    with pytest.raises(TypeError, match=r"^zeros: dtype"):
        pb.zeros(2, dtype=dtype)


def test_integers_that_would_wrap_are_refused() -> None:
    with pytest.raises(OverflowError, match="int64"):
        pb.tensor([2**63], dtype=pb.int64)
    with pytest.raises(OverflowError, match="int64"):
        pb.tensor([2**63])
    with pytest.raises(OverflowError, match="int32"):
        pb.tensor(np.array([2**40]), dtype=pb.int32)
    with pytest.raises(OverflowError, match="full"):
        pb.full((2,), 2**40, dtype=pb.int32)
    assert pb.tensor([2**63 - 1]).item() == 2**63 - 1
    np.testing.assert_array_equal(pb.tensor(np.array([5, -3]), dtype=pb.int32).numpy(), [5, -3])


@pytest.mark.parametrize("value", ["x", None, [1.0]], ids=["str", "none", "list"])
def test_full_refuses_a_fill_that_is_not_a_number(value) -> None:
    with pytest.raises(TypeError, match=r"^full: the fill value"):
        pb.full((2,), value)


@pytest.mark.parametrize("value, dtype", [(1.5, np.float32), (np.float64(1.5), np.float32),
                                          (2, np.int64), (True, np.bool_)],
                         ids=["float", "np_float64", "int", "bool"])
def test_full_takes_its_dtype_from_the_fill_as_pytorch_does(value, dtype) -> None:
    assert pb.full((2,), value).dtype == dtype == torch.full((2,), value).numpy().dtype


def test_full_takes_a_zero_dim_tensor_with_its_dtype() -> None:
    t = pb.full((2,), pb.tensor(1.5, dtype=pb.float64))
    assert t.dtype == np.float64
    np.testing.assert_array_equal(t.numpy(), [1.5, 1.5])
    with pytest.raises(TypeError, match=r"^full: the fill value"):
        pb.full((2,), pb.ones(2))


@pytest.mark.parametrize("make, op", [(lambda: pb.ones(2.5), "ones"),
                                      (lambda: pb.zeros(-1), "zeros"),
                                      (lambda: pb.full(2.5, 1.0), "full"),
                                      (lambda: pb.randn(2, "3"), "randn")],
                         ids=["ones_float", "zeros_negative", "full_float", "randn_str"])
def test_bad_shapes_are_refused_naming_the_function(make, op) -> None:
    with pytest.raises(ValueError, match=rf"^{op}: expected a shape of non-negative ints"):
        make()


def test_arange_refuses_bad_bounds_by_name() -> None:
    with pytest.raises(ValueError, match=r"^arange: step must not be zero"):
        pb.arange(0, 5, 0)
    with pytest.raises(TypeError, match=r"^arange: start, stop and step must be numbers"):
        pb.arange("a")
    assert pb.arange(np.float64(2.0)).dtype == np.float32  # a NumPy float acts as a float
    np.testing.assert_array_equal(pb.arange(1, 7, 2).numpy(), [1, 3, 5])


def test_where_refuses_a_condition_that_is_not_bool() -> None:
    a, b = pb.tensor([1.0, 2.0]), pb.tensor([3.0, 4.0])
    with pytest.raises(pb.KernelError, match=r"^where: .*condition.*float32"):
        pb.where(pb.tensor([1.0, 0.0]), a, b)
    with pytest.raises(pb.KernelError, match=r"^where: .*condition.*int64"):
        pb.where(pb.tensor([1, 0]), a, b)
    for cond in (np.float64(1.0), 1.0, [1.0, 0.0], np.array([1, 0])):
        with pytest.raises(pb.KernelError, match=r"^where: .*condition"):
            pb.where(cond, a, b)
    np.testing.assert_array_equal(pb.where([True, False], a, b).numpy(), [1.0, 4.0])
    np.testing.assert_array_equal(pb.where(np.bool_(True), a, b).numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(pb.where(a > 1.5, a, b).numpy(), [3.0, 2.0])


def test_tensor_copies_so_a_callers_view_cannot_change_a_saved_value() -> None:
    a = np.array([1.0, 2.0, 3.0], np.float32)
    alias = a[:]
    x = pb.tensor(a, requires_grad=True)
    y = (x * x).sum()
    alias[:] = 100
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0, 6.0])
    assert not np.shares_memory(x.numpy(), a)


@pytest.mark.parametrize("source", [np.ones(3, np.float32), torch.ones(3), pb.ones(3)],
                         ids=["ndarray", "torch", "tensor"])
def test_tensor_never_shares_memory_with_its_source(source) -> None:
    t = pb.tensor(source)
    t.numpy()[0] = 7.0
    assert np.asarray(source)[0] == 1.0


def test_from_numpy_shares_memory_and_keeps_the_dtype() -> None:
    a = np.arange(4, dtype=np.float64)
    t = pb.from_numpy(a)
    assert t.dtype == np.float64
    a[0] = 10.0
    assert t.numpy()[0] == 10.0
    t.numpy()[1] = -1.0
    assert a[1] == -1.0
    with pytest.raises(TypeError, match=r"from_numpy: expected a np\.ndarray"):
        pb.from_numpy([1.0, 2.0])


def test_from_numpy_array_is_read_only_while_a_backward_needs_it() -> None:
    a = np.array([1.0, 2.0], np.float32)
    t = pb.from_numpy(a)
    t.requires_grad = True
    y = (t * t).sum()
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 5.0
    y.backward()
    a[0] = 5.0  # writeable again once the backward is done
    np.testing.assert_array_equal(t.grad.numpy(), [2.0, 4.0])


# ---------------------------------------------------------------- NumPy scalars


@pytest.mark.parametrize("scalar", [1.0 / np.sqrt(16), np.float32(0.25), np.int64(2),
                                    np.float16(0.5)], ids=["f64", "f32", "i64", "f16"])
@pytest.mark.parametrize("dtype", [pb.float32, pb.float64])
def test_a_numpy_scalar_acts_as_the_python_scalar_it_equals(scalar, dtype) -> None:
    t = pb.tensor([1.0, 2.0], dtype=dtype, requires_grad=True)
    py = scalar.item()
    pairs = [(t * scalar, t * py), (scalar * t, py * t), (t / scalar, t / py),
             (scalar - t, py - t), (t**scalar, t**py), (pb.maximum(t, scalar), pb.maximum(t, py)),
             (pb.where(t > 1.5, t, scalar), pb.where(t > 1.5, t, py))]
    for ours, expected in pairs:
        assert ours.dtype == dtype
        np.testing.assert_array_equal(ours.numpy(), expected.numpy())
    (t * scalar).sum().backward()
    assert t.grad.dtype == dtype
    np.testing.assert_array_equal(t.grad.numpy(), [py, py])


# ---------------------------------------------------------------- Python numbers


@pytest.mark.parametrize("op, number", [(pb.exp, 1.0), (pb.tanh, 0.5), (pb.neg, 2),
                                        (pb.abs, -3.5)])
def test_an_op_of_one_python_number_gives_what_numpy_gives(op, number) -> None:
    # It once reached the backend as a bare float (`'float' object has no attribute
    # 'dtype'`); a number alone takes NumPy's dtype for it, as `pb.add(1.0, 2)` does.
    ours = op(number)
    expected = getattr(np, {"neg": "negative"}.get(op.__name__, op.__name__))(np.asarray(number))
    assert isinstance(ours, pb.Tensor) and ours.dtype == expected.dtype
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-15)
    assert pb.add(number, 0).dtype == ours.dtype
