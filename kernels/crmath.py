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
    if F.name == "float32":
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
