"""fpx.classify and fpx.testing.assert_close: round-off, bug or inconclusive.

The kernels come from ``examples/classify_kernels.py`` (imported by path): round-off cases
that ``allclose`` rejects (tf32, float16 inputs, split-K, a final downcast, float16 column
sums, layer-norm -> softmax) and bugs (a tile of B read with swapped strides, an off-by-one
causal mask, a cumsum along the wrong axis, a missing 1/sqrt(d) scale). For the bugs, every
reported element must lie where the bug is, and the first one must differ from the bug-free
kernel by more than round-off (the two kernels' interval bounds are disjoint there).
"""
from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

import numpy as np
import pytest

import fpx
import fpx.numpy as fnp
from fpx import core
from fpx.testing import assert_close

_EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "classify_kernels.py"


def _load_examples():
    name = "fpx_example_classify_kernels"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


ck = _load_examples()
KINDS = ("roundoff", "bug", "inconclusive")


def _run(name, **kw):
    target, reference, args, expected = ck.CASES[name]()
    return fpx.classify(target, reference, *args, **kw), expected


def _disjoint(f, g, args, idx):
    """Are the round-off bounds of ``f`` and ``g`` disjoint at output element ``idx``?"""
    a, b = fpx.interval(f)(*args), fpx.interval(g)(*args)
    alo, ahi = np.asarray(a.lo)[idx], np.asarray(a.hi)[idx]
    blo, bhi = np.asarray(b.lo)[idx], np.asarray(b.hi)[idx]
    return bool(ahi < blo or bhi < alo)


# =============================================================================================
# The example cases
# =============================================================================================
def test_example_lists_the_cases():
    assert len(ck.ROUNDOFF_CASES) == 6 and len(ck.BUG_CASES) == 4
    for name, make in ck.CASES.items():
        target, reference, args, expected = make()
        assert callable(target) and isinstance(args, tuple)
        assert expected == ("roundoff" if name in ck.ROUNDOFF_CASES else "bug")


def test_example_main_prints_the_table(capsys):
    assert ck.main() == 0
    out = capsys.readouterr().out
    assert "all verdicts as expected" in out
    for name in ck.CASES:
        assert name in out


@pytest.mark.parametrize("name", list(ck.CASES))
def test_example_case_verdict(name):
    v, expected = _run(name)
    assert v.kind == expected, v.report()
    assert v.rigorous and v.n_elements > 0
    if expected == "roundoff":
        assert v.n_outside == 0 and v.n_undecided == 0 and v.outside == []
        assert v.max_observed > 0                      # there is a mismatch to explain
        assert math.isfinite(v.tightness) and v.tightness >= 0.5
        # the target's own value lies inside its bound (an execution is a possible result)
        for iv in fpx.tree.flatten(v.target)[0]:
            assert np.all(iv.contains(iv.value))
        assert "ROUNDOFF" in v.report()
    else:
        assert v.n_outside > 0 and v.outside and v.margin_abs > 0 and v.margin_rel > 1
        out_i, idx, ref, lo, hi, val = v.outside[0]
        assert not lo <= ref <= hi and lo <= val <= hi
        assert "BUG" in v.report() and "first offending elements" in v.report()


@pytest.mark.parametrize("name", list(ck.CASES))
def test_allclose_fails_where_fpx_is_needed(name):
    """Every example fails np.testing.assert_allclose-style checks (atol=0) at the usual rtol;
    all but the final downcast (a relative error < 2^-24 outside the subnormal range) also
    fail np.allclose with its default atol."""
    rtol, ok_default_atol, ok_atol0 = ck.allclose_results(name)
    assert rtol == (1e-3 if name in ("fp16_matmul", "fp16_column_sum") else 1e-5)
    assert not ok_atol0
    assert ok_default_atol == (name == "downcast")


def test_tf32_cast_rounds_eagerly_and_traced():
    a = np.float32([1.0000001, 3.14159265])
    assert np.all(fnp.astype(a, fpx.formats.tf32) == np.float32([1.0, 3.140625]))
    v, _ = _run("tf32_matmul")
    target, reference, args, _ = ck.case_tf32_matmul()
    # the traced value equals the eager run: fpx bounds the program that actually ran
    assert np.array_equal(np.asarray(v.target.value), target(*args))


# =============================================================================================
# Bugs: the reported elements are where the bug is
# =============================================================================================
def _check_first_beyond_roundoff(v, buggy, fixed, args):
    idx = v.outside[0][1]
    assert _disjoint(buggy, fixed, args, idx), (idx, v.report())


def test_transposed_stride_points_at_the_swapped_tile():
    target, reference, args, _ = ck.case_transposed_stride()
    v = fpx.classify(target, reference, *args)
    assert v.kind == "bug"
    T, (kt, nt) = ck.STRIDE_TILE, ck.STRIDE_BUG_TILE
    cols = range(nt * T, (nt + 1) * T)
    for _, idx, *_ in v.outside:
        assert idx[1] in cols, idx
    assert v.n_outside == args[0].shape[0] * T        # every element of the column tile

    def fixed(a, b):
        return ck.tiled_matmul(a, b, T, None)
    _check_first_beyond_roundoff(v, target, fixed, args)
    assert fpx.classify(fixed, reference, *args).kind == "roundoff"


def test_off_by_one_causal_mask_points_at_the_affected_rows():
    target, reference, args, _ = ck.case_causal_mask_off_by_one()
    v = fpx.classify(target, reference, *args)
    assert v.kind == "bug"
    H, S, D = args[2].shape
    for _, idx, *_ in v.outside:
        assert idx[1] < S - 1, idx                     # the last query has no future token
    assert v.n_outside >= 0.9 * H * (S - 1) * D

    def fixed(q, k, v_):
        return ck.causal_attention(q, k, v_, diag_offset=0)
    _check_first_beyond_roundoff(v, target, fixed, args)
    assert fpx.classify(fixed, reference, *args).kind == "roundoff"
    # the last row is exactly what the right kernel computes
    assert np.array_equal(target(*args)[:, -1], fixed(*args)[:, -1])


def test_cumsum_wrong_axis_spares_only_the_corner():
    target, reference, args, _ = ck.case_cumsum_wrong_axis()
    v = fpx.classify(target, reference, *args)
    assert v.kind == "bug"
    n = args[0].size
    assert v.n_outside >= 0.95 * (n - 1)
    assert all(idx != (0, 0) for _, idx, *_ in v.outside)   # x[0,0]: both axes agree
    _check_first_beyond_roundoff(v, target, ck.cumsum_rows, args)
    assert fpx.classify(ck.cumsum_rows, reference, *args).kind == "roundoff"


def test_missing_scale_points_at_differing_elements():
    target, reference, args, _ = ck.case_missing_scale()
    v = fpx.classify(target, reference, *args)
    assert v.kind == "bug"
    assert v.n_outside >= 0.9 * target(*args).size
    _check_first_beyond_roundoff(v, target, ck.attention, args)
    assert fpx.classify(ck.attention, reference, *args).kind == "roundoff"


def test_outside_is_sorted_and_margin_consistent():
    v, _ = _run("transposed_stride")
    dist = [max(lo - ref, ref - hi) for _, _, ref, lo, hi, _ in v.outside]
    assert dist == sorted(dist, reverse=True) and len(v.outside) <= 20
    assert math.isclose(v.margin_abs, dist[0], rel_tol=1e-12)


# =============================================================================================
# Reference given as a function
# =============================================================================================
def test_reference_function_gets_its_own_bound():
    v, _ = _run("splitk_matmul")
    assert isinstance(v.reference, fpx.Interval)
    assert np.all(v.reference.hi > v.reference.lo)      # a float32 reference is not exact
    v2, _ = _run("fp16_matmul")                          # an array reference stays an array
    assert isinstance(v2.reference, np.ndarray)


def test_float32_reference_function_in_another_order_is_roundoff():
    x = np.random.default_rng(11).standard_normal((16, 2048)).astype(np.float32)

    def sequential(x):                                   # a scan's order
        return np.cumsum(x, axis=-1)[:, -1]

    def pairwise(x):                                     # NumPy's pairwise summation
        return x.sum(axis=-1)

    assert not np.array_equal(sequential(x), pairwise(x))
    v = fpx.classify(sequential, pairwise, x)
    assert v.kind == "roundoff" and v.max_observed > 0


def test_low_precision_reference_needs_its_own_bound():
    """A float16 reference of a float32 GEMM lies outside the float32 bound as an array (it is
    not exact) but its own enclosure overlaps: as a function it is round-off."""
    r = np.random.default_rng(12)
    x = r.standard_normal((32, 64)).astype(np.float32)
    w = r.standard_normal((64, 32)).astype(np.float32)

    def ref16(x, w):
        return (x.astype(np.float16) @ w.astype(np.float16)).astype(np.float32)

    assert fpx.classify(ck.matmul, ref16(x, w), x, w).kind == "bug"
    assert fpx.classify(ck.matmul, ref16, x, w).kind == "roundoff"



def test_a_reference_array_narrower_than_the_target_comes_with_a_hint():
    """An array reference is taken as exact; stored in a narrower format than the target's
    output, its own rounding may be what puts it outside: the report says so (and not when it
    is as wide, or a function with bounds of its own)."""
    r = np.random.default_rng(13)
    x = r.standard_normal((16, 32)).astype(np.float32)
    w = r.standard_normal((32, 8)).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64)
    v = fpx.classify(ck.matmul, exact.astype(np.float16), x, w)
    assert v.kind == "bug" and len(v.hints) == 1
    assert "float16, narrower than the target's float32" in v.report()
    for ref in (exact, exact.astype(np.float32), lambda x, w: fnp.matmul(x, w)):
        assert fpx.classify(ck.matmul, ref, x, w).hints == []


@pytest.mark.parametrize("confidence", [0.0, 1.0, 1.5, -0.1, float("nan"), "high"])
def test_probabilistic_confidence_must_be_a_probability(confidence):
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="confidence"):
        fpx.classify(lambda a: a * 3, x * 3, x, bound="probabilistic", confidence=confidence)

# =============================================================================================
# The probabilistic bound
# =============================================================================================
@pytest.mark.parametrize("name", list(ck.ROUNDOFF_CASES))
def test_probabilistic_bound_is_tighter_and_says_so(name):
    rig, _ = _run(name)
    prob, _ = _run(name, bound="probabilistic")
    assert prob.kind == "roundoff" and not prob.rigorous
    assert "NOT rigorous" in prob.report() and "NOT rigorous" not in rig.report()
    assert prob.tightness <= rig.tightness
    if name != "downcast":                               # no accumulation there: same bound
        assert prob.tightness < rig.tightness


# =============================================================================================
# Inconclusive
# =============================================================================================
_F32 = np.float32


def _zero_divisor_args():
    # 0.1f * 10f rounds to exactly 1.0f, so y*z - w is 0 in float32 (1.5e-8 exactly): the
    # divisor's interval contains 0
    return np.float32([1.0, -2.0, 3.0]), _F32(0.1), _F32(10.0), _F32(1.0)


def test_reference_outside_an_infinite_bound_is_inconclusive():
    def target(x, y, z, w):
        return np.exp(x / (y * z - w))             # bound [~0, +inf]
    args = _zero_divisor_args()
    with np.errstate(divide="ignore"):
        v = fpx.classify(target, np.full(3, -1.0), *args)
    assert v.kind == "inconclusive" and v.n_outside == 0 and v.n_undecided == 3
    assert any(e.kind == "division-by-zero-interval" for e in v.events)
    assert "cannot be decided" in v.report()


def test_unbounded_bound_explains_nothing():
    """[-inf, +inf] contains every reference: that is no evidence of round-off."""
    def target(x, y, z, w):
        return x / (y * z - w)
    args = _zero_divisor_args()
    with np.errstate(divide="ignore"):
        t = target(*args)
    ref = args[0].astype(np.float64) / (np.float64(args[1]) * np.float64(args[2]) - 1.0)
    assert np.all(np.isinf(t)) and np.all(np.isfinite(ref))
    with np.errstate(divide="ignore"):
        v = fpx.classify(target, ref, *args)
        same = fpx.classify(target, t, *args)       # identical values: nothing to explain
    assert v.kind == "inconclusive" and v.n_undecided == 3 and v.max_observed == np.inf
    assert same.kind == "roundoff"


def test_float16_sum_beyond_gamma_range():
    """4096 float16 additions: n·u >= 1. Round-to-nearest sums keep a finite rigorous bound,
    (n-1)·u·Σ|x| (Rump 2012: no restriction on n) -- sound, so the float64 sum is inside, but
    so loose (tens of times the sums' magnitude) that it could not have told: inconclusive,
    "bound too wide", unless the caller accepts such widths; with faithful (1-ulp) additions
    only γ_n applies, which is infinite there: inconclusive."""
    from fpx.policy import get_policy
    x = np.random.default_rng(13).standard_normal((4096, 8)).astype(np.float16)
    ref = x.astype(np.float64).sum(axis=0)
    v = fpx.classify(ck.column_sum, ref, x)
    assert v.kind == "inconclusive" and v.n_outside == 0 and v.n_undecided == 8
    assert v.width > 2 and "bound too wide" in v.report()
    assert fpx.classify(ck.column_sum, ref, x, too_wide=1e3).kind == "roundoff"
    iv = fpx.interval(ck.column_sum)(x)
    half = (iv.hi - iv.lo) / 2
    assert np.all(np.isfinite(half))
    assert np.all(half >= 4095 * 2.0 ** -11 * np.abs(x.astype(np.float64)).sum(axis=0))
    faithful = get_policy("numpy").with_(reduce_sum=1.0)
    v = fpx.classify(ck.column_sum, ref, x, policy=faithful)
    assert v.kind == "inconclusive" and v.n_undecided == 8


def _branchy(x):
    s = x.sum()
    if s > 0:                                           # a Python `if` on a traced value
        return x * 2
    return x * 3


def test_unstable_python_if_is_inconclusive():
    x = np.float32([0.1, 0.2, -0.3])                    # sum: 0 in float32, -7.5e-9 exactly
    v = fpx.classify(_branchy, lambda x: _branchy(x.astype(np.float64)), x)
    assert v.kind == "inconclusive"
    assert any(e.kind == "unstable-control-flow" for e in v.events)
    assert any("control flow" in r for r in v.reasons)
    # even a reference far outside the bound is no proof of a bug: the other path was possible
    assert fpx.classify(_branchy, np.float64([5.0, 5.0, 5.0]), x).kind == "inconclusive"
    # a stable `if` decides nothing unstable
    y = np.float32([1.0, 2.0, 3.0])
    assert fpx.classify(_branchy, y.astype(np.float64) * 2, y).kind == "roundoff"


def _argmax_of_sum(a, b):
    return np.argmax(a + b, axis=-1)


def test_argmax_decided_by_unstable_comparison_is_inconclusive():
    # a + b: 1 + 1.5·2^-23 (a tie in float32, rounds to 1 + 2^-22) vs 1 + 2^-23 (exact): the
    # sums' intervals overlap, so round-off could pick either index
    a = np.float32([[1.0, 1.0 + 2.0 ** -23], [1.0, 4.0]])
    b = np.float32([[1.5 * 2.0 ** -23, 0.0], [0.0, 0.0]])
    got = _argmax_of_sum(a, b)
    assert got.tolist() == [0, 1]
    same = fpx.classify(_argmax_of_sum, got, a, b)
    assert same.kind == "inconclusive"
    assert any("integer decided by an unstable comparison" in r for r in same.reasons)
    other = fpx.classify(_argmax_of_sum, np.int64([1, 1]), a, b)  # another rounding's choice
    # the argmax bound spans every candidate index, so the other index is inside it
    assert other.kind == "inconclusive" and other.n_outside == 0 and other.n_undecided == 0
    # a reference function whose own argmax is unstable (float32 ties where float64 decides)
    a2 = np.float32([[1.0 + 2.0 ** -23, 1.0]])
    b2 = np.float32([[0.0, 1.1 * 2.0 ** -23]])

    def exact(a, b):
        return _argmax_of_sum(a.astype(np.float64), b.astype(np.float64))
    assert exact(a2, b2).tolist() == [1] and _argmax_of_sum(a2, b2).tolist() == [0]
    v = fpx.classify(exact, _argmax_of_sum, a2, b2)
    assert v.kind == "inconclusive" and v.n_outside == 0
    assert any("reference output 0 is an integer" in r for r in v.reasons)
    # the stable row alone: a different index is a bug
    wrong = fpx.classify(_argmax_of_sum, np.int64([0]), a[1:], b[1:])
    assert wrong.kind == "bug" and wrong.outside[0][1] == (0,)
    assert fpx.classify(_argmax_of_sum, np.int64([1]), a[1:], b[1:]).kind == "roundoff"


# =============================================================================================
# Non-finite and empty inputs, shapes, unsupported ops
# =============================================================================================
_ONES = np.ones((3, 2), np.float32)
_FUNCS = {
    "affine": lambda a: a * 2 + 1,
    "sum": lambda a: a.sum(axis=-1),
    "exp_matmul": lambda a: np.exp(a) @ _ONES.astype(a.dtype),
    "softmax": lambda a: fpx.nn.softmax(a, axis=-1),
}
_INPUTS = {
    "nan": np.float32([[np.nan, 1.0, 2.0], [0.5, 1.5, -1.0]]),
    "inf": np.float32([[np.inf, 1.0, 2.0], [-np.inf, 1.5, -1.0]]),
    "empty": np.zeros((0, 3), np.float32),
}


@pytest.mark.parametrize("fname", list(_FUNCS))
@pytest.mark.parametrize("iname", list(_INPUTS))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nonfinite_and_empty_inputs_give_a_verdict(fname, iname):
    f, x = _FUNCS[fname], _INPUTS[iname]
    ref = f(x.astype(np.float64))
    v = fpx.classify(f, ref, x)
    assert v.kind in KINDS
    v.report()
    if iname == "empty":
        assert v.kind == "roundoff" and v.n_elements == 0
    else:
        assert v.kind != "bug"                         # non-finite bounds never convict
    vf = fpx.classify(f, f, x)                          # reference as a function
    assert vf.kind in KINDS


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_identical_infinities_need_no_bound():
    a, b = np.float32([[np.inf, 1.0]]), np.float32([[1.0], [1.0]])
    v = fpx.classify(ck.matmul, np.float64([[np.inf]]), a, b)
    assert v.kind == "roundoff" and v.max_observed == 0
    assert fpx.classify(ck.matmul, np.float64([[-np.inf]]), a, b).kind == "inconclusive"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_matches_nan_but_not_a_number():
    x = np.float32([np.nan, 1.0, 2.0])
    f = _FUNCS["affine"]
    assert fpx.classify(f, f(x.astype(np.float64)), x).kind == "roundoff"
    v = fpx.classify(f, np.float64([3.0, 3.0, 5.0]), x)
    assert v.kind == "inconclusive" and v.n_undecided == 1
    # finite input, NaN reference: a finite bound misses it
    y = np.float32([0.0, 1.0, 2.0])
    v = fpx.classify(f, np.float64([np.nan, 3.0, 5.0]), y)
    assert v.kind == "bug" and v.outside[0][1] == (0,)


def test_mismatched_shapes_raise_valueerror():
    x = np.ones((4, 3), np.float32)
    with pytest.raises(ValueError, match="shapes differ"):
        fpx.classify(lambda a: a.sum(axis=0), np.ones(4), x)
    with pytest.raises(ValueError, match="outputs"):
        fpx.classify(lambda a: (a, a), np.ones((4, 3)), x)
    with pytest.raises(ValueError, match="shapes differ"):
        fpx.classify(lambda a: a.sum(axis=0), lambda a: a.sum(axis=1), x)


def _toy_primitive():
    name = "_test_classify_toy_square"
    prim = core.PRIMITIVES.get(name)
    if prim is None:
        prim = core.Primitive(name, lambda B: (lambda x: x * x), kind="elementwise")
    return prim


def test_unsupported_op_raises():
    toy = _toy_primitive()
    x = np.float32([1.0, 2.0])

    def f(x):
        return toy.bind(x) + 1

    assert np.array_equal(f(x), np.float32([2.0, 5.0]))   # eager: runs
    with pytest.raises(fpx.UnsupportedOpError, match="_test_classify_toy_square"):
        fpx.classify(f, np.float64([2.0, 5.0]), x)
    with pytest.raises(fpx.UnsupportedOpError, match="IntervalInterpreter"):
        fpx.classify(ck.matmul, lambda a, b: toy.bind(a @ b), np.ones((2, 2), np.float32),
                     np.ones((2, 2), np.float32))           # in the reference function too
    with pytest.raises(fpx.UnsupportedOpError):
        assert_close(f(x), np.float64([2.0, 5.0]), fn=f, args=(x,))


def test_verdict_is_not_a_bool():
    v, _ = _run("downcast")
    with pytest.raises(TypeError):
        bool(v)


# =============================================================================================
# fpx.testing.assert_close
# =============================================================================================
@pytest.mark.parametrize("name", list(ck.ROUNDOFF_CASES))
def test_assert_close_passes_on_roundoff(name):
    target, reference, args, _ = ck.CASES[name]()
    actual = target(*args)
    v = assert_close(actual, reference, fn=target, args=args)
    assert v.kind == "roundoff"
    # an execution in another summation order of the same GEMM is a possible result too
    if name == "splitk_matmul":
        other = ck.splitk_matmul(*args, order=(3, 1, 0, 2))
        assert not np.array_equal(other, actual)
        assert_close(other, reference, fn=target, args=args)


@pytest.mark.parametrize("name", list(ck.BUG_CASES))
def test_assert_close_fails_on_bugs_with_the_report(name):
    target, reference, args, _ = ck.CASES[name]()
    with pytest.raises(AssertionError) as info:
        assert_close(target(*args), reference, fn=target, args=args)
    msg = str(info.value)
    assert "verdict: BUG" in msg and "first offending elements" in msg


def test_assert_close_rejects_an_impossible_actual():
    target, reference, args, _ = ck.case_tf32_matmul()
    actual = target(*args).copy()
    actual[3, 5] += 0.5
    with pytest.raises(AssertionError, match=r"not a possible result of fn.*1 element.*\[3, 5\]"):
        assert_close(actual, reference, fn=target, args=args)
    # a tf32 result passed off as the float32 GEMM is no possible float32 result either
    with pytest.raises(AssertionError, match="not a possible result"):
        assert_close(actual, target, fn=ck.matmul, args=args)
    with pytest.raises(AssertionError, match="shape"):
        assert_close(actual[:2], reference, fn=target, args=args)


def test_assert_close_allow_inconclusive():
    x = np.float32([0.1, 0.2, -0.3])
    ref = _branchy(x.astype(np.float64))
    with pytest.raises(AssertionError, match="INCONCLUSIVE"):
        assert_close(_branchy(x), ref, fn=_branchy, args=(x,))
    v = assert_close(_branchy(x), ref, fn=_branchy, args=(x,), allow_inconclusive=True)
    assert v.kind == "inconclusive"
    # allow_inconclusive never lets a bug through
    target, reference, args, _ = ck.case_cumsum_wrong_axis()
    with pytest.raises(AssertionError, match="BUG"):
        assert_close(target(*args), reference, fn=target, args=args, allow_inconclusive=True)


def _two_outputs(a, b):
    y = ck.splitk_matmul(a, b)
    return y, y.sum(axis=0)


def test_assert_close_on_tuple_outputs():
    target, reference, args, _ = ck.case_splitk_matmul()
    a, b = args
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    expected = (ref, ref.sum(axis=0))
    actual = _two_outputs(a, b)
    v = assert_close(actual, expected, fn=_two_outputs, args=args)
    assert v.kind == "roundoff" and isinstance(v.target, tuple) and len(v.target) == 2
    # a reference function with the same structure
    assert_close(actual, lambda a, b: (a @ b, (a @ b).sum(axis=0)), fn=_two_outputs, args=args)
    # a bug in the second output only: reported on out[1]
    bad = (ref, ref.sum(axis=0) + np.where(np.arange(ref.shape[1]) == 7, 1.0, 0.0))
    with pytest.raises(AssertionError, match=r"out\[1\]\[7\]"):
        assert_close(actual, bad, fn=_two_outputs, args=args)
    with pytest.raises(AssertionError, match="outputs"):
        assert_close(actual[:1], expected, fn=_two_outputs, args=args)


def test_assert_close_on_dict_outputs():
    x = np.random.default_rng(14).standard_normal((8, 300)).astype(np.float32)

    def stats(x):
        return {"mean": x.mean(axis=-1), "max": x.max(axis=-1)}
    ref = stats(x.astype(np.float64))
    assert assert_close(stats(x), ref, fn=stats, args=(x,)).kind == "roundoff"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_assert_close_accepts_fns_own_value_and_unstable_integers():
    # [inf, 1] @ [1, 1] = inf: the midpoint-radius bound is [nan, inf], yet inf is fn's result
    a, b = np.float32([[np.inf, 1.0]]), np.float32([[1.0], [1.0]])
    assert_close(ck.matmul(a, b), np.float64([[np.inf]]), fn=ck.matmul, args=(a, b))
    # argmax on a float32 tie: another execution may return the other index
    a2 = np.float32([[1.0 + 2.0 ** -23, 1.0]])
    b2 = np.float32([[0.0, 1.1 * 2.0 ** -23]])
    other = np.int64([1])                               # what the float64 argmax says
    assert _argmax_of_sum(a2, b2).tolist() == [0]
    v = assert_close(other, other, fn=_argmax_of_sum, args=(a2, b2), allow_inconclusive=True)
    assert v.kind == "inconclusive"
    with pytest.raises(AssertionError, match="INCONCLUSIVE"):
        assert_close(other, other, fn=_argmax_of_sum, args=(a2, b2))
    # a stable argmax: another index is no possible result
    a3, b3 = np.float32([[1.0, 4.0]]), np.float32([[0.0, 0.0]])
    with pytest.raises(AssertionError, match="not a possible result"):
        assert_close(np.int64([0]), np.int64([1]), fn=_argmax_of_sum, args=(a3, b3))


def test_argmax_reference_outside_every_candidate_is_bug():
    """The argmax bound spans exactly the indices round-off could pick: any other is a bug."""
    x = fpx.Interval.around(np.float32([[0.0, 5.0, 5.0 + 2.0 ** -21, 1.0]]), rel=1e-6)
    f = lambda x: np.argmax(x, axis=-1)  # noqa: E731
    iv = fpx.interval(f)(x)
    assert iv.lo.tolist() == [1.0] and iv.hi.tolist() == [2.0] and iv.unstable.all()
    assert fpx.classify(f, np.int64([0]), x).kind == "bug"
    assert fpx.classify(f, np.int64([1]), x).kind == "inconclusive"
