"""The interval transform's user-facing results: :class:`Interval` (bounds and the program's
value) and :class:`Event` (what the bounds could not decide)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fpx.core import concrete, is_cupy, to_host
from fpx.transform import as_array
from fpx.transforms.interval.enclosure import widen, xp_of

__all__ = ["Interval", "Event", "OutsideBoundWarning"]


class Interval:
    """Bounds of what round-off can make a program output: ``lo <= y <= hi`` elementwise.

    ``value`` is the program's own result (its dtype); ``lo``/``hi`` are float64;
    ``unstable`` marks elements whose computation passed a branch the bounds could not decide.
    ``events``: what the run that computed it could not decide or chose to report (unstable
    branches, escapes, domain edges, long sums: :class:`Event`); empty for an input.
    Build an input interval with ``Interval(lo, hi, value)`` or :meth:`around`.
    """

    __slots__ = ("value", "lo", "hi", "unstable", "events")

    def __init__(self, lo, hi, value=None, unstable=None):
        xp = xp_of(lo) if is_cupy(lo) else xp_of(hi)     # CuPy if either end lives on the GPU
        self.lo = xp.asarray(lo, dtype=np.float64)
        self.hi = xp.asarray(hi, dtype=np.float64)
        if self.lo.shape != self.hi.shape:
            raise ValueError(f"Interval: lo {self.lo.shape} and hi {self.hi.shape} differ")
        if bool((self.lo > self.hi).any()):
            raise ValueError("Interval: lo > hi somewhere")
        if value is None:
            value = midpoint(self.lo, self.hi)
        else:
            _check_value_inside(value, self.lo, self.hi)
        self.value = value
        self.unstable = unstable
        self.events = ()

    @classmethod
    def _trusted(cls, lo, hi, value, unstable=None, events=()):
        """An interval the interpreter built (float64 arrays, lo <= hi or NaN): no order checks.

        Inside the interpreter a NaN end means "an execution may give NaN" (an input interval
        reached outside a function's domain). Where the program's own value is defined, the
        result states what holds for the defined executions instead: that end becomes -inf or
        +inf (the other end still bounds them) and the element is marked unstable, so no
        bound is NaN where the program's result is not."""
        xp = xp_of(lo)
        with np.errstate(invalid="ignore", over="ignore"):  # one reduction each screens for
            screen = xp.sum(lo) + xp.sum(hi)                 # NaN (inf - inf: a false alarm)
        if bool(xp.isnan(screen)) and (bool(xp.isnan(lo).any()) or bool(xp.isnan(hi).any())):
            v = concrete(as_array(value))
            v = xp.asarray(v if is_cupy(v) == is_cupy(lo) else to_host(v))
            defined = ~xp.isnan(v.astype(np.float64))     # (integers and booleans: all)
            lo_open, hi_open = xp.isnan(lo) & defined, xp.isnan(hi) & defined
            if bool(lo_open.any()) or bool(hi_open.any()):
                lo, hi = xp.where(lo_open, -np.inf, lo), xp.where(hi_open, np.inf, hi)
                opened = lo_open | hi_open
                unstable = opened if unstable is None else (xp.asarray(unstable) | opened)
        self = object.__new__(cls)
        self.lo, self.hi, self.value, self.unstable = lo, hi, value, unstable
        self.events = tuple(events)
        return self

    def _fpx_convert(self, convert):
        """The same interval with its ``value`` converted by ``convert`` (a framework
        adapter's array <-> tensor conversion, ``fpx.transform.adapt``): the same numbers, so
        no second check of lo <= value <= hi."""
        return Interval._trusted(self.lo, self.hi, convert(self.value), self.unstable,
                                 self.events)

    @classmethod
    def around(cls, value, radius=0.0, rel=0.0):
        """``value ± (radius + rel·|value|)`` (outward rounded), keeping ``value``'s dtype;
        ``radius`` and ``rel`` must be nonnegative (NaN is an error, inf an unbounded end)."""
        xp = xp_of(value)
        v = xp.asarray(value)
        v64 = to_host(v).astype(np.float64)
        rad = to_host(radius).astype(np.float64)
        for name, q in (("radius", rad), ("rel", np.asarray(rel, np.float64))):
            if np.isnan(q).any() or (q < 0).any():
                raise ValueError(f"Interval.around: {name} must be nonnegative and not NaN, "
                                 f"got {q if q.ndim == 0 else 'an array with such elements'}")
        with np.errstate(invalid="ignore"):
            r = rad + rel * np.abs(v64)
        lo, hi = widen(v64 - r, v64 + r, 1)           # (compiled CPU kernels)
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
        """``(lo + hi)/2`` elementwise, inside the bounds (see :func:`midpoint`)."""
        return midpoint(self.lo, self.hi)

    def contains(self, y):
        """Elementwise ``lo <= y <= hi``; NaN bounds or NaN ``y`` give False (never "inside")."""
        y = concrete(as_array(y))
        y = xp_of(self.lo).asarray(y if is_cupy(y) == is_cupy(self.lo) else to_host(y),
                                 dtype=np.float64)      # on the bounds' device
        return (self.lo <= y) & (y <= self.hi)

    def __repr__(self):
        lo, hi = to_host(self.lo), to_host(self.hi)
        with np.errstate(invalid="ignore"):        # inf - inf: a non-finite width
            w = hi - lo
        fin = np.isfinite(w)
        wmax = float(np.max(w[fin])) if fin.any() else float("nan")
        nun = 0 if self.unstable is None else int(np.count_nonzero(to_host(self.unstable)))
        size = "empty" if not lo.size else f"max width {wmax:.3g}"
        head = (f"Interval({self.dtype}{list(self.shape)}, {size}"
                f"{', %d non-finite' % int((~fin).sum()) if (~fin).any() else ''}"
                f"{', %d unstable' % nun if nun else ''})")
        if 0 < lo.size <= 6:
            els = ", ".join(f"[{a:.9g}, {b:.9g}]" for a, b in zip(lo.ravel(), hi.ravel()))
            return f"{head}\n  {els}"
        return head


def midpoint(lo, hi):
    """``(lo + hi)/2`` of float64 bounds, inside them: ``lo/2 + hi/2`` where both ends are finite
    and their sum overflows ([1e308, 1.5e308] is not centred on inf); a half-line's midpoint is
    its infinite end, [-inf, inf]'s NaN."""
    xp = xp_of(lo)
    with np.errstate(invalid="ignore", over="ignore"):
        m = (lo + hi) / 2
        over = xp.isinf(m) & xp.isfinite(lo) & xp.isfinite(hi)
        return xp.where(over, lo / 2 + hi / 2, m) if bool(over.any()) else m


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


@dataclass
class Event:
    """Something the bounds could not decide: an unstable branch or index, a division by an
    interval containing zero, ... (``classify`` reports them)."""
    kind: str
    what: str
    count: int = 1


class OutsideBoundWarning(Warning):
    """A program's own output (torch's run of a module, the GPU's run of a CuPy program) lies
    outside the bound fpx computed for it: fpx's model of some kernel does not cover what that
    kernel computed (or the precision policy given does not describe it). The bound is widened
    to hold the output and those elements are marked unstable; an ``Event`` counts them. A
    category of its own (not a ``RuntimeWarning`` or ``UserWarning``): filters that silence
    floating-point noise or a library's user warnings leave it alone."""

