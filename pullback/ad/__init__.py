"""The autodiff core: primitives and rules, linearize, transpose, the backward
schedule, checkpointed regions.

Abstract over operands: it computes nothing itself and imports no NumPy; the
`BackwardExecutor` it is handed, and the evaluator installed with
`set_evaluator`, do the computing.
"""

from .core import (
    ALL_ARGS,
    DerivativeError,
    ForwardModeError,
    LinearVar,
    Primitive,
    Zero,
    add_tangents,
    current_evaluator,
    defbilinear,
    defjvp,
    defjvp_full,
    deflinear,
    defvjp,
    jvp_of,
    set_default_evaluator,
    set_evaluator,
    set_tangent_add,
)
from .executor import BackwardExecutor
from .graph import (
    GraphReleasedError,
    Leaf,
    Node,
    leaves_above,
    linearize_graph,
    linearize_node,
    relevant_to,
    toposort,
    transpose_node,
    transposes_directly,
)
from .linear import Equation, LinearGraph, NotLinearError, evaluate_linear, transpose_linear
from .remat import Region, RegionEquation, Slot, replay_jvp, run_region
from .schedule import BackwardSchedule, backward_pass, run_schedule

__all__ = [
    "ALL_ARGS",
    "BackwardExecutor",
    "BackwardSchedule",
    "DerivativeError",
    "Equation",
    "ForwardModeError",
    "GraphReleasedError",
    "Leaf",
    "LinearGraph",
    "LinearVar",
    "Node",
    "NotLinearError",
    "Primitive",
    "Region",
    "RegionEquation",
    "Slot",
    "Zero",
    "add_tangents",
    "backward_pass",
    "current_evaluator",
    "defbilinear",
    "defjvp",
    "defjvp_full",
    "deflinear",
    "defvjp",
    "evaluate_linear",
    "jvp_of",
    "leaves_above",
    "linearize_graph",
    "linearize_node",
    "relevant_to",
    "replay_jvp",
    "run_region",
    "run_schedule",
    "set_default_evaluator",
    "set_evaluator",
    "set_tangent_add",
    "toposort",
    "transpose_linear",
    "transpose_node",
    "transposes_directly",
]
