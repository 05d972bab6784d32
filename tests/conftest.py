"""Shared pytest configuration for the fpx test suite.

``@pytest.mark.gpu`` tests need CuPy and at least one CUDA device; without them they are
skipped cleanly (with the reason), never errored. Triton kernels run in Triton's
interpreter on CPU tensors: ``TRITON_INTERPRET=1`` is set before any test module can import
triton (it reads the variable once, at import).
"""
from __future__ import annotations

import functools
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason() -> str | None:
    """None when CuPy imports and sees a CUDA device, else why not."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install raising at import
        return f"CuPy is not importable ({type(e).__name__}: {e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver / no device
        return f"CuPy has no CUDA device ({type(e).__name__}: {e})"
    if n < 1:
        return "CuPy found no CUDA device"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if it.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test skipped: {reason}")
    for it in gpu_items:
        it.add_marker(skip)
