"""``fpx.metrics``: how many bits of a stochastic-arithmetic result are real.

Samples have the sample axis first, ``(S, *shape)``: S runs of one program under random
rounding (``fpx.stochastic``, Verificarlo/Verrou, Fuzzy PyTorch), one result per element.
With ``Z`` the error of each sample against a reference ``x``,

* relative: ``Z = X/x - 1`` (computed as ``(X - x)/x``);
* absolute: ``Z = X - x``, counted from the leading bit of ``x``: ``Z' = Z / 2^floor(log2|x|)``
  (``x = 0``: from the units bit), as in Sohier et al. (p. 10) and the ``significantdigits``
  package,

``significant_bits`` estimates ``s`` such that ``|Z| <= 2^-s`` with probability ``p`` at
confidence ``1 - alpha`` (Sohier, de Oliveira Castro, Févotte, Lathuilière, Petit, Jamond,
"Confidence Intervals for Stochastic Arithmetic", ACM TOMS 47(2), 2021):

* ``"general"`` (non-parametric, Bernoulli): ``s = max{k integer : |Z_i| <= 2^-k for all i}``;
  it holds at ``(p, 1 - alpha)`` only when ``S >= ln(alpha)/ln(p)`` (59 for 0.95/0.95).
* ``"cnh"`` (centred normality hypothesis, ``Z ~ N(0, sigma^2)``):
  ``s = -log2(sigma_hat) - [1/2 log2((S-1)/chi2_{alpha/2; S-1}) + log2(Phi^-1((1+p)/2))]``,
  ``sigma_hat`` the sample standard deviation of ``Z`` (ddof=1, which the chi-square pivot
  ``(S-1) sigma_hat^2 / sigma^2 ~ chi2_{S-1}`` needs).

Results are float64 arrays of the output shape, clipped to ``[0, p_dtype]`` (``p_dtype`` the
samples' precision: 53 for float64, 24 float32, 11 float16, 8 bfloat16). CNH sees only the
spread of ``Z``: a bias (UD/CESTAC shift, or a reference that is off) is invisible to it, so
:func:`summarize` reports ``|bias|/std`` next to the bits. :func:`dice` is the segmentation
counterpart: the minimum Sørensen–Dice overlap over sample pairs, per label.

Defined results (docs/metrics.md): NaN in an element's samples (or its reference) gives NaN
bits for that element; samples equal to the reference (all-zero, all-``inf``) give full
precision; other infinite errors give 0 bits.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from fpx import formats

__all__ = ["significant_bits", "significant_digits", "summarize", "Summary", "dice",
           "min_samples_general", "SampleSizeWarning"]


class SampleSizeWarning(UserWarning):
    """The general estimator got fewer samples than its probability/confidence need."""


# ----------------------------------------------------------------------------
# Input conversion: everything is computed on the host in float64
# ----------------------------------------------------------------------------

def _host(x):
    """A NumPy array from NumPy/CuPy/torch/array-likes (no dtype change unless torch needs it)."""
    if type(x).__module__.split(".")[0] == "cupy" and hasattr(x, "get"):
        return x.get()
    if all(hasattr(x, a) for a in ("detach", "cpu", "numpy")):  # torch.Tensor
        t = x.detach().cpu()
        if t.is_floating_point() and str(t.dtype) not in ("torch.float16", "torch.float32",
                                                          "torch.float64"):
            t = t.double()  # bf16/fp8 tensors have no .numpy(); the values are exact in f64
        return t.numpy()
    return np.asarray(x)


def _precision(x, what: str) -> int:
    """Bits of precision (implicit bit included) of ``x``'s floating-point dtype."""
    try:
        return formats.of(x).p
    except TypeError:
        dt = getattr(x, "dtype", None)
        raise TypeError(f"{what} must be real floating-point, got dtype {dt}") from None
    except ValueError:  # a float dtype fpx does not model (longdouble, fnuz, ...)
        import ml_dtypes
        return int(round(1 - math.log2(float(ml_dtypes.finfo(np.asarray(x).dtype).eps))))


def _samples(samples):
    if not hasattr(samples, "dtype"):
        samples = np.asarray(samples)
    prec = _precision(samples, "samples")
    X = np.asarray(_host(samples), dtype=np.float64)
    if X.ndim == 0:
        raise ValueError("samples need a leading sample axis: shape (S, *shape), got a scalar")
    if X.shape[0] < 2:
        raise ValueError(f"need at least 2 samples along axis 0, got {X.shape[0]} "
                         f"(samples shape {X.shape})")
    return X, prec


def _reference(reference, shape):
    R = _host(reference)
    if R.dtype.kind not in "fiub":
        _precision(R, "reference")  # TypeError for complex/object; ml_dtypes floats pass
    R = np.asarray(R, dtype=np.float64)
    if R.ndim == len(shape) + 1 and R.shape[0] == 1:
        R = R[0]  # one run with its sample axis kept: ieee[None], mean(axis=0, keepdims=True)
    try:
        ok = np.broadcast_shapes(R.shape, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"reference of shape {R.shape} does not broadcast to the output "
                         f"shape {tuple(shape)} (samples of shape (S{''.join(f', {d}' for d in shape)}))")
    return np.broadcast_to(R, shape)


def _mean(X):
    """Sample mean over axis 0, free of overflow, and exactly the value when all samples agree."""
    with np.errstate(all="ignore"):
        amax = np.max(np.abs(X), axis=0)
        e = np.frexp(np.where(np.isfinite(amax) & (amax > 0), amax, 1.0))[1]
        m = np.ldexp(np.mean(np.ldexp(X, -e), axis=0), e)
        return np.where(np.all(X == X[0], axis=0), X[0], m)


def _check(method, error, probability, confidence):
    method, error = str(method).lower(), str(error).lower()
    if method not in ("general", "cnh"):
        raise ValueError(f"method must be 'general' or 'cnh', got {method!r}")
    if error not in ("relative", "absolute"):
        raise ValueError(f"error must be 'relative' or 'absolute', got {error!r}")
    for name, v in (("probability", probability), ("confidence", confidence)):
        if not 0.0 < float(v) < 1.0:
            raise ValueError(f"{name} must be in (0, 1), got {v!r}")
    return method, error


def min_samples_general(probability: float = 0.95, confidence: float = 0.95) -> int:
    """Smallest S for which the general estimator holds: ``ceil(ln(1-confidence)/ln(p))``."""
    _check("general", "relative", probability, confidence)
    return int(math.ceil(math.log1p(-confidence) / math.log(probability) - 1e-9))


# ----------------------------------------------------------------------------
# Significant bits
# ----------------------------------------------------------------------------

def _scaled_errors(X, reference, error):
    """(Z' as an (S, *shape) array, NaN mask of the elements) -- Z' scaled for absolute."""
    nan = np.isnan(X).any(axis=0)
    if reference is None:
        ref = _mean(X)
    else:
        ref = _reference(reference, X.shape[1:])
        nan = nan | np.isnan(ref)
    with np.errstate(all="ignore"):
        if error == "relative":
            Z = (X - ref) / ref
        else:
            Z = X - ref
            fin = np.isfinite(ref) & (ref != 0)
            E = np.where(fin, np.frexp(np.where(fin, ref, 1.0))[1] - 1, 0)  # floor(log2|x|)
            Z = np.ldexp(Z, -E)  # exact power-of-two scaling
        Z = np.where(X == ref, 0.0, Z)          # 0/0, inf-inf of equal values: no error
        Z = np.where(np.isnan(Z), np.inf, Z)    # finite vs inf reference, mixed +-inf mean
    return Z, nan


def _general(A, prec):
    """max{k : A <= 2^-k}, exactly (from the binary exponent, no log2 rounding)."""
    m, e = np.frexp(np.where(np.isfinite(A) & (A > 0), A, 1.0))
    s = (-e + (m == 0.5)).astype(np.float64)
    s = np.where(A == 0, prec, s)
    return np.where(np.isinf(A), 0.0, s)


def _cnh_delta(S, probability, confidence):
    from scipy import stats
    chi2 = stats.chi2.ppf((1.0 - confidence) / 2.0, S - 1)
    return 0.5 * math.log2((S - 1) / chi2) + math.log2(stats.norm.ppf((1.0 + probability) / 2.0))


def _cnh(Z, prec, probability, confidence):
    S = Z.shape[0]
    with np.errstate(all="ignore"):
        finite = np.isfinite(Z).all(axis=0)
        Zf = np.where(finite, Z, 0.0)
        sd = np.where(np.all(Zf == Zf[0], axis=0), 0.0, np.std(Zf, axis=0, ddof=1))
        # no spread but an offset (all samples equal, reference elsewhere): use the offset,
        # as significantdigits does, rather than claiming full precision
        sd = np.where(sd == 0, np.max(np.abs(Zf), axis=0), sd)
        s = -np.log2(np.where(sd > 0, sd, 1.0)) - _cnh_delta(S, probability, confidence)
    s = np.where(sd == 0, prec, s)
    return np.where(finite, s, 0.0)


def _significant_bits(samples, reference, method, error, probability, confidence, base,
                      stacklevel):
    method, error = _check(method, error, probability, confidence)
    if not float(base) > 1.0:
        raise ValueError(f"base must be > 1, got {base!r}")
    X, prec = _samples(samples)
    S = X.shape[0]
    Z, nan = _scaled_errors(X, reference, error)
    if method == "general":
        need = min_samples_general(probability, confidence)
        if S < need:
            got = (1.0 - confidence) ** (1.0 / S)
            warnings.warn(
                f"general estimator: the bound holds with probability {probability} at "
                f"confidence {confidence} only from S >= {need} samples; with S={S} it holds "
                f"with probability {got:.3f} (use more samples, or method='cnh')",
                SampleSizeWarning, stacklevel=stacklevel)
        s = _general(np.max(np.abs(Z), axis=0), prec)
    else:
        s = _cnh(Z, prec, probability, confidence)
    s = np.clip(s, 0.0, prec)
    s = np.where(nan, np.nan, s)
    if float(base) != 2.0:
        s = s * (math.log(2.0) / math.log(float(base)))
    return np.asarray(s, dtype=np.float64)


def significant_bits(samples, reference=None, *, method: str = "general",
                     error: str = "relative", probability: float = 0.95,
                     confidence: float = 0.95, base: float = 2) -> np.ndarray:
    """Significant bits of each element of ``samples`` (shape ``(S, *shape)``) -> ``shape``.

    ``reference``: None (the sample mean of each element), or an array broadcastable to
    ``shape`` (the IEEE run, an exact value). ``method``: ``"general"`` (integer
    ``max{k : |Z_i| <= 2^-k for all i}``; warns with :class:`SampleSizeWarning` when
    ``S < ln(1-confidence)/ln(probability)``) or ``"cnh"`` (``-log2 sigma_hat(Z)`` minus the
    chi-square/normal-quantile margin). ``error``: ``"relative"`` or ``"absolute"`` (counted
    from the reference's leading bit). ``base=10`` gives digits. Sohier et al., ACM TOMS 2021.
    Results are in ``[0, precision of the samples' dtype]``; NaN for elements with NaN samples.
    """
    return _significant_bits(samples, reference, method, error, probability, confidence, base,
                             stacklevel=3)


def significant_digits(samples, reference=None, *, method: str = "general",
                       error: str = "relative", probability: float = 0.95,
                       confidence: float = 0.95) -> np.ndarray:
    """:func:`significant_bits` in decimal digits (``bits * log10(2)``)."""
    return _significant_bits(samples, reference, method, error, probability, confidence, 10,
                             stacklevel=3)


# ----------------------------------------------------------------------------
# Summary
# ----------------------------------------------------------------------------

def _agg(f, a):
    a = np.asarray(a, dtype=np.float64).ravel()
    a = a[~np.isnan(a)]
    return float(f(a)) if a.size else float("nan")


@dataclass(repr=False)
class Summary:
    """Per-element statistics of ``S`` samples, with spread and bias side by side.

    ``mean``, ``std`` (ddof=1), ``bias`` (``mean - reference``; None when the reference is the
    sample mean), ``bits_general`` and ``bits_cnh`` are arrays of the output shape;
    ``bias_over_std`` is ``|bias|/std`` per element (``inf`` for a bias without spread). CNH
    sees only the spread, so a large ``bias_over_std`` means its bits are too optimistic
    against that reference.
    """
    n_samples: int
    shape: tuple
    error: str
    probability: float
    confidence: float
    mean: np.ndarray
    std: np.ndarray
    bias: np.ndarray | None
    bits_general: np.ndarray
    bits_cnh: np.ndarray
    min_samples_general: int

    @property
    def bias_over_std(self) -> np.ndarray | None:
        if self.bias is None:
            return None
        b = np.abs(self.bias)
        with np.errstate(all="ignore"):
            r = b / self.std
        return np.where(b == 0, 0.0, np.where(self.std == 0, np.inf, r))

    @property
    def general_min(self) -> float:
        return _agg(np.min, self.bits_general)

    @property
    def general_median(self) -> float:
        return _agg(np.median, self.bits_general)

    @property
    def cnh_min(self) -> float:
        return _agg(np.min, self.bits_cnh)

    @property
    def cnh_median(self) -> float:
        return _agg(np.median, self.bits_cnh)

    @property
    def bias_over_std_max(self) -> float | None:
        r = self.bias_over_std
        return None if r is None else _agg(np.max, r)

    @property
    def n_nan(self) -> int:
        return int(np.isnan(self.bits_cnh).sum())

    def __repr__(self) -> str:
        valid = ("" if self.n_samples >= self.min_samples_general
                 else f"  (holds at p={self.probability} only from S >= "
                      f"{self.min_samples_general})")
        r = self.bias_over_std_max
        bias = ("n/a (reference = sample mean)" if r is None
                else f"max {r:.3g}" + ("  <- bias the CNH bits do not see" if r > 1 else ""))
        lines = [
            f"Summary(S={self.n_samples}, shape={self.shape}, {self.error} error, "
            f"p={self.probability}, confidence={self.confidence}",
            f"  bits general: min {self.general_min:.4g} median {self.general_median:.4g}"
            + valid,
            f"  bits cnh:     min {self.cnh_min:.4g} median {self.cnh_median:.4g}",
            f"  |bias|/std:   {bias}",
        ]
        if self.n_nan:
            lines.append(f"  NaN elements: {self.n_nan}")
        return "\n".join(lines) + ")"


def summarize(samples, reference=None, *, error: str = "relative", probability: float = 0.95,
              confidence: float = 0.95) -> Summary:
    """Mean, std, bias and both significant-bit estimates of ``samples`` in one :class:`Summary`.

    The general estimator's :class:`SampleSizeWarning` is not raised here; the repr notes it.
    """
    X, _ = _samples(samples)
    kw = dict(error=error, probability=probability, confidence=confidence)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SampleSizeWarning)
        general = significant_bits(samples, reference, method="general", **kw)
    cnh = significant_bits(samples, reference, method="cnh", **kw)
    mean = _mean(X)
    with np.errstate(all="ignore"):
        std = np.std(X, axis=0, ddof=1)
        bias = None if reference is None else mean - _reference(reference, X.shape[1:])
    return Summary(n_samples=X.shape[0], shape=tuple(X.shape[1:]), error=str(error).lower(),
                   probability=probability, confidence=confidence, mean=mean, std=std,
                   bias=bias, bits_general=general, bits_cnh=cnh,
                   min_samples_general=min_samples_general(probability, confidence))


# ----------------------------------------------------------------------------
# Dice
# ----------------------------------------------------------------------------

_DICE_CHUNK = 1 << 24  # elements of an (S, chunk) indicator block; float32 counts stay exact


def dice(label_samples, labels=None) -> dict:
    """Minimum Sørensen–Dice coefficient over all sample pairs, per label.

    ``label_samples``: integer (or bool) array ``(S, ...)``, e.g. S argmax predictions or
    segmentations. ``Dice(A, B) = 2|A ∩ B| / (|A| + |B|)`` for the sets where a sample equals the
    label; 1 when both are empty. ``labels``: the labels to score (default: every label that
    appears). Returns ``{label: min over pairs i < j}``. One ``(S x N) @ (N x S)`` indicator
    product per label gives every pairwise intersection at once.
    """
    L = _host(label_samples)
    if L.dtype.kind == "b":
        L = L.astype(np.int64)
    if L.dtype.kind not in "iu":
        raise TypeError(f"label_samples must be integer labels, got dtype {L.dtype}")
    if L.ndim == 0 or L.shape[0] < 2:
        raise ValueError(f"need at least 2 label samples along axis 0, got shape {L.shape}")
    S = L.shape[0]
    L = L.reshape(S, -1)
    if labels is None:
        labels = np.unique(L)
    else:
        labels = np.asarray(_host(labels)).ravel()
        if labels.dtype.kind not in "iub":
            raise TypeError(f"labels must be integers, got dtype {labels.dtype}")
    N = L.shape[1]
    chunk = max(1, min(N, _DICE_CHUNK // S))
    iu = np.triu_indices(S, 1)
    out = {}
    for lab in labels:
        G = np.zeros((S, S))
        for j in range(0, N, chunk):
            A = (L[:, j:j + chunk] == lab).astype(np.float32)  # counts <= chunk < 2^24: exact
            G += A @ A.T
        n = np.diag(G)
        den = n[:, None] + n[None, :]
        with np.errstate(all="ignore"):
            D = np.where(den == 0, 1.0, 2.0 * G / den)
        out[lab.item()] = float(D[iu].min())
    return out
