"""Rules for the accumulating primitives -- reduce_sum, cumsum, reduce_prod, matmul -- in the
interpreter's order (numba kernels for sequential and pairwise, BLAS + a rounding test +
MPFR for exact)."""
from __future__ import annotations

import numpy as np

from fpx.kernels import ordered
from fpx.transforms.reproducible import exact
from fpx.transforms.reproducible.interpreter import (ReproducibleInterpreter, float_format,
                                                     is_float, value)

_rule = ReproducibleInterpreter.def_rule
_ORDER = {"sequential": 0, "pairwise": 1}


def _acc_dtype(F):
    return np.dtype(np.float64) if F.name == "float64" else np.dtype(np.float32)


def _halves(n, alt):
    """The blocks the outer dimension is computed in: all at once, or (``check=True``'s
    other schedule) the second half first."""
    return [slice(n // 2, n), slice(0, n // 2)] if alt and n > 1 else [slice(0, n)]


def _exact_needs(F, what):
    if F.name == "float64":
        raise TypeError(f"fpx.reproducible: order='exact' {what} of float64 operands is not "
                        f"supported yet (docs/reproducible.md, 'Limits')")


# ---------------------------------------------------------------------------------------------
# sums over axes
# ---------------------------------------------------------------------------------------------
def _ski(v, axes):
    """(X as (O, K, I), output shape without the reduced axes): reduced axes moved to the
    middle in their own order (C order of the terms)."""
    nd = v.ndim
    kept = [i for i in range(nd) if i not in axes]
    first = min(axes) if axes else nd
    before = [i for i in kept if i < first]
    after = [i for i in kept if i > first]
    x = np.transpose(v, before + list(axes) + after)
    sh = x.shape
    O = int(np.prod(sh[:len(before)], dtype=np.int64))
    K = int(np.prod(sh[len(before):len(before) + len(axes)], dtype=np.int64))
    return x.reshape(O, K, -1 if O * K else int(np.prod(sh[len(before) + len(axes):]))), \
        [v.shape[i] for i in before], [v.shape[i] for i in after]


def _sum_ordered(self, X, F, cumulative):
    """Sums over axis 1 of X (O, K, I), already in F's dtype: (O, 1 or K, I) in F's dtype."""
    acc = _acc_dtype(F)
    Xa = X.astype(acc, copy=False)
    O, K, I = Xa.shape
    if self.order == "exact":
        _exact_needs(F, "sum")
        X64 = Xa.astype(np.float64)
        with np.errstate(all="ignore"):
            s = np.cumsum(X64, axis=1) if cumulative else X64.sum(axis=1, keepdims=True)
            a = np.abs(X64)
            mag = np.cumsum(a, axis=1) if cumulative else a.sum(axis=1, keepdims=True)
        res, bad = exact.round_or_fail(s, mag * exact.gamma(K), F)
        for o, k, i in zip(*np.nonzero(bad)):
            terms = X64[o, : k + 1, i] if cumulative else X64[o, :, i]
            res[o, k, i] = exact.exact_fallback([terms], F)[0]
        return res
    out = np.empty((O, K if cumulative else 1, I), acc)
    for sl in _halves(O, self.alt):
        ordered.run(ordered.reduce, Xa[sl], _ORDER[self.order], cumulative, out[sl])
    return out.astype(F.dtype, copy=False)


def _sum_like(self, prim, a, axis, keepdims, dtype, cumulative):
    v = np.asarray(value(a))
    dummy = np.zeros((1,) * max(v.ndim, 1), v.dtype)
    with np.errstate(all="ignore"):
        dt = (np.cumsum(dummy, axis=0, dtype=dtype) if cumulative
              else np.sum(dummy, dtype=dtype)).dtype
    if not is_float(np.empty(0, dt)):                 # integer / bool sums: exact
        params = {"axis": axis, "dtype": dtype} if cumulative else \
            {"axis": axis, "keepdims": keepdims, "dtype": dtype}
        return self.new(self.bind_parent(prim, v, **params))
    F = float_format(dt, prim.name)
    v = _to(v, F)
    if cumulative:
        axes = (int(axis) % v.ndim,)
    else:
        axes = tuple(range(v.ndim)) if axis is None else tuple(
            sorted(int(x) % v.ndim for x in (axis if isinstance(axis, tuple) else (axis,))))
    X, before, after = _ski(v, axes)
    r = _sum_ordered(self, X, F, cumulative)
    if cumulative:
        return self.new(r.reshape(v.shape))
    r = r.reshape(before + after)
    if keepdims:
        r = r.reshape([1 if i in axes else n for i, n in enumerate(v.shape)])
    return self.new(r[()] if r.ndim == 0 else r)


def _to(v, F):
    """Operand values in F's dtype (a correctly rounded cast where F is narrower)."""
    if v.dtype == F.dtype:
        return v
    if is_float(v) and np.dtype(v.dtype).itemsize > np.dtype(F.dtype).itemsize \
            and F.name == "bfloat16":
        from fpx import formats
        return formats.round(v.astype(np.float64), F, "rn")
    return v.astype(F.dtype)


@_rule("reduce_sum")
def _reduce_sum(self, prim, a, *, axis=None, keepdims=False, dtype=None):
    return _sum_like(self, prim, a, axis, keepdims, dtype, False)


@_rule("cumsum")
def _cumsum(self, prim, a, *, axis, dtype=None):
    return _sum_like(self, prim, a, axis, False, dtype, True)


@_rule("reduce_prod")
def _reduce_prod(self, prim, a, *, axis=None, keepdims=False, dtype=None):
    """A left-to-right product under every order (NumPy, one factor at a time)."""
    v = np.asarray(value(a))
    r = np.asarray(self.bind_parent(prim, v[:0] if v.ndim else v, axis=axis,
                                    keepdims=keepdims, dtype=dtype) if v.ndim else v)
    if not is_float(r):
        return self.new(self.bind_parent(prim, v, axis=axis, keepdims=keepdims, dtype=dtype))
    F = float_format(r.dtype, "reduce_prod")
    axes = tuple(range(v.ndim)) if axis is None else tuple(
        sorted(int(x) % v.ndim for x in (axis if isinstance(axis, tuple) else (axis,))))
    X, before, after = _ski(_to(v, F), axes)
    acc = np.ones((X.shape[0], X.shape[2]), _acc_dtype(F))
    Xa = X.astype(acc.dtype, copy=False)
    for k in range(X.shape[1]):
        acc = acc * Xa[:, k]
    out = acc.astype(F.dtype).reshape(before + after)
    if keepdims:
        out = out.reshape([1 if i in axes else n for i, n in enumerate(v.shape)])
    return self.new(out[()] if out.ndim == 0 else out)


# ---------------------------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------------------------
def _batch3(x, bshape, rows, cols):
    """(G or 1, rows, cols): an operand whose batch dims are all 1 stays unbatched."""
    if all(d == 1 for d in x.shape[:-2]):
        return x.reshape(1, rows, cols)
    return np.broadcast_to(x, bshape + (rows, cols)).reshape(-1, rows, cols)


@_rule("matmul")
def _matmul(self, prim, a, b):
    va, vb = np.asarray(value(a)), np.asarray(value(b))
    if va.ndim == 0 or vb.ndim == 0:
        raise ValueError("matmul: input operand does not have enough dimensions")
    dt = np.result_type(va.dtype, vb.dtype) if not (va.dtype.kind == "V" or vb.dtype.kind == "V") \
        else np.matmul(np.zeros((1, 1), va.dtype), np.zeros((1, 1), vb.dtype)).dtype
    if not is_float(np.empty(0, dt)):
        return self.new(self.bind_parent(prim, va, vb))
    F = float_format(dt, "matmul")
    A = va.reshape((1,) + va.shape) if va.ndim == 1 else va
    B = vb.reshape(vb.shape + (1,)) if vb.ndim == 1 else vb
    M, K = A.shape[-2:]
    K2, N = B.shape[-2:]
    if K != K2:
        raise ValueError(f"matmul: mismatch in its core dimension (n?,k),(k,m?): {K} != {K2}")
    bshape = tuple(np.broadcast_shapes(A.shape[:-2], B.shape[:-2]))
    acc = _acc_dtype(F)
    A3 = _batch3(_to(A, F), bshape, M, K).astype(acc, copy=False)
    B3 = _batch3(_to(B, F), bshape, K, N).astype(acc, copy=False)
    G = int(np.prod(bshape, dtype=np.int64))
    if self.order == "exact":
        out = _matmul_exact(self, A3, B3, F, G)
    else:
        out = np.empty((G, M, N), acc)
        B3 = np.ascontiguousarray(B3)     # rows of B read along n (SIMD); same values
        for sl in _halves(M, self.alt):
            ordered.run(ordered.matmul, A3[:, sl], B3, _ORDER[self.order], out[:, sl])
        out = out.astype(F.dtype, copy=False)
    r = out.reshape(bshape + (M, N))
    if vb.ndim == 1:
        r = r[..., 0]
    if va.ndim == 1:
        r = r[..., 0, :] if vb.ndim != 1 else r[..., 0]
    return self.new(r)


def _matmul_exact(self, A3, B3, F, G):
    """Float64 BLAS product (float32 products are exact there) and the bound
    γ_K·‖a_m‖·‖b_n‖ ≥ γ_K·Σ|a_mk·b_kn| (Cauchy-Schwarz) on its error; the elements that bound
    leaves undecided get a compensated dot product (Dot2) with its own, far smaller bound, and
    the few still undecided MPFR's exact sum of their products."""
    _exact_needs(F, "matmul")
    K = A3.shape[2]
    A64, B64 = A3.astype(np.float64), B3.astype(np.float64)
    with np.errstate(all="ignore"):
        if self.alt:      # the transposed product: another BLAS blocking
            s = np.swapaxes(np.matmul(np.swapaxes(B64, -1, -2), np.swapaxes(A64, -1, -2)),
                            -1, -2)
        else:
            s = np.matmul(A64, B64)
        ra = np.sqrt(np.einsum("gmk,gmk->gm", A64, A64))
        cb = np.sqrt(np.einsum("gkn,gkn->gn", B64, B64))
    coef = exact.gamma(K) * (1 + 4 * exact.gamma(K) + 2.0 ** -48)
    if s.shape[0] != G:
        s = np.ascontiguousarray(np.broadcast_to(s, (G,) + s.shape[1:]))
    if F.name == "float32":
        res = np.empty(s.shape, np.float32)
        bad = np.empty(s.shape, np.bool_)
        ordered.round_test_f32(s, ra, cb, coef, res, bad)
    else:
        with np.errstate(all="ignore"):
            err = coef * (ra[:, :, None] * cb[:, None, :])
        res, bad = exact.round_or_fail(s, np.broadcast_to(err, s.shape), F)
    idx = np.nonzero(bad)
    if idx[0].size:
        res[idx] = _exact_dots(A3, B3, idx, F)
    return res


def _exact_dots(A3, B3, idx, F):
    """The correctly rounded exact dot products at the output positions ``idx`` (g, m, n) of
    A3 @ B3 (float32): Dot2 and a rounding test, then MPFR for the elements that test leaves
    undecided."""
    g, m, n = idx
    ga = g if A3.shape[0] > 1 else np.zeros_like(g)
    gb = g if B3.shape[0] > 1 else np.zeros_like(g)
    s2, e2 = np.empty(g.size), np.empty(g.size)
    with np.errstate(all="ignore"):
        ordered.dot2(A3, B3, ga, gb, m, n, exact.gamma(A3.shape[2]) ** 2, s2, e2)
    out, bad = exact.round_or_fail(s2, e2, F)
    j = np.nonzero(bad)[0]
    if j.size:
        rows = A3[ga[j], m[j], :].astype(np.float64) * B3[gb[j], :, n[j]].astype(np.float64)
        out[j] = exact.exact_fallback(list(rows), F)
    return out
