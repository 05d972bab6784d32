"""The reproducible interpreter: which primitives keep their IEEE meaning, which get a rule,
and the checks on dtypes and the floating-point environment."""
from __future__ import annotations

import numpy as np

from fpx import formats
from fpx.core import Composite, EvalInterpreter, FpxError, Interpreter, Tracer, concrete
from fpx.primitives import KIND_OF

__all__ = ["ReproducibleInterpreter", "ORDERS", "SEMANTICS", "value", "float_format",
           "check_environment"]

ORDERS = ("sequential", "pairwise", "exact")

#: the version of docs/reproducible.md's meaning of the operations: results computed under
#: equal versions have equal bits (raised whenever an operation's meaning changes)
SEMANTICS = 1

# kinds whose NumPy evaluation already has the spec's platform-free meaning: exact results,
# IEEE's correctly rounded + - * / sqrt fma, comparisons, selections, movement, npy_divmod
_IEEE_KINDS = ("exact", "rounded", "compare", "select", "movement", "divmod")


class ReproducibleInterpreter(Interpreter):
    """Evaluates a program under docs/reproducible.md's meaning; ``alt`` picks the other
    schedule ``check=True`` compares with (the bits must not change)."""

    #: values are plain arrays (the torch adapter's dispatch mode may re-read a tensor's
    #: value from its memory after an in-place op on an alias of it)
    plain_values = True

    def __init__(self, parent, order="sequential", alt=False):
        super().__init__(parent)
        if not isinstance(parent, EvalInterpreter):
            raise FpxError("fpx.reproducible: nesting inside another transform is not "
                           "supported yet; run it on its own")
        self.order, self.alt = order, alt

    def process(self, prim, args, params):
        rule = self.rules.get(prim.name)
        if rule is not None:
            return rule(self, prim, *args, **params)
        if isinstance(prim, Composite) and prim.decomposition is not None:
            return prim.decomposition(*args, **params)
        if KIND_OF.get(prim.name) in _IEEE_KINDS:
            return self.new(self.bind_parent(prim, *[value(a) for a in args], **params))
        raise_unsupported(prim, self)

    def new(self, x):
        return Tracer(self, x)


def raise_unsupported(prim, interp):
    from fpx.core import UnsupportedOpError
    err = UnsupportedOpError(prim, interp)
    err.args = (f"fpx.reproducible: '{prim.name}' has no reproducible meaning yet "
                f"(docs/reproducible.md lists the operations that do); " + err.args[0],)
    raise err


def value(x):
    """The concrete array (or Python scalar) behind an operand."""
    return concrete(x)


def float_format(dt, what):
    """fpx's Format of a float dtype that the spec covers for ``what``; TypeError otherwise."""
    dt = np.dtype(dt)
    try:
        F = formats.get(dt)
    except (TypeError, ValueError, KeyError):
        F = None
    if F is None or F.name not in ("float64", "float32", "float16", "bfloat16"):
        raise TypeError(f"fpx.reproducible: {what} of dtype {dt} is not supported "
                        f"(float64, float32, float16 and bfloat16 are)")
    return F


def is_float(x) -> bool:
    dt = np.asarray(x).dtype if not hasattr(x, "dtype") else np.dtype(x.dtype)
    return dt.kind == "f" or (dt.kind == "V" and dt.names is None)


def check_environment():
    """Raise if the CPU flushes subnormals (FTZ) or treats them as zero (DAZ)."""
    tiny = np.float32(2.0 ** -126)
    sub = np.float32(2.0 ** -140)
    with np.errstate(all="ignore"):
        ftz = tiny * np.float32(0.5) == 0
        daz = sub * np.float32(2.0) == 0
    if ftz or daz:
        raise FpxError("fpx.reproducible: this process flushes subnormals to zero "
                       "(FTZ/DAZ is on, e.g. torch.set_flush_denormal(True)); IEEE "
                       "arithmetic without flushing is part of the spec")
