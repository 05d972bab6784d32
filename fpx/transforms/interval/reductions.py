"""Interval rules of reductions: sums and cumulative sums (classic and partial-sum error
forms, any order), products, max/min, argmax/argmin, sort and argsort."""
from __future__ import annotations

import math

import numpy as np

from fpx.core import concrete
from fpx.transforms.interval.enclosure import (E64, gamma64, no_claim_where_nan, or_unstable,
                                               overflow, product_range, round_bounds, up,
                                               widen, xp_of)
from fpx.transforms.interval.interpreter import rule


def axes_of(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        return tuple(a % ndim for a in axis)
    return (axis % ndim,)


def count(shape, axis):
    n = 1
    for ax in axes_of(axis, len(shape)):
        n *= shape[ax]
    return n


LONG_SUM = 0.5      # (n - 1)·u from which a sum's rigorous bound is noted as too wide to use


def note_long_sum(self, prim_name, n, delta, F_acc):
    """An event where a sum of ``n`` terms has a rigorous bound as wide as the sum can be:
    ``(n - 1)·δ >= LONG_SUM`` lets rounding move it by half of ``Σ|x|`` or more. The message
    names what gives a usable bound instead."""
    if self.bound == "rigorous" and (n - 1) * delta >= LONG_SUM:
        self.note("long-sum", f"{prim_name} of {n} terms accumulated in {F_acc.name}: the "
                  f"rigorous bound (any summation order) is up to ±{(n - 1) * delta:.3g}·Σ|x| "
                  "wide. bound='probabilistic' (Higham-Mary, about sqrt(n)·u; not rigorous) is "
                  "far tighter; or sum in chunks of b terms, x.reshape(-1, b).sum(axis=1).sum(): "
                  "a rigorous bound of about (b + n/b)·u")


def acc_delta(self, prim_name, fmt):
    """Relative error bound of one addition in format fmt: ulps·2^(1-p)."""
    acc = self.accuracy(prim_name, fmt)
    return math.inf if acc.input_dependent else acc.ulps * 2.0 ** (1 - fmt.p)


@rule("reduce_sum")
def _reduce_sum(self, prim, a, *, axis=None, keepdims=False, dtype=None):
    v = self.value_of(prim, (a,), {"axis": axis, "keepdims": keepdims, "dtype": dtype})
    lo, hi, u, pt = self.bounds(a)
    out_dt = np.asarray(concrete(v)).dtype
    n = count(np.shape(lo), axis)
    F_out = self.fmt(out_dt)
    with np.errstate(all="ignore"):
        mid, rad = (lo + hi) / 2, (hi - lo) / 2          # rad rounded: widened below
        mag = np.maximum(np.abs(lo), np.abs(hi))
        s_mid = np.sum(mid, axis=axis, keepdims=keepdims)
        s_rad = np.sum(rad, axis=axis, keepdims=keepdims)
        s_mag = np.sum(mag, axis=axis, keepdims=keepdims)
        g64 = gamma64(n)
        r = up(s_rad * (1 + g64) + g64 * s_mag + np.abs(s_mid) * 2 * E64, 4)
        if F_out is not None:
            prec = self.resolve("reduce_sum", np.dtype(dtype) if dtype is not None
                                       else out_dt)
            Facc = prec.accumulate
            c = self.sum_gamma(max(n - 1, 0), acc_delta(self, "reduce_sum", Facc),
                               self.accuracy("reduce_sum", Facc).ulps == 0.5)
            note_long_sum(self, "sum", n, acc_delta(self, "reduce_sum", Facc), Facc)
            cm = self.partial_sum_gamma(max(n - 1, 0), acc_delta(self, "reduce_sum", Facc))
            if cm < math.inf:   # through the partial sums, where tighter (cancelling terms)
                s_part = np.maximum(np.sum(np.maximum(hi, 0.0), axis=axis, keepdims=keepdims),
                                    np.sum(np.maximum(-lo, 0.0), axis=axis, keepdims=keepdims))
                r = r + up(np.minimum(c * s_mag, cm * s_part) * (1 + g64), 3)
            else:
                r = r + up(c * s_mag * (1 + g64), 3)
            lo2, hi2 = widen(s_mid - r, s_mid + r, 1)
            lo2, hi2 = _acc_guard(lo2, hi2, s_mag, c, Facc, lambda: np.any(
                np.isnan(lo) | np.isnan(hi), axis=axis, keepdims=keepdims), concrete(v))
            lo2, hi2 = _to_output(self, lo2, hi2, Facc, F_out)
            # a floating-point sum of nonnegative terms is nonnegative in any order (rounding
            # is monotone): keeps sum(x*x) + eps away from a NaN sqrt in variances
            nonneg = np.all(lo >= 0, axis=axis, keepdims=keepdims)
            if np.any(nonneg):
                lo2 = np.where(nonneg & (lo2 < 0), 0.0, lo2)
        else:           # integers: exact, the enclosure tightened to the integers in it
            lo2, hi2 = widen(s_mid - r, s_mid + r, 1)
            lo2, hi2 = self.integer_bounds("reduce_sum", out_dt, lo2, hi2)
    un = None if u is None else np.any(u, axis=axis, keepdims=keepdims)
    return self.new(v, lo2, hi2, un, pt and n <= 1)


def _acc_guard(lo, hi, mag, c, F_acc, nan_in, value):
    """Where the terms' magnitudes (sum ``mag``, with rounding ``c``) pass the accumulator's
    largest finite value, some partial sum may overflow: the result may be ±inf whatever the
    final sum is. NaN bounds from inf - inf in the float64 bound arithmetic, where no term's
    bound is NaN (``nan_in()``, evaluated only then), mean "unbounded", not "undefined";
    NaN where the program's ``value`` is (``no_claim_where_nan``)."""
    with np.errstate(all="ignore"):
        over = up(mag * (1.0 + c), 2) > F_acc.max
    bad = np.isnan(lo) | np.isnan(hi)
    if np.any(bad):
        over = over | (bad & ~nan_in())
    if np.any(over):
        lo, hi = np.where(over, -np.inf, lo), np.where(over, np.inf, hi)
        lo, hi = no_claim_where_nan(lo, hi, value)
    return lo, hi


def _to_output(self, lo, hi, F_acc, F_out):
    """Round an accumulator's bounds into the output format (or only apply its overflow)."""
    if F_out.name != F_acc.name:
        return round_bounds(lo, hi, F_out, self.accuracy("cast", F_out))
    if F_out.name != "float64":
        return overflow(lo, hi, F_out)
    return lo, hi


@rule("cumsum")
def _cumsum(self, prim, a, *, axis, dtype=None):
    v = self.value_of(prim, (a,), {"axis": axis, "dtype": dtype})
    lo, hi, u, pt = self.bounds(a)
    out_dt = np.asarray(concrete(v)).dtype
    F_out = self.fmt(out_dt)
    ax = axis % max(np.ndim(lo), 1)
    n = np.shape(lo)[ax] if np.ndim(lo) else 1
    with np.errstate(all="ignore"):
        mid, rad = (lo + hi) / 2, (hi - lo) / 2
        mag = np.maximum(np.abs(lo), np.abs(hi))
        c_mid = np.cumsum(mid, axis=ax)
        c_rad = np.cumsum(rad, axis=ax)
        c_mag = np.cumsum(mag, axis=ax)
        shape = [1] * np.ndim(lo)
        if shape:
            shape[ax] = n
        k = np.arange(1, n + 1, dtype=np.float64).reshape(shape)     # terms in each prefix
        g64 = gamma64(k)
        r = up(c_rad * (1 + g64) + g64 * c_mag + np.abs(c_mid) * 2 * E64, 4)
        if F_out is not None:
            Facc = self.resolve("cumsum", np.dtype(dtype) if dtype is not None else out_dt).accumulate
            d = acc_delta(self, "cumsum", Facc)
            note_long_sum(self, "cumsum", n, d, Facc)
            km1 = k - 1
            c = np.where(km1 * d < 1, km1 * d / (1 - km1 * d), np.inf) if self.bound == "rigorous" \
                else np.vectorize(lambda m: self.gamma(int(m), d))(km1)
            if self.bound == "rigorous":   # partial sums lie in [-N, P] (partial_sum_gamma)
                c_part = np.maximum(np.cumsum(np.maximum(hi, 0.0), axis=ax),
                                    np.cumsum(np.maximum(-lo, 0.0), axis=ax))
                r = r + up(c * np.minimum(c_mag, c_part) * (1 + g64), 4)
            else:
                r = r + up(c * c_mag * (1 + g64), 3)
        lo2, hi2 = widen(c_mid - r, c_mid + r, 1)
        if F_out is not None:   # the accumulator's overflow, then its rounding to the output
            lo2, hi2 = _acc_guard(lo2, hi2, c_mag, c, Facc, lambda: np.logical_or.accumulate(
                np.isnan(lo) | np.isnan(hi), axis=ax), concrete(v))
            lo2, hi2 = _to_output(self, lo2, hi2, Facc, F_out)
    if F_out is None:           # integers: exact, the enclosure tightened to the integers in it
        lo2, hi2 = self.integer_bounds("cumsum", out_dt, lo2, hi2)
    un = None if u is None else np.logical_or.accumulate(u, axis=ax)
    return self.new(v, lo2, hi2, un)


@rule("reduce_prod")
def _reduce_prod(self, prim, a, *, axis=None, keepdims=False, dtype=None):
    v = self.value_of(prim, (a,), {"axis": axis, "keepdims": keepdims, "dtype": dtype})
    lo, hi, u, _ = self.bounds(a)
    axes = axes_of(axis, np.ndim(lo))
    n = count(np.shape(lo), axis)
    # move reduced axes last and flatten them, then multiply intervals pairwise (tree)
    keep = [i for i in range(np.ndim(lo)) if i not in axes]
    L = np.transpose(lo, keep + list(axes)).reshape([np.shape(lo)[i] for i in keep] + [-1])
    H = np.transpose(hi, keep + list(axes)).reshape(L.shape)
    while L.shape[-1] > 1:
        if L.shape[-1] % 2:
            L = np.concatenate([L, np.ones(L.shape[:-1] + (1,))], -1)
            H = np.concatenate([H, np.ones(H.shape[:-1] + (1,))], -1)
        L, H = product_range(L[..., 0::2], H[..., 0::2], L[..., 1::2], H[..., 1::2])
    L, H = L[..., 0], H[..., 0]
    if keepdims:
        shp = [1 if i in axes else s for i, s in enumerate(np.shape(lo))]
        L, H = L.reshape(shp), H.reshape(shp)
    out_dt = np.asarray(concrete(v)).dtype
    F = self.fmt(out_dt)
    if F is not None:
        # each of the n - 1 multiplications (in the accumulator's format, any order) errs by
        # <= d·|p| + η; an absolute error η is then multiplied by the factors still to come,
        # whichever they are: by at most A = Π max(1, |x_i|) (an underflowed partial product
        # times large factors). Where A passes the accumulator's range, some order's partial
        # product overflows: ±inf with the product's sign, NaN if a factor may be 0 (0·inf).
        # Then the rounding into the output format.
        Facc = self.resolve("reduce_prod", out_dt).accumulate
        acc = self.accuracy("reduce_prod", Facc)
        g = self.gamma(max(n - 1, 0), acc_delta(self, "reduce_prod", Facc))
        eta = math.inf if acc.input_dependent else \
            acc.ulps * Facc.smallest_subnormal + acc.absolute
        with np.errstate(all="ignore"):
            mag = np.maximum(np.abs(L), np.abs(H))
            amp = np.prod(np.maximum(np.maximum(np.abs(lo), np.abs(hi)), 1.0), axis=axis,
                          keepdims=keepdims)
            e = up(g * mag, 2) + up(max(n - 1, 0) * eta * (1 + g) * amp, 4)
            L, H = widen(L - e, H + e, 1)
            over = up(amp, 1) > Facc.max
            if np.any(over):
                zero = np.any((lo <= 0) & (hi >= 0), axis=axis, keepdims=keepdims)
                L = np.where(over & zero, np.nan, np.where(over & (L < 0), -np.inf, L))
                H = np.where(over & zero, np.nan, np.where(over & (H > 0), np.inf, H))
            L, H = _to_output(self, L, H, Facc, F)
        L, H = no_claim_where_nan(L, H, concrete(v))       # 0·inf: NaN, not [-inf, inf]
    else:               # integers: exact, the enclosure tightened to the integers in it
        L, H = self.integer_bounds("reduce_prod", np.asarray(concrete(v)).dtype, L, H)
    un = None if u is None else np.any(u, axis=axis, keepdims=keepdims)
    return self.new(v, L, H, un)


@rule("reduce_max", "reduce_min")
def _reduce_maxmin(self, prim, a, *, axis=None, keepdims=False):
    v = self.value_of(prim, (a,), {"axis": axis, "keepdims": keepdims})
    lo, hi, u, pt = self.bounds(a)
    f = np.max if prim.name == "reduce_max" else np.min
    un = None if u is None else np.any(u, axis=axis, keepdims=keepdims)
    return self.new(v, f(lo, axis=axis, keepdims=keepdims), f(hi, axis=axis, keepdims=keepdims),
                    un, pt)


@rule("argmax", "argmin")
def _argmaxmin(self, prim, a, *, axis=None, keepdims=False):
    """The index bound spans every candidate: elements whose interval reaches the extremum's
    lower end (first to last candidate); unstable where there is more than one."""
    v = self.value_of(prim, (a,), {"axis": axis, "keepdims": keepdims})
    lo, hi, u, _ = self.bounds(a)
    if prim.name == "argmin":
        lo, hi = -hi, -lo
    L = lo.ravel() if axis is None else lo
    H = hi.ravel() if axis is None else hi
    ax = -1 if axis is None else axis
    with np.errstate(invalid="ignore"):
        cand = H >= np.max(L, axis=ax, keepdims=True)
    nan = np.any(np.isnan(L) | np.isnan(H), axis=ax, keepdims=keepdims)
    n = L.shape[ax] if np.ndim(L) else 1
    first = np.argmax(cand, axis=ax, keepdims=keepdims).astype(np.float64)
    last = (n - 1 - np.argmax(np.flip(cand, axis=ax), axis=ax, keepdims=keepdims)).astype(np.float64)
    first, last = np.where(nan, 0.0, first), np.where(nan, n - 1.0, last)
    unst = (first != last)
    un = or_unstable(None if u is None else np.any(u, axis=axis, keepdims=keepdims),
                      unst if np.any(unst) else None)
    return self.new(v, first, last, un)


@rule("sort")
def _sort(self, prim, a, *, axis):
    """Sorting is exact, and the k-th smallest element is nondecreasing in every input, so
    over a box it lies in [k-th smallest lo, k-th smallest hi]: the ends sorted separately.
    A row with a NaN end (an unknown element, anywhere in the order) is NaN throughout."""
    v = self.value_of(prim, (a,), {"axis": axis})
    lo, hi, u, pt = self.bounds(a)
    xp = xp_of(lo)
    slo, shi = xp.sort(lo, axis=axis), xp.sort(hi, axis=axis)
    nan = xp.any(xp.isnan(lo) | xp.isnan(hi), axis=axis, keepdims=True)
    if bool(xp.any(nan)):
        slo, shi = xp.where(nan, xp.nan, slo), xp.where(nan, xp.nan, shi)
    un = None if u is None else xp.broadcast_to(xp.any(u, axis=axis, keepdims=True), lo.shape)
    return self.new(v, slo, shi, un, pt)


@rule("argsort")
def _argsort(self, prim, a, *, axis):
    """The index at sorted position p is certain where the element the program put there is
    strictly above every element before it and strictly below every one after it, for every
    point of the box (the largest upper end before p below its lower end, the least lower end
    after p above its upper end; ties count as uncertain: implementations break them
    differently). Elsewhere the index may be any in [0, n - 1]: that range, unstable."""
    v = self.value_of(prim, (a,), {"axis": axis})
    lo, hi, u, _ = self.bounds(a)
    xp = xp_of(lo)
    idx = xp.asarray(concrete(v))
    n = lo.shape[axis]
    if lo.size == 0:
        return self.new(v, lo, hi, u)
    slo = xp.take_along_axis(lo, idx, axis=axis)
    shi = xp.take_along_axis(hi, idx, axis=axis)
    before = xp.maximum.accumulate(shi, axis=axis)          # max hi over positions <= p
    after = xp.flip(xp.minimum.accumulate(xp.flip(slo, axis), axis=axis), axis)
    pad_hi = xp.full_like(xp.take(before, xp.arange(1), axis=axis), -xp.inf)
    pad_lo = xp.full_like(xp.take(after, xp.arange(1), axis=axis), xp.inf)
    prev_hi = xp.concatenate([pad_hi, xp.take(before, xp.arange(n - 1), axis=axis)], axis)
    next_lo = xp.concatenate([xp.take(after, xp.arange(1, n), axis=axis), pad_lo], axis)
    certain = (prev_hi < slo) & (shi < next_lo)          # (NaN compares False: uncertain)
    ind = idx.astype(xp.float64)
    lo_i, hi_i = xp.where(certain, ind, 0.0), xp.where(certain, ind, n - 1.0)
    un = or_unstable(None if u is None else xp.broadcast_to(
        xp.any(u, axis=axis, keepdims=True), lo.shape),
        None if bool(xp.all(certain)) else ~certain)
    return self.new(v, lo_i, hi_i, un)


