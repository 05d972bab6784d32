"""Verification thresholds: V-ABFT's variance bound (Eq. 23), the A-ABFT baseline, the
rigorous a-priori bound of the two checksum paths, and the e_max table (CPU defaults, the
paper's platforms as presets).

Each threshold is a function ``T(A, B, info) -> (G, M)`` of float64 per-row thresholds for the
row check of ``C = A @ B`` (A (G|1, M, K), B (G|1, K, N) in the accumulator's dtype); the column
check calls it on ``(B^T, A^T)``. ``info`` (:class:`Info`) carries the format whose values are
verified, e_max, c_sigma and the row sums the check already computed. A user's callable has the
same signature. The built-ins also evaluate from the sums of :mod:`.sums` (``T.of(sums,
info)``, the statistics ``T.needs``), which the check's fused passes compute in one read of
each operand.
"""
from __future__ import annotations

import math

import numpy as np

from fpx import formats

__all__ = ["Info", "vabft", "aabft", "aabft_sigma", "AAbft", "rigorous", "THRESHOLDS",
           "PRESETS", "DEFAULT_EMAX", "e_max_for", "resolve"]


class Info:
    """What a threshold may use: ``fmt`` (Format of the verified values: the accumulator's
    online, the output's offline), ``acc`` (the accumulator's Format), ``out`` (the output's),
    ``verify``, ``K``, ``N`` (inner and checked dimension), ``e_max``, ``c_sigma``,
    ``b_sum`` ((G|1, K) float64: B's row sums as the checksum computed them) and ``C`` (the
    result as verified, (G, M, N))."""

    __slots__ = ("fmt", "acc", "out", "verify", "K", "N", "e_max", "c_sigma", "b_sum", "C")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))


PAPER_INPUTS = ("N(1e-6,1)", "N(1,1)", "U(-1,1)", "trunc N(0,1)")


def paper_inputs(name, rng, shape):
    """Float64 samples of one of the V-ABFT paper's input distributions: ``PAPER_INPUTS``,
    ``"U(0,1)"``, or ``"|N(1,1)|"`` (its calibration protocol); ``trunc N(0,1)`` is N(0, 1)
    truncated to [-1, 1]."""
    if name == "N(1e-6,1)":
        return rng.normal(1e-6, 1.0, shape)
    if name == "N(1,1)":
        return rng.normal(1.0, 1.0, shape)
    if name == "|N(1,1)|":
        return np.abs(rng.normal(1.0, 1.0, shape))
    if name == "U(-1,1)":
        return rng.uniform(-1.0, 1.0, shape)
    if name == "U(0,1)":
        return rng.uniform(0.0, 1.0, shape)
    if name != "trunc N(0,1)":
        raise ValueError(f"fpx.abft: unknown input distribution {name!r}")
    x = rng.normal(0.0, 1.0, shape)
    while (bad := np.abs(x) > 1).any():
        x[bad] = rng.normal(0.0, 1.0, int(bad.sum()))
    return x


# ---------------------------------------------------------------------------------------------
# V-ABFT (Gao, Hua, Chen), Eq. 23 with the extrema-variance bound (Theorem 1)
# ---------------------------------------------------------------------------------------------
def _plain_sums(A, B, info, **need):
    """The reference (NumPy) sums of the row check, for a threshold called as T(A, B, info)."""
    from fpx.transforms.abft.sums import row_sums
    C = info.C if info.C is not None else np.matmul(A, B)
    return row_sums(A, B, C, kernel="numpy", **need)


def _builtin(of, **need):
    """A built-in threshold: callable as ``T(A, B, info)`` (its statistics computed by plain
    NumPy) and, through ``T.of(sums, info)``, from the sums the check's passes computed
    (:mod:`.sums`; ``T.needs`` names them)."""
    def T(A, B, info):
        return of(_plain_sums(A, B, info, **need), info)
    T.of, T.needs = of, need
    T.__name__, T.__doc__ = of.__name__.lstrip("_"), of.__doc__
    return T


def _mean_var(sums, hi, lo, n):
    """Row means and the extrema bound of the row variances, (max - mu)(mu - min) >= sigma^2."""
    mu = sums / n
    return mu, np.maximum((hi - mu) * (mu - lo), 0.0)


def _vabft(s, info):
    """e_max (N|mu_A| sum|mu_Bk| + c sqrt(N mu_A^2 sum s_Bk^2 + N^2 s_A^2 sum mu_Bk^2)
    + c sqrt(N) s_A sqrt(sum s_Bk^2)), per row of A; from A's and B's row sums, maxima and
    minima (O(MK + KN))."""
    K, N, c = info.K, info.N, info.c_sigma
    with np.errstate(all="ignore"):
        mu_a, var_a = _mean_var(s.a_sum, s.a_max, s.a_min, K)
        mu_b, var_b = _mean_var(s.b1, s.b_max, s.b_min, N)
        s1 = np.abs(mu_b).sum(-1)[..., None]
        s2 = var_b.sum(-1)[..., None]
        s3 = (mu_b * mu_b).sum(-1)[..., None]
        t = (N * np.abs(mu_a) * s1
             + c * np.sqrt(N * mu_a * mu_a * s2 + N * N * var_a * s3)
             + c * np.sqrt(N * var_a * s2))
    return info.e_max * t


vabft = _builtin(_vabft, ext=True)


# ---------------------------------------------------------------------------------------------
# A-ABFT (Braun, Halder, Wunderlich 2014) as the V-ABFT paper reproduces it
# ---------------------------------------------------------------------------------------------
def aabft_sigma(n, t, y):
    """sigma(Delta s_n) <= sqrt((n(n+1)(n+0.5) + 2n)/24) 2^-t y: the standard deviation of an
    n-term inner product's rounding error with t significand bits and largest product y."""
    return math.sqrt((n * (n + 1) * (n + 0.5) + 2 * n) / 24) * 2.0 ** -t * y


def _aabft(s, info, y=None):
    """3 sigma with n = K and t the verified format's significand bits; ``y`` fixed (the
    paper's 21 for its FP64 K20C runs) or, by default, computed per row as
    max|A_i| max_k |sum_j B_kj| (the paper's Table 6)."""
    shape = np.broadcast_shapes(s.a_max.shape, s.chk.shape)
    if y is None:
        with np.errstate(all="ignore"):
            y = (np.maximum(np.abs(s.a_max), np.abs(s.a_min))
                 * np.abs(s.b1).max(axis=-1, initial=0.0)[..., None])
    return 3.0 * aabft_sigma(info.K, info.fmt.p, 1.0) * np.asarray(y, np.float64) \
        * np.ones(shape)


aabft = _builtin(_aabft, ext=True)


class AAbft:
    """``threshold=AAbft(y=21)``: A-ABFT with a fixed y (its paper's setting)."""

    needs = {"ext": True}

    def __init__(self, y=None):
        self.y = y

    def of(self, s, info):
        return _aabft(s, info, self.y)

    def __call__(self, A, B, info):
        return self.of(_plain_sums(A, B, info, ext=True), info)

    def __repr__(self):
        return f"AAbft(y={self.y})"


# ---------------------------------------------------------------------------------------------
# Rigorous: an a-priori bound of both checksum paths, valid for any summation order
# ---------------------------------------------------------------------------------------------
def _gamma(n, u):
    return n * u / (1.0 - n * u) if n * u < 0.5 else math.inf


def _rigorous(s, info):
    """An a-priori bound of |obs_i - chk_i| for any summation order (Higham's gamma_n =
    n u / (1 - n u), u the accumulator's unit roundoff):

    * observed path: c_ij = fl(sum_k a_ik b_kj) is within gamma_K (|A||B|)_ij of the exact
      product; offline it is rounded to the output (u_o |c_ij|); fl(sum_j c_ij) is within
      gamma_N sum_j |c_ij| of the sum of the computed c_ij;
    * checksum path: b_k = fl(sum_j b_kj) is within gamma_N (|B|1)_k, and fl(sum_k a_ik b_k)
      within gamma_K sum_k |a_ik||b_k| of the sum of the computed products' terms.

    So T_i = (gamma_K + gamma_N) P_i + gamma_K Q_i + (gamma_N + u_o(1 + u_o)) R_i + underflow,
    with P = |A|(|B|1), Q = |A||b| (the computed row sums), R = |C|1. It is the ball bound
    ``fpx.interval`` gives the two paths for point operands, in closed form so it costs
    O(MK + KN + MN). R reads the computed C: a fault only raises the threshold by gamma_N times
    itself. Never a false alarm, on any input, whatever the BLAS's order; the checksums,
    summed in float64 (:mod:`.sums`), have smaller errors than the accumulator-precision
    paths this bounds."""
    K, N = info.K, info.N
    u = 2.0 ** -info.acc.p
    uo = 2.0 ** -info.out.p if info.fmt.name != info.acc.name else 0.0   # offline rounding
    gk, gn = _gamma(K, u), _gamma(N, u)
    P, Q, R = s.P, s.Q, s.R
    with np.errstate(all="ignore"):
        ev = 1.0 + (K + N + 4) * 2.0 ** -52                            # float64 evaluation
        eta = 2.0 ** (info.acc.emin - info.acc.p + 1)                  # underflow, per op
        eta_o = 2.0 ** (info.out.emin - info.out.p + 1) if uo else 0.0
        T = ((gk + gn) * P + gk * Q + (gn + uo * (1 + uo)) * R) * ev * (1 + 2.0 ** -40)
        return T + (N * K + K + N + 4) * eta + N * eta_o


rigorous = _builtin(_rigorous, absolute=True)


THRESHOLDS = {"v-abft": vabft, "a-abft": aabft, "rigorous": rigorous}


# ---------------------------------------------------------------------------------------------
# e_max: the largest relative verification error |E| / |checksum| (paper Eq. 25)
# ---------------------------------------------------------------------------------------------
def _sqrtk(a, b=0.0, ref=1.0):
    return lambda K, N: a * math.sqrt(K / ref) + b


def _cpu(p, c0, a, b):
    """1.2 u (c0 + a sqrt(K/N) + b sqrt(K)), u = 2^-p: the fitted e_max plus the 20%."""
    u = 2.0 ** -p
    return lambda K, N: 1.2 * u * (c0 + a * math.sqrt(K / max(N, 1)) + b * math.sqrt(K))


#: fpx's defaults for CPUs, keyed by the format of the verified values. With the checksums
#: summed in float64 (:mod:`.sums`), the verification difference is the GEMM's own round-off
#: (plus, for float64 data, the checksums' own), whose size depends on the BLAS's summation
#: order and on the data:
#:
#: * positive data: each element's error grows like u sqrt(K), and the row check averages N
#:   independent ones against V-ABFT's deterministic term: a sqrt(K/N);
#: * zero-mean data: a sequentially accumulated element's error grows like u K, against
#:   V-ABFT's variance terms in sqrt(K): b sqrt(K);
#: * float64 checksums of float64 data round like the GEMM: a constant c0 of a few u.
#:
#: Fitted from above to the largest |E| / T(e_max = 1) (``calibrate(...,
#: relative_to="v-abft")``) over the V-ABFT paper's input distributions plus |N(1,1)| and
#: U(0,1), shapes (M, K, N) from (2, 8, 2) to 2048^3 and (16, 4096, 16), and three summation
#: orders: OpenBLAS (NumPy), MKL (torch) and a strictly sequential dot product without FMA
#: (``fpx.reproducible``; the worst plausible order: every partial sum carries all earlier
#: terms' errors), plus the protocol's 20%. Since the sequential order bounds what blocked
#: and vectorized BLAS kernels do, the default holds on other CPUs and libraries too
#: (docs/abft.md, "e_max"). Offline low-precision outputs take the paper's 2 u_output
#: (measured: at most 0.35 u).
DEFAULT_EMAX = {
    "float64": _cpu(53, 2.6, 0.65, 0.06),
    "float32": _cpu(24, 0.25, 0.8, 0.11),
    "bfloat16": 8e-3,
    "float16": 1e-3,
    "float8_e4m3fn": 1.25e-1,
    "float8_e5m2": 2.5e-1,
}

#: the V-ABFT paper's measured e_max per platform (Table 7, Section 3.6) and its artifact's.
PRESETS = {
    "cpu": DEFAULT_EMAX,
    "paper-cpu": {"float64": 6e-16, "float32": 4e-7, "bfloat16": 8e-3, "float16": 1e-3},
    "h100": {"float64": _sqrtk(1.0e-17, 2.5e-16), "float32": _sqrtk(5.0e-9, 1.2e-7),
             "bfloat16": 8e-3, "float16": 1e-3},
    "ascend-910b": {"float32": _sqrtk(2e-6, 0.0, 1024.0), "bfloat16": 8e-3, "float16": 1e-3},
    "artifact": {"float64": 7.5e-16, "float32": _sqrtk(1.377e-6, 0.0, 1024.0),
                 "bfloat16": 8e-3, "float16": 1e-3},
}


def e_max_for(spec, fmt, K, N):
    """The e_max ``spec`` gives for verified values in ``fmt`` with inner dimension K: None
    (fpx's CPU defaults), a number, a calibration (``.e_max``), a preset name, a dict
    {format name: number or f(K, N)}, or a callable f(K, N)."""
    if spec is None:
        spec = DEFAULT_EMAX
    if isinstance(spec, str):
        try:
            spec = PRESETS[spec]
        except KeyError:
            raise ValueError(f"fpx.abft: unknown e_max preset {spec!r}; presets: "
                             f"{sorted(PRESETS)}") from None
    if hasattr(spec, "e_max"):
        spec = spec.e_max
    if isinstance(spec, dict):
        table = {formats.get(k).name: v for k, v in spec.items()}
        if fmt.name not in table:
            if fmt.name not in DEFAULT_EMAX:
                raise ValueError(f"fpx.abft: no e_max for {fmt.name}; give e_max=")
            table[fmt.name] = DEFAULT_EMAX[fmt.name]
        spec = table[fmt.name]
    v = spec(K, N) if callable(spec) else spec
    v = float(v)
    if not v > 0 or not math.isfinite(v):
        raise ValueError(f"fpx.abft: e_max must be a positive number, got {v}")
    return v


def resolve(threshold):
    """The threshold function for ``threshold`` (a name or a callable)."""
    if callable(threshold):
        return threshold
    try:
        return THRESHOLDS[threshold]
    except (KeyError, TypeError):
        raise ValueError(f"fpx.abft: threshold must be one of {sorted(THRESHOLDS)} or a "
                         f"callable T(A, B, info), got {threshold!r}") from None
