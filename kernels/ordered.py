"""Sums and dot products in a stated order with a per-step rounding: the ordered-dot skeleton
shared by ``fpx.reproducible``'s ``sequential``/``pairwise`` kernels (round to nearest in the
accumulation format) and ``fpx.stochastic``'s flop-level float32 matmul (random rounding), and
the kernels of the ``exact`` order's rounding test.

Round to nearest: every product and addition is rounded to the accumulation format, with no
FMA contraction (plain LLVM ``fmul``/``fadd`` without fast-math flags: LLVM only fuses
``a*b + c`` when told it may; docs/reproducible.md, "Reductions and contractions").

Every output element is its own sum, taken in the order the spec states. ``make_matmul`` splits
the output into tiles (rows x columns) and threads split the tiles; a tile's kernel brings the
terms in, k = 0, 1, ..., into running sums held in registers or L1, vectorized across output
columns. Since each element's order is fixed, neither the bits nor (for stochastic rounding)
the random positions depend on the thread count, the tiling, the batch, or the layout of the
operands (they are read through their strides). The vector width does not enter either: the
operations are IEEE operations lane by lane.

Orders: sequential (``s = t0; s = s + t1; ...``), pairwise (the fixed tree of
docs/reproducible.md: neighbours combined level by level, a block of 2^j terms is merged as
soon as its partner is complete, and the remaining blocks are added right to left).
"""
from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core.errors import TypingError
from numba.extending import intrinsic

__all__ = ["matmul", "reduce", "run", "make_matmul", "sequential_tile", "elementwise_row",
           "round_test_f32", "dot2", "ROWS", "COLS"]

_opts = dict(nogil=True, error_model="numpy", fastmath=False)
_LEVELS = 64
ROWS = 64          # rows of A per tile: a strip of B, loaded once, serves ROWS rows
COLS = 128         # output columns per tile (a multiple of every SIMD width)
_VEC = 128         # bytes per _axpy_rn call: two 512-bit vectors


# ---------------------------------------------------------------------------------------------
# the skeleton: tiles of the output, each a set of ordered dot products
# ---------------------------------------------------------------------------------------------
def make_matmul(tile, key_of, parallel=True, rows=ROWS, cols=COLS):
    """``kernel(A, B, keys, op, sm, sn, out)``: ``out[s, g, m, n] = Σ_k A[s, g, m, k]·B[s, g,
    k, n]``, each output tile computed by ``tile``. A is (SA, GA, M, K), B (SB, GB, K, N), out
    (S, G, M, N); a leading dimension of 1 broadcasts. ``key_of(keys, s, op)``: the tile's
    random key for sample s; ``tile`` gets it with the position of term k of out[s, g, m, n]
    in the random stream, ``g·M·N·K + m·sm + n·sn + k`` (unused by round to nearest).
    Tiles: ``rows`` x ``cols`` outputs."""
    TR, TC = rows, cols
    def kernel(A, B, keys, op, sm, sn, out):
        S, G, M, N = out.shape
        K = A.shape[3]
        nr = (M + TR - 1) // TR
        nc = (N + TC - 1) // TC
        for job in prange(S * G * nc * nr):
            sg = job // (nc * nr)
            s = sg // G
            g = sg % G
            n0 = ((job // nr) % nc) * TC
            m0 = (job % nr) * TR
            rows = min(M - m0, TR)
            cols = min(N - n0, TC)
            if K == 0:
                for r in range(rows):
                    for c in range(cols):
                        out[s, g, m0 + r, n0 + c] = 0
                continue
            a = A[s if A.shape[0] > 1 else 0, g if A.shape[1] > 1 else 0]
            b = B[s if B.shape[0] > 1 else 0, g if B.shape[1] > 1 else 0]
            acc = np.empty((TR, TC), out.dtype)
            tile(a, b, key_of(keys, s, op), m0, rows, n0, cols,
                 g * M * N * K, sm, sn, acc)
            for r in range(rows):
                o = out[s, g, m0 + r]
                ar = acc[r]
                for c in range(cols):
                    o[n0 + c] = ar[c]
    return numba.njit(parallel=parallel, **_opts)(kernel)


def sequential_tile(row):
    """The tile of the sequential order, the rounding a pluggable piece: ``row(acc, r, b, k,
    n0, cols, ak, key, base, sn, flag)`` brings term k into the running sums ``acc[r, :cols]``
    of row r (``ak`` = A[m, k], B's row k read from column n0; term k of column c sits at
    position ``base + (n0 + c)·sn`` of the random stream; ``flag``: COLS booleans of scratch)."""
    @numba.njit(inline="always")
    def tile(a, b, key, m0, rows, n0, cols, base0, sm, sn, acc):
        flag = np.zeros(acc.shape[1], np.bool_)
        for k in range(a.shape[1]):
            for r in range(rows):
                row(acc, r, b, k, n0, cols, a[m0 + r, k], key, base0 + (m0 + r) * sm + k, sn,
                    flag)
    return tile


def elementwise_row(first, step, fix=None):
    """A ``row`` for :func:`sequential_tile` from per-element pieces: ``first(a, b, key, pos)``
    is term 0, ``step(acc, a, b, key, pos)`` adds term k; each returns ``(value, bad)``. With
    ``fix``, the elements a step calls ``bad`` (a value the fast rounding cannot take) keep
    their sum through the vectorized pass and are redone by ``fix(acc, a, b, key, pos, k)``."""
    FIX = fix is not None

    @numba.njit(inline="always")
    def row(acc, r, b, k, n0, cols, ak, key, base, sn, flag):
        ar = acc[r]
        bk = b[k]
        nbad = 0
        if k == 0:
            for c in range(cols):
                v, bad = first(ak, bk[n0 + c], key, base + (n0 + c) * sn)
                if FIX:
                    flag[c] = bad
                    nbad += bad
                ar[c] = v
        else:
            for c in range(cols):
                v, bad = step(ar[c], ak, bk[n0 + c], key, base + (n0 + c) * sn)
                if FIX:
                    flag[c] = bad
                    nbad += bad
                    ar[c] = ar[c] if bad else v
                else:
                    ar[c] = v
        if FIX and nbad:
            for c in range(cols):
                if flag[c]:
                    ar[c] = fix(ar[c], ak, bk[n0 + c], key, base + (n0 + c) * sn, k)
    return row


@numba.njit(inline="always")
def _no_key(keys, s, op):
    return np.uint64(0)


# ---------------------------------------------------------------------------------------------
# round to nearest: explicit 512-bit vectors (LLVM's vectorizer stops at 256 bits on CPUs
# tuned for it; the ops are IEEE ops lane by lane, so the width changes no bit)
# ---------------------------------------------------------------------------------------------
def _splat(builder, vty, x):
    """The vector of type ``vty`` with ``x`` in every lane."""
    one = builder.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), vty.count), [0] * vty.count)
    return builder.shuffle_vector(one, one, zeros)


@intrinsic
def _axpy_rn(typingctx, acc, r, c, b, k, n, a):
    """``acc[r, c:c+W] = acc[r, c:c+W] + a·b[k, n:n+W]`` with W = 128 bytes of the dtype, the
    product and the sum each rounded (plain ``fmul``/``fadd``: no contraction); both arrays
    C-contiguous 2-D of one float dtype."""
    if not (isinstance(acc, types.Array) and isinstance(b, types.Array) and acc.ndim == 2
            and b.ndim == 2 and acc.layout == "C" and b.layout == "C"
            and acc.dtype == b.dtype == a and a in (types.float32, types.float64)):
        raise TypingError(f"_axpy_rn: needs C-contiguous 2-D arrays of one float dtype, got "
                          f"{acc}, {b}, {a}")
    W = _VEC // (4 if a == types.float32 else 8)

    def codegen(context, builder, sig, args):
        accv, rv, cv, bv, kv, nv, av = args
        fty = context.get_value_type(a)
        vty = ir.VectorType(fty, W)
        size = 4 if a == types.float32 else 8

        def ptr(aty, arr, i, j):
            ary = context.make_array(aty)(context, builder, arr)
            stride = builder.extract_value(ary.strides, 0)
            off = builder.add(builder.mul(i, stride), builder.mul(j, ir.Constant(i.type, size)))
            p = builder.gep(builder.bitcast(ary.data, ir.IntType(8).as_pointer()), [off])
            return builder.bitcast(p, vty.as_pointer())
        pa = ptr(sig.args[0], accv, rv, cv)
        pb = ptr(sig.args[3], bv, kv, nv)
        prod = builder.fmul(_splat(builder, vty, av), builder.load(pb, align=size))
        builder.store(builder.fadd(builder.load(pa, align=size), prod), pa, align=size)
        return context.get_dummy_value()
    return types.void(acc, types.intp, types.intp, b, types.intp, types.intp, a), codegen


_BR, _BV = 4, 4   # a register block: 4 rows x 4 vectors of running sums held in registers
_KC = 128          # terms per pass over a register block (the running sums go to L1 between)


@intrinsic
def _rn_block(typingctx, acc, r0, c0, a, m0, b, n0, k0, k1):
    """``acc[r0:r0+4, c0:c0+4W] += a[m0+r0:m0+r0+4, k]·b[k, n0+c0:n0+c0+4W]`` for k = k0,
    k0+1, ..., k1-1 in order, each product and sum rounded (plain ``fmul``/``fadd``), the sixteen
    running-sum vectors in registers across the loop over k (W lanes = 64 bytes; acc and b
    C-contiguous, a read through its strides)."""
    if not (isinstance(acc, types.Array) and isinstance(b, types.Array)
            and isinstance(a, types.Array) and acc.ndim == b.ndim == a.ndim == 2
            and acc.layout == "C" and b.layout == "C" and acc.dtype == b.dtype == a.dtype
            and a.dtype in (types.float32, types.float64)):
        raise TypingError(f"_rn_block: needs 2-D arrays of one float dtype, got {acc}, {a}, {b}")
    size = 4 if a.dtype == types.float32 else 8
    W = 64 // size

    def codegen(context, builder, sig, args):
        accv, r0v, c0v, av, m0v, bv, n0v, k0v, k1v = args
        fty = context.get_value_type(a.dtype)
        vty = ir.VectorType(fty, W)
        i8p = ir.IntType(8).as_pointer()
        A_, Aa, Bb = [context.make_array(t)(context, builder, v)
                      for t, v in ((sig.args[0], accv), (sig.args[3], av), (sig.args[5], bv))]
        intp = r0v.type

        def c(x):
            return ir.Constant(intp, x)

        def st(arr, d):
            return builder.extract_value(arr.strides, d)

        def at(base, off, ty):
            return builder.bitcast(builder.gep(base, [off]), ty.as_pointer())

        def start(arr, i, j):       # i8* to arr[i, j] through the strides
            off = builder.add(builder.mul(i, st(arr, 0)), builder.mul(j, st(arr, 1)))
            return builder.gep(builder.bitcast(arr.data, i8p), [off])
        pacc = [start(A_, builder.add(r0v, c(i)), c0v) for i in range(_BR)]
        init = [[builder.load(at(pacc[i], c(64 * v), vty), align=size) for v in range(_BV)]
                for i in range(_BR)]
        a0 = start(Aa, builder.add(m0v, r0v), k0v)
        b0 = start(Bb, k0v, builder.add(n0v, c0v))
        arow, ak, bk = st(Aa, 0), st(Aa, 1), st(Bb, 0)
        pre = builder.block
        loop = builder.append_basic_block("rn_block.loop")
        done = builder.append_basic_block("rn_block.done")
        builder.cbranch(builder.icmp_signed(">", k1v, k0v), loop, done)
        builder.position_at_end(loop)
        k = builder.phi(intp)
        pa = builder.phi(i8p)
        pb = builder.phi(i8p)
        sums = [[builder.phi(vty) for _ in range(_BV)] for _ in range(_BR)]
        bvec = [builder.load(at(pb, c(64 * v), vty), align=size) for v in range(_BV)]
        new = []
        for i in range(_BR):
            splat = _splat(builder, vty, builder.load(at(pa, builder.mul(c(i), arow), fty)))
            new.append([builder.fadd(sums[i][v], builder.fmul(splat, bvec[v]))
                        for v in range(_BV)])
        k1 = builder.add(k, c(1))
        for phi, first, nxt in ([(k, k0v, k1), (pa, a0, builder.gep(pa, [ak])),
                                 (pb, b0, builder.gep(pb, [bk]))]
                                + [(sums[i][v], init[i][v], new[i][v])
                                   for i in range(_BR) for v in range(_BV)]):
            phi.add_incoming(first, pre)
            phi.add_incoming(nxt, loop)
        builder.cbranch(builder.icmp_signed("<", k1, k1v), loop, done)
        builder.position_at_end(done)
        fins = [[builder.phi(vty) for _ in range(_BV)] for _ in range(_BR)]   # phis first
        for i in range(_BR):
            for v in range(_BV):
                fins[i][v].add_incoming(init[i][v], pre)
                fins[i][v].add_incoming(new[i][v], loop)
                builder.store(fins[i][v], at(pacc[i], c(64 * v), vty), align=size)
        return context.get_dummy_value()
    return types.void(acc, types.intp, types.intp, a, types.intp, b, types.intp, types.intp,
                      types.intp), codegen


@numba.njit(inline="always")
def _rn_cols(acc, r, b, k, n0, lo, hi, ak):
    """``acc[r, c] = acc[r, c] + ak·b[k, n0 + c]`` for lo <= c < hi, each op rounded."""
    W = _VEC // acc.itemsize
    c = lo
    while c + W <= hi:
        _axpy_rn(acc, r, c, b, k, n0 + c, ak)
        c += W
    ar = acc[r]
    bk = b[k]
    for j in range(c, hi):
        p = ak * bk[n0 + j]
        ar[j] = ar[j] + p


@numba.njit(inline="always")
def _rn_tile(a, b, key, m0, rows, n0, cols, base0, sm, sn, acc):
    """Round to nearest, ``s = s + a·b`` per step: the sums start at -0, which adds exactly
    (``-0 + t = t`` for every t, signed zeros included), so term 0 is ``s = t0``. Blocks of
    4 rows x 256 bytes in registers; the tile's edges row by row."""
    acc[:] = -0.0
    WB = 64 * _BV // acc.itemsize
    r4 = rows - rows % _BR
    cw = cols - cols % WB
    K = a.shape[1]
    for k0 in range(0, K, _KC):          # B's strip of _KC rows stays in L1 for every row block
        for c0 in range(0, cw, WB):
            for r0 in range(0, r4, _BR):
                _rn_block(acc, r0, c0, a, m0, b, n0, k0, min(k0 + _KC, K))
    if r4 < rows or cw < cols:
        for k in range(a.shape[1]):
            for r in range(rows):
                _rn_cols(acc, r, b, k, n0, 0 if r >= r4 else cw, cols, a[m0 + r, k])


@numba.njit(inline="always")
def _pairwise_tile(a, b, key, m0, rows, n0, cols, base0, sm, sn, acc):
    """The pairwise tree for a tile, _BR rows at a time: the stack of completed blocks (2^j
    terms each) of every element, a new block merged with its left neighbour while they have
    the same size; the remaining blocks added right to left."""
    K = a.shape[1]
    levels = 2
    while (1 << (levels - 1)) <= K:
        levels += 1
    stack = np.empty((levels, _BR, acc.shape[1]), acc.dtype)
    sizes = np.empty(levels, np.int64)
    for r0 in range(0, rows, _BR):
        nr = min(rows - r0, _BR)
        top = 0
        for k in range(K):
            bk = b[k]
            cur = stack[top]
            for r in range(nr):
                ak = a[m0 + r0 + r, k]
                cr = cur[r]
                for c in range(cols):
                    cr[c] = ak * bk[n0 + c]
            size = 1
            while top > 0 and sizes[top - 1] == size:
                prev = stack[top - 1]
                for r in range(nr):
                    pr, cr = prev[r], cur[r]
                    for c in range(cols):
                        pr[c] = pr[c] + cr[c]
                cur = prev
                size *= 2
                top -= 1
            sizes[top] = size
            top += 1
        for r in range(nr):
            ar = acc[r0 + r]
            for c in range(cols):
                ar[c] = stack[top - 1, r, c]
            for j in range(top - 2, -1, -1):
                sj = stack[j, r]
                for c in range(cols):
                    ar[c] = sj[c] + ar[c]


_MATMUL = {(o, p): make_matmul(t, _no_key, p, *shape)
           for o, t, shape in ((0, _rn_tile, (ROWS, COLS)), (1, _pairwise_tile, (_BR, 256)))
           for p in (True, False)}
_NOKEYS = np.zeros(1, np.uint64)


def matmul(A, B, order, out, parallel=True):
    """``out[g, m, n] = Σ_k A[g, m, k]·B[g, k, n]`` in ``order`` (0 sequential, 1 pairwise),
    rounded to nearest in the accumulation dtype that A, B and out share; a batch dimension
    of 1 broadcasts."""
    _MATMUL[order, parallel](A[None], np.ascontiguousarray(B)[None], _NOKEYS, 0, 0, 0, out[None])


# ---------------------------------------------------------------------------------------------
# sums along an axis
# ---------------------------------------------------------------------------------------------
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


# the same kernel compiled without threads (prange runs as range): for small problems, where
# starting the threads costs more than the work (the bits are the same either way)
_reduce_serial = numba.njit(**_opts)(reduce.py_func)
_SERIAL_BELOW = 1 << 18          # multiply-adds


def run(kernel, *args):
    """``matmul(A, B, order, out)`` or ``reduce(X, order, cumulative, out)`` (``kernel`` is
    one of them), threaded when the problem has at least 2^18 terms."""
    X = args[0]
    work = X.size * (args[1].shape[2] if kernel is matmul else 1)
    if kernel is matmul:
        matmul(*args, parallel=work >= _SERIAL_BELOW)
    else:
        (reduce if work >= _SERIAL_BELOW else _reduce_serial)(*args)


# ---------------------------------------------------------------------------------------------
# order "exact": the rounding test of a float64 product, and compensated dot products
# ---------------------------------------------------------------------------------------------
@numba.njit(inline="always")
def _sign(x):
    return math.copysign(1.0, x)


@numba.njit(**_opts)     # one thread: it runs right after a GEMM, whose BLAS threads still spin
def round_test_f32(s, ra, cb, coef, out, bad):
    """``out = float32(s)`` and ``bad`` where that is not proven the correct rounding of the
    exact value, known to lie within ``coef·ra[g, m]·cb[g, n]`` of ``s`` (G, M, N float64; ra
    and cb with a leading dimension of 1 or G): every real in ``s ± pad``, pad the bound plus
    the ends' own rounding (``|s|·2^-52 + 2^-1074``), must round to one float32, signed zeros
    told apart; a non-finite ``s`` or bound is undecided."""
    G, M, N = s.shape
    for gm in range(G * M):
        g = gm // M
        m = gm % M
        rm = ra[g if ra.shape[0] > 1 else 0, m] * coef
        cn = cb[g if cb.shape[0] > 1 else 0]
        for n in range(N):
            x = s[g, m, n]
            pad = rm * cn[n] + abs(x) * 2.0 ** -52 + 2.0 ** -1074
            lo = np.float32(x - pad)
            hi = np.float32(x + pad)
            out[g, m, n] = lo
            bad[g, m, n] = ((lo != hi) | (_sign(lo) != _sign(hi)) | ~np.isfinite(x)
                            | ~np.isfinite(pad))


@numba.njit(**_opts)     # one thread, as round_test_f32: few elements, right after a GEMM
def dot2(A, B, ga, gb, mi, ni, gamma2, s, err):
    """Compensated dot products (Ogita, Rump & Oishi's Dot2 with exact float64 products of
    float32 operands): ``s[j] ≈ Σ_k A[ga[j], mi[j], k]·B[gb[j], k, ni[j]]`` with
    ``|s - exact| <= err[j] = 2^-52·|s| + 2·gamma2·Σ|terms|`` (gamma2 = γ_K², their
    Proposition 4.5 with room for the float64 evaluation of the bound). Elements in chunks,
    the terms k in the outer loop (B read row by row)."""
    K = A.shape[2]
    J = mi.size
    CH = 256
    for ch in range((J + CH - 1) // CH):
        j0 = ch * CH
        nj = min(J - j0, CH)
        hi = np.zeros(nj)
        lo = np.zeros(nj)
        mag = np.zeros(nj)
        for k in range(K):
            for i in range(nj):
                j = j0 + i
                t = np.float64(A[ga[j], mi[j], k]) * np.float64(B[gb[j], k, ni[j]])
                h = hi[i]
                x = h + t
                bb = x - h
                lo[i] += (h - (x - bb)) + (t - bb)
                hi[i] = x
                mag[i] += abs(t)
        for i in range(nj):
            v = hi[i] + lo[i]
            s[j0 + i] = v
            err[j0 + i] = 2.0 ** -52 * abs(v) + 2.0 * gamma2 * mag[i]
