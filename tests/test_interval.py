"""Soundness of ``fpx.interval``: the bounds must contain everything the program can produce.

1. Property tests (hypothesis, derandomized): random expression DAGs over fpx.numpy / fpx.nn
   ops, float64/float32/float16/bfloat16 and mixed, random and adversarial inputs
   (cancellation, near-overflow, subnormals, signed zeros, ties at branch points, sin/cos near
   multiples of pi/2, large |x|). Every node of the DAG is an output, and every element of
   every node is checked against
     (a) the exact real result (gmpy2/MPFR at 1200 bits on the exact inputs; erf by mpmath),
     (b) the program's own NumPy value (``iv.value``, also checked bit-identical to an eager
         run),
     (c) re-executions in the program's precision in other summation orders (sequential,
         reversed, pairwise, blocked/split-K with shuffled partials, random trees; products
         rounded per the policy or fused; accumulation rounded in the policy's format, with
         directed rounding where the policy allows 1 ulp per addition; correctly rounded
         transcendentals and casts as alternative legal results; inputs perturbed inside
         ``Interval`` inputs),
     (d) for casts, the correctly rounded result from ``fpx.formats.round``.
   Skipped, counted and required to stay rare: (a) where the exact result is undefined
   (NaN/inf), beyond float64's range or downstream of an exact intermediate beyond it, or the
   program's value is NaN; (b) where NumPy's value is not an execution of an emulated policy
   ("cuda"/"tf32" accumulate float16 sums in float32, NumPy does not); every check where the
   bound is NaN: a NaN bound makes no claim (``contains`` is False, classify says
   inconclusive) and is what a rule returns where an execution may give NaN.
2. Regression tests for each flaw of the RENDER tool.
3. Edge behaviour: division by intervals containing 0, matmul="render", the probabilistic
   bound, Interval inputs, empty arrays, NaN/inf inputs, shape errors.
4. Regression tests for the soundness bugs the property tests found in ``fpx.interval``.

A violation prints the DAG, the inputs and the offending element. ``FPX_INTERVAL_TEST_SCALE``
scales the number of examples (default 1: ~1 minute on one core).
"""
from __future__ import annotations

import collections
import contextlib
import math
import os
import zlib
from dataclasses import dataclass

import gmpy2
import ml_dtypes
import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import fpx
import fpx.nn as fnn
import fpx.numpy as fnp
from fpx import formats as F
from fpx.kernels import interval_nn as KN
from fpx.transforms.interval import Interval, IntervalInterpreter, run_interval
from fpx.transforms.interval import enclosure as ivenc
from fpx.transforms.interval import nn as ivnn
from fpx.kernels.elementwise import two_sum
from fpx.nn import _c as nn_const
from fpx.policy import get_policy

F64, F32, F16 = np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
EXACT_PREC = 1200          # bits for the exact oracle
FLT64_MAX = np.finfo(np.float64).max

_SCALE = float(os.environ.get("FPX_INTERVAL_TEST_SCALE", "1"))   # more/fewer examples


def _n(k):
    return max(1, int(k * _SCALE))


pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=list(HealthCheck))


def f64(x):
    return np.asarray(x).astype(np.float64)


def fmt(dt):
    return F.get(dt if isinstance(dt, str) else np.dtype(dt))


def _contains_fmt(big, small):
    return big.p >= small.p and big.emin <= small.emin and big.emax >= small.emax


# =============================================================================================
# DAGs
# =============================================================================================
@dataclass(frozen=True)
class Node:
    op: str
    args: tuple
    params: tuple = ()          # sorted (name, value) pairs

    @property
    def kw(self):
        return dict(self.params)

    def __str__(self):
        ps = "".join(f", {k}={getattr(v, 'name', v)!r}" if not isinstance(v, np.dtype)
                     else f", {k}={v.name}" for k, v in self.params)
        return f"{self.op}({', '.join(f'n{a}' for a in self.args)}{ps})"


@dataclass
class Case:
    inputs: list                # program inputs: arrays or fpx.Interval
    centers: list               # the arrays (Interval inputs: their value)
    radii: list                 # None or (lo, hi) float64 of Interval inputs
    nodes: list                 # Node; node k is value n_inputs + k
    meta: list                  # per node: (out dtype, arg dtypes)
    policy: str
    matmul: str = "midrad"      # fpx.interval's matmul option

    @property
    def n_in(self):
        return len(self.inputs)

    def describe(self):
        lines = [f"policy={self.policy!r}, matmul={self.matmul!r}"]
        for i, x in enumerate(self.centers):
            r = self.radii[i]
            extra = "" if r is None else f" as Interval, lo={r[0].tolist()!r}, hi={r[1].tolist()!r}"
            lines.append(f"n{i} = input {x.dtype.name}{list(x.shape)} "
                         f"{f64(x).tolist()!r}{extra}")
        for k, nd in enumerate(self.nodes):
            lines.append(f"n{self.n_in + k} = {nd}    -> {self.meta[k][0].name}")
        return "\n".join(lines)


# -- the program (fpx.numpy / fpx.nn: eager NumPy, or traced by fpx.interval) ----------------
PROGRAM_OPS = {
    "add": lambda a, b: fnp.add(a, b),
    "sub": lambda a, b: fnp.subtract(a, b),
    "mul": lambda a, b: fnp.multiply(a, b),
    "div": lambda a, b: fnp.divide(a, b),
    "max": lambda a, b: fnp.maximum(a, b),
    "min": lambda a, b: fnp.minimum(a, b),
    "where": lambda a, b, c, d: fnp.where(fnp.greater(a, b), c, d),
    "select": lambda a, c, d: fnp.where(a, c, d),           # a float condition: a != 0
    "exp": fnp.exp, "log": fnp.log, "sqrt": fnp.sqrt, "tanh": fnp.tanh, "erf": fnp.erf,
    "sin": fnp.sin, "cos": fnp.cos, "atan": fnp.arctan,
    "abs": fnp.abs, "neg": fnp.negative, "square": fnp.square, "reciprocal": fnp.reciprocal,
    "scale": lambda a, *, c: fnp.multiply(a, c),
    "cast": lambda a, *, to: fnp.astype(a, to),
    "T": lambda a: fnp.transpose(a),
    "matmul": lambda a, b: fnp.matmul(a, b),
    "sum": lambda a, *, axis: fnp.sum(a, axis=axis, keepdims=True),
    "mean": lambda a, *, axis: fnp.mean(a, axis=axis, keepdims=True),
    "cumsum": lambda a, *, axis: fnp.cumsum(a, axis=axis),
    "softmax": lambda a, *, axis: fnn.softmax(a, axis=axis),
    "layer_norm": lambda a, *, axis: fnn.layer_norm(a, axis=axis),
}
TRANSCENDENTAL = ("exp", "log", "tanh", "erf", "sin", "cos", "atan")
ARITY = {"where": 4, "select": 3, "add": 2, "sub": 2, "mul": 2, "div": 2, "max": 2, "min": 2,
         "matmul": 2}


def program_apply(node, args):
    return PROGRAM_OPS[node.op](*args, **node.kw)


def make_program(case):
    def prog(*xs):
        vals = list(xs)
        for nd in case.nodes:
            vals.append(program_apply(nd, [vals[i] for i in nd.args]))
        return vals[case.n_in:]
    return prog


# -- the exact oracle (MPFR) -------------------------------------------------------------------
_NAN = gmpy2.mpfr("nan")


def _isnan(v):
    return gmpy2.is_nan(v)


def _emax(a, b):
    return _NAN if _isnan(a) or _isnan(b) else (a if a >= b else b)


def _emin(a, b):
    return _NAN if _isnan(a) or _isnan(b) else (a if a <= b else b)


def _ewhere(a, b, c, d):
    return _NAN if _isnan(a) or _isnan(b) else (c if a > b else d)


def _eselect(a, c, d):
    return c if _isnan(a) or a != 0 else d        # (NaN is true, as in NumPy)


_HUGE = gmpy2.mpfr(2) ** 2000


def _bounded_arg(f):
    """sin/cos of an exact value with an enormous exponent (an exact intermediate far beyond
    float64's range, e.g. x^8 of a large x) would make MPFR reduce the argument with as many
    bits as the exponent -- or abort the process. Such elements are downstream of an exact
    value beyond float64 and not checked against (a); give NaN there."""
    def g(x):
        return _NAN if gmpy2.is_finite(x) and abs(x) > _HUGE else f(x)
    return g


def _erf(x):
    """erf at the oracle's precision with mpmath: MPFR 4.2.2's erf aborts the process at
    >= ~1000 bits on ordinary inputs (``erf.c:246: MPFR assertion failed`` for sqrt(3))."""
    if not gmpy2.is_finite(x) or x == 0:
        return gmpy2.erf(x)
    m, e = x.as_mantissa_exp()
    with mpmath.workprec(EXACT_PREC + 20):
        sign, man, exp, _ = mpmath.erf(mpmath.mpf((int(m), int(e))))._mpf_
    return gmpy2.mul_2exp(gmpy2.mpfr(-man if sign else man), exp)


_U = {name: np.frompyfunc(f, 1, 1) for name, f in {
    "exp": gmpy2.exp, "log": gmpy2.log, "sqrt": gmpy2.sqrt, "tanh": gmpy2.tanh,
    "erf": _erf, "sin": _bounded_arg(gmpy2.sin), "cos": _bounded_arg(gmpy2.cos),
    "atan": gmpy2.atan, "abs": abs}.items()}
_MAX, _MIN = np.frompyfunc(_emax, 2, 1), np.frompyfunc(_emin, 2, 1)
_WHERE = np.frompyfunc(_ewhere, 4, 1)
_SELECT = np.frompyfunc(_eselect, 3, 1)
_TO_MPFR = np.frompyfunc(lambda v: gmpy2.mpfr(float(v)), 1, 1)


def to_mpfr(x):
    return _TO_MPFR(f64(x)).astype(object)


def _count(shape, axis):
    axes = range(len(shape)) if axis is None else (axis if isinstance(axis, tuple) else (axis,))
    return int(np.prod([shape[a] for a in axes]))


def exact_apply(node, args, meta):
    op, kw = node.op, node.kw
    out_dt, arg_dts = meta
    if op in ("add", "sub", "mul", "div"):
        a, b = args
        return {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                "div": np.true_divide}[op](a, b)
    if op == "max":
        return _MAX(*args)
    if op == "min":
        return _MIN(*args)
    if op == "where":
        return _WHERE(*args)
    if op == "select":
        return _SELECT(*args)
    if op in _U:
        return _U[op](args[0])
    a = args[0]
    if op == "neg":
        return -a
    if op == "square":
        return a * a
    if op == "reciprocal":
        return gmpy2.mpfr(1) / a
    if op == "scale":     # NumPy converts the weak Python scalar to the result dtype
        return a * gmpy2.mpfr(float(f64(np.asarray(kw["c"]).astype(out_dt))))
    if op == "cast":
        return a
    if op == "T":
        return a.T
    if op == "matmul":
        return np.matmul(a, args[1])
    if op == "sum":
        return np.sum(a, axis=kw["axis"], keepdims=True)
    if op == "mean":
        return np.sum(a, axis=kw["axis"], keepdims=True) / _count(a.shape, kw["axis"])
    if op == "cumsum":
        return np.cumsum(a, axis=kw["axis"])
    if op == "softmax":
        ax = kw["axis"]
        e = _U["exp"](a - _MAX.reduce(a, axis=ax, keepdims=True))
        return e / np.sum(e, axis=ax, keepdims=True)
    if op == "layer_norm":
        ax = kw["axis"] % 2
        n = a.shape[ax]
        eps = gmpy2.mpfr(float(f64(nn_const(1e-5, np.zeros((), arg_dts[0])))))
        d = a - np.sum(a, axis=ax, keepdims=True) / n
        v = np.sum(d * d, axis=ax, keepdims=True) / n
        return d / _U["sqrt"](v + eps)
    raise AssertionError(op)


# -- other executions in the program's precision --------------------------------------------
_GM = {"exp": gmpy2.exp, "log": gmpy2.log, "tanh": gmpy2.tanh, "erf": gmpy2.erf,
       "sin": gmpy2.sin, "cos": gmpy2.cos, "atan": gmpy2.atan}


def correctly_rounded(fname, x):
    """f(x) correctly rounded (nearest-even) into x's format: MPFR in a context with the
    format's precision and exponent range (subnormals included)."""
    fm = fmt(x.dtype)
    ctx = gmpy2.context(precision=fm.p, emin=fm.emin - fm.p + 2, emax=fm.emax + 1,
                        subnormalize=True)
    xs = f64(x)
    out = np.empty(xs.shape, np.float64)
    with ctx:
        for idx, v in np.ndenumerate(xs):
            out[idx] = float(_GM[fname](gmpy2.mpfr(float(v))))
    return out.astype(x.dtype)


class Alt:
    """One execution of the DAG in the program's precision, in another order.

    Elementwise arithmetic is NumPy's (as in the program) or, for transcendentals and casts,
    the correctly rounded result; sums, means, cumsums, matmuls, softmax and layer_norm are
    re-implemented: every addition is rounded into the policy's accumulation format (with a
    directed rounding mode where the policy allows 1 ulp per addition), products are rounded
    into the policy's compute format (or fused into the addition), matmul inputs are rounded
    into the policy's input format (tf32), and terms are added in ``order``.
    """

    ORDERS = ("seq", "rev", "pairwise", "blocked", "tree")

    def __init__(self, policy, order, rng, *, cr_transc=False, cr_cast=False, fused=False,
                 directed="rn", stats=None):
        self.policy = get_policy(policy)
        self.order, self.rng = order, rng
        self.cr_transc, self.cr_cast = cr_transc, cr_cast
        self.fused, self.directed = fused, directed
        self.stats = stats if stats is not None else collections.Counter()

    def __repr__(self):
        return (f"Alt(order={self.order}, cr_transc={self.cr_transc}, cr_cast={self.cr_cast}, "
                f"fused={self.fused}, directed={self.directed})")

    # -- rounding helpers
    def mode_for(self, prim, F_acc):
        acc = self.policy.accuracy(prim, F_acc)
        if not acc.input_dependent and acc.ulps >= 1.0:
            return self.directed
        return "rn"

    @staticmethod
    def rnd(x, fm, mode="rn", residual=None):
        x = np.asarray(x, np.float64)
        if fm.name == "float64" and mode == "rn" and residual is None:
            return x
        return f64(F.round(x, fm, mode, residual=residual))

    @staticmethod
    def native(F_acc, mode):
        """Round-to-nearest additions in a storage format are NumPy's own (float16 and
        bfloat16 add in float32 and round once: correctly rounded, as 24 >= 2*11+2)."""
        return mode == "rn" and F_acc.name != "tf32"

    def add(self, a, b, F_acc, mode):
        if self.native(F_acc, mode):
            return np.add(a, b)
        with np.errstate(all="ignore"):
            s, e = two_sum(a, b)
        return self.rnd(s, F_acc, mode, residual=e)

    def reduce(self, terms, F_acc, mode, shape):
        """Sum float64 ``terms`` (values of F_acc) in this execution's order; float64 result."""
        if not terms:
            return np.zeros(shape)
        if self.native(F_acc, mode):
            terms = [np.asarray(t).astype(F_acc.dtype) for t in terms]
        with np.errstate(all="ignore"):
            return f64(self._reduce(terms, F_acc, mode))

    def _reduce(self, terms, F_acc, mode):
        add = lambda u, v: self.add(u, v, F_acc, mode)  # noqa: E731
        order = self.order
        if order in ("seq", "rev"):
            ts = terms if order == "seq" else terms[::-1]
            acc = ts[0]
            for t in ts[1:]:
                acc = add(acc, t)
            return acc
        if order == "pairwise":
            def tree(ts):
                if len(ts) == 1:
                    return ts[0]
                h = len(ts) // 2
                return add(tree(ts[:h]), tree(ts[h:]))
            return tree(list(terms))
        if order == "blocked":      # split-K: sequential blocks, partials in shuffled order
            b = int(self.rng.integers(1, len(terms) + 1))
            parts = []
            for i in range(0, len(terms), b):
                acc = terms[i]
                for t in terms[i + 1:i + b]:
                    acc = add(acc, t)
                parts.append(acc)
            perm = self.rng.permutation(len(parts))
            acc = parts[perm[0]]
            for j in perm[1:]:
                acc = add(acc, parts[j])
            return acc
        if order == "tree":         # random binary tree (atomics, arbitrary schedules)
            ts = list(terms)
            while len(ts) > 1:
                i, j = sorted(self.rng.choice(len(ts), 2, replace=False))
                v = add(ts[i], ts[j])
                del ts[j]
                ts[i] = v
            return ts[0]
        raise AssertionError(order)

    # -- ops
    def cast(self, x, to):
        to, x = np.dtype(to), np.asarray(x)       # (a Python float: float64)
        if x.dtype == to:
            return x
        if self.cr_cast:
            return F.round(f64(x), fmt(to)).astype(to)
        return x.astype(to)

    def sum(self, a, axis, out_dt, prim="reduce_sum", keepdims=True):
        out_dt = np.dtype(out_dt)
        F_out = fmt(out_dt)
        x = f64(a.astype(out_dt))
        F_acc = self.policy.resolve(prim, out_dt).accumulate
        if not _contains_fmt(F_acc, F_out):
            x = self.rnd(x, F_acc)
        mode = self.mode_for(prim, F_acc)
        nd = x.ndim
        axes = tuple(range(nd)) if axis is None else tuple(
            ax % nd for ax in (axis if isinstance(axis, tuple) else (axis,)))
        keep = [i for i in range(nd) if i not in axes]
        y = np.transpose(x, keep + list(axes)).reshape([x.shape[i] for i in keep] + [-1])
        terms = [y[..., j] for j in range(y.shape[-1])]
        s = self.reduce(terms, F_acc, mode, y.shape[:-1])
        if keepdims:
            s = np.reshape(s, [1 if i in axes else x.shape[i] for i in range(nd)])
        if F_acc.name != F_out.name:
            s = self.rnd(s, F_out)
        return np.asarray(s).astype(out_dt)

    def mean(self, a, axis):
        """numpy._methods._mean: float16 sums in float32; divide by intp n; cast back."""
        dt = a.dtype
        sdt = F32 if dt == F16 else dt
        s = self.sum(a, axis, sdt)
        with np.errstate(all="ignore"):
            q = np.true_divide(s, np.intp(_count(a.shape, axis)))
        q = self.cast(q, s.dtype)
        return self.cast(q, dt)

    def cumsum(self, a, axis):
        dt = a.dtype
        F_out = fmt(dt)
        F_acc = self.policy.resolve("cumsum", dt).accumulate
        mode = self.mode_for("cumsum", F_acc)
        x = np.moveaxis(f64(a), axis, -1)
        terms = [x[..., j] for j in range(x.shape[-1])]
        if self.order == "seq":
            if self.native(F_acc, mode):
                terms = [t.astype(F_acc.dtype) for t in terms]
            outs, acc = [], None
            for t in terms:
                acc = t if acc is None else self.add(acc, t, F_acc, mode)
                outs.append(f64(acc))
        else:   # every prefix on its own (a sample of them for long scans: O(K^2) work)
            K = len(terms)
            pick = set(range(K)) if K <= 40 else set(
                self.rng.choice(K, 12, replace=False).tolist()) | {0, K - 1}
            nan = np.full(x.shape[:-1], np.nan)
            outs = [self.reduce(terms[:k + 1], F_acc, mode, x.shape[:-1]) if k in pick else nan
                    for k in range(K)]
        s = np.stack(outs, -1) if outs else x.copy()
        if F_acc.name != F_out.name:
            s = self.rnd(s, F_out)
        return np.moveaxis(s, -1, axis).astype(dt)

    def matmul(self, a, b, out_dt):
        try:
            in_dt = np.result_type(a.dtype, b.dtype)
        except TypeError:          # bfloat16 @ float16: NumPy computes in its result dtype
            in_dt = np.dtype(out_dt)
        prec = self.policy.resolve("matmul", in_dt)
        F_in, F_prod, F_acc = prec.input, prec.compute, prec.accumulate
        F_out = fmt(out_dt)
        A, B = f64(a.astype(in_dt)), f64(b.astype(in_dt))
        if not _contains_fmt(F_in, fmt(in_dt)):           # e.g. float32 -> tf32
            cast_acc = self.policy.accuracy("cast", F_in)
            m = self.directed if cast_acc.ulps >= 1 and self.directed in ("rz", "rn") else "rn"
            A, B = self.rnd(A, F_in, m), self.rnd(B, F_in, m)
        with np.errstate(all="ignore"):
            P = A[:, :, None] * B[None, :, :]                # exact when F_in.p <= 26
        exact_prod = 2 * F_in.p <= 53
        fused = self.fused and exact_prod
        mode = self.mode_for("matmul", F_acc)
        shape = (A.shape[0], B.shape[1])
        P0 = P
        if not fused and 2 * F_in.p > F_prod.p and F_prod.name != "float64":
            P = self.rnd(P, F_prod)
        s = self.reduce([P[:, j, :] for j in range(P.shape[1])], F_acc, mode, shape)
        overflow = np.any(np.isinf(P) & np.isfinite(P0), axis=1)
        if np.any(overflow):
            # a product overflowed the emulated compute format (the policy's float16 products
            # of float16 operands; NumPy forms them in float32): there, NumPy's exact products
            self.stats["alt_exact_products_after_overflow"] += int(overflow.sum())
            s = np.where(overflow, self.reduce([P0[:, j, :] for j in range(P0.shape[1])],
                                               F_acc, mode, shape), s)
        if F_acc.name != F_out.name:
            s = self.rnd(s, F_out)
        return np.asarray(s).astype(out_dt)

    def apply(self, node, args, meta):
        op, kw = node.op, node.kw
        out_dt = meta[0]
        with np.errstate(all="ignore"):
            if op in TRANSCENDENTAL and self.cr_transc:
                return correctly_rounded(op, args[0])
            if op == "cast":
                return self.cast(args[0], kw["to"])
            if op == "matmul":
                return self.matmul(args[0], args[1], out_dt)
            if op == "sum":
                return self.sum(args[0], kw["axis"], out_dt)
            if op == "mean":
                return self.mean(args[0], kw["axis"])
            if op == "cumsum":
                return self.cumsum(args[0], kw["axis"])
            if op == "softmax":
                x, ax = args[0], kw["axis"]
                m = np.max(x, axis=ax, keepdims=True)
                d = np.subtract(x, m)
                e = correctly_rounded("exp", d) if self.cr_transc else fnp.exp(d)
                return np.divide(e, self.sum(e, ax, e.dtype))
            if op == "layer_norm":
                x, ax = args[0], (kw["axis"] % 2,)
                d = np.subtract(x, self.mean(x, ax))
                v = self.mean(np.multiply(d, d), ax)
                return np.divide(d, np.sqrt(np.add(v, nn_const(1e-5, x))))
            return program_apply(node, args)


def run_dag(case, inputs, apply):
    vals = list(inputs)
    for k, nd in enumerate(case.nodes):
        vals.append(apply(nd, [vals[i] for i in nd.args], case.meta[k]))
    return vals[case.n_in:]


def exact_values(case):
    with gmpy2.context(gmpy2.get_context(), precision=EXACT_PREC), np.errstate(all="ignore"):
        return run_dag(case, [to_mpfr(x) for x in case.centers], exact_apply)


# =============================================================================================
# Inputs
# =============================================================================================
INPUT_MODES = ("normal", "normal", "wide", "subnormal", "overflow", "special", "trig",
               "cancel", "cancel", "tie", "large")


def gen_values(rng, mode, shape, dt, prev):
    fm = fmt(dt)
    size = int(np.prod(shape))
    sign = rng.choice([-1.0, 1.0], size)
    top = math.log2(fm.max)
    if mode == "wide":
        v = sign * np.exp2(rng.uniform(fm.emin, top, size))
    elif mode == "subnormal":
        v = sign * rng.integers(0, 2 ** (fm.p - 1), size) * fm.smallest_subnormal
        v = np.where(rng.random(size) < 0.3, sign * fm.tiny * rng.uniform(1, 4, size), v)
    elif mode == "overflow":
        v = sign * fm.max * rng.uniform(0.25, 1.0, size)
    elif mode == "special":
        v = rng.choice([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, fm.smallest_subnormal,
                        -fm.smallest_subnormal, fm.tiny, fm.max, -fm.max], size)
    elif mode == "trig":
        k = rng.choice([0, 1, 2, 3, -1, -2, 5, 101, 2 ** 10], size).astype(np.float64)
        base = k * (np.pi / 2)
        v = base + rng.integers(-4, 5, size) * f64(F.ulp(base, fm))
    elif mode == "large":
        v = sign * 10.0 ** rng.uniform(3, min(30.0, math.log10(fm.max) - 0.5), size)
    elif mode in ("cancel", "tie") and prev:
        base = np.resize(f64(prev[int(rng.integers(len(prev)))]).ravel(), size)
        if mode == "tie":
            v = base
        else:
            eps = rng.choice([2.0 ** -fm.p, -(2.0 ** -fm.p), 2.0 ** (1 - fm.p), 2.0 ** -20, 1e-3,
                              0.0], size)
            v = base * (1 + eps) + rng.integers(-2, 3, size) * f64(F.ulp(base, fm))
    else:
        v = rng.standard_normal(size) * 10.0 ** rng.uniform(-2, 2)
    if mode not in ("special",) and rng.random() < 0.3:   # sprinkle special values
        m = rng.random(size) < 0.2
        v = np.where(m, rng.choice([0.0, -0.0, 1.0, fm.smallest_subnormal, -fm.max], size), v)
    v = np.clip(np.nan_to_num(v), -fm.max, fm.max)
    x = v.astype(dt).reshape(shape)
    return np.where(np.isfinite(f64(x)), x, np.zeros((), dt)).astype(dt)


def interval_input(rng, x, r_ulps):
    """An Interval of +-r ulps around x, and a sampler of points of x's format inside it."""
    fm = fmt(x.dtype)
    c = f64(x)
    u = f64(F.ulp(c, fm))
    lo, hi = np.maximum(c - r_ulps * u, -fm.max), np.minimum(c + r_ulps * u, fm.max)
    lo, hi = np.minimum(lo, c), np.maximum(hi, c)

    def sample(rng):
        p = f64(F.round(c + rng.integers(-r_ulps, r_ulps + 1, c.shape) * u, fm))
        p = np.where((p >= lo) & (p <= hi), p, c)
        return p.astype(x.dtype)
    return Interval(lo, hi, x), (lo, hi), sample


# =============================================================================================
# Case generation (hypothesis)
# =============================================================================================
ALL_OPS = ("add", "sub", "mul", "div", "max", "min", "where", "select", "exp", "log", "sqrt",
           "tanh", "erf", "sin", "cos", "atan", "abs", "neg", "square", "reciprocal", "scale",
           "cast", "cast", "matmul", "matmul", "sum", "sum", "mean", "cumsum", "softmax", "layer_norm",
           "T")
RATIONAL_OPS = tuple(o for o in ALL_OPS if o not in TRANSCENDENTAL + ("softmax",))
UNIFORM = [(F64,), (F32,), (F16,), (BF16,)]
MIXED = [(F16, F32), (BF16, F32), (F32, F64), (F16, F64), (BF16, F64)]
CONSTANTS = (0.5, 3.0, -2.5, 0.1, 1000.0)


def _bsize(s1, s2):
    try:
        return int(np.prod(np.broadcast_shapes(s1, s2)))
    except ValueError:
        return 2 ** 62


def _eager(nd, args):
    with np.errstate(all="ignore"):
        return program_apply(nd, args)


def draw_case(data, *, ops, dtype_sets, policy, sizes=(1, 2, 3, 4, 5), max_nodes=8,
              interval_inputs=True, shapes=None, max_elems=64, matmul_modes=("midrad",)):
    salt = zlib.crc32(policy.encode())        # parametrized runs see different programs
    n = data.draw(st.sampled_from(sizes), label="n")
    dts = data.draw(st.sampled_from(dtype_sets), label="dtypes")
    seed = data.draw(st.integers(0, 2 ** 32 - 1), label="seed") ^ salt
    mm_mode = data.draw(st.sampled_from(matmul_modes), label="matmul")
    rng = np.random.default_rng(seed)
    n_in = data.draw(st.integers(1, 3), label="n_inputs")
    centers = []
    for i in range(n_in):
        dt = dts[int(rng.integers(len(dts)))]
        opts = [(n, n), (n, n), (1, n), (n, 1)] if shapes is None else shapes(n)
        shape = opts[int(rng.integers(len(opts)))]
        mode = data.draw(st.sampled_from(INPUT_MODES), label=f"mode{i}")
        centers.append(gen_values(rng, mode, shape, dt, centers))
    inputs, radii, samplers = [], [], []
    for x in centers:
        if interval_inputs and rng.random() < 0.2:
            iv, r, smp = interval_input(rng, x, int(rng.choice([1, 3, 100])))
            inputs.append(iv)
            radii.append(r)
            samplers.append(smp)
        else:
            inputs.append(x)
            radii.append(None)
            samplers.append(None)
    vals = list(centers)
    nodes, meta = [], []

    def push(nd):
        args = [vals[i] for i in nd.args]
        out = _eager(nd, args)
        nodes.append(nd)
        meta.append((out.dtype, tuple(a.dtype for a in args)))
        vals.append(out)
        return len(vals) - 1

    n_nodes = data.draw(st.integers(1, max_nodes), label="n_nodes")
    for _ in range(n_nodes):
        op = ops[(data.draw(st.integers(0, len(ops) - 1), label="op") + salt) % len(ops)]
        hi = len(vals) - 1
        a = data.draw(st.integers(0, hi), label="arg")
        if op == "matmul":
            r = vals[a].shape[0]
            cands = [j for j in range(len(vals)) if vals[j].shape[0] == vals[a].shape[1]
                     and r * vals[j].shape[1] <= max_elems]
            if not cands:
                if r * r > max_elems:        # a = T(b) with b small on the long side
                    a = push(Node("T", (a,)))
                cands = [push(Node("T", (a,)))]
            b = cands[data.draw(st.integers(0, len(cands) - 1), label="arg")]
            push(Node("matmul", (a, b)))
            continue
        if op in ARITY:
            args = [a] + [data.draw(st.integers(0, hi), label="arg") for _ in range(ARITY[op] - 1)]
            args = [j if _bsize(vals[a].shape, vals[j].shape) <= max(max_elems, vals[a].size)
                    else a for j in args]
            nd = Node(op, tuple(args))
            try:
                push(nd)
            except (TypeError, ValueError):   # e.g. bfloat16 with float16: no common dtype
                args = [push(Node("cast", (j,), (("to", vals[a].dtype),))) if j != a else j
                        for j in args]
                push(Node(op, tuple(args)))
            continue
        if op in ("sqrt", "log") and data.draw(st.integers(0, 3), label="abs first") > 0:
            a = push(Node("abs", (a,)))
        params = ()
        if op == "scale":
            params = (("c", data.draw(st.sampled_from(CONSTANTS), label="c")),)
        elif op == "cast":
            src = vals[a].dtype
            choices = {F64: [F32, F16, BF16], F32: [F16, BF16, F64], F16: [F32, F64, BF16],
                       BF16: [F32, F64, F16]}[src]
            params = (("to", data.draw(st.sampled_from(choices), label="to")),)
        elif op == "sum":
            params = (("axis", data.draw(st.sampled_from([0, 1, None]), label="axis")),)
        elif op in ("mean", "cumsum", "softmax", "layer_norm"):
            params = (("axis", data.draw(st.sampled_from([0, 1]), label="axis")),)
        push(Node(op, (a,), params))
    case = Case(inputs, centers, radii, nodes, meta, policy, mm_mode)
    return case, samplers, rng


# =============================================================================================
# Checking
# =============================================================================================
class Violations(AssertionError):
    pass


def _fmt_el(x):
    if isinstance(x, gmpy2.mpfr):
        return x.__format__(".25g") if not gmpy2.is_nan(x) else "nan"
    return repr(float(x))


_NUMPY_ACC = {"reduce_sum", "cumsum"}


def not_policy_executions(case):
    """Nodes whose NumPy value is not an execution of the case's policy (and their
    dependents): NumPy sums float16/bfloat16 in float16/bfloat16, where "cuda"/"tf32" say
    float32 accumulation. For those, only (a) and (c) apply."""
    pol = get_policy(case.policy)
    bad = set()
    for k, nd in enumerate(case.nodes):
        node_id = case.n_in + k
        if any(j in bad for j in nd.args):
            bad.add(node_id)
            continue
        dt = case.meta[k][1][0]
        sum_dt = {"sum": dt, "cumsum": dt, "softmax": dt, "mean": F32 if dt == F16 else dt,
                  "layer_norm": F32 if dt == F16 else dt}.get(nd.op)
        if sum_dt is not None and sum_dt in (F16, BF16):
            prim = "cumsum" if nd.op == "cumsum" else "reduce_sum"
            if pol.resolve(prim, sum_dt).accumulate.name != fmt(sum_dt).name:
                bad.add(node_id)
    return bad


_BEYOND = np.frompyfunc(lambda e: bool(not gmpy2.is_nan(e) and abs(e) > FLT64_MAX), 1, 1)


def taint_apply(node, args, meta):
    """Which elements of a node depend on a tainted element of its arguments."""
    op, kw = node.op, node.kw
    if op == "T":
        return args[0].T
    if op == "matmul":
        a, b = args
        return np.any(a, axis=1, keepdims=True) | np.any(b, axis=0, keepdims=True)
    if op in ("sum", "mean"):
        return np.any(args[0], axis=kw["axis"], keepdims=True)
    if op == "cumsum":
        return np.logical_or.accumulate(args[0], axis=kw["axis"])
    if op in ("softmax", "layer_norm"):
        a = args[0]
        return np.broadcast_to(np.any(a, axis=kw["axis"] % 2, keepdims=True), a.shape)
    out = args[0]
    for t in args[1:]:
        out = out | t
    return out


def overflow_taint(case, exact):
    """Per node, the elements downstream of an exact intermediate beyond float64's range."""
    taint = [np.zeros(np.shape(x), bool) for x in case.centers]
    marks = list(taint)
    for k, nd in enumerate(case.nodes):
        args = [marks[j] for j in nd.args]
        t = np.asarray(taint_apply(nd, args, case.meta[k]), bool)
        taint.append(t)
        marks.append(t | np.asarray(_BEYOND(exact[k]), bool))
    return taint[case.n_in:]


def check_case(case, samplers, rng, stats, alt_configs):
    """Run fpx.interval on the case and check (a)-(d) for every element of every node."""
    prog = make_program(case)
    with np.errstate(all="ignore"):
        eager = prog(*case.centers)
        ivs = fpx.interval(prog, policy=case.policy, matmul=case.matmul)(*case.inputs)
    assert isinstance(ivs, list) and len(ivs) == len(case.nodes)
    exact = exact_values(case)
    alts = []
    for cfg in alt_configs:
        alt = Alt(case.policy, rng=rng, stats=stats, **cfg)
        ins = [s(rng) if s is not None else x for s, x in zip(samplers, case.centers)]
        with np.errstate(all="ignore"):
            alts.append((alt, ins, run_dag(case, ins, alt.apply)))
    bad = []
    foreign = not_policy_executions(case)
    # an exact intermediate beyond float64's range: the program overflowed there (the exact
    # result downstream may be finite again, e.g. log(x*x)); (a) does not apply to the
    # elements that depend on it
    beyond = overflow_taint(case, exact)
    stats["cases"] += 1
    for k, nd in enumerate(case.nodes):
        iv = ivs[k]
        node_id = case.n_in + k
        lo, hi = np.asarray(iv.lo), np.asarray(iv.hi)
        v = np.asarray(iv.value)
        stats["nodes"] += 1
        # (b) the program's own value, and it is the eager program's value bit for bit
        assert v.dtype == eager[k].dtype and v.shape == eager[k].shape == lo.shape == hi.shape, \
            f"n{node_id} = {nd}: value {v.dtype}{v.shape} vs eager {eager[k].dtype}" \
            f"{eager[k].shape}, bounds {lo.shape}"
        v64 = f64(v)
        assert np.array_equal(v64, f64(eager[k]), equal_nan=True), \
            f"n{node_id} = {nd}: interval's value differs from the eager program"
        stats["elements"] += v.size
        # a NaN bound makes no claim (contains() is False, classify says inconclusive): it is
        # what a rule returns where an execution may give NaN; counted, and must stay rare
        nanb = np.isnan(lo) | np.isnan(hi)
        stats["nan_bound"] += int(nanb.sum())
        if node_id in foreign:
            stats["value_skip_not_a_policy_execution"] += v.size
            v64 = np.full(v.shape, np.nan)
        stats["nan_bound_finite_value"] += int((nanb & np.isfinite(v64)).sum())
        ok = np.isnan(v64) | nanb | ((lo <= v64) & (v64 <= hi))
        stats["value_checked"] += int((~np.isnan(v64) & ~nanb).sum())
        for idx in zip(*np.nonzero(~ok)):
            bad.append(("program value", node_id, idx, lo[idx], hi[idx], v64[idx], ""))
        # (a) exact
        ex = np.broadcast_to(exact[k], v.shape)
        for idx in np.ndindex(v.shape):
            e = ex[idx]
            if nanb[idx]:
                stats["exact_skip_nan_bound"] += 1
            elif beyond[k][idx]:
                stats["exact_skip_after_float64_overflow"] += 1
            elif gmpy2.is_nan(e) or gmpy2.is_infinite(e):
                stats["exact_skip_undefined"] += 1
            elif np.isnan(f64(eager[k])[idx]):
                stats["exact_skip_program_nan"] += 1
            elif abs(e) > FLT64_MAX:
                stats["exact_skip_beyond_float64"] += 1
            else:
                stats["exact_checked"] += 1
                if not (gmpy2.mpfr(float(lo[idx])) <= e <= gmpy2.mpfr(float(hi[idx]))):
                    bad.append(("exact", node_id, idx, lo[idx], hi[idx], e, ""))
        # (c) other executions
        for alt, ins, res in alts:
            y = f64(res[k])
            assert y.shape == v.shape, (nd, y.shape, v.shape)
            nan = np.isnan(y) | nanb
            stats["alt_checked"] += int((~nan).sum())
            stats["alt_skip_nan"] += int(nan.sum())
            ok = nan | ((lo <= y) & (y <= hi))
            for idx in zip(*np.nonzero(~ok)):
                bad.append(("other execution", node_id, idx, lo[idx], hi[idx], y[idx],
                            f"{alt!r}, inputs {[f64(i).tolist() for i in ins]}"))
        # (d) casts: the correctly rounded result of the program's input
        if nd.op == "cast" and nd.args[0] not in foreign:
            src = f64(eager[nd.args[0] - case.n_in]) if nd.args[0] >= case.n_in \
                else f64(case.centers[nd.args[0]])
            cr = f64(F.round(src, fmt(nd.kw["to"])))
            ok = np.isnan(cr) | nanb | ((lo <= cr) & (cr <= hi))
            stats["cast_checked"] += int((~np.isnan(cr) & ~nanb).sum())
            for idx in zip(*np.nonzero(~ok)):
                bad.append(("correctly rounded cast", node_id, idx, lo[idx], hi[idx], cr[idx], ""))
    if bad:
        stats["violations"] += len(bad)
        msg = [f"{len(bad)} soundness violation(s) of fpx.interval", case.describe(), ""]
        for kind, node_id, idx, l, h, y, extra in bad[:12]:
            msg.append(f"  {kind} outside the bound at n{node_id}{list(map(int, idx))}: "
                       f"{_fmt_el(y)} not in [{l!r}, {h!r}] {extra}")
        raise Violations("\n".join(msg))


def alt_configs_for(rng, policy, n=5):
    """A spread of executions: every order once, random flags."""
    out = []
    for order in Alt.ORDERS[:n]:
        out.append(dict(order=order, cr_transc=bool(rng.random() < 0.5),
                        cr_cast=bool(rng.random() < 0.5), fused=bool(rng.random() < 0.3),
                        directed=str(rng.choice(["rn", "rz", "ru", "rd"]))))
    return out


def _report(name, stats):
    keys = sorted(stats)
    print(f"\n[{name}] " + ", ".join(f"{k}={stats[k]}" for k in keys))


def _assert_coverage(stats, min_cases, min_elements):
    assert stats["violations"] == 0
    assert stats["cases"] >= min_cases, stats
    assert stats["exact_checked"] >= min_elements, stats
    assert stats["alt_checked"] >= 3 * min_elements, stats
    skipped = sum(v for k, v in stats.items() if k.startswith("exact_skip"))
    # skips must stay rare, and so must NaN bounds ("no claim") on finite program values
    assert skipped <= 0.2 * (stats["exact_checked"] + skipped), stats
    assert stats["nan_bound_finite_value"] <= 0.08 * stats["value_checked"], stats


# =============================================================================================
# 1. Property tests
# =============================================================================================
@pytest.mark.slow
def test_random_dags_numpy_policy():
    """Random DAGs over every op, all dtypes (uniform and mixed), NumPy executes the program,
    policy "numpy"; checks (a)-(d) on every element of every node."""
    stats = collections.Counter()

    @seed(20251121)   # fixed seeds (hypothesis still adapts later examples to run time)
    @settings(max_examples=_n(3000), **SETTINGS)
    @given(st.data())
    def run(data):
        case, samplers, rng = draw_case(data, ops=ALL_OPS, dtype_sets=UNIFORM * 2 + MIXED,
                                        policy="numpy", max_nodes=10,
                                        matmul_modes=("midrad", "midrad", "exact-center",
                                                      "fast"))
        check_case(case, samplers, rng, stats, alt_configs_for(rng, "numpy"))

    run()
    _report("numpy policy", stats)
    _assert_coverage(stats, _n(3000), _n(80000))


@pytest.mark.parametrize("policy", [pytest.param("tf32", marks=pytest.mark.slow),
                                    pytest.param("cuda", marks=pytest.mark.slow), "ieee"])
def test_random_dags_emulated_policies(policy):
    """Correctly rounded elementwise ops (NumPy's +-*/ sqrt casts are correctly rounded, so the
    program's value is an execution of every policy) with matmuls/sums executed as the policy
    says: "tf32": inputs rounded to tf32 (nearest or truncated), float32 accumulation with any
    directed rounding (1 ulp per addition); "cuda": float32 accumulation for half-precision
    sums; "ieee": accumulation in the program's dtypes."""
    stats = collections.Counter()

    @seed(20251122 + zlib.crc32(policy.encode()))
    @settings(max_examples=_n(600), **SETTINGS)
    @given(st.data())
    def run(data):
        case, samplers, rng = draw_case(data, ops=RATIONAL_OPS,
                                        dtype_sets=[(F32,), (F32,), (F16,), (BF16,), (F16, F32),
                                                    (F64,)],
                                        policy=policy, sizes=(1, 2, 3, 4, 6, 8))
        check_case(case, samplers, rng, stats, alt_configs_for(rng, policy))

    run()
    _report(policy, stats)
    _assert_coverage(stats, _n(600), _n(20000))


LONG_OPS = ("sum", "mean", "cumsum", "matmul", "softmax", "layer_norm", "add", "mul", "cast")


@pytest.mark.slow      # (10-25 s: the default run keeps its siblings)
def test_long_reductions():
    """Few ops, long reductions (K up to 400): the gamma_K bound against sequential (float16
    accumulation stagnates), reversed, pairwise, blocked and random-tree executions."""
    stats = collections.Counter()

    @seed(20251123)
    @settings(max_examples=_n(400), **SETTINGS)
    @given(st.data())
    def run(data):
        case, samplers, rng = draw_case(data, ops=LONG_OPS, dtype_sets=UNIFORM + MIXED[:2],
                                        policy="numpy", sizes=(17, 64, 400, 2000), max_nodes=3,
                                        interval_inputs=False, max_elems=4000,
                                        matmul_modes=("midrad", "fast"),
                                        shapes=lambda n: [(1, n), (n, 1), (2, n), (n, 2)])
        check_case(case, samplers, rng, stats, alt_configs_for(rng, "numpy"))

    run()
    _report("long reductions", stats)
    assert stats["violations"] == 0 and stats["alt_checked"] > _n(1000000), stats
    assert stats["nan_bound_finite_value"] <= 0.08 * stats["value_checked"], stats


def test_correctly_rounded_oracle_matches_formats_round():
    """Self-check of the test's own oracle: MPFR in a format context == fpx.formats.round of
    a 1200-bit value (double rounding excluded by the residual)."""
    rng = np.random.default_rng(1)
    for dt in (F32, F16, BF16, F64):
        x = gen_values(rng, "normal", (200,), dt, [])
        y = correctly_rounded("exp", x)
        with gmpy2.context(gmpy2.get_context(), precision=EXACT_PREC):
            hi_ = np.array([float(gmpy2.exp(gmpy2.mpfr(float(v)))) for v in f64(x)])
            res = np.array([float(gmpy2.exp(gmpy2.mpfr(float(v))) - gmpy2.mpfr(float(h)))
                            if math.isfinite(h) else 0.0 for v, h in zip(f64(x), hi_)])
        ref = F.round(hi_, fmt(dt), residual=res)
        assert np.array_equal(f64(y), f64(ref), equal_nan=True), dt


# =============================================================================================
# 2. Regression tests: one per RENDER flaw
# =============================================================================================
def _iv(f, *args, **kw):
    with np.errstate(all="ignore"):
        return fpx.interval(f, **kw)(*args)


def test_render_flaw_precision_from_result_format_not_operands():
    # float32 operands, result stored in float16: the rounding is float16's
    x = np.array([1 + 2.0 ** -20, 3.0e-5, 70000.0, 65519.0], np.float32)
    iv = _iv(lambda a: fnp.astype(a, np.float16), x)
    y = x.astype(np.float16)
    assert np.all(iv.contains(y)) and np.all(iv.contains(f64(x)))
    assert iv.contains(1.0)[0] and not (iv.lo[0] > 1.0)      # operand precision would miss 1.0
    assert iv.hi[2] == np.inf                                  # 70000 overflows float16
    # float32 * float32 whose product is stored in float16 (cast right after)
    a = np.array([1 + 2.0 ** -12], np.float32)
    iv = _iv(lambda a: fnp.astype(fnp.multiply(a, a), np.float16), a)
    assert iv.contains(np.float16(f64(a * a)[0]))[0] and iv.contains(f64(a)[0] ** 2)[0]
    assert iv.hi[0] - iv.lo[0] >= 2.0 ** -11
    # float16 matmul: float32 accumulation, result stored in float16 (numpy policy; and a
    # policy stating NumPy's exact float32 products, so that only the output rounding of
    # the result format can explain the program's value)
    from fpx.policy import OpPrecision
    exact_products = get_policy("numpy").replace(
        matmul=OpPrecision(compute="float32", accumulate="float32"))
    A = np.array([[1.0, 2.0 ** -11]], np.float16)
    B = np.array([[1.0], [1.0]], np.float16)
    for pol in ("numpy", exact_products):
        iv = _iv(fnp.matmul, A, B, policy=pol)
        assert iv.value.dtype == np.float16 and iv.value[0, 0] == 1.0   # 1 + 2^-11 ties to 1
        assert iv.contains(1.0)[0, 0] and iv.contains(1 + 2.0 ** -11)[0, 0]
        assert iv.hi[0, 0] - iv.lo[0, 0] >= 2.0 ** -11                  # float16's, not float32's
    # ... and a policy whose matmul output is float32: that result is representable
    A32 = A.astype(np.float32)
    iv = _iv(fnp.matmul, A32, B.astype(np.float32))
    assert iv.contains(1 + 2.0 ** -11)[0, 0] and iv.hi[0, 0] - iv.lo[0, 0] < 2.0 ** -18


def test_render_flaw_accumulator_added_after_dot_bound():
    # numpy d + a @ b: the matmul rounds, then the addition rounds again
    a = np.array([[2.0 ** -11, 2.0 ** -24]], np.float16)
    b = np.array([[1.0], [1.0]], np.float16)
    d = np.array([[1.0]], np.float16)
    iv = _iv(lambda d, a, b: fnp.add(d, fnp.matmul(a, b)), d, a, b)
    exact = 1 + 2.0 ** -11 + 2.0 ** -24
    assert iv.value[0, 0] == 1.0 and iv.contains(1.0)[0, 0] and iv.contains(exact)[0, 0]
    # the two roundings of a sequential float16 execution: fl(fl(a@b) + d)
    ab = np.float16(2.0 ** -11 + 2.0 ** -24)
    assert iv.contains(f64(np.float16(1.0) + ab))[0, 0]
    # fpx.numpy.fma: one rounding, in the result format (float16 and float32)
    for dt, small in ((np.float16, 2.0 ** -11), (np.float32, 2.0 ** -24)):
        x, y, z = np.array([1.0], dt), np.array([small], dt), np.array([1.0], dt)
        iv = _iv(fnp.fma, x, y, z)
        assert iv.value[0] == 1.0 and iv.contains(1.0)[0] and iv.contains(1 + small)[0]
        z2 = np.array([-1.0], dt)
        iv = _iv(fnp.fma, np.array([1 + 4 * small], dt), np.array([1 + 4 * small], dt), z2)
        ex = (1 + 4 * small) ** 2 - 1
        assert iv.contains(ex)[0] and iv.contains(f64(iv.value))[0]


_TOY = "toy_interval_test_op"


def _toy_primitive():
    from fpx.core import PRIMITIVES, Primitive
    return PRIMITIVES.get(_TOY) or Primitive(_TOY, lambda B: (lambda x: B.xp.multiply(x, 3.0)),
                                             kind="elementwise")


def test_render_flaw_unknown_ops_are_not_exact():
    toy = _toy_primitive()
    x = np.array([1.0, 2.0], np.float32)
    assert np.array_equal(toy.bind(x), x * 3)                   # it runs eagerly
    with pytest.raises(fpx.UnsupportedOpError, match=_TOY):
        fpx.interval(lambda x: toy.bind(fnp.add(x, x)))(x)
    with pytest.raises(fpx.UnsupportedOpError):
        fpx.interval(lambda x: toy.bind(x))(fpx.Interval.around(x, 1e-3))


def test_render_flaw_endpoint_only_sin_cos():
    for dt in (np.float64, np.float32, np.float16):
        x = Interval(np.array([1.5]), np.array([1.7]), np.array([1.6], dt))   # contains pi/2
        iv = _iv(fnp.sin, x)
        assert iv.hi[0] >= 1.0 and iv.hi[0] < 1.0 + 0.01
        assert max(np.sin(1.5), np.sin(1.7)) < 0.998     # an endpoint-only bound would miss 1
        iv = _iv(fnp.cos, Interval(np.array([-0.1]), np.array([0.2]), np.array([0.0], dt)))
        assert iv.hi[0] >= 1.0
        iv = _iv(fnp.cos, Interval(np.array([3.0]), np.array([3.3]), np.array([3.1], dt)))
        assert iv.lo[0] <= -1.0                                   # contains pi
        iv = _iv(fnp.sin, Interval(np.array([-2.0]), np.array([5.0]), np.array([0.0], dt)))
        assert iv.lo[0] <= -1.0 and iv.hi[0] >= 1.0
    # points: sin/cos near multiples of pi/2 in float32
    k = np.arange(-8, 9)
    x = (k * np.float32(np.pi / 2)).astype(np.float32)
    for f, g in ((fnp.sin, gmpy2.sin), (fnp.cos, gmpy2.cos)):
        iv = _iv(f, x)
        with gmpy2.context(gmpy2.get_context(), precision=200):
            ex = [g(gmpy2.mpfr(float(v))) for v in f64(x)]
        assert all(gmpy2.mpfr(float(l)) <= e <= gmpy2.mpfr(float(h))
                   for l, e, h in zip(iv.lo, ex, iv.hi))


def test_render_flaw_cumsum_without_rounding_term():
    x = np.full(3000, 0.1, np.float16)
    iv = _iv(lambda a: fnp.cumsum(a), x)
    # the sequential float16 execution (each addition rounded to float16) stagnates
    seq = np.empty(x.size, np.float16)
    s = np.float16(0)
    for i, t in enumerate(x):
        s = np.float16(s + t)
        seq[i] = s
    exact = np.cumsum(f64(x))
    assert abs(f64(seq[-1]) - exact[-1]) > 40            # a large round-off error to cover
    assert np.all(iv.contains(seq)) and np.all(iv.contains(exact)) and np.all(iv.contains(iv.value))
    # the same under the float32-accumulating "cuda" policy: the float16 output rounding counts
    y = np.array([1.0, 2.0 ** -11, 2.0 ** -11, 2.0 ** -12], np.float16)
    for pol in ("numpy", "cuda", "ieee"):
        iv = _iv(lambda a: fnp.cumsum(a), y, policy=pol)
        acc32 = np.cumsum(y.astype(np.float32)).astype(np.float16)
        assert np.all(iv.contains(acc32)) and np.all(iv.contains(np.cumsum(f64(y)))), pol
        if pol != "cuda":   # NumPy's float16 accumulation is not an execution of "cuda"
            assert np.all(iv.contains(iv.value)), pol


def test_render_flaw_relative_only_widening_at_zero():
    x = np.array([1e-30, 1e-20, 1e-23, -1e-25], np.float32)
    iv = _iv(lambda a: fnp.multiply(a, a), x)
    y = x * x                                             # 0, subnormal, subnormal, 0
    assert y[0] == 0 and 0 < y[1] < np.finfo(np.float32).tiny
    assert np.all(iv.contains(y)) and np.all(iv.contains(f64(x) ** 2))
    assert iv.contains(0.0)[0] and np.all(iv.hi > iv.lo)
    # a product of two exact zeros still gets no width, but a rounding to 0 does
    for dt in (np.float16, BF16, np.float64):
        x = np.array([f64(np.finfo(np.float16).smallest_subnormal) if dt == np.float16 else 1e-200,
                      0.0]).astype(dt)
        iv = _iv(lambda a: fnp.multiply(a, a), x)
        assert np.all(iv.contains(f64(x) ** 2)) and np.all(iv.contains(iv.value))
        assert iv.hi[0] > 0 and iv.lo[0] <= 0


def _sign_flip_inputs():
    # x = ((a + b) - a) - c is computed > 0 in float32 but is < 0 exactly
    a = np.float32(1.0)
    b = np.float32(3 * 2.0 ** -25)
    c = np.float32(0.9 * 2.0 ** -23)
    exact = 3 * 2.0 ** -25 - float(c)
    assert exact < 0
    return np.array([a]), np.array([b]), np.array([c])


def _branchy(a, b, c):
    x = fnp.subtract(fnp.subtract(fnp.add(a, b), a), c)
    return fnp.where(fnp.greater(x, 0), np.float32(1.0), np.float32(-1.0))


def test_render_flaw_following_the_concrete_branch():
    a, b, c = _sign_flip_inputs()
    interp, out = run_interval(_branchy, (a, b, c), {})
    assert out.value[0] == 1.0                      # the program took the "x > 0" branch
    assert out.contains(-1.0)[0] and out.contains(1.0)[0]   # hull of both branches
    assert out.unstable is not None and out.unstable[0]
    # RENDER's semantics follow the observed branch: shown unsound on this case
    concrete_ = _iv(_branchy, a, b, c, branches="concrete")
    assert concrete_.contains(1.0)[0] and not concrete_.contains(-1.0)[0]
    # where(x > 0, a, b) on an interval straddling 0 hulls; a decided one does not
    x = Interval(np.array([-1e-3, 0.5]), np.array([1e-3, 1.0]), np.array([1e-4, 0.7]))
    iv = _iv(lambda x: fnp.where(fnp.greater(x, 0), fnp.add(x, 10.0), fnp.subtract(x, 10.0)), x)
    assert iv.lo[0] <= -10.001 and iv.hi[0] >= 10.001 and iv.unstable[0]
    assert iv.lo[1] >= 10.0 and not iv.unstable[1]
    # max(x, 0) (relu) is continuous: no hull needed, but both sides are covered
    iv = _iv(lambda x: fnp.maximum(x, 0.0), x)
    assert iv.lo[0] == 0.0 and iv.hi[0] >= 1e-3


def test_render_flaw_nan_bounds_are_not_inside():
    iv = Interval(np.array([np.nan, 0.0, np.nan]), np.array([1.0, np.nan, np.nan]))
    for y in (0.5, 0.0, np.nan, np.inf, -np.inf):
        assert not np.any(iv.contains(y))
    assert not Interval(0.0, 1.0).contains(np.nan)
    everything = Interval(-np.inf, np.inf)
    assert everything.contains(np.inf) and not everything.contains(np.nan)
    out = _iv(fnp.sqrt, np.array([-1.0, 4.0]))
    assert not out.contains(np.nan)[0] and out.contains(2.0)[1]


# =============================================================================================
# 3. Edge behaviour
# =============================================================================================
def test_division_by_interval_containing_zero():
    a = np.array([1.0, 2.0, -3.0, 0.0])
    b = Interval(np.array([-1.0, 0.5, 0.0, -2.0]), np.array([1.0, 2.0, 0.0, -1.0]),
                 np.array([0.5, 1.0, 0.0, -1.5]))
    interp, out = run_interval(lambda a, b: fnp.divide(a, b), (a, b), {})
    assert out.lo[0] == -np.inf and out.hi[0] == np.inf
    assert out.lo[2] == -np.inf and out.hi[2] == np.inf
    assert np.isfinite(out.lo[1]) and np.isfinite(out.hi[1]) and out.contains(2.0 / 0.5)[1]
    assert np.isfinite(out.lo[3]) and out.contains(0.0)[3]
    ev = [e for e in interp.events if e.kind == "division-by-zero-interval"]
    assert len(ev) == 1 and ev[0].count == 2
    # a point zero divisor as well (float32 program)
    interp, out = run_interval(lambda a, b: fnp.divide(a, b),
                               (np.array([1.0, 1.0], np.float32),
                                np.array([0.0, 2.0], np.float32)), {})
    assert out.hi[0] == np.inf and out.contains(np.inf)[0] and out.contains(0.5)[1]
    assert any(e.kind == "division-by-zero-interval" for e in interp.events)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_division_bounds_are_the_numpy_paths(dtype, monkeypatch):
    """The division rule's one-pass kernel (``div_bounds``) gives the bounds, bit for bit, and
    the divisor-holds-0 count of its NumPy path (corners, rounding, sign, ±inf): boxes and
    points over zeros of both signs, subnormals, huge values, infinities and NaN."""
    rng = np.random.default_rng(7)
    edge = np.array([0.0, -0.0, 1.0, -1.0, 3.0, 1e-310, -1e-310, 1e-40, 1e30, -1e30, np.inf,
                     -np.inf, np.nan, 2.5e-8, 7.0, -3.0]).astype(dtype)
    n = 4000

    def operand():
        v = np.where(rng.random(n) < 0.4, rng.choice(edge, n),
                     (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).astype(dtype))
        with np.errstate(all="ignore"):
            r = np.where(rng.random(n) < 0.3, 0.0, np.abs(v.astype(np.float64)) *
                         10.0 ** rng.integers(-8, 1, n))
            lo, hi = v - r, v + r
        lo, hi = np.where(np.isnan(lo), v, lo), np.where(np.isnan(hi), v, hi)
        return Interval(lo, hi, v)

    a, b = operand(), operand()
    f = lambda x, y: fnp.divide(x, y)      # noqa: E731
    with np.errstate(all="ignore"):
        i1, fused = run_interval(f, (a, b), {})
        plain = IntervalInterpreter.fused_terms
        monkeypatch.setattr(IntervalInterpreter, "fused_terms", lambda self, name, F, steps=1:
                            None if name == "div" else plain(self, name, F, steps))
        i2, numpy_path = run_interval(f, (a, b), {})
    assert np.array_equal(fused.lo, numpy_path.lo, equal_nan=True)
    assert np.array_equal(fused.hi, numpy_path.hi, equal_nan=True)
    for x, y in ((fused.lo, numpy_path.lo), (fused.hi, numpy_path.hi)):   # zeros' signs too
        num = ~np.isnan(x)
        assert np.array_equal(np.signbit(x[num]), np.signbit(y[num]))
    count = lambda i: sum(e.count for e in i.events if e.kind == "division-by-zero-interval")  # noqa: E731,E501
    assert count(i1) == count(i2) > 0
    assert np.isnan(fused.lo).any() and np.isinf(fused.hi).any()


def _max_error_sum_terms():
    """K = 8192 float32 terms whose sequential sum errs by ~(K-2)/2 with partial sums near
    2^23 and an exact total near 0: +2^23, 4095 x (0.5 + 2^-24) (each addition rounds up by
    ~1/2 = u·|partial|), 4095 x -(0.5 - 2^-25) (each rounds back up: no change), -2^23. The
    partial-sum bound γ_{K-1}(u)·max(P, N) is 4098.5 against an error of 4095 (the classic
    (K-1)·u·Σ|x| is twice that)."""
    n = 4095
    return np.concatenate([[2.0 ** 23], np.full(n, 0.5 + 2.0 ** -24),
                           np.full(n, -(0.5 - 2.0 ** -25)), [-2.0 ** 23]]).astype(np.float32)


def test_partial_sum_bound_holds_where_every_rounding_errs_maximally():
    """The partial-sum form of the sum and dot-product bounds (|partial sums| <= max(P, N),
    ``partial_sum_gamma``, ``_matmul_split``) against a sum built so that nearly every
    addition errs by u·|partial sum|, in the same direction: the sequential float32 result,
    ~4095 away from the exact ~3.7e-4, lies inside (with < 0.1% to spare), and so do the
    exact sum and the pairwise result; the dot product's point and value-centred paths
    too."""
    x = _max_error_sum_terms()
    seq = np.cumsum(x)[-1]                      # NumPy's cumsum is sequential
    exact = math.fsum(f64(x))
    assert abs(float(seq) - exact) > 4094
    b = _iv(lambda t: fnp.sum(t), x)
    assert b.contains(seq) and b.contains(exact) and b.contains(np.sum(x))
    assert b.hi - b.lo < 2 * 4099                # the partial-sum form, not 2·8193
    c = _iv(lambda t: fnp.cumsum(t), x)
    assert c.contains(np.cumsum(x)).all() and c.hi[-1] - c.lo[-1] < 2 * 4099
    ones = np.ones_like(x)
    for args in ((x[None, :], ones[:, None]), (ones[None, :], x[:, None]),
                 (fpx.Interval.around(x[None, :], rel=2.0 ** -30), ones[:, None])):
        d = _iv(fnp.matmul, *args)
        assert d.contains(seq).all() and d.contains(exact).all(), args
    # the float32 execution itself in the reversed order: the same error mirrored
    rev = np.cumsum(x[::-1])[-1]
    assert b.contains(rev) and _iv(fnp.matmul, x[None, :], ones[:, None]).contains(rev).all()


def test_partial_sum_bound_halves_the_radius_of_cancelling_sums():
    """For terms of mixed signs the partial-sum form is about half the classic bound: a point
    matmul's width against RENDER's 2·γ_K·Σ|a||b| -- median <= 0.6x with the float64 centre,
    <= 0.75x with the float32 parts centre,
    never wider -- and a sum's radius against (n-1)·u·Σ|x|."""
    rng = np.random.default_rng(31)
    A = rng.standard_normal((48, 512)).astype(np.float32)
    B = rng.standard_normal((512, 40)).astype(np.float32)
    u = 2.0 ** -24
    rend = fpx.Interval.around(np.zeros((48, 40)), 512 * u / (1 - 512 * u)
                               * (np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))))
    for mode, med in (("exact-center", 0.6), ("midrad", 0.75)):
        ours = _iv(fnp.matmul, A, B, matmul=mode)
        ratio = f64(ours.width) / f64(rend.width)
        assert ratio.max() <= 1.0 and np.median(ratio) <= med, (mode, ratio.max(), np.median(ratio))
        assert ours.contains(A.astype(np.float64) @ B.astype(np.float64)).all()
    x = rng.standard_normal(100000).astype(np.float32)
    s = _iv(lambda t: fnp.sum(t), x)
    classic = (x.size - 1) * 2.0 ** -24 * np.sum(np.abs(f64(x)))
    assert (s.hi - s.lo) / 2 < 0.55 * classic and s.contains(math.fsum(f64(x)))


def test_parts_ball_is_the_unfused_centre_ball():
    """``parts_ball`` (the split-K centre's ball read from its parts in one pass) bounds what
    ``parts_sum`` -> ``scale_up`` -> ``center_ball`` bound -- ``|v - C| + R·f + a + e·S``
    with C and S the exact sums -- and agrees with that chain to its own rounding slack, for a
    bias row, a per-row column and a scalar; a non-finite part is counted, not bounded."""
    from fpx.kernels import interval as KI
    rng = np.random.default_rng(41)
    shape = (3, 5, 17)
    parts = [rng.standard_normal(shape).astype(np.float32) * 10.0 ** k for k in (0, -3, 2, 0)]
    v = (sum(p.astype(np.float64) for p in parts)
         * (1 + 1e-6 * rng.standard_normal(shape))).astype(np.float32)
    R = np.abs(rng.standard_normal(shape)).astype(np.float32)
    for bias in (rng.standard_normal(17), rng.standard_normal((5, 1)), 0.25):
        r, bad = KI.parts_ball(parts, bias, 3e-7 * 1.5, v, R, 1.001, 1e-30, np.inf, 1e-7)
        C, E = KI.parts_sum(parts, bias, 3e-7)
        r0, bad0 = KI.center_ball(C, v, R, 1.001, KI.scale_up(E, 1.5, 1e-30), np.inf, 1e-7)
        assert bad == bad0 == 0 and r.dtype == np.float32
        np.testing.assert_allclose(r, r0, rtol=1e-6)
        b = np.broadcast_to(np.asarray(bias, np.float64), shape)
        exact = np.vectorize(lambda *t: math.fsum(t))(*(p.astype(np.float64) for p in parts), b)
        S = sum(np.abs(p.astype(np.float64)) for p in parts) + np.abs(b)
        need = (np.abs(v - exact) + R.astype(np.float64) * 1.001 + 1e-30 + 3e-7 * 1.5 * S
                + 1e-7 * np.abs(exact))
        assert np.all(r.astype(np.float64) >= need)
    parts[2][1, 2, 3] = np.inf
    assert KI.parts_ball(parts, 0.0, 1e-7, v, R, 1.0, 0.0, np.inf)[1] >= 1


def test_tiled_transpose():
    """The tiled transpose is ``.T``, C-contiguous."""
    from fpx.kernels import interval as KI
    rng = np.random.default_rng(36)
    for shape in ((1, 1), (17, 33), (64, 48), (5, 1000)):
        a = rng.standard_normal(shape).astype(np.float32)
        assert np.array_equal(KI.transposed(a), a.T) and KI.transposed(a).flags.c_contiguous


def test_bound_kernels_make_no_subnormals_from_zeros_and_stay_sound():
    """Exact zeros (ReLU, padding) and tiny values must not turn into subnormal float64 or
    float32 numbers that later steps multiply (an Intel microcode assist per multiply: the
    MLP's radius pass ran 35x slower): the widening takes |y| as at least 2^-968, upper
    bounds of nonnegative quantities keep exact zeros, and float32 GEMM factors are 0 or at
    least 2^-102. Every result still bounds its input."""
    from fpx.kernels import interval as KI
    tiny64 = np.finfo(np.float64).tiny
    x = np.array([0.0, 5e-324, 1e-310, 1e-300, 2.0 ** -968, 1.0, np.inf, np.nan])
    up, down = KI.up(x, 4 * 2.0 ** -52, 5e-324, np.inf), KI.down(x, 4 * 2.0 ** -52, 5e-324,
                                                                  np.inf)
    fin = np.isfinite(x)
    assert (up[fin] > x[fin]).all() and (down[fin] < x[fin]).all()
    assert (np.abs(up[fin]) >= tiny64).all() and (np.abs(down[fin]) >= tiny64).all()
    assert np.isnan(up[-1]) and np.isnan(down[-1]) and up[-2] == np.inf
    s = KI.scale_up(x[:-1], 1.0 + 2.0 ** -50, 0.0)
    assert s[0] == 0.0 and (s[1:] >= x[1:-1]).all() and (s[1:] >= tiny64).all()
    assert KI.scale_up(np.zeros(3), 2.0, 5e-324)[0] >= 5e-324       # 0·f + a: a kept
    assert np.isnan(KI.scale_up(np.array([np.nan]), 2.0, 0.0)[0])
    f32 = KI.f32_upper(x)
    assert f32.dtype == np.float32 and f32[0] == 0 and np.isnan(f32[-1]) and f32[-2] == np.inf
    assert (f32[1:-2].astype(np.float64) >= x[1:-2]).all() and (f32[1:-2] >= KI.F32_FLOOR).all()
    x32 = np.array([0.0, 1e-45, 1e-40, 1e-30, 1.0], np.float32)
    for w in (np.float32(0.5), np.float32(3e-3)):              # a zero and tiny inputs
        W = np.full((5, 3), w, np.float32)
        iv = _iv(lambda a: fnp.maximum(a * w, np.float32(0)) @ W, x32[None])
        assert iv.contains((x32.astype(np.float64) * float(w)) @ W.astype(np.float64)).all()


def test_probabilistic_bound_is_narrower():
    rng = np.random.default_rng(7)
    x = rng.uniform(0, 1, 20000).astype(np.float32)
    A = rng.standard_normal((8, 4096)).astype(np.float32)
    B = rng.standard_normal((4096, 8)).astype(np.float32)
    for f, args in ((lambda x: fnp.sum(x), (x,)), (fnp.matmul, (A, B)),
                    (lambda x: fnp.cumsum(x), (x,))):
        rig = _iv(f, *args)
        prob = _iv(f, *args, bound="probabilistic")
        wr, wp = f64(rig.hi - rig.lo), f64(prob.hi - prob.lo)
        assert np.all(wp <= wr) and wp.ravel()[-1] < 0.5 * wr.ravel()[-1]
        assert np.all(prob.contains(prob.value))
    # the sum of positive terms in float32 vs exact: both contain it
    ex = math.fsum(f64(x))
    assert _iv(lambda x: fnp.sum(x), x, bound="probabilistic").contains(ex)


def test_interval_inputs_propagate():
    rng = np.random.default_rng(11)
    x = rng.uniform(0.5, 2.0, (3, 4)).astype(np.float32)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    xi = Interval.around(x, rel=1e-3)
    assert xi.dtype == np.float32 and np.all(xi.lo < f64(x)) and np.all(xi.hi > f64(x))

    def f(x, w):
        return fnn.softmax(fnp.matmul(fnp.log(x), w), axis=-1)
    iv = _iv(f, xi, w)
    point = _iv(f, x, w)
    assert np.all(iv.lo <= point.lo) and np.all(iv.hi >= point.hi)
    assert np.all(f64(iv.hi - iv.lo) > 10 * f64(point.hi - point.lo))
    # every input inside the interval gives an output inside the bound
    for _ in range(20):
        xs = (f64(x) * (1 + rng.uniform(-1e-3, 1e-3, x.shape))).astype(np.float32)
        xs = np.clip(xs, xi.lo, xi.hi).astype(np.float32)
        with np.errstate(all="ignore"):
            y = f(xs, w)
        assert np.all(iv.contains(y))
    # an Interval output of one run feeds another
    iv2 = _iv(lambda v: fnp.exp(v), Interval(iv.lo, iv.hi, iv.value))
    assert np.all(iv2.contains(np.exp(f64(iv.value))))


def test_empty_arrays():
    e = np.zeros((0, 3), np.float32)
    iv = _iv(lambda a: fnp.sum(a, axis=0), e)
    assert iv.shape == (3,) and np.all(iv.contains(0.0))
    iv = _iv(lambda a, b: fnp.matmul(a, b), e, np.ones((3, 2), np.float32))
    assert iv.shape == (0, 2)
    iv = _iv(lambda a, b: fnp.matmul(a, b), np.ones((2, 0), np.float32),
             np.ones((0, 4), np.float32))
    assert iv.shape == (2, 4) and np.all(iv.contains(0.0))
    for f in (fnp.exp, lambda a: fnp.cumsum(a, axis=0), lambda a: fnp.add(a, a),
              lambda a: fnp.mean(a, axis=1), lambda a: fnp.astype(a, np.float16)):
        iv = _iv(f, e)
        assert iv.lo.size == 0 or np.all(np.isnan(iv.value) | iv.contains(iv.value))


def test_nan_and_inf_inputs_give_defined_results():
    x = np.array([np.nan, np.inf, -np.inf, 1.0, 0.0], np.float32)
    ops = [fnp.exp, fnp.log, fnp.sqrt, fnp.tanh, fnp.sin, fnp.cos, fnp.arctan, fnp.erf,
           fnp.abs, fnp.square, fnp.reciprocal, lambda a: fnp.add(a, 1.0),
           lambda a: fnp.multiply(a, 0.0), lambda a: fnp.divide(1.0, a),
           lambda a: fnp.maximum(a, 0.0), lambda a: fnp.where(fnp.greater(a, 0), a, 0.0),
           lambda a: fnp.astype(a, np.float16),
           lambda a: fnp.sum(a),
           lambda a: fnp.cumsum(a), lambda a: fnn.softmax(a),
           lambda a: fnp.matmul(a[None, :], a[:, None])]
    n_elementwise = len(ops) - 4
    for i, f in enumerate(ops):
        iv = _iv(f, x)
        v = f64(iv.value)
        # NaN bounds make no claim (an input NaN may reach the output); finite inputs
        # that do not mix with the NaN/inf ones get finite claims that hold
        nanb = np.isnan(iv.lo) | np.isnan(iv.hi)
        assert np.all(np.isnan(v) | nanb | iv.contains(v)), (f, iv.lo, iv.hi, v)
        if i < n_elementwise:
            assert not np.any(nanb[3:]) and np.all(iv.contains(v)[3:]), (f, iv.lo, iv.hi, v)
    iv = _iv(fnp.exp, x)
    assert np.isnan(iv.lo[0]) and np.isnan(iv.hi[0])             # NaN in, no claim out
    assert iv.hi[1] == np.inf and iv.lo[2] <= 0.0 <= iv.hi[2]
    iv = _iv(lambda a: fnp.sum(a), np.array([1.0, np.inf], np.float16))
    assert iv.hi == np.inf and iv.contains(np.inf)


def test_mismatched_shapes_raise_numpys_error():
    a, b = np.ones((2, 3)), np.ones((4,))
    with pytest.raises(ValueError):
        fpx.interval(lambda a, b: fnp.add(a, b))(a, b)
    with pytest.raises(ValueError):
        fpx.interval(lambda a, b: fnp.matmul(a, b))(np.ones((2, 3)), np.ones((4, 5)))
    with pytest.raises(ValueError):
        fpx.interval(lambda a, b: fnp.where(fnp.greater(a, 0), a, b))(a, b)


I8, U8, I64 = np.int8, np.uint8, np.int64
INTEGER_CASES = {
    # name: (f, input, overflows) -- NumPy's integer arithmetic wraps around
    "neg INT_MIN": (lambda a: -a, np.array([-128, 5], I8), [True, False]),
    "abs INT_MIN": (lambda a: fnp.abs(a), np.array([-128, -5], I8), [True, False]),
    "square": (lambda a: a * a, np.array([20, 3], I8), [True, False]),
    "add": (lambda a: a + a, np.array([100, 3], I8), [True, False]),
    "unsigned sub": (lambda a: a - U8(5), np.array([100, 3], U8), [False, True]),
    "pow": (lambda a: a ** 3, np.array([10, 2], I8), [True, False]),
    "cast out of range": (lambda a: a.astype(I8), np.array([300.0, 5.5], np.float32), [True, False]),
    "cast negative to unsigned": (lambda a: a.astype(U8), np.array([-3.0, 5.5], np.float32),
                                  [True, False]),
    "int64 mul": (lambda a: a * I64(4), np.array([2 ** 62, 3], I64), [True, False]),
    "sum promotes": (lambda a: fnp.sum(a, axis=0), np.array([[100, 1], [100, 2]], I8),
                     [False, False]),
    "int64 sum": (lambda a: fnp.sum(a, axis=0), np.array([[2 ** 62, 5], [2 ** 62, 6]], I64),
                  [True, False]),
    "int64 prod": (lambda a: fnp.prod(a, axis=0), np.array([[2 ** 32, 5], [2 ** 32, 6]], I64),
                   [True, False]),
    "floor_divide INT_MIN": (lambda a: a // I8(-1), np.array([-128], I8), [True]),
    # (were +-1 step wide and unstable: the floor of a widened float64 quotient)
    "floor_divide": (lambda a: a // I8(3), np.array([7, -7, 6, -6, 0], I8), [False] * 5),
    "floor_divide by negative": (lambda a: a // I64(-7), np.array([100, -100, 2 ** 40], I64),
                                 [False] * 3),
    "remainder": (lambda a: a % I8(3), np.array([7, -7, 6, -6, 0], I8), [False] * 5),
    "remainder by negative": (lambda a: a % np.int32(-7), np.array([100, -100, 14], np.int32),
                              [False] * 3),
    "matmul": (lambda a: a @ a.T, np.array([[100, 100], [1, 2]], I8),
               [True, True, True, False]),
    "dot": (lambda a: fnp.dot(a, a), np.array([100, 100], np.int32), [False]),
    "einsum": (lambda a: fnp.einsum("ij,kj->ik", a, a), np.array([[3, -4], [5, 6]], np.int16),
               [False] * 4),
}


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_float_floor_divide_past_the_formats_range_is_infinite(dtype):
    """A quotient past the format's largest value is ±inf in NumPy (and ml_dtypes): the bound
    was the finite float64 floor, [3e41, 3e41] around the program's inf."""
    a = np.array([3e38, -3e38, 7.0], dtype)
    b = np.array([1e-3, 1e-3, 2.0], dtype)
    with np.errstate(all="ignore"):
        want = a // b
    iv = fpx.interval(lambda x, y: x // y)(a, b)
    assert np.array_equal(np.asarray(iv.value, np.float64), np.asarray(want, np.float64))
    assert iv.contains(want).all() and iv.hi[0] == np.inf and iv.lo[1] == -np.inf


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_floor_divide_is_the_exact_floor_where_every_execution_gives_it(dtype):
    """floor(a/b) of float points is the exact floor of the real quotient (1.0 // 0.1 = 9,
    though 1.0/0.1 rounds to 10): a zero-width bound where NumPy's floor_divide is exact
    (quotients below 2^(p-3)); larger quotients keep a widened bound. Both hold the program's
    value and the exact floor (fractions), and boxes hold floor_divide of their points."""
    from fractions import Fraction
    rng = np.random.default_rng(40)
    a = (rng.standard_normal(400) * 10.0 ** rng.integers(-3, 6, 400)).astype(dtype)
    b = (rng.standard_normal(400) * 10.0 ** rng.integers(-3, 3, 400)).astype(dtype)
    a[:3], b[:3] = [1.0, 6.0, -1.0], [0.1, 3.0, 0.1]
    a[3:6], b[3:6] = [2 ** 20, 2 ** 30, 1.0], [1.0, 1.0 / 3, 2 ** -12]   # large quotients
    b[b == 0] = 1
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    out = _iv(fnp.floor_divide, a, b)
    value = np.floor_divide(a, b)
    assert np.array_equal(np.asarray(out.value), value, equal_nan=True)
    fin = np.isfinite(value)
    exact = np.array([math.floor(Fraction(float(x)) / Fraction(float(y))) if f else 0
                      for x, y, f in zip(a, b, fin)], np.float64)
    assert out.contains(value)[fin].all() and out.contains(exact)[fin].all()
    p = {np.float16: 11, np.float32: 24, np.float64: 53}[dtype]
    small = fin & (np.abs(exact) < 2.0 ** (p - 3) * 0.99)
    assert np.all(out.lo[small] == exact[small]) and np.all(out.hi[small] == exact[small])
    assert out.lo[0] == out.hi[0] == (10.0 if dtype == np.float16 else 9.0)   # 1.0 // 0.1
    assert out.lo[1] == out.hi[1] == 2.0
    box = fpx.Interval.around(a, rel=2.0 ** -8)
    outb = _iv(fnp.floor_divide, box, b)
    for t in (0.0, 0.37, 1.0):
        pt = (box.lo + t * (box.hi - box.lo)).astype(dtype)
        q = np.floor_divide(pt, b)
        good = np.isfinite(q) & (pt >= box.lo) & (pt <= box.hi)
        assert outb.contains(q)[good].all()


@pytest.mark.parametrize("axis", [-1, 0, None])
def test_sort_and_argsort_bounds_hold_every_point_of_the_box(axis):
    """sort: the k-th smallest over a box is [k-th smallest lo, k-th smallest hi]; argsort:
    an index is certain (zero width) only where the order is decided for every point, else
    [0, n - 1] and unstable. Checked against np.sort/np.argsort of points sampled in boxes
    that overlap, of exact ties (uncertain: implementations break them differently) and of
    a NaN (its row unknown)."""
    rng = np.random.default_rng(41)
    x = rng.standard_normal((5, 9)).astype(np.float32)
    x[1, 3] = x[1, 5]                                        # a tie
    rad = np.where(rng.random(x.shape) < 0.3, 0.5, 1e-4)
    xi = fpx.Interval(x - rad, x + rad, x)
    srt = fpx.interval(lambda h: fnp.sort(h, axis=axis))(xi)
    arg = fpx.interval(lambda h: fnp.argsort(h, axis=axis))(xi)
    assert np.array_equal(np.asarray(srt.value), np.sort(x, axis=axis))
    assert np.array_equal(np.asarray(arg.value), np.argsort(x, axis=axis, kind="stable"))
    for t in range(40):
        p = (xi.lo + rng.random(x.shape) * (xi.hi - xi.lo)).astype(np.float32)
        p = np.clip(p, xi.lo, xi.hi).astype(np.float32)
        p = np.where((p < xi.lo) | (p > xi.hi), x, p)
        assert srt.contains(np.sort(p, axis=axis)).all()
        assert arg.contains(np.argsort(p, axis=axis, kind="stable")).all()
    certain = np.asarray(arg.lo) == np.asarray(arg.hi)
    assert certain.any() and not certain.all()
    un = np.zeros(certain.shape, bool) if arg.unstable is None else np.asarray(arg.unstable)
    assert np.array_equal(un, ~certain)
    if axis == -1:   # the tie's two positions are undecided even for the exact points
        pt = fpx.interval(lambda h: fnp.argsort(h, axis=-1))(x)
        pos = np.nonzero(np.isin(np.asarray(pt.value)[1], [3, 5]))[0]
        assert np.all(pt.lo[1, pos] == 0) and np.all(pt.hi[1, pos] == 8)
        assert np.sum(pt.lo != pt.hi) == 2
        xn = x.copy()
        xn[2, 4] = np.nan
        out = fpx.interval(lambda h: fnp.sort(h, axis=-1))(xn)
        # (a NaN end inside: no claim; where the value is defined the result says -inf)
        assert not np.isfinite(out.lo[2]).any() and np.isfinite(out.lo[[0, 1, 3, 4]]).all()


@pytest.mark.parametrize("case", list(INTEGER_CASES))
def test_integer_results_are_exact_and_wrap_around_gives_the_dtypes_range(case):
    """Integer arithmetic is exact: the bounds are the integer result itself (no widening),
    and where NumPy wraps around (or converts out of range) the dtype's whole range, with an
    "overflow" event -- never a bound that misses the program's own value."""
    f, x, overflows = INTEGER_CASES[case]
    interp, (iv,) = run_interval(lambda a: (f(a),), (x,), {})
    value = np.asarray(iv.value).ravel()
    lo, hi = np.asarray(iv.lo).ravel(), np.asarray(iv.hi).ravel()
    info = np.iinfo(value.dtype)
    for v, l, h, over in zip(value, lo, hi, overflows):
        assert int(l) <= int(v) <= int(h)
        if over:
            assert (l, h) == (float(info.min), float(info.max))
        else:
            assert l == h == float(v)
    assert any(e.kind == "overflow" for e in interp.events) == any(overflows)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_prod_holds_every_order_through_underflow_and_overflow(dtype):
    """A product in any order: a partial product that underflows (1e-30·1e-30 in float32) and
    is then multiplied by large factors errs far beyond d·|product|, and one that overflows
    (1e30·1e30) gives ±inf whatever the exact product; the bound held neither (NumPy's own
    -0.0 outside [-4.0000005, -3.9999995]). Every order of every case, multiplied in the
    format one product at a time, lies in the bound."""
    import itertools
    big = float(ml_dtypes.finfo(dtype).max) ** 0.6
    cases = [[1 / big, 1 / big, big, big, -4.0], [1 / big, 3.0, big, 0.5, -4.0],
             [1.5, -2.0, 0.75, 3.0, 1.25], [0.0, big, big, 2.0, 1.0]]
    for case in cases:
        x = np.array(case, np.float64).astype(dtype)
        iv = fpx.interval(lambda a: fnp.prod(a))(x)
        for order in itertools.permutations(range(x.size)):
            p = x[order[0]]
            with np.errstate(all="ignore"):
                for i in order[1:]:
                    p = (p * x[i]).astype(dtype)
            got = float(p)
            assert iv.contains(got) or (np.isnan(got) and iv.unstable is not None
                                        and bool(np.all(iv.unstable))), (case, order, got)


def test_bool_arithmetic_is_the_truth_of_its_exact_value():
    """NumPy's bool add is a logical or (True + True is True), its product an and: the bound of
    a bool result is the truth of the exact value's range, never 2."""
    p, q = np.array([True, True, False, False]), np.array([True, False, True, False])
    box = fpx.Interval(np.array([0.0, 1.0, 0.0, 0.0]), np.array([1.0, 1.0, 0.0, 1.0]),
                       np.array([True, True, False, False]))
    for f in (lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a + b * a):
        iv = fpx.interval(f)(p, q)
        assert np.array_equal(iv.lo, f(p, q)) and np.array_equal(iv.hi, f(p, q))
        iv = fpx.interval(f)(box, q)
        for a in (np.array([False, True, False, False]), np.array([True, True, False, True])):
            assert iv.contains(f(a, q)).all()
        assert iv.contains(iv.value).all() and np.all(iv.hi <= 1)


def test_integer_sums_past_2_53_contain_the_exact_result():
    """int64 sums and prefix sums of terms past float64's 2^53 (each an interval of its two
    neighbouring float64s): the bound holds the exact integer, and the value is NumPy's."""
    x = np.array([2 ** 53 + 1, 1, 1, 1, -3, 2 ** 60 + 7], I64)
    exact = [sum(int(t) for t in x[:k + 1]) for k in range(x.size)]
    for f, want in ((lambda a: fnp.sum(a), [exact[-1]]), (lambda a: fnp.cumsum(a), exact)):
        iv = fpx.interval(f)(x)
        for l, h, e in zip(np.ravel(iv.lo), np.ravel(iv.hi), want):
            assert int(l) <= e <= int(h)
        assert [int(v) for v in np.ravel(iv.value)] == want


def test_integer_matmul_past_2_53_contains_the_exact_result():
    """int64 products past float64's 2^53: the bound holds the exact integer (Python ints),
    as narrow as float64 can say; a bool matmul is NumPy's any-of-ands, undecided where an
    operand interval is."""
    rng = np.random.default_rng(41)
    a = rng.integers(-2 ** 28, 2 ** 28, (3, 8), dtype=I64)
    b = rng.integers(-2 ** 28, 2 ** 28, (8, 2), dtype=I64)
    iv = fpx.interval(lambda a, b: a @ b)(a, b)
    exact = [[sum(int(a[i, k]) * int(b[k, j]) for k in range(8)) for j in range(2)]
             for i in range(3)]
    for i in range(3):
        for j in range(2):
            assert int(iv.lo[i, j]) <= exact[i][j] <= int(iv.hi[i, j])
            assert iv.value[i, j] == exact[i][j]
            assert iv.hi[i, j] - iv.lo[i, j] <= 2.0 ** -40 * abs(exact[i][j]) + 2
    p = np.array([[True, False], [False, False]])
    q = np.array([[True, False], [True, True]])
    iv = fpx.interval(lambda a, b: a @ b)(p, q)
    assert np.array_equal(iv.lo, p @ q) and np.array_equal(iv.hi, p @ q)
    pi = fpx.Interval(np.array([[0.0, 0], [0, 0]]), np.array([[1.0, 0], [0, 0]]), p)
    iv = fpx.interval(lambda a, b: a @ b)(pi, q)
    assert (iv.lo[0, 0], iv.hi[0, 0]) == (0, 1) and iv.unstable[0, 0]
    assert not iv.unstable[1].any() and np.all(iv.hi[1] == 0)


def test_an_input_interval_must_contain_its_value():
    """The value is what the program runs on: outside [lo, hi] it contradicts the interval
    (a point interval's fast paths centre on the value, the others on [lo, hi]: an answer
    would depend on the path), so it is an error naming the elements; a real input x stored
    as v is the hull of both, which bounds both the exact result at x and the run on v."""
    rng = np.random.default_rng(40)
    x = rng.standard_normal((4, 64))
    v = (x * (1 + 1e-4)).astype(np.float32)
    with pytest.raises(ValueError, match="outside"):
        fpx.Interval(x, x, v)
    with pytest.raises(ValueError, match="shape"):
        fpx.Interval(x, x, v[:2])
    nan = v.astype(np.float64)
    nan[0, 0] = np.nan
    fpx.Interval(nan, nan, v)                # NaN compares false: no claim, no error
    w = rng.standard_normal((64, 8)).astype(np.float32)
    iv = fpx.interval(lambda a: a @ w)(fpx.Interval(np.minimum(x, v), np.maximum(x, v), v))
    assert iv.contains(x @ w.astype(np.float64)).all()
    assert iv.contains(v.astype(np.float64) @ w.astype(np.float64)).all()
    assert iv.contains(v @ w).all()


def test_an_intervals_midpoint_and_default_value_lie_inside_it():
    """``Interval(lo, hi)`` takes the midpoint as its value and ``.midpoint`` reports it: for
    huge finite ends (lo + hi)/2 overflowed to inf, outside a finite box; a point keeps its
    value (subnormals too), a half-line's midpoint is its infinite end, [-inf, inf]'s NaN."""
    big = np.finfo(np.float64).max
    lo = np.array([1e308, -big, 5e-324, 1.0, -np.inf, -np.inf, np.nan, -3.0])
    hi = np.array([1.5e308, -1e308, 5e-324, np.inf, 2.0, np.inf, 1.0, 1.0])
    iv = fpx.Interval(lo, hi)
    m = iv.midpoint
    assert np.array_equal(m, iv.value, equal_nan=True)
    assert np.all((lo[:5] <= m[:5]) & (m[:5] <= hi[:5]))
    assert m[0] == 1.25e308 and m[2] == 5e-324 and m[3] == np.inf and m[4] == -np.inf
    assert np.isnan(m[5]) and np.isnan(m[6]) and m[7] == -1.0
    assert fpx.Interval(2.0, 4.0).midpoint == 3.0


def test_cast_to_bool_is_certain_only_where_zero_is_outside_or_the_only_value():
    """astype(bool) of a box: True where 0 is outside it, False where it is exactly [0, 0],
    [0, 1] and unstable where it holds 0 and more; the program's own value inside."""
    x = np.array([0.5, -2.0, 0.0, 1e-3, -1e-3])
    lo = np.array([0.25, -3.0, 0.0, -1e-3, -1e-3])
    hi = np.array([1.0, -1.0, 0.0, 1e-3, 0.0])
    iv = fpx.interval(lambda a: fnp.astype(a, np.bool_))(fpx.Interval(lo, hi, x))
    assert iv.value.dtype == np.bool_ and iv.contains(iv.value).all()
    assert np.array_equal(iv.lo, [1, 1, 0, 0, 0]) and np.array_equal(iv.hi, [1, 1, 0, 1, 1])
    assert np.array_equal(iv.unstable, [False, False, False, True, True])
    pt = fpx.interval(lambda a: fnp.astype(a, np.bool_))(x)       # points: exact
    assert np.array_equal(pt.lo, x != 0) and np.array_equal(pt.hi, x != 0)
    assert pt.unstable is None or not np.any(pt.unstable)


def test_truth_of_float_intervals_holds_every_execution():
    """logical_and/or/xor/not, astype(bool) and where's condition on float intervals: an
    interval holding 0 and other values is possibly true and possibly false. The rules read
    ``lo != 0`` as
    "certainly true", so [-1, 1] about 0.0 was certainly true while the program's own value
    was False; and an interval with a NaN end (log of [-1, 2]: executions may give NaN) was
    certainly true or false by the NaN alone. Every point of the box, run by NumPy, is inside."""
    lo = np.array([-1.0, 0.5, 0.0, -0.0, -2.0, -1.0])
    hi = np.array([1.0, 3.0, 0.0, 0.0, -1.0, 0.0])
    x = np.array([0.0, 1.0, 0.0, -0.0, -1.5, -0.5])
    y = np.array([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    ops = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}
    for name, g in ops.items():
        iv = fpx.interval(lambda a, g=g: g(a, y))(fpx.Interval(lo, hi, x))
        assert iv.contains(iv.value).all(), name
        for t in (0.0, 0.5, 1.0, x):
            p = lo + t * (hi - lo) if not isinstance(t, np.ndarray) else t
            assert iv.contains(g(p, y)).all(), (name, t)
        assert np.array_equal(iv.unstable if iv.unstable is not None else np.zeros(6, bool),
                              [name != "or", False, False, False, False, name != "or"]), name
    for g in (np.logical_not, lambda a: a.astype(np.bool_), lambda a: np.where(a, 5.0, -5.0)):
        iv = fpx.interval(g)(fpx.Interval(lo, hi, x))
        for p in (lo, hi, x, (lo + hi) / 2):
            assert iv.contains(g(p)).all()
    box = fpx.Interval(np.array([-1.0, 0.5]), np.array([2.0, 3.0]), np.array([1.0, 1.0]))
    for g in (np.logical_not, lambda a: a.astype(np.bool_)):
        iv = fpx.interval(lambda a, g=g: g(np.log(a)))(box)
        assert iv.contains(iv.value).all() and np.all(iv.lo == 0) and np.all(iv.hi == 1)
    iv = fpx.interval(lambda a: np.where(np.log(a), 5.0, -5.0))(box)
    assert np.all(iv.lo <= -5) and np.all(iv.hi >= 5) and iv.unstable.all()


def test_max_min_under_concrete_branches_follow_the_operand_the_program_chose():
    """RENDER's observed-branch semantics: max/min take the bounds of the operand whose value
    the program returned (unsound where the other could win: the hull rule's max of the ends
    covers it)."""
    a = fpx.Interval(np.array([0.0, 5.0]), np.array([2.0, 6.0]), np.array([1.5, 5.5]))
    b = fpx.Interval(np.array([1.0, 0.0]), np.array([1.2, 1.0]), np.array([1.1, 0.5]))
    for name, f in (("max", fnp.maximum), ("min", fnp.minimum)):
        hull = fpx.interval(lambda p, q: f(p, q))(a, b)
        conc = fpx.interval(lambda p, q: f(p, q), branches="concrete")(a, b)
        pick_a = (a.value >= b.value) if name == "max" else (a.value <= b.value)
        assert np.array_equal(conc.lo, np.where(pick_a, a.lo, b.lo))
        assert np.array_equal(conc.hi, np.where(pick_a, a.hi, b.hi))
        g = np.maximum if name == "max" else np.minimum
        assert np.array_equal(hull.lo, g(a.lo, b.lo)) and np.array_equal(hull.hi, g(a.hi, b.hi))


# =============================================================================================
# 4. Regressions: soundness bugs the property tests found in fpx.interval
# =============================================================================================
def test_domain_edge_sqrt_log_make_no_claim_and_stay_undecided():
    # sqrt(x - y) with x, y equal up to round-off: the interval reaches below 0, so some
    # executions give NaN: unstable, an event, and where the program's value is defined the
    # result bounds the defined executions (lower end -inf, upper end sqrt(hi)), never NaN
    x = Interval(np.array([-1e-3, -1e-300, 1.0]), np.array([1.0, 4.0, 4.0]),
                 np.array([0.5, 0.0, 2.0], np.float32))
    interp, out = run_interval(fnp.sqrt, (x,), {})
    assert np.all(np.isneginf(out.lo[:2])) and np.all(out.contains(f64(out.value)))
    assert out.hi[0] >= 1.0 and out.hi[1] >= 2.0
    assert out.contains(np.sqrt(2.0))[2] and not np.isnan(out.lo[2])
    assert any(e.kind == "domain" for e in interp.events)
    assert out.unstable is not None and list(out.unstable) == [True, True, False]
    # a branch on such a value stays undecided: clamping the bound to the domain let where()
    # pick x although an execution with log(-5e-324) = NaN takes y (found by the DAG test)
    z = Interval(np.array([-5e-324]), np.array([5e-324]), np.array([0.0]))
    y = np.array([-0.22])
    iv = _iv(lambda z, y: fnp.where(fnp.greater(z, fnp.log(z)), z, y), z, y)
    with np.errstate(all="ignore"):
        other = np.where(np.array([-5e-324]) > np.log(np.array([-5e-324])), -5e-324, y)
    assert other[0] == y[0] and not (iv.lo[0] > y[0] or iv.hi[0] < y[0])


def test_accumulator_overflow_in_partial_sums():
    big = f64(F.get(BF16).max)
    # bf16 sum whose exact value is in range but whose partial sums overflow
    x = np.array([big, big, -big, -big * 0.5]).astype(BF16)
    seq = x[0]
    for t in x[1:]:
        seq = (seq + t).astype(BF16)
    assert np.isinf(f64(seq))
    iv = _iv(lambda a: fnp.sum(a), x)
    assert iv.contains(f64(seq)) and iv.contains(-0.5 * big) and iv.contains(iv.value)
    iv = _iv(lambda a: fnp.cumsum(a), x)
    assert np.all(iv.contains(np.cumsum(f64(x)))) and np.all(iv.contains(iv.value))
    # float64: [max, max, -max] is +inf in one order and max in another; no NaN bounds
    m = np.finfo(np.float64).max
    x = np.array([m, m, -m])
    iv = _iv(lambda a: fnp.sum(a), x)
    assert iv.contains(np.inf) and iv.contains(m) and not np.isnan(iv.lo)
    iv = _iv(lambda a: fnp.sum(a), Interval(np.array([m * (1 - 2 ** -52)]), np.array([m])))
    assert iv.contains(m) and not np.isnan(iv.lo)
    # float32 matmul whose products pass float32's range: the row may overflow
    A = np.array([[3e38, -3e38], [3e38, 3e38]], np.float32)
    B = np.array([[2.0], [2.0]], np.float32)
    iv = _iv(fnp.matmul, A, B)
    assert iv.contains(np.inf)[1, 0] and iv.contains(-np.inf)[1, 0]
    # this run's first row is inf - inf = NaN (an FMA or a wider accumulator gives inf or 0):
    # no claim there, rather than ±inf, which a later tanh would turn into [-1, 1]
    assert np.isnan(iv.value[0, 0]) and np.isnan(iv.lo[0, 0]) and np.isnan(iv.hi[0, 0])
    # float64 matmul with overflowing values: the bound is not NaN
    A = np.array([[m, m, -m]])
    iv = _iv(fnp.matmul, A, np.ones((3, 1)))
    assert iv.contains(np.inf)[0, 0] and iv.contains(m)[0, 0]


@pytest.mark.parametrize("op", ["matmul", "linear", "sum", "mean", "cumsum"])
@pytest.mark.parametrize("row", [[np.nan, 1, 2, 3], [np.inf, 1, 2, -np.inf]])
def test_a_nan_result_of_a_sum_or_gemm_is_no_claim_downstream(op, row):
    """A NaN operand, or inf and -inf in one sum, make every execution of that sum NaN: the
    bound there is NaN (no claim), so tanh after it does not claim [-1, 1] for a NaN result;
    the other row keeps a finite bound."""
    import fpx.nn as fnn
    x = np.array([row, [1, 2, 3, 4]], np.float32)
    w = np.full((4, 2), 0.5, np.float32)
    body = {"matmul": lambda a: a @ w, "linear": lambda a: fnn.linear(a, w.T),
            "sum": lambda a: fnp.sum(a, axis=1), "mean": lambda a: fnp.mean(a, axis=1),
            "cumsum": lambda a: fnp.cumsum(a, axis=1)[:, -1]}[op]
    with np.errstate(all="ignore"):
        iv = _iv(lambda a: fnp.tanh(body(a)), x)
    assert np.isnan(iv.value[0]).all() and np.isnan(iv.lo[0]).all() and np.isnan(iv.hi[0]).all()
    assert np.isfinite(iv.lo[1]).all() and iv.contains(iv.value)[1].all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_zero_times_inf_and_zero_over_zero_are_no_claim_downstream(dtype):
    """0·inf and 0/0 of points are NaN in every execution: NaN bounds there (the corners'
    [-inf, inf] would become tanh's [-1, 1]); a box product reaching a 0·inf corner whose
    program value is defined stays unbounded."""
    a = np.array([0.0, 0.0, 2.0], dtype)
    b = np.array([np.inf, 0.0, 3.0], dtype)
    with np.errstate(all="ignore"):
        for f in (lambda a, b: fnp.tanh(a * b), lambda a, b: fnp.tanh(a / b * 1)):
            iv = _iv(f, a, b)
            nan = np.isnan(np.asarray(iv.value, np.float64))
            assert np.isnan(iv.lo[nan]).all() and np.isnan(iv.hi[nan]).all()
            assert np.isfinite(iv.lo[~nan]).all() and iv.contains(iv.value)[~nan].all()
        iv = _iv(lambda a, b: a * b, Interval(np.array([0.0]), np.array([1.0]), np.array([0.5])),
                 Interval(np.array([1.0]), np.array([np.inf]), np.array([1.0])))
    assert iv.lo[0] == -np.inf and iv.hi[0] == np.inf


_SPECIALS = [0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 3e38, 1e-40]
_FMA = fpx.core.PRIMITIVES["fma"]


@pytest.mark.parametrize("op", ["add", "multiply", "divide", "floor_divide", "remainder", "power",
                                "maximum", "prod", "sum", "matmul", "fma"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_nan_value_of_special_operands_has_a_nan_bound(op, dtype):
    """Over every pair of special operands (±0, ±inf, NaN, huge, subnormal), an element
    whose program value is NaN has NaN bounds (no claim): never a range a later op could
    turn finite."""
    a, b = (g.ravel().astype(dtype) for g in np.meshgrid(_SPECIALS, _SPECIALS))
    f = {"prod": lambda a, b: fnp.prod(fnp.stack([a, b]), axis=0),
         "sum": lambda a, b: fnp.sum(fnp.stack([a, b]), axis=0),
         "matmul": lambda a, b: fnp.matmul(fnp.stack([a, b], axis=1), np.ones((2, 1), dtype)),
         "fma": lambda a, b: _FMA.bind(a, b, np.ones_like(a))}
    with np.errstate(all="ignore"):
        iv = _iv(f.get(op, getattr(fnp, op)), a, b)
    nan = np.isnan(np.asarray(iv.value, np.float64))
    assert nan.any()
    assert np.isnan(iv.lo[nan]).all() and np.isnan(iv.hi[nan]).all()


def test_matmul_small_radius_term_not_computed_in_float16():
    # float16 @ float32 with an interval operand: c·|a| was formed in float16 and underflowed
    n0 = Interval(np.array([[5.684691429138184]]), np.array([[5.684694290161133]]),
                  np.array([[5.684692859649658]], np.float32))
    n1 = np.array([[-0.004245758056640625]], np.float16)
    iv = _iv(lambda a, b: fnp.matmul(b, a), n0, n1)
    at_hi = np.float32(np.float32(n1[0, 0]) * np.float32(5.684694290161133))
    assert iv.contains(f64(at_hi))[0, 0] and iv.contains(f64(iv.value))[0, 0]


def test_an_own_output_becomes_the_value_and_outside_the_bound_is_reported():
    """``run_interval(..., own=...)`` (a framework's own run: torch's, the GPU's): its outputs
    become the values; one inside the bound changes nothing else; one outside widens the bound
    there, marks it unstable, counts it in an event and warns; a NaN own output is consistent
    with a NaN bound (no claim) and with an unstable element whose end is infinite (NaN
    possible), not with a finite bound."""
    x = np.array([1.0, 2.0, 0.0, np.inf, 3.0], np.float32)

    def f(a):
        return fnp.sqrt(fnp.subtract(a, np.float32(0.5)))
    _, plain = run_interval(f, (x,), {})
    assert plain.unstable is None and np.isnan(plain.lo[2])           # sqrt(-0.5): NaN
    inside = plain.value.copy()
    _, same = run_interval(f, (x,), {}, own=lambda: inside)
    assert same.value is inside and np.array_equal(same.lo, plain.lo, equal_nan=True)
    assert same.unstable is None and not same.events
    own = plain.value.copy()
    own[0] = np.float32(7.0)                     # outside [lo, hi]
    own[4] = np.float32(np.nan)                  # NaN where fpx claims a number
    with pytest.warns(fpx.OutsideBoundWarning, match="at 2 of 5 elements"):
        _, out = run_interval(f, (x,), {}, own=lambda: own)
    assert out.value is own and out.contains(own)[0] and np.isnan(out.lo[4])
    assert out.unstable.tolist() == [True, False, False, False, True]
    assert [(e.kind, e.count) for e in out.events] == [("own-value-outside-bound", 2)]
    assert np.array_equal(out.lo[1:4], plain.lo[1:4], equal_nan=True)
    xin = Interval(np.array([-1.0]), np.array([1.0]), np.array([0.5], np.float32))
    _, wide = run_interval(fnp.sqrt, (xin,), {})
    assert wide.unstable[0] and np.isneginf(wide.lo[0])              # NaN possible there
    _, nan_own = run_interval(fnp.sqrt, (xin,), {}, own=lambda: np.array([np.nan], np.float32))
    assert np.isnan(nan_own.value[0]) and np.isneginf(nan_own.lo[0])
    assert [e.kind for e in nan_own.events] == ["domain"]
    with pytest.raises(fpx.FpxError, match="shape"):
        run_interval(f, (x,), {}, own=lambda: own[:3])


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, ml_dtypes.bfloat16],
                         ids=["f64", "f32", "f16", "bf16"])
def test_sigmoid_rule_holds_exact_values_and_executions_within_its_decomposition(dtype):
    """``fpx.nn.sigmoid``'s rule (the decomposition's steps on the box's ends, cut to [0, 1])
    against mpmath's σ over the box, the program's own value, σ computed in float64 and
    rounded once, and 1/(1 + exp(-x)) evaluated in float32 (an opmath execution, for the
    narrow formats) -- on points and boxes, across exp's overflow and underflow, at ±inf,
    ±0 and NaN; and no wider than the decomposition's bound."""
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(300) * 8, rng.uniform(-800, 800, 100),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, -88.7, -88.8, -11.1, -11.0, 17.0,
                         40.0, -745.0, -746.0, 1e-40, -1e-40]]).astype(dtype)
    x64 = x.astype(np.float64)
    mpmath.mp.prec = 113

    def exact(t):
        if np.isnan(t):
            return np.nan
        return 0.0 if t == -np.inf else 1.0 if t == np.inf else \
            float(1 / (1 + mpmath.exp(-mpmath.mpf(float(t)))))
    for r in (0.0, 0.25):
        xin = Interval(x64 - r, x64 + r, x) if r else x
        iv, dec = _iv(fnn.sigmoid, xin), _iv(fnn._sigmoid_decomp, xin)
        lo, hi = iv.lo, iv.hi
        nan = np.isnan(x64)
        assert np.isnan(lo[nan]).all() and np.isnan(hi[nan]).all()
        ok = ~nan
        assert (0 <= lo[ok]).all() and (hi[ok] <= 1).all()
        with np.errstate(all="ignore"):
            tight = ((lo >= dec.lo) & (hi <= dec.hi))[ok]
        assert tight.all()
        for t in (x64 - r, x64 + r):
            ex = np.array([exact(a) for a in t])
            assert ((lo <= ex) & (ex <= hi))[ok].all()
        with np.errstate(all="ignore"):
            once = (1 / (1 + np.exp(-x64))).astype(dtype).astype(np.float64)
            opmath = (np.float32(1) / (np.float32(1) + np.exp(-x.astype(np.float32))))
        execs = [iv.value.astype(np.float64), once]
        if np.dtype(dtype).itemsize <= 2:
            execs.append(opmath.astype(dtype).astype(np.float64))
        for y in execs:
            assert ((lo <= y) & (y <= hi))[ok].all()


def test_matmul_value_centred_bound_counts_the_output_rounding():
    from fpx.policy import OpPrecision
    pol = get_policy("numpy").replace(matmul=OpPrecision(compute="float32", accumulate="float32"))
    v = np.array([[1.0, 2.0 ** -11 + 2.0 ** -20]], np.float16)
    A = Interval(f64(v) - [[0.0, 2.0 ** -19]], f64(v) + [[0.0, 2.0 ** -19]], v)
    B = np.array([[1.0], [1.0]], np.float16)
    iv = _iv(fnp.matmul, A, B, policy=pol)
    assert iv.value[0, 0] == 1 + 2.0 ** -10            # the program rounded up ...
    other = np.float16(1.0 + (2.0 ** -11 - 2.0 ** -20))  # ... an input inside rounds down
    assert other == 1.0 and iv.contains(1.0)[0, 0]


def test_tf32_inputs_may_be_truncated_or_overflow():
    v = np.float32(1 + 2.0 ** -10 - 2.0 ** -23)
    A = np.array([[v]], np.float32)
    iv = _iv(fnp.matmul, A, A, policy="tf32")
    rz = f64(F.round(f64(A), "tf32", "rz"))
    assert iv.contains(rz @ rz)[0, 0] and iv.contains(f64(A) @ f64(A))[0, 0]
    # float32's largest value rounds to nearest tf32 as 2^128: inf
    x = np.array([[np.finfo(np.float32).max]], np.float32)
    y = np.array([[np.finfo(np.float32).tiny]], np.float32)
    assert np.isinf(f64(F.round(f64(x), "tf32")))
    iv = _iv(fnp.matmul, x, y, policy="tf32")
    assert iv.contains(np.inf)[0, 0] and iv.contains(4.0)[0, 0]


def test_possibly_nan_results_make_no_claim_and_stay_undecided():
    # sin/cos of an interval reaching an infinity: NaN in some execution -> no claim inside
    # the interpreter, never a finite bound that a comparison would trust; the result (whose
    # value is defined) says [-inf, inf], unstable
    u = Interval(np.array([-np.inf, 0.0]), np.array([np.inf, np.inf]), np.array([1.0, 2.0]))
    for f in (fnp.sin, fnp.cos):
        iv = _iv(f, u)
        assert np.all(np.isneginf(iv.lo) & np.isposinf(iv.hi)) and np.all(iv.unstable)
    # a comparison on such a value is undecided: where() hulls both sides, marked unstable
    iv = _iv(lambda x: fnp.where(fnp.greater(fnp.sin(x), 2.0), 1.0, -1.0), u)
    assert np.all(iv.contains(-1.0)) and np.all(iv.contains(1.0)) and np.all(iv.unstable)
    # an overflowing cast feeding sin (NaN in every execution) and a branch on it: the
    # program takes the "false" side; the bound must allow it
    x = np.array([-1.6508482005039624e+232])
    y = np.array([-0.03809199107807255])
    iv = _iv(lambda x, y: fnp.where(fnp.greater(fnp.sin(fnp.astype(x, np.float32)), x), x, y),
             x, y)
    assert iv.value[0] == y[0] and not (iv.lo[0] > y[0] or iv.hi[0] < y[0])
    # sums with infinite terms of both signs: [-inf, inf] (no NaN), undecided comparisons
    t = Interval(np.array([1.0, -np.inf]), np.array([np.inf, -1.0]), np.array([2.0, -2.0]))
    iv = _iv(lambda t: fnp.sum(t), t)
    assert iv.lo == -np.inf and iv.hi == np.inf
    iv = _iv(lambda t: fnp.where(fnp.greater(fnp.sum(t), 0.0), 1.0, -1.0), t)
    assert iv.contains(1.0) and iv.contains(-1.0)


def _cast_probes(src, dst):
    """Values of ``src`` next to ``dst``'s rounding boundaries: midpoints of dst's grid and
    their neighbours in src, the overflow threshold, the subnormal range, powers of two."""
    fs, fd = fmt(src), fmt(dst)
    rng = np.random.default_rng(3)
    base = np.concatenate([
        np.exp2(rng.uniform(fd.emin - fd.p, math.log2(fd.max), 300)),
        [1.0, 1 + 2.0 ** -8 + 2.0 ** -30, fd.max, fd.tiny, fd.smallest_subnormal,
         fd.smallest_subnormal / 2, fd.max * (1 + 2.0 ** -(fd.p + 1))]])
    grid = f64(F.round(base, fd, "rd"))
    mids = grid + f64(F.ulp(grid, fd)) / 2                    # ties of dst
    cand = np.concatenate([base, grid, mids])
    cand = np.concatenate([cand, -cand])
    x = f64(F.round(cand, fs))                                 # representable in src
    x = np.concatenate([x, f64(F.next_up(x, fs)), f64(F.next_down(x, fs))])
    x = x[np.isfinite(x)]
    return x.astype(src)


@pytest.mark.parametrize("src,dst", [(F64, F32), (F64, F16), (F64, BF16), (F32, F16),
                                     (F32, BF16), (F16, BF16), (BF16, F16), (F32, "tf32")])
def test_casts_contain_the_correctly_rounded_and_numpys_results(src, dst):
    x = _cast_probes(src, dst)
    for pol in ("numpy", "tf32"):
        iv = _iv(lambda a: fnp.astype(a, dst), x, policy=pol)
        v = f64(iv.value)
        nanb = np.isnan(iv.lo) | np.isnan(iv.hi)
        assert not np.any(nanb)
        assert np.all(iv.contains(v))                         # NumPy's own conversion
        assert np.all(iv.contains(f64(F.round(f64(x), fmt(dst)))))       # correctly rounded
        assert np.all(iv.contains(f64(x)) | ~np.isfinite(v))             # the exact value
        if dst == "tf32" and pol == "tf32":                   # the policy allows truncation
            assert np.all(iv.contains(f64(F.round(f64(x), "tf32", "rz"))))


def test_where_with_an_undecided_condition_is_not_a_point():
    # where() of two points under an undecided condition hulls them; that hull must not be
    # flagged a point (matmul then dropped its radius; found by the DAG test)
    x = Interval(np.array([[-1e-3, 1.0]]), np.array([[1e-3, 2.0]]),
                 np.array([[1e-4, 1.5]], np.float32))
    a = np.array([[65504.0, 1.0]], np.float32)
    b = np.array([[0.5, 7.0]], np.float32)
    w = np.array([[1.0], [1.0]], np.float32)
    for mode in ("midrad", "exact-center", "fast"):
        iv = _iv(lambda x: fnp.matmul(fnp.where(fnp.greater(x, 0), a, b), w), x, matmul=mode)
        assert iv.value[0, 0] == np.float32(65505.0)             # the program took a
        assert iv.contains(0.5 + 1.0)[0, 0] and iv.contains(65504.0 + 1.0)[0, 0], mode


# ---------------------------------------------------------------------------------------------
# fused kernels (kernels/interval.py) against their formulas
# ---------------------------------------------------------------------------------------------
def test_fused_bound_kernels_match_their_formulas():
    from fpx.kernels import interval as KI
    rng = np.random.default_rng(5)
    alo = rng.standard_normal((3, 4, 5))
    ahi = alo + rng.random((3, 4, 5))
    brow = rng.standard_normal(5)                 # a bias row
    bcol = rng.standard_normal((4, 1))            # expanded once
    R, A = 3 * 2.0 ** -24, 1e-45
    for b in (brow, bcol, 0.25, np.float32(2.0)):
        lo, hi = KI.add_bounds(alo, ahi, b, b, R, A, np.inf)
        elo, ehi = alo + b, ahi + b
        assert np.array_equal(lo, KI.down(elo, R, A, np.inf))
        assert np.array_equal(hi, KI.up(ehi, R, A, np.inf))
        assert (lo <= elo).all() and (hi >= ehi).all()
    # overflow past top and NaN pass-through
    lo, hi = KI.add_bounds(np.array([3e38, np.nan]), np.array([3e38, np.nan]), 1e38, 1e38, R, A,
                           3.4e38)
    assert np.isfinite(lo[0]) and np.isposinf(hi[0]) and np.isnan(lo[1]) and np.isnan(hi[1])
    # centre bounds: counts non-finite centres and NaN bounds
    c = np.array([1.0, np.inf, np.nan, -2.0], np.float32)
    lo, hi, n_bad = KI.center_bounds(c, np.array([0.5, 0.5, 0.5, np.nan]), 2.0, 0.0, np.inf)
    assert n_bad == 3 and lo[0] <= 0.0 and hi[0] >= 2.0
    # ... and infinite radii (a bfloat16 radius past its range): the rules step aside
    Rinf = np.array([0.5, np.inf, 0.5], np.float32)
    assert KI.center_bounds(np.ones(3, np.float32), Rinf, 1.0, 0.0, np.inf)[2] == 1
    assert KI.center_bounds(np.ones(3, np.float32), np.ones(3, np.float32), 1.0,
                            np.array([0.0, 0.0, np.inf]), np.inf)[2] == 1
    # 0-d operands give scalars, as a ufunc would
    assert np.ndim(KI.down(np.float64(1.0), R, A, np.inf)) == 0
    # outward: down and up in one pass, bit for bit, signed or not, written into given arrays
    # where they fit (zeros, subnormals, overflow past top, NaN, and per-element terms)
    x = np.concatenate([rng.standard_normal(40) * 10.0 ** rng.integers(-300, 39, 40),
                        [0.0, -0.0, 5e-324, -5e-324, 3.4e38, -3.4e38, np.inf, np.nan]])
    y = x + np.abs(rng.standard_normal(x.size))
    for Rk, Ak in ((R, A), (np.full(x.size, R), np.full(x.size, A))):
        for signed in (False, True):
            want = (KI.down(x, Rk, Ak, 3.4e38, signed=signed),
                    KI.up(y, Rk, Ak, 3.4e38, signed=signed))
            ol, oh = x.copy(), y.copy()
            got = KI.outward(ol, oh, Rk, Ak, 3.4e38, signed, (ol, oh))
            assert got[0] is ol and got[1] is oh
            for g, w in zip(got, want):
                assert np.array_equal(g, w, equal_nan=True)
                assert np.array_equal(np.signbit(g), np.signbit(w))
            got = KI.outward(x, y, Rk, Ak, 3.4e38, signed)
            assert all(np.array_equal(g, w, equal_nan=True) for g, w in zip(got, want))
    # any_differ: np.any(a != b) with an early exit (NaN differs from itself, as there)
    for a, b in ((np.zeros((3, 4)), np.zeros((3, 4))), (np.zeros(5), np.array([0, 0, 0, 0, 1.])),
                 (np.array([np.nan]), np.array([np.nan])), (np.zeros((4, 3)).T, np.ones((3, 4))),
                 (np.zeros(0), np.zeros(0))):
        assert KI.any_differ(a, b) == bool(np.any(a != b))
    # scale_up's Python-scalar path: the loop's result bit for bit
    xs = np.concatenate([10.0 ** np.random.default_rng(7).uniform(-320, 308, 500),
                         [0.0, -0.0, 5e-324, 2.0 ** -968, 2.0 ** -969, 1.7e308, np.inf, np.nan]])
    for f in (1.0, 1 + 2.0 ** -50, 3.0, 1e10):
        for a in (0.0, 5e-324, 1e-300, 1.0):
            got = np.array([KI.scale_up(float(x), f, a) for x in xs])
            assert np.array_equal(got, KI.scale_up(xs, f, a), equal_nan=True)


def test_ball_factors_are_upper_float32_bounds_without_subnormals():
    from fpx.kernels import interval as KI
    rng = np.random.default_rng(6)
    v = rng.standard_normal((64, 33)).astype(np.float32)
    v[0, :4] = 0.0
    lo = v.astype(np.float64) - rng.random((64, 33)) * 1e-3
    hi = v.astype(np.float64) + rng.random((64, 33)) * 1e-3
    lo[0, :2] = hi[0, :2] = 0.0                    # zero-width zeros (a ReLU's): L = 0 exactly
    lo[0, 2], hi[0, 2] = -1e-300, 1e-300           # tiny nonzero: the floor, not subnormal
    lo[0, 3], hi[0, 3] = -5e-324, 5e-324           # a float64 subnormal radius
    c2 = 1e-4
    rad, n_bad = KI.ball_radius(v, lo, hi)          # the box as a ball about v
    vv = v.astype(np.float64)
    r = np.maximum(vv - lo, hi - vv)
    assert n_bad == 0 and (rad >= r).all()
    L, (s_r, s_a, m) = KI.mm_left_ball(v, rad, c2)
    exact = c2 * (np.abs(vv) + r) + r
    assert L.dtype == np.float32 and (L.astype(np.float64) >= exact).all()
    floor = np.float32(KI.F32_FLOOR)
    assert L[0, 0] == 0 and L[0, 1] == 0            # (a float32 radius: the floor, rounded up)
    assert floor <= L[0, 2] <= 1.001 * floor and floor <= L[0, 3] <= 1.001 * floor
    nz = L[L != 0]
    # nonzero factors at least 2^-102: their products with weights >= 2^-24 stay normal
    assert (np.abs(nz) >= floor).all() and KI.F32_FLOOR * 2.0 ** -24 >= np.finfo(np.float32).tiny
    Bh, rb, _ = KI.mm_right_ball(v, rad)              # the right operand's factors alike
    assert (Bh.astype(np.float64) >= np.abs(vv) + r).all() and (rb.astype(np.float64) >= r).all()
    assert Bh[0, 0] == 0 and rb[0, 0] == 0
    assert floor <= Bh[0, 2] <= 1.001 * floor and floor <= rb[0, 3] <= 1.001 * floor
    assert (Bh[Bh != 0] >= floor).all() and (rb[rb != 0] >= floor).all()
    assert m >= np.max(np.abs(vv) + r)             # the overflow screen's magnitude
    lo[3, 3] = np.nan
    assert KI.ball_radius(v, lo, hi)[1] == 1        # a NaN bound: no ball
    rad[3, 3] = np.nan
    assert KI.mm_left_ball(v, rad, c2) is None       # a NaN factor: the caller's general path


def test_constant_times_interval_value_centred_bound_is_sound():
    """W @ im2col(x) (a convolution written weights-first): the value-centred radius
    |W| @ (2c(|v|+r) + r), checked against exact products and float32 runs in other orders."""
    rng = np.random.default_rng(8)
    W = rng.standard_normal((6, 40)).astype(np.float32)
    x = rng.standard_normal((3, 40, 9)).astype(np.float32)
    xi = fpx.Interval.around(x, rel=1e-4)           # a measured input: wide enough for the path
    out = fpx.interval(lambda h: W @ h)(xi)
    W64 = W.astype(np.float64)
    for t in np.linspace(0, 1, 5):
        h = xi.lo + t * (xi.hi - xi.lo)
        assert out.contains(np.einsum("ok,bkn->bon", W64, h)).all()
    assert out.contains(np.einsum("ok,bkn->bon", W64, np.where(W64.sum(0)[None, :, None] > 0,
                                                              xi.hi, xi.lo))).all()
    for order in (slice(None), slice(None, None, -1)):
        y = np.zeros((3, 6, 9), np.float32)
        for k in range(40)[order]:
            y = (y + W[None, :, k, None] * x[:, k, None, :]).astype(np.float32)
        assert out.contains(y).all()
    assert out.contains(W @ x).all() and np.array_equal(out.value, W @ x)


def _without(names, f, *args, table=None):
    """``fpx.interval(f)(*args)`` without the rules ``names`` (of ``table``, the interpreter's
    rules by default): their decompositions, or the box rule under a ball rule, run."""
    table = IntervalInterpreter.rules if table is None else table
    saved = {n: table.pop(n) for n in names}
    try:
        return fpx.interval(f)(*args)
    finally:
        table.update(saved)


def _decomposed_layers(f, *args):
    """``fpx.interval(f)(*args)`` without the linear/conv rule (their decompositions run)."""
    return _without(("linear", "conv"), f, *args)


def _weighted_rule_and_decomposition(f, x, xin, slack=1.0):
    """fpx.interval(f)(xin) with the conv/linear rule and with the decomposition: the rule's
    value is the program's, its bound holds the decomposition's value (another summation
    order), and it is never wider -- up to ``slack``, the documented price of a conv's
    bfloat16 radius (_conv_slack), and the price of a ball about the value: its distance from
    the rule's own float64 centre C, and a bias added to a ball counts the value's own rounding
    (u·|v| a side, u = 2^-24 for float32; the box rule does not)."""
    out, ref = fpx.interval(f)(xin), _decomposed_layers(f, xin)
    assert np.array_equal(out.value, f(x)) and out.contains(ref.value).all()
    v = f64(out.value)
    ball = 2 * (np.abs(f(x.astype(np.float64)) - v) + 2.0 ** -23 * np.abs(v))
    assert np.all(out.width <= (ref.width + ball) * (1 + 1e-6) * slack + 1e-30)
    return out, ref


def _conv_slack(ws, groups, point):
    """How much wider than the decomposition a float32 conv's bound may be where oneDNN runs
    it: the radius convolution's operands rounded up to bfloat16 and its output's rounding
    ((1 + 2^-7)^3), and for a point input the two channel blocks' error, at most
    (α_h + β_h)·T ≈ K_j·u32·T, next to the program's own α ≈ K·u32/2 (partial-sum form;
    2·K_j/K more where terms do not cancel, K_j = ⌈C_g/2⌉·taps)."""
    from fpx.kernels import conv as kconv
    if not kconv._torch():
        return 1.0
    cg, taps = ws[1], int(np.prod(ws[2:]))
    split = (1 + 2 * (cg - cg // 2) * taps / (cg * taps)) if point and cg >= 2 else 1.0
    return (1 + 2.0 ** -7) ** 3 * split


def _conv_input(x, point):
    """A conv test's input: the point itself, a wide box (value-centred bound) or a narrow
    one (a few ulps: the exact-centre path)."""
    if point is True:
        return x
    return fpx.Interval.around(x, rel=1e-3 if point is False else 2.0 ** -22)


@pytest.mark.parametrize("point", [True, False, "narrow"])
@pytest.mark.parametrize("groups,stride,bias,in_sum", [(1, 1, True, False), (2, 2, False, False), (1, 2, True, True)])
def test_conv_rule_without_float64_im2col_is_sound_and_as_tight(point, groups, stride, bias, in_sum):
    """fpx.nn.conv2d's own interval rule (value-centred for wide interval inputs, the exact
    centre conv(mid) for narrow ones, a centre of its own for points) against the
    decomposition, exact results and float32 runs."""
    import fpx.nn as fnn
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 4, 9, 9)).astype(np.float32)
    w = (rng.standard_normal((6, 4 // groups, 3, 3)) * 0.3).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32) if bias else None
    xin = _conv_input(x, point)

    def f(h):
        return fnn.conv(h, w, b, stride=stride, padding=1, groups=groups, bias_in_sum=in_sum)
    out, ref = _weighted_rule_and_decomposition(f, x, xin,
                                                _conv_slack(w.shape, groups, point is True))
    w64, b64 = w.astype(np.float64), None if b is None else b.astype(np.float64)
    lo = x.astype(np.float64) if point is True else xin.lo
    hi = x.astype(np.float64) if point is True else xin.hi
    for t in (0.0, 0.3, 1.0):
        assert out.contains(fnn.conv2d(lo + t * (hi - lo), w64, b64, stride=stride, padding=1,
                                       groups=groups)).all()
    # float32 executions with another accumulation order (reversed kernel taps)
    y_rev = fnn.conv2d(x[:, :, ::-1, ::-1].copy(), w[:, :, ::-1, ::-1].copy(), b,
                       stride=1, padding=1, groups=groups)[:, :, ::-1, ::-1][:, :, ::stride, ::stride]
    assert out.contains(y_rev).all()


@pytest.mark.parametrize("xs,ws,kw", [
    ((2, 4, 12), (6, 2, 3), dict(stride=2, padding=1, dilation=2, groups=2)),
    ((2, 3, 7, 8), (4, 3, 3, 3), dict(padding=((1, 0), (0, 2)), stride=(2, 1))),
    ((2, 4, 6, 7), (8, 1, 3, 3), dict(groups=4, padding="same")),
    ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), dict(padding=1)),
], ids=["1d-s2-d2-g2", "2d-asym-pads", "2d-depthwise", "3d"])
@pytest.mark.parametrize("point", [True, False, "narrow"])
def test_conv_rule_sound_on_every_conv_shape(xs, ws, kw, point):
    """The conv rule's point path (its own centre) and interval path on 1-d, 3-d, strided,
    dilated, grouped and asymmetrically padded convolutions: the exact results (with the
    float64 reference's own error bound around them), the im2col float32 run and the eager
    value inside, never wider than the decomposition up to the documented slack."""
    import fpx.nn as fnn
    rng = np.random.default_rng(12)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) * 0.4).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    xin = _conv_input(x, point)

    def f(h):
        return fnn.conv(h, w, b, bias_in_sum=True, **kw)
    out, _ = _weighted_rule_and_decomposition(f, x, xin, _conv_slack(ws, kw.get("groups", 1),
                                                                     point is True))
    w64, b64 = w.astype(np.float64), b.astype(np.float64)
    lo = x.astype(np.float64) if point is True else xin.lo
    hi = x.astype(np.float64) if point is True else xin.hi
    for t in (0.0, 0.5, 1.0):
        assert out.contains(fnn.conv(lo + t * (hi - lo), w64, b64, **kw)).all()
    im2col = fpx.trace(f, inline=True)(x).outputs      # the decomposition, in float32
    assert out.contains(im2col).all() and out.contains(f(x)).all()
    if point is True:
        # the float64 reference sums exact products: within γ_{K+1}(2^-53)·S of the exact
        # sum; the bound holds that whole neighbourhood
        ex = fnn.conv(x.astype(np.float64), w64, b64, **kw)
        S = fnn.conv(np.abs(x).astype(np.float64), np.abs(w64), np.abs(b64), **kw)
        K = int(np.prod(ws[1:])) + 1
        g = 2 * (K + 1) * 2.0 ** -53 * S
        assert np.all(out.lo <= ex - g) and np.all(ex + g <= out.hi)


@pytest.mark.parametrize("seed", [0, 1])
def test_batch_norm_of_a_ball_stays_a_ball_sound_and_as_tight_as_the_box(seed):
    """A convolution's ball through an inference batch norm (the ball rule): the program's
    value, other executions (reversed taps) and the exact results inside; within the box
    rule's width plus what the ball counts twice or by the triangle inequality: the value's
    own two roundings and the add's rounding on |x·α| + |β| (at most 2^-24·(6·|x·α| + 3·|β|)
    a side; the box rule rounds relative to |x·α + β|)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 8, 5, 5)).astype(np.float32)
    w = (rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32)
    m, v = (rng.standard_normal(8) * 0.1).astype(np.float32), rng.uniform(0.5, 1.5, 8)
    g, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    v = v.astype(np.float32)

    def f(h, w=w):
        return fnn.batch_norm(fnn.conv(h, w, None, padding=1), m, v, g, b, axis=1, eps=1e-5)
    out = fpx.interval(f)(x)
    box = _without(("batch_norm",), f, x, table=IntervalInterpreter.ball_rules)
    assert np.array_equal(out.value, f(x)) and np.array_equal(out.value, box.value)
    assert not np.array_equal(out.lo, box.lo)                  # the ball rule ran
    y_rev = f(x[:, :, ::-1, ::-1].copy(), w[:, :, ::-1, ::-1].copy())[:, :, ::-1, ::-1]
    exact = fnn.batch_norm(fnn.conv(f64(x), f64(w), None, padding=1), f64(m), f64(v), f64(g),
                           f64(b), axis=1, eps=1e-5)
    assert out.contains(y_rev).all() and out.contains(exact).all()
    alpha = f64(g) / np.sqrt(f64(v) + 1e-5)
    xa = np.abs(fnn.conv(f64(x), f64(w), None, padding=1) * alpha[:, None, None])
    beta = np.abs(f64(b) - f64(m) * alpha)[:, None, None]
    own = 2.0 ** -24 * (6 * xa + 3 * beta) * (1 + 1e-3)
    assert np.all(out.width <= box.width + 2 * own + 1e-30)


@pytest.mark.parametrize("op", ["add", "subtract"])
def test_sum_of_two_balls_stays_a_ball_sound_and_as_tight_as_the_box(op):
    """A residual sum of two layers' balls (the ball rule: radii r_x + r_y, the add's own
    rounding): the program's value, other executions (reversed sums) and the exact result
    inside; within the box rule's width plus what the ball counts by the triangle inequality
    (the value's own rounding, u·|v| a side, and the add's on the radii); ``x - x`` is still
    exactly 0 (the box rule)."""
    rng = np.random.default_rng(14)
    x = rng.standard_normal((16, 40)).astype(np.float32)
    w1, w2 = (rng.standard_normal((24, 40)).astype(np.float32) for _ in range(2))
    fop = getattr(fnp, op)

    def f(h):
        return fop(fnn.linear(h, w1), fnn.linear(h, w2))
    out = fpx.interval(f)(x)
    box = _without((op[:3],), f, x, table=IntervalInterpreter.ball_rules)
    assert np.array_equal(out.value, f(x)) and np.array_equal(out.value, box.value)
    assert not np.array_equal(out.lo, box.lo)                  # the ball rule ran
    rev = getattr(np, op)(x[:, ::-1] @ w1[:, ::-1].T, x[:, ::-1] @ w2[:, ::-1].T)
    exact = getattr(np, op)(f64(x) @ f64(w1).T, f64(x) @ f64(w2).T)
    assert out.contains(rev).all() and out.contains(exact).all()
    own = 2.0 ** -24 * (np.abs(f64(out.value)) + box.width) * 1.01
    assert np.all(out.width <= box.width + 2 * own + 1e-30)
    def twice(h):
        y = fnn.linear(h, w1)
        return fnp.subtract(y, y)
    assert np.all(fpx.interval(twice)(x).width == 0)


def test_batch_norm_of_a_ball_whose_product_may_overflow_is_unbounded():
    # x·α overflows float32 for a weight inside its interval while β brings the value back in
    # range: an execution gives inf, so the bound must reach it (the ball rule steps aside)
    a = np.ones((1, 2), np.float32)
    w = np.full((2, 2), 0.8e38, np.float32)
    mean, var = np.zeros(2, np.float32), np.ones(2, np.float32)
    bias = np.full(2, -3e38, np.float32)
    wt = fpx.Interval(np.full(2, 2.0), np.full(2, 2.2), np.full(2, 2.0, np.float32))
    with np.errstate(over="ignore"):
        iv = fpx.interval(lambda a, w, m, v, g, b: fnn.batch_norm(a @ w, m, v, g, b, eps=0.0,
                                                                  axis=1))(a, w, mean, var, wt,
                                                                           bias)
        run = (a @ w) * np.float32(2.2) + bias
    assert np.isinf(run).all() and iv.contains(run).all()


@pytest.mark.parametrize("dt", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64],
                         ids=["f32", "f16", "bf16", "f64"])
def test_batch_norm_rule_is_its_decomposition_in_one_pass(dt):
    """fpx.nn.batch_norm's rule (one fused pass) gives the mul and add rules' bounds bit for
    bit -- with a zero scale, NaN and inf bounds among the inputs -- and those hold points of
    the box evaluated exactly (float64 of the formula with mpmath-checked corners)."""
    import mpmath
    import fpx.nn as fnn

    rng = np.random.default_rng(40)
    x = (rng.standard_normal((2, 5, 3, 4)) * 3).astype(dt)
    m = rng.standard_normal(5).astype(dt)
    v = (np.abs(rng.standard_normal(5)) + 0.2).astype(dt)
    w = rng.standard_normal(5).astype(dt)
    w[2] = 0                                        # a zero scale: 0·inf stays defined
    b = rng.standard_normal(5).astype(dt)
    xi = fpx.Interval.around(x, rel=1e-2)
    lo, hi = xi.lo.copy(), xi.hi.copy()
    lo[0, 2, 0, 0], hi[1, 2, 1, 1] = -np.inf, np.inf
    lo[1, 3, 0, 0] = hi[1, 3, 0, 0] = np.nan
    xi = fpx.Interval(lo, hi, x)

    def f(h):
        return fnn.batch_norm(h, m, v, w, b)
    out = fpx.interval(f)(xi)
    ref = _without(("batch_norm",), f, xi)        # the decomposition: the mul and add rules
    assert np.array_equal(out.value, ref.value) and np.array_equal(out.value, f(x))
    assert np.array_equal(out.lo, ref.lo, equal_nan=True)
    assert np.array_equal(out.hi, ref.hi, equal_nan=True)
    assert np.isneginf(out.lo[1, 3, 0, 0]) and np.isposinf(out.hi[1, 3, 0, 0])
    # the value computed by the rule's compiled pass (float32/float64) is NumPy's bit for
    # bit, special values included
    xs = x.copy()
    xs.flat[:5] = [np.nan, np.inf, -np.inf, ml_dtypes.finfo(dt).smallest_subnormal, -0.0]
    assert np.array_equal(np.asarray(fpx.interval(f)(xs).value).view(np.uint8),
                          np.asarray(f(xs)).view(np.uint8))
    assert out.lo[0, 2, 0, 0] == -np.inf and out.hi[0, 2, 0, 0] == np.inf     # 0·[-inf, hi]
    # the exact real program at points of the box: (p - m)·w / sqrt(v + eps) + b, mpmath,
    # eps as the program's constant (rounded to the statistics' dtype)
    mpmath.mp.prec = 200
    eps = mpmath.mpf(float(np.asarray(1e-5, dt)))
    ok = np.isfinite(xi.lo) & np.isfinite(xi.hi)
    for t in (0.0, 0.5, 1.0):
        p = xi.lo + t * (xi.hi - xi.lo)
        for idx in np.ndindex(p.shape):
            if not ok[idx]:
                continue
            c = idx[1]
            e = (mpmath.mpf(float(p[idx])) - mpmath.mpf(float(m[c]))) * mpmath.mpf(float(w[c])) \
                / mpmath.sqrt(mpmath.mpf(float(v[c])) + eps) + mpmath.mpf(float(b[c]))
            assert out.lo[idx] <= e <= out.hi[idx]


def _max_of_others(a, ax):
    """max over the axis of every element but the one itself (the row's largest, or for the
    first position of the largest the second largest)."""
    first = np.argmax(a, axis=ax, keepdims=True)
    m1 = np.take_along_axis(a, first, axis=ax)
    pos = np.arange(a.shape[ax]).reshape([-1 if d == ax % a.ndim else 1 for d in range(a.ndim)])
    m2 = np.max(np.where(pos == first, -np.inf, a), axis=ax, keepdims=True)
    return np.where(pos == first, m2, m1)


def _softmax_bounds_reference(lo, hi, ax, n, r_s, a_s, k, r_e, a_e, r_d, a_d, dlow, dhigh):
    """The softmax rule's bound (``fpx.transforms.interval.nn._softmax``) in array operations:
    the reference its compiled row kernel ``KN.softmax_bounds`` is tested against."""
    LIBM, E64 = ivenc.LIBM64_ULPS, ivenc.E64
    with np.errstate(all="ignore"):
        # the subtraction x - max(x) rounds: an input perturbation of r_s |x - M| + a_s
        mlo = np.max(lo, axis=ax, keepdims=True)
        mhi = np.max(hi, axis=ax, keepdims=True)
        dist = np.maximum(np.abs(lo - mhi), np.abs(hi - mlo))
        pert = (r_s * dist + a_s) * (1 + k)
        xl, xh = lo - pert, hi + pert
        xl, xh = xl - k * np.abs(xl) - ivenc.TINY64, xh + k * np.abs(xh) + ivenc.TINY64
        # exact softmax range over the box, in float64 with outward error allowances
        m = np.max(xh, axis=ax, keepdims=True)
        dl, dh = xl - m, xh - m
        rho_l = (ivenc.LIBM64_ULPS + 4 + np.abs(dl)) * ivenc.E64
        rho_h = (ivenc.LIBM64_ULPS + 4 + np.abs(dh)) * ivenc.E64
        el = np.exp(dl) * (1 - rho_l)
        eh = np.exp(dh) * (1 + rho_h)
        g64 = ivenc.gamma(n + 2, 2.0 ** -53)
        sh = np.sum(eh, axis=ax, keepdims=True) * (1 + g64)
        sl = np.sum(el, axis=ax, keepdims=True) * (1 - g64)
        others_hi = (sh - eh) * (1 + 2 * ivenc.E64)
        others_lo = np.maximum((sl - el) * (1 - 2 * ivenc.E64), 0.0)
        plo = np.maximum(el / (el + others_hi) * (1 - 4 * ivenc.E64), 0.0)
        phi = eh / (eh + others_lo) * (1 + 4 * ivenc.E64)
        # where the exps underflow (a box far wider than float64's exp range), in the log
        # domain: the ratio is at least 1/(1 + (n-1)·exp(max_{k != j} dh_k - dl_j)) and, the
        # denominator being at least its largest term, at most
        # exp(dh_j - max(dh_j, max_{k != j} dl_k))
        t = _max_of_others(dh, ax) - dl
        # (t = -inf: no other element, n = 1; exp's error factor would make 0·inf NaN)
        et = np.where(t == -np.inf, 0.0,
                      np.exp(t) * (1 + (LIBM + 4 + np.abs(t)) * E64) + ivenc.TINY64)
        plo = np.where(el == 0, np.maximum(1.0 / (1.0 + (n - 1) * et * (1 + 2 * ivenc.E64))
                                           * (1 - 4 * ivenc.E64), 0.0), plo)
        t = dh - np.maximum(dh, _max_of_others(dl, ax))
        phi = np.where(eh + others_lo == 0,
                       np.exp(t) * (1 + (LIBM + 4 + np.abs(t)) * E64) + ivenc.TINY64, phi)
        phi = np.minimum(phi, 1.0)
        # the evaluation's errors: exp (relative r_e, absolute a_e), the sum (gamma, beta:
        # dlow/dhigh), the division; the exact sum is >= 1 (the max's own term is exp(0))
        nl = plo * (1 - r_e) - a_e
        nh = phi * (1 + r_e) + a_e
        qlo = np.where(nl >= 0, nl / dhigh, nl / dlow)
        qhi = nh / dlow
        ylo = (qlo * (1 - r_d) - a_d) * (1 - k) - np.abs(qlo) * k - ivenc.TINY64
        yhi = (qhi * (1 + r_d) + a_d) * (1 + k) + ivenc.TINY64
    return ylo, yhi


def test_softmax_rule_kernel_matches_its_array_form_and_is_sound():
    """The softmax rule's compiled row loop against the same bound in array operations, and
    against exact softmaxes of points in the box (mpmath)."""
    import mpmath

    rng = np.random.default_rng(10)
    x = (rng.standard_normal((3, 4, 9)) * 4).astype(np.float32)
    xi = fpx.Interval.around(x, rel=1e-3)
    for ax in (-1, 1):
        out = fpx.interval(lambda h: fpx.nn.softmax(h, axis=ax))(xi)
        lo, hi = xi.lo, xi.hi
        n = x.shape[ax]
        args = (1e-7, 1e-45, 16 * 2.0 ** -52, 2e-7, 1e-45, 4e-7, 2e-45, 0.99, 1.01)
        klo, khi = KN.softmax_bounds((np.moveaxis(lo, ax, -1), np.moveaxis(hi, ax, -1)), *args,
                                     ivenc.gamma(n + 2, 2.0 ** -53), ivenc.LIBM64_ULPS)
        nlo, nhi = _softmax_bounds_reference(np.moveaxis(lo, ax, -1), np.moveaxis(hi, ax, -1),
                                             -1, n, *args)
        assert np.allclose(klo, nlo, rtol=1e-12, atol=1e-300)
        assert np.allclose(khi, nhi, rtol=1e-12, atol=1e-300)
        for t in (0.0, 0.5, 1.0):
            p = np.moveaxis(lo + t * (hi - lo), ax, -1).reshape(-1, n)
            exact = np.array([[float(mpmath.exp(v) / mpmath.fsum(mpmath.exp(w) for w in row))
                               for v in row] for row in p])
            exact = np.moveaxis(exact.reshape(np.moveaxis(lo, ax, -1).shape), -1, ax)
            assert out.contains(exact).all()
        assert out.contains(fpx.nn.softmax(x, axis=ax)).all()


def test_softmax_and_layer_norm_kernels_read_a_ball_as_its_box():
    """The softmax and layer-norm kernels take a ball (v, r) as they take its box (the
    ball's own ``lo``/``hi``, formed a block of rows at a time inside the kernel): softmax
    the same bounds bit for bit, layer norm the same to its rounding slack (it reads the
    radius as is); a layer norm's ball out is the box's ball about the program's value, or
    the box itself where that ball would be lopsided."""
    from fpx.kernels import interval as KI
    rng = np.random.default_rng(12)
    v = (rng.standard_normal((600, 33)) * 3).astype(np.float32)
    r = (np.abs(rng.standard_normal(v.shape)) * 1e-3).astype(np.float32)
    lo, hi, _ = KI.center_bounds(v, r, 1.0, 0.0, np.inf)
    args = (1e-7, 1e-45, 16 * 2.0 ** -52, 2e-7, 1e-45, 4e-7, 2e-45, 0.99, 1.01,
            ivenc.gamma(35, 2.0 ** -53), ivenc.LIBM64_ULPS)
    for got, want in zip(KN.softmax_bounds((v, r, np.inf), *args),
                         KN.softmax_bounds((lo, hi), *args)):
        assert np.array_equal(got, want)
    w, b = rng.standard_normal(33), rng.standard_normal(33)
    consts = (1e-5, 1e-5, 1e-5, 1e-5, 1e-6, 1e-7, 1e-7, 1e-45, 3.4e38, 1e37)
    box = KN.layer_norm_bounds(v, (lo, hi), w, b, *consts)
    for got, want in zip(KN.layer_norm_bounds(v, (r,), w, b, *consts)[:2], box[:2]):
        np.testing.assert_allclose(got, want, rtol=1e-9)      # (r read as is: a hair tighter)
    assert box[2] == 0
    vy = ((box[0] + box[1]) / 2).astype(np.float32)          # a value inside every box
    rad, none, n_bad = KN.layer_norm_bounds(v, (r,), w, b, *consts, vy)
    assert none is None and n_bad == 0 and rad.dtype == np.float32
    assert np.all(rad >= np.maximum(vy - box[0], box[1] - vy))
    vy[0, 0] = box[0][0, 0]                                  # at an end: lopsided
    assert KN.layer_norm_bounds(v, (r,), w, b, *consts, vy)[0] is None


@pytest.mark.parametrize("scale", [1e3, 1e6, 1e30, 1e37])
def test_softmax_of_boxes_past_exps_range_stays_finite_and_sound(scale):
    """Boxes so wide that every shifted exp underflows (x·1e30 known to 1e-7): the ratios were
    0/0, NaN bounds where softmax lies in [0, 1]. The log-domain bounds keep them finite and
    tight where one element dominates; the kernel and the array form agree; exact softmaxes
    (mpmath) of points in the box and the program's runs are inside."""
    import mpmath

    rng = np.random.default_rng(11)
    x = (rng.standard_normal((4, 5)) * np.float32(scale)).astype(np.float32)
    x[3] = x[3, 0]                                     # a row of equal values
    xi = fpx.Interval.around(x, rel=1e-7)
    out = fpx.interval(lambda h: fpx.nn.softmax(h, axis=-1))(xi)
    assert not np.isnan(out.lo).any() and not np.isnan(out.hi).any()
    assert np.all(out.lo >= -1e-30) and np.all(out.hi <= 1 + 1e-5)   # [0, 1] and rounding
    args = (1e-7, 1e-45, 16 * 2.0 ** -52, 2e-7, 1e-45, 4e-7, 2e-45, 0.99, 1.01)
    g = ivenc.gamma(7, 2.0 ** -53)
    klo, khi = KN.softmax_bounds((xi.lo, xi.hi), *args, g, ivenc.LIBM64_ULPS)
    nlo, nhi = _softmax_bounds_reference(xi.lo, xi.hi, -1, 5, *args)
    assert np.allclose(klo, nlo, rtol=1e-12, atol=1e-300)
    assert np.allclose(khi, nhi, rtol=1e-12, atol=1e-300)
    mpmath.mp.prec = 80
    for t in (0.0, 0.3, 1.0):
        p = xi.lo + t * (xi.hi - xi.lo)
        exact = np.array([[float(mpmath.exp(mpmath.mpf(v)) / mpmath.fsum(
            mpmath.exp(mpmath.mpf(w)) for w in row)) for v in row] for row in p])
        assert out.contains(exact).all()
        assert out.contains(fpx.nn.softmax(p.astype(np.float32), axis=-1)).all()
    dominant = np.argmax(x[:3], axis=-1)
    if scale >= 1e6:           # one element dominates each of the first rows: a tight bound
        assert np.all(out.lo[np.arange(3), dominant] > 0.99)
        others = np.ones((3, 5), bool)
        others[np.arange(3), dominant] = False
        assert np.all(out.hi[:3][others] < 1e-6)


def test_softmax_of_one_element_rows_with_wide_boxes_is_about_one():
    """A one-element row is exactly 1 whatever the box; where the box's shifted exp
    underflowed, the log-domain lower bound took exp(-inf) times an infinite error factor:
    0·inf, a NaN lower bound (found by a random stress run: float16 rows of -4e4 ± 4e3)."""

    x = np.array([[-4.282e+04], [-5.043e+04], [3.0]], np.float16)
    lo, hi = np.array([[-44905.4], [-52893.1], [2.0]]), np.array([[-40726.6], [-47970.9], [4.0]])
    out = fpx.interval(lambda h: fnn.softmax(h, axis=-1))(fpx.Interval(lo, hi, x))
    assert np.all(out.lo > 0.99) and np.all(out.hi < 1.01) and out.contains(1.0).all()
    args = (2.0 ** -11, 2.0 ** -24, 16 * 2.0 ** -52, 2e-7, 1e-45, 4e-7, 2e-45, 0.99, 1.01)
    klo, khi = KN.softmax_bounds((lo, hi), *args, ivenc.gamma(3, 2.0 ** -53),
                                 ivenc.LIBM64_ULPS)
    nlo, nhi = _softmax_bounds_reference(lo, hi, -1, 1, *args)
    assert not np.isnan(klo).any() and np.allclose(klo, nlo, rtol=1e-12)
    assert np.allclose(khi, nhi, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("scale", [1.0, 1e3, 1e30])
def test_log_softmax_bounds_are_never_nan_and_at_most_about_zero(scale, dtype):
    """log_softmax of boxes whose shifted exps overflow: exp's bound had a lower end of
    -2^-149 (its absolute error term), the sum of such exps a negative one, and the log of
    that NaN -- a NaN upper bound for every element. exp's bound is now cut to [0, inf) and
    log_softmax's upper bound to that of log_softmax(0) (~0: every execution's result is
    <= 0 up to exp(0)'s own error). Sound against mpmath and the program on points in the box
    and torch's fused kernel."""
    import mpmath
    rng = np.random.default_rng(12)
    big = float(np.finfo(dtype).max) / 4
    x = np.clip(rng.standard_normal((4, 6)) * scale, -big, big).astype(dtype)
    xi = fpx.Interval.around(x, rel=1e-3 if dtype == np.float16 else 1e-7)
    out = fpx.interval(lambda h: fnn.log_softmax(h, axis=-1))(xi)
    assert not np.isnan(out.lo).any() and not np.isnan(out.hi).any()
    assert np.all(out.hi <= 2.0 ** -8)
    es = fpx.interval(lambda h: fnp.exp(h - fnp.max(h, axis=-1, keepdims=True)))(xi)
    assert np.all(es.lo >= 0)
    mpmath.mp.prec = 80
    for t in (0.0, 0.5, 1.0):
        p = (xi.lo + t * (xi.hi - xi.lo)).astype(dtype).astype(np.float64)
        exact = np.array([[float(mpmath.mpf(v) - mpmath.log(mpmath.fsum(
            mpmath.exp(mpmath.mpf(w) - mpmath.mpf(max(row))) for w in row)) - mpmath.mpf(max(row)))
            for v in row] for row in p])
        assert out.contains(exact).all()
        assert out.contains(fnn.log_softmax(p.astype(dtype), axis=-1)).all()
    try:
        import torch
    except ImportError:
        return
    if dtype == np.float32:
        assert out.contains(torch.log_softmax(torch.from_numpy(x), -1).numpy()).all()


@pytest.mark.parametrize("mode", ["midrad", "fast"])
def test_interval_times_interval_value_centred_is_sound(mode):
    """Both operands intervals (attention's Q·Kᵀ): the fused value-centred path against exact
    products of corner and inner points and float32 runs in another order."""
    rng = np.random.default_rng(13)
    q = rng.standard_normal((3, 5, 16)).astype(np.float32)
    k = rng.standard_normal((3, 16, 7)).astype(np.float32)
    qi, ki = fpx.Interval.around(q, rel=1e-3), fpx.Interval.around(k, rel=1e-3)
    out = fpx.interval(lambda a, b: a @ b, matmul=mode)(qi, ki)
    assert np.array_equal(out.value, q @ k)
    for s, t in ((0.0, 1.0), (1.0, 0.0), (0.5, 0.5), (0.0, 0.0), (1.0, 1.0)):
        a = qi.lo + s * (qi.hi - qi.lo)
        b = ki.lo + t * (ki.hi - ki.lo)
        assert out.contains(a @ b).all()
    rev = np.zeros((3, 5, 7), np.float32)
    for kk in range(15, -1, -1):
        rev = (rev + q[:, :, kk, None] * k[:, None, kk, :]).astype(np.float32)
    assert out.contains(rev).all()
    ref = fpx.interval(lambda a, b: a @ b, matmul="exact-center")(qi, ki)
    assert np.median(out.width / ref.width) < 1.5


@pytest.mark.parametrize("point", [True, False])
@pytest.mark.parametrize("bias,in_sum", [(False, False), (True, False), (True, True)])
def test_linear_rule_is_sound_and_as_tight_as_the_decomposition(point, bias, in_sum):
    """fpx.nn.linear's own interval rule (no float64 [x | 1] concatenation) against the
    decomposition, exact results and float32 runs in another order."""
    import fpx.nn as fnn
    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 6, 40)).astype(np.float32)
    w = (rng.standard_normal((9, 40)) * 0.2).astype(np.float32)
    b = rng.standard_normal(9).astype(np.float32) if bias else None
    xin = x if point else fpx.Interval.around(x, rel=1e-3)

    def f(h):
        return fnn.linear(h, w, b, bias_in_sum=in_sum)
    out, ref = _weighted_rule_and_decomposition(f, x, xin)
    w64, b64 = w.astype(np.float64), None if b is None else b.astype(np.float64)
    lo = x.astype(np.float64) if point else xin.lo
    hi = x.astype(np.float64) if point else xin.hi
    for t in (0.0, 0.4, 1.0):
        y = (lo + t * (hi - lo)) @ w64.T + (0 if b64 is None else b64)
        assert out.contains(y).all()
    rev = np.zeros((2, 6, 9), np.float32) if b is None or not in_sum else \
        np.broadcast_to(b, (2, 6, 9)).astype(np.float32)
    for kk in range(39, -1, -1):
        rev = (rev + x[..., kk, None] * w[None, None, :, kk]).astype(np.float32)
    if b is not None and not in_sum:
        rev = (rev + b).astype(np.float32)
    assert out.contains(rev).all()


@pytest.mark.parametrize("op", ["linear", "conv"])
@pytest.mark.parametrize("special", ["x-nan", "x-inf", "w-nan", "w-inf", "w-huge"])
@pytest.mark.parametrize("point", [True, False])
def test_weighted_rules_of_non_finite_or_overflowing_operands(op, special, point):
    """NaN, inf and overflowing operands of the conv/linear rules: the program's value,
    non-finite bounds where the special operand reaches, finite ones that hold both the
    program's and the decomposition's execution; sizes large enough for the bfloat16 radius
    where it runs."""
    import fpx.nn as fnn
    rng = np.random.default_rng(16)
    if op == "linear":
        x = rng.standard_normal((64, 256)).astype(np.float32)
        w = (rng.standard_normal((160, 256)) * 0.05).astype(np.float32)

        def f(h):
            return fnn.linear(h, w)
    else:
        x = rng.standard_normal((2, 16, 12, 12)).astype(np.float32)
        w = (rng.standard_normal((16, 16, 3, 3)) * 0.05).astype(np.float32)

        def f(h):
            return fnn.conv(h, w, padding=1)
    target = x if special.startswith("x") else w
    target.reshape(-1)[5] = {"nan": np.nan, "inf": np.inf, "huge": 3e38}[special[2:]]
    xin = x if point else fpx.Interval.around(x, rel=1e-3)
    with np.errstate(all="ignore"):
        out, ref = fpx.interval(f)(xin), _decomposed_layers(f, xin)
    with np.errstate(all="ignore"):
        assert np.array_equal(out.value, f(x), equal_nan=True)        # the program's own
    fin = np.isfinite(out.lo) & np.isfinite(out.hi)
    assert fin.any() and not fin.all()
    for y in (out.value, ref.value):     # two executions, in two orders
        ok = fin & np.isfinite(y)
        assert out.contains(y)[ok].all()
    assert not np.isfinite(out.value).all()     # the special operand reached the output


def test_where_keeps_a_sides_instability_only_where_that_side_may_be_taken():
    # T5's position buckets: a floor of a log is unstable (its value sits on an integer) at an
    # element where where() certainly takes the other, exact side: the result is stable there
    t = np.array([10.0, 30.0, 1e3], np.float32)
    g = lambda t: np.floor(np.log(t * 1e6) / np.log(10.0))           # noqa: E731
    f = lambda t: np.where(t < 20, t, g(t))                          # noqa: E731
    assert list(fpx.interval(g)(t).unstable) == [True, False, True]
    iv = fpx.interval(f)(t)
    assert list(iv.unstable) == [False, False, True] and iv.contains(f(t)).all()


def test_where_with_a_decided_uniform_mask_passes_that_side_through():
    """where(mask, x, y) with every condition decided one way: the chosen side's bounds as
    they are (broadcast views), and later rules do not write into them."""
    rng = np.random.default_rng(15)
    y = rng.standard_normal((4, 6)).astype(np.float32)
    yi = fpx.Interval.around(y, rel=1e-3)
    mask = np.zeros((4, 1), bool)

    def f(h):
        s = fnp.exp(h)
        z = fnp.where(mask, fnp.zeros_like(s), s)
        return z, z + np.float32(1.0), s
    z, z1, s = fpx.interval(f)(yi)
    assert np.array_equal(z.lo, s.lo) and np.array_equal(z.hi, s.hi)
    assert np.array_equal(z.value, s.value)
    assert (z1.lo > z.lo).all()                   # the add made its own arrays
    assert z.contains(np.exp(yi.lo)).all() and z.contains(np.exp(yi.hi)).all()
    t = fpx.interval(lambda h: fnp.where(~mask, h, -h))(yi)
    assert np.array_equal(t.lo, yi.lo) and np.array_equal(t.hi, yi.hi)


# -- the layer-norm rule -------------------------------------------------------------------------
def _ln_executions(x, w, b, eps, rng):
    """float32 layer norms of the rows of x by the algorithms in use: two-pass with the sums
    sequential, reversed and pairwise; Welford's updating mean/variance; PyTorch's own kernel;
    each finished as (x - μ)/s·w + b and as PyTorch's x·(rstd·w) + (b - μ·rstd·w). (The
    unstable one-pass E[x²] - μ² is not among them: the rule does not cover it.)"""
    import torch
    f32 = np.float32
    n = x.shape[-1]
    outs = [torch.nn.functional.layer_norm(torch.from_numpy(x), (n,), torch.from_numpy(w),
                                           torch.from_numpy(b), eps).numpy()]

    def seq(vals):
        s = f32(0)
        for t in vals:
            s = f32(s + t)
        return s

    def pairwise(vals):
        if len(vals) == 1:
            return f32(vals[0])
        h = len(vals) // 2
        return f32(pairwise(vals[:h]) + pairwise(vals[h:]))

    e32 = f32(eps)
    for row_algo in ("seq", "rev", "pair", "welford"):
        y = np.empty_like(x)
        for i, row in enumerate(x):
            if row_algo == "welford":
                mu, m2 = f32(0), f32(0)
                for k, t in enumerate(row, 1):
                    dlt = f32(t - mu)
                    mu = f32(mu + f32(dlt / f32(k)))
                    m2 = f32(m2 + f32(dlt * f32(t - mu)))
                var = f32(m2 / f32(n))
            else:
                summ = {"seq": seq, "rev": lambda v: seq(v[::-1]), "pair": pairwise}[row_algo]
                mu = f32(summ(row) / f32(n))
                d = (row - mu).astype(f32)
                var = f32(summ((d * d).astype(f32)) / f32(n))
            s = np.sqrt(f32(var + e32))
            if i % 2:
                y[i] = ((row - mu) / s * w + b).astype(f32)
            else:
                rstd = f32(f32(1) / s)
                scale = (rstd * w).astype(f32)
                y[i] = (row * scale + (b - mu * scale).astype(f32)).astype(f32)
        outs.append(y)
    return outs


@pytest.mark.parametrize("kind", ["point", "interval", "shifted"])
def test_layer_norm_rule_is_sound(kind):
    """The layer-norm rule against exact layer norms of points in the box (mpmath: corners,
    random points) and float32 executions by every algorithm in use (two-pass in three
    orders, Welford, PyTorch's kernel; both output spellings); "shifted" rows have a mean 300x
    their spread (an ill-conditioned variance, where Welford errs most)."""
    rng = np.random.default_rng(21)
    n = 48
    x = rng.standard_normal((6, n))
    if kind == "shifted":
        x = 300.0 + x
    x = x.astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    eps = 1e-5
    xin = x if kind != "interval" else fpx.Interval.around(x, rel=1e-4)
    out = fpx.interval(lambda h: fnn.layer_norm(h, n, w, b, eps))(xin)
    assert np.all(np.isfinite(out.lo)) and np.all(np.isfinite(out.hi))
    for y in _ln_executions(x, w, b, eps, rng):
        assert out.contains(y).all()
    lo, hi = (x.astype(np.float64),) * 2 if kind != "interval" else (xin.lo, xin.hi)
    mpmath.mp.prec = 200
    pts = [lo, hi, lo + rng.random(lo.shape) * (hi - lo)]
    for p in pts:
        for i, row in enumerate(p):
            r = [mpmath.mpf(float(t)) for t in row]
            mu = mpmath.fsum(r) / n
            var = mpmath.fsum((t - mu) ** 2 for t in r) / n
            s = mpmath.sqrt(var + mpmath.mpf(eps))
            ex = np.array([float((t - mu) / s * mpmath.mpf(float(ww)) + mpmath.mpf(float(bb)))
                           for t, ww, bb in zip(r, w, b)])
            assert ((out.lo[i] <= ex) & (ex <= out.hi[i])).all()


@pytest.mark.parametrize("n,eps,radius", [(8, 1e-5, 1.0), (48, 1e-5, 3.0), (48, 1e-2, 0.5),
                                           (256, 1e-5, 40.0)])
def test_layer_norm_rule_on_wide_boxes_stays_within_the_a_priori_range(n, eps, radius):
    """A box wider than the rows' spread (the second layer norm of a transformer layer): the
    variance may be near 0 in the box, yet |x_i - μ| <= sqrt((n-1)·var) keeps every output
    within b ± 1.1·sqrt(n-1)·|w| (the error terms' share) -- before, 1/sqrt(eps) scaled the box's width (x1000). Sound
    against mpmath and float32 executions at the box's centre, corners, random points and
    the extreme points (one-hot rows, near-constant rows with variance ~eps)."""
    rng = np.random.default_rng(25)
    x = (rng.standard_normal((4, n)) * 0.3).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    xin = fpx.Interval(x.astype(np.float64) - radius, x.astype(np.float64) + radius, value=x)
    out = fpx.interval(lambda h: fnn.layer_norm(h, n, w, b, eps))(xin)
    assert np.all(np.isfinite(out.lo)) and np.all(np.isfinite(out.hi))
    reach = np.sqrt(n - 1) * np.abs(w.astype(np.float64))
    assert np.all(out.hi - b <= 1.1 * reach + 1e-3) and np.all(b - out.lo <= 1.1 * reach + 1e-3)
    lo, hi = xin.lo, xin.hi
    pts = [x.astype(np.float64), lo, hi] + [lo + rng.random(lo.shape) * (hi - lo)
                                            for _ in range(2)]
    for scale in (radius, 1e-3, np.sqrt(eps)):                 # one-hot rows in the box
        p = x.astype(np.float64).copy()
        for i in range(p.shape[0]):
            p[i] = p[i].mean()
            p[i, i % n] += min(scale, radius) * (1 if i % 2 else -1) * 0.9
        pts.append(np.clip(p, lo, hi))
    mpmath.mp.prec = 120
    for p in pts:
        p32 = np.clip(p.astype(np.float32), lo.astype(np.float32), hi.astype(np.float32))
        p32 = np.where((p32 < lo) | (p32 > hi), x, p32)           # float32 points in the box
        for y in _ln_executions(p32, w, b, eps, rng):
            assert out.contains(y).all()
        for i, row in enumerate(p32.astype(np.float64)):
            r = [mpmath.mpf(float(t)) for t in row]
            mu = mpmath.fsum(r) / n
            s = mpmath.sqrt(mpmath.fsum((t - mu) ** 2 for t in r) / n + mpmath.mpf(eps))
            ex = np.array([float((t - mu) / s * mpmath.mpf(float(ww)) + mpmath.mpf(float(bb)))
                           for t, ww, bb in zip(r, w, b)])
            assert ((out.lo[i] <= ex) & (ex <= out.hi[i])).all()


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("radius", [0.01, 0.3, 3.0])
def test_rms_norm_bound_stays_within_its_a_priori_range(dt, radius):
    """rms_norm's bound: the decomposition's, intersected with |y_i| <= ~sqrt(n)·|w_i| (the
    decomposition alone reached |x|/sqrt(eps)·|w| on boxes wider than the rows' spread).
    Sound against mpmath and executions at the centre, corners, random and one-hot points."""
    rng = np.random.default_rng(26)
    n = 64
    x = (rng.standard_normal((4, n)) * 0.3).astype(dt)
    w = rng.standard_normal(n).astype(dt)
    xin = fpx.Interval(x.astype(np.float64) - radius, x.astype(np.float64) + radius, value=x)
    f = lambda h: fnn.rms_norm(h, w, eps=1e-5)          # noqa: E731
    out = fpx.interval(f)(xin)
    assert np.all(np.isfinite(out.lo)) and np.all(np.isfinite(out.hi))
    reach = np.sqrt(n) * np.abs(w.astype(np.float64))
    assert np.all(np.maximum(out.hi, -out.lo) <= 1.05 * reach + 1e-3)
    lo, hi = xin.lo, xin.hi
    pts = [x.astype(np.float64), lo, hi, lo + rng.random(lo.shape) * (hi - lo)]
    for scale in (radius, 1e-3):   # the points of the box nearest to one-hot rows
        p = np.zeros_like(lo)
        for i in range(p.shape[0]):
            p[i, i] = (x[i, i] + scale * 0.9) * (1 if i % 2 else -1)
        pts.append(np.clip(p, lo, hi))
    mpmath.mp.prec = 100
    for p in pts:
        pd = p.astype(dt)
        pd = np.where((pd < lo) | (pd > hi), x, pd)
        assert out.contains(f(pd)).all()                         # the program itself
        seq = np.zeros(pd.shape[0], dt)                          # the squares summed in
        for k in range(n - 1, -1, -1):                           # reverse, one at a time
            seq = (seq + pd[:, k] * pd[:, k]).astype(dt)
        den = np.sqrt((seq / dt(n)).astype(dt) + dt(1e-5)).astype(dt)
        assert out.contains(((pd / den[:, None]).astype(dt) * w).astype(dt)).all()
        for i, row in enumerate(pd.astype(np.float64)):
            r = [mpmath.mpf(float(t)) for t in row]
            s = mpmath.sqrt(mpmath.fsum(t * t for t in r) / n + mpmath.mpf(1e-5))
            ex = np.array([float(t / s * mpmath.mpf(float(ww))) for t, ww in zip(r, w)])
            assert ((out.lo[i] <= ex) & (ex <= out.hi[i])).all()
    if radius == 3.0:      # the range is what bounds it here: the decomposition alone is wider
        ref = _without(("rms_norm",), f, xin)
        assert np.median(ref.width) > 10 * np.median(out.width)


@pytest.mark.parametrize("point", [True, False])
def test_layer_norm_rule_is_tighter_than_or_close_to_the_decomposition(point):
    """The rule couples mean and variance (the decomposition's intervals do not): no wider
    than the decomposition for interval inputs, and within 2x for points: there the mean's
    error dominates, which the decomposition's sum bounds through its partial sums (about
    half of γ_N·mean|x| for rows that cancel) while the rule keeps γ_{N+2}·mean|x|, as it
    also covers updating (Welford) means and variances the decomposition does not model."""

    rng = np.random.default_rng(22)
    x = rng.standard_normal((32, 256)).astype(np.float32)
    w = rng.standard_normal(256).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    xin = x if point else fpx.Interval.around(x, rel=1e-4)

    def f(h):
        return fnn.layer_norm(h, 256, w, b)
    out = fpx.interval(f)(xin)
    ref = _without(("layer_norm",), f, xin)
    assert np.array_equal(out.value, ref.value)
    ratio = np.median(out.width) / np.median(ref.width)
    assert ratio <= (2.0 if point else 1.0)


def test_layer_norm_rule_falls_back_where_it_does_not_apply():
    """Where an intermediate may overflow, rows too long for the format's γ, non-trailing
    axes with a weight, or non-finite inputs, the decomposition's bound comes out (sound:
    contains the program's value) -- never a bound that ignores the overflow."""

    rng = np.random.default_rng(23)
    big = np.array([[-3.3e-13, -3.1e38], [4.6e-3, 2.0]], np.float32)   # d*d overflows
    out = fpx.interval(lambda h: fnn.layer_norm(h, axis=0))(big)
    with np.errstate(all="ignore"):
        assert out.contains(fnn.layer_norm(big, axis=0)).all()
    x16 = rng.standard_normal((2, 4096)).astype(np.float16)
    out = fpx.interval(lambda h: fnn.layer_norm(h, 4096))(x16)
    assert out.contains(out.value).all()
    x = rng.standard_normal((5, 6)).astype(np.float32)
    w = rng.standard_normal((5, 1)).astype(np.float32)
    out = fpx.interval(lambda h: fnn.layer_norm(h, axis=0, weight=w))(x)
    assert out.contains(out.value).all()
    w_rows = rng.standard_normal((5, 6)).astype(np.float32)     # a weight per row
    out = fpx.interval(lambda h: fnn.layer_norm(h, 6, weight=w_rows))(x)
    assert out.contains(fnn.layer_norm(x, 6, weight=w_rows)).all()
    xn = x.copy()
    xn[1, 2] = np.nan
    out = fpx.interval(lambda h: fnn.layer_norm(h, 6))(xn)
    assert np.isnan(out.value[1]).all() and out.contains(out.value)[0].all()
    # a finite value in a box with an infinite or NaN end (the kernel's own check)
    for end in (np.inf, np.nan):
        lo, hi = x.astype(np.float64) - 1e-3, x.astype(np.float64) + 1e-3
        hi[3, 4] = end
        out = fpx.interval(lambda h: fnn.layer_norm(h, 6))(fpx.Interval(lo, hi, x))
        ref = _without(("layer_norm",), lambda h: fnn.layer_norm(h, 6), fpx.Interval(lo, hi, x))
        assert np.array_equal(out.lo, ref.lo, equal_nan=True)
        assert np.array_equal(out.hi, ref.hi, equal_nan=True)
        assert out.contains(out.value)[[0, 1, 2, 4]].all()


def test_kernels_on_permuted_and_per_channel_layouts_match_contiguous_copies():
    """The kernels' two copy-free layouts -- operands that share one permutation of a dense
    block (attention's head split, a transposed Kᵀ) and per-channel operands (1, C, 1, 1) --
    give bit-identical results to the same kernels on C-contiguous copies, outputs included
    in the operands' layout."""
    from fpx.kernels import interval as KI
    rng = np.random.default_rng(24)
    base = rng.standard_normal((4, 6, 5, 3))
    v = np.transpose(base.astype(np.float32), (2, 0, 3, 1))           # a permuted view
    lo = np.transpose(base - 1e-3, (2, 0, 3, 1))
    hi = np.transpose(base + 2e-3, (2, 0, 3, 1))
    vc, loc, hic = (np.ascontiguousarray(a) for a in (v, lo, hi))
    r, rc = KI.ball_radius(v, lo, hi)[0], KI.ball_radius(vc, loc, hic)[0]
    assert np.array_equal(r, rc) and not r.flags.c_contiguous          # same layout as inputs
    L, st = KI.mm_left_ball(v, r, 1e-5)
    Lc, stc = KI.mm_left_ball(vc, rc, 1e-5)
    assert np.array_equal(L, Lc) and st[2] == stc[2]
    for a, b in zip(KI.mm_right_ball(v, r)[:2], KI.mm_right_ball(vc, rc)[:2]):
        assert np.array_equal(a, b) and not a.flags.c_contiguous
    for a, b in zip(KI.center_bounds(v, lo, 1.0, 0.0, np.inf)[:2],
                    KI.center_bounds(vc, loc, 1.0, 0.0, np.inf)[:2]):
        assert np.array_equal(a, b)
    x = rng.standard_normal((2, 5, 4, 3))
    sc = rng.standard_normal((1, 5, 1, 1)).astype(np.float32)
    sh = rng.standard_normal((5, 1, 1))
    full_sc, full_sh = (np.ascontiguousarray(np.broadcast_to(a, x.shape)) for a in (sc, sh))
    for kern in (KI.mul_bounds, KI.add_bounds):
        got = kern(x, x + 1e-3, sc, sh + 1.0, 1e-7, 1e-45, np.inf)
        ref = kern(x, x + 1e-3, full_sc, full_sh + 1.0, 1e-7, 1e-45, np.inf)
        assert all(np.array_equal(a, b) for a, b in zip(got, ref))



def test_batch_norm_coefficients_are_reused_by_content_only():
    """The batch-norm rule keeps its per-channel (alpha, beta) intervals keyed by the
    statistics' bytes: a second call gives the same bounds bit for bit without recomputing
    them, statistics changed in place (a running variance updated) give the new bounds, and
    another policy its own."""
    import fpx.nn as fnn

    rng = np.random.default_rng(41)
    x = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    m, v = rng.standard_normal(5).astype(np.float32), (rng.random(5) + 0.5).astype(np.float32)
    w, b = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    xi = fpx.Interval.around(x, rel=1e-3)

    def f(h):
        return fnn.batch_norm(h, m, v, w, b)
    calls = []
    real = ivnn._nn.batch_norm_coefficients
    ivnn._BN_COEFFS.clear()
    ivnn._nn.batch_norm_coefficients = lambda *a: calls.append(1) or real(*a)
    try:
        first, second = fpx.interval(f)(xi), fpx.interval(f)(xi)
        assert len(calls) == 1
        assert all(np.array_equal(getattr(first, k), getattr(second, k))
                   for k in ("lo", "hi", "value"))
        v[2] *= 4                                   # in place: a new key
        third = fpx.interval(f)(xi)
        assert len(calls) == 2 and not np.array_equal(third.lo, first.lo)
        ivnn._BN_COEFFS.clear()
        fresh = fpx.interval(f)(xi)
        assert np.array_equal(fresh.lo, third.lo) and np.array_equal(fresh.hi, third.hi)
        fpx.interval(f, policy="cuda")(xi)
        assert len(calls) == 4                      # another policy: computed again
    finally:
        ivnn._nn.batch_norm_coefficients = real
    assert third.contains(f(x)).all()


def test_left_factor_of_an_infinite_radius_is_never_small():
    """A ball factor of an infinite radius is never a small number: the float32 rounding up
    (``_f32_up``) keeps inf and NaN (it had mapped NaN to its 2^-102 floor), and the kernel
    says so (None: the rule takes its general path)."""
    from fpx.kernels import interval as K
    v = np.array([[1.0, 2.0]], np.float32)
    for r in (np.array([[np.inf, 0.5]]), np.array([[np.nan, 0.5]])):
        for c2 in (0.0, 1e-7):
            assert K.mm_left_ball(v, r, c2) is None
        assert K.mm_right_ball(v, r) is None


def _attention_block(rng, d=64, heads=4, seq=24, batch=2):
    import fpx.nn as fnn
    w_in = (rng.standard_normal((3 * d, d)) / 8).astype(np.float32)
    b_in = rng.standard_normal(3 * d).astype(np.float32) / 4
    w_out = (rng.standard_normal((d, d)) / 8).astype(np.float32)

    def f(x):                                        # torch's MHA layout, as traced
        y = fnn.linear(fnp.transpose(x, (1, 0, 2)), w_in, b_in, bias_in_sum=True)
        y = fnp.transpose(fnp.reshape(y, (seq, batch, 3, d)), (2, 0, 1, 3))
        q, k, v = (fnp.reshape(fnp.transpose(fnp.reshape(y[i], (seq, batch * heads, d // heads)),
                                             (1, 0, 2)), (batch, heads, seq, d // heads))
                   for i in range(3))
        o = fnn.scaled_dot_product_attention(q, k, v)
        o = fnp.reshape(fnp.transpose(o, (2, 0, 1, 3)), (seq * batch, d))
        return fnn.linear(o, w_out, None), y
    return f, rng.standard_normal((batch, seq, d)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Flush-to-zero formats (Policy.flush_to_zero: the "cupy" preset's float32)
# ---------------------------------------------------------------------------------------------
def _ftz32(a):
    """What a flush-to-zero float32 unit stores: subnormals become (signed) zero."""
    a = np.asarray(a, np.float32)
    return np.where(np.abs(a) < np.float32(2.0 ** -126), a * np.float32(0), a)


def _ftz_dot(a, b):
    """A flush-to-zero float32 dot product: each input, product and partial sum flushed."""
    a, b = _ftz32(a), _ftz32(b)
    out = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        out = _ftz32(out + _ftz32(a[:, k:k + 1] * b[k:k + 1, :]))
    return out


@pytest.mark.parametrize("case", ["exp", "scaled-subnormal", "flushed-products", "mixed-dot",
                                  "sum-of-halves"])
def test_flush_to_zero_policy_covers_a_flushing_unit(case):
    f32 = np.float32
    if case == "exp":
        f, xs = fnp.exp, [np.array([-100.0, -90.0, -87.0, -10.0], f32)]
        ftz = _ftz32(np.exp(xs[0]))
    elif case == "scaled-subnormal":
        f, xs = (lambda v: v * f32(1e30)), [np.array([1e-40, 1e-39, -3e-42, 1.0], f32)]
        ftz = _ftz32(_ftz32(xs[0]) * f32(1e30))
    elif case == "flushed-products":
        f = (lambda a, b: a @ b)
        xs = [np.full((2, 512), 1e-21, f32), np.full((512, 3), 1e-21, f32)]
        ftz = _ftz_dot(*xs)
    elif case == "mixed-dot":
        f = (lambda a, b: a @ b)
        xs = [np.array([[1e-20, 1e-19, 2e-19, 3e-38]], f32),      # one normal product
              np.array([[1e-20], [-1e-20], [1e-19], [0.25]], f32)]
        ftz = _ftz_dot(*xs)
    else:
        f, xs = (lambda v: fnp.sum(v * f32(0.5))), [np.full(1000, 2e-38, f32)]
        ftz = np.float32(0.0)            # every halved term flushed
    flushing = fpx.interval(f, policy="cupy")(*xs)
    assert flushing.contains(ftz).all() and flushing.contains(flushing.value).all()
    # the same bound without the flush model misses the flushing unit's result
    assert not fpx.interval(f, policy="cuda")(*xs).contains(ftz).all()


def test_flush_to_zero_leaves_normal_range_bounds_alone():
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((16, 32)).astype(np.float32) for _ in range(2))
    f = (lambda a, b: fnp.tanh(a @ b.T) + fnp.exp(a[:, :16]))
    cupy_, cuda = fpx.interval(f, policy="cupy")(a, b), fpx.interval(f, policy="cuda")(a, b)
    np.testing.assert_allclose(cupy_.lo, cuda.lo, rtol=1e-12, atol=1e-30)
    np.testing.assert_allclose(cupy_.hi, cuda.hi, rtol=1e-12, atol=1e-30)
    assert fpx.policy.get_policy("cupy").flush_to_zero == ("float32",)
    assert fpx.policy.get_policy("cuda").flush_to_zero == ()
    F = fpx.formats.FlushedFormat.of(fpx.formats.get("float32"))
    assert F.name == "float32" and F.p == 24 and F.smallest_subnormal == 2.0 ** -125


def test_point_linear_value_of_a_numpy_program_is_the_programs():
    """Outside a torch program the split-K centre's halves do not replace the value: the
    value of a NumPy program is what the program computes, bit for bit."""
    rng = np.random.default_rng(35)
    x, w, b = (rng.standard_normal(sh).astype(np.float32) for sh in ((64, 256), (96, 256),
                                                                     (96,)))
    for in_sum in (False, True):
        def f(h):
            return fnn.linear(h, w, b, bias_in_sum=in_sum)
        out = fpx.interval(f)(x)
        assert np.array_equal(out.value, f(x)) and out.contains(f(x)).all()


def test_pair_gemm_bound_holds_on_both_engines():
    """``engines.upper_gemm_sum`` bounds L @ M + L2 @ M2 (nonnegative factors) whether the
    second GEMM accumulates into the first (MKL inside a torch program's run) or the
    factors are concatenated: R·f + a is above the float64 sum (exact here: products of
    12-bit integers) on both engines, and the two agree to the bound's own slack."""
    pytest.importorskip("torch")
    from fpx.kernels import blas
    from fpx.transforms.interval import engines
    rng = np.random.default_rng(3)
    L, L2 = (rng.integers(0, 2 ** 12, (3, 40, 96)).astype(np.float32) for _ in range(2))
    M = rng.integers(0, 2 ** 12, (3, 96, 24)).astype(np.float32)
    # (a transposed view, as attention's k^T)
    M2 = rng.integers(0, 2 ** 12, (3, 24, 96)).astype(np.float32).transpose(0, 2, 1)
    exact = L.astype(np.float64) @ M + L2.astype(np.float64) @ M2
    got = []
    for mkl in (False, True):
        with (blas.torch_gemms() if mkl else contextlib.nullcontext()):
            R, f, a = engines.upper_gemm_sum(L, M, L2, M2, 96, True, 1.5)
        bound = R.astype(np.float64) * f + a
        assert np.all(bound >= 1.5 * exact)
        got.append(bound)
    assert np.all(np.abs(got[0] - got[1]) <= 1e-5 * got[0])


def test_masked_hull_is_the_hull_over_each_querys_keys():
    """``masked_hull`` (attention's hull of v's rows, one compiled pass) is the min and max
    over the keys each query attends -- random masks with empty rows (inf, -inf), a causal
    mask, and batch dimensions that broadcast either way."""
    rng = np.random.default_rng(6)
    for tshape, vshape in (((2, 3, 5, 7), (2, 3, 7, 4)), ((1, 1, 5, 7), (2, 3, 7, 4)),
                           ((2, 3, 5, 7), (1, 3, 7, 4)), ((6, 6), (6, 2))):
        taken = rng.random(tshape) < 0.4
        if len(tshape) == 2:
            taken = np.tril(np.ones(tshape, bool))
        taken[..., 0, :] = False                             # a query with no key
        vlo = rng.standard_normal(vshape)
        vhi = vlo + rng.random(vshape)
        mn, mx = KN.masked_hull(taken, vlo, vhi)
        t = taken[..., :, :, None]
        want_mn = np.min(np.where(t, vlo[..., None, :, :], np.inf), axis=-2)
        want_mx = np.max(np.where(t, vhi[..., None, :, :], -np.inf), axis=-2)
        assert mn.shape == want_mn.shape
        assert np.array_equal(mn, want_mn) and np.array_equal(mx, want_mx)
        assert np.all(mn[..., 0, :] == np.inf) and np.all(mx[..., 0, :] == -np.inf)


def test_ball_inside_is_numpys_elementwise_test():
    """``ball_inside`` (attention's hull test, one compiled pass) says what the elementwise
    NumPy test says -- per-block and per-row hulls, broadcast leading dims, NaN (never
    inside) -- on balls placed inside, across and outside random hulls."""
    rng = np.random.default_rng(5)

    def numpy_test(v, r, lo, hi):
        with np.errstate(invalid="ignore"):
            v, w = np.asarray(v, np.float64), np.asarray(r, np.float64) * (1 + 2.0 ** -40) + 1e-300
            return bool(np.all(v - w >= lo) and np.all(v + w <= hi))
    seen = set()
    for trial in range(60):
        v = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
        r = np.abs(rng.standard_normal(v.shape)).astype(np.float32) * 10.0 ** rng.integers(-8, 0)
        per_row = trial % 2 == 0
        shape = v.shape if per_row else (1, 3, 1, 4)       # (one head-shared hull per block)
        lo, hi = np.full(shape, -3.0), np.full(shape, 3.0)
        if trial % 3 == 1:
            hi.flat[rng.integers(hi.size)] = -10.0          # one ball outside
        if trial % 7 == 3:
            v.flat[rng.integers(v.size)] = np.nan
        want = numpy_test(v, r, lo, hi)
        assert KN.ball_inside(v, r, lo, hi) == want
        seen.add(want)
    assert seen == {True, False}
