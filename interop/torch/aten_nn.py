"""ATen handlers of the neural-network ops: matmuls, convolutions (transposed too),
normalizations, softmax, attention, embedding, losses, pooling and nearest upsampling --
each the :mod:`fpx.nn` composite that computes it, its operands in torch's dtypes."""
from __future__ import annotations

import functools
import math

import numpy as np

import fpx.nn as fnn
import fpx.numpy as fnp
from fpx.interop.torch.convert import F32, HALF
from fpx.interop.torch.table import (Lazy, UnmappedOpError, cast, dim_of, dtype_of, ints,
                                     opmath, shape_of)
from fpx.interop.torch.table import register_aten as _op

# -- matmul and nn composites -------------------------------------------------------------------
def _mm_dtype(ctx, *xs):
    return [cast(x, ctx.dtype) for x in xs]


@_op("aten.mm", "aten.bmm", "aten.matmul")
def _mm(ctx, a, b):
    a, b = _mm_dtype(ctx, a, b)
    return cast(fnp.matmul(a, b), ctx.dtype)


@_op("aten.dot", "aten.vdot")
def _dot(ctx, a, b):
    a, b = _mm_dtype(ctx, a, b)
    return cast(fnp.matmul(a, b), ctx.dtype)


@_op("aten.linear")
def _linear(ctx, x, w, b=None):
    x, w = _mm_dtype(ctx, x, w)
    if b is not None:
        b = cast(b, ctx.dtype)
    return cast(fnn.linear(x, w, b, bias_in_sum=True), ctx.dtype)


@_op("aten.addmm", "aten.baddbmm")
def _addmm(ctx, c, a, b, *, beta=1, alpha=1):
    """beta*c + alpha*(a @ b). A bias that is the same for every row (shape (N,) or (1, N)) is
    one more term of the matmul's sum (BLAS gemm with beta=1): fpx.nn.linear with
    bias_in_sum."""
    a, b = _mm_dtype(ctx, a, b)
    c = cast(c, ctx.dtype)
    cs = shape_of(c)
    row_bias = len(cs) == 1 or (len(cs) >= 2 and all(s == 1 for s in cs[:-1]))
    if beta == 1 and alpha == 1 and row_bias and ctx.op.startswith("aten.addmm"):
        return cast(fnn.linear(a, fnp.transpose(b), fnp.reshape(c, (cs[-1],)) if cs[-1] ==
                                shape_of(b)[-1] else fnp.broadcast_to(fnp.reshape(c, (-1,)),
                                                                    (shape_of(b)[-1],)),
                                bias_in_sum=True), ctx.dtype)
    p = fnp.matmul(a, b)
    p = cast(p, ctx.dtype)
    if alpha != 1:
        p = fnp.multiply(p, cast(alpha, ctx.dtype))
    if beta == 0:
        return p
    return fnp.add(p, c if beta == 1 else fnp.multiply(c, cast(beta, ctx.dtype)))


@_op("aten.convolution")
def _convolution(ctx, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    x, w = _mm_dtype(ctx, x, w)
    if b is not None:
        b = cast(b, ctx.dtype)
    if transposed:
        return fnn.conv_transpose(x, w, b, stride, padding, output_padding, int(groups),
                                  dilation, bias_in_sum=True)
    return fnn.conv(x, w, b, stride=stride, padding=padding, dilation=dilation,
                    groups=int(groups), bias_in_sum=True)


def _bn_eval(ctx, x, w, b, mean, var, eps):
    """torch's CPU inference kernel: alpha = w / sqrt(var + eps) (as 1/sqrt * w), beta =
    b - mean * alpha, y = x * alpha + beta (per channel, dim 1), in opmath; float16/bfloat16
    x: :func:`_bn_half`."""
    if dtype_of(x) in HALF:
        pdt = dtype_of(mean)
        r = _rounder(pdt)
        inv = r(fnp.divide(cast(1, F32), r(fnp.sqrt(r(fnp.add(cast(var, F32), cast(eps, F32)))))))
        return _bn_half(ctx, x, cast(mean, F32), inv, w, b, pdt)
    comp = opmath(ctx.dtype)
    pdt = opmath(dtype_of(mean))
    p = [None if t is None else cast(t, pdt) for t in (mean, var, w, b)]
    return cast(fnn.batch_norm(cast(x, comp), *p, eps, axis=1), ctx.dtype)


def _rounder(dt):
    """v -> v rounded to dt and read back in float32 (the identity unless dt is half)."""
    if np.dtype(dt) not in HALF:
        return lambda v: v
    return lambda v: cast(cast(v, dt), F32)


def _bn_half(ctx, x, mean, invstd, w, b, pdt):
    """y = x·alpha + beta, alpha = invstd·w, beta = b - mean·alpha per channel, for a
    float16/bfloat16 x, as torch's CPU kernels compute it: in float32 on a contiguous x; on a
    strided one (a transposed input) alpha and beta are tensors of the parameters' dtype
    ``pdt`` and ``x·alpha + beta`` is c10::Half/BFloat16 arithmetic, each op rounded to it
    (measured: ~1/3 of the elements differ). The bound models the strided path, whose
    roundings contain the contiguous path's results."""
    nd = len(shape_of(x))
    per_channel = (1, -1) + (1,) * (nd - 2)
    r = _rounder(pdt)
    alpha = invstd if w is None else r(fnp.multiply(invstd, cast(w, F32)))
    beta = fnp.negative(r(fnp.multiply(mean, alpha)))
    if b is not None:
        beta = r(fnp.add(cast(b, F32), beta))
    xa = r(fnp.multiply(cast(x, F32), fnp.reshape(alpha, per_channel)))
    return cast(fnp.add(xa, fnp.reshape(beta, per_channel)), ctx.dtype)


@_op("aten._native_batch_norm_legit_no_training")
def _bn_legit(ctx, x, w, b, running_mean, running_var, momentum, eps):
    y = _bn_eval(ctx, x, w, b, running_mean, running_var, eps)
    return (y, Lazy(None, "batch-norm saved mean"), Lazy(None, "batch-norm saved rstd"))


def _statistics_opmath(x, w, b):
    """x, w, b in opmath for a normalization by the batch's own statistics."""
    comp = opmath(dtype_of(x))
    return [None if t is None else cast(t, comp) for t in (x, w, b)]


def _saved_stats(rows, eps, shape, dtype):
    """The lazily computed (mean, rstd) outputs of a normalization of ``rows`` (2-D),
    reshaped to ``shape``."""
    stats = functools.lru_cache(maxsize=None)(lambda: fnn.norm_stats(rows, 1, eps))
    return tuple(Lazy(lambda i=i: cast(fnp.reshape(stats()[i], shape), dtype)) for i in (0, 1))


@_op("aten._native_batch_norm_legit.no_stats")
def _bn_batch_stats(ctx, x, w, b, training, momentum, eps):
    """Normalization by the batch's own per-channel statistics, with no running stats to
    update (``InstanceNorm``, ``BatchNorm(track_running_stats=False)``; a pure op): the
    instance norm of x with its batch and channel dims swapped (each channel's (N, *spatial)
    values one instance); float16/bfloat16 as torch's CPU kernel computes them
    (:func:`_bn_batch_stats_half`)."""
    if dtype_of(x) in HALF:
        y = _bn_batch_stats_half(ctx, x, w, b, eps)
    else:
        x, w, b = _statistics_opmath(x, w, b)
        perm = (1, 0) + tuple(range(2, len(shape_of(x))))
        y = fnn.instance_norm(fnp.expand_dims(fnp.transpose(x, perm), 0), w, b, eps)
        y = cast(fnp.transpose(fnp.reshape(y, shape_of(y)[1:]), perm), ctx.dtype)
    return (y, Lazy(None, "batch-norm saved mean"), Lazy(None, "batch-norm saved rstd"))


def _bn_batch_stats_half(ctx, x, w, b, eps):
    """torch's CPU batch norm by batch statistics of a float16/bfloat16 x: the per-channel
    mean and biased variance in float32, the mean stored in x's dtype (torch's saved mean),
    the variance too (bfloat16 does; the bound covers both), the inverse standard deviation
    ``1/sqrt(var + eps)`` stored as well (measured: bit for bit on contiguous float16); then
    the affine of :func:`_bn_half`."""
    half, nd = dtype_of(x), len(shape_of(x))
    xc, stored = cast(x, F32), _rounder(half)
    axes = (0,) + tuple(range(2, nd))
    mean = fnp.mean(xc, axes)
    d = fnp.subtract(xc, fnp.reshape(mean, (1, -1) + (1,) * (nd - 2)))
    var = stored(fnp.mean(fnp.multiply(d, d), axes))
    inv = stored(fnp.divide(cast(1, F32), fnp.sqrt(fnp.add(var, cast(eps, F32)))))
    return _bn_half(ctx, x, stored(mean), inv, w, b, half if w is None else dtype_of(w))


@_op("aten.native_group_norm")
def _group_norm(ctx, x, w, b, n, c, hxw, group, eps):
    """Group norm (``fpx.nn.group_norm``); torch's CPU kernel computes ``x·(rstd·w) + (b -
    mean·rstd·w)``, which the layer-norm rule's evaluation error covers with w = 1, b = 0
    and the two roundings after it; float16/bfloat16 in float32 (statistics too), rounded
    once. Also returns the (N, G) mean and rstd (computed only if the graph uses them)."""
    x, w, b = _statistics_opmath(x, w, b)
    g, n = int(group), shape_of(x)[0]
    y = cast(fnn.group_norm(x, g, w, b, eps), ctx.dtype)
    return (y,) + _saved_stats(fnp.reshape(x, (n * g, -1)), eps, (n, g), ctx.dtype)


@_op("aten.native_batch_norm", "aten._native_batch_norm_legit")
def _bn(ctx, x, w, b, running_mean, running_var, training, momentum, eps):
    if training:
        raise UnmappedOpError(ctx.op, " in training mode (batch statistics and running-stat "
                                      "updates); call module.eval()")
    y = _bn_eval(ctx, x, w, b, running_mean, running_var, eps)
    return (y, Lazy(None, "batch-norm saved mean"), Lazy(None, "batch-norm saved rstd"))


@_op("aten.upsample_nearest1d", "aten.upsample_nearest2d", "aten.upsample_nearest3d",
     "aten._upsample_nearest_exact1d", "aten._upsample_nearest_exact2d",
     "aten._upsample_nearest_exact3d")
def _upsample_nearest(ctx, x, output_size=None, *scales):
    """``F.interpolate(mode="nearest" / "nearest-exact")``: ``fpx.nn.upsample_nearest``.
    ``.vec`` overloads pass (output_size, scale_factors); the others (output_size,
    scales...)."""
    nd = len(shape_of(x)) - 2
    if ".vec" in ctx.op:
        factors = list(scales[0]) if scales and scales[0] is not None else [None] * nd
    else:
        factors = list(scales) + [None] * (nd - len(scales))
    size = None if output_size is None or len(ints(output_size)) == 0 else ints(output_size)
    return fnn.upsample_nearest(x, size, factors if any(f is not None for f in factors)
                                else None, exact="exact" in ctx.op)


@_op("aten.native_layer_norm")
def _layer_norm(ctx, x, normalized_shape, w, b, eps):
    comp = opmath(ctx.dtype)
    x = cast(x, comp)
    y = fnn.layer_norm(x, tuple(ints(normalized_shape)), None if w is None else cast(w, comp),
                       None if b is None else cast(b, comp), eps)
    nd, k = len(shape_of(x)), len(ints(normalized_shape))
    stats_shape = shape_of(x)[:nd - k] + (1,) * k
    rows = fnp.reshape(x, (math.prod(stats_shape), -1))
    return (cast(y, ctx.dtype),) + _saved_stats(rows, eps, stats_shape, comp)


@_op("aten._softmax", "aten._log_softmax", "aten._safe_softmax", "aten.softmax.int",
     "aten.log_softmax.int")
def _softmax(ctx, x, dim, half_to_float=False, **kw):
    """softmax/log_softmax along ``dim``; float16/bfloat16 computed in float32, rounded once
    (torch's CPU kernels), with two exceptions on CPU (``stored``): log_softmax over the last
    dim rounds the sum of the exponentials, and then its log, to the input's dtype; softmax
    over another dim rounds exp(x - max) to it before the division on its scalar path (the
    tail of a vector, which depends on the sizes and the threads: the bound covers both).
    ``_safe_softmax``: rows that are entirely -inf give 0."""
    comp = opmath(dtype_of(x))
    y = cast(x, comp)
    nd = len(shape_of(x))
    d = dim_of(dim, nd)
    last = d == max(nd - 1, 0)
    half_cpu = dtype_of(x) in HALF and ctx.xp is np           # CUDA's kernels: opmath
    if "log_softmax" in ctx.op:
        return cast(fnn.log_softmax(y, d, stored=dtype_of(x) if half_cpu and last else None),
                    ctx.dtype)
    stored = dtype_of(x) if half_cpu and not last else None
    if "_safe_softmax" in ctx.op:
        ninf = cast(-np.inf, comp)
        dead = fnp.all(fnp.equal(y, ninf), d, keepdims=True)
        s = fnn.softmax(fnp.where(dead, cast(0, comp), y), d, stored=stored)
        return cast(fnp.where(dead, cast(0, comp), s), ctx.dtype)
    return cast(fnn.softmax(y, d, stored=stored), ctx.dtype)


@_op("aten.scaled_dot_product_attention")
def _sdpa(ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
          enable_gqa=False):
    if dropout_p:
        raise UnmappedOpError(ctx.op, " with dropout_p > 0 (random); use the module in eval "
                                      "mode or dropout_p=0")
    q, k, v = _mm_dtype(ctx, q, k, v)
    if enable_gqa and shape_of(k)[-3] != shape_of(q)[-3]:
        rep = shape_of(q)[-3] // shape_of(k)[-3]
        k = fnp.repeat(k, rep, axis=-3)
        v = fnp.repeat(v, rep, axis=-3)
    return cast(fnn.scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale),
                 ctx.dtype)


@_op("aten.embedding")
def _embedding(ctx, weight, ids, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return fnn.embedding(ids, weight)


@_op("aten.nll_loss_forward")
def _nll_loss(ctx, x, target, weight, reduction, ignore_index):
    """-x[i, target[i]] (times the class weight), ignoring ``ignore_index``; reduction 0 none,
    1 mean (over the weights of the kept targets), 2 sum. Returns (loss, total_weight)."""
    comp = opmath(ctx.dtype)
    x = cast(x, comp)
    tgt = np.asarray(fnp._concrete_index(target, "nll_loss targets"))
    nd = len(shape_of(x))
    cdim = 1 if nd >= 2 else 0
    keep = tgt != ignore_index
    safe = np.where(keep, tgt, 0)
    picked = fnp.take_along_axis(x, np.expand_dims(safe, cdim), cdim)
    picked = fnp.reshape(picked, tgt.shape)
    if weight is not None:
        wsel = fnp.take(cast(weight, comp), safe)
        wsel = fnp.where(keep, wsel, cast(0, comp))
    else:
        wsel = keep.astype(dtype_of(picked))
    loss = fnp.negative(fnp.multiply(picked, wsel))
    total = fnp.sum(wsel)
    if reduction == 0:
        return (cast(loss, ctx.dtype), cast(total, ctx.dtype))
    s = fnp.sum(loss)
    if reduction == 2:
        return (cast(s, ctx.dtype), cast(total, ctx.dtype))
    return (cast(fnp.divide(s, total), ctx.dtype), cast(total, ctx.dtype))


def _pool_args(ctx, x, kernel_size, stride, padding, dilation=1):
    nd = len(ints(kernel_size)) if len(ints(kernel_size)) > 1 else len(shape_of(x)) - 2
    def t(v, default):
        v = ints(v) if v is not None and not (isinstance(v, (list, tuple)) and len(v) == 0) \
            else ints(default)
        return tuple(v) * (nd if len(v) == 1 else 1)
    k = t(kernel_size, kernel_size)
    return k, t(stride, k), t(padding, 0), t(dilation, 1)


@_op("aten.max_pool2d_with_indices", "aten.max_pool2d", "aten.max_pool1d",
     "aten.max_pool1d_with_indices", "aten.max_pool3d_with_indices")
def _max_pool(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    k, s, p, d = _pool_args(ctx, x, kernel_size, stride, padding, dilation)
    y = fnn.max_pool(x, k, s, p, d, ceil_mode)
    if "indices" in ctx.op:
        return (y, Lazy(None, "max-pool indices"))
    return y


@_op("aten.avg_pool2d", "aten.avg_pool1d", "aten.avg_pool3d")
def _avg_pool(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False,
              count_include_pad=True, divisor_override=None):
    k, s, p, _ = _pool_args(ctx, x, kernel_size, stride, padding)
    comp = opmath(ctx.dtype)
    return cast(fnn.avg_pool(cast(x, comp), k, s, p, count_include_pad, ceil_mode,
                             divisor_override), ctx.dtype)


@_op("aten._adaptive_avg_pool2d", "aten.adaptive_avg_pool2d", "aten._adaptive_avg_pool1d",
     "aten.adaptive_avg_pool1d", "aten._adaptive_avg_pool3d")
def _adaptive_avg_pool(ctx, x, output_size):
    comp = opmath(ctx.dtype)
    return cast(fnn.adaptive_avg_pool(cast(x, comp), tuple(ints(output_size))), ctx.dtype)
