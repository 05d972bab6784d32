"""The checksummed GEMM's model and its two primitives: ``gemm`` (operands -> accumulator) and
``gemm_store`` (accumulator -> output format), which ``fpx.abft`` binds under its parent so
that an enclosing ``fpx.inject`` can put a fault inside the protected GEMM; plus the *site* of a
GEMM (the op and torch layer it belongs to) that both transforms report.

The model is an accelerator's mixed-precision GEMM: inputs in their own format (float64 ...
float8, or integers), products accumulated in float64 (float64 inputs), float32 (every narrower
float) or int64 (integers), and the result written in the output format (by default the
inputs' format; float16 for float8 inputs, as the V-ABFT paper's GPUs do). For float32 and
float64 operands the accumulator *is* the output and ``gemm`` is the plain BLAS call.
"""
from __future__ import annotations

import numpy as np

from fpx import formats
from fpx.core import Primitive

__all__ = ["GEMM", "STORE", "Site", "Model", "model_of", "batch3", "param_names", "site_layer"]


def _gemm_impl(B):
    if B.name == "numpy":
        from fpx.kernels import blas

        def gemm(a, b, *, acc, out=None, site=None):
            a = a if a.dtype == acc else a.astype(acc)
            b = b if b.dtype == acc else b.astype(acc)
            return blas.matmul(a, b)
        return gemm
    return lambda a, b, *, acc, out=None, site=None: B.xp.matmul(a.astype(acc), b.astype(acc))


def _store_impl(B):
    def store(x, *, to, site=None):
        return x.astype(to)            # float32 -> narrower: one correct rounding (RN)
    return store


#: ``gemm(a, b, *, acc, out, site)``: ``a @ b`` with both operands converted to the
#: accumulator dtype ``acc`` (exact: every narrower format embeds in it) -- NumPy's matmul
#: semantics; ``out`` names the output dtype a ``gemm_store`` will round it to (None: none).
GEMM = Primitive("gemm", _gemm_impl, kind="matmul",
                 doc="a @ b accumulated in the dtype `acc` (fpx.abft's checksummed GEMM).")
#: ``gemm_store(x, *, to, site)``: the accumulator rounded into the output dtype ``to``.
STORE = Primitive("gemm_store", _store_impl, kind="cast",
                  doc="A GEMM's accumulator rounded to its output format (fpx.abft).")


class Site:
    """Where a GEMM sits in the program: ``op`` (the outermost contraction it belongs to:
    "matmul", "linear", "conv", "einsum", ...), ``layer`` (a torch program's layer, from the
    parameter it multiplies, else None), ``weight`` (which GEMM operand, 0 or 1, holds the
    layer's weight), ``wshape`` (a linear or conv layer's weight shape, whose coordinates
    :meth:`weight_index` maps into the GEMM's weight operand)."""

    __slots__ = ("op", "layer", "weight", "wshape")

    def __init__(self, op, layer=None, weight=None, wshape=None):
        self.op, self.layer, self.weight, self.wshape = op, layer, weight, wshape

    def matches(self, name) -> bool:
        return name == self.op or (self.layer is not None and (
            name == self.layer or self.layer.startswith(name + ".")))

    def weight_index(self, idx, shape):
        """A layer weight's index (the parameter's coordinates) in the GEMM's weight operand
        of ``shape``: linear's (out, in) -> the transposed weight's (in, out); conv's
        (o, c, k...) -> the (O, C k... [+ bias]) matrix's (o, flat) or, with groups,
        (g, o', flat). Other indices are returned as they are."""
        if self.wshape is None or not isinstance(idx, tuple) or len(idx) != len(self.wshape):
            return idx
        if not all(-n <= int(i) < n for i, n in zip(idx, self.wshape)):
            return idx                         # out of range: the fault's own error says so
        idx = tuple(int(i) % n for i, n in zip(idx, self.wshape))
        if self.op == "linear" and len(idx) == 2:
            return (idx[1], idx[0])
        if self.op == "conv" and len(idx) >= 3:
            flat = int(np.ravel_multi_index(idx[1:], self.wshape[1:]))
            if len(shape) == 3:
                og = shape[1]
                return (idx[0] // og, idx[0] % og, flat)
            return (idx[0], flat)
        return idx

    def __repr__(self):
        return f"Site({self.op!r}" + (f", layer={self.layer!r}" if self.layer else "") + ")"


def _fmt(dt):
    try:
        return formats.get(np.dtype(dt))
    except (TypeError, ValueError, KeyError):
        return None


class Model:
    """One GEMM's arithmetic: ``kind`` "float", "int" or "bool"; ``acc`` (accumulator dtype),
    ``out`` (output Format, or the integer result dtype), ``result`` (the dtype NumPy's matmul
    returns: the program keeps it), ``inp`` (the operands' Format, for reports)."""

    __slots__ = ("kind", "acc", "out", "result", "inp")

    def __init__(self, kind, acc, out, result, inp):
        self.kind, self.acc, self.out, self.result, self.inp = kind, acc, out, result, inp

    @property
    def stores(self) -> bool:
        """Does the output format differ from the accumulator (a rounding after the GEMM)?"""
        return self.kind == "float" and np.dtype(self.out.dtype) != self.acc


def _matmul_result(da, db):
    if da.kind == "V" or db.kind == "V":
        return np.matmul(np.zeros((1, 1), da), np.zeros((1, 1), db)).dtype
    return np.result_type(da, db)


def model_of(da, db, output=None) -> Model:
    """The GEMM model for operand dtypes ``da``, ``db`` (see the module docstring);
    ``output`` overrides the output format."""
    da, db = np.dtype(da), np.dtype(db)
    res = _matmul_result(da, db)
    if res.kind == "b":
        return Model("bool", None, res, res, None)
    if res.kind in "iu":
        return Model("int", np.dtype(np.uint64 if res.kind == "u" else np.int64), res, res,
                     None)
    fa, fb = _fmt(da) if da.kind in "fV" else None, _fmt(db) if db.kind in "fV" else None
    fr = _fmt(res)
    if fr is None:
        raise TypeError(f"fpx.abft: a GEMM of {da} and {db} (result {res}) has no float format")
    acc = np.dtype(np.float64) if fr.name == "float64" else np.dtype(np.float32)
    fl = [f for f in (fa, fb) if f is not None]
    inp = fl[0] if len(fl) == 1 or (len(fl) == 2 and fl[0] == fl[1]) else fr
    if output is not None:
        out = formats.get(output)
        if out.dtype is None or np.dtype(out.dtype).itemsize > acc.itemsize:
            raise ValueError(f"fpx.abft: output format {out.name} must have a storage dtype no "
                             f"wider than the {acc} accumulator")
    elif fr.name == "float32" and len(fl) == 2 and all(f.bits < 32 for f in fl):
        # narrow inputs that NumPy multiplies in float32: the accelerator's output format
        out = formats.get("bfloat16" if any(f.name == "bfloat16" for f in fl) else "float16")
    else:
        out = fr
    return Model("float", acc, out, res, inp)


def batch3(x, bshape, rows, cols):
    """(G or 1, rows, cols) view of a matmul operand (a copy only where it is broadcast
    against another operand's batch dims)."""
    if all(d == 1 for d in x.shape[:-2]):
        return x.reshape(1, rows, cols)
    G = int(np.prod(bshape, dtype=np.int64))
    return np.broadcast_to(x, tuple(bshape) + (rows, cols)).reshape(G, rows, cols)


def _key(a):
    try:
        return (a.__array_interface__["data"][0], a.shape)
    except (AttributeError, TypeError, KeyError):
        return None


def param_names(ad) -> dict:
    """For a torch program (``fpx.transform.Adapted``), ``{(data pointer, shape): name}`` of
    its parameters, so a GEMM's weight operand names its layer; ``{}`` otherwise."""
    if ad.framework != "torch":
        return {}
    params = getattr(ad.fn, "params", None) or {}
    out = {}
    for name, v in params.items():
        k = _key(np.asarray(v)) if isinstance(v, np.ndarray) else None
        if k is not None and k[0]:
            out[k] = name
    return out


def site_layer(names: dict, operands) -> tuple:
    """``(layer, operand index)`` of the first operand that is a named parameter (its name
    without a trailing ``.weight``), or ``(None, None)``."""
    if not names:
        return None, None
    for i, a in enumerate(operands):
        if isinstance(a, np.ndarray):
            n = names.get(_key(a))
            if n is not None:
                return (n[:-len(".weight")] if n.endswith(".weight") else n), i
    return None, None

