"""Correctly rounded float64 elementwise math: a double-double evaluation, Ziv's rounding test,
and MPFR (gmpy2) for the rare elements it leaves undecided (docs/reproducible.md).

Each evaluator returns ``(hi, lo, eps)``: the value ``hi + lo`` (an unevaluated sum of two
float64s) within a relative ``eps`` of the exact result, or ``eps = 0`` where ``hi`` is the
correctly rounded result itself (special values, saturation, arguments so small that the
result rounds to a known value). The test (Ziv, as in CRlibm and CORE-MATH): with ``e =
2·eps·|hi|``, if ``hi + (lo - e)`` and ``hi + (lo + e)`` (float64 additions, correctly
rounded) are equal, every point within ``eps`` of ``hi + lo`` rounds to that value (rounding
is monotone; the factor two covers the rounding of ``lo ± e``). Results outside
``[2^-1000, 2^1020]`` in magnitude, where the low part or the bound may leave float64's normal
range, are never decided by the test. The undecided elements go to MPFR in float64's
precision and exponent range.

The evaluations (``x = (64k + j)·ln2/64 + r``, tables of ``2^(j/64)`` and ``log(c_j)`` in
double-double, Taylor series with their first terms in double-double) put exp and log within
a relative ``2^-72`` (each step's bound is in its docstring); the test assumes ``EPS = 2^-67``,
times the factor a composite's formula can amplify it by. ``fma`` is LLVM's ``llvm.fma`` (exact by
definition on every machine), so the error-free products do not depend on the CPU.
"""
from __future__ import annotations

import decimal
import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from fpx.kernels.crmath import undecided

__all__ = ["FUNCTIONS64", "EPS", "fast"]

#: the relative error the rounding test assumes of every double-double evaluation
EPS = 2.0 ** -67
_NAN = np.float64(np.nan)
_MAGIC = 6755399441055744.0                # 1.5·2^52: adding it rounds to an integer
#: the bits the kernel stores for an undecided element (a NaN with a payload, never a result)
UNDECIDED64 = np.uint64(0x7FF8DEADDEADBEEF)


@intrinsic
def _fma(typingctx, a, b, c):
    """a·b + c rounded once (LLVM's llvm.fma: the hardware instruction or libm's fma)."""
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        d = ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fma", [d], ir.FunctionType(d, [d, d, d]))
        return builder.call(fn, args)
    return sig, codegen


@numba.njit(inline="always")
def _two_sum(a, b):
    """s + e = a + b exactly, s = fl(a + b) (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@numba.njit(inline="always")
def _two_prod(a, b):
    """p + e = a·b exactly, p = fl(a·b)."""
    p = a * b
    return p, _fma(a, b, -p)


# ---------------------------------------------------------------------------------------------
# Tables (Python's decimal at 60 digits, correctly rounded, then split into two float64s)
# ---------------------------------------------------------------------------------------------
def _split(d):
    hi = float(d)
    return hi, float(d - decimal.Decimal(hi))


def _tables():
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        D = decimal.Decimal
        ln2 = D(2).ln()
        exp_t = np.array([_split((ln2 * j / 64).exp()) for j in range(64)])
        l64 = ln2 / 64
        l1 = float(math.floor(l64 * 2 ** 41) / D(2 ** 41))        # 35 bits: k·l1 exact
        invc = np.array([128.0 / max(j, 1) for j in range(182)])
        logc = np.array([_split(-D(float(c)).ln()) if 90 <= j else (0.0, 0.0)
                         for j, c in enumerate(invc)])
        ln2_hi = float(math.floor(ln2 * 2 ** 42) / D(2 ** 42))     # e·ln2_hi exact, |e| < 2^11
        return (exp_t[:, 0].copy(), exp_t[:, 1].copy(), l1, float(l64 - D(l1)), invc,
                logc[:, 0].copy(), logc[:, 1].copy(), ln2_hi, float(ln2 - D(ln2_hi)),
                float(1 / ln2), _split(1 / ln2)[1], _split(ln2))


(_T_HI, _T_LO, _L1, _L2, _INVC, _LOGC_HI, _LOGC_LO, _LN2_HI, _LN2_LO, _INV_LN2,
 _INV_LN2_LO, (_LN2, _LN2_L)) = _tables()
_TO_K = 64 * _INV_LN2


# ---------------------------------------------------------------------------------------------
# Series: exp(r) - 1 and log(1 + r) for |r| < 2^-7.4, r = rh + rl (|rl| <= 2^-52·|rh|)
# ---------------------------------------------------------------------------------------------
@numba.njit(inline="always")
def _series(rh, rl, c2, d3, t4):
    """r + c2·r^2 + r^3/d3 + r^4·t4 as (hi, lo): r^2 and r^3/d3 in double-double (their
    rounding would cost 2^-68 relative where the result is about r), ``t4`` the tail's
    polynomial at rh (|r^4·t4| < 2^-29·|r|, so its rounding and rl's omission stay below
    2^-80·|r|)."""
    s_h, s_l = _two_prod(rh, rh)
    s_l += 2.0 * rh * rl
    c_h, c_l = _two_prod(s_h, rh)
    c_l += s_l * rh + s_h * rl
    q = c_h / d3
    q_l = (_fma(-q, d3, c_h) + c_l) / d3
    hi, lo = _two_sum(rh, c2 * s_h)
    hi, e = _two_sum(hi, q)
    return hi, lo + e + (rl + c2 * s_l + q_l + s_h * s_h * t4)


@numba.njit(inline="always")
def _exp_tail(r):
    """1/24 + r/120 + ... + r^4/8!: the Taylor remainder after r^8 is below 2^-78 relative."""
    return (((r / 40320.0 + 1.0 / 5040.0) * r + 1.0 / 720.0) * r + 1.0 / 120.0) * r + 1.0 / 24.0


@numba.njit(inline="always")
def _log_tail(r):
    """-1/4 + r/5 - ... + r^7/11: the remainder after r^11 is below 2^-84·|r|."""
    p = ((((((r / 11.0 - 0.1) * r + 1.0 / 9.0) * r - 0.125) * r + 1.0 / 7.0) * r
          - 1.0 / 6.0) * r + 0.2)
    return p * r - 0.25


# ---------------------------------------------------------------------------------------------
# exp and log cores
# ---------------------------------------------------------------------------------------------
@numba.njit(inline="always")
def _pow2(m):
    """2^m for -1022 <= m <= 1023 (m clamped there)."""
    mc = min(max(m, -1022), 1023)
    return np.int64((mc + 1023) << 52).view(np.float64)


@numba.njit(inline="always")
def _exp_from(kf, rh, rl):
    """2^(kf/64)·exp(r) = 2^m·(T_j + T_j·p), p = exp(r) - 1 by :func:`_series`: returns (hi,
    lo, p_hi, p_lo); |r| < 2^-7.4, |kf| < 2^17 an integer."""
    k = np.int64(kf)
    j = k & 63
    th, tl = _T_HI[j], _T_LO[j]
    p_hi, p_lo = _series(rh, rl, 0.5, 6.0, _exp_tail(rh))
    bh, bl = _two_prod(th, p_hi)
    s, t = _two_sum(th, bh)
    lo = t + (tl + (bl + (th * p_lo + tl * p_hi)))
    sc = _pow2(k >> 6)
    return s * sc, lo * sc, p_hi, p_lo


@numba.njit(inline="always")
def _exp_dd(x, xl):
    """exp(x + xl) as (hi, lo, p_hi, p_lo) for |x| <= 746, |xl| <= 2^-50·|x|: k =
    round(64·x/ln2), r = x + xl - k·ln2/64 (k·_L1 exact, x - k·_L1 exact by Sterbenz, k·_L2
    exact by two_prod; _L2's own rounding costs 2^-79 at |k| < 2^17). Outside [-708, 709.7]
    the result leaves the test's range and goes to MPFR."""
    kf = (x * _TO_K + _MAGIC) - _MAGIC
    s = x - kf * _L1
    ph, pl = _two_prod(kf, _L2)
    rh, rl = _two_sum(s, -ph)
    rh, rl = _two_sum(rh, rl + (xl - pl))
    return _exp_from(kf, rh, rl)


@numba.njit(inline="always")
def _log_dd(x, xl):
    """log(x + xl) as (hi, lo) for positive finite x, |xl| <= 2^-52·x: x = 2^e·mt with mt in
    [0.707, 1.414), j = round(128·mt), mt·invc_j = 1 + r exactly (two_prod; the subtraction of
    1 exact by Sterbenz), |r| < 2^-7.4; log = e·ln2 + log(c_j) + log1p(r), the last with
    xl/x added (its square is below 2^-104)."""
    sub = x < 2.2250738585072014e-308
    xs = x * 4503599627370496.0 if sub else x            # 2^52: subnormals made normal
    b = np.float64(xs).view(np.int64)
    e = ((b >> 52) & 0x7FF) - 1023 - (52 if sub else 0)
    mt = np.int64(b & 0xFFFFFFFFFFFFF | 0x3FF0000000000000).view(np.float64)
    big = mt > 1.4142135623730951
    mt = mt * 0.5 if big else mt
    e = e + 1 if big else e
    j = np.int64(mt * 128.0 + 0.5)
    ph, pl = _two_prod(mt, _INVC[j])
    rh, rl = _two_sum(ph - 1.0, pl)
    rl = rl + (xl / x) * (rh + 1.0)
    rh, rl = _two_sum(rh, rl)
    l_h, l_l = _series(rh, rl, -0.5, 3.0, _log_tail(rh))
    ef = np.float64(e)
    hi, t1 = _two_sum(ef * _LN2_HI, _LOGC_HI[j])
    hi, t2 = _two_sum(hi, l_h)
    return hi, t1 + t2 + (ef * _LN2_LO + _LOGC_LO[j] + l_l)


@numba.njit(inline="always")
def _dd_div(ah, al, bh, bl):
    """(ah + al)/(bh + bl) as (hi, lo), relative error below 2^-100."""
    q = ah / bh
    ph, pl = _two_prod(q, bh)
    r = ((ah - ph) - pl + al - q * bl) / bh
    return q, r


# ---------------------------------------------------------------------------------------------
# Evaluators: (hi, lo, eps), eps = 0 where hi is the correctly rounded result already
# ---------------------------------------------------------------------------------------------
@numba.njit(inline="always")
def _exp(x, z):
    xc = min(max(x, -746.0), 746.0) if x == x else 0.0
    hi, lo, _, _ = _exp_dd(xc, 0.0)
    done = (x != x) | (x > 709.79) | (x < -745.2)
    return (x if x != x else (math.inf if x > 0 else 0.0)) if done else hi, lo, \
        0.0 if done else EPS


@numba.njit(inline="always")
def _exp2(x, z):
    """2^x = 2^(k/64)·exp(t·ln2), k = round(64x), t = x - k/64 exact, t·ln2 in double-double."""
    xc = min(max(x, -1076.0), 1025.0) if x == x else 0.0
    kf = (xc * 64.0 + _MAGIC) - _MAGIC
    t = xc - kf / 64.0
    rh, rl = _two_prod(t, _LN2)
    rh, rl = _two_sum(rh, rl + t * _LN2_L)
    hi, lo, _, _ = _exp_from(kf, rh, rl)
    done = (x != x) | (x >= 1024.0) | (x <= -1075.0)
    return (x if x != x else (math.inf if x > 0 else 0.0)) if done else hi, lo, \
        0.0 if done else EPS


@numba.njit(inline="always")
def _expm1(x, z):
    """expm1: the series itself for |x| < ln2/128 (k = 0, no cancellation), else exp(x) - 1
    (two_sum), whose relative error is exp's times exp(x)/|expm1(x)| (below 2^7.6)."""
    xc = min(max(x, -40.0), 710.0) if x == x else 0.0
    hi, lo, p_hi, p_lo = _exp_dd(xc, 0.0)
    h2, l2 = _two_sum(hi, -1.0)
    small = abs(xc) < 0.0054             # k = 0: hi + lo = 1 + p exactly as computed
    tiny = abs(x) < 2.0 ** -60           # expm1(x) = x + x^2/2 rounds to x
    done = (x != x) | tiny | (x > 709.79) | (x < -38.0)
    special = x if (x != x) | tiny else (math.inf if x > 0 else -1.0)
    eps = EPS if small else EPS * 1.01 * abs(hi) / max(abs(h2), 1e-300)
    return (special if done else (p_hi if small else h2)), (p_lo if small else l2 + lo), \
        0.0 if done else eps


@numba.njit(inline="always")
def _log(x, z):
    pos = (x > 0) & (x < math.inf)
    hi, lo = _log_dd(x if pos else 1.0, 0.0)
    special = -math.inf if x == 0 else (x if x == math.inf else _NAN)
    exact = x == 1.0
    return (hi if pos and not exact else (0.0 if exact else special)), lo, \
        EPS if pos and not exact else 0.0


@numba.njit(inline="always")
def _log2(x, z):
    """log(x)/ln2 in double-double; exact powers of two give their exponent exactly."""
    pos = (x > 0) & (x < math.inf)
    hi, lo = _log_dd(x if pos else 1.0, 0.0)
    h2, l2 = _two_prod(hi, _INV_LN2)
    l2 += hi * _INV_LN2_LO + lo * _INV_LN2
    special = -math.inf if x == 0 else (x if x == math.inf else _NAN)
    b = np.float64(x).view(np.int64)
    pow2 = pos and (b & 0xFFFFFFFFFFFFF) == 0 and (b >> 52) > 0
    exact = np.float64(((b >> 52) & 0x7FF) - 1023)
    return (exact if pow2 else (h2 if pos else special)), l2, EPS if pos and not pow2 else 0.0


@numba.njit(inline="always")
def _log1p(x, z):
    """log1p: the series at r = x for |x| < 2^-7.5, else log(s + t) with s + t = 1 + x
    exactly (two_sum)."""
    ok = (x > -1.0) & (x < math.inf)
    small = abs(x) < 2.0 ** -7.5
    s, t = _two_sum(1.0, x if ok else 0.0)
    hi, lo = _log_dd(s, t)
    xs = x if small else 0.0
    sh, sl = _series(xs, 0.0, -0.5, 3.0, _log_tail(xs))
    tiny = abs(x) < 2.0 ** -60                           # log1p(x) = x - x^2/2 rounds to x
    special = (x if tiny or x != x else (-math.inf if x == -1.0 else
                                              (x if x == math.inf else _NAN)))
    done = tiny | (not ok)
    return (special if done else (sh if small else hi)), (sl if small else lo), \
        0.0 if done else EPS


@numba.njit(inline="always")
def _tanh(x, z):
    """tanh(|x|) = u/(u + 2), u = expm1(2|x|) (no cancellation: u + 2 >= 2), the sign put
    back; |x| < 2^-28 rounds to x, |x| > 19.1 to ±1."""
    a = abs(x) if x == x else 0.0
    a = min(a, 20.0)
    uh, ul, ue = _expm1(2.0 * a, 0.0)
    dh, dl = _two_sum(uh, 2.0)
    qh, ql = _dd_div(uh, ul, dh, dl + ul)
    sgn = -1.0 if x < 0 else 1.0
    done = (x != x) | (abs(x) < 2.0 ** -28) | (abs(x) > 19.1)
    special = x if (x != x) | (abs(x) < 2.0 ** -28) else sgn
    return (special if done else sgn * qh), sgn * ql, \
        0.0 if done else 2.0 * (ue if ue > 0 else EPS) + EPS


@numba.njit(inline="always")
def _sigmoid(x, z):
    """sigmoid(x) = n/(1 + E), E = exp(-|x|), n = 1 (x >= 0) or E (x < 0)."""
    a = min(abs(x), 746.0) if x == x else 0.0
    eh, el, _, _ = _exp_dd(-a, 0.0)
    dh, dl = _two_sum(1.0, eh)
    nh, nl = (1.0, 0.0) if x >= 0 else (eh, el)
    qh, ql = _dd_div(nh, nl, dh, dl + el)
    done = (x != x) | (x > 37.5) | (x < -745.2)
    special = x if x != x else (1.0 if x > 0 else 0.0)
    return (special if done else qh), ql, 0.0 if done else 3.0 * EPS


@numba.njit(inline="always")
def _cosh(x, z):
    """(E + 1/E)/2, E = exp(|x|)."""
    a = min(abs(x), 711.0) if x == x else 0.0
    eh, el, _, _ = _exp_dd(a, 0.0)
    ih, il = _dd_div(1.0, 0.0, eh, el)
    h, l = _two_sum(eh, ih)
    done = (x != x) | (abs(x) > 710.5)
    return ((x if x != x else math.inf) if done else 0.5 * h), 0.5 * (l + el + il), \
        0.0 if done else 3.0 * EPS


@numba.njit(inline="always")
def _sinh(x, z):
    """sinh(|x|) = (u + u/(u + 1))/2, u = expm1(|x|) (both terms positive), the sign put back;
    |x| < 2^-28 rounds to x."""
    a = min(abs(x), 711.0) if x == x else 0.0
    uh, ul, ue = _expm1(a, 0.0)
    dh, dl = _two_sum(uh, 1.0)
    qh, ql = _dd_div(uh, ul, dh, dl + ul)
    h, l = _two_sum(uh, qh)
    sgn = -1.0 if x < 0 else 1.0
    done = (x != x) | (abs(x) < 2.0 ** -28) | (abs(x) > 710.5)
    special = x if (x != x) | (abs(x) < 2.0 ** -28) else sgn * math.inf
    return (special if done else sgn * 0.5 * h), sgn * 0.5 * (l + ul + ql), \
        0.0 if done else 2.0 * (ue if ue > 0 else EPS) + EPS


@numba.njit(inline="always")
def _rsqrt(x, z):
    """1/sqrt(x): s = sqrt(x) correctly rounded, x - s^2 exact (fma), sqrt(x) = s + (x -
    s^2)/(2s) to 2^-104, then a double-double division."""
    ok = (x > 0) & (x < math.inf)
    sub = x < 2.0 ** -1000                          # scaled by 2^104 so that x - s^2 is exact
    xs = (x * 2.0 ** 104 if sub else x) if ok else 1.0
    s = math.sqrt(xs)
    sl = _fma(-s, s, xs) / (2.0 * s)
    qh, ql = _dd_div(1.0, 0.0, s, sl)
    sc = 2.0 ** 52 if sub else 1.0
    qh, ql = qh * sc, ql * sc
    special = 1.0 / math.sqrt(x) if x == x else x   # ±0 -> ±inf, inf -> 0, x < 0 -> NaN
    return (qh if ok else special), ql, EPS if ok else 0.0


_EV64 = {"exp": _exp, "exp2": _exp2, "expm1": _expm1, "log": _log, "log2": _log2,
         "log1p": _log1p, "tanh": _tanh, "sigmoid": _sigmoid, "sinh": _sinh, "cosh": _cosh,
         "rsqrt": _rsqrt}


# ---------------------------------------------------------------------------------------------
# The kernel skeleton
# ---------------------------------------------------------------------------------------------
def _make_kernel(ev):
    @numba.njit(nogil=True, error_model="numpy")
    def kernel(x, z, bits):
        """float64 results of ``ev`` at (x, z) as bits into ``bits`` where the test decides,
        UNDECIDED64 elsewhere; returns the number of undecided elements."""
        c = 0
        for i in range(x.size):
            hi, lo, eps = ev(x[i], z[i])
            e = 2.0 * eps * abs(hi)
            a = hi + (lo - e)
            ok = (eps == 0.0) | ((a == hi + (lo + e)) & (abs(hi) >= 2.0 ** -1000)
                                 & (abs(hi) <= 2.0 ** 1020))
            y = hi if eps == 0.0 else a
            v = np.float64(y).view(np.uint64) if y == y else np.float64(_NAN).view(np.uint64)
            bits[i] = v if ok else UNDECIDED64
            c += not ok
        return c
    return kernel


#: the functions of the modules built on these helpers (crmath64_trig, _erf, _pow), loaded at
#: first use (they import this module)
_MODULES = {"sin": "trig", "cos": "trig", "tan": "trig", "atan": "trig", "atan2": "trig",
            "erf": "erf", "pow": "pow"}
FUNCTIONS64 = tuple(_EV64) + tuple(_MODULES)


_WIDE: dict = {}


def _evaluator(name):
    """The evaluator of ``name``, importing its module at first use (with its second passes,
    ``WIDE``: name -> (evaluator, constant second argument), for the elements the first leaves
    undecided)."""
    if name not in _EV64 and name in _MODULES:
        import importlib
        mod = importlib.import_module(f"fpx.kernels.crmath64_{_MODULES[name]}")
        _EV64.update(mod.EVALUATORS)
        _WIDE.update(getattr(mod, "WIDE", {}))
    return _EV64[name]


_KERNELS: dict = {}


def _run(key, ev, x, z):
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = _make_kernel(ev)
    out = np.empty(x.size, np.float64)
    bits = out.view(np.uint64)
    return out, undecided(bits, UNDECIDED64, k(x, z, bits))


def fast(name, x, z):
    """(float64 results of ``name`` where the test decides, the undecided indices) for the
    contiguous float64 arrays x and z (z ignored by unary functions)."""
    if name not in FUNCTIONS64:
        raise TypeError(f"fpx.reproducible: {name} of float64: float64 correctly rounded "
                        f"math not supported for {name} (it is for {', '.join(FUNCTIONS64)})")
    out, idx = _run(name, _evaluator(name), x, z)
    if idx.size and name in _WIDE:
        ev, zc = _WIDE[name]
        o2, i2 = _run(ev, ev, x[idx], np.full(idx.size, zc))
        out[idx] = o2
        idx = idx[i2]
    return out, idx
