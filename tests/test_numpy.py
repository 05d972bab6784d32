"""``fpx.numpy`` against NumPy, bit for bit.

For every public function of the shim, over float64/float32/float16/bfloat16 where NumPy
supports the dtype:

(a) eager ``fpx.numpy.f(x)`` has the same dtype, shape and *bit pattern* (NaN positions and
    signed zeros included) as ``numpy.f(x)``;
(b) a function written with plain NumPy, run under ``fpx.trace``, gives the same bits as the
    eager NumPy run; so does the same function written with ``fpx.numpy``;
(c) composites: the decomposition (``fpx.trace(f, inline=True)``) gives the same bits as
    NumPy for mean/var/std/square/reciprocal/clip/trunc and close results for
    einsum/tensordot/dot/vecdot/logsumexp.
"""
from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fpx
import fpx.numpy as fnp
from fpx.core import Tracer

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning")]

BF16 = np.dtype(ml_dtypes.bfloat16)
F8E4 = np.dtype(ml_dtypes.float8_e4m3fn)
F8E5 = np.dtype(ml_dtypes.float8_e5m2)
DTYPES = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), BF16]
DT_IDS = ["f64", "f32", "f16", "bf16"]

HSET = settings(max_examples=20, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


# =============================================================================================
# Helpers
# =============================================================================================
def _raw(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8).reshape(a.size, a.dtype.itemsize)


def assert_bits(actual, expected, what: str = "", *, nan_bits: bool = True):
    """Same dtype, same shape, same bits (NaN positions/payloads and signed zeros included).
    ``nan_bits=False``: NaNs must sit at the same positions, their sign/payload may differ."""
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)), f"{what}: expected a sequence, got {type(actual)}"
        assert len(actual) == len(expected), f"{what}: {len(actual)} != {len(expected)} outputs"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_bits(a, e, f"{what}[{i}]", nan_bits=nan_bits)
        return
    assert not isinstance(actual, Tracer), f"{what}: a tracer escaped: {actual!r}"
    a, e = np.asarray(actual), np.asarray(expected)
    assert a.dtype == e.dtype, f"{what}: dtype {a.dtype} != expected {e.dtype}"
    assert a.shape == e.shape, f"{what}: shape {a.shape} != expected {e.shape}"
    if a.tobytes() != e.tobytes():
        differ = (_raw(a) != _raw(e)).any(axis=1)
        if not nan_bits and (a.dtype.kind == "f" or a.dtype in (BF16, F8E4, F8E5)):
            differ &= ~(np.isnan(a) & np.isnan(e)).reshape(-1)
            if not differ.any():
                return
        bad = np.flatnonzero(differ)
        fa, fe = a.reshape(-1), e.reshape(-1)
        ex = ", ".join(f"[{i}] {fa[i]!r} vs {fe[i]!r}" for i in bad[:6])
        raise AssertionError(f"{what}: {len(bad)} of {a.size} elements differ in bits: {ex}")


def assert_close(actual, expected, *, scale, k: int, what: str = ""):
    """|actual - expected| <= c * k * eps * scale (scale: the same contraction on |x|)."""
    a, e = np.asarray(actual), np.asarray(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    eps = float(ml_dtypes.finfo(e.dtype).eps) if e.dtype.kind in "fV" else 0.0
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    tol = 4.0 * (k + 2) * eps * np.asarray(scale, np.float64) + 1e-300
    both_nan = np.isnan(a64) & np.isnan(e64)
    same = (a64 == e64) | both_nan
    ok = same | (np.abs(a64 - e64) <= tol)
    assert ok.all(), f"{what}: not close: {a64[~ok][:5]} vs {e64[~ok][:5]} (tol {np.broadcast_to(tol, ok.shape)[~ok][:5]})"


def numpy_or_skip(f, *args, **kwargs):
    """NumPy's own result; skip the case where NumPy does not support it (e.g. bf16 einsum)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return f(*args, **kwargs)
    except (TypeError, ValueError, np.exceptions.DTypePromotionError) as e:
        pytest.skip(f"NumPy itself does not support this case: {type(e).__name__}: {e}")


def check(np_f, fnp_f, *args, inline: str | None = "bits", trace_np: bool = True,
          close_scale=None, close_k: int = 1):
    """(a) eager, (b) traced plain-NumPy and traced fpx.numpy, (c) decomposition."""
    expected = numpy_or_skip(np_f, *args)
    assert_bits(fnp_f(*args), expected, "eager fpx.numpy")
    if trace_np:
        rec = fpx.trace(np_f)(*args)
        assert_bits(rec.outputs, expected, "trace(plain numpy)")
    rec = fpx.trace(fnp_f)(*args)
    assert_bits(rec.outputs, expected, "trace(fpx.numpy)")
    if inline is not None:
        out = fpx.trace(fnp_f, inline=True)(*args).outputs
        if inline == "values":
            # same dtype and values; +0 and -0 count as equal (no transform tells them apart)
            exp_arr, out_arr = np.asarray(expected), np.asarray(out)
            assert out_arr.dtype == exp_arr.dtype, "decomposition dtype"
            assert np.array_equal(out_arr.astype(np.float64), exp_arr.astype(np.float64),
                                  equal_nan=True), "decomposition values"
        elif inline == "bits":
            # ml_dtypes' bfloat16 kernels pick NaN signs their own way (square(-nan) = +nan
            # but -nan * -nan = -nan): NaN positions must agree, NaN sign bits may not.
            first = expected[0] if isinstance(expected, (list, tuple)) else expected
            ml = np.asarray(first).dtype in (BF16, F8E4, F8E5)
            assert_bits(out, expected, "trace(inline=True) decomposition", nan_bits=not ml)
        else:
            assert np.asarray(out).dtype == np.asarray(expected).dtype, \
                f"decomposition dtype {np.asarray(out).dtype} != {np.asarray(expected).dtype}"
            assert_close(out, expected, scale=close_scale, k=close_k, what="decomposition")
    return expected


def specials(dtype) -> np.ndarray:
    """NaN (both signs), infinities, signed zeros, subnormals, extremes and ordinary values."""
    fi = ml_dtypes.finfo(dtype)
    v = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0,
         float(fi.smallest_subnormal), -float(fi.smallest_subnormal),
         3 * float(fi.smallest_subnormal), float(fi.smallest_normal), -float(fi.smallest_normal),
         float(fi.max), -float(fi.max), 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, 0.1, -7.25,
         100.0, 1e4, -1e-3, 20.5, -88.5, 700.0, -745.0, 1e30, 1e-30, 1e300, 3.0e-310]
    x = np.array(v, np.float64)
    x[1] = np.copysign(np.nan, -1.0)
    with np.errstate(all="ignore"):
        return x.astype(dtype)


def randn(shape, dtype, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale).astype(dtype)


@st.composite
def arrays(draw, dtype, shape=None, *, min_dims=0, max_dims=3, min_side=0, max_side=5,
           finite=False):
    """Random arrays of ``dtype``: mostly moderate values, plus hypothesis' special floats."""
    dtype = np.dtype(dtype)
    if shape is None:
        shape = draw(hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side,
                                      max_side=max_side))
    width = 64 if dtype == np.float64 else 32 if dtype != np.float16 else 16
    wild = st.floats(width=width, allow_nan=not finite, allow_infinity=not finite)
    tame = st.floats(-8.0, 8.0, width=width)
    x = draw(hnp.arrays(np.float64, shape, elements=st.one_of(tame, wild)))
    with np.errstate(all="ignore"):
        return x.astype(dtype)


# =============================================================================================
# Elementwise: unary
# =============================================================================================
UNARY = ["negative", "abs", "absolute", "positive", "sqrt", "square", "reciprocal", "exp",
         "expm1", "exp2", "log", "log1p", "log2", "sin", "cos", "tan", "tanh", "sinh", "cosh",
         "arctan", "sign", "floor", "ceil", "rint", "trunc", "isnan", "isinf", "isfinite",
         "logical_not"]
COMPOSITE_UNARY = {"square", "reciprocal", "trunc"}


def _unary_fns(name):
    npf, fnf = getattr(np, name), getattr(fnp, name)
    return (lambda x: npf(x)), (lambda x: fnf(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", UNARY)
def test_unary_specials(name, dtype):
    x = specials(dtype)
    npf, fnf = _unary_fns(name)
    check(npf, fnf, x, inline="values")
    check(npf, fnf, x[:30].reshape(5, 6)[:, ::-2])   # 2-D, non-contiguous


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", UNARY)
@HSET
@given(data=st.data())
def test_unary_random(name, dtype, data):
    x = data.draw(arrays(dtype))
    check(*_unary_fns(name), x)


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("x", [np.zeros((0,), np.float32), np.zeros((3, 0), np.float64),
                               np.array(-0.0, np.float32), np.float64(2.5), np.float16(-1.5),
                               np.arange(-3, 4)], ids=["e0", "e30", "0d", "f64scalar",
                                                       "f16scalar", "int"])
def test_unary_edge_shapes_and_scalars(name, x):
    if name == "reciprocal" and x.dtype.kind == "i":
        pytest.skip("NumPy's integer reciprocal is C integer division (not a float op)")
    check(*_unary_fns(name), x)


@pytest.mark.parametrize("name", ["exp", "sqrt", "tanh", "negative", "floor", "square"])
def test_unary_python_scalar(name):
    assert_bits(getattr(fnp, name)(1.75), getattr(np, name)(1.75))
    assert_bits(getattr(fnp, name)(3), getattr(np, name)(3))


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_erf(dtype):
    x = np.concatenate([specials(dtype), randn(200, dtype, 3, 2.0)])
    y = fnp.erf(x)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_bits(fpx.trace(lambda x: fnp.erf(x))(x).outputs, y, "trace(erf)")
    ref = np.array([math.erf(v) for v in x.astype(np.float64)])
    if dtype == np.float64:  # libm erf: within 1 ulp of math.erf (also libm erf here: exact)
        assert_bits(y, ref)
    else:
        ulp = np.spacing(np.abs(ref).astype(dtype)).astype(np.float64)
        fin = np.isfinite(ref)
        assert np.all(np.abs(y.astype(np.float64)[fin] - ref[fin]) <= 2 * ulp[fin])
        assert_bits(np.isnan(y), np.isnan(ref))
    if dtype in (np.float16, BF16):  # evaluated in float32, rounded back once
        assert_bits(y, fnp.erf(x.astype(np.float32)).astype(dtype))


# =============================================================================================
# Elementwise: binary
# =============================================================================================
BINARY = ["add", "subtract", "multiply", "divide", "true_divide", "power", "arctan2", "maximum",
          "minimum", "less", "less_equal", "greater", "greater_equal", "equal", "not_equal",
          "logical_and", "logical_or", "logical_xor", "floor_divide", "remainder"]


def _binary_fns(name):
    npf, fnf = getattr(np, name), getattr(fnp, name)
    return (lambda x, y: npf(x, y)), (lambda x, y: fnf(x, y))


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", BINARY)
def test_binary_specials(name, dtype):
    s = specials(dtype)
    check(*_binary_fns(name), s[:, None], s[None, :])      # every pair, by broadcasting


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", BINARY)
@HSET
@given(data=st.data())
def test_binary_random(name, dtype, data):
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4))
    x = data.draw(arrays(dtype, shapes.input_shapes[0]))
    y = data.draw(arrays(dtype, shapes.input_shapes[1]))
    check(*_binary_fns(name), x, y)


@pytest.mark.parametrize("name", BINARY)
def test_binary_edge_shapes_and_scalars(name):
    npf, fnf = _binary_fns(name)
    for x, y in [(np.zeros((0,), np.float32), np.zeros((0,), np.float32)),
                 (np.zeros((3, 0)), np.zeros((0,))), (np.array(2.5, np.float16), np.zeros((3, 0),
                                                                                        np.float16)),
                 (np.array(-0.0, np.float32), np.array(3.0, np.float32)),
                 (np.float64(1.5), np.float64(-2.0)), (np.float32(0.5), np.ones(3, np.float16)),
                 (np.arange(-2, 3), np.arange(1, 6)), (np.arange(-2, 3), np.float32(1.5))]:
        check(npf, fnf, x, y)
    assert_bits(getattr(fnp, name)(1.5, 2.0), getattr(np, name)(1.5, 2.0))


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("scalar", [2.0, -0.0, 0.5, 3, -1, np.inf, np.nan], ids=repr)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["f32", "f16", "bf16"])
def test_binary_python_scalar_weak_promotion(name, scalar, dtype):
    """NEP 50: a Python scalar operand is weak -- float32 op 2.0 stays float32 -- either side."""
    x = specials(dtype)
    npf, fnf = getattr(np, name), getattr(fnp, name)
    check(lambda x: npf(x, scalar), lambda x: fnf(x, scalar), x)
    check(lambda x: npf(scalar, x), lambda x: fnf(scalar, x), x)


@pytest.mark.parametrize("name", ["add", "multiply", "power", "maximum", "divide", "less"])
@pytest.mark.parametrize("other", [np.float64(2.0), np.float32(0.5), np.array(2.0),
                                   np.array([2.0], np.float16), np.int64(3), np.int8(2)],
                         ids=["np.f64", "np.f32", "0d.f64", "1d.f16", "np.i64", "np.i8"])
def test_binary_strong_scalar_promotion(name, other):
    """NumPy scalars and 0-d arrays are *strong* under NEP 50 (float32 * float64(2) -> f64)."""
    x = randn((3, 4), np.float32, 1)
    npf, fnf = getattr(np, name), getattr(fnp, name)
    check(lambda x: npf(x, other), lambda x: fnf(x, other), x)
    check(lambda x: npf(other, x), lambda x: fnf(other, x), x)


@pytest.mark.parametrize("exponent", [2, 2.0, 0.5, -1, -1.0, 1, 0, 3, -0.5, np.float64(2.0),
                                      np.float32(0.5), np.float16(2.0)], ids=repr)
@pytest.mark.parametrize("dtype", DTYPES + [np.dtype(np.int64)], ids=DT_IDS + ["i64"])
def test_power_scalar_exponents(exponent, dtype):
    x = specials(dtype) if dtype.kind != "i" else np.arange(-3, 5)
    if dtype.kind == "i" and isinstance(exponent, (int, np.integer)) and exponent < 0:
        pytest.skip("NumPy forbids negative integer powers of integers")
    check(lambda x: np.power(x, exponent), lambda x: fnp.power(x, exponent), x)
    # ``**`` is ndarray.__pow__ (NumPy's fast_scalar_power: x**2 -> square, x**-1 ->
    # reciprocal, x**0.5 -> sqrt), which differs from numpy.power for float16 and bfloat16
    check(lambda x: x ** exponent, lambda x: x ** exponent, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_mixed_float_dtypes(dtype):
    x = specials(dtype)
    for other in DTYPES:
        y = specials(other)[::-1]
        check(lambda a, b: np.add(a, b), lambda a, b: fnp.add(a, b), x, y)
        check(lambda a, b: a * b, lambda a, b: fnp.multiply(a, b), x, y)


@pytest.mark.parametrize("dtype", DTYPES + [np.dtype(np.int32)], ids=DT_IDS + ["i32"])
def test_where(dtype):
    x = specials(dtype) if dtype.kind == "f" or dtype == BF16 else np.arange(34, dtype=dtype)
    y = x[::-1]
    c = np.arange(x.size) % 3 == 0
    check(lambda c, x, y: np.where(c, x, y), lambda c, x, y: fnp.where(c, x, y), c, x, y)
    check(lambda x, y: np.where(x > y, x, y), lambda x, y: fnp.where(x > y, x, y), x, y)
    check(lambda x: np.where(x > 0, x, 0.0), lambda x: fnp.where(x > 0, x, 0.0), x)  # weak
    check(lambda x: np.where(np.isnan(x), -0.0, x), lambda x: fnp.where(fnp.isnan(x), -0.0, x), x)
    check(lambda c, x: np.where(c[:, None], x[None, :4], x[:5, None]),
          lambda c, x: fnp.where(c[:, None], x[None, :4], x[:5, None]), c[:5], x)
    with pytest.raises(TypeError, match="three arguments"):
        fnp.where(c)


# ---- clip ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("bounds", [(0.0, 1.0), (-1.0, 1.0), (-0.0, 6.0), (-6.0, 0.0),
                                    (-6.0, -0.0), (0.0, 0.0), (2.0, -2.0), (np.nan, 1.0),
                                    (-1.0, np.nan), (None, 0.5), (-0.5, None), (None, -0.0),
                                    (0.0, None), (-np.inf, np.inf)], ids=repr)
def test_clip_scalar_bounds(dtype, bounds):
    lo, hi = bounds
    x = specials(dtype)

    def npf(x):
        return np.clip(x, lo, hi)

    def fnf(x):
        return fnp.clip(x, lo, hi)
    check(npf, fnf, x, inline="values")
    check(npf, fnf, x.reshape(2, 17)[:, ::2], inline="values")
    check(lambda x: x.clip(lo, hi), fnf, x, inline="values")
    check(lambda x: np.clip(x, min=lo, max=hi), lambda x: fnp.clip(x, min=lo, max=hi), x, inline="values")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_clip_array_bounds(dtype):
    x = specials(dtype)
    lo = np.where(np.arange(x.size) % 2 == 0, -1.0, -0.0).astype(dtype)
    hi = np.where(np.arange(x.size) % 3 == 0, 0.0, 2.0).astype(dtype)
    check(lambda x, lo, hi: np.clip(x, lo, hi), lambda x, lo, hi: fnp.clip(x, lo, hi), x, lo, hi, inline="values")
    check(lambda x, lo: np.clip(x, lo, None), lambda x, lo: fnp.clip(x, lo, None), x, lo, inline="values")
    check(lambda x, hi: np.clip(x, None, hi), lambda x, hi: fnp.clip(x, None, hi), x, hi, inline="values")
    # bounds broadcast along rows (one bound per row)
    x2 = x[:30].reshape(5, 6)
    lo2, hi2 = lo[:5, None], hi[:5, None] + 1
    check(lambda x, lo, hi: np.clip(x, lo, hi), lambda x, lo, hi: fnp.clip(x, lo, hi), x2, lo2,
          hi2)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@HSET
@given(data=st.data())
def test_clip_random(dtype, data):
    x = data.draw(arrays(dtype))
    lo = data.draw(st.sampled_from([-1.0, -0.0, 0.0, 0.5, np.nan, -np.inf]))
    hi = data.draw(st.sampled_from([1.0, 0.0, -0.0, 6.0, np.inf]))
    check(lambda x: np.clip(x, lo, hi), lambda x: fnp.clip(x, lo, hi), x, inline="values")


def test_clip_integers_and_bools():
    for x, lo, hi in [(np.arange(-3, 4), 1, 2), (np.arange(5, dtype=np.uint8), 1, 3),
                      (np.array([True, False]), False, True), (np.arange(6), -1.5, 2.5)]:
        check(lambda x: np.clip(x, lo, hi), lambda x: fnp.clip(x, lo, hi), x, inline="values")


def test_clip_without_bounds_is_identity():
    x = specials(np.float32)
    check(lambda x: np.clip(x, None, None), lambda x: fnp.clip(x, None, None), x, inline="values")


# ---- round -------------------------------------------------------------------------------------
@pytest.mark.parametrize("decimals", [0, 1, 2, 3, -1, -2])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_round_decimals(dtype, decimals):
    x = np.concatenate([specials(dtype), randn(64, dtype, 5, 300.0),
                        np.array([0.5, 1.5, 2.5, -0.5, 0.125, 0.375, 1.005, 2.675, 15, 25, 150,
                                  250, -250], np.float64).astype(dtype)])
    check(lambda x: np.round(x, decimals), lambda x: fnp.round(x, decimals), x)
    check(lambda x: np.around(x, decimals), lambda x: fnp.around(x, decimals), x)
    check(lambda x: x.round(decimals), lambda x: fnp.round(x, decimals), x)


@pytest.mark.parametrize("decimals", [0, 2, -1, -2])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8], ids=["i64", "i32", "u8"])
def test_round_integers(dtype, decimals):
    x = np.array([0, 5, 15, 25, 35, 149, 150, 151, 250, 254], dtype)
    if np.dtype(dtype).kind == "i":
        x = np.concatenate([x, -x])
    check(lambda x: np.round(x, decimals), lambda x: fnp.round(x, decimals), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@HSET
@given(data=st.data())
def test_round_random(dtype, data):
    x = data.draw(arrays(dtype))
    d = data.draw(st.integers(-3, 4))
    check(lambda x: np.round(x, d), lambda x: fnp.round(x, d), x)


# =============================================================================================
# Reductions
# =============================================================================================
AXES = [None, 0, 1, -1, 2, (0, 2), (-1, 0), (0, 1, 2), ()]
REDUCTIONS = ["sum", "mean", "prod", "max", "min", "var", "std"]
COMPOSITE_RED = {"mean", "var", "std"}


def _red_fns(name, axis, keepdims, **kw):
    npf, fnf = getattr(np, name), getattr(fnp, name)
    return ((lambda x: npf(x, axis=axis, keepdims=keepdims, **kw)),
            (lambda x: fnf(x, axis=axis, keepdims=keepdims, **kw)))


@pytest.mark.parametrize("keepdims", [False, True], ids=["", "keep"])
@pytest.mark.parametrize("axis", AXES, ids=repr)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions(name, dtype, axis, keepdims):
    x = randn((3, 4, 5), dtype, seed=7, scale=3.0)
    check(*_red_fns(name, axis, keepdims), x)
    # method spelling under trace
    check(lambda x: getattr(x, name)(axis=axis, keepdims=keepdims),
          lambda x: getattr(fnp, name)(x, axis=axis, keepdims=keepdims), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_specials(name, dtype):
    s = specials(dtype)
    x = np.stack([s, s[::-1], np.roll(s, 5), np.abs(s)])       # rows with inf-inf, NaN, ...
    for axis in (None, 0, 1):
        check(*_red_fns(name, axis, False), x)
    finite = s[np.isfinite(s.astype(np.float64))]
    check(*_red_fns(name, None, False), finite)                 # overflow / cancellation
    check(*_red_fns(name, None, True), finite[finite.astype(np.float64) != 0])


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", REDUCTIONS)
@HSET
@given(data=st.data())
def test_reductions_random(name, dtype, data):
    x = data.draw(arrays(dtype, min_dims=1, min_side=1))
    axis = data.draw(st.one_of(st.none(), st.integers(-x.ndim, x.ndim - 1),
                               st.lists(st.integers(0, x.ndim - 1), unique=True).map(tuple)))
    keepdims = data.draw(st.booleans())
    check(*_red_fns(name, axis, keepdims), x)


@pytest.mark.parametrize("ddof", [0, 1, 2, 5])
@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_var_std_ddof(name, dtype, ddof):
    x = randn((4, 5), dtype, seed=2, scale=10.0) + np.asarray(1000, dtype)
    for axis in (None, 0, 1, (0, 1)):
        for keepdims in (False, True):
            check(*_red_fns(name, axis, keepdims, ddof=ddof), x)
    np_corr = numpy_or_skip(getattr(np, name), x, axis=0, correction=ddof)
    assert_bits(getattr(fnp, name)(x, axis=0, correction=ddof), np_corr)


@pytest.mark.parametrize("name", ["sum", "mean", "var", "std", "prod", "cumsum"])
@pytest.mark.parametrize("acc", [np.float64, np.float32], ids=["acc64", "acc32"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int32, np.bool_],
                         ids=["f32", "f16", "bf16", "i32", "bool"])
def test_reduction_dtype_argument(name, dtype, acc):
    x = randn((4, 6), np.float64, 4, 20.0).astype(dtype)
    npf, fnf = getattr(np, name), getattr(fnp, name)
    check(lambda x: npf(x, axis=1, dtype=acc), lambda x: fnf(x, axis=1, dtype=acc), x)
    check(lambda x: npf(x), lambda x: fnf(x), x)                 # default accumulator


@pytest.mark.parametrize("name", ["sum", "mean", "var", "std", "prod"])
@pytest.mark.parametrize("x", [np.zeros((0,), np.float32), np.zeros((3, 0), np.float64),
                               np.zeros((0, 4), np.float16)], ids=["e0", "e30", "e04"])
def test_reductions_empty(name, x):
    for axis in (None, 0, -1):
        check(*_red_fns(name, axis, False), x)


@pytest.mark.parametrize("name", ["max", "min", "argmax", "argmin"])
def test_reductions_empty_raise_like_numpy(name):
    x = np.zeros((0, 3), np.float32)
    with pytest.raises(ValueError):
        getattr(np, name)(x, axis=0)
    with pytest.raises(ValueError):
        getattr(fnp, name)(x, axis=0)
    with pytest.raises(ValueError):
        fpx.trace(lambda x: getattr(np, name)(x, axis=0))(x)


@pytest.mark.parametrize("name", REDUCTIONS + ["argmax", "argmin", "cumsum"])
def test_reductions_0d(name):
    for x in (np.array(2.5, np.float32), np.float64(-3.0)):
        check(lambda x: getattr(np, name)(x), lambda x: getattr(fnp, name)(x), x)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, 2], ids=repr)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin(name, dtype, axis, keepdims):
    x = randn((3, 4, 5), dtype, seed=9)
    x.reshape(-1)[[3, 17, 40]] = x.reshape(-1)[[4, 18, 41]]  # ties: first index wins
    check(lambda x: getattr(np, name)(x, axis=axis, keepdims=keepdims),
          lambda x: getattr(fnp, name)(x, axis=axis, keepdims=keepdims), x)
    check(lambda x: getattr(x, name)(axis=axis, keepdims=keepdims),
          lambda x: getattr(fnp, name)(x, axis=axis, keepdims=keepdims), x)
    s = specials(dtype).reshape(2, 17)                       # NaN wins, -0/+0 ties
    check(lambda x: getattr(np, name)(x, axis=1), lambda x: getattr(fnp, name)(x, axis=1), s)


@pytest.mark.parametrize("axis", [None, 0, 1, -1], ids=repr)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_cumsum(dtype, axis):
    x = randn((4, 7), dtype, seed=11, scale=5.0)
    check(lambda x: np.cumsum(x, axis=axis), lambda x: fnp.cumsum(x, axis=axis), x)
    check(lambda x: x.cumsum(axis=axis), lambda x: fnp.cumsum(x, axis=axis), x)
    check(lambda x: np.cumsum(x, axis=axis), lambda x: fnp.cumsum(x, axis=axis),
          specials(dtype).reshape(2, 17))
    check(lambda x: np.add.accumulate(x, axis=0), lambda x: fnp.cumsum(x, axis=0), x)


def test_ufunc_reduce_methods():
    x = randn((3, 4), np.float32, 12)
    check(lambda x: np.add.reduce(x, axis=1), lambda x: fnp.sum(x, axis=1), x)
    check(lambda x: np.maximum.reduce(x, axis=0, keepdims=True),
          lambda x: fnp.max(x, axis=0, keepdims=True), x)
    check(lambda x: np.multiply.reduce(x), lambda x: fnp.prod(x, axis=0), x)
    check(lambda x: np.minimum.reduce(x, axis=None), lambda x: fnp.min(x), x)


def test_any_all():
    x = np.array([[0.0, -0.0, np.nan], [1.0, 0.0, 2.0]], np.float32)
    for f in ("any", "all"):
        for axis in (None, 0, 1):
            check(lambda x: getattr(np, f)(x, axis=axis), lambda x: getattr(fnp, f)(x, axis=axis),
                  x, inline=None)
        check(lambda x: getattr(np, f)(x), lambda x: getattr(fnp, f)(x), np.zeros((0, 3)),
              inline=None)


# ---- logsumexp --------------------------------------------------------------------------------
def _lse_ref(x, axis, keepdims):
    x = np.asarray(x, np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    r = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return r if keepdims else np.squeeze(r, axis=axis)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2)], ids=repr)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_logsumexp(dtype, axis, keepdims):
    x = randn((3, 4, 5), dtype, seed=13, scale=4.0)
    y = fnp.logsumexp(x, axis=axis, keepdims=keepdims)
    ref = _lse_ref(x, axis, keepdims)
    assert np.asarray(y).dtype == dtype
    assert_close(y, ref.astype(dtype) if dtype != np.float64 else ref, scale=np.abs(ref) + 1,
                 k=8, what="logsumexp vs float64 reference")
    for rec in (fpx.trace(lambda x: fnp.logsumexp(x, axis=axis, keepdims=keepdims))(x),
                fpx.trace(lambda x: fnp.logsumexp(x, axis=axis, keepdims=keepdims),
                          inline=True)(x)):
        assert_bits(rec.outputs, y, "traced logsumexp")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_logsumexp_specials(dtype):
    x = np.array([[-np.inf, -np.inf, -np.inf], [np.inf, 1.0, 2.0], [np.nan, 0.0, 1.0],
                  [-np.inf, np.inf, 0.0], [1e4, 1e4, -1e4], [-1e4, -1e4, -1e4]],
                 np.float64).astype(dtype)
    y = np.asarray(fnp.logsumexp(x, axis=1)).astype(np.float64)
    ref = _lse_ref(x, 1, False)
    assert_bits(np.isnan(y), np.isnan(ref))
    assert_bits(np.isinf(y) * np.sign(y), np.isinf(ref) * np.sign(ref))
    fin = np.isfinite(ref)
    assert np.allclose(y[fin], ref[fin], rtol=1e-2)
    assert_bits(fpx.trace(lambda x: fnp.logsumexp(x, axis=1), inline=True)(x).outputs,
                fnp.logsumexp(x, axis=1))


# =============================================================================================
# Linear algebra
# =============================================================================================
MATMUL_SHAPES = [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
                 ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
                 ((0, 4), (4, 3)), ((3, 0), (0, 2)), ((1, 1), (1, 1))]


def _abs64(*xs):
    return [np.abs(np.asarray(x, np.float64)) for x in xs]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(dtype, shapes):
    a, b = randn(shapes[0], dtype, 1), randn(shapes[1], dtype, 2)
    check(lambda a, b: np.matmul(a, b), lambda a, b: fnp.matmul(a, b), a, b)
    check(lambda a, b: a @ b, lambda a, b: fnp.matmul(a, b), a, b)
    check(lambda a: a @ b, lambda a: fnp.matmul(a, b), a)          # constant right operand
    check(lambda b: a @ b, lambda b: fnp.matmul(a, b), b)          # ndarray @ tracer


def test_matmul_scalar_operand_raises():
    with pytest.raises(ValueError):
        fnp.matmul(np.float32(2), np.ones((2, 2), np.float32))
    with pytest.raises(ValueError):
        fpx.trace(lambda x: x @ np.float64(2))(np.ones((2, 2)))


def test_matmul_specials():
    s = specials(np.float64)[:32].reshape(4, 8)
    check(lambda a, b: a @ b, lambda a, b: fnp.matmul(a, b), s, s.T)


DOT_SHAPES = [((3, 4), (4, 5)), ((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 2)),
              ((2, 3, 4), (4, 5)), ((2, 3, 4), (5, 4, 6)), ((3,), (2, 3, 4)), ((), (3, 4)),
              ((3, 4), ())]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shapes", DOT_SHAPES, ids=str)
def test_dot(dtype, shapes):
    a, b = randn(shapes[0], dtype, 3), randn(shapes[1], dtype, 4)
    k = a.shape[-1] if a.ndim else 1
    check(lambda a, b: np.dot(a, b), lambda a, b: fnp.dot(a, b), a, b, inline="close",
          close_scale=np.dot(*_abs64(a, b)), close_k=k)
    if a.ndim:
        check(lambda a, b: a.dot(b), lambda a, b: fnp.dot(a, b), a, b, inline=None)


VECDOT_CASES = [((3, 4), (3, 4), -1), ((3, 4), (3, 4), 0), ((2, 3, 4), (4,), -1),
                ((5,), (5,), -1), ((2, 1, 6), (3, 6), -1), ((4, 3), (4, 1), 0)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", VECDOT_CASES, ids=str)
def test_vecdot(dtype, case):
    sa, sb, axis = case
    a, b = randn(sa, dtype, 5), randn(sb, dtype, 6)
    k = sa[axis]
    check(lambda a, b: np.vecdot(a, b, axis=axis), lambda a, b: fnp.vecdot(a, b, axis=axis), a, b,
          inline="close", close_scale=np.vecdot(*_abs64(a, b), axis=axis), close_k=k)


TENSORDOT_CASES = [((3, 4, 5), (4, 5, 2), 2), ((3, 4), (4, 5), 1), ((3, 4), (5, 2), 0),
                   ((3, 4, 5), (5, 4, 2), ([1, 2], [1, 0])), ((3, 4, 5), (2, 5), (2, 1)),
                   ((3, 4, 5), (5, 3), ([-1, 0], [0, -1])), ((2, 3), (2, 3), 2),
                   ((4,), (4,), 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", TENSORDOT_CASES, ids=str)
def test_tensordot(dtype, case):
    sa, sb, axes = case
    a, b = randn(sa, dtype, 7), randn(sb, dtype, 8)
    scale = np.tensordot(*_abs64(a, b), axes=axes)
    k = max(1, int(np.prod(sa)) * int(np.prod(sb)) // max(1, scale.size) // max(1, scale.size))
    k = max(k, 30)
    check(lambda a, b: np.tensordot(a, b, axes=axes), lambda a, b: fnp.tensordot(a, b, axes=axes),
          a, b, inline="close", close_scale=scale, close_k=k)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_outer_inner(dtype):
    a, b = specials(dtype), randn(7, dtype, 9)
    check(lambda a, b: np.outer(a, b), lambda a, b: fnp.outer(a, b), a, b)
    check(lambda a, b: np.outer(a, b), lambda a, b: fnp.outer(a, b), a.reshape(2, 17), b)
    a2, b2 = randn((3, 4), dtype, 10), randn((2, 4), dtype, 11)
    check(lambda a, b: np.inner(a, b), lambda a, b: fnp.inner(a, b), a2, b2, inline="close",
          close_scale=np.inner(*_abs64(a2, b2)), close_k=4)


EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("bhqk,bhkd->bhqd", [(2, 3, 4, 5), (2, 3, 5, 8)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i->", [(6,), (6,)]),
    ("ij,j->i", [(3, 4), (4,)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
    ("bi,i->b", [(3, 4), (4,)]),
    ("ij->i", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("bnd,de->bne", [(2, 3, 4), (4, 5)]),
    ("ii", [(3, 3)]),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", EINSUM_CASES, ids=lambda c: c[0] + str(c[1]))
def test_einsum(dtype, case):
    subs, shapes = case
    ops = [randn(s, dtype, 20 + i) for i, s in enumerate(shapes)]
    scale = np.einsum(subs, *_abs64(*ops))
    k = max(int(np.prod(s)) for s in shapes)
    check(lambda *o: np.einsum(subs, *o), lambda *o: fnp.einsum(subs, *o), *ops, inline="close",
          close_scale=scale, close_k=k)


@pytest.mark.parametrize("subs", ["ij,jk->ik", "bhqd,bhkd->bhqk", "i,i->"])
def test_einsum_specials(subs):
    s = specials(np.float64)
    shapes = {"ij,jk->ik": [(4, 8), (8, 4)], "bhqd,bhkd->bhqk": [(1, 2, 2, 8), (1, 2, 2, 8)],
              "i,i->": [(32,), (32,)]}[subs]
    ops = [s[:int(np.prod(sh))].reshape(sh) for sh in shapes]
    check(lambda *o: np.einsum(subs, *o), lambda *o: fnp.einsum(subs, *o), *ops, inline=None)


def test_einsum_with_constant_operand():
    a, w = randn((2, 3, 4), np.float32, 1), randn((4, 5), np.float32, 2)
    check(lambda a: np.einsum("bij,jk->bik", a, w), lambda a: fnp.einsum("bij,jk->bik", a, w), a,
          inline="close", close_scale=np.einsum("bij,jk->bik", *_abs64(a, w)), close_k=4)


# =============================================================================================
# Movement (exact: always bitwise)
# =============================================================================================
MOVEMENT = [
    ("reshape -1", lambda m, x: m.reshape(x, (-1,))),
    ("reshape 2", lambda m, x: m.reshape(x, (4, -1, 3))),
    ("reshape kw", lambda m, x: m.reshape(x, shape=(6, 4))),
    ("ravel", lambda m, x: m.ravel(x)),
    ("transpose", lambda m, x: m.transpose(x)),
    ("transpose axes", lambda m, x: m.transpose(x, (1, 2, 0))),
    ("transpose neg", lambda m, x: m.transpose(x, (-1, 0, 1))),
    ("permute_dims", lambda m, x: m.permute_dims(x, (2, 0, 1))),
    ("matrix_transpose", lambda m, x: m.matrix_transpose(x)),
    ("swapaxes", lambda m, x: m.swapaxes(x, 0, 2)),
    ("swapaxes neg", lambda m, x: m.swapaxes(x, -1, 1)),
    ("moveaxis", lambda m, x: m.moveaxis(x, 0, -1)),
    ("moveaxis multi", lambda m, x: m.moveaxis(x, [0, 1], [2, 0])),
    ("expand_dims", lambda m, x: m.expand_dims(x, 1)),
    ("expand_dims neg", lambda m, x: m.expand_dims(x, -1)),
    ("expand_dims tuple", lambda m, x: m.expand_dims(x, (0, 3))),
    ("squeeze", lambda m, x: m.squeeze(m.expand_dims(x, (0, 2)))),
    ("squeeze axis", lambda m, x: m.squeeze(m.expand_dims(x, (0, 2)), axis=2)),
    ("broadcast_to", lambda m, x: m.broadcast_to(x[:, :1], (2, 3, 4))),
    ("broadcast_to new", lambda m, x: m.broadcast_to(x, (2, 2, 3, 4))),
    ("broadcast_arrays", lambda m, x: m.broadcast_arrays(x, x[:1, :, :1])),
    ("concatenate", lambda m, x: m.concatenate([x, x[:, :1]], axis=1)),
    ("concatenate neg", lambda m, x: m.concatenate([x, -x], axis=-1)),
    ("concatenate None", lambda m, x: m.concatenate([x, x[0]], axis=None)),
    ("stack", lambda m, x: m.stack([x, -x, x * 2])),
    ("stack axis", lambda m, x: m.stack([x, x], axis=-1)),
    ("split", lambda m, x: m.split(x, 3, axis=1)),
    ("split idx", lambda m, x: m.split(x, [1, 3], axis=-1)),
    ("take", lambda m, x: m.take(x, np.array([2, 0, 0, 1]), axis=1)),
    ("take neg idx", lambda m, x: m.take(x, np.array([-1, 0]), axis=-1)),
    ("take flat", lambda m, x: m.take(x, np.array([[5, 0], [23, 7]]))),
    ("take_along_axis", lambda m, x: m.take_along_axis(x, np.argsort(np.arange(24).reshape(2, 3, 4) % 5, axis=2), axis=2)),
    ("take_along_axis 0", lambda m, x: m.take_along_axis(x, np.zeros((1, 3, 4), np.int64), axis=0)),
    ("take_along_axis None", lambda m, x: m.take_along_axis(x, np.array([3, 1]), axis=None)),
    ("flip", lambda m, x: m.flip(x)),
    ("flip axis", lambda m, x: m.flip(x, axis=1)),
    ("flip axes", lambda m, x: m.flip(x, axis=(0, -1))),
    ("pad", lambda m, x: m.pad(x, 1)),
    ("pad widths", lambda m, x: m.pad(x, ((0, 0), (1, 2), (2, 0)))),
    ("pad value", lambda m, x: m.pad(x, ((1, 0), (0, 0), (0, 1)), constant_values=-0.0)),
    ("pad nan", lambda m, x: m.pad(x, 2, constant_values=np.nan)),
    ("tile", lambda m, x: m.tile(x, 2)),
    ("tile tuple", lambda m, x: m.tile(x, (2, 1, 3))),
    ("tile more dims", lambda m, x: m.tile(x, (2, 1, 1, 2))),
    ("repeat", lambda m, x: m.repeat(x, 2)),
    ("repeat axis", lambda m, x: m.repeat(x, 3, axis=1)),
    ("repeat counts", lambda m, x: m.repeat(x, [1, 0, 2], axis=1)),
    ("getitem", lambda m, x: x[1, ::-1, 1:3]),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", MOVEMENT, ids=lambda c: c[0])
def test_movement(case, dtype):
    _, f = case
    x = specials(dtype)[:24].reshape(2, 3, 4)
    check(lambda x: f(np, x), lambda x: f(fnp, x), x)


def test_movement_methods_under_trace():
    x = randn((2, 3, 4), np.float32, 3)
    cases = [lambda x: x.reshape(6, 4), lambda x: x.reshape((4, 6)), lambda x: x.reshape(-1),
             lambda x: x.T, lambda x: x.mT, lambda x: x.transpose(1, 0, 2),
             lambda x: x.transpose((2, 1, 0)), lambda x: x.swapaxes(0, 1),
             lambda x: x[:, :1].squeeze(1), lambda x: x.flatten(), lambda x: x.ravel()]
    for f in cases:
        expected = f(x)
        assert_bits(fpx.trace(f)(x).outputs, expected, "method under trace")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_movement_empty_and_0d(dtype):
    e = np.zeros((3, 0), dtype)
    for f in [lambda m, x: m.reshape(x, (0, 3)), lambda m, x: m.transpose(x),
              lambda m, x: m.concatenate([x, x], axis=1), lambda m, x: m.stack([x, x]),
              lambda m, x: m.pad(x, 1), lambda m, x: m.flip(x), lambda m, x: m.tile(x, 2),
              lambda m, x: m.expand_dims(x, 0), lambda m, x: m.broadcast_to(x, (2, 3, 0))]:
        check(lambda x: f(np, x), lambda x: f(fnp, x), e)
    z = np.array(1.5, dtype)
    for f in [lambda m, x: m.reshape(x, (1, 1)), lambda m, x: m.expand_dims(x, 0),
              lambda m, x: m.broadcast_to(x, (3,)), lambda m, x: m.stack([x, x]),
              lambda m, x: m.transpose(x)]:
        check(lambda x: f(np, x), lambda x: f(fnp, x), z)


def test_movement_errors_like_numpy():
    x = np.ones((2, 3))
    for f in [lambda m, x: m.reshape(x, (4, -1)), lambda m, x: m.squeeze(x, axis=0),
              lambda m, x: m.broadcast_to(x, (3, 3)), lambda m, x: m.split(x, 2, axis=1),
              lambda m, x: m.concatenate([x, x.T]), lambda m, x: m.stack([x, x.T])]:
        with pytest.raises(ValueError):
            f(np, x)
        with pytest.raises(ValueError):
            f(fnp, x)
        with pytest.raises(ValueError):
            fpx.trace(lambda x: f(np, x))(x)


# =============================================================================================
# astype / formats
# =============================================================================================
def _tf32_oracle(x) -> np.ndarray:
    """Nearest tf32 value (10 fraction bits, float32's exponent range), ties to even, as float32.
    Computed from the float64 value directly (so float64 inputs are rounded once)."""
    x = np.asarray(x).astype(np.float64)
    b = x.view(np.uint64)
    drop = np.uint64(42)
    half = (np.uint64(1) << (drop - np.uint64(1))) - np.uint64(1)
    lsb = (b >> drop) & np.uint64(1)
    r = ((b + half + lsb) & ~((np.uint64(1) << drop) - np.uint64(1))).view(np.float64)
    q = 2.0 ** -136                                          # tf32 subnormal spacing
    sub = np.abs(x) < 2.0 ** -126
    r = np.where(sub, np.round(x / q) * q, r)
    r = np.where(np.isfinite(x), r, x)
    with np.errstate(over="ignore"):
        out = r.astype(np.float32)                           # exact, or overflow to inf
    return out


ASTYPE_TARGETS = [np.float64, np.float32, np.float16, BF16, F8E4, F8E5]


@pytest.mark.parametrize("target", ASTYPE_TARGETS, ids=["f64", "f32", "f16", "bf16", "e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES + [np.dtype(np.int32)], ids=DT_IDS + ["i32"])
def test_astype(dtype, target):
    x = (np.concatenate([specials(dtype), randn(50, dtype, 3, 100.0)])
         if dtype.kind != "i" else np.arange(-300, 300, 7, dtype=dtype))
    check(lambda x: x.astype(target), lambda x: fnp.astype(x, target), x)
    check(lambda x: x.astype(target), lambda x: x.astype(target), x)


@pytest.mark.parametrize("name,target", [("float32", np.float32), ("bf16", BF16),
                                         ("bfloat16", BF16), ("fp16", np.float16),
                                         ("float8_e4m3fn", F8E4), ("e5m2", F8E5),
                                         (fpx.formats.bfloat16, BF16), ("int8", np.int8),
                                         (bool, np.bool_)])
def test_astype_by_name(name, target):
    x = randn(20, np.float32, 4, 10.0)
    assert_bits(fnp.astype(x, name), x.astype(target))
    assert_bits(fpx.trace(lambda x: x.astype(name))(x).outputs, x.astype(target))


@pytest.mark.parametrize("dtype", DTYPES + [np.dtype(np.int64)], ids=DT_IDS + ["i64"])
@pytest.mark.parametrize("spelling", ["tf32", fpx.formats.tf32, fnp.tf32], ids=["str", "fmt", "fnp"])
def test_astype_tf32(dtype, spelling):
    if dtype.kind == "i":
        x = np.array([0, 1, -1, 2049, 4097, 4099, 2**24 + 1, -(2**30) - 3, 12345678], dtype)
    else:
        fi = ml_dtypes.finfo(dtype)
        x = np.concatenate([specials(dtype), randn(500, dtype, 5, 1000.0),
                            np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-11 + 2.0**-40,
                                      2.0**-130 * 1.00048828125, 3.4e38, float(fi.max)],
                                     np.float64).astype(dtype)])
    y = fnp.astype(x, spelling)
    ref = _tf32_oracle(x)
    assert y.dtype == np.float32
    assert_bits(np.isnan(y), np.isnan(ref))
    nn = ~np.isnan(ref)
    assert_bits(y[nn], ref[nn], "astype tf32 vs oracle")
    assert_bits(fpx.trace(lambda x: x.astype(spelling))(x).outputs, y, "trace astype tf32")


def test_astype_tf32_from_float64_rounds_once():
    """1 + 2^-11 + 2^-40 is above the tf32 midpoint 1 + 2^-11: it rounds up to 1 + 2^-10.
    Going through float32 first would land on the midpoint and round to even (1.0)."""
    x = np.array([1 + 2.0**-11 + 2.0**-40, -(1 + 2.0**-11 + 2.0**-40)])
    assert_bits(fnp.astype(x, "tf32"), np.array([1 + 2.0**-10, -(1 + 2.0**-10)], np.float32))


def test_astype_same_dtype_is_identity_and_unknown_format_raises():
    x = randn(4, np.float32, 1)
    assert fnp.astype(x, np.float32) is x
    with pytest.raises(ValueError, match="unknown format"):
        fnp.astype(x, "float13")
    with pytest.raises(ValueError):
        fpx.trace(lambda x: x.astype("bf17"))(x)
    with pytest.raises(TypeError):
        fnp.astype(x, np.complex64)


# =============================================================================================
# Creation
# =============================================================================================
CREATION = [
    ("zeros", lambda m: m.zeros((2, 3))), ("zeros f32", lambda m: m.zeros(4, dtype=np.float32)),
    ("zeros bf16", lambda m: m.zeros((2,), dtype=BF16)), ("ones", lambda m: m.ones((3,))),
    ("ones f16", lambda m: m.ones((2, 2), dtype=np.float16)),
    ("ones int", lambda m: m.ones(3, dtype=np.int32)),
    ("full", lambda m: m.full((2, 3), 1.5)), ("full f32", lambda m: m.full(3, -0.0, np.float32)),
    ("full nan", lambda m: m.full((2,), np.nan, dtype=np.float16)),
    ("full int", lambda m: m.full((2,), 7)), ("full bool", lambda m: m.full(2, True)),
    ("arange", lambda m: m.arange(5)), ("arange 2", lambda m: m.arange(2, 9)),
    ("arange step", lambda m: m.arange(1.0, 2.0, 0.1)),
    ("arange neg", lambda m: m.arange(5, -3, -2)),
    ("arange dtype", lambda m: m.arange(6, dtype=np.float32)),
    ("arange f", lambda m: m.arange(3.5)),
    ("linspace", lambda m: m.linspace(0, 1, 7)),
    ("linspace ep", lambda m: m.linspace(-1, 1, 8, endpoint=False)),
    ("linspace f32", lambda m: m.linspace(0, 10, 5, dtype=np.float32)),
    ("linspace default", lambda m: m.linspace(2.0, 3.0)),
    ("eye", lambda m: m.eye(3)), ("eye rect", lambda m: m.eye(3, 5, k=1)),
    ("eye k", lambda m: m.eye(4, k=-2, dtype=np.float32)),
    ("asarray list", lambda m: m.asarray([1.0, 2.0, -0.0])),
    ("asarray nested", lambda m: m.asarray([[1, 2], [3, 4]])),
    ("asarray dtype", lambda m: m.asarray([1.0, 2.5], dtype=np.float16)),
    ("asarray bf16", lambda m: m.asarray([1.0, 1.00390625, 3.0], dtype=BF16)),
    ("array", lambda m: m.array([0.1, 0.2], dtype=np.float32)),
    ("asarray scalar", lambda m: m.asarray(2.5)),
]


@pytest.mark.parametrize("case", CREATION, ids=lambda c: c[0])
def test_creation(case):
    _, f = case
    assert_bits(f(fnp), f(np))


def test_empty():
    for shape, dt in [((2, 3), np.float64), (4, np.float32), ((0,), np.float16), ((2,), BF16)]:
        e = fnp.empty(shape, dtype=dt)
        ref = np.empty(shape, dtype=dt)
        assert e.shape == ref.shape and e.dtype == ref.dtype


def test_asarray_tf32():
    x = fnp.asarray([1 + 2.0**-11 + 2.0**-40, 3.0], dtype="tf32")
    assert_bits(x, np.array([1 + 2.0**-10, 3.0], np.float32))


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("name", ["zeros_like", "ones_like", "full_like", "empty_like"])
def test_like_functions(name, dtype):
    x = randn((2, 3), dtype, 1)
    args = (2.5,) if name == "full_like" else ()
    npf, fnf = getattr(np, name), getattr(fnp, name)

    def same(a, b):
        if name == "empty_like":
            assert np.asarray(a).shape == b.shape and np.asarray(a).dtype == b.dtype
        else:
            assert_bits(a, b)
    same(fnf(x, *args), npf(x, *args))
    same(fnf(x, *args, dtype=np.float32), npf(x, *args, dtype=np.float32))
    same(fnf(x, *args, shape=(4,)), npf(x, *args, shape=(4,)))
    # on a tracer: a constant array of the tracer's shape/dtype, through both spellings
    for g in (lambda t: npf(t, *args), lambda t: fnf(t, *args)):
        same(fpx.trace(g)(x).outputs, npf(x, *args))
    rec = fpx.trace(lambda t: t + npf(t, *args))(x)
    if name != "empty_like":
        assert_bits(rec.outputs, x + npf(x, *args))


def test_creation_like_tracer_and_in_programs():
    x = randn((3,), np.float32, 2)

    def f(t):
        return t * fnp.ones((3,), dtype=np.float32, like=t) + fnp.arange(3, dtype=np.float32,
                                                                         like=t)
    assert_bits(fpx.trace(f)(x).outputs, x * np.ones(3, np.float32) + np.arange(3, dtype=np.float32))
    assert_bits(fpx.trace(lambda t: t @ fnp.eye(3, dtype=np.float32))(x).outputs,
                x @ np.eye(3, dtype=np.float32))
    assert_bits(fpx.trace(lambda t: fnp.asarray(t, dtype=np.float16))(x).outputs,
                x.astype(np.float16))
    assert_bits(fpx.trace(lambda t: fnp.asarray([t[0], t[2]]))(x).outputs,
                np.asarray([x[0], x[2]]))


# =============================================================================================
# Whole programs in plain NumPy: traced == eager, bit for bit
# =============================================================================================
def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _layer_norm(x, g, b):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.var(x, axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _attention(q, k, v):
    s = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    return np.einsum("bhqk,bhkd->bhqd", _softmax(s), v)


def _mlp(params, x):
    h = x
    for w, b in params:
        h = np.maximum(h @ w + b, 0.0)
    return _softmax(h), np.argmax(h, axis=-1)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_plain_numpy_programs_trace_bitwise(dtype):
    rng = np.random.default_rng(0)

    def r(*s):
        return rng.standard_normal(s).astype(dtype)
    x, g, b = r(4, 8), r(8), r(8)
    assert_bits(fpx.trace(_softmax)(x).outputs, _softmax(x))
    assert_bits(fpx.trace(_layer_norm)(x, g, b).outputs, _layer_norm(x, g, b))
    assert_bits(fpx.trace(_gelu)(x).outputs, _gelu(x))
    params = [(r(8, 16), r(16)), (r(16, 4), r(4))]
    assert_bits(fpx.trace(_mlp)(params, x).outputs, _mlp(params, x))
    if dtype != BF16:   # NumPy's einsum has no bfloat16 loop
        q, k, v = r(2, 2, 3, 4), r(2, 2, 5, 4), r(2, 2, 5, 4)
        assert_bits(fpx.trace(_attention)(q, k, v).outputs, _attention(q, k, v))
        assert_bits(fpx.trace(fpx.trace(_attention))(q, k, v).outputs.outputs,
                    _attention(q, k, v))


def test_weak_promotion_under_trace():
    """NEP 50 through tracers: Python scalars are weak, NumPy scalars/0-d arrays strong."""
    cases = [
        (np.float32, lambda t: t * 2.0, np.float32), (np.float32, lambda t: 2.0 * t, np.float32),
        (np.float32, lambda t: t + 1, np.float32), (np.float16, lambda t: t / 3.0, np.float16),
        # ml_dtypes has no weak-scalar promotion: bf16 * 2.0 is float32 in NumPy, and in fpx
        (BF16, lambda t: t * 2.0, np.float32), (BF16, lambda t: 1.0 - t, np.float32),
        (BF16, lambda t: t * 2, BF16),
        (np.float32, lambda t: t * np.float64(2.0), np.float64),
        (np.float32, lambda t: t * np.array(2.0), np.float64),
        (np.float16, lambda t: t + np.float32(1), np.float32),
        (np.int32, lambda t: t + 1, np.int32), (np.int32, lambda t: t * 1.5, np.float64),
        (np.bool_, lambda t: t + 1, np.int64), (np.float32, lambda t: t ** 2, np.float32),
        (np.float32, lambda t: t ** np.float64(2), np.float64),
        (np.float32, lambda t: np.maximum(t, 0.0), np.float32),
        (np.float32, lambda t: np.where(t > 0, t, 0.0), np.float32),
        (np.float16, lambda t: np.clip(t, -1.0, 1.0), np.float16),
    ]
    for dt, f, out in cases:
        x = np.arange(1, 4).astype(dt)
        expected = f(x)
        rec = fpx.trace(f)(x)
        assert rec.outputs.dtype == np.dtype(out), (dt, out, rec.outputs.dtype)
        assert_bits(rec.outputs, expected)
