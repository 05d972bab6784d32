"""fpx: JAX-style floating-point transforms for numerical and deep-learning programs.

    import fpx, fpx.numpy as fnp
    rec = fpx.trace(f)(x)            # what fpx sees: the primitives f executes
    iv = fpx.interval(f)(x)          # sound round-off bounds of f's outputs
    v = fpx.classify(f, y_ref, x)    # roundoff / bug / inconclusive
    s = fpx.stochastic(f, "sr", samples=30)(x)    # randomly rounded samples (leading axis)
    y = fpx.reproducible(f)(x)       # the same bits on every machine, thread count, batch
    y, rep = fpx.abft(f, report=True)(x)   # checksummed GEMMs: detect, locate, correct faults
    y = fpx.inject(fpx.abft(f), fpx.faults.BitFlip(30, where="accumulator"))(x)
    rep = fpx.probe.fuzz("inductor", programs=20)   # fuzz torch.compile, fpx.classify as oracle
    y = fpx.formats.round(x, "bf16", "sr", rng)   # exact integer-domain rounding

See docs/architecture.md for the core (primitives, interpreters, tracers).
"""
from fpx import memory as _memory
_memory._apply_if_asked()   # opt-in allocator tuning (FPX_MALLOC=tune; see fpx.memory)
from fpx import core, formats, policy, primitives  # noqa: F401  (primitives registers the set)
from fpx import numpy  # noqa: F401
from fpx import nn  # noqa: F401
from fpx.core import (EscapedTracerError, FpxError, UnsupportedFunctionError,  # noqa: F401
                      UnsupportedOpError)
from fpx.formats import Format  # noqa: F401
from fpx.transforms.trace import trace  # noqa: F401
from fpx.transforms.interval import Interval, OutsideBoundWarning, interval  # noqa: F401
from fpx.transforms.classify import Verdict, classify  # noqa: F401
from fpx import testing  # noqa: F401
from fpx import metrics  # noqa: F401
from fpx.transforms.stochastic import NestingError, stochastic  # noqa: F401
from fpx.chunks import chunked  # noqa: F401
from fpx.transforms.reproducible import reproducible  # noqa: F401
from fpx.transforms.abft import abft  # noqa: F401  (abft.calibrate, abft.presets)
from fpx.transforms.inject import inject  # noqa: F401
from fpx import faults  # noqa: F401
from fpx import probe  # noqa: F401  (imports no torch)

__version__ = "0.1.0"
__all__ = ["trace", "interval", "stochastic", "reproducible", "abft", "inject", "faults", "probe",
           "chunked", "Interval", "OutsideBoundWarning", "classify", "Verdict",
           "testing", "formats", "policy", "metrics", "numpy", "nn", "core", "Format", "FpxError",
           "UnsupportedOpError", "EscapedTracerError", "UnsupportedFunctionError", "NestingError"]
