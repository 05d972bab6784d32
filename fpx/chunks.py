"""``fpx.chunked``: run a program -- usually a transformed one -- over slices of its batch
axis and assemble the full result, so that a transform's working memory is one slice's."""
from __future__ import annotations

import operator

import numpy as np

from fpx import tree
from fpx.transforms.interval.result import Interval

__all__ = ["chunked"]


def chunked(fn, size, *, in_axes=0, out_axes=0):
    """``chunked(fn, size)(*args)`` is ``fn(*args)``, computed ``size`` rows at a time.

    ``fn`` is any function of arrays, usually a transformed program: ``fpx.interval(f)``,
    ``fpx.stochastic(f, "sr", samples=8)``, ``fpx.trace`` excepted (a trace is not an array).
    Every array leaf of the positional arguments -- NumPy and CuPy arrays, torch tensors,
    ``fpx.Interval`` inputs -- is cut along its axis ``in_axes`` into slices of ``size`` rows
    (views where the array type has them); ``fn`` runs on each slice, and every output leaf --
    an array, a tensor, or an ``Interval``'s ``lo``, ``hi``, ``value`` and ``unstable`` -- is
    written into a result of the full length along ``out_axes``, allocated once.

    **The caller states that the program treats rows independently**: row i of every output
    depends on row i of the split inputs only (elementwise code, a per-row layer or norm, a
    matmul by a weight passed whole). ``chunked`` cannot see inside ``fn``; it checks what it
    can -- that all split inputs have the same number of rows and that every output of every
    slice has as many rows as the slice (a reduction over the batch axis fails that check) --
    and raises ``ValueError`` otherwise.

    ``in_axes``: the batch axis of every positional argument (an int), or one entry per
    positional argument: an int, or None for an argument passed whole to every slice (a weight
    matrix). Keyword arguments are passed whole. ``out_axes``: the batch axis of the outputs
    (1 for ``fpx.stochastic``, whose outputs lead with the sample axis).
    """
    size = operator.index(size)
    if size < 1:
        raise ValueError(f"fpx.chunked: size must be a positive number of rows, not {size}")

    def run(*args, **kwargs):
        axes = _axes_per_arg(in_axes, len(args))
        cut, n = _split_leaves(args, axes)
        sinks, treedef = None, None
        for start in range(0, max(n, 1), size):
            stop = min(start + size, n)
            part = [x if ax is None else _take(x, ax, start, stop) for x, ax in cut]
            out = fn(*_rebuild(args, axes, part), **kwargs)
            leaves, td = tree.flatten(out)
            if sinks is None:
                sinks, treedef = [_sink(x, i, out_axes, n) for i, x in enumerate(leaves)], td
            elif td != treedef:
                raise ValueError("fpx.chunked: the program returned a differently structured "
                                 f"result for rows {start}:{stop}")
            for s, x in zip(sinks, leaves):
                s.put(x, start, stop)
        return tree.unflatten(treedef, [s.result() for s in sinks])

    run.__name__ = f"chunked({getattr(fn, '__name__', 'fn')})"
    run.__doc__ = fn.__doc__
    return run


# -- inputs -------------------------------------------------------------------------------------
def _axes_per_arg(in_axes, n_args):
    if in_axes is None or isinstance(in_axes, int):
        return [in_axes] * n_args
    axes = list(in_axes)
    if len(axes) != n_args:
        raise ValueError(f"fpx.chunked: in_axes has {len(axes)} entries for {n_args} "
                         "positional arguments")
    return axes


def _is_array(x):
    return isinstance(x, Interval) or (hasattr(x, "shape") and hasattr(x, "dtype")
                                       and len(x.shape) > 0)


def _split_leaves(args, axes):
    """(leaf, axis or None) for every leaf of every positional argument, and the rows."""
    cut, n, first = [], None, None
    for i, (a, ax) in enumerate(zip(args, axes)):
        for x in tree.flatten(a)[0]:
            if ax is None or not _is_array(x):
                cut.append((x, None))
                continue
            ax_i = _axis(ax, len(x.shape), f"input leaf of argument {i}")
            rows = x.shape[ax_i]
            if n is None:
                n, first = rows, i
            elif rows != n:
                raise ValueError(f"fpx.chunked: argument {i} has {rows} rows along axis "
                                 f"{ax_i}, argument {first} has {n}: every split input must "
                                 "have the same number of rows")
            cut.append((x, ax_i))
    if n is None:
        raise ValueError("fpx.chunked: no array argument to split (in_axes leaves every "
                         "argument whole)")
    return cut, n


def _rebuild(args, axes, parts):
    it = iter(parts)
    out = []
    for a in args:
        leaves, td = tree.flatten(a)
        out.append(tree.unflatten(td, [next(it) for _ in leaves]))
    return out


def _axis(ax, ndim, what):
    if not -ndim <= ax < ndim:
        raise ValueError(f"fpx.chunked: axis {ax} is out of range for the {ndim}-d {what}")
    return ax % ndim


def _index(axis, start, stop):
    return (slice(None),) * axis + (slice(start, stop),)


def _take(x, axis, start, stop):
    ix = _index(axis, start, stop)
    if isinstance(x, Interval):
        un = None if x.unstable is None else x.unstable[ix]
        return Interval(x.lo[ix], x.hi[ix], x.value[ix], un)
    return x[ix]


# -- outputs ------------------------------------------------------------------------------------
def _sink(x, i, axis, n):
    if isinstance(x, Interval):
        return _IntervalSink(x, i, axis, n)
    if not _is_array(x):
        raise TypeError(f"fpx.chunked: output leaf {i} is a {type(x).__name__}; chunked "
                        "assembles arrays, tensors and Intervals along their batch axis")
    return _ArraySink(x, i, axis, n)


def _empty(like, shape, dtype=None):
    """An uninitialized array of ``like``'s kind (NumPy, CuPy, torch) and device."""
    if hasattr(like, "new_empty"):                                   # torch
        return like.new_empty(shape) if dtype is None else like.new_empty(shape, dtype=dtype)
    xp = np if isinstance(like, np.ndarray) else __import__(type(like).__module__.split(".")[0])
    return xp.empty(shape, like.dtype if dtype is None else dtype)


class _ArraySink:
    """One output leaf of the full length, filled slice by slice."""

    def __init__(self, first, i, axis, n, dtype=None):
        self.i = i
        self.axis = _axis(axis, len(first.shape), f"output leaf {i}")
        shape = list(first.shape)
        shape[self.axis] = n
        self.out = _empty(first, tuple(shape), dtype)

    def put(self, x, start, stop):
        shape = tuple(x.shape) if hasattr(x, "shape") else None
        want = list(self.out.shape)
        want[self.axis] = stop - start
        if shape != tuple(want):
            raise ValueError(
                f"fpx.chunked: output leaf {self.i} of rows {start}:{stop} has shape {shape}, "
                f"expected {tuple(want)} ({stop - start} rows along axis {self.axis}): the "
                "program does not map rows to rows (a reduction or broadcast over the batch "
                "axis?), so it cannot be chunked")
        self.out[_index(self.axis, start, stop)] = x

    def result(self):
        return self.out


class _IntervalSink:
    """An Interval output: its lo, hi and value, its unstable mask once a slice has one, and
    the slices' events (each kind and text once, counts added)."""

    def __init__(self, first, i, axis, n):
        self.parts = [_ArraySink(getattr(first, k), i, axis, n) for k in ("lo", "hi", "value")]
        self.i, self.axis, self.n, self.unstable = i, axis, n, None
        self.events = {}

    def put(self, x, start, stop):
        for s, part in zip(self.parts, (x.lo, x.hi, x.value)):
            s.put(part, start, stop)
        if x.unstable is not None:
            if self.unstable is None:          # earlier slices had none: all stable
                self.unstable = _ArraySink(x.lo, self.i, self.axis, self.n, bool)
                self.unstable.out[...] = False
            self.unstable.put(np.broadcast_to(x.unstable, x.lo.shape), start, stop)
        for e in x.events:
            seen = self.events.get((e.kind, e.what))
            self.events[(e.kind, e.what)] = e if seen is None else \
                type(e)(e.kind, e.what, seen.count + e.count)

    def result(self):
        lo, hi, value = (s.result() for s in self.parts)
        un = None if self.unstable is None else self.unstable.result()
        return Interval._trusted(lo, hi, value, un, self.events.values())
