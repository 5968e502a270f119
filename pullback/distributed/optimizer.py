"""`DistributedOptimizer`: wraps an optimizer so that `step()` first averages every
parameter's gradient over all processes, then steps.

Gradients travel in buckets (buckets.py). A bucket's allreduce starts, non-blocking
(`Iallreduce`), as soon as the backward (a TRAINING plan's, or eager
`loss.backward()`) has finished the bucket's last gradient (the gradient-ready hook),
so communication overlaps the rest of the backward; `step()` waits for what is still
in flight and sends what was not sent yet (a bucket holding a parameter that got no
gradient). Buckets start in the same order on every process, so the collectives match.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import NDArray

from ..lower import on_gradient_ready
from ..optim import GradApplyer, TrainParams
from ..optim.applyer import GradLike
from ..tensor import Tensor
from ..tensor.hooks import HookHandle
from .buckets import DEFAULT_BUCKET_BYTES, Bucket, make_buckets
from .comm import group


class DistributedOptimizer:
    """`DistributedOptimizer(optimizer)`: every attribute and method is the wrapped
    optimizer's (`param_groups`, `state_dict`, `lr`, ...), except `step()` and
    `apply(pairs)`, which average the gradients over processes before the wrapped ones
    (`synchronize()` does only the averaging: call it before clipping gradients), and
    `zero_grad()`, which also forgets averaging in flight.

    `named_parameters` (optional, `model.named_parameters()`) names parameters in
    errors; `bucket_bytes` caps a bucket (25 MiB by default); `overlap=False` sends
    every bucket at `step()` instead of during the backward (to measure the overlap).
    A gradient missing (None) on some processes but not others is an error; missing
    on all, it stays None."""

    if TYPE_CHECKING:
        # The wrapped optimizer's, reached through __getattr__ / __setattr__ below:
        # spelled here so that type checkers know them.
        params: list[Tensor]
        param_groups: list[dict[str, Any]]
        defaults: dict[str, Any]
        train_params: TrainParams
        step_count: int

        @property
        def lr(self) -> float: ...

        def state_dict(self) -> dict[str, NDArray[Any]]: ...

        def load_state_dict(self, state: Mapping[str, GradLike]) -> None: ...

    def __init__(self, optimizer: GradApplyer,
                 named_parameters: Iterable[tuple[str, Tensor]] | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, overlap: bool = True) -> None:
        where = "DistributedOptimizer"
        self._group = group(where)
        params = getattr(optimizer, "params", None)
        if not isinstance(params, list) or not hasattr(optimizer, "step"):
            raise TypeError(f"{where}: expected a pullback optimizer (SGD, Adam, ...), got "
                            f"{type(optimizer).__name__}")
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, (int, np.integer)) \
                or bucket_bytes < 1:
            raise ValueError(f"{where}: bucket_bytes must be a positive integer, got "
                             f"{bucket_bytes!r}")
        self._opt = optimizer
        self._names = _names(params, named_parameters)
        self._buckets = make_buckets(params, self._names, int(bucket_bytes))
        self._where = {id(p): (b, k) for b, bucket in enumerate(self._buckets)
                       for k, p in enumerate(bucket.params)}
        self._next = 0  # the next bucket to start: buckets start in order
        self._checked = False
        self.overlap = overlap
        self._hook: HookHandle | None = None
        if overlap and self._group.size > 1:
            ref = weakref.ref(self)

            def hook(param: Tensor) -> None:
                me = ref()
                if me is not None:
                    me._gradient_ready(param)

            self._hook = on_gradient_ready(hook)

    def __getattr__(self, name: str) -> Any:
        opt = self.__dict__.get("_opt")
        if opt is None:
            raise AttributeError(name)
        return getattr(opt, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # The wrapper's own state is private (and `overlap`); the rest is the optimizer's.
        if name.startswith("_") or name == "overlap" or "_opt" not in self.__dict__:
            object.__setattr__(self, name, value)
        else:
            setattr(self._opt, name, value)

    def __del__(self) -> None:
        hook = self.__dict__.get("_hook")
        if hook is not None:
            hook.remove()

    def __repr__(self) -> str:
        return (f"DistributedOptimizer({self._opt!r}, {len(self._buckets)} buckets, "
                f"overlap={self.overlap})")

    @property
    def buckets(self) -> list[Bucket]:
        """The buckets, in the order they are sent."""
        return self._buckets

    # ------------------------------------------------------------ during the backward

    def _gradient_ready(self, param: Tensor) -> None:
        place = self._where.get(id(param))
        if place is None:
            return  # another optimizer's parameter
        bucket = self._buckets[place[0]]
        if bucket.launched:
            bucket.stale = True  # a second backward before step(): send it again then
            return
        if not bucket.ready[place[1]]:
            bucket.ready[place[1]] = True
            bucket.count += 1
        buckets = self._buckets
        while self._next < len(buckets) and buckets[self._next].complete:
            self._launch(buckets[self._next])
            self._next += 1
        # Open MPI moves a non-blocking message along only inside MPI calls: poke it.
        requests = [b.request for b in buckets[:self._next] if b.request is not None]
        if requests:
            self._group.mpi.Request.Testall(requests)

    def _launch(self, bucket: Bucket) -> None:
        if not self._checked:
            self._check_shapes()
        g = self._group
        bucket.request = g.comm.Iallreduce(g.mpi.IN_PLACE, bucket.pack(), op=g.mpi.SUM)
        bucket.launched = True

    # ------------------------------------------------------------ step

    def step(self) -> None:
        """Average each parameter's gradient over the processes, then step."""
        if self._group.size > 1:
            self.synchronize()
        self._opt.step()

    def apply(self, pairs: Iterable[tuple[Tensor, GradLike]]) -> None:
        """One update from explicit `(param, grad)` pairs (what `module.update` calls),
        each gradient averaged over the processes first; `.grad` is left as it was."""
        pairs = list(pairs)
        if self._group.size == 1:
            self._opt.apply(pairs)
            return
        given = {id(p): g for p, g in pairs}
        kept = [(p, p.grad) for p in self._opt.params]
        try:
            for p in self._opt.params:  # the pairs' gradients (copies) travel, and no other
                g = given.get(id(p))
                p.grad = None if g is None else Tensor(np.array(
                    g._data if isinstance(g, Tensor) else g, dtype=p.dtype))
            self.synchronize()
            # Each pair's parameter got a gradient above, which the average keeps (a
            # parameter not of this optimizer is refused by apply before its grad is read).
            averaged = [(p, cast(Tensor, p.grad)) for p, _ in pairs]
        finally:
            for p, g in kept:
                p.grad = g
        self._opt.apply(averaged)

    def synchronize(self) -> None:
        """Finish averaging the gradients (without stepping): start what the backward did
        not, wait for everything in flight, and leave the averages in `.grad`."""
        g = self._group
        if g.size == 1:
            return
        buckets = self._buckets
        try:
            while self._next < len(buckets):
                self._launch(buckets[self._next])
                self._next += 1
            g.mpi.Request.Waitall([b.request for b in buckets])
            for bucket in buckets:
                if bucket.stale:  # changed after it was sent: every process sends it again
                    g.comm.Allreduce(g.mpi.IN_PLACE, bucket.pack(), op=g.mpi.SUM)
            for bucket in buckets:
                self._check_flags(bucket)
            for bucket in buckets:
                bucket.unpack(g.size)
        finally:
            self._reset()

    def zero_grad(self) -> None:
        """Forget the gradients, and any averaging the last backward started."""
        if any(b.request is not None for b in self._buckets):
            self._group.mpi.Request.Waitall([b.request for b in self._buckets
                                             if b.request is not None])
        self._reset()
        self._opt.zero_grad()

    def _reset(self) -> None:
        for bucket in self._buckets:
            bucket.reset()
        self._next = 0

    # ------------------------------------------------------------ checks

    def _check_shapes(self) -> None:
        """Every process must train the same parameters: compared once, at the first
        bucket sent, before any gradient travels."""
        g = self._group
        mine = [(name, tuple(p.shape), np.dtype(p.dtype).name)
                for name, p in zip(self._names, self._opt.params)]
        # The buckets too: messages of other sizes would not match.
        layout = [(b.buffer.dtype.name, b.buffer.size) for b in self._buckets]
        every = g.comm.allgather((mine, layout))
        problems = _differences([sig for sig, _ in every])
        if problems:
            self._reset()
            raise ValueError("DistributedOptimizer: the processes train different parameters; "
                             + "; ".join(problems) + ". Build the same model on every process.")
        if len({repr(lay) for _, lay in every}) > 1:
            self._reset()
            raise ValueError("DistributedOptimizer: bucket_bytes differs between the processes: "
                             + ", ".join(f"rank {r} makes buckets of {[n for _, n in lay]} "
                                         "elements" for r, (_, lay) in enumerate(every))
                             + ". Pass the same bucket_bytes on every process.")
        self._checked = True

    def _check_flags(self, bucket: Bucket) -> None:
        size = self._group.size
        bad = [k for k, f in enumerate(bucket.flags) if f not in (0, size)]
        if not bad:
            return
        # Every process sees the same sums, so every process gathers here, then raises.
        having = self._group.comm.allgather([p.grad is not None for p in bucket.params])
        parts = []
        for k in bad:
            with_grad = [r for r, flags in enumerate(having) if flags[k]]
            without = [r for r, flags in enumerate(having) if not flags[k]]
            parts.append(f"parameter {bucket.names[k]!r} has a gradient on ranks {with_grad} "
                         f"but none (None) on ranks {without}")
        raise ValueError("DistributedOptimizer: " + "; ".join(parts) + ". Every process "
                         "must compute the same gradients (the same model and loss); a "
                         "missing gradient is not taken as zero")


def _names(params: list[Tensor], named_parameters: Iterable[tuple[str, Tensor]] | None
           ) -> list[str]:
    """A name per parameter: from `named_parameters`, else the name a module gave it,
    else its index in the optimizer."""
    given = {}
    if named_parameters is not None:
        given = {id(p): name for name, p in named_parameters}
    names = []
    for i, p in enumerate(params):
        name = given.get(id(p)) or getattr(getattr(p, "_node", None), "name", None)
        names.append(name or f"parameter {i}")
    return [f"{n} (parameter {i})" if names.count(n) > 1 else n for i, n in enumerate(names)]


def _differences(every: list[list[tuple[str, tuple[int, ...], str]]]) -> list[str]:
    """What differs between the processes' lists of (name, shape, dtype)."""
    counts = {r: len(sig) for r, sig in enumerate(every)}
    if len(set(counts.values())) > 1:
        by_count: dict[int, list[int]] = {}
        for r, n in counts.items():
            by_count.setdefault(n, []).append(r)
        return ["; ".join(f"ranks {ranks} have {n} parameters"
                          for n, ranks in sorted(by_count.items()))]
    problems = []
    for k in range(len(every[0])):
        variants: dict[tuple[tuple[int, ...], str], list[int]] = {}
        for r, sig in enumerate(every):
            variants.setdefault(sig[k][1:], []).append(r)
        if len(variants) > 1:
            name = every[0][k][0]
            problems.append(f"parameter {name!r} is " + " but ".join(
                f"{shape} {dtype} on ranks {ranks}" for (shape, dtype), ranks in variants.items()))
    return problems
