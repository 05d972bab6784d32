"""fpx.probe: planted miscompilations are found and minimized, equivalent backends are not.

The backends below are torch.compile backends defined here (module level, so the sandboxed
child imports them by module and name). Three plant bugs: a subtraction's operands swapped, exp
replaced by a wrong approximation (a relative error of ~1e-4..1e-3, under TorchProbe's
tolerance), the restore of a view dropped. Two are equivalent rewrites: sums in another
order, and formulas that compute the same reals. The mutations' own exactness is tested
directly (the mutated program's eager run lies in the seed's bound).
"""
from __future__ import annotations

import ast
import operator
import os
import re
import runpy
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fpx                                                     # noqa: E402
from fpx.probe import Config, MUTATIONS, apply_plan, fuzz, generate, load   # noqa: E402
from fpx.probe import Sandbox, mutate                          # noqa: E402


# ----------------------------------------------------------------------------- backends
class _Run(torch.fx.Interpreter):
    """Runs the dynamo graph with some calls substituted (``subst``: target -> function)."""
    subst: dict = {}

    def call_function(self, target, args, kwargs):
        f = self.subst.get(target)
        return f(*args, **kwargs) if f else super().call_function(target, args, kwargs)

    def call_method(self, target, args, kwargs):
        f = self.subst.get(target)
        return f(*args, **kwargs) if f else super().call_method(target, args, kwargs)


def _interpreting(cls):
    def backend(gm, example_inputs):
        return lambda *a: cls(gm).run(*a)
    return backend


def swap_sub(gm, example_inputs):
    """Planted: ``a - b`` computed as ``b - a`` (an FX graph rewrite)."""
    for n in gm.graph.nodes:
        if n.target in (operator.sub, torch.sub, "sub") and len(n.args) == 2:
            n.args = (n.args[1], n.args[0])
    gm.recompile()
    return gm.forward


def _approx_exp(x, *a, **k):
    y = 1.0 + x.float() / 1024.0
    for _ in range(10):                                      # (1 + x/1024)^1024
        y = y * y
    return y.to(x.dtype)


class _Approx(_Run):
    subst = {torch.exp: _approx_exp, "exp": _approx_exp,
             torch.sigmoid: lambda x: (1.0 / (1.0 + _approx_exp(-x.float()))).to(x.dtype)}


approx_exp = _interpreting(_Approx)
approx_exp.__qualname__ = "approx_exp"


def drop_view_restore(gm, example_inputs):
    """Planted: an in-place ``copy_`` into a view (``t[i].copy_(backup)``) is dropped."""
    for n in list(gm.graph.nodes):
        if n.op == "call_method" and n.target == "copy_":
            src = n.args[0]
            if getattr(src, "target", None) in (operator.getitem, torch.select, "select"):
                n.replace_all_uses_with(src)
                gm.graph.erase_node(n)
    gm.recompile()
    return gm.forward


def _flip_sum(x, dim=None, keepdim=False, **kw):
    if dim is None:
        return torch.sum(torch.flip(x.reshape(-1), [0]), **kw)
    d = [dim] if isinstance(dim, int) else list(dim)
    return torch.sum(torch.flip(x, d), dim, keepdim=keepdim, **kw)


def _softmax(x, dim, *a, **k):
    z = x.float()
    e = torch.exp(z - torch.amax(z, dim, keepdim=True))
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


class _Equivalent(_Run):
    subst = {torch.sum: _flip_sum, "sum": _flip_sum,
             operator.sub: lambda a, b: a + (-b) if isinstance(b, torch.Tensor) else a - b,
             torch.sigmoid: lambda x: (1.0 / (1.0 + torch.exp(-x.float()))).to(x.dtype),
             torch.softmax: _softmax,
             torch.matmul: lambda a, b: torch.matmul(a.double(), b.double()).to(a.dtype)}


equivalent = _interpreting(_Equivalent)
equivalent.__qualname__ = "equivalent"


def raises_on_matmul(gm, example_inputs):
    if any(n.target is torch.matmul for n in gm.graph.nodes):
        raise NotImplementedError("planted: no matmul here")
    return gm.forward


def aborts_on_flip(gm, example_inputs):
    if any(n.target is torch.flip for n in gm.graph.nodes):
        os.abort()                                       # a hard crash of the compiling process
    return gm.forward


def hangs(gm, example_inputs):
    time.sleep(3600)


SMALL = Config(max_stmts=6)


@pytest.fixture(scope="module")
def sandbox():
    """One child process for the module's runs (each fuzz call would start its own)."""
    sb = Sandbox()
    yield sb
    sb.close()


# ----------------------------------------------------------------------------- generator
def test_seeds_are_valid_deterministic_ssa_and_cover_the_op_library():
    seen = set()
    for s in range(30):
        p, q = generate(s), generate(s)
        assert p.source() == q.source()
        assert all(torch.equal(a, b) for a, b in zip(p.inputs.values(), q.inputs.values()))
        tree = ast.parse(p.source())
        targets = [t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets]
        assert len(targets) == len(set(targets)) == len(p.stmts)        # single assignment
        outs = load(p.source())(*p.args())
        assert all(torch.isfinite(o).all() for o in outs)
        assert {str(t.dtype) for t in p.inputs.values()} <= {
            "torch.float32", "torch.float16", "torch.bfloat16"}
        seen |= {e.split("(")[0].split(".")[-1] for _, e in p.stmts}
        seen |= {"slice" for _, e in p.stmts if "[" in e.split("(")[0]}
    for op in ["matmul", "linear", "softmax", "cat", "where", "sum", "reshape", "permute",
               "slice", "layer_norm"]:
        assert any(op in s for s in seen), op


def test_mutations_are_exact_and_compose():
    hits = dict.fromkeys(MUTATIONS, 0)
    for s in range(8):
        seed = generate(s, SMALL)
        rng = np.random.default_rng(s)
        plan = [(str(m), int(rng.integers(2 ** 31))) for m in rng.permutation(MUTATIONS)]
        src, applied = apply_plan(seed, plan)
        for m, _ in applied:
            hits[m] += 1
        y = load(src)(*seed.args())
        v = fpx.classify(load(seed.source()), y, *seed.args())
        if v.kind == "bug":       # fpx misses eager torch itself (the sandbox: "oracle")
            y0 = load(seed.source())(*seed.args())
            assert fpx.classify(load(seed.source()), y0, *seed.args()).kind == "bug", src
        else:
            assert v.kind == "roundoff", (src, v.report())
    assert all(h >= 4 for h in hits.values()), hits
    src, _ = apply_plan(generate(1, SMALL), [("resolve", 3), ("recover", 4),
                                             ("functionalize", 5), ("emi", 6)])
    assert "for " in src and "def _f" in src and "if " in src and "_backup" in src


def test_each_mutation_rewrites_what_the_paper_says():
    seed = generate(5, SMALL)
    src = seed.source()
    r = mutate.resolve(src, seed.args(), np.random.default_rng(0))
    assert "torch.stack(" in r and "torch.select(" in r
    m = mutate.recover(src, seed.args(), np.random.default_rng(1))
    assert "_backup0 = " in m and ".clone()" in m
    f = mutate.functionalize(src, seed.args(), np.random.default_rng(2))
    assert "def _f0(" in f and "_f0(" in f.split("def _f0(")[1]
    e = mutate.emi(src, seed.args(), np.random.default_rng(3))
    assert "\n    if " in e


def test_emi_under_fullgraph_uses_static_conditions_only():
    for s in range(12):
        seed = generate(s, SMALL)
        e = mutate.emi(seed.source(), seed.args(), np.random.default_rng(s), fullgraph=True)
        cond = next(n.test for n in ast.walk(ast.parse(e)) if isinstance(n, ast.If))
        text = ast.unparse(cond)
        assert ".max()" not in text and ".min()" not in text and "[" not in text.replace(
            ".shape[", ""), text


# ----------------------------------------------------------------------------- planted bugs
def _run_repro(path):
    return subprocess.run([sys.executable, path], capture_output=True, text=True,
                          timeout=300).returncode


@pytest.mark.slow      # (10-25 s: the default run keeps its siblings)
def test_swapped_subtraction_is_found_minimized_and_reproduced(tmp_path, sandbox):
    rep = fuzz(swap_sub, programs=4, seed=1, out=str(tmp_path), config=SMALL,
               minimize_budget=20, timeout=60, sandbox=sandbox)
    assert rep.programs == 4
    wrong = [f for f in rep.findings if f.kind == "wrong"]
    assert wrong and all(f.verdict == "bug" for f in wrong)
    small = min(wrong, key=lambda f: len(f.source))
    body = small.source.splitlines()[1:-1]
    assert len(body) <= 3 and any("-" in line or "sub" in line for line in body), small.source
    assert _run_repro(small.path) == 1
    text = open(small.path).read()
    assert "fpx.classify verdict: BUG" in text and "import_module('test_probe')" in text


def test_wrong_approximation_is_found_even_under_fixed_tolerances(sandbox):
    cfg = Config(max_stmts=5, ops=("unary", "binary", "softmax", "reduce"))
    rep = fuzz(approx_exp, programs=6, seed=2, config=cfg, minimize_budget=0, timeout=60,
               sandbox=sandbox)
    assert any(f.kind == "wrong" for f in rep.findings), rep.table()
    # exp's error (~x^2/2048) is far under TorchProbe's rtol 1e-2: fpx sees what it misses
    missed = [r for r in rep.records if r[1] == "wrong" and r[3].get("torchprobe")]
    assert missed, rep.records


def test_dropped_view_restore_is_found_and_minimized(tmp_path, sandbox):
    rep = fuzz(drop_view_restore, programs=4, seed=4, mutations=("recover",), config=SMALL,
               out=str(tmp_path), minimize_budget=30, timeout=60, sandbox=sandbox)
    wrong = [f for f in rep.findings if f.kind == "wrong"]
    assert wrong, rep.table()
    assert all(".copy_(" in f.source and f.mutations for f in wrong)
    assert "fpx.classify verdict: BUG" in open(wrong[0].path).read()


# ----------------------------------------------------------------------------- no false alarms
@pytest.mark.parametrize("backend", [equivalent, "aot_eager"], ids=["equivalent", "aot_eager"])
def test_equivalent_backends_give_no_findings(backend, sandbox):
    rep = fuzz(backend, programs=8, seed=7, minimize_budget=0, timeout=60, sandbox=sandbox)
    assert rep.programs == 8 and not rep.findings, rep.table()
    assert rep.counts["ok"] >= 5 and rep.counts["invalid"] == rep.counts["oracle"] == 0


# ----------------------------------------------------------------------------- crashes and hangs
@pytest.mark.slow      # (10-25 s: the default run keeps its siblings)
def test_crash_hard_crash_and_hang_do_not_stop_the_fuzzer(tmp_path, sandbox):
    cfg = Config(max_stmts=4, ops=("unary", "matmul", "flip"))
    rep = fuzz(raises_on_matmul, programs=3, seed=1, config=cfg, mutations=(), out=str(tmp_path),
               minimize_budget=8, timeout=60, sandbox=sandbox)
    crash = [f for f in rep.findings if f.kind == "crash"]
    assert crash and crash[0].error_type == "NotImplementedError"
    assert "torch.matmul" in crash[0].source and len(crash[0].source.splitlines()) <= 3
    assert rep.duplicates + len(crash) == rep.counts["crash"]        # one kept per signature
    assert runpy.run_path(crash[0].path)["main"]() == 1                  # in this process
    torch._dynamo.reset()

    rep = fuzz(aborts_on_flip, programs=2, seed=1, config=cfg, mutations=(), minimize_budget=0,
               timeout=60, sandbox=sandbox)
    assert any(f.error_type == "Died:SIGABRT" for f in rep.findings), rep.table()
    assert rep.programs == 2

    rep = fuzz(hangs, programs=2, seed=0, mutations=(), minimize_budget=0, timeout=3,
               out=str(tmp_path / "h"), dedup=False)
    assert [f.kind for f in rep.findings] == ["hang", "hang"]
    assert "signal.alarm(7)" in open(rep.findings[0].path).read()


def test_executor_gives_the_serial_results(sandbox):
    from concurrent.futures import ThreadPoolExecutor
    a = fuzz(swap_sub, programs=4, seed=1, config=SMALL, minimize_budget=0, timeout=60,
             sandbox=sandbox)
    with ThreadPoolExecutor(2) as ex:
        b = fuzz(swap_sub, programs=4, seed=1, config=SMALL, minimize_budget=0, timeout=60,
                 executor=ex)
    assert [r[:3] for r in a.records] == [r[:3] for r in b.records]
    assert a.counts["wrong"] >= 1


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="exactly one"):
        fuzz("eager")
    with pytest.raises(ValueError, match="exactly one"):
        fuzz("eager", programs=1, time=1)
    with pytest.raises(ValueError, match="unknown mutations"):
        fuzz("eager", programs=1, mutations=("nope",))

    def local_backend(gm, ex):
        return gm.forward
    with pytest.raises(ValueError, match="importable"):
        fuzz(local_backend, programs=1)


def test_cli_probe(tmp_path, capsys):
    from fpx.cli import main, parse_budget
    assert parse_budget("10m") == 600 and parse_budget("90") == 90 and parse_budget("1.5h") == 5400
    rc = main(["probe", "--programs", "1", "--backend", "test_probe:swap_sub", "--seed", "3",
               "--quiet", "--minimize", "0", "--mutations", "none", "--out", str(tmp_path)])
    out = capsys.readouterr().out                      # program 0 has ``2.0 - v3``
    assert rc == 1 and "1 programs" in out and re.search(r"^wrong +1$", out, re.M), out
    assert os.listdir(tmp_path) == ["wrong_00000.py"]
    assert main(["probe", "--programs", "1", "--mutations", "nope", "--quiet"]) == 2
    assert "unknown mutations" in capsys.readouterr().err


def test_inductor_smoke(sandbox):
    rep = fuzz("inductor", programs=1, seed=0, mutations=(), minimize_budget=0, timeout=300,
               sandbox=sandbox)
    assert rep.programs == 1 and not rep.findings, rep.table()


@pytest.mark.slow
def test_inductor_no_false_alarms_where_fixed_tolerances_raise_some(sandbox):
    """benchmarks/probe.py's programs: on inductor fpx calls none wrong; torch.testing's
    defaults flag some of the same outputs (fused half-precision chains rounded once)."""
    from fpx.probe import Config
    cfg = Config(long_p=0.25, long_dim=2048, max_numel=16384)
    rep = fuzz("inductor", programs=49, seed=0, minimize_budget=0, config=cfg, timeout=300,
               sandbox=sandbox)
    judged = [r for r in rep.records if r[1] in ("ok", "inconclusive", "wrong") and r[3]]
    assert len(judged) >= 40 and not rep.findings, rep.table()
    false_tt = sum(not r[3]["torch.testing"] for r in judged)
    false_tp = sum(not r[3]["torchprobe"] for r in judged)
    print(f"inductor, {len(judged)} programs: fpx 0 wrong; torch.testing defaults flag "
          f"{false_tt}, allclose(1e-2, 1e-4) {false_tp}")
    assert false_tt >= 1
