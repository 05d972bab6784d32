"""Checks shared by the real-model tests (transformers, torchvision, timm): a stochastic run
scatters about the model's own output, and layer-by-layer classify says roundoff against the
model's float64 copy and names a planted 1.01x weight."""
from __future__ import annotations

import copy

import fpx



def assert_samples_scatter_about(samples, own, n):
    """``n`` finite stochastic samples of ``own``'s shape, off it by a relative 0 < rel < 1e-3."""
    import torch
    assert samples.shape == (n,) + tuple(own.shape) and torch.isfinite(samples).all()
    rel = (samples - own).abs().max() / own.abs().max()
    assert 0 < rel < 1e-3


def assert_classify_finds_a_planted_weight(m, layer, x):
    """classify(m, its float64 copy) is roundoff and ran ``layer``; with that layer's weight
    scaled by 1.01 it is a bug first found at ``layer``; returns the clean verdict."""
    import torch
    ref = copy.deepcopy(m).double()
    v = fpx.classify(m, ref, x)
    assert v.kind == "roundoff", v.report()
    assert layer in [n for n, _ in v.layers]
    bug = copy.deepcopy(m)
    with torch.no_grad():
        bug.get_submodule(layer).weight.mul_(1.01)
    w = fpx.classify(bug, ref, x)
    assert w.kind == "bug" and w.first_bug == layer, w.report()
    return v
