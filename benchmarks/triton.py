"""fpx.interop.triton: cost of ``fpx.interval(launch)`` against the plain interpreted launch.

Kernels from ``tests/test_triton_kernels.py`` (RENDER's cases), CPU tensors, Triton's
interpreter (``TRITON_INTERPRET=1``):

* the tutorial matmul, float16, 512^3 (``--quick``: 256^3), blocks 64x64x32;
* the fused attention forward (online softmax with exp2), float16, 512 queries and keys, head
  dim 64 (``--quick``: 256), blocks 64x64;
* split-K float32 with atomic_add, 256x256x2048, split 4 (``--quick``: 128x128x1024).

Target: fpx.interval(launch) <= 2x the plain interpreted launch (RENDER: 1.4-8x warm, 12-39x
cold). fpx runs all programs of a grid at once where the kernel's control flow allows, so it
may be faster than the stock interpreter, which runs them one by one. Warm times are medians
after a warm-up; "cold" is the first call (the program built, numba kernels loaded). Ends with
one JSON line.
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"
_HERE = os.path.dirname(os.path.abspath(__file__))
# this script is named triton.py: take its folder off the path while the real package loads
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
import triton  # noqa: E402,F401
sys.path += [_HERE, os.path.join(_HERE, "..", "tests")]

import numpy as np  # noqa: E402
import torch  # noqa: E402

from _timing import parse_args, timeit  # noqa: E402
import fpx  # noqa: E402
from test_triton_kernels import attention, matmul, splitk  # noqa: E402


def cases(quick):
    g = torch.Generator().manual_seed(0)
    n = 256 if quick else 512
    a, b = torch.randn(n, n, generator=g).half(), torch.randn(n, n, generator=g).half()
    s = 256 if quick else 512
    q, k, v = (torch.randn(s, 64, generator=g).half() for _ in range(3))
    m, kk = (128, 1024) if quick else (256, 2048)
    sa, sb = torch.randn(m, kk, generator=g), torch.randn(kk, m, generator=g)
    return [
        (f"matmul fp16 {n}^3", lambda a, b: matmul(a, b, block=(64, 64, 32)), (a, b),
         a.double() @ b.double()),
        (f"attention fp16 {s}x{s}x64", lambda q, k, v: attention(q, k, v, BM=64, BN=64),
         (q, k, v), torch.softmax(q.double() @ k.double().T / 8, 1) @ v.double()),
        (f"split-K fp32 {m}x{m}x{kk}", lambda a, b: splitk(a, b, block=(64, 64, 64)),
         (sa, sb), sa.double() @ sb.double()),
    ]


def main(argv=None):
    args = parse_args(__doc__, argv)
    reps = 3 if args.quick else 5
    rows = {}
    print(f"{'case':32s} {'plain':>9s} {'interval':>9s} {'ratio':>6s} {'cold':>8s} "
          f"{'ref in bound':>12s}")
    for name, f, xs, ref in cases(args.quick):
        t0 = time.perf_counter()
        iv = fpx.interval(f)(*xs)
        cold = time.perf_counter() - t0
        r = ref.numpy()
        ok = bool(np.all(iv.lo <= r) and np.all(r <= iv.hi))
        plain = timeit(lambda: f(*xs), reps)
        bound = timeit(lambda: fpx.interval(f)(*xs), reps)
        rows[name] = dict(plain_s=plain, interval_s=bound, ratio=bound / plain,
                          cold_ratio=cold / plain, reference_inside=ok,
                          median_width=float(np.median(iv.hi - iv.lo)))
        print(f"{name:32s} {plain:9.3f} {bound:9.3f} {bound / plain:6.2f} {cold / plain:8.2f} "
              f"{str(ok):>12s}")
    print(json.dumps({"benchmark": "triton", "quick": args.quick, "target_ratio": 2.0,
                      "cases": rows}))


if __name__ == "__main__":
    main()
