"""Round-off or bug? ``fpx.classify`` on kernels that mirror real bug reports.

Kernel developers compare a fast kernel with a reference and get an ``allclose`` that fails.
Some of those failures are round-off (tf32 tensor cores, float16 inputs, split-K, a final
downcast, float16 accumulation, a layer-norm on activations with a large offset); some are
bugs (a tile of B read with swapped strides, an off-by-one causal mask, a cumsum along the
wrong axis, a missing 1/sqrt(d) scale). ``allclose`` cannot tell them apart: every case below
fails it. ``fpx.classify`` bounds what round-off alone could make the target produce on these
very inputs and says which is which -- and, for bugs, where.

Each ``case_*()`` returns ``(target_fn, reference, args, expected_kind)``: ``reference`` is an
array (e.g. a float64 result) or a function of the same arguments (then its own round-off is
bounded too). The kernels are plain NumPy functions (``fpx.numpy`` where NumPy has no
spelling, e.g. the tf32 cast), so they run eagerly *and* under fpx's transforms.

Run ``python examples/classify_kernels.py`` for the verdict table.
"""
from __future__ import annotations

import math
import time

import numpy as np

import fpx
import fpx.numpy as fnp
from fpx.formats import tf32

SEED = 20250

# the allclose rtol a kernel test would typically use: 1e-5 for float32, 1e-3 where float16
# is involved (atol: NumPy's np.allclose default 1e-8, and 0 as np.testing.assert_allclose)
RTOL = {"float32": 1e-5, "float16": 1e-3}
CASE_RTOL = {"fp16_matmul": RTOL["float16"], "fp16_column_sum": RTOL["float16"]}


def _rng(salt: int) -> np.random.Generator:
    return np.random.default_rng([SEED, salt])


# =============================================================================================
# Kernels
# =============================================================================================
def tf32_matmul(a, b):
    """Tensor-core TF32 GEMM: float32 operands rounded to tf32 (10-bit mantissa), products
    accumulated in float32. (``fnp.astype``: NumPy's own ``ndarray.astype(tf32)`` would just
    make float32 -- tf32 has no NumPy dtype -- while fpx's cast rounds.)"""
    return fnp.astype(a, tf32) @ fnp.astype(b, tf32)


def matmul(a, b):
    """The plain GEMM in the operands' own precision (the usual reference)."""
    return a @ b


def fp16_in_fp32_acc_matmul(a, b):
    """Mixed-precision GEMM (cublasGemmEx with CUDA_R_16F inputs, CUBLAS_COMPUTE_32F): the
    float32 activations/weights are stored as float16, products accumulated in float32."""
    return a.astype(np.float16).astype(np.float32) @ b.astype(np.float16).astype(np.float32)


def splitk_matmul(a, b, splits: int = 4, order=(2, 0, 3, 1)):
    """Split-K GEMM: K cut into ``splits`` chunks, one partial GEMM per chunk (one thread
    block each), partial results reduced in the order the blocks finished (``order``)."""
    K = a.shape[-1]
    c = K // splits
    parts = [a[:, i * c:(i + 1) * c] @ b[i * c:(i + 1) * c, :] for i in range(splits)]
    out = parts[order[0]]
    for i in order[1:]:
        out = out + parts[i]
    return out


def gauss_likelihood_f32(x, mu, sigma):
    """Gaussian likelihoods computed in float64 and stored as float32 at the end (a data
    pipeline's output buffer). Far tails land in float32's subnormal range."""
    z = (x - mu) / sigma
    return np.exp(-0.5 * (z * z)).astype(np.float32)


def gauss_likelihood(x, mu, sigma):
    z = (x - mu) / sigma
    return np.exp(-0.5 * (z * z))


def column_sum(x):
    """Per-feature sum over the batch axis, in the array's own precision (float16)."""
    return x.sum(axis=0)


def ln_softmax(x, w, b):
    """Layer norm over the last axis, then softmax (a norm -> attention-logit chain)."""
    return fpx.nn.softmax(fpx.nn.layer_norm(x, weight=w, bias=b), axis=-1)


def ln_softmax_f64(x, w, b):
    return ln_softmax(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64))


def tiled_matmul(a, b, tile: int = 16, swapped_tile=None):
    """A hand-tiled GEMM. ``swapped_tile=(kt, nt)`` reproduces a stride bug: the loader of
    B's tile (kt, nt) swaps the row and column strides, i.e. reads that tile transposed.
    Only output columns of tile ``nt`` are affected (in every row)."""
    M, K = a.shape
    N = b.shape[1]
    rows = []
    for i in range(0, M, tile):
        blocks = []
        for j in range(0, N, tile):
            acc = None
            for k in range(0, K, tile):
                bt = b[k:k + tile, j:j + tile]
                if swapped_tile == (k // tile, j // tile):
                    bt = bt.T                      # the bug: strides (1, ld) instead of (ld, 1)
                p = a[i:i + tile, k:k + tile] @ bt
                acc = p if acc is None else acc + p
            blocks.append(acc)
        rows.append(np.concatenate(blocks, axis=1))
    return np.concatenate(rows, axis=0)


def causal_attention(q, k, v, diag_offset: int = 0, scaled: bool = True):
    """Causal self-attention, (heads, seq, dim). Query i attends to keys j <= i +
    ``diag_offset`` (0 is right; 1 is the off-by-one that lets every query see one future
    token). ``scaled=False`` drops the 1/sqrt(d) temperature."""
    S, d = q.shape[-2], q.shape[-1]
    s = q @ np.swapaxes(k, -1, -2)
    if scaled:
        s = s * (1.0 / math.sqrt(d))               # a Python float: keeps the dtype
    i = np.arange(S)[:, None]
    j = np.arange(S)[None, :]
    s = np.where(j <= i + diag_offset, s, -np.inf)
    return fpx.nn.softmax(s, axis=-1) @ v


def attention(q, k, v, scaled: bool = True):
    """Non-causal attention softmax(q k^T / sqrt(d)) v; ``scaled=False`` forgets the scale."""
    d = q.shape[-1]
    s = q @ np.swapaxes(k, -1, -2)
    if scaled:
        s = s * (1.0 / math.sqrt(d))
    return fpx.nn.softmax(s, axis=-1) @ v


def cumsum_rows(x, axis: int = -1):
    """Running sum along each row (the sequence axis); ``axis=0`` is the bug."""
    return np.cumsum(x, axis=axis)


def _f64(*xs):
    return tuple(np.asarray(x, np.float64) for x in xs)


# =============================================================================================
# Round-off cases: fpx must say "roundoff" (and allclose fails)
# =============================================================================================
def case_tf32_matmul():
    """TF32 GEMM vs a float32 GEMM reference (its own round-off bounded too)."""
    r = _rng(1)
    a = r.standard_normal((64, 256)).astype(np.float32)
    b = r.standard_normal((256, 64)).astype(np.float32)
    return tf32_matmul, matmul, (a, b), "roundoff"


def case_fp16_matmul():
    """float16-input / float32-accumulate GEMM vs float64 GEMM of the original operands."""
    r = _rng(2)
    a = r.standard_normal((64, 256)).astype(np.float32)
    b = r.standard_normal((256, 64)).astype(np.float32)
    ref = np.matmul(*_f64(a, b))
    return fp16_in_fp32_acc_matmul, ref, (a, b), "roundoff"


def case_splitk_matmul():
    """Split-K (4 chunks, shuffled reduction) vs the plain float32 GEMM (a function)."""
    r = _rng(3)
    a = r.standard_normal((64, 1024)).astype(np.float32)
    b = r.standard_normal((1024, 64)).astype(np.float32)
    return splitk_matmul, matmul, (a, b), "roundoff"


def case_downcast():
    """float64 likelihoods stored as float32 vs the float64 result."""
    r = _rng(4)
    x = np.concatenate([r.standard_normal(192), r.uniform(12.0, 14.0, 64)])
    mu, sigma = np.float64(0.0), np.float64(1.0)
    ref = gauss_likelihood(x, mu, sigma)
    return gauss_likelihood_f32, ref, (x, mu, sigma), "roundoff"


def case_fp16_column_sum():
    """Sum of float16 columns (float16 result) vs the float64 sum of the same values."""
    r = _rng(5)
    x = r.standard_normal((256, 64)).astype(np.float16)    # NumPy adds rows in float16
    ref = x.astype(np.float64).sum(axis=0)
    return column_sum, ref, (x,), "roundoff"


def case_ln_softmax():
    """Layer norm -> softmax in float32 on activations with a large offset, vs float64."""
    r = _rng(6)
    x = (300.0 + r.standard_normal((8, 512))).astype(np.float32)
    w = (1.0 + 0.5 * r.standard_normal(512)).astype(np.float32)   # LN gain (not constant:
    b = r.standard_normal(512).astype(np.float32)                  # softmax ignores shifts)
    return ln_softmax, ln_softmax_f64, (x, w, b), "roundoff"


# =============================================================================================
# Bug cases: fpx must say "bug" and point at the right elements
# =============================================================================================
STRIDE_TILE = 16
STRIDE_BUG_TILE = (1, 2)          # (k tile, n tile) of B read with swapped strides


def case_transposed_stride():
    """A tiled GEMM that reads one tile of B with swapped strides vs the float64 GEMM."""
    r = _rng(7)
    a = r.standard_normal((64, 64)).astype(np.float32)
    b = r.standard_normal((64, 64)).astype(np.float32)

    def target(a, b):
        return tiled_matmul(a, b, STRIDE_TILE, STRIDE_BUG_TILE)
    return target, np.matmul(*_f64(a, b)), (a, b), "bug"


def case_causal_mask_off_by_one():
    """Causal attention whose mask also admits the next token (j <= i + 1) vs the right
    float64 attention. Every query row but the last is affected."""
    r = _rng(8)
    q, k, v = (r.standard_normal((2, 32, 16)).astype(np.float32) for _ in range(3))

    def target(q, k, v):
        return causal_attention(q, k, v, diag_offset=1)
    return target, causal_attention(*_f64(q, k, v)), (q, k, v), "bug"


def case_cumsum_wrong_axis():
    """A running sum over the sequence axis computed along the batch axis instead."""
    r = _rng(9)
    x = r.standard_normal((32, 32)).astype(np.float32)

    def target(x):
        return cumsum_rows(x, axis=0)
    return target, cumsum_rows(*_f64(x)), (x,), "bug"


def case_missing_scale():
    """Attention that forgot the 1/sqrt(d) temperature vs the float64 attention."""
    r = _rng(10)
    q, k, v = (r.standard_normal((2, 32, 16)).astype(np.float32) for _ in range(3))

    def target(q, k, v):
        return attention(q, k, v, scaled=False)
    return target, attention(*_f64(q, k, v)), (q, k, v), "bug"


ROUNDOFF_CASES = {
    "tf32_matmul": case_tf32_matmul,
    "fp16_matmul": case_fp16_matmul,
    "splitk_matmul": case_splitk_matmul,
    "downcast": case_downcast,
    "fp16_column_sum": case_fp16_column_sum,
    "ln_softmax": case_ln_softmax,
}
BUG_CASES = {
    "transposed_stride": case_transposed_stride,
    "causal_mask_off_by_one": case_causal_mask_off_by_one,
    "cumsum_wrong_axis": case_cumsum_wrong_axis,
    "missing_scale": case_missing_scale,
}
CASES = {**ROUNDOFF_CASES, **BUG_CASES}


# =============================================================================================
# Helpers: what a kernel test would see
# =============================================================================================
def reference_value(reference, args):
    """The reference output (calling it eagerly when it is a function)."""
    return reference(*args) if callable(reference) else reference


def allclose_results(name):
    """(rtol, np.allclose with NumPy's default atol, np.allclose with atol=0 as
    np.testing.assert_allclose uses) for case ``name``."""
    target, reference, args, _ = CASES[name]()
    out = np.asarray(target(*args))
    ref = np.asarray(reference_value(reference, args))
    rtol = CASE_RTOL.get(name, RTOL["float32"])
    return (rtol, bool(np.allclose(out, ref, rtol=rtol)),
            bool(np.allclose(out, ref, rtol=rtol, atol=0.0)))


def run_case(name, bound="rigorous"):
    target, reference, args, expected = CASES[name]()
    t0 = time.perf_counter()
    verdict = fpx.classify(target, reference, *args, bound=bound)
    return verdict, expected, time.perf_counter() - t0


def main():
    head = (f"{'case':24s} {'expected':9s} {'rtol':>6s} {'allclose':>8s} {'atol=0':>7s} "
            f"{'fpx':>8s} {'tight':>7s} {'tight(p)':>8s} {'outside':>8s} {'ms':>6s}")
    print(head)
    print("-" * len(head))
    ok = True
    for name, make in CASES.items():
        target, reference, args, expected = make()
        rtol, ac, ac0 = allclose_results(name)
        t0 = time.perf_counter()
        v = fpx.classify(target, reference, *args)
        dt = time.perf_counter() - t0
        vp = fpx.classify(target, reference, *args, bound="probabilistic")
        ok &= v.kind == expected
        print(f"{name:24s} {expected:9s} {rtol:6.0e} {'pass' if ac else 'FAIL':>8s} "
              f"{'pass' if ac0 else 'FAIL':>7s} {v.kind:>8s} {v.tightness:7.3g} "
              f"{vp.tightness:8.3g} {v.n_outside:8d} {1e3 * dt:6.1f}")
    print()
    print("allclose: np.allclose(target, reference, rtol) with NumPy's default atol=1e-8; "
          "atol=0: as np.testing.assert_allclose.")
    print("tight: median (bound half-width / observed |target - reference|), rigorous bound; "
          "tight(p): probabilistic bound (not rigorous).")
    print()
    for name in ("transposed_stride", "causal_mask_off_by_one"):
        target, reference, args, _ = CASES[name]()
        print(f"== {name} ==")
        print(fpx.classify(target, reference, *args).report(max_items=4))
        print()
    print("all verdicts as expected" if ok else "SOME VERDICTS DIFFER FROM THE EXPECTED ONES")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
