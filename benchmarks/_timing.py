"""Shared timing helper of the benchmarks: median wall time of repeated calls."""
from __future__ import annotations

import time

import numpy as np


def timeit(fn, reps):
    """Median seconds of ``reps`` calls of ``fn`` after one warm-up call."""
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))
