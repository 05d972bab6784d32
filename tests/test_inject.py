"""fpx.inject and fpx.faults: bit numbering, site selection, determinism, PyTorchFI's
vocabulary on torch modules, composition with fpx.abft, errors."""
import ml_dtypes
import numpy as np
import pytest

import fpx.nn as nn
from fpx import faults
from fpx.faults import BitFlip, Value, flip_bit
from fpx.transforms.abft import abft
from fpx.transforms.inject import inject

BF16 = ml_dtypes.bfloat16


def mm(a, b):
    return a @ b


def test_bits_are_numbered_from_the_formats_least_significant_bit():
    one = np.array([1.0], BF16)
    assert flip_bit(one, 15, (0,))[0] == -1.0                     # sign
    assert flip_bit(one, 7, (0,))[0] == 0.5                       # exponent LSB (127 -> 126)
    assert flip_bit(one, 14, (0,))[0] == np.inf                   # exponent 255
    assert flip_bit(one, 6, (0,))[0] == 1.5                       # top significand bit
    assert flip_bit(np.float32(1.0), 31, ())[()] == -1.0
    assert flip_bit(np.array([1.0], np.float32), 22, (0,))[0] == 1.5
    assert flip_bit(np.array([1.0], np.float64), 51, (0,))[0] == 1.5
    assert flip_bit(np.array([1.0], ml_dtypes.float8_e4m3fn), 3, (0,))[0] == 0.5   # 7 -> 6
    assert flip_bit(np.array([5], np.int32), 1, (0,))[0] == 7
    t = flip_bit(np.ones((2, 3), np.float32).T, 31, (2, 1))          # a transposed view
    assert t[2, 1] == -1.0 and (t == -1).sum() == 1
    with pytest.raises(ValueError, match="bit 16"):
        flip_bit(one, 16, (0,))
    with pytest.raises(TypeError, match="bool"):
        flip_bit(np.array([True]), 0, (0,))


def test_an_output_flip_changes_one_element_and_is_logged():
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((8, 16)), rng.standard_normal((16, 4))
    out, log = inject(mm, BitFlip(62, index=(2, 3)), report=True)(A, B)
    diff = np.argwhere(out != A @ B)
    assert diff.tolist() == [[2, 3]]
    (x,) = log
    assert (x.op, x.where, x.index, x.gemm) == ("matmul", "output", (2, 3), 0)
    assert x.before == (A @ B)[2, 3] and x.after == out[2, 3]


def test_random_picks_are_deterministic_per_seed_and_prob_selects_sites():
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((32, 32)), rng.standard_normal((32, 32))
    f = inject(mm, BitFlip(40, seed=7), report=True)
    (o1, l1), (o2, l2) = f(A, B), f(A, B)
    assert np.array_equal(o1, o2) and l1[0].index == l2[0].index
    _, l3 = inject(mm, BitFlip(40, seed=8), report=True)(A, B)
    assert l3[0].index != l1[0].index
    out, log = inject(mm, BitFlip(40, prob=0.0), report=True)(A, B)
    assert log == [] and np.array_equal(out, A @ B)
    hits = sum(len(inject(mm, BitFlip(40, prob=0.5, seed=s), report=True)(A, B)[1])
               for s in range(200))
    assert 70 <= hits <= 130


def _mlp(x, w1, w2, w3):
    return nn.linear(np.tanh(nn.linear(nn.relu(nn.linear(x, w1)), w2)), w3)


def test_op_names_numbers_and_call_select_the_gemm():
    rng = np.random.default_rng(2)
    ws = [rng.standard_normal(s).astype(np.float32) for s in ((16, 8), (16, 16), (4, 16))]
    x = rng.standard_normal((5, 8)).astype(np.float32)
    for fault, n in [(BitFlip(25, op=1), 1), (BitFlip(25, op="linear", call=2), 2),
                     (BitFlip(25, op=0, where="weight"), 0), (BitFlip(25), None)]:
        _, log = inject(_mlp, fault, report=True)(x, *ws)
        assert [e.gemm for e in log] == ([n] if n is not None else [0, 1, 2])
    _, log = inject(_mlp, BitFlip(25, op="tanh"), report=True)(x, *ws)
    assert [(e.op, e.gemm) for e in log] == [("tanh", None)]
    _, log = inject(_mlp, BitFlip(30, op="conv"), report=True)(x, *ws)
    assert log == []


def test_value_faults_and_weight_faults_leave_the_parameter_alone():
    rng = np.random.default_rng(3)
    A, W = rng.standard_normal((4, 6)), rng.standard_normal((3, 6))
    keep = W.copy()
    out = inject(lambda a, w: nn.linear(a, w), Value(0.0, where="weight", index=(1, 2)))(A, W)
    W2 = W.copy()
    W2[1, 2] = 0
    np.testing.assert_allclose(out, A @ W2.T)
    assert np.array_equal(W, keep)
    out = inject(lambda a, w: nn.linear(a, w), Value(7.0, index=(0, 0)))(A, W)
    assert out[0, 0] == 7.0


def test_a_weight_fault_means_the_same_element_with_and_without_abft():
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((6, 10)).astype(np.float32), rng.standard_normal(
        (4, 10)).astype(np.float32)
    f = lambda a, b: nn.linear(a, b)             # noqa: E731
    fault = BitFlip(27, where="weight", index=(3, 7))
    plain = inject(f, fault)(x, w)
    (checked, rep), log = inject(abft(f, report=True, correct=False), fault, report=True)(x, w)
    assert log[0].index == (7, 3)                # w.T as the GEMM reads it
    np.testing.assert_array_equal(checked, plain)
    assert rep.gemms[0].detected == 6 and {loc[1] for loc in rep.gemms[0].locations} == {3}


def test_accumulator_faults_land_before_the_output_is_rounded():
    rng = np.random.default_rng(4)
    A = rng.standard_normal((8, 32)).astype(BF16)
    B = rng.standard_normal((32, 8)).astype(BF16)
    f = lambda a, b: nn.linear(a, b.T)           # noqa: E731  (float32 accumulate, bf16 out)
    clean = f(A, B)
    out, log = inject(f, BitFlip(2, where="accumulator", index=(1, 1)), report=True)(A, B)
    assert log[0].where == "accumulator" and np.array_equal(out, clean)   # rounded away
    out = inject(f, BitFlip(30, where="accumulator", index=(1, 1)))(A, B)
    assert out[1, 1] != clean[1, 1] and (out != clean).sum() == 1


def test_composition_order_decides_what_abft_can_see():
    rng = np.random.default_rng(5)
    A, B = rng.standard_normal((16, 32)).astype(np.float32), \
        rng.standard_normal((32, 16)).astype(np.float32)
    fault = BitFlip(29, where="input", index=(4, 4))
    (_, rep), _ = inject(abft(mm, report=True), fault, report=True)(A, B)
    assert rep.gemms[0].detected == 1                # inside the checksummed GEMM
    out, rep = abft(inject(mm, fault), report=True)(A, B)
    assert rep.gemms[0].detected == 0                # before the checksums are encoded
    assert not np.allclose(out, A @ B)
    out, rep = abft(inject(mm, BitFlip(30, where="output")), report=True)(A, B)
    assert rep.gemms[0].detected == 0 and not np.allclose(out, A @ B)   # after verification


def test_online_verification_does_not_see_an_output_written_after_it():
    rng = np.random.default_rng(6)
    A = rng.standard_normal((16, 64)).astype(BF16)
    B = rng.standard_normal((64, 16)).astype(BF16)
    fault = Value(1e6, where="output", index=(2, 2))
    _, rep = inject(abft(mm, report=True), fault)(A, B)
    assert rep.gemms[0].detected == 0
    _, rep = inject(abft(mm, report=True, verify="offline"), fault)(A, B)
    assert rep.gemms[0].detected == 1


def test_torch_module_neuron_and_weight_faults_by_layer_name():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 5)).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        ref = model(x)
    w_before = model[3].weight.detach().clone()
    clean = inject(model, BitFlip(0, prob=0.0))(x)          # fpx's run of the module
    torch.testing.assert_close(clean, ref, rtol=1e-5, atol=1e-5)
    out, log = inject(model, faults.neuron("3", (1, 2), bit=30), report=True)(x)
    assert [(e.op, e.layer, e.index) for e in log] == [("linear", "3", (1, 2))]
    assert isinstance(out, torch.Tensor)
    d = (out != clean).nonzero().tolist()
    assert d == [[1, 2]]
    out, log = inject(model, faults.weight("0", (1, 0, 2, 2), bit=30), report=True)(x)
    assert [(e.op, e.layer, e.where) for e in log] == [("conv", "0", "weight")]
    assert not torch.allclose(out, ref)
    assert torch.equal(model[3].weight, w_before)
    # inside abft the conv weight is the GEMM's (O, C k k + 1) matrix; the parameter's index
    # (o, c, kh, kw) maps to (o, c k k + kh k + kw)
    (out, rep), log = inject(abft(model, report=True), faults.weight("0", (1, 0, 2, 2), bit=30),
                             report=True)(x)
    assert [(e.layer, e.index) for e in log] == [("0", (1, 8))]
    assert rep.gemms[0].detected > 0 and rep.gemms[0].uncorrected == 0
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_bad_faults_are_refused():
    with pytest.raises(ValueError, match="where"):
        BitFlip(3, where="register")
    with pytest.raises(ValueError, match="bit"):
        BitFlip(-1)
    with pytest.raises(ValueError, match="prob"):
        BitFlip(1, prob=2)
    with pytest.raises(ValueError, match="exactly one"):
        faults.neuron("fc", 0)
    with pytest.raises(TypeError, match="faults"):
        inject(mm, "bitflip")
    A = np.ones((3, 3), np.float32)
    with pytest.raises(ValueError, match="does not exist"):
        inject(mm, BitFlip(40))(A, A)
    with pytest.raises(IndexError, match="out of range"):
        inject(mm, BitFlip(3, index=(5, 0)))(A, A)
    with pytest.raises(Exception, match="accumulator"):
        inject(lambda a: np.exp(a), BitFlip(3, where="accumulator", op="exp"))(A)
