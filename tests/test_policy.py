"""Tests for fpx.policy: presets, overrides, Accuracy.bound, and soundness of "numpy" here.

The soundness tests measure the real error of NumPy's math on this machine and check it against
the "numpy" preset: float32 (>= 10^6 random inputs per function against the float64 function,
plus a subset against MPFR via gmpy2, on both the contiguous SIMD path and a strided path),
float64 (2*10^4 inputs per function against MPFR at 200 bits), float16 and bfloat16 (every
finite bit pattern), and erf through fpx.kernels.elementwise.erf (the kernel fpx runs).

Run ``python tests/test_policy.py`` to print the measured table used in docs/policy.md.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import zlib

import gmpy2
import ml_dtypes
import numpy as np
import pytest

from fpx import formats
from fpx import policy as P
from fpx.policy import (Accuracy, OpPrecision, Policy, PolicyLookupError, get_policy, kind_of,
                        ulp)

SEED = 20240611

# --------------------------------------------------------------------------------------------
# Functions under test: fpx primitive name -> NumPy implementation
# --------------------------------------------------------------------------------------------


from fpx.kernels.elementwise import erf  # noqa: E402  (the kernel fpx's erf primitive runs)


UNARY = {"exp": np.exp, "expm1": np.expm1, "exp2": np.exp2, "log": np.log,
         "log1p": np.log1p, "log2": np.log2, "sin": np.sin, "cos": np.cos, "tan": np.tan,
         "tanh": np.tanh, "sinh": np.sinh, "cosh": np.cosh, "atan": np.arctan, "erf": erf}
BINARY = {"atan2": np.arctan2, "pow": np.power}
MPFR = {"exp": gmpy2.exp, "expm1": gmpy2.expm1, "exp2": gmpy2.exp2, "log": gmpy2.log,
        "log1p": gmpy2.log1p, "log2": gmpy2.log2, "sin": gmpy2.sin, "cos": gmpy2.cos,
        "tan": gmpy2.tan, "tanh": gmpy2.tanh, "sinh": gmpy2.sinh, "cosh": gmpy2.cosh,
        "atan": gmpy2.atan, "erf": gmpy2.erf, "atan2": gmpy2.atan2,
        "pow": lambda a, b: a ** b}

# Relative error of the float64 reference used for float32: NumPy's float64 functions are within
# 3 ulp (test_float64_against_mpfr), i.e. < 2^-50 relative.
REF_REL = 2.0 ** -50


def _logu(rng, n, lo, hi, signed=True):
    v = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    return v * rng.choice([-1.0, 1.0], n) if signed else v


def _cat(*parts):
    return np.concatenate(parts)


def domain32(name, rng, n):
    """float32 test inputs: the function's sensible domain incl. large/small magnitudes."""
    h, q = n // 2, n // 4
    d = {
        "exp": lambda: _cat(rng.uniform(-103.9, 88.72, h), _logu(rng, h, 1e-30, 88.7)),
        "expm1": lambda: _cat(rng.uniform(-20, 88.72, h), _logu(rng, h, 1e-38, 88.0)),
        "exp2": lambda: _cat(rng.uniform(-149.5, 127.99, h), _logu(rng, h, 1e-38, 127.0)),
        "log": lambda: _cat(_logu(rng, h, 1e-45, 3e38, False), 1 + rng.uniform(-.2, .2, h)),
        "log2": lambda: _cat(_logu(rng, h, 1e-45, 3e38, False), 1 + rng.uniform(-.2, .2, h)),
        "log1p": lambda: _cat(_logu(rng, h, 1e-38, 3e38, False),
                              -_logu(rng, q, 1e-38, 0.999, False), rng.uniform(-1, 1, q)),
        "sin": lambda: _cat(rng.uniform(-10, 10, h), _logu(rng, q, 1e-30, 1e5),
                            _logu(rng, q, 1e5, 3e38)),
        "tanh": lambda: _cat(rng.uniform(-10, 10, h), _logu(rng, h, 1e-38, 20.0)),
        "sinh": lambda: _cat(rng.uniform(-89.4, 89.4, h), _logu(rng, h, 1e-38, 89.4)),
        "atan": lambda: _logu(rng, n, 1e-38, 3e38),
        "erf": lambda: _cat(rng.uniform(-6, 6, h), _logu(rng, h, 1e-38, 10.0)),
    }
    d["cos"] = d["tan"] = d["sin"]
    d["cosh"] = d["sinh"]
    return (d[name]().astype(np.float32),)


def domain32_binary(name, rng, n):
    """atan2: (y, x); pow: (base, exponent)."""
    if name == "atan2":
        h = n // 2
        a = _cat(_logu(rng, h, 1e-38, 3e38), rng.uniform(-1, 1, h))
        b = _cat(_logu(rng, h, 1e-38, 3e38), rng.uniform(-1, 1, h))
    else:  # pow: moderate; near 1 with huge exponents; bases over the whole range
        t = n // 3
        a = _cat(_logu(rng, t, 1e-3, 1e3, False), 1 + rng.uniform(-.01, .01, t),
                 _logu(rng, n - 2 * t, 1e-38, 3e38, False))
        b = _cat(rng.uniform(-12, 12, t), rng.uniform(-8000, 8000, t),
                 rng.uniform(-3, 3, n - 2 * t))
    return a.astype(np.float32), b.astype(np.float32)


def domain64(name, rng, n):
    h, q = n // 2, n // 4
    d = {
        "exp": lambda: _cat(rng.uniform(-745, 709.7, h), _logu(rng, h, 1e-300, 709.0)),
        "expm1": lambda: _cat(rng.uniform(-40, 709.7, h), _logu(rng, h, 1e-300, 709.0)),
        "exp2": lambda: _cat(rng.uniform(-1074, 1023.9, h), _logu(rng, h, 1e-300, 1023.0)),
        "log": lambda: _cat(_logu(rng, h, 1e-320, 1e308, False), 1 + rng.uniform(-.2, .2, h)),
        "log1p": lambda: _cat(_logu(rng, h, 1e-300, 1e308, False),
                              -_logu(rng, h, 1e-300, 0.9999, False)),
        "sin": lambda: _cat(rng.uniform(-10, 10, h), _logu(rng, q, 1e-300, 1e5),
                            _logu(rng, q, 1e5, 1e300)),
        "tanh": lambda: _cat(rng.uniform(-20, 20, h), _logu(rng, h, 1e-300, 20.0)),
        "sinh": lambda: _cat(rng.uniform(-710, 710, h), _logu(rng, h, 1e-300, 710.0)),
        "atan": lambda: _logu(rng, n, 1e-300, 1e300),
        "erf": lambda: _cat(rng.uniform(-6, 6, h), _logu(rng, h, 1e-300, 6.0)),
    }
    d["log2"] = d["log"]
    d["cos"] = d["tan"] = d["sin"]
    d["cosh"] = d["sinh"]
    return (d[name](),)


def domain64_binary(name, rng, n):
    h = n // 2
    if name == "atan2":
        return (_cat(_logu(rng, h, 1e-300, 1e300), rng.uniform(-1, 1, h)),
                _cat(_logu(rng, h, 1e-300, 1e300), rng.uniform(-1, 1, h)))
    return (_cat(_logu(rng, h, 1e-3, 1e3, False), 1 + rng.uniform(-1e-3, 1e-3, h)),
            _cat(rng.uniform(-100, 100, h), rng.uniform(-5e5, 5e5, h)))


def _key(name):
    return zlib.crc32(name.encode())


def _call(name, *xs):
    f = UNARY.get(name) or BINARY[name]
    with np.errstate(all="ignore"):
        return f(*xs)


# --------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------
def _measure_vs_ref(name, fmt, xs, y, ref, ref_rel):
    """(max ulps, ok-mask, err upper bound) of ``y`` against a reference within ``ref_rel``.

    ``err`` bounds |y - f| for the exact f; ulps are in units of the *smallest* ulp the exact
    value can have, so the measured number is an upper bound of the true ulp error.
    """
    f = formats.get(fmt)
    y = np.asarray(y).astype(np.float64)
    ok = np.isfinite(ref) & (np.abs(ref) <= f.max)
    assert np.all(np.isfinite(y[ok])), f"{name}/{fmt}: non-finite result for an in-range value"
    err = np.abs(y[ok] - ref[ok]) + ref_rel * np.abs(ref[ok])
    u = ulp(np.abs(ref[ok]) * (1 - ref_rel), f)
    return (err / u).max(), ok, err


def _check_sound(name, fmt, xs, y, ref, ref_rel, policy=P.NUMPY):
    acc = policy.accuracy(name, fmt)
    worst, ok, err = _measure_vs_ref(name, fmt, xs, y, ref, ref_rel)
    limit = acc.ulps if not callable(acc.ulps) else np.inf
    assert worst <= limit, f"{name}/{fmt}: measured {worst:.4f} ulp > policy {acc.ulps}"
    b = acc.bound(np.asarray(y).astype(np.float64)[ok], fmt, *[x[ok] for x in xs])
    bad = err > b
    assert not bad.any(), (f"{name}/{fmt}: error exceeds Accuracy.bound at "
                           f"{[x[ok][bad][:3] for x in xs]}")
    return worst


@functools.lru_cache(maxsize=4)  # ~20 MB per entry
def measure_float32(name, n=1_000_000, strided=False):
    rng = np.random.default_rng([SEED, _key(name), int(strided)])
    xs = (domain32 if name in UNARY else domain32_binary)(name, rng, n)
    if strided:  # non-contiguous operands take NumPy's other (libm / buffered) paths
        xs = tuple(np.repeat(x, 2)[::2] for x in xs)
    y = _call(name, *xs)
    ref = _call(name, *[x.astype(np.float64) for x in xs])
    return xs, y, ref


@functools.lru_cache(maxsize=None)
def all_float16_like(fmt):
    dt = formats.get(fmt).dtype
    x = np.arange(65536, dtype=np.uint16).view(dt)
    return x[np.isfinite(x.astype(np.float32))]


def _mp_ulps(name, xs, ys, fmt):
    """Exact errors against MPFR (200 bits): max ulps and per-element error upper bounds."""
    f = formats.get(fmt)
    g = MPFR[name]
    worst, errs, keep = 0.0, [], []
    with gmpy2.context(precision=200):
        big, tiny = gmpy2.mpfr(f.max), gmpy2.mpfr(f.smallest_subnormal)
        for i, (args, y) in enumerate(zip(zip(*[x.tolist() for x in xs]), ys.tolist())):
            ex = g(*[gmpy2.mpfr(a) for a in args])
            if not gmpy2.is_finite(ex) or abs(ex) > big:
                continue
            assert math.isfinite(y), f"{name}/{fmt}: non-finite result at {args}"
            e = abs(gmpy2.mpfr(y) - ex)
            expo = f.emin if ex == 0 or abs(ex) < tiny else max(gmpy2.get_exp(ex) - 1, f.emin)
            r = float(e / gmpy2.exp2(expo - f.p + 1))
            worst = max(worst, r)
            errs.append(float(e) * (1 + 2.0 ** -52))  # round the exact error up
            keep.append(i)
    return worst, np.array(errs), np.array(keep, dtype=np.int64)


@functools.lru_cache(maxsize=None)
def measure_float64(name, n=20_000):
    rng = np.random.default_rng([SEED, _key(name), 64])
    xs = (domain64 if name in UNARY else domain64_binary)(name, rng, n)
    y = np.asarray(_call(name, *xs), dtype=np.float64)
    return xs, y, _mp_ulps(name, xs, y, "float64")


@functools.lru_cache(maxsize=None)
def measure_narrow(name, fmt):
    """float16/bfloat16: every finite pattern (unary) or 2*10^5 random pairs (binary)."""
    dt = formats.get(fmt).dtype
    if name in UNARY:
        xs = (all_float16_like(fmt),)
    else:
        rng = np.random.default_rng([SEED, _key(name), 16])
        pool = all_float16_like(fmt)
        a = rng.choice(pool, 200_000)
        b = rng.choice(pool, 200_000)
        if name == "pow":
            a = np.abs(a)
            b = rng.choice(pool[np.abs(pool.astype(np.float32)) <= 16], 200_000)
        xs = (a, b)
    y = _call(name, *xs)
    assert y.dtype == dt
    ref = _call(name, *[x.astype(np.float64) for x in xs])
    return xs, y, ref


# --------------------------------------------------------------------------------------------
# Presets, names, overrides
# --------------------------------------------------------------------------------------------
ALL_FORMATS = ("float64", "float32", "tf32", "bfloat16", "float16", "float8_e4m3fn",
               "float8_e5m2")


@pytest.mark.parametrize("name", P.PRESETS)
def test_presets_construct_and_cover_every_primitive(name):
    pol = get_policy(name)
    assert isinstance(pol, Policy) and pol.name == name
    pol.validate()
    for prim in P.PRIMITIVES:
        for fmt in ALL_FORMATS:
            acc = pol.accuracy(prim, fmt)
            assert isinstance(acc, Accuracy)
            if not acc.input_dependent:
                assert 0 <= acc.ulps < 10 and acc.absolute < 1e-30
    text = pol.describe()
    assert name in text and "exp" in text and "matmul" in text
    assert str(pol) == text
    assert repr(pol).startswith(f"Policy({name!r}")


def test_get_policy_names_and_errors():
    assert get_policy() is get_policy("numpy") is P.NUMPY
    assert get_policy(P.DEFAULT_POLICY) is P.NUMPY
    assert get_policy("CUDA_FAST") is get_policy("cuda-fast") is P.CUDA_FAST
    assert get_policy(" TF32 ") is P.TF32
    assert get_policy("ieee754") is P.IEEE
    custom = P.NUMPY.replace(name="mine")
    assert get_policy(custom) is custom
    with pytest.raises(ValueError) as e:
        get_policy("cuda-slow")
    for n in P.PRESETS:
        assert n in str(e.value)
    with pytest.raises(TypeError):
        get_policy(3)


EXPECTED_KINDS = {
    "matmul": "matmul", "reduce_sum": "reduction", "reduce_prod": "reduction",
    "cumsum": "reduction",
    **{n: "elementwise" for n in "neg abs sqrt floor ceil round sign add sub mul div max min "
       "fma cast".split()},
    **{n: "transcendental" for n in "exp expm1 exp2 log log1p log2 sin cos tan tanh sinh "
       "cosh atan erf pow atan2".split()},
}


def test_kind_of_covers_every_primitive():
    assert set(P.PRIMITIVES) == set(EXPECTED_KINDS)
    for prim, kind in EXPECTED_KINDS.items():
        assert kind_of(prim) == kind
    assert kind_of("arctan2") == kind_of("power") == "transcendental"
    assert kind_of("conv") == "matmul" and kind_of("mean") == "reduction"
    assert kind_of("true_divide") == "elementwise"
    for bad in ("reshape", "where", "frobnicate"):
        with pytest.raises(LookupError):
            kind_of(bad)


def test_policies_are_immutable_and_overrides_return_new_policies():
    base = get_policy("cuda")
    tf = base.replace(matmul=OpPrecision(input="tf32", accumulate="float32"))
    assert tf is not base and tf.matmul.input == "tf32"
    assert base.matmul == OpPrecision(accumulate="float32")  # unchanged
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.name = "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.matmul.input = "tf32"
    with pytest.raises(TypeError):
        base.accuracies["exp"] = {}
    with pytest.raises(TypeError):
        base.accuracies["exp"]["float32"] = Accuracy(1)

    p = base.with_accuracy("exp", "float32", ulps=4)
    assert p.accuracy("exp", "float32").ulps == 4
    assert p.accuracy("exp", "float64") == base.accuracy("exp", "float64")
    assert base.accuracy("exp", "float32").ulps == 2.5
    p = base.with_accuracy("exp", ulps=7)  # every format
    assert p.accuracy("exp", "float64").ulps == p.accuracy("exp", "float16").ulps == 7
    p = base.with_accuracy("arctan", np.float32, Accuracy(ulps=3, source="measured"))
    assert p.accuracy("atan", "fp32").ulps == 3

    q = P.NUMPY.with_(exp=3, log={"f32": 6}, reduction={"accumulate": "float64"})
    assert q.accuracy("exp", "float64").ulps == 3
    assert q.accuracy("log", "float32").ulps == 6
    assert q.accuracy("log", "float64") == P.NUMPY.accuracy("log", "float64")
    assert q.reduction == OpPrecision(accumulate="float64")
    assert P.NUMPY.accuracy("exp", "float32").ulps == 4
    with pytest.raises(TypeError):
        base.with_accuracy("exp", "float32")
    with pytest.raises(LookupError):
        base.with_accuracy("frobnicate", ulps=1)


def test_missing_function_raises_lookup_error_naming_function_and_policy():
    pol = Policy("sparse", accuracies={"add": {"*": Accuracy(0.5)},
                                       "exp": {"float64": Accuracy(1.0)}})
    assert pol.accuracy("add", "float16").ulps == 0.5
    with pytest.raises(PolicyLookupError) as e:
        pol.accuracy("sin", "float32")
    assert isinstance(e.value, KeyError) and isinstance(e.value, LookupError)
    assert "sin" in str(e.value) and "sparse" in str(e.value)
    with pytest.raises(LookupError) as e:
        pol.accuracy("exp", "float32")  # no float32 entry, no "*", no derivation
    assert "exp" in str(e.value) and "float32" in str(e.value) and "sparse" in str(e.value)
    with pytest.raises(LookupError):
        P.NUMPY.accuracy("reshape", "float32")
    with pytest.raises(ValueError):
        P.NUMPY.accuracy("exp", "float128-ish")


def test_resolve_formats_per_kind():
    r = P.TF32.resolve("matmul", np.float32)
    assert (r.input.name, r.compute.name, r.accumulate.name, r.output.name) == \
        ("tf32", "float32", "float32", "float32")
    r = P.TF32.resolve("matmul", "float16")
    assert (r.input.name, r.accumulate.name, r.output.name) == ("tf32", "float32", "float16")
    r = P.TF32.resolve("matmul", "float64")  # float64 is never touched by a policy
    assert {f.name for f in r} == {"float64"}
    assert P.NUMPY.resolve("matmul", ml_dtypes.bfloat16).accumulate.name == "float32"
    assert P.NUMPY.resolve("reduce_sum", "float16").accumulate.name == "float16"
    assert P.CUDA.resolve("cumsum", "bfloat16").accumulate.name == "float32"
    assert P.NUMPY.resolve("exp", "float16").compute.name == "float32"
    assert P.IEEE.resolve("add", "bfloat16") == (formats.bfloat16,) * 4
    mixed = OpPrecision(input="tf32", accumulate="float32", output="float16")
    assert mixed.resolve("float32").output.name == "float16"
    assert repr(mixed) == "OpPrecision(input='tf32', accumulate='float32', output='float16')"
    assert P.CUDA.precision("atan2") is P.CUDA.transcendental
    with pytest.raises(ValueError):
        OpPrecision(input="tf33")
    assert OpPrecision(input="TF32", accumulate=np.float32, output=formats.float16) == \
        OpPrecision(input="tf32", accumulate="fp32", output="half")


def test_ieee_preset_is_the_idealized_model():
    for prim in P.PRIMITIVES:
        for fmt in ALL_FORMATS:
            u = P.IEEE.accuracy(prim, fmt).ulps
            assert u == (0.0 if prim in ("neg", "abs", "floor", "ceil", "round", "sign",
                                         "max", "min") else 0.5)


# --------------------------------------------------------------------------------------------
# ulp and Accuracy.bound
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["float64", "float32", "float16", "bfloat16"])
def test_ulp_matches_spacing(fmt):
    f = formats.get(fmt)
    rng = np.random.default_rng(SEED)
    bits = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16}[fmt]
    ut = {64: np.uint64, 32: np.uint32, 16: np.uint16}[bits]
    raw = rng.integers(0, 2 ** (bits - 1) - 1, 200_000, dtype=np.uint64).astype(ut)
    raw = np.concatenate([raw, np.array([0, 1, 2, 3], dtype=ut),  # zero, smallest subnormals
                          np.array([1.0, f.tiny, f.smallest_subnormal], f.dtype).view(ut)])
    with np.errstate(invalid="ignore"):  # NaN patterns
        xf = raw.view(f.dtype).astype(np.float64)
    keep = np.isfinite(xf) & (xf < f.max)
    nxt = (raw[keep] + ut(1)).view(f.dtype).astype(np.float64)  # successor of a positive float
    xf = xf[keep]
    np.testing.assert_array_equal(ulp(xf, f), nxt - xf)
    np.testing.assert_array_equal(ulp(-xf, f), nxt - xf)
    assert ulp(0.0, f) == f.smallest_subnormal
    assert ulp(np.inf, f) == np.inf and np.isinf(ulp(np.nan, f))


@pytest.mark.parametrize("fmt", ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn"])
def test_bound_at_powers_of_two_subnormals_and_zero(fmt):
    f = formats.get(fmt)
    half = Accuracy(0.5)
    ks = np.arange(f.emin + 1, f.emax + 1)
    pow2 = np.ldexp(1.0, ks)
    # correctly rounded: 0.5 ulp of the result, also at and just below powers of two
    np.testing.assert_array_equal(half.bound(pow2, f), np.ldexp(0.5, ks - f.p + 1))
    pred = pow2 - np.ldexp(1.0, ks - f.p)
    np.testing.assert_array_equal(half.bound(pred, f), np.ldexp(0.5, ks - f.p))
    np.testing.assert_array_equal(half.bound(-pow2, f), half.bound(pow2, f))
    # U > 0.5: just below a power of two the exact value may lie above it (ulp doubles)
    one = Accuracy(1.0)
    np.testing.assert_array_equal(one.bound(pow2, f), np.ldexp(1.0, ks - f.p + 1))
    np.testing.assert_array_equal(one.bound(pred, f), np.ldexp(1.0, ks - f.p + 1))
    mid = pow2 * 1.25
    np.testing.assert_array_equal(Accuracy(2.0).bound(mid, f), np.ldexp(2.0, ks - f.p + 1))
    # ... but only when it can: 1.25*2^k + 3 ulp(f) reaches 2^(k+1) in float8_e4m3fn only
    # (not out of the top binade: ulp() clamps at emax)
    crossing = (1.25 * (1 + 3 * 2.0 ** (2 - f.p)) >= 2) & (ks < f.emax)
    np.testing.assert_array_equal(Accuracy(3.0).bound(mid, f),
                                  np.ldexp(3.0, ks - f.p + 1 + crossing))
    # subnormal range and zero: the spacing there is the smallest subnormal
    d = f.smallest_subnormal
    sub = d * np.arange(0, 2 ** (f.p - 1) + 1, max(1, 2 ** (f.p - 1) // 1000))
    np.testing.assert_array_equal(half.bound(sub, f), np.full(sub.shape, 0.5 * d))
    np.testing.assert_array_equal(Accuracy(2.0).bound(sub, f), np.full(sub.shape, 2 * d))
    assert half.bound(0.0, f) == half.bound(-0.0, f) == 0.5 * d
    assert Accuracy(0.0).bound(1.5, f) == 0.0
    assert Accuracy(0.0, absolute=1e-9).bound(1.5, f) >= 1e-9
    assert Accuracy(0.5, absolute=1e-9).bound(0.0, f) >= 1e-9 + 0.5 * d
    # non-finite results are unbounded
    assert np.all(np.isinf(half.bound([np.inf, -np.inf, np.nan], f)))


@pytest.mark.slow      # (10-25 s: the default run keeps its siblings)
def test_bound_is_sound_by_brute_force_float16():
    """For exact values f and every float16 r with |r-f| <= U ulp(f) + A: bound(r) >= |r-f|."""
    f16 = formats.float16
    grid = np.unique(np.abs(all_float16_like("float16").astype(np.float64)))
    rng = np.random.default_rng(SEED)
    exact = np.concatenate([
        np.exp(rng.uniform(np.log(1e-8), np.log(6e4), 800)),
        np.ldexp(1.0, rng.integers(-24, 16, 600)) * (1 + rng.uniform(-3e-3, 3e-3, 600)),
        rng.uniform(0, 2 * f16.tiny, 300)])
    for U, A in [(0.5, 0.0), (0.75, 0.0), (1.0, 0.0), (2.5, 0.0), (4.0, 0.0), (1.0, 2e-6)]:
        acc = Accuracy(U, absolute=A)
        for fx in exact:
            lim = U * ulp(fx, f16) + A
            r = grid[np.searchsorted(grid, fx - lim, "left"):
                     np.searchsorted(grid, fx + lim, "right")]
            r = r[np.abs(r - fx) <= lim]
            if r.size:
                assert np.all(acc.bound(r, f16) >= np.abs(r - fx)), (U, A, fx)


def test_input_dependent_accuracy():
    acc = P.CUDA_FAST.accuracy("exp", "float32")
    assert acc.input_dependent
    np.testing.assert_array_equal(acc.ulps_at(np.array([0.0, 10.0, -50.0])), [2.5, 13.5, 60.5])
    y = np.float64(np.float32(math.exp(10)))
    assert acc.bound(y, "float32", 10.0) >= 13.5 * ulp(y, "float32")
    with pytest.raises(TypeError):
        acc.bound(y, "float32")  # needs the inputs
    log = P.CUDA_FAST.accuracy("log", "float32")
    assert log.ulps_at(1.0) == 0 and log.absolute_at(1.0) == pytest.approx(2 ** -21.41 + 2 ** -126)
    assert log.ulps_at(4.0) == 3.5
    sin = P.CUDA_FAST.accuracy("sin", "float32")
    b = sin.bound([math.sin(1.0), math.sin(4.0)], "float32", [1.0, 4.0])
    assert b[0] == pytest.approx(2 ** -21.41, rel=1e-6) and np.isinf(b[1])
    # flush-to-zero: a subnormal float32 input makes the bound infinite, a normal one does not
    mul = P.CUDA_FAST.accuracy("mul", "float32")
    assert np.isinf(mul.bound(1e-20, "float32", 1e-40, 1e20))
    assert np.isfinite(mul.bound(1.0, "float32", 1.0, 1.0))
    assert P.CUDA_FAST.accuracy("add", "float32").absolute == 3 * 2.0 ** -126
    # float64 is unaffected by fast math
    for prim in P.PRIMITIVES:
        assert P.CUDA_FAST.accuracy(prim, "float64") == P.CUDA.accuracy(prim, "float64")
    # narrow formats derive from the float32 entry, keeping the input dependence
    a16 = P.CUDA_FAST.accuracy("exp", "float16")
    assert a16.ulps_at(10.0) == pytest.approx(0.5 + 13.5 * 2.0 ** -13)


def test_narrow_formats_are_derived_from_float32():
    for fmt, p in [("float16", 11), ("bfloat16", 8), ("tf32", 11), ("float8_e5m2", 3)]:
        for name in ("log", "exp", "pow", "erf"):
            if fmt == "float16" and name == "exp":
                continue
            a = P.NUMPY.accuracy(name, fmt)
            assert a.ulps == 0.5 + P.NUMPY.accuracy(name, "float32").ulps * 2.0 ** (p - 24)
    # NumPy's own float32 exp kernel is not used for float16 (SVML LA float32 is): explicit entry
    assert P.NUMPY.accuracy("exp", "float16").ulps == 0.5 + 5 * 2.0 ** -13
    assert P.NUMPY.accuracy("add", "float16").ulps == 0.5  # the "*" entry wins
    assert P.CUDA.accuracy("cast", "tf32").ulps == 1.0
    assert P.TF32.accuracy("exp", "float32") == P.CUDA.accuracy("exp", "float32")


def _simulate_tanf(x, es, ec, er):
    """__sinf(x) * rcp(__cosf(x)) with component errors es, ec and reciprocal error er."""
    s, c = math.sin(x) + es, math.cos(x) + ec
    return float(np.float32(s * (1.0 / c) * (1 + er)))


def test_fast_math_derived_bounds_cover_worst_case_perturbations():
    """__tanf and __powf bounds vs. their implementations with worst-case component errors."""
    tan = P.CUDA_FAST.accuracy("tan", "float32")
    rng = np.random.default_rng(SEED)
    for x in np.concatenate([rng.uniform(-3.14, 3.14, 300), [1.5707, -1.5706, 0.0, 3.0]]):
        x = float(np.float32(x))
        b = tan.bound(math.tan(x), "float32", x)
        for es in (-2 ** -21.41, 2 ** -21.41):
            for ec in (-2 ** -21.19, 2 ** -21.19):
                for er in (-1.5 * 2 ** -23, 1.5 * 2 ** -23):
                    assert abs(_simulate_tanf(x, es, ec, er) - math.tan(x)) <= b, x
    pw = P.CUDA_FAST.accuracy("pow", "float32")
    for x, y in zip(rng.uniform(0.01, 100, 300), rng.uniform(-20, 20, 300)):
        x, y = float(np.float32(x)), float(np.float32(y))
        exact = x ** y
        b = pw.bound(exact, "float32", x, y)
        L = math.log2(x)
        eL = 2 ** -22 if 0.5 <= x <= 2 else 2.5 * 2 ** -23 * abs(L)
        for sL in (-1, 1):
            P_ = float(np.float32(y * (L + sL * eL)))
            for se in (-1, 1):
                z = 2.0 ** P_ * (1 + se * 2.5 * 2 ** -23)
                assert abs(z - exact) <= b, (x, y)
    assert np.isinf(pw.bound(1.0, "float32", -2.0, 2.0))


# --------------------------------------------------------------------------------------------
# Soundness of the "numpy" preset on this machine
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(UNARY) + list(BINARY))
def test_float32_numpy_is_sound(name):
    """>= 10^6 inputs per function (contiguous SIMD path) + 2*10^5 strided."""
    xs, y, ref = measure_float32(name)
    assert xs[0].size >= 999_999 and y.dtype == np.float32
    _check_sound(name, "float32", xs, y, ref, REF_REL)
    xs, y, ref = measure_float32(name, 200_000, strided=True)
    _check_sound(name, "float32", xs, y, ref, REF_REL)


@pytest.mark.parametrize("name", list(UNARY) + list(BINARY))
def test_float32_numpy_against_mpfr_subset(name):
    xs, y, _ = measure_float32(name)
    sub = tuple(x[::400] for x in xs)  # 2500 points, spread over all sub-domains
    ys = np.asarray(y[::400], dtype=np.float64)
    worst, errs, keep = _mp_ulps(name, sub, ys, "float32")
    acc = P.NUMPY.accuracy(name, "float32")
    assert worst <= acc.ulps, f"{name}: {worst} > {acc.ulps}"
    assert np.all(errs <= acc.bound(ys[keep], "float32", *[x[keep] for x in sub]))


@pytest.mark.parametrize("name", list(UNARY) + list(BINARY))
def test_float64_numpy_against_mpfr(name):
    xs, y, (worst, errs, keep) = measure_float64(name)
    assert keep.size >= 15_000
    acc = P.NUMPY.accuracy(name, "float64")
    assert worst <= acc.ulps, f"{name}: {worst} > {acc.ulps}"
    assert np.all(errs <= acc.bound(y[keep], "float64", *[x[keep] for x in xs]))
    # the float64 reference used for float32 is within REF_REL
    assert acc.ulps * 2.0 ** -52 <= REF_REL


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(UNARY) + list(BINARY))
def test_narrow_numpy_is_sound(name, fmt):
    xs, y, ref = measure_narrow(name, fmt)
    # the float64 reference is within REF_REL; its error is ~2^-39 ulp of the narrow format
    _check_sound(name, fmt, xs, y, ref, REF_REL)
    # non-contiguous operands take NumPy's scalar (libm) loop instead of the SIMD one
    xs = tuple(np.repeat(x, 2)[::2] for x in xs)
    _check_sound(name, fmt, xs, _call(name, *xs), ref, REF_REL)


def test_basic_ops_are_correctly_rounded():
    """+ - * / sqrt in float32/float16/bfloat16 equal the float64 result rounded once."""
    rng = np.random.default_rng(SEED)
    for fmt in ("float32", "float16", "bfloat16"):
        dt = formats.get(fmt).dtype
        a = (rng.standard_normal(200_000) * np.exp(rng.uniform(-8, 8, 200_000))).astype(dt)
        b = (rng.standard_normal(200_000) * np.exp(rng.uniform(-8, 8, 200_000))).astype(dt)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        with np.errstate(all="ignore"):
            for op in (np.add, np.subtract, np.multiply, np.divide):
                got = op(a, b).astype(np.float64)
                want = op(a64, b64).astype(dt).astype(np.float64)
                np.testing.assert_array_equal(got, want)
            got = np.sqrt(np.abs(a)).astype(np.float64)
            np.testing.assert_array_equal(got, np.sqrt(np.abs(a64)).astype(dt).astype(np.float64))
        assert P.NUMPY.accuracy("div", fmt).ulps == 0.5


def test_ieee_model_is_unsound_for_numpy_exp():
    """The caveat in the docs: assuming 0.5 ulp for NumPy's float32 exp is wrong here."""
    xs, y, ref = measure_float32("exp")
    ok = np.isfinite(ref) & (ref < 3e38)
    err = np.abs(y.astype(np.float64)[ok] - ref[ok]) - REF_REL * ref[ok]
    ieee = P.IEEE.accuracy("exp", "float32").bound(y.astype(np.float64)[ok], "float32")
    assert np.count_nonzero(err > ieee) > 0
    numpy = P.NUMPY.accuracy("exp", "float32").bound(y.astype(np.float64)[ok], "float32")
    assert not np.any(err > numpy)


# --------------------------------------------------------------------------------------------
# Table for docs/policy.md
# --------------------------------------------------------------------------------------------
def measured_table():
    """{function: (float32 worst, float32 strided, float32 vs MPFR, float64, float16,
    bfloat16)} -- max ulp error against the exact value."""
    out = {}
    for name in list(UNARY) + list(BINARY):
        row = []
        for strided, n in ((False, 1_000_000), (True, 200_000)):
            xs, y, ref = measure_float32(name, n, strided)
            row.append(_measure_vs_ref(name, "float32", xs, y, ref, REF_REL)[0])
        xs, y, _ = measure_float32(name)
        row.append(_mp_ulps(name, tuple(x[::400] for x in xs),
                            np.asarray(y[::400], np.float64), "float32")[0])
        row.append(measure_float64(name)[2][0])
        for fmt in ("float16", "bfloat16"):
            xs, y, ref = measure_narrow(name, fmt)
            row.append(_measure_vs_ref(name, fmt, xs, y, ref, REF_REL)[0])
        out[name] = row
    return out


if __name__ == "__main__":  # pragma: no cover
    import platform
    from numpy._core._multiarray_umath import __cpu_features__ as feats
    simd = [k for k in ("AVX512_SPR", "AVX512_SKX", "AVX512F", "AVX2", "FMA3") if feats.get(k)]
    print(f"numpy {np.__version__}, {platform.machine()}, {platform.libc_ver()}, "
          f"SIMD {simd}")
    hdr = ("function", "f32", "f32 strided", "f32 vs MPFR", "f64 vs MPFR", "f16 (all)",
           "bf16 (all)", "policy f32", "policy f64", "policy f16")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for name, row in measured_table().items():
        pol = [P.NUMPY.accuracy(name, f).ulps for f in ("float32", "float64", "float16")]
        print(f"| {name} | " + " | ".join(f"{v:.3f}" for v in row[:4]) + " | "
              + " | ".join(f"{v:.6f}" for v in row[4:]) + " | "
              + " | ".join(f"{v:.6g}" for v in pol) + " |")


def test_modified_policy_is_marked():
    p = get_policy("cuda")
    q = p.with_accuracy("exp", "float32", ulps=4)
    assert q.name == "cuda*" and p.name == "cuda"
    assert q.replace(matmul=OpPrecision(input="tf32")).name == "cuda*"
    assert p.replace(name="mine").name == "mine"
