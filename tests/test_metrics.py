"""fpx.metrics: significant bits (Sohier et al. 2021) against the significantdigits package,
where that package is right, and the right answer where it is not; edge cases; Dice.

Known divergences from significantdigits 0.6.0 (also in docs/metrics.md):

1. CNH uses the ddof=1 sample standard deviation, as the chi-square pivot
   (S-1) sigma_hat^2 / sigma^2 ~ chi2(S-1) requires; the package uses ddof=0 with the same
   (S-1)/chi2 factor, so it claims 0.5*log2(S/(S-1)) bits too many.
2. Reference shapes: the package treats a reference with as many dimensions as the samples as
   a paired random variable and mis-broadcasts it -- a (1, n) reference for (S, n) samples, or
   a (1,) reference for (S,) samples, gives an (S, n) / (S,) result of per-sample values (NaN
   for CNH); a reference of shape (n,) for (S, m, n) samples raises TypeError. fpx takes any
   reference that broadcasts to the output shape and gives the output shape.
3. reference=None: the package splits the samples into two halves and pairs them (needs even
   S); fpx compares against the per-element sample mean.
4. Cap: the package caps at nmant (52 for float64, 23 for float32) and, for CNH with zero
   spread, returns nmant - delta; fpx returns the precision p (53/24/11/8) when Z is zero.
5. Relative error with a zero reference and all-zero samples: package 0 bits (general) or NaN
   (CNH); fpx full precision. NaN samples: package general gives 0 bits; fpx NaN.
6. Relative Z is computed as (X - x)/x (X - x exact near x) rather than X/x - 1: the CNH bits
   differ from the package's by ~1e-10; general bits are exact thresholds (binary exponent, no
   log2 rounding).
"""
from __future__ import annotations

import math
import time
import warnings

import ml_dtypes
import numpy as np
import pytest

import fpx
from fpx import metrics as M

sd = pytest.importorskip("significantdigits")

S = 30
DDOF = 0.5 * math.log2(S / (S - 1))  # divergence 1: the package's ddof=0 optimism


def _pkg(x, ref, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(sd.significant_digits(x, ref, **kw), dtype=np.float64)


def _bits(x, ref=None, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", M.SampleSizeWarning)
        return M.significant_bits(x, ref, **kw)


def _data(shape, scale=1.0, rel=2.0**-20, seed=0):
    rng = np.random.default_rng(seed)
    base = scale * (1.0 + rng.random(shape))  # magnitudes in [1, 2) * scale
    x = base * (1.0 + rel * rng.standard_normal((S, *shape)))
    return x, base


# ----------------------------------------------------------------------------
# Agreement with significantdigits where it is right
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(), (7,), (4, 5)])
@pytest.mark.parametrize("error", ["relative", "absolute"])
@pytest.mark.parametrize("scale", [1.0, -1000.0, 3e-7])
def test_agrees_with_significantdigits_given_reference(shape, error, scale):
    x, ref = _data(shape, scale)
    g = _bits(x, ref, method="general", error=error)
    c = _bits(x, ref, method="cnh", error=error)
    assert g.shape == c.shape == shape and g.dtype == np.float64
    np.testing.assert_array_equal(g, _pkg(x, ref, method="general", error=error))
    np.testing.assert_allclose(c, _pkg(x, ref, method="cnh", error=error) - DDOF, atol=1e-8)
    assert 15 < g.min() and g.max() < 25


@pytest.mark.parametrize("shape", [(7,), (4, 5)])
@pytest.mark.parametrize("error", ["relative", "absolute"])
def test_mean_reference_equals_package_with_explicit_mean(shape, error):
    # reference=None means the per-element sample mean (divergence 3: the package would split
    # the samples in halves), so the oracle gets the mean explicitly
    x, _ = _data(shape, seed=1)
    mean = x.mean(axis=0)
    np.testing.assert_array_equal(_bits(x, method="general", error=error),
                                  _pkg(x, mean, method="general", error=error))
    np.testing.assert_allclose(_bits(x, method="cnh", error=error),
                               _pkg(x, mean, method="cnh", error=error) - DDOF, atol=1e-8)


def test_scalar_reference_and_probability_confidence_passed_through():
    x, _ = _data((6,), seed=2)
    for p, c in [(0.9, 0.8), (0.99, 0.95)]:
        kw = dict(method="cnh", probability=p, confidence=c)
        np.testing.assert_allclose(_bits(x, 1.5, **kw), _pkg(x, 1.5, **kw) - DDOF, atol=1e-8)
    np.testing.assert_array_equal(_bits(x, 1.5), _pkg(x, 1.5, method="general"))


def test_digits_and_base():
    x, ref = _data((5,), seed=3)
    b = _bits(x, ref, method="cnh")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", M.SampleSizeWarning)
        d = M.significant_digits(x, ref, method="cnh")
    np.testing.assert_allclose(d, b * math.log10(2))
    np.testing.assert_allclose(d, _pkg(x, ref, method="cnh", basis=10) - DDOF * math.log10(2),
                               atol=1e-8)
    np.testing.assert_allclose(_bits(x, ref, base=4), _bits(x, ref) / 2)


# ----------------------------------------------------------------------------
# Where the package is wrong (divergences 1, 2, 4, 5): the right answer
# ----------------------------------------------------------------------------

def test_reference_of_shape_1_n():
    # package: (1, n) reference on (S, n) samples -> an (S, n) result (per-sample values for
    # general, NaN for CNH). Right: the same as the (n,) reference.
    x, ref = _data((6,), seed=4)
    for method in ("general", "cnh"):
        ours = _bits(x, ref[None, :], method=method)
        assert ours.shape == (6,)
        np.testing.assert_array_equal(ours, _bits(x, ref, method=method))
    np.testing.assert_array_equal(_bits(x, ref[None, :]), _pkg(x, ref, method="general"))


def test_reference_of_shape_1_for_1d_samples():
    # package: (S,) samples with a (1,) reference -> an (S,) result. Right: a scalar.
    x, ref = _data((), seed=5)
    ours = _bits(x, np.array([ref]), method="cnh")
    assert ours.shape == ()
    np.testing.assert_allclose(ours, _pkg(x, ref, method="cnh") - DDOF, atol=1e-8)


def test_reference_broadcast_along_leading_axis():
    # package: (n,) reference on (S, m, n) samples raises TypeError ("No comparison found").
    # Right: broadcast it to (m, n).
    rng = np.random.default_rng(6)
    ref = 1.0 + rng.random(5)
    x = ref * (1.0 + 2.0**-18 * rng.standard_normal((S, 3, 5)))
    full = np.broadcast_to(ref, (3, 5)).copy()
    for method in ("general", "cnh"):
        ours = _bits(x, ref, method=method)
        assert ours.shape == (3, 5)
        np.testing.assert_array_equal(ours, _bits(x, full, method=method))
    np.testing.assert_array_equal(_bits(x, ref), _pkg(x, full, method="general"))


def test_cnh_uses_unbiased_std():
    # divergence 1, checked from first principles rather than against the package
    from scipy import stats
    x, ref = _data((4,), seed=7)
    Z = (x - ref) / ref
    delta = (0.5 * math.log2((S - 1) / stats.chi2.ppf(0.025, S - 1))
             + math.log2(stats.norm.ppf(0.975)))
    np.testing.assert_allclose(_bits(x, ref, method="cnh"), -np.log2(Z.std(0, ddof=1)) - delta,
                               atol=1e-12)


@pytest.mark.parametrize("dtype,p", [(np.float64, 53), (np.float32, 24), (np.float16, 11),
                                     (ml_dtypes.bfloat16, 8), (ml_dtypes.float8_e4m3fn, 4)])
def test_identical_samples_give_the_dtype_precision(dtype, p):
    # divergence 4: the package gives nmant (52) for general and nmant - delta for CNH
    x = np.full((S, 3), 0.1).astype(dtype)
    for method in ("general", "cnh"):
        for ref in (None, x[0]):
            for error in ("relative", "absolute"):
                np.testing.assert_array_equal(_bits(x, ref, method=method, error=error), p)


def test_zero_reference_relative():
    # divergence 5: all-zero samples against a zero reference agree perfectly -> precision;
    # nonzero samples against a zero reference have infinite relative error -> 0 bits
    x = np.zeros((S, 2))
    x[:, 1] = np.linspace(-1e-300, 1e-300, S)
    for method in ("general", "cnh"):
        np.testing.assert_array_equal(_bits(x, np.zeros(2), method=method), [53, 0])


def test_nan_gives_nan_for_that_element_only():
    # divergence 5: the package's general estimator gives 0 bits for a NaN element
    x, ref = _data((4,), seed=8)
    x[3, 1] = np.nan
    good = _bits(np.delete(x, 1, axis=1), np.delete(ref, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning, no exception
        warnings.simplefilter("ignore", M.SampleSizeWarning)
        for method in ("general", "cnh"):
            for r in (ref, None):
                b = M.significant_bits(x, r, method=method)
                assert np.isnan(b[1]) and not np.isnan(np.delete(b, 1)).any()
        assert np.isnan(M.significant_bits(x[:, :1], np.array([np.nan]))).all()
    np.testing.assert_array_equal(np.delete(_bits(x, ref), 1), good)


# ----------------------------------------------------------------------------
# Statistical sanity
# ----------------------------------------------------------------------------

def test_cnh_recovers_known_sigma():
    # Z ~ N(0, (2^-20)^2): CNH gives 20 - log2(Phi^-1(0.975)) - 1/2 log2((S-1)/chi2) bits
    from scipy import stats
    n = 2000
    rng = np.random.default_rng(9)
    x = 1.0 + 2.0**-20 * rng.standard_normal((n, 64))
    margin = (0.5 * math.log2((n - 1) / stats.chi2.ppf(0.025, n - 1))
              + math.log2(stats.norm.ppf(0.975)))
    assert 1.00 < margin < 1.03
    b = M.significant_bits(x, 1.0, method="cnh")
    assert abs(np.median(b) - (20 - margin)) < 0.03
    assert np.all(np.abs(b - (20 - margin)) < 0.15)


def test_cnh_and_general_bounds_hold_at_their_probability():
    # per element, the claimed s must satisfy P(|Z| <= 2^-s) >= p (true here: s <= s_p);
    # the CNH lower bound on sigma is one-sided at alpha/2 -> ~97.5% of elements
    from scipy import stats
    rng = np.random.default_rng(10)
    n_el = 2000
    x = 1.0 + 2.0**-20 * rng.standard_normal((S, n_el))
    s_true = 20 - math.log2(stats.norm.ppf(0.975))  # P(|Z| <= 2^-s_true) = 0.95
    assert np.mean(M.significant_bits(x, 1.0, method="cnh") <= s_true) > 0.95
    x59 = 1.0 + 2.0**-20 * rng.standard_normal((59, n_el))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # S = 59 is enough for 0.95/0.95: no warning
        g = M.significant_bits(x59, 1.0)
    assert np.all(g == np.floor(g)) and np.mean(g <= s_true) > 0.95


def test_general_is_exact_at_powers_of_two():
    # |Z| = 2^-10 exactly -> 10; one ulp above -> 9 (a -log2 would round that back to 10)
    above = np.nextafter(2.0**-10, 1.0)
    x = np.array([[2.0**-10, above], [-2.0**-10, 0.0]])
    np.testing.assert_array_equal(_bits(x, 0.0, error="absolute"), [10, 9])
    assert -math.log2(above) == 10.0  # the trap
    y = np.array([[1 + 2.0**-10], [1 - 2.0**-12]])
    np.testing.assert_array_equal(_bits(y, 1.0), [10])


def test_absolute_counts_from_the_reference_leading_bit():
    # Z = X - x scaled by 2^floor(log2|x|): 1000 +- 2^-5 -> |Z'| = 2^-5 / 2^9 = 2^-14
    x = np.array([[1000 + 2.0**-5], [1000 - 2.0**-5]])
    np.testing.assert_array_equal(_bits(x, 1000.0, error="absolute"), [14])
    np.testing.assert_array_equal(_bits(x, 1000.0, error="absolute"),
                                  _pkg(x, np.array([1000.0]), method="general", error="absolute"))


# ----------------------------------------------------------------------------
# Edge cases and bad input
# ----------------------------------------------------------------------------

def test_infinities():
    inf = np.inf
    x = np.array([[inf, inf, -inf, 1.0], [inf, 1.0, inf, 1.0], [inf, 1.0, 1.0, 1.0]])
    for method in ("general", "cnh"):
        np.testing.assert_array_equal(_bits(x, method=method), [53, 0, 0, 53])
        np.testing.assert_array_equal(_bits(x, [inf, 1.0, 1.0, inf], method=method),
                                      [53, 0, 0, 0])
        np.testing.assert_array_equal(_bits(x, method=method, error="absolute"), [53, 0, 0, 53])


def test_never_negative_and_no_overflow():
    x = np.array([[1.0, 1e308, 1e-300], [-5.0, 1.7e308, 3e-300]])
    for method in ("general", "cnh"):
        b = _bits(x, method=method)
        assert np.all(b >= 0) and np.all(np.isfinite(b))
    # the sample mean of huge values does not overflow: 1e308 and 1.5e308 agree to ~1 bit
    assert _bits(np.array([[1e308], [1.5e308]]))[0] == 2  # |Z| = 0.2 <= 2^-2


def test_spread_without_bias_cnh_offset_fallback():
    # all samples equal but the reference is elsewhere: no spread, an offset of 2^-20.
    # CNH falls back on the offset (as significantdigits does) instead of claiming 53 bits.
    x = np.full((S, 1), 1.0 + 2.0**-20)
    b = _bits(x, 1.0, method="cnh")
    assert 17 < b[0] < 20
    np.testing.assert_array_equal(_bits(x, 1.0), [20])


def test_sample_size_warning():
    x, ref = _data((3,), seed=11)
    assert M.min_samples_general(0.95, 0.95) == 59
    assert M.min_samples_general(0.9, 0.9) == 22
    with pytest.warns(M.SampleSizeWarning, match=r"S >= 59.*S=30"):
        M.significant_bits(x, ref)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        M.significant_bits(x, ref, method="cnh")
        M.significant_bits(x[:22], ref, probability=0.9, confidence=0.9)


def test_bad_input():
    x, ref = _data((3,), seed=12)
    with pytest.raises(ValueError, match="at least 2 samples"):
        M.significant_bits(x[:1])
    with pytest.raises(ValueError, match="leading sample axis"):
        M.significant_bits(np.float64(1.0))
    with pytest.raises(ValueError, match=r"\(4,\).*\(3,\)"):
        M.significant_bits(x, np.ones(4))
    with pytest.raises(ValueError, match=r"\(30, 3\).*\(3,\)"):
        M.significant_bits(x, x)  # a per-sample reference is not accepted
    with pytest.raises(TypeError, match="floating"):
        M.significant_bits(np.ones((S, 3), dtype=np.int64))
    with pytest.raises(TypeError, match="floating"):
        M.significant_bits(x.astype(np.complex128))
    with pytest.raises(TypeError):
        M.significant_bits(x, ref.astype(np.complex128))
    for kw in (dict(method="parker"), dict(error="ulp"), dict(probability=1.0),
               dict(confidence=0.0), dict(base=1)):
        with pytest.raises(ValueError):
            M.significant_bits(x, ref, **kw)


def test_array_likes_and_low_precision_inputs():
    x, ref = _data((3,), seed=13)
    np.testing.assert_array_equal(_bits(x.tolist(), ref.tolist()), _bits(x, ref))
    xb = x.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(_bits(xb, ref.astype(ml_dtypes.bfloat16)),
                                  _bits(xb.astype(np.float64), ref.astype(ml_dtypes.bfloat16)
                                        .astype(np.float64)).clip(max=8))


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    x, ref = _data((3,), seed=14)
    t = torch.tensor(x, dtype=torch.float32)
    np.testing.assert_array_equal(_bits(t, torch.tensor(ref)), _bits(x.astype(np.float32), ref))
    np.testing.assert_array_equal(_bits(torch.ones((4, 2), dtype=torch.bfloat16)), 8)


@pytest.mark.gpu
def test_cupy_arrays():
    import cupy
    x, ref = _data((3,), seed=15)
    np.testing.assert_array_equal(_bits(cupy.asarray(x), cupy.asarray(ref)), _bits(x, ref))


# ----------------------------------------------------------------------------
# Summary
# ----------------------------------------------------------------------------

def test_summary_fields_and_repr():
    x, ref = _data((10,), seed=16)
    s = M.summarize(x)
    assert s.n_samples == S and s.shape == (10,) and s.bias is None
    assert s.bias_over_std is None and s.bias_over_std_max is None
    np.testing.assert_allclose(s.mean, x.mean(0), rtol=1e-15)
    np.testing.assert_allclose(s.std, x.std(0, ddof=1))
    np.testing.assert_array_equal(s.bits_general, _bits(x))
    np.testing.assert_array_equal(s.bits_cnh, _bits(x, method="cnh"))
    assert s.general_min == s.bits_general.min() and s.cnh_median == np.median(s.bits_cnh)
    r = repr(s)
    assert r.startswith("Summary(S=30, shape=(10,)") and "bits cnh" in r and "S >= 59" in r
    assert "reference = sample mean" in r and len(r.splitlines()) == 4


def test_summary_shows_the_bias_cnh_does_not_see():
    # a UD/CESTAC-like shift of 2^-14 (relative) with spread 2^-20: CNH against the IEEE
    # reference still reports ~19 bits; |bias|/std ~ 64 shows why that is too optimistic
    rng = np.random.default_rng(17)
    ref = 1.0 + rng.random(8)
    x = ref * (1.0 + 2.0**-14 + 2.0**-20 * rng.standard_normal((S, 8)))
    s = M.summarize(x, ref)
    assert s.cnh_min > 17.5 and s.general_median <= 14
    np.testing.assert_allclose(s.bias, x.mean(0) - ref)
    assert 30 < s.bias_over_std_max < 130
    assert "bias the CNH bits do not see" in repr(s)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the sample-size note goes in the repr, not a warning
        M.summarize(x, ref)


def test_summary_nan_and_zero_spread():
    x = np.ones((S, 3))
    x[:, 1] = 2.0
    x[0, 2] = np.nan
    s = M.summarize(x, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(s.bias_over_std[:2], [0, np.inf])
    assert s.n_nan == 1 and "NaN elements: 1" in repr(s)


# ----------------------------------------------------------------------------
# Dice
# ----------------------------------------------------------------------------

def _dice_brute(L, labels):
    out = {}
    for lab in labels:
        best = 1.0
        for i in range(len(L)):
            for j in range(i + 1, len(L)):
                a, b = (L[i] == lab), (L[j] == lab)
                den = a.sum() + b.sum()
                best = min(best, 1.0 if den == 0 else 2 * (a & b).sum() / den)
        out[int(lab)] = best
    return out


def test_dice_small_examples():
    L = np.array([[0, 1, 1, 2],
                  [0, 1, 0, 2],
                  [0, 1, 1, 1]])
    # label 0: {0} {0,2} {0} -> 2/3; label 1: {1,2} {1} {1,2,3} -> 2*1/(1+3) = 1/2;
    # label 2: {3} {3} {} -> 0 (one empty, one not)
    assert M.dice(L) == pytest.approx({0: 2 / 3, 1: 0.5, 2: 0.0})
    assert M.dice(L, labels=[1, 7]) == pytest.approx({1: 0.5, 7: 1.0})  # 7: both empty -> 1
    assert M.dice(np.zeros((2, 5), dtype=np.uint8)) == {0: 1.0}
    assert M.dice(np.array([[True, False], [False, True]])) == {0: 0.0, 1: 0.0}


def test_dice_matches_brute_force(monkeypatch):
    rng = np.random.default_rng(18)
    L = rng.integers(0, 4, size=(7, 6, 5))
    L[3] = L[0]  # identical pair
    want = _dice_brute(L.reshape(7, -1), range(4))
    assert M.dice(L) == pytest.approx(want, abs=1e-12)
    monkeypatch.setattr(M, "_DICE_CHUNK", 7 * 4)  # several indicator blocks of 4 columns
    assert M.dice(L) == pytest.approx(want, abs=1e-12)


def test_dice_large_is_vectorized():
    rng = np.random.default_rng(19)
    L = rng.integers(0, 3, size=(64, 256, 256)).astype(np.int32)
    t = time.perf_counter()
    d = M.dice(L)
    assert time.perf_counter() - t < 10
    assert set(d) == {0, 1, 2} and all(0.3 < v < 0.4 for v in d.values())


def test_dice_bad_input():
    with pytest.raises(ValueError, match="at least 2"):
        M.dice(np.zeros((1, 4), dtype=int))
    with pytest.raises(TypeError, match="integer"):
        M.dice(np.zeros((3, 4)))
    with pytest.raises(TypeError, match="integer"):
        M.dice(np.zeros((3, 4), dtype=int), labels=[0.5])


def test_exported():
    assert fpx.metrics is M and "metrics" in fpx.__all__
