"""Sums and dot products in a stated order, every product and addition rounded to the
accumulation format, no FMA contraction (numba without ``fastmath``: LLVM only fuses
``a*b + c`` when told it may): the kernels of ``fpx.reproducible``'s ``sequential`` and
``pairwise`` orders (docs/reproducible.md, "Reductions and contractions").

Every output element is its own sum, computed by one thread in the order the spec states;
threads split the output rows only, so the bits do not depend on the thread count, the
batch, or the layout of the operands (they are read through their strides).

Orders: 0 = sequential (``s = t0; s = s + t1; ...``), 1 = pairwise (the fixed tree of
docs/reproducible.md: neighbours combined level by level, a block of 2^j terms is merged as
soon as its partner is complete, and the remaining blocks are added right to left).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

__all__ = ["matmul", "reduce", "run"]

_opts = dict(nogil=True, error_model="numpy", fastmath=False)
_LEVELS = 64


@numba.njit(inline="always")
def _push(stack, sizes, top, cur):
    """Push the one-term block ``cur`` onto the pairwise stack, merging equal-sized blocks
    (the earlier block on the left); returns the new top."""
    size = 1
    while top > 0 and sizes[top - 1] == size:
        prev = stack[top - 1]
        for n in range(cur.size):
            cur[n] = prev[n] + cur[n]
        size *= 2
        top -= 1
    stack[top, :] = cur
    sizes[top] = size
    return top + 1


@numba.njit(inline="always")
def _finish(stack, top, acc):
    """The remaining blocks added right to left into ``acc``."""
    acc[:] = stack[top - 1]
    for j in range(top - 2, -1, -1):
        prev = stack[j]
        for n in range(acc.size):
            acc[n] = prev[n] + acc[n]


@numba.njit(parallel=True, **_opts)
def matmul(A, B, order, out):
    """``out[g, m, n] = Σ_k A[g, m, k]·B[g, k, n]`` in ``order``; A, B and out share the
    accumulation dtype; a batch dimension of 1 broadcasts."""
    G, M, N = out.shape
    K = A.shape[2]
    for job in prange(G * M):
        g = job // M
        m = job % M
        a = A[g if A.shape[0] > 1 else 0, m]
        b = B[g if B.shape[0] > 1 else 0]
        acc = out[g, m]
        if K == 0:
            acc[:] = 0
            continue
        if order == 0:
            a0 = a[0]
            b0 = b[0]
            for n in range(N):
                acc[n] = a0 * b0[n]
            for k in range(1, K):
                ak = a[k]
                bk = b[k]
                for n in range(N):
                    p = ak * bk[n]
                    acc[n] = acc[n] + p
        else:
            stack = np.empty((_LEVELS, N), out.dtype)
            sizes = np.empty(_LEVELS, np.int64)
            cur = np.empty(N, out.dtype)
            top = 0
            for k in range(K):
                ak = a[k]
                bk = b[k]
                for n in range(N):
                    cur[n] = ak * bk[n]
                top = _push(stack, sizes, top, cur)
            _finish(stack, top, acc)


@numba.njit(parallel=True, **_opts)
def reduce(X, order, cumulative, out):
    """Sums over axis 1 of ``X`` (O, K, I) into ``out`` (O, 1, I), or running sums into
    ``out`` (O, K, I) when ``cumulative`` (always sequential); X and out share the
    accumulation dtype."""
    O, K, I = X.shape
    for o in prange(O):
        x = X[o]
        if K == 0:
            out[o, 0, :] = 0
            continue
        if order == 0 or cumulative:
            acc = np.empty(I, out.dtype)
            acc[:] = x[0]
            if cumulative:
                out[o, 0, :] = acc
            for k in range(1, K):
                xk = x[k]
                for i in range(I):
                    acc[i] = acc[i] + xk[i]
                if cumulative:
                    out[o, k, :] = acc
            if not cumulative:
                out[o, 0, :] = acc
        else:
            stack = np.empty((_LEVELS, I), out.dtype)
            sizes = np.empty(_LEVELS, np.int64)
            cur = np.empty(I, out.dtype)
            top = 0
            for k in range(K):
                cur[:] = x[k]
                top = _push(stack, sizes, top, cur)
            acc = np.empty(I, out.dtype)
            _finish(stack, top, acc)
            out[o, 0, :] = acc


# the same kernels compiled without threads (prange runs as range): for small problems, where
# starting the threads costs more than the work (the bits are the same either way)
_matmul_serial = numba.njit(**_opts)(matmul.py_func)
_reduce_serial = numba.njit(**_opts)(reduce.py_func)
_SERIAL_BELOW = 1 << 18          # multiply-adds


def run(kernel, *args):
    """``matmul(A, B, order, out)`` or ``reduce(X, order, cumulative, out)`` (``kernel`` is
    one of them), threaded when the problem has at least 2^18 terms."""
    X = args[0]
    work = X.size * (args[1].shape[2] if kernel is matmul else 1)
    if work < _SERIAL_BELOW:
        kernel = _matmul_serial if kernel is matmul else _reduce_serial
    kernel(*args)
