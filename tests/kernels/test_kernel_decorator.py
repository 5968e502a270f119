"""@kernel itself: calling conventions, broadcasting, out=, dtype dispatch and errors,
serial and parallel paths, row kernels' input and output kinds, and compilation."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import TEST_PARALLEL_THRESHOLD
from kernel_check import LARGE, TOL, elementwise

from pullback.backend import KernelError
from pullback.kernels import kernel
from pullback.kernels.core import ElementwiseKernel, RowKernel
from pullback.kernels.jit import fingerprint
from pullback.kernels.scalar_math import row_sum


@kernel
def axpy(a, x, y):
    return a * x + y


@kernel(backward=axpy)
def gelu_erf(x):
    return 0.5 * x * (1.0 + math.erf(x * 0.7071067811865476))


@kernel(outputs=2)
def split(x, y):
    return x + y, x * y


@kernel
def lossy(x):
    return (x + 1.0e8) - 1.0e8


@kernel
def difference(x, y):
    return x - y


@kernel(rows=True, inputs=("row", "shared", "value", "index", "scalar"),
        outputs=("row", "value", "sum"))
def every_kind(x, w, v, i, s, out, acc):
    for j in range(x.shape[0]):
        out[j] = x[j] * w[j] + v * s
        acc[j] += x[j]
    return row_sum(x) + x[i]


# Kernels run serially by default; these tests check the automatic parallel dispatch.
for _k in (axpy, gelu_erf, split, lossy, difference, every_kind):
    _k.parallel_threshold = TEST_PARALLEL_THRESHOLD


def every_kind_reference(x, w, v, i, s):
    out = x * w + (v * s)[..., None]
    value = x.sum(-1) + np.take_along_axis(x, i[..., None], -1)[..., 0]
    return out, value, x.reshape(-1, x.shape[-1]).sum(0)


def test_kernel_returns_a_named_kernel_with_its_python_body_and_backward():
    assert isinstance(axpy, ElementwiseKernel) and axpy.name == "axpy"
    assert axpy.python(2.0, 3.0, 1.0) == 7.0 and axpy.backward is None
    assert gelu_erf.backward is axpy
    assert isinstance(every_kind, RowKernel) and every_kind.outputs == ("row", "value", "sum")


def test_backward_must_be_a_kernel():
    with pytest.raises(TypeError, match="backward must be a kernel"):
        kernel(backward=lambda x: x)(lambda x: x)


def test_row_kinds_must_fit_the_parameters():
    with pytest.raises(TypeError, match="parameters do not fit"):
        kernel(rows=True, inputs=("row", "row"))(lambda x, out: None)
    with pytest.raises(TypeError, match="input kinds are"):
        kernel(rows=True, inputs=("column",))(lambda x, out: None)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_elementwise_kernel_broadcasts_like_numpy(rng, dtype):
    x = rng.standard_normal((3, 1)).astype(dtype)
    y = rng.standard_normal((4,)).astype(dtype)
    out = axpy(2.5, x, y)
    assert out.shape == (3, 4) and out.dtype == dtype
    np.testing.assert_allclose(out, elementwise(axpy.python, 2.5, x, y), **TOL[dtype])


def test_spec_example_with_math_erf_matches_its_body(rng):
    x = rng.standard_normal(7)
    np.testing.assert_allclose(gelu_erf(x), elementwise(gelu_erf.python, x), rtol=1e-14)


def test_zero_dimensional_and_scalar_inputs_give_zero_dimensional_arrays():
    out = axpy(np.float32(2.0), np.array(3.0, np.float32), 1)
    assert isinstance(out, np.ndarray) and out.shape == () and out.dtype == np.float32
    assert out == 7.0
    both = axpy(2.0, 3.0, 1.0)  # no arrays at all: float64
    assert both.shape == () and both.dtype == np.float64 and both == 7.0


def test_empty_inputs_give_empty_outputs():
    out = axpy(1.0, np.zeros((0, 3)), np.zeros(3))
    assert out.shape == (0, 3) and out.dtype == np.float64


@pytest.mark.parametrize("dtype", [np.int64, np.float16, np.bool_])
def test_unsupported_dtype_names_kernel_shapes_and_supported_dtypes(dtype):
    with pytest.raises(KernelError) as info:
        gelu_erf(np.zeros((2, 3), dtype=dtype))
    message = str(info.value)
    assert message.startswith("gelu_erf: (2, 3): ")
    assert f"unsupported dtype {np.dtype(dtype)}" in message
    assert "supported: float32, float64" in message


def test_mixed_float32_and_float64_is_an_error():
    with pytest.raises(KernelError, match=r"axpy: \(3,\) and \(3,\): mixed dtypes float32 and "
                                          r"float64; supported: float32, float64"):
        axpy(1.0, np.zeros(3, np.float32), np.zeros(3, np.float64))


def test_shapes_that_do_not_broadcast_are_an_error():
    with pytest.raises(KernelError, match=r"axpy: \(3,\) and \(4,\): shapes cannot be broadcast"):
        axpy(1.0, np.zeros(3), np.zeros(4))


def test_out_receives_the_result_and_is_returned(rng):
    x, y = rng.standard_normal(5), rng.standard_normal(5)
    out = np.empty(5)
    assert axpy(2.0, x, y, out=out) is out
    np.testing.assert_array_equal(out, 2.0 * x + y)


def test_out_may_be_strided(rng):
    x = rng.standard_normal((4, 6))
    target = np.zeros((6, 4)).T  # a transposed view: not C-contiguous
    axpy(1.0, x, 0.0, out=target)
    np.testing.assert_array_equal(target, x)


@kernel
def scaled_sum(x, y):
    return 2.0 * x + y


@pytest.mark.parametrize("order", ["C", "F"])
def test_out_of_one_memory_order_with_its_operands(rng, order):
    # All C- or all Fortran-ordered (a plan's buffers laid out by columns): the flat loop
    # over memory, called twice so that the second call finds the prepared driver.
    x = np.asarray(rng.standard_normal((4, 6)), order=order)
    y = np.asarray(rng.standard_normal((4, 6)), order=order)
    for _ in range(2):
        out = np.zeros((4, 6), order=order)
        assert scaled_sum.serial(x, y, out=out) is out
        np.testing.assert_array_equal(out, 2.0 * x + y)
    mixed = np.zeros((4, 6), order="C" if order == "F" else "F")  # the general path
    scaled_sum(x, y, out=mixed)
    np.testing.assert_array_equal(mixed, 2.0 * x + y)
    scaled_sum(x, y, out=x)  # writing through an operand: the general path too
    np.testing.assert_array_equal(x, mixed)


def test_wrong_out_is_an_error():
    with pytest.raises(KernelError, match="out= must be a float64 array of shape"):
        axpy(1.0, np.zeros(3), np.zeros(3), out=np.zeros(4))
    with pytest.raises(KernelError, match="out= must be a float64 array"):
        axpy(1.0, np.zeros(3), np.zeros(3), out=np.zeros(3, np.float32))
    with pytest.raises(KernelError, match="out= needs 2 arrays"):
        split(np.zeros(3), np.zeros(3), out=np.zeros(3))


def test_two_outputs_come_back_as_a_tuple_and_may_overwrite_inputs(rng):
    x, y = rng.standard_normal(6), rng.standard_normal(6)
    total, product = split(x, y)
    np.testing.assert_array_equal(total, x + y)
    np.testing.assert_array_equal(product, x * y)
    a, b = x.copy(), y.copy()
    split(a, b, out=(a, b))  # in place: each element is read before it is written
    np.testing.assert_array_equal(a, x + y)
    np.testing.assert_array_equal(b, x * y)


@pytest.mark.parametrize("size", [6, LARGE])
def test_in_place_outputs_get_a_loop_that_stores_through_the_input(rng, size):
    x, y = rng.standard_normal(size), rng.standard_normal(size)
    b = y.copy()
    split(x, b, out=(np.empty_like(x), b))  # one output in place, one not
    np.testing.assert_array_equal(b, x * y)
    a, b = x.copy(), y.copy()
    split(a, b, out=(b, a))  # crossed: each output overwrites the other input
    np.testing.assert_array_equal(b, x + y)
    np.testing.assert_array_equal(a, x * y)
    a = x.copy()
    assert axpy(2.0, a, y, out=a) is a
    np.testing.assert_array_equal(a, 2.0 * x + y)
    keys = [key for _, key, _ in split._drivers if len(key) > 3]
    assert ("flat", 3, 0, (-1, 1)) in keys and ("flat", 3, 0, (1, 0)) in keys


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_and_column_broadcasts_take_the_rows_loop(rng, dtype):
    x = rng.standard_normal((5, 7)).astype(dtype)
    for other in (rng.standard_normal(7), rng.standard_normal((5, 1)),
                  rng.standard_normal((1, 1)), rng.standard_normal((1, 7))):
        other = other.astype(dtype)
        np.testing.assert_array_equal(difference(x, other), x - other)
        np.testing.assert_array_equal(difference(other, x), other - x)
    x3 = rng.standard_normal((2, 5, 7)).astype(dtype)
    per_row = rng.standard_normal((2, 5, 1)).astype(dtype)
    np.testing.assert_array_equal(difference(x3, per_row), x3 - per_row)
    strided = rng.standard_normal((7, 5)).astype(dtype).T  # not contiguous
    np.testing.assert_array_equal(difference(strided, x3[0, :, :1]), strided - x3[0, :, :1])
    assert (np.dtype(dtype).name, "rows", "serial") in difference.signatures
    assert (np.dtype(dtype).name, "grid", "serial") in difference.signatures


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_middle_axis_broadcasts_take_the_planes_loop(rng, dtype):
    x = rng.standard_normal((3, 4, 5, 6)).astype(dtype)
    for shape in [(1, 4, 1, 1), (4, 1, 1), (3, 4, 1, 1), (1, 4, 5, 1), (3, 1, 1, 1)]:
        other = rng.standard_normal(shape).astype(dtype)
        np.testing.assert_array_equal(difference(x, other), x - other)
        np.testing.assert_array_equal(difference(other, x), other - x)
        np.testing.assert_array_equal(axpy(other, x, 1.5), other * x + 1.5)
    assert (np.dtype(dtype).name, "planes", "serial") in difference.signatures
    # Two operands varying along different axes fit no planes: the general loop.
    a, b = rng.standard_normal((1, 4, 1, 1)), rng.standard_normal((1, 1, 5, 1))
    np.testing.assert_array_equal(axpy(a.astype(dtype), x, b.astype(dtype)),
                                  a.astype(dtype) * x + b.astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_launcher_prepares_a_call_for_fixed_shapes(rng, dtype):
    x = rng.standard_normal((6, 5)).astype(dtype)
    for other in (rng.standard_normal((6, 5)), rng.standard_normal(5),
                  rng.standard_normal((6, 1)), rng.standard_normal((1, 1))):
        other = other.astype(dtype)
        launch = axpy.launcher((2, x, other))  # an int scalar, as drivers take floats
        np.testing.assert_array_equal(launch(2, x, other), axpy(2.0, x, other))
        out = np.empty_like(x)
        launch = axpy.launcher((0.5, x, other), out)
        assert launch(0.5, x, other, out=out) is out
        np.testing.assert_array_equal(out, axpy(0.5, x, other))
        y = rng.standard_normal((6, 5)).astype(dtype)  # new values, same shapes
        np.testing.assert_array_equal(launch(0.5, y, other, out=out), axpy(0.5, y, other))
    per_channel = rng.standard_normal((1, 3, 1, 1)).astype(dtype)
    images = rng.standard_normal((2, 3, 4, 4)).astype(dtype)
    launch = difference.launcher((images, per_channel))
    np.testing.assert_array_equal(launch(images, per_channel), images - per_channel)


def test_a_launcher_declines_calls_the_general_path_must_take(rng):
    x = rng.standard_normal((6, 5))
    assert difference.launcher((x[:, ::2], x[:, ::2])) is None  # strided
    assert difference.launcher((x, x.T.copy().T)) is None  # C and Fortran order mixed
    assert difference.launcher((x, x.astype(np.float32))) is None  # mixed dtypes
    assert difference.launcher((x.astype(np.float16), x.astype(np.float16))) is None
    assert difference.launcher((x, x), np.empty((6, 5), np.float32)) is None  # wrong out
    assert split.launcher((x, x)) is None  # two outputs
    assert axpy.launcher((1.0, np.zeros(LARGE), 0.5)) is None  # the parallel loop's size


def test_non_contiguous_inputs_are_read_through_their_strides(rng):
    x = rng.standard_normal((6, 4))
    np.testing.assert_array_equal(axpy(1.0, x.T, 0.5), x.T + 0.5)
    np.testing.assert_array_equal(axpy(1.0, x[::2, ::3], 0.0), x[::2, ::3])
    # One- and two-input kernels take a fast path first; strided inputs leave it.
    y = rng.standard_normal(12)
    difference(y[:6], y[6:])  # compiles the flat loop the fast path uses
    np.testing.assert_array_equal(difference(y[::2], y[1::2]), y[::2] - y[1::2])
    np.testing.assert_array_equal(difference(x.T, x.T), np.zeros((4, 6)))
    np.testing.assert_array_equal(lossy(y[::3]), (y[::3] + 1e8) - 1e8)


def test_same_shape_strided_operands_are_copied_into_the_flat_loop(rng, monkeypatch):
    # A Fortran-ordered (32, 24) result reshaped to (32, 6, 2, 2) is neither C- nor
    # Fortran-contiguous: with a C-contiguous operand of its shape, the call copies it
    # and runs the flat loop (not the general one), with a C-ordered result.
    strided = np.asfortranarray(rng.standard_normal((32, 24))).reshape(32, 6, 2, 2)
    assert not strided.flags.c_contiguous and not strided.flags.f_contiguous
    other = rng.standard_normal((32, 6, 2, 2))
    general = ElementwiseKernel._grid
    monkeypatch.setattr(ElementwiseKernel, "_grid", lambda *a: pytest.fail("general loop"))
    got = difference(strided, other)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, strided - other)
    monkeypatch.setattr(ElementwiseKernel, "_grid", general)
    # out= given: the general loop, which writes through it
    out = np.empty((32, 6, 2, 2))
    assert difference(strided, other, out=out) is out
    np.testing.assert_array_equal(out, strided - other)


def test_float32_kernel_computes_in_float32():
    # 1e8 + 1.5 rounds to 1e8 in float32 (its ulp there is 8), not in float64.
    assert lossy(np.array([1.5], np.float32))[0] == 0.0
    assert lossy(np.array([1.5], np.float64))[0] == 1.5


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_parallel_and_serial_paths_agree(rng, dtype):
    x = rng.standard_normal(LARGE).astype(dtype)
    y = rng.standard_normal(LARGE).astype(dtype)
    parallel = axpy(0.5, x, y)  # above the threshold: the parallel loop
    np.testing.assert_array_equal(parallel, axpy.serial(0.5, x, y))
    np.testing.assert_array_equal(axpy.parallel(0.5, x[:3], y[:3]), axpy.serial(0.5, x[:3], y[:3]))
    assert (dtype.__name__, "flat", "parallel") in axpy.signatures
    # Contiguous operands broadcast by rows or columns take the "rows" loop, strided
    # ones the general (rows, last axis) loop, in parallel too.
    column = rng.standard_normal((LARGE[0], 1)).astype(dtype)
    np.testing.assert_array_equal(axpy(0.5, column, y.T.T), axpy.serial(0.5, column, y))
    assert (dtype.__name__, "rows", "parallel") in axpy.signatures
    strided = rng.standard_normal((LARGE[0], 2 * LARGE[1])).astype(dtype)[:, ::2]
    np.testing.assert_array_equal(axpy(0.5, column, strided),
                                  axpy.serial(0.5, column, strided))
    assert (dtype.__name__, "grid", "parallel") in axpy.signatures


def test_small_calls_stay_serial(rng):
    x = rng.standard_normal(16, dtype=np.float32)
    before = set(gelu_erf.signatures)
    gelu_erf(x)
    added = set(gelu_erf.signatures) - before
    assert all(mode == "serial" for _, _, mode in added)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_kernel_input_and_output_kinds(rng, dtype):
    x = rng.standard_normal((2, 3, 5)).astype(dtype)
    w = rng.standard_normal(5).astype(dtype)
    v = rng.standard_normal((2, 3)).astype(dtype)
    i = rng.integers(0, 5, (2, 3))
    out, value, acc = every_kind(x, w, v, i, 0.5)
    expected = every_kind_reference(x, w, v, i, 0.5)
    for got, want in zip((out, value, acc), expected):
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, **TOL[dtype])


def test_row_kernel_parallel_sums_agree_with_serial(rng):
    x = rng.standard_normal(LARGE)
    w = rng.standard_normal(LARGE[1])
    v = rng.standard_normal(LARGE[0])
    i = rng.integers(0, LARGE[1], LARGE[0])
    parallel, serial = every_kind(x, w, v, i, 2.0), every_kind.serial(x, w, v, i, 2.0)
    np.testing.assert_array_equal(parallel[0], serial[0])
    np.testing.assert_array_equal(parallel[1], serial[1])
    np.testing.assert_allclose(parallel[2], serial[2], rtol=1e-12)  # sums in other orders
    assert ("float64", "rows", "parallel") in every_kind.signatures


def test_row_kernel_out_and_errors(rng):
    x = rng.standard_normal((4, 5))
    w, v, i = np.ones(5), np.zeros(4), np.zeros(4, np.int32)
    out = np.zeros((5, 4)).T
    result = every_kind(x, w, v, i, 1.0, out=(out, None, None))
    assert result[0] is out
    np.testing.assert_array_equal(out, x)
    with pytest.raises(KernelError, match=r"a shared input must have shape \(5,\)"):
        every_kind(x, np.ones(4), v, i, 1.0)
    with pytest.raises(KernelError, match="indices must be integers"):
        every_kind(x, w, v, np.zeros(4), 1.0)
    with pytest.raises(KernelError, match="unsupported dtype int64; supported: float32"):
        every_kind(x.astype(np.int64), w.astype(np.int64), v.astype(np.int64), i, 1.0)
    with pytest.raises(KernelError, match="mixed dtypes float64 and int64"):
        every_kind(x.astype(np.int64), w, v, i, 1.0)


def test_fingerprint_follows_the_body():
    def first(x):
        return x * 2.0

    def second(x):
        return x * 3.0

    assert fingerprint(first) != fingerprint(second)
    assert fingerprint(first) == fingerprint(first)


def test_importing_pullback_does_not_import_numba():
    code = "import sys, pullback; assert 'numba' not in sys.modules, 'numba imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_one_body_declared_twice_gives_two_working_kernels(rng):
    def double(x):
        return x * 2.0

    first, second = kernel(double), kernel(backward=axpy)(double)
    x = rng.standard_normal(3)
    np.testing.assert_array_equal(first(x), 2 * x)
    np.testing.assert_array_equal(second(x), 2 * x)  # shares the compiled module


def test_fortran_ordered_operands_run_on_their_transposes(rng):
    # A GEMM may lay its result out by columns: such operands keep their order (no
    # copy), broadcast ones (a bias per column, a value per row) included.
    x = np.asfortranarray(rng.standard_normal((40, 30)))
    for other in (rng.standard_normal(30), rng.standard_normal((40, 1)), 0.25,
                  np.asfortranarray(rng.standard_normal((40, 30)))):
        expected = x - other
        result = difference(x, other)
        np.testing.assert_array_equal(result, expected)
        assert result.flags.f_contiguous and not result.flags.c_contiguous
        out = np.empty((40, 30), order="F")
        assert difference(x, other, out=out) is out
        np.testing.assert_array_equal(out, expected)
        launch = difference.launcher((x, other), out)
        assert launch is not None
        out[...] = 0.0
        assert launch(x, other, out=out) is out
        np.testing.assert_array_equal(out, expected)
        fresh = difference.launcher((x, other))(x, other)
        np.testing.assert_array_equal(fresh, expected)
        assert fresh.flags.f_contiguous
    # Mixed orders still compute the right thing (through a copy).
    c = np.ascontiguousarray(x)
    np.testing.assert_array_equal(difference(x, c[::-1]), x - c[::-1])
    np.testing.assert_array_equal(difference(c, x), np.zeros_like(c))
    three = np.asfortranarray(rng.standard_normal((3, 4, 5)))
    np.testing.assert_array_equal(axpy(2.0, three, 1.0), 2.0 * three + 1.0)
    assert axpy(2.0, three, 1.0).flags.f_contiguous


def test_an_in_place_launch_writes_through_its_inputs_as_the_call_does(rng):
    x = rng.standard_normal((5, 7))
    y = rng.standard_normal((5, 7))
    expected = 2.0 * x + y
    launch = axpy.in_place((2, x, y), (y,))  # an int scalar goes in as a float
    assert launch is not None
    launch(2, x, y)
    np.testing.assert_array_equal(y, expected)
    launch(2, np.asfortranarray(x), y)  # an input in another order is read through a copy
    np.testing.assert_array_equal(y, 2.0 * x + expected)
    assert axpy.in_place((2.0, x, y), (x[:1],)) is None  # an output that is no input
    assert axpy.in_place((2.0, x[:, :3], y), (y,)) is None  # shapes differ
    assert axpy.in_place((2.0, x.T, y.T.copy()), (x.T,)) is None  # not C-ordered
    assert axpy.in_place((2.0, x, y.astype(np.float32)), (y,)) is None  # mixed dtypes
    frozen = y.copy()
    frozen.setflags(write=False)
    assert axpy.in_place((2.0, x, frozen), (frozen,)) is None
    big = np.zeros(LARGE)
    assert axpy.in_place((1.0, big, big), (big,)) is None  # the parallel loop's size


@kernel
def softsign_backward(upstream, x):
    d = 1.0 + abs(x)
    return upstream / (d * d)


@kernel(backward=softsign_backward)
def softsign(x):
    return x / (1.0 + abs(x))


@kernel(outputs=2)
def scaled_backward(upstream, x, s):
    return upstream * s, upstream * x


@kernel(backward=scaled_backward)
def scaled(x, s):
    return x * s


@kernel
def square_backward(upstream, forward_output):
    return upstream * 2.0 * math.sqrt(forward_output)  # d(x^2)/dx for x >= 0, from x^2


@kernel(backward=square_backward)
def square_of_positive(x):
    return x * x


def test_a_kernel_pair_is_a_trainable_op_on_tensors():
    import torch

    import pullback as pb

    x0 = np.random.default_rng(0).standard_normal((3, 4))
    np.testing.assert_array_equal(softsign(x0), x0 / (1 + np.abs(x0)))  # arrays: a kernel
    x = pb.tensor(x0, requires_grad=True)
    y = softsign(x)
    assert isinstance(y, pb.Tensor)
    y.sum().backward()
    t = torch.tensor(x0, requires_grad=True)
    torch.nn.functional.softsign(t).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(pb.grad(lambda x: softsign(x).sum())(pb.tensor(x0)).numpy(),
                               t.grad.numpy(), rtol=1e-12)
    assert pb.gradcheck(lambda x: softsign(x), (pb.tensor(x0),))
    # A training plan of a module's loss through the pair.
    w = pb.nn.Parameter(pb.tensor(x0[0]))
    step = pb.compile(lambda x: softsign(x * w).sum(), pb.tensor(x0),
                      mode=pb.LoweringMode.TRAINING)
    step(pb.tensor(x0))
    tw = torch.tensor(x0[0], requires_grad=True)
    torch.nn.functional.softsign(torch.tensor(x0) * tw).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-12)


def test_a_two_input_pair_sums_gradients_over_broadcast_axes():
    import pullback as pb

    x = pb.randn(3, 4, dtype=np.float64, seed=1, requires_grad=True)
    s = pb.randn(4, dtype=np.float64, seed=2, requires_grad=True)
    scaled(x, s).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.broadcast_to(s.numpy(), (3, 4)))
    np.testing.assert_allclose(s.grad.numpy(), x.numpy().sum(0), rtol=1e-12)
    assert pb.gradcheck(lambda x, s: scaled(x, s), (x.detach(), s.detach()))
    y = scaled(x, 2.0)  # a Python scalar operand gets no gradient
    np.testing.assert_array_equal(y.numpy(), 2.0 * x.numpy())


def test_a_pair_whose_backward_reads_the_output_saves_only_the_output():
    import weakref

    import pullback as pb

    x = pb.tensor([1.0, 2.0, 3.0], dtype=np.float64, requires_grad=True)
    h = x * 1.0
    watch = weakref.ref(h._data)
    y = square_of_positive(h)
    del h
    assert watch() is None
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0, 6.0])


def test_a_backward_kernel_must_name_what_it_reads():
    import pullback as pb

    @kernel
    def odd_backward(upstream, z):
        return upstream * z

    @kernel(backward=odd_backward)
    def odd(x):
        return x

    with pytest.raises(TypeError, match=r"parameter 'z' names neither an input of odd \(x\) "
                                        "nor forward_output"):
        odd(pb.ones(2))
    with pytest.raises(TypeError, match=r"returns 1 value\(s\), but a forward of 2 input"):
        kernel(backward=odd_backward)(lambda x, y: x * y)(pb.ones(2), pb.ones(2))


def test_row_kernels_write_into_a_contiguous_out_on_their_fast_path(rng, monkeypatch):
    """A C-contiguous `out` of the result's shape and dtype is written in place on the
    fast path (rows in and out, and other input kinds); any other `out` takes the
    general path, which writes it all the same or says why not."""
    from pullback.kernels import rows

    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    counts = np.array([[5, 2, 1, 0]] * 3, np.intp)
    want_softmax = rows.softmax(x)
    want_causal = rows.causal_softmax(x, counts, 0.5)
    general = []
    for k in (rows.softmax, rows.causal_softmax):
        monkeypatch.setattr(k, "_run", lambda *a, k=k, run=k._run: general.append(1) or run(*a))
    for fn, args, want in ((rows.softmax, (x,), want_softmax),
                           (rows.causal_softmax, (x, counts, 0.5), want_causal)):
        general.clear()
        out = np.full_like(x, np.nan)
        assert fn(*args, out=out) is out and not general
        np.testing.assert_array_equal(out, want)
        strided = np.full((3, 4, 10), np.nan, np.float32)[..., ::2]
        assert fn(*args, out=strided) is strided and general
        np.testing.assert_array_equal(strided, want)
        with pytest.raises(KernelError, match="out="):
            fn(*args, out=np.zeros(x.shape, np.float64))
