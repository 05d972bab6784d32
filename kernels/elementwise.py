"""Elementwise kernels NumPy lacks: ``erf`` and a correctly rounded ``fma``.

* ``erf``: the C library's ``erf``/``erff`` (via numba's ``math.erf``), vectorized. float16,
  bfloat16 and fp8 inputs are evaluated in float32 and rounded back once, as NumPy does for
  float16 ufuncs.
* ``fma(a, b, c)``: a*b + c with one rounding (IEEE 754 fusedMultiplyAdd).
  float64 uses LLVM's ``llvm.fma.f64`` intrinsic (correctly rounded on every target: hardware
  FMA or libm's software fma). For formats with p <= 26 the product a*b is exact in float64,
  so ``s, e = TwoSum(a*b, c)`` represents a*b + c exactly and one integer-domain rounding of
  the pair (``fpx.formats.round(s, fmt, residual=e)``) is the correctly rounded result
  (Knuth's TwoSum; Boldo & Melquiond, "Emulation of FMA and correctly rounded sums", 2008).
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic


@numba.vectorize(["float32(float32)", "float64(float64)"], cache=True)
def _erf(x):
    return math.erf(x)


def erf(x):
    """Error function, elementwise (libm erf/erff)."""
    x = np.asarray(x)
    if x.dtype in (np.float32, np.float64):
        return _erf(x)
    if x.dtype.kind in "iub":
        return _erf(x.astype(np.float64))
    return _erf(x.astype(np.float32)).astype(x.dtype)


@intrinsic
def _llvm_fma(typingctx, a, b, c):
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return sig, codegen


@numba.vectorize(["float64(float64, float64, float64)"], cache=True)
def _fma64(a, b, c):
    return _llvm_fma(a, b, c)


def two_sum(a, b):
    """Knuth's TwoSum: s = fl(a + b) and the exact error e with a + b = s + e (float64)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def fma(a, b, c, dtype=None):
    """Correctly rounded a*b + c in the result dtype of NumPy's promotion of the operands."""
    from fpx import formats
    dtype = np.result_type(a, b, c) if dtype is None else np.dtype(dtype)
    if dtype == np.float64:
        return _fma64(np.asarray(a, np.float64), np.asarray(b, np.float64),
                      np.asarray(c, np.float64))
    fmt = formats.get(dtype)
    if fmt.p > 26:
        raise TypeError(f"fpx.kernels.fma: unsupported dtype {dtype}")
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.asarray(a, np.float64) * np.asarray(b, np.float64)   # exact: 2p <= 53 bits
        s, e = two_sum(p, np.asarray(c, np.float64))
    e = np.where(np.isfinite(s), e, 0.0)
    return formats.round(s, fmt, "rn", residual=e)
