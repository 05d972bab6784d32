"""fpx.reproducible: the cost of the same bits everywhere, against plain NumPy.

1. float32 matmul n = 1024 (512 with ``--quick``) under ``order="sequential"`` and
   ``order="exact"`` vs ``np.matmul`` (BLAS, free to pick any order), the fastest of
   repeated calls, with the load average. Targets: <= 3x and <= 6x (ReproBLAS: 4x MKL for
   ddot, 12.6x for dgemm).
2. Correctly rounded exp on 10^7 float32 (10^6 with ``--quick``) vs ``np.exp`` (NumPy's SIMD
   kernel, up to 2.3 ulp). Target <= 3x.
3. A float32 MLP forward (batch 256, 784-512-512-10, tanh, softmax) under each order vs plain.
4. The same MLP as a torch module (where torch is installed): its forward, and a training step
   (forward, cross-entropy, ``loss.backward()``, SGD with momentum) under ``sequential`` vs
   plain torch (MKL, threads).

Ends with one JSON line.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import allocator, parse_args, timeit, times  # noqa: E402

import fpx  # noqa: E402
import fpx.nn as fnn  # noqa: E402


def _load():
    """The 1-minute load average (the machine may be shared: read the ratios next to it)."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def _fastest(fns, reps):
    """Fastest wall time of each function over ``reps`` calls in a row (after one warm-up
    call). In a row, not interleaved: right after a GEMM, OpenBLAS's threads spin for a while
    and take the cores from the next library's threads (a kernel of 1.6 ms took 4.9 ms right
    after np.matmul)."""
    return {name: min(times(fn, reps)) for name, fn in fns.items()}


def mlp(x, w1, w2, w3):
    h = np.tanh(x @ w1)
    h = np.tanh(h @ w2)
    return fnn.softmax(h @ w3, axis=-1)


def main(argv=None):
    args = parse_args(__doc__, argv)
    reps = 3 if args.quick else 7
    rng = np.random.default_rng(0)
    n = 512 if args.quick else 1024
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    fns = {"numpy": lambda: np.matmul(a, b),
           **{o: (lambda o=o: fpx.reproducible(np.matmul, order=o)(a, b))
              for o in ("sequential", "pairwise", "exact")}}
    t = _fastest(fns, 2 * reps)
    t_np = t.pop("numpy")
    r = {o: v / t_np for o, v in t.items()}
    print(f"matmul n={n} float32 (load {_load()}): np.matmul {t_np * 1e3:.1f} ms; " + ", ".join(
        f"{o} {v * 1e3:.1f} ms ({r[o]:.1f}x)" for o, v in t.items()))

    m = 10 ** 6 if args.quick else 10 ** 7
    x = (rng.standard_normal(m) * 20).astype(np.float32)
    with np.errstate(over="ignore"):
        t_exp_np = timeit(lambda: np.exp(x), reps)
    cr_exp = fpx.reproducible(np.exp)
    t_exp = timeit(lambda: cr_exp(x), reps)
    r_exp = t_exp / t_exp_np
    print(f"exp on {m:.0e} float32: np.exp {t_exp_np * 1e3:.1f} ms, correctly rounded "
          f"{t_exp * 1e3:.1f} ms ({r_exp:.1f}x)")

    ws = [(rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
          for s in ((784, 512), (512, 512), (512, 10))]
    xb = rng.standard_normal((256, 784)).astype(np.float32)
    t_mlp = timeit(lambda: mlp(xb, *ws), reps)
    t_m = {o: timeit(lambda o=o: fpx.reproducible(mlp, order=o)(xb, *ws), reps)
           for o in ("sequential", "exact")}
    print(f"MLP 256x784-512-512-10: plain {t_mlp * 1e3:.1f} ms; " + ", ".join(
        f"{o} {v * 1e3:.1f} ms ({v / t_mlp:.1f}x)" for o, v in t_m.items()))
    torch_r = _torch_mlp(reps, xb, ws)
    print(json.dumps({
        "benchmark": "reproducible", "allocator": allocator(), "matmul_n": n,
        "load_avg": _load(), "matmul_numpy_ms": round(t_np * 1e3, 2),
        **{f"matmul_{o}_ratio": round(v, 2) for o, v in r.items()},
        "target_sequential_ratio": 3.0, "target_exact_ratio": 6.0,
        "exp_n": m, "exp_numpy_ms": round(t_exp_np * 1e3, 2), "exp_ratio": round(r_exp, 2),
        "target_exp_ratio": 3.0, "mlp_plain_ms": round(t_mlp * 1e3, 2),
        **{f"mlp_{o}_ratio": round(v / t_mlp, 2) for o, v in t_m.items()},
        **torch_r,
        "pass": bool(r["sequential"] <= 3 and r["exact"] <= 6 and r_exp <= 3)}))


def _torch_mlp(reps, xb, ws):
    """The MLP as a torch module: forward and one SGD training step, reproducible vs plain
    (ratios; {} without torch)."""
    try:
        import torch
    except ImportError:
        return {}
    nn, F = torch.nn, torch.nn.functional
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(784, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(),
                        nn.Linear(512, 10))
    with torch.no_grad():
        for lin, w in zip(net[::2], ws):
            lin.weight.copy_(torch.from_numpy(w.T.copy()))
    x, y = torch.from_numpy(xb), torch.arange(len(xb)) % 10
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss
    with torch.no_grad():
        t_fwd = timeit(lambda: net(x), reps)
    t_fwd_r = timeit(lambda: fpx.reproducible(net.eval())(x), reps)
    t_step = timeit(lambda: step(x, y), reps)
    t_step_r = timeit(lambda: fpx.reproducible(step)(x, y), reps)
    print(f"torch MLP: forward plain {t_fwd * 1e3:.1f} ms, reproducible {t_fwd_r * 1e3:.1f} ms "
          f"({t_fwd_r / t_fwd:.1f}x); training step plain {t_step * 1e3:.1f} ms, "
          f"reproducible {t_step_r * 1e3:.1f} ms ({t_step_r / t_step:.1f}x)")
    return {"torch_mlp_forward_plain_ms": round(t_fwd * 1e3, 2),
            "torch_mlp_forward_ratio": round(t_fwd_r / t_fwd, 2),
            "torch_train_step_plain_ms": round(t_step * 1e3, 2),
            "torch_train_step_ratio": round(t_step_r / t_step, 2)}


if __name__ == "__main__":
    main()
