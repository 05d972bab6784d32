"""Fused checksum and statistics passes of ``fpx.abft`` (numba): everything one row check
needs from an operand or the result, in one read of it.

``row_pass(X, w1, w2, v1, v2, keys, out, ext)`` reduces every row ``x`` of ``X`` ((Gx, R, L), any
strides; Gx = 1 broadcasts over the batch) to

    out[0] = Σ x_j            out[1] = Σ x_j w1_j       out[2] = Σ x_j w2_j
    out[3] = Σ |x_j| v1_j     out[4] = Σ |x_j| v2_j     ext: max x, min x (as order keys)

(``out``: (5, G, R); a weight vector of None skips its sum; ``keys`` None skips the extrema;
each weight is (Gw, L), Gw = 1 broadcasting). The three passes of a row check of
C = A B are then: B with w1 = (1..N) (its row sums r1 and r2), A with w1 = B r1, w2 = B r2
(the two predicted checksums A (B r), and A's statistics), C with w1 = (1..N) (the observed
checksums C r).

Float data is accumulated in float64 (float32 operands are widened in registers, never
copied), integer data in its own 64-bit type (wrapping, exact modulo 2^64 as NumPy's integer
matmul is). Each row is summed by one thread, in the order of the compiled loop (vector lanes
combined at the end: ``fastmath`` reassociation only, no FMA contraction, no assumption about
NaN or inf), so the results do not depend on the thread count; the extrema are exact (integer
max and min of order keys).
"""
from __future__ import annotations

import os
import threading

import numba
import numpy as np
from numba import types
from numba.extending import overload

__all__ = ["row_pass", "keys_to_floats"]

_SUM = dict(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})


def _wide(v):
    """``v`` in the accumulator's type: float64 for floats, unchanged for integers."""


@overload(_wide, inline="always")
def _wide_impl(v):
    if isinstance(v, types.Float):
        return lambda v: np.float64(v)
    return lambda v: v


def _zero(x):
    """A zero of the accumulator's type for the elements of array ``x``."""


@overload(_zero, inline="always")
def _zero_impl(x):
    if isinstance(x.dtype, types.Float):
        return lambda x: np.float64(0.0)
    if x.dtype == types.uint64:
        return lambda x: np.uint64(0)
    return lambda x: np.int64(0)


def _pick(w, g):
    """Row ``g`` of a (Gw, L) weight, Gw = G or 1 (row 0, broadcast); None stays None."""


@overload(_pick, inline="always")
def _pick_impl(w, g):
    if isinstance(w, types.NoneType):
        return lambda w, g: None
    return lambda w, g: w[min(g, w.shape[0] - 1)]


@numba.njit(**_SUM)
def _sums(x, w1, w2, v1, v2):
    """(Σx, Σx·w1, Σx·w2, Σ|x|·v1, Σ|x|·v2) of one row, in the accumulator's type."""
    s0 = s1 = s2 = s3 = s4 = _zero(x)
    for j in range(x.size):
        v = _wide(x[j])
        s0 += v
        if w1 is not None:
            s1 += v * w1[j]
        if w2 is not None:
            s2 += v * w2[j]
        if v1 is not None:
            s3 += abs(v) * v1[j]
        if v2 is not None:
            s4 += abs(v) * v2[j]
    return s0, s1, s2, s3, s4


def _key(b):
    """The order key of a float's bits ``b`` (int32 or int64): the magnitude bits flipped where
    the sign is set, so keys order as the floats do (-0 < +0, NaNs beyond the infinities); the
    map is its own inverse."""


@overload(_key, inline="always")
def _key_impl(b):
    if b.bitwidth == 32:        # numba widens int32 arithmetic: narrowed back, it vectorizes
        return lambda b: np.int32(b ^ np.int32(np.int32(b >> 31) & np.int32(0x7FFFFFFF)))
    return lambda b: b ^ ((b >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))


@numba.njit(cache=True, nogil=True)
def _extrema(k):
    """(max, min) of the order keys of one non-empty row of float bits ``k``: integer max and
    min vectorize (float ones do not, in numba)."""
    hi = lo = _key(k[0])
    for j in range(1, k.size):
        b = _key(k[j])
        hi = max(hi, b)
        lo = min(lo, b)
    return hi, lo


@numba.njit(**_SUM)
def _row_pass(X, w1, w2, v1, v2, keys, out, ext, lo, hi):
    """:func:`row_pass` for the rows (jobs g·R + r) ``lo`` to ``hi``."""
    R = out.shape[2]
    Gx = X.shape[0]
    for job in range(lo, hi):
        g = job // R
        r = job - g * R
        gx = min(g, Gx - 1)
        s = _sums(X[gx, r], _pick(w1, g), _pick(w2, g), _pick(v1, g), _pick(v2, g))
        for q in range(5):
            out[q, g, r] = s[q]
        if keys is not None and X.shape[2]:
            a, b = _extrema(keys[gx, r])
            ext[0, g, r] = a
            ext[1, g, r] = b


@numba.njit(**_SUM)
def _col_sums(Xs, w1, w2, v1, v2, acc):
    """acc[q, r] += the sums of :func:`_sums` for the rows r of ``Xs`` (R', L), read column
    by column (its columns are contiguous); each row's sum sequential in j."""
    for j in range(Xs.shape[1]):
        x = Xs[:, j]
        for r in range(x.size):
            v = _wide(x[r])
            acc[0, r] += v
            if w1 is not None:
                acc[1, r] += v * w1[j]
            if w2 is not None:
                acc[2, r] += v * w2[j]
            if v1 is not None:
                acc[3, r] += abs(v) * v1[j]
            if v2 is not None:
                acc[4, r] += abs(v) * v2[j]


@numba.njit(cache=True, nogil=True)
def _col_extrema(ks, ext, g, r0):
    """ext[:, g, r0 + r] = the max and min order keys of the rows r of ``ks`` (R', L > 0),
    read column by column."""
    hi = np.empty(ks.shape[0], ks.dtype)
    for r in range(ks.shape[0]):
        hi[r] = _key(ks[r, 0])
    lo = hi.copy()
    for j in range(1, ks.shape[1]):
        k = ks[:, j]
        for r in range(k.size):
            b = _key(k[r])
            hi[r] = max(hi[r], b)
            lo[r] = min(lo[r], b)
    ext[0, g, r0:r0 + hi.size] = hi
    ext[1, g, r0:r0 + hi.size] = lo


@numba.njit(**_SUM)
def _col_pass(X, w1, w2, v1, v2, keys, out, ext, lo, hi):
    """:func:`row_pass` for the rows ``lo`` to ``hi`` of an ``X`` whose rows are strided and
    columns contiguous (a transposed or Fortran-order operand): read in memory order, each
    row's sums sequential in its own order (lanes across rows, no reassociation)."""
    R, L = out.shape[2], X.shape[2]
    Gx = X.shape[0]
    for g in range(lo // R, (hi - 1) // R + 1):
        r0, r1 = max(lo - g * R, 0), min(hi - g * R, R)
        gx = min(g, Gx - 1)
        acc = np.zeros((5, r1 - r0), out.dtype)
        _col_sums(X[gx, r0:r1], _pick(w1, g), _pick(w2, g), _pick(v1, g), _pick(v2, g), acc)
        out[:, g, r0:r1] = acc
        if keys is not None and L:
            _col_extrema(keys[gx, r0:r1], ext, g, r0)


_POOL = [None, None]          # (the process that made it, its ThreadPoolExecutor)
_MIN_SPLIT = 2 ** 16          # elements below which one thread does it all


def _pool(n):
    """A private pool of ``n`` threads (a new one in a forked child: its threads are gone)."""
    if _POOL[0] != os.getpid() or _POOL[1]._max_workers != n:
        from concurrent.futures import ThreadPoolExecutor
        if _POOL[0] == os.getpid():          # another size: the old pool's threads end
            _POOL[1].shutdown(wait=False)
        _POOL[:] = [os.getpid(), ThreadPoolExecutor(n, thread_name_prefix="fpx-abft")]
    return _POOL[1]


def row_pass(X, w1, w2, v1, v2, keys, out, ext, threads=None):
    """See the module docstring; ``out`` (5, G, R) of the accumulator's dtype. ``keys``: None,
    or ``X`` viewed as same-size signed integers, whose order keys (:func:`_key`) have their
    row max and min written to ``ext`` (2, G, R) (decode with :func:`keys_to_floats`).

    Where X's rows are strided and its columns contiguous, :func:`_col_pass` reads it in
    memory order instead. The rows are split in contiguous ranges, taken in turn by
    ``threads`` threads (None: ``numba.get_num_threads()``) -- the caller's and a private
    pool's (a numba
    ``prange`` team would spin after the pass, taking the cores from the BLAS call that
    follows); every row is one thread's, so the results do not depend on the split."""
    args = (X, w1, w2, v1, v2, keys, out, ext)
    kernel = _col_pass if X.shape[2] > 1 and abs(X.strides[1]) < abs(X.strides[2]) \
        else _row_pass
    jobs = out.shape[1] * out.shape[2]
    n = min(threads or numba.get_num_threads(), jobs, max(1, X.size // _MIN_SPLIT))
    if n <= 1:
        kernel(*args, 0, jobs)
        return
    parts = min(jobs, 4 * n)             # pulled from a shared counter: a thread slowed by
    cuts = [jobs * t // parts for t in range(parts + 1)]       # another job takes fewer
    order, lock = iter(range(parts)), threading.Lock()

    def work():
        while True:
            with lock:
                t = next(order, None)
            if t is None:
                return
            kernel(*args, cuts[t], cuts[t + 1])
    futures = [_pool(n - 1).submit(work) for _ in range(n - 1)]
    work()
    for f in futures:                    # one that has not started has nothing left to do
        if not f.cancel():
            f.result()


def keys_to_floats(ext, dtype):
    """The floats (as float64) whose order keys ``ext`` holds (``_key``, its own inverse)."""
    k = np.asarray(ext)
    k = k ^ ((k >> (8 * k.itemsize - 1)) & np.array(np.iinfo(k.dtype).max, k.dtype))
    return k.view(dtype).astype(np.float64)
