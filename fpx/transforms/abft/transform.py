"""``fpx.abft``, the user's function (with ``abft.calibrate`` and ``abft.presets``), and the
calibration of e_max on this machine (the V-ABFT paper's protocol, Section 3.6)."""
from __future__ import annotations

import numpy as np

from fpx import formats
from fpx.core import Tracer
from fpx.transform import run, transformed
from fpx.transforms.abft.gemm import model_of, param_names
from fpx.transforms.abft.interpreter import AbftInterpreter, check_options
from fpx.transforms.abft.sums import row_sums
from fpx.transforms.abft.thresholds import PRESETS, Info, paper_inputs, vabft

__all__ = ["abft", "calibrate", "Calibration"]


def _abft(f, *, threshold="v-abft", e_max=None, c_sigma=2.5, correct=True, verify="online",
          report=False, output=None, checksums="auto"):
    """``fpx.abft(f, ...)(*args)``: run ``f`` with every GEMM checksummed, verified, located
    and (``correct=True``) corrected. See docs/abft.md.

    * ``threshold``: ``"v-abft"`` (Eq. 23 of Gao, Hua & Chen), ``"a-abft"`` (the baseline),
      ``"rigorous"`` (never a false alarm), or ``T(A, B, info) -> per-row thresholds``.
    * ``e_max``: None (fpx's CPU defaults), a number, a preset name (``abft.presets``), a dict
      {format: value or f(K, N)}, a callable f(K, N), or a :class:`Calibration`.
    * ``c_sigma``: the confidence multiplier (2.5 in the paper, 5.39 in its artifact).
    * ``verify``: ``"online"`` checks the float32 accumulator, ``"offline"`` the output
      rounded to its format (bf16, fp16: the paper's ~1000x coarser detection).
    * ``output``: the GEMMs' output format (default: the operands' format; float16 for fp8).
    * ``checksums``: ``"auto"`` (row checks; column checks where the output has one column),
      ``"row"``, ``"column"`` or ``"both"`` (Huang-Abraham's full checksum, twice the cost).
    * ``report=True``: return ``(outputs, report)`` (:class:`~fpx.transforms.abft.report.Report`).
    """
    opts = dict(threshold=threshold, e_max=e_max, c_sigma=c_sigma, correct=correct,
                verify=verify, output=output, checksums=checksums)
    check_options(threshold, c_sigma, verify, checksums, output)

    def body(ad):
        names = param_names(ad)
        interp, out = run(lambda p: AbftInterpreter(p, names=names, **opts),
                          Tracer, ad.fn, ad.args, ad.kwargs, lambda i, x: _unwrap(i, x))
        return (out, interp.report) if report else out
    return transformed(f, body)


def _unwrap(interp, x):
    from fpx.core import concrete
    return concrete(x) if isinstance(x, Tracer) else x


# ---------------------------------------------------------------------------------------------
# calibration
# ---------------------------------------------------------------------------------------------
class Calibration:
    """``e_max`` (the largest relative verification error seen, times ``margin``) and the
    per-size maxima ``per_size`` {(M, K, N): max |E| / (|checksum| or V-ABFT's threshold at
    e_max = 1, as ``relative_to`` says)}; pass it as ``e_max=``."""

    __slots__ = ("e_max", "per_size", "format", "verify", "trials", "relative_to")

    def __init__(self, e_max, per_size, fmt, verify, trials, relative_to="checksum"):
        self.e_max, self.per_size, self.format = e_max, per_size, fmt
        self.verify, self.trials, self.relative_to = verify, trials, relative_to

    def __float__(self):
        return float(self.e_max)

    def __repr__(self):
        sizes = ", ".join(f"{k}: {v:.3g}" for k, v in self.per_size.items())
        return (f"Calibration(e_max={self.e_max:.4g} for {self.format} {self.verify}, "
                f"{self.trials} trials per size; max |E| relative to {self.relative_to}: {sizes})")


def _sizes(sizes):
    out = []
    for s in sizes:
        out.append((int(s),) * 3 if np.isscalar(s) else tuple(int(v) for v in s))
    return out


def calibrate(dtype, sizes=(64, 128, 256, 512), trials=100, *, verify="online", output=None,
              margin=1.2, seed=0, batch_bytes=2 ** 26, inputs=("|N(1,1)|",), gemm=None,
              relative_to="checksum", c_sigma=2.5):
    """Measure e_max on this machine and backend (the paper's protocol): ``trials`` GEMMs per
    size (n or (M, K, N)) and input distribution (``inputs``: names of
    ``thresholds.paper_inputs``; the paper's |N(1, 1)|, positive so the checksum does not
    cancel) in ``dtype``, the largest relative verification error, times ``margin``.
    ``relative_to="checksum"``: |E| / |checksum| (the paper's Eq. 25); ``"v-abft"``: |E| over
    V-ABFT's threshold with e_max = 1 (the e_max that threshold needed: what fpx's defaults
    are fitted to). The GEMMs run as fpx.abft runs them (the same model and checksums),
    batched, on NumPy's BLAS or ``gemm(A, B)`` (another library or summation order: the
    operands in the accumulator's dtype, (G, M, K) and (G, K, N))."""
    if relative_to not in ("checksum", "v-abft"):
        raise ValueError(f"fpx.abft.calibrate: relative_to must be 'checksum' or 'v-abft', got "
                         f"{relative_to!r}")
    F = formats.get(dtype)
    model = model_of(F.dtype, F.dtype, output)
    rng = np.random.default_rng(seed)
    offline = verify == "offline" and model.stores
    fmt = model.out if offline else formats.get(model.acc)
    per = {}
    for (M, K, N) in _sizes(sizes):
        worst = 0.0
        g = max(1, min(int(trials), batch_bytes // max(4 * (M * K + K * N + 2 * M * N), 1)))
        for d in inputs:
            left = int(trials)
            while left > 0:
                worst = max(worst, _worst(F, model, offline, rng, d, (min(g, left), M, K, N),
                                          gemm, relative_to, c_sigma))
                left -= g
        per[(M, K, N)] = worst
    return Calibration(margin * max(per.values()), per, fmt.name, verify, int(trials),
                       relative_to)


def _worst(F, model, offline, rng, dist, shape, gemm, relative_to, c_sigma):
    """The largest relative verification error of one batch of clean GEMMs."""
    g, M, K, N = shape
    acc = model.acc
    A = paper_inputs(dist, rng, (g, M, K)).astype(F.dtype).astype(acc)
    B = paper_inputs(dist, rng, (g, K, N)).astype(F.dtype).astype(acc)
    C = np.asarray(gemm(A, B) if gemm is not None else np.matmul(A, B), acc)
    if offline:
        C = C.astype(model.out.dtype).astype(acc)
    s = row_sums(A, B, C, ext=relative_to == "v-abft")
    with np.errstate(all="ignore"):
        den = np.abs(s.chk) if relative_to == "checksum" else \
            vabft.of(s, Info(K=K, N=N, e_max=1.0, c_sigma=c_sigma))
        return float(np.max(np.abs(s.obs - s.chk) / den))


class _Abft:
    """``fpx.abft``: a function with ``calibrate`` and ``presets`` attributes."""

    calibrate = staticmethod(calibrate)
    presets = PRESETS
    Calibration = Calibration

    def __call__(self, f, **kw):
        return _abft(f, **kw)

    __doc__ = _abft.__doc__

    def __repr__(self):
        return "<fpx.abft>"


abft = _Abft()
