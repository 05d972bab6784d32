"""fpx on the GPU (CuPy): what the transforms cost on a program whose arrays live on a GPU.

The same MLP as ``benchmarks/interval.py`` (batch 256, width 1024, 4 layers, float32), its
arrays CuPy arrays. ``fpx.interval`` bounds it on host copies (its rules are NumPy calls and
numba kernels: docs/interval.md, "CuPy arrays") and runs the program once more on the GPU for
its value; ``fpx.stochastic`` samples on host copies too. The ratios are against the plain
CuPy MLP (synchronised), and the same transforms on the NumPy twin are printed beside them:
the GPU path costs the host bound plus the transfers. Exits quietly with a JSON note where no
CUDA device is present. Prints a final JSON line.
"""
from __future__ import annotations

import json
import time

import numpy as np

from _timing import parse_args, timeit  # benchmarks/ (the script's folder) is on sys.path
import fpx


def _mlp(xp, batch=256, width=1024, layers=4, seed=0):
    rng = np.random.default_rng(seed)
    ws = [xp.asarray((rng.standard_normal((width, width)) * np.sqrt(2.0 / width))
                     .astype(np.float32)) for _ in range(layers)]
    bs = [xp.asarray((rng.standard_normal(width) * 0.1).astype(np.float32))
          for _ in range(layers)]
    x = xp.asarray(rng.standard_normal((batch, width)).astype(np.float32))

    def mlp(ws, bs, x):
        for i, (w, b) in enumerate(zip(ws, bs)):
            x = x @ w + b
            if i < layers - 1:
                x = np.maximum(x, 0)
        return x
    return mlp, (ws, bs, x)


def main(argv=None):
    args = parse_args(__doc__, argv)
    reps = 3 if args.quick else 10
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:   # no CuPy or no device
        print(json.dumps({"benchmark": "gpu", "skipped": f"{type(e).__name__}: {e}"}))
        return

    def synced(fn):
        def run():
            out = fn()
            cupy.cuda.Device().synchronize()
            return out
        return run

    mlp, dargs = _mlp(cupy)
    _, hargs = _mlp(np)
    bounded = fpx.interval(mlp)
    sampled = fpx.stochastic(mlp, "sr", samples=4, progress=False)
    iv = bounded(*dargs)
    lo, hi = iv.lo.get(), iv.hi.get()
    y = iv.value.get().astype(np.float64)
    sound = bool(((lo <= y) & (y <= hi)).all())
    gpu = {
        "plain": timeit(synced(lambda: mlp(*dargs)), 5 * reps),
        "interval": timeit(synced(lambda: bounded(*dargs)), reps),
        "stochastic_per_sample": timeit(synced(lambda: sampled(*dargs)), max(1, reps // 2)) / 4,
    }
    host = {
        "plain": timeit(lambda: mlp(*hargs), reps),
        "interval": timeit(lambda: bounded(*hargs), reps),
    }
    t0 = time.perf_counter()
    for _ in range(5):
        [a.get() for a in (dargs[2], *dargs[0])]
    transfer = (time.perf_counter() - t0) / 5
    print(f"device: {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    print(f"plain CuPy MLP      {gpu['plain'] * 1e3:9.3f} ms")
    print(f"interval (CuPy)     {gpu['interval'] * 1e3:9.3f} ms  = {gpu['interval'] / gpu['plain']:8.1f}x "
          f"the CuPy MLP, {gpu['interval'] / host['plain']:.2f}x the NumPy MLP")
    print(f"interval (NumPy)    {host['interval'] * 1e3:9.3f} ms  = {host['interval'] / host['plain']:8.2f}x "
          f"the NumPy MLP ({host['plain'] * 1e3:.2f} ms)")
    print(f"stochastic sr/sample{gpu['stochastic_per_sample'] * 1e3:9.3f} ms  = "
          f"{gpu['stochastic_per_sample'] / gpu['plain']:8.1f}x the CuPy MLP")
    print(f"inputs to host      {transfer * 1e3:9.3f} ms; GPU value inside its bound: {sound}")
    print(json.dumps({
        "benchmark": "gpu", "sound": sound,
        "plain_cupy_ms": gpu["plain"] * 1e3, "interval_cupy_ms": gpu["interval"] * 1e3,
        "interval_over_cupy": gpu["interval"] / gpu["plain"],
        "interval_numpy_over_numpy": host["interval"] / host["plain"],
        "interval_cupy_over_interval_numpy": gpu["interval"] / host["interval"],
        "stochastic_per_sample_over_cupy": gpu["stochastic_per_sample"] / gpu["plain"],
    }))


if __name__ == "__main__":
    main()
