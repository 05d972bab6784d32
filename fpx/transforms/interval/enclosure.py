"""Float64 enclosures without rounding-mode control: outward widening, γ constants, one op's
rounding into a format (``|fl(v) - v| <= ulps·2^(1-p)·|v| + ulps·η + absolute``), and the
small helpers the rules share on bounds (corners of a box, NaN and instability masks).

Every float64 step rounded to nearest is widened by a relative ``(k+2)·2^-52`` and an absolute
``2^-1074`` (Higham 2002, §2), so the bounds are sound whatever the hardware rounds to.
"""
from __future__ import annotations

import math

import numpy as np

from fpx.core import is_cupy
from fpx.kernels import interval as _K

E64 = 2.0 ** -52
TINY64 = 5e-324
LIBM64_ULPS = 4          # float64 libm error allowance for bound evaluation (NumPy <= 3 ulp)


def owned(x):
    """Can a kernel write its result into ``x``? (a float64 array the caller gave up)"""
    return isinstance(x, np.ndarray) and x.dtype == np.float64 and x.ndim > 0 and \
        x.flags.writeable and x.flags.owndata


def widen(lo, hi, k=1):
    """Widen float64 bounds computed with ``k`` rounded-to-nearest steps outward. Consumes its
    arguments: pass fresh arrays (the result may be written into them)."""
    return _outward(lo, hi, (k + 2) * E64, TINY64, math.inf, False, True)


def _outward(lo, hi, rel, absl, top, signed, consume):
    """``_K.down(lo, ...)``, ``_K.up(hi, ...)``: one pass where lo and hi have one shape;
    ``consume``: written into lo/hi where they are arrays the caller gave up."""
    olo = lo if consume and owned(lo) and lo is not hi else None
    ohi = hi if consume and owned(hi) and hi is not lo else None
    if np.shape(lo) == np.shape(hi):
        return _K.outward(lo, hi, rel, absl, top, signed, (olo, ohi))
    return (_K.down(lo, rel, absl, top, out=olo, signed=signed),
            _K.up(hi, rel, absl, top, out=ohi, signed=signed))


def up(x, k=1):
    """Upper bound of a nonnegative float64 quantity computed with ``k`` rounded steps."""
    return _K.scale_up(x, 1.0 + (k + 2) * E64, 0.0)


def gamma(n, delta):
    """γ_n(δ) = nδ/(1-nδ) (Higham); inf when nδ >= 1."""
    nd = n * delta
    return nd / (1.0 - nd) if nd < 1.0 else math.inf


def gamma64(n):
    """γ_{n+2}(2^-53): a float64 sum (or dot product) of n terms errs by at most this times
    the sum of the terms' magnitudes, in any order (``n`` may be an array: prefix sums)."""
    if np.ndim(n):
        nd = (n + 2) * 2.0 ** -53
        return nd / (1.0 - nd)
    return gamma(n + 2, 2.0 ** -53)


def partial_sum_split(m, d, d_p):
    """(α, β) of a dot product's error in the partial-sum form ``α·T + β·|E|`` (T = Σ|a_i b_i|,
    E the exact sum; ``matmul._Split``): products rounded by ``d_p``, then m additions that
    err by ``d`` relative to their exact results, whose operands hold partial sums in [-N, P]
    plus the errors below, so ε <= d_p·T + m·d·(max(P, N) + ε), max(P, N) = (T + |E|)/2:
    α = (d_p + md/2)/(1 - md), β = (md/2)/(1 - md). None where md > 2^-10 (the denominators
    would cost more than 0.1% against the classic bound)."""
    if not m * d <= 2.0 ** -10:
        return None
    den = 1.0 - m * d
    return (d_p + m * d / 2) / den * (1 + 6 * E64), (m * d / 2) / den * (1 + 6 * E64)


def as_f64(c):
    if is_cupy(c):
        return c.astype("float64")
    return np.asarray(c, dtype=np.float64)


def xp_of(a):
    if is_cupy(a):
        import cupy
        return cupy
    return np


# Points where documented piecewise accuracies change (subnormal inputs under flush-to-zero,
# __logf's [0.5, 2], __sinf's [-pi, pi]): input-dependent accuracies are evaluated at the
# endpoints of each input interval and at these points clipped into it.
PROBES = (0.0, 1e-39, -1e-39, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0,
           math.pi / 2, -math.pi / 2, math.pi, -math.pi)


def accuracy_terms(acc, inputs):
    """(ulps, absolute) of an accuracy over the input intervals ``inputs`` [(lo, hi), ...]."""
    if not acc.input_dependent:
        return acc.ulps, acc.absolute
    if not inputs:
        raise ValueError("fpx.interval: an input-dependent accuracy needs the op's inputs")
    samples = [[i[0] for i in inputs], [i[1] for i in inputs]]
    samples += [[np.clip(p, i[0], i[1]) for i in inputs] for p in PROBES]
    with np.errstate(all="ignore"):
        ulps = as_f64(acc.ulps_at(*samples[0]))
        ab = as_f64(acc.absolute_at(*samples[0]))
        for smp in samples[1:]:
            ulps = np.maximum(ulps, as_f64(acc.ulps_at(*smp)))
            ab = np.maximum(ab, as_f64(acc.absolute_at(*smp)))
    return ulps, ab


def rounding_terms(F, ulps, ab, steps):
    """(rel, abs, top) for ``_K.down/up``: one rounding into F (``ulps``, absolute ``ab``)
    plus the outward widening of ``steps`` float64 steps and of this one."""
    R = ulps * 2.0 ** (1 - F.p) + (4 + 2 * steps) * E64
    A = (ulps * F.smallest_subnormal + ab) * (1 + 4 * E64) + (steps + 1) * TINY64
    return R, A, overflow_threshold(F, ulps)


def overflow_threshold(F, ulps=0.5):
    """The exact magnitude past which a rounding into F may overflow (``_K.down/up``'s
    ``top``): ``max + ulp(max)/2`` for round to nearest (``ulps <= 0.5``), ``max`` for a
    faithful or looser one; inf for float64 (its bounds overflow by themselves) and formats
    without infinities (:func:`overflow` maps them)."""
    if F.name == "float64" or not F.has_inf:
        return math.inf
    if isinstance(ulps, (int, float)) and ulps <= 0.5:
        return F.max + 2.0 ** (F.emax - F.p)
    return F.max


def round_bounds(lo, hi, F, acc, inputs=(), steps=0, consume=False):
    """[lo, hi] (exact-real enclosure) widened by one rounding into format F with accuracy acc:
    |fl(v) - v| <= ulps·2^(1-p)·|v| + ulps·η + absolute, fused with the outward widening of
    the ``steps`` float64 steps that computed lo/hi and of this one (relative (4+2·steps)·2^-52,
    absolute 2^-1074 each), and with :func:`overflow`. ``consume``: lo/hi are fresh arrays
    the result may be written into."""
    ulps, ab = accuracy_terms(acc, inputs)
    R, A, top = rounding_terms(F, ulps, ab, steps)
    # exact ends (no float64 steps to widen) under a sign-keeping rounding keep their sign
    signed = steps == 0 and sign_keeping(acc)
    lo, hi = _outward(lo, hi, R, A, top, signed, consume)
    return (lo, hi) if (F.has_inf or F.name == "float64") else overflow(lo, hi, F)


def sign_keeping(acc) -> bool:
    """The op is correctly rounded or faithful (at most 1 ulp, no absolute error beyond the
    subnormal quantum, not input-dependent): its result keeps the exact value's sign, since 0
    is a float and such roundings are monotone (the fused add/mul kernels rely on it)."""
    return not acc.input_dependent and acc.ulps <= 1 and not acc.absolute


def overflow(lo, hi, F):
    """Where a bound passes F's largest finite value the program may overflow: ±inf (NaN for
    formats without infinities). float64 bounds overflow by themselves."""
    if F.name == "float64":
        return lo, hi
    top = F.max
    over_lo, over_hi = lo < -top, hi > top
    if not (np.any(over_lo) or np.any(over_hi)):
        return lo, hi
    if F.has_inf:
        return np.where(over_lo, -np.inf, lo), np.where(over_hi, np.inf, hi)
    nan = over_lo | over_hi
    return np.where(nan, np.nan, lo), np.where(nan, np.nan, hi)



def or_unstable(*us):
    out = None
    for u in us:
        if u is None:
            continue
        out = u if out is None else (out | u)
    return out




def corners(f, alo, ahi, blo, bhi):
    """(min, max) of f over the four corners of [alo, ahi] x [blo, bhi] (the range of any f
    monotone in each argument on the box), NaN-propagating."""
    c1, c2, c3, c4 = f(alo, blo), f(alo, bhi), f(ahi, blo), f(ahi, bhi)
    return (np.minimum(np.minimum(c1, c2), np.minimum(c3, c4)),
            np.maximum(np.maximum(c1, c2), np.maximum(c3, c4)))


def product_range(alo, ahi, blo, bhi):
    """The range of a·b over the box, widened by the float64 products' rounding; a ``0·inf``
    corner (NaN in float64) is unbounded, not NaN: the set {a·b} is defined there."""
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = corners(np.multiply, alo, ahi, blo, bhi)
    lo = np.where(np.isnan(lo) & ~any_nan(alo, ahi, blo, bhi), -np.inf, lo)
    hi = np.where(np.isnan(hi) & ~any_nan(alo, ahi, blo, bhi), np.inf, hi)
    return widen(lo, hi)


def truth(lo, hi):
    """(certain, possible): every value in [lo, hi] is nonzero (true), some is. A NaN end
    ("an execution may give NaN", which is true) leaves the other end to decide."""
    with np.errstate(invalid="ignore"):
        return (lo > 0) | (hi < 0), (lo != 0) | (hi != 0)


def any_nan(*xs):
    out = np.isnan(xs[0])
    for x in xs[1:]:
        out = out | np.isnan(x)
    return out


def no_claim_where_nan(lo, hi, value):
    """NaN bounds (no claim) where the program's ``value`` is NaN: a sum's or a GEMM's
    ``inf - inf`` guard gives ±inf for "may overflow", which a later tanh or clamp would turn
    into a finite range for a NaN result."""
    nan_v = np.isnan(as_f64(value))
    if np.any(nan_v):
        lo, hi = np.where(nan_v, np.nan, lo), np.where(nan_v, np.nan, hi)
    return lo, hi
