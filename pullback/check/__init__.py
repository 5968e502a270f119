"""Gradient checking: `gradcheck` for any function, and the op-by-op table behind
`pullback check` (in `runner`, over the sample inputs each primitive declares beside
itself with `pullback.ops.checks.declare_check`)."""

from .gradcheck import adjoint_check, gradcheck, measure
from .problem import Finding, GradcheckError

__all__ = ["Finding", "GradcheckError", "adjoint_check", "gradcheck", "measure"]
