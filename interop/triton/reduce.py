"""``tl.reduce`` and ``tl.associative_scan`` (behind ``tl.sum``, ``tl.max``, ``tl.cumsum``, ...)
on fpx values: the standard combines map to fpx's reductions (``reduce_sum``, ``reduce_max``,
``cumsum``: their rules hold for every order, as a GPU's tree reduction needs); any other
combine function is applied along the axis, one step per element, through the kernel's own ops.
"""
from __future__ import annotations

import numpy as np
import triton.language as tl

import fpx.numpy as fnp
from fpx.core import Tracer
from fpx.interop.triton.builder import Handle, data, np_dtype

_std = tl.standard


def _tensor(x, dtype):
    """A tl.tensor of fpx data ``x`` (program axis in front)."""
    shape = list(np.shape(x)[1:])
    ty = tl.block_type(dtype, shape) if shape else dtype
    return tl.core.tensor(Handle(x, dtype), ty)


def _ns(x):
    return fnp if isinstance(x, Tracer) else np


def _acc(x):
    """The namespace of an accumulation over ``x``: fpx for floats (constants too: their sums
    round), NumPy for integers (exact)."""
    return fnp if isinstance(x, Tracer) or np.dtype(x.dtype).kind in "fV" else np


def _flat(x):
    """The block dims of ``x`` as one (for axis=None)."""
    return _ns(x).reshape(x, (np.shape(x)[0], -1))


class ReduceOps:
    """Replaces ``triton.runtime.interpreter.ReduceOps`` while fpx runs a launch."""

    def __init__(self, axis, combine_fn, keep_dims):
        self.axis, self.combine_fn, self.keep_dims = axis, combine_fn, keep_dims

    def apply(self, input):
        single = not isinstance(input, tuple)
        inputs = (input,) if single else tuple(input)
        out = self._apply(inputs)
        return out[0] if single else tuple(out)

    def _apply(self, inputs):
        xs = [data(t.handle) for t in inputs]
        nd = len(inputs[0].shape)
        if self.axis is None:
            xs, ax = [_flat(x) for x in xs], 1
        else:
            ax = self.axis % nd + 1
        f = self.combine_fn
        dts = [t.dtype for t in inputs]
        if f is _std._sum_combine:
            res = [_acc(xs[0]).sum(xs[0], axis=ax)]
        elif f is _std._elementwise_max:
            res = [_ns(xs[0]).max(xs[0], axis=ax)]
        elif f is _std._elementwise_min:
            res = [_ns(xs[0]).min(xs[0], axis=ax)]
        elif f in (_std._argmax_combine_tie_break_left, _std._argmax_combine_tie_break_fast,
                   _std._argmin_combine_tie_break_left, _std._argmin_combine_tie_break_fast):
            is_max = f in (_std._argmax_combine_tie_break_left,
                           _std._argmax_combine_tie_break_fast)
            ns = _ns(xs[0])
            res = [(ns.max if is_max else ns.min)(xs[0], axis=ax),
                   np.asarray((ns.argmax if is_max else ns.argmin)(xs[0], axis=ax)
                              if ns is np else _concrete_arg(xs[0], ax, is_max)).astype(np.int32)]
            dts = [dts[0], tl.int32]
        else:
            res = self._fold(xs, ax, dts)
        out = []
        for r, dt in zip(res, dts):
            if np.asarray(r).dtype != np_dtype(dt) if not isinstance(r, Tracer) else \
                    np.dtype(r.dtype) != np_dtype(dt):
                r = fnp.astype(r, np_dtype(dt)) if isinstance(r, Tracer) else \
                    np.asarray(r).astype(np_dtype(dt))
            if self.keep_dims:
                ns = _ns(r)
                r = ns.reshape(r, (np.shape(r)[0],) + (1,) * nd) if self.axis is None else \
                    ns.expand_dims(r, ax)
            out.append(_tensor(r, dt))
        return out

    def _fold(self, xs, ax, dts):
        """A user combine function applied along ``ax``, left to right."""
        n = np.shape(xs[0])[ax]
        take = lambda x, i: _ns(x).take(x, [i], axis=ax).reshape(  # noqa: E731
            np.shape(x)[:ax] + np.shape(x)[ax + 1:]) if _ns(x) is np else \
            fnp.squeeze(fnp.take(x, [i], axis=ax), axis=ax)
        acc = [_tensor(take(x, 0), dt) for x, dt in zip(xs, dts)]
        for i in range(1, n):
            nxt = [_tensor(take(x, i), dt) for x, dt in zip(xs, dts)]
            r = self.combine_fn.fn(*acc, *nxt)
            acc = list(r) if isinstance(r, tuple) else [r]
        return [data(a.handle) for a in acc]


def _concrete_arg(x, ax, is_max):
    from fpx.interop.triton.builder import concrete
    c = concrete(fnp.argmax(x, axis=ax) if is_max else fnp.argmin(x, axis=ax), "argmax/argmin")
    return c


class ScanOps:
    """Replaces ``triton.runtime.interpreter.ScanOps`` while fpx runs a launch."""

    def __init__(self, axis, combine_fn, reverse):
        self.axis, self.combine_fn, self.reverse = axis, combine_fn, reverse

    def apply(self, input):
        single = not isinstance(input, tuple)
        inputs = (input,) if single else tuple(input)
        nd = len(inputs[0].shape)
        ax = self.axis % nd + 1
        xs = [data(t.handle) for t in inputs]
        if self.reverse:
            xs = [_ns(x).flip(x, axis=ax) for x in xs]
        if self.combine_fn is _std._sum_combine:
            res = [_acc(xs[0]).cumsum(xs[0], axis=ax)]
        else:
            res = self._fold(xs, ax, [t.dtype for t in inputs])
        if self.reverse:
            res = [_ns(r).flip(r, axis=ax) for r in res]
        out = []
        for r, t in zip(res, inputs):
            if not isinstance(r, Tracer):
                r = np.asarray(r).astype(np_dtype(t.dtype))
            out.append(_tensor(r, t.dtype))
        return out[0] if single else tuple(out)

    def _fold(self, xs, ax, dts):
        n = np.shape(xs[0])[ax]
        sl = lambda x, i: fnp.squeeze(fnp.take(x, [i], axis=ax), axis=ax)  # noqa: E731
        acc = [_tensor(sl(x, 0), dt) for x, dt in zip(xs, dts)]
        cols = [[data(a.handle)] for a in acc]
        for i in range(1, n):
            nxt = [_tensor(sl(x, i), dt) for x, dt in zip(xs, dts)]
            r = self.combine_fn.fn(*acc, *nxt)
            acc = list(r) if isinstance(r, tuple) else [r]
            for c, a in zip(cols, acc):
                c.append(data(a.handle))
        return [fnp.stack(c, axis=ax) for c in cols]
