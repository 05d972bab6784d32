"""Keep freed memory for reuse: opt-in glibc ``mallopt`` settings for transform-heavy processes.

fpx's rules make many short-lived multi-MB arrays (bounds, radii, per-sample batches). With
glibc's defaults a freed block at the top of the heap is given back to the kernel
(``M_TRIM_THRESHOLD``, 128 KiB) and blocks above the dynamic ``M_MMAP_THRESHOLD`` are
``mmap``-ed afresh, so the next array of that size page-faults once per 4 KiB page. On a
virtual machine a fault costs microseconds, which can dominate a bound's elementwise passes.

:func:`keep_freed_memory` raises the mmap threshold to its largest allowed value (32 MiB) and
the trim threshold to 1 GiB: arrays up to 32 MiB come from the heap, and freed heap memory is
kept for the next array instead of being unmapped. The price is a resident size that stays at
its peak (memory freed by the program is reused, not returned). It is a process-wide setting,
so fpx never applies it by itself: call :func:`keep_freed_memory`, or set the environment
variable ``FPX_MALLOC=tune`` before importing fpx. Other C libraries (musl, macOS, Windows)
are left alone.
"""
from __future__ import annotations

import ctypes
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20      # glibc's maximum on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 1 << 30

_applied = False


def keep_freed_memory() -> bool:
    """Apply the settings above (once); True where they took effect (glibc on Linux)."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        if not hasattr(libc, "gnu_get_libc_version"):   # not glibc (musl has no mallopt knobs)
            return False
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    _applied = ok
    return ok


def _apply_if_asked():
    """Apply the settings at import only where ``FPX_MALLOC=tune`` asks for them."""
    if os.environ.get("FPX_MALLOC", "").lower() == "tune":
        keep_freed_memory()
