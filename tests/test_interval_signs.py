"""Rounding at the ends of the range (issue 28): a rounded result whose exact value lies in
the range is finite (``finfo.min`` plus a small bias keeps a finite lower end; past ``max``
the bound says it may overflow, as round to nearest does from ``max + ulp(max)/2``), and a
correctly rounded or faithful result keeps its exact value's sign (``0/8`` is 0, so a
variance of zeros has no NaN square root)."""
from __future__ import annotations

import numpy as np
import pytest

import fpx
import fpx.numpy as fnp

F32 = np.float32


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_finfo_min_plus_a_small_bias_stays_finite(dtype):
    top = float(np.finfo(dtype).max)
    ulp = float(np.spacing(np.nextafter(np.asarray(top, dtype), 0)))   # ulp(max)
    x = np.array([-top, -top, top, top], dtype)
    b = np.array([1.0, ulp / 4, -1.0, -ulp], dtype)        # biases into the range
    with np.errstate(over="ignore"):
        for f in (lambda x, b: x + b, lambda x, b: (-x) - b, lambda x, b: x * np.asarray(1, dtype),
                  lambda x, b: x / np.asarray(1, dtype)):
            iv = fpx.interval(f)(x, b)
            y = f(x, b)
            assert np.all(np.isfinite(y))
            assert iv.contains(y).all()
            assert np.all(np.isfinite(iv.lo)) and np.all(np.isfinite(iv.hi))
            # (up to the overflow threshold max + ulp(max)/2, a hair more; never to infinity)
            edge = (top + ulp / 2) * (1 + 2.0 ** -40)
            assert np.all(iv.lo >= -edge) and np.all(iv.hi <= edge)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_past_max_plus_half_an_ulp_the_bound_overflows(dtype):
    top = float(np.finfo(dtype).max)
    ulp = float(np.spacing(np.nextafter(np.asarray(top, dtype), 0)))
    x = np.array([-top, top], dtype)
    b = np.array([-ulp, ulp], dtype)           # exact sums -(max + ulp), max + ulp: overflow
    with np.errstate(over="ignore"):
        y = x + b
        iv = fpx.interval(lambda x, b: x + b)(x, b)
    assert np.isneginf(y[0]) and np.isposinf(y[1])
    assert iv.contains(y).all()
    assert np.isneginf(iv.lo[0]) and np.isposinf(iv.hi[1])


def test_torch_additive_mask_at_finfo_min_stays_finite():
    torch = pytest.importorskip("torch")
    mn = torch.finfo(torch.float32).min
    s = torch.tensor([[0.5, 0.25, -3.0]])
    iv = fpx.interval(lambda s: s + mn)(s)
    assert np.all(np.isfinite(iv.lo)) and iv.contains(s + mn).all()


def _nonneg_programs():
    return {
        "sqrt(relu(x)/8)": lambda x: fnp.sqrt(fnp.maximum(x, F32(0)) / F32(8)),
        "sqrt(x*x/8)": lambda x: fnp.sqrt(x * x / F32(8)),
        "sqrt(|x|*0.125)": lambda x: fnp.sqrt(fnp.abs(x) * F32(0.125)),
        "sqrt(relu(x)*relu(x) + relu(x))": lambda x: fnp.sqrt(
            fnp.maximum(x, F32(0)) * fnp.maximum(x, F32(0)) + fnp.maximum(x, F32(0))),
        "sqrt(var)": lambda x: fnp.sqrt(fnp.var(x, axis=-1)),
        "sqrt(mean(x*x))": lambda x: fnp.sqrt(fnp.mean(x * x, axis=-1)),
    }


@pytest.mark.parametrize("name", sorted(_nonneg_programs()))
def test_a_nonnegative_quantity_has_no_negative_lower_end(name):
    f = _nonneg_programs()[name]
    x = np.array([[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, -2.0, 1e-40]], F32)
    iv = fpx.interval(f)(x)
    assert not any(e.kind == "domain" for e in iv.events), iv.events
    assert np.all(iv.lo >= 0) and np.all(np.isfinite(iv.lo))
    assert iv.contains(f(x)).all()


def test_sign_keeping_is_sound_on_tiny_and_signed_operands():
    # products and sums of subnormal-range float32 values of both signs (exact 0, ±0,
    # underflowing products): the bound holds NumPy's results and never excludes 0's side
    g = np.random.default_rng(0)
    s = float(np.finfo(F32).smallest_subnormal)
    a = (g.integers(-6, 7, 4000) * s).astype(F32)
    b = (g.choice([-1.0, 1.0, 0.0, 0.5, 1e-30, -1e-30, 3.0], 4000)).astype(F32)
    with np.errstate(under="ignore"):
        for f in (lambda a, b: a * b, lambda a, b: a + b, lambda a, b: a - b,
                  lambda a, b: a / F32(8), lambda a, b: (a * b) / F32(3)):
            y = f(a, b)
            iv = fpx.interval(f)(a, b)
            assert iv.contains(y).all()
            # the exact values too (float64 holds these products and sums exactly)
            assert iv.contains(f(a.astype(np.float64), b.astype(np.float64))).all()


def test_an_underflowing_product_keeps_its_exact_value_inside():
    # x·y of float64 values whose product underflows to ±0: the bound holds 0 (the program's
    # value) and the exact nonzero product on its side of 0
    from fractions import Fraction
    x = np.array([1e-160, -1e-160, 1e-160, 5e-324, -5e-324], np.float64)
    y = np.array([1e-160, 1e-160, -1e-160, 0.5, 3.0], np.float64)
    for f in (lambda x, y: x * y, lambda x, y: x / (1 / y)):
        iv = fpx.interval(f)(x, y)
        assert iv.contains(f(x, y)).all()
        for i in range(x.size):
            e = Fraction(float(x[i])) * Fraction(float(y[i]))
            assert Fraction(float(iv.lo[i])) <= e <= Fraction(float(iv.hi[i])), i


def test_exact_operations_on_points_are_points():
    # (1 - m) * finfo.min of a 0/1 mask: each op on points is exact in float64 and gives the
    # program's value, so the bound is that value (it overflowed to -inf); an inexact one
    # (0.1 + 0.2) keeps its rounding's width, and float64 programs their TwoSum test
    mn = np.finfo(F32).min
    m = np.array([0.0, 1.0, 1.0, 0.0], F32)
    f = lambda m: (F32(1.0) - m) * mn               # noqa: E731
    iv = fpx.interval(f)(m)
    y = f(m)
    assert np.array_equal(iv.lo, y) and np.array_equal(iv.hi, y)
    a, b = np.array([0.1, 3.0], F32), np.array([0.2, 4.0], F32)
    iv = fpx.interval(lambda a, b: a + b)(a, b)
    assert iv.lo[0] < iv.hi[0] and iv.lo[1] == iv.hi[1] == 7.0 and iv.contains(a + b).all()
    x = np.array([0.1, 2.0 ** 60, 1.0]), np.array([0.2, 1.0, 2.0 ** -60])
    iv = fpx.interval(lambda a, b: a + b)(*x)
    assert iv.lo[0] < iv.hi[0] and iv.lo[1] < iv.hi[1] and iv.lo[2] < iv.hi[2]
    assert iv.contains(x[0] + x[1]).all()
