"""pullback.backend.heap: once pullback is imported, arrays freed in a step lend their
pages to the next step's instead of each being new pages from the kernel (glibc's
thresholds set once), unless the user set glibc's thresholds. Each case runs in a fresh
interpreter: the thresholds are per process, and glibc moves its own with what the
process has freed before."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the thresholds are glibc's")

# Page faults per step of eight 4 MiB arrays allocated, written and freed: what a
# training step's activations and gradients do. With glibc's own thresholds the freed
# heap top above its trim threshold goes back to the kernel, and every step faults in
# 32 MiB anew.
PROBE = """
import resource, sys
if sys.argv[1] == "pullback":
    import pullback
    from pullback.backend import heap
    print(heap.keep_freed_pages())
import numpy as np
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():
    arrays = [np.ones(1 << 20, np.float32) for _ in range(8)]
    del arrays
for _ in range(3):
    step()
start = faults()
for _ in range(10):
    step()
print((faults() - start) / 10)
"""


def _run(which: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", PROBE, which], capture_output=True,
                          text=True, env={**clean, **env}, check=True)
    return done.stdout.split()


def test_a_step_reuses_freed_pages_once_pullback_is_imported():
    (plain,) = _run("numpy")
    assert float(plain) > 1000  # glibc alone: the step's 32 MiB faulted in anew
    set_, ours = _run("pullback")
    assert set_ == "True"
    assert float(ours) < 10


def test_thresholds_the_user_set_are_kept():
    set_, faults = _run("pullback", MALLOC_TRIM_THRESHOLD_="1000000")
    assert set_ == "False"
    assert float(faults) > 1000  # the user's 1 MB trim threshold still trims
