"""In-place operators and methods (`+= -= *= /=`, `add_`, `mul_`, `zero_`, `fill_`,
`copy_`) with PyTorch's rules, and iteration along the first axis."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb


def test_hand_written_sgd_under_no_grad_updates_the_parameter_in_place() -> None:
    x = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    w0 = np.array([0.3, -0.7], np.float32)
    p, tp = pb.tensor(w0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    same = p
    for _ in range(3):
        ((pb.tensor(x) @ p) ** 2).sum().backward()
        ((torch.tensor(x) @ tp) ** 2).sum().backward()
        with pb.no_grad():
            p -= 0.01 * p.grad
            p.grad = None
        with torch.no_grad():
            tp -= 0.01 * tp.grad
            tp.grad = None
    assert p is same and p.requires_grad and p.is_leaf
    np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-6)


@pytest.mark.parametrize("update", [
    lambda p: p.__iadd__(1.0), lambda p: p.__isub__(1.0), lambda p: p.__imul__(2.0),
    lambda p: p.__itruediv__(2.0), lambda p: p.add_(1.0), lambda p: p.mul_(2.0),
    lambda p: p.zero_(), lambda p: p.fill_(3.0), lambda p: p.copy_(pb.ones(2)),
], ids=["iadd", "isub", "imul", "idiv", "add_", "mul_", "zero_", "fill_", "copy_"])
def test_a_leaf_that_requires_grad_refuses_in_place_ops_while_recording(update) -> None:
    p = pb.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^\w+_: a leaf tensor that requires grad"):
        update(p)
    np.testing.assert_array_equal(p.numpy(), [1.0, 2.0])
    with pb.no_grad():
        update(p)  # allowed under no_grad, as in PyTorch
    assert p.is_leaf and p.requires_grad


def test_in_place_methods_match_pytorch() -> None:
    data = np.array([[1.0, -2.0, 0.5], [4.0, 0.25, -1.0]], np.float32)
    t, tt = pb.tensor(data), torch.tensor(data)
    for ours, theirs in [
        (lambda a: a.add_(pb.tensor([1.0, 2.0, 3.0]), alpha=0.5),
         lambda a: a.add_(torch.tensor([1.0, 2.0, 3.0]), alpha=0.5)),
        (lambda a: a.mul_(pb.tensor([[2.0], [-1.0]])),
         lambda a: a.mul_(torch.tensor([[2.0], [-1.0]]))),
        (lambda a: a.__itruediv__(4.0), lambda a: a.__itruediv__(4.0)),
        (lambda a: a.__isub__(pb.tensor(0.5)), lambda a: a.__isub__(torch.tensor(0.5))),
    ]:
        assert ours(t) is t
        theirs(tt)
        np.testing.assert_allclose(t.numpy(), tt.numpy(), rtol=1e-6)
    view = t.numpy()  # shares memory: sees the in-place writes, as in PyTorch
    t.fill_(7.0)
    assert view[0, 0] == 7.0
    t.zero_()
    assert not view.any()
    t.copy_(np.array([1.0, 2.0, 3.0]))  # broadcast and cast, as PyTorch's copy_
    np.testing.assert_array_equal(view, [[1.0, 2.0, 3.0]] * 2)
    assert t.dtype == np.float32


def test_in_place_refuses_a_dtype_or_shape_it_cannot_hold() -> None:
    i = pb.tensor([1, 2])
    with pytest.raises(pb.KernelError, match=r"^add_: .*float64.*int64"):
        i += 1.5
    i += 3  # int into int is fine
    np.testing.assert_array_equal(i.numpy(), [4, 5])
    x = pb.zeros(3)
    with pytest.raises(pb.KernelError, match=r"^mul_: .*shape \(2, 3\)"):
        x *= pb.ones(2, 3)
    with pytest.raises(pb.KernelError, match=r"^copy_"):
        x.copy_(pb.ones(2))
    with pytest.raises(pb.KernelError, match=r"^add_: \(3,\) and \(2,\): .*broadcast"):
        x += pb.ones(2)  # named for the op called, not the add it runs
    with pytest.raises(TypeError, match=r"^fill_"):
        x.fill_("a")


def test_in_place_ops_on_recorded_results_are_recorded_as_pytorch_records_them() -> None:
    x0 = np.array([0.5, -1.5, 2.0], np.float32)
    w0 = np.array([1.5, 2.0, -0.5], np.float32)
    x, w = pb.tensor(x0, requires_grad=True), pb.tensor(w0, requires_grad=True)
    tx, tw = torch.tensor(x0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    for a, b in ((x, w), (tx, tw)):
        h = a * 2.0
        h += b
        h *= 3.0
        h /= 2.0
        h.add_(a, alpha=-1.0)
        c = a * 0.0
        c.copy_(h)  # gradients flow to the source, none to the old values
        (c * b).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6)


def test_in_place_add_of_a_tensor_that_requires_grad_makes_the_target_record() -> None:
    w = pb.tensor([1.0, 2.0], requires_grad=True)
    acc = pb.zeros(2)
    acc += w * w
    assert acc.requires_grad and not acc.is_leaf
    acc.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 4.0])


def test_in_place_write_into_a_value_a_pending_backward_needs_raises() -> None:
    a = pb.tensor([1.0, 2.0])
    w = pb.tensor([3.0, 4.0], requires_grad=True)
    loss = (a * w).sum()  # mul saves a for w's gradient
    with pytest.raises(RuntimeError, match=r"^add_: .*pending backward of mul"):
        a += 1.0
    loss.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0])
    a += 1.0  # free again once the backward has run
    np.testing.assert_array_equal(a.numpy(), [2.0, 3.0])


def test_in_place_write_through_a_view_of_a_saved_array_raises() -> None:
    base = np.arange(4, dtype=np.float32)
    view = pb.from_numpy(base[:2])  # made before the array is saved, so still writeable
    t = pb.from_numpy(base)
    t.requires_grad = True
    y = (t * t).sum()
    with pytest.raises(RuntimeError, match="pending backward of mul"):
        view += 1.0
    y.backward()
    np.testing.assert_array_equal(t.grad.numpy(), [0.0, 2.0, 4.0, 6.0])


def test_in_place_ops_refuse_to_be_compiled() -> None:
    def fn(x):
        y = x * 2.0
        y += 1.0
        return y

    with pytest.raises(RuntimeError, match=r"^add_: in-place ops cannot be traced"):
        pb.compile(fn, pb.ones(2))


# ---------------------------------------------------------------- iteration


def test_tensors_iterate_and_unpack_along_the_first_axis() -> None:
    t = pb.randn(3, 2, seed=0)
    q, k, v = t
    for row, expected in zip((q, k, v), t.numpy()):
        np.testing.assert_array_equal(row.numpy(), expected)
    rows = [row for row in t]
    assert len(rows) == 3 and all(r.shape == (2,) for r in rows)
    assert [int(i) for i in pb.tensor([4, 5, 6])] == [4, 5, 6]
    with pytest.raises(TypeError, match="0-d"):
        iter(pb.tensor(1.0))


def test_iteration_keeps_gradients() -> None:
    x = pb.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    a, b = x
    (a * b).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[3.0, 4.0], [1.0, 2.0]])


def test_pytorch_reads_a_tensor_through_dlpack() -> None:
    t = pb.randn(3, 2, seed=1)
    np.testing.assert_array_equal(torch.tensor(t).numpy(), t.numpy())
    shared = torch.from_dlpack(t)
    shared[0, 0] = 9.0
    assert t.numpy()[0, 0] == 9.0
    back = pb.from_dlpack(torch.arange(3.0))
    np.testing.assert_array_equal(back.numpy(), [0.0, 1.0, 2.0])


def test_an_index_out_of_range_is_an_index_error_and_a_kernel_error() -> None:
    t = pb.ones(3, 2)
    for index in (3, (0, 5), -4):
        with pytest.raises(IndexError, match=r"^getitem: \(3, 2\)") as info:
            t[index]
        assert isinstance(info.value, pb.KernelError)


def test_in_place_casts_another_float_dtype_as_pytorch_does() -> None:
    x, tx = pb.ones(3), torch.ones(3)
    x += pb.tensor([0.5, 1.5, 2.5], dtype=pb.float64)
    tx += torch.tensor([0.5, 1.5, 2.5], dtype=torch.float64)
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x.numpy(), tx.numpy())
    w = pb.tensor([1.0, 2.0], dtype=pb.float64, requires_grad=True)
    h = pb.ones(2) * 2.0
    h.mul_(w)  # recorded through the cast: w's gradient keeps w's dtype
    h.sum().backward()
    assert w.grad.dtype == np.float64
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 2.0])
