"""``fpx.inject(f, fault)``: fault injection as a transform -- the program runs unchanged except
for the bits the faults (:mod:`fpx.faults`) flip or overwrite.

Composition is by nesting. ``fpx.inject(fpx.abft(f), fault)``: abft's checksummed GEMMs bind
their ``gemm`` (operands -> accumulator) and ``gemm_store`` (accumulator -> output format)
primitives under the enclosing inject, so the fault lands *inside* the protected GEMM -- in an
operand as the GEMM reads it, in the accumulator, or in the stored output -- before
verification (online verification reads the accumulator, so a fault in a low-precision output
written after it goes unseen, as on the hardware). ``fpx.abft(fpx.inject(f), fault)``: the
fault happens outside abft's GEMMs (an input corrupted before the checksums are encoded, an
output after verification), which no checksum can see.

``report=True`` returns ``(outputs, log)``: one :class:`Injection` per fault injected.
"""
from __future__ import annotations

import numpy as np

from fpx.core import PRIMITIVES, Composite, EvalInterpreter, FpxError, Interpreter, Tracer, concrete
from fpx.faults import Fault
from fpx.transform import is_array_leaf, own, run, transformed
from fpx.transforms.abft.gemm import GEMM, STORE, Site, model_of, param_names, site_layer
from fpx.transforms.abft.interpreter import operand_values

__all__ = ["inject", "InjectInterpreter", "Injection"]

_MATMUL = PRIMITIVES["matmul"]


class Injection:
    """One injected fault: ``fault``, ``gemm`` (the GEMM's number in the run, or None for
    another op), ``op``, ``layer``, ``where``, ``index`` (in the value it changed), ``before``,
    ``after`` (the element's values)."""

    __slots__ = ("fault", "gemm", "op", "layer", "where", "index", "before", "after")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    def __repr__(self):
        at = self.op + (f"[{self.layer}]" if self.layer else "") + \
            (f" #{self.gemm}" if self.gemm is not None else "")
        return (f"Injection({at} {self.where}{list(self.index)}: {self.before!r} -> "
                f"{self.after!r})")


class InjectInterpreter(Interpreter):
    """Applies ``faults`` where they match (see :mod:`fpx.faults`); ``log`` lists them."""

    concrete_values = True

    def __init__(self, parent, faults, names=None):
        super().__init__(parent)
        if not (isinstance(parent, EvalInterpreter) or getattr(parent, "concrete_values", False)):
            raise FpxError(f"fpx.inject: running inside {type(parent).__name__} is not "
                           "supported; it runs on concrete arrays (it may enclose fpx.abft)")
        self.faults = list(faults)
        self.names = names or {}
        self.log: list[Injection] = []
        self.gemms = 0                       # GEMM applications seen so far
        self.matched = [0] * len(self.faults)
        self.calls: dict[str, int] = {}
        self.site = None                     # inside a GEMM composite: (Site, n)
        self.pending = []                    # fired faults waiting for an inner stage
        self._store_for = None               # the GEMM whose gemm_store comes next
        gemm_names = {"matmul", "gemm", "gemm_store"} | {
            p.name for p in PRIMITIVES.values() if isinstance(p, Composite) and p.kind == "matmul"}
        self.deep = any(isinstance(f.op, str) and f.op not in gemm_names and f.op in PRIMITIVES
                        for f in self.faults)

    # -- which faults fire -----------------------------------------------------------------
    def _fire(self, k, fault, key):
        if fault.call is not None:
            hit = self.matched[k] == fault.call
            self.matched[k] += 1
            if not hit:
                return None
        rng = np.random.default_rng([fault.seed, k] + list(key))
        if fault.prob < 1.0 and not rng.random() < fault.prob:
            return None
        return rng

    def _gemm_faults(self, site, n):
        """[(fault number, fault, rng)] of the faults that hit GEMM ``n`` at ``site``."""
        out = []
        for k, f in enumerate(self.faults):
            if _selects(f.op, site, n):
                rng = self._fire(k, f, (0, n))
                if rng is not None:
                    out.append((k, f, rng))
        return out

    def _hit(self, x, k, fault, rng, where, site, n, index=None):
        v = np.asarray(concrete(x))
        idx = fault.pick(v, rng, index)
        if idx is None:                      # no element qualifies (BitFlip's direction)
            return x
        y = fault.apply(v, idx)
        self.log.append(Injection(fault=fault, gemm=n, op=site.op, layer=site.layer,
                                  where=where, index=idx, before=_item(v, idx),
                                  after=_item(y, idx)))
        return y

    # -- dispatch --------------------------------------------------------------------------
    def process(self, prim, args, params):
        if prim is GEMM:
            return self._gemm(prim, args, params, params.get("site") or Site("matmul"))
        if prim is STORE:
            return self._store(prim, args, params)
        is_gemm = isinstance(prim, Composite) and prim.kind == "matmul"
        if (is_gemm or prim is _MATMUL) and self.site is None:
            return self._gemm_op(prim, args, params)
        if prim is _MATMUL:                           # inside a GEMM composite
            return self._inner_matmul(prim, args, params)
        if isinstance(prim, Composite) and (self.deep or is_gemm):
            return prim.decomposition(*args, **params)
        vals = [a.primal if own(self, a) else a for a in args]
        targets = [(k, f) for k, f in enumerate(self.faults) if f.op == prim.name]
        if not targets:
            return Tracer(self, self.bind_parent(prim, *vals, **params))
        return self._other(prim, vals, params, targets)

    def _other(self, prim, vals, params, targets):
        """A fault on a non-GEMM op: its output or first array operand ("input")."""
        c = self.calls.get(prim.name, 0)
        self.calls[prim.name] = c + 1
        site = Site(prim.name)
        fired = [(k, f, r) for k, f in targets for r in [self._fire(k, f, (1, c))] if r is not None]
        for k, f, r in fired:
            if f.where in ("input", "weight"):
                i = 0 if f.where == "input" else 1
                if i >= len(vals) or not hasattr(concrete(vals[i]), "shape"):
                    raise FpxError(f"fpx.inject: {prim.name} has no array operand for "
                                   f"where={f.where!r}")
                vals = list(vals)
                vals[i] = self._hit(vals[i], k, f, r, f.where, site, None)
            elif f.where == "accumulator":
                raise FpxError(f"fpx.inject: where='accumulator' needs a GEMM, not {prim.name}")
        out = self.bind_parent(prim, *vals, **params)
        for k, f, r in fired:
            if f.where == "output":
                out = self._hit(out, k, f, r, "output", site, None)
        return Tracer(self, out)

    def _gemm_op(self, prim, args, params):
        """A GEMM of the program (a matmul-kind composite, or a bare matmul): one site."""
        vals = [a.primal if own(self, a) else a for a in args]
        layer, w = site_layer(self.names, operand_values(vals))
        wi = (1 if w is None else w) if prim is _MATMUL else 1
        site, n = Site(prim.name, layer, wi), self.gemms
        self.gemms += 1
        fired = self._gemm_faults(site, n)
        vals = self._operand_faults(vals, fired, site, n, wi)
        acc = [x for x in fired if x[1].where == "accumulator"]
        if acc or (self.deep and isinstance(prim, Composite)):
            self.site, self.pending = (site, n), acc
            try:
                inner = [Tracer(self, v) if is_array_leaf(v) else v for v in vals]
                out = prim.decomposition(*inner, **params) if isinstance(prim, Composite) \
                    else self._inner_matmul(prim, inner, params)
            finally:
                self.site, self.pending = None, []
            out = out.primal if own(self, out) else out
        else:
            out = self.bind_parent(prim, *vals, **params)
        for k, f, r in fired:
            if f.where == "output":
                out = self._hit(out, k, f, r, "output", site, n)
        return Tracer(self, out)

    def _operand_faults(self, vals, fired, site, n, wi, gemm=False):
        """Faults in the operands; inside abft's GEMM (``gemm``) a layer weight's index is
        given in the parameter's coordinates and mapped to the GEMM's weight operand."""
        vals = list(vals)
        for k, f, r in fired:
            if f.where in ("input", "weight"):
                i = wi if f.where == "weight" else 1 - wi
                index = None
                if gemm and f.where == "weight":
                    index = site.weight_index(f.index, np.shape(concrete(vals[i])))
                vals[i] = self._hit(vals[i], k, f, r, f.where, site, n, index)
        return vals

    def _inner_matmul(self, prim, args, params):
        """A matmul inside a GEMM site: the accumulator faults still pending land here."""
        vals = [a.primal if own(self, a) else a for a in args]
        if not self.pending:
            return Tracer(self, self.bind_parent(prim, *vals, **params))
        pending, self.pending = self.pending, []
        site, n = self.site
        va, vb = operand_values(vals)
        model = model_of(va.dtype, vb.dtype)
        if model.kind != "float":
            raise FpxError("fpx.inject: where='accumulator' needs a floating-point GEMM")
        A = va.reshape((1,) + va.shape) if va.ndim == 1 else va
        B = vb.reshape(vb.shape + (1,)) if vb.ndim == 1 else vb
        acc = self.bind_parent(GEMM, A, B, acc=model.acc, out=None, site=site)
        for k, f, r in pending:
            acc = self._hit(acc, k, f, r, "accumulator", site, n)
        out = np.asarray(concrete(acc))
        if out.dtype != model.result:
            out = np.asarray(concrete(self.bind_parent(STORE, out, to=model.result, site=site)))
        if vb.ndim == 1:
            out = out[..., 0]
        if va.ndim == 1:
            out = out[..., 0, :] if vb.ndim > 1 else out[..., 0]
        return Tracer(self, out)

    def _gemm(self, prim, args, params, site):
        """fpx.abft's checksummed GEMM (inject encloses abft): faults inside it."""
        n = self.gemms
        self.gemms += 1
        fired = self._gemm_faults(site, n)
        wi = site.weight if site.weight is not None else 1
        vals = self._operand_faults([a.primal if own(self, a) else a for a in args],
                                    fired, site, n, wi, gemm=True)
        out = self.bind_parent(prim, *vals, **params)
        stores = params.get("out") is not None
        self.pending = []
        for k, f, r in fired:
            if f.where == "accumulator" or (f.where == "output" and not stores):
                out = self._hit(out, k, f, r, f.where, site, n)
            elif f.where == "output":
                self.pending.append((k, f, r))
        self._store_for = (site, n)
        return Tracer(self, out)

    def _store(self, prim, args, params):
        vals = [a.primal if own(self, a) else a for a in args]
        out = self.bind_parent(prim, *vals, **params)
        pending, self.pending = self.pending, []
        for k, f, r in pending:
            site, n = self._store_for
            out = self._hit(out, k, f, r, "output", site, n)
        return Tracer(self, out)


def _selects(op, site, n) -> bool:
    """Does a fault's ``op`` select GEMM number ``n`` at ``site``?"""
    if op is None:
        return True
    if isinstance(op, str):
        return site.matches(op)
    return int(op) == n


def _item(v, idx):
    x = v[idx] if v.ndim else v[()]
    try:
        return float(x) if np.dtype(v.dtype).kind in "fV" else int(x)
    except (TypeError, ValueError):
        return x


def inject(f, fault, *, report=False):
    """``fpx.inject(f, fault)(*args)``: run ``f`` with ``fault`` (a :class:`fpx.faults.Fault`,
    or a list of them) injected; ``report=True`` returns ``(outputs, log)``."""
    faults = list(fault) if isinstance(fault, (list, tuple)) else [fault]
    for x in faults:
        if not isinstance(x, Fault):
            raise TypeError(f"fpx.inject: expected fpx.faults faults, got {type(x).__name__}")

    def body(ad):
        names = param_names(ad)
        interp, out = run(lambda p: InjectInterpreter(p, faults, names), Tracer, ad.fn,
                          ad.args, ad.kwargs,
                          lambda i, x: concrete(x) if isinstance(x, Tracer) else x)
        return (out, interp.log) if report else out
    return transformed(f, body)
