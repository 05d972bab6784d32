"""The ``exact`` order: the exact sum of the terms rounded once, computed as a float64 sum in
any order (BLAS), a rigorous bound on its error, a rounding test, and MPFR's correctly
rounded sum (``mpfr_sum``) for the elements the test cannot decide."""
from __future__ import annotations

import math

import numpy as np

from fpx import formats

__all__ = ["round_or_fail", "gamma", "exact_fallback"]

_U = 2.0 ** -53


def gamma(K: int) -> float:
    """γ_K = K·u/(1 - K·u), inflated for the bound's own float64 evaluation: any float64
    sum of K terms is within γ_K·Σ|t| of the exact sum, whatever the order."""
    k = (K + 4) * _U
    return k / (1.0 - k) * (1.0 + 2.0 ** -40)


def round_or_fail(s, err, F):
    """(result in F's dtype, mask of undecided elements): where every real in
    ``[s - err, s + err]`` rounds to the same value of F, that value; elsewhere undecided
    (also where s or err is not finite)."""
    with np.errstate(all="ignore"):
        pad = err + np.abs(s) * 2.0 ** -52 + 2.0 ** -1074   # the ends' own rounding
        lo, hi = s - pad, s + pad
        if F.name == "float32":
            rl, rh = lo.astype(np.float32), hi.astype(np.float32)
        else:
            rl, rh = formats.round(lo, F, "rn"), formats.round(hi, F, "rn")
    u = {2: np.uint16, 4: np.uint32}[np.dtype(F.dtype).itemsize]
    bad = (rl.view(u) != rh.view(u)) | ~np.isfinite(s) | ~np.isfinite(pad)
    return rl, bad


def exact_fallback(term_rows, F):
    """The correctly rounded (into F) exact sum of each row of float64 terms (exact values):
    ``math.fsum`` (Shewchuk: within an ulp of the exact sum) where the rounding test decides
    from it, else MPFR's ``mpfr_sum`` at 2200 bits (exact for any finite float64 terms: their sum spans at
    most 2098 bits plus the carries), then one rounding into F's precision and exponent range,
    subnormals included; IEEE's rules for non-finite terms and for the sign of a zero sum."""
    import gmpy2
    ctx = gmpy2.context(precision=F.p, emin=F.emin - F.p + 2, emax=F.emax + 1,
                        subnormalize=True, round=gmpy2.RoundToNearest)
    wide = gmpy2.context(precision=2200, emin=-4000, emax=4000)
    out = np.empty(len(term_rows), np.float64)
    for i, row in enumerate(term_rows):
        if np.isnan(row).any() or (np.isposinf(row).any() and np.isneginf(row).any()):
            out[i] = np.nan
            continue
        if np.isfinite(row).all():        # first math.fsum: within 1 ulp of the exact sum
            s1 = math.fsum(row.tolist())
            if s1 != 0 and math.isfinite(s1):
                r, bad = round_or_fail(np.array([s1]), np.array([abs(s1) * 2.0 ** -52]), F)
                if not bad[0]:
                    out[i] = r[0]
                    continue
        with gmpy2.context(wide):
            s = gmpy2.fsum(gmpy2.mpfr(float(t), 53) for t in row)
        with gmpy2.context(ctx):
            out[i] = float(+s)
    return out.astype(F.dtype)
