"""``fpx.interop.torch``: torch modules and functions as fpx programs.

    fn, params = fpx.interop.torch.from_module(module, (x,))   # a pure fpx function
    y = fn(params, x.numpy())                                   # NumPy in, NumPy out
    iv = fpx.interval(module)(x)            # every transform takes the module directly
    rec = fpx.trace(module)(x)

**Export path.** ``torch.export.export(module, example_inputs)`` captures the program as a
graph of ATen ops; ``run_decompositions`` lowers it to core ATen, except for the ops fpx keeps
as composites so that transforms can give them tight rules (``linear``,
``scaled_dot_product_attention``; ``convolution``, ``native_layer_norm``, ``_softmax``,
``gelu`` are core ATen already). An interpreter walks the graph and maps each ATen op to fpx
primitives and composites (:data:`ATEN_OPS`, the table in ``docs/torch.md``). The parameters
and buffers become the function's ``params`` argument: the result is a pure function.

**Fallback.** Programs ``export`` rejects (Python control flow on tensor values) run eagerly
under a ``TorchDispatchMode``: torch executes each ATen op, fpx computes the same op on its own
values, and the tensor torch goes on with carries fpx's values -- so Python control flow sees
what fpx computed (and an interval's "unstable branch" is recorded). Ops without an fpx mapping
are decomposed with torch's decompositions with the mode re-entered; an op that neither maps
nor decomposes raises :class:`UnmappedOpError` naming it. Nothing is ever silently exact.

**Semantics.** Each op follows torch's arithmetic, not NumPy's: operands are converted to the
result dtype torch computes in; float16/bfloat16 elementwise ops run in float32 and round once
(torch's "opmath"), as do their softmax, layer norm and reductions; ``addmm``/``linear``/conv
biases are one more term of the matmul's sum (BLAS ``beta=1``); eval-mode batch norm is
``x * alpha + beta`` with torch's ``alpha = w / sqrt(var + eps)``, ``beta = b - mean * alpha``.

**Policy.** :data:`TORCH_CPU` is ``"numpy"`` with the error of torch's vectorized float32
``erf`` (Abramowitz-Stegun 7.1.26 inside ``gelu``: up to ~7e-7 absolute, measured); CUDA inputs
use ``"cuda"`` (``"tf32"`` when ``torch.backends.cuda.matmul.allow_tf32``).

=================  ==========================================================================
module             owns
=================  ==========================================================================
convert            torch dtypes as NumPy dtypes; tensors as arrays and back
policy             :data:`TORCH_CPU` and :func:`default_policy`
table              :data:`ATEN_OPS`, :func:`register_aten`, the handlers' shared helpers
aten_math          handlers: elementwise arithmetic, functions, logic, reductions
aten_nn            handlers: matmuls, convolutions, norms, softmax, attention, pooling
aten_movement      handlers: exact movement, constants
aten_grad          handlers: backward ops and optimizer updates (training steps)
export             ``torch.export`` and the graph interpreter
dispatch           the ``TorchDispatchMode`` fallback
program            :class:`TorchProgram`, :func:`build`, :func:`from_module`, the cache
adapter            :func:`adapt` (behind every transform) and :class:`BoundProgram`
layers             running a module while recording its layers' calls
=================  ==========================================================================

The adapter knows no transform: it converts arrays and tensors, and fpx result leaves (an
``Interval`` among the inputs or outputs) through their method ``_fpx_convert(convert)``.
The torch-specific math of the ATen ops is in :mod:`fpx.nn` composites, so every transform
sees the same named ops in a torch program as in a NumPy one.
"""
from fpx.interop.torch import aten_grad, aten_math, aten_movement, aten_nn  # noqa: F401
from fpx.interop.torch.adapter import BoundProgram, adapt
from fpx.interop.torch.convert import np_dtype, to_array, to_tensor, torch_dtype
from fpx.interop.torch.layers import child_layers, fine_layers, record_calls
from fpx.interop.torch.policy import TORCH_CPU, default_policy
from fpx.interop.torch.program import TorchProgram, build, from_module, program_for
from fpx.interop.torch.table import ATEN_OPS, UnmappedOpError, covered_ops, register_aten

__all__ = ["from_module", "TorchProgram", "to_array", "to_tensor", "adapt", "ATEN_OPS",
           "register_aten", "UnmappedOpError", "TORCH_CPU", "default_policy", "covered_ops",
           "np_dtype", "torch_dtype", "build", "program_for", "BoundProgram", "child_layers",
           "fine_layers", "record_calls"]
