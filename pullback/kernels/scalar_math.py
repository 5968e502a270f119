"""Math for kernel bodies: scalar `exp`, `tanh`, `erf`, `normal_cdf_pdf`, `sigmoid`,
`softplus`, `sin`, `cos`, and the row reductions `row_max`, `row_sum`, `row_dot`, `row_dot3`,
`row_sum_exp`, `row_len`.

In Python these are exact references (math.*, with IEEE overflow to inf rather than
OverflowError), so `kernel.python` stays a plain-Python oracle. Compiled, numba_math.py
swaps in branch-free versions that LLVM can vectorize (Numba's own math.exp is a libm
call per element: several times slower than NumPy's SIMD loops on large arrays), and
reductions whose sums may be reordered (vectorized partial sums, as NumPy's pairwise
sum), which a kernel body's own loops may not be: bodies keep IEEE order.
"""

from __future__ import annotations

import math
from typing import Any

# Polynomial coefficients, highest power first (Horner order). The erf pairs are the
# ones CpuBackend's NumPy code uses (least-squares Chebyshev fits to math.erf and
# math.erfc); the tanh and atanh fits are mpmath.chebyfit results. "F32" fits are the
# shorter ones float32 kernels use: erf's errs by 6e-7 (the longer one by 3e-7, at a
# third more time for gelu), the others within 2 ulp.
ERF_SERIES = (
    -4.5357453717597164e-15, 2.094654907251799e-13, -5.010109617527907e-12,
    8.544054714813639e-11, -1.1958431371167904e-09, 1.4714312608702773e-08,
    -1.6346558003477843e-07, 1.6459152531737893e-06, -1.4925318031303436e-05,
    0.00012055306323839672, -0.0008548325546586643, 0.005223977571889455,
    -0.02686617063347346, 0.11283791670824264, -0.3761263890317826, 1.1283791670955123,
)
ERFC_TAIL = (
    -1.670312537569491e-11, -2.255675220571118e-11, 4.580885298725189e-10,
    -1.83699546363336e-09, 2.700931076793225e-09, 1.7885760582375427e-08,
    -1.65794524536511e-07, 6.468359321973223e-07, -9.983117352035056e-08,
    -1.7340697649370626e-05, 0.00012459325318721473, -0.00023215792027435583,
    -0.005039359895673376, 0.08155839001076633, 0.17900115118138998,
)
ERF_SERIES_F32 = (
    -2.9495507658683415e-08, 8.36581316747247e-07, -1.1747116675202173e-05,
    0.00011244870190883131, -0.0008415580736978905, 0.0052104561551259655,
    -0.026858154772405437, 0.11283548246966947, -0.37612610057201296, 1.1283791614309322,
)
ERFC_TAIL_F32 = (
    -1.61732908105545e-05, 0.00012415928335577237, -0.0002327471279532293,
    -0.0050391620301117315, 0.08155846399054867, 0.17900113922013566,
)
# tanh(x) / x as a polynomial in x**2 on |x| < 0.4 (relative error 9e-17 / 1.5e-9).
TANH_SERIES = (
    0.0004437292809755649, -0.001414343227519244, 0.0035855982282969796,
    -0.008862629549727068, 0.021869455303736633, -0.05396825294084684,
    0.13333333331738384, -0.33333333333323784, 0.9999999999999999,
)
TANH_SERIES_F32 = (
    0.018667555521122994, -0.053534692087952, 0.1333089271037759,
    -0.33333284851060324, 0.9999999984505767,
)
# atanh(s) / s as a polynomial in s**2 on s**2 <= 1/9: log1p(z) = 2 atanh(z / (2 + z)).
ATANH_SERIES = (
    0.08890381913056651, 0.04940394524382393, 0.06795652742789947, 0.07681838124445817,
    0.09091429900236955, 0.11111095430673142, 0.1428571455582858, 0.199999999976438,
    0.33333333333341286, 1.0,
)
ATANH_SERIES_F32 = (
    0.1407888918155454, 0.13982578872598633, 0.20012297615351873, 0.33333160820688884,
    1.0000000038408794,
)
SQRT1_2 = math.sqrt(0.5)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
# Below this |x| tanh uses its series; above, 1 - 2 / (e**2|x| + 1) loses under 2 ulp.
TANH_SERIES_LIMIT = 0.4


def exp(x: float) -> float:
    """e**x; inf where math.exp would raise OverflowError."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def tanh(x: float) -> float:
    """Hyperbolic tangent."""
    return math.tanh(x)


def erf(x: float) -> float:
    """The error function."""
    return math.erf(x)


def normal_cdf_pdf(x: float) -> tuple[float, float]:
    """The standard normal's distribution and density at x: (Phi(x), phi(x)), Phi(x) =
    (1 + erf(x / sqrt 2)) / 2 and phi(x) = e**(-x*x/2) / sqrt(2 pi). Compiled, one
    exponential serves both: erf's tail and the density share e**(-x*x/2)."""
    return (0.5 * (1.0 + math.erf(x * SQRT1_2)),
            INV_SQRT_2PI * exp(-0.5 * x * x))


def sigmoid(x: float) -> float:
    """1 / (1 + e**-x), never overflowing."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def softplus(x: float) -> float:
    """log(1 + e**x) = max(x, 0) + log1p(e**-|x|): exact in both tails."""
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def sin(x: float) -> float:
    """Sine; NaN for an infinity, where math.sin would raise ValueError."""
    return math.sin(x) if math.isfinite(x) else math.nan


def cos(x: float) -> float:
    """Cosine; NaN for an infinity, where math.cos would raise ValueError."""
    return math.cos(x) if math.isfinite(x) else math.nan


def row_max(row: Any) -> float:
    """The largest element of a 1-D row, skipping NaNs (fmax semantics); -inf when
    empty or all NaN. Row kernels that subtract it (softmax) still return NaN for a row
    holding one, through the NaN element itself."""
    largest = -math.inf
    for value in row:
        largest = value if value > largest else largest
    return largest


def row_sum(row: Any) -> float:
    """Sum of a 1-D row (compiled: in the row's dtype, in vectorized partial sums)."""
    return sum(float(v) for v in row)


def row_dot(a: Any, b: Any) -> float:
    """Sum of a * b over two rows of one length."""
    return sum(float(u) * float(v) for u, v in zip(a, b))


def row_dot3(a: Any, b: Any, c: Any) -> float:
    """Sum of a * b * c over three rows of one length."""
    return sum(float(u) * float(v) * float(w) for u, v, w in zip(a, b, c))


def row_sum_exp(row: Any, shift: float) -> float:
    """Sum of e**(v - shift) over a row: softmax's denominator, without a scratch row."""
    return sum(exp(float(v) - shift) for v in row)


def row_sum_sq_dev(row: Any, shift: float) -> float:
    """Sum of (v - shift)**2 over a row: a variance's numerator, without a scratch row."""
    return sum((float(v) - shift) ** 2 for v in row)


def layer_norm_row_grads(upstream: Any, x: Any, weight: Any, mean: float, rstd: float,
                         grad_x: Any, grad_weight: Any, grad_bias: Any) -> None:
    """layer_norm's gradients for one row, given its mean and rstd: grad_x written, the
    row's shares of the weight's and the bias's gradients added (pullback.kernels.rows'
    backward kernels call it, compiled; it has no literal, so it computes in the
    rows' dtype there)."""
    n = row_len(x)
    for j in range(x.shape[0]):
        xhat = (x[j] - mean) * rstd
        grad_x[j] = xhat
        grad_weight[j] += upstream[j] * xhat
        grad_bias[j] += upstream[j]
    mean_g = row_dot(upstream, weight) / n
    mean_g_xhat = row_dot3(upstream, weight, grad_x) / n
    for j in range(x.shape[0]):
        grad_x[j] = rstd * (upstream[j] * weight[j] - mean_g - grad_x[j] * mean_g_xhat)


def row_len(row: Any) -> float:
    """A row's length as a float of the row's dtype (compiled: an int would promote
    float32 arithmetic to float64)."""
    return float(len(row))
