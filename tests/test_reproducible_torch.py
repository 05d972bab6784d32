"""fpx.reproducible on torch programs through the adapter: modules' forward passes and
training steps (forward, loss.backward(), an optimizer step) give the same bits across thread
counts, batch sizes and memory layouts (docs/reproducible.md, "torch programs")."""
import copy

import numba
import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import fpx  # noqa: E402

ORDERS = ("sequential", "pairwise", "exact")


def bits(t):
    a = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(bits(a), bits(b))


def threads(n, fn, *args, **kwargs):
    """fn(*args, **kwargs) with numba on n threads (restored after)."""
    old = numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        return fn(*args, **kwargs)
    finally:
        numba.set_num_threads(old)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 48), nn.GELU(), nn.Linear(48, 48), nn.Tanh(),
                         nn.Linear(48, 10), nn.Softmax(-1)).eval()


def cnn():
    torch.manual_seed(1)
    bn = nn.BatchNorm2d(6)
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), bn, nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 8, 3, stride=2), nn.SiLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 5)).eval()


def encoder():
    torch.manual_seed(2)
    return nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()


MODELS = {"mlp": (mlp, (64, 20)), "cnn": (cnn, (64, 3, 10, 10)), "encoder": (encoder, (64, 7, 32))}


def other_layout(x):
    """The same values in another memory layout (F order / channels last)."""
    if x.ndim == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x.permute(*reversed(range(x.ndim))).contiguous().permute(*reversed(range(x.ndim)))


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("order", ORDERS)
def test_module_forward_is_the_same_across_threads_batches_and_layouts(name, order):
    make, shape = MODELS[name]
    m = make()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    f = fpx.reproducible(m, order=order)
    y = threads(2, f, x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    with torch.no_grad():
        assert torch.allclose(y, m(x), rtol=1e-4, atol=1e-5)
    assert same(threads(1, f, x), y)                                   # 1 vs 2 threads
    assert same(f(x[17:18])[0], y[17])                                 # batch 1 vs 64
    assert same(f(x[40:47]), y[40:47])
    lay = other_layout(x)
    assert not lay.is_contiguous()
    assert same(f(lay), y)                                             # C vs F order


def test_module_check_and_narrow_dtypes():
    m = mlp()
    x = torch.randn(8, 20, generator=torch.Generator().manual_seed(4))
    y = fpx.reproducible(m, check=True)(x)
    assert same(y, fpx.reproducible(m)(x))
    mb = copy.deepcopy(m).to(torch.bfloat16)
    yb = fpx.reproducible(mb)(x.to(torch.bfloat16))
    assert yb.dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.allclose(yb.float(), mb(x.to(torch.bfloat16)).float(), atol=2e-2)


def test_function_of_tensors_and_unsupported_ops():
    a = torch.randn(5, 7, generator=torch.Generator().manual_seed(5))
    b = torch.randn(7, 3, generator=torch.Generator().manual_seed(6))
    f = fpx.reproducible(lambda a, b: torch.softmax(a @ b, -1).sum(0))
    y = f(a, b)
    assert isinstance(y, torch.Tensor) and same(threads(1, f, a, b), y)
    p = fpx.reproducible(lambda a: torch.pow(a.abs(), 2.5))(a)      # correctly rounded
    assert same(p.numpy(), fpx.reproducible(lambda a: np.abs(a) ** np.float32(2.5))(a.numpy()))
    from fpx.interop.torch import UnmappedOpError
    with pytest.raises(UnmappedOpError, match="bessel_j0"):
        fpx.reproducible(lambda a: torch.special.bessel_j0(a))(a)


# -- training steps -------------------------------------------------------------------------
def _step(model, opt):
    """One training step of ``model`` (cross entropy, backward, ``opt.step()``)."""
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def _train(make, opt_cls, x, y, steps=2, **opt_kw):
    """(parameters, losses) after ``steps`` training steps run under fpx.reproducible, on a
    fresh copy of the model (dropout-free, train mode)."""
    model = make().train()
    opt = opt_cls(model.parameters(), **opt_kw)

    step = _step(model, opt)
    losses = [fpx.reproducible(step)(x, y) for _ in range(steps)]
    return [p.detach().clone() for p in model.parameters()], losses


def _plain(make, opt_cls, x, y, steps=2, **opt_kw):
    model = make().train()
    opt = opt_cls(model.parameters(), **opt_kw)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def _train_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 48), nn.Tanh(), nn.Linear(48, 48), nn.GELU(),
                         nn.Linear(48, 10))


def _train_cnn():
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 8, 3, stride=2, groups=2), nn.SiLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


TRAIN = {"mlp-sgd": (_train_mlp, (16, 20), torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
         "cnn-adam": (_train_cnn, (8, 3, 10, 10), torch.optim.Adam, dict(lr=1e-2))}


@pytest.mark.parametrize("name", list(TRAIN))
def test_training_step_gives_the_same_parameters_across_threads_and_layouts(name):
    make, shape, opt_cls, kw = TRAIN[name]
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(shape, generator=g), torch.randint(0, 10, shape[:1], generator=g)
    params, losses = threads(2, _train, make, opt_cls, x, y, 2, **kw)
    assert losses[0].dtype == torch.float32 and losses[1] < losses[0]
    plain = _plain(make, opt_cls, x, y, 2, **kw)
    for p, q in zip(params, plain):                     # close to torch's own step
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-5)
    for again in (threads(1, _train, make, opt_cls, x, y, 2, **kw),
                  _train(make, opt_cls, other_layout(x), y, 2, **kw)):
        assert all(same(p, q) for p, q in zip(params, again[0]))
        assert all(same(a, b) for a, b in zip(losses, again[1]))


def test_training_step_leaves_no_trace_of_fpx_in_the_optimizer_state():
    """The step's in-place updates land in the user's parameters and optimizer state, which
    hold ordinary tensors afterwards (a plain step can follow)."""
    make, shape, opt_cls, kw = TRAIN["cnn-adam"]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(8))
    y = torch.arange(shape[0]) % 10
    model = make().train()
    opt = opt_cls(model.parameters(), **kw)

    step = _step(model, opt)
    fpx.reproducible(step)(x, y)
    for p in model.parameters():
        st = opt.state[p]
        assert type(p.grad) is torch.Tensor and type(st["exp_avg"]) is torch.Tensor
        assert float(st["step"]) == 1.0
    step(x, y)                                           # plain torch goes on from there
    assert all(float(opt.state[p]["step"]) == 2.0 for p in model.parameters())


def test_check_refuses_functions_of_tensors_and_report_names_torch():
    a = torch.randn(4, 5, generator=torch.Generator().manual_seed(9))
    with pytest.raises(ValueError, match="check=True runs f twice"):
        fpx.reproducible(lambda a: a.exp(), check=True)(a)
    y, rep = fpx.reproducible(mlp(), report=True, check=True)(torch.randn(3, 20))
    assert isinstance(y, torch.Tensor) and rep["fingerprint"]["torch"] == torch.__version__


@pytest.mark.parametrize("nd", [1, 2])
def test_convolution_backward_and_scatter_add_match_torch(nd):
    """The backward ops fpx writes itself: convolution_backward (stride, padding, dilation,
    groups) against autograd's, scatter_add with repeated indices against its sequential
    definition."""
    g = torch.Generator().manual_seed(10)
    conv = F.conv1d if nd == 1 else F.conv2d
    x = torch.randn((3, 4) + (11,) * nd, generator=g)
    w = torch.randn((6, 2) + (3,) * nd, generator=g)
    b = torch.randn(6, generator=g)
    gy = torch.randn_like(conv(x, w, b, stride=2, padding=1, dilation=2, groups=2))

    def grads(x, w, b, gy):
        x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
        y = conv(x, w, b, stride=2, padding=1, dilation=2, groups=2)
        return torch.autograd.grad(y, (x, w, b), gy)
    got = fpx.reproducible(grads)(x, w, b, gy)
    for a, r in zip(got, grads(x, w, b, gy)):
        assert a.shape == r.shape and torch.allclose(a, r, rtol=1e-4, atol=1e-5)
    src = torch.randn(4, 50, generator=g)
    idx = torch.randint(0, 5, (4, 50), generator=g)
    base = torch.randn(4, 5, generator=g)
    got = fpx.reproducible(lambda b, i, s: torch.scatter_add(b, 1, i, s))(base, idx, src)
    want = base.clone()
    for r in range(4):
        for k in range(50):
            want[r, idx[r, k]] = want[r, idx[r, k]] + src[r, k]
    assert same(got, want)


_CHILD = """
import sys, numpy as np, torch
sys.path.insert(0, {tests!r})
import test_reproducible_torch as t
make, shape, opt_cls, kw = t.TRAIN[{name!r}]
g = torch.Generator().manual_seed(7)
x, y = torch.randn(shape, generator=g), torch.randint(0, 10, shape[:1], generator=g)
params, _ = t._train(make, opt_cls, x, y, 2, **kw)
np.save({out!r}, np.concatenate([p.numpy().ravel() for p in params]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TRAIN))
def test_training_step_gives_the_same_parameters_in_another_process(name, tmp_path):
    """Two SGD/Adam steps in a fresh process on one numba thread: the parameters' bits equal
    this process's."""
    import os
    import subprocess
    import sys
    make, shape, opt_cls, kw = TRAIN[name]
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(shape, generator=g), torch.randint(0, 10, shape[:1], generator=g)
    params, _ = _train(make, opt_cls, x, y, 2, **kw)
    out = str(tmp_path / "params.npy")
    code = _CHILD.format(tests=os.path.dirname(os.path.abspath(__file__)), name=name, out=out)
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=600)
    here = np.concatenate([p.numpy().ravel() for p in params])
    assert np.array_equal(bits(np.load(out)), bits(here))
