"""Shadow memory of a Triton launch: one fpx value per torch storage a kernel receives, keyed by
the storage's data pointer, read and written through the kernel's pointers.

A load is a gather (``getitem``: exact) from the storage's flat value, masked lanes taking
``other`` through ``where``; a store appends its values and redirects their element indices, and
the storage's value is rebuilt by one gather the next time it is read. Atomic adds (and max/min)
are collected and applied as one reduction per address -- the initial value and every
program's contribution, padded with exact zeros -- so the reduction rule's bound, valid for every
summation order, covers every order the GPU may run the programs in. The old value an atomic
returns is order-dependent wherever two updates meet one address: it is then a poison value
that raises if the kernel uses it.
"""
from __future__ import annotations

import bisect

import numpy as np

import fpx.numpy as fnp
from fpx.core import FpxError, Tracer
from fpx.interop.triton.builder import Poison, UnsupportedTritonOpError


def _traced(*xs):
    return any(isinstance(x, Tracer) for x in xs)


def _take(flat, idx):
    """``flat[idx]``: a gather (fpx's exact ``getitem`` for a traced value)."""
    return flat[idx] if isinstance(flat, Tracer) else np.take(flat, idx)


def _cat(xs):
    return fnp.concatenate(xs) if _traced(*xs) else np.concatenate(xs)


class Buffer:
    """One storage: ``base`` address, element dtype, its flat fpx value, pending writes."""

    def __init__(self, base: int, flat, dtype):
        self.base, self.dtype = base, np.dtype(dtype)
        self.n, self.flat = int(np.shape(flat)[0]), flat
        self.pieces, self.imap, self.count = None, None, 0     # pending stores
        self.atomics: list = []                                # pending atomic updates
        self.written = False

    @property
    def end(self) -> int:
        return self.base + self.n * self.dtype.itemsize

    def value(self):
        """The storage's flat value with every pending write applied."""
        self._flush_stores()
        self._flush_atomics()
        return self.flat

    def _flush_stores(self):
        if self.pieces is not None:
            self.flat = _take(_cat(self.pieces), self.imap)
            self.pieces = self.imap = None

    def store(self, idx, vals, mask):
        """Write ``vals`` (the shape of ``idx``) at element indices ``idx`` where ``mask``."""
        self._flush_atomics()
        if self.pieces is None:
            self.pieces, self.imap, self.count = [self.flat], np.arange(self.n), self.n
        flat_vals = fnp.reshape(vals, (-1,)) if isinstance(vals, Tracer) else np.ravel(vals)
        k = np.flatnonzero(mask) if mask is not None else np.arange(idx.size)
        self.imap[idx.ravel()[k]] = self.count + k
        self.pieces.append(flat_vals)
        self.count += idx.size
        self.written = True

    def atomic(self, op, idx, vals, mask):
        """Queue ``op`` (add/max/min) of ``vals`` at ``idx`` where ``mask``; return the old
        values where no other update meets the same address, else a :class:`Poison`."""
        self._flush_stores()
        if self.atomics and self.atomics[0][0] != op:
            self._flush_atomics()
        k = np.flatnonzero(mask) if mask is not None else np.arange(idx.size)
        tgt = idx.ravel()[k]
        earlier = np.concatenate([a[1] for a in self.atomics]) if self.atomics else tgt[:0]
        clash = len(np.unique(tgt)) < len(tgt) or np.isin(tgt, earlier).any()
        old = Poison(f"atomic_{op}") if clash else _take(self.flat, idx)
        flat_vals = fnp.reshape(vals, (-1,)) if isinstance(vals, Tracer) else np.ravel(vals)
        self.atomics.append((op, tgt, flat_vals, k))
        self.written = True
        return old

    def _flush_atomics(self):
        if not self.atomics:
            return
        op = self.atomics[0][0]
        vals, pos, tgt, off = [], [], [], 0
        for _, t, v, k in self.atomics:
            vals.append(v)
            pos.append(k + off)
            tgt.append(t)
            off += int(np.shape(v)[0])
        self.atomics = []
        tgt, pos = np.concatenate(tgt), np.concatenate(pos)
        order = np.argsort(tgt, kind="stable")
        tgt, pos = tgt[order], pos[order]
        u, start, counts = np.unique(tgt, return_index=True, return_counts=True)
        width = 1 + int(counts.max())
        n, m = self.n, off
        pad = n + m                                 # the index of an exact zero
        mat = np.full((len(u), width), pad, dtype=np.int64) if op == "add" else \
            np.repeat(u[:, None], width, axis=1)
        mat[:, 0] = u
        col = np.arange(len(tgt)) - np.repeat(start, counts)
        mat[np.repeat(np.arange(len(u)), counts), 1 + col] = n + pos
        z = _cat([self.flat] + vals + [np.zeros(1, self.dtype)])
        rows = _take(z, mat)
        red = {"add": fnp.sum, "max": fnp.max, "min": fnp.min}[op]
        if isinstance(rows, Tracer) or (op == "add" and self.dtype.kind in "fV"):
            new = red(rows, axis=1)                  # float sums round, constants too
        else:
            new = {"add": np.sum, "max": np.max, "min": np.min}[op](rows, axis=1).astype(
                self.dtype)
        imap = np.arange(n)
        imap[u] = n + np.arange(len(u))
        self.flat = _take(_cat([self.flat, new]), imap)


class Memory:
    """The shadow memory of one launch: buffers by address range."""

    def __init__(self):
        self.buffers: list[Buffer] = []
        self._bases: list[int] = []

    def add(self, buf: Buffer):
        i = bisect.bisect(self._bases, buf.base)
        self._bases.insert(i, buf.base)
        self.buffers.insert(i, buf)

    def _locate(self, ptrs, mask, dtype, what):
        p = np.asarray(ptrs, dtype=np.uint64)
        live = p[np.broadcast_to(mask, p.shape)] if mask is not None else p.ravel()
        if live.size == 0:
            return None, None
        lo, hi = int(live.min()), int(live.max())
        i = bisect.bisect(self._bases, lo) - 1
        buf = self.buffers[i] if i >= 0 else None
        if buf is None or hi >= buf.end:
            raise FpxError(f"fpx.interop.triton: a {what} reaches addresses [{lo:#x}, {hi:#x}] "
                           "outside any single tensor passed to the launch (out of bounds, or "
                           "one access spanning several tensors)")
        if np.dtype(dtype) != buf.dtype:
            raise UnsupportedTritonOpError(what, f"through a {np.dtype(dtype)} pointer into a "
                                                 f"{buf.dtype} tensor")
        rel = p.astype(np.int64) - buf.base
        if mask is not None:
            rel = np.where(mask, rel, 0)
        if np.any(rel % buf.dtype.itemsize):
            raise FpxError(f"fpx.interop.triton: a misaligned {what}")
        return buf, rel // buf.dtype.itemsize

    def load(self, ptrs, mask, other, dtype):
        shape = np.broadcast_shapes(np.shape(ptrs), np.shape(mask) if mask is not None else ())
        ptrs = np.broadcast_to(ptrs, shape)
        if mask is not None:
            mask = np.broadcast_to(mask, shape)
        buf, idx = self._locate(ptrs, mask, dtype, "load")
        if other is None:
            other = np.zeros((), dtype)
        if buf is None:
            return fnp.broadcast_to(other, shape) if isinstance(other, Tracer) else \
                np.broadcast_to(np.asarray(other, dtype), shape)
        v = _take(buf.value(), idx)
        if mask is None or mask.all():
            return v
        if _traced(v, other):
            return fnp.where(mask, v, other)
        return np.where(mask, v, np.asarray(other, dtype))

    def store(self, ptrs, vals, mask):
        shape = np.broadcast_shapes(np.shape(ptrs), np.shape(vals), (
            np.shape(mask) if mask is not None else ()))
        ptrs = np.broadcast_to(ptrs, shape)
        if mask is not None:
            mask = np.broadcast_to(mask, shape)
        buf, idx = self._locate(ptrs, mask, vals.dtype, "store")
        if buf is None:
            return
        if tuple(np.shape(vals)) != shape:
            vals = fnp.broadcast_to(vals, shape) if isinstance(vals, Tracer) else \
                np.broadcast_to(vals, shape)
        buf.store(idx, vals, None if mask is None else mask.ravel())

    def atomic(self, op, ptrs, vals, mask, programs=1):
        """``op`` at ``ptrs`` by each of ``programs`` programs (an update the same in every
        program still happens once per program: the leading axis is widened to them)."""
        shape = np.broadcast_shapes(np.shape(ptrs), np.shape(vals), (
            np.shape(mask) if mask is not None else ()))
        shape = np.broadcast_shapes(shape, (programs,) + (1,) * (len(shape) - 1))
        ptrs = np.broadcast_to(ptrs, shape)
        if mask is not None:
            mask = np.broadcast_to(mask, shape)
        buf, idx = self._locate(ptrs, mask, vals.dtype, f"atomic_{op}")
        if buf is None:
            return np.zeros(shape, vals.dtype)
        if tuple(np.shape(vals)) != shape:
            vals = fnp.broadcast_to(vals, shape) if isinstance(vals, Tracer) else \
                np.broadcast_to(vals, shape)
        kind = {"fadd": "add", "add": "add", "max": "max", "min": "min", "umax": "max",
                "umin": "min"}.get(op)
        if kind is None:
            if op == "xchg":
                return self._xchg(buf, idx, vals, mask)
            raise UnsupportedTritonOpError(f"atomic_{op}")
        if kind == "add" and np.dtype(vals.dtype).kind in "iu":
            return self._int_add(buf, idx, vals, mask)
        return buf.atomic(kind, idx, vals, None if mask is None else mask.ravel())

    def _xchg(self, buf, idx, vals, mask):
        live = idx[mask] if mask is not None else idx.ravel()
        if len(np.unique(live)) < len(live):
            raise UnsupportedTritonOpError("atomic_xchg", "several programs exchange one "
                                                          "address: the result is order-dependent")
        old = _take(buf.value(), idx)
        buf.store(idx, vals, None if mask is None else mask.ravel())
        return old

    def _int_add(self, buf, idx, vals, mask):
        """Integer atomic adds: exact, applied in grid order (old values as the programs
        would see them run one after another)."""
        flat = np.array(buf.value())
        v = np.broadcast_to(np.asarray(vals), idx.shape).ravel()
        live = np.ones(idx.size, bool) if mask is None else mask.ravel()
        old = np.zeros(idx.size, flat.dtype)
        for j in np.flatnonzero(live):
            t = idx.ravel()[j]
            old[j] = flat[t]
            flat[t] = flat[t] + v[j]
        buf.flat, buf.written = flat, True
        return old.reshape(idx.shape)

    def snapshot(self):
        return [(b, b.flat, None if b.pieces is None else list(b.pieces), None if b.imap is None else b.imap.copy(), b.count,
                 list(b.atomics), b.written) for b in self.buffers]

    def restore(self, snap):
        for b, flat, pieces, imap, count, atomics, written in snap:
            b.flat, b.imap, b.count, b.atomics, b.written = flat, imap, count, atomics, written
            b.pieces = None if pieces is None else list(pieces)
