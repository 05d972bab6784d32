"""``fpx.chunked``: a transformed program run slice by slice gives the unchunked result, and
programs that do not map rows to rows are refused."""
from __future__ import annotations

import numpy as np
import pytest

import fpx

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _same(a, b):
    for k in ("lo", "hi", "value"):
        x, y = np.asarray(getattr(a, k)), np.asarray(getattr(b, k))
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), k
    ua = np.zeros(a.shape, bool) if a.unstable is None else np.asarray(a.unstable)
    ub = np.zeros(b.shape, bool) if b.unstable is None else np.asarray(b.unstable)
    assert np.array_equal(ua, ub)


@pytest.mark.parametrize("size", [1, 7, 128, 1000, 5000])
def test_chunked_interval_of_an_elementwise_program_is_the_unchunked_one_bit_for_bit(size):
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    f = lambda t: np.tanh(2 * t + 1)             # noqa: E731
    _same(fpx.chunked(fpx.interval(f), size)(x), fpx.interval(f)(x))


def test_chunked_interval_inputs_and_unstable_elements_only_in_some_slices():
    """Interval inputs are cut too; an unstable mask that only some slices have is
    assembled with False elsewhere."""
    x = np.linspace(-1, 1, 64).astype(np.float32)
    x[50] = 0.0
    xin = fpx.Interval.around(x, rel=1e-6)
    f = lambda t: np.where(t > 0, t * 0.1, -t)    # noqa: E731  (undecided only at t = 0)
    a, b = fpx.chunked(fpx.interval(f), 16)(xin), fpx.interval(f)(xin)
    assert b.unstable is not None and b.unstable.sum() == 1
    _same(a, b)


def test_chunked_along_another_axis_with_a_weight_passed_whole():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 300)).astype(np.float32)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    f = lambda w, x: np.tanh(w @ x)               # noqa: E731  (columns independent)
    iv = fpx.chunked(fpx.interval(f), 64, in_axes=(None, 1), out_axes=1)(w, x)
    assert iv.shape == (8, 300)
    assert iv.contains(f(w.astype(np.float64), x.astype(np.float64))).all()
    assert iv.contains(iv.value).all()


def test_chunked_stochastic_samples_and_plain_functions():
    x = np.linspace(0.1, 2, 50).astype(np.float32)
    f = lambda t: np.exp(t) * 0.3                 # noqa: E731
    s = fpx.chunked(fpx.stochastic(f, "sr", samples=4), 16, out_axes=1)(x)
    assert s.shape == (4, 50) and s.dtype == np.float32
    assert np.allclose(s, f(x), rtol=1e-6)
    assert np.array_equal(fpx.chunked(f, 7)(x), f(x))


def test_chunked_refuses_what_it_cannot_assemble():
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError, match="rows"):     # a reduction over the batch axis
        fpx.chunked(fpx.interval(lambda t: np.sum(t, keepdims=True)), 4)(x)
    with pytest.raises(ValueError, match="same number of rows"):
        fpx.chunked(lambda a, b: a + b, 4)(x, np.ones(9, np.float32))
    with pytest.raises(ValueError, match="size"):
        fpx.chunked(np.tanh, 0)
    with pytest.raises(TypeError, match="output leaf 0 is a float"):
        fpx.chunked(lambda t: float(t[0]), 4)(x)
    with pytest.raises(ValueError, match="no array argument"):
        fpx.chunked(lambda t: t, 4, in_axes=None)(x)


def test_chunked_empty_batch():
    iv = fpx.chunked(fpx.interval(np.tanh), 4)(np.ones((0, 3), np.float32))
    assert iv.shape == (0, 3) and iv.value.dtype == np.float32


def test_a_chunked_interval_gathers_the_slices_events():
    x = np.random.default_rng(0).random((8, 4096)).astype(np.float16)
    iv = fpx.chunked(fpx.interval(lambda t: np.sum(t, axis=1)), 2)(x)
    assert [(e.kind, e.count) for e in iv.events] == [("long-sum", 4)]
