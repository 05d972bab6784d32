"""Interval rules of exact movement (reshape, transpose, broadcast_to, getitem, concatenate,
pad): the same movement of the value, the bounds (or a ball's radius) and the unstable mask."""
from __future__ import annotations

import numpy as np

from fpx.core import concrete
from fpx.transforms.interval.interpreter import ball_rule, dense, rule


@rule("reshape", "transpose", "broadcast_to", "getitem", "concatenate", "pad")
def _movement(self, prim, *args, **params):
    """A box moves as its value does: the same movement of both ends and the unstable mask."""
    v = self.value_of(prim, args, params)
    dt = np.asarray(concrete(v)).dtype
    bs = [self.bounds(x, dt) for x in args]
    lo = dense(_apply_np(prim, [b[0] for b in bs], params))
    hi = dense(_apply_np(prim, [b[1] for b in bs], params))
    if any(b[2] is not None for b in bs):
        us = [b[2] if b[2] is not None else np.zeros(np.shape(b[0]), bool) for b in bs]
        un = _apply_np(prim, us, params, fill=False)
    else:
        un = None
    return self.new(v, lo, hi, un, all(b[3] for b in bs))


def _apply_np(prim, arrs, params, fill=None):
    n = prim.name
    if n == "reshape":
        return np.reshape(arrs[0], params["shape"])
    if n == "transpose":
        return np.transpose(arrs[0], params["axes"])
    if n == "broadcast_to":
        return np.broadcast_to(arrs[0], params["shape"])
    if n == "getitem":
        return arrs[0][params["index"]]
    if n == "concatenate":
        return np.concatenate([np.asarray(a) for a in arrs], axis=params["axis"])
    if n == "pad":
        val = False if fill is False else float(np.float64(params["value"]))
        return np.pad(arrs[0], params["pad_width"], mode="constant", constant_values=val)
    raise AssertionError(n)


@ball_rule("reshape", "transpose", "broadcast_to", "getitem")
def _move_ball(self, prim, x, **params):
    """A ball moves as its value does: the same movement of its radius."""
    v = self.value_of(prim, (x,), params)
    un = None if x.unstable is None else _apply_np(prim, [x.unstable], params)
    return self.new_ball(v, dense(_apply_np(prim, [x.rad], params)), x.top, un, x.clip)


