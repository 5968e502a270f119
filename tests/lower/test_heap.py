"""Training plans keep freed memory in glibc's heap (once per process), unless told not to."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import pullback as pb
from pullback.lower import heap

GLIBC = sys.platform.startswith("linux") and "glibc" in " ".join(
    __import__("platform").libc_ver())


def _kept(env_value: str | None) -> str:
    code = ("import numpy as np, pullback as pb\n"
            "w = pb.tensor(np.ones(3), requires_grad=True)\n"
            "pb.compile(lambda x: pb.sum(x * w), np.ones(3), mode=pb.LoweringMode.TRAINING)\n"
            "from pullback.lower import heap\n"
            "print(heap._done)")
    env = {"PATH": "/usr/bin:/bin"}
    if env_value is not None:
        env["PULLBACK_KEEP_HEAP"] = env_value
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env=env).stdout.strip()


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_a_training_plan_fixes_glibc_thresholds_once() -> None:
    assert _kept(None) == "[True]"


def test_the_environment_can_leave_glibc_alone() -> None:
    assert _kept("0") == "[False]"


def test_results_do_not_depend_on_it() -> None:
    w = pb.tensor(np.arange(3.0), requires_grad=True)
    plan = pb.compile(lambda x: pb.sum(x * w), np.ones(3), mode=pb.LoweringMode.TRAINING)
    assert heap._done  # the plan asked
    assert plan(np.array([1.0, 2.0, 3.0])).item() == 8.0
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0, 3.0])
