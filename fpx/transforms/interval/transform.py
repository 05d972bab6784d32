"""``fpx.interval``, the transform's entry point: runs a program under an
:class:`IntervalInterpreter` through :func:`fpx.transform.run` (inputs as tracers, outputs as
:class:`Interval` objects), and runs CuPy programs with their bounds computed on host copies."""
from __future__ import annotations

import numpy as np

from fpx import formats as _formats
from fpx import tree
from fpx.core import FpxError, Tracer, concrete, is_cupy, to_host
from fpx.transform import as_array, on_host, own, run, transformed
from fpx.transforms.interval.enclosure import as_f64, flush_inputs
from fpx.transforms.interval.interpreter import IntervalInterpreter, IntervalTracer
from fpx.transforms.interval.result import Interval, is_point


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
                            policy=ad.policy if policy is None else policy, branches=branches,
                            bound=bound, confidence=confidence, matmul=matmul)[1]
    return transformed(f, bounded)


def run_interval(f, args, kwargs, trace_floats=True, **options):
    """Run ``f`` under a new :class:`IntervalInterpreter`; return (interpreter, outputs as
    Intervals). ``classify`` uses this to read the interpreter's events. ``trace_floats``:
    Python float inputs are traced (a framework's program takes them as fixed arguments)."""
    if any(on_device(x) for x in tree.flatten((args, kwargs))[0]):
        return _run_interval_from_device(f, args, kwargs, trace_floats=trace_floats, **options)
    return run(lambda parent: IntervalInterpreter(parent, **options), _input, f, args, kwargs,
               _output, accepts=_traced_float if trace_floats else _is_interval)


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


def _run_interval_from_device(f, args, kwargs, trace_floats=True, **options):
    """CuPy inputs. The rules' NumPy calls and numba kernels are CPU code, so the bounds are
    computed on host copies of the inputs (the transfer is exact) under the ``"cupy"`` policy
    unless one is given (a torch program's default is torch's CUDA policy); the program runs
    once more on the GPU for its own ``value``; lo, hi, value and unstable come back as CuPy
    arrays. The GPU's result is inside the bound when the policy describes the GPU's
    arithmetic: the bound holds for any summation order, and the policy gives the CUDA math
    library's documented errors, CuPy's float16 accumulation and its flush-to-zero."""
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
        value = g if is_cupy(g) else cupy.asarray(iv.value)
        un = None if iv.unstable is None else cupy.asarray(iv.unstable)
        res.append(Interval._trusted(cupy.asarray(iv.lo), cupy.asarray(iv.hi), value, un,
                                     iv.events))
    return interp, tree.unflatten(o_td, res)
