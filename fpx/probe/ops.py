"""The seed generator's operator library: each op's shape and dtype rule and the source it emits.

An op is a function ``op(b)`` of a :class:`~fpx.probe.generate.Builder` that picks operands
among the values defined so far (or asks for a new program input, NNSmith's weights), checks
that the shapes fit, and returns ``(expression, shape, dtype)`` -- or ``None`` when it does not
apply here. Expressions are Python source over ``torch`` alone (``torch.nn.functional``
spelled out), so a program is standalone. Domain-restricted functions are emitted on a safe
argument (``torch.sqrt(torch.abs(a))``, ``a / (torch.abs(b) + 1.0)``): the eager run must be
finite on every input.

``ELEMENTWISE`` names the calls that act element by element (with broadcasting); the
operator-resolution mutation unrolls exactly those.
"""
from __future__ import annotations

import math

import numpy as np

FLOATS = ("float32", "float16", "bfloat16")
F = "torch.nn.functional."

# Calls that act element by element on their tensor arguments (broadcasting), by dotted name.
ELEMENTWISE = {
    "torch.relu", "torch.neg", "torch.abs", "torch.exp", "torch.tanh", "torch.sigmoid",
    "torch.sin", "torch.cos", "torch.sqrt", "torch.log1p", "torch.erf", "torch.atan",
    "torch.clamp", "torch.add", "torch.sub", "torch.mul", "torch.maximum", "torch.minimum",
    "torch.where", "torch.gt", "torch.lt", "torch.ge", "torch.le",
    F + "gelu", F + "silu", F + "relu",
}
# Methods that act element by element on their receiver.
ELEMENTWISE_METHODS = {"to", "float", "half", "bfloat16"}

UNARY = [
    ("torch.relu({a})", None), ("torch.neg({a})", None), ("torch.abs({a})", None),
    ("torch.exp({a})", None), ("torch.tanh({a})", None), ("torch.sigmoid({a})", None),
    ("torch.sin({a})", None), ("torch.cos({a})", None), ("torch.sqrt(torch.abs({a}))", None),
    ("torch.log1p(torch.abs({a}))", None), ("torch.erf({a})", None),
    ("torch.atan({a})", None), (F + "gelu({a})", None), (F + "silu({a})", None),
    ("{a} * {a}", None), ("torch.clamp({a}, min={c0}, max={c1})", None),
    ("1.0 / (torch.abs({a}) + 1.0)", None), ("{a} * {c}", None), ("{a} + {c}", None),
    ("{c} - {a}", None),
]
BINARY = [
    "torch.add({a}, {b})", "{a} + {b}", "torch.sub({a}, {b})", "{a} - {b}",
    "torch.mul({a}, {b})", "{a} * {b}", "{a} / (torch.abs({b}) + 1.0)",
    "torch.maximum({a}, {b})", "torch.minimum({a}, {b})",
]
COMPARE = ["torch.gt", "torch.lt", "torch.ge", "torch.le"]


def broadcast(s1, s2):
    """NumPy/torch broadcasting of two shapes, or None where they do not broadcast."""
    out = []
    for i in range(1, max(len(s1), len(s2)) + 1):
        a = s1[-i] if i <= len(s1) else 1
        b = s2[-i] if i <= len(s2) else 1
        if a != b and a != 1 and b != 1:
            return None
        out.append(max(a, b) if a != 0 and b != 0 else 0)
    return tuple(reversed(out))


def promote(d1, d2):
    """torch's promotion of two floating dtypes (names)."""
    if d1 == d2:
        return d1
    if "float32" in (d1, d2):
        return "float32"
    return "float32"          # float16 with bfloat16 promotes to float32


def _const(b, lo=-2.0, hi=2.0):
    """A Python float with three decimals (most are inexact in every format: how torch
    rounds a scalar operand is part of what is checked)."""
    return repr(float(np.round(b.rng.uniform(lo, hi), 3)))


def numel(shape):
    return math.prod(shape) if shape else 1


# ----------------------------------------------------------------------------- elementwise
def unary(b):
    a = b.pick()
    tmpl, _ = UNARY[b.rng.integers(len(UNARY))]
    c0 = float(_const(b, -2.0, 0.0))
    expr = tmpl.format(a=a.name, c=_const(b), c0=repr(c0), c1=repr(c0 + float(_const(b, 0.5, 3.0))))
    return expr, a.shape, a.dtype


def binary(b):
    a = b.pick()
    other = b.pick_broadcastable(a.shape)
    if other is None:
        return None
    shape = broadcast(a.shape, other.shape)
    if numel(shape) > b.cfg.max_numel:
        return None
    if b.rng.random() < 0.5:
        a, other = other, a
    tmpl = BINARY[b.rng.integers(len(BINARY))]
    return tmpl.format(a=a.name, b=other.name), shape, promote(a.dtype, other.dtype)


def compare(b):
    a = b.pick()
    if b.rng.random() < 0.5:
        other = b.pick_broadcastable(a.shape)
        if other is None:
            return None
        shape, rhs = broadcast(a.shape, other.shape), other.name
    else:
        shape, rhs = a.shape, _const(b, -1.0, 1.0)
    fn = COMPARE[b.rng.integers(len(COMPARE))]
    return f"{fn}({a.name}, {rhs})", shape, "bool"


def where(b):
    conds = [v for v in b.values if v.dtype == "bool"]
    a = b.pick()
    other = b.pick_broadcastable(a.shape)
    if other is None:
        return None
    shape = broadcast(a.shape, other.shape)
    fits = [c for c in conds if broadcast(c.shape, shape) == shape]
    if fits:
        cond = fits[b.rng.integers(len(fits))].name
    else:
        cond = f"{a.name} > {_const(b, -0.5, 0.5)}"
    return f"torch.where({cond}, {a.name}, {other.name})", shape, promote(a.dtype, other.dtype)


def cast(b):
    a = b.pick()
    to = [d for d in FLOATS if d != a.dtype][b.rng.integers(2)]
    form = b.rng.integers(2)
    if form == 0:
        return f"{a.name}.to(torch.{to})", a.shape, to
    method = {"float32": "float", "float16": "half", "bfloat16": "bfloat16"}[to]
    return f"{a.name}.{method}()", a.shape, to


# ----------------------------------------------------------------------------- reductions
def reduce(b):
    a = b.pick(min_rank=1)
    if a is None:
        return None
    d = int(b.rng.integers(a.ndim))
    keep = bool(b.rng.random() < 0.4)
    shape = tuple(s for i, s in enumerate(a.shape) if i != d) if not keep else \
        tuple(1 if i == d else s for i, s in enumerate(a.shape))
    kind = b.rng.integers(6)
    kd = ", keepdim=True" if keep else ""
    if kind == 0:
        return f"torch.sum({a.name}, dim={d}{kd})", shape, a.dtype
    if kind == 1:
        return f"{a.name}.mean(dim={d}{kd})", shape, a.dtype
    if kind == 2:
        return f"torch.amax({a.name}, dim={d}{kd})", shape, a.dtype
    if kind == 3:
        return f"torch.amin({a.name}, dim={d}{kd})", shape, a.dtype
    if kind == 4:
        return f"torch.linalg.vector_norm({a.name}, dim={d}{kd})", shape, a.dtype
    if a.shape[d] < 2:
        return None
    return f"torch.var({a.name}, dim={d}{kd})", shape, a.dtype


def reduce_all(b):
    a = b.pick(min_rank=1)
    if a is None:
        return None
    return f"{a.name}.sum()", (), a.dtype


# ----------------------------------------------------------------------------- contractions
def matmul(b):
    a = b.pick(min_rank=1, max_rank=3)
    if a is None:
        return None
    k = a.shape[-1]
    n = int(b.rng.integers(1, 9))
    w = b.new_input((k, n), a.dtype, scale=1.0 / math.sqrt(max(k, 1)))
    shape = a.shape[:-1] + (n,)
    return f"torch.matmul({a.name}, {w.name})", shape, a.dtype


def linear(b):
    a = b.pick(min_rank=1, max_rank=3)
    if a is None:
        return None
    k = a.shape[-1]
    n = int(b.rng.integers(1, 9))
    w = b.new_input((n, k), a.dtype, scale=1.0 / math.sqrt(max(k, 1)))
    bias = b.new_input((n,), a.dtype, scale=0.5).name if b.rng.random() < 0.7 else "None"
    return f"{F}linear({a.name}, {w.name}, {bias})", a.shape[:-1] + (n,), a.dtype


def conv(b):
    a = b.pick(min_rank=3, max_rank=4)
    if a is None:
        return None
    nd = a.ndim - 2
    c = a.shape[1]
    k = int(b.rng.integers(1, 4))
    pad = int(b.rng.integers(0, 2))
    stride = int(b.rng.integers(1, 3))
    if any(s + 2 * pad < k for s in a.shape[2:]) or c == 0:
        return None
    o = int(b.rng.integers(1, 5))
    w = b.new_input((o, c) + (k,) * nd, a.dtype, scale=1.0 / math.sqrt(c * k ** nd))
    bias = b.new_input((o,), a.dtype, scale=0.5).name if b.rng.random() < 0.6 else "None"
    spatial = tuple((s + 2 * pad - k) // stride + 1 for s in a.shape[2:])
    return (f"{F}conv{nd}d({a.name}, {w.name}, {bias}, stride={stride}, padding={pad})",
            (a.shape[0], o) + spatial, a.dtype)


# ----------------------------------------------------------------------------- normalizations
def softmax(b):
    a = b.pick(min_rank=1)
    if a is None:
        return None
    d = int(b.rng.integers(a.ndim))
    fn = "torch.softmax" if b.rng.random() < 0.6 else "torch.log_softmax"
    return f"{fn}({a.name}, dim={d})", a.shape, a.dtype


def norm(b):
    a = b.pick(min_rank=1)
    if a is None or a.shape[-1] < 2:
        return None
    n = a.shape[-1]
    affine = b.rng.random() < 0.6
    w = b.new_input((n,), a.dtype, scale=1.0).name if affine else "None"
    if b.rng.random() < 0.6:
        bias = b.new_input((n,), a.dtype, scale=0.5).name if affine else "None"
        return f"{F}layer_norm({a.name}, ({n},), {w}, {bias})", a.shape, a.dtype
    return f"{F}rms_norm({a.name}, ({n},), {w})", a.shape, a.dtype


# ----------------------------------------------------------------------------- movement
def _factor(b, n, rank):
    dims = []
    for _ in range(rank - 1):
        divs = [d for d in range(1, n + 1) if n % d == 0]
        d = divs[b.rng.integers(len(divs))]
        dims.append(d)
        n //= d
    return dims + [n]


def reshape(b):
    a = b.pick(min_rank=1)
    if a is None:
        return None
    shape = tuple(_factor(b, numel(a.shape), int(b.rng.integers(1, 5))))
    form = "{a}.reshape({s})" if b.rng.random() < 0.5 else "torch.reshape({a}, {s})"
    return form.format(a=a.name, s=shape), shape, a.dtype


def permute(b):
    a = b.pick(min_rank=2)
    if a is None:
        return None
    if b.rng.random() < 0.5:
        i, j = b.rng.choice(a.ndim, 2, replace=False)
        shape = list(a.shape)
        shape[i], shape[j] = shape[j], shape[i]
        return f"{a.name}.transpose({i}, {j})", tuple(shape), a.dtype
    perm = tuple(int(p) for p in b.rng.permutation(a.ndim))
    return f"{a.name}.permute{perm}", tuple(a.shape[p] for p in perm), a.dtype


def slice_(b):
    a = b.pick(min_rank=1)
    if a is None:
        return None
    d = int(b.rng.integers(a.ndim))
    n = a.shape[d]
    if n < 2:
        return None
    kind = b.rng.integers(3)
    pre = ":, " * d
    if kind == 0:                                   # a basic slice (a view)
        lo = int(b.rng.integers(0, n - 1))
        hi = int(b.rng.integers(lo + 1, n + 1))
        shape = a.shape[:d] + (hi - lo,) + a.shape[d + 1:]
        return f"{a.name}[{pre}{lo}:{hi}]", shape, a.dtype
    if kind == 1:                                   # select (a view, one rank less)
        i = int(b.rng.integers(n))
        return f"{a.name}[{pre}{i}]", a.shape[:d] + a.shape[d + 1:], a.dtype
    idx = [int(i) for i in b.rng.integers(0, n, int(b.rng.integers(1, 5)))]
    return f"{a.name}[{pre}{idx}]", a.shape[:d] + (len(idx),) + a.shape[d + 1:], a.dtype


def cat(b):
    a = b.pick(min_rank=1)
    if a is None:
        return None
    d = int(b.rng.integers(a.ndim))
    same = [v for v in b.values if v.dtype == a.dtype and v.ndim == a.ndim
            and all(s == t for i, (s, t) in enumerate(zip(v.shape, a.shape)) if i != d)]
    other = same[b.rng.integers(len(same))]
    shape = a.shape[:d] + (a.shape[d] + other.shape[d],) + a.shape[d + 1:]
    if numel(shape) > b.cfg.max_numel:
        return None
    if b.rng.random() < 0.3:
        return (f"torch.stack([{a.name}, {other.name}], dim={d})",
                a.shape[:d] + (2,) + a.shape[d:], a.dtype)
    return f"torch.cat([{a.name}, {other.name}], dim={d})", shape, a.dtype


def unsqueeze(b):
    a = b.pick(max_rank=3)
    if a is None:
        return None
    d = int(b.rng.integers(a.ndim + 1))
    return f"{a.name}.unsqueeze({d})", a.shape[:d] + (1,) + a.shape[d:], a.dtype


def flip(b):
    a = b.pick(min_rank=1)
    if a is None:
        return None
    d = int(b.rng.integers(a.ndim))
    return f"torch.flip({a.name}, dims=[{d}])", a.shape, a.dtype


def expand(b):
    a = b.pick(min_rank=1, max_rank=3)
    if a is None or 1 not in a.shape:
        return None
    shape = tuple(int(b.rng.integers(2, 5)) if s == 1 else s for s in a.shape)
    if numel(shape) > b.cfg.max_numel:
        return None
    return f"{a.name}.expand{shape}", shape, a.dtype


OPS = {
    "unary": (unary, 6), "binary": (binary, 5), "compare": (compare, 1), "where": (where, 2),
    "cast": (cast, 1), "reduce": (reduce, 3), "reduce_all": (reduce_all, 0.3),
    "matmul": (matmul, 2), "linear": (linear, 1.5), "conv": (conv, 1.5),
    "softmax": (softmax, 1.5), "norm": (norm, 1.5), "reshape": (reshape, 1.5),
    "permute": (permute, 1.5), "slice": (slice_, 2), "cat": (cat, 1), "unsqueeze": (unsqueeze, 0.5),
    "flip": (flip, 0.5), "expand": (expand, 0.5),
}
