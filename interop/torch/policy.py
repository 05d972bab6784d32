"""The precision policies that describe torch's arithmetic: :data:`TORCH_CPU` (torch's CPU
kernels) and :func:`default_policy` (that, or the CUDA policy that torch's TF32 and
reduced-precision switches select)."""
from __future__ import annotations

import functools

import torch

from fpx import policy as _policy

TORCH_CPU = _policy.NUMPY.replace(
    name="torch-cpu",
    notes="torch's CPU kernels (SLEEF u10 libm, MKL/oneDNN GEMMs; float16/bfloat16 computed in "
          "float32 and rounded once): the 'numpy' preset, whose libm allowances cover SLEEF's "
          "1-ulp functions, with float32 erf widened for torch's vectorized erf "
          "(Abramowitz-Stegun 7.1.26, used by gelu)",
).with_accuracy(
    "erf", "float32", ulps=1.5, absolute=2.0 ** -20,
    domain="abs 2^-20 + 1.5 ulp: torch Vectorized<float>::erf is the A&S 7.1.26 polynomial "
           "(|error| <= 1.5e-7 in exact arithmetic; 6.9e-7 measured in float32 gelu on AVX512)",
    source="torch/include/ATen/cpu/vec/vec512/vec512_float.h erf(); measured here against "
           "float64 math.erf on 2e6 points in [-10, 10]")
TORCH_CPU = TORCH_CPU.replace(name="torch-cpu")


def default_policy(device="cpu", convolves=True):
    """The policy describing torch's arithmetic on ``device``: :data:`TORCH_CPU` on CPU;
    ``"cuda"`` on CUDA, ``"tf32"`` when ``torch.backends.cuda.matmul.allow_tf32`` is set, or
    when the program ``convolves`` and ``torch.backends.cudnn.allow_tf32`` is set (its
    default: cuDNN convolutions round their inputs to tf32 unless told not to); with
    ``"+half-reduction"`` (float16/bfloat16 GEMMs accumulating in their own format) while
    ``torch.backends.cuda.matmul.allow_fp16/bf16_reduced_precision_reduction`` is set (their
    default: cuBLAS may then reduce split-K partial sums in half precision)."""
    if torch.device(device).type != "cuda":
        return TORCH_CPU
    mm = torch.backends.cuda.matmul
    tf32 = bool(mm.allow_tf32 or (convolves and torch.backends.cudnn.allow_tf32))
    half = bool(mm.allow_fp16_reduced_precision_reduction
                or mm.allow_bf16_reduced_precision_reduction)
    return _cuda_policy(tf32, half)


@functools.lru_cache(maxsize=None)
def _cuda_policy(tf32: bool, half: bool):
    p = _policy.get_policy("tf32" if tf32 else "cuda")
    if half:
        p = p.replace(name=p.name + "+half-reduction",
                      matmul=_policy.OpPrecision(input=p.matmul.input),
                      notes=p.notes + "; float16/bfloat16 matmuls accumulate in their own "
                            "format (torch's allow_*_reduced_precision_reduction)")
    return p
