"""Shared plumbing for transforms: wrap a function's array inputs as tracers of a new
interpreter, run it with that interpreter current, and unwrap the outputs.

Which leaves become tracers: arrays (NumPy, CuPy, NumPy scalars) of a real floating-point,
integer or bool dtype, and tracers of enclosing transforms. Python scalars stay constants (as
weakly-typed values they follow NumPy's promotion rules). Complex, object and string arrays are
rejected with a clear error.
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from fpx import tree
from fpx.core import Interpreter, Tracer, current_interpreter, using

_OK_KINDS = "fiub"


def is_array_leaf(x) -> bool:
    if isinstance(x, Tracer):
        return True
    if isinstance(x, (np.ndarray, np.generic)):
        return True
    return type(x).__module__.split(".")[0] == "cupy" and hasattr(x, "dtype")


def check_dtype(x, where: str) -> None:
    dt = x.dtype
    if dt.kind not in _OK_KINDS and dt.kind != "V":  # ml_dtypes' bf16/fp8 have kind 'V'
        raise TypeError(f"fpx: unsupported dtype {dt} for {where}; fpx handles real floating "
                        "point (float64 ... float8), integers and bools")
    if dt.kind == "V":
        from fpx import formats
        formats.get(dt)  # raises for void/structured dtypes that are not ml_dtypes formats


def run(interp_factory: Callable[[Interpreter], Interpreter],
        make_tracer: Callable[[Interpreter, object], Tracer],
        f: Callable, args: tuple, kwargs: dict):
    """Run ``f(*args, **kwargs)`` under a fresh interpreter; return (interpreter, outputs with
    this interpreter's tracers still in place, as a pytree)."""
    interp = interp_factory(current_interpreter())
    leaves, td = tree.flatten((args, kwargs))
    wrapped = []
    for i, x in enumerate(leaves):
        if is_array_leaf(x):
            check_dtype(x, f"input leaf {i} of {getattr(f, '__name__', 'f')}")
            wrapped.append(make_tracer(interp, x))
        else:
            wrapped.append(x)
    a, k = tree.unflatten(td, wrapped)
    with using(interp):
        out = f(*a, **k)
    return interp, out


def own(interp: Interpreter, x) -> bool:
    """Is ``x`` a tracer of ``interp``?"""
    return isinstance(x, Tracer) and x._interp is interp


def wraps(f):
    """functools.wraps that tolerates callables without __name__ (e.g. torch modules)."""
    def deco(g):
        try:
            return functools.wraps(f)(g)
        except (AttributeError, TypeError):
            return g
    return deco
