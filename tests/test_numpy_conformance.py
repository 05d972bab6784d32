"""NumPy conformance: for the ufuncs and reductions fpx maps, NumPy's own output (its float16
and float32 loops: SIMD kernels, vectorized tails, pairwise summation) must lie inside fpx's
interval bound of the same function under the ``"numpy"`` policy, on inputs that stress each
kernel: wide random ranges, values near 0 and near overflow, subnormals, ties, ±0, and odd
lengths that leave vector tails. The default run takes two lengths per case; the long run
(``FPX_CONFORMANCE=full pytest -m slow tests/test_numpy_conformance.py``) sweeps lengths
1..300 and more seeds."""
from __future__ import annotations

import os

import numpy as np
import pytest

import fpx
import fpx.numpy as fnp

DTYPES = (np.float16, np.float32)


def _stress(n, dtype, seed, lo=None, hi=None):
    """n values of ``dtype``: wide log-uniform magnitudes with both signs, plus zeros, ±0,
    subnormals, values near the largest finite one and exact ties (x.5), clipped to
    [lo, hi] where a function's domain needs it."""
    g = np.random.default_rng([seed, n, np.dtype(dtype).itemsize])
    fi = np.finfo(dtype)
    mags = np.exp(g.uniform(np.log(float(fi.smallest_subnormal)), np.log(float(fi.max)), n))
    x = mags * g.choice([-1.0, 1.0], n)
    specials = [0.0, -0.0, float(fi.smallest_subnormal), -float(fi.smallest_subnormal),
                float(fi.tiny), float(fi.max), -float(fi.max), 0.5, 1.5, 2.5, -0.5, 1.0]
    k = min(len(specials), n // 3)
    x[g.choice(n, k, replace=False)] = specials[:k]
    mid = g.standard_normal(n) * 4          # most elements at ordinary magnitudes
    x = np.where(g.random(n) < 0.6, mid, x)
    if lo is not None or hi is not None:
        x = np.clip(x, lo, hi)
    return x.astype(dtype)


UNARY = {
    "exp": (fnp.exp, None, 80.0), "expm1": (fnp.expm1, None, 80.0), "exp2": (fnp.exp2, None, 100.0),
    "log": (fnp.log, 0.0, None), "log1p": (fnp.log1p, -1.0, None), "log2": (fnp.log2, 0.0, None),
    "sqrt": (fnp.sqrt, 0.0, None), "sin": (fnp.sin, -1e4, 1e4), "cos": (fnp.cos, -1e4, 1e4),
    "tan": (fnp.tan, -1e3, 1e3), "arctan": (fnp.arctan, None, None),
    "sinh": (fnp.sinh, -80.0, 80.0), "cosh": (fnp.cosh, -80.0, 80.0),
    "tanh": (fnp.tanh, None, None), "reciprocal": (fnp.reciprocal, None, None),
    "square": (fnp.square, None, None), "abs": (fnp.abs, None, None),
    "negative": (fnp.negative, None, None), "floor": (fnp.floor, None, None),
}
BINARY = {"add": fnp.add, "subtract": fnp.subtract, "multiply": fnp.multiply,
          "divide": fnp.divide, "maximum": fnp.maximum, "minimum": fnp.minimum,
          "arctan2": fnp.arctan2, "power": fnp.power}
REDUCTIONS = {"sum": lambda x: fnp.sum(x, axis=-1), "sum_all": fnp.sum,
              "mean": lambda x: fnp.mean(x, axis=-1), "cumsum": lambda x: fnp.cumsum(x, axis=-1),
              "var": lambda x: fnp.var(x, axis=-1), "prod": lambda x: fnp.prod(x[..., :8], -1),
              "max": lambda x: fnp.max(x, axis=-1)}
SIZES = (7, 133)              # a short vector tail; several SIMD blocks and a tail
FULL = os.environ.get("FPX_CONFORMANCE") == "full"


def _inside(f, args, name, elementwise=True):
    with np.errstate(all="ignore"):
        y = np.asarray(f(*args), np.float64)
        iv = fpx.interval(f)(*args)
    ok = iv.contains(y)
    # a NaN (0/0, inf - inf) only where the bound admits one: unbounded, NaN or unstable
    lo, hi = np.asarray(iv.lo), np.asarray(iv.hi)
    nan_ok = (np.isneginf(lo) & np.isposinf(hi)) | np.isnan(lo) | np.isnan(hi)
    if iv.unstable is not None:
        nan_ok |= np.asarray(iv.unstable, bool)
    ok |= np.isnan(y) & nan_ok
    assert np.all(ok), (f"{name}: NumPy's output leaves fpx's bound at {int((~ok).sum())} of "
                        f"{ok.size}; first: {y[~ok][:3]} not in "
                        f"{list(zip(np.asarray(iv.lo)[~ok][:3], np.asarray(iv.hi)[~ok][:3]))}")
    # and the bound means something: an elementwise op's, at ordinary magnitudes, a few ulps
    # wide (a reduction's grows with its length and the cancellation)
    normal = np.isfinite(y) & (np.abs(y) > 1e-3) & (np.abs(y) < 1e3)
    if elementwise and normal.sum() > 2:
        with np.errstate(invalid="ignore"):      # (inf - inf where an end is infinite)
            rel = (np.asarray(iv.hi) - np.asarray(iv.lo))[normal] / np.abs(y[normal])
        assert np.median(rel) < 64 * float(np.finfo(args[0].dtype).eps), (name, np.median(rel))


def _unary(name, dtype, n, seed=0):
    f, lo, hi = UNARY[name]
    _inside(f, (_stress(n, dtype, seed, lo, hi),), f"{name} {np.dtype(dtype)} n={n}")


def _binary(name, dtype, n, seed=0):
    a, b = _stress(n, dtype, seed), _stress(n, dtype, seed + 1)
    if name == "power":        # a real power: positive bases, moderate exponents
        a, b = np.abs(a).clip(1e-3, 1e3).astype(dtype), (b.clip(-8, 8)).astype(dtype)
    _inside(BINARY[name], (a, b), f"{name} {np.dtype(dtype)} n={n}")


def _reduction(name, dtype, n, seed=0):
    g = np.random.default_rng([seed, n])
    x = (g.standard_normal((3, n)) * g.choice([1e-3, 1.0, 30.0], (3, 1))
         + g.choice([0.0, 100.0], (3, 1))).astype(dtype)       # cancellation in some rows
    _inside(REDUCTIONS[name], (x,), f"{name} {np.dtype(dtype)} n={n}", elementwise=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_numpy_unary_ufunc_inside_bound(name, dtype):
    for n in SIZES:
        _unary(name, dtype, n)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_numpy_binary_ufunc_inside_bound(name, dtype):
    for n in SIZES:
        _binary(name, dtype, n)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_numpy_reduction_inside_bound(name, dtype):
    # long enough for NumPy's pairwise summation (blocks of 8, unrolled, 128-element leaves)
    for n in (9, 1000):
        _reduction(name, dtype, n)


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="the long sweep: set FPX_CONFORMANCE=full")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_conformance_sweep(dtype):
    for seed in range(3):
        for n in list(range(1, 40)) + [63, 64, 65, 127, 128, 129, 255, 256, 300]:
            for name in UNARY:
                _unary(name, dtype, n, seed)
            for name in BINARY:
                _binary(name, dtype, n, seed)
        for n in (1, 2, 7, 8, 9, 15, 16, 17, 127, 128, 129, 1024, 5000):
            for name in REDUCTIONS:
                _reduction(name, dtype, n, seed)
