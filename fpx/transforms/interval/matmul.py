"""The interval rule of every contraction -- matmul, linear and conv -- over three strategies.

For y = op(A, B) with K terms per output, a program value v, and every operand known as a
ball about its value (``IntervalInterpreter.radius``: Â = |v_A| + r_A, B̂ likewise):

1. **exact**: integer and bool operands; the product's range, tightened to the integers.
2. **value-centred** (Rump 1999, "Fast and parallel interval arithmetic"): the centre is the
   program's own value v, the radius one GEMM of nonnegative factors,
   ``|y - v| <= κ·(L_A @ B̂ + |v_A| @ r_B) + cb·|v|`` with ``L_A = 2α·Â + r_A``.
3. **own centre** (point or narrow operands, where counting v's own error twice would be
   ~2x wider): ``C = v_A @ v_B`` in float64 (the centre provider: exact products,
   ``|C - exact| <= g·T``, g = γ_{K+2}(u64)), radius ``(α + g(1+β))·Â @ B̂ + (1+β)·(r_A @ B̂
   + |v_A| @ r_B) + β·|C|``.

α, β: a dot product's rounding error in the partial-sum form ``|fl(a·b) - a·b| <= α·T +
β·|Σ a_i b_i|`` (T = Σ|a_i b_i|; ``_Split``), valid for any summation order, blocking,
split-K or atomics; β = 0 gives the classic ``c_K·T`` (Higham 2002, §3.1). The radius GEMMs
run on an engine (``engines``); the result is a ball about v (strategy 2) or a box, with the
accumulator's overflow, operand conversions (tf32) and the output's rounding accounted for.
"""
from __future__ import annotations

import math

import numpy as np

from fpx.core import concrete
from fpx.kernels import conv as _kconv
from fpx.kernels import interval as _K
from fpx.transforms.interval import engines
from fpx.transforms.interval.enclosure import (E64, accuracy_terms, as_f64, gamma64,
                                               no_claim_where_nan, or_unstable, overflow,
                                               partial_sum_split, round_bounds, up, widen)
from fpx.transforms.interval.interpreter import rule
from fpx.transforms.interval.logic import bool_interval, contains_format



# ---- the error constants ----------------------------------------------------------------------
def matmul_constant(self, F_in, F_prod, F_acc, K):
    """c_K = δ_p + γ_{K-1}(δ_acc)(1+δ_p): ``|fl(Σ a_i b_i) - Σ a_i b_i| <= c_K·Σ|a_i b_i|`` for
    any summation order (each product rounds once, then the sum); round-to-nearest
    accumulation improves γ_{K-1} to (K-1)·δ_acc (``sum_gamma``)."""
    d_p = 0.0 if 2 * F_in.p <= F_prod.p else 2.0 ** -F_prod.p
    acc = self.accuracy("matmul", F_acc)
    d_acc = acc.ulps * 2.0 ** (1 - F_acc.p) if not acc.input_dependent else math.inf
    return d_p + self.sum_gamma(max(K - 1, 0), d_acc, acc.ulps == 0.5) * (1 + d_p)


class _Split:
    """A dot product's error in the partial-sum form ``α·T + β·|E|`` (T = Σ|a_i b_i|, E the
    exact sum): the m = K-1 additions err by δ relative to their exact results, whose
    operands hold partial sums in [-N, P] (P, N: the positive and negated negative products'
    sums) plus the errors below, so ε <= δ_p·T + m·δ·(max(P, N) + ε) with max(P, N) =
    (T + |E|)/2: α = (δ_p + mδ/2)/(1 - mδ), β = (mδ/2)/(1 - mδ). Value-centred, with |E| <=
    |s| + e₀ + ρ: every other execution's error plus the centre's own sum to at most
    ``κ·(2α·T̂ + ρ) + cb·|v|``, κ = (1+β)/(1-β), v the program's value (|s| <= (|v| +
    abs)/(1-q) through its rounding to the output format q). (c, 0): the classic bound."""
    __slots__ = ("alpha", "beta", "kappa", "cb", "ab")

    def __init__(self, alpha, beta, q=0.0, abs_out=0.0):
        self.alpha, self.beta = alpha, beta
        self.kappa = (1 + beta) / (1 - beta) * (1 + 4 * E64) if beta else 1.0
        self.cb = 2 * self.kappa * beta / (1 - q) * (1 + 4 * E64) if beta else 0.0
        self.ab = self.cb * abs_out * (1 + 2 * E64)

    def scaled(self, rad):
        """A value-centred radius (R, f, a) -> κ·(R, f, a) plus the accumulator's absolute
        term (cb·|v| is the centre term of ``center_bounds``)."""
        if not self.beta:
            return rad
        R, f, a = rad
        return R, f * self.kappa * (1 + 2 * E64), (a * self.kappa + self.ab) * (1 + 4 * E64)


def matmul_split(self, c, F_in, F_prod, F_acc, K, F_out=None):
    """``_Split`` of a K-term dot product under the policy: the partial-sum form where the
    rigorous model applies, m·δ <= 2^-10 (where terms do not cancel the denominators cost at
    most 0.1% against c) and the output rounding's accuracy is a constant; else (c, 0)."""
    acc = self.accuracy("matmul", F_acc)
    if self.bound != "rigorous" or acc.input_dependent or K < 2:
        return _Split(c, 0.0)
    d_p = 0.0 if 2 * F_in.p <= F_prod.p else 2.0 ** -F_prod.p
    split = partial_sum_split(K - 1, acc.ulps * 2.0 ** (1 - F_acc.p), d_p)
    if split is None:
        return _Split(c, 0.0)
    alpha, beta = split
    if alpha >= c:
        return _Split(c, 0.0)
    q = abs_out = 0.0
    if F_out is not None and F_out.name != F_acc.name:
        cast = self.accuracy("cast", F_out)
        if cast.input_dependent:
            return _Split(c, 0.0)
        q = cast.ulps * 2.0 ** (1 - F_out.p)
        abs_out = cast.ulps * F_out.smallest_subnormal + cast.absolute
    return _Split(alpha, beta, q, abs_out)


# ---- the contractions -------------------------------------------------------------------------
class _Contraction:
    """What the strategies need of y = op(A, B) (a matmul, or a linear or conv layer): ``K``
    terms per output; ``upper(L, M, small, scale, bias_coef, bf16)`` -> (R, f, a) bounding
    ``scale·(op(L, M) + bias_coef·|b|)`` for nonnegative factors (an engine); ``centre(A, B,
    parts)`` -> (C, rel, extra), the centre provider; ``spread``: which outputs a marked
    operand element reaches. ``bias``: a bias that is one more term of each sum (linear and
    conv), whose left factor is that of a point 1."""

    def __init__(self, self_, prim, K, params=None, bias=None):
        self.interp, self.prim, self.K, self.params = self_, prim, K, params or {}
        self.bias = bias

    def upper(self, L, M, small, scale=1.0, bias_coef=0.0, bf16=False):
        name = self.prim.name
        bias_term = None if self.bias is None or not bias_coef else \
            np.abs(as_f64(self.bias)) * bias_coef
        if name == "conv":
            b32 = None if bias_term is None else engines.f32_upper(up(bias_term, 1))
            return engines.upper_conv(engines.f32_upper(L), engines.f32_upper(M), b32,
                                      self.params, self.K, scale, self._run, bf16)
        if name == "linear":
            M = np.swapaxes(M, -1, -2)
        add = 0.0 if bias_term is None else up(scale * bias_term, 2)
        return engines.upper_gemm(L, M, self.K, small, scale, add, bf16=bf16)

    def upper_pair(self, L, M, L2, M2, small, scale=1.0):
        """``upper`` of ``L @ M + L2 @ M2`` as one sum of 2K terms (``engines.upper_gemm_sum``):
        a matmul whose right operand is an interval (a layer's weights are constants)."""
        assert self.prim.name == "matmul", self.prim.name
        return engines.upper_gemm_sum(L, M, L2, M2, self.K, small, scale)

    def _run(self, x, w, b):
        return self.interp.bind_parent(self.prim, x, w, b, **self.params)

    def centre(self, A, B, parts):
        """The centre provider: (C, rel, extra) with ``|C - op(A, B)| <= rel·op(|A|, |B|) +
        extra``. ``parts`` (float32 point operands; narrow intervals keep the tighter float64
        centre): the float32 op over parts of its sums (K in four, a convolution's input
        channels in up to four) added in float64 where that applies (``_parts_centre``: C a
        :class:`_PartsCentre`, its extra inside); else the op in float64 (exact products,
        rel = γ_{K+2}(u64))."""
        got = self._parts_centre(A, B) if parts else None
        if got is not None:
            return got
        name = self.prim.name
        b = None if self.bias is None else as_f64(self.bias)
        with np.errstate(all="ignore"):
            if name == "conv":
                C = engines.centre_conv(A, B, b, self.params, self._run)
                return C, gamma64(self.K), 0.0
            C = engines.gemm(engines.float64_copy(A, "centre-A"), engines.float64_copy(
                np.swapaxes(B, -1, -2) if name == "linear" else B, "centre-B"))
        return (C if b is None else C + b), gamma64(self.K), 0.0

    def _parts_centre(self, A, B):
        """C = Σ_j fl32(op(A_j, B_j)) in float64 over parts of each sum (+ a bias in the sum,
        exactly). Part j errs by <= α_h·T_j + β_h·|E_j| <= (α_h·T_j + β_h·|P_j|)/(1 - β_h)
        (the partial-sum form, K_j terms in float32), the float64 additions by <= (n+1)·u64·S,
        S = Σ|P_j| (+ |b|): rel = α_h/(1 - β_h), extra = (β_h/(1 - β_h) + (n+1)·u64)·S (C
        and extra kept as a :class:`_PartsCentre`): a float32 op's cost in place of a float64
        one's, ~(1 + 1/n)·α·T where terms cancel. None where it does not apply (non-float32 or
        CuPy operands, parts too long for the form)."""
        name = self.prim.name
        if not (type(A) is np.ndarray and type(B) is np.ndarray
                and A.dtype == B.dtype == np.float32 and A.ndim >= 1 and B.ndim >= 2):
            return None
        if name == "conv":
            p = self.params
            got = _kconv.conv_blocks_f32(A, B, p["stride"], p["padding"], p["dilation"],
                                         p["groups"], min(4, B.shape[1]))
            if got is None:
                return None
            parts, kj = got
        else:
            W = np.swapaxes(B, -1, -2) if name == "linear" else B
            K = A.shape[-1]
            if K < 64 or W.ndim != 2:
                return None
            h = -(-K // 4)
            kj = h
            with np.errstate(all="ignore"):
                parts = [engines.gemm(A[..., k:k + h], W[k:k + h]) for k in range(0, K, h)]
        split = partial_sum_split(kj - 1, 2.0 ** -24, 2.0 ** -24)     # float32 parts
        if split is None:
            return None
        a_h, b_h = split
        s_coef = up(b_h / (1 - b_h) + (len(parts) + 1) * 2.0 ** -53, 2)
        b = 0.0 if self.bias is None else as_f64(self.bias)
        if name == "conv" and self.bias is not None:
            b = np.reshape(b, (-1,) + (1,) * (parts[0].ndim - 2))
        return _PartsCentre(parts, b, s_coef), up(a_h / (1 - b_h), 2), 0.0

    def spread(self, ma, mb, shape):
        """Outputs whose terms include a marked element of A (``ma``) or B (``mb``); None
        where nothing is marked."""
        if not (np.any(ma) or np.any(mb)):
            return None
        if self.prim.name == "matmul":
            return matmul_unstable(ma if np.any(ma) else None, mb if np.any(mb) else None,
                                   shape)
        # a layer: the op of the marks' indicators is > 0 where a mark reaches an output
        ind = lambda m, like: np.broadcast_to(np.asarray(m, np.float32), np.shape(like))  # noqa: E731
        A, B = np.ones(np.shape(ma), np.float32), np.ones(np.shape(mb), np.float32)
        R = self.upper(ind(ma, A), B, True)[0] + self.upper(A, ind(mb, B), True)[0]
        return np.broadcast_to(R > 0, shape)


class _PartsCentre:
    """A centre ``C = Σ_j P_j + b`` kept as its float32 parts, with its error term ``E =
    s_coef·(Σ|P_j| + |b|)`` entering a radius times ``scale``: the ball about the program's
    value is read from the parts in one pass (``ball``); C and the raised absolute term are
    made only where a box is needed (``materialize``)."""
    __slots__ = ("parts", "bias", "s_coef", "scale")

    def __init__(self, parts, bias, s_coef, scale=1.0):
        self.parts, self.bias, self.s_coef, self.scale = parts, bias, s_coef, scale

    def scaled(self, scale):
        return _PartsCentre(self.parts, self.bias, self.s_coef, scale)

    def ball(self, v, R, f, a, top, cb):
        """(r, n_bad) of ``_K.center_ball`` about v."""
        return _K.parts_ball(self.parts, self.bias, up(self.s_coef * self.scale, 1), v, R, f,
                             a, top, cb)

    def materialize(self, a):
        """(C, a + scale·E): the centre and the radius' absolute term as arrays."""
        C, E = _K.parts_sum(self.parts, self.bias, self.s_coef)
        return C, _K.scale_up(E, self.scale, a)


def matmul_unstable(au, bu, shape):
    """Outputs whose row of A or column of B holds a marked element (a 1-D operand is one
    row or column: its marks reach every output; a 1-D partner removes an axis of y)."""
    if au is None and bu is None:
        return None
    out = np.zeros(shape, bool)
    if au is not None:
        rows = np.any(au, axis=-1) if np.ndim(au) > 1 else np.any(au)
        if np.ndim(au) > 1 and len(shape) >= np.ndim(au):     # B a matrix: y's last axis is N
            rows = rows[..., None]
        out |= np.broadcast_to(rows, shape)
    if bu is not None:
        cols = np.any(bu, axis=-2) if np.ndim(bu) > 1 else np.any(bu)
        if np.ndim(bu) > 1 and len(shape) >= np.ndim(bu):     # A a matrix: y's axis -2 is M
            cols = cols[..., None, :]
        out |= np.broadcast_to(cols, shape)
    return out


# ---- the rules --------------------------------------------------------------------------------
@rule("matmul")
def _matmul(self, prim, a, b):
    v = self.value_of(prim, (a, b), {})
    if np.asarray(concrete(v)).dtype.kind in "biu":
        return _exact_matmul(self, v, a, b)
    K = np.shape(self.primal_of(a))[-1] if np.ndim(self.primal_of(a)) else 1
    return _contract(self, _Contraction(self, prim, K), v, a, b)


@rule("linear", "conv")
def _weighted(self, prim, x, w, b=None, **params):
    """A linear layer or convolution of an activation with constant weights (and bias): the
    matmul strategies with the layer as its own contraction (no im2col of bounds, no
    ``[x | 1]``). Interval or unstable operands, or a format the engines do not take, run the
    decomposition (and the matmul rule), whose bound covers the program's own routine (the
    same sum in another order) and takes its value."""
    in_sum = bool(params.get("bias_in_sum")) and b is not None
    wc = None if self._own(w) else concrete(w)
    bc = None if b is None or self._own(b) else concrete(b)
    vx = self.primal_of(x)
    if not (self._own(x) and x.unstable is None and isinstance(wc, np.ndarray)
            and isinstance(vx, np.ndarray) and vx.dtype == wc.dtype == np.float32
            and (b is None or (isinstance(bc, np.ndarray) and bc.dtype == np.float32
                               and np.all(np.isfinite(bc))))):
        y = prim.decomposition(x, w, b, **params)
        if not self._own(y):
            return y
        return self.new(self.value_of(prim, (x, w, b), params), y.lo, y.hi, y.unstable, y.point)
    K = (int(np.prod(wc.shape[1:])) if prim.name == "conv" else wc.shape[-1]) + in_sum
    op_params = {k: p for k, p in params.items() if k != "bias_in_sum"}
    op = _Contraction(self, prim, K, op_params, bc if in_sum else None)
    v = self.value_of(prim, (x, w, b if in_sum else None), params)
    y = _contract(self, op, v, x, w)
    if b is None or in_sum:
        return y
    return y + (bc if prim.name == "linear" else np.reshape(bc, (-1,) + (1,) * (wc.ndim - 2)))


def _contract(self, op, v, a, b):
    """The bounds of the contraction's value v = op(a, b) (see the module docstring)."""
    pa, pb = self.primal_of(a), self.primal_of(b)
    try:
        in_dt = np.result_type(np.asarray(pa).dtype, np.asarray(pb).dtype)
    except TypeError:   # bfloat16 @ float16: NumPy converts both to its result dtype
        in_dt = np.asarray(concrete(v)).dtype
    F_out = self.fmt(np.asarray(concrete(v)).dtype)
    prec = self.resolve("matmul", in_dt)
    F_in, F_prod, F_acc = prec.input, prec.compute, prec.accumulate
    K = op.K
    c = matmul_constant(self, F_in, F_prod, F_acc, K)
    sp = matmul_split(self, c, F_in, F_prod, F_acc, K, F_out)
    small = F_out.p <= 24 and F_in.p <= 24 and in_dt != np.float64
    src = self.fmt(in_dt)
    rounded = src is not None and not contains_format(F_in, src)      # e.g. tf32 inputs
    (va, ra, bad_a), (vb, rb, bad_b) = self.radius(a), self.radius(b)
    if rounded:
        ra, rb = (_converted(self, F_in, vx, rx) for vx, rx in ((va, ra), (vb, rb)))
    absterm = 2 * K * (F_prod.smallest_subnormal + F_acc.smallest_subnormal)
    a_pt, b_pt = _is_zero(ra), _is_zero(rb)
    finite = not (bad_a or bad_b) and bool(np.all(np.isfinite(concrete(v))))
    own = not finite or self.matmul == "exact-center" or (
        self.matmul == "midrad" and a_pt and b_pt)
    with np.errstate(all="ignore"):
        if not own:
            got = _value_centred(self, op, v, va, ra, vb, rb, b_pt, sp, c, small, absterm,
                                 F_out, F_acc)
            if got is None:              # a factor not finite, or narrow: own centre
                own = True
            else:
                center, rad, cb, coef = got
        if own:
            center, rad, cb, coef = _own_centre(op, va, ra, vb, rb, a_pt, b_pt, sp,
                                                small and finite, absterm,
                                                parts=self.matmul == "midrad" and finite
                                                and a_pt and b_pt)
    un = matmul_unstable(a.unstable if self._own(a) else None,
                         b.unstable if self._own(b) else None, np.shape(concrete(v)))
    return _close(self, op, v, center, rad, cb, coef, va, ra, vb, rb, c, F_in, F_acc, F_out,
                  rounded, un, ball=not own)


def _is_zero(r):
    return np.ndim(r) == 0 and r == 0


def _converted(self, F_in, v, r):
    """An operand's radius widened by its conversion to the policy's input format (tf32
    keeps 10 bits and may truncate: the cast's accuracy)."""
    v64 = as_f64(v)
    u, a = accuracy_terms(self.accuracy("cast", F_in), [(v64 - r, v64 + r)])
    return up(r + (np.abs(v64) + r) * (u * 2.0 ** (1 - F_in.p)) + u * F_in.smallest_subnormal
              + a, 4)


def _factors(v, r, c2, small, right=False):
    """(L or B̂, r_B, (Σr, Σ(|v|+r), max(|v|+r))) of one operand as a GEMM factor: the left
    factor ``L = c2·(|v| + r) + r`` or the right factors ``B̂ = |v| + r`` and r, upper bounds
    in float32 (``small``, where finite) or float64 (inf and NaN kept). The sums come from a
    sample of rows (they feed the narrow test); the max is NaN where an element is."""
    if small and np.ndim(v) >= 1 and np.asarray(v).dtype in (np.float32, np.float64):
        got = _K.mm_right_ball(v, r) if right else _K.mm_left_ball(v, r, c2)
        if got is not None:
            return (got[0], got[1], got[2]) if right else (got[0], None, got[1])
    hat = up(np.abs(as_f64(v)) + r, 1)
    m = float(np.max(hat)) if np.size(hat) else 0.0
    stats = (float(np.sum(np.broadcast_to(r, np.shape(hat)))), float(np.sum(hat)), m)
    if right:
        return hat, up(np.broadcast_to(r, np.shape(hat)), 0), stats
    return up(c2 * hat + r, 3), None, stats


def _value_centred(self, op, v, va, ra, vb, rb, b_pt, sp, c, small, absterm, F_out, F_acc):
    """Strategy 2: (centre, (R, f, a), cb, coef), or None where a factor is not finite or,
    under ``matmul="midrad"``, where the operands are narrow (radii under ~4c of their
    magnitudes: the own centre's bound is tighter there); ``R·f + a >= coef·Â @ B̂`` (the
    overflow screen's measure)."""
    L, _, sa = _factors(va, ra, 2 * sp.alpha, small)
    Bh, rb_f, sb = _right(vb, rb, b_pt, small)
    if not (sa[2] < math.inf and sb[2] < math.inf):
        return None
    rho = sa[0] / max(sa[1], 1e-300) + sb[0] / max(sb[1], 1e-300)
    if self.matmul == "midrad" and rho < 4 * c:
        return None
    if b_pt:
        rad = op.upper(L, Bh, small, 1.0, 2 * sp.alpha, bf16=True)
    else:
        rad = op.upper_pair(L, Bh, np.abs(va), rb_f, small)
    rad = (rad[0], rad[1], rad[2] + absterm)
    center = _centre_of(v)
    rad = _out_rounding(self, sp.scaled(rad), center, F_out, F_acc)
    return center, rad, sp.cb, 2 * sp.alpha


def _own_centre(op, va, ra, vb, rb, a_pt, b_pt, sp, small, absterm, parts):
    """Strategy 3: (C, (R, f, a), β, coef) with C from the centre provider (|C - E| <=
    g·T + e): radius α·T̂ + β·|E| + e_C + ρ with |E| <= |C| + e_C + ρ, so ``L = k·Â + r_A``
    with k = (α + g(1+β))/(1+β), the GEMMs scaled by 1 + β, plus (1+β)·e."""
    C, g, extra = op.centre(va, vb, parts)
    scale = up(1 + sp.beta, 1)
    k = up((sp.alpha + g * (1 + sp.beta)) / scale, 3)
    Bh, rb_f, sb = _right(vb, rb, b_pt, small)
    if a_pt and b_pt:   # T = |A| @ |B| from |A| itself (exact), scaled
        rad = op.upper(engines.magnitude(va, "abs-A"), Bh, small, up(scale * k, 1), 1.0)
    else:
        L = _factors(va, ra, k, small)[0]
        rad = op.upper(L, Bh, small, scale, k) if b_pt else \
            op.upper_pair(L, Bh, np.abs(va), rb_f, small, scale)
    a = rad[2] + absterm
    if isinstance(C, _PartsCentre):
        C = C.scaled(scale)                       # (1+β)·E, added where C is read
    elif np.ndim(extra) or extra:
        a = _K.scale_up(extra, scale, a)          # one pass: a + (1+β)·e
    return C, (rad[0], rad[1], a), sp.beta, k


def _right(vb, rb, b_pt, small):
    """(B̂, r_B, stats) of the right operand: |B| itself for a point (stats without a sample)."""
    if b_pt:
        return engines.magnitude(vb, "abs-B"), None, (0.0, 1.0, 0.0)
    return _factors(vb, rb, 0.0, small, right=True)


def _centre_of(v):
    """The program's value as a value-centred bound's centre (float32/float64 kept)."""
    center = concrete(v)
    return center if np.asarray(center).dtype in (np.float32, np.float64) else as_f64(center)


def _out_rounding(self, rad, center, F_out, F_acc):
    """A value-centred radius (R, f, a) plus the rounding that took the program's value from
    its accumulator into F_out (it separates the centre from the accumulator values)."""
    if F_out.name == F_acc.name:
        return rad
    uo, ao = accuracy_terms(self.accuracy("cast", F_out), [(center, center)])
    q = uo * 2.0 ** (1 - F_out.p)
    return (_K.scale_up(*rad) + up((np.abs(as_f64(center)) * q + uo * F_out.smallest_subnormal
                                    + ao) * (1 + 2 * q), 4), 1.0, 0.0)


def _close(self, op, v, center, rad, cb, coef, va, ra, vb, rb, c, F_in, F_acc, F_out, rounded,
           un, ball):
    """centre ± radius, the accumulator's overflow mapped (``_guard``), rounded into F_out: a
    ball about the value where nothing needs the box (finite, no overflow possible, the
    accumulator's format the output's), else a box. An own centre C becomes a ball about v
    of radius ``rad + |C - v|`` (v's actual error, typically far under the worst case that
    the value-centred strategy counts). The overflow screen reads the radius: ``R·f + a >=
    coef·Â @ B̂``, which bounds every product and partial sum."""
    top = F_acc.max if (F_acc.has_inf and F_acc.name != "float64") else math.inf
    with np.errstate(all="ignore"):
        R, f, a = rad
        t_max = (float(np.max(R)) * float(np.max(f)) + float(np.max(a))) / coef \
            if np.size(R) and coef > 0 else (0.0 if not np.size(R) else math.inf)
        room = t_max * (1.0 + c) * 2 <= F_acc.max
        in_over = rounded and not (t_max <= F_in.max)   # (a tf32 conversion may overflow)
        vv = concrete(v)
        if (room and not in_over and un is None and F_out.name == F_acc.name
                and F_acc.has_inf and isinstance(vv, np.ndarray) and np.ndim(vv)
                and vv.dtype in (np.float32, np.float64)):
            r, n_bad = (_K.ball_affine(center, R, f, cb, a) if ball else
                        center.ball(vv, R, f, a, top, cb) if isinstance(center, _PartsCentre)
                        else _K.center_ball(center, vv, R, f, a, top, cb))
            if not n_bad:
                return self.new_ball(v, r, top)
        if isinstance(center, _PartsCentre):
            center, a = center.materialize(a)
            rad = (R, f, a)
        lo, hi, n_bad = _K.center_bounds(center, *rad, top, cb)
        lo, hi = _guard(lo, hi, center, op, va, ra, vb, rb, c, F_acc,
                        F_in.max if rounded else math.inf, room, clean=n_bad == 0, value=vv)
        if F_out.name != F_acc.name:
            lo, hi = round_bounds(lo, hi, F_out, self.accuracy("cast", F_out))
        elif not F_out.has_inf:
            lo, hi = overflow(lo, hi, F_out)
    return self.new(v, lo, hi, un)


def _guard(lo, hi, center, op, va, ra, vb, rb, c, F_acc, in_top, room, clean, value):
    """±inf where a product or partial sum may overflow the accumulator (Â @ B̂·(1+c) past its
    largest value: one more GEMM, only where the screen found no ``room``), where an
    operand's conversion to the input format may overflow (``in_top``: tf32's largest value),
    and where the centre is not finite; NaN bounds from inf - inf where no operand element in
    that row/column is NaN mean "unbounded", not "undefined"; NaN where the program's
    ``value`` is (``no_claim_where_nan``)."""
    over = False if clean else ~np.isfinite(center)
    if not room or in_top < math.inf:
        hats = [up(np.abs(as_f64(x)) + r, 1) for x, r in ((va, ra), (vb, rb))]
        if in_top < math.inf:
            sp_ = op.spread(hats[0] > in_top, hats[1] > in_top, np.shape(lo))
            over = over if sp_ is None else over | sp_
        if not room:
            M = op.upper(hats[0], hats[1], False)
            over = over | (up(_K.scale_up(*M) * (1.0 + c), 2) > F_acc.max)
    bad = False if clean else np.isnan(lo) | np.isnan(hi)
    if np.any(bad):
        nan_a = np.isnan(as_f64(va)) | np.isnan(ra)
        nan_b = np.isnan(as_f64(vb)) | np.isnan(rb)
        sp_ = op.spread(nan_a, nan_b, np.shape(lo))
        over = over | (bad if sp_ is None else bad & ~sp_)
    if np.any(over):
        over = np.broadcast_to(over, np.shape(lo))
        lo, hi = np.where(over, -np.inf, lo), np.where(over, np.inf, hi)
    return (lo, hi) if clean and room else no_claim_where_nan(lo, hi, value)


def _exact_matmul(self, v, a, b):
    """An integer or bool matmul is exact arithmetic: the exact product's range over the
    operand intervals, midpoint-radius in float64 -- ``|A·B − Ma·Mb| <= |Ma|·Rb +
    Ra·(|Mb| + Rb)`` plus the float64 GEMMs' own error ``γ_{K+2}(u64)·(|Ma| + Ra)·(|Mb| +
    Rb)`` (operands may pass 2^53) -- tightened to the integers, with the dtype's whole
    range where NumPy's wrap-around may have happened. A bool matmul (NumPy: any of the ands)
    is true where that sum is certainly >= 1, possibly where it may be (unstable between)."""
    (alo, ahi, au, _), (blo, bhi, bu, _) = self.bounds(a), self.bounds(b)
    K = np.shape(alo)[-1] if np.ndim(alo) else 1
    up64 = lambda L, M, s=1.0: _K.scale_up(*engines.upper_gemm(L, M, K, False, s))  # noqa: E731
    with np.errstate(all="ignore"):
        ma, mb = (alo + ahi) / 2, (blo + bhi) / 2
        ra = up(np.maximum(ma - alo, ahi - ma), 1)
        rb = up(np.maximum(mb - blo, bhi - mb), 1)
        abs_ma, abs_mb = np.abs(ma), np.abs(mb)
        rad = up(up64(abs_ma, rb) + up64(ra, up(abs_mb + rb)) +
                 up64(up(abs_ma + ra), up(abs_mb + rb), gamma64(K)), 2)
        center = engines.gemm(ma, mb)
        lo, hi = widen(center - rad, center + rad, 1)
    dt = np.asarray(concrete(v)).dtype
    un = matmul_unstable(au, bu, np.shape(lo))
    if dt.kind == "b":       # the sum is an integer: >= 1 once its bounds are tightened
        lo, hi, undecided = bool_interval(np.ceil(lo) >= 1, np.floor(hi) >= 1)
        return self.new(v, lo, hi, or_unstable(un, undecided if np.any(undecided) else None))
    lo, hi = self.integer_bounds("matmul", dt, lo, hi)
    return self.new(v, lo, hi, un)

