"""float32/float64 GEMMs on NumPy arrays through PyTorch's CPU BLAS (MKL) while fpx runs a
torch program (``torch_gemms()``, entered by ``fpx.interop.torch``); also, there, its layer
norm (``layer_norm``), strided reshapes (``reshape``) and the interval rules' sums of two
GEMMs (``matmul_sum``), below.

NumPy's ``matmul`` calls OpenBLAS; torch's calls MKL's ``sgemm``/``dgemm``, faster on the
transformer-sized GEMMs here, and a torch module's own GEMMs are MKL's. It also keeps every
GEMM of the run on one thread pool: the interval rules' bfloat16 radius GEMMs and oneDNN
convolutions run on torch's, and OpenBLAS's workers, spinning after each call, slow them
(``kernels/bf16.py``, ``kernels/conv.py``). A NumPy program keeps NumPy's GEMMs: its user's
own code is on OpenBLAS, and MKL's threads beside OpenBLAS's spinning ones would slow both.
A GEMM's summation order is the library's choice either way, and every fpx bound holds for
any order.

Used only where it is the same arithmetic as NumPy's: float32 or float64 operands of one
dtype, both at least 2-D (NumPy's broadcasting of the stacked dims is torch's too), with
strides torch can view (none negative or zero), writeable (torch warns on read-only views),
big enough (>= 2^15 multiply-adds) for the conversion's cost to pay, and torch's float32
matmul precision at "highest" with no oneDNN setting that would round float32 operands
(``torch.set_float32_matmul_precision("medium")`` lets a CPU GEMM use bfloat16). Everything
else is ``np.matmul``.
"""
from __future__ import annotations

import contextlib
import contextvars

import numpy as np

from fpx.kernels.conv import _ieee_fp32, _torch

_TORCH_GEMMS = contextvars.ContextVar("fpx_torch_gemms", default=False)


@contextlib.contextmanager
def torch_gemms():
    """Within: ``matmul`` runs on MKL where it applies (a torch program's run)."""
    token = _TORCH_GEMMS.set(True)
    try:
        yield
    finally:
        _TORCH_GEMMS.reset(token)


def active() -> bool:
    """Inside ``torch_gemms()`` (a torch program's run: no OpenBLAS GEMMs in it)."""
    return _TORCH_GEMMS.get()


def _viewable(a, min_ndim=2):
    return (type(a) is np.ndarray and a.ndim >= min_ndim and a.flags.writeable
            and all(s > 0 for s in a.strides))


def _engine(a, b):
    """torch, where it may run this GEMM (see the module docstring)."""
    if not (_TORCH_GEMMS.get() and _viewable(a) and _viewable(b) and a.dtype == b.dtype
            and a.dtype in (np.float32, np.float64) and a.shape[-1] == b.shape[-2]
            and a.shape[-1] * a.shape[-2] * b.shape[-1] >= 2 ** 15):
        return None
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:                  # NumPy's own error for mismatched shapes
        return None
    torch = _torch()
    if not (torch and torch.get_float32_matmul_precision() == "highest" and _ieee_fp32(torch)):
        return None
    return torch


def matmul(a, b):
    """``np.matmul(a, b)``, on MKL where it applies (see the module docstring)."""
    torch = _engine(a, b)
    if torch is None:
        return np.matmul(a, b)
    with torch.no_grad():
        return torch.matmul(torch.from_numpy(a), torch.from_numpy(b)).numpy()


def layer_norm(x, weight, bias, axes, eps):
    """torch's CPU layer norm (``torch.native_layer_norm``: a Welford mean and variance,
    ``(x - μ)·rstd·w + b``) of a NumPy array while a torch program runs -- the module's own
    kernel, so the value is the module's, faster than the decomposition's passes; None
    where it does not apply: outside ``torch_gemms()``, dtypes other than float32/float64,
    normalized axes not trailing, a weight/bias not of x's dtype and the normalized shape.
    fpx.interval's layer-norm rule covers this kernel's arithmetic (Welford and its merges,
    either spelling of the affine step); the decomposition stays the model other
    transforms run."""
    if not (_TORCH_GEMMS.get() and _viewable(x) and x.dtype in (np.float32, np.float64)):
        return None
    nd = x.ndim
    if tuple(axes) != tuple(range(nd - len(axes), nd)):
        return None
    tail = x.shape[nd - len(axes):]
    for p in (weight, bias):
        if p is not None and not (type(p) is np.ndarray and p.dtype == x.dtype
                                  and p.shape == tail and _viewable(p, 1)):
            return None
    torch = _torch()
    if not torch:
        return None
    with torch.no_grad():
        t = [None if p is None else torch.from_numpy(p) for p in (weight, bias)]
        return torch.native_layer_norm(torch.from_numpy(x), list(tail), t[0], t[1],
                                       float(eps))[0].numpy()


def softmax(x, axis):
    """torch's CPU softmax (``torch._softmax``: exp(x - max) by SLEEF's vectorized exp, a
    float32 sum, times the sum's reciprocal) of a NumPy array while a torch program runs --
    the module's own kernel, faster than the decomposition's NumPy passes; None where it
    does not apply (outside ``torch_gemms()``, dtypes other than float32/float64, no torch).
    fpx.interval's softmax rule covers this arithmetic (the policy's exp accuracy, any
    summation order, either spelling of the division); the decomposition stays the model
    other transforms run."""
    if not (_TORCH_GEMMS.get() and _viewable(x, 1) and x.dtype in (np.float32, np.float64)):
        return None
    torch = _torch()
    if not torch:
        return None
    with torch.no_grad():
        return torch.softmax(torch.from_numpy(x), int(axis)).numpy()


def reshape(a, shape):
    """``np.reshape(a, shape)``; while a torch program runs, a reshape that must copy (a
    strided view, as attention's head split makes) copies on torch's threads (NumPy's copy
    runs on one thread). The same elements in the same order either way."""
    if (_TORCH_GEMMS.get() and _viewable(a, 1) and a.size >= 2 ** 16
            and not a.flags.c_contiguous and a.dtype.kind in "fiub"):   # torch.from_numpy's
        torch = _torch()
        try:
            if torch:
                return torch.from_numpy(a).reshape(shape).numpy()
        except RuntimeError:            # a shape that does not fit: NumPy's own error below
            pass
    return np.reshape(a, shape)


def matmul_sum(a1, b1, a2, b2):
    """``a1 @ b1 + a2 @ b2`` as one float32/float64 sum per element on MKL while a torch
    program runs: the second GEMM accumulates into the first's result (``baddbmm_``/
    ``addmm_``, beta = 1), no concatenated operands and no extra pass; each element is a sum
    of all K1 + K2 products in some order, which is all the interval bounds assume.
    Operands of one dtype, one batch shape (flattened: a view where the strides allow) and
    matching matrix shapes; None elsewhere (the caller concatenates)."""
    torch = _engine(a1, b1)
    batch = a1.shape[:-2]
    if (torch is None or _engine(a2, b2) is None or a1.dtype != a2.dtype
            or not (b1.shape[:-2] == a2.shape[:-2] == b2.shape[:-2] == batch)
            or a1.shape[-2] != a2.shape[-2] or b1.shape[-1] != b2.shape[-1]):
        return None
    with torch.no_grad():
        t = [torch.from_numpy(z) for z in (a1, b1, a2, b2)]
        if batch:
            t = [z.reshape((-1,) + tuple(z.shape[-2:])) for z in t]
        r = torch.matmul(t[0], t[1])
        (r.baddbmm_ if r.ndim == 3 else r.addmm_)(t[2], t[3])
        return r.numpy().reshape(batch + r.shape[-2:])
