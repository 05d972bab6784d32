"""numba kernels of ``fpx.stochastic``: random rounding with counter-based random bits.

Every random decision takes its bits from ``h = mix64(opkey + i·φ)`` -- the SplitMix64 output
at position ``i`` of a stream keyed by ``opkey = mix64(sample_key ^ mix64(op_id·φ))`` (Steele,
Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014). ``i`` is the
decision's position in the *per-sample* computation (element index, times K plus the step
``k`` inside a dot product or sum), so a sample's bits do not depend on thread count, on how
samples are batched or on which machine runs it.

Rounding of a value ``x`` (float64, with an optional exact residual ``e``: the real result is
``x + e``) into a format of precision ``p`` and minimum exponent ``emin``, at scale
``s = max(⌊log2|x|⌋, emin) - p + 1``: ``q = (x + e)·2^-s = fl + f`` with ``fl = ⌊q⌋``,
``0 <= f < 1``; the neighbours are ``fl·2^s`` and ``(fl+1)·2^s``. Modes (codes below):

* ``sr``: up with probability ``f`` (``u < f``, ``u`` uniform with 53-bit resolution);
  exact results (``f = 0``) never move.
* ``ud``: round to nearest (ties to even), then one step up or down with probability ½ each,
  unless the rounded value is 0 (Fuzzy PyTorch's "up-down").
* ``cestac``: RD or RU with probability ½ each; exact results never move (Vignes 1993).
* ``mca``: Monte Carlo arithmetic, virtual precision ``t``: ``x + 2^(⌊log2|x|⌋+1-t)·ξ`` with
  ``ξ`` uniform in [-½, ½) on a 2^-32 grid, added exactly (TwoSum residual), then ``sr``
  into the format -- the final rounding is unbiased, so there is no bias at binade edges
  (Parker 1997; Frechtling & Leong 2015 for the bias of RN after the noise).
* ``rn``: round to nearest even (no randomness).

Overflow, as ``fpx.formats.round`` has it: a result beyond the format's largest finite value is
±inf (NaN for formats without infinities, e.g. float8_e4m3fn); ``ud`` takes no step from an RN
result that overflowed; ``cestac`` gives ±max when its coin rounds toward zero. float64 results
beyond float64's range (``eft_binary``) come as halves, rounded in the halved format (same
``p``, ``emin - 1``, ``max/2``) and doubled: ``round(v) = 2·round'(v/2)`` exactly.
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from numba import types
from numba.extending import intrinsic

from fpx.kernels import ordered
from fpx.kernels.elementwise import _llvm_fma

MODES = {"rn": 0, "sr": 1, "ud": 2, "cestac": 3, "mca": 4}

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_S11, _S32, _S63 = np.uint64(11), np.uint64(32), np.uint64(63)
_LOW32 = np.uint64(0xFFFFFFFF)
_ONE = np.uint64(1)
_INV53 = 2.0 ** -53
_INV32 = 2.0 ** -32
_F64MAX = np.finfo(np.float64).max

_opts = dict(cache=True, nogil=True, error_model="numpy")
# Memory-bound elementwise kernels run on one thread (their prange loops are plain loops):
# an OpenMP team there contends with OpenBLAS's spinning threads right after a GEMM, which
# slows it. Compute-bound kernels (the flop matmul and reductions) are parallel.


@numba.njit(**_opts)
def mix64(z):
    """SplitMix64's finalizer (a bijection of uint64 with full avalanche)."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@numba.njit(**_opts)
def op_key(sample_key, op_id):
    return mix64(sample_key ^ mix64(np.uint64(op_id) * _GOLDEN + _M2))


@numba.njit(**_opts)
def bits_at(key, i):
    return mix64(key + np.uint64(i) * _GOLDEN)


@intrinsic
def _f2i(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int64))
    return types.int64(types.float64), codegen


@intrinsic
def _i2f(typingctx, i):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))
    return types.float64(types.int64), codegen


@numba.njit(**_opts)
def _pow2(n):
    """2.0**n for -1022 <= n <= 1023, built from its bits."""
    return _i2f(np.int64(n + 1023) << 52)


@numba.njit(**_opts)
def _fold_residual(fl, f, es, sh, E, p, emin):
    """Add the residual, already scaled to units of 2^sh (``es``), to ``q = fl + f``. When
    x = ±2^E and the residual points to zero, x + e lies in the binade below, whose spacing
    is half as large (neighbours pred(2^E) and 2^E): go to that grid."""
    f += es
    adj = math.floor(f)
    fl += adj
    f -= adj
    half = np.float64(np.int64(1) << (p - 1))
    if E > emin and (fl < half if fl >= 0.0 else (fl > -half or (fl == -half and f > 0.0))):
        f = 2.0 * f
        adj = math.floor(f)
        fl = 2.0 * fl + adj
        f -= adj
        sh -= 1
        E -= 1
    return fl, f, sh, E


@numba.njit(**_opts)
def _choose(fl, f, u, h, mode, p, E, emin, kmax):
    """The multiple k of the grid spacing that ``mode`` picks for q = fl + f (0 <= f < 1);
    ``kmax``: the largest finite magnitude in units of the spacing (maxv·2^-sh)."""
    if mode == 1 or mode == 4:                       # sr (mca ends with sr)
        return fl + 1.0 if u < f else fl
    if mode == 3:                                    # cestac: exact stays exact
        return fl + 1.0 if (f != 0.0 and (h >> _S63) == _ONE) else fl
    k = fl + 1.0 if (f > 0.5 or (f == 0.5 and fl - 2.0 * math.floor(0.5 * fl) != 0.0)) else fl
    if mode == 2 and k != 0.0 and abs(k) <= kmax:    # ud: one step from RN, never from 0
        up = (h >> _S63) == _ONE                     # or from an RN overflow (formats.round)
        ak = abs(k)
        top = np.float64(np.int64(1) << p)
        if up == (k > 0.0):                          # away from zero: 2x coarser at 2^(E+1)
            step = 2.0 if ak == top else 1.0
        else:                                        # toward zero: 2x finer below 2^E
            step = 0.5 if (ak == 0.5 * top and E > emin) else 1.0
        k = k + step if up else k - step
    return k


@numba.njit(**_opts)
def _overflow(r, h, mode, maxv, nan_ovf):
    """A result beyond ``maxv``, as ``formats.round`` has it: ±inf (NaN without infinities);
    cestac rounds toward zero on a down coin, so it gives ±maxv then."""
    if mode == 3 and ((h >> _S63) == _ONE) == (r < 0.0):      # the coin said toward zero
        return math.copysign(maxv, r)
    return math.copysign(math.nan if nan_ovf else math.inf, r)


@numba.njit(**_opts)
def round_small(x, e, h, mode, p, emin, maxv, nan_ovf, t):
    """:func:`round1` for formats whose grid spacing is a float64 normal (p <= 26, emin >=
    -996): powers of two from bits, no libm calls, so loops over it vectorize."""
    b = _f2i(x)
    ef = (b >> 52) & 0x7FF
    if ef == 0x7FF:                      # inf, nan
        return x
    if mode == 4:
        if x != 0.0:
            xi = np.float64(h >> _S32) * _INV32 - 0.5
            ne = ef - 1023 + 1 - t
            # _pow2 needs ne >= -1022 (garbage bits below): |x| < 2^(t-1022) takes ldexp
            nz = xi * (_pow2(ne) if ne >= -1022 else math.ldexp(1.0, _exponent(x) + 1 - t))
            s = x + nz
            e = e + two_sum_err(x, nz, s)
            x = s
            b = _f2i(x)
            ef = (b >> 52) & 0x7FF
        u = np.float64(h & _LOW32) * _INV32
    else:
        u = np.float64(h >> _S11) * _INV53
    E = max(ef - 1023, emin)
    sh = E - p + 1
    q = x * _pow2(-sh)
    fl = math.floor(q)
    f = q - fl
    if e != 0.0:
        fl, f, sh, E = _fold_residual(fl, f, e * _pow2(-sh), sh, E, p, emin)
    k = _choose(fl, f, u, h, mode, p, E, emin, maxv * _pow2(-sh))
    r = k * _pow2(sh)
    if abs(r) > maxv:
        r = _overflow(r, h, mode, maxv, nan_ovf)
    return r


@numba.njit(**_opts)
def rounder(x, e, h, mode, p, emin, maxv, nan_ovf, t):
    """Dispatch: bit-built powers of two where they fit, else ldexp (float64 targets)."""
    if p <= 26:
        return round_small(x, e, h, mode, p, emin, maxv, nan_ovf, t)
    return round1(x, e, h, mode, p, emin, maxv, nan_ovf, t)


@numba.njit(**_opts)
def _exponent(x):
    """⌊log2|x|⌋ for finite nonzero x."""
    return math.frexp(x)[1] - 1


@numba.njit(**_opts)
def two_sum_err(a, b, s):
    bb = s - a
    return (a - (s - bb)) + (b - bb)


@numba.njit(**_opts)
def round1(x, e, h, mode, p, emin, maxv, nan_ovf, t):
    """Round ``x + e`` into the format (p, emin, maxv) with ``mode`` using random bits ``h``."""
    if not (abs(x) <= _F64MAX):          # inf, nan: unchanged
        return x
    if mode == 4:                        # mca: exact noise of relative size 2^-t, then sr
        if x != 0.0:
            xi = np.float64(h >> _S32) * _INV32 - 0.5
            nz = math.ldexp(xi, _exponent(x) + 1 - t)
            s = x + nz
            e = e + two_sum_err(x, nz, s)
            x = s
        u = np.float64(h & _LOW32) * _INV32
    else:
        u = np.float64(h >> _S11) * _INV53
    if x == 0.0:
        return x
    E = max(_exponent(x), emin)
    sh = E - p + 1
    q = math.ldexp(x, -sh)
    fl = math.floor(q)
    f = q - fl
    if e != 0.0:
        fl, f, sh, E = _fold_residual(fl, f, math.ldexp(e, -sh), sh, E, p, emin)
    k = _choose(fl, f, u, h, mode, p, E, emin, math.ldexp(maxv, -sh))
    r = math.ldexp(k, sh)
    if abs(r) > maxv:
        r = _overflow(r, h, mode, maxv, nan_ovf)
    return r


# ---------------------------------------------------------------------------------------------
# Elementwise: one random rounding per element
# ---------------------------------------------------------------------------------------------
@numba.njit(**_opts)
def round_rows(x, e, keys, op_id, mode, p, emin, maxv, nan_ovf, t, out):
    """out[s, i] = round(x[s', i] + e[s'', i]) with sample s's bits; x/e rows may be 1 (shared).

    x, e: (Sx, n), (Se, n) float64 with Sx, Se in {1, S}; e may have n == 0 (no residual).
    """
    S, n = out.shape
    has_e = e.shape[1] == n and n > 0
    chunk = 4096
    nchunks = (n + chunk - 1) // chunk
    for job in prange(S * nchunks):
        s = job // nchunks
        c0 = (job % nchunks) * chunk
        c1 = min(n, c0 + chunk)
        key = op_key(keys[s], op_id)
        xs = s if x.shape[0] > 1 else 0
        es = s if e.shape[0] > 1 else 0
        for i in range(c0, c1):
            ei = e[es, i] if has_e else 0.0
            out[s, i] = rounder(x[xs, i], ei, bits_at(key, i), mode, p, emin, maxv, nan_ovf, t)


# ---------------------------------------------------------------------------------------------
# Error-free transforms for float64 targets
# ---------------------------------------------------------------------------------------------
@numba.njit(**_opts)
def eft_binary(op, a, b, y, e, half):
    """y = fl(a op b), e = the exact error (add/sub: TwoSum; mul: FMA; div, the remainder
    ``fma(-y, b, a)/b`` rounded, whose sign and size fix the random rounding to 2^-53).
    Where finite operands overflow (y = ±inf) but ``v = a op b`` lies below 2^1025, (y, e) is
    instead the pair of ``v/2`` (one operand halved: exact, it is large) and ``half`` is 1:
    round that in the halved format and double it (the result may still be finite)."""
    n = y.shape[0]
    for i in prange(n):
        ai, bi = a[i], b[i]
        y[i], e[i] = _eft1(op, ai, bi)
        half[i] = 0
        if not (abs(y[i]) <= _F64MAX) and abs(ai) <= _F64MAX and abs(bi) <= _F64MAX:
            if op <= 1:
                a2, b2 = 0.5 * ai, 0.5 * bi
            elif op == 2 and abs(ai) < abs(bi):
                a2, b2 = ai, 0.5 * bi
            else:
                a2, b2 = 0.5 * ai, bi
            y2, e2 = _eft1(op, a2, b2)
            if abs(y2) <= _F64MAX:
                y[i], e[i], half[i] = y2, e2, 1


@numba.njit(**_opts)
def _eft1(op, ai, bi):
    if op == 0:
        s = ai + bi
        return s, (two_sum_err(ai, bi, s) if abs(s) <= _F64MAX else 0.0)
    if op == 1:
        s = ai - bi
        return s, (two_sum_err(ai, -bi, s) if abs(s) <= _F64MAX else 0.0)
    if op == 2:
        s = ai * bi
        return s, (_llvm_fma(ai, bi, -s) if abs(s) <= _F64MAX else 0.0)
    s = ai / bi
    if abs(s) <= _F64MAX and s != 0.0 and bi != 0.0:
        return s, _llvm_fma(-s, bi, ai) / bi
    return s, 0.0


@numba.njit(**_opts)
def eft_sqrt(a, y, e):
    """y = fl(sqrt(a)), e ≈ (a - y²)/(2y) (exact remainder by FMA)."""
    n = y.shape[0]
    for i in prange(n):
        ai = a[i]
        s = math.sqrt(ai) if ai >= 0.0 else math.nan
        y[i] = s
        if s > 0.0 and s <= _F64MAX:
            e[i] = _llvm_fma(-s, s, ai) / (2.0 * s)
        else:
            e[i] = 0.0


# ---------------------------------------------------------------------------------------------
# Flop granularity: dot products and sums with every multiply and add randomly rounded
# ---------------------------------------------------------------------------------------------
@numba.njit(**_opts)
def _mul_round(a, b, h, mode, p, emin, maxv, nan_ovf, t, f64):
    y = a * b
    e = 0.0
    if f64 and abs(y) <= _F64MAX:
        e = _llvm_fma(a, b, -y)
    return rounder(y, e, h, mode, p, emin, maxv, nan_ovf, t)


@numba.njit(**_opts)
def _add_round(a, b, h, mode, p, emin, maxv, nan_ovf, t):
    s = a + b
    e = two_sum_err(a, b, s) if abs(s) <= _F64MAX else 0.0
    return rounder(s, e, h, mode, p, emin, maxv, nan_ovf, t)


@numba.njit(parallel=True, **_opts)
def matmul_flop(A, B, keys, op_prod, op_add, mode, fp, fa, t, pairwise, out):
    """out[s, g, m, n] = Σ_k A[s, g, m, k]·B[s, g, k, n] with each product rounded into the
    product format ``fp`` and each partial sum into the accumulation format ``fa``
    (fp/fa = (p, emin, maxv, nan_ovf) tuples). Order: sequential over k (k = 0, 1, ...), or a
    balanced pairwise tree (pairs (0,1), (2,3), ..., then pairs of those). A is (SA, GA, M, K)
    and B (SB, GB, K, N), C-contiguous, with SA, SB in {1, S} and GA, GB in {1, G} (shared). Bits: product k of output o uses position o·K + k of
    stream ``op_prod``; the add that brings in term k uses position o·K + k of ``op_add``.
    """
    S, G, M, N = out.shape
    K = A.shape[3]
    pp, pe, pm, pn = fp
    ap, ae, am, an = fa
    f64 = pp == 53
    for job in prange(S * G * M):
        s = job // (G * M)
        g = (job // M) % G
        m = job % M
        kp = op_key(keys[s], op_prod)
        ka = op_key(keys[s], op_add)
        base = ((g * M + m) * N) * K
        arow = A[s if A.shape[0] > 1 else 0, g if A.shape[1] > 1 else 0, m]
        bmat = B[s if B.shape[0] > 1 else 0, g if B.shape[1] > 1 else 0]
        if K == 0:
            for n in range(N):
                out[s, g, m, n] = 0.0
            continue
        if not pairwise:
            acc = np.empty(N)
            a0 = arow[0]
            for n in range(N):
                acc[n] = _mul_round(a0, bmat[0, n], bits_at(kp, base + n * K),
                                    mode, pp, pe, pm, pn, t, f64)
            for k in range(1, K):
                a = arow[k]
                for n in range(N):
                    i = base + n * K + k
                    pr = _mul_round(a, bmat[k, n], bits_at(kp, i), mode, pp, pe, pm, pn, t, f64)
                    acc[n] = _add_round(acc[n], pr, bits_at(ka, i), mode, ap, ae, am, an, t)
            for n in range(N):
                out[s, g, m, n] = acc[n]
        else:
            buf = np.empty((K, N))
            for k in range(K):
                a = arow[k]
                for n in range(N):
                    buf[k, n] = _mul_round(a, bmat[k, n], bits_at(kp, base + n * K + k),
                                           mode, pp, pe, pm, pn, t, f64)
            step = 1
            while step < K:
                for k in range(0, K - step, 2 * step):
                    for n in range(N):
                        buf[k, n] = _add_round(buf[k, n], buf[k + step, n],
                                               bits_at(ka, base + n * K + k + step),
                                               mode, ap, ae, am, an, t)
                step *= 2
            for n in range(N):
                out[s, g, m, n] = buf[0, n]


@numba.njit(parallel=True, **_opts)
def reduce_flop(X, keys, op_id, mode, fa, t, kind, out):
    """Sums / products / running sums along axis 2 of X (S, O, K, I), every operation randomly
    rounded into the accumulation format ``fa``.

    kind 0: sequential sum, 1: pairwise-tree sum, 2: sequential product, 3: cumulative sum
    (out has shape (S, O, K, I) then, else (S, O, 1, I)). Bits: the operation that brings in term
    k of output element o = (o_outer·I + i) uses position o·K + k of stream ``op_id``.
    X may be a broadcast view.
    """
    S, O, K, I = X.shape
    ap, ae, am, an = fa
    for job in prange(S * O):
        s = job // O
        o = job % O
        key = op_key(keys[s], op_id)
        if K == 0:
            if kind != 3:
                for i in range(I):
                    out[s, o, 0, i] = 1.0 if kind == 2 else 0.0
            continue
        if kind == 1:
            buf = np.empty((K, I))
            for k in range(K):
                for i in range(I):
                    buf[k, i] = X[s, o, k, i]
            step = 1
            while step < K:
                for k in range(0, K - step, 2 * step):
                    for i in range(I):
                        buf[k, i] = _add_round(buf[k, i], buf[k + step, i],
                                               bits_at(key, (o * I + i) * K + k + step),
                                               mode, ap, ae, am, an, t)
                step *= 2
            for i in range(I):
                out[s, o, 0, i] = buf[0, i]
            continue
        acc = np.empty(I)
        for i in range(I):
            acc[i] = X[s, o, 0, i]
            if kind == 3:
                out[s, o, 0, i] = acc[i]
        for k in range(1, K):
            for i in range(I):
                h = bits_at(key, (o * I + i) * K + k)
                if kind == 2:
                    acc[i] = _mul_round(acc[i], X[s, o, k, i], h, mode, ap, ae, am, an, t, ap == 53)
                else:
                    acc[i] = _add_round(acc[i], X[s, o, k, i], h, mode, ap, ae, am, an, t)
                if kind == 3:
                    out[s, o, k, i] = acc[i]
        if kind != 3:
            for i in range(I):
                out[s, o, 0, i] = acc[i]


# ---------------------------------------------------------------------------------------------
# Compensated (nearly exact) float64 dot products and sums, for op granularity in float64
# ---------------------------------------------------------------------------------------------
@numba.njit(parallel=True, **_opts)
def matmul_dot2(A, B, hi, lo):
    """hi + lo ≈ A @ B with twice float64's precision (Ogita, Rump & Oishi 2005, Dot2).
    A (SA, GA, M, K), B (SB, GB, K, N) with SA, SB in {1, S} and GA, GB in {1, G} (shared)."""
    S, G, M, N = hi.shape
    K = A.shape[3]
    for job in prange(S * G * M):
        s = job // (G * M)
        g = (job // M) % G
        m = job % M
        arow = A[s if A.shape[0] > 1 else 0, g if A.shape[1] > 1 else 0, m]
        bmat = B[s if B.shape[0] > 1 else 0, g if B.shape[1] > 1 else 0]
        sh = np.zeros(N)
        sl = np.zeros(N)
        for k in range(K):
            a = arow[k]
            for n in range(N):
                b = bmat[k, n]
                p = a * b
                pe = _llvm_fma(a, b, -p)
                x = sh[n] + p
                sl[n] += two_sum_err(sh[n], p, x) + pe
                sh[n] = x
        for n in range(N):
            if not (abs(sh[n]) <= _F64MAX):      # inf/nan operands or overflow: the plain
                hi[s, g, m, n] = sh[n]            # sum (sl is nan there: inf - inf)
                lo[s, g, m, n] = 0.0
                continue
            y = sh[n] + sl[n]
            hi[s, g, m, n] = y
            lo[s, g, m, n] = two_sum_err(sh[n], sl[n], y) if abs(y) <= _F64MAX else 0.0


@numba.njit(parallel=True, **_opts)
def sum_sum2(X, cumulative, hi, lo):
    """Compensated sums (Sum2; Ogita, Rump & Oishi 2005) along axis 2 of X (S, O, K, I):
    hi + lo, of shape (S, O, K, I) for running sums (``cumulative``), else (S, O, 1, I)."""
    S, O, K, I = X.shape
    for job in prange(S * O):
        s = job // O
        o = job % O
        sh = np.zeros(I)
        sl = np.zeros(I)
        for k in range(K):
            for i in range(I):
                v = X[s, o, k, i]
                x = sh[i] + v
                sl[i] += two_sum_err(sh[i], v, x)
                sh[i] = x
                if cumulative:
                    _sum2_out(sh[i], sl[i], hi, lo, s, o, k, i)
        if not cumulative:
            for i in range(I):
                _sum2_out(sh[i], sl[i], hi, lo, s, o, 0, i)


@numba.njit(**_opts)
def _sum2_out(sh, sl, hi, lo, s, o, k, i):
    """hi + lo = sh + sl; the plain sum ``sh`` where it is inf/nan (inf operands or overflow:
    ``sl`` is nan there, from inf - inf in TwoSum)."""
    if not (abs(sh) <= _F64MAX):
        hi[s, o, k, i] = sh
        lo[s, o, k, i] = 0.0
        return
    y = sh + sl
    hi[s, o, k, i] = y
    lo[s, o, k, i] = two_sum_err(sh, sl, y) if abs(y) <= _F64MAX else 0.0


# ---------------------------------------------------------------------------------------------
# Fast path of matmul_flop for float32 products and sums (sr, ud, cestac)
# ---------------------------------------------------------------------------------------------
# A float32 target keeps 24 of float64's 53 significand bits; on the float64 bit pattern b of
# a value in float32's normal range, rounding is integer arithmetic on the low d = 29 bits,
# with the random bits of a 64-bit word w read as the general rounder reads them (so both take
# the same decision with the same w: the fallback to it is unbiased):
#   sr:     (b + c) & ~(2^d - 1), r = w >> 35 and c = 2^d - 1 - r (b >= 0) or r (b < 0): up
#           in magnitude iff r < b mod 2^d (b >= 0; iff r >= 2^d - b mod 2^d for b < 0), with
#           probability (b mod 2^d)/2^d -- the general rounder's ``u < f``, u = (w >> 11)·2^-53,
#   ud:     round-to-nearest-even by (b + 2^(d-1) - 1 + bit_d) & mask, then ± 2^d toward +inf
#           when w's top bit is 1 (no step from 0 or from an overflowed RN result),
#   cestac: truncate, then 2^d toward +inf when w's top bit is 1 and bits were dropped.
# A carry into the exponent field is exactly the step to the next binade, so the pattern
# arithmetic is exact there. Products of float32 values are exact in float64, sums of two
# float32 values are exact unless their exponents differ by more than 29 (then float64's
# rounding moves P(up) by at most 2^-29). Elements whose operands, product or sum leave the
# normal range (subnormals, overflow, inf/NaN) are redone with the general rounder (same w).
_MAG = np.int64(0x7FFFFFFFFFFFFFFF)
_F32 = (24, -126, float(np.finfo(np.float32).max), False)
_F32MAX_BITS = np.int64(np.array([_F32[2]]).view(np.int64)[0])


_D = 29                                  # float64 -> float32: 52 - 23 bits dropped
_SH1 = np.uint64(64 - _D)
_S32U = np.uint64(32)


def _fast_ops(MODE):
    """(rnd, bad) on float64 bit patterns for mode code MODE: ``rnd(b, w)`` rounds pattern
    ``b`` to float32's grid with the random word ``w`` (uint64), taking the decision
    ``rounder(x, 0, w, MODE, *float32)`` takes; ``bad(b)``: outside float32's normal range
    (redo with the general rounder)."""
    NM = ~((np.int64(1) << _D) - 1)
    LOWM = (np.int64(1) << _D) - 1
    HALF = (np.int64(1) << (_D - 1)) - 1
    STEP = np.int64(1) << _D
    LO_EF, SPAN = 1023 - 126, 127 + 126

    @numba.njit(inline="always")
    def rnd(b, w):
        neg = b >> 63                                # -1 for a negative pattern, else 0
        if MODE == 1:
            return (b + (np.int64(w >> _SH1) ^ (LOWM & ~neg))) & NM
        up = np.int64(w >> _S63)                     # toward +inf
        if MODE == 2:
            y = (b + HALF + ((b >> _D) & 1)) & NM
            m = y & _MAG
            v = np.int64((m != 0) & (m <= _F32MAX_BITS)) << _D   # no step from 0 or inf
            c = (up ^ -neg) ^ 1                      # 1: one step toward zero's side
            return y + ((v ^ -c) + c)                # -v when c
        t = b & NM
        return t + (STEP if ((up ^ -neg) == 1 and t != b) else 0)

    @numba.njit(inline="always")
    def bad(b):
        e = (b >> 52) & 0x7FF
        return (((e - LO_EF) & 0xFFFF) > SPAN) & ((b & _MAG) != 0)
    return rnd, bad


def _make_fast_matmul(MODE):
    """The sequential ordered-dot skeleton of ``fpx.kernels.ordered`` with this mode's
    per-step rounding: product, then sum, each rounded on float64 bit patterns with one random
    word ``h`` (the product takes its high bits, the sum its low half shifted up); elements
    that leave float32's normal range, and under cestac those whose float64 sum is inexact
    (exponents more than 29 apart: cestac moves only inexact results), are redone with the
    general rounder (same ``h``, the sum's TwoSum residual). For sr and ud such a sum moves
    P(up) by at most 2^-29."""
    rnd, bad = _fast_ops(MODE)
    f32max = _F32[2]

    @numba.njit(inline="always")
    def first(a, b, key, pos):
        x = _f2i(a * b)
        pb = rnd(x, bits_at(key, np.uint64(pos)))
        return _i2f(pb), bad(x) | bad(pb)

    @numba.njit(inline="always")
    def step(acc, a, b, key, pos):
        h = bits_at(key, np.uint64(pos))
        x = _f2i(a * b)
        pb = rnd(x, h)
        p = _i2f(pb)
        v = acc + p
        yb = rnd(_f2i(v), h << _S32U)
        isbad = bad(x) | bad(pb) | bad(yb)
        if MODE == 3:       # cestac moves inexact results only: an inexact float64 sum
            isbad |= two_sum_err(acc, p, v) != 0.0      # (exponents > 29 apart) goes on
        return _i2f(yb), isbad                          # to the general rounder

    @numba.njit(inline="always")
    def fix(acc, a, b, key, pos, k):
        h = bits_at(key, np.uint64(pos))
        pr = rounder(a * b, 0.0, h, MODE, 24, -126, f32max, False, 0)
        if k == 0:
            return pr
        v = acc + pr
        e = two_sum_err(acc, pr, v) if abs(v) <= _F64MAX else 0.0
        return rounder(v, e, h << _S32U, MODE, 24, -126, f32max, False, 0)

    @numba.njit(inline="always")
    def key_of(keys, s, op):
        return op_key(keys[s], op)

    row = ordered.elementwise_row(first, step, fix)
    return ordered.make_matmul(ordered.sequential_tile(row), key_of)


_FAST_MATMUL = {}


def fast_matmul(mode_code):
    """The float32 fast kernel for mode code 1 (sr), 2 (ud) or 3 (cestac), compiled on first use.

    ``kernel(A, B, keys, op, sm, sn, out)``: the bits of term k of out[s, g, m, n] sit at
    position g·M·N·K + m·sm + n·sn + k (sm = N·K, sn = K for the natural layout; a caller that
    passes the transposed problem Bᵀ·Aᵀ swaps them, keeping every decision's position)."""
    k = _FAST_MATMUL.get(mode_code)
    if k is None:
        k = _FAST_MATMUL[mode_code] = _make_fast_matmul(mode_code)
    return k


def _make_fast_reduce(MODE):
    rnd, _ = _fast_ops(MODE)
    LANES = 8
    LO, SPAN = np.int64(1023 - 125), np.uint64(250)   # float32 binades 2^-125 .. 2^126

    @numba.njit(parallel=True, nogil=True, error_model="numpy")
    def kernel(X, keys, op_id, cumulative, out):
        S, O, K, I = X.shape
        shared = X.strides[0] == 0            # one input for every sample
        nch = (S + LANES - 1) // LANES
        for job in prange(O * I * nch):       # noqa: B007
            o = job // (I * nch)
            i = (job // nch) % I
            s0 = (job % nch) * LANES
            ns = min(S, s0 + LANES) - s0
            # the running sums are one dependency chain per sample: the samples of an output
            # run side by side (independent chains); padding lanes repeat the last sample
            kk = np.empty(LANES, np.uint64)
            acc = np.zeros(LANES)
            xl = np.zeros(LANES)
            for j in range(LANES):
                sj = s0 + min(j, ns - 1)
                kk[j] = op_key(keys[sj], op_id)
                if K > 0:
                    acc[j] = X[sj, o, 0, i]
            if cumulative and K > 0:
                for j in range(ns):
                    out[s0 + j, o, 0, i] = acc[j]
            base = np.uint64((o * I + i) * K)
            for k in range(1, K):
                pos = base + np.uint64(k)
                if shared:
                    x0 = X[s0, o, k, i]
                    for j in range(LANES):
                        xl[j] = x0
                else:
                    for j in range(LANES):
                        xl[j] = X[s0 + min(j, ns - 1), o, k, i]
                for j in range(LANES):
                    h = bits_at(kk[j], pos)
                    b = _f2i(acc[j] + xl[j])
                    if np.uint64(((b >> 52) & 0x7FF) - LO) <= SPAN:
                        # inside float32's binades 2^-125 .. 2^126: the rounded sum stays a
                        # normal, finite float32 whichever way it goes
                        acc[j] = _i2f(rnd(b, h))
                    else:           # zero, the edge binades, subnormal, overflow, inf, NaN
                        acc[j] = _add_round(acc[j], xl[j], h, MODE, 24, -126, _F32[2], False,
                                            24)
                if cumulative:
                    for j in range(ns):
                        out[s0 + j, o, k, i] = acc[j]
            if not cumulative:
                for j in range(ns):
                    out[s0 + j, o, 0, i] = acc[j]
    return kernel


_FAST_REDUCE = {}


def fast_reduce(mode_code):
    """:func:`reduce_flop` kinds 0 and 3 (sequential sum, running sum) into float32 for modes
    sr, ud, cestac: the same positions and bits, the samples of one output side by side (8
    lanes: the running sums are one dependency chain per sample, so it is the samples that
    vectorize), bit-pattern rounding as the fast matmul, the general rounder for elements
    outside float32's normal range. ``kernel(X, keys, op_id, cumulative, out)``."""
    k = _FAST_REDUCE.get(mode_code)
    if k is None:
        k = _FAST_REDUCE[mode_code] = _make_fast_reduce(mode_code)
    return k


# elementwise operand combinations of the fast row kernel: the float64 value to round
_ROW_OPS = {"round": 0, "add": 1, "sub": 2, "mul": 3, "div": 4}


def _make_fast_rows(MODE, OP):
    rnd, bad = _fast_ops(MODE)

    @numba.njit(inline="always")
    def value(ar, br, i):
        if OP == 0:
            return np.float64(ar[i])
        x, y = np.float64(ar[i]), np.float64(br[i])
        if OP == 1:
            return x + y
        if OP == 2:
            return x - y
        if OP == 3:
            return x * y
        return x / y

    @numba.njit(inline="always")
    def residual(ar, br, i, v):
        """The float64 sum's TwoSum error (nonzero only where the operands' exponents
        differ by more than 29); 0 for the other ops, whose float64 result is exact (mul)
        or never a float32 value unless exact (div, round)."""
        if OP != 1 and OP != 2:
            return 0.0
        x, y = np.float64(ar[i]), np.float64(br[i])
        y = y if OP == 1 else -y
        bb = v - x
        e = (x - (v - bb)) + (y - bb)
        return e if math.isfinite(e) else 0.0

    # one thread: these passes are memory-bound, and an OpenMP team here contends with
    # OpenBLAS's spinning threads right after a GEMM
    @numba.njit(nogil=True, error_model="numpy")
    def kernel(a, b, keys, op_id, out):
        S, n = out.shape
        chunk = 4096
        flag = np.zeros(chunk, np.uint8)
        for s in range(S):
            key = op_key(keys[s], op_id)
            ar = a[s if a.shape[0] > 1 else 0]
            br = b[s if b.shape[0] > 1 else 0]
            orow = out[s]
            for c0 in range(0, n, chunk):
                c1 = min(n, c0 + chunk)
                nbad = 0
                for i in range(c0, c1):
                    h = bits_at(key, np.uint64(i))
                    v = value(ar, br, i)
                    bx = _f2i(v)
                    y = rnd(bx, h)
                    isbad = bad(bx) | bad(y) | (residual(ar, br, i, v) != 0.0)
                    nbad += isbad
                    flag[i - c0] = isbad
                    orow[i] = _i2f(y)
                if nbad:        # outside float32's normal range, or an inexact float64 sum:
                    for i in range(c0, c1):         # the general rounder decides
                        if flag[i - c0]:
                            v = value(ar, br, i)
                            orow[i] = rounder(v, residual(ar, br, i, v),
                                              bits_at(key, np.uint64(i)), MODE, 24, -126,
                                              _F32[2], False, 0)
    return kernel


_FAST_ROWS = {}


def fast_round_rows(mode_code, op="round"):
    """:func:`round_rows` for float32 targets without residuals, on bit patterns (sr, ud,
    cestac), with the general rounder for elements outside float32's normal range.

    ``op="round"``: ``kernel(x, x, keys, op_id, out)`` rounds float64 rows ``x`` (S or 1, n);
    ``"add"``, ``"sub"``, ``"mul"``, ``"div"``: ``kernel(a, b, keys, op_id, out)`` rounds
    ``a op b`` evaluated in float64 from float32 rows (exact for mul; add/sub whose float64
    sum is inexact -- exponents more than 29 apart -- go to the general rounder with their
    TwoSum residual), with no float64 array in between. Element ``i`` of
    sample ``s`` takes its bits at position ``i`` of that sample's stream, as round_rows
    does. ``out`` (S, n) may be float32 (the results are float32 values, stored exactly)."""
    k = _FAST_ROWS.get((mode_code, op))
    if k is None:
        k = _FAST_ROWS[(mode_code, op)] = _make_fast_rows(mode_code, _ROW_OPS[op])
    return k
