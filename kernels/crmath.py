"""Correctly rounded elementwise math for float32, float16 and bfloat16 results: a float64
evaluation, a rounding test against the result format's own rounding boundaries, and MPFR
(gmpy2) for the rare elements that fail it (docs/reproducible.md, "Elementwise operations").

``cr_apply(name, x)`` returns ``f(x)`` correctly rounded (IEEE round-to-nearest-even) in
``x``'s format, for every element of ``x``:

1. *Fast path.* ``x`` is converted exactly to float64 and ``y = f(x)`` is evaluated there
   with the platform's float64 libm (numba calls it; glibc documents at most a few float64
   ulps, so far under the ``2^-45`` relative error this module assumes). The true value lies
   in ``y·(1 ± 2^-44)`` (the extra factor two covers the rounding of the interval's ends).
2. *Rounding test.* If both ends of that interval round to the same bit pattern in the
   result format, so does every point between them (rounding is monotone): that pattern is
   the correctly rounded result. For float32 the test is the float64 -> float32 conversion
   (itself correctly rounded) inside the numba loop; for float16/bfloat16 it is
   :func:`fpx.formats.round` on both ends -- never a float64 -> float32 -> narrow chain, which
   would round twice.
3. *Slow path.* Elements that fail (about one in 10^5) are evaluated with MPFR in the result
   format's own precision and exponent range (subnormals included): MPFR rounds correctly by
   construction. ``sigmoid`` is not an MPFR function: it is bracketed with directed roundings
   at a working precision that doubles until both ends round alike (a Ziv loop).

NaN results are the format's canonical quiet NaN. Special values (±0, ±inf, NaN) are those of
C99 Annex F, which the float64 libm gives exactly and the test passes unchanged.
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


#: name -> the float64 evaluator (a numba scalar function)
_F64 = {
    "exp": math.exp, "expm1": math.expm1, "exp2": _exp2, "log": math.log,
    "log1p": math.log1p, "log2": math.log2, "sin": math.sin, "cos": math.cos,
    "tan": math.tan, "tanh": math.tanh, "sinh": math.sinh, "cosh": math.cosh,
    "atan": math.atan, "erf": math.erf, "sigmoid": _sigmoid,
}
#: name -> the float64 evaluator of a function of two arguments (glibc: pow and atan2 are
#: within one float64 ulp)
_F64_2 = {"pow": math.pow, "atan2": math.atan2}
FUNCTIONS = tuple(_F64)
FUNCTIONS2 = tuple(_F64_2)
_NAN32 = np.float32(np.nan)          # 0x7fc00000


@numba.njit(inline="always")
def _round32(y, out, i, bad, nb):
    """Store float32(y) at out[i] if the interval y·(1 ± REL) rounds to one float32, else
    record i in ``bad``; returns the new count of failures."""
    if y != y:
        out[i] = _NAN32
        return nb
    if not math.isfinite(y):
        out[i] = np.float32(y)
        return nb
    e = abs(y) * REL
    lo = np.float32(y - e)
    hi = np.float32(y + e)
    out[i] = lo
    if lo.view(np.int32) != hi.view(np.int32):
        bad[nb] = i
        nb += 1
    return nb


def _make_kernels(f64, arity):
    if arity == 1:
        @numba.njit(nogil=True, error_model="numpy")
        def f32_kernel(x, out, bad):
            """float32 results: fast path and test fused; indices of failures into ``bad``."""
            nb = 0
            for i in range(x.size):
                nb = _round32(f64(np.float64(x[i])), out, i, bad, nb)
            return nb

        @numba.njit(nogil=True, error_model="numpy")
        def f64_kernel(x, out):
            """float64 values (for narrow result formats, tested by the caller)."""
            for i in range(x.size):
                out[i] = f64(np.float64(x[i]))
        return f32_kernel, f64_kernel

    @numba.njit(nogil=True, error_model="numpy")
    def f32_kernel2(x, z, out, bad):
        nb = 0
        for i in range(x.size):
            nb = _round32(f64(np.float64(x[i]), np.float64(z[i])), out, i, bad, nb)
        return nb

    @numba.njit(nogil=True, error_model="numpy")
    def f64_kernel2(x, z, out):
        for i in range(x.size):
            out[i] = f64(np.float64(x[i]), np.float64(z[i]))
    return f32_kernel2, f64_kernel2


_KERNELS: dict = {}


def _kernels(name):
    k = _KERNELS.get(name)
    if k is None:
        k = _KERNELS[name] = (_make_kernels(_F64[name], 1) if name in _F64
                              else _make_kernels(_F64_2[name], 2))
    return k


# ---------------------------------------------------------------------------------------------
# exp of float32: the fast path without a libm call, vectorized (SIMD) and threaded
# ---------------------------------------------------------------------------------------------
_LN2_HI = 6.93147180369123816490e-01 / 32  # ln2/32 to 32 bits (fdlibm's ln2 hi): k·_LN2_HI exact
_LN2_LO = 1.90821492927058770002e-10 / 32  # ln2/32 - _LN2_HI to float64
_INV_LN2 = 32 * 1.44269504088896338700e+00
_MAGIC = 6755399441055744.0                # 1.5·2^52: adding it rounds to an integer
#: 2^(j/32), j = 0..31, each rounded to float64 (relative error <= 2^-53)
_EXP2_TABLE = np.array([2.0 ** (j / 32) for j in range(32)])
_C2, _C3, _C4, _C5 = 1 / 2, 1 / 6, 1 / 24, 1 / 120


_CHUNK = 4096


@numba.njit(parallel=True, nogil=True, error_model="numpy", fastmath=False)
def _exp32(x, out, bad, counts):
    """exp of float32 ``x``: x clamped to [-200, 200] (exp(±200) round to inf and +0 in
    float32 as the true values beyond do); x = (32m + j)·ln2/32 + r with |r| <= ln2/64 +
    2^-40 (k·_LN2_HI and x - k·_LN2_HI exact for |k| < 2^14); exp(x) = 2^m·2^(j/32)·exp(r),
    exp(r) by its Taylor polynomial of degree 5 (remainder below 2^-48.7 relative), the table
    entry within 2^-53, the rest rounded a few times: relative error below 2^-47, inside
    the REL interval; then :func:`_round32`'s float32 rounding test. Chunks of _CHUNK
    elements run in parallel (every element is independent: the bits do not depend on the
    threads); chunk c lists its undecided indices in ``bad[c·_CHUNK:]``, their number in
    ``counts[c]``."""
    n = x.size
    tab = _EXP2_TABLE
    for ch in numba.prange((n + _CHUNK - 1) // _CHUNK):
        start = ch * _CHUNK
        stop = min(n, start + _CHUNK)
        flags = np.empty(stop - start, np.uint8)
        for i in range(start, stop):            # vectorized: no branches, no calls
            xd = np.float64(x[i])
            xc = -200.0 if xd < -200.0 else (200.0 if xd > 200.0 else xd)
            xc = xc if xc == xc else 0.0
            kf = (xc * _INV_LN2 + _MAGIC) - _MAGIC
            r = (xc - kf * _LN2_HI) - kf * _LN2_LO
            p = ((((_C5 * r + _C4) * r + _C3) * r + _C2) * r + 1.0) * r + 1.0
            k = np.int64(kf)
            scale = np.int64(((k >> 5) + 1023) << 52).view(np.float64)
            y = (tab[k & 31] * p) * scale
            e = y * REL
            lo = np.float32(y - e)
            hi = np.float32(y + e)
            nan = xd != xd
            out[i] = _NAN32 if nan else lo
            flags[i - start] = 0 if nan else (1 if lo != hi else 0)
        nb = 0
        for i in range(start, stop):
            if flags[i - start]:
                bad[start + nb] = i
                nb += 1
        counts[ch] = nb


def _exp32_apply(flat):
    """(exp(flat) in float32 where decided, the indices of the undecided elements)."""
    out = np.empty(flat.size, np.float32)
    bad = np.empty(flat.size, np.int64)
    counts = np.empty(-(-flat.size // _CHUNK), np.int64)
    _exp32(flat, out, bad, counts)
    chunks = np.flatnonzero(counts)
    idx = np.concatenate([bad[c * _CHUNK:c * _CHUNK + counts[c]] for c in chunks]) \
        if chunks.size else np.empty(0, np.int64)
    return out, idx


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
        else:
            with gmpy2.context(ctx):
                r = getattr(gmpy2, name)(xm)
        out.append(float(r))
    return out


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------
def cr_apply(name, x, F, z=None):
    """``name`` applied to the array ``x`` (and ``z``, the second argument of pow and atan2,
    of x's dtype and shape) of format ``F`` (float32, float16 or bfloat16), correctly
    rounded into F; returns an array of ``x``'s dtype and shape."""
    from fpx import formats
    f32k, f64k = _kernels(name)
    x = np.asarray(x)
    flat = np.ascontiguousarray(x).reshape(-1)
    args = (flat,) if z is None else (flat, np.ascontiguousarray(z).reshape(-1))
    if F.name == "float32" and name == "exp" and flat.dtype == np.float32:
        out, idx = _exp32_apply(flat)
    elif F.name == "float32":
        out = np.empty(flat.size, np.float32)
        bad = np.empty(flat.size, np.int64)
        nb = f32k(*args, out, bad)
        idx = bad[:nb]
    else:
        y = np.empty(flat.size, np.float64)
        f64k(*(a.astype(np.float64) for a in args), y)
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.abs(y) * REL
            lo = formats.round(y - np.where(np.isfinite(y), e, 0), F, "rn")
            hi = formats.round(y + np.where(np.isfinite(y), e, 0), F, "rn")
        out = lo.astype(x.dtype)
        out[np.isnan(y)] = np.array(np.nan, x.dtype)
        ub = out.view(np.uint16)
        idx = np.flatnonzero((ub != hi.astype(x.dtype).view(np.uint16)) & ~np.isnan(y))
    if idx.size:
        vals = mpfr_eval(name, flat[idx].astype(np.float64).tolist(), F,
                         None if z is None else args[1][idx].astype(np.float64).tolist())
        out[idx] = np.asarray(vals, np.float64).astype(x.dtype)
    return out.reshape(x.shape)
