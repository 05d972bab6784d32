"""Layer-by-layer classification (``fpx.classify`` of two modules): each layer's round-off
bound on the hull of both programs' inputs to it must contain the reference layer's output,
and the first layer where it does not is where the programs part -- RENDER's NN-level
reduction (Zhan et al. 2025).

The framework's side -- running a module and recording its layers' calls -- is the adapter's
(``fpx.interop.torch.record_calls``); this module sees only arrays and the adapted programs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fpx import tree
from fpx.core import FpxError, concrete, to_host
from fpx.transform import adapt, as_array
from fpx.transforms.classify import Verdict, _compare, own_value_events
from fpx.transforms.interval import Interval, run_interval

__all__ = ["classify_layers", "LayerVerdict"]


@dataclass
class LayerVerdict(Verdict):
    """:class:`fpx.Verdict` of a layer-by-layer analysis: ``layers`` is a list of
    ``(name, Verdict)`` in execution order; ``first_bug``: the first layer whose reference
    output leaves the target's bound (``None`` if none); ``kind``: ``"bug"`` when there is one,
    ``"inconclusive"`` when some layer cannot be decided, else ``"roundoff"``; ``unchecked``:
    composite layers (default layers only) whose own bound could not decide, which do not make
    the verdict inconclusive since each of their sublayers was decided."""
    layers: list = field(default_factory=list)
    first_bug: object = None
    unchecked: list = field(default_factory=list)

    def report(self, max_items: int = 4) -> str:
        lines = [f"fpx.classify (layer by layer) verdict: {self.kind.upper()}"
                 + ("" if self.rigorous else "  (probabilistic bound: NOT rigorous)")]
        if self.first_bug is not None:
            lines.append(f"  first layer whose reference output leaves the target's bound: "
                         f"{self.first_bug}")
        lines.append(f"  {'layer':<28}{'verdict':<14}{'outside':>9}{'max |t - r|':>14}"
                     f"{'tightness':>11}")
        for name, v in self.layers:
            tight = f"{v.tightness:.3g}" if np.isfinite(v.tightness) else "-"
            lines.append(f"  {name:<28}{v.kind:<14}{v.n_outside:>9}{v.max_observed:>14.4g}"
                         f"{tight:>11}")
        for name, v in self.layers:
            if v.kind != "roundoff":
                sub = v.report(max_items).splitlines()[1:]
                lines.append(f"  [{name}]")
                lines.extend("  " + s for s in sub)
        for r in self.reasons:
            lines.append(f"  because: {r}")
        return "\n".join(lines)

    __str__ = report


def _is_float(dt) -> bool:
    dt = np.dtype(dt)
    return dt.kind == "f" or dt.kind == "V"        # ml_dtypes' bfloat16 / float8: kind 'V'


def _hull(t, r):
    """The interval [min(t, r), max(t, r)] with value ``t`` (the target's own input to the
    layer); integer and bool inputs must be equal and stay as they are."""
    a = as_array(t)
    if not hasattr(a, "dtype"):
        return t
    a = to_host(concrete(a))
    b = to_host(concrete(as_array(r)))
    if not _is_float(a.dtype):
        if not np.array_equal(a, np.asarray(b).astype(a.dtype)):
            raise FpxError("fpx.classify: target and reference pass different integer/bool "
                           "tensors to a layer; a layer-by-layer analysis needs equal ones")
        return t
    a, b = a.astype(np.float64), np.asarray(b).astype(np.float64)
    return Interval(np.minimum(a, b), np.maximum(a, b), t)


def _hulls(t_in, r_in):
    """:func:`_hull` of every pair of leaves of the target's and the reference's inputs."""
    t_leaves, td = tree.flatten(t_in)
    r_leaves, r_td = tree.flatten(r_in)
    if len(t_leaves) != len(r_leaves):
        raise FpxError("fpx.classify: the target and reference pass differently structured "
                       "inputs to a layer")
    return tree.unflatten(td, [_hull(t, r) for t, r in zip(t_leaves, r_leaves)])


def _layer_range(names, start, end):
    def pos(v, default):
        if v is None:
            return default
        if isinstance(v, (int, np.integer)):
            return int(v) % len(names)
        if v not in names:
            raise ValueError(f"fpx.classify: layer {v!r} is not among {names}")
        return names.index(v)
    i, j = pos(start, 0), pos(end, len(names) - 1)
    if i > j:
        raise ValueError(f"fpx.classify: start layer {names[i]!r} comes after end {names[j]!r}")
    return i, j


def _layer_names(target, layers):
    """(target layer names, {target name: reference name}, composite names)."""
    from fpx.interop.torch import fine_layers
    if layers is None:
        fine, composite = fine_layers(target)
        names = fine + composite
        return names, {n: n for n in names}, set(composite)
    if isinstance(layers, dict):
        return list(layers), dict(layers), set()
    return list(layers), {n: n for n in layers}, set()


def _recorded(target, reference, names, mapping, args, kwargs):
    """Both modules' recorded layer calls, checked to be the same sequence of layers, and a
    label per call (a layer called twice is two steps: ``name``, ``name#2``)."""
    from fpx.interop.torch import record_calls
    t_calls = record_calls(target, names, args, kwargs)
    r_calls = record_calls(reference, [mapping[n] for n in names], args, kwargs)
    inv = {v: k for k, v in mapping.items()}
    t_seq = [c[0] for c in t_calls]
    r_seq = [inv[c[0]] for c in r_calls]
    if t_seq != r_seq:
        raise FpxError(f"fpx.classify: the target and reference call their layers in different "
                       f"orders: {t_seq} vs {r_seq} (map layer names with layers={{...}})")
    if not t_seq:
        raise FpxError(f"fpx.classify: none of the layers {names} ran")
    labels, seen = [], {}
    for n in t_seq:
        n = n or type(target).__name__
        seen[n] = seen.get(n, 0) + 1
        labels.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return t_calls, r_calls, labels


def _summary(results, bound, composite) -> LayerVerdict:
    """The verdict over the layers: a bug at the first layer (in the order calls return, so
    innermost first) whose reference output leaves its bound; otherwise inconclusive where a
    fine layer is. A composite layer (``composite[label]``) that cannot decide -- its bound
    spans its sublayers and may be too wide -- is listed as unchecked instead: its sublayers
    were each decided."""
    first = next((n for n, v in results if v.kind == "bug"), None)
    undecided = [n for n, v in results if v.kind == "inconclusive" and not composite.get(n)]
    unchecked = [n for n, v in results if v.kind == "inconclusive" and composite.get(n)]
    kind = "bug" if first is not None else ("inconclusive" if undecided else "roundoff")
    lv = LayerVerdict(kind, results[-1][1].target, results[-1][1].reference,
                      events=[e for _, v in results for e in v.events],
                      rigorous=(bound == "rigorous"), layers=results, first_bug=first,
                      unchecked=unchecked)
    for _, v in results:
        lv.n_outside += v.n_outside
        lv.n_undecided += v.n_undecided
        lv.n_elements += v.n_elements
        lv.max_observed = max(lv.max_observed, v.max_observed)
    if first is not None:
        lv.reasons.append(f"layer {first!r}: the reference's output leaves the target's "
                          "round-off bound on the hull of both programs' inputs to it")
    elif undecided:
        lv.reasons.append(f"layer(s) {undecided} cannot be decided")
    if unchecked:
        lv.reasons.append(f"the code of composite layer(s) {unchecked} between their "
                          "sublayers is unchecked: their bounds cannot decide (see each); "
                          "every sublayer was decided on its own")
    return lv


def classify_layers(target, reference, *args, policy=None, bound="rigorous", confidence=0.999,
                    branches="hull", matmul="midrad", start=None, end=None, layers=None,
                    too_wide=1.0, **kwargs) -> LayerVerdict:
    """Classify ``target`` against ``reference`` (two modules with the same layer structure)
    one layer at a time.

    Both modules run on ``args`` (floating inputs converted to each module's parameter dtype);
    every call of the chosen layers is recorded. For layer ``i`` the input is the interval
    ``[min(t, r), max(t, r)]`` of the target's and the reference's inputs to that layer (for a
    chain: layer ``i-1``'s outputs), with the target's own input as its value; the target
    layer's round-off bound on it (``fpx.interval``) must contain the reference layer's
    output. The first layer where it does not is where the two programs part: a bug there.

    ``layers``: ``None`` -- every submodule that runs (``fpx.interop.torch.fine_layers``): the
    fine layers (each module owning parameters: every Conv/Linear/norm/embedding; each leaf)
    and the composites (modules with code of their own between sublayers, the model itself
    included, so a bug in that code is found too), in the order their calls return; a list
    of dotted submodule names (the same in both modules); or a dict ``{target name: reference
    name}``. ``start``/``end``: a layer name or position; the analysis covers ``start..end``
    inclusive.
    """
    names, mapping, composite = _layer_names(target, layers)
    t_calls, r_calls, labels = _recorded(target, reference, names, mapping, args, kwargs)
    i0, i1 = _layer_range(labels, start, end)
    opts = dict(bound=bound, confidence=confidence, branches=branches, matmul=matmul)
    results = []
    for idx in range(i0, i1 + 1):
        _, sub, ta, tk, tout = t_calls[idx]
        _, _, ra, rk, rout = r_calls[idx]
        ins_args, ins_kwargs = _hulls((tuple(ta), dict(tk)), (tuple(ra), dict(rk)))
        ad = adapt(sub, ins_args, ins_kwargs)
        interp, t_out = run_interval(ad.fn, ad.args, ad.kwargs, trace_floats=False,
                                     own=lambda: tout,    # the layer's output, as recorded
                                     policy=ad.policy if policy is None else policy, **opts)
        v = _compare(t_out, tree.tree_map(as_array, rout),
                     list(interp.events) + own_value_events(t_out), bound, too_wide)
        v.target, v.reference = ad.to_user(t_out), rout
        results.append((labels[idx], v))
    roles = {labels[i]: t_calls[i][0] in composite for i in range(i0, i1 + 1)}
    return _summary(results, bound, roles)
