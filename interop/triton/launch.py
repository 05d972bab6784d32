"""Kernel launches under fpx: the scope that puts fpx's builder, reduce/scan and tensor hooks in
place of the interpreter's (process-wide objects: swapped in while any thread runs an fpx
program, restored when the last one leaves, and dispatching per thread so a plain interpreted
launch in another thread keeps the stock semantics), and the launch itself -- shadow memory
from the torch values fpx carries, the grid run with all programs at once where the kernel's
Python control flow allows (else one program at a time, in grid order), and the results
written back to those values. The interpreter's internals this module touches
(``interpreter_semantic.builder``, ``ReduceOps``/``ScanOps``, ``_patch_lang``,
``_patch_lang_tensor``, ``_implicit_cvt``, ``InterpretedFunction.run``, ``TensorHandle``) are
named here and in :mod:`~fpx.interop.triton.builder` only: the one place where Triton versions
differ (a ``_patch_lang`` that returns no restorable scope, as older ones do, is handled).
"""
from __future__ import annotations

import contextlib
import inspect
import threading
import types
import weakref

import numpy as np
import torch
import triton.language as tl
from torch.utils import _python_dispatch as _pd
from triton.runtime import interpreter as _interp

import fpx.numpy as fnp
from fpx.core import Tracer
from fpx.interop.torch.convert import to_array
from fpx.interop.triton import libdevice as _libdevice
from fpx.interop.triton import reduce as _reduce
from fpx.interop.triton.builder import (Diverged, FpxBuilder, UnsupportedTritonOpError,
                                        concrete, data)
from fpx.interop.triton.memory import Buffer, Memory

_LOCK = threading.Lock()
_LAUNCH_LOCK = threading.RLock()
_TLS = threading.local()
_STATE = {"depth": 0, "saved": None}
_STOCK_BUILDER = _interp.interpreter_builder


def _current_builder():
    return getattr(_TLS, "builder", None)


class _BuilderProxy:
    """``interpreter_semantic.builder`` while fpx runs: this thread's fpx builder during an fpx
    launch, the stock builder otherwise."""

    def __getattr__(self, name):
        b = _current_builder()
        return getattr(_STOCK_BUILDER if b is None else b, name)


def _reduce_ops(*a, **k):
    return (_reduce.ReduceOps if _current_builder() is not None else _STOCK["ReduceOps"])(*a, **k)


def _scan_ops(*a, **k):
    return (_reduce.ScanOps if _current_builder() is not None else _STOCK["ScanOps"])(*a, **k)


def _uniform(t, why):
    """The one value a scalar tensor has in every program run together (else :class:`Diverged`)."""
    c = concrete(data(t.handle), why)
    first = c.reshape(c.shape[0], -1)[0, 0] if c.ndim > 1 else c[0]
    if c.shape[0] > 1 and np.any(c != first):
        raise Diverged(why)
    return first


def _patch_lang_tensor(tensor, scope=None):
    """The interpreter's tensor hooks (``__index__``, ``__bool__``, ``.T``), each dispatching
    per thread: fpx's (program axis, :class:`Diverged`) during an fpx launch, Triton's
    otherwise (left behind harmlessly if a concurrent stock launch restores them late)."""
    if scope is None:                              # older triton: patched for good
        _STOCK["_patch_lang_tensor"](tensor)
        scope = types.SimpleNamespace(set_attr=setattr)
    else:
        _STOCK["_patch_lang_tensor"](tensor, scope)
    stock = {n: tensor.__dict__[n] for n in ("__index__", "__bool__", "T")}

    def _index(self):
        if _current_builder() is None:
            return stock["__index__"](self)
        return int(_uniform(self, "an index"))

    def _bool(self):
        if _current_builder() is None:
            return stock["__bool__"](self)
        return bool(_uniform(self, "bool() of a tensor")) if not self.shape else True

    def _T(self):
        if _current_builder() is None:
            return stock["T"].fget(self)
        x = data(self.handle)
        nd = np.ndim(x)
        perm = tuple(range(nd - 2)) + (nd - 1, nd - 2)
        x = fnp.transpose(x, perm) if isinstance(x, Tracer) else np.transpose(x, perm)
        shape = list(self.type.shape)
        shape[-1], shape[-2] = shape[-2], shape[-1]
        return tl.core.tensor(type(self.handle)(x, self.handle.dtype),
                              tl.core.block_type(self.dtype, shape))

    scope.set_attr(tensor, "__index__", _index)
    scope.set_attr(tensor, "__bool__", _bool)
    scope.set_attr(tensor, "T", property(_T))


def _float_atomic(op):
    """``TritonSemantic.atomic_max``/``atomic_min``: for floats Triton goes through integer
    bitcasts of the values, which fpx cannot follow; under an fpx launch a float max/min is
    one atomic of its own (exact: the same result in every order)."""
    def f(ptr, val, mask, sem, scope):
        stock = getattr(type(_interp.interpreter_semantic), f"atomic_{op}")
        b = _current_builder()
        s = _interp.interpreter_semantic
        if b is not None:
            p, v, m = s.atom_red_typechecking_impl(ptr, val, mask, op)
            if v.type.scalar.is_floating():
                return s.make_tensor(b.atomic_float(op, p.handle, v.handle, m.handle), v.type)
        return stock(s, ptr, val, mask, sem, scope)
    return f


def _libdevice_fn(name, stock):
    """A libdevice function: fpx's (:mod:`fpx.interop.triton.libdevice`) during an fpx launch,
    Triton's otherwise."""
    def f(*args, **kwargs):
        if _current_builder() is None:
            return stock(*args, **kwargs)
        return _libdevice.call(name, *args)
    f.__name__ = name
    return f


def _libdevice_modules():
    import importlib
    mods = []
    for name in ("triton.language.extra.libdevice", "triton.language.extra.cuda.libdevice"):
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            pass
    return mods


_STOCK = {"ReduceOps": _interp.ReduceOps, "ScanOps": _interp.ScanOps,
          "_patch_lang_tensor": _interp._patch_lang_tensor}
_ORIG_RUN = _interp.InterpretedFunction.run


def _run(self, *args, grid, warmup, **kwargs):
    """``InterpretedFunction.run`` while fpx runs: an fpx launch inside an fpx program on this
    thread, the stock launch otherwise. Launches are serialized meanwhile: Triton's interpreter
    patches ``triton.language`` for the duration of each launch, so two at once (in two
    threads) would undo each other's patches."""
    mode = _pd._get_current_dispatch_mode()
    with _LAUNCH_LOCK:       # the interpreter patches triton.language for each launch
        if not getattr(_TLS, "active", 0) or mode is None or not hasattr(mode, "value_of"):
            return _ORIG_RUN(self, *args, grid=grid, warmup=warmup, **kwargs)
        if warmup:
            return None
        for hook in self.pre_run_hooks:
            hook(*args, **kwargs)
        with _pd._disable_current_modes():
            launch(mode, self.rewrite(), self.arg_names, grid, args, kwargs)


@contextlib.contextmanager
def scope():
    """While inside (on this thread), Triton launches run under fpx (see the module docstring).
    Always restores what it replaced; nests and may be entered from several threads."""
    with _LOCK:
        if _STATE["depth"] == 0:
            sem = _interp.interpreter_semantic
            _STATE["saved"] = sem.builder
            sem.builder = _BuilderProxy()
            _interp.ReduceOps, _interp.ScanOps = _reduce_ops, _scan_ops
            _interp._patch_lang_tensor = _patch_lang_tensor
            _interp.InterpretedFunction.run = _run
            sem.atomic_max, sem.atomic_min = _float_atomic("max"), _float_atomic("min")
            saved = []
            for mod in _libdevice_modules():
                for name in _libdevice.NAMES:
                    stock = getattr(mod, name, None)
                    if stock is not None:
                        saved.append((mod, name, stock))
                        setattr(mod, name, _libdevice_fn(name, stock))
            _STATE["libdevice"] = saved
        _STATE["depth"] += 1
    _TLS.active = getattr(_TLS, "active", 0) + 1
    try:
        yield
    finally:
        _TLS.active -= 1
        with _LOCK:
            _STATE["depth"] -= 1
            if _STATE["depth"] == 0:
                _interp.interpreter_semantic.builder = _STATE["saved"]
                _interp.ReduceOps, _interp.ScanOps = _STOCK["ReduceOps"], _STOCK["ScanOps"]
                _interp._patch_lang_tensor = _STOCK["_patch_lang_tensor"]
                _interp.InterpretedFunction.run = _ORIG_RUN
                del _interp.interpreter_semantic.atomic_max
                del _interp.interpreter_semantic.atomic_min
                for mod, name, stock in _STATE.pop("libdevice", []):
                    setattr(mod, name, stock)


# ---- one launch ------------------------------------------------------------------------------
def _positions(t):
    """Element indices into the storage of each element of tensor ``t``."""
    pos = np.full((), t.storage_offset(), np.int64)
    for size, stride in zip(t.shape, t.stride()):
        pos = np.add.outer(pos, np.arange(size, dtype=np.int64) * stride)
    return pos


def _storage_key(t):
    return t.untyped_storage().data_ptr()


def _tensors(x, out):
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, tuple):
        for v in x:
            _tensors(v, out)
    elif hasattr(x, "base") and hasattr(x, "block_shape"):      # TensorDescriptor
        _tensors(x.base, out)
    elif hasattr(x, "data_ptr"):
        raise UnsupportedTritonOpError(f"argument of type {type(x).__name__}")
    return out


def _buffer(t, views, mode):
    st = t.untyped_storage()
    n = st.nbytes() // t.element_size()
    whole = torch.empty(0, dtype=t.dtype, device=t.device).set_(st, 0, (n,), (1,))
    flat = np.array(to_array(whole))
    pieces, imap, count = [flat], None, n
    for v_t in views:
        e = mode.env.get(id(v_t))
        if e is None or e[0] is not v_t:
            continue                   # not a value of the program: the storage holds it
        v = e[1]
        if v_t.is_contiguous() and v_t.storage_offset() == 0 and v_t.numel() == n and \
                len(views) == 1:
            return Buffer(st.data_ptr(), fnp.reshape(v, (-1,)) if isinstance(v, Tracer)
                          else np.ravel(v), flat.dtype)
        imap = np.arange(n) if imap is None else imap
        imap[_positions(v_t).ravel()] = count + np.arange(v_t.numel())
        pieces.append(fnp.reshape(v, (-1,)) if isinstance(v, Tracer) else np.ravel(v))
        count += v_t.numel()
    if imap is not None:
        flat = fnp.concatenate(pieces)[imap] if any(isinstance(p, Tracer) for p in pieces) \
            else np.concatenate([np.ravel(p) for p in pieces])[imap]
    return Buffer(st.data_ptr(), flat, np.dtype(flat.dtype))


def _constexprs(fn, names):
    from triton.runtime.jit import _normalize_ty
    ann = {k: _normalize_ty(v) for k, v in inspect.get_annotations(fn).items()}
    return {n for n in names if ann.get(n) == "constexpr"}


def launch(mode, fn, arg_names, grid, args, kwargs):
    """Run the rewritten kernel ``fn`` over ``grid`` with fpx semantics; the torch values of
    the fpx program (``mode``: the torch adapter's dispatch mode) are read and written."""
    spec = inspect.getfullargspec(fn)
    kwargs = {k: v for k, v in kwargs.items() if k in spec.args or k in spec.kwonlyargs}
    call = inspect.getcallargs(fn, *args, **kwargs)
    consts = _constexprs(fn, arg_names)
    tensors = []
    for name, v in call.items():
        if name not in consts:
            _tensors(v, tensors)
    by_storage: dict[int, list] = {}
    for t in tensors:
        if t.dtype.is_complex:
            raise UnsupportedTritonOpError(f"a {t.dtype} tensor argument")
        lst = by_storage.setdefault(_storage_key(t), [])
        if not any(u is t for u in lst):
            lst.append(t)
    memory = Memory()
    for views in by_storage.values():
        memory.add(_buffer(views[0], views, mode))
    builder = FpxBuilder(_STOCK_BUILDER, memory, (1, 1, 1), [np.zeros(1, np.int32)] * 3)
    prev = _current_builder()
    _TLS.builder = builder
    scope_ = _interp._patch_lang(fn)
    try:
        cargs = {n: v if n in consts else _interp._implicit_cvt(v) for n, v in call.items()}
        g = grid(cargs) if callable(grid) else grid
        g = tuple(int(x) for x in g) + (1,) * (3 - len(g))
        builder.grid_dim = g
        _run_grid(fn, cargs, builder, memory, g)
    finally:
        if scope_ is not None:                     # triton >= 3.9 restores triton.language
            scope_.restore()
        _TLS.builder = prev
    _write_back(mode, memory, by_storage)


#: kernels (rewritten functions) whose programs took different Python paths: run one by one
_SEQUENTIAL: "weakref.WeakSet" = weakref.WeakSet()


def _run_grid(fn, cargs, builder, memory, g):
    P = g[0] * g[1] * g[2]
    if P == 0:
        return
    if P == 1 or fn not in _SEQUENTIAL:
        b = np.arange(P)
        builder.pids = [(b // (g[1] * g[2])).astype(np.int32),
                        ((b // g[2]) % g[1]).astype(np.int32), (b % g[2]).astype(np.int32)]
        snap = memory.snapshot()
        try:
            fn(**cargs)
            return
        except Diverged:
            if P == 1:
                raise
            _SEQUENTIAL.add(fn)
            memory.restore(snap)
    for x in range(g[0]):
        for y in range(g[1]):
            for z in range(g[2]):
                builder.pids = [np.array([v], np.int32) for v in (x, y, z)]
                fn(**cargs)


def _write_back(mode, memory, by_storage):
    """Each tensor of a written storage takes its new fpx value in the dispatch mode (which
    every later torch op and launch reads). Torch's memory is not written: it may be the
    caller's (an input a kernel updates in place), and fpx never writes the caller's tensors."""
    written = {b.base: b for b in memory.buffers if b.written}
    if not written:
        return
    views = {k: list(v) for k, v in by_storage.items() if k in written}
    for t, _ in list(mode.env.values()):
        k = _storage_key(t)
        if k in views and not any(u is t for u in views[k]):
            views[k].append(t)
    for k, ts in views.items():
        flat = written[k].value()
        for t in ts:
            v = flat[_positions(t)] if isinstance(flat, Tracer) else np.take(flat, _positions(t))
            mode.bind(t, v)
