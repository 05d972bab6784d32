"""Running one case -- compiled vs eager, judged by ``fpx.classify`` -- in a child process.

A :class:`Sandbox` is a long-lived child Python process (``python -m fpx.probe.sandbox``) that
imports torch and fpx once and then checks cases one at a time; the parent waits for each
answer with a time limit. A hang is a case that does not answer in time (the child's process
group is killed and a fresh child started for the next case); a hard crash (a segfault, an
abort) is a child that dies. Neither can take the fuzzer down.

The check (:func:`check`): run the (mutated) program eagerly, compile it with
``torch.compile(program, backend=..., fullgraph=..., dynamic=...)`` and run it on copies of
the same inputs. An exception while compiling or running is a ``crash``. Otherwise the
compiled outputs are classified against the *seed* program's round-off bound
(``fpx.classify``: every summation order, the policy's per-op accuracies): ``bug`` is a
``wrong`` finding; ``inconclusive`` (a value straddling a discontinuity, an unbounded bound)
is not a finding. Two self-checks keep false alarms out: the eager run of the mutated program
must lie inside the seed's bound too (else the mutation was not exact: ``invalid``), and when
the compiled output is outside, the seed's own eager output must be inside (else fpx's model
of an eager op is what failed: ``oracle``).
"""
from __future__ import annotations

import atexit
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field

STATUSES = ("ok", "crash", "hang", "wrong", "inconclusive", "unsupported", "invalid", "oracle")


@dataclass
class Job:
    """One case: the seed's and the mutated program's sources, the inputs, how to compile."""
    seed_source: str
    source: str
    inputs: list
    backend: tuple                 # ("name", "inductor") or ("ref", module, qualname, file)
    fullgraph: bool = False
    dynamic: bool | None = None
    timeout: float = 120.0
    policy: object = None


@dataclass
class Outcome:
    """What happened: ``status`` (one of :data:`STATUSES`), the verdict's kind and report,
    fpx's numbers, the fixed-tolerance oracles' answers on the same outputs, the error."""
    status: str
    verdict: str | None = None
    report: str = ""
    error: str = ""
    error_type: str = ""
    numbers: dict = field(default_factory=dict)
    allclose: dict = field(default_factory=dict)
    seconds: float = 0.0


def backend_spec(backend):
    """``backend`` as something a child process can import: a name, or (module, qualname)."""
    if isinstance(backend, str):
        return ("name", backend)
    mod = getattr(backend, "__module__", None)
    qual = getattr(backend, "__qualname__", None) or getattr(type(backend), "__qualname__", None)
    if not mod or not qual or "<locals>" in qual:
        raise ValueError("fpx.probe: a backend that is not a string must be importable by module "
                         f"and name (a module-level function or object); got {backend!r}")
    if not hasattr(backend, "__qualname__"):        # an instance: find its name in its module
        m = sys.modules.get(mod)
        qual = next((k for k, v in vars(m).items() if v is backend), None) if m else None
        if qual is None:
            raise ValueError(f"fpx.probe: backend {backend!r} is not a module-level name")
    m = sys.modules.get(mod)
    path = getattr(m, "__file__", None) if m else None
    return ("ref", mod, qual, os.path.abspath(path) if path else None)


def resolve_backend(spec):
    if spec[0] == "name":
        return spec[1]
    import importlib
    import importlib.util
    _, mod, qual, path = spec
    try:
        if mod == "__main__":
            raise ImportError
        m = importlib.import_module(mod)
    except ImportError:
        if path is None:
            raise
        sys.path.insert(0, os.path.dirname(path))
        try:
            m = importlib.import_module(mod) if mod != "__main__" else None
        except ImportError:
            m = None
        if m is None:
            s = importlib.util.spec_from_file_location("_fpx_probe_backend", path)
            m = importlib.util.module_from_spec(s)
            s.loader.exec_module(m)
    obj = m
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _root(e):
    """The exception under dynamo's wrappers (``BackendCompilerFailed`` and the like)."""
    seen = set()
    while id(e) not in seen:
        seen.add(id(e))
        inner = getattr(e, "inner_exception", None) or e.__cause__
        if inner is None:
            break
        e = inner
    return e


def _fixed_tolerances(ref, out):
    """TorchProbe's ``np.allclose(rtol=1e-2, atol=1e-4)`` (NaN/Inf outputs skipped) and
    torch.testing's defaults, on the same outputs: True = they call it a match."""
    import numpy as np
    import torch
    tp = tt = True
    for r, o in zip(ref, out):
        a = r.detach().double().numpy()
        b = o.detach().double().numpy()
        ok = np.isfinite(a) & np.isfinite(b)
        tp &= bool(np.allclose(a[ok], b[ok], rtol=1e-2, atol=1e-4))
        try:
            torch.testing.assert_close(o, r)
        except AssertionError:
            tt = False
    return {"torchprobe": tp, "torch.testing": tt}


def _numbers(v):
    return {"n_outside": v.n_outside, "n_elements": v.n_elements, "n_undecided": v.n_undecided,
            "margin_abs": v.margin_abs, "margin_rel": v.margin_rel,
            "max_observed": v.max_observed}


def check(job: Job) -> Outcome:
    """The check, in this process: the child runs it. Called directly it resets
    ``torch._dynamo``'s caches of the calling process (each case compiles afresh)."""
    import torch
    import fpx
    from fpx.probe.program import load
    t0 = time.perf_counter()
    torch._dynamo.reset()
    seed_fn, fn = load(job.seed_source), load(job.source)
    args = lambda: [t.clone() for t in job.inputs]                      # noqa: E731
    opts = {} if job.policy is None else {"policy": job.policy}
    with torch.no_grad():
        try:
            seed_out = tuple(seed_fn(*args()))
            eager = tuple(fn(*args()))
        except Exception as e:
            return Outcome("invalid", error=f"eager run failed: {type(e).__name__}: {e}",
                           error_type=type(e).__name__)
        try:
            comp = torch.compile(fn, backend=resolve_backend(job.backend),
                                 fullgraph=job.fullgraph, dynamic=job.dynamic)
            out = tuple(comp(*args()))
        except Exception as e:
            tb = traceback.format_exc(limit=-6)
            root = _root(e)
            return Outcome("crash", error=f"{type(root).__name__}: {root}\n{tb}"[-4000:],
                           error_type=type(root).__name__, seconds=time.perf_counter() - t0)
        tol = _fixed_tolerances(eager, out) if len(out) == len(eager) else {}
        try:
            if any(not torch.equal(a, b) for a, b in zip(seed_out, eager)):
                ve = fpx.classify(seed_fn, eager, *args(), **opts)
                if ve.kind == "bug":
                    return Outcome("invalid", verdict="bug", report=ve.report(),
                                   error="the mutated program's eager run leaves the seed's bound")
            v = fpx.classify(seed_fn, out, *args(), **opts)
            if v.kind == "bug":
                vs = fpx.classify(seed_fn, seed_out, *args(), **opts)
                if vs.kind == "bug":
                    return Outcome("oracle", verdict="bug", report=vs.report(),
                                   error="the seed's own eager output leaves fpx's bound",
                                   numbers=_numbers(vs), allclose=tol)
        except Exception as e:
            return Outcome("unsupported", error=f"{type(e).__name__}: {e}"[:2000],
                           error_type=type(e).__name__, allclose=tol,
                           seconds=time.perf_counter() - t0)
    status = {"bug": "wrong", "inconclusive": "inconclusive"}.get(v.kind, "ok")
    return Outcome(status, verdict=v.kind, report=v.report(), numbers=_numbers(v), allclose=tol,
                   seconds=time.perf_counter() - t0)


class Sandbox:
    """A child process that checks jobs; :meth:`run` answers within ``job.timeout`` seconds.
    ``threads``: torch's threads in the child; ``env``: variables added to the child's
    environment (e.g. ``TORCHINDUCTOR_CACHE_DIR`` for cold compiles)."""

    def __init__(self, threads: int = 1, startup_timeout: float = 180.0, env: dict | None = None):
        self.threads, self.startup_timeout = threads, startup_timeout
        self.env = dict(env or {})
        self.proc = None

    def _start(self):
        from multiprocessing.connection import Connection
        r1, w1 = os.pipe()          # parent -> child
        r2, w2 = os.pipe()          # child -> parent
        self.err = tempfile.TemporaryFile()
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), **self.env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fpx.probe.sandbox", str(r1), str(w2), str(self.threads)],
            pass_fds=(r1, w2), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=self.err, start_new_session=True, env=env)
        os.close(r1)
        os.close(w2)
        self.send, self.recv = Connection(w1, readable=False), Connection(r2, writable=False)
        if not self.recv.poll(self.startup_timeout):
            self.close()
            raise RuntimeError("fpx.probe: the sandbox process did not start")
        self.recv.recv_bytes()      # "ready"

    def _stderr_tail(self):
        try:
            self.err.seek(0, os.SEEK_END)
            self.err.seek(max(0, self.err.tell() - 4000))
            return self.err.read().decode(errors="replace")[-2000:]
        except Exception:
            return ""

    def run(self, job: Job) -> Outcome:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        t0 = time.perf_counter()
        self.send.send_bytes(pickle.dumps(job))   # plain pickle: no shared-memory handles
        try:
            if self.recv.poll(job.timeout):
                return pickle.loads(self.recv.recv_bytes())
            self.close()
            return Outcome("hang", error=f"no answer within {job.timeout:g} s",
                           error_type="Timeout", seconds=time.perf_counter() - t0)
        except (EOFError, OSError, pickle.UnpicklingError):
            self.proc.wait()
            code = self.proc.returncode
            tail = self._stderr_tail()
            self.close()
            name = (signal.Signals(-code).name if code is not None and code < 0 else f"exit {code}")
            return Outcome("crash", error=f"the process died ({name})\n{tail}",
                           error_type=f"Died:{name}", seconds=time.perf_counter() - t0)

    def close(self):
        p, self.proc = self.proc, None
        if p is None:
            return
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)      # the child's own group (inductor workers)
            except (ProcessLookupError, PermissionError):
                p.kill()
        p.wait()
        for c in (self.send, self.recv):
            c.close()
        self.err.close()


_local = threading.local()
_all: list = []


def run_job(job: Job) -> Outcome:
    """Check ``job`` in this thread's sandbox (started on first use): the function an executor
    (``concurrent.futures``, Dask's ``client.get_executor()``) runs."""
    sb = getattr(_local, "sandbox", None)
    if sb is None:
        sb = _local.sandbox = Sandbox()
        _all.append(sb)
    return sb.run(job)


@atexit.register
def _close_all():
    for sb in _all:
        sb.close()


def _serve(rfd: int, wfd: int, threads: int):
    from multiprocessing.connection import Connection
    recv, send = Connection(rfd, writable=False), Connection(wfd, readable=False)
    import torch
    import fpx.interop.torch  # noqa: F401  (imported once, before the first case)
    torch.set_num_threads(threads)
    send.send_bytes(b"ready")
    while True:
        try:
            job = pickle.loads(recv.recv_bytes())
        except EOFError:
            return
        try:
            out = check(job)
        except BaseException as e:          # the check itself failed: report it, keep serving
            out = Outcome("unsupported", error=f"{type(e).__name__}: {e}",
                          error_type=type(e).__name__)
        send.send_bytes(pickle.dumps(out))


if __name__ == "__main__":
    from fpx.probe.sandbox import _serve as serve      # pickled classes live in the package
    serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
