"""Programs as data: a seed's SSA statements, its inputs, its source, and running it.

A :class:`Seed` is TorchProbe's straight-line program: ``def program(x0, x1, ...)`` whose body
assigns each value once (``v3 = torch.matmul(v1, x2)``) and returns a tuple of the values
nothing else reads. Its source is what the mutations rewrite and ``torch.compile`` compiles;
its inputs are concrete tensors (the input search made the eager run finite).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

NAME = "program"


@dataclass
class Seed:
    """A straight-line program: ``inputs`` (name -> tensor), ``stmts`` [(name, expression)],
    ``outputs`` (names returned, in order)."""
    inputs: dict
    stmts: list
    outputs: list
    meta: dict = field(default_factory=dict)

    def source(self) -> str:
        lines = [f"def {NAME}({', '.join(self.inputs)}):"]
        lines += [f"    {n} = {e}" for n, e in self.stmts]
        lines.append(f"    return ({''.join(o + ', ' for o in self.outputs)})")
        return "\n".join(lines) + "\n"

    def args(self):
        """Fresh copies of the inputs (a run may mutate its arguments)."""
        return [t.clone() for t in self.inputs.values()]

    def used(self):
        """The seed with dead statements and unused inputs dropped (outputs kept)."""
        live = set(self.outputs)
        keep = []
        for n, e in reversed(self.stmts):
            if n in live:
                keep.append((n, e))
                live |= names_in(e)
        keep.reverse()
        inputs = {k: v for k, v in self.inputs.items() if k in live}
        return Seed(inputs, keep, list(self.outputs), dict(self.meta))


def names_in(expr: str) -> set:
    return {n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name)}


def load(source: str, name: str = NAME):
    """The function ``name`` defined by ``source`` (executed with ``torch`` in scope)."""
    import torch
    ns = {"torch": torch}
    exec(compile(source, "<fpx.probe program>", "exec"), ns)
    return ns[name]


def profile(source: str, args, upto: int | None = None) -> dict:
    """Run the program's first ``upto`` top-level statements (all: ``None``) on ``args`` and
    return its local tensors at that point (the tensors themselves: views keep their storage,
    which the mutations inspect)."""
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == NAME)
    body = fn.body if upto is None else fn.body[:upto]
    body = [s for s in body if not isinstance(s, ast.Return)]
    fn.body = body + [ast.parse("return dict(locals())").body[0]]
    ast.fix_missing_locations(tree)
    import torch
    loc = load(ast.unparse(tree))(*args)
    return {k: v for k, v in loc.items() if isinstance(v, torch.Tensor)}


def finite(t) -> bool:
    import torch
    return not t.is_floating_point() or bool(torch.isfinite(t).all())


def tensor_literal(t) -> str:
    """Source for an exact copy of the tensor ``t`` (bits in base64), used by repro scripts."""
    import base64
    import torch
    bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
            torch.float64: torch.int64}.get(t.dtype)
    raw = t.contiguous().view(bits) if bits is not None else t.contiguous()
    arr = raw.numpy()
    data = base64.b64encode(arr.tobytes()).decode()
    return (f"_tensor({data!r}, {str(arr.dtype)!r}, {str(t.dtype).replace('torch.', '')!r}, "
            f"{tuple(t.shape)!r})")


TENSOR_HELPER = '''def _tensor(data, raw, dtype, shape):
    import base64
    a = np.frombuffer(base64.b64decode(data), dtype=raw).copy().reshape(shape)
    return torch.from_numpy(a).view(getattr(torch, dtype))
'''

