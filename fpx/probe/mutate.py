"""TorchProbe's four mutations: source-to-source rewrites (Python ``ast``) that keep the meaning.

Each mutation rewrites the top-level body of ``def program`` and needs only the source and
the inputs (the profile of a prefix of the program: shapes, values, which tensors share
storage). They compose in any order, each on the previous one's output:

* ``resolve`` -- operator resolution: an elementwise statement unrolled along one axis into a
  loop or a list comprehension over slices, stacked back;
* ``recover`` -- mutate-then-recover: back up a tensor (or an entry, or a view of it), change it
  in place, and restore it right before the next statement that reads it or any tensor sharing
  its storage;
* ``functionalize`` -- a run of statements moved into a nested function, with its free names
  as parameters or read as closures, and the definition possibly hoisted above the
  definitions of the names it reads;
* ``emi`` -- an always-true conditional block (Equivalence Modulo Inputs): a run of statements
  wrapped in ``if <cond>:`` whose condition compares profiled scalars (tensor elements,
  ``max``/``min``, sizes, ``ndim``, constants) with a margin, so round-off in a compiled run
  cannot flip it. Under ``fullgraph=True`` only sizes, ``ndim`` and constants are used (a
  tensor-valued condition is a graph break).

All four are exact: the mutated program computes the same real numbers as the seed, and
every rounding it performs is one the seed's round-off bound covers.
"""
from __future__ import annotations

import ast

from fpx.probe import ops
from fpx.probe.program import NAME, profile

MUTATIONS = ("resolve", "recover", "functionalize", "emi")


def _parse(source):
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == NAME)
    ret = fn.body[-1]
    assert isinstance(ret, ast.Return)
    return tree, fn, fn.body[:-1], ret


def _unparse(tree, fn, body, ret):
    fn.body = body + [ret]
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def _stmt(src):
    return ast.parse(src).body


def _fresh(source, stem):
    k = 0
    while f"_{stem}{k}" in source:
        k += 1
    return f"_{stem}{k}"


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _loads(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _defs(stmt):
    """Names a top-level statement binds."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {stmt.name}
    out = set()
    for n in ast.walk(stmt):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        if isinstance(n, ast.FunctionDef):
            out.add(n.name)
    return out


def _reads(body, i):
    """Names statement ``body[i]`` reads when it runs: a definition reads nothing, a call of a
    local function reads what that function reads (transitively)."""
    funcs = {s.name: s for s in body if isinstance(s, ast.FunctionDef)}
    for s in body:
        for n in ast.walk(s):
            if isinstance(n, ast.FunctionDef) and n is not s:
                funcs.setdefault(n.name, n)
    s = body[i] if i < len(body) else None
    if isinstance(s, ast.FunctionDef):
        return set()
    names = _loads(s)
    todo = list(names & set(funcs))
    seen = set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        more = _loads(funcs[f])
        names |= more
        todo += list(more & set(funcs))
    return names


# ----------------------------------------------------------------------------- resolve
def _elementwise(node, tensors):
    """Whether ``node`` computes element by element from tensors and constants only."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id in tensors
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)) and \
            _elementwise(node.left, tensors) and _elementwise(node.right, tensors)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, ast.USub) and _elementwise(node.operand, tensors)
    if isinstance(node, ast.Compare):
        return len(node.ops) == 1 and _elementwise(node.left, tensors) and \
            _elementwise(node.comparators[0], tensors)
    if isinstance(node, ast.Call):
        name = _dotted(node.func)
        kw_ok = all(isinstance(k.value, ast.Constant) for k in node.keywords)
        if name in ops.ELEMENTWISE:
            return kw_ok and all(_elementwise(a, tensors) for a in node.args)
        if isinstance(node.func, ast.Attribute) and node.func.attr in ops.ELEMENTWISE_METHODS:
            dtype_args = all(_dotted(a) and _dotted(a).startswith("torch.") for a in node.args)
            return kw_ok and dtype_args and _elementwise(node.func.value, tensors)
    return False


class _Slicer(ast.NodeTransformer):
    """Replaces each tensor name by its slice at index ``i`` along the result's axis ``d``."""

    def __init__(self, prof, ndim, d, n, index):
        self.prof, self.ndim, self.d, self.n, self.index = prof, ndim, d, n, index

    def visit_Name(self, node):
        t = self.prof.get(node.id)
        if t is None or not isinstance(node.ctx, ast.Load):
            return node
        ax = self.d - (self.ndim - t.ndim)
        if ax < 0:
            return node
        idx = self.index if t.shape[ax] == self.n else "0"
        return ast.parse(f"torch.select({node.id}, {ax}, {idx})", mode="eval").body


def resolve(source, args, rng, fullgraph=False):
    tree, fn, body, ret = _parse(source)
    cands = [i for i, s in enumerate(body) if isinstance(s, ast.Assign) and len(s.targets) == 1
             and isinstance(s.targets[0], ast.Name)]
    rng.shuffle(cands)
    for i in cands[:4]:
        prof = profile(source, args, upto=i + 1)
        s = body[i]
        v = prof.get(s.targets[0].id)
        tensors = {k for k in prof if k != s.targets[0].id}
        if v is None or v.ndim == 0 or not _elementwise(s.value, tensors):
            continue
        d = int(rng.integers(v.ndim))
        n = v.shape[d]
        if n == 0 or n > 64:
            continue
        it = _fresh(source, "i")
        expr = ast.unparse(_Slicer(prof, v.ndim, d, n, it).visit(ast.parse(ast.unparse(s.value),
                                                                              mode="eval")).body)
        target = s.targets[0].id
        if rng.random() < 0.5:
            new = _stmt(f"{target} = torch.stack([{expr} for {it} in range({n})], dim={d})")
        else:
            parts = _fresh(source, "parts")
            new = _stmt(f"{parts} = []\nfor {it} in range({n}):\n    {parts}.append({expr})\n"
                        f"{target} = torch.stack({parts}, dim={d})")
        return _unparse(tree, fn, body[:i] + new + body[i + 1:], ret)
    return None


# ----------------------------------------------------------------------------- recover
def _overlapping(t):
    return any(st == 0 and sz > 1 for st, sz in zip(t.stride(), t.shape))


def recover(source, args, rng, fullgraph=False):
    tree, fn, body, ret = _parse(source)
    full = body + [ret]
    for _ in range(4):
        k = int(rng.integers(0, len(body) + 1))
        prof = profile(source, args, upto=k)
        later = set()
        for j in range(k, len(full)):
            later |= _reads(full, j)
        cands = sorted(n for n, t in prof.items() if n in later and t.is_floating_point()
                       and t.numel() > 0 and not _overlapping(t))
        if not cands:
            continue
        name = cands[rng.integers(len(cands))]
        t = prof[name]
        ptr = t.untyped_storage().data_ptr()
        alias = {n for n, u in prof.items() if u.untyped_storage().data_ptr() == ptr}
        j = next(j for j in range(k, len(full)) if _reads(full, j) & alias)
        bk = _fresh(source, "backup")
        c = repr(round(float(rng.uniform(-3, 3)), 2))
        form = int(rng.integers(3))
        if form == 0 or t.ndim == 0:                 # the whole tensor, in place
            op = [f"{name}.mul_({c})", f"{name}.add_({c})", f"{name}.fill_({c})",
                  f"{name}.neg_()"][int(rng.integers(4))]
            mut = f"{bk} = {name}.clone()\n{op}"
            rec = f"{name}.copy_({bk})"
        elif form == 1:                              # one entry
            idx = ", ".join(str(int(rng.integers(s))) for s in t.shape)
            mut = f"{bk} = {name}[{idx}].clone()\n{name}[{idx}] = {c}"
            rec = f"{name}[{idx}] = {bk}"
        else:                                        # through a view of it
            view = _fresh(source, "view")
            i0 = int(rng.integers(t.shape[0]))
            mut = f"{view} = {name}[{i0}]\n{bk} = {view}.clone()\n{view}.add_({c})"
            rec = f"{view}.copy_({bk})"
        new = body[:k] + _stmt(mut) + body[k:j] + _stmt(rec) + body[j:]
        return _unparse(tree, fn, new, ret)
    return None


# ----------------------------------------------------------------------------- functionalize
def functionalize(source, args, rng, fullgraph=False):
    tree, fn, body, ret = _parse(source)
    if not body:
        return None
    full = body + [ret]
    i = int(rng.integers(len(body)))
    j = int(rng.integers(i + 1, min(len(body), i + 4) + 1))
    block = body[i:j]
    before = {a.arg for a in fn.args.args}
    for s in body[:i]:
        before |= _defs(s)
    inside = set()
    for s in block:
        inside |= _defs(s)
    outside = set()
    for s in body[:i] + body[j:]:
        outside |= _defs(s)
    if inside & outside:
        return None                                  # a rebinding: the nested scope would hide it
    used = set()
    for k in range(i, j):
        used |= _reads(full, k)
    later = set()
    for k in range(j, len(full)):
        later |= _reads(full, k)
    free = sorted((used & before) - inside - {"torch"})
    results = sorted(inside & later)
    f = _fresh(source, "f")
    closure = rng.random() < 0.5
    params = "" if closure else ", ".join(free)
    res = ", ".join(results)
    retline = f"return ({res},)" if results else "return None"
    fdef = ast.FunctionDef(name=f, args=ast.parse(f"def _({params}): pass").body[0].args,
                           body=block + _stmt(retline), decorator_list=[], returns=None,
                           type_params=[])
    call = _stmt(f"({res},) = {f}({params})" if results else f"{f}({params})")
    rest = body[:i] + call + body[j:]
    where = int(rng.integers(0, i + 1)) if closure and rng.random() < 0.6 else i   # hoisting
    return _unparse(tree, fn, rest[:where] + [fdef] + rest[where:], ret)


# ----------------------------------------------------------------------------- emi
def _scalars(prof, rng, fullgraph):
    """Candidate condition operands: (source, value, exact) from the profile."""
    out = []
    names = sorted(prof)
    for n in [names[k] for k in rng.permutation(len(names))[:4]]:
        t = prof[n]
        out.append((f"{n}.ndim", t.ndim, True))
        if t.ndim:
            d = int(rng.integers(t.ndim))
            out.append((f"{n}.shape[{d}]", int(t.shape[d]), True))
        if fullgraph or not t.is_floating_point() or t.numel() == 0:
            continue
        if t.ndim:
            idx = ", ".join(str(int(rng.integers(s))) for s in t.shape)
            out.append((f"{n}[{idx}]", float(t[tuple(int(x) for x in idx.split(", "))]), False))
        out.append((f"{n}.max()", float(t.max()), False))
        out.append((f"{n}.min()", float(t.min()), False))
    return out


def _condition(prof, rng, fullgraph):
    cands = _scalars(prof, rng, fullgraph)
    if not cands:
        return f"{int(rng.integers(1, 9))} > 0"
    lhs, lv, exact = cands[rng.integers(len(cands))]
    others = [c for c in cands if c[0] != lhs]
    if others and rng.random() < 0.5:
        rhs, rv, rexact = others[rng.integers(len(others))]
    else:
        rv = int(rng.integers(-3, 9)) if exact else round(float(lv + rng.uniform(-2, 2)), 3)
        rhs, rexact = repr(rv), True
    margin = 0.0 if exact and rexact else 0.1 * max(abs(lv), abs(rv)) + 0.05
    if abs(lv - rv) <= margin:                       # too close: round-off could flip it
        if exact and rexact:
            return f"{lhs} {'>=' if rng.random() < 0.5 else '<='} {rhs}" if lv == rv else \
                f"{lhs} {'>' if lv > rv else '<'} {rhs}"
        rv = round(lv - 2 * margin if rng.random() < 0.5 else lv + 2 * margin, 3)
        rhs = repr(rv)
    if lv > rv:
        return f"{lhs} {'>' if rng.random() < 0.5 else '>='} {rhs}"
    if lv < rv:
        return f"{lhs} {'<' if rng.random() < 0.5 else '<='} {rhs}"
    return f"{lhs} {'>=' if rng.random() < 0.5 else '<='} {rhs}"


def emi(source, args, rng, fullgraph=False):
    tree, fn, body, ret = _parse(source)
    if not body:
        return None
    i = int(rng.integers(len(body)))
    j = int(rng.integers(i + 1, min(len(body), i + 4) + 1))
    prof = profile(source, args, upto=i)
    cond = _condition(prof, rng, fullgraph)
    block = ast.If(test=ast.parse(cond, mode="eval").body, body=body[i:j], orelse=[])
    return _unparse(tree, fn, body[:i] + [block] + body[j:], ret)


def apply(name, source, args, rng, fullgraph=False):
    """One mutation by name; ``None`` when it finds nothing to rewrite."""
    return {"resolve": resolve, "recover": recover, "functionalize": functionalize,
            "emi": emi}[name](source, args, rng, fullgraph=fullgraph)


def _signature(outs):
    return [(tuple(t.shape), t.dtype) for t in outs]


def apply_plan(seed, plan, fullgraph=False):
    """The seed's source after the mutation steps ``plan`` ([(name, rng seed)], in order), and
    the steps that applied. A step that finds nothing to rewrite, or whose result does not run
    eagerly with the seed's output shapes and dtypes, is skipped."""
    import numpy as np
    import torch
    from fpx.probe.program import finite, load
    source = seed.source()
    with torch.no_grad():
        want = _signature(load(source)(*seed.args()))
        applied = []
        for name, s in plan:
            try:
                new = apply(name, source, seed.args(), np.random.default_rng(s), fullgraph)
                if new is None:
                    continue
                outs = load(new)(*seed.args())
            except Exception:       # a rewrite this program does not allow: skip the step
                continue
            if _signature(outs) == want and all(finite(t) for t in outs):
                source = new
                applied.append((name, s))
    return source, applied
