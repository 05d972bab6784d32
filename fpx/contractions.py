"""The contractions of :mod:`fpx.numpy`: ``matmul`` (the one contraction primitive) and the
composites that lower to it -- ``tensordot``, ``dot``, ``vecdot`` and ``einsum`` -- with
``outer`` and ``inner``. The decompositions lower to transposes, reshapes and matmuls, which
is what a transform without a rule of its own sees; eagerly, the backend's own routine runs.
"""
from __future__ import annotations

import numpy as np

from fpx import numpy as fnp
from fpx.core import PRIMITIVES, Composite

__all__ = ["matmul", "tensordot", "dot", "vecdot", "outer", "inner", "einsum"]


def matmul(x1, x2, /, out=None):
    """numpy.matmul (the one contraction primitive; BLAS on NumPy)."""
    fnp._no_out(out, "matmul")
    if fnp._ndim(x1) == 0 or fnp._ndim(x2) == 0:
        raise ValueError("matmul: Input operand does not have enough dimensions")
    return PRIMITIVES["matmul"].bind(x1, x2)


def _tensordot_decomp(a, b, *, axes=2):
    """Transpose/reshape both operands to 2-D and contract with one matmul (as NumPy does)."""
    na, nb = fnp._ndim(a), fnp._ndim(b)
    if isinstance(axes, (int, np.integer)):
        ax_a, ax_b = list(range(na - axes, na)), list(range(axes))
    else:
        ax_a, ax_b = ([axes[0]] if isinstance(axes[0], int) else list(axes[0]),
                      [axes[1]] if isinstance(axes[1], int) else list(axes[1]))
    ax_a = [fnp._norm_axis(x, na) for x in ax_a]
    ax_b = [fnp._norm_axis(x, nb) for x in ax_b]
    sa, sb = fnp._shape(a), fnp._shape(b)
    if [sa[i] for i in ax_a] != [sb[i] for i in ax_b]:
        raise ValueError("shape-mismatch for sum")
    free_a = [i for i in range(na) if i not in ax_a]
    free_b = [i for i in range(nb) if i not in ax_b]
    k = int(np.prod([sa[i] for i in ax_a], dtype=np.int64))
    a2 = fnp.reshape(fnp.transpose(a, free_a + ax_a), (-1, k) if free_a else (1, k))
    b2 = fnp.reshape(fnp.transpose(b, ax_b + free_b), (k, -1) if free_b else (k, 1))
    r = fnp.reshape(matmul(a2, b2), tuple(sa[i] for i in free_a) + tuple(sb[i] for i in free_b))
    return _dot_dtype(r, a, b)


def _dot_dtype(r, a, b):
    """numpy.dot/tensordot return the operands' promoted dtype, but ml_dtypes' matmul returns
    float32 for bfloat16 operands: cast back to match. Dtypes without a common one (float16
    and bfloat16: NumPy's dot falls back to Python objects there) are a named error."""
    try:
        dt = np.result_type(fnp._dtype(a), fnp._dtype(b))
    except TypeError:
        raise TypeError(f"fpx: dot/tensordot of {fnp._dtype(a)} and {fnp._dtype(b)}: no common "
                        "dtype (NumPy computes it on Python objects); cast one operand first") \
            from None
    return r if fnp._dtype(r) == dt else fnp.astype(r, dt)


_tensordot = Composite("tensordot", _tensordot_decomp,
                       lambda B: lambda a, b, *, axes=2: B.xp.tensordot(a, b, axes=axes),
                       kind="matmul")


def tensordot(a, b, axes=2):
    return _tensordot.bind(a, b, axes=axes)


def _dot_decomp(a, b):
    if fnp._ndim(a) == 0 or fnp._ndim(b) == 0:
        return fnp.multiply(a, b)
    if fnp._ndim(b) <= 2:
        return _dot_dtype(matmul(a, b), a, b)
    return _tensordot_decomp(a, b, axes=([-1], [-2]))


_dot = Composite("dot", _dot_decomp, lambda B: B.xp.dot, kind="matmul")


def dot(a, b, out=None):
    """numpy.dot."""
    fnp._no_out(out, "dot")
    return _dot.bind(a, b)


def _vecdot_decomp(x1, x2, *, axis=-1):
    x1, x2 = fnp.moveaxis(x1, axis, -1), fnp.moveaxis(x2, axis, -1)
    r = matmul(fnp.expand_dims(x1, -2), fnp.expand_dims(x2, -1))
    return fnp.reshape(r, fnp._shape(r)[:-2])


def _vecdot_native(B):
    if not hasattr(B.xp, "vecdot"):  # NumPy < 2, older CuPy: run the decomposition
        return _vecdot_decomp
    return lambda x1, x2, *, axis=-1: B.xp.vecdot(x1, x2, axis=axis)


_vecdot = Composite("vecdot", _vecdot_decomp, _vecdot_native, kind="matmul")


def vecdot(x1, x2, /, *, axis=-1):
    return _vecdot.bind(x1, x2, axis=axis)


def outer(a, b, out=None):
    """numpy.outer: exact products a[i]*b[j]."""
    fnp._no_out(out, "outer")
    return fnp.multiply(fnp.reshape(a, (-1, 1)), fnp.reshape(b, (1, -1)))


def inner(a, b):
    if fnp._ndim(a) == 0 or fnp._ndim(b) == 0:
        return fnp.multiply(a, b)
    return tensordot(a, b, axes=([-1], [-1]))


# ---- einsum ---------------------------------------------------------------------------------
_EINSUM_POOL = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _parse_einsum(subscripts, shapes):
    """Explicit input terms and output term with '...' expanded to fresh letters."""
    s = subscripts.replace(" ", "")
    ins, arrow, out = s.partition("->")
    terms = ins.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"einsum: {len(terms)} operand terms for {len(shapes)} operands")
    used = set(c for c in s if c.isalpha())
    free = [c for c in _EINSUM_POOL if c not in used]
    ell_n = 0
    for t, shp in zip(terms, shapes):
        if "..." in t:
            ell_n = max(ell_n, len(shp) - (len(t) - 3))
    ell = "".join(free[:ell_n])
    new_terms = []
    for t, shp in zip(terms, shapes):
        if "..." in t:
            k = len(shp) - (len(t) - 3)
            t = t.replace("...", ell[ell_n - k:] if k else "")
        if len(t) != len(shp):
            raise ValueError(f"einsum: term '{t}' does not match operand of ndim {len(shp)}")
        new_terms.append(t)
    if arrow:
        out = out.replace("...", ell)
    else:
        counts = {}
        for t in new_terms:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    return new_terms, out


def _einsum_decomp(*operands, subscripts, optimize=False):
    """Contract left to right with transposes, reshapes and one batched matmul per pair."""
    terms, out = _parse_einsum(subscripts, [fnp._shape(o) for o in operands])
    sizes = {}
    for t, o in zip(terms, operands):
        for c, n in zip(t, fnp._shape(o)):
            if sizes.get(c, 1) == 1:
                sizes[c] = n
            elif n not in (1, sizes[c]):
                raise ValueError(f"einsum: size mismatch for index '{c}'")
    ops = []
    for t, o in zip(terms, operands):
        t, o = _einsum_diagonal(t, o)
        shp = tuple(sizes[c] for c in t)
        ops.append((t, fnp.broadcast_to(o, shp)))
    t, acc = ops[0]
    for i in range(1, len(ops)) if len(ops) > 1 else []:
        keep = set(out).union(*[set(tt) for tt, _ in ops[i + 1:]])
        t2, b = ops[i]
        t, acc = _einsum_pair(t, acc, t2, b, keep, sizes)
    drop = [i for i, c in enumerate(t) if c not in out]
    if drop:
        acc = fnp.sum(acc, tuple(drop))
        t = "".join(c for c in t if c in out)
    return fnp.transpose(acc, [t.index(c) for c in out]) if t != out else acc


def _einsum_diagonal(t, o):
    while len(set(t)) != len(t):
        c = next(ch for ch in t if t.count(ch) > 1)
        pos = [i for i, ch in enumerate(t) if ch == c]
        rest = [i for i in range(len(t)) if i not in pos]
        o = fnp.transpose(o, pos + rest)
        n = fnp._shape(o)[0]
        ar = np.arange(n)
        o = fnp._getitem(o, (ar,) * len(pos))
        t = c + "".join(t[i] for i in rest)
    return t, o


def _einsum_pair(ta, a, tb, b, keep, sizes):
    only_a = [c for c in ta if c not in tb and c not in keep]
    if only_a:
        a = fnp.sum(a, tuple(ta.index(c) for c in only_a))
        ta = "".join(c for c in ta if c not in only_a)
    only_b = [c for c in tb if c not in ta and c not in keep]
    if only_b:
        b = fnp.sum(b, tuple(tb.index(c) for c in only_b))
        tb = "".join(c for c in tb if c not in only_b)
    batch = [c for c in ta if c in tb and c in keep]
    contr = [c for c in ta if c in tb and c not in keep]
    fa = [c for c in ta if c not in tb]
    fb = [c for c in tb if c not in ta]
    nb_, na_, nc_, nf_ = (int(np.prod([sizes[c] for c in g], dtype=np.int64))
                          for g in (batch, fa, contr, fb))
    a3 = fnp.reshape(fnp.transpose(a, [ta.index(c) for c in batch + fa + contr]),
                     (nb_, na_, nc_))
    b3 = fnp.reshape(fnp.transpose(b, [tb.index(c) for c in batch + contr + fb]),
                     (nb_, nc_, nf_))
    if not batch:
        r = matmul(fnp.reshape(a3, (na_, nc_)), fnp.reshape(b3, (nc_, nf_)))
    else:
        r = matmul(a3, b3)
    t = "".join(batch + fa + fb)
    return t, fnp.reshape(r, tuple(sizes[c] for c in t))


def _einsum_native(B):
    return lambda *ops, subscripts, optimize=False: B.xp.einsum(subscripts, *ops, optimize=optimize)


_einsum = Composite("einsum", _einsum_decomp, _einsum_native, kind="matmul")


def einsum(subscripts, *operands, out=None, optimize=False, **kw):
    """numpy.einsum for explicit-subscript contractions (batch, transposes, diagonals,
    broadcasting ``...``); lowered to transposes, reshapes and matmul for transforms."""
    fnp._no_out(out, "einsum")
    if not isinstance(subscripts, str):
        raise TypeError("fpx.numpy.einsum: only the subscripts-string form is supported")
    return _einsum.bind(*operands, subscripts=subscripts, optimize=optimize)
