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
