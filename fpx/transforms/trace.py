"""``fpx.trace``: a readable record of the primitives a function executes (like
``jax.make_jaxpr``).

The trace interpreter records each primitive (op, operand shapes/dtypes, params) and evaluates it
under its parent, so it composes with everything: ``trace(trace(f))`` records the same program
twice, ``trace(interval(f))`` shows what the interval transform computes. Composites are recorded
as one op by default (``inline=True`` records their decomposition instead).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fpx import tree
from fpx.core import Composite, Interpreter, Primitive, Tracer
from fpx.transform import own, run, transformed

__all__ = ["trace", "TraceRecord", "Eqn", "Var"]


@dataclass(frozen=True)
class Var:
    """A value in the record: a name with its dtype and shape."""
    name: str
    dtype: Any
    shape: tuple

    def __str__(self):
        return f"{self.name}:{_dt(self.dtype)}[{','.join(map(str, self.shape))}]"


def _dt(dtype):
    try:
        return {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
                "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2", "bool": "bool",
                "int64": "i64", "int32": "i32"}.get(np.dtype(dtype).name, np.dtype(dtype).name)
    except TypeError:
        return str(dtype)


@dataclass(frozen=True)
class Eqn:
    """One executed primitive: ``outvar = prim invars... params``."""
    prim: Primitive
    invars: tuple   # Var or a constant (python scalar / small array summary)
    outvar: Var
    params: dict = field(default_factory=dict)

    def __str__(self):
        ins = " ".join(a.name if isinstance(a, Var) else _const(a) for a in self.invars)
        ps = " ".join(f"{k}={_param(v)}" for k, v in self.params.items())
        return f"{self.outvar} = {self.prim.name} {ins}" + (f"  {ps}" if ps else "")


def _const(a):
    if isinstance(a, (bool, int, float, np.generic)) and np.ndim(a) == 0:
        return repr(a.item() if isinstance(a, np.generic) else a)
    if a is None:
        return "None"
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return f"const:{_dt(a.dtype)}[{','.join(map(str, a.shape))}]"
    return type(a).__name__


def _param(v):
    if isinstance(v, np.ndarray):
        return f"array:{_dt(v.dtype)}[{','.join(map(str, v.shape))}]"
    if isinstance(v, tuple):
        return "(" + ",".join(_param(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, slice):
        return ":".join("" if x is None else str(x) for x in (v.start, v.stop, v.step)).rstrip(":") or ":"
    if v is Ellipsis:
        return "..."
    if hasattr(v, "name") and not isinstance(v, str):
        return str(v.name)
    if isinstance(v, np.dtype):
        return _dt(v)
    return repr(v)


class TraceRecord:
    """The result of :func:`trace`: input vars, equations, output vars and the outputs."""

    def __init__(self, invars, eqns, outvars, outputs):
        self.invars, self.eqns, self.outvars, self.outputs = invars, eqns, outvars, outputs

    @property
    def primitives(self) -> list[str]:
        """Primitive names in execution order."""
        return [e.prim.name for e in self.eqns]

    def __str__(self):
        lines = [f"{{ lambda {' '.join(str(v) for v in self.invars)} ."]
        lines += [f"    {e}" for e in self.eqns]
        outs = [v.name if isinstance(v, Var) else _const(v) for v in self.outvars]
        lines.append(f"    return {', '.join(outs)} }}")
        return "\n".join(lines)

    __repr__ = __str__

    def __len__(self):
        return len(self.eqns)


tree.register_node(TraceRecord, lambda r: ([r.outputs], (r.invars, r.eqns, r.outvars)),
                   lambda aux, ch: TraceRecord(aux[0], aux[1], aux[2], ch[0]))


class TraceTracer(Tracer):
    # not ``var``: that name is the array method ``x.var()`` (variance)
    __slots__ = ("tvar",)

    def __init__(self, interp, primal, var):
        super().__init__(interp, primal)
        self.tvar = var


class TraceInterpreter(Interpreter):
    """Records every primitive, evaluates it under the parent."""

    def __init__(self, parent, inline: bool = False):
        super().__init__(parent)
        self.inline = inline
        self.eqns: list[Eqn] = []
        self._names = _names()

    def new_var(self, value) -> Var:
        return Var(next(self._names), value.dtype, tuple(value.shape))

    def process(self, prim, args, params):
        if self.inline and isinstance(prim, Composite) and prim.decomposition is not None \
                and prim.name not in self.rules:
            return prim.decomposition(*args, **params)
        primals = [a.primal if own(self, a) else a for a in args]
        out = self.bind_parent(prim, *primals, **params)
        invars = tuple(a.tvar if own(self, a) else a for a in args)
        t = TraceTracer(self, out, self.new_var(out))
        self.eqns.append(Eqn(prim, invars, t.tvar, dict(params)))
        return t


def _names():
    for n in itertools.count():
        s, n2 = "", n
        while True:
            s = chr(ord("a") + n2 % 26) + s
            n2 = n2 // 26 - 1
            if n2 < 0:
                break
        yield s


def trace(f, *, inline: bool = False):
    """``trace(f)(*args)`` -> :class:`TraceRecord` of the primitives ``f`` executed.

    ``record.outputs`` holds ``f``'s outputs (evaluated by the parent interpreter), so the
    record is also a pytree and nests: ``trace(trace(f))(x)``. ``inline=True`` shows composites
    (mean, einsum, softmax, ...) as the primitives they decompose into. A torch module (or a
    function of torch tensors) is traced through the program ``fpx.interop.torch`` builds from
    it; ``record.outputs`` are then torch tensors.
    """
    def traced(ad):
        invars = []

        def make(interp, x):
            t = TraceTracer(interp, x, interp.new_var(x))
            invars.append(t.tvar)
            return t
        interp, out = run(lambda p: TraceInterpreter(p, inline), make, ad.fn, ad.args,
                          ad.kwargs)
        leaves, td = tree.flatten(out)
        outvars = [x.tvar if own(interp, x) else x for x in leaves]
        values = tree.unflatten(td, [x.primal if own(interp, x) else x for x in leaves])
        return TraceRecord(invars, interp.eqns, outvars, values)
    return transformed(f, traced)
