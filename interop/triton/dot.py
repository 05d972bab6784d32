"""``tl.dot`` as the GPU computes it, written with fpx ops so every transform's matmul rule
applies: operands converted to what the tensor cores read, products summed in the accumulator.

* fp16/bf16/fp8 operands: converted to float32 exactly (their products are exact in float32),
  summed in float32 (the accumulator ``d``'s dtype).
* float32, ``input_precision="ieee"``: a float32 dot product.
* float32, ``"tf32"``: each operand rounded to tf32 first (10 stored bits), then as above.
* float32, ``"tf32x3"``: ``a = a_hi + a_lo`` with ``a_hi = tf32(a)``, ``a_lo = tf32(a - a_hi)``
  (b likewise) and the three products ``a_hi b_hi + a_hi b_lo + a_lo b_hi`` (a_lo b_lo dropped).
* The accumulator is part of the sum (MMA adds it in, in an order the hardware chooses): the
  dot is one matmul ``[A | d] @ [B ; I]`` of K + N terms, so the matmul rule's bound -- valid
  for every summation order -- covers it. An accumulator that is a constant zero is left out.
"""
from __future__ import annotations

import numpy as np

import fpx.numpy as fnp
from fpx import formats
from fpx.core import Tracer


def _zero(d) -> bool:
    return not isinstance(d, Tracer) and not np.any(np.asarray(d))


def _batch(*xs):
    b = max(np.shape(x)[0] for x in xs)
    return [fnp.broadcast_to(x, (b,) + tuple(np.shape(x)[1:])) for x in xs]


def dot(a, b, d, precision: str):
    """``d + a @ b`` with the arithmetic the GPU uses; a, b, d carry the program axis."""
    acc = np.dtype(d.dtype)
    if acc.kind in "iu":
        x = np.matmul(np.asarray(a).astype(acc), np.asarray(b).astype(acc))
        return (x + np.asarray(d)).astype(acc)
    a_dt = np.dtype(a.dtype)
    if a_dt == np.float32 and precision in ("tf32", "tf32x3"):
        a_hi, b_hi = (fnp.astype(fnp.astype(x, formats.tf32), np.float32) for x in (a, b))
        if precision == "tf32":
            lhs, rhs = [a_hi], [b_hi]
        else:
            a_lo, b_lo = (fnp.astype(fnp.astype(fnp.subtract(x, h), formats.tf32), np.float32)
                          for x, h in ((a, a_hi), (b, b_hi)))
            lhs, rhs = [a_hi, a_hi, a_lo], [b_hi, b_lo, b_hi]
    elif precision not in ("ieee", "tf32", "tf32x3"):
        from fpx.interop.triton.builder import UnsupportedTritonOpError
        raise UnsupportedTritonOpError("dot", f"input_precision {precision!r}")
    else:
        lhs, rhs = [fnp.astype(a, acc)], [fnp.astype(b, acc)]
    if not _zero(d):
        n = np.shape(d)[-1]
        lhs.append(d)
        rhs.append(np.broadcast_to(np.eye(n, dtype=acc), (1, n, n)))
    if len(lhs) == 1:
        return fnp.matmul(lhs[0], rhs[0])        # the program axes broadcast
    return fnp.matmul(fnp.concatenate(_batch(*lhs), axis=-1),
                      fnp.concatenate(_batch(*rhs), axis=-2))
