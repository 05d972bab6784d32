"""The dispatch-mode fallback of the torch adapter, for programs ``torch.export`` rejects
(Python control flow on tensor values): the module runs eagerly under a
``TorchDispatchMode`` in which every ATen op runs in torch and in fpx, and the tensor torch
goes on with carries fpx's values."""
from __future__ import annotations

import numpy as np
import torch
import torch.utils._pytree as _pytree

from fpx import tree
from fpx.core import FpxError, concrete, current_interpreter
from fpx.core import is_cupy as _is_cupy
from fpx.interop.torch.convert import to_array, to_tensor
from fpx.interop.torch.table import (Ctx, Lazy, UnmappedOpError, conform, is_arr, layout_of,
                                     lookup, meta_of)

class _FpxMode(torch.utils._python_dispatch.TorchDispatchMode):
    """Runs each ATen op in torch *and* in fpx; the tensor torch continues with carries fpx's
    values (so Python control flow decides on what fpx computed)."""

    def __init__(self, xp=np):
        super().__init__()
        self.env: dict[int, tuple] = {}     # id(tensor) -> (tensor, fpx value)
        self.xp = xp
        self.stack: list[str] = []          # ops being decomposed (for error messages)

    def bind(self, t, v):
        self.env[id(t)] = (t, v)

    def value_of(self, t):
        if isinstance(t, torch.Tensor):
            e = self.env.get(id(t))
            if e is not None and e[0] is t:
                return e[1]
            return to_array(t)                          # a constant of the program
        return t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "profiler":        # optimizers' record_function: no values
            return func(*args, **kwargs)
        name, h = lookup(func)
        inplace = False
        if h is None and str(func.overloadpacket).endswith("_"):
            base = getattr(torch.ops.aten, str(func.overloadpacket)[5:-1], None)
            if base is not None:
                ov = getattr(base, func._overloadname, None)
                if ov is not None:
                    _, h = lookup(ov)
                    inplace = h is not None
        if h is None:
            decomp = _decomposition(func)
            if decomp is not None:
                self.stack.append(name)
                try:
                    with self:
                        return decomp(*args, **kwargs)
                finally:
                    self.stack.pop()
            if self.stack:
                raise UnmappedOpError(self.stack[0], f" (torch decomposes it into '{name}', "
                                      "which has none either; met under the dispatch-mode "
                                      "fallback)")
            raise UnmappedOpError(name, " (met while running the module eagerly under the "
                                        "dispatch-mode fallback)")
        if inplace:
            target = args[0]
            ptr = target.untyped_storage().data_ptr()
            aliases = [k for k, e in self.env.items()
                       if e[0] is not target and e[0].untyped_storage().data_ptr() == ptr]
            if target._base is not None or aliases:
                if not getattr(current_interpreter(), "plain_values", False):
                    raise FpxError(f"fpx.interop.torch: in-place '{name}' on a tensor that "
                                   "shares memory with another (a view): not supported by "
                                   "the fallback")
                # the transform's values are plain arrays, which the tensors hold (every
                # result is copied into its tensor): the aliases are read afresh from memory
                for k in aliases:
                    del self.env[k]
        # fpx's operands are read before torch runs the op, and an in-place op (an
        # optimizer's param.add_) must not change them first: operands that are zero-copy
        # arrays of the target's memory (a parameter, a lifted constant) are copied
        fargs = _pytree.tree_map(self.value_of, args)
        fkwargs = _pytree.tree_map(self.value_of, kwargs)
        if inplace and args[0].device.type == "cpu":
            mem = to_array(args[0])

            def snapshot(v):
                if isinstance(v, np.ndarray) and np.may_share_memory(v, mem):
                    return v.copy()
                return v
            fargs, fkwargs = _pytree.tree_map(snapshot, (fargs, fkwargs))
        out = func(*args, **kwargs)
        metas = meta_of(out) if isinstance(out, (torch.Tensor, list, tuple)) else []
        ctx = Ctx(name, metas, self.xp, [layout_of(a) for a in args])
        res = conform(h(ctx, *fargs, **fkwargs), ctx)
        if name in ("aten._local_scalar_dense.default", "aten.item.default"):
            return res
        if isinstance(out, torch.Tensor):
            self._store(func, out, res)
        elif isinstance(out, (list, tuple)):
            for o, r in zip(out, res):
                if isinstance(o, torch.Tensor):
                    self._store(func, o, r.get() if isinstance(r, Lazy) and r.fn else r)
        return out

    def _store(self, func, t, v):
        if isinstance(v, Lazy):
            return                   # torch's value stays; fpx raises if it is ever used
        self.bind(t, v)
        if not getattr(func, "is_view", False) and is_arr(v):
            c = concrete(v)
            if tuple(c.shape) == tuple(t.shape):
                if t.device.type == "cpu" and isinstance(c, np.ndarray) and not (
                        t.is_conj() or t.is_neg()):
                    dst = to_array(t)            # t's memory
                    if dst.dtype == c.dtype:     # NumPy's copy: torch's parallel copy_ can
                        np.copyto(dst, c)        # wait milliseconds on busy threads
                        return
                t.copy_(to_tensor(c, t.device).to(t.dtype))


def _decomposition(func):
    from torch._decomp import decomposition_table
    d = decomposition_table.get(func)
    if d is not None:
        return d
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(),
                                                      "CompositeImplicitAutograd"):
        return func.decompose
    return None


def dispatch_fn(module, state_names):
    """``fn(params, *args, **kwargs)`` running ``module`` eagerly under the fpx dispatch mode.
    A module runs under ``no_grad``; a function of tensors (:class:`FnModule`) in the
    caller's grad mode, so that a training step's ``loss.backward()`` runs autograd's
    backward ATen ops under the mode too, and its optimizer's in-place updates."""
    from fpx.interop.torch.export import FnModule
    is_fn = isinstance(module, FnModule)

    def fn(params, *args, **kwargs):
        xp = np
        for v in _pytree.tree_leaves((args, kwargs, params)):
            if is_arr(v) and _is_cupy(concrete(v)):
                import cupy
                xp = cupy
        mode = _FpxMode(xp)

        def tens(v):
            if is_arr(v):
                t = to_tensor(concrete(v))
                mode.bind(t, v)
                return t
            return v
        targs, tkwargs = _pytree.tree_map(tens, (args, kwargs))
        tparams = {k: tens(v) for k, v in params.items()}
        with torch.set_grad_enabled(is_fn and torch.is_grad_enabled()), mode:
            out = torch.func.functional_call(module, tparams, tuple(targs), tkwargs,
                                             strict=False)
        return tree.tree_map(mode.value_of, out)     # fpx containers: dataclasses too
    return fn

