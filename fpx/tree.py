"""Minimal pytrees: nested tuples, lists, dicts (and their subclasses), namedtuples and
dataclass instances of leaves (like jax.tree_util).

Transforms accept and return pytrees, so ``f(params: dict, x)`` and multi-output functions work,
and a model's output container (an ``OrderedDict``, a dataclass such as transformers'
``ModelOutput``) comes back as the same container of results. Other containers can be
registered with :func:`register_node`.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

_NODES: dict[type, tuple[Callable, Callable]] = {}


def register_node(cls: type, flatten: Callable[[Any], tuple[list, Any]],
                  unflatten: Callable[[Any, list], Any]) -> None:
    """Make ``cls`` a pytree node: ``flatten(x) -> (children, aux)``,
    ``unflatten(aux, children) -> x``."""
    _NODES[cls] = (flatten, unflatten)


def _is_namedtuple(x):
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def flatten(tree) -> tuple[list, Any]:
    """Leaves in order and a structure description for :func:`unflatten`."""
    leaves: list = []
    return leaves, _flatten(tree, leaves)


# The recursions are module-level functions with explicit arguments, not closures over
# themselves: a nested ``def rec`` that calls itself is a reference cycle (function -> cell ->
# function) holding the leaves -- a transform's tracers and their multi-MB bounds then lived
# until the cyclic garbage collector ran (the resident size of an interval matmul loop grew
# ~275 MB before levelling off).
def _flatten(x, leaves):
    t = type(x)
    if t in _NODES:
        children, aux = _NODES[t][0](x)
        return ("node", t, aux, [_flatten(c, leaves) for c in children])
    if t is tuple or t is list:
        return (t.__name__, [_flatten(c, leaves) for c in x])
    if _is_namedtuple(x):
        return ("namedtuple", t, [_flatten(c, leaves) for c in x])
    if t is dict:
        return ("dict", list(x.keys()), [_flatten(v, leaves) for v in x.values()])
    if isinstance(x, dict):         # OrderedDict, ModelOutput (a dict and a dataclass)
        return ("dict_like", x, list(x.keys()), [_flatten(v, leaves) for v in x.values()])
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        names = [f.name for f in dataclasses.fields(x)]
        return ("dataclass", x, names, [_flatten(getattr(x, n), leaves) for n in names])
    if x is None:
        return ("none",)
    leaves.append(x)
    return ("leaf",)


def unflatten(treedef, leaves) -> Any:
    """Inverse of :func:`flatten`."""
    return _unflatten(treedef, iter(leaves))


def _unflatten(d, it):
    kind = d[0]
    if kind == "leaf":
        return next(it)
    if kind == "none":
        return None
    if kind == "tuple":
        return tuple(_unflatten(c, it) for c in d[1])
    if kind == "list":
        return [_unflatten(c, it) for c in d[1]]
    if kind == "namedtuple":
        return d[1](*[_unflatten(c, it) for c in d[2]])
    if kind == "dict":
        return dict(zip(d[1], [_unflatten(c, it) for c in d[2]]))
    if kind == "dict_like":
        out = _blank_copy(d[1])     # the same class and extra state, the values replaced
        for k, c in zip(d[2], d[3]):
            out[k] = _unflatten(c, it)
        return out
    if kind == "dataclass":
        out = copy.copy(d[1])
        for n, c in zip(d[2], d[3]):
            object.__setattr__(out, n, _unflatten(c, it))     # frozen dataclasses too
        return out
    return _NODES[d[1]][1](d[2], [_unflatten(c, it) for c in d[3]])


def _blank_copy(t):
    """A shallow copy of the dict subclass ``t`` made without calling its constructor: a
    transformers ``ModelOutput`` rebuilds itself from its field values (``__reduce__``), and
    its ``__post_init__`` iterates a first field that is not a tensor -- a template's traced
    value. Classes whose ``__new__`` needs arguments are copied by ``copy.copy``."""
    try:
        out = type(t).__new__(type(t))
    except TypeError:
        return copy.copy(t)
    if hasattr(t, "__dict__"):
        out.__dict__.update(t.__dict__)
    return out


def tree_map(f: Callable, tree) -> Any:
    """Apply ``f`` to every leaf."""
    leaves, td = flatten(tree)
    return unflatten(td, [f(x) for x in leaves])
