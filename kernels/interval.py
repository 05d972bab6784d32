"""Fused one-pass kernels for ``fpx.interval`` (numba ``vectorize``, IEEE round-to-nearest:
no fastmath, so no reassociation).

NumPy needs ~12 passes (and as many multi-MB temporaries) to widen a pair of bounds, add a
rounding error and map overflow to infinity; these do it in one pass per bound.

* ``down(x, rel, absl, top)`` = ``x - (min(|x|, MAX)·rel + absl)``, and ``-inf`` below
  ``-top``; ``up`` mirrors it. With ``rel`` including ``4·2^-52`` and ``absl`` including
  ``2^-1074`` the float64 rounding of these steps themselves is covered (see
  ``fpx.interval._round_bounds``). NaN passes through.
* ``scale_up(x, f, a)``: an upper bound of ``x·f + a`` for ``x >= 0``.
* ``mm_left(v, lo, hi, c2)``: the left GEMM factor ``L = c2·(|v| + r) + r`` of the
  value-centred matmul radius, ``r = max(v - lo, hi - v)``, rounded up and returned as a
  float32 that is >= L (bumped by ``2^-23`` relative and ``2^-149`` before conversion);
  NaN bounds give NaN.
* ``center_down/center_up(c, rad, top)``: ``c ∓ (rad·(1+8ε) + |c|·8ε + 2^-1074)`` with overflow.
"""
from __future__ import annotations

import math

import numba
import numpy as np

_E = 2.0 ** -52
_TINY = 5e-324
_MAX = 1.7976931348623157e308
_SIGS2 = ["float64(float64, float64, float64, float64)"]


@numba.vectorize(_SIGS2, cache=True)
def down(x, rel, absl, top):
    d = min(abs(x), _MAX) * rel + absl
    y = x - d
    if y < -top:
        return -math.inf
    return y


@numba.vectorize(_SIGS2, cache=True)
def up(x, rel, absl, top):
    d = min(abs(x), _MAX) * rel + absl
    y = x + d
    if y > top:
        return math.inf
    return y


@numba.vectorize(["float64(float64, float64, float64)", "float64(float32, float64, float64)"],
                 cache=True)
def scale_up(x, f, a):
    return (x * f + a) * (1.0 + 4 * _E) + _TINY


@numba.vectorize(["float32(float32, float64, float64, float64)",
                  "float32(float64, float64, float64, float64)"], cache=True)
def mm_left(v, lo, hi, c2):
    vv = np.float64(v)
    r1, r2 = vv - lo, hi - vv
    if math.isnan(r1) or math.isnan(r2):   # unknown bounds stay unknown (max would drop NaN)
        return np.float32(math.nan)
    r = (r1 if r1 > r2 else r2) * (1.0 + 3 * _E) + _TINY
    ah = (abs(vv) + r) * (1.0 + 3 * _E) + _TINY
    L = (c2 * ah + r) * (1.0 + 5 * _E) + _TINY
    return np.float32(L * (1.0 + 2.0 ** -23) + 2.0 ** -149)


@numba.vectorize(["float64(float32, float64, float64)", "float64(float64, float64, float64)"],
                 cache=True)
def center_down(c, rad, top):
    cc = np.float64(c)
    y = cc - (rad * (1.0 + 8 * _E) + min(abs(cc), _MAX) * (8 * _E) + _TINY)
    if y < -top:
        return -math.inf
    return y


@numba.vectorize(["float64(float32, float64, float64)", "float64(float64, float64, float64)"],
                 cache=True)
def center_up(c, rad, top):
    cc = np.float64(c)
    y = cc + (rad * (1.0 + 8 * _E) + min(abs(cc), _MAX) * (8 * _E) + _TINY)
    if y > top:
        return math.inf
    return y


@numba.njit(cache=True)
def _mm_stats(v, lo, hi):
    s_r = 0.0
    s_a = 0.0
    m_a = 0.0
    for i in range(v.size):
        vv = np.float64(v[i])
        r1, r2 = vv - lo[i], hi[i] - vv
        if math.isnan(r1) or math.isnan(r2):
            return math.nan, math.nan, math.nan
        r = r1 if r1 > r2 else r2
        a = abs(vv) + r
        s_r += r
        s_a += a
        if a > m_a:
            m_a = a
    return s_r, s_a, m_a


def mm_stats(v, lo, hi):
    """(Σr, Σ(|v|+r), max(|v|+r)) with r = max(v - lo, hi - v), in one pass (NaN if any bound
    is NaN). Float64 sums of nonnegative terms: relative error <= n·2^-53; callers use them
    for a heuristic and, with margin, for an overflow screen."""
    v, lo, hi = (np.ascontiguousarray(x).reshape(-1) for x in np.broadcast_arrays(v, lo, hi))
    return _mm_stats(v, lo, hi)
