"""``fpx.reproducible``: run a program under docs/reproducible.md's platform-free meaning, and
with ``check=True`` once more under another schedule, comparing the bits."""
from __future__ import annotations

import platform
import sys

import numba
import numpy as np

from fpx import tree
from fpx.core import FpxError, Tracer, is_cupy
from fpx.transform import _has_torch_leaf, adapt, on_host, own, run, wraps
from fpx.transforms.reproducible.interpreter import (ORDERS, SEMANTICS,
                                                     ReproducibleInterpreter,
                                                     check_environment)

__all__ = ["reproducible", "fingerprint"]


def _run(fn, args, kwargs, order, alt):
    def unwrap(interp, x):
        return x.primal if own(interp, x) else x
    return run(lambda p: ReproducibleInterpreter(p, order, alt), Tracer, fn, args, kwargs,
               unwrap)[1]


def _bits_differ(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return True
    if a.dtype.kind not in "fV":
        return not np.array_equal(a, b)
    u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    both_nan = np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))
    return bool(((a.view(u) != b.view(u)) & ~both_nan).any())


def _check(out, run_again):
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        again = run_again()
    finally:
        numba.set_num_threads(threads)
    la, lb = tree.flatten(out)[0], tree.flatten(again)[0]
    for i, (x, y) in enumerate(zip(la, lb)):
        if _bits_differ(x, y):
            raise FpxError(f"fpx.reproducible(check=True): output leaf {i} differs between "
                           f"two schedules -- please report this as a bug")


def fingerprint() -> dict:
    """The environment a result was computed in: ``semantics`` (the version of
    docs/reproducible.md's meaning: equal versions give equal bits), ``fpx``, ``torch`` (the
    version whose ATen programs a torch program's meaning is built from; None when torch is
    not imported) and, for the record, the backends and machine (numpy, numba, gmpy2/MPFR,
    CuPy, Python, OS, CPU architecture), none of which the bits depend on."""
    import gmpy2

    import fpx

    def version(mod):
        m = sys.modules.get(mod)
        return getattr(m, "__version__", None) if m is not None else None
    return {"semantics": SEMANTICS, "fpx": fpx.__version__, "torch": version("torch"),
            "numpy": np.__version__, "numba": numba.__version__, "gmpy2": gmpy2.version(),
            "mpfr": gmpy2.mpfr_version(), "cupy": version("cupy"),
            "python": platform.python_version(), "system": platform.system(),
            "machine": platform.machine()}


def reproducible(f=None, *, order: str = "sequential", check: bool = False,
                 report: bool = False):
    """``reproducible(f, order=..., check=False, report=False)(*args)`` -> ``f``'s outputs, as
    ordinary arrays (tensors, for a torch program) of the program's dtypes, computed with
    every operation's platform-free meaning (docs/reproducible.md): correctly rounded
    elementwise math and sums, dot products and matmuls in ``order`` (``"sequential"``,
    ``"pairwise"`` or ``"exact"``). The same bits on any machine, thread count, batch size
    and memory layout. An operation without a reproducible meaning raises
    :class:`fpx.UnsupportedOpError` naming it.

    ``f``: a NumPy (array-API, ``fpx.numpy``) function, a ``torch.nn.Module`` (its forward
    pass) or a function of torch tensors (a training step too: forward, ``backward()`` and
    an optimizer's step; its updates land in the user's parameters and optimizer state).
    CuPy inputs are copied to the host and the outputs returned as CuPy arrays.

    ``check=True`` runs ``f`` a second time under another schedule (one thread, blocks of
    rows in another order, the transposed BLAS product) and raises :class:`fpx.FpxError` if
    any bit differs (not for torch programs run eagerly -- functions of tensors, modules
    ``torch.export`` rejects --, which may update state in place).
    ``report=True`` returns ``(outputs, report)``, ``report`` a dict with the ``order``,
    whether it was ``checked`` and the environment's :func:`fingerprint`.
    """
    if order not in ORDERS:
        raise ValueError(f"fpx.reproducible: order must be one of {ORDERS}, not {order!r}")
    if f is None:
        return lambda g: reproducible(g, order=order, check=check, report=report)

    def body(ad):
        if check and ad.framework is not None and ad.program.mode == "dispatch":
            raise ValueError("fpx.reproducible: check=True runs f twice, and a torch program "
                             "run eagerly (a function of tensors, or a module torch.export "
                             "rejects) may update state in place (a training step): compare "
                             "two runs yourself")
        check_environment()
        leaves, td = tree.flatten((ad.args, ad.kwargs))
        gpu = any(is_cupy(x) for x in leaves)
        fn = ad.fn
        if gpu:                 # the rules are CPU code: exact copies, the same bits
            fn, leaves = on_host(fn, leaves)
        args, kwargs = tree.unflatten(td, leaves)
        out = _run(fn, args, kwargs, order, False)
        if check:
            _check(out, lambda: _run(fn, args, kwargs, order, True))
        if gpu and ad.framework is None:
            import cupy
            out = tree.tree_map(lambda x: cupy.asarray(x) if isinstance(
                x, (np.ndarray, np.generic)) else x, out)
        return out

    def call(*args, **kwargs):
        ad = _adapt(f, args, kwargs)
        out = ad.to_user(body(ad))
        if report:
            return out, {"order": order, "checked": bool(check), "fingerprint": fingerprint()}
        return out
    return wraps(f)(call)


reproducible.fingerprint = fingerprint


def _adapt(f, args, kwargs):
    """The adapter's program for ``f``: a function of torch tensors always runs eagerly under
    the dispatch mode (``torch.export`` would trace a training step's ``backward()`` and
    ``optimizer.step()`` with fake tensors, and a training step needs them run for real)."""
    torch = sys.modules.get("torch")
    if torch is not None and not isinstance(f, torch.nn.Module) \
            and _has_torch_leaf((args, kwargs)):
        from fpx.interop.torch.adapter import adapt as torch_adapt
        return torch_adapt(f, args, kwargs, fallback="always")
    return adapt(f, args, kwargs)
