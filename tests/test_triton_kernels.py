"""Triton kernels written for fpx's tests and benchmark, mirroring the RENDER paper's cases
(matmuls, split-K, column sums, scans, softmax, norms, fused attention) with buggy variants.
``TRITON_INTERPRET=1`` is set before triton is imported; without triton the module is skipped."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

triton = pytest.importorskip("triton")
import torch  # noqa: E402
import triton.language as tl  # noqa: E402


# ---- matmul (the tutorial's, with the paper's bugs as flags) ---------------------------------
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
                  BUG: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    b_ptrs = b_ptr + rk[:, None] * sbk + rn[None, :] * sbn
    if BUG == "stride":                      # C's row stride for A's (in bounds for N <= K)
        a_ptrs = a_ptr + rm[:, None] * scm + rk[None, :] * sak
    else:
        a_ptrs = a_ptr + rm[:, None] * sam + rk[None, :] * sak
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    trips = K // BK if BUG == "floor" else tl.cdiv(K, BK)
    for k in range(0, trips):
        kmax = K - k * BK - 1 if BUG == "kmask" else K - k * BK
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < kmax), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < kmax) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PREC)
        a_ptrs += BK * sak
        b_ptrs += BK * sbk
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, c,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a, b, prec="ieee", bug="", out_dtype=None, block=(16, 16, 16)):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=out_dtype or a.dtype)
    BM, BN, BK = block
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                        c.stride(0), c.stride(1), BM=BM, BN=BN, BK=BK, PREC=prec, BUG=bug)
    return c


# ---- a tensor-descriptor matmul ----------------------------------------------------------------
@triton.jit
def desc_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    om = tl.program_id(0) * BM
    on = tl.program_id(1) * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        acc = tl.dot(a_desc.load([om, k * BK]), b_desc.load([k * BK, on]), acc)
    c_desc.store([om, on], acc.to(tl.float16))


def desc_matmul(a, b, block=(16, 16, 16)):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=torch.float16)
    BM, BN, BK = block
    desc_matmul_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](a, b, c, M, N, K, BM=BM,
                                                                  BN=BN, BK=BK)
    return c


# ---- split-K with atomic_add -------------------------------------------------------------------
@triton.jit
def splitk_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr, SPLIT: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = pid_k * BK + tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK * SPLIT)):
        kk = rk + k * BK * SPLIT
        a = tl.load(a_ptr + rm[:, None] * K + kk[None, :],
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * N + rn[None, :],
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.atomic_add(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty),
                  mask=(rm[:, None] < M) & (rn[None, :] < N))


def splitk(a, b, split=4, out_dtype=torch.float32, drop=False, block=(16, 16, 16)):
    M, K = a.shape
    N = b.shape[1]
    c = torch.zeros((M, N), dtype=out_dtype)
    BM, BN, BK = block
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN), split - 1 if drop else split)
    splitk_kernel[grid](a, b, c, M, N, K, BM=BM, BN=BN, BK=BK, SPLIT=split)
    return c


# ---- fp16 column sum; cumsum then sum --------------------------------------------------------
@triton.jit
def colsum_kernel(x_ptr, o_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for m in range(0, tl.cdiv(M, BM)):
        rm = m * BM + tl.arange(0, BM)
        x = tl.load(x_ptr + rm[:, None] * N + rn[None, :],
                    mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0)
        acc += tl.sum(x.to(tl.float32), axis=0)
    tl.store(o_ptr + rn, acc.to(tl.float16), mask=rn < N)


def colsum(x, BM=16, BN=16):
    M, N = x.shape
    o = torch.empty(N, dtype=torch.float16)
    colsum_kernel[(triton.cdiv(N, BN),)](x, o, M, N, BM=BM, BN=BN)
    return o


@triton.jit
def scan_kernel(x_ptr, o_ptr, N, BR: tl.constexpr, BN: tl.constexpr, AXIS: tl.constexpr):
    rr = tl.program_id(0) * BR + tl.arange(0, BR)
    rn = tl.arange(0, BN)
    x = tl.load(x_ptr + rr[:, None] * N + rn[None, :], mask=rn[None, :] < N, other=0.0)
    y = tl.where(rn[None, :] < N, tl.cumsum(x, axis=AXIS), 0.0)
    tl.store(o_ptr + rr, tl.sum(y, axis=1))


def cumsum_sum(x, axis=1, BR=4):
    R, N = x.shape
    o = torch.empty(R, dtype=x.dtype)
    scan_kernel[(R // BR,)](x, o, N, BR=BR, BN=triton.next_power_of_2(N), AXIS=axis)
    return o


# ---- softmax, layer norm, RMS norm -----------------------------------------------------------
@triton.jit
def softmax_kernel(x_ptr, o_ptr, N, BN: tl.constexpr, BUG: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BN)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=-float("inf")).to(tl.float32)
    num = tl.exp(x - tl.max(x, axis=0))
    den = tl.max(num, axis=0) if BUG else tl.sum(num, axis=0)
    tl.store(o_ptr + row * N + cols, (num / den).to(o_ptr.dtype.element_ty), mask=cols < N)


def softmax(x, bug=False):
    R, N = x.shape
    o = torch.empty_like(x)
    softmax_kernel[(R,)](x, o, N, BN=triton.next_power_of_2(N), BUG=bug)
    return o


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, o_ptr, N, eps, BN: tl.constexpr, RMS: tl.constexpr,
                     BUG: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BN)
    m = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    if RMS:
        y = x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps) * w
    else:
        mean = tl.sum(x, axis=0) / N
        d = tl.where(m, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / N + eps)
        y = d * rstd * w + tl.load(b_ptr + cols, mask=m, other=0.0).to(tl.float32)
    if BUG:
        y = y * w
    tl.store(o_ptr + row * N + cols, y.to(o_ptr.dtype.element_ty), mask=m)


def layernorm(x, w, b, eps=1e-5, rms=False, bug=False):
    R, N = x.shape
    o = torch.empty_like(x)
    layernorm_kernel[(R,)](x, w, b, o, N, eps, BN=triton.next_power_of_2(N), RMS=rms, BUG=bug)
    return o


# ---- fused attention forward (online softmax with exp2) ---------------------------------------
@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, N, sm_scale, D: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BUG: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rd = tl.arange(0, D)
    q = tl.load(q_ptr + rm[:, None] * D + rd[None, :])
    m_i = tl.full((BM,), -float("inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    qk_scale = sm_scale * 1.44269504
    for start in range(0, N, BN):
        rn = start + tl.arange(0, BN)
        k = tl.load(k_ptr + rn[:, None] * D + rd[None, :])
        v = tl.load(v_ptr + rn[:, None] * D + rd[None, :])
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        if BUG:
            qk = qk * sm_scale
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_ij
    tl.store(o_ptr + rm[:, None] * D + rd[None, :], (acc / l_i[:, None]).to(tl.float16))


def attention(q, k, v, sm_scale=None, bug=False, BM=16, BN=16):
    M, D = q.shape
    o = torch.empty_like(q)
    scale = sm_scale if sm_scale is not None else D ** -0.5
    attention_kernel[(M // BM,)](q, k, v, o, k.shape[0], scale, D=D, BM=BM, BN=BN, BUG=bug)
    return o


# ---- elementwise x*y + x; an index-gathered weight dot -----------------------------------------
@triton.jit
def xyx_kernel(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    y = tl.load(y_ptr + offs, mask=m)
    tl.store(o_ptr + offs, x * y + x, mask=m)


def xyx(x, y, BLOCK=64):
    o = torch.empty_like(x)
    grid = lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)  # noqa: E731  (the tutorials')
    xyx_kernel[grid](x, y, o, x.numel(), BLOCK=BLOCK)
    return o


@triton.jit
def gather_dot_kernel(x_ptr, w_ptr, idx_ptr, o_ptr, K, N, BR: tl.constexpr, BK: tl.constexpr,
                      BN: tl.constexpr):
    rr = tl.program_id(0) * BR + tl.arange(0, BR)
    rk = tl.arange(0, BK)
    rn = tl.arange(0, BN)
    rows = tl.load(idx_ptr + rk)                       # which rows of W this dot reads
    x = tl.load(x_ptr + rr[:, None] * K + rk[None, :])
    w = tl.load(w_ptr + rows[:, None] * N + rn[None, :])
    tl.store(o_ptr + rr[:, None] * N + rn[None, :], tl.dot(x, w))


def gather_dot(x, w, idx, BR=16):
    R, K = x.shape
    N = w.shape[1]
    o = torch.empty((R, N), dtype=torch.float32)
    gather_dot_kernel[(R // BR,)](x, w, idx, o, K, N, BR=BR, BK=K, BN=N)
    return o
