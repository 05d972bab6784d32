"""Soundness fuzz of ``fpx.interval`` on what the DAG fuzz of tests/test_interval.py leaves out:
Python literals, Python scalar inputs, values that escape the program (``float()``,
``.item()``, ``math`` functions, stores into an ndarray, Python branches) and 1-D matmuls
(vec@vec, mat@vec, vec@mat, ``np.dot``) with interval operands of many widths.

Random straight-line programs (fixed seeds, no hypothesis) over 1-D and 2-D float64, float32,
float16 and bfloat16 arrays and Python floats, written as a user writes them (``t * 3``,
``2.0 ** t``, ``np.dot(a, b)``). Every node is an output, and every element is checked with
tests/test_interval.py's oracle and executions:

  (a) the exact real result (MPFR, 1200 bits) at the inputs' values and, for programs without
      escapes, at a random vertex of the ``Interval`` inputs' boxes;
  (b) the program's own value, which must also equal an eager run bit for bit;
  (c) re-executions in the program's precision in five summation orders (sequential, reversed,
      pairwise, split-K, random tree; directed or correctly rounded variants) on points drawn
      inside the input boxes;
  (e) no NaN bound where the program's value is not NaN.

A program with an escape passes either with a sound bound or with an ``escaped-value`` or
``unstable-control-flow`` event; then ``fpx.classify`` against the exact result must not say
``bug``. The failures the fuzz found are regression tests at the end, each a minimal repro.
``FPX_INTERVAL_TEST_SCALE`` scales the number of cases (default 1: about 20 s on one core).
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass

import gmpy2
import numpy as np
import pytest

import fpx
import test_interval as T        # the DAG fuzz: its exact oracle, executions and inputs
from fpx.transforms.interval import Interval, run_interval

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

F64, F32, F16, BF16 = T.F64, T.F32, T.F16, T.BF16
ESCAPE_EVENTS = ("escaped-value", "unstable-control-flow")


# =============================================================================================
# Ops: the program (plain NumPy and Python operators), its exact twin (MPFR object arrays)
# =============================================================================================
def _first(a):
    return (0,) * np.ndim(a)


def _lit(c):
    """A Python literal as the exact real the program names (a float is its float64 value)."""
    return gmpy2.mpfr(c)


def _each(f):
    g = np.frompyfunc(f, 1, 1)
    return lambda a: g(np.asarray(a, dtype=object))


def _store(a):
    buf = np.zeros(np.shape(a), a.dtype)
    buf[_first(a)] = a[_first(a)] * 3          # a traced value stored into an ndarray
    return buf


def _store_exact(a):
    buf = np.full(np.shape(a), gmpy2.mpfr(0), dtype=object)
    buf[_first(a)] = 3 * a[_first(a)]
    return buf


# name: (arity, program, exact). Literal ops take the literal as param ``c``.
LITERAL_OPS = {
    "radd": (1, lambda a, *, c: a + c, lambda a, *, c: a + _lit(c)),
    "lsub": (1, lambda a, *, c: c - a, lambda a, *, c: _lit(c) - a),
    "rsub": (1, lambda a, *, c: a - c, lambda a, *, c: a - _lit(c)),
    "rmul": (1, lambda a, *, c: a * c, lambda a, *, c: a * _lit(c)),
    "rdiv": (1, lambda a, *, c: a / c, lambda a, *, c: a / _lit(c)),
    "ldiv": (1, lambda a, *, c: c / a, lambda a, *, c: _each(lambda x: _lit(c) / x)(a)),
    "rpow": (1, lambda a, *, c: a ** c, lambda a, *, c: _each(lambda x: x ** _lit(c))(a)),
    "lpow": (1, lambda a, *, c: c ** a, lambda a, *, c: _each(lambda x: _lit(c) ** x)(a)),
}
LITERALS = (0.485, 0.229, 0.1, 1 / 3, 3.0, -2.5, 1e5, 1e-9, 1e-30, 70000.0, 2.0 ** -30, 1e300,
            3, 1, -2, 7, 100000, 0)
EXPONENTS = (2, 3, -1, -2, 2.0, 0.5, 1.5, -0.5)
BASES = (2.0, 2, 10.0, 0.5, 3)

ESCAPE_OPS = {
    "esc_float": (2, lambda a, b: a * float(np.sum(b)), lambda a, b: a * np.sum(b)),
    "esc_item": (2, lambda a, b: a + b[_first(b)].item(), lambda a, b: a + b[_first(b)]),
    "esc_exp": (1, lambda a: a * math.exp(-abs(a[_first(a)])),
                lambda a: a * gmpy2.exp(-abs(a[_first(a)]))),
    "esc_sqrt": (1, lambda a: a - math.sqrt(abs(a[_first(a)])),
                 lambda a: a - gmpy2.sqrt(abs(a[_first(a)]))),
    "esc_int": (1, lambda a: a * int(a[_first(a)] * 10),
                lambda a: a * int(gmpy2.trunc(10 * a[_first(a)]))),
    "esc_store": (1, _store, _store_exact),
    "esc_float_out": (1, lambda a: float(np.sum(a)), lambda a: np.sum(a)),
    "esc_math_out": (1, lambda a: math.exp(-abs(a[_first(a)])),
                     lambda a: gmpy2.exp(-abs(a[_first(a)]))),
    "esc_branch": (1, lambda a: a * 2 if np.sum(a) > 0 else -a,
                   lambda a: a * 2 if np.sum(a) > 0 else -a),
}

MATMUL_OPS = {
    "matmul": (2, lambda a, b: a @ b, lambda a, b: np.matmul(a, b)),
    "dot": (2, lambda a, b: np.dot(a, b), lambda a, b: np.dot(a, b)),
}

OWN_OPS = {**LITERAL_OPS, **ESCAPE_OPS, **MATMUL_OPS}
# ops of tests/test_interval.py (fpx.numpy calls), by arity
BASE_UNARY = ("exp", "log", "sqrt", "tanh", "sin", "abs", "neg", "square", "reciprocal")
BASE_BINARY = ("add", "sub", "mul", "div", "max", "min")
REDUCTIONS = ("sum", "mean", "cumsum")
ELEMENTWISE = set(LITERAL_OPS) | set(BASE_UNARY) | set(BASE_BINARY) | {"cast"}


def arity(op):
    if op in OWN_OPS:
        return OWN_OPS[op][0]
    return 2 if op in BASE_BINARY else 1


def program_apply(node, args):
    if node.op in OWN_OPS:
        return OWN_OPS[node.op][1](*args, **node.kw)
    return T.program_apply(node, args)


def exact_apply(node, args, meta):
    if node.op in OWN_OPS:
        return OWN_OPS[node.op][2](*args, **node.kw)
    return T.exact_apply(node, args, meta)


def alt_apply(alt, node, args, meta):
    """``node`` in the execution ``alt`` (a tests/test_interval.py ``Alt``): its own orders for
    sums and matmuls (1-D operands as one-row or one-column matrices), NumPy for the rest."""
    if node.op in MATMUL_OPS:
        a, b = (np.asarray(x) for x in args)
        with np.errstate(all="ignore"):
            y = alt.matmul(a.reshape(1, -1) if a.ndim == 1 else a,
                           b.reshape(-1, 1) if b.ndim == 1 else b, meta[0])
        y = y[0] if a.ndim == 1 else y
        return y[..., 0] if b.ndim == 1 else y
    if node.op in OWN_OPS:
        with np.errstate(all="ignore"):
            return program_apply(node, args)
    if node.op in T.TRANSCENDENTAL and not isinstance(args[0], np.ndarray):
        args = [np.asarray(args[0], np.float64)]      # (a Python float: float64 arithmetic)
    return alt.apply(node, args, meta)


# =============================================================================================
# Programs
# =============================================================================================
@dataclass
class Case:
    inputs: list        # what fpx.interval gets: arrays, Python floats, Intervals
    centers: list       # the values the program runs on
    boxes: list         # None or (lo, hi) float64 of an Interval input
    samplers: list      # None or rng -> a point of the box in the input's dtype
    nodes: list         # test_interval.Node; node k is value n_in + k
    meta: list          # per node: (out dtype, arg dtypes)
    matmul: str = "midrad"

    @property
    def n_in(self):
        return len(self.inputs)

    @property
    def escapes(self):
        return any(nd.op in ESCAPE_OPS for nd in self.nodes)

    def describe(self):
        lines = [f"matmul={self.matmul!r}"]
        for i, x in enumerate(self.centers):
            kind = type(x).__name__ if not isinstance(x, np.ndarray) else \
                f"{x.dtype.name}{list(x.shape)}"
            box = "" if self.boxes[i] is None else \
                f" as Interval, lo={self.boxes[i][0].tolist()!r}, hi={self.boxes[i][1].tolist()!r}"
            lines.append(f"n{i} = input {kind} {T.f64(x).tolist()!r}{box}")
        for k, nd in enumerate(self.nodes):
            lines.append(f"n{self.n_in + k} = {nd}    -> {self.meta[k][0].name}")
        return "\n".join(lines)

    def program(self):
        def prog(*xs):
            vals = list(xs)
            for nd in self.nodes:
                vals.append(program_apply(nd, [vals[i] for i in nd.args]))
            return vals[self.n_in:]
        return prog


def _dtype(x):
    return np.asarray(x).dtype


def interval_input(rng, x):
    """An Interval around ``x`` (a few ulps, or a relative width up to 1) and a sampler of
    points of ``x``'s format inside it."""
    if rng.random() < 0.5:
        return T.interval_input(rng, x, int(rng.choice([1, 3, 100])))
    rel = float(rng.choice([1e-5, 1e-3, 0.1, 1.0]))
    iv = Interval.around(x, rel=rel)
    lo, hi = iv.lo, iv.hi
    fm = T.fmt(x.dtype)

    def sample(rng):
        t = rng.choice([0.0, 1.0, 0.5, rng.random()], size=x.shape)
        with np.errstate(all="ignore"):
            p = T.f64(fpx.formats.round(np.clip(lo + t * (hi - lo), -fm.max, fm.max), fm))
        p = np.where((p >= lo) & (p <= hi), p, T.f64(x))
        return p.astype(x.dtype)
    return iv, (lo, hi), sample


@dataclass(frozen=True)
class Family:
    ops: tuple
    dtype_sets: tuple
    sizes: tuple
    shapes: object              # (n, rng) -> candidate input shapes
    interval_p: float           # chance that an array input is an Interval
    scalar_p: float             # chance of one more input, a Python float
    max_nodes: int = 6


def draw_case(rng, fam):
    n = int(rng.choice(fam.sizes))
    dts = fam.dtype_sets[int(rng.integers(len(fam.dtype_sets)))]
    centers, inputs, boxes, samplers = [], [], [], []
    for _ in range(int(rng.integers(1, 4))):
        dt = dts[int(rng.integers(len(dts)))]
        opts = fam.shapes(n, rng)
        shape = opts[int(rng.integers(len(opts)))]
        x = T.gen_values(rng, str(rng.choice(T.INPUT_MODES)), shape, dt, centers)
        centers.append(x)
        if rng.random() < fam.interval_p:
            iv, box, smp = interval_input(rng, x)
        else:
            iv, box, smp = x, None, None
        inputs.append(iv)
        boxes.append(box)
        samplers.append(smp)
    if rng.random() < fam.scalar_p:
        s = float(rng.choice([0.3, 1.0, -2.5, 1e-3, 7.25, 0.1, 1e30]))
        centers.append(s)
        inputs.append(s)
        boxes.append(None)
        samplers.append(None)
    vals = list(centers)
    nodes, meta = [], []
    for _ in range(int(rng.integers(1, fam.max_nodes + 1))):
        op = str(rng.choice(fam.ops))
        nd = _draw_node(rng, op, vals)
        if nd is None:
            continue
        try:
            with np.errstate(all="ignore"):
                out = program_apply(nd, [vals[i] for i in nd.args])
        except (TypeError, ValueError, ArithmeticError, IndexError):
            continue        # bfloat16 with float16, int() of inf, 1.0 / 0.0: another op
        if np.asarray(out).dtype.kind != "f":
            continue
        nodes.append(nd)
        meta.append((_dtype(out), tuple(_dtype(vals[i]) for i in nd.args)))
        vals.append(out)
    if not nodes:
        return draw_case(rng, fam)
    mm = str(rng.choice(["midrad", "midrad", "fast", "exact-center"]))
    return Case(inputs, centers, boxes, samplers, nodes, meta, mm)


def _draw_node(rng, op, vals):
    arrays = [i for i, v in enumerate(vals) if np.ndim(v) >= 1]
    k = arity(op)
    if op in MATMUL_OPS:
        pairs = [(i, j) for i in arrays for j in arrays
                 if np.shape(vals[i])[-1] == np.shape(vals[j])[0] and
                 (np.ndim(vals[j]) == 1 or np.ndim(vals[i]) == 1) and
                 {_dtype(vals[i]), _dtype(vals[j])} != {F16, BF16}]     # (known crash)
        if not pairs:
            return None
        i, j = pairs[int(rng.integers(len(pairs)))]
        return T.Node(op, (i, j))
    needs_array = op in ESCAPE_OPS or op in REDUCTIONS
    pool = arrays if needs_array else list(range(len(vals)))
    if not pool:
        return None
    a = int(rng.choice(pool))
    args = [a] + [int(rng.choice(arrays if needs_array else pool)) for _ in range(k - 1)]
    if k > 1 and any(type(vals[i]) is float for i in args) and \
            any(isinstance(vals[i], np.ndarray) and vals[i].dtype != F64 for i in args):
        return None     # a Python float meets a narrower array (known: the float's rounding)
    params = ()
    if op in ("rpow",):
        params = (("c", EXPONENTS[int(rng.integers(len(EXPONENTS)))]),)
    elif op == "lpow":
        params = (("c", BASES[int(rng.integers(len(BASES)))]),)
    elif op in LITERAL_OPS:
        params = (("c", LITERALS[int(rng.integers(len(LITERALS)))]),)
    elif op == "cast":
        src = _dtype(vals[a])
        params = (("to", [d for d in (F64, F32, F16, BF16) if d != src][int(rng.integers(3))]),)
    elif op == "sum":
        axes = [None, *range(np.ndim(vals[a]))]
        params = (("axis", axes[int(rng.integers(len(axes)))]),)
    elif op in ("mean", "cumsum"):
        params = (("axis", int(rng.integers(np.ndim(vals[a])))),)
    return T.Node(op, tuple(args), params)


def _square(n, rng):
    return [(n,), (n,), (n, n), (1, n)]


def _matmul_shapes(n, rng):
    m = int(rng.integers(1, 5))
    return [(n,), (n,), (m, n), (n, m)]


LITERALS_FAMILY = Family(
    ops=tuple(LITERAL_OPS) * 3 + BASE_UNARY + BASE_BINARY + REDUCTIONS + ("cast", "matmul"),
    dtype_sets=((F64,), (F32,), (F32,), (F16,), (BF16,), (F32, F64)), sizes=(1, 2, 3, 5),
    shapes=_square, interval_p=0.2, scalar_p=0.4)
ESCAPES_FAMILY = Family(
    ops=tuple(ESCAPE_OPS) * 3 + tuple(LITERAL_OPS) + ("add", "mul", "exp", "tanh", "sum"),
    dtype_sets=((F64,), (F32,), (F16,), (BF16,)), sizes=(1, 2, 3, 5),
    shapes=_square, interval_p=0.2, scalar_p=0.2, max_nodes=5)
MATMUL_FAMILY = Family(
    ops=("matmul", "dot") * 4 + ("rmul", "radd", "tanh", "add", "sum", "cast"),
    dtype_sets=((F64,), (F32,), (F32,), (F16,), (F16, F32), (BF16,)),
    sizes=(1, 2, 3, 7, 16, 64, 257), shapes=_matmul_shapes, interval_p=0.7, scalar_p=0.1,
    max_nodes=4)


# =============================================================================================
# Checking
# =============================================================================================
class Violations(AssertionError):
    pass


def run_values(case, inputs, apply):
    vals = list(inputs)
    for k, nd in enumerate(case.nodes):
        vals.append(apply(nd, [vals[i] for i in nd.args], case.meta[k]))
    return vals[case.n_in:]


def exact_at(case, points):
    """The exact result of every node at ``points`` (float64 values or None: the centre)."""
    xs = [c if p is None else p for c, p in zip(case.centers, points)]
    ins = [np.asarray(T._TO_MPFR(T.f64(x)), dtype=object) for x in xs]
    with gmpy2.context(gmpy2.get_context(), precision=T.EXACT_PREC), np.errstate(all="ignore"):
        return run_values(case, ins, exact_apply)


def propagate(case, shapes, seeds):
    """Per node, the elements downstream of a seeded element (``seeds[k]``: the node's own
    marks, or None): elementwise ops pass marks through, anything else spreads them."""
    marks = [np.zeros(np.shape(x), bool) for x in case.centers]
    for k, nd in enumerate(case.nodes):
        args = [marks[j] for j in nd.args]
        if nd.op in ELEMENTWISE:
            m = np.zeros(shapes[k], bool)
            for t in args:
                m = m | np.broadcast_to(t, shapes[k])
        else:
            m = np.full(shapes[k], any(bool(np.any(t)) for t in args))
        if seeds[k] is not None:
            m = m | np.broadcast_to(seeds[k], shapes[k])
        marks.append(m)
    return marks[case.n_in:]


def _at(mask):
    return [tuple(i) for i in np.argwhere(mask)]


def check_case(case, rng, stats, alt_configs):
    prog = case.program()
    with np.errstate(all="ignore"):
        eager = prog(*case.centers)
        try:
            interp, ivs = run_interval(prog, tuple(case.inputs), {}, matmul=case.matmul)
        except Exception as e:
            raise AssertionError(f"fpx.interval crashed on\n{case.describe()}") from e
    shapes = [np.shape(e) for e in eager]
    events = [e for e in interp.events if e.kind in ESCAPE_EVENTS]
    stats["cases"] += 1
    stats["cases_with_escape_ops"] += case.escapes
    exact_sets = [exact_at(case, [None] * case.n_in)]
    if not case.escapes and any(b is not None for b in case.boxes):
        vertex = [None if b is None else np.where(rng.random(np.shape(b[0])) < 0.5, *b)
                  for b in case.boxes]
        exact_sets.append(exact_at(case, vertex))
    alts = []
    for cfg in alt_configs:
        alt = T.Alt("numpy", rng=rng, stats=stats, **cfg)
        ins = [s(rng) if s is not None else x for s, x in zip(case.samplers, case.centers)]
        with np.errstate(all="ignore"):
            try:
                alts.append((alt, ins, run_values(case, ins,
                                                  lambda nd, a, m: alt_apply(alt, nd, a, m))))
            except ArithmeticError:     # Python's own 1/0.0 at these inputs: another path
                stats["alt_skip_python_error"] += 1
    beyond = propagate(case, shapes, [np.asarray(T._BEYOND(np.asarray(e, dtype=object)), bool)
                              for e in exact_sets[0]])
    bad = []
    for k, nd in enumerate(case.nodes):
        iv, node_id = ivs[k], case.n_in + k
        lo, hi, v = np.asarray(iv.lo), np.asarray(iv.hi), np.asarray(iv.value)
        e = np.asarray(eager[k])
        assert v.shape == e.shape == lo.shape == hi.shape and v.dtype == e.dtype, \
            \
            f"n{node_id} = {nd}: value {v.dtype}{v.shape}, eager {e.dtype}{e.shape}, bounds " \
            f"{lo.shape}\n{case.describe()}"
        v64 = T.f64(v)
        assert np.array_equal(v64, T.f64(e), equal_nan=True), \
            f"n{node_id} = {nd}: interval's value differs from the eager program\n{case.describe()}"
        stats["elements"] += v.size
        nanb = np.isnan(lo) | np.isnan(hi)
        # (e) no NaN bound where the program's value is defined
        defined = ~np.isnan(v64)
        for idx in _at(nanb & defined):
            bad.append(("NaN bound, defined value", node_id, idx, lo[idx], hi[idx], v64[idx], ""))
        # (b) the program's own value
        ok = ~defined | nanb | ((lo <= v64) & (v64 <= hi))
        stats["value_checked"] += int((defined & ~nanb).sum())
        for idx in _at(~ok):
            bad.append(("program value", node_id, idx, lo[idx], hi[idx], v64[idx], ""))
        # (a) exact, at the centre and at a vertex of the boxes
        for which, ex_all in zip(("exact", "exact at a vertex"), exact_sets):
            ex = np.broadcast_to(np.asarray(ex_all[k], dtype=object), v.shape)
            for idx in np.ndindex(v.shape):
                x = ex[idx]
                if nanb[idx] or beyond[k][idx] or not defined[idx]:
                    stats["exact_skip"] += 1
                elif gmpy2.is_nan(x) or gmpy2.is_infinite(x) or abs(x) > T.FLT64_MAX:
                    stats["exact_skip_undefined"] += 1
                else:
                    stats["exact_checked"] += 1
                    if not (gmpy2.mpfr(float(lo[idx])) <= x <= gmpy2.mpfr(float(hi[idx]))):
                        bad.append((which, node_id, idx, lo[idx], hi[idx], x, ""))
        # (c) other executions
        for alt, ins, res in alts:
            y = T.f64(res[k])
            nan = np.isnan(y) | nanb
            stats["alt_checked"] += int((~nan).sum())
            for idx in _at(~(nan | ((lo <= y) & (y <= hi)))):
                bad.append(("other execution", node_id, idx, lo[idx], hi[idx], y[idx],
                            f"{alt!r}, inputs {[T.f64(i).tolist() for i in ins]}"))
    if bad and events and case.escapes:
        stats["escapes_explained_by_event"] += 1
        _check_classify_is_not_bug(case, bad, exact_sets[0])
        return
    stats["escape_events"] += bool(events)
    if bad:
        stats["violations"] += len(bad)
        msg = [f"{len(bad)} soundness violation(s) of fpx.interval", case.describe(),
               f"events: {interp.events}", ""]
        for kind, node_id, idx, l, h, y, extra in bad[:12]:
            msg.append(f"  {kind} outside the bound at n{node_id}{list(map(int, idx))}: "
                       f"{T._fmt_el(y)} not in [{l!r}, {h!r}] {extra}")
        raise Violations("\n".join(msg))


PYTHON_MATH = ("esc_exp", "esc_sqrt", "esc_math_out")


def _check_classify_is_not_bug(case, bad, exact):
    """An escape explained the miss: classify against the exact result must not say bug."""
    node_id = bad[0][1]
    k = node_id - case.n_in
    ref = np.asarray(np.vectorize(float, otypes=[np.float64])(
        np.asarray(exact[k], dtype=object)))
    prog = case.program()
    with np.errstate(all="ignore"):
        v = fpx.classify(lambda *xs: prog(*xs)[k], ref, *case.inputs)
    assert v.kind != "bug", f"classify says bug although an escape was recorded\n{case.describe()}"


def _run(fam, n_cases, seed):
    stats = collections.Counter()
    rng = np.random.default_rng(seed)
    for i in range(n_cases):
        case = draw_case(np.random.default_rng([seed, i]), fam)
        check_case(case, rng, stats, T.alt_configs_for(rng, "numpy"))
    return stats


def _assert_coverage(stats, n_cases, min_exact):
    print("\n" + ", ".join(f"{k}={stats[k]}" for k in sorted(stats)))
    assert stats["violations"] == 0
    assert stats["cases"] == n_cases, stats
    assert stats["exact_checked"] >= min_exact, stats
    assert stats["alt_checked"] >= 3 * min_exact, stats
    skipped = stats["exact_skip"] + stats["exact_skip_undefined"]
    assert skipped <= 0.25 * (stats["exact_checked"] + skipped), stats


# =============================================================================================
# The fuzz
# =============================================================================================
def test_programs_with_python_literals_and_scalar_inputs():
    n = T._n(600)
    stats = _run(LITERALS_FAMILY, n, 20261127)
    _assert_coverage(stats, n, T._n(6000))


def test_programs_with_escapes():
    n = T._n(400)
    stats = _run(ESCAPES_FAMILY, n, 20261128)
    _assert_coverage(stats, n, T._n(3000))
    assert stats["cases_with_escape_ops"] >= 0.8 * n


def test_one_dimensional_interval_matmuls():
    n = T._n(500)
    stats = _run(MATMUL_FAMILY, n, 20261129)
    _assert_coverage(stats, n, T._n(50000))


# =============================================================================================
# What the fuzz found, each as its minimal repro (regression tests)
# =============================================================================================
@pytest.mark.parametrize("f, exact", [
    (np.reciprocal, 1 / gmpy2.mpfr(0.3)),
    (lambda s: s ** 0.5, gmpy2.sqrt(gmpy2.mpfr(0.3))),
    (lambda s: s ** -1, 1 / gmpy2.mpfr(0.3)),
    (lambda s: np.stack([s, s])[0], gmpy2.mpfr(0.3)),
])
def test_reciprocal_and_powers_of_a_python_float_input(f, exact):
    iv = fpx.interval(f)(0.3)
    assert gmpy2.mpfr(float(iv.lo)) <= exact <= gmpy2.mpfr(float(iv.hi))


@pytest.mark.parametrize("f, t", [
    (lambda t, s: np.minimum(t, s), np.float32([1.0])),
    (lambda t, s: np.maximum(t, s), np.float32([1e-4])),
    (lambda t, s: np.where(t > 0.5, t, s), np.float32([0.0])),
    (lambda t, s: s - t * 0.1, np.float16([6.03795051574707e-05])),
])
def test_a_python_float_input_rounded_into_an_arrays_format(f, t):
    iv = fpx.interval(f)(t, 0.001)
    assert iv.contains(iv.value).all()


def test_arithmetic_on_a_python_float_input_stays_weak():
    f = lambda t, s: t * (s + 1.0)           # noqa: E731
    t = np.float32([1.0, 3.0])
    assert fpx.interval(f)(t, 0.1).value.dtype == f(t, 0.1).dtype == np.float32


def test_python_power_of_a_python_float_is_the_programs_value():
    assert float(fpx.interval(lambda s: 0.5 ** s)(0.3).value) == 0.5 ** 0.3


@pytest.mark.parametrize("k", [0.5, -1, 2])
def test_powers_of_a_python_float_input_stay_weak(k):
    # ndarray ** 0.5 / ** -1 have fast paths (sqrt, reciprocal); a Python float does not
    a = np.array([1.1, 2.2], np.float32)
    f = lambda a, x: a * x ** k              # noqa: E731
    iv = fpx.interval(f)(a, 2.0)
    assert iv.value.dtype == np.float32 and iv.contains(f(a, 2.0)).all()


def test_python_errors_of_python_float_arithmetic_are_the_programs():
    with pytest.raises(TypeError, match="complex"):
        fpx.interval(lambda x: x ** 0.5)(-2.0)          # Python: a complex number
    with pytest.raises(ZeroDivisionError):
        fpx.interval(lambda x: x ** -1)(0.0)


@pytest.mark.parametrize("f, n, exact", [
    (np.exp, 1, lambda: gmpy2.exp(1)),
    (lambda n: n * 0.1, 3, lambda: 3 * gmpy2.mpfr(0.1)),
])
def test_a_python_int_input_is_a_fixed_argument_and_says_so(f, n, exact):
    # a Python int is a fixed argument (a count, an axis: NumPy needs it as an int); a float
    # output computed from it alone is not seen by fpx, and an event says so -- classify is
    # then inconclusive, never a confident verdict on an unseen computation
    interp, iv = run_interval(f, (n,), {})
    assert [e.kind for e in interp.events] == ["untraced-output"]
    assert fpx.classify(f, lambda n: np.float64(exact()), n).kind == "inconclusive"


@pytest.mark.parametrize("name, f", [
    ("repeat", lambda x, n: np.repeat(x, n, axis=0)), ("tile", lambda x, n: np.tile(x, n)),
    ("split", lambda x, n: np.split(x, n, axis=1)[0]), ("arange", lambda x, n: np.arange(n) * x[0, :n]),
])
def test_a_python_int_argument_works_as_a_count(name, f):
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    iv = fpx.interval(f)(x, 2)
    assert np.array_equal(iv.value, f(x, 2)) and iv.contains(f(x, 2)).all()


def test_integer_inputs_float64_does_not_hold_are_bounded():
    a = np.array([2 ** 53 + 1, 3], np.int64)
    iv = fpx.interval(lambda a: a - np.int64(2 ** 53))(a)
    assert iv.contains(iv.value).all()


def test_matmul_of_a_possibly_overflowing_matrix_and_a_vector():
    f = lambda a, b: (a * 1e5) @ b           # noqa: E731  (float16: 1e5 overflows)
    a, b = np.ones((2, 2), np.float16), np.ones(2, np.float16)
    with np.errstate(all="ignore"):
        iv = fpx.interval(f)(a, b)
    assert iv.shape == (2,) and iv.contains(np.full(2, 2e5)).all()


def test_dot_of_float16_and_bfloat16_is_a_named_error():
    # NumPy computes this dot on Python objects (a Python float / an object array): fpx
    # names the dtypes instead of bounding object arithmetic
    import ml_dtypes
    a, b = np.ones(2, np.float16), np.ones(2, ml_dtypes.bfloat16)
    with pytest.raises(TypeError, match="float16 and bfloat16: no common dtype"):
        fpx.interval(np.dot)(a, b)


def test_a_point_escaping_into_python_math_is_an_event():
    f = lambda t: math.exp(-abs(t[0]))       # noqa: E731
    interp, iv = run_interval(f, (np.float32([1.401298464324817e-45]),), {})
    events = interp.events
    with gmpy2.context(gmpy2.get_context(), precision=200):
        exact = gmpy2.exp(-gmpy2.mpfr(1.401298464324817e-45))
        assert any(e.kind == "escaped-value" for e in events) or \
            gmpy2.mpfr(float(iv.lo)) <= exact <= gmpy2.mpfr(float(iv.hi))
