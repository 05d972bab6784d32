"""Long sums under ``fpx.interval``: where the rigorous bound is too wide to use, an event
says so and names the alternatives, which are tighter."""
from __future__ import annotations

import numpy as np
import pytest

import fpx
from fpx.transforms.interval import run_interval


def _sum(f, x, **kw):
    interp, iv = run_interval(f, (x,), {}, **kw)
    return iv, [e for e in interp.events if e.kind == "long-sum"]


@pytest.mark.parametrize("prim, f", [("sum", np.sum), ("cumsum", np.cumsum)])
def test_a_long_sum_is_noted_and_a_short_one_is_not(prim, f):
    x = np.random.default_rng(0).random(4096).astype(np.float16)
    _, ev = _sum(f, x)
    assert len(ev) == 1
    assert f"{prim} of 4096 terms" in ev[0].what and "bound='probabilistic'" in ev[0].what
    assert "reshape(-1, b)" in ev[0].what
    assert _sum(f, x[:64])[1] == []                  # (n - 1)·u = 0.03: no event
    assert _sum(f, x, bound="probabilistic")[1] == []


def test_the_event_reaches_a_plain_interval_user():
    x = np.random.default_rng(0).random(4096).astype(np.float16)
    iv = fpx.interval(np.sum)(x)
    assert [e.kind for e in iv.events] == ["long-sum"]
    assert fpx.interval(np.sum)(x[:64]).events == ()


def test_the_alternatives_the_event_names_are_tighter_and_sound():
    x = np.random.default_rng(1).random(4096).astype(np.float16)
    exact = np.sum(x.astype(np.float64))
    plain, _ = _sum(np.sum, x)
    blocked, ev = _sum(lambda t: t.reshape(-1, 64).sum(axis=1).sum(), x)
    prob, _ = _sum(np.sum, x, bound="probabilistic")
    assert ev == []
    for iv in (plain, blocked):
        assert iv.contains(exact) and iv.contains(iv.value)
    width = lambda iv: float(iv.hi - iv.lo)          # noqa: E731
    assert width(blocked) < width(plain) / 10 and width(prob) < width(plain) / 5
