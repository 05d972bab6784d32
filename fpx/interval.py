"""``fpx.interval``: sound round-off bounds of a program in its own precision.

Each traced value carries ``value`` (the concrete result, computed by the parent interpreter in
the program's dtypes) and float64 bounds ``lo <= every result round-off could produce <= hi``.
A rule computes (1) the exact-real enclosure of the op over its input intervals, in float64
with outward widening (sound without rounding-mode control: every float64 step rounded to
nearest is widened by a relative ``(k+2)·2^-52`` and an absolute ``2^-1074``), then (2) the op's
rounding error in the *result* format, from the precision policy (``ulps·2^(1-p)·|v| +
ulps·η + absolute``: relative *and* absolute, so nothing has zero width at 0).

* Matmul / sums: midpoint-radius with BLAS (Rump 1999, "Fast and parallel interval arithmetic"):
  the accumulation bound ``c_K = δ_p + γ_{K-1}(δ_acc)(1+δ_p)`` (Higham, *Accuracy and
  Stability*, §3.1) for the policy's product and accumulation formats, valid for any summation
  order, split-K or atomics. One float32 GEMM ``(2c·Â + r_A)·|B|`` with a rigorous
  ``(1-γ_{K+1})^-1`` correction (or a bfloat16 one on AMX, ``kernels/bf16.py``) bounds
  everything around the program's own value; operands that are points (or nearly) get a
  centre of their own instead: float32 points four float32 GEMMs over the quarters of K
  summed in float64 (``_split_point_bounds``), others an exact float64 centre.
* Branches: with ``branches="hull"`` a comparison whose operand intervals overlap is
  *unstable*; ``where`` takes the hull of both sides there; an unstable value that reaches an
  integer output or Python control flow is recorded (``classify`` then says ``inconclusive``).
  ``branches="concrete"`` follows the observed branch, as RENDER does (not sound).
* Unknown primitives raise :class:`fpx.UnsupportedOpError`; nothing is silently exact.

References: Zhan et al., "When AllClose Fails: Round-Off Error Estimation for Deep Learning
Programs" (RENDER, 2025); Rump (1999); Higham (2002); Higham & Mary (2019) for the
probabilistic bound ``λ·sqrt(n)·u``.
"""
from __future__ import annotations

import contextvars
import math
import threading
from dataclasses import dataclass

import numpy as np

from fpx import formats as _formats
from fpx import tree
from fpx.kernels import bf16 as _bf16
from fpx.kernels import blas as _blas
from fpx.kernels import conv as _kconv
from fpx import nn as _nn
from fpx.kernels import interval as _K
from fpx.core import (PRIMITIVES, EvalInterpreter, FpxError, Interpreter, Tracer, concrete,
                      current_interpreter, is_cupy, to_host, using)
from fpx.policy import get_policy
from fpx.transform import adapt, as_array, check_dtype, is_array_leaf, on_host, wraps

__all__ = ["interval", "Interval", "IntervalInterpreter"]

_E64 = 2.0 ** -52
_TINY64 = 5e-324
_LIBM64_ULPS = 4          # float64 libm error allowance for bound evaluation (NumPy <= 3 ulp)
_P = PRIMITIVES


# =============================================================================================
# The user-facing result
# =============================================================================================
class Interval:
    """Bounds of what round-off can make a program output: ``lo <= y <= hi`` elementwise.

    ``value`` is the program's own result (its dtype); ``lo``/``hi`` are float64;
    ``unstable`` marks elements whose computation passed a branch the bounds could not decide.
    Build an input interval with ``Interval(lo, hi, value)`` or :meth:`around`.
    """

    __slots__ = ("value", "lo", "hi", "unstable")

    def __init__(self, lo, hi, value=None, unstable=None):
        xp = _xp(lo) if _is_cupy(lo) else _xp(hi)     # CuPy if either end lives on the GPU
        self.lo = xp.asarray(lo, dtype=np.float64)
        self.hi = xp.asarray(hi, dtype=np.float64)
        if self.lo.shape != self.hi.shape:
            raise ValueError(f"Interval: lo {self.lo.shape} and hi {self.hi.shape} differ")
        if bool((self.lo > self.hi).any()):
            raise ValueError("Interval: lo > hi somewhere")
        if value is None:
            value = (self.lo + self.hi) / 2
        else:
            _check_value_inside(value, self.lo, self.hi)
        self.value = value
        self.unstable = unstable

    @classmethod
    def _trusted(cls, lo, hi, value, unstable=None):
        """An interval the interpreter built (float64 arrays, lo <= hi or NaN): no checks."""
        self = object.__new__(cls)
        self.lo, self.hi, self.value, self.unstable = lo, hi, value, unstable
        return self

    @classmethod
    def around(cls, value, radius=0.0, rel=0.0):
        """``value ± (radius + rel·|value|)`` (outward rounded), keeping ``value``'s dtype."""
        xp = _xp(value)
        v = xp.asarray(value)
        v64 = to_host(v).astype(np.float64)
        r = to_host(radius).astype(np.float64) + rel * np.abs(v64)
        lo, hi = _widen(v64 - r, v64 + r, 1)           # (compiled CPU kernels)
        return cls(xp.asarray(lo), xp.asarray(hi), v)

    @property
    def shape(self):
        return tuple(self.lo.shape)

    @property
    def dtype(self):
        v = as_array(self.value)
        return v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype

    @property
    def width(self):
        return self.hi - self.lo

    @property
    def midpoint(self):
        return (self.lo + self.hi) / 2

    def contains(self, y):
        """Elementwise ``lo <= y <= hi``; NaN bounds or NaN ``y`` give False (never "inside")."""
        y = concrete(as_array(y))
        y = _xp(self.lo).asarray(y if _is_cupy(y) == _is_cupy(self.lo) else to_host(y),
                                 dtype=np.float64)      # on the bounds' device
        return (self.lo <= y) & (y <= self.hi)

    def __repr__(self):
        lo, hi = to_host(self.lo), to_host(self.hi)
        w = hi - lo
        fin = np.isfinite(w)
        wmax = float(np.max(w[fin])) if fin.any() else float("nan")
        nun = 0 if self.unstable is None else int(np.count_nonzero(to_host(self.unstable)))
        head = (f"Interval({self.dtype}{list(self.shape)}, max width {wmax:.3g}"
                f"{', %d non-finite' % int((~fin).sum()) if (~fin).any() else ''}"
                f"{', %d unstable' % nun if nun else ''})")
        if lo.size <= 6:
            els = ", ".join(f"[{a:.9g}, {b:.9g}]" for a, b in zip(lo.ravel(), hi.ravel()))
            return f"{head}\n  {els}"
        return head


def _check_value_inside(value, lo, hi):
    """An input interval's value (what the program runs on) must be one of the reals it
    describes: the rules bound both, and a point interval's fast paths centre on the value."""
    v = to_host(concrete(as_array(value))).astype(np.float64)
    lo, hi = to_host(lo), to_host(hi)
    if np.shape(v) != np.shape(lo):
        raise ValueError(f"Interval: value {np.shape(v)} and lo/hi {np.shape(lo)} differ in shape")
    with np.errstate(invalid="ignore"):
        n = int((v < lo).sum() + (v > hi).sum())
    if n:
        raise ValueError(
            f"Interval: the value lies outside [lo, hi] at {n} element(s); the value is what the "
            "program runs on, so it must be inside the interval (to describe a real input x "
            "stored as v, use Interval(np.minimum(x, v), np.maximum(x, v), v))")


def _is_point(lo, hi):
    """lo == hi everywhere (a few elements first: a real interval usually differs there)."""
    flo, fhi = np.ravel(lo), np.ravel(hi)
    head = min(flo.size, 64)
    if not np.array_equal(flo[:head], fhi[:head]):
        return False
    return bool(np.all(lo == hi))


_is_cupy = is_cupy


# =============================================================================================
# Float64 enclosure helpers (sound under round-to-nearest, no rounding-mode control)
# =============================================================================================
def _owned(x):
    """Can a kernel write its result into ``x``? (a float64 array the caller gave up)"""
    return isinstance(x, np.ndarray) and x.dtype == np.float64 and x.ndim > 0 and \
        x.flags.writeable and x.flags.owndata


def _widen(lo, hi, k=1):
    """Widen float64 bounds computed with ``k`` rounded-to-nearest steps outward. Consumes its
    arguments: pass fresh arrays (the result may be written into them)."""
    rel = (k + 2) * _E64
    return (_K.down(lo, rel, _TINY64, math.inf, out=lo) if _owned(lo) and lo is not hi
            else _K.down(lo, rel, _TINY64, math.inf),
            _K.up(hi, rel, _TINY64, math.inf, out=hi) if _owned(hi) and hi is not lo
            else _K.up(hi, rel, _TINY64, math.inf))


def _up(x, k=1):
    """Upper bound of a nonnegative float64 quantity computed with ``k`` rounded steps."""
    return _K.scale_up(x, 1.0 + (k + 2) * _E64, 0.0)


def _gamma(n, delta):
    """γ_n(δ) = nδ/(1-nδ) (Higham); inf when nδ >= 1."""
    nd = n * delta
    return nd / (1.0 - nd) if nd < 1.0 else math.inf


# Formats the running interpreter's policy flushes to zero (``Policy.flush_to_zero``): their
# error terms use ``formats.FlushedFormat`` (set by ``run_interval`` for its run).
_FLUSHED = contextvars.ContextVar("fpx_interval_flushed", default=frozenset())


def _fmt_of(dtype):
    try:
        F = _formats.get(dtype)
    except (TypeError, ValueError):
        return None
    return _flushed(F)


def _flushed(F):
    if F is None or F.name not in _FLUSHED.get():
        return F
    G = _FLUSHED_FORMATS.get(F.name)
    if G is None:
        G = _FLUSHED_FORMATS[F.name] = _formats.FlushedFormat.of(F)
    return G


_FLUSHED_FORMATS: dict = {}


def _flush_inputs(lo, hi, F):
    """An input as a flush-to-zero unit reads it: where the interval meets the subnormal
    range, the hull with 0 (a subnormal operand may be read as ±0)."""
    t = F.tiny
    near = (lo < t) & (hi > -t) & ~((lo == 0) & (hi == 0))
    if not np.any(near):
        return lo, hi, False
    return np.where(near, np.minimum(lo, 0.0), lo), np.where(near, np.maximum(hi, 0.0), hi), True


@dataclass
class Event:
    """Something the bounds could not decide: an unstable branch or index, a division by an
    interval containing zero, ... (``classify`` reports them)."""
    kind: str
    what: str
    count: int = 1


# =============================================================================================
# Tracer and interpreter
# =============================================================================================
class IntervalTracer(Tracer):
    """A traced value with its bounds ``lo``/``hi``. A rule whose bound is one compiled pass
    (add, a batch norm's affine step, a value-centred GEMM's centre ± radius) may leave them
    *pending*: ``pending(c)`` computes ``(max(lo, c), max(hi, c))`` -- the bounds themselves
    for c = -inf, on first access of ``lo``/``hi``. A following ``max(x, c)`` with a constant c
    (ReLU) stays pending with the clamp folded in (``_max_min``), so the intermediate arrays
    are never written (a ReLU's own pass took ~0.85 ms at 0.5M elements; a batch norm + ReLU
    pair now ~0.4 ms less); a GEMM's (``_CentredBounds``) also passes reshapes and
    transposes and feeds the next GEMM's left factor directly (``_left_factor``)."""
    __slots__ = ("_lo", "_hi", "unstable", "point", "_pending")

    def __init__(self, interp, primal, lo, hi, unstable=None, point=False, pending=None):
        super().__init__(interp, primal)
        self._lo, self._hi, self.unstable, self.point = lo, hi, unstable, point
        self._pending = pending

    def _force(self):
        lo, hi = self._pending(-math.inf)
        self._pending = None                  # (drops the operands the pass would have read)
        shape = np.shape(concrete(self.primal))
        if np.shape(lo) != shape or np.shape(hi) != shape:
            lo, hi = np.broadcast_to(lo, shape), np.broadcast_to(hi, shape)
        self._lo, self._hi = lo, hi

    @property
    def lo(self):
        if self._pending is not None:
            self._force()
        return self._lo

    @property
    def hi(self):
        if self._pending is not None:
            self._force()
        return self._hi


class IntervalInterpreter(Interpreter):
    """Bounds every primitive. See the module docstring for the error model."""
    rule_takes_prim = True

    def __init__(self, parent, policy=None, branches: str = "hull", bound: str = "rigorous",
                 confidence: float = 0.999, matmul: str = "midrad"):
        super().__init__(parent)
        if branches not in ("hull", "concrete"):
            raise ValueError(f"fpx.interval: branches must be 'hull' or 'concrete', not {branches!r}")
        if bound not in ("rigorous", "probabilistic"):
            raise ValueError(f"fpx.interval: bound must be 'rigorous' or 'probabilistic', not {bound!r}")
        if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
            raise ValueError(f"fpx.interval: confidence must be a probability strictly between 0 "
                             f"and 1, not {confidence!r}")
        if matmul not in ("midrad", "fast", "exact-center", "render"):
            raise ValueError("fpx.interval: matmul must be 'midrad', 'fast', 'exact-center' or "
                             "'render'")
        self.policy = get_policy(policy)
        self.branches, self.bound, self.confidence, self.matmul = branches, bound, confidence, matmul
        self.events: list[Event] = []
        self._acc_cache: dict = {}

    # -- bookkeeping ------------------------------------------------------------------------
    def resolve(self, prim, dtype):
        """The policy's formats of ``prim`` on a ``dtype`` program (flush-to-zero formats as
        ``formats.FlushedFormat``)."""
        r = self.policy.resolve(prim, dtype)
        return type(r)(*map(_flushed, r)) if self.policy.flush_to_zero else r

    def note(self, kind, what, count=1):
        for e in self.events:
            if e.kind == kind and e.what == what:
                e.count += count
                return
        self.events.append(Event(kind, what, count))

    def to_concrete(self, tracer, why):
        un = tracer.unstable
        if un is not None and np.any(un):
            self.note("unstable-control-flow", f"{why} decided by a value the bounds cannot "
                      f"decide ({int(np.count_nonzero(un))} element(s))")
        return super().to_concrete(tracer, why)

    def gamma(self, n, delta):
        """Accumulation constant for n terms: rigorous γ_n, or Higham–Mary's λ·sqrt(n)·δ."""
        if n <= 0:
            return 0.0
        rigorous = _gamma(n, delta)
        if self.bound == "probabilistic":   # never wider than the rigorous bound (small n)
            lam = math.sqrt(2.0 * math.log(2.0 * max(n, 1) / (1.0 - self.confidence)))
            return min(rigorous, math.expm1(lam * math.sqrt(n) * delta + n * delta * delta / (1 - delta)))
        return rigorous

    def partial_sum_gamma(self, m, delta):
        """Constant for the same sum bounded through its partial sums: ``|fl(Σ p_i) - Σ p_i|
        <= const·max(P, N)``, P (N) the sum of the positive (negated negative) terms, any
        order. Every rounding's error is at most δ times the exact result of its operation,
        whose operands' exact values are a partial sum over a subset of the terms, in
        [-N, P], plus the errors made below it; so the errors ε of the m additions satisfy
        ε <= m·δ·(max(P, N) + ε), const = γ_m(δ). Against the classic bound (Σ|p_i| = P + N)
        this halves the radius of sums whose terms cancel; it needs the rigorous model
        (inf for the probabilistic one, which bounds another quantity)."""
        if self.bound != "rigorous" or m <= 0:
            return math.inf if m > 0 else 0.0
        return _gamma(m, delta) * (1 + 4 * _E64)

    def sum_gamma(self, m, delta, nearest):
        """Constant for a sum with ``m`` additions of relative error ``delta`` each, in any
        order: ``|fl(Σ p_i) - Σ p_i| <= const·Σ|p_i|``. With round-to-nearest additions
        (``nearest``) the rigorous constant is ``m·δ`` (Rump, "Error estimation of
        floating-point summation and dot product", BIT 2012: γ_m improves to m·u for any order
        and any m; underflowing additions are exact), else :meth:`gamma`."""
        if nearest and self.bound == "rigorous" and m > 0:
            return m * delta
        return self.gamma(m, delta)

    def accuracy(self, prim_name, fmt):
        key = (prim_name, fmt.name)
        acc = self._acc_cache.get(key)
        if acc is None:
            acc = self._acc_cache[key] = self.policy.accuracy(prim_name, fmt)
        return acc

    # -- operands -----------------------------------------------------------------------------
    def value_of(self, prim, args, params):
        primals = [a.primal if self._own(a) else a for a in args]
        return self.bind_parent(prim, *primals, **params)

    def _own(self, x):
        return isinstance(x, IntervalTracer) and x._interp is self

    def primal_of(self, x):
        """The concrete program value of an operand (own tracer or constant)."""
        return concrete(x.primal if self._own(x) else x)

    def bounds(self, x, dtype=None):
        """(lo, hi, unstable, point) of an operand; a constant is the point it becomes in an
        op of result dtype ``dtype`` (NumPy converts weak Python scalars to it)."""
        if self._own(x):
            return x.lo, x.hi, x.unstable, x.point
        c = concrete(x)
        if isinstance(c, (bool, int, float)) and dtype is not None and np.dtype(dtype).kind in "fV":
            c = np.asarray(c).astype(dtype)
        v = _as_f64(c)
        return v, v, None, True

    def _integer_bounds(self, prim_name, dt, lo, hi):
        """Bounds of an integer result: integer arithmetic is exact, so the float64 enclosure
        tightens to the integers inside it (no widening is left); where the exact result may
        leave the dtype's range, NumPy wraps around, and the bounds are that whole range (an
        "overflow" event)."""
        if dt.kind not in "iu":
            return lo, hi
        with np.errstate(invalid="ignore"):
            lo, hi = np.ceil(lo), np.floor(hi)
            info = np.iinfo(dt)
            top = math.ldexp(1.0, info.bits - (dt.kind == "i"))    # max + 1, exact in float64
            over = (hi >= top) | (lo < float(info.min))
        if np.any(over):
            self.note("overflow", f"{prim_name}: the exact {dt} result may leave the dtype's "
                      "range (NumPy wraps around): bounds are the whole range",
                      int(np.count_nonzero(over)))
            lo = np.where(over, float(info.min), lo)
            hi = np.where(over, float(info.max), hi)
        return lo, hi

    def new(self, value, lo, hi, unstable=None, point=False):
        shape = np.shape(concrete(value))
        if np.shape(lo) != shape or np.shape(hi) != shape:   # e.g. remainder's [0, b) range
            lo, hi = np.broadcast_to(lo, shape), np.broadcast_to(hi, shape)
        return IntervalTracer(self, value, lo, hi, unstable, point)

    def new_pending(self, value, pending, unstable=None):
        """A result whose bounds ``pending(c)`` computes when first needed (IntervalTracer)."""
        return IntervalTracer(self, value, None, None, unstable, False, pending)

    # -- rounding of a result ------------------------------------------------------------------
    def round_result(self, prim_name, value, lo, hi, *inputs, steps=0):
        """Add the rounding error of ``prim_name`` with its result in ``value``'s format to the
        fresh bounds lo/hi (computed with ``steps`` float64 steps not yet widened)."""
        dt = np.asarray(concrete(value)).dtype
        F = _fmt_of(dt)
        if F is None:  # integer / bool result: exact
            lo, hi = _widen(lo, hi, steps) if steps else (lo, hi)
            return self._integer_bounds(prim_name, dt, lo, hi)
        acc = self.accuracy(prim_name, F)
        return _round_bounds(lo, hi, F, acc, inputs, steps=steps, consume=True)



def _as_f64(c):
    if _is_cupy(c):
        return c.astype("float64")
    return np.asarray(c, dtype=np.float64)


def _xp(a):
    if _is_cupy(a):
        import cupy
        return cupy
    return np


# Points where documented piecewise accuracies change (subnormal inputs under flush-to-zero,
# __logf's [0.5, 2], __sinf's [-pi, pi]): input-dependent accuracies are evaluated at the
# endpoints of each input interval and at these points clipped into it.
_PROBES = (0.0, 1e-39, -1e-39, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0,
           math.pi / 2, -math.pi / 2, math.pi, -math.pi)


def _accuracy_terms(acc, inputs):
    """(ulps, absolute) of an accuracy over the input intervals ``inputs`` [(lo, hi), ...]."""
    if not acc.input_dependent:
        return acc.ulps, acc.absolute
    if not inputs:
        raise ValueError("fpx.interval: an input-dependent accuracy needs the op's inputs")
    samples = [[i[0] for i in inputs], [i[1] for i in inputs]]
    samples += [[np.clip(p, i[0], i[1]) for i in inputs] for p in _PROBES]
    with np.errstate(all="ignore"):
        ulps = _as_f64(acc.ulps_at(*samples[0]))
        ab = _as_f64(acc.absolute_at(*samples[0]))
        for smp in samples[1:]:
            ulps = np.maximum(ulps, _as_f64(acc.ulps_at(*smp)))
            ab = np.maximum(ab, _as_f64(acc.absolute_at(*smp)))
    return ulps, ab


def _rounding_terms(F, ulps, ab, steps):
    """(rel, abs, top) for ``_K.down/up``: one rounding into F (``ulps``, absolute ``ab``)
    plus the outward widening of ``steps`` float64 steps and of this one."""
    R = ulps * 2.0 ** (1 - F.p) + (4 + 2 * steps) * _E64
    A = (ulps * F.smallest_subnormal + ab) * (1 + 4 * _E64) + (steps + 1) * _TINY64
    top = math.inf if (F.name == "float64" or not F.has_inf) else F.max
    return R, A, top


def _round_bounds(lo, hi, F, acc, inputs=(), steps=0, consume=False):
    """[lo, hi] (exact-real enclosure) widened by one rounding into format F with accuracy acc:
    |fl(v) - v| <= ulps·2^(1-p)·|v| + ulps·η + absolute, fused with the outward widening of
    the ``steps`` float64 steps that computed lo/hi and of this one (relative (4+2·steps)·2^-52,
    absolute 2^-1074 each), and with :func:`_overflow`. ``consume``: lo/hi are fresh arrays
    the result may be written into."""
    ulps, ab = _accuracy_terms(acc, inputs)
    R, A, top = _rounding_terms(F, ulps, ab, steps)
    olo = {"out": lo} if consume and _owned(lo) and lo is not hi else {}
    ohi = {"out": hi} if consume and _owned(hi) and hi is not lo else {}
    lo, hi = _K.down(lo, R, A, top, **olo), _K.up(hi, R, A, top, **ohi)
    return (lo, hi) if (F.has_inf or F.name == "float64") else _overflow(lo, hi, F)


def _overflow(lo, hi, F):
    """Where a bound passes F's largest finite value the program may overflow: ±inf (NaN for
    formats without infinities). float64 bounds overflow by themselves."""
    if F.name == "float64":
        return lo, hi
    top = F.max
    over_lo, over_hi = lo < -top, hi > top
    if not (np.any(over_lo) or np.any(over_hi)):
        return lo, hi
    if F.has_inf:
        return np.where(over_lo, -np.inf, lo), np.where(over_hi, np.inf, hi)
    nan = over_lo | over_hi
    return np.where(nan, np.nan, lo), np.where(nan, np.nan, hi)


_rule = IntervalInterpreter.def_rule


def _or_unstable(*us):
    out = None
    for u in us:
        if u is None:
            continue
        out = u if out is None else (out | u)
    return out


# =============================================================================================
# Arithmetic
# =============================================================================================
def _binary_prep(self, prim, a, b, params=None):
    v = self.value_of(prim, (a, b), params or {})
    dt = np.asarray(concrete(v)).dtype
    alo, ahi, au, ap = self.bounds(a, dt)
    blo, bhi, bu, bp = self.bounds(b, dt)
    return v, (alo, ahi), (blo, bhi), _or_unstable(au, bu), ap and bp


@_rule("add", "sub")
def _add_sub(self, prim, a, b):
    y = _add_centred(self, prim, a, b)
    if y is not None:
        return y
    v, (alo, ahi), (blo, bhi), un, pt = _binary_prep(self, prim, a, b)
    F = _fmt_of(np.asarray(concrete(v)).dtype)
    acc = None if F is None else self.accuracy(prim.name, F)
    if prim.name == "sub":
        blo, bhi = -bhi, -blo
    if (acc is not None and not acc.input_dependent and (F.has_inf or F.name == "float64")
            and all(isinstance(x, np.ndarray) or np.isscalar(x) for x in (alo, ahi, blo, bhi))):
        # one fused pass: the float64 sum, its rounding and the op's (see _round_bounds)
        R, A, top = _rounding_terms(F, acc.ulps, acc.absolute, steps=1)
        if isinstance(v, np.ndarray) and v.ndim:    # pending: a ReLU may share the pass
            return self.new_pending(v, lambda c: _K.add_bounds(alo, ahi, blo, bhi, R, A, top,
                                                               c), un)
        lo, hi = _K.add_bounds(alo, ahi, blo, bhi, R, A, top)
        return self.new(v, lo, hi, un)
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = alo + blo, ahi + bhi
        lo, hi = self.round_result(prim.name, v, lo, hi, (alo, ahi), (blo, bhi), steps=1)
    return self.new(v, lo, hi, un)


def _add_centred(self, prim, a, b):
    """a + b where one operand's bounds are a GEMM's pending centred ones (``_CentredBounds``,
    not a ball with exact bounds of its own) and the other's are not: the sum stays pending.
    A constant float32/float64 array (a bias) gives centred bounds about the sum's value
    (``_CentredBounds.shifted``), which a ReLU and the next GEMM's left factor read on the
    fly; anything else a pass that reads them on the fly (``add_bounds_centred``: a residual,
    a bias of interval bounds), bit for bit the add rule's bounds of the forced ones, which
    are never written. None elsewhere."""
    if prim.name != "add":
        return None
    x, o = (a, b) if self._own(a) and type(a._pending) is _CentredBounds else (b, a)
    if not (self._own(x) and type(x._pending) is _CentredBounds and x.unstable is None
            and not (self._own(o) and type(o._pending) is _CentredBounds)):
        return None
    v = self.value_of(prim, (a, b), {})
    F = _fmt_of(np.asarray(concrete(v)).dtype)
    acc = None if F is None else self.accuracy("add", F)
    if (acc is None or acc.input_dependent or not (F.has_inf or F.name == "float64")
            or not (isinstance(v, np.ndarray) and v.ndim)
            or np.shape(v) != np.broadcast_shapes(np.shape(v), np.shape(x._pending.center))):
        return None
    p = x._pending
    t = None if self._own(o) else concrete(o)
    if (type(t) is np.ndarray and t.dtype == v.dtype == np.asarray(p.center).dtype
            and F.name in ("float32", "float64")):
        # a constant bias: still centred bounds, about the sum's value
        shifted = p.shifted(t, acc.ulps * 2.0 ** (1 - F.p),
                            acc.ulps * F.smallest_subnormal + acc.absolute, 2.0 ** -F.p,
                            math.inf if F.name == "float64" else F.max, v)
        if shifted is not None:
            return self.new_pending(v, shifted, x.unstable)
    olo, ohi, ou, _ = self.bounds(o, v.dtype)
    if not all(isinstance(z, np.ndarray) or np.isscalar(z) for z in (olo, ohi)):
        return None
    R, A, top = _rounding_terms(F, acc.ulps, acc.absolute, steps=1)

    def pending(c):
        lo, hi, n_bad = _K.add_bounds_centred(olo, ohi, p.center, *p.rad, p.top, p.b, p.floor,
                                              R, A, top, c)
        if n_bad:      # (the GEMM's rule left its bounds pending only where none can be)
            raise FpxError("fpx.interval: internal error: a pending GEMM bound is not finite")
        return lo, hi
    return self.new_pending(v, pending, ou)


def _corners(f, alo, ahi, blo, bhi):
    """(min, max) of f over the four corners of [alo, ahi] x [blo, bhi] (the range of any f
    monotone in each argument on the box), NaN-propagating."""
    c1, c2, c3, c4 = f(alo, blo), f(alo, bhi), f(ahi, blo), f(ahi, bhi)
    return (np.minimum(np.minimum(c1, c2), np.minimum(c3, c4)),
            np.maximum(np.maximum(c1, c2), np.maximum(c3, c4)))


def _mul_bounds(alo, ahi, blo, bhi):
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = _corners(np.multiply, alo, ahi, blo, bhi)
    # 0 * inf = NaN in float64, but the set {a*b} is well defined when one factor is exactly 0
    lo = np.where(np.isnan(lo) & ~_any_nan(alo, ahi, blo, bhi), -np.inf, lo)
    hi = np.where(np.isnan(hi) & ~_any_nan(alo, ahi, blo, bhi), np.inf, hi)
    return _widen(lo, hi)


def _any_nan(*xs):
    out = np.isnan(xs[0])
    for x in xs[1:]:
        out = out | np.isnan(x)
    return out


@_rule("mul")
def _mul(self, prim, a, b):
    y = _scaled_pending(self, prim, a, b)
    if y is not None:
        return y
    v, (alo, ahi), (blo, bhi), un, pt = _binary_prep(self, prim, a, b)
    if a is b and self._own(a):
        # x * x of one traced value: a square, never negative (the interval product of two
        # independent copies would go below 0 where x straddles 0 -- and a variance's sqrt
        # would then be NaN)
        with np.errstate(invalid="ignore", over="ignore"):
            m_lo, m_hi = np.abs(alo), np.abs(ahi)
            straddle = (alo < 0) & (ahi > 0)
            lo = np.where(straddle, 0.0, np.minimum(m_lo, m_hi) ** 2)
            hi = np.maximum(m_lo, m_hi) ** 2
            lo = np.where(np.isnan(alo) | np.isnan(ahi), np.nan, lo)
            hi = np.where(np.isnan(alo) | np.isnan(ahi), np.nan, hi)
        lo, hi = _widen(lo, hi)
    else:
        F = _fmt_of(np.asarray(concrete(v)).dtype)
        acc = None if F is None else self.accuracy("mul", F)
        if (acc is not None and not acc.input_dependent and (F.has_inf or F.name == "float64")
                and all(isinstance(z, np.ndarray) or np.isscalar(z)
                        for z in (alo, ahi, blo, bhi))):
            # one fused pass: corners, the float64 product's rounding and the op's
            R, A, top = _rounding_terms(F, acc.ulps, acc.absolute, steps=1)
            lo, hi = _K.mul_bounds(alo, ahi, blo, bhi, R, A, top)
            return self.new(v, lo, hi, un)
        lo, hi = _mul_bounds(alo, ahi, blo, bhi)
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = self.round_result("mul", v, lo, hi, (alo, ahi), (blo, bhi))
    if a is b and self._own(a) and _fmt_of(np.asarray(concrete(v)).dtype) is not None:
        lo = np.where(lo < 0, 0.0, lo)        # a rounded square is never negative
    return self.new(v, lo, hi, un)


def _scaled_pending(self, prim, a, b):
    """x·s of a pending centred bound x (``_CentredBounds``) and a constant scalar s, still
    pending (``_CentredBounds.scaled``: attention's scale of its scores); None elsewhere."""
    x, s = (a, b) if self._own(a) else (b, a)
    if not (self._own(x) and isinstance(x._pending, _CentredBounds) and not self._own(s)
            and np.ndim(concrete(s)) == 0):
        return None
    v = self.value_of(prim, (a, b), {})
    dt = np.asarray(concrete(v)).dtype
    F = _fmt_of(dt)
    if (F is None or not F.has_inf or not isinstance(concrete(v), np.ndarray)
            or np.shape(concrete(v)) != np.shape(concrete(x.primal))):
        return None
    acc = self.accuracy("mul", F)
    slo, shi = (float(np.asarray(z)) for z in self.bounds(s, dt)[:2])
    if acc.input_dependent or not (slo == shi and math.isfinite(slo)):
        return None
    q = acc.ulps * 2.0 ** (1 - F.p)
    e = acc.ulps * F.smallest_subnormal + acc.absolute
    # the value here is NumPy's IEEE product: exact for a power of two but where it underflows
    q0 = 0.0 if slo == 0 or math.frexp(slo)[0] in (0.5, -0.5) else 2.0 ** -F.p
    top = math.inf if F.name == "float64" else F.max
    p = x._pending.scaled(slo, q, e, q0, F.smallest_subnormal / 2, top, concrete(v))
    # every value finite (|v'| <= the centre's bound) and every radius: nothing n_bad
    if p is None or not (p.maxima()[0] <= F.max and p.max_abs() < math.inf):
        return None
    return self.new_pending(v, p, x.unstable)


_BN_COEFFS: dict = {}


def _bn_coefficients(self, stats, eps, dtype, ndim, axis):
    """A batch norm's per-channel (alpha, beta) as intervals (``batch_norm_coefficients`` run
    by this interpreter). Where the statistics are constant NumPy arrays and the values come
    from NumPy's evaluation, the result is kept, keyed by the statistics' bytes, eps, the
    dtypes, the policy and the interpreter's settings (read-only arrays), so a model's forward does not redo the dozen
    small interval ops per batch norm (~0.45 ms each) on every call."""
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


@_rule("batch_norm")
def _batch_norm(self, prim, x, mean, var, weight=None, bias=None, *, axis, eps):
    """The decomposition with its last two ops, ``x·alpha + beta``, fused into one pass
    (``_K.affine_bounds``): the mul and add rules' bounds bit for bit, without the
    intermediate arrays. alpha and beta are computed by this interpreter as in the
    decomposition (their own rounding is the program's: intervals around the computed
    per-channel values). Formats without the fused mul/add path, CuPy: the decomposition."""
    stats = (mean, var, weight, bias)
    if not self._own(x):
        return prim.decomposition(x, *stats, axis=axis, eps=eps)
    px = concrete(x.primal)
    alpha, beta = _bn_coefficients(self, stats, eps, np.asarray(px).dtype, np.ndim(px), axis)
    va, vb = self.primal_of(alpha), self.primal_of(beta)
    # the value by a compiled pass where the parent is NumPy's evaluation of same-dtype
    # float32/float64 arrays (the same two IEEE roundings as its ufuncs), the bounds pending
    # (a ReLU may share their pass); else the value by the parent, the bounds at once
    fused = (type(self.parent) is EvalInterpreter and isinstance(px, np.ndarray)
             and px.dtype in (np.float32, np.float64)
             and all(isinstance(z, np.ndarray) and z.dtype == px.dtype for z in (va, vb)))
    if fused:
        dt = px.dtype
    else:
        with using(self.parent):            # the decomposition's last two ops, by the parent
            v = _nn.scale_shift(x.primal, va, vb)
        dt = np.asarray(concrete(v)).dtype
    F = _fmt_of(dt)
    accs = None if F is None else (self.accuracy("mul", F), self.accuracy("add", F))
    slo, shi, su, _ = self.bounds(alpha, dt)
    tlo, thi, tu, _ = self.bounds(beta, dt)
    if not (accs is not None and not any(a.input_dependent for a in accs)
            and (F.has_inf or F.name == "float64")
            and all(isinstance(z, np.ndarray) for z in (x.lo, x.hi, slo, shi, tlo, thi))):
        return _nn.scale_shift(x, alpha, beta)
    (r1, a1, top), (r2, a2, _) = (_rounding_terms(F, a.ulps, a.absolute, steps=1)
                                  for a in accs)
    un = _or_unstable(x.unstable, su, tu)
    xlo, xhi = x.lo, x.hi
    if fused:
        v = _K.affine_values(px, va, vb)
        return self.new_pending(v, lambda c: _K.affine_bounds(
            xlo, xhi, slo, shi, tlo, thi, r1, a1, r2, a2, top, floor=c), un)
    lo, hi = _K.affine_bounds(xlo, xhi, slo, shi, tlo, thi, r1, a1, r2, a2, top)
    return self.new(v, lo, hi, un)


@_rule("div")
def _div(self, prim, a, b):
    v, (alo, ahi), (blo, bhi), un, pt = _binary_prep(self, prim, a, b)
    zero = (blo <= 0) & (bhi >= 0)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        lo, hi = _corners(np.divide, alo, ahi, blo, bhi)
        lo, hi = _widen(lo, hi)
        lo, hi = self.round_result("div", v, lo, hi, (alo, ahi), (blo, bhi))
    if np.any(zero):
        n = int(np.count_nonzero(np.broadcast_to(zero, np.shape(lo))))
        self.note("division-by-zero-interval", "a divisor interval contains 0: those elements "
                  "are unbounded", n)
        lo = np.where(zero, -np.inf, lo)
        hi = np.where(zero, np.inf, hi)
    return self.new(v, lo, hi, un)


@_rule("fma")
def _fma(self, prim, a, b, c):
    v = self.value_of(prim, (a, b, c), {})
    dt = np.asarray(concrete(v)).dtype
    alo, ahi, au, _ = self.bounds(a, dt)
    blo, bhi, bu, _ = self.bounds(b, dt)
    clo, chi, cu, _ = self.bounds(c, dt)
    plo, phi = _mul_bounds(alo, ahi, blo, bhi)
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = _widen(plo + clo, phi + chi)
        lo, hi = self.round_result("fma", v, lo, hi, (alo, ahi), (blo, bhi), (clo, chi))
    return self.new(v, lo, hi, _or_unstable(au, bu, cu))


def _exact_int(self, prim, v, lo, hi, u, pt):
    """The tracer of an exact op's bounds; an integer result goes through the dtype's range
    check (``-INT_MIN`` and ``abs(INT_MIN)`` wrap around in NumPy)."""
    dt = np.asarray(concrete(v)).dtype
    if dt.kind in "iu":
        lo, hi = self._integer_bounds(prim.name, dt, lo, hi)
        pt = pt and bool(np.array_equal(lo, hi))
    return self.new(v, lo, hi, u, pt)


@_rule("neg")
def _neg(self, prim, a):
    v = self.value_of(prim, (a,), {})
    lo, hi, u, pt = self.bounds(a)
    return _exact_int(self, prim, v, -hi, -lo, u, pt)


@_rule("abs")
def _abs(self, prim, a):
    v = self.value_of(prim, (a,), {})
    lo, hi, u, pt = self.bounds(a)
    nlo = np.where(lo >= 0, lo, np.where(hi <= 0, -hi, 0.0))
    nhi = np.maximum(np.abs(lo), np.abs(hi))
    nlo = np.where(np.isnan(lo) | np.isnan(hi), np.nan, nlo)
    return _exact_int(self, prim, v, nlo, nhi, u, pt)


@_rule("max", "min")
def _max_min(self, prim, a, b):
    if prim.name == "max" and self.branches == "hull":
        # max(x, c) of a pending bound and a constant c (ReLU): in the producer's pass
        x, c = (a, b) if self._own(a) else (b, a)
        if self._own(x) and x._pending is not None and not self._own(c) and np.ndim(c) == 0:
            v = self.value_of(prim, (a, b), {})
            if np.shape(concrete(v)) == np.shape(concrete(x.primal)):
                clo = self.bounds(c, np.asarray(concrete(v)).dtype)[0]
                if not np.isnan(clo):      # still pending (a centred GEMM's: _left_factor)
                    p, c = x._pending, float(clo)
                    pending = (p.floored(c, v) if isinstance(p, _CentredBounds) else
                               lambda c2: p(max(c, c2)))
                    return self.new_pending(v, pending, x.unstable)
    v, (alo, ahi), (blo, bhi), un, pt = _binary_prep(self, prim, a, b)
    f = np.maximum if prim.name == "max" else np.minimum
    if self.branches == "concrete":  # RENDER: follow the operand the program chose
        va = _as_f64(self.primal_of(a))
        pick_a = (va == _as_f64(concrete(v)))
        lo, hi = np.where(pick_a, alo, blo), np.where(pick_a, ahi, bhi)
    else:
        lo, hi = f(alo, blo), f(ahi, bhi)   # exact: max/min are continuous
    return self.new(v, lo, hi, un, pt)


def _monotone(f, prim_name, increasing=True, domain=None, image=None):
    """``domain``: the lower end of f's domain (sqrt, log, ...). An input interval that
    straddles it has executions that give NaN, which no bound can express and which a
    comparison must not decide on (NaN > x is False): its lower bound stays NaN (no claim;
    clamping it to the domain let ``where`` pick a branch that a NaN execution does not take),
    the element is marked unstable and an event is recorded. ``image``: (lo, hi) that every
    result lies in -- f's range, whose ends are floats, so rounding keeps results inside --
    and the bound is cut to it: the absolute (subnormal) error term gave exp a lower bound
    of -2^-149, and a sum of such exps a negative one whose log was NaN."""
    def rule(self, prim, a):
        v = self.value_of(prim, (a,), {})
        lo, hi, u, pt = self.bounds(a)
        if domain is not None:
            with np.errstate(invalid="ignore"):
                cut = (lo < domain) & (hi >= domain)
            if np.any(cut):
                self.note("domain", f"{prim_name}: an input interval reaches below {domain:g} "
                          "(NaN possible there)", int(np.count_nonzero(cut)))
                u = _or_unstable(u, cut)
        with np.errstate(all="ignore"):
            flo, fhi = f(lo), f(hi)
            if not increasing:
                flo, fhi = fhi, flo
            flo, fhi = self.round_result(prim_name, v, flo, fhi, (lo, hi), steps=_LIBM64_ULPS)
            if image is not None:                   # (NaN stays NaN)
                flo, fhi = np.maximum(flo, image[0]), np.minimum(fhi, image[1])
        return self.new(v, flo, fhi, u)
    return rule


_DOMAIN = {"log": 0.0, "log2": 0.0, "sqrt": 0.0, "log1p": -1.0}
_IMAGE = {"exp": (0.0, np.inf), "exp2": (0.0, np.inf), "expm1": (-1.0, np.inf),
          "sqrt": (0.0, np.inf), "tanh": (-1.0, 1.0), "erf": (-1.0, 1.0)}
for _n, _f in {"exp": np.exp, "expm1": np.expm1, "exp2": np.exp2, "log": np.log,
               "log1p": np.log1p, "log2": np.log2, "sqrt": np.sqrt, "tanh": np.tanh,
               "sinh": np.sinh, "atan": np.arctan}.items():
    IntervalInterpreter.rules[_n] = _monotone(_f, _n, domain=_DOMAIN.get(_n),
                                              image=_IMAGE.get(_n))


def _erf64(x):
    from fpx.kernels.elementwise import erf
    return erf(np.asarray(x, np.float64))


IntervalInterpreter.rules["erf"] = _monotone(_erf64, "erf", image=_IMAGE["erf"])


@_rule("cosh")
def _cosh(self, prim, a):
    v = self.value_of(prim, (a,), {})
    lo, hi, u, _ = self.bounds(a)
    with np.errstate(all="ignore"):
        clo, chi = np.cosh(lo), np.cosh(hi)
        flo = np.where((lo <= 0) & (hi >= 0), 1.0, np.minimum(clo, chi))
        fhi = np.maximum(clo, chi)
        flo, fhi = _widen(flo, fhi, _LIBM64_ULPS)
        flo, fhi = self.round_result("cosh", v, flo, fhi, (lo, hi))
    return self.new(v, flo, fhi, u)


def _periodic_contains(lo, hi, phase, period):
    """Does [lo, hi] (possibly) contain a point phase + k·period? Conservative: a tolerance
    covers the float64 error of the reduction (|x|·2^-50 plus π's representation error)."""
    with np.errstate(all="ignore"):
        tol = (np.maximum(np.abs(lo), np.abs(hi)) / period + 1.0) * 2.0 ** -48
        klo = np.ceil((lo - phase) / period - tol)
        khi = np.floor((hi - phase) / period + tol)
    return klo <= khi


def _trig(kind):
    f = {"sin": np.sin, "cos": np.cos, "tan": np.tan}[kind]

    def rule(self, prim, a):
        v = self.value_of(prim, (a,), {})
        lo, hi, u, _ = self.bounds(a)
        with np.errstate(all="ignore"):
            flo, fhi = f(lo), f(hi)
            big = ~((hi - lo) < 2 * np.pi) | ~(np.maximum(np.abs(lo), np.abs(hi)) < 2.0 ** 40)
            if kind == "tan":
                pole = _periodic_contains(lo, hi, np.pi / 2, np.pi) | big
                rlo, rhi = np.where(pole, -np.inf, flo), np.where(pole, np.inf, fhi)
                rlo, rhi = _widen(rlo, rhi, _LIBM64_ULPS)
            else:
                top = (np.pi / 2, 0.0)[kind == "cos"]
                bot = (-np.pi / 2, np.pi)[kind == "cos"]
                has_max = _periodic_contains(lo, hi, top, 2 * np.pi) | big
                has_min = _periodic_contains(lo, hi, bot, 2 * np.pi) | big
                rlo, rhi = _widen(np.minimum(flo, fhi), np.maximum(flo, fhi), _LIBM64_ULPS)
                rhi = np.where(has_max, 1.0, np.minimum(rhi, 1.0))
                rlo = np.where(has_min, -1.0, np.maximum(rlo, -1.0))
            nan = np.isnan(lo) | np.isnan(hi) | np.isinf(lo) | np.isinf(hi)
            rlo, rhi = np.where(nan, np.nan, rlo), np.where(nan, np.nan, rhi)
            rlo, rhi = self.round_result(kind, v, rlo, rhi, (lo, hi))
        return self.new(v, rlo, rhi, u)
    return rule


for _n in ("sin", "cos", "tan"):
    IntervalInterpreter.rules[_n] = _trig(_n)


@_rule("atan2")
def _atan2(self, prim, y, x):
    v, (ylo, yhi), (xlo, xhi), un, _ = _binary_prep(self, prim, y, x)
    with np.errstate(all="ignore"):
        lo, hi = _corners(np.arctan2, ylo, yhi, xlo, xhi)
        # the box touches the branch cut (x <= 0, y straddling 0) or the origin: full range
        cut = (xlo <= 0) & (ylo <= 0) & (yhi >= 0)
        lo, hi = np.where(cut, -np.pi, lo), np.where(cut, np.pi, hi)
        lo, hi = _widen(lo, hi, _LIBM64_ULPS)
        lo, hi = self.round_result("atan2", v, lo, hi, (ylo, yhi), (xlo, xhi))
    jump = cut & ~((ylo == yhi) & (xlo == xhi))
    if np.any(jump):
        # the sign of y (a zero's sign included) decides between +pi and -pi: a discontinuity
        # round-off can flip, like floor/sign (unstable), reported so that a verdict resting
        # on the whole [-pi, pi] says so
        self.note("branch-cut", "atan2(y, x) with x <= 0 and y's bound straddling 0: the "
                  "result may jump between +pi and -pi (bound: the whole [-pi, pi])",
                  int(np.count_nonzero(jump)))
        un = _or_unstable(un, jump)
    return self.new(v, lo, hi, un)


@_rule("pow")
def _pow(self, prim, a, b):
    v, (alo, ahi), (blo, bhi), un, _ = _binary_prep(self, prim, a, b)
    with np.errstate(all="ignore"):
        lo, hi = _corners(np.power, alo, ahi, blo, bhi)
        # base > 0: pow is monotone in each argument, so the corners bound the box.
        # base may be <= 0: exact only for a point integer exponent (parity), else undefined.
        neg = alo <= 0
        bint = (blo == bhi) & (np.floor(blo) == blo)
        n = blo
        even = bint & (np.mod(n, 2) == 0)
        straddle = (alo < 0) & (ahi > 0)
        mag = np.maximum(np.abs(alo), np.abs(ahi))
        with_zero = (alo <= 0) & (ahi >= 0)
        # integer n >= 0 through zero: even -> [0, mag^n] ; odd -> monotone corners (already)
        lo = np.where(neg & bint & (n > 0) & even & straddle, 0.0, lo)
        hi = np.where(neg & bint & (n > 0) & even & straddle, np.power(mag, n), hi)
        # negative integer exponent with zero in the base: a pole
        pole = neg & bint & (n < 0) & with_zero
        lo, hi = np.where(pole, -np.inf, lo), np.where(pole, np.inf, hi)
        undefined = neg & ~bint & (alo < 0)
        lo, hi = np.where(undefined, np.nan, lo), np.where(undefined, np.nan, hi)
        lo, hi = _widen(lo, hi, _LIBM64_ULPS)
        lo, hi = self.round_result("pow", v, lo, hi, (alo, ahi), (blo, bhi))
    return self.new(v, lo, hi, un)


def _step_rule(f):
    """floor/ceil/round/sign: monotone, exact, discontinuous (unstable where the ends differ)."""
    def rule(self, prim, a):
        v = self.value_of(prim, (a,), {})
        lo, hi, u, pt = self.bounds(a)
        flo, fhi = f(lo), f(hi)
        jump = flo != fhi
        return self.new(v, flo, fhi, _or_unstable(u, jump if np.any(jump) else None), pt)
    return rule


IntervalInterpreter.rules.update({"floor": _step_rule(np.floor), "ceil": _step_rule(np.ceil),
                                  "round": _step_rule(np.rint), "sign": _step_rule(np.sign)})


def _exact_floor_quotients(dt, alo, ahi, blo, bhi, qlo, qhi):
    """(lo, hi, ok): floor(a/b) over the box from the corners' exact floor quotients, where
    that is what every execution gives (``ok``). floor is monotone and a/b monotone in each
    argument away from b = 0, so the range is [min, max] of the corners' floor(a/b). NumPy's
    float floor_divide (npy_divmod) computes div = (a - fmod(a, b))/b -- two roundings of the
    integer k = trunc(a/b), so |div - k| <= 2.0001·u·|k| < 1/2 for |k| < 2^(p-3) -- then
    floors it and rounds back up past .5: floor(a/b) exactly there (float64 ends: below
    2^50). Integer dtypes divide exactly; float ones in their own format's p."""
    F = None if dt.kind in "iub" else _fmt_of(dt)
    if dt.kind not in "iub" and F is None:
        return None
    lim = 2.0 ** (min(F.p if F is not None else 53, 53) - 3)
    flo, fhi = _corners(np.floor_divide, alo, ahi, blo, bhi)
    big = np.maximum(np.maximum(np.abs(alo), np.abs(ahi)), np.maximum(np.abs(blo), np.abs(bhi)))
    ok = ((np.maximum(np.abs(qlo), np.abs(qhi)) < lim) & (big < 2.0 ** 53)
          & ((blo > 0) | (bhi < 0)) & np.isfinite(flo) & np.isfinite(fhi))
    return flo, fhi, ok


@_rule("floor_divide")
def _floor_divide(self, prim, a, b):
    """Exact where every execution is (``_exact_floor_quotients``): a point integer quotient
    has zero width. Elsewhere (a float program's large quotients) the floor of the widened
    float64 quotient, one step and 4u·|q| more each way: npy_divmod's div = (a - fmod)/b is
    within 2u·|k| of k = trunc(a/b), its floor corrected past .5 is within 1 of that, and a
    float16 result is rounded once more from float32 (it had been only one step: a float16
    16358.3 // 1 is 16360)."""
    v, (alo, ahi), (blo, bhi), un, _ = _binary_prep(self, prim, a, b)
    zero = (blo <= 0) & (bhi >= 0)
    dt = np.asarray(concrete(v)).dtype
    F = None if dt.kind in "iub" else _fmt_of(dt)
    u = 2.0 ** -(F.p if F is not None else 53)
    with np.errstate(all="ignore"):
        qlo, qhi = _corners(np.divide, alo, ahi, blo, bhi)
        qlo, qhi = _widen(qlo, qhi)
        lo, hi = _widen(np.floor(qlo) - 1 - 4 * u * np.abs(qlo),
                        np.floor(qhi) + 1 + 4 * u * np.abs(qhi))
        exact = _exact_floor_quotients(dt, alo, ahi, blo, bhi, qlo, qhi)
        if exact is not None:
            lo, hi = np.where(exact[2], exact[0], lo), np.where(exact[2], exact[1], hi)
    lo, hi = np.where(zero, -np.inf, lo), np.where(zero, np.inf, hi)
    unstable = _or_unstable(un, lo != hi)
    if dt.kind in "iu":          # INT_MIN // -1 wraps around
        lo, hi = self._integer_bounds("floor_divide", dt, lo, hi)
    return self.new(v, lo, hi, unstable)


@_rule("remainder")
def _remainder(self, prim, a, b):
    """The sign of b's range: [0, b) or (b, 0]. For integers, where floor(a/b) is one q over
    the box (``_exact_floor_quotients``), a - q·b exactly (its corners), within that range:
    a point integer remainder has zero width."""
    v, (alo, ahi), (blo, bhi), un, _ = _binary_prep(self, prim, a, b)
    pos, neg = blo > 0, bhi < 0
    lo = np.where(pos, 0.0, np.where(neg, blo, -np.inf))
    hi = np.where(pos, bhi, np.where(neg, 0.0, np.inf))
    dt = np.asarray(concrete(v)).dtype
    if dt.kind in "iu":
        with np.errstate(all="ignore"):
            qlo, qhi = _widen(*_corners(np.divide, alo, ahi, blo, bhi))
            exact = _exact_floor_quotients(dt, alo, ahi, blo, bhi, qlo, qhi)
            if exact is not None:
                q = exact[0]
                one = exact[2] & (exact[0] == exact[1])
                # a - q·b is linear in a and b: its range is at its corners; below 2^53 exact
                rlo = np.minimum(alo - q * blo, alo - q * bhi)
                rhi = np.maximum(ahi - q * blo, ahi - q * bhi)
                one &= (np.maximum(np.abs(rlo), np.abs(rhi)) < 2.0 ** 53)
                lo = np.where(one, np.maximum(lo, rlo), lo)
                hi = np.where(one, np.minimum(hi, rhi), hi)
    return self.new(v, lo, hi, un)


# =============================================================================================
# Comparisons, logic, selection (branches)
# =============================================================================================
def _bool_interval(certain, possible):
    lo = certain.astype(np.float64)
    hi = possible.astype(np.float64)
    return lo, hi, lo != hi


@_rule("lt", "le", "gt", "ge", "eq", "ne")
def _compare(self, prim, a, b):
    v = self.value_of(prim, (a, b), {})
    # comparisons compare in the promoted dtype of the operands (weak Python scalars follow)
    try:
        pdt = np.result_type(*[p if isinstance(p, (bool, int, float)) else np.asarray(p).dtype
                               for p in map(self.primal_of, (a, b))])
    except TypeError:   # e.g. bfloat16 vs float16: no common dtype, but NumPy has a loop
        pdt = None      # (two arrays: no weak scalar to convert)
    alo, ahi, au, _ = self.bounds(a, pdt)
    blo, bhi, bu, _ = self.bounds(b, pdt)
    n = prim.name
    with np.errstate(invalid="ignore"):
        if n in ("lt", "gt"):
            if n == "gt":
                alo, ahi, blo, bhi = blo, bhi, alo, ahi
            certain, possible = ahi < blo, alo < bhi
        elif n in ("le", "ge"):
            if n == "ge":
                alo, ahi, blo, bhi = blo, bhi, alo, ahi
            certain, possible = ahi <= blo, alo <= bhi
        elif n == "eq":
            certain = (alo == ahi) & (blo == bhi) & (alo == blo)
            possible = (alo <= bhi) & (blo <= ahi)
        else:
            possible = ~((alo == ahi) & (blo == bhi) & (alo == blo))
            certain = (ahi < blo) | (bhi < alo)
    nan = _any_nan(alo, ahi, blo, bhi)
    certain, possible = certain & ~nan, possible | nan
    lo, hi, unst = _bool_interval(certain, possible)
    return self.new(v, lo, hi, _or_unstable(au, bu, unst if np.any(unst) else None))


@_rule("logical_and", "logical_or", "logical_xor")
def _logic2(self, prim, a, b):
    v, (alo, ahi), (blo, bhi), un, pt = _binary_prep(self, prim, a, b)
    A0, A1, B0, B1 = alo != 0, ahi != 0, blo != 0, bhi != 0   # certain / possible truth
    if prim.name == "logical_and":
        certain, possible = A0 & B0, A1 & B1
    elif prim.name == "logical_or":
        certain, possible = A0 | B0, A1 | B1
    else:
        undecided = (A0 != A1) | (B0 != B1)
        val = A0 != B0
        certain, possible = val & ~undecided, val | undecided
    lo, hi, unst = _bool_interval(certain, possible)
    return self.new(v, lo, hi, _or_unstable(un, unst if np.any(unst) else None), pt)


@_rule("logical_not")
def _logic_not(self, prim, a):
    v = self.value_of(prim, (a,), {})
    lo, hi, u, pt = self.bounds(a)
    certain, possible = hi == 0, lo == 0     # certainly false input -> certainly true
    nlo, nhi, unst = _bool_interval(certain, possible)
    return self.new(v, nlo, nhi, _or_unstable(u, unst if np.any(unst) else None), pt)


@_rule("isnan", "isinf", "isfinite")
def _isclass(self, prim, a):
    v = self.value_of(prim, (a,), {})
    lo, hi, u, pt = self.bounds(a)
    nan = np.isnan(lo) | np.isnan(hi)
    finite = np.isfinite(lo) & np.isfinite(hi)
    point_inf = (lo == hi) & np.isinf(lo)
    if prim.name == "isnan":
        certain, possible = np.zeros_like(finite), ~finite
    elif prim.name == "isinf":
        certain, possible = point_inf, ~finite & ~nan | nan
    else:
        certain, possible = finite, ~point_inf
    nlo, nhi, unst = _bool_interval(certain, possible)
    return self.new(v, nlo, nhi, _or_unstable(u, unst if np.any(unst) else None), pt)


@_rule("where")
def _where(self, prim, c, x, y):
    v = self.value_of(prim, (c, x, y), {})
    dt = np.asarray(concrete(v)).dtype
    clo, chi, cu, _ = self.bounds(c)
    xlo, xhi, xu, xp = self.bounds(x, dt)
    ylo, yhi, yu, yp = self.bounds(y, dt)
    sure_t, sure_f = clo != 0, chi == 0
    if cu is None and (np.all(sure_f) or np.all(sure_t)):
        # every condition decided the same way (a mask with nothing masked): that side's
        # bounds as they are (read-only views where they broadcast)
        lo, hi, u, p = (ylo, yhi, yu, yp) if np.all(sure_f) else (xlo, xhi, xu, xp)
        shape = np.shape(concrete(v))
        if np.shape(lo) != shape:
            lo, hi = np.broadcast_to(lo, shape), np.broadcast_to(hi, shape)
        if u is not None and np.shape(u) != shape:
            u = np.broadcast_to(u, shape)
        return self.new(v, lo, hi, u, p)
    if self.branches == "concrete":
        take = _as_f64(self.primal_of(c)) != 0
        lo, hi = np.where(take, xlo, ylo), np.where(take, xhi, yhi)
    else:
        lo = np.where(sure_t, xlo, np.where(sure_f, ylo, np.minimum(xlo, ylo)))
        hi = np.where(sure_t, xhi, np.where(sure_f, yhi, np.maximum(xhi, yhi)))
    undecided = ~(sure_t | sure_f)
    un = _or_unstable(cu, xu, yu, undecided if np.any(undecided) else None)
    # a point only if both sides are and every condition is decided (an undecided one hulls
    # both sides: lo < hi there, and matmul would drop that radius for a "point" operand)
    pt = xp and yp and (self.branches == "concrete" or not np.any(undecided))
    return self.new(v, lo, hi, None if un is None else np.broadcast_to(un, np.shape(lo)), pt)


# =============================================================================================
# Casts
# =============================================================================================
def _contains_format(big, small):
    return big.p >= small.p and big.emin <= small.emin and big.emax >= small.emax


@_rule("cast")
def _cast(self, prim, a, *, to):
    v = self.value_of(prim, (a,), {"to": to})
    lo, hi, u, pt = self.bounds(a)
    src = _fmt_of(np.asarray(self.primal_of(a)).dtype)
    if isinstance(to, _formats.Format):
        if src is not None and _contains_format(to, src):
            return self.new(v, lo, hi, u, pt)            # widening cast: exact
        with np.errstate(all="ignore"):
            if to.dtype in (_formats.bfloat16.dtype, _formats.float8_e4m3fn.dtype,
                            _formats.float8_e5m2.dtype) and (src is None or src.p > 24):
                # NumPy/ml_dtypes convert wider values through float32: two roundings
                lo, hi = _round_bounds(lo, hi, _formats.float32,
                                       self.accuracy("cast", _formats.float32))
            lo, hi = _round_bounds(lo, hi, to, self.accuracy("cast", to))
        return self.new(v, lo, hi, u)
    dt = np.dtype(to)
    if dt.kind == "b":
        certain, possible = ~((lo <= 0) & (hi >= 0)), ~((lo == 0) & (hi == 0))
        nlo, nhi, unst = _bool_interval(certain, possible)
        return self.new(v, nlo, nhi, _or_unstable(u, unst if np.any(unst) else None), pt)
    with np.errstate(all="ignore"):
        tlo, thi = np.trunc(lo), np.trunc(hi)   # float -> int truncates toward zero
        jump = (tlo != thi) | np.isnan(tlo) | np.isnan(thi)
        # out of the target's range NumPy's conversion is undefined (wraps, or INT_MIN)
        tlo, thi = self._integer_bounds("cast", dt, tlo, thi)
    return self.new(v, tlo, thi, _or_unstable(u, jump if np.any(jump) else None),
                    pt and not np.any(jump) and bool(np.array_equal(tlo, thi)))


# =============================================================================================
# Movement: the same exact movement on value, lo, hi, unstable
# =============================================================================================
def _movement(apply):
    def rule(self, prim, *args, **params):
        v = self.value_of(prim, args, params)
        x = args[0]
        if (prim.name in ("reshape", "transpose", "getitem") and self._own(x)
                and isinstance(x._pending, _CentredBounds)):     # stays pending, moved
            nd, shape = np.ndim(concrete(v)), np.shape(concrete(x.primal))
            keeps = (params["axes"][-1] % nd == nd - 1 if prim.name == "transpose" else
                     shape[-1:] == np.shape(concrete(v))[-1:] if prim.name == "reshape"
                     else False)       # (reshape: row-major, k mod n; getitem: not known)
            moved = x._pending.moved(lambda z: apply(prim, [z], params), v, keeps)
            if moved is not None:
                return self.new_pending(v, moved)
        dt = np.asarray(concrete(v)).dtype
        bs = [self.bounds(x, dt) for x in args]
        lo = apply(prim, [b[0] for b in bs], params)
        hi = apply(prim, [b[1] for b in bs], params)
        if any(b[2] is not None for b in bs):
            us = [b[2] if b[2] is not None else np.zeros(np.shape(b[0]), bool) for b in bs]
            un = apply(prim, us, params, fill=False)
        else:
            un = None
        return self.new(v, lo, hi, un, all(b[3] for b in bs))
    return rule


def _apply_np(prim, arrs, params, fill=None):
    n = prim.name
    if n == "reshape":
        return _blas.reshape(arrs[0], params["shape"])
    if n == "transpose":
        return np.transpose(arrs[0], params["axes"])
    if n == "broadcast_to":
        return np.broadcast_to(arrs[0], params["shape"])
    if n == "getitem":
        return arrs[0][params["index"]]
    if n == "concatenate":
        return np.concatenate([np.asarray(a) for a in arrs], axis=params["axis"])
    if n == "pad":
        val = False if fill is False else float(np.float64(params["value"]))
        return np.pad(arrs[0], params["pad_width"], mode="constant", constant_values=val)
    raise AssertionError(n)


for _n in ("reshape", "transpose", "broadcast_to", "getitem", "concatenate", "pad"):
    IntervalInterpreter.rules[_n] = _movement(_apply_np)


# =============================================================================================
# Reductions
# =============================================================================================
def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        return tuple(a % ndim for a in axis)
    return (axis % ndim,)


def _count(shape, axis):
    n = 1
    for ax in _axes(axis, len(shape)):
        n *= shape[ax]
    return n


def _acc_delta(self, prim_name, fmt):
    """Relative error bound of one addition in format fmt: ulps·2^(1-p)."""
    acc = self.accuracy(prim_name, fmt)
    return math.inf if acc.input_dependent else acc.ulps * 2.0 ** (1 - fmt.p)


@_rule("reduce_sum")
def _reduce_sum(self, prim, a, *, axis=None, keepdims=False, dtype=None):
    v = self.value_of(prim, (a,), {"axis": axis, "keepdims": keepdims, "dtype": dtype})
    lo, hi, u, pt = self.bounds(a)
    out_dt = np.asarray(concrete(v)).dtype
    n = _count(np.shape(lo), axis)
    F_out = _fmt_of(out_dt)
    with np.errstate(all="ignore"):
        mid, rad = (lo + hi) / 2, (hi - lo) / 2          # rad rounded: widened below
        mag = np.maximum(np.abs(lo), np.abs(hi))
        s_mid = np.sum(mid, axis=axis, keepdims=keepdims)
        s_rad = np.sum(rad, axis=axis, keepdims=keepdims)
        s_mag = np.sum(mag, axis=axis, keepdims=keepdims)
        g64 = _gamma(n + 2, 2.0 ** -53)
        r = _up(s_rad * (1 + g64) + g64 * s_mag + np.abs(s_mid) * 2 * _E64, 4)
        if F_out is not None:
            prec = self.resolve("reduce_sum", np.dtype(dtype) if dtype is not None
                                       else out_dt)
            Facc = prec.accumulate
            c = self.sum_gamma(max(n - 1, 0), _acc_delta(self, "reduce_sum", Facc),
                               self.accuracy("reduce_sum", Facc).ulps == 0.5)
            cm = self.partial_sum_gamma(max(n - 1, 0), _acc_delta(self, "reduce_sum", Facc))
            if cm < math.inf:   # through the partial sums, where tighter (cancelling terms)
                s_part = np.maximum(np.sum(np.maximum(hi, 0.0), axis=axis, keepdims=keepdims),
                                    np.sum(np.maximum(-lo, 0.0), axis=axis, keepdims=keepdims))
                r = r + _up(np.minimum(c * s_mag, cm * s_part) * (1 + g64), 3)
            else:
                r = r + _up(c * s_mag * (1 + g64), 3)
            lo2, hi2 = _widen(s_mid - r, s_mid + r, 1)
            lo2, hi2 = _acc_guard(lo2, hi2, s_mag, c, Facc, lambda: np.any(
                np.isnan(lo) | np.isnan(hi), axis=axis, keepdims=keepdims))
            lo2, hi2 = _to_output(self, lo2, hi2, Facc, F_out)
            # a floating-point sum of nonnegative terms is nonnegative in any order (rounding
            # is monotone): keeps sum(x*x) + eps away from a NaN sqrt in variances
            nonneg = np.all(lo >= 0, axis=axis, keepdims=keepdims)
            if np.any(nonneg):
                lo2 = np.where(nonneg & (lo2 < 0), 0.0, lo2)
        else:
            lo2, hi2 = np.sum(lo, axis=axis, keepdims=keepdims), np.sum(hi, axis=axis, keepdims=keepdims)
    un = None if u is None else np.any(u, axis=axis, keepdims=keepdims)
    return self.new(v, lo2, hi2, un, pt and n <= 1)


def _acc_guard(lo, hi, mag, c, F_acc, nan_in):
    """Where the terms' magnitudes (sum ``mag``, with rounding ``c``) pass the accumulator's
    largest finite value, some partial sum may overflow: the result may be ±inf whatever the
    final sum is. NaN bounds from inf - inf in the float64 bound arithmetic, where no term's
    bound is NaN (``nan_in()``, evaluated only then), mean "unbounded", not "undefined"."""
    with np.errstate(all="ignore"):
        over = _up(mag * (1.0 + c), 2) > F_acc.max
    bad = np.isnan(lo) | np.isnan(hi)
    if np.any(bad):
        over = over | (bad & ~nan_in())
    if np.any(over):
        lo, hi = np.where(over, -np.inf, lo), np.where(over, np.inf, hi)
    return lo, hi


def _to_output(self, lo, hi, F_acc, F_out):
    """Round an accumulator's bounds into the output format (or only apply its overflow)."""
    if F_out.name != F_acc.name:
        return _round_bounds(lo, hi, F_out, self.accuracy("cast", F_out))
    if F_out.name != "float64":
        return _overflow(lo, hi, F_out)
    return lo, hi


@_rule("cumsum")
def _cumsum(self, prim, a, *, axis, dtype=None):
    v = self.value_of(prim, (a,), {"axis": axis, "dtype": dtype})
    lo, hi, u, pt = self.bounds(a)
    out_dt = np.asarray(concrete(v)).dtype
    F_out = _fmt_of(out_dt)
    ax = axis % max(np.ndim(lo), 1)
    n = np.shape(lo)[ax] if np.ndim(lo) else 1
    with np.errstate(all="ignore"):
        mid, rad = (lo + hi) / 2, (hi - lo) / 2
        mag = np.maximum(np.abs(lo), np.abs(hi))
        c_mid = np.cumsum(mid, axis=ax)
        c_rad = np.cumsum(rad, axis=ax)
        c_mag = np.cumsum(mag, axis=ax)
        shape = [1] * np.ndim(lo)
        if shape:
            shape[ax] = n
        k = np.arange(1, n + 1, dtype=np.float64).reshape(shape)     # terms in each prefix
        g64 = (k + 2) * 2.0 ** -53 / (1 - (k + 2) * 2.0 ** -53)
        r = _up(c_rad * (1 + g64) + g64 * c_mag + np.abs(c_mid) * 2 * _E64, 4)
        if F_out is not None:
            Facc = self.resolve("cumsum", np.dtype(dtype) if dtype is not None else out_dt).accumulate
            d = _acc_delta(self, "cumsum", Facc)
            km1 = k - 1
            c = np.where(km1 * d < 1, km1 * d / (1 - km1 * d), np.inf) if self.bound == "rigorous" \
                else np.vectorize(lambda m: self.gamma(int(m), d))(km1)
            if self.bound == "rigorous":   # partial sums lie in [-N, P] (partial_sum_gamma)
                c_part = np.maximum(np.cumsum(np.maximum(hi, 0.0), axis=ax),
                                    np.cumsum(np.maximum(-lo, 0.0), axis=ax))
                r = r + _up(c * np.minimum(c_mag, c_part) * (1 + g64), 4)
            else:
                r = r + _up(c * c_mag * (1 + g64), 3)
        lo2, hi2 = _widen(c_mid - r, c_mid + r, 1)
        if F_out is not None:   # the accumulator's overflow, then its rounding to the output
            lo2, hi2 = _acc_guard(lo2, hi2, c_mag, c, Facc, lambda: np.logical_or.accumulate(
                np.isnan(lo) | np.isnan(hi), axis=ax))
            lo2, hi2 = _to_output(self, lo2, hi2, Facc, F_out)
    un = None if u is None else np.logical_or.accumulate(u, axis=ax)
    return self.new(v, lo2, hi2, un)


@_rule("reduce_prod")
def _reduce_prod(self, prim, a, *, axis=None, keepdims=False, dtype=None):
    v = self.value_of(prim, (a,), {"axis": axis, "keepdims": keepdims, "dtype": dtype})
    lo, hi, u, _ = self.bounds(a)
    axes = _axes(axis, np.ndim(lo))
    n = _count(np.shape(lo), axis)
    # move reduced axes last and flatten them, then multiply intervals pairwise (tree)
    keep = [i for i in range(np.ndim(lo)) if i not in axes]
    L = np.transpose(lo, keep + list(axes)).reshape([np.shape(lo)[i] for i in keep] + [-1])
    H = np.transpose(hi, keep + list(axes)).reshape(L.shape)
    while L.shape[-1] > 1:
        if L.shape[-1] % 2:
            L = np.concatenate([L, np.ones(L.shape[:-1] + (1,))], -1)
            H = np.concatenate([H, np.ones(H.shape[:-1] + (1,))], -1)
        L, H = _mul_bounds(L[..., 0::2], H[..., 0::2], L[..., 1::2], H[..., 1::2])
    L, H = L[..., 0], H[..., 0]
    if keepdims:
        shp = [1 if i in axes else s for i, s in enumerate(np.shape(lo))]
        L, H = L.reshape(shp), H.reshape(shp)
    F = _fmt_of(np.asarray(concrete(v)).dtype)
    if F is not None:
        d = _acc_delta(self, "reduce_prod", self.resolve(
            "reduce_prod", np.asarray(concrete(v)).dtype).accumulate)
        g = self.gamma(max(n - 1, 0), d)
        mag = np.maximum(np.abs(L), np.abs(H))
        with np.errstate(all="ignore"):
            e = _up(g * mag, 2) + n * F.smallest_subnormal
            L, H = _widen(L - e, H + e, 1)
            L, H = _overflow(L, H, F)
    un = None if u is None else np.any(u, axis=axis, keepdims=keepdims)
    return self.new(v, L, H, un)


@_rule("reduce_max", "reduce_min")
def _reduce_maxmin(self, prim, a, *, axis=None, keepdims=False):
    v = self.value_of(prim, (a,), {"axis": axis, "keepdims": keepdims})
    lo, hi, u, pt = self.bounds(a)
    f = np.max if prim.name == "reduce_max" else np.min
    un = None if u is None else np.any(u, axis=axis, keepdims=keepdims)
    return self.new(v, f(lo, axis=axis, keepdims=keepdims), f(hi, axis=axis, keepdims=keepdims),
                    un, pt)


@_rule("argmax", "argmin")
def _argmaxmin(self, prim, a, *, axis=None, keepdims=False):
    """The index bound spans every candidate: elements whose interval reaches the extremum's
    lower end (first to last candidate); unstable where there is more than one."""
    v = self.value_of(prim, (a,), {"axis": axis, "keepdims": keepdims})
    lo, hi, u, _ = self.bounds(a)
    if prim.name == "argmin":
        lo, hi = -hi, -lo
    L = lo.ravel() if axis is None else lo
    H = hi.ravel() if axis is None else hi
    ax = -1 if axis is None else axis
    with np.errstate(invalid="ignore"):
        cand = H >= np.max(L, axis=ax, keepdims=True)
    nan = np.any(np.isnan(L) | np.isnan(H), axis=ax, keepdims=keepdims)
    n = L.shape[ax] if np.ndim(L) else 1
    first = np.argmax(cand, axis=ax, keepdims=keepdims).astype(np.float64)
    last = (n - 1 - np.argmax(np.flip(cand, axis=ax), axis=ax, keepdims=keepdims)).astype(np.float64)
    first, last = np.where(nan, 0.0, first), np.where(nan, n - 1.0, last)
    unst = (first != last)
    un = _or_unstable(None if u is None else np.any(u, axis=axis, keepdims=keepdims),
                      unst if np.any(unst) else None)
    return self.new(v, first, last, un)


@_rule("sort")
def _sort(self, prim, a, *, axis):
    """Sorting is exact, and the k-th smallest element is nondecreasing in every input, so
    over a box it lies in [k-th smallest lo, k-th smallest hi]: the ends sorted separately.
    A row with a NaN end (an unknown element, anywhere in the order) is NaN throughout."""
    v = self.value_of(prim, (a,), {"axis": axis})
    lo, hi, u, pt = self.bounds(a)
    xp = _xp(lo)
    slo, shi = xp.sort(lo, axis=axis), xp.sort(hi, axis=axis)
    nan = xp.any(xp.isnan(lo) | xp.isnan(hi), axis=axis, keepdims=True)
    if bool(xp.any(nan)):
        slo, shi = xp.where(nan, xp.nan, slo), xp.where(nan, xp.nan, shi)
    un = None if u is None else xp.broadcast_to(xp.any(u, axis=axis, keepdims=True), lo.shape)
    return self.new(v, slo, shi, un, pt)


@_rule("argsort")
def _argsort(self, prim, a, *, axis):
    """The index at sorted position p is certain where the element the program put there is
    strictly above every element before it and strictly below every one after it, for every
    point of the box (the largest upper end before p below its lower end, the least lower end
    after p above its upper end; ties count as uncertain: implementations break them
    differently). Elsewhere the index may be any in [0, n - 1]: that range, unstable."""
    v = self.value_of(prim, (a,), {"axis": axis})
    lo, hi, u, _ = self.bounds(a)
    xp = _xp(lo)
    idx = xp.asarray(concrete(v))
    n = lo.shape[axis]
    if lo.size == 0:
        return self.new(v, lo, hi, u)
    slo = xp.take_along_axis(lo, idx, axis=axis)
    shi = xp.take_along_axis(hi, idx, axis=axis)
    before = xp.maximum.accumulate(shi, axis=axis)          # max hi over positions <= p
    after = xp.flip(xp.minimum.accumulate(xp.flip(slo, axis), axis=axis), axis)
    pad_hi = xp.full_like(xp.take(before, xp.arange(1), axis=axis), -xp.inf)
    pad_lo = xp.full_like(xp.take(after, xp.arange(1), axis=axis), xp.inf)
    prev_hi = xp.concatenate([pad_hi, xp.take(before, xp.arange(n - 1), axis=axis)], axis)
    next_lo = xp.concatenate([xp.take(after, xp.arange(1, n), axis=axis), pad_lo], axis)
    certain = (prev_hi < slo) & (shi < next_lo)          # (NaN compares False: uncertain)
    ind = idx.astype(xp.float64)
    lo_i, hi_i = xp.where(certain, ind, 0.0), xp.where(certain, ind, n - 1.0)
    un = _or_unstable(None if u is None else xp.broadcast_to(
        xp.any(u, axis=axis, keepdims=True), lo.shape),
        None if bool(xp.all(certain)) else ~certain)
    return self.new(v, lo_i, hi_i, un)


# =============================================================================================
# Matmul: midpoint-radius with BLAS
# =============================================================================================
def _matmul_constant(self, F_in, F_prod, F_acc, K):
    """c_K = δ_p + γ_{K-1}(δ_acc)(1+δ_p): |fl(Σ a_i b_i) - Σ a_i b_i| <= c_K Σ|a_i||b_i| + abs,
    for any summation order (Higham 2002, §3.1): each product rounds once, then the sum of
    the rounded products; with round-to-nearest accumulation (δ_acc = 2^-p) γ_{K-1} improves to
    (K-1)·δ_acc (see ``sum_gamma``). The absolute (underflow) terms are the caller's."""
    exact_products = 2 * F_in.p <= F_prod.p
    d_p = 0.0 if exact_products else 2.0 ** -F_prod.p
    acc = self.accuracy("matmul", F_acc)
    d_acc = acc.ulps * 2.0 ** (1 - F_acc.p) if not acc.input_dependent else math.inf
    return d_p + self.sum_gamma(max(K - 1, 0), d_acc, acc.ulps == 0.5) * (1 + d_p)


class _Split:
    """The partial-sum form of a dot product's rounding error (``_matmul_split``):
    ``|fl(a·b) - a·b| <= α·T + β·|E|`` with T = Σ|a_i b_i|, E = Σ a_i b_i (plus the caller's
    absolute terms), and what a value-centred radius makes of it: the centre's own error e₀
    and every other execution's error, with |E| <= |s| + e₀ + ρ (s the accumulator's value, ρ
    the operands' propagated radius), sum to at most ``κ·(2α·T̂ + ρ) + cb·|v| + ab``,
    κ = (1+β)/(1-β), v the program's value (|s| <= (|v| + abs)/(1-q) through its rounding to
    the output format). (c, 0) -- the classic bound -- where the form does not apply."""
    __slots__ = ("alpha", "beta", "kappa", "cb", "ab")

    def __init__(self, alpha, beta, q=0.0, abs_out=0.0):
        self.alpha, self.beta = alpha, beta
        self.kappa = (1 + beta) / (1 - beta) * (1 + 4 * _E64) if beta else 1.0
        self.cb = 2 * self.kappa * beta / (1 - q) * (1 + 4 * _E64) if beta else 0.0
        self.ab = self.cb * abs_out * (1 + 2 * _E64)

    def scaled(self, rad):
        """A value-centred radius (R, f, a) -> κ·(R, f, a) plus the accumulator's absolute
        term (cb·|v| is the centre term of ``center_bounds``)."""
        if not self.beta:
            return rad
        R, f, a = rad
        return R, f * self.kappa * (1 + 2 * _E64), (a * self.kappa + self.ab) * (1 + 4 * _E64)


def _matmul_split(self, c, F_in, F_prod, F_acc, K, F_out=None):
    """``_Split`` for a K-term dot product: the errors of the K product roundings (δ_p each)
    and of the m = K-1 additions (δ relative to each addition's exact result, whose operands
    hold a partial sum over a subset of the exact products, in [-N, P], plus the errors below
    it; P and N the sums of the positive and the negated negative products) satisfy
    ε <= δ_p·T + m·δ·(max(P, N) + ε), and max(P, N) = (T + |E|)/2; so
    α = (δ_p + mδ/2)/(1 - mδ), β = (mδ/2)/(1 - mδ) -- for cancelling sums about half the
    classic c·T. Any summation order, split-K and atomics (every order is a tree of
    additions); FMA chains are the case δ_p = 0 for all but the first product. Used with the
    rigorous model where mδ <= 2^-10 (where the terms do not cancel, |E| = T, the
    denominators cost at most 0.1% against c) and the output rounding's accuracy is a
    constant."""
    acc = self.accuracy("matmul", F_acc)
    if self.bound != "rigorous" or acc.input_dependent or K < 2:
        return _Split(c, 0.0)
    d_p = 0.0 if 2 * F_in.p <= F_prod.p else 2.0 ** -F_prod.p
    ab = _partial_sum_split(d_p, acc.ulps * 2.0 ** (1 - F_acc.p), K - 1)
    if ab is None or ab[0] >= c:
        return _Split(c, 0.0)
    q = abs_out = 0.0
    if F_out is not None and F_out.name != F_acc.name:
        cast = self.accuracy("cast", F_out)
        if cast.input_dependent:
            return _Split(c, 0.0)
        q = cast.ulps * 2.0 ** (1 - F_out.p)
        abs_out = cast.ulps * F_out.smallest_subnormal + cast.absolute
    return _Split(*ab, q, abs_out)


def _partial_sum_split(d_p, d, m):
    """(α, β) of ``_matmul_split`` for product roundings δ_p and m additions of δ, or None
    where m·δ > 2^-10."""
    if not m * d <= 2.0 ** -10:
        return None
    den = 1.0 - m * d
    return (d_p + m * d / 2) / den * (1 + 6 * _E64), (m * d / 2) / den * (1 + 6 * _E64)


_K_PARTS = 4   # the split-K centre's GEMMs over K (matmul, linear): see _split_point_bounds


def _split_terms(sp, K, kj=None, n=_K_PARTS):
    """(f, sb, cb, add, n) of a centre from n float32 GEMMs over the parts of K (n = 2 or 4,
    ``_k_parts``; or n parts of at most ``kj`` terms each: a convolution's two input-channel
    blocks), added in float64 with a bias: the radius α·T + β·|E| + e_C is at most
    ``f·T + sb·Σ|parts| + cb·|C| + add``. Each part's error (IEEE float32, any order) is
    <= α_h·T_h + β_h·|E_h| <= (α_h·T_h + β_h·|C_h|)/(1 - β_h) (``_partial_sum_split``), the
    n float64 additions' error <= n·2^-53·Σ|parts| (first order; the factors k cover the
    rest), so e_C <= (α_h·T + β_h·Σ|C_h|)/(1 - β_h) + n·2^-53·Σ|parts| + underflow, and
    α·T + β·|E| + e_C <= α·T + β·|C| + (1 + β)·e_C (|E| <= |C| + e_C). A part of K/n terms
    has α_h ~ α/n: the radius ~(1 + 1/n)·α·T against RENDER's ~1.5·α·T. None without the
    partial-sum form (the parts are then as wide as the whole)."""
    consts = _partial_sum_split(2.0 ** -24, 2.0 ** -24, (-(-K // n) if kj is None else kj) - 1)
    if consts is None or not sp.beta:
        return None
    a_h, b_h = consts
    k = 1 + 8 * _E64
    f = (sp.alpha + (1 + sp.beta) * a_h / (1 - b_h) * k) * k
    sb = (1 + sp.beta) * (b_h / (1 - b_h) * k + n * 2.0 ** -53) * k
    return f, sb, sp.beta, (1 + sp.beta) * K * 2.0 ** -150 / (1 - b_h) * k, n


def _k_parts(X, W, n=_K_PARTS):
    """The n float32 GEMMs ``X[..., k0:k1] @ W[k0:k1]`` over consecutive parts of K, the
    first ones ceil(K/n) long (W 2-D; views: BLAS takes the strides)."""
    K = X.shape[-1]
    h = -(-K // n)
    with np.errstate(all="ignore"):
        return tuple(_gemm(X[..., k:k + h], W[k:k + h]) for k in range(0, K, h))


def _split_ok(self, x, w, K):
    """Is the split-K centre available: float32 NumPy operands (W 2-D), K >= 64, not
    ``matmul="exact-center"``."""
    return (self.matmul != "exact-center" and K >= 64 and isinstance(x, np.ndarray)
            and isinstance(w, np.ndarray) and x.dtype == np.float32 and w.dtype == np.float32
            and w.ndim == 2 and x.ndim >= 1)


def _wide_bounds(wide, X, W, bias, sp, K, absterm, top):
    """(rows, cols, lo, hi) of a split-K centre's wide elements (``wide``: their flat
    indices, where the radius passes the classic bound: terms that do not cancel) around
    their exact centres: float64 dot products of their rows of X (M, K) and columns of W
    (K, N) -- exact products, the sum within γ_K(u64)·T -- radius (α + γ(1 + β))·T + β·|C|
    (+ the bias, a third float64 term). Any choice of elements is sound; this one keeps the
    bound within the classic one."""
    r, o = np.divmod(wide, W.shape[1])
    with np.errstate(all="ignore"):
        C, T = _K.dot_pairs(X, W.T, r, o)
        g = _gamma(K + 2, 2.0 ** -53)
        if bias is not None:
            C, T = C + bias[o], T + np.abs(bias[o])
        T = T * (1 + g) * (1 + 4 * _E64)
        l2, h2, _ = _K.center_bounds(C, T, (sp.alpha + g * (1 + sp.beta)) * (1 + 8 * _E64),
                                     absterm, top, sp.beta + 2.0 ** -51)
    return r, o, l2, h2


def _around_split_centre(X, W, bias, out_shape, R, f, a, f_cap, terms, sp, K, absterm, top,
                         value=None, parts=None):
    """(lo, hi) around the split-K centre of X (M, K) @ W (K, N) (+ a float64 bias row):
    radius ``R·f + a`` (the T part, ``terms``' add included) plus the centre terms of
    ``_split_terms`` (``parts``: its GEMMs, if made already); elements past ``R·f_cap + a`` get exact centres (``_wide_bounds``) where
    they are at most 4096 (or 1%; beyond that a float64 GEMM is cheaper). None where a centre
    is not finite or too many elements would need patching. With the program's ``value``:
    ``_ExactCentredBounds``, these bounds pending and a float32 radius about the value
    (``split_ball``) for what moves them or takes a value-centred factor from them."""
    parts = tuple(p.reshape(out_shape) for p in (_k_parts(X, W, terms[4]) if parts is None
                                                 else parts))
    c3 = 0.0 if bias is None else bias
    N = W.shape[1]
    max_wide = max(4096, int(np.prod(out_shape)) // 8)
    if value is not None:
        r32, n_bad, wide = _K.split_ball(parts, c3, R, f, a, terms[2], terms[1], f_cap,
                                         value, max_wide)
        if n_bad == 0 and wide is not None:
            if wide.size:
                r, o, l2, h2 = _wide_bounds(wide, X, W, bias, sp, K, absterm, top)
                v = _as_f64(value.reshape(-1, N)[r, o])
                r32.reshape(-1, N)[r, o] = _K.f32_upper(
                    _up(np.maximum(v - l2, h2 - v), 2))

            def exact(floor):
                lo, hi = _around_split_centre(X, W, bias, out_shape, R, f, a, f_cap, terms,
                                              sp, K, absterm, top, parts=parts)
                return (lo, hi) if floor == -math.inf else \
                    (np.maximum(lo, floor), np.maximum(hi, floor))
            return _ExactCentredBounds(value, (r32, 1.0, 0.0), top, 0.0, -math.inf, value,
                                       exact=exact)
    lo, hi, n_bad, wide = _K.split_center_bounds(parts, c3, R, f, a, top, terms[2], terms[1],
                                                 f_cap, max_wide)
    if n_bad or wide is None:
        return None
    if wide.size:
        r, o, l2, h2 = _wide_bounds(wide, X, W, bias, sp, K, absterm, top)
        lo.reshape(-1, N)[r, o], hi.reshape(-1, N)[r, o] = l2, h2
    return lo, hi


def _split_point_bounds(self, pa, pb, K, sp, c, absterm, top):
    """(bounds, Ah, Bh, amax, bmax) of a float32 point matmul around the split-K centre of
    four float32 GEMMs over the quarters of K (``_split_terms``): one float32 GEMM's time
    against a float64 GEMM's two plus its operands' float64 copies. T = |A| @ |B| from the
    bfloat16 GEMM where it runs (its rounding takes magnitudes and maxima: Ah, Bh are then
    ``_LazyAbs``), else in float32 on |A|, |B|. The bfloat16 T is ~1.6% above the float32
    one, the quarters' centre error half the halves': the n = 512 point bound 0.83x RENDER's
    width instead of 0.99x (halves, float32 T), and the MLP benchmark's first layer 8.8 ->
    7.2 ms. None where it does not apply, or where some element's radius would pass the
    classic bound (c + γ)·T around the float64 centre (terms that do not cancel: nonnegative
    data, a few dominant terms): the caller takes that centre."""
    pa, pb = np.asarray(pa), np.asarray(pb)
    terms = _split_terms(sp, K) if _split_ok(self, pa, pb, K) else None
    if terms is None:
        return None
    with np.errstate(all="ignore"):
        up = _bf16_gemm_upper(pa, pb, maxes=True)
        if up is not None and np.isfinite(up[0]).all():
            R, f, a = up[0], _up(terms[0] * up[1], 1), _up(terms[0] * up[2], 1)
            a = _up(a + absterm + terms[3], 1)
            amax, bmax = up[3], up[4]
            Ah, Bh = _LazyAbs(pa, pa, pa, amax), _LazyAbs(pb, pb, pb, bmax)
            f_cap = _classic_cap(c, K, up[1], True)
        else:
            Ah, amax = _abs_operand(pa, True, "absA")
            Bh, bmax = _abs_operand(pb, True, "absB")
            R, f, a = _gemm_upper_parts(Ah, Bh, K, True, terms[0], absterm + terms[3])
            f_cap = _classic_cap(c, K, f / terms[0], False)
    bounds = _around_split_centre(pa.reshape(-1, K), pb, None, pa.shape[:-1] + pb.shape[-1:],
                                  R, f, a, f_cap, terms, sp, K, absterm, top)
    return None if bounds is None else (bounds, Ah, Bh, amax, bmax)


def _classic_cap(c, K, f_gemm, bf16):
    """``f_cap`` of ``_around_split_centre``: the classic exact-centre bound's coefficient
    (c + γ_{K+2}(u64)) per unit of the T GEMM's R (``f_gemm``: its factor, R·f_gemm >= T),
    taken at T's lower end, so that an element kept stays within the classic bound (exact
    centres for the rest). A bfloat16 R may be up to (1 + 2^-7)^3·(1 + γ_{K+1}(2^-23)) above
    T (~2.4%: two operands and the output rounded up); a float32 one only by roundings of
    order 2^-23, which R·f_gemm covers."""
    g = c + _gamma(K + 2, 2.0 ** -53)
    return g / ((1 + 2.0 ** -7) ** 3 * (1 + _gamma(K + 1, 2.0 ** -23))) if bf16 else f_gemm * g


def _f32_upper(X):
    """A float32 array >= X elementwise (X >= 0): narrow formats convert exactly; float64 is
    rounded up, zeros kept and nonzero values at least 2^-102 (``_K.f32_upper``: no subnormal
    operands or products in the GEMM)."""
    if X.dtype == np.float32:
        return X
    if X.dtype != np.float64 and _fmt_of(X.dtype) is not None and _fmt_of(X.dtype).p <= 24:
        return X.astype(np.float32)
    return _K.f32_upper(X)


def _gemm(A, B):
    """``A @ B`` for the bound's own GEMMs (any summation order is covered): a stack of
    matrices times one matrix runs as one tall GEMM (NumPy loops over the stack, and a
    (128, 8, K) activation times (K, N) weights was 128 GEMMs of 8 rows each, ~10x slower)."""
    A, B = np.asarray(A), np.asarray(B)
    if A.ndim > 2 and B.ndim == 2:
        return _blas.matmul(A.reshape(-1, A.shape[-1]), B).reshape(A.shape[:-1] + B.shape[-1:])
    return _blas.matmul(A, B)


def _gemm_upper_parts(L, M, K, small, scale=1.0, add=0.0, bf16=False):
    """(R, f, a) with ``scale·(L @ M) + add <= R·f + a`` for nonnegative L, M (evaluate with
    ``_K.scale_up(R, f, a)``, or let ``_K.center_bounds`` do it on the fly). With ``small`` (a
    float32-or-narrower program) the GEMM runs in float32 on upper float32 copies: every product
    and partial sum of nonnegative terms loses at most u32 relative or 2^-150 absolute, so
    L @ M <= (R + K·2^-150) / (1 - γ_{K+1}(u32)). Falls back to float64 where float32
    overflows. ``bf16``: a bfloat16 GEMM on AMX where it runs (``_bf16_gemm_upper``, ~1.6%
    above the float32 radius) -- for value-centred radii, not for bounds around a float64
    centre, whose width is the radius (the split-K point bound takes its bfloat16 T in
    ``_split_point_bounds``, where the four-part centre pays for it). L may be
    bfloat16 bits already rounded up (``_K.mm_left(..., bf16=True)``)."""
    if small:
        L, Mf = np.asarray(L), _f32_upper(np.asarray(M))
        up = _bf16_gemm_upper(L if L.dtype == np.uint16 else _f32_upper(L), Mf) if bf16 \
            else None
        if up is not None and np.isfinite(up[0]).all():
            return up[0], _up(scale * up[1], 1), _up(scale * up[2], 1) + add
        Lf = _f32_upper(_unbits(L))
        with np.errstate(all="ignore"):
            R = _gemm(Lf, Mf)
        if np.isfinite(R).all():
            corr = scale / (1.0 - _gamma(K + 1, 2.0 ** -24))
            return R, corr, corr * K * 2.0 ** -150 + add
    with np.errstate(all="ignore"):
        R = _gemm(np.asarray(_unbits(L), np.float64), np.asarray(M, np.float64))
    return R, scale * (1.0 + _gamma(K + 2, 2.0 ** -53)), add


def _unbits(L):
    """A left factor given as bfloat16 bits (uint16, ``_K.mm_left(..., bf16=True)``) as the
    float32 values they stand for (exact, still >= the factor); anything else as it is."""
    return _bf16.to_float32(L) if getattr(L, "dtype", None) == np.uint16 else L


def _weights_radius(L, W, K, add):
    """((R, f, a), wmax): ``L @ |W| + add <= R·f + a`` and ``wmax >= max |W|`` (NaN if W has
    one) for float32 weights W, from the bfloat16 GEMM, which rounds magnitudes itself (no
    |W| array: 4 MB less written per 1024x1024 layer) and takes their max in the same pass;
    |W| in float32 where that GEMM's result is not finite."""
    up = _bf16.matmul_upper(_kconv._torch(), L, W, maxes=True)
    if up is not None and np.isfinite(up[0]).all():
        R, f, a, _, wmax = up
        return (R, _up(f, 1), _up(a, 1) + add), wmax
    absW = np.abs(W)
    wmax = float(np.max(absW)) if absW.size else 0.0
    return _gemm_upper_parts(L, absW, K, True, 1.0, add), wmax


def _bf16_gemm_upper(L, M, probe=False, maxes=False):
    """(R, f, a) with |L| @ |M| <= R·f + a from one bfloat16 GEMM on AMX (``kernels/bf16.py:
    matmul_upper``: the rounding takes magnitudes) for float32 NumPy operands of a large
    enough GEMM (>= 2^21 products); None elsewhere (no AMX, no torch, small or CuPy
    operands). ``probe``: only whether it would run (True or None); ``maxes``: also bounds of
    max |L| and max |M| (``matmul_upper``'s). L may be bfloat16 bits already rounded up
    (uint16: ``_K.mm_left(..., bf16=True)``, which ``_bf16_left`` asks for)."""
    if not (type(L) is np.ndarray and L.dtype in (np.float32, np.uint16)
            and _bf16_gemm_runs(L.shape, M)):
        return None
    torch = _kconv._torch()
    return True if probe else _bf16.matmul_upper(torch, L, M, maxes)


def _bf16_gemm_runs(l_shape, M):
    """Whether ``_bf16_gemm_upper`` runs for a left factor of shape ``l_shape`` times M."""
    if not (type(M) is np.ndarray and M.dtype == np.float32 and len(l_shape) >= 2
            and M.ndim >= 2 and math.prod(l_shape) * M.shape[-1] >= 2 ** 21):
        return False
    torch = _kconv._torch()
    return bool(torch and _bf16.amx(torch))


def _bf16_left(v, M):
    """Whether the left GEMM factor of a float32 value ``v`` times M takes the bfloat16 GEMM:
    then its kernel writes it as rounded-up bfloat16 bits directly (no float32 factor
    written, read back and rounded in a pass of its own)."""
    return type(v) is np.ndarray and v.dtype == np.float32 and _bf16_gemm_runs(v.shape, M)


def _gemm_upper(L, M, K, small, scale=1.0, add=0.0):
    """Upper bound of ``scale·(L @ M) + add`` for nonnegative L, M (see _gemm_upper_parts)."""
    return _K.scale_up(*_gemm_upper_parts(L, M, K, small, scale, add))


_SCRATCH = threading.local()


def _scratch(shape, dtype, slot):
    """A thread-local buffer reused across calls for GEMM operands that live only inside one
    rule (|W|, float64 copies of weights): large fresh arrays cost a page fault per 4 KiB."""
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    key = (slot, tuple(shape), np.dtype(dtype).str)
    buf = bufs.get(key)
    if buf is None:
        if len(bufs) > 16:
            bufs.clear()
        buf = bufs[key] = np.empty(shape, dtype)
    return buf


def _abs_operand(p, small, slot):
    """(|operand|, its max) for a GEMM bound: float32-representable programs stay in float32
    (exact); the max (NaN if any element is) saves the overflow screen a pass of its own."""
    p = np.asarray(p)
    if small and p.dtype != np.float64:
        if not p.ndim:
            return np.abs(p), None
        out = np.abs(p, out=_scratch(p.shape, p.dtype, slot))
        return out, (float(out.max()) if out.size else 0.0)
    return (np.abs(p, out=_scratch(p.shape, np.float64, slot), dtype=np.float64) if p.ndim
            else np.abs(_as_f64(p))), None


def _f64_operand(p, slot):
    """A float64 copy of a GEMM operand in a reused buffer (exact for narrower formats)."""
    p = np.asarray(p)
    if p.dtype == np.float64 or not p.ndim:
        return _as_f64(p)
    buf = _scratch(p.shape, np.float64, slot)
    np.copyto(buf, p, casting="unsafe")
    return buf


@_rule("matmul")
def _matmul(self, prim, a, b):
    v = self.value_of(prim, (a, b), {})
    if np.asarray(concrete(v)).dtype.kind in "biu":
        return _exact_matmul(self, v, a, b)
    # constants (weights) are points: their float64 bounds are only built where needed, and
    # pending bounds (``_CentredBounds``) of two interval operands are not written at all
    au, ap = (a.unstable, a.point) if self._own(a) else (None, True)
    bu, bp = (b.unstable, b.point) if self._own(b) else (None, True)
    pa, pb = self.primal_of(a), self.primal_of(b)
    try:
        in_dt = np.result_type(np.asarray(pa).dtype, np.asarray(pb).dtype)
    except TypeError:   # bfloat16 @ float16: NumPy converts both to its result dtype
        in_dt = np.asarray(concrete(v)).dtype
    F_out = _fmt_of(np.asarray(concrete(v)).dtype)
    K = np.shape(pa)[-1] if np.ndim(pa) else 1
    prec = self.resolve("matmul", in_dt)
    if self.matmul == "render":
        from fpx.kernels.render import render_matmul
        (alo, ahi, _, _), (blo, bhi, _, _) = self.bounds(a), self.bounds(b)
        au, bu = a.unstable if self._own(a) else None, b.unstable if self._own(b) else None
        lo, hi = render_matmul(alo, ahi, blo, bhi, prec.input)
        return self.new(v, lo, hi, _matmul_unstable(au, bu, np.shape(lo)))
    F_in, F_prod, F_acc = prec.input, prec.compute, prec.accumulate
    c = _matmul_constant(self, F_in, F_prod, F_acc, K)
    sp = _matmul_split(self, c, F_in, F_prod, F_acc, K, F_out)
    small = F_out is not None and F_out.p <= 24 and F_in.p <= 24 and in_dt != np.float64
    src = _fmt_of(in_dt)
    rounded_inputs = src is not None and not _contains_format(F_in, src)   # e.g. tf32 inputs
    g64 = _gamma(K + 2, 2.0 ** -53)
    if (small and not ap and not bp and not rounded_inputs and self.matmul != "exact-center"
            and np.asarray(pa).dtype in (np.float32, np.float64) and np.ndim(pa) >= 1
            and np.asarray(pb).dtype in (np.float32, np.float64) and np.ndim(pb) >= 1
            and _bounds_ready(a) and _bounds_ready(b)):
        y = _matmul_intervals(self, v, a, b, pa, pb, K, c, sp, prec, F_out)
        if y is not None:
            return y
    blo, bhi = (b.lo, b.hi) if self._own(b) else (None, None)
    with np.errstate(all="ignore"):
        # value-centred fast path for an interval activation times constant weights: one fused
        # pass gives the left GEMM factor L and Σr, Σ(|v|+r), max(|v|+r); r_A and Â are
        # materialized only if needed (A's pending centred bounds -- a GEMM's, through a bias
        # and a ReLU -- are read by that pass and not written where the result is pending too)
        fused = (small and not ap and bp and not rounded_inputs and self.matmul != "exact-center"
                 and np.asarray(pa).dtype in (np.float32, np.float64) and np.ndim(pa) >= 1)
        alo, ahi = (a.lo, a.hi) if self._own(a) and not fused else (None, None)
        absterm = 2 * K * (F_prod.smallest_subnormal + F_acc.smallest_subnormal)
        if (small and ap and not bp and not rounded_inputs and self.matmul != "exact-center"
                and np.asarray(pb).dtype in (np.float32, np.float64) and np.ndim(pb) >= 1):
            # the mirror image: constant weights times an interval (a convolution written
            # W @ im2col(x)): radius |A| @ (2c·(|v_b| + r_b) + r_b), the same fused pass on B
            Lb, st = _K.mm_left(pb, blo, bhi, 2 * sp.alpha, stats=True)
            if (all(np.isfinite(st)) and st[0] >= 4 * c * st[1] * 1.01
                    and bool(np.all(np.isfinite(concrete(v))))):
                absA, amax = _abs_operand(pa, small, "absA")
                center = _centre_of(v)
                rad = _out_rounding(self, sp.scaled(_gemm_upper_parts(absA, Lb, K, small, 1.0,
                                                                      absterm, bf16=True)),
                                    center, F_out, F_acc)
                return _matmul_close(self, v, center, rad, absA, _LazyAbs(pb, blo, bhi, st[2]),
                                     K, c, prec, F_out, [(alo, ahi, pa), (blo, bhi, pb)],
                                     rounded_inputs, amax, None, au, bu, sp.cb)
        L, stats = _left_factor(a, pa, 2 * sp.alpha, bf16=_bf16_left(pa, pb)) if fused \
            else (None, None)
        finite_v = bool(np.all(np.isfinite(concrete(v))))
        # wide enough to centre on the value (a non-finite value: the exact centre, whose
        # magnitudes Â = |v| + r_A need r_A)
        lazy_a = (fused and finite_v and all(np.isfinite(stats))
                  and stats[0] >= 4 * c * stats[1] * 1.01)
        if fused and not lazy_a:
            alo, ahi = a.lo, a.hi
        # radii around the program's operand values (point operands: 0, no array work)
        ra = 0.0 if ap or lazy_a else _up(np.maximum(_as_f64(pa) - alo, ahi - _as_f64(pa)), 1)
        rb = 0.0 if bp else _up(np.maximum(_as_f64(pb) - blo, bhi - _as_f64(pb)), 1)
        if rounded_inputs:   # the policy's conversion accuracy (tf32 may truncate: 1 ulp)
            va_, vb_ = _as_f64(pa), _as_f64(pb)
            ua, aa = _accuracy_terms(self.accuracy("cast", F_in), [(va_ - ra, va_ + ra)])
            ub, ab_ = _accuracy_terms(self.accuracy("cast", F_in), [(vb_ - rb, vb_ + rb)])
            ra = _up(ra + (np.abs(va_) + ra) * (ua * 2.0 ** (1 - F_in.p)) +
                     ua * F_in.smallest_subnormal + aa, 4)
            rb = _up(rb + (np.abs(vb_) + rb) * (ub * 2.0 ** (1 - F_in.p)) +
                     ub * F_in.smallest_subnormal + ab_, 4)
        a_pt = not lazy_a and np.ndim(ra) == 0 and ra == 0
        b_pt = np.ndim(rb) == 0 and rb == 0
        point = a_pt and b_pt and self.matmul != "fast"
        # a float32 point product: the split-K centre, which makes |A|, |B| itself (or not)
        split = _split_point_bounds(self, pa, pb, K, sp, c, absterm,
                                    _acc_top(F_out, F_acc)) if point and small else None
        # constant float32 weights under the fused pass's bfloat16 radius GEMM: no |B| array
        # (the rounding takes magnitudes itself, and their max: ``_weights_radius``), the
        # array itself only where the overflow guard needs it
        direct_b = (lazy_a and b_pt and type(pb) is np.ndarray
                    and pb.dtype == np.float32 and _bf16_gemm_upper(L, pb, probe=True) is not None)
        cb, bounds = 0.0, None   # the radius's |centre| coefficient (center_bounds)
        if split is not None:
            bounds, Ah, Bh, amax, bmax = split
            absA = absB = None
        else:
            if direct_b:
                absB = Bh = bmax = None
            else:
                absB, bmax = _abs_operand(pb, small, "absB")
                Bh = absB if b_pt else _up(absB + rb)
            if lazy_a:      # wide enough: centred on the value, nothing else needed
                absA = Ah = None
                exact_center = False
            else:
                absA, amax = _abs_operand(pa, small, "absA")
                Ah = absA if a_pt else _up(absA + ra)
                exact_center = point or (not rounded_inputs and self.matmul != "fast" and (
                    self.matmul == "exact-center" or not finite_v
                    or _narrow(ra, Ah, rb, Bh, c)))
        if bounds is not None:
            center = rad = None
        elif point:          # exact float64 centre C: radius α·T + β·|E| (+ C's own error),
            center = _gemm(_f64_operand(pa, "f64A"), _f64_operand(pb, "f64B"))  # |E| <= |C| + e
            rad = _gemm_upper_parts(Ah, Bh, K, small, (sp.alpha + g64 * (1 + sp.beta))
                                    * (1 + 4 * _E64), absterm)
            cb = sp.beta
        elif exact_center:   # centre = midpoints' product in float64
            ma = _as_f64(pa) if a_pt else (alo + ahi) / 2
            mb = _as_f64(pb) if b_pt else (blo + bhi) / 2
            hra = 0.0 if a_pt else _up((ahi - alo) / 2)
            hrb = 0.0 if b_pt else _up((bhi - blo) / 2)
            center = _gemm(ma, mb)
            rad = _gemm_upper_parts(_up(hra + (c + g64) * _as_f64(Ah), 3), Bh, K, small, 1.0,
                                    absterm)
            if not b_pt:
                rad = (_K.scale_up(*rad) + _gemm_upper(np.abs(ma), hrb, K, small), 1.0, 0.0)
        else:                # centre = the program's value: its own error counted once more
            center = _centre_of(v)
            if a_pt and Ah is not None:          # point A: the radius is 2α·(|A| @ B̂)
                rad = _gemm_upper_parts(Ah, Bh, K, small, _up(2 * sp.alpha, 1), absterm,
                                        bf16=True)
            else:
                if L is not None:
                    pass                                       # from the fused pass above
                elif small and not rounded_inputs and np.asarray(pa).dtype in (np.float32,
                                                                               np.float64):
                    L = _K.mm_left(pa, alo, ahi, 2 * sp.alpha)  # one fused pass, float32 upper
                else:
                    L = _up(2 * sp.alpha * _as_f64(Ah) + ra, 3)   # float64: c·|a| underflows in fp16
                if direct_b:
                    rad, bmax = _weights_radius(L, pb, K, absterm)
                    Bh = _LazyAbs(pb, pb, pb, bmax)
                else:
                    rad = _gemm_upper_parts(L, Bh, K, small, 1.0, absterm, bf16=True)
            if not b_pt:
                rad = (_K.scale_up(*rad) + _gemm_upper(absA, rb, K, small), 1.0, 0.0)
            rad = _out_rounding(self, sp.scaled(rad), center, F_out, F_acc)
            cb = sp.cb
        if Ah is None:   # the guard's operand magnitude, from the fused stats
            amax = _up(stats[2], 4)
            y = None if au is not None or bmax is None or not b_pt else _pending_centred(
                self, v, center, rad, cb, amax, bmax, K, c, F_out, F_acc)
            if y is not None:
                return y
            alo, ahi = a.lo, a.hi
            Ah = _LazyAbs(pa, alo, ahi, stats[2])
        return _matmul_close(self, v, center, rad, Ah, Bh, K, c, prec, F_out,
                             [(alo, ahi, pa), (blo, bhi, pb)], rounded_inputs,
                             amax if a_pt and not lazy_a else None, bmax if b_pt else None,
                             au, bu, cb, bounds)


def _bounds_ready(x):
    """An interval operand's bounds are arrays or pending centred bounds (which the factor
    passes read without writing them)."""
    return isinstance(x._pending, _CentredBounds) or (isinstance(x.lo, np.ndarray)
                                                       and isinstance(x.hi, np.ndarray))


def _matmul_intervals(self, v, a, b, pa, pb, K, c, sp, prec, F_out):
    """Both operands intervals (attention's Q·Kᵀ and P·V): value-centred, radius
    L_A @ B̂ + |A| @ r_B, each factor from one fused pass (``_left_factor``,
    ``_right_factor``: from pending centred bounds without writing them; NumPy took ~15),
    summed over 2K: in a torch program the second GEMM accumulates into the first
    (``blas.matmul_sum``, float32 on MKL: 11 -> 4.5 ms on the encoder, no concatenated
    factors), else one GEMM of the concatenated factors (bfloat16 on AMX). The result is
    pending (``_CentredBounds``) where, as a linear layer's, the screen's factor 2 of room
    leaves no bound n_bad and nothing for the guard:
    attention's scores then reach the softmax (through the scale's mul,
    ``_CentredBounds.scaled``) without their bounds being written. None where it does not
    apply (the caller's general path)."""
    F_in, F_prod, F_acc = prec.input, prec.compute, prec.accumulate
    f32 = np.asarray(pa).dtype == np.float32          # (then |A| exactly, from L's pass)
    La, sa, *absA = _left_factor(a, pa, 2 * sp.alpha, with_abs=f32)
    Bh32, rb32, sb = _right_factor(b, pb)
    if not (all(np.isfinite(sa)) and all(np.isfinite(sb))
            and bool(np.all(np.isfinite(concrete(v))))
            and (self.matmul == "fast" or sa[0] / max(sa[1], 1e-300) +
                 sb[0] / max(sb[1], 1e-300) >= 4 * c)):
        return None
    absterm = 2 * K * (F_prod.smallest_subnormal + F_acc.smallest_subnormal)
    with np.errstate(all="ignore"):
        absA = absA[0] if f32 else _abs_operand(pa, True, "absA")[0]
        # one sum over 2K: the second GEMM accumulating into the first (torch's MKL), else
        # one GEMM [L_A | |A|] @ [B̂ ; r_B] (as two, the radius took two more passes over the
        # output to scale and add them)
        R = _blas.matmul_sum(La, Bh32, absA, rb32)
        if R is not None and R.dtype == np.float32 and np.isfinite(R).all():
            corr = 1.0 / (1.0 - _gamma(2 * K + 1, 2.0 ** -24))
            rad = (R, corr, corr * 2 * K * 2.0 ** -150 + absterm)
        else:
            rad = _gemm_upper_parts(np.concatenate((La, absA), axis=-1),
                                    np.concatenate((Bh32, rb32), axis=-2), 2 * K, True, 1.0,
                                    absterm, bf16=True)
    center = _centre_of(v)
    rad = _out_rounding(self, sp.scaled(rad), center, F_out, F_acc)
    y = None if a.unstable is not None or b.unstable is not None else _pending_centred(
        self, v, center, rad, sp.cb, sa[2], sb[2] * (1 + 2.0 ** -22), K, c, F_out, F_acc)
    if y is not None:
        return y
    alo, ahi, blo, bhi = a.lo, a.hi, b.lo, b.hi
    return _matmul_close(self, v, center, rad, _LazyAbs(pa, alo, ahi, sa[2]), Bh32, K, c, prec,
                         F_out, [(alo, ahi, pa), (blo, bhi, pb)], False, None,
                         sb[2] * (1 + 2.0 ** -22), a.unstable, b.unstable, sp.cb)


@_rule("conv", "linear")
def _weighted(self, prim, x, w, b=None, **params):
    """A convolution (``fpx.nn.conv``) or linear layer (``fpx.nn.linear``) of an activation
    with constant float32 weights, without materializing float64 bounds of its GEMM operands
    (the im2col of a convolution, the ``[x | 1]`` of a bias in the sum). An interval activation
    is value-centred as the matmul rule's fast path is: the radius is ``op(L, |w|)`` with
    ``L = 2c·(|v| + r) + r`` per *input* element (``mm_left``; padding gives L = 0), an
    upper bound of the same op of nonnegative terms (``_weighted_radius``: a conv on oneDNN in
    bfloat16, else float32), the centre the program's own value. A point activation (the
    data) gets a centre C of its own and the radius (α + e(1+β))·op(|x|, |w|) + β·|C|
    (``_Split``), e the centre's error (``_point_centre``: the op in float64, e = γ_{K+2}(u64);
    a conv on oneDNN by default from float32 blocks of its input channels, e ≈ γ_{K/4}(u32),
    ~3x cheaper for a ~1.5x wider point bound). A bias in the sum
    (``bias_in_sum``: one more term, of value 1·b) enters the radius GEMM as the bias ``2α·|b|``
    (``|b|`` for points); a bias added afterwards is the interpreter's interval add. A
    convolution of a narrow interval (radius below ~4c of its magnitude, where the value-centred
    bound would be ~2x wider) gets the matmul rule's exact centre without the im2col of its
    bounds: C = conv(mid) in float64 (``conv_f64``), radius conv(r + (c + γ)·|x̂|, |w|)
    (``midpoint_factor``; ~13x faster than the decomposition). Anything else -- interval or
    non-float32 weights, a policy that rounds the inputs (tf32), a linear layer's narrow
    intervals, unstable or non-finite inputs, possible overflow, CuPy arrays -- runs the
    decomposition (and the matmul rule)."""
    y = _weighted_value_centred(self, prim, x, w, b, params)
    if y is not None:
        return y
    y = prim.decomposition(x, w, b, **params)
    if not self._own(y):
        return y
    bs = b if params.get("bias_in_sum") else None        # as the eager routines decide
    px, pw, pb = self.primal_of(x), self.primal_of(w), None if bs is None else self.primal_of(bs)
    if prim.name == "conv":
        native = _kconv._engine(px, pw, pb) is not None
    else:
        native = pb is not None and _nn._linear_bias_last(px, pw, pb)
    if not native:
        return y
    # The program's own routine sums in another order than the decomposition (oneDNN for a
    # float32 conv, the in-sum bias added last by NumPy's linear), which the bounds cover;
    # keep its value as the value.
    return self.new(self.value_of(prim, (x, w, b), params), y.lo, y.hi, y.unstable, y.point)


def _weighted_value_centred(self, prim, x, w, b, params):
    in_sum = bool(params.get("bias_in_sum")) and b is not None
    if (not self._own(x) or self._own(w) or (b is not None and self._own(b))
            or x.unstable is not None
            or self.matmul == "render" or (self.matmul == "exact-center" and not x.point)):
        return None
    vx, wc = self.primal_of(x), concrete(w)
    bc = None if b is None else np.asarray(concrete(b))
    if not (isinstance(vx, np.ndarray) and isinstance(wc, np.ndarray)
            and (x._pending is not None or isinstance(x.lo, np.ndarray))   # (not forced)
            and vx.dtype == np.float32 and wc.dtype == np.float32
            and (bc is None or (bc.dtype == np.float32 and np.all(np.isfinite(bc))))):
        return None
    prec = self.resolve("matmul", np.dtype(np.float32))
    F_in, F_prod, F_acc = prec.input, prec.compute, prec.accumulate
    F_out = _fmt_of(np.dtype(np.float32))
    if not _contains_format(F_in, F_out) or F_acc.p > 24:
        return None
    K = (int(np.prod(np.shape(wc)[1:])) if prim.name == "conv" else np.shape(wc)[-1]) + in_sum
    c = _matmul_constant(self, F_in, F_prod, F_acc, K)
    sp = _matmul_split(self, c, F_in, F_prod, F_acc, K, F_out)
    absterm = 2 * K * (F_prod.smallest_subnormal + F_acc.smallest_subnormal)
    center, m = None, None
    with np.errstate(all="ignore"):
        if x.point and self.matmul != "fast":
            # a centre C of its own (the op in float64, or float32 blocks summed in float64),
            # radius α·T + β·|E| + C's error e, |E| <= |C| + e: (α + rel·(1+β))·T + β·|C|;
            # T = op(|x|, |w|) from x itself (the radius op takes magnitudes, and max |x|)
            L, exact, cb = vx, True, sp.beta
            bias_r = np.abs(bc) if in_sum else None
            # a linear layer's float32 point input: the split-K centre (``_split_terms``); a
            # convolution's: two input-channel blocks (``_conv_split_bounds``)
            split = (_split_terms(sp, K) if prim.name == "linear"
                     and _split_ok(self, vx, wc.T, wc.shape[-1]) else
                     _split_terms(sp, K, _conv_block_terms(wc), 2) if prim.name == "conv"
                     and self.matmul != "exact-center" and _conv_block_terms(wc) else None)
            if split is not None:
                f = split[0]
            else:
                if not np.all(np.isfinite(vx)):
                    return None
                center, f, absterm = _own_point_centre(self, prim, vx, wc, bc, in_sum, params,
                                                       K, sp, absterm)
        else:
            # value-centred: L = 2α·(|v| + r) + r per input element (see _Split)
            L, st = _left_factor(x, vx, 2 * sp.alpha,
                                 bf16=prim.name == "linear" and _bf16_left(vx, wc.T))
            if not all(np.isfinite(st)):
                return None
            m, split = st[2], None
            if x.point or self.matmul == "fast" or st[0] >= 4 * c * st[1] * 1.01:
                exact, f, cb = False, 1.0, sp.cb
                bias_r = (_f32_upper(_up(2 * sp.alpha * np.abs(bc.astype(np.float64)), 2))
                          if in_sum else None)
            else:
                # narrow boxes: an exact centre is tighter (the matmul rule's): C = op(mid) in
                # float64, radius op(r + (c + γ)·|x̂|, |w|) (+ (c + γ)·|b|)
                if prim.name != "conv":
                    return None                     # (the matmul rule's own exact centre)
                k = _up(c + _gamma(K + 2, 2.0 ** -53), 2)
                mid, L = _K.midpoint_factor(x.lo, x.hi, k)
                center = _kconv.conv_f64(mid, wc, bc if in_sum else None, params["stride"],
                                         params["padding"], params["dilation"],
                                         params["groups"])
                if center is None:
                    return None
                exact, f, cb = True, 1.0, 0.0
                bias_r = (_f32_upper(_up(k * np.abs(bc.astype(np.float64)), 2))
                          if in_sum else None)
        rad, (lmax, wmax), in_bf16 = _weighted_radius(self, prim, L, wc, bias_r, params, K,
                                                      f, bf16=not exact or split is not None)
        # (a point linear layer's T in bfloat16 too: ~4 of its ~23 ms on the encoder's
        # in-projection; the four-part centre pays for its ~1.6% more width)
        if m is None:
            m = lmax                        # max |x| (NaN or inf where x has one)
        if in_sum:
            m = max(m, 1.0)                 # the bias's own term: 1 · b
        bmax = max(wmax, float(np.max(np.abs(bc))) if in_sum else 0.0)
        # no product or sum may overflow (a NaN or inf operand fails here too): the value is
        # finite, and a radius that is not (bfloat16 past its range) is ``n_bad`` below
        if not m * bmax * K * (1.0 + c) * (1 + 2.0 ** -40) <= F_acc.max:
            return None
        kparts = parts = v = None
        if (split is not None and _blas.active() and type(self.parent) is EvalInterpreter
                and F_out.name == F_acc.name):
            # a torch program's value is fpx's own execution (docs/torch.md): here from the
            # split centre's float32 parts (GEMMs over parts of K, a convolution's input-
            # channel blocks), fl(fl(fl(P1 + P2) + P3) + ...) + b -- a float32 sum in one more
            # order -- instead of one more GEMM or convolution over all of K
            if prim.name == "linear":
                kparts = _k_parts(vx.reshape(-1, wc.shape[-1]), wc.T)
                v = np.add(kparts[0], kparts[1])
                for p in kparts[2:]:
                    np.add(v, p, out=v)
                if in_sum:
                    np.add(v, bc, out=v)
                v = v.reshape(vx.shape[:-1] + (wc.shape[0],))
            else:
                parts = _conv_parts(vx, wc, bc if in_sum else None, params, rad,
                                    rad[2] + absterm + split[3])
                if parts is not None:
                    v = _parts_value(parts, bc if in_sum else None, np.shape(rad[0]))
        if v is None:
            v = self.value_of(prim, (x, w, b if in_sum else None), params)   # the program's
        top = F_acc.max if F_acc.has_inf else math.inf
        bounds = None
        if split is not None and prim.name == "conv":
            bounds = _conv_split_bounds(vx, wc, bc if in_sum else None, params, rad,
                                        rad[2] + absterm + split[3], split, top, parts)
            if bounds is None:
                center, f2, absterm = _own_point_centre(self, prim, vx, wc, bc, in_sum, params,
                                                        K, sp, absterm)
                rad = (rad[0], rad[1] / f * f2, rad[2] / f * f2)
        elif split is not None:   # the parts' GEMMs; the float64 centre where that is wider
            bounds = _around_split_centre(
                vx.reshape(-1, wc.shape[-1]), wc.T, bc.astype(np.float64) if in_sum else None,
                vx.shape[:-1] + (wc.shape[0],), rad[0], rad[1], rad[2] + absterm + split[3],
                _classic_cap(c, K, rad[1] / f, in_bf16), split, sp, K, absterm, top,
                value=v if (F_out.name == F_acc.name and F_acc.has_inf
                            and isinstance(v, np.ndarray) and v.ndim) else None,
                parts=kparts)
            if bounds is None:
                center, f2, absterm = _own_point_centre(self, prim, vx, wc, bc, in_sum, params,
                                                        K, sp, absterm)
                rad = (rad[0], rad[1] / f * f2, rad[2] / f * f2)
            elif isinstance(bounds, _ExactCentredBounds):   # pending: exact where forced
                y = self.new_pending(v, bounds)
                return y if b is None or in_sum else _bias_after(y, prim, wc, bc)
        if bounds is not None:
            (lo, hi), n_bad = bounds, 0
        else:
            rad = (rad[0], rad[1], rad[2] + absterm)
            if not exact:
                center = _centre_of(v)
                rad = _out_rounding(self, sp.scaled(rad), center, F_out, F_acc)
            y = None if exact else _pending_centred(self, v, center, rad, cb, m, bmax, K, c,
                                                    F_out, F_acc)
            if y is not None:
                return y if b is None or in_sum else _bias_after(y, prim, wc, bc)
            lo, hi, n_bad = _K.center_bounds(center, *rad, top, cb)
        if n_bad:
            return None
        if F_out.name != F_acc.name:
            lo, hi = _round_bounds(lo, hi, F_out, self.accuracy("cast", F_out))
    y = self.new(v, lo, hi)
    return y if b is None or in_sum else _bias_after(y, prim, wc, bc)


def _pending_centred(self, v, center, rad, cb, amax, bmax, K, c, F_out, F_acc):
    """A value-centred GEMM's bounds ``center ± (R·f + a + cb·|center|)`` (``rad`` = (R, f,
    a)) left pending (``_CentredBounds``: a bias add, a ReLU and the next GEMM's left factor
    read them on the fly) where nothing in them can be ``n_bad`` or need the overflow guard:
    a finite value (the caller's check), the accumulator's format is the result's, and
    ``amax·bmax·K·(1 + c)`` (amax, bmax >= the operands' magnitudes) has a factor 2 of room
    below its largest value -- no product or partial sum overflows, and the radius GEMM has
    room for its rounding. None elsewhere (the caller writes the bounds)."""
    if (F_out is not None and F_out.name == F_acc.name and F_acc.has_inf
            and isinstance(v, np.ndarray) and v.ndim
            and amax * bmax * K * (1.0 + c) * 2 <= F_acc.max):
        return self.new_pending(v, _CentredBounds(center, rad, _acc_top(F_out, F_acc), cb,
                                                  -math.inf, v))
    return None


def _bias_after(y, prim, wc, bc):
    """y + b for a bias added after the layer's sum (the interpreter's add rule)."""
    if prim.name == "linear":
        return y + bc
    return y + np.reshape(bc, (np.shape(wc)[0],) + (1,) * (np.ndim(wc) - 2))


class _CentredBounds:
    """Pending bounds (IntervalTracer) of a value-centred GEMM or convolution:
    ``center_bounds(center, *rad, top, b, floor)``. ``floored(c, value)`` is those of
    ``max(x, c)`` (a ReLU, its ``value``), and ``_left_factor`` gives the next layer's left
    GEMM factor straight from them (``mm_left_centred``): in a transformer's feed-forward
    block the bounds between its two GEMMs are then never written (at 8x128x2048 the GEMM's
    bounds, the ReLU's and the left factor's passes took ~9 ms, the fused pass ~3)."""
    __slots__ = ("center", "rad", "top", "b", "floor", "value", "_maxima")

    def __init__(self, center, rad, top, b, floor, value, maxima=None):
        self.center, self.rad, self.top, self.b = center, rad, top, b
        self.floor, self.value, self._maxima = floor, value, maxima

    def maxima(self):
        """(max |center|, max R) or upper bounds of them (cached)."""
        if self._maxima is None:
            R = self.rad[0]
            with np.errstate(all="ignore"):
                c = self.center        # (max and -min: no |c| array; NaN propagates)
                self._maxima = (float(np.maximum(np.max(c), -np.min(c))) if np.size(c)
                                else 0.0, float(np.max(R)) if np.size(R) else 0.0)
        return self._maxima

    def max_abs(self):
        """An upper bound of every |bound| (NaN if an operand is): every bound is finite where
        it is at most ``top`` (``center_bounds`` takes a bound past ``top`` to ±inf)."""
        (cm, rm), (_, f, a) = self.maxima(), self.rad
        with np.errstate(all="ignore"):
            cb = (self.b + 8 * _E64) * (1 + 4 * _E64)
            d = ((rm * float(np.max(f)) + float(np.max(a))) * (1 + 4 * _E64) + _TINY64) \
                * (1 + 8 * _E64) + cm * cb + _TINY64
            mag = _up(cm + d, 8)
        return max(mag, abs(self.floor)) if self.floor > -math.inf else mag

    def finite(self):
        """Every bound is finite (``max_abs`` at most ``top``)."""
        m = self.max_abs()
        return m < math.inf and m <= self.top

    def scaled(self, s, q, e, q0, e0, top, value):
        """The bounds of ``fl(x·s)`` for a constant s, centred on its value ``value`` =
        fl(c·s) computed here (``|fl(cs) - cs| <= q0·|cs| + e0``: round to nearest, q0 = 0
        for a power of two), where an execution's mul rounds with ``|fl(z) - z| <= q·|z| +
        e``; None where a ReLU's floor was folded in or the value is not this centre's
        product. With x in c ± d, d = R·f + a + b·|c|: |y - v'| <= |y - xs| + |xs - cs| +
        |cs - v'| <= |s|·d·(1 + q) + (q + q0)·|cs| + e + e0 and |cs| <= (|v'| + e0)/(1 - q0):
        R stays, f and a scale by |s|·(1 + q), b becomes b' = ((1 + q)·b + q + q0)/(1 - q0),
        and a gains b'·e0 + e + e0."""
        if not (self.floor == -math.inf and self.center is self.value and q < 0.5
                and q0 < 0.5):
            return None
        _, f, a = self.rad
        g = abs(s) * (1 + q)
        b2 = _up(((1 + q) * self.b + q + q0) / (1 - q0), 5)
        cm, rm = self.maxima()
        return _CentredBounds(value, (self.rad[0], _up(f * g, 3),
                                      _up(a * g + b2 * e0 + e + e0, 6)),
                              top, b2, -math.inf, value, (_up(cm * abs(s) * (1 + q0) + e0, 4), rm))

    def shifted(self, t, q, e, q0, top, value):
        """The bounds of ``fl(x + t)`` for a constant array t (a bias), centred on its value
        ``value`` = fl(c + t) (``|fl(c + t) - (c + t)| <= q0·|c + t|``: NumPy's IEEE sum,
        exact where it underflows), where an execution's add rounds with ``|fl(z) - z| <=
        q·|z| + e``; None where a ReLU's floor was folded in or the centre is not the value.
        With x in c ± d, d = R·f + a + b·|c| and |c| <= |c + t| + |t|: |y - v'| <= |y - (x +
        t)| + |x - c| + |c + t - v'| <= (1 + q)·d + (q + q0)·|c + t| + e, |c + t| <= |v'|/(1
        - q0): R stays, f scales by 1 + q, a becomes (1 + q)·(a + b·|t|) + e (a row for a
        bias row: with b·max|t| a scalar the consumers' passes were ~20% faster alone, no
        faster end to end, and an MLP's bound ~0.6% wider) and b becomes ((1 + q)·b + q +
        q0)/(1 - q0). The bias add then
        writes no bounds: a ReLU folds in and the next GEMM's left factor reads them on the
        fly. Only for a bias row (t of the last axis's length) and where that costs at most
        2^-10 of each radius; None elsewhere (the caller's add pass)."""
        R, f, a = self.rad
        c = self.center
        n = np.shape(c)[-1] if np.ndim(c) else 0
        if not (self.floor == -math.inf and c is self.value and q < 0.5 and q0 < 0.5
                and isinstance(R, np.ndarray) and R.shape == np.shape(c) and R.size
                and t.size == n and t.shape[-1:] == (n,)):
            return None
        # only where it costs (almost) no width: what the shift adds against the add rule's
        # bounds -- b·|t| for b·|c|, the value's rounding q0·|v'| -- at most 2^-10 of every
        # radius R·f in its column (a bias far larger than the values takes the add pass);
        # and every value finite, |v'| <= (|c| + |t|)(1 + q0) < top (nothing n_bad)
        at = np.abs(t.reshape(n)).astype(np.float64)
        with np.errstate(all="ignore"):     # (NumPy's reductions: NaN propagates)
            cm = float(np.maximum(np.max(c), -np.min(c)))
            rmin = np.min(R.reshape(-1, n), axis=0).astype(np.float64)
            if not (np.all((self.b * at + q0 * (cm + at)) * (1 + 2.0 ** -40)
                           <= 2.0 ** -10 * rmin * float(np.min(f)))
                    and float(np.max(cm + at)) * (1 + 2 * q0) < top):
                return None
        b2 = _up(((1 + q) * self.b + q + q0) / (1 - q0), 5)
        a2 = _up((1 + q) * (a + self.b * at) + e, 5) if self.b else _up((1 + q) * a + e, 3)
        return _CentredBounds(value, (R, _up(f * (1 + q), 2), a2), top, b2, -math.inf, value)

    def __call__(self, c):
        lo, hi, n_bad = _K.center_bounds(self.center, *self.rad, self.top, self.b,
                                         max(self.floor, c))
        if n_bad:      # (the rule left them pending only where none can be)
            raise FpxError("fpx.interval: internal error: a pending GEMM bound is not finite")
        return lo, hi

    def floored(self, c, value):
        return _CentredBounds(self.center, self.rad, self.top, self.b, max(self.floor, c),
                              value, self._maxima)

    def moved(self, move, value, keeps_columns):
        """The same bounds after a reshape or transpose ``move`` of the result (``value``
        its value), or None where a per-column term (a bias row) would not stay per column
        (``keeps_columns``: every element keeps its last-axis index)."""
        shape = np.shape(self.center)
        rad = tuple(move(z) if np.shape(z) == shape else z for z in self.rad)
        if any(np.ndim(z) and np.shape(z) != np.shape(concrete(value)) and not keeps_columns
               for z in rad):
            return None
        # a centre that is the value is the moved value (no copy of its own)
        center = value if self.center is self.value else move(self.center)
        return _CentredBounds(center, rad, self.top, self.b, self.floor, value, self._maxima)


class _ExactCentredBounds(_CentredBounds):
    """A ``_CentredBounds`` about the value (a ball, which a value-centred factor or the
    softmax reads) whose own bounds, forced (also after a ReLU or a move), are tighter:
    ``exact(floor)`` -- a point linear layer's split-K bounds, ~1/sqrt(K) narrower than the
    ball about its value, which they would otherwise become downstream."""
    __slots__ = ("exact",)

    def __init__(self, *args, exact):
        super().__init__(*args)
        self.exact = exact

    def __call__(self, c):
        return self.exact(max(self.floor, c))

    def floored(self, c, value):
        exact, c = self.exact, max(self.floor, c)
        return _ExactCentredBounds(self.center, self.rad, self.top, self.b, c, value,
                                   self._maxima, exact=lambda c2: exact(max(c, c2)))

    def moved(self, move, value, keeps_columns):
        ball, exact = super().moved(move, value, keeps_columns), self.exact
        if ball is None:
            return None
        return _ExactCentredBounds(ball.center, ball.rad, ball.top, ball.b, ball.floor, value,
                                   ball._maxima,
                                   exact=lambda c: tuple(move(z) for z in exact(c)))

    def scaled(self, *args):
        return None            # (the mul rule, on the exact bounds)


def _left_factor(x, v, c2, with_abs=False, bf16=False):
    """``mm_left(v, x.lo, x.hi, c2, stats=True, with_abs, bf16)``, in one pass from pending
    centred bounds (``_CentredBounds`` of this value) without writing them."""
    p = x._pending
    if isinstance(p, _CentredBounds) and p.value is v:
        r = _K.mm_left_ball(v, p.rad[0], c2, with_abs, bf16) if _is_ball(p) else None
        if r is None or not r[1][2] * (1 + 2.0 ** -20) < p.top:    # (nothing past top)
            r = _K.mm_left_centred(v, p.center, *p.rad, p.top, p.b, p.floor, c2, with_abs,
                                   bf16)
        if r is not None:
            return r
    return _K.mm_left(v, x.lo, x.hi, c2, stats=True, with_abs=with_abs, bf16=bf16)


def _is_ball(p):
    """Pending bounds given as a float32 ball about the value (``split_ball``, the softmax's
    ``value=`` form: ``r >= max(v - lo, hi - v)`` of the rule's own bounds, no ReLU folded
    in): a factor may take its radius straight from r, where nothing reaches ``top`` (the
    factor's max(|v| + r), checked by the caller: past it the bounds would be infinite)."""
    return (isinstance(p, _ExactCentredBounds) and p.center is p.value and p.b == 0.0
            and p.floor == -math.inf and np.ndim(p.rad[1]) == 0 and p.rad[1] == 1.0
            and np.ndim(p.rad[2]) == 0 and p.rad[2] == 0.0
            and isinstance(p.rad[0], np.ndarray) and p.rad[0].dtype == np.float32)


def _right_factor(x, v):
    """``mm_right(v, x.lo, x.hi)``, in one pass from pending centred bounds
    (``_CentredBounds`` of this value) without writing them."""
    p = x._pending
    if isinstance(p, _CentredBounds) and p.value is v:
        r = _K.mm_right_ball(v, p.rad[0]) if _is_ball(p) else None
        if r is None or not r[2][2] * (1 + 2.0 ** -20) < p.top:    # (nothing past top)
            r = _K.mm_right_centred(v, p.center, *p.rad, p.top, p.b, p.floor)
        if r is not None:
            return r
    return _K.mm_right(v, x.lo, x.hi)


def _own_point_centre(self, prim, x, w, b, in_sum, params, K, sp, absterm):
    """(centre C, f, absterm) for a point activation: the radius α·T + β·|E| + e with
    |E| <= |C| + e, e <= rel·T + abs the centre's error (``_point_centre``), is at most
    f·T + β·|C| + absterm."""
    center, c_rel, c_abs = _point_centre(self, prim, x, w, b if in_sum else None, params, K)
    return (center, _up(sp.alpha + c_rel * (1 + sp.beta), 3),
            absterm + c_abs * (1 + sp.beta) * (1 + 2 * _E64))


def _conv_block_terms(w):
    """The terms of a point convolution's larger input-channel block (two blocks per group:
    ``_conv_split_bounds``), or 0 where a group has fewer than two input channels."""
    cg = np.shape(w)[1]
    return (cg - cg // 2) * int(np.prod(np.shape(w)[2:])) if cg >= 2 else 0


def _conv_parts(x, w, b, params, rad, add):
    """``conv_blocks_f32`` of a point convolution's two input-channel blocks (see
    ``_conv_split_bounds``): stacked in one grouped convolution where nothing else is per
    channel; None where it does not apply."""
    R = rad[0]
    stacked = (b is None and isinstance(R, np.ndarray) and R.flags.c_contiguous
               and np.isscalar(add) and np.isscalar(rad[1]))
    return _kconv.conv_blocks_f32(x, w, params.get("stride"), params.get("padding"),
                                  params.get("dilation"), params.get("groups"), 2,
                                  stacked=stacked)


def _parts_value(parts, b, shape):
    """fl(fl(P1 + P2) + b) of ``_conv_parts``' blocks (the bias, one more term of the sum, a
    per-channel row): a float32 convolution in one more summation order."""
    if not isinstance(parts[0], list):
        v = np.add(parts[0][:, 0], parts[0][:, 1]).reshape(shape)
    else:
        v = np.add(*parts[0])
    if b is not None:
        np.add(v, np.reshape(b, (-1,) + (1,) * (v.ndim - 2)), out=v)
    return v


def _conv_split_bounds(x, w, b, params, rad, add, split, top, parts=None):
    """(lo, hi) of a float32 point convolution around the float64 sum of two oneDNN float32
    convolutions over halves of each group's input channels (``conv_blocks_f32``; a bias in
    the sum is a third part), each bounded from its own value (``_split_terms``, the same
    kernel as the split-K centre of matmul and linear). For cancelling terms as tight as the
    four-block centre with the classic error it replaced, in one float32 convolution's time
    (the four blocks and the separate float64 sum took ~2 ms more in a ResNet block conv);
    where terms do not cancel at most (1 + 2K_j/K)x the float64 centre's bound. None where
    it does not apply or a centre is not finite (the caller takes the float64 centre)."""
    R = rad[0]
    if parts is None:
        parts = _conv_parts(x, w, b, params, rad, add)
    if parts is None:
        return None
    if not isinstance(parts[0], list):
        n = R.shape[0]
        lo, hi, n_bad = _K.split_center_bounds_stacked(parts[0], R.reshape(n, -1), rad[1], add,
                                                       top, split[2], split[1])
        return None if n_bad else (lo.reshape(R.shape), hi.reshape(R.shape))
    (c1, c2), _ = parts
    c3 = 0.0 if b is None else \
        np.asarray(b, np.float64).reshape((-1,) + (1,) * (np.ndim(c1) - 2))
    lo, hi, n_bad, _ = _K.split_center_bounds((c1, c2), c3, rad[0], rad[1], add, top,
                                              split[2], split[1], math.inf)
    return None if n_bad else (lo, hi)


def _weighted_radius(self, prim, L, w, bias_r, params, K, scale, bf16=True):
    """((R, f, a), (lmax, wmax), in_bf16) with scale·op(|L|, |w|, |b|) <= R·f + a for float32 L, w
    (signs dropped) and a nonnegative bias, and upper bounds of max |L|, max |w| (NaN where one
    has a NaN): a conv on oneDNN in bfloat16 where it runs (``conv_upper_bf16``: magnitudes
    rounded up), a linear layer's GEMM in bfloat16 on AMX for value-centred radii (``bf16``;
    ``_bf16_gemm_upper``; its bias then joins ``a`` as a float64 row), both taking the maxima
    in their rounding pass; else the op in float32 by the parent on |L|, |w|:
    R·(1 - γ_{K+1}(u32))^-1 + K·2^-150 bounds it; ``in_bf16``: R is a bfloat16 GEMM's. (A
    point linear layer's split-K bound takes the bfloat16 radius too, as the matmul rule's
    and a convolution's do. An exact float64 centre keeps float32: its width is the
    radius.)"""
    if prim.name == "conv":
        up = _kconv.conv_upper_bf16(L, w, bias_r, params["stride"], params["padding"],
                                    params["dilation"], params["groups"], maxes=True)
        if up is not None:
            R, f, a, lmax, wmax = up
            return (R, _up(scale * f, 1), _up(scale * a, 1)), (lmax, wmax), True
    elif bf16:
        up = _bf16_gemm_upper(L, w.T, maxes=True)   # linear: |L| @ |w|ᵀ (+ |b| exactly, below)
        if up is not None:
            R, f, a, lmax, wmax = up
            if bias_r is not None:
                a = a + bias_r.astype(np.float64)
            return (R, _up(scale * f, 1), _up(scale * a, 3)), (lmax, wmax), True
    absL, absw = np.abs(_unbits(L)), np.abs(w)
    maxes = (float(np.max(absL)) if absL.size else 0.0, float(np.max(absw)) if absw.size else 0.0)
    R = np.asarray(self.bind_parent(prim, absL, absw, bias_r, **params))
    f = _up(scale / (1.0 - _gamma(K + 1, 2.0 ** -24)), 1)
    return (R, f, f * K * 2.0 ** -150), maxes, False


def _point_centre(self, prim, x, w, b, params, K):
    """(centre, rel, abs): a centre of op(x, w, b) for float32 operands with
    |centre - exact| <= rel·Σ|x||w| (+ rel·|b|) + abs: the op in float64 -- exact products,
    rel = γ_{K+2}(u64) -- on torch's float64 convolution where the float32 one runs on
    oneDNN (one thread pool), else by the parent. (The default centres of float32 point
    operands, split-K and input-channel blocks, are ``_split_terms``'.)"""
    conv_args = (params.get("stride"), params.get("padding"), params.get("dilation"),
                 params.get("groups"))
    exact = _kconv.conv_exact_f32(x, w, b, *conv_args) if prim.name == "conv" else None
    if exact is None:
        exact = self.bind_parent(prim, x.astype(np.float64), w.astype(np.float64),
                                 None if b is None else b.astype(np.float64), **params)
    return exact, _gamma(K + 2, 2.0 ** -53), 0.0


def _centre_of(v):
    """The program's value as a value-centred bound's centre (float32/float64 kept)."""
    center = concrete(v)
    return center if np.asarray(center).dtype in (np.float32, np.float64) else _as_f64(center)


def _out_rounding(self, rad, center, F_out, F_acc):
    """A value-centred radius (R, f, a) plus the rounding that took the program's value from
    its accumulator into F_out (it separates the centre from the accumulator values)."""
    if F_out is None or F_out.name == F_acc.name:
        return rad
    uo, ao = _accuracy_terms(self.accuracy("cast", F_out), [(center, center)])
    q = uo * 2.0 ** (1 - F_out.p)
    return (_K.scale_up(*rad) + _up((np.abs(_as_f64(center)) * q + uo * F_out.smallest_subnormal
                                     + ao) * (1 + 2 * q), 4), 1.0, 0.0)


def _acc_top(F_out, F_acc):
    """Where a matmul's accumulator overflows (inf: float64 bounds overflow by themselves)."""
    return F_acc.max if (F_out is not None and F_acc.has_inf and F_acc.name != "float64") \
        else math.inf


def _matmul_close(self, v, center, rad, Ah, Bh, K, c, prec, F_out, ops, rounded_inputs, amax,
                  bmax, au, bu, cb=0.0, bounds=None):
    """centre ± radius (``rad`` = (R, f, a), radius <= R·f + a + cb·|centre|; or ``bounds``
    made already, with finite centres and no NaN), widened for this float64 step, the
    accumulator's overflow mapped (see _matmul_guard), rounded into F_out."""
    F_in, F_acc = prec.input, prec.accumulate
    top = _acc_top(F_out, F_acc)
    with np.errstate(all="ignore"):
        if bounds is None:   # n_bad: non-finite centres, NaN bounds
            lo, hi, n_bad = _K.center_bounds(center, *rad, top, cb)
        else:
            (lo, hi), n_bad = bounds, 0
        if F_out is not None:
            lo, hi = _matmul_guard(lo, hi, center, Ah, Bh, K, c, F_acc, ops,
                                   F_in.max if rounded_inputs else math.inf, amax, bmax,
                                   clean=n_bad == 0)
        if F_out is not None and F_out.name != F_acc.name:
            lo, hi = _round_bounds(lo, hi, F_out, self.accuracy("cast", F_out))
        elif F_out is not None and not F_out.has_inf:
            lo, hi = _overflow(lo, hi, F_out)
    return self.new(v, lo, hi, _matmul_unstable(au, bu, np.shape(lo)))


class _LazyAbs:
    """|v| + r for an interval operand, built only if the overflow screen needs the array
    (``max`` is known from the fused stats, rounded up)."""

    def __init__(self, v, lo, hi, amax):
        self.v, self.lo, self.hi, self.max = v, lo, hi, _up(amax, 4)

    def array(self):
        v = _as_f64(self.v)
        return _up(np.abs(v) + _up(np.maximum(v - self.lo, self.hi - v), 1))


def _matmul_guard(lo, hi, center, Ah, Bh, K, c, F_acc, ops, in_top=math.inf, amax=None,
                  bmax=None, clean=False):
    """±inf where a product or partial sum may overflow the accumulator (|A||B|·(1+c) past
    its largest value; one extra float64 GEMM, only when the maxima say it is possible), where
    an operand's conversion to the input format may overflow (``in_top``: that format's
    largest value, for rounded inputs such as tf32), and where the centre is not finite; NaN
    bounds from inf - inf with no NaN among the operands' bounds in that row/column mean
    "unbounded", not "undefined". ``ops``: (lo, hi, value) of each operand (lo None for
    constants; ``amax``/``bmax``: the maxima of Ah/Bh where known; ``clean``: no centre is
    non-finite and no bound NaN)."""
    top = F_acc.max
    if amax is None:
        amax = float(Ah.max) if isinstance(Ah, _LazyAbs) else \
            (float(np.max(Ah)) if np.size(Ah) else 0.0)
    if bmax is None:
        bmax = float(Bh.max) if isinstance(Bh, _LazyAbs) else \
            (float(np.max(Bh)) if np.size(Bh) else 0.0)
    if not amax * bmax * K * (1.0 + c) * (1 + 2.0 ** -40) <= top:
        # the arrays are needed only by the (rare) overflow GEMM below
        Ah, Bh = (x.array() if isinstance(x, _LazyAbs) else x for x in (Ah, Bh))
    over = False if clean else ~np.isfinite(center)
    if amax > in_top or bmax > in_top:
        over = over | _matmul_unstable(np.asarray(Ah) > in_top, np.asarray(Bh) > in_top,
                                       np.shape(lo))
    if not amax * bmax * K * (1.0 + c) * (1 + 2.0 ** -40) <= top:
        M = _gemm_upper(_as_f64(Ah), _as_f64(Bh), K, False)
        over = over | (_up(M * (1.0 + c), 2) > top)
    bad = False if clean else np.isnan(lo) | np.isnan(hi)
    if np.any(bad):
        na, nb = [np.isnan(_as_f64(p)) if l is None else (np.isnan(l) | np.isnan(h))
                  for l, h, p in ops]
        over = over | (bad & ~_matmul_unstable(na, nb, np.shape(lo)))
    if np.any(over):
        over = np.broadcast_to(over, np.shape(lo))
        lo, hi = np.where(over, -np.inf, lo), np.where(over, np.inf, hi)
    return lo, hi


def _narrow(ra, Ah, rb, Bh, c):
    """Heuristic: are the operand intervals so narrow that centring on the program's value
    (which counts its rounding error twice) would noticeably widen the bound? Then an exact
    float64 centre is worth its GEMM."""
    rho = float(np.sum(ra)) / max(float(np.sum(Ah)), 1e-300) + \
        float(np.sum(rb)) / max(float(np.sum(Bh)), 1e-300)
    return rho < 4 * c


def _exact_matmul(self, v, a, b):
    """An integer or bool matmul is exact arithmetic (no rounding to bound): the exact
    product's range over the operand intervals, midpoint-radius in float64 --
    ``|A·B − Ma·Mb| <= |Ma|·Rb + Ra·(|Mb| + Rb)`` plus the float64 GEMMs' own error
    ``γ_{K+2}(u64)·(|Ma| + Ra)·(|Mb| + Rb)`` (operands may pass 2^53) -- then tightened to the
    integers, with the dtype's whole range where NumPy's wrap-around may have happened. A bool
    matmul (NumPy: any of the ands) is true where that sum is certainly >= 1, possibly where
    it may be (unstable between)."""
    (alo, ahi, au, _), (blo, bhi, bu, _) = self.bounds(a), self.bounds(b)
    K = np.shape(alo)[-1] if np.ndim(alo) else 1
    with np.errstate(all="ignore"):
        ma, mb = (alo + ahi) / 2, (blo + bhi) / 2
        ra = _up(np.maximum(ma - alo, ahi - ma), 1)
        rb = _up(np.maximum(mb - blo, bhi - mb), 1)
        abs_ma, abs_mb = np.abs(ma), np.abs(mb)
        rad = _up(_gemm_upper(abs_ma, rb, K, False) + _gemm_upper(ra, _up(abs_mb + rb), K, False)
                  + _gemm_upper(_up(abs_ma + ra), _up(abs_mb + rb), K, False,
                                _gamma(K + 2, 2.0 ** -53)), 2)
        center = _gemm(ma, mb)
        lo, hi = _widen(center - rad, center + rad, 1)
    dt = np.asarray(concrete(v)).dtype
    un = _matmul_unstable(au, bu, np.shape(lo))
    if dt.kind == "b":       # the sum is an integer: >= 1 once its bounds are tightened
        lo, hi, undecided = _bool_interval(np.ceil(lo) >= 1, np.floor(hi) >= 1)
        return self.new(v, lo, hi, _or_unstable(un, undecided if np.any(undecided) else None))
    lo, hi = self._integer_bounds("matmul", dt, lo, hi)
    return self.new(v, lo, hi, un)


def _matmul_unstable(au, bu, shape):
    if au is None and bu is None:
        return None
    out = np.zeros(shape, bool)
    if au is not None:
        out |= np.broadcast_to(np.any(au, axis=-1, keepdims=True) if np.ndim(au) > 1
                               else np.any(au), shape)
    if bu is not None:
        bb = np.any(bu, axis=-2, keepdims=True) if np.ndim(bu) > 1 else np.any(bu)
        out |= np.broadcast_to(bb, shape)
    return out


# =============================================================================================
# Composites with rules of their own
# =============================================================================================
def _rel_abs(acc, F):
    """(relative, absolute) error of one evaluation with a constant accuracy in format F."""
    return acc.ulps * 2.0 ** (1 - F.p), acc.ulps * F.smallest_subnormal + acc.absolute


@_rule("log_softmax")
def _log_softmax(self, prim, x, *, axis=-1):
    """log_softmax as its decomposition, the upper bound cut at that of a single element 0
    (``c``, ~0): every execution's result is at most that -- x - max(x) rounds to s <= 0 (0
    for the largest), so the sum of the exps is >= the computed exp(0), every log of such a
    sum is >= the least log of [exp(0)]'s bound (log is increasing, its error bound grows
    with |log|, and log 1 = 0 is inside), and s - log(sum) <= 0 - log(exp(0)) rounds to at
    most c -- the same argument for the fused x - (max + log Σ). The interval ops do not see
    it: the largest element's bound reached above 0, or +inf where a wide box's exps
    overflowed."""
    y = prim.decomposition(x, axis=axis)
    if not self._own(y):
        return y
    dt = np.asarray(self.primal_of(x)).dtype
    zero = self.new(np.zeros(1, dt), np.zeros(1), np.zeros(1))
    c = float(np.max(prim.decomposition(zero, axis=0).hi))
    return self.new(y.primal, y.lo, np.minimum(y.hi, max(c, 0.0)), y.unstable)


@_rule("softmax")
def _softmax(self, prim, x, *, axis=-1):
    """Monotone bound of softmax (a composite): y_i increases with x_i and decreases with every
    other x_j, so over a box y_i lies in [e(lo_i) / (e(lo_i) + sum_{j!=i} e(hi_j)),
    e(hi_i) / (e(hi_i) + sum_{j!=i} e(lo_j))] -- exact where interval arithmetic on the
    decomposition loses the correlation of x - max(x) and e / sum(e). The program's own
    evaluation (subtract the max, exp, sum in any order, divide -- or multiply by the
    reciprocal) is covered by widening the box by the subtraction's rounding and multiplying
    by the exp/sum/division error factors from the policy. Applies where the policy's
    accuracies for sub/exp/div are constants and the input bounds are finite; elsewhere the
    decomposition runs ("where the policy allows"), and for point inputs and float64 programs
    (where the decomposition is as tight)."""
    vx = concrete(self.primal_of(x))
    dt = np.asarray(vx).dtype
    # pending centred bounds (attention's scores), all finite, rows along the last axis: the
    # kernel computes them row by row, not written (``softmax_bounds_centred``)
    cen = x._pending if self._own(x) and x.unstable is None else None
    if not (isinstance(cen, _CentredBounds) and np.ndim(vx) > 0 and axis % np.ndim(vx)
            == np.ndim(vx) - 1 and _K.rows_of(cen.center, *cen.rad) and cen.finite()):
        cen = None
    lo, hi, u, pt = (None, None, None, False) if cen is not None else self.bounds(x)
    F = _fmt_of(dt)
    accs = None
    # point inputs gain nothing over the decomposition, and float64 programs need more
    # precision than the float64 evaluation of this bound has: decomposition there
    if F is not None and F.p < 53 and (cen is not None or (
            not pt and not _is_cupy(lo) and np.ndim(lo) > 0 and _K.any_differ(lo, hi))):
        accs = [self.accuracy(n, F) for n in ("sub", "exp", "div")]
        Facc = self.resolve("reduce_sum", dt).accumulate
        if any(a.input_dependent for a in accs) or \
                self.accuracy("reduce_sum", Facc).input_dependent:
            accs = None
    if accs is None or not (cen is not None or (_all_finite(lo) and _all_finite(hi))):
        return prim.decomposition(x, axis=axis)
    v = _blas.softmax(vx, axis) if type(self.parent) is EvalInterpreter else None
    if v is None:
        v = self.value_of(prim, (x,), {"axis": axis})
    ax = axis % np.ndim(vx)
    n = np.shape(vx)[ax]
    (r_s, a_s), (r_e, a_e), (r_d, a_d) = (_rel_abs(a, F) for a in accs)
    gam = self.gamma(max(n - 1, 0), _acc_delta(self, "reduce_sum", Facc))
    beta = n * Facc.smallest_subnormal
    # torch multiplies by the reciprocal of the sum: two roundings cover both spellings
    r_d, a_d = 2 * r_d + r_d * r_d, 2 * a_d * (1 + r_d)
    k = 16 * _E64
    dlow = (1 - r_e) * (1 - gam) - n * a_e * (1 + gam) - beta
    dhigh = (1 + r_e) * (1 + gam) + n * a_e * (1 + gam) + beta
    if not dlow > 0:
        return prim.decomposition(x, axis=axis)
    un = None if u is None else np.broadcast_to(np.any(u, axis=ax, keepdims=True), np.shape(lo))
    if cen is not None and n > 0:
        args = (cen.center, *cen.rad, cen.top, cen.b, cen.floor, r_s, a_s, k, r_e, a_e, r_d,
                a_d, dlow, dhigh, _gamma(n + 2, 2.0 ** -53), _LIBM64_ULPS)
        if (isinstance(v, np.ndarray) and v.dtype == np.float32 and v.shape == np.shape(vx)
                and v.flags.c_contiguous):
            # pending: a float32 ball about the value (4 bytes per score written instead of
            # 16; attention's P·V reads it as its left factor, which is centred on the value
            # anyway), the bounds themselves recomputed only where forced
            r32, n_bad = _K.softmax_bounds_centred(*args, value=v)
            if not n_bad:
                def exact(floor):
                    lo, hi = _K.softmax_bounds_centred(*args)
                    return (lo, hi) if floor == -math.inf else \
                        (np.maximum(lo, floor), np.maximum(hi, floor))
                return self.new_pending(v, _ExactCentredBounds(
                    v, (r32, 1.0, 0.0), math.inf, 0.0, -math.inf, v, exact=exact))
        ylo, yhi = _K.softmax_bounds_centred(*args)
        return self.new(v, ylo, yhi)
    if cen is not None:
        lo, hi = x.lo, x.hi
    if isinstance(lo, np.ndarray) and isinstance(hi, np.ndarray) and n > 0:
        # the same bound, one row at a time in a compiled loop (kernels/interval.py)
        lo_t, hi_t = np.moveaxis(lo, ax, -1), np.moveaxis(hi, ax, -1)
        ylo, yhi = _K.softmax_bounds(lo_t, hi_t, r_s, a_s, k, r_e, a_e, r_d, a_d, dlow, dhigh,
                                     _gamma(n + 2, 2.0 ** -53), _LIBM64_ULPS)
        return self.new(v, np.moveaxis(ylo, -1, ax), np.moveaxis(yhi, -1, ax), un)
    return self.new(v, *_softmax_bounds_np(lo, hi, ax, n, r_s, a_s, k, r_e, a_e, r_d, a_d, dlow,
                                           dhigh), un)


def _max_of_others(a, ax):
    """max over the axis of every element but the one itself (the row's largest, or for the
    first position of the largest the second largest)."""
    xp = _xp(a)
    first = xp.argmax(a, axis=ax, keepdims=True)
    m1 = xp.take_along_axis(a, first, axis=ax)
    pos = xp.arange(a.shape[ax]).reshape([-1 if d == ax % a.ndim else 1 for d in range(a.ndim)])
    m2 = xp.max(xp.where(pos == first, -xp.inf, a), axis=ax, keepdims=True)
    return xp.where(pos == first, m2, m1)


def _softmax_bounds_np(lo, hi, ax, n, r_s, a_s, k, r_e, a_e, r_d, a_d, dlow, dhigh):
    """The softmax rule's bound in array operations (any backend; the reference for
    ``_K.softmax_bounds``)."""
    with np.errstate(all="ignore"):
        # the subtraction x - max(x) rounds: an input perturbation of r_s |x - M| + a_s
        mlo = np.max(lo, axis=ax, keepdims=True)
        mhi = np.max(hi, axis=ax, keepdims=True)
        dist = np.maximum(np.abs(lo - mhi), np.abs(hi - mlo))
        pert = (r_s * dist + a_s) * (1 + k)
        xl, xh = lo - pert, hi + pert
        xl, xh = xl - k * np.abs(xl) - _TINY64, xh + k * np.abs(xh) + _TINY64
        # exact softmax range over the box, in float64 with outward error allowances
        m = np.max(xh, axis=ax, keepdims=True)
        dl, dh = xl - m, xh - m
        rho_l = (_LIBM64_ULPS + 4 + np.abs(dl)) * _E64
        rho_h = (_LIBM64_ULPS + 4 + np.abs(dh)) * _E64
        el = np.exp(dl) * (1 - rho_l)
        eh = np.exp(dh) * (1 + rho_h)
        g64 = _gamma(n + 2, 2.0 ** -53)
        sh = np.sum(eh, axis=ax, keepdims=True) * (1 + g64)
        sl = np.sum(el, axis=ax, keepdims=True) * (1 - g64)
        others_hi = (sh - eh) * (1 + 2 * _E64)
        others_lo = np.maximum((sl - el) * (1 - 2 * _E64), 0.0)
        plo = np.maximum(el / (el + others_hi) * (1 - 4 * _E64), 0.0)
        phi = eh / (eh + others_lo) * (1 + 4 * _E64)
        # where the exps underflow (a box far wider than float64's exp range), in the log
        # domain: the ratio is at least 1/(1 + (n-1)·exp(max_{k != j} dh_k - dl_j)) and, the
        # denominator being at least its largest term, at most exp(dh_j - max(dh_j, max_{k != j} dl_k))
        t = _max_of_others(dh, ax) - dl
        # (t = -inf: no other element, n = 1; exp's error factor would make 0·inf NaN)
        et = np.where(t == -np.inf, 0.0,
                      np.exp(t) * (1 + (_LIBM64_ULPS + 4 + np.abs(t)) * _E64) + _TINY64)
        plo = np.where(el == 0, np.maximum(1.0 / (1.0 + (n - 1) * et * (1 + 2 * _E64))
                                           * (1 - 4 * _E64), 0.0), plo)
        t = dh - np.maximum(dh, _max_of_others(dl, ax))
        phi = np.where(eh + others_lo == 0,
                       np.exp(t) * (1 + (_LIBM64_ULPS + 4 + np.abs(t)) * _E64) + _TINY64, phi)
        phi = np.minimum(phi, 1.0)
        # the evaluation's errors: exp (relative r_e, absolute a_e), the sum (gamma, beta:
        # dlow/dhigh), the division; the exact sum is >= 1 (the max's own term is exp(0))
        nl = plo * (1 - r_e) - a_e
        nh = phi * (1 + r_e) + a_e
        qlo = np.where(nl >= 0, nl / dhigh, nl / dlow)
        qhi = nh / dlow
        ylo = (qlo * (1 - r_d) - a_d) * (1 - k) - np.abs(qlo) * k - _TINY64
        yhi = (qhi * (1 + r_d) + a_d) * (1 + k) + _TINY64
    return ylo, yhi


@_rule("scaled_dot_product_attention")
def _sdpa(self, prim, q, k, v, mask=None, *, is_causal, scale):
    """Attention as its decomposition, but where the scores' bounds are finite no execution
    has a row of -inf scores: PyTorch's safe-softmax masking (a comparison, a reduction and
    two selections over the whole score block) is then the identity and is skipped."""
    s = _nn._sdpa_scores(q, k, mask, is_causal, scale)
    if self._own(s) and isinstance(s._pending, _CentredBounds):   # (not written: scalars)
        safe = not s._pending.finite()
    else:
        safe = not (self._own(s) and isinstance(s.lo, np.ndarray)
                    and isinstance(s.hi, np.ndarray) and _all_finite(s.lo) and _all_finite(s.hi))
    return _nn._sdpa_finish(s, v, safe=safe)


def _broadcasts_to(shape, target):
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


def _all_finite(x):
    """No inf or NaN in x (a sum is: inf - inf and NaN propagate; one pass, no bool array).
    A sum that overflows says False too: callers take their general path (for float64
    bounds only past ~1e308 / n, where no fast rule is tight anyway)."""
    with np.errstate(all="ignore"):
        return bool(np.isfinite(np.sum(x)))


@_rule("layer_norm")
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
    lo, hi, u, _ = self.bounds(x)
    vx = self.primal_of(x)
    if not (isinstance(lo, np.ndarray) and isinstance(hi, np.ndarray)
            and isinstance(vx, np.ndarray) and lo.ndim > 0 and lo.size > 0):
        return None
    dt = vx.dtype
    F = _fmt_of(dt)
    if F is None:
        return None
    nd = lo.ndim
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
        tail = tuple(lo.shape[a] for a in axes)
        if not trailing or not isinstance(pc, np.ndarray) or pc.dtype != dt or \
                pc.ndim > len(tail) or not _broadcasts_to(pc.shape, tail):
            return None      # varies over the rows (or does not fit): the decomposition
        params.append(pc)
    accs = [self.accuracy(n, F) for n in ("sub", "mul", "div", "add", "sqrt")]
    Facc = self.resolve("reduce_sum", dt).accumulate
    acc_sum = self.accuracy("reduce_sum", Facc)
    if any(a.input_dependent for a in accs) or acc_sum.input_dependent:
        return None
    n = _count(lo.shape, axes)
    q = 2.0 ** (1 - F.p)
    d_op = max(a.ulps for a in accs[:4]) * q
    delta = max(d_op, acc_sum.ulps * 2.0 ** (1 - Facc.p))
    g_v = self.gamma(2 * n + 8, delta)
    if not g_v <= 0.125:
        return None          # too long a row for the format: the bound would be unbounded
    g_mu = self.gamma(n + 2, delta)
    g_out = _gamma(5, d_op)
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
        rows = int(np.prod([lo.shape[a] for a in lead]))
        vk = vx if dt in (np.float32, np.float64) else vx.astype(np.float32)   # exact
        blocks = [np.ascontiguousarray(np.transpose(z, order)).reshape(rows, n)
                  for z in (vk, lo, hi)]
        tail = tuple(lo.shape[a] for a in axes)
        wb = [p if np.ndim(p) == 0 else
              np.ascontiguousarray(np.broadcast_to(p, tail), np.float64).reshape(n)
              for p in params]
        top = F.max if F.has_inf and F.name != "float64" else math.inf
        lim = min(F.max, Facc.max) / 4
        ylo, yhi, n_bad = _K.layer_norm_bounds(*blocks, *wb, min(eps, eps_f), max(eps, eps_f),
                                               g_mu, g_v, g_out, d_op, d_s, eta, top, lim)
        if n_bad:            # an intermediate may overflow, or an input is not finite: the
            # decomposition models that
            return None
        shape_t = tuple(lo.shape[a] for a in order)
        inv = np.argsort(order)
        ylo = np.transpose(ylo.reshape(shape_t), inv)
        yhi = np.transpose(yhi.reshape(shape_t), inv)
        if not F.has_inf:
            ylo, yhi = _overflow(ylo, yhi, F)
    un = None if u is None else np.broadcast_to(np.any(u, axis=axes, keepdims=True), lo.shape)
    return self.new(v, ylo, yhi, un)


@_rule("rms_norm")
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
    if not (isinstance(lo, np.ndarray) and _all_finite(lo) and _all_finite(hi)):
        return y
    if weight is not None and self._own(weight) and not weight.point:
        return y
    F = _fmt_of(np.asarray(self.primal_of(y)).dtype)
    dt = np.asarray(self.primal_of(x)).dtype
    Fx = _fmt_of(dt)
    if F is None or Fx is None:
        return y
    accs = [self.accuracy(n, f) for n in ("mul", "div", "add", "sqrt", "cast") for f in (Fx, F)]
    Facc = self.resolve("reduce_sum", dt).accumulate
    acc_sum = self.accuracy("reduce_sum", Facc)
    if any(a.input_dependent for a in accs) or acc_sum.input_dependent:
        return y
    n = _count(lo.shape, axis)
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
    w = 1.0 if weight is None else np.abs(_as_f64(self.primal_of(weight)))
    with np.errstate(all="ignore"):
        top = _up((q + eta) * w * (1 + delta) + eta, 2)
        if not np.all(np.isfinite(top)):
            return y
        ylo, yhi = np.maximum(y.lo, -top), np.minimum(y.hi, top)
    return self.new(y.primal, ylo, yhi, y.unstable, y.point)


# =============================================================================================
# The transform
# =============================================================================================
def interval(f=None, *, policy=None, branches: str = "hull", bound: str = "rigorous",
             confidence: float = 0.999, matmul: str = "midrad"):
    """``interval(f)(*args)`` -> ``f``'s outputs as :class:`Interval` objects (same pytree).

    Inputs may be arrays (point intervals) or :class:`Interval` objects. ``policy``: a precision
    policy or preset name (default ``"numpy"``). ``branches``: ``"hull"`` (sound) or
    ``"concrete"`` (RENDER's observed-branch semantics). ``bound``: ``"rigorous"`` or
    ``"probabilistic"`` (Higham & Mary 2019, λ·sqrt(n)·u with the given ``confidence``; not a
    guarantee). ``matmul``: ``"midrad"`` (default: a centre of its own for point or narrow
    operands -- a float64 GEMM, or for float32 points a split-K pair of float32 GEMMs (a
    convolution on oneDNN: float32 blocks of its input channels), ~1.2-1.5x wider than exact
    and 2-3x cheaper -- else centred on the program's value), ``"fast"`` (always centred on
    the value: no extra GEMM, up to 2x wider on point operands), ``"exact-center"`` (always a float64 centre) or ``"render"`` (RENDER's
    per-element scalar-loop bound, numba; for comparison).
    Usable as a decorator: ``@fpx.interval`` or ``@fpx.interval(policy="cuda")``.

    ``f`` may be a ``torch.nn.Module`` or a function of torch tensors (``fpx.transform.adapt``):
    inputs are torch tensors (or Intervals whose ``value`` is one), outputs Intervals whose
    ``value`` is a torch tensor of the program's dtype; the default policy is then torch's
    (``fpx.interop.torch.default_policy``).
    """
    if f is None:
        return lambda g: interval(g, policy=policy, branches=branches, bound=bound,
                                  confidence=confidence, matmul=matmul)

    @wraps(f)
    def bounded(*args, **kwargs):
        ad = adapt(f, args, kwargs)
        interp, out = run_interval(ad.fn, ad.args, ad.kwargs,
                                   policy=ad.policy if policy is None else policy,
                                   branches=branches, bound=bound, confidence=confidence,
                                   matmul=matmul)
        return ad.to_user(out)
    return bounded


def run_interval(f, args, kwargs, **options):
    """Run ``f`` under a new :class:`IntervalInterpreter`; return (interpreter, outputs as
    Intervals). ``classify`` uses this to read the interpreter's events."""
    leaves, td = tree.flatten((args, kwargs))
    if any(_on_device(x) for x in leaves):
        return _run_interval_from_device(f, leaves, td, **options)
    interp = IntervalInterpreter(current_interpreter(), **options)
    token = _FLUSHED.set(frozenset(interp.policy.flush_to_zero))
    try:
        wrapped = []
        for i, x in enumerate(leaves):
            if isinstance(x, Interval):
                value, lo, hi, point = x.value, x.lo, x.hi, _is_point(x.lo, x.hi)
            elif is_array_leaf(x):
                check_dtype(x, f"input leaf {i} of {getattr(f, '__name__', 'f')}")
                value, lo, point = x, _as_f64(concrete(x)), True
                hi = lo
            else:
                wrapped.append(x)
                continue
            F = _fmt_of(np.asarray(concrete(as_array(value))).dtype)
            if isinstance(F, _formats.FlushedFormat):
                lo, hi, moved = _flush_inputs(lo, hi, F)
                point = point and not moved
            wrapped.append(IntervalTracer(interp, value, lo, hi,
                                          x.unstable if isinstance(x, Interval) else None, point))
        a, k = tree.unflatten(td, wrapped)
        with using(interp):
            out = f(*a, **k)
        o_leaves, o_td = tree.flatten(out)
        res = []
        for x in o_leaves:
            if isinstance(x, IntervalTracer) and x._interp is interp:
                res.append(Interval._trusted(x.lo, x.hi, x.primal, x.unstable))
            elif is_array_leaf(x) or isinstance(x, (bool, int, float)):
                c = _as_f64(concrete(x))
                res.append(Interval(c, c, x))
            else:
                res.append(x)
    finally:
        _FLUSHED.reset(token)
    return interp, tree.unflatten(o_td, res)


def _on_device(x) -> bool:
    if isinstance(x, Interval):
        return _is_cupy(x.lo) or _is_cupy(x.hi) or _is_cupy(concrete(as_array(x.value)))
    if isinstance(x, Tracer) and _is_cupy(concrete(x)):
        raise FpxError("fpx.interval: a CuPy-valued tracer of an enclosing transform; nest "
                       "fpx.interval over CuPy arrays only at the outermost level")
    return _is_cupy(x)


def _run_interval_from_device(f, leaves, td, **options):
    """CuPy inputs. The rules' NumPy calls and numba kernels are CPU code, so the bounds are
    computed on host copies of the inputs (the transfer is exact) under the ``"cupy"`` policy
    unless one is given (a torch program's default is torch's CUDA policy); the program runs
    once more on the GPU for its own ``value``; lo, hi, value and unstable come back as CuPy
    arrays. The GPU's result is inside the bound when the policy describes the GPU's
    arithmetic: the bound holds for any summation order, and the policy gives the CUDA math
    library's documented errors, CuPy's float16 accumulation and its flush-to-zero."""
    import cupy
    host = [Interval._trusted(to_host(x.lo), to_host(x.hi), to_host(concrete(as_array(x.value))),
                              None if x.unstable is None else to_host(x.unstable))
            if isinstance(x, Interval) else x for x in leaves]
    plain = [x.value if isinstance(x, Interval) else x for x in leaves]
    if options.get("policy") is None:
        options = dict(options, policy="cupy")
    f_host, host = on_host(f, host)
    interp, out = run_interval(f_host, *tree.unflatten(td, host), **options)
    a, k = tree.unflatten(td, plain)
    on_gpu = f(*a, **k)
    o_leaves, o_td = tree.flatten(out)
    g_leaves, _ = tree.flatten(on_gpu)
    if len(g_leaves) != len(o_leaves):
        raise FpxError(f"fpx.interval: the program gave {len(g_leaves)} outputs on the GPU and "
                       f"{len(o_leaves)} on the host copies")
    res = []
    for iv, g in zip(o_leaves, g_leaves):
        if not isinstance(iv, Interval):
            res.append(iv)
            continue
        g = concrete(g)
        value = g if _is_cupy(g) else cupy.asarray(iv.value)
        un = None if iv.unstable is None else cupy.asarray(iv.unstable)
        res.append(Interval._trusted(cupy.asarray(iv.lo), cupy.asarray(iv.hi), value, un))
    return interp, tree.unflatten(o_td, res)
