"""fpx.abft: overhead of a checksummed GEMM against the plain one, threshold tightness (V-ABFT,
A-ABFT, rigorous), false-positive rate on clean trials, and detection rate per bf16 bit.

    python benchmarks/abft.py [--quick]

* Overhead: ``fpx.abft(matmul)`` (V-ABFT, row checks, correction on) over ``A @ B``, float32
  (the target), float64 and bfloat16 (against the same emulated GEMM unprotected), n = 1024
  and 2048, timed interleaved in the same process: ratios of the medians of the rounds, and
  (``_min``) of the fastest rounds -- on a loaded machine the least disturbed -- with the load
  average next to each. ``floor_share``: a row check with no threshold statistics (one
  checksum pass over B, A and C each), over the plain GEMM -- what any verification after a
  BLAS call pays on this machine to read the three matrices once.
* e_max: what V-ABFT's threshold needed (the largest |E| / T at e_max = 1, ``calibrate(...,
  relative_to="v-abft")``) over six input distributions, on NumPy's BLAS, torch's (MKL) and a
  strictly sequential dot product (``fpx.reproducible``), against the CPU default: the
  default over 1.2x the need (>= 1: the default holds with the protocol's 20% to spare).
* Tightness (the V-ABFT paper's Tables 4-6 at CPU scale): the mean threshold over the mean
  |verification difference| of the rows, FP64 and FP32 on U(-1, 1), BF16 on U(0, 1) with its
  output verified offline.
* False positives: clean GEMMs (16, 64, 16) per format and input distribution, batched.
* Detection per bit: bf16 (M, K, N) = (128, 1024, 256), one flip per trial: of the float32
  accumulator's bit matching bf16's (online), or of the bf16 output's bit, set or cleared
  (offline).
Ends with one JSON line.
"""
from __future__ import annotations

import json
import os
import sys
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _timing import parse_args  # noqa: E402

from fpx.faults import BitFlip  # noqa: E402
from fpx.transforms.abft import abft  # noqa: E402
from fpx.transforms.abft.thresholds import PAPER_INPUTS, paper_inputs  # noqa: E402
from fpx.transforms.inject import inject  # noqa: E402

BF16 = ml_dtypes.bfloat16


def mm(a, b):
    return a @ b


dist = paper_inputs      # the V-ABFT paper's input distributions


def _plain_gemm(dtype):
    """The GEMM fpx.abft protects, unprotected: NumPy's matmul for float32/float64; for
    bfloat16 the same emulated mixed-precision GEMM (float32 BLAS, one rounding to bf16)."""
    if dtype == "bfloat16":
        return lambda a, b: (a.astype(np.float32) @ b.astype(np.float32)).astype(BF16)
    return mm


def overhead(n, rounds, dtype="float32"):
    """End-to-end time of ``fpx.abft(matmul)`` over the plain GEMM (medians of interleaved
    rounds), and the verification alone (the fused checksum passes, V-ABFT threshold,
    comparison: what abft adds to the BLAS call) over the plain GEMM -- the second is what a
    loaded machine's +-20% swings in the GEMM's own time do not drown. ``load``: the 1-minute
    load average at the end."""
    from fpx import formats
    from fpx.transforms.abft import check, sums, thresholds
    rng = np.random.default_rng(0)
    A = rng.standard_normal((n, n)).astype(BF16 if dtype == "bfloat16" else dtype)
    B = rng.standard_normal((n, n)).astype(A.dtype)
    acc = np.float64 if dtype == "float64" else np.float32
    A3, B3 = A.astype(acc)[None], B.astype(acc)[None]
    C3 = A3 @ B3
    fa = formats.get(acc)

    def verify_only():
        info = thresholds.Info(fmt=fa, acc=fa, out=fa, verify="online", c_sigma=2.5,
                               e_max=thresholds.e_max_for(None, fa, n, n))
        pre = check.prepare(A3, B3, tfun=thresholds.vabft, checksums="auto")
        check.check(A3, B3, C3, tfun=thresholds.vabft, info=info, checksums="auto",
                    correct=True, out=None, pre=pre)

    def floor():
        sums.output_sums(sums.input_sums(A3, B3), C3)

    plain = _plain_gemm(dtype)
    runs = {"plain": lambda: plain(A, B), "verify": verify_only, "floor": floor,
            "v-abft": abft(mm),
            "rigorous": abft(mm, threshold="rigorous"), "both": abft(mm, checksums="both")}
    alone = ("plain", "verify", "floor")
    call = {k: (f if k in alone else (lambda f=f: f(A, B))) for k, f in runs.items()}
    ts = {k: [] for k in runs}
    for k in runs:
        call[k]()
    for _ in range(rounds):
        for k in runs:
            t0 = time.perf_counter()
            call[k]()
            ts[k].append(time.perf_counter() - t0)
    base, best = float(np.median(ts["plain"])), float(np.min(ts["plain"]))
    out = {k: float(np.median(v)) / base for k, v in ts.items() if k not in alone}
    out["verify_share"] = float(np.median(ts["verify"])) / base
    out["floor_share"] = float(np.median(ts["floor"])) / base
    out.update({k + "_min": float(np.min(v)) / best for k, v in ts.items() if k != "plain"})
    out["load"] = os.getloadavg()[0]
    return base, out


def _gemms():
    """The summation orders the e_max default must cover: NumPy's BLAS, torch's (MKL, where
    torch is installed), a strictly sequential float dot product without FMA."""
    import fpx
    out = {"numpy": None, "sequential": fpx.reproducible(mm)}
    try:
        import torch
        out["torch"] = lambda a, b: torch.matmul(torch.from_numpy(a),
                                                 torch.from_numpy(b)).numpy()
    except ImportError:
        pass
    return out


E_MAX_INPUTS = ("|N(1,1)|", "U(0,1)") + PAPER_INPUTS


def e_max_slack(sizes):
    """{format/order/MxKxN: default e_max / (1.2 x the e_max V-ABFT needed)} for ``sizes``
    [((M, K, N), trials per input distribution)]."""
    from fpx.transforms.abft import DEFAULT_EMAX, calibrate
    out = {}
    for fmt in ("float32", "float64"):
        for name, g in _gemms().items():
            for size, t in sizes:
                c = calibrate(fmt, sizes=(size,), trials=t, inputs=E_MAX_INPUTS, gemm=g,
                              relative_to="v-abft", margin=1.2)
                (M, K, N), = c.per_size
                out[f"{fmt}/{name}/{M}x{K}x{N}"] = DEFAULT_EMAX[fmt](K, N) / c.e_max
    return out


def tightness(sizes, trials):
    rows = []
    for fmt, d, verify in [("float64", "U(-1,1)", "online"), ("float32", "U(-1,1)", "online"),
                           ("bfloat16", "U(0,1)", "offline")]:
        for n in sizes:
            rng = np.random.default_rng(n)
            A = dist(d, rng, (trials, n, n)).astype(fmt)
            B = dist(d, rng, (trials, n, n)).astype(fmt)
            row = {"format": fmt, "n": n}
            for th in ("v-abft", "a-abft", "rigorous"):
                _, rep = abft(mm, threshold=th, verify=verify, report=True, correct=False)(A, B)
                g = rep.gemms[0]
                row[th] = g.tightness
                row["actual"] = g.residual
                row["fp_" + th] = g.detected
            rows.append(row)
    return rows


def fp_rate(trials, shape=(16, 64, 16)):
    """False-positive rate (rows) over ``trials`` clean GEMMs of ``shape`` per format and
    input distribution, and the largest |D| / T seen (how close the clean rows came)."""
    M, K, N = shape
    rate, ratio = {}, {}
    for fmt, verify in [("float64", "online"), ("float32", "online"), ("bfloat16", "online"),
                        ("bfloat16", "offline"), ("float16", "offline"),
                        ("float8_e4m3fn", "offline")]:
        for k, d in enumerate(PAPER_INPUTS):
            rng = np.random.default_rng(1000 + k)
            det = done = 0
            worst = 0.0
            while done < trials:
                t = min(25000, trials - done)
                A = dist(d, rng, (t, M, K)).astype(fmt)
                B = dist(d, rng, (t, K, N)).astype(fmt)
                _, rep = abft(mm, verify=verify, report=True, correct=False)(A, B)
                det += rep.gemms[0].detected
                worst = max(worst, rep.gemms[0].ratio)
                done += t
            rate[f"{fmt}/{verify}/{d}"] = det / (done * M)
            ratio[f"{fmt}/{verify}/{d}"] = worst
    return rate, ratio


def _sites(rng, values, bit, direction):
    """One (t, i, j) per trial t: a random element, or one whose ``bit`` is 0 ("set") / 1
    ("clear"); trials without such an element are skipped."""
    u = np.dtype(f"u{values.dtype.itemsize}")
    state = (values.view(u) >> bit) & 1
    out = []
    for t in range(values.shape[0]):
        ok = np.argwhere(state[t] == (0 if direction == "set" else 1)) if direction else \
            np.argwhere(np.ones(state[t].shape, bool))
        if len(ok):
            i, j = ok[rng.integers(len(ok))]
            out.append((t, int(i), int(j)))
    return out


def detection(trials, dists):
    """Detected share (%) of single flips, one per trial: online, a random element of the
    float32 accumulator at bf16's bit b (float32's b + 16), either direction; offline, the bf16
    output's bit b, set (0 -> 1: the element grows by 2^(2^(b - 7))) or cleared (1 -> 0: it
    shrinks to ~0)."""
    out = {}
    for d in dists:
        rng = np.random.default_rng(7)
        A = dist(d, rng, (trials, 128, 1024)).astype(BF16)
        B = dist(d, rng, (trials, 1024, 256)).astype(BF16)
        acc = A.astype(np.float32) @ B.astype(np.float32)
        runs = [("online", "accumulator", 16, acc, None), ("offline", "output", 0,
                                                           acc.astype(BF16), "set"),
                ("offline", "output", 0, acc.astype(BF16), "clear")]
        for verify, where, shift, values, direction in runs:
            for bit in range(7, 15):
                sites = _sites(rng, values, bit + shift, direction)
                key = f"{d}/{verify}" + (f"-{direction}" if direction else "") + f"/bit{bit}"
                if not sites:
                    out[key] = None
                    continue
                fs = [BitFlip(bit + shift, where=where, index=s) for s in sites]
                _, rep = inject(abft(mm, verify=verify, report=True), fs)(A, B)
                out[key] = 100.0 * rep.gemms[0].detected / len(sites)
    return out


def main(argv=None):
    args = parse_args(__doc__, argv)
    q = args.quick
    print(f"load average: {os.getloadavg()}")
    res = {}
    for dtype in ("float32", "float64", "bfloat16"):
        for n in (1024, 2048):
            base, r = overhead(n, 5 if q else 15, dtype)
            res[f"overhead_{n}" if dtype == "float32" else f"overhead_{dtype}_{n}"] = r
            print(f"overhead n={n} {dtype}: plain {base * 1e3:.1f} ms; " +
                  ", ".join(f"{k} {v:.3f}" + ("" if k == "load" else "x")
                            for k, v in r.items()))
    sizes = [((16, 64, 16), 2000), ((16, 1024, 16), 200), ((16, 256, 1024), 20),
             ((256,) * 3, 4), ((1024,) * 3, 1)]
    if not q:
        sizes = [(s, 5 * t) for s, t in sizes] + [((16, 4096, 16), 100), ((2048,) * 3, 1)]
    slack = e_max_slack(sizes)
    print("e_max: default / (1.2 x the need), six inputs (>= 1: holds):")
    for k, v in slack.items():
        print(f"  {k:36} {v:6.2f}")
    res["e_max_slack"] = slack
    rows = tightness((128, 256, 512) if q else (128, 256, 512, 1024, 2048), 2 if q else 4)
    print(f"{'format':9} {'n':>5} {'actual':>9} {'V-ABFT':>8} {'A-ABFT':>8} {'rigorous':>9}  "
          "(threshold / actual, means over rows)")
    for r in rows:
        print(f"{r['format']:9} {r['n']:5d} {r['actual']:9.3g} {r['v-abft']:7.1f}x "
              f"{r['a-abft']:7.0f}x {r['rigorous']:8.0f}x")
    res["tightness"] = {f"{r['format']}/{r['n']}": {k: r[k] for k in ("v-abft", "a-abft",
                                                                        "rigorous")}
                        for r in rows}
    trials = 10 ** 4 if q else 10 ** 5
    fp, worst = fp_rate(trials)
    print(f"false-positive rate (rows), {trials} clean GEMMs (16, 64, 16) each; largest |D|/T:")
    for k, v in fp.items():
        print(f"  {k:40} {v:.2e}  {worst[k]:.3f}")
    res["false_positive_rate"] = fp
    res["fp_max_ratio"] = worst
    res["fp_trials"] = trials
    det = detection(8 if q else 64, ("N(1e-6,1)", "U(-1,1)") if q else PAPER_INPUTS)
    print("detection rate (%) per bf16 bit, (128, 1024, 256), one flip per trial:")
    for k, v in det.items():
        print(f"  {k:38} " + ("   n/a (no such element)" if v is None else f"{v:6.1f}"))
    res["detection"] = det
    print(json.dumps({"benchmark": "abft", "quick": q, **res}))


if __name__ == "__main__":
    main()
