"""RENDER-style per-element interval matmul bound: the baseline of `benchmarks/interval.py`.

Our reconstruction of the elementwise bound of RENDER's Algorithm 1 (Zhan et al., "When AllClose
Fails", 2025) -- the authors' code is not available to us: for every output element a scalar
loop over k does interval multiply-accumulate on the endpoints and accumulates
``S = Σ_k max|a_ik|·max|b_kj|``; the result is widened by ``γ_K·S`` with u taken from the
*operands'* precision. O(m·n·k) scalar work (numba, parallel over rows). It keeps RENDER's
flaws on purpose -- operand instead of result precision, no float64 outward rounding -- so it
is a baseline, not a sound bound. ``parallel=False`` runs the same loops on one thread.
"""
from __future__ import annotations

import numba
import numpy as np


def _render2d_impl(alo, ahi, blo, bhi, g, out_lo, out_hi):
    m, k = alo.shape
    n = blo.shape[1]
    for i in numba.prange(m):
        for j in range(n):
            lo = 0.0
            hi = 0.0
            s = 0.0
            for t in range(k):
                p1 = alo[i, t] * blo[t, j]
                p2 = alo[i, t] * bhi[t, j]
                p3 = ahi[i, t] * blo[t, j]
                p4 = ahi[i, t] * bhi[t, j]
                lo += min(min(p1, p2), min(p3, p4))
                hi += max(max(p1, p2), max(p3, p4))
                s += max(abs(alo[i, t]), abs(ahi[i, t])) * max(abs(blo[t, j]), abs(bhi[t, j]))
            out_lo[i, j] = lo - g * s
            out_hi[i, j] = hi + g * s


# the same loop nest twice: one thread (as RENDER's interpreter runs it) and all cores
_render2d_serial = numba.njit(cache=True)(_render2d_impl)
_render2d_parallel = numba.njit(parallel=True, cache=True)(_render2d_impl)


def render_matmul(alo, ahi, blo, bhi, fmt, parallel=True):
    """RENDER-style bounds of [alo, ahi] @ [blo, bhi] (2-D, or batched over leading dims) with
    unit roundoff of format ``fmt``; ``parallel`` spreads rows over all cores (numba prange)."""
    kernel = _render2d_parallel if parallel else _render2d_serial
    alo, ahi, blo, bhi = (np.asarray(x, np.float64) for x in (alo, ahi, blo, bhi))
    sq_a, sq_b = alo.ndim == 1, blo.ndim == 1
    if sq_a:
        alo, ahi = alo[None, :], ahi[None, :]
    if sq_b:
        blo, bhi = blo[:, None], bhi[:, None]
    k = alo.shape[-1]
    u = 2.0 ** -fmt.p
    g = k * u / (1 - k * u)
    batch = np.broadcast_shapes(alo.shape[:-2], blo.shape[:-2])
    m, n = alo.shape[-2], blo.shape[-1]
    A_lo, A_hi = (np.broadcast_to(x, batch + x.shape[-2:]).reshape(-1, m, k) for x in (alo, ahi))
    B_lo, B_hi = (np.broadcast_to(x, batch + x.shape[-2:]).reshape(-1, k, n) for x in (blo, bhi))
    lo = np.empty((A_lo.shape[0], m, n))
    hi = np.empty_like(lo)
    for i in range(A_lo.shape[0]):
        kernel(np.ascontiguousarray(A_lo[i]), np.ascontiguousarray(A_hi[i]),
                  np.ascontiguousarray(B_lo[i]), np.ascontiguousarray(B_hi[i]), g, lo[i], hi[i])
    lo, hi = lo.reshape(batch + (m, n)), hi.reshape(batch + (m, n))
    if sq_a:
        lo, hi = lo[..., 0, :], hi[..., 0, :]
    if sq_b:
        lo, hi = lo[..., 0], hi[..., 0]
    return lo, hi
