"""Triton device functions that generated fused kernels call.

They take and return values in the compute dtype (fp32 for 16-bit floats,
fp64 for fp64) and match torch's results, NaN and infinities included. The
elementwise family's ``_sqrt``, ``_tanh`` and ``_sigmoid`` are reused as they
are (same formulas, so fused and unfused results agree).
"""

from __future__ import annotations

import triton
import triton.language as tl

from opforge.kernels.elementwise import _sigmoid, _sqrt, _tanh  # noqa: F401  (re-exported to kernels)

INF = tl.constexpr(float("inf"))
NAN = tl.constexpr(float("nan"))
SQRT1_2 = tl.constexpr(0.7071067811865476)
SQRT2_PI = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
TWO_INV_SQRT_PI = tl.constexpr(1.1283791670955126)  # 2 / sqrt(pi)


@triton.jit
def _div(a, b):
    # IEEE division for fp32 (plain "/" is the approximate div.full there).
    if a.dtype == tl.float32:
        r = tl.div_rn(a, b)
    else:
        r = a / b
    return r


@triton.jit
def _rsqrt(x):
    return 1.0 / _sqrt(x)


@triton.jit
def _log1p(x):
    # Goldberg: log(u) * x / (u - 1) with u = 1 + x cancels the rounding of u.
    u = 1.0 + x
    r = tl.log(u) * _div(x, u - 1.0)
    r = tl.where(u == 1.0, x, r)
    return tl.where(u == INF, u, r)


@triton.jit
def _expm1(x):
    # Kahan: (u - 1) * x / log(u) with u = e^x cancels the rounding of u.
    u = tl.exp(x)
    r = (u - 1.0) * _div(x, tl.log(u))
    r = tl.where(u == 1.0, x, r)
    r = tl.where(u - 1.0 == -1.0, u - 1.0, r)
    return tl.where(u == INF, u, r)


@triton.jit
def _pow(a, b):
    # C pow for float a, b: |a|^b by exp2(b log2 |a|), the sign for a negative
    # base and an odd integer exponent, NaN for a negative base and a
    # non-integer exponent, and pow(x, 0) == pow(1, y) == 1.
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    whole = tl.floor(b) == b
    odd = whole & (tl.abs(b - 2.0 * tl.floor(b * 0.5)) == 1.0)
    r = tl.where((a < 0) & odd, -r, r)
    r = tl.where((a < 0) & (a != -INF) & (~whole) & (tl.abs(b) != INF), NAN, r)
    r = tl.where((b == 0) | (a == 1.0), 1.0, r)
    return r


@triton.jit
def _relu(a):
    return tl.where(a > 0, a, tl.where(a != a, a, 0))


@triton.jit
def _sign(a):
    return tl.where(a > 0, 1, tl.where(a < 0, -1, 0))


@triton.jit
def _gelu(a):
    return 0.5 * a * (1.0 + tl.erf(a * SQRT1_2))


@triton.jit
def _gelu_tanh(a):
    # 0.5 x (1 + tanh u) == x * sigmoid(2u): one exp, no cancellation.
    return a * _sigmoid((a + 0.044715 * a * a * a) * SQRT2_PI * 2.0)
