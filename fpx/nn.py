"""``fpx.nn``: neural-network operations as fpx composites (like ``torch.nn.functional``).

Each operation is a :class:`~fpx.core.Composite` registered under its own name, so a transform
may give it a rule of its own (interval softmax with the monotone bound, ABFT on conv lowered to
matmul); where it does not, the decomposition below -- written only with :mod:`fpx.numpy` --
runs under that transform. Eagerly, the eval interpreter runs the same decomposition.

All functions keep the input dtype (float64, float32, float16, bfloat16): constants are scalars
of the input's dtype, and a matmul whose backend returns a wider type (NumPy computes bfloat16
matmul in float32) is rounded back to the operands' dtype, as a framework does.

==================================  ================================================================
``relu(x)``                         max(x, 0)
``sigmoid(x)``                      1 / (1 + exp(-x))
``rsqrt(x)``                        1 / sqrt(x)
``silu(x)``                         x * sigmoid(x)
``gelu(x, approximate)``            0.5 x (1 + erf(x/sqrt2)); or 0.5 x (1 + tanh(c (x + k x^3)))
``hardsigmoid(x)``                  min(max(x + 3, 0), 6) / 6
``hardswish(x)``                    x * min(max(x + 3, 0), 6) / 6
``softmax(x, axis)``                e / sum(e) with e = exp(x - max(x))
``log_softmax(x, axis)``            (x - max) - log(sum(exp(x - max)))
``layer_norm``                      (x - mean) / sqrt(var + eps) * weight + bias (biased variance)
``rms_norm``                        x / sqrt(mean(x^2) + eps) * weight
``group_norm`` / ``instance_norm``  layer_norm of each sample's channel groups, then per channel
``norm_stats``                      (mean, 1 / sqrt(var + eps)): a normalization's statistics
``conv`` (``conv1d/2d``)            cross-correlation: im2col by strided slicing + one matmul
``max_pool`` / ``avg_pool``         the same windows, reduced: max, or sum / count (and 1d/2d;
                                    these and the next three: :mod:`fpx.nn_spatial`)
``conv_transpose``                  the adjoint of conv
``adaptive_avg_pool``               windows [floor(i n/m), ceil((i+1) n/m)), sum / length per dim
``upsample_nearest``                a gather at PyTorch's nearest source indices
``digamma``                         ψ(x) (every x) as torch's CPU kernel (:mod:`fpx.nn_special`)
``scaled_dot_product_attention``    softmax(q k^T * scale + mask) v
``cross_entropy``                   -log_softmax(logits)[label] (or -sum(p * log_softmax))
``linear(x, w, b)``                 x @ w.T + b (PyTorch weight layout)
``embedding(ids, table)``           table[ids]
==================================  ================================================================

Semantics follow PyTorch (``torch.nn.functional``) unless stated: NCHW layout, conv weights
(O, C/groups, k...), pooling without ``ceil_mode``, attention rows that are entirely masked
give 0 (PyTorch's math backend, ``_safe_softmax``).
"""
from __future__ import annotations

import itertools
import math
import operator

import numpy as np

from fpx import numpy as fnp
from fpx.core import PRIMITIVES, Composite
from fpx.kernels import blas as _kblas
from fpx.kernels import conv as _kconv

__all__ = [
    "relu", "sigmoid", "rsqrt", "silu", "gelu", "hardsigmoid", "hardswish", "softmax",
    "log_softmax", "layer_norm", "rms_norm",
    "batch_norm", "group_norm", "instance_norm", "norm_stats",
    "conv", "conv_transpose", "conv1d", "conv2d", "max_pool", "max_pool1d", "max_pool2d", "avg_pool",
    "avg_pool1d", "avg_pool2d", "adaptive_avg_pool", "upsample_nearest",
    "scaled_dot_product_attention", "cross_entropy", "linear",
    "embedding", "digamma",
]

_GETITEM = PRIMITIVES["getitem"]


# --------------------------------------------------------------------------------------------
# helpers (shapes and constants only; no arithmetic on data)
# --------------------------------------------------------------------------------------------
def _shape(x):
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def _dtype(x):
    return np.dtype(x.dtype) if hasattr(x, "dtype") else np.result_type(x)


def _is_float(dt) -> bool:
    dt = np.dtype(dt)
    return dt.kind == "f" or dt.kind == "V"  # ml_dtypes' bfloat16 / float8 have kind 'V'


def _c(value, like):
    """``value`` as a scalar of ``like``'s dtype when that is a float type (so that NumPy's
    promotion does not widen float16/bfloat16), else as the Python number."""
    dt = _dtype(like)
    if _is_float(dt):
        return np.asarray(value, dtype=dt)[()]
    return value


def _result_float_dtype(*xs):
    return np.result_type(*[_dtype(x) for x in xs])


def _mm(a, b):
    """matmul in the operands' dtype (NumPy returns float32 for bfloat16 operands: the
    float32-accumulated product is rounded back, as frameworks do)."""
    r = fnp.matmul(a, b)
    want = _result_float_dtype(a, b)
    return r if _dtype(r) == want else fnp.astype(r, want)


def _axis(axis, ndim, name="axis"):
    try:
        a = operator.index(axis)
    except TypeError:
        raise TypeError(f"fpx.nn: {name} must be an integer, got {axis!r}") from None
    if not -ndim <= a < ndim:
        raise ValueError(f"fpx.nn: {name}={axis} is out of range for an array of ndim {ndim}")
    return a % ndim


def _tuple(v, n, name):
    """An int or a length-n sequence of ints as a tuple of n ints."""
    if isinstance(v, (int, np.integer)):
        return (int(v),) * n
    t = tuple(int(operator.index(i)) for i in v)
    if len(t) == 1 and n > 1:
        return t * n
    if len(t) != n:
        raise ValueError(f"fpx.nn: {name} must be an int or a sequence of {n} ints, got {v!r}")
    return t


def _getitem(x, index):
    return _GETITEM.bind(x, index=index)


# --------------------------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------------------------
def _relu_decomp(x):
    """relu(x) = maximum(x, 0) (NaN propagates)."""
    return fnp.maximum(x, _c(0, x))


_relu = Composite("relu", _relu_decomp, kind="elementwise")


def relu(x):
    """max(x, 0), elementwise; NaN stays NaN."""
    return _relu.bind(x)


def _sigmoid_decomp(x):
    """sigmoid(x) = 1 / (1 + exp(-x))."""
    return fnp.divide(_c(1, x), fnp.add(_c(1, x), fnp.exp(fnp.negative(x))))


_sigmoid = Composite("sigmoid", _sigmoid_decomp, kind="transcendental")


def sigmoid(x):
    """1 / (1 + exp(-x)), elementwise (0 at -inf, 1 at +inf)."""
    return _sigmoid.bind(x)


def _rsqrt_decomp(x):
    """rsqrt(x) = 1 / sqrt(x): two roundings, as torch's CPU kernel computes it."""
    return fnp.divide(_c(1, x), fnp.sqrt(x))


_rsqrt = Composite("rsqrt", _rsqrt_decomp, kind="elementwise")


def rsqrt(x):
    """1 / sqrt(x), elementwise (±inf at ±0, NaN below 0); a transform may round it once
    (``fpx.reproducible``: correctly rounded)."""
    return _rsqrt.bind(x)


def _silu_decomp(x):
    """silu(x) = x * sigmoid(x)."""
    return fnp.multiply(x, _sigmoid.bind(x))


_silu = Composite("silu", _silu_decomp, kind="transcendental")


def silu(x):
    """x * sigmoid(x) (swish); the IEEE value at -inf is -inf * 0 = NaN."""
    return _silu.bind(x)


_SQRT1_2 = 0.7071067811865476            # 1/sqrt(2)
_SQRT_2_OVER_PI = 0.7978845608028654     # sqrt(2/pi)
_GELU_KAPPA = 0.044715


def _gelu_decomp(x, *, approximate="none"):
    """erf form: x * (1 + erf(x * (1/sqrt 2))) * 0.5 -- the product before the exact halving,
    as torch's CPU kernel computes it (it overflows past half the largest float);
    tanh form: 0.5*x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x*x*x)))."""
    half, one = _c(0.5, x), _c(1, x)
    if approximate == "tanh":
        cube = fnp.multiply(fnp.multiply(x, x), x)
        inner = fnp.multiply(_c(_SQRT_2_OVER_PI, x),
                             fnp.add(x, fnp.multiply(_c(_GELU_KAPPA, x), cube)))
        return fnp.multiply(fnp.multiply(half, x), fnp.add(one, fnp.tanh(inner)))
    return fnp.multiply(fnp.multiply(x, fnp.add(one, fnp.erf(fnp.multiply(x, _c(_SQRT1_2, x))))),
                        half)


_gelu = Composite("gelu", _gelu_decomp, kind="transcendental")


def gelu(x, approximate="none"):
    """Gaussian error linear unit: ``approximate="none"`` 0.5·x·(1+erf(x/√2)),
    ``"tanh"`` 0.5·x·(1+tanh(√(2/π)(x+0.044715x³))) (PyTorch's two forms)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"fpx.nn.gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _gelu.bind(x, approximate=approximate)


def _relu6_of_x_plus_3(x):
    """min(max(x + 3, 0), 6): NaN propagates (torch's CPU kernels use max/min that do)."""
    return fnp.minimum(fnp.maximum(fnp.add(x, _c(3, x)), _c(0, x)), _c(6, x))


def _hardsigmoid_decomp(x):
    """hardsigmoid(x) = min(max(x + 3, 0), 6) / 6."""
    return fnp.divide(_relu6_of_x_plus_3(x), _c(6, x))


_hardsigmoid = Composite("hardsigmoid", _hardsigmoid_decomp, kind="elementwise")


def hardsigmoid(x):
    """min(max(x + 3, 0), 6) / 6, elementwise (NaN stays NaN), as torch's CPU kernel."""
    return _hardsigmoid.bind(x)


def _hardswish_decomp(x):
    """hardswish(x) = x * min(max(x + 3, 0), 6) / 6, the product first (torch's CPU kernel)."""
    return fnp.divide(fnp.multiply(x, _relu6_of_x_plus_3(x)), _c(6, x))


_hardswish = Composite("hardswish", _hardswish_decomp, kind="elementwise")


def hardswish(x):
    """x * min(max(x + 3, 0), 6) / 6, elementwise: 0 (-0) at x <= -3, about x at x >= 3,
    NaN at -inf (-inf * 0) and at NaN, as torch's CPU kernel."""
    return _hardswish.bind(x)


# --------------------------------------------------------------------------------------------
# softmax family
# --------------------------------------------------------------------------------------------
def _softmax_decomp(x, *, axis=-1, stored=None):
    """e / sum(e) with e = exp(x - max(x)) (a +inf entry makes the row NaN, an all -inf row
    is NaN, as in PyTorch); with ``stored`` (a dtype), the numerator e (not the sum's terms)
    rounded to that format and read back in x's."""
    m = fnp.max(x, axis, keepdims=True)
    e = fnp.exp(fnp.subtract(x, m))
    s = fnp.sum(e, axis, keepdims=True)
    if stored is not None:
        e = fnp.astype(fnp.astype(e, stored), _dtype(x))
    return fnp.divide(e, s)


def _softmax_native(B):
    """The NumPy backend's softmax: torch's CPU kernel while a torch program runs (the
    module's own arithmetic, ``fpx/kernels/blas.py: softmax``), else the decomposition."""
    if B.name != "numpy":
        return _softmax_decomp

    def softmax_numpy(x, *, axis=-1, stored=None):
        y = None if stored is not None else _kblas.softmax(x, axis)
        return _softmax_decomp(x, axis=axis, stored=stored) if y is None else y
    return softmax_numpy


_softmax = Composite("softmax", _softmax_decomp, _softmax_native, kind="reduction")


def _stored(stored, x):
    """``stored`` as a dtype, None where it is x's own (no extra rounding)."""
    if stored is None or np.dtype(stored) == _dtype(x):
        return None
    return np.dtype(stored)


def softmax(x, axis=-1, stored=None):
    """softmax along ``axis``: exp(x - max) / sum(exp(x - max)). ``stored``: a format the
    numerator exp(x - max) may be rounded to before the division (torch's float16/bfloat16 CPU
    kernel over a dim other than the last does so on its scalar path: a vector's tail); the
    bound covers the rounded and the unrounded numerator alike."""
    return _softmax.bind(x, axis=_axis(axis, len(_shape(x))), stored=_stored(stored, x))


def _log_softmax_decomp(x, *, axis=-1, stored=None):
    """(x - m) - log(sum(exp(x - m))) with m = max(x); with ``stored`` (a dtype), the sum and
    its log are each rounded to that format and read back in x's, as torch's CPU kernel does
    for float16/bfloat16 over the last axis."""
    s = fnp.subtract(x, fnp.max(x, axis, keepdims=True))
    t = fnp.sum(fnp.exp(s), axis, keepdims=True)
    if stored is None:
        return fnp.subtract(s, fnp.log(t))
    dt = _dtype(x)

    def rounded(v):
        return fnp.astype(fnp.astype(v, stored), dt)
    return fnp.subtract(s, rounded(fnp.log(rounded(t))))


_log_softmax = Composite("log_softmax", _log_softmax_decomp, kind="reduction")


def log_softmax(x, axis=-1, stored=None):
    """log(softmax(x)) along ``axis``, computed as (x - max) - log(sum(exp(x - max))).
    ``stored``: the format the sum of the exponentials and its log are rounded to before use
    (torch's float16/bfloat16 CPU kernel over the last axis keeps them in the input's format);
    None: x's own format, no extra rounding."""
    return _log_softmax.bind(x, axis=_axis(axis, len(_shape(x))), stored=_stored(stored, x))


# --------------------------------------------------------------------------------------------
# normalization
# --------------------------------------------------------------------------------------------
def _affine(y, weight, bias):
    if weight is not None:
        y = fnp.multiply(y, weight)
    if bias is not None:
        y = fnp.add(y, bias)
    return y


def _layer_norm_decomp(x, weight, bias, *, axes, eps):
    """mu = mean(x); d = x - mu; var = mean(d*d); y = d / sqrt(var + eps) * weight + bias."""
    mu = fnp.mean(x, axes, keepdims=True)
    d = fnp.subtract(x, mu)
    v = fnp.mean(fnp.multiply(d, d), axes, keepdims=True)
    y = fnp.divide(d, fnp.sqrt(fnp.add(v, _c(eps, x))))
    return _affine(y, weight, bias)


def _layer_norm_native(B):
    """The NumPy backend's layer norm: torch's CPU kernel while a torch program runs (the
    module's own arithmetic, ``fpx/kernels/blas.py: layer_norm``), else the decomposition."""
    if B.name != "numpy":
        return _layer_norm_decomp

    def layer_norm_numpy(x, weight, bias, *, axes, eps):
        y = _kblas.layer_norm(x, weight, bias, axes, eps)
        return _layer_norm_decomp(x, weight, bias, axes=axes, eps=eps) if y is None else y
    return layer_norm_numpy


_layer_norm = Composite("layer_norm", _layer_norm_decomp, _layer_norm_native, kind="reduction")


def layer_norm(x, normalized_shape=None, weight=None, bias=None, eps=1e-5, *, axis=None):
    """Layer normalization, (x - mean) / sqrt(var + eps) * weight + bias, with the biased
    variance over the normalized dims.

    ``normalized_shape`` (int or tuple) has PyTorch's meaning: the trailing dims of ``x``, which
    it must match. Alternatively give NumPy-style ``axis=`` (int or tuple). With neither, the
    last axis. ``weight`` and ``bias`` broadcast against ``x``.
    """
    shp = _shape(x)
    nd = len(shp)
    if normalized_shape is not None and axis is not None:
        raise ValueError("fpx.nn.layer_norm: give normalized_shape or axis, not both")
    if normalized_shape is not None:
        ns = (int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer)) \
            else tuple(int(s) for s in normalized_shape)
        if len(ns) == 0 or len(ns) > nd or tuple(shp[nd - len(ns):]) != ns:
            raise ValueError(f"fpx.nn.layer_norm: normalized_shape {ns} does not match the "
                             f"trailing dims of an input of shape {shp}")
        axes = tuple(range(nd - len(ns), nd))
    elif axis is not None:
        axes = tuple(sorted({_axis(a, nd) for a in (axis if isinstance(axis, (tuple, list))
                                                    else (axis,))}))
    else:
        axes = (_axis(-1, nd),)
    return _layer_norm.bind(x, weight, bias, axes=axes, eps=float(eps))


def _rms_norm_decomp(x, weight, *, axis, eps):
    """y = x / sqrt(mean(x*x) + eps) * weight."""
    ms = fnp.mean(fnp.multiply(x, x), axis, keepdims=True)
    y = fnp.divide(x, fnp.sqrt(fnp.add(ms, _c(eps, x))))
    return _affine(y, weight, None)


_rms_norm = Composite("rms_norm", _rms_norm_decomp, kind="reduction")


def rms_norm(x, weight=None, eps=1e-6, axis=-1):
    """Root-mean-square normalization along ``axis`` (int or tuple):
    x / sqrt(mean(x²) + eps) * weight."""
    nd = len(_shape(x))
    axes = tuple(sorted({_axis(a, nd) for a in (axis if isinstance(axis, (tuple, list))
                                                else (axis,))}))
    return _rms_norm.bind(x, weight, axis=axes, eps=float(eps))


def batch_norm_coefficients(mean, var, weight, bias, eps, dtype, ndim, axis):
    """(alpha, beta) of an inference batch norm, PyTorch's CPU kernel: in the statistics'
    dtype ``inv = 1 / sqrt(var + eps)``, ``alpha = inv · weight``, ``beta = bias − mean ·
    alpha`` (``−(mean · alpha)`` without a bias), then cast to ``dtype`` and shaped to
    broadcast along ``axis`` of an ``ndim``-d input."""
    inv = fnp.divide(_c(1, mean), fnp.sqrt(fnp.add(var, _c(eps, mean))))
    alpha = inv if weight is None else fnp.multiply(inv, weight)
    ma = fnp.multiply(mean, alpha)
    beta = fnp.negative(ma) if bias is None else fnp.subtract(bias, ma)
    shp = tuple(-1 if d == axis else 1 for d in range(ndim))
    return (fnp.reshape(fnp.astype(alpha, dtype), shp), fnp.reshape(fnp.astype(beta, dtype), shp))


def _batch_norm_decomp(x, mean, var, weight, bias, *, axis, eps):
    """y = x · alpha + beta with the per-channel (alpha, beta) of batch_norm_coefficients."""
    alpha, beta = batch_norm_coefficients(mean, var, weight, bias, eps, _dtype(x),
                                          len(_shape(x)), axis)
    return scale_shift(x, alpha, beta)


def scale_shift(x, alpha, beta):
    """x · alpha + beta, two roundings (a batch norm's last step)."""
    return fnp.add(fnp.multiply(x, alpha), beta)


_batch_norm = Composite("batch_norm", _batch_norm_decomp, kind="elementwise")


def batch_norm(x, mean, var, weight=None, bias=None, eps=1e-5, *, axis=1):
    """Batch normalization with given statistics (inference), ``(x − mean) / sqrt(var + eps)
    · weight + bias`` per channel ``axis``, in PyTorch's CPU arithmetic: per-channel
    ``alpha``, ``beta`` in the statistics' dtype (see batch_norm_coefficients), then
    ``x · alpha + beta`` in ``x``'s dtype (two roundings per element)."""
    nd = len(_shape(x))
    ax = _axis(axis, nd)
    c = _shape(x)[ax]
    for name, p in (("mean", mean), ("var", var), ("weight", weight), ("bias", bias)):
        if p is not None and _shape(p) != (c,):
            raise ValueError(f"fpx.nn.batch_norm: {name} must have shape ({c},) (the channels "
                             f"of axis {ax}), got {_shape(p)}")
    return _batch_norm.bind(x, mean, var, weight, bias, axis=ax, eps=float(eps))


def _group_norm_decomp(x, weight, bias, *, groups, eps):
    """Each sample's ``groups`` channel groups (with their spatial values) a row of
    ``layer_norm`` without affine, then ``· weight + bias`` per channel (dim 1)."""
    shp = _shape(x)
    rows = fnp.reshape(x, (shp[0] * groups, -1))
    y = fnp.reshape(_layer_norm.bind(rows, None, None, axes=(1,), eps=eps), shp)
    bc = (1, shp[1]) + (1,) * (len(shp) - 2)
    return _affine(y, None if weight is None else fnp.reshape(weight, bc),
                   None if bias is None else fnp.reshape(bias, bc))


_group_norm = Composite("group_norm", _group_norm_decomp, kind="reduction")


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """Group normalization (``F.group_norm``) of x (N, C, *spatial): each sample's C/G
    channels of a group, with their spatial values, normalized by their own mean and biased
    variance (a row of :func:`layer_norm`), then ``· weight + bias`` per channel."""
    shp = _shape(x)
    g = operator.index(num_groups)
    if len(shp) < 2 or g < 1 or shp[1] % g:
        raise ValueError(f"fpx.nn.group_norm: {num_groups} groups do not divide the channels "
                         f"(dim 1) of an input of shape {shp}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and _shape(p) != (shp[1],):
            raise ValueError(f"fpx.nn.group_norm: {name} must have shape ({shp[1]},), got "
                             f"{_shape(p)}")
    return _group_norm.bind(x, weight, bias, groups=g, eps=float(eps))


def instance_norm(x, weight=None, bias=None, eps=1e-5):
    """Instance normalization (``F.instance_norm`` without running statistics): each
    (sample, channel) of x (N, C, *spatial) normalized over its spatial values, then
    ``· weight + bias`` per channel -- :func:`group_norm` with one channel per group."""
    if len(_shape(x)) < 3:
        raise ValueError(f"fpx.nn.instance_norm: input must be (N, C, *spatial), got shape "
                         f"{_shape(x)}")
    return group_norm(x, _shape(x)[1], weight, bias, eps)


def norm_stats(x, axis=-1, eps=1e-5):
    """``(mean, rstd)`` of x over ``axis`` (int or tuple; dims kept): ``mean(x)`` and
    ``1 / sqrt(mean((x - mean)²) + eps)``, the statistics a layer or group norm divides by
    (what torch's ``native_layer_norm`` / ``native_group_norm`` also return)."""
    nd = len(_shape(x))
    axes = tuple(sorted({_axis(a, nd) for a in (axis if isinstance(axis, (tuple, list))
                                                else (axis,))}))
    mu = fnp.mean(x, axes, keepdims=True)
    d = fnp.subtract(x, mu)
    v = fnp.mean(fnp.multiply(d, d), axes, keepdims=True)
    return mu, fnp.divide(_c(1, x), fnp.sqrt(fnp.add(v, _c(eps, x))))


# --------------------------------------------------------------------------------------------
# sliding windows (convolution and pooling)
# --------------------------------------------------------------------------------------------
def _out_size(n, k, s, d):
    return (n - d * (k - 1) - 1) // s + 1


def _window_index(offs, stride, dilation, out, lead=2):
    """The strided slice that picks, for kernel offset ``offs``, the input element of every
    output position: ``x[..., o*d : o*d + s*(out-1) + 1 : s]`` per spatial dim."""
    return (slice(None),) * lead + tuple(
        slice(o * d, o * d + s * (m - 1) + 1, s)
        for o, d, s, m in zip(offs, dilation, stride, out))


def _windows(x, ksize, stride, dilation):
    """The prod(ksize) shifted strided views of the (already padded) x of shape (N, C, *S),
    kernel offsets in C order, each of shape (N, C, *out); and ``out``."""
    sp = _shape(x)[2:]
    out = tuple(_out_size(n, k, s, d) for n, k, s, d in zip(sp, ksize, stride, dilation))
    views = [_getitem(x, _window_index(offs, stride, dilation, out))
             for offs in itertools.product(*(range(k) for k in ksize))]
    return views, out


def _pad_spatial(x, pads, value):
    if all(lo == 0 and hi == 0 for lo, hi in pads):
        return x
    return fnp.pad(x, ((0, 0), (0, 0)) + tuple(pads), constant_values=value)


def _conv_decomp(x, w, b, *, stride, padding, dilation, groups, bias_in_sum=False):
    """im2col + one matmul. x (N, C, *S), w (O, C/g, *k), b (O,) or None:
    pad; move channels first; stack the prod(k) shifted strided windows into cols
    (C, K, N, *out) = (g, C/g*K, N*P); y = w.reshape(g, O/g, C/g*K) @ cols; back to (N, O, *out); add b.
    ``bias_in_sum``: b is one more term of the matmul's sum ([w | b] @ [cols; 1]), as
    libraries that initialise the accumulator with the bias compute it."""
    n, c = _shape(x)[:2]
    o, cg = _shape(w)[:2]
    ksize = _shape(w)[2:]
    g = groups
    og = o // g
    kk = math.prod(ksize)
    # channels first, so that the stacked windows are already in the matmul's layout: one
    # copy of the (small) input instead of a transposed copy of the (K times larger) cols.
    # The padding (always applied, zero widths too) makes that copy C-ordered, so the stacked
    # windows come out C-ordered and the reshape below is free.
    x = fnp.transpose(x, (1, 0) + tuple(range(2, len(_shape(x)))))      # (C, N, *S)
    x = fnp.pad(x, ((0, 0), (0, 0)) + tuple(padding), constant_values=0)
    views, out = _windows(x, ksize, stride, dilation)
    p = math.prod(out)
    cols = fnp.stack(views, axis=1) if len(views) > 1 else fnp.expand_dims(views[0], 1)
    cols = fnp.reshape(cols, (g, cg * kk, n * p))                 # (C, K, N, *out) in order
    fused = b is not None and bias_in_sum
    lead = (g,) if g > 1 else ()
    wm = fnp.reshape(w, lead + (og, cg * kk))
    cm = fnp.reshape(cols, lead + (cg * kk, n * p))
    if fused:
        wm = fnp.concatenate([wm, fnp.reshape(_as_dtype(b, w), lead + (og, 1))], axis=-1)
        cm = fnp.concatenate([cm, fnp.ones(lead + (1, n * p), _dtype(cols), like=cols)], axis=-2)
    y = _mm(wm, cm)
    y = fnp.reshape(y, (g, og, n) + out)
    y = fnp.transpose(y, (2, 0, 1) + tuple(range(3, 3 + len(out))))  # (N, g, O/g, *out)
    y = fnp.reshape(y, (n, o) + out)
    if b is not None and not bias_in_sum:
        y = fnp.add(y, fnp.reshape(b, (o,) + (1,) * len(out)))
    return y


def _as_dtype(v, like):
    return v if _dtype(v) == _dtype(like) else fnp.astype(v, _dtype(like))


def _conv_native(B):
    """The NumPy backend's convolution: float32 through oneDNN where torch is installed
    (``fpx.kernels.conv``: the same sums of products, faster than im2col), the im2col
    decomposition otherwise; other backends run the decomposition."""
    if B.name != "numpy":
        return _conv_decomp

    def conv_numpy(x, w, b=None, *, stride, padding, dilation, groups, bias_in_sum=False):
        y = _kconv.conv_f32(x, w, b if bias_in_sum else None, stride, padding, dilation, groups)
        if y is None:
            return _conv_decomp(x, w, b, stride=stride, padding=padding, dilation=dilation,
                                groups=groups, bias_in_sum=bias_in_sum)
        if b is not None and not bias_in_sum:
            y = fnp.add(y, fnp.reshape(b, (_shape(w)[0],) + (1,) * (len(_shape(w)) - 2)))
        return y
    return conv_numpy


_conv = Composite("conv", _conv_decomp, _conv_native, kind="matmul")


def _conv_padding(padding, nd, ksize, stride, dilation):
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * nd
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError("fpx.nn.conv: padding='same' is not supported for strided "
                                 "convolutions (as in PyTorch)")
            pads = []
            for k, d in zip(ksize, dilation):
                total = d * (k - 1)
                pads.append((total // 2, total - total // 2))  # the extra one on the right
            return tuple(pads)
        raise ValueError(f"fpx.nn.conv: padding must be an int, a tuple, 'same' or 'valid', "
                         f"got {padding!r}")
    if isinstance(padding, (int, np.integer)):
        pads = ((int(padding), int(padding)),) * nd
    else:
        items = list(padding)
        if len(items) == nd and all(isinstance(p, (tuple, list)) for p in items):
            pads = tuple((int(lo), int(hi)) for lo, hi in items)
        else:
            pads = tuple((p, p) for p in _tuple(items, nd, "padding"))
    if any(lo < 0 or hi < 0 for lo, hi in pads):
        raise ValueError(f"fpx.nn.conv: negative padding {padding!r}")
    return pads


def conv(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, *, bias_in_sum=False):
    """N-d cross-correlation with PyTorch semantics (``torch.nn.functional.conv1d/conv2d``).

    x: (N, C, L) / (N, C, H, W) (or unbatched without N); w: (O, C/groups, k...); b: (O,) or
    None. ``stride``/``dilation``: int or tuple; ``padding``: int, tuple of ints, tuple of
    (lo, hi) pairs, ``"same"`` (stride 1; odd total padding puts the extra element on the
    right) or ``"valid"``; zero padding.

        y[n, o, i] = b[o] + sum_{c, t} x_pad[n, g*C/g + c, i*s + t*d] * w[o, c, t]

    with g = o // (O/groups).

    Lowered to im2col by strided slicing and one matmul (groups as a batch dim). Eager
    float32 on NumPy runs on oneDNN where torch is installed (``fpx.kernels.conv``): the same
    sums of products in another order, so an inlined trace matches it to round-off.
    ``bias_in_sum=True`` makes the bias one more term of that matmul's sum (a library that
    starts the accumulator at the bias, e.g. torch's CPU convolutions: the round-off bound
    then covers the bias in any position of the summation).
    """
    ws, xs = _shape(w), _shape(x)
    nd = len(ws) - 2
    if nd < 1:
        raise ValueError(f"fpx.nn.conv: weight must be (O, C/groups, k...), got shape {ws}")
    if len(xs) not in (nd + 1, nd + 2):
        raise ValueError(f"fpx.nn.conv: a {nd}-d convolution needs a ({nd + 2})-d input "
                         f"(N, C, ...) or an unbatched ({nd + 1})-d one, got shape {xs}")
    unbatched = len(xs) == nd + 1
    if unbatched:
        x = fnp.expand_dims(x, 0)
        xs = (1,) + xs
    groups = operator.index(groups)
    c, o, cg = xs[1], ws[0], ws[1]
    ksize = tuple(ws[2:])
    if groups < 1:
        raise ValueError(f"fpx.nn.conv: groups must be positive, got {groups}")
    if c % groups:
        raise ValueError(f"fpx.nn.conv: groups={groups} does not divide the {c} input channels")
    if o % groups:
        raise ValueError(f"fpx.nn.conv: groups={groups} does not divide the {o} output channels")
    if cg * groups != c:
        raise ValueError(f"fpx.nn.conv: weight of shape {ws} with groups={groups} expects input "
                         f"with {cg * groups} channels, but got {c} channels (input shape {xs})")
    stride = _tuple(stride, nd, "stride")
    dilation = _tuple(dilation, nd, "dilation")
    if any(s < 1 for s in stride) or any(d < 1 for d in dilation):
        raise ValueError(f"fpx.nn.conv: stride {stride} and dilation {dilation} must be positive")
    if any(k < 1 for k in ksize):
        raise ValueError(f"fpx.nn.conv: empty kernel of shape {ksize}")
    pads = _conv_padding(padding, nd, ksize, stride, dilation)
    for n, (lo, hi), k, d in zip(xs[2:], pads, ksize, dilation):
        if n + lo + hi < d * (k - 1) + 1:
            padded = tuple(m + a + z for m, (a, z) in zip(xs[2:], pads))
            raise ValueError(f"fpx.nn.conv: kernel size {ksize} (dilation {dilation}) is larger "
                             f"than the padded input {padded}")
    if b is not None and _shape(b) != (o,):
        raise ValueError(f"fpx.nn.conv: bias must have shape ({o},), got {_shape(b)}")
    params = dict(stride=stride, padding=pads, dilation=dilation, groups=groups)
    if bias_in_sum and b is not None:
        params["bias_in_sum"] = True
    y = _conv.bind(x, w, b, **params)
    return fnp.reshape(y, _shape(y)[1:]) if unbatched else y


def _check_nd(w, nd, name):
    if len(_shape(w)) != nd + 2:
        raise ValueError(f"fpx.nn.{name}: weight must be {nd + 2}-d (O, C/groups, k...), got "
                         f"shape {_shape(w)}")


def conv1d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """1-d :func:`conv`: x (N, C, L), w (O, C/groups, k)."""
    _check_nd(w, 1, "conv1d")
    return conv(x, w, b, stride, padding, dilation, groups)


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """2-d :func:`conv`: x (N, C, H, W), w (O, C/groups, kh, kw)."""
    _check_nd(w, 2, "conv2d")
    return conv(x, w, b, stride, padding, dilation, groups)


# --------------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------------
def _sdpa_scores(q, k, mask, is_causal, scale):
    """s = (q @ k^T) * scale; causal: s[i, j] = -inf for j > i; bool mask: s = where(mask, s,
    -inf); float mask: s = s + mask."""
    s = fnp.multiply(_mm(q, fnp.swapaxes(k, -1, -2)), _c(scale, q))
    ninf = _c(-np.inf, s)
    if is_causal:
        L, S = _shape(q)[-2], _shape(k)[-2]
        s = fnp.where(np.tril(np.ones((L, S), dtype=bool)), s, ninf)
    if mask is not None:
        if _dtype(mask) == np.bool_:
            s = fnp.where(mask, s, ninf)
        else:
            s = fnp.add(s, mask if _dtype(mask) == _dtype(s) else fnp.astype(mask, _dtype(s)))
    return s


def _sdpa_finish(s, v, safe=True):
    """softmax(s) @ v, with rows that are all -inf set to 0 (PyTorch's _safe_softmax: softmax
    of zeros there, no 0/0, then output 0). ``safe=False`` skips that for scores known to
    have no -inf (a transform that has proved it; the result is the same)."""
    if safe:
        zero = _c(0, s)
        dead = fnp.all(fnp.equal(s, _c(-np.inf, s)), axis=-1, keepdims=True)
        p = _softmax.bind(fnp.where(dead, zero, s), axis=len(_shape(s)) - 1)
        p = fnp.where(dead, zero, p)
    else:
        p = _softmax.bind(s, axis=len(_shape(s)) - 1)
    return _mm(p, v)


def _sdpa_decomp(q, k, v, mask, *, is_causal, scale):
    """p = softmax(scores) with fully masked rows 0; return p @ v (see _sdpa_scores,
    _sdpa_finish)."""
    return _sdpa_finish(_sdpa_scores(q, k, mask, is_causal, scale), v)


_sdpa = Composite("scaled_dot_product_attention", _sdpa_decomp, kind="matmul")


def scaled_dot_product_attention(q, k, v, mask=None, is_causal=False, scale=None):
    """softmax(q @ k^T * scale + bias) @ v, PyTorch semantics, layout (..., L, E).

    q (..., L, E), k (..., S, E), v (..., S, Ev); ``scale`` defaults to 1/sqrt(E). ``mask``
    broadcasts to (..., L, S): boolean (True = take part) or float (added to the scores, cast
    to the scores' dtype). ``is_causal``: query i sees keys j <= i (top-left aligned). A query
    whose scores are all -inf (fully masked) gets output 0, as in PyTorch's math backend.
    """
    qs, ks, vs = _shape(q), _shape(k), _shape(v)
    if len(qs) < 2 or len(ks) < 2 or len(vs) < 2:
        raise ValueError("fpx.nn.scaled_dot_product_attention: q, k, v need at least 2 dims")
    if qs[-1] != ks[-1]:
        raise ValueError(f"fpx.nn.scaled_dot_product_attention: q and k embed dims differ: "
                         f"{qs} vs {ks}")
    if ks[-2] != vs[-2]:
        raise ValueError(f"fpx.nn.scaled_dot_product_attention: k and v sequence lengths "
                         f"differ: {ks} vs {vs}")
    if is_causal and mask is not None:
        raise ValueError("fpx.nn.scaled_dot_product_attention: give mask or is_causal, not both")
    if mask is not None:
        np.broadcast_shapes(_shape(mask), qs[:-1] + (ks[-2],))
    scale = 1.0 / math.sqrt(qs[-1]) if scale is None else float(scale)
    return _sdpa.bind(q, k, v, mask, is_causal=bool(is_causal), scale=scale)


# --------------------------------------------------------------------------------------------
# losses, linear, embedding
# --------------------------------------------------------------------------------------------
def _cross_entropy_decomp(logits, labels, *, reduction, axis):
    """l = log_softmax(logits); loss = -l[label] (integer labels) or -sum(p * l) (probability
    targets); then mean / sum / none."""
    lsm = _log_softmax.bind(logits, axis=axis)
    if _dtype(labels).kind in "iu":
        idx = np.asarray(fnp._concrete_index(labels, "cross_entropy labels"))
        c = _shape(logits)[axis]
        if idx.size and (idx.min() < 0 or idx.max() >= c):
            raise ValueError(f"fpx.nn.cross_entropy: class labels must lie in [0, {c}), got "
                             f"values in [{idx.min()}, {idx.max()}]")
        picked = fnp.take_along_axis(lsm, np.expand_dims(idx, axis), axis)
        loss = fnp.negative(fnp.reshape(picked, idx.shape))
    else:
        loss = fnp.negative(fnp.sum(fnp.multiply(labels, lsm), axis))
    if reduction == "mean":
        return fnp.mean(loss)
    if reduction == "sum":
        return fnp.sum(loss)
    return loss


_cross_entropy = Composite("cross_entropy", _cross_entropy_decomp, kind="reduction")


def cross_entropy(logits, labels, reduction="mean", axis=-1):
    """Cross-entropy of ``logits`` (classes along ``axis``) against integer class ``labels``
    (shape of logits without ``axis``): -log_softmax(logits)[label]; or against probability
    targets (same shape as logits): -sum(p * log_softmax(logits), axis). ``reduction``:
    "mean" (over the remaining elements), "sum" or "none". (No weights, ignore_index or label
    smoothing.)"""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"fpx.nn.cross_entropy: reduction must be 'mean', 'sum' or 'none', "
                         f"got {reduction!r}")
    ls, lb = _shape(logits), _shape(labels)
    ax = _axis(axis, len(ls))
    kind = _dtype(labels).kind
    if kind in "iu":
        want = ls[:ax] + ls[ax + 1:]
        if lb != want:
            raise ValueError(f"fpx.nn.cross_entropy: integer labels must have shape {want} "
                             f"(logits {ls} without axis {ax}), got {lb}")
    elif _is_float(_dtype(labels)):
        if lb != ls:
            raise ValueError(f"fpx.nn.cross_entropy: probability targets must have the logits' "
                             f"shape {ls}, got {lb}")
    else:
        raise TypeError(f"fpx.nn.cross_entropy: labels must be integer classes or float "
                        f"probabilities, got dtype {_dtype(labels)}")
    return _cross_entropy.bind(logits, labels, reduction=reduction, axis=ax)


def _linear_decomp(x, w, b, *, bias_in_sum=False):
    """y = x @ w.T + b; with ``bias_in_sum``: y = [x | 1] @ [w | b].T (b one more term of the
    matmul's sum, as BLAS gemm with beta=1 -- torch.addmm, F.linear -- accumulates it).
    Leading dims are flattened into one GEMM, as torch's linear does (NumPy's matmul of a
    (L, N, K) stack would run L small GEMMs)."""
    lead = _shape(x)[:-1]
    if len(lead) > 1:
        y = _linear_decomp(fnp.reshape(x, (-1, _shape(x)[-1])), w, b, bias_in_sum=bias_in_sum)
        return fnp.reshape(y, lead + _shape(y)[-1:])
    if b is not None and bias_in_sum:
        ones = fnp.ones(_shape(x)[:-1] + (1,), _dtype(x), like=x)
        wb = fnp.concatenate([w, fnp.reshape(_as_dtype(b, w), (-1, 1))], axis=-1)
        return _mm(fnp.concatenate([x, ones], axis=-1), fnp.transpose(wb))
    y = _mm(x, fnp.transpose(w))
    return y if b is None else fnp.add(y, b)


def _linear_bias_last(x, w, b):
    """Can NumPy's linear add an in-sum bias after the GEMM (``x @ w.T`` then ``+= b``)? For
    float32/float64 operands of one dtype that is the same (K+1)-term sum with the bias in the
    last position, which every bound of ``bias_in_sum`` covers; it skips copying ``[x | 1]``
    and ``[w | b]``. Narrower dtypes keep the decomposition: their GEMM accumulates in float32
    and rounds once, a later add would round twice."""
    dt = _dtype(x)
    return (isinstance(x, np.ndarray) and isinstance(w, np.ndarray) and isinstance(b, np.ndarray)
            and dt in (np.float32, np.float64) and _dtype(w) == dt and _dtype(b) == dt)


def _linear_native(B):
    """The NumPy backend's linear: one GEMM over the flattened leading dims, then the bias
    (added in place; for ``bias_in_sum`` as the sum's last term, see _linear_bias_last);
    other backends and dtypes run the decomposition."""
    if B.name != "numpy":
        return _linear_decomp

    def linear_numpy(x, w, b=None, *, bias_in_sum=False):
        if b is not None and bias_in_sum and not _linear_bias_last(x, w, b):
            return _linear_decomp(x, w, b, bias_in_sum=True)
        y = _linear_decomp(x, w, None)
        if b is None:
            return y
        if bias_in_sum:
            return np.add(y, b, out=y) if y.ndim else y + b
        return fnp.add(y, b)
    return linear_numpy


_linear = Composite("linear", _linear_decomp, _linear_native, kind="matmul")


def linear(x, w, b=None, *, bias_in_sum=False):
    """x @ w.T + b with w of shape (out, in) (PyTorch layout), x (..., in).

    ``bias_in_sum=True``: the bias is one more term of the matmul's sum, ``[x | 1] @ [w | b].T``
    -- what BLAS ``gemm`` with ``beta=1`` (``torch.addmm``, ``F.linear`` on CPU) computes; a
    round-off bound then covers the bias in any position of the accumulation. The default is
    NumPy's ``x @ w.T + b`` (the bias added once, after the matmul).
    """
    if _shape(w)[-1:] != _shape(x)[-1:]:
        raise ValueError(f"fpx.nn.linear: input of shape {_shape(x)} does not match weight of "
                         f"shape {_shape(w)} (expected x[..., {(_shape(w) or (0,))[-1]}])")
    if bias_in_sum and b is not None:
        return _linear.bind(x, w, b, bias_in_sum=True)
    return _linear.bind(x, w, b)


def _embedding_decomp(ids, table):
    """table[ids] (a gather along axis 0)."""
    idx = np.asarray(fnp._concrete_index(ids, "embedding ids"))
    n = _shape(table)[0]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"fpx.nn.embedding: ids must lie in [0, {n}), got values in "
                         f"[{idx.min()}, {idx.max()}]")
    return fnp.take(table, idx, axis=0)


_embedding = Composite("embedding", _embedding_decomp, kind="movement")


def embedding(ids, table):
    """table[ids]: rows of ``table`` (V, D) for integer ``ids`` of any shape -> ids.shape + (D,)."""
    if _dtype(ids).kind not in "iu":
        raise TypeError(f"fpx.nn.embedding: ids must be integers, got dtype {_dtype(ids)}")
    return _embedding.bind(ids, table)


from fpx.nn_spatial import (adaptive_avg_pool, avg_pool, avg_pool1d, avg_pool2d,  # noqa: E402,F401
                            conv_transpose, max_pool, max_pool1d, max_pool2d, upsample_nearest)
from fpx.nn_special import digamma  # noqa: E402,F401
