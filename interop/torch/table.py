"""The ATen op table of the torch adapter: :data:`ATEN_OPS` and :func:`register_aten`, what a
handler knows about its node (:class:`Ctx`), the helpers handlers share (torch's dtype
promotion and "opmath" arithmetic), and running one handler on one node (:func:`lookup`,
:func:`conform`). The handlers themselves live in ``aten_math``, ``aten_nn`` and
``aten_movement``."""
from __future__ import annotations

import operator

import numpy as np
import torch

import fpx.numpy as fnp
from fpx.core import FpxError, Tracer
from fpx.core import is_cupy as _is_cupy
from fpx.interop.torch.convert import BF16, E4M3, E5M2, F32, HALF, np_dtype, torch_dtype


class UnmappedOpError(FpxError, NotImplementedError):
    """An ATen op that fpx has no mapping for (and that torch cannot decompose further)."""

    def __init__(self, op: str, where: str = ""):
        super().__init__(
            f"fpx.interop.torch: ATen op '{op}' has no fpx mapping{where}. fpx never treats an "
            f"unknown op as exact: register one with "
            f"`@fpx.interop.torch.register_aten('{op}')` (a function of fpx.numpy/fpx.nn ops; "
            f"see docs/torch.md), or avoid the op.")
        self.op = op


class Ctx:
    """What a handler knows about the node it computes: the op, the dtype/shape torch gives
    its output(s), and ``layouts``: per positional argument, the tensor's ``(shape, strides,
    storage offset)`` in torch (``None`` for other arguments), for the ops whose meaning is
    the memory layout (``as_strided``)."""
    __slots__ = ("op", "dtype", "shape", "metas", "xp", "layouts")

    def __init__(self, op, metas, xp=np, layouts=()):
        self.op, self.metas, self.xp, self.layouts = op, metas, xp, tuple(layouts)
        first = metas[0] if metas else (None, None)
        self.dtype, self.shape = first


def layout_of(val):
    """``(shape, strides, storage offset)`` of a tensor (a graph node's FakeTensor or a real
    one), else ``None``."""
    if not isinstance(val, torch.Tensor):
        return None
    return (tuple(int(s) for s in val.shape), tuple(int(s) for s in val.stride()),
            int(val.storage_offset()))


ATEN_OPS: dict = {}


def register_aten(*names):
    """Decorator: ``handler(ctx, *args, **kwargs)`` computes ATen op(s) ``names`` (``"aten.add"``
    for every overload, ``"aten.add.Tensor"`` for one) with fpx ops. ``ctx.dtype``/``ctx.shape``
    are torch's output dtype (NumPy) and shape; the result is cast to that dtype if needed."""
    def deco(h):
        for n in names:
            ATEN_OPS[n] = h
        return h
    return deco


_REFUSED = {"aten.sym_size.int", "aten.sym_numel", "aten.sym_stride.int",
            "aten.sym_storage_offset"}


def covered_ops() -> list[str]:
    """The ATen ops (and overloads) with an fpx mapping, sorted."""
    return sorted(k for k in ATEN_OPS if k not in _REFUSED and k.startswith("aten."))


# -- helpers ----------------------------------------------------------------------------------
def is_arr(x) -> bool:
    return isinstance(x, (Tracer, np.ndarray, np.generic)) or (
        _is_cupy(x) and hasattr(x, "dtype"))


def dtype_of(x):
    dt = x.dtype
    return dt if isinstance(dt, np.dtype) else np.dtype(dt)


def shape_of(x):
    return tuple(x.shape)


def is_float(dt) -> bool:
    dt = np.dtype(dt)
    return dt.kind == "f" or dt in (BF16, E4M3, E5M2)


def cast(x, dt):
    if not isinstance(dt, np.dtype):
        dt = np.dtype(dt)
    if is_arr(x):
        return x if dtype_of(x) == dt else fnp.astype(x, dt)
    return np.asarray(x, dtype=dt)[()]


def opmath(dt):
    dt = np.dtype(dt)
    return F32 if dt in HALF else dt


def dim_of(d, nd):
    d = operator.index(d)
    return d % nd if nd else 0


def dims_of(dims, nd):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(nd))
    if isinstance(dims, (int, np.integer)):
        dims = (dims,)
    return tuple(sorted({dim_of(d, nd) for d in dims}))


def ints(v):
    return [int(i) for i in v] if isinstance(v, (list, tuple)) else [int(v)]


def const(ctx, value, dtype=None, shape=None):
    dt = np_dtype(dtype) if isinstance(dtype, torch.dtype) else (ctx.dtype if dtype is None
                                                                 else np.dtype(dtype))
    shp = ctx.shape if shape is None else tuple(shape)
    return ctx.xp.full(shp, value, dtype=dt)


def elementwise(fn, compute=None):
    """An elementwise op in torch's arithmetic: every operand converted to the dtype torch
    computes in (the result dtype; float32 for float16/bfloat16 results: opmath), Python
    scalars to that dtype, the result rounded to the output dtype."""
    def h(ctx, *xs, **kw):
        out = ctx.dtype
        comp = compute(ctx, xs) if compute is not None else opmath(out)
        ys = [cast(x, comp) if (is_arr(x) or isinstance(x, (bool, int, float))) else x
              for x in xs]
        return cast(fn(*ys, **kw), out)
    return h


def promoted(ctx, xs):
    """torch's type promotion of the operands (for comparisons, whose output is bool)."""
    probes = []
    for x in xs:
        if is_arr(x):
            probes.append(torch.empty((1,) * min(len(shape_of(x)), 1), dtype=torch_dtype(dtype_of(x))))
        elif isinstance(x, (bool, int, float)):
            probes.append(x)
    if not probes:
        return ctx.dtype
    if len(probes) == 1:
        p = probes[0]
        return np_dtype(p.dtype) if isinstance(p, torch.Tensor) else np.result_type(p)
    r = torch.result_type(probes[0], probes[1])
    for p in probes[2:]:
        r = torch.result_type(torch.empty((), dtype=r), p)
    return np_dtype(r)


def compare(fn):
    return elementwise(fn, compute=lambda ctx, xs: promoted(ctx, xs))


def result_dtype(ctx, dtype=None):
    """A reduction's result dtype: its ``dtype=`` argument, else the node's."""
    return np_dtype(dtype) if isinstance(dtype, torch.dtype) else ctx.dtype


def accumulate(ctx, x, dtype=None):
    """The dtype torch reduces in: float32 for float16/bfloat16 (then rounded once)."""
    out = result_dtype(ctx, dtype)
    return cast(x, opmath(out)), out


class Lazy:
    """A secondary output computed only when used (``getitem``), or an output fpx does not
    compute (``fn`` None: using it raises)."""
    __slots__ = ("fn", "what")

    def __init__(self, fn, what=""):
        self.fn, self.what = fn, what

    def get(self):
        if self.fn is None:
            raise UnmappedOpError(self.what or "secondary output", " (fpx computes only the "
                                  "main output of this op)")
        return self.fn()


# -- running a handler on a node ---------------------------------------------------------------
def lookup(func):
    name = str(func)
    h = ATEN_OPS.get(name)
    if h is None:
        h = ATEN_OPS.get(str(func.overloadpacket))
    return name, h


def conform(r, ctx):
    """Cast a handler's result(s) to torch's output dtype(s); check shapes."""
    if isinstance(r, tuple):
        return tuple(_conform1(x, ctx.op, m) for x, m in zip(r, ctx.metas + [(None, None)] *
                                                                 (len(r) - len(ctx.metas))))
    return _conform1(r, ctx.op, ctx.metas[0] if ctx.metas else (None, None))


def _conform1(x, op, meta):
    dt, shp = meta
    if not is_arr(x) or dt is None:
        return x
    if dtype_of(x) != dt:
        x = fnp.astype(x, dt)
    if shp is not None and shape_of(x) != shp:
        raise FpxError(f"fpx.interop.torch: internal error: the mapping of '{op}' gave shape "
                       f"{tuple(shape_of(x))}, torch {tuple(shp)}")
    return x


def meta_of(val):
    """[(np dtype, shape)] of a node's example value (FakeTensor or a tuple of them)."""
    if isinstance(val, torch.Tensor):
        return [(np_dtype(val.dtype), tuple(int(s) for s in val.shape))]
    if isinstance(val, (list, tuple)):
        out = []
        for v in val:
            out.extend(meta_of(v) if isinstance(v, torch.Tensor) else [(None, None)])
        return out
    return []


@register_aten("<built-in function getitem>")
def getitem(ctx, xs, i):
    v = xs[i]
    return v.get() if isinstance(v, Lazy) else v

