"""Torch programs: :class:`TorchProgram` (a module's fpx function and the state it reads),
:func:`build` (the export path, or the dispatch-mode fallback), :func:`from_module`, and the
cache of built programs per module and input signature (:func:`program_for`)."""
from __future__ import annotations

import functools
import weakref

import numpy as np
import torch
import torch.utils._pytree as _pytree

from fpx.core import concrete
from fpx.interop.torch.convert import carried, to_array, to_tensor
from fpx.interop.torch.dispatch import dispatch_fn
from fpx.interop.torch.export import LOCK, FnModule, export_program, graph_fn
from fpx.interop.torch.table import UnmappedOpError, is_arr
from fpx.kernels import blas as _blas


def _on_torch_gemms(fn):
    """``fn`` with its GEMMs (values and the transforms' own) on torch's MKL, as the
    module's are (``fpx.kernels.blas``)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with _blas.torch_gemms():
            return fn(*args, **kwargs)
    return run


class TorchProgram:
    """An fpx program built from a torch module: ``fn(params, *args, **kwargs)`` over arrays,
    ``state`` the names of the module state it reads (parameters, buffers, constants),
    ``mode``: ``"export"`` or ``"dispatch"`` (the fallback), ``exported``: the
    ``ExportedProgram`` (export path), ``export_error``: why export was not used."""

    def __init__(self, fn, state, mode, exported=None, export_error=None, constants=None):
        self.fn, self.state, self.mode = _on_torch_gemms(fn), list(state), mode
        self.exported, self.export_error = exported, export_error
        self.constants = dict(constants or {})

    def params(self, f) -> dict:
        """The state of ``f`` (a module) as arrays, read now (zero-copy for CPU tensors); for
        a function, the constants export lifted from it."""
        if not isinstance(f, torch.nn.Module):
            return {k: to_array(v) for k, v in self.constants.items()}
        return {name: to_array(self.constants[name] if name in self.constants
                               else _state_tensor(f, name)) for name in self.state}

    def __repr__(self):
        return f"TorchProgram(mode={self.mode!r}, {len(self.state)} state tensors)"


def _state_tensor(module, name):
    try:
        return module.get_parameter(name)
    except AttributeError:
        pass
    try:
        return module.get_buffer(name)
    except AttributeError:
        pass
    obj = module
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def example(x):
    """A torch example input for export from a user input (a tensor, an array, or an fpx
    result leaf such as an ``Interval``: its value)."""
    x = carried(x)
    if isinstance(x, torch.Tensor):
        return x.detach()
    if is_arr(x):
        return to_tensor(concrete(x))
    return x


def build(f, args=(), kwargs=None, *, fallback="auto") -> TorchProgram:
    """Build the :class:`TorchProgram` of a module or function of torch tensors (no cache).
    ``fallback``: ``"auto"`` (dispatch mode when ``torch.export`` fails), ``"never"``,
    ``"always"``."""
    if fallback not in ("auto", "never", "always"):
        raise ValueError("fpx.interop.torch: fallback must be 'auto', 'never' or 'always'")
    module = f if isinstance(f, torch.nn.Module) else FnModule(f)
    ex_args, ex_kwargs = _pytree.tree_map(example, (tuple(args), dict(kwargs or {})))
    xp = np
    for t in _pytree.tree_leaves((ex_args, ex_kwargs)):
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            import cupy
            xp = cupy
    err = None
    if fallback != "always":
        try:
            ep = export_program(module, ex_args, ex_kwargs)
        except UnmappedOpError:
            raise
        except Exception as e:          # data-dependent control flow, unsupported Python, ...
            if fallback == "never":
                raise
            err = e
        else:
            from torch.export.graph_signature import InputKind
            state = [s.target for s in ep.graph_signature.input_specs
                     if s.kind in (InputKind.PARAMETER, InputKind.BUFFER,
                                   InputKind.CONSTANT_TENSOR)]
            consts = {s.target: ep.constants[s.target] for s in ep.graph_signature.input_specs
                      if s.target in ep.constants}
            return TorchProgram(graph_fn(ep, xp), state, "export", ep, None, consts)
    state = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]
    return TorchProgram(dispatch_fn(module, state), state, "dispatch", None, err)


def from_module(module, example_inputs=(), example_kwargs=None, *, fallback="auto"):
    """``(fn, params)``: the pure fpx function ``fn(params, *inputs, **kwargs)`` of ``module``
    (or of a function of torch tensors) and the module's parameters, buffers and lifted
    constants as arrays (a dict by state name; NumPy for CPU tensors, CuPy for CUDA).

    ``fn`` takes and returns NumPy/CuPy arrays (or tracers of any fpx transform): it is the
    program ``torch.export`` captured for inputs shaped like ``example_inputs``, interpreted with
    fpx ops (ATen ops -> :data:`ATEN_OPS`). When export fails (data-dependent control flow) and
    ``fallback="auto"``, ``fn`` runs the module eagerly under fpx's dispatch mode instead.
    """
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    prog = build(module, example_inputs, example_kwargs, fallback=fallback)
    return prog.fn, prog.params(module)


# -- the cache ---------------------------------------------------------------------------------
_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_FN_CACHE: dict = {}


def _signature(args, kwargs):
    """The key of a program in the cache: the inputs' structure, and each leaf's shape,
    dtype and device (a tensor or array), or its value (a Python scalar)."""
    leaves, spec = _pytree.tree_flatten((tuple(args), dict(kwargs or {})))
    sig = [str(spec)]
    for x in map(carried, leaves):
        if isinstance(x, torch.Tensor):
            sig.append(("T", tuple(x.shape), x.dtype, x.device.type))
        elif is_arr(x):
            c = concrete(x)
            sig.append(("A", tuple(c.shape), np.dtype(c.dtype).str, type(c).__module__))
        else:
            try:
                hash(x)
                sig.append(("S", type(x).__name__, x))
            except TypeError:
                sig.append(("O", id(x)))
    return tuple(sig)


def program_for(f, args=(), kwargs=None, *, fallback="auto") -> TorchProgram:
    """The cached :class:`TorchProgram` of ``f`` for inputs like ``args`` (keyed by the module
    or function, its training flag and the inputs' shapes/dtypes/devices)."""
    key = _signature(args, kwargs) + (getattr(f, "training", None), fallback)
    with LOCK:             # one build per key, and no thread reads a module mid-export
        try:
            per = _CACHE.setdefault(f, {})
        except TypeError:
            per = _FN_CACHE.setdefault(id(f), {})
        prog = per.get(key)
        if prog is None:
            prog = per[key] = build(f, args, kwargs, fallback=fallback)
        return prog
