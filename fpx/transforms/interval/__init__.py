"""The interval transform (``fpx.interval``): sound round-off bounds of a program in its own
precision, one module per concern.

=============  ===========================================================================
module         owns
=============  ===========================================================================
result         :class:`Interval`, :class:`Event`, :class:`OutsideBoundWarning`: what users get
enclosure      float64 enclosures: outward widening, γ constants, one rounding into a format
interpreter    the tracer (box or ball), the interpreter and its rule tables
elementwise    + - * / fma, max/min, functions, steps (boxes; balls through a constant)
logic          comparisons, logic, ``where``, casts
movement       exact movement of boxes and balls
reductions     sums, cumsum, products, max/min, arg*, sort
matmul         one rule for matmul, linear and conv over three strategies
engines        the GEMM/convolution engines of the matmul rule
nn             softmax, log_softmax, attention, layer/RMS/batch norm
special        lgamma, Hurwitz ζ, π/tan(πx), sigmoid, silu/gelu/hardswish
transform      the entry point, :func:`interval` and :func:`run_interval`; the own value
=============  ===========================================================================

References: Zhan et al., "When AllClose Fails: Round-Off Error Estimation for Deep Learning
Programs" (RENDER, 2025); Rump, "Fast and parallel interval arithmetic" (BIT 1999); Higham,
*Accuracy and Stability of Numerical Algorithms* (2002); Higham & Mary (2019) for the
probabilistic bound ``λ·sqrt(n)·u``.
"""
from fpx.transforms.interval import (elementwise, logic, matmul, movement, nn,  # noqa: F401
                                     reductions, special)  # (register the rules)
from fpx.transforms.interval.interpreter import IntervalInterpreter, IntervalTracer
from fpx.transforms.interval.result import Event, Interval, OutsideBoundWarning
from fpx.transforms.interval.transform import interval, run_interval

__all__ = ["interval", "run_interval", "Interval", "Event", "OutsideBoundWarning",
           "IntervalInterpreter", "IntervalTracer"]
