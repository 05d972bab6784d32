"""Correctly rounded float64 sin, cos, tan, atan, atan2, erf and pow (fpx.kernels.crmath64_trig,
crmath64_erf, crmath64_pow)
against MPFR, and through fpx.reproducible on NumPy and torch inputs."""
import os

import numpy as np
import pytest

import fpx
from fpx import formats
from fpx.kernels import crmath, crmath64

gmpy2 = pytest.importorskip("gmpy2")
F64 = formats.get("float64")
_RANGE = {"sin": 1e6, "cos": 1e6, "tan": 1e6, "atan": 1e4, "erf": 7.0}
_SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 5e-324, -5e-324,
                     2.2250738585072014e-308, 1.7976931348623157e308, 2.0 ** -27, 2.0 ** -26,
                     -2.0 ** -27, 2.0 ** 45, np.nextafter(2.0 ** 45, 0), 1e22, 2.0 ** 600,
                     np.pi / 4, np.pi / 2, np.pi, 1.0 + 2.0 ** -52, 1.0 / 128, 0.8125,
                     6381956970095103.0 * 2.0 ** 797])   # the float64 closest to k·pi/2

# hard-to-round sin inputs of CORE-MATH's src/binary64/sin/sin.wc (from Lefevre's search):
# sin(x) has 46 to 59 identical bits after the round bit
_HARD_SIN = ["0x1.005023d32fee5p+1", "0x1.00874a5f9fc33p-13", "0x1.009ee184a02e7p-8",
             "0x1.0192deafac33fp+0", "0x1.034c2318b3f2dp+0", "0x1.04394261cffa6p-1",
             "0x1.043e268ba402ap+1", "0x1.05149eefb774ap-1", "0x1.0518fffe634f2p-2",
             "0x1.057e5c72ad274p+0", "0x1.06800e629d672p-23", "0x1.06800e629d673p-23",
             "0x1.07d5978b896fcp+0", "0x1.07edc73037d32p+1", "0x1.08c495b034a31p+0",
             "0x1.093026e62d889p+1", "0x1.0aedf4dd4ccf8p-2", "0x1.0ba1b997d2e32p+0",
             "0x1.0d80ff9981295p+0", "0x1.0e9f8bb095163p+1", "0x1.184a0aa58191dp-24",
             "0x1.184a0aa581922p-24", "0x1.30c7efbee12acp-24", "0x1.45dd7c26e54bdp-24"]

# hard-to-round erf inputs of CORE-MATH's src/binary64/erf/erf.wc (43+ identical bits after the
# round bit); below 2^-28 erf(x) is about 2x/sqrt(pi), so their scalings by powers of two are
# hard too
_HARD_ERF = ["0x1.6d5ad4307dd52p-7", "0x1.037b548d9d7a6p-61", "0x1.059a3d07be48cp-61",
             "0x1.015c6c137cacp-61", "0x1.0be80db0acb76p-61", "0x1.2546735ab6e8bp-61",
             "0x1.5e3e6c60e8be5p-61", "0x1.8861c44191ee7p-61", "0x1.b29404e7af1b1p-61"]


def _same(a, b):
    return (a.view(np.uint64) == b.view(np.uint64)) | (np.isnan(a) & np.isnan(b))


def _near_multiples_of_pi_over_2(n, seed):
    """The float64s nearest k·pi/2 (and their neighbours) for small k and random k < 2^27
    and < 2^44: where the reduction cancels most."""
    rng = np.random.default_rng(seed)
    k = np.concatenate([np.arange(1, 200), rng.integers(1, 2 ** 27, n // 2),
                        rng.integers(1, 2 ** 44, n // 2)])
    half_pi = gmpy2.const_pi(precision=300) / 2
    x = np.array([float(int(kk) * half_pi) for kk in k])
    return np.concatenate([x, np.nextafter(x, 0), np.nextafter(x, np.inf), -x])


def _inputs(name, n, seed):
    """Random bit patterns (every binade), uniform over the function's range, magnitudes
    10^-20..10^3, the special values and (sin, cos, tan) arguments next to k·pi/2."""
    rng = np.random.default_rng(seed)
    q = n // 4
    bits = rng.integers(0, 2 ** 64, q, dtype=np.uint64).view(np.float64)
    uni = rng.uniform(-_RANGE[name], _RANGE[name], q)
    small = rng.standard_normal(q) * 10.0 ** rng.uniform(-20, 3, q)
    trig = name in ("sin", "cos", "tan")
    near = _near_multiples_of_pi_over_2(q // 4, seed) if trig else []
    hard = [float.fromhex(h) for h in _HARD_SIN] if trig else []
    if name == "erf":
        hard = [float.fromhex(h) * 2.0 ** s for h in _HARD_ERF for s in (0, -100, -600, -930)]
    return np.concatenate([bits, uni, small, near, hard, _SPECIAL])


def _check(name, x, z=None):
    with np.errstate(all="ignore"):
        got = crmath.cr_apply(name, x, F64, z)
    ref = np.asarray(crmath.mpfr_eval(name, x.tolist(), F64, None if z is None else z.tolist()))
    bad = ~_same(got, ref)
    assert not bad.any(), (name, x[bad][:5], got[bad][:5], ref[bad][:5])


def _pairs(n, seed):
    """atan2 arguments: random bit patterns, uniform pairs, pairs of wildly different
    magnitudes, and every pair of the special values (C99 Annex F's cases)."""
    rng = np.random.default_rng(seed)
    q = n // 3
    b = rng.integers(0, 2 ** 64, (2, q), dtype=np.uint64).view(np.float64)
    u = rng.uniform(-10, 10, (2, q))
    w = rng.standard_normal((2, q)) * 10.0 ** rng.uniform(-300, 300, (2, q))
    ys, xs = np.meshgrid(_SPECIAL, _SPECIAL)
    return (np.concatenate([b[0], u[0], w[0], ys.ravel()]),
            np.concatenate([b[1], u[1], w[1], xs.ravel()]))


@pytest.mark.parametrize("name", sorted(_RANGE))
def test_agrees_with_mpfr(name):
    """4·10^3 inputs per function (near k·pi/2, large, subnormal, ±0, inf, NaN): no
    mismatch with MPFR."""
    _check(name, _inputs(name, 4000, 1))


def test_atan2_agrees_with_mpfr():
    y, x = _pairs(4000, 2)
    _check("atan2", y, x)


def test_the_slow_path_is_rare_within_the_reduction_range():
    """For sin, cos, tan and atan on magnitudes up to 2^45 and erf on [-8, 8], the rounding
    test leaves few elements to MPFR (about 2^-12 of them; 1% is the alarm)."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, 20_000) * 2.0 ** rng.uniform(-20, 45, 20_000)
    for name in ("sin", "cos", "tan", "atan", "erf"):
        _, idx = crmath64.fast(name, x / 2.0 ** 42 if name == "erf" else x, x)
        assert idx.size < 200, (name, idx.size)


def test_through_reproducible_on_numpy_and_torch():
    rng = np.random.default_rng(4)
    x = rng.uniform(-100, 100, 64)
    y = rng.uniform(-100, 100, 64)
    got = fpx.reproducible(lambda a, b: (np.sin(a), np.cos(a), np.tan(a), np.arctan(a),
                                         np.arctan2(a, b), np.abs(a) ** (b / 20)))(x, y)
    for g, name in zip(got, ("sin", "cos", "tan", "atan")):
        assert g.dtype == np.float64
        assert _same(g, np.asarray(crmath.mpfr_eval(name, x.tolist(), F64))).all()
    assert _same(got[4], np.asarray(crmath.mpfr_eval("atan2", x.tolist(), F64,
                                                     y.tolist()))).all()
    assert _same(got[5], np.asarray(crmath.mpfr_eval("pow", np.abs(x).tolist(), F64,
                                                     (y / 20).tolist()))).all()
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x)
    got = fpx.reproducible(lambda a: (torch.sin(a), torch.erf(a / 30)))(t)
    assert got[0].dtype == torch.float64
    assert _same(got[0].numpy(), np.asarray(crmath.mpfr_eval("sin", x.tolist(), F64))).all()
    want = np.asarray(crmath.mpfr_eval("erf", (x / 30).tolist(), F64))
    assert _same(got[1].numpy(), want).all()


def _pow_pairs(n, seed):
    """pow arguments: moderate pairs, random bit patterns (mostly overflow and underflow),
    x near 1 with large y, negative x with integer y (odd and even), small integer powers
    (exact results), squares of 27-bit numbers (exact or midpoints), and every pair of the
    special values (C99 Annex F's cases)."""
    rng = np.random.default_rng(seed)
    q = n // 6
    m = (rng.integers(2 ** 26, 2 ** 27, q) * 2 + 1).astype(np.float64) * 2.0 ** -27
    sp = np.concatenate([_SPECIAL, [0.5, -0.5, 3.0, -3.0, 2.0 ** 53, 2.0 ** 53 + 2, -2.0]])
    xs, ys = np.meshgrid(sp, sp)
    x = [rng.uniform(0, 10, q), rng.integers(0, 2 ** 64, q, dtype=np.uint64).view(np.float64),
         1 + rng.standard_normal(q) * 10.0 ** rng.uniform(-16, -1, q),
         -rng.integers(1, 30, q) * rng.choice([1, 0.5, 0.25], q),
         rng.integers(1, 40, q).astype(np.float64), m, xs.ravel()]
    y = [rng.uniform(-300, 300, q), rng.integers(0, 2 ** 64, q, dtype=np.uint64).view(np.float64),
         rng.standard_normal(q) * 10.0 ** rng.uniform(0, 17, q),
         rng.integers(-60, 60, q).astype(np.float64), rng.integers(-12, 12, q).astype(np.float64),
         np.full(q, 2.0), ys.ravel()]
    return np.concatenate(x), np.concatenate(y)


def test_pow_agrees_with_mpfr():
    x, y = _pow_pairs(6000, 6)
    _check("pow", x, y)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("FPX_REPRODUCIBLE") != "full",
                    reason="10^5 MPFR evaluations per function: set FPX_REPRODUCIBLE=full")
def test_pow_and_atan2_agree_with_mpfr_on_1e5_pairs():
    y, x = _pairs(100_000, 5)
    _check("atan2", y, x)
    x, y = _pow_pairs(100_000, 7)
    _check("pow", x, y)


def test_payne_hanek_reduction_meets_its_bound():
    """_reduce_big against MPFR at 3000 bits on random arguments of every binade above 2^45
    and the float64 closest to a multiple of pi/2: the quadrant and |r - (r_h + r_l)| <
    2^-100·|r| + 2^-157 (the bound the rounding test relies on)."""
    from fpx.kernels import crmath64_trig
    rng = np.random.default_rng(8)
    a = 2.0 ** rng.uniform(45, 1023.9, 300) * rng.uniform(1, 2, 300)
    a = np.concatenate([a[np.isfinite(a)], [6381956970095103.0 * 2.0 ** 797, 2.0 ** 45]])
    with gmpy2.context(precision=3000):
        half_pi = gmpy2.const_pi() / 2
        for v in a:
            k, rh, rl, _ = crmath64_trig._reduce_big(v)
            t = gmpy2.mpfr(v) / half_pi
            kk = int(gmpy2.rint(t))
            r = (t - kk) * half_pi
            assert k % 4 == kk % 4, v
            err = abs(gmpy2.mpfr(rh) + gmpy2.mpfr(rl) - r)
            assert err < 2.0 ** -100 * abs(r) + 2.0 ** -157, v


def test_the_lazily_loaded_modules_provide_what_is_listed():
    for name in crmath64.FUNCTIONS64:
        assert crmath64._evaluator(name) is not None
