"""``fpx.interop.torch``: torch modules and functions as fpx programs.

    fn, params = fpx.interop.torch.from_module(module, (x,))   # a pure fpx function
    y = fn(params, x.numpy())                                   # NumPy in, NumPy out
    iv = fpx.interval(module)(x)            # every transform takes the module directly
    rec = fpx.trace(module)(x)

**Export path.** ``torch.export.export(module, example_inputs)`` captures the program as a
graph of ATen ops; ``run_decompositions`` lowers it to core ATen, except for the ops fpx keeps
as composites so that transforms can give them tight rules (``linear``,
``scaled_dot_product_attention``; ``convolution``, ``native_layer_norm``, ``_softmax``,
``gelu`` are core ATen already). An interpreter walks the graph and maps each ATen op to fpx
primitives and composites (:data:`ATEN_OPS`, the table in ``docs/torch.md``). The parameters
and buffers become the function's ``params`` argument: the result is a pure function.

**Fallback.** Programs ``export`` rejects (Python control flow on tensor values) run eagerly
under a ``TorchDispatchMode``: torch executes each ATen op, fpx computes the same op on its own
values, and the tensor torch goes on with carries fpx's values -- so Python control flow sees
what fpx computed (and an interval's "unstable branch" is recorded). Ops without an fpx mapping
are decomposed with torch's decompositions with the mode re-entered; an op that neither maps
nor decomposes raises :class:`UnmappedOpError` naming it. Nothing is ever silently exact.

**Semantics.** Each op follows torch's arithmetic, not NumPy's: operands are converted to the
result dtype torch computes in; float16/bfloat16 elementwise ops run in float32 and round once
(torch's "opmath"), as do their softmax, layer norm and reductions; ``addmm``/``linear``/conv
biases are one more term of the matmul's sum (BLAS ``beta=1``); eval-mode batch norm is
``x * alpha + beta`` with torch's ``alpha = w / sqrt(var + eps)``, ``beta = b - mean * alpha``.

**Policy.** :data:`TORCH_CPU` is ``"numpy"`` with the error of torch's vectorized float32
``erf`` (Abramowitz-Stegun 7.1.26 inside ``gelu``: up to ~7e-7 absolute, measured); CUDA inputs
use ``"cuda"`` (``"tf32"`` when ``torch.backends.cuda.matmul.allow_tf32``).
"""
from __future__ import annotations

import contextlib
import functools
import io
import logging
import math
import operator
import threading
import warnings
import weakref

import numpy as np
import torch
import torch.utils._pytree as _pytree

import fpx.nn as fnn
import fpx.numpy as fnp
from fpx import formats as _formats
from fpx import policy as _policy
from fpx import tree
from fpx.kernels import blas as _blas
from fpx.core import FpxError, Tracer, concrete
from fpx.core import is_cupy as _is_cupy, to_host
from fpx.transform import Adapted

__all__ = ["from_module", "TorchProgram", "to_array", "to_tensor", "adapt", "ATEN_OPS",
           "register_aten", "UnmappedOpError", "TORCH_CPU", "default_policy", "covered_ops"]

# =============================================================================================
# dtypes and conversion
# =============================================================================================
_BF16 = _formats.bfloat16.dtype
_E4M3 = _formats.float8_e4m3fn.dtype
_E5M2 = _formats.float8_e5m2.dtype
_NP_OF = {
    torch.float64: np.dtype(np.float64), torch.float32: np.dtype(np.float32),
    torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(_BF16),
    torch.float8_e4m3fn: np.dtype(_E4M3), torch.float8_e5m2: np.dtype(_E5M2),
    torch.int64: np.dtype(np.int64), torch.int32: np.dtype(np.int32),
    torch.int16: np.dtype(np.int16), torch.int8: np.dtype(np.int8),
    torch.uint8: np.dtype(np.uint8), torch.bool: np.dtype(np.bool_),
}
_TORCH_OF = {v: k for k, v in _NP_OF.items()}
# formats NumPy/CuPy cannot hold natively: moved as bit patterns of this integer type
_BITS = {torch.bfloat16: (torch.int16, np.int16), torch.float8_e4m3fn: (torch.uint8, np.uint8),
         torch.float8_e5m2: (torch.uint8, np.uint8)}
_HALF = (np.dtype(np.float16), np.dtype(_BF16))

# torch's structseq results (``x.max(1)`` -> ``torch.return_types.max``) are pytree nodes
for _cls in getattr(torch.return_types, "all_return_types", []):
    tree.register_node(_cls, lambda x: (list(x), None), lambda aux, ch, _cls=_cls: _cls(ch))
_F32 = np.dtype(np.float32)


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
    if a.dtype.kind not in "fiub" and a.dtype not in (_BF16, _E4M3, _E5M2):
        raise TypeError(f"fpx.interop.torch: cannot make a torch tensor of dtype {a.dtype}")
    if not a.flags.writeable or any(s < 0 for s in a.strides) or not (
            a.flags.c_contiguous or a.flags.f_contiguous):
        a = np.ascontiguousarray(a).copy() if not a.flags.writeable else np.ascontiguousarray(a)
    td = _TORCH_OF[a.dtype]
    bits = _BITS.get(td)
    t = torch.from_numpy(a.view(bits[1])).view(td) if bits else torch.from_numpy(a)
    return t if device is None or torch.device(device).type == "cpu" else t.to(device)


# =============================================================================================
# The policy of torch's CPU kernels
# =============================================================================================
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


def _convolves(prog) -> bool:
    """Does the program call a convolution? (True when unknown: the dispatch fallback.)"""
    if prog.exported is None:
        return True
    return any("convolution" in str(n.target) for n in prog.exported.graph.nodes)


# =============================================================================================
# Errors
# =============================================================================================
class UnmappedOpError(FpxError, NotImplementedError):
    """An ATen op that fpx has no mapping for (and that torch cannot decompose further)."""

    def __init__(self, op: str, where: str = ""):
        super().__init__(
            f"fpx.interop.torch: ATen op '{op}' has no fpx mapping{where}. fpx never treats an "
            f"unknown op as exact: register one with "
            f"`@fpx.interop.torch.register_aten('{op}')` (a function of fpx.numpy/fpx.nn ops; "
            f"see docs/torch.md), or avoid the op.")
        self.op = op


# =============================================================================================
# The op table
# =============================================================================================
class _Ctx:
    """What a handler knows about the node it computes: the op, and the dtype/shape torch
    gives its output(s)."""
    __slots__ = ("op", "dtype", "shape", "metas", "xp")

    def __init__(self, op, metas, xp=np):
        self.op, self.metas, self.xp = op, metas, xp
        first = metas[0] if metas else (None, None)
        self.dtype, self.shape = first


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


_op = register_aten


_REFUSED = {"aten.sym_size.int", "aten.sym_numel", "aten.sym_stride.int",
            "aten.sym_storage_offset"}


def covered_ops() -> list[str]:
    """The ATen ops (and overloads) with an fpx mapping, sorted."""
    return sorted(k for k in ATEN_OPS if k not in _REFUSED and k.startswith("aten."))


# -- helpers ----------------------------------------------------------------------------------
def _is_arr(x) -> bool:
    return isinstance(x, Tracer) or isinstance(x, (np.ndarray, np.generic)) or (
        _is_cupy(x) and hasattr(x, "dtype"))


def _dt(x):
    return np.dtype(x.dtype)


def _shape(x):
    return tuple(x.shape)


def _is_float(dt) -> bool:
    dt = np.dtype(dt)
    return dt.kind == "f" or dt in (_BF16, _E4M3, _E5M2)


def _cast(x, dt):
    dt = np.dtype(dt)
    if _is_arr(x):
        return x if _dt(x) == dt else fnp.astype(x, dt)
    return np.asarray(x, dtype=dt)[()]


def _opmath(dt):
    dt = np.dtype(dt)
    return _F32 if dt in _HALF else dt


def _dim(d, nd):
    d = operator.index(d)
    return d % nd if nd else 0


def _dims(dims, nd):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(nd))
    if isinstance(dims, (int, np.integer)):
        dims = (dims,)
    return tuple(sorted({_dim(d, nd) for d in dims}))


def _ints(v):
    return [int(i) for i in v] if isinstance(v, (list, tuple)) else [int(v)]


def _const(ctx, value, dtype=None, shape=None):
    dt = np_dtype(dtype) if isinstance(dtype, torch.dtype) else (ctx.dtype if dtype is None
                                                                 else np.dtype(dtype))
    shp = ctx.shape if shape is None else tuple(shape)
    return ctx.xp.full(shp, value, dtype=dt)


def _elementwise(fn, compute=None):
    """An elementwise op in torch's arithmetic: every operand converted to the dtype torch
    computes in (the result dtype; float32 for float16/bfloat16 results: opmath), Python
    scalars to that dtype, the result rounded to the output dtype."""
    def h(ctx, *xs, **kw):
        out = ctx.dtype
        comp = compute(ctx, xs) if compute is not None else _opmath(out)
        ys = [_cast(x, comp) if (_is_arr(x) or isinstance(x, (bool, int, float))) else x
              for x in xs]
        return _cast(fn(*ys, **kw), out)
    return h


def _promoted(ctx, xs):
    """torch's type promotion of the operands (for comparisons, whose output is bool)."""
    probes = []
    for x in xs:
        if _is_arr(x):
            probes.append(torch.empty((1,) * min(len(_shape(x)), 1), dtype=torch_dtype(_dt(x))))
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


def _compare(fn):
    return _elementwise(fn, compute=lambda ctx, xs: _promoted(ctx, xs))


# -- elementwise arithmetic ---------------------------------------------------------------------
def _add(a, b, alpha=1):
    return fnp.add(a, b if alpha == 1 else fnp.multiply(b, _cast(alpha, _dt(b))))


def _sub(a, b, alpha=1):
    return fnp.subtract(a, b if alpha == 1 else fnp.multiply(b, _cast(alpha, _dt(b))))


_op("aten.add.Tensor", "aten.add.Scalar")(_elementwise(_add))
_op("aten.sub.Tensor", "aten.sub.Scalar")(_elementwise(_sub))
_op("aten.rsub.Scalar", "aten.rsub.Tensor")(_elementwise(lambda a, b, alpha=1: _sub(b, a, alpha)))
_op("aten.mul.Tensor", "aten.mul.Scalar")(_elementwise(fnp.multiply))
_op("aten.div.Tensor", "aten.div.Scalar")(_elementwise(fnp.divide))


@_op("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(ctx, a, b, *, rounding_mode=None):
    comp = _opmath(ctx.dtype)
    a, b = _cast(a, comp), _cast(b, comp)
    if rounding_mode is None:
        return fnp.divide(a, b)
    if rounding_mode == "floor":
        return fnp.floor_divide(a, b)
    if _is_float(comp):
        return fnp.trunc(fnp.divide(a, b))
    q = fnp.floor_divide(a, b)             # integer trunc division: floor, +1 where signs differ
    fix = fnp.logical_and(fnp.not_equal(fnp.remainder(a, b), 0),
                          fnp.less(fnp.multiply(fnp.sign(a), fnp.sign(b)), 0))
    return fnp.add(q, fnp.astype(fix, _dt(q)))


_op("aten.neg")(_elementwise(fnp.negative))
_op("aten.abs")(_elementwise(fnp.abs))
_op("aten.sqrt")(_elementwise(fnp.sqrt))
_op("aten.rsqrt")(_elementwise(lambda x: fnp.divide(_cast(1, _dt(x)), fnp.sqrt(x))))
_op("aten.reciprocal")(_elementwise(lambda x: fnp.divide(_cast(1, _dt(x)), x)))
for _n, _f in {"exp": fnp.exp, "exp2": fnp.exp2, "expm1": fnp.expm1, "log": fnp.log,
               "log2": fnp.log2, "log1p": fnp.log1p, "sin": fnp.sin, "cos": fnp.cos,
               "tan": fnp.tan, "tanh": fnp.tanh, "sinh": fnp.sinh, "cosh": fnp.cosh,
               "atan": fnp.arctan, "erf": fnp.erf, "floor": fnp.floor, "ceil": fnp.ceil,
               "round": fnp.rint, "trunc": fnp.trunc, "sign": fnp.sign,
               "sigmoid": fnn.sigmoid, "relu": fnn.relu}.items():
    _op(f"aten.{_n}.default")(_elementwise(_f))
_op("aten.atan2")(_elementwise(fnp.arctan2))
_op("aten.log10")(_elementwise(lambda x: fnp.multiply(fnp.log(x), _cast(1 / math.log(10), _dt(x)))))
_op("aten.silu")(_elementwise(fnn.silu))
_op("aten.maximum")(_elementwise(fnp.maximum))
_op("aten.minimum")(_elementwise(fnp.minimum))
_op("aten.remainder")(_elementwise(fnp.remainder))


@_op("aten.fmod")
def _fmod(ctx, a, b):
    """C fmod (the sign of the dividend), on integers: remainder, moved toward 0."""
    if _is_float(ctx.dtype):
        raise UnmappedOpError(ctx.op, " on floating-point tensors (an exact fmod has no fpx "
                                      "primitive)")
    a, b = _cast(a, ctx.dtype), _cast(b, ctx.dtype)
    r = fnp.remainder(a, b)
    off = fnp.logical_and(fnp.not_equal(r, 0),
                          fnp.not_equal(fnp.less(r, 0), fnp.less(a, 0)))
    return fnp.where(off, fnp.subtract(r, b), r)


@_op("aten.linalg_vector_norm")
def _vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """||x||_ord over ``dim``: sqrt(sum(x*x)) (2), sum|x| (1), max|x| (inf), min|x| (-inf),
    count of nonzeros (0), sum(|x|^p)^(1/p) otherwise; in opmath, rounded once."""
    y, out = _acc(ctx, x, dtype)
    axes = _dims(dim, len(_shape(x)))
    a = fnp.abs(y)
    if ord == 2:
        r = fnp.sqrt(fnp.sum(fnp.multiply(y, y), axes, keepdims=keepdim))
    elif ord == 1:
        r = fnp.sum(a, axes, keepdims=keepdim)
    elif ord == math.inf:
        r = fnp.max(a, axes, keepdims=keepdim)
    elif ord == -math.inf:
        r = fnp.min(a, axes, keepdims=keepdim)
    elif ord == 0:
        r = fnp.sum(fnp.astype(fnp.not_equal(y, 0), _dt(y)), axes, keepdims=keepdim)
    else:
        p = _cast(ord, _dt(y))
        r = fnp.power(fnp.sum(fnp.power(a, p), axes, keepdims=keepdim),
                      _cast(1.0 / ord, _dt(y)))
    return _cast(r, out)
_op("aten.floor_divide")(_elementwise(fnp.floor_divide))


@_op("aten.round.decimals")
def _round_dec(ctx, x, *, decimals=0):
    return _cast(fnp.round(_cast(x, _opmath(ctx.dtype)), decimals), ctx.dtype)


@_op("aten.gelu")
def _gelu(ctx, x, *, approximate="none"):
    return _cast(fnn.gelu(_cast(x, _opmath(ctx.dtype)), approximate=approximate), ctx.dtype)


@_op("aten.pow.Tensor_Scalar")
def _pow_scalar(ctx, x, e):
    """torch's pow(tensor, scalar) kernel: 2 -> x*x, 3 -> x*x*x, 0.5 -> sqrt, -0.5 -> rsqrt,
    -1 -> reciprocal, -2 -> 1/(x*x); other exponents std::pow."""
    comp = _opmath(ctx.dtype)
    x = _cast(x, comp)
    if _is_float(comp):
        one = _cast(1, comp)
        if e == 2:
            return _cast(fnp.multiply(x, x), ctx.dtype)
        if e == 3:
            return _cast(fnp.multiply(fnp.multiply(x, x), x), ctx.dtype)
        if e == 0.5:
            return _cast(fnp.sqrt(x), ctx.dtype)
        if e == -0.5:
            return _cast(fnp.divide(one, fnp.sqrt(x)), ctx.dtype)
        if e == -1:
            return _cast(fnp.divide(one, x), ctx.dtype)
        if e == -2:
            return _cast(fnp.divide(one, fnp.multiply(x, x)), ctx.dtype)
    return _cast(fnp.power(x, _cast(e, comp)), ctx.dtype)


_op("aten.pow.Tensor_Tensor", "aten.pow.Scalar")(_elementwise(fnp.power))


@_op("aten.clamp", "aten.clamp.Tensor", "aten.hardtanh")
def _clamp(ctx, x, min=None, max=None):
    comp = _opmath(ctx.dtype)
    y = _cast(x, comp)
    if min is not None:
        y = fnp.maximum(y, _cast(min, comp))
    if max is not None:
        y = fnp.minimum(y, _cast(max, comp))
    return _cast(y, ctx.dtype)


_op("aten.clamp_min")(lambda ctx, x, m: _clamp(ctx, x, m, None))
_op("aten.clamp_max")(lambda ctx, x, m: _clamp(ctx, x, None, m))


@_op("aten.leaky_relu")
def _leaky_relu(ctx, x, negative_slope=0.01):
    comp = _opmath(ctx.dtype)
    y = _cast(x, comp)
    return _cast(fnp.where(fnp.greater(y, _cast(0, comp)), y,
                           fnp.multiply(y, _cast(negative_slope, comp))), ctx.dtype)


@_op("aten.elu")
def _elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    comp = _opmath(ctx.dtype)
    y = _cast(x, comp)
    neg = fnp.multiply(fnp.expm1(fnp.multiply(y, _cast(input_scale, comp))), _cast(alpha, comp))
    r = fnp.where(fnp.greater(y, _cast(0, comp)), y, neg)
    return _cast(r if scale == 1 else fnp.multiply(r, _cast(scale, comp)), ctx.dtype)


@_op("aten.softplus")
def _softplus(ctx, x, beta=1, threshold=20):
    comp = _opmath(ctx.dtype)
    y = _cast(x, comp)
    bx = y if beta == 1 else fnp.multiply(y, _cast(beta, comp))
    sp = fnp.log1p(fnp.exp(bx))
    if beta != 1:
        sp = fnp.divide(sp, _cast(beta, comp))
    return _cast(fnp.where(fnp.greater(bx, _cast(threshold, comp)), y, sp), ctx.dtype)


@_op("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(ctx, c, a, b):
    return fnp.where(_cast(c, np.bool_), _cast(a, ctx.dtype), _cast(b, ctx.dtype))


@_op("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(ctx, x, mask, value):
    return fnp.where(_cast(mask, np.bool_), _cast(value, ctx.dtype), _cast(x, ctx.dtype))


for _n, _f in {"eq": fnp.equal, "ne": fnp.not_equal, "lt": fnp.less, "le": fnp.less_equal,
               "gt": fnp.greater, "ge": fnp.greater_equal}.items():
    _op(f"aten.{_n}.Tensor", f"aten.{_n}.Scalar")(_compare(_f))
for _n, _f in {"logical_and": fnp.logical_and, "logical_or": fnp.logical_or,
               "logical_xor": fnp.logical_xor}.items():
    _op(f"aten.{_n}")(lambda ctx, a, b, _f=_f: _f(_cast(a, np.bool_), _cast(b, np.bool_)))
_op("aten.logical_not")(lambda ctx, a: fnp.logical_not(_cast(a, np.bool_)))


@_op("aten.bitwise_not")
def _bitwise_not(ctx, a):
    if _dt(a) != np.bool_:
        raise UnmappedOpError("aten.bitwise_not", " for integer tensors (only bool masks)")
    return fnp.logical_not(a)


@_op("aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor")
def _bitwise2(ctx, a, b):
    name = ctx.op.split(".")[1]
    if not (_is_arr(a) and _dt(a) == np.bool_ and (not _is_arr(b) or _dt(b) == np.bool_)):
        raise UnmappedOpError(ctx.op, " for integer tensors (only bool masks)")
    return {"bitwise_and": fnp.logical_and, "bitwise_or": fnp.logical_or,
            "bitwise_xor": fnp.logical_xor}[name](a, _cast(b, np.bool_))


_op("aten.isnan")(lambda ctx, x: fnp.isnan(x))
_op("aten.isinf")(lambda ctx, x: fnp.isinf(x))
_op("aten.isfinite")(lambda ctx, x: fnp.isfinite(x))


# -- reductions -------------------------------------------------------------------------------
def _acc(ctx, x, dtype=None):
    """The dtype torch reduces in: float32 for float16/bfloat16 (then rounded once)."""
    out = np_dtype(dtype) if isinstance(dtype, torch.dtype) else ctx.dtype
    comp = _opmath(out)
    return _cast(x, comp), out


@_op("aten.sum.dim_IntList", "aten.sum.default")
def _sum(ctx, x, dim=None, keepdim=False, *, dtype=None):
    y, out = _acc(ctx, x, dtype)
    return _cast(fnp.sum(y, _dims(dim, len(_shape(x))), keepdims=keepdim), out)


@_op("aten.mean.dim", "aten.mean.default")
def _mean(ctx, x, dim=None, keepdim=False, *, dtype=None):
    y, out = _acc(ctx, x, dtype)
    axes = _dims(dim, len(_shape(x)))
    n = int(np.prod([_shape(x)[a] for a in axes], dtype=np.int64))
    s = fnp.sum(y, axes, keepdims=keepdim)
    return _cast(fnp.divide(s, _cast(n, _dt(y))), out)


@_op("aten.prod.dim_int", "aten.prod.default")
def _prod(ctx, x, dim=None, keepdim=False, *, dtype=None):
    y, out = _acc(ctx, x, dtype)
    return _cast(fnp.prod(y, _dims(dim, len(_shape(x))), keepdims=keepdim), out)


@_op("aten.amax", "aten.amin")
def _amaxmin(ctx, x, dim=(), keepdim=False):
    f = fnp.max if ctx.op.startswith("aten.amax") else fnp.min
    return f(x, _dims(dim, len(_shape(x))), keepdims=keepdim)


@_op("aten.max.default", "aten.min.default")
def _maxmin_all(ctx, x):
    return (fnp.max if ctx.op.startswith("aten.max") else fnp.min)(x)


@_op("aten.max.dim", "aten.min.dim")
def _maxmin_dim(ctx, x, dim, keepdim=False):
    ismax = ctx.op.startswith("aten.max")
    d = _dim(dim, len(_shape(x)))
    vals = (fnp.max if ismax else fnp.min)(x, d, keepdims=keepdim)
    return (vals, _Lazy(lambda: (fnp.argmax if ismax else fnp.argmin)(x, d, keepdims=keepdim)))


def _sorted_along(x, d, descending):
    """(values, indices) of torch's sort along ``d``: ascending as NumPy's stable sort (NaN
    last); descending as its reverse (NaN first, as torch; ties in reverse order -- the
    interval rule counts ties as undecided, so any tie order is inside its bound)."""
    vals, idx = fnp.sort(x, axis=d), fnp.argsort(x, axis=d)
    if descending:
        vals, idx = fnp.flip(vals, d), fnp.flip(idx, d)
    return vals, _cast(idx, np.int64)


@_op("aten.sort.default", "aten.sort.stable")
def _sort(ctx, x, dim=-1, descending=False, *, stable=None):
    """``torch.sort`` (``sort.stable`` passes dim and descending by keyword): exact values
    (the interval rule's order statistics), indices certain only where the order is decided
    for every point of the box."""
    d = _dim(dim, len(_shape(x)))
    return _sorted_along(x, d, bool(descending))


@_op("aten.topk")
def _topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    """``torch.topk`` with ``sorted=True``: the first k of the sort (descending for the
    largest). ``sorted=False`` returns them in an order torch leaves unspecified, which no
    position-wise bound can follow: it raises."""
    if not sorted:
        raise UnmappedOpError(ctx.op, " with sorted=False (an unspecified order of the k "
                                      "values); use sorted=True")
    d = _dim(dim, len(_shape(x)))
    vals, idx = _sorted_along(x, d, bool(largest))
    first = (slice(None),) * d + (slice(0, int(k)),)
    return vals[first], idx[first]


@_op("aten.argmax", "aten.argmin")
def _argmaxmin(ctx, x, dim=None, keepdim=False):
    f = fnp.argmax if ctx.op.startswith("aten.argmax") else fnp.argmin
    if dim is None:
        r = f(fnp.reshape(x, (-1,)))
        return fnp.reshape(r, (1,) * len(_shape(x))) if keepdim else r
    return f(x, _dim(dim, len(_shape(x))), keepdims=keepdim)


@_op("aten.any.dim", "aten.any.dims", "aten.any.default", "aten.all.dim", "aten.all.dims",
     "aten.all.default")
def _anyall(ctx, x, dim=None, keepdim=False):
    f = fnp.any if ctx.op.startswith("aten.any") else fnp.all
    return f(_cast(x, np.bool_), _dims(dim, len(_shape(x))), keepdims=keepdim)


@_op("aten.cumsum")
def _cumsum(ctx, x, dim, *, dtype=None):
    y, out = _acc(ctx, x, dtype)
    return _cast(fnp.cumsum(y, _dim(dim, len(_shape(x)))), out)


@_op("aten.var.correction", "aten.var.dim")
def _var(ctx, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if ctx.op.endswith("var.dim"):
        corr = 1 if (unbiased is None or unbiased) else 0
    else:
        corr, keepdim = (1 if correction is None else correction), keepdim
    y, out = _acc(ctx, x)
    axes = _dims(dim, len(_shape(x)))
    n = int(np.prod([_shape(x)[a] for a in axes], dtype=np.int64))
    mu = fnp.divide(fnp.sum(y, axes, keepdims=True), _cast(n, _dt(y)))
    d = fnp.subtract(y, mu)
    v = fnp.divide(fnp.sum(fnp.multiply(d, d), axes, keepdims=keepdim),
                   _cast(max(n - corr, 0), _dt(y)))
    return _cast(v, out)


# -- matmul and nn composites -------------------------------------------------------------------
def _mm_dtype(ctx, *xs):
    return [_cast(x, ctx.dtype) for x in xs]


@_op("aten.mm", "aten.bmm", "aten.matmul")
def _mm(ctx, a, b):
    a, b = _mm_dtype(ctx, a, b)
    return _cast(fnp.matmul(a, b), ctx.dtype)


@_op("aten.dot", "aten.vdot")
def _dot(ctx, a, b):
    a, b = _mm_dtype(ctx, a, b)
    return _cast(fnp.matmul(a, b), ctx.dtype)


@_op("aten.linear")
def _linear(ctx, x, w, b=None):
    x, w = _mm_dtype(ctx, x, w)
    if b is not None:
        b = _cast(b, ctx.dtype)
    return _cast(fnn.linear(x, w, b, bias_in_sum=True), ctx.dtype)


@_op("aten.addmm", "aten.baddbmm")
def _addmm(ctx, c, a, b, *, beta=1, alpha=1):
    """beta*c + alpha*(a @ b). A bias that is the same for every row (shape (N,) or (1, N)) is
    one more term of the matmul's sum (BLAS gemm with beta=1): fpx.nn.linear with
    bias_in_sum."""
    a, b = _mm_dtype(ctx, a, b)
    c = _cast(c, ctx.dtype)
    cs = _shape(c)
    row_bias = len(cs) == 1 or (len(cs) >= 2 and all(s == 1 for s in cs[:-1]))
    if beta == 1 and alpha == 1 and row_bias and ctx.op.startswith("aten.addmm"):
        return _cast(fnn.linear(a, fnp.transpose(b), fnp.reshape(c, (cs[-1],)) if cs[-1] ==
                                _shape(b)[-1] else fnp.broadcast_to(fnp.reshape(c, (-1,)),
                                                                    (_shape(b)[-1],)),
                                bias_in_sum=True), ctx.dtype)
    p = fnp.matmul(a, b)
    p = _cast(p, ctx.dtype)
    if alpha != 1:
        p = fnp.multiply(p, _cast(alpha, ctx.dtype))
    if beta == 0:
        return p
    return fnp.add(p, c if beta == 1 else fnp.multiply(c, _cast(beta, ctx.dtype)))


@_op("aten.convolution")
def _convolution(ctx, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    x, w = _mm_dtype(ctx, x, w)
    if b is not None:
        b = _cast(b, ctx.dtype)
    nd = len(_shape(w)) - 2

    def per_dim(v):
        return tuple(_ints(v)) * (1 if len(_ints(v)) == nd else nd)
    stride, padding, dilation = per_dim(stride), per_dim(padding), per_dim(dilation)
    if transposed:
        return _conv_transpose(x, w, b, stride, padding, dilation, per_dim(output_padding),
                               int(groups))
    return fnn.conv(x, w, b, stride=stride, padding=padding, dilation=dilation,
                    groups=int(groups), bias_in_sum=True)


def _insert_zeros(x, axis, s):
    """``s - 1`` zeros between neighbours along ``axis`` (length n -> (n - 1)·s + 1): a new
    axis of length 1 padded to s, merged into ``axis``, the trailing zeros cut."""
    shape = _shape(x)
    n = shape[axis]
    y = fnp.reshape(x, shape[:axis + 1] + (1,) + shape[axis + 1:])
    widths = [(0, 0)] * (len(shape) + 1)
    widths[axis + 1] = (0, s - 1)
    y = fnp.reshape(fnp.pad(y, widths), shape[:axis] + (n * s,) + shape[axis + 1:])
    return y[(slice(None),) * axis + (slice(0, (n - 1) * s + 1),)]


def _conv_transpose(x, w, b, stride, padding, dilation, output_padding, groups):
    """A transposed convolution (ConvTranspose) as the convolution it is the adjoint of: the
    input with ``stride - 1`` zeros between neighbours, padded by ``dilation·(k - 1) -
    padding`` on each side (cropped where negative) and ``output_padding`` more at the end,
    convolved at stride 1 with the kernel flipped in space and its in/out channels swapped
    per group (w: (C_in, C_out/groups, *k) -> (C_out, C_in/groups, *k)). The same real sums
    as torch's kernel, plus terms that are products with exact zeros: the bound's
    accumulation term counts K = C_in/groups·Πk terms per output, more than the nonzero ones
    (sound, slightly wide); the extra work is stride^nd times the direct kernel's."""
    nd = len(stride)
    for i, s in enumerate(stride):
        if s > 1:
            x = _insert_zeros(x, 2 + i, s)
    k = _shape(w)[2:]
    widths, crop = [(0, 0), (0, 0)], [slice(None), slice(None)]
    for i in range(nd):
        lo = dilation[i] * (k[i] - 1) - padding[i]
        hi = lo + output_padding[i]
        widths.append((max(lo, 0), max(hi, 0)))
        n = _shape(x)[2 + i] + max(lo, 0) + max(hi, 0)
        crop.append(slice(max(-lo, 0), n - max(-hi, 0)))
    if any(a or c for a, c in widths[2:]):
        x = fnp.pad(x, widths)
    if any(c.start or c.stop != _shape(x)[2 + i] for i, c in enumerate(crop[2:])):
        x = x[tuple(crop)]
    cin, cog = _shape(w)[:2]
    wt = fnp.reshape(w, (groups, cin // groups, cog) + tuple(k))
    wt = fnp.transpose(wt, (0, 2, 1) + tuple(range(3, 3 + nd)))
    wt = fnp.reshape(wt, (groups * cog, cin // groups) + tuple(k))
    wt = fnp.flip(wt, tuple(range(2, 2 + nd)))
    return fnn.conv(x, wt, b, stride=(1,) * nd, padding=(0,) * nd, dilation=dilation,
                    groups=groups, bias_in_sum=True)


def _bn_eval(ctx, x, w, b, mean, var, eps):
    """torch's CPU inference kernel: alpha = w / sqrt(var + eps) (as 1/sqrt * w), beta =
    b - mean * alpha, y = x * alpha + beta (per channel, dim 1), in opmath."""
    comp = _opmath(ctx.dtype)
    pdt = _opmath(_dt(mean))
    p = [None if t is None else _cast(t, pdt) for t in (mean, var, w, b)]
    return _cast(fnn.batch_norm(_cast(x, comp), *p, eps, axis=1), ctx.dtype)


@_op("aten._native_batch_norm_legit_no_training")
def _bn_legit(ctx, x, w, b, running_mean, running_var, momentum, eps):
    y = _bn_eval(ctx, x, w, b, running_mean, running_var, eps)
    return (y, _Lazy(None, "batch-norm saved mean"), _Lazy(None, "batch-norm saved rstd"))


def _normalize_rows(ctx, x, rows, back, w, b, eps, what):
    """``rows`` (x in opmath, as 2-D rows) normalized by each row's own mean and biased
    variance through the layer-norm composite, ``back`` to x's shape, then ``·w + b`` per
    channel (dim 1) -- the batch statistics of ``InstanceNorm`` and friends, and group norm.
    float32/float64 only: on float16/bfloat16 torch's CPU kernels do arithmetic this does
    not model (their results differ from one opmath evaluation by more than an ulp)."""
    if np.dtype(ctx.dtype) in _HALF:
        raise UnmappedOpError(ctx.op, f" for {np.dtype(ctx.dtype)} inputs (torch's CPU kernel "
                                      f"arithmetic of {what} for half types is not modelled)")
    comp = _opmath(ctx.dtype)
    r = rows(_cast(x, comp))
    y = back(fnn.layer_norm(r, (_shape(r)[-1],), None, None, eps))
    nd, c = len(_shape(x)), _shape(x)[1]
    bcast = (1, c) + (1,) * (nd - 2)
    if w is not None:
        y = fnp.multiply(y, fnp.reshape(_cast(w, comp), bcast))
    if b is not None:
        y = fnp.add(y, fnp.reshape(_cast(b, comp), bcast))
    return _cast(y, ctx.dtype), r


@_op("aten._native_batch_norm_legit.no_stats")
def _bn_batch_stats(ctx, x, w, b, training, momentum, eps):
    """Normalization by the batch's own per-channel statistics, with no running stats to
    update (``InstanceNorm``, ``BatchNorm(track_running_stats=False)``; a pure op): each
    channel's (N, *spatial) values a row (``_normalize_rows``; biased variance,
    ``1/sqrt(var + eps)`` as torch's CPU kernel)."""
    shape = _shape(x)
    nd, c = len(shape), shape[1]
    perm = (1, 0) + tuple(range(2, nd))
    y, _ = _normalize_rows(
        ctx, x, lambda z: fnp.reshape(fnp.transpose(z, perm), (c, -1)),
        lambda z: fnp.transpose(fnp.reshape(z, tuple(shape[i] for i in perm)), perm),
        w, b, eps, "batch norm")
    return (y, _Lazy(None, "batch-norm saved mean"), _Lazy(None, "batch-norm saved rstd"))


@_op("aten.native_group_norm")
def _group_norm(ctx, x, w, b, n, c, hxw, group, eps):
    """Group norm: each sample's group of C/G channels (with their spatial values) a row
    (``_normalize_rows``), then the per-channel affine; torch's CPU kernel computes
    ``x·(rstd·w) + (b - mean·rstd·w)``, which the layer-norm rule's evaluation error covers
    with w = 1, b = 0 and the two roundings after it. Also returns the (N, G) mean and rstd
    (computed only if the graph uses them)."""
    shape, g = _shape(x), int(group)
    y, r = _normalize_rows(ctx, x, lambda z: fnp.reshape(z, (shape[0] * g, -1)),
                           lambda z: fnp.reshape(z, shape), w, b, eps, "group norm")
    mean, rstd = _row_stats(r, (1,), eps, _opmath(ctx.dtype))
    return (y, _Lazy(lambda: _cast(fnp.reshape(mean(), (shape[0], g)), ctx.dtype)),
            _Lazy(lambda: _cast(fnp.reshape(rstd(), (shape[0], g)), ctx.dtype)))


@_op("aten.native_batch_norm", "aten._native_batch_norm_legit")
def _bn(ctx, x, w, b, running_mean, running_var, training, momentum, eps):
    if training:
        raise UnmappedOpError(ctx.op, " in training mode (batch statistics and running-stat "
                                      "updates); call module.eval()")
    y = _bn_eval(ctx, x, w, b, running_mean, running_var, eps)
    return (y, _Lazy(None, "batch-norm saved mean"), _Lazy(None, "batch-norm saved rstd"))


@_op("aten.upsample_nearest1d", "aten.upsample_nearest2d", "aten.upsample_nearest3d",
     "aten._upsample_nearest_exact1d", "aten._upsample_nearest_exact2d",
     "aten._upsample_nearest_exact3d")
def _upsample_nearest(ctx, x, output_size=None, *scales):
    """Nearest-neighbour upsampling (``F.interpolate(mode="nearest")``): a gather, exact.
    The source index of output i is torch's ``nearest_idx``: i where the size is unchanged,
    i >> 1 where it doubles, else ``min(floor(i·scale), n - 1)`` in float32 (``nearest-exact``:
    ``floor((i + 0.5)·scale)``), scale = 1/scale_factor where one is given, else n_in/n_out.
    ``.vec`` overloads pass (output_size, scale_factors); the others (output_size, scales...)."""
    shape = _shape(x)
    nd = len(shape) - 2
    if ".vec" in ctx.op:
        factors = list(scales[0]) if scales and scales[0] is not None else [None] * nd
    else:
        factors = list(scales) + [None] * (nd - len(scales))
    if output_size is None or len(_ints(output_size)) == 0:
        output_size = [int(math.floor(shape[2 + i] * factors[i])) for i in range(nd)]
    exact = "exact" in ctx.op
    for i, (n_in, n_out) in enumerate(zip(shape[2:], _ints(output_size))):
        f = factors[i]
        dst = np.arange(n_out)
        if n_out == n_in and not exact:
            continue
        if n_out == 2 * n_in and not exact:
            src = dst >> 1
        else:
            scale = (np.float32(1.0 / f) if f is not None and f > 0
                     else np.float32(n_in) / np.float32(n_out))
            if exact:      # floorf((dst + 0.5) * scale): the product in double, then float
                pos = ((dst + 0.5) * np.float64(scale)).astype(np.float32)
            else:          # floorf(dst * scale): in float
                pos = dst.astype(np.float32) * scale
            src = np.minimum(np.floor(pos).astype(np.int64), n_in - 1)
        x = fnp.take(x, src, axis=2 + i)
    return x


@_op("aten.native_layer_norm")
def _layer_norm(ctx, x, normalized_shape, w, b, eps):
    comp = _opmath(ctx.dtype)
    y = fnn.layer_norm(_cast(x, comp), tuple(_ints(normalized_shape)),
                       None if w is None else _cast(w, comp),
                       None if b is None else _cast(b, comp), eps)
    nd, k = len(_shape(x)), len(_ints(normalized_shape))
    mean, rstd = _row_stats(_cast(x, comp), tuple(range(nd - k, nd)), eps, comp)
    return (_cast(y, ctx.dtype), _Lazy(mean), _Lazy(rstd))


def _row_stats(xx, axes, eps, comp):
    """(mean, rstd) over ``axes`` of ``xx`` (opmath) as functions, kept dims: the saved
    statistics of the normalization ops, built only if the graph reads them."""
    def mean():
        return fnp.mean(xx, axes, keepdims=True)

    def rstd():
        d = fnp.subtract(xx, mean())
        v = fnp.mean(fnp.multiply(d, d), axes, keepdims=True)
        return fnp.divide(_cast(1, comp), fnp.sqrt(fnp.add(v, _cast(eps, comp))))
    return mean, rstd


@_op("aten._softmax", "aten._log_softmax", "aten._safe_softmax", "aten.softmax.int",
     "aten.log_softmax.int")
def _softmax(ctx, x, dim, half_to_float=False, **kw):
    """softmax/log_softmax along ``dim``; float16/bfloat16 computed in float32, rounded once
    (torch's CPU kernels). ``_safe_softmax``: rows that are entirely -inf give 0."""
    comp = _opmath(_dt(x))
    y = _cast(x, comp)
    d = _dim(dim, len(_shape(x)))
    if "log_softmax" in ctx.op:
        return _cast(fnn.log_softmax(y, d), ctx.dtype)
    if "_safe_softmax" in ctx.op:
        ninf = _cast(-np.inf, comp)
        dead = fnp.all(fnp.equal(y, ninf), d, keepdims=True)
        s = fnn.softmax(fnp.where(dead, _cast(0, comp), y), d)
        return _cast(fnp.where(dead, _cast(0, comp), s), ctx.dtype)
    return _cast(fnn.softmax(y, d), ctx.dtype)


@_op("aten.scaled_dot_product_attention")
def _sdpa(ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
          enable_gqa=False):
    if dropout_p:
        raise UnmappedOpError(ctx.op, " with dropout_p > 0 (random); use the module in eval "
                                      "mode or dropout_p=0")
    q, k, v = _mm_dtype(ctx, q, k, v)
    if enable_gqa and _shape(k)[-3] != _shape(q)[-3]:
        rep = _shape(q)[-3] // _shape(k)[-3]
        k = fnp.repeat(k, rep, axis=-3)
        v = fnp.repeat(v, rep, axis=-3)
    return _cast(fnn.scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale),
                 ctx.dtype)


@_op("aten.embedding")
def _embedding(ctx, weight, ids, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return fnn.embedding(ids, weight)


@_op("aten.gather")
def _gather(ctx, x, dim, index, *, sparse_grad=False):
    return fnp.take_along_axis(x, index, _dim(dim, len(_shape(x))))


@_op("aten.index_select")
def _index_select(ctx, x, dim, index):
    return fnp.take(x, index, axis=_dim(dim, len(_shape(x))))


@_op("aten.nll_loss_forward")
def _nll_loss(ctx, x, target, weight, reduction, ignore_index):
    """-x[i, target[i]] (times the class weight), ignoring ``ignore_index``; reduction 0 none,
    1 mean (over the weights of the kept targets), 2 sum. Returns (loss, total_weight)."""
    comp = _opmath(ctx.dtype)
    x = _cast(x, comp)
    tgt = np.asarray(fnp._concrete_index(target, "nll_loss targets"))
    nd = len(_shape(x))
    cdim = 1 if nd >= 2 else 0
    keep = tgt != ignore_index
    safe = np.where(keep, tgt, 0)
    picked = fnp.take_along_axis(x, np.expand_dims(safe, cdim), cdim)
    picked = fnp.reshape(picked, tgt.shape)
    if weight is not None:
        wsel = fnp.take(_cast(weight, comp), safe)
        wsel = fnp.where(keep, wsel, _cast(0, comp))
    else:
        wsel = keep.astype(_dt(picked))
    loss = fnp.negative(fnp.multiply(picked, wsel))
    total = fnp.sum(wsel)
    if reduction == 0:
        return (_cast(loss, ctx.dtype), _cast(total, ctx.dtype))
    s = fnp.sum(loss)
    if reduction == 2:
        return (_cast(s, ctx.dtype), _cast(total, ctx.dtype))
    return (_cast(fnp.divide(s, total), ctx.dtype), _cast(total, ctx.dtype))


def _pool_args(ctx, x, kernel_size, stride, padding, dilation=1):
    nd = len(_ints(kernel_size)) if len(_ints(kernel_size)) > 1 else len(_shape(x)) - 2
    def t(v, default):
        v = _ints(v) if v is not None and not (isinstance(v, (list, tuple)) and len(v) == 0) \
            else _ints(default)
        return tuple(v) * (nd if len(v) == 1 else 1)
    k = t(kernel_size, kernel_size)
    return k, t(stride, k), t(padding, 0), t(dilation, 1)


@_op("aten.max_pool2d_with_indices", "aten.max_pool2d", "aten.max_pool1d",
     "aten.max_pool1d_with_indices", "aten.max_pool3d_with_indices")
def _max_pool(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    if ceil_mode:
        raise UnmappedOpError(ctx.op, " with ceil_mode=True")
    k, s, p, d = _pool_args(ctx, x, kernel_size, stride, padding, dilation)
    y = fnn.max_pool(x, k, s, p, d)
    if "indices" in ctx.op:
        return (y, _Lazy(None, "max-pool indices"))
    return y


@_op("aten.avg_pool2d", "aten.avg_pool1d", "aten.avg_pool3d")
def _avg_pool(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False,
              count_include_pad=True, divisor_override=None):
    if ceil_mode or divisor_override is not None:
        raise UnmappedOpError(ctx.op, " with ceil_mode or divisor_override")
    k, s, p, _ = _pool_args(ctx, x, kernel_size, stride, padding)
    comp = _opmath(ctx.dtype)
    return _cast(fnn.avg_pool(_cast(x, comp), k, s, p, count_include_pad), ctx.dtype)


@_op("aten._adaptive_avg_pool2d", "aten.adaptive_avg_pool2d", "aten._adaptive_avg_pool1d",
     "aten.adaptive_avg_pool1d", "aten._adaptive_avg_pool3d")
def _adaptive_avg_pool(ctx, x, output_size):
    """Window i of n inputs -> m outputs: [floor(i n / m), ceil((i+1) n / m)), averaged."""
    out = _ints(output_size)
    nd = len(out)
    comp = _opmath(ctx.dtype)
    y = _cast(x, comp)
    lead = len(_shape(x)) - nd
    for j, m in enumerate(out):
        ax = lead + j
        n = _shape(y)[ax]
        if m == n:
            continue
        if n % m == 0:          # equal windows: reshape and average
            shp = _shape(y)[:ax] + (m, n // m) + _shape(y)[ax + 1:]
            y = fnp.divide(fnp.sum(fnp.reshape(y, shp), ax + 1), _cast(n // m, comp))
            continue
        parts = []
        for i in range(m):
            lo, hi = (i * n) // m, -((-(i + 1) * n) // m)
            idx = (slice(None),) * ax + (slice(lo, hi),)
            parts.append(fnp.divide(fnp.sum(y[idx], ax, keepdims=True), _cast(hi - lo, comp)))
        y = fnp.concatenate(parts, ax)
    return _cast(y, ctx.dtype)


# -- movement ------------------------------------------------------------------------------------
@_op("aten.view", "aten._unsafe_view", "aten.reshape", "aten.view_copy")
def _view(ctx, x, size):
    return fnp.reshape(x, tuple(ctx.shape))


@_op("aten.permute", "aten.permute_copy")
def _permute(ctx, x, dims):
    return fnp.transpose(x, tuple(_dim(d, len(_shape(x))) for d in dims))


@_op("aten.t")
def _t(ctx, x):
    return fnp.transpose(x) if len(_shape(x)) == 2 else x


@_op("aten.transpose.int")
def _transpose(ctx, x, d0, d1):
    return fnp.swapaxes(x, d0, d1)


@_op("aten.expand", "aten.expand_copy")
def _expand(ctx, x, size, *, implicit=False):
    return fnp.broadcast_to(x, tuple(ctx.shape))


@_op("aten.unsqueeze", "aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default",
     "aten.flatten.using_ints", "aten.unflatten.int")
def _reshape_like(ctx, x, *args, **kw):
    return fnp.reshape(x, tuple(ctx.shape))


@_op("aten.clone", "aten.contiguous", "aten.alias", "aten.detach", "aten.lift_fresh_copy",
     "aten.lift_fresh", "aten.alias_copy", "aten.dropout", "aten.feature_dropout",
     "aten.positive")
def _identity(ctx, x, *args, **kw):
    if ctx.op in ("aten.dropout.default", "aten.feature_dropout.default") and len(args) >= 2 \
            and args[1] and args[0]:
        raise UnmappedOpError(ctx.op, " in training mode (random); call module.eval()")
    return x


@_op("aten.native_dropout")
def _native_dropout(ctx, x, p, train):
    if train and p:
        raise UnmappedOpError(ctx.op, " in training mode (random masks): call module.eval()")
    return (x, _Lazy(None, "dropout mask"))


@_op("aten._to_copy", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
     "aten._assert_tensor_metadata", "aten.type_as")
def _to_copy(ctx, x, *args, **kw):
    if ctx.op.startswith("aten._assert_tensor_metadata"):
        return None
    return _cast(x, ctx.dtype)


@_op("aten.select.int")
def _select(ctx, x, dim, index):
    d = _dim(dim, len(_shape(x)))
    return x[(slice(None),) * d + (int(index),)]


@_op("aten.slice.Tensor", "aten.slice_copy.Tensor", "aten.narrow")
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    d = _dim(dim, len(_shape(x)))
    if ctx.op.startswith("aten.narrow"):
        start, end, step = start, start + end, 1   # narrow(x, dim, start, length)
    return x[(slice(None),) * d + (slice(start, end, step),)]


@_op("aten.split_with_sizes", "aten.split.Tensor", "aten.split_with_sizes_copy",
     "aten.unbind.int", "aten.chunk")
def _split(ctx, x, sizes=None, dim=0):
    d = _dim(dim, len(_shape(x)))
    if ctx.op.startswith("aten.unbind"):
        d = _dim(sizes if sizes is not None else 0, len(_shape(x)))
        return tuple(x[(slice(None),) * d + (i,)] for i in range(_shape(x)[d]))
    n = _shape(x)[d]
    if ctx.op.startswith("aten.chunk"):
        step = -(-n // int(sizes))
        sizes = [min(step, n - i) for i in range(0, n, step)]
    elif isinstance(sizes, (int, np.integer)):
        sizes = [min(int(sizes), n - i) for i in range(0, n, int(sizes))]
    out, lo = [], 0
    for s in sizes:
        out.append(x[(slice(None),) * d + (slice(lo, lo + int(s)),)])
        lo += int(s)
    return tuple(out)


@_op("aten.cat", "aten.concat")
def _cat(ctx, xs, dim=0):
    xs = [_cast(x, ctx.dtype) for x in xs if not (_is_arr(x) and _shape(x) == (0,))]
    return fnp.concatenate(xs, _dim(dim, len(ctx.shape)))


@_op("aten.stack")
def _stack(ctx, xs, dim=0):
    return fnp.stack([_cast(x, ctx.dtype) for x in xs], _dim(dim, len(ctx.shape)))


@_op("aten.flip")
def _flip(ctx, x, dims):
    return fnp.flip(x, _dims(dims, len(_shape(x))))


@_op("aten.roll")
def _roll(ctx, x, shifts, dims=()):
    shifts, dims = _ints(shifts), _ints(dims) if dims else []
    if not dims:
        flat = fnp.reshape(x, (-1,))
        n = _shape(flat)[0]
        return fnp.reshape(fnp.take(flat, (np.arange(n) - shifts[0]) % n), _shape(x))
    for s, d in zip(shifts, dims):
        d = _dim(d, len(_shape(x)))
        n = _shape(x)[d]
        x = fnp.take(x, (np.arange(n) - s) % n, axis=d)
    return x


@_op("aten.index.Tensor")
def _index(ctx, x, indices):
    idx = tuple(slice(None) if i is None else np.asarray(fnp._concrete_index(i, "index"))
                for i in indices)
    return x[idx]


@_op("aten.constant_pad_nd")
def _pad(ctx, x, pad, value=0):
    pad = _ints(pad)
    nd = len(_shape(x))
    widths = [(0, 0)] * nd
    for i in range(len(pad) // 2):
        widths[nd - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        raise UnmappedOpError(ctx.op, " with negative padding (cropping)")
    return fnp.pad(x, widths, constant_values=value)


@_op("aten.repeat")
def _repeat(ctx, x, repeats):
    return fnp.tile(x, tuple(_ints(repeats)))


@_op("aten.tril", "aten.triu")
def _tri(ctx, x, diagonal=0):
    r, c = _shape(x)[-2:]
    m = np.tri(r, c, diagonal, dtype=bool) if "tril" in ctx.op else \
        ~np.tri(r, c, diagonal - 1, dtype=bool)
    return fnp.where(m, x, _cast(0, _dt(x)))


# -- creation (constants) ---------------------------------------------------------------------
@_op("aten.full", "aten.new_full")
def _full(ctx, *args, **kw):
    fill = args[-1] if not ctx.op.startswith("aten.new_full") else args[2]
    return _const(ctx, fill)


@_op("aten.full_like", "aten.fill.Scalar", "aten.new_ones", "aten.ones_like", "aten.zeros_like",
     "aten.new_zeros", "aten.zeros", "aten.ones", "aten.empty.memory_format", "aten.empty_like",
     "aten.new_empty", "aten.empty_strided", "aten.new_empty_strided")
def _fill(ctx, *args, **kw):
    op = ctx.op
    if op.startswith(("aten.full_like", "aten.fill")):
        return _const(ctx, args[1])
    value = 1 if "ones" in op else 0           # empty: torch leaves it undefined; fpx zeros
    return _const(ctx, value)


@_op("aten.scalar_tensor")
def _scalar_tensor(ctx, s, **kw):
    return _const(ctx, s)


@_op("aten.arange.start_step", "aten.arange.default", "aten.arange.start")
def _arange(ctx, *args, **kw):
    nums = [a for a in args if isinstance(a, (int, float, np.number))]
    return ctx.xp.arange(*nums, dtype=ctx.dtype)


@_op("aten._local_scalar_dense", "aten.item")
def _item(ctx, x):
    return x.item()


@_op("aten.sym_size.int", "aten.sym_numel", "aten.sym_stride.int", "aten.sym_storage_offset")
def _sym(ctx, x, *args):
    raise UnmappedOpError(ctx.op, " (dynamic shapes: export with static shapes)")


class _Lazy:
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


# =============================================================================================
# Running a node
# =============================================================================================
def _lookup(func):
    name = str(func)
    h = ATEN_OPS.get(name)
    if h is None:
        h = ATEN_OPS.get(str(func.overloadpacket))
    return name, h


def _conform(r, ctx):
    """Cast a handler's result(s) to torch's output dtype(s); check shapes."""
    if isinstance(r, tuple):
        return tuple(_conform1(x, ctx.op, m) for x, m in zip(r, ctx.metas + [(None, None)] *
                                                                 (len(r) - len(ctx.metas))))
    return _conform1(r, ctx.op, ctx.metas[0] if ctx.metas else (None, None))


def _conform1(x, op, meta):
    dt, shp = meta
    if not _is_arr(x) or dt is None:
        return x
    if _dt(x) != dt:
        x = fnp.astype(x, dt)
    if shp is not None and tuple(_shape(x)) != tuple(shp):
        raise FpxError(f"fpx.interop.torch: internal error: the mapping of '{op}' gave shape "
                       f"{tuple(_shape(x))}, torch {tuple(shp)}")
    return x


def _meta_of(val):
    """[(np dtype, shape)] of a node's example value (FakeTensor or a tuple of them)."""
    if isinstance(val, torch.Tensor):
        return [(np_dtype(val.dtype), tuple(int(s) for s in val.shape))]
    if isinstance(val, (list, tuple)):
        out = []
        for v in val:
            out.extend(_meta_of(v) if isinstance(v, torch.Tensor) else [(None, None)])
        return out
    return []


@register_aten("<built-in function getitem>")
def _getitem(ctx, xs, i):
    v = xs[i]
    return v.get() if isinstance(v, _Lazy) else v


# =============================================================================================
# Export path
# =============================================================================================
_KEEP = ("aten.linear.default", "aten.scaled_dot_product_attention.default")


# torch.export is not thread-safe (its fake mode, and a non-strict export swaps the module's
# parameters for fake tensors while it runs), and _quiet changes process-wide state (logger
# levels, warning filters, sys.stdout/stderr): every export, and every read of the program cache
# and of a module's parameters, holds this lock, so no thread sees another's fakes and each
# _quiet restores exactly what it replaced.
_LOCK = threading.RLock()


@contextlib.contextmanager
def _quiet():
    """Silence torch.export's logs (its failed-meta tracebacks are logged at ERROR level,
    through handlers that hold the original stderr), warnings and prints, under ``_LOCK``."""
    names = ["torch._export", "torch.export", "torch.fx.experimental.symbolic_shapes",
             "torch._dynamo", "torch._subclasses.fake_tensor"]
    with _LOCK:
        loggers = [logging.getLogger(n) for n in names]
        levels = [lg.level for lg in loggers]
        for lg in loggers:
            lg.setLevel(logging.CRITICAL + 1)
        sink = io.StringIO()
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(sink), \
                    contextlib.redirect_stderr(sink):
                warnings.simplefilter("ignore")
                yield
        finally:
            for lg, lv in zip(loggers, levels):
                lg.setLevel(lv)


def _export(module, args, kwargs):
    with _quiet():
        ep = torch.export.export(module, tuple(args), kwargs=dict(kwargs or {}), strict=False)
        table = torch.export.default_decompositions()
        for op in list(table.keys()):
            if str(op) in _KEEP:
                del table[op]
        table.update(_EXTRA_DECOMPOSITIONS())
        return ep.run_decompositions(table)


def _EXTRA_DECOMPOSITIONS():
    """Ops that core ATen keeps but fpx runs as torch's own decomposition into core ops:
    bilinear upsampling (``F.interpolate(mode="bilinear")``) -- the source indices and weights
    computed by interval ops, the gathers and the weighted sums as the kernel does them (its
    linear and trilinear siblings are decomposed by default)."""
    from torch._decomp import decomposition_table
    ops = (torch.ops.aten.upsample_bilinear2d.vec, torch.ops.aten.upsample_bilinear2d.default)
    return {op: decomposition_table[op] for op in ops if op in decomposition_table}


class _FnModule(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, *args, **kwargs):
        return self.f(*args, **kwargs)


def _graph_fn(ep, xp=np):
    """The fpx function ``fn(params, *args, **kwargs)`` of an exported program."""
    from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind
    sig = ep.graph_signature
    graph = ep.graph
    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    inputs = []          # (node, kind, ref): ref is the state name, or a constant's value
    for n, spec in zip(placeholders, sig.input_specs):
        if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, ConstantArgument):
            # a Python scalar (or None) argument: export specializes the program on its
            # value, which keys the program cache (``_signature``)
            inputs.append((n, "const", spec.arg.value))
        elif spec.kind == InputKind.USER_INPUT:
            inputs.append((n, "user", None))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            inputs.append((n, "state", spec.target))
        else:
            raise FpxError(f"fpx.interop.torch: exported input of kind {spec.kind} is not "
                           "supported")
    for spec in sig.output_specs:
        if spec.kind not in (OutputKind.USER_OUTPUT,):
            raise FpxError(f"fpx.interop.torch: the program mutates state ({spec.kind.name} "
                           f"'{spec.target}'); fpx bounds pure programs: call module.eval() "
                           "(batch-norm statistics) or remove the in-place state update")
    calls, unmapped = [], []
    for n in nodes:
        if n.op != "call_function":
            continue
        if n.target is operator.getitem:
            name, h = "<built-in function getitem>", _getitem
        else:
            name, h = _lookup(n.target) if hasattr(n.target, "overloadpacket") else \
                (str(n.target), None)
        if h is None:
            unmapped.append(f"'{name}' (node {n.name})")
        calls.append((n, h, _Ctx(name, _meta_of(n.meta.get("val")), xp)))
    if unmapped:
        op = unmapped[0].split("'")[1]
        raise UnmappedOpError(op, f" (in the exported graph; all unmapped: "
                                  f"{', '.join(unmapped)})")
    # free each value after its last use
    last = {}
    for i, (n, _, _) in enumerate(calls):
        for a in n.all_input_nodes:
            last[a] = i
    out_node = nodes[-1]
    for a in out_node.all_input_nodes:
        last[a] = len(calls)
    frees = [[] for _ in range(len(calls) + 1)]
    for a, i in last.items():
        frees[i].append(a)
    n_user = sum(1 for _, k, _ in inputs if k == "user")
    out_spec = ep.call_spec.out_spec
    user_out = [i for i, s in enumerate(sig.output_specs) if s.kind == OutputKind.USER_OUTPUT]

    def sub(a, env):
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(sub(x, env) for x in a)
        if isinstance(a, dict):
            return {k: sub(v, env) for k, v in a.items()}
        return a

    def fn(params, *args, **kwargs):
        leaves = [x for x in _pytree.tree_leaves((args, kwargs))]
        user_vals = [x for x in leaves if _is_arr(x)]
        if len(user_vals) != n_user:
            raise TypeError(f"fpx.interop.torch: the exported program takes {n_user} array "
                            f"input(s), got {len(user_vals)}")
        env, it = {}, iter(user_vals)
        for n, kind, ref in inputs:
            env[n] = next(it) if kind == "user" else ref if kind == "const" else params[ref]
        for i, (n, h, ctx) in enumerate(calls):
            a = sub(n.args, env)
            k = sub(n.kwargs, env)
            env[n] = _conform(h(ctx, *a, **k), ctx)
            for dead in frees[i]:
                if dead in env and dead is not n:
                    del env[dead]
        outs = [sub(a, env) for a in out_node.args[0]]
        outs = [outs[i] for i in user_out]
        return _pytree.tree_unflatten(outs, out_spec)
    return fn


# =============================================================================================
# Dispatch-mode fallback
# =============================================================================================
class _FpxMode(torch.utils._python_dispatch.TorchDispatchMode):
    """Runs each ATen op in torch *and* in fpx; the tensor torch continues with carries fpx's
    values (so Python control flow decides on what fpx computed)."""

    def __init__(self, xp=np):
        super().__init__()
        self.env: dict[int, tuple] = {}     # id(tensor) -> (tensor, fpx value)
        self.xp = xp
        self.stack: list[str] = []          # ops being decomposed (for error messages)

    def bind(self, t, v):
        self.env[id(t)] = (t, v)

    def value_of(self, t):
        if isinstance(t, torch.Tensor):
            e = self.env.get(id(t))
            if e is not None and e[0] is t:
                return e[1]
            return to_array(t)                          # a constant of the program
        return t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name, h = _lookup(func)
        inplace = False
        if h is None and str(func.overloadpacket).endswith("_"):
            base = getattr(torch.ops.aten, str(func.overloadpacket)[5:-1], None)
            if base is not None:
                ov = getattr(base, func._overloadname, None)
                if ov is not None:
                    _, h = _lookup(ov)
                    inplace = h is not None
        if h is None:
            decomp = _decomposition(func)
            if decomp is not None:
                self.stack.append(name)
                try:
                    with self:
                        return decomp(*args, **kwargs)
                finally:
                    self.stack.pop()
            if self.stack:
                raise UnmappedOpError(self.stack[0], f" (torch decomposes it into '{name}', "
                                      "which has none either; met under the dispatch-mode "
                                      "fallback)")
            raise UnmappedOpError(name, " (met while running the module eagerly under the "
                                        "dispatch-mode fallback)")
        if inplace:
            target = args[0]
            if target._base is not None or any(
                    e[0] is not target and e[0].untyped_storage().data_ptr() ==
                    target.untyped_storage().data_ptr() for e in self.env.values()):
                raise FpxError(f"fpx.interop.torch: in-place '{name}' on a tensor that shares "
                               "memory with another (a view): not supported by the fallback")
        out = func(*args, **kwargs)
        fargs = _pytree.tree_map(self.value_of, args)
        fkwargs = _pytree.tree_map(self.value_of, kwargs)
        metas = _meta_of(out) if isinstance(out, (torch.Tensor, list, tuple)) else []
        ctx = _Ctx(name, metas, self.xp)
        res = _conform(h(ctx, *fargs, **fkwargs), ctx)
        if name in ("aten._local_scalar_dense.default", "aten.item.default"):
            return res
        if isinstance(out, torch.Tensor):
            self._store(func, out, res)
        elif isinstance(out, (list, tuple)):
            for o, r in zip(out, res):
                if isinstance(o, torch.Tensor):
                    self._store(func, o, r.get() if isinstance(r, _Lazy) and r.fn else r)
        return out

    def _store(self, func, t, v):
        if isinstance(v, _Lazy):
            return                   # torch's value stays; fpx raises if it is ever used
        self.bind(t, v)
        if not getattr(func, "is_view", False) and _is_arr(v):
            c = concrete(v)
            if tuple(c.shape) == tuple(t.shape):
                t.copy_(to_tensor(c, t.device).to(t.dtype))


def _decomposition(func):
    from torch._decomp import decomposition_table
    d = decomposition_table.get(func)
    if d is not None:
        return d
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(),
                                                      "CompositeImplicitAutograd"):
        return func.decompose
    return None


def _dispatch_fn(module, state_names):
    """``fn(params, *args, **kwargs)`` running ``module`` eagerly under the fpx dispatch mode."""
    def fn(params, *args, **kwargs):
        xp = np
        for v in _pytree.tree_leaves((args, kwargs, params)):
            if _is_arr(v) and _is_cupy(concrete(v)):
                import cupy
                xp = cupy
        mode = _FpxMode(xp)

        def tens(v):
            if _is_arr(v):
                t = to_tensor(concrete(v))
                mode.bind(t, v)
                return t
            return v
        targs, tkwargs = _pytree.tree_map(tens, (args, kwargs))
        tparams = {k: tens(v) for k, v in params.items()}
        with torch.no_grad(), mode:
            out = torch.func.functional_call(module, tparams, tuple(targs), tkwargs,
                                             strict=False)
        return _pytree.tree_map(mode.value_of, out)
    return fn


# =============================================================================================
# Programs
# =============================================================================================
def _on_torch_gemms(fn):
    """``fn`` with its GEMMs (values and the transforms' own) on torch's MKL, as the
    module's are (``fpx.kernels.blas``)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with _blas.torch_gemms():
            return fn(*args, **kwargs)
    return run


class TorchProgram:
    """An fpx program built from a torch module: ``fn(params, *args, **kwargs)`` over arrays,
    ``state`` the names of the module state it reads (parameters, buffers, constants),
    ``mode``: ``"export"`` or ``"dispatch"`` (the fallback), ``exported``: the
    ``ExportedProgram`` (export path), ``export_error``: why export was not used."""

    def __init__(self, fn, state, mode, exported=None, export_error=None, constants=None):
        self.fn, self.state, self.mode = _on_torch_gemms(fn), list(state), mode
        self.exported, self.export_error = exported, export_error
        self.constants = dict(constants or {})

    def params(self, module) -> dict:
        """The module's current state as arrays (zero-copy for CPU tensors)."""
        out = {}
        for name in self.state:
            if name in self.constants:
                t = self.constants[name]
            else:
                t = _state_tensor(module, name)
            out[name] = to_array(t)
        return out

    def __repr__(self):
        return f"TorchProgram(mode={self.mode!r}, {len(self.state)} state tensors)"


def _state_tensor(module, name):
    try:
        return module.get_parameter(name)
    except AttributeError:
        pass
    try:
        return module.get_buffer(name)
    except AttributeError:
        pass
    obj = module
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _example(x):
    """Torch example inputs for export from user inputs (tensors, arrays, Intervals)."""
    from fpx.transforms.interval import Interval
    if isinstance(x, Interval):
        x = x.value
    if isinstance(x, torch.Tensor):
        return x.detach()
    if _is_arr(x):
        return to_tensor(concrete(x))
    return x


def build(f, args=(), kwargs=None, *, fallback="auto") -> TorchProgram:
    """Build the :class:`TorchProgram` of a module or function of torch tensors (no cache).
    ``fallback``: ``"auto"`` (dispatch mode when ``torch.export`` fails), ``"never"``,
    ``"always"``."""
    if fallback not in ("auto", "never", "always"):
        raise ValueError("fpx.interop.torch: fallback must be 'auto', 'never' or 'always'")
    module = f if isinstance(f, torch.nn.Module) else _FnModule(f)
    ex_args, ex_kwargs = _pytree.tree_map(_example, (tuple(args), dict(kwargs or {})))
    xp = np
    for t in _pytree.tree_leaves((ex_args, ex_kwargs)):
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            import cupy
            xp = cupy
    err = None
    if fallback != "always":
        try:
            ep = _export(module, ex_args, ex_kwargs)
        except UnmappedOpError:
            raise
        except Exception as e:          # data-dependent control flow, unsupported Python, ...
            if fallback == "never":
                raise
            err = e
        else:
            from torch.export.graph_signature import InputKind
            state = [s.target for s in ep.graph_signature.input_specs
                     if s.kind in (InputKind.PARAMETER, InputKind.BUFFER,
                                   InputKind.CONSTANT_TENSOR)]
            consts = {s.target: ep.constants[s.target] for s in ep.graph_signature.input_specs
                      if s.target in ep.constants}
            return TorchProgram(_graph_fn(ep, xp), state, "export", ep, None, consts)
    state = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]
    return TorchProgram(_dispatch_fn(module, state), state, "dispatch", None, err)


def from_module(module, example_inputs=(), example_kwargs=None, *, fallback="auto"):
    """``(fn, params)``: the pure fpx function ``fn(params, *inputs, **kwargs)`` of ``module``
    (or of a function of torch tensors) and the module's parameters, buffers and lifted
    constants as arrays (a dict by state name; NumPy for CPU tensors, CuPy for CUDA).

    ``fn`` takes and returns NumPy/CuPy arrays (or tracers of any fpx transform): it is the
    program ``torch.export`` captured for inputs shaped like ``example_inputs``, interpreted with
    fpx ops (ATen ops -> :data:`ATEN_OPS`). When export fails (data-dependent control flow) and
    ``fallback="auto"``, ``fn`` runs the module eagerly under fpx's dispatch mode instead.
    """
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    prog = build(module, example_inputs, example_kwargs, fallback=fallback)
    owner = module if isinstance(module, torch.nn.Module) else None
    params = prog.params(owner) if owner is not None else {
        k: to_array(v) for k, v in prog.constants.items()}
    return prog.fn, params


# -- the adapter behind every transform --------------------------------------------------------
_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_FN_CACHE: dict = {}


def _signature(args, kwargs):
    from fpx.transforms.interval import Interval
    leaves, spec = _pytree.tree_flatten((tuple(args), dict(kwargs or {})))
    sig = [str(spec)]
    for x in leaves:
        if isinstance(x, Interval):
            x = x.value
        if isinstance(x, torch.Tensor):
            sig.append(("T", tuple(x.shape), x.dtype, x.device.type))
        elif _is_arr(x):
            c = concrete(x)
            sig.append(("A", tuple(c.shape), np.dtype(c.dtype).str, type(c).__module__))
        else:
            try:
                hash(x)
                sig.append(("S", type(x).__name__, x))
            except TypeError:
                sig.append(("O", id(x)))
    return tuple(sig)


def program_for(f, args=(), kwargs=None, *, fallback="auto") -> TorchProgram:
    """The cached :class:`TorchProgram` of ``f`` for inputs like ``args`` (keyed by the module
    or function, its training flag and the inputs' shapes/dtypes/devices)."""
    key = _signature(args, kwargs) + (getattr(f, "training", None), fallback)
    with _LOCK:             # one build per key, and no thread reads a module mid-export
        try:
            per = _CACHE.setdefault(f, {})
        except TypeError:
            per = _FN_CACHE.setdefault(id(f), {})
        prog = per.get(key)
        if prog is None:
            prog = per[key] = build(f, args, kwargs, fallback=fallback)
        return prog


def _device_of(args, kwargs):
    from fpx.transforms.interval import Interval
    for x in tree.flatten((args, kwargs))[0]:
        if isinstance(x, Interval):
            x = x.value
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def _to_fpx_leaf(x):
    from fpx.transforms.interval import Interval
    if isinstance(x, torch.Tensor):
        return to_array(x)
    if isinstance(x, Interval) and isinstance(x.value, torch.Tensor):
        # (the same numbers: the Interval checked them when it was built)
        return Interval._trusted(x.lo, x.hi, to_array(x.value), x.unstable)
    return x


def _to_user_leaf(x, device):
    from fpx.transforms.interval import Interval
    if isinstance(x, Interval):
        v = x.value
        if _is_arr(v) or isinstance(v, (np.ndarray, np.generic)):
            v = to_tensor(v, device)
        # the same numbers as a tensor: no second check of lo <= value <= hi (a costly pass
        # over a large output)
        return Interval._trusted(x.lo, x.hi, v, x.unstable)
    if hasattr(x, "_fpx_convert"):
        return x._fpx_convert(lambda a: to_tensor(a, device))
    if isinstance(x, (np.ndarray, np.generic)) or _is_cupy(x):
        if np.dtype(x.dtype).kind in "fiub" or np.dtype(x.dtype) in (_BF16, _E4M3, _E5M2):
            return to_tensor(x, device)
    return x


def adapt(f, args=(), kwargs=None) -> Adapted:
    """``fpx.transform.adapt`` for torch: see its docstring (the contract every transform
    relies on)."""
    kwargs = dict(kwargs or {})
    with _LOCK:             # the parameters, not another thread's export's fake tensors
        prog = program_for(f, args, kwargs)
        owner = f if isinstance(f, torch.nn.Module) else None
        params = prog.params(owner) if owner is not None else {
            k: to_array(v) for k, v in prog.constants.items()}
    device = _device_of(args, kwargs)
    a, k = tree.tree_map(_to_fpx_leaf, (tuple(args), kwargs))
    examples = _pytree.tree_map(_example, (tuple(args), kwargs))
    program = BoundProgram(prog, params, f, examples)
    return Adapted(program, a, k, lambda out: tree.tree_map(
        lambda x: _to_user_leaf(x, device), out),
        default_policy(device, device.type == "cuda" and _convolves(prog)), "torch", prog)


class BoundProgram:
    """``fn(*inputs)``: a :class:`TorchProgram` with the module's parameters bound. Picklable
    when the module (or function) is: a worker process rebuilds the program from it and the
    example inputs (so process-pool executors can run it)."""

    def __init__(self, prog, params, f, examples):
        self.prog, self.params, self.f, self.examples = prog, params, f, examples
        self.__name__ = type(f).__name__ if isinstance(f, torch.nn.Module) else \
            getattr(f, "__name__", "torch_function")

    def __call__(self, *xs, **kw):
        try:
            return self.prog.fn(self.params, *xs, **kw)
        except TypeError as e:
            if "expected np.ndarray" not in str(e):
                raise
            raise TypeError(
                f"fpx: {self.__name__} is run as a torch program, and every array input reaches "
                "it as a torch tensor (NumPy arrays among its inputs are converted), so a NumPy "
                "call on an input such as torch.from_numpy fails: pass torch tensors, or use "
                f"torch.as_tensor inside it ({e})") from None

    def on_host(self):
        """The program with its parameters copied to the host (CUDA -> NumPy): where the
        interval rules run for CuPy inputs (docs/interval.md, "CuPy arrays")."""
        params = {k: to_host(v) if _is_cupy(v) else v for k, v in self.params.items()}
        return BoundProgram(self.prog, params, self.f, self.examples)

    def __reduce__(self):
        return (_rebuild_bound, (self.f, self.examples, self.params, self.prog.mode))

    def __repr__(self):
        return f"BoundProgram({self.__name__}, {self.prog!r})"


def _rebuild_bound(f, examples, params, mode):
    args, kwargs = examples
    prog = program_for(f, args, kwargs, fallback="always" if mode == "dispatch" else "auto")
    return BoundProgram(prog, params, f, examples)


# =============================================================================================
# Layer-by-layer classification
# =============================================================================================
from dataclasses import dataclass, field  # noqa: E402

from fpx.transforms.classify import Verdict, _compare  # noqa: E402


@dataclass
class LayerVerdict(Verdict):
    """:class:`fpx.Verdict` of a layer-by-layer analysis: ``layers`` is a list of
    ``(name, Verdict)`` in execution order; ``first_bug``: the first layer whose reference
    output leaves the target's bound (``None`` if none); ``kind``: ``"bug"`` when there is one,
    ``"inconclusive"`` when some layer cannot be decided, else ``"roundoff"``."""
    layers: list = field(default_factory=list)
    first_bug: object = None

    def report(self, max_items: int = 4) -> str:
        lines = [f"fpx.classify (layer by layer) verdict: {self.kind.upper()}"
                 + ("" if self.rigorous else "  (probabilistic bound: NOT rigorous)")]
        if self.first_bug is not None:
            lines.append(f"  first layer whose reference output leaves the target's bound: "
                         f"{self.first_bug}")
        lines.append(f"  {'layer':<28}{'verdict':<14}{'outside':>9}{'max |t - r|':>14}"
                     f"{'tightness':>11}")
        for name, v in self.layers:
            tight = f"{v.tightness:.3g}" if np.isfinite(v.tightness) else "-"
            lines.append(f"  {name:<28}{v.kind:<14}{v.n_outside:>9}{v.max_observed:>14.4g}"
                         f"{tight:>11}")
        for name, v in self.layers:
            if v.kind != "roundoff":
                sub = v.report(max_items).splitlines()[1:]
                lines.append(f"  [{name}]")
                lines.extend("  " + s for s in sub)
        for r in self.reasons:
            lines.append(f"  because: {r}")
        return "\n".join(lines)

    __str__ = report


def _module_dtype(m):
    for p in list(m.parameters()) + list(m.buffers()):
        if p.is_floating_point():
            return p.dtype
    return None


def _record_calls(module, names, args, kwargs):
    """Run ``module(*args, **kwargs)`` and record, for each submodule in ``names`` (dotted),
    every call: (name, args, kwargs, output), in execution order."""
    calls, handles = [], []
    for name in names:
        sub = module.get_submodule(name)

        def hook(mod, a, k, out, name=name):
            calls.append((name, a, k, out))
        handles.append(sub.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            module(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return calls


def _cast_inputs(x, dtype):
    if isinstance(x, np.ndarray):        # NumPy inputs among torch ones: as tensors
        x = to_tensor(x)
    if isinstance(x, torch.Tensor) and x.is_floating_point() and dtype is not None:
        return x.to(dtype)
    return x


def _hull(t, r):
    """The interval [min(t, r), max(t, r)] with value ``t`` (the target's own input)."""
    from fpx.transforms.interval import Interval
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        if isinstance(t, torch.Tensor) and isinstance(r, torch.Tensor) and \
                not torch.equal(t, r.to(t.dtype)):
            raise FpxError("fpx.classify: target and reference pass different integer/bool "
                           "tensors to a layer; a layer-by-layer analysis needs equal ones")
        return t
    a = t.detach().double().cpu().numpy()
    b = r.detach().double().cpu().numpy()
    return Interval(np.minimum(a, b), np.maximum(a, b), t.detach())


def _layer_range(names, start, end):
    def pos(v, default):
        if v is None:
            return default
        if isinstance(v, (int, np.integer)):
            return int(v) % len(names)
        if v not in names:
            raise ValueError(f"fpx.classify: layer {v!r} is not among {names}")
        return names.index(v)
    i, j = pos(start, 0), pos(end, len(names) - 1)
    if i > j:
        raise ValueError(f"fpx.classify: start layer {names[i]!r} comes after end {names[j]!r}")
    return i, j


def classify_layers(target, reference, *args, policy=None, bound="rigorous", confidence=0.999,
                    branches="hull", matmul="midrad", start=None, end=None, layers=None,
                    **kwargs) -> LayerVerdict:
    """Classify ``target`` against ``reference`` (two modules with the same layer structure)
    one layer at a time -- the NN-level reduction of RENDER (Zhan et al. 2025).

    Both modules run on ``args`` (floating inputs converted to each module's parameter dtype);
    forward hooks record every call of the chosen layers. For layer ``i`` the input is the
    interval ``[min(t, r), max(t, r)]`` of the target's and the reference's inputs to that layer
    (for a chain: layer ``i-1``'s outputs), with the target's own input as its value; the
    target layer's round-off bound on it (``fpx.interval``) must contain the reference layer's
    output. The first layer where it does not is where the two programs part: a bug there.

    ``layers``: ``None`` -- the target's direct children (``named_children``) that run, in
    execution order; a list of dotted submodule names (the same in both modules); or a dict
    ``{target name: reference name}``. ``start``/``end``: a layer name or position; the
    analysis covers ``start..end`` inclusive.
    """
    if layers is None:
        # a leaf module (no children) is its own single layer ("" names the module itself)
        names = [n for n, _ in target.named_children()] or [""]
        mapping = {n: n for n in names}
    elif isinstance(layers, dict):
        mapping = dict(layers)
        names = list(mapping)
    else:
        names = list(layers)
        mapping = {n: n for n in names}
    t_args = _pytree.tree_map(lambda x: _cast_inputs(x, _module_dtype(target)), (args, kwargs))
    r_args = _pytree.tree_map(lambda x: _cast_inputs(x, _module_dtype(reference)),
                              (args, kwargs))
    t_calls = _record_calls(target, names, *t_args)
    r_calls = _record_calls(reference, [mapping[n] for n in names], *r_args)
    inv = {v: k for k, v in mapping.items()}
    t_seq = [c[0] for c in t_calls]
    r_seq = [inv[c[0]] for c in r_calls]
    if t_seq != r_seq:
        raise FpxError(f"fpx.classify: the target and reference call their layers in different "
                       f"orders: {t_seq} vs {r_seq} (map layer names with layers={{...}})")
    if not t_seq:
        raise FpxError(f"fpx.classify: none of the layers {names} ran")
    labels, seen = [], {}
    for n in t_seq:                       # a layer called twice is two steps: name, name#2
        n = n or type(target).__name__
        seen[n] = seen.get(n, 0) + 1
        labels.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    i0, i1 = _layer_range(labels, start, end)
    results, events = [], []
    opts = dict(bound=bound, confidence=confidence, branches=branches, matmul=matmul)
    for idx in range(i0, i1 + 1):
        name, ta, tk, tout = t_calls[idx]
        _, ra, rk, rout = r_calls[idx]
        ins = _pytree.tree_map(_hull, (ta, tk), (ra, rk))
        sub = target.get_submodule(name)
        from fpx.transform import adapt
        from fpx.transforms.interval import run_interval
        ad = adapt(sub, ins[0], ins[1])
        interp, t_out = run_interval(ad.fn, ad.args, ad.kwargs, trace_floats=False,
                                     policy=ad.policy if policy is None else policy, **opts)
        r_ref = _pytree.tree_map(lambda x: to_array(x) if isinstance(x, torch.Tensor) else x,
                                 rout)
        v = _compare(t_out, r_ref, list(interp.events), bound)
        v.target, v.reference = ad.to_user(t_out), rout
        results.append((labels[idx], v))
        events += v.events
    first = next((n for n, v in results if v.kind == "bug"), None)
    kinds = {v.kind for _, v in results}
    kind = "bug" if first is not None else ("inconclusive" if "inconclusive" in kinds
                                             else "roundoff")
    lv = LayerVerdict(kind, results[-1][1].target, results[-1][1].reference, events=events,
                      rigorous=(bound == "rigorous"), layers=results, first_bug=first)
    for name, v in results:
        lv.n_outside += v.n_outside
        lv.n_undecided += v.n_undecided
        lv.n_elements += v.n_elements
        lv.max_observed = max(lv.max_observed, v.max_observed)
    if first is not None:
        lv.reasons.append(f"layer {first!r}: the reference's output leaves the target's "
                          "round-off bound on the hull of both programs' inputs to it")
    return lv
