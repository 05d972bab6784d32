"""Upper bounds of sums of nonnegative products from oneDNN's bfloat16 kernels, for the
interval transform's radius convolution (``fpx.kernels.conv.conv_upper_bf16``).

A radius is an upper bound of a convolution (or GEMM) of nonnegative float32 operands. On a
CPU with bfloat16 instructions (AVX512-BF16, AMX) oneDNN's bfloat16 kernels are 2-3x faster
than its float32 ones: round the operands *up* to bfloat16 (``round_up``, on the bits), run
the kernel, and cover what it does with ``factors(k)``:

* each product of two bfloat16 values is exact in float32 (8 + 8 significant bits); products
  of the rounded operands are >= the true ones;
* oneDNN accumulates in float32: every partial sum of nonnegative terms loses at most 2^-23
  relative (a full ulp, in case of other than round-to-nearest) -- any order, blocking or
  split-K -- and the bfloat16 instructions flush subnormal inputs and results to 0 (at most
  2^-126 each, counted per term and per addition);
* the output is rounded to bfloat16: at most 2^-7 relative (a full ulp), or 2^-126 if flushed.

With k terms per sum: ``exact <= (R + (2k + 3)·2^-126) / ((1 - 2^-7)(1 - γ_{k+1}(2^-23)))``,
``R·f + a`` with ``(f, a) = factors(k)``. The bound is ~1.6% above the float32 one (the
operands' rounding up and the output's). Only where the CPU has bfloat16 instructions
(``native``): emulated bfloat16 would be as sound but no faster than float32.

Not used for the GEMMs of ``matmul``/``linear``: their programs' own values come from NumPy's
OpenBLAS, whose worker threads spin after each call and slow torch's thread pool (and torch's
slows NumPy's elementwise passes) -- measured on the encoder benchmark, a bfloat16 radius GEMM
made the whole bound 155 -> 185 ms, although alone it is 2.3-2.8x faster than the float32 GEMM.
"""
from __future__ import annotations

import functools
import math

import numba
import numpy as np


@numba.njit(cache=True)
def _round_up_loop(bits, out):
    for i in range(bits.size):
        u = bits[i] & np.uint32(0x7FFFFFFF)       # operands are >= 0 (a -0.0 is 0)
        if u > np.uint32(0x7F800000):
            out[i] = np.uint16(0x7FC0)            # NaN stays NaN
        elif u == 0:
            out[i] = np.uint16(0)
        elif u < np.uint32(0x00800000):
            out[i] = np.uint16(0x0080)            # below 2^-126: 2^-126 (no subnormal inputs)
        else:
            hi = u >> np.uint32(16)
            if u & np.uint32(0xFFFF):
                hi += np.uint32(1)                # the next bfloat16 up (max -> inf)
            out[i] = np.uint16(hi)


def round_up(torch, t):
    """A bfloat16 tensor >= t elementwise (t: a nonnegative float32 tensor or array): the upper
    16 bits of each float32, incremented where the lower ones are not all zero (directed
    rounding upward, exactly); nonzero values below 2^-126 become 2^-126, since the bfloat16
    instructions treat subnormal inputs as 0."""
    t = torch.as_tensor(t)
    bits = t.contiguous().numpy().view(np.uint32).reshape(-1)
    out = np.empty(bits.size, np.uint16)
    _round_up_loop(bits, out)
    return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16).reshape(t.shape)


@functools.cache
def native(torch) -> bool:
    """oneDNN runs bfloat16 natively on this CPU (AVX512-BF16 or AMX)."""
    try:
        cpu = torch.cpu
        has = cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported()
        return bool(has and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return False


def factors(k):
    """(f, a) with exact <= R·f + a for a bfloat16 kernel's output R of sums of k nonnegative
    terms (see the module docstring); None where γ_{k+1}(2^-23) is not below 1/2."""
    g = (k + 1) * 2.0 ** -23
    if not g < 0.5:
        return None
    f = 1.0 / ((1.0 - 2.0 ** -7) * (1.0 - g / (1.0 - g))) * (1.0 + 2.0 ** -50)
    return f, math.ldexp(2 * k + 3, -126) * f
