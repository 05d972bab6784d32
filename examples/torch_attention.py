"""Fused vs unfused attention, and an attention that scales twice: what fpx says.

A small transformer block (embedding projection -> self-attention -> layer norm -> head) in
three versions that differ only in the attention layer:

* ``sdpa``: ``F.scaled_dot_product_attention`` (torch's fused CPU kernel);
* ``explicit``: ``softmax(q @ k^T / sqrt(d)) @ v`` written out;
* ``scale_twice``: the explicit form with the 1/sqrt(d) scale applied to q *and* to the scores
  (a real bug class: the scale folded into q by one author, applied again by another).

fpx classifies the fused model against the explicit one (float32 and bfloat16): round-off;
and the scale-twice model against the explicit one: a bug, and the layer-by-layer report names
the attention layer. Run: ``python examples/torch_attention.py``.
"""
from __future__ import annotations

import copy
import math
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

import fpx


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, impl: str = "sdpa"):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.heads, self.impl = heads, impl

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)
                   for t in (q, k, v))
        scale = 1.0 / math.sqrt(d // self.heads)
        if self.impl == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v)
        elif self.impl == "explicit":
            o = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v
        elif self.impl == "scale_twice":
            o = torch.softmax((q * scale) @ k.transpose(-2, -1) * scale, dim=-1) @ v
        else:
            raise ValueError(self.impl)
        return o.transpose(1, 2).reshape(b, n, d)


def block(impl: str, d: int = 32, heads: int = 4, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(
        embed=nn.Linear(16, d), attn=Attention(d, heads, impl), norm=nn.LayerNorm(d),
        head=nn.Linear(d, 8))).eval()


def variant(model: nn.Module, impl: str) -> nn.Module:
    """The same weights with another attention implementation."""
    m = copy.deepcopy(model)
    m.attn.impl = impl
    return m


def cases(dtype=torch.float32, seed: int = 0):
    fused = block("sdpa", seed=seed).to(dtype)
    x = torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return fused, variant(fused, "explicit"), variant(fused, "scale_twice"), x


def main():
    for dtype in (torch.float32, torch.bfloat16):
        fused, explicit, twice, x = cases(dtype)
        with torch.no_grad():
            diff = (fused(x).double() - explicit(x).double()).abs().max().item()
        v = fpx.classify(fused, explicit, x)
        print(f"--- {dtype}: fused SDPA vs explicit softmax(QK^T)V: max |diff| {diff:.3g}")
        print(v.report())
        w = fpx.classify(twice, explicit, x)
        print(f"--- {dtype}: scale applied twice vs explicit")
        print(w.report())


if __name__ == "__main__":
    main()
