"""The backend layer: forward ops (`Backend`), backward kernels (`BackwardOps`), and the
NumPy backends that implement both. Imports NumPy and nothing else of pullback."""

from pullback.backend.backward_ops import BackwardOps
from pullback.backend.base import Backend
from pullback.backend.cpu import CpuBackend
from pullback.backend.errors import KernelError
from pullback.backend.threaded import ThreadedCpuBackend

__all__ = ["Backend", "BackwardOps", "CpuBackend", "KernelError", "ThreadedCpuBackend"]
