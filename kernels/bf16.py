"""Upper bounds of sums of nonnegative products from oneDNN's bfloat16 kernels, for the
interval transform's radius convolution (``fpx.kernels.conv.conv_upper_bf16``).

A radius is an upper bound of a convolution (or GEMM) of nonnegative float32 operands. On a
CPU with bfloat16 instructions (AVX512-BF16, AMX) oneDNN's bfloat16 kernels are faster
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

The radius GEMMs of ``matmul``/``linear`` (``matmul_upper``) take this path only where the CPU
has AMX tiles; elsewhere the float32 GEMM is as fast. It runs on torch's threads as the user
set them: fpx never changes torch's thread count.
"""
from __future__ import annotations

import functools
import math

import numba
import numpy as np


@numba.njit(inline="always")
def _bf16_up(b):
    """The bits of the bfloat16 >= |x| for the float32 bits b of x (see ``round_up``)."""
    u = b & np.uint32(0x7FFFFFFF)             # the magnitude (a -0.0 is 0)
    h = (u + np.uint32(0xFFFF)) >> np.uint32(16)   # the next bfloat16 up (max -> inf)
    h = np.uint32(0x0080) if u < np.uint32(0x00800000) else h   # below 2^-126: 2^-126
    h = np.uint32(0x7FC0) if u > np.uint32(0x7F800000) else h   # NaN stays NaN
    return np.uint32(0) if u == 0 else h


@numba.njit(cache=True)
def _round_up_loop(bits, out):
    # selects, not branches, and the max in 16 lanes: the loop vectorizes (one running max
    # would be a loop-carried dependency that keeps it scalar)
    n = bits.size
    lanes = np.zeros(16, np.uint32)
    body = n - n % 16
    for i0 in range(0, body, 16):
        for k in range(16):
            h = _bf16_up(bits[i0 + k])
            out[i0 + k] = np.uint16(h)
            lanes[k] = h if h > lanes[k] else lanes[k]
    top = np.uint32(0)
    for i in range(body, n):
        h = _bf16_up(bits[i])
        out[i] = np.uint16(h)
        top = h if h > top else top
    for k in range(16):                 # nonnegative bfloat16 bits order as their values
        top = lanes[k] if lanes[k] > top else top
    return top


def aligned_empty(shape, dtype):
    """``np.empty(shape, dtype)`` starting on a 64-byte boundary (a cache line, an AMX tile
    row). Large NumPy arrays start 16 bytes past a page (the allocator's header): oneDNN's
    bfloat16 GEMM is slower on such a left factor: ``round_up`` and the interval kernels
    write bfloat16 bits here."""
    dt = np.dtype(dtype)
    n = math.prod(shape) * dt.itemsize
    buf = np.empty(n + 64, np.uint8)
    off = -buf.ctypes.data % 64
    return buf[off:off + n].view(dt).reshape(shape)


def round_up(torch, t, with_max=False):
    """A bfloat16 tensor >= |t| elementwise (t: a float32 tensor or array): the upper 16 bits
    of each float32's magnitude, incremented where the lower ones are not all zero (directed
    rounding upward, exactly); nonzero values below 2^-126 become 2^-126, since the bfloat16
    instructions treat subnormal inputs as 0. An operand laid out as a permutation of a dense
    block (attention's head-split activations) is rounded in memory order (a float32 copy
    into the logical order had cost more than the GEMM), then returned as the permuted view
    where only the last two axes trade places (a transposed matrix, which the GEMM reads as
    such) and as a bfloat16 copy in logical order otherwise. ``with_max``: also the largest
    rounded value as a float (>= max |t|; NaN if any element is NaN; 0 if empty). A uint16
    array is taken as such bits already rounded (the interval kernels' left factors write
    them directly: ``fpx/kernels/interval.py: mm_left``) and only wrapped."""
    a = t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    perm = tuple(int(i) for i in np.argsort([-abs(s) for s in a.strides], kind="stable"))
    dense = a.transpose(perm)
    if not dense.flags.c_contiguous:
        dense = np.ascontiguousarray(dense)
    if a.dtype == np.uint16:
        out = dense.reshape(-1)
        top = out.max() if out.size else 0
    else:
        out = aligned_empty((dense.size,), np.uint16)
        top = _round_up_loop(dense.view(np.uint32).reshape(-1), out)
    r = torch.from_numpy(out.view(np.int16)).view(torch.bfloat16).reshape(dense.shape)
    r = r.permute(tuple(int(i) for i in np.argsort(perm)))
    n = len(perm)
    if perm[:n - 2] != tuple(range(n - 2)):
        r = r.contiguous()      # (in bfloat16: half a float32 copy; torch's matmul of such
    if not with_max:            # views is slower than the copy and its own GEMM)
        return r
    return r, to_float(top)


def to_float(bits):
    """The value of bfloat16 bits (an integer) as a Python float."""
    return float(np.uint32(int(bits) << 16).view(np.float32))


def to_float32(bits):
    """A float32 array of the values of a uint16 array of bfloat16 bits (exact)."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


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


@functools.cache
def amx(torch) -> bool:
    """oneDNN runs bfloat16 GEMMs on AMX tiles here (see the module docstring)."""
    try:
        return bool(native(torch) and torch.cpu._is_amx_tile_supported())
    except Exception:
        return False


def matmul_upper(torch, a, b, maxes=False):
    """(R, f, a') with ``|a| @ |b| <= R·f + a'`` elementwise in exact arithmetic, for float32
    arrays ``a`` (..., M, K) and ``b`` (..., K, N) (``round_up`` takes magnitudes: the sign bit
    is dropped; ``a`` may be bfloat16 bits already rounded up, uint16), from one bfloat16
    GEMM of their magnitudes rounded up (``factors(K)``); R a
    float32 array. ``maxes``: also upper bounds of max |a| and max |b| (``round_up``'s; NaN
    where an operand has a NaN). None where ``factors`` has none."""
    fa = factors(a.shape[-1])
    if fa is None:
        return None
    (ta, a_top), (tb, b_top) = round_up(torch, a, True), round_up(torch, b, True)
    with torch.no_grad():
        r = torch.matmul(ta, tb).float()
    return (r.numpy(),) + fa + ((a_top, b_top) if maxes else ())
