"""The matmul rule's engines: upper bounds of GEMMs and convolutions of nonnegative factors,
and float64 centres. Whichever engine runs, its result bounds the exact one (``R·f + a``),
so the choice moves speed and width, never soundness.

* float32 BLAS on upper float32 copies: every product and partial sum of nonnegative terms
  loses at most u32 relative or 2^-150 absolute, so ``L @ M <= (R + K·2^-150)/(1 - γ_{K+1})``;
* bfloat16 on AMX (``kernels/bf16.py``: operands rounded up, float32 accumulation, a
  bfloat16 output), for value-centred radii where a CPU has AMX tiles;
* a convolution's on oneDNN (bfloat16 on AMX, else float32);
* float64 where float32 overflows, and for centres: ``|C - exact| <= γ_{K+2}(u64)·Σ|x·w|``.
"""
from __future__ import annotations

import math
import threading

import numpy as np

from fpx.kernels import bf16 as _bf16
from fpx.kernels import blas as _blas
from fpx.kernels import conv as _kconv
from fpx.kernels import interval as _K
from fpx.transforms.interval.enclosure import gamma, gamma64, up

U32 = 2.0 ** -24


_SCRATCH = threading.local()


def _scratch(shape, dtype, slot):
    """A thread-local buffer reused across calls for an operand that lives only inside one
    rule (|W|, a float64 copy of weights): a fresh multi-MB array costs a page fault per
    4 KiB page, often more than the pass that fills it."""
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    key = (slot, tuple(shape), np.dtype(dtype).str)
    buf = bufs.get(key)
    if buf is None:
        if len(bufs) > 16:
            bufs.clear()
        buf = bufs[key] = np.empty(shape, dtype)
    return buf


def magnitude(x, slot):
    """|x| (exact, x's dtype) in a reused buffer ``slot`` (see ``_scratch``)."""
    x = np.asarray(x)
    if not x.ndim or x.dtype.kind != "f":
        return np.abs(x)
    return np.abs(x, out=_scratch(x.shape, x.dtype, slot))


def float64_copy(x, slot):
    """A float64 copy of x (exact for narrower formats) in a reused buffer ``slot``."""
    x = np.asarray(x)
    if x.dtype == np.float64 or not x.ndim:
        return np.asarray(x, np.float64)
    buf = _scratch(x.shape, np.float64, slot)
    np.copyto(buf, x, casting="unsafe")
    return buf


def gemm(A, B):
    """``A @ B`` for the bound's own GEMMs (any summation order is covered): a stack of
    matrices times one matrix runs as one tall GEMM."""
    A, B = np.asarray(A), np.asarray(B)
    if A.ndim > 2 and B.ndim == 2:
        return _blas.matmul(A.reshape(-1, A.shape[-1]), B).reshape(A.shape[:-1] + B.shape[-1:])
    return _blas.matmul(A, B)


def f32_upper(X):
    """A float32 array >= X elementwise (X >= 0): narrow formats convert exactly; float64 is
    rounded up, zeros kept and nonzero values at least 2^-102 (no subnormal GEMM operands)."""
    X = np.asarray(X)
    if X.dtype == np.float32:
        return X
    if X.dtype in (np.float16,) or X.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return X.astype(np.float32)
    return _K.f32_upper(X)


def _amx():
    """The CPU runs oneDNN's bfloat16 kernels on AMX tiles (on AVX512-BF16 without AMX the
    float32 radius convolution is the faster one)."""
    torch = _kconv._torch()
    return bool(torch and _bf16.amx(torch))


def _bf16_runs(L, M):
    """Whether the bfloat16 GEMM on AMX runs for float32 L @ M (large enough to pay)."""
    return (type(L) is np.ndarray and L.dtype == np.float32 and type(M) is np.ndarray
            and M.dtype == np.float32 and L.ndim >= 2 and M.ndim >= 2
            and math.prod(L.shape) * M.shape[-1] >= 2 ** 21 and _amx())


def _finite(R):
    """Every element of the nonnegative R is finite (one reduction, no mask; NaN fails)."""
    return not np.size(R) or float(np.max(R)) < math.inf


def upper_gemm(L, M, K, small, scale=1.0, add=0.0, bf16=False):
    """(R, f, a) with ``scale·(L @ M) + add <= R·f + a`` for nonnegative L, M. ``small`` (a
    float32-or-narrower program): in float32 (``bf16``: on AMX where it runs), else and where
    float32 overflows in float64."""
    if small:
        Lf, Mf = f32_upper(L), f32_upper(M)
        if bf16 and _bf16_runs(Lf, Mf):
            R, f, a = _bf16.matmul_upper(_kconv._torch(), Lf, Mf)
            if _finite(R):
                return R, up(scale * f, 1), up(scale * a, 1) + add
        with np.errstate(all="ignore"):
            R = gemm(Lf, Mf)
        if _finite(R):
            corr = scale / (1.0 - gamma(K + 1, U32))
            return R, corr, corr * K * 2.0 ** -150 + add
    with np.errstate(all="ignore"):
        R = gemm(np.asarray(L, np.float64), np.asarray(M, np.float64))
    return R, scale * (1.0 + gamma64(K)), add


def upper_gemm_sum(L, M, L2, M2, K, small, scale=1.0):
    """(R, f, a) with ``scale·(L @ M + L2 @ M2) <= R·f + a`` for nonnegative factors of one
    batch shape, K terms in each product: where the BLAS engine accumulates the second GEMM
    into the first's result (``kernels.blas.matmul_sum``: each element one float32 sum of
    all 2K products, in some order), no concatenated copies of the factors; elsewhere the
    concatenated factors as one GEMM of 2K terms (``upper_gemm``)."""
    # (a broadcast is a read-only view, which torch does not take: only where one is needed)
    L2 = L2 if np.shape(L2) == np.shape(L) else np.broadcast_to(L2, np.shape(L))
    M2 = M2 if np.shape(M2) == np.shape(M) else np.broadcast_to(M2, np.shape(M))
    if small:
        Lf, Mf, L2f, M2f = (f32_upper(z) for z in (L, M, L2, M2))
        with np.errstate(all="ignore"):
            R = _blas.matmul_sum(Lf, Mf, L2f, M2f)
        if R is not None and _finite(R):
            corr = scale / (1.0 - gamma(2 * K + 1, U32))
            return R, corr, corr * 2 * K * 2.0 ** -150
    cast = f32_upper if small else (lambda x: np.asarray(x, np.float64))
    Ls = np.concatenate([cast(L), cast(L2)], axis=-1)
    Ms = np.concatenate([cast(M), cast(M2)], axis=-2 if np.ndim(M) > 1 else 0)
    return upper_gemm(Ls, Ms, 2 * K, small, scale)


def upper_conv(L, W, bias, conv_params, K, scale, run, bf16):
    """(R, f, a) with ``scale·conv(L, W) (+ bias as one more term) <= R·f + a`` for
    nonnegative float32 L, W, bias: oneDNN in bfloat16 on AMX (``bf16``), else the
    convolution in float32 by ``run(L, W, bias)`` (the interpreter's parent)."""
    p = conv_params
    if bf16 and _amx():
        got = _kconv.conv_upper_bf16(L, W, bias, p["stride"], p["padding"], p["dilation"],
                                     p["groups"])
        if got is not None and _finite(got[0]):
            R, f, a = got
            return R, up(scale * f, 1), up(scale * a, 1)
    R = np.asarray(run(L, W, bias))
    f = up(scale / (1.0 - gamma(K + 1, U32)), 1)
    return R, f, f * K * 2.0 ** -150


def centre_conv(x, w, b, conv_params, run):
    """conv(x, w) (+ b) in float64 (exact products; ``|C - exact| <= γ_{K+2}(u64)·Σ|x·w|``):
    torch's float64 convolution where oneDNN runs the float32 one (one thread pool), else by
    ``run`` on float64 copies."""
    p = conv_params
    C = _kconv.conv_exact_f32(x, w, b, p["stride"], p["padding"], p["dilation"], p["groups"])
    if C is None:
        C = run(np.asarray(x, np.float64), np.asarray(w, np.float64),
                None if b is None else np.asarray(b, np.float64))
    return np.asarray(C)
