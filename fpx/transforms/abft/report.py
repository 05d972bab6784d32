"""What ``fpx.abft(f, report=True)`` returns beside the outputs: one :class:`GemmRecord` per
checksummed GEMM, gathered in a :class:`Report`. Plain classes (not dataclasses), so the
adapter passes them through untouched."""
from __future__ import annotations

__all__ = ["GemmRecord", "Report"]


class GemmRecord:
    """One GEMM's verification.

    ``op``, ``layer``: where it sits (:class:`~fpx.transforms.abft.gemm.Site`); ``a_shape``,
    ``b_shape``, ``out_shape``; ``dtype`` (the operands' format), ``acc``, ``output`` (format
    names); ``verify``; ``checks``: the checks run ("row": one per output row, "column": one per
    output column; a 1-column output has no row check, a 1-row output no column check);
    ``threshold``: the largest per-row threshold; ``residual``: the largest |verification
    difference| (observed minus checksum, before any correction) over the verified rows;
    ``ratio``: the largest residual/threshold (a clean GEMM stays below 1); ``tightness``: the
    mean threshold over the mean |verification difference| of the verified rows (the V-ABFT
    paper's "threshold / actual difference"; inf for an exact zero difference); ``detected``:
    rows or columns over their threshold (or with a non-finite result from finite checksums);
    ``corrected``: elements recomputed at the located position whose check then passed;
    ``recomputed``: rows/columns recomputed whole because the single-error location did not
    hold; ``uncorrected``: detected and still failing; ``unverified``: rows or columns whose
    checksum is not finite (NaN/inf in the operands, or overflow): reported, never changed;
    ``locations``: the located elements as output indices (batch..., i, j)."""

    __slots__ = ("op", "layer", "a_shape", "b_shape", "out_shape", "dtype", "acc", "output",
                 "verify", "checks", "threshold", "residual", "ratio", "tightness", "detected",
                 "corrected",
                 "recomputed", "uncorrected", "unverified", "locations")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self):
        where = self.op + (f"[{self.layer}]" if self.layer else "")
        return (f"GemmRecord({where} {self.a_shape}@{self.b_shape} {self.dtype}->{self.output}"
                f" {self.verify}: threshold={self.threshold:.3g} residual={self.residual:.3g}"
                f" detected={self.detected} corrected={self.corrected}"
                + (f" recomputed={self.recomputed}" if self.recomputed else "")
                + (f" uncorrected={self.uncorrected}" if self.uncorrected else "")
                + (f" unverified={self.unverified}" if self.unverified else "") + ")")


class Report:
    """``gemms``: the records in execution order; totals ``detected``, ``corrected``,
    ``recomputed``, ``uncorrected``, ``unverified``; ``clean``: nothing detected and nothing
    unverified."""

    __slots__ = ("gemms", "threshold", "verify")

    def __init__(self, threshold, verify):
        self.gemms: list[GemmRecord] = []
        self.threshold, self.verify = threshold, verify

    def _total(self, name):
        return sum(getattr(g, name) for g in self.gemms)

    detected = property(lambda self: self._total("detected"))
    corrected = property(lambda self: self._total("corrected"))
    recomputed = property(lambda self: self._total("recomputed"))
    uncorrected = property(lambda self: self._total("uncorrected"))
    unverified = property(lambda self: self._total("unverified"))

    @property
    def clean(self) -> bool:
        return self.detected == 0 and self.unverified == 0

    def __len__(self):
        return len(self.gemms)

    def __repr__(self):
        lines = [f"abft report ({self.threshold}, {self.verify}): {len(self.gemms)} GEMMs, "
                 f"detected={self.detected} corrected={self.corrected} "
                 f"recomputed={self.recomputed} uncorrected={self.uncorrected} "
                 f"unverified={self.unverified}"]
        lines += ["  " + repr(g) for g in self.gemms]
        return "\n".join(lines)
