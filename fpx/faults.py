"""Fault models for ``fpx.inject``: :class:`BitFlip` (a single-event upset in one bit of a
value's own format), :class:`Value` (an element overwritten, PyTorchFI's value injection), and
PyTorchFI's vocabulary :func:`neuron` / :func:`weight` (faults by layer name).

Where a fault lands (``where``):

* ``"output"``: the op's result -- for a GEMM, its output in the output format (after the
  float32 accumulator is rounded to bf16/fp16, where it is);
* ``"accumulator"``: a GEMM's accumulator before that rounding (float32 for bf16/fp16/fp8
  inputs; the same value as the output for float32/float64 GEMMs);
* ``"input"``, ``"weight"``: an element of the op's operand as the op reads it (for a layer,
  its activation input and its weight; for a bare matmul, the left and right operand).

Which applications (``op``): None -- every GEMM (matmul, linear, conv, einsum, ...); an int n --
the n-th GEMM of the run (0-based; PyTorchFI's layer number); a string -- a primitive or
composite name (``"matmul"``, ``"linear"``, ``"conv"``, ``"exp"``, ``"add"``) or a torch
layer's name (``"fc1"``, ``"features.0"``). ``call``: only the call-th matching application
(0-based). ``prob``: each matching application is hit with this probability.

Which element (``index``): None or ``"random"`` -- one element drawn at random per hit; an int
(flat, C order, negative from the end) or a tuple (multi-index). Random draws are
counter-based: ``seed``, the fault's position and the application's count give the stream, so
a run is the same on every machine.

Bits are numbered from the least significant bit of the value's format: bfloat16 15 is the
sign, 14..7 the exponent, 6..0 the significand; float32 31, 30..23, 22..0.
"""
from __future__ import annotations

import numpy as np

__all__ = ["Fault", "BitFlip", "Value", "neuron", "weight", "flip_bit", "WHERE"]

WHERE = ("output", "accumulator", "input", "weight")


class Fault:
    """What every fault shares: ``where``, ``index``, ``op``, ``call``, ``prob``, ``seed``."""

    def __init__(self, where="output", index=None, op=None, call=None, prob=1.0, seed=0):
        if where not in WHERE:
            raise ValueError(f"fpx.faults: where must be one of {WHERE}, got {where!r}")
        if not (index is None or index == "random" or isinstance(index, (int, np.integer, tuple))):
            raise ValueError(f"fpx.faults: index must be None, 'random', an int or a tuple, got "
                             f"{index!r}")
        if isinstance(op, bool) or not (op is None or isinstance(op, (str, int, np.integer))):
            raise ValueError(f"fpx.faults: op must be None, a name or a GEMM number, got {op!r}")
        if not 0.0 <= float(prob) <= 1.0:
            raise ValueError(f"fpx.faults: prob must lie in [0, 1], got {prob}")
        self.where, self.index, self.op, self.call = where, index, op, call
        self.prob, self.seed = float(prob), int(seed)

    def candidates(self, x):
        """A flat mask of the elements a random pick may choose (None: all)."""
        return None

    def pick(self, x, rng, index=None):
        """The multi-index of the element this fault hits in the array ``x`` (``index``: the
        fault's index mapped to ``x``'s coordinates, if it was), or None when no element
        qualifies."""
        shape = x.shape
        index = self.index if index is None else index
        size = int(np.prod(shape, dtype=np.int64))
        if size == 0:
            raise ValueError("fpx.inject: cannot inject into an empty value")
        if index is None or (isinstance(index, str) and index == "random"):
            ok = self.candidates(x)
            if ok is None:
                flat = int(rng.integers(size))
            else:
                where = np.flatnonzero(ok)
                if where.size == 0:
                    return None
                flat = int(where[rng.integers(where.size)])
        elif isinstance(index, tuple):
            if len(index) != len(shape) or not all(
                    -n <= int(i) < n for i, n in zip(index, shape)):
                _bad_index(index, shape)
            return tuple(int(i) % n for i, n in zip(index, shape))
        else:
            flat = int(index)
            if not -size <= flat < size:
                _bad_index(index, shape)
            flat %= size
        return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()

    def apply(self, x, idx):
        """A copy of the array ``x`` with the fault at ``idx``."""
        raise NotImplementedError

    def _fields(self):
        return (f"where={self.where!r}" + (f", index={self.index!r}" if self.index is not None
                                           else "")
                + (f", op={self.op!r}" if self.op is not None else "")
                + (f", call={self.call}" if self.call is not None else "")
                + (f", prob={self.prob}" if self.prob != 1.0 else ""))


def _bad_index(index, shape):
    raise IndexError(f"fpx.inject: index {index!r} is out of range for a value of shape {shape} "
                     "(inside fpx.abft, indices other than a layer weight's are those of the "
                     "GEMM's operands and result: a convolution's (O, N*H*W) output)")


def _uint(dt):
    dt = np.dtype(dt)
    if dt.kind == "b" or dt.kind not in "fiuV" or dt.itemsize not in (1, 2, 4, 8):
        raise TypeError(f"fpx.inject: cannot flip bits of dtype {dt}")
    return np.dtype(f"u{dt.itemsize}")


def flip_bit(x, bit, idx):
    """A copy of ``x`` with bit ``bit`` (0 = least significant of the dtype's storage) of
    element ``idx`` flipped."""
    x = np.array(x, copy=True, order="C")      # C order: the flat view below is x itself
    u = _uint(x.dtype)
    nbits = 8 * u.itemsize
    if not 0 <= int(bit) < nbits:
        raise ValueError(f"fpx.inject: bit {bit} does not exist in {x.dtype} ({nbits} bits, "
                         f"0..{nbits - 1})")
    v = x.reshape(-1).view(u) if x.ndim else x.reshape(1).view(u)
    flat = int(np.ravel_multi_index(idx, x.shape)) if x.ndim else 0
    v[flat] ^= u.type(1 << int(bit))
    return x


class BitFlip(Fault):
    """Flip bit ``bit`` of one element (see the module docstring for the fields).
    ``direction``: None (whatever the bit is), ``"set"`` (a random pick among the elements
    whose bit is 0: an exponent bit set multiplies the value by 2^(2^k)) or ``"clear"``
    (among those whose bit is 1)."""

    def __init__(self, bit, where="output", index=None, op=None, call=None, prob=1.0, seed=0,
                 direction=None):
        super().__init__(where, index, op, call, prob, seed)
        if isinstance(bit, bool) or not isinstance(bit, (int, np.integer)) or bit < 0:
            raise ValueError(f"fpx.faults.BitFlip: bit must be a non-negative int, got {bit!r}")
        if direction not in (None, "set", "clear"):
            raise ValueError(f"fpx.faults.BitFlip: direction must be None, 'set' or 'clear', "
                             f"got {direction!r}")
        self.bit, self.direction = int(bit), direction

    def candidates(self, x):
        if self.direction is None:
            return None
        u = _uint(x.dtype)
        bits = (np.ascontiguousarray(x).reshape(-1).view(u) >> u.type(self.bit)) & u.type(1)
        return bits == (0 if self.direction == "set" else 1)

    def apply(self, x, idx):
        return flip_bit(x, self.bit, idx)

    def __repr__(self):
        d = f", direction={self.direction!r}" if self.direction else ""
        return f"BitFlip({self.bit}, {self._fields()}{d})"


class Value(Fault):
    """Overwrite one element with ``value`` (rounded into the value's dtype)."""

    def __init__(self, value, where="output", index=None, op=None, call=None, prob=1.0, seed=0):
        super().__init__(where, index, op, call, prob, seed)
        self.value = value

    def apply(self, x, idx):
        x = np.array(x, copy=True)
        if x.ndim:
            x[idx] = self.value
            return x
        return np.asarray(self.value).astype(x.dtype)

    def __repr__(self):
        return f"Value({self.value!r}, {self._fields()})"


def _layer_fault(where, layer, index, bit, value, kw):
    if (bit is None) == (value is None):
        raise ValueError("fpx.faults: give exactly one of bit= and value=")
    if bit is not None:
        return BitFlip(bit, where=where, index=index, op=layer, **kw)
    return Value(value, where=where, index=index, op=layer, **kw)


def neuron(layer, index=None, *, bit=None, value=None, **kw):
    """PyTorchFI's neuron fault: an element of ``layer``'s output (a name, or the n-th GEMM
    layer of the run) flipped at ``bit`` or set to ``value``."""
    return _layer_fault("output", layer, index, bit, value, kw)


def weight(layer, index=None, *, bit=None, value=None, **kw):
    """PyTorchFI's weight fault: an element of ``layer``'s weight as the layer reads it (the
    parameter itself is not changed) flipped at ``bit`` or set to ``value``."""
    return _layer_fault("weight", layer, index, bit, value, kw)
