"""``fpx.interval``, the transform's entry point: runs a program under an
:class:`IntervalInterpreter` through :func:`fpx.transform.run` (inputs as tracers, outputs as
:class:`Interval` objects), takes a framework's own outputs as the values (checked against the
bounds), and runs CuPy programs with their bounds computed on host copies."""
from __future__ import annotations

import warnings

import numpy as np

from fpx import formats as _formats
from fpx import tree
from fpx.core import FpxError, Tracer, concrete, is_cupy, to_host
from fpx.transform import as_array, on_host, own, run, transformed
from fpx.transforms.interval.enclosure import as_f64
from fpx.transforms.interval.interpreter import IntervalInterpreter, IntervalTracer
from fpx.transforms.interval.result import Event, Interval, OutsideBoundWarning


def interval(f=None, *, policy=None, branches: str = "hull", bound: str = "rigorous",
             confidence: float = 0.999, matmul: str = "midrad"):
    """``interval(f)(*args)`` -> ``f``'s outputs as :class:`Interval` objects (same pytree).

    Inputs may be arrays (point intervals) or :class:`Interval` objects. ``policy``: a precision
    policy or preset name (default ``"numpy"``). ``branches``: ``"hull"`` (sound) or
    ``"concrete"`` (RENDER's observed-branch semantics). ``bound``: ``"rigorous"`` or
    ``"probabilistic"`` (Higham & Mary 2019, λ·sqrt(n)·u with the given ``confidence``; not a
    guarantee). ``matmul`` picks the contractions' strategy (``transforms/interval/matmul``):
    ``"midrad"`` (default: a float64 centre of its own for point or narrow operands, else
    centred on the program's value), ``"fast"`` (always centred on the value: no extra GEMM,
    up to 2x wider on point operands) or ``"exact-center"`` (always a float64 centre).
    Usable as a decorator: ``@fpx.interval`` or ``@fpx.interval(policy="cuda")``.

    ``f`` may be a ``torch.nn.Module`` or a function of torch tensors (``fpx.transform.adapt``):
    inputs are torch tensors (or Intervals whose ``value`` is one), outputs Intervals whose
    ``value`` is a torch tensor of the program's dtype; the default policy is then torch's
    (``fpx.interop.torch.default_policy``).
    """
    if f is None:
        return lambda g: interval(g, policy=policy, branches=branches, bound=bound,
                                  confidence=confidence, matmul=matmul)

    def bounded(ad):
        return run_interval(ad.fn, ad.args, ad.kwargs, trace_floats=ad.framework is None,
                            own=ad.native, policy=ad.policy if policy is None else policy,
                            branches=branches, bound=bound, confidence=confidence,
                            matmul=matmul)[1]
    return transformed(f, bounded)


def run_interval(f, args, kwargs, trace_floats=True, own=None, **options):
    """Run ``f`` under a new :class:`IntervalInterpreter`; return (interpreter, outputs as
    Intervals). ``classify`` uses this to read the interpreter's events. ``trace_floats``:
    Python float inputs are traced (a framework's program takes them as fixed arguments).
    ``own()``: the program's own outputs (a framework's run: torch's bits), taken as the
    outputs' values (:func:`with_own_values`); ``None``: the values fpx's run computed."""
    if any(on_device(x) for x in tree.flatten((args, kwargs))[0]):
        return _run_interval_from_device(f, args, kwargs, trace_floats=trace_floats, own=own,
                                         **options)
    mine = None if own is None else own()
    interp, out = run(lambda parent: IntervalInterpreter(parent, **options), _input, f, args,
                      kwargs, _output, accepts=_traced_float if trace_floats else _is_interval)
    return interp, (out if own is None else with_own_values(out, mine))


def _is_interval(x) -> bool:
    return isinstance(x, Interval)


def _traced_float(x) -> bool:
    """Intervals and Python floats are traced; Python ints stay fixed arguments (counts, axes,
    sizes: NumPy needs them as ints)."""
    return isinstance(x, Interval) or type(x) is float


def _input(interp, x):
    """An input leaf as the interpreter's tracer: an Interval, an array (a point), or a Python
    float (a point, weak as NumPy takes it)."""
    if isinstance(x, Interval):
        value, lo, hi, point = x.value, x.lo, x.hi, is_point(x.lo, x.hi)
    elif type(x) is float:
        value, point = x, True
        lo = hi = np.float64(x)
    else:
        value, point = x, True
        lo = hi = None                  # (the interpreter's float64 copy, made where needed)
        v = concrete(x)
        if v.dtype.kind in "iu" and v.size and (int(v.max()) > 2 ** 53 or int(v.min()) < -2 ** 53):
            v64 = as_f64(v)             # integers float64 does not hold: one ulp either way
            lo, hi, point = np.nextafter(v64, -np.inf), np.nextafter(v64, np.inf), False
    F = interp.fmt(np.asarray(concrete(as_array(value))).dtype)
    if isinstance(F, _formats.FlushedFormat):
        if lo is None:
            lo = hi = as_f64(concrete(x))
        lo, hi, moved = flush_inputs(lo, hi, F)
        point = point and not moved
    return IntervalTracer(interp, value, lo, hi, x.unstable if isinstance(x, Interval) else None,
                          point)


def is_point(lo, hi):
    """lo == hi everywhere (a few elements first: a real interval usually differs there)."""
    flo, fhi = np.ravel(lo), np.ravel(hi)
    head = min(flo.size, 64)
    if not np.array_equal(flo[:head], fhi[:head]):
        return False
    return bool(np.all(lo == hi))


def flush_inputs(lo, hi, F):
    """An input as a flush-to-zero unit reads it: where the interval meets the subnormal
    range, the hull with 0 (a subnormal operand may be read as ±0)."""
    t = F.tiny
    near = (lo < t) & (hi > -t) & ~((lo == 0) & (hi == 0))
    if not np.any(near):
        return lo, hi, False
    return np.where(near, np.minimum(lo, 0.0), lo), np.where(near, np.maximum(hi, 0.0), hi), True


def _output(interp, x):
    """An output leaf as an Interval: the interpreter's tracer with its bounds, anything else
    (a constant) as a point; each with the run's events. A floating constant did not come
    from the traced inputs (a Python int argument's arithmetic, say): fpx did not see how it
    was computed, so an ``untraced-output`` event says its bound is its value alone."""
    if own(interp, x):
        return Interval._trusted(x.lo, x.hi, x.primal, x.unstable, interp.events)
    c = as_f64(concrete(x))
    if np.asarray(concrete(x)).dtype.kind not in "biu":
        interp.note("untraced-output", "an output does not depend on the traced inputs; its "
                    "bound is its value alone (fpx did not see its computation)")
    iv = Interval(c, c, x)
    iv.events = tuple(interp.events)
    return iv


def on_device(x) -> bool:
    if isinstance(x, Interval):
        return is_cupy(x.lo) or is_cupy(x.hi) or is_cupy(concrete(as_array(x.value)))
    if isinstance(x, Tracer) and is_cupy(concrete(x)):
        raise FpxError("fpx.interval: a CuPy-valued tracer of an enclosing transform; nest "
                       "fpx.interval over CuPy arrays only at the outermost level")
    return is_cupy(x)


def _run_interval_from_device(f, args, kwargs, trace_floats=True, own=None, **options):
    """CuPy inputs. The rules' NumPy calls and numba kernels are CPU code, so the bounds are
    computed on host copies of the inputs (the transfer is exact) under the ``"cupy"`` policy
    unless one is given (a torch program's default is torch's CUDA policy); the program runs
    once more on the GPU for its own ``value`` (``own()``, or ``f`` on the inputs' values);
    lo, hi, value and unstable come back as CuPy arrays. The GPU's result is inside the bound
    when the policy describes the GPU's arithmetic: the bound holds for any summation order,
    and the policy gives the CUDA math library's documented errors, CuPy's float16
    accumulation and its flush-to-zero."""
    import cupy
    leaves, td = tree.flatten((args, kwargs))
    host = [Interval._trusted(to_host(x.lo), to_host(x.hi), to_host(concrete(as_array(x.value))),
                              None if x.unstable is None else to_host(x.unstable))
            if isinstance(x, Interval) else x for x in leaves]
    plain = [x.value if isinstance(x, Interval) else x for x in leaves]
    if options.get("policy") is None:
        options = dict(options, policy="cupy")
    f_host, host = on_host(f, host)
    interp, out = run_interval(f_host, *tree.unflatten(td, host), trace_floats=trace_floats,
                               **options)
    if own is None:
        a, k = tree.unflatten(td, plain)
        own = lambda: f(*a, **k)                                        # noqa: E731
    res = []
    for iv in tree.flatten(with_own_values(out, own()))[0]:
        if isinstance(iv, Interval):
            un = None if iv.unstable is None else cupy.asarray(iv.unstable)
            iv = Interval._trusted(cupy.asarray(iv.lo), cupy.asarray(iv.hi),
                                   cupy.asarray(concrete(iv.value)), un, iv.events)
        res.append(iv)
    return interp, tree.unflatten(tree.flatten(out)[1], res)


def with_own_values(out, own):
    """``out`` (the run's Intervals) with each ``value`` replaced by the matching leaf of
    ``own`` (the program's own outputs, e.g. torch's or the GPU's run), which must match in
    number, shape and dtype. The bound holds every result round-off could give, so the own
    output lies inside it (a NaN one where the bound is NaN, or where the element is unstable
    with an infinite end: some executions may give NaN there). Where it does not (a kernel
    whose arithmetic fpx's model does not cover, docs/torch.md "Limits"), the bound is widened
    to hold it -- NaN where the own output is NaN -- those elements are marked unstable, an
    ``own-value-outside-bound`` event says how many, and an :class:`OutsideBoundWarning` is
    issued."""
    o_leaves, o_td = tree.flatten(out)
    g_leaves = tree.flatten(own)[0]
    if len(g_leaves) != len(o_leaves):
        raise FpxError(f"fpx.interval: the program's own run gave {len(g_leaves)} outputs and "
                       f"fpx's run {len(o_leaves)}")
    return tree.unflatten(o_td, [_own_value(iv, g) if isinstance(iv, Interval) else iv
                                 for iv, g in zip(o_leaves, g_leaves)])


def _own_value(iv, g):
    g = concrete(as_array(g))
    v, mine = np.asarray(to_host(g)), np.asarray(to_host(concrete(as_array(iv.value))))
    if v.shape != mine.shape or v.dtype != mine.dtype:
        raise FpxError(f"fpx.interval: the program's own run gave an output of shape "
                       f"{v.shape} and dtype {v.dtype} where fpx's gave {mine.shape}, "
                       f"{mine.dtype}")
    lo, hi = to_host(iv.lo), to_host(iv.hi)
    inside = (lo <= v) & (v <= hi)                          # (False at every NaN)
    if inside.all():
        return Interval._trusted(iv.lo, iv.hi, g, iv.unstable, iv.events)
    v = as_f64(v)
    claimed = ~np.isnan(lo) & ~np.isnan(hi)                 # (a NaN bound makes no claim)
    if iv.unstable is not None:     # unstable with an infinite end: "an execution may be NaN"
        claimed &= ~(np.isnan(v) & to_host(iv.unstable) & (np.isinf(lo) | np.isinf(hi)))
    outside = ~inside & claimed
    n = int(np.count_nonzero(outside))
    if not n:
        return Interval._trusted(iv.lo, iv.hi, g, iv.unstable, iv.events)
    what = (f"the program's own output lies outside fpx's bound at {n} of {v.size} elements "
            "(a kernel fpx's model does not cover, or a policy that does not describe it); the "
            "bound is widened to hold it there and those elements are marked unstable")
    warnings.warn(f"fpx.interval: {what}", OutsideBoundWarning, stacklevel=4)
    lo = np.where(outside, np.minimum(lo, v), lo)          # (NaN where the own output is)
    hi = np.where(outside, np.maximum(hi, v), hi)
    un = outside if iv.unstable is None else (to_host(iv.unstable) | outside)
    event = Event("own-value-outside-bound", what, n)
    return Interval._trusted(lo, hi, g, un, iv.events + (event,))
