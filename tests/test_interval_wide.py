"""fpx.interval on wide input boxes (a deep network's later layers, issue 28): the bounds of
clamps of a value-centred ball (ReLU6, hardsigmoid, hardswish), of the self-gated activations
(silu, gelu, hardswish: bounded piece by piece) and of layer norm with a small eps hold every
execution at many points of the box -- float32 NumPy runs of the same program and torch's own
modules and CPU kernels in every float dtype -- and the exact values at those points."""
from __future__ import annotations

import numpy as np
import pytest

import fpx
import fpx.nn as fnn
import fpx.numpy as fnp


def _points(lo, hi, value, rng, k=64):
    """float32 points of the box [lo, hi]: its value, its corners' float32 roundings inside it,
    random points, and points at the box's edges on one side only (where a clamp cuts)."""
    pts = [value]
    for t in [0.0, 1.0, 0.5, 0.02, 0.98] + list(rng.random(k)):
        pts.append(lo + t * (hi - lo))
    for _ in range(8):
        pts.append(np.where(rng.random(lo.shape) < 0.5, lo, hi))
    out = []
    for p in pts:
        p32 = np.asarray(p, np.float64).astype(np.float32)
        inside = (p32 >= lo) & (p32 <= hi)
        out.append(np.where(inside, p32, value).astype(np.float32))
    return out


def _gate(W, b):
    """A linear map (its bound a ball about the program's value), then hardswish(z) =
    z·clamp(z + 3, 0, 6)/6 and hardsigmoid(z) = clamp(z + 3, 0, 6)/6 as torch decomposes
    them, and ReLU6: what MobileNetV3's blocks compute."""
    def f(h):
        z = fnp.add(fnp.matmul(h, W), b)
        g = fnp.minimum(fnp.maximum(fnp.add(z, np.float32(3)), np.float32(0)), np.float32(6))
        hsig = fnp.divide(g, np.float32(6))
        hswish = fnp.divide(fnp.multiply(z, g), np.float32(6))
        relu6 = fnp.minimum(fnp.maximum(z, np.float32(0)), np.float32(6))
        return hsig, hswish, relu6
    return f


def _gate_numpy(h, W, b):
    with np.errstate(all="ignore"):
        z = h @ W + b
        g = np.minimum(np.maximum(z + np.float32(3), np.float32(0)), np.float32(6))
        return (g / np.float32(6), z * g / np.float32(6),
                np.minimum(np.maximum(z, np.float32(0)), np.float32(6)))


@pytest.mark.parametrize("radius", [1e-3, 0.3, 30.0])
def test_clamps_of_a_wide_ball_hold_every_execution(radius):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 24)).astype(np.float32)
    W = (rng.standard_normal((24, 40)) / 4).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    xin = fpx.Interval(x.astype(np.float64) - radius, x.astype(np.float64) + radius, value=x)
    outs = fpx.interval(_gate(W, b))(xin)
    for p in _points(xin.lo, xin.hi, x, rng):
        for out, y in zip(outs, _gate_numpy(p, W, b)):
            assert out.contains(y).all()
        z = p.astype(np.float64) @ W.astype(np.float64) + b       # exact in float64
        g = np.clip(z + 3, 0, 6)
        for out, y in zip(outs, (g / 6, z * g / 6, np.clip(z, 0, 6))):
            assert ((out.lo <= y) & (y <= out.hi)).all()


def _ln_runs(p, w, b, eps):
    """float32 layer norms of the rows of p: two-pass, Welford's updating mean and variance,
    and the one-pass form as PyTorch's kernel computes rstd·w then x·(rstd·w) + (b - μ·rstd·w)."""
    f = np.float32
    mu = p.mean(axis=-1, dtype=f, keepdims=True)
    var = ((p - mu) * (p - mu)).mean(axis=-1, dtype=f, keepdims=True)
    s = np.sqrt(var + f(eps))
    yield (p - mu) / s * w + b
    m, M = np.zeros_like(mu), np.zeros_like(mu)
    for k in range(p.shape[-1]):                          # Welford
        d = p[..., k:k + 1] - m
        m = m + d / f(k + 1)
        M = M + d * (p[..., k:k + 1] - m)
    rstd = f(1) / np.sqrt(M / f(p.shape[-1]) + f(eps))
    scale = rstd * w
    yield p * scale + (b - m * scale)


@pytest.mark.parametrize("eps,radius", [(1e-6, 300.0), (1e-6, 3.0), (1e-5, 3e4)])
def test_layer_norm_of_a_wide_box_with_a_small_eps_holds_every_execution(eps, radius):
    # a box whose rows' spread may vanish while their mean is large: there the program's
    # variance is its rounding error, and (x_i - μ')/sqrt(eps) reaches far past sqrt(n)
    rng = np.random.default_rng(5)
    n = 192
    x = rng.standard_normal((3, n)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    b = (0.1 * rng.standard_normal(n)).astype(np.float32)
    xin = fpx.Interval(x.astype(np.float64) - radius, x.astype(np.float64) + radius, value=x)
    out = fpx.interval(lambda h: fnn.layer_norm(h, n, w, b, eps))(xin)
    # tight too where the rule's error terms for the box (γ_{2n+8}·sqrt(mean x²)·σ) exceed
    # eps: the a priori range pays them from s'² >= (1-δ)·eps - η (var' >= 0) instead of
    # giving up (|y - b| was ~1e6 at eps 1e-6, radius 300): |x_i - μ'| <= sqrt(n)·σ1 + e_μ,
    # σ1 ~ 1.5·γ_{2n+8}(2^-24)·max|x|, and the normalized value stays below this q
    q = 3 * np.sqrt(n) * (2 * n + 8) * 2.0 ** -24 * (radius + 4) / np.sqrt(eps) + np.sqrt(n)
    reach = q * np.abs(w.astype(np.float64)) + np.abs(b) + 1e-3
    assert np.all(out.hi <= reach) and np.all(out.lo >= -reach)
    pts = _points(xin.lo, xin.hi, x, rng, k=16)
    for c in (0.999, 0.5, -0.999):                   # near-constant rows with a large mean
        base = np.full_like(x, np.float32(c * radius))
        pts.append(base + rng.standard_normal(x.shape).astype(np.float32) * np.float32(1e-3))
        pts.append(base + np.float32(radius * 1e-6) * np.sign(rng.standard_normal(x.shape))
                   .astype(np.float32))
    with np.errstate(all="ignore"):
        for p in pts:
            p = np.where((p >= xin.lo) & (p <= xin.hi), p, x).astype(np.float32)
            for y in _ln_runs(p, w, b, eps):
                assert out.contains(y).all()


@pytest.mark.slow      # (torch's import and export: ~15 s)
def test_torch_hardswish_and_hardsigmoid_modules_hold_torch_executions():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.Hardswish(), nn.Linear(32, 8), nn.Hardsigmoid(),
                      nn.Linear(8, 4), nn.ReLU6()).eval()
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    r = 2.0
    xin = fpx.Interval(x.astype(np.float64) - r, x.astype(np.float64) + r,
                       value=torch.from_numpy(x))
    out = fpx.interval(m)(xin)
    lo, hi = np.asarray(out.lo), np.asarray(out.hi)
    with torch.no_grad():
        for p in _points(xin.lo, xin.hi, x, rng):
            y = m(torch.from_numpy(p)).double().numpy()
            assert ((lo <= y) & (y <= hi)).all()


def _gated_runs(p, kind):
    """float32 executions at the points p: the decomposition as NumPy computes it, and
    torch's own kernels where torch is importable."""
    from scipy import special
    f = np.float32
    with np.errstate(all="ignore"):
        if kind == "hardswish":
            yield p * np.minimum(np.maximum(p + f(3), f(0)), f(6)) / f(6)
        elif kind == "silu":
            yield p * (f(1) / (f(1) + np.exp(-p)))
        elif kind == "gelu":
            yield p * f(0.5) * (f(1) + special.erf(p * f(0.7071067811865476)))
        else:
            inner = f(0.7978845608028654) * (p + f(0.044715) * p * p * p)
            yield f(0.5) * p * (f(1) + np.tanh(inner))
    try:
        import torch
    except Exception:
        return
    t = torch.from_numpy(np.ascontiguousarray(p))
    F = torch.nn.functional
    yield (F.silu(t) if kind == "silu" else F.hardswish(t) if kind == "hardswish" else
           F.gelu(t, approximate="none" if kind == "gelu" else "tanh")).numpy()


def _gated_exact(p, kind):
    import mpmath
    out = []
    for t in p.ravel().astype(np.float64):
        x = mpmath.mpf(float(t))
        if kind == "hardswish":
            y = x * min(max(x + 3, 0), 6) / 6
        elif kind == "silu":
            y = x / (1 + mpmath.exp(-x))
        elif kind == "gelu":
            y = x / 2 * (1 + mpmath.erf(x / mpmath.sqrt(2)))
        else:
            y = x / 2 * (1 + mpmath.tanh(mpmath.sqrt(2 / mpmath.pi) * (x + mpmath.mpf(0.044715) * x ** 3)))
        out.append(float(y))
    return np.array(out).reshape(p.shape)


#: the least value of each function, and the floor its piecewise bound keeps over a wide box
#: (hardswish's pieces on [-3, 0] pair a with g(b): >= -5/12)
FLOORS = {"silu": (-0.279, -0.558), "gelu": (-0.170, -0.340), "gelu_tanh": (-0.170, -0.340),
          "hardswish": (-0.375, -5 / 12 * (1 + 2.0 ** -20))}


@pytest.mark.parametrize("kind", ["silu", "gelu", "gelu_tanh", "hardswish"])
def test_self_gated_activations_of_wide_boxes_are_bounded_piecewise_and_hold_every_execution(
        kind):
    rng = np.random.default_rng(11)
    v = np.concatenate([rng.standard_normal(40) * 4, [0.5, -1.0, -20.0, 3.0, -0.7, 80.0]]
                       ).astype(np.float32)
    r = np.concatenate([rng.random(40) * 30, [30.0, 2.0, 5.0, 1e-3, 0.05, 100.0]])
    x = fpx.Interval(v - r, v + r, value=v)
    f = {"silu": fnn.silu, "gelu": fnn.gelu, "hardswish": fnn.hardswish,
         "gelu_tanh": lambda t: fnn.gelu(t, approximate="tanh")}[kind]
    out = fpx.interval(f)(x)
    # every value of silu (gelu, hardswish) is >= -0.279 (-0.170, -0.375): the pieces keep
    # the lower bound near it where the decomposition over the whole box gave about lo/2
    # (silu: lo·σ(hi); hardswish: lo)
    wide = (x.lo < -0.5) & (x.hi - x.lo >= 2.0 ** -4)
    assert np.all(out.lo[wide] >= FLOORS[kind][1])
    assert np.all(out.hi <= np.maximum(x.hi, 0) * (1 + 1e-5) + 1e-6)
    for p in _points(x.lo, x.hi, v, rng, k=24):
        for y in _gated_runs(p, kind):
            assert out.contains(y).all()
        e = _gated_exact(p, kind)
        assert ((out.lo <= e) & (e <= out.hi)).all()


def test_a_clamp_that_cuts_a_wide_ball_gives_the_clamps_box():
    # hardsigmoid's clamp(z + 3, 0, 6) of a ball ±30 kept the ball (±30 about the value,
    # 1-Lipschitz) where every execution lies in [0, 6]; ReLU6 likewise
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 24)).astype(np.float32)
    W = (rng.standard_normal((24, 40)) / 4).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    r = 30.0
    xin = fpx.Interval(x.astype(np.float64) - r, x.astype(np.float64) + r, value=x)
    hsig, hswish, relu6 = fpx.interval(_gate(W, b))(xin)
    assert hsig.lo.min() >= -1e-6 and hsig.hi.max() <= 1 + 1e-6
    assert relu6.lo.min() >= 0 and relu6.hi.max() <= 6
    # z·g/6 with g in [0, 6]: no wider than z's own box (the ball gave ~|z|·|z|/6)
    z = fpx.interval(lambda h: fnp.add(fnp.matmul(h, W), b))(xin)
    assert np.all(hswish.hi - hswish.lo <= 1.01 * (np.maximum(np.abs(z.lo), np.abs(z.hi)) * 2))


@pytest.mark.slow      # (torch's import and export)
def test_a_torch_silu_reaches_the_piecewise_rule():
    # torch.export's default table decomposes aten.silu into x * sigmoid(x), which fpx then
    # bounded as a product of two intervals; kept, it maps to fpx.nn.silu and its rule
    torch = pytest.importorskip("torch")
    v = torch.tensor([0.5, -1.0, -20.0, 3.0])
    r = np.array([30.0, 2.0, 5.0, 1e-3])
    x = fpx.Interval(v.double().numpy() - r, v.double().numpy() + r, value=v)
    out = fpx.interval(torch.nn.SiLU())(x)
    assert np.all(np.asarray(out.lo)[:3] >= -0.6)
    with torch.no_grad():
        for p in _points(x.lo, x.hi, v.numpy(), np.random.default_rng(2)):
            y = torch.nn.functional.silu(torch.from_numpy(p)).double().numpy()
            assert ((np.asarray(out.lo) <= y) & (y <= np.asarray(out.hi))).all()


def test_hardswish_and_hardsigmoid_of_a_30_wide_box_are_near_their_images():
    # hardswish's image of [-30, 30] is [-0.375, 30]; its decomposition as one product of
    # intervals of x gave [-30, 30]. hardsigmoid is monotone: its image of [lo, hi] is
    # [g(lo), g(hi)], and the bound is that up to the program's roundings
    v = np.array([0.0, 1.0, -1.5, 10.0, -2.0], np.float32)
    r = np.array([30.0, 2.0, 1.5, 5.0, 0.5])
    x = fpx.Interval(v - r, v + r, value=v)
    hs = fpx.interval(fnn.hardswish)(x)
    whole = fpx.interval(lambda t: fnp.divide(fnp.multiply(
        t, fnp.minimum(fnp.maximum(fnp.add(t, np.float32(3)), np.float32(0)), np.float32(6))),
        np.float32(6)))(x)
    assert whole.lo[0] <= -30 + 1e-3                       # the dependency problem
    h = lambda t: t * np.clip(t + 3, 0, 6) / 6             # float64: exact enough here
    exact_lo = np.where((x.lo <= -1.5) & (x.hi >= -1.5), -0.375,
                        np.minimum(h(x.lo), h(x.hi)))
    exact_hi = np.maximum(h(x.lo), h(x.hi))
    assert np.all(hs.lo <= exact_lo) and np.all(hs.hi >= exact_hi)
    # the pieces on [-3, 0] pair each end with the gate's other end (-5/12, not -3/8), on
    # [0, inf) both factors are >= 0 and increasing: the upper end is exact there
    assert np.all(hs.lo >= -5 / 12 - 1e-6)
    up = x.hi >= 0
    assert np.all(hs.hi[up] <= exact_hi[up] * (1 + 2.0 ** -21))
    assert hs.lo[0] >= -0.42 and abs(hs.hi[0] - 30) <= 1e-5
    g = lambda t: np.clip(t + 3, 0, 6) / 6
    hsig = fpx.interval(fnn.hardsigmoid)(x)
    assert np.all(hsig.lo <= g(x.lo)) and np.all(hsig.hi >= g(x.hi))
    assert np.all(np.abs(hsig.lo - g(x.lo)) <= 2.0 ** -22)
    assert np.all(np.abs(hsig.hi - g(x.hi)) <= 2.0 ** -22)


def _hard_inputs(torch, dtype):
    """Wide random values, ties at ±3 and their neighbours, -1.5, ±0, ±inf, NaN, subnormals
    of each format, and values whose x·6 overflows float32 (or float16)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, 33, generator=g, dtype=torch.float64) * 8
    x[1] *= 1e3
    x[2] = torch.randn(33, generator=g, dtype=torch.float64) * 0.05 - 3
    x[3] = torch.randn(33, generator=g, dtype=torch.float64) * 0.05 + 3
    x = x.to(dtype)
    fi = torch.finfo(dtype)
    edges = [-3.0, 3.0, -1.5, 0.0, -0.0, float("inf"), -float("inf"), float("nan"),
             fi.tiny / 4, -fi.tiny / 4, fi.tiny, fi.max, -fi.max, fi.max / 5, fi.max / 7,
             float(torch.finfo(torch.float32).max) / 5]
    e = torch.tensor(edges, dtype=torch.float64).to(dtype)
    for c in (-3.0, 3.0):
        t = torch.tensor(c, dtype=dtype)
        e = torch.cat([e, torch.stack([torch.nextafter(t, t + 1), torch.nextafter(t, t - 1)])])
    x[4, :e.numel()] = e
    return x


@pytest.mark.parametrize("name", ["hardswish", "hardsigmoid"])
def test_torch_hardswish_and_hardsigmoid_cpu_outputs_lie_in_the_bound_for_every_dtype(name):
    # torch's CPU kernels: x * min(max(x + 3, 0), 6) / 6 (product first) and
    # min(max(x + 3, 0), 6) / 6, float16/bfloat16 through float32; -inf gives NaN (-inf * 0)
    torch = pytest.importorskip("torch")
    f = getattr(torch.nn.functional, name)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        x = _hard_inputs(torch, dtype)
        y = f(x)
        iv = fpx.interval(f)(x)
        val, yd = iv.value.double().numpy(), y.double().numpy()
        nan = np.isnan(yd)
        assert np.array_equal(np.isnan(val), nan), (name, dtype)
        with np.errstate(invalid="ignore"):                       # no finite claim there
            assert np.all(~np.isfinite(iv.hi - iv.lo)[nan]), (name, dtype)
        assert (iv.contains(yd) | nan).all(), (name, dtype)
        assert torch.equal(iv.value[~torch.from_numpy(nan)], y[~torch.from_numpy(nan)])
        # a box about every element: torch at points of it
        v = x.double().numpy()
        ok = np.isfinite(v) & (np.abs(v) < 1e4)
        v = np.where(ok, v, 0.0)
        box = fpx.Interval(v - 2.0, v + 2.0, value=torch.from_numpy(v).to(dtype))
        ib = fpx.interval(f)(box)
        for p in _points(box.lo, box.hi, v.astype(np.float32), np.random.default_rng(1), k=8):
            t = torch.from_numpy(p).to(dtype)                     # (rounded: maybe out)
            pin = (t.double().numpy() >= box.lo) & (t.double().numpy() <= box.hi)
            assert (ib.contains(f(t).double().numpy()) | ~pin).all(), (name, dtype)


def test_torch_linear_then_hardswish_of_a_wide_box_keeps_hardswishs_floor():
    # aten.hardswish kept whole by the export reaches the piecewise rule: the product of the
    # decomposition would give the linear layer's own lower end (about -30 here)
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Hardswish()).eval()
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    r = 10.0
    xin = fpx.Interval(x.astype(np.float64) - r, x.astype(np.float64) + r,
                       value=torch.from_numpy(x))
    out = fpx.interval(m)(xin)
    z = fpx.interval(m[0])(xin)
    assert np.asarray(z.lo).min() < -10
    assert np.asarray(out.lo).min() >= -5 / 12 - 1e-6
    assert np.all(np.asarray(out.hi) <= np.maximum(np.asarray(z.hi), 0) * (1 + 1e-5) + 1e-6)
    with torch.no_grad():
        for p in _points(xin.lo, xin.hi, x, np.random.default_rng(2)):
            y = m(torch.from_numpy(p)).double().numpy()
            assert out.contains(y).all()


def test_in_place_hardswish_under_the_dispatch_fallback_reaches_the_composite():
    # torch.export rejects the branch on a value: the module runs eagerly under the dispatch
    # mode, where aten.hardswish_ / hardsigmoid_ take the out-of-place ops' handlers
    torch = pytest.importorskip("torch")
    F = torch.nn.functional

    def f(x):
        y = F.hardswish(x * 2, inplace=True)
        return F.hardsigmoid(y, inplace=True) if y.sum() > 0 else y

    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(1))
    from fpx.interop.torch import program_for
    assert program_for(f, (x,)).mode == "dispatch"
    rec = fpx.trace(f)(x)
    assert "hardswish" in rec.primitives and "hardsigmoid" in rec.primitives
    iv = fpx.interval(f)(x)
    assert iv.contains(f(x.clone()).double().numpy()).all()


def _exact_range(lo, hi, W):
    """The exact range of ``x @ W`` over the box [lo, hi] (float32 data: every product exact
    in float64, each output's extreme corner summed exactly by math.fsum)."""
    import math
    lo, hi, W = (np.asarray(z, np.float64) for z in (lo, hi, W))
    M, K = lo.shape
    out_lo, out_hi = np.empty((M, W.shape[1])), np.empty((M, W.shape[1]))
    for i in range(M):
        a, b = lo[i][:, None] * W, hi[i][:, None] * W
        for j in range(W.shape[1]):
            out_lo[i, j] = math.fsum(np.minimum(a[:, j], b[:, j]))
            out_hi[i, j] = math.fsum(np.maximum(a[:, j], b[:, j]))
    return out_lo, out_hi


@pytest.mark.parametrize("op", ["matmul", "linear", "conv", "matmul64"])
def test_an_off_centre_box_through_a_contraction_holds_the_exact_range(op):
    """A box off-centre about the program's value (a ReLU's: [0, 0.5] about 0, [v - 0.5,
    v + 0.5] about v > 0) times point weights -- matmul, linear, conv, float32 and float64:
    the bound holds the exact range of every output (its extreme corner, summed exactly)."""
    rng = np.random.default_rng(11)
    if op == "conv":
        shape, w = (2, 4, 6, 6), rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    else:
        shape, w = (6, 48), rng.standard_normal((48, 16)).astype(np.float32)
    v = np.maximum(rng.standard_normal(shape), 0).astype(np.float32)
    lo, hi = np.maximum(v - 0.5, 0.0).astype(np.float64), v + 0.5
    if op == "matmul64":            # (float32 data in float64: products still exact)
        op, v, w = "matmul", v.astype(np.float64), w.astype(np.float64)
    X = fpx.Interval(lo, hi, v)
    if op == "matmul":
        f, W2, cols = (lambda x: fnp.matmul(x, w)), w, lambda z: z
    elif op == "linear":
        wt = np.ascontiguousarray(w.T)
        f, W2, cols = (lambda x: fnn.linear(x, wt)), w, lambda z: z
    else:
        from numpy.lib.stride_tricks import sliding_window_view
        f, W2 = (lambda x: fnn.conv2d(x, w)), w.reshape(5, -1).T

        def cols(z):                # im2col: (N·H'·W', C·3·3), conv's terms in w's order
            p = sliding_window_view(z, (3, 3), axis=(2, 3))        # N, C, H', W', 3, 3
            return p.transpose(0, 2, 3, 1, 4, 5).reshape(-1, W2.shape[0])
    y = fpx.interval(f)(X)
    ylo, yhi = np.asarray(y.lo), np.asarray(y.hi)
    if op == "conv":
        ylo, yhi = (z.transpose(0, 2, 3, 1).reshape(-1, 5) for z in (ylo, yhi))
    e_lo, e_hi = _exact_range(cols(lo), cols(hi), W2)
    assert np.all(ylo <= e_lo) and np.all(e_hi <= yhi)
