"""fpx.nn: each composite against an independent float64 reference (plain NumPy loops and
formulas written here), dtype preservation, tracing (bit-identical, composite named, conv as one
matmul), bad input, IEEE special values, and a small CNN."""
import itertools
import math

import ml_dtypes
import numpy as np
import pytest

import fpx
import fpx.nn as nn
from fpx.kernels import bf16 as _bf16
from fpx.kernels import conv as _kconv

BF16 = np.dtype(ml_dtypes.bfloat16)
F64, F32, F16 = np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16)
LOW = [F32, F16, BF16]
ALL = [F64] + LOW
# relative tolerance (against the largest reference magnitude for the absolute part)
TOL = {F64: 1e-12, F32: 3e-6, F16: 5e-3, BF16: 3e-2}


def rnd(shape, seed, scale=1.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale


def lowp(a, dt):
    """``a`` rounded to ``dt`` (the test input) and the same values in float64 (for the
    reference)."""
    x = np.asarray(a).astype(dt)
    return x, x.astype(np.float64)


def check(y, ref, dt, tol=None):
    assert y.dtype == dt, (y.dtype, dt)
    ref = np.asarray(ref, dtype=np.float64)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    t = TOL[dt] if tol is None else tol
    big = float(np.max(np.abs(ref[np.isfinite(ref)]), initial=0.0)) or 1.0
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=t, atol=t * big)


def bits_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


# ============================================================================================
# independent references (float64, loops/formulas)
# ============================================================================================
def ref_pads(padding, ks, dil, nd):
    if padding == "valid":
        return [(0, 0)] * nd
    if padding == "same":
        out = []
        for k, d in zip(ks, dil):
            t = d * (k - 1)
            out.append((t // 2, t - t // 2))
        return out
    if isinstance(padding, int):
        return [(padding, padding)] * nd
    return [p if isinstance(p, tuple) else (p, p) for p in padding]


def tup(v, nd):
    return (v,) * nd if isinstance(v, int) else tuple(v)


def ref_conv(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """Direct definition:
    y[n,o,pos] = b[o] + sum_{c,off} xpad[n, g*Cg+c, pos*s + off*d] w[o,c,off]."""
    nd = w.ndim - 2
    s, d = tup(stride, nd), tup(dilation, nd)
    ks = w.shape[2:]
    pads = ref_pads(padding, ks, d, nd)
    xp = np.pad(x, [(0, 0), (0, 0)] + pads)
    N, O, Cg = x.shape[0], w.shape[0], w.shape[1]
    Og = O // groups
    out = [(xp.shape[2 + i] - d[i] * (ks[i] - 1) - 1) // s[i] + 1 for i in range(nd)]
    y = np.zeros((N, O, *out))
    for n in range(N):
        for o in range(O):
            g = o // Og
            for pos in np.ndindex(*out):
                acc = 0.0 if b is None else b[o]
                for c in range(Cg):
                    for off in np.ndindex(*ks):
                        src = tuple(pos[i] * s[i] + off[i] * d[i] for i in range(nd))
                        acc += xp[(n, g * Cg + c) + src] * w[(o, c) + off]
                y[(n, o) + pos] = acc
    return y


def ref_pool(x, k, stride, padding, op, dilation=1, count_include_pad=True):
    nd = x.ndim - 2
    k, p, d = tup(k, nd), tup(padding, nd), tup(dilation, nd)
    s = k if stride is None else tup(stride, nd)
    out = [(x.shape[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(nd)]
    y = np.zeros(x.shape[:2] + tuple(out))
    for n, c in np.ndindex(*x.shape[:2]):
        for pos in np.ndindex(*out):
            vals, inside = [], 0
            for off in np.ndindex(*k):
                src = tuple(pos[i] * s[i] + off[i] * d[i] - p[i] for i in range(nd))
                if all(0 <= src[i] < x.shape[2 + i] for i in range(nd)):
                    vals.append(x[(n, c) + src])
                    inside += 1
                else:
                    vals.append(-math.inf if op == "max" else 0.0)
            if op == "max":
                v = -math.inf
                for t in vals:
                    v = t if (t > v or math.isnan(t)) and not math.isnan(v) else v
                y[(n, c) + pos] = v
            else:
                y[(n, c) + pos] = sum(vals) / (math.prod(k) if count_include_pad else inside)
    return y


def ref_softmax(x, axis=-1):
    x = np.moveaxis(x, axis, -1)
    out = np.empty_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        row = x[idx]
        m = max(row)
        e = [math.exp(v - m) for v in row]
        tot = sum(e)
        out[idx] = [v / tot for v in e]
    return np.moveaxis(out, -1, axis)


def ref_log_softmax(x, axis=-1):
    x = np.moveaxis(x, axis, -1)
    out = np.empty_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        row = x[idx]
        m = max(row)
        lse = m + math.log(sum(math.exp(v - m) for v in row))
        out[idx] = [v - lse for v in row]
    return np.moveaxis(out, -1, axis)


def ref_sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    L, E = q.shape[-2:]
    S = k.shape[-2]
    sc = 1 / math.sqrt(E) if scale is None else scale
    bshape = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (np.broadcast_to(a, bshape + a.shape[-2:]) for a in (q, k, v))
    if mask is not None:
        mask = np.broadcast_to(mask, bshape + (L, S))
    out = np.zeros(bshape + (L, v.shape[-1]))
    for bi in np.ndindex(*bshape):
        for i in range(L):
            sco = []
            for j in range(S):
                t = sum(q[bi][i, e] * k[bi][j, e] for e in range(E)) * sc
                if is_causal and j > i:
                    t = -math.inf
                if mask is not None:
                    mv = mask[bi][i, j]
                    if mask.dtype == bool:
                        t = t if mv else -math.inf
                    else:
                        t = t + mv
                sco.append(t)
            if all(t == -math.inf for t in sco):
                continue  # fully masked: 0 (PyTorch's math backend)
            m = max(sco)
            p = [math.exp(t - m) for t in sco]
            tot = sum(p)
            for j in range(S):
                out[bi][i] += p[j] / tot * v[bi][j]
    return out


# ============================================================================================
# activations
# ============================================================================================
ACT_REFS = {
    "relu": lambda t: max(t, 0.0),
    "sigmoid": lambda t: 1 / (1 + math.exp(-t)),
    "silu": lambda t: t / (1 + math.exp(-t)),
    "gelu": lambda t: 0.5 * t * (1 + math.erf(t / math.sqrt(2))),
    "gelu_tanh": lambda t: 0.5 * t * (1 + math.tanh(math.sqrt(2 / math.pi)
                                                    * (t + 0.044715 * t ** 3))),
}
ACT_FNS = {"relu": nn.relu, "sigmoid": nn.sigmoid, "silu": nn.silu, "gelu": nn.gelu,
           "gelu_tanh": lambda x: nn.gelu(x, approximate="tanh")}


@pytest.mark.parametrize("dt", ALL, ids=str)
@pytest.mark.parametrize("name", list(ACT_REFS))
def test_activations(name, dt):
    x, x64 = lowp(rnd((5, 7), 1, 3.0), dt)
    ref = np.vectorize(ACT_REFS[name])(x64)
    check(ACT_FNS[name](x), ref, dt)


def test_gelu_bad_approximate():
    with pytest.raises(ValueError, match="approximate"):
        nn.gelu(np.ones(3), approximate="fast")


def test_activation_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0])
    with np.errstate(invalid="ignore", over="ignore"):
        assert np.array_equal(nn.relu(x), [np.nan, np.inf, 0, 0, 0], equal_nan=True)
        assert np.array_equal(nn.sigmoid(x), [np.nan, 1, 0, 0.5, 0.5], equal_nan=True)
        assert np.array_equal(nn.gelu(x)[:2], [np.nan, np.inf], equal_nan=True)
        assert np.array_equal(nn.gelu(x, "tanh")[:2], [np.nan, np.inf], equal_nan=True)
        # -inf * 0 = NaN, the IEEE value of the formulas (as PyTorch's x * sigmoid(x))
        assert np.isnan(nn.silu(x)[2])
        assert np.isnan(nn.gelu(x)[2])


# ============================================================================================
# softmax family
# ============================================================================================
@pytest.mark.parametrize("dt", ALL, ids=str)
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_log_softmax(dt, axis):
    x, x64 = lowp(rnd((4, 6, 5), 2, 4.0), dt)
    check(nn.softmax(x, axis=axis), ref_softmax(x64, axis), dt)
    check(nn.log_softmax(x, axis=axis), ref_log_softmax(x64, axis), dt)


def test_softmax_special_values():
    x = np.array([[1.0, np.inf, 2.0], [1.0, -np.inf, 2.0], [-np.inf] * 3, [1.0, np.nan, 2.0]])
    with np.errstate(invalid="ignore"):
        s, ls = nn.softmax(x), nn.log_softmax(x)
    assert np.isnan(s[0]).all()                    # +inf in a row: NaN (as PyTorch)
    assert s[1, 1] == 0 and np.isfinite(s[1]).all()  # -inf entry: 0 there
    np.testing.assert_allclose(s[1, [0, 2]], ref_softmax(np.array([1.0, 2.0])))
    assert np.isnan(s[2]).all()                    # all -inf: NaN
    assert np.isnan(s[3]).all()                    # NaN propagates to the row
    assert np.isnan(ls[0]).all() and np.isnan(ls[2]).all() and np.isnan(ls[3]).all()
    assert ls[1, 1] == -np.inf and np.isfinite(ls[1, [0, 2]]).all()


# ============================================================================================
# normalization
# ============================================================================================
@pytest.mark.parametrize("dt", ALL, ids=str)
def test_layer_norm(dt):
    a = rnd((3, 4, 5), 3, 2.0) + 1.5
    x, x64 = lowp(a, dt)
    w, w64 = lowp(rnd((4, 5), 4), dt)
    b, b64 = lowp(rnd((4, 5), 5), dt)
    ref = np.empty_like(x64)
    for i in range(3):
        blk = x64[i]
        mu = sum(blk.ravel()) / blk.size
        var = sum((t - mu) ** 2 for t in blk.ravel()) / blk.size
        ref[i] = (blk - mu) / math.sqrt(var + 1e-5) * w64 + b64
    check(nn.layer_norm(x, (4, 5), w, b), ref, dt)
    check(nn.layer_norm(x, axis=(1, 2), weight=w, bias=b), ref, dt)
    # last dim only, no affine
    ref1 = np.empty_like(x64)
    for idx in np.ndindex(3, 4):
        r = x64[idx]
        mu = r.mean()
        ref1[idx] = (r - mu) / math.sqrt(((r - mu) ** 2).mean() + 1e-5)
    check(nn.layer_norm(x, 5), ref1, dt)
    check(nn.layer_norm(x), ref1, dt)


def test_layer_norm_bad_shape():
    with pytest.raises(ValueError, match="normalized_shape"):
        nn.layer_norm(np.ones((3, 4)), (3,))
    with pytest.raises(ValueError, match="not both"):
        nn.layer_norm(np.ones((3, 4)), 4, axis=-1)


@pytest.mark.parametrize("dt", ALL, ids=str)
def test_batch_norm(dt):
    """Inference batch norm against the float64 formula, on axis 1 and on the last axis."""
    x, x64 = lowp(rnd((2, 4, 3, 5), 8, 2.0), dt)
    m, m64 = lowp(rnd(4, 9), dt)
    v, v64 = lowp(np.abs(rnd(4, 10)) + 0.5, dt)
    w, w64 = lowp(rnd(4, 11), dt)
    b, b64 = lowp(rnd(4, 12), dt)
    sh = (1, 4, 1, 1)
    ref = (x64 - m64.reshape(sh)) / np.sqrt(v64.reshape(sh) + 1e-5) * w64.reshape(sh) \
        + b64.reshape(sh)
    check(nn.batch_norm(x, m, v, w, b), ref, dt)
    check(nn.batch_norm(x, m, v), (x64 - m64.reshape(sh)) / np.sqrt(v64.reshape(sh) + 1e-5), dt)
    xt, xt64 = lowp(rnd((3, 4), 13), dt)
    check(nn.batch_norm(xt, m, v, w, b, eps=1e-3, axis=-1),
          (xt64 - m64) / np.sqrt(v64 + 1e-3) * w64 + b64, dt)


def test_batch_norm_is_torchs_arithmetic_and_checks_shapes():
    """torch's CPU inference kernel to round-off where torch is installed (both: alpha, beta
    per channel, then x·alpha + beta -- torch may fuse the last two into an FMA); statistics
    of the wrong length are refused; NaN stays."""
    x = rnd((2, 3, 4, 4), 14).astype(F32)
    m, v, w, b = (rnd(3, 15 + i).astype(F32) for i in range(4))
    v = np.abs(v) + 0.1
    y = nn.batch_norm(x, m, v, w, b)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        t = torch.nn.functional.batch_norm(*(torch.from_numpy(a) for a in (x, m, v, w, b)),
                                           training=False, eps=1e-5).numpy()
        alpha, beta = nn.batch_norm_coefficients(m, v, w, b, 1e-5, F32, 4, 1)
        mag = np.abs(x * alpha.astype(F64)) + np.abs(beta.astype(F64))
        assert np.all(np.abs(y.astype(F64) - t) <= 4 * 2.0 ** -24 * mag)
    with pytest.raises(ValueError, match="mean must have shape"):
        nn.batch_norm(x, m[:2], v)
    with pytest.raises(ValueError, match="weight must have shape"):
        nn.batch_norm(x, m, v, w[:2])
    xn = x.copy()
    xn[0, 1, 2, 3] = np.nan
    assert np.isnan(nn.batch_norm(xn, m, v, w, b)[0, 1, 2, 3])


@pytest.mark.parametrize("dt", ALL, ids=str)
def test_rms_norm(dt):
    x, x64 = lowp(rnd((3, 8), 6, 2.0), dt)
    w, w64 = lowp(rnd(8, 7), dt)
    ref = np.empty_like(x64)
    for i in range(3):
        r = x64[i]
        ref[i] = r / math.sqrt(sum(t * t for t in r) / r.size + 1e-6) * w64
    check(nn.rms_norm(x, w), ref, dt)
    check(nn.rms_norm(x, axis=0), x64 / np.sqrt((x64 ** 2).mean(0, keepdims=True) + 1e-6), dt)


# ============================================================================================
# conv
# ============================================================================================
# (x shape, w shape, kwargs)
CONV_CASES = {
    "1d-basic": ((2, 3, 11), (4, 3, 3), {}),
    "1d-s2-p1-d2-g2": ((2, 4, 12), (6, 2, 3), dict(stride=2, padding=1, dilation=2, groups=2)),
    "1d-same-even-k": ((2, 3, 9), (2, 3, 4), dict(padding="same")),
    "2d-basic": ((2, 3, 7, 8), (4, 3, 3, 3), {}),
    "2d-stride2-pad1": ((2, 3, 7, 8), (5, 3, 3, 3), dict(stride=2, padding=1)),
    "2d-dil2-pad2": ((1, 2, 9, 8), (3, 2, 3, 3), dict(dilation=2, padding=2)),
    "2d-groups2-asym": ((2, 4, 7, 6), (6, 2, 3, 2), dict(groups=2, stride=(2, 1), padding=(1, 2))),
    "2d-depthwise-same": ((2, 4, 6, 7), (8, 1, 3, 3), dict(groups=4, padding="same")),
    "2d-same-dil2": ((1, 3, 8, 7), (2, 3, 2, 3), dict(padding="same", dilation=2)),
    "2d-valid-1x1": ((2, 5, 4, 3), (3, 5, 1, 1), dict(padding="valid")),
    "2d-pairs": ((1, 2, 5, 6), (2, 2, 3, 3), dict(padding=((1, 0), (0, 2)), stride=2)),
}


def _ref_conv_kwargs(kw):
    kw = dict(kw)
    if isinstance(kw.get("padding"), tuple) and isinstance(kw["padding"][0], tuple):
        kw["padding"] = list(kw["padding"])
    return kw


@pytest.mark.parametrize("dt", ALL, ids=str)
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv(case, dt):
    xs, ws, kw = CONV_CASES[case]
    x, x64 = lowp(rnd(xs, 10), dt)
    w, w64 = lowp(rnd(ws, 11), dt)
    b, b64 = lowp(rnd(ws[0], 12), dt)
    ref = ref_conv(x64, w64, b64, **_ref_conv_kwargs(kw))
    check(nn.conv(x, w, b, **kw), ref, dt)
    f = nn.conv1d if len(ws) == 3 else nn.conv2d
    check(f(x, w, None, **kw), ref_conv(x64, w64, None, **_ref_conv_kwargs(kw)), dt)


def test_conv_unbatched():
    x, w = rnd((3, 6, 5), 13), rnd((2, 3, 3, 3), 14)
    bits_equal(nn.conv2d(x, w, padding=1), nn.conv2d(x[None], w, padding=1)[0])


def test_conv_bad_input():
    x = np.ones((1, 4, 6, 6))
    with pytest.raises(ValueError, match="channels"):       # C mismatch
        nn.conv2d(x, np.ones((2, 3, 3, 3)))
    with pytest.raises(ValueError, match="does not divide"):  # groups ∤ C
        nn.conv2d(x, np.ones((3, 1, 3, 3)), groups=3)
    with pytest.raises(ValueError, match="does not divide"):  # groups ∤ O
        nn.conv2d(x, np.ones((3, 2, 3, 3)), groups=2)
    with pytest.raises(ValueError, match="larger than the padded input"):
        nn.conv2d(x, np.ones((2, 4, 7, 7)))
    with pytest.raises(ValueError, match="larger than the padded input"):
        nn.conv2d(x, np.ones((2, 4, 3, 3)), dilation=4)
    nn.conv2d(x, np.ones((2, 4, 7, 7)), padding=1)  # fits once padded
    with pytest.raises(ValueError, match="same"):
        nn.conv2d(x, np.ones((2, 4, 3, 3)), stride=2, padding="same")
    with pytest.raises(ValueError, match="padding"):
        nn.conv2d(x, np.ones((2, 4, 3, 3)), padding="full")
    with pytest.raises(ValueError, match="bias"):
        nn.conv2d(x, np.ones((2, 4, 3, 3)), np.ones(3))
    with pytest.raises(ValueError, match="4-d"):
        nn.conv2d(x, np.ones((2, 4, 3)))
    with pytest.raises(ValueError, match="input"):
        nn.conv2d(np.ones(6), np.ones((2, 4, 3, 3)))


def test_conv_nan_inf_propagate():
    x = rnd((1, 2, 6, 6), 15)
    w = rnd((3, 2, 3, 3), 16)
    x[0, 1, 2, 3] = np.nan
    x[0, 0, 5, 0] = np.inf
    with np.errstate(invalid="ignore"):
        y = nn.conv2d(x, w, padding=1)
        ref = ref_conv(x, w, padding=1)
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    assert np.array_equal(np.isinf(y), np.isinf(ref))
    assert np.isnan(y).any() and np.isinf(y).any()
    np.testing.assert_allclose(y[np.isfinite(ref)], ref[np.isfinite(ref)], rtol=1e-12)


# ============================================================================================
# pooling
# ============================================================================================
POOL_CASES = {
    "1d-k2": ((2, 3, 9), dict(kernel_size=2)),
    "1d-k3-s2-p1": ((2, 3, 10), dict(kernel_size=3, stride=2, padding=1)),
    "2d-k2": ((2, 3, 8, 6), dict(kernel_size=(2, 2))),
    "2d-k3-s2-p1": ((2, 2, 7, 8), dict(kernel_size=(3, 3), stride=2, padding=1)),
    "2d-k(3,2)-s1-p(1,0)": ((1, 2, 5, 6), dict(kernel_size=(3, 2), stride=1, padding=(1, 0))),
}


@pytest.mark.parametrize("dt", ALL, ids=str)
@pytest.mark.parametrize("case", list(POOL_CASES))
def test_pools(case, dt):
    xs, kw = POOL_CASES[case]
    x, x64 = lowp(rnd(xs, 20), dt)
    k, s, p = kw["kernel_size"], kw.get("stride"), kw.get("padding", 0)
    check(nn.max_pool(x, **kw), ref_pool(x64, k, s, p, "max"), dt, tol=0)  # max is exact
    check(nn.avg_pool(x, **kw), ref_pool(x64, k, s, p, "avg"), dt)
    check(nn.avg_pool(x, **kw, count_include_pad=False),
          ref_pool(x64, k, s, p, "avg", count_include_pad=False), dt)
    f_max, f_avg = ((nn.max_pool1d, nn.avg_pool1d) if len(xs) == 3
                    else (nn.max_pool2d, nn.avg_pool2d))
    bits_equal(f_max(x, k, s, p), nn.max_pool(x, **kw))
    bits_equal(f_avg(x, k, s, p), nn.avg_pool(x, **kw))


def test_max_pool_dilation_and_unbatched():
    x = rnd((2, 7, 9), 21)
    y = nn.max_pool2d(x, 3, stride=2, padding=1, dilation=2)
    ref = ref_pool(x[None], 3, 2, 1, "max", dilation=2)[0]
    check(y, ref, F64, tol=0)


def test_pool_special_values_and_errors():
    x = rnd((1, 1, 4, 4), 22)
    x[0, 0, 0, 0] = np.nan
    x[0, 0, 3, 3] = np.inf
    y = nn.max_pool2d(x, 2)
    assert np.isnan(y[0, 0, 0, 0]) and y[0, 0, 1, 1] == np.inf
    with np.errstate(invalid="ignore"):
        a = nn.avg_pool2d(x, 2)
    assert np.isnan(a[0, 0, 0, 0]) and a[0, 0, 1, 1] == np.inf
    with pytest.raises(ValueError, match="half"):
        nn.max_pool2d(x, 2, padding=2)
    with pytest.raises(ValueError, match="larger than the padded input"):
        nn.avg_pool2d(x, 5)


# ============================================================================================
# attention
# ============================================================================================
@pytest.mark.parametrize("dt", ALL, ids=str)
def test_sdpa(dt):
    q, q64 = lowp(rnd((2, 3, 5, 4), 30), dt)
    k, k64 = lowp(rnd((2, 3, 6, 4), 31), dt)
    v, v64 = lowp(rnd((2, 3, 6, 3), 32), dt)
    check(nn.scaled_dot_product_attention(q, k, v), ref_sdpa(q64, k64, v64), dt)
    check(nn.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
          ref_sdpa(q64, k64, v64, is_causal=True, scale=0.3), dt)
    bmask = np.random.default_rng(33).random((5, 6)) > 0.4
    bmask[2] = False  # a fully masked query: output 0
    y = nn.scaled_dot_product_attention(q, k, v, mask=bmask)
    check(y, ref_sdpa(q64, k64, v64, mask=bmask), dt)
    assert not np.isnan(y.astype(np.float64)).any() and (y[..., 2, :].astype(np.float64) == 0).all()
    fmask, f64mask = lowp(rnd((3, 5, 6), 34), dt)
    check(nn.scaled_dot_product_attention(q, k, v, mask=fmask),
          ref_sdpa(q64, k64, v64, mask=f64mask), dt)


def test_sdpa_errors():
    q = np.ones((2, 4, 3))
    with pytest.raises(ValueError, match="embed"):
        nn.scaled_dot_product_attention(q, np.ones((2, 4, 5)), np.ones((2, 4, 3)))
    with pytest.raises(ValueError, match="not both"):
        nn.scaled_dot_product_attention(q, q, q, mask=np.ones((4, 4), bool), is_causal=True)


# ============================================================================================
# losses, linear, embedding
# ============================================================================================
@pytest.mark.parametrize("dt", ALL, ids=str)
def test_cross_entropy(dt):
    z, z64 = lowp(rnd((6, 5), 40, 2.0), dt)
    labels = np.random.default_rng(41).integers(0, 5, size=6)
    per = np.array([-(z64[i, labels[i]] - math.log(sum(math.exp(t) for t in z64[i])))
                    for i in range(6)])
    check(nn.cross_entropy(z, labels, reduction="none"), per, dt)
    check(nn.cross_entropy(z, labels, reduction="sum"), per.sum(), dt)
    check(nn.cross_entropy(z, labels), per.mean(), dt)
    # probability targets, class axis 1 of (N, C, d)
    z3, z364 = lowp(rnd((3, 4, 2), 42), dt)
    p = np.random.default_rng(43).random((3, 4, 2))
    p /= p.sum(1, keepdims=True)
    p_lo, p64 = lowp(p, dt)
    lsm = ref_log_softmax(z364, 1)
    check(nn.cross_entropy(z3, p_lo, reduction="none", axis=1), -(p64 * lsm).sum(1), dt)
    check(nn.cross_entropy(z3, p_lo, axis=1), (-(p64 * lsm).sum(1)).mean(), dt)
    # integer labels on (N, C, d) with axis=1
    lab3 = np.random.default_rng(44).integers(0, 4, size=(3, 2))
    ref3 = np.array([[-lsm[i, lab3[i, j], j] for j in range(2)] for i in range(3)])
    check(nn.cross_entropy(z3, lab3, reduction="none", axis=1), ref3, dt)


def test_cross_entropy_errors():
    z = np.zeros((3, 4))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        nn.cross_entropy(z, np.array([0, 4, 1]))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        nn.cross_entropy(z, np.array([0, -1, 1]))
    with pytest.raises(ValueError, match="shape"):
        nn.cross_entropy(z, np.array([0, 1]))
    with pytest.raises(ValueError, match="reduction"):
        nn.cross_entropy(z, np.array([0, 1, 2]), reduction="avg")


@pytest.mark.parametrize("dt", ALL, ids=str)
def test_linear_embedding(dt):
    x, x64 = lowp(rnd((2, 3, 6), 50), dt)
    w, w64 = lowp(rnd((4, 6), 51), dt)
    b, b64 = lowp(rnd(4, 52), dt)
    ref = np.zeros((2, 3, 4))
    for i, j, o in np.ndindex(2, 3, 4):
        ref[i, j, o] = sum(x64[i, j, t] * w64[o, t] for t in range(6)) + b64[o]
    check(nn.linear(x, w, b), ref, dt)
    check(nn.linear(x, w), ref - b64, dt)
    ids = np.array([[0, 3], [2, 2]])
    bits_equal(nn.embedding(ids, w), w[ids])
    with pytest.raises(ValueError, match="ids"):
        nn.embedding(np.array([4]), w)
    with pytest.raises(ValueError, match="does not match"):
        nn.linear(x, np.ones((4, 5), dt))


@pytest.mark.parametrize("bias", ["none", "added", "in_sum"])
@pytest.mark.parametrize("dt", ALL, ids=str)
def test_linear_native_routine_sums_as_its_decomposition(dt, bias):
    """Eager fpx.nn.linear runs one GEMM and adds the bias after it: bit for bit the
    decomposition, except an in-sum bias of float32/float64 operands, which is added as the
    sum's last term (no [x | 1] copy) -- then both are within Rump's K·u·Σ|x·w| of the exact
    result, the bound fpx.interval uses for any position of the bias."""
    x, w, b = (lowp(rnd(s, 80 + i), dt)[0] for i, s in enumerate([(3, 5, 33), (7, 33), 7]))
    bb = None if bias == "none" else b
    in_sum = bias == "in_sum"
    y = nn.linear(x, w, bb, bias_in_sum=in_sum)
    d = nn._linear_decomp(x, w, bb, bias_in_sum=in_sum)
    assert y.dtype == d.dtype == dt and y.shape == (3, 5, 7)
    if not in_sum or dt not in (F32, F64):
        bits_equal(y, d)
        return
    bits_equal(y, (x.reshape(-1, 33) @ w.T + b).reshape(3, 5, 7))
    x64, w64, b64 = (a.astype(F64) for a in (x, w, b))
    S = np.abs(x64) @ np.abs(w64).T + np.abs(b64)
    u = 2.0 ** -24 if dt == F32 else 2.0 ** -53
    for out in (y, d):   # float64: against the float64 run, within twice the bound
        err = np.abs(out.astype(F64) - (x64 @ w64.T + b64))
        assert np.all(err <= (2 if dt == F64 else 1) * 34 * u * S)
    # interval weights take the decomposition under fpx.interval: the value stays the
    # program's own (the native routine's bits), inside the decomposition's bounds
    wi = fpx.Interval.around(w, rel=1e-6)
    iv = fpx.interval(lambda h, ww: nn.linear(h, ww, b, bias_in_sum=True))(x, wi)
    bits_equal(iv.value, y)
    assert iv.contains(y).all() and iv.contains(x64 @ w64.T + b64).all()


# ============================================================================================
# tracing
# ============================================================================================
def _trace_cases():
    x = rnd((2, 4, 7, 6), 60)
    w = rnd((6, 2, 3, 3), 61)
    b = rnd(6, 62)
    q, k, v = rnd((2, 5, 4), 63), rnd((2, 6, 4), 64), rnd((2, 6, 3), 65)
    z, lab = rnd((5, 3), 66), np.array([0, 2, 1, 1, 0])
    return {
        "relu": (nn.relu, (x,)),
        "sigmoid": (nn.sigmoid, (x,)),
        "silu": (nn.silu, (x,)),
        "gelu": (lambda a: nn.gelu(a, approximate="tanh"), (x,)),
        "softmax": (lambda a: nn.softmax(a, axis=1), (x,)),
        "log_softmax": (nn.log_softmax, (x,)),
        "layer_norm": (lambda a, w_: nn.layer_norm(a, 6, w_, w_), (x, b)),
        "rms_norm": (nn.rms_norm, (x,)),
        "conv": (lambda a, w_, b_: nn.conv2d(a, w_, b_, stride=2, padding=1, dilation=2,
                                             groups=2), (x, w, b)),
        "max_pool": (lambda a: nn.max_pool2d(a, 3, 2, 1), (x,)),
        "avg_pool": (lambda a: nn.avg_pool2d(a, 3, 2, 1, count_include_pad=False), (x,)),
        "scaled_dot_product_attention": (
            lambda a, b_, c: nn.scaled_dot_product_attention(a, b_, c, is_causal=True), (q, k, v)),
        "cross_entropy": (nn.cross_entropy, (z, lab)),
        "linear": (nn.linear, (q, k[0])),
        "embedding": (nn.embedding, (lab, z)),
    }


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("name", list(_trace_cases()))
def test_trace_bit_identical(name, inline):
    f, args = _trace_cases()[name]
    eager = f(*args)
    rec = fpx.trace(f, inline=inline)(*args)
    bits_equal(rec.outputs, eager)
    if inline:
        assert name not in rec.primitives
    else:
        assert name in rec.primitives


def _engine_or_skip():
    if not _kconv._torch():
        pytest.skip("torch (oneDNN) is not installed: fpx.nn.conv runs its decomposition")


@pytest.mark.parametrize("layout", ["c", "transposed", "reversed"])
@pytest.mark.parametrize("bias", ["none", "added", "in_sum"])
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_float32_conv_on_onednn_is_the_same_sums_as_its_decomposition(case, bias, layout):
    """Eager float32 fpx.nn.conv runs on oneDNN; it and the im2col decomposition are both
    within Rump's K·u·Σ|x·w| of the exact float64 result (the bound fpx.interval uses for any
    summation order), for every case, bias placement and input layout."""
    _engine_or_skip()
    xs, ws, kw = CONV_CASES[case]
    x = rnd(xs, 73).astype(F32)
    if layout == "transposed":        # an (N, C, ...) view of a channels-last array
        x = np.moveaxis(np.ascontiguousarray(np.moveaxis(x, 1, -1)), -1, 1)
    elif layout == "reversed":        # negative strides
        x = np.ascontiguousarray(x[..., ::-1])[..., ::-1]
    w, b = rnd(ws, 74).astype(F32), rnd(ws[0], 75).astype(F32)
    bb = None if bias == "none" else b
    extra = dict(bias_in_sum=True) if bias == "in_sum" else {}
    y = nn.conv(x, w, bb, **kw, **extra)
    rec = fpx.trace(lambda a: nn.conv(a, w, bb, **kw, **extra), inline=True)(x)
    assert "conv" not in rec.primitives and y.dtype == F32 == rec.outputs.dtype
    ex = nn.conv(x.astype(F64), w.astype(F64), None if bb is None else bb.astype(F64), **kw)
    S = nn.conv(np.abs(x).astype(F64), np.abs(w).astype(F64),
                None if bb is None else np.abs(bb).astype(F64), **kw)
    K = math.prod(ws[1:]) + (bias == "in_sum")
    for out in (y, rec.outputs):
        assert np.all(np.abs(out.astype(F64) - ex) <= K * 2.0 ** -24 * S + 1e-37)
    # the interval rule's exact centre: the same sums in float64 (within γ_{K+1}(2^-53)·S)
    if bias != "added" and layout == "c":
        pads = nn._conv_padding(kw.get("padding", 0), len(ws) - 2, ws[2:],
                                nn._tuple(kw.get("stride", 1), len(ws) - 2, "stride"),
                                nn._tuple(kw.get("dilation", 1), len(ws) - 2, "dilation"))
        c = _kconv.conv_exact_f32(x, w, bb, nn._tuple(kw.get("stride", 1), len(ws) - 2, "s"),
                                  pads, nn._tuple(kw.get("dilation", 1), len(ws) - 2, "d"),
                                  kw.get("groups", 1))
        assert c.dtype == F64 and c.shape == ex.shape
        assert np.all(np.abs(c - ex) <= 2 * (K + 1) * 2.0 ** -53 * S)


def _conv_args(xs, ws, kw):
    nd = len(ws) - 2
    stride = nn._tuple(kw.get("stride", 1), nd, "stride")
    dilation = nn._tuple(kw.get("dilation", 1), nd, "dilation")
    pads = nn._conv_padding(kw.get("padding", 0), nd, ws[2:], stride, dilation)
    return stride, pads, dilation, kw.get("groups", 1)


# wider channel counts: the split centre needs >= 4 input channels per group
SPLIT_CASES = {
    "2d-8ch": ((2, 8, 7, 8), (5, 8, 3, 3), dict(padding=1)),
    "2d-6ch-uneven-s2": ((2, 6, 9, 8), (4, 6, 3, 3), dict(stride=2, padding=((1, 0), (0, 2)))),
    "2d-g2-16ch": ((1, 16, 6, 6), (6, 8, 3, 3), dict(groups=2, padding=1, dilation=2)),
    "1d-5ch": ((2, 5, 13), (3, 5, 4), dict(padding="same")),
    "3d-4ch": ((1, 4, 4, 5, 4), (2, 4, 2, 3, 2), dict(padding=1)),
}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("scale", ["normal", "tiny", "huge", "sparse"])
@pytest.mark.parametrize("case", list(SPLIT_CASES) + ["2d-groups2-asym", "1d-s2-p1-d2-g2"])
def test_conv_upper_bf16_bounds_the_exact_sum(case, scale, bias):
    """The bfloat16 radius convolution: R·f + a >= the exact sum of the nonnegative products
    (the float64 convolution plus its own γ_{K+2}(2^-53) error), and at most ~3% above it
    where no term is near the underflow threshold."""
    _engine_or_skip()
    import torch
    if not _bf16.native(torch):
        pytest.skip("oneDNN has no bfloat16 on this CPU")
    xs, ws, kw = {**CONV_CASES, **SPLIT_CASES}[case]
    mag = {"normal": 1.0, "tiny": 1e-37, "huge": 1e30, "sparse": 1.0}[scale]
    x = (np.abs(rnd(xs, 81)) * mag).astype(F32)
    if scale == "sparse":
        x[np.random.default_rng(82).random(xs) < 0.7] = 0.0   # ReLU zeros
    w, b = np.abs(rnd(ws, 83)).astype(F32), np.abs(rnd(ws[0], 84)).astype(F32)
    bb = b if bias else None
    args = _conv_args(xs, ws, kw)
    R, f, a = _kconv.conv_upper_bf16(x, w, bb, *args)
    S = nn.conv(x.astype(F64), w.astype(F64), None if bb is None else bb.astype(F64), **kw)
    K = math.prod(ws[1:]) + bias
    exact_hi = S * (1 + 2 * (K + 2) * 2.0 ** -53)
    assert R.shape == S.shape and np.all(R.astype(F64) * f + a >= exact_hi)
    if scale in ("normal", "huge", "sparse"):
        assert np.all(R.astype(F64) * f + a <= S * 1.03 + 1e-30)
    assert _kconv.conv_upper_bf16(x.astype(F64), w.astype(F64), None, *args) is None


def test_conv_engine_steps_aside_for_tf32_and_other_dtypes():
    """A torch float32-precision setting of "tf32"/"bf16" would round oneDNN's operands: the
    engine then declines (the decomposition runs), as for float64/float16 operands."""
    _engine_or_skip()
    import torch
    x, w = rnd((1, 2, 5, 5), 76).astype(F32), rnd((3, 2, 3, 3), 77).astype(F32)
    args = ((1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    assert _kconv.conv_f32(x, w, None, *args) is not None
    assert _kconv.conv_f32(x.astype(F64), w.astype(F64), None, *args) is None
    assert _kconv.conv_f32(x.astype(np.float16), w.astype(np.float16), None, *args) is None
    conv_cfg = torch.backends.mkldnn.conv
    old = conv_cfg.fp32_precision
    try:
        conv_cfg.fp32_precision = "tf32"
        assert _kconv.conv_f32(x, w, None, *args) is None
        y = nn.conv2d(x, w, padding=1)
        bits_equal(y, nn._conv_decomp(x, w, None, stride=(1, 1), padding=((1, 1), (1, 1)),
                                      dilation=(1, 1), groups=1))
    finally:
        conv_cfg.fp32_precision = old


@pytest.mark.parametrize("case", ["1d-s2-p1-d2-g2", "2d-basic", "2d-groups2-asym",
                                  "2d-depthwise-same", "2d-valid-1x1"])
def test_conv_decomposes_to_one_matmul(case):
    xs, ws, kw = CONV_CASES[case]
    x, w, b = rnd(xs, 70), rnd(ws, 71), rnd(ws[0], 72)
    rec = fpx.trace(lambda a, w_, b_: nn.conv(a, w_, b_, **kw), inline=True)(x, w, b)
    assert rec.primitives.count("matmul") == 1
    assert "getitem" in rec.primitives
    # windows are gathered per kernel offset, not per output pixel
    assert rec.primitives.count("getitem") == math.prod(ws[2:])
    bits_equal(rec.outputs, nn.conv(x, w, b, **kw))
    rec2 = fpx.trace(lambda a, w_, b_: nn.conv(a, w_, b_, **kw))(x, w, b)
    assert rec2.primitives == ["conv"]


def test_trace_low_precision_bit_identical():
    for dt in LOW:
        x = rnd((2, 3, 6, 6), 73).astype(dt)
        w = rnd((4, 3, 3, 3), 74).astype(dt)
        f = lambda a, w_: nn.gelu(nn.conv2d(a, w_, padding=1))  # noqa: E731
        rec = fpx.trace(f, inline=True)(x, w)
        if dt == F32 and _kconv._torch():   # eager: oneDNN's order, round-off apart
            check(rec.outputs, f(x, w), dt, tol=1e-5)
        else:
            bits_equal(rec.outputs, f(x, w))
        assert rec.outputs.dtype == dt


# ============================================================================================
# a small CNN (MNIST-sized)
# ============================================================================================
def _cnn_params(dt):
    rng = np.random.default_rng(80)
    p = {
        "c1w": rng.standard_normal((4, 1, 3, 3)) / 3, "c1b": rng.standard_normal(4) * 0.1,
        "c2w": rng.standard_normal((8, 4, 3, 3)) / 6, "c2b": rng.standard_normal(8) * 0.1,
        "l1w": rng.standard_normal((32, 8 * 6 * 6)) / 17, "l1b": rng.standard_normal(32) * 0.1,
        "l2w": rng.standard_normal((10, 32)) / 6, "l2b": rng.standard_normal(10) * 0.1,
    }
    return {k: v.astype(dt) for k, v in p.items()}


def cnn(x, p):
    h = nn.max_pool2d(nn.relu(nn.conv2d(x, p["c1w"], p["c1b"], padding=1)), 2)   # 4x14x14
    h = nn.max_pool2d(nn.relu(nn.conv2d(h, p["c2w"], p["c2b"])), 2)               # 8x6x6
    h = h.reshape(h.shape[0], -1)
    h = nn.relu(nn.linear(h, p["l1w"], p["l1b"]))
    return nn.log_softmax(nn.linear(h, p["l2w"], p["l2b"]))


def cnn_ref(x, p):
    h = np.maximum(ref_conv(x, p["c1w"], p["c1b"], padding=1), 0)
    h = ref_pool(h, 2, None, 0, "max")
    h = ref_pool(np.maximum(ref_conv(h, p["c2w"], p["c2b"]), 0), 2, None, 0, "max")
    h = h.reshape(h.shape[0], -1)
    h = np.maximum(h @ p["l1w"].T + p["l1b"], 0)
    return ref_log_softmax(h @ p["l2w"].T + p["l2b"])


@pytest.mark.parametrize("dt", [F64, F32], ids=str)
def test_small_cnn(dt):
    x = np.random.default_rng(81).random((4, 1, 28, 28)).astype(dt)
    p = _cnn_params(dt)
    y = cnn(x, p)
    assert y.shape == (4, 10) and y.dtype == dt
    rec = fpx.trace(cnn)(x, p)
    bits_equal(rec.outputs, y)
    assert rec.primitives.count("conv") == 2 and rec.primitives.count("linear") == 2
    assert "max_pool" in rec.primitives and "log_softmax" in rec.primitives
    rec_inline = fpx.trace(cnn, inline=True)(x, p)
    if dt == F32 and _kconv.conv_f32(x, p["c1w"], None, (1, 1), ((0, 0), (0, 0)), (1, 1), 1) \
            is not None:
        # eager float32 convs run on oneDNN; the inlined im2col matmul sums the same products
        # in another order: round-off apart, not bit for bit
        check(rec_inline.outputs, y, dt, tol=1e-5)
    else:
        bits_equal(rec_inline.outputs, y)
    assert rec_inline.primitives.count("matmul") == 4
    p64 = {k: v.astype(np.float64) for k, v in p.items()}
    check(y, cnn_ref(x.astype(np.float64), p64), dt, tol=1e-10 if dt == F64 else 1e-4)


def test_numpy_matmul_on_mkl_keeps_numpys_semantics_and_bound():
    """Within a torch program's run (``blas.torch_gemms``) the NumPy backend's matmul runs
    float32/float64 GEMMs on torch's MKL where it applies (``kernels/blas.py``): NumPy's
    shapes (stacked, broadcast), dtypes and NaN/inf, within Rump's K·u·Σ|a·b| of the exact
    result (any summation order) for transposed views too; NumPy's own matmul, bit for bit,
    outside that context and for what it does not take (small, 1-D, read-only, negative
    strides, float16, mixed dtypes) and under a float32 precision setting that would let a
    CPU GEMM round to bfloat16."""
    import torch
    from fpx.kernels import blas
    _engine_or_skip()
    a = np.ones((64, 96), np.float32)
    assert blas._engine(a, a.T) is None          # a NumPy program keeps NumPy's GEMMs
    with blas.torch_gemms():
        assert blas._engine(a, a.T) is not None
        _mkl_matmul_cases(blas, torch)
    assert blas._engine(a, a.T) is None


def _mkl_matmul_cases(blas, torch):
    rng = np.random.default_rng(5)
    cases = [((64, 96), (96, 80)), ((3, 64, 70), (70, 50)), ((2, 1, 40, 64), (5, 64, 40))]
    for dt in (np.float32, np.float64):
        u = np.finfo(dt).eps / 2
        for sa, sb in cases:
            a, b = rng.standard_normal(sa).astype(dt), rng.standard_normal(sb).astype(dt)
            a.flat[7] = np.nan
            for bb in (b, np.ascontiguousarray(np.swapaxes(b, -1, -2)).swapaxes(-1, -2)):
                assert blas._engine(a, bb) is not None
                y = fpx.numpy.matmul(a, bb)
                ref = np.matmul(a.astype(np.float64), bb.astype(np.float64))
                assert y.dtype == dt and y.shape == ref.shape
                assert np.array_equal(np.isnan(y), np.isnan(ref))
                K = sa[-1]
                tol = K * u / (1 - K * u) * np.matmul(np.abs(a), np.abs(bb)).astype(np.float64)
                ok = ~np.isnan(ref)
                assert np.all(np.abs(y[ok] - ref[ok]) <= tol[ok])
    a = rng.standard_normal((64, 96)).astype(np.float32)
    b = rng.standard_normal((96, 80)).astype(np.float32)
    ro = b.copy()
    ro.flags.writeable = False
    for x, z in [(a[:4, :4], b[:4, :4]), (a, b[:, 0]), (a, ro), (a[::-1], b),
                 (a.astype(np.float16), b.astype(np.float16)), (a, b.astype(np.float64))]:
        assert blas._engine(x, z) is None
        assert np.array_equal(fpx.numpy.matmul(x, z), np.matmul(x, z))
    for x, z in [(a, b[:80]), (rng.standard_normal((3, 64, 96)).astype(np.float32),
                               rng.standard_normal((2, 96, 80)).astype(np.float32))]:
        assert blas._engine(x, z) is None       # NumPy's own error for mismatched shapes
        with pytest.raises(ValueError, match="matmul"):
            fpx.numpy.matmul(x, z)
    prev = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert blas._engine(a, b) is None
        assert np.array_equal(fpx.numpy.matmul(a, b), np.matmul(a, b))
    finally:
        torch.set_float32_matmul_precision(prev)
