"""The interval interpreter: its tracer (a value with a box or a ball around it), the rule
tables, and what every rule shares -- operands' bounds, the policy's formats and accuracies,
γ constants, and one result's rounding.

A traced value carries ``value`` (the program's own result, computed by the parent interpreter
in the program's dtypes) and a sound enclosure of every result round-off could give, in one of
two representations (both float64-sound, see ``enclosure``):

* a **box** ``lo <= y <= hi`` (float64 arrays): what elementwise rules take and give;
* a **ball** ``|y - value| <= rad`` (Rump 1999's midpoint-radius form centred on the program's
  value): what value-centred matmuls give and take, and what a bias, a ReLU, a scale by a
  constant and exact movement keep (``ball_rules``). ``lo``/``hi`` of a ball are formed on
  first use by one conversion kernel (``kernels.interval.center_bounds``), and a box becomes a
  ball by another (``ball_radius``).
"""
from __future__ import annotations

import math
import operator

import numpy as np

from fpx import formats as _formats
from fpx.core import Interpreter, Tracer, _user_frame, concrete, scalar_operator_active
from fpx.kernels import interval as _K
from fpx.policy import get_policy
from fpx.transforms.interval.enclosure import (E64, accuracy_terms, as_f64, gamma, or_unstable,
                                               round_bounds, rounding_terms, sign_keeping, truth,
                                               widen)
from fpx.transforms.interval.result import Event

MATMUL_MODES = ("midrad", "fast", "exact-center")


#: primitives a Python operator on scalars computes (``value_of``)
_SCALAR_OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
               "div": operator.truediv, "pow": operator.pow, "neg": operator.neg,
               "abs": operator.abs, "floor_divide": operator.floordiv,
               "remainder": operator.mod}


def _shape(x):
    """``np.shape(x)``, without NumPy's dispatch for an array (most calls: every rule's
    result goes through it)."""
    return x.shape if type(x) is np.ndarray else np.shape(x)


def value_dtype(v):
    """The dtype of a program value (a concrete array or scalar, or a tracer of one)."""
    c = concrete(v)
    return c.dtype if type(c) is np.ndarray else np.asarray(c).dtype


#: arrays up to this many elements are copied to C order before a kernel reads them
SMALL = 2 ** 14


def dense(a):
    """``a`` in C order where it is a small strided array (a gate sliced out of a recurrent
    cell's GEMM, a head-split activation): the copy costs less than the kernels' layout
    analysis (``kernels.interval._flat``), which copies such a slice anyway -- the same
    elements, so the same bounds; read-only, as the view was not the kernels' to write
    into (``enclosure.owned``). Anything else as it is."""
    if type(a) is np.ndarray and not a.flags.c_contiguous and a.size <= SMALL:
        a = np.ascontiguousarray(a)
        a.flags.writeable = False
    return a


def _as_shape(a, shape):
    """An operand's bound laid out as the kernels take it in place: with as many elements as
    the result, of the result's shape (a view: the shapes then differ by leading 1s only, as
    broadcasting does); a 0-d array as a NumPy scalar (a constant's bound). The same values:
    their broadcast is the one the op makes."""
    if type(a) is np.ndarray and a.shape != shape:
        if not a.ndim:
            return a[()]
        if a.size == math.prod(shape) and a.size:
            return a.reshape(shape)
    return a


def _memo(cache, key, make):
    """``cache[key]``, made by ``make()`` on first use (a key that is not hashable: made each
    time) -- the per-run caches of what the policy says about an op or a dtype."""
    try:
        return cache[key]
    except KeyError:
        pass
    except TypeError:
        return make()
    got = cache[key] = make()
    return got


def _frozen(a, shape):
    """``a`` as a read-only array of ``shape`` (a tracer's bound: no kernel may then write its
    result into it, see ``enclosure.owned``): a fresh array of that shape is marked read-only
    in place, anything else broadcast (a read-only view)."""
    if type(a) is np.ndarray and a.shape == shape:
        a.flags.writeable = False
        return a
    return np.broadcast_to(a, shape)


class IntervalTracer(Tracer):
    """A traced value and its enclosure: a box (``lo``, ``hi``) or a ball (``rad`` about the
    value; ``top``: past this magnitude an execution may overflow, so the box is infinite
    there; ``clip``: scalars (floor, ceil) every execution lies between -- a ReLU's or a
    clamp's, which a ball about the value cannot say -- applied to its box). ``point``: the
    enclosure is the value itself (no round-off yet; a point input's float64 box is made when
    a rule first asks for it)."""
    __slots__ = ("_lo", "_hi", "rad", "top", "clip", "unstable", "point")

    def __init__(self, interp, primal, lo, hi, unstable=None, point=False, rad=None,
                 top=math.inf, clip=(-math.inf, math.inf)):
        super().__init__(interp, primal)
        self._lo, self._hi, self.rad, self.top, self.clip = lo, hi, rad, top, clip
        self.unstable, self.point = unstable, point

    def _box(self):
        v = concrete(self.primal)
        if self.rad is None:            # a point input: its value in float64
            self._lo = self._hi = as_f64(v)
            return
        if np.asarray(v).dtype not in (np.float32, np.float64):
            v = as_f64(v)
        lo, hi, _ = _K.center_bounds(dense(v), dense(self.rad), 1.0, 0.0, self.top, 0.0,
                                     *self.clip)
        shape = np.shape(concrete(self.primal))
        self._lo, self._hi = _frozen(lo, shape), _frozen(hi, shape)

    @property
    def lo(self):
        if self._lo is None:
            self._box()
        return self._lo

    @property
    def hi(self):
        if self._hi is None:
            self._box()
        return self._hi

    @property
    def is_ball(self):
        return self.rad is not None


class IntervalInterpreter(Interpreter):
    """Bounds every primitive. ``rules`` take boxes (a ball operand's box is formed on
    access); ``ball_rules`` are tried first where an operand is a ball and return None where
    they do not apply."""
    ball_rules: dict = {}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls.ball_rules = dict(cls.ball_rules)   # (each subclass its own copy, as ``rules``)

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
        if matmul not in MATMUL_MODES:
            raise ValueError(f"fpx.interval: matmul must be one of {MATMUL_MODES}, not {matmul!r}")
        self.policy = get_policy(policy)
        self.branches, self.bound, self.confidence, self.matmul = branches, bound, confidence, matmul
        self.events: list[Event] = []
        self._acc_cache: dict = {}
        self._formats: dict = {}
        self._fmt_cache: dict = {}      # dtype -> fmt(dtype)
        self._fused: dict = {}          # (op, format, steps) -> fused_terms(...)
        self._resolved: dict = {}       # (op, dtype) -> resolve(op, dtype)

    def process(self, prim, args, params):
        rule = self.ball_rules.get(prim.name)
        if rule is not None and self._any_ball(args):
            y = rule(self, prim, *args, **params)
            if y is not None:
                return y
        return super().process(prim, args, params)

    def _any_ball(self, args):
        for a in args:
            if isinstance(a, IntervalTracer) and a._interp is self and a.rad is not None:
                return True
        return False

    @classmethod
    def def_ball_rule(cls, *names):
        """Register a rule for ``names`` that takes ball operands (see the class docstring)."""
        def deco(rule):
            for name in names:
                cls.ball_rules[name] = rule
            return rule
        return deco

    # -- formats and accuracies ------------------------------------------------------------
    def fmt(self, dtype):
        """The format of a ``dtype`` result under the policy (``formats.FlushedFormat`` where
        the policy flushes it to zero); None for integer and bool dtypes. Resolved once per
        dtype (every rule asks)."""
        def make():
            try:
                return self.flushed(_formats.get(dtype))
            except (TypeError, ValueError):
                return None
        return _memo(self._fmt_cache, dtype, make)

    def flushed(self, F):
        """F as the policy computes in it: a ``formats.FlushedFormat`` where it flushes F's
        subnormals to zero (the precision's own property, resolved per interpreter)."""
        if F is None or F.name not in self.policy.flush_to_zero:
            return F
        G = self._formats.get(F.name)
        if G is None:
            G = self._formats[F.name] = _formats.FlushedFormat.of(F)
        return G

    def resolve(self, prim, dtype):
        """The policy's formats of ``prim`` on a ``dtype`` program (flush-to-zero formats as
        ``formats.FlushedFormat``); resolved once per (op, dtype)."""
        def make():
            r = self.policy.resolve(prim, dtype)
            return type(r)(*map(self.flushed, r)) if self.policy.flush_to_zero else r
        return _memo(self._resolved, (prim, dtype), make)

    def accuracy(self, prim_name, fmt):
        return _memo(self._acc_cache, (prim_name, fmt.name),
                     lambda: self.policy.accuracy(prim_name, fmt))

    def fused_terms(self, prim_name, F, steps=1):
        """``enclosure.rounding_terms`` (rel, abs, top) of one ``prim_name`` rounding into F
        after ``steps`` float64 steps, for the fused add/mul kernels -- or None where they do
        not apply: no format (an exact integer op), an accuracy that is not sign-keeping
        (``enclosure.sign_keeping``), a format without infinities other than float64.
        Resolved once per (op, format, steps)."""
        def make():
            if F is not None and (F.has_inf or F.name == "float64"):
                acc = self.accuracy(prim_name, F)
                if sign_keeping(acc):
                    return rounding_terms(F, acc.ulps, acc.absolute, steps=steps)
            return None
        return _memo(self._fused, (prim_name, F, steps), make)

    # -- events ----------------------------------------------------------------------------
    def note(self, kind, what, count=1):
        for e in self.events:
            if e.kind == kind and e.what == what:
                e.count += count
                return
        self.events.append(Event(kind, what, count))

    def to_concrete(self, tracer, why):
        """A traced value becomes a Python number (``why``: the conversion). Where the bounds
        cannot decide it, where it carries round-off (its box has width) and so becomes a
        constant without its bound, or where a floating value leaves as a Python float (what
        Python's math does with it rounds unseen), an event says so: the bound then covers
        only this run's path, and ``classify`` says ``inconclusive`` rather than ``bug``."""
        un = tracer.unstable
        if un is not None and np.any(un):
            self.note("unstable-control-flow", f"{why} decided by a value the bounds cannot "
                      f"decide ({int(np.count_nonzero(un))} element(s))")
        elif not tracer.point and bool(np.any(np.asarray(tracer.lo) != np.asarray(tracer.hi))):
            self.note("escaped-value", f"{why} at {_user_frame()}: a value with round-off "
                      "became a constant, without its bound")
        elif why in ("float()", ".item()") and np.asarray(concrete(tracer.primal)).dtype.kind \
                not in "biu":
            self.note("escaped-value", f"{why} at {_user_frame()}: a value left fpx as a "
                      "Python float; arithmetic on it is not bounded")
        return super().to_concrete(tracer, why)

    # -- accumulation constants ------------------------------------------------------------
    def gamma(self, n, delta):
        """Accumulation constant for n terms: rigorous γ_n, or Higham–Mary's λ·sqrt(n)·δ."""
        if n <= 0:
            return 0.0
        rigorous = gamma(n, delta)
        if self.bound == "probabilistic":   # never wider than the rigorous bound (small n)
            lam = math.sqrt(2.0 * math.log(2.0 * max(n, 1) / (1.0 - self.confidence)))
            return min(rigorous, math.expm1(lam * math.sqrt(n) * delta + n * delta * delta / (1 - delta)))
        return rigorous

    def partial_sum_gamma(self, m, delta):
        """Constant for a sum bounded through its partial sums: ``|fl(Σ p_i) - Σ p_i| <=
        const·max(P, N)``, P (N) the sum of the positive (negated negative) terms, any
        order: every rounding's error is at most δ times the exact result of its addition,
        whose operands hold a partial sum over a subset of the terms, in [-N, P], plus the
        errors below it, so the m additions' errors satisfy ε <= m·δ·(max(P, N) + ε),
        const = γ_m(δ). Against the classic Σ|p_i| = P + N this halves the radius of sums
        whose terms cancel; rigorous model only (inf for the probabilistic one)."""
        if self.bound != "rigorous" or m <= 0:
            return math.inf if m > 0 else 0.0
        return gamma(m, delta) * (1 + 4 * E64)

    def sum_gamma(self, m, delta, nearest):
        """Constant for a sum with ``m`` additions of relative error ``delta`` each, in any
        order: ``|fl(Σ p_i) - Σ p_i| <= const·Σ|p_i|``. With round-to-nearest additions the
        rigorous constant is ``m·δ`` (Rump, BIT 2012: for any order and any m; underflowing
        additions are exact), else :meth:`gamma`."""
        if nearest and self.bound == "rigorous" and m > 0:
            return m * delta
        return self.gamma(m, delta)

    # -- operands --------------------------------------------------------------------------
    def value_of(self, prim, args, params):
        """The program's own result: ``prim`` evaluated by the parent on the operands' values.
        A Python operator on scalars only (Python numbers, NumPy scalars) is the operator's
        own arithmetic, as in the program (``fpx.core.scalar_operator_active``): a weak
        Python result, libm's pow rather than NumPy's array loop."""
        primals = [a.primal if isinstance(a, IntervalTracer) and a._interp is self else a
                   for a in args]
        op = _SCALAR_OPS.get(prim.name)
        if (op is not None and not params and scalar_operator_active()
                and all(isinstance(p, (int, float, np.generic)) for p in primals)):
            r = op(*primals)        # (Python's errors -- 1/0.0, an overflowing pow -- as there)
            if isinstance(r, complex):
                raise TypeError(f"fpx: {prim.name} of {primals} is complex; fpx handles real "
                                "floating point only")
            return r
        return self.bind_parent(prim, *primals, **params)

    def _own(self, x):
        return isinstance(x, IntervalTracer) and x._interp is self

    def primal_of(self, x):
        """The concrete program value of an operand (own tracer or constant)."""
        return concrete(x.primal if self._own(x) else x)

    def bounds(self, x, dtype=None):
        """(lo, hi, unstable, point) of an operand; a constant is the point it becomes in an
        op of result dtype ``dtype`` (NumPy converts weak Python scalars to it, and a traced
        Python scalar is rounded into it the same way: its bound takes that rounding)."""
        if self._own(x):
            if type(x.primal) in (int, float) and dtype is not None and \
                    np.dtype(dtype).kind in "fV" and np.dtype(dtype) != np.float64:
                F = self.fmt(dtype)
                with np.errstate(all="ignore"):
                    rlo, rhi = round_bounds(x.lo, x.hi, F, self.accuracy("cast", F))
                return np.minimum(x.lo, rlo), np.maximum(x.hi, rhi), x.unstable, False
            return x.lo, x.hi, x.unstable, x.point
        c = concrete(x)
        if type(c) in (int, float) and dtype is not None and np.dtype(dtype).kind in "fV":
            v, w = as_f64(np.asarray(c).astype(dtype)), np.float64(c)
            if not (v == w or np.isnan(w)):
                # a Python literal rounded into the op's format: that rounding is round-off
                # of the program too, so the bound holds the literal and what the program uses
                return np.minimum(v, w), np.maximum(v, w), None, False
            return v, v, None, True
        if type(c) is bool and dtype is not None:
            c = np.asarray(c).astype(dtype)
        v = as_f64(c)
        return v, v, None, True

    def binary(self, prim, a, b, params=None):
        """(value, (alo, ahi), (blo, bhi), unstable, point) of a binary op's operands."""
        v = self.value_of(prim, (a, b), params or {})
        c = concrete(v)
        dt = value_dtype(c)
        alo, ahi, au, ap = self.bounds(a, dt)
        blo, bhi, bu, bp = self.bounds(b, dt)
        if type(c) is np.ndarray:       # (1, n) + (n,), 1 + x: no broadcast in the kernels
            alo, ahi, blo, bhi = (_as_shape(x, c.shape) for x in (alo, ahi, blo, bhi))
        return v, (alo, ahi), (blo, bhi), or_unstable(au, bu), ap and bp

    def radius(self, x):
        """(value, radius, n_bad) of an operand as a ball about its value: a ball's own radius,
        a box's ``max(v - lo, hi - v)`` (``ball_radius``), 0 for a point."""
        v = self.primal_of(x)
        if not self._own(x) or x.point:
            return v, 0.0, 0
        if x.rad is not None:
            return v, x.rad, 0
        vk = v if np.asarray(v).dtype in (np.float32, np.float64) else as_f64(v)
        r, n_bad = _K.ball_radius(vk, x.lo, x.hi)
        return v, r, n_bad

    # -- results ---------------------------------------------------------------------------
    def new(self, value, lo, hi, unstable=None, point=False):
        shape = _shape(concrete(value))
        if _shape(lo) != shape or _shape(hi) != shape:   # e.g. remainder's [0, b) range
            lo, hi = np.broadcast_to(lo, shape), np.broadcast_to(hi, shape)
        if unstable is not None and _shape(unstable) != shape:
            unstable = np.broadcast_to(unstable, shape)
        return IntervalTracer(self, value, lo, hi, unstable, point)

    def new_ball(self, value, rad, top, unstable=None, clip=(-math.inf, math.inf)):
        """A result known as ``|y - value| <= rad`` (every execution; ``top`` and ``clip``
        as the tracer's)."""
        return IntervalTracer(self, value, None, None, unstable, False, rad, top, clip)

    def integer_bounds(self, prim_name, dt, lo, hi):
        """Bounds of an integer result: integer arithmetic is exact, so the float64 enclosure
        tightens to the integers inside it; where the exact result may leave the dtype's
        range, NumPy wraps around, and the bounds are that whole range (an "overflow" event).
        A bool result is its exact value's truth (NumPy's bool add is a logical or)."""
        if dt.kind not in "iub":
            return lo, hi
        with np.errstate(invalid="ignore"):
            lo, hi = np.ceil(lo), np.floor(hi)
            if dt.kind == "b":
                return tuple(t.astype(np.float64) for t in truth(lo, hi))
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

    def round_result(self, prim_name, value, lo, hi, *inputs, steps=0):
        """Add the rounding error of ``prim_name`` with its result in ``value``'s format to the
        fresh bounds lo/hi (computed with ``steps`` float64 steps not yet widened)."""
        dt = value_dtype(value)
        F = self.fmt(dt)
        if F is None:  # integer / bool result: exact
            lo, hi = widen(lo, hi, steps) if steps else (lo, hi)
            return self.integer_bounds(prim_name, dt, lo, hi)
        acc = self.accuracy(prim_name, F)
        return round_bounds(lo, hi, F, acc, inputs, steps=steps, consume=True)

    def rel_abs(self, prim_name, F, inputs=()):
        """(q, e): one evaluation of ``prim_name`` into F errs by at most ``q·|y| + e``."""
        ulps, ab = accuracy_terms(self.accuracy(prim_name, F), inputs)
        return ulps * 2.0 ** (1 - F.p), ulps * F.smallest_subnormal + ab


rule = IntervalInterpreter.def_rule
ball_rule = IntervalInterpreter.def_ball_rule
