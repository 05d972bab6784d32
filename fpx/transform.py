"""The plumbing every transform shares: adapt a program from another framework, wrap its
inputs as tracers of a new interpreter, run it with that interpreter current, and unwrap the
outputs (:func:`transformed`, :func:`run`, :func:`adapt`).

Which leaves become tracers: arrays (NumPy, CuPy, NumPy scalars) of a real floating-point,
integer or bool dtype, tracers of enclosing transforms, and what a transform accepts besides
(:func:`run`'s ``accepts``: the interval transform's Intervals and Python floats). Other Python
scalars stay constants (as weakly-typed values they follow NumPy's promotion rules). Complex,
object and string arrays are rejected with a clear error.
"""
from __future__ import annotations

import functools
import sys
from typing import Callable

import numpy as np

from fpx import tree
from fpx.core import Interpreter, Tracer, current_interpreter, is_cupy, to_host, using

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
        f: Callable, args: tuple, kwargs: dict,
        unwrap: Callable[[Interpreter, object], object] | None = None, *,
        accepts: Callable[[object], bool] | None = None):
    """Run ``f(*args, **kwargs)`` under a fresh interpreter: the one way every transform runs
    a program. Returns ``(interpreter, outputs)`` (a pytree like ``f``'s).

    * ``interp_factory(parent)`` builds the interpreter; its parent is the current one.
    * Input leaves become tracers through ``make_tracer(interp, leaf)``: every array leaf
      (:func:`is_array_leaf`; its dtype checked by :func:`check_dtype` first) and every leaf
      for which ``accepts(leaf)`` is true (interval's ``Interval`` inputs, say). Other leaves
      stay constants.
    * ``unwrap(interp, leaf)`` turns each output leaf that is an array leaf (the interpreter's
      own tracers -- :func:`own` -- among them) or a Python bool/int/float into the transform's
      result; other leaves are returned as they are. Without ``unwrap`` the outputs keep the
      interpreter's tracers.
    """
    interp = interp_factory(current_interpreter())
    leaves, td = tree.flatten((args, kwargs))
    wrapped = []
    for i, x in enumerate(leaves):
        if is_array_leaf(x):
            check_dtype(x, f"input leaf {i} of {getattr(f, '__name__', 'f')}")
            wrapped.append(make_tracer(interp, x))
        elif accepts is not None and accepts(x):
            wrapped.append(make_tracer(interp, x))
        else:
            wrapped.append(x)
    a, k = tree.unflatten(td, wrapped)
    with using(interp):
        out = f(*a, **k)
    if unwrap is None:
        return interp, out
    o_leaves, o_td = tree.flatten(out)
    return interp, tree.unflatten(o_td, [
        unwrap(interp, x) if is_array_leaf(x) or isinstance(x, (bool, int, float)) else x
        for x in o_leaves])


def transformed(f: Callable, body: Callable[["Adapted"], object],
                check: Callable[[tuple, dict], None] | None = None) -> Callable:
    """The function a transform hands back for the user's ``f``: each call adapts ``f`` and
    its inputs (:func:`adapt`: torch modules and tensors become an fpx program on arrays),
    computes ``body(ad)`` -- the transform's outputs, usually through :func:`run` -- and
    returns them in the user's types (``ad.to_user``). ``check(args, kwargs)``, if given, sees
    the user's inputs first."""
    @wraps(f)
    def call(*args, **kwargs):
        if check is not None:
            check(args, kwargs)
        ad = adapt(f, args, kwargs)
        return ad.to_user(body(ad))
    return call


def on_host(f, leaves):
    """``(f, leaves)`` for a transform whose kernels are CPU code, given inputs on the GPU:
    CuPy leaves copied to the host (exact), and a torch program's CUDA parameters with them
    (``f.on_host()``). The transforms run there and return CuPy results (docs/interval.md,
    "CuPy arrays")."""
    f = f.on_host() if hasattr(f, "on_host") else f
    return f, [to_host(x) if is_cupy(x) else x for x in leaves]


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


# --------------------------------------------------------------------------------------------
# Adapters: programs written in another framework (torch modules and functions)
# --------------------------------------------------------------------------------------------
def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def as_array(x):
    """A NumPy (CPU) or CuPy (CUDA) array for a torch tensor, sharing memory where the dtype
    allows (bfloat16/float8 through a bit-view into ml_dtypes); anything else unchanged.
    Imports torch only when handed a torch object."""
    if _is_torch(x) and hasattr(x, "dtype") and hasattr(x, "detach"):
        from fpx.interop.torch import to_array
        return to_array(x)
    return x


class Adapted:
    """What a transform runs for a user's ``f`` on ``args``: see :func:`adapt`.

    ``fn``: a function of NumPy/CuPy arrays (what the transform traces); ``args``/``kwargs``:
    the user's inputs with framework tensors replaced by arrays (and fpx ``Interval`` inputs
    kept, their ``value`` converted); ``to_user(out)``: the transform's outputs (a pytree) in the
    user's types; ``policy``: the precision policy that describes the framework's arithmetic on
    the inputs' device, used where the user gave none (``None``: the transform's default);
    ``framework``: ``None`` (NumPy/CuPy program, nothing converted) or ``"torch"``;
    ``program``: the framework adapter's own object (``fpx.interop.torch.TorchProgram``);
    ``native()``: the user's program run by its framework on the inputs' values, its outputs
    as arrays: what a transform whose ``value`` is the program's own output takes it from
    (``None`` where ``fn`` is the user's program itself, or where the framework's run is not
    the program's arithmetic: Triton kernels under Triton's CPU interpreter).
    """

    __slots__ = ("fn", "args", "kwargs", "to_user", "policy", "framework", "program", "native")

    def __init__(self, fn, args, kwargs, to_user=None, policy=None, framework=None,
                 program=None, native=None):
        self.fn, self.args, self.kwargs = fn, tuple(args), dict(kwargs or {})
        self.to_user = to_user if to_user is not None else (lambda out: out)
        self.policy, self.framework, self.program = policy, framework, program
        self.native = native

    def __repr__(self):
        return f"Adapted({getattr(self.fn, '__name__', self.fn)!r}, framework={self.framework!r})"


def adapt(f, args=(), kwargs=None) -> Adapted:
    """The one entry every transform calls on its function before tracing it.

    * ``f`` a plain function with NumPy/CuPy (or fpx) inputs: returned unchanged
      (``framework=None``; ``to_user`` is the identity).
    * ``f`` a ``torch.nn.Module``, or any callable given at least one ``torch.Tensor`` among
      its inputs (a function of torch tensors): ``fn`` is the fpx program that
      :mod:`fpx.interop.torch` builds from it (``torch.export`` + core-ATen interpreter, or the
      ``TorchDispatchMode`` fallback for programs ``export`` rejects), with the module's
      parameters and buffers bound as constants; ``args`` hold NumPy arrays (CPU tensors,
      zero-copy) or CuPy arrays (CUDA tensors, via DLPack); ``to_user`` turns array leaves of
      the outputs back into torch tensors of the same dtype (float64/32/16, bfloat16, float8)
      on the inputs' device, and ``Interval`` leaves into ``Interval``s whose ``value`` is such a
      tensor (``lo``/``hi`` stay float64 arrays); a leaf object with a method
      ``_fpx_convert(convert)`` is replaced by what it returns (``convert`` maps one array to
      the user's type), so other transforms' result types can opt in; other leaves pass through.
      ``policy`` is ``fpx.interop.torch``'s policy for torch's CPU kernels (``"cuda"``/``"tf32"``
      for CUDA inputs, following ``torch.backends.cuda.matmul.allow_tf32``).

    Torch is imported only when ``f`` or an input is a torch object, so fpx itself never needs
    it. The built program is cached per module/function and input signature (shapes, dtypes,
    devices); parameters are read afresh on every call.
    """
    kwargs = kwargs or {}
    torch = sys.modules.get("torch")
    if torch is not None:
        is_module = isinstance(f, torch.nn.Module)
        if is_module or _has_torch_leaf((args, kwargs)):
            from fpx.interop import torch as _fit
            return _fit.adapt(f, args, kwargs)
    return Adapted(f, args, kwargs)


def _has_torch_leaf(x) -> bool:
    for leaf in tree.flatten(x)[0]:
        if _is_torch(leaf) or _is_torch(getattr(leaf, "value", None)):
            return True
    return False
