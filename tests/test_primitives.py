"""The one classification of primitives (fpx.primitives.KIND_OF) and the views read from it."""
import numpy as np
import pytest

import fpx  # noqa: F401  (registers the primitive set and the transforms' rules)
from fpx import policy as P
from fpx import primitives as prims
from fpx.core import PRIMITIVES
from fpx.transforms import stochastic as st
from fpx.transforms.interval import IntervalInterpreter


def test_every_primitive_has_exactly_one_known_kind():
    assert len(prims.KIND_OF) == 63
    for name, kind in prims.KIND_OF.items():
        assert kind in prims.KINDS, (name, kind)
        assert PRIMITIVES[name].kind == kind            # the table is what the primitive says
    by_kind = [prims.of_kind(k) for k in prims.KINDS]
    assert sorted(n for names in by_kind for n in names) == sorted(prims.KIND_OF)  # a partition
    with pytest.raises(ValueError, match="unknown kind"):
        prims.of_kind("elementwise-ish")


def test_policy_kinds_are_read_from_the_table():
    for name, kind in prims.KIND_OF.items():
        op_kind = prims.KINDS[kind]
        if op_kind is None:
            assert name not in P.PRIMITIVES
            with pytest.raises(LookupError):
                P.kind_of(name)
        else:
            assert P.kind_of(name) == op_kind
    assert set(P.PRIMITIVES) == {n for n, k in prims.KIND_OF.items() if prims.KINDS[k]}
    # exact operations cost 0 ulp, rounded and accumulating ones 0.5 in the ieee policy
    ieee = P.get_policy("ieee")
    for name in prims.of_kind("exact"):
        assert ieee.accuracy(name, "float32").ulps == 0.0
    for name in prims.of_kind("rounded", "cast", "reduction", "matmul", "transcendental"):
        assert ieee.accuracy(name, "float32").ulps == 0.5


def test_stochastic_rounds_what_the_table_says_rounds():
    assert set(st._ROUNDED) == set(prims.of_kind("rounded", "transcendental"))
    assert set(st._EXACT) == set(prims.of_kind("exact", "divmod", "compare"))
    assert not set(st._ROUNDED) & set(st._EXACT)
    assert set(st._UFUNC_LD) == set(prims.of_kind("transcendental")) - {"erf"}
    assert st._UFUNC_LD["atan2"] is np.arctan2


@pytest.mark.parametrize("interp", [st.StochasticInterpreter, IntervalInterpreter])
def test_sound_transforms_have_a_rule_for_every_primitive(interp):
    assert set(prims.KIND_OF) <= set(interp.rules)
