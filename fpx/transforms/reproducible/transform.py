"""``fpx.reproducible``: run a program under docs/reproducible.md's platform-free meaning, and
with ``check=True`` once more under another schedule, comparing the bits."""
from __future__ import annotations

import numba
import numpy as np

from fpx import tree
from fpx.core import FpxError, Tracer, is_cupy
from fpx.transform import own, run, transformed
from fpx.transforms.reproducible.interpreter import (ORDERS, ReproducibleInterpreter,
                                                     check_environment)

__all__ = ["reproducible"]


def _run(ad, order, alt):
    def unwrap(interp, x):
        return x.primal if own(interp, x) else x
    return run(lambda p: ReproducibleInterpreter(p, order, alt), Tracer, ad.fn, ad.args,
               ad.kwargs, unwrap)[1]


def _bits_differ(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return True
    if a.dtype.kind not in "fV":
        return not np.array_equal(a, b)
    u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    both_nan = np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))
    return bool(((a.view(u) != b.view(u)) & ~both_nan).any())


def _check(out, ad, order):
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        again = _run(ad, order, True)
    finally:
        numba.set_num_threads(threads)
    la, lb = tree.flatten(out)[0], tree.flatten(again)[0]
    for i, (x, y) in enumerate(zip(la, lb)):
        if _bits_differ(x, y):
            raise FpxError(f"fpx.reproducible(check=True): output leaf {i} differs between "
                           f"two schedules -- please report this as a bug")


def reproducible(f=None, *, order: str = "sequential", check: bool = False):
    """``reproducible(f, order=..., check=False)(*args)`` -> ``f``'s outputs, as ordinary
    arrays of the program's dtypes, computed with every operation's platform-free meaning
    (docs/reproducible.md): correctly rounded elementwise math and sums, dot products and
    matmuls in ``order`` (``"sequential"``, ``"pairwise"`` or ``"exact"``). The same bits on
    any machine, thread count, batch size and memory layout. An operation without a
    reproducible meaning raises :class:`fpx.UnsupportedOpError` naming it.

    ``check=True`` runs ``f`` a second time under another schedule (one thread, blocks of
    rows in another order, the transposed BLAS product) and raises :class:`fpx.FpxError` if
    any bit differs.
    """
    if order not in ORDERS:
        raise ValueError(f"fpx.reproducible: order must be one of {ORDERS}, not {order!r}")
    if f is None:
        return lambda g: reproducible(g, order=order, check=check)

    def body(ad):
        if ad.framework is not None:
            raise NotImplementedError("fpx.reproducible: torch programs are not supported "
                                      "yet (NumPy programs are)")
        if any(is_cupy(x) for x in tree.flatten((ad.args, ad.kwargs))[0]):
            raise NotImplementedError("fpx.reproducible: CuPy arrays are not supported yet")
        check_environment()
        out = _run(ad, order, False)
        if check:
            _check(out, ad, order)
        return out
    return transformed(f, body)
