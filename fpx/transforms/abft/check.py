"""Checksums, verification, location and correction of one GEMM ``C = A @ B`` (batched: A
(G|1, M, K), B (G|1, K, N), C (G, M, N), all in the accumulator's dtype).

Row check, with weights r1 = 1 and r2 = (1, ..., N):

    chk = A (B [r1 r2])      (the checksum path: O(MK + KN))
    obs = C [r1 r2]          (the observed path: O(MN))
    D = obs - chk            (sign convention: observed minus expected, so D1 ~ +delta)

A row is *detected* when |D1| exceeds its threshold, or when C's row is not finite while its
checksum is and its clean recomputation is finite (where that overflows too, the output format
does: the row is unverified). The faulty column is located by j = D2/D1 - 1 (0-based; a
non-finite row: its one non-finite element). Correction under the single-error model
recomputes that one element (a K-term dot product; C_ij - D1 would lose it when the fault is
large, as the row sum absorbs the rest) and re-verifies the row. Where D2 overflows (a fault
near the format's largest value), the row's one non-finite element, else its largest one, is
the suspect -- the re-verification decides; where the location does not hold (two faults in a
row), the row is recomputed. The column check is the row check of C^T = B^T A^T. The sums (and the
thresholds' operand statistics) come from :mod:`.sums`: one fused pass over B, A and C each.
"""
from __future__ import annotations

import numpy as np

from fpx.transforms.abft.sums import input_sums, output_sums, row_sums
from fpx.transforms.abft.thresholds import Info

__all__ = ["check", "prepare"]


class _Stats:
    __slots__ = ("threshold", "residual", "ratio", "detected", "corrected", "recomputed",
                 "uncorrected", "unverified", "locations", "sum_t", "sum_e")

    def __init__(self):
        self.threshold = self.residual = self.ratio = self.sum_t = self.sum_e = 0.0
        self.detected = self.corrected = self.recomputed = self.uncorrected = 0
        self.unverified = 0
        self.locations = []


def _located(d1, d2, N):
    """j = D2/D1 - 1 (None where it is not a column index)."""
    q = d2 / d1 - 1.0 if d1 != 0 else np.nan
    return int(np.rint(q)) if np.isfinite(q) and 0 <= np.rint(q) < N else None


def _round_out(x, out):
    """Values as the output format stores them (offline), kept in the accumulator's dtype."""
    return x if out is None else np.asarray(x).astype(out).astype(x.dtype)


def _rows(A, B, C, **kw):
    """One pass of row checks over C (A (Ga, M, K), B (Gb, K, N)); updates ``kw["st"]``.
    Overflow and NaN are results here (reported), not warnings."""
    with np.errstate(all="ignore"):
        _rows_checked(A, B, C, **kw)


def _needs(tfun, dtype):
    """The statistics a threshold evaluates from the sums (none for integers and callables)."""
    return getattr(tfun, "needs", {}) if dtype.kind == "f" and hasattr(tfun, "of") else {}


def _rows_checked(A, B, C, *, tfun, info, correct, out, st, transpose, kernel, pre=None):
    G, M, N = C.shape
    K = A.shape[-1]
    exact = C.dtype.kind in "iu"
    of = None if exact else getattr(tfun, "of", None)
    s = output_sums(pre or input_sums(A, B, kernel=kernel, **_needs(tfun, C.dtype)), C)
    chk, obs = np.broadcast_to(s.chk, (G, M)), s.obs
    if exact:
        D = (obs - chk).astype(np.float64)
        T = np.zeros((G, M))
    else:
        D = obs - chk
        info.K, info.N, info.b_sum, info.C = K, N, s.b1, C
        T = np.broadcast_to(np.asarray(of(s, info) if of else tfun(A, B, info), np.float64),
                            (G, M))
    ok = np.isfinite(chk)
    fin = np.isfinite(obs)
    if (ok & ~fin).any():        # a genuine overflow of the output is no fault: unverified
        ok = ok & ~_overflowing(A, B, ok & ~fin, out)
    E = np.abs(D)
    bad = ok & (~fin | (E > T))
    st.unverified += int(M * G - ok.sum())
    good = ok & fin
    if good.any():
        Eg, Tg = E[good], T[good]
        st.residual = max(st.residual, float(Eg.max()))
        with np.errstate(all="ignore"):
            r = np.where(Tg > 0, Eg / Tg, np.where(Eg > 0, np.inf, 0.0))
        st.ratio = max(st.ratio, float(r.max()))
        st.sum_t += float(Tg.sum())
        st.sum_e += float(Eg.sum())
    if ok.any():
        st.threshold = max(st.threshold, float(np.fmax.reduce(T, None, where=ok, initial=0.0)))
    if bad.any():
        s2 = row_sums(A, B, C, weighted=True, kernel=kernel)
        _fix(A, B, C, s2, D, T, bad, fin, correct=correct, out=out, st=st, transpose=transpose)


def _overflowing(A, B, rows, out):
    """Of the ``rows`` whose result is not finite while their checksum is, those whose clean
    recomputation (the operands as given, outside any injected fault) is not finite either:
    the output format overflows there (an input of 3e38 in a float32 GEMM), so the checksum
    cannot verify the row."""
    Ab = np.broadcast_to(A, (rows.shape[0],) + A.shape[1:])
    Bb = np.broadcast_to(B, (rows.shape[0],) + B.shape[1:])
    res = np.zeros(rows.shape, bool)
    for g, i in zip(*np.nonzero(rows)):
        res[g, i] = not np.isfinite(_round_out(np.matmul(Ab[g, i], Bb[g]), out)).all()
    return res


def _fix(A, B, C, s, D, T, bad, fin, *, correct, out, st, transpose):
    """Locate, and with ``correct`` correct, the rows ``bad`` flags (``s``: the weighted
    sums, computed from C before any change)."""
    G, M, N = C.shape
    exact = C.dtype.kind in "iu"
    chk0 = np.broadcast_to(s.chk, (G, M))
    chk2 = np.broadcast_to(s.chk2, (G, M))
    Ab = np.broadcast_to(A, (G,) + A.shape[1:])
    Bb = np.broadcast_to(B, (G,) + B.shape[1:])
    for g, i in zip(*np.nonzero(bad)):
        st.detected += 1
        row = C[g, i]
        j = _located(float(D[g, i]), float(s.obs2[g, i] - chk2[g, i]), N) if fin[g, i] \
            else None
        if j is None:            # a weighted sum overflowed, or a non-finite result: the
            nf = np.flatnonzero(~np.isfinite(row))         # one non-finite element, else
            j = int(nf[0]) if nf.size == 1 else None if nf.size else \
                int(np.argmax(np.abs(row)))                # the outlier (re-verified below)
        if j is not None:
            st.locations.append((int(g), int(j), int(i)) if transpose else (int(g), int(i), j))
        if not correct:
            continue

        if j is not None:
            row[j] = _round_out(np.dot(Ab[g, i], Bb[g, :, j]), out)
            if _passes(row, chk0[g, i], T[g, i], exact):
                st.corrected += 1
                continue
        row[:] = _round_out(np.matmul(Ab[g, i], Bb[g]), out)
        if _passes(row, chk0[g, i], T[g, i], exact):
            st.recomputed += 1
        else:
            st.uncorrected += 1


def _passes(row, target, t, exact) -> bool:
    """Does a corrected row verify against its checksum?"""
    s = row.sum(dtype=row.dtype if exact else np.float64)
    e = abs(int(s) - int(target)) if exact else abs(float(s) - float(target))
    return bool(np.isfinite(e) and e <= t)


def _plan(checksums, M, N):
    """The checks that run: rows; columns where rows cannot check (``"auto"``)."""
    if checksums == "auto":
        checksums = "row" if N >= 2 else "column"
    return tuple(k for k, n in (("row", N), ("column", M))
                 if checksums in (k, "both") and n >= 2)


def _sides(A, B):
    """{check: its (A, B)}: the column check is the row check of C^T = B^T A^T."""
    return {"row": (A, B), "column": tuple(np.swapaxes(x, -1, -2) for x in (B, A))}


def prepare(A, B, *, tfun, checksums, kernel="fused"):
    """The operands' sums of the checks :func:`check` will run on C = A @ B (``pre=``),
    computed before the GEMM: its passes over A and B then do not follow the BLAS call, whose
    worker threads keep spinning for a while after it. None where nothing is checked."""
    M, K, N = A.shape[-2], A.shape[-1], B.shape[-1]
    if M * N == 0 or K == 0:
        return None
    sides = _sides(A, B)
    return {k: input_sums(*sides[k], kernel=kernel, **_needs(tfun, A.dtype))
            for k in _plan(checksums, M, N)}


def check(A, B, C, *, tfun, info: Info, checksums, correct, out, kernel="fused", pre=None):
    """Verify (and correct in place) C = A @ B; ``out``: the output dtype whose values C holds
    (offline verification of a rounded output), else None; ``kernel``: the sums' passes,
    "fused" (numba) or "numpy" (:mod:`.sums`); ``pre``: :func:`prepare`'s operand sums (of
    the same A, B, checksums and threshold), else computed here. Returns (stats, checks
    run)."""
    st = _Stats()
    G, M, N = C.shape
    if C.size == 0 or A.shape[-1] == 0:           # nothing to check, or an exact zero sum
        return st, ()
    if correct and not C.flags.writeable:
        raise ValueError("fpx.abft: internal: the GEMM result is read-only")
    done = _plan(checksums, M, N)
    sides = _sides(A, B)
    for k in done:
        Ck = C if k == "row" else np.swapaxes(C, -1, -2)
        _rows(*sides[k], Ck, tfun=tfun, info=info, correct=correct, out=out, st=st,
              transpose=k == "column", kernel=kernel, pre=pre and pre.get(k))
    return st, done
