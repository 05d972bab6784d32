"""``fpx.classify``: is a mismatch round-off (Type-I) or a bug (Type-II)?

RENDER's question (Zhan et al., "When AllClose Fails", 2025): the target program's output
differs from a reference by more than ``allclose`` allows. Bound what round-off alone could make
the target produce on this input (``fpx.interval``): a reference inside the bound is explained
by round-off; a reference outside a finite, sound bound cannot be -- a bug (a NaN or infinite
reference there too: round-off cannot produce it). ``inconclusive``
when the bound cannot decide: infinite/NaN bounds where the reference is not contained, a
``[-inf, +inf]`` bound (it contains everything, so it explains nothing) where target and
reference differ, a bound too wide to tell (half-width at least ``too_wide`` times the largest
magnitude the output takes: it fixes not one significant digit, so a reference inside it is no
evidence), or an unstable value
decided Python control flow (the bound then covers only the path taken) or an integer output.

If ``reference`` is a function, its own bound is computed too and the two enclosures are
compared: a reference computed in float32 is not exact, and disjoint enclosures are needed to
call a bug.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from fpx import formats, tree
from fpx.core import concrete, to_host
from fpx.transforms.interval import Event, Interval, run_interval
from fpx.transform import adapt, as_array

__all__ = ["classify", "Verdict"]


@dataclass
class Verdict:
    """The outcome of :func:`classify`.

    ``kind``: ``"roundoff"``, ``"bug"`` or ``"inconclusive"``; ``outside``: the reference
    elements outside the target's bound, largest excursion first (at most 20 per output), as
    ``(output number, element index, reference, lo, hi, target value)``; ``n_undecided``:
    elements the bounds cannot decide (a NaN or half-infinite bound that misses the reference,
    a ``[-inf, +inf]`` bound where target and reference differ, an integer output decided by
    an unstable comparison); ``margin``:
    the largest distance outside, absolute and relative to the bound's half-width;
    ``tightness``: median over elements of (bound half-width / observed |target - reference|)
    where they differ (1 = the bound is as tight as the observed error; large = loose);
    ``width``: median over finite bounds of (half-width / M), M the largest finite magnitude
    among the output's target and reference values (``too_wide`` and above: the bound cannot
    tell; such elements where target and reference differ are undecided);
    ``events``: what the bound could not decide; ``rigorous``: False for the probabilistic bound;
    ``reasons``: why the verdict is what it is; ``hints``: what might change it (a reference
    array narrower than the target's output, taken as exact).
    """
    kind: str
    target: object
    reference: object
    outside: list = field(default_factory=list)
    n_outside: int = 0
    n_undecided: int = 0
    n_elements: int = 0
    margin_abs: float = 0.0
    margin_rel: float = 0.0
    tightness: float = float("nan")
    width: float = float("nan")
    max_observed: float = 0.0
    events: list = field(default_factory=list)
    rigorous: bool = True
    reasons: list = field(default_factory=list)
    hints: list = field(default_factory=list)

    def __bool__(self):
        raise TypeError("a Verdict is not a bool: test verdict.kind == 'roundoff'")

    def report(self, max_items: int = 8) -> str:
        """A readable explanation of the verdict."""
        lines = [f"fpx.classify verdict: {self.kind.upper()}"
                 + ("" if self.rigorous else "  (probabilistic bound: NOT rigorous)")]
        lines.append(f"  elements: {self.n_elements}; outside the target's round-off bound: "
                     f"{self.n_outside}; undecidable: {self.n_undecided}")
        lines.append(f"  max |target - reference| observed: {self.max_observed:.6g}")
        if np.isfinite(self.tightness):
            lines.append(f"  bound tightness (median half-width / observed difference): "
                         f"{self.tightness:.3g}")
        if np.isfinite(self.width):
            lines.append(f"  bound width (median half-width / the output's largest magnitude): "
                         f"{self.width:.3g}")
        if self.n_outside:
            lines.append(f"  largest excursion outside the bound: {self.margin_abs:.6g} "
                         f"({self.margin_rel:.3g}x the bound's half-width)")
            lines.append("  first offending elements (output, index: reference, target bound):")
            for item in self.outside[:max_items]:
                out_i, idx, ref, lo, hi, val = item
                lines.append(f"    out[{out_i}]{list(idx)}: reference {ref:.9g} not in "
                             f"[{lo:.9g}, {hi:.9g}] (target value {val:.9g})")
        for e in self.events:
            lines.append(f"  note: {e.kind}: {e.what} (x{e.count})")
        for r in self.reasons:
            lines.append(f"  because: {r}")
        for h in self.hints:
            lines.append(f"  hint: {h}")
        return "\n".join(lines)

    __str__ = report


def _as_intervals(x):
    if isinstance(x, Interval):
        return x
    x = as_array(x)
    c = to_host(concrete(x)).astype(np.float64)
    return Interval._trusted(c, c, x)


def _is_module(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.nn.Module)


def _kind(v) -> str:
    return np.dtype(_dtype(v)).kind


def classify(target, reference, *args, policy=None, bound: str = "rigorous",
             confidence: float = 0.999, branches: str = "hull", matmul: str = "midrad",
             start=None, end=None, layers=None, too_wide: float = 1.0, **kwargs) -> Verdict:
    """Verdict on ``target(*args, **kwargs)`` vs ``reference`` (an array/pytree, or a function
    of the same arguments whose own round-off is bounded too).

    Torch programs (``fpx.transform.adapt``): ``target`` may be a ``torch.nn.Module`` or a
    function of torch tensors, ``reference`` torch tensors, a module or a function. When both
    are modules, the analysis is **layer by layer** (``fpx.transforms.classify_layers``:
    the paper's NN-level reduction; ``layers`` maps or lists the layer names, ``start``/``end``
    restrict it to a contiguous range) unless ``layers=False``.

    ``too_wide``: where target and reference differ inside a bound whose half-width is at least
    ``too_wide`` times the largest magnitude M the output takes, the element is undecided (the
    bound could not have told). The default 1: such a bound cannot tell the element from 0 nor
    from the output's largest value -- it fixes not one significant digit. Elements marked
    unstable are exempt: their bound is the hull of outcomes round-off may choose between (a
    branch cut, a mask), and its width is a jump round-off can make. A smaller value asks more
    of the bound: ``too_wide=0.01`` makes roundoff mean that a 1% deviation would have been
    seen.
    """
    if not too_wide > 0:
        raise ValueError(f"fpx.classify: too_wide must be positive, got {too_wide!r}")
    if layers is not False and _is_module(target) and _is_module(reference):
        from fpx.transforms.classify_layers import classify_layers
        return classify_layers(target, reference, *args, policy=policy, bound=bound,
                               confidence=confidence, branches=branches, matmul=matmul,
                               start=start, end=end, layers=layers, too_wide=too_wide,
                               **kwargs)
    if start is not None or end is not None:
        raise ValueError("fpx.classify: start/end restrict a layer-by-layer analysis, which "
                         "needs torch modules as target and reference")
    ad = adapt(target, args, kwargs)
    opts = dict(policy=ad.policy if policy is None else policy, bound=bound,
                confidence=confidence, branches=branches, matmul=matmul)
    t_interp, t_out = run_interval(ad.fn, ad.args, ad.kwargs, trace_floats=ad.framework is None,
                                   own=ad.native, **opts)
    events = list(t_interp.events) + own_value_events(t_out)
    if callable(reference):
        rad = adapt(reference, args, kwargs)
        r_opts = dict(opts, policy=rad.policy if policy is None else policy)
        r_interp, r_out = run_interval(rad.fn, rad.args, rad.kwargs,
                                       trace_floats=rad.framework is None, own=rad.native,
                                       **r_opts)
        events += [Event(e.kind, f"reference: {e.what}", e.count)
                   for e in list(r_interp.events) + own_value_events(r_out)]
    else:
        rad = None
        r_out = tree.tree_map(as_array, reference)
    v = _compare(t_out, r_out, events, bound, too_wide)
    v.target = ad.to_user(t_out)
    if rad is not None:
        v.reference = rad.to_user(r_out)
    else:
        v.reference = reference
    return v


def own_value_events(out):
    """The ``own-value-outside-bound`` events of a run's Intervals (``with_own_values``): the
    program's own output lay outside fpx's bound, so fpx's model misses a kernel there."""
    return [e for iv in tree.flatten(out)[0] if isinstance(iv, Interval) for e in iv.events
            if e.kind == "own-value-outside-bound"]


def _note_narrow_reference(v, i, t_value, r):
    """An array reference stored in a narrower format than the target's output is taken as
    exact, but its own rounding to that format alone may put it outside the target's bound:
    say so (a function reference gets bounds of its own)."""
    try:
        ft, fr = formats.get(np.dtype(_dtype(t_value))), formats.get(np.dtype(_dtype(r.value)))
    except (TypeError, ValueError, KeyError):
        return
    if fr.p < ft.p:
        v.hints.append(
            f"output {i}: the reference array is {fr.name}, narrower than the target's "
            f"{ft.name}; it is taken as exact, though its own rounding to {fr.name} (half an "
            f"ulp, 2^-{fr.p} relative) may exceed the target's bound -- pass the reference as "
            "a function to bound its round-off too")


def _numeric(x) -> bool:
    """An output leaf that has values to compare: an interval, an array or tensor, a number."""
    if isinstance(x, Interval):
        return True
    try:
        return np.asarray(concrete(as_array(x))).dtype.kind in "fiubV"
    except (TypeError, ValueError):
        return False


def _dtype(x):
    c = concrete(as_array(x))
    return c.dtype if hasattr(c, "dtype") else np.asarray(c).dtype


def _scale(tv, rv):
    """M: the largest finite magnitude among an output's target and reference values."""
    m = 0.0
    for a in (tv, rv):
        a = np.abs(a[np.isfinite(a)])
        if a.size:
            m = max(m, float(a.max()))
    return m


def _compare(t_out, r_out, events, bound, too_wide=1.0) -> Verdict:
    """The verdict of target bounds ``t_out`` against reference values/bounds ``r_out``."""
    t_leaves, t_td = tree.flatten(t_out)
    r_leaves, r_td = tree.flatten(r_out)
    if len(t_leaves) != len(r_leaves):
        raise ValueError(f"fpx.classify: target has {len(t_leaves)} outputs, reference "
                         f"{len(r_leaves)}")
    v = Verdict("roundoff", t_out, r_out, events=events, rigorous=(bound == "rigorous"))
    ref_is_arrays = not any(isinstance(x, Interval) for x in r_leaves)   # not a function's bounds
    keep = [_numeric(t) and _numeric(r) for t, r in zip(t_leaves, r_leaves)]
    for i, (t, r) in enumerate(zip(t_leaves, r_leaves)):
        if not keep[i]:         # a model's cache object, a None: nothing to round
            v.hints.append(f"output {i} ({type(r).__name__}) is not an array: not compared")
    t_leaves = [t for t, k in zip(t_leaves, keep) if k]
    r_leaves = [r for r, k in zip(r_leaves, keep) if k]
    halfw_over_obs, rel_widths = [], []
    n_nan = n_inf = n_wide = 0
    for i, (t, r) in enumerate(zip(t_leaves, r_leaves)):
        t = _as_intervals(t)
        r = _as_intervals(r)
        if t.shape != r.shape:
            raise ValueError(f"fpx.classify: output {i} shapes differ: target {t.shape}, "
                             f"reference {r.shape}")
        tv, rv = as_array(t.value), as_array(r.value)
        if ref_is_arrays:
            _note_narrow_reference(v, i, t.value, r)
        tv, rv = (to_host(concrete(a)).astype(np.float64) for a in (tv, rv))
        tlo, thi, rlo, rhi = (to_host(a) for a in (t.lo, t.hi, r.lo, r.hi))
        with np.errstate(invalid="ignore"):
            overlap = (rlo <= thi) & (tlo <= rhi)
            both_nan = np.isnan(tv) & np.isnan(rv) & (np.isnan(tlo) | np.isnan(thi))
            # identical values (inf == inf included) need no explanation, whatever the bounds
            bad = ~overlap & ~both_nan & ~(tv == rv)
            # outside a finite target bound: a reference enclosure disjoint from it (an
            # infinite reference value included), or a NaN reference (round-off cannot
            # produce NaN or overflow where the bound is finite)
            t_finite = np.isfinite(tlo) & np.isfinite(thi)
            outside = bad & t_finite & ((~np.isnan(rlo) & ~np.isnan(rhi)) | np.isnan(rv))
            # [-inf, +inf] contains everything: "inside" it explains nothing
            vacuous = overlap & ~(tv == rv) & ((np.isneginf(tlo) & np.isposinf(thi))
                                               | (np.isneginf(rlo) & np.isposinf(rhi)))
            undecided = bad & ~outside | vacuous
            diff = np.where(tv == rv, 0.0, np.abs(tv - rv))   # inf == inf: no difference
            half = (thi - tlo) / 2
            # a finite bound too wide to tell: the reference inside it is no evidence
            wide = np.zeros(tv.shape, bool)
            if _kind(t.value) not in "iub":
                m = _scale(tv, rv)
                r_half = (rhi - rlo) / 2
                fin_half = np.isfinite(half)
                if fin_half.any():
                    rel_widths.append((half[fin_half] / m if m > 0 else
                                       np.where(half[fin_half] > 0, np.inf, 0.0)).ravel())
                wide = overlap & ~(tv == rv) & ~vacuous & (
                    (half >= too_wide * m) | (r_half >= too_wide * m))
                for iv in (t, r):       # a decision round-off may flip: the width is its jump
                    if iv.unstable is not None:
                        wide &= ~to_host(np.asarray(iv.unstable, bool))
            undecided |= wide
        v.n_elements += int(tv.size)
        v.n_outside += int(np.count_nonzero(outside))
        n_nan += int(np.count_nonzero(outside & np.isnan(rv)))
        n_inf += int(np.count_nonzero(outside & np.isinf(rv)))
        v.n_undecided += int(np.count_nonzero(undecided))
        n_wide += int(np.count_nonzero(wide))
        fin = np.isfinite(diff)
        if fin.any():
            v.max_observed = max(v.max_observed, float(np.max(diff[fin])))
        if np.any(np.isinf(diff)):
            v.max_observed = float("inf")
        sel = fin & (diff > 0) & np.isfinite(half)
        if sel.any() and _kind(t.value) not in "iub":
            halfw_over_obs.append((half[sel] / diff[sel]).ravel())
        if np.any(outside):
            _record_outside(v, i, outside, tv, rv, tlo, thi, rlo, rhi, half)
        for who, iv in (("output", t), ("reference output", r)):
            if (iv.unstable is not None and np.any(to_host(iv.unstable))
                    and _kind(iv.value) in "iub"):
                v.reasons.append(f"{who} {i} is an integer decided by an unstable comparison")
    if halfw_over_obs:
        v.tightness = float(np.median(np.concatenate(halfw_over_obs)))
    if rel_widths:
        v.width = float(np.median(np.concatenate(rel_widths)))
    return _conclude(v, events, n_nan, n_inf, n_wide, too_wide)


def _record_outside(v, i, outside, tv, rv, tlo, thi, rlo, rhi, half):
    """Output ``i``'s elements outside the target's bound into ``v``: the largest absolute
    and relative (to the half-width) margins, and the 20 farthest elements."""
    with np.errstate(invalid="ignore"):
        dist = np.where(rhi < tlo, tlo - rhi, rlo - thi)
        dist = np.where(np.isnan(rv), np.inf, dist)
    v.margin_abs = max(v.margin_abs, float(np.max(dist[outside])))
    rel = dist / np.where(half > 0, half, np.nan)
    if np.isfinite(rel[outside]).any():
        v.margin_rel = max(v.margin_rel, float(np.nanmax(rel[outside])))
    order = np.argsort(-np.where(outside, dist, -np.inf), axis=None)[:20]
    for flat in order:
        idx = np.unravel_index(flat, outside.shape)
        if outside[idx]:
            v.outside.append((i, tuple(int(j) for j in idx), float(rv[idx]),
                              float(tlo[idx]), float(thi[idx]), float(tv[idx])))


def _conclude(v, events, n_nan, n_inf, n_wide, too_wide) -> Verdict:
    """The verdict's kind and reasons from the counts :func:`_compare` gathered: bug where a
    reference lies outside a finite bound and no event voids the bound (control flow the bound
    does not cover; the program's own output outside it: fpx's model misses a kernel, so the
    bound may be too narrow), inconclusive where anything is undecided, roundoff otherwise."""
    control = any(e.kind in ("unstable-control-flow", "escaped-value", "untraced-output")
                  for e in events)
    gap = any(e.kind == "own-value-outside-bound" for e in events)
    int_unstable = any("integer" in r for r in v.reasons)
    if v.n_outside and not control and not gap:
        v.kind = "bug"
        v.reasons.append(f"{v.n_outside} reference element(s) lie outside a finite bound "
                         "that contains every result round-off could produce")
        if n_nan:
            v.reasons.append(f"{n_nan} of them are NaN where the target's bound is finite: "
                             "round-off alone cannot produce a NaN there")
        if n_inf:
            v.reasons.append(f"{n_inf} of them are infinite where the target's bound is "
                             "finite: round-off alone cannot overflow there")
    elif v.n_outside or v.n_undecided or control or int_unstable:
        v.kind = "inconclusive"
        if v.n_outside and gap:
            v.reasons.append(f"{v.n_outside} reference element(s) lie outside the bound, but "
                             "so did the program's own output (a kernel fpx's model does not "
                             "cover, or a policy that does not describe it): the bound may be "
                             "too narrow, so this proves no bug")
        if v.n_undecided > n_wide:
            v.reasons.append(f"{v.n_undecided - n_wide} element(s) cannot be decided: infinite "
                             "or NaN bounds, or an integer decided by an unstable comparison")
        if n_wide:
            v.reasons.append(f"bound too wide: {n_wide} element(s) differ inside a bound whose "
                             f"half-width is at least {too_wide:g}x the output's largest "
                             f"magnitude (median half-width / magnitude: {v.width:.3g}); "
                             "it could not have told round-off from a bug")
        if control:
            v.reasons.append("an unstable value decided Python control flow, a value with "
                             "round-off left the program as a constant, or an output did not "
                             "come from the traced inputs: the bound covers only this run's "
                             "path and values")
    return v
