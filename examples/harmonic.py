"""The harmonic series under stochastic arithmetic (Fuzzy PyTorch's figure, with fpx).

    H(n) = sum_{i <= n} 1/i   in float32, summed sequentially.

Round to nearest stagnates once 1/i drops below half an ulp of the partial sum (float32 gives
15.4037 for every n past ~2·10^6). Stochastic rounding (``sr``) is unbiased, so its mean stays
on the float64 value; up-down (``ud``: RN then ±1 ulp) stays on the float32 RN value; CESTAC
(RD or RU with probability ½) adds half an ulp on average to every stagnating step and drifts
upward. The program is unchanged: the terms 1/i and every addition of the running sum are
randomly rounded (``granularity="flop"``, sequential order).

    python examples/harmonic.py [--max-exp 7] [--samples 16] [--out harmonic.png]

Prints mean ± std per n and mode, and saves the plot (matplotlib) to ``--out``.
"""
from __future__ import annotations

import argparse

import numpy as np

import fpx
import fpx.numpy as fnp


def harmonic(i):
    """Running sums of 1/i (float32 in, float32 out): H(1), H(2), ..., H(n)."""
    return fnp.cumsum(1.0 / i)


def study(max_exp=7, samples=16, modes=("sr", "ud", "cestac"), seed=0):
    n_max = 10 ** max_exp
    i = np.arange(1, n_max + 1, dtype=np.float32)    # exact: integers <= 2^24
    ns = [10 ** e for e in range(2, max_exp + 1)]
    exact = np.cumsum(1.0 / np.arange(1, n_max + 1, dtype=np.float64))
    rn32 = np.cumsum(np.float32(1.0) / i, dtype=np.float32)   # sequential float32 RN
    res = {"n": ns, "float64": [float(exact[n - 1]) for n in ns],
           "ieee": [float(rn32[n - 1]) for n in ns]}
    for mode in modes:
        s = fpx.stochastic(harmonic, mode, samples=samples, seed=seed)(i)   # (S, n_max)
        at = s[:, [n - 1 for n in ns]].astype(np.float64)
        res[mode] = {"mean": at.mean(0).tolist(), "std": at.std(0, ddof=1).tolist()}
    return res


def report(res, samples):
    lines = [f"{'n':>10} {'float64':>10} {'ieee f32':>10} " +
             " ".join(f"{m + ' mean±std':>22}" for m in res if isinstance(res[m], dict))]
    for j, n in enumerate(res["n"]):
        row = f"{n:>10} {res['float64'][j]:>10.4f} {res['ieee'][j]:>10.4f} "
        row += " ".join(f"{res[m]['mean'][j]:>12.4f} ± {res[m]['std'][j]:<7.4f}"
                        for m in res if isinstance(res[m], dict))
        lines.append(row)
    lines.append(f"({samples} samples per mode)")
    return "\n".join(lines)


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(res["n"], res["float64"], "k-", label="float64")
    ax.plot(res["n"], res["ieee"], "k--", label="float32 RN (IEEE)")
    for m, c in (("sr", "C0"), ("ud", "C1"), ("cestac", "C2")):
        if m in res:
            mu, sd = np.array(res[m]["mean"]), np.array(res[m]["std"])
            ax.errorbar(res["n"], mu, yerr=sd, fmt="o-", color=c, capsize=3, label=m)
    ax.set_xscale("log")
    ax.set_xlabel("n")
    ax.set_ylabel(r"$\sum_{i\leq n} 1/i$ (float32, sequential)")
    ax.set_title("Harmonic series under stochastic arithmetic (fpx)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-exp", type=int, default=7)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--out", default="harmonic.png")
    a = ap.parse_args(argv)
    res = study(a.max_exp, a.samples)
    print(report(res, a.samples))
    print("plot:", plot(res, a.out))


if __name__ == "__main__":
    main()
