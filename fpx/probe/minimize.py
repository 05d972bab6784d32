"""Delta debugging (Zeller's ddmin) of a finding over its outputs, statements and mutations.

A case is a seed program plus a mutation plan. Three passes, each keeping the problem alive
(the same status; for a crash, the same exception type):

1. outputs: keep the fewest returned values (dead statements go with the others);
2. statements: cut statements out of the seed -- a cut statement's value becomes a new program
   input holding what the eager run computed there, so every smaller program stays valid and
   its inputs stay finite;
3. mutations: keep the fewest mutation steps (each step is re-applied, with its own random
   stream, to the smaller program).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from fpx.probe.program import Seed, profile


@dataclass
class Case:
    seed: Seed
    plan: list            # [(mutation name, rng seed)]


def ddmin(items: list, test, budget) -> list:
    """A 1-minimal sublist of ``items`` for which ``test`` holds (``test(items)`` is assumed),
    within ``budget`` (a one-element list counting down the tests left)."""
    n = 2
    while len(items) >= 2 and budget[0] > 0:
        size = -(-len(items) // n)
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        for c in chunks:                                   # try removing one chunk
            rest = [x for x in items if x not in c]
            if budget[0] <= 0:
                return items
            budget[0] -= 1
            if rest and test(rest):
                items, n = rest, max(n - 1, 2)
                break
        else:
            if n >= len(items):
                return items
            n = min(2 * n, len(items))
    return items


def cut(seed: Seed, names: set) -> Seed:
    """``seed`` with the statements ``names`` replaced by new inputs holding their eager values."""
    if not names:
        return seed
    vals = profile(seed.source(), seed.args())
    inputs = dict(seed.inputs)
    for n, _ in seed.stmts:
        if n in names:
            inputs[n] = vals[n].clone()
    stmts = [(n, e) for n, e in seed.stmts if n not in names]
    return Seed(inputs, stmts, list(seed.outputs), dict(seed.meta)).used()


def minimize(case: Case, interesting, budget: int = 60, program: bool = True) -> Case:
    """The smallest case found for which ``interesting(case)`` still holds, with at most
    ``budget`` calls of it; ``program=False`` minimizes the mutation steps only."""
    left = [budget]
    seed = case.seed.used()

    def keep_outputs(outs):
        return interesting(Case(replace(seed, outputs=list(outs)).used(), case.plan))
    if program and len(seed.outputs) > 1:
        seed = replace(seed, outputs=ddmin(list(seed.outputs), keep_outputs, left)).used()

    if program and len(seed.stmts) > 1:
        every = [n for n, _ in seed.stmts]

        def keep_stmts(kept):
            return interesting(Case(cut(seed, set(every) - set(kept)), case.plan))
        kept = ddmin(every, keep_stmts, left)
        seed = cut(seed, set(every) - set(kept))

    plan = list(case.plan)
    if plan and left[0] > 0:
        left[0] -= 1
        if interesting(Case(seed, [])):
            plan = []
    if len(plan) > 1:
        plan = ddmin(plan, lambda p: interesting(Case(seed, p)), left)
    return Case(seed, plan)
