"""The checksums and operand statistics of one row check of ``C = A @ B`` (A (Ga, M, K),
B (Gb, K, N), C (G, M, N); Ga, Gb = G or 1), computed by the fused numba passes
(:mod:`fpx.kernels.abft`: one read of B, of A and of C) or by plain NumPy (the reference the
tests hold the fused path to), behind one call, :func:`row_sums`.

With r1 = (1, ..., 1) and r2 = (1, ..., N):

    b1 = B r1, b2 = B r2          chk = A b1, chk2 = A b2     (predicted: GEMVs)
    obs = C r1, obs2 = C r2                                   (observed)

(the r2 sums only on request: they locate a fault, and are computed once one is detected),
plus, where the threshold needs them, the row sums, maxima and minima of A and B (V-ABFT's
means and variance bounds, A-ABFT's max |A_i|) and the absolute sums rb = |B| r1,
P = |A| rb, Q = |A| |b1|, R = |C| r1 (the rigorous bound). Float data is summed in float64
(float32 and narrower values exactly widened), integers in their 64-bit type (exact modulo
2^64, as NumPy's integer matmul). The two paths differ only in summation order: agreement to
float64 round-off for float data, bitwise for integers.
"""
from __future__ import annotations

import numpy as np

__all__ = ["Sums", "row_sums", "input_sums", "output_sums", "KERNELS"]

KERNELS = ("fused", "numpy")


class Sums:
    """One row check's sums (see the module docstring); None where not computed. ``b*``:
    (Gb, K); ``a_*``: (Ga or G', M); ``chk*``, ``P``, ``Q``: (G', M), G' = max(Ga, Gb);
    ``obs*``, ``R``: (G, M). Float data: float64; integers: the accumulator's dtype.
    ``kernel``, ``weighted``, ``absolute``, ``dtype``, ``threads``: how :func:`input_sums`
    made them."""

    __slots__ = ("b1", "b2", "chk", "chk2", "obs", "obs2", "a_sum", "a_max", "a_min",
                 "b_max", "b_min", "rb", "P", "Q", "R", "kernel", "weighted", "absolute", "dtype",
                 "threads")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))


def row_sums(A, B, C, *, weighted=False, ext=False, absolute=False, kernel="fused",
             threads=1) -> Sums:
    """The r1 checksums of the row check of C = A @ B, plus the r2 ones (``weighted``: what
    locates a fault), the extrema and sums of A and B (``ext``) and the absolute sums
    (``absolute``), by ``kernel`` ("fused" or "numpy"): :func:`input_sums` then
    :func:`output_sums`. ``threads``: the fused passes' threads; 1, the calling thread, by
    default -- right before and after a GEMM the BLAS's workers spin on the other cores, and
    a pass thread sharing a core with one keeps the caller waiting for a time slice (None:
    ``numba.get_num_threads()``)."""
    s = input_sums(A, B, weighted=weighted, ext=ext, absolute=absolute, kernel=kernel,
                   threads=threads)
    return output_sums(s, C)


def input_sums(A, B, *, weighted=False, ext=False, absolute=False, kernel="fused",
               threads=1) -> Sums:
    """The operands' part of :func:`row_sums` (b*, chk*, a_*, P, Q): computable before the
    GEMM runs, from the operands it reads."""
    if kernel not in KERNELS:
        raise ValueError(f"fpx.abft: kernel must be one of {KERNELS}, got {kernel!r}")
    if not A.dtype == B.dtype or A.dtype.kind not in "fiu":
        raise TypeError(f"fpx.abft: checksums of {A.dtype} @ {B.dtype}: the operands must "
                        "share one float or 64-bit integer dtype")
    if A.dtype.kind in "iu" and (ext or absolute):
        raise ValueError("fpx.abft: integer GEMMs are checked exactly: no statistics")
    with np.errstate(all="ignore"):
        s = _fused_in(A, B, weighted, ext, absolute, threads) if kernel == "fused" else \
            _plain_in(A, B, weighted, ext, absolute)
    s.kernel, s.weighted, s.absolute, s.dtype = kernel, weighted, absolute, A.dtype
    s.threads = threads
    return s


def output_sums(s: Sums, C) -> Sums:
    """``s`` (from :func:`input_sums`) completed with C's sums (obs, obs2, R), in place."""
    if C.dtype != s.dtype:
        raise TypeError(f"fpx.abft: checksums of {s.dtype} @ {s.dtype} -> {C.dtype}: the "
                        "operands and result must share one float or 64-bit integer dtype")
    with np.errstate(all="ignore"):
        (_fused_out if s.kernel == "fused" else _plain_out)(s, C)
    return s


def _acc(dt):
    return np.dtype(np.float64) if dt.kind == "f" else dt


# ---------------------------------------------------------------------------------------------
# plain NumPy: the reference
# ---------------------------------------------------------------------------------------------
def _gemv(X, w):
    """X (G|1, R, L) times w (G|1, L) in w's dtype (X widened: a copy, fine for the
    reference)."""
    return np.einsum("...rl,...l->...r", X.astype(w.dtype, copy=False), w)


def _plain_in(A, B, weighted, ext, absolute):
    acc = _acc(A.dtype)
    b1 = B.sum(axis=-1, dtype=acc)
    s = Sums(b1=b1, chk=_gemv(A, b1))
    if weighted:
        s.b2 = _gemv(B, np.arange(1, B.shape[-1] + 1, dtype=acc))
        s.chk2 = _gemv(A, s.b2)
    if ext:
        s.a_sum = A.sum(axis=-1, dtype=acc)
        s.a_max, s.a_min = (f(A, axis=-1).astype(acc) for f in (np.max, np.min))
        s.b_max, s.b_min = (f(B, axis=-1).astype(acc) for f in (np.max, np.min))
    if absolute:
        absA = np.abs(A)
        s.rb = np.abs(B).sum(axis=-1, dtype=acc)
        s.P, s.Q = _gemv(absA, s.rb), _gemv(absA, np.abs(b1))
    return s


def _plain_out(s, C):
    acc = _acc(C.dtype)
    s.obs = C.sum(axis=-1, dtype=acc)
    if s.weighted:
        s.obs2 = _gemv(C, np.arange(1, C.shape[-1] + 1, dtype=acc))
    if s.absolute:
        s.R = np.abs(C).sum(axis=-1, dtype=acc)


# ---------------------------------------------------------------------------------------------
# fused numba passes
# ---------------------------------------------------------------------------------------------
def _rows(X, G, w1=None, w2=None, v1=None, v2=None, ext=False, threads=1):
    """``kernels.abft.row_pass`` over X's rows for G batch entries: (out (5, G, R), extrema
    (max, min) as float64 or None)."""
    from fpx.kernels import abft as K
    acc = _acc(X.dtype)
    out = np.empty((5, G, X.shape[1]), acc)
    keys = X.view(np.dtype(f"i{X.itemsize}")) if ext else None
    kx = np.empty((2, G, X.shape[1]), keys.dtype) if ext else None
    K.row_pass(X, w1, w2, v1, v2, keys, out, kx, threads)
    return out, (K.keys_to_floats(kx, X.dtype) if ext else None)


def _fused_in(A, B, weighted, ext, absolute, threads):
    acc = _acc(A.dtype)
    N = B.shape[-1]
    r2 = np.arange(1, N + 1, dtype=acc)[None] if weighted else None
    ones = np.ones((1, N), acc) if absolute else None
    ob, eb = _rows(B, B.shape[0], w1=r2, v1=ones, ext=ext, threads=threads)
    b1, b2 = ob[0], (ob[1] if weighted else None)
    rb = ob[3] if absolute else None
    oa, ea = _rows(A, max(A.shape[0], B.shape[0]), w1=b1, w2=b2, v1=rb,
                   v2=np.abs(b1) if absolute else None, ext=ext, threads=threads)
    s = Sums(b1=b1, b2=b2, chk=oa[1])
    if weighted:
        s.chk2 = oa[2]
    if ext:
        s.a_sum, (s.a_max, s.a_min), (s.b_max, s.b_min) = oa[0], ea, eb
    if absolute:
        s.rb, s.P, s.Q = rb, oa[3], oa[4]
    return s


def _fused_out(s, C):
    acc = _acc(C.dtype)
    N = C.shape[-1]
    r2 = np.arange(1, N + 1, dtype=acc)[None] if s.weighted else None
    oc, _ = _rows(C, C.shape[0], w1=r2, v1=np.ones((1, N), acc) if s.absolute else None,
                  threads=s.threads)
    s.obs = oc[0]
    if s.weighted:
        s.obs2 = oc[1]
    if s.absolute:
        s.R = oc[3]
