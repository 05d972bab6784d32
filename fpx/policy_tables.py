"""The documented error tables the precision presets (:mod:`fpx.policy`) are built from: the
maximum errors NumPy's and CUDA's math libraries state per function, with their sources, and
the input-dependent bounds of CUDA's ``-use_fast_math`` intrinsics.

Numbers are "documented maximum error against the correctly rounded result"; :mod:`fpx.policy`
adds the 0.5 ulp from the correctly rounded result to the exact one (and, for NumPy, a 0.5 ulp
margin). The fast-math functions take the operation's float64 inputs and return ulps or an
absolute error per element.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

#: relative widening of a computed bound, so that its own rounding cannot make it too small
SLACK = 2.0 ** -50

# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------
SRC_IEEE = "IEEE 754 correctly rounded (round to nearest)"
SRC_EXACT = "exact operation"
SRC_NUMPY_CSV = ("NumPy umath-validation-set-<f>.csv max ulp tolerance (vs the correctly "
                 "rounded result)")
SRC_SVML_LA = "Intel SVML/VM LA accuracy class: max 4 ulp (NumPy float32 SVML loops)"
SRC_SVML_HA = "Intel SVML/VM HA accuracy class: max 1 ulp (NumPy float64 SVML loops)"
SRC_GLIBC = ("glibc sysdeps/x86_64/fpu/libm-test-ulps (the manual's 'Errors in Math "
             "Functions' table)")
SRC_CUDA = ("CUDA C++ Programming Guide, Mathematical Functions, Standard Functions "
            "max ulp table (vs correctly rounded) + 0.5")
SRC_CUDA_INTR = "CUDA C++ Programming Guide, Intrinsic Functions (-use_fast_math)"
SRC_FASI = ("tensor-core accumulation rounds toward zero: <= 1 ulp per addition (Fasi, "
            "Higham, Mikaitis, Pranesh, PeerJ CS 7:e330, 2021)")


# --------------------------------------------------------------------------------------------
# "numpy": NumPy's own SIMD kernels, Intel SVML and glibc on x86-64
# --------------------------------------------------------------------------------------------
# name: (float32 documented max ulps vs CR and sources, float64 documented max ulps and sources)
# bound = max(documented) + 0.5 (CR -> exact) + 0.5 (margin: documented numbers are test-derived)
NUMPY_DOC = {
    #          float32 documented                          float64 documented
    "exp":   ((3, "NumPy csv 3 (own AVX512F/AVX2 kernel); glibc expf 1"),
              (1, "NumPy csv 1 (own AVX512F kernel); glibc exp 1")),
    "log":   ((4, "NumPy csv 4 (own AVX512F/AVX2 kernel); glibc logf 1"),
              (1, "NumPy csv 1 (own AVX512F kernel); glibc log 1")),
    "expm1": ((4, "SVML LA 4; NumPy csv 3; glibc expm1f 1"),
              (1, "SVML HA 1; NumPy csv 1; glibc expm1 1")),
    "exp2":  ((4, "SVML LA 4; NumPy csv 2 (measured here: 2.1 vs CR); glibc exp2f 1"),
              (1, "SVML HA 1; NumPy csv 1; glibc exp2 1")),
    "log1p": ((4, "SVML LA 4; NumPy csv 2; glibc log1pf 1"),
              (1, "SVML HA 1; NumPy csv 1; glibc log1p 1")),
    "log2":  ((4, "SVML LA 4; NumPy csv 3; glibc log2f 1"),
              (2, "glibc log2 2; SVML HA 1; NumPy csv 1")),
    "sin":   ((2, "NumPy csv 2 (own SIMD kernel); glibc sinf 1"),
              (1, "NumPy csv 1; glibc sin 1")),
    "cos":   ((2, "NumPy csv 2 (own SIMD kernel); glibc cosf 1"),
              (1, "NumPy csv 1; glibc cos 1")),
    "tan":   ((4, "SVML LA 4; NumPy csv 4; glibc tanf 1"),
              (1, "SVML HA 1; NumPy csv 1; glibc tan 1")),
    "tanh":  ((2, "NumPy csv 2 (own SIMD kernel); glibc tanhf 2"),
              (2, "NumPy csv 2 (own SIMD kernel); glibc tanh 2")),
    "sinh":  ((4, "SVML LA 4; NumPy csv 2; glibc sinhf 2"),
              (2, "glibc sinh 2; SVML HA 1; NumPy csv 1")),
    "cosh":  ((4, "SVML LA 4; NumPy csv 3; glibc coshf 2"),
              (2, "glibc cosh 2; SVML HA 1; NumPy csv 1")),
    "atan":  ((4, "SVML LA 4; NumPy csv 3; glibc atanf 1"),
              (1, "SVML HA 1; NumPy csv 1; glibc atan 1")),
    "atan2": ((4, "SVML LA 4 (no NumPy csv; measured here 2.8 vs CR); glibc atan2f 2"),
              (1, "SVML HA 1; glibc atan2 1")),
    "pow":   ((4, "SVML LA 4 (no NumPy csv); glibc powf 1"),
              (1, "SVML HA 1; glibc pow 1")),
    "erf":   ((1, "fpx kernel = numba math.erf -> libm erff; glibc erff 1"),
              (1, "fpx kernel = numba math.erf -> libm erf; glibc erf 1")),
}


# Unary functions whose contiguous float16 loop on AVX512_SKX converts to float32, calls the
# SVML LA float32 routine (max 4 ulp, whatever NumPy's own float32 kernel is) and rounds back.
NUMPY_F16_VIA_SVML = ("exp", "expm1", "exp2", "log", "log1p", "log2", "sin", "cos", "tan",
                       "tanh", "sinh", "cosh", "atan")


# --------------------------------------------------------------------------------------------
# "cuda": the CUDA math library
# --------------------------------------------------------------------------------------------
# CUDA C++ Programming Guide, max ulp error vs the correctly rounded result (single, double).
CUDA_DOC = {
    "exp": (2, 1), "exp2": (2, 1), "expm1": (1, 1), "log": (1, 1), "log2": (1, 1),
    "log1p": (1, 1), "sin": (2, 2), "cos": (2, 2), "tan": (4, 2), "tanh": (2, 1),
    "sinh": (3, 2), "cosh": (2, 1), "atan": (2, 2), "atan2": (3, 2), "pow": (4, 2),
    "erf": (2, 2),
}


# --------------------------------------------------------------------------------------------
# "cuda-fast": the intrinsics of nvcc -use_fast_math, and flush-to-zero
# --------------------------------------------------------------------------------------------
TINY32 = 2.0 ** -126      # smallest normal float32: FTZ flushes anything below it
SIN_ABS = 2.0 ** -21.41
COS_ABS = 2.0 ** -21.19
LOG_ABS = 2.0 ** -21.41
LOG2_ABS = 2.0 ** -22
U23 = 2.0 ** -23           # relative size of 1 float32 ulp (upper bound)


def any_subnormal32(xs) -> Any:
    out = np.zeros((), dtype=bool)
    for x in xs:
        a = np.abs(x)
        out = out | ((a > 0) & (a < TINY32))
    return out


def ftz(base: Any = 0.0, guard: bool = True) -> Callable[..., Any]:
    """Absolute term under -ftz=true: ``base`` + a flushed output (2^-126); with ``guard``,
    ``inf`` where an input is a float32 subnormal (a flushed input can be amplified)."""
    def absolute(*xs):
        b = base(*xs) if callable(base) else base
        b = np.asarray(b, dtype=np.float64) + TINY32
        if guard:
            b = np.where(any_subnormal32(xs), np.inf, b)
        return b
    return absolute


def expf_ulps(x):
    return 2.5 + np.floor(np.abs(1.173 * x) * (1 + SLACK))


def in_half_two(x):
    return (x >= 0.5) & (x <= 2.0)


def logf_ulps(x):
    return np.where(in_half_two(x), 0.0, 3.5)


def logf_abs(x):
    return np.where(in_half_two(x), LOG_ABS, 0.0)


def log2f_ulps(x):
    return np.where(in_half_two(x), 0.0, 2.5)


def log2f_abs(x):
    return np.where(in_half_two(x), LOG2_ABS, 0.0)


def sinf_abs(x):
    return np.where(np.abs(x) <= math.pi, SIN_ABS, np.inf)


def cosf_abs(x):
    return np.where(np.abs(x) <= math.pi, COS_ABS, np.inf)


def tanf_abs(x):
    """__tanf = __sinf(x) * (1/__cosf(x)), |x| <= pi: with s^ = s + es, c^ = c + ec,
    |s^/c^ - tan| <= (|es| + |tan||ec|) / (|c| - |ec|); the approximate reciprocal
    (1 ulp vs CR with -prec-div=false: 1.5 ulp) and the rounded product add <= 2.001 2^-23
    relative."""
    c, t = np.cos(x), np.abs(np.tan(x))
    den = np.abs(c) - COS_ABS
    eq = (SIN_ABS + t * COS_ABS) / den
    a = (eq + 2.001 * U23 * (t + eq)) * (1 + 2.0 ** -30)
    return np.where((np.abs(x) <= math.pi) & (den > 0), a, np.inf)


def powf_abs(x, y):
    """__powf = exp2f(y * __log2f(x)): with L^ = log2 x + eL, P = RN(y L^) and exp2f within
    2.5 ulp, the result is x^y 2^d (1 + eta) with |d| <= |y| eL (1 + 2^-24) + |y log2 x| 2^-24,
    |eta| <= 2.5 2^-23. x < 0 (NaN from __log2f) and x == 0 with y <= 0 are unbounded."""
    L = np.log2(np.where(x > 0, x, 1.0))
    eL = np.where(in_half_two(x), LOG2_ABS, 2.5 * U23 * np.abs(L))
    d = np.abs(y) * eL * (1 + 2.0 ** -24) + np.abs(y * L) * 2.0 ** -24
    rel = np.exp2(d) * (1 + 2.5 * U23) - 1.0
    a = rel * np.abs(np.power(np.where(x > 0, x, 1.0), y)) * (1 + 2.0 ** -30)
    return np.where(x > 0, a, np.where((x == 0) & (y > 0), 0.0, np.inf))


def tanhf_abs(x):
    return 2.0 ** -11 * np.abs(np.tanh(x)) * (1 + 2.0 ** -30)
