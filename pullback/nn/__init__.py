"""Modules, layers and losses (`from pullback import nn`)."""

from . import init
from .activations import (
    GELU,
    Dropout,
    Flatten,
    Identity,
    LogSoftmax,
    MaxPool2d,
    ReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)
from .attention import MultiheadAttention
from .containers import LR, ModuleDict, Residual, Sequential
from .conv1d import Conv1d
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
from .module import (
    IncompatibleKeys,
    Module,
    ModuleList,
    NoGradientError,
    Parameter,
    flatten_tree,
    unflatten_tree,
)
from .normalization import BatchNorm1d, BatchNorm2d
from .pooling import AdaptiveAvgPool2d, AvgPool2d
from .recurrent import GRU, LSTM
from .transformer import TransformerEncoderLayer

# PyTorch's name for the same layer: y = x @ weight.T + bias, weight (out, in).
Linear = Dense

__all__ = [
    "GELU",
    "GLU",
    "GRU",
    "LR",
    "LSTM",
    "AdaptiveAvgPool2d",
    "AvgPool2d",
    "BatchNorm1d",
    "BatchNorm2d",
    "Bias1d",
    "Conv1d",
    "Conv2d",
    "Dense",
    "Dropout",
    "Embedding",
    "Flatten",
    "Identity",
    "IncompatibleKeys",
    "LayerNorm",
    "Linear",
    "LogSoftmax",
    "MaxPool2d",
    "Module",
    "ModuleDict",
    "ModuleList",
    "MultiheadAttention",
    "NoGradientError",
    "Parameter",
    "ReLU",
    "Residual",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Tanh",
    "TransformerEncoderLayer",
    "binary_cross_entropy_with_logits",
    "cross_entropy",
    "flatten_tree",
    "huber_loss",
    "init",
    "l1_loss",
    "mse_loss",
    "nll_loss",
    "smooth_l1_loss",
    "unflatten_tree",
]
