"""fpx.nn's resizing and group-statistics composites (conv_transpose, adaptive_avg_pool,
upsample_nearest, group_norm, instance_norm, norm_stats) against torch's own functions: the
eager value close to torch's in float64 and float32, and the interval bound of the float32
program containing torch's float32 output and the float64 output on the same inputs."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import fpx  # noqa: E402
import fpx.nn as fnn  # noqa: E402

TOL = {np.float64: 1e-12, np.float32: 2e-5}


def _rng(seed):
    return np.random.default_rng(seed)


def _check(fpx_fn, torch_fn, *inputs, exact=False, cond=1.0):
    """``fpx_fn`` and ``torch_fn`` (each a function of arrays / tensors returning one array
    or a tuple) agree in float64 and float32 on the inputs rounded to float32, and the
    float32 program's interval bound holds both torch results. ``cond`` scales the value
    tolerance (the condition number of a cancelling normalization)."""
    x32 = [np.asarray(a, np.float32) for a in inputs]
    outs = {}
    for dt in (np.float64, np.float32):
        xs = [a.astype(dt) for a in x32]          # the same numbers in both precisions
        got = fpx_fn(*xs)
        ref = torch_fn(*(torch.from_numpy(a) for a in xs))
        got, ref = (got, ref) if isinstance(got, tuple) else ((got,), (ref,))
        for g, r in zip(got, ref):
            r = r.numpy()
            assert g.dtype == r.dtype and g.shape == r.shape
            if exact:
                assert np.array_equal(g, r)
            else:
                scale = float(np.max(np.abs(r))) or 1.0
                tol = TOL[dt] * cond
                np.testing.assert_allclose(g, r, rtol=tol, atol=tol * scale)
        outs[dt] = ref
    ivs = fpx.interval(fpx_fn)(*x32)
    ivs = ivs if isinstance(ivs, tuple) else (ivs,)
    for iv, r32, r64 in zip(ivs, outs[np.float32], outs[np.float64]):
        assert iv.contains(r32.numpy()).all()
        assert iv.contains(r64.numpy()).all()
    return ivs


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("stride,padding,output_padding,dilation", [
    (1, 0, 0, 1), (2, 1, 1, 1), (3, 2, 0, 2), (2, 0, 1, 2), (1, 3, 0, 1)])
def test_conv_transpose_is_torchs(nd, groups, stride, padding, output_padding, dilation):
    rng = _rng(nd * 10 + groups)
    x = rng.standard_normal((2, 4) + (6,) * nd)
    w = rng.standard_normal((4, 3) + (3,) * nd)
    b = rng.standard_normal(3 * groups)
    tfn = getattr(F, f"conv_transpose{nd}d")
    _check(lambda x, w, b: fnn.conv_transpose(x, w, b, stride, padding, output_padding, groups,
                                              dilation, bias_in_sum=True),
           lambda x, w, b: tfn(x, w, b, stride, padding, output_padding, groups, dilation),
           x, w, b)


def test_conv_transpose_unbatched_and_errors():
    rng = _rng(1)
    x, w = rng.standard_normal((4, 5)), rng.standard_normal((4, 2, 3))
    y = fnn.conv_transpose(x, w, stride=2)
    np.testing.assert_allclose(y, F.conv_transpose1d(torch.from_numpy(x), torch.from_numpy(w),
                                                     stride=2).numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="channels"):
        fnn.conv_transpose(rng.standard_normal((1, 3, 5)), w)
    with pytest.raises(ValueError, match="output_padding"):
        fnn.conv_transpose(x, w, stride=2, output_padding=2)
    with pytest.raises(ValueError, match="bias"):
        fnn.conv_transpose(x, w, np.zeros(3))


@pytest.mark.parametrize("shape,out", [
    ((2, 3, 10), (4,)), ((2, 3, 7), (7,)), ((2, 3, 9, 6), (1, 1)), ((2, 3, 9, 7), (4, 3)),
    ((1, 2, 5, 6, 7), (2, 3, 4)), ((3, 8, 8), (3, 5))])
def test_adaptive_avg_pool_is_torchs(shape, out):
    x = _rng(len(shape)).standard_normal(shape) * 3 + 1
    tfn = getattr(F, f"adaptive_avg_pool{len(out)}d")
    _check(lambda x: fnn.adaptive_avg_pool(x, out), lambda x: tfn(x, out), x)


def test_adaptive_avg_pool_keeps_dims_given_as_none_and_checks_sizes():
    x = _rng(2).standard_normal((2, 3, 6, 5))
    np.testing.assert_allclose(fnn.adaptive_avg_pool(x, (4, None)),
                               F.adaptive_avg_pool2d(torch.from_numpy(x), (4, None)).numpy(),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="positive"):
        fnn.adaptive_avg_pool(x, (0, 2))


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 5, 6), (1, 2, 3, 4, 5)])
def test_upsample_nearest_is_torchs_gather(shape, exact):
    x = _rng(3).standard_normal(shape)
    nd = len(shape) - 2
    mode = "nearest-exact" if exact else "nearest"
    for kw in ({"scale_factor": 2.0}, {"scale_factor": 1.5}, {"scale_factor": 0.5},
               {"scale_factor": 3.3}, {"size": tuple(n + 3 for n in shape[2:])},
               {"size": tuple(max(1, n - 2) for n in shape[2:])}):
        ivs = _check(lambda x: fnn.upsample_nearest(x, exact=exact, **kw),
                     lambda x: F.interpolate(x, mode=mode, **kw), x, exact=True)
        assert np.all(ivs[0].width == 0), kw          # a gather: exact
    with pytest.raises(ValueError, match="size or scale_factor"):
        fnn.upsample_nearest(x)
    with pytest.raises(ValueError, match="positive"):
        fnn.upsample_nearest(x, (0,) * nd)


@pytest.mark.parametrize("offset,scale", [(0.0, 1.0), (1000.0, 0.01)])
@pytest.mark.parametrize("shape,groups", [((3, 6, 5, 5), 2), ((2, 4, 33), 1), ((2, 8, 4, 4), 8),
                                          ((4, 6), 3)])
def test_group_norm_is_torchs(shape, groups, offset, scale):
    rng = _rng(4)
    x = rng.standard_normal(shape) * scale + offset
    w, b = rng.uniform(0.5, 2.0, shape[1]), rng.standard_normal(shape[1])
    cond = (offset + scale) / scale              # x - mean cancels: values agree to cond·u
    _check(lambda x, w, b: fnn.group_norm(x, groups, w, b, 1e-5),
           lambda x, w, b: F.group_norm(x, groups, w, b, 1e-5), x, w, b, cond=cond)
    _check(lambda x: fnn.group_norm(x, groups), lambda x: F.group_norm(x, groups), x, cond=cond)


def test_group_norm_checks_groups_and_affine_shapes():
    x = np.zeros((2, 6, 3))
    with pytest.raises(ValueError, match="groups"):
        fnn.group_norm(x, 4)
    with pytest.raises(ValueError, match="weight"):
        fnn.group_norm(x, 2, np.ones(3))


@pytest.mark.parametrize("shape", [(2, 4, 9, 9), (2, 3, 40), (1, 2, 3, 4, 5)])
def test_instance_norm_is_torchs(shape):
    rng = _rng(5)
    x = rng.standard_normal(shape) * 2 - 1
    w, b = rng.uniform(0.5, 2.0, shape[1]), rng.standard_normal(shape[1])
    _check(lambda x, w, b: fnn.instance_norm(x, w, b), lambda x, w, b: F.instance_norm(
        x, weight=w, bias=b), x, w, b)
    with pytest.raises(ValueError, match="spatial"):
        fnn.instance_norm(np.zeros((2, 3)))


@pytest.mark.parametrize("shape,k", [((4, 16), 1), ((2, 3, 8), 2), ((5, 7), 2)])
def test_norm_stats_are_torchs_layer_norm_statistics(shape, k):
    """(mean, rstd) over the last k dims, as torch's native_layer_norm returns them."""
    x = _rng(6).standard_normal(shape) * 0.5 + 3
    axes = tuple(range(len(shape) - k, len(shape)))
    _check(lambda x: fnn.norm_stats(x, axes, 1e-5),
           lambda x: torch.ops.aten.native_layer_norm(x, shape[-k:], None, None, 1e-5)[1:], x)
