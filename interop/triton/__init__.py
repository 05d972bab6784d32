"""``fpx.interop.triton``: Triton kernels, unchanged, under every fpx transform.

    def launch(x, y):                          # allocates with torch, launches, returns
        out = torch.empty_like(x)
        kernel[grid](x, y, out, x.numel(), BLOCK=128)
        return out

    iv = fpx.interval(launch)(x, y)            # sound bounds of every output element
    v = fpx.classify(launch, reference, x, y)  # round-off or bug
    s = fpx.stochastic(launch, "sr", samples=8)(x, y)

A function of torch tensors that launches ``@triton.jit`` kernels is run eagerly under the
torch adapter's dispatch mode (its torch ops as fpx ops), and each launch runs in Triton's
interpreter with fpx's builder in place of the interpreter's (``TRITON_INTERPRET=1`` must be
set before triton is imported): every op of the kernel is an fpx op, so each transform applies
its own rules. Tensors reach kernels through a shadow memory holding fpx's values
(:mod:`~fpx.interop.triton.memory`), and what kernels store flows back to the torch code.

==========  ====================================================================================
module      owns
==========  ====================================================================================
builder     the builder: each Triton op as an fpx op, the program axis, errors
dot         ``tl.dot`` with the GPU's input precision and accumulation
reduce      ``tl.reduce`` / ``tl.associative_scan`` (sum, max, min, argmax, cumsum, custom)
memory      shadow memory: loads, stores, masks, atomics
launch      the swap scope (thread-safe, always restored) and one launch over its grid
policy      :data:`TRITON`, the default policy of programs that launch kernels
==========  ====================================================================================
"""
from __future__ import annotations

import os
import sys
import types

from fpx.interop.triton.builder import UnsupportedTritonOpError
from fpx.interop.triton.launch import scope
from fpx.interop.triton.policy import TRITON

__all__ = ["launches_kernels", "scope", "Scoped", "TRITON", "UnsupportedTritonOpError"]


def _check_interpret():
    if os.environ.get("TRITON_INTERPRET", "0") not in ("1", "true", "True"):
        from fpx.core import FpxError
        raise FpxError("fpx.interop.triton: set TRITON_INTERPRET=1 before triton is imported; "
                       "fpx runs kernels in Triton's interpreter with its own semantics")


def _is_kernel(obj) -> bool:
    from triton.runtime.jit import KernelInterface
    return isinstance(obj, KernelInterface)


def launches_kernels(f, _depth=2) -> bool:
    """Does ``f`` (a function, a module's ``forward``) name a Triton kernel -- among its globals
    (or their attributes: ``kernels.matmul``), closure cells or default arguments, a module's
    attributes, or those of the functions it names (two levels)?"""
    import torch
    if isinstance(f, torch.nn.Module):
        if any(_is_kernel(v) for v in vars(f).values()):                   # self.kernel
            return True
        f = type(f).forward
    f = getattr(f, "__func__", f)
    code = getattr(f, "__code__", None)
    if code is None:
        return False
    seen = []
    g = getattr(f, "__globals__", {})
    names = set()

    def walk(c):
        names.update(c.co_names)
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                walk(k)
    walk(code)
    seen += [g[n] for n in names if n in g]
    seen += [sys.modules[n] for n in names if n in sys.modules]      # imported in the body
    seen += [getattr(m, n) for m in list(seen) if _user_module(m)          # mykernels.matmul
             for n in names if hasattr(m, n)]
    seen += [c.cell_contents for c in (f.__closure__ or ()) if _has_contents(c)]
    seen += list(f.__defaults__ or ())
    for obj in seen:
        if _is_kernel(obj):
            return True
        if _depth > 0 and isinstance(obj, types.FunctionType) and launches_kernels(obj,
                                                                                   _depth - 1):
            return True
    return False


_LIBRARIES = frozenset({"torch", "numpy", "triton", "fpx", "ml_dtypes", "scipy", "builtins",
                        "math", "functools", "typing", "collections", "os", "sys"})


def _user_module(m) -> bool:
    """A module whose attributes may hold kernels (not a library's: their lazy attributes
    would import things)."""
    return isinstance(m, types.ModuleType) and m.__name__.split(".")[0] not in _LIBRARIES


def _has_contents(cell):
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


class Scoped:
    """A program run inside :func:`scope` (picklable when the program is): what the torch
    adapter runs for a function that launches kernels (its dispatch-mode program, with
    :data:`TRITON` as the default policy)."""

    def __init__(self, fn):
        _check_interpret()
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "triton_launch")

    def __call__(self, *args, **kwargs):
        with scope():
            return self.fn(*args, **kwargs)

    def on_host(self):
        return Scoped(self.fn.on_host()) if hasattr(self.fn, "on_host") else self
