"""Interval rules of the neural-network composites that interval arithmetic on their
decompositions would bound too loosely: softmax, log_softmax, attention, layer norm, RMS norm
and batch norm (inference). Each couples what the decomposition treats as independent and
falls back to the decomposition where its conditions do not hold."""
from __future__ import annotations

import math

import numpy as np

from fpx import nn as _nn
from fpx.core import EvalInterpreter, concrete, is_cupy, using
from fpx.kernels import interval as _K
from fpx.kernels import interval_nn as _KN
from fpx.transforms.interval.enclosure import (E64, LIBM64_ULPS, as_f64, gamma, gamma64,
                                               or_unstable, overflow, rounding_terms,
                                               sign_keeping, up)
from fpx.transforms.interval.interpreter import ball_rule, rule
from fpx.transforms.interval.reductions import acc_delta, count


@rule("log_softmax")
def _log_softmax(self, prim, x, *, axis=-1, stored=None):
    """log_softmax as its decomposition, the upper bound cut at that of a single element 0
    (``c``, ~0): every execution's result is at most that -- x - max(x) rounds to s <= 0 (0
    for the largest), so the sum of the exps is >= the computed exp(0), every log of such a
    sum is >= the least log of [exp(0)]'s bound (log is increasing, its error bound grows
    with |log|, and log 1 = 0 is inside; rounding the sum or the log to ``stored`` is
    monotone), and s - log(sum) <= 0 - log(exp(0)) rounds to at most c -- the same argument
    for the fused x - (max + log Σ). Interval ops on the decomposition do not see it: the
    largest element's bound would reach above 0, or +inf where a wide box's exps overflow."""
    y = prim.decomposition(x, axis=axis, stored=stored)
    if not self._own(y):
        return y
    dt = np.asarray(self.primal_of(x)).dtype
    zero = self.new(np.zeros(1, dt), np.zeros(1), np.zeros(1))
    c = float(np.max(prim.decomposition(zero, axis=0, stored=stored).hi))
    return self.new(y.primal, y.lo, np.minimum(y.hi, max(c, 0.0)), y.unstable)


@rule("softmax")
def _softmax(self, prim, x, *, axis=-1, stored=None):
    """Monotone bound of softmax (a composite): y_i increases with x_i and decreases with every
    other x_j, so over a box y_i lies in [e(lo_i) / (e(lo_i) + sum_{j!=i} e(hi_j)),
    e(hi_i) / (e(hi_i) + sum_{j!=i} e(lo_j))] -- exact where interval arithmetic on the
    decomposition loses the correlation of x - max(x) and e / sum(e). The program's own
    evaluation (subtract the max, exp, sum in any order, divide -- or multiply by the
    reciprocal) is covered by widening the box by the subtraction's rounding and multiplying
    by the exp/sum/division error factors from the policy. Applies where the policy's
    accuracies for sub/exp/div are constants and the input bounds are finite; elsewhere the
    decomposition runs ("where the policy allows"), and for point inputs and float64 programs
    (where the decomposition is as tight). A numerator rounded to ``stored`` first is
    folded into the division's error: round(e(1 + θ) + η)/S with S >= dlow."""
    vx = concrete(self.primal_of(x))
    dt = np.asarray(vx).dtype
    # a ball (its values and radii finite) is read as a box a block at a time (the kernel)
    ball = (self._own(x) and isinstance(x.rad, np.ndarray) and isinstance(vx, np.ndarray)
            and vx.size > 0 and x.rad.shape == vx.shape and dt == np.float32)
    lo, hi, u, pt = (None, None, x.unstable, False) if ball else self.bounds(x)
    F = self.fmt(dt)
    accs = None
    # point inputs gain nothing over the decomposition, and float64 programs need more
    # precision than the float64 evaluation of this bound has: decomposition there
    if F is not None and F.p < 53 and (ball or (
            not pt and not is_cupy(lo) and np.ndim(lo) > 0 and _K.any_differ(lo, hi))):
        Facc = self.resolve("reduce_sum", dt).accumulate
        accs = [self.accuracy(op, F) for op in ("sub", "exp", "div")] + \
            [self.accuracy("reduce_sum", Facc)] + \
            ([] if stored is None else [self.accuracy("cast", self.fmt(stored))])
        if any(a.input_dependent for a in accs):
            accs = None
    nd = np.ndim(vx)
    ax = axis % nd if nd and -nd <= axis < nd else None
    n = 0 if ax is None else np.shape(vx)[ax]       # (no axis or no element: decomposition)
    if accs is None or n == 0 or not (ball or (
            isinstance(lo, np.ndarray) and isinstance(hi, np.ndarray)
            and all_finite(lo) and all_finite(hi))):
        return prim.decomposition(x, axis=axis, stored=stored)
    v = self.value_of(prim, (x,), {"axis": axis, "stored": stored})
    (r_s, a_s), (r_e, a_e), (r_d, a_d) = (self.rel_abs(op, F) for op in ("sub", "exp", "div"))
    gam = self.gamma(max(n - 1, 0), acc_delta(self, "reduce_sum", Facc))
    beta = n * Facc.smallest_subnormal
    # torch multiplies by the reciprocal of the sum: two roundings cover both spellings
    r_d, a_d = 2 * r_d + r_d * r_d, 2 * a_d * (1 + r_d)
    k = 16 * E64
    dlow = (1 - r_e) * (1 - gam) - n * a_e * (1 + gam) - beta
    dhigh = (1 + r_e) * (1 + gam) + n * a_e * (1 + gam) + beta
    if not dlow > 0:
        return prim.decomposition(x, axis=axis, stored=stored)
    if stored is not None:
        r_c, a_c = self.rel_abs("cast", self.fmt(stored))
        r_d, a_d = r_d + r_c + r_d * r_c, a_d + a_c * (1 + r_d) / dlow
    un = None if u is None else np.broadcast_to(np.any(u, axis=ax, keepdims=True), np.shape(vx))
    # one row at a time in a compiled loop (kernels/interval_nn.py)
    xk = (np.moveaxis(vx, ax, -1), np.moveaxis(x.rad, ax, -1), x.top) if ball else \
        (np.moveaxis(lo, ax, -1), np.moveaxis(hi, ax, -1))
    ylo, yhi = _KN.softmax_bounds(xk, r_s, a_s, k, r_e, a_e, r_d, a_d, dlow, dhigh,
                                  gamma64(n), LIBM64_ULPS)
    return self.new(v, np.moveaxis(ylo, -1, ax), np.moveaxis(yhi, -1, ax), un)


@rule("scaled_dot_product_attention")
def _sdpa(self, prim, q, k, v, mask=None, *, is_causal, scale):
    """Attention, softmax(s) @ v, with two couplings its decomposition loses.

    * A masked score (boolean or causal mask, an additive -inf) is -inf in every execution:
      its weight is exactly 0. It takes no part in the softmax bound (a finite stand-in whose
      exp is 0 in every bound, then weight [0, 0]), instead of a -inf that sends the softmax
      rule to its decomposition, whose divisor then reaches 0 on wide boxes (±inf).
    * Each output row is a weighted average of v's rows over the keys taken: the weights are
      >= 0 and any execution's sum to 1 within g, its p @ v sum errs by at most c·Σ p_j|v_j|
      (:func:`_weight_sum_error`), so the output lies in [min_j v_j - eM, max_j v_j + eM]
      (e = g + c(1 + g), M = max_j |v_j|, j over the keys taken), rounded to the output
      format -- intersected with the bound of p @ v.

    Rows with every key masked are 0 (PyTorch's safe softmax). Where every score is finite,
    the safe-softmax masking (a comparison, a reduction and two selections over the whole
    score block) is the identity and is skipped."""
    s = _nn._sdpa_scores(q, k, mask, is_causal, scale)
    if self._own(s) and isinstance(s.rad, np.ndarray):      # finite: no -inf, nothing masked
        return _v_hull(self, _nn._sdpa_finish(s, v, safe=False), v, None, None)
    if not (self._own(s) and isinstance(s.lo, np.ndarray) and isinstance(s.hi, np.ndarray)):
        return _nn._sdpa_finish(s, v)
    excl = np.isneginf(s.hi)              # -inf in every execution: an exact exclusion
    taken = ~excl
    if not excl.any():
        finite = all_finite(s.lo) and all_finite(s.hi)
        out = _nn._sdpa_finish(s, v, safe=not finite)
        return _v_hull(self, out, v, None, s.lo) if finite else out
    if not (all_finite(s.lo[taken]) and all_finite(s.hi[taken])):
        return _nn._sdpa_finish(s, v)
    ax = s.lo.ndim - 1
    dead = np.all(excl, axis=ax, keepdims=True)
    a = max(float(np.max(np.abs(s.lo[taken]), initial=0.0)),
            float(np.max(np.abs(s.hi[taken]), initial=0.0)))
    stand_in = -(4.0 * a + 1e4)     # exp(stand_in - max) is 0 in float64, whatever widening
    sv = np.asarray(concrete(s.primal))
    zero = np.zeros((), sv.dtype)
    sv = np.where(dead, zero, sv)       # (a dead row's stand-in weights are replaced by 0)
    stand = self.new(sv, np.where(excl, stand_in, s.lo), np.where(excl, stand_in, s.hi),
                     s.unstable)
    sm = _nn._softmax.bind(stand, axis=ax)
    plo, phi, pu, _ = self.bounds(sm)
    # the program's weights: softmax of the scores with their -inf, dead rows 0
    pv = np.where(dead, zero, np.asarray(concrete(sm.primal)))
    p = self.new(pv, np.where(excl | dead, 0.0, plo), np.where(excl | dead, 0.0, phi), pu)
    out = _nn._mm(p, v)
    if dead.any():                  # exactly 0, as the safe softmax's output
        out = _nn.fnp.where(dead, _nn._c(0, out), out)
    return _v_hull(self, out, v, taken, s.lo)


def _weight_sum_error(self, dt, n):
    """(g, c): any execution's n attention weights p_j sum to 1 within g, and its p @ v sum
    errs by at most c·Σ p_j |v_j|. The weights are e_j / S with S = fl(Σ e_j) (any order,
    rescaled blockwise as in flash attention: the same factors for sum and numerators), each
    e_j possibly rounded to the program's format first (torch's half CPU kernel multiplies v
    by half-rounded exps): Σ p_j = Σ e_j(1+δ_j) / (Σ e_j (1+θ)), |δ_j| <= 2u (storage,
    division), |θ| <= γ_(2n+16) of the sum's accumulation (the policy's ``reduce_sum``, as the
    softmax rule), plus an underflow term n·(smallest subnormal) per unit of S >= 1 (the
    largest e_j is exp(0)); c = γ_(n+2) of the policy's ``matmul`` accumulation."""
    F = self.fmt(dt)

    def unit(op):
        A = self.resolve(op, dt).accumulate
        return max(self.accuracy(o, A).ulps for o in ("div", "mul", "add")) * 2.0 ** (1 - A.p)
    g = 2 * 2.0 ** -F.p + self.gamma(2 * n + 16, unit("reduce_sum")) + n * F.smallest_subnormal
    return g, self.gamma(n + 2, unit("matmul"))


def _v_hull(self, out, v, taken, slo):
    """``out`` (p @ v) intersected with the hull of v's rows over the keys taken (``taken``:
    (..., L, S) bool, None for all) widened by the weights' sum error: see :func:`_sdpa`."""
    if not self._own(out):
        return out
    vlo, vhi, _, _ = self.bounds(v)
    vlo, vhi = np.asarray(vlo, np.float64), np.asarray(vhi, np.float64)
    ov = concrete(out.primal)
    if not (all_finite(vlo) and all_finite(vhi)) or vlo.ndim < 2 or not isinstance(
            ov, np.ndarray) or is_cupy(ov):
        return out
    dt = np.asarray(concrete(out.primal)).dtype
    n = vlo.shape[-2]
    if taken is None:
        mn = np.min(vlo, axis=-2, keepdims=True)
        mx = np.max(vhi, axis=-2, keepdims=True)
    else:
        t = np.broadcast_to(taken, np.broadcast_shapes(taken.shape, slo.shape))
        mn, mx = _KN.masked_hull(t, vlo, vhi)
        mn, mx = (np.broadcast_to(z, np.shape(ov)) for z in (mn, mx))
    with np.errstate(invalid="ignore"):
        g, c = _weight_sum_error(self, dt, n)
        m = np.maximum(np.abs(mn), np.abs(mx))
        Fo = self.fmt(dt)
        uo = 2.0 ** (1 - Fo.p)       # a rounding to the output format (any direction)
        # Σ p_j v_j <= max(v)·Σ p_j <= max(v) + g·M, and the sum's error <= c·(1 + g)·M
        e = (g + c * (1 + g)) * (1 + 4 * E64) * m
        hlo = mn - e
        hhi = mx + e
        hlo = hlo - uo * np.abs(hlo) - Fo.smallest_subnormal
        hhi = hhi + uo * np.abs(hhi) + Fo.smallest_subnormal
        if out.rad is not None and _KN.ball_inside(ov, out.rad, hlo, hhi):
            return out          # the hull cannot tighten it: keep the ball (no box made)
        olo, ohi, ou, _ = self.bounds(out)
        live = np.isfinite(hlo) & np.isfinite(hhi)      # a row with a key taken
        lo = np.where(live, np.fmax(olo, hlo), olo)
        hi = np.where(live, np.fmin(ohi, hhi), ohi)
    return self.new(out.primal, lo, hi, ou)


def _broadcasts_to(shape, target):
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


def all_finite(x):
    """No inf or NaN in x (a sum is: inf - inf and NaN propagate; one pass, no bool array).
    A sum that overflows says False too: callers take their general path (for float64
    bounds only past ~1e308 / n, where no fast rule is tight anyway)."""
    with np.errstate(all="ignore"):
        return bool(np.isfinite(np.sum(x)))


@rule("layer_norm")
def _layer_norm(self, prim, x, weight=None, bias=None, *, axes, eps):
    """Layer norm (a composite) over a box, row by row, coupling what interval arithmetic on
    the decomposition treats as independent. For x in the box (x = v + δ, |δ_i| <= r_i around
    the program's value v) with P the centring projection:

    * d(x) = P·x lies in P·v ± (r_i + mean(r)) elementwise, and ||d(x)|| in ||P·v|| ± ||r||
      (P is an orthogonal projection: ||P·δ|| <= ||δ||), so var(x) = ||d||²/N in
      [(||P·v|| - ||r||)₊², (||P·v|| + ||r||)²] / N -- not the sum of the squares' widths.
    * The program's mean μ' is within e_μ = γ_{N+2}(δ)·mean|x| of μ (any order, the division,
      a cast). Its variance var': the two-pass var' = mean((x - μ')²) lies in
      [var·(1 - γ), (var + e_μ²)·(1 + γ)] (Σ d_i = 0), and the updating algorithms (Welford's
      and its pairwise merges: PyTorch's CPU kernel, inductor) err by <= ~N·κ·u·var with
      κ = sqrt(mean(x²)/var) (Chan, Golub & LeVeque 1983): both are inside
      var ± γ_{2N+8}(δ)·sqrt(mean(x²)·var), widened by the two-pass terms, and never below 0
      (sums of squares; Welford's increments (x - μ_{k-1})(x - μ_k) multiply same-signed
      factors). Not covered: the unstable one-pass E[x²] - μ² (error ~N·κ²·u·var).
      s' = sqrt(fl(var' + eps)) (or 1/rsqrt) within its own rounding and the sqrt's accuracy
      plus one ulp.
    * y = (x_i - μ')/s'·w + b over these ranges (an interval quotient: s' > 0), plus the
      output's evaluation error γ_5(δ)·((|x_i| + |μ'|)·|w|/s' + |b|), which covers both
      (x - μ')/s·w + b and PyTorch's x·(rstd·w) + (b - μ'·rstd·w).

    δ: the largest unit error of the policy's sub/mul/div/add and its sum accumulation; every
    float64 step of the bound itself is widened outward. Applies to NumPy arrays with finite
    bounds, trailing normalized axes (or no weight/bias), point weight/bias of x's dtype, and
    policies with constant accuracies; elsewhere the decomposition runs."""
    y = _layer_norm_rows(self, prim, x, weight, bias, axes, eps)
    return y if y is not None else prim.decomposition(x, weight, bias, axes=axes, eps=eps)


def _layer_norm_rows(self, prim, x, weight, bias, axes, eps):
    """The rule over rows (``_KN.layer_norm_bounds``): a ball in (its radius read as is) or
    a box, a ball out about the program's value where the format has infinities; None where
    it does not apply."""
    vx = self.primal_of(x)
    if not (isinstance(vx, np.ndarray) and vx.ndim > 0 and vx.size > 0):
        return None
    if self._own(x) and isinstance(x.rad, np.ndarray) and x.rad.shape == vx.shape:
        xin, u = (x.rad,), x.unstable
    else:
        lo, hi, u, _ = self.bounds(x)
        if not (isinstance(lo, np.ndarray) and isinstance(hi, np.ndarray)):
            return None
        xin = (lo, hi)
    dt = vx.dtype
    F = self.fmt(dt)
    if F is None:
        return None
    nd = vx.ndim
    axes = tuple(sorted(a % nd for a in axes))
    trailing = axes == tuple(range(nd - len(axes), nd))
    params = []
    for p, absent in ((weight, 1.0), (bias, 0.0)):
        if p is None:
            params.append(absent)
            continue
        if self._own(p) and not p.point:
            return None
        pc = self.primal_of(p)
        tail = tuple(vx.shape[a] for a in axes)
        if not trailing or not isinstance(pc, np.ndarray) or pc.dtype != dt or \
                pc.ndim > len(tail) or not _broadcasts_to(pc.shape, tail):
            return None      # varies over the rows (or does not fit): the decomposition
        params.append(pc)
    accs = [self.accuracy(n, F) for n in ("sub", "mul", "div", "add", "sqrt")]
    Facc = self.resolve("reduce_sum", dt).accumulate
    acc_sum = self.accuracy("reduce_sum", Facc)
    if any(a.input_dependent for a in accs) or acc_sum.input_dependent:
        return None
    n = count(vx.shape, axes)
    q = 2.0 ** (1 - F.p)
    d_op = max(a.ulps for a in accs[:4]) * q
    delta = max(d_op, acc_sum.ulps * 2.0 ** (1 - Facc.p))
    g_v = self.gamma(2 * n + 8, delta)
    if not g_v <= 0.125:
        return None          # too long a row for the format: the bound would be unbounded
    g_mu = self.gamma(n + 2, delta)
    g_out = gamma(5, d_op)
    d_s = (accs[4].ulps + 1) * q * (1 + 4 * q)
    eta = max(max(a.ulps for a in accs) * F.smallest_subnormal + max(a.absolute for a in accs),
              acc_sum.ulps * Facc.smallest_subnormal + acc_sum.absolute)
    eps_f = float(np.asarray(eps, dt).astype(np.float64))
    with np.errstate(all="ignore"):
        if not all(np.ndim(p) == 0 or bool(np.all(np.isfinite(p))) for p in params):
            return None      # (a non-finite x: the kernel says so)
        v = self.value_of(prim, (x, weight, bias), {"axes": axes, "eps": eps})
        lead = tuple(a for a in range(nd) if a not in axes)
        order = lead + axes
        rows = int(np.prod([vx.shape[a] for a in lead]))
        vk = vx if dt in (np.float32, np.float64) else vx.astype(np.float32)   # exact

        def block(z):
            return np.ascontiguousarray(np.transpose(z, order)).reshape(rows, n)
        tail = tuple(vx.shape[a] for a in axes)
        wb = [p if np.ndim(p) == 0 else
              np.ascontiguousarray(np.broadcast_to(p, tail), np.float64).reshape(n)
              for p in params]
        top = F.max if F.has_inf and F.name != "float64" else math.inf
        lim = min(F.max, Facc.max) / 4
        consts = (min(eps, eps_f), max(eps, eps_f), g_mu, g_v, g_out, d_op, d_s, eta, top, lim)
        vb, xb = block(vk), tuple(block(z) for z in xin)
        vy = block(concrete(v)) if F.has_inf and dt in (np.float32, np.float64) else None
        ylo, yhi, n_bad = _KN.layer_norm_bounds(vb, xb, *wb, *consts, vy)
        if ylo is None:      # a ball past the format, or lopsided about the value: the box
            ylo, yhi, n_bad = _KN.layer_norm_bounds(vb, xb, *wb, *consts)
        if n_bad:            # an intermediate may overflow, or an input is not finite: the
            # decomposition models that
            return None
        shape_t = tuple(vx.shape[a] for a in order)
        inv = np.argsort(order)
        ylo = np.transpose(ylo.reshape(shape_t), inv)
        un = None if u is None else np.broadcast_to(np.any(u, axis=axes, keepdims=True),
                                                    vx.shape)
        if yhi is None:
            return self.new_ball(v, ylo, top, un)
        yhi = np.transpose(yhi.reshape(shape_t), inv)
        if not F.has_inf:
            ylo, yhi = overflow(ylo, yhi, F)
    return self.new(v, ylo, yhi, un)


@rule("rms_norm")
def _rms_norm(self, prim, x, weight=None, *, axis, eps):
    """RMS norm as its decomposition ``x / sqrt(mean(x·x) + eps) · w``, intersected with its a
    priori range. For every x, x_i² <= Σ_j x_j² = n·ms; the program's ms' >= κ·ms - A
    (κ = 1 - γ_{n+6}(δ): the squares, their sum in any order, the division, a cast; A: the
    underflow terms) and, where eps·(1 - δ) >= 2(A + η), fl(ms' + eps) >= κ·ms·(1 - δ), so
    |x_i / s'| <= sqrt(n/(κ(1 - δ)))·(1 + δ)/(1 - d_s) and |y_i| <= that·|w_i|·(1 + δ) + η.
    A box wider than the rows' spread may contain rows with ms near 0, where the
    decomposition's quotient has only sqrt(eps) below it (|y| up to |x|/sqrt(eps)·|w|);
    the range keeps it near sqrt(n)·|w|. δ: the largest unit error of the policy's
    mul/div/add/sqrt and its sum accumulation; applies to NumPy inputs with finite bounds and
    point weights."""
    y = prim.decomposition(x, weight, axis=axis, eps=eps)
    if not self._own(y) or not isinstance(y.lo, np.ndarray) or y.lo.size == 0:
        return y
    lo, hi, _, _ = self.bounds(x)
    if not (isinstance(lo, np.ndarray) and all_finite(lo) and all_finite(hi)):
        return y
    if weight is not None and self._own(weight) and not weight.point:
        return y
    F = self.fmt(np.asarray(self.primal_of(y)).dtype)
    dt = np.asarray(self.primal_of(x)).dtype
    Fx = self.fmt(dt)
    if F is None or Fx is None:
        return y
    accs = [self.accuracy(n, f) for n in ("mul", "div", "add", "sqrt", "cast") for f in (Fx, F)]
    Facc = self.resolve("reduce_sum", dt).accumulate
    acc_sum = self.accuracy("reduce_sum", Facc)
    if any(a.input_dependent for a in accs) or acc_sum.input_dependent:
        return y
    n = count(lo.shape, axis)
    fmts = (Fx, F, Facc)
    delta = max(max(a.ulps for a in accs) * 2.0 ** (1 - min(f.p for f in (Fx, F))),
                acc_sum.ulps * 2.0 ** (1 - Facc.p))
    eta = max(max(a.ulps for a in accs) * max(f.smallest_subnormal for f in fmts)
              + max(a.absolute for a in accs),
              acc_sum.ulps * Facc.smallest_subnormal + acc_sum.absolute)
    kappa = 1.0 - self.gamma(n + 6, delta)
    A = (2 * n + 2) * eta * (1 + 2.0 ** -40)     # squares, their sum, the division, a cast
    if not (kappa > 0.5 and delta < 0.01 and float(eps) * (1 - delta) >= 2 * (A + eta)):
        return y
    d_s = (max(a.ulps for a in accs[6:8]) + 1) * 2.0 ** (1 - min(Fx.p, F.p))
    q = math.sqrt(n / (kappa * (1 - delta))) * (1 + delta) / (1 - d_s) * (1 + 2.0 ** -40)
    w = 1.0 if weight is None else np.abs(as_f64(self.primal_of(weight)))
    with np.errstate(all="ignore"):
        top = up((q + eta) * w * (1 + delta) + eta, 2)
        if not np.all(np.isfinite(top)):
            return y
        ylo, yhi = np.maximum(y.lo, -top), np.minimum(y.hi, top)
    return self.new(y.primal, ylo, yhi, y.unstable, y.point)


_BN_COEFFS: dict = {}


def _bn_coefficients(self, stats, eps, dtype, ndim, axis):
    """A batch norm's per-channel (alpha, beta) as intervals (``batch_norm_coefficients`` run
    by this interpreter). Where the statistics are constant NumPy arrays and the values come
    from NumPy's evaluation, the result is kept, keyed by the statistics' bytes, eps, the
    dtypes, the policy and the interpreter's settings (read-only arrays), so a model's
    forward does not redo the dozen small interval ops per batch norm on every call."""
    key = None
    if type(self.parent) is EvalInterpreter and all(
            z is None or (type(z) is np.ndarray and not self._own(z)) for z in stats):
        key = (tuple(None if z is None else (z.dtype.str, z.shape, z.tobytes()) for z in stats),
               float(eps), np.dtype(dtype).str, ndim, axis, self.policy, self.bound,
               self.confidence, self.branches, self.matmul)
        try:
            hit = _BN_COEFFS.get(key)
        except TypeError:                   # a policy that does not hash: no reuse
            key = hit = None
        if hit is not None:
            return tuple(self.new(*parts) for parts in hit)
    alpha, beta = _nn.batch_norm_coefficients(*stats, eps, dtype, ndim, axis)
    if key is not None and all(self._own(t) for t in (alpha, beta)):
        parts = []
        for t in (alpha, beta):
            arrs = [None if z is None else np.array(concrete(z))
                    for z in (t.primal, t.lo, t.hi, t.unstable)]
            for z in arrs:
                if z is not None:
                    z.flags.writeable = False
            parts.append((*arrs, t.point))
        if len(_BN_COEFFS) > 256:
            _BN_COEFFS.clear()
        _BN_COEFFS[key] = tuple(parts)
    return alpha, beta


@rule("batch_norm")
def _batch_norm(self, prim, x, mean, var, weight=None, bias=None, *, axis, eps):
    """The decomposition with its last two ops, ``x·alpha + beta``, fused into one pass
    (``_K.affine_bounds``): the mul and add rules' bounds bit for bit, without the
    intermediate arrays; the value the parent's ``scale_shift``. alpha and beta are computed
    by this interpreter as in the decomposition (their own rounding is the program's:
    intervals around the computed per-channel values). Formats without the fused mul/add
    path, CuPy: the decomposition."""
    stats = (mean, var, weight, bias)
    if not self._own(x):
        return prim.decomposition(x, *stats, axis=axis, eps=eps)
    px = concrete(x.primal)
    alpha, beta = _bn_coefficients(self, stats, eps, np.asarray(px).dtype, np.ndim(px), axis)
    va, vb = self.primal_of(alpha), self.primal_of(beta)
    with using(self.parent):            # the decomposition's last two ops, by the parent
        v = _nn.scale_shift(x.primal, va, vb)
    dt = np.asarray(concrete(v)).dtype
    F = self.fmt(dt)
    accs = None if F is None else (self.accuracy("mul", F), self.accuracy("add", F))
    slo, shi, su, _ = self.bounds(alpha, dt)
    tlo, thi, tu, _ = self.bounds(beta, dt)
    if not (accs is not None and all(sign_keeping(a) for a in accs)
            and (F.has_inf or F.name == "float64")
            and all(isinstance(z, np.ndarray) for z in (x.lo, x.hi, slo, shi, tlo, thi))):
        return _nn.scale_shift(x, alpha, beta)
    (r1, a1, top), (r2, a2, _) = (rounding_terms(F, a.ulps, a.absolute, steps=1)
                                  for a in accs)
    un = or_unstable(x.unstable, su, tu)
    lo, hi = _K.affine_bounds(x.lo, x.hi, slo, shi, tlo, thi, r1, a1, r2, a2, top)
    return self.new(v, lo, hi, un)


@ball_rule("batch_norm")
def _ball_batch_norm(self, prim, x, mean, var, weight=None, bias=None, *, axis, eps):
    """``x·alpha + beta`` of a ball x (|x - v_x| <= r), alpha and beta as in the box rule:
    an execution errs from the exact ``x'·α + β`` (x' within r of v_x, α in [α], β in [β]) by
    ``q1·|x'α| + e1 + q2·(|x'α + β| + q1·|x'α| + e1) + e2`` (the policy's mul and add), the
    exact map moves by ``r·A + |v_x|·dα + dβ`` (A = max|α|, dα, dβ: [α]'s and [β]'s reach
    from their values), and the program's value (NumPy's IEEE mul and add, q0 = 2^-p) by
    ``q0·|v_x·α_v|·(2 + q0) + η/2·(1 + q0) + q0·|β_v|``: per channel ``r' = G·r + H·|v_x| +
    K`` in one pass (``ball_affine``). None (the box rule) where an input is unstable or
    not a float32/float64 ball, the accuracies are input-dependent, an execution's product
    or sum may overflow, or a radius is not finite."""
    if not (self._own(x) and x.is_ball and x.unstable is None):
        return None
    px = concrete(x.primal)
    if not (isinstance(px, np.ndarray) and px.dtype in (np.float32, np.float64)):
        return None
    F = self.fmt(px.dtype)
    accs = (self.accuracy("mul", F), self.accuracy("add", F))
    if not F.has_inf or any(a.input_dependent for a in accs):
        return None
    stats = (mean, var, weight, bias)
    alpha, beta = _bn_coefficients(self, stats, eps, px.dtype, px.ndim, axis)
    slo, shi, su, _ = self.bounds(alpha, px.dtype)
    tlo, thi, tu, _ = self.bounds(beta, px.dtype)
    if su is not None or tu is not None:
        return None
    va, vb = (as_f64(self.primal_of(t)) for t in (alpha, beta))
    with using(self.parent):            # the decomposition's last two ops, by the parent
        v = _nn.scale_shift(x.primal, self.primal_of(alpha), self.primal_of(beta))
    (q1, e1), (q2, e2) = (self.rel_abs(n, F) for n in ("mul", "add"))
    q0, e0 = 2.0 ** -F.p, F.smallest_subnormal / 2
    with np.errstate(all="ignore"):
        A = np.maximum(np.abs(slo), np.abs(shi))
        dA = np.maximum(shi - va, va - slo)
        B = np.maximum(np.abs(tlo), np.abs(thi))
        dB = np.maximum(thi - vb, vb - tlo)
        G = up(A * ((1 + q1) * (1 + q2)), 4)
        H = up(dA + A * (q1 + q2 + q1 * q2) + np.abs(va) * (q0 * (2 + q0)), 6)
        K = up(dB + e1 * (1 + q2) + q2 * B + e2 + e0 * (1 + q0) + q0 * np.abs(vb), 8)
        # an execution's product x'·α or sum may overflow where the value does not (β
        # cancelling): the box rule maps those to ±inf
        xm = (max(float(np.max(px)), -float(np.min(px))) + float(np.max(x.rad))) \
            if px.size else 0.0
        peak = (xm * float(np.max(A)) * (1 + q1) + e1 + float(np.max(B))) * (1 + q2) + e2
    if not peak * (1 + 8 * E64) < F.max:
        return None
    rad, n_bad = _K.ball_affine(px, x.rad, G, H, K)
    vv = concrete(v)
    if n_bad or not (np.size(vv) == 0 or float(np.max(np.abs(vv))) <= F.max):
        return None
    return self.new_ball(v, rad, F.max)
