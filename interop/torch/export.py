"""The export path of the torch adapter: ``torch.export`` captures a module as a graph of
core-ATen ops (fpx's composites kept whole), and :func:`graph_fn` turns that graph into a
pure fpx function ``fn(params, *inputs)`` that runs each node's handler."""
from __future__ import annotations

import contextlib
import io
import logging
import operator
import threading
import warnings

import numpy as np
import torch
import torch.utils._pytree as _pytree

from fpx.core import FpxError
from fpx.interop.torch.table import (Ctx, UnmappedOpError, conform, getitem, is_arr,
                                     layout_of, lookup, meta_of)

_KEEP = ("aten.linear.default", "aten.scaled_dot_product_attention.default",
         "aten.logsumexp.default", "aten.silu.default", "aten.hardswish.default",
         "aten.hardsigmoid.default", "aten.xlogy.Tensor")


# torch.export is not thread-safe (its fake mode, and a non-strict export swaps the module's
# parameters for fake tensors while it runs), and _quiet changes process-wide state (logger
# levels, warning filters, sys.stdout/stderr): every export, and every read of the program cache
# and of a module's parameters, holds this lock, so no thread sees another's fakes and each
# _quiet restores exactly what it replaced.
LOCK = threading.RLock()


@contextlib.contextmanager
def _quiet():
    """Silence torch.export's logs (its failed-meta tracebacks are logged at ERROR level,
    through handlers that hold the original stderr), warnings and prints, under ``LOCK``."""
    names = ["torch.export_program", "torch.export", "torch.fx.experimental.symbolic_shapes",
             "torch._dynamo", "torch._subclasses.fake_tensor"]
    with LOCK:
        loggers = [logging.getLogger(n) for n in names]
        levels = [lg.level for lg in loggers]
        for lg in loggers:
            lg.setLevel(logging.CRITICAL + 1)
        sink = io.StringIO()
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(sink), \
                    contextlib.redirect_stderr(sink):
                warnings.simplefilter("ignore")
                yield
        finally:
            for lg, lv in zip(loggers, levels):
                lg.setLevel(lv)


def export_program(module, args, kwargs):
    with _quiet():
        ep = torch.export.export(module, tuple(args), kwargs=dict(kwargs or {}), strict=False)
        table = torch.export.default_decompositions()
        for op in list(table.keys()):
            if str(op) in _KEEP:
                del table[op]
        table.update(_extra_decompositions())
        return ep.run_decompositions(table)


def _extra_decompositions():
    """Ops that core ATen keeps but fpx runs as torch's own decomposition into core ops:
    bilinear upsampling (``F.interpolate(mode="bilinear")``) -- the source indices and weights
    computed by interval ops, the gathers and the weighted sums as the kernel does them (its
    linear and trilinear siblings are decomposed by default)."""
    from torch._decomp import decomposition_table
    ops = (torch.ops.aten.upsample_bilinear2d.vec, torch.ops.aten.upsample_bilinear2d.default)
    return {op: decomposition_table[op] for op in ops if op in decomposition_table}


class FnModule(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, *args, **kwargs):
        return self.f(*args, **kwargs)


def _inputs(ep):
    """``[(node, kind, ref)]`` of the graph's placeholders: ``kind`` "user" (an array input),
    "const" (a Python scalar or None the program is specialized on; ``ref`` its value) or
    "state" (``ref`` the parameter, buffer or constant's name). Refuses parameter and buffer
    mutations; in-place ops on the inputs run out of place (the caller's tensors are not
    written)."""
    from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind
    sig = ep.graph_signature
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    inputs = []
    for n, spec in zip(placeholders, sig.input_specs):
        if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, ConstantArgument):
            # its value keys the program cache (``program._signature``)
            inputs.append((n, "const", spec.arg.value))
        elif spec.kind == InputKind.USER_INPUT:
            inputs.append((n, "user", None))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            inputs.append((n, "state", spec.target))
        else:
            raise FpxError(f"fpx.interop.torch: exported input of kind {spec.kind} is not "
                           "supported")
    kinds = [spec.kind for spec in sig.output_specs]
    returned = [s for s in sig.output_specs
                if s.kind == OutputKind.USER_OUTPUT and not isinstance(s.arg, ConstantArgument)]
    if OutputKind.USER_INPUT_MUTATION in kinds and not returned:
        raise FpxError("fpx.interop.torch: the program only changes its inputs in place and "
                       "returns nothing; fpx transforms a program's outputs: return the result")
    for spec in sig.output_specs:
        # an in-place op on an input (ReLU(inplace=True) on the module's input) is in the
        # graph as its out-of-place twin, and later nodes read the new value: the outputs keep
        # their meaning; only the write-back to the caller's tensor is dropped
        if spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.USER_INPUT_MUTATION):
            raise FpxError(f"fpx.interop.torch: the program mutates state ({spec.kind.name} "
                           f"'{spec.target}'); fpx bounds pure programs: call module.eval() "
                           "(batch-norm statistics) or remove the in-place state update")
    return inputs


def _calls(nodes, xp):
    """``[(node, handler, Ctx)]`` of the graph's calls; raises naming every unmapped op."""
    calls, unmapped = [], []
    for n in nodes:
        if n.op != "call_function":
            continue
        if n.target is operator.getitem:
            name, h = "<built-in function getitem>", getitem
        else:
            name, h = lookup(n.target) if hasattr(n.target, "overloadpacket") else \
                (str(n.target), None)
        if h is None:
            unmapped.append(f"'{name}' (node {n.name})")
        layouts = [layout_of(a.meta.get("val")) if isinstance(a, torch.fx.Node) else None
                   for a in n.args]
        calls.append((n, h, Ctx(name, meta_of(n.meta.get("val")), xp, layouts)))
    if unmapped:
        op = unmapped[0].split("'")[1]
        raise UnmappedOpError(op, f" (in the exported graph; all unmapped: "
                                  f"{', '.join(unmapped)})")
    return calls


def _frees(calls, out_node):
    """For each call (and the output), the values whose last use it is."""
    last = {}
    for i, (n, _, _) in enumerate(calls):
        for a in n.all_input_nodes:
            last[a] = i
    for a in out_node.all_input_nodes:
        last[a] = len(calls)
    frees = [[] for _ in range(len(calls) + 1)]
    for a, i in last.items():
        frees[i].append(a)
    return frees


def _substitute(a, env):
    """A node's argument with graph nodes replaced by their values."""
    if isinstance(a, torch.fx.Node):
        return env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_substitute(x, env) for x in a)
    if isinstance(a, dict):
        return {k: _substitute(v, env) for k, v in a.items()}
    return a


def _binder(args):
    """``env -> _substitute(args, env)`` for a node's positional arguments, laid out once per
    node (the graph walk's per-call cost, a thousand calls per run in a recurrent model):
    the constants in place, the graph nodes' slots, the containers that hold nodes."""
    template = list(args)
    slots = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.fx.Node)]
    nested = [(i, a) for i, a in enumerate(args)
              if isinstance(a, (list, tuple, dict)) and _has_node(a)]

    def bind(env):
        vals = template.copy()
        for i, a in slots:
            vals[i] = env[a]
        for i, a in nested:
            vals[i] = _substitute(a, env)
        return vals
    return bind


def _has_node(a):
    if isinstance(a, torch.fx.Node):
        return True
    if isinstance(a, (list, tuple)):
        return any(_has_node(x) for x in a)
    if isinstance(a, dict):
        return any(_has_node(x) for x in a.values())
    return False


def graph_fn(ep, xp=np):
    """The fpx function ``fn(params, *args, **kwargs)`` of an exported program: each node's
    handler in graph order, its result conformed to torch's dtype and shape, every value
    freed after its last use."""
    from torch.export.graph_signature import OutputKind
    nodes = list(ep.graph.nodes)
    inputs, calls, out_node = _inputs(ep), _calls(nodes, xp), nodes[-1]
    frees = _frees(calls, out_node)
    steps = [(n, h, ctx, _binder(n.args), n.kwargs, frees[i])
             for i, (n, h, ctx) in enumerate(calls)]
    n_user = sum(1 for _, k, _ in inputs if k == "user")
    out_spec = ep.call_spec.out_spec
    user_out = [i for i, s in enumerate(ep.graph_signature.output_specs)
                if s.kind == OutputKind.USER_OUTPUT]

    def fn(params, *args, **kwargs):
        user_vals = [x for x in _pytree.tree_leaves((args, kwargs)) if is_arr(x)]
        if len(user_vals) != n_user:
            raise TypeError(f"fpx.interop.torch: the exported program takes {n_user} array "
                            f"input(s), got {len(user_vals)}")
        env, it = {}, iter(user_vals)
        for n, kind, ref in inputs:
            env[n] = next(it) if kind == "user" else ref if kind == "const" else params[ref]
        # torch's ops do not warn (log(0), 0/0): NumPy's evaluation of them neither
        with np.errstate(all="ignore"):
            for n, h, ctx, args_of, kwargs, dead_here in steps:
                kw = _substitute(kwargs, env) if kwargs else {}
                env[n] = conform(h(ctx, *args_of(env), **kw), ctx)
                for dead in dead_here:
                    if dead in env and dead is not n:
                        del env[dead]
        outs = [_substitute(a, env) for a in out_node.args[0]]
        return _pytree.tree_unflatten([outs[i] for i in user_out], out_spec)
    return fn
