"""The interval interpreter's small-op paths (issue 28, per-op cost on small models) keep the
bounds they replace: operands laid out for the fused kernels (a bias row of another rank, a
constant's 0-d bound, strided slices copied to C order), formats and policy resolutions
cached per run, a ball's box read-only, and the torch graph walk's per-node argument layout.
Behaviour only: no timings."""
from __future__ import annotations

import numpy as np
import pytest

import fpx
import fpx.nn as fnn
import fpx.numpy as fnp
from fpx.transforms.interval import Interval, IntervalInterpreter
from fpx.transforms.interval.interpreter import _as_shape, dense


def _bounds(f, *args, **options):
    r = fpx.interval(f, **options)(*args)
    return np.asarray(r.lo), np.asarray(r.hi)


def test_bias_of_another_rank_gives_the_broadcast_bounds():
    """(1, 2, n) + (2, n) and (1, 2, n) + (1, 2, n): the same elements, the same bounds, and
    every element's bound its own (a reshape that misaligned them would swap rows)."""
    rng = np.random.default_rng(0)
    x = Interval.around(rng.standard_normal((1, 2, 64)).astype(np.float32), rel=1e-3)
    b = rng.standard_normal((2, 64)).astype(np.float32)
    lo1, hi1 = _bounds(lambda x: fnp.add(x, b), x)
    lo2, hi2 = _bounds(lambda x: fnp.add(x, b.reshape(1, 2, 64)), x)
    np.testing.assert_array_equal(lo1, lo2)
    np.testing.assert_array_equal(hi1, hi2)
    exact = x.value.astype(np.float64) + b
    assert np.all(lo1 <= exact) and np.all(exact <= hi1)
    assert np.all(lo1 >= np.asarray(x.lo) + b - 1e-3)
    assert np.all(hi1 <= np.asarray(x.hi) + b + 1e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_constant_scalar_operand(dtype):
    """1 + x and 1 / (1 + x) (sigmoid's pieces) with the constant's 0-d bound as a scalar: the
    bounds hold the float64 result and the program's value, for each dtype in one run (the
    formats cached per dtype)."""
    x = np.linspace(-3, 3, 257).astype(dtype)

    def f(x):
        y = fnp.divide(fnp.asarray(1, dtype=x.dtype), fnp.add(fnp.asarray(1, dtype=x.dtype),
                                                              fnp.exp(fnp.negative(x))))
        return y, fnp.add(fnp.astype(x, np.float32), np.float32(1))
    (s, t) = fpx.interval(f)(x)
    ref = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert np.all(np.asarray(s.lo) <= ref) and np.all(ref <= np.asarray(s.hi))
    assert s.contains(s.value).all() and t.contains(x.astype(np.float64) + 1).all()
    assert np.asarray(s.value).dtype == dtype and np.asarray(t.value).dtype == np.float32


def test_strided_slices_bound_as_their_copies():
    """Gates sliced from one GEMM's output (strided views of a ball, as in an LSTM cell): the
    bounds equal those of the same values laid out contiguously, and reading the slices twice
    gives the same bounds (no kernel wrote into a tracer's bound)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 32)).astype(np.float32)
    w = (rng.standard_normal((128, 32)) * 0.2).astype(np.float32)

    def cell(x):
        g = fnn.linear(x, w)
        i, f = g[:, :32], g[:, 32:64]
        a = fnp.multiply(fnn.sigmoid(i), fnp.tanh(f))
        b = fnp.multiply(fnn.sigmoid(i), fnp.tanh(f))
        return a, b, fnp.add(i, f)

    def cell_contiguous(x):
        g = fnn.linear(x, w)
        i = fnp.reshape(fnp.concatenate([g[:, :32]], axis=0), (2, 32))
        f = fnp.reshape(fnp.concatenate([g[:, 32:64]], axis=0), (2, 32))
        return fnp.add(i, f)

    a, b, s = fpx.interval(cell)(x)
    np.testing.assert_array_equal(np.asarray(a.lo), np.asarray(b.lo))
    np.testing.assert_array_equal(np.asarray(a.hi), np.asarray(b.hi))
    s2 = fpx.interval(cell_contiguous)(x)
    np.testing.assert_array_equal(np.asarray(s.value), np.asarray(s2.value))
    g64 = x.astype(np.float64) @ w.T.astype(np.float64)
    ref = g64[:, :32] + g64[:, 32:64]
    assert np.all(np.asarray(s.lo) <= ref) and np.all(ref <= np.asarray(s.hi))
    assert np.all(np.asarray(s2.lo) <= ref) and np.all(ref <= np.asarray(s2.hi))


def test_layout_helpers():
    """``dense``: small strided arrays become read-only C-order copies, the rest unchanged;
    ``_as_shape``: same-size operands take the result's shape, 0-d ones become scalars,
    broadcast operands stay."""
    a = np.arange(24.0).reshape(4, 6)[:, ::2]
    d = dense(a)
    assert d.flags.c_contiguous and not d.flags.writeable and np.array_equal(d, a)
    c = np.arange(6.0)
    assert dense(c) is c and dense(1.5) == 1.5
    assert _as_shape(np.arange(4.0), (1, 4)).shape == (1, 4)
    z = _as_shape(np.asarray(2.0), (3,))
    assert isinstance(z, np.float64) and z == 2.0
    row = np.arange(4.0)
    assert _as_shape(row, (3, 4)) is row


def test_resolve_and_formats_cached_per_run():
    """The interpreter resolves a dtype's format and an op's policy formats once per run; the
    cached answers are the policy's."""
    it = IntervalInterpreter(None, policy="numpy")
    f16 = np.dtype(np.float16)
    r1, r2 = it.resolve("matmul", f16), it.resolve("matmul", f16)
    assert r1 is r2 and r1 == it.policy.resolve("matmul", f16)
    assert it.fmt(np.dtype(np.float32)).name == "float32" and it.fmt(np.dtype(np.int32)) is None
    assert it.fmt(np.dtype(np.float32)) is it.fmt(np.dtype(np.float32))
    assert it.fused_terms("add", it.fmt(np.dtype(np.float32))) is not None
    assert it.fused_terms("add", None) is None


def test_flat_common_case_lays_out_operands_as_the_general_path():
    """``kernels.interval._flat_dense`` (one pass for same-shape C-contiguous arrays and
    scalars) gives the general layout analysis's blocks, shape and outputs, and defers
    (None) on anything else: broadcast rows, transposed views, other scalar types."""
    import itertools
    from fpx.kernels import interval as K
    rng = np.random.default_rng(7)
    for shp in ((5,), (3, 4), (2, 3, 4), (1, 2, 128)):
        a, b = rng.random(shp), rng.random(shp)
        cands = [a, b, 1.5, np.asarray(2.0), np.float64(3.0), 2, rng.random(shp[-1:]),
                 a.astype(np.float32), np.swapaxes(a, 0, -1) if a.ndim > 1 else a[::-1]]
        for combo in itertools.product(cands, repeat=3):
            fast = K._flat_dense(combo, (np.float64,))
            if fast is None:
                continue
            saved, K._flat_dense = K._flat_dense, lambda a, d, outs=None: None
            try:
                slow = K._flat(combo, (np.float64,))
            finally:
                K._flat_dense = saved
            assert fast[2] == slow[2] and [o.shape for o in fast[1]] == [o.shape for o in slow[1]]
            for x0, x1 in zip(fast[0], slow[0]):
                assert np.shape(x0) == np.shape(x1) and np.array_equal(x0, x1)
    # outputs given: used where they fit (contiguous, writeable, the shape and dtype)
    fit, other = np.empty(shp), np.empty(shp, np.float32)
    got = K._flat_dense((a, b), (np.float64, np.float64), (fit, other))
    assert got[3][0] is fit and got[3][1] is not other and got[3][1].dtype == np.float64
    assert K._flat_dense((a, np.swapaxes(a, 0, -1)), (np.float64,)) is None
    assert K._flat_dense((a, rng.random(shp[-1:])), (np.float64,)) is None
