"""fpx.memory: the allocator settings fpx applies at import, and the opt-out."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import fpx
from fpx import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt only")
def test_applied_at_import_on_glibc_and_idempotent():
    import ctypes
    if not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"):
        pytest.skip("not glibc")
    assert memory._applied is (os.environ.get("FPX_MALLOC", "").lower() != "system")
    assert memory.keep_freed_memory() is True
    assert memory.keep_freed_memory() is True


def test_opt_out_with_fpx_malloc_system():
    code = "import fpx, fpx.memory as m; print(m._applied)"
    env = dict(os.environ, FPX_MALLOC="system")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
    assert fpx.memory is memory
