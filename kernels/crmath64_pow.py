"""Correctly rounded float64 pow: a double-double evaluator for :mod:`fpx.kernels.crmath64`'s
rounding test and kernel skeleton (same ``(hi, lo, eps)`` contract), with C99 Annex F's special
cases (as MPFR's mpfr_pow and the float32 path's libm pow).

``pow(x, y) = ±exp(y·log|x|)``: log|x| by crmath64's double-double log (relative ``2^-72``),
``y·log|x|`` exact by two_prod up to ``y·lo`` (``2^-106``), exp by crmath64's double-double exp.
The absolute error of ``y·log|x|`` (``|y·log x|·2^-72``) becomes a relative error of the result,
so the rounding test assumes ``EPS + 2^-71·|y·log x|`` (at most about ``2^-61`` before overflow):
more elements go to MPFR where the result is far from 1 (a few in 10^3 at the extremes). Exact
results pass the test (they are float64s); exact midpoints fail it and go to MPFR.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from fpx.kernels.crmath64 import EPS, _NAN, _exp_dd, _log_dd, _two_prod

__all__ = ["EVALUATORS"]


@numba.njit(inline="always")
def _int_kind(y):
    """0 for a non-integer y, 1 for an odd integer, 2 for an even one (every float64 of
    magnitude 2^53 or more is even)."""
    a = abs(y)
    if not (a < math.inf) or a != np.floor(a):
        return 0
    if a >= 2.0 ** 53:
        return 2
    return 1 if (np.int64(a) & 1) == 1 else 2


@numba.njit(inline="always")
def _pow_special(x, y, kind):
    """C99 Annex F's pow(x, y) where x or y is a zero, an infinity or a NaN, or x < 0 with a
    non-integer y (NaN); y = 0 and x = 1 give 1 even with a NaN."""
    if y == 0.0 or x == 1.0:
        return 1.0
    if x != x or y != y:
        return _NAN
    odd = kind == 1
    if abs(y) == math.inf:
        a = abs(x)
        if a == 1.0:
            return 1.0
        return math.inf if (a > 1.0) == (y > 0) else 0.0
    if x == 0.0:                                   # ±0: the sign survives odd integer y
        r = math.inf if y < 0 else 0.0
        return math.copysign(r, x) if odd else r
    if abs(x) == math.inf:
        r = math.inf if y > 0 else 0.0
        return -r if x < 0 and odd else r
    return _NAN                                    # x < 0, y not an integer


@numba.njit(inline="always")
def _pow(x, y):
    """pow(x, y): the special cases, then ±exp(y·log|x|) with overflow (y·log|x| > 709.79:
    ±inf) and underflow (< -745.2: ±0) decided outright; the sign is - for x < 0 and odd y."""
    kind = _int_kind(y)
    a = abs(x)
    spec = (y == 0.0 or x == 1.0 or not (0.0 < a < math.inf) or not (abs(y) < math.inf)
            or (x < 0 and kind == 0))
    lh, ll = _log_dd(a if not spec else 2.0, 0.0)
    ph, pl = _two_prod(y if not spec else 1.0, lh)
    pl += y * ll if not spec else 0.0
    sg = -1.0 if x < 0 and kind == 1 else 1.0
    over = ph > 709.79
    under = ph < -745.2
    pc = min(max(ph, -746.0), 746.0)
    hi, lo, _, _ = _exp_dd(pc, pl if not (over or under) else 0.0)
    if spec:
        return _pow_special(x, y, kind), 0.0, 0.0
    if over or under:
        return sg * (math.inf if over else 0.0), 0.0, 0.0
    return sg * hi, sg * lo, EPS + 2.0 ** -71 * abs(ph)


EVALUATORS = {"pow": _pow}
