"""Regression tests of issue 27 (wrong behaviours under bad input, concurrency and nesting):
each W-item's repro with the right value, a bound that holds, or a clear error."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import fpx
from fpx import formats as F
from fpx.kernels import stochastic as K

stochastic_mod = __import__("fpx.stochastic", fromlist=["sample_keys"])
sample_keys = stochastic_mod.sample_keys

F32MAX = float(np.finfo(np.float32).max)
F64MAX = float(np.finfo(np.float64).max)


def _within(count, n, p, z=6.0):
    """``count`` successes of ``n`` Bernoulli(p) trials within z standard deviations (plus one
    count, for p at 0 or 1)."""
    return abs(count - n * p) <= z * math.sqrt(n * p * (1 - p)) + 1


# ---------------------------------------------------------------------------------------------
# W1: float64 op-granularity matmul with one batched operand
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("side", ["left", "right"])
def test_w1_float64_op_matmul_with_one_batched_operand(side):
    x = np.random.default_rng(0).standard_normal((4, 8))
    w = np.random.default_rng(1).standard_normal((8, 3))
    if side == "left":
        f, exact = (lambda a: (a * 1.5) @ w), (x * 1.5) @ w
    else:
        f, exact = (lambda a: w.T @ (a.T * 1.5)), w.T @ (x.T * 1.5)
    run = fpx.stochastic(f, "sr", samples=3, granularity="op")
    s = run(x)
    assert s.shape == (3,) + exact.shape
    assert np.all(np.isfinite(s))
    np.testing.assert_allclose(s, np.broadcast_to(exact, s.shape), rtol=1e-12, atol=1e-14)
    assert np.array_equal(s, run(x))                  # deterministic: no stray memory read


# ---------------------------------------------------------------------------------------------
# W8: stochastic rounding near overflow, as fpx.formats.round has it
# ---------------------------------------------------------------------------------------------
def _p_overflow(v: Fraction, fmt, mode):
    """P(result is ±inf) of rounding the exact value v (v > max) into fmt with mode."""
    mx = Fraction(fmt.max)
    ulp = Fraction(2) ** (fmt.emax - fmt.p + 1)
    assert abs(v) > mx
    frac = min((abs(v) - mx) / ulp, Fraction(1))
    if mode == "sr":
        return float(frac)
    if mode == "ud":        # RN overflows (no step from it), else one step up from max
        return 1.0 if frac >= Fraction(1, 2) else 0.5
    return 0.5              # cestac: the coin that rounds away from zero


N = 20000


@pytest.mark.parametrize("mode", ["sr", "ud", "cestac"])
@pytest.mark.parametrize("case", ["f32 max+1e31", "f64 max+ulp/2", "f64 max+0.3ulp",
                                  "f64 mul", "f64 div", "f64 sub"])
def test_w8_overflow_probability_matches_formats_round(mode, case):
    mx32, half_ulp64 = np.float32(F32MAX), 2.0 ** 970
    if case == "f32 max+1e31":
        t, fn, fmt = np.full(N, mx32), (lambda t: t + np.float32(1e31)), F.float32
        v = Fraction(F32MAX) + Fraction(float(np.float32(1e31)))
    elif case == "f64 max+ulp/2":
        t, fn, fmt = np.full(N, F64MAX), (lambda t: t + half_ulp64), F.float64
        v = Fraction(F64MAX) + Fraction(half_ulp64)
    elif case == "f64 max+0.3ulp":
        c = 0.3 * 2.0 ** 971
        t, fn, fmt = np.full(N, F64MAX), (lambda t: t + c), F.float64
        v = Fraction(F64MAX) + Fraction(c)
    elif case == "f64 sub":
        c = -0.7 * 2.0 ** 971
        t, fn, fmt = np.full(N, -F64MAX), (lambda t: t - (-c)), F.float64
        v = Fraction(-F64MAX) + Fraction(c)
    elif case == "f64 mul":
        a, b = F64MAX * 0.75, 4.0 / 3.0 + 2.0 ** -50
        t, fn, fmt = np.full(N, a), (lambda t: t * b), F.float64
        v = Fraction(a) * Fraction(b)
    else:
        a, b = F64MAX * 0.75, 0.75 - 2.0 ** -52
        t, fn, fmt = np.full(N, a), (lambda t: t / b), F.float64
        v = Fraction(a) / Fraction(b)
    p = _p_overflow(v, fmt, mode)
    with np.errstate(all="ignore"):
        got = fpx.stochastic(fn, mode, samples=1, seed=3)(t)[0]
    ref = None
    if fmt is F.float32:
        ref = F.round(np.full(N, float(v)), fmt, mode, np.random.default_rng(4))
    elif case.startswith("f64 max"):     # the pair (max, v - max), v - max a float64
        ref = F.round(np.full(N, F64MAX), fmt, mode, np.random.default_rng(4),
                      residual=np.full(N, float(v - Fraction(F64MAX))))
    ulp = 2.0 ** (fmt.emax - fmt.p + 1)
    assert np.all(np.isinf(got) | (np.abs(got) == fmt.max) | (np.abs(got) == fmt.max - ulp))
    assert np.all(np.sign(got) == (1 if v > 0 else -1))
    assert _within(int(np.isinf(got).sum()), N, p), (np.isinf(got).mean(), p)
    if ref is not None:      # formats.round on the same (float64-exact) value agrees
        assert _within(int(np.isinf(ref).sum()), N, p), (np.isinf(ref).mean(), p)


def test_w8_formats_round_float64_overflow_residual_pair():
    """formats.round of the pair (max, ulp/2) -- the same value the kernel rounds as halves."""
    x = np.full(N, F64MAX)
    r = np.full(N, 2.0 ** 970)
    got = F.round(x, "f64", "sr", np.random.default_rng(5), residual=r)
    assert _within(int(np.isinf(got).sum()), N, 0.5)


@pytest.mark.parametrize("code", [1, 2, 3])
def test_w8_fast_float32_rows_take_the_general_rounders_decisions(code):
    """The float32 bit-pattern kernel and the general rounder read the random bits the same
    way, so they agree element for element -- the fallback of the fast kernel to the general
    one (overflow, subnormals) can no longer bias it (it made P(overflow) 0 under sr)."""
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.standard_normal(3000) * 10.0 ** rng.integers(-40, 39, 3000),
                        np.full(500, F32MAX + 1e31), np.full(500, -(F32MAX + 1e31)),
                        rng.uniform(1, 2, 500) * 2.0 ** -126, -rng.uniform(1, 2, 500) * 2.0 ** -126,
                        np.full(200, 2.0 ** -126), [0.0, -0.0, np.inf, -np.inf, np.nan]])
    x = x.astype(np.float32).astype(np.float64) * (1 + 2.0 ** -30)   # inexact in float32
    x = x.reshape(1, -1)
    keys = sample_keys(7, range(4))
    fast = np.empty((4, x.shape[1]))
    gen = np.empty((4, x.shape[1]))
    with np.errstate(all="ignore"):
        K.fast_round_rows(code)(x, x, keys, 11, fast)
        K.round_rows(x, np.empty((1, 0)), keys, 11, code, 24, -126, F32MAX, False, 24, gen)
    assert np.array_equal(fast, gen, equal_nan=True)
