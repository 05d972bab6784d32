"""Correctly rounded float64 erf: a double-double evaluator for :mod:`fpx.kernels.crmath64`'s
rounding test and kernel skeleton (same ``(hi, lo, eps)`` contract).

``erf(c + t) = sum_k a_k·t^k`` about the points ``c = j/32`` of ``[0, 6]`` (``|t| <= 2^-6``),
``a_0 = erf(c)``, ``a_k = (2/sqrt(pi))·e^(-c^2)·(-1)^(k-1)·H_(k-1)(c)/k!`` (H the physicists'
Hermite polynomials: the derivatives of e^(-x^2)), computed at import with Python's decimal (80
digits) and stored as double-doubles (a_0..a_3) and float64s (a_4..a_20). ``|x| < 2^-28``:
``(2/sqrt(pi))·x·(1 - x^2/3)``; ``|x| >= 6``: ±1 (1 - erf(6) < 2^-54, under half an ulp of 1).
"""
from __future__ import annotations

import decimal

import numba
import numpy as np

from fpx.kernels.crmath64 import EPS, _split, _two_prod, _two_sum
from fpx.kernels.crmath64_trig import _d_atan_small, _dd_add

__all__ = ["EVALUATORS"]

_STEP = 32          # table points j/32
_K = 20             # the last coefficient: |a_21·t^21| < 2^-100·erf(c) on |t| <= 2^-6


def _d_erf(x, prec):
    """erf(x) = (2/sqrt(pi))·sum (-1)^n x^(2n+1)/(n!(2n+1)) (x <= 6: the terms peak near
    e^36 < 10^16, covered by the 80 digits)."""
    s, term, n, x2 = x, x, 0, x * x
    eps = decimal.Decimal(10) ** (-prec - 20)
    while abs(term) > eps or n < 3:
        n += 1
        term = -term * x2 / n
        s += term / (2 * n + 1)
    return s


def _tables():
    with decimal.localcontext() as ctx:
        ctx.prec = 80
        D = decimal.Decimal
        pi = 16 * _d_atan_small(D(1) / 5, 80) - 4 * _d_atan_small(D(1) / 239, 80)
        two_rsqrt_pi = 2 / pi.sqrt()
        n = _STEP * 6 + 1
        head, tail = np.zeros((n, 4, 2)), np.zeros((n, _K - 3))
        for j in range(n):
            c = D(j) / _STEP
            a = [two_rsqrt_pi * _d_erf(c, 80)]
            g = two_rsqrt_pi * (-c * c).exp()
            h0, h1, fact = D(1), 2 * c, D(1)
            for k in range(1, _K + 1):          # a_k = g·(-1)^(k-1)·H_(k-1)(c)/k!
                fact *= k
                a.append(g * (h0 if k % 2 else -h0) / fact)
                h0, h1 = h1, 2 * c * h1 - 2 * k * h0
            head[j] = [_split(v) for v in a[:4]]
            tail[j] = [float(v) for v in a[4:]]
        return head[:, :, 0].copy(), head[:, :, 1].copy(), tail, _split(two_rsqrt_pi)


_A_HI, _A_LO, _A_TAIL, (_C, _C_L) = _tables()


@numba.njit(inline="always")
def _erf_table(a):
    """erf(a) as (hi, lo) for 2^-28 <= a < 6: j = round(32a), t = a - j/32 exact (|t| <=
    2^-6); the tail a_4 + .. + a_20·t^16 in float64 (its rounding: below 2^-77·erf(a)), then
    a_3..a_0 by Horner in double-double (each step 2^-104); the sum of the terms after a_0 is
    at most half of erf(a) (a_1·|t| < 0.018 < erf(1/64)/2 .. and a_0 = 0 at j = 0, where every
    term is relative to a_1·t): relative error below 2^-75."""
    j = np.int64(a * _STEP + 0.5)
    t = a - j / _STEP
    p = _A_TAIL[j, _K - 4]
    for k in range(_K - 5, -1, -1):
        p = p * t + _A_TAIL[j, k]
    vh, vl = p, 0.0
    for k in range(3, -1, -1):
        ph, pl = _two_prod(vh, t)
        vh, vl = _dd_add(_A_HI[j, k], _A_LO[j, k], ph, pl + vl * t)
    return vh, vl


@numba.njit(inline="always")
def _erf(x, z):
    """erf: NaN -> NaN, ±0 -> ±0, |x| >= 6 -> ±1; |x| < 2^-28: (2/sqrt(pi))·x·(1 - x^2/3)
    (the next term x^5/10 is below 2^-115·x) in double-double on x·2^200, scaled back (the
    low part's underflow adds at most 2^-1075/|erf x| to eps); else the table (odd)."""
    a = abs(x)
    small = a < 2.0 ** -28
    ok = 0.0 < a < 6.0
    hi, lo = _erf_table(a if ok and not small else 1.0)
    xs = x * 2.0 ** 200
    sh, sl = _two_prod(_C, xs)
    sl += _C_L * xs - sh * (x * x / 3.0)
    sh, sl = _two_sum(sh, sl)
    sh, sl = sh * 2.0 ** -200, sl * 2.0 ** -200
    if not ok:
        return (x if a == 0.0 or x != x else (-1.0 if x < 0 else 1.0)), 0.0, 0.0
    if small:
        return sh, sl, EPS + 2.0 ** -1073 / max(abs(sh), 2.0 ** -1074)
    sg = -1.0 if x < 0 else 1.0
    return sg * hi, sg * lo, EPS


EVALUATORS = {"erf": _erf}
