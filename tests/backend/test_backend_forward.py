"""CpuBackend forward ops against plain math / NumPy references, in f32 and f64."""

from __future__ import annotations

import inspect
import itertools
import math
import operator
import warnings

import numpy as np
import pytest

from pullback.backend import Backend, BackwardOps, CpuBackend, KernelError, ThreadedCpuBackend

FLOATS = [np.float32, np.float64]
TOL = {np.float32: {"rtol": 3e-6, "atol": 1e-6}, np.float64: {"rtol": 1e-12, "atol": 1e-14}}


def elementwise(fn, *arrays):
    """Apply a scalar Python function elementwise in f64, after NumPy broadcasting."""
    arrays = np.broadcast_arrays(*[np.asarray(a, dtype=np.float64) for a in arrays])
    flat = [fn(*(float(a.flat[i]) for a in arrays)) for i in range(arrays[0].size)]
    return np.array(flat).reshape(arrays[0].shape)


def sample(rng, shape, dtype, domain="real"):
    low, high = {"real": (-4, 4), "positive": (0.1, 5), "wide": (-7, 7)}[domain]
    return rng.uniform(low, high, size=shape).astype(dtype)


def _gelu_tanh(v):
    return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))


UNARY = [
    ("neg", lambda v: -v, "real"),
    ("exp", math.exp, "real"),
    ("log", math.log, "positive"),
    ("sqrt", math.sqrt, "positive"),
    ("abs", abs, "real"),
    ("sign", lambda v: float((v > 0) - (v < 0)), "real"),
    ("relu", lambda v: max(v, 0.0), "real"),
    ("sigmoid", lambda v: 1 / (1 + math.exp(-v)), "real"),
    ("tanh", math.tanh, "real"),
    ("silu", lambda v: v / (1 + math.exp(-v)), "real"),
    ("softplus", lambda v: math.log1p(math.exp(v)), "real"),
    ("erf", math.erf, "wide"),
    ("gelu", lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))), "wide"),
    ("sin", math.sin, "wide"),
    ("cos", math.cos, "wide"),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("op", "ref", "domain"), UNARY, ids=[u[0] for u in UNARY])
def test_unary_matches_math_reference(cpu, rng, op, ref, domain, dtype):
    x = sample(rng, (4, 50), dtype, domain)
    out = getattr(cpu, op)(x)
    assert out.dtype == dtype and out.shape == x.shape
    np.testing.assert_allclose(out, elementwise(ref, x), **TOL[dtype])


@pytest.mark.parametrize("dtype", FLOATS)
def test_gelu_tanh_approximation_matches_formula(cpu, rng, dtype):
    x = sample(rng, (3, 40), dtype)
    out = cpu.gelu(x, approximate="tanh")
    assert out.dtype == dtype
    np.testing.assert_allclose(out, elementwise(_gelu_tanh, x), **TOL[dtype])


def test_erf_is_accurate_across_its_range(cpu):
    x = np.linspace(-8, 8, 20001)
    np.testing.assert_allclose(cpu.erf(x), elementwise(math.erf, x), rtol=0, atol=4e-15)
    assert np.isnan(cpu.erf(np.array([np.nan])))[0]
    assert list(cpu.erf(np.array([-np.inf, np.inf]))) == [-1.0, 1.0]


@pytest.mark.parametrize("dtype", FLOATS)
def test_sigmoid_and_softplus_are_stable_without_warnings(cpu, dtype):
    x = np.array([-1000, -100, -20, 0, 20, 100, 1000], dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sig, soft = cpu.sigmoid(x), cpu.softplus(x)
    assert sig[0] == 0 and sig[-1] == 1 and sig[3] == 0.5
    np.testing.assert_allclose(sig[2], 1 / (1 + math.exp(20)), rtol=1e-5)
    assert soft[0] == 0 and soft[-1] == 1000
    np.testing.assert_allclose(soft[2], math.log1p(math.exp(-20)), rtol=1e-5)


def test_log_of_zero_is_minus_inf(cpu):
    assert cpu.log(np.array([0.0], dtype=np.float32))[0] == -np.inf


@pytest.mark.parametrize(("op", "ref"), [("neg", operator.neg), ("abs", abs),
                                         ("sign", lambda v: (v > 0) - (v < 0))])
def test_sign_abs_neg_accept_ints(cpu, op, ref):
    x = np.array([-3, 0, 2, 7], dtype=np.int32)
    out = getattr(cpu, op)(x)
    assert out.dtype == np.int32
    assert out.tolist() == [ref(v) for v in x.tolist()]


BINARY = [
    ("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
    ("div", operator.truediv), ("pow", operator.pow), ("maximum", max), ("minimum", min),
]
COMPARE = [
    ("less", operator.lt), ("less_equal", operator.le), ("greater", operator.gt),
    ("greater_equal", operator.ge), ("equal", operator.eq), ("not_equal", operator.ne),
]
SHAPES = [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((4,), ()), ((), (2, 1))]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("lhs_shape", "rhs_shape"), SHAPES)
@pytest.mark.parametrize(("op", "ref"), BINARY, ids=[b[0] for b in BINARY])
def test_binary_broadcasts_like_numpy(cpu, rng, op, ref, lhs_shape, rhs_shape, dtype):
    a = sample(rng, lhs_shape, dtype, "positive")
    b = sample(rng, rhs_shape, dtype, "positive")
    out = getattr(cpu, op)(a, b)
    assert isinstance(out, np.ndarray) and out.dtype == dtype
    np.testing.assert_allclose(out, elementwise(ref, a, b), **TOL[dtype])


@pytest.mark.parametrize(("op", "ref"), BINARY, ids=[b[0] for b in BINARY])
def test_binary_python_scalar_keeps_f32(cpu, rng, op, ref):
    a = sample(rng, (5,), np.float32, "positive")
    for out, expected in ((getattr(cpu, op)(a, 1.5), elementwise(ref, a, 1.5)),
                          (getattr(cpu, op)(2, a), elementwise(ref, 2, a))):
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, expected, **TOL[np.float32])


@pytest.mark.parametrize(("op", "ref"), COMPARE, ids=[c[0] for c in COMPARE])
def test_comparisons_return_bools(cpu, op, ref):
    a = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    b = np.array([[2.0], [2.0]], dtype=np.float32)
    out = getattr(cpu, op)(a, b)
    assert out.dtype == np.bool_ and out.shape == (2, 3)
    assert out.tolist() == elementwise(ref, a, b).astype(bool).tolist()
    assert getattr(cpu, op)(a, 2.0).tolist() == [[ref(v, 2.0) for v in (1.0, 2.0, 3.0)]]


def test_where_broadcasts_condition_and_scalar(cpu, rng):
    cond = np.array([[True], [False], [True]])
    a = sample(rng, (3, 4), np.float32)
    out = cpu.where(cond, a, 0.0)
    assert out.dtype == np.float32
    expected = [[v if c[0] else 0.0 for v in row] for c, row in zip(cond, a.tolist(), strict=True)]
    np.testing.assert_allclose(out, expected)


@pytest.mark.parametrize(("lo", "hi"), [(-1.0, 1.0), (None, 0.5), (-0.5, None), (None, None)])
def test_clip_bounds(cpu, rng, lo, hi):
    x = sample(rng, (10,), np.float32)
    out = cpu.clip(x, lo, hi)

    def clamp(v):
        v = v if lo is None else max(v, lo)
        return v if hi is None else min(v, hi)

    assert out.dtype == np.float32 and out is not x
    np.testing.assert_allclose(out, elementwise(clamp, x), rtol=1e-7)


def test_astype_copies_and_converts(cpu):
    x = np.array([1.7, -2.2], dtype=np.float64)
    out = cpu.astype(x, np.int32)
    assert out.dtype == np.int32 and out.tolist() == [1, -2]
    same = cpu.astype(x, np.float64)
    assert same is not x and not np.shares_memory(same, x)


def _reduce_reference(x, axes, keepdims, combine):
    kept = [a for a in range(x.ndim) if a not in axes]
    rows = np.transpose(x, kept + list(axes)).reshape(*[x.shape[a] for a in kept], -1)
    flat = rows.reshape(-1, rows.shape[-1])
    values = np.array([combine(r.tolist()) for r in flat]).reshape(rows.shape[:-1])
    if keepdims:
        values = values.reshape([1 if a in axes else x.shape[a] for a in range(x.ndim)])
    return values


AXES = [(), (0,), (1,), (0, 2), (0, 1, 2)]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axes", AXES)
def test_reduce_sum_matches_fsum(cpu, rng, axes, keepdims, dtype):
    x = sample(rng, (2, 3, 4), dtype)
    out = cpu.reduce_sum(x, axes, keepdims)
    assert isinstance(out, np.ndarray) and out.dtype == dtype
    np.testing.assert_allclose(out, _reduce_reference(x, axes, keepdims, math.fsum), **TOL[dtype])


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axes", AXES)
def test_reduce_max_matches_python_max(cpu, rng, axes, keepdims):
    x = sample(rng, (2, 3, 4), np.float32)
    out = cpu.reduce_max(x, axes, keepdims)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, _reduce_reference(x, axes, keepdims, max))


def test_reduce_with_no_axes_copies(cpu):
    x = np.arange(6.0).reshape(2, 3)
    for out in (cpu.reduce_sum(x, (), False), cpu.reduce_max(x, (), True)):
        assert out is not x and not np.shares_memory(out, x)
        np.testing.assert_array_equal(out, x)


def test_reshape_transpose_broadcast_to(cpu):
    x = np.arange(24.0).reshape(2, 3, 4)
    assert cpu.reshape(x, (4, 6)).tolist() == x.ravel().reshape(4, 6).tolist()
    t = cpu.transpose(x, (2, 0, 1))
    assert t.shape == (4, 2, 3) and t[3, 1, 2] == x[1, 2, 3]
    b = cpu.broadcast_to(np.array([1.0, 2.0]), (3, 2))
    assert b.tolist() == [[1.0, 2.0]] * 3


@pytest.mark.parametrize(
    ("shape", "target", "axes"),
    [((2, 3, 4), (3, 1), (0, 2)), ((2, 3, 4), (4,), (0, 1)), ((5,), (), (0,)),
     ((2, 1, 4), (1, 4), (0,)), ((3, 4), (3, 4), ())],
)
def test_sum_to_shape_undoes_broadcasting(cpu, rng, shape, target, axes):
    x = sample(rng, shape, np.float64)
    out = cpu.sum_to_shape(x, target)
    assert out.shape == target and (out is x) == (shape == target)
    expected = _reduce_reference(x, axes, False, math.fsum).reshape(target)
    np.testing.assert_allclose(out, expected, rtol=1e-12)


INDICES = [
    2, slice(1, 3), (slice(None), 0), (Ellipsis, None), np.array([0, 2, 2]),
    np.array([True, False, True, True]), (np.array([0, 1, 3]), np.array([1, 2, 1])),
    (slice(None, None, -1), np.array([2, 0])),
]


@pytest.mark.parametrize("index", INDICES, ids=range(len(INDICES)))
def test_getitem_matches_numpy_and_copies(cpu, rng, index):
    x = sample(rng, (4, 3), np.float64)
    out = cpu.getitem(x, index)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, x[index])
    assert not np.shares_memory(out, x)


@pytest.mark.parametrize("index", INDICES, ids=range(len(INDICES)))
def test_scatter_add_is_adjoint_of_getitem(cpu, rng, index):
    x = sample(rng, (4, 3), np.float64)
    values = sample(rng, np.shape(x[index]), np.float64)
    back = cpu.scatter_add(values, index, x.shape)
    assert back.shape == x.shape and back.dtype == values.dtype
    np.testing.assert_allclose(np.sum(cpu.getitem(x, index) * values), np.sum(x * back))


def test_scatter_add_accumulates_repeated_indices(cpu):
    out = cpu.scatter_add(np.array([1.0, 2.0, 4.0]), np.array([0, 2, 2]), (4,))
    assert out.tolist() == [1.0, 0.0, 6.0, 0.0]


def test_concatenate_joins_along_axis(cpu):
    a, b = np.ones((2, 3)), np.zeros((2, 1))
    assert cpu.concatenate([a, b], 1).tolist() == [[1.0, 1.0, 1.0, 0.0]] * 2
    assert cpu.concatenate((a, a), 0).shape == (4, 3)


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4, 5)])
def test_pad2d_pads_last_two_axes(cpu, rng, shape):
    x = sample(rng, shape, np.float32)
    out = cpu.pad2d(x, (1, 2), value=-3.0)
    assert out.shape == (*shape[:-2], shape[-2] + 2, shape[-1] + 4) and out.dtype == np.float32
    np.testing.assert_array_equal(out[..., 1:-1, 2:-2], x)
    border = np.ones(out.shape, bool)
    border[..., 1:-1, 2:-2] = False
    assert np.all(out[border] == -3.0)
    assert cpu.pad2d(x, (0, 0)) is not x


MATMUL_SHAPES = [
    ((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
    ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 5)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("lhs_shape", "rhs_shape"), MATMUL_SHAPES)
def test_matmul_matches_einsum(cpu, rng, lhs_shape, rhs_shape, dtype):
    a, b = sample(rng, lhs_shape, dtype), sample(rng, rhs_shape, dtype)
    out = cpu.matmul(a, b)
    a2 = a if a.ndim > 1 else a[None]
    b2 = b if b.ndim > 1 else b[:, None]
    expected = np.einsum("...ik,...kj->...ij", a2, b2)
    if a.ndim == 1:
        expected = expected[..., 0, :]
    if b.ndim == 1:
        expected = expected[..., 0]
    assert isinstance(out, np.ndarray) and out.dtype == dtype
    np.testing.assert_allclose(out, expected, **TOL[dtype])


def _softmax_rows(row):
    top = max(row)
    exps = [math.exp(v - top) for v in row]
    total = math.fsum(exps)
    return [e / total for e in exps], [v - top - math.log(total) for v in row]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_and_log_softmax_are_stable(cpu, rng, axis, dtype):
    x = sample(rng, (3, 5), dtype) * 300  # exp would overflow without the max shift
    moved = np.moveaxis(x, axis, -1).astype(np.float64)
    soft = np.array([_softmax_rows(r)[0] for r in moved.tolist()])
    log_soft = np.array([_softmax_rows(r)[1] for r in moved.tolist()])
    out, log_out = cpu.softmax(x, axis), cpu.log_softmax(x, axis)
    assert out.dtype == dtype and log_out.dtype == dtype
    np.testing.assert_allclose(out, np.moveaxis(soft, -1, axis), **TOL[dtype])
    np.testing.assert_allclose(log_out, np.moveaxis(log_soft, -1, axis),
                               rtol=TOL[dtype]["rtol"], atol=1e-4 if dtype == np.float32 else 1e-10)


def test_creation_ops(cpu):
    source = np.array([1.0, 2.0])
    made = cpu.asarray(source, np.float32)
    assert made.dtype == np.float32 and made.tolist() == [1.0, 2.0]
    copied = cpu.asarray(source)
    assert copied is not source and not np.shares_memory(copied, source)
    assert cpu.asarray([[1, 2], [3, 4]]).shape == (2, 2)
    assert cpu.zeros((2, 3), np.float32).tolist() == [[0.0] * 3] * 2
    assert cpu.ones((2,), np.float64).dtype == np.float64
    assert cpu.full((2,), 7.5, np.float32).tolist() == [7.5, 7.5]
    assert cpu.arange(0, 5, 2, np.int64).tolist() == [0, 2, 4]
    assert cpu.arange(3, 0, -1, np.float32).tolist() == [3.0, 2.0, 1.0]
    assert cpu.to_numpy(source) is source


def test_every_backend_op_has_a_docstring():
    ops = [name for name, value in vars(Backend).items()
           if callable(value) and not name.startswith("_")]
    assert len(ops) == 63  # 58, and reduce_min, reduce_prod, argmax, argmin, argsort
    assert all(getattr(Backend, name).__doc__ for name in ops)


def test_overrides_keep_the_contract_argument_names():
    for base in (Backend, BackwardOps):
        for name, method in vars(base).items():
            if name.startswith("_") or not callable(method):
                continue
            expected = list(inspect.signature(method).parameters)
            for backend in (CpuBackend, ThreadedCpuBackend):
                assert list(inspect.signature(getattr(backend, name)).parameters) == expected, (
                    backend.__name__, name)


BACKWARD_UNARY = ["relu_backward", "sigmoid_backward", "tanh_backward", "exp_backward",
                  "log_backward", "sqrt_backward", "abs_backward", "silu_backward",
                  "softplus_backward", "gelu_backward"]


@pytest.mark.parametrize("backend_type", [CpuBackend, ThreadedCpuBackend])
def test_zero_dim_operands_give_arrays_not_scalars(backend_type):
    backend = backend_type()
    x = np.array(0.5, dtype=np.float32)
    results = [getattr(backend, op)(x) for op, _, _ in UNARY]
    results += [getattr(backend, op)(x, x) for op, _ in BINARY + COMPARE]
    results += [getattr(backend, op)(x, x) for op in BACKWARD_UNARY]
    results += [backend.add(x, 1.5), backend.matmul(np.ones(3), np.ones(3)),
                backend.reduce_sum(np.ones(3), (0,), False), backend.reduce_max(x, (), False),
                backend.getitem(np.ones(3), 1), backend.clip(x, 0, 1), backend.where(True, x, x),
                backend.sum_to_shape(np.ones(3), ())]
    assert all(isinstance(r, np.ndarray) for r in results)


@pytest.mark.parametrize("backend_type", [CpuBackend, ThreadedCpuBackend])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_cumsum_matches_running_python_sums(backend_type, rng, axis, reverse):
    x = sample(rng, (3, 4, 5), np.float64)
    moved = np.moveaxis(x, axis, -1)
    want = np.empty_like(moved)
    for index in np.ndindex(moved.shape[:-1]):
        row = moved[index][::-1] if reverse else moved[index]
        sums = list(itertools.accumulate(row.tolist()))
        want[index] = sums[::-1] if reverse else sums
    out = backend_type().cumsum(x, axis, reverse)
    assert out.flags.c_contiguous and not np.shares_memory(out, x)
    np.testing.assert_allclose(out, np.moveaxis(want, -1, axis), **TOL[np.float64])


def test_cumsum_widens_small_ints_and_bools_as_numpy_and_checks_its_axis(cpu):
    assert cpu.cumsum(np.array([True, True, False]), 0, True).tolist() == [2, 1, 0]
    assert cpu.cumsum(np.arange(3, dtype=np.int32), 0).dtype == np.cumsum(
        np.arange(3, dtype=np.int32)).dtype
    with pytest.raises(KernelError, match=r"cumsum: .*axis 2 is out of range for 2 dimensions"):
        cpu.cumsum(np.ones((2, 3)), 2)
