"""Fused one-pass kernels of the interval transform (numba loops, IEEE round-to-nearest: no
fastmath, so no reassociation).

Each widens a pair of bounds, adds a rounding error and maps overflow to infinity in one pass
per bound, without temporaries.

* ``down(x, rel, absl, top)`` = ``x - (min(|x|, MAX)·rel + absl)``; ``top``: where the
  rounding may overflow; below ``-top``, at least ``-top·(1 + 2^-40)`` where ``x`` is not,
  else ``-inf``; ``up`` mirrors it. With ``rel`` including
  ``4·2^-52`` and ``absl`` including
  ``2^-1074`` the float64 rounding of these steps themselves is covered. NaN passes through.
* ``scale_up(x, f, a)``: an upper bound of ``x·f + a`` for ``x >= 0``.
* boxes: ``add_bounds``, ``mul_bounds`` (interval sum and product with their rounding),
  ``affine_bounds`` (both: a batch norm's scale and shift); softmax's and layer norm's row
  kernels are in :mod:`fpx.kernels.interval_nn`.
* balls (every execution within ``r`` of the program's value ``v``): ``ball_radius`` (box
  to ball), ``center_bounds(c, R, f, a, top, b)`` (ball to box: ``c ∓ (R·f + a + b·|c|)``
  widened outward, past ``top`` ∓inf), ``ball_affine`` (a radius through a constant, or
  the sum of two balls), ``ball_floor`` (through a ReLU); ``center_ball`` and
  ``parts_ball``: a contraction's own centre's bound as a ball about the value (the centre
  an array, or the float32 parts of a split-K sum, read in one pass).
* GEMM factors of a ball: ``mm_left_ball`` (``L = c2·(|v| + r) + r``) and ``mm_right_ball``
  (``|v| + r`` and ``r``), float32 upper bounds (bumped by ``2^-23`` relative and at least
  ``F32_FLOOR`` = 2^-102: no subnormal operands or products in the radius GEMM, which cost
  Intel cores a microcode assist per multiply); zero-width zeros give 0 exactly.

Each is one compiled loop over (rows, last axis) blocks of contiguous memory, whose inner loop
vectorizes. :func:`_flat` lays the operands out: arrays of the full shape in place, a bias row
as a row, scalars as scalars (numba compiles a specialization for each mix); anything else
is expanded once -- except two layouts that would otherwise be copied: operands that are all
one permutation of a dense block (attention's head-split and transposed activations) run in
memory order, outputs in the same layout; operands constant along trailing dims (a per-channel
``(1, C, 1, 1)`` scale) become per-row columns of a (N·C, H·W) split, read once per row (as
stride-0 rows they would keep the inner loop from vectorizing).
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
_EDGE = 1.0 + 2.0 ** -40       # a bound's reach past the overflow threshold (``_lower``)
_INNER = 1.0 - 2.0 ** -40      # how far inside it an end must be to stay finite


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


def _flat_dense(args, out_dtypes, outs=None):
    """``_flat``'s common case in one pass: every array operand C-contiguous and of one shape,
    the others Python floats, float64 scalars or 0-d arrays (read as scalars, as ``_flat``
    does), outputs allocated or taken from ``outs`` (where one is a writeable C-contiguous
    array of the shape and dtype); None otherwise (the general path). On small arrays the
    layout analysis cost more than the kernel; 2-D operands are passed as they are."""
    shape = None
    for a in args:
        t = type(a)
        if t is np.ndarray:
            s = a.shape
            if s == shape:
                if not a.flags.c_contiguous:
                    return None
            elif not s:
                continue
            elif shape is None and a.flags.c_contiguous:
                shape = s
            else:
                return None
        elif t is not float and t is not np.float64:
            return None
    if shape is None or math.prod(shape) <= 1:
        return None
    cols, rows = shape[-1], math.prod(shape[:-1])
    two_d = len(shape) == 2
    flat = [(a if two_d else a.reshape(rows, cols)) if type(a) is np.ndarray and a.ndim
            else float(a) for a in args]
    res = [np.empty(shape, dt) if outs is None else _given(outs[k], shape, dt)
           for k, dt in enumerate(out_dtypes)]
    return flat, res if two_d else [o.reshape(rows, cols) for o in res], shape, res


def _given(o, shape, dt):
    """``o`` where it is a writeable C-contiguous array of ``shape`` and ``dt``, else a new
    array."""
    if (type(o) is np.ndarray and o.shape == shape and o.dtype == dt and o.flags.writeable
            and o.flags.c_contiguous):
        return o
    return _empty(shape, dt)


def _flat(args, out_dtypes, outs=None):
    """Operands and outputs as (rows, cols) blocks, cols = the last axis: arrays of the full
    shape are used in place, a contiguous row broadcast over the leading axes (a bias) stays
    1-D, scalars and size-1 arrays become float64 scalars; anything else is expanded once.
    Outputs are allocated, or the given ``outs`` used where they are contiguous arrays of the
    result shape and dtype. Returns (operands, output blocks, shape, output arrays)."""
    got = _flat_dense(args, out_dtypes, outs)
    if got is not None:
        return got
    shape = _broadcast_shape(args)
    in_order = _in_order(args, shape)
    perm = None if in_order else _common_layout(args, shape)
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
    per_row = None if in_order else _per_row_split(args, shape)
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
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
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


def _broadcast_shape(args):
    """The operands' broadcast shape (NumPy's rule; no call into it where every array operand
    has one shape, as in most rules' passes)."""
    shape = None
    for a in args:
        if isinstance(a, np.ndarray):
            if shape is None:
                shape = a.shape
            elif a.shape != shape:
                return np.broadcast_shapes(*[np.shape(b) for b in args])
        elif not isinstance(a, (float, int, np.generic)):
            return np.broadcast_shapes(*[np.shape(b) for b in args])
    return () if shape is None else shape


def _in_order(args, shape):
    """Every array operand is C-contiguous and of the full ``shape`` or a contiguous row of
    its last axis (a bias), or has one element: the last-axis layout takes them in place."""
    cols = shape[-1] if shape else 1
    for a in args:
        if isinstance(a, np.ndarray) and a.size != 1 and not (
                a.flags.c_contiguous and (a.shape == shape or (
                    a.size == cols and a.shape[-1] == cols))):
            return False
    return True


def _empty(shape, dt):
    """An output array."""
    return np.empty(shape, dt)


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
def _down_loop(x, rel, absl, top, signed, out):
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            y = np.float64(_at(x, i, j))
            z = _lower(y, _at(rel, i, j), _at(absl, i, j), top)
            out[i, j] = 0.0 if signed & (y >= 0) & (z < 0) else z


@numba.njit(cache=True, error_model="numpy")
def _up_loop(x, rel, absl, top, signed, out):
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            y = np.float64(_at(x, i, j))
            z = _upper(y, _at(rel, i, j), _at(absl, i, j), top)
            out[i, j] = 0.0 if signed & (y <= 0) & (z > 0) else z


def down(x, rel, absl, top, out=None, signed=False):
    """``signed``: ``x`` is the exact value's lower end and the rounding keeps its sign (see
    ``_signed``): a result from ``x >= 0`` stays >= 0."""
    (x, rel, absl), (o,), shape, (res,) = _flat((x, rel, absl), (np.float64,),
                                                None if out is None else (out,))
    _down_loop(x, rel, absl, float(top), bool(signed), o)
    return _result(res, shape)


def up(x, rel, absl, top, out=None, signed=False):
    (x, rel, absl), (o,), shape, (res,) = _flat((x, rel, absl), (np.float64,),
                                                None if out is None else (out,))
    _up_loop(x, rel, absl, float(top), bool(signed), o)
    return _result(res, shape)


@numba.njit(cache=True, error_model="numpy")
def _outward_loop(lo, hi, rel, absl, top, signed, olo, ohi):
    for i in range(olo.shape[0]):
        for j in range(olo.shape[1]):
            r, a = _at(rel, i, j), _at(absl, i, j)
            y = np.float64(_at(lo, i, j))
            z = _lower(y, r, a, top)
            olo[i, j] = 0.0 if signed & (y >= 0) & (z < 0) else z
            y = np.float64(_at(hi, i, j))
            z = _upper(y, r, a, top)
            ohi[i, j] = 0.0 if signed & (y <= 0) & (z > 0) else z


def outward(lo, hi, rel, absl, top, signed=False, out=(None, None)):
    """``(down(lo, ...), up(hi, ...))`` of bounds of one shape in one pass; ``out``: arrays
    the results may be written into (each used where it is a contiguous float64 array of
    the shape), else None."""
    (lo, hi, rel, absl), (olo, ohi), shape, (rlo, rhi) = _flat(
        (lo, hi, rel, absl), (np.float64, np.float64),
        None if out[0] is None and out[1] is None else out)
    _outward_loop(lo, hi, rel, absl, float(top), bool(signed), olo, ohi)
    return _result(rlo, shape), _result(rhi, shape)


@numba.njit(inline="always", error_model="numpy")
def _lower(y, r, a, top):
    """``y`` widened down by ``|y|·r + a``; ``top``: the exact magnitude past which the
    rounding may overflow (``max + ulp(max)/2`` for round to nearest). Below ``-top``: where
    ``y`` is inside by more than its float64 error (2^-40 relative), the exact value rounds to
    a finite result and the end is at least ``-top·(1 + 2^-40)``; else ``-inf`` (NaN passes).
    ``|y|`` is taken as at least 2^-968 (``_mag``)."""
    z = y - (_mag(y) * r + a)
    if z < -top:
        return max(z, -top * _EDGE) if y >= -top * _INNER else -math.inf
    return z


@numba.njit(inline="always", error_model="numpy")
def _upper(y, r, a, top):
    z = y + (_mag(y) * r + a)
    if z > top:
        return min(z, top * _EDGE) if y <= top * _INNER else math.inf
    return z



@numba.njit(inline="always", error_model="numpy")
def _mag(y):
    """``|y|`` for a relative widening ``|y|·r``: at most the largest float64, at least
    2^-968, so the product stays normal for r >= 2^-52 -- a subnormal factor or product
    costs Intel cores a microcode assist per multiply, and an exact zero
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
def _signed(l, h, nonneg, nonpos):
    """A correctly rounded or faithful result keeps its exact value's sign (0 is a float and
    rounding is monotone): bounds [l, h] stay >= 0 where every exact value is (``nonneg``),
    <= 0 where every one is <= 0 (an exact 0 widened by the subnormal quantum would make
    sqrt(0/8) NaN)."""
    l = 0.0 if nonneg & (l < 0) & (l > -math.inf) else l     # (±inf: 0·inf, NaN possible)
    h = 0.0 if nonpos & (h > 0) & (h < math.inf) else h
    return l, h


@numba.njit(inline="always", error_model="numpy")
def _add_rounded(al, ah, bl, bh, r, a, top):
    """[al + bl, ah + bh] widened by ``|y|·r + a``, the exact sum's sign kept (a float64 sum
    has its exact value's sign: it is 0 only where that is)."""
    yl, yh = al + bl, ah + bh
    return _signed(_lower(yl, r, a, top), _upper(yh, r, a, top), yl >= 0, yh <= 0)


@numba.njit(inline="always")
def _at_least(y, c):
    """np.maximum(y, c) for float64 y and a non-NaN c: y where y >= c or y is NaN (a -0.0
    against 0.0 stays -0.0, as NumPy's maximum keeps its first operand on ties)."""
    return y if (y >= c) | (y != y) else c


@numba.njit(inline="always")
def _at_most(y, c):
    """np.minimum(y, c) for float64 y and a non-NaN c (NaN kept)."""
    return y if (y <= c) | (y != y) else c


@numba.njit(cache=True, error_model="numpy")
def _add_loop(alo, ahi, blo, bhi, rel, absl, top, lo, hi):
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            l, h = _add_rounded(
                np.float64(_at(alo, i, j)), np.float64(_at(ahi, i, j)),
                np.float64(_at(blo, i, j)), np.float64(_at(bhi, i, j)),
                _at(rel, i, j), _at(absl, i, j), top)
            lo[i, j], hi[i, j] = l, h


def add_bounds(alo, ahi, blo, bhi, rel, absl, top):
    """``down(alo + blo, ...)``, ``up(ahi + bhi, ...)`` in one pass (``rel`` must cover the
    float64 addition's rounding too)."""
    (alo, ahi, blo, bhi, rel, absl), (lo, hi), shape, (rlo, rhi) = _flat(
        (alo, ahi, blo, bhi, rel, absl), (np.float64, np.float64))
    _add_loop(alo, ahi, blo, bhi, rel, absl, float(top), lo, hi)
    return _result(rlo, shape), _result(rhi, shape)


@numba.njit(cache=True, error_model="numpy")
def _exact_points_loop(v, a, b, add, lo, hi):
    n = 0
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            x, z = np.float64(_at(a, i, j)), np.float64(_at(b, i, j))
            if add:
                y = x + z
                bb = y - x
                ok = ((x - (y - bb)) + (z - bb)) == 0.0          # TwoSum's error is 0
            else:
                y = x * z
                ok = (y == 0.0) | (abs(y) >= 2.0 ** -969)        # no underflow
            if ok & (np.float64(_at(v, i, j)) == y) & (abs(y) < math.inf):
                lo[i, j] = y
                hi[i, j] = y
                n += 1
    return n


def exact_points(v, lo, hi, a, b, add):
    """(lo, hi, all): the bounds of ``a + b`` (``add``) or ``a · b`` of two points, with each
    element whose float64 result is exact (TwoSum's error 0; a product of formats of at most
    26 bits that does not underflow) and equals the program's value ``v`` set to that point,
    in one pass; ``all``: every element was."""
    (v, a, b), (lo2, hi2), shape, (rlo, rhi) = _flat((v, a, b), (np.float64, np.float64))
    rlo[...] = lo
    rhi[...] = hi
    n = _exact_points_loop(v, a, b, bool(add), lo2, hi2)
    return _result(rlo, shape), _result(rhi, shape), n == lo2.size


@numba.njit(inline="always", error_model="numpy")
def _mul_rounded(al, ah, bl, bh, r, a, top):
    """The interval product widened by ``|y|·r + a`` (``_lower``/``_upper``), its sign kept
    where the operands' signs fix it (not the corners': a product may underflow to 0)."""
    l, h = _mul_range(al, ah, bl, bh)
    nonneg = ((al >= 0) & (bl >= 0)) | ((ah <= 0) & (bh <= 0))
    nonpos = ((al >= 0) & (bh <= 0)) | ((ah <= 0) & (bl >= 0))
    return _signed(_lower(l, r, a, top), _upper(h, r, a, top), nonneg, nonpos)


@numba.njit(cache=True, error_model="numpy")
def _mul_loop(alo, ahi, blo, bhi, rel, absl, top, lo, hi):
    n = 0
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            l, h = _mul_rounded(np.float64(_at(alo, i, j)), np.float64(_at(ahi, i, j)),
                                np.float64(_at(blo, i, j)), np.float64(_at(bhi, i, j)),
                                _at(rel, i, j), _at(absl, i, j), top)
            lo[i, j], hi[i, j] = l, h
            n += (l == -math.inf) & (h == math.inf)
    return n


def mul_bounds(alo, ahi, blo, bhi, rel, absl, top):
    """(lo, hi, n): the interval product (min/max of the four corner products; NaN operands
    give NaN, a ``0·inf`` corner with no NaN operand gives [-inf, inf]) widened by
    ``rel``/``absl`` (which must cover the float64 product's rounding too), overflow past
    ``top`` to ±inf, in one pass; ``n`` counts the [-inf, inf] results."""
    (alo, ahi, blo, bhi, rel, absl), (lo, hi), shape, (rlo, rhi) = _flat(
        (alo, ahi, blo, bhi, rel, absl), (np.float64, np.float64))
    n = _mul_loop(alo, ahi, blo, bhi, rel, absl, float(top), lo, hi)
    return _result(rlo, shape), _result(rhi, shape), int(n)


@numba.njit(cache=True, error_model="numpy")
def _div_loop(alo, ahi, blo, bhi, rel, absl, top, lo, hi):
    n_zero = 0
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            al, ah = np.float64(_at(alo, i, j)), np.float64(_at(ahi, i, j))
            bl, bh = np.float64(_at(blo, i, j)), np.float64(_at(bhi, i, j))
            c1, c2, c3, c4 = al / bl, al / bh, ah / bl, ah / bh
            nan = (c1 != c1) | (c2 != c2) | (c3 != c3) | (c4 != c4)
            l = math.nan if nan else min(min(c1, c2), min(c3, c4))
            h = math.nan if nan else max(max(c1, c2), max(c3, c4))
            nonneg = ((al >= 0) & (bl > 0)) | ((ah <= 0) & (bh < 0))
            nonpos = ((al >= 0) & (bh < 0)) | ((ah <= 0) & (bl > 0))
            l, h = _signed(_lower(l, rel, absl, top), _upper(h, rel, absl, top), nonneg,
                           nonpos)
            zero = (bl <= 0) & (bh >= 0)
            n_zero += zero
            lo[i, j] = -math.inf if zero else l
            hi[i, j] = math.inf if zero else h
    return n_zero


def div_bounds(alo, ahi, blo, bhi, rel, absl, top):
    """(lo, hi, n): the interval quotient (min/max of the four corner quotients, NaN where
    one is NaN) widened by scalar ``rel``/``absl`` (which must cover the float64 division's
    rounding too), overflow past ``top`` to ±inf, the exact quotient's sign kept
    (``_signed``), and [-inf, inf] where the divisor's interval holds 0 (``n`` of them);
    one pass."""
    (alo, ahi, blo, bhi), (lo, hi), shape, (rlo, rhi) = _flat(
        (alo, ahi, blo, bhi), (np.float64, np.float64))
    n = _div_loop(alo, ahi, blo, bhi, float(rel), float(absl), float(top), lo, hi)
    return _result(rlo, shape), _result(rhi, shape), int(n)


@numba.njit(cache=True, error_model="numpy")
def _affine_loop(xlo, xhi, slo, shi, tlo, thi, r1, a1, r2, a2, top, lo, hi):
    # the product and sum from the mul and add loops' inline helpers (the same code)
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            l, h = _mul_rounded(np.float64(_at(xlo, i, j)), np.float64(_at(xhi, i, j)),
                                np.float64(_at(slo, i, j)), np.float64(_at(shi, i, j)),
                                _at(r1, i, j), _at(a1, i, j), top)
            l, h = _add_rounded(l, h, np.float64(_at(tlo, i, j)), np.float64(_at(thi, i, j)),
                                _at(r2, i, j), _at(a2, i, j), top)
            lo[i, j], hi[i, j] = l, h


def affine_bounds(xlo, xhi, slo, shi, tlo, thi, r1, a1, r2, a2, top):
    """``mul_bounds`` of [xlo, xhi] by [slo, shi] (widened by r1/a1), then ``add_bounds`` of
    [tlo, thi] (r2/a2), in one pass -- the same float64 operations in the same order, so the
    same bounds bit for bit, without the intermediate arrays (a batch norm's x·alpha + beta,
    alpha and beta per channel)."""
    ops, (lo, hi), shape, (rlo, rhi) = _flat((xlo, xhi, slo, shi, tlo, thi, r1, a1, r2, a2),
                                             (np.float64, np.float64))
    _affine_loop(*ops, float(top), lo, hi)
    return _result(rlo, shape), _result(rhi, shape)


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
        # scalar constants skip the array path's overhead
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
# microcode assist per multiply-add; the floor's own width is negligible next to a float32
# ulp.
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
    operand costs Intel cores a microcode assist per multiply, and exact zeros (ReLU,
    padding) would otherwise turn into 2^-1074 and hit it in every later product."""
    r = r0 * (1.0 + 3 * _E)
    return r, (abs(vv) + r) * (1.0 + 3 * _E)


@numba.njit(inline="always", error_model="numpy")
def _left_of_radius(vv, r0, c2):
    """L of one element (float32) from its value and a radius r0 >= max(v - lo, hi - v)."""
    r, ah = _radius_abs_up(vv, r0)
    L = (c2 * ah + r) * (1.0 + 5 * _E)     # c2·ah may underflow: _f32_up covers it
    Lb = 0.0 if (vv == 0.0) & (r0 == 0.0) else _f32_up(L)  # zero-width zeros: L = 0
    return np.float32(Lb)


@numba.njit(cache=True, error_model="numpy")
def _sample_sums_loop(v, r, rows, cols, step):
    s_r = 0.0
    s_a = 0.0
    for i in range(0, rows, step):
        for j in range(cols):
            vv, rr = np.float64(_at(v, i, j)), np.float64(_at(r, i, j))
            s_r += rr
            s_a += abs(vv) + rr
    return s_r, s_a


def _sample_sums(v, r, shape):
    """(Σr, Σ(|v| + r)) of a ball over an even sample of at most 8 rows of the (rows, cols)
    block: they feed a heuristic (is an operand narrow enough for a centre of its own)."""
    rows, cols = shape
    return _sample_sums_loop(v, r, rows, cols, max(1, -(-rows // 8)))


@numba.njit(inline="always", error_model="numpy")
def _right_of_radius(vv, r0):
    """(B̂, r_B) of one element from its value and a radius r0 (``mm_right_ball``)."""
    r, a = _radius_abs_up(vv, r0)
    zero = (vv == 0.0) & (r0 == 0.0)          # exact zeros stay 0 (see _left_of_radius)
    return np.float32(0.0) if zero else _f32_up(a), np.float32(0.0) if zero else _f32_up(r)


@numba.njit(inline="always", error_model="numpy")
def _centred(cc, R, f, a, cb, top, floor, ceil):
    """(lo, hi, bad) of one element of ``center_bounds``. Only the four products can
    underflow (sums of doubles are exact where subnormal), each by at most 2^-1075: one
    final 3·2^-1074 covers them, added last so that an exact zero (R = a = c = 0, the ReLU's
    zeros) never multiplies a subnormal (a microcode assist per product on Intel cores)."""
    rad = (R * f + a) * (1.0 + 4 * _E)
    d = rad * (1.0 + 8 * _E) + min(abs(cc), _MAX) * cb + 3 * _TINY
    y = cc - d
    z = cc + d
    bad = (abs(cc) == math.inf) | (cc != cc) | (d == math.inf) | (y != y) | (z != z)
    y = -math.inf if y < -top else y
    z = math.inf if z > top else z
    return (_at_most(_at_least(y, floor), ceil), _at_most(_at_least(z, floor), ceil), bad)


@numba.njit(cache=True, error_model="numpy")
def _center_loop(c, R, f, a, cb, top, floor, ceil, lo, hi):
    n_bad = 0
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            lo[i, j], hi[i, j], bad = _centred(np.float64(_at(c, i, j)),
                                               np.float64(_at(R, i, j)), _at(f, i, j),
                                               _at(a, i, j), cb, top, floor, ceil)
            n_bad += bad
    return n_bad


def center_bounds(c, R, f, a, top, b=0.0, floor=-math.inf, ceil=math.inf):
    """(lo, hi, n_bad): ``c ∓ (rad·(1+8ε) + |c|·(b + 8ε)·(1+4ε) + 3·2^-1074)``, ``rad >= R·f +
    a`` (see above; ``b·|c|``: a radius term proportional to the centre's magnitude);
    ``n_bad`` counts elements with a non-finite centre, an infinite radius (R or a) or a NaN
    bound: with none, every bound is finite or past ``top``. ``floor``, ``ceil``: then both
    clipped to them (a ball known to be >= floor and <= ceil: a ReLU's, a clamp's)."""
    (c, R, f, a), (lo, hi), shape, (rlo, rhi) = _flat((c, R, f, a), (np.float64, np.float64))
    cb = (float(b) + 8 * _E) * (1.0 + 4 * _E)
    n_bad = _center_loop(c, R, f, a, cb, float(top), float(floor), float(ceil), lo, hi)
    return _result(rlo, shape), _result(rhi, shape), n_bad


@numba.njit(cache=True, error_model="numpy")
def _mm_right_ball_loop(v, r, bh, rb):
    for i in range(bh.shape[0]):
        for j in range(bh.shape[1]):
            bh[i, j], rb[i, j] = _right_of_radius(np.float64(_at(v, i, j)),
                                                  np.float64(_at(r, i, j)))


@numba.njit(cache=True, error_model="numpy")
def _mm_left_ball_loop(v, r, c2, out):
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = _left_of_radius(np.float64(_at(v, i, j)), np.float64(_at(r, i, j)), c2)


def mm_left_ball(v, r, c2):
    """(L, (Σr, Σ(|v| + r), M)) for an operand known as a ball, every execution within ``r``
    of ``v``: the left GEMM factor ``L >= c2·(|v| + r) + r`` as float32 (see above), the sums
    over a sample of rows (``_sample_sums``) and ``M >= max(|v| + r)`` (from max(L)/c2);
    None where L is NaN or infinite."""
    args, (o,), shape, (res,) = _flat((v, r), (np.float32,))
    _mm_left_ball_loop(*args, float(c2), o)
    m = float(o.max()) / c2 * (1.0 + 4 * _E) if o.size and c2 > 0 else math.nan
    if not m < math.inf:
        return None
    s_r, s_a = _sample_sums(args[0], args[1], o.shape)
    return _result(res, shape), (s_r, s_a, m)


def mm_right_ball(v, r):
    """(B̂, r_B, stats) for a ball as a GEMM's right factor: ``B̂ >= |v| + r`` and ``r_B >= r``
    as float32 upper bounds, the stats as ``mm_left_ball``'s; None where B̂ is not finite."""
    args, (bh, rb), shape, (rbh, rrb) = _flat((v, r), (np.float32, np.float32))
    _mm_right_ball_loop(*args, bh, rb)
    m = float(bh.max()) if bh.size else 0.0
    if not m < math.inf:
        return None
    s_r, s_a = _sample_sums(args[0], args[1], bh.shape)
    return _result(rbh, shape), _result(rrb, shape), (s_r, s_a, m)


@numba.njit(cache=True)
def _any_differ_loop(a, b):
    for i in range(a.size):
        if a[i] != b[i]:
            return True
    return False


def any_differ(a, b):
    """``np.any(a != b)`` of two same-shape arrays, stopping at the first difference (an
    interval's bounds usually differ at once)."""
    a, b = np.asarray(a), np.asarray(b)
    if (a.shape == b.shape and a.dtype == b.dtype and a.flags.c_contiguous
            and b.flags.c_contiguous):
        return bool(_any_differ_loop(a.reshape(-1), b.reshape(-1)))
    return bool(np.any(a != b))


@numba.njit(cache=True)
def _transpose_loop(a, out):
    b = 16
    for j0 in range(0, a.shape[1], b):
        for i0 in range(0, a.shape[0], b):
            for j in range(j0, min(j0 + b, a.shape[1])):
                for i in range(i0, min(i0 + b, a.shape[0])):
                    out[j, i] = a[i, j]


def transposed(a):
    """A C-contiguous copy of the 2-D array ``a.T``, in 16x16 tiles written row by row."""
    out = np.empty((a.shape[1], a.shape[0]), a.dtype)
    _transpose_loop(a, out)
    return out


# ---- balls: every execution within ``r`` of the program's value ``v`` -------------------------
def _put_up(out, i, j, x):
    """``out[i, j]`` = an upper bound of x >= 0: x itself in float64, a float32 rounded up
    (``_f32_up``; 0 stays 0, NaN NaN) in a float32 radius; resolved at compile time."""


@overload(_put_up, inline="always")
def _put_up_impl(out, i, j, x):
    if out.dtype == types.float32:
        def put32(out, i, j, x):
            out[i, j] = np.float32(0.0) if x == 0.0 else _f32_up(x)
        return put32

    def put64(out, i, j, x):
        out[i, j] = x
    return put64


def _radius_dtype(v):
    """A ball's radius is float32 (rounded up: half the memory traffic) about a float32 value,
    float64 about anything else."""
    return np.float32 if np.asarray(v).dtype == np.float32 else np.float64


@numba.njit(cache=True, error_model="numpy")
def _ball_radius_loop(v, lo, hi, r):
    n_bad = 0
    for i in range(r.shape[0]):
        for j in range(r.shape[1]):
            vv = np.float64(_at(v, i, j))
            r1, r2 = vv - _at(lo, i, j), _at(hi, i, j) - vv
            r0 = r1 if r1 > r2 else r2
            r0 = math.nan if (r1 != r1) | (r2 != r2) else r0     # a NaN bound: no radius
            _put_up(r, i, j, r0 * (1.0 + 3 * _E))    # a difference: exact or within ε
            n_bad += (r0 != r0) | (r0 == math.inf)
    return n_bad


def ball_radius(v, lo, hi):
    """(r, n_bad): the radius ``r >= max(v - lo, hi - v)`` of a box about the value v (one
    pass); ``n_bad`` counts elements whose radius is NaN or infinite."""
    args, (r,), shape, (rr,) = _flat((v, lo, hi), (_radius_dtype(v),))
    n_bad = _ball_radius_loop(*args, r)
    return _result(rr, shape), n_bad


@numba.njit(inline="always", error_model="numpy")
def _ball_about(cc, vv, R, f, a, cb, top, least):
    """(r, bad) of one element of ``center_ball``: every execution is within d of cc (d the
    half-width of ``_centred``), so within ``r = |v - cc| + d`` (two roundings: 4ε) of v.
    ``bad``: a non-finite centre, value or radius, a box past ``top`` (its end would be
    ±inf), or a radius a float32 would inflate (nonzero under ``least``). Branch-free."""
    d = (R * f + a) * (1.0 + 4 * _E) * (1.0 + 8 * _E) + min(abs(cc), _MAX) * cb + 3 * _TINY
    r0 = (abs(vv - cc) + d) * (1.0 + 4 * _E)
    bad = ((abs(cc) == math.inf) | (r0 != r0) | (r0 == math.inf) | (abs(cc) + d > top)
           | ((r0 > 0.0) & (r0 < least)))
    return r0, bad


@numba.njit(cache=True, error_model="numpy")
def _center_ball_loop(c, v, R, f, a, cb, top, least, r):
    n_bad = 0
    for i in range(r.shape[0]):
        for j in range(r.shape[1]):
            r0, bad = _ball_about(np.float64(_at(c, i, j)), np.float64(_at(v, i, j)),
                                  np.float64(_at(R, i, j)), _at(f, i, j), _at(a, i, j), cb,
                                  top, least)
            _put_up(r, i, j, r0)
            n_bad += bad
    return n_bad


def center_ball(c, v, R, f, a, top, b=0.0):
    """(r, n_bad): ``center_bounds``' box about c as a ball about the value v, ``r >=
    max(v - lo, hi - v)``, in one pass without writing the box (a float32 radius about a
    float32 value); ``n_bad`` as there, plus radii that are not finite or that a float32
    radius would inflate (nonzero under its least value F32_FLOOR: the box is far tighter)."""
    args, (r,), shape, (rr,) = _flat((c, v, R, f, a), (_radius_dtype(v),))
    cb = (float(b) + 8 * _E) * (1.0 + 4 * _E)
    least = F32_FLOOR if r.dtype == np.float32 else 0.0
    n_bad = _center_ball_loop(*args, cb, float(top), least, r)
    return _result(rr, shape), n_bad


@numba.njit(cache=True, error_model="numpy")
def _ball_affine_loop(v, r, r2, g, b, a, out):
    n_bad = 0
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            vv = np.float64(_at(v, i, j))
            rr = ((np.float64(_at(r, i, j)) + np.float64(_at(r2, i, j))) * _at(g, i, j)
                  + abs(vv) * _at(b, i, j) + _at(a, i, j)) * (1.0 + 4 * _E)
            _put_up(out, i, j, rr)
            n_bad += (abs(vv) == math.inf) | (vv != vv) | (rr != rr) | (rr == math.inf)
    return n_bad


def ball_affine(v, r, g, b, a, r2=0.0):
    """(r', n_bad): ``r' >= g·(r + r2) + b·|v| + a`` elementwise (g, b, a arrays -- a row, a
    per-channel column -- or scalars): a ball's radius about a new value (a GEMM's ``R·f + a
    + b·|v|``; a constant added or multiplied; a per-channel affine map, v its input's value;
    the sum of two balls, radii r and r2); ``n_bad`` counts non-finite values or radii."""
    args, (o,), shape, (ro,) = _flat((v, r, r2, g, b, a), (_radius_dtype(v),))
    n_bad = _ball_affine_loop(*args, o)
    return _result(ro, shape), n_bad


@numba.njit(cache=True, error_model="numpy")
def _ball_floor_loop(v, r, c, out):
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            vv = np.float64(_at(v, i, j))
            rr = np.float64(_at(r, i, j))
            # how far above c an execution may get (two roundings, absolute error terms)
            over = (vv + rr - c) + (abs(vv) + rr + abs(c)) * (2 * _E)
            rf = rr if vv > c else (over if over > 0.0 else 0.0)
            _put_up(out, i, j, rf if (vv == vv) & (rr == rr) else math.nan)


def ball_floor(v, r, c):
    """The radius of ``max(x, c)`` about ``max(v, c)`` for x within r of v (a ReLU): r where
    v > c (max is 1-Lipschitz), else how far above c an execution may reach (0: exactly c).
    (A ball cannot say "one-sided": the caller keeps c as the ball's floor.)"""
    args, (o,), shape, (ro,) = _flat((v, r), (np.asarray(r).dtype if np.ndim(r) else
                                              _radius_dtype(v),))
    _ball_floor_loop(*args, float(c), o)
    return _result(ro, shape)


# ---- a centre from float32 parts of a contraction ----------------------------------------------
@numba.njit(cache=True, error_model="numpy")
def _parts_loop(parts, bias, s_coef, C, E):
    for i in range(C.shape[0]):
        for j in range(C.shape[1]):
            c = 0.0
            s = 0.0
            for p in parts:
                x = np.float64(p[i, j])
                c += x
                s += abs(x)
            b = np.float64(_at(bias, i, j))
            C[i, j] = c + b
            E[i, j] = (s + abs(b)) * s_coef * (1.0 + 4 * _E)


@numba.njit(cache=True, error_model="numpy")
def _parts_ball_loop(parts, bias, e_coef, v, R, f, a, cb, top, least, r):
    cols = r.shape[1]
    cs, ss = np.empty(cols), np.empty(cols)       # the row's C and Σ|parts|, in L1
    n_bad = 0
    for i in range(r.shape[0]):
        for j in range(cols):
            b = np.float64(_at(bias, i, j))
            cs[j] = b
            ss[j] = abs(b)
        for k in range(len(parts)):
            p = parts[k]
            for j in range(cols):
                x = np.float64(_at(p, i, j))
                cs[j] += x
                ss[j] += abs(x)
        for j in range(cols):
            aa = (np.float64(_at(a, i, j)) + ss[j] * e_coef) * (1.0 + 8 * _E)
            r0, bad = _ball_about(cs[j], np.float64(_at(v, i, j)), np.float64(_at(R, i, j)),
                                  _at(f, i, j), aa, cb, top, least)
            _put_up(r, i, j, r0)
            n_bad += bad
    return n_bad


def parts_ball(parts, bias, e_coef, v, R, f, a, top, b=0.0):
    """(r, n_bad): ``center_ball`` of the centre ``C = Σ parts + bias`` with ``a`` raised by
    ``e_coef·(Σ|parts| + |bias|)``, read from the parts in one pass: ``parts_sum``,
    ``scale_up`` and ``center_ball`` without writing C or its error term."""
    n = len(parts)
    args, (r,), shape, (rr,) = _flat(tuple(parts) + (bias, v, R, f, a), (_radius_dtype(v),))
    cb = (float(b) + 8 * _E) * (1.0 + 4 * _E)
    least = F32_FLOOR if r.dtype == np.float32 else 0.0
    n_bad = _parts_ball_loop(tuple(args[:n]), args[n], float(e_coef), *args[n + 1:], cb,
                             float(top), least, r)
    return _result(rr, shape), n_bad


def parts_sum(parts, bias, s_coef):
    """(C, E): the float64 sum C of float32 arrays of one shape, left to right, plus a bias
    (a row, a per-row column or a scalar, as ``_flat`` lays it out), and ``E >=
    s_coef·(Σ|parts| + |bias|)`` (one pass; the caller's bound of C's error)."""
    shape = parts[0].shape
    args, (C, E), shape, (rC, rE) = _flat((parts[0], bias), (np.float64, np.float64))
    cols = C.shape[1]
    blocks = tuple(np.ascontiguousarray(p, np.float32).reshape(-1, cols) for p in parts)
    _parts_loop(blocks, args[1], float(s_coef), C, E)
    return _result(rC, shape), _result(rE, shape)
