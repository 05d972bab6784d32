"""The closed set of fpx primitives, each with its backend implementation and its kind.

Everything else (``fpx.numpy``'s long tail, ``fpx.nn``) is a composite built from these. The set
follows NumPy's semantics (dtype promotion, broadcasting, NaN propagation) so the eval
interpreter is NumPy (or CuPy) itself.

Each primitive declares its *kind* once, where it is defined below; :data:`KIND_OF` collects
them and is the one classification of operations in fpx: the precision policy's op kinds
(:func:`fpx.policy.kind_of`) and the stochastic transform's rounded/exact split are read from
it. The kinds (:data:`KINDS` maps each to the policy's op kind):

==============  ==============================================================================
exact           neg abs floor ceil round sign max min (the result is representable)
rounded         add sub mul div sqrt fma (IEEE: correctly rounded)
cast            cast (to a float format or an integer/bool dtype)
transcendental  exp expm1 exp2 log log1p log2 sin cos tan tanh sinh cosh atan erf pow atan2
                (libm: not correctly rounded; the policy states their errors)
divmod          floor_divide remainder (NumPy's npy_divmod)
compare         lt le gt ge eq ne isnan isinf isfinite logical_and logical_or logical_xor
                logical_not where
matmul          matmul (np.matmul semantics, incl. 1-D operands and broadcast batch dims)
reduction       reduce_sum reduce_prod cumsum (they accumulate)
select          reduce_max reduce_min argmax argmin sort argsort (values chosen or permuted)
movement        reshape transpose broadcast_to getitem concatenate pad
==============  ==============================================================================

Each implementation factory receives the :class:`~fpx.core.Backend` and returns the callable,
so NumPy ufuncs are called directly (no per-call indirection).
"""
from __future__ import annotations

from fpx.core import Primitive

__all__ = ["KINDS", "KIND_OF", "UFUNC_NAME", "of_kind"]

#: kind -> the precision policy's op kind (:data:`fpx.policy.OP_KINDS`), or None for kinds
#: that do no arithmetic a policy describes (comparisons, selection, movement, divmod).
KINDS: dict[str, str | None] = {
    "exact": "elementwise", "rounded": "elementwise", "cast": "elementwise",
    "transcendental": "transcendental", "divmod": None, "compare": None, "matmul": "matmul",
    "reduction": "reduction", "select": None, "movement": None,
}

#: primitive name -> its kind, in definition order: filled by :func:`_define` below.
KIND_OF: dict[str, str] = {}


def of_kind(*kinds: str) -> tuple[str, ...]:
    """The names of the primitives of these kinds, in definition order."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"fpx.primitives: unknown kind(s) {sorted(unknown)}; kinds: "
                         f"{', '.join(KINDS)}")
    return tuple(n for n, k in KIND_OF.items() if k in kinds)


def _define(name: str, impl, kind: str, doc: str) -> Primitive:
    if kind not in KINDS:
        raise ValueError(f"fpx.primitives: {name!r} has an unknown kind {kind!r}")
    KIND_OF[name] = kind
    return Primitive(name, impl, kind=kind, doc=doc)


def _ufunc(name: str):
    return lambda B: getattr(B.xp, name)


def _erf(B):
    return B.erf        # numba-vectorized libm erf on NumPy, cupyx.scipy.special.erf on CuPy


# kind -> {primitive name: NumPy ufunc name}; the order is the policy's display order
_ELEMENTWISE = {
    "exact": {"neg": "negative", "abs": "absolute", "floor": "floor", "ceil": "ceil",
              "round": "rint", "sign": "sign", "max": "maximum", "min": "minimum"},
    "rounded": {"add": "add", "sub": "subtract", "mul": "multiply", "div": "true_divide",
                "sqrt": "sqrt"},
    "transcendental": {
        "exp": "exp", "expm1": "expm1", "exp2": "exp2", "log": "log", "log1p": "log1p",
        "log2": "log2", "sin": "sin", "cos": "cos", "tan": "tan", "tanh": "tanh",
        "sinh": "sinh", "cosh": "cosh", "atan": "arctan", "erf": None, "pow": "power",
        "atan2": "arctan2"},
    "compare": {"lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal",
                "eq": "equal", "ne": "not_equal", "isnan": "isnan", "isinf": "isinf",
                "isfinite": "isfinite", "logical_and": "logical_and",
                "logical_or": "logical_or", "logical_xor": "logical_xor",
                "logical_not": "logical_not"},
    # NumPy's npy_divmod (fmod-based, with a correction step): no faithful decomposition into
    # the other primitives, so transforms must give these a rule of their own.
    "divmod": {"floor_divide": "floor_divide", "remainder": "remainder"},
}
#: primitive name -> the NumPy ufunc that implements it (erf has none: libm's, via numba)
UFUNC_NAME = {n: uf for table in _ELEMENTWISE.values() for n, uf in table.items()
              if uf is not None}

for _kind, _table in _ELEMENTWISE.items():
    for _name, _uf in _table.items():
        _define(_name, _erf if _uf is None else _ufunc(_uf), _kind,
                "Error function (libm erf)." if _uf is None else f"Elementwise numpy.{_uf}.")
_define("where", lambda B: B.xp.where, "compare", "where(cond, x, y).")


def _fma(B):
    if B.name == "numpy":
        from fpx.kernels.elementwise import fma
        return fma
    return lambda a, b, c: B.xp.fma(a, b, c)  # pragma: no cover - CuPy has cupy.fma


_define("fma", _fma, "rounded", "a*b + c rounded once (IEEE fusedMultiplyAdd).")


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


_define("cast", _cast, "cast",
        "Convert to a format with the backend's own conversion (NumPy's astype).")


def _matmul(B):
    if B.name == "numpy":                        # MKL through torch where it applies
        from fpx.kernels import blas
        return blas.matmul
    return B.xp.matmul


_define("matmul", _matmul, "matmul", "numpy.matmul semantics.")


# -- reductions: they accumulate ----------------------------------------------------------
def _reduction(name):
    def make(B):
        f = getattr(B.xp, name)
        return lambda x, *, axis=None, keepdims=False, dtype=None: (
            f(x, axis=axis, keepdims=keepdims) if dtype is None
            else f(x, axis=axis, keepdims=keepdims, dtype=dtype))
    return make


_define("reduce_sum", _reduction("sum"), "reduction",
        "Sum over axes (NumPy's pairwise summation; ``dtype`` is the accumulator).")
_define("reduce_prod", _reduction("prod"), "reduction", "Product over axes.")
_define("cumsum", lambda B: lambda x, *, axis, dtype=None: B.xp.cumsum(
    x, axis=axis, dtype=dtype), "reduction", "Sequential running sum along one axis.")


# -- select: exact, the values are chosen or permuted ---------------------------------------
def _over_axes(name):
    return lambda B: lambda x, *, axis=None, keepdims=False: getattr(B.xp, name)(
        x, axis=axis, keepdims=keepdims)


_define("reduce_max", _over_axes("max"), "select", "Maximum over axes (NaN propagates).")
_define("reduce_min", _over_axes("min"), "select", "Minimum over axes (NaN propagates).")
_define("argmax", _over_axes("argmax"), "select", "Index of the maximum.")
_define("argmin", _over_axes("argmin"), "select", "Index of the minimum.")
_define("sort", lambda B: lambda x, *, axis: B.xp.sort(x, axis=axis), "select",
        "Ascending sort along an axis (NaN last); exact: the values are permuted.")
_define("argsort", lambda B: lambda x, *, axis: B.xp.argsort(x, axis=axis, kind="stable"),
        "select", "The stable ascending sort's indices along an axis.")


# -- movement: exact, no arithmetic --------------------------------------------------------
def _reshape(B):
    if B.name == "numpy":                        # torch's threads copy where it applies
        from fpx.kernels import blas
        return lambda x, *, shape: blas.reshape(x, shape)
    return lambda x, *, shape: B.xp.reshape(x, shape)


_define("reshape", _reshape, "movement", "Reshape (C order).")
_define("transpose", lambda B: lambda x, *, axes: B.xp.transpose(x, axes), "movement",
        "Permute axes.")
_define("broadcast_to", lambda B: lambda x, *, shape: B.xp.broadcast_to(x, shape), "movement",
        "Broadcast to a shape.")
_define("getitem", lambda B: lambda x, *, index: x[index], "movement",
        "Basic and advanced indexing with a static index (slices, ints, None, Ellipsis, "
        "concrete integer/bool arrays); gather.")
_define("concatenate", lambda B: lambda *xs, axis: B.xp.concatenate(xs, axis=axis), "movement",
        "Join arrays along an axis.")
_define("pad", lambda B: lambda x, *, pad_width, value: B.xp.pad(
    x, pad_width, mode="constant", constant_values=value), "movement", "Constant padding.")

del _kind, _table, _name, _uf
