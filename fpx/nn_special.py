"""Special functions of ``fpx.nn`` (re-exported there), written as the library kernels that
programs call compute them, step by step in fpx primitives: each step's round-off is then
bounded like any other op's, and a bound holds what the kernel returns -- including where
the kernel's own error is far from a few ulps (near a root, where its sums cancel).

==================  ============================================================================
``digamma``         ψ(x) as torch's CPU kernel (ATen ``calc_digamma``, float and double): for
                    x > 0 the recurrence up to x >= 10, then the asymptotic series; for x < 0
                    the reflection ψ(1 - x) - π/tan(π·r) (``pi_over_tan_pi``: a composite with
                    an interval rule)
``trigamma``        ψ'(x) as torch's CPU kernel (ATen ``trigamma``): reflection below 0.5, six
                    recurrence steps, a truncated asymptotic series
``lgamma``          log|Γ(x)|, the C library's: a composite whose interval rule bounds it on
                    monotone pieces (not a chain of primitives)
``polygamma``       ψ⁽ⁿ⁾(x), n >= 2, as torch's CPU kernel: n!·ζ(n + 1, x), the Hurwitz ζ a
                    library composite (``hurwitz_zeta``) bounded on its pieces
==================  ============================================================================
"""
from __future__ import annotations

import math

import numba
import numpy as np

from fpx import numpy as fnp
from fpx.core import Composite, UnsupportedFunctionError
from fpx.nn import _c, _dtype

__all__ = ["digamma", "trigamma", "lgamma", "polygamma"]

# ATen/native/Math.h, calc_digamma: B_2k / 2k for k = 7..1, highest power first (cephes psi)
_DIGAMMA_SERIES = (8.33333333333333333333E-2, -2.10927960927960927961E-2,
                   7.57575757575757575758E-3, -4.16666666666666666667E-3,
                   3.96825396825396825397E-3, -8.33333333333333333333E-3,
                   8.33333333333333333333E-2)


def _digamma_tail(result, x):
    """``result + log(x) - 0.5/x - z·polevl(z, A)``, z = 1/x² (the last term 0 from x = 1e17
    on), in the kernel's order of operations, for its x >= 10."""
    small = fnp.less(x, _c(1e17, x))
    xs = fnp.where(small, x, _c(1, x))                  # (x*x need not overflow where unused)
    z = fnp.divide(_c(1, x), fnp.multiply(xs, xs))
    poly = _c(_DIGAMMA_SERIES[0], x)
    for a in _DIGAMMA_SERIES[1:]:
        poly = fnp.add(fnp.multiply(poly, z), _c(a, x))
    y = fnp.where(small, fnp.multiply(z, poly), _c(0, x))
    return fnp.subtract(fnp.subtract(fnp.add(result, fnp.log(x)),
                                     fnp.divide(_c(0.5, x), x)), y)


def _digamma_positive(x):
    """The kernel's x > 0 branch (``x``: its argument there; other elements unused)::

        result = 0
        while x < 10:  result -= 1/x;  x += 1          (n <= 10 steps for x > 0)
        z = 1/(x*x);  y = z * polevl(z, A) if x < 1e17 else 0
        return result + log(x) - 0.5/x - y

    The kernel's result is computed for every step count n = 0..10 and the one of the first n
    with x_n >= 10 taken: where round-off leaves that comparison undecided (x within a few ulps
    of an integer), the bound is the hull of two results that are both close to ψ(x), not of
    two loop states. The kernel returns a stored ψ(10) where the loop lands on x == 10
    exactly; this computes the series there, whose bound contains that constant (ψ(10)
    rounded once, inside the series' own round-off)."""
    xk, result = x, fnp.zeros_like(x)
    done, finals = [], []
    for k in range(11):
        at_least_10 = fnp.greater_equal(xk, _c(10, x))
        # (below 10 this result is never taken: the series runs at 10 instead, so that it
        # stays in its range; where the comparison is undecided, 10 is in xk's bound)
        finals.append(_digamma_tail(result, fnp.maximum(xk, _c(10, x))))
        done.append(at_least_10)
        if k < 10:
            result = fnp.subtract(result, fnp.divide(_c(1, x), xk))
            xk = fnp.add(xk, _c(1, x))
    out = finals[-1]
    for at_least_10, final in zip(reversed(done[:-1]), reversed(finals[:-1])):
        out = fnp.where(at_least_10, final, out)
    return out


def _pi_over_tan_pi(r):
    """π / tan(π·r) of float64 r, as digamma's reflection computes it (π rounded to double)."""
    pi = _c(math.pi, r)
    return fnp.divide(pi, fnp.tan(fnp.multiply(pi, r)))


pi_over_tan_pi = Composite("pi_over_tan_pi", _pi_over_tan_pi, doc="""π / tan(π·r), float64,
    three steps: π·r and the quotient rounded, tan the C library's. Its interval rule bounds
    it on (-1, 0), where it decreases, from the rounded π·r at the ends (no interval through
    tan's pole at r = -1/2: the kernel's π·r is a float64 just inside it); other transforms
    run the steps.""")


def digamma(x):
    """ψ(x) = Γ'(x)/Γ(x), in x's floating dtype, as torch's CPU kernel (ATen ``calc_digamma``,
    float and double) computes it, every element::

        x == ±0:                 copysign(inf, -x)
        x < 0, x integer (-inf): NaN
        x < 0:                   calc_digamma(1 - x) - (T)(π / tan(π·r)),  r = modf(x)
        x > 0:                   the recurrence and series (:func:`_digamma_positive`)

    1 - x and the final subtraction in x's dtype T; r (exact), π·r, tan (the C library's) and
    the quotient in double (:data:`pi_over_tan_pi`), then rounded to T (torch computes
    float16/bfloat16 in float32 and rounds once: the caller upcasts). The reflection's π·r
    is rounded, so just above a negative integer (r near -1) the kernel's value moves by many
    ulps from ψ(x); the bound holds the kernel's value there. Interval bounds do not carry a
    zero's sign: at ±0 the bound is [-inf, inf]."""
    pos = fnp.greater(x, _c(0, x))
    neg = fnp.less(x, _c(0, x))
    psi = _digamma_positive(fnp.where(pos, x, fnp.where(neg, fnp.subtract(_c(1, x), x),
                                                         _c(1, x))))
    x64 = fnp.astype(fnp.where(neg, x, _c(-0.5, x)), fnp.float64)   # (a benign stand-in)
    cot = fnp.astype(pi_over_tan_pi(fnp.subtract(x64, fnp.trunc(x64))), _dtype(x))
    zero = fnp.where(fnp.equal(x, _c(0, x)), fnp.divide(_c(-1, x), x), _c(float("nan"), x))
    pole = fnp.equal(x, fnp.trunc(x))
    reflected = fnp.where(pole, _c(float("nan"), x), fnp.subtract(psi, cot))
    return fnp.where(pos, psi, fnp.where(neg, reflected, zero))


def trigamma(x):
    """ψ'(x) = Σ_k 1/(x+k)² as torch's CPU kernel (ATen ``trigamma``, float and double)::

        if x < 0.5:  r = -π²/sin(πx)²;  x = 1 - x          (reflection; the sign flipped last)
        r += 1/x² six times, x += 1 after each
        r += (1 + 1/(2x) + z(1/6 - z(1/30 - z/42)))/x,  z = 1/x²
        return -r if reflected else r

    every step in x's dtype (π rounded to it), so a bound holds the kernel's result: its
    series' truncation (~1e-8 relative, far more than float64's ulp) and the rounding of π·x,
    which moves results near the poles x = 0, -1, -2, ... by many ulps. Both branches are
    computed and the one x < 0.5 selects taken (the other on a benign stand-in)."""
    pi = _c(math.pi, x)
    small = fnp.less(x, _c(0.5, x))
    xr = fnp.where(small, x, _c(0.25, x))                  # the reflection's argument
    s = fnp.sin(fnp.multiply(pi, xr))
    r = fnp.where(small, fnp.negative(fnp.divide(fnp.multiply(pi, pi), fnp.multiply(s, s))),
                  _c(0, x))
    xk = fnp.where(small, fnp.subtract(_c(1, x), x), x)
    for _ in range(6):
        r = fnp.add(r, fnp.divide(_c(1, x), fnp.multiply(xk, xk)))
        xk = fnp.add(xk, _c(1, x))
    z = fnp.divide(_c(1, x), fnp.multiply(xk, xk))
    poly = fnp.multiply(z, fnp.subtract(_c(1 / 6, x), fnp.multiply(z, fnp.subtract(
        _c(1 / 30, x), fnp.multiply(z, _c(1 / 42, x))))))
    tail = fnp.add(fnp.add(_c(1, x), fnp.divide(_c(1, x), fnp.multiply(_c(2, x), xk))), poly)
    r = fnp.add(r, fnp.divide(tail, xk))
    return fnp.where(small, fnp.negative(r), r)


# -- lgamma: the C library's (SLEEF's in torch's vector loops), as a composite ------------------
@numba.vectorize(["float32(float32)", "float64(float64)"], cache=True)
def _lgamma_libm(x):
    return math.lgamma(x)


def _library_function(name, numpy_fn, doc):
    """A composite that is a library's function (no chain of fpx primitives): NumPy runs
    ``numpy_fn``, transforms with a rule for ``name`` (interval, stochastic) bound or round
    it, and any other transform raises, naming it."""
    def decomposition(*args, **params):
        raise UnsupportedFunctionError(
            f"fpx: {name} has no decomposition into fpx primitives (it is a library's); "
            "fpx.interval and fpx.stochastic have rules for it, this transform has none")

    def impl(B):
        if B.name != "numpy":
            raise UnsupportedFunctionError(f"fpx: {name} has no {B.name} implementation")
        return numpy_fn
    return Composite(name, decomposition, impl, doc=doc)


def _lgamma_numpy(x):
    with np.errstate(divide="ignore"):              # +inf at the poles, as the C library
        return _lgamma_libm(x)


lgamma = _library_function("lgamma", _lgamma_numpy, """log|Γ(x)| (C
    library ``lgamma``/``lgammaf``), in x's floating dtype; +inf at 0, -1, -2, ... and ±inf.
    Interval bounds it on its convex pieces (``fpx.transforms.interval.special``), stochastic
    rounds the libm's value at random; other transforms raise, naming lgamma.""")


# -- polygamma, n >= 2: n! ζ(n+1, x) -----------------------------------------------------------
def _zeta_numpy(q, *, s, err):
    from scipy import special
    return special.zeta(float(s), q)


hurwitz_zeta = _library_function("hurwitz_zeta", _zeta_numpy, """ζ(s, q) =
    Σ_k (q+k)^-s of float64 q for an integer s >= 2 (cephes' sum, as torch's and SciPy's
    ``zeta``: +inf at q = 0, -1, -2, ... and -inf; on the negative axis the same sum from q),
    a kernel whose error is at most ``err = (relative, absolute, unit)`` (``unit``: the
    roundoff unit of its sum); interval bounds it on its pieces, stochastic rounds SciPy's
    value at random, other transforms raise.""")

#: (relative, absolute, unit) error of torch's cephes ζ per program dtype: double arithmetic
#: (``acc_type``; <= 8 ulps measured vs mpmath), but a float program's first term ``pow(q, -s)``
#: is float's (its rounding and underflow: ζ(11, 12742) came out 10 subnormal ulps low), and
#: float16/bfloat16 programs run the whole sum in float32. For q > 0 the error is relative to
#: ζ; for q < 0 relative to Σ|(q+k)^-s|, plus the sum's roundings (see the interval rule)
ZETA_ERR = {"float64": (16 * 2.0 ** -53, 2.0 ** -1070, 2.0 ** -53),
            "float32": (2.0 ** -22, 2.0 ** -149, 2.0 ** -53),
            "half": (64 * 2.0 ** -24, 2.0 ** -144, 2.0 ** -24)}


def polygamma(n, x, *, stored=None):
    """ψ⁽ⁿ⁾(x) for an integer n >= 2 as torch's CPU kernel (ATen ``calc_polygamma``):
    ``(-1)^(n+1) · exp(lgamma(n + 1)) · zeta(n + 1, x)`` -- n! by the C library's lgamma and
    exp in x's dtype, ζ by cephes in double, rounded to x's dtype (to ``stored`` first, in
    float32: torch's float16/bfloat16 kernel, whose ζ is float32). At x = 0, -1, -2, ... and
    -inf ζ is +inf, so ψ⁽ⁿ⁾ is +inf (n odd) or -inf (n even), as torch's; +inf gives NaN."""
    if int(n) != n or n < 2:
        raise ValueError(f"fpx.nn_special.polygamma: n must be an integer >= 2, got {n}")
    dt = fnp.float32 if stored is not None else _dtype(x)
    e = fnp.exp(lgamma(_c(n + 1, x)))
    key = "half" if stored is not None else np.dtype(_dtype(x)).name
    z = hurwitz_zeta(fnp.astype(x, fnp.float64), s=int(n) + 1, err=ZETA_ERR[key])
    z = fnp.astype(fnp.astype(z, dt), stored) if stored is not None else fnp.astype(z, dt)
    z = fnp.astype(z, _dtype(x))
    return fnp.multiply(e if n % 2 else fnp.negative(e), z)
