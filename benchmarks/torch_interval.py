"""fpx.interval on torch modules: overhead vs the module's own eager forward (float32, CPU).

1. ``nn.TransformerEncoderLayer`` (d_model 512, 8 heads, FFN 2048, seq 128, batch 8), eval;
2. a ResNet-style CNN block (conv3x3-BN-ReLU-conv3x3-BN + identity, ReLU; 64 channels, 32x32,
   batch 8), eval.

``fpx.interval(module)(x)`` (the exported program is cached after the first call, as for any
transform; each call reads the parameters afresh, computes the bounds around fpx's execution of
the exported graph, and runs the module once more for its own output, the ``value``) against
``module(x)``, both under ``torch.no_grad()``. Target <= 4x (RENDER: 2.7x average over
Triton's interpreter). Also timed: ``matmul="fast"`` (no exact float64 centre for point
operands), the exported graph executed by fpx alone (the rules' centres: the floor under the
interval transform), and the interval without the module's own run (``own=None``: what the
``value`` costs). Timings are interleaved; medians of the repetitions, the best of the rounds.

``--models``: small real models with random weights -- GPT-2, BERT, Llama and a T5 encoder
from small transformers configs (2 layers, width 128, sequence 32, batch 2; skipped where
transformers is not installed), a 2-layer ``nn.LSTM`` (128) and ``nn.GRU`` -- each with the
interval overhead vs eager, the bound's median width relative to |output|, and
``fpx.stochastic``'s time per sample vs eager ("sr", 8 samples, serial); where torchvision
and timm import, also torchvision resnet18, mobilenet_v3_small, efficientnet_b0, convnext_tiny
and timm convnext_atto, vit_tiny (random weights, batch 2, 64x64; the ViT 224, batch 1).
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
from fpx.transforms.interval import run_interval

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
    ad = adapt(module, (x,))            # the exported graph run by fpx: the rules' centres
    t_eager, t_iv, t_fast, t_np, t_fpx = [], [], [], [], []
    for _ in range(rounds):                             # interleaved
        with torch.no_grad():
            t_eager.append(timeit(lambda: module(x), reps))
            t_iv.append(timeit(lambda: bounded(x), reps))
            t_fast.append(timeit(lambda: fast(x), reps))
            t_np.append(timeit(lambda: ad.fn(*ad.args), reps))
            t_fpx.append(timeit(lambda: run_interval(ad.fn, ad.args, ad.kwargs, False,
                                                     policy=ad.policy), reps))
    te, ti, tf, tn, to = min(t_eager), min(t_iv), min(t_fast), min(t_np), min(t_fpx)
    w = np.asarray(iv.width)
    a = np.abs(y.double().numpy())
    nz = a > 0
    rel = float(np.median(w[nz] / a[nz])) if nz.any() else float("nan")
    print(f"{name}: eager {te * 1e3:.2f} ms, fpx.interval {ti * 1e3:.2f} ms -> {ti / te:.2f}x "
          f"(target <= 4x); matmul='fast' {tf * 1e3:.2f} ms -> {tf / te:.2f}x; the graph in "
          f"fpx alone {tn * 1e3:.2f} ms -> {tn / te:.2f}x; without the own run {to / te:.2f}x; "
          f"median width / |output| {rel:.3g} (nonzero outputs)")
    return dict(eager_ms=round(te * 1e3, 3), interval_ms=round(ti * 1e3, 3),
                overhead=round(ti / te, 3), fast_ms=round(tf * 1e3, 3),
                fast_overhead=round(tf / te, 3), numpy_graph_ms=round(tn * 1e3, 3),
                numpy_graph_overhead=round(tn / te, 3), without_own_run=round(to / te, 3),
                median_rel_width=rel)


def _real_models():
    """name -> (module, input): small configs of the real models users run."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (2, 32), generator=g)
    out = {}
    try:
        import transformers as T
    except ImportError:
        T = None
    if T is not None:
        common = dict(vocab_size=256, max_position_embeddings=64)
        cfgs = {
            "gpt2": lambda: T.GPT2Model(T.GPT2Config(
                n_layer=2, n_head=4, n_embd=128, n_positions=64, vocab_size=256, resid_pdrop=0,
                embd_pdrop=0, attn_pdrop=0, use_cache=False, bos_token_id=0,
                eos_token_id=0)),
            "bert": lambda: T.BertModel(T.BertConfig(
                hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=512, hidden_dropout_prob=0, attention_probs_dropout_prob=0,
                **common), add_pooling_layer=False),
            "llama": lambda: T.LlamaModel(T.LlamaConfig(
                hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=512, use_cache=False, **common)),
            "t5_encoder": lambda: T.T5EncoderModel(T.T5Config(
                vocab_size=256, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_heads=4,
                dropout_rate=0)),
        }
        for name, make in cfgs.items():
            torch.manual_seed(0)
            m = make().eval()
            out[name] = ((lambda m: lambda t: m(t).last_hidden_state)(m), ids)
    out.update(_vision_models())
    x = torch.randn(2, 32, 128, generator=g)
    for name, cls in (("lstm", nn.LSTM), ("gru", nn.GRU)):
        torch.manual_seed(0)
        m = cls(128, 128, num_layers=2, batch_first=True).eval()
        out[name] = ((lambda m: lambda t: m(t)[0])(m), x)
    return out


def _vision_models():
    """name -> (module, input): torchvision and timm models with random weights, batch 2,
    64x64 (timm's ViT at 224, batch 1); none where torchvision cannot be imported (the CUDA
    build of 0.28 beside the CPU torch 2.13 raises RuntimeError at import)."""
    try:
        import timm
        import torchvision.models as tv
    except Exception:
        return {}
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    makers = {
        "tv_resnet18": lambda: tv.resnet18(weights=None),
        "tv_mobilenet_v3_small": lambda: tv.mobilenet_v3_small(weights=None),
        "tv_efficientnet_b0": lambda: tv.efficientnet_b0(weights=None),
        "tv_convnext_tiny": lambda: tv.convnext_tiny(weights=None),
        "timm_convnext_atto": lambda: timm.create_model("convnext_atto", pretrained=False),
        "timm_vit_tiny": lambda: timm.create_model("vit_tiny_patch16_224", pretrained=False),
    }
    x224 = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    out = {}
    for name, make in makers.items():
        torch.manual_seed(0)
        out[name] = (make().eval(), x224 if "vit" in name else x)
    return out


def measure_model(name, fn, x, reps, samples=8, rounds=3):
    """Interval overhead, median relative width and stochastic time per sample, vs eager;
    eager and interval timed in interleaved rounds, the best round of each (a millisecond
    eager run is easily disturbed)."""
    with torch.no_grad():
        y = fn(x)
    iv = fpx.interval(fn)(x)
    st = fpx.stochastic(fn, "sr", samples=samples, seed=0)
    st(x)                                                  # build the program once
    t_eager, t_iv = [], []
    for _ in range(rounds):
        with torch.no_grad():
            t_eager.append(timeit(lambda: fn(x), max(reps, 10)))
            t_iv.append(timeit(lambda: fpx.interval(fn)(x), reps))
    te, ti = min(t_eager), min(t_iv)
    ts = timeit(lambda: st(x), max(1, reps // 2)) / samples
    w, a = np.asarray(iv.width), np.abs(y.double().numpy())
    nz = a > 0
    rel = float(np.median(w[nz] / a[nz])) if nz.any() else float("nan")
    held = bool(iv.contains(y).all())
    print(f"{name}: eager {te * 1e3:.2f} ms, interval {ti / te:.1f}x, median width/|y| "
          f"{rel:.3g}, stochastic {ts / te:.1f}x per sample; bound holds the output: {held}")
    return dict(eager_ms=round(te * 1e3, 3), interval_overhead=round(ti / te, 2),
                median_rel_width=rel, stochastic_per_sample=round(ts / te, 2), held=held)


def main(argv=None):
    import sys
    argv = list(sys.argv[1:] if argv is None else argv)
    models = "--models" in argv
    args = parse_args(__doc__, [a for a in argv if a != "--models"])
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
    real = ({n: measure_model(n, fn, x, reps) for n, (fn, x) in _real_models().items()}
            if models else {})
    print(json.dumps({
        "benchmark": "torch_interval", "allocator": allocator(), "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **{f"encoder_{k}": v for k, v in enc.items()},
        **{f"resblock_{k}": v for k, v in res.items()},
        **({"models": real} if models else {}),
        "target_overhead": 4.0,
        "pass": bool(enc["overhead"] <= 4 and res["overhead"] <= 4)}))


if __name__ == "__main__":
    main()
