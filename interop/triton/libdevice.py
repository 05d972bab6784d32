"""``tl.extra.libdevice`` functions (``tanh``, ``pow``, ``erf``, ...) as fpx ops during fpx
launches. Triton's interpreter runs none of them (its stubs return nothing); under fpx each
maps to the fpx primitive computing the same function, so the policy's error for that function
(the larger of CUDA's libdevice table and the host's) bounds it. Functions without a mapping
raise naming them."""
from __future__ import annotations

import numpy as np
import triton.language as tl

import fpx.numpy as fnp
from fpx.interop.triton.builder import Handle, UnsupportedTritonOpError, data

_UNARY = {"exp": fnp.exp, "exp2": fnp.exp2, "expm1": fnp.expm1, "log": fnp.log,
          "log2": fnp.log2, "log1p": fnp.log1p, "sin": fnp.sin, "cos": fnp.cos, "tan": fnp.tan,
          "tanh": fnp.tanh, "sinh": fnp.sinh, "cosh": fnp.cosh, "atan": fnp.arctan,
          "erf": fnp.erf, "sqrt": fnp.sqrt, "sqrt_rn": fnp.sqrt, "abs": fnp.abs,
          "fabs": fnp.abs, "floor": fnp.floor, "ceil": fnp.ceil, "trunc": fnp.trunc,
          "rint": fnp.rint, "nearbyint": fnp.rint,
          "rsqrt": lambda x: fnp.divide(np.ones((), x.dtype), fnp.sqrt(x)),
          "rcp_rn": lambda x: fnp.divide(np.ones((), x.dtype), x)}
_BINARY = {"pow": fnp.power, "atan2": fnp.arctan2, "div_rn": fnp.divide,
           "fmin": fnp.minimum, "fmax": fnp.maximum, "add_rn": fnp.add, "mul_rn": fnp.multiply,
           "sub_rn": fnp.subtract}
_TERNARY = {"fma": fnp.fma, "fma_rn": fnp.fma}

NAMES = frozenset(_UNARY) | frozenset(_BINARY) | frozenset(_TERNARY)


def call(name, *args):
    """``libdevice.<name>(*args)`` on fpx values (args: tl.tensors or Python numbers)."""
    from triton.runtime.interpreter import interpreter_semantic as sem
    ts = [sem.to_tensor(a) for a in args]
    for i in range(1, len(ts)):
        ts[0], ts[i] = sem.broadcast_impl_value(ts[0], ts[i])
    for i in range(1, len(ts)):
        ts[0], ts[i] = sem.broadcast_impl_value(ts[0], ts[i])
    ref = next((t for t in ts if t.dtype.is_floating()), ts[0])
    if not ref.dtype.is_floating():
        raise UnsupportedTritonOpError(f"libdevice.{name}", "on integers")
    xs = [data(sem.cast(t, ref.dtype).handle) for t in ts]
    f = _UNARY.get(name) or _BINARY.get(name) or _TERNARY.get(name)
    if f is None:
        raise UnsupportedTritonOpError(f"libdevice.{name}")
    out = f(*xs)                   # floats round: through fpx, constants too
    return tl.core.tensor(Handle(out, ref.dtype.scalar), ref.type)
