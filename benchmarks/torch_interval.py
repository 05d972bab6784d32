"""fpx.interval on torch modules: overhead vs the module's own eager forward (float32, CPU).

1. ``nn.TransformerEncoderLayer`` (d_model 512, 8 heads, FFN 2048, seq 128, batch 8), eval;
2. a ResNet-style CNN block (conv3x3-BN-ReLU-conv3x3-BN + identity, ReLU; 64 channels, 32x32,
   batch 8), eval.

``fpx.interval(module)(x)`` (the exported program is cached after the first call, as for any
transform; each call reads the parameters afresh and computes value + bounds) against
``module(x)`` under ``torch.no_grad()``. Target <= 4x (RENDER: 2.7x average over Triton's
interpreter). Also timed: ``matmul="fast"`` (no exact float64 centre for point operands) and the
exported graph executed by NumPy alone (the bound's ``value``: the floor under the interval
transform). Timings are interleaved; medians of the repetitions, the best of the rounds.
Prints a final JSON line.
"""
from __future__ import annotations

import json
import warnings

import numpy as np

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:                       # torch is an optional extra: nothing to measure
    if __name__ == "__main__":
        print(json.dumps({"benchmark": "torch_interval", "skipped": "torch is not installed "
                          "(pip install -e '.[torch]')"}))
        raise SystemExit(0)
    raise

from _timing import allocator, parse_args, timeit  # (benchmarks/ is on sys.path)
import fpx
from fpx.transform import adapt

warnings.filterwarnings("ignore")


class BasicBlock(nn.Module):
    def __init__(self, c: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        with torch.no_grad():
            for bn in (self.bn1, self.bn2):
                bn.running_mean.uniform_(-0.1, 0.1)
                bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


def measure(name, module, x, reps, rounds=3):
    bounded = fpx.interval(module)
    fast = fpx.interval(module, matmul="fast")
    iv, iv_fast = bounded(x), fast(x)                   # build (export) the program once
    with torch.no_grad():
        y = module(x)
    assert iv.contains(y).all() and iv_fast.contains(y).all(), \
        f"{name}: module output outside the bound"
    ad = adapt(module, (x,))            # the exported graph run by NumPy: the bound's value
    t_eager, t_iv, t_fast, t_np = [], [], [], []
    for _ in range(rounds):                             # interleaved
        with torch.no_grad():
            t_eager.append(timeit(lambda: module(x), reps))
        t_iv.append(timeit(lambda: bounded(x), reps))
        t_fast.append(timeit(lambda: fast(x), reps))
        t_np.append(timeit(lambda: ad.fn(*ad.args), reps))
    te, ti, tf, tn = min(t_eager), min(t_iv), min(t_fast), min(t_np)
    w = np.asarray(iv.width)
    a = np.abs(y.double().numpy())
    nz = a > 0
    rel = float(np.median(w[nz] / a[nz])) if nz.any() else float("nan")
    print(f"{name}: eager {te * 1e3:.2f} ms, fpx.interval {ti * 1e3:.2f} ms -> {ti / te:.2f}x "
          f"(target <= 4x); matmul='fast' {tf * 1e3:.2f} ms -> {tf / te:.2f}x; the graph in "
          f"NumPy alone {tn * 1e3:.2f} ms -> {tn / te:.2f}x; median width / |output| {rel:.3g} "
          f"(nonzero outputs)")
    return dict(eager_ms=round(te * 1e3, 3), interval_ms=round(ti * 1e3, 3),
                overhead=round(ti / te, 3), fast_ms=round(tf * 1e3, 3),
                fast_overhead=round(tf / te, 3), numpy_graph_ms=round(tn * 1e3, 3),
                numpy_graph_overhead=round(tn / te, 3), median_rel_width=rel)


def main(argv=None):
    args = parse_args(__doc__, argv)
    reps, rounds = (2, 2) if args.quick else (7, 3)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    tel = nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True).eval()
    x_tel = torch.randn(8, 128, 512, generator=g)
    block = BasicBlock().eval()
    x_cnn = torch.randn(8, 64, 32, 32, generator=g)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    enc = measure("TransformerEncoderLayer 512/8, seq 128, batch 8", tel, x_tel, reps, rounds)
    res = measure("ResNet basic block 64ch 32x32, batch 8", block, x_cnn, reps, rounds)
    print(json.dumps({
        "benchmark": "torch_interval", "allocator": allocator(), "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **{f"encoder_{k}": v for k, v in enc.items()},
        **{f"resblock_{k}": v for k, v in res.items()},
        "target_overhead": 4.0,
        "pass": bool(enc["overhead"] <= 4 and res["overhead"] <= 4)}))


if __name__ == "__main__":
    main()
