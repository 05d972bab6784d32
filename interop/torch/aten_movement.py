"""ATen handlers of exact movement (views, slicing, concatenation, gathers, padding), of
constants (``full``, ``zeros``, ``arange``, ...) and of the ops fpx refuses (dynamic
shapes)."""
from __future__ import annotations

import numpy as np

import fpx.numpy as fnp
from fpx.interop.torch.table import (Lazy, UnmappedOpError, cast, const, dim_of, dims_of,
                                     dtype_of, ints, is_arr, shape_of)
from fpx.interop.torch.table import register_aten as _op

# -- movement ------------------------------------------------------------------------------------
@_op("aten.view", "aten._unsafe_view", "aten.reshape", "aten.view_copy")
def _view(ctx, x, size):
    return fnp.reshape(x, tuple(ctx.shape))


@_op("aten.permute", "aten.permute_copy")
def _permute(ctx, x, dims):
    return fnp.transpose(x, tuple(dim_of(d, len(shape_of(x))) for d in dims))


@_op("aten.t")
def _t(ctx, x):
    return fnp.transpose(x) if len(shape_of(x)) == 2 else x


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
    return (x, Lazy(None, "dropout mask"))


@_op("aten._to_copy", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
     "aten._assert_tensor_metadata", "aten.type_as")
def _to_copy(ctx, x, *args, **kw):
    if ctx.op.startswith("aten._assert_tensor_metadata"):
        return None
    return cast(x, ctx.dtype)


def _positions(shape, strides, offset):
    """The storage position of every element of a tensor of this layout (an int64 array of
    its shape)."""
    pos = np.full(tuple(shape), offset, dtype=np.int64)
    for d, (n, st) in enumerate(zip(shape, strides)):
        pos = pos + (np.arange(n, dtype=np.int64) * st).reshape((n,) + (1,) * (len(shape) - d - 1))
    return pos


@_op("aten.as_strided", "aten.as_strided_copy")
def _as_strided(ctx, x, size, stride, storage_offset=None):
    """The view of ``x``'s storage with ``size``/``stride``: each output element is the input
    element stored where it reads (elements that share storage -- an expanded input -- are
    equal, so any of them will do). A read of storage that holds none of the input's elements
    (another part of the tensor ``x`` is a view of) raises."""
    layout = ctx.layouts[0] if ctx.layouts else None
    if layout is None:
        raise UnmappedOpError(ctx.op, " (the input's memory layout is unknown here)")
    shape, strides, offset = layout
    held = _positions(shape, strides, offset).ravel()
    wanted = _positions(size, stride, offset if storage_offset is None else storage_offset)
    order = np.argsort(held, kind="stable")
    k = np.searchsorted(held[order], wanted)
    k_in = np.minimum(k, held.size - 1)
    if held.size == 0 or not np.array_equal(held[order][k_in], wanted):
        raise UnmappedOpError(ctx.op, f" for a view that reads storage outside its input "
                                      f"(input {shape} strides {strides} offset {offset}; "
                                      f"view {tuple(size)} strides {tuple(stride)})")
    flat = order[k_in]
    if np.array_equal(flat.ravel(), np.arange(flat.size)):
        return fnp.reshape(x, tuple(int(s) for s in size))        # a reshape: no gather
    return fnp.reshape(x, (-1,))[flat]


@_op("aten.select.int")
def _select(ctx, x, dim, index):
    d = dim_of(dim, len(shape_of(x)))
    return x[(slice(None),) * d + (int(index),)]


@_op("aten.slice.Tensor", "aten.slice_copy.Tensor", "aten.narrow")
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    d = dim_of(dim, len(shape_of(x)))
    if ctx.op.startswith("aten.narrow"):
        start, end, step = start, start + end, 1   # narrow(x, dim, start, length)
    return x[(slice(None),) * d + (slice(start, end, step),)]


@_op("aten.split_with_sizes", "aten.split.Tensor", "aten.split_with_sizes_copy",
     "aten.unbind.int", "aten.chunk")
def _split(ctx, x, sizes=None, dim=0):
    d = dim_of(dim, len(shape_of(x)))
    if ctx.op.startswith("aten.unbind"):
        d = dim_of(sizes if sizes is not None else 0, len(shape_of(x)))
        return tuple(x[(slice(None),) * d + (i,)] for i in range(shape_of(x)[d]))
    n = shape_of(x)[d]
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
    xs = [cast(x, ctx.dtype) for x in xs if not (is_arr(x) and shape_of(x) == (0,))]
    return fnp.concatenate(xs, dim_of(dim, len(ctx.shape)))


@_op("aten.stack")
def _stack(ctx, xs, dim=0):
    return fnp.stack([cast(x, ctx.dtype) for x in xs], dim_of(dim, len(ctx.shape)))


@_op("aten.flip")
def _flip(ctx, x, dims):
    return fnp.flip(x, dims_of(dims, len(shape_of(x))))


@_op("aten.roll")
def _roll(ctx, x, shifts, dims=()):
    shifts, dims = ints(shifts), ints(dims) if dims else []
    if not dims:
        flat = fnp.reshape(x, (-1,))
        n = shape_of(flat)[0]
        return fnp.reshape(fnp.take(flat, (np.arange(n) - shifts[0]) % n), shape_of(x))
    for s, d in zip(shifts, dims):
        d = dim_of(d, len(shape_of(x)))
        n = shape_of(x)[d]
        x = fnp.take(x, (np.arange(n) - s) % n, axis=d)
    return x


@_op("aten.index.Tensor")
def _index(ctx, x, indices):
    idx = tuple(slice(None) if i is None else np.asarray(fnp._concrete_index(i, "index"))
                for i in indices)
    return x[idx]


@_op("aten.constant_pad_nd")
def _pad(ctx, x, pad, value=0):
    pad = ints(pad)
    nd = len(shape_of(x))
    widths = [(0, 0)] * nd
    for i in range(len(pad) // 2):
        widths[nd - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        raise UnmappedOpError(ctx.op, " with negative padding (cropping)")
    return fnp.pad(x, widths, constant_values=value)


@_op("aten.repeat")
def _repeat(ctx, x, repeats):
    return fnp.tile(x, tuple(ints(repeats)))


@_op("aten.tril", "aten.triu")
def _tri(ctx, x, diagonal=0):
    r, c = shape_of(x)[-2:]
    m = np.tri(r, c, diagonal, dtype=bool) if "tril" in ctx.op else \
        ~np.tri(r, c, diagonal - 1, dtype=bool)
    return fnp.where(m, x, cast(0, dtype_of(x)))


@_op("aten.gather")
def _gather(ctx, x, dim, index, *, sparse_grad=False):
    return fnp.take_along_axis(x, index, dim_of(dim, len(shape_of(x))))


@_op("aten.index_select")
def _index_select(ctx, x, dim, index):
    return fnp.take(x, index, axis=dim_of(dim, len(shape_of(x))))


# -- creation (constants) ---------------------------------------------------------------------
@_op("aten.full", "aten.new_full")
def _full(ctx, *args, **kw):
    fill = args[-1] if not ctx.op.startswith("aten.new_full") else args[2]
    return const(ctx, fill)


@_op("aten.full_like", "aten.fill.Scalar", "aten.new_ones", "aten.ones_like", "aten.zeros_like",
     "aten.new_zeros", "aten.zeros", "aten.ones", "aten.empty.memory_format", "aten.empty_like",
     "aten.new_empty", "aten.empty_strided", "aten.new_empty_strided")
def _fill(ctx, *args, **kw):
    op = ctx.op
    if op.startswith(("aten.full_like", "aten.fill")):
        return const(ctx, args[1])
    value = 1 if "ones" in op else 0           # empty: torch leaves it undefined; fpx zeros
    return const(ctx, value)


@_op("aten.scalar_tensor")
def _scalar_tensor(ctx, s, **kw):
    return const(ctx, s)


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
