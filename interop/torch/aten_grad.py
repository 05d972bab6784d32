"""ATen handlers of the ops that autograd's backward formulas and torch's optimizers run and
the forward tables do not cover (scatters, the backward kernels torch does not decompose,
the optimizers' fused elementwise updates), each written with fpx ops."""
from __future__ import annotations

import numpy as np

import fpx.numpy as fnp
from fpx.core import concrete
from fpx.interop.torch.table import cast, dim_of, dtype_of, opmath, shape_of
from fpx.interop.torch.table import register_aten as _op


def _index_mask(shape, index, dim):
    """A boolean mask of ``shape``, True at the positions ``scatter`` writes along ``dim``
    (``index`` a concrete integer array, as torch requires)."""
    idx = np.asarray(concrete(index))
    m = np.zeros(shape, bool)
    sl = tuple(slice(None) if a == dim else slice(0, n) for a, n in enumerate(idx.shape))
    sub = m[sl]
    np.put_along_axis(sub, idx, True, dim)
    return m


@_op("aten.scatter.value")
def _scatter_value(ctx, x, dim, index, value):
    """``x`` with ``value`` written at ``index`` along ``dim`` (exact: a selection)."""
    d = dim_of(dim, len(shape_of(x)))
    m = _index_mask(tuple(shape_of(x)), index, d)
    return fnp.where(m, cast(value, dtype_of(x)), x)


@_op("aten.addcmul", "aten.addcdiv")
def _addc(ctx, x, t1, t2, *, value=1):
    """``x + value·(t1·t2)`` (addcmul) or ``x + value·(t1/t2)`` (addcdiv), each step rounded
    to the op's compute format, in that order (torch's CPU kernel)."""
    comp = opmath(ctx.dtype)
    x, t1, t2 = cast(x, comp), cast(t1, comp), cast(t2, comp)
    p = fnp.multiply(t1, t2) if "addcmul" in ctx.op else fnp.divide(t1, t2)
    if value != 1:
        p = fnp.multiply(cast(value, comp), p)
    return cast(fnp.add(x, p), ctx.dtype)


@_op("aten.lerp.Scalar", "aten.lerp.Tensor")
def _lerp(ctx, a, b, w):
    """``a + w·(b - a)`` where ``|w| < 0.5``, else ``b - (b - a)·(1 - w)`` (torch's formula)."""
    comp = opmath(ctx.dtype)
    a, b, w = cast(a, comp), cast(b, comp), cast(w, comp)
    d = fnp.subtract(b, a)
    small = fnp.less(fnp.abs(w), cast(0.5, comp))
    lo = fnp.add(a, fnp.multiply(w, d))
    hi = fnp.subtract(b, fnp.multiply(d, fnp.subtract(cast(1, comp), w)))
    return cast(fnp.where(small, lo, hi), ctx.dtype)


@_op("aten.copy.default")
def _copy(ctx, x, src, non_blocking=False):
    """``src`` converted to ``x``'s dtype (one rounding) and broadcast to its shape."""
    return fnp.broadcast_to(cast(src, dtype_of(x)), tuple(shape_of(x)))


@_op("aten.convolution_backward")
def _convolution_backward(ctx, gy, x, w, bias_sizes, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask):
    """(grad_input, grad_weight, grad_bias) of a (non-transposed) convolution, each a sum of
    products written as fpx convolutions (their sums in the conv composite's order):

    * grad_input = conv_transpose(gy, w) with the output padding that gives x's size;
    * grad_weight[o, c, t] = Σ_{n, i} gy[n, o, i]·x_pad[n, c, i·s + t·d]: a convolution of
      x with the batch as channels and gy as the weight, stride and dilation swapped;
    * grad_bias = Σ_{n, i} gy[n, o, i] (the reduced axes in C order)."""
    if transposed:
        from fpx.interop.torch.table import UnmappedOpError
        raise UnmappedOpError(ctx.op, " (the backward of a transposed convolution)")
    import fpx.nn as fnn
    gy, x, w = (cast(v, ctx.dtype) if ctx.dtype is not None else v for v in (gy, x, w))
    nd = len(shape_of(w)) - 2
    g = int(groups)
    s, p, d = (tuple(int(v) for v in t) for t in (stride, padding, dilation))
    xs, ws, ys = tuple(shape_of(x)), tuple(shape_of(w)), tuple(shape_of(gy))
    gx = gw = gb = None
    if output_mask[0]:
        op = tuple(xs[2 + j] - ((ys[2 + j] - 1) * s[j] - 2 * p[j] + d[j] * (ws[2 + j] - 1) + 1)
                   for j in range(nd))
        gx = fnn.conv_transpose(gy, w, None, s, p, op, g, d)
    if output_mask[1]:
        cg, og = xs[1] // g, ws[0] // g
        xt = fnp.transpose(x, (1, 0) + tuple(range(2, nd + 2)))          # (C, N, *S)
        yt = fnp.transpose(gy, (1, 0) + tuple(range(2, nd + 2)))         # (O, N, *out)
        crop = (slice(None), slice(None)) + tuple(slice(0, k) for k in ws[2:])
        parts = []
        for i in range(g):
            r = fnn.conv(xt[i * cg:(i + 1) * cg], yt[i * og:(i + 1) * og], None, stride=d,
                         padding=p, dilation=s)                          # (C/g, O/g, K'...)
            parts.append(fnp.transpose(r[crop], (1, 0) + tuple(range(2, nd + 2))))
        gw = parts[0] if g == 1 else fnp.concatenate(parts, axis=0)
    if output_mask[2]:
        gb = fnp.sum(gy, (0,) + tuple(range(2, nd + 2)))
    return gx, gw, gb


@_op("aten.scatter_add")
def _scatter_add(ctx, x, dim, index, src):
    """``x`` plus, at each position, the elements of ``src`` that ``index`` sends there, added
    one at a time in C order of ``src`` (``out = out + src[i]``, each step rounded): round r
    adds every position's r-th element (gathers: exact); positions without one keep their
    value (and the sign of a zero)."""
    xs = tuple(shape_of(x))
    d = dim_of(dim, len(xs))
    idx = np.asarray(concrete(index)).astype(np.int64)
    pos = list(np.indices(idx.shape))
    pos[d] = np.where(idx < 0, idx + xs[d], idx)
    target = np.ravel_multi_index(tuple(pos), xs).reshape(-1)             # C order of src
    srcpos = np.ravel_multi_index(tuple(np.indices(idx.shape)),
                                  tuple(shape_of(src))).reshape(-1)
    order = np.argsort(target, kind="stable")
    t_sorted = target[order]
    first = np.searchsorted(t_sorted, t_sorted, side="left")
    rank = np.empty_like(target)
    rank[order] = np.arange(target.size) - first
    n = int(np.prod(xs, dtype=np.int64))
    out = fnp.reshape(cast(x, ctx.dtype), (n,))
    sflat = fnp.concatenate([fnp.reshape(cast(src, ctx.dtype), (-1,)),
                             fnp.zeros((1,), ctx.dtype, like=x)])
    sentinel = int(np.prod(shape_of(src), dtype=np.int64))
    for r in range(int(rank.max()) + 1 if rank.size else 0):
        sel = rank == r
        gather = np.full(n, sentinel, np.int64)
        gather[target[sel]] = srcpos[sel]
        hit = np.zeros(n, bool)
        hit[target[sel]] = True
        out = fnp.where(hit, fnp.add(out, fnp.take(sflat, gather)), out)
    return fnp.reshape(out, xs)
