"""Correctly rounded float32/float16/bfloat16 math (fpx.kernels.crmath) against MPFR."""
import math
import os

import ml_dtypes
import numpy as np
import pytest

from fpx import formats
from fpx.kernels import crmath

gmpy2 = pytest.importorskip("gmpy2")
F32 = formats.get("float32")

# where each function's float32 results are neither trivial nor saturated
_RANGE = {"exp": (-104, 89), "expm1": (-20, 89), "exp2": (-150, 128), "log": (0, 1e38),
          "log1p": (-1, 1e38), "log2": (0, 1e38), "sin": (-1e5, 1e5), "cos": (-1e5, 1e5),
          "tan": (-1e4, 1e4), "tanh": (-10, 10), "sinh": (-90, 90), "cosh": (-90, 90),
          "atan": (-1e4, 1e4), "erf": (-4, 4), "sigmoid": (-110, 20)}
_SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0 ** -149, -2.0 ** -149,
                     2.0 ** -126, 3.4028235e38, -3.4028235e38, 88.72283, 88.72284, -87.33654,
                     -103.97208, -103.97209, 0.5, 1e-30, -1e-30, 1.1754942e-38], np.float32)
# float32 inputs where (float)f((double)x) -- RepDL's evaluation -- is not correctly rounded,
# found by sweeping all 2^32 float32 inputs with glibc's float64 functions and MPFR
_DOUBLE_ROUNDING_HARD = {
    "log": [0x3c413d3a, 0x41178feb, 0x4c5d65a5, 0x65d890d3, 0x6f31a8ec],
}


def _inputs(name, n, seed):
    """n float32 inputs: half random bit patterns (every binade), half uniform over the
    function's interesting range, plus the special values."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2 ** 32, n // 2, dtype=np.uint64).astype(np.uint32).view(np.float32)
    lo, hi = _RANGE[name]
    uni = rng.uniform(lo, hi, n - n // 2).astype(np.float32)
    return np.concatenate([bits, uni, _SPECIAL])


def _same(a, b):
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def _mpfr(name, x, F=F32):
    with np.errstate(all="ignore"):
        return np.asarray(crmath.mpfr_eval(name, x.astype(np.float64).tolist(), F),
                          np.float64).astype(x.dtype)


def _numpy64(name, x):
    """An independent float64 evaluation (NumPy's own kernels, not the libm numba calls)."""
    d = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if name == "sigmoid":
            return 1.0 / (1.0 + np.exp(-d))
        if name == "erf":
            return np.array([math.erf(v) for v in d])
        return getattr(np, {"atan": "arctan"}.get(name, name))(d)


@pytest.mark.parametrize("name", crmath.FUNCTIONS)
def test_float32_agrees_with_mpfr_on_random_and_hard_inputs(name):
    """5·10^4 inputs against MPFR directly, and 10^6 more against a test independent of the
    kernel: where NumPy's float64 value is far (2^-36 relative) from every float32 midpoint
    its float32 rounding is the answer, elsewhere MPFR is."""
    x = _inputs(name, 50_000, 1)
    with np.errstate(all="ignore"):
        got = crmath.cr_apply(name, x, F32)
    assert _same(got, _mpfr(name, x)).all()
    x = _inputs(name, 1_000_000, 2)
    if name == "erf":
        x = x[:200_000]             # math.erf per element is slow
    with np.errstate(all="ignore"):
        got = crmath.cr_apply(name, x, F32)
        y = _numpy64(name, x)
        e = np.where(np.isfinite(y), np.abs(y) * 2.0 ** -36, 0)
        lo, hi = (y - e).astype(np.float32), (y + e).astype(np.float32)
    easy = lo.view(np.uint32) == hi.view(np.uint32)
    assert _same(got[easy], lo[easy]).all()
    assert (~easy).sum() < x.size // 50
    assert _same(got[~easy], _mpfr(name, x[~easy])).all()


@pytest.mark.parametrize("name", crmath.FUNCTIONS)
def test_inputs_closest_to_a_midpoint_agree_with_mpfr(name):
    """The hardest inputs of a 2^20-input sweep (float64 value closest to a float32 rounding
    boundary: where the slow path must decide), and the known double-rounding failures."""
    lo, hi = _RANGE[name]
    x = np.linspace(lo, hi, 1 << 20, dtype=np.float64).astype(np.float32)
    with np.errstate(all="ignore"):
        y = _numpy64(name, x) if name != "erf" else np.array([math.erf(v) for v in x[::16]])
    if name == "erf":
        x = x[::16]
    y32 = y.astype(np.float32)
    nb = np.where(y32.astype(np.float64) < y, np.nextafter(y32, np.float32(np.inf)),
                  np.nextafter(y32, np.float32(-np.inf))).astype(np.float64)
    mid = (y32.astype(np.float64) + nb) / 2
    with np.errstate(all="ignore"):
        dist = np.abs(y - mid) / np.abs(y)
    dist[~np.isfinite(dist)] = np.inf
    hard = np.concatenate([x[np.argsort(dist)[:64]],
                           np.array(_DOUBLE_ROUNDING_HARD.get(name, []), np.uint32).view(np.float32)])
    with np.errstate(all="ignore"):
        got = crmath.cr_apply(name, hard, F32)
    assert _same(got, _mpfr(name, hard)).all()


def test_special_values_follow_c99():
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    z, nz = np.float32(0.0), np.float32(-0.0)
    cases = {"exp": [(-inf, 0.0), (inf, inf), (nz, 1.0), (np.float32(88.72284), inf)],
             "log": [(z, -inf), (nz, -inf), (np.float32(-1), nan), (inf, inf)],
             "log1p": [(np.float32(-1), -inf), (nz, nz)], "expm1": [(nz, nz), (-inf, -1.0)],
             "sin": [(nz, nz), (inf, nan)], "tanh": [(nz, nz), (inf, 1.0), (-inf, -1.0)],
             "atan": [(inf, np.float32(np.pi / 2))], "erf": [(-inf, -1.0), (nz, nz)],
             "sigmoid": [(-inf, 0.0), (inf, 1.0), (z, 0.5)]}
    for name, pairs in cases.items():
        x = np.array([p[0] for p in pairs], np.float32)
        want = np.array([p[1] for p in pairs], np.float32)
        with np.errstate(all="ignore"):
            got = crmath.cr_apply(name, x, F32)
        assert _same(got, want).all(), (name, got, want)
        assert (got[np.isnan(got)].view(np.uint32) == 0x7FC00000).all()   # canonical NaN


def test_subnormal_results_are_kept_and_correctly_rounded():
    x = np.float32(-100.0) - np.arange(0, 400, dtype=np.float32) / 100   # exp: subnormal results
    got = crmath.cr_apply("exp", x, F32)
    assert (got[: 300] > 0).all() and (np.abs(got) < 2 ** -126).any()
    assert _same(got, _mpfr("exp", x)).all()


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_narrow_formats_round_once_from_the_exact_value(fmt):
    """float16/bfloat16 results are MPFR's in their own precision and range -- not float32's
    correctly rounded result rounded again (double rounding, which differs on some inputs)."""
    F = formats.get(fmt)
    dt = np.float16 if fmt == "float16" else ml_dtypes.bfloat16
    rng = np.random.default_rng(3)
    for name in ("exp", "log", "tanh", "sin", "sigmoid", "erf"):
        lo, hi = _RANGE[name]
        x = rng.uniform(max(lo, -60), min(hi, 60), 20_000).astype(dt)
        with np.errstate(all="ignore"):
            got = crmath.cr_apply(name, x, F)
            ref = _mpfr(name, x, F)
        assert got.dtype == x.dtype
        assert (got.view(np.uint16) == ref.view(np.uint16)).all() or \
            _same(got.astype(np.float32), ref.astype(np.float32)).all(), name


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("FPX_REPRODUCIBLE") != "full",
                    reason="10^6 MPFR evaluations per function: set FPX_REPRODUCIBLE=full")
@pytest.mark.parametrize("name", crmath.FUNCTIONS)
def test_float32_agrees_with_mpfr_on_a_million_inputs(name):
    """Every one of 10^6 inputs against MPFR (about 10 s per function)."""
    x = _inputs(name, 1_000_000, 5)
    with np.errstate(all="ignore"):
        got = crmath.cr_apply(name, x, F32)
    assert _same(got, _mpfr(name, x)).all()


def test_the_known_double_rounding_inputs_of_log_are_fixed():
    """The five float32 inputs where RepDL's (float)log((double)x) is wrong: fpx is right."""
    x = np.array(_DOUBLE_ROUNDING_HARD["log"], np.uint32).view(np.float32)
    naive = np.log(x.astype(np.float64)).astype(np.float32)
    ref = _mpfr("log", x)
    assert not _same(naive, ref).any()
    assert _same(crmath.cr_apply("log", x, F32), ref).all()


def _inputs2(name, n, seed):
    """(x, z) pairs for pow and atan2: random bit patterns for both (every binade, specials
    included), and pairs where pow's result stays in float32's range or atan2's quotient is
    moderate; plus special pairs."""
    rng = np.random.default_rng(seed)
    q = n // 3
    x1 = rng.integers(0, 2 ** 32, q, dtype=np.uint64).astype(np.uint32).view(np.float32)
    z1 = rng.integers(0, 2 ** 32, q, dtype=np.uint64).astype(np.uint32).view(np.float32)
    if name == "pow":
        x2 = np.exp2(rng.uniform(-20, 20, n - q)).astype(np.float32)
        x2[::3] *= -1                                      # negative bases, integer powers
        z2 = rng.uniform(-6, 6, n - q).astype(np.float32)
        z2[::3] = np.round(z2[::3])
        z2[1::3] = rng.uniform(-4, 4, len(z2[1::3])).astype(np.float32)
    else:
        x2 = rng.standard_normal(n - q).astype(np.float32) * 10 ** rng.uniform(-5, 5, n - q)
        z2 = rng.standard_normal(n - q).astype(np.float32) * 10 ** rng.uniform(-5, 5, n - q)
    sp = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 0.5, 2.0, 2.0 ** -149],
                  np.float32)
    xs, zs = np.meshgrid(sp, sp)
    return (np.concatenate([x1, x2.astype(np.float32), xs.ravel()]),
            np.concatenate([z1, z2.astype(np.float32), zs.ravel()]))


def _mpfr2(name, x, z, F=F32):
    with np.errstate(all="ignore"):
        return np.asarray(crmath.mpfr_eval(name, x.astype(np.float64).tolist(), F,
                                           z.astype(np.float64).tolist()),
                          np.float64).astype(x.dtype)


@pytest.mark.parametrize("name", crmath.FUNCTIONS2)
def test_pow_and_atan2_agree_with_mpfr(name):
    """3·10^4 pairs against MPFR directly (C99 Annex F's special cases among them), and
    10^6 more against NumPy's float64 function with a test far from every float32 midpoint
    (MPFR for the rest); exact midpoints (pow(1 + 2^-12, 2)) included."""
    x, z = _inputs2(name, 30_000, 1)
    with np.errstate(all="ignore"):
        got = crmath.cr_apply(name, x, F32, z)
    assert _same(got, _mpfr2(name, x, z)).all()
    x, z = _inputs2(name, 1_000_000, 2)
    with np.errstate(all="ignore"):
        got = crmath.cr_apply(name, x, F32, z)
        d, dz = x.astype(np.float64), z.astype(np.float64)
        y = np.power(d, dz) if name == "pow" else np.arctan2(d, dz)
        e = np.where(np.isfinite(y), np.abs(y) * 2.0 ** -36, 0)
        lo, hi = (y - e).astype(np.float32), (y + e).astype(np.float32)
    easy = (lo.view(np.uint32) == hi.view(np.uint32)) & ~np.isnan(y)
    assert _same(got[easy], lo[easy]).all()
    assert _same(got[~easy], _mpfr2(name, x[~easy], z[~easy])).all()
    if name == "pow":
        mid = np.array([1 + 2.0 ** -12], np.float32)           # squares to a float32 midpoint
        assert _same(crmath.cr_apply("pow", mid, F32, np.float32([2.0])),
                     _mpfr2("pow", mid, np.float32([2.0])))


def _libm_exp(x):
    """exp of float32 ``x`` through the libm kernel (glibc's float64 exp, the same rounding
    test, MPFR for the undecided): independent of the vectorized kernel."""
    f32k, _ = crmath._kernels("exp")
    out, bad = np.empty(x.size, np.float32), np.empty(x.size, np.int64)
    with np.errstate(all="ignore"):
        nb = f32k(x, out, bad)
    if nb:
        out[bad[:nb]] = _mpfr("exp", x[bad[:nb]])
    return out


def test_vectorized_exp_agrees_with_the_libm_kernel_on_two_million_inputs():
    """The vectorized exp (its own reduction and polynomial) against glibc's float64 exp
    under the same test and MPFR, on every float32 of 2^21 evenly spaced bit patterns (all
    binades, NaNs, infinities, subnormals)."""
    x = (np.arange(1 << 21, dtype=np.uint64) * 2048 + 977).astype(np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        got = crmath.cr_apply("exp", x, F32)
    assert _same(got, _libm_exp(x)).all()


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("FPX_REPRODUCIBLE") != "full",
                    reason="all 2^32 float32 inputs (minutes): set FPX_REPRODUCIBLE=full")
def test_exp_on_every_float32_input():
    """All 2^32 float32 inputs of exp: the vectorized kernel (+ MPFR) against the libm kernel
    (+ MPFR), bit for bit."""
    for hi in range(256):
        x = ((np.uint64(hi) << np.uint64(24)) + np.arange(1 << 24, dtype=np.uint64)).astype(
            np.uint32).view(np.float32)
        with np.errstate(all="ignore"):
            got = crmath.cr_apply("exp", x, F32)
        assert _same(got, _libm_exp(x)).all(), hex(hi << 24)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("FPX_REPRODUCIBLE") != "full",
                    reason="all 2^32 float32 inputs (minutes): set FPX_REPRODUCIBLE=full")
@pytest.mark.parametrize("name", ["log", "tanh"])
def test_log_and_tanh_on_every_float32_input(name):
    """All 2^32 float32 inputs: where NumPy's own float64 function (independent of the libm
    numba calls) is 2^-36 away from every float32 rounding boundary its rounding is the
    answer, where it is NaN the answer is the canonical NaN, elsewhere MPFR's."""
    for hi in range(256):
        x = ((np.uint64(hi) << np.uint64(24)) + np.arange(1 << 24, dtype=np.uint64)).astype(
            np.uint32).view(np.float32)
        with np.errstate(all="ignore"):
            got = crmath.cr_apply(name, x, F32)
            y = _numpy64(name, x)
            e = np.where(np.isfinite(y), np.abs(y) * 2.0 ** -36, 0)
            lo, up = (y - e).astype(np.float32), (y + e).astype(np.float32)
        nan = np.isnan(y)
        assert (got[nan].view(np.uint32) == 0x7FC00000).all(), hex(hi << 24)
        easy = (lo.view(np.uint32) == up.view(np.uint32)) & ~nan
        assert _same(got[easy], lo[easy]).all(), hex(hi << 24)
        rest = ~easy & ~nan
        assert _same(got[rest], _mpfr(name, x[rest])).all(), hex(hi << 24)
