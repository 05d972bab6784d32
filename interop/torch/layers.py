"""Running a module while recording what its layers see: the torch side of a layer-by-layer
analysis (``fpx.transforms.classify_layers``), which knows nothing of torch itself."""
from __future__ import annotations

import numpy as np
import torch
import torch.utils._pytree as _pytree

from fpx.interop.torch.convert import to_tensor


def child_layers(module) -> list[str]:
    """The names of ``module``'s direct children that can run (``[""]``, the module itself,
    for a leaf or a module whose children only hold parameters: ``ParameterList``,
    ``ParameterDict``)."""
    holders = (torch.nn.ParameterList, torch.nn.ParameterDict)
    return [n for n, c in module.named_children() if not isinstance(c, holders)] or [""]


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


def record_calls(module, names, args, kwargs):
    """Run ``module(*args, **kwargs)`` -- floating inputs converted to the dtype of the
    module's parameters -- and record every call of the submodules ``names`` (dotted; ``""``
    the module itself): ``[(name, submodule, args, kwargs, output)]`` in execution order."""
    dtype = _module_dtype(module)
    args, kwargs = _pytree.tree_map(lambda x: _cast_input(x, dtype), (tuple(args), kwargs))
    calls, handles = [], []
    for name in names:
        sub = module.get_submodule(name)

        def hook(mod, a, k, out, name=name):
            calls.append((name, mod, a, k, out))
        handles.append(sub.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            module(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return calls
