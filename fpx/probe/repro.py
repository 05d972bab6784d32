"""Standalone repro scripts: one Python file per finding that exits 1 when the problem reproduces.

The script holds the program (mutated, minimized), the seed program it must agree with, its
inputs bit for bit (base64), and the ``torch.compile`` call; a backend that is not a string is
imported by module and name (its file's folder put on ``sys.path``). The verdict and fpx's
numbers are in its header comment. Exit status: 1 reproduced, 0 not reproduced, 2 a different
problem (another exception type than the one found). A hang is given ``2 x timeout`` seconds by
``signal.alarm``, whose default action ends the process (non-zero).
"""
from __future__ import annotations

import os

from fpx.probe.program import NAME, TENSOR_HELPER, tensor_literal


def _comment(text: str) -> str:
    return "\n".join(("# " + line).rstrip() for line in text.splitlines())


def _backend_source(spec) -> str:
    if spec[0] == "name":
        return f"BACKEND = {spec[1]!r}\n"
    _, mod, qual, path = spec
    folder = os.path.dirname(path) if path else None
    lines = ["def _backend():", "    import importlib", "    import importlib.util"]
    if folder:
        lines.append(f"    sys.path.insert(0, {folder!r})")
    if mod == "__main__":
        lines += [f"    s = importlib.util.spec_from_file_location('_backend_module', {path!r})",
                  "    m = importlib.util.module_from_spec(s)", "    s.loader.exec_module(m)"]
    else:
        lines.append(f"    m = importlib.import_module({mod!r})")
    lines += ["    obj = m", f"    for part in {qual!r}.split('.'):",
              "        obj = getattr(obj, part)", "    return obj", "", "",
              "BACKEND = _backend()", ""]
    return "\n".join(lines)


def script(*, kind, seed_source, source, inputs, backend, fullgraph, dynamic, timeout,
           error_type="", header="") -> str:
    """The repro script's text."""
    seed_fn = seed_source.replace(f"def {NAME}(", "def seed_program(", 1)
    tensors = ",\n    ".join(tensor_literal(t) for t in inputs)
    return f'''#!/usr/bin/env python
"""fpx.probe finding ({kind}): torch.compile disagrees with eager PyTorch on this program.

Run: python this_file.py -- exit 1: reproduced; 0: not reproduced; 2: another problem.
"""
{_comment(header)}
import signal
import sys

import numpy as np
import torch

KIND = {kind!r}
ERROR_TYPE = {error_type!r}


{TENSOR_HELPER}

# The seed program: the oracle's meaning (fpx bounds every result round-off could give it).
{seed_fn}

# The program compiled (the seed after equivalence mutations).
{source}

INPUTS = [
    {tensors},
]

{_backend_source(backend)}

def main():
    args = lambda: [t.clone() for t in INPUTS]
    if KIND == "hang":
        signal.alarm({int(2 * timeout) + 1})     # default action: the process ends, non-zero
    try:
        compiled = torch.compile({NAME}, backend=BACKEND, fullgraph={fullgraph!r},
                                 dynamic={dynamic!r})
        with torch.no_grad():
            out = tuple(compiled(*args()))
    except Exception as e:
        while getattr(e, "inner_exception", None) or e.__cause__:   # under dynamo's wrappers
            e = getattr(e, "inner_exception", None) or e.__cause__
        print(f"torch.compile raised {{type(e).__name__}}: {{e}}")
        if KIND == "crash" and (not ERROR_TYPE or type(e).__name__ == ERROR_TYPE):
            return 1
        return 2
    if KIND in ("crash", "hang"):
        print("not reproduced: the compiled program ran")
        return 0
    import fpx
    verdict = fpx.classify(seed_program, out, *args())
    print(verdict.report())
    return 1 if verdict.kind == "bug" else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def write(path, text) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path
