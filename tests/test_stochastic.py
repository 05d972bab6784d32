"""Tests of ``fpx.stochastic`` (stochastic arithmetic: sr / ud / cestac / mca / ieee).

Every random test uses a fixed seed, so the suite is deterministic; the thresholds are still
chosen as if the draws were fresh, with a false-failure probability below 1e-6 per check
(binomial and chi-square tests at alpha = 1e-6, z-scores of at least 5).

Definitions checked (the real result r lies between the neighbours lo <= r <= hi of the
target format, r = lo + f·(hi - lo)):

* ``sr``: hi with probability f, lo otherwise; exact results (f = 0) never move.
* ``cestac``: lo or hi with probability ½ each when inexact; exact results never move.
* ``ud``: round to nearest, then one step up or down (the format's successor / predecessor:
  half a step below a power of two) with probability ½ each; a zero result stays zero.
* ``mca``: noise of relative size 2^-t, then an unbiased rounding: no bias, also just above a
  power of two, where the grid spacing doubles.
"""
from __future__ import annotations

import concurrent.futures as cf
import math
import multiprocessing
from fractions import Fraction

import ml_dtypes
import numba
import numpy as np
import pytest
from scipy import stats

import fpx
import fpx.numpy as fnp
from fpx import formats as F
from fpx.kernels import stochastic as K
from fpx.transforms.stochastic import sample_keys

ALPHA = 1e-6                                 # per-check false-failure probability
Z = 5.0                                      # two-sided normal tail at 5 sigma: 5.7e-7

FMT = {"float64": np.float64, "float32": np.float32, "bfloat16": ml_dtypes.bfloat16,
       "float16": np.float16}
SMALL_FMTS = ["float32", "bfloat16", "float16"]
ALL_FMTS = ["float64"] + SMALL_FMTS
RANDOM_MODES = ["sr", "ud", "cestac", "mca"]


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def run(f, *args, mode="sr", samples=4, seed=0, **kw):
    return fpx.stochastic(f, mode, samples=samples, seed=seed, **kw)(*args)


def f64(a):
    return np.asarray(a).astype(np.float64)


def full(n, value, dt):
    return np.full(n, value, dtype=np.float64).astype(dt)


def rd_exact(q: Fraction, fmt) -> float:
    """Largest number of ``fmt`` <= the rational ``q`` (exactly)."""
    x = float(q)                             # nearest float64
    if Fraction(x) > q:
        x = math.nextafter(x, -math.inf)
    return float(F.round(x, fmt, "rd"))


def neighbours(q: Fraction, fmt):
    """(lo, hi, f): the format's neighbours of q and q's position between them."""
    lo = rd_exact(q, fmt)
    if Fraction(lo) == q:
        return lo, lo, 0.0
    hi = float(F.next_up(lo, fmt))
    return lo, hi, float((q - Fraction(lo)) / (Fraction(hi) - Fraction(lo)))


def assert_binom(k, n, p, what=""):
    pv = stats.binomtest(int(k), int(n), p).pvalue
    assert pv > ALPHA, f"{what}: {k}/{n} = {k / n:.5f} is not a frequency of {p:.5f} (p={pv:.2e})"


def sqrt_fraction(a: float, bits: int = 300) -> Fraction:
    """sqrt(a) to 2^-bits (plenty to locate it between float64 neighbours)."""
    q = Fraction(a)
    return Fraction(math.isqrt(q.numerator * 4 ** bits // q.denominator), 2 ** bits)


def mp_fraction(x) -> Fraction:
    """An mpmath number (at most 200 significant bits) as an exact Fraction."""
    import mpmath
    m, e = mpmath.frexp(x)
    return Fraction(int(mpmath.ldexp(m, 200))) * Fraction(2) ** (int(e) - 200)


# ---------------------------------------------------------------------------------------------
# 1. single operations with known exact results: frequencies match each mode's definition
# ---------------------------------------------------------------------------------------------
N_EL = 10_000        # elements per run (independent decisions at different positions)
S_EL = 4             # samples -> 40 000 decisions per case


def _single_op_cases(fmt_name):
    """(name, function, operands, exact result as a Fraction) for one format."""
    fmt = F.get(fmt_name)
    dt = FMT[fmt_name]
    u = 2.0 ** (1 - fmt.p)                          # spacing above 1
    h = fmt.p // 2 + 1
    a = float(np.array(1 + 2.0 ** -h).astype(dt))   # a*a = 1 + 2^(1-h) + 2^-2h: inexact
    tenth = float(np.array(0.1).astype(dt))
    return [
        ("add 1+u/4", lambda x, y: x + y, (1.0, u / 4), Fraction(1) + Fraction(u / 4)),
        ("sub 1-0.1", lambda x, y: x - y, (1.0, tenth), Fraction(1) - Fraction(tenth)),
        ("mul a*a", lambda x, y: x * y, (a, a), Fraction(a) ** 2),
        ("div 1/3", lambda x, y: x / y, (1.0, 3.0), Fraction(1, 3)),
        ("sqrt 2", lambda x: fnp.sqrt(x), (2.0,), sqrt_fraction(2.0)),
        ("fma a*a+0.1", lambda x, y, z: fnp.fma(x, y, z), (a, a, tenth),
         Fraction(a) ** 2 + Fraction(tenth)),
        # just below a power of two: the neighbours are pred(2) (half a step down) and 2; in
        # float64 the sum rounds to 2 and the residual points into the binade below
        ("add 2-tiny", lambda x, y: x + y, (2.0, -(2.0 ** -(fmt.p + 3))),
         Fraction(2) - Fraction(2) ** -(fmt.p + 3)),
        ("sub -2+tiny", lambda x, y: x - y, (-2.0, -(2.0 ** -(fmt.p + 2))),
         Fraction(-2) + Fraction(2) ** -(fmt.p + 2)),
    ]


def _case_ids():
    return [(fm, i) for fm in ALL_FMTS for i in range(len(_single_op_cases(fm)))]


@pytest.mark.parametrize("fmt_name,i", _case_ids(),
                         ids=[f"{fm}-{c[0]}" for fm in ALL_FMTS for c in _single_op_cases(fm)])
def test_sr_and_cestac_frequencies_on_single_ops(fmt_name, i):
    name, fn, operands, exact = _single_op_cases(fmt_name)[i]
    dt, fmt = FMT[fmt_name], F.get(fmt_name)
    lo, hi, f = neighbours(exact, fmt)
    assert 0 < f < 1, name
    args = [full(N_EL, v, dt) for v in operands]
    n = N_EL * S_EL
    r = run(fn, *args, mode="sr", samples=S_EL, seed=1)
    assert r.dtype == np.dtype(dt) and r.shape == (S_EL, N_EL)
    r = f64(r)
    assert set(np.unique(r)) <= {lo, hi}, f"{name}: sr left the two neighbours"
    assert_binom(np.sum(r == hi), n, f, f"{fmt_name} sr {name}")
    # unbiased: the mean error is zero within 5 standard errors
    se = (hi - lo) * math.sqrt(f * (1 - f) / n)
    assert abs(float(np.mean(r - lo) - f * (hi - lo))) < Z * se
    r = f64(run(fn, *args, mode="cestac", samples=S_EL, seed=2))
    assert set(np.unique(r)) <= {lo, hi}
    assert_binom(np.sum(r == hi), n, 0.5, f"{fmt_name} cestac {name}")


@pytest.mark.parametrize("fmt_name", ALL_FMTS)
def test_transcendentals_are_one_rounding(fmt_name):
    """exp/log/sin/tanh: evaluated accurately, then rounded once: two outcomes, P(hi) = f."""
    import mpmath
    dt, fmt = FMT[fmt_name], F.get(fmt_name)
    if fmt_name == "float64" and np.finfo(np.longdouble).nmant <= 52:
        pytest.skip("float64 transcendentals need long double for their residual")
    for name, fn, mfn, x0 in [("exp", fnp.exp, mpmath.exp, 0.7), ("log", fnp.log, mpmath.log, 3.0),
                              ("sin", fnp.sin, mpmath.sin, 1.0),
                              ("tanh", fnp.tanh, mpmath.tanh, 0.5)]:
        x0 = float(np.array(x0).astype(dt))
        with mpmath.workprec(200):
            exact = mp_fraction(mfn(mpmath.mpf(x0)))
        lo, hi, f = neighbours(exact, fmt)
        r = f64(run(fn, full(N_EL, x0, dt), mode="sr", samples=S_EL, seed=3))
        assert set(np.unique(r)) <= {lo, hi}, name
        # float64 via long double: f is known to ~2^-11, far below the test's resolution
        assert_binom(np.sum(r == hi), N_EL * S_EL, f, f"{fmt_name} sr {name}")


@pytest.mark.parametrize("fmt_name", ALL_FMTS)
def test_ud_definition_inexact_power_of_two_and_zero(fmt_name):
    dt, fmt = FMT[fmt_name], F.get(fmt_name)
    u = 2.0 ** (1 - fmt.p)
    n = N_EL * S_EL
    add = lambda x, y: x + y            # noqa: E731
    # inexact, RN = 1 (a power of two): down to 1 - u/2 (half a step) or up to 1 + u
    r = f64(run(add, full(N_EL, 1.0, dt), full(N_EL, u / 4, dt), mode="ud", samples=S_EL, seed=4))
    assert set(np.unique(r)) == {1 - u / 2, 1 + u}
    assert_binom(np.sum(r > 1), n, 0.5, f"{fmt_name} ud 1+u/4")
    # exact power of two: UD still moves it (Fuzzy PyTorch's up-down), asymmetric steps
    r = f64(run(add, full(N_EL, 1.0, dt), full(N_EL, 1.0, dt), mode="ud", samples=S_EL, seed=5))
    assert set(np.unique(r)) == {2 - u, 2 + 2 * u}
    assert_binom(np.sum(r > 2), n, 0.5, f"{fmt_name} ud 1+1")
    # exact, not a power of two: symmetric steps
    r = f64(run(add, full(N_EL, 1.5, dt), full(N_EL, 1.5, dt), mode="ud", samples=S_EL, seed=6))
    assert set(np.unique(r)) == {3 - 2 * u, 3 + 2 * u}
    assert_binom(np.sum(r > 3), n, 0.5, f"{fmt_name} ud 1.5+1.5")
    # zero is never perturbed (also -0 stays a zero)
    r = run(lambda x, y: x - y, full(N_EL, 1.0, dt), full(N_EL, 1.0, dt), mode="ud", samples=2)
    assert np.all(f64(r) == 0)
    r = run(lambda x: x * 0.0, full(N_EL, -3.0, dt), mode="ud", samples=2)
    assert np.all(f64(r) == 0)


@pytest.mark.parametrize("fmt_name", ALL_FMTS)
@pytest.mark.parametrize("mode", ["sr", "cestac", "ud"])
def test_exact_results_stay_exact(fmt_name, mode):
    """sr and cestac never move an exact result, at any granularity (every partial sum below
    is exact too); ud moves a single exact rounding one step to a neighbour."""
    dt, fmt = FMT[fmt_name], F.get(fmt_name)
    x = np.array([1.5, 3.0, 0.25, 2.25, 6.0, -0.75, 64.0], dt)
    y = np.array([2.25, 0.25, 0.5, 1.0, 3.0, 0.125, 0.5], dt)
    sq = np.array([2.25, 9.0, 0.0625, 0.25, 1.0, 4.0, 1024.0], dt)

    def prog(x, y, sq):
        return {"add": x + y, "sub": x - y, "mul": x * y, "div": x / y, "sqrt": fnp.sqrt(sq),
                "sum": fnp.sum(y), "cumsum": fnp.cumsum(y), "prod": fnp.prod(y[:4]),
                "dot": x[:4] @ y[:4]}

    ref = prog(*(f64(v) for v in (x, y, sq)))
    single = ("add", "sub", "mul", "div", "sqrt")
    for gran in ("flop", "op"):
        out = run(prog, x, y, sq, mode=mode, samples=16, seed=7, granularity=gran)
        for k, v in out.items():
            v = f64(v).reshape(16, -1)
            e = np.asarray(ref[k], np.float64).reshape(-1)
            ok = F.representable(e, fmt)
            if k == "div":          # the float64 reference is rounded: ask the Fractions
                ok &= np.array([Fraction(a) / Fraction(b) == Fraction(c) for a, b, c in
                                zip(f64(x).tolist(), f64(y).tolist(), e.tolist())])
            if k != "div":
                assert np.all(ok), k                      # the cases are built exact
            if mode != "ud":
                assert np.array_equal(v[:, ok], np.broadcast_to(e[ok], v[:, ok].shape)), \
                    (k, gran)
            elif k in single:
                up, down = f64(F.next_up(e, fmt)), f64(F.next_down(e, fmt))
                moved = (v == up) | (v == down) | (e == 0)
                assert np.all(moved[:, ok]), (k, gran)


def test_mca_no_bias_just_above_a_power_of_two():
    """MCA rounds the noisy value unbiasedly: just above 2^e, where the grid below is twice as
    fine as above (RN after the noise is biased there), the mean is the exact value."""
    n = 50_000
    for fmt_name in ALL_FMTS:
        dt, fmt = FMT[fmt_name], F.get(fmt_name)
        u = 2.0 ** (1 - fmt.p)
        for e in (0, 5, -3):
            a, b = 2.0 ** e, 2.0 ** e * u / 8          # exact result a + b, just above 2^e
            r = f64(run(lambda x, y: x + y, full(n, a, dt), full(n, b, dt), mode="mca",
                        samples=2, seed=8, mca_mode="rr"))
            assert np.all(F.representable(r, fmt))
            assert len(np.unique(r)) >= 3                       # noise of about one ulp
            err = (r - a) - b                                   # exact (Sterbenz)
            se = np.std(err, ddof=1) / math.sqrt(err.size)
            assert abs(float(np.mean(err))) < Z * se, (fmt_name, e, np.mean(err), se)


def test_mca_rr_keeps_zero_and_perturbs_exact_results():
    x = np.ones(1000, np.float32)
    r = run(lambda x: x - x, x, mode="mca", mca_mode="rr", samples=4)
    assert np.all(r == 0)
    r = run(lambda x: x + x, x, mode="mca", mca_mode="rr", samples=4)
    assert np.unique(r).size > 1 and abs(float(np.mean(f64(r))) - 2.0) < 1e-6


# ---------------------------------------------------------------------------------------------
# 2. casts: the transform against fpx.formats (the reference rounding) on many values
# ---------------------------------------------------------------------------------------------
def _cast_values(fmt, n=3000, seed=0):
    rng = np.random.default_rng(seed)
    e = rng.uniform(fmt.emin - fmt.p - 3, fmt.emax + 1.2, n)
    x = np.exp2(e) * rng.choice([-1.0, 1.0], n) * rng.uniform(1, 2, n)
    grid = f64(F.round(x[: n // 4], fmt, "rn"))              # exactly representable ones
    special = [0.0, -0.0, fmt.tiny, fmt.smallest_subnormal, -fmt.smallest_subnormal, fmt.max,
               -fmt.max, 1.0, 2.0 ** fmt.emax, fmt.smallest_subnormal / 3,
               fmt.tiny * (1 - 2.0 ** -fmt.p)]
    v = np.concatenate([x, grid, special])
    return v[np.isfinite(v)]


CAST_FMTS = ["float32", "bfloat16", "float16", "tf32", "float8_e4m3fn", "float8_e5m2"]


@pytest.mark.parametrize("fmt_name", CAST_FMTS)
def test_casts_match_the_reference_rounding(fmt_name):
    """float64 -> fmt casts (subnormals, overflow, exact values included): each sample is one
    of the outcomes fpx.formats.round allows for the mode, with the right frequencies."""
    fmt = F.get(fmt_name)
    x = _cast_values(fmt)
    S = 8
    lo = f64(F.round(x, fmt, "rd"))
    hi = f64(F.round(x, fmt, "ru"))
    rn = f64(F.round(x, fmt, "rn"))
    exact = lo == hi
    ovf = ~np.isfinite(hi) | ~np.isfinite(lo) | (np.abs(x) > fmt.max)
    ovf_val = np.inf if fmt.has_inf else np.nan
    cast = lambda v: fnp.astype(v, fmt)          # noqa: E731

    def same(a, b):
        return (a == b) | (np.isnan(a) & np.isnan(b))

    # sr
    r = f64(run(cast, x, mode="sr", samples=S, seed=11))
    big = np.copysign(ovf_val, x) if fmt.has_inf else np.full_like(x, np.nan)
    ok = same(r, lo) | same(r, hi) | (ovf & same(r, big))
    assert np.all(ok), x[~ok.all(0)][:5]
    assert np.all(r[:, exact & ~ovf] == x[exact & ~ovf])
    sel = ~exact & ~ovf
    f = (x[sel] - lo[sel]) / (hi[sel] - lo[sel])
    ups = np.sum(r[:, sel] == hi[sel])
    z = (ups - S * f.sum()) / math.sqrt(S * np.sum(f * (1 - f)))
    assert abs(z) < Z, z
    # cestac
    r = f64(run(cast, x, mode="cestac", samples=S, seed=12))
    ok = same(r, lo) | same(r, hi) | (ovf & same(r, big))
    assert np.all(ok)
    assert np.all(r[:, exact & ~ovf] == x[exact & ~ovf])
    assert_binom(np.sum(r[:, sel] == hi[sel]), S * sel.sum(), 0.5, f"cestac cast {fmt_name}")
    # ud: RN, then the successor or predecessor; zero stays
    r = f64(run(cast, x, mode="ud", samples=S, seed=13))
    fin = np.isfinite(rn) & ~ovf
    up, down = f64(F.next_up(rn, fmt)), f64(F.next_down(rn, fmt))
    zero = rn == 0
    ok = same(r, up) | same(r, down) | (zero & (r == 0))
    assert np.all(ok[:, fin]), x[fin][~ok[:, fin].all(0)][:5]
    mov = fin & ~zero
    assert_binom(np.sum(r[:, mov] > rn[mov]), S * mov.sum(), 0.5, f"ud cast {fmt_name}")
    # mca: unbiased (mean error over all values, in units of each value's ulp)
    r = f64(run(cast, x, mode="mca", samples=S, seed=14))
    sel = ~ovf & (np.abs(x) >= fmt.tiny) & (np.abs(x) < 2.0 ** fmt.emax)   # noise can overflow
    ulp = f64(F.ulp(x[sel], fmt))
    err = ((r[:, sel] - x[sel]) / ulp).ravel()
    assert abs(err.mean()) < Z * err.std(ddof=1) / math.sqrt(err.size)
    assert np.all(np.abs(err) <= 4.0)       # <= 2 ulps of the binade above


# ---------------------------------------------------------------------------------------------
# 3. float64 targets: error-free transforms give measurable probabilities
# ---------------------------------------------------------------------------------------------
def test_float64_error_free_transforms():
    n = N_EL * S_EL
    cases = [
        ("1 + 2^-54", lambda x, y: x + y, (1.0, 2.0 ** -54), Fraction(1) + Fraction(2) ** -54),
        ("1 - 2^-55", lambda x, y: x - y, (1.0, 2.0 ** -55), Fraction(1) - Fraction(2) ** -55),
        ("(1+2^-27)^2", lambda x, y: x * y, (1 + 2.0 ** -27, 1 + 2.0 ** -27),
         (1 + Fraction(2) ** -27) ** 2),
        ("2/3", lambda x, y: x / y, (2.0, 3.0), Fraction(2, 3)),
        ("sqrt 3", lambda x: fnp.sqrt(x), (3.0,), sqrt_fraction(3.0)),
    ]
    for name, fn, ops, exact in cases:
        lo, hi, f = neighbours(exact, F.float64)
        r = run(fn, *[np.full(N_EL, v) for v in ops], mode="sr", samples=S_EL, seed=15)
        assert set(np.unique(r)) <= {lo, hi}, name
        assert_binom(np.sum(r == hi), n, f, f"float64 sr {name}")
    # the classic: 1 + 2^-54 rounds up with probability exactly 1/4
    lo, hi, f = neighbours(Fraction(1) + Fraction(2) ** -54, F.float64)
    assert (lo, hi, f) == (1.0, 1 + 2.0 ** -52, 0.25)


def test_float64_sums_and_dots_use_the_residuals():
    """Flop granularity in float64: 1 + 2^-54 + 2^-54 + ... rounds with the exact TwoSum
    residual at every step; op granularity rounds the compensated sum once."""
    x = np.array([1.0] + [2.0 ** -54] * 4)
    rs = f64(run(lambda v: fnp.sum(v, axis=0), np.tile(x, (2000, 1)).T.copy(), samples=8,
                 seed=16, granularity="op"))
    # exact sum 1 + 2^-52 is a float64: op granularity keeps it exactly
    assert np.all(rs == 1 + 2.0 ** -52)
    # flop: the sequential running sum takes one of 1, 1+u, 1+2u, ... (u = 2^-52)
    rf = f64(run(lambda v: fnp.sum(v, axis=0), np.tile(x, (2000, 1)).T.copy(), samples=8,
                 seed=16))
    k = np.round((rf - 1) / 2.0 ** -52)
    assert set(np.unique(k)) <= {0.0, 1.0, 2.0, 3.0, 4.0}
    # unbiased: the mean is 1 + 2^-52
    se = np.std(rf - 1, ddof=1) / math.sqrt(rf.size)          # rf - 1: exact
    assert abs(np.mean(rf - 1) - 2.0 ** -52) < Z * se
    # 1 - 2^-55: the float64 sum is 1 and the residual points below 1, where the spacing is
    # 2^-53: neighbours 1 - 2^-53 (probability 1/4) and 1, in sums and dot products alike
    y = np.tile(np.array([[1.0], [-(2.0 ** -55)]]), (1, 5000))
    for f in (lambda v: fnp.sum(v, axis=0), lambda v: fnp.ones(2) @ v):
        r = f64(run(f, y, samples=8, seed=18))
        assert set(np.unique(r)) == {1.0, 1 - 2.0 ** -53}
        assert_binom(np.sum(r < 1), r.size, 0.25, "float64 1 - 2^-55")


# ---------------------------------------------------------------------------------------------
# 4. flop order: sequential by default, pairwise on request (exact distributions)
# ---------------------------------------------------------------------------------------------
def _sr_add(dist, c, fmt):
    """Distribution of SR(v + c) for v ~ dist (values: Fractions)."""
    out = {}
    for v, p in dist.items():
        lo, hi, f = neighbours(v + c, fmt)
        out[Fraction(lo)] = out.get(Fraction(lo), 0) + p * (1 - Fraction(f))
        if f:
            out[Fraction(hi)] = out.get(Fraction(hi), 0) + p * Fraction(f)
    return out


def _sr_add_dists(d1, d2, fmt):
    out = {}
    for v, p in d1.items():
        for w, q in d2.items():
            for z, r in _sr_add({v: 1}, w, fmt).items():
                out[z] = out.get(z, 0) + p * q * r
    return out


def _gof(r, dist, what):
    vals = sorted(dist)
    r = np.asarray(r).ravel()
    assert set(np.unique(r)) <= {float(v) for v in vals}, what
    obs = np.array([np.sum(r == float(v)) for v in vals])
    exp = np.array([float(dist[v]) for v in vals]) * r.size
    keep = exp > 0
    pv = stats.chisquare(obs[keep], exp[keep]).pvalue
    assert pv > ALPHA, (what, obs, exp)


@pytest.mark.parametrize("how", ["sum", "matmul"])
def test_sequential_and_pairwise_orders(how):
    fmt = F.float32
    q = Fraction(2) ** -25                    # a quarter of float32's spacing above 1
    terms = [Fraction(1)] + [q] * 4
    seq = {Fraction(1): Fraction(1)}
    for t in terms[1:]:
        seq = _sr_add(seq, t, fmt)
    # pairwise tree: ((t0+t1) + (t2+t3)) + t4
    s01 = _sr_add({terms[0]: Fraction(1)}, terms[1], fmt)
    s23 = _sr_add({terms[2]: Fraction(1)}, terms[3], fmt)
    pw = _sr_add(_sr_add_dists(s01, s23, fmt), terms[4], fmt)
    assert seq != pw
    M = 5000
    rows = np.tile(np.array([float(t) for t in terms], np.float32), (M, 1))
    if how == "sum":
        f = lambda a: fnp.sum(a, axis=1)        # noqa: E731
    else:
        f = lambda a: a @ np.ones((5, 1), np.float32)   # noqa: E731
    for order, dist in (("sequential", seq), ("pairwise", pw)):
        r = f64(run(f, rows, samples=4, seed=17, order=order))
        _gof(r, dist, f"{how} {order}")
    # op granularity: one rounding of the exact result 1 + 2^-23 (representable): exact
    r = f64(run(f, rows, samples=2, granularity="op"))
    assert np.all(r == 1 + 2.0 ** -23)


# ---------------------------------------------------------------------------------------------
# 5. the harmonic series (Fuzzy PyTorch's experiment at n = 10^6)
# ---------------------------------------------------------------------------------------------
def _harmonic(i):
    return fnp.sum(1.0 / i)      # float32 divisions, then a sequential float32 sum


def test_harmonic_series_float32():
    n, S = 10 ** 6, 16
    i = np.arange(1, n + 1, dtype=np.float32)
    exact = float(np.sum(1.0 / np.arange(1, n + 1, dtype=np.float64)))
    rn32 = float(np.cumsum(np.float32(1) / i, dtype=np.float32)[-1])     # sequential RN
    assert rn32 < exact - 0.03                                          # RN stagnates
    out = {}
    for mode in ("sr", "ud", "cestac"):
        r = f64(run(_harmonic, i, mode=mode, samples=S, seed=2024))
        out[mode] = (r.mean(), r.std(ddof=1) / math.sqrt(S))
    m, se = out["sr"]
    assert abs(m - exact) < 3 * se, (m, se, exact)
    m, se = out["ud"]
    assert abs(m - rn32) < 3 * se, (m, se, rn32)
    m, se = out["cestac"]
    assert m > exact + 100 * se and m > exact + 0.02, (m, se, exact)


# ---------------------------------------------------------------------------------------------
# 6. random bits: reproducible for any thread count, batch, path and executor
# ---------------------------------------------------------------------------------------------
_RNG = np.random.default_rng(0)
_A = _RNG.standard_normal((5, 7)).astype(np.float32)
_B = _RNG.standard_normal((7, 3)).astype(np.float32)
_X = _RNG.standard_normal(6).astype(np.float32)
_A64 = _RNG.standard_normal((4, 3))


def prog_mix(A, B, x, A64):
    """matmul (fast and generic kernels), sums, cumsum, prod, elementwise, float64 EFTs."""
    C = A @ B
    s = fnp.sum(C, axis=0)
    t = fnp.sum(s)
    c = fnp.cumsum(x)
    return {"C": C, "s": s, "t": t, "e": fnp.exp(c) * 3.0 + x[:3].sum(), "p": fnp.prod(x),
            "d": (A64 @ A64.T) / 3.0 + fnp.sqrt(fnp.abs(A64[0])).sum(),
            "h": (A.astype(ml_dtypes.bfloat16) * 3 + 1).sum()}


def prog_mix_control_flow(A, B, x, A64):
    """prog_mix with Python control flow reading a perturbed value (forces per-sample runs)."""
    C = A @ B
    s = fnp.sum(C, axis=0)
    t = fnp.sum(s)
    if float(t) > -1e30:                       # always true; reads a perturbed value
        c = fnp.cumsum(x)
    else:
        c = x
    return {"C": C, "s": s, "t": t, "e": fnp.exp(c) * 3.0 + x[:3].sum(), "p": fnp.prod(x),
            "d": (A64 @ A64.T) / 3.0 + fnp.sqrt(fnp.abs(A64[0])).sum(),
            "h": (A.astype(ml_dtypes.bfloat16) * 3 + 1).sum()}


def prog_small(x):
    """Picklable program for the executor tests (kernels the workers load from numba's cache)."""
    return {"s": fnp.sum(x * 3.0), "e": fnp.exp(fnp.cumsum(x)), "d": x / 7.0}


def _equal_trees(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
        assert np.array_equal(a[k], b[k], equal_nan=True), k


ARGS = (_A, _B, _X, _A64)

REPRO_CASES = [("sr", "flop", "sequential"), ("sr", "flop", "pairwise"), ("sr", "op", "sequential"),
               ("ud", "flop", "sequential"), ("cestac", "op", "sequential"),
               ("mca", "flop", "pairwise"), ("mca", "op", "sequential")]


@pytest.mark.parametrize("mode,gran,order", REPRO_CASES)
def test_samples_identical_for_threads_paths_batches(mode, gran, order):
    kw = dict(granularity=gran, order=order)
    ref = run(prog_mix, *ARGS, mode=mode, samples=8, seed=3, **kw)
    for v in ref.values():
        assert v.shape[0] == 8
    # spread: the samples differ (not every sample the same)
    assert any(np.ptp(f64(v), axis=0).max() > 0 for v in ref.values())
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = run(prog_mix, *ARGS, mode=mode, samples=8, seed=3, **kw)
    finally:
        numba.set_num_threads(old)
    _equal_trees(ref, one)
    # per-sample path, asked for and detected automatically
    _equal_trees(ref, run(prog_mix, *ARGS, mode=mode, samples=8, seed=3, vectorize=False, **kw))
    _equal_trees(ref, run(prog_mix_control_flow, *ARGS, mode=mode, samples=8, seed=3, **kw))
    # sample i does not depend on how many samples are drawn
    four = run(prog_mix, *ARGS, mode=mode, samples=4, seed=3, **kw)
    _equal_trees({k: v[:4] for k, v in ref.items()}, four)
    # same seed: same samples; another seed: other samples
    _equal_trees(ref, run(prog_mix, *ARGS, mode=mode, samples=8, seed=3, **kw))
    other = run(prog_mix, *ARGS, mode=mode, samples=8, seed=4, **kw)
    assert any(not np.array_equal(ref[k], other[k]) for k in ref)


def test_control_flow_falls_back_to_per_sample_runs():
    calls = []

    def f(x):
        calls.append(1)
        y = x * 3.0
        return y if float(fnp.sum(y)) > 0 else -y

    x = np.float32([0.1, 0.2, 0.3])
    r = run(f, x, samples=5)
    assert len(calls) == 1 + 5                  # one vectorized attempt, then one per sample
    assert r.shape == (5, 3)
    calls.clear()
    run(lambda x: x * 3.0 + fnp.sum(x), x, samples=5)
    assert not calls


def test_executors_give_the_same_samples():
    x = np.linspace(-1, 1, 33).astype(np.float32)
    ref = run(prog_small, x, samples=6, seed=5)
    with cf.ThreadPoolExecutor(2) as ex:
        _equal_trees(ref, run(prog_small, x, samples=6, seed=5, executor=ex))
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(2, mp_context=ctx) as ex:
        _equal_trees(ref, run(prog_small, x, samples=6, seed=5, executor=ex))
        # per-sample path on the workers too
        _equal_trees(ref, run(prog_small, x, samples=6, seed=5, executor=ex, vectorize=False))
    from dask.distributed import Client, LocalCluster
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=2,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        _equal_trees(ref, run(prog_small, x, samples=6, seed=5, executor=client))


def test_fork_after_openmp_is_a_clear_error():
    """Workers forked after numba's GNU OpenMP ran are killed; fpx says so up front."""
    run(prog_small, np.ones(3, np.float32), samples=2)          # parallel kernels have run
    try:
        layer = numba.threading_layer()
        from numba.np.ufunc import omppool
        gnu = layer == "omp" and omppool.openmp_vendor == "GNU"
    except Exception:
        gnu = False
    if not gnu:
        pytest.skip("numba's threading layer here is fork-safe")
    with cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as ex:
        with pytest.raises(RuntimeError, match="spawn"):
            run(prog_small, np.ones(3, np.float32), samples=2, executor=ex)


def test_progress_options():
    x = np.linspace(0, 1, 10).astype(np.float32)
    ref = run(prog_small, x, samples=3)
    for p in (True, False, None):
        _equal_trees(ref, run(prog_small, x, samples=3, progress=p))


# ---------------------------------------------------------------------------------------------
# 7. bad input and special values
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,match", [
    (dict(mode="rn"), "unknown mode"), (dict(mode="SR "), "unknown mode"),
    (dict(samples=0), "samples"), (dict(samples=-3), "samples"), (dict(samples=2.5), "samples"),
    (dict(samples=True), "samples"), (dict(granularity="element"), "granularity"),
    (dict(order="tree"), "order"), (dict(mca_mode="xx"), "mca_mode"), (dict(t=0), "precision t"),
    (dict(t=54), "precision t"), (dict(policy="nope"), "policy")])
def test_bad_arguments_are_clear_errors(kw, match):
    kw = dict(kw)
    mode = kw.pop("mode", "sr")
    with pytest.raises(ValueError, match=match):
        fpx.stochastic(lambda x: x + 1, mode, **kw)


def _special_prog(x, A):
    return {"add": x + x, "mul": x * 2.5, "div": x / 3.0, "sqrt": fnp.sqrt(x), "exp": fnp.exp(x),
            "sum": fnp.sum(x[1:2]), "cumsum": fnp.cumsum(x), "prod": fnp.prod(x[:2]),
            "mm": A @ A}


@pytest.mark.parametrize("fmt_name", ALL_FMTS)
@pytest.mark.parametrize("mode", RANDOM_MODES)
def test_nan_and_inf_propagate(fmt_name, mode):
    dt = FMT[fmt_name]
    x = np.array([np.nan, np.inf, -np.inf, 1.0], dt)
    A = np.array([[np.nan, 1], [np.inf, 2]], dt)
    with np.errstate(all="ignore"):
        ref = _special_prog(f64(x), f64(A))
    for gran in ("flop", "op"):
        r = run(_special_prog, x, A, mode=mode, samples=3, granularity=gran)
        for k, v in r.items():
            v = f64(v)
            e = np.broadcast_to(ref[k], v.shape)
            nonfinite = ~np.isfinite(e)
            assert np.array_equal(v[nonfinite], e[nonfinite], equal_nan=True), (k, gran)
            assert np.all(np.isfinite(v[~nonfinite])), (k, gran)


@pytest.mark.parametrize("gran", ["flop", "op"])
def test_float64_compensated_sums_keep_inf(gran):
    """Overflow and inf inputs give inf, as in IEEE arithmetic, not NaN (TwoSum's inf - inf)."""
    x = np.array([np.inf, 1.0])
    big = np.array([1e308, 1e308, -1e308])
    with np.errstate(all="ignore"):
        r = run(lambda x, b: {"s": fnp.sum(x), "c": fnp.cumsum(x), "m": x @ x,
                              "sb": fnp.sum(b), "mb": b @ np.ones(3)},
                x, big, samples=2, granularity=gran)
    assert np.all(r["s"] == np.inf) and np.all(r["c"] == np.inf) and np.all(r["m"] == np.inf)
    assert np.all(r["sb"] == np.inf) and np.all(r["mb"] == np.inf)


@pytest.mark.parametrize("mode", RANDOM_MODES)
def test_empty_arrays(mode):
    for dt in (np.float64, np.float32):
        x = np.zeros(0, dt)
        r = run(lambda x, A, B: {"add": x + 1.0, "sum": fnp.sum(x), "prod": fnp.prod(x),
                                 "cs": fnp.cumsum(x), "mm": A @ B, "rows": fnp.sum(A, axis=1),
                                 "cols": fnp.sum(A, axis=0)},
                x, np.zeros((3, 0), dt), np.zeros((0, 4), dt), mode=mode, samples=2)
        assert r["add"].shape == (2, 0) and r["cs"].shape == (2, 0)
        assert np.all(r["sum"] == 0) and np.all(r["prod"] == 1)
        assert r["mm"].shape == (2, 3, 4) and np.all(r["mm"] == 0)
        assert r["rows"].shape == (2, 3) and r["cols"].shape == (2, 0)


@pytest.mark.parametrize("mode", RANDOM_MODES)
def test_integer_programs_are_untouched(mode):
    i = np.array([1, 2, 3, 4])
    j = np.array([5, 6, 7, 8], np.int32)

    def prog(i, j):
        k = i * j + i // 2 - j % 3
        return {"k": k, "s": fnp.sum(k), "cs": fnp.cumsum(j), "p": fnp.prod(i),
                "mm": i.reshape(2, 2) @ j.reshape(2, 2), "v": i @ j,
                "idx": fnp.argmax(j), "r": fnp.reshape(k, (2, 2)).T}

    native = prog(i, j)
    r = run(prog, i, j, mode=mode, samples=3)
    for key, v in native.items():
        assert r[key].shape == (3,) + np.shape(v), key
        assert r[key].dtype == np.asarray(v).dtype, key
        assert np.all(r[key] == v), key


@pytest.mark.parametrize("mca_mode", ["rr", "pb", "mca"])
@pytest.mark.parametrize("S", [3, 4])
def test_mca_mixed_integer_and_float_operands(mca_mode, S):
    """Integer operands are not perturbed and keep their place when others gain a sample axis."""
    x = np.array([1.0, 2.0, 3.0], np.float32)
    i = np.array([10, 20, 30], np.int32)
    r = run(lambda x, i: x + i, x, i, mode="mca", mca_mode=mca_mode, samples=S)
    assert r.shape == (S, 3)
    assert np.allclose(r, [11.0, 22.0, 33.0], rtol=1e-5)
    r = run(lambda i: i * 2.5, i, mode="mca", mca_mode=mca_mode, samples=S)
    assert r.shape == (S, 3) and np.allclose(r, [25.0, 50.0, 75.0], rtol=1e-12)
    X = np.ones((2, 3), np.float32)
    r = run(lambda x, X: x * X + np.float32(1), x, X, mode="mca", mca_mode=mca_mode, samples=S)
    assert r.shape == (S, 2, 3) and np.allclose(r, [[2.0, 3.0, 4.0]] * 2, rtol=1e-5)


def test_mca_tiny_values_in_narrow_formats():
    """Values far below a narrow format's subnormals round to zero (not ±inf) under MCA."""
    x = np.array([1e-305, -1e-305, 1e-310, 5e-324, 1e-200, 0.0])
    for t in (None, 10, 53):
        for dt in (np.float32, np.float16, ml_dtypes.bfloat16):
            r = f64(run(lambda v: fnp.astype(v, dt), x, mode="mca", samples=4, t=t))
            assert np.all(r == 0), (t, dt, r)


def test_ieee_mode_is_the_plain_program():
    x = np.linspace(0, 1, 7).astype(np.float32)
    r = run(lambda x: fnp.exp(x) * 3.0 + fnp.sum(x), x, mode="ieee", samples=3)
    nat = np.exp(x) * np.float32(3.0) + np.sum(x)
    assert r.shape == (3, 7) and r.dtype == np.float32
    assert np.all(r == nat)


# ---------------------------------------------------------------------------------------------
# 8. matmul: flop vs op, unbiasedness, the fast float32 kernel
# ---------------------------------------------------------------------------------------------
def _exact_matmul(A, B):
    """A @ B exactly, as an object array of Fractions."""
    A, B = f64(A), f64(B)
    out = np.empty((A.shape[0], B.shape[1]), dtype=object)
    for m in range(A.shape[0]):
        for n in range(B.shape[1]):
            out[m, n] = sum(Fraction(a) * Fraction(b) for a, b in zip(A[m], B[:, n]))
    return out


def _assert_unbiased(samples, exact, zmax=6.0):
    """Every element's sample mean within zmax standard errors of the exact value (zmax 6:
    P(any of ~20 elements beyond) < 1e-7). ``exact``: Fractions (or floats that are exact);
    the mean is formed exactly. Elements without spread must equal the exact value."""
    s = f64(samples).reshape(samples.shape[0], -1)
    ex = np.asarray(exact, dtype=object).reshape(-1)
    # the spread of s - s[0] (exact differences): np.std of the values themselves carries
    # a rounding error of the mean of several ulps in float64
    se = (s - s[0]).std(axis=0, ddof=1) / math.sqrt(s.shape[0])
    for j in range(s.shape[1]):
        d = abs(float(sum(map(Fraction, s[:, j].tolist())) / s.shape[0] - Fraction(ex[j])))
        if se[j] == 0:
            assert d == 0, j
        else:
            assert d < zmax * se[j], (j, d / se[j])


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_matmul_flop_and_op_are_unbiased(dt):
    rng = np.random.default_rng(1)
    A = rng.standard_normal((3, 6)).astype(dt)
    B = rng.standard_normal((6, 4)).astype(dt)
    exact = _exact_matmul(A, B)
    S = 800
    spread = {}
    for gran in ("flop", "op"):
        r = run(lambda a, b: a @ b, A, B, samples=S, seed=21, granularity=gran)
        assert r.dtype == dt and r.shape == (S, 3, 4)
        assert np.all(F.representable(f64(r), F.get(dt)))
        _assert_unbiased(r, exact)
        r = f64(r)
        spread[gran] = ((r - r[0]).std(axis=0) / np.abs(exact.astype(float))).mean()
    # flop rounds 11 times per element, op once: more spread
    assert spread["flop"] > spread["op"] > 0


def _kernels_both(mode_code, A, B, S, seed=0):
    """The fast float32 kernel and the generic one on the same problem (same sample keys)."""
    A4 = np.ascontiguousarray(f64(A)[None, None])
    B4 = np.ascontiguousarray(f64(B)[None, None])
    M, Kd = A.shape
    N = B.shape[1]
    keys = sample_keys(seed, range(S))
    fast = np.empty((S, 1, M, N))
    K.fast_matmul(mode_code)(A4, B4, keys, 0, N * Kd, Kd, fast)
    gen = np.empty((S, 1, M, N))
    f32 = (24, -126, float(np.finfo(np.float32).max), False)
    K.matmul_flop(A4, B4, keys, 0, 1, mode_code, f32, f32, 24, False, gen)
    return fast[:, 0], gen[:, 0]


def test_fast_matmul_kernel_agrees_with_generic_kernel():
    # random problem: both unbiased (sr) and on float32's grid (all modes)
    rng = np.random.default_rng(2)
    A = rng.standard_normal((4, 9)).astype(np.float32)
    B = rng.standard_normal((9, 5)).astype(np.float32)
    exact = _exact_matmul(A, B)
    for code in (1, 2, 3):
        fast, gen = _kernels_both(code, A, B, 600, seed=1)
        for r in (fast, gen):
            assert np.all(F.representable(r, F.float32))
            assert np.max(np.abs(r - exact.astype(float))) < 1e-5
        if code == 1:
            _assert_unbiased(fast, exact)
            _assert_unbiased(gen, exact)
    # a problem with few outcomes: the two kernels' distributions agree (chi-square
    # homogeneity test)
    q = 2.0 ** -25
    row = np.array([1.0, q, 3 * q, 1.0 + 2.0 ** -23, -q], np.float32)
    M = 4000
    A = np.tile(row, (M, 1))
    B = np.array([[1.0], [1.0], [1.0], [0.5], [3.0]], np.float32)
    for code in (1, 2, 3):
        fast, gen = _kernels_both(code, A, B, 4, seed=2)
        vals = np.unique(np.concatenate([fast.ravel(), gen.ravel()]))
        table = np.array([[np.sum(fast == v) for v in vals], [np.sum(gen == v) for v in vals]])
        assert table.shape[1] > 1
        pv = stats.chi2_contingency(table).pvalue
        assert pv > ALPHA, (code, vals, table)


def test_fast_matmul_special_values_fall_back():
    f32max = float(np.finfo(np.float32).max)
    # K = 1: a product only; the fallback rounds it with the generic rounder and the same bits
    A = np.array([[1e-20], [3e-30], [1e30], [-1e30], [np.inf], [np.nan], [2.0 ** -126],
                  [1.5]], np.float32)
    B = np.array([[1e-20, 1e10, -3.0, 0.0]], np.float32)
    with np.errstate(all="ignore"):
        ref = f64(A) @ f64(B)
    bad = ~np.isfinite(ref) | (np.abs(ref) > f32max) | ((ref != 0) & (np.abs(ref) < 2.0 ** -126))
    assert bad.sum() >= 10
    for code in (1, 2, 3):
        fast, gen = _kernels_both(code, A, B, 16, seed=3)
        # the special elements take the generic rounder with the same bits: identical
        assert np.array_equal(fast[:, bad], gen[:, bad], equal_nan=True), code
        assert np.array_equal(np.isnan(fast), np.broadcast_to(np.isnan(ref), fast.shape))
        big = fast[:, np.isinf(ref) | (np.abs(ref) >= 2.0 ** 128)]
        if code == 3:    # cestac rounds an overflow toward zero (to ±max) on half its coins
            big = big[np.isfinite(big)]
            assert np.all(np.abs(big) == f32max) and big.size > 0
        else:
            assert np.all(np.isinf(big))
        assert np.all(F.representable(fast[np.isfinite(fast)], F.float32))
    # subnormal products summed: unbiased, on the subnormal grid
    A = np.full((2000, 3), 3e-23, np.float32)
    B = np.array([[1e-22], [2e-23], [7e-24]], np.float32)
    exact = float(sum(Fraction(float(np.float32(3e-23))) * Fraction(float(b))
                      for b in B[:, 0]))
    fast, gen = _kernels_both(1, A, B, 4, seed=4)
    for r in (fast, gen):
        assert np.all(F.representable(r, F.float32))
        assert np.all(np.abs(r) < 2.0 ** -126)          # subnormal results
        se = r.std(ddof=1) / math.sqrt(r.size)
        assert abs(r.mean() - exact) < Z * se
    # overflow inside the sum: inf, and inf/nan inputs mixed with finite ones
    A = np.array([[3e38, 3e38, -1.0], [np.inf, 1.0, 1.0], [np.nan, 1.0, 1.0],
                  [1.0, 2.0, 3.0]], np.float32)
    B = np.ones((3, 2), np.float32)
    for code in (1, 2, 3):
        fast, gen = _kernels_both(code, A, B, 8, seed=5)
        for r in (fast, gen):
            # cestac: an overflow rounded toward zero is max (as fpx.formats.round has it)
            # and the sum goes on from there
            ok = (r[:, 0] == np.inf) | ((r[:, 0] >= 3e38) if code == 3 else False)
            assert np.all(ok)
            assert np.all(r[:, 1] == np.inf)
            assert np.all(np.isnan(r[:, 2]))
            assert np.all(np.isfinite(r[:, 3]))


def test_fast_matmul_used_by_the_transform_is_the_documented_kernel():
    """The transform's float32 sr matmul draws from the fast kernel, in both its layouts
    (wide: natural; tall, few columns: transposed), with every decision in its place."""
    rng = np.random.default_rng(3)
    for (M, Kd, N) in ((3, 5, 70), (70, 5, 3)):
        A = rng.standard_normal((M, Kd)).astype(np.float32)
        B = rng.standard_normal((Kd, N)).astype(np.float32)
        r = f64(run(lambda a, b: a @ b, A, B, samples=3, seed=9))
        keys = sample_keys(9, range(3))
        out = np.empty((3, 1, M, N))
        K.fast_matmul(1)(np.ascontiguousarray(f64(A)[None, None]),
                         np.ascontiguousarray(f64(B)[None, None]), keys, 0, N * Kd, Kd, out)
        assert np.array_equal(r, out[:, 0]), (M, Kd, N)


def test_fast_matmul_cestac_moves_a_sum_float64_rounds_to_a_float32():
    """1 + 1.5·2^-60 is 1 in float64, but inexact: cestac rounds it down or up with
    probability 1/2 each (the fast kernel hands it to the general rounder with its
    residual), where taking the float64 sum as exact would always give 1."""
    M = 4000
    A = np.tile(np.array([1.0, 1.5 * 2.0 ** -60], np.float32), (M, 1))
    B = np.ones((2, 1), np.float32)
    fast, gen = _kernels_both(3, A, B, 1, seed=6)
    for r in (fast, gen):
        assert set(np.unique(r)) <= {1.0, 1.0 + 2.0 ** -23}
        up = np.mean(r == 1.0 + 2.0 ** -23)
        assert abs(up - 0.5) < Z * 0.5 / math.sqrt(M), up


def test_fast_matmul_bits_do_not_depend_on_threads_or_tiles():
    """The shared ordered skeleton (fpx.kernels.ordered) across its tile edges: the same
    samples on one thread and on all, and for a sub-block of columns passed with the
    position strides of the whole problem."""
    from fpx.kernels import ordered
    rng = np.random.default_rng(12)
    M, Kd, N = ordered.ROWS + 5, 9, ordered.COLS + 7
    A4 = f64(rng.standard_normal((M, Kd)).astype(np.float32))[None, None]
    B4 = f64(rng.standard_normal((Kd, N)).astype(np.float32))[None, None]
    keys = sample_keys(13, range(2))
    out = np.empty((2, 1, M, N))
    K.fast_matmul(1)(A4, B4, keys, 0, N * Kd, Kd, out)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        one = np.empty_like(out)
        K.fast_matmul(1)(A4, B4, keys, 0, N * Kd, Kd, one)
    finally:
        numba.set_num_threads(threads)
    assert np.array_equal(one, out)
    # the first 50 columns alone (other tiles), with the whole problem's position strides
    sub = np.empty((2, 1, M, 50))
    K.fast_matmul(1)(A4, np.ascontiguousarray(B4[..., :50]), keys, 0, N * Kd, Kd, sub)
    assert np.array_equal(sub, out[..., :50])


@pytest.mark.parametrize("mode", ["sr", "ud", "cestac", "mca"])
def test_matmul_1d_and_batched_shapes(mode):
    rng = np.random.default_rng(4)
    a = rng.standard_normal(5).astype(np.float32)
    M = rng.standard_normal((2, 5, 3)).astype(np.float32)
    r = run(lambda a, M: {"vv": a @ a, "vm": a @ M, "mv": fnp.swapaxes(M, -1, -2) @ a,
                          "mm": M @ fnp.swapaxes(M, -1, -2)}, a, M, mode=mode, samples=3)
    nat = {"vv": a @ a, "vm": a @ M, "mv": np.swapaxes(M, -1, -2) @ a,
           "mm": M @ np.swapaxes(M, -1, -2)}
    for k in nat:
        assert r[k].shape == (3,) + np.shape(nat[k]), k
        assert np.allclose(r[k], nat[k], rtol=1e-4, atol=1e-5), k


def test_tf32_policy_rounds_matmul_inputs():
    rng = np.random.default_rng(5)
    A = rng.standard_normal((4, 6)).astype(np.float32)
    I = np.eye(6, dtype=np.float32)
    S = 400
    r = f64(run(lambda a, b: a @ b, A, I, samples=S, seed=10, policy="tf32"))
    # A @ I = A rounded to tf32 (products by 1 and additions of 0 are exact in float32)
    assert np.all(F.representable(r, F.tf32))
    assert not np.all(F.representable(f64(A), F.tf32))
    _assert_unbiased(r, f64(A))                 # float32 values: exact as floats
    B = rng.standard_normal((6, 3)).astype(np.float32)
    r32 = f64(run(lambda a, b: a @ b, A, B, samples=64, seed=11))
    rtf = f64(run(lambda a, b: a @ b, A, B, samples=64, seed=11, policy="tf32"))
    assert rtf.std(axis=0).mean() > 30 * r32.std(axis=0).mean()
    # operands already in a narrower format are not rounded again (float16 -> tf32: exact)
    A16 = A.astype(np.float16)
    r16 = f64(run(lambda a, b: a @ b, A16, np.eye(6, dtype=np.float16), samples=8,
                  policy="tf32", mode="cestac"))
    assert np.all(r16 == f64(A16))
    # fp8 matmul inputs through a policy: A @ I gives A rounded to float8_e4m3fn, unbiased
    from fpx.policy import OpPrecision, get_policy
    p8 = get_policy("numpy").replace(matmul=OpPrecision(input="float8_e4m3fn",
                                                        accumulate="float32"))
    r8 = f64(run(lambda a, b: a @ b, A, I, samples=S, seed=12, policy=p8))
    assert np.all(F.representable(r8, F.float8_e4m3fn))
    _assert_unbiased(r8, f64(A))


def test_bfloat16_and_float16_programs():
    rng = np.random.default_rng(6)
    for dt in (ml_dtypes.bfloat16, np.float16):
        fmt = F.get(dt)
        x = rng.standard_normal(50).astype(dt)
        y = rng.uniform(0.5, 2, 50).astype(dt)
        prog = lambda x, y: {"e": fnp.exp(x) / y + x * y, "s": fnp.sum(x * y),   # noqa: E731
                             "m": x.reshape(5, 10) @ y.reshape(10, 5)}
        ref = prog(f64(x), f64(y))
        S = 200
        r = run(prog, x, y, samples=S, seed=12)
        for k in ("e", "s"):
            assert r[k].dtype == np.dtype(dt)
            assert np.all(F.representable(f64(r[k]), fmt))
            assert np.all(np.abs(f64(r[k]).mean(0) - ref[k]) < 0.05 * (1 + np.abs(ref[k])))
            assert np.all(f64(r[k]).std(0) > 0)
        # matmul: NumPy's result dtype for these operands, float32 accumulation by policy
        assert r["m"].dtype == np.asarray(x.reshape(5, 10) @ y.reshape(10, 5)).dtype
        assert np.allclose(f64(r["m"]).mean(0), ref["m"], rtol=0.05, atol=0.05)


# ---------------------------------------------------------------------------------------------
# 9. a small CNN through fpx.nn, MCA precision and submodes
# ---------------------------------------------------------------------------------------------
def _cnn(x, w1, b1, w2):
    h = fpx.nn.relu(fpx.nn.conv2d(x, w1, b1))
    h = fpx.nn.max_pool2d(h, 2)
    h = fnp.reshape(h, (h.shape[0], -1))
    return fpx.nn.log_softmax(h @ w2, axis=-1)


def test_cnn_under_stochastic_rounding():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 10, 10)).astype(np.float32)
    w1 = (rng.standard_normal((6, 3, 3, 3)) / 5).astype(np.float32)
    b1 = (rng.standard_normal(6) / 10).astype(np.float32)
    w2 = (rng.standard_normal((6 * 4 * 4, 10)) / 10).astype(np.float32)
    ref = _cnn(*(f64(a) for a in (x, w1, b1, w2)))
    for mode, gran in (("sr", "flop"), ("mca", "op"), ("ud", "op")):
        r32 = run(_cnn, x, w1, b1, w2, mode=mode, samples=12, seed=13, granularity=gran)
        assert r32.shape == (12, 2, 10) and r32.dtype == np.float32
        r = f64(r32)
        sd = r.std(axis=0)
        assert np.all(sd > 0), mode                       # every output varies
        assert np.all(sd < 1e-4 * (1 + np.abs(ref))), mode  # ... at float32 round-off level
        assert np.all(np.abs(r.mean(0) - ref) < 1e-4 * (1 + np.abs(ref))), mode
        bits = np.asarray(fpx.metrics.significant_bits(r32, ref, method="cnh"))
        assert np.all(bits > 10) and np.all(bits <= 24), (mode, bits)


def test_mca_virtual_precision_sets_the_spread():
    x = np.full(20_000, 1.2345678)
    y = np.full(20_000, 1.1)
    rel = {}
    for t in (10, 20, 30, 45):
        r = run(lambda a, b: a * b, x, y, mode="mca", mca_mode="rr", samples=2, t=t, seed=14)
        exact = 1.2345678 * 1.1
        rel[t] = float(np.std(r) / exact)
        # noise 2^(e+1-t)·ξ, ξ uniform on [-1/2, 1/2): relative std 2^(1-t)/sqrt(12)/(x/2^e)
        expect = 2.0 ** (1 - t) / math.sqrt(12) / (exact / 2.0 ** math.floor(math.log2(exact)))
        assert 0.9 * expect < rel[t] < 1.1 * expect, (t, rel[t], expect)
    assert rel[10] > rel[20] > rel[30] > rel[45]


def test_mca_submodes():
    x = np.full(5000, 1.25, np.float32)
    y = np.full(5000, 1.5, np.float32)
    S = 4
    add = lambda a, b: a + b     # noqa: E731
    # rr: outputs only -- inputs exact, the output 2.75 perturbed (unbiased)
    rr = f64(run(add, x, y, mode="mca", mca_mode="rr", samples=S))
    # pb: inputs only -- perturbed inputs, the sum rounded to nearest
    pb = f64(run(add, x, y, mode="mca", mca_mode="pb", samples=S))
    # mca: both
    mc = f64(run(add, x, y, mode="mca", mca_mode="mca", samples=S))
    for r in (rr, pb, mc):
        assert np.all(F.representable(r, F.float32))
        assert np.unique(r).size > 1
        se = r.std(ddof=1) / math.sqrt(r.size)
        assert abs(r.mean() - 2.75) < Z * se
    # both perturbations together spread more than either alone
    assert mc.std() > rr.std() and mc.std() > pb.std()
    # pb with Python-scalar operands only: nothing to perturb but the (RN) output
    r = run(lambda a: a * 0.5, np.ones(5000, np.float32), mode="mca", mca_mode="pb",
            samples=S)
    assert set(np.unique(f64(r))) == {0.5, 0.5 - 2.0 ** -25, 0.5 + 2.0 ** -24}


# ---------------------------------------------------------------------------------------------
# 10. a sum whose float64 evaluation is inexact keeps its TwoSum residual
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("op", ["add", "sub"])
def test_cestac_sum_with_a_tiny_operand_is_inexact(dtype, op):
    """1 ± 2^-60 is not a float32/bfloat16 value, although its float64 sum is 1 (exponents
    more than 53 apart): CESTAC rounds it up or down with probability 1/2 each, on the fused
    float32 path and on the general one (bfloat16) alike."""
    f = (lambda a, b: a + b) if op == "add" else (lambda a, b: a - b)
    r = f64(run(f, np.ones(4000, dtype), np.full(4000, 2.0 ** -60, dtype), mode="cestac",
                samples=2))
    assert_binom(np.sum(r != 1), r.size, 0.5, f"cestac 1 {op} 2^-60")


@pytest.mark.parametrize("mode", ["sr", "cestac"])
def test_fused_sum_with_a_tiny_operand_matches_the_general_path(mode, monkeypatch):
    """The fused float32 kernel hands an inexact float64 sum to the general rounder with its
    residual: the same samples as the general path."""
    import sys
    st_mod = sys.modules["fpx.transforms.stochastic"]
    a = np.ones(3000, np.float32)
    a[::3] = -3.0
    b = np.full(3000, 2.0 ** -60, np.float32)
    b[1::3] = 0.75                                   # an exact sum beside the inexact ones

    def go():
        return run(lambda a, b: {"add": a + b, "sub": a - b}, a, b, mode=mode, samples=3)
    fused = go()
    monkeypatch.setattr(st_mod, "_FAST_ROW_OPS", ())
    _equal_trees(fused, go())


def test_torch_module_samples_inside_interval_and_repeatable():
    """Issue 5: stochastic samples of a torch MLP (float32): the sample mean lies inside the
    interval bound, and the same seed gives the same samples (torch tensors in and out)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    s1 = fpx.stochastic(mlp, "sr", samples=8)(x)
    s2 = fpx.stochastic(mlp, "sr", samples=8)(x)
    assert isinstance(s1, torch.Tensor) and s1.dtype == torch.float32
    assert s1.shape == (8, 8, 4)
    assert torch.equal(s1, s2)
    iv = fpx.interval(mlp)(x)
    mean = s1.double().mean(0).numpy()
    assert np.all((iv.lo <= mean) & (mean <= iv.hi))
    assert float(s1.std(0).max()) > 0.0


# ---------------------------------------------------------------------------------------------
# the fused float32 elementwise path gives the same samples as the general one
# ---------------------------------------------------------------------------------------------
def _fused_binary_prog(x, h, b, c):
    return {"bias": h + b, "sub": b - h, "mul": x * c, "div": x / c, "both": x * h, "bc": c + b}


@pytest.mark.parametrize("mode", ["sr", "ud", "cestac"])
def test_fused_float32_binary_ops_equal_the_general_path(mode, monkeypatch):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 8, 6, 6)).astype(np.float32)
    x[0, 0, 0, :3] = [1e-41, 3e38, 0.0]          # subnormal, near-overflow, zero
    h = rng.standard_normal((4, 8, 6, 6)).astype(np.float32)
    b = rng.standard_normal((8, 1, 1)).astype(np.float32)   # a conv bias: middle-axis broadcast
    c = rng.standard_normal((6,)).astype(np.float32)
    import sys
    st_mod = sys.modules["fpx.transforms.stochastic"]

    def go():
        return fpx.stochastic(lambda x, h, b, c: _fused_binary_prog(x * 1.5, h, b, c), mode,
                              samples=5, seed=7, granularity="op", progress=False)(x, h, b, c)
    calls = []
    real = st_mod._fast_binary
    monkeypatch.setattr(st_mod, "_fast_binary", lambda *a: calls.append(a[1]) or real(*a))
    fused = go()
    assert set(calls) >= {"add", "sub", "mul", "div"}
    monkeypatch.setattr(st_mod, "_FAST_ROW_OPS", ())
    general = go()
    _equal_trees(fused, general)
    assert fused["bias"].dtype == np.float32 and fused["bias"].shape == (5, 4, 8, 6, 6)


@pytest.mark.parametrize("mode", ["sr", "ud", "cestac"])
@pytest.mark.parametrize("cumulative", [False, True])
def test_fast_float32_running_sums(mode, cumulative):
    """The float32 fast sum (samples side by side, bit patterns): results on float32's grid,
    SR/CESTAC exact on exact sums, the edges (cancellation to zero, subnormals, overflow to
    inf) through the general rounder, and the same samples for a shared or a per-sample input
    and for 1 or 2 threads."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 200, 2)).astype(np.float32)
    x[0, 10, 0] = -x[0, :10, 0].sum(dtype=np.float64)
    x[0, 11, 0] = 1e-40
    x[1, 50:53, 1] = [3.0e38, 2.0e38, -1e38]
    x[2, :5, 0] = [1e-44, -1e-44, 2e-39, 0.0, 0.0]
    ints = rng.integers(-1000, 1000, (3, 200, 2)).astype(np.float64)   # every sum exact
    keys = sample_keys(5, range(10))
    kern = K.fast_reduce(K.MODES[mode])

    def run(X):
        out = np.empty(X.shape if cumulative else X.shape[:2] + (1,) + X.shape[3:])
        kern(X, keys, 4, cumulative, out)
        return out
    shared = np.broadcast_to(x.astype(np.float64), (10,) + x.shape)
    y = run(shared)
    assert np.array_equal(y.astype(np.float32).astype(np.float64), y, equal_nan=True)
    final = y[:, :, -1] if cumulative else y[:, :, 0]
    if mode == "cestac":   # toward zero on half the coins: max (formats.round's rule), then -1e38
        assert (np.isinf(final[:, 1, 1]) | (final[:, 1, 1] > 2e38)).all()
    else:
        assert np.isinf(final[:, 1, 1]).all()                   # overflow past float32 max
    assert np.ptp(final[:, 0, 1]) > 0                            # the samples differ
    assert np.array_equal(run(np.ascontiguousarray(shared)), y, equal_nan=True)
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        assert np.array_equal(run(shared), y, equal_nan=True)
    finally:
        numba.set_num_threads(old)
    ye = run(np.broadcast_to(ints, (10,) + ints.shape))
    exact = np.cumsum(ints, axis=1) if cumulative else ints.sum(axis=1, keepdims=True)
    if mode != "ud":                                              # UD moves exact results
        assert np.array_equal(ye, np.broadcast_to(exact, ye.shape))


@pytest.mark.parametrize("mode", ["sr", "ud"])
def test_sort_and_argsort_are_exact_per_sample(mode):
    """sort/argsort add no rounding: each sample's sort is the sort of that sample's input
    (the samples' leading axis is not sorted over)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 9)).astype(np.float32)
    pre = run(lambda h: h * np.float32(1.1), x, mode=mode, samples=6, seed=3)
    srt = run(lambda h: fnp.sort(h * np.float32(1.1), axis=-1), x, mode=mode, samples=6, seed=3)
    arg = run(lambda h: fnp.argsort(h * np.float32(1.1), axis=0), x, mode=mode, samples=6, seed=3)
    assert srt.shape == (6, 4, 9) and np.array_equal(srt, np.sort(pre, axis=-1))
    assert np.array_equal(arg, np.argsort(pre, axis=1, kind="stable"))
