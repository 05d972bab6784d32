"""``fpx.probe.fuzz``: the fuzzing loop -- generate, mutate, check in a sandbox, minimize, save.

Each program ``k`` of a run is drawn from ``(seed, k)`` alone, so a run is reproducible and a
finding names the program that showed it. Checks run in sandboxed child processes
(:mod:`fpx.probe.sandbox`), serially or on any ``concurrent.futures`` executor (each worker
thread or process keeps a sandbox of its own); minimization and repro scripts happen in the
calling process.
"""
from __future__ import annotations

import collections
import os
import re
import time as _time
from dataclasses import dataclass, field

import numpy as np

from fpx.probe import mutate, repro
from fpx.probe.generate import Config, generate
from fpx.probe.minimize import Case, minimize
from fpx.probe.sandbox import Job, Sandbox, backend_spec, run_job

FINDINGS = ("crash", "hang", "wrong")


@dataclass
class Finding:
    """A crash, hang or wrong result. ``verdict``: fpx.classify's kind for a wrong result
    (``"bug"``), ``None`` otherwise; ``source``: the minimized program compiled; ``path``: its
    repro script (``None`` without ``out=``); ``report``: the verdict's report or the error."""
    kind: str
    verdict: str | None
    source: str
    path: str | None
    program: int
    mutations: list
    error: str = ""
    error_type: str = ""
    report: str = ""
    numbers: dict = field(default_factory=dict)
    seed_source: str = ""
    original_source: str = ""
    inputs: list = field(default_factory=list, repr=False)


@dataclass
class Report:
    """What a run did: ``programs`` checked, ``findings``, ``counts`` per status (see
    :data:`fpx.probe.sandbox.STATUSES`), ``records`` one ``(program, status, verdict,
    fixed-tolerance answers)`` per program, ``errors`` the messages of unsupported/oracle/invalid
    cases (what fpx could not judge), ``duplicates`` findings with an earlier one's signature."""
    backend: str
    programs: int = 0
    findings: list = field(default_factory=list)
    counts: collections.Counter = field(default_factory=collections.Counter)
    records: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    duplicates: int = 0
    seconds: float = 0.0

    def table(self) -> str:
        """A summary table: counts per status, then one line per finding."""
        rate = 60.0 * self.programs / self.seconds if self.seconds else float("nan")
        lines = [f"fpx probe: backend {self.backend}: {self.programs} programs in "
                 f"{self.seconds:.1f} s ({rate:.1f}/min)", "",
                 f"{'status':<14}{'programs':>9}"]
        for s in ("ok", "inconclusive", "wrong", "crash", "hang", "unsupported", "invalid",
                  "oracle"):
            lines.append(f"{s:<14}{self.counts.get(s, 0):>9}")
        if self.duplicates:
            lines.append(f"(of the findings, {self.duplicates} repeat an earlier one's signature)")
        if self.findings:
            lines += ["", f"{'kind':<7}{'program':>8}  {'mutations':<28}what"]
            for f in self.findings:
                what = f.path or (f.error.splitlines()[0][:60] if f.error else f.verdict or "")
                muts = ",".join(m for m, _ in f.mutations) or "-"
                lines.append(f"{f.kind:<7}{f.program:>8}  {muts:<28}{what}")
        return "\n".join(lines)


def _program_seed(seed: int, k: int) -> int:
    return int(np.random.SeedSequence([seed, k]).generate_state(1)[0])


def make_case(seed: int, k: int, mutations, max_steps: int, cfg: Config) -> Case:
    """Program ``k`` of the run with seed ``seed``, and its mutation plan."""
    s = _program_seed(seed, k)
    rng = np.random.default_rng(s)
    n = int(rng.integers(0, max_steps + 1)) if mutations else 0
    plan = [(str(mutations[rng.integers(len(mutations))]), int(rng.integers(2 ** 31)))
            for _ in range(n)]
    return Case(generate(s, cfg), plan)


def _signature(kind, out):
    if kind == "wrong":
        return None
    msg = out.error.splitlines()[0] if out.error else ""
    return (kind, out.error_type, re.sub(r"\d+", "N", msg)[:120])


def _run_case(case, spec, opts):
    source, applied = mutate.apply_plan(case.seed, case.plan, opts["fullgraph"])
    job = Job(case.seed.source(), source, list(case.seed.inputs.values()), spec, **opts)
    return source, applied, job


def fuzz(backend, *, programs: int | None = None, time: float | None = None, seed: int = 0,
         mutations=mutate.MUTATIONS, max_steps: int = 4, out: str | None = None,
         executor=None, fullgraph: bool = False, dynamic: bool | None = None,
         timeout: float = 120.0, minimize_budget: int = 40, dedup: bool = True,
         config: Config | None = None, policy=None, progress: bool = False,
         sandbox: Sandbox | None = None) -> Report:
    """Fuzz ``torch.compile(..., backend=backend)`` on ``programs`` programs or for ``time``
    seconds (exactly one of the two). ``backend``: a name (``"inductor"``, ``"aot_eager"``,
    ``"eager"``) or a module-level callable. ``mutations``: the mutation names to draw from
    (``()`` for seed programs only), up to ``max_steps`` per program. ``out``: a folder for
    the repro scripts. ``executor``: any ``concurrent.futures.Executor`` (threads or
    processes; Dask's ``client.get_executor()``); ``None`` checks serially in one sandbox.
    ``timeout``: seconds before a case is a hang. ``minimize_budget``: checks spent minimizing
    each finding (0: no minimization). ``dedup``: a crash or hang whose exception type and
    message repeat an earlier finding's is counted, not kept. ``sandbox``: a
    :class:`~fpx.probe.sandbox.Sandbox` to check in (and minimize with), kept open for the
    caller to reuse; ``None``: a fresh one, closed at the end."""
    if (programs is None) == (time is None):
        raise ValueError("fpx.probe.fuzz: give exactly one of programs= or time=")
    if programs is not None and programs < 0 or time is not None and time < 0:
        raise ValueError("fpx.probe.fuzz: programs= and time= must not be negative")
    unknown = set(mutations) - set(mutate.MUTATIONS)
    if unknown:
        raise ValueError(f"fpx.probe.fuzz: unknown mutations {sorted(unknown)}; "
                         f"known: {list(mutate.MUTATIONS)}")
    spec = backend_spec(backend)
    cfg = config or Config()
    opts = dict(fullgraph=fullgraph, dynamic=dynamic, timeout=timeout, policy=policy)
    report = Report(spec[1] if spec[0] == "name" else f"{spec[1]}.{spec[2]}")
    local = sandbox or Sandbox()
    seen = set()
    t0 = _time.perf_counter()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=programs if programs is not None else int(time),
                   unit="prog" if programs is not None else "s", dynamic_ncols=True)

    def more(k):
        if programs is not None:
            return k < programs
        return _time.perf_counter() - t0 < time

    def handle(k, case, source, applied, job, outcome):
        report.programs += 1
        report.counts[outcome.status] += 1
        report.records.append((k, outcome.status, outcome.verdict, outcome.allclose))
        if outcome.status in ("unsupported", "oracle", "invalid"):
            report.errors.append((k, outcome.status, outcome.error[:500]))
        if bar is not None:
            if programs is not None:
                bar.update(1)
            else:
                bar.n = min(int(_time.perf_counter() - t0), bar.total)
                bar.refresh()
            bar.set_postfix(findings=len(report.findings))
        if outcome.status not in FINDINGS:
            return
        sig = _signature(outcome.status, outcome) if dedup else None
        if sig is not None and sig in seen:
            report.duplicates += 1
            return
        seen.add(sig)
        report.findings.append(_finding(k, Case(case.seed, applied), source, outcome,
                                        spec, opts, local, minimize_budget, out))

    try:
        k = 0
        if executor is None:
            while more(k):
                case = make_case(seed, k, mutations, max_steps, cfg)
                source, applied, job = _run_case(case, spec, opts)
                handle(k, case, source, applied, job, local.run(job))
                k += 1
        else:
            window = collections.deque()
            width = 2 * (getattr(executor, "_max_workers", None) or os.cpu_count() or 2)
            while more(k) or window:
                while more(k) and len(window) < width:
                    case = make_case(seed, k, mutations, max_steps, cfg)
                    source, applied, job = _run_case(case, spec, opts)
                    window.append((k, case, source, applied, job, executor.submit(run_job, job)))
                    k += 1
                kk, case, source, applied, job, fut = window.popleft()
                handle(kk, case, source, applied, job, fut.result())
    finally:
        if sandbox is None:
            local.close()
        if bar is not None:
            bar.close()
    report.seconds = _time.perf_counter() - t0
    return report


def _finding(k, case, source, outcome, spec, opts, sandbox, budget, out) -> Finding:
    kind = outcome.status
    original = source

    def same(o):
        return o.status == kind and (kind != "crash" or o.error_type == outcome.error_type)
    if budget > 0:
        small = minimize(case, lambda c: same(sandbox.run(_run_case(c, spec, opts)[2])),
                         budget=budget if kind != "hang" else min(budget, 4),
                         program=kind != "hang")
        small_source, applied, job2 = _run_case(small, spec, opts)
        if small_source != source:
            o = sandbox.run(job2)
            if same(o):                                # keep the small one only if it still fails
                case, source, outcome = Case(small.seed, applied), small_source, o
    f = Finding(kind, outcome.verdict if kind == "wrong" else None, source, None, k,
                list(case.plan), error=outcome.error, error_type=outcome.error_type,
                report=outcome.report, numbers=outcome.numbers,
                seed_source=case.seed.source(), original_source=original,
                inputs=list(case.seed.inputs.values()))
    if out is not None:
        header = [f"fpx.probe: program {k}, backend {spec[1] if spec[0] == 'name' else spec[2]}, "
                  f"fullgraph={opts['fullgraph']}, dynamic={opts['dynamic']}",
                  f"mutations: {', '.join(m for m, _ in f.mutations) or 'none'}"]
        if kind == "wrong":
            header += ["", *outcome.report.splitlines(), "", f"numbers: {outcome.numbers}"]
        else:
            header += ["", *(outcome.error.splitlines()[:12])]
        text = repro.script(kind=kind, seed_source=f.seed_source, source=source,
                            inputs=f.inputs, backend=spec, fullgraph=opts["fullgraph"],
                            dynamic=opts["dynamic"], timeout=opts["timeout"],
                            error_type=outcome.error_type if kind == "crash" and
                            not outcome.error_type.startswith("Died") else "",
                            header="\n".join(header))
        f.path = repro.write(os.path.join(out, f"{kind}_{k:05d}.py"), text)
    return f
