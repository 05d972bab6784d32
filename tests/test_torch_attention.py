"""Attention bounds on interval inputs (issue 28): masked scores are exact exclusions (a
boolean, causal or -inf mask no longer sends the bound to ±inf) and the output stays inside
the hull of v's rows over the keys taken; the bound holds torch's own CPU output at every
point of the box and the float64 run, in every dtype."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import fpx  # noqa: E402

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
L, S, E = 6, 7, 8


def _mask(kind):
    g = torch.Generator().manual_seed(5)
    keep = torch.rand(L, S, generator=g) > 0.4
    keep[:, 0] = True
    keep[L - 1] = False                       # one query sees no key: its output is 0
    if kind == "bool":
        return {"attn_mask": keep}
    if kind == "float":
        return {"attn_mask": torch.where(keep, torch.randn(L, S, generator=g),
                                         torch.tensor(float("-inf")))}
    if kind == "causal":
        return {"is_causal": True}
    return {}


def _points(dtype, spread, seed=0):
    """q, k, v and four perturbed copies of each (relative spread), as ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    base = [torch.randn(2, 3, n, E, generator=g) * 1.5 for n in (L, S, S)]
    pts = [[b.to(dtype) for b in base]]
    for _ in range(4):
        pts.append([(b * (1 + spread * torch.randn(b.shape, generator=g))).to(dtype)
                    for b in base])
    return pts


def _box(pts, i):
    stack = torch.stack([p[i].double() for p in pts])
    return fpx.Interval(stack.amin(0).numpy(), stack.amax(0).numpy(), pts[0][i])


def _v_hull(v_lo, v_hi, taken):
    """min / max over the keys taken of v's rows: (..., L, E); NaN where no key is taken."""
    t = taken[..., :, :, None]
    mn = np.where(t, v_lo[..., None, :, :], np.inf).min(axis=-2)
    mx = np.where(t, v_hi[..., None, :, :], -np.inf).max(axis=-2)
    return mn, mx


@pytest.mark.parametrize("kind", ["none", "bool", "float", "causal"])
@pytest.mark.parametrize("dtype,spread", [(d, 0.02) for d in DTYPES]
                         + [(torch.float32, 0.5), (torch.bfloat16, 0.5)], ids=str)
def test_attention_bound_on_a_box_holds_torch_at_its_points(kind, dtype, spread):
    kw = _mask(kind)
    if "attn_mask" in kw and kw["attn_mask"].is_floating_point():
        kw["attn_mask"] = kw["attn_mask"].to(dtype)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kw)
    pts = _points(dtype, spread)
    iv = fpx.interval(fn)(*(_box(pts, i) for i in range(3)))
    lo, hi = np.asarray(iv.lo), np.asarray(iv.hi)
    assert np.isfinite(lo).all() and np.isfinite(hi).all()
    for p in pts:
        inside = iv.contains(fn(*p).double().numpy())
        assert inside.all(), f"{kind} {dtype}: {int((~inside).sum())} of {inside.size} outside"
        f64 = {k: (m.double() if torch.is_tensor(m) and m.is_floating_point() else m)
               for k, m in kw.items()}
        y64 = F.scaled_dot_product_attention(*(t.double() for t in p), **f64)
        assert iv.contains(y64.numpy()).all()
    # inside the hull of v's rows over the keys taken, up to the weights' rounding
    vb = _box(pts, 2)
    if kind == "causal":
        taken = np.tril(np.ones((L, S), bool))
    elif kind == "none":
        taken = np.ones((L, S), bool)
    else:
        taken = np.asarray(kw["attn_mask"] if kind == "bool"
                           else torch.isfinite(kw["attn_mask"]))
    mn, mx = _v_hull(np.asarray(vb.lo), np.asarray(vb.hi), taken)
    live = np.isfinite(mn)
    # the weights' sum within g ~ (2S + 18)·u of 1 (the policy sums half types in their own
    # format), the p @ v sum's ~ (S + 2)·u and the output's rounding: (3S + 24)·u·M at most
    u = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11,
         torch.bfloat16: 2.0 ** -8}[dtype]
    slack = (3 * S + 24) * u * 1.05 * np.maximum(np.abs(mn), np.abs(mx))
    with np.errstate(invalid="ignore"):
        assert np.all(lo[live] >= (mn - slack)[live])
        assert np.all(hi[live] <= (mx + slack)[live])
    assert np.all(lo[~live] == 0) and np.all(hi[~live] == 0)     # no key: exactly 0


def test_attention_bound_is_tighter_than_before_on_wide_boxes():
    # the numbers: a causal mask on a wide box gave ±inf, no mask ~8x v's range;
    # now every output is within v's range (plus the weights' rounding)
    pts = _points(torch.float32, 1.0, seed=3)
    vb = _box(pts, 2)
    v_range = float(np.max(vb.hi) - np.min(vb.lo))
    for kw in ({}, {"is_causal": True}):
        iv = fpx.interval(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw))(
            *(_box(pts, i) for i in range(3)))
        w = np.asarray(iv.hi) - np.asarray(iv.lo)
        assert np.isfinite(w).all() and w.max() <= v_range * 1.001


def test_masked_attention_in_a_module_classifies_roundoff_against_float64():
    torch.manual_seed(0)

    class Causal(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = (t.reshape(2, 5, 2, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    m = Causal().eval()
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    import copy
    for dt in (torch.float32, torch.bfloat16):
        mt = copy.deepcopy(m).to(dt)
        v = fpx.classify(mt, copy.deepcopy(m).double()(x.double()).detach(), x.to(dt),
                         layers=False)
        assert v.kind == "roundoff" and v.width < 0.5, v.report()
