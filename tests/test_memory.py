"""fpx.memory: allocator tuning is opt-in; importing fpx leaves the process's allocator alone."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import fpx
from fpx import memory


def _applied_in_fresh_process(**env):
    code = "import fpx, fpx.memory as m; print(m._applied)"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env),
                         capture_output=True, text=True, check=True).stdout.strip()
    return out


def test_import_does_not_tune_the_allocator():
    env = {k: v for k, v in os.environ.items() if k != "FPX_MALLOC"}
    out = subprocess.run([sys.executable, "-c", "import fpx, fpx.memory as m; print(m._applied)"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
    assert fpx.memory is memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt only")
def test_opt_in_with_fpx_malloc_tune():
    import ctypes
    if not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"):
        pytest.skip("not glibc")
    assert _applied_in_fresh_process(FPX_MALLOC="tune") == "True"
