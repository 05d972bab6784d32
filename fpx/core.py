"""The fpx core: primitives, interpreters, tracers (Autodidax-style).

Every numerical step a program takes reaches fpx as ``bind(prim, *args, **params)``. ``bind``
hands the step to the *current* interpreter (a context variable). An interpreter either has a
rule for the primitive, or -- for a composite primitive -- runs the composite's decomposition
(which binds smaller primitives back to the same interpreter), or raises
:class:`UnsupportedOpError`. Rules compute their pieces by binding under ``self.parent``; the
root of every chain is an :class:`EvalInterpreter`, which runs the primitive's implementation for
the backend that owns the arrays (NumPy, CuPy).

A transform wraps its inputs in :class:`Tracer` objects that know their interpreter. A value
that is not a tracer of the interpreter processing an op -- a NumPy array, a Python scalar, or
a tracer of an *outer* transform -- is a constant for it ("lift by identity"), and is passed
down to the parent unchanged. That is all nesting needs: ``trace(trace(f))`` and, later,
``interval(reproducible(f))`` compose without special cases.

Reference: D. Maclaurin, M. Johnson et al., "Autodidax: JAX core from scratch" (2022/2024).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import os
import traceback
from typing import Any, Callable

import numpy as np

__all__ = [
    "FpxError", "UnsupportedOpError", "EscapedTracerError", "UnsupportedFunctionError",
    "Primitive", "Composite", "primitive", "composite", "PRIMITIVES", "bind",
    "Interpreter", "EvalInterpreter", "Tracer", "current_interpreter", "using",
    "concrete", "Backend", "backend_of", "get_backend", "register_backend",
]


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------
class FpxError(Exception):
    """Base class of fpx's own errors."""


class UnsupportedOpError(FpxError, NotImplementedError):
    """An interpreter met a primitive it has no rule for (never silently treated as exact)."""

    def __init__(self, prim: "Primitive", interp: "Interpreter"):
        name = type(interp).__name__
        super().__init__(
            f"fpx: primitive '{prim.name}' has no rule in {name} and no decomposition. "
            f"Register one with `{name}.def_rule('{prim.name}')(rule)` (see docs/architecture.md, "
            f"'Adding a rule'), or express the operation with fpx.numpy primitives.")
        self.prim, self.interpreter = prim, interp


class EscapedTracerError(FpxError, TypeError):
    """A traced value was converted to a plain array/number where fpx cannot follow it."""


class UnsupportedFunctionError(FpxError, TypeError):
    """A NumPy function without an fpx implementation was called on a tracer."""


def _user_frame() -> str:
    """The innermost stack frame outside fpx, as 'file:line: code' (for error messages)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for fr in reversed(traceback.extract_stack()[:-1]):
        fn = os.path.abspath(fr.filename)
        if not fn.startswith(here) and "numpy" not in fn.split(os.sep)[-3:-1]:
            return f"{fr.filename}:{fr.lineno}: {fr.line}"
    return "<unknown>"


# --------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------
class Backend:
    """One array library that executes primitives: its namespace ``xp`` and a few extras.

    ``impl_factory`` hooks let a primitive build a backend-specific callable once (cached).
    """

    def __init__(self, name: str, xp: Any, array_types: tuple, extras: dict | None = None):
        self.name, self.xp, self.array_types = name, xp, array_types
        self.extras = dict(extras or {})

    def __getattr__(self, item):  # extras such as ``erf``
        try:
            return self.__dict__["extras"][item]
        except KeyError:
            raise AttributeError(f"backend '{self.__dict__.get('name')}' has no '{item}'") from None

    def __repr__(self):
        return f"Backend({self.name!r})"


def _numpy_erf(x):
    from fpx.kernels.elementwise import erf
    return erf(x)


NUMPY = Backend("numpy", np, (np.ndarray, np.generic), {"erf": _numpy_erf})
_BACKENDS: dict[str, Backend] = {"numpy": NUMPY}
_TYPE_BACKEND: dict[type, Backend | None] = {
    np.ndarray: NUMPY, float: NUMPY, int: NUMPY, bool: NUMPY, complex: NUMPY,
    type(None): NUMPY, tuple: NUMPY, list: NUMPY, slice: NUMPY,
}


def register_backend(backend: Backend) -> None:
    """Make a backend selectable by ``get_backend(name)`` and by its array types."""
    _BACKENDS[backend.name] = backend
    for t in backend.array_types:
        _TYPE_BACKEND[t] = backend


def _cupy_backend() -> Backend | None:
    if "cupy" in _BACKENDS:
        return _BACKENDS["cupy"]
    try:
        import cupy
        import cupyx.scipy.special as cps
    except Exception:  # pragma: no cover - no GPU stack here
        return None
    b = Backend("cupy", cupy, (cupy.ndarray,), {"erf": cps.erf})  # pragma: no cover
    register_backend(b)  # pragma: no cover
    return b  # pragma: no cover


def get_backend(name: str) -> Backend:
    """The backend called ``name`` ("numpy" or "cupy")."""
    if name == "cupy":
        b = _cupy_backend()
        if b is None:
            raise FpxError("fpx: the 'cupy' backend needs CuPy and a CUDA device")
        return b
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"fpx: unknown backend {name!r}; known: {sorted(_BACKENDS)}") from None


def _resolve_type(t: type) -> Backend:
    if issubclass(t, Tracer):
        raise EscapedTracerError(
            f"fpx: a tracer reached the eval interpreter outside its transform (at {_user_frame()}). "
            "A traced value was stored and used after its transform returned, or a rule bound "
            "its own tracer under its parent.")
    if issubclass(t, (np.ndarray, np.generic, float, int, complex)):
        b = NUMPY
    elif t.__module__.split(".")[0] == "cupy":
        b = _cupy_backend() or NUMPY
    else:
        b = NUMPY
    _TYPE_BACKEND[t] = b
    return b


def backend_of(args) -> Backend:
    """The backend that owns the arrays in ``args`` (CuPy wins over NumPy/Python scalars)."""
    found = NUMPY
    for a in args:
        b = _TYPE_BACKEND.get(type(a))
        if b is None:
            b = _resolve_type(type(a))
        if b is not NUMPY:
            found = b
    return found


# --------------------------------------------------------------------------------------------
# Primitives
# --------------------------------------------------------------------------------------------
PRIMITIVES: dict[str, "Primitive"] = {}


class Primitive:
    """A named operation: the unit every interpreter understands.

    ``impl(backend) -> callable`` builds the executable for one backend; the result is cached.
    ``kind`` classifies the op; for fpx's own primitives it is one of
    :data:`fpx.primitives.KINDS` (exact, rounded, transcendental, matmul, reduction, ...), the
    table the precision policy and the transforms read.
    """

    __slots__ = ("name", "kind", "doc", "_make", "_cache", "__weakref__")

    def __init__(self, name: str, impl: Callable[[Backend], Callable] | None, *, kind: str,
                 doc: str = ""):
        if name in PRIMITIVES:
            raise ValueError(f"fpx: a primitive named {name!r} already exists")
        self.name, self.kind, self.doc = name, kind, doc
        self._make = impl
        self._cache: dict[str, Callable] = {}
        PRIMITIVES[name] = self

    decomposition = None

    def impl_for(self, backend: Backend) -> Callable:
        fn = self._cache.get(backend.name)
        if fn is None:
            if self._make is None:
                raise UnsupportedOpError(self, EVAL)
            fn = self._cache[backend.name] = self._make(backend)
        return fn

    def bind(self, *args, **params):
        return _CURRENT.get().process(self, args, params)

    __call__ = bind

    def __repr__(self):
        return f"<fpx primitive {self.name}>"


class Composite(Primitive):
    """A named op with a default decomposition into other primitives.

    A transform may give it a rule of its own (tight interval softmax, ABFT on conv); where it
    doesn't, the decomposition runs under that transform. ``impl`` (optional) is the backend's
    native routine (e.g. ``np.mean``), used by the eval interpreter so that eager fpx code is
    bit-identical to the NumPy spelling; the decomposition must describe the same arithmetic.
    """

    __slots__ = ("decomposition",)

    def __init__(self, name: str, decomposition: Callable, impl=None, *, kind: str = "composite",
                 doc: str = ""):
        super().__init__(name, impl, kind=kind, doc=doc or (decomposition.__doc__ or ""))
        self.decomposition = decomposition

    def impl_for(self, backend: Backend) -> Callable:
        if self._make is None:
            return self.decomposition
        return super().impl_for(backend)

    def __repr__(self):
        return f"<fpx composite {self.name}>"


def primitive(name: str, *, kind: str, doc: str = ""):
    """Decorator: register a primitive from its implementation factory ``impl(backend)``.

    >>> @primitive("softplus_exact", kind="transcendental")
    ... def _softplus(B):
    ...     return lambda x: B.xp.logaddexp(0, x)
    """
    def deco(make):
        return Primitive(name, make, kind=kind, doc=doc or (make.__doc__ or ""))
    return deco


def composite(name: str, *, impl: Callable[[Backend], Callable] | None = None, kind="composite"):
    """Decorator: register a composite from its decomposition (a function of fpx ops)."""
    def deco(decomp):
        return Composite(name, decomp, impl, kind=kind)
    return deco


def bind(prim: Primitive, *args, **params):
    """Apply ``prim`` under the current interpreter."""
    return _CURRENT.get().process(prim, args, params)


# --------------------------------------------------------------------------------------------
# Interpreters
# --------------------------------------------------------------------------------------------
class Interpreter:
    """Base interpreter. Subclasses hold their own ``rules`` table: name -> rule(interp, prim, *args,
    **params). A rule evaluates its pieces with ``self.bind_parent`` (or ``with using(parent)``).
    """

    rules: dict[str, Callable] = {}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls.rules = dict(cls.rules)  # each interpreter class gets its own table (inherits a copy)

    def __init__(self, parent: "Interpreter | None"):
        self.parent = parent
        adopt = getattr(parent, "adopt", None)
        if adopt is not None:          # a transform that refuses some nestings says so here
            adopt(self)

    @classmethod
    def def_rule(cls, *names: str):
        """Decorator registering ``rule(interp, prim, *args, **params)`` for the primitives (or
        composites) ``names``."""
        for name in names:
            if name not in PRIMITIVES:
                raise KeyError(f"fpx: no primitive named {name!r}")

        def deco(rule):
            for name in names:
                cls.rules[name] = rule
            return rule
        return deco

    def process(self, prim: Primitive, args: tuple, params: dict):
        rule = self.rules.get(prim.name)
        if rule is not None:
            return rule(self, prim, *args, **params)
        if prim.decomposition is not None:
            return prim.decomposition(*args, **params)
        raise UnsupportedOpError(prim, self)

    def bind_parent(self, prim: Primitive, *args, **params):
        token = _CURRENT.set(self.parent)
        try:
            return self.parent.process(prim, args, params)
        finally:
            _CURRENT.reset(token)

    def to_concrete(self, tracer: "Tracer", why: str):
        """The concrete value of one of this interpreter's tracers, for Python control flow,
        indices and conversions. ``why`` names the call (transforms may record instability)."""
        p = tracer.primal
        return p._interp.to_concrete(p, why) if isinstance(p, Tracer) else p

    def __repr__(self):
        return f"{type(self).__name__}(parent={type(self.parent).__name__ if self.parent else None})"


class EvalInterpreter(Interpreter):
    """Runs each primitive with the implementation of the backend that owns its arrays.

    ``backend=None`` dispatches per call (NumPy, or CuPy when a CuPy array is among the
    arguments); a fixed backend forces one.
    """

    def __init__(self, backend: Backend | None = None):
        super().__init__(None)
        self.backend = backend

    def process(self, prim, args, params):
        rule = self.rules.get(prim.name)
        if rule is not None:
            return rule(self, *args, **params)
        backend = self.backend or backend_of(args)
        fn = prim._cache.get(backend.name) or prim.impl_for(backend)
        try:
            return fn(*args, **params)
        except (ValueError, TypeError, IndexError) as e:
            if not isinstance(e, FpxError) and not getattr(e, "_fpx_noted", False):
                e.add_note(f"(in fpx primitive '{prim.name}' with operands "
                           f"{_describe_args(args)})")
                e._fpx_noted = True
            raise


def _describe_args(args) -> str:
    out = []
    for a in args:
        if hasattr(a, "shape") and hasattr(a, "dtype"):
            out.append(f"{a.dtype}{list(a.shape)}")
        else:
            out.append(type(a).__name__)
    return ", ".join(out)


EVAL = EvalInterpreter()
_CURRENT: contextvars.ContextVar[Interpreter] = contextvars.ContextVar("fpx_interpreter",
                                                                         default=EVAL)


def current_interpreter() -> Interpreter:
    """The interpreter that ``bind`` uses right now."""
    return _CURRENT.get()


@contextlib.contextmanager
def using(interp: Interpreter):
    """Make ``interp`` current inside the ``with`` block."""
    token = _CURRENT.set(interp)
    try:
        yield interp
    finally:
        _CURRENT.reset(token)


def is_cupy(x) -> bool:
    """A CuPy array or scalar (checked by module name: CuPy is imported only where it is used)."""
    return type(x).__module__.split(".")[0] == "cupy"


def to_host(x):
    """A NumPy array: a CuPy array's device-to-host copy, anything else through np.asarray."""
    return x.get() if is_cupy(x) else np.asarray(x)


def concrete(x):
    """Strip tracers down to the concrete array (no instability bookkeeping; internal use)."""
    while isinstance(x, Tracer):
        x = x.primal
    return x


_SCALAR_OPERATOR: contextvars.ContextVar[bool] = contextvars.ContextVar("fpx_scalar_operator",
                                                                        default=False)


def scalar_operator_active() -> bool:
    """True while a Python operator applies to scalar values only (Python numbers -- traced
    Python float or int inputs -- and NumPy scalars): the program computes that with the
    operator itself (Python's arithmetic, NumPy's scalar math: a weak Python result, libm's
    pow rather than NumPy's array loops), and an interpreter's value follows it."""
    return _SCALAR_OPERATOR.get()


@contextlib.contextmanager
def scalar_operator():
    """Within: :func:`scalar_operator_active` is True (``fpx.tracer_api``'s operators)."""
    token = _SCALAR_OPERATOR.set(True)
    try:
        yield
    finally:
        _SCALAR_OPERATOR.reset(token)


# --------------------------------------------------------------------------------------------
# Tracer
# --------------------------------------------------------------------------------------------
class Tracer:
    """A value threaded through user code by a transform.

    ``primal`` is the value under the parent interpreter (a concrete array, or a parent's
    tracer); shape and dtype come from it, so dynamic programs just run. Operators, NumPy
    ufuncs/functions and the array-API namespace all route to :mod:`fpx.numpy`.
    """

    __slots__ = ("_interp", "primal")
    __array_priority__ = 1000

    def __init__(self, interp: Interpreter, primal):
        self._interp = interp
        self.primal = primal

    # -- abstract value ---------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        p = self.primal
        return p.shape if type(p) is np.ndarray else tuple(np.shape(p))

    @property
    def dtype(self):
        """The primal's dtype; a traced Python scalar's is NumPy's for it (float64, int64)."""
        p = self.primal
        return p.dtype if hasattr(p, "dtype") else np.result_type(concrete(p))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized (0-d) fpx tracer")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d fpx tracer")
        return (self[i] for i in range(self.shape[0]))

    # -- conversions: concrete for scalars, a named error otherwise -------------------------
    def _scalar(self, why: str):
        if self.size != 1:
            raise EscapedTracerError(
                f"fpx: {why} on a traced array of shape {self.shape} (at {_user_frame()}); only "
                "size-1 values convert to Python numbers. Keep the computation in fpx.numpy.")
        return self._interp.to_concrete(self, why)

    def __bool__(self):
        return bool(self._scalar("bool()"))

    def __float__(self):
        return float(self._scalar("float()"))

    def __int__(self):
        return int(self._scalar("int()"))

    def __index__(self):
        v = self._scalar("operator.index()")
        if not np.issubdtype(np.asarray(v).dtype, np.integer):
            raise TypeError(f"fpx: only integer tracers can be used as an index, not {self.dtype}")
        return int(v)

    def __complex__(self):
        raise EscapedTracerError(f"fpx: complex() of a tracer (at {_user_frame()}); fpx "
                                 "handles real floating point only")

    def item(self, *args):
        if args:
            return self[args].item()
        return self._scalar(".item()").item()

    def tolist(self):
        raise EscapedTracerError(f"fpx: .tolist() on a tracer (at {_user_frame()}) leaves fpx; "
                                 "use fpx.numpy operations or return the array from the function")

    def __array__(self, dtype=None, copy=None):
        raise EscapedTracerError(
            f"fpx: np.asarray()/np.array() (the __array__ protocol) was called on a tracer of "
            f"{type(self._interp).__name__} at {_user_frame()}. The value would leave fpx "
            "untracked. Use fpx.numpy (or numpy functions fpx dispatches) instead, or return the "
            "array from the transformed function.")

    def __dlpack__(self, *a, **k):
        raise EscapedTracerError(f"fpx: __dlpack__ on a tracer (at {_user_frame()})")

    def __setitem__(self, key, value):
        raise TypeError("fpx: tracers are immutable; in-place assignment `x[i] = v` is not "
                        "supported. Use fpx.numpy.where(mask, v, x) or build the array with "
                        "concatenate/pad.")

    __hash__ = object.__hash__

    # The array API -- operators, NumPy's protocols, methods -- is installed by
    # fpx/tracer_api.py when fpx.numpy is imported: the core defines the tracer, the namespace
    # what it computes.

    def __repr__(self):
        return (f"{type(self).__name__}({type(self._interp).__name__}, "
                f"{self.dtype}{list(self.shape)})")


