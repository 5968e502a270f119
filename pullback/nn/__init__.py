"""Modules, layers and losses (`from pullback import nn`)."""

from .activations import GELU, Dropout, Flatten, MaxPool2d, ReLU, Sigmoid, Tanh
from .containers import LR, Residual, Sequential
from .embedding import Embedding
from .layers import GLU, Bias1d, Conv2d, Dense, LayerNorm
from .losses import (
    binary_cross_entropy_with_logits,
    cross_entropy,
    huber_loss,
    l1_loss,
    mse_loss,
    nll_loss,
    smooth_l1_loss,
)
from .module import Module, ModuleList, NoGradientError, Parameter, flatten_tree, unflatten_tree

__all__ = [
    "GELU",
    "GLU",
    "LR",
    "Bias1d",
    "Conv2d",
    "Dense",
    "Dropout",
    "Embedding",
    "Flatten",
    "LayerNorm",
    "MaxPool2d",
    "Module",
    "ModuleList",
    "NoGradientError",
    "Parameter",
    "ReLU",
    "Residual",
    "Sequential",
    "Sigmoid",
    "Tanh",
    "binary_cross_entropy_with_logits",
    "cross_entropy",
    "flatten_tree",
    "huber_loss",
    "l1_loss",
    "mse_loss",
    "nll_loss",
    "smooth_l1_loss",
    "unflatten_tree",
]
