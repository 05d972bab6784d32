"""fpx.probe: programs per minute on inductor, and fixed-tolerance oracles vs fpx on the same runs.

1. ``fpx.probe.fuzz("inductor", time=...)``: generate + mutate + compile + check, one sandbox,
   one torch thread, an empty inductor cache (TorchProbe's setup: 8 graphs in 111 s, 4.3/min).
   On the same compiled outputs, three oracles: fpx.classify (a bug only outside the seed's
   sound round-off bound), TorchProbe's ``np.allclose(rtol=1e-2, atol=1e-4)`` (NaN/Inf
   skipped) and ``torch.testing.assert_close``'s defaults. Inductor is taken as correct here,
   so a fixed-tolerance mismatch where fpx says round-off is a false alarm (and an fpx ``wrong``
   would be listed for inspection). A quarter of the programs get one long axis (2048) for
   long reductions.
2. A planted miscompilation (``approx_exp``: ``exp`` computed as ``(1 + x/1024)^1024``, relative
   error ~x^2/2048) on the same kind of programs: how many of the programs fpx finds wrong each
   fixed tolerance misses.

3. (full run only) A directed long reduction: float32 row sums of 65,536 terms that cancel
   (each row holds values and their negations, shuffled): eager and inductor sum in different
   orders and differ by ~5e-3 where the sums are ~1e-4: both fixed tolerances flag it; fpx
   says inconclusive (its rigorous bound is far wider than such a sum), never bug.

Prints a table and ends with one JSON line. ``--quick``: under a minute (15 s of inductor
fuzzing, 6 planted programs).
"""
from __future__ import annotations

import argparse
import json
import time


def approx_exp(gm, example_inputs):
    """A torch.compile backend with a planted bug: exp (and sigmoid's exp) approximated."""
    import torch

    def aexp(x, *a, **k):
        y = 1.0 + x.float() / 1024.0
        for _ in range(10):
            y = y * y
        return y.to(x.dtype)
    subst = {torch.exp: aexp, "exp": aexp,
             torch.sigmoid: lambda x: (1.0 / (1.0 + aexp(-x.float()))).to(x.dtype)}

    class Run(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            f = subst.get(target)
            return f(*args) if f else super().call_function(target, args, kwargs)

        def call_method(self, target, args, kwargs):
            f = subst.get(target)
            return f(*args) if f else super().call_method(target, args, kwargs)
    return lambda *a: Run(gm).run(*a)


def oracle_counts(report):
    """Per oracle: mismatches among the programs all three judged."""
    judged = [r for r in report.records if r[1] in ("ok", "inconclusive", "wrong") and r[3]]
    return {
        "judged": len(judged),
        "fpx_wrong": sum(r[1] == "wrong" for r in judged),
        "fpx_inconclusive": sum(r[1] == "inconclusive" for r in judged),
        "torchprobe_mismatch": sum(not r[3]["torchprobe"] for r in judged),
        "torch_testing_mismatch": sum(not r[3]["torch.testing"] for r in judged),
        "torchprobe_mismatch_fpx_roundoff": sum(not r[3]["torchprobe"] and r[1] != "wrong"
                                                for r in judged),
        "torch_testing_mismatch_fpx_roundoff": sum(not r[3]["torch.testing"] and r[1] != "wrong"
                                                   for r in judged),
        "fpx_wrong_torchprobe_match": sum(r[1] == "wrong" and r[3]["torchprobe"]
                                          for r in judged),
        "fpx_wrong_torch_testing_match": sum(r[1] == "wrong" and r[3]["torch.testing"]
                                             for r in judged),
    }


def long_sum_job():
    import numpy as np
    import torch
    rng = np.random.default_rng(0)
    h = rng.standard_normal((8, 32768)) * 10
    x = np.concatenate([h, -h], axis=1)
    for row in x:
        rng.shuffle(row)
    src = "def program(x0):\n    return (torch.sum(x0, dim=1),)\n"
    return fpx_job(src, [torch.from_numpy(x.astype(np.float32))])


def fpx_job(src, inputs):
    from fpx.probe import Job
    return Job(src, src, inputs, ("name", "inductor"), timeout=300)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="under a minute")
    ap.add_argument("--seconds", type=float, default=None, help="inductor fuzzing time")
    args = ap.parse_args(argv)
    import fpx.probe
    from fpx.probe import Config, Sandbox
    secs = args.seconds or (15.0 if args.quick else 300.0)
    import tempfile
    cache = tempfile.TemporaryDirectory(prefix="fpx-probe-inductor-")
    sb = Sandbox(env={"TORCHINDUCTOR_CACHE_DIR": cache.name})     # cold compiles, as a fresh run
    try:
        t0 = time.perf_counter()         # start the child, and inductor's one-off cold start
        sb.run(fpx_job("def program(x):\n    return (torch.exp(x) + 1,)\n",
                       [__import__("torch").ones(3)]))
        start_s = time.perf_counter() - t0
        cfg = Config(long_p=0.25, long_dim=2048, max_numel=16384)
        ind = fpx.probe.fuzz("inductor", time=secs, seed=0, minimize_budget=0, config=cfg,
                             timeout=300, sandbox=sb)
        n_planted = 6 if args.quick else 40
        pcfg = Config(ops=("unary", "binary", "reduce", "matmul", "softmax", "norm"))
        planted = fpx.probe.fuzz(approx_exp, programs=n_planted, seed=7, minimize_budget=0,
                                 config=pcfg, timeout=120, sandbox=sb)
        long_sum = None if args.quick else sb.run(long_sum_job())
    finally:
        sb.close()
        cache.cleanup()
    rate = 60.0 * ind.programs / ind.seconds
    oi, op = oracle_counts(ind), oracle_counts(planted)
    print(ind.table())
    print()
    print(f"inductor: {ind.programs} programs in {ind.seconds:.1f} s = {rate:.2f}/min "
          f"(sandbox and inductor start {start_s:.1f} s not counted; TorchProbe's setup: 4.3/min)")
    print(f"{'oracle':<34}{'inductor: mismatches':>22}{'of which fpx round-off':>24}")
    print(f"{'fpx.classify (bug)':<34}{oi['fpx_wrong']:>22}{'-':>24}")
    print(f"{'np.allclose(1e-2, 1e-4)':<34}{oi['torchprobe_mismatch']:>22}"
          f"{oi['torchprobe_mismatch_fpx_roundoff']:>24}")
    print(f"{'torch.testing defaults':<34}{oi['torch_testing_mismatch']:>22}"
          f"{oi['torch_testing_mismatch_fpx_roundoff']:>24}")
    print(f"planted approx-exp: {planted.programs} programs, fpx finds {op['fpx_wrong']} wrong; "
          f"allclose(1e-2, 1e-4) passes {op['fpx_wrong_torchprobe_match']} of them, "
          f"torch.testing {op['fpx_wrong_torch_testing_match']}")
    if long_sum is not None:
        print(f"long cancelling sums (8 rows x 65,536, float32), inductor vs eager: fpx "
              f"{long_sum.status}, max |difference| {long_sum.numbers.get('max_observed', 0):.3g}; "
              f"fixed tolerances {long_sum.allclose}")
    for k, status, _, tol in ind.records:
        if status == "wrong":
            print(f"  inspect: inductor program {k} judged wrong")
        elif tol and not all(tol.values()):
            print(f"  program {k}: fpx {status}; fixed tolerances {tol}")
    print(json.dumps({
        "benchmark": "probe", "quick": args.quick, "inductor_seconds": round(ind.seconds, 1),
        "inductor_programs": ind.programs, "inductor_programs_per_min": round(rate, 2),
        "torchprobe_programs_per_min": round(8 / 111 * 60, 2),
        "inductor_statuses": dict(ind.counts), "inductor_oracles": oi,
        "planted_programs": planted.programs, "planted_oracles": op,
        "long_sum": None if long_sum is None else {
            "fpx": long_sum.status, "max_difference": long_sum.numbers.get("max_observed"),
            **{k: ("match" if v else "mismatch") for k, v in long_sum.allclose.items()}}}))


if __name__ == "__main__":
    main()
