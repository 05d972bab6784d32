"""Dispatch overhead: an MLP forward through fpx's eval interpreter vs plain NumPy.

MLP: batch 64, width 512, 4 layers, float32 (matmul + bias + relu per layer, softmax-free).
Measured in one run, interleaved: plain NumPy; the same program written with fpx.numpy
(eager, every op goes through ``bind`` and the eval interpreter); and, for information, the
plain-NumPy program under ``fpx.trace`` (tracer objects + recording).
Target: eval interpreter <= 1.3x plain NumPy. Prints a final JSON line.
"""
from __future__ import annotations

import json
import time

import numpy as np

import fpx
import fpx.numpy as fnp
from _timing import parse_args  # benchmarks/ (the script's folder) is on sys.path


def make(batch=64, width=512, layers=4, seed=0):
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
          for _ in range(layers)]
    bs = [rng.standard_normal(width).astype(np.float32) * 0.1 for _ in range(layers)]
    x = rng.standard_normal((batch, width)).astype(np.float32)
    return x, ws, bs


def mlp_numpy(x, ws, bs):
    for w, b in zip(ws, bs):
        x = np.maximum(x @ w + b, 0)
    return x


def mlp_fpx(x, ws, bs):
    for w, b in zip(ws, bs):
        x = fnp.maximum(fnp.add(fnp.matmul(x, w), b), 0)
    return x


def best_of(fn, reps, inner):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return float(np.median(times))


def main(argv=None):
    args = parse_args(__doc__, argv)
    reps, inner = (7, 20) if args.quick else (21, 50)
    x, ws, bs = make()
    ref = mlp_numpy(x, ws, bs)
    assert np.array_equal(mlp_fpx(x, ws, bs), ref), "eval interpreter changed the result"
    traced = fpx.trace(mlp_numpy)
    assert np.array_equal(traced(x, ws, bs).outputs, ref)
    # interleave the candidates so machine noise hits all of them alike
    t_np, t_fpx, t_tr = [], [], []
    for _ in range(3):
        t_np.append(best_of(lambda: mlp_numpy(x, ws, bs), reps, inner))
        t_fpx.append(best_of(lambda: mlp_fpx(x, ws, bs), reps, inner))
        t_tr.append(best_of(lambda: traced(x, ws, bs), reps, inner))
    t_np, t_fpx, t_tr = min(t_np), min(t_fpx), min(t_tr)
    ratio = t_fpx / t_np
    print(f"plain NumPy MLP forward      {t_np * 1e3:8.3f} ms")
    print(f"fpx.numpy (eval interpreter) {t_fpx * 1e3:8.3f} ms   ratio {ratio:.3f}x  (target <= 1.3x)")
    print(f"plain NumPy under fpx.trace  {t_tr * 1e3:8.3f} ms   ratio {t_tr / t_np:.3f}x  (info)")
    print(json.dumps({"benchmark": "dispatch", "mlp": "64x512x4 float32",
                      "numpy_ms": round(t_np * 1e3, 4), "eval_ms": round(t_fpx * 1e3, 4),
                      "trace_ms": round(t_tr * 1e3, 4), "eval_ratio": round(ratio, 4),
                      "trace_ratio": round(t_tr / t_np, 4), "target_eval_ratio": 1.3,
                      "pass": ratio <= 1.3}))


if __name__ == "__main__":
    main()
