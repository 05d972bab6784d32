"""The closed set of fpx primitives and their backend implementations.

Everything else (``fpx.numpy``'s long tail, ``fpx.nn``) is a composite built from these. The set
follows NumPy's semantics (dtype promotion, broadcasting, NaN propagation) so the eval
interpreter is NumPy (or CuPy) itself:

=============  ==============================================================================
elementwise    neg abs sqrt floor ceil round sign add sub mul div max min fma
               floor_divide remainder
transcendental exp expm1 exp2 log log1p log2 sin cos tan tanh sinh cosh atan erf pow atan2
compare        lt le gt ge eq ne isnan isinf isfinite logical_and logical_or logical_xor
               logical_not where
cast           cast (to a float format or an integer/bool dtype)
matmul         matmul (np.matmul semantics, incl. 1-D operands and broadcast batch dims)
reduction      reduce_sum reduce_prod reduce_max reduce_min argmax argmin cumsum sort
               argsort
movement       reshape transpose broadcast_to getitem concatenate pad
=============  ==============================================================================

Each implementation factory receives the :class:`~fpx.core.Backend` and returns the callable,
so NumPy ufuncs are called directly (no per-call indirection).
"""
from __future__ import annotations


from fpx.core import Primitive

__all__ = ["UNARY", "BINARY"]


def _ufunc(name: str):
    return lambda B: getattr(B.xp, name)


# name -> (NumPy ufunc name, kind)
UNARY = {
    "neg": ("negative", "elementwise"), "abs": ("absolute", "elementwise"),
    "sqrt": ("sqrt", "elementwise"), "floor": ("floor", "elementwise"),
    "ceil": ("ceil", "elementwise"), "round": ("rint", "elementwise"),
    "sign": ("sign", "elementwise"),
    "exp": ("exp", "transcendental"), "expm1": ("expm1", "transcendental"),
    "exp2": ("exp2", "transcendental"), "log": ("log", "transcendental"),
    "log1p": ("log1p", "transcendental"), "log2": ("log2", "transcendental"),
    "sin": ("sin", "transcendental"), "cos": ("cos", "transcendental"),
    "tan": ("tan", "transcendental"), "tanh": ("tanh", "transcendental"),
    "sinh": ("sinh", "transcendental"), "cosh": ("cosh", "transcendental"),
    "atan": ("arctan", "transcendental"),
    "isnan": ("isnan", "compare"), "isinf": ("isinf", "compare"),
    "isfinite": ("isfinite", "compare"), "logical_not": ("logical_not", "compare"),
}
BINARY = {
    "add": ("add", "elementwise"), "sub": ("subtract", "elementwise"),
    "mul": ("multiply", "elementwise"), "div": ("true_divide", "elementwise"),
    "max": ("maximum", "elementwise"), "min": ("minimum", "elementwise"),
    "pow": ("power", "transcendental"), "atan2": ("arctan2", "transcendental"),
    "lt": ("less", "compare"), "le": ("less_equal", "compare"),
    "gt": ("greater", "compare"), "ge": ("greater_equal", "compare"),
    "eq": ("equal", "compare"), "ne": ("not_equal", "compare"),
    "logical_and": ("logical_and", "compare"), "logical_or": ("logical_or", "compare"),
    "logical_xor": ("logical_xor", "compare"),
    # NumPy's npy_divmod (fmod-based, with a correction step): no faithful decomposition into
    # the other primitives, so transforms must give these a rule of their own.
    "floor_divide": ("floor_divide", "elementwise"), "remainder": ("remainder", "elementwise"),
}
for _name, (_uf, _kind) in {**UNARY, **BINARY}.items():
    Primitive(_name, _ufunc(_uf), kind=_kind, doc=f"Elementwise numpy.{_uf}.")

Primitive("erf", lambda B: B.erf, kind="transcendental", doc="Error function (libm erf).")
Primitive("where", lambda B: B.xp.where, kind="compare", doc="where(cond, x, y).")


def _fma(B):
    if B.name == "numpy":
        from fpx.kernels.elementwise import fma
        return fma
    return lambda a, b, c: B.xp.fma(a, b, c)  # pragma: no cover - CuPy has cupy.fma


Primitive("fma", _fma, kind="elementwise", doc="a*b + c rounded once (IEEE fusedMultiplyAdd).")


def _cast(B):
    def cast(x, *, to):
        """``to`` is an fpx Format or a NumPy integer/bool dtype."""
        from fpx import formats
        if isinstance(to, formats.Format):
            if to.name == "tf32":  # no storage dtype: round once to 11 bits in float32's range
                x = B.xp.asarray(x)  # (not via float32 first: that would round twice)
                return formats.round(x.astype(B.xp.float64) if x.dtype.kind in "iub" else x,
                                     to, "rn")
            return B.xp.asarray(x).astype(to.dtype)
        return B.xp.asarray(x).astype(to)
    return cast


Primitive("cast", _cast, kind="cast",
          doc="Convert to a format with the backend's own conversion (NumPy's astype).")

def _matmul(B):
    if B.name == "numpy":                        # MKL through torch where it applies
        from fpx.kernels import blas
        return blas.matmul
    return B.xp.matmul


Primitive("matmul", _matmul, kind="matmul", doc="numpy.matmul semantics.")


def _reduction(name):
    def make(B):
        f = getattr(B.xp, name)
        return lambda x, *, axis=None, keepdims=False, dtype=None: (
            f(x, axis=axis, keepdims=keepdims) if dtype is None
            else f(x, axis=axis, keepdims=keepdims, dtype=dtype))
    return make


Primitive("reduce_sum", _reduction("sum"), kind="reduction",
          doc="Sum over axes (NumPy's pairwise summation; ``dtype`` is the accumulator).")
Primitive("reduce_prod", _reduction("prod"), kind="reduction", doc="Product over axes.")
Primitive("reduce_max", lambda B: lambda x, *, axis=None, keepdims=False: B.xp.max(
    x, axis=axis, keepdims=keepdims), kind="compare", doc="Maximum over axes (NaN propagates).")
Primitive("reduce_min", lambda B: lambda x, *, axis=None, keepdims=False: B.xp.min(
    x, axis=axis, keepdims=keepdims), kind="compare", doc="Minimum over axes (NaN propagates).")
Primitive("argmax", lambda B: lambda x, *, axis=None, keepdims=False: B.xp.argmax(
    x, axis=axis, keepdims=keepdims), kind="index", doc="Index of the maximum.")
Primitive("argmin", lambda B: lambda x, *, axis=None, keepdims=False: B.xp.argmin(
    x, axis=axis, keepdims=keepdims), kind="index", doc="Index of the minimum.")
Primitive("cumsum", lambda B: lambda x, *, axis, dtype=None: B.xp.cumsum(
    x, axis=axis, dtype=dtype), kind="reduction", doc="Sequential running sum along one axis.")

# -- movement: exact, no arithmetic --------------------------------------------------------
Primitive("sort", lambda B: lambda x, *, axis: B.xp.sort(x, axis=axis), kind="reduction",
          doc="Ascending sort along an axis (NaN last); exact: the values are permuted.")
Primitive("argsort", lambda B: lambda x, *, axis: B.xp.argsort(x, axis=axis, kind="stable"),
          kind="reduction", doc="The stable ascending sort's indices along an axis.")


def _reshape(B):
    if B.name == "numpy":                        # torch's threads copy where it applies
        from fpx.kernels import blas
        return lambda x, *, shape: blas.reshape(x, shape)
    return lambda x, *, shape: B.xp.reshape(x, shape)


Primitive("reshape", _reshape, kind="movement",
          doc="Reshape (C order).")
Primitive("transpose", lambda B: lambda x, *, axes: B.xp.transpose(x, axes), kind="movement",
          doc="Permute axes.")
Primitive("broadcast_to", lambda B: lambda x, *, shape: B.xp.broadcast_to(x, shape),
          kind="movement", doc="Broadcast to a shape.")
Primitive("getitem", lambda B: lambda x, *, index: x[index], kind="movement",
          doc="Basic and advanced indexing with a static index (slices, ints, None, Ellipsis, "
              "concrete integer/bool arrays); gather.")
Primitive("concatenate", lambda B: lambda *xs, axis: B.xp.concatenate(xs, axis=axis),
          kind="movement", doc="Join arrays along an axis.")
Primitive("pad", lambda B: lambda x, *, pad_width, value: B.xp.pad(
    x, pad_width, mode="constant", constant_values=value), kind="movement",
    doc="Constant padding.")

del _name, _uf, _kind
