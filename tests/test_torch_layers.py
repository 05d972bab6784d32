"""Layer-by-layer classify on ResNet-style models (issue 28) and in-place ops in torch
programs: what a layer is compared on is what it saw and produced, whatever the program does
to those tensors in place afterwards."""
from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import fpx  # noqa: E402


class Block(nn.Module):
    """torchvision's BasicBlock: conv-BN-ReLU(inplace)-conv-BN, ``out += identity``, ReLU."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """A small resnet18: stem conv-BN-ReLU(inplace)-maxpool, two basic blocks (the second
    downsamples), global average pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = Block(8, 8, 1)
        self.layer2 = Block(8, 16, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _resnet():
    torch.manual_seed(0)
    m = ResNet()
    for bn in m.modules():
        if isinstance(bn, nn.BatchNorm2d):      # statistics a trained network might have
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)
    return m.eval()


def _fine_layers(m):
    return [n for n, c in m.named_modules()
            if isinstance(c, (nn.Conv2d, nn.BatchNorm2d, nn.Linear))]


def test_resnet_with_inplace_relu_against_its_float64_copy_is_roundoff():
    # the false bug: every BN output was recorded by reference and then changed by
    # the in-place ReLU after it (and bn2's by ``out += identity``), so the reference's
    # "output" of bn1 was its ReLU
    m = _resnet()
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    names = _fine_layers(m)
    v = fpx.classify(m, copy.deepcopy(m).double(), x, layers=names)
    assert sorted(n for n, _ in v.layers) == sorted(names)     # in execution order
    assert v.kind == "roundoff", v.report()
    assert all(lv.kind == "roundoff" for _, lv in v.layers)
    # the default layers (direct children, the in-place ``relu`` among them) too
    v = fpx.classify(m, copy.deepcopy(m).double(), x)
    assert [n for n, _ in v.layers][:4] == ["conv1", "bn1", "relu", "maxpool"]
    assert v.kind == "roundoff", v.report()


def test_resnet_with_a_corrupted_batch_norm_is_a_bug_at_that_layer():
    m = _resnet()
    target = copy.deepcopy(m)
    target.layer1.bn2.running_var.mul_(1.5)        # the target only
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    names = _fine_layers(m)
    v = fpx.classify(target, m.double(), x, layers=names)
    assert v.kind == "bug" and v.first_bug == "layer1.bn2", v.report()
    ran = [n for n, _ in v.layers]
    kinds = [lv.kind for _, lv in v.layers]
    i = ran.index("layer1.bn2")
    assert kinds[:i] == ["roundoff"] * i and kinds[i] == "bug"


class _DoubleInPlace(nn.Module):
    def forward(self, x):
        return x.mul_(2.0)


def test_a_layer_that_changes_its_own_input_is_compared_on_what_it_was_given():
    # recorded after the call, the layer's input would be its output (2x): a bound of 4x
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 6), _DoubleInPlace(), nn.Tanh()).eval()
    x = torch.randn(3, 6)
    v = fpx.classify(m, copy.deepcopy(m).double(), x)
    assert [n for n, _ in v.layers] == ["0", "1", "2"]
    assert v.kind == "roundoff", v.report()


def _inplace_program(x, y):
    y = y * 1.5
    x.add_(y)
    x.mul_(3.0)
    x.sub_(0.25).relu_()
    x.clamp_(max=2.5)
    return x.exp_() + y


def test_inplace_ops_run_out_of_place():
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(2))
    iv = fpx.interval(_inplace_program)(x.clone(), x)
    x0 = x.clone()
    own = _inplace_program(x.clone(), x)
    assert torch.equal(x, x0)                  # nothing wrote to the caller's tensors
    assert iv.contains(own).all()
    assert iv.contains(_inplace_program(x.double(), x.double())).all()
    ref = np.exp(np.clip(np.maximum((x.numpy() + 1.5 * x.numpy()) * 3 - 0.25, 0), None, 2.5))
    assert np.allclose(iv.value.numpy(), ref + 1.5 * x.numpy(), rtol=1e-5)   # every op ran
    r = fpx.interval(nn.ReLU(inplace=True))(x)
    assert torch.equal(r.value, torch.relu(x)) and torch.equal(x, x0)


def test_a_program_that_only_mutates_its_input_is_refused():
    def scale(x):
        x.mul_(2.0)
    with pytest.raises(fpx.FpxError, match="returns nothing"):
        fpx.interval(scale)(torch.ones(3))


def _planted(m, name, factor=1.01):
    """A copy of ``m`` with the weight of submodule ``name`` scaled by ``factor``."""
    t = copy.deepcopy(m)
    with torch.no_grad():
        t.get_submodule(name).weight.mul_(factor)
    return t


@pytest.mark.slow      # (10-25 s: the default run keeps its siblings)
def test_default_layers_are_fine_and_find_a_planted_weight_bug():
    # the default layers: every parameter-owning module and leaf, and the composites (the
    # residual blocks, the model) -- a 1.01x weight in one conv is found at that conv
    m = _resnet()
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    clean = fpx.classify(m, copy.deepcopy(m).double(), x)
    assert clean.kind == "roundoff", clean.report()
    ran = [n for n, _ in clean.layers]
    assert {"conv1", "layer1.conv2", "layer2.down.0", "layer2.down.1", "fc"} <= set(ran)
    assert {"layer1", "layer2", "ResNet"} <= set(ran)      # composites: residual adds, head
    assert ran.index("layer1.bn2") < ran.index("layer1")     # inner calls return first
    for name in ("layer1.conv2", "layer2.down.0", "fc"):
        v = fpx.classify(_planted(m, name), copy.deepcopy(m).double(), x)
        assert v.kind == "bug" and v.first_bug == name, (name, v.report())
        assert f"first layer whose reference output leaves the target's bound: {name}" \
            in v.report()


class _Scores(nn.Module):
    """Attention whose projections are Linear children and whose scores are its own code."""

    def __init__(self, d, scale):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.scale = scale

    def forward(self, x):
        s = self.q(x) @ self.k(x).transpose(-2, -1) * self.scale
        return torch.softmax(s, dim=-1) @ self.v(x)


def test_a_bug_in_a_composites_own_code_is_found_at_the_composite():
    torch.manual_seed(3)
    ref = nn.Sequential(nn.Linear(8, 16), _Scores(16, 0.25), nn.LayerNorm(16)).eval()
    target = copy.deepcopy(ref)
    target[1].scale = 0.25 * 1.01
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(4))
    v = fpx.classify(target, copy.deepcopy(ref).double(), x)
    assert v.kind == "bug" and v.first_bug == "1", v.report()
    kinds = dict(v.layers)
    assert all(kinds[n].kind == "roundoff" for n in ("0", "1.q", "1.k", "1.v", "2"))
    assert fpx.classify(ref, copy.deepcopy(ref).double(), x).kind == "roundoff"


def _deep_norm_chain(depth=16):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32))
                           for _ in range(depth)]).eval()


@pytest.mark.slow      # (10-25 s: the default run keeps its siblings)
def test_a_vacuous_bound_does_not_say_roundoff():
    # sixteen Linear-LayerNorm pairs: the whole program's interval bound is about as wide as
    # the output's own range (each layer norm's whole output range); a reference from a copy
    # with the first weight scaled by 1.01 (or shifted by 1-7%) lies inside it, and that is no
    # evidence of round-off -- inconclusive, the width said; the fine layers find the bug
    m = _deep_norm_chain()
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1))
    bugged = _planted(m, "0.0").double()
    ref = bugged(x.double()).detach()
    v = fpx.classify(m, ref, x, layers=False)
    assert v.kind == "inconclusive" and v.n_outside == 0 and v.width >= 1, v.report()
    assert "bound too wide" in v.report()
    y = m(x).detach().double()
    for shift in (1.01, 1.07):
        assert fpx.classify(m, y * shift, x, layers=False).kind != "roundoff"
    # the same program's float64 run is not called round-off either: the bound cannot tell
    assert fpx.classify(m, copy.deepcopy(m).double()(x.double()).detach(), x,
                        layers=False).kind == "inconclusive"
    # only a caller who accepts such widths gets roundoff
    assert fpx.classify(m, ref, x, layers=False, too_wide=1e3).kind == "roundoff"
    w = fpx.classify(m, bugged, x)
    assert w.kind == "bug" and w.first_bug == "0.0", w.report()
    with pytest.raises(ValueError, match="too_wide"):
        fpx.classify(m, ref, x, layers=False, too_wide=0)


class _Tagger(nn.Module):
    """A recurrent tagger: a linear embedding, a 2-layer LSTM or GRU, a linear head."""

    def __init__(self, rnn):
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.rnn = rnn(8, 8, num_layers=2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.rnn(self.embed(x))[0])


@pytest.mark.slow
@pytest.mark.parametrize("rnn", [nn.LSTM, nn.GRU], ids=["lstm", "gru"])
def test_recurrent_layers_interval_classify_and_stochastic(rnn):
    # nn.LSTM/nn.GRU through the adapter: the bound holds torch's output and the float64
    # run; layer by layer the recurrent module is a fine layer (it owns its weights), so a
    # 1.01x recurrent weight is found there; stochastic runs
    torch.manual_seed(0)
    m = _Tagger(rnn).eval()
    x = torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(1))
    ref = copy.deepcopy(m).double()
    iv = fpx.interval(m)(x)
    with torch.no_grad():
        assert iv.contains(m(x).double()).all() and iv.contains(ref(x.double())).all()
    v = fpx.classify(m, ref, x)
    assert v.kind == "roundoff", v.report()
    assert [n for n, _ in v.layers] == ["embed", "rnn", "head", "_Tagger"]
    bug = copy.deepcopy(m)
    with torch.no_grad():
        bug.rnn.weight_hh_l1.mul_(1.01)
    w = fpx.classify(bug, ref, x)
    assert w.kind == "bug" and w.first_bug == "rnn", w.report()
    s = fpx.stochastic(m, "sr", samples=3, seed=0)(x)
    with torch.no_grad():
        assert s.shape == (3, 2, 5, 3) and torch.allclose(s, m(x).expand(3, -1, -1, -1),
                                                          rtol=1e-4, atol=1e-5)
