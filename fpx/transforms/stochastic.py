"""``fpx.stochastic``: stochastic arithmetic on an unchanged program (Fuzzy PyTorch / PRISM).

``stochastic(f, mode, samples=S)(*args)`` runs ``f`` S times with every floating-point
operation's result rounded at random, and returns the outputs with a leading sample axis.
The spread of the samples tells how many bits of each output round-off leaves intact
(:mod:`fpx.metrics`).

Semantics (see docs/stochastic.md for the formulas):

* An *operation* is a primitive that rounds in IEEE arithmetic: + − × ÷, fma, sqrt, the
  transcendentals, casts to a narrower format, and -- inside matmul, sums, cumsum and products
  -- every scalar multiply and add (``granularity="flop"``), or just their outputs
  (``granularity="op"``). Exact operations (neg, abs, max/min, comparisons, where, floor,
  movement, integer arithmetic) are never perturbed.
* Each operation is evaluated accurately -- float64 for float32/bf16/fp16/fp8 results (with
  the exact TwoSum residual for sums), error-free transforms (TwoSum, FMA-based TwoProduct,
  remainders for ÷ and √) or long double for float64 results -- then rounded into the result
  format with the mode's random rule, in the integer domain (:mod:`fpx.kernels.stochastic`).
* Random bits are counter-based: sample i's key is ``SeedSequence(seed, spawn_key=(i,))``,
  the j-th rounding operation of the run gets its own stream, and each decision takes the
  bits at its position in the per-sample computation. A sample is therefore the same for any
  thread count, batch of samples, executor or machine.
* Samples run as one vectorized pass (a leading sample axis on every perturbed value) unless
  the program's Python control flow reads a perturbed value (``if``, ``float()``, an index):
  then fpx reruns it once per sample, transparently.

References: Fuzzy PyTorch (Gonzalez Pepe et al., 2025); PRISM; Verificarlo (Denis et al. 2016);
Parker, "Monte Carlo arithmetic" (1997); Vignes, CESTAC (1993); Connolly, Higham & Mary,
"Stochastic rounding and its probabilistic backward error analysis" (2021).
"""
from __future__ import annotations

import numpy as np

from fpx import formats as _formats
from fpx import primitives as _prims
from fpx import tree

from fpx.core import EvalInterpreter, FpxError, Interpreter, Tracer, concrete, current_interpreter
from fpx.core import is_cupy as _is_cupy, to_host as _host
from fpx.kernels import stochastic as _K
from fpx.policy import get_policy
from fpx.transform import is_array_leaf, on_host, own, run, transformed

__all__ = ["stochastic", "StochasticInterpreter", "NestingError", "sample_keys", "MODES"]

MODES = ("sr", "ud", "cestac", "mca", "ieee")
_MCA_MODES = ("rr", "pb", "mca")

# which primitives round comes from their kinds (fpx.primitives); cast has its own rule
_ROUNDED = _prims.of_kind("rounded", "transcendental")
_EXACT = _prims.of_kind("exact", "divmod", "compare")
# the libm functions with a NumPy ufunc, evaluated in long double for float64 results
_UFUNC_LD = {n: getattr(np, _prims.UFUNC_NAME[n]) for n in _prims.of_kind("transcendental")
             if n in _prims.UFUNC_NAME}
_EFT_OP = {"add": 0, "sub": 1, "mul": 2, "div": 3}


class _NeedsPerSample(Exception):
    """A perturbed value reached Python control flow: run one sample at a time."""


class NestingError(FpxError, NotImplementedError):
    """fpx.stochastic nested with another transform in a way it does not support yet."""


def _transform_name(interp) -> str:
    n = type(interp).__name__
    return n[:-len("Interpreter")].lower() if n.endswith("Interpreter") else n


def _nesting_error(inner: str, outer: str) -> NestingError:
    return NestingError(
        f"nesting fpx.{inner} inside fpx.{outer} is not supported yet: fpx.stochastic carries "
        f"every sample at once, so the other transform would see the sample axis; run each "
        f"transform on its own (fpx.trace inside fpx.stochastic works)")




def sample_keys(seed: int, indices) -> np.ndarray:
    """The 64-bit key of each sample index: ``SeedSequence(seed, spawn_key=(i,))``."""
    out = np.empty(len(indices), np.uint64)
    for j, i in enumerate(indices):
        st = np.random.SeedSequence(seed, spawn_key=(int(i),)).generate_state(2, np.uint32)
        out[j] = (np.uint64(st[0]) << np.uint64(32)) | np.uint64(st[1])
    return out


def _dtype_of(v):
    return v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype


def _fmt(dt):
    try:
        return _formats.get(np.dtype(dt))
    except (TypeError, ValueError):
        return None


def _is_float(dt) -> bool:
    dt = np.dtype(dt)
    return dt.kind == "f" or (dt.kind == "V" and _fmt(dt) is not None)


def _fparams(F):
    """(p, emin, max, nan_on_overflow) of a format, for the kernels."""
    return (int(F.p), int(F.emin), float(F.max), not bool(getattr(F, "has_inf", True)))


# =============================================================================================
# Tracer and interpreter
# =============================================================================================
class StochasticTracer(Tracer):
    """``primal`` holds every sample: shape (S, *shape) when ``batched``, else (*shape)."""
    __slots__ = ("batched",)

    def __init__(self, interp, primal, batched):
        super().__init__(interp, primal)
        self.batched = batched

    @property
    def shape(self):
        s = tuple(self.primal.shape)
        return s[1:] if self.batched else s

    @property
    def ndim(self):
        return len(self.shape)


class StochasticInterpreter(Interpreter):
    """Rounds every operation at random (see the module docstring)."""

    def __init__(self, parent, mode="sr", keys=None, *, policy=None, granularity="flop",
                 order="sequential", t=None, mca_mode="mca", per_sample=False):
        super().__init__(parent)
        self.mode, self.keys = mode, np.ascontiguousarray(keys, np.uint64)
        self.S = len(self.keys)
        self.policy = get_policy(policy)
        self.granularity, self.order, self.t, self.mca_mode = granularity, order, t, mca_mode
        self.per_sample = per_sample
        self.ops = 0          # rounding-operation counter: stream ids
        self.notes: list[str] = []
        self._dt_cache: dict = {}

    def adopt(self, child):
        """Called by an interpreter created inside this one's run (``Interpreter.__init__``):
        raise :class:`NestingError` for a transform nested inside this one, except trace
        (another transform would read the batched arrays and return an extra sample axis)."""
        if child is None or child is self:
            return
        from fpx.transforms.trace import TraceInterpreter
        if not isinstance(child, TraceInterpreter):
            raise _nesting_error(_transform_name(child), "stochastic")

    # -- operands -----------------------------------------------------------------------------
    def to_concrete(self, tracer, why):
        if tracer.batched:
            if not self.per_sample:
                raise _NeedsPerSample(why)
            return tracer.primal[0]
        return tracer.primal

    def _own(self, x):
        return isinstance(x, StochasticTracer) and x._interp is self

    def unpack(self, x):
        """(array or scalar, batched, per-sample ndim)."""
        if self._own(x):
            return x.primal, x.batched, x.ndim
        c = concrete(x)
        return c, False, np.ndim(c)

    def new(self, value, batched):
        return StochasticTracer(self, value, batched)

    def next_op(self, n=1):
        i = self.ops
        self.ops += n
        return i

    def note(self, text):
        if text not in self.notes:
            self.notes.append(text)

    def result_dtype(self, prim, vals, params):
        """NumPy's result dtype of ``prim`` on these operands (weak Python scalars kept)."""
        key = (prim.name, tuple(type(v) if np.isscalar(v) and not isinstance(v, np.generic)
                                else _dtype_of(v) for v in vals),
               tuple(sorted((k, str(v)) for k, v in params.items() if k in ("to", "dtype"))))
        dt = self._dt_cache.get(key)
        if dt is None:
            dummies = [v if (np.isscalar(v) and not isinstance(v, np.generic))
                       else np.zeros((1,), _dtype_of(v)) for v in vals]
            with np.errstate(all="ignore"):
                r = prim.impl_for(_numpy_backend())(*dummies, **params)
            dt = self._dt_cache[key] = np.asarray(r).dtype
        return dt

    def aligned(self, args):
        """Operand arrays aligned for elementwise broadcasting with the sample axis first."""
        us = [self.unpack(a) for a in args]
        nd = max((u[2] for u in us), default=0)
        anyb = any(u[1] for u in us)
        out = []
        for v, b, n in us:
            if b and n < nd:
                v = v.reshape((v.shape[0],) + (1,) * (nd - n) + tuple(v.shape[1:]))
            out.append(v)
        return out, anyb

    # -- rounding ---------------------------------------------------------------------------------
    def round_to(self, y, F, dtype, batched, e=None, mode=None, op=None, half=None):
        """Round float64 values ``y`` (+ residual ``e``) into format ``F`` with the mode, one
        stream per call; returns an array of ``dtype`` with the sample axis. ``half``: a mask
        (broadcastable to y) of elements given as halves of values beyond F's range: those are
        rounded in the halved format (p, emin - 1, max/2) and doubled, exactly
        ``round(v) = 2·round'(v/2)``, with the same bits."""
        mode = mode or self.mode
        cupy_in = _is_cupy(y)
        y = _host(y)
        shape = y.shape[1:] if batched else y.shape
        n = int(np.prod(shape, dtype=np.int64))
        x2 = np.ascontiguousarray(y, np.float64).reshape((self.S if batched else 1, n))
        e2 = (np.empty((1, 0)) if e is None else
              np.ascontiguousarray(_host(e), np.float64).reshape((x2.shape[0], n)))
        fast = e is None and F.name == "float32" and mode in ("sr", "ud", "cestac")
        out = np.empty((self.S, n), np.float32 if (fast and np.dtype(dtype) == np.float32)
                       else np.float64)
        t = self.t if self.t is not None else F.p
        if mode == "rn":
            code = 0
        else:
            code = _K.MODES[mode]
        op = self.next_op() if op is None else op
        if fast:
            _K.fast_round_rows(code)(x2, x2, self.keys, op, out)
        else:
            _K.round_rows(x2, e2, self.keys, op, code, *_fparams(F), int(t), out)
        if half is not None:
            p, emin, mx, nan_ovf = _fparams(F)
            out2 = np.empty_like(out)
            _K.round_rows(x2, e2, self.keys, op, code, p, emin - 1, mx / 2, nan_ovf, int(t),
                          out2)
            m = np.broadcast_to(np.asarray(half, bool).reshape(x2.shape), out.shape)
            out = np.where(m, 2 * out2, out)
        res = out.reshape((self.S,) + tuple(shape))
        res = _store(res, dtype)
        if cupy_in:
            import cupy
            res = cupy.asarray(res)
        return res



def _numpy_backend():
    from fpx.core import get_backend
    return get_backend("numpy")


def _store(values64, dtype):
    dt = np.dtype(dtype)
    if dt == values64.dtype:
        return values64
    return values64.astype(dt)   # exact: the values are on dt's grid


_rule = StochasticInterpreter.def_rule


# =============================================================================================
# Elementwise operations
# =============================================================================================
def _exact_elementwise(self, prim, *args, **params):
    vals, anyb = self.aligned(args)
    return self.new(self.bind_parent(prim, *vals, **params), anyb)


for _n in _EXACT:
    StochasticInterpreter.rules[_n] = _exact_elementwise


def _f64(v):
    if np.isscalar(v) and not isinstance(v, np.generic):
        return float(v)
    if _is_cupy(v):
        return v.astype("float64")
    return np.asarray(v, dtype=np.float64)


@_rule(*_ROUNDED, "lgamma", "hurwitz_zeta")      # (the C library's / SciPy's, rounded once)
def _rounded(self, prim, *args, **params):
    vals, anyb = self.aligned(args)
    dt = self.result_dtype(prim, vals, params)
    if not _is_float(dt):
        return self.new(self.bind_parent(prim, *vals, **params), anyb)
    F = _fmt(dt)
    if self.mode == "mca" and self.mca_mode in ("pb", "mca"):
        # perturb the floating-point array operands; an unbatched one gains the sample axis
        # and, like aligned() does for batched ones, 1s up to the widest operand's rank.
        # Operands left alone (integer arrays, scalars) keep their shape: NumPy broadcasting
        # lines them up from the right.
        us = [self.unpack(a) for a in args]
        nd = max((u[2] for u in us), default=0)
        new = []
        for v, (_, b, n) in zip(vals, us):
            if _is_float(np.asarray(v).dtype) and not np.isscalar(v):
                v = self.round_to(_f64(v), _fmt(np.asarray(v).dtype) or F, np.float64, b,
                                  mode="mca")
                if not b and n < nd:
                    v = v.reshape(v.shape[:1] + (1,) * (nd - n) + v.shape[1:])
                anyb = True
            new.append(v)
        vals = new
    if (prim.name in _FAST_ROW_OPS and self.mode in ("sr", "ud", "cestac") and F.name == "float32"
            and np.dtype(dt) == np.float32 and len(vals) == 2
            and all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in vals)):
        return self.new(_fast_binary(self, prim.name, args, vals, anyb), True)
    out_mode = "rn" if (self.mode == "mca" and self.mca_mode == "pb") else None
    y, e, half = _accurate(self, prim, vals, params, F)
    return self.new(self.round_to(y, F, dt, anyb, e=e, mode=out_mode, half=half), True)


_FAST_ROW_OPS = ("add", "sub", "mul", "div")


def _fast_binary(self, name, args, vals, anyb):
    """``a op b`` of float32 arrays, evaluated in float64 and randomly rounded to float32 in
    one pass (``_K.fast_round_rows``): the same values and random bits as ``_accurate`` +
    ``round_to``, without their float64 arrays (3 passes and 6x the memory traffic)."""
    full = np.broadcast_shapes(*[v.shape for v in vals])
    ps = full[1:] if anyb else full
    n = int(np.prod(ps, dtype=np.int64))
    rows = []
    for v, a in zip(vals, args):
        if self.unpack(a)[1]:        # batched: (S, ...) aligned by aligned()
            v = v if v.shape[1:] == ps else np.broadcast_to(v, v.shape[:1] + ps)
            rows.append(np.ascontiguousarray(v).reshape(v.shape[0], n))
        else:                        # one operand for every sample
            rows.append(np.ascontiguousarray(np.broadcast_to(v, ps)).reshape(1, n))
    out = np.empty((self.S, n), np.float32)
    _K.fast_round_rows(_K.MODES[self.mode], name)(rows[0], rows[1], self.keys, self.next_op(),
                                                  out)
    return out.reshape((self.S,) + ps)


def _accurate(self, prim, vals, params, F):
    """The op's value in float64 (+ residual for float64 results)."""
    v64 = [_f64(v) for v in vals]
    with np.errstate(all="ignore"):
        if F.p < 53:
            if prim.name == "fma":
                p = v64[0] * v64[1]                     # exact for p <= 26 operands
                s = p + v64[2]
                return s, _two_sum_np(p, v64[2], s), None
            if prim.name in ("add", "sub"):
                # a float64 sum of two float32 (or narrower) values is exact unless their
                # exponents differ by more than 29: the residual is kept where it is not
                a, b = v64
                b = -b if prim.name == "sub" else b
                s = a + b
                e = _two_sum_np(a, b, s)
                return s, (e if F.p > 24 or np.any(e) else None), None
            return self.bind_parent(prim, *v64, **params), None, None
        # float64 results: error-free transforms / long double
        if prim.name in _EFT_OP or prim.name == "sqrt":
            bs = np.broadcast_arrays(*[np.asarray(v) for v in v64])
            shape = bs[0].shape
            flat = [np.ascontiguousarray(b).ravel() for b in bs]
            y, e = np.empty(flat[0].size), np.empty(flat[0].size)
            half = None
            if prim.name == "sqrt":
                _K.eft_sqrt(flat[0], y, e)
            else:
                half = np.empty(flat[0].size, np.uint8)
                _K.eft_binary(_EFT_OP[prim.name], flat[0], flat[1], y, e, half)
                half = half.reshape(shape).view(bool) if half.any() else None
            return y.reshape(shape), e.reshape(shape), half
        if prim.name == "fma":
            a, b, c = np.broadcast_arrays(*[np.asarray(v) for v in v64])
            shape = a.shape
            a, b, c = (np.ascontiguousarray(z).ravel() for z in (a, b, c))
            p, pe = np.empty(a.size), np.empty(a.size)
            _K.eft_binary(2, a, b, p, pe, np.empty(a.size, np.uint8))
            s = p + c        # (an overflowed product is inf here: half pairs ignored)
            return s.reshape(shape), (_two_sum_np(p, c, s) + pe).reshape(shape), None
        f = _UFUNC_LD.get(prim.name)
        if f is not None and np.finfo(np.longdouble).nmant > 52:
            ld = f(*[np.asarray(v, np.longdouble) for v in v64])
            y = ld.astype(np.float64)
            e = (ld - y.astype(np.longdouble)).astype(np.float64)
            half = np.isinf(y) & (np.abs(ld) < np.longdouble(2.0) ** 1025)
            if half.any():                      # beyond float64: the pair of ld/2
                h2 = ld[half] / 2
                y[half] = h2.astype(np.float64)
                e[half] = (h2 - y[half].astype(np.longdouble)).astype(np.float64)
            e[~np.isfinite(y)] = 0.0
            return y, e, (half if half.any() else None)
        self.note(f"{prim.name} in float64 has no more accurate evaluation here: its libm "
                  "result is rounded as if exact (not perturbed)")
        return self.bind_parent(prim, *v64, **params), None, None


def _two_sum_np(a, b, s):
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return np.where(np.isfinite(s), e, 0.0)


@_rule("cast")
def _cast(self, prim, a, *, to):
    v, b, _ = self.unpack(a)
    src = np.asarray(v).dtype
    if isinstance(to, _formats.Format):
        F = to
        out_dt = np.float32 if F.name == "tf32" else F.dtype
        src_p = (_fmt(src).p if _is_float(src) else
                 (np.iinfo(src).bits if src.kind in "iu" else 1))
        src_range = _fmt(src) if _is_float(src) else None
        narrower = src_p > F.p or (src_range is not None and
                                   (src_range.max > F.max or src_range.emin < F.emin))
        if narrower and not (src.kind in "iub" and src_p <= F.p):
            return self.new(self.round_to(_f64(v), F, out_dt, b), True)
        return self.new(self.bind_parent(prim, v, to=to), b)
    return self.new(self.bind_parent(prim, v, to=to), b)


# =============================================================================================
# Movement and index operations
# =============================================================================================
def _norm_axis(axis, nd):
    return axis % nd if nd else 0


@_rule("reshape")
def _reshape(self, prim, a, *, shape):
    v, b, _ = self.unpack(a)
    if b:
        shape = (v.shape[0],) + tuple(shape)
    return self.new(self.bind_parent(prim, v, shape=shape), b)


@_rule("transpose")
def _transpose(self, prim, a, *, axes):
    v, b, nd = self.unpack(a)
    if b:
        axes = tuple(range(nd))[::-1] if axes is None else tuple(int(x) % nd for x in axes)
        axes = (0,) + tuple(x + 1 for x in axes)
    return self.new(self.bind_parent(prim, v, axes=axes), b)


@_rule("broadcast_to")
def _broadcast_to(self, prim, a, *, shape):
    (v,), b = self.aligned([a])
    if b:
        shape = tuple(shape)
        v = v.reshape((v.shape[0],) + (1,) * (len(shape) + 1 - v.ndim) + v.shape[1:])
        shape = (v.shape[0],) + shape
    return self.new(self.bind_parent(prim, v, shape=shape), b)


@_rule("getitem")
def _getitem(self, prim, a, *, index):
    v, b, _ = self.unpack(a)
    if b:
        index = (slice(None),) + (index if isinstance(index, tuple) else (index,))
    return self.new(self.bind_parent(prim, v, index=index), b)


@_rule("concatenate")
def _concatenate(self, prim, *xs, axis):
    us = [self.unpack(x) for x in xs]
    if not any(u[1] for u in us):
        return self.new(self.bind_parent(prim, *[u[0] for u in us], axis=axis), False)
    nd = us[0][2]
    vs = [u[0] if u[1] else np.broadcast_to(u[0], (self.S,) + np.shape(u[0])) for u in us]
    return self.new(self.bind_parent(prim, *vs, axis=None if axis is None else
                                     _norm_axis(axis, nd) + 1), True)


@_rule("pad")
def _pad(self, prim, a, *, pad_width, value):
    v, b, nd = self.unpack(a)
    if b:
        pw = np.broadcast_to(np.asarray(pad_width, dtype=np.int64).reshape(-1, 2)
                             if np.ndim(pad_width) else np.full((1, 2), pad_width), (nd, 2))
        pad_width = ((0, 0),) + tuple(tuple(int(x) for x in r) for r in pw)
    return self.new(self.bind_parent(prim, v, pad_width=pad_width, value=value), b)


def _red_axes(axis, nd):
    if axis is None:
        return tuple(range(nd))
    if isinstance(axis, (tuple, list)):
        return tuple(sorted(int(x) % nd for x in axis))
    return (int(axis) % nd,)


@_rule("reduce_max", "reduce_min")
def _reduce_exact(self, prim, a, *, axis=None, keepdims=False):
    v, b, nd = self.unpack(a)
    if b:
        axis = tuple(x + 1 for x in _red_axes(axis, nd))
    return self.new(self.bind_parent(prim, v, axis=axis, keepdims=keepdims), b)


@_rule("sort", "argsort")
def _sort(self, prim, a, *, axis):
    v, b, nd = self.unpack(a)
    return self.new(self.bind_parent(prim, v, axis=int(axis) % nd + (1 if b else 0)), b)


@_rule("argmax", "argmin")
def _arg(self, prim, a, *, axis=None, keepdims=False):
    v, b, nd = self.unpack(a)
    if not b:
        return self.new(self.bind_parent(prim, v, axis=axis, keepdims=keepdims), False)
    if axis is None:
        r = self.bind_parent(prim, v.reshape(v.shape[0], -1), axis=1, keepdims=False)
        if keepdims:
            r = r.reshape((v.shape[0],) + (1,) * nd)
        return self.new(r, True)
    return self.new(self.bind_parent(prim, v, axis=int(axis) % nd + 1, keepdims=keepdims), True)


# =============================================================================================
# Sums, products, running sums
# =============================================================================================
def _to_ski(v, batched, axes, nd, S):
    """Lay out X as (S', O, K, I): kept axes before the first reduced axis, the reduced axes
    (flattened, C order), then the other kept axes; returns (X4, kept shape)."""
    shape = v.shape[1:] if batched else v.shape
    first = axes[0] if axes else nd
    before = [i for i in range(nd) if i not in axes and i < first]
    after = [i for i in range(nd) if i not in axes and i > first]
    perm = before + list(axes) + after
    off = 1 if batched else 0
    x = np.transpose(v, ([0] if batched else []) + [p + off for p in perm])
    O = int(np.prod([shape[i] for i in before], dtype=np.int64))
    K = int(np.prod([shape[i] for i in axes], dtype=np.int64))
    I_ = int(np.prod([shape[i] for i in after], dtype=np.int64))
    x4 = np.ascontiguousarray(x, np.float64).reshape((S if batched else 1, O, K, I_))
    kept = [shape[i] for i in before] + [shape[i] for i in after]
    return x4, kept


def _sum_like(self, prim, a, axis, keepdims, dtype, kind):
    """kind: 'sum', 'prod' or 'cumsum'."""
    v, b, nd = self.unpack(a)
    v = _host(v)
    dparams = {"dtype": dtype} if dtype else {}
    if kind == "cumsum":
        dparams["axis"] = None      # the cumsum primitive's axis is keyword-only and required
    out_dt = self.result_dtype(prim, [v if not b else v[:1]], dparams)
    if not _is_float(out_dt):
        params = dict(axis=axis, dtype=dtype) if kind == "cumsum" else dict(
            axis=axis, keepdims=keepdims, dtype=dtype)
        if b:
            params["axis"] = (int(axis) % nd + 1 if kind == "cumsum" else
                              tuple(x + 1 for x in _red_axes(axis, nd)))
        return self.new(self.bind_parent(prim, v, **params), b)
    F_out = _fmt(out_dt)
    pname = {"sum": "reduce_sum", "prod": "reduce_prod", "cumsum": "cumsum"}[kind]
    F_acc = self.policy.resolve(pname, out_dt).accumulate
    if kind == "cumsum":
        if axis is None:
            v = v.reshape((v.shape[0], -1)) if b else v.reshape(-1)
            nd, axes = 1, (0,)
        else:
            axes = (int(axis) % nd,)
    else:
        axes = _red_axes(axis, nd)
    shape = v.shape[1:] if b else v.shape
    x4, kept = _to_ski(v, b, axes, nd, self.S)
    Sx, O, K, I_ = x4.shape
    out = np.empty((self.S, O, K if kind == "cumsum" else 1, I_))
    if self.granularity == "flop":
        kcode = {"sum": 1 if self.order == "pairwise" else 0, "prod": 2, "cumsum": 3}[kind]
        xb = np.broadcast_to(x4, (self.S, O, K, I_))
        if kcode in (0, 3) and F_acc.name == "float32" and self.mode in ("sr", "ud", "cestac"):
            _K.fast_reduce(_K.MODES[self.mode])(xb, self.keys, self.next_op(), kcode == 3, out)
        else:
            _K.reduce_flop(xb, self.keys, self.next_op(), _K.MODES[self.mode],
                           _fparams(F_acc), int(self.t or F_acc.p), kcode, out)
        res = out
        if F_out.p < F_acc.p or F_out.name != F_acc.name:
            res = self.round_to(out, F_out, np.float64, True)
    else:
        e = None
        with np.errstate(all="ignore"):
            if F_acc.p < 53 or kind == "prod":
                if kind == "sum":
                    y = x4.sum(axis=2, keepdims=True)
                elif kind == "prod":
                    y = (np.prod(x4.astype(np.longdouble), axis=2, keepdims=True)
                         if F_acc.p == 53 else x4.prod(axis=2, keepdims=True))
                    if F_acc.p == 53:
                        e = (y - y.astype(np.float64).astype(np.longdouble)).astype(np.float64)
                        y = y.astype(np.float64)
                else:
                    y = np.cumsum(x4, axis=2)
            else:
                yshape = (Sx, O, K if kind == "cumsum" else 1, I_)
                y, e = np.empty(yshape), np.empty(yshape)
                _K.sum_sum2(x4, kind == "cumsum", y, e)
        res = self.round_to(y, F_out, np.float64, Sx > 1, e=e)
    res = np.asarray(res)
    # back to the user's layout
    if kind == "cumsum":
        first = axes[0]
        before = [i for i in range(nd) if i < first]
        after = [i for i in range(nd) if i > first]
        r = res.reshape((self.S,) + tuple(shape[i] for i in before) + (K,) +
                        tuple(shape[i] for i in after))
    else:
        r = res.reshape((self.S,) + tuple(kept))
        if keepdims:
            r = r.reshape((self.S,) + tuple(1 if i in axes else shape[i] for i in range(nd)))
    return self.new(_store(np.asarray(r), out_dt), True)


@_rule("reduce_sum")
def _reduce_sum(self, prim, a, *, axis=None, keepdims=False, dtype=None):
    return _sum_like(self, prim, a, axis, keepdims, dtype, "sum")


@_rule("reduce_prod")
def _reduce_prod(self, prim, a, *, axis=None, keepdims=False, dtype=None):
    return _sum_like(self, prim, a, axis, keepdims, dtype, "prod")


@_rule("cumsum")
def _cumsum(self, prim, a, *, axis, dtype=None):
    return _sum_like(self, prim, a, axis, False, dtype, "cumsum")


# =============================================================================================
# Matmul
# =============================================================================================
@_rule("matmul")
def _matmul(self, prim, a, b):
    va, ba, na = self.unpack(a)
    vb, bb, nb = self.unpack(b)
    va, vb = _host(va), _host(vb)
    if na == 0 or nb == 0:
        raise ValueError("matmul: input operand does not have enough dimensions")
    out_dt = self.result_dtype(prim, [va[:1] if ba else va, vb[:1] if bb else vb], {})
    # per-sample shapes, with 1-D operands made matrices (squeezed at the end)
    sa = va.shape[1:] if ba else va.shape
    sb = vb.shape[1:] if bb else vb.shape
    if na == 1:
        va = va.reshape(va.shape[:-1] + (1, sa[0]))
        sa = (1,) + sa
    if nb == 1:
        vb = vb.reshape(vb.shape + (1,))
        sb = sb + (1,)
    M, K = sa[-2:]
    K2, N = sb[-2:]
    if K != K2:
        raise ValueError(f"matmul: mismatch in its core dimension (n?,k),(k,m?): "
                         f"{K} != {K2} (per-sample shapes {sa} and {sb})")
    bshape = np.broadcast_shapes(sa[:-2], sb[:-2])
    G = int(np.prod(bshape, dtype=np.int64))

    def four(v, batched, s, rows, cols):
        Sx = self.S if batched else 1
        if s[:-2] == bshape or G == 1:
            x = v.reshape((Sx, G, rows, cols))
        elif all(d == 1 for d in s[:-2]):
            x = v.reshape((Sx, 1, rows, cols))
        else:
            full = (Sx,) + bshape + (rows, cols)
            x = np.broadcast_to(v.reshape((Sx,) + (1,) * (len(bshape) - len(s) + 2) + s),
                                full).reshape((Sx, G, rows, cols))
        return x

    A4 = four(va, ba, sa, M, K)
    B4 = four(vb, bb, sb, K, N)

    def finish(res):
        r = np.asarray(res).reshape((res.shape[0],) + bshape + (M, N))
        if nb == 1:
            r = r[..., 0]
        if na == 1:
            r = r[..., 0, :] if nb != 1 else r[..., 0]
        return r

    if not _is_float(out_dt):       # integer / bool matmul: exact
        r = finish(np.matmul(A4, B4))
        return self.new(r if (ba or bb) else r[0], ba or bb)   # unbatched: no sample axis
    prec = self.policy.resolve("matmul", out_dt)
    F_in, F_prod, F_acc, F_out = prec.input, prec.compute, prec.accumulate, prec.output
    A4 = _as_format(self, A4, ba, F_in)
    B4 = _as_format(self, B4, bb, F_in)
    out = np.empty((self.S, G, M, N))
    if self.granularity == "flop":
        op_p = self.next_op(2)
        fast = (F_prod.name == "float32" and F_acc.name == "float32" and
                self.mode in ("sr", "ud", "cestac") and self.order == "sequential")
        if fast and N < 64 and M > N:
            # few output columns (convolutions: N = channels): loop over the long side
            # instead, computing (Bᵀ·Aᵀ) with every decision at its natural position
            outT = np.empty((self.S, G, N, M))
            _K.fast_matmul(_K.MODES[self.mode])(
                np.ascontiguousarray(np.swapaxes(B4, -1, -2)),
                np.ascontiguousarray(np.swapaxes(A4, -1, -2)), self.keys, op_p, K, N * K, outT)
            out = np.swapaxes(outT, -1, -2)
        elif fast:
            _K.fast_matmul(_K.MODES[self.mode])(A4, B4, self.keys, op_p, N * K, K, out)
        else:
            _K.matmul_flop(A4, B4, self.keys, op_p, op_p + 1, _K.MODES[self.mode],
                           _fparams(F_prod), _fparams(F_acc), int(self.t or F_acc.p),
                           self.order == "pairwise", out)
        res = out
        if F_out.name != F_acc.name:
            res = self.round_to(out, F_out, np.float64, True)
    else:
        if F_acc.p < 53:
            with np.errstate(all="ignore"):
                y = np.matmul(A4, B4)
            # straight into the result dtype where it is F_out's (no float64 copy)
            to = out_dt if getattr(_fmt(out_dt), "name", None) == F_out.name else np.float64
            res = self.round_to(y, F_out, to, y.shape[0] > 1)
        else:
            Sx = max(A4.shape[0], B4.shape[0])
            hi, lo = np.empty((Sx, G, M, N)), np.empty((Sx, G, M, N))
            _K.matmul_dot2(A4, B4, hi, lo)
            res = self.round_to(hi, F_out, np.float64, Sx > 1, e=lo)
    return self.new(_store(finish(res), out_dt), True)


def _as_format(self, x4, batched, F_in):
    """Operands in float64, rounded into the policy's input format (e.g. tf32) with the mode
    when their own format is wider (a conversion is a rounding operation)."""
    src = _fmt(x4.dtype) if _is_float(x4.dtype) else None
    x = np.ascontiguousarray(x4, np.float64)
    if src is not None and src.p <= F_in.p and src.emin >= F_in.emin and src.max <= F_in.max:
        return x
    if src is None and x4.dtype.kind in "iub" and (x4.dtype.itemsize * 8 <= F_in.p):
        return x
    # round_to gives every sample its own rounding: an unbatched (1, G, R, C) operand becomes
    # (S, G, R, C), so hand it the per-sample array
    return np.ascontiguousarray(self.round_to(x if batched else x[0], F_in, np.float64, batched))


# =============================================================================================
# The transform
# =============================================================================================
def stochastic(f=None, mode: str = "sr", *, samples: int = 10, seed: int = 0, policy=None,
               granularity: str = "flop", vectorize: bool = True, executor=None,
               progress=None, order: str = "sequential", t: int | None = None,
               mca_mode: str = "mca"):
    """``stochastic(f, mode, samples=S)(*args)`` -> ``f``'s outputs with a leading axis of S
    randomly rounded samples (same pytree).

    ``mode``: ``"sr"`` (stochastic rounding), ``"ud"`` (up-down), ``"cestac"``, ``"mca"``
    (Monte Carlo arithmetic with virtual precision ``t``, default the result format's p, and
    ``mca_mode`` ``"rr"`` (outputs), ``"pb"`` (inputs) or ``"mca"`` (both)), ``"ieee"`` (no
    perturbation). ``granularity``: ``"flop"`` (every multiply and add inside matmul, sums,
    cumsum and conv, in ``order`` ``"sequential"`` or ``"pairwise"``) or ``"op"`` (each
    primitive's output). ``seed`` fixes the run; sample i depends only on (seed, i).
    ``vectorize``: one pass with a sample axis where the program allows (fpx falls back to one
    run per sample when Python control flow reads a perturbed value). ``executor``: any
    ``concurrent.futures.Executor`` (or a ``dask.distributed.Client``) to spread samples over
    processes or machines (``f`` must then be picklable). ``progress``: a tqdm bar (None: shown
    for runs longer than about two seconds).
    """
    if f is None:
        return lambda g: stochastic(g, mode, samples=samples, seed=seed, policy=policy,
                                    granularity=granularity, vectorize=vectorize,
                                    executor=executor, progress=progress, order=order, t=t,
                                    mca_mode=mca_mode)
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"fpx.stochastic: unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    if granularity not in ("flop", "op"):
        raise ValueError(f"fpx.stochastic: granularity must be 'flop' or 'op', not {granularity!r}")
    if order not in ("sequential", "pairwise"):
        raise ValueError(f"fpx.stochastic: order must be 'sequential' or 'pairwise', not {order!r}")
    if mca_mode not in _MCA_MODES:
        raise ValueError(f"fpx.stochastic: mca_mode must be one of {_MCA_MODES}, not {mca_mode!r}")
    if not isinstance(samples, (int, np.integer)) or isinstance(samples, bool) or samples < 1:
        raise ValueError(f"fpx.stochastic: samples must be a positive integer, not {samples!r}")
    if t is not None and not (isinstance(t, (int, np.integer)) and 1 <= t <= 53):
        raise ValueError(f"fpx.stochastic: virtual precision t must be an integer in [1, 53], not {t!r}")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"fpx.stochastic: seed must be a non-negative integer, not {seed!r}")
    get_policy(policy)  # validate early
    options = dict(mode=mode, seed=int(seed), policy=policy, granularity=granularity,
                   vectorize=vectorize, order=order, t=t, mca_mode=mca_mode)

    def sampled(ad):
        fn, a, k = ad.fn, ad.args, ad.kwargs
        leaves, td = tree.flatten((a, k))
        on_gpu = any(_is_cupy(x) for x in leaves)
        if on_gpu:   # the rounding kernels are CPU code: sample on host copies, return CuPy
            fn, leaves = on_host(fn, leaves)
            a, k = tree.unflatten(td, leaves)
        default = "cupy" if on_gpu and ad.policy is None else ad.policy
        opts = dict(options, policy=default if policy is None else policy)
        out = _run(fn, a, k, int(samples), opts, executor, progress)
        if on_gpu:
            import cupy
            out = tree.tree_map(lambda x: cupy.asarray(x) if isinstance(x, np.ndarray) else x,
                                out)
        return out
    return transformed(f, sampled, check=_check_outermost)


def _check_outermost(args, kwargs):
    """fpx.stochastic runs outermost: no enclosing transform, no other transform's values."""
    outer = current_interpreter()
    if not isinstance(outer, EvalInterpreter):
        raise _nesting_error("stochastic", _transform_name(outer))
    for x in tree.flatten((args, kwargs))[0]:
        if isinstance(x, Tracer):        # another transform's value, handed in from outside
            raise _nesting_error("stochastic", _transform_name(x._interp))


def _run(f, args, kwargs, S, options, executor, progress):
    from tqdm.auto import tqdm
    if executor is not None:
        _check_fork_safe(executor)
    chunks = ([list(range(S))] if (executor is None and options["vectorize"])
              else [[i] for i in range(S)])
    if executor is not None and options["vectorize"]:
        n = max(1, min(S, 2 * _workers(executor)))
        chunks = [list(c) for c in np.array_split(np.arange(S), n) if len(c)]
    # progress=None: tqdm's own choice (shown on a terminal, after 2 s); True: always shown.
    # (A bar built disabled cannot be switched on later: it lacks the display state.)
    bar = None if progress is False else tqdm(
        total=S, delay=0.0 if progress is True else 2.0,
        disable=False if progress is True else None, unit="sample", desc="fpx.stochastic")
    results = [None] * len(chunks)
    try:
        if executor is None:
            for j, c in enumerate(chunks):
                results[j] = run_samples(f, args, kwargs, c, options)
                if bar is not None:
                    bar.update(len(c))
        else:
            futs = [executor.submit(run_samples, f, args, kwargs, c, options) for c in chunks]
            for j, fu in enumerate(futs):
                results[j] = fu.result()
                if bar is not None:
                    bar.update(len(chunks[j]))
    finally:
        if bar is not None:
            bar.close()
    return _concat_samples(results)


def _concat_samples(parts, host=False):
    """Outputs of runs over consecutive samples (one pytree each) joined along the sample
    axis; ``host``: as NumPy arrays."""
    leaves0, td = tree.flatten(parts[0])
    flat = [tree.flatten(p)[0] for p in parts]
    out = []
    for i, x in enumerate(leaves0):
        if is_array_leaf(x):
            xs = [_host(p[i]) if host else p[i] for p in flat]
            out.append(_xp(xs[0]).concatenate(xs, axis=0))
        else:
            out.append(x)
    return tree.unflatten(td, out)


def _check_fork_safe(executor):
    """A worker forked from a process whose numba kernels already ran on GNU OpenMP is killed
    by numba (SIGTERM: GNU OpenMP is not fork-safe) at its first kernel, and the pool only
    reports BrokenProcessPool: say what happened and how to avoid it instead."""
    ctx = getattr(executor, "_mp_context", None)       # concurrent.futures.ProcessPoolExecutor
    try:
        if ctx is None or ctx.get_start_method() != "fork":
            return
        import numba
        layer = numba.threading_layer()                 # ValueError: no parallel kernel ran yet
    except Exception:
        return
    if layer != "omp":
        return
    from numba.np.ufunc import omppool
    if getattr(omppool, "openmp_vendor", "GNU") != "GNU":
        return
    raise RuntimeError(
        "fpx.stochastic: this ProcessPoolExecutor starts its workers with fork(), but this "
        "process has already run numba kernels on GNU OpenMP, which is not fork-safe (the "
        "workers would be killed). Create the executor with "
        "mp_context=multiprocessing.get_context('spawn') or 'forkserver' (or install tbb "
        "for numba's fork-safe threading layer).")


def _workers(executor) -> int:
    n = getattr(executor, "_max_workers", None)     # concurrent.futures executors
    if n:
        return int(n)
    try:
        return max(1, len(executor.nthreads()))      # dask.distributed.Client
    except Exception:
        return 2


def run_samples(f, args, kwargs, indices, options):
    """Run samples ``indices`` of ``f`` (vectorized when possible, else one by one); outputs
    with a leading axis of len(indices). Top-level so executors can pickle it."""
    keys = sample_keys(options["seed"], indices)
    if options["mode"] == "ieee":
        out = f(*args, **kwargs)
        return _repeat_outputs(out, len(indices))
    if options["vectorize"] and len(indices) > 0:
        try:
            return _run_once(f, args, kwargs, keys, options, per_sample=False)
        except _NeedsPerSample:
            pass
    return _concat_samples([_run_once(f, args, kwargs, keys[j:j + 1], options, per_sample=True)
                            for j in range(len(indices))], host=True)


def _repeat_outputs(out, S):
    """The outputs of an unperturbed run as S identical samples."""
    return tree.tree_map(lambda x: _repeat(concrete(x), S)
                         if is_array_leaf(x) or isinstance(x, (bool, int, float)) else x, out)


def _xp(c):
    if _is_cupy(c):
        import cupy
        return cupy
    return np


def _repeat(v, S):
    """``v`` repeated along a new leading sample axis of length ``S`` (contiguous)."""
    xp = _xp(v)
    v = xp.asarray(v)
    return xp.ascontiguousarray(xp.broadcast_to(v[None], (S,) + tuple(v.shape)))


def _run_once(f, args, kwargs, keys, options, per_sample):
    """One vectorized pass over the samples of ``keys``: outputs with a leading sample axis."""
    def interpreter(parent):
        return StochasticInterpreter(parent, options["mode"], keys, policy=options["policy"],
                                     granularity=options["granularity"], order=options["order"],
                                     t=options["t"], mca_mode=options["mca_mode"],
                                     per_sample=per_sample)

    def with_sample_axis(interp, x):
        if own(interp, x) and x.batched:
            return x.primal
        return _repeat(x.primal if own(interp, x) else concrete(x), len(keys))
    return run(interpreter, _input, f, args, kwargs, with_sample_axis)[1]


def _input(interp, x):
    return StochasticTracer(interp, x, False)
