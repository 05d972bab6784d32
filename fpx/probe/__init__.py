"""``fpx.probe``: fuzzing ``torch.compile`` with equivalence mutations and a round-off-aware oracle.

TorchProbe's method (Su et al.): random valid seed programs as straight-line Python, mutated by
rewrites that keep their meaning (operator resolution, mutate-then-recover, functionalization,
always-true conditional blocks), compiled and run against eager PyTorch. What differs is the
oracle: a compiled result is wrong only where ``fpx.classify`` finds it outside the sound
round-off bound of the seed program (every summation order, the policy's per-op accuracies),
never by a fixed tolerance. See docs/probe.md.
"""
from fpx.probe.fuzz import Finding, Report, fuzz, make_case
from fpx.probe.generate import Config, generate
from fpx.probe.minimize import Case, minimize
from fpx.probe.mutate import MUTATIONS, apply_plan
from fpx.probe.program import Seed, load
from fpx.probe.sandbox import Job, Outcome, Sandbox, check

__all__ = ["fuzz", "Report", "Finding", "Config", "generate", "Seed", "load", "MUTATIONS",
           "apply_plan", "Case", "minimize", "make_case", "Job", "Outcome", "Sandbox", "check"]
