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
  float32 that is >= L (bumped by ``2^-23`` relative, and at least ``F32_FLOOR`` = 2^-102:
  no subnormal operands or products in the radius GEMM, which cost Intel cores a microcode
  assist per multiply); zero-width zeros give 0 exactly, NaN bounds NaN. No step multiplies a
  value that may be subnormal (the ``2^-1074`` terms are left out where they are not needed).
  ``with_abs``: also |v| (float32) from the same pass, interval @ interval's other factor.
* ``add_bounds(alo, ahi, blo, bhi, rel, absl, top)``: ``down(alo + blo)``, ``up(ahi + bhi)``
  in one pass (interval addition with its rounding; no temporaries).
* ``mul_bounds(alo, ahi, blo, bhi, rel, absl, top)``: the interval product (four corners)
  with its rounding in one pass.
* ``affine_bounds(xlo, xhi, slo, shi, tlo, thi, r1, a1, r2, a2, top)``: ``mul_bounds``
  then ``add_bounds``, one pass (a batch norm's per-channel scale and shift).
* ``center_bounds(c, R, f, a, top, b)`` -> (lo, hi, n_bad): ``c ∓ (rad·(1+8ε) + |c|·(b+8ε) +
  2^-1074)`` with ``rad = scale_up(R, f, a)`` computed on the fly (the GEMM radius needs no array of its own),
  overflow past ``top`` mapped to ∓inf; both bounds in one pass.
* ``split_center_bounds(parts, c3, R, f, a, top, b, sb, f_cap)``: the same around a centre
  given in parts (a split-K GEMM's 2 or 4 float32 blocks and a bias), plus ``sb·Σ|c_i|``;
  ``split_ball``: a float32 radius about the program's value that covers them.
* ``*_centred`` (``mm_left_centred``, ``mm_right_centred``, ``softmax_bounds_centred``): a
  consumer's pass over pending ``center_bounds`` computed on the fly, bit for bit the two
  passes, without writing the bounds.

Each is one compiled loop over (rows, last axis) blocks of contiguous memory (the inner loop
vectorizes; a numba ``vectorize`` ufunc calls its scalar kernel per element and ran ~5x
slower). :func:`_flat` lays the operands out: arrays of the full shape in place, a bias row
as a row, scalars as scalars (numba compiles a specialization for each mix); anything else
is expanded once -- except two layouts that would otherwise be copied: operands that are all
one permutation of a dense block (attention's head-split and transposed activations) run in
memory order, outputs in the same layout; operands constant along trailing dims (a per-channel
``(1, C, 1, 1)`` scale) become per-row columns of a (N·C, H·W) split, read once per row (as
stride-0 rows they had kept the inner loop from vectorizing: a per-channel product ran 4.7x
slower than a full-shaped one).
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import overload

from fpx.kernels.bf16 import _bf16_up, aligned_empty
from fpx.kernels.bf16 import to_float as _bf16_to_float


_E = 2.0 ** -52
_TINY = 5e-324
_MAX = 1.7976931348623157e308


def _at(x, i, j):
    """``x[i, j]`` (a 2-D block), ``x[j]`` (a 1-D row repeated over the leading axes),
    ``x[i]`` (a per-row column, passed as a 3-D (rows, 1, 1) array) or ``x`` (a scalar),
    resolved at compile time: the inner loop sees a constant per row and vectorizes."""


@overload(_at, inline="always")
def _at_impl(x, i, j):
    if isinstance(x, types.Array) and x.ndim == 2:
        return lambda x, i, j: x[i, j]
    if isinstance(x, types.Array) and x.ndim == 3:
        return lambda x, i, j: x[i, 0, 0]
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
    perm = _common_layout(args, shape)
    if perm is not None:      # every array operand: one permutation of a dense block
        pshape = tuple(shape[p] for p in perm)
        cols, rows = pshape[-1], int(np.prod(pshape[:-1]))
        flat = [np.transpose(a, perm).reshape(rows, cols) if isinstance(a, np.ndarray)
                and a.size != 1 else float(np.asarray(a).reshape(-1)[0]) for a in args]
        inv = tuple(np.argsort(perm))
        res = []
        for k, dt in enumerate(out_dtypes):
            o = None if outs is None else outs[k]
            if not (isinstance(o, np.ndarray) and o.shape == shape and o.dtype == dt
                    and o.flags.writeable and np.transpose(o, perm).flags.c_contiguous):
                o = _empty(pshape, dt).transpose(inv)
            res.append(o)
        return flat, [np.transpose(o, perm).reshape(rows, cols) for o in res], shape, res
    per_row = _per_row_split(args, shape)
    if per_row is not None:   # per-channel operands: constant over the trailing dims
        rows, cols, lead = per_row
        flat = []
        for a in args:
            if isinstance(a, np.ndarray) and a.size != 1 and a.shape != shape:
                a = np.reshape(a, (1,) * (len(shape) - a.ndim) + a.shape)
                vec = np.ascontiguousarray(np.broadcast_to(
                    a.reshape(a.shape[:len(lead)]), lead)).reshape(rows)
                flat.append(vec.reshape(rows, 1, 1))   # a per-row column (see _at)
            elif isinstance(a, np.ndarray) and a.size != 1:
                flat.append(a.reshape(rows, cols))
            else:
                flat.append(float(np.asarray(a).reshape(-1)[0]))
        res = [_empty(shape, dt) for dt in out_dtypes]
        if outs is not None:
            res = [o if isinstance(o, np.ndarray) and o.shape == shape and o.dtype == dt
                   and o.flags.c_contiguous and o.flags.writeable else r
                   for o, r, dt in zip(outs, res, out_dtypes)]
        return flat, [o.reshape(rows, cols) for o in res], shape, res
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
            o = _empty(shape, dt)
        res.append(o)
    return flat, [o.reshape(rows, cols) for o in res], shape, res


def _empty(shape, dt):
    """An output array: bfloat16 bits (a left factor for oneDNN's bfloat16 GEMM) on a 64-byte
    boundary (``aligned_empty``), anything else as NumPy allocates it (aligned float64
    outputs gained nothing, and a ResNet block's bound was ~5% slower in a one-process
    A/B)."""
    return aligned_empty(shape, dt) if np.dtype(dt) == np.uint16 else np.empty(shape, dt)


def _common_layout(args, shape):
    """The axis order (outermost first) in which every array operand of ``args`` is a
    C-contiguous block, when they all have the full ``shape`` and are not plain C-contiguous
    already (a transposed or head-split activation in attention): the kernels then run over
    memory in order and their outputs take the same layout. None otherwise."""
    arrs = [a for a in args if isinstance(a, np.ndarray) and a.size != 1]
    if not arrs or len(shape) < 2 or any(a.shape != shape for a in arrs) \
            or all(a.flags.c_contiguous for a in arrs):
        return None
    perm = tuple(int(p) for p in np.argsort([-s for s in arrs[0].strides], kind="stable"))
    if all(np.transpose(a, perm).flags.c_contiguous for a in arrs):
        return perm
    return None


def _per_row_split(args, shape):
    """(rows, cols, leading shape) that make every smaller array operand constant along each
    row -- a per-channel scale (1, C, 1, 1) of an (N, C, H, W) block: cols = H·W, leading
    (N, C) -- when the last-axis layout would expand one to the full shape; the full-shape
    operands must be C-contiguous. None otherwise."""
    nd = len(shape)
    small = [a for a in args if isinstance(a, np.ndarray) and a.size != 1 and a.shape != shape]
    full = [a for a in args if isinstance(a, np.ndarray) and a.size != 1 and a.shape == shape]
    if nd < 2 or not small or not all(a.flags.c_contiguous for a in full):
        return None
    if all(a.size == shape[-1] and a.shape[-1] == shape[-1] and a.flags.c_contiguous
           for a in small):
        return None                               # bias rows: the last-axis layout has them
    t = 0
    while t < nd - 1 and all(((1,) * (nd - a.ndim) + a.shape)[nd - 1 - t] == 1 for a in small):
        t += 1
    cols = int(np.prod(shape[nd - t:])) if t else 0
    if cols < 4:
        return None
    return int(np.prod(shape[:nd - t])), cols, shape[:nd - t]


def _result(o, shape):
    return o if shape else o[()]


@numba.njit(cache=True, error_model="numpy")
def _down_loop(x, rel, absl, top, out):
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = _lower(np.float64(_at(x, i, j)), _at(rel, i, j), _at(absl, i, j), top)


@numba.njit(cache=True, error_model="numpy")
def _up_loop(x, rel, absl, top, out):
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = _upper(np.float64(_at(x, i, j)), _at(rel, i, j), _at(absl, i, j), top)


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


@numba.njit(inline="always", error_model="numpy")
def _lower(y, r, a, top):
    """``y`` widened down by ``|y|·r + a``; ``-inf`` below ``-top`` (NaN passes). ``|y|`` is
    taken as at least 2^-968 (``_mag``)."""
    y = y - (_mag(y) * r + a)
    return -math.inf if y < -top else y


@numba.njit(inline="always", error_model="numpy")
def _upper(y, r, a, top):
    y = y + (_mag(y) * r + a)
    return math.inf if y > top else y


@numba.njit(inline="always", error_model="numpy")
def _mag(y):
    """``|y|`` for a relative widening ``|y|·r``: at most the largest float64, at least
    2^-968, so the product stays normal for r >= 2^-52 -- a subnormal factor or product
    costs Intel cores a microcode assist (~150 cycles) per multiply, and an exact zero
    widened by 2^-1074 would be one in every later step. At most 2^-968·r more width."""
    return min(max(abs(y), 2.0 ** -968), _MAX)


@numba.njit(inline="always", error_model="numpy")
def _mul_range(al, ah, bl, bh):
    """(min, max) of the four corner products; NaN operands give NaN, a ``0·inf`` corner
    with no NaN operand gives (-inf, inf)."""
    c1, c2, c3, c4 = al * bl, al * bh, ah * bl, ah * bh
    lo = min(min(c1, c2), min(c3, c4))
    hi = max(max(c1, c2), max(c3, c4))
    bad = (c1 != c1) | (c2 != c2) | (c3 != c3) | (c4 != c4)
    nan_in = (al != al) | (ah != ah) | (bl != bl) | (bh != bh)
    # selects, not branches: the loops calling this vectorize
    lo = (math.nan if nan_in else -math.inf) if bad else lo
    hi = (math.nan if nan_in else math.inf) if bad else hi
    return lo, hi


@numba.njit(inline="always", error_model="numpy")
def _add_rounded(al, ah, bl, bh, r, a, top):
    """[al + bl, ah + bh] widened by ``|y|·r + a``."""
    return _lower(al + bl, r, a, top), _upper(ah + bh, r, a, top)


@numba.njit(inline="always")
def _at_least(y, c):
    """np.maximum(y, c) for float64 y and a non-NaN c: y where y >= c or y is NaN (a -0.0
    against 0.0 stays -0.0, as NumPy's maximum keeps its first operand on ties)."""
    return y if (y >= c) | (y != y) else c


@numba.njit(cache=True, error_model="numpy")
def _add_loop(alo, ahi, blo, bhi, rel, absl, top, floor, lo, hi):
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            l, h = _add_rounded(
                np.float64(_at(alo, i, j)), np.float64(_at(ahi, i, j)),
                np.float64(_at(blo, i, j)), np.float64(_at(bhi, i, j)),
                _at(rel, i, j), _at(absl, i, j), top)
            lo[i, j], hi[i, j] = _at_least(l, floor), _at_least(h, floor)


def add_bounds(alo, ahi, blo, bhi, rel, absl, top, floor=-math.inf):
    """``down(alo + blo, ...)``, ``up(ahi + bhi, ...)`` in one pass (``rel`` must cover the
    float64 addition's rounding too); ``floor``: then ``np.maximum(·, floor)`` of both (a
    ReLU after the add: the max rule's bounds, without the intermediate arrays)."""
    (alo, ahi, blo, bhi, rel, absl), (lo, hi), shape, (rlo, rhi) = _flat(
        (alo, ahi, blo, bhi, rel, absl), (np.float64, np.float64))
    _add_loop(alo, ahi, blo, bhi, rel, absl, float(top), float(floor), lo, hi)
    return _result(rlo, shape), _result(rhi, shape)


@numba.njit(cache=True, error_model="numpy")
def _add_centred_loop(alo, ahi, c, R, f, a, cb, ctop, cfloor, rel, absl, top, floor, lo, hi):
    n_bad = 0
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            bl, bh, bad = _centred(np.float64(_at(c, i, j)), np.float64(_at(R, i, j)),
                                   _at(f, i, j), _at(a, i, j), cb, ctop, cfloor)
            l, h = _add_rounded(np.float64(_at(alo, i, j)), np.float64(_at(ahi, i, j)), bl, bh,
                                _at(rel, i, j), _at(absl, i, j), top)
            lo[i, j], hi[i, j] = _at_least(l, floor), _at_least(h, floor)
            n_bad += bad
    return n_bad


def add_bounds_centred(alo, ahi, c, R, f, a, ctop, b, cfloor, rel, absl, top,
                       floor=-math.inf):
    """``add_bounds(alo, ahi, lo_b, hi_b, rel, absl, top, floor)`` of the bounds
    ``(lo_b, hi_b) = center_bounds(c, R, f, a, ctop, b, cfloor)`` in one pass, bit for bit,
    without writing them (a GEMM's pending result plus a residual or a bias); returns (lo,
    hi, n_bad), n_bad as ``center_bounds``'."""
    (alo, ahi, c, R, f, a, rel, absl), (lo, hi), shape, (rlo, rhi) = _flat(
        (alo, ahi, c, R, f, a, rel, absl), (np.float64, np.float64))
    cb = (float(b) + 8 * _E) * (1.0 + 4 * _E)
    n_bad = _add_centred_loop(alo, ahi, c, R, f, a, cb, float(ctop), float(cfloor), rel, absl,
                              float(top), float(floor), lo, hi)
    return _result(rlo, shape), _result(rhi, shape), n_bad


@numba.njit(inline="always", error_model="numpy")
def _mul_rounded(al, ah, bl, bh, r, a, top):
    """The interval product widened by ``|y|·r + a`` (``_lower``/``_upper``)."""
    l, h = _mul_range(al, ah, bl, bh)
    return _lower(l, r, a, top), _upper(h, r, a, top)


@numba.njit(cache=True, error_model="numpy")
def _mul_loop(alo, ahi, blo, bhi, rel, absl, top, lo, hi):
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            lo[i, j], hi[i, j] = _mul_rounded(
                np.float64(_at(alo, i, j)), np.float64(_at(ahi, i, j)),
                np.float64(_at(blo, i, j)), np.float64(_at(bhi, i, j)),
                _at(rel, i, j), _at(absl, i, j), top)


def mul_bounds(alo, ahi, blo, bhi, rel, absl, top):
    """Interval product (min/max of the four corner products; NaN operands give NaN, a
    ``0·inf`` corner with no NaN operand gives [-inf, inf]) widened by ``rel``/``absl`` (which
    must cover the float64 product's rounding too), overflow past ``top`` to ±inf; one pass."""
    (alo, ahi, blo, bhi, rel, absl), (lo, hi), shape, (rlo, rhi) = _flat(
        (alo, ahi, blo, bhi, rel, absl), (np.float64, np.float64))
    _mul_loop(alo, ahi, blo, bhi, rel, absl, float(top), lo, hi)
    return _result(rlo, shape), _result(rhi, shape)


@numba.njit(cache=True, error_model="numpy")
def _affine_loop(xlo, xhi, slo, shi, tlo, thi, r1, a1, r2, a2, top, floor, lo, hi):
    # the product and sum from the mul and add loops' inline helpers (the same code, the same
    # speed: 0.99 ms per ResNet batch norm)
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            l, h = _mul_rounded(np.float64(_at(xlo, i, j)), np.float64(_at(xhi, i, j)),
                                np.float64(_at(slo, i, j)), np.float64(_at(shi, i, j)),
                                _at(r1, i, j), _at(a1, i, j), top)
            l, h = _add_rounded(l, h, np.float64(_at(tlo, i, j)), np.float64(_at(thi, i, j)),
                                _at(r2, i, j), _at(a2, i, j), top)
            lo[i, j], hi[i, j] = _at_least(l, floor), _at_least(h, floor)


def affine_bounds(xlo, xhi, slo, shi, tlo, thi, r1, a1, r2, a2, top, floor=-math.inf):
    """``mul_bounds`` of [xlo, xhi] by [slo, shi] (widened by r1/a1), then ``add_bounds`` of
    [tlo, thi] (r2/a2), in one pass -- the same float64 operations in the same order, so the
    same bounds bit for bit, without the intermediate arrays (a batch norm's x·alpha + beta,
    alpha and beta per channel). ``floor``: the bounds then ``np.maximum(·, floor)`` (a ReLU
    after the batch norm)."""
    ops, (lo, hi), shape, (rlo, rhi) = _flat((xlo, xhi, slo, shi, tlo, thi, r1, a1, r2, a2),
                                             (np.float64, np.float64))
    _affine_loop(*ops, float(top), float(floor), lo, hi)
    return _result(rlo, shape), _result(rhi, shape)


@numba.njit(cache=True, error_model="numpy")
def _affine_value_loop(v, s, t, vo):
    for i in range(vo.shape[0]):
        for j in range(vo.shape[1]):
            vo[i, j] = _at(v, i, j) * _at(s, i, j) + _at(t, i, j)     # in v's own format


def affine_values(v, s, t):
    """The program's own ``v·s + t`` (arrays of one float dtype, a batch norm's last step) in
    that dtype: two roundings as NumPy's two ufuncs (no FMA: numba contracts nothing without
    fastmath)."""
    (v, s, t), (vo,), shape, (rvo,) = _flat((v, s, t), (v.dtype,))
    _affine_value_loop(v, s, t, vo)
    return _result(rvo, shape)


@numba.njit(cache=True, error_model="numpy")
def _scale_up_loop(x, f, a, out):
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            v, aa = np.float64(_at(x, i, j)), _at(a, i, j)
            m = 2.0 ** -968 if (v > 0.0) & (v < 2.0 ** -968) else v   # no subnormal factor
            y = m * _at(f, i, j) + aa
            y = y + (_mag(y) * (4 * _E) + _TINY)      # two roundings (and an underflow) up
            out[i, j] = 0.0 if (v == 0.0) & (aa == 0.0) else y   # 0·f + 0 is exact


_SCALARS = (float, int, np.floating, np.integer)


def scale_up(x, f, a):
    if isinstance(x, _SCALARS) and isinstance(f, _SCALARS) and isinstance(a, _SCALARS):
        # the loop's arithmetic on Python floats (IEEE float64, round to nearest): the rules'
        # scalar constants took ~35 us each through the array path
        v, f, aa = float(x), float(f), float(a)
        if v == 0.0 and aa == 0.0:
            return np.float64(0.0)
        m = 2.0 ** -968 if 0.0 < v < 2.0 ** -968 else v
        y = m * f + aa
        return np.float64(y + (min(max(abs(y), 2.0 ** -968), _MAX) * (4 * _E) + _TINY))
    (x, f, a), (o,), shape, (res,) = _flat((x, f, a), (np.float64,))
    _scale_up_loop(x, f, a, o)
    return _result(res, shape)


@numba.njit(cache=True, error_model="numpy")
def _f32_upper_loop(x, out):
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            v = np.float64(_at(x, i, j))
            out[i, j] = np.float32(v) if (v == 0.0) | (v != v) else _f32_up(v)


def f32_upper(x):
    """A float32 array >= the nonnegative float64 ``x`` elementwise, for a float32 radius
    GEMM: 0 stays 0 and NaN NaN; anything else is rounded up to at least ``F32_FLOOR``."""
    (x,), (o,), shape, (res,) = _flat((x,), (np.float32,))
    _f32_upper_loop(x, o)
    return _result(res, shape)


# Smallest nonzero GEMM operand the float32 radius kernels hand to BLAS: its products with
# weights down to 2^-24 stay normal. A subnormal operand or product costs Intel cores a
# microcode assist (~150 cycles) per multiply-add -- 10x slower GEMMs where exact-looking
# zeros carried a 2^-126 floor; the floor's own width is negligible next to a float32 ulp.
F32_FLOOR = 2.0 ** -102


@numba.njit(inline="always")
def _f32_up(x):
    """A normal float32 >= x + 2^-1074, x >= 0, at least F32_FLOOR (round-to-nearest loses
    < 2^-24 relative above 2^-126; the 2^-23 factor leaves >= 2^-151 for an underflowed
    product in x); NaN stays NaN (a ``0·inf`` in x is not a small number)."""
    y = x * (1.0 + 2.0 ** -23)
    return np.float32(y if (y > F32_FLOOR) | (y != y) else F32_FLOOR)


@numba.njit(inline="always")
def _radius_abs_up(vv, r0):
    """(r, a): float64 upper bounds of the radius ``r0`` (a float64 difference: exact where it
    is subnormal, else within ε) and of ``|vv| + r`` (a sum: the same). No 2^-1074 term is
    needed (neither step can underflow past its exact value) and none is added: a subnormal
    operand costs Intel cores a ~150-cycle assist per multiply, and exact zeros (ReLU,
    padding) would otherwise turn into 2^-1074 and hit it in every later product."""
    r = r0 * (1.0 + 3 * _E)
    return r, (abs(vv) + r) * (1.0 + 3 * _E)


@numba.njit(inline="always", error_model="numpy")
def _left_elem(vv, l, h, c2):
    """L of one element as a float32 (NaN where a bound or the value is): see ``mm_left``."""
    r1, r2 = vv - l, h - vv
    nan = (r1 != r1) | (r2 != r2)
    r0 = r1 if r1 > r2 else r2
    return np.float32(math.nan) if nan else _left_of_radius(vv, r0, c2)


@numba.njit(inline="always", error_model="numpy")
def _left_of_radius(vv, r0, c2):
    """L of one element (float32) from its value and a radius r0 >= max(v - lo, hi - v)."""
    r, ah = _radius_abs_up(vv, r0)
    L = (c2 * ah + r) * (1.0 + 5 * _E)     # c2·ah may underflow: _f32_up covers it
    Lb = 0.0 if (vv == 0.0) & (r0 == 0.0) else _f32_up(L)  # zero-width zeros: L = 0
    return np.float32(Lb)


def _put_abs(absv, i, j, x):
    """``absv[i, j] = float32(|x|)``; nothing where ``absv`` is None (resolved at compile
    time: a runtime flag kept the loops from vectorizing, 4x slower)."""


@overload(_put_abs, inline="always")
def _put_abs_impl(absv, i, j, x):
    if isinstance(absv, types.NoneType):
        return lambda absv, i, j, x: None

    def put(absv, i, j, x):
        absv[i, j] = np.float32(abs(x))
    return put


def _row_target(out, scratch, i):
    """Where row i of a left factor is written: ``out[i]`` (float32), or the float32 scratch
    row that ``_row_store`` rounds into ``out[i]`` (bfloat16 bits, uint16); compile time."""


@overload(_row_target, inline="always")
def _row_target_impl(out, scratch, i):
    if out.dtype == types.uint16:
        return lambda out, scratch, i: scratch
    return lambda out, scratch, i: out[i]


def _row_store(out, scratch, i):
    """``out[i]`` = the bfloat16 bits >= the scratch row (``kernels/bf16.py: round_up``'s
    rounding, in L1: no float32 factor written to memory); nothing for a float32 ``out``."""


@overload(_row_store, inline="always")
def _row_store_impl(out, scratch, i):
    if out.dtype == types.uint16:
        def store(out, scratch, i):
            bits = scratch.view(np.uint32)
            o = out[i]
            for j in range(o.shape[0]):
                o[j] = np.uint16(_bf16_up(bits[j]))
        return store
    return lambda out, scratch, i: None


@numba.njit(cache=True, error_model="numpy")
def _mm_left_loop(v, lo, hi, c2, out, absv, scratch):
    for i in range(out.shape[0]):
        row = _row_target(out, scratch, i)
        for j in range(out.shape[1]):     # branch-free, no count: the loop vectorizes
            vv = np.float64(_at(v, i, j))
            row[j] = _left_elem(vv, _at(lo, i, j), _at(hi, i, j), c2)
            _put_abs(absv, i, j, vv)
        _row_store(out, scratch, i)


@numba.njit(cache=True, error_model="numpy")
def _midpoint_factor_loop(lo, hi, k, mid, out):
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            l, h = _at(lo, i, j), _at(hi, i, j)
            m = 0.5 * l + 0.5 * h                 # (may leave [l, h] by a subnormal step:
            #  r = max(h - m, m - l) below still covers [l, h] about m)
            mid[i, j] = m
            r0 = max(h - m, m - l)
            a = max(abs(l), abs(h))
            r, _ = _radius_abs_up(m, r0)
            L = (r + k * a) * (1.0 + 4 * _E)      # k·a may underflow: _f32_up covers it
            nan = (l != l) | (h != h)
            out[i, j] = np.float32(math.nan if nan else (0.0 if (a == 0.0) else _f32_up(L)))


def midpoint_factor(lo, hi, k):
    """(mid, L) for an exact-centre GEMM or convolution of an interval operand [lo, hi]:
    float64 midpoints and a float32 ``L >= r + k·max(|lo|, |hi|)``, r = the radius about mid
    (the radius factor ``(r + (c + γ)·|x̂|)`` of the matmul rule's exact centre; zeros of zero
    width give 0, NaN bounds NaN)."""
    (lo, hi), (mid, o), shape, (rmid, ro) = _flat((lo, hi), (np.float64, np.float32))
    _midpoint_factor_loop(lo, hi, float(k), mid, o)
    return _result(rmid, shape), _result(ro, shape)


def _sample_elem(v, src, i, j):
    """(value, r) of element (i, j) for the sample sums: ``src`` the bounds (lo, hi), a
    ball (r,), or pending centred bounds (c, R, f, a, cb, top, floor); r = max(v - lo,
    hi - v)."""


@overload(_sample_elem)
def _sample_elem_impl(v, src, i, j):
    n = len(src)
    if n == 1:
        return lambda v, src, i, j: (np.float64(_at(v, i, j)), np.float64(_at(src[0], i, j)))
    if n == 2:
        def bounds(v, src, i, j):
            vv = np.float64(_at(v, i, j))
            r1, r2 = vv - _at(src[0], i, j), _at(src[1], i, j) - vv
            return vv, (r1 if r1 > r2 else r2)
        return bounds
    if n != 7:
        raise numba.errors.TypingError("sample sums: bounds (2), a ball (1) or centred (7)")

    def centred(v, src, i, j):
        lo, hi, _ = _centred(np.float64(_at(src[0], i, j)), np.float64(_at(src[1], i, j)),
                             _at(src[2], i, j), _at(src[3], i, j), src[4], src[5], src[6])
        vv = np.float64(_at(v, i, j))
        r1, r2 = vv - lo, hi - vv
        return vv, (r1 if r1 > r2 else r2)
    return centred


@numba.njit(cache=True, error_model="numpy")
def _sample_sums_loop(v, src, rows, cols, step):
    s_r = 0.0
    s_a = 0.0
    for i in range(0, rows, step):
        for j in range(cols):
            vv, r = _sample_elem(v, src, i, j)
            s_r += r
            s_a += abs(vv) + r
    return s_r, s_a


def _sample_sums(v, src, shape):
    """(Σr, Σ(|v| + r)) over an even sample of at most 8 rows of the (rows, cols) block --
    they feed a heuristic (is a box wide enough to centre a GEMM on its value); the same sums,
    bit for bit, from bounds, a ball or pending centred bounds of the same elements
    (``_sample_elem``'s sources). (32 rows had cost ~0.15 ms a call on a 256x1024 block:
    the loop is scalar, a running sum.)"""
    rows, cols = shape
    return _sample_sums_loop(v, tuple(src), rows, cols, max(1, -(-rows // 8)))


def _left_outs(with_abs, bf16):
    return (np.uint16 if bf16 else np.float32,) + ((np.float32,) if with_abs else ())


def _row_scratch(o):
    """The float32 row that a bfloat16 left factor's rows pass through (see _row_store)."""
    return np.empty(o.shape[1] if o.dtype == np.uint16 else 0, np.float32)


def _max_of(o):
    """max of a float32 left factor, or of the values of its bfloat16 bits (nonnegative
    bfloat16 bits order as their values, NaN above inf); NaN where one is NaN, 0 if empty."""
    if not o.size:
        return 0.0
    if o.dtype == np.uint16:
        return _bf16_to_float(o.max())
    return float(o.max())


def mm_left(v, lo, hi, c2, stats=False, with_abs=False, bf16=False):
    """L (see above). With ``stats`` also (Σr, Σ(|v|+r), M): the sums over an even sample of
    at most 8 rows (``_sample_sums``: they feed a heuristic), and ``M >= max(|v| + r)`` (for
    the overflow screen: ``max(L)/c2``, as L >= c2·(|v| + r)); all NaN if any bound is NaN. ``with_abs``
    (float32 v): also |v| from the same pass, appended (the other GEMM factor of
    interval @ interval). ``bf16``: L as the bits (uint16) of bfloat16 values >= it, rounded
    as ``kernels/bf16.py: round_up`` does, for a bfloat16 radius GEMM (no float32 L written
    and read again); the stats are then the rounded values'."""
    args, outs, shape, res = _flat((v, lo, hi), _left_outs(with_abs, bf16))
    o = outs[0]
    _mm_left_loop(*args, float(c2), o, outs[1] if with_abs else None, _row_scratch(o))
    L = _result(res[0], shape)
    extra = (_result(res[1], shape),) if with_abs else ()
    if not stats:
        return (L,) + extra if with_abs else L
    top = _max_of(o)                                  # NaN where any L is (a NaN bound)
    if top != top:
        return (L, (math.nan, math.nan, math.nan)) + extra
    s_r, s_a = _sample_sums(args[0], args[1:], o.shape)
    if c2 > 0:
        m = top / c2 * (1.0 + 4 * _E)
    else:
        vv = np.asarray(v, np.float64)
        m = float(np.max(np.abs(vv) + np.maximum(vv - lo, hi - vv))) if o.size else 0.0
    return (L, (s_r, s_a, m)) + extra


@numba.njit(inline="always", error_model="numpy")
def _right_elem(vv, l, h):
    """(B̂, r_B, nan) of one element as float32 upper bounds: see ``mm_right``."""
    r1, r2 = vv - l, h - vv
    r0 = r1 if r1 > r2 else r2
    bh, rb = _right_of_radius(vv, r0)
    return bh, rb, (r1 != r1) | (r2 != r2)


@numba.njit(inline="always", error_model="numpy")
def _right_of_radius(vv, r0):
    """(B̂, r_B) of one element from its value and a radius r0 (see ``_right_elem``)."""
    r, a = _radius_abs_up(vv, r0)
    zero = (vv == 0.0) & (r0 == 0.0)          # exact zeros stay 0 (see mm_left)
    return np.float32(0.0) if zero else _f32_up(a), np.float32(0.0) if zero else _f32_up(r)


@numba.njit(cache=True, error_model="numpy")
def _mm_right_loop(v, lo, hi, bh, rb):
    n_nan = 0
    for i in range(bh.shape[0]):
        for j in range(bh.shape[1]):
            bh[i, j], rb[i, j], nan = _right_elem(np.float64(_at(v, i, j)), _at(lo, i, j),
                                                  _at(hi, i, j))
            n_nan += nan
    return n_nan


@numba.njit(cache=True, error_model="numpy")
def _mm_right_centred_loop(v, c, R, f, a, cb, top, floor, bh, rb):
    for i in range(bh.shape[0]):
        for j in range(bh.shape[1]):
            lo, hi, _ = _centred(np.float64(_at(c, i, j)), np.float64(_at(R, i, j)),
                                 _at(f, i, j), _at(a, i, j), cb, top, floor)
            bh[i, j], rb[i, j], _ = _right_elem(np.float64(_at(v, i, j)), lo, hi)


def mm_right_centred(v, c, R, f, a, top, b, floor):
    """``mm_right(v, lo, hi)`` of the bounds ``center_bounds(c, R, f, a, top, b, floor)`` in
    one pass, bit for bit, without writing them (attention's head-split K and V); None where
    a bound is not finite (the caller takes ``mm_right``). As ``mm_left_centred``, the
    caller makes sure no element is ``n_bad``."""
    args, (bh, rb), shape, (rbh, rrb) = _flat((v, c, R, f, a), (np.float32, np.float32))
    cb = (float(b) + 8 * _E) * (1.0 + 4 * _E)
    _mm_right_centred_loop(*args, cb, float(top), float(floor), bh, rb)
    m = float(bh.max()) if bh.size else 0.0     # B̂ >= |v| + r elementwise; inf, NaN: bad
    if not m < math.inf:
        return None
    s_r, s_a = _sample_sums(args[0], (*args[1:], cb, float(top), float(floor)), bh.shape)
    return _result(rbh, shape), _result(rrb, shape), (s_r, s_a, m)


def mm_right(v, lo, hi):
    """For an interval right operand of a value-centred matmul, in one pass: ``B̂ >= |v| + r``
    and ``r_B >= r`` as float32 upper bounds (r = max(v - lo, hi - v)), and the stats
    (Σr, Σ(|v|+r), max(|v|+r)) as mm_left's (NaN if a bound is NaN)."""
    args, (bh, rb), shape, (rbh, rrb) = _flat((v, lo, hi), (np.float32, np.float32))
    n_nan = _mm_right_loop(*args, bh, rb)   # (a max in the loop kept it from vectorizing)
    m = float(bh.max()) if bh.size else 0.0     # B̂ >= |v| + r elementwise
    if n_nan:
        return _result(rbh, shape), _result(rrb, shape), (math.nan, math.nan, math.nan)
    s_r, s_a = _sample_sums(args[0], args[1:], bh.shape)
    return _result(rbh, shape), _result(rrb, shape), (s_r, s_a, m)


@numba.njit(inline="always", error_model="numpy")
def _centred(cc, R, f, a, cb, top, floor):
    """(lo, hi, bad) of one element of ``center_bounds``."""
    rad = (R * f + a) * (1.0 + 4 * _E) + _TINY
    d = rad * (1.0 + 8 * _E) + min(abs(cc), _MAX) * cb + _TINY
    y = cc - d
    z = cc + d
    bad = (abs(cc) == math.inf) | (cc != cc) | (d == math.inf) | (y != y) | (z != z)
    y = -math.inf if y < -top else y
    z = math.inf if z > top else z
    return _at_least(y, floor), _at_least(z, floor), bad


@numba.njit(cache=True, error_model="numpy")
def _center_loop(c, R, f, a, cb, top, floor, lo, hi):
    n_bad = 0
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            lo[i, j], hi[i, j], bad = _centred(np.float64(_at(c, i, j)),
                                               np.float64(_at(R, i, j)), _at(f, i, j),
                                               _at(a, i, j), cb, top, floor)
            n_bad += bad
    return n_bad


def center_bounds(c, R, f, a, top, b=0.0, floor=-math.inf):
    """(lo, hi, n_bad): ``c ∓ (rad·(1+8ε) + |c|·(b + 8ε)·(1+4ε) + 2^-1074)``, ``rad >= R·f +
    a`` (see above; ``b·|c|``: a radius term proportional to the centre's magnitude);
    ``n_bad`` counts elements with a non-finite centre, an infinite radius (R or a) or a NaN
    bound: with none, every bound is finite or past ``top``. ``floor``: then
    ``np.maximum(·, floor)`` of both (a ReLU after the GEMM, as ``add_bounds``)."""
    (c, R, f, a), (lo, hi), shape, (rlo, rhi) = _flat((c, R, f, a), (np.float64, np.float64))
    cb = (float(b) + 8 * _E) * (1.0 + 4 * _E)
    n_bad = _center_loop(c, R, f, a, cb, float(top), float(floor), lo, hi)
    return _result(rlo, shape), _result(rhi, shape), n_bad


@numba.njit(cache=True, error_model="numpy")
def _mm_left_centred_loop(v, c, R, f, a, cb, top, floor, c2, out, absv, scratch):
    for i in range(out.shape[0]):
        row = _row_target(out, scratch, i)
        for j in range(out.shape[1]):     # branch-free, no count: the loop vectorizes
            lo, hi, _ = _centred(np.float64(_at(c, i, j)), np.float64(_at(R, i, j)),
                                 _at(f, i, j), _at(a, i, j), cb, top, floor)
            vv = np.float64(_at(v, i, j))
            row[j] = _left_elem(vv, lo, hi, c2)
            _put_abs(absv, i, j, vv)
        _row_store(out, scratch, i)


def mm_left_centred(v, c, R, f, a, top, b, floor, c2, with_abs=False, bf16=False):
    """``mm_left(v, lo, hi, c2, stats=True, with_abs, bf16)`` of the bounds
    ``center_bounds(c, R, f, a, top, b, floor)`` in one pass, bit for bit, without writing
    them: a GEMM's value-centred result through a ReLU into the next GEMM (``v`` the ReLU's
    value). None where a bound or L is NaN or infinite (the caller takes the two passes). The
    caller makes sure no element is ``n_bad`` for ``center_bounds``: a bad centre that the
    floor clamps would not show here."""
    args, outs, shape, res = _flat((v, c, R, f, a), _left_outs(with_abs, bf16))
    o = outs[0]
    cb = (float(b) + 8 * _E) * (1.0 + 4 * _E)
    _mm_left_centred_loop(*args, cb, float(top), float(floor), float(c2), o,
                          outs[1] if with_abs else None, _row_scratch(o))
    # a bad centre or radius gives a NaN or infinite bound, so a NaN or infinite L
    m = _max_of(o) / c2 * (1.0 + 4 * _E) if o.size and c2 > 0 else math.nan
    if not m < math.inf:
        return None
    s_r, s_a = _sample_sums(args[0], (*args[1:], cb, float(top), float(floor)), o.shape)
    return (_result(res[0], shape), (s_r, s_a, m)) + \
        ((_result(res[1], shape),) if with_abs else ())


@numba.njit(cache=True, error_model="numpy")
def _mm_left_ball_loop(v, r, c2, out, absv, scratch):
    for i in range(out.shape[0]):
        row = _row_target(out, scratch, i)
        for j in range(out.shape[1]):
            vv = np.float64(_at(v, i, j))
            row[j] = _left_of_radius(vv, np.float64(_at(r, i, j)), c2)
            _put_abs(absv, i, j, vv)
        _row_store(out, scratch, i)


@numba.njit(cache=True, error_model="numpy")
def _mm_right_ball_loop(v, r, bh, rb):
    for i in range(bh.shape[0]):
        for j in range(bh.shape[1]):
            bh[i, j], rb[i, j] = _right_of_radius(np.float64(_at(v, i, j)),
                                                  np.float64(_at(r, i, j)))


def mm_left_ball(v, r, c2, with_abs=False, bf16=False):
    """``mm_left(v, lo, hi, c2, stats=True, with_abs, bf16)`` for an operand known only as a
    ball about its value, every execution within ``r`` of ``v`` (a float32 radius that covers
    its bounds: ``split_ball``, the softmax's): the factor from r itself, no bounds formed
    (~2x fewer operations per element than reading the ball as centred bounds). None where
    L is NaN or infinite."""
    args, outs, shape, res = _flat((v, r), _left_outs(with_abs, bf16))
    o = outs[0]
    _mm_left_ball_loop(*args, float(c2), o, outs[1] if with_abs else None, _row_scratch(o))
    m = _max_of(o) / c2 * (1.0 + 4 * _E) if o.size and c2 > 0 else math.nan
    if not m < math.inf:
        return None
    s_r, s_a = _sample_sums(args[0], args[1:], o.shape)
    return (_result(res[0], shape), (s_r, s_a, m)) + \
        ((_result(res[1], shape),) if with_abs else ())


def mm_right_ball(v, r):
    """``mm_right(v, lo, hi)`` for an operand known as a ball about its value (see
    ``mm_left_ball``); None where B̂ is not finite."""
    args, (bh, rb), shape, (rbh, rrb) = _flat((v, r), (np.float32, np.float32))
    _mm_right_ball_loop(*args, bh, rb)
    m = float(bh.max()) if bh.size else 0.0
    if not m < math.inf:
        return None
    s_r, s_a = _sample_sums(args[0], args[1:], bh.shape)
    return _result(rbh, shape), _result(rrb, shape), (s_r, s_a, m)


def _parts_sum(parts, i, j):
    """(Σ x_k, Σ|x_k|) in float64 of the split-K parts at (i, j), summed left to right:
    ``parts`` a tuple of 2 or 4 (rows, cols) float32 blocks (or scalars), or both parts of a
    C-contiguous (rows, 2, cols) array (``split_center_bounds_stacked``)."""


@overload(_parts_sum, inline="always")
def _parts_sum_impl(parts, i, j):
    if isinstance(parts, types.Array):
        def stacked(parts, i, j):
            x1, x2 = np.float64(parts[i, 0, j]), np.float64(parts[i, 1, j])
            return x1 + x2, abs(x1) + abs(x2)
        return stacked
    if len(parts) == 2:
        def two(parts, i, j):
            x1, x2 = np.float64(_at(parts[0], i, j)), np.float64(_at(parts[1], i, j))
            return x1 + x2, abs(x1) + abs(x2)
        return two
    if len(parts) == 4:
        def four(parts, i, j):
            x1, x2 = np.float64(_at(parts[0], i, j)), np.float64(_at(parts[1], i, j))
            x3, x4 = np.float64(_at(parts[2], i, j)), np.float64(_at(parts[3], i, j))
            return ((x1 + x2) + x3) + x4, ((abs(x1) + abs(x2)) + abs(x3)) + abs(x4)
        return four
    raise numba.errors.TypingError("split-K parts: 2 or 4 blocks")


@numba.njit(inline="always")
def _split_elem(parts, c3, R, f, a, cb, sb, i, j):
    """One element of ``split_center_bounds``: (centre, radius, the radius's T part R·f + a's
    own R) -- the same code in the vectorized pass and the rescan of a row with wide elements."""
    x, s = _parts_sum(parts, i, j)
    x3 = np.float64(_at(c3, i, j))
    cc = x + x3
    rr = np.float64(_at(R, i, j))
    base = rr * _at(f, i, j) + _at(a, i, j)
    rad = (base + (s + abs(x3)) * sb) * (1.0 + 4 * _E) + _TINY
    d = rad * (1.0 + 8 * _E) + min(abs(cc), _MAX) * cb + _TINY
    return cc, d, rr


@numba.njit(inline="always", error_model="numpy")
def _row_wide(parts, c3, R, f, a, cb, sb, f_cap, i, cols, row_wide, n_wide, wide):
    """The split-K loops' count of wide elements after row i (``row_wide`` of them): their
    flat indices appended to ``wide`` while it has room (rare: where, for the caller's exact
    centres), else only counted."""
    if row_wide and n_wide + row_wide <= wide.shape[0]:
        for j in range(cols):
            cc, d, rr = _split_elem(parts, c3, R, f, a, cb, sb, i, j)
            if d > rr * f_cap + _at(a, i, j):
                wide[n_wide] = i * cols + j
                n_wide += 1
        return n_wide
    return n_wide + row_wide


@numba.njit(cache=True, error_model="numpy")
def _split_center_loop(parts, c3, R, f, a, cb, sb, f_cap, top, lo, hi, wide):
    n_bad = 0
    n_wide = 0
    cols = lo.shape[1]
    for i in range(lo.shape[0]):
        row_wide = 0
        for j in range(cols):
            cc, d, rr = _split_elem(parts, c3, R, f, a, cb, sb, i, j)
            row_wide += d > rr * f_cap + _at(a, i, j)
            y = cc - d
            lo[i, j] = -math.inf if y < -top else y
            z = cc + d
            hi[i, j] = math.inf if z > top else z
            n_bad += (abs(cc) == math.inf) | (cc != cc) | (d == math.inf) | (y != y) | (z != z)
        n_wide = _row_wide(parts, c3, R, f, a, cb, sb, f_cap, i, cols, row_wide, n_wide,
                           wide)
    return n_bad, n_wide


@numba.njit(cache=True, error_model="numpy")
def _split_ball_loop(parts, c3, R, f, a, cb, sb, f_cap, v, r32, wide):
    n_bad = 0
    n_wide = 0
    cols = r32.shape[1]
    for i in range(r32.shape[0]):
        row_wide = 0
        for j in range(cols):
            cc, d, rr = _split_elem(parts, c3, R, f, a, cb, sb, i, j)
            row_wide += d > rr * f_cap + _at(a, i, j)
            vv = np.float64(_at(v, i, j))
            r = (abs(vv - cc) + d) * (1.0 + 4 * _E)   # >= max(v - lo, hi - v): two roundings
            r32[i, j] = _f32_up(r)
            n_bad += (abs(cc) == math.inf) | (cc != cc) | (abs(vv) == math.inf) | (vv != vv) \
                | ~(r <= 3.0e38)
        n_wide = _row_wide(parts, c3, R, f, a, cb, sb, f_cap, i, cols, row_wide, n_wide,
                           wide)
    return n_bad, n_wide


def split_ball(parts, c3, R, f, a, b, sb, f_cap, v, max_wide=0):
    """(r, n_bad, wide) for ``split_center_bounds``' bounds around the value ``v`` instead:
    a float32 ``r >= max(v - lo, hi - v)`` (before ``top``), so that ``center_bounds(v, r,
    1, 0, top)`` contains them (4 bytes per element written instead of 16: a point linear
    layer whose result attention's head split moves). ``n_bad`` also counts non-finite
    values and radii past float32's range; ``wide`` as ``split_center_bounds``'."""
    n = len(parts)
    flat, (r32,), shape, (rr,) = _flat((*parts, c3, R, f, a, v), (np.float32,))
    cb = (float(b) + 8 * _E) * (1.0 + 4 * _E)
    wide = np.empty(max_wide, np.int64)
    n_bad, n_wide = _split_ball_loop(tuple(flat[:n]), *flat[n:n + 4], cb,
                                     float(sb) * (1.0 + 4 * _E), float(f_cap), flat[n + 4],
                                     r32, wide)
    ok = n_wide <= max_wide and rr.flags.c_contiguous
    return _result(rr, shape), n_bad, wide[:n_wide] if ok else None


def split_center_bounds(parts, c3, R, f, a, top, b, sb, f_cap, max_wide=0):
    """(lo, hi, n_bad, wide) for a centre given in parts c = Σ parts + c3 (the 2 or 4
    float32 blocks of a split-K GEMM and a bias, added here in float64, left to right):
    ``c ∓ (R·f + a + sb·(Σ|parts| + |c3|) + |c|·(b + 8ε))`` (outward as ``center_bounds``).
    ``wide``: the flat (C-order) indices of the elements whose radius passes ``R·f_cap + a``
    (where the caller prefers another centre), or None where there are more than
    ``max_wide`` of them or the result is not C-ordered; ``n_bad`` as ``center_bounds``'."""
    n = len(parts)
    flat, (lo, hi), shape, (rlo, rhi) = _flat((*parts, c3, R, f, a), (np.float64, np.float64))
    cb = (float(b) + 8 * _E) * (1.0 + 4 * _E)
    wide = np.empty(max_wide, np.int64)
    n_bad, n_wide = _split_center_loop(tuple(flat[:n]), *flat[n:], cb,
                                       float(sb) * (1.0 + 4 * _E), float(f_cap), float(top),
                                       lo, hi, wide)
    ok = n_wide <= max_wide and rlo.flags.c_contiguous and rhi.flags.c_contiguous
    return _result(rlo, shape), _result(rhi, shape), n_bad, wide[:n_wide] if ok else None


@numba.njit(cache=True)
def _any_differ_loop(a, b):
    for i in range(a.size):
        if a[i] != b[i]:
            return True
    return False


def any_differ(a, b):
    """``np.any(a != b)`` of two same-shape arrays, stopping at the first difference (an
    interval's bounds usually differ at once; the full comparison was a pass of its own)."""
    a, b = np.asarray(a), np.asarray(b)
    if (a.shape == b.shape and a.dtype == b.dtype and a.flags.c_contiguous
            and b.flags.c_contiguous):
        return bool(_any_differ_loop(a.reshape(-1), b.reshape(-1)))
    return bool(np.any(a != b))


def split_center_bounds_stacked(parts, R, f, a, top, b, sb):
    """``split_center_bounds`` (no third part, no wide elements) of c1 + c2 given as
    ``parts[:, 0]`` and ``parts[:, 1]`` of one C-contiguous (rows, 2, cols) array -- the
    output channels of one grouped convolution whose two groups are a convolution's two
    input-channel blocks -- with R a C-contiguous (rows, cols) array and f, a scalars:
    (lo, hi, n_bad) as (rows, cols) arrays. (Strided views of the parts made the loop scalar,
    4x slower, and copying them cost what the grouped convolution saves.)"""
    rows, _, cols = parts.shape
    lo, hi = np.empty((rows, cols)), np.empty((rows, cols))
    cb = (float(b) + 8 * _E) * (1.0 + 4 * _E)
    n_bad, _ = _split_center_loop(parts, 0.0, R, float(f), float(a), cb,
                                  float(sb) * (1.0 + 4 * _E), math.inf, float(top), lo, hi,
                                  np.empty(0, np.int64))
    return lo, hi, n_bad


@numba.njit(cache=True, error_model="numpy", fastmath={"reassoc", "contract"})
def _dot_pairs_loop(X, WT, rows, cols, C, T):
    for e in range(rows.shape[0]):
        x, w = X[rows[e]], WT[cols[e]]
        s = 0.0
        t = 0.0
        for k in range(x.shape[0]):
            p = np.float64(x[k]) * np.float64(w[k])
            s += p
            t += abs(p)
        C[e] = s
        T[e] = t


def dot_pairs(X, WT, rows, cols):
    """(C, T): float64 ``Σ_k X[r, k]·WT[c, k]`` and ``Σ_k |X[r, k]·WT[c, k]|`` for each pair
    (r, c) of ``rows``/``cols`` (X, WT: 2-D float32 with rows of K). Products of float32s are
    exact in float64; the sums run in any order (``reassoc``: the loop vectorizes; with
    ``contract`` an FMA rounds once instead of twice; no other fast-math flag), so
    |C - exact| <= γ_{K-1}(u64)·T_exact and T >= T_exact·(1 - γ_{K-1}), whatever the order.
    The exact centres of a split-K matmul's wide elements."""
    C = np.empty(rows.shape[0])
    T = np.empty(rows.shape[0])
    WT = WT if WT.flags.c_contiguous else transposed(np.ascontiguousarray(WT.T))
    _dot_pairs_loop(np.ascontiguousarray(X), WT, rows, cols, C, T)
    return C, T


@numba.njit(cache=True)
def _transpose_loop(a, out):
    b = 16
    for j0 in range(0, a.shape[1], b):
        for i0 in range(0, a.shape[0], b):
            for j in range(j0, min(j0 + b, a.shape[1])):
                for i in range(i0, min(i0 + b, a.shape[0])):
                    out[j, i] = a[i, j]


def transposed(a):
    """A C-contiguous copy of the 2-D array ``a.T``, in 16x16 tiles written row by row
    (NumPy's strided copy of a transposed 1024x1024 float32 matrix took 6.4 ms, this 1.1)."""
    out = np.empty((a.shape[1], a.shape[0]), a.dtype)
    _transpose_loop(a, out)
    return out


@numba.njit(inline="always")
def _nmax(a, b):
    """max that propagates NaN (np.maximum)."""
    return a if (a > b or a != a) else b


@numba.njit(inline="always")
def _nmin(a, b):
    """min that propagates NaN (np.minimum)."""
    return a if (a < b or a != a) else b


@numba.njit(inline="always")
def _row_max(x):
    """max of a 1-D array of finite floats (-inf if empty) over eight independent lanes (one
    running max is a chain of dependent compares that does not vectorize: 2x slower, NumPy's
    axis reduction of short rows 4x)."""
    n = x.shape[0]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = -math.inf
    j = 0
    while j + 8 <= n:
        a0, a1, a2, a3 = max(a0, x[j]), max(a1, x[j + 1]), max(a2, x[j + 2]), max(a3, x[j + 3])
        a4, a5, a6, a7 = (max(a4, x[j + 4]), max(a5, x[j + 5]), max(a6, x[j + 6]),
                          max(a7, x[j + 7]))
        j += 8
    while j < n:
        a0 = max(a0, x[j])
        j += 1
    return max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))


@numba.njit(inline="always")
def _row_sum(x):
    """Σ x of a 1-D float64 array over eight lanes (vectorizes; any order's error is the
    caller's γ_{n}(u64))."""
    n = x.shape[0]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    j = 0
    while j + 8 <= n:
        a0, a1, a2, a3 = a0 + x[j], a1 + x[j + 1], a2 + x[j + 2], a3 + x[j + 3]
        a4, a5, a6, a7 = a4 + x[j + 4], a5 + x[j + 5], a6 + x[j + 6], a7 + x[j + 7]
        j += 8
    while j < n:
        a0 += x[j]
        j += 1
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))


@numba.njit(inline="always")
def _row_dot(x, y):
    """Σ x·y of two 1-D float64 arrays over eight lanes (as ``_row_sum``)."""
    n = x.shape[0]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    j = 0
    while j + 8 <= n:
        a0, a1 = a0 + x[j] * y[j], a1 + x[j + 1] * y[j + 1]
        a2, a3 = a2 + x[j + 2] * y[j + 2], a3 + x[j + 3] * y[j + 3]
        a4, a5 = a4 + x[j + 4] * y[j + 4], a5 + x[j + 5] * y[j + 5]
        a6, a7 = a6 + x[j + 6] * y[j + 6], a7 + x[j + 7] * y[j + 7]
        j += 8
    while j < n:
        a0 += x[j] * y[j]
        j += 1
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))


@numba.njit(inline="always", error_model="numpy")
def _shift_row(lo_i, hi_i, r_s, a_s, k, dl_i, dh_i):
    """One row of a finite box: the box widened by the subtraction's rounding, minus its
    largest upper end (dl <= dh <= 0, the arguments of the exps); dl_i/dh_i may be lo_i/hi_i.
    Elementwise loops between lane-parallel maxima: they vectorize."""
    mlo, mhi = _row_max(lo_i), _row_max(hi_i)
    for j in range(lo_i.shape[0]):
        dist = max(abs(lo_i[j] - mhi), abs(hi_i[j] - mlo))
        pert = (r_s * dist + a_s) * (1 + k)
        a, b = lo_i[j] - pert, hi_i[j] + pert
        dl_i[j] = a - k * abs(a) - _TINY
        dh_i[j] = b + k * abs(b) + _TINY
    m = _row_max(dh_i)
    for j in range(lo_i.shape[0]):
        dl_i[j] -= m
        dh_i[j] -= m


@numba.njit(cache=True, error_model="numpy")
def _softmax_shift(lo, hi, r_s, a_s, k, dl, dh):
    """``_shift_row`` of every row."""
    for i in range(lo.shape[0]):
        _shift_row(lo[i], hi[i], r_s, a_s, k, dl[i], dh[i])


@numba.njit(cache=True, error_model="numpy")
def _softmax_shift_centred(c, R, f, a, cb, top, floor, r_s, a_s, k, dl, dh):
    """``_shift_row`` of every row of the bounds ``center_bounds(c, R, f, a, top, b, floor)``,
    each row's bounds made in dl/dh first (a row stays in L1; the bounds are never written
    to memory as a whole)."""
    rows, n = dl.shape
    for i in range(rows):
        dl_i, dh_i = dl[i], dh[i]
        for j in range(n):
            dl_i[j], dh_i[j], _ = _centred(np.float64(_at(c, i, j)), np.float64(_at(R, i, j)),
                                           _at(f, i, j), _at(a, i, j), cb, top, floor)
        _shift_row(dl_i, dh_i, r_s, a_s, k, dl_i, dh_i)


@numba.njit(cache=True, error_model="numpy")
def _softmax_row_bounds(dl, dh, el, eh, sl, sh, r_e, a_e, r_d, a_d, inv_dl_hi, inv_dh_lo, k,
                        ylo, yhi):
    """One row's bounds from its scaled exps and their sums, branch-free (vectorizes); returns
    whether an exp underflowed to 0 (a ratio 0/x or 0/0: the caller's log-domain row then)."""
    n = dl.shape[0]
    under = False
    for j in range(n):
        e_l, e_h = el[j], eh[j]
        others_hi = (sh - e_h) * (1 + 2 * _E)
        others_lo = max((sl - e_l) * (1 - 2 * _E), 0.0)
        den = e_h + others_lo
        under |= (e_l == 0.0) | (den == 0.0)
        plo = max(e_l / (e_l + others_hi) * (1 - 4 * _E), 0.0)
        phi = min(e_h / den * (1 + 4 * _E), 1.0)
        ylo[j], yhi[j] = _softmax_out(plo, phi, r_e, a_e, r_d, a_d, inv_dl_hi, inv_dh_lo, k)
    return under


@numba.njit(inline="always")
def _softmax_out(plo, phi, r_e, a_e, r_d, a_d, inv_dl_hi, inv_dh_lo, k):
    """The bounds of one output from the exact ratio's range [plo, phi]: the exp's error,
    nl / dhigh (nl >= 0) or nl / dlow and nh / dlow through reciprocals rounded outward (each
    product's own rounding included: see ``_softmax_rows``), the division's error."""
    nl = plo * (1 - r_e) - a_e
    nh = phi * (1 + r_e) + a_e
    qlo = nl * (inv_dh_lo if nl >= 0 else inv_dl_hi)
    qhi = nh * inv_dl_hi
    return ((qlo * (1 - r_d) - a_d) * (1 - k) - abs(qlo) * k - _TINY,
            (qhi * (1 + r_d) + a_d) * (1 + k) + _TINY)


@numba.njit(cache=True, error_model="numpy")
def _softmax_rows(dl, dh, el, eh, r_e, a_e, r_d, a_d, dlow, dhigh, g64, k, libm, ylo, yhi):
    """Per row, from the exps el = exp(dl), eh = exp(dh) (NumPy's SIMD exp): the exact softmax
    range over the box with outward allowances, then the evaluation's errors. Rows where an
    exp underflowed are redone with log-domain ratios (``_softmax_row_underflow``)."""
    rows, n = dl.shape
    # 1/dhigh rounded down and 1/dlow up by a margin that covers their rounding and the
    # product's: nl·inv_dh_lo <= nl/dhigh (nl >= 0), nl·inv_dl_hi <= nl/dlow (nl < 0),
    # nh·inv_dl_hi >= nh/dlow (nh >= 0)
    inv_dh_lo = 1.0 / dhigh * (1 - 4 * _E)
    inv_dl_hi = 1.0 / dlow * (1 + 4 * _E)
    for i in range(rows):
        dl_i, dh_i, el_i, eh_i = dl[i], dh[i], el[i], eh[i]
        for j in range(n):
            el_i[j] *= 1 - (libm + 4 + abs(dl_i[j])) * _E
            eh_i[j] *= 1 + (libm + 4 + abs(dh_i[j])) * _E
        sh = _row_sum(eh_i) * (1 + g64)
        sl = _row_sum(el_i) * (1 - g64)
        if _softmax_row_bounds(dl_i, dh_i, el_i, eh_i, sl, sh, r_e, a_e, r_d, a_d, inv_dl_hi,
                               inv_dh_lo, k, ylo[i], yhi[i]):
            _softmax_row_underflow(dl_i, dh_i, el_i, eh_i, sl, sh, libm, ylo[i], yhi[i],
                                   r_e, a_e, r_d, a_d, inv_dl_hi, inv_dh_lo, k)


@numba.njit(cache=True, error_model="numpy")
def _softmax_row_underflow(dl, dh, el, eh, sl, sh, libm, ylo, yhi, r_e, a_e, r_d, a_d,
                           inv_dl_hi, inv_dh_lo, k):
    """A row where some exp underflowed, element by element: where exp(dl_j) is 0 the ratio
    is at least 1/(1 + (n-1)·exp(max_{k != j} dh_k - dl_j)) in the log domain; where the
    denominator is 0 (a box far wider than float64's exp range: 0/0) it is at most
    exp(dh_j - max(dh_j, max_{k != j} dl_k)) (the denominator is at least its largest term)."""
    n = dl.shape[0]
    m1 = -math.inf       # the two largest lower arguments of the row, and where the first is
    m2 = -math.inf
    j1 = -1
    h1 = -math.inf       # the same for the upper arguments
    h2 = -math.inf
    k1 = -1
    for j in range(n):
        d_l, d_h = dl[j], dh[j]
        if d_l > m1:
            m1, m2, j1 = d_l, m1, j
        elif d_l > m2:
            m2 = d_l
        if d_h > h1:
            h1, h2, k1 = d_h, h1, j
        elif d_h > h2:
            h2 = d_h
    for j in range(n):
        e_l, e_h = el[j], eh[j]
        others_hi = (sh - e_h) * (1 + 2 * _E)
        others_lo = _nmax((sl - e_l) * (1 - 2 * _E), 0.0)
        plo = _nmax(e_l / (e_l + others_hi) * (1 - 4 * _E), 0.0)
        if e_l == 0.0:
            t = (h2 if j == k1 else h1) - dl[j]
            # (t = -inf: no other element, n = 1; the error factor made 0·inf NaN)
            et = (0.0 if t == -math.inf else
                  math.exp(t) * (1 + (libm + 4 + abs(t)) * _E) + _TINY)
            plo = _nmax(1.0 / (1.0 + (n - 1) * et * (1 + 2 * _E)) * (1 - 4 * _E), 0.0)
        if e_h + others_lo == 0.0:
            t = dh[j] - max(dh[j], m2 if j == j1 else m1)
            phi = math.exp(t) * (1 + (libm + 4 + abs(t)) * _E) + _TINY
        else:
            phi = e_h / (e_h + others_lo) * (1 + 4 * _E)
        phi = _nmin(phi, 1.0)
        ylo[j], yhi[j] = _softmax_out(plo, phi, r_e, a_e, r_d, a_d, inv_dl_hi, inv_dh_lo, k)


# rows per block of the softmax passes: a block's shifted arguments, exps and bounds (~1.3 MB
# at 128 columns) stay in L2 between the passes instead of making ~110 bytes of memory
# traffic per score
_SOFTMAX_BLOCK = 256


def softmax_bounds(lo, hi, r_s, a_s, k, r_e, a_e, r_d, a_d, dlow, dhigh, g64, libm):
    """fpx.interval's softmax rule (see its docstring for the derivation) along the last axis:
    two compiled row passes around NumPy's SIMD exp, elementwise loops that vectorize (the
    NumPy spelling made ~35 passes over the whole block; a scalar exp per element in the loop
    was slower still; loops that carried the rows' maxima and branches took 20 ms for the
    encoder benchmark's 1M scores, these 4), over blocks of rows that stay in cache."""
    shape = lo.shape
    lo2 = np.ascontiguousarray(lo, np.float64).reshape(-1, shape[-1])
    hi2 = np.ascontiguousarray(hi, np.float64).reshape(-1, shape[-1])

    def shift(s, e, dl, dh):
        _softmax_shift(lo2[s:e], hi2[s:e], float(r_s), float(a_s), float(k), dl, dh)
    ylo, yhi = np.empty(lo2.shape), np.empty(lo2.shape)
    _softmax_blocks(shift, lo2.shape, (r_e, a_e, r_d, a_d, dlow, dhigh, g64, k, libm),
                    ylo, yhi)
    return ylo.reshape(shape), yhi.reshape(shape)


def _softmax_blocks(shift, shape2, consts, ylo, yhi, v=None, r32=None):
    """The softmax passes over blocks of ``_SOFTMAX_BLOCK`` rows of a (rows, n) block:
    ``shift(s, e, dl, dh)`` writes rows s..e of the shifted box, NumPy's exp, the bounds
    rows into ylo/yhi -- or, with the value ``v``, into block scratch and from there into
    a float32 ball ``r32 >= max(v - lo, hi - v)`` (``_ball_rows``); returns the ball's
    ``n_bad`` (0 without one)."""
    rows, n = shape2
    bl = max(1, min(rows, _SOFTMAX_BLOCK))
    dl, dh, el, eh = (np.empty((bl, n)) for _ in range(4))
    if v is not None:
        blo, bhi = np.empty((bl, n)), np.empty((bl, n))
    c = tuple(float(z) for z in consts)
    n_bad = 0
    with np.errstate(all="ignore"):
        for s in range(0, rows, bl):
            e = min(s + bl, rows)
            m = e - s
            dl_b, dh_b, el_b, eh_b = dl[:m], dh[:m], el[:m], eh[:m]
            shift(s, e, dl_b, dh_b)
            np.exp(dl_b, out=el_b)
            np.exp(dh_b, out=eh_b)
            if v is None:
                _softmax_rows(dl_b, dh_b, el_b, eh_b, *c, ylo[s:e], yhi[s:e])
            else:
                _softmax_rows(dl_b, dh_b, el_b, eh_b, *c, blo[:m], bhi[:m])
                n_bad += _ball_rows(v[s:e], blo[:m], bhi[:m], r32[s:e])
    return n_bad


@numba.njit(cache=True, error_model="numpy")
def _ball_rows(v, lo, hi, r32):
    n_bad = 0
    for i in range(r32.shape[0]):
        for j in range(r32.shape[1]):
            vv = np.float64(v[i, j])
            r = max(vv - lo[i, j], hi[i, j] - vv) * (1.0 + 4 * _E)  # two roundings
            r32[i, j] = _f32_up(r)
            n_bad += (r != r) | ~(r <= 3.0e38) | (abs(vv) == math.inf) | (vv != vv)
    return n_bad


def rows_of(c, R, f, a):
    """Whether ``center_bounds(c, R, f, a, ...)`` can be read row by row along the last axis
    by ``softmax_bounds_centred``: c and R C-contiguous arrays of one shape, f and a scalars
    or rows of the last axis's length."""
    shape = np.shape(c)
    return (isinstance(c, np.ndarray) and isinstance(R, np.ndarray) and len(shape) > 0
            and R.shape == shape and c.flags.c_contiguous and R.flags.c_contiguous
            and all(np.ndim(z) == 0 or (isinstance(z, np.ndarray) and z.shape == shape[-1:]
                                        and z.flags.c_contiguous) for z in (f, a)))


def softmax_bounds_centred(c, R, f, a, top, b, floor, r_s, a_s, k, r_e, a_e, r_d, a_d, dlow,
                           dhigh, g64, libm, value=None):
    """``softmax_bounds`` of the bounds ``center_bounds(c, R, f, a, top, b, floor)`` (laid out
    as ``rows_of`` says; the caller makes sure they are all finite) without writing them:
    pending value-centred attention scores (one pass less over 16 bytes per score). With the
    output's ``value`` (float32, the scores' shape, C order): (r32, n_bad) instead, a float32
    ball about it, r32 >= max(value - lo, hi - value) (the bounds themselves never written:
    P·V's left factor reads the ball), n_bad counting non-finite values and radii past
    float32's range."""
    shape = c.shape
    n = shape[-1]
    c2, R2 = c.reshape(-1, n), R.reshape(-1, n)
    f2, a2 = (float(z) if np.ndim(z) == 0 else z for z in (f, a))
    cb = (float(b) + 8 * _E) * (1.0 + 4 * _E)

    def shift(s, e, dl, dh):
        _softmax_shift_centred(c2[s:e], R2[s:e], f2, a2, cb, float(top), float(floor),
                               float(r_s), float(a_s), float(k), dl, dh)
    consts = (r_e, a_e, r_d, a_d, dlow, dhigh, g64, k, libm)
    if value is not None:
        r32 = np.empty(c2.shape, np.float32)
        n_bad = _softmax_blocks(shift, c2.shape, consts, None, None, value.reshape(-1, n), r32)
        return r32.reshape(shape), n_bad
    ylo, yhi = np.empty(c2.shape), np.empty(c2.shape)
    _softmax_blocks(shift, c2.shape, consts, ylo, yhi)
    return ylo.reshape(shape), yhi.reshape(shape)


@numba.njit(cache=True, error_model="numpy")
def _ln_q_max(n, var_lo, M2, e_mu, a_v, g_v, d_op, d_s, eta, eps):
    """An a priori bound on |(x_i - μ')/s'| (the program's normalized value before its own
    rounding) over a layer norm's box; inf where none applies. |x_i - μ| <= sqrt((n-1)·var)
    for every x (Σ_j (x_j - μ) = 0 and Cauchy-Schwarz), |μ' - μ| <= e_μ, the program's
    var' >= max(0, var - G·σ - β) (σ = sqrt(var), G = γ·sqrt(M2), β = G·e_μ + a_v: the
    rule's error terms for this x's own variance) and s'² >= (1-d)(var' + eps) - η. Two
    ways to keep the dip of var - G·σ from reaching s': (a) var - G·σ >= (1-θ)·var -
    G²/(4θ) with G²/(4θ) paid from eps; (b) σ >= m·G gives var - G·σ >= (1 - 1/m)·var, and
    below that var' >= 0 leaves s'² >= (1-d)·eps - η. The least of the bounds is taken.
    Without it a wide box (s_lo near sqrt(eps)) gave |y - b| up to |x|/sqrt(eps)·|w|, far
    past sqrt(n)·|w|."""
    E = _E
    G = g_v * math.sqrt(M2) * (1 + 4 * E)
    beta = (G * e_mu + a_v) * (1 + 4 * E)
    k1 = (eps - beta) * (1 - 4 * E)
    sq = math.sqrt(n - 1)
    best = math.inf
    if k1 > 0:                                              # (a)
        th = max(G * G / (2 * k1), 1.0 / 1024)
        kap = ((1 - d_op) * (k1 - G * G / (4 * th) * (1 + 4 * E)) - eta) * (1 - 4 * E)
        c = (1 - d_op) * (1 - th) * (1 - 4 * E)
        den = (c * var_lo + kap) * (1 - 4 * E)
        if th <= 0.5 and kap >= 0 and den > 0:
            best = (math.sqrt((n - 1) / c) * (1 + 4 * E) + e_mu / math.sqrt(den)) * (1 + 4 * E)
    base = ((1 - d_op) * eps - eta) * (1 - 4 * E)
    kap = ((1 - d_op) * k1 - eta) * (1 - 4 * E)
    if base > 0 and kap >= 0:                               # (b)
        for m in (1.5, 2.0, 4.0, 8.0, 16.0, 64.0):
            c = (1 - d_op) * (1 - 1 / m) * (1 - 4 * E)
            den = (c * var_lo + kap) * (1 - 4 * E)
            if not den > 0:
                continue
            r = (math.sqrt((n - 1) / c) * (1 + 4 * E) + e_mu / math.sqrt(den)) * (1 + 4 * E)
            if var_lo < (m * G) * (m * G):
                r = max(r, (sq * m * G * (1 + 4 * E) + e_mu) / math.sqrt(base) * (1 + 4 * E))
            best = min(best, r)
    return best / (1 - d_s) * (1 + 8 * E) + _TINY


@numba.njit(cache=True, error_model="numpy")
def _layer_norm_rows(v, lo, hi, w, b, eps_lo, eps_hi, g_mu, g_v, g_out, d_op, d_s, eta, g64,
                     top, lim, wb_max, ylo, yhi):
    """fpx.interval's layer-norm rule (see its docstring for the derivation), one row at a
    time: pass 1 the row's sums, pass 2 the centred value's norm, pass 3 the bounds. Returns
    the number of rows where an intermediate of the program might pass ``lim`` (the squares
    and their sum, the normalized value or its scaling: overflow the bound does not model)
    or an input is not finite (those rows' bounds are left unset)."""
    rows, n = lo.shape
    n_bad = 0
    u64 = 2.0 ** -53
    sqn = math.sqrt(n) * (1 + 2 * _E)
    # the row's values, radii, magnitudes and centred values, in L1-resident scratch: every
    # pass below is elementwise or a lane-parallel reduction, so it vectorizes (the sums'
    # order is covered by γ_{n+4}(u64); one running sum per quantity did not: 3x slower)
    vr, rr, xa, dr = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
    for i in range(rows):
        for j in range(n):
            vv = np.float64(v[i, j])
            vr[j] = vv
            rr[j] = _radius_abs_up(vv, max(vv - lo[i, j], hi[i, j] - vv))[0]
            xa[j] = max(abs(lo[i, j]), abs(hi[i, j]))
            # (|v| here, plus x - x: 0 for finite v/lo/hi, NaN for inf or NaN; v - mean below)
            dr[j] = abs(vv) + (lo[i, j] - lo[i, j]) + (hi[i, j] - hi[i, j])
        s_av = _row_sum(dr)
        if not math.isfinite(s_av):           # a non-finite input: the caller's fallback
            n_bad += 1
            continue
        s_v = _row_sum(vr)
        s_r = _row_sum(rr)
        s_a = _row_sum(xa)
        s_q = _row_dot(xa, xa)
        xm = max(_row_max(xa), 0.0)
        mv = s_v / n
        # (mr, e64c at least 2^-968: every element's radius below adds them, and an
        # all-zero row of a float64 program would otherwise multiply subnormals per element,
        # a microcode assist each on Intel cores: 15x slower)
        mr = max(s_r / n * (1 + g64) + _TINY, 2.0 ** -968)    # >= mean(r)
        M1 = s_a / n * (1 + g64) + _TINY              # >= mean|x| over the box
        M2 = s_q / n * (1 + g64) + _TINY              # >= mean(x²) over the box
        e64c = max(s_av / n * g64 + _TINY, 2.0 ** -968)       # |mv - mean(v)|
        for j in range(n):
            dr[j] = vr[j] - mv
        s_d2 = _row_dot(dr, dr)
        s_r2 = _row_dot(rr, rr)
        nd_hi = math.sqrt(s_d2 * (1 + g64)) * (1 + 2 * _E)
        nd_lo = math.sqrt(s_d2 * (1 - g64)) * (1 - 2 * _E)
        nr = math.sqrt(s_r2 * (1 + g64)) * (1 + 2 * _E) + _TINY
        ne = (sqn * e64c + 2 * u64 * nd_hi) * (1 + 4 * _E)   # ||computed d - P·v||
        nlo = max((nd_lo - (nr + ne) * (1 + 2 * _E)) * (1 - 2 * _E), 0.0)
        nhi = (nd_hi + nr + ne) * (1 + 4 * _E)
        var_lo = nlo * nlo / n * (1 - 4 * _E)
        var_hi = nhi * nhi / n * (1 + 4 * _E)
        # the program's mean and variance (any order, two-pass or updating)
        e_mu = (g_mu * M1 + (n + 2) * eta) * (1 + 4 * _E)
        a_v = ((n + 4 + 3 * math.sqrt(M2)) * eta + eta * eta) * (1 + 8 * _E)
        # (every variance algorithm in use returns >= 0: sums of squares, Welford's
        # same-signed increments, one-pass clamped at 0)
        e_gen = g_v * math.sqrt(M2 * (var_hi + e_mu * e_mu)) * (1 + 8 * _E)
        vp_lo = max(var_lo * (1 - 4 * _E) - (e_gen + a_v) * (1 + 4 * _E), 0.0)
        vp_hi = ((var_hi + e_mu * e_mu) * (1 + g_v) + e_gen + a_v) * (1 + 8 * _E)
        t_lo = ((vp_lo + eps_lo) * (1 - d_op) - eta) * (1 - 4 * _E)
        t_hi = ((vp_hi + eps_hi) * (1 + d_op) + eta) * (1 + 4 * _E)
        s_lo = math.sqrt(t_lo) * (1 - d_s) * (1 - 4 * _E) if t_lo > 0 else 0.0
        s_hi = math.sqrt(t_hi) * (1 + d_s) * (1 + 4 * _E)
        mu_abs = (abs(mv) + e64c + mr + e_mu) * (1 + 4 * _E)   # >= |the program's mean|
        q_max = _ln_q_max(n, var_lo, M2, e_mu, a_v, g_v, d_op, d_s, eta, eps_lo)
        if (4 * xm * xm * n * 1.01 > lim) or (s_lo > 0 and 2.01 * xm / s_lo * wb_max > lim):
            n_bad += 1
        if not s_lo > 0:
            for j in range(n):
                ylo[i, j] = -math.inf
                yhi[i, j] = math.inf
            continue
        # d/s over s in [s_lo, s_hi] through reciprocals rounded outward (no division per
        # element: five per element had made this pass divider-bound): inv_hi <= 1/s_hi,
        # inv_lo >= 1/s_lo (finite: s_lo >= sqrt(2^-1074)); each product's own rounding is
        # the quotient's, which the 2ε steps below widen by
        inv_hi = 1.0 / s_hi * (1 - 2 * _E)
        inv_lo = 1.0 / s_lo * (1 + 2 * _E)
        for j in range(n):
            ww = np.float64(_at(w, i, j))
            bb = np.float64(_at(b, i, j))
            d = dr[j]
            rho = (rr[j] + mr + e64c + 2 * u64 * abs(d) + e_mu) * (1 + 6 * _E)
            dl = (d - rho) - abs(d - rho) * 2 * _E - _TINY
            dh = (d + rho) + abs(d + rho) * 2 * _E + _TINY
            ql = dl * (inv_hi if dl >= 0 else inv_lo)     # <= dl/s_hi resp. dl/s_lo
            qh = dh * (inv_lo if dh >= 0 else inv_hi)     # >= dh/s_lo resp. dh/s_hi
            ql -= abs(ql) * 2 * _E + _TINY
            qh += abs(qh) * 2 * _E + _TINY
            ql = max(ql, -q_max)
            qh = min(qh, q_max)
            ql, qh = (qh, ql) if ww < 0 else (ql, qh)
            zl = ql * ww + bb
            zh = qh * ww + bb
            zl -= (abs(ql * ww) + abs(bb)) * 4 * _E + _TINY
            zh += (abs(qh * ww) + abs(bb)) * 4 * _E + _TINY
            X = xa[j]
            aw = abs(ww) * inv_lo                        # >= |w|/s_lo, rounding in rnd's 8ε
            rnd = (g_out * ((X + mu_abs) * aw + abs(bb)) + eta * (3 + 2 * aw)) * (1 + 8 * _E)
            y = zl - rnd * (1 + 2 * _E) - abs(zl) * 2 * _E - _TINY
            z = zh + rnd * (1 + 2 * _E) + abs(zh) * 2 * _E + _TINY
            ylo[i, j] = -math.inf if y < -top else y
            yhi[i, j] = math.inf if z > top else z
    return n_bad


def layer_norm_bounds(v, lo, hi, w, b, eps_lo, eps_hi, g_mu, g_v, g_out, d_op, d_s, eta, top,
                      lim):
    """fpx.interval's layer-norm rule over the last axis of (rows, n) blocks (``w``/``b``:
    float64 rows of n, or scalars); returns (ylo, yhi, n_bad) (n_bad: rows where the
    program's intermediates might pass ``lim`` or an input is not finite). Three compiled passes per row, with the row
    in cache: the decomposition's rules made ~25 passes over the whole block."""
    n = lo.shape[-1]
    ylo, yhi = np.empty(lo.shape), np.empty(lo.shape)
    wb_max = max(1.0, float(np.max(np.abs(w)))) + float(np.max(np.abs(b)))
    n_bad = _layer_norm_rows(v, lo, hi, w, b, float(eps_lo), float(eps_hi), float(g_mu),
                             float(g_v), float(g_out), float(d_op), float(d_s), float(eta),
                             (n + 4) * 2.0 ** -53 / (1 - (n + 4) * 2.0 ** -53), float(top),
                             float(lim), wb_max, ylo, yhi)
    return ylo, yhi, n_bad
