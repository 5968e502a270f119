"""im2col and col2im split over threads (pullback.kernels.split): bit for bit the
NumPy references (and so the serial loops) in every window case and both window
layouts, f32 and f64; and a worker that never gets the CPU costs the caller nothing."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from test_kernel_conv import WINDOW_CASES, _win, ref_fold, ref_unfold

from pullback.kernels import conv as kc
from pullback.kernels import split


@pytest.fixture
def three_threads(monkeypatch):
    """Every im2col and col2im split, as over 3 BLAS threads (6 uneven parts)."""
    monkeypatch.setattr(split, "PARALLEL_ELEMENTS", 0)
    monkeypatch.setattr(split, "_threads", [3])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_unfold_and_fold_match_the_references(rng, three_threads, dtype):
    for case in WINDOW_CASES:
        win = _win(*case)
        n, c = case[0][:2]
        x = rng.standard_normal(case[0]).astype(dtype)
        cols = rng.standard_normal((n, c, *win.kernel, *win.out_hw)).astype(dtype)
        for channels_outer in (False, True):
            if channels_outer:
                buffer = np.empty((c, *win.kernel, n, *win.out_hw), dtype=dtype)
                view = buffer.transpose(3, 0, 1, 2, 4, 5)
            else:
                buffer = view = np.empty((n, c, *win.kernel, *win.out_hw), dtype=dtype)
            kc.unfold(x, buffer, win.geometry(view), -2.5)
            np.testing.assert_array_equal(view, ref_unfold(x, win, -2.5), err_msg=str(case))
            view[...] = cols
            out = np.full(case[0], np.nan, dtype=dtype)  # every element must be overwritten
            kc.fold(buffer, out, win.geometry(view))
            np.testing.assert_array_equal(out, ref_fold(cols, case[0], win), err_msg=str(case))


def test_a_worker_that_never_runs_is_not_waited_for(monkeypatch, three_threads):
    # The pool's only worker is held by another task: the caller does every part itself
    # and withdraws the tasks it queued instead of waiting for them.
    release = threading.Event()
    pool = split.ThreadPoolExecutor(max_workers=1)
    busy = pool.submit(release.wait, 5.0)
    monkeypatch.setattr(split, "_pool", [pool])
    seen = []
    split.planes(lambda first, stop: seen.append((threading.get_ident(), first, stop)), 12,
                 1 << 20)
    here = threading.get_ident()
    assert seen == [(here, 0, 2), (here, 2, 4), (here, 4, 6), (here, 6, 8), (here, 8, 10),
                    (here, 10, 12)]
    assert not busy.done()  # the worker was busy throughout
    release.set()
    busy.result()
    pool.shutdown()


def test_small_work_runs_once_on_the_calling_thread(monkeypatch):
    monkeypatch.setattr(split, "_threads", [2])
    calls = []
    split.planes(lambda first, stop: calls.append((threading.get_ident(), first, stop)), 8,
                 split.PARALLEL_ELEMENTS - 1)
    assert calls == [(threading.get_ident(), 0, 8)]


@pytest.mark.parametrize(("env", "count"), [
    ({"OPENBLAS_NUM_THREADS": "3", "OMP_NUM_THREADS": "2"}, 3),
    ({"OMP_NUM_THREADS": "1"}, 1),
    ({"GOTO_NUM_THREADS": "4", "OMP_NUM_THREADS": "2"}, 4),
])
def test_the_thread_count_is_blas_s(monkeypatch, env, count):
    for var in split._BLAS_THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(split, "_threads", [])
    assert split.blas_threads() == count
