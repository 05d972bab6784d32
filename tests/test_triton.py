"""fpx transforms on unchanged Triton kernels (``fpx.interop.triton``): bounds hold the float64
reference for every correct kernel, buggy variants classify as bugs, stochastic and trace run,
unsupported ops raise naming the op, and the interpreter's state is restored."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

triton = pytest.importorskip("triton")
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra import libdevice  # noqa: E402

import fpx  # noqa: E402
from test_triton_kernels import (attention, colsum, cumsum_sum, desc_matmul,  # noqa: E402
                                 gather_dot, layernorm, matmul, softmax, splitk, xyx)

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="triton was imported without TRITON_INTERPRET=1")


def _inside(iv, ref):
    r = ref.detach().double().numpy()
    return bool(np.all(iv.lo <= r) and np.all(r <= iv.hi))


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _cases():
    g = _gen()
    a16, b16 = torch.randn(37, 29, generator=g).half(), torch.randn(29, 45, generator=g).half()
    a32, b32 = torch.randn(37, 29, generator=g), torch.randn(29, 45, generator=g)
    x = torch.randn(8, 20, generator=g)
    w, b = torch.randn(20, generator=g), torch.randn(20, generator=g)
    xs = (torch.randn(50, 37, generator=g) * 2e-5).half()        # fp16 subnormal sums
    q, k, v = (torch.randn(n, 16, generator=g).half() for n in (32, 48, 48))
    xg, wg = torch.randn(32, 16, generator=g), torch.randn(40, 16, generator=g)
    idx = torch.randint(0, 40, (16,), generator=g, dtype=torch.int32)
    a8 = torch.randn(32, 32, generator=g).to(torch.float8_e5m2)
    b8 = torch.randn(32, 48, generator=g).to(torch.float8_e5m2)
    ad, bd = torch.randn(32, 32, generator=g).half(), torch.randn(32, 48, generator=g).half()
    e1, e2 = torch.randn(100, generator=g), torch.randn(100, generator=g)
    d = lambda t: t.double()  # noqa: E731
    rms_ref = d(x) * torch.rsqrt((d(x) ** 2).mean(1, keepdim=True) + 1e-5) * d(w)
    return {
        "matmul fp16": (matmul, (a16, b16), d(a16) @ d(b16)),
        "matmul fp32 ieee": (lambda a, b: matmul(a, b, "ieee"), (a32, b32), d(a32) @ d(b32)),
        "matmul fp32 tf32": (lambda a, b: matmul(a, b, "tf32"), (a32, b32), d(a32) @ d(b32)),
        "matmul fp32 tf32x3": (lambda a, b: matmul(a, b, "tf32x3"), (a32, b32),
                               d(a32) @ d(b32)),
        "descriptor matmul": (desc_matmul, (ad, bd), d(ad) @ d(bd)),
        "split-K fp32": (splitk, (a32, b32), d(a32) @ d(b32)),
        "split-K fp16": (lambda a, b: splitk(a, b, out_dtype=torch.float16), (a16, b16),
                         d(a16) @ d(b16)),
        "fp8 e5m2 gemm": (lambda a, b: matmul(a, b, out_dtype=torch.float32), (a8, b8),
                          d(a8) @ d(b8)),
        "fp16 column sum": (colsum, (xs,), d(xs).sum(0)),
        "cumsum then sum": (cumsum_sum, (x,), d(x).cumsum(1).sum(1)),
        "softmax": (softmax, (x,), torch.softmax(d(x), 1)),
        "layer norm": (layernorm, (x, w, b),
                       torch.nn.functional.layer_norm(d(x), (20,), d(w), d(b), 1e-5)),
        "rms norm": (lambda x, w, b: layernorm(x, w, b, rms=True), (x, w, b), rms_ref),
        "fused attention": (attention, (q, k, v), torch.softmax(d(q) @ d(k).T / 4, 1) @ d(v)),
        "x*y+x": (xyx, (e1, e2), d(e1) * d(e2) + d(e1)),
        "gathered weight dot": (gather_dot, (xg, wg, idx), d(xg) @ d(wg)[idx.long()]),
    }


CASES = _cases()


@pytest.mark.parametrize("name", list(CASES))
def test_bounds_hold_the_reference_and_the_kernels_own_result(name):
    f, args, ref = CASES[name]
    iv = fpx.interval(f)(*args)
    assert _inside(iv, ref), name
    assert _inside(iv, f(*args)), name                  # the plain interpreted launch
    assert np.all(np.isfinite(iv.hi - iv.lo))
    assert isinstance(iv.value, torch.Tensor)


def _bugs():
    g = _gen(1)
    a, b = torch.randn(37, 29, generator=g).half(), torch.randn(29, 21, generator=g).half()
    a32, b32 = torch.randn(37, 64, generator=g), torch.randn(64, 45, generator=g)
    x = torch.randn(8, 20, generator=g)
    w, bb = torch.randn(20, generator=g), torch.randn(20, generator=g)
    q, k, v = (torch.randn(n, 16, generator=g).half() for n in (32, 48, 48))
    d = lambda t: t.double()  # noqa: E731
    ln = torch.nn.functional.layer_norm(d(x), (20,), d(w), d(bb), 1e-5)
    return {
        "stride mix-up": (lambda a, b: matmul(a, b, bug="stride"), (a, b), d(a) @ d(b)),
        "off-by-one K mask": (lambda a, b: matmul(a, b, bug="kmask"), (a, b), d(a) @ d(b)),
        "floor trip count": (lambda a, b: matmul(a, b, bug="floor"), (a, b), d(a) @ d(b)),
        "dropped split-K slice": (lambda a, b: splitk(a, b, drop=True), (a32, b32),
                                  d(a32) @ d(b32)),
        "wrong scan axis": (lambda x: cumsum_sum(x, axis=0), (x,), d(x).cumsum(1).sum(1)),
        "wrong normaliser": (lambda x: softmax(x, bug=True), (x,), torch.softmax(d(x), 1)),
        "double scale (norm)": (lambda x, w, b: layernorm(x, w, b, bug=True), (x, w, bb), ln),
        "double scale (attention)": (lambda q, k, v: attention(q, k, v, bug=True), (q, k, v),
                                     torch.softmax(d(q) @ d(k).T / 4, 1) @ d(v)),
    }


@pytest.mark.parametrize("name", list(_bugs()))
def test_buggy_kernels_classify_as_bugs(name):
    f, args, ref = _bugs()[name]
    v = fpx.classify(f, ref.to(f(*args).dtype), *args)
    assert v.kind == "bug", (name, v)


def test_correct_kernel_classifies_as_roundoff():
    f, args, ref = CASES["matmul fp16"]
    v = fpx.classify(f, ref.half(), *args)
    assert v.kind == "roundoff", v


def test_stochastic_samples_and_trace():
    f, args, ref = CASES["layer norm"]
    s = fpx.stochastic(f, "sr", samples=8, seed=0)(*args)
    assert tuple(s.shape) == (8, 8, 20)
    assert len({tuple(t.flatten().tolist()) for t in s}) > 1      # the samples differ
    assert np.allclose(s.double().numpy(), ref.numpy()[None], atol=1e-3)
    rec = fpx.trace(f)(*args)
    assert {"reduce_sum", "sqrt", "div", "mul", "add"} <= set(rec.primitives)
    assert torch.equal(rec.outputs, f(*args))


def test_two_launches_and_torch_code_between_them():
    def two(x, y):
        t = xyx(x, y)
        t = t * 0.5                                # a torch op on the kernel's output
        return xyx(t, y)
    g = _gen(2)
    x, y = torch.randn(100, generator=g), torch.randn(100, generator=g)
    ref = (x.double() * y.double() + x.double()) * 0.5
    ref = ref * y.double() + ref
    iv = fpx.interval(two)(x, y)
    assert _inside(iv, ref) and _inside(iv, two(x, y))


@triton.jit
def _pid_branch_kernel(x_ptr, o_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    if pid == 0:                                   # program-dependent Python control flow
        x = x * 2.0
    for _ in range(pid):
        x = x + 1.0
    tl.store(o_ptr + offs, x)


def test_program_dependent_control_flow_runs_program_by_program():
    def f(x):
        o = torch.empty_like(x)
        _pid_branch_kernel[(4,)](x, o, BLOCK=8)
        return o
    x = torch.randn(32, generator=_gen(3))
    ref = x.double().clone()
    ref[:8] *= 2
    for p in range(4):
        ref[8 * p:8 * p + 8] += p
    iv = fpx.interval(f)(x)
    assert _inside(iv, ref) and _inside(iv, f(x))


@triton.jit
def _atomic_old_kernel(o_ptr, x_ptr):
    old = tl.atomic_add(o_ptr, tl.load(x_ptr + tl.program_id(0)))
    tl.store(x_ptr + tl.program_id(0), old)


@triton.jit
def _frem_kernel(x_ptr, o_ptr):
    x = tl.load(x_ptr + tl.arange(0, 4))
    tl.store(o_ptr + tl.arange(0, 4), x % 0.75)


def test_order_dependent_atomic_results_and_unknown_ops_raise_naming_them():
    def f(x):
        o = torch.zeros(1)
        _atomic_old_kernel[(4,)](o, x)
        return o, x
    with pytest.raises(fpx.UnsupportedOpError, match="atomic_add"):
        fpx.interval(f)(torch.randn(4))

    def g(x):
        o = torch.empty(4)
        _frem_kernel[(1,)](x, o)
        return o
    with pytest.raises(fpx.UnsupportedOpError, match="create_frem"):
        fpx.interval(g)(torch.randn(4))


def test_the_interpreter_is_restored_and_plain_launches_are_untouched():
    from triton.runtime import interpreter as I
    before = (I.interpreter_semantic.builder, I.ReduceOps, I.ScanOps, I._patch_lang_tensor,
              I.InterpretedFunction.run)
    x, y = torch.randn(100), torch.randn(100)
    plain = xyx(x, y)
    with pytest.raises(fpx.UnsupportedOpError):
        fpx.interval(lambda x: _atomic_old_kernel_launch(x))(torch.randn(4))
    fpx.interval(xyx)(x, y)
    after = (I.interpreter_semantic.builder, I.ReduceOps, I.ScanOps, I._patch_lang_tensor,
             I.InterpretedFunction.run)
    assert before == after
    assert torch.equal(xyx(x, y), plain)


def _atomic_old_kernel_launch(x):
    o = torch.zeros(1)
    _atomic_old_kernel[(4,)](o, x)
    return x


def test_threads_each_get_their_own_semantics():
    """While an fpx program runs in one thread, plain launches in another keep Triton's own
    semantics (they are serialized with fpx's: the interpreter patches triton.language per
    launch)."""
    import threading

    from fpx.interop.triton import scope
    x, y = torch.randn(100), torch.randn(100)
    plain = xyx(x, y)
    out, errs, entered = {}, [], threading.Event()

    def bounded():
        try:
            with scope():
                entered.set()
                out["iv"] = [fpx.interval(xyx)(x, y) for _ in range(3)][-1]
        except Exception as e:      # pragma: no cover - reported below
            errs.append(e)
        finally:
            entered.set()

    def stock():
        try:
            entered.wait()
            out["plain"] = [xyx(x, y) for _ in range(6)]
        except Exception as e:      # pragma: no cover
            errs.append(e)
    ts = [threading.Thread(target=bounded), threading.Thread(target=stock)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs, errs
    assert all(torch.equal(p, plain) for p in out["plain"])
    assert _inside(out["iv"], x.double() * y.double() + x.double())


# ---- movement, custom combines, casts, atomics beyond add --------------------------------------
@triton.jit
def _combine_add(a, b):
    return a + b


@triton.jit
def _movement_kernel(x_ptr, o_ptr, s_ptr, m_ptr, i_ptr, B: tl.constexpr):
    r = tl.arange(0, B)
    x = tl.load(x_ptr + r[:, None] * B + r[None, :])            # (B, B)
    t = tl.trans(x) + x.T                                        # 2 x^T
    lo, hi = tl.split(tl.reshape(t, (B, B // 2, 2)))             # even / odd columns
    j = tl.reshape(tl.join(hi, lo), (B, B))                      # columns pairwise swapped
    g = tl.gather(j, tl.broadcast_to((B - 1 - r)[None, :], (B, B)), axis=1)   # reversed
    c = tl.cat(tl.sum(g, axis=1), tl.max(g, axis=1))
    y = tl.sigmoid(tl.clamp(g, -1.0, 1.0)).to(tl.bfloat16).to(tl.float32)
    tl.store(o_ptr + r[:, None] * B + r[None, :], y)
    tl.store(s_ptr + tl.arange(0, 2 * B), c)
    tl.store(s_ptr + 2 * B + r, tl.reduce(g, 1, _combine_add))
    tl.store(s_ptr + 3 * B + r, tl.sum(tl.associative_scan(g, 1, _combine_add), axis=1))
    tl.atomic_max(m_ptr, tl.max(tl.max(g, axis=1), axis=0))
    tl.store(i_ptr + r, tl.argmax(g, axis=1))
    pm, pn = tl.swizzle2d(tl.program_id(0), 0, 4, 4, 2)
    tl.device_assert(pm + pn >= 0, "swizzled ids are non-negative")


def _movement(x):
    B = x.shape[0]
    o, s = torch.empty_like(x), torch.empty(4 * B)
    m, i = torch.full((1,), -1e30), torch.empty(B, dtype=torch.int32)
    _movement_kernel[(1,)](x, o, s, m, i, B=B)
    return o, s, m, i


def test_movement_custom_combines_casts_and_atomic_max():
    B = 8
    x = torch.randn(B, B, generator=_gen(5))
    t = 2 * x.double().T
    j = t.reshape(B, B // 2, 2).flip(-1).reshape(B, B)
    g = j.flip(1)
    y = torch.sigmoid(g.clamp(-1, 1))
    iv_o, iv_s, iv_m, i = fpx.interval(_movement)(x)
    assert _inside(iv_o, y.to(torch.bfloat16).double())    # rounded to bfloat16 (RTNE)
    assert _inside(iv_s, torch.cat([g.sum(1), g.max(1).values, g.sum(1),
                                    g.cumsum(1).sum(1)]))
    assert _inside(iv_m, g.max().reshape(1))
    assert torch.equal(i.value if hasattr(i, "value") else i, g.argmax(1).int())
    plain = _movement(x)        # (its bfloat16 cast truncates: the interpreter's, not a GPU's)
    assert _inside(iv_s, plain[1]) and _inside(iv_m, plain[2])


def test_float16_atomic_add_bound_covers_every_order():
    """Split-K in float16: the GPU adds the programs' partial sums in any order, each add
    rounded to float16; the bound holds every order's result."""
    g = _gen(6)
    a, b = torch.randn(16, 64, generator=g).half(), torch.randn(64, 16, generator=g).half()
    iv = fpx.interval(lambda a, b: splitk(a, b, out_dtype=torch.float16))(a, b)
    parts = [(a[:, 16 * p:16 * p + 16].float() @ b[16 * p:16 * p + 16].float()).half().numpy()
             for p in range(4)]
    rng = np.random.default_rng(0)
    for _ in range(20):
        acc = np.zeros((16, 16), np.float16)
        for p in rng.permutation(4):
            acc = (acc + parts[p]).astype(np.float16)
        assert np.all(iv.lo <= acc) and np.all(acc <= iv.hi)


def test_reproducible_runs_kernels_with_correctly_rounded_ops():
    g = _gen(7)
    x, y = torch.randn(100, generator=g), torch.randn(100, generator=g)
    r = fpx.reproducible(xyx)(x, y)
    xn, yn = x.numpy(), y.numpy()
    assert np.array_equal(r.numpy(), xn * yn + xn)          # float32 ops, each rounded once


def test_float16_subnormal_column_sums_over_a_quarter_million_elements():
    """RENDER's case 1666 shape: float16 inputs in the subnormal range, 512 x 512; every
    float64 reference sum lies inside the bound (the bound has an absolute term)."""
    g = _gen(8)
    x = (torch.rand(512, 512, generator=g) * 6e-5).half()
    assert (x.float().abs() < 2.0 ** -14).float().mean() > 0.99
    iv = fpx.interval(lambda x: colsum(x, BM=64, BN=64))(x)
    assert _inside(iv, x.double().sum(0))


def test_bfloat16_matmul_and_kernels_named_through_a_module():
    g = _gen(9)
    a = torch.randn(24, 40, generator=g).to(torch.bfloat16)
    b = torch.randn(40, 24, generator=g).to(torch.bfloat16)

    class Mm(torch.nn.Module):
        def forward(self, a, b):
            return _kmod.mm(a, b, out_dtype=torch.float32)    # a launcher in another module
    iv = fpx.interval(Mm())(a, b)
    assert _inside(iv, a.double() @ b.double())


_kmod = __import__("types").ModuleType("_kmod")
_kmod.mm = matmul


@triton.jit
def _libdevice_kernel(x_ptr, o_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r)
    y = libdevice.tanh(x) + libdevice.pow(tl.abs(x), 1.5)
    tl.store(o_ptr + r, y + libdevice.erf(x) * libdevice.rsqrt(tl.abs(x) + 1.0))


def test_libdevice_functions_map_to_fpx_ops():
    def f(x):
        o = torch.empty_like(x)
        _libdevice_kernel[(1,)](x, o, N=x.numel())
        return o
    x = torch.randn(16, generator=_gen(10))
    d = x.double()
    ref = torch.tanh(d) + d.abs() ** 1.5 + torch.erf(d) / torch.sqrt(d.abs() + 1)
    iv = fpx.interval(f)(x)
    assert _inside(iv, ref) and np.max(iv.hi - iv.lo) < 1e-4


@triton.jit
def _const_kernel(o_ptr):
    r = tl.arange(0, 4)
    tl.store(o_ptr + r, tl.full((4,), 1.0, tl.float32) / 3.0)


def test_arithmetic_on_constants_inside_a_kernel_is_bounded_too():
    def f(x):
        o = torch.empty_like(x)
        _const_kernel[(1,)](o)
        return o + x
    iv = fpx.interval(f)(torch.zeros(4))
    assert np.all(iv.lo < 1 / 3) and np.all(1 / 3 < iv.hi)       # not the point fl(1/3)


@triton.jit
def _inplace_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(x_ptr + offs, x * 3.0 + 1.0, mask=m)


def test_a_kernel_updating_an_input_in_place_leaves_the_callers_tensor_alone():
    def f(x):
        _inplace_kernel[(2,)](x, x.numel(), BLOCK=32)
        _inplace_kernel[(2,)](x, x.numel(), BLOCK=32)      # reads the first launch's values
        return x
    x = torch.randn(50, generator=_gen(11))
    keep = x.clone()
    iv = fpx.interval(f)(x)
    assert torch.equal(x, keep)
    assert _inside(iv, (x.double() * 3 + 1) * 3 + 1)


@triton.jit
def _desc_rows_kernel(x_ptr, idx_ptr, o_ptr, acc_ptr, N, R: tl.constexpr, C: tl.constexpr):
    src = tl.make_tensor_descriptor(x_ptr, shape=[N, C], strides=[C, 1], block_shape=[1, C])
    dst = tl.make_tensor_descriptor(o_ptr, shape=[R, C], strides=[C, 1], block_shape=[1, C])
    acc = tl.make_tensor_descriptor(acc_ptr, shape=[R, C], strides=[C, 1], block_shape=[R, C])
    rows = tl.load(idx_ptr + tl.arange(0, R))
    g = src.gather(rows, 0) * 2.0                       # gathered rows
    dst.scatter(g, tl.arange(0, R), 0)
    acc.atomic_add([0, 0], g)                           # every program adds its rows


def test_descriptor_gather_scatter_and_atomic_add():
    def f(x, idx):
        o = torch.empty((8, 16))
        acc = torch.zeros((8, 16))
        _desc_rows_kernel[(3,)](x, idx, o, acc, x.shape[0], R=8, C=16)
        return o, acc
    g = _gen(12)
    x = torch.randn(20, 16, generator=g)
    idx = torch.randint(0, 20, (8,), generator=g, dtype=torch.int32)
    ref = 2 * x.double()[idx.long()]
    iv_o, iv_acc = fpx.interval(f)(x, idx)
    assert _inside(iv_o, ref) and _inside(iv_acc, 3 * ref)


@triton.jit
def _count_kernel(i_ptr, f_ptr):
    tl.atomic_add(i_ptr, 1)                       # the same update in every program
    tl.atomic_add(f_ptr, 0.1)


def test_a_program_independent_atomic_happens_once_per_program():
    def f(x):
        i = torch.zeros(1, dtype=torch.int32)
        _count_kernel[(5,)](i, x)
        return i, x
    i, iv = fpx.interval(f)(torch.zeros(1))
    assert int(np.asarray(i.value if hasattr(i, "value") else i).ravel()[0]) == 5
    assert _inside(iv, torch.tensor([0.5]))


def test_tf32_bound_holds_round_to_nearest_and_truncated_operands():
    g = _gen(13)
    a, b = torch.randn(16, 64, generator=g), torch.randn(64, 16, generator=g)
    iv = fpx.interval(lambda a, b: matmul(a, b, "tf32"))(a, b)

    def tf32(x, trunc):
        bits = x.numpy().view(np.uint32).astype(np.uint64)
        if not trunc:
            bits = bits + 0xFFF + ((bits >> 13) & 1)
        return torch.from_numpy((bits & 0xFFFFE000).astype(np.uint32).view(np.float32))
    for trunc in (False, True):
        ref = tf32(a, trunc).double() @ tf32(b, trunc).double()
        assert _inside(iv, ref), trunc


def _at_matmul(a_km, b, bug=False):
    """C = A^T B with A^T passed as a view (RENDER's case 1666); the bug swaps its strides."""
    at = a_km.t()
    M, K = at.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=torch.float32)
    sam, sak = (at.stride(1), at.stride(0)) if bug else at.stride()
    from test_triton_kernels import matmul_kernel
    matmul_kernel[(triton.cdiv(M, 16), triton.cdiv(N, 16))](
        at, b, c, M, N, K, sam, sak, b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BM=16, BN=16, BK=16, PREC="ieee", BUG="")
    return c


def test_transposed_view_operand_and_its_stride_bug():
    g = _gen(14)
    a_km, b = torch.randn(32, 32, generator=g).half(), torch.randn(32, 24, generator=g).half()
    ref = a_km.double().t() @ b.double()
    assert _inside(fpx.interval(_at_matmul)(a_km, b), ref)
    v = fpx.classify(lambda a, b: _at_matmul(a, b, bug=True), ref.float(), a_km, b)
    assert v.kind == "bug"


def test_a_launch_fpx_cannot_see_statically_still_runs_under_fpx():
    from test_triton_kernels import xyx_kernel
    table = {"xyx": xyx_kernel}                    # reached through a dict: not detected

    def run(x, y):
        o = torch.empty_like(x)
        table["xyx"][(2,)](x, y, o, x.numel(), BLOCK=64)
        return o
    from fpx.interop.triton import launches_kernels
    assert not launches_kernels(run)
    x, y = torch.randn(100, generator=_gen(15)), torch.randn(100, generator=_gen(16))
    iv = fpx.interval(run)(x, y)                   # torch.export fails, then the fallback
    assert _inside(iv, x.double() * y.double() + x.double())


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr, OUT: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    if OUT == "f16":
        c = tl.dot(a, b, out_dtype=tl.float16)           # a float16 accumulator
    elif OUT == "i32":
        c = tl.dot(a, b, out_dtype=tl.int32)
    else:
        c = tl.dot(a, b)
    tl.store(c_ptr + r[:, None] * N + r[None, :], c)


@pytest.mark.parametrize("operands,out,odt", [
    (torch.float16, "f16", torch.float16), (torch.int8, "i32", torch.int32),
    (torch.float8_e4m3fn, "", torch.float32)])
def test_dot_accumulators_and_operand_formats(operands, out, odt):
    def f(a, b):
        c = torch.empty((16, 16), dtype=odt)
        _dot_kernel[(1,)](a, b, c, N=16, OUT=out)
        return c
    g = _gen(17)
    a, b = ((torch.randn(16, 16, generator=g) * 3).to(operands) for _ in range(2))
    iv = fpx.interval(f)(a, b)
    assert _inside(iv, a.double() @ b.double())


@triton.jit
def _branch_kernel(x_ptr, o_ptr):
    s = tl.load(x_ptr) * 0.1 - tl.load(x_ptr + 1)        # about 0: its sign is round-off's
    if s > 0:
        tl.store(o_ptr, s + 1.0)
    else:
        tl.store(o_ptr, s - 1.0)


def test_a_branch_round_off_decides_makes_classify_inconclusive():
    def f(x):
        o = torch.empty(1)
        _branch_kernel[(1,)](x, o)
        return o
    x = torch.tensor([3.0, 0.3])
    assert fpx.classify(f, f(x), x).kind == "inconclusive"


def test_an_interval_input_flows_through_a_kernel():
    g = _gen(18)
    x, y = torch.randn(100, generator=g), torch.randn(100, generator=g)
    iv1 = fpx.interval(xyx)(x, y)
    iv2 = fpx.interval(xyx)(iv1, y)                    # the bounds of a bounded input
    r = x.double() * y.double() + x.double()
    assert _inside(iv2, r * y.double() + r)
    assert np.median(iv2.hi - iv2.lo) > np.median(iv1.hi - iv1.lo)
