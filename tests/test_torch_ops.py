"""ATen ops the real models of issue 28 needed (digamma, as_strided, average pooling with
``ceil_mode``): torch's own CPU output inside fpx's bound of the same op, and fpx's value
torch's (bit for bit, or within the documented model)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.special

torch = pytest.importorskip("torch")
F = torch.nn.functional

import fpx  # noqa: E402
from fpx.interop.torch import UnmappedOpError  # noqa: E402

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _digamma_inputs(dtype):
    """Wide ranges, the root (1.4616...), integers (where the kernel's loop lands on 10
    exactly) and tiny arguments, as ``dtype``."""
    g = np.random.default_rng(3)
    tiny = float(torch.finfo(dtype).tiny) * 4
    x = np.concatenate([g.uniform(1e-3, 20, 3000), np.exp(g.uniform(np.log(tiny), 25, 3000)),
                        np.linspace(1.4, 1.5, 2001), np.arange(1.0, 40.0), [tiny, 0.5, 1e30]])
    return torch.tensor(x).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_digamma_bound_holds_torch_and_the_exact_value(dtype):
    x = _digamma_inputs(dtype)
    iv = fpx.interval(torch.digamma)(x)
    own = torch.digamma(x)
    assert iv.contains(own).all()
    assert iv.contains(scipy.special.digamma(x.double().numpy())).all()
    # fpx's value: torch's kernel step by step; NumPy's float32 log may differ from glibc's
    # logf by an ulp, which moves the result by an ulp of its largest term (~1/x or ~2.3)
    v, t, xd = (a.double().numpy() for a in (iv.value, own, x))
    eps = torch.finfo(dtype).eps
    with np.errstate(invalid="ignore"):                       # (inf - inf)
        assert np.all((v == t) | (np.abs(v - t) <= eps * (np.abs(t) + 1 / xd + 3)))
    if dtype in (torch.float16, torch.bfloat16):
        assert torch.equal(iv.value, own)


def test_digamma_bound_is_tight_where_the_kernel_loop_lands_on_10():
    # x = 1..9 reach 10 exactly; the round-off bound of x + 1 straddles 10, so whether the
    # loop stops is undecided: the bound is the hull of two results close to psi(x), not of
    # two loop states (whose hull was 0.1 wide at x = 1)
    x = torch.arange(1.0, 12.0)
    iv = fpx.interval(torch.digamma)(x)
    assert iv.contains(torch.digamma(x)).all()
    assert np.all(iv.hi - iv.lo < 64 * 2.0 ** -24 * 3)          # a few ulps of ~2.8


def test_digamma_classify_float32_against_float64_is_roundoff():
    x = _digamma_inputs(torch.float32)
    v = fpx.classify(torch.digamma, torch.digamma(x.double()), x)
    assert v.kind == "roundoff", v.report()
    wrong = torch.digamma(x.double()) + 1e-4 * x.double()    # off by 1e-4 relative
    assert fpx.classify(torch.digamma, wrong, x).kind == "bug"


def test_digamma_of_nonpositive_arguments_is_torchs():
    """x < 0: the reflection formula; 0 -> -inf, negative integers -> NaN (no claim)."""
    x = torch.tensor([2.0, -0.5, -1.5, 0.0, -3.0])
    iv = fpx.interval(torch.digamma)(x)
    y = torch.digamma(x).double().numpy()
    assert iv.contains(y)[:4].all() and np.isnan(y[4]) and np.isnan(iv.lo[4])


def test_digamma_in_a_numpy_program():
    x = np.array([0.25, 1.4616321, 3.0, 50.0, -1.5], np.float32)
    iv = fpx.interval(fpx.nn.digamma)(x)
    assert iv.contains(scipy.special.digamma(x.astype(np.float64))).all()
    with np.errstate(divide="ignore", invalid="ignore"):
        y = fpx.nn.digamma(np.array([-1.5, 0.0, -2.0]))
    assert abs(y[0] - scipy.special.digamma(-1.5)) < 1e-12 and y[1] == -np.inf
    assert np.isnan(y[2])


AS_STRIDED = {
    "reshape": lambda x: x.as_strided((20, 3), (3, 1)) * 2,
    "transpose": lambda x: x.as_strided((5, 4, 3), (1, 5, 20)) * 2,
    "slice with offset": lambda x: torch.as_strided(x, (2, 2, 5), (20, 5, 1), 25) * 2,
    "view of a transpose": lambda x: x.transpose(0, 2).as_strided((5, 4), (1, 5)) * 2,
    "view of a slice": lambda x: x[:, 1:3].as_strided((3, 2, 5), (20, 5, 1), 5) * 2,
    "expanded input": lambda x: x[:, :1].expand(3, 4, 5).as_strided((3, 4), (20, 0)) * 2,
    "overlapping windows": lambda x: x.reshape(-1).as_strided((6, 4), (2, 1)) * 2,
}


@pytest.mark.parametrize("name", sorted(AS_STRIDED))
def test_as_strided_is_torchs_view(name):
    f = AS_STRIDED[name]
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(4))
    iv = fpx.interval(f)(x)
    assert torch.equal(iv.value, f(x))                       # exact movement, then x * 2
    assert iv.contains(f(x)).all()


def test_as_strided_of_a_channels_last_pooled_map():
    # convnext (torchvision, timm): global average pooling of a channels-last map exports as
    # mean(dim=(-1, -2), keepdim=True) re-strided by as_strided
    f = lambda x: F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1)      # noqa: E731
    x = torch.randn(2, 5, 5, 8, generator=torch.Generator().manual_seed(5))
    iv = fpx.interval(f)(x)
    assert iv.contains(f(x)).all() and iv.contains(f(x.double())).all()


def test_as_strided_outside_its_input_is_refused():
    x = torch.randn(3, 4, 5)
    with pytest.raises(UnmappedOpError, match="reads storage outside its input"):
        fpx.interval(lambda x: x[:, 1:3].as_strided((3, 2, 5), (20, 5, 1), 0) * 2)(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("size,k,s,p", [((6, 6), 3, 2, 1), ((7, 5), 2, 2, 0), ((5, 9), 3, 3, 1),
                                        ((4, 4), 3, 1, 1)])
def test_avg_pool_ceil_mode_is_torchs(size, k, s, p, count_include_pad, dtype):
    # (6, 6), k 3, s 2, p 1: the last window starts at 5 and is clipped at the right
    # padding's end (7): torch divides it by 2 (or by 1, its real elements), not 3
    x = (torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(6)) * 3).to(dtype)
    for f in (lambda x: F.avg_pool2d(x, k, s, p, ceil_mode=True,
                                     count_include_pad=count_include_pad),
              lambda x: F.avg_pool1d(x[:, :, 0], k, s, p, ceil_mode=True,
                                     count_include_pad=count_include_pad)):
        iv = fpx.interval(f)(x)
        own = f(x)
        assert iv.value.shape == own.shape
        assert iv.contains(own).all() and iv.contains(f(x.double())).all()
        assert torch.allclose(iv.value.double(), own.double(), rtol=4 * torch.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_avg_pool_divisor_override_holds_torch(dtype):
    """avg_pool's divisor_override (was unmapped): every window's sum divided by the given
    integer -- torch's CPU output and the float64 run of the same input inside the bound."""
    x = (torch.randn(2, 3, 9, 9, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    for kw in (dict(kernel_size=3, divisor_override=5),
               dict(kernel_size=2, stride=2, padding=1, divisor_override=3, ceil_mode=True),
               dict(kernel_size=(3, 2), stride=2, divisor_override=-2)):
        def f(t):
            return F.avg_pool2d(t, **kw)
        iv = fpx.interval(f)(x)
        assert iv.contains(f(x).double()).all() and iv.contains(f(x.double())).all(), kw
    with pytest.raises(ValueError, match="divisor_override"):
        fpx.nn.avg_pool(np.ones((1, 1, 4, 4), np.float32), (2, 2), divisor_override=0)
