"""Tests for fpx.formats: format constants and exact integer-domain rounding.

Oracles
-------
* ``ml_dtypes`` casts *from float32* (correct for float32 inputs; its float64
  casts double-round through float32, see ``test_ml_dtypes_double_rounds``),
* NumPy's float64 -> float32 / float16 casts (correctly rounded),
* MPFR via gmpy2 with a context of the target's precision / exponent range and
  ``subnormalize=True`` (exact for every mode and for double-double inputs).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction

import gmpy2
import ml_dtypes
import numpy as np
import pytest

from fpx import formats as F

ALL = list(F.FORMATS.values())
DTYPE_BACKED = [F.float64, F.float32, F.bfloat16, F.float16, F.float8_e4m3fn, F.float8_e5m2]
SMALL = [F.bfloat16, F.float16, F.float8_e4m3fn, F.float8_e5m2]  # exhaustively enumerable
DIRECTED = ("rd", "ru", "rz")
IDS = lambda f: f.name  # noqa: E731


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------


def f64(a):
    with np.errstate(invalid="ignore"):  # ml_dtypes NaN -> float64 warns
        return np.asarray(a).astype(np.float64)


def same(a, b):
    """Equal as values, zeros with equal sign, NaN == NaN."""
    a, b = f64(a), f64(b)
    assert a.shape == b.shape
    nan = np.isnan(a)
    ok = (nan == np.isnan(b)) & (nan | ((a == b) & (np.signbit(a) == np.signbit(b))))
    return ok


def assert_same(a, b, x=None):
    ok = same(a, b)
    if not ok.all():
        i = np.flatnonzero(~ok.ravel())[:8]
        ctx = "" if x is None else f" inputs={f64(x).ravel()[i].tolist()}"
        raise AssertionError(
            f"{(~ok).sum()} mismatches; got={f64(a).ravel()[i].tolist()} "
            f"want={f64(b).ravel()[i].tolist()}{ctx}"
        )


def all_values(fmt):
    """Every bit pattern of a <= 16-bit format (tf32: float32 patterns with the
    low 13 bits zero), as float32 (NaN/inf included)."""
    if fmt is F.tf32:
        return (np.arange(2**19, dtype=np.uint32) << np.uint32(13)).view(np.float32)
    ut = np.uint8 if fmt.bits == 8 else np.uint16
    return np.arange(2**fmt.bits, dtype=np.uint32).astype(ut).view(fmt.dtype).astype(np.float32)


def grid(fmt):
    """Sorted distinct finite values of a small format as float64 (one zero)."""
    v = f64(all_values(fmt))
    return np.unique(v[np.isfinite(v)]) + 0.0  # the zero is +0.0


_MODE = {"rn": gmpy2.RoundToNearest, "rd": gmpy2.RoundDown, "ru": gmpy2.RoundUp,
         "rz": gmpy2.RoundToZero}
_EXACT = gmpy2.context(precision=2300, emin=-20000, emax=20000)


def mpfr_round(x, fmt, mode, r=None):
    """Oracle: MPFR rounding of the exact value x (+ r) into fmt."""
    ctx = gmpy2.context(precision=fmt.p, emin=fmt.emin - fmt.p + 2, emax=fmt.emax + 1,
                        subnormalize=True, round=_MODE[mode])
    plus, mp = ctx.plus, gmpy2.mpfr
    xs = f64(x).ravel().tolist()
    if r is None:
        out = np.array([float(plus(mp(v))) for v in xs])
    else:
        add = _EXACT.add
        rs = np.broadcast_to(f64(r), f64(x).shape).ravel().tolist()
        # (a zero residual must not change the sign of a zero x: -0 + 0 = +0 in MPFR)
        out = np.array([float(plus(add(mp(a), mp(b)) if b else mp(a))) for a, b in zip(xs, rs)])
    if not fmt.has_inf:  # MPFR models 480 and inf for e4m3fn; map to NaN / max
        big = np.abs(out) > fmt.max
        toward_zero = (mode == "rz") | ((mode == "rd") & (out > 0)) | ((mode == "ru") & (out < 0))
        out = np.where(big & toward_zero, np.sign(out) * fmt.max, np.where(big, np.nan, out))
    return out.reshape(f64(x).shape)


def sample(fmt, n, rng):
    """Mix of wide-range values, near-ties, subnormals of fmt and overflow edges."""
    with np.errstate(all="ignore"):
        return _sample(fmt, n, rng)


def _sample(fmt, n, rng):
    p, emin, emax = fmt.p, fmt.emin, fmt.emax
    m = n // 6
    parts = []
    # wide exponent range, random float64 significands
    e = rng.integers(emin - p - 4, emax + 3, m)
    E = np.clip(e + 1023, 0, 2046).astype(np.uint64)
    frac = rng.integers(0, 2**52, m, dtype=np.uint64)
    parts.append(((E << np.uint64(52)) | frac).view(np.float64))
    if p < 53:
        # midpoints of normal numbers, +- 0..2 float64 ulps
        M = rng.integers(2 ** (p - 1), 2**p, 2 * m).astype(np.float64)
        e = rng.integers(emin, emax + 1, 2 * m)
        mid = np.ldexp(M + 0.5, e - p + 1)
        parts.append(mid + rng.integers(-2, 3, 2 * m) * np.spacing(mid))
        # subnormal range: midpoints and uniform values
        M = rng.integers(0, 2 ** (p - 1), m).astype(np.float64)
        mid = np.ldexp(M + 0.5, emin - p + 1)
        parts.append(mid + rng.integers(-2, 3, m) * np.spacing(mid))
    parts.append(rng.random(m) * 2 * fmt.tiny)
    # overflow edges: max, threshold max + ulp/2, beyond
    q = math.ldexp(1.0, emax - p + 1)
    edges = np.array([fmt.max, fmt.max + q / 2, fmt.max + q, fmt.max + q / 2 + q / 4,
                      math.ldexp(1.0, emax + 1) if emax < 1023 else fmt.max])
    k = m - edges.size * 5
    e5 = np.repeat(edges, 5)
    near = np.concatenate([e5 + np.tile(np.arange(-2, 3), edges.size) * np.spacing(e5),
                           fmt.max * (1 + rng.uniform(-0.02, 0.02, k))])
    parts.append(near)
    x = np.concatenate(parts)
    x = x[np.isfinite(x)]
    x = np.where(rng.random(x.size) < 0.5, -x, x)
    return x


@functools.lru_cache(maxsize=8)
def _log_factorials(n):
    return np.array([math.lgamma(i + 1.0) for i in range(n + 1)])


def two_sided_binom_p(k, n, p):
    """Two-sided binomial p-value (twice the smaller tail), summing the exact
    probability mass function (log-gamma in double precision)."""
    if p == 0:
        return 1.0 if k == 0 else 0.0
    if p == 1:
        return 1.0 if k == n else 0.0
    lf = _log_factorials(n)
    i = np.arange(n + 1)
    logpmf = lf[n] - lf[i] - lf[n - i] + i * math.log(p) + (n - i) * math.log1p(-p)
    pmf = np.exp(logpmf)
    lower, upper = math.fsum(pmf[: k + 1].tolist()), math.fsum(pmf[k:].tolist())
    return min(1.0, 2 * min(lower, upper))


def assert_binomial(k, n, p, alpha=1e-6):
    pv = two_sided_binom_p(k, n, p)
    assert pv > alpha, f"binomial test failed: {k}/{n} vs p={p} (p-value {pv:.3g})"


class StubRNG:
    """A 'Generator' returning prescribed uint64 arrays, to test thresholds exactly."""

    def __init__(self, *values):
        self.values = list(values)

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False):
        v = self.values.pop(0)
        return np.full(size, v, dtype=np.uint64)


# ----------------------------------------------------------------------------
# Format objects
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", DTYPE_BACKED, ids=IDS)
def test_constants_match_finfo(fmt):
    fi = ml_dtypes.finfo(fmt.dtype)
    assert fmt.p == fi.nmant + 1
    assert fmt.emin == fi.minexp
    assert fmt.emax == fi.maxexp - 1
    assert fmt.eps == float(fi.eps)
    assert fmt.u == float(fi.eps) / 2
    assert fmt.tiny == float(fi.smallest_normal)
    assert fmt.smallest_subnormal == float(fi.smallest_subnormal)
    assert fmt.max == float(fi.max)
    assert fmt.has_inf == bool(np.isinf(np.array(np.inf).astype(fmt.dtype)))
    assert fmt.bits == np.dtype(fmt.dtype).itemsize * 8
    assert fmt.exponent_bits == fi.nexp
    assert fmt.logical_bits == fmt.bits


def test_tf32_by_hand():
    t = F.tf32
    assert (t.p, t.emin, t.emax, t.bits, t.logical_bits) == (11, -126, 127, 32, 19)
    assert t.dtype == np.float32 and t.has_inf
    assert t.u == 2.0**-11 and t.eps == 2.0**-10
    assert t.tiny == 2.0**-126 and t.smallest_subnormal == 2.0**-136
    assert t.max == (2 - 2.0**-10) * 2.0**127


def test_format_object_basics():
    assert set(F.FORMATS) == {"float64", "float32", "tf32", "bfloat16", "float16",
                              "float8_e4m3fn", "float8_e5m2"}
    for name, f in F.FORMATS.items():
        assert f.name == name and getattr(F, name) is f
        assert name in repr(f) and f"p={f.p}" in repr(f)
    with pytest.raises(dataclasses.FrozenInstanceError):
        F.float32.p = 3
    assert F.float8_e4m3fn.max == 448.0 and not F.float8_e4m3fn.has_inf
    assert F.float8_e5m2.max == 57344.0


@pytest.mark.parametrize("alias,fmt", [
    ("f64", F.float64), ("FP64", F.float64), ("double", F.float64), ("float64", F.float64),
    ("f32", F.float32), ("fp32", F.float32), ("Single", F.float32), ("tf32", F.tf32),
    ("TF32", F.tf32), ("bf16", F.bfloat16), ("BFloat16", F.bfloat16), ("f16", F.float16),
    ("fp16", F.float16), ("half", F.float16), ("fp8_e4m3", F.float8_e4m3fn),
    ("E4M3", F.float8_e4m3fn), ("fp8_e5m2", F.float8_e5m2), ("e5m2", F.float8_e5m2),
    ("float32", F.float32), ("<f8", F.float64),
    (np.float32, F.float32), (np.dtype("float16"), F.float16), (np.float64, F.float64),
    (float, F.float64), (ml_dtypes.bfloat16, F.bfloat16),
    (ml_dtypes.float8_e4m3fn, F.float8_e4m3fn), (np.dtype(ml_dtypes.float8_e5m2), F.float8_e5m2),
])
def test_get(alias, fmt):
    assert F.get(alias) is fmt
    assert F.get(fmt) is fmt


def test_get_errors_and_of():
    with pytest.raises(ValueError, match="bfloat16"):
        F.get("bf17")
    for bad in (np.int32, "int32", np.complex128, bool, object, np.dtype("O")):
        with pytest.raises(TypeError, match="real floating-point"):
            F.get(bad)
    assert F.of(np.zeros(3, np.float16)) is F.float16
    assert F.of(np.zeros(3, ml_dtypes.bfloat16)) is F.bfloat16
    assert F.of(np.float32(1)) is F.float32
    with pytest.raises(TypeError):
        F.of(np.zeros(3, np.int64))
    with pytest.raises(TypeError):
        F.of(np.zeros(3, np.complex64))


# ----------------------------------------------------------------------------
# RN: exhaustive against ml_dtypes (float32 inputs)
# ----------------------------------------------------------------------------


def _oracle_from_f32(x32, dst):
    with np.errstate(over="ignore", invalid="ignore"):
        return x32.astype(dst.dtype)


@pytest.mark.parametrize("dst", SMALL, ids=IDS)
@pytest.mark.parametrize("src", SMALL + [F.float32], ids=IDS)
def test_rn_exhaustive_patterns(src, dst):
    if src is F.float32:  # float32 inputs: the bf16 grid and its float32 neighbours
        x = np.concatenate([f64(all_values(F.bfloat16))]).astype(np.float32)
        x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))])
    else:
        x = all_values(src)
    got = F.round(x, dst)
    assert got.dtype == dst.dtype
    assert_same(got, _oracle_from_f32(x, dst), x)
    # also from float64 input (same exact values)
    assert_same(F.round(f64(x), dst), got)


@pytest.mark.parametrize("dst", SMALL, ids=IDS)
def test_rn_midpoints_and_near_ties(dst):
    v = grid(dst)
    v = v[v >= 0]
    q = math.ldexp(1.0, dst.emax - dst.p + 1)
    nxt = np.append(v[1:], v[-1] + q)  # includes the overflow threshold max + ulp/2
    mid = ((v + nxt) / 2).astype(np.float32)
    assert (f64(mid) == (v + nxt) / 2).all()  # exact in float32
    big = [dst.max * 2, dst.max * 1.03] if dst.max < 1e38 else []
    extra = np.array(big + [1e30, 3e38, dst.smallest_subnormal / 4, dst.smallest_subnormal * 0.75,
                            dst.tiny * (1 - 2.0**-20), 2.0**-149], np.float32)
    x = np.concatenate([mid, np.nextafter(mid, np.float32(np.inf)),
                        np.nextafter(mid, np.float32(-np.inf)), extra])
    x = np.concatenate([x, -x])
    assert_same(F.round(x, dst), _oracle_from_f32(x, dst), x)


def test_e4m3fn_overflow_matches_ml_dtypes():
    x = np.array([448, 449, 463.9, 464, 464.01, 465, 479, 480, 500, 1e6, np.inf], np.float32)
    x = np.concatenate([x, -x])
    got = F.round(x, "e4m3")
    assert_same(got, x.astype(ml_dtypes.float8_e4m3fn))
    assert_same(got[:4], [448] * 4) and np.isnan(f64(got[4:11])).all()
    sat = F.round(x, "e4m3", saturate=True)
    assert_same(sat, np.where(x > 0, 448.0, -448.0))


def test_ml_dtypes_double_rounds():
    x = 1 + 2.0**-8 + 2.0**-30
    assert float(np.float64(x).astype(ml_dtypes.bfloat16)) == 1.0  # ml_dtypes: via float32
    assert float(F.round(x, "bf16")) == 1 + 2.0**-7  # correct rounding
    assert float(mpfr_round(np.array([x]), F.bfloat16, "rn")[0]) == 1 + 2.0**-7


# ----------------------------------------------------------------------------
# RN / directed on random float64 values
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [F.float32, F.float16], ids=IDS)
def test_rn_random_vs_numpy(fmt):
    rng = np.random.default_rng(1234 + fmt.p)
    x = sample(fmt, 1_000_000, rng)
    assert x.size >= 1_000_000 * 0.99
    with np.errstate(over="ignore"):
        want = x.astype(fmt.dtype)
    assert_same(F.round(x, fmt), want, x)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [F.bfloat16, F.tf32], ids=IDS)
def test_rn_random_vs_mpfr(fmt):
    rng = np.random.default_rng(99 + fmt.p)
    x = sample(fmt, 1_000_000, rng)
    got = F.round(x, fmt)
    assert got.dtype == fmt.dtype
    assert_same(got, mpfr_round(x, fmt, "rn"), x)
    if fmt is F.tf32:  # at most 11 significant bits
        m = got.view(np.uint32) & np.uint32(0x1FFF)
        assert (m[np.isfinite(got)] == 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_directed_vs_mpfr(fmt):
    rng = np.random.default_rng(7 + fmt.p + fmt.emax)
    if fmt is F.float64:  # identity on float64 inputs; use double-double pairs instead
        a = rng.standard_normal(100_000) * np.exp2(rng.integers(-1000, 1000, 100_000))
        b = a * rng.standard_normal(100_000) * np.exp2(-rng.integers(0, 80, 100_000))
        x = a + b
        r = (a - (x - (x - a))) + (b - (x - a))  # TwoSum error: x + r == a + b
        r = np.where(np.isfinite(r), r, 0.0)
    else:
        x = sample(fmt, 100_000, rng)
        r = None
    for mode in DIRECTED:
        got = F.round(x, fmt, mode, residual=r)
        assert_same(got, mpfr_round(x, fmt, mode, r), x)
    lo = f64(F.round(x, fmt, "rd", residual=r))
    hi = f64(F.round(x, fmt, "ru", residual=r))
    fin = np.isfinite(lo) & np.isfinite(hi)
    assert (lo[fin] <= x[fin]).all() and (x[fin] <= hi[fin]).all()
    if r is None:  # exact comparisons with the float64 inputs
        assert ((lo < x) == (hi > x))[fin].all()


def test_directed_float32_vs_numpy_construction():
    """Cross-check of the MPFR oracle setup on float32 (incl. subnormals)."""
    rng = np.random.default_rng(5)
    x = sample(F.float32, 60_000, rng)
    x = x[np.abs(x) < F.float32.max / 2]
    x32 = f64(x.astype(np.float32))
    up = f64(np.nextafter(x.astype(np.float32), np.float32(np.inf)))
    dn = f64(np.nextafter(x.astype(np.float32), np.float32(-np.inf)))
    rd = np.where(x32 <= x, x32, dn)
    ru = np.where(x32 >= x, x32, up)
    rd = np.where(x == 0, x, rd)
    ru = np.where(x == 0, x, ru)
    assert_same(F.round(x, "f32", "rd"), rd, x)
    assert_same(F.round(x, "f32", "ru"), ru, x)
    assert_same(mpfr_round(x[:5000], F.float32, "rd"), rd[:5000])
    assert_same(mpfr_round(x[:5000], F.float32, "ru"), ru[:5000])


@pytest.mark.parametrize("fmt", SMALL, ids=IDS)
def test_directed_exhaustive_grid(fmt):
    """Every float32 pattern of the bf16 grid (+-1 ulp) against the fmt grid."""
    v = grid(fmt)
    x = f64(all_values(F.bfloat16))
    x = x[np.isfinite(x)]
    x = np.concatenate([x, f64(np.nextafter(x.astype(np.float32), np.float32(np.inf)))])
    i = np.searchsorted(v, x, side="right") - 1  # v[i] <= x
    inside = (x >= v[0]) & (x <= v[-1])
    x = x[inside]
    i = i[inside]
    down = v[i]
    up = np.where(down == x, x, v[np.minimum(i + 1, v.size - 1)])
    signed = lambda y: np.where(y == 0, np.copysign(0.0, x), y)  # noqa: E731
    assert_same(F.round(x, fmt, "rz"), signed(np.where(x >= 0, down, up)), x)
    assert_same(F.round(x, fmt, "rd"), signed(down), x)
    assert_same(F.round(x, fmt, "ru"), signed(up), x)


# ----------------------------------------------------------------------------
# stochastic modes
# ----------------------------------------------------------------------------


SR_CASES = [
    (F.bfloat16, 1 + 2.0**-9 + 2.0**-11),      # p = 5/8 of the way up
    (F.bfloat16, -1 / 3),
    (F.float16, 0.1),
    (F.float16, 3 * 2.0**-27),                  # subnormal range of float16
    (F.float16, 1.5 * 2.0**-37),                # discarded width k > 64
    (F.float8_e4m3fn, 1.25 * 2.0**-22),         # k > 64, probability ~1.5e-4
    (F.float8_e4m3fn, 300.0),
    (F.float8_e5m2, -1e-6),
    (F.tf32, math.pi),
    (F.float32, 1 + 2.0**-30),
]


def _neighbours_exact(x, fmt):
    down = f64(F.round(x, fmt, "rd"))[()]
    up = f64(F.round(x, fmt, "ru"))[()]
    p = Fraction(x) - Fraction(down)
    p = float(p / (Fraction(up) - Fraction(down))) if up != down else 0.0
    return down, up, p


@pytest.mark.parametrize("fmt,x", SR_CASES, ids=lambda c: getattr(c, "name", repr(c)))
def test_sr_frequency_and_mean(fmt, x):
    n = 200_000
    rng = np.random.default_rng(2024)
    down, up, p = _neighbours_exact(x, fmt)
    assert down < x < up
    y = f64(F.round(np.full(n, x), fmt, "sr", rng))
    assert np.isin(y, [down, up]).all()
    k = int((y == up).sum())
    assert_binomial(k, n, p)
    # unbiasedness: the exact mean is down + (k/n) * (up - down) with E[k/n] = p
    s = math.fsum(y.tolist())
    assert Fraction(s) == n * Fraction(down) + k * (Fraction(up) - Fraction(down))
    sd = (up - down) * math.sqrt(max(p * (1 - p), 1e-300) / n)
    assert abs(s / n - x) <= 5.5 * sd + 4 * (up - down) / n  # |z| < 5.5: p-value ~ 4e-8


def test_sr_tiny_probability_is_not_rounded_up():
    # probability 2**-176 * 1.5: must essentially never move up (k > 117)
    x = np.full(100_000, 1.5 * 2.0**-200)
    y = f64(F.round(x, "f16", "sr", np.random.default_rng(0)))
    assert (y == 0).all() and not np.signbit(y).any()
    y = f64(F.round(-x, "e4m3", "sr", np.random.default_rng(0)))
    assert (y == 0).all() and np.signbit(y).all()


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_sr_exact_inputs_never_move_and_deterministic(fmt):
    rng = np.random.default_rng(11)
    x = f64(F.round(sample(fmt, 30_000, rng), fmt))
    x = x[np.isfinite(x)]
    for mode in ("sr", "cestac"):
        assert_same(F.round(x, fmt, mode, np.random.default_rng(3)), x)
    z = sample(fmt, 30_000, rng)
    a = F.round(z, fmt, "sr", np.random.default_rng(42))
    b = F.round(z, fmt, "sr", np.random.default_rng(42))
    assert_same(a, b)
    lo, hi = f64(F.round(z, fmt, "rd")), f64(F.round(z, fmt, "ru"))
    y = f64(a)
    assert (same(y, lo) | same(y, hi)).all()


def test_sr_default_rng_and_threshold_exact():
    y = F.round(np.full(1000, 1 + 2.0**-9), "bf16", "sr")  # rng=None
    assert set(f64(y).tolist()) <= {1.0, 1 + 2.0**-7}
    # 1 + 5*2**-12 in bf16: k = 45 discarded bits, rem = 5 * 2**40 out of 2**45.
    x = 1 + 5 * 2.0**-12
    thr = 5 * 2**40 << 19  # u1 >> 19 < rem  <=>  u1 < thr
    assert float(F.round(x, "bf16", "sr", StubRNG(thr - 1))) == 1 + 2.0**-7
    assert float(F.round(x, "bf16", "sr", StubRNG(thr))) == 1.0


def test_ud():
    fmt = F.bfloat16
    rng = np.random.default_rng(8)
    x = sample(fmt, 50_000, rng)
    x = x[np.abs(x) < fmt.max / 2]
    r = f64(F.round(x, fmt))
    y = f64(F.round(x, fmt, "ud", np.random.default_rng(1)))
    nz = r != 0
    assert_same(y[~nz], r[~nz])
    up, dn = F.next_up(r, fmt), F.next_down(r, fmt)
    assert (same(y, up) | same(y, dn))[nz].all() and (y != r)[nz].all()
    k = int((y[nz] > r[nz]).sum())
    assert_binomial(k, int(nz.sum()), 0.5)
    # zeros never move (sign kept)
    z = F.round(np.array([0.0, -0.0, 1e-300, -1e-300]), fmt, "ud", rng)
    assert_same(z, [0.0, -0.0, 0.0, -0.0])
    # at a power of two the down neighbour is half the up gap
    n = 100_000
    y = f64(F.round(np.ones(n), fmt, "ud", np.random.default_rng(2)))
    assert set(np.unique(y).tolist()) == {1 - 2.0**-8, 1 + 2.0**-7}
    assert_binomial(int((y > 1).sum()), n, 0.5)
    # edges: smallest subnormal steps to a signed zero, max overflows
    s = F.float16.smallest_subnormal
    y = f64(F.round(np.full(4000, -s), "f16", "ud", np.random.default_rng(3)))
    assert set(y.tolist()) == {-2 * s, 0.0} and np.signbit(y).all()
    y = f64(F.round(np.full(4000, 65504.0), "f16", "ud", np.random.default_rng(3)))
    assert set(y.tolist()) == {65472.0, np.inf}
    y = f64(F.round(np.full(4000, 448.0), "e4m3", "ud", np.random.default_rng(3)))
    assert np.isnan(y).any() and set(y[~np.isnan(y)].tolist()) == {416.0}
    y = f64(F.round(np.full(4000, 448.0), "e4m3", "ud", np.random.default_rng(3), saturate=True))
    assert set(y.tolist()) == {416.0, 448.0}
    assert np.isnan(f64(F.round(np.nan, "f16", "ud", rng)))


def test_cestac():
    fmt = F.float16
    x = np.full(100_000, 0.1)
    y = f64(F.round(x, fmt, "cestac", np.random.default_rng(4)))
    lo, hi = f64(F.round(0.1, fmt, "rd")), f64(F.round(0.1, fmt, "ru"))
    assert set(np.unique(y).tolist()) == {float(lo), float(hi)}
    assert_binomial(int((y == hi).sum()), x.size, 0.5)
    # overflow: rd -> max, ru -> inf
    y = f64(F.round(np.full(1000, 1e6), fmt, "cestac", np.random.default_rng(4)))
    assert set(y.tolist()) == {65504.0, np.inf}
    assert_same(F.round(np.array([0.5, -0.0, np.inf]), fmt, "cestac"), [0.5, -0.0, np.inf])


# ----------------------------------------------------------------------------
# residual (double-double inputs)
# ----------------------------------------------------------------------------


def test_residual_float64():
    one, t = 1.0, 2.0**-53
    nu, nd = np.nextafter(1.0, 2.0), np.nextafter(1.0, 0.0)
    R = lambda x, r, m="rn", **k: float(F.round(x, "f64", m, residual=r, **k))  # noqa: E731
    assert R(one, t) == 1.0                       # exact tie, 1 is even
    assert R(nu, t) == np.nextafter(nu, 2.0)      # exact tie, nu is odd -> up
    assert R(one, -t / 2) == 1.0                  # tie below 1: 1 - 2**-53 is odd
    assert R(one, -t / 2 * (1 + 2.0**-52)) == nd  # just beyond the lower midpoint
    assert R(one, t * (1 - 2.0**-52)) == 1.0
    for r in (1e-30, -1e-30):
        up = r > 0
        assert R(one, r, "ru") == (nu if up else 1.0)
        assert R(one, r, "rd") == (1.0 if up else nd)
        assert R(one, r, "rz") == (1.0 if up else nd)
        assert R(-one, -r, "rd") == (-nu if up else -1.0)
        assert R(-one, -r, "rz") == (-1.0 if up else -nd)
        assert R(one, r, "cestac", rng=np.random.default_rng(0)) in (1.0, nu if up else nd)
    assert R(one, 0.0, "ru") == 1.0
    assert R(0.0, 1e-300) == 1e-300 and R(-0.0, 0.0) == 0.0  # (0, r) rounds r
    # sr: move toward the residual with probability |r| / gap
    n = 200_000
    for r, nb, p in [(2.0**-54, nu, 0.25), (-(2.0**-55), nd, 0.25), (-3 * 2.0**-57, nd, 0.1875)]:
        y = f64(F.round(np.ones(n), "f64", "sr", np.random.default_rng(6), residual=r))
        assert np.isin(y, [1.0, nb]).all()
        assert_binomial(int((y == nb).sum()), n, p)
    y = F.round(np.ones(10), "f64", "sr", np.random.default_rng(6), residual=0.0)
    assert (f64(y) == 1.0).all()


def test_residual_narrow():
    fmt = "bf16"
    R = lambda x, r, m="rn": float(F.round(x, fmt, m, residual=r))  # noqa: E731
    tie = 1 + 2.0**-8
    assert R(tie, 0.0) == 1.0 and R(tie, 2.0**-60) == 1 + 2.0**-7 and R(tie, -(2.0**-60)) == 1.0
    assert R(-tie, -(2.0**-60)) == -(1 + 2.0**-7)
    assert R(1 + 3 * 2.0**-8, -(2.0**-60)) == 1 + 2.0**-7  # odd tie broken downward
    assert R(1.0, -(2.0**-60), "rd") == 1 - 2.0**-8 and R(1.0, -(2.0**-60), "ru") == 1.0
    assert R(1.0, 2.0**-60, "ru") == 1 + 2.0**-7 and R(1.0, 2.0**-60, "rz") == 1.0
    assert R(1.0, -(2.0**-60), "rz") == 1 - 2.0**-8
    assert R(-1.0, 2.0**-60, "ru") == -(1 - 2.0**-8)
    # inexact-by-residual in the subnormal range of float16
    s = F.float16.smallest_subnormal
    assert float(F.round(s, "f16", "rd", residual=-1e-30)) == 0.0
    assert float(F.round(s, "f16", "ru", residual=1e-30)) == 2 * s
    # sr on an exact x: only the residual side can be reached
    y = f64(F.round(np.ones(1000), fmt, "sr", np.random.default_rng(0), residual=-(2.0**-60)))
    assert set(y.tolist()) <= {1.0, 1 - 2.0**-8}
    # exact sr threshold with a residual (stub generator): x = 1, r = 3 * 2**-60;
    # k = 45, rem = 0, f = r / 2**-52 = 3/256: up iff u1 >> 19 == 0 and u2 < 3 * 2**56
    x, r, up = 1.0, 3 * 2.0**-60, 1 + 2.0**-7
    assert float(F.round(x, fmt, "sr", StubRNG(2**19 - 1, 3 * 2**56 - 1), residual=r)) == up
    assert float(F.round(x, fmt, "sr", StubRNG(2**19, 0), residual=r)) == 1.0
    assert float(F.round(x, fmt, "sr", StubRNG(0, 3 * 2**56), residual=r)) == 1.0
    # negative residual on exact x: bracket [1 - 2**-8, 1], down with probability
    # |r| / 2**-8 = y / 2**64 (y = 3 * 2**11): down iff u2 >= 2**64 - y
    r = -3 * 2.0**-61
    thr = 2**64 - 3 * 2**11
    assert float(F.round(x, fmt, "sr", StubRNG(0, thr), residual=r)) == 1 - 2.0**-8
    assert float(F.round(x, fmt, "sr", StubRNG(0, thr - 1), residual=r)) == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [F.float32, F.bfloat16, F.float16, F.float8_e4m3fn, F.tf32], ids=IDS)
def test_residual_vs_mpfr(fmt):
    """Representable values and midpoints plus a residual, all modes vs MPFR."""
    rng = np.random.default_rng(31 + fmt.p)
    n = 40_000
    x = sample(fmt, n, rng)
    x = np.where(rng.random(x.size) < 0.5, f64(F.round(x, fmt, "rz")), x)  # exact values
    x = x[np.isfinite(x)]
    M = rng.integers(2 ** (fmt.p - 1), 2**fmt.p, 5000) + 0.5
    mid = np.ldexp(M, rng.integers(-3, 3, 5000) - fmt.p + 1)
    x = np.concatenate([x, mid, -mid])
    frac = rng.uniform(-0.5, 0.5, x.size)
    frac[rng.random(x.size) < 0.1] = 0.0
    r = frac * np.spacing(np.abs(x))
    r = np.where(x == 0, 0.0, r)
    for mode in ("rn",) + DIRECTED:
        assert_same(F.round(x, fmt, mode, residual=r), mpfr_round(x, fmt, mode, r), x)


# ----------------------------------------------------------------------------
# edge inputs
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
@pytest.mark.parametrize("mode", F.MODES)
def test_special_values(fmt, mode):
    rng = np.random.default_rng(0)
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -5e-324, -1e-310, 1e308, -1e308])
    y = f64(F.round(x, fmt, mode, rng))
    assert np.isnan(y[0])
    if fmt.has_inf:
        assert y[1] == np.inf and y[2] == -np.inf
    else:
        assert np.isnan(y[1]) and np.isnan(y[2])
    assert_same(y[3:5], [0.0, -0.0])
    assert np.signbit(y[5]) and np.signbit(y[6])  # negative subnormals keep the sign
    if fmt is not F.float64:
        assert np.abs(y[5]) <= fmt.smallest_subnormal
    big = y[7:]
    assert np.signbit(big[1]) and not np.signbit(big[0])
    if fmt is not F.float64:
        assert ((np.abs(big) == fmt.max) | np.isinf(big) | np.isnan(big)).all()
    ys = f64(F.round(x, fmt, mode, rng, saturate=True))
    assert np.isnan(ys[0])
    assert_same(ys[[1, 2]], [fmt.max, -fmt.max])
    if fmt is not F.float64:
        assert_same(ys[[7, 8]], [fmt.max, -fmt.max])


@pytest.mark.parametrize("fmt", ALL[1:], ids=IDS)
def test_overflow_rules(fmt):
    m = fmt.max
    q = math.ldexp(1.0, fmt.emax - fmt.p + 1)
    over = np.inf if fmt.has_inf else np.nan
    thr = m + q / 2  # IEEE: ties at the threshold go to inf (max is odd); e4m3fn: to 448
    x = np.array([thr, np.nextafter(thr, 0), np.nextafter(thr, np.inf), 1e300])
    assert_same(F.round(x, fmt), [over if fmt.has_inf else m, m, over, over])
    assert_same(F.round(-x, fmt), -f64(F.round(x, fmt)))
    assert_same(F.round(x, fmt, "rz"), [m] * 4)
    assert_same(F.round(x, fmt, "rd"), [m] * 4)
    assert_same(F.round(-x, fmt, "rd"), [-over] * 4)
    assert_same(F.round(x, fmt, "ru"), [over] * 4)
    assert_same(F.round(-x, fmt, "ru"), [-m] * 4)
    assert_same(F.round(x, fmt, "sr", np.random.default_rng(0))[3], over)
    for mode in F.MODES:
        ys = f64(F.round(x, fmt, mode, np.random.default_rng(0), saturate=True))
        if mode == "ud":  # x[1] rounds to max, then steps down or (clamped) up
            assert ys[1] in (m, f64(F.next_down(m, fmt)))
            ys[1] = m
        assert_same(ys, [m] * 4)
        assert_same(F.round(-x[[0, 2, 3]], fmt, mode, np.random.default_rng(0), saturate=True), [-m] * 3)


def test_float64_passthrough():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 2**64 - 1, 10_000, dtype=np.uint64, endpoint=True).view(np.float64)
    for mode in ("rn", "rd", "ru", "rz", "sr", "cestac"):
        assert_same(F.round(x, "f64", mode, rng), x)


def test_errors_and_shapes():
    with pytest.raises(ValueError, match="rn.*rd.*ru.*rz.*sr.*ud.*cestac"):
        F.round(1.0, "bf16", "nearest")
    with pytest.raises(ValueError, match="known formats"):
        F.round(1.0, "bf15")
    with pytest.raises(TypeError, match="real floating-point"):
        F.round(1.0, np.int32)
    with pytest.raises(TypeError, match="real floating-point"):
        F.round(np.ones(2, np.complex128), "bf16")
    for mode in F.MODES:
        e = F.round(np.zeros((2, 0)), "e5m2", mode)
        assert e.shape == (2, 0) and e.dtype == ml_dtypes.float8_e5m2
    y = F.round(np.array(0.1), "bf16")
    assert y.shape == () and y.dtype == ml_dtypes.bfloat16
    assert float(F.round(0.1, "f32")) == float(np.float32(0.1))
    assert float(F.round(3, "e4m3")) == 3.0 and float(F.round(17, "e4m3")) == 16.0
    assert F.round(np.ones((3, 4), np.float16), "tf32").dtype == np.float32
    assert F.round(np.ones((3, 4), ml_dtypes.bfloat16), "f16", "sr").shape == (3, 4)
    y = F.round(np.ones((3, 1)), "bf16", residual=np.array([0.0, 1e-30, -1e-30]), mode="ru")
    assert y.shape == (3, 3) and (f64(y)[:, 1] > 1).all()
    for fn in (F.ulp, F.next_up, F.next_down):
        assert fn(np.zeros((0, 3)), "bf16").shape == (0, 3)
        assert fn(1.0, "bf16").shape == ()
    assert F.representable(1.0, "e4m3").shape == ()


# ----------------------------------------------------------------------------
# ulp / neighbours / representable
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [F.float64, F.float32, F.float16], ids=IDS)
def test_helpers_vs_numpy(fmt):
    rng = np.random.default_rng(17)
    dt = fmt.dtype
    if fmt is F.float16:
        v = np.arange(2**16, dtype=np.uint16).view(np.float16)
    else:
        ut = np.uint64 if fmt is F.float64 else np.uint32
        v = rng.integers(0, np.iinfo(ut).max, 100_000, dtype=ut, endpoint=True).view(dt)
        s = fmt.smallest_subnormal
        special = [0, -0.0, np.inf, -np.inf, np.nan, fmt.tiny, s, -s, fmt.max, -fmt.max]
        v = np.concatenate([v, np.array(special, dt)])
    x = f64(v)
    with np.errstate(over="ignore", invalid="ignore"):
        assert_same(F.next_up(x, fmt), f64(np.nextafter(v, dt.type(np.inf))), x)
        assert_same(F.next_down(x, fmt), f64(np.nextafter(v, dt.type(-np.inf))), x)
        sp = f64(np.spacing(np.abs(v)))  # np.spacing(-2**k) (float16) is the gap toward 0
    fin = np.isfinite(x) & (np.abs(x) != fmt.max)
    assert_same(F.ulp(x, fmt)[fin], sp[fin])
    assert (F.ulp(np.array([fmt.max, -fmt.max]), fmt) == math.ldexp(1.0, fmt.emax - fmt.p + 1)).all()
    assert np.isnan(F.ulp(np.array([np.nan, np.inf]), fmt)).all()
    assert (F.representable(x, fmt) == ~np.isnan(x)).all()
    if fmt is not F.float64:  # arbitrary float64 values
        z = sample(fmt, 60_000, rng)
        with np.errstate(over="ignore"):
            z32 = f64(z.astype(dt))
        assert (F.representable(z, fmt) == (z32 == z)).all()
        ru = f64(F.round(z, fmt, "ru"))
        rd = f64(F.round(z, fmt, "rd"))
        nu = F.next_up(z, fmt)
        nd = F.next_down(z, fmt)
        inexact = ~F.representable(z, fmt) & (np.abs(z) < fmt.max)
        assert_same(nu[inexact], ru[inexact])
        assert_same(nd[inexact], rd[inexact])
        fin = np.abs(z) <= fmt.max
        assert_same(F.ulp(z, fmt)[fin], F.ulp(F.round(z, fmt, "rz"), fmt)[fin])


@pytest.mark.parametrize("fmt", SMALL + [F.tf32], ids=IDS)
def test_helpers_exhaustive_grid(fmt):
    v = grid(fmt)  # every finite value, sorted, one +0
    nxt = np.where(v[1:] == 0, -0.0, v[1:])  # next_up(-smallest_subnormal) is -0.0
    assert_same(F.next_up(v[:-1], fmt), nxt)
    assert_same(F.next_down(v[1:], fmt), v[:-1])
    pos = v[v >= 0]
    assert_same(F.ulp(pos[:-1], fmt), np.diff(pos))
    assert_same(F.ulp(-pos[:-1], fmt), np.diff(pos))
    assert F.representable(v, fmt).all()
    mids = (pos[:-1] + pos[1:]) / 2
    assert not F.representable(np.concatenate([mids, -mids]), fmt).any()
    special = F.representable(np.array([np.inf, -np.inf, np.nan]), fmt)
    assert (special == [fmt.has_inf, fmt.has_inf, False]).all()
    top = F.next_up(fmt.max, fmt)
    assert top == np.inf if fmt.has_inf else np.isnan(top)
    assert F.next_up(-np.inf, fmt) == -fmt.max and F.next_down(np.inf, fmt) == fmt.max
    assert F.next_up(np.inf, fmt) == np.inf and F.next_down(-np.inf, fmt) == -np.inf
    assert F.ulp(0.0, fmt) == fmt.smallest_subnormal
    assert F.next_up(-0.0, fmt) == fmt.smallest_subnormal
    y = F.next_up(-fmt.smallest_subnormal, fmt)
    assert y == 0 and np.signbit(y)
    y = F.next_down(fmt.smallest_subnormal, fmt)
    assert y == 0 and not np.signbit(y)
    # non-representable inputs: neighbours are the directed roundings
    assert_same(F.next_up(mids, fmt), pos[1:])
    assert_same(F.next_down(mids, fmt), pos[:-1])
