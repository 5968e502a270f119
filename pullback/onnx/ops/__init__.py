"""The ONNX op converters, one module per family; importing this fills the table."""

from . import conv, elementwise, nn, pool, sequence, shape, special

__all__ = ["conv", "elementwise", "nn", "pool", "sequence", "shape", "special"]
