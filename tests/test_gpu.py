"""fpx on CuPy arrays (``@pytest.mark.gpu``: skipped cleanly without CuPy and a CUDA device).

The eval interpreter picks the backend from the arrays (``fpx.core.backend_of``: a CuPy array
among the operands selects the ``cupy`` backend, registered on first sight by
``fpx.core._cupy_backend``), so eager ``fpx.numpy`` on CuPy arrays runs CuPy's own routines
and returns CuPy arrays; ``fpx.trace`` threads CuPy arrays through unchanged.

CuPy has no bfloat16/float8 dtypes: these tests use float64/float32/float16.
"""
from __future__ import annotations

import numpy as np
import pytest

import fpx
import fpx.numpy as fnp
from fpx import core

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

GPU_DTYPES = [np.float64, np.float32, np.float16]
GPU_IDS = ["f64", "f32", "f16"]


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def _host(a):
    import cupy
    return cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else np.asarray(a)


def assert_gpu_bits(actual, expected):
    """Both CuPy arrays, same dtype/shape/bits."""
    import cupy
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_gpu_bits(a, e)
        return
    assert isinstance(actual, cupy.ndarray), type(actual)
    a, e = _host(actual), _host(expected)
    assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, e.dtype, a.shape, e.shape)
    assert a.tobytes() == e.tobytes(), (a, e)


def assert_gpu_close(actual, expected, rtol):
    import cupy
    assert isinstance(actual, cupy.ndarray), type(actual)
    a, e = _host(actual), _host(expected)
    assert a.dtype == e.dtype and a.shape == e.shape
    np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=rtol)


def _data(cp, dtype, shape=(4, 6), seed=0, scale=2.0):
    h = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)
    return h, cp.asarray(h)


def _specials(cp, dtype):
    h = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-310, 5e-8, -1.0, 0.5, 2.5, 1e30, 3.0],
                 np.float64)
    with np.errstate(all="ignore"):
        h = h.astype(dtype)
    return h, cp.asarray(h)


def test_backend_dispatch(cp):
    _, x = _data(cp, np.float32)
    b = core.backend_of([x, 1.0, np.float32(2)])
    assert b.name == "cupy" and b.xp is cp
    assert core.get_backend("cupy") is b
    assert core.backend_of([np.ones(2)]) is core.NUMPY


UNARY = ["negative", "abs", "sqrt", "square", "reciprocal", "exp", "expm1", "exp2", "log",
         "log1p", "log2", "sin", "cos", "tan", "tanh", "sinh", "cosh", "arctan", "sign", "floor",
         "ceil", "rint", "trunc", "isnan", "isinf", "isfinite"]


@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=GPU_IDS)
@pytest.mark.parametrize("name", UNARY)
def test_unary_equals_cupy(cp, name, dtype):
    for _, x in (_data(cp, dtype), _specials(cp, dtype)):
        assert_gpu_bits(getattr(fnp, name)(x), getattr(cp, name)(x))
        assert_gpu_bits(fpx.trace(lambda t: getattr(np, name)(t))(x).outputs,
                        getattr(cp, name)(x))


def test_erf_equals_cupyx(cp):
    import cupyx.scipy.special as cps
    for dtype in (np.float32, np.float64):
        _, x = _data(cp, dtype)
        assert_gpu_bits(fnp.erf(x), cps.erf(x))


BINARY = ["add", "subtract", "multiply", "divide", "power", "arctan2", "maximum", "minimum",
          "less", "less_equal", "greater", "greater_equal", "equal", "not_equal",
          "logical_and", "logical_or", "logical_xor", "floor_divide", "remainder"]


@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=GPU_IDS)
@pytest.mark.parametrize("name", BINARY)
def test_binary_equals_cupy(cp, name, dtype):
    _, x = _data(cp, dtype, seed=1)
    _, y = _data(cp, dtype, shape=(6,), seed=2)
    f = getattr(cp, name)
    assert_gpu_bits(getattr(fnp, name)(x, y), f(x, y))
    assert_gpu_bits(getattr(fnp, name)(x, 2.0), f(x, 2.0))          # weak Python scalar
    assert_gpu_bits(fpx.trace(lambda a, b: getattr(np, name)(a, b))(x, y).outputs, f(x, y))


@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=GPU_IDS)
def test_where_clip_round_astype(cp, dtype):
    h, x = _data(cp, dtype, seed=3)
    assert_gpu_bits(fnp.where(x > 0, x, 0.0), cp.where(x > 0, x, 0.0))
    assert_gpu_bits(fnp.clip(x, -1.0, 1.0), cp.clip(x, -1.0, 1.0))
    for d in (0, 2, -1):   # fpx rounds as NumPy does (x*10**d, rint, /10**d): IEEE steps
        r = fnp.round(x, d)
        assert isinstance(r, cp.ndarray) and r.dtype == dtype
        if dtype == np.float16:   # CUDA's half division may differ from NumPy's by 1 ulp
            np.testing.assert_allclose(_host(r).astype(np.float64), np.round(h, d), rtol=1e-3)
        else:
            assert _host(r).tobytes() == np.round(h, d).tobytes()
    for target in (np.float64, np.float32, np.float16):
        assert_gpu_bits(fnp.astype(x, target), x.astype(target))
    t = fnp.astype(x, "tf32")
    assert isinstance(t, cp.ndarray)
    assert _host(t).tobytes() == fnp.astype(h, "tf32").tobytes()


REDUCTIONS = ["sum", "mean", "prod", "max", "min", "var", "std"]


@pytest.mark.parametrize("axis", [None, 0, -1, (0, 1)], ids=repr)
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=GPU_IDS)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_equal_cupy(cp, name, dtype, axis):
    _, x = _data(cp, dtype, shape=(3, 5, 4), seed=4)
    f = getattr(cp, name)
    for keepdims in (False, True):
        assert_gpu_bits(getattr(fnp, name)(x, axis=axis, keepdims=keepdims),
                        f(x, axis=axis, keepdims=keepdims))
    assert_gpu_bits(fpx.trace(lambda t: getattr(np, name)(t, axis=axis))(x).outputs,
                    f(x, axis=axis))


@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=GPU_IDS)
def test_arg_reductions_cumsum_logsumexp(cp, dtype):
    h, x = _data(cp, dtype, shape=(3, 5), seed=5)
    assert_gpu_bits(fnp.argmax(x, axis=1), cp.argmax(x, axis=1))
    assert_gpu_bits(fnp.argmin(x), cp.argmin(x))
    assert_gpu_bits(fnp.cumsum(x, axis=1), cp.cumsum(x, axis=1))
    assert_gpu_bits(fnp.var(x, axis=0, ddof=1), cp.var(x, axis=0, ddof=1))
    lse = fnp.logsumexp(x, axis=1)             # decomposition, run by CuPy
    h64 = h.astype(np.float64)
    ref = np.log(np.exp(h64 - h64.max(1, keepdims=True)).sum(1)) + h64.max(1)
    assert_gpu_close(lse, cp.asarray(ref.astype(dtype)), rtol=1e-2 if dtype == np.float16 else 1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_linear_algebra_equals_cupy(cp, dtype):
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    _, a = _data(cp, dtype, shape=(2, 3, 4), seed=6)
    _, b = _data(cp, dtype, shape=(2, 4, 5), seed=7)
    _, w = _data(cp, dtype, shape=(4, 5), seed=8)
    assert_gpu_close(fnp.matmul(a, b), cp.matmul(a, b), rtol)
    assert_gpu_close(fpx.trace(lambda p, q: p @ q)(a, b).outputs, a @ b, rtol)
    assert_gpu_close(fnp.einsum("bij,bjk->bik", a, b), cp.einsum("bij,bjk->bik", a, b), rtol)
    assert_gpu_close(fnp.tensordot(a, w, axes=1), cp.tensordot(a, w, axes=1), rtol)
    assert_gpu_close(fnp.dot(a[0], w), cp.dot(a[0], w), rtol)
    assert_gpu_close(fnp.vecdot(a, a), cp.sum(a * a, axis=-1), rtol)
    assert_gpu_close(fnp.outer(w[0], w[1]), cp.outer(w[0], w[1]), rtol)
    # decompositions (transposes, reshapes, matmul) also run on the GPU
    rec = fpx.trace(lambda p, q: fnp.einsum("bij,bjk->bik", p, q), inline=True)(a, b)
    assert "matmul" in rec.primitives
    assert_gpu_close(rec.outputs, cp.einsum("bij,bjk->bik", a, b), rtol)


@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=GPU_IDS)
def test_movement_equals_cupy(cp, dtype):
    _, x = _data(cp, dtype, shape=(2, 3, 4), seed=9)
    cases = [
        (lambda m: m.reshape(x, (4, -1)), None), (lambda m: m.transpose(x, (2, 0, 1)), None),
        (lambda m: m.swapaxes(x, 0, 2), None), (lambda m: m.moveaxis(x, 0, -1), None),
        (lambda m: m.expand_dims(x, 1), None), (lambda m: m.squeeze(x[:1]), None),
        (lambda m: m.broadcast_to(x[:, :1], (2, 3, 4)), None),
        (lambda m: m.concatenate([x, x], axis=1), None), (lambda m: m.stack([x, -x]), None),
        (lambda m: m.flip(x, axis=1), None), (lambda m: m.pad(x, 1), None),
        (lambda m: m.tile(x, 2), None), (lambda m: m.repeat(x, 2, axis=2), None),
        (lambda m: m.take(x, np.array([3, 0]) if m is fnp else m.asarray([3, 0]), axis=2), None),
        (lambda m: m.take_along_axis(x, np.zeros((2, 3, 1), np.int64) if m is fnp
                                     else m.zeros((2, 3, 1), np.int64), axis=2), None),
    ]
    for f, _ in cases:
        assert_gpu_bits(f(fnp), f(cp))
    assert_gpu_bits(fpx.trace(lambda t: t[1, ::-1, np.array([0, 2])])(x).outputs,
                    x[1, ::-1, cp.asarray([0, 2])])
    parts = fnp.split(x, 2, axis=2)
    assert_gpu_bits(parts, cp.split(x, 2, axis=2))
    assert_gpu_bits(fpx.trace(lambda t: t.reshape(6, 4).T[::-1])(x).outputs,
                    x.reshape(6, 4).T[::-1])


def test_creation_on_gpu(cp):
    _, x = _data(cp, np.float32)
    for a, e in [(fnp.zeros((2, 3), like=x), cp.zeros((2, 3))),
                 (fnp.ones(4, dtype=np.float32, like=x), cp.ones(4, np.float32)),
                 (fnp.full((2,), 1.5, like=x), cp.full((2,), 1.5)),
                 (fnp.arange(5, like=x), cp.arange(5)),
                 (fnp.linspace(0, 1, 5, like=x), cp.linspace(0, 1, 5)),
                 (fnp.eye(3, like=x), cp.eye(3)),
                 (fnp.zeros_like(x), cp.zeros_like(x)),
                 (fnp.asarray([1.0, 2.0], device="cuda"), cp.asarray([1.0, 2.0])),
                 (fnp.asarray(x), x)]:
        assert_gpu_bits(a, e)


def _array_api_block(x, w):
    """Array-API code: the namespace comes from the arrays (CuPy eagerly, fpx under trace)."""
    import array_api_compat
    xp = array_api_compat.array_namespace(x, w)
    h = xp.matmul(x, w)
    h = xp.where(h > 0, h, 0.0 * h)
    e = xp.exp(h - xp.max(h, axis=-1, keepdims=True))
    p = e / xp.sum(e, axis=-1, keepdims=True)
    return p, xp.mean(p * p, axis=0), xp.argmax(p, axis=-1)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_trace_array_api_code_on_cupy(cp, dtype):
    _, x = _data(cp, dtype, shape=(5, 4), seed=10)
    _, w = _data(cp, dtype, shape=(4, 3), seed=11)
    rec = fpx.trace(_array_api_block)(x, w)
    assert rec.primitives[0] == "matmul" and "exp" in rec.primitives
    expected = _array_api_block(x, w)
    for got, exp in zip(rec.outputs, expected):
        assert isinstance(got, cp.ndarray)
        assert_gpu_close(got, exp, 1e-12 if dtype == np.float64 else 1e-6)
    # plain-NumPy spelling on CuPy arrays under trace (routed through __array_function__)
    rec = fpx.trace(lambda t: np.tanh(t @ w).sum(axis=0))(x)
    assert_gpu_close(rec.outputs, cp.tanh(x @ w).sum(axis=0), 1e-6)
    nested = fpx.trace(fpx.trace(_array_api_block))(x, w)
    assert nested.primitives == fpx.trace(_array_api_block)(x, w).primitives


@pytest.mark.parametrize("fmt", ["float32", "float16", "tf32"])
@pytest.mark.parametrize("mode", ["rn", "rd", "ru", "rz"])
def test_formats_round_on_cupy_equals_numpy(cp, fmt, mode):
    rng = np.random.default_rng(12)
    h = np.concatenate([rng.standard_normal(1000) * 10.0 ** rng.integers(-40, 40, 1000),
                        [np.nan, np.inf, -np.inf, 0.0, -0.0, 1 + 2.0**-11, 1 + 2.0**-24,
                         65520.0, 3.5e38, 1e-320]])
    expected = fpx.formats.round(h, fmt, mode)
    got = fpx.formats.round(cp.asarray(h), fmt, mode)
    assert isinstance(got, cp.ndarray)
    g = _host(got)
    assert g.dtype == expected.dtype and g.tobytes() == expected.tobytes()


@pytest.mark.parametrize("fmt", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_formats_round_narrow_on_cupy_returns_its_dtype_or_float32_values(cp, fmt):
    """A CuPy that has the format's dtype (CuPy 14: bfloat16) gets it; one without gets the
    exactly rounded values in float32 storage. Subnormals of the format included."""
    dt = np.dtype(fpx.formats.get(fmt).dtype)
    try:
        cp.zeros(1, dt)
        want = dt
    except Exception:
        want = np.dtype(np.float32)
    rng = np.random.default_rng(7)
    h = np.concatenate([rng.standard_normal(4096) * 4.0,
                        rng.standard_normal(512) * 2.0 ** rng.integers(-140, -5, 512)])
    expected = fpx.formats.round(h, fmt, "rn").astype(np.float32)
    got = fpx.formats.round(cp.asarray(h), fmt, "rn")
    assert isinstance(got, cp.ndarray) and got.dtype == want
    assert _host(got).astype(np.float32).tobytes() == expected.tobytes()
