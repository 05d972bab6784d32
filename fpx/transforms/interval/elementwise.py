"""Interval rules of elementwise arithmetic and functions: + - * / fma, neg abs max min,
monotone and periodic functions, pow, the step functions, floor_divide and remainder.

Each rule takes boxes: the exact-real range of the op over its operands' boxes, in float64
widened outward, then the op's rounding into the result's format from the policy
(``round_result``). The ops a ball passes through unchanged in kind (a constant added or
multiplied, max/min with a constant, the sum or difference of two balls) have ball rules at
the end.
"""
from __future__ import annotations

import numpy as np

from fpx.core import concrete
from fpx.kernels import interval as _K
from fpx.kernels.elementwise import erf as _erf_kernel
from fpx.transforms.interval.enclosure import (E64, LIBM64_ULPS, as_f64, corners,
                                               no_claim_where_nan, or_unstable, overflow,
                                               product_range, sign_keeping, widen)
from fpx.transforms.interval.interpreter import ball_rule, rule, value_dtype


@rule("add", "sub")
def _add_sub(self, prim, a, b):
    v, (alo, ahi), (blo, bhi), un, pt = self.binary(prim, a, b)
    if prim.name == "sub" and a is b and self._own(a):
        # x - x of one traced value: exactly 0 wherever x is finite (IEEE), NaN where it may
        # be inf or NaN -- not the interval difference of two independent copies
        with np.errstate(invalid="ignore"):
            z = np.where(np.isfinite(alo) & np.isfinite(ahi), 0.0, np.nan)
        return self.new(v, z, z.copy(), un, pt)
    terms = self.fused_terms(prim.name, self.fmt(value_dtype(v)))
    if prim.name == "sub":
        blo, bhi = -bhi, -blo
    if terms is not None and _on_host(alo, ahi, blo, bhi):
        # one fused pass: the float64 sum, its rounding and the op's (see round_bounds)
        lo, hi = _K.add_bounds(alo, ahi, blo, bhi, *terms)
        if pt:
            lo, hi, pt = _exact_on_points(v, lo, hi, alo, blo, "add")
        return self.new(v, lo, hi, un, pt and un is None)
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = alo + blo, ahi + bhi
        lo, hi = self.round_result(prim.name, v, lo, hi, (alo, ahi), (blo, bhi), steps=1)
    return self.new(v, lo, hi, un)


def _on_host(*xs):
    """Every bound a NumPy array or a scalar (what the fused kernels take; not CuPy's)."""
    for x in xs:
        if not (isinstance(x, np.ndarray) or np.isscalar(x)):
            return False
    return True


def _exact_on_points(v, lo, hi, a, b, op):
    """An operation on two points whose float64 result is exact and is the program's value
    (``v``): that value is representable, so a correctly rounded or faithful op returns it
    exactly -- the bound is the point, not a rounding's width (``1.0 - m`` of a mask, then
    ``* finfo.min``). Returns (lo, hi, whether every element is such a point);
    ``kernels.interval.exact_points`` is the one pass."""
    v = np.asarray(concrete(v))
    if v.dtype not in (np.float32, np.float64):
        v = v.astype(np.float64)          # float16/bfloat16 values: exact in float64
    return _K.exact_points(v, lo, hi, a, b, op == "add")


@rule("mul")
def _mul(self, prim, a, b):
    v, (alo, ahi), (blo, bhi), un, pt = self.binary(prim, a, b)
    if a is b and self._own(a):
        # x * x of one traced value: a square, never negative (the interval product of two
        # independent copies would go below 0 where x straddles 0 -- and a variance's sqrt
        # would then be NaN)
        with np.errstate(invalid="ignore", over="ignore"):
            m_lo, m_hi = np.abs(alo), np.abs(ahi)
            straddle = (alo < 0) & (ahi > 0)
            lo = np.where(straddle, 0.0, np.minimum(m_lo, m_hi) ** 2)
            hi = np.maximum(m_lo, m_hi) ** 2
            lo = np.where(np.isnan(alo) | np.isnan(ahi), np.nan, lo)
            hi = np.where(np.isnan(alo) | np.isnan(ahi), np.nan, hi)
        lo, hi = widen(lo, hi)
    else:
        F = self.fmt(value_dtype(v))
        terms = self.fused_terms("mul", F)
        if terms is not None and _on_host(alo, ahi, blo, bhi):
            # one fused pass: corners, the float64 product's rounding and the op's
            lo, hi, n = _K.mul_bounds(alo, ahi, blo, bhi, *terms)
            if pt and F.p <= 26:
                lo, hi, pt = _exact_on_points(v, lo, hi, alo, blo, "mul")
            lo, hi = _no_claim_if_unbounded(v, lo, hi, n)
            return self.new(v, lo, hi, un, pt and un is None and F.p <= 26)
        lo, hi = product_range(alo, ahi, blo, bhi)
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = self.round_result("mul", v, lo, hi, (alo, ahi), (blo, bhi))
        lo, hi = _no_claim_if_unbounded(v, lo, hi)
    if a is b and self._own(a) and self.fmt(value_dtype(v)) is not None:
        lo = np.where(lo < 0, 0.0, lo)        # a rounded square is never negative
    return self.new(v, lo, hi, un)


@rule("div")
def _div(self, prim, a, b):
    v, (alo, ahi), (blo, bhi), un, pt = self.binary(prim, a, b)
    terms = self.fused_terms("div", self.fmt(value_dtype(v)))
    if terms is not None and _on_host(alo, ahi, blo, bhi):
        # the steps below in one pass: corners, the roundings, the sign, a divisor holding 0
        lo, hi, n = _K.div_bounds(alo, ahi, blo, bhi, *terms)
        _divisor_zero(self, n)
        lo, hi = _no_claim_if_unbounded(v, lo, hi, n)
        return self.new(v, lo, hi, un)
    zero = (blo <= 0) & (bhi >= 0)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        lo, hi = corners(np.divide, alo, ahi, blo, bhi)
        F = self.fmt(value_dtype(v))
        signed = F is not None and sign_keeping(self.accuracy("div", F))
        if signed:          # the exact quotient's sign, from the operands' (it may underflow)
            nonneg = ((alo >= 0) & (blo > 0)) | ((ahi <= 0) & (bhi < 0))
            nonpos = ((alo >= 0) & (bhi < 0)) | ((ahi <= 0) & (blo > 0))
        # (the float64 division's own rounding is one step of the op's widening)
        lo, hi = self.round_result("div", v, lo, hi, (alo, ahi), (blo, bhi), steps=1)
        if signed:          # 0/8 is 0, not [-2^-149, 2^-149]: a NaN-free sqrt of it later
            lo = np.where(nonneg & (lo < 0) & (lo > -np.inf), 0.0, lo)
            hi = np.where(nonpos & (hi > 0) & (hi < np.inf), 0.0, hi)
    if np.any(zero):
        _divisor_zero(self, int(np.count_nonzero(np.broadcast_to(zero, np.shape(lo)))))
        lo = np.where(zero, -np.inf, lo)
        hi = np.where(zero, np.inf, hi)
        lo, hi = _no_claim_if_unbounded(v, lo, hi, True)
    return self.new(v, lo, hi, un)


def _divisor_zero(self, n):
    """Note the ``n`` quotients whose divisor interval holds 0 (unbounded)."""
    if n:
        self.note("division-by-zero-interval", "a divisor interval contains 0: those "
                  "elements are unbounded", n)


def _no_claim_if_unbounded(v, lo, hi, n=None):
    """NaN bounds (no claim) where a product or quotient is unbounded ([-inf, inf]: a 0·inf
    corner, a divisor holding 0) and the program's value is NaN (0·inf, 0/0 of points): a
    later tanh would otherwise claim [-1, 1] for a NaN result. ``n``: whether any bound is
    unbounded (counted by the fused kernels), else checked here."""
    if n is None:
        n = np.any(np.isneginf(lo) & np.isposinf(hi))
    return no_claim_where_nan(lo, hi, concrete(v)) if n else (lo, hi)


@rule("fma")
def _fma(self, prim, a, b, c):
    v = self.value_of(prim, (a, b, c), {})
    dt = value_dtype(v)
    alo, ahi, au, _ = self.bounds(a, dt)
    blo, bhi, bu, _ = self.bounds(b, dt)
    clo, chi, cu, _ = self.bounds(c, dt)
    plo, phi = product_range(alo, ahi, blo, bhi)
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = widen(plo + clo, phi + chi)
        lo, hi = self.round_result("fma", v, lo, hi, (alo, ahi), (blo, bhi), (clo, chi))
        lo, hi = _no_claim_if_unbounded(v, lo, hi)
    return self.new(v, lo, hi, or_unstable(au, bu, cu))


def _exact_result(self, prim, v, lo, hi, u, pt):
    """The tracer of an exact op's bounds; an integer result goes through the dtype's range
    check (``-INT_MIN`` and ``abs(INT_MIN)`` wrap around in NumPy)."""
    dt = value_dtype(v)
    if dt.kind in "iu":
        lo, hi = self.integer_bounds(prim.name, dt, lo, hi)
        pt = pt and bool(np.array_equal(lo, hi))
    return self.new(v, lo, hi, u, pt)


@rule("neg")
def _neg(self, prim, a):
    v = self.value_of(prim, (a,), {})
    lo, hi, u, pt = self.bounds(a)
    return _exact_result(self, prim, v, -hi, -lo, u, pt)


@rule("abs")
def _abs(self, prim, a):
    v = self.value_of(prim, (a,), {})
    lo, hi, u, pt = self.bounds(a)
    nlo = np.where(lo >= 0, lo, np.where(hi <= 0, -hi, 0.0))
    nhi = np.maximum(np.abs(lo), np.abs(hi))
    nlo = np.where(np.isnan(lo) | np.isnan(hi), np.nan, nlo)
    return _exact_result(self, prim, v, nlo, nhi, u, pt)


@rule("max", "min")
def _max_min(self, prim, a, b):
    v, (alo, ahi), (blo, bhi), un, pt = self.binary(prim, a, b)
    f = np.maximum if prim.name == "max" else np.minimum
    if self.branches == "concrete":  # RENDER: follow the operand the program chose
        va = as_f64(self.primal_of(a))
        pick_a = (va == as_f64(concrete(v)))
        lo, hi = np.where(pick_a, alo, blo), np.where(pick_a, ahi, bhi)
    else:
        lo, hi = f(alo, blo), f(ahi, bhi)   # exact: max/min are continuous
    return self.new(v, lo, hi, un, pt)


def _monotone(f, prim_name, domain=None, image=None):
    """The rule of an increasing f. ``domain``: the lower end of f's domain (sqrt, log, ...).
    An input interval that straddles it has executions that give NaN, which no bound can
    express and which a comparison must not decide on (NaN > x is False): its lower bound
    stays NaN (no claim: a bound clamped to the domain would let ``where`` pick a branch that
    a NaN execution does not take), the element is marked unstable and an event is recorded.
    ``image``: (lo, hi) that every result lies in -- f's range, whose ends are floats, so
    rounding keeps results inside -- and the bound is cut to it (exp's absolute error term
    would otherwise reach below 0, and the log of a sum of such exps would be NaN)."""
    def rule(self, prim, a):
        v = self.value_of(prim, (a,), {})
        lo, hi, u, pt = self.bounds(a)
        if domain is not None:
            with np.errstate(invalid="ignore"):
                cut = (lo < domain) & (hi >= domain)
            if np.any(cut):
                self.note("domain", f"{prim_name}: an input interval reaches below {domain:g} "
                          "(NaN possible there)", int(np.count_nonzero(cut)))
                u = or_unstable(u, cut)
        with np.errstate(all="ignore"):
            flo, fhi = f(lo), f(hi)
            flo, fhi = self.round_result(prim_name, v, flo, fhi, (lo, hi), steps=LIBM64_ULPS)
            if image is not None:                   # (NaN stays NaN)
                flo, fhi = np.maximum(flo, image[0]), np.minimum(fhi, image[1])
        return self.new(v, flo, fhi, u)
    return rule


_DOMAIN = {"log": 0.0, "log2": 0.0, "sqrt": 0.0, "log1p": -1.0}
_IMAGE = {"exp": (0.0, np.inf), "exp2": (0.0, np.inf), "expm1": (-1.0, np.inf),
          "sqrt": (0.0, np.inf), "tanh": (-1.0, 1.0), "erf": (-1.0, 1.0)}
for _n, _f in {"exp": np.exp, "expm1": np.expm1, "exp2": np.exp2, "log": np.log,
               "log1p": np.log1p, "log2": np.log2, "sqrt": np.sqrt, "tanh": np.tanh,
               "sinh": np.sinh, "atan": np.arctan}.items():
    rule(_n)(_monotone(_f, _n, domain=_DOMAIN.get(_n), image=_IMAGE.get(_n)))


def _erf64(x):
    return _erf_kernel(np.asarray(x, np.float64))


rule("erf")(_monotone(_erf64, "erf", image=_IMAGE["erf"]))


@rule("cosh")
def _cosh(self, prim, a):
    v = self.value_of(prim, (a,), {})
    lo, hi, u, _ = self.bounds(a)
    with np.errstate(all="ignore"):
        clo, chi = np.cosh(lo), np.cosh(hi)
        flo = np.where((lo <= 0) & (hi >= 0), 1.0, np.minimum(clo, chi))
        fhi = np.maximum(clo, chi)
        flo, fhi = widen(flo, fhi, LIBM64_ULPS)
        flo, fhi = self.round_result("cosh", v, flo, fhi, (lo, hi))
    return self.new(v, flo, fhi, u)


def _periodic_contains(lo, hi, phase, period):
    """Does [lo, hi] (possibly) contain a point phase + k·period? Conservative: a tolerance
    covers the float64 error of the reduction (|x|·2^-50 plus π's representation error)."""
    with np.errstate(all="ignore"):
        tol = (np.maximum(np.abs(lo), np.abs(hi)) / period + 1.0) * 2.0 ** -48
        klo = np.ceil((lo - phase) / period - tol)
        khi = np.floor((hi - phase) / period + tol)
    return klo <= khi


def _trig(kind):
    f = {"sin": np.sin, "cos": np.cos, "tan": np.tan}[kind]

    def rule(self, prim, a):
        v = self.value_of(prim, (a,), {})
        lo, hi, u, _ = self.bounds(a)
        with np.errstate(all="ignore"):
            flo, fhi = f(lo), f(hi)
            big = ~((hi - lo) < 2 * np.pi) | ~(np.maximum(np.abs(lo), np.abs(hi)) < 2.0 ** 40)
            if kind == "tan":
                pole = _periodic_contains(lo, hi, np.pi / 2, np.pi) | big
                rlo, rhi = np.where(pole, -np.inf, flo), np.where(pole, np.inf, fhi)
                rlo, rhi = widen(rlo, rhi, LIBM64_ULPS)
            else:
                top = (np.pi / 2, 0.0)[kind == "cos"]
                bot = (-np.pi / 2, np.pi)[kind == "cos"]
                has_max = _periodic_contains(lo, hi, top, 2 * np.pi) | big
                has_min = _periodic_contains(lo, hi, bot, 2 * np.pi) | big
                rlo, rhi = widen(np.minimum(flo, fhi), np.maximum(flo, fhi), LIBM64_ULPS)
                rhi = np.where(has_max, 1.0, np.minimum(rhi, 1.0))
                rlo = np.where(has_min, -1.0, np.maximum(rlo, -1.0))
            nan = np.isnan(lo) | np.isnan(hi) | np.isinf(lo) | np.isinf(hi)
            rlo, rhi = np.where(nan, np.nan, rlo), np.where(nan, np.nan, rhi)
            rlo, rhi = self.round_result(kind, v, rlo, rhi, (lo, hi))
        return self.new(v, rlo, rhi, u)
    return rule


for _n in ("sin", "cos", "tan"):
    rule(_n)(_trig(_n))


@rule("atan2")
def _atan2(self, prim, y, x):
    v, (ylo, yhi), (xlo, xhi), un, _ = self.binary(prim, y, x)
    with np.errstate(all="ignore"):
        lo, hi = corners(np.arctan2, ylo, yhi, xlo, xhi)
        # the box touches the branch cut (x <= 0, y straddling 0) or the origin: full range
        cut = (xlo <= 0) & (ylo <= 0) & (yhi >= 0)
        lo, hi = np.where(cut, -np.pi, lo), np.where(cut, np.pi, hi)
        lo, hi = widen(lo, hi, LIBM64_ULPS)
        lo, hi = self.round_result("atan2", v, lo, hi, (ylo, yhi), (xlo, xhi))
    jump = cut & ~((ylo == yhi) & (xlo == xhi))
    if np.any(jump):
        # the sign of y (a zero's sign included) decides between +pi and -pi: a discontinuity
        # round-off can flip, like floor/sign (unstable), reported so that a verdict resting
        # on the whole [-pi, pi] says so
        self.note("branch-cut", "atan2(y, x) with x <= 0 and y's bound straddling 0: the "
                  "result may jump between +pi and -pi (bound: the whole [-pi, pi])",
                  int(np.count_nonzero(jump)))
        un = or_unstable(un, jump)
    return self.new(v, lo, hi, un)


@rule("pow")
def _pow(self, prim, a, b):
    v, (alo, ahi), (blo, bhi), un, _ = self.binary(prim, a, b)
    with np.errstate(all="ignore"):
        lo, hi = corners(np.power, alo, ahi, blo, bhi)
        # base > 0: pow is monotone in each argument, so the corners bound the box.
        # base may be <= 0: exact only for a point integer exponent (parity), else undefined.
        neg = alo <= 0
        bint = (blo == bhi) & (np.floor(blo) == blo)
        n = blo
        even = bint & (np.mod(n, 2) == 0)
        straddle = (alo < 0) & (ahi > 0)
        mag = np.maximum(np.abs(alo), np.abs(ahi))
        with_zero = (alo <= 0) & (ahi >= 0)
        # integer n >= 0 through zero: even -> [0, mag^n] ; odd -> monotone corners (already)
        lo = np.where(neg & bint & (n > 0) & even & straddle, 0.0, lo)
        hi = np.where(neg & bint & (n > 0) & even & straddle, np.power(mag, n), hi)
        # negative integer exponent with zero in the base: a pole
        pole = neg & bint & (n < 0) & with_zero
        lo, hi = np.where(pole, -np.inf, lo), np.where(pole, np.inf, hi)
        undefined = neg & ~bint & (alo < 0)
        lo, hi = np.where(undefined, np.nan, lo), np.where(undefined, np.nan, hi)
        lo, hi = widen(lo, hi, LIBM64_ULPS)
        lo, hi = self.round_result("pow", v, lo, hi, (alo, ahi), (blo, bhi))
    return self.new(v, lo, hi, un)


def _step_rule(f):
    """floor/ceil/round/sign: monotone, exact, discontinuous (unstable where the ends differ)."""
    def rule(self, prim, a):
        v = self.value_of(prim, (a,), {})
        lo, hi, u, pt = self.bounds(a)
        flo, fhi = f(lo), f(hi)
        jump = flo != fhi
        return self.new(v, flo, fhi, or_unstable(u, jump if np.any(jump) else None), pt)
    return rule


for _n, _f in {"floor": np.floor, "ceil": np.ceil, "round": np.rint, "sign": np.sign}.items():
    rule(_n)(_step_rule(_f))


def _exact_floor_quotients(self, dt, alo, ahi, blo, bhi, qlo, qhi):
    """(lo, hi, ok): floor(a/b) over the box from the corners' exact floor quotients, where
    that is what every execution gives (``ok``). floor is monotone and a/b monotone in each
    argument away from b = 0, so the range is [min, max] of the corners' floor(a/b). NumPy's
    float floor_divide (npy_divmod) computes div = (a - fmod(a, b))/b -- two roundings of the
    integer k = trunc(a/b), so |div - k| <= 2.0001·u·|k| < 1/2 for |k| < 2^(p-3) -- then
    floors it and rounds back up past .5: floor(a/b) exactly there (float64 ends: below
    2^50). Integer dtypes divide exactly; float ones in their own format's p."""
    F = None if dt.kind in "iub" else self.fmt(dt)
    if dt.kind not in "iub" and F is None:
        return None
    lim = 2.0 ** (min(F.p if F is not None else 53, 53) - 3)
    flo, fhi = corners(np.floor_divide, alo, ahi, blo, bhi)
    big = np.maximum(np.maximum(np.abs(alo), np.abs(ahi)), np.maximum(np.abs(blo), np.abs(bhi)))
    ok = ((np.maximum(np.abs(qlo), np.abs(qhi)) < lim) & (big < 2.0 ** 53)
          & ((blo > 0) | (bhi < 0)) & np.isfinite(flo) & np.isfinite(fhi))
    return flo, fhi, ok


@rule("floor_divide")
def _floor_divide(self, prim, a, b):
    """Exact where every execution is (``_exact_floor_quotients``): a point integer quotient
    has zero width. Elsewhere (a float program's large quotients) the floor of the widened
    float64 quotient, one step and 4u·|q| more each way: npy_divmod's div = (a - fmod)/b is
    within 2u·|k| of k = trunc(a/b), its floor corrected past .5 is within 1 of that, and a
    float16 result is rounded once more from float32 (a float16 16358.3 // 1 is 16360)."""
    v, (alo, ahi), (blo, bhi), un, _ = self.binary(prim, a, b)
    zero = (blo <= 0) & (bhi >= 0)
    dt = value_dtype(v)
    F = None if dt.kind in "iub" else self.fmt(dt)
    u = 2.0 ** -(F.p if F is not None else 53)
    with np.errstate(all="ignore"):
        qlo, qhi = corners(np.divide, alo, ahi, blo, bhi)
        qlo, qhi = widen(qlo, qhi)
        lo, hi = widen(np.floor(qlo) - 1 - 4 * u * np.abs(qlo),
                        np.floor(qhi) + 1 + 4 * u * np.abs(qhi))
        exact = _exact_floor_quotients(self, dt, alo, ahi, blo, bhi, qlo, qhi)
        if exact is not None:
            lo, hi = np.where(exact[2], exact[0], lo), np.where(exact[2], exact[1], hi)
    lo, hi = np.where(zero, -np.inf, lo), np.where(zero, np.inf, hi)
    unstable = or_unstable(un, lo != hi)
    if dt.kind in "iu":          # INT_MIN // -1 wraps around
        lo, hi = self.integer_bounds("floor_divide", dt, lo, hi)
    else:                        # a quotient past the format's range is ±inf; x // 0,
        if F is not None:        # inf // x: NaN, no claim
            lo, hi = overflow(lo, hi, F)
        lo, hi = no_claim_where_nan(lo, hi, concrete(v))
    return self.new(v, lo, hi, unstable)


@rule("remainder")
def _remainder(self, prim, a, b):
    """The sign of b's range: [0, b) or (b, 0]. For integers, where floor(a/b) is one q over
    the box (``_exact_floor_quotients``), a - q·b exactly (its corners), within that range:
    a point integer remainder has zero width."""
    v, (alo, ahi), (blo, bhi), un, _ = self.binary(prim, a, b)
    pos, neg = blo > 0, bhi < 0
    lo = np.where(pos, 0.0, np.where(neg, blo, -np.inf))
    hi = np.where(pos, bhi, np.where(neg, 0.0, np.inf))
    dt = value_dtype(v)
    if dt.kind in "iu":
        with np.errstate(all="ignore"):
            qlo, qhi = widen(*corners(np.divide, alo, ahi, blo, bhi))
            exact = _exact_floor_quotients(self, dt, alo, ahi, blo, bhi, qlo, qhi)
            if exact is not None:
                q = exact[0]
                one = exact[2] & (exact[0] == exact[1])
                # a - q·b is linear in a and b: its range is at its corners; below 2^53 exact
                rlo = np.minimum(alo - q * blo, alo - q * bhi)
                rhi = np.maximum(ahi - q * blo, ahi - q * bhi)
                one &= (np.maximum(np.abs(rlo), np.abs(rhi)) < 2.0 ** 53)
                lo = np.where(one, np.maximum(lo, rlo), lo)
                hi = np.where(one, np.minimum(hi, rhi), hi)
    else:                        # x % 0, inf % x: NaN, no claim (not [0, b))
        lo, hi = no_claim_where_nan(lo, hi, concrete(v))
    return self.new(v, lo, hi, un)




# ---- balls through a constant -------------------------------------------------------------
def _ball_constant(self, prim, a, b):
    """(x, c, value, F) for a ball rule: x a ball operand, c a constant, the result a finite
    float32/float64 array of x's shape and dtype (a ball of any other kind is read as a box).
    A point of this interpreter (an input, a residual ``x + f(x)``) is a constant too. A
    Python literal takes part only where x's format holds it exactly (``x * 2``,
    ``max(x, 0)``); another literal's rounding is bounded by the box rule."""
    x, c = (a, b) if self._own(a) and a.is_ball else (b, a)
    if not (self._own(x) and x.is_ball) or (self._own(c) and not (c.point and c.unstable is None)):
        return None
    xv, cv = concrete(x.primal), self.primal_of(c)
    try:        # decided before the value is computed (else the box rule computes it again)
        fits = (isinstance(xv, np.ndarray) and xv.ndim and xv.dtype in (np.float32, np.float64)
                and np.result_type(xv, cv) == xv.dtype
                and np.broadcast_shapes(xv.shape, np.shape(cv)) == xv.shape)
        if fits and type(cv) in (int, float):
            with np.errstate(all="ignore"):
                held = xv.dtype.type(cv)
            fits, cv = float(held) == cv, held
    except (TypeError, ValueError, OverflowError):
        return None
    F = self.fmt(xv.dtype) if fits else None
    if F is None or not F.has_inf or self.accuracy(prim.name, F).input_dependent:
        return None
    v = self.value_of(prim, (a, b), {})
    return x, cv, v, F


@ball_rule("add", "sub", "mul")
def _ball_shift_scale(self, prim, a, b):
    """x + t, x - t (t constant) and x·s (s a constant scalar) of a ball x within r of v, and
    x ± y of two balls (radii r_x + r_y: ``_ball_operands``). An execution y = fl(x ∘ c) errs by
    <= q·|x ∘ c| + e (the policy), the program's value v' = fl(v ∘ c) by <= q0·|v ∘ c| + e0
    (NumPy's IEEE op: q0 = 2^-p, e0 = 0 for a sum, whose underflow is exact, η/2 for a
    product), and |x ∘ c - v ∘ c| <= g·r (g = 1, or |s|): |y - v'| <= g·r·(1 + q) + (q +
    q0)·|v ∘ c| + e + e0, |v ∘ c| <= (|v'| + e0)/(1 - q0)."""
    got = _ball_operands(self, prim, a, b)
    if got is None:
        return None
    x, c, v, F, r2 = got
    q, e = self.rel_abs(prim.name, F)
    q0 = 2.0 ** -F.p
    if prim.name == "mul":
        if np.ndim(c) or not np.isfinite(c):
            return None
        g, e0 = abs(float(c)), F.smallest_subnormal / 2
    else:                                         # (t - x: the same radius about t - v)
        g, e0 = 1.0, 0.0
    bq = (q + q0) / (1 - q0) * (1 + 4 * E64)
    rad, n_bad = _K.ball_affine(v, x.rad, g * (1 + q), bq, (bq * e0 + e + e0) * (1 + 4 * E64),
                                r2)
    if n_bad:
        return None
    return self.new_ball(v, rad, F.max, or_unstable(x.unstable, b.unstable) if np.ndim(r2)
                         else x.unstable)


def _ball_operands(self, prim, a, b):
    """(x, c, value, F, r2) for ``_ball_shift_scale``: ``_ball_constant``'s with r2 = 0, or
    for x ± y of two balls of one shape and float dtype, c = 0 and r2 = y's radius."""
    if prim.name == "mul" or not (self._own(a) and self._own(b) and a.is_ball
                                  and b.is_ball):
        got = _ball_constant(self, prim, a, b)
        return None if got is None else (*got, 0.0)
    if a is b:          # (x - x is exactly 0: the box rule)
        return None
    va, vb = concrete(a.primal), concrete(b.primal)
    if not (isinstance(va, np.ndarray) and isinstance(vb, np.ndarray) and va.ndim
            and va.shape == vb.shape == np.shape(a.rad) == np.shape(b.rad)
            and va.dtype == vb.dtype and va.dtype in (np.float32, np.float64)):
        return None
    F = self.fmt(va.dtype)
    if F is None or not F.has_inf or self.accuracy(prim.name, F).input_dependent:
        return None
    return a, 0.0, self.value_of(prim, (a, b), {}), F, b.rad


@ball_rule("max", "min")
def _ball_clamp(self, prim, a, b):
    """max(x, c) (min: by symmetry) of a ball x and a constant scalar c: exact, 1-Lipschitz;
    the radius stays where the value passed c and shrinks to how far an execution may pass c
    where it did not (``ball_floor``: 0 where no execution can). c joins the ball's clip
    (every execution is >= c): its box is the clamp's exact box -- a ball about the value
    cannot say "one-sided", and a wide ball straddling c (hardsigmoid's clamp(z + 3, 0, 6)
    of ±387 about 2.7) would otherwise give ±387 where every execution lies in [0, 6]."""
    if self.branches != "hull":
        return None
    got = _ball_constant(self, prim, a, b)
    if got is None or np.ndim(got[1]) or not np.isfinite(got[1]):
        return None
    x, c, v, F = got
    lo, hi = x.clip
    if prim.name == "max":
        rad = _K.ball_floor(x.primal, x.rad, float(c))
        clip = (max(lo, float(c)), max(hi, float(c)))
    else:
        rad = _K.ball_floor(-np.asarray(x.primal), x.rad, -float(c))
        clip = (min(lo, float(c)), min(hi, float(c)))
    return self.new_ball(v, rad, F.max, x.unstable, clip)
