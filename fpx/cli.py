"""The ``fpx`` command line: ``fpx demo`` (the main job on built-in data), ``fpx formats``,
``fpx probe`` (fuzz ``torch.compile``: docs/probe.md)."""
from __future__ import annotations

import argparse
import sys

import numpy as np


def example_data(n: int = 256, seed: int = 0):
    """Built-in example data: two interleaved spirals in 2-D (no downloads), float32."""
    rng = np.random.default_rng(seed)
    t = np.sqrt(rng.uniform(0.05, 1.0, n)) * 3 * np.pi
    cls = rng.integers(0, 2, n)
    r = t / (3 * np.pi)
    ang = t + np.pi * cls
    x = np.stack([r * np.cos(ang), r * np.sin(ang)], axis=1) + rng.normal(0, 0.02, (n, 2))
    return x.astype(np.float32), cls


def example_mlp(width: int = 64, seed: int = 1):
    """A small MLP classifier with fixed random weights (float32), written in plain NumPy."""
    rng = np.random.default_rng(seed)
    dims = [2, width, width, 2]
    params = [((rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32),
               (rng.standard_normal(b) * 0.1).astype(np.float32)) for a, b in zip(dims, dims[1:])]

    def mlp(x):
        for i, (w, b) in enumerate(params):
            x = x @ w + b
            if i < len(params) - 1:
                x = np.tanh(x)
        z = x - x.max(axis=1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=1, keepdims=True))   # log-softmax
    return mlp


def demo(out=sys.stdout) -> int:
    import fpx
    from fpx import formats

    def say(*a):
        print(*a, file=out)

    x, labels = example_data()
    mlp = example_mlp()
    say("fpx demo — built-in data: 256 points of two spirals, a 2-64-64-2 tanh MLP (float32)\n")

    say("1. What fpx sees: fpx.trace records the primitives the unchanged NumPy program runs")
    rec = fpx.trace(mlp)(x)
    say(rec)
    same = np.array_equal(rec.outputs, mlp(x))
    say(f"   traced output bit-identical to the plain NumPy run: {same}\n")

    say("2. Formats: the same model run in float64, its log-probabilities rounded into each")
    say("   format (integer-domain, exact); max relative error vs the format's unit roundoff u")
    y64 = mlp(x.astype(np.float64))   # float32 weights promote: a float64 run
    say(f"   {'format':<14}{'p':>3}{'u':>11}{'max |rel err|':>15}{'/ u':>7}")
    for name in ["float32", "tf32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"]:
        fmt = formats.get(name)
        r = formats.round(y64, fmt, "rn").astype(np.float64)
        nz = y64 != 0
        rel = float(np.max(np.abs(r[nz] - y64[nz]) / np.abs(y64[nz])))
        say(f"   {name:<14}{fmt.p:>3}{fmt.u:>11.2e}{rel:>15.3e}{rel / fmt.u:>7.3f}")
    say("")

    say("3. Stochastic rounding is unbiased; round-to-nearest is not: 1/3 in bfloat16")
    rng = np.random.default_rng(0)
    v = np.full(200_000, 1 / 3)
    rn = float(formats.round(v[:1], "bfloat16", "rn").astype(np.float64)[0])
    sr = formats.round(v, "bfloat16", "sr", rng=rng).astype(np.float64)
    say(f"   exact 0.333333333333  RN {rn:.12f}  SR mean of 2e5 draws {sr.mean():.12f}")
    say(f"   SR takes the two neighbours {np.unique(sr)} with frequency "
        f"{np.mean(sr > 1 / 3):.4f} up (expected {(1 / 3 - np.unique(sr)[0]) / np.ptp(np.unique(sr)):.4f})\n")

    _demo_classify(say)
    _demo_stochastic(say)

    acc = float(np.mean(np.argmax(rec.outputs, axis=1) == labels))
    say(f"(The untrained model's accuracy on the spirals is {acc:.2f}; fpx cares about its "
        "arithmetic, not its skill.)")
    return 0


def tiled_matmul_f16(a, b, tile=32, seed=0, transposed_tile_bug=False):
    """A float16 tiled matmul kernel written in NumPy: K is cut into tiles whose partial
    products are accumulated in float16 in a shuffled order (as a split-K GPU kernel might).
    ``transposed_tile_bug`` reads each square tile of B with swapped strides."""
    order = np.random.default_rng(seed).permutation(a.shape[1] // tile)

    def kernel(a, b):
        acc = np.zeros((a.shape[0], b.shape[1]), dtype=np.float16)
        for t in order:
            at = a[:, t * tile:(t + 1) * tile]
            for j in range(0, b.shape[1], tile):
                bt = b[t * tile:(t + 1) * tile, j:j + tile]
                if transposed_tile_bug:
                    bt = bt.T
                acc_j = acc[:, j:j + tile] + at @ bt
                acc = np.concatenate([acc[:, :j], acc_j, acc[:, j + tile:]], axis=1)
        return acc
    return kernel


def _demo_classify(say):
    import fpx
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 256)).astype(np.float16)
    b = rng.standard_normal((256, 64)).astype(np.float16)
    ref = a.astype(np.float32) @ b.astype(np.float32)            # the float32 reference
    say("4. Round-off or bug? A float16 tiled matmul (K in shuffled tiles, float16 accumulation)")
    say("   vs a float32 reference. allclose cannot tell; fpx.classify bounds what round-off")
    say("   alone can do to the kernel on this input (sound, any summation order):")
    for name, bug in [("kernel", False), ("kernel with a transposed-stride tile bug", True)]:
        kern = tiled_matmul_f16(a, b, transposed_tile_bug=bug)
        y = kern(a, b)
        ok = np.allclose(y.astype(np.float32), ref, rtol=1e-3, atol=1e-3)
        v = fpx.classify(kern, ref, a, b)
        say(f"   {name}: np.allclose(rtol=1e-3) -> {ok}; max |diff| "
            f"{np.max(np.abs(y.astype(np.float32) - ref)):.3g}; fpx says {v.kind.upper()}")
        if v.kind == "bug":
            say("\n".join("   " + line for line in v.report(max_items=3).splitlines()[1:]))
    say("")


def example_cnn(batch: int = 16, seed: int = 5):
    """A small CNN (conv 1->4 3x3, relu, max-pool 2, conv 4->8 3x3, relu, linear 128->10),
    fixed random weights, float32, on built-in 14x14 "digit" images (strokes drawn from a seed)."""
    import fpx.nn as fnn
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)
    c1, c2, l1 = w(4, 1, 3, 3), w(8, 4, 3, 3), w(10, 8 * 4 * 4)
    x = np.zeros((batch, 1, 14, 14), np.float32)
    for n in range(batch):                      # a few random strokes per image
        for _ in range(3):
            r0, c0 = rng.integers(1, 13, 2)
            dr, dc = rng.integers(-1, 2, 2)
            for t in range(8):
                r, c = r0 + t * dr, c0 + t * dc
                if 0 <= r < 14 and 0 <= c < 14:
                    x[n, 0, r, c] = 1.0

    def cnn(x):
        h = fnn.max_pool2d(fnn.relu(fnn.conv2d(x, c1)), 2)
        h = fnn.relu(fnn.conv2d(h, c2))
        return fnn.linear(h.reshape(h.shape[0], -1), l1)
    return cnn, x


def _demo_stochastic(say):
    import fpx
    cnn, x = example_cnn()
    say("5. How many bits are real? fpx.stochastic reruns a small CNN (float32) with every")
    say("   multiply and add randomly rounded (16 samples each); fpx.metrics counts the bits")
    say("   of each logit that the samples agree on (CNH estimator), and the bias vs IEEE:")
    ieee = cnn(x)
    for mode in ("sr", "ud"):
        s = fpx.stochastic(cnn, mode, samples=16, progress=False)(x)
        summ = fpx.metrics.summarize(s, reference=ieee)
        bits = summ.bits_cnh
        labels = np.argmax(s, axis=-1)
        flips = int(np.sum(np.any(labels != labels[0], axis=0)))
        say(f"   {mode:>3}: significant bits min {np.nanmin(bits):4.1f}  median "
            f"{np.nanmedian(bits):4.1f}  (float32 has 24); predicted labels that flip across "
            f"samples: {flips}/{x.shape[0]}")
    say("   (see docs/stochastic.md; examples/harmonic.py reproduces Fuzzy PyTorch's figure)")
    say("")


def formats_table(out=sys.stdout) -> int:
    from fpx import formats
    print(f"{'format':<15}{'p':>3}{'emin':>7}{'emax':>6}{'u':>11}{'tiny':>11}{'max':>11}  inf",
          file=out)
    for f in formats.FORMATS.values():
        print(f"{f.name:<15}{f.p:>3}{f.emin:>7}{f.emax:>6}{f.u:>11.3e}{f.tiny:>11.3e}"
              f"{f.max:>11.3e}  {'yes' if f.has_inf else 'no'}", file=out)
    return 0


def parse_budget(text: str) -> float:
    """Seconds in a budget such as ``90``, ``90s``, ``10m``, ``1.5h``."""
    import re
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"a budget is a number of seconds or minutes/hours "
                                         f"('90', '90s', '10m', '1.5h'), not {text!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def _import_backend(name: str):
    """``inductor`` stays a name; ``package.module:attr`` is imported."""
    if ":" not in name:
        return name
    import importlib
    mod, attr = name.split(":", 1)
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def probe(args) -> int:
    import fpx.probe
    from concurrent.futures import ThreadPoolExecutor
    muts = tuple(m for m in args.mutations.split(",") if m) if args.mutations != "none" else ()
    kw = dict(seed=args.seed, mutations=muts, max_steps=args.steps, out=args.out,
              fullgraph=args.fullgraph, dynamic=args.dynamic, timeout=args.timeout,
              minimize_budget=args.minimize, progress=not args.quiet)
    if args.programs is not None:
        kw["programs"] = args.programs
    else:
        kw["time"] = args.budget
    ex = ThreadPoolExecutor(args.workers) if args.workers > 1 else None
    try:
        report = fpx.probe.fuzz(_import_backend(args.backend), executor=ex, **kw)
    except (ValueError, ImportError, AttributeError) as e:      # a bad argument: say which
        print(f"fpx probe: {e}", file=sys.stderr)
        return 2
    finally:
        if ex is not None:
            ex.shutdown()
    print(report.table())
    return 1 if report.findings else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fpx", description="Floating-point transforms.")
    ap.add_argument("--version", action="store_true", help="print the version")
    sub = ap.add_subparsers(dest="cmd")
    sub.add_parser("demo", help="run fpx's main job end to end on built-in example data")
    sub.add_parser("formats", help="list the floating-point formats fpx knows")
    p = sub.add_parser("probe", help="fuzz torch.compile against eager PyTorch, with fpx's "
                       "round-off bound as the oracle (docs/probe.md)")
    p.add_argument("--budget", type=parse_budget, default=600.0,
                   help="time to fuzz: seconds, or 10m / 1h (default 10m)")
    p.add_argument("--programs", type=int, default=None, help="a number of programs instead")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="inductor",
                   help="a torch.compile backend name, or module:attr of a backend function")
    p.add_argument("--out", default=None, help="folder for the repro scripts of findings")
    p.add_argument("--mutations", default=",".join(("resolve", "recover", "functionalize", "emi")),
                   help="comma-separated mutations to draw from, or 'none'")
    p.add_argument("--steps", type=int, default=4, help="most mutation steps per program")
    p.add_argument("--fullgraph", action="store_true")
    p.add_argument("--dynamic", action="store_true", default=None)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a hang")
    p.add_argument("--minimize", type=int, default=40, help="checks spent minimizing a finding")
    p.add_argument("--workers", type=int, default=1, help="sandboxes checking in parallel")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.version:
        import fpx
        print(fpx.__version__)
        return 0
    if args.cmd == "demo":
        return demo()
    if args.cmd == "formats":
        return formats_table()
    if args.cmd == "probe":
        return probe(args)
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
