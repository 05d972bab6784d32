"""ATen handlers of elementwise arithmetic, functions, comparisons and logic, and of
reductions (sums, means, variances, norms, max/min, sort/topk), in torch's arithmetic:
operands converted to the dtype torch computes in, float16/bfloat16 through float32."""
from __future__ import annotations

import math

import numpy as np

import fpx.nn as fnn
import fpx.numpy as fnp
import fpx.nn_special as _special
from fpx.interop.torch.table import (HALF, Lazy, UnmappedOpError, accumulate, cast, compare,
                                     dim_of, dims_of, dtype_of, elementwise, is_arr, is_float,
                                     opmath, result_dtype, shape_of)
from fpx.interop.torch.table import register_aten as _op


# -- elementwise ------------------------------------------------------------------------------
def _add(a, b, alpha=1):
    return fnp.add(a, b if alpha == 1 else fnp.multiply(b, cast(alpha, dtype_of(b))))


def _sub(a, b, alpha=1):
    return fnp.subtract(a, b if alpha == 1 else fnp.multiply(b, cast(alpha, dtype_of(b))))


def _scalars_stored(fn):
    """torch's CPU add, sub and rsub round a Python scalar operand to a float16/bfloat16
    result's dtype before the float32 arithmetic (measured on torch 2.13: ``bf16(0.890625) +
    -0.85`` is ``0.890625 - 0.8515625``); mul and div keep it in float32."""
    inner = elementwise(fn)

    def h(ctx, *xs, **kw):
        if np.dtype(ctx.dtype) in HALF:
            xs = [cast(x, ctx.dtype) if isinstance(x, (int, float)) and not isinstance(x, bool)
                  else x for x in xs]
        return inner(ctx, *xs, **kw)
    return h


_op("aten.add.Tensor", "aten.add.Scalar")(_scalars_stored(_add))
_op("aten.sub.Tensor", "aten.sub.Scalar")(_scalars_stored(_sub))
_op("aten.rsub.Scalar", "aten.rsub.Tensor")(
    _scalars_stored(lambda a, b, alpha=1: _sub(b, a, alpha)))
_op("aten.mul.Tensor", "aten.mul.Scalar")(elementwise(fnp.multiply))
_op("aten.div.Tensor", "aten.div.Scalar")(elementwise(fnp.divide))


@_op("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(ctx, a, b, *, rounding_mode=None):
    comp = opmath(ctx.dtype)
    a, b = cast(a, comp), cast(b, comp)
    if rounding_mode is None:
        return fnp.divide(a, b)
    if rounding_mode == "floor":
        return fnp.floor_divide(a, b)
    if is_float(comp):
        return fnp.trunc(fnp.divide(a, b))
    q = fnp.floor_divide(a, b)             # integer trunc division: floor, +1 where signs differ
    fix = fnp.logical_and(fnp.not_equal(fnp.remainder(a, b), 0),
                          fnp.less(fnp.multiply(fnp.sign(a), fnp.sign(b)), 0))
    return fnp.add(q, fnp.astype(fix, dtype_of(q)))


_op("aten.neg")(elementwise(fnp.negative))
_op("aten.abs")(elementwise(fnp.abs))
_op("aten.sqrt")(elementwise(fnp.sqrt))
_op("aten.rsqrt")(elementwise(fnn.rsqrt))
_op("aten.reciprocal")(elementwise(lambda x: fnp.divide(cast(1, dtype_of(x)), x)))
for _n, _f in {"exp": fnp.exp, "exp2": fnp.exp2, "expm1": fnp.expm1, "log": fnp.log,
               "log2": fnp.log2, "log1p": fnp.log1p, "sin": fnp.sin, "cos": fnp.cos,
               "tan": fnp.tan, "tanh": fnp.tanh, "sinh": fnp.sinh, "cosh": fnp.cosh,
               "atan": fnp.arctan, "erf": fnp.erf, "floor": fnp.floor, "ceil": fnp.ceil,
               "round": fnp.rint, "trunc": fnp.trunc,
               "sigmoid": fnn.sigmoid, "relu": fnn.relu}.items():
    _op(f"aten.{_n}.default")(elementwise(_f))
_op("aten.atan2")(elementwise(fnp.arctan2))


@_op("aten.sign.default")
def _sign(ctx, x):
    """torch's CPU sign, ``(0 < x) - (x < 0)``: 0 at NaN (NumPy's sign gives NaN), as
    selects between exact constants."""
    x = cast(x, ctx.dtype)
    one, zero = np.ones((), ctx.dtype), np.zeros((), ctx.dtype)
    return fnp.where(fnp.greater(x, zero), one, fnp.where(fnp.less(x, zero), -one, zero))


@_op("aten.digamma")
def _digamma(ctx, x):
    """torch's CPU kernel step by step (``fpx.nn.digamma``, the reflection formula for x < 0);
    float16/bfloat16 through float32."""
    return elementwise(fnn.digamma)(ctx, x)


_op("aten.lgamma")(elementwise(_special.lgamma))


@_op("aten.polygamma")
def _polygamma(ctx, n, x):
    """ψ⁽ⁿ⁾: n = 0 is digamma, n = 1 torch's trigamma kernel step by step
    (``fpx.nn_special.trigamma``), n >= 2 ``fpx.nn_special.polygamma``; float16/bfloat16
    through float32."""
    if n == 0:
        return _digamma(ctx, x)
    if n == 1:
        return elementwise(_special.trigamma)(ctx, x)
    half = np.dtype(ctx.dtype) in HALF
    return cast(_special.polygamma(n, cast(x, opmath(ctx.dtype)),
                                   stored=ctx.dtype if half else None), ctx.dtype)


_op("aten.log10")(elementwise(lambda x: fnp.multiply(fnp.log(x), cast(1 / math.log(10), dtype_of(x)))))
_op("aten.silu")(elementwise(fnn.silu))
_op("aten.hardswish")(elementwise(fnn.hardswish))
_op("aten.hardsigmoid")(elementwise(fnn.hardsigmoid))
_op("aten.maximum")(elementwise(fnp.maximum))
_op("aten.minimum")(elementwise(fnp.minimum))
_op("aten.remainder")(elementwise(fnp.remainder))


@_op("aten.fmod")
def _fmod(ctx, a, b):
    """C fmod (the sign of the dividend), on integers: remainder, moved toward 0."""
    if is_float(ctx.dtype):
        raise UnmappedOpError(ctx.op, " on floating-point tensors (an exact fmod has no fpx "
                                      "primitive)")
    a, b = cast(a, ctx.dtype), cast(b, ctx.dtype)
    r = fnp.remainder(a, b)
    off = fnp.logical_and(fnp.not_equal(r, 0),
                          fnp.not_equal(fnp.less(r, 0), fnp.less(a, 0)))
    return fnp.where(off, fnp.subtract(r, b), r)


_op("aten.floor_divide")(elementwise(fnp.floor_divide))


@_op("aten.round.decimals")
def _round_dec(ctx, x, *, decimals=0):
    return cast(fnp.round(cast(x, opmath(ctx.dtype)), decimals), ctx.dtype)


@_op("aten.gelu")
def _gelu(ctx, x, *, approximate="none"):
    return cast(fnn.gelu(cast(x, opmath(ctx.dtype)), approximate=approximate), ctx.dtype)


@_op("aten.pow.Tensor_Scalar")
def _pow_scalar(ctx, x, e):
    """torch's pow(tensor, scalar) kernel: 2 -> x*x, 3 -> x*x*x, 0.5 -> sqrt, -0.5 -> rsqrt,
    -1 -> reciprocal, -2 -> 1/(x*x); other exponents std::pow."""
    comp = opmath(ctx.dtype)
    x = cast(x, comp)
    if is_float(comp):
        one = cast(1, comp)
        if e == 2:
            return cast(fnp.multiply(x, x), ctx.dtype)
        if e == 3:
            return cast(fnp.multiply(fnp.multiply(x, x), x), ctx.dtype)
        if e == 0.5:
            return cast(fnp.sqrt(x), ctx.dtype)
        if e == -0.5:
            return cast(fnp.divide(one, fnp.sqrt(x)), ctx.dtype)
        if e == -1:
            return cast(fnp.divide(one, x), ctx.dtype)
        if e == -2:
            return cast(fnp.divide(one, fnp.multiply(x, x)), ctx.dtype)
    return cast(fnp.power(x, cast(e, comp)), ctx.dtype)


_op("aten.pow.Tensor_Tensor", "aten.pow.Scalar")(elementwise(fnp.power))


@_op("aten.clamp", "aten.clamp.Tensor", "aten.hardtanh")
def _clamp(ctx, x, min=None, max=None):
    comp = opmath(ctx.dtype)
    y = cast(x, comp)
    if min is not None:
        y = fnp.maximum(y, cast(min, comp))
    if max is not None:
        y = fnp.minimum(y, cast(max, comp))
    return cast(y, ctx.dtype)


_op("aten.clamp_min")(lambda ctx, x, m: _clamp(ctx, x, m, None))
_op("aten.clamp_max")(lambda ctx, x, m: _clamp(ctx, x, None, m))


@_op("aten.leaky_relu")
def _leaky_relu(ctx, x, negative_slope=0.01):
    comp = opmath(ctx.dtype)
    y = cast(x, comp)
    return cast(fnp.where(fnp.greater(y, cast(0, comp)), y,
                           fnp.multiply(y, cast(negative_slope, comp))), ctx.dtype)


@_op("aten.elu")
def _elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    comp = opmath(ctx.dtype)
    y = cast(x, comp)
    neg = fnp.multiply(fnp.expm1(fnp.multiply(y, cast(input_scale, comp))), cast(alpha, comp))
    r = fnp.where(fnp.greater(y, cast(0, comp)), y, neg)
    return cast(r if scale == 1 else fnp.multiply(r, cast(scale, comp)), ctx.dtype)


@_op("aten.softplus")
def _softplus(ctx, x, beta=1, threshold=20):
    comp = opmath(ctx.dtype)
    y = cast(x, comp)
    bx = y if beta == 1 else fnp.multiply(y, cast(beta, comp))
    sp = fnp.log1p(fnp.exp(bx))
    if beta != 1:
        sp = fnp.divide(sp, cast(beta, comp))
    return cast(fnp.where(fnp.greater(bx, cast(threshold, comp)), y, sp), ctx.dtype)


@_op("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(ctx, c, a, b):
    return fnp.where(cast(c, np.bool_), cast(a, ctx.dtype), cast(b, ctx.dtype))


@_op("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(ctx, x, mask, value):
    return fnp.where(cast(mask, np.bool_), cast(value, ctx.dtype), cast(x, ctx.dtype))


for _n, _f in {"eq": fnp.equal, "ne": fnp.not_equal, "lt": fnp.less, "le": fnp.less_equal,
               "gt": fnp.greater, "ge": fnp.greater_equal}.items():
    _op(f"aten.{_n}.Tensor", f"aten.{_n}.Scalar")(compare(_f))
for _n, _f in {"logical_and": fnp.logical_and, "logical_or": fnp.logical_or,
               "logical_xor": fnp.logical_xor}.items():
    _op(f"aten.{_n}")(lambda ctx, a, b, _f=_f: _f(cast(a, np.bool_), cast(b, np.bool_)))
_op("aten.logical_not")(lambda ctx, a: fnp.logical_not(cast(a, np.bool_)))


@_op("aten.bitwise_not")
def _bitwise_not(ctx, a):
    if dtype_of(a) != np.bool_:
        raise UnmappedOpError("aten.bitwise_not", " for integer tensors (only bool masks)")
    return fnp.logical_not(a)


@_op("aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor")
def _bitwise2(ctx, a, b):
    name = ctx.op.split(".")[1]
    if not (is_arr(a) and dtype_of(a) == np.bool_ and (not is_arr(b) or dtype_of(b) == np.bool_)):
        raise UnmappedOpError(ctx.op, " for integer tensors (only bool masks)")
    return {"bitwise_and": fnp.logical_and, "bitwise_or": fnp.logical_or,
            "bitwise_xor": fnp.logical_xor}[name](a, cast(b, np.bool_))


_op("aten.isnan")(lambda ctx, x: fnp.isnan(x))
_op("aten.isinf")(lambda ctx, x: fnp.isinf(x))
_op("aten.isfinite")(lambda ctx, x: fnp.isfinite(x))


# -- reductions -------------------------------------------------------------------------------
@_op("aten.sum.dim_IntList", "aten.sum.default")
def _sum(ctx, x, dim=None, keepdim=False, *, dtype=None):
    y, out = accumulate(ctx, x, dtype)
    return cast(fnp.sum(y, dims_of(dim, len(shape_of(x))), keepdims=keepdim), out)


@_op("aten.mean.dim", "aten.mean.default")
def _mean(ctx, x, dim=None, keepdim=False, *, dtype=None):
    y, out = accumulate(ctx, x, dtype)
    return cast(fnp.mean(y, dims_of(dim, len(shape_of(x))), keepdims=keepdim), out)


@_op("aten.prod.dim_int", "aten.prod.default")
def _prod(ctx, x, dim=None, keepdim=False, *, dtype=None):
    """In the result's dtype: torch's CPU prod rounds every product of float16/bfloat16
    factors to float16/bfloat16 (checked against its kernel: unlike sum and mean, which
    accumulate in float32)."""
    y = cast(x, result_dtype(ctx, dtype))
    return fnp.prod(y, dims_of(dim, len(shape_of(x))), keepdims=keepdim)


@_op("aten.logsumexp.default")
def _logsumexp(ctx, x, dim, keepdim=False):
    """torch's kernel (``logsumexp_out_impl``): m = amax over ``dim`` (an infinite maximum
    taken as 0), then ``sum(exp(x - m))``, its log, plus m -- each a tensor op in the result's
    dtype, so float16/bfloat16 round after every step (the sum accumulates in float32). The
    export's default decomposition computes it all in float32 and rounds once: eager CPU
    outputs were an ulp outside that model's bound."""
    out, comp = ctx.dtype, opmath(ctx.dtype)
    dims = dims_of(dim, len(shape_of(x)))
    xc = cast(x, comp)
    if any(shape_of(x)[d] == 0 for d in dims):
        return cast(fnp.log(fnp.sum(fnp.exp(xc), dims, keepdims=keepdim)), out)

    def step(y):            # one tensor op's result: stored in ``out``, read back in opmath
        return cast(cast(y, out), comp)
    m = fnp.max(xc, dims, keepdims=True)
    m = fnp.where(fnp.isinf(m), 0.0, m)
    s = step(fnp.sum(step(fnp.exp(step(fnp.subtract(xc, m)))), dims, keepdims=keepdim))
    return cast(fnp.add(step(fnp.log(s)), m if keepdim else fnp.squeeze(m, dims)), out)


@_op("aten.xlogy.Tensor")
def _xlogy(ctx, x, y):
    """torch's CPU kernel: 0 where x is 0, else x·log(y) (NaN where y is NaN); for a
    float16/bfloat16 result log(y) is rounded to that dtype before the product (measured,
    bit for bit; the export's decomposition rounds once, and torch's output left its bound)."""
    out, comp = ctx.dtype, opmath(ctx.dtype)
    xc, yc = cast(x, comp), cast(y, comp)
    r = fnp.multiply(xc, cast(cast(fnp.log(yc), out), comp))
    r = fnp.where(fnp.equal(xc, 0), cast(0.0, comp), r)
    return cast(fnp.where(fnp.isnan(yc), cast(np.nan, comp), r), out)


@_op("aten.amax", "aten.amin")
def _amaxmin(ctx, x, dim=(), keepdim=False):
    f = fnp.max if ctx.op.startswith("aten.amax") else fnp.min
    return f(x, dims_of(dim, len(shape_of(x))), keepdims=keepdim)


@_op("aten.max.default", "aten.min.default")
def _maxmin_all(ctx, x):
    return (fnp.max if ctx.op.startswith("aten.max") else fnp.min)(x)


@_op("aten.max.dim", "aten.min.dim")
def _maxmin_dim(ctx, x, dim, keepdim=False):
    ismax = ctx.op.startswith("aten.max")
    d = dim_of(dim, len(shape_of(x)))
    vals = (fnp.max if ismax else fnp.min)(x, d, keepdims=keepdim)
    return (vals, Lazy(lambda: (fnp.argmax if ismax else fnp.argmin)(x, d, keepdims=keepdim)))


def _sorted_along(x, d, descending):
    """(values, indices) of torch's sort along ``d``: ascending as NumPy's stable sort (NaN
    last); descending as its reverse (NaN first, as torch; ties in reverse order -- the
    interval rule counts ties as undecided, so any tie order is inside its bound)."""
    vals, idx = fnp.sort(x, axis=d), fnp.argsort(x, axis=d)
    if descending:
        vals, idx = fnp.flip(vals, d), fnp.flip(idx, d)
    return vals, cast(idx, np.int64)


@_op("aten.sort.default", "aten.sort.stable")
def _sort(ctx, x, dim=-1, descending=False, *, stable=None):
    """``torch.sort`` (``sort.stable`` passes dim and descending by keyword): exact values
    (the interval rule's order statistics), indices certain only where the order is decided
    for every point of the box."""
    d = dim_of(dim, len(shape_of(x)))
    return _sorted_along(x, d, bool(descending))


@_op("aten.topk")
def _topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    """``torch.topk`` with ``sorted=True``: the first k of the sort (descending for the
    largest). ``sorted=False`` returns them in an order torch leaves unspecified, which no
    position-wise bound can follow: it raises."""
    if not sorted:
        raise UnmappedOpError(ctx.op, " with sorted=False (an unspecified order of the k "
                                      "values); use sorted=True")
    d = dim_of(dim, len(shape_of(x)))
    vals, idx = _sorted_along(x, d, bool(largest))
    first = (slice(None),) * d + (slice(0, int(k)),)
    return vals[first], idx[first]


@_op("aten.argmax", "aten.argmin")
def _argmaxmin(ctx, x, dim=None, keepdim=False):
    f = fnp.argmax if ctx.op.startswith("aten.argmax") else fnp.argmin
    if dim is None:
        r = f(fnp.reshape(x, (-1,)))
        return fnp.reshape(r, (1,) * len(shape_of(x))) if keepdim else r
    return f(x, dim_of(dim, len(shape_of(x))), keepdims=keepdim)


@_op("aten.any.dim", "aten.any.dims", "aten.any.default", "aten.all.dim", "aten.all.dims",
     "aten.all.default")
def _anyall(ctx, x, dim=None, keepdim=False):
    f = fnp.any if ctx.op.startswith("aten.any") else fnp.all
    return f(cast(x, np.bool_), dims_of(dim, len(shape_of(x))), keepdims=keepdim)


@_op("aten.cumsum")
def _cumsum(ctx, x, dim, *, dtype=None):
    y, out = accumulate(ctx, x, dtype)
    return cast(fnp.cumsum(y, dim_of(dim, len(shape_of(x)))), out)


@_op("aten.var.correction", "aten.var.dim")
def _var(ctx, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """torch's two-pass variance (the mean, then the sum of squared deviations, divided by
    ``n - correction``): NumPy's ``var`` with ``ddof=correction``."""
    if ctx.op.endswith("var.dim"):
        corr = 1 if (unbiased is None or unbiased) else 0
    else:
        corr = 1 if correction is None else correction
    y, out = accumulate(ctx, x)
    return cast(fnp.var(y, dims_of(dim, len(shape_of(x))), ddof=corr, keepdims=keepdim), out)


@_op("aten.linalg_vector_norm")
def _vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """||x||_ord over ``dim``: sqrt(sum(x*x)) (2), sum|x| (1), max|x| (inf), min|x| (-inf),
    count of nonzeros (0), sum(|x|^p)^(1/p) otherwise; in opmath, rounded once."""
    y, out = accumulate(ctx, x, dtype)
    axes = dims_of(dim, len(shape_of(x)))
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
        r = fnp.sum(fnp.astype(fnp.not_equal(y, 0), dtype_of(y)), axes, keepdims=keepdim)
    else:
        p = cast(ord, dtype_of(y))
        r = fnp.power(fnp.sum(fnp.power(a, p), axes, keepdims=keepdim),
                      cast(1.0 / ord, dtype_of(y)))
    return cast(r, out)
