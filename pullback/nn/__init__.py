"""Modules, layers and losses (`from pullback import nn`)."""

from .activations import GELU, Dropout, Flatten, MaxPool2d, ReLU, Sigmoid, Tanh
from .attention import MultiheadAttention
from .containers import LR, Residual, Sequential
from .layers import GLU, Bias1d, Conv2d, Dense, LayerNorm
from .losses import cross_entropy, mse_loss
from .module import Module, ModuleList, NoGradientError, Parameter, flatten_tree, unflatten_tree
from .transformer import TransformerEncoderLayer

__all__ = [
    "GELU",
    "GLU",
    "LR",
    "Bias1d",
    "Conv2d",
    "Dense",
    "Dropout",
    "Flatten",
    "LayerNorm",
    "MaxPool2d",
    "Module",
    "ModuleList",
    "MultiheadAttention",
    "NoGradientError",
    "Parameter",
    "ReLU",
    "Residual",
    "Sequential",
    "Sigmoid",
    "Tanh",
    "TransformerEncoderLayer",
    "cross_entropy",
    "flatten_tree",
    "mse_loss",
    "unflatten_tree",
]
