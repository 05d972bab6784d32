"""The precision policy of Triton kernels run under fpx (:data:`TRITON`): what a kernel's
arithmetic may do on a GPU, widened to also hold what the CPU interpreter computes.

Triton lowers float32 ``/`` to ``div.full.f32`` (2 ulp), ``tl.sqrt`` to ``sqrt.approx.f32``
(1 ulp), ``tl.exp`` to ``ex2.approx.f32(x·log2 e)`` (``__expf``: 2 + floor(|1.173x|) ulp) and
``tl.exp2`` to ``ex2.approx.f32`` (2 ulp); ``tl.log``/``tl.log2`` and the rest call libdevice
(the CUDA table). Reductions and dots accumulate in the dtype the kernel gives them (``tl.sum``
of float16 promotes to float32 itself; ``tl.dot`` accumulates in its ``acc``/``out_dtype``),
tensor cores with 1 ulp per addition (round toward zero). Each allowance is the larger of the
GPU's and the interpreter's (NumPy on the host: the ``torch-cpu`` policy), so the bound holds
for a GPU run and for the interpreted run alike; the error tables are per function, as
:mod:`fpx.policy` documents.
"""
from __future__ import annotations

import numpy as np

from fpx import policy as _policy
from fpx import policy_tables as _tables
from fpx.interop.torch.policy import TORCH_CPU

_F32 = "float32"


def _gpu_or_host(name, gpu_ulps):
    """float32 accuracy of ``name``: the larger of the GPU's and the host policy's ulps."""
    host = TORCH_CPU.accuracy(name, _F32)
    if callable(gpu_ulps):        # exact at +-inf (ex2.approx(-inf) = 0): no ulps there
        ulps = lambda x: np.maximum(np.where(np.isfinite(x), gpu_ulps(x), 0.0),  # noqa: E731
                                    host.ulps)
    else:
        ulps = max(gpu_ulps, host.ulps)
    return _policy.Accuracy(ulps=ulps, absolute=host.absolute,
                            domain=f"max(GPU Triton, host interpreter) for {name}",
                            source="Triton NVIDIA lowering; " + (host.source or ""))


def _triton() -> _policy.Policy:
    cuda = _policy.get_policy("cuda")
    p = TORCH_CPU.replace(
        name="triton", matmul=_policy.OpPrecision(), reduction=_policy.OpPrecision(),
        notes="Triton kernels: approximate float32 division, sqrt, exp and exp2 as Triton "
              "lowers them on NVIDIA GPUs, libdevice elsewhere, accumulation in the dtype the "
              "kernel states (tensor cores: 1 ulp per addition); each allowance at least the "
              "host interpreter's (torch-cpu)")
    p = p.with_accuracy("div", _F32, _gpu_or_host("div", 2.5))
    p = p.with_accuracy("sqrt", _F32, _gpu_or_host("sqrt", 1.5))
    p = p.with_accuracy("exp", _F32, _gpu_or_host("exp", _tables.expf_ulps))
    p = p.with_accuracy("exp2", _F32, _gpu_or_host("exp2", 2.5))
    for name in ("log", "log2", "expm1", "log1p", "sin", "cos", "tan", "tanh", "sinh", "cosh",
                 "atan", "atan2", "pow", "erf"):    # libdevice (tl.log, tl.extra.libdevice)
        p = p.with_accuracy(name, _F32, _gpu_or_host(name, cuda.accuracy(name, _F32).ulps))
    p = p.with_accuracy("cast", "tf32", cuda.accuracy("cast", "tf32"))   # RN or truncation
    p = p.with_accuracy("matmul", None, _policy.Accuracy(
        1.0, domain="per addition in the accumulate format (tensor cores round toward zero)",
        source="Fasi et al. 2021"))
    return p.replace(name="triton")


#: The default policy of a program that launches Triton kernels.
TRITON = _triton()
