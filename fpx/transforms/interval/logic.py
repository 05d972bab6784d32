"""Interval rules of comparisons, logic, selection and casts: where an operand's bounds
cannot decide a comparison the result is *unstable* (``branches="hull"``: ``where`` takes the
hull of both sides there); a cast rounds into its target format or truncates to an integer.
"""
from __future__ import annotations

import numpy as np

from fpx import formats as _formats
from fpx.core import concrete
from fpx.transforms.interval.enclosure import any_nan, as_f64, or_unstable, round_bounds, truth
from fpx.transforms.interval.interpreter import rule


def bool_interval(certain, possible):
    lo = certain.astype(np.float64)
    hi = possible.astype(np.float64)
    return lo, hi, lo != hi


@rule("lt", "le", "gt", "ge", "eq", "ne")
def _compare(self, prim, a, b):
    v = self.value_of(prim, (a, b), {})
    # comparisons compare in the promoted dtype of the operands (weak Python scalars follow)
    try:
        pdt = np.result_type(*[p if isinstance(p, (bool, int, float)) else np.asarray(p).dtype
                               for p in map(self.primal_of, (a, b))])
    except TypeError:   # e.g. bfloat16 vs float16: no common dtype, but NumPy has a loop
        pdt = None      # (two arrays: no weak scalar to convert)
    alo, ahi, au, _ = self.bounds(a, pdt)
    blo, bhi, bu, _ = self.bounds(b, pdt)
    n = prim.name
    with np.errstate(invalid="ignore"):
        if n in ("lt", "gt"):
            if n == "gt":
                alo, ahi, blo, bhi = blo, bhi, alo, ahi
            certain, possible = ahi < blo, alo < bhi
        elif n in ("le", "ge"):
            if n == "ge":
                alo, ahi, blo, bhi = blo, bhi, alo, ahi
            certain, possible = ahi <= blo, alo <= bhi
        elif n == "eq":
            certain = (alo == ahi) & (blo == bhi) & (alo == blo)
            possible = (alo <= bhi) & (blo <= ahi)
        else:
            possible = ~((alo == ahi) & (blo == bhi) & (alo == blo))
            certain = (ahi < blo) | (bhi < alo)
    nan = any_nan(alo, ahi, blo, bhi)
    certain, possible = certain & ~nan, possible | nan
    lo, hi, unst = bool_interval(certain, possible)
    return self.new(v, lo, hi, or_unstable(au, bu, unst if np.any(unst) else None))


@rule("logical_and", "logical_or", "logical_xor")
def _logic2(self, prim, a, b):
    v, (alo, ahi), (blo, bhi), un, pt = self.binary(prim, a, b)
    (A0, A1), (B0, B1) = truth(alo, ahi), truth(blo, bhi)   # certain / possible truth
    if prim.name == "logical_and":
        certain, possible = A0 & B0, A1 & B1
    elif prim.name == "logical_or":
        certain, possible = A0 | B0, A1 | B1
    else:
        undecided = (A0 != A1) | (B0 != B1)
        val = A0 != B0
        certain, possible = val & ~undecided, val | undecided
    lo, hi, unst = bool_interval(certain, possible)
    return self.new(v, lo, hi, or_unstable(un, unst if np.any(unst) else None), pt)


@rule("logical_not")
def _logic_not(self, prim, a):
    v = self.value_of(prim, (a,), {})
    lo, hi, u, pt = self.bounds(a)
    is_true, maybe_true = truth(lo, hi)
    certain, possible = ~maybe_true, ~is_true
    nlo, nhi, unst = bool_interval(certain, possible)
    return self.new(v, nlo, nhi, or_unstable(u, unst if np.any(unst) else None), pt)


@rule("isnan", "isinf", "isfinite")
def _isclass(self, prim, a):
    v = self.value_of(prim, (a,), {})
    lo, hi, u, pt = self.bounds(a)
    finite = np.isfinite(lo) & np.isfinite(hi)
    point_inf = (lo == hi) & np.isinf(lo)
    # both ends NaN and stable: every execution is NaN (a "maybe NaN" end is marked unstable)
    all_nan = np.isnan(lo) & np.isnan(hi)
    if u is not None:
        all_nan = all_nan & ~u
    if prim.name == "isnan":
        certain, possible = all_nan, ~finite
    elif prim.name == "isinf":
        certain, possible = point_inf, ~finite & ~all_nan
    else:
        certain, possible = finite, ~point_inf & ~all_nan
    nlo, nhi, unst = bool_interval(certain, possible)
    return self.new(v, nlo, nhi, or_unstable(u, unst if np.any(unst) else None), pt)


@rule("where")
def _where(self, prim, c, x, y):
    v = self.value_of(prim, (c, x, y), {})
    dt = np.asarray(concrete(v)).dtype
    clo, chi, cu, _ = self.bounds(c)
    xlo, xhi, xu, xp = self.bounds(x, dt)
    ylo, yhi, yu, yp = self.bounds(y, dt)
    sure_t, maybe_t = truth(clo, chi)
    sure_f = ~maybe_t
    if cu is None and (np.all(sure_f) or np.all(sure_t)):
        # every condition decided the same way (a mask with nothing masked): that side's
        # bounds as they are (read-only views where they broadcast)
        lo, hi, u, p = (ylo, yhi, yu, yp) if np.all(sure_f) else (xlo, xhi, xu, xp)
        return self.new(v, lo, hi, u, p)
    if self.branches == "concrete":
        take = as_f64(self.primal_of(c)) != 0
        lo, hi = np.where(take, xlo, ylo), np.where(take, xhi, yhi)
    else:
        lo = np.where(sure_t, xlo, np.where(sure_f, ylo, np.minimum(xlo, ylo)))
        hi = np.where(sure_t, xhi, np.where(sure_f, yhi, np.maximum(xhi, yhi)))
    undecided = ~(sure_t | sure_f)
    # a side's instability reaches only the elements that may take it (T5's position buckets:
    # a log path marked unstable where where() certainly takes the exact distance)
    xu = None if xu is None or not np.any(xu := xu & ~sure_f) else xu
    yu = None if yu is None or not np.any(yu := yu & ~sure_t) else yu
    un = or_unstable(cu, xu, yu, undecided if np.any(undecided) else None)
    # a point only if both sides are and every condition is decided (an undecided one hulls
    # both sides: lo < hi there, and matmul would drop that radius for a "point" operand)
    pt = xp and yp and (self.branches == "concrete" or not np.any(undecided))
    return self.new(v, lo, hi, un, pt)


# =============================================================================================
# Casts
# =============================================================================================
def contains_format(big, small):
    return big.p >= small.p and big.emin <= small.emin and big.emax >= small.emax


@rule("cast")
def _cast(self, prim, a, *, to):
    v = self.value_of(prim, (a,), {"to": to})
    lo, hi, u, pt = self.bounds(a)
    src = self.fmt(np.asarray(self.primal_of(a)).dtype)
    if isinstance(to, _formats.Format):
        if src is not None and contains_format(to, src):
            return self.new(v, lo, hi, u, pt)            # widening cast: exact
        with np.errstate(all="ignore"):
            if to.dtype in (_formats.bfloat16.dtype, _formats.float8_e4m3fn.dtype,
                            _formats.float8_e5m2.dtype) and (src is None or src.p > 24):
                # NumPy/ml_dtypes convert wider values through float32: two roundings
                lo, hi = round_bounds(lo, hi, _formats.float32,
                                       self.accuracy("cast", _formats.float32))
            lo, hi = round_bounds(lo, hi, to, self.accuracy("cast", to))
        return self.new(v, lo, hi, u)
    dt = np.dtype(to)
    if dt.kind == "b":
        certain, possible = truth(lo, hi)
        nlo, nhi, unst = bool_interval(certain, possible)
        return self.new(v, nlo, nhi, or_unstable(u, unst if np.any(unst) else None), pt)
    with np.errstate(all="ignore"):
        tlo, thi = np.trunc(lo), np.trunc(hi)   # float -> int truncates toward zero
        jump = (tlo != thi) | np.isnan(tlo) | np.isnan(thi)
        # out of the target's range NumPy's conversion is undefined (wraps, or INT_MIN)
        tlo, thi = self.integer_bounds("cast", dt, tlo, thi)
    return self.new(v, tlo, thi, or_unstable(u, jump if np.any(jump) else None),
                    pt and not np.any(jump) and bool(np.array_equal(tlo, thi)))


