"""Lowering: a function or module traced once into a static graph, then a plan
that runs it for inference or training (`pb.compile`, `pb.LoweringMode`)."""

from .graph import Eqn, StaticGraph, Var, trace
from .plan import LoweringError, LoweringMode, Plan, TrainingPlan, compile

__all__ = ["Eqn", "LoweringError", "LoweringMode", "Plan", "StaticGraph", "TrainingPlan", "Var",
           "compile", "trace"]
