"""CPU time each library's idle worker threads burn after a parallel operation, on 2
threads: what one contender leaves running for the next when they take turns, and why
work of pullback's own on a second thread competes with OpenBLAS.

After one 1024 x 1024 float32 product (NumPy's OpenBLAS, then PyTorch's), the process
sleeps for a while and measures the CPU time it used meanwhile: a worker that spins
waiting for more work shows up as CPU time during the sleep. OpenBLAS's workers spin
for 2**OPENBLAS_THREAD_TIMEOUT clock ticks (28 unless set: about 0.1 s here) before
they sleep; `OPENBLAS_THREAD_TIMEOUT=4 python bench/blas_spin.py` shows the difference.

Run: `python bench/blas_spin.py`.
"""

from __future__ import annotations

import json
import resource
import sys
import time

from common import pin_threads

pin_threads(2)

import numpy as np  # noqa: E402
import torch  # noqa: E402

SLEEPS_MS = (1, 10, 50, 200)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def idle_cpu_after(product: object) -> dict[str, float]:
    """Per sleep length (ms): the process's CPU ms during that sleep, right after
    `product()` ran (best of 3: the least that other activity adds)."""
    found = {}
    for sleep_ms in SLEEPS_MS:
        best = float("inf")
        for _ in range(3):
            product()  # type: ignore[operator]
            start = _cpu()
            time.sleep(sleep_ms / 1e3)
            best = min(best, _cpu() - start)
        found[f"sleep {sleep_ms} ms"] = round(best * 1e3, 1)
    return found


def main() -> int:
    torch.set_num_threads(2)
    a = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    t = torch.from_numpy(a.copy())
    results = {"NumPy's OpenBLAS (pullback's GEMMs)": idle_cpu_after(lambda: a @ a),
               "PyTorch (MKL / oneDNN, OpenMP)": idle_cpu_after(lambda: t @ t)}
    print(json.dumps({"bench": "CPU ms used while sleeping right after a 2-thread "
                      "float32 1024^2 product", "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
