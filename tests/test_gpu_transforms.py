"""The transforms on CuPy arrays and CUDA tensors (``@pytest.mark.gpu``: skipped cleanly without
CuPy and a CUDA device).

``fpx.interval`` of CuPy inputs computes its bounds on host copies (the rules are NumPy calls
and numba kernels) under the ``"cupy"`` policy, runs the program once on the GPU for its own
value, and returns CuPy bounds. What these tests check is the claim that matters: the GPU's
own results -- CUDA's libm, cuBLAS's summation orders, CuPy's reductions -- lie inside the
bound, elementwise, on ordinary and adversarial inputs.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

import fpx
import fpx.numpy as fnp

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def _host(a):
    return a.get() if type(a).__module__.startswith("cupy") else np.asarray(a)


def _assert_on_gpu_and_inside(iv, *ys):
    import cupy
    assert isinstance(iv.lo, cupy.ndarray) and isinstance(iv.hi, cupy.ndarray)
    assert isinstance(iv.value, cupy.ndarray)
    lo, hi = _host(iv.lo), _host(iv.hi)
    assert not np.isnan(lo).any() and not np.isnan(hi).any()
    for y in (iv.value,) + ys:
        y = _host(y).astype(np.float64)
        bad = ~((lo <= y) & (y <= hi))
        assert not bad.any(), (int(bad.sum()), y[bad][:4], lo[bad][:4], hi[bad][:4])


def mlp(params, x):
    for i, (w, b) in enumerate(params):
        x = x @ w + b
        if i < len(params) - 1:
            x = fnp.tanh(x)
    return fpx.nn.softmax(x, axis=-1)


def _mlp_data(xp, dtype, seed=0, width=64, batch=16, layers=3):
    rng = np.random.default_rng(seed)
    ps = [(xp.asarray((rng.standard_normal((width, width)) / np.sqrt(width)).astype(dtype)),
           xp.asarray((0.1 * rng.standard_normal(width)).astype(dtype)))
          for _ in range(layers)]
    return ps, xp.asarray(rng.standard_normal((batch, width)).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16], ids=["f64", "f32", "f16"])
def test_interval_of_an_mlp_on_cupy(cp, dtype):
    ps, x = _mlp_data(cp, dtype)
    iv = fpx.interval(mlp)(ps, x)
    assert iv.value.dtype == dtype
    # the value is the program's own GPU run, bit for bit
    assert _host(iv.value).tobytes() == _host(mlp(ps, x)).tobytes()
    # the float64 GPU run and the NumPy host run are results of the same program too
    ps64 = [(w.astype(np.float64), b.astype(np.float64)) for w, b in ps]
    hps = [(_host(w), _host(b)) for w, b in ps]
    _assert_on_gpu_and_inside(iv, mlp(ps64, x.astype(np.float64)), mlp(hps, _host(x)))
    # the bounds are the host bounds under the "cupy" policy
    hv = fpx.interval(mlp, policy="cupy")(hps, _host(x))
    assert np.array_equal(_host(iv.lo), hv.lo) and np.array_equal(_host(iv.hi), hv.hi)
    assert "Interval(" in repr(iv)


# CUDA math functions against the documented maxima the "cupy" (= "cuda") policy states. Inputs: a wide
# log-spaced sweep (both signs) plus each function's hard spots.
_FUNCS = {
    "exp": (fnp.exp, (-80, 80)), "expm1": (fnp.expm1, (-30, 80)), "exp2": (fnp.exp2, (-120, 120)),
    "log": (fnp.log, (1e-30, 1e30)), "log1p": (fnp.log1p, (-0.999, 1e30)),
    "log2": (fnp.log2, (1e-30, 1e30)), "sin": (fnp.sin, (-1e4, 1e4)),
    "cos": (fnp.cos, (-1e4, 1e4)), "tan": (fnp.tan, (-1e3, 1e3)),
    "tanh": (fnp.tanh, (-20, 20)), "sinh": (fnp.sinh, (-80, 80)), "cosh": (fnp.cosh, (-80, 80)),
    "atan": (fnp.arctan, (-1e6, 1e6)), "sqrt": (fnp.sqrt, (0, 1e30)), "erf": (fnp.erf, (-6, 6)),
    "recip": (lambda x: 1.0 / x, (1e-30, 1e30)), "div": (lambda x: x / 3.7, (-1e30, 1e30)),
}


def _sweep(lo, hi, n, dtype, seed):
    rng = np.random.default_rng(seed)
    if lo > 0:
        x = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    else:
        x = rng.uniform(lo, hi, n)
        x[: n // 4] *= 10.0 ** rng.uniform(-12, 0, n // 4)     # small magnitudes too
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", sorted(_FUNCS))
def test_cuda_math_functions_lie_in_the_cupy_policy_bound(cp, name, dtype):
    fn, (lo, hi) = _FUNCS[name]
    x = cp.asarray(_sweep(lo, hi, 200_000, dtype, seed=len(name)))
    iv = fpx.interval(fn)(x)
    _assert_on_gpu_and_inside(iv)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_cupy_sums_and_matmuls_lie_in_the_bound(cp, dtype):
    rng = np.random.default_rng(3)
    # cancellation: large terms of both signs plus small ones
    a = rng.standard_normal((64, 4096)) * np.where(rng.random((64, 4096)) < 0.1, 300.0, 1.0)
    a = cp.asarray(a.astype(dtype))
    b = cp.asarray(rng.standard_normal((4096, 96)).astype(dtype))

    def f(a, b):
        return fnp.sum(a, axis=1), a @ b, fnp.cumsum(a[:, :512], axis=1), fnp.mean(a, axis=0)

    outs = fpx.interval(f)(a, b)
    for i, iv in enumerate(outs):
        try:
            _assert_on_gpu_and_inside(iv)
        except AssertionError as e:
            raise AssertionError(f"output {i}: {e}") from None
    # cuBLAS in float64 and CuPy's float64 reductions: other executions of the same program
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    _assert_on_gpu_and_inside(outs[1], a64 @ b64)
    _assert_on_gpu_and_inside(outs[0], a64.sum(axis=1))


def test_flushed_float32_subnormals_lie_in_the_bound(cp):
    """CuPy's float32 kernels and cuBLAS flush subnormal inputs and results to zero (seen on
    an H100): the "cupy" policy's flush-to-zero model covers what they return."""
    f32 = np.float32
    cases = [
        (fnp.exp, [np.array([-100.0, -90.0, -87.0, -10.0], f32)]),
        (lambda v: v * f32(1e30), [np.array([1e-40, 1e-39, -3e-42, 1.0], f32)]),
        (lambda a, b: a @ b, [np.full((2, 4096), 1e-21, f32), np.full((4096, 3), 1e-21, f32)]),
        (lambda a, b: a @ b, [np.array([[1e-20, 1e-19, 2e-19, 3e-38]], f32),
                              np.array([[1e-20], [-1e-20], [1e-19], [0.25]], f32)]),
        (lambda v: fpx.nn.softmax(v, axis=-1), [np.array([[0.0, -95.0, -100.0, -200.0]], f32)]),
        (lambda v: fnp.sum(v * f32(0.5)), [np.full(1000, 2e-38, f32)]),
    ]
    for f, hs in cases:
        iv = fpx.interval(f)(*[cp.asarray(h) for h in hs])
        _assert_on_gpu_and_inside(iv)


def test_layer_norm_attention_chain_on_cupy(cp):
    rng = np.random.default_rng(5)
    q, k, v = (cp.asarray(rng.standard_normal((4, 32, 64)).astype(np.float32)) for _ in range(3))
    w = cp.asarray(rng.standard_normal(64).astype(np.float32))

    def attn(q, k, v, w):
        s = fpx.nn.softmax(q @ fnp.swapaxes(k, -1, -2) / 8.0, axis=-1)
        return fpx.nn.layer_norm(s @ v, (64,), w, None), fpx.nn.gelu(s @ v)

    for iv in fpx.interval(attn)(q, k, v, w):
        _assert_on_gpu_and_inside(iv)


def test_interval_inputs_on_cupy(cp):
    x = cp.asarray(np.linspace(-2, 2, 101))
    box = fpx.Interval.around(x, rel=1e-6)
    assert isinstance(box.lo, cp.ndarray)
    iv = fpx.interval(lambda t: fnp.exp(t) * t)(box)
    _assert_on_gpu_and_inside(iv, cp.exp(box.lo) * box.lo, cp.exp(box.hi) * box.hi)
    assert bool(iv.contains(iv.value).all())
    assert bool(iv.contains(_host(iv.value)).all())          # a host array is compared too
    with pytest.raises(ValueError, match="outside"):
        fpx.Interval(x - 1, x + 1, x + 2)


def test_non_finite_and_empty_inputs_on_cupy(cp):
    x = cp.asarray(np.array([np.nan, np.inf, -np.inf, 0.0, 1e-310, 1.0]))
    iv = fpx.interval(lambda t: fnp.exp(t) + 1)(x)
    lo, hi = _host(iv.lo), _host(iv.hi)
    assert np.isnan(lo[0]) and np.isnan(hi[0]) and hi[1] == np.inf and lo[2] <= 1.0 <= hi[2]
    _assert_on_gpu_and_inside(fpx.interval(lambda t: fnp.exp(t) + 1)(x[1:]))
    e = fpx.interval(lambda t: t * 2)(cp.zeros((0, 3), np.float32))
    assert e.shape == (0, 3) and isinstance(e.lo, cp.ndarray)


def _tiled_matmul(a, b, tile=64, order=None, bug=False):
    """float16 tiles accumulated in float32, tiles summed in ``order`` (a split-K kernel)."""
    import cupy
    k = a.shape[1]
    acc = cupy.zeros((a.shape[0], b.shape[1]), cupy.float32)
    for t in (order if order is not None else range(k // tile)):
        bt = b[t * tile:(t + 1) * tile]
        if bug:
            bt = b[:, t * tile:(t + 1) * tile].T      # a transposed-stride bug
        acc += (a[:, t * tile:(t + 1) * tile].astype(cupy.float32) @ bt.astype(cupy.float32))
    return acc.astype(cupy.float16)


def test_classify_and_assert_close_on_cupy(cp):
    rng = np.random.default_rng(7)
    a = cp.asarray(rng.standard_normal((128, 512)).astype(np.float16))
    b = cp.asarray(rng.standard_normal((512, 512)).astype(np.float16))
    ref = a.astype(cp.float32) @ b.astype(cp.float32)

    def kernel(a, b):
        return fnp.matmul(a, b)

    order = list(rng.permutation(512 // 64))
    shuffled = _tiled_matmul(a, b, order=order)
    v = fpx.classify(kernel, ref, a, b)
    assert v.kind == "roundoff", v.report()
    fpx.testing.assert_close(shuffled, ref, fn=kernel, args=(a, b))
    wrong = _tiled_matmul(a, b, bug=True)
    with pytest.raises(AssertionError, match="not a possible result"):
        fpx.testing.assert_close(wrong, ref, fn=kernel, args=(a, b))
    bug = fpx.classify(kernel, ref * 1.01, a, b)
    assert bug.kind == "bug" and bug.outside, bug.report()


def test_stochastic_on_cupy(cp):
    ps, x = _mlp_data(cp, np.float32, width=32, batch=8, layers=2)
    s1 = fpx.stochastic(mlp, "sr", samples=8, seed=1)(ps, x)
    s2 = fpx.stochastic(mlp, "sr", samples=8, seed=1)(ps, x)
    assert isinstance(s1, cp.ndarray) and s1.shape == (8, 8, 32) and s1.dtype == np.float32
    assert _host(s1).tobytes() == _host(s2).tobytes()
    iv = fpx.interval(mlp)(ps, x)
    _assert_on_gpu_and_inside(iv, *list(s1))
    m = _host(s1).astype(np.float64).mean(axis=0)
    assert ((_host(iv.lo) <= m) & (m <= _host(iv.hi))).all()


# -- torch modules on CUDA ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


def test_torch_modules_on_cuda_lie_in_their_bounds(torch_cuda):
    torch = torch_cuda
    nn = torch.nn
    torch.manual_seed(0)
    mods = {
        "mlp": (nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10)),
                torch.randn(32, 64)),
        "cnn": (nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                              nn.MaxPool2d(2), nn.Conv2d(16, 8, 3), nn.Flatten(),
                              nn.Linear(8 * 14 * 14, 10)),
                torch.randn(4, 3, 32, 32)),
        "encoder": (nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True),
                    torch.randn(2, 16, 64)),
    }
    mods["mlp-f16"] = (nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 16)),
                       torch.randn(64, 256))
    for name, (m, x) in mods.items():
        dt = torch.float16 if name.endswith("f16") else torch.float32
        m = m.eval().cuda()
        x = x.cuda()
        m.to(dt)
        x = x.to(dt)
        with torch.no_grad():
            y = m(x)
            y64 = copy.deepcopy(m).double()(x.double())   # the same (rounded) weights, exact
        iv = fpx.interval(m)(x)
        assert iv.value.is_cuda and iv.value.dtype == dt, name
        lo, hi = _host(iv.lo), _host(iv.hi)
        for out in (y, y64, iv.value):
            o = out.detach().double().cpu().numpy()
            bad = ~((lo <= o) & (o <= hi))
            assert not bad.any(), (name, int(bad.sum()), o[bad][:3], lo[bad][:3], hi[bad][:3])

