"""Optimizers ("gradient applyers"): SGD, RMSProp, Adam, AdamW, with parameter groups
as PyTorch's, `TrainParams` (learning rate, schedule, clipping, L1/L2), per-parameter
learning-rate scales, and `clip_grad_norm`.

An applyer updates parameters in place, from their `.grad` (`step()`) or from
explicit `(param, grad)` pairs (`apply`, what `module.update` calls).
"""

from .adam import Adam, AdamW
from .applyer import GradApplyer, StateDictError
from .clip import clip_grad_norm
from .rmsprop import RMSProp
from .scales import lr_scale, scale_updates, set_lr_scale
from .schedules import (
    Constant,
    Cosine,
    LinearWarmup,
    Schedule,
    StepDecay,
    constant,
    cosine,
    linear_warmup,
    step_decay,
)
from .sgd import SGD
from .train_params import TrainParams

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "Constant",
    "Cosine",
    "GradApplyer",
    "LinearWarmup",
    "RMSProp",
    "Schedule",
    "StateDictError",
    "StepDecay",
    "TrainParams",
    "clip_grad_norm",
    "constant",
    "cosine",
    "linear_warmup",
    "lr_scale",
    "scale_updates",
    "set_lr_scale",
    "step_decay",
]
