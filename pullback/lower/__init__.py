"""Lowering: a function or module traced once into a static graph, then a plan
that runs it for inference or training (`pb.compile`, `pb.LoweringMode`), and the
hooks a training plan (and eager backward) calls as each parameter's gradient becomes final
(`on_gradient_ready`)."""

from ..tensor.hooks import HookHandle, on_gradient_ready
from .graph import Eqn, StaticGraph, Var, trace
from .plan import LoweringError, LoweringMode, Plan, TrainingPlan, compile

__all__ = ["Eqn", "HookHandle", "LoweringError", "LoweringMode", "Plan", "StaticGraph",
           "TrainingPlan", "Var", "compile", "on_gradient_ready", "trace"]
