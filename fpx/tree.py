"""Minimal pytrees: nested tuples, lists, dicts and namedtuples of leaves (like jax.tree_util).

Transforms accept and return pytrees, so ``f(params: dict, x)`` and multi-output functions work.
Other containers can be registered with :func:`register_node`.
"""
from __future__ import annotations

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

    def rec(x):
        t = type(x)
        if t in _NODES:
            children, aux = _NODES[t][0](x)
            return ("node", t, aux, [rec(c) for c in children])
        if t is tuple or t is list:
            return (t.__name__, [rec(c) for c in x])
        if _is_namedtuple(x):
            return ("namedtuple", t, [rec(c) for c in x])
        if t is dict:
            return ("dict", list(x.keys()), [rec(v) for v in x.values()])
        if x is None:
            return ("none",)
        leaves.append(x)
        return ("leaf",)
    return leaves, rec(tree)


def unflatten(treedef, leaves) -> Any:
    """Inverse of :func:`flatten`."""
    it = iter(leaves)

    def rec(d):
        kind = d[0]
        if kind == "leaf":
            return next(it)
        if kind == "none":
            return None
        if kind == "tuple":
            return tuple(rec(c) for c in d[1])
        if kind == "list":
            return [rec(c) for c in d[1]]
        if kind == "namedtuple":
            return d[1](*[rec(c) for c in d[2]])
        if kind == "dict":
            return dict(zip(d[1], [rec(c) for c in d[2]]))
        return _NODES[d[1]][1](d[2], [rec(c) for c in d[3]])
    return rec(treedef)


def tree_map(f: Callable, tree) -> Any:
    """Apply ``f`` to every leaf."""
    leaves, td = flatten(tree)
    return unflatten(td, [f(x) for x in leaves])
