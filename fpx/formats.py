r"""Floating-point formats and exact, vectorized rounding into them.

This module defines one :class:`Format` object per supported binary
floating-point format and a single rounding routine, :func:`round`, that every
fpx transform uses to simulate low-precision arithmetic.

Formats
-------
A format with precision ``p`` (significand bits, implicit bit included) and
exponent range ``[emin, emax]`` represents the numbers ``M * 2**Q`` with

* normal numbers: ``2**(p-1) <= M < 2**p`` and ``Q = e - (p - 1)`` for
  ``emin <= e <= emax``;
* subnormal numbers and zero: ``0 <= M < 2**(p-1)`` and ``Q = emin - (p - 1)``;

plus signed zeros, ``±inf`` (when ``has_inf``) and NaN.  The largest finite
value is ``(2 - 2**(1-p)) * 2**emax`` for IEEE-style formats; for the OCP
"fn" format ``float8_e4m3fn`` (no infinities, the all-ones significand of the
top binade is NaN) it is ``(2 - 2**(2-p)) * 2**emax = 448``.

Integer-domain rounding
-----------------------
Every input is converted exactly to float64 and handled through its bit
pattern viewed as ``uint64``.  Write the magnitude as ``|x| = M * 2**q`` where
``M`` is the 53-bit integer significand (hidden bit included; ``M`` is the raw
fraction for float64 subnormals) and ``q = max(E, 1) - 1075`` for the biased
exponent field ``E``.  With ``e = max(E, 1) - 1023`` (the binade of ``x``;
float64 subnormals are lumped with ``e = -1022``, which is ``<= emin`` for every
format) the target quantum at ``|x|`` is ``2**Q`` with
``Q = max(e, emin) - (p - 1)``, so ``k = Q - q = (53 - p) + max(0, emin - e)``
low bits of ``M`` must be discarded.  The shared core (:func:`_split`) returns

* ``T``: ``|x|`` truncated to the format (the low ``k`` bits of the float64
  pattern cleared; ``0`` when ``k >= 53``),
* ``U = T + 2**Q``: the next representable magnitude above ``T``, formed by
  *integer addition on the bit pattern* (a carry out of the fraction field
  increments the exponent, which is exactly the value ``T + 2**Q``; overflow
  of the exponent field yields the pattern of ``inf``),
* ``rem = M mod 2**k``: the discarded bits, compared with ``half = 2**(k-1)``
  to find the position of ``|x|`` relative to the midpoint of ``[T, U]``,
* the parity of ``T``'s integer significand (for ties-to-even).

Every rounding mode then picks ``T`` or ``U`` (the bracket ``lo <= |x| < hi``)
from this data.  Because only integer shifts, masks, comparisons and additions
are used, no intermediate rounding (and so no double rounding) can occur.
Results above the largest finite value are handled at the end as overflow.

Modes (``x`` the exact value, ``lo <= |x| <= hi`` its bracketing magnitudes):

``rn``
    round to nearest, ties to even (IEEE 754-2019 roundTiesToEven).  Overflow
    follows IEEE: magnitudes ``>= max + ulp(max)/2`` become ``inf``; for
    ``float8_e4m3fn`` they become NaN (matching ``ml_dtypes``: 464 -> 448,
    anything above 464 -> NaN).
``rd``, ``ru``, ``rz``
    roundTowardNegative, roundTowardPositive, roundTowardZero.  Overflow in
    the direction of zero gives ``±max``; away from zero ``±inf`` (NaN for
    ``float8_e4m3fn``).
``sr``
    stochastic rounding (Connolly, Higham & Mary 2021, "mode 1"): ``hi`` with
    probability ``(|x| - lo) / (hi - lo)``, else ``lo``.  Implemented exactly:
    a uniform integer ``R`` in ``[0, 2**k)`` is drawn and ``hi`` is chosen iff
    ``R < rem``; for ``k > 64`` the top ``k - 64`` bits of ``R`` are drawn in
    64-bit chunks (only as many chunks as needed), so the probability is
    exactly ``rem / 2**k`` for every ``k``.
``ud``
    "up-down": round to nearest, then move one step to the neighbouring
    representable value toward ``+inf`` or toward ``-inf`` with probability
    1/2 each.  Zero results stay zero; stepping down from the smallest
    subnormal gives a (signed) zero; stepping up from ``max`` overflows.
``cestac``
    the CESTAC / discrete stochastic arithmetic random rounding (Vignes):
    ``rd`` or ``ru`` with probability 1/2 each; exact values stay exact.

Random modes treat the exponent range as unbounded and then apply the
overflow rule of ``rn``: a result above ``max`` becomes ``inf`` (NaN for
``float8_e4m3fn``); ``cestac`` applies the directed rule of the direction it
picked.  ``saturate=True`` replaces every overflow *and every infinite input*
by ``±max`` (the OCP 8-bit FP "saturation" conversion mode), for every format.
NaN inputs stay NaN.  The sign is always kept, so underflow gives ``±0``.

Residual (double-double input)
------------------------------
With ``residual=r`` the value rounded is the exact sum ``x + r`` of a
normalized pair (``|r| <= ulp(x)/2``, e.g. from TwoSum).  In units of ``2**q``
the discarded part becomes ``rem + f`` with ``f = r/2**q`` (sign taken
relative to ``x``) and ``|f| <= 1/2``.  If ``rem == 0`` and ``r`` points toward
zero the bracket becomes ``[pred(|x|), |x|]``.  Ties, inexactness and the
direction of directed rounding are then decided exactly.  For ``sr`` the
fractional part ``f`` is compared with an extra 64-bit uniform integer, i.e.
the probability is exact up to a resolution of ``2**-64`` of one float64 ulp
of ``x`` (``2**-64`` of the gap for the ``[pred(|x|), |x|]`` bracket); this is
the only non-exact probability in the module (float64 arithmetic is *not*
used).  If ``x == 0`` the pair ``(r, 0)`` is rounded instead.

References
----------
* IEEE Std 754-2019, IEEE Standard for Floating-Point Arithmetic.
* M. P. Connolly, N. J. Higham, T. Mary, "Stochastic rounding and its
  probabilistic backward error analysis", SIAM J. Sci. Comput. 43(1), 2021.
* J. Vignes, "Discrete stochastic arithmetic for validating results of
  numerical software", Numer. Algorithms 37, 2004 (CESTAC).
* Open Compute Project, "OCP 8-bit Floating Point Specification (OFP8)",
  rev. 1.0, 2023 (E4M3 / E5M2, saturation mode).
"""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

try:  # pragma: no cover - import guard
    import array_api_compat as _aac
except ImportError:  # pragma: no cover
    _aac = None

__all__ = [
    "Format",
    "FORMATS",
    "MODES",
    "float64",
    "float32",
    "tf32",
    "bfloat16",
    "float16",
    "float8_e4m3fn",
    "float8_e5m2",
    "get",
    "of",
    "round",
    "ulp",
    "next_up",
    "next_down",
    "representable",
]

# ----------------------------------------------------------------------------
# Format objects
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Format:
    """A binary floating-point format.

    Attributes
    ----------
    name : canonical name (key of :data:`FORMATS`).
    p : precision in bits, implicit bit included.
    emin : exponent of the smallest positive normal number.
    emax : exponent of the largest binade.
    dtype : NumPy dtype used to store values (tf32 is stored in float32).
    has_inf : whether the format has infinities (False for float8_e4m3fn,
        whose top-binade all-ones significand encodes NaN instead).
    bits : *storage* width in bits (tf32: 32, although its encoding has only
        19 significant bits, see :attr:`logical_bits`).
    """

    name: str
    p: int
    emin: int
    emax: int
    dtype: Any
    has_inf: bool
    bits: int

    @property
    def u(self) -> float:
        """Unit roundoff ``2**-p``."""
        return math.ldexp(1.0, -self.p)

    @property
    def eps(self) -> float:
        """Machine epsilon ``2**(1-p)`` (gap between 1 and the next number)."""
        return math.ldexp(1.0, 1 - self.p)

    @property
    def tiny(self) -> float:
        """Smallest positive normal number ``2**emin``."""
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_subnormal(self) -> float:
        """Smallest positive subnormal number ``2**(emin - p + 1)``."""
        return math.ldexp(1.0, self.emin - self.p + 1)

    @property
    def max(self) -> float:
        """Largest finite number."""
        drop = 1 if self.has_inf else 2  # "fn" formats lose the all-ones pattern
        return math.ldexp(2.0 - math.ldexp(1.0, drop - self.p), self.emax)

    @property
    def exponent_bits(self) -> int:
        """Width of the exponent field (``emin = 2 - 2**(exponent_bits-1)``)."""
        return int(math.log2(2 - self.emin)) + 1

    @property
    def logical_bits(self) -> int:
        """Width of the encoding: sign + exponent + trailing significand."""
        return 1 + self.exponent_bits + self.p - 1

    def __repr__(self) -> str:
        return (
            f"Format({self.name}: p={self.p}, emin={self.emin}, emax={self.emax}, "
            f"max={self.max!r}, has_inf={self.has_inf}, bits={self.bits}, "
            f"dtype={np.dtype(self.dtype).name})"
        )


float64 = Format("float64", 53, -1022, 1023, np.dtype(np.float64), True, 64)
float32 = Format("float32", 24, -126, 127, np.dtype(np.float32), True, 32)
tf32 = Format("tf32", 11, -126, 127, np.dtype(np.float32), True, 32)
bfloat16 = Format("bfloat16", 8, -126, 127, np.dtype(ml_dtypes.bfloat16), True, 16)
float16 = Format("float16", 11, -14, 15, np.dtype(np.float16), True, 16)
float8_e4m3fn = Format(
    "float8_e4m3fn", 4, -6, 8, np.dtype(ml_dtypes.float8_e4m3fn), False, 8
)
float8_e5m2 = Format("float8_e5m2", 3, -14, 15, np.dtype(ml_dtypes.float8_e5m2), True, 8)

FORMATS: dict[str, Format] = {
    f.name: f for f in (float64, float32, tf32, bfloat16, float16, float8_e4m3fn, float8_e5m2)
}

_ALIASES: dict[str, Format] = {
    "f64": float64, "fp64": float64, "double": float64, "binary64": float64,
    "f32": float32, "fp32": float32, "single": float32, "binary32": float32,
    "tensorfloat32": tf32, "tensorfloat-32": tf32,
    "bf16": bfloat16,
    "f16": float16, "fp16": float16, "half": float16, "binary16": float16,
    "fp8_e4m3": float8_e4m3fn, "e4m3": float8_e4m3fn, "fp8_e4m3fn": float8_e4m3fn,
    "e4m3fn": float8_e4m3fn,
    "fp8_e5m2": float8_e5m2, "e5m2": float8_e5m2,
}

# dtype -> format (tf32 has no dtype of its own; float32 maps to float32)
_BY_DTYPE: dict[np.dtype, Format] = {
    np.dtype(f.dtype): f for f in (float64, float32, bfloat16, float16, float8_e4m3fn, float8_e5m2)
}

MODES = ("rn", "rd", "ru", "rz", "sr", "ud", "cestac")


def _known() -> str:
    return ", ".join(list(FORMATS) + sorted(_ALIASES))


def _from_dtype(dt: np.dtype) -> Format:
    if dt in _BY_DTYPE:
        return _BY_DTYPE[dt]
    is_float = dt.kind == "f"
    if dt.kind == "V":  # ml_dtypes floats that fpx does not model (fnuz, e3m4, fp4, ...)
        try:
            ml_dtypes.finfo(dt)
            is_float = True
        except Exception:
            pass
    if is_float:
        raise ValueError(
            f"unsupported floating-point dtype {dt.name!r}; known formats: {_known()}"
        )
    raise TypeError(
        f"dtype {dt.name!r} is not a real floating-point type; "
        "fpx formats are real floating-point only"
    )


def get(x: Any) -> Format:
    """Return the :class:`Format` named or described by ``x``.

    ``x`` may be a Format, a (case-insensitive) name or alias such as
    ``"bf16"``, ``"fp32"``, ``"e4m3"``, or a NumPy dtype / dtype-like
    (``np.float32``, ``"float32"``, ``ml_dtypes.bfloat16``).  Unknown names
    raise ``ValueError``; non-floating dtypes (int, complex, bool, object)
    raise ``TypeError``.
    """
    if isinstance(x, Format):
        return x
    if x is None:  # np.dtype(None) would silently mean float64
        raise ValueError(f"no format given; known formats: {_known()}")
    if isinstance(x, str):
        key = x.strip().lower()
        if key in FORMATS:
            return FORMATS[key]
        if key in _ALIASES:
            return _ALIASES[key]
        try:
            dt = np.dtype(x)
        except TypeError:
            raise ValueError(f"unknown format {x!r}; known formats: {_known()}") from None
        return _from_dtype(dt)
    dt = getattr(x, "dtype", None)
    if dt is not None and not isinstance(x, type):
        x = dt  # an array-like passed by mistake: use its dtype
    try:
        dt = np.dtype(x)
    except TypeError:
        raise ValueError(f"cannot interpret {x!r} as a format; known formats: {_known()}") from None
    return _from_dtype(dt)


def of(array: Any) -> Format:
    """Return the :class:`Format` of an array's dtype (same errors as :func:`get`)."""
    dt = getattr(array, "dtype", None)
    if dt is None:
        dt = np.asarray(array).dtype
    try:
        dt = np.dtype(dt)
    except TypeError:  # e.g. a torch dtype: fall back on its name
        return get(str(dt).rsplit(".", 1)[-1])
    return _from_dtype(dt)


# ----------------------------------------------------------------------------
# Bit-level helpers
# ----------------------------------------------------------------------------

_SIGN = 1 << 63
_ABS = (1 << 63) - 1
_FRAC = (1 << 52) - 1
_HIDDEN = 1 << 52
_INF = 0x7FF << 52
_QNAN = 0x7FF8 << 48
_U64_MAX = (1 << 64) - 1


def _f64_bits(v: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", v))[0]


def _namespace(*arrays):
    if _aac is not None:
        try:
            return _aac.array_namespace(*arrays)
        except TypeError:
            pass
    return np


def _as_f64(x, xp=None):
    """Return ``(xp, float64 array)``; only exact conversions are accepted."""
    if xp is None:
        if not hasattr(x, "dtype") or isinstance(x, np.generic):
            x = np.asarray(x)
        xp = _namespace(x)
    x = xp.asarray(x)
    try:
        npdt = np.dtype(x.dtype)
    except TypeError:
        npdt = None
    if npdt is not None:
        if npdt.kind in "iu":
            if x.size and not bool(xp.all((x >= -(2**53)) & (x <= 2**53))):
                raise ValueError("integer input with |x| > 2**53 cannot be converted exactly to float64")
        elif npdt.kind == "f" and npdt.itemsize > 8:
            raise TypeError(f"{npdt.name} input cannot be converted exactly to float64")
        elif npdt.kind != "f" and npdt not in _BY_DTYPE:
            raise TypeError(
                f"input dtype {npdt.name!r} is not real floating-point; "
                "fpx formats are real floating-point only"
            )
    with np.errstate(invalid="ignore"):  # signalling-NaN payloads set the invalid flag
        if npdt in _BY_DTYPE and npdt.kind != "f":  # ml_dtypes: plain ndarray cast
            return xp, xp.asarray(x.astype(np.float64))
        return xp, xp.astype(x, xp.float64)


def _prepare(x, xp=None):
    """Return ``(xp, flat float64 array, shape)``."""
    xp, xf = _as_f64(x, xp)
    shape = tuple(xf.shape)
    return xp, xp.reshape(xf, (-1,)), shape


def _bits(xf, xp):
    return xf.view(xp.uint64)


def _floats(b, xp):
    return b.view(xp.float64)


def _u64(v, xp):
    return xp.astype(v, xp.uint64)


def _pow2_bits(Q, xp):
    """Bit pattern of 2**Q (int64 array Q in [-1074, 1023])."""
    normal = Q >= -1022
    e_field = _u64(xp.clip(Q + 1023, 0, 2046), xp)
    sub_shift = _u64(xp.clip(Q + 1074, 0, 51), xp)
    return xp.where(normal, e_field << 52, xp.ones_like(e_field) << sub_shift)


def _split(a, fmt: Format, xp):
    """Shared core: decompose finite magnitudes ``a`` (uint64 patterns).

    Returns a dict with
      ``T``    truncation of ``|x|`` to the format (pattern),
      ``U``    next magnitude above ``T`` (pattern; may exceed ``max``/be inf),
      ``rem``  discarded significand bits (units of the float64 quantum 2**q),
      ``k``    number of discarded bits (int64, may exceed 64),
      ``cmp``  sign(|x| - (T+U)/2) from the discarded bits: -1, 0, +1,
      ``odd``  parity of ``T``'s integer significand (bool),
      ``q``    float64 quantum exponent of ``|x|`` (int64),
      ``Q``    format quantum exponent at ``|x|`` (int64): U - T = 2**Q.
    """
    E = xp.astype(a >> 52, xp.int64)
    Ee = xp.maximum(E, 1)
    e = Ee - 1023
    k = (53 - fmt.p) + xp.maximum(fmt.emin - e, 0)
    q = Ee - 1075
    Q = q + k
    big = k >= 53
    kc = _u64(xp.minimum(k, 63), xp)
    kt = _u64(xp.minimum(k, 52), xp)
    one = xp.ones_like(a)
    M = xp.where(E > 0, (a & _FRAC) | _HIDDEN, a)
    mask = (one << kc) - 1
    rem = M & mask
    T = xp.where(big, xp.zeros_like(a), a & ~((one << kt) - 1))
    U = xp.where(big, _pow2_bits(Q, xp), T + (one << kt))
    half = one << _u64(xp.maximum(xp.minimum(k, 63) - 1, 0), xp)
    pos = k >= 1
    cmp = xp.where(pos & (rem > half), 1, xp.where(pos & (rem == half), 0, -1))
    odd = xp.where(big, False, ((M >> kt) & 1) == 1)
    return {"T": T, "U": U, "rem": rem, "k": k, "cmp": cmp, "odd": odd, "q": q, "Q": Q}


def _scaled(r_abs, base, xp):
    """floor and ceil of ``|r| * 2**(64 - base)`` as uint64 (saturating)."""
    Er = xp.astype(r_abs >> 52, xp.int64)
    Mr = xp.where(Er > 0, (r_abs & _FRAC) | _HIDDEN, r_abs)
    s = xp.maximum(Er, 1) - 1075 + 64 - base
    one = xp.ones_like(r_abs)
    ls = _u64(xp.clip(s, 0, 63), xp)
    rs = _u64(xp.clip(-s, 0, 63), xp)
    # left shift (exact) when s >= 0; saturate if it would not fit in 64 bits
    fits = (s <= 11) | ((Mr >> _u64(xp.clip(64 - s, 0, 63), xp)) == 0)
    fits = (fits & (s < 64)) | (Mr == 0)
    left = xp.where(fits, Mr << ls, xp.full_like(r_abs, _U64_MAX))
    fl_r = Mr >> rs
    ce_r = fl_r + xp.where((Mr & ((one << rs) - 1)) != 0, one, 0 * one)
    neg = s < 0
    return xp.where(neg, fl_r, left), xp.where(neg, ce_r, left)


def _random_u64(rng, n, xp):
    """``n`` independent uniform uint64 values from ``rng`` as an ``xp`` array."""
    try:
        r = rng.integers(0, 1 << 64, size=(n,), dtype=np.uint64)
    except (TypeError, ValueError, OverflowError):  # generators without uint64 support
        lo = rng.integers(0, 1 << 32, size=(n,), dtype=np.int64)
        hi = rng.integers(0, 1 << 32, size=(n,), dtype=np.int64)
        r = (xp.astype(xp.asarray(hi), xp.uint64) << 32) | xp.astype(xp.asarray(lo), xp.uint64)
    r = xp.asarray(r)
    return r if r.dtype == xp.uint64 else xp.astype(r, xp.uint64)


def _stochastic_up(k, rem, fsign, yfl, yce, rng, n, xp, need):
    """Bernoulli draw of "hi" with probability ``(rem + f) / 2**k``.

    ``rem`` is an integer in ``[0, 2**k)`` (uint64) and ``f`` a fraction with
    sign ``fsign`` (-1, 0, +1) and ``|f| * 2**64`` between ``yfl`` and ``yce``
    (floor/ceil).  For ``fsign < 0`` it is required that ``rem >= 1``.
    Only elements with ``need`` matter.
    """
    one = xp.ones_like(rem)
    u1 = _random_u64(rng, n, xp)
    kk = xp.minimum(k, 64)
    L = xp.where(k == 0, 0 * one, u1 >> _u64(xp.clip(64 - kk, 0, 63), xp))
    if fsign is None:
        rem_eff = rem
    else:
        rem_eff = xp.where(fsign < 0, rem - xp.where(rem > 0, one, 0 * one), rem)
    up = L < rem_eff
    if fsign is not None and bool(xp.any(need & (fsign != 0))):
        u2 = _random_u64(rng, n, xp)
        frac = xp.where(fsign > 0, u2 < yce, xp.where(fsign < 0, u2 <= ~yfl, False))
        up = up | ((L == rem_eff) & frac)
    # k > 64: the top k-64 bits of R must all be zero (rem < 2**53 there)
    j = xp.where(k > 64, k - 64, 0)
    pending = need & up & (j > 0)
    ok = j == 0
    while bool(xp.any(pending)):
        w = _random_u64(rng, n, xp)
        take = xp.clip(j, 1, 64)
        zero = (w >> _u64(64 - take, xp)) == 0
        ok = ok | (pending & zero & (j <= 64))
        pending = pending & zero & (j > 64)
        j = xp.where(pending, j - 64, j)
    return up & ok


def _check_rng(rng):
    """A generator with ``integers``, from an int seed too; ``None`` stays ``None``."""
    if rng is None or hasattr(rng, "integers"):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        if rng < 0:
            raise ValueError(f"formats.round: the seed `rng` must be >= 0, not {rng}")
        return np.random.default_rng(int(rng))
    raise TypeError("formats.round: `rng` must be a numpy.random.Generator, an int seed or "
                    f"None, not {type(rng).__name__}")


def _check_mode(mode):
    if not isinstance(mode, str) or mode.lower() not in MODES:
        raise ValueError(f"unknown rounding mode {mode!r}; valid modes: {', '.join(MODES)}")
    return mode.lower()


@dataclass(frozen=True)
class FlushedFormat(Format):
    """A format as a flush-to-zero unit computes in it (CUDA's ``-ftz=true``): subnormal
    inputs and results become ±0, so a result below ``2**emin`` in magnitude may be off by
    all of it. For error bounds it acts as a format whose subnormal spacing is ``2**(emin+1)``:
    half of it, the absolute error of a rounding there, is the flush's ``2**emin``."""

    @classmethod
    def of(cls, fmt: Format) -> "FlushedFormat":
        return cls(*(getattr(fmt, f.name) for f in dataclasses.fields(fmt)))

    @property
    def smallest_subnormal(self) -> float:
        return math.ldexp(1.0, self.emin + 1)


def _finish(bits, shape, fmt, xp, as_float64=False):
    out = xp.reshape(_floats(bits, xp), shape)
    if as_float64:
        return out
    dt = np.dtype(fmt.dtype)
    if dt == np.float64:
        return out
    if xp is np or dt == np.float16:
        return xp.astype(out, fmt.dtype)
    # CuPy: its float64 -> float32 cast flushes float32 subnormals to zero (seen on an H100,
    # CuPy 14; its float64 -> float16 cast does not), so the (exactly representable) values
    # are moved bit by bit
    f32 = xp.reshape(_f32_from_exact_f64_bits(bits, xp), shape)
    if dt == np.float32:
        return f32
    try:
        return xp.astype(f32, fmt.dtype)
    except Exception:
        # backends without ml_dtypes' bf16/fp8 dtypes (older CuPy): the rounded values in
        # float32 storage -- exact, as every bf16/fp8 value is a float32 value (like tf32)
        return f32


def _f32_from_exact_f64_bits(b, xp):
    """float32 array of float64 patterns ``b`` whose values are float32 values (or inf/NaN),
    by integer operations alone: sign, exponent rebias, significand shift; a float32
    subnormal k·2^-149 has k = (2^52 + m) >> (926 - e) (e the float64 biased exponent)."""
    sign = (b >> 63) << 31
    e = xp.astype(b >> 52 & 0x7FF, xp.int64)
    m = b & ((1 << 52) - 1)
    special = e == 0x7FF
    normal = (e >= 1023 - 126) & ~special
    sub = (e > 0) & ~normal
    rebias = _u64(xp.clip(e - (1023 - 127), 0, 254), xp) << 23
    shift = _u64(xp.clip(926 - e, 0, 63), xp)
    out = xp.where(normal, rebias | m >> 29, _u64(xp.zeros_like(e), xp))
    out = xp.where(sub, (m | (1 << 52)) >> shift, out)
    nan_bit = _u64(m != 0, xp) << 22                      # a NaN stays a NaN
    out = xp.where(special, 0x7F800000 | m >> 29 | nan_bit, out)
    return xp.astype(out | sign, xp.uint32).view(xp.float32)


# ----------------------------------------------------------------------------
# round
# ----------------------------------------------------------------------------


def round(x, fmt, mode: str = "rn", rng=None, *, residual=None, saturate: bool = False):
    """Round the real values ``x`` (+ ``residual``) into format ``fmt``.

    Parameters
    ----------
    x : array or scalar of real floating (or small integer) values; converted
        exactly to float64.
    fmt : anything :func:`get` accepts.
    mode : ``"rn"`` (nearest-even), ``"rd"``, ``"ru"``, ``"rz"`` (directed),
        ``"sr"`` (stochastic), ``"ud"`` (up-down), ``"cestac"``.
    rng : ``numpy.random.Generator`` (or a namespace-compatible generator),
        an int seed (``numpy.random.default_rng(seed)``) or ``None`` (a fresh
        ``default_rng()``).  Used by random modes only.
    residual : optional float64 array broadcastable with ``x``; the value
        rounded is the exact sum ``x + residual``.  A pair that is not
        normalized (``|residual| > ulp(x)/2``) is renormalized first by TwoSum
        (``s = fl(x + r)``, ``r' = (x + r) - s`` exactly); where ``fl(x + r)``
        overflows, a pair that is not normalized rounds as that sum (±inf).
    saturate : clamp overflow (and infinite inputs) to ``±max`` (OCP
        saturation mode) instead of producing ``inf`` / NaN.

    Returns
    -------
    Array of ``fmt.dtype`` (tf32: float32 values with <= 11 significant bits);
    a 0-d array for scalar input.
    """
    fmt = get(fmt)
    mode = _check_mode(mode)
    rng = _check_rng(rng)
    xp, xf = _as_f64(x)
    if residual is not None:
        _, rf = _as_f64(residual, xp)
        xf, rf = xp.broadcast_arrays(xf, rf)
    shape = tuple(xf.shape)
    xf = xp.reshape(xf, (-1,))
    if residual is not None:
        rf = xp.reshape(rf, (-1,))
        xf, rf = _renormalize(xf, rf, xp)
    n = 1
    for s in shape:
        n *= s
    if n == 0:
        return _finish(xp.reshape(_bits(xf, xp), (-1,)), shape, fmt, xp)
    if (mode in ("sr", "ud", "cestac")) and rng is None:
        rng = np.random.default_rng()

    b = _bits(xf, xp)
    sign = b & _SIGN
    a = b & _ABS
    finite = a < _INF
    af = xp.where(finite, a, 0 * a)
    c = _split(af, fmt, xp)
    lo, hi, cmp, odd = c["T"], c["U"], c["cmp"], c["odd"]
    inexact = c["rem"] != 0
    # stochastic-rounding parameters: probability (rem + f) / 2**k
    sr_k, sr_rem = c["k"], c["rem"]
    fsign = None
    yfl = yce = None

    if residual is not None:
        (lo, hi, cmp, odd, inexact, sr_k, sr_rem, fsign, yfl, yce) = _residual_bracket(
            rf, sign, af, c, fmt, xp)

    max_bits = _f64_bits(fmt.max)
    neg = sign != 0
    tz = xp.zeros_like(finite)  # overflow of this element clamps to max

    if mode == "rn" or mode == "ud":
        up = (cmp > 0) | ((cmp == 0) & odd)
        R = xp.where(up, hi, lo)
        if mode == "ud":
            R = _ud_step(R, fmt, rng, n, xp, max_bits)
    elif mode in ("rd", "ru", "rz"):
        if mode == "rz":
            away = xp.zeros_like(finite)
        elif mode == "ru":
            away = ~neg
        else:
            away = neg
        R = xp.where(away & inexact, hi, lo)
        tz = ~away
    elif mode == "sr":
        need = inexact & finite
        up = need & _stochastic_up(sr_k, sr_rem, fsign, yfl, yce, rng, n, xp, need)
        R = xp.where(up, hi, lo)
    else:  # cestac
        u = _random_u64(rng, n, xp)
        coin = (u >> 63) == 1
        up = coin & (inexact | (lo > max_bits))
        R = xp.where(up, hi, lo)
        tz = ~coin

    ovf_bits = _INF if fmt.has_inf else _QNAN
    ovf = R > max_bits
    clamp = tz | saturate
    R = xp.where(ovf, xp.where(clamp, xp.full_like(R, max_bits), xp.full_like(R, ovf_bits)), R)
    # non-finite inputs
    isinf = a == _INF
    inf_out = max_bits if saturate else (_INF if fmt.has_inf else _QNAN)
    R = xp.where(isinf, xp.full_like(R, inf_out), R)
    R = xp.where(a > _INF, xp.full_like(R, _QNAN), R)
    return _finish(R | sign, shape, fmt, xp)


def _renormalize(xf, rf, xp):
    """(x, r) renormalized by TwoSum so that |r| <= ulp(x)/2: (s, e) with s = fl(x + r) is
    the same exact value; where fl(x + r) overflows, a pair that is not normalized becomes
    that sum (±inf); a non-finite residual or a zero x rounds the float64 sum (exact there)."""
    with np.errstate(over="ignore", invalid="ignore"):
        s = xf + rf
        bb = s - xf
        e = (xf - (s - bb)) + (rf - bb)
        ok = xp.isfinite(s) & (s != xf)          # (s == x: as it was, -0.0 kept)
        loose = ~xp.isfinite(s) & xp.isfinite(xf) & (xp.abs(rf) > xp.abs(xf) * 2.0 ** -53)
        xf, rf = xp.where(ok | loose, s, xf), xp.where(ok, e, rf)
        swap = ~xp.isfinite(rf) | ((xf == 0) & (rf != 0))
        xf = xp.where(swap, xf + rf, xf)
        rf = xp.where(swap | ~xp.isfinite(xf) | loose, 0.0 * rf, rf)
    return xf, rf


def _residual_bracket(rf, sign, af, c, fmt, xp):
    """The rounding bracket of x + r (r the normalized residual, |x|'s split ``c``):
    (lo, hi, cmp, odd, inexact, sr_k, sr_rem, fsign, yfl, yce), where r moves the position
    against the midpoint of [T, U], and a residual pointing to zero from an exact |x| opens
    the bracket [pred(|x|), |x|]."""
    lo, hi, cmp, odd = c["T"], c["U"], c["cmp"], c["odd"]
    sr_k, sr_rem = c["k"], c["rem"]
    rb = _bits(rf, xp)
    r_abs = rb & _ABS
    rnz = r_abs != 0
    same = (rb & _SIGN) == sign
    rpos = rnz & same
    rneg = rnz & ~same
    inexact = (c["rem"] != 0) | rnz
    half_r = _half_cmp(r_abs, c["Q"], xp)  # sign(|r| - 2**(Q-1)), used when k == 0
    rsgn = xp.where(rpos, 1, xp.where(rneg, -1, 0))
    cmp = xp.where(c["k"] >= 1, xp.where(cmp != 0, cmp, rsgn), xp.where(rpos, half_r, -1))
    yfl, yce = _scaled(r_abs, c["q"], xp)
    spec = rneg & (c["rem"] == 0) & (af != 0)
    if bool(xp.any(spec)):
        cp = _split(xp.where(spec, af - 1, af), fmt, xp)
        lo = xp.where(spec, cp["T"], lo)
        hi = xp.where(spec, af, hi)
        odd = xp.where(spec, cp["odd"], odd)
        cmp = xp.where(spec, -_half_cmp(r_abs, cp["Q"], xp), cmp)
        sfl, sce = _scaled(r_abs, cp["Q"], xp)
        sr_k = xp.where(spec, 0, sr_k)
        sr_rem = xp.where(spec, xp.ones_like(sr_rem), sr_rem)
        yfl = xp.where(spec, sfl, yfl)
        yce = xp.where(spec, sce, yce)
    return lo, hi, cmp, odd, inexact, sr_k, sr_rem, rsgn, yfl, yce


def _half_cmp(r_abs, Q, xp):
    """sign(|r| - 2**(Q-1)) by comparing bit patterns (exact)."""
    Qh = Q - 1
    tiny = Qh < -1074  # 2**(Q-1) below the float64 range: any r != 0 is larger
    hb = _pow2_bits(xp.maximum(Qh, -1074), xp)
    res = xp.where(r_abs > hb, 1, xp.where(r_abs == hb, 0, -1))
    return xp.where(tiny, xp.where(r_abs != 0, 1, -1), res)


def _ud_step(R, fmt, rng, n, xp, max_bits):
    """Move the (finite, magnitude) RN results one step up or down at random."""
    u = _random_u64(rng, n, xp)
    coin = (u >> 63) == 1
    movable = (R != 0) & (R <= max_bits)
    succ = _split(R, fmt, xp)["U"]
    pred = _split(xp.where(R > 0, R - 1, R), fmt, xp)["T"]
    return xp.where(movable, xp.where(coin, succ, pred), R)


# ----------------------------------------------------------------------------
# ulp, neighbours, representability
# ----------------------------------------------------------------------------


def ulp(x, fmt):
    """Spacing of ``fmt`` at ``|x|`` as float64.

    This is ``2**Q``, the gap between ``|x|`` rounded toward zero in ``fmt``
    and the next larger number of the format's grid; ``ulp(0)`` is the
    smallest subnormal.  For ``|x| >= 2**emax`` the quantum of the binade of
    ``|x|`` is returned as if the exponent range were unbounded (so
    ``ulp(max)`` is finite, unlike ``np.spacing(max) == inf``).  NaN and
    ``±inf`` give NaN.
    """
    fmt = get(fmt)
    xp, xf, shape = _prepare(x)
    a = _bits(xf, xp) & _ABS
    finite = a < _INF
    c = _split(xp.where(finite, a, 0 * a), fmt, xp)
    Q = xp.minimum(c["Q"], 1023)
    res = xp.where(finite, _pow2_bits(Q, xp), xp.full_like(a, _QNAN))
    return _finish(res, shape, fmt, xp, as_float64=True)


def _neighbour(x, fmt, upward: bool):
    fmt = get(fmt)
    xp, xf, shape = _prepare(x)
    b = _bits(xf, xp)
    if not upward:  # next_down(x) = -next_up(-x)
        b = b ^ _SIGN
    sign = b & _SIGN
    a = b & _ABS
    finite = a < _INF
    af = xp.where(finite, a, 0 * a)
    max_bits = _f64_bits(fmt.max)
    zero = af == 0
    pos = (sign == 0) | zero
    # x >= 0 (or -0): successor of trunc(|x|); x < 0: truncation of pred64(|x|)
    succ = _split(af, fmt, xp)["U"]
    below = _split(xp.where(zero, af, af - 1), fmt, xp)["T"]
    below = xp.where(below > max_bits, xp.full_like(below, max_bits), below)
    beyond = _INF if fmt.has_inf else _QNAN
    succ = xp.where(succ > max_bits, xp.full_like(succ, beyond), succ)
    res = xp.where(pos, succ, below | _SIGN)
    # non-finite inputs
    res = xp.where((a == _INF) & (sign == 0), xp.full_like(res, _INF), res)
    res = xp.where((a == _INF) & (sign != 0), xp.full_like(res, max_bits | _SIGN), res)
    res = xp.where(a > _INF, xp.full_like(res, _QNAN), res)
    if not upward:
        res = res ^ _SIGN
    return _finish(res, shape, fmt, xp, as_float64=True)


def next_up(x, fmt):
    """Smallest number of ``fmt`` greater than ``x`` (float64).

    For representable ``x`` this is the successor (like ``np.nextafter(x,
    inf)``); otherwise it equals ``round(x, fmt, "ru")``.  ``next_up(±0)`` is
    the smallest subnormal, ``next_up(-smallest_subnormal)`` is ``-0.0``,
    ``next_up(-inf)`` is ``-max``; above ``max`` the result is ``inf`` (NaN
    for formats without infinities).  NaN stays NaN.
    """
    return _neighbour(x, fmt, True)


def next_down(x, fmt):
    """Largest number of ``fmt`` smaller than ``x`` (float64); ``-next_up(-x)``."""
    return _neighbour(x, fmt, False)


def representable(x, fmt):
    """Boolean array: ``x`` is exactly a number of ``fmt``.

    Finite values must lie on the format's grid and not exceed ``max``;
    ``±inf`` is representable iff ``fmt.has_inf``; NaN gives False.
    """
    fmt = get(fmt)
    xp, xf, shape = _prepare(x)
    a = _bits(xf, xp) & _ABS
    finite = a < _INF
    af = xp.where(finite, a, 0 * a)
    c = _split(af, fmt, xp)
    ok = finite & (c["rem"] == 0) & (af <= _f64_bits(fmt.max))
    if fmt.has_inf:
        ok = ok | (a == _INF)
    return xp.reshape(ok, shape)
