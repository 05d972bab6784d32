"""fpx.kernels.bf16: upper bounds of nonnegative sums of products from oneDNN's bfloat16
convolution (the interval radius): the upward rounding bit for bit, float32 accumulation. The
bound against exact sums is in test_nn (test_conv_upper_bf16_bounds_the_exact_sum)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fpx.nn as nn
from fpx import formats
from fpx.kernels import bf16 as _bf16
from fpx.kernels import conv as _kconv

F64, F32 = np.dtype(np.float64), np.dtype(np.float32)


def _torch_or_skip(need_native=True):
    torch = _kconv._torch()
    if not torch:
        pytest.skip("torch (oneDNN) is not installed")
    if need_native and not _bf16.native(torch):
        pytest.skip("oneDNN has no bfloat16 on this CPU")
    return torch


def test_round_up_is_the_smallest_bfloat16_not_below():
    """The radius's operands rounded up to bfloat16, bit for bit: fpx.formats.round(x,
    bfloat16, "ru") -- the project's general directed rounding, too slow for the hot path --
    for every x >= 2^-126 (past bfloat16's max: inf), nonzero subnormals up to 2^-126 (the
    bfloat16 instructions flush subnormal inputs), 0 -> 0, NaN -> NaN."""
    torch = _torch_or_skip(need_native=False)
    rng = np.random.default_rng(80)
    x = np.abs(np.concatenate([
        rng.standard_normal(4000) * 10.0 ** rng.integers(-40, 38, 4000),
        np.array([0.0, -0.0, 1.0, 1 + 2.0 ** -8, 1 + 2.0 ** -7, 1 + 2.0 ** -23, 2.0 ** -126,
                  2.0 ** -127, 2.0 ** -149, 3.0e38, 3.3961e38, np.finfo(F32).max, np.inf]),
        np.nextafter(np.float32(1.0), np.float32(2.0), dtype=F32) * np.ones(2),
    ])).astype(F32)
    x = np.append(x, np.float32(np.nan))
    y = _bf16.round_up(torch, x).float().numpy()
    normal = x >= 2.0 ** -126
    ru = np.asarray(formats.round(x[normal], formats.get(ml_dtypes.bfloat16), "ru"), F32)
    assert np.array_equal(y[normal], ru) and np.all(y[normal] >= x[normal])
    assert np.all(y[(x == 0)] == 0)
    assert np.all(y[(x > 0) & (x < 2.0 ** -126)] == 2.0 ** -126)
    assert np.isnan(y[-1])
    # the largest rounded magnitude, from the same pass: NaN if any, inf if any, else the max
    for arr, want in ((x, np.nan), (x[:-2], np.inf), (-x[:5], float(y[:5].max())),
                      (np.zeros(0, F32), 0.0)):
        got = _bf16.round_up(torch, arr, with_max=True)[1]
        assert (np.isnan(got) and np.isnan(want)) or got == want
    # the max runs in 16 lanes plus a scalar tail: the largest (or a NaN) in either part
    for n in (1, 15, 16, 17, 31, 33, 100):
        base = x[:n].copy()
        base[~np.isfinite(base)] = 1.0
        for at in {0, n // 2, n - 1}:
            for big in (np.float32(3.0e38), np.float32(np.nan)):
                arr = base.copy()
                arr[at] = big
                got = _bf16.round_up(torch, arr, with_max=True)[1]
                want = float(_bf16.round_up(torch, arr).float().numpy().max())
                assert (np.isnan(got) and np.isnan(big)) or got == want


@pytest.mark.parametrize("channels,taps", [(512, 3), (4096, 3), (32768, 1)])
def test_bfloat16_convolution_accumulates_in_float32(channels, taps):
    """The bound assumes float32 accumulation, then one rounding to bfloat16. With small
    integers every partial sum is exact in float32, so R must be the exact sum rounded to
    bfloat16 once; partial sums kept in bfloat16 (a blocked or split-K kernel storing into a
    bfloat16 output) would be off by many bfloat16 ulps at these k (up to 32768 terms)."""
    torch = _torch_or_skip()
    rng = np.random.default_rng(91)
    x = rng.integers(0, 8, (2, channels, 5, 5)).astype(F32)
    w = rng.integers(0, 8, (8, channels, taps, taps)).astype(F32)
    p = taps // 2
    R, f, a = _kconv.conv_upper_bf16(x, w, None, (1, 1), ((p, p), (p, p)), (1, 1), 1)
    exact = nn.conv(x.astype(F64), w.astype(F64), padding=p)
    assert 2 ** 12 < exact.max() < 2 ** 24     # bfloat16 rounds, float32 is exact
    assert np.array_equal(R, exact.astype(ml_dtypes.bfloat16).astype(F32))
    assert np.all(R * f + a >= exact)


@pytest.mark.parametrize("k", [512, 4096, 32768])
def test_bfloat16_matmul_accumulates_in_float32(k):
    """The matmul radius (``matmul_upper``, torch's bfloat16 GEMM on oneDNN) under the same
    assumption as the convolution's: sums of small integers come out as the exact sum rounded
    to bfloat16 once (partial sums kept in bfloat16 would be many ulps off), on torch's threads,
    whose count it leaves alone."""
    torch = _torch_or_skip()
    rng = np.random.default_rng(92)
    a = rng.integers(0, 8, (64, k)).astype(F32)
    b = rng.integers(0, 8, (k, 48)).astype(F32)
    threads = torch.get_num_threads()
    R, f, ab = _bf16.matmul_upper(torch, a, b)
    assert torch.get_num_threads() == threads
    exact = a.astype(F64) @ b.astype(F64)
    assert 2 ** 12 < exact.max() < 2 ** 24
    assert np.array_equal(R, exact.astype(ml_dtypes.bfloat16).astype(F32))
    assert np.all(R * f + ab >= exact)


@pytest.mark.parametrize("layout", ["plain", "transposed-b", "head-split", "batched-permuted"])
@pytest.mark.parametrize("scale", ["normal", "tiny", "huge", "sparse", "signed"])
def test_bfloat16_matmul_upper_bounds_the_exact_sum(layout, scale):
    """``matmul_upper``: R·f + a >= |a| @ |b| in exact arithmetic (the float64 product plus
    its own error) for operands of every layout the interval rules pass (a linear layer's
    transposed weights, attention's head-split activations and permuted batches), magnitudes
    near underflow and overflow, ReLU zeros and negative values (their magnitudes count);
    at most ~3% above where nothing is near underflow; the permuted operands come back
    unchanged."""
    torch = _torch_or_skip()
    rng = np.random.default_rng(93)
    mag = {"normal": 1.0, "tiny": 1e-36, "huge": 1e17, "sparse": 1.0, "signed": 1.0}[scale]

    def arr(*shape):
        x = rng.standard_normal(shape) * mag
        if scale == "sparse":
            x[rng.random(shape) < 0.7] = 0.0
        return (x if scale == "signed" else np.abs(x)).astype(F32)
    if layout == "plain":
        a, b = arr(40, 300), arr(300, 24)
    elif layout == "transposed-b":
        a, b = arr(2, 20, 300), arr(24, 300).T
    elif layout == "head-split":
        a, b = arr(2, 20, 300).transpose(1, 0, 2), arr(300, 24)
    else:
        a, b = arr(3, 4, 20, 60), arr(60, 3, 4, 24).transpose(1, 2, 0, 3)
    a0, b0 = a.copy(), b.copy()
    R, f, ab = _bf16.matmul_upper(torch, a, b)
    S = np.matmul(np.abs(a).astype(F64), np.abs(b).astype(F64))
    K = a.shape[-1]
    exact_hi = S * (1 + 2 * (K + 2) * 2.0 ** -53)
    assert R.shape == S.shape and np.all(R.astype(F64) * f + ab >= exact_hi)
    if scale != "tiny":
        assert np.all(R.astype(F64) * f + ab <= S * 1.03 + 1e-30)
    assert np.array_equal(a, a0) and np.array_equal(b, b0)


def test_interval_matmul_and_linear_with_bfloat16_radius_are_sound():
    """Large enough float32 GEMMs (>= 2^21 products) take the bfloat16 radius where the CPU
    has AMX: an interval activation times weights (matmul and fpx.nn.linear, with a bias in
    the sum) and an interval times an interval hold the exact results at the box's ends and
    float32 runs in two summation orders."""
    torch = _torch_or_skip()
    if not _bf16.amx(torch):
        pytest.skip("no AMX: the float32 radius GEMM runs")
    import fpx
    calls = []
    real = _bf16.matmul_upper
    rng = np.random.default_rng(94)
    x = rng.standard_normal((64, 512)).astype(F32)
    w = (rng.standard_normal((512, 256)) * 0.05).astype(F32)
    b = rng.standard_normal(256).astype(F32)
    xi = fpx.Interval.around(x, rel=1e-3)
    y = rng.standard_normal((512, 128)).astype(F32)
    yi = fpx.Interval.around(y, rel=1e-3)
    try:
        _bf16.matmul_upper = lambda *a, **k: calls.append(a[1].shape) or real(*a, **k)
        mm = fpx.interval(lambda h: h @ w)(xi)
        lin = fpx.interval(lambda h: nn.linear(h, w.T, b, bias_in_sum=True))(xi)
        ii = fpx.interval(lambda h, g: h @ g)(xi, yi)
    finally:
        _bf16.matmul_upper = real
    assert len(calls) == 3
    X, W, B, Y = (z.astype(F64) for z in (x, w, b, y))
    for t in (0.0, 1.0):
        h = xi.lo + t * (xi.hi - xi.lo)
        assert mm.contains(h @ W).all() and lin.contains(h @ W + B).all()
        assert ii.contains(h @ (yi.lo + t * (yi.hi - yi.lo))).all()
    p = x[:, :, None] * w[None, :, :]
    for order in (slice(None), slice(None, None, -1)):
        s = np.cumsum(p[:, order], axis=1, dtype=F32)[:, -1]
        assert mm.contains(s).all() and lin.contains((s + b).astype(F32)).all()
    assert mm.contains(x @ w).all() and ii.contains(x @ y).all()


def test_interval_matmul_with_bfloat16_radius_and_special_weights():
    """Weights with a NaN and a column near float32's overflow under the fused path's
    bfloat16 radius (the value-centred path steps aside for a non-finite value): the NaN
    column's bounds are not finite (unknown), the overflowing column unbounded where the
    program overflows, and the finite columns keep finite bounds holding the exact results
    at the box's ends; huge finite weights still bound soundly."""
    torch = _torch_or_skip()
    if not _bf16.amx(torch):
        pytest.skip("no AMX: the float32 radius GEMM runs")
    import fpx
    rng = np.random.default_rng(95)
    x = rng.standard_normal((64, 512)).astype(F32)
    w = (rng.standard_normal((512, 256)) * 0.05).astype(F32)
    xi = fpx.Interval.around(x, rel=1e-3)
    for special in ("nan", "huge", "both"):
        ws = w.copy()
        if special in ("nan", "both"):
            ws[3, 5] = np.nan
        if special in ("huge", "both"):
            ws[:, 7] = 3e37
        with np.errstate(all="ignore"):
            out = fpx.interval(lambda h: h @ ws)(xi)
            v = x @ ws
        if special in ("nan", "both"):
            assert np.isnan(v[:, 5]).all() and not np.isfinite(out.lo[:, 5]).any() \
                and not np.isfinite(out.hi[:, 5]).any()
        if special in ("huge", "both"):
            over = ~np.isfinite(v[:, 7])
            assert over.any() and (out.lo[over, 7] == -np.inf).all() \
                and (out.hi[over, 7] == np.inf).all()
        ok = [j for j in range(256) if j not in (5, 7)]
        assert np.isfinite(out.lo[:, ok]).all() and np.isfinite(out.hi[:, ok]).all()
        with np.errstate(all="ignore"):
            for t in (0.0, 1.0):
                e = (xi.lo + t * (xi.hi - xi.lo)) @ ws.astype(F64)
                assert np.all((out.lo[:, ok] <= e[:, ok]) & (e[:, ok] <= out.hi[:, ok]))
    # a finite program with huge weights: the guard's max comes from the weights themselves
    wh = w * np.float32(1e30)
    out = fpx.interval(lambda h: h @ wh)(xi)
    assert out.contains(x @ wh).all()
    for t in (0.0, 1.0):
        assert out.contains((xi.lo + t * (xi.hi - xi.lo)) @ wh.astype(F64)).all()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("data", ["normal", "relu", "cancel", "tiny", "wide-range"])
def test_bfloat16_radius_paths_are_sound_on_adversarial_data(data, seed):
    """Random matmul / linear / interval @ interval programs large enough for the bfloat16
    radius (where AMX runs it; the float32 one elsewhere), on data that stresses it: ReLU
    zeros, cancelling sums, values near float32's underflow, magnitudes over 60 decades. The
    bounds hold float64 evaluations at the boxes' ends and midpoints (fsum-exact for the
    products' sums where it matters: the float64 GEMM's own error is added to the check) and
    float32 runs of the program in two summation orders."""
    import fpx
    rng = np.random.default_rng(1000 + seed)
    M, K, N = 48, 384, 128

    def make(shape):
        x = rng.standard_normal(shape)
        if data == "relu":
            x = np.maximum(x, 0)
        elif data == "cancel":
            x = x + 50.0 * np.sign(rng.standard_normal(shape[-1:]))
        elif data == "tiny":
            x = x * 1e-36
        elif data == "wide-range":
            x = x * 10.0 ** rng.uniform(-30, 30, shape)
        return x.astype(F32)
    x, w, y = make((M, K)), make((K, N)) * np.float32(0.1), make((K, N))
    b = make((N,))
    rel = 10.0 ** rng.uniform(-6, -2)
    xi = fpx.Interval.around(x, rel=rel)
    yi = fpx.Interval.around(y, rel=rel)
    with np.errstate(all="ignore"):
        W64, B64 = w.astype(F64), b.astype(F64)
        progs = [(lambda h: h @ w, (xi,), lambda h: h @ W64, lambda h: h @ np.abs(W64)),
                 (lambda h: nn.linear(h, w.T, b, bias_in_sum=True), (xi,),
                  lambda h: h @ W64 + B64, lambda h: h @ np.abs(W64) + np.abs(B64)),
                 (lambda h, g: h @ g, (xi, yi), lambda h, g: h @ g, lambda h, g: h @ g)]
        for f, args, exact, magnitude in progs:
            out = fpx.interval(f)(*args)
            ends = [[a.lo, a.hi, (a.lo + a.hi) / 2] for a in args]
            # the float64 check's own error: γ_{K+1}(u64)·Σ|h||g| (+ |b|)
            mag = magnitude(*[np.maximum(np.abs(a.lo), np.abs(a.hi)) for a in args])
            err = mag * (K + 2) * 2.0 ** -52
            for k in range(3):
                pts = [e[k] for e in ends]
                e = exact(*pts)
                ok = (out.lo <= e + err) & (e - err <= out.hi)
                assert ok.all(), (data, seed, f, k)
            v32 = f(*[np.asarray(a.value) for a in args])
            fin = np.isfinite(v32)          # (an overflowing run is NaN: never "contained")
            assert out.contains(v32)[fin].all()
        # a point activation (a linear layer's split-K centre, its radius GEMM in float32)
        out = fpx.interval(lambda h: nn.linear(h, w.T, b, bias_in_sum=True))(x)
        X64 = x.astype(F64)
        e, err = X64 @ W64 + B64, (np.abs(X64) @ np.abs(W64) + np.abs(B64)) * (K + 2) * 2.0 ** -52
        assert ((out.lo <= e + err) & (e - err <= out.hi)).all(), (data, seed)
        v32 = nn.linear(x, w.T, b, bias_in_sum=True)
        assert out.contains(v32)[np.isfinite(v32)].all()
        out = fpx.interval(lambda h: h @ w)(xi)
        p = x[:, :, None] * w[None, :, :]
        for order in (slice(None), slice(None, None, -1)):
            s = np.cumsum(p[:, order], axis=1, dtype=F32)[:, -1]
            assert out.contains(s)[np.isfinite(s)].all()


def test_matmul_upper_restores_torch_threads_under_concurrent_calls():
    """The bfloat16 GEMM runs on one torch thread and restores the caller's setting, also
    when several Python threads call it at once (a lock: otherwise one could restore
    another's 1 and leave torch on one thread)."""
    torch = _torch_or_skip()
    from concurrent.futures import ThreadPoolExecutor
    before = torch.get_num_threads()
    a = np.random.default_rng(96).random((64, 256)).astype(F32)
    b = np.random.default_rng(97).random((256, 32)).astype(F32)
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda _: _bf16.matmul_upper(torch, a, b)[0], range(16)))
    assert torch.get_num_threads() == before
    assert all(np.array_equal(o, outs[0]) for o in outs)

