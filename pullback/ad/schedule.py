"""The backward schedule: which node runs when, where cotangents accumulate, when each
is freed, computed in one traversal and run by `run_schedule`.

A schedule numbers the nodes of a recorded graph in the order backward visits them
(each after every node that reads it) and gives each step the numbers of its
parents, so that a cotangent accumulates in a slot and is dropped the moment its
node consumes it. Eager backward computes one per call (`backward_pass`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .core import DerivativeError
from .executor import BackwardExecutor
from .graph import relevant_to, toposort


class BackwardSchedule:
    """The steps of a backward pass from `roots`, stopping at leaves and, when given, at
    `targets` (and skipping every node that does not lead to one).

    `nodes[i]` is step i's node, outputs before inputs; `parents[i]` the steps its
    operands' cotangents accumulate into (None for an inactive operand, or one that
    leads to no target); `ends[i]` whether step i is a leaf or a target, whose
    cotangent is a result rather than pushed further.
    """

    __slots__ = ("ends", "index", "nodes", "parents")

    def __init__(self, roots: Iterable[Any], targets: Sequence[Any] | None = None):
        order = toposort(roots)
        stops: set[int] = set()
        if targets is not None:
            order = relevant_to(order, targets)
            stops = {id(t) for t in targets}
        order.reverse()
        index = {id(node): i for i, node in enumerate(order)}
        get = index.get
        parents: list[tuple] = []
        ends: list[bool] = []
        # Computed per eager backward call: plain loops, no generator per node.
        for node in order:
            ps = node.parents
            if len(ps) == 1:
                p = ps[0]
                parents.append((None if p is None else get(id(p)),))
            else:
                parents.append(tuple([None if p is None else get(id(p)) for p in ps]))
            ends.append(node.primitive is None or id(node) in stops)
        self.nodes = order
        self.index = index
        self.parents = parents
        self.ends = ends


def run_schedule(schedule: BackwardSchedule, roots: Sequence[tuple[Any, Any]],
                 executor: BackwardExecutor,
                 release: bool = False,
                 on_result: Callable[[Any, Any], None] | None = None) -> dict:
    """Push the cotangents of `roots` (pairs of node and cotangent) through the schedule.

    Returns the cotangent reaching each end (leaf or target). Cotangents are
    accumulated with the executor's `add_operands`; each node is linearized and
    transposed by the executor. With `release`, each node's saved values are freed
    (`release_saved`) once it has been processed, or skipped for want of a cotangent.
    `on_result(end, ct)`, when given, is called the moment an end's cotangent is
    final (its step is reached), while the rest of the backward still runs: a
    training plan hands each parameter's gradient on from there.
    """
    cts: list[Any] = [None] * len(schedule.nodes)
    add = executor.add_operands
    for node, ct in roots:
        i = schedule.index.get(id(node))
        if i is not None:  # a root that leads to no target contributes nothing
            cts[i] = ct if cts[i] is None else add(cts[i], ct)
    results: dict = {}
    linearize = executor.linearize_recorded_graph
    transpose = executor.run_transposed_linear
    # The default frees through the node itself, without a call through the executor.
    free = None if type(executor).release_saved is BackwardExecutor.release_saved \
        else executor.release_saved
    for i, (node, parents, end) in enumerate(zip(schedule.nodes, schedule.parents,
                                                 schedule.ends)):
        ct = cts[i]
        cts[i] = None  # consumed: nothing holds it after this step
        if end:
            if ct is not None:
                results[node] = ct
                if on_result is not None:
                    on_result(node, ct)
            continue
        if ct is None:
            if release:
                node.release() if free is None else free(node)
            continue
        try:
            lin = linearize(node)
        except DerivativeError as err:
            raise executor.derivative_error(node, err) from None
        in_cts = transpose(lin, ct)
        if release:
            node.release() if free is None else free(node)
        for j, in_ct in zip(parents, in_cts):
            if j is None or in_ct is None:
                continue
            previous = cts[j]
            cts[j] = in_ct if previous is None else add(previous, in_ct)
    return results


def backward_pass(
    roots: Sequence[tuple[Any, Any]],
    executor: BackwardExecutor,
    targets: Sequence[Any] | None = None,
    release: bool = False,
    on_result: Callable[[Any, Any], None] | None = None,
) -> dict:
    """Push cotangents from `roots` (pairs of node and cotangent) back through the graph.

    Returns the cotangent reaching each leaf, or, with `targets`, each target
    node (the traversal then stops at the targets and skips everything that
    does not lead to one): the schedule of this graph, computed and run once.
    `on_result` as `run_schedule`'s.
    """
    return run_schedule(BackwardSchedule((node for node, _ in roots), targets), roots,
                        executor, release, on_result)
