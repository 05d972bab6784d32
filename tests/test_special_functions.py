"""lgamma, digamma and polygamma (n >= 1): fpx's bounds against mpmath over random intervals
(both signs, across poles, around the minima), and against torch's own CPU kernels in every
dtype (on the negative axis through fpx's models as the adapter binds them)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import fpx
from fpx import nn_special
from fpx import numpy as fnp

mpmath = pytest.importorskip("mpmath")
torch = pytest.importorskip("torch")

mpmath.mp.prec = 120
# the programs' own NumPy evaluation at poles, ±inf and NaN (1/0, sin(inf)) warns as NumPy does
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def lgamma_true(x):
    if x <= 0 and x == math.floor(x):
        return math.inf
    return float(mpmath.log(abs(mpmath.gamma(mpmath.mpf(x)))))


def random_intervals(rng, n=300):
    """Intervals inside one piece (positive, around ψ's roots, negative pieces near and far)
    and across poles."""
    out = []
    for _ in range(n):
        kind = rng.integers(5)
        if kind == 0:
            a = rng.uniform(1e-6, 12)
        elif kind == 1:
            a = 1.4616321449683622 - rng.uniform(0, 1e-2)
        elif kind == 2:
            a = -rng.integers(0, 45) - rng.uniform(0.01, 0.99)
        elif kind == 3:
            a = -rng.integers(45, 2000) - rng.uniform(0.01, 0.99)
        else:
            a = -rng.uniform(0, 30)
        w = 10.0 ** rng.uniform(-8, 0.3)
        out.append((a, a + w))
    return np.array(out)


def test_lgamma_bound_of_an_interval_holds_mpmath_at_every_point():
    """Every point of every box (ends, 30 points inside, ψ's root where inside) maps inside
    the bound; within one piece the bound's lower end is the true minimum to 1e-9 (the
    minimum inside the box is found, not an end's value)."""
    rng = np.random.default_rng(0)
    box = random_intervals(rng)
    x = fpx.Interval(box[:, 0], box[:, 1], box.mean(1))
    iv = fpx.interval(nn_special.lgamma)(x)
    for (a, b), lo, hi in zip(box, iv.lo, iv.hi):
        pts = np.concatenate([[a, b], np.linspace(a, b, 30)])
        for r in [1.4616321449683622] + [float(mpmath.findroot(
                mpmath.digamma, (-k - 1 + 1e-9, -k - 1e-9), solver="anderson"))
                for k in range(-int(math.floor(a)) - 1, -int(math.floor(a))) if a < 0]:
            if a <= r <= b:
                pts = np.append(pts, r)
        ys = [lgamma_true(p) for p in pts]
        assert all(lo <= y <= hi for y in ys), (a, b, lo, hi, min(ys), max(ys))
        if math.floor(a) == math.floor(b) or a > 0:          # no pole inside
            m = min(ys)
            assert lo >= m - 1e-9 * max(1.0, abs(m)), (a, b, lo, m)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16],
                         ids=str)
def test_lgamma_bound_holds_torch_and_the_exact_value(dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(2000, generator=g) * 8, torch.rand(500, generator=g) * 1e-3,
                   -torch.rand(500, generator=g) * 50, 1 + torch.randn(200, generator=g) * 1e-4,
                   2 + torch.randn(200, generator=g) * 1e-4,
                   -2.4570247 + torch.randn(200, generator=g) * 1e-5]).to(dtype)
    iv = fpx.interval(torch.lgamma)(x)
    assert iv.contains(torch.lgamma(x).double().numpy()).all()
    exact = np.array([lgamma_true(v) for v in x.double().tolist()])
    assert iv.contains(exact).all()
    assert iv.contains(iv.value.double().numpy()).all()


def test_lgamma_poles_infinities_and_nan_are_defined():
    x = torch.tensor([0.0, -0.0, -3.0, float("inf"), -float("inf"), float("nan")])
    iv = fpx.interval(torch.lgamma)(x)
    assert (iv.lo[:5] == np.inf).all() and (iv.hi[:5] == np.inf).all()
    assert np.isnan(iv.lo[5]) and np.isnan(iv.hi[5]) and torch.isnan(torch.lgamma(x)[5])
    box = fpx.Interval(np.array([-3.5, -0.5]), np.array([-2.5, 0.5]), np.array([-3.0, 0.0]))
    iv = fpx.interval(nn_special.lgamma)(box)
    assert (iv.lo == -np.inf).all() and (iv.hi == np.inf).all()   # a pole inside: unbounded


def trigamma_true(x):
    return float(mpmath.psi(1, mpmath.mpf(x)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16],
                         ids=str)
def test_trigamma_bound_holds_torch(dtype):
    """polygamma(1, x) is torch's kernel step by step: the bound holds its output (also near
    the poles, where π·x's rounding moves it far from ψ'); in float32 away from the poles it
    holds ψ' too (float64's kernel truncates its series at ~1e-8 relative)."""
    g = torch.Generator().manual_seed(4)
    x = torch.cat([torch.randn(2000, generator=g) * 8,
                   -torch.arange(1.0, 40.0).repeat(5) + torch.randn(195, generator=g) * 1e-3,
                   torch.rand(300, generator=g) * 1e-3]).to(dtype)
    iv = fpx.interval(lambda t: torch.polygamma(1, t))(x)
    assert iv.contains(torch.polygamma(1, x).double().numpy()).all()
    if dtype == torch.float32:
        xs = x.double().numpy()
        far = np.abs(xs - np.round(xs)) > 0.05
        exact = np.array([trigamma_true(v) for v in xs[far]])
        assert ((iv.lo[far] <= exact) & (exact <= iv.hi[far])).all()


def test_trigamma_of_an_interval_holds_torch_at_its_points():
    rng = np.random.default_rng(1)
    box = random_intervals(rng, 200)
    iv = fpx.interval(nn_special.trigamma)(fpx.Interval(box[:, 0], box[:, 1], box.mean(1)))
    for (a, b), lo, hi in zip(box, iv.lo, iv.hi):
        ys = torch.polygamma(1, torch.linspace(a, b, 30, dtype=torch.float64)).numpy()
        assert ((lo <= ys) & (ys <= hi)).all(), (a, b, lo, hi)


def test_trigamma_infinities_and_nan():
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0])
    iv = fpx.interval(lambda t: torch.polygamma(1, t))(x)
    y = torch.polygamma(1, x)
    yd = y.double().numpy()
    assert (iv.lo[[0, 3]] <= yd[[0, 3]]).all() and (yd[[0, 3]] <= iv.hi[[0, 3]]).all()
    assert np.isnan(iv.lo[1:3]).all() and torch.isnan(y[1:3]).all()


@pytest.mark.parametrize("n", [2, 3, 5, 10])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16],
                         ids=str)
def test_polygamma_bound_holds_torch_and_the_exact_value(n, dtype):
    """n >= 2: n! (the kernel's exp(lgamma(n + 1)) in the dtype) times cephes ζ(n + 1, x) --
    whose float first term pow(x, -n-1) underflows for large x (ζ(11, 12742) is 10
    subnormal ulps low in torch's float32 kernel)."""
    g = torch.Generator().manual_seed(n)
    x = torch.cat([torch.rand(300, generator=g) * 10,
                   10 ** (torch.rand(300, generator=g) * 9 - 5)]).to(dtype)
    x = x[(x > 0) & torch.isfinite(x)]
    iv = fpx.interval(lambda t: torch.polygamma(n, t))(x)
    assert iv.contains(torch.polygamma(n, x).double().numpy()).all()
    exact = np.array([float(mpmath.psi(n, mpmath.mpf(v))) for v in x.double().tolist()])
    assert iv.contains(exact).all()
    if dtype == torch.float64:             # tight: a few ulps of n! and of ζ
        assert float(np.max((iv.hi - iv.lo) / np.abs(exact))) < 1e-12




def test_polygamma_zero_is_digamma():
    x = torch.rand(50) * 5 + 0.1
    iv = fpx.interval(lambda t: torch.polygamma(0, t))(x)
    assert iv.contains(torch.digamma(x).double().numpy()).all()


def test_stochastic_runs_trigamma_and_refuses_lgamma_naming_it():
    x = torch.rand(64) * 5 + 0.1
    s = fpx.stochastic(lambda t: torch.polygamma(1, t), "sr", samples=8, seed=0)(x)
    assert s.shape == (8, 64)
    rel = ((s.double() - torch.polygamma(1, x.double())).abs() / torch.polygamma(1, x.double()))
    assert float(rel.max()) < 1e-5
    with pytest.raises(Exception, match="lgamma"):
        fpx.reproducible(torch.lgamma)(x)


def test_stochastic_rounds_lgamma_at_random():
    """lgamma under SR: every sample is one of the two float32 neighbours of the libm's
    float64 value, and the sample mean is unbiased (within 4 standard errors of one ulp's
    Bernoulli draw)."""
    torch.manual_seed(1)
    x = torch.rand(200, dtype=torch.float64).float() * 6 + 0.2
    S = 64
    s = fpx.stochastic(torch.lgamma, "sr", samples=S, seed=3)(x).double().numpy()
    exact = np.asarray(torch.lgamma(x.double()), np.float64)
    down = exact.astype(np.float32)
    down = np.where(down.astype(np.float64) > exact, np.nextafter(down, -np.inf), down)
    up = np.nextafter(down, np.inf).astype(np.float64)
    down = down.astype(np.float64)
    assert np.all((s == down) | (s == up))
    err = (s.mean(0) - exact) / (up - down)
    assert np.all(np.abs(err) <= 4 * 0.5 / np.sqrt(S) + 1e-9)
    assert np.any(s.std(0) > 0)


def test_stochastic_runs_polygamma_through_zeta():
    """polygamma(3) = -n!·ζ(4, x) under SR: ζ's value and the product rounded at random, the
    samples spread and within a few float32 ulps of the float64 value."""
    x = torch.rand(200, dtype=torch.float64).float() * 6 + 0.2
    s = fpx.stochastic(lambda t: torch.polygamma(3, t), "sr", samples=16, seed=3)(x).double()
    exact = torch.polygamma(3, x.double())
    assert float(((s - exact).abs() / exact.abs()).max()) < 8 * 2.0 ** -24
    assert float(s.std(0).max()) > 0


# -- digamma and polygamma (n >= 2) on the negative axis -----------------------------------------
ROOTS = [-0.5040830082644554, -1.5734984731623904, -2.6107208684441447, -9.702672540001863]


def negative_axis(dtype, n=300, seed=0):
    """Random negative arguments (wide), near the poles 0, -1, ..., -49 (both sides, 2^-30 to
    2^-1 away), near ψ's negative roots, half-integers, ±0, negative integers and -inf."""
    rng = np.random.default_rng(seed)
    near = rng.choice([-1, 1], n) * 2.0 ** rng.uniform(-30, -1, n)
    x = np.concatenate([-np.exp(rng.uniform(-20, 9, n)), -rng.integers(0, 50, n) + near,
                        np.repeat(ROOTS, 10) + rng.normal(0, 1e-6, 40),
                        -rng.integers(0, 40, 20) - 0.5, [0.0, -0.0, -1.0, -7.0, -np.inf]])
    return torch.tensor(x).to(dtype)


def as_torch_computes(fn, dtype):
    """``fn`` of the float32 or float64 program as torch's CPU kernel runs it for ``dtype``:
    float16/bfloat16 upcast to float32, rounded once to the dtype (as the adapter binds it)."""
    if dtype in (torch.float64, torch.float32):
        return fn
    low = torch.empty(0, dtype=dtype).numpy().dtype if dtype == torch.float16 else \
        np.dtype(fpx.formats.get("bfloat16").dtype)
    return lambda t: fnp.astype(fn(fnp.astype(t, np.float32), low), low)


def holds(iv, y):
    """torch's values inside the bound, NaN where both are NaN (torch's NaN at the negative
    integers and -inf: the bound makes no claim there)."""
    return iv.contains(y) | (np.isnan(y) & np.isnan(iv.lo) & np.isnan(iv.hi))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16],
                         ids=str)
def test_digamma_of_negative_arguments_holds_torch_and_the_exact_value(dtype):
    """x < 0: calc_digamma(1 - x) - π/tan(π·r), r = modf(x), as the kernel (its π·r rounded:
    near the poles its value is many ulps from ψ); ±0 -> ±inf, negative integers -> NaN."""
    x = negative_axis(dtype)
    iv = fpx.interval(as_torch_computes(lambda t, *low: fpx.nn.digamma(t), dtype))(
        _numpy(x))
    y = torch.digamma(x).double().numpy()
    assert holds(iv, y).all(), x[~holds(iv, y)]
    assert np.isnan(iv.lo[np.isnan(y)]).all()
    if dtype == torch.float64:
        # ψ itself where π·r's rounding moves the kernel little: not just above a negative
        # integer (r near -1: π·(1 + r) is then known to a few ulps of π only)
        xd = x.numpy()
        fin = np.isfinite(xd) & (xd - np.floor(xd) > 0.1)
        exact = np.array([float(mpmath.digamma(v)) for v in xd[fin]])
        assert ((iv.lo[fin] <= exact) & (exact <= iv.hi[fin])).all()
        half = (xd == np.floor(xd) + 0.5) & (xd > -40)   # tight: ulps of ψ(1 - x)
        assert np.all(iv.hi[half] - iv.lo[half] < 1e-13 * (1 + np.abs(y[half])))


def _numpy(x):
    """A torch tensor as the NumPy array the adapter hands fpx (bfloat16: ml_dtypes')."""
    if x.dtype == torch.bfloat16:
        return x.float().numpy().astype(fpx.formats.get("bfloat16").dtype)
    return x.numpy()


def test_digamma_of_an_interval_holds_mpmath_at_every_point():
    rng = np.random.default_rng(4)
    box = random_intervals(rng, 150)
    iv = fpx.interval(fpx.nn.digamma)(fpx.Interval(box[:, 0], box[:, 1], box.mean(1)))
    for (a, b), lo, hi in zip(box, iv.lo, iv.hi):
        pts = np.linspace(a, b, 12)
        ys = [float(mpmath.digamma(p)) for p in pts if not (p <= 0 and p == math.floor(p))]
        assert all(lo <= y <= hi for y in ys), (a, b, lo, hi, min(ys), max(ys))
    inside = (np.floor(box[:, 0]) == np.floor(box[:, 1])) & (box[:, 1] - box[:, 0] < 1e-3)
    assert np.isfinite(iv.hi - iv.lo)[inside].all()


@pytest.mark.parametrize("n", [2, 3, 6])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16],
                         ids=str)
def test_polygamma_of_negative_arguments_holds_torch_and_the_exact_value(n, dtype):
    """x < 0: torch's cephes ζ(n + 1, x) sums from x (its terms cancel for odd n + 1); +inf at
    0, -1, -2, ... and -inf, so ψ⁽ⁿ⁾ is ±inf there, as torch's."""
    x = negative_axis(dtype, 150, seed=n)
    iv = fpx.interval(as_torch_computes(
        lambda t, *low: nn_special.polygamma(n, t, stored=low[0] if low else None), dtype))(
        _numpy(x))
    y = torch.polygamma(n, x).double().numpy()
    assert holds(iv, y).all(), x[~holds(iv, y)]
    pole = (x.double().numpy() == np.floor(x.double().numpy()))
    assert (iv.lo[pole] == y[pole]).all() and np.isinf(y[pole]).all()
    if dtype == torch.float64:
        xd = x.numpy()
        fin = np.isfinite(xd) & ~pole
        exact = np.array([float(mpmath.psi(n, v)) for v in xd[fin]])
        assert ((iv.lo[fin] <= exact) & (exact <= iv.hi[fin])).all()
        if n % 2:          # ζ(even, x): no cancellation, so tight: ~100 ulps of Σ|terms|
            assert float(np.max((iv.hi - iv.lo)[fin] / np.abs(exact))) < 1e-12


@pytest.mark.parametrize("n", [2, 3])
def test_polygamma_of_an_interval_holds_mpmath_at_every_point(n):
    rng = np.random.default_rng(5 + n)
    box = random_intervals(rng, 60)
    iv = fpx.interval(lambda t: nn_special.polygamma(n, t))(
        fpx.Interval(box[:, 0], box[:, 1], box.mean(1)))
    for (a, b), lo, hi in zip(box, iv.lo, iv.hi):
        pts = [p for p in np.linspace(a, b, 12) if not (p <= 0 and p == math.floor(p))]
        ys = [float(mpmath.psi(n, p)) for p in pts]
        assert all(lo <= y <= hi for y in ys), (a, b, lo, hi, min(ys), max(ys))
    box = fpx.Interval(np.array([-3.5, -0.5]), np.array([-2.5, 0.5]), np.array([-3.0, 0.0]))
    iv = fpx.interval(lambda t: nn_special.polygamma(n, t))(box)
    assert (iv.lo == -np.inf).all() and (iv.hi == np.inf).all()   # a pole inside: unbounded


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_torch_digamma_and_polygamma_of_negative_arguments_hold_torch(dtype):
    """Through the adapter (the dtype's two paths: its own, and float32 rounded once)."""
    x = negative_axis(dtype, 40, seed=9)
    for f in (torch.digamma, lambda t: torch.polygamma(2, t), lambda t: torch.polygamma(3, t)):
        assert holds(fpx.interval(f)(x), f(x).double().numpy()).all()


def test_stochastic_runs_digamma_of_negative_arguments():
    x = (-torch.rand(64, dtype=torch.float64) * 20).float()
    s = fpx.stochastic(fpx.nn.digamma, "sr", samples=4, seed=2)(x.numpy())
    exact = torch.digamma(x.double()).numpy()
    assert np.all(np.abs(s - exact) <= 1e-3 * (1 + np.abs(exact)))
