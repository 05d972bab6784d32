"""float32 convolution on NumPy arrays through oneDNN (PyTorch's CPU convolution), when torch
is installed.

``fpx.nn.conv`` is an im2col + one GEMM (its decomposition). On the CPU, oneDNN's direct
convolution does the same sums of products in another order, faster (no K-times larger
column matrix). The interval transform's bounds hold for any summation order, so both
describe the program's arithmetic.

Used only where it is the same arithmetic:

* float32 operands (oneDNN has no float64 convolution, and torch's float64 one, alone, is
  slower than im2col + DGEMM: float64 programs keep the decomposition), NumPy arrays,
  nothing empty;
* torch's float32 precision setting left at IEEE (``torch.backends.*.fp32_precision`` "none"
  or "ieee" at every level): a "tf32"/"bf16" setting would let oneDNN round the operands;
* ``torch.mkldnn_convolution`` is called directly, never the backend selection of
  ``F.conv2d``, which may pick NNPACK's Winograd/FFT algorithms (not sums of the products).

``conv_f32`` returns None wherever it does not apply; the caller runs the decomposition.
``conv_exact_f32`` (the interval rule's exact float64 centre of a float32 convolution) uses
torch's float64 convolution wherever ``conv_f32`` applies, to stay on one thread pool.
``conv_upper_bf16`` (the rule's radius, an upper bound of a convolution of the operands'
magnitudes) runs one oneDNN bfloat16 convolution of the operands rounded up to bfloat16 where
the CPU has bfloat16 instructions (AVX512-BF16): faster than the float32 one.
``conv_blocks_f32`` (the parts of the rule's default centre of a point convolution): oneDNN
float32 convolutions over blocks of input channels, which the rule adds in float64 --
faster than torch's float64 convolution.
torch is imported on the first call that could use it (not at ``import fpx``).
"""
from __future__ import annotations


import numpy as np

from fpx.kernels import bf16 as _bf16

_TORCH = None          # the torch module once imported; False when unavailable


def _torch():
    global _TORCH
    if _TORCH is None:
        try:
            import torch
            _TORCH = torch if (hasattr(torch, "mkldnn_convolution")
                               and torch.backends.mkldnn.is_available()) else False
        except Exception:          # not installed, or a broken install: the decomposition
            _TORCH = False
    return _TORCH


def _ieee_fp32(torch) -> bool:
    """No level of torch's float32 precision setting lets oneDNN round float32 operands."""
    b = torch.backends
    levels = [getattr(b, "fp32_precision", "none"),
              getattr(b.mkldnn, "fp32_precision", "none"),
              getattr(getattr(b.mkldnn, "conv", None), "fp32_precision", "none")]
    return all(lv in ("none", "ieee") for lv in levels) and \
        not getattr(b.mkldnn, "allow_tf32", False)


def _engine(x, w, b):
    """torch, where oneDNN may run this float32 convolution (see the module docstring)."""
    if not (type(x) is np.ndarray and type(w) is np.ndarray and x.dtype == np.float32
            and w.dtype == np.float32 and x.size and w.size
            and (b is None or (type(b) is np.ndarray and b.dtype == np.float32))):
        return None
    torch = _torch()
    return torch if torch and _ieee_fp32(torch) else None


def _tensors(torch, x, w, b, padding, dtype=None):
    """torch views of the operands (float64 copies for ``dtype``), symmetric padding."""
    if any(lo != hi for lo, hi in padding):           # oneDNN pads symmetrically
        x = np.pad(x, ((0, 0), (0, 0)) + tuple(padding))
        pad = [0] * len(padding)
    else:
        pad = [lo for lo, _ in padding]
    # (a copy, not ascontiguousarray: a flipped length-1 axis keeps its negative stride in
    # an array NumPy already calls contiguous, which torch refuses)
    # (and a copy of a read-only array -- a kept constant -- which torch warns about)
    ts = [None if a is None else torch.from_numpy(
        a if all(s >= 0 for s in a.strides) and a.flags.writeable else a.copy())
        for a in (x, w, b)]
    if dtype is not None:
        ts = [None if t is None else t.to(dtype) for t in ts]
    return ts, pad


def conv_f32(x, w, b, stride, padding, dilation, groups):
    """``sum_{c,t} x_pad[n, c, i·s + t·d] · w[o, c, t] (+ b[o] as one more term)`` by oneDNN,
    as a float32 NumPy array; ``padding`` is ((lo, hi), ...) per spatial dim. None where it
    does not apply (see the module docstring)."""
    torch = _engine(x, w, b)
    if torch is None:
        return None
    (tx, tw, tb), pad = _tensors(torch, x, w, b, padding)
    with torch.no_grad():
        y = torch.mkldnn_convolution(tx, tw, tb, pad, list(stride), list(dilation), int(groups))
    return y.contiguous().numpy()


def conv_exact_f32(x, w, b, stride, padding, dilation, groups):
    """The same float32 convolution summed in float64 (the products are exact; the error is
    at most γ_{K+1}(2^-53)·Σ|x·w| in any order): torch's float64 convolution (im2col + GEMM
    on torch's own thread pool), where ``conv_f32`` applies. NumPy's float64 GEMM there would
    wake OpenBLAS's worker threads, whose spinning after each call slows the next oneDNN
    convolutions. None where it does not apply."""
    torch = _engine(x, w, b)
    return None if torch is None else _conv_float64(torch, x, w, b, stride, padding, dilation,
                                                    groups)


def _conv_float64(torch, x, w, b, stride, padding, dilation, groups):
    """torch's float64 convolution of the operands (converted exactly), as a NumPy array."""
    (tx, tw, tb), pad = _tensors(torch, x, w, b, padding, torch.float64)
    with torch.no_grad():
        y = torch.convolution(tx, tw, tb, list(stride), pad, list(dilation), False,
                              [0] * len(pad), int(groups))
    return y.contiguous().numpy()


def conv_blocks_f32(x, w, stride, padding, dilation, groups, blocks):
    """(parts, K_j): ``[conv(x_j, w_j) for j in range(blocks)]`` over ``blocks`` contiguous
    blocks of each group's input channels, each a oneDNN float32 convolution (no bias), and
    the largest block's number of terms K_j: the blocks' outputs sum to the whole
    convolution in exact arithmetic, and block j's float32 sum errs like any float32 sum of
    K_j products. None where ``conv_f32`` does not apply or a group has fewer than
    ``blocks`` input channels."""
    torch = _engine(x, w, None)
    cg = w.shape[1]
    if torch is None or blocks < 2 or cg < blocks:
        return None
    (tx, tw, _), pad = _tensors(torch, x, w, None, padding)
    edges = [cg * j // blocks for j in range(blocks + 1)]
    n, sp, g = tx.shape[0], tuple(tx.shape[2:]), int(groups)
    xg = tx.reshape((n, g, cg) + sp)
    parts = []
    with torch.no_grad():
        for lo, hi in zip(edges[:-1], edges[1:]):
            xj = xg[:, :, lo:hi].reshape((n, g * (hi - lo)) + sp).contiguous()
            wj = tw[:, lo:hi].contiguous()
            y = torch.mkldnn_convolution(xj, wj, None, pad, list(stride), list(dilation), g)
            parts.append(y.contiguous().numpy())
    k_taps = int(np.prod(w.shape[2:]))
    return parts, max(hi - lo for lo, hi in zip(edges[:-1], edges[1:])) * k_taps


def conv_upper_bf16(x, w, b, stride, padding, dilation, groups, maxes=False):
    """(R, f, a) with conv(|x|, |w|) (+ |b|) <= R·f + a elementwise in exact arithmetic, for
    float32 x, w (and b, one more term of each sum), from one oneDNN bfloat16 convolution of
    their magnitudes rounded up to bfloat16 (``round_up`` drops the signs; the bound of
    ``fpx.kernels.bf16``, with k = the products and the bias per sum). ``maxes``: also upper
    bounds of max |x| and max |w| (NaN where one has a NaN). None where ``conv_f32`` does not
    apply or the CPU has no bfloat16 instructions."""
    torch = _engine(x, w, b)
    if torch is None or not _bf16.native(torch):
        return None
    fa = _bf16.factors(int(np.prod(w.shape[1:])) + (b is not None))
    if fa is None:
        return None
    (tx, tw, tb), pad = _tensors(torch, x, w, b, padding)
    (xb, x_top), (wb, w_top) = _bf16.round_up(torch, tx, True), _bf16.round_up(torch, tw, True)
    bb = None if tb is None else _bf16.round_up(torch, tb)
    with torch.no_grad():
        y = torch.mkldnn_convolution(xb, wb, bb, pad, list(stride), list(dilation), int(groups))
    return (y.float().numpy(),) + fa + ((x_top, w_top) if maxes else ())
