"""Moving values between torch and fpx: torch dtypes as NumPy dtypes (ml_dtypes for bfloat16
and float8), tensors as NumPy/CuPy arrays sharing their memory and back, and torch's
structseq results (``x.max(1)``) as fpx pytree nodes."""
from __future__ import annotations

import numpy as np
import torch

from fpx import formats as _formats
from fpx import tree
from fpx.core import concrete
from fpx.core import is_cupy as _is_cupy

BF16 = _formats.bfloat16.dtype
E4M3 = _formats.float8_e4m3fn.dtype
E5M2 = _formats.float8_e5m2.dtype
_NP_OF = {
    torch.float64: np.dtype(np.float64), torch.float32: np.dtype(np.float32),
    torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(BF16),
    torch.float8_e4m3fn: np.dtype(E4M3), torch.float8_e5m2: np.dtype(E5M2),
    torch.int64: np.dtype(np.int64), torch.int32: np.dtype(np.int32),
    torch.int16: np.dtype(np.int16), torch.int8: np.dtype(np.int8),
    torch.uint8: np.dtype(np.uint8), torch.bool: np.dtype(np.bool_),
}
_TORCH_OF = {v: k for k, v in _NP_OF.items()}
# formats NumPy/CuPy cannot hold natively: moved as bit patterns of this integer type
_BITS = {torch.bfloat16: (torch.int16, np.int16), torch.float8_e4m3fn: (torch.uint8, np.uint8),
         torch.float8_e5m2: (torch.uint8, np.uint8)}
HALF = (np.dtype(np.float16), np.dtype(BF16))

# torch's structseq results (``x.max(1)`` -> ``torch.return_types.max``) are pytree nodes
for _cls in getattr(torch.return_types, "all_return_types", []):
    tree.register_node(_cls, lambda x: (list(x), None), lambda aux, ch, _cls=_cls: _cls(ch))
F32 = np.dtype(np.float32)


def np_dtype(td) -> np.dtype:
    """The NumPy dtype (ml_dtypes for bfloat16/float8) of a torch dtype."""
    try:
        return _NP_OF[td]
    except KeyError:
        raise TypeError(f"fpx.interop.torch: torch dtype {td} is not supported (fpx handles "
                        "real floating point, integers and bools)") from None


def torch_dtype(nd) -> "torch.dtype":
    """The torch dtype of a NumPy dtype."""
    try:
        return _TORCH_OF[np.dtype(nd)]
    except KeyError:
        raise TypeError(f"fpx.interop.torch: dtype {nd} has no torch equivalent") from None


def to_array(t):
    """A torch tensor as a NumPy (CPU) or CuPy (CUDA, DLPack) array sharing its memory;
    bfloat16/float8 through a bit view into ml_dtypes' dtypes (CPU only: CuPy has no such
    dtypes)."""
    t = t.detach()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    bits = _BITS.get(t.dtype)
    if t.device.type == "cpu":
        if bits is not None:
            return t.view(bits[0]).numpy().view(np_dtype(t.dtype))
        np_dtype(t.dtype)
        return t.numpy()
    if t.device.type == "cuda":
        if bits is not None:
            raise TypeError(f"fpx.interop.torch: {t.dtype} CUDA tensors cannot be shared with "
                            "CuPy (no such dtype there); move them to the CPU")
        import cupy
        return cupy.from_dlpack(t)
    raise TypeError(f"fpx.interop.torch: tensors on device {t.device} are not supported "
                    "(CPU via NumPy, CUDA via CuPy)")


def to_tensor(a, device=None):
    """An array (NumPy, CuPy, NumPy scalar) as a torch tensor of the same dtype: CPU tensors
    share memory with NumPy arrays where possible, CUDA tensors with CuPy arrays (DLPack)."""
    a = concrete(a)
    if _is_cupy(a):
        t = torch.from_dlpack(a)
        return t if device is None else t.to(device)
    a = np.asarray(a)
    if a.dtype.kind not in "fiub" and a.dtype not in (BF16, E4M3, E5M2):
        raise TypeError(f"fpx.interop.torch: cannot make a torch tensor of dtype {a.dtype}")
    if not a.flags.writeable or any(s < 0 for s in a.strides) or not (
            a.flags.c_contiguous or a.flags.f_contiguous):
        a = np.ascontiguousarray(a).copy() if not a.flags.writeable else np.ascontiguousarray(a)
    td = _TORCH_OF[a.dtype]
    bits = _BITS.get(td)
    t = torch.from_numpy(a.view(bits[1])).view(td) if bits else torch.from_numpy(a)
    return t if device is None or torch.device(device).type == "cpu" else t.to(device)


def carried(x):
    """The value an fpx result leaf stands for -- ``x.value`` where ``x`` has a method
    ``_fpx_convert`` (an ``Interval`` input) -- else ``x`` itself."""
    return x.value if hasattr(x, "_fpx_convert") else x
