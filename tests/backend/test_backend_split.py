"""Convolutions split over BLAS's threads by batch (pullback.backend.split): the parts
compute what the whole batch does (within the paths' float error: BLAS's products and
the weight gradient's sums round apart), take the whole batch's path, run at once,
and a part no worker has started is run by the caller; BLAS's thread count is lowered
while they run and restored after, nested and concurrent blocks counted."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pullback.backend import blas, split, winograd
from pullback.backend import conv as backend_conv
from pullback.kernels import spin

needs_openblas = pytest.mark.skipif(not blas.limitable(), reason="NumPy's BLAS is not OpenBLAS")


@pytest.fixture
def halves(monkeypatch):
    """Every convolution split in two (whatever BLAS's threads), or (False) none."""
    def choose(on: bool) -> None:
        monkeypatch.setattr(backend_conv, "SPLIT_MACS", 0 if on else 1 << 62)
        monkeypatch.setattr(split, "parts", lambda n: [(0, n // 2), (n // 2, n)] if n > 1
                            else [(0, n)])
    return choose


# (x shape, out channels, kernel, stride, padding): Winograd, im2col, small maps, 1x1,
# stride 2
CASES = [((4, 16, 12, 12), 16, 3, 1, 1), ((5, 3, 9, 9), 4, 3, 1, 0), ((6, 8, 4, 4), 8, 3, 1, 1),
         ((4, 6, 5, 5), 7, 1, 1, 0), ((5, 4, 9, 8), 6, 3, 2, 1)]


@pytest.mark.parametrize("case", CASES, ids=[str(c[0]) for c in CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_parts_compute_what_the_whole_batch_does(cpu, halves, case, dtype):
    shape, o, kernel, stride, padding = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal((o, shape[1], kernel, kernel)).astype(dtype)
    results = {}
    for on in (False, True):
        halves(on)
        y = cpu.conv2d(x, w, (stride, stride), (padding, padding))
        gx = cpu.conv2d_input_backward(y, w, x.shape, (stride, stride), (padding, padding))
        gw = cpu.conv2d_weight_backward(y, x, w.shape, (stride, stride), (padding, padding))
        results[on] = (y, gx, gw)
    # Parts round apart from the whole where BLAS's kernels depend on a product's width
    # (Winograd's 36 products have as many columns as the part has tiles) and where the
    # weight gradient adds the parts' sums; within the paths' own float error.
    for split_result, whole in zip(results[True], results[False]):
        scale = np.abs(whole).max()
        np.testing.assert_allclose(split_result, whole, rtol=0,
                                   atol=scale * 64 * np.finfo(dtype).eps)
    y1 = results[True][0]
    ref = F.conv2d(torch.from_numpy(x.astype(np.float64)), torch.from_numpy(w.astype(
        np.float64)), stride=stride, padding=padding).numpy()
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(y1, ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_a_split_epilogue_gets_the_whole_batch_rows(cpu, halves):
    halves(True)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 4, 9, 9)).astype(np.float32)
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(5).astype(np.float32)
    residual = rng.standard_normal((6, 5, 7, 7)).astype(np.float32)
    y = cpu.conv2d_epilogue(x, w, bias, None, None, residual, True, (1, 1), (0, 0))
    halves(False)
    plain = cpu.conv2d(x, w, (1, 1), (0, 0))
    np.testing.assert_array_equal(y, np.maximum(plain + bias[:, None, None] + residual, 0))


def test_parts_take_the_whole_batchs_path(cpu, halves, monkeypatch):
    # 8 samples of 8x8 maps are 32 Winograd tiles, the rule's least; each half has 16.
    halves(True)
    calls = []
    monkeypatch.setattr(winograd, "correlate",
                        lambda x, u, padding, out, scratch, *e: calls.append(x.shape) or out)
    x = np.zeros((8, 32, 8, 8), np.float32)
    cpu.conv2d(x, np.zeros((32, 32, 3, 3), np.float32), (1, 1), (1, 1))
    assert calls == [(4, 32, 8, 8), (4, 32, 8, 8)]


def test_over_parts_runs_parts_at_once_in_order_and_withdraws_unstarted_ones(monkeypatch):
    monkeypatch.setattr(split, "parts", lambda n: [(0, 1), (1, 2), (2, 3)])
    started = threading.Barrier(2, timeout=10)
    threads = {}

    def run(a: int, b: int) -> int:
        threads[a] = threading.get_ident()
        if a < 2:
            started.wait()  # parts 0 and 1 can only both pass if they run at once
        return a * 10

    assert split.over_parts(3, run) == [0, 10, 20]
    assert threads[0] == threading.get_ident() != threads[1]

    # A worker that never starts its part: the caller takes it back and runs it; a third
    # part, beyond a crew of one, runs on the caller too.
    idle = split._Worker.__new__(split._Worker)  # no thread: it never claims a part
    idle.flags, idle.at = np.zeros(split._SLOT, np.int64), 0
    idle.task, idle.outcome, idle.cond = None, (None, None), threading.Condition()
    monkeypatch.setattr(split, "_crew", [idle])
    ran_on = []
    out = split.over_parts(3, lambda a, b: ran_on.append(threading.get_ident()) or a)
    assert out == [0, 1, 2] and set(ran_on) == {threading.get_ident()}
    assert idle.flags[0] == split._TAKEN


def test_while_another_call_holds_the_crew_every_part_runs_on_the_caller(monkeypatch):
    monkeypatch.setattr(split, "parts", lambda n: [(0, 1), (1, 2)])
    ran_on = []
    with split._busy:
        out = split.over_parts(2, lambda a, b: ran_on.append(threading.get_ident()) or a)
    assert out == [0, 1] and set(ran_on) == {threading.get_ident()}
    started = threading.Barrier(2, timeout=10)  # the crew again, once it is free:
    assert split.over_parts(2, lambda a, b: started.wait() or a) == [0, 1]  # both at once


def test_a_flag_is_waited_for_and_claimed_as_the_python_oracle_says():
    # Compiled (no GIL, atomic load and store, cmpxchg) and plain Python agree.
    compiled = [spin.compiled(f) for f in (spin.wait_for, spin.claim, spin.publish_then_wait)]
    for wait_for, claim, publish in (compiled,
                                     (spin.wait_for, spin.claim, spin.publish_then_wait)):
        flags = np.zeros(16, np.int64)
        assert wait_for(flags, 3, 0, 1) and not wait_for(flags, 3, 1, 5000)
        assert claim(flags, 3, 0, 5) and flags[3] == 5
        assert not claim(flags, 3, 0, 7) and flags[3] == 5
        assert publish(flags, 4, 6, 6, 1) and flags[4] == 6  # stored, then seen
        assert not publish(flags, 4, 2, 6, 5000) and flags[4] == 2 and flags[3] == 5
    flags = np.zeros(16, np.int64)
    later = threading.Timer(0.05, flags.__setitem__, (8, 3))
    later.start()
    assert spin.compiled(spin.wait_for)(flags, 8, 3, 10**9)  # sees another thread's store
    later.join()


def test_a_part_that_outlasts_the_callers_polls_is_collected(monkeypatch):
    # The caller stops polling after WAIT_POLLS and naps between looks; the worker's part
    # ends during a nap and its result still comes back, in order.
    monkeypatch.setattr(split, "parts", lambda n: [(0, 1), (1, 2)])
    monkeypatch.setattr(split, "WAIT_POLLS", 1)
    naps, sleep = [], time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: naps.append(s) or sleep(s))
    started = threading.Event()

    def run(a: int, b: int) -> int:
        if a == 1:
            started.set()
            threading.Event().wait(0.05)
        else:
            assert started.wait(10)  # the worker has the other part
        return a + 10

    assert split.over_parts(2, run) == [10, 11]
    assert naps and naps[0] == 50e-6 and max(naps) == 1e-3  # the caller napped


def test_over_parts_raises_a_parts_error_after_every_part_is_done(monkeypatch):
    monkeypatch.setattr(split, "parts", lambda n: [(0, 1), (1, 2)])
    started, finished = threading.Event(), []

    def run(a: int, b: int) -> None:
        if a == 0:
            started.wait(10)  # part 1 is running on a worker
            raise ValueError("part 0 failed")
        started.set()
        threading.Event().wait(0.2)
        finished.append(a)

    with pytest.raises(ValueError, match="part 0 failed"):
        split.over_parts(2, run)
    assert finished == [1]


@needs_openblas
def test_one_thread_lowers_blas_and_restores_it_when_the_last_block_ends():
    get, _ = blas._functions()
    before = get()
    inner = threading.Event()
    leave = threading.Event()

    def other() -> None:
        with blas.one_thread():
            inner.set()
            leave.wait(10)

    with blas.one_thread():
        assert get() == 1 and blas.threads() == before  # the count splits are cut by
        worker = threading.Thread(target=other)
        worker.start()
        inner.wait(10)
    assert get() == 1  # the other block still runs
    leave.set()
    worker.join()
    assert get() == before


@needs_openblas
@pytest.mark.parametrize("splitting", [False, True])
def test_an_unsplit_convolution_runs_blas_on_one_thread_once_work_has_split(
        cpu, monkeypatch, splitting):
    """Below SPLIT_MACS a batch runs whole on the calling thread; BLAS threads its
    products until work has split in this process, then runs them on one thread (a
    spinning BLAS worker would take the split parts' core)."""
    get, _ = blas._functions()
    before = get()
    if before < 2:
        pytest.skip("BLAS runs on one thread here: nothing to lower")
    monkeypatch.setattr(backend_conv, "SPLIT_MACS", 1 << 62)
    monkeypatch.setattr(backend_conv, "DIRECT_FORCED", False)  # a path with products
    monkeypatch.setattr(blas, "_split", splitting)
    monkeypatch.setattr(blas, "_threaded", False)
    seen = []
    unfold = backend_conv.kernels.unfold

    def watched(*args):  # the im2col of a 3x3 convolution: inside the products' block
        seen.append(get())
        return unfold(*args)

    monkeypatch.setattr(backend_conv.kernels, "unfold", watched)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    y = cpu.conv2d(x, w, (1, 1), (0, 0))
    assert seen and set(seen) == ({1} if splitting else {before})
    assert blas.products_threaded() is not splitting  # noted where BLAS threads it
    assert get() == before
    ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_a_split_marks_the_process_as_splitting(cpu, halves, monkeypatch):
    monkeypatch.setattr(blas, "_split", False)
    x = np.ones((4, 2, 5, 5), np.float32)
    cpu.conv2d(x, np.ones((3, 2, 3, 3), np.float32), (1, 1), (1, 1))
    assert blas.splitting() is False  # halves(off) not yet chosen: as before
    halves(True)
    y = cpu.conv2d(x, np.ones((3, 2, 3, 3), np.float32), (1, 1), (1, 1))
    assert blas.splitting() is True
    assert y[0, 0, 2, 2] == 18.0  # every window inside: 2 channels x 9 ones


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX's")
def test_a_forked_child_splits_on_a_crew_of_its_own(monkeypatch):
    monkeypatch.setattr(split, "parts", lambda n: [(0, 1), (1, 2)])
    split.over_parts(2, lambda a, b: a)  # the parent's crew exists
    pid = os.fork()
    if pid == 0:  # the child: both parts must run at once, on a worker of its own
        try:
            started = threading.Barrier(2, timeout=10)
            ok = split.over_parts(2, lambda a, b: started.wait() or a) == [0, 1]
        except BaseException:  # any failure is the exit status
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_batch_norms_plane_kernels_split_their_channels_with_the_same_results(cpu,
                                                                             monkeypatch):
    # From SPLIT_NORM elements the forward, the statistics and the backward run their
    # channels in parts (each channel's passes in one part): the whole call's results.
    from pullback.backend import cpu as cpu_module
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 5, 6, 6)).astype(np.float32)
    u = rng.standard_normal(x.shape).astype(np.float32)
    w, b = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    cuts = []
    monkeypatch.setattr(split, "parts", lambda n: cuts.append(n) or [(0, 2), (2, n)])
    results = {}
    for least in (1 << 62, x.size):
        monkeypatch.setattr(cpu_module, "SPLIT_NORM", least)
        results[least] = [*cpu.batch_norm(x, w, b, 1e-5, relu=True),
                          *cpu.batch_norm_statistics(x),
                          *cpu.batch_norm_backward(u, x, w, 1e-5)]
    assert cuts == [5, 5, 5]  # only where the arrays reach SPLIT_NORM
    for whole, in_parts in zip(*results.values(), strict=True):
        np.testing.assert_array_equal(in_parts, whole)
