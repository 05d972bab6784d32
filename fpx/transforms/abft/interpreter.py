"""The abft interpreter: every GEMM of the program -- the ``matmul`` primitive, and through
their decompositions ``linear``, ``conv``, ``conv_transpose``, ``einsum``, ``tensordot``,
``dot``, attention -- runs as the checksummed GEMM of :mod:`.gemm` and is verified, located
and corrected by :mod:`.check`; every other operation runs unchanged under the parent."""
from __future__ import annotations

import numpy as np

from fpx import formats
from fpx.core import (PRIMITIVES, Composite, EvalInterpreter, FpxError, Interpreter, Tracer,
                      concrete, is_cupy)
from fpx.transform import own
from fpx.transforms.abft import check as _check
from fpx.transforms.abft.gemm import GEMM, STORE, Site, batch3, model_of, site_layer
from fpx.transforms.abft.report import GemmRecord, Report
from fpx.transforms.abft.thresholds import Info, e_max_for, resolve

__all__ = ["AbftInterpreter", "WEIGHT_OPERAND", "operand_values", "check_options"]

#: which operand of the GEMM a layer's weight is, per contraction (conv: w_mat @ cols)
WEIGHT_OPERAND = {"conv": 0, "conv_transpose": 0, "linear": 1}


def operand_values(args):
    """The concrete arrays behind the operands (own or outer tracers, arrays, scalars)."""
    out = []
    for a in args:
        v = concrete(a)
        if is_cupy(v):
            raise FpxError("fpx.abft/fpx.inject: CuPy arrays are not supported yet; pass NumPy "
                           "arrays (or CPU torch tensors)")
        out.append(v if isinstance(v, np.ndarray) else np.asarray(v))
    return out


def check_options(threshold, c_sigma, verify, checksums, output):
    """Raise for an option fpx.abft does not know (before anything runs)."""
    resolve(threshold)
    if verify not in ("online", "offline"):
        raise ValueError(f"fpx.abft: verify must be 'online' or 'offline', got {verify!r}")
    if checksums not in ("auto", "row", "column", "both"):
        raise ValueError(f"fpx.abft: checksums must be 'auto', 'row', 'column' or 'both', got "
                         f"{checksums!r}")
    if not float(c_sigma) >= 0:
        raise ValueError(f"fpx.abft: c_sigma must be a non-negative number, got {c_sigma!r}")
    if output is not None:
        formats.get(output)


class AbftInterpreter(Interpreter):
    """Checksums every GEMM (see the package docstring); ``report`` collects the records."""

    #: its values are concrete arrays: an enclosing fpx.inject may wrap it
    concrete_values = True

    def __init__(self, parent, *, threshold="v-abft", e_max=None, c_sigma=2.5, correct=True,
                 verify="online", output=None, checksums="auto", names=None):
        super().__init__(parent)
        if not (isinstance(parent, EvalInterpreter) or getattr(parent, "concrete_values", False)):
            raise FpxError(f"fpx.abft: running inside {type(parent).__name__} is not supported; "
                           "fpx.abft runs on concrete arrays (fpx.inject may enclose it)")
        check_options(threshold, c_sigma, verify, checksums, output)
        self.tfun = resolve(threshold)
        self.e_max, self.c_sigma, self.correct = e_max, float(c_sigma), bool(correct)
        self.verify, self.checksums = verify, checksums
        self.output = None if output is None else formats.get(output)
        self.names = names or {}
        self.site = None
        self.report = Report(threshold if isinstance(threshold, str) else repr(threshold), verify)

    def process(self, prim, args, params):
        rule = self.rules.get(prim.name)
        if rule is not None:
            return rule(self, prim, *args, **params)
        if isinstance(prim, Composite) and prim.kind == "matmul":
            if self.site is not None:               # inside another contraction: its site
                return prim.decomposition(*args, **params)
            vals = operand_values(args)
            layer, w = site_layer(self.names, vals)
            wshape = tuple(vals[1].shape) if prim.name in ("linear", "conv") else None
            self.site = Site(prim.name, layer, WEIGHT_OPERAND.get(prim.name, 1), wshape)
            try:
                return prim.decomposition(*args, **params)
            finally:
                self.site = None
        vals = [a.primal if own(self, a) else a for a in args]
        return Tracer(self, self.bind_parent(prim, *vals, **params))


def _numpy_mismatch(A, B):
    return ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, with "
                      f"gufunc signature (n?,k),(k,m?)->(n?,m?) (size {B.shape[-2]} is "
                      f"different from {A.shape[-1]})")


@AbftInterpreter.def_rule("matmul", "gemm")
def _gemm_rule(self, prim, a, b, **params):
    va, vb = operand_values((a, b))
    if va.ndim == 0 or vb.ndim == 0:
        raise ValueError("matmul: Input operand does not have enough dimensions (a scalar "
                         "operand; use multiply)")
    if prim is GEMM:                      # an inner fpx.inject's accumulator: no store
        model = model_of(params["acc"], params["acc"])
        site = params.get("site") or Site("matmul")
    else:
        model = model_of(va.dtype, vb.dtype, self.output)
        site = self.site
        if site is None:
            layer, w = site_layer(self.names, (va, vb))
            site = Site("matmul", layer, 1 if w is None else w)
    A = va.reshape((1,) + va.shape) if va.ndim == 1 else va
    B = vb.reshape(vb.shape + (1,)) if vb.ndim == 1 else vb
    (M, K), (K2, N) = A.shape[-2:], B.shape[-2:]
    if K != K2:
        raise _numpy_mismatch(A, B)
    bshape = tuple(np.broadcast_shapes(A.shape[:-2], B.shape[:-2]))
    if model.kind == "bool":              # logical matmul: nothing to checksum
        res = concrete(self.bind_parent(PRIMITIVES["matmul"], va, vb))
        self.report.gemms.append(_record(site, va, vb, res, model, self.verify, (), None, ()))
        return Tracer(self, res)
    acc = model.acc
    G = int(np.prod(bshape, dtype=np.int64))
    A3 = batch3(A if A.dtype == acc else A.astype(acc), bshape, M, K)
    B3 = batch3(B if B.dtype == acc else B.astype(acc), bshape, K, N)
    pre = _check.prepare(A3, B3, tfun=self.tfun, checksums=self.checksums)
    C = np.asarray(concrete(self.bind_parent(
        GEMM, A, B, acc=acc, out=model.out.dtype if model.stores else None, site=site)))
    offline = self.verify == "offline" and model.stores
    if offline:
        Cv = np.asarray(concrete(self.bind_parent(STORE, C, to=model.out.dtype, site=site)))
        Cv = Cv.astype(acc)
    else:
        Cv = C if C.flags.writeable and C.flags.c_contiguous else np.ascontiguousarray(C).copy()
    C3 = Cv.reshape((G, M, N))
    info = None
    if model.kind == "float":
        accf = formats.get(acc)
        fmt = model.out if offline else accf
        info = Info(fmt=fmt, acc=accf, out=model.out if model.stores else accf,
                    verify=self.verify, e_max=e_max_for(self.e_max, fmt, K, N),
                    c_sigma=self.c_sigma)
    st, checks = _check.check(A3, B3, C3, tfun=self.tfun, info=info, checksums=self.checksums,
                              correct=self.correct,
                              out=model.out.dtype if offline else None, pre=pre)
    if model.stores and not offline:
        res = np.asarray(concrete(self.bind_parent(STORE, Cv, to=model.out.dtype, site=site)))
    else:
        res = Cv.astype(model.out.dtype, copy=False) if model.kind == "float" else Cv
    res = res.astype(model.result, copy=False)
    if vb.ndim == 1:
        res = res[..., 0]
    if va.ndim == 1:
        res = res[..., 0, :] if vb.ndim > 1 else res[..., 0]
    self.report.gemms.append(_record(site, va, vb, res, model, self.verify, checks, st, bshape))
    return Tracer(self, res)


def _record(site, va, vb, res, model, verify, checks, st, bshape):
    fmt = (lambda f: f.name if hasattr(f, "name") else str(f))
    locs = []
    if st is not None:
        for g, i, j in sorted(set(st.locations)):
            bi = tuple(int(x) for x in np.unravel_index(g, bshape)) if bshape else ()
            locs.append(bi + (i, j))
    return GemmRecord(
        op=site.op, layer=site.layer, a_shape=tuple(va.shape), b_shape=tuple(vb.shape),
        out_shape=tuple(np.shape(res)), dtype=fmt(model.inp) if model.inp else str(va.dtype),
        acc=str(model.acc), output=fmt(model.out), verify=verify if model.kind == "float"
        else "exact", checks=checks, threshold=st.threshold if st else 0.0,
        residual=st.residual if st else 0.0, ratio=st.ratio if st else 0.0,
        tightness=(st.sum_t / st.sum_e if st.sum_e else float("inf")) if st else float("nan"),
        detected=st.detected if st else 0, corrected=st.corrected if st else 0,
        recomputed=st.recomputed if st else 0, uncorrected=st.uncorrected if st else 0,
        unverified=st.unverified if st else 0, locations=locs)
