"""The composites of ``fpx.nn`` that resize a feature map: pooling, transposed convolution,
adaptive average pooling and nearest-neighbour upsampling (re-exported by :mod:`fpx.nn`).

==================================  ================================================================
``max_pool`` / ``avg_pool``         the windows of a strided convolution, reduced: max, or sum /
                                    each window's divisor (``ceil_mode`` as torch's kernels)
``conv_transpose``                  the adjoint of ``conv``: a stride-1 ``conv`` of the zero-
                                    interleaved, padded input with the flipped kernel
``adaptive_avg_pool``               window i of n inputs -> m outputs: [floor(i·n/m),
                                    ceil((i+1)·n/m)), summed, then divided by each window length
``upsample_nearest``                a gather at torch's nearest source indices (exact)
==================================  ================================================================

Semantics follow PyTorch (``F.max_pool1d/2d/3d``, ``F.avg_pool1d/2d/3d``,
``F.conv_transpose1d/2d/3d``, ``F.adaptive_avg_pool1d/2d/3d``,
``F.interpolate(mode="nearest" / "nearest-exact")``), layout (N, C, *spatial) or unbatched
(C, *spatial); the result keeps the input's dtype.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from fpx import numpy as fnp
from fpx.core import Composite
from fpx.nn import _c, _dtype, _is_float, _pad_spatial, _shape, _tuple, _windows, conv

__all__ = ["max_pool", "max_pool1d", "max_pool2d", "avg_pool", "avg_pool1d", "avg_pool2d",
           "conv_transpose", "adaptive_avg_pool", "upsample_nearest"]


# --------------------------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------------------------
def _ceil_extra(n, k, s, p, d=1):
    """torch's ``ceil_mode`` on a dim of size n: the output size is ceil((n + 2p - d(k-1) -
    1)/s) + 1, less one where the last window would start in the right padding. Returned as
    the padding to add after the right padding p, so that floor-mode windows give it."""
    out = -(-(n + 2 * p - d * (k - 1) - 1) // s) + 1
    if (out - 1) * s >= n + p:
        out -= 1
    return max((out - 1) * s + d * (k - 1) + 1 - (n + 2 * p), 0)


def _pool_pads(x, kernel_size, stride, padding, dilation, ceil_mode):
    sp = _shape(x)[2:]
    return tuple((p, p + (_ceil_extra(n, k, s, p, d) if ceil_mode else 0))
                 for n, k, s, p, d in zip(sp, kernel_size, stride, padding, dilation))


def _max_pool_decomp(x, *, kernel_size, stride, padding, dilation, ceil_mode=False):
    """Pad with -inf, stack the windows on a new axis, reduce_max over it (NaN propagates)."""
    dt = _dtype(x)
    low = -np.inf if _is_float(dt) else (np.iinfo(dt).min if dt.kind in "iu" else False)
    x = _pad_spatial(x, _pool_pads(x, kernel_size, stride, padding, dilation, ceil_mode), low)
    views, _ = _windows(x, kernel_size, stride, dilation)
    if len(views) == 1:
        return views[0]
    return fnp.max(fnp.stack(views, axis=2), axis=2)


_max_pool = Composite("max_pool", _max_pool_decomp, kind="reduction")


def _avg_pool_divisors(sp, kernel_size, stride, padding, out, count_include_pad):
    """Each window's divisor as torch's kernel takes it (a constant from shapes only): per
    dim, the window clipped to the padded input (``count_include_pad``; only ceil_mode's last
    windows are clipped) or to the input itself; multiplied over the dims."""
    lens = []
    for n, k, s, p, m in zip(sp, kernel_size, stride, padding, out):
        start = np.arange(m) * s - p
        end = np.minimum(start + k, n + p)
        lens.append(end - start if count_include_pad
                    else np.minimum(end, n) - np.maximum(start, 0))
    return functools.reduce(np.multiply.outer, lens)


def _avg_pool_decomp(x, *, kernel_size, stride, padding, count_include_pad, ceil_mode=False,
                     divisor_override=None):
    """Pad with 0 (and on the right up to ceil_mode's last window), stack the windows, sum
    over them, divide by each window's divisor (:func:`_avg_pool_divisors`) or by
    ``divisor_override`` for every window."""
    nd, sp = len(kernel_size), _shape(x)[2:]
    x = _pad_spatial(x, _pool_pads(x, kernel_size, stride, padding, (1,) * nd, ceil_mode), 0)
    views, out = _windows(x, kernel_size, stride, (1,) * nd)
    s = fnp.sum(fnp.stack(views, axis=2), axis=2) if len(views) > 1 else views[0]
    if divisor_override is not None:
        return fnp.divide(s, _c(divisor_override, s))
    cnt = _avg_pool_divisors(sp, kernel_size, stride, padding, out, count_include_pad)
    if np.all(cnt == math.prod(kernel_size)):
        return fnp.divide(s, _c(math.prod(kernel_size), s))
    dt = _dtype(s)
    return fnp.divide(s, np.asarray(cnt, dtype=dt) if _is_float(dt) else cnt)


_avg_pool = Composite("avg_pool", _avg_pool_decomp, kind="reduction")


def _pool_args(name, x, kernel_size, stride, padding, dilation, nd=None):
    xs = _shape(x)
    if nd is None:
        nd = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else len(xs) - 2
    if nd < 1 or len(xs) not in (nd + 1, nd + 2):
        raise ValueError(f"fpx.nn.{name}: a {nd}-d pool needs an input (N, C, ...) of ndim "
                         f"{nd + 2} (or unbatched, {nd + 1}), got shape {xs}")
    k = _tuple(kernel_size, nd, "kernel_size")
    s = k if stride is None or (isinstance(stride, (tuple, list)) and not stride) \
        else _tuple(stride, nd, "stride")
    p = _tuple(padding, nd, "padding")
    d = _tuple(dilation, nd, "dilation")
    if any(v < 1 for v in k + s + d) or any(v < 0 for v in p):
        raise ValueError(f"fpx.nn.{name}: kernel_size {k}, stride {s} and dilation {d} must be "
                         f"positive and padding {p} non-negative")
    sp = xs[-nd:]
    for n, kk, pp, dd in zip(sp, k, p, d):
        if pp > kk // 2:
            raise ValueError(f"fpx.nn.{name}: padding {p} should be at most half of the "
                             f"kernel size {k}")
        if n + 2 * pp < dd * (kk - 1) + 1:
            raise ValueError(f"fpx.nn.{name}: kernel size {k} is larger than the padded input "
                             f"{tuple(m + 2 * q for m, q in zip(sp, p))}")
    unbatched = len(xs) == nd + 1
    if unbatched:
        x = fnp.expand_dims(x, 0)
    return x, k, s, p, d, unbatched


def max_pool(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Max pooling (PyTorch ``max_pool1d/2d/3d``): the maximum of each (dilated) window, the
    input padded with -inf. 1-d or 2-d from len(kernel_size), or, for an int kernel_size, from
    x.ndim - 2. ``stride`` defaults to ``kernel_size``. ``ceil_mode``: torch's output size
    (one more window where the last would start inside the input or the left padding), the
    last windows clipped at the right padding's end."""
    x, k, s, p, d, unb = _pool_args("max_pool", x, kernel_size, stride, padding, dilation)
    y = _max_pool.bind(x, kernel_size=k, stride=s, padding=p, dilation=d,
                       ceil_mode=bool(ceil_mode))
    return fnp.reshape(y, _shape(y)[1:]) if unb else y


def avg_pool(x, kernel_size, stride=None, padding=0, count_include_pad=True, ceil_mode=False,
             divisor_override=None):
    """Average pooling (PyTorch ``avg_pool1d/2d/3d``): sum of each window (zero padding) /
    prod(kernel_size), or / the count of non-padding elements when
    ``count_include_pad=False``. ``ceil_mode``: the windows of :func:`max_pool`'s, and the
    last ones divided by their size clipped at the right padding's end, as torch's kernel.
    ``divisor_override``: a nonzero integer every window's sum is divided by instead."""
    x, k, s, p, _, unb = _pool_args("avg_pool", x, kernel_size, stride, padding, 1)
    if divisor_override is not None:
        if isinstance(divisor_override, bool) or int(divisor_override) != divisor_override \
                or divisor_override == 0:
            raise ValueError(f"fpx.nn.avg_pool: divisor_override must be a nonzero integer, "
                             f"got {divisor_override!r}")
        divisor_override = int(divisor_override)
    y = _avg_pool.bind(x, kernel_size=k, stride=s, padding=p,
                       count_include_pad=bool(count_include_pad), ceil_mode=bool(ceil_mode),
                       divisor_override=divisor_override)
    return fnp.reshape(y, _shape(y)[1:]) if unb else y


def _fixed_nd(nd, kernel_size):
    return (tuple(kernel_size) if isinstance(kernel_size, (tuple, list))
            else (int(kernel_size),) * nd)


def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1):
    """1-d :func:`max_pool` on (N, C, L) or (C, L)."""
    return max_pool(x, _tuple(_fixed_nd(1, kernel_size), 1, "kernel_size"), stride, padding,
                    dilation)


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1):
    """2-d :func:`max_pool` on (N, C, H, W) or (C, H, W)."""
    return max_pool(x, _tuple(_fixed_nd(2, kernel_size), 2, "kernel_size"), stride, padding,
                    dilation)


def avg_pool1d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    """1-d :func:`avg_pool` on (N, C, L) or (C, L)."""
    return avg_pool(x, _tuple(_fixed_nd(1, kernel_size), 1, "kernel_size"), stride, padding,
                    count_include_pad)


def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    """2-d :func:`avg_pool` on (N, C, H, W) or (C, H, W)."""
    return avg_pool(x, _tuple(_fixed_nd(2, kernel_size), 2, "kernel_size"), stride, padding,
                    count_include_pad)


# --------------------------------------------------------------------------------------------
# transposed convolution, adaptive pooling, upsampling
# --------------------------------------------------------------------------------------------


def _batched(x, nd, name):
    """x as (N, C, *spatial) for an ``nd``-d op, and whether it was unbatched."""
    xs = _shape(x)
    if len(xs) not in (nd + 1, nd + 2):
        raise ValueError(f"fpx.nn.{name}: a {nd}-d op needs an input (N, C, ...) of ndim "
                         f"{nd + 2} (or unbatched, {nd + 1}), got shape {xs}")
    return (fnp.expand_dims(x, 0), True) if len(xs) == nd + 1 else (x, False)


def _unbatch(y, unbatched):
    return fnp.reshape(y, _shape(y)[1:]) if unbatched else y


# --------------------------------------------------------------------------------------------
# transposed convolution
# --------------------------------------------------------------------------------------------
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


def _conv_transpose_decomp(x, w, b, *, stride, padding, output_padding, dilation, groups,
                           bias_in_sum=False):
    """The input with ``stride - 1`` zeros between neighbours, padded by ``dilation·(k - 1) -
    padding`` on each side (cropped where negative) and ``output_padding`` more at the end,
    convolved at stride 1 with the kernel flipped in space and its in/out channels swapped
    per group (w: (C_in, C_out/groups, *k) -> (C_out, C_in/groups, *k)). The same real sums
    as a direct kernel, plus products with exact zeros: a round-off bound counts K =
    C_in/groups·Πk terms per output, more than the nonzero ones (sound, slightly wide); the
    work is stride^nd times the direct kernel's."""
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
    if any(a or z for a, z in widths[2:]):
        x = fnp.pad(x, widths)
    if any(c.start or c.stop != _shape(x)[2 + i] for i, c in enumerate(crop[2:])):
        x = x[tuple(crop)]
    cin, cog = _shape(w)[:2]
    wt = fnp.reshape(w, (groups, cin // groups, cog) + tuple(k))
    wt = fnp.transpose(wt, (0, 2, 1) + tuple(range(3, 3 + nd)))
    wt = fnp.reshape(wt, (groups * cog, cin // groups) + tuple(k))
    wt = fnp.flip(wt, tuple(range(2, 2 + nd)))
    return conv(x, wt, b, stride=1, padding=0, dilation=dilation, groups=groups,
                bias_in_sum=bias_in_sum)


_conv_transpose = Composite("conv_transpose", _conv_transpose_decomp, kind="matmul")


def conv_transpose(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1,
                   *, bias_in_sum=False):
    """N-d transposed convolution, PyTorch's ``F.conv_transpose1d/2d/3d`` (same argument
    order): x (N, C_in, *S) or unbatched (C_in, *S), w (C_in, C_out/groups, *k), b (C_out,).
    Output length per dim: ``(n - 1)·stride - 2·padding + dilation·(k - 1) + output_padding +
    1``. ``bias_in_sum``: the bias is one more term of the underlying convolution's sum (as
    torch's CPU kernels start the accumulator at it; see :func:`fpx.nn.conv`)."""
    ws = _shape(w)
    nd = len(ws) - 2
    if nd < 1:
        raise ValueError(f"fpx.nn.conv_transpose: weight must be (C_in, C_out/groups, k...), "
                         f"got shape {ws}")
    x, unbatched = _batched(x, nd, "conv_transpose")
    xs, groups = _shape(x), int(groups)
    if groups < 1 or ws[0] % groups or xs[1] != ws[0]:
        raise ValueError(f"fpx.nn.conv_transpose: weight of shape {ws} with groups={groups} "
                         f"needs an input with {ws[0]} channels (a multiple of groups), got "
                         f"shape {xs}")
    stride, padding, output_padding, dilation = (
        _tuple(v, nd, name) for v, name in ((stride, "stride"), (padding, "padding"),
                                            (output_padding, "output_padding"),
                                            (dilation, "dilation")))
    if min(stride + dilation) < 1 or min(padding + output_padding) < 0 or any(
            op >= max(s, d) for op, s, d in zip(output_padding, stride, dilation)):
        raise ValueError(f"fpx.nn.conv_transpose: stride {stride} and dilation {dilation} must "
                         f"be positive, padding {padding} non-negative and output_padding "
                         f"{output_padding} smaller than stride or dilation")
    out = tuple((n - 1) * s - 2 * p + d * (k - 1) + op + 1 for n, s, p, d, k, op in
                zip(xs[2:], stride, padding, dilation, ws[2:], output_padding))
    if min(out) < 1:
        raise ValueError(f"fpx.nn.conv_transpose: the output would have size {out}")
    if b is not None and _shape(b) != (ws[1] * groups,):
        raise ValueError(f"fpx.nn.conv_transpose: bias must have shape ({ws[1] * groups},), "
                         f"got {_shape(b)}")
    params = dict(stride=stride, padding=padding, output_padding=output_padding,
                  dilation=dilation, groups=groups)
    if bias_in_sum and b is not None:
        params["bias_in_sum"] = True
    return _unbatch(_conv_transpose.bind(x, w, b, **params), unbatched)


# --------------------------------------------------------------------------------------------
# adaptive average pooling
# --------------------------------------------------------------------------------------------
def _window_sums(y, ax, m):
    """Sums over the m adaptive windows along ``ax``, and their lengths (a scalar where the
    windows are equal)."""
    n = _shape(y)[ax]
    if n % m == 0:              # equal windows: reshape and sum
        shp = _shape(y)[:ax] + (m, n // m) + _shape(y)[ax + 1:]
        return fnp.sum(fnp.reshape(y, shp), ax + 1), n // m
    bounds = [((i * n) // m, -((-(i + 1) * n) // m)) for i in range(m)]
    parts = [fnp.sum(y[(slice(None),) * ax + (slice(lo, hi),)], ax, keepdims=True)
             for lo, hi in bounds]
    return fnp.concatenate(parts, ax), np.array([hi - lo for lo, hi in bounds])


def _adaptive_avg_pool_decomp(x, *, output_size):
    """Sum each window over all its axes, then divide by the window's length along each axis
    in turn (PyTorch's CPU kernel: ``sum / kh / kw``)."""
    nd = len(output_size)
    lead = len(_shape(x)) - nd
    y, counts = x, []
    for j, m in enumerate(output_size):
        y, cnt = _window_sums(y, lead + j, m)
        counts.append(cnt)
    for j, cnt in enumerate(counts):
        if np.ndim(cnt):
            shp = (-1,) + (1,) * (nd - 1 - j)
            y = fnp.divide(y, np.reshape(cnt, shp).astype(np.dtype(y.dtype)))
        elif cnt != 1:
            y = fnp.divide(y, _c(cnt, y))
    return y


_adaptive_avg_pool = Composite("adaptive_avg_pool", _adaptive_avg_pool_decomp, kind="reduction")


def adaptive_avg_pool(x, output_size):
    """Adaptive average pooling (``F.adaptive_avg_pool1d/2d/3d``): ``output_size`` (an int or
    a tuple; ``None`` keeps that dim) over the trailing spatial dims of x (N, C, *S) or
    (C, *S); output i of n inputs -> m outputs averages inputs [floor(i·n/m),
    ceil((i+1)·n/m))."""
    xs = _shape(x)
    nd = len(output_size) if isinstance(output_size, (tuple, list)) else len(xs) - 2
    if nd < 1 or len(xs) not in (nd + 1, nd + 2):
        raise ValueError(f"fpx.nn.adaptive_avg_pool: output size {output_size!r} does not fit "
                         f"an input of shape {xs} (N, C, ...) or (C, ...)")
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * nd
    out = tuple(n if m is None else int(m) for n, m in zip(xs[-nd:], sizes))
    if min(out) < 1:
        raise ValueError(f"fpx.nn.adaptive_avg_pool: output size {out} must be positive")
    return _adaptive_avg_pool.bind(x, output_size=out)


# --------------------------------------------------------------------------------------------
# nearest-neighbour upsampling
# --------------------------------------------------------------------------------------------
def _nearest_source(n_in, n_out, factor, exact):
    """PyTorch's source index of each output (``nearest_idx``, ``UpSample.h``): i where the
    size is unchanged, i >> 1 where it doubles (mode "nearest"), else ``min(floor(i·scale),
    n - 1)`` in float32 ("nearest-exact": ``floor((i + 0.5)·scale)``, the product in
    double), scale = 1/factor where a factor is given, else n_in/n_out. None: the identity."""
    dst = np.arange(n_out)
    if n_out == n_in and not exact:
        return None
    if n_out == 2 * n_in and not exact:
        return dst >> 1
    scale = (np.float32(1.0 / factor) if factor is not None and factor > 0
             else np.float32(n_in) / np.float32(n_out))
    if exact:
        pos = ((dst + 0.5) * np.float64(scale)).astype(np.float32)
    else:
        pos = dst.astype(np.float32) * scale
    return np.minimum(np.floor(pos).astype(np.int64), n_in - 1)


def _upsample_nearest_decomp(x, *, size, scale_factor, exact):
    """A gather along each spatial dim at the nearest source indices (exact movement)."""
    lead = len(_shape(x)) - len(size)
    for i, (n_out, f) in enumerate(zip(size, scale_factor)):
        src = _nearest_source(_shape(x)[lead + i], n_out, f, exact)
        if src is not None:
            x = fnp.take(x, src, axis=lead + i)
    return x


_upsample_nearest = Composite("upsample_nearest", _upsample_nearest_decomp, kind="movement")


def upsample_nearest(x, size=None, scale_factor=None, *, exact=False):
    """Nearest-neighbour resizing of the trailing spatial dims of x (N, C, *S) or (C, *S):
    ``F.interpolate(x, size, scale_factor, mode="nearest")`` (``exact=True``:
    ``"nearest-exact"``), bit for bit PyTorch's choice of source element. Give ``size`` (an
    int or a tuple) or ``scale_factor`` (a number or a tuple; the size is then
    ``floor(n·factor)``); with both, the factors only steer the index arithmetic, as in
    PyTorch's kernels."""
    xs = _shape(x)
    seq = size if isinstance(size, (tuple, list)) else scale_factor
    nd = len(seq) if isinstance(seq, (tuple, list)) else len(xs) - 2
    if nd < 1 or len(xs) not in (nd + 1, nd + 2):
        raise ValueError(f"fpx.nn.upsample_nearest: size {size!r} / scale_factor "
                         f"{scale_factor!r} do not fit an input of shape {xs}")
    if scale_factor is None:
        factors = (None,) * nd
    else:
        factors = tuple(float(f) for f in (scale_factor if isinstance(scale_factor, (tuple, list))
                                           else (scale_factor,) * nd))
    if size is None:
        if scale_factor is None:
            raise ValueError("fpx.nn.upsample_nearest: give size or scale_factor")
        size = tuple(int(math.floor(n * f)) for n, f in zip(xs[-nd:], factors))
    size = _tuple(size, nd, "size")
    if len(factors) != nd or min(size) < 1:
        raise ValueError(f"fpx.nn.upsample_nearest: size {size} and scale_factor {factors} "
                         f"must give {nd} positive sizes")
    return _upsample_nearest.bind(x, size=size, scale_factor=factors, exact=bool(exact))
