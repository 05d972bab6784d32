"""Elementwise rules: correctly rounded transcendentals and rsqrt (fpx.kernels.crmath,
float64 through fpx.kernels.crmath64) and casts rounded once, straight into the target
format."""
from __future__ import annotations

import numpy as np

import fpx.nn  # noqa: F401  (registers the rsqrt composite)
from fpx import formats
from fpx.core import NUMPY
from fpx.kernels import crmath
from fpx.transforms.reproducible.interpreter import (ReproducibleInterpreter, float_format,
                                                     is_float, value)

_rule = ReproducibleInterpreter.def_rule


def _result_dtype(prim, v):
    """NumPy's result dtype of the function on ``v`` (float64 for a Python float)."""
    arr = np.asarray(v)
    if prim.name in ("sigmoid", "rsqrt"):
        return arr.dtype if is_float(arr) else np.dtype(np.float64)
    dummy = v if np.isscalar(v) and not isinstance(v, np.generic) else np.zeros(1, arr.dtype)
    with np.errstate(all="ignore"):
        return np.asarray(prim.impl_for(NUMPY)(dummy)).dtype


def _cr(name):
    def rule(self, prim, x):
        v = value(x)
        dt = _result_dtype(prim, v)
        F = float_format(dt, name)
        arr = np.asarray(v)
        out = crmath.cr_apply(name, arr.astype(dt, copy=False), F)
        return self.new(out if arr.ndim else out[()])
    return rule


for _name in crmath.FUNCTIONS:       # (rsqrt: fpx.nn's composite, one rounding here)
    _rule(_name)(_cr(_name))


def _cr2(name):
    def rule(self, prim, x, z):
        vx, vz = value(x), value(z)
        with np.errstate(all="ignore"):
            dummy = [v if np.isscalar(v) and not isinstance(v, np.generic)
                     else np.ones(1, np.asarray(v).dtype) for v in (vx, vz)]
            dt = np.asarray(prim.impl_for(NUMPY)(*dummy)).dtype
        if not is_float(np.empty(0, dt)):             # integer powers: exact (NumPy's)
            return self.new(self.bind_parent(prim, vx, vz))
        F = float_format(dt, name)
        ax, az = np.broadcast_arrays(np.asarray(vx).astype(dt, copy=False),
                                     np.asarray(vz).astype(dt, copy=False))
        out = crmath.cr_apply(name, ax, F, az)
        return self.new(out if out.ndim else out[()])
    return rule


for _name in crmath.FUNCTIONS2:
    _rule(_name)(_cr2(_name))


@_rule("cast")
def _cast(self, prim, x, *, to):
    """float64 -> bfloat16 (or tf32) by one exact rounding: ml_dtypes goes through float32."""
    v = value(x)
    if isinstance(to, formats.Format) and to.name not in ("float64", "float32", "float16") \
            and is_float(v) and np.asarray(v).dtype == np.float64:
        r = formats.round(np.asarray(v), to, "rn")
        return self.new(r.astype(to.dtype) if to.dtype is not None else r)
    return self.new(self.bind_parent(prim, v, to=to))
