"""Gradient checking: `gradcheck` for any function, and the op-by-op table behind
`pullback check` (sample inputs per primitive in `specs`, the table in `runner`)."""

from .gradcheck import adjoint_check, gradcheck, measure
from .problem import Finding, GradcheckError

__all__ = ["Finding", "GradcheckError", "adjoint_check", "gradcheck", "measure"]
