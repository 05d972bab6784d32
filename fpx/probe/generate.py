"""Seed programs: random valid torch graphs emitted as straight-line SSA source (NNSmith's role).

:func:`generate` grows a graph op by op from :data:`fpx.probe.ops.OPS`, each op checking the
shapes and dtypes of the operands it picks, then searches inputs on which the eager run is
finite in every value (NaN/Inf would make the comparison meaningless: TorchProbe skips such
outputs, this generator does not produce them).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fpx.probe import ops
from fpx.probe.program import Seed, finite, names_in, profile


@dataclass
class Config:
    """Knobs of the seed generator. ``ops``: op names to draw from (default: all of
    :data:`fpx.probe.ops.OPS`); ``dtypes``: the programs' input formats and their weights;
    ``max_dim``: the largest input dimension; ``long_dim``: the length of the long axis a
    program gets with probability ``long_p`` (long reductions are where fixed tolerances
    raise false alarms)."""
    min_stmts: int = 3
    max_stmts: int = 10
    max_dim: int = 6
    max_numel: int = 4096
    max_inputs: int = 3
    dtypes: dict = field(default_factory=lambda: {"float32": 0.6, "float16": 0.2, "bfloat16": 0.2})
    ops: tuple = ()
    long_dim: int = 2048
    long_p: float = 0.0
    input_tries: int = 6


@dataclass
class Value:
    name: str
    shape: tuple
    dtype: str

    @property
    def ndim(self):
        return len(self.shape)


class Builder:
    """The state ops see: the values defined so far, a random generator, the config."""

    def __init__(self, rng, cfg: Config):
        self.rng, self.cfg = rng, cfg
        self.values: list[Value] = []
        self.inputs: list[tuple[Value, float]] = []       # (value, scale)
        self.stmts: list[tuple[str, str]] = []
        self.read: set = set()

    def new_input(self, shape, dtype, scale=1.0) -> Value:
        v = Value(f"x{len(self.inputs)}", tuple(int(s) for s in shape), dtype)
        self.inputs.append((v, scale))
        self.values.append(v)
        return v

    def floats(self):
        return [v for v in self.values if v.dtype != "bool"]

    def pick(self, min_rank=0, max_rank=8) -> Value | None:
        """A floating value of the given rank range, later values more likely (deep chains)."""
        cand = [v for v in self.floats() if min_rank <= v.ndim <= max_rank]
        if not cand:
            return None
        w = np.arange(1, len(cand) + 1, dtype=float) ** 1.5
        return cand[self.rng.choice(len(cand), p=w / w.sum())]

    def pick_broadcastable(self, shape) -> Value | None:
        cand = [v for v in self.floats() if ops.broadcast(v.shape, shape) is not None]
        return cand[self.rng.integers(len(cand))] if cand else None


def _shape(b: Builder, rank: int, long: bool):
    dims = [int(b.rng.integers(1, b.cfg.max_dim + 1)) for _ in range(rank)]
    if long and rank:
        dims[int(b.rng.integers(rank))] = b.cfg.long_dim
    return tuple(dims)


def _draw_graph(rng, cfg: Config):
    b = Builder(rng, cfg)
    names = list(cfg.ops or ops.OPS)
    w = np.array([ops.OPS[n][1] for n in names], dtype=float)
    dts = list(cfg.dtypes)
    p = np.array([cfg.dtypes[d] for d in dts], dtype=float)
    dtype = dts[rng.choice(len(dts), p=p / p.sum())]
    long = rng.random() < cfg.long_p
    for i in range(int(rng.integers(1, cfg.max_inputs + 1))):
        b.new_input(_shape(b, int(rng.integers(1, 5)), long and i == 0), dtype)
    n = int(rng.integers(cfg.min_stmts, cfg.max_stmts + 1))
    tries = 0
    while len(b.stmts) < n and tries < 20 * n:
        tries += 1
        op = names[rng.choice(len(names), p=w / w.sum())]
        before = len(b.inputs)
        out = ops.OPS[op][0](b)
        if out is None or ops.numel(out[1]) > cfg.max_numel or 0 in out[1]:
            del b.inputs[before:]                 # an op that gave up keeps no new input
            b.values = [v for v in b.values if v.name[0] != "x" or
                        int(v.name[1:]) < len(b.inputs)]
            continue
        expr, shape, dtype_ = out
        v = Value(f"v{len(b.stmts)}", tuple(int(s) for s in shape), dtype_)
        b.stmts.append((v.name, expr))
        b.values.append(v)
    return b


def _outputs(b: Builder):
    read = set()
    for _, e in b.stmts:
        read |= names_in(e)
    dtypes = {v.name: v.dtype for v in b.values}
    outs = [n for n, _ in b.stmts if n not in read and dtypes[n] != "bool"]
    if b.stmts and b.stmts[-1][0] not in outs and dtypes[b.stmts[-1][0]] != "bool":
        outs.append(b.stmts[-1][0])
    return outs


def _inputs(b: Builder, rng, scale: float):
    import torch
    out = {}
    for v, s in b.inputs:
        x = rng.standard_normal(v.shape) * (s * scale)
        out[v.name] = torch.from_numpy(x.astype(np.float32)).to(getattr(torch, v.dtype))
    return out


def generate(seed: int, cfg: Config | None = None) -> Seed:
    """A random valid program and inputs on which its eager run is finite everywhere; the
    same ``seed`` gives the same program. Draws again when no input scale works."""
    import torch
    cfg = cfg or Config()
    rng = np.random.default_rng(seed)
    for attempt in range(50):
        b = _draw_graph(rng, cfg)
        outs = _outputs(b)
        if not outs:
            continue
        prog = Seed({v.name: None for v, _ in b.inputs}, b.stmts, outs,
                    {"seed": seed, "attempt": attempt}).used()
        for scale in [1.0, 0.5, 2.0, 0.25, 1.0, 0.1][:cfg.input_tries]:
            inputs = _inputs(b, rng, scale)
            prog.inputs = {k: inputs[k] for k in prog.inputs}
            try:
                with torch.no_grad():
                    vals = profile(prog.source(), prog.args())
            except Exception:          # an op the shape rules let through but torch refuses
                break
            if all(finite(t) for t in vals.values()):
                prog.meta["scale"] = scale
                return prog
    raise RuntimeError(f"fpx.probe.generate: no finite program found for seed {seed}")
