"""Precision policies: what arithmetic the target program really does.

A :class:`Policy` tells fpx's transforms (interval bounds, stochastic rounding, ...) how the
program they model is executed, so that the model is *sound for that machine*, not for an
idealized one. It has two parts:

1. **Formats per op kind** (:class:`OpPrecision`). Every arithmetic primitive belongs to one of
   four op kinds (:func:`kind_of`, read from :data:`fpx.primitives.KIND_OF`): ``"matmul"``
   (matmul, conv), ``"reduction"`` (sum, prod, cumsum), ``"elementwise"`` (+ - * / sqrt fma
   neg abs max min floor ceil round sign cast) and ``"transcendental"`` (exp expm1 exp2 log
   log1p log2 sin cos tan tanh sinh cosh atan atan2 erf pow). For each kind the policy states
   the *input*, *compute*, *accumulate* and *output* formats -- e.g. cuBLAS with TF32 enabled
   rounds float32 matmul inputs to tf32 and accumulates in float32. ``None`` means "the dtype
   the program uses at that point". Stated formats apply to programs whose dtype is float32 or
   narrower; float64 programs are always modelled in float64 (CUDA, cuBLAS, NumPy and
   ``-use_fast_math`` all leave float64 arithmetic alone).

2. **Accuracy per function and format** (:class:`Accuracy`). The maximum error of one
   evaluation of a primitive whose result is in format ``fmt``, as
   ``ulps * ulp_fmt(exact) + absolute``. ``ulps`` and ``absolute`` may be functions of the
   operation's (float64) inputs, for input-dependent bounds such as CUDA's ``__expf``
   (``2 + floor(|1.173 x|)`` ulp) or ``__sinf`` (absolute ``2^-21.41`` on ``[-pi, pi]``).
   A correctly rounded operation is 0.5 ulp; an exact one (neg, abs, max, floor) is 0.

The ulp of a value ``x`` in a format with precision ``p`` (significand bits, hidden bit
included) and minimum exponent ``emin`` is ``2**(max(e, emin) - p + 1)`` with
``e = floor(log2|x|)`` (computed exactly from :func:`numpy.frexp`); zero and subnormals get the
subnormal spacing ``2**(emin - p + 1)``. Library ulp errors (glibc, NumPy, CUDA) are stated
against the *correctly rounded* result, so the error against the exact value is that number
plus 0.5; every table below has already added it.

Presets (:func:`get_policy`)
----------------------------
``"ieee"``
    Every operation correctly rounded (0.5 ulp) in the program's own dtypes. The idealized
    model of most round-off analyses. Real math libraries are *not* correctly rounded: a bound
    that assumes 0.5 ulp for NumPy's float32 ``exp`` is unsound (measured: 2.4 ulp).
``"numpy"`` (the default)
    What NumPy actually does on x86-64. float32 transcendentals use NumPy's own SIMD kernels
    (AVX2/AVX-512F exp, log, sin, cos, tanh) or Intel SVML's low-accuracy (LA) variants on
    AVX512_SKX (numpy/_core/src/umath/loops_umath_fp.dispatch.c.src), or libm on other paths;
    float64 uses SVML's high-accuracy (HA) variants, NumPy's own exp/log, or glibc. Each bound
    is the largest documented maximum error among those paths (NumPy's validation tolerances,
    Intel's LA/HA accuracy classes, the glibc manual), plus 0.5 (correctly rounded -> exact)
    plus a 0.5 ulp safety margin (the documented numbers come from tests, not proofs). float16,
    bfloat16 and float8 transcendentals are evaluated in float32 and rounded once (NumPy's
    float16 loops, ml_dtypes' ufuncs, fpx's erf kernel), so their error is
    ``0.5 + U32 * 2**(p - 24)`` ulp of the narrow format (derivation in :func:`_derive_narrow`;
    float16 uses U32 = 5 throughout, as its AVX512_SKX loops call SVML LA float32 routines).
    float16 matmul accumulates in float32 (numpy/_core/src/umath/matmul.c.src).
``"cuda"``
    The CUDA math library's documented maximum ulp errors (CUDA C++ Programming Guide,
    Mathematical Functions appendix, tables "Single-/Double-Precision Mathematical Standard
    Library Functions with Maximum ULP Error", default flags ``-prec-div=true
    -prec-sqrt=true``: division and sqrt correctly rounded). matmul and reductions accumulate
    in float32 (cuBLAS ``CUBLAS_COMPUTE_32F``, PyTorch's opmath); tensor-core accumulation is
    modelled as round-toward-zero (1 ulp per addition; Fasi et al. 2021). NVIDIA states these
    bounds come "from extensive but not exhaustive tests, so they are not guaranteed bounds".
``"cuda-fast"``
    ``nvcc -use_fast_math`` (= ``-ftz=true -prec-div=false -prec-sqrt=false -fmad=true`` and
    the intrinsic mapping of the guide's "Functions Affected by -use_fast_math" table):
    ``__expf`` (``2 + floor(|1.173x|)`` ulp), ``__logf``/``__log2f`` (absolute error on
    [0.5, 2], ulp error elsewhere), ``__sinf``/``__cosf`` (absolute error on [-pi, pi], *no
    documented bound outside*: fpx returns an infinite bound there), ``__tanf`` and ``__powf``
    (bounds derived from their documented implementations), ``__tanhf`` (relative 2^-11),
    approximate division (2 ulp) and sqrt (1 ulp). Subnormals are flushed to zero: every float32
    op gets an absolute ``2^-126`` term and an infinite bound when an input is subnormal (a
    flushed input can be amplified without limit, e.g. ``sqrt`` or ``x * 2**100``). float64 is
    unaffected by fast math.
``"cupy"``
    ``"cuda"`` as CuPy runs it (measured on an H100): float16 sums, means and cumsums
    accumulate in float16 (CUB), and float32 subnormal inputs and results are flushed to zero
    (``flush_to_zero``: CuPy's kernels and cuBLAS). The default for CuPy inputs.
``"tf32"``
    ``"cuda"`` with matmul inputs rounded to tf32 and float32 accumulation, as cuBLAS does with
    ``CUBLAS_TF32_TENSOR_OP_MATH`` / PyTorch's ``torch.backends.cuda.matmul.allow_tf32`` (and
    cuDNN convolutions by default).

Overrides
---------
Policies are immutable; overrides return new policies::

    p = get_policy("cuda").replace(matmul=OpPrecision(input="tf32", accumulate="float32"))
    p = p.with_accuracy("exp", "float32", ulps=4)        # one function, one format
    p = p.with_(exp=3.0, reduction=OpPrecision(accumulate="float64"))

References
----------
* NVIDIA, CUDA C++ Programming Guide (12.x), appendix "Mathematical Functions"
  (Standard Functions; Intrinsic Functions).
* M. Fasi, N. J. Higham, M. Mikaitis, S. Pranesh, "Numerical behavior of NVIDIA tensor cores",
  PeerJ Computer Science 7:e330 (2021).
* NumPy, ``numpy/_core/tests/data/umath-validation-set-*.csv`` (max ulp error tolerances of the
  SIMD float32/float64 transcendentals, checked by ``test_umath_accuracy.py``).
* Intel oneMKL Vector Mathematics accuracy modes: HA max 1 ulp, LA max 4 ulp, EP ~half the bits
  (the classes NumPy's vendored SVML routines belong to).
* The GNU C Library manual, "Errors in Math Functions" (x86_64 column).
* S. A. Figueroa, "When is double rounding innocuous?", SIGNUM Newsletter 30(3), 1995: +, -,
  *, /, sqrt computed in float32 and rounded to a format with p <= 11 are correctly rounded.
"""
from __future__ import annotations

import dataclasses
import math
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Union

import numpy as np

from fpx import policy_tables as _tables
from fpx import primitives as _prims
from fpx.policy_tables import SLACK as _SLACK

__all__ = [
    "OP_KINDS", "PRIMITIVES", "kind_of", "canonical_name", "ulp",
    "OpPrecision", "ResolvedPrecision", "Accuracy", "Policy", "PolicyLookupError",
    "get_policy", "PRESETS", "DEFAULT_POLICY",
    "IEEE", "NUMPY", "CUDA", "CUDA_FAST", "TF32",
]

# --------------------------------------------------------------------------------------------
# Op kinds and primitive names
# --------------------------------------------------------------------------------------------
OP_KINDS = ("matmul", "reduction", "elementwise", "transcendental")

# Every primitive's kind is declared once, in fpx.primitives; a policy's op kind is read from it.
_KINDS: dict[str, str] = {n: _prims.KINDS[k] for n, k in _prims.KIND_OF.items()
                          if _prims.KINDS[k] is not None}
#: The fpx primitives a policy knows about (the keys transforms ask :meth:`Policy.accuracy` for).
PRIMITIVES = tuple(_KINDS)

# NumPy / C spellings accepted wherever a primitive name is.
_ALIASES = {
    "arctan": "atan", "arctan2": "atan2", "power": "pow", "negative": "neg", "absolute": "abs",
    "fabs": "abs", "divide": "div", "true_divide": "div", "subtract": "sub", "multiply": "mul",
    "maximum": "max", "minimum": "min", "fmax": "max", "fmin": "min", "rint": "round",
    "sum": "reduce_sum", "prod": "reduce_prod", "astype": "cast", "dot": "matmul",
}
# Operations that are not primitives but whose kind is clear (kind_of only).
_KIND_ONLY = {"conv": "matmul", "convolution": "matmul", "einsum": "matmul",
              "mean": "reduction"}

_EXACT = _prims.of_kind("exact")
_ROUNDED = _prims.of_kind("rounded", "cast")
_ACCUMULATING = _prims.of_kind("matmul", "reduction")
_TRANSCENDENTAL = _prims.of_kind("transcendental")


class PolicyLookupError(KeyError):
    """A policy has no entry for a function (or format); fpx never falls back to 0.5 ulp.

    Subclasses :class:`KeyError` (hence :class:`LookupError`); ``str()`` is the plain message.
    """

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


def canonical_name(prim: str) -> str:
    """The fpx primitive name for ``prim`` (accepts NumPy spellings such as ``"arctan2"``)."""
    if not isinstance(prim, str):
        raise TypeError(f"fpx.policy: a primitive name must be a str, got {type(prim).__name__}")
    key = prim.strip().lower()
    return _ALIASES.get(key, key)


def kind_of(prim_name: str) -> str:
    """The op kind (one of :data:`OP_KINDS`) of an fpx primitive.

    Raises :class:`PolicyLookupError` for names that are not arithmetic primitives.
    """
    name = canonical_name(prim_name)
    if name in _KINDS:
        return _KINDS[name]
    if name in _KIND_ONLY:
        return _KIND_ONLY[name]
    raise PolicyLookupError(
        f"fpx.policy: {prim_name!r} is not an arithmetic primitive; known primitives: "
        f"{', '.join(PRIMITIVES)}")


# --------------------------------------------------------------------------------------------
# Formats (fpx.formats is imported lazily so this module imports on its own)
# --------------------------------------------------------------------------------------------
FormatLike = Any  # a fpx.formats.Format, a format name/alias, or a NumPy float dtype


def _formats():
    from fpx import formats
    return formats


def _fmt(f: FormatLike):
    return _formats().get(f)


def _fmt_key(f: FormatLike) -> str:
    """Table key of a format: its canonical name (``"*"`` stays ``"*"``)."""
    if isinstance(f, str) and f.strip() == "*":
        return "*"
    return _fmt(f).name


# fpx.formats' canonical names (table keys); "*" = every format.
_CANONICAL_FORMATS = frozenset({"*", "float64", "float32", "tf32", "bfloat16", "float16",
                                "float8_e4m3fn", "float8_e5m2"})


def _show(f: FormatLike) -> str:
    if f is None:
        return "-"
    return getattr(f, "name", None) or str(f)


def ulp(x, fmt: FormatLike):
    """The unit of an error bound: :func:`fpx.formats.ulp` of float64 value(s) ``x`` in
    ``fmt`` (exact; zero gives the smallest subnormal, values past the format's range the
    quantum of their own binade), and ``inf`` for infinities and NaN."""
    u = np.asarray(_formats().ulp(np.asarray(x, dtype=np.float64), _fmt(fmt)))
    out = np.where(np.isnan(u), np.inf, u)
    return out[()] if out.ndim == 0 else out


# --------------------------------------------------------------------------------------------
# OpPrecision
# --------------------------------------------------------------------------------------------
class ResolvedPrecision(NamedTuple):
    """The concrete formats (``fpx.formats.Format``) of one op for one program dtype."""
    input: Any
    compute: Any
    accumulate: Any
    output: Any


#: Stated OpPrecision formats apply to programs with at most this precision (float32).
_POLICY_MAX_P = 24


@dataclass(frozen=True, repr=False)
class OpPrecision:
    """Formats one op kind really uses: ``input``, ``compute``, ``accumulate``, ``output``.

    Each is a format (name, alias, ``Format`` or NumPy dtype) or ``None`` = the dtype the
    program uses at that point. ``input``: operands are rounded to it first (e.g. ``"tf32"``);
    ``compute``: products / function evaluations are formed in it; ``accumulate``: running
    sums are kept in it; ``output``: the stored result. Stated formats apply to programs of
    precision float32 or narrower; float64 programs resolve to float64 throughout.
    """
    input: FormatLike = None
    compute: FormatLike = None
    accumulate: FormatLike = None
    output: FormatLike = None

    def __post_init__(self):
        # store canonical format names (aliases, dtypes and Format objects are converted;
        # canonical names are kept without importing fpx.formats)
        for name in ("input", "compute", "accumulate", "output"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, str):
                v = v.strip().lower()
                if not v:
                    raise ValueError(f"OpPrecision.{name}: empty format name")
            if v not in _CANONICAL_FORMATS or v == "*":
                try:
                    v = _fmt(v).name
                except (ValueError, TypeError) as e:
                    raise ValueError(f"OpPrecision.{name}={v!r}: {e}") from None
            object.__setattr__(self, name, v)

    def resolve(self, dtype: FormatLike) -> ResolvedPrecision:
        """The formats used when the program's dtype at this op is ``dtype``."""
        prog = _fmt(dtype)
        if prog.p > _POLICY_MAX_P:
            return ResolvedPrecision(prog, prog, prog, prog)
        pick = (lambda v: prog if v is None else _fmt(v))
        return ResolvedPrecision(pick(self.input), pick(self.compute),
                                 pick(self.accumulate), pick(self.output))

    def validate(self) -> "OpPrecision":
        """Check that every stated format is known to :mod:`fpx.formats`; returns ``self``."""
        for name in ("input", "compute", "accumulate", "output"):
            v = getattr(self, name)
            if v is not None:
                try:
                    _fmt(v)
                except (ValueError, TypeError) as e:
                    raise ValueError(f"OpPrecision.{name}={v!r}: {e}") from None
        return self

    def __repr__(self) -> str:
        parts = [f"{n}={_show(getattr(self, n))!r}" for n in
                 ("input", "compute", "accumulate", "output") if getattr(self, n) is not None]
        return f"OpPrecision({', '.join(parts)})"


# --------------------------------------------------------------------------------------------
# Accuracy
# --------------------------------------------------------------------------------------------
Number = Union[float, int]


@dataclass(frozen=True)
class Accuracy:
    """Maximum error of one evaluation: ``ulps * ulp_fmt(exact) + absolute``.

    ``ulps`` / ``absolute``: non-negative numbers, or callables taking the operation's inputs
    as float64 arrays and returning per-element values (``inf`` = no bound there).
    ``domain``: a short note (where the bound holds / how it is computed); ``source``: where
    the number comes from.
    """
    ulps: Union[Number, Callable[..., Any]] = 0.5
    absolute: Union[Number, Callable[..., Any]] = 0.0
    domain: str | None = None
    source: str = ""

    def __post_init__(self):
        for name in ("ulps", "absolute"):
            v = getattr(self, name)
            if callable(v):
                continue
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise TypeError(f"Accuracy.{name} must be a number or a callable, "
                                f"got {v!r}") from None
            if not v >= 0:  # also rejects NaN
                raise ValueError(f"Accuracy.{name} must be >= 0, got {v!r}")
            object.__setattr__(self, name, v)

    @property
    def input_dependent(self) -> bool:
        """True when ``ulps`` or ``absolute`` is a function of the inputs."""
        return callable(self.ulps) or callable(self.absolute)

    def _at(self, name: str, inputs) -> Any:
        v = getattr(self, name)
        if not callable(v):
            return v
        if not inputs:
            raise TypeError(f"this accuracy ({self.domain or 'input-dependent'}) depends on "
                            f"the operation's inputs; pass them: bound(result, fmt, *inputs)")
        with np.errstate(all="ignore"):
            out = np.asarray(v(*[np.asarray(x, dtype=np.float64) for x in inputs]),
                             dtype=np.float64)
        return np.where(np.isnan(out), np.inf, out)

    def ulps_at(self, *inputs):
        """``ulps`` evaluated at the inputs (a float when constant)."""
        return self._at("ulps", inputs)

    def absolute_at(self, *inputs):
        """``absolute`` evaluated at the inputs (a float when constant)."""
        return self._at("absolute", inputs)

    def bound(self, result, fmt: FormatLike, *inputs) -> np.ndarray:
        """Maximum absolute error of computed ``result`` (float64 values of format ``fmt``).

        Returns ``ulps * ulp + absolute`` as a float64 array. For a correctly rounded result
        (``ulps <= 0.5``, no absolute term) the ulp is that of ``result`` itself, which is
        exact. Otherwise the exact value may lie in the next binade up (a result just below a
        power of two), so the ulp is taken of the largest magnitude the exact value can have,
        ``(|result| + absolute + ulps*tiny_spacing) / (1 - ulps*2**(1-p))``; inside a binade
        this is ``ulp(result)`` (the bound is then refined by iterating
        ``m <- |result| + ulps*ulp(m) + absolute``). Non-finite results get ``inf``.
        """
        f = _fmt(fmt)
        r = np.abs(np.asarray(result, dtype=np.float64))
        U = np.asarray(self.ulps_at(*inputs), dtype=np.float64)
        A = np.asarray(self.absolute_at(*inputs), dtype=np.float64)
        with np.errstate(all="ignore"):
            denorm = math.ldexp(1.0, f.emin - f.p + 1)
            cr = (U <= 0.5) & (A == 0)
            b_cr = np.where(U > 0, U * ulp(r, f), 0.0)
            q = U * math.ldexp(1.0, 1 - f.p)
            # |f| <= r + U ulp(f) + A and ulp(f) <= 2^(1-p)|f| + denorm give an upper bound m
            # of |f|; m' = r + U ulp(m) + A is again one, and never larger: refine twice.
            m = (r + A + U * denorm) / (1.0 - q) * (1.0 + _SLACK)
            for _ in range(2):
                m = np.minimum(m, f.max)  # the exact value is finite; beyond max: ulp of max
                m = np.minimum(m, (r + U * ulp(m, f) + A) * (1.0 + _SLACK))
            m = np.minimum(m, f.max)
            b_gen = np.where(U > 0, U * ulp(m, f), 0.0) + A
            b_gen = np.where(A > 0, b_gen * (1.0 + _SLACK), b_gen)
            b_gen = np.where((q < 1) | (U == 0), b_gen, np.inf)
            b = np.where(cr, b_cr, b_gen)
            b = np.where(np.isfinite(r) & ~np.isnan(b), b, np.inf)
        return np.asarray(b, dtype=np.float64)

    def short(self) -> str:
        """A compact text form for tables."""
        if self.input_dependent:
            return self.domain or "input-dependent"
        if self.ulps == 0 and self.absolute == 0:
            return "0"
        s = f"{self.ulps:.6g}"
        if self.absolute:
            s += f" +{_pow2_text(self.absolute)}"
        return s

    def __str__(self) -> str:
        if self.input_dependent:
            return self.short()
        return f"{self.short()} ulp" + (f" ({self.domain})" if self.domain else "")


def _pow2_text(a: float) -> str:
    """``a`` as ``c*2^k`` text (``2^k`` when a power of two)."""
    if not math.isfinite(a) or a <= 0:
        return f"{a:g}"
    k = math.floor(math.log2(a))
    c = a / math.ldexp(1.0, k)
    return f"2^{k}" if c == 1 else f"{c:.4g}*2^{k}"


# --------------------------------------------------------------------------------------------
# Narrow formats: evaluated in a wider format (float32) and rounded once
# --------------------------------------------------------------------------------------------
def _derive_narrow(wide: Accuracy, fmt, via) -> Accuracy:
    """Accuracy of ``RN_fmt(y)`` where ``y`` is the ``via``-format evaluation with ``wide``.

    With ``|y - f| <= U ulp_via(f) + A`` and ``ulp_via(f) <= 2**(p - p_via) ulp_fmt(f)``
    (``fmt`` narrower, ``emin_fmt >= emin_via``): if ``y`` and ``f`` share a binade of
    ``fmt``, ``|RN(y) - f| <= 0.5 ulp_fmt(f) + |y - f|``; if a power of two ``t`` (a
    ``fmt`` number) lies between them, ``|RN(y) - y| <= |t - y| <= |y - f|``, so
    ``|RN(y) - f| <= 2|y - f|``. Both are within
    ``(0.5 + U 2**(p - p_via)) ulp_fmt(f) + 2A`` when ``U 2**(p - p_via) <= 0.5``.
    Holds for round-to-nearest conversion of results inside ``fmt``'s range.
    """
    scale = math.ldexp(1.0, fmt.p - via.p)
    note = f"evaluated in {via.name}, rounded to {fmt.name}: 0.5 + U_{via.name}*2^{fmt.p - via.p}"
    if callable(wide.ulps):
        g = wide.ulps
        ulps: Any = lambda *xs: 0.5 + np.asarray(g(*xs), dtype=np.float64) * scale  # noqa: E731
    else:
        ulps = 0.5 + wide.ulps * scale
    if callable(wide.absolute):
        h = wide.absolute
        absolute: Any = lambda *xs: 2.0 * np.asarray(h(*xs), dtype=np.float64)  # noqa: E731
    else:
        absolute = 2.0 * wide.absolute
    dom = note if not wide.input_dependent else f"{wide.domain or 'input-dependent'}; {note}"
    return Accuracy(ulps=ulps, absolute=absolute, domain=dom,
                    source=f"derived from the {via.name} entry ({wide.source})")


# --------------------------------------------------------------------------------------------
# Policy
# --------------------------------------------------------------------------------------------
def _freeze_table(table) -> Mapping[str, Mapping[str, Accuracy]]:
    out: dict[str, Mapping[str, Accuracy]] = {}
    for prim, row in dict(table).items():
        name = canonical_name(prim)
        if name not in _KINDS:
            raise PolicyLookupError(f"fpx.policy: accuracy table names unknown primitive {prim!r}")
        frow: dict[str, Accuracy] = {}
        for key, acc in dict(row).items():
            k = key.strip().lower() if isinstance(key, str) else key
            if k not in _CANONICAL_FORMATS:  # aliases, dtypes, Format objects
                k = _fmt_key(k)
            if not isinstance(acc, Accuracy):
                raise TypeError(f"accuracy table entry {prim}/{k}: expected Accuracy, "
                                f"got {type(acc).__name__}")
            frow[k] = acc
        out[name] = types.MappingProxyType(frow)
    return types.MappingProxyType(out)


def _as_op_precision(v) -> OpPrecision:
    if isinstance(v, OpPrecision):
        return v
    if isinstance(v, Mapping):
        return OpPrecision(**v)
    raise TypeError(f"expected an OpPrecision (or a dict of its fields), got {v!r}")


def _as_accuracy(v) -> Accuracy:
    if isinstance(v, Accuracy):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return Accuracy(ulps=v, source="user override")
    raise TypeError(f"expected an Accuracy or a number of ulps, got {v!r}")


_DESCRIBE_FORMATS = ("float64", "float32", "float16", "bfloat16")
_DISPLAY_ORDER = _EXACT + _ROUNDED + _TRANSCENDENTAL + _ACCUMULATING


@dataclass(frozen=True, repr=False)
class Policy:
    """A precision policy: formats per op kind and accuracy per function and format.

    Fields: ``name``; ``matmul``, ``reduction``, ``elementwise``, ``transcendental``
    (:class:`OpPrecision`); ``accuracies`` (read-only mapping ``prim -> {format name or "*":
    Accuracy}``); ``derive_narrow_from`` (a format name: formats narrower than it without an
    entry are modelled as "evaluated in it, rounded once", see :func:`_derive_narrow`);
    ``flush_to_zero`` (format names whose subnormal inputs and results the executor flushes to
    ±0: CUDA's ``-ftz=true``, which CuPy's kernels and cuBLAS apply to float32); ``notes``.
    Build variants with :meth:`replace`, :meth:`with_` and :meth:`with_accuracy`.
    """
    name: str
    matmul: OpPrecision = OpPrecision()
    reduction: OpPrecision = OpPrecision()
    elementwise: OpPrecision = OpPrecision()
    transcendental: OpPrecision = OpPrecision()
    accuracies: Mapping[str, Mapping[str, Accuracy]] = field(default_factory=dict, hash=False)
    derive_narrow_from: str | None = None
    notes: str = ""
    flush_to_zero: tuple = ()

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("Policy.name must be a non-empty str")
        for kind in OP_KINDS:
            object.__setattr__(self, kind, _as_op_precision(getattr(self, kind)))
        object.__setattr__(self, "accuracies", _freeze_table(self.accuracies))
        object.__setattr__(self, "flush_to_zero",
                           tuple(sorted({_fmt_key(f) for f in self.flush_to_zero})))

    # -- queries ---------------------------------------------------------------------------
    def precision(self, kind_or_prim: str) -> OpPrecision:
        """The :class:`OpPrecision` of an op kind, or of the kind of a primitive."""
        k = kind_or_prim if kind_or_prim in OP_KINDS else kind_of(kind_or_prim)
        return getattr(self, k)

    def resolve(self, prim: str, dtype: FormatLike) -> ResolvedPrecision:
        """Concrete input/compute/accumulate/output formats of ``prim`` on a ``dtype`` program."""
        return self.precision(prim).resolve(dtype)

    @property
    def functions(self) -> tuple:
        """The primitives this policy has accuracy entries for."""
        return tuple(self.accuracies)

    def accuracy(self, prim_name: str, fmt: FormatLike) -> Accuracy:
        """The :class:`Accuracy` of ``prim_name`` with its result in format ``fmt``.

        Lookup: the entry for ``fmt``; else the ``"*"`` (all formats) entry; else, for a
        format narrower than ``derive_narrow_from``, the derived "evaluate wide, round once"
        bound. Otherwise :class:`PolicyLookupError` -- never a silent 0.5 ulp.
        """
        name = canonical_name(prim_name)
        f = _fmt(fmt)
        row = self.accuracies.get(name)
        if row is None:
            raise PolicyLookupError(
                f"precision policy {self.name!r} has no accuracy entry for function "
                f"{prim_name!r}; add one with policy.with_accuracy({name!r}, fmt, ulps=...)")
        if f.name in row:
            return row[f.name]
        if "*" in row:
            return row["*"]
        via_name = self.derive_narrow_from
        if via_name is not None and via_name in row:
            via = _fmt(via_name)
            if f.p < via.p:
                return _derive_narrow(row[via_name], f, via)
        raise PolicyLookupError(
            f"precision policy {self.name!r} has no accuracy entry for function {prim_name!r} "
            f"in format {f.name!r} (entries: {', '.join(row)}); add one with "
            f"policy.with_accuracy({name!r}, {f.name!r}, ulps=...)")

    def bound(self, prim_name: str, result, fmt: FormatLike, *inputs) -> np.ndarray:
        """Shorthand for ``self.accuracy(prim_name, fmt).bound(result, fmt, *inputs)``."""
        return self.accuracy(prim_name, fmt).bound(result, fmt, *inputs)

    def validate(self) -> "Policy":
        """Check every format name this policy mentions; returns ``self``."""
        for kind in OP_KINDS:
            getattr(self, kind).validate()
        for prim, row in self.accuracies.items():
            for key in row:
                if key != "*":
                    _fmt(key)
        if self.derive_narrow_from is not None:
            _fmt(self.derive_narrow_from)
        return self

    # -- variants --------------------------------------------------------------------------
    def replace(self, **changes) -> "Policy":
        """A copy with dataclass fields replaced (``name``, op kinds, ``accuracies``, ...).

        Op kinds accept an :class:`OpPrecision` or a dict of its fields.
        """
        for kind in OP_KINDS:
            if kind in changes:
                changes[kind] = _as_op_precision(changes[kind])
        changes.setdefault("name", self._modified_name())
        return dataclasses.replace(self, **changes)

    def _modified_name(self) -> str:
        """A changed preset must not print as the preset: ``cuda`` becomes ``cuda*``."""
        return self.name if self.name.endswith("*") else self.name + "*"

    def with_(self, **changes) -> "Policy":
        """Like :meth:`replace`, and keyword arguments naming a primitive set its accuracy.

        A primitive's value is an :class:`Accuracy` or a number of ulps (for every format),
        or a dict ``{format: Accuracy or ulps}`` (those formats only), e.g.
        ``policy.with_(matmul=OpPrecision(input="tf32"), exp=4, log={"float32": 5})``.
        """
        fields = {f.name for f in dataclasses.fields(self)}
        plain = {k: v for k, v in changes.items() if k in fields}
        new = self.replace(**plain) if plain else self
        for k, v in changes.items():
            if k in fields:
                continue
            if isinstance(v, Mapping):
                for fmt, acc in v.items():
                    new = new.with_accuracy(k, fmt, _as_accuracy(acc))
            else:
                new = new.with_accuracy(k, None, _as_accuracy(v))
        return new

    def with_accuracy(self, prim_name: str, fmt: FormatLike = None,
                      accuracy: Accuracy | None = None, *, ulps=None, absolute=None,
                      domain: str | None = None, source: str = "user override") -> "Policy":
        """A copy whose accuracy for ``prim_name`` in ``fmt`` is replaced.

        Give an :class:`Accuracy` or its ``ulps``/``absolute``. ``fmt=None`` sets the
        function's accuracy for *every* format (its per-format entries are dropped).
        """
        name = canonical_name(prim_name)
        if name not in _KINDS:
            raise PolicyLookupError(f"fpx.policy: {prim_name!r} is not a primitive "
                                    f"({', '.join(PRIMITIVES)})")
        if accuracy is None:
            if ulps is None and absolute is None:
                raise TypeError("with_accuracy needs an Accuracy or ulps=/absolute=")
            accuracy = Accuracy(ulps=0.0 if ulps is None else ulps,
                                absolute=0.0 if absolute is None else absolute,
                                domain=domain, source=source)
        elif ulps is not None or absolute is not None:
            raise TypeError("give either an Accuracy or ulps=/absolute=, not both")
        table = {p: dict(row) for p, row in self.accuracies.items()}
        if fmt is None:
            table[name] = {"*": accuracy}
        else:
            table.setdefault(name, {})[_fmt_key(fmt)] = accuracy
        return dataclasses.replace(self, accuracies=table, name=self._modified_name())

    # -- display ---------------------------------------------------------------------------
    def _cell(self, prim: str, fmt: str) -> str:
        try:
            acc = self.accuracy(prim, fmt)
        except (LookupError, ValueError, TypeError, ImportError):
            return "-"
        if callable(acc.ulps):
            return "f(x)"
        if callable(acc.absolute):
            return f"{acc.ulps:.6g} +f(x)"
        return acc.short()

    def describe(self) -> str:
        """A readable multi-line table of the policy (formats per kind, ulps per function)."""
        lines = [f"Policy {self.name!r}" + (f": {self.notes.splitlines()[0]}" if self.notes
                                            else "")]
        lines.append(f"  {'op kind':<15}{'input':<10}{'compute':<10}{'accumulate':<12}output")
        for kind in OP_KINDS:
            op = getattr(self, kind)
            lines.append(f"  {kind:<15}{_show(op.input):<10}{_show(op.compute):<10}"
                         f"{_show(op.accumulate):<12}{_show(op.output)}")
        lines.append("  ('-' = the program's dtype; stated formats apply to float32-and-narrower "
                     "programs)")
        lines.append("  max error in ulps of the result format (+c = absolute term; f(x) = "
                     "input-dependent, listed below):")
        lines.append(f"  {'function':<13}" + "".join(f"{f:<22}" for f in _DESCRIBE_FORMATS))
        dependent = []
        for prim in _DISPLAY_ORDER:
            if prim not in self.accuracies:
                continue
            cells = [self._cell(prim, f) for f in _DESCRIBE_FORMATS]
            lines.append((f"  {prim:<13}" + "".join(f"{c:<21} " for c in cells)).rstrip())
            for f in _DESCRIBE_FORMATS:
                row = self.accuracies[prim]
                acc = row.get(f)
                if acc is not None and acc.input_dependent:
                    dependent.append(f"    {prim} [{f}]: {acc.domain}")
        if dependent:
            lines.append("  input-dependent entries:")
            lines.extend(dependent)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        kinds = ", ".join(f"{k}={getattr(self, k)!r}" for k in OP_KINDS
                          if getattr(self, k) != OpPrecision())
        return (f"Policy({self.name!r}" + (f", {kinds}" if kinds else "") +
                f", {len(self.accuracies)} functions)")


def _base_table(cr: str = _tables.SRC_IEEE) -> dict:
    t: dict[str, dict[str, Accuracy]] = {}
    for p in _EXACT:
        t[p] = {"*": Accuracy(0.0, source=_tables.SRC_EXACT)}
    for p in _ROUNDED + _ACCUMULATING:
        t[p] = {"*": Accuracy(0.5, source=cr)}
    return t


# -- "ieee" ----------------------------------------------------------------------------------
def _ieee() -> Policy:
    t = _base_table()
    for p in _TRANSCENDENTAL:
        t[p] = {"*": Accuracy(0.5, domain="idealized: real libms are not correctly rounded",
                              source=_tables.SRC_IEEE)}
    t["matmul"] = {"*": Accuracy(0.5, domain="per multiply and per addition",
                                 source=_tables.SRC_IEEE)}
    return Policy(
        "ieee", accuracies=t,
        notes="every operation correctly rounded in the program's own dtypes (idealized; real "
              "math libraries are not correctly rounded, so this is unsound for them)")


# -- "numpy" ---------------------------------------------------------------------------------
def _numpy() -> Policy:
    t = _base_table()
    for name, ((d32, s32), (d64, s64)) in _tables.NUMPY_DOC.items():
        t[name] = {
            "float32": Accuracy(d32 + 1.0, source=f"{s32}; +0.5 vs exact +0.5 margin"),
            "float64": Accuracy(d64 + 1.0, source=f"{s64}; +0.5 vs exact +0.5 margin"),
        }
        if name in _tables.NUMPY_F16_VIA_SVML and d32 + 1.0 < 5.0:
            t[name]["float16"] = Accuracy(
                0.5 + 5.0 * 2.0 ** -13,
                domain="float16 -> float32 SVML LA (<= 4 ulp) -> float16: 0.5 + 5*2^-13",
                source=f"{_tables.SRC_SVML_LA}; loops_umath_fp.dispatch.c.src avx512_<f>_f16")
    return Policy(
        "numpy",
        matmul=OpPrecision(accumulate="float32"),
        transcendental=OpPrecision(compute="float32"),
        accuracies=t, derive_narrow_from="float32",
        notes="NumPy's own SIMD / SVML / libm math on x86-64 (not correctly rounded); float16, "
              "bfloat16 and float8 functions are evaluated in float32 and rounded once; "
              "float16/bfloat16 matmul accumulates in float32; float16 sums accumulate in "
              "float32 within blocks (modelled conservatively as float16)")


# -- "cuda" ----------------------------------------------------------------------------------
def _cuda_table() -> dict:
    t = _base_table()
    for name, (s, d) in _tables.CUDA_DOC.items():
        c = "f" if name != "pow" else "f(x,y)"
        t[name] = {"float32": Accuracy(s + 0.5, source=f"{_tables.SRC_CUDA} ({name}{c}: {s} ulp)"),
                   "float64": Accuracy(d + 0.5, source=f"{_tables.SRC_CUDA} ({name}: {d} ulp)")}
    t["matmul"] = {"*": Accuracy(1.0, domain="per addition in the accumulate format",
                                 source=_tables.SRC_FASI)}
    t["cast"] = {"*": Accuracy(0.5, source=_tables.SRC_IEEE),
                 "tf32": Accuracy(1.0, domain="float32 -> tf32 may truncate (mma on fp32 bits)",
                                  source="round-to-nearest (cvt.rna) or truncation: < 1 ulp")}
    return t


def _cuda() -> Policy:
    return Policy(
        "cuda",
        matmul=OpPrecision(accumulate="float32"),
        reduction=OpPrecision(accumulate="float32"),
        transcendental=OpPrecision(compute="float32"),
        accuracies=_cuda_table(), derive_narrow_from="float32",
        notes="CUDA math library documented max errors (-prec-div=true -prec-sqrt=true); "
              "cuBLAS/PyTorch accumulate half-precision matmul and reductions in float32; "
              "half-precision functions are evaluated in float32 (PyTorch opmath)")


def _tf32() -> Policy:
    return _cuda().replace(
        name="tf32", matmul=OpPrecision(input="tf32", accumulate="float32"),
        notes="cuda with matmul/conv inputs rounded to tf32 and float32 accumulation "
              "(cuBLAS TF32 tensor-op math, torch.backends.cuda.matmul.allow_tf32)")


def _cupy() -> Policy:
    return _cuda().replace(
        name="cupy", reduction=OpPrecision(), flush_to_zero=("float32",),
        notes="cuda for CuPy's own kernels: the CUDA math library's documented errors; "
              "float16 sums, means and cumsums accumulate in float16 (CuPy's CUB reductions "
              "and scans do: seen on an H100, errors beyond float32 accumulation's bound); "
              "cuBLAS matmuls accumulate float16 in float32; float32 subnormals are flushed "
              "to zero (CuPy's elementwise kernels and cuBLAS: seen on an H100)")


# -- "cuda-fast" -----------------------------------------------------------------------------
def _cuda_fast() -> Policy:
    t = _cuda_table()
    f32 = "float32"
    ftz_note = "; FTZ: +2^-126, inf for subnormal float32 inputs"

    def put(name, acc):
        row = dict(t[name])
        star = row.pop("*", None)
        if star is not None:   # keep the other formats (float64 is unaffected by fast math)
            row.setdefault("float64", star)
        row[f32] = acc
        t[name] = row

    def fast(ulps=0.0, base=0.0, domain="", source=_tables.SRC_CUDA_INTR):
        return Accuracy(ulps=ulps, absolute=_tables.ftz(base), domain=domain + ftz_note,
                        source=source)

    # elementwise, -ftz=true -prec-div=false -prec-sqrt=false
    for name in ("add", "sub"):
        put(name, Accuracy(0.5, absolute=3 * _tables.TINY32,
                           domain="FTZ: two flushed inputs and a flushed output",
                           source=_tables.SRC_CUDA_INTR))
    for name in ("neg", "abs", "max", "min"):
        put(name, Accuracy(0.0, absolute=_tables.TINY32, domain="FTZ: flushed input",
                           source=_tables.SRC_CUDA_INTR))
    put("cast", Accuracy(0.5, absolute=_tables.TINY32, domain="FTZ: flushed result",
                         source=_tables.SRC_CUDA_INTR))
    for name in ("floor", "ceil", "round", "sign"):
        put(name, fast(0.0, domain="exact"))
    put("mul", fast(0.5, domain="0.5 ulp"))
    put("fma", fast(0.5, domain="0.5 ulp"))
    put("div", fast(2.5, domain="x/y with -prec-div=false: 2 ulp (full range) + 0.5"))
    put("sqrt", fast(1.5, domain="sqrtf with -prec-sqrt=false: 1 ulp (cc >= 5.2) + 0.5"))
    # intrinsics substituted by -use_fast_math
    put("exp", fast(_tables.expf_ulps, domain="__expf: 2 + floor(|1.173x|) + 0.5 ulp"))
    put("log", fast(_tables.logf_ulps, _tables.logf_abs,
                    domain="__logf: abs 2^-21.41 on [0.5, 2], else 3 + 0.5 ulp"))
    put("log2", fast(_tables.log2f_ulps, _tables.log2f_abs,
                     domain="__log2f: abs 2^-22 on [0.5, 2], else 2 + 0.5 ulp"))
    put("sin", fast(0.0, _tables.sinf_abs,
                    domain="__sinf: abs 2^-21.41 on [-pi, pi], no documented bound outside"))
    put("cos", fast(0.0, _tables.cosf_abs,
                    domain="__cosf: abs 2^-21.19 on [-pi, pi], no documented bound outside"))
    put("tan", fast(0.0, _tables.tanf_abs,
                    domain="__tanf = __sinf * (1/__cosf): derived abs bound on [-pi, pi]"))
    put("pow", fast(0.0, _tables.powf_abs,
                    domain="__powf = exp2f(y * __log2f(x)): derived bound, x > 0"))
    put("tanh", fast(0.0, _tables.tanhf_abs,
                     domain="__tanhf: relative 2^-11 (cc >= 7.5)"))
    # not remapped: standard float32 table (already in t), plus FTZ
    for name in ("exp2", "expm1", "log1p", "sinh", "cosh", "atan", "atan2", "erf"):
        u = t[name][f32].ulps
        put(name, fast(u, domain=f"{name}f: {u - 0.5:g} + 0.5 ulp (not remapped)",
                       source=_tables.SRC_CUDA))
    return Policy(
        "cuda-fast",
        matmul=OpPrecision(accumulate="float32"),
        reduction=OpPrecision(accumulate="float32"),
        transcendental=OpPrecision(compute="float32"),
        accuracies=t, derive_narrow_from="float32",
        notes="nvcc -use_fast_math: float32 intrinsics (__expf, __logf, __sinf, ...), "
              "approximate division/sqrt, flush-to-zero; float64 is unaffected; cuBLAS "
              "matmul and library reductions are not compiled with fast math")


# --------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------
IEEE = _ieee()
NUMPY = _numpy()
CUDA = _cuda()
CUDA_FAST = _cuda_fast()
TF32 = _tf32()

CUPY = _cupy()
_PRESETS = {"ieee": IEEE, "numpy": NUMPY, "cuda": CUDA, "cuda-fast": CUDA_FAST, "tf32": TF32,
            "cupy": CUPY}
#: Names accepted by :func:`get_policy`.
PRESETS = tuple(_PRESETS)
#: The policy used when none is given: NumPy's actual math.
DEFAULT_POLICY = "numpy"
_PRESET_ALIASES = {"ieee754": "ieee", "ideal": "ieee", "default": DEFAULT_POLICY,
                   "cuda-fast-math": "cuda-fast", "fast-math": "cuda-fast",
                   "use-fast-math": "cuda-fast", "cuda-tf32": "tf32"}


def get_policy(name_or_policy: Union[str, Policy, None] = None) -> Policy:
    """A :class:`Policy` from a preset name (see :data:`PRESETS`), or a policy as is.

    ``None`` gives the default, ``"numpy"``. Names are case-insensitive; ``_`` and ``-`` are
    interchangeable. Unknown names raise :class:`ValueError` listing the presets.
    """
    if isinstance(name_or_policy, Policy):
        return name_or_policy
    if name_or_policy is None:
        return _PRESETS[DEFAULT_POLICY]
    if not isinstance(name_or_policy, str):
        raise TypeError(f"get_policy expects a preset name or a Policy, "
                        f"got {type(name_or_policy).__name__}")
    key = name_or_policy.strip().lower().replace("_", "-")
    key = _PRESET_ALIASES.get(key, key)
    try:
        return _PRESETS[key]
    except KeyError:
        raise ValueError(f"unknown precision policy {name_or_policy!r}; presets: "
                         f"{', '.join(PRESETS)} (or pass a fpx.policy.Policy)") from None
