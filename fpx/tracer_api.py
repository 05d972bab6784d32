"""The tracer's array API: Python operators, NumPy's ``__array_ufunc__``/``__array_function__``
and array methods on :class:`fpx.core.Tracer`, each routed to :mod:`fpx.numpy` (installed when
that namespace is imported; the core defines the tracer without importing a namespace)."""
from __future__ import annotations

import numpy as np

from fpx import numpy as fnp
from fpx.core import Tracer, concrete, scalar_operator


def _operator(fn, reflected=False, on_scalars=None):
    """A Python operator: ``fn`` on the operands; where every operand's value is a scalar (a
    Python number -- a traced Python float input -- or a NumPy scalar), ``on_scalars`` (default
    ``fn``) under ``fpx.core.scalar_operator``: the value is the operator's own."""
    def method(self, *other):
        args = (other[0], self) if reflected else (self, *other)
        if all(isinstance(concrete(a), (int, float, np.generic)) for a in args):
            with scalar_operator():
                return (on_scalars or fn)(*args)
        return fn(*args)
    return method


class _TracerArrayAPI:
    """What ``fpx.core.Tracer`` does as an array, installed on it below."""

    def __array_namespace__(self, api_version=None):
        return fnp

    # -- NumPy protocols ---------------------------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return fnp._dispatch_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return fnp._dispatch_function(func, args, kwargs)

    # -- operators ----------------------------------------------------------------------------
    __add__ = _operator(fnp.add)
    __radd__ = _operator(fnp.add, reflected=True)
    __sub__ = _operator(fnp.subtract)
    __rsub__ = _operator(fnp.subtract, reflected=True)
    __mul__ = _operator(fnp.multiply)
    __rmul__ = _operator(fnp.multiply, reflected=True)
    __truediv__ = _operator(fnp.divide)
    __rtruediv__ = _operator(fnp.divide, reflected=True)
    __floordiv__ = _operator(fnp.floor_divide)
    __rfloordiv__ = _operator(fnp.floor_divide, reflected=True)
    __mod__ = _operator(fnp.remainder)
    __rmod__ = _operator(fnp.remainder, reflected=True)
    __pow__ = _operator(fnp._array_pow, on_scalars=fnp.power)  # (no ndarray ** fast paths)
    __rpow__ = _operator(fnp.power, reflected=True)
    def __matmul__(self, o): return fnp.matmul(self, o)
    def __rmatmul__(self, o): return fnp.matmul(o, self)
    __neg__ = _operator(fnp.negative)
    def __pos__(self): return self
    __abs__ = _operator(fnp.abs)
    def __lt__(self, o): return fnp.less(self, o)
    def __le__(self, o): return fnp.less_equal(self, o)
    def __gt__(self, o): return fnp.greater(self, o)
    def __ge__(self, o): return fnp.greater_equal(self, o)
    def __eq__(self, o): return fnp.equal(self, o)  # type: ignore[override]
    def __ne__(self, o): return fnp.not_equal(self, o)  # type: ignore[override]
    def __and__(self, o): return fnp.bitwise_and(self, o)
    def __rand__(self, o): return fnp.bitwise_and(o, self)
    def __or__(self, o): return fnp.bitwise_or(self, o)
    def __ror__(self, o): return fnp.bitwise_or(o, self)
    def __xor__(self, o): return fnp.bitwise_xor(self, o)
    def __rxor__(self, o): return fnp.bitwise_xor(o, self)
    def __invert__(self): return fnp.invert(self)
    
    def __getitem__(self, index):
        return fnp._getitem(self, index)

    # -- methods ------------------------------------------------------------------------------
    @property
    def T(self): return fnp.transpose(self)
    @property
    def mT(self): return fnp.matrix_transpose(self)
    def astype(self, dtype, copy=True): return fnp.astype(self, dtype)
    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        return fnp.reshape(self, shape, order=order)
    def transpose(self, *axes):
        if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
            axes = axes[0]
        return fnp.transpose(self, None if axes is None or len(axes) == 0 else axes)
    def swapaxes(self, a, b): return fnp.swapaxes(self, a, b)
    def squeeze(self, axis=None): return fnp.squeeze(self, axis)
    def flatten(self): return fnp.reshape(self, (-1,))
    ravel = flatten
    def copy(self): return self
    def sum(self, axis=None, dtype=None, keepdims=False): return fnp.sum(self, axis, dtype=dtype, keepdims=keepdims)
    def mean(self, axis=None, dtype=None, keepdims=False): return fnp.mean(self, axis, dtype=dtype, keepdims=keepdims)
    def prod(self, axis=None, dtype=None, keepdims=False): return fnp.prod(self, axis, dtype=dtype, keepdims=keepdims)
    def max(self, axis=None, keepdims=False): return fnp.max(self, axis, keepdims=keepdims)
    def min(self, axis=None, keepdims=False): return fnp.min(self, axis, keepdims=keepdims)
    def argmax(self, axis=None, keepdims=False): return fnp.argmax(self, axis, keepdims=keepdims)
    def argmin(self, axis=None, keepdims=False): return fnp.argmin(self, axis, keepdims=keepdims)
    def var(self, axis=None, dtype=None, ddof=0, keepdims=False): return fnp.var(self, axis, dtype=dtype, ddof=ddof, keepdims=keepdims)
    def std(self, axis=None, dtype=None, ddof=0, keepdims=False): return fnp.std(self, axis, dtype=dtype, ddof=ddof, keepdims=keepdims)
    def cumsum(self, axis=None, dtype=None): return fnp.cumsum(self, axis, dtype=dtype)
    def clip(self, min=None, max=None): return fnp.clip(self, min, max)
    def round(self, decimals=0): return fnp.round(self, decimals)
    def dot(self, other): return fnp.dot(self, other)


for _name, _attr in list(vars(_TracerArrayAPI).items()):
    if _name not in ("__dict__", "__weakref__", "__module__", "__qualname__", "__doc__"):
        setattr(Tracer, _name, _attr)
