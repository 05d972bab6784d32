"""Interval rules of the special functions that are not chains of primitives: ``lgamma``
(the C library's), the Hurwitz ``zeta`` of polygamma and digamma's reflection term
``pi_over_tan_pi``, bounded on their monotone pieces; of ``sigmoid``, its decomposition's
steps on the box's ends in one rule; and of the self-gated activations ``silu``, ``gelu`` and
``hardswish``, whose decomposition is bounded piece by piece on a wide box."""
from __future__ import annotations

import math

import numpy as np
from scipy import special as _special

from fpx import nn_special as _sp
from fpx.core import concrete
from fpx.policy import Accuracy
from fpx.transforms.interval.enclosure import LIBM64_ULPS, round_bounds, sign_keeping, widen
from fpx.transforms.interval.interpreter import IntervalTracer, rule

#: the root of ψ on (0, inf) (where lgamma is least), then on (-k-1, -k) for k = 0, 1, ...
#: (mpmath, 30 digits, rounded to float64); lgamma is convex on every piece between poles
#: (its second derivative ψ' = Σ 1/(x+k)² > 0), so each root is its piece's only minimum
_ROOT_POS = 1.4616321449683622
_ROOTS_NEG = np.array([
    -0.5040830082644554, -1.5734984731623904, -2.6107208684441447, -3.635293366436901,
    -4.653237761743142, -5.6671624415568855, -6.678418213073427, -7.687788325031626,
    -8.695764163816401, -9.702672540001863, -10.708740838254144, -11.714133061228955,
    -12.718971025749207, -13.723347457363827, -14.727334416018529, -15.730988906332882,
    -16.734356723955734, -17.73747515997759, -18.7403749447801, -19.74308167259022,
    -20.745616863607527, -21.74799876820113, -22.75024298430606, -23.752362937385183,
    -24.75437025782297, -25.756275080771037, -26.758086286661367, -27.759811695826706,
    -28.761458227264864, -29.763032029127462, -30.76453858671817, -31.765982812458248,
    -32.76736912128526, -33.768701494202546, -34.76998353212671, -35.77121850174271,
    -36.772409374736625, -37.77355886151158, -38.77466944028412, -39.775743382293676])

#: torch's CPU lgamma: SLEEF ``lgammaf_u10``/``lgamma_u10`` in vector loops, glibc
#: ``lgammaf``/``lgamma`` in scalar tails. SLEEF states 1 ulp for x > 0 and max(1 ulp, 1e-8)
#: (float; 1e-15 double) for x < 0, and may return +inf above 4e36 (float; 2e305 double);
#: glibc's libm-test-ulps state 7 (float) and 4 (double) ulps. Measured against mpmath on
#: torch 2.13: <= 0.8 ulp (x > 0), <= 1.7e-9 / 3e-18 absolute beyond 2 ulps (x < 0).
_KERNEL = {4: (Accuracy(ulps=7.5, source="glibc lgammaf 7 ulp; SLEEF lgammaf_u10 1 ulp"),
               1e-8, 4e36),
           8: (Accuracy(ulps=4.5, source="glibc lgamma 4 ulp; SLEEF lgamma_u10 1 ulp"),
               1e-15, 2e305)}


def _lgamma64(x):
    """log|Γ(x)| of float64 values by the C library (+inf at poles and ±inf, NaN at NaN)."""
    with np.errstate(all="ignore"):
        return _sp._lgamma_libm(np.asarray(x, np.float64))


def lgamma_range(lo, hi):
    """[min, max] of log|Γ| over [lo, hi] (float64, not yet widened for the libm calls). On a
    piece between poles lgamma is convex: the maximum at an end, the minimum at an end or at
    the piece's root of ψ. An interval holding a pole 0, -1, -2, ... is unbounded ([-inf,
    inf]; a point on a pole is +inf). Pieces (-k-1, -k) past the root table:
    :func:`_far_minimum`."""
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    fa, fb = _lgamma64(lo), _lgamma64(hi)
    with np.errstate(all="ignore"):
        top, low = np.maximum(fa, fb), np.minimum(fa, fb)
        pole = (np.ceil(lo) <= np.minimum(np.floor(hi), 0.0)) & (lo < hi)
        k = np.where(hi < 0, -np.floor(lo) - 1, -1.0)                # piece (-k-1, -k); -1: x > 0
        idx = np.clip(k, 0, len(_ROOTS_NEG) - 1).astype(np.int64)
        root = np.where(k < 0, _ROOT_POS, _ROOTS_NEG[idx])
        inside = (lo <= root) & (root <= hi) & ((k < len(_ROOTS_NEG)) | (k < 0))
        # at the root lgamma is flat: a root off by δ changes its value by ~ψ'·δ²/2 (< 2^-90)
        at_root = _lgamma64(root) - (np.abs(_lgamma64(root)) * 2.0 ** -50 + 2.0 ** -90)
        low = np.where(inside, np.minimum(low, at_root), low)
        far = (k >= len(_ROOTS_NEG)) & (np.floor(lo) == np.floor(hi)) & ~pole
        if np.any(far):
            low = np.where(far, np.minimum(low, _far_minimum(lo, hi, far)), low)
        low, top = np.where(pole, -np.inf, low), np.where(pole, np.inf, top)
        nan = np.isnan(lo) | np.isnan(hi)
        return np.where(nan, np.nan, low), np.where(nan, np.nan, top)


def _far_minimum(lo, hi, far):
    """A lower bound of lgamma over [lo, hi] inside a piece (m, m+1) past the root table: ψ's
    root there solves cot(πt) = ψ(1-x)/π, x = m + t (the reflection formula), a fixed point
    that 8 iterations reach (ψ(1-x) varies by ~1/|m| over the piece); at the approximate
    root r convexity gives lgamma(x) >= lgamma(r) + ψ(r)·(x - r), so the bound is
    lgamma(r) - (|ψ(r)| + margin)·max|x - r| whatever r's error (+inf where the root is
    outside the box: the minimum is then at an end)."""
    a, b = np.where(far, lo, -0.5), np.where(far, hi, -0.5)
    m = np.floor(a)
    t = np.full_like(a, 0.5)
    for _ in range(8):
        t = 0.5 - np.arctan(_special.digamma(1 - (m + t)) / math.pi) / math.pi
    r = m + t
    slope = np.abs(_special.digamma(1 - r) - math.pi / np.tan(math.pi * t)) + 1e-6
    f = _lgamma64(r)
    ta, tb = a - m, b - m                                   # (exact)
    bound = f - np.abs(f) * 2.0 ** -40 - slope * np.maximum(np.abs(ta - t), np.abs(tb - t))
    # a root outside [a, b] by more than its error leaves the minimum at an end (convexity)
    return np.where((ta - 1e-9 <= t) & (t <= tb + 1e-9), bound, np.inf)


@rule("lgamma")
def _lgamma(self, prim, x):
    """lgamma's range over the input's box (:func:`lgamma_range`), widened by the float64
    libm's error, then by the kernel's (relative, plus an absolute term where the box reaches
    below 0) and one rounding into the result's format; +inf allowed above the kernel's
    overflow threshold."""
    v = self.value_of(prim, (x,), {})
    dt = np.asarray(concrete(v)).dtype
    F = self.fmt(dt)
    if F is None or dt.itemsize not in _KERNEL:
        raise TypeError(f"fpx.interval: lgamma of {dt} (float32 and float64 only; float16 "
                        "and bfloat16 programs compute it in float32)")
    acc, absolute, big = _KERNEL[dt.itemsize]
    lo, hi, u, _ = self.bounds(x)
    flo, fhi = lgamma_range(lo, hi)
    with np.errstate(all="ignore"):
        neg = np.asarray(lo < 0)
        flo = flo - np.where(neg, absolute + 2.0 ** -60, 0.0)
        fhi = fhi + np.where(neg, absolute + 2.0 ** -60, 0.0)
        flo, fhi = round_bounds(*widen(flo, fhi, LIBM64_ULPS), F, acc, steps=1)
        fhi = np.where(np.asarray(hi) > big, np.inf, fhi)
    return self.new(v, flo, fhi, u)


#: SciPy's ζ at q > 0 against mpmath (<= 8 ulps measured; 16 allowed)
_SCIPY_ZETA = 16 * 2.0 ** -53


def _zeta(s, q, side):
    """ζ(s, q) of float64 q > 0 by SciPy, moved by its error to a lower (side -1) or upper
    (+1) bound; where q is a rounded float64 of an exact argument, pass its neighbour on the
    far side (ζ decreases in q)."""
    z = _special.zeta(float(s), q)
    return z * (1 + side * _SCIPY_ZETA) + side * 2.0 ** -1070


def _zeta_negative(s, lo, hi, err):
    """[lower, upper] of the kernel's ζ(s, q) over q in [lo, hi] < 0 inside one piece (-m,
    -m+1). With f = q + m in (0, 1), ζ(s, q) = P(f) + (-1)^s A(f): the terms past 0,
    P = ζ(s, f) (decreasing in f), and those before, A = Σ_{j=1..m} (j - f)^-s = ζ(s, 1 - f) -
    ζ(s, m + 1 - f) (increasing). For odd s ζ decreases in q (its derivative -s ζ(s+1, q) < 0):
    the ends' values; for even s the sum of P's and A's ranges.

    The kernel's error, in units ``err[2]`` of its sum (Higham, *Accuracy and Stability*,
    §4.2: recursive summation errs by at most u·Σ|partial sums|, and a term entering i sums
    before the end adds |t|·i): the terms before 0, (i + 1 - f)^-s entering i + 13 sums
    before the end, give at most ζ(s-1, 1-f) + 13 ζ(s, 1-f); the terms past 0 (<= 12 sums),
    pow (1 ulp), the early exit (a tail below 6u·Σ) and the series' ~30 steps: in all 72·S,
    S = ζ(s, f) + ζ(s, 1-f) >= Σ|terms|; q + k is exact while |q| >= 16 (an exact multiple
    of q's ulp below |q|), else its roundings past 0 move the terms by up to 96·s units. Plus
    ``err[0]`` (the series' truncation and a float program's first term) relative to S and
    ``err[1]`` per underflowing term."""
    up, down = (lambda v: np.nextafter(v, np.inf)), (lambda v: np.nextafter(v, -np.inf))
    k = -np.floor(lo) - 1                                        # m - 1
    h_lo, h_hi = -(lo + k), -(hi + k)                            # 1 - f at the ends (exact)
    p_lo, p_hi = _zeta(s, up(hi + k + 1), -1), _zeta(s, down(lo + k + 1), 1)
    a_lo = _zeta(s, h_lo, -1) - _zeta(s, down(1 - lo), 1)        # A at lo (1 - q rounded)
    a_hi = _zeta(s, h_hi, 1) - _zeta(s, up(1 - hi), -1)          # A at hi
    if s % 2:
        zlo, zhi = p_lo - a_hi, p_hi - a_lo
    else:
        zlo, zhi = p_lo + a_lo, p_hi + a_hi
    total = p_hi + _zeta(s, h_hi, 1)                              # S
    steps = 72 + np.where(lo > -16, 96 * s, 0)
    slack = (total * (err[0] + steps * err[2]) + _zeta(s - 1, h_hi, 1) * err[2]
             + (k + 14) * err[1])
    return widen(zlo - slack, zhi + slack, 8)


@rule("hurwitz_zeta")
def _hurwitz_zeta(self, prim, q, *, s, err):
    """ζ(s, q) of an integer s >= 2. On q > 0 it decreases (its derivative is -s·ζ(s+1, q)):
    [ζ(s, hi), ζ(s, lo)] by SciPy, widened by the kernel's error ``err`` (relative,
    absolute). On a piece (-m, -m+1) of the negative axis: :func:`_zeta_negative`. A box
    holding one of the poles 0, -1, -2, ... is unbounded, a pole itself (and -inf) is +inf as
    the kernel's; q = +inf and NaN give NaN (torch's kernel: inf·0 in its tail)."""
    v = self.value_of(prim, (q,), {"s": s, "err": err})
    lo, hi, u, _ = self.bounds(q)
    with np.errstate(all="ignore"):
        lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
        pos = lo > 0
        zlo, zhi = _special.zeta(float(s), hi), _special.zeta(float(s), lo)
        r, a = err[0] + _SCIPY_ZETA, err[1] + 2.0 ** -1070
        zlo, zhi = widen(np.maximum(zlo * (1 - r) - a, 0.0), zhi * (1 + r) + a, 2)
        pole = ~pos & (np.ceil(lo) <= np.minimum(np.floor(hi), 0.0))
        neg = ~pos & ~pole & (hi < 0)
        if np.any(neg):
            nlo, nhi = _zeta_negative(s, np.where(neg, lo, -0.5), np.where(neg, hi, -0.5), err)
            zlo, zhi = np.where(neg, nlo, zlo), np.where(neg, nhi, zhi)
        at_pole = pole & (lo == hi)
        zlo = np.where(pole, np.where(at_pole, np.inf, -np.inf), zlo)
        zhi = np.where(pole, np.inf, zhi)
        nan = np.isnan(lo) | np.isnan(hi) | (hi == np.inf)
        zlo, zhi = np.where(nan, np.nan, zlo), np.where(nan, np.nan, zhi)
    return self.new(v, zlo, zhi, u)


@rule("pi_over_tan_pi")
def _pi_over_tan_pi(self, prim, r):
    """g(r) = π/tan(π·r) of float64 r in (-1, 0) (digamma's reflection), as the kernel: p =
    fl(π·r) is monotone in r and lies in (-π, 0), where π·cot(p) decreases; so the range is
    [g at the upper end, g at the lower end], NumPy's float64 values there widened by the libm's
    error, then by the kernel's tan (the policy's) and quotient roundings. A box reaching -1 or
    0 (a pole: x near an integer) is unbounded, NaN stays NaN."""
    v = self.value_of(prim, (r,), {})
    lo, hi, u, _ = self.bounds(r)
    F = self.fmt(np.float64)
    with np.errstate(all="ignore"):
        lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
        glo, ghi = math.pi / np.tan(math.pi * hi), math.pi / np.tan(math.pi * lo)
        glo, ghi = widen(np.asarray(glo, np.float64), np.asarray(ghi, np.float64), LIBM64_ULPS)
        glo, ghi = round_bounds(glo, ghi, F, self.accuracy("tan", F), steps=1)
        glo, ghi = round_bounds(glo, ghi, F, self.accuracy("div", F))
        pole = (lo <= -1) | (hi >= 0)
        glo, ghi = np.where(pole, -np.inf, glo), np.where(pole, np.inf, ghi)
        nan = np.isnan(lo) | np.isnan(hi)
        glo, ghi = np.where(nan, np.nan, glo), np.where(nan, np.nan, ghi)
    return self.new(v, glo, ghi, u)


@rule("sigmoid")
def _sigmoid(self, prim, x):
    """σ(x) = 1/(1 + exp(-x)) as the program computes it -- exp, add and div, each rounded into
    x's format with the policy's accuracy -- in one rule instead of four traced steps: x occurs
    once and each step is monotone, so the decomposition's interval arithmetic runs on the
    box's two ends: e in [exp(-hi), exp(-lo)] (NumPy's float64 exp widened by the libm's error,
    then the program's exp rounding, at least 0), d = 1 + e rounded, y = 1/d rounded, the ends
    swapping at each decreasing step. An exp that may overflow makes d inf and the lower end 0,
    as the program's 1/inf is. Where the division is faithful, every result lies in [0, 1]
    (d >= 1) and the bound is cut to it; NaN stays NaN."""
    v = self.value_of(prim, (x,), {})
    F = self.fmt(np.asarray(concrete(v)).dtype)
    if F is None:
        return prim.decomposition(x)
    lo, hi, u, _ = self.bounds(x)
    with np.errstate(all="ignore"):
        lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
        elo, ehi = round_bounds(np.exp(-hi), np.exp(-lo), F, self.accuracy("exp", F),
                                ((-hi, -lo),), steps=LIBM64_ULPS, consume=True)
        elo = np.maximum(elo, 0.0)                   # exp's image (NaN stays NaN)
        dlo, dhi = round_bounds(1.0 + elo, 1.0 + ehi, F, self.accuracy("add", F),
                                ((elo, ehi), (1.0, 1.0)), steps=1, consume=True)
        div = self.accuracy("div", F)
        ylo, yhi = round_bounds(1.0 / dhi, 1.0 / dlo, F, div, ((1.0, 1.0), (dlo, dhi)),
                                steps=1, consume=True)
        if sign_keeping(div):        # a faithful 1/d of d >= 1 lies in [0, 1]
            ylo, yhi = np.maximum(ylo, 0.0), np.minimum(yhi, 1.0)
    return self.new(v, ylo, yhi, u)


#: where the decomposition x·g(x) of silu and gelu is bounded piece by piece (exact in every
#: float format): on [0, inf) both factors are >= 0 and increasing, below 0 the pieces halve
#: the pairing of x's lower end with g's largest value
_SMOOTH_CUTS = (-np.inf, -64.0, -32.0, -16.0, -8.0, -4.0, -2.0, -1.0, -0.5, 0.0, np.inf)
#: hardswish's: below -3 the gate is exactly 0 and above 3 exactly 6 (the pieces give 0 and
#: x up to the product's and quotient's roundings); on [-3, 0], where x <= 0 <= g, a piece
#: [a, b] pairs a with g(b): x·g/6 >= a·(b + 3)/6 >= -0.417 on each (the least value is -0.375)
_HARD_CUTS = (-np.inf, -3.0, -2.5, -2.0, -1.75, -1.625, -1.5, -1.375, -1.25, -1.0, -0.5, 0.0,
              3.0, np.inf)
_GATE_CUTS = {"silu": _SMOOTH_CUTS, "gelu": _SMOOTH_CUTS, "hardswish": _HARD_CUTS}
#: elements whose box is at least this wide and reaches below -0.5 are cut
_GATE_WIDE = 2.0 ** -4


@rule("silu", "gelu", "hardswish")
def _self_gated(self, prim, x, **params):
    """silu(x) = x·σ(x), gelu(x) = x·Φ(x) (either form) and hardswish(x) = x·relu6(x + 3)/6
    as their decomposition -- the program's own operations and roundings -- but over a wide
    box reaching below 0 the decomposition's product of two intervals of one variable pairs
    x's lower end with the gate's largest value: x in [-30, 30] gives silu in [-30, 30], where
    every value is in [-0.28, 30] (hardswish: [-0.375, 30]). There the box is cut at
    ``_GATE_CUTS``, the decomposition bounds each piece (a box holding every execution whose
    input lies in it, about a program value inside it), and the hull of the pieces -- which
    covers the whole box -- is intersected with the whole box's bound. Narrow boxes (the
    usual round-off) take the decomposition alone."""
    y = prim.decomposition(x, **params)
    if not (self._own(x) and self._own(y)):
        return y
    xv = np.asarray(concrete(x.primal))
    with np.errstate(all="ignore"):
        lo, hi = np.asarray(x.lo, np.float64), np.asarray(x.hi, np.float64)
        wide = np.isfinite(lo) & np.isfinite(hi) & (hi - lo >= _GATE_WIDE) & (lo < -0.5)
    idx = np.flatnonzero(wide)
    if idx.size == 0 or xv.shape != lo.shape:
        return y
    v, lo, hi = xv.ravel()[idx], lo.ravel()[idx], hi.ravel()[idx]
    v64 = v.astype(np.float64)
    plo, phi = np.full(idx.size, np.inf), np.full(idx.size, -np.inf)
    cuts = _GATE_CUTS[prim.name]
    for a, b in zip(cuts[:-1], cuts[1:]):
        slo, shi = np.maximum(lo, a), np.minimum(hi, b)
        hit = slo <= shi
        if not hit.any():
            continue
        # the piece's program value: v clipped to [a, b] (a, b exact in v's format) is in
        # the piece and in the box where they meet; elsewhere v itself, a point (ignored)
        sv = np.where(hit, np.clip(v, v.dtype.type(a), v.dtype.type(b)), v)
        piece = IntervalTracer(self, sv, np.where(hit, slo, v64), np.where(hit, shi, v64))
        r = prim.decomposition(piece, **params)
        rlo, rhi = np.asarray(r.lo, np.float64), np.asarray(r.hi, np.float64)
        plo = np.where(hit, np.minimum(plo, rlo), plo)
        phi = np.where(hit, np.maximum(phi, rhi), phi)
    ylo = np.array(y.lo, np.float64).reshape(-1)
    yhi = np.array(y.hi, np.float64).reshape(-1)
    ok = np.isfinite(plo) & np.isfinite(phi)          # (a NaN piece: the whole box's bound)
    ylo[idx] = np.where(ok, np.maximum(ylo[idx], plo), ylo[idx])
    yhi[idx] = np.where(ok, np.minimum(yhi[idx], phi), yhi[idx])
    shape = np.shape(y.lo)
    return self.new(y.primal, ylo.reshape(shape), yhi.reshape(shape), y.unstable)
