"""The backend layer: forward ops (`Backend`), backward kernels (`BackwardOps`), and the
NumPy backends that implement both. Imports the kernels, the errors and NumPy."""

from pullback.backend.backward_ops import BackwardOps
from pullback.backend.base import Backend
from pullback.backend.cpu import CpuBackend
from pullback.backend.threaded import ThreadedCpuBackend
from pullback.errors import KernelError

__all__ = ["Backend", "BackwardOps", "CpuBackend", "KernelError", "ThreadedCpuBackend"]
