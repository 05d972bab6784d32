"""Correctly rounded float64 sin, cos, tan, atan and atan2: double-double evaluators for
:mod:`fpx.kernels.crmath64`'s rounding test and kernel skeleton (same ``(hi, lo, eps)`` contract).

sin/cos/tan: Cody-Waite reduction ``|x| = k·pi/2 + r`` with pi/2 in four float64 parts (every
product exact by two_prod) for ``|x| < 2^45``, Payne-Hanek (the bits of 2/pi that matter mod
4, multiplied exactly in 32-bit limbs) above. Then ``r = c
+ t``, ``c = j/64``, tables of sin/cos(c) in double-double and Taylor series in ``t`` (|t| <=
2^-7). atan: ``atan(u) = atan(c) + atan((u - c)/(1 + u·c))``, ``c = j/64`` (a table of atan(c)
in double-double), ``1/x`` for ``|x| > 1``; atan2 reduces to the same core on min/max of
``|y|, |x|`` and puts the quadrant back (C99 Annex F's special cases). Tables are computed at
import with Python's decimal (60 digits) and rounded to two float64s.
"""
from __future__ import annotations

import decimal
import math

import numba
import numpy as np

from fpx.kernels.crmath64 import (EPS, _MAGIC, _NAN, _dd_div, _fma, _pow2, _series, _split,
                                  _two_prod, _two_sum)

__all__ = ["EVALUATORS", "WIDE"]

#: arguments of sin/cos/tan at or above this magnitude take the Payne-Hanek reduction
TRIG_MAX = 2.0 ** 45


# ---------------------------------------------------------------------------------------------
# Tables (decimal, 60 digits)
# ---------------------------------------------------------------------------------------------
def _d_atan_small(x, prec):
    """atan(x) by its Taylor series, |x| <= 1/2 (the terms fall by x^2 <= 1/4 each)."""
    s, term, n, x2 = x, x, 1, x * x
    eps = decimal.Decimal(10) ** (-prec - 5)
    while abs(term) > eps:
        term = -term * x2
        n += 2
        s += term / n
    return s


def _d_atan(x, prec):
    """atan(x), 0 <= x <= 1: the argument halved twice (atan x = 2·atan(x/(1 + sqrt(1 +
    x^2))))."""
    for _ in range(2):
        x = x / (1 + (1 + x * x).sqrt())
    return 4 * _d_atan_small(x, prec)


def _d_sin_cos(x, prec):
    """(sin x, cos x) by their Taylor series, |x| < 1."""
    eps = decimal.Decimal(10) ** (-prec - 5)
    s = c = decimal.Decimal(0)
    term, n = decimal.Decimal(1), 0
    while abs(term) > eps or n < 2:
        if n % 2 == 0:
            c += term if n % 4 == 0 else -term
        else:
            s += term if n % 4 == 1 else -term
        n += 1
        term = term * x / n
    return s, c


def _tables():
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        D = decimal.Decimal
        pi = 16 * _d_atan_small(D(1) / 5, 60) - 4 * _d_atan_small(D(1) / 239, 60)
        rest, parts = pi / 2, []
        for _ in range(4):                   # pi/2 = P1 + P2 + P3 + P4 + O(2^-210)
            parts.append(float(rest))
            rest -= D(parts[-1])
        sc = [_d_sin_cos(D(j) / 64, 60) for j in range(53)]
        sin_t = np.array([_split(s) for s, _ in sc])
        cos_t = np.array([_split(c) for _, c in sc])
        atan_t = np.array([_split(_d_atan(D(j) / 64, 60)) for j in range(65)])
        return (parts, sin_t[:, 0].copy(), sin_t[:, 1].copy(), cos_t[:, 0].copy(),
                cos_t[:, 1].copy(), atan_t[:, 0].copy(), atan_t[:, 1].copy(), _split(pi / 2),
                _split(pi), float(2 / pi), float(pi / 4), float(3 * pi / 4))


def _two_over_pi_limbs(n):
    """The first 32·n bits of 2/pi after the binary point as n 32-bit integers (uint64)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 32 * n // 3 + 40
        D = decimal.Decimal
        pi = 16 * _d_atan_small(D(1) / 5, ctx.prec) - 4 * _d_atan_small(D(1) / 239, ctx.prec)
        bits = int((2 / pi) * (D(2) ** (32 * n)))
    return np.array([(bits >> (32 * (n - 1 - j))) & 0xFFFFFFFF for j in range(n)], np.uint64)


_TWO_OVER_PI_LIMBS = _two_over_pi_limbs(42)       # 1344 bits: enough for a < 2^1024
((_P1, _P2, _P3, _P4), _SIN_HI, _SIN_LO, _COS_HI, _COS_LO, _ATAN_HI, _ATAN_LO,
 (_PIO2, _PIO2_L), (_PI, _PI_L), _TWO_OVER_PI, _PIO4_RN, _3PIO4_RN) = _tables()


@numba.njit(inline="always")
def _dd_add(ah, al, bh, bl):
    """(ah + al) + (bh + bl) as (hi, lo): relative error below 2^-104 where the sum does not
    cancel by more than a factor 2 (the only use here)."""
    s, e = _two_sum(ah, bh)
    return _two_sum(s, e + al + bl)


@numba.njit(inline="always")
def _dd_mul(ah, al, bh, bl):
    """(ah + al)·(bh + bl) as (hi, lo), relative error below 2^-102."""
    p, e = _two_prod(ah, bh)
    return p, e + (ah * bl + al * bh)


# ---------------------------------------------------------------------------------------------
# sin, cos, tan
# ---------------------------------------------------------------------------------------------
@numba.njit(inline="always")
def _reduce(a):
    """(k, r_h, r_l, abs_err) with a = k·pi/2 + r_h + r_l, |r| < 0.8, for 0 <= a < 2^45 (k =
    round(a·2/pi) off by at most 0.02 there). k·P1 = p1 + e1 (two_prod), a - p1 exact
    (Sterbenz for k >= 1); S = k·(pi/2 - P1) = e1 + k·P2 + k·P3 + k·P4 in double-double with
    an absolute error below k·2^-156 (+ k·2^-210 for the truncation of pi/2), so |r - (r_h +
    r_l)| < 2^-105·|r| + k·2^-155 (abs_err: twice that)."""
    kf = (a * _TWO_OVER_PI + _MAGIC) - _MAGIC
    p1, e1 = _two_prod(kf, _P1)
    p2, e2 = _two_prod(kf, _P2)
    p3, e3 = _two_prod(kf, _P3)
    sh, sl = _two_sum(p2, e1)
    sl += e2 + p3 + (e3 + kf * _P4)
    h, l = _two_sum(a - p1, -sh)
    rh, rl = _two_sum(h, l - sl)
    return np.int64(kf), rh, rl, kf * 2.0 ** -154


@numba.njit(inline="always")
def _chunk(R, pos):
    """Bits pos .. pos + 31 of the little-endian 32-bit-limb integer R (zeros below bit 0)."""
    if pos < 0:
        return (R[0] << np.uint64(-pos)) & np.uint64(0xFFFFFFFF) if pos > -32 else np.uint64(0)
    i, b = pos // 32, np.uint64(pos % 32)
    lo = R[i] >> b
    hi = (R[i + 1] << (np.uint64(32) - b)) & np.uint64(0xFFFFFFFF) if b > 0 else np.uint64(0)
    return lo | hi


@numba.njit
def _reduce_big(a):
    """(k, r_h, r_l, abs_err) with a = k·pi/2 + r_h + r_l, |r| <= pi/4, for 2^45 <= a <
    2^1024 (Payne-Hanek): a = m·2^e (m a 53-bit integer), and only the bits of 2/pi from
    position e - 1 on matter mod 4: eight 32-bit limbs W of them from limb j0 give the integer
    P = m·W (exact, 32-bit limbs in uint64) with s = 32·(j0 + 8) - e >= 222 fraction bits (the
    omitted tail of 2/pi: below 2^-169). k = bits s, s+1 of P (+1 where the fraction f >= 1/2,
    then 1 - f from the complemented bits), f from five 32-bit chunks (2^-160) summed in
    double-double, r = f·pi/2 (2^-102): |r - (r_h + r_l)| < 2^-100·|r| + 2^-157."""
    b = np.float64(a).view(np.int64)
    e = np.int64((b >> 52) - 1075)
    m = np.uint64((b & 0xFFFFFFFFFFFFF) | 0x10000000000000)
    j0 = max(np.int64(0), (e - 2) // 32)                # ceil((e - 33)/32)
    ms = (m & np.uint64(0xFFFFFFFF), m >> np.uint64(32))
    R = np.zeros(11, np.uint64)
    for t in range(8):                             # W's limb t from the least significant
        L = _TWO_OVER_PI_LIMBS[j0 + 7 - t]
        carry = np.uint64(0)
        for u in range(2):
            v = ms[u] * L + R[t + u] + carry
            R[t + u] = v & np.uint64(0xFFFFFFFF)
            carry = v >> np.uint64(32)
        R[t + 2] += carry
    s = 32 * (j0 + 8) - e
    q = np.int64(_chunk(R, s) & np.uint64(3))
    up = (_chunk(R, s - 32) >> np.uint64(31)) == 1
    fh, fl = 0.0, 0.0
    for t in range(5, 0, -1):
        c = _chunk(R, s - 32 * t)
        c = np.uint64(0xFFFFFFFF) - c if up else c
        fh, err = _two_sum(fh, np.float64(c) * 2.0 ** (-32 * t))
        fl += err
    fh, fl = _two_sum(fh, fl)
    sg = -1.0 if up else 1.0
    rh, rl = _dd_mul(fh, fl, sg * _PIO2, sg * _PIO2_L)
    return q + (1 if up else 0), rh, rl, 2.0 ** -156


@numba.njit(inline="always")
def _sin_cos_r(rh, rl):
    """(sin r, cos r) as two double-doubles for |r| < 0.8: r = c + t, c = j/64, t
    exact (Sterbenz) then renormalized with r_l; sin t by :func:`_series` (t - t^3/6 in
    double-double, the tail t^5/5! .. t^11/11! as a polynomial: remainder below 2^-90·|t|),
    cos t - 1 = -t^2/2 (double-double) + t^4·(1/4! - .. - t^6/10!) (absolute error below
    2^-85); sin(c + t) = S_c + (S_c·(cos t - 1) + C_c·sin t), cos(c + t) = C_c + (C_c·(cos t -
    1) - S_c·sin t) with no cancellation beyond a factor 2: relative error below 2^-78."""
    sg = -1.0 if rh < 0 else 1.0
    ah, al = abs(rh), sg * rl
    j = np.int64(ah * 64.0 + 0.5)
    th, tl = _two_sum(ah - j / 64.0, al)
    t2 = th * th
    tail = th * (1.0 / 120.0 - t2 * (1.0 / 5040.0 - t2 * (1.0 / 362880.0 - t2 / 39916800.0)))
    sth, stl = _series(th, tl, 0.0, -6.0, tail)
    qh, ql = _two_prod(th, th)
    ql += 2.0 * th * tl
    q4 = qh * qh * (1.0 / 24.0 - qh * (1.0 / 720.0 - qh * (1.0 / 40320.0 - qh / 3628800.0)))
    mh, ml = _two_sum(-0.5 * qh, q4)
    ml -= 0.5 * ql
    s_h, s_l, c_h, c_l = _SIN_HI[j], _SIN_LO[j], _COS_HI[j], _COS_LO[j]
    ah1, al1 = _dd_mul(s_h, s_l, mh, ml)
    bh1, bl1 = _dd_mul(c_h, c_l, sth, stl)
    ah2, al2 = _dd_mul(c_h, c_l, mh, ml)
    bh2, bl2 = _dd_mul(s_h, s_l, sth, stl)
    uh, ul = _dd_add(ah1, al1, bh1, bl1)
    vh, vl = _dd_add(ah2, al2, -bh2, -bl2)
    sh, sl = _dd_add(s_h, s_l, uh, ul)
    ch, cl = _dd_add(c_h, c_l, vh, vl)
    return sg * sh, sg * sl, ch, cl


@numba.njit(inline="always")
def _trig(x, which, k, rh, rl, err):
    """(hi, lo, eps) of sin (which 0), cos (1) or tan (2) at a finite x, |x| >= 2^-27, from
    its reduction (k, rh, rl, err): the quadrant k & 3 picks ±sin r or ±cos r; the
    reduction's absolute error e becomes a relative e/|r| (|r cot r|, |r tan r| <= 1 on |r| <
    0.8; doubled for tan)."""
    sh, sl, ch, cl = _sin_cos_r(rh, rl)
    q = k & 3
    if which == 1:
        q += 1
    odd = (q & 1) == 1
    neg = (q & 2) == 2
    if which == 2:
        nh, nl, dh, dl = (ch, cl, -sh, -sl) if odd else (sh, sl, ch, cl)
        hi, lo = _dd_div(nh, nl, dh, dl)
        neg = False
    else:
        hi, lo = (ch, cl) if odd else (sh, sl)
    flip = neg if which == 1 else (x < 0) != neg         # cos is even, sin and tan odd
    if flip:
        hi, lo = -hi, -lo
    return hi, lo, (3.0 if which == 2 else 1.0) * EPS + 2.0 * err / abs(rh)


@numba.njit(inline="always")
def _trig_ev(x, which):
    """The special cases around :func:`_trig` with the Cody-Waite reduction: NaN/inf -> NaN;
    |x| < 2^-27: sin x and tan x round to x, cos x to 1 (x^2/3 and x^2/2 below 2^-54, under
    half an ulp); |x| >= 2^45: undecided here (hi = 0 with eps > 0), for :data:`WIDE`."""
    a = abs(x)
    fin = a < math.inf
    small = a < 2.0 ** -27
    ok = fin and not small and a < TRIG_MAX
    k, rh, rl, err = _reduce(a if ok else 1.0)
    hi, lo, eps = _trig(x, which, k, rh, rl, err)
    if ok:
        return hi, lo, eps
    if not fin:
        return _NAN, 0.0, 0.0
    if small:
        return (1.0 if which == 1 else x), 0.0, 0.0
    return 0.0, 0.0, EPS


@numba.njit(inline="always")
def _trig_wide(x, which):
    """sin/cos/tan of the elements :func:`_trig_ev` left undecided, by the Payne-Hanek
    reduction where |x| >= 2^45 (the others, near a rounding boundary, stay undecided): a
    second pass, so that the main loop holds no call."""
    big = TRIG_MAX <= abs(x) < math.inf
    k, rh, rl, err = _reduce_big(abs(x) if big else TRIG_MAX)
    hi, lo, eps = _trig(x, which, k, rh, rl, err)
    return (hi, lo, eps) if big else (0.0, 0.0, EPS)


@numba.njit(inline="always")
def _sin(x, z):
    return _trig_ev(x, 0)


@numba.njit(inline="always")
def _cos(x, z):
    return _trig_ev(x, 1)


@numba.njit(inline="always")
def _tan(x, z):
    return _trig_ev(x, 2)


# ---------------------------------------------------------------------------------------------
# atan, atan2
# ---------------------------------------------------------------------------------------------
@numba.njit(inline="always")
def _atan_core(uh, ul):
    """atan(u) as (hi, lo) for 0 <= u <= 1 (|ul| <= 2^-52·uh): c = j/64, t = (u - c)/(1 +
    u·c) (u_h - c exact, the division in double-double: 2^-100), |t| <= 2^-7, atan t = t -
    t^3/3 (double-double) + t^5·(1/5 - .. + t^8/13) (remainder below 2^-97·|t|); atan(c) +
    atan(t) cancels at most by a factor 2: relative error below 2^-78."""
    j = np.int64(uh * 64.0 + 0.5)
    c = j / 64.0
    nh, nl = _two_sum(uh - c, ul)
    dh, dl = _two_prod(uh, c)
    dh, e = _two_sum(1.0, dh)
    th, tl = _dd_div(nh, nl, dh, e + dl + ul * c)
    t2 = th * th
    tail = th * (0.2 - t2 * (1.0 / 7.0 - t2 * (1.0 / 9.0 - t2 * (1.0 / 11.0 - t2 / 13.0))))
    ah, al = _series(th, tl, 0.0, -3.0, tail)
    return _dd_add(_ATAN_HI[j], _ATAN_LO[j], ah, al)


@numba.njit(inline="always")
def _atan(x, z):
    """atan(|x|) = pi/2 - atan(1/|x|) for |x| > 1 (1/x in double-double, the residual by
    fma exact; |x| clamped to 2^600, where pi/2 - 1/x rounds as pi/2 - 2^-600 does), the sign
    put back; |x| < 2^-27 rounds to x (x^2/3 < 2^-54)."""
    a = min(abs(x), 2.0 ** 600) if x == x else 0.5
    big = a > 1.0
    uh = 1.0 / a if big else a
    ul = _fma(-uh, a, 1.0) / a if big else 0.0
    vh, vl = _atan_core(uh, ul)
    if big:
        vh, vl = _dd_add(_PIO2, _PIO2_L, -vh, -vl)
    sg = -1.0 if x < 0 else 1.0
    if x != x or abs(x) < 2.0 ** -27:
        return x, 0.0, 0.0
    return sg * vh, sg * vl, EPS


@numba.njit(inline="always")
def _atan2_special(y, x):
    """C99 Annex F's atan2(y, x) for a NaN, a zero or an infinity among y, x (else NaN is
    not returned: the caller checks)."""
    sg = -1.0 if np.float64(y).view(np.int64) < 0 else 1.0
    xneg = np.float64(x).view(np.int64) < 0
    if x != x or y != y:
        return _NAN
    if y == 0.0:
        return sg * _PI if xneg else y
    if abs(y) == math.inf:
        if abs(x) == math.inf:
            return sg * (_3PIO4_RN if xneg else _PIO4_RN)
        return sg * _PIO2
    if x == 0.0:
        return sg * _PIO2
    return sg * _PI if xneg else sg * 0.0          # x = ±inf, y finite


@numba.njit(inline="always")
def _atan2(y, x):
    """atan2(y, x): u = min/max of |y|, |x| (both scaled by a power of two taking the max to
    [1, 4), so the fma residual of u = a/b is exact wherever u >= 2^-960), v = atan(u) by
    :func:`_atan_core`, pi/2 - v where |y| > |x|, pi - that where x < 0 (no cancellation: each
    result is at least pi/4), y's sign. u < 2^-960: dropped where a constant dominates (pi/2
    or pi: the error is below the bound), undecided where the result is about u itself."""
    ay, ax = abs(y), abs(x)
    spec = not (0.0 < ay < math.inf and 0.0 < ax < math.inf)
    swap = ay > ax
    a, b = (ax, ay) if swap else (ay, ax)
    if spec:
        a, b = 0.5, 1.0
    if b < 2.0 ** -1000:                               # exact: scaling up
        a, b = a * 2.0 ** 600, b * 2.0 ** 600
    sc = _pow2(1023 - (np.float64(b).view(np.int64) >> 52))   # b·sc in [1, 4)
    a, b = a * sc, b * sc
    uh = a / b
    tiny = uh < 2.0 ** -960
    ul = 0.0 if tiny else _fma(-uh, b, a) / b
    if tiny:
        uh = 0.0
    vh, vl = _atan_core(uh, ul)
    if swap:
        vh, vl = _dd_add(_PIO2, _PIO2_L, -vh, -vl)
    if x < 0:
        vh, vl = _dd_add(_PI, _PI_L, -vh, -vl)
    sg = -1.0 if y < 0 else 1.0
    if spec:
        return _atan2_special(y, x), 0.0, 0.0
    if tiny and not swap and x > 0:
        return 0.0, 0.0, EPS
    return sg * vh, sg * vl, EPS


@numba.njit(inline="always")
def _trig_wide_z(x, z):
    """The second pass of sin (z = 0), cos (1) or tan (2): one kernel for all three."""
    return _trig_wide(x, np.int64(z))


EVALUATORS = {"sin": _sin, "cos": _cos, "tan": _tan, "atan": _atan, "atan2": _atan2}
#: second passes for the elements the first leaves undecided (crmath64.fast): (evaluator, the
#: constant it takes as its second argument)
WIDE = {"sin": (_trig_wide_z, 0.0), "cos": (_trig_wide_z, 1.0), "tan": (_trig_wide_z, 2.0)}
