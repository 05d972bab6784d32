"""Running a module while recording what its layers see: the torch side of a layer-by-layer
analysis (``fpx.transforms.classify_layers``), which knows nothing of torch itself."""
from __future__ import annotations

import numpy as np
import torch
import torch.utils._pytree as _pytree

from fpx.interop.torch.convert import to_tensor


_HOLDERS = (torch.nn.ParameterList, torch.nn.ParameterDict)
_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


# modules whose forward is functional code on their children's weights: the children never run
_FUNCTIONAL = (torch.nn.MultiheadAttention,)


def _running_children(module) -> list[tuple[str, torch.nn.Module]]:
    """``module``'s direct children that can run: not the parameter holders
    (``ParameterList``, ``ParameterDict``), nor ``MultiheadAttention``'s ``out_proj``."""
    if isinstance(module, _FUNCTIONAL):
        return []
    return [(n, c) for n, c in module.named_children() if not isinstance(c, _HOLDERS)]


def child_layers(module) -> list[str]:
    """The names of ``module``'s direct children that can run (``[""]``, the module itself,
    for a leaf or a module whose children only hold parameters)."""
    return [n for n, _ in _running_children(module)] or [""]


def fine_layers(module) -> tuple[list[str], list[str]]:
    """``(fine, composite)``: the dotted names of every submodule (``""`` the module itself)
    that may run, split in two. Fine: a module with no children that run -- a Conv, a norm,
    an LSTM, ``MultiheadAttention``, an activation, a module whose parameters live in
    ``ParameterList``/``ParameterDict`` children. Composite: every other module but the plain
    containers (``Sequential``, ``ModuleList``, ``ModuleDict`` without parameters of their
    own, whose forward adds no arithmetic) -- code of its own runs between its sublayers
    (attention scores, a residual add, a ViT's class token and position embedding)."""
    fine, composite = [], []
    plain = {c.forward for c in _CONTAINERS}
    for name, m in module.named_modules():
        if isinstance(m, _HOLDERS):
            continue
        if not _running_children(m):
            fine.append(name)
        elif (next(m.parameters(recurse=False), None) is not None
              or not isinstance(m, _CONTAINERS) or type(m).forward not in plain):
            composite.append(name)
    return fine, composite


def _module_dtype(m):
    for p in list(m.parameters()) + list(m.buffers()):
        if p.is_floating_point():
            return p.dtype
    return None


def _cast_input(x, dtype):
    if isinstance(x, np.ndarray):        # NumPy inputs among torch ones: as tensors
        x = to_tensor(x)
    if isinstance(x, torch.Tensor) and x.is_floating_point() and dtype is not None:
        return x.to(dtype)
    return x


def _snapshot(tree):
    """A copy of every tensor in ``tree``: what a layer saw or produced, kept by value, since
    the program may change it in place afterwards (``ReLU(inplace=True)`` after a batch norm,
    ``out += identity`` in a residual block)."""
    return _pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


def record_calls(module, names, args, kwargs):
    """Run ``module(*args, **kwargs)`` -- floating inputs converted to the dtype of the
    module's parameters -- and record every call of the submodules ``names`` (dotted; ``""``
    the module itself): ``[(name, submodule, args, kwargs, output)]`` in the order the calls
    return. Inputs are copied as the call starts and outputs as it returns, so in-place ops
    elsewhere in the program (or in the layer itself, on its inputs) do not change them."""
    dtype = _module_dtype(module)
    args, kwargs = _pytree.tree_map(lambda x: _cast_input(x, dtype), (tuple(args), kwargs))
    calls, handles, started = [], [], {}
    for name in names:
        sub = module.get_submodule(name)

        def pre_hook(mod, a, k, name=name):
            started.setdefault(name, []).append(_snapshot((a, k)))

        def hook(mod, a, k, out, name=name):
            a, k = started[name].pop()
            calls.append((name, mod, a, k, _snapshot(out)))
        handles.append(sub.register_forward_pre_hook(pre_hook, with_kwargs=True))
        handles.append(sub.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            module(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return calls
