"""Correctly rounded elementwise math for float32, float16 and bfloat16 results: a float64
evaluation, a rounding test against the result format's own rounding boundaries, and MPFR
(gmpy2) for the rare elements that fail it (docs/reproducible.md, "Elementwise operations");
float64 results are :mod:`fpx.kernels.crmath64`'s.

``cr_apply(name, x, F)`` returns ``f(x)`` correctly rounded (IEEE round-to-nearest-even) in
format F, for every element of ``x``:

1. *Fast path.* ``x`` is converted exactly to float64 and ``y = f(x)`` is evaluated there by
   an *evaluator* ``ev(x, z)``: the platform's float64 libm (glibc documents at most a few
   float64 ulps, far under the ``2^-45`` relative error this module assumes), or for exp
   fpx's own branch-free evaluation (relative error below ``2^-47``), which vectorizes.
   The true value lies in ``y·(1 ± 2^-44)`` (the extra factor two covers the rounding of the
   interval's ends).
2. *Rounding test.* If both ends of that interval round to the same bit pattern in the
   result format, so does every point between them (rounding is monotone): that pattern is
   the correctly rounded result. One kernel skeleton (:func:`_make_kernels`) fuses
   evaluation, test and the float32 store in one pass over blocks of the input and lists
   the few undecided indices; for float16/bfloat16 the test is :func:`fpx.formats.round`
   on both ends -- never a float64 -> float32 -> narrow chain, which would round twice.
3. *Slow path.* Elements that fail (about one in 10^5) are evaluated with MPFR in the result
   format's own precision and exponent range (subnormals included): MPFR rounds correctly by
   construction. ``sigmoid`` is not an MPFR function: it is bracketed with directed roundings
   at a working precision that doubles until both ends round alike (a Ziv loop).

``rsqrt`` is ``1/sqrt(x)`` rounded once (MPFR's ``rec_sqrt``; ``rsqrt(±0) = ±inf`` as
``1/sqrt(±0)``). NaN results are the format's canonical quiet NaN. Special values (±0, ±inf,
NaN) are those of C99 Annex F, which the float64 libm gives exactly and the test passes
unchanged.
"""
from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["FUNCTIONS", "FUNCTIONS2", "cr_apply", "mpfr_eval", "REL"]

#: the relative half-width of the interval the float64 value is known to lie in
REL = 2.0 ** -44


@numba.njit(inline="always")
def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


@numba.njit(inline="always")
def _exp2(x):
    return math.exp2(x)


def _lift(f, arity):
    """The evaluator ``ev(x, z)`` of the kernel skeleton for a float64 libm function."""
    if arity == 1:
        @numba.njit(inline="always")
        def ev1(x, z):
            return f(x)
        return ev1

    @numba.njit(inline="always")
    def ev2(x, z):
        return f(x, z)
    return ev2


@numba.njit(inline="always")
def _rsqrt(x):
    """1/sqrt(x): two float64 roundings, relative error below 2^-52 (sqrt(±0) = ±0, so
    rsqrt(±0) = ±inf)."""
    return 1.0 / math.sqrt(x)


# ---------------------------------------------------------------------------------------------
# exp without a libm call: the float64 evaluator of float32 exp, vectorized (SIMD)
# ---------------------------------------------------------------------------------------------
_LN2_HI = 6.93147180369123816490e-01 / 32  # ln2/32 to 32 bits (fdlibm's ln2 hi): k·_LN2_HI exact
_LN2_LO = 1.90821492927058770002e-10 / 32  # ln2/32 - _LN2_HI to float64
_INV_LN2 = 32 * 1.44269504088896338700e+00
_MAGIC = 6755399441055744.0                # 1.5·2^52: adding it rounds to an integer
#: 2^(j/32), j = 0..31, each rounded to float64 (relative error <= 2^-53)
_EXP2_TABLE = np.array([2.0 ** (j / 32) for j in range(32)])
_C2, _C3, _C4, _C5 = 1 / 2, 1 / 6, 1 / 24, 1 / 120


@numba.njit(inline="always")
def _exp_fast(xd, zd):
    """exp(xd) for xd a float32 value: xd clamped to [-200, 200] (exp(±200) round to inf and
    +0 in float32, float16 and bfloat16 as the true values beyond do); xd = (32m + j)·ln2/32
    + r with |r| <= ln2/64 + 2^-40 (k·_LN2_HI and xd - k·_LN2_HI exact for |k| < 2^14);
    exp(xd) = 2^m·2^(j/32)·exp(r), exp(r) by its Taylor polynomial of degree 5 (remainder
    below 2^-48.7 relative), the table entry within 2^-53, the rest rounded a few times:
    relative error below 2^-47. No branches and no calls, so the skeleton's loop vectorizes."""
    xc = -200.0 if xd < -200.0 else (200.0 if xd > 200.0 else xd)
    xc = xc if xc == xc else 0.0
    kf = (xc * _INV_LN2 + _MAGIC) - _MAGIC
    r = (xc - kf * _LN2_HI) - kf * _LN2_LO
    p = ((((_C5 * r + _C4) * r + _C3) * r + _C2) * r + 1.0) * r + 1.0
    k = np.int64(kf)
    scale = np.int64(((k >> 5) + 1023) << 52).view(np.float64)
    y = (_EXP2_TABLE[k & 31] * p) * scale
    return y if xd == xd else xd


#: name -> the float64 evaluator ``ev(x, z)`` (an inlined numba function; z is the second
#: argument of pow and atan2, ignored by the others); glibc documents at most a few float64
#: ulps for each libm function used (pow and atan2: within one)
_EV = {"exp": _exp_fast, "rsqrt": _lift(_rsqrt, 1), "sigmoid": _lift(_sigmoid, 1),
       "exp2": _lift(_exp2, 1)}
_EV.update({n: _lift(getattr(math, n), 1) for n in (
    "expm1", "log", "log1p", "log2", "sin", "cos", "tan", "tanh", "sinh", "cosh", "atan",
    "erf")})
_EV.update({n: _lift(getattr(math, n), 2) for n in ("pow", "atan2")})
FUNCTIONS = ("exp", "expm1", "exp2", "log", "log1p", "log2", "sin", "cos", "tan", "tanh",
             "sinh", "cosh", "atan", "erf", "sigmoid", "rsqrt")
FUNCTIONS2 = ("pow", "atan2")
_NAN32 = np.float32(np.nan)          # 0x7fc00000
#: the bits a kernel stores for an undecided element: a NaN with a payload, never a result
#: (NaN results are canonical)
UNDECIDED32 = np.uint32(0x7FC0DEAD)


# ---------------------------------------------------------------------------------------------
# The kernel skeleton: evaluation, rounding test and store in one vectorizable pass
# ---------------------------------------------------------------------------------------------
@numba.njit(nogil=True)
def undecided(bits, mark, count):
    """The indices of the ``count`` elements of ``bits`` equal to ``mark``: a vectorized count
    per block of 4096, the blocks with any scanned element by element, stopping at the last."""
    idx = np.empty(count, np.int64)
    k = 0
    n = bits.size
    for s in range(0, n, 4096):
        if k == count:
            break
        t = min(n, s + 4096)
        c = 0
        for i in range(s, t):
            c += np.int64(bits[i] == mark)
        if c:
            for i in range(s, t):
                if bits[i] == mark:
                    idx[k] = i
                    k += 1
    return idx


def _make_kernels(ev):
    """The float32 kernel and the float64-values kernel of evaluator ``ev``."""
    @numba.njit(nogil=True, error_model="numpy")
    def f32_kernel(x, z, bits):
        """float32 results of ``ev`` at (x, z) as bits into ``bits``: float32(y) where the
        interval y·(1 ± REL) rounds to one float32 (then every point of it does: rounding is
        monotone), UNDECIDED32 elsewhere; returns the number of undecided elements."""
        c = 0
        for i in range(x.size):
            y = ev(np.float64(x[i]), np.float64(z[i]))
            e = abs(y) * REL
            e = e if e < np.inf else 0.0
            lo = np.float32(y - e)
            hi = np.float32(y + e)
            fail = (lo != hi) & (y == y)
            v = np.float32(lo).view(np.uint32) if y == y else np.float32(_NAN32).view(np.uint32)
            bits[i] = UNDECIDED32 if fail else v
            c += fail
        return c

    @numba.njit(nogil=True, error_model="numpy")
    def f64_kernel(x, z, out):
        """float64 values of ``ev`` (for narrow result formats, tested by the caller)."""
        for i in range(x.size):
            out[i] = ev(np.float64(x[i]), np.float64(z[i]))
    return f32_kernel, f64_kernel


_KERNELS: dict = {}


def _kernels(name):
    k = _KERNELS.get(name)
    if k is None:
        k = _KERNELS[name] = _make_kernels(_EV[name])
    return k


# ---------------------------------------------------------------------------------------------
# MPFR: the slow path (and the tests' reference)
# ---------------------------------------------------------------------------------------------
def _ctx(F, gmpy2):
    """The MPFR context of IEEE format F: its precision and exponent range, subnormals on."""
    return gmpy2.context(precision=F.p, emin=F.emin - F.p + 2, emax=F.emax + 1,
                         subnormalize=True, round=gmpy2.RoundToNearest)


def _sigmoid_mpfr(x, target, gmpy2):
    """sigmoid(x) correctly rounded in ``target`` (an MPFR context): a Ziv loop on an
    enclosure computed with directed roundings."""
    if gmpy2.is_nan(x):
        return x
    prec = 64
    while prec <= 1 << 16:
        ends = []
        for rnd_exp, rnd_div in ((gmpy2.RoundUp, gmpy2.RoundDown),
                                 (gmpy2.RoundDown, gmpy2.RoundUp)):
            with gmpy2.context(precision=prec, round=rnd_exp):
                d = gmpy2.exp(-x) + 1          # both rounded in the same direction
            with gmpy2.context(precision=prec, round=rnd_div):
                q = 1 / d
            with gmpy2.context(target):
                ends.append(+q)
        if ends[0] == ends[1]:
            return ends[0]
        prec *= 2
    raise ArithmeticError(f"fpx: sigmoid({x}) did not round at 65536 bits")  # pragma: no cover


_MPFR_NAME = {"rsqrt": "rec_sqrt"}


def mpfr_eval(name, xs, F, zs=None):
    """``name(x)`` (or ``name(x, z)`` for pow and atan2, ``zs`` the second arguments)
    correctly rounded into format F for each float in ``xs`` (a list of Python floats), with
    MPFR. Returns a list of Python floats (exactly F's values)."""
    import gmpy2
    ctx = _ctx(F, gmpy2)
    out = []
    for i, x in enumerate(xs):
        xm = gmpy2.mpfr(x, 64)                 # exact: x is a value of F
        if name == "sigmoid":
            r = _sigmoid_mpfr(xm, ctx, gmpy2)
        elif zs is not None:
            zm = gmpy2.mpfr(zs[i], 64)
            with gmpy2.context(ctx):
                r = gmpy2.atan2(xm, zm) if name == "atan2" else xm ** zm
        elif name == "rsqrt" and x == 0:
            r = math.copysign(math.inf, x)     # 1/sqrt(±0) = ±inf (MPFR's rec_sqrt: +inf)
        else:
            with gmpy2.context(ctx):
                r = getattr(gmpy2, _MPFR_NAME.get(name, name))(xm)
        out.append(float(r))
    return out


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------
def cr_apply(name, x, F, z=None):
    """``name`` applied to the array ``x`` (and ``z``, the second argument of pow and atan2,
    of x's dtype and shape) of format ``F`` (float64, float32, float16 or bfloat16),
    correctly rounded into F; returns an array of ``x``'s dtype and shape. float64 takes
    :mod:`fpx.kernels.crmath64`'s double-double kernels (TypeError for a function it lacks)."""
    x = np.asarray(x)
    flat = np.ascontiguousarray(x).reshape(-1)
    zf = flat if z is None else np.ascontiguousarray(z).reshape(-1)
    if F.name == "float64":
        from fpx.kernels import crmath64
        out, idx = crmath64.fast(name, flat, zf)
    elif F.name == "float32":
        out = np.empty(flat.size, np.float32)
        bits = out.view(np.uint32)
        idx = undecided(bits, UNDECIDED32, _kernels(name)[0](flat, zf, bits))
    else:
        out, idx = _narrow(name, flat, zf, F)
    if idx.size:
        vals = mpfr_eval(name, flat[idx].astype(np.float64).tolist(), F,
                         None if z is None else zf[idx].astype(np.float64).tolist())
        out[idx] = np.asarray(vals, np.float64).astype(x.dtype)
    return out.reshape(x.shape)


def _narrow(name, flat, zf, F):
    """float16/bfloat16 results: the float64 value's interval rounded straight into F by
    :func:`fpx.formats.round` (never through float32, which would round twice)."""
    from fpx import formats
    y = np.empty(flat.size, np.float64)
    _kernels(name)[1](flat.astype(np.float64), zf.astype(np.float64), y)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(np.isfinite(y), np.abs(y) * REL, 0)
        lo = formats.round(y - e, F, "rn")
        hi = formats.round(y + e, F, "rn")
    out = lo.astype(flat.dtype)
    nan = np.isnan(y)
    out[nan] = np.array(np.nan, flat.dtype)
    idx = np.flatnonzero((out.view(np.uint16) != hi.astype(flat.dtype).view(np.uint16)) & ~nan)
    return out, idx
