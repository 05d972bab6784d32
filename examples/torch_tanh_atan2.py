"""A hand-written tanh followed by atan2, against torch.tanh followed by atan2.

``hand_tanh(x) = 2 / (1 + exp(-2x)) - 1`` is tanh in real arithmetic, but near 0 the final
``- 1`` cancels: its relative error grows like ``u / |x|`` (1e-4 at |x| ~ 1e-3 in float32), and
for |x| below ~3e-8 it returns +0 whatever the sign of x. Feed it to ``atan2(y, x)`` with a
negative ``x``: where ``hand_tanh`` gives +0 and ``torch.tanh`` a tiny negative number, the angle
jumps from -pi to +pi -- a 2*pi disagreement from a formula that is exact in real arithmetic.

What fpx says (rigorous and probabilistic bounds alike):

* the ~1e-4 relative deviations lie inside the target's bound: the cancellation *is* the
  target's own round-off (Type-I);
* the 2*pi jumps lie inside too, but only because the bound there is atan2's whole range
  ``[-pi, pi]``: the target's round-off can give ``hand_tanh`` either sign, which selects the
  branch. fpx marks those elements unstable and the report notes the branch cut: the verdict
  "round-off" rests on a discontinuity, so the formula is unstable there (use ``torch.tanh``,
  or ``-expm1(-2x) / (1 + exp(-2x))``, which keep the sign).

The probabilistic bound only narrows long sums (Higham & Mary's sqrt(n)); this program has
none, so it says the same. A tool whose bound missed the branch cut (endpoint-only atan2) or
the cancellation would call the 2*pi jumps a bug -- wrongly; one that says round-off without
flagging the branch cut hides the instability.
Run: ``python examples/torch_tanh_atan2.py``.
"""
from __future__ import annotations

import torch

import fpx


def hand_tanh(x):
    return 2 / (1 + torch.exp(-2 * x)) - 1


def target(y, x):
    return torch.atan2(hand_tanh(y), hand_tanh(x))


def reference(y, x):
    return torch.atan2(torch.tanh(y), torch.tanh(x))


def inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = torch.cat([torch.randn(8, generator=g) * 1e-3,
                   torch.tensor([-1e-9, -3e-8, 2e-4, -5e-3])])
    x = torch.cat([-torch.rand(8, generator=g) * 1e-3 - 1e-4,
                   torch.tensor([-0.5, -1e-3, -1e-4, -0.25])])
    return y, x


def main():
    y, x = inputs()
    t, r = target(y, x), reference(y, x)
    print("max |target - reference|:", (t - r).abs().max().item())
    for bound in ("rigorous", "probabilistic"):
        v = fpx.classify(target, reference, y, x, bound=bound)
        print(f"--- {bound} bound")
        print(v.report())
        jumps = [i for i in range(len(t)) if abs(t[i] - r[i]) > 6]
        iv = v.target
        print("  elements that jump by 2*pi:", jumps, "bounds there:",
              [(round(float(iv.lo[i]), 5), round(float(iv.hi[i]), 5)) for i in jumps],
              "unstable:", [bool(iv.unstable[i]) for i in jumps])


if __name__ == "__main__":
    main()
