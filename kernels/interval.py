"""Fused one-pass kernels for ``fpx.interval`` (numba loops, IEEE round-to-nearest: no
fastmath, so no reassociation).

NumPy needs ~12 passes (and as many multi-MB temporaries) to widen a pair of bounds, add a
rounding error and map overflow to infinity; these do it in one pass per bound.

* ``down(x, rel, absl, top)`` = ``x - (min(|x|, MAX)·rel + absl)``, and ``-inf`` below
  ``-top``; ``up`` mirrors it. With ``rel`` including ``4·2^-52`` and ``absl`` including
  ``2^-1074`` the float64 rounding of these steps themselves is covered (see
  ``fpx.interval._round_bounds``). NaN passes through.
* ``scale_up(x, f, a)``: an upper bound of ``x·f + a`` for ``x >= 0``.
* ``mm_left(v, lo, hi, c2, stats)``: the left GEMM factor ``L = c2·(|v| + r) + r`` of the
  value-centred matmul radius, ``r = max(v - lo, hi - v)``, rounded up and returned as a
  float32 that is >= L (bumped by ``2^-23`` relative, and at least the smallest normal
  2^-126: no subnormals, which are slow to make and to multiply); zero-width zeros give 0
  exactly, NaN bounds NaN.
* ``add_bounds(alo, ahi, blo, bhi, rel, absl, top)``: ``down(alo + blo)``, ``up(ahi + bhi)``
  in one pass (interval addition with its rounding; no temporaries).
* ``mul_bounds(alo, ahi, blo, bhi, rel, absl, top)``: the interval product (four corners)
  with its rounding in one pass.
* ``center_bounds(c, R, f, a, top)`` -> (lo, hi, n_bad): ``c ∓ (rad·(1+8ε) + |c|·8ε + 2^-1074)`` with
  ``rad = scale_up(R, f, a)`` computed on the fly (the GEMM radius needs no array of its own),
  overflow past ``top`` mapped to ∓inf; both bounds in one pass.

Each is one compiled loop over (rows, last axis) blocks of contiguous memory (the inner loop
vectorizes; a numba ``vectorize`` ufunc calls its scalar kernel per element and ran ~5x
slower). :func:`_flat` lays the operands out: arrays of the full shape in place, a bias row
as a row, scalars as scalars (numba compiles a specialization for each mix); anything else
is expanded once.
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import overload

_E = 2.0 ** -52
_TINY = 5e-324
_MAX = 1.7976931348623157e308


def _at(x, i, j):
    """``x[i, j]`` (a block), ``x[j]`` (a row repeated over the leading axes) or ``x`` (a
    scalar), resolved at compile time."""


@overload(_at, inline="always")
def _at_impl(x, i, j):
    if isinstance(x, types.Array) and x.ndim == 2:
        return lambda x, i, j: x[i, j]
    if isinstance(x, types.Array):
        return lambda x, i, j: x[j]
    return lambda x, i, j: x


def _flat(args, out_dtypes, outs=None):
    """Operands and outputs as (rows, cols) blocks, cols = the last axis: arrays of the full
    shape are used in place, a contiguous row broadcast over the leading axes (a bias) stays
    1-D, scalars and size-1 arrays become float64 scalars; anything else is expanded once.
    Outputs are allocated, or the given ``outs`` used where they are contiguous arrays of the
    result shape and dtype. Returns (operands, output blocks, shape, output arrays)."""
    shape = np.broadcast_shapes(*[np.shape(a) for a in args])
    cols = shape[-1] if shape else 1
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    flat = []
    for a in args:
        if isinstance(a, np.ndarray) and a.size != 1:
            if a.shape == shape and a.flags.c_contiguous:
                flat.append(a.reshape(rows, cols))
            elif a.size == cols and a.shape[-1] == cols and a.flags.c_contiguous:
                flat.append(a.reshape(cols))
            else:
                flat.append(np.ascontiguousarray(np.broadcast_to(a, shape)).reshape(rows, cols))
        elif isinstance(a, (np.ndarray, np.generic, float, int)):
            flat.append(float(np.asarray(a).reshape(-1)[0]))
        else:
            raise TypeError(f"fpx.kernels.interval: unsupported operand {type(a).__name__} "
                            "(NumPy arrays and scalars only)")
    res = []
    for k, dt in enumerate(out_dtypes):
        o = None if outs is None else outs[k]
        if not (isinstance(o, np.ndarray) and o.shape == shape and o.dtype == dt
                and o.flags.c_contiguous and o.flags.writeable):
            o = np.empty(shape, dt)
        res.append(o)
    return flat, [o.reshape(rows, cols) for o in res], shape, res


def _result(o, shape):
    return o if shape else o[()]


@numba.njit(cache=True, error_model="numpy")
def _down_loop(x, rel, absl, top, out):
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            v = np.float64(_at(x, i, j))
            y = v - (min(abs(v), _MAX) * _at(rel, i, j) + _at(absl, i, j))
            out[i, j] = -math.inf if y < -top else y


@numba.njit(cache=True, error_model="numpy")
def _up_loop(x, rel, absl, top, out):
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            v = np.float64(_at(x, i, j))
            y = v + (min(abs(v), _MAX) * _at(rel, i, j) + _at(absl, i, j))
            out[i, j] = math.inf if y > top else y


def down(x, rel, absl, top, out=None):
    (x, rel, absl), (o,), shape, (res,) = _flat((x, rel, absl), (np.float64,),
                                                None if out is None else (out,))
    _down_loop(x, rel, absl, float(top), o)
    return _result(res, shape)


def up(x, rel, absl, top, out=None):
    (x, rel, absl), (o,), shape, (res,) = _flat((x, rel, absl), (np.float64,),
                                                None if out is None else (out,))
    _up_loop(x, rel, absl, float(top), o)
    return _result(res, shape)


@numba.njit(cache=True, error_model="numpy")
def _add_loop(alo, ahi, blo, bhi, rel, absl, top, lo, hi):
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            y = np.float64(_at(alo, i, j)) + np.float64(_at(blo, i, j))
            y = y - (min(abs(y), _MAX) * _at(rel, i, j) + _at(absl, i, j))
            lo[i, j] = -math.inf if y < -top else y
            y = np.float64(_at(ahi, i, j)) + np.float64(_at(bhi, i, j))
            y = y + (min(abs(y), _MAX) * _at(rel, i, j) + _at(absl, i, j))
            hi[i, j] = math.inf if y > top else y


def add_bounds(alo, ahi, blo, bhi, rel, absl, top):
    """``down(alo + blo, ...)``, ``up(ahi + bhi, ...)`` in one pass (``rel`` must cover the
    float64 addition's rounding too)."""
    (alo, ahi, blo, bhi, rel, absl), (lo, hi), shape, (rlo, rhi) = _flat(
        (alo, ahi, blo, bhi, rel, absl), (np.float64, np.float64))
    _add_loop(alo, ahi, blo, bhi, rel, absl, float(top), lo, hi)
    return _result(rlo, shape), _result(rhi, shape)


@numba.njit(cache=True, error_model="numpy")
def _mul_loop(alo, ahi, blo, bhi, rel, absl, top, lo, hi):
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            al, ah = np.float64(_at(alo, i, j)), np.float64(_at(ahi, i, j))
            bl, bh = np.float64(_at(blo, i, j)), np.float64(_at(bhi, i, j))
            c1, c2, c3, c4 = al * bl, al * bh, ah * bl, ah * bh
            l = min(min(c1, c2), min(c3, c4))
            h = max(max(c1, c2), max(c3, c4))
            if (c1 != c1) | (c2 != c2) | (c3 != c3) | (c4 != c4):
                if (al != al) | (ah != ah) | (bl != bl) | (bh != bh):
                    l = math.nan
                    h = math.nan
                else:            # 0 * inf: the set {a*b} is still well defined, unbounded
                    l = -math.inf
                    h = math.inf
            r, a = _at(rel, i, j), _at(absl, i, j)
            y = l - (min(abs(l), _MAX) * r + a)
            lo[i, j] = -math.inf if y < -top else y
            z = h + (min(abs(h), _MAX) * r + a)
            hi[i, j] = math.inf if z > top else z


def mul_bounds(alo, ahi, blo, bhi, rel, absl, top):
    """Interval product (min/max of the four corner products; NaN operands give NaN, a
    ``0·inf`` corner with no NaN operand gives [-inf, inf]) widened by ``rel``/``absl`` (which
    must cover the float64 product's rounding too), overflow past ``top`` to ±inf; one pass."""
    (alo, ahi, blo, bhi, rel, absl), (lo, hi), shape, (rlo, rhi) = _flat(
        (alo, ahi, blo, bhi, rel, absl), (np.float64, np.float64))
    _mul_loop(alo, ahi, blo, bhi, rel, absl, float(top), lo, hi)
    return _result(rlo, shape), _result(rhi, shape)


@numba.njit(cache=True, error_model="numpy")
def _scale_up_loop(x, f, a, out):
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = (np.float64(_at(x, i, j)) * _at(f, i, j) + _at(a, i, j)) \
                * (1.0 + 4 * _E) + _TINY


def scale_up(x, f, a):
    (x, f, a), (o,), shape, (res,) = _flat((x, f, a), (np.float64,))
    _scale_up_loop(x, f, a, o)
    return _result(res, shape)


@numba.njit(cache=True, error_model="numpy")
def _mm_left_loop(v, lo, hi, c2, out):
    n_nan = 0
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):     # branch-free: the loop vectorizes
            vv = np.float64(_at(v, i, j))
            r1, r2 = vv - _at(lo, i, j), _at(hi, i, j) - vv
            nan = (r1 != r1) | (r2 != r2)
            n_nan += nan
            r0 = r1 if r1 > r2 else r2
            r = r0 * (1.0 + 3 * _E) + _TINY
            ah = (abs(vv) + r) * (1.0 + 3 * _E) + _TINY
            L = (c2 * ah + r) * (1.0 + 5 * _E) + _TINY
            # a normal float32 >= L: round-to-nearest loses < 2^-24 relative above 2^-126;
            # below, 2^-126 itself (subnormal results cost a microcode assist per element)
            Lb = L * (1.0 + 2.0 ** -23)
            Lb = Lb if Lb > 2.0 ** -126 else 2.0 ** -126
            Lb = 0.0 if (vv == 0.0) & (r0 == 0.0) else Lb   # zero-width zeros (ReLU): L = 0
            out[i, j] = np.float32(math.nan if nan else Lb)
    return n_nan


@numba.njit(cache=True, error_model="numpy")
def _mm_sample_sums(v, lo, hi, step):
    s_r = 0.0
    s_a = 0.0
    for i in range(0, v.shape[0], step):
        for j in range(v.shape[1]):
            vv = np.float64(v[i, j])
            r1, r2 = vv - lo[i, j], hi[i, j] - vv
            r = r1 if r1 > r2 else r2
            s_r += r
            s_a += abs(vv) + r
    return s_r, s_a


def mm_left(v, lo, hi, c2, stats=False):
    """L (see above). With ``stats`` also (Σr, Σ(|v|+r), M): the sums over an even sample of
    at most 32 rows (they feed a heuristic), and ``M >= max(|v| + r)`` (for the overflow
    screen: ``max(L)/c2``, as L >= c2·(|v| + r)); all NaN if any bound is NaN."""
    args, (o,), shape, (res,) = _flat((v, lo, hi), (np.float32,))
    n_nan = _mm_left_loop(*args, float(c2), o)
    L = _result(res, shape)
    if not stats:
        return L
    if n_nan:
        return L, (math.nan, math.nan, math.nan)
    v2, lo2, hi2 = (np.broadcast_to(x, shape).reshape(o.shape) for x in (v, lo, hi))
    s_r, s_a = _mm_sample_sums(v2, lo2, hi2, max(1, o.shape[0] // 32))
    if c2 > 0:
        m = float(o.max()) / c2 * (1.0 + 4 * _E) if o.size else 0.0
    else:
        vv = np.asarray(v, np.float64)
        m = float(np.max(np.abs(vv) + np.maximum(vv - lo, hi - vv))) if o.size else 0.0
    return L, (s_r, s_a, m)


@numba.njit(cache=True, error_model="numpy")
def _mm_right_loop(v, lo, hi, bh, rb):
    n_nan = 0
    m = 0.0
    for i in range(bh.shape[0]):
        for j in range(bh.shape[1]):
            vv = np.float64(_at(v, i, j))
            r1, r2 = vv - _at(lo, i, j), _at(hi, i, j) - vv
            n_nan += (r1 != r1) | (r2 != r2)
            r0 = r1 if r1 > r2 else r2
            r = r0 * (1.0 + 3 * _E) + _TINY
            a = (abs(vv) + r) * (1.0 + 3 * _E) + _TINY
            m = a if a > m else m
            rb[i, j] = _f32_up(r)
            bh[i, j] = _f32_up(a)
    return n_nan, m


@numba.njit(inline="always")
def _f32_up(x):
    """A normal float32 >= x > 0 (round-to-nearest loses < 2^-24 relative above 2^-126)."""
    y = x * (1.0 + 2.0 ** -23)
    return np.float32(y if y > 2.0 ** -126 else 2.0 ** -126)


def mm_right(v, lo, hi):
    """For an interval right operand of a value-centred matmul, in one pass: ``B̂ >= |v| + r``
    and ``r_B >= r`` as float32 upper bounds (r = max(v - lo, hi - v)), and the stats
    (Σr, Σ(|v|+r), max(|v|+r)) as mm_left's (NaN if a bound is NaN)."""
    args, (bh, rb), shape, (rbh, rrb) = _flat((v, lo, hi), (np.float32, np.float32))
    n_nan, m = _mm_right_loop(*args, bh, rb)
    if n_nan:
        return _result(rbh, shape), _result(rrb, shape), (math.nan, math.nan, math.nan)
    v2, lo2, hi2 = (np.broadcast_to(x, shape).reshape(bh.shape) for x in (v, lo, hi))
    s_r, s_a = _mm_sample_sums(v2, lo2, hi2, max(1, bh.shape[0] // 32))
    return _result(rbh, shape), _result(rrb, shape), (s_r, s_a, m)


@numba.njit(cache=True, error_model="numpy")
def _center_loop(c, R, f, a, top, lo, hi):
    n_bad = 0
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            cc = np.float64(_at(c, i, j))
            rad = (np.float64(_at(R, i, j)) * _at(f, i, j) + _at(a, i, j)) * (1.0 + 4 * _E) \
                + _TINY
            d = rad * (1.0 + 8 * _E) + min(abs(cc), _MAX) * (8 * _E) + _TINY
            y = cc - d
            lo[i, j] = -math.inf if y < -top else y
            z = cc + d
            hi[i, j] = math.inf if z > top else z
            n_bad += (abs(cc) == math.inf) | (cc != cc) | (y != y) | (z != z)
    return n_bad


def center_bounds(c, R, f, a, top):
    """(lo, hi, n_bad): ``c ∓ (rad·(1+8ε) + |c|·8ε + 2^-1074)``, ``rad >= R·f + a`` (see
    above); ``n_bad`` counts elements with a non-finite centre or a NaN bound."""
    (c, R, f, a), (lo, hi), shape, (rlo, rhi) = _flat((c, R, f, a), (np.float64, np.float64))
    n_bad = _center_loop(c, R, f, a, float(top), lo, hi)
    return _result(rlo, shape), _result(rhi, shape), n_bad


@numba.njit(inline="always")
def _nmax(a, b):
    """max that propagates NaN (np.maximum)."""
    return a if (a > b or a != a) else b


@numba.njit(inline="always")
def _nmin(a, b):
    """min that propagates NaN (np.minimum)."""
    return a if (a < b or a != a) else b


@numba.njit(cache=True, error_model="numpy")
def _softmax_shift(lo, hi, r_s, a_s, k, dl, dh):
    """Per row: the input box widened by the subtraction's rounding, minus its largest upper
    end (dl <= dh <= 0, the arguments of the exps)."""
    rows, n = lo.shape
    for i in range(rows):
        mlo = -math.inf
        mhi = -math.inf
        for j in range(n):
            mlo = _nmax(mlo, lo[i, j])
            mhi = _nmax(mhi, hi[i, j])
        m = -math.inf
        for j in range(n):
            dist = _nmax(abs(lo[i, j] - mhi), abs(hi[i, j] - mlo))
            pert = (r_s * dist + a_s) * (1 + k)
            a, b = lo[i, j] - pert, hi[i, j] + pert
            dl[i, j] = a - k * abs(a) - _TINY
            dh[i, j] = b + k * abs(b) + _TINY
            m = _nmax(m, dh[i, j])
        for j in range(n):
            dl[i, j] -= m
            dh[i, j] -= m


@numba.njit(cache=True, error_model="numpy")
def _softmax_rows(dl, dh, el, eh, r_e, a_e, r_d, a_d, dlow, dhigh, g64, k, libm, ylo, yhi):
    """Per row, from the exps el = exp(dl), eh = exp(dh) (NumPy's SIMD exp): the exact softmax
    range over the box with outward allowances, then the evaluation's errors."""
    rows, n = dl.shape
    for i in range(rows):
        sl = 0.0
        sh = 0.0
        for j in range(n):
            el[i, j] *= 1 - (libm + 4 + abs(dl[i, j])) * _E
            eh[i, j] *= 1 + (libm + 4 + abs(dh[i, j])) * _E
            sl += el[i, j]
            sh += eh[i, j]
        sh = sh * (1 + g64)
        sl = sl * (1 - g64)
        for j in range(n):
            e_l, e_h = el[i, j], eh[i, j]
            others_hi = (sh - e_h) * (1 + 2 * _E)
            others_lo = _nmax((sl - e_l) * (1 - 2 * _E), 0.0)
            plo = _nmax(e_l / (e_l + others_hi) * (1 - 4 * _E), 0.0)
            phi = _nmin(e_h / (e_h + others_lo) * (1 + 4 * _E), 1.0)
            plo = plo if e_l > 0 else 0.0
            nl = plo * (1 - r_e) - a_e
            nh = phi * (1 + r_e) + a_e
            qlo = nl / dhigh if nl >= 0 else nl / dlow
            qhi = nh / dlow
            ylo[i, j] = (qlo * (1 - r_d) - a_d) * (1 - k) - abs(qlo) * k - _TINY
            yhi[i, j] = (qhi * (1 + r_d) + a_d) * (1 + k) + _TINY


def softmax_bounds(lo, hi, r_s, a_s, k, r_e, a_e, r_d, a_d, dlow, dhigh, g64, libm):
    """fpx.interval's softmax rule (see its docstring for the derivation) along the last axis:
    two compiled row passes around NumPy's vectorized exp (the NumPy spelling made ~35 passes
    over the whole block; a scalar exp per element in the loop was slower still)."""
    shape = lo.shape
    lo2 = np.ascontiguousarray(lo, np.float64).reshape(-1, shape[-1])
    hi2 = np.ascontiguousarray(hi, np.float64).reshape(-1, shape[-1])
    dl, dh = np.empty(lo2.shape), np.empty(lo2.shape)
    _softmax_shift(lo2, hi2, float(r_s), float(a_s), float(k), dl, dh)
    el, eh = np.exp(dl), np.exp(dh)
    ylo, yhi = np.empty(lo2.shape), np.empty(lo2.shape)
    _softmax_rows(dl, dh, el, eh, float(r_e), float(a_e), float(r_d), float(a_d), float(dlow),
                  float(dhigh), float(g64), float(k), float(libm), ylo, yhi)
    return ylo.reshape(shape), yhi.reshape(shape)
