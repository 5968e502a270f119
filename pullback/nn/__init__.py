"""Modules, layers and losses (`from pullback import nn`)."""

from .activations import GELU, Dropout, Flatten, MaxPool2d, ReLU, Sigmoid, Tanh
from .containers import LR, Residual, Sequential
from .conv1d import Conv1d
from .layers import GLU, Bias1d, Conv2d, Dense, LayerNorm
from .losses import cross_entropy, mse_loss
from .module import Module, ModuleList, NoGradientError, Parameter, flatten_tree, unflatten_tree
from .normalization import BatchNorm1d, BatchNorm2d
from .pooling import AdaptiveAvgPool2d, AvgPool2d

__all__ = [
    "GELU",
    "GLU",
    "LR",
    "AdaptiveAvgPool2d",
    "AvgPool2d",
    "BatchNorm1d",
    "BatchNorm2d",
    "Bias1d",
    "Conv1d",
    "Conv2d",
    "Dense",
    "Dropout",
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
    "cross_entropy",
    "flatten_tree",
    "mse_loss",
    "unflatten_tree",
]
