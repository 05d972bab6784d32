"""The adapter behind every transform for torch (``fpx.transform.adapt``): a module and its
inputs become a :class:`BoundProgram` over arrays, its outputs go back as tensors, and the
precision policy follows the inputs' device. fpx results among inputs and outputs (an
``Interval``) are recognised by their method ``_fpx_convert(convert)``, never by type."""
from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.utils._pytree as _pytree

from fpx import tree
from fpx.core import is_cupy as _is_cupy
from fpx.core import to_host
from fpx.interop.torch.convert import BF16, E4M3, E5M2, carried, to_array, to_tensor
from fpx.interop.torch.export import LOCK
from fpx.interop.torch.policy import default_policy
from fpx.interop.torch.program import example, program_for
from fpx.interop.torch.table import is_arr
from fpx.transform import Adapted


def _convolves(prog) -> bool:
    """Does the program call a convolution? (True when unknown: the dispatch fallback.)"""
    if prog.exported is None:
        return True
    return any("convolution" in str(n.target) for n in prog.exported.graph.nodes)


def _device_of(args, kwargs):
    for x in map(carried, tree.flatten((args, kwargs))[0]):
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def _to_fpx_leaf(x):
    """A user's input leaf as fpx takes it: a tensor as an array; an fpx result leaf (a leaf
    with ``_fpx_convert``, e.g. an ``Interval``) with its tensors as arrays."""
    if isinstance(x, torch.Tensor):
        return to_array(x)
    if hasattr(x, "_fpx_convert"):
        return x._fpx_convert(lambda v: to_array(v) if isinstance(v, torch.Tensor) else v)
    return x


def _to_user_leaf(x, device):
    """An output leaf as the user gets it: an array as a tensor on ``device``; an fpx result
    leaf with its arrays as such tensors."""
    def tensor(a):
        if is_arr(a) and (np.dtype(a.dtype).kind in "fiub" or np.dtype(a.dtype) in
                          (BF16, E4M3, E5M2)):
            return to_tensor(a, device)
        return a
    if hasattr(x, "_fpx_convert"):
        return x._fpx_convert(tensor)
    if isinstance(x, (np.ndarray, np.generic)) or _is_cupy(x):
        return tensor(x)
    return x


def adapt(f, args=(), kwargs=None, *, fallback="auto", policy=None) -> Adapted:
    """``fpx.transform.adapt`` for torch: see its docstring (the contract every transform
    relies on). ``fallback``: as :func:`build`'s; ``policy``: the default policy instead of
    torch's (``fpx.interop.triton`` gives its own for programs that launch kernels)."""
    kwargs = dict(kwargs or {})
    tri = _triton_launcher(f)
    if tri is not None:    # launches Triton kernels: eager, in fpx.interop.triton's scope
        fallback, policy = "always", tri.TRITON if policy is None else policy
    with LOCK:             # the parameters, not another thread's export's fake tensors
        prog = program_for(f, args, kwargs, fallback=fallback)
        params = prog.params(f)
    device = _device_of(args, kwargs)
    a, k = tree.tree_map(_to_fpx_leaf, (tuple(args), kwargs))
    examples = _pytree.tree_map(example, (tuple(args), kwargs))
    program = BoundProgram(prog, params, f, examples)
    if tri is None and prog.mode == "dispatch" and "triton" in sys.modules and \
            os.environ.get("TRITON_INTERPRET") in ("1", "true", "True"):
        from fpx.interop import triton as tri    # launches fpx did not see run under it too
    native = lambda: _native(f, args, kwargs, prog)                     # noqa: E731
    if tri is not None:    # (Triton's CPU interpreter is not the kernels' own arithmetic)
        program, native = tri.Scoped(program), None
    return Adapted(program, a, k, lambda out: tree.tree_map(
        lambda x: _to_user_leaf(x, device), out),
        policy if policy is not None else
        default_policy(device, device.type == "cuda" and _convolves(prog)), "torch", prog,
        native)


def _native(f, args, kwargs, prog):
    """``f`` as torch runs it, on the inputs' values (an ``Interval``'s value; arrays as
    tensors), in the caller's autograd mode (which picks some modules' kernels: an eval
    ``TransformerEncoderLayer`` takes its fused path under ``no_grad``): its outputs as arrays
    (``Adapted.native``). Inputs the program may change in place are cloned first, so the
    caller's tensors are not written, as by fpx's own run (export refuses programs that change
    their parameters or buffers)."""
    clone = prog.exported is None or any(
        s.kind.name == "USER_INPUT_MUTATION" for s in prog.exported.graph_signature.output_specs)
    a, k = _pytree.tree_map(lambda x: _native_input(x, clone), (tuple(args), kwargs))
    out = f(*a, **k)
    return tree.tree_map(lambda t: to_array(t.detach()) if isinstance(t, torch.Tensor) else t,
                         out)


def _native_input(x, clone):
    x = example(x)
    return x.clone() if clone and isinstance(x, torch.Tensor) else x


def _triton_launcher(f):
    """``fpx.interop.triton`` when ``f`` launches Triton kernels (triton already imported by
    the user's code), else None."""
    if "triton" not in sys.modules:
        return None
    from fpx.interop import triton as tri
    return tri if tri.launches_kernels(f) else None


class BoundProgram:
    """``fn(*inputs)``: a :class:`TorchProgram` with the module's parameters bound. Picklable
    when the module (or function) is: a worker process rebuilds the program from it and the
    example inputs (so process-pool executors can run it)."""

    def __init__(self, prog, params, f, examples):
        self.prog, self.params, self.f, self.examples = prog, params, f, examples
        self.__name__ = type(f).__name__ if isinstance(f, torch.nn.Module) else \
            getattr(f, "__name__", "torch_function")

    def __call__(self, *xs, **kw):
        try:
            return self.prog.fn(self.params, *xs, **kw)
        except TypeError as e:
            if "expected np.ndarray" not in str(e):
                raise
            raise TypeError(
                f"fpx: {self.__name__} is run as a torch program, and every array input reaches "
                "it as a torch tensor (NumPy arrays among its inputs are converted), so a NumPy "
                "call on an input such as torch.from_numpy fails: pass torch tensors, or use "
                f"torch.as_tensor inside it ({e})") from None

    def on_host(self):
        """The program with its parameters copied to the host (CUDA -> NumPy): where the
        interval rules run for CuPy inputs (docs/interval.md, "CuPy arrays")."""
        params = {k: to_host(v) if _is_cupy(v) else v for k, v in self.params.items()}
        return BoundProgram(self.prog, params, self.f, self.examples)

    def __reduce__(self):
        return (_rebuild_bound, (self.f, self.examples, self.params, self.prog.mode))

    def __repr__(self):
        return f"BoundProgram({self.__name__}, {self.prog!r})"


def _rebuild_bound(f, examples, params, mode):
    args, kwargs = examples
    prog = program_for(f, args, kwargs, fallback="always" if mode == "dispatch" else "auto")
    return BoundProgram(prog, params, f, examples)
