"""Real vision models from torchvision and timm (issue 28), random weights (no downloads), small
inputs, eval mode; skipped where torchvision (or timm) cannot be imported -- the torchvision
release for torch 2.13 is a CUDA build whose import fails beside the CPU torch, so these run in
an environment with torch and torchvision from one release (verified: torch 2.14.1 with
torchvision 0.29.1 and timm 1.0.31). For each: ``fpx.interval`` holds the model's own output and
its float64 run; ``fpx.stochastic`` runs and scatters about the output; layer-by-layer
``fpx.classify`` says roundoff against the float64 copy and bug -- at that layer -- against a
copy with one conv's or linear's weight scaled by 1.01 (slow: each exports every layer)."""
from __future__ import annotations

import copy
import importlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import fpx  # noqa: E402
from _real_model_checks import (assert_classify_finds_a_planted_weight,  # noqa: E402
                                assert_samples_scatter_about)


def _library(name):
    """The module, or the reason it cannot be used (any exception at import: the CUDA build
    of torchvision beside a CPU torch raises RuntimeError, not ImportError)."""
    try:
        return importlib.import_module(name), None
    except Exception as e:
        return None, f"{name} is not importable ({type(e).__name__}: {str(e)[:200]})"


tv, TV_WHY = _library("torchvision.models")
timm, TIMM_WHY = _library("timm") if tv is not None else (None, TV_WHY)

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]


def _tv_vit():
    from torchvision.models.vision_transformer import VisionTransformer
    m = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                          hidden_dim=32, mlp_dim=64, num_classes=10)
    nn.init.normal_(m.heads.head.weight, std=0.2)      # torchvision zero-initializes the head
    return m


# name -> (library, builder, input side, the layer whose weight the planted bug scales)
MODELS = {
    "tv_resnet18": ("torchvision", lambda: tv.resnet18(weights=None, num_classes=10), 32,
                    "layer3.0.conv1"),
    "tv_squeezenet1_1": ("torchvision", lambda: tv.squeezenet1_1(weights=None, num_classes=10),
                         32, "features.9.squeeze"),
    "tv_vit": ("torchvision", _tv_vit, 32,
               "encoder.layers.encoder_layer_1.mlp.0"),
    "timm_resnet18": ("timm", lambda: timm.create_model("resnet18", pretrained=False,
                                                       num_classes=10), 32, "layer3.0.conv1"),
}
# the rest of the list, whose bounds also hold but take longer (slow marker)
SLOW_MODELS = {
    "tv_mobilenet_v3_small": ("torchvision", lambda: tv.mobilenet_v3_small(
        weights=None, num_classes=10), 32, "features.7.block.1.0"),
    "timm_convnext_atto": ("timm", lambda: timm.create_model(
        "convnext_atto", pretrained=False, num_classes=10), 32, "stages.2.blocks.1.mlp.fc2"),
    "timm_vit_tiny": ("timm", lambda: timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=32),
        32, "blocks.6.attn.qkv"),
    "tv_efficientnet_b0": ("torchvision", lambda: tv.efficientnet_b0(
        weights=None, num_classes=10), 32, "features.5.0.block.1.0"),
    "tv_shufflenet_v2_x0_5": ("torchvision", lambda: tv.shufflenet_v2_x0_5(
        weights=None, num_classes=10), 32, "stage3.3.branch2.5"),
    "tv_convnext_tiny": ("torchvision", lambda: tv.convnext_tiny(weights=None, num_classes=10),
                         32, "features.5.2.block.5"),
    "tv_regnet_y_400mf": ("torchvision", lambda: tv.regnet_y_400mf(
        weights=None, num_classes=10), 32, "trunk_output.block3.block3-3.f.c.0"),
}
ALL = {**MODELS, **SLOW_MODELS}


def _names(table, slow=False):
    marks = [pytest.mark.slow] if slow else []
    return [pytest.param(n, marks=marks, id=n) for n in sorted(table)]


ALL_NAMES = _names(MODELS) + _names(SLOW_MODELS, slow=True)


def _model(name):
    lib, make, side, layer = ALL[name]
    why = TV_WHY if lib == "torchvision" else TIMM_WHY
    if why is not None:
        pytest.skip(why)
    torch.manual_seed(0)
    m = make().eval()
    with torch.no_grad():
        for bn in m.modules():                 # statistics a trained network might have
            if isinstance(bn, nn.modules.batchnorm._BatchNorm):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, side, side, generator=torch.Generator().manual_seed(1))
    return m, layer, x


@pytest.mark.parametrize("name", ALL_NAMES)
def test_interval_holds_the_models_output_and_its_float64_run(name):
    m, _, x = _model(name)
    iv = fpx.interval(m)(x)
    with torch.no_grad():
        own = m(x)
        f64 = copy.deepcopy(m).double()(x.double())
    assert iv.contains(own.double()).all() and iv.contains(f64).all()
    # fpx's value: one result round-off could produce (its kernels, not always torch's bits)
    assert iv.contains(iv.value.double()).all()
    assert torch.allclose(iv.value, own, rtol=1e-4, atol=1e-5 * float(own.abs().max()))


@pytest.mark.parametrize("name", ALL_NAMES)
def test_stochastic_runs_scatter_about_the_output(name):
    m, _, x = _model(name)
    s = fpx.stochastic(m, "sr", samples=2, seed=0)(x)
    with torch.no_grad():
        own = m(x)
    assert_samples_scatter_about(s, own, 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALL))
def test_classify_layer_by_layer_roundoff_and_a_planted_bug(name):
    m, layer, x = _model(name)
    assert_classify_finds_a_planted_weight(m, layer, x)


class _TinyViT(nn.Module):
    """A ViT's own parameters used between its sublayers (class token, position embedding),
    as torchvision's ``Encoder``/``VisionTransformer`` and timm's ``VisionTransformer`` have."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 32, 8, 8)
        self.cls = nn.Parameter(0.02 * torch.randn(1, 1, 32))
        self.pos = nn.Parameter(0.02 * torch.randn(1, 17, 32))
        layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(len(t), -1, -1), t], 1) + self.pos
        return self.head(self.blocks(t)[:, 0])


@pytest.mark.slow      # (10-25 s: the default run keeps its siblings)
def test_a_module_with_parameters_between_its_sublayers_is_a_composite():
    # as a fine layer, the whole ViT's bound (too wide to decide) made a clean model
    # inconclusive; as a composite it is unchecked, and each sublayer decides on its own
    from fpx.interop.torch import fine_layers
    torch.manual_seed(0)
    m = _TinyViT().eval()
    fine, composite = fine_layers(m)
    assert "" in composite and "blocks.layers.0" in composite
    # MultiheadAttention's forward is functional code on out_proj's weight: a fine layer
    assert "blocks.layers.0.self_attn" in fine
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    v = assert_classify_finds_a_planted_weight(m, "blocks.layers.1.linear1", x)
    assert "blocks.layers.0.self_attn" in [n for n, _ in v.layers]
