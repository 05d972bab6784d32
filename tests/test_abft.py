"""fpx.abft: checksummed GEMMs -- false positives, detection, location and correction,
thresholds (V-ABFT, A-ABFT, rigorous), mixed precision online/offline, programs, edge inputs."""
import math

import ml_dtypes
import numpy as np
import pytest

import fpx
import fpx.nn as nn
from fpx.faults import BitFlip
from fpx.transforms.abft import DEFAULT_EMAX, AAbft, abft, aabft_sigma, calibrate
from fpx.transforms.abft.thresholds import PAPER_INPUTS, paper_inputs
from fpx.transforms.inject import inject

BF16 = ml_dtypes.bfloat16


def mm(a, b):
    return a @ b


dist = paper_inputs      # the V-ABFT paper's input distributions


CONFIGS = [("float64", "online"), ("float32", "online"), ("bfloat16", "online"),
           ("bfloat16", "offline"), ("float16", "offline"), ("float8_e4m3fn", "offline")]


# ---------------------------------------------------------------------------------------------
# clean runs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,verify", CONFIGS)
def test_zero_false_positives_over_ten_thousand_clean_trials(dtype, verify):
    """10^4 clean GEMMs (16, 64, 16) per format, 2500 from each of the paper's distributions,
    batched into one call per distribution: no row over its V-ABFT threshold."""
    for k, d in enumerate(PAPER_INPUTS):
        rng = np.random.default_rng(100 + k)
        A = dist(d, rng, (2500, 16, 64)).astype(dtype)
        B = dist(d, rng, (2500, 64, 16)).astype(dtype)
        _, rep = abft(mm, report=True, verify=verify, correct=False)(A, B)
        g = rep.gemms[0]
        assert g.detected == 0 and g.unverified == 0, (d, g)
        assert 0 < g.ratio < 1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_no_false_positive_on_long_positive_sums(dtype):
    """|N(1, 1)| inputs with K up to 4096: the calibration's worst case, where e_max grows
    like sqrt(K)."""
    rng = np.random.default_rng(9)
    for K in (1024, 4096):
        A = np.abs(rng.normal(1, 1, (12, 16, K))).astype(dtype)
        B = np.abs(rng.normal(1, 1, (12, K, 16))).astype(dtype)
        _, rep = abft(mm, report=True, correct=False)(A, B)
        assert rep.gemms[0].detected == 0 and rep.gemms[0].ratio < 1


def test_clean_float_gemm_is_the_plain_blas_result():
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float64):
        A, B = rng.standard_normal((50, 70)).astype(dt), rng.standard_normal((70, 30)).astype(dt)
        out, rep = abft(mm, report=True)(A, B)
        assert out.dtype == dt and np.array_equal(out, A @ B)
        g = rep.gemms[0]
        assert (g.op, g.a_shape, g.b_shape, g.out_shape, g.checks) == \
            ("matmul", (50, 70), (70, 30), (50, 30), ("row",))
        assert g.detected == g.corrected == 0 and g.residual > 0 and g.threshold > g.residual


# ---------------------------------------------------------------------------------------------
# detection, location, correction
# ---------------------------------------------------------------------------------------------
def _one_flip_per_trial(rng, values, bit, direction):
    """(t, i, j) in each trial t of an element whose ``bit`` is 0 ("set") / 1 ("clear")."""
    u = np.dtype(f"u{values.dtype.itemsize}")
    state = (values.view(u) >> bit) & 1
    sites = []
    for t in range(values.shape[0]):
        ok = np.argwhere(state[t] == (0 if direction == "set" else 1))
        if len(ok):
            i, j = ok[rng.integers(len(ok))]
            sites.append((t, int(i), int(j)))
    return sites


@pytest.mark.parametrize("bit", [11, 12, 13, 14])
def test_bf16_exponent_bits_11_to_14_always_detected(bit):
    """The paper's Table 8 setting, (M, K, N) = (128, 1024, 256), bf16 inputs, one flip per
    trial, 8 trials per distribution and direction. Online (the float32 accumulator, where
    bf16's bit b is float32's bit b + 16): every flip, setting or clearing the bit, is
    detected, located and corrected. Offline (the bf16 output): every flip that sets it (the
    element grows by 2^(2^(b-7))); a flip that clears it shrinks the element to ~0, which the
    check sees only where the element exceeds the threshold."""
    for k, d in enumerate(PAPER_INPUTS):
        rng = np.random.default_rng(10 * bit + k)
        A = dist(d, rng, (8, 128, 1024)).astype(BF16)
        B = dist(d, rng, (8, 1024, 256)).astype(BF16)
        acc = A.astype(np.float32) @ B.astype(np.float32)
        clean = acc.astype(BF16)
        runs = [("online", "accumulator", bit + 16, acc, "set"),
                ("online", "accumulator", bit + 16, acc, "clear"),
                ("offline", "output", bit, clean, "set")]
        for verify, where, b, values, direction in runs:
            sites = _one_flip_per_trial(rng, values, b, direction)
            if not sites:                  # N(1, 1): every output has bit 14 set
                continue
            faults = [BitFlip(b, where=where, index=s) for s in sites]
            out, rep = inject(abft(mm, report=True, verify=verify), faults)(A, B)
            g = rep.gemms[0]
            n = len(sites)
            assert g.detected == n and g.corrected + g.recomputed == n, (d, verify, g)
            if not g.recomputed:
                assert g.locations == sites, (d, verify, g)
            assert np.array_equal(out.astype(BF16).view(np.uint16), clean.view(np.uint16))


def test_set_direction_picks_elements_whose_bit_is_zero():
    rng = np.random.default_rng(5)
    A = rng.uniform(-1, 1, (8, 64, 128)).astype(BF16)
    B = rng.uniform(-1, 1, (8, 128, 32)).astype(BF16)
    for bit in (11, 12, 13, 14):
        faults = [BitFlip(bit, where="output", direction="set", seed=s) for s in range(8)]
        (out, rep), log = inject(abft(mm, report=True, verify="offline"), faults,
                                 report=True)(A, B)
        assert len(log) == 8 and all(abs(x.after) > abs(x.before) * 2 ** 15 or
                                     not math.isfinite(x.after) for x in log)
        assert rep.gemms[0].detected >= len({x.index[:2] for x in log})
        assert rep.gemms[0].uncorrected == 0


def test_single_flip_is_located_and_corrected():
    rng = np.random.default_rng(1)
    A, B = rng.uniform(-1, 1, (40, 96)).astype(np.float32), \
        rng.uniform(-1, 1, (96, 24)).astype(np.float32)
    clean = A @ B
    for (i, j), bit in [((3, 7), 30), ((39, 0), 27), ((0, 23), 25), ((17, 11), 31)]:
        (out, rep), log = inject(abft(mm, report=True),
                                 BitFlip(bit, where="output", index=(i, j)), report=True)(A, B)
        g = rep.gemms[0]
        assert log[0].index == (i, j)
        assert g.locations == [(i, j)] and g.detected == 1 and g.corrected == 1, g
        assert np.array_equal(np.delete(out.ravel(), i * 24 + j),
                              np.delete(clean.ravel(), i * 24 + j))
        assert out[i, j] == pytest.approx(clean[i, j], rel=1e-5, abs=1e-6)


def test_two_flips_in_a_row_recompute_the_row_and_a_weight_flip_corrects_a_column():
    rng = np.random.default_rng(2)
    A, B = rng.uniform(-1, 1, (32, 64)).astype(np.float32), \
        rng.uniform(-1, 1, (64, 16)).astype(np.float32)
    clean = A @ B
    two = [BitFlip(30, where="output", index=(5, 2)), BitFlip(29, where="output", index=(5, 9))]
    out, rep = inject(abft(mm, report=True), two)(A, B)
    g = rep.gemms[0]
    assert g.detected == 1 and g.recomputed == 1 and g.uncorrected == 0
    np.testing.assert_allclose(out, clean, rtol=1e-5, atol=1e-6)
    out, rep = inject(abft(mm, report=True), BitFlip(29, where="weight", index=(10, 4)))(A, B)
    g = rep.gemms[0]
    assert g.detected == 32 and g.corrected == 32 and {loc[1] for loc in g.locations} == {4}
    np.testing.assert_allclose(out, clean, rtol=1e-5, atol=1e-6)


def test_correct_false_detects_and_locates_without_changing_the_output():
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((16, 32)), rng.standard_normal((32, 8))
    out, rep = inject(abft(mm, report=True, correct=False),
                      BitFlip(60, where="output", index=(4, 6)))(A, B)
    g = rep.gemms[0]
    assert g.detected == 1 and g.corrected == 0 and g.locations == [(4, 6)]
    assert out[4, 6] != (A @ B)[4, 6]


def test_column_checks_protect_matrix_vector_products():
    rng = np.random.default_rng(4)
    A, x = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal(32).astype(
        np.float32)
    out, rep = inject(abft(mm, report=True), BitFlip(30, where="output", index=13))(A, x)
    g = rep.gemms[0]
    assert g.checks == ("column",) and g.detected == 1 and g.corrected == 1
    np.testing.assert_allclose(out, A @ x, rtol=1e-5, atol=1e-6)
    out, rep = abft(mm, report=True, checksums="both")(A, A.T)
    assert rep.gemms[0].checks == ("row", "column") and rep.gemms[0].detected == 0


# ---------------------------------------------------------------------------------------------
# thresholds
# ---------------------------------------------------------------------------------------------
def test_aabft_reproduces_the_papers_512_fp64_threshold():
    assert 3 * aabft_sigma(512, 53, 21) == pytest.approx(1.66e-11, rel=0.01)
    rng = np.random.default_rng(0)
    A, B = rng.uniform(-1, 1, (512, 512)), rng.uniform(-1, 1, (512, 512))
    _, rep = abft(mm, threshold=AAbft(y=21), report=True)(A, B)
    assert rep.gemms[0].threshold == pytest.approx(1.6565e-11, rel=1e-3)
    assert rep.gemms[0].detected == 0


def _tightness(threshold, n, trials, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    A = rng.uniform(-1, 1, (trials, n, n)).astype(dtype)
    B = rng.uniform(-1, 1, (trials, n, n)).astype(dtype)
    _, rep = abft(mm, threshold=threshold, report=True)(A, B)
    return rep.gemms[0].tightness


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vabft_tightness_is_in_the_papers_range_for_uniform_inputs(dtype):
    """Tables 4-5: V-ABFT 7-20x the actual verification difference for FP32 and FP64
    U(-1, 1); A-ABFT (computed y) hundreds of times."""
    v = _tightness("v-abft", 256, 8, dtype=dtype)
    a = _tightness("a-abft", 256, 8, dtype=dtype)
    assert 7 <= v <= 20, v
    assert a > 5 * v


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_default_e_max_covers_a_sequential_dot_product(dtype):
    """The defaults hold for the worst plausible summation order, a strictly sequential dot
    product, on positive and zero-mean inputs: what V-ABFT's threshold
    needed there, plus the protocol's 20%, stays below them -- so does NumPy's BLAS. With
    N > K, zero-mean data needs the b sqrt(K) term: an e_max fitted on |N(1, 1)| alone
    (~ sqrt(K/N)) fails here."""
    def seq(A, B):              # s = a_0 b_0; s = s + a_k b_k, each op rounded: no FMA
        s = A[..., :, :1] * B[..., :1, :]
        for k in range(1, A.shape[-1]):
            s = s + A[..., :, k:k + 1] * B[..., k:k + 1, :]
        return s
    for (M, K, N), trials in (((4, 64, 4), 200), ((16, 256, 512), 40)):
        for gemm in (seq, None):
            c = calibrate(dtype, sizes=((M, K, N),), trials=trials, gemm=gemm,
                          inputs=("|N(1,1)|", "U(0,1)", "U(-1,1)", "N(1e-6,1)"),
                          relative_to="v-abft")
            assert 0 < c.e_max <= DEFAULT_EMAX[dtype](K, N), (M, K, N, gemm, c)


def test_rigorous_threshold_is_the_interval_bound_of_both_paths():
    rng = np.random.default_rng(7)
    A, B = rng.uniform(-1, 1, (8, 64)).astype(np.float32), \
        rng.uniform(-1, 1, (64, 16)).astype(np.float32)
    i1 = fpx.interval(lambda a, b: (a @ b).sum(-1))(A, B)
    i2 = fpx.interval(lambda a, b: a @ b.sum(-1))(A, B)
    width = np.maximum(i1.hi - i2.lo, i2.hi - i1.lo).max()
    _, rep = abft(mm, threshold="rigorous", report=True)(A, B)
    g = rep.gemms[0]
    assert g.residual <= g.threshold
    assert width <= g.threshold <= 2 * width


def _adversarial(rng, T, M, K, N):
    """Wide exponent ranges (2^-40 .. 2^40 per element) and heavy cancellation (pairs of
    columns of A equal, the matching rows of B opposite up to 2^-20)."""
    e = rng.integers(-40, 40, (T, M, K))
    A = rng.choice([-1.0, 1.0], (T, M, K)) * rng.uniform(1, 2, (T, M, K)) * 2.0 ** e
    A[:, :, 1::2] = A[:, :, ::2]
    B = rng.uniform(-1, 1, (T, K, N)) * 2.0 ** rng.integers(-20, 20, (T, K, 1))
    B[:, 1::2, :] = -B[:, ::2, :] * (1 + 2.0 ** -20)
    return A, B


@pytest.mark.parametrize("dtype,verify", [("float32", "online"), ("float64", "online"),
                                          ("bfloat16", "online"), ("bfloat16", "offline")])
def test_rigorous_never_false_alarms_on_adversarial_inputs(dtype, verify):
    rng = np.random.default_rng(11)
    A, B = _adversarial(rng, 2000, 8, 64, 16)
    A, B = A.astype(dtype), B.astype(dtype)
    _, rep = abft(mm, threshold="rigorous", verify=verify, report=True, correct=False)(A, B)
    g = rep.gemms[0]
    assert g.detected == 0 and g.unverified == 0 and g.ratio <= 1


def test_user_threshold_callable_and_e_max_forms():
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((20, 30)), rng.standard_normal((30, 10))
    seen = {}

    def zero(a, b, info):
        seen.update(K=info.K, N=info.N, fmt=info.fmt.name)
        return 0.0
    _, rep = abft(mm, threshold=zero, report=True, correct=False)(A, B)
    assert seen == {"K": 30, "N": 10, "fmt": "float64"} and rep.gemms[0].detected > 0
    for e in (1e-15, "h100", "artifact", {"float64": 1e-15}, lambda K, N: 1e-15):
        _, rep = abft(mm, e_max=e, report=True)(A, B)
        assert rep.gemms[0].detected == 0
    with pytest.raises(ValueError, match="preset"):
        abft(mm, e_max="tpu")(A, B)
    with pytest.raises(ValueError, match="threshold"):
        abft(mm, threshold="tight")
    with pytest.raises(ValueError, match="verify"):
        abft(mm, verify="later")


def test_calibrate_follows_the_papers_protocol():
    c = calibrate("float32", sizes=(32, (16, 64, 8)), trials=50)
    assert set(c.per_size) == {(32, 32, 32), (16, 64, 8)}
    assert c.e_max == pytest.approx(1.2 * max(c.per_size.values()))
    assert 2 ** -24 / 4 < c.e_max
    for (M, K, N), v in c.per_size.items():       # the defaults are fitted from above
        assert 1.2 * v < DEFAULT_EMAX["float32"](K, N)
    with pytest.raises(ValueError, match="relative_to"):
        calibrate("float32", sizes=(8,), trials=2, relative_to="bound")
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((32, 32)).astype(np.float32), \
        rng.standard_normal((32, 32)).astype(np.float32)
    _, rep = abft(mm, e_max=c, report=True)(A, B)
    assert rep.gemms[0].detected == 0
    assert set(abft.presets) >= {"cpu", "paper-cpu", "h100", "ascend-910b", "artifact"}


# ---------------------------------------------------------------------------------------------
# mixed precision: online vs offline
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float8_e4m3fn"])
def test_online_detects_about_a_thousand_times_finer_than_offline(dtype):
    rng = np.random.default_rng(0)
    A = rng.uniform(-1, 1, (64, 256)).astype(dtype)
    B = rng.uniform(-1, 1, (256, 64)).astype(dtype)
    on, r_on = abft(mm, report=True)(A, B)
    off, r_off = abft(mm, report=True, verify="offline")(A, B)
    g_on, g_off = r_on.gemms[0], r_off.gemms[0]
    assert g_on.acc == "float32" and g_on.output == ("float16" if dtype.startswith("float8")
                                                    else dtype)
    assert g_off.threshold / g_on.threshold > 500
    assert np.array_equal(on, off)             # same model, same output when clean
    # a flip of float32 accumulator bit 12 (a ~2^-11 relative change): online sees it,
    # offline cannot (the bf16/fp16 output rounds it away or hides it under its threshold)
    (_, r_on), _ = inject(abft(mm, report=True), BitFlip(13, where="accumulator",
                                                          index=(3, 4)), report=True)(A, B)
    (_, r_off), _ = inject(abft(mm, report=True, verify="offline"),
                           BitFlip(13, where="accumulator", index=(3, 4)), report=True)(A, B)
    assert r_on.gemms[0].detected == 1 and r_off.gemms[0].detected == 0


def test_mixed_precision_emulation_is_float32_accumulation_rounded_once():
    rng = np.random.default_rng(1)
    A = rng.standard_normal((33, 70)).astype(BF16)
    B = rng.standard_normal((70, 20)).astype(BF16)
    out = abft(lambda a, b: nn.linear(a, b.T))(A, B)
    ref = (A.astype(np.float32) @ B.astype(np.float32)).astype(BF16)
    assert out.dtype == BF16 and np.array_equal(out.view(np.uint16), ref.view(np.uint16))


# ---------------------------------------------------------------------------------------------
# programs
# ---------------------------------------------------------------------------------------------
def _mlp(x, w1, b1, w2, b2):
    return nn.linear(nn.relu(nn.linear(x, w1, b1)), w2, b2)


def test_numpy_mlp_clean_and_with_a_fault_in_its_second_layer():
    rng = np.random.default_rng(0)
    ps = [rng.standard_normal(s).astype(np.float32) * 0.3 for s in
          ((64, 32), (64,), (10, 64), (10,))]
    x = rng.standard_normal((128, 32)).astype(np.float32)
    ref = _mlp(x, *ps)
    out, rep = abft(_mlp, report=True)(x, *ps)
    np.testing.assert_array_equal(out, ref)
    assert [g.op for g in rep.gemms] == ["linear", "linear"] and rep.clean
    (out, rep), log = inject(abft(_mlp, report=True), BitFlip(29, where="output", op=1),
                             report=True)(x, *ps)
    assert log[0].op == "linear" and log[0].gemm == 1
    assert rep.gemms[1].corrected == 1 and rep.gemms[0].detected == 0
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def _cnn(x, w1, w2, wf):
    h = nn.relu(nn.conv(x, w1, None, padding=1))
    h = nn.max_pool(nn.relu(nn.conv(h, w2, None, stride=2, padding=1)), 2)
    return nn.linear(h.reshape(h.shape[0], -1), wf)


def test_numpy_cnn_convolutions_are_checked_as_gemms():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2
    wf = rng.standard_normal((10, 16 * 4 * 4)).astype(np.float32) * 0.1
    ref = _cnn(x, w1, w2, wf)
    out, rep = abft(_cnn, report=True)(x, w1, w2, wf)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    assert [g.op for g in rep.gemms] == ["conv", "conv", "linear"] and rep.clean
    assert rep.gemms[0].a_shape == (8, 27)           # weight (O, C k k) @ im2col cols
    (out2, rep2), log = inject(abft(_cnn, report=True),
                               BitFlip(30, where="weight", op="conv", call=1), report=True)(
        x, w1, w2, wf)
    assert rep2.gemms[1].detected > 0 and rep2.gemms[1].uncorrected == 0
    np.testing.assert_allclose(out2, out, rtol=1e-4, atol=1e-5)


def test_torch_module_through_the_adapter():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10)).eval()
    x = torch.randn(16, 32)
    with torch.no_grad():
        ref = model(x)
    out, rep = abft(model, report=True)(x)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert [(g.op, g.layer) for g in rep.gemms] == [("linear", "0"), ("linear", "2")]
    out, rep = inject(abft(model, report=True), fpx.faults.neuron("2", (3, 4), bit=30))(x)
    assert rep.gemms[1].corrected == 1
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# edge inputs
# ---------------------------------------------------------------------------------------------
def test_nan_and_inf_operands_are_reported_never_corrected():
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((6, 8)), rng.standard_normal((8, 5))
    A[2, 3] = np.nan
    B[1, 4] = np.inf
    out, rep = abft(mm, report=True)(A, B)
    ref = A @ B
    np.testing.assert_array_equal(out, ref)            # NaN/inf where NumPy has them
    g = rep.gemms[0]
    assert g.unverified == 6 and g.detected == 0 and g.corrected == 0


def test_a_fault_to_nan_or_inf_is_detected_and_corrected():
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((8, 5)).astype(
        np.float32)
    from fpx.faults import Value
    for v in (np.nan, np.inf):
        out, rep = inject(abft(mm, report=True), Value(v, index=(1, 2)))(A, B)
        g = rep.gemms[0]
        assert g.detected == 1 and g.corrected == 1 and g.locations == [(1, 2)]
        assert np.isfinite(out).all()


def test_integer_gemms_are_checked_exactly():
    rng = np.random.default_rng(0)
    A, B = rng.integers(-50, 50, (10, 12)), rng.integers(-50, 50, (12, 7))
    out, rep = abft(mm, report=True)(A, B)
    assert np.array_equal(out, A @ B) and rep.gemms[0].threshold == 0
    assert rep.gemms[0].verify == "exact"
    out, rep = inject(abft(mm, report=True), BitFlip(0, where="output", index=(3, 3)))(A, B)
    assert rep.gemms[0].locations == [(3, 3)] and np.array_equal(out, A @ B)
    A8 = A.astype(np.int8)
    out = abft(mm)(A8, A8.T)
    assert out.dtype == np.int8 and np.array_equal(out, A8 @ A8.T)


def test_empty_batched_vector_and_bad_shapes():
    g = abft(mm, report=True)
    for a, b in [((0, 4), (4, 3)), ((3, 0), (0, 5)), ((2, 3, 0), (0, 4))]:
        A, B = np.ones(a, np.float32), np.ones(b, np.float32)
        out, rep = g(A, B)
        assert np.array_equal(out, A @ B) and rep.gemms[0].checks == ()
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((3, 5, 6)), rng.standard_normal((6, 4))
    out, rep = g(A, B)
    assert np.array_equal(out, A @ B) and rep.gemms[0].out_shape == (3, 5, 4)
    v = rng.standard_normal(6)
    assert np.allclose(g(v, B)[0], v @ B) and np.allclose(g(v, v)[0], v @ v)
    out, rep = g(np.ones((3, 3), bool), np.ones((3, 3), bool))
    assert out.dtype == bool and rep.gemms[0].checks == ()
    with pytest.raises(ValueError, match="mismatch"):
        g(np.ones((3, 4)), np.ones((5, 3)))
    with pytest.raises(fpx.FpxError, match="not supported"):
        fpx.trace(abft(mm))(np.ones((3, 3)), np.ones((3, 3)))


# ---------------------------------------------------------------------------------------------
# the fused checksum passes against the plain NumPy reference (fpx.transforms.abft.sums)
# ---------------------------------------------------------------------------------------------
_FIELDS = ("b1", "b2", "chk", "chk2", "obs", "obs2", "a_sum", "a_max", "a_min", "b_max",
           "b_min", "rb", "P", "Q", "R")


def _both(A, B, C, **need):
    from fpx.transforms.abft.sums import row_sums
    return [row_sums(A, B, C, weighted=True, kernel=k, **need) for k in ("fused", "numpy")]


def _assert_agree(A, B, C):
    """Every sum within twice the float64 summation bound gamma_L (|terms|) of the plain path:
    the two differ only in the order of float64 sums; extrema exactly; NaN/inf where the
    reference has them."""
    f, p = _both(A, B, C, ext=True, absolute=True)
    K, N = A.shape[-1], C.shape[-1]
    g = 4 * (K + N) * 2.0 ** -53
    with np.errstate(all="ignore"):
        scale = {"b1": p.rb, "b2": N * p.rb, "rb": p.rb, "obs": p.R, "obs2": N * p.R,
                 "R": p.R, "a_sum": np.abs(A).sum(-1, dtype=np.float64),
                 "chk": p.P + p.Q, "chk2": N * (p.P + p.Q), "P": p.P, "Q": p.P + p.Q}
        for k in _FIELDS:
            x, y = getattr(f, k), getattr(p, k)
            y = np.broadcast_to(y, x.shape)      # the fused A statistics: per batch entry
            fin = np.isfinite(y)
            if k in scale:
                assert np.array_equal(fin, np.isfinite(x)), k
                tol = g * np.broadcast_to(scale[k], x.shape)[fin]
                assert (np.abs(x[fin] - y[fin]) <= tol).all(), k
            else:           # extrema: exact, but unspecified in a row with a NaN (unverified)
                nan = np.broadcast_to(np.isnan(A if k[0] == "a" else B).any(-1), x.shape)
                assert np.array_equal(x[~nan], y[~nan]), k


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["C", "F", "strided", "broadcast"])
def test_fused_sums_agree_with_numpy(dtype, layout):
    rng = np.random.default_rng(3)
    A = (rng.standard_normal((3, 37, 300)) * 2.0 ** rng.integers(-20, 20, (3, 37, 1)))
    B = rng.uniform(-1, 1, (3, 300, 41)).astype(dtype)
    A = A.astype(dtype)
    if layout == "F":
        A, B = (np.asfortranarray(x) for x in (A, B))
    elif layout == "strided":
        A, B = np.concatenate([A, A], -1)[..., ::2], np.swapaxes(np.swapaxes(B, 1, 2).copy(),
                                                                 1, 2)
    elif layout == "broadcast":
        A = A[:1]
    C = np.matmul(A, B)
    _assert_agree(A, B, C)
    A[0, 1, 2] = -0.0
    A[0, 2, :] = -0.0                   # a row of -0: max and min -0
    A[1 % A.shape[0], 3, 4] = np.finfo(dtype).tiny / 8          # subnormal
    _assert_agree(A, B, np.matmul(A, B))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_sums_with_nan_and_inf_operands(dtype):
    rng = np.random.default_rng(4)
    A = rng.standard_normal((2, 9, 40)).astype(dtype)
    B = rng.standard_normal((2, 40, 7)).astype(dtype)
    A[0, 3, 5], B[1, 2, 3], A[1, 4, :] = np.inf, -np.inf, np.inf
    with np.errstate(all="ignore"):
        C = np.matmul(A, B)
        _assert_agree(A, B, C)
        f, p = _both(A, B, C, ext=True)
        assert f.a_max[0, 3] == np.inf and f.a_min[1, 4] == np.inf
        A[0, 1, 1] = B[0, 5, 5] = np.nan
        _assert_agree(A, B, np.matmul(A, B))


def test_fused_sums_of_integers_are_exact_and_wrap_as_numpy():
    rng = np.random.default_rng(5)
    for dt, hi in ((np.int64, 2 ** 62), (np.uint64, 2 ** 63)):
        A = rng.integers(0, hi, (2, 11, 30), dtype=dt)
        B = rng.integers(0, 2 ** 40, (2, 30, 9), dtype=dt)
        C = np.matmul(A, B)                   # wraps modulo 2^64
        f, p = _both(A, B, C)
        for k in ("b1", "b2", "chk", "chk2", "obs", "obs2"):
            x = getattr(f, k)
            assert x.dtype == dt and np.array_equal(x, getattr(p, k)), k
        assert np.array_equal(f.chk, f.obs)   # the checksum identity holds modulo 2^64
    with pytest.raises(ValueError, match="exactly"):
        _both(A, B, C, ext=True)


def test_fused_sums_of_empty_operands():
    for (M, K, N) in ((4, 0, 3), (0, 5, 3), (4, 5, 0)):
        A, B = np.ones((1, M, K), np.float32), np.ones((1, K, N), np.float32)
        f, p = _both(A, B, np.matmul(A, B))
        for k in ("b1", "b2", "chk", "chk2", "obs", "obs2"):
            assert np.array_equal(getattr(f, k), getattr(p, k)), k


def test_fused_sums_do_not_depend_on_the_thread_count():
    """The same code path at 1, 2 and numba's threads: every row is one thread's, so the same
    bits."""
    from fpx.transforms.abft.sums import row_sums
    rng = np.random.default_rng(6)
    A = rng.standard_normal((1, 512, 300)).astype(np.float32)
    B = rng.standard_normal((1, 300, 512)).astype(np.float32)
    C = np.matmul(A, B)
    T = [np.swapaxes(x, 1, 2) for x in (B, A, C)]      # the column check's operands
    runs = [[row_sums(*ops, weighted=True, ext=True, absolute=True, threads=t)
             for ops in ((A, B, C), T)] for t in (1, 2, None)]
    for k in _FIELDS:
        for run in runs[1:]:
            for a, b in zip(runs[0], run):
                assert np.array_equal(getattr(a, k), getattr(b, k)), k


@pytest.mark.parametrize("threshold", ["v-abft", "a-abft", "rigorous"])
def test_fused_and_plain_checks_agree_on_thresholds_and_detections(threshold):
    from fpx import formats
    from fpx.transforms.abft import check, thresholds
    rng = np.random.default_rng(8)
    A = rng.standard_normal((4, 32, 128)).astype(np.float32)
    B = rng.standard_normal((4, 128, 24)).astype(np.float32)
    C = np.matmul(A, B)
    C[1, 5, 7] += 0.5
    C[3, 0, 23] *= 64.0
    f32 = formats.get("float32")
    out = {}
    tfun = thresholds.resolve(threshold)
    for kernel, early in (("fused", False), ("numpy", False), ("fused", True)):
        info = thresholds.Info(fmt=f32, acc=f32, out=f32, verify="online", c_sigma=2.5,
                               e_max=thresholds.e_max_for(None, f32, 128, 24))
        Ck = C.copy()           # early: the operands' sums taken before (as fpx.abft does)
        pre = check.prepare(A, B, tfun=tfun, checksums="both", kernel=kernel) if early \
            else None
        st, _ = check.check(A, B, Ck, tfun=tfun, info=info, checksums="both", correct=True,
                            out=None, kernel=kernel, pre=pre)
        out[kernel, early] = (st, Ck)
    (se, ce) = out["fused", True]
    (sf, cf), (sp, cp) = out["fused", False], out["numpy", False]
    assert (se.detected, se.corrected, se.threshold, se.residual, sorted(se.locations)) == \
        (sf.detected, sf.corrected, sf.threshold, sf.residual, sorted(sf.locations))
    assert np.array_equal(ce, cf)
    assert sf.detected == sp.detected        # the row check finds and corrects both faults
    assert sf.detected == 2 or threshold == "rigorous"
    assert sorted(sf.locations) == sorted(sp.locations) and sf.corrected == sp.corrected
    assert np.isclose(sf.threshold, sp.threshold, rtol=1e-12)
    assert np.array_equal(cf, cp)


@pytest.mark.parametrize("verify", ["online", "offline"])
def test_a_genuine_overflow_is_unverified_not_a_fault(verify):
    """A float32 input near 3e38 overflows its row of the GEMM in any execution: the row's
    inf against a finite float64 checksum is the format's overflow, not a fault -- counted
    unverified, never detected or changed; an inf planted in another row is still found and
    corrected."""
    from fpx.faults import Value
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    x[3, 5] = 3e38
    with np.errstate(all="ignore"):
        ref = x @ w
        y, rep = fpx.abft(lambda a: a @ w, report=True, verify=verify)(x)
    assert np.array_equal(y, ref, equal_nan=True) and np.isinf(ref[3]).any()
    g = rep.gemms[0]
    assert g.detected == 0 and g.uncorrected == 0 and g.unverified == 1
    x[3, 5] = 1.0
    with np.errstate(all="ignore"):
        y, rep = fpx.inject(fpx.abft(lambda a: a @ w, report=True, verify=verify),
                            Value(np.inf, where="output", index=(7, 2)))(x)
    g = rep.gemms[0]
    assert g.detected == 1 and g.corrected == 1 and np.allclose(y, x @ w)
