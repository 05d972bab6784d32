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

stochastic_mod = __import__("fpx.transforms.stochastic", fromlist=["sample_keys"])
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


# ---------------------------------------------------------------------------------------------
# W15: API edges
# ---------------------------------------------------------------------------------------------
def test_w15_formats_round_accepts_an_int_seed():
    x = np.linspace(1, 2, 1001)
    a = F.round(x, "f32", "sr", 42)
    assert np.array_equal(a, F.round(x, "f32", "sr", 42))
    assert np.array_equal(a, F.round(x, "f32", "sr", np.random.default_rng(42)))
    with pytest.raises(TypeError, match="`rng`"):
        F.round(x, "f32", "sr", "42")
    with pytest.raises(ValueError, match="`rng`"):
        F.round(x, "f32", "sr", -1)


def test_w15_formats_round_applies_a_residual_that_is_not_normalized():
    assert F.round([1.0], "f32", residual=[0.5])[0] == 1.5
    # 1 + 2^-24 + 2^-60 is above float32's tie at 1 + 2^-24 (its float64 sum is the tie)
    r = 2.0 ** -24 + 2.0 ** -60
    assert F.round([1.0], "f32", "rn", residual=[r])[0] == np.float32(1 + 2.0 ** -23)
    assert F.round([1.0], "f32", "rd", residual=[r])[0] == 1.0
    assert F.round([1.0], "f32", "ru", residual=[-r])[0] == np.float32(1 - 2.0 ** -24)
    # sr: P(up) = (r - 0)/2^-23 on [1, 1 + 2^-23], from the exact value
    n = 20000
    up = F.round(np.ones(n), "f32", "sr", 7, residual=np.full(n, r)) > 1
    assert _within(int(up.sum()), n, float(Fraction(r) / Fraction(2.0 ** -23)))


def test_w15_assert_close_takes_a_non_tuple_args_as_one_argument():
    v = fpx.testing.assert_close(np.full(3, 3.0), np.full(3, 3.0), fn=lambda t: t * 3,
                                 args=np.ones(3))
    assert v.kind == "roundoff"
    v = fpx.testing.assert_close(np.full(3, 3.0), np.full(3, 3.0), fn=lambda t: t * 3,
                                 args=(np.ones(3),))
    assert v.kind == "roundoff"


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_w15_bad_seed_error_names_the_argument(seed):
    with pytest.raises(ValueError, match="seed"):
        fpx.stochastic(lambda t: t * 1.1, "sr", seed=seed)(np.ones(2))


# ---------------------------------------------------------------------------------------------
# W10: classify with an infinite or NaN reference where the bound is finite
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ref, word", [(np.inf, "infinite"), (-np.inf, "infinite"),
                                       (np.nan, "NaN")])
def test_w10_nonfinite_reference_outside_a_finite_bound_is_a_bug(ref, word):
    x = np.ones(2, np.float32)
    v = fpx.classify(lambda t: t * np.float32(3), np.array([ref, 3.0]), x)
    assert v.kind == "bug"
    assert v.n_outside == 1 and v.n_undecided == 0
    assert any(word in r for r in v.reasons), v.reasons
    assert word in v.report()


def test_w10_nonfinite_reference_where_the_target_overflows_is_not_a_bug():
    x = np.full(1, 3e38, np.float32)
    with np.errstate(over="ignore"):
        v = fpx.classify(lambda t: t * np.float32(3), np.array([np.inf]), x)
    assert v.kind == "roundoff"


# ---------------------------------------------------------------------------------------------
# W13: classify of two leaf torch modules compares the module as one layer
# ---------------------------------------------------------------------------------------------
def test_w13_classify_leaf_modules():
    torch = pytest.importorskip("torch")
    import copy
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    v = fpx.classify(lin, copy.deepcopy(lin).double(), x)
    assert v.kind == "roundoff"
    assert [name for name, _ in v.layers] == ["Linear"]
    wrong = copy.deepcopy(lin).double()
    with torch.no_grad():
        wrong.weight[0, 0] += 0.01
    v = fpx.classify(lin, wrong, x)
    assert v.kind == "bug" and v.first_bug == "Linear"


# ---------------------------------------------------------------------------------------------
# W14: the torch adapter from several threads; W17: torch errors that are clear and quiet
# ---------------------------------------------------------------------------------------------
def _np_program(t):
    return np.tanh(t * np.float32(1.5) + np.float32(0.25)) @ np.ones((16, 3), np.float32)


def test_w14_transforms_on_fresh_torch_modules_from_four_threads():
    torch = pytest.importorskip("torch")
    import copy
    import logging
    import sys
    import threading
    import warnings

    torch.manual_seed(1)
    fresh = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.GELU())
    single = copy.deepcopy(fresh)                    # another module: its own first export
    x = torch.randn(4, 16)
    xn = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)

    def work(m):
        iv = fpx.interval(m)(x)
        return dict(lo=iv.lo, hi=iv.hi, st=fpx.stochastic(m, "sr", samples=3, seed=5)(x).numpy(),
                    nlo=fpx.interval(_np_program)(xn).lo,
                    nst=fpx.stochastic(_np_program, "sr", samples=3, seed=5)(xn))

    out, before = {}, (sys.stdout, sys.stderr, list(warnings.filters))
    levels = {n: logging.getLogger(n).level for n in ("torch._export", "torch._dynamo",
                                                        "torch._subclasses.fake_tensor")}
    barrier = threading.Barrier(4)

    def worker(i):
        barrier.wait()
        try:
            out[i] = work(fresh)
        except Exception as e:                       # pragma: no cover - reported below
            out[i] = e
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (sys.stdout, sys.stderr) == before[:2]
    assert list(warnings.filters) == before[2]
    assert {n: logging.getLogger(n).level for n in levels} == levels
    ref = work(single)
    for i in range(4):
        assert not isinstance(out[i], Exception), out[i]
        for k in ref:
            assert np.array_equal(out[i][k], ref[k]), (i, k)


def test_w17_wrong_input_shape_to_a_torch_module_is_quiet(capfd):
    torch = pytest.importorskip("torch")
    m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.GELU())
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        fpx.interval(m)(torch.randn(4, 15))
    err = capfd.readouterr().err
    assert "fake_tensor" not in err and "Traceback" not in err, err


def test_w17_mixed_torch_and_numpy_arguments():
    torch = pytest.importorskip("torch")
    import copy
    torch.manual_seed(3)
    xt, xn = torch.ones(2, 3), np.ones((2, 3), np.float32)
    # a NumPy array among torch inputs is converted ...
    r = fpx.interval(lambda a, b: a * b + 1)(xt, xn)
    assert np.all(r.lo <= 2) and np.all(r.hi >= 2)
    seq = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.GELU())
    assert fpx.classify(seq, copy.deepcopy(seq).double(), xn).kind == "roundoff"
    # ... so a NumPy-only call on it inside the program gets an error that says so
    with pytest.raises(TypeError, match="torch tensor"):
        fpx.interval(lambda a, b: a + torch.from_numpy(b))(xt, xn)


# ---------------------------------------------------------------------------------------------
# W11/W12: nesting fpx.stochastic with other transforms says it is not supported
# ---------------------------------------------------------------------------------------------
def _inner_stochastic(u):
    return fpx.stochastic(lambda v: v * 2, "sr", samples=2)(u)


@pytest.mark.parametrize("outer", ["trace", "interval", "stochastic"])
def test_w12_stochastic_inside_another_transform(outer):
    x = np.ones(2, np.float32)
    T = fpx.stochastic if outer == "stochastic" else getattr(fpx, outer)
    with pytest.raises(stochastic_mod.NestingError,
                       match=f"nesting fpx.stochastic inside fpx.{outer} is not supported"):
        T(_inner_stochastic)(x)


def test_w12_another_transforms_value_handed_to_stochastic():
    x = np.ones(2, np.float32)
    escaped = []
    fpx.trace(lambda t: escaped.append(t) or t)(x)
    with pytest.raises(stochastic_mod.NestingError, match="inside fpx.trace"):
        fpx.stochastic(lambda v: v * 2, "sr", samples=2)(escaped[0])


def test_w11_interval_inside_stochastic():
    x = np.ones(4, np.float32)
    with pytest.raises(stochastic_mod.NestingError,
                       match="nesting fpx.interval inside fpx.stochastic is not supported"):
        fpx.stochastic(lambda t: fpx.interval(lambda u: u * 2)(t).hi, "sr", samples=3)(x)


def test_w11_trace_inside_stochastic_still_works():
    x = np.ones(4, np.float32)
    rec = fpx.stochastic(lambda t: fpx.trace(lambda u: u * 2)(t), "sr", samples=3)(x)
    assert "mul" in str(rec)


# ---------------------------------------------------------------------------------------------
# The interval transform: W2-W7, W9, W15 (around), W16
# ---------------------------------------------------------------------------------------------
def _vec(n=16):
    return np.linspace(-1, 1, n).astype(np.float32)


@pytest.mark.parametrize("f, shapes", [
    (lambda a, b: a @ b, ((16,), (16,))),
    (lambda a, b: a @ b, ((5, 16), (16,))),
    (lambda a, b: a @ b, ((16,), (16, 5))),
    (lambda a, b: np.dot(a, b), ((16,), (16,))),
])
def test_w2_interval_matmul_with_one_dimensional_operands(f, shapes):
    """Wide interval @ interval with 1-D operands: a bound holding the exact product at the
    values and at the boxes' ends (it raised AxisError)."""
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    ins = [fpx.Interval.around(x, rel=1e-3) for x in xs]
    iv = fpx.interval(f)(*ins)
    assert iv.shape == np.shape(f(*xs))
    assert iv.contains(f(*(x.astype(np.float64) for x in xs))).all()
    for t in (0.0, 1.0):
        ends = [i.lo + t * (i.hi - i.lo) for i in ins]
        assert iv.contains(f(*ends)).all()


def test_w3_unstable_scalar_where_broadcast_then_moved():
    """An unstable 0-d ``where`` broadcast into an array and reshaped: a defined bound whose
    unstable mask has the result's shape (it raised from NumPy)."""
    f = lambda a: (a + np.where(a[0] * np.float32(3) > a[1] * np.float32(3),   # noqa: E731
                                np.float32(1), np.float32(2))).reshape(2, 1)
    v = np.float32(1.1)          # 1.1·3 is inexact: the comparison of two equal products may go
    iv = fpx.interval(f)(np.full(2, v))                          # either way
    assert iv.shape == (2, 1) and iv.unstable.shape == (2, 1) and iv.unstable.all()
    for c in (1.0, 2.0):
        assert iv.contains(np.full((2, 1), float(v) + c)).all()


def test_w4_w5_values_leaving_the_program_are_events_not_constants():
    """float() of a traced sum and a traced value stored into an ndarray: classify says
    inconclusive, naming the conversion and the line (it said bug on pure round-off)."""
    a = np.array([1e8, 1.0, -1e8], np.float32)
    f4 = lambda t: t * np.float32(float(np.sum(t)))       # noqa: E731
    v = fpx.classify(f4, a.astype(np.float64) * 1.0, a)
    assert v.kind == "inconclusive"
    assert any(e.kind == "escaped-value" and "float()" in e.what for e in v.events)

    def f5(t):
        b = np.zeros(3, np.float32)
        b[1] = t[0] * 3
        return b
    x5 = np.array([0.1, 0.7, 3.0], np.float32)
    ref = np.array([0.0, float(np.float64(np.float32(0.1))) * 3, 0.0])
    v = fpx.classify(f5, ref, x5)
    assert v.kind == "inconclusive" and any(e.kind == "escaped-value" for e in v.events)
    # a point (no round-off yet) converts without an event
    _, (iv,) = fpx.transforms.interval.run_interval(lambda t: (t * float(t[0]),), (x5,), {})
    assert iv.contains(x5.astype(np.float64) * float(x5[0])).all()


def test_w6_a_python_literal_rounded_into_the_arrays_format_is_bounded():
    """``(t - 0.485) / 0.229`` on float32 against its float64 run: round-off (the literals'
    own rounding to float32 is part of the bound), and both runs inside it."""
    xn = np.array([0.485, 0.4851, 0.48, 0.5], np.float32)
    norm = lambda t: (t - 0.485) / 0.229                   # noqa: E731
    assert fpx.classify(norm, norm(xn.astype(np.float64)), xn).kind == "roundoff"
    iv = fpx.interval(norm)(xn)
    assert iv.contains(norm(xn)).all() and iv.contains(norm(xn.astype(np.float64))).all()
    # an exact literal (2.0) adds no width of its own
    a, b = fpx.interval(lambda t: t * 2.0)(xn), fpx.interval(lambda t: t * np.float32(2))(xn)
    assert np.array_equal(a.lo, b.lo) and np.array_equal(a.hi, b.hi)


def test_w7_python_float_inputs_are_traced():
    """``fpx.interval(np.exp)(1.0)`` holds e (it was the zero-width float64 exp(1))."""
    iv = fpx.interval(np.exp)(1.0)
    assert iv.lo < math.e < iv.hi and iv.value == np.exp(1.0)
    # weak as NumPy takes it: with a float32 array the result stays float32
    out = fpx.interval(lambda a, s: a * s)(np.ones(3, np.float32), 0.1)
    assert out.value.dtype == np.float32 and out.contains(np.full(3, 0.1)).all()


def test_w9_no_nan_bound_where_the_result_is_defined():
    """sqrt(t - t) is sqrt(0) (x - x is exactly 0 for finite x); where(isnan(sqrt(t)), 0,
    sqrt(t)) at t = -1 takes the 0 (sqrt of a negative point is certainly NaN)."""
    iv = fpx.interval(lambda t: np.sqrt(t - t))(np.ones(1, np.float32))
    assert iv.contains(iv.value).all() and iv.lo[0] == 0.0
    g = lambda t: np.where(np.isnan(np.sqrt(t)), np.float32(0), np.sqrt(t))   # noqa: E731
    with np.errstate(invalid="ignore"):
        iv = fpx.interval(g)(np.array([-1.0, 4.0], np.float32))
    assert iv.contains(iv.value).all() and iv.lo[0] == iv.hi[0] == 0.0
    # inf - inf stays NaN: x - x is not 0 there
    with np.errstate(invalid="ignore"):
        iv = fpx.interval(lambda t: t - t)(np.array([np.inf, 1.0]))
    assert np.isnan(iv.lo[0]) and iv.lo[1] == iv.hi[1] == 0.0
    # an interval straddling sqrt's or log's domain edge where the program's value is defined:
    # the defined executions are bounded (the NaN ones are flagged unstable), no NaN end
    x = fpx.Interval.around(np.array([1.0000002, 1.0, 2.0], np.float32), radius=1e-7)
    for f in (np.sqrt, np.log):
        with np.errstate(divide="ignore"):
            iv = fpx.interval(lambda a: f(a - np.float32(1)))(x)
        assert not np.isnan(iv.lo).any() and not np.isnan(iv.hi).any()
        assert iv.contains(iv.value).all() and list(iv.unstable) == [False, True, False]
        assert iv.hi[1] < 1e-3 if f is np.sqrt else iv.hi[1] < -10


@pytest.mark.parametrize("kw", [dict(radius=np.nan), dict(radius=-1.0), dict(rel=np.nan),
                                dict(rel=-0.5)])
def test_w15_interval_around_refuses_nan_or_negative_radii(kw):
    name = next(iter(kw))
    with pytest.raises(ValueError, match=name):
        fpx.Interval.around(np.ones(3, np.float32), **kw)


def test_w16_repr_of_infinite_bounds_does_not_warn():
    import warnings
    iv = fpx.Interval(np.array([np.inf, -np.inf, 0.0]), np.array([np.inf, np.inf, 1.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = repr(iv)
    assert "non-finite" in text
