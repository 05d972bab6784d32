"""``fpx.reproducible``: the same bits on every machine, thread count, batch size and memory
layout (docs/reproducible.md). Modules: ``interpreter`` (which primitives keep their IEEE
meaning, dtype and environment checks), ``elementwise`` (correctly rounded math, casts),
``sums`` (sums, products and matmul in a stated order), ``exact`` (the exact order's rounding
test and MPFR fallback), ``transform`` (the user's function and ``check``)."""
from fpx.transforms.reproducible import elementwise, sums  # noqa: F401  (register the rules)
from fpx.transforms.reproducible.interpreter import ORDERS, ReproducibleInterpreter
from fpx.transforms.reproducible.transform import fingerprint, reproducible

__all__ = ["reproducible", "fingerprint", "ReproducibleInterpreter", "ORDERS"]
