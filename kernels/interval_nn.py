"""Row kernels of the interval transform's softmax, layer-norm and attention rules (numba, IEEE
round-to-nearest, no fastmath): each row is read into cache once and bounded in a few
passes. The derivations are in
the rules' docstrings (``fpx/transforms/interval/nn.py``); the elementwise and ball kernels
they share are in :mod:`fpx.kernels.interval`.

* ``softmax_bounds``: the monotone bound of softmax over a box (or a ball, read as its box a
  block of rows at a time), row by row (with the log-domain bound where every shifted exp
  underflows);
* ``layer_norm_bounds``: layer norm over a box or a ball, coupling the row's mean and
  variance, the result a box or a ball about the program's value;
* ``ball_inside``: attention's test whether a hull can tighten a block of balls;
* ``masked_hull``: attention's hull of v's rows over each query's attended keys.
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import overload

from fpx.kernels.interval import _E, _TINY, _at, _put_up, _radius_abs_up, center_bounds


@numba.njit(inline="always")
def _nmax(a, b):
    """max that propagates NaN (np.maximum)."""
    return a if (a > b or a != a) else b


@numba.njit(inline="always")
def _nmin(a, b):
    """min that propagates NaN (np.minimum)."""
    return a if (a < b or a != a) else b


@numba.njit(inline="always")
def _row_max(x):
    """max of a 1-D array of finite floats (-inf if empty) over eight independent lanes (one
    running max is a chain of dependent compares that does not vectorize)."""
    n = x.shape[0]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = -math.inf
    j = 0
    while j + 8 <= n:
        a0, a1, a2, a3 = max(a0, x[j]), max(a1, x[j + 1]), max(a2, x[j + 2]), max(a3, x[j + 3])
        a4, a5, a6, a7 = (max(a4, x[j + 4]), max(a5, x[j + 5]), max(a6, x[j + 6]),
                          max(a7, x[j + 7]))
        j += 8
    while j < n:
        a0 = max(a0, x[j])
        j += 1
    return max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))


@numba.njit(inline="always")
def _row_sum(x):
    """Σ x of a 1-D float64 array over eight lanes (vectorizes; any order's error is the
    caller's γ_{n}(u64))."""
    n = x.shape[0]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    j = 0
    while j + 8 <= n:
        a0, a1, a2, a3 = a0 + x[j], a1 + x[j + 1], a2 + x[j + 2], a3 + x[j + 3]
        a4, a5, a6, a7 = a4 + x[j + 4], a5 + x[j + 5], a6 + x[j + 6], a7 + x[j + 7]
        j += 8
    while j < n:
        a0 += x[j]
        j += 1
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))


@numba.njit(inline="always")
def _row_dot(x, y):
    """Σ x·y of two 1-D float64 arrays over eight lanes (as ``_row_sum``)."""
    n = x.shape[0]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    j = 0
    while j + 8 <= n:
        a0, a1 = a0 + x[j] * y[j], a1 + x[j + 1] * y[j + 1]
        a2, a3 = a2 + x[j + 2] * y[j + 2], a3 + x[j + 3] * y[j + 3]
        a4, a5 = a4 + x[j + 4] * y[j + 4], a5 + x[j + 5] * y[j + 5]
        a6, a7 = a6 + x[j + 6] * y[j + 6], a7 + x[j + 7] * y[j + 7]
        j += 8
    while j < n:
        a0 += x[j] * y[j]
        j += 1
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))


@numba.njit(inline="always", error_model="numpy")
def _shift_row(lo_i, hi_i, r_s, a_s, k, dl_i, dh_i):
    """One row of a finite box: the box widened by the subtraction's rounding, minus its
    largest upper end (dl <= dh <= 0, the arguments of the exps); dl_i/dh_i may be lo_i/hi_i.
    Elementwise loops between lane-parallel maxima: they vectorize."""
    mlo, mhi = _row_max(lo_i), _row_max(hi_i)
    for j in range(lo_i.shape[0]):
        dist = max(abs(lo_i[j] - mhi), abs(hi_i[j] - mlo))
        pert = (r_s * dist + a_s) * (1 + k)
        a, b = lo_i[j] - pert, hi_i[j] + pert
        dl_i[j] = a - k * abs(a) - _TINY
        dh_i[j] = b + k * abs(b) + _TINY
    m = _row_max(dh_i)
    for j in range(lo_i.shape[0]):
        dl_i[j] -= m
        dh_i[j] -= m


@numba.njit(cache=True, error_model="numpy")
def _softmax_shift(lo, hi, r_s, a_s, k, dl, dh):
    """``_shift_row`` of every row."""
    for i in range(lo.shape[0]):
        _shift_row(lo[i], hi[i], r_s, a_s, k, dl[i], dh[i])


@numba.njit(cache=True, error_model="numpy")
def _softmax_row_bounds(dl, dh, el, eh, sl, sh, r_e, a_e, r_d, a_d, inv_dl_hi, inv_dh_lo, k,
                        ylo, yhi):
    """One row's bounds from its scaled exps and their sums, branch-free (vectorizes); returns
    whether an exp underflowed to 0 (a ratio 0/x or 0/0: the caller's log-domain row then)."""
    n = dl.shape[0]
    under = False
    for j in range(n):
        e_l, e_h = el[j], eh[j]
        others_hi = (sh - e_h) * (1 + 2 * _E)
        others_lo = max((sl - e_l) * (1 - 2 * _E), 0.0)
        den = e_h + others_lo
        under |= (e_l == 0.0) | (den == 0.0)
        plo = max(e_l / (e_l + others_hi) * (1 - 4 * _E), 0.0)
        phi = min(e_h / den * (1 + 4 * _E), 1.0)
        ylo[j], yhi[j] = _softmax_out(plo, phi, r_e, a_e, r_d, a_d, inv_dl_hi, inv_dh_lo, k)
    return under


@numba.njit(inline="always")
def _softmax_out(plo, phi, r_e, a_e, r_d, a_d, inv_dl_hi, inv_dh_lo, k):
    """The bounds of one output from the exact ratio's range [plo, phi]: the exp's error,
    nl / dhigh (nl >= 0) or nl / dlow and nh / dlow through reciprocals rounded outward (each
    product's own rounding included: see ``_softmax_rows``), the division's error."""
    nl = plo * (1 - r_e) - a_e
    nh = phi * (1 + r_e) + a_e
    qlo = nl * (inv_dh_lo if nl >= 0 else inv_dl_hi)
    qhi = nh * inv_dl_hi
    return ((qlo * (1 - r_d) - a_d) * (1 - k) - abs(qlo) * k - _TINY,
            (qhi * (1 + r_d) + a_d) * (1 + k) + _TINY)


@numba.njit(cache=True, error_model="numpy")
def _softmax_rows(dl, dh, el, eh, r_e, a_e, r_d, a_d, dlow, dhigh, g64, k, libm, ylo, yhi):
    """Per row, from the exps el = exp(dl), eh = exp(dh) (NumPy's SIMD exp): the exact softmax
    range over the box with outward allowances, then the evaluation's errors. Rows where an
    exp underflowed are redone with log-domain ratios (``_softmax_row_underflow``)."""
    rows, n = dl.shape
    # 1/dhigh rounded down and 1/dlow up by a margin that covers their rounding and the
    # product's: nl·inv_dh_lo <= nl/dhigh (nl >= 0), nl·inv_dl_hi <= nl/dlow (nl < 0),
    # nh·inv_dl_hi >= nh/dlow (nh >= 0)
    inv_dh_lo = 1.0 / dhigh * (1 - 4 * _E)
    inv_dl_hi = 1.0 / dlow * (1 + 4 * _E)
    for i in range(rows):
        dl_i, dh_i, el_i, eh_i = dl[i], dh[i], el[i], eh[i]
        for j in range(n):
            el_i[j] *= 1 - (libm + 4 + abs(dl_i[j])) * _E
            eh_i[j] *= 1 + (libm + 4 + abs(dh_i[j])) * _E
        sh = _row_sum(eh_i) * (1 + g64)
        sl = _row_sum(el_i) * (1 - g64)
        if _softmax_row_bounds(dl_i, dh_i, el_i, eh_i, sl, sh, r_e, a_e, r_d, a_d, inv_dl_hi,
                               inv_dh_lo, k, ylo[i], yhi[i]):
            _softmax_row_underflow(dl_i, dh_i, el_i, eh_i, sl, sh, libm, ylo[i], yhi[i],
                                   r_e, a_e, r_d, a_d, inv_dl_hi, inv_dh_lo, k)


@numba.njit(cache=True, error_model="numpy")
def _softmax_row_underflow(dl, dh, el, eh, sl, sh, libm, ylo, yhi, r_e, a_e, r_d, a_d,
                           inv_dl_hi, inv_dh_lo, k):
    """A row where some exp underflowed, element by element: where exp(dl_j) is 0 the ratio
    is at least 1/(1 + (n-1)·exp(max_{k != j} dh_k - dl_j)) in the log domain; where the
    denominator is 0 (a box far wider than float64's exp range: 0/0) it is at most
    exp(dh_j - max(dh_j, max_{k != j} dl_k)) (the denominator is at least its largest term)."""
    n = dl.shape[0]
    m1 = -math.inf       # the two largest lower arguments of the row, and where the first is
    m2 = -math.inf
    j1 = -1
    h1 = -math.inf       # the same for the upper arguments
    h2 = -math.inf
    k1 = -1
    for j in range(n):
        d_l, d_h = dl[j], dh[j]
        if d_l > m1:
            m1, m2, j1 = d_l, m1, j
        elif d_l > m2:
            m2 = d_l
        if d_h > h1:
            h1, h2, k1 = d_h, h1, j
        elif d_h > h2:
            h2 = d_h
    for j in range(n):
        e_l, e_h = el[j], eh[j]
        others_hi = (sh - e_h) * (1 + 2 * _E)
        others_lo = _nmax((sl - e_l) * (1 - 2 * _E), 0.0)
        plo = _nmax(e_l / (e_l + others_hi) * (1 - 4 * _E), 0.0)
        if e_l == 0.0:
            t = (h2 if j == k1 else h1) - dl[j]
            # (t = -inf: no other element, n = 1; the error factor made 0·inf NaN)
            et = (0.0 if t == -math.inf else
                  math.exp(t) * (1 + (libm + 4 + abs(t)) * _E) + _TINY)
            plo = _nmax(1.0 / (1.0 + (n - 1) * et * (1 + 2 * _E)) * (1 - 4 * _E), 0.0)
        if e_h + others_lo == 0.0:
            t = dh[j] - max(dh[j], m2 if j == j1 else m1)
            phi = math.exp(t) * (1 + (libm + 4 + abs(t)) * _E) + _TINY
        else:
            phi = e_h / (e_h + others_lo) * (1 + 4 * _E)
        phi = _nmin(phi, 1.0)
        ylo[j], yhi[j] = _softmax_out(plo, phi, r_e, a_e, r_d, a_d, inv_dl_hi, inv_dh_lo, k)


# rows per block of the softmax passes: a block's shifted arguments, exps and bounds stay in
# cache between the passes
_SOFTMAX_BLOCK = 256


def softmax_bounds(x, r_s, a_s, k, r_e, a_e, r_d, a_d, dlow, dhigh, g64, libm):
    """fpx.interval's softmax rule (see its docstring for the derivation) along the last axis
    of ``x``, a box (lo, hi) or a ball (v, r, top) whose box is formed a block of rows at a
    time (``center_bounds``, as the ball's own ``lo``/``hi``): two compiled row passes around
    NumPy's SIMD exp, elementwise loops that vectorize, over blocks of rows that stay in
    cache."""
    shape = x[0].shape
    a2, b2 = (np.ascontiguousarray(z).reshape(-1, shape[-1]) for z in x[:2])
    consts = (float(r_s), float(a_s), float(k))
    if len(x) == 2:
        a2, b2 = np.asarray(a2, np.float64), np.asarray(b2, np.float64)

        def shift(s, e, dl, dh):
            _softmax_shift(a2[s:e], b2[s:e], *consts, dl, dh)
    else:
        def shift(s, e, dl, dh):
            lo, hi, _ = center_bounds(a2[s:e], b2[s:e], 1.0, 0.0, x[2])
            _softmax_shift(lo, hi, *consts, dl, dh)
    ylo, yhi = np.empty(a2.shape), np.empty(a2.shape)
    _softmax_blocks(shift, a2.shape, (r_e, a_e, r_d, a_d, dlow, dhigh, g64, k, libm),
                    ylo, yhi)
    return ylo.reshape(shape), yhi.reshape(shape)


def _softmax_blocks(shift, shape2, consts, ylo, yhi):
    """The softmax passes over blocks of ``_SOFTMAX_BLOCK`` rows of a (rows, n) block:
    ``shift(s, e, dl, dh)`` writes rows s..e of the shifted box, NumPy's exp, the bounds
    rows into ylo/yhi (a block's arrays stay in cache between the passes)."""
    rows, n = shape2
    bl = max(1, min(rows, _SOFTMAX_BLOCK))
    c = tuple(float(z) for z in consts)
    dl, dh, el, eh = (np.empty((bl, n)) for _ in range(4))
    with np.errstate(all="ignore"):
        for s in range(0, rows, bl):
            e = min(s + bl, rows)
            m = e - s
            dl_b, dh_b, el_b, eh_b = dl[:m], dh[:m], el[:m], eh[:m]
            shift(s, e, dl_b, dh_b)
            np.exp(dl_b, out=el_b)
            np.exp(dh_b, out=eh_b)
            _softmax_rows(dl_b, dh_b, el_b, eh_b, *c, ylo[s:e], yhi[s:e])


@numba.njit(cache=True, error_model="numpy")
def _rounded_down(x):
    """x moved down by 4 units of float64 rounding (a lower bound of a computed sum or
    product of either sign)."""
    return x * (1 - 4 * _E) if x > 0 else x * (1 + 4 * _E)


@numba.njit(cache=True, error_model="numpy")
def _ln_q_max(n, var_lo, M2, e_mu, a_v, g_v, d_op, d_s, eta, eps):
    """An a priori bound on |(x_i - μ')/s'| (the program's normalized value before its own
    rounding) over a layer norm's box; inf where none applies. |x_i - μ| <= sqrt((n-1)·var)
    for every x (Σ_j (x_j - μ) = 0 and Cauchy-Schwarz), |μ' - μ| <= e_μ, the program's
    var' >= max(0, var - G·σ - β) (σ = sqrt(var), G = γ·sqrt(M2), β = G·e_μ + a_v: the
    rule's error terms for this x's own variance) and s'² >= (1-d)(var' + eps) - η. Two
    ways to keep the dip of var - G·σ from reaching s': (a) var - G·σ >= (1-θ)·var -
    G²/(4θ) with G²/(4θ) paid from eps; (b) σ >= m·G gives var - G·σ >= (1 - 1/m)·var, and
    below that var' >= 0 leaves s'² >= (1-d)·eps - η. The least of the bounds is taken.
    Without it a wide box (s_lo near sqrt(eps)) would give |y - b| up to |x|/sqrt(eps)·|w|,
    far past sqrt(n)·|w|."""
    E = _E
    G = g_v * math.sqrt(M2) * (1 + 4 * E)
    beta = (G * e_mu + a_v) * (1 + 4 * E)
    k1 = (eps - beta) * (1 - 4 * E)
    sq = math.sqrt(n - 1)
    best = math.inf
    if k1 > 0:                                              # (a)
        th = max(G * G / (2 * k1), 1.0 / 1024)
        kap = ((1 - d_op) * (k1 - G * G / (4 * th) * (1 + 4 * E)) - eta) * (1 - 4 * E)
        c = (1 - d_op) * (1 - th) * (1 - 4 * E)
        den = (c * var_lo + kap) * (1 - 4 * E)
        if th <= 0.5 and kap >= 0 and den > 0:
            best = (math.sqrt((n - 1) / c) * (1 + 4 * E) + e_mu / math.sqrt(den)) * (1 + 4 * E)
    base = ((1 - d_op) * eps - eta) * (1 - 4 * E)
    kap = ((1 - d_op) * k1 - eta) * (1 - 4 * E)
    if base > 0 and kap >= 0:                               # (b)
        for m in (1.5, 2.0, 4.0, 8.0, 16.0, 64.0):
            c = (1 - d_op) * (1 - 1 / m) * (1 - 4 * E)
            den = (c * var_lo + kap) * (1 - 4 * E)
            if not den > 0:
                continue
            r = (math.sqrt((n - 1) / c) * (1 + 4 * E) + e_mu / math.sqrt(den)) * (1 + 4 * E)
            if var_lo < (m * G) * (m * G):
                r = max(r, (sq * m * G * (1 + 4 * E) + e_mu) / math.sqrt(base) * (1 + 4 * E))
            best = min(best, r)
    elif base > 0:                                          # (c)
        # the rule's error terms exceed eps (a wide box, a small eps): s'² >= base always
        # (var' >= 0), and s'² >= c·var + kap where σ >= m·G. Below σ1 = max(m·G,
        # sqrt((base - kap)/c)) the quotient is <= (sq·σ1 + e_μ)/sqrt(base); above it
        # (sq·σ + e_μ)/sqrt(c·σ² + kap) falls with σ (kap < 0), so the same bound holds
        kl = _rounded_down(_rounded_down(eps - beta) * (1 - d_op) - eta)   # <= kap (< 0)
        for m in (1.5, 2.0, 4.0):
            c = (1 - d_op) * (1 - 1 / m) * (1 - 4 * E)
            s1 = max(m * G, math.sqrt((base - kl) / c * (1 + 4 * E))) * (1 + 4 * E)
            r = (sq * s1 * (1 + 4 * E) + e_mu) / math.sqrt(base) * (1 + 4 * E)
            best = min(best, r)
    return best / (1 - d_s) * (1 + 8 * E) + _TINY


def _ln_load(v, a, b, i, vr, rr, xa, dr):
    """Row i of a layer norm's input into scratch: values, radii (upper bounds), magnitude
    bounds max|x| and |v| (plus x - x: NaN where an input is not finite). (a, b): the box
    (lo, hi), or (r, None) for a ball; resolved at compile time (as ``_at``)."""


@overload(_ln_load, inline="always")
def _ln_load_impl(v, a, b, i, vr, rr, xa, dr):
    if isinstance(b, types.NoneType):
        def ball(v, a, b, i, vr, rr, xa, dr):
            for j in range(vr.shape[0]):
                vv = np.float64(v[i, j])
                rj = np.float64(a[i, j])
                vr[j] = vv
                rr[j] = rj
                xa[j] = (abs(vv) + rj) * (1 + 2 * _E)
                dr[j] = abs(vv) + (rj - rj)
        return ball

    def box(v, a, b, i, vr, rr, xa, dr):
        for j in range(vr.shape[0]):
            vv = np.float64(v[i, j])
            lo, hi = np.float64(a[i, j]), np.float64(b[i, j])
            vr[j] = vv
            rr[j] = _radius_abs_up(vv, max(vv - lo, hi - vv))[0]
            xa[j] = max(abs(lo), abs(hi))
            dr[j] = abs(vv) + (lo - lo) + (hi - hi)
    return box


@numba.njit(error_model="numpy")
def _ln_emit(i, yl, yh, vy, out_a, out_b, ball):
    """Row i of a layer norm's result: the box (out_a, out_b), or for ``ball`` the radius
    about the program's output vy in out_a (``_ln_radius``); returns how many radii are not
    finite or more than 5% wider than their box (lopsided about the value)."""
    if ball:
        return _ln_radius(i, yl, yh, vy, out_a)
    for j in range(yl.shape[0]):
        out_a[i, j] = yl[j]
        out_b[i, j] = yh[j]
    return 0


@numba.njit(error_model="numpy")
def _ln_radius(i, yl, yh, vy, r):
    n_loose = 0
    for j in range(yl.shape[0]):
        vv = np.float64(vy[i, j])
        r1, r2 = vv - yl[j], yh[j] - vv
        r0 = r1 if r1 > r2 else r2
        r0 = math.nan if (r1 != r1) | (r2 != r2) else r0
        _put_up(r, i, j, r0 * (1.0 + 3 * _E))
        n_loose += (r0 != r0) | (r0 == math.inf) | (2 * r0 > 1.05 * (yh[j] - yl[j]))
    return n_loose


@numba.njit(cache=True, error_model="numpy")
def _layer_norm_rows(v, a, b_in, w, b, eps_lo, eps_hi, g_mu, g_v, g_out, d_op, d_s, eta,
                     g64, top, lim, wb_max, vy, out_a, out_b, ball_out):
    """fpx.interval's layer-norm rule (see its docstring for the derivation), one row at a
    time: pass 1 the row's sums, pass 2 the centred value's norm, pass 3 the bounds (input
    and output a box or a ball: ``_ln_load``, ``_ln_emit``). Returns (n_bad, n_loose): the
    rows where an intermediate of the program might pass ``lim`` (the squares and their
    sum, the normalized value or its scaling: overflow the bound does not model) or an input
    is not finite (those rows' bounds are left unset), and the radii that are not finite or
    lopsided (``_ln_emit``)."""
    rows, n = v.shape
    n_bad = n_loose = 0
    u64 = 2.0 ** -53
    sqn = math.sqrt(n) * (1 + 2 * _E)
    # the row's values, radii, magnitudes and centred values, in L1-resident scratch: every
    # pass below is elementwise or a lane-parallel reduction, so it vectorizes (the sums'
    # order is covered by γ_{n+4}(u64); one running sum per quantity does not vectorize)
    vr, rr, xa, dr = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
    yl, yh = np.empty(n), np.empty(n)
    for i in range(rows):
        _ln_load(v, a, b_in, i, vr, rr, xa, dr)
        s_av = _row_sum(dr)
        if not math.isfinite(s_av):           # a non-finite input: the caller's fallback
            n_bad += 1
            continue
        s_v = _row_sum(vr)
        s_r = _row_sum(rr)
        s_a = _row_sum(xa)
        s_q = _row_dot(xa, xa)
        xm = max(_row_max(xa), 0.0)
        mv = s_v / n
        # (mr, e64c at least 2^-968: every element's radius below adds them, and an
        # all-zero row of a float64 program would otherwise multiply subnormals per element,
        # a microcode assist each on Intel cores)
        mr = max(s_r / n * (1 + g64) + _TINY, 2.0 ** -968)    # >= mean(r)
        M1 = s_a / n * (1 + g64) + _TINY              # >= mean|x| over the box
        M2 = s_q / n * (1 + g64) + _TINY              # >= mean(x²) over the box
        e64c = max(s_av / n * g64 + _TINY, 2.0 ** -968)       # |mv - mean(v)|
        for j in range(n):
            dr[j] = vr[j] - mv
        s_d2 = _row_dot(dr, dr)
        s_r2 = _row_dot(rr, rr)
        nd_hi = math.sqrt(s_d2 * (1 + g64)) * (1 + 2 * _E)
        nd_lo = math.sqrt(s_d2 * (1 - g64)) * (1 - 2 * _E)
        nr = math.sqrt(s_r2 * (1 + g64)) * (1 + 2 * _E) + _TINY
        ne = (sqn * e64c + 2 * u64 * nd_hi) * (1 + 4 * _E)   # ||computed d - P·v||
        nlo = max((nd_lo - (nr + ne) * (1 + 2 * _E)) * (1 - 2 * _E), 0.0)
        nhi = (nd_hi + nr + ne) * (1 + 4 * _E)
        var_lo = nlo * nlo / n * (1 - 4 * _E)
        var_hi = nhi * nhi / n * (1 + 4 * _E)
        # the program's mean and variance (any order, two-pass or updating)
        e_mu = (g_mu * M1 + (n + 2) * eta) * (1 + 4 * _E)
        a_v = ((n + 4 + 3 * math.sqrt(M2)) * eta + eta * eta) * (1 + 8 * _E)
        # (every variance algorithm in use returns >= 0: sums of squares, Welford's
        # same-signed increments, one-pass clamped at 0)
        e_gen = g_v * math.sqrt(M2 * (var_hi + e_mu * e_mu)) * (1 + 8 * _E)
        vp_lo = max(var_lo * (1 - 4 * _E) - (e_gen + a_v) * (1 + 4 * _E), 0.0)
        vp_hi = ((var_hi + e_mu * e_mu) * (1 + g_v) + e_gen + a_v) * (1 + 8 * _E)
        t_lo = ((vp_lo + eps_lo) * (1 - d_op) - eta) * (1 - 4 * _E)
        t_hi = ((vp_hi + eps_hi) * (1 + d_op) + eta) * (1 + 4 * _E)
        s_lo = math.sqrt(t_lo) * (1 - d_s) * (1 - 4 * _E) if t_lo > 0 else 0.0
        s_hi = math.sqrt(t_hi) * (1 + d_s) * (1 + 4 * _E)
        mu_abs = (abs(mv) + e64c + mr + e_mu) * (1 + 4 * _E)   # >= |the program's mean|
        q_max = _ln_q_max(n, var_lo, M2, e_mu, a_v, g_v, d_op, d_s, eta, eps_lo)
        if (4 * xm * xm * n * 1.01 > lim) or (s_lo > 0 and 2.01 * xm / s_lo * wb_max > lim):
            n_bad += 1
        if not s_lo > 0:
            yl[:] = -math.inf
            yh[:] = math.inf
            n_loose += _ln_emit(i, yl, yh, vy, out_a, out_b, ball_out)
            if n_loose:
                break
            continue
        # d/s over s in [s_lo, s_hi] through reciprocals rounded outward (no division per
        # element): inv_hi <= 1/s_hi,
        # inv_lo >= 1/s_lo (finite: s_lo >= sqrt(2^-1074)); each product's own rounding is
        # the quotient's, which the 2ε steps below widen by
        inv_hi = 1.0 / s_hi * (1 - 2 * _E)
        inv_lo = 1.0 / s_lo * (1 + 2 * _E)
        for j in range(n):
            ww = np.float64(_at(w, i, j))
            bb = np.float64(_at(b, i, j))
            d = dr[j]
            rho = (rr[j] + mr + e64c + 2 * u64 * abs(d) + e_mu) * (1 + 6 * _E)
            dl = (d - rho) - abs(d - rho) * 2 * _E - _TINY
            dh = (d + rho) + abs(d + rho) * 2 * _E + _TINY
            ql = dl * (inv_hi if dl >= 0 else inv_lo)     # <= dl/s_hi resp. dl/s_lo
            qh = dh * (inv_lo if dh >= 0 else inv_hi)     # >= dh/s_lo resp. dh/s_hi
            ql -= abs(ql) * 2 * _E + _TINY
            qh += abs(qh) * 2 * _E + _TINY
            ql = max(ql, -q_max)
            qh = min(qh, q_max)
            ql, qh = (qh, ql) if ww < 0 else (ql, qh)
            zl = ql * ww + bb
            zh = qh * ww + bb
            zl -= (abs(ql * ww) + abs(bb)) * 4 * _E + _TINY
            zh += (abs(qh * ww) + abs(bb)) * 4 * _E + _TINY
            X = xa[j]
            aw = abs(ww) * inv_lo                        # >= |w|/s_lo, rounding in rnd's 8ε
            rnd = (g_out * ((X + mu_abs) * aw + abs(bb)) + eta * (3 + 2 * aw)) * (1 + 8 * _E)
            y = zl - rnd * (1 + 2 * _E) - abs(zl) * 2 * _E - _TINY
            z = zh + rnd * (1 + 2 * _E) + abs(zh) * 2 * _E + _TINY
            yl[j] = -math.inf if y < -top else y
            yh[j] = math.inf if z > top else z
        n_loose += _ln_emit(i, yl, yh, vy, out_a, out_b, ball_out)
        if n_loose:             # (the caller's box instead: no point going on)
            break
    return n_bad, n_loose


def layer_norm_bounds(v, x, w, b, eps_lo, eps_hi, g_mu, g_v, g_out, d_op, d_s, eta, top, lim,
                      vy=None):
    """fpx.interval's layer-norm rule over the last axis of (rows, n) blocks: ``x`` the input
    as a box (lo, hi) or a ball (r,) about its value v; ``w``/``b``: float64 rows of n, or
    scalars. Returns (ylo, yhi, n_bad), or with the program's output ``vy`` the radius of
    the result as a ball about it, (r, None, n_bad) -- (None, None, 0) where a radius is not
    finite or a ball is more than 5% wider than its box (bounds lopsided about the value: a
    wide box clamped by the a priori range). n_bad: rows where the program's intermediates
    might pass ``lim`` or an input is not finite. Three compiled passes per row, with the
    row in cache."""
    n = v.shape[-1]
    if vy is None:
        out_a, out_b = np.empty(v.shape), np.empty(v.shape)
    else:
        out_a = np.empty(v.shape, np.float32 if vy.dtype == np.float32 else np.float64)
        out_b = out_a
    wb_max = max(1.0, float(np.max(np.abs(w)))) + float(np.max(np.abs(b)))
    args = (v, x[0], x[1] if len(x) == 2 else None, w, b, float(eps_lo), float(eps_hi),
            float(g_mu), float(g_v), float(g_out), float(d_op), float(d_s), float(eta),
            (n + 4) * 2.0 ** -53 / (1 - (n + 4) * 2.0 ** -53), float(top), float(lim), wb_max,
            v if vy is None else vy, out_a, out_b, vy is not None)
    n_bad, n_loose = _layer_norm_rows(*args)
    if vy is not None:
        return (None, None, 0) if n_loose and not n_bad else (out_a, None, n_bad)
    return out_a, out_b, n_bad


@numba.njit(cache=True, error_model="numpy")
def _inside_loop(v, r, lo, hi):
    full = lo.shape[1] != 1
    for b in range(v.shape[0]):
        for i in range(v.shape[1]):
            k = i if full else 0
            for j in range(v.shape[2]):
                vv = np.float64(v[b, i, j])
                w = np.float64(r[b, i, j]) * (1 + 2.0 ** -40) + 1e-300
                if not ((vv - w >= lo[b, k, j]) & (vv + w <= hi[b, k, j])):   # (NaN: False)
                    return False
    return True


def ball_inside(v, r, lo, hi):
    """Is every ball ``|y - v| <= r`` of an (..., L, E) block (widened by far more than its
    box conversion's own rounding) inside [lo, hi], given per block row (..., L, E) or per
    block (..., 1, E)? One pass that stops at the first ball outside: the attention rule's
    test whether its hull of v's rows can tighten the bound at all."""
    shape = np.shape(v)
    lead = shape[:-2]
    v3 = np.reshape(v, (-1,) + shape[-2:])
    r3 = np.reshape(np.broadcast_to(r, shape), v3.shape)
    lo3, hi3 = (np.reshape(np.broadcast_to(np.asarray(z, np.float64), lead + np.shape(z)[-2:]),
                           (-1,) + np.shape(z)[-2:]) for z in (lo, hi))
    return bool(_inside_loop(v3, r3, lo3, hi3))


@numba.njit(cache=True)
def _masked_hull_loop(t, vlo, vhi, mn, mx):
    for g in range(t.shape[0]):
        for i in range(t.shape[1]):
            for j in range(t.shape[2]):
                if t[g, i, j]:
                    for e in range(vlo.shape[2]):
                        mn[g, i, e] = min(mn[g, i, e], vlo[g, j, e])
                        mx[g, i, e] = max(mx[g, i, e], vhi[g, j, e])


def masked_hull(taken, vlo, vhi):
    """(min, max) over the keys j that query i attends (``taken[..., i, j]``) of the rows
    ``vlo[..., j, :]`` and ``vhi[..., j, :]`` (finite float64): (..., L, E) arrays, +inf and
    -inf where a query attends no key; batch dimensions broadcast. One pass over the mask
    (the NumPy form builds an (..., L, S, E) array)."""
    lead = np.broadcast_shapes(np.shape(taken)[:-2], np.shape(vlo)[:-2])
    L, S = np.shape(taken)[-2:]
    E = np.shape(vlo)[-1]
    t3 = np.broadcast_to(taken, lead + (L, S)).reshape(-1, L, S)
    lo3, hi3 = (np.broadcast_to(z, lead + (S, E)).reshape(-1, S, E) for z in (vlo, vhi))
    mn = np.full((t3.shape[0], L, E), np.inf)
    mx = np.full((t3.shape[0], L, E), -np.inf)
    _masked_hull_loop(t3, lo3, hi3, mn, mx)
    return mn.reshape(lead + (L, E)), mx.reshape(lead + (L, E))
