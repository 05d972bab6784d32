"""Shared helpers of the benchmarks: median wall time of repeated calls, the --quick flag."""
from __future__ import annotations

import argparse
import time

import numpy as np


def times(fn, reps):
    """Seconds of each of ``reps`` calls of ``fn`` in a row, after one warm-up call."""
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def timeit(fn, reps):
    """Median seconds of ``reps`` calls of ``fn`` after one warm-up call."""
    return float(np.median(times(fn, reps)))


def parse_args(doc, argv=None):
    """The benchmarks' command line: ``--quick`` (fewer repetitions, under a minute). Prints
    the allocator setting the run measures (fpx leaves glibc's alone unless FPX_MALLOC=tune)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (< 1 minute)")
    args = ap.parse_args(argv)
    print(f"allocator: {allocator()}")
    return args


def allocator():
    """"tuned" where fpx.memory's glibc settings are in force (FPX_MALLOC=tune), else
    "default"."""
    from fpx import memory
    return "tuned" if memory._applied else "default"


def warm_up(fn, seconds=1.5, calls=200):
    """Call ``fn`` until the process's heap has grown to its steady size (at most ``seconds``
    or ``calls``): the first few dozen calls of a transform page-fault fresh heap memory (the
    resident size of a 512x512 interval matmul loop grows ~275 MB, then stays), which would
    otherwise land in the first timed rounds."""
    import time
    t_end = time.perf_counter() + seconds
    for _ in range(calls):
        fn()
        if time.perf_counter() > t_end:
            break

