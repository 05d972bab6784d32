"""``fpx.testing``: assertions that know what round-off can do.

``assert_close(actual, expected, fn=f, args=(x,))`` is a drop-in for
``np.testing.assert_allclose`` / ``torch.testing.assert_close`` in kernel tests: it passes when
the difference between ``actual`` and ``expected`` is explained by the round-off of ``fn`` on
``args`` (fpx's sound interval bound), and fails with fpx's diagnosis otherwise.
"""
from __future__ import annotations

import numpy as np

from fpx import tree
from fpx.transforms.classify import classify
from fpx.core import concrete, to_host
from fpx.transform import as_array

__all__ = ["assert_close"]


def assert_close(actual, expected, *, fn, args=(), kwargs=None, policy=None,
                 bound: str = "rigorous", allow_inconclusive: bool = False, **options):
    """Pass when ``expected`` lies within the round-off bound of ``fn(*args)`` and so does
    ``actual`` (an execution of ``fn`` -- on another device, in another summation order -- must
    be inside its own bound). Fails with ``Verdict.report()`` otherwise. ``expected`` may also
    be a function (its own round-off is then bounded too). Works on NumPy and CuPy arrays,
    and on torch: ``actual``/``expected`` may be torch tensors and ``fn`` (or ``expected``) a
    ``torch.nn.Module`` or a function of torch tensors (``fpx.transform.adapt``). ``args`` is
    the tuple of positional arguments; anything else (an array, a list) is one argument.
    """
    kwargs = kwargs or {}
    if not isinstance(args, tuple):      # one argument (an array is not unpacked)
        args = (args,)
    verdict = classify(fn, expected, *args, policy=policy, bound=bound, layers=False,
                       **options, **kwargs)
    problems = []
    if verdict.kind == "bug" or (verdict.kind == "inconclusive" and not allow_inconclusive):
        problems.append(verdict.report())
    t_leaves, _ = tree.flatten(verdict.target)
    a_leaves, _ = tree.flatten(actual)
    if len(a_leaves) != len(t_leaves):
        raise AssertionError(f"fpx.testing.assert_close: `actual` has {len(a_leaves)} outputs, "
                             f"fn has {len(t_leaves)}")
    for i, (iv, a) in enumerate(zip(t_leaves, a_leaves)):
        a = to_host(concrete(as_array(a)))
        if a.shape != iv.shape:
            raise AssertionError(f"fpx.testing.assert_close: output {i}: actual shape "
                                 f"{a.shape} != fn's {iv.shape}")
        lo, hi = to_host(iv.lo), to_host(iv.hi)
        a64 = a.astype(np.float64)
        inside = (lo <= a64) & (a64 <= hi)
        both_nan = np.isnan(a64) & np.isnan(lo)
        own = to_host(concrete(as_array(iv.value))).astype(np.float64)
        # fn's own result is a possible result, whatever its bounds (inf with NaN bounds)
        bad = ~inside & ~both_nan & ~(a64 == own)
        if np.any(bad):
            idx = tuple(int(j) for j in np.argwhere(bad)[0])
            problems.append(
                f"`actual` output {i} is not a possible result of fn on these inputs at "
                f"{np.count_nonzero(bad)} element(s), e.g. {list(idx)}: {float(a[idx]):.9g} not "
                f"in [{float(lo[idx]):.9g}, {float(hi[idx]):.9g}]")
    if problems:
        raise AssertionError("\n".join(problems))
    return verdict
