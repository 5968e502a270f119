"""Gradient buckets: parameters grouped, by bytes, into contiguous buffers that are
allreduced as one message each (Horovod's fusion buffer, PyTorch DDP's buckets).

A bucket holds parameters of one dtype (float32 and float64 are kept as they are),
in reverse order of the optimizer's list, since backward finishes the last layers'
gradients first. Its buffer holds the gradients one after another, then one flag
per parameter (1 where this process has a gradient), so the same sum tells every
process how many processes had each gradient.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tensor import Tensor

DEFAULT_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default


class Bucket:
    """Parameters whose gradients travel together, and the buffer they travel in."""

    def __init__(self, params: list[Tensor], names: list[str], dtype: np.dtype[Any]):
        self.params = params
        self.names = names
        self.offsets = np.cumsum([0] + [p.size for p in params]).tolist()
        total = self.offsets[-1]
        self.buffer = np.empty(total + len(params), dtype)
        self.flags = self.buffer[total:]
        self.ready = [False] * len(params)
        self.count = 0  # how many of `ready` are True
        self.request: Any = None  # the Iallreduce in flight (an mpi4py Request)
        self.launched = False
        self.stale = False  # a gradient changed after the bucket was sent

    @property
    def complete(self) -> bool:
        return self.count == len(self.params)

    def reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.count = 0
        self.request = None
        self.launched = self.stale = False

    def pack(self) -> np.ndarray:
        """Copy this process's gradients (zeros and flag 0 where one is missing) into the
        buffer, and return it."""
        for k, p in enumerate(self.params):
            part = self.buffer[self.offsets[k]:self.offsets[k + 1]]
            if p.grad is None:
                part.fill(0)
                self.flags[k] = 0
            else:
                np.copyto(part, p.grad._data.reshape(-1), casting="same_kind")
                self.flags[k] = 1
        return self.buffer

    def unpack(self, size: int) -> None:
        """Leave each summed gradient, divided by `size`, in its parameter's `.grad`
        (in place where the gradient is a writeable array of its own)."""
        scale = self.buffer.dtype.type(1.0 / size)
        for k, p in enumerate(self.params):
            if self.flags[k] == 0:
                continue  # no process had it: it stays None everywhere
            part = self.buffer[self.offsets[k]:self.offsets[k + 1]].reshape(p.shape)
            grad = p.grad
            if grad is not None and grad._data.dtype == part.dtype \
                    and grad._data.flags.writeable and grad._data.flags.c_contiguous:
                np.multiply(part, scale, out=grad._data)
            else:
                p.grad = type(p)(part * scale)


def make_buckets(params: list[Tensor], names: list[str], bucket_bytes: int) -> list[Bucket]:
    """Buckets of at most `bucket_bytes` each (a larger parameter gets one of its own),
    per dtype, filled in reverse order of `params`."""
    open_: dict[np.dtype[Any], tuple[list[Tensor], list[str], int]] = {}
    buckets: list[Bucket] = []
    for p, name in zip(reversed(params), reversed(names)):
        dtype = np.dtype(p.dtype)
        members, member_names, used = open_.get(dtype, ([], [], 0))
        nbytes = p.size * dtype.itemsize
        if members and used + nbytes > bucket_bytes:
            buckets.append(Bucket(members, member_names, dtype))
            members, member_names, used = [], [], 0
        members.append(p)
        member_names.append(name)
        open_[dtype] = (members, member_names, used + nbytes)
    for dtype, (members, member_names, _) in open_.items():
        if members:
            buckets.append(Bucket(members, member_names, dtype))
    return buckets
