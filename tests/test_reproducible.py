"""fpx.reproducible: bitwise identity with the spec's reference definitions and across
schedules, batches and layouts (docs/reproducible.md)."""
from fractions import Fraction

import ml_dtypes
import numba
import numpy as np
import pytest

import fpx
import fpx.nn as fnn
from fpx.kernels import ordered

ORDERS = ("sequential", "pairwise", "exact")


def bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(bits(a), bits(b))


# -- the spec's definitions, written independently (NumPy, vectorized over output elements) --
def ref_sequential(terms):
    """terms: (K, ...) in the accumulation dtype; s = t0; s = s + t1; ..."""
    s = terms[0].copy()
    for t in terms[1:]:
        s = s + t
    return s


def ref_pairwise(terms):
    """P(t) = t0 for n = 1, else P(t[:h]) + P(t[h:]), h the largest power of two below n."""
    n = len(terms)
    if n == 1:
        return terms[0]
    h = 1 << ((n - 1).bit_length() - 1)
    return ref_pairwise(terms[:h]) + ref_pairwise(terms[h:])


def ref_exact(terms):
    """The exact sum of float64 terms, rounded to float32 (Fraction, then a correctly
    rounded conversion through gmpy2)."""
    gmpy2 = pytest.importorskip("gmpy2")
    ctx = gmpy2.context(precision=24, emin=-148, emax=128, subnormalize=True)
    out = np.empty(terms.shape[1:], np.float32)
    for idx in np.ndindex(out.shape):
        s = sum((Fraction(float(t)) for t in terms[(slice(None),) + idx]), Fraction(0))
        with gmpy2.context(ctx):
            out[idx] = float(gmpy2.mpfr(gmpy2.mpq(s.numerator, s.denominator)))
    return out


def ref_matmul(a, b, order):
    if order == "exact":
        return ref_exact(np.einsum("mk,kn->kmn", a.astype(np.float64), b.astype(np.float64)))
    terms = a.T[:, :, None] * b[:, None, :]        # (K, M, N): one rounding per product
    return (ref_sequential if order == "sequential" else ref_pairwise)(list(terms))


def data(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("K", [1, 2, 7, 37, 64])
def test_matmul_is_the_spec_definition_bit_for_bit(order, K):
    a, b = data((5, K), K), data((K, 6), K + 1)
    got = fpx.reproducible(np.matmul, order=order)(a, b)
    assert same(got, ref_matmul(a, b, order))


@pytest.mark.parametrize("order", ORDERS)
def test_sums_and_cumsum_are_the_spec_definition(order):
    x = data((6, 45, 3), 3)
    got = fpx.reproducible(lambda x: (x.sum(axis=1), np.cumsum(x, axis=1)), order=order)(x)
    terms = list(np.moveaxis(x, 1, 0))
    if order == "exact":
        want = ref_exact(np.moveaxis(x, 1, 0).astype(np.float64))
        wcum = np.stack([ref_exact(np.moveaxis(x[:, : k + 1], 1, 0).astype(np.float64))
                         for k in range(45)], axis=1)
    else:
        want = (ref_sequential if order == "sequential" else ref_pairwise)(terms)
        wcum = np.stack(list(np.cumsum(x, axis=1).transpose(1, 0, 2)), axis=1)
        acc = terms[0].copy()                            # running sums: always sequential
        wcum[:, 0] = acc
        for k in range(1, 45):
            acc = acc + terms[k]
            wcum[:, k] = acc
    assert same(got[0], want)
    assert same(got[1], wcum)


def test_sum_over_several_axes_takes_the_terms_in_c_order():
    x = data((3, 4, 5), 4)
    got = fpx.reproducible(lambda x: x.sum(axis=(0, 2)))(x)
    assert same(got, ref_sequential(list(x.transpose(1, 0, 2).reshape(4, 15).T)))
    assert same(fpx.reproducible(np.sum)(x), ref_sequential(list(x.reshape(-1))))


def test_exact_is_invariant_to_the_order_of_the_terms_and_handles_ties():
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((4, 300)) * 2.0 ** rng.integers(-30, 30, (4, 300))).astype(np.float32)
    b = data((300, 5), 8)
    f = fpx.reproducible(np.matmul, order="exact")
    y = f(a, b)
    for seed in range(3):
        p = np.random.default_rng(seed).permutation(300)
        assert same(f(a[:, p], b[p]), y)
    assert same(y, ref_matmul(a, b, "exact"))
    # exact ties and cancellations: 1 + 2^-24 is a float32 midpoint (ties to even)
    t = np.array([[1.0, 2.0 ** -24, 2.0 ** -24, -1.0, 1.0, 2 ** -24]], np.float32)
    ones = np.ones((6, 1), np.float32)
    assert f(t[:, :2], ones[:2])[0, 0] == 1.0
    assert f(t[:, :3], ones[:3])[0, 0] == np.float32(1 + 2 ** -23)
    z = f(np.array([[1.0, -1.0]], np.float32), ones[:2])
    assert bits(z)[0, 0] == 0                            # +0, not -0
    nz = f(np.array([[-0.0, -0.0]], np.float32), ones[:2])
    assert bits(nz)[0, 0] == 0x80000000


@pytest.mark.parametrize("order", ORDERS)
def test_batch_layout_and_threads_do_not_change_the_bits(order):
    x, w = data((64, 96), 1), data((96, 40), 2)
    f = fpx.reproducible(lambda x, w: fnn.softmax(x @ w, axis=-1), order=order)
    full = f(x, w)
    assert same(f(x[17:18], w)[0], full[17])                     # batch 1 vs 64
    assert same(f(np.asfortranarray(x), np.asfortranarray(w)), full)   # F order
    xs = np.zeros((64, 192), np.float32)
    xs[:, ::2] = x
    assert same(f(xs[:, ::2], w), full)                          # strided
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        assert same(f(x, w), full)
    finally:
        numba.set_num_threads(threads)
    assert same(fpx.reproducible(lambda x, w: fnn.softmax(x @ w, axis=-1), order=order,
                                 check=True)(x, w), full)


def _mlp(x, w1, b1, w2, b2, g):
    h = np.tanh(x @ w1 + b1)
    h = fnn.layer_norm(h, (h.shape[-1],), g, None)
    return fnn.softmax(h @ w2 + b2, axis=-1).mean(axis=0)


def test_mlp_forward_is_reproducible_and_close_to_numpy():
    args = [data((32, 20), 1), data((20, 64), 2), data(64, 3), data((64, 10), 4), data(10, 5),
            data(64, 6)]
    plain = _mlp(*args)
    for order in ORDERS:
        y = fpx.reproducible(_mlp, order=order, check=True)(*args)
        assert y.dtype == np.float32 and np.allclose(y, plain, rtol=1e-5, atol=1e-7)
        assert same(y, fpx.reproducible(_mlp, order=order)(*[np.asfortranarray(a) for a in args]))


def test_narrow_formats_accumulate_in_float32():
    a, b = data((3, 50), 1, np.float16), data((50, 4), 2, np.float16)
    got = fpx.reproducible(np.matmul)(a, b)
    want = ref_matmul(a.astype(np.float32), b.astype(np.float32), "sequential").astype(np.float16)
    assert same(got, want)
    ab = data((3, 50), 1).astype(ml_dtypes.bfloat16)
    got = fpx.reproducible(lambda x: np.exp(x).sum(axis=1))(ab)
    assert got.dtype == ml_dtypes.bfloat16


def test_exact_matmul_undecided_elements_take_dot2_then_mpfr(monkeypatch):
    """Cancellation defeats the BLAS product's bound; Dot2 decides those elements (no MPFR
    call), and a float32 midpoint (a tie) still reaches MPFR: both give the exact rounding."""
    from fpx.transforms.reproducible import exact
    calls = []
    real = exact.exact_fallback
    monkeypatch.setattr(exact, "exact_fallback", lambda rows, F: calls.append(len(rows))
                        or real(rows, F))
    rng = np.random.default_rng(5)
    a = data((6, 40), 5)
    a[:, 0], a[:, 1] = 2.0 ** 40, -2.0 ** 40                 # cancel exactly
    b = data((40, 7), 6)
    b[0], b[1] = 1.0, 1.0
    a[:, 2:] *= 2.0 ** rng.integers(-8, 8, (6, 38)).astype(np.float32)
    f = fpx.reproducible(np.matmul, order="exact")
    assert same(f(a, b), ref_matmul(a, b, "exact")) and not calls
    t = np.array([[2.0 ** 30, 1.0, 2.0 ** -24, -2.0 ** 30]], np.float32)   # 1 + 2^-24: a tie
    assert f(t, np.ones((4, 1), np.float32))[0, 0] == 1.0 and calls == [1]


def _loop_matmul(a, b, order):
    """The spec's loop over k, one NumPy operation (elementwise over outputs) per step, in
    the arrays' dtype."""
    terms = list(a.T[:, :, None] * b[:, None, :])
    return ref_sequential(terms) if order == 0 else ref_pairwise(terms)


@pytest.mark.parametrize("dt", [np.float32, pytest.param(np.float64, marks=pytest.mark.slow)])
def test_ordered_kernel_is_a_plain_loop_for_any_tiling_layout_and_threads(dt):
    """Shapes across the tile edges (ordered.ROWS x ordered.COLS), the register blocks, the
    chunks of terms (ordered._KC) and the vector width; the same bits from the spec's loop,
    from sub-blocks at odd offsets (other tile boundaries), for
    A in F order, from the serial and threaded builds, and on one thread."""
    R, C, K = ordered.ROWS, ordered.COLS, ordered._KC + 37
    a, b = data((R + 3, K), 1, dt), data((K, C + 21), 2, dt)
    b[3, 5], a[2, 0] = -0.0, np.float32(2.0 ** -140)      # a signed zero, a subnormal
    for order in (0, 1) if dt == np.float32 else (0,):
        want = _loop_matmul(a, b, order)
        out = np.empty((1,) + want.shape, dt)
        ordered.matmul(a[None], b[None], order, out)
        assert same(out[0], want), order
        for par in (True, False) if dt == np.float32 else (True,):
            sub = np.empty((1, R - 2, 40), dt)
            ordered.matmul(np.asfortranarray(a[3:R + 1])[None], b[None, :, 7:47], order, sub,
                           parallel=par)
            assert same(sub[0], want[3:R + 1, 7:47]), (order, par)
        threads = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            one = np.empty_like(out)
            ordered.matmul(a[None], b[None], order, one)
        finally:
            numba.set_num_threads(threads)
        assert same(one, out)


def test_ordered_kernel_batch_rows_are_independent():
    x, w = data((64, 300), 3), data((300, 70), 4)
    full = fpx.reproducible(np.matmul)(x, w)
    for i in (0, 17, 63):
        assert same(fpx.reproducible(np.matmul)(x[i:i + 1], w)[0], full[i])
    assert same(full[:2], _loop_matmul(x[:2], w, 0))


def test_no_fma_contraction_in_the_ordered_kernels():
    a = np.ones((2, 3), np.float32)
    for dt in (np.float32, np.float64):
        for order in (0, 1) if dt == np.float32 else (0,):
            for par in (True, False) if dt == np.float32 else (True,):
                ordered.matmul(a.astype(dt)[None], a.T.astype(dt)[None], order,
                               np.empty((1, 2, 2), dt), parallel=par)
    for kernel in (ordered.reduce, ordered._reduce_serial):
        kernel(a[None], 0, False, np.empty((1, 1, 3), np.float32))
    kernels = list(ordered._MATMUL.values()) + [ordered.reduce, ordered._reduce_serial]
    for kernel in kernels:
        asms = list(kernel.inspect_asm().values())
        assert asms                                   # compiled: the check is not vacuous
        for asm in asms:
            assert "vmulp" in asm or "mulss" in asm or "mulsd" in asm or kernel in (
                ordered.reduce, ordered._reduce_serial)
            assert "vfmadd" not in asm and "vfmsub" not in asm and "vfnmadd" not in asm


def test_special_values_subnormals_and_signed_zeros():
    tiny = np.float32(2.0 ** -149)
    x = np.array([tiny, tiny, -0.0, np.inf, np.nan, -0.0], np.float32)
    for order in ORDERS:
        f = fpx.reproducible(lambda x: (x[:2].sum(), x[2:3] * 1, x[5:].sum(), x[:4].sum(),
                                        x.sum(), np.exp(x)), order=order)
        s2, nz, snz, sinf, snan, ex = f(x)
        assert s2 == np.float32(2.0 ** -148)                   # no flush to zero
        assert bits(snz) == 0x80000000 and bits(nz)[0] == 0x80000000
        assert sinf == np.inf and np.isnan(snan)
        assert same(ex[[2, 5]], np.array([1.0, 1.0], np.float32)) and ex[3] == np.inf


def test_errors_name_what_is_not_supported():
    x = data(4, 1)
    from fpx.core import Primitive
    cbrt = Primitive("test_reproducible_cbrt", lambda B: np.cbrt, kind="transcendental")
    with pytest.raises(fpx.UnsupportedOpError, match="test_reproducible_cbrt"):
        fpx.reproducible(cbrt.bind)(x)          # a user's primitive: no meaning is assumed
    with pytest.raises(TypeError, match="exact"):
        fpx.reproducible(np.sum, order="exact")(x.astype(np.float64))
    with pytest.raises(ValueError, match="order"):
        fpx.reproducible(np.sum, order="fast")
    # integer programs and float64 arithmetic are reproducible as they are
    assert fpx.reproducible(np.sum)(np.arange(5)) == 10
    assert fpx.reproducible(lambda v: (v @ v).sum())(x.astype(np.float64)).dtype == np.float64


def test_report_gives_the_fingerprint_and_keeps_outputs_ordinary():
    x = data((4, 6), 9)
    y, rep = fpx.reproducible(lambda x: np.exp(x).sum(axis=0), order="pairwise", check=True,
                              report=True)(x)
    assert type(y) is np.ndarray and y.dtype == np.float32
    assert same(y, fpx.reproducible(lambda x: np.exp(x).sum(axis=0), order="pairwise")(x))
    assert rep["order"] == "pairwise" and rep["checked"] is True
    fp = rep["fingerprint"]
    assert fp == fpx.reproducible.fingerprint()
    assert fp["semantics"] == 1 and fp["fpx"] == fpx.__version__
    assert fp["numpy"] == np.__version__ and fp["mpfr"].startswith("MPFR")
    assert fpx.reproducible(np.sum)(x) == fpx.reproducible(np.sum, report=True)(x)[0]


def test_pow_and_atan2_are_correctly_rounded_in_programs():
    from fpx import formats
    from fpx.kernels import crmath
    x = np.abs(data(50, 10)) * 3
    z = data(50, 11)
    got = fpx.reproducible(lambda x, z: (x ** z, np.arctan2(z, x), np.power(x, 3)))(x, z)
    F = formats.get("float32")
    for g, (name, a, b) in zip(got, [("pow", x, z), ("atan2", z, x),
                                     ("pow", x, np.full_like(x, 3))]):
        want = np.asarray(crmath.mpfr_eval(name, a.astype(float).tolist(), F,
                                           b.astype(float).tolist()), np.float32)
        assert same(g, want)
    assert fpx.reproducible(lambda v: v ** 3)(np.arange(4)).tolist() == [0, 1, 8, 27]
    # float64 too: MPFR's correctly rounded values
    F64 = formats.get("float64")
    x64 = x.astype(np.float64) * np.pi
    for name, fn, b in [("pow", lambda v: np.power(v, 2.5), 2.5), ("sin", np.sin, None)]:
        want = np.asarray(crmath.mpfr_eval(name, x64.tolist(), F64, None if b is None else
                                           [b] * x64.size), np.float64)
        assert same(fpx.reproducible(fn)(x64), want)


def test_cupy_inputs_give_the_cpu_bits():
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception:                                    # pragma: no cover
        pytest.skip("no GPU")
    x, w = data((64, 96), 1), data((96, 40), 2)
    for order in ORDERS:
        f = fpx.reproducible(lambda x, w: fnn.softmax(np.tanh(x @ w), axis=-1), order=order)
        g = f(cupy.asarray(x), cupy.asarray(w))
        assert type(g).__module__.startswith("cupy") and same(g.get(), f(x, w))
