"""The builder fpx puts in place of Triton's interpreter builder: every op of a kernel as an fpx
op on values that may be tracers (float data) or concrete NumPy arrays (integers, pointers).

Each handle's data carries a leading *program axis* of length 1 or P (the programs of a grid
run together, :mod:`fpx.interop.triton.launch`): a scalar is ``(B,)``, a block of shape S is
``(B,) + S``. Floating-point ops call :mod:`fpx.numpy` (so ``bind`` and the current transform's
rules); integer, pointer and mask arithmetic is exact and runs on concrete arrays. Ops without
a mapping raise :class:`UnsupportedTritonOpError` naming the builder method.
"""
from __future__ import annotations

import numpy as np
import triton.language as tl
from triton._C.libtriton import ir as _ir  # type: ignore
from triton.runtime import interpreter as _interp

import fpx.numpy as fnp
from fpx import formats
from fpx.core import EVAL, FpxError, Tracer, UnsupportedOpError, using


class UnsupportedTritonOpError(UnsupportedOpError):
    """A Triton builder op (or a use of one) fpx has no semantics for: never silently exact."""

    def __init__(self, op: str, why: str = ""):
        FpxError.__init__(self, f"fpx.interop.triton: Triton op '{op}' is not supported under "
                                f"fpx transforms{': ' + why if why else ''}")
        self.prim, self.interpreter, self.op = None, None, op


class Diverged(Exception):
    """Programs run together took different Python paths (a branch or trip count that depends
    on the program id): the launch is rerun one program at a time."""


class Handle(_interp.TensorHandle):
    """A TensorHandle whose data is an fpx value with the program axis in front."""

    def __post_init__(self):
        pass


class Poison:
    """The value an atomic returns where the order of the programs' updates decides it."""

    def __init__(self, op):
        self.op = op


_NP = {tl.int1: np.dtype(bool), tl.int8: np.dtype(np.int8), tl.uint8: np.dtype(np.uint8),
       tl.int16: np.dtype(np.int16), tl.uint16: np.dtype(np.uint16),
       tl.int32: np.dtype(np.int32), tl.uint32: np.dtype(np.uint32),
       tl.int64: np.dtype(np.int64), tl.uint64: np.dtype(np.uint64),
       tl.float16: np.dtype(np.float16), tl.float32: np.dtype(np.float32),
       tl.float64: np.dtype(np.float64), tl.bfloat16: formats.bfloat16.dtype,
       tl.float8e5: formats.float8_e5m2.dtype, tl.float8e4nv: formats.float8_e4m3fn.dtype}


def np_dtype(ty):
    """The NumPy dtype fpx stores a Triton scalar type in (bf16/fp8: ml_dtypes)."""
    ty = getattr(ty, "scalar", ty)
    if isinstance(ty, tl.pointer_type):
        return np.dtype(np.uint64)
    try:
        return _NP[ty]
    except KeyError:
        raise UnsupportedTritonOpError(f"dtype {ty}") from None


def data(h):
    """A handle's data (a Poison raises: the kernel used an order-dependent atomic result)."""
    d = h.data
    if isinstance(d, Poison):
        raise UnsupportedTritonOpError(
            d.op, "its returned old value is used, and where several programs update one "
            "address that value depends on the order the GPU runs them in")
    return d


def traced(*xs) -> bool:
    return any(isinstance(x, Tracer) for x in xs)


def ns(*xs):
    """fpx.numpy for traced values, NumPy for concrete ones (integers, pointers, constants:
    exact, or computed by the program from constants alone)."""
    return fnp if traced(*xs) else np


def concrete(x, why):
    """A concrete NumPy array for Python control, masks and addresses (a transform may record
    that the value was uncertain: ``to_concrete``)."""
    if isinstance(x, Tracer):
        x = x._interp.to_concrete(x, why)
        while isinstance(x, Tracer):
            x = x._interp.to_concrete(x, why)
    return np.asarray(x)


def _h(x, ty):
    return Handle(x, ty.scalar if hasattr(ty, "scalar") else ty)


def is_float(x) -> bool:
    """A floating-point value (float16/32/64, bfloat16, float8): its arithmetic rounds, so it
    always goes through fpx -- constants too (the transform bounds their rounding)."""
    return np.dtype(x.dtype).kind in "fV"


def _bin(f_np, f_fpx):
    def op(self, a, b):
        x, y = data(a), data(b)
        if traced(x, y) or is_float(x):
            return _h(f_fpx(x, y), a.dtype)
        with np.errstate(all="ignore"):
            out = f_np(x, y)
        if out.dtype.kind in "iu" and out.dtype != np_dtype(a.dtype):
            out = out.astype(np_dtype(a.dtype))
        return _h(out, a.dtype)
    return op


def _cmp(f_np, f_fpx):
    def op(self, a, b):
        x, y = data(a), data(b)
        return _h(f_fpx(x, y) if traced(x, y) else f_np(x, y), tl.int1)
    return op


def _un(f_fpx):
    def op(self, a):
        x = data(a)
        if not traced(x) and not is_float(x):          # integers: exact
            with np.errstate(all="ignore"), using(EVAL):
                return _h(f_fpx(x), a.dtype)
        return _h(f_fpx(x), a.dtype)
    return op


def _num(f, x, y):
    """IEEE minNum/maxNum (``fmin``/``fmax``): a NaN operand gives the other."""
    return fnp.where(fnp.isnan(x), y, fnp.where(fnp.isnan(y), x, f(x, y)))


def _intop(f):
    def op(self, a, b):
        x, y = concrete(data(a), "integer op"), concrete(data(b), "integer op")
        with np.errstate(all="ignore"):
            return _h(f(x, y).astype(np_dtype(a.dtype)), a.dtype)
    return op


class FpxBuilder:
    """Triton's interpreter builder with fpx semantics (one per launch)."""

    def __init__(self, stock, memory, grid_dim, pids):
        self._stock, self.memory = stock, memory
        self.options, self.codegen_fns, self.arch = stock.options, stock.codegen_fns, stock.arch
        self.grid_dim, self.pids = grid_dim, pids       # pids: 3 int32 arrays of shape (B,)

    def __getattr__(self, name):
        if name.startswith("get_") and (name.endswith("_ty") or name in (
                "get_int1", "get_int8", "get_uint8", "get_int16", "get_uint16", "get_int32",
                "get_uint32", "get_int64", "get_uint64", "get_fp16", "get_fp32", "get_fp64",
                "get_null_value", "get_all_ones_value", "get_cache_policy")):
            return getattr(self._stock, name)
        if name in ("set_grid_idx", "set_grid_dim"):
            return getattr(self._stock, name)
        raise UnsupportedTritonOpError(name)

    @property
    def programs(self) -> int:
        """How many programs run together (the program axis' full length)."""
        return int(np.shape(self.pids[0])[0])

    def get_bf16(self, value):
        return _h(np.array([value], dtype=np_dtype(tl.bfloat16)), tl.bfloat16)

    def get_cache_policy(self, *a):
        return None

    # -- programming model --------------------------------------------------------------------
    def create_get_program_id(self, axis):
        return _h(self.pids[axis], tl.int32)

    def create_get_num_programs(self, axis):
        return _h(np.array([self.grid_dim[axis]], dtype=np.int32), tl.int32)

    def create_make_range(self, ret_ty, start, stop):
        return _h(np.arange(start, stop, dtype=np.int32)[None], tl.int32)

    # -- memory (fpx.interop.triton.memory) -----------------------------------------------------
    def create_load(self, ptr, cache_policy, is_volatile):
        return self.create_masked_load(ptr, None, None, cache_policy, is_volatile)

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        ty = ptrs.get_element_ty()
        m = None if mask is None else concrete(data(mask), "a load mask")
        o = None if other is None else data(other)
        v = self.memory.load(data(ptrs), m, o, np_dtype(ty))
        if np_dtype(ty).kind in "iub":
            v = concrete(v, "an integer load")
        return _h(v, ty)

    def create_store(self, ptr, val, cache_policy):
        return self.create_masked_store(ptr, val, None, cache_policy)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        m = None if mask is None else concrete(data(mask), "a store mask")
        self.memory.store(data(ptrs), data(value), m)

    def create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):
        name = str(rmwOp).split(".")[-1].lower()
        m = None if mask is None else concrete(data(mask), "an atomic mask")
        if name not in ("fadd", "add", "max", "min", "umax", "umin", "xchg"):
            raise UnsupportedTritonOpError(f"atomic_rmw {name}")
        old = self.memory.atomic(name, data(ptr), data(val), m, self.programs)
        return _h(old, val.dtype)

    def atomic_float(self, op, ptr, val, mask):
        """A float atomic max/min (``launch`` routes ``tl.atomic_max``/``min`` here)."""
        m = None if mask is None else concrete(data(mask), "an atomic mask")
        return _h(self.memory.atomic(op, data(ptr), data(val), m, self.programs), val.dtype)

    def create_atomic_load(self, ptr, mask, sem, scope):
        return self.create_masked_load(ptr, mask, None, None, True)

    def create_atomic_store(self, ptr, val, mask, sem, scope):
        return self.create_masked_store(ptr, val, mask, None)

    def create_make_tensor_descriptor(self, base, shape, strides, tensor_shape, is_signed,
                                      padding="zero"):
        desc = _interp.TensorDescHandle(base, shape, strides, tensor_shape, padding)
        desc.validate()
        return desc

    def _desc_ptrs(self, desc, offsets):
        nd = len(desc.block_shape)
        isz = desc.base.dtype.element_ty.primitive_bitwidth // 8
        ptrs = np.asarray(data(desc.base), np.uint64).reshape((-1,) + (1,) * nd)
        mask = np.ones((1,) * (nd + 1), bool)
        for d, bs in enumerate(desc.block_shape):
            shp = [1] * (nd + 1)
            shp[d + 1] = bs
            start = concrete(data(offsets[d]), "a descriptor offset").astype(np.int64)
            off = start.reshape((-1,) + (1,) * nd) + np.arange(bs).reshape(shp)
            stride = concrete(data(desc.strides[d]), "a stride").astype(np.int64).reshape(
                (-1,) + (1,) * nd)
            size = concrete(data(desc.shape[d]), "a shape").astype(np.int64).reshape(
                (-1,) + (1,) * nd)
            ptrs = ptrs + (isz * off * stride).astype(np.uint64)
            mask = mask & (off >= 0) & (off < size)
        return ptrs, np.broadcast_to(mask, ptrs.shape)

    def create_descriptor_load(self, desc, indices, cache_policy):
        ptrs, mask = self._desc_ptrs(desc, indices)
        ty = desc.base.dtype.element_ty
        dt = np_dtype(ty)
        fill = np.nan if desc.padding == _ir.PADDING_OPTION.PAD_NAN else 0
        v = self.memory.load(ptrs, mask, np.array(fill, dt), dt)
        if desc.round_f32_to_tf32 and ty == tl.float32:
            v = fnp.astype(fnp.astype(v, formats.tf32), np.float32)
        return _h(v, ty)

    def create_descriptor_store(self, desc, value, indices):
        ptrs, mask = self._desc_ptrs(desc, indices)
        self.memory.store(ptrs, data(value), mask)

    def create_descriptor_reduce(self, kind, desc, value, indices):
        """``desc.atomic_add/min/max``: the atomics of the block's elements."""
        op = str(kind).split(".")[-1].lower()
        if op not in ("add", "min", "max"):
            raise UnsupportedTritonOpError(f"descriptor atomic_{op}")
        ptrs, mask = self._desc_ptrs(desc, indices)
        self.memory.atomic(op, ptrs, data(value), mask, self.programs)

    def _gather_ptrs(self, desc, x_offsets, y_offset):
        """Pointers and mask of rows ``x_offsets`` (B, n), columns from ``y_offset``."""
        isz = desc.base.dtype.element_ty.primitive_bitwidth // 8
        rows = concrete(data(x_offsets), "gather rows").astype(np.int64)[..., None]
        start = concrete(data(y_offset), "gather column").astype(np.int64).reshape(-1, 1, 1)
        cols = start + np.arange(desc.block_shape[-1]).reshape(1, 1, -1)
        s0, n0, n1 = (int(concrete(data(h), "a descriptor").reshape(-1)[0])
                      for h in (desc.strides[0], desc.shape[0], desc.shape[1]))
        base = np.asarray(data(desc.base), np.uint64).reshape(-1, 1, 1)
        ptrs = base + (isz * (rows * s0 + cols)).astype(np.uint64)
        mask = (rows >= 0) & (rows < n0) & (cols >= 0) & (cols < n1)
        return ptrs, np.broadcast_to(mask, ptrs.shape)

    def create_descriptor_gather(self, desc, x_offsets, y_offset, type):
        ptrs, mask = self._gather_ptrs(desc, x_offsets, y_offset)
        dt = np_dtype(desc.base.dtype.element_ty)
        return _h(self.memory.load(ptrs, mask, np.zeros((), dt), dt),
                  desc.base.dtype.element_ty)

    def create_descriptor_scatter(self, desc, value, x_offsets, y_offset):
        ptrs, mask = self._gather_ptrs(desc, x_offsets, y_offset)
        self.memory.store(ptrs, data(value), mask)

    # -- casts ------------------------------------------------------------------------------------
    def _cast(self, src, dst_type):
        x, dt = data(src), np_dtype(dst_type)
        if dt.kind in "iub":
            x = concrete(x, "a cast to an integer") if traced(x) and dt.kind != "b" else x
            if traced(x):
                return _h(fnp.astype(x, dt), dst_type)
            with np.errstate(all="ignore"):
                return _h(np.asarray(x).astype(dt), dst_type)
        if np.dtype(x.dtype) == dt:
            return _h(x, dst_type)
        return _h(fnp.astype(x, dt), dst_type)       # a float result rounds: through fpx

    create_si_to_fp = create_ui_to_fp = create_fp_to_si = create_fp_to_ui = _cast
    create_fp_ext = create_fp_trunc = _cast

    def create_int_cast(self, src, dst_type, is_signed):
        return self._cast(src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if rounding_mode not in (None, _ir.ROUNDING_MODE.RTNE):
            raise UnsupportedTritonOpError("fp_to_fp", f"rounding mode {rounding_mode}")
        return self._cast(src, dst_type)

    def create_bitcast(self, src, dst_type):
        x = data(src)
        if traced(x):
            raise UnsupportedTritonOpError("bitcast", "of a traced floating-point value (its "
                                           "bits are not a value fpx can bound)")
        return _h(np.asarray(x).view(np_dtype(dst_type)), dst_type)

    create_int_to_ptr = create_ptr_to_int = create_bitcast

    # -- arithmetic ---------------------------------------------------------------------------------
    create_fadd = _bin(np.add, fnp.add)
    create_fsub = _bin(np.subtract, fnp.subtract)
    create_fmul = _bin(np.multiply, fnp.multiply)
    create_fdiv = create_precise_divf = create_approx_divf = _bin(np.divide, fnp.divide)
    create_add = _intop(np.add)
    create_sub = _intop(np.subtract)
    create_mul = _intop(np.multiply)
    create_shl = _intop(np.left_shift)
    create_lshr = _intop(np.right_shift)
    create_and = _bin(np.bitwise_and, fnp.logical_and)
    create_or = _bin(np.bitwise_or, fnp.logical_or)
    create_xor = _bin(np.bitwise_xor, fnp.logical_xor)
    create_minsi = create_minui = _intop(np.minimum)
    create_maxsi = create_maxui = _intop(np.maximum)
    create_minimumf = _bin(np.minimum, fnp.minimum)
    create_maximumf = _bin(np.maximum, fnp.maximum)
    create_minnumf = _bin(np.fmin, lambda x, y: _num(fnp.minimum, x, y))
    create_maxnumf = _bin(np.fmax, lambda x, y: _num(fnp.maximum, x, y))

    def create_ashr(self, a, b):
        x, y = concrete(data(a), "shift"), concrete(data(b), "shift")
        return _h(np.right_shift(x, y).astype(x.dtype), a.dtype)

    def create_idiv(self, a, b):
        x, y = concrete(data(a), "integer division"), concrete(data(b), "integer division")
        with np.errstate(all="ignore"):
            return _h(((x - np.fmod(x, y)) // y).astype(x.dtype), a.dtype)

    create_sdiv = create_udiv = create_idiv
    create_srem = create_urem = _intop(np.fmod)

    for _n, _f, _g in (("EQ", np.equal, fnp.equal), ("NE", np.not_equal, fnp.not_equal),
                       ("LT", np.less, fnp.less), ("LE", np.less_equal, fnp.less_equal),
                       ("GT", np.greater, fnp.greater), ("GE", np.greater_equal,
                                                         fnp.greater_equal)):
        locals()[f"create_fcmpO{_n}"] = _cmp(_f, _g)
        locals()[f"create_icmp{_n}"] = _cmp(_f, _g)
        locals()[f"create_icmpS{_n}"] = _cmp(_f, _g)
        locals()[f"create_icmpU{_n}"] = _cmp(_f, _g)
    create_fcmpUNE = _cmp(np.not_equal, fnp.not_equal)
    del _n, _f, _g

    def create_fneg(self, a):
        x = data(a)
        return _h(fnp.negative(x) if traced(x) else -x, a.dtype)

    create_fabs = _un(fnp.abs)
    create_iabs = _un(fnp.abs)
    create_floor = _un(fnp.floor)
    create_ceil = _un(fnp.ceil)
    create_exp = _un(fnp.exp)
    create_exp2 = _un(fnp.exp2)
    create_log = _un(fnp.log)
    create_log2 = _un(fnp.log2)
    create_sin = _un(fnp.sin)
    create_cos = _un(fnp.cos)
    create_sqrt = create_precise_sqrt = _un(fnp.sqrt)
    create_erf = _un(fnp.erf)

    def create_rsqrt(self, a):
        x = data(a)
        return _h(fnp.divide(np.ones((), x.dtype), fnp.sqrt(x)), a.dtype)

    def create_fma(self, x, y, z):
        return _h(fnp.fma(data(x), data(y), data(z)), z.dtype)

    def create_select(self, c, a, b):
        cond, x, y = data(c), data(a), data(b)
        if traced(cond, x, y):
            return _h(fnp.where(cond, x, y), a.dtype)
        return _h(np.where(cond, x, y), a.dtype)

    def create_clampf(self, arg, lo, hi, propagate_nans):
        x, a, b = data(arg), data(lo), data(hi)
        xp = ns(x, a, b)
        return _h(xp.minimum(xp.maximum(x, a), b), arg.dtype)

    # -- shapes (the program axis stays in front) ------------------------------------------------
    def create_splat(self, ret_ty, arg):
        x, shape = data(arg), tuple(ret_ty.shape)
        xp = ns(x)
        x = xp.reshape(x, (np.shape(x)[0],) + (1,) * len(shape)) if np.ndim(x) == 1 else x
        return _h(xp.broadcast_to(x, (np.shape(x)[0],) + shape), arg.dtype)

    def create_unsplat(self, arg):
        x = data(arg)
        return _h(ns(x).reshape(x, (np.shape(x)[0],)), arg.dtype)

    def create_broadcast(self, arg, shape):
        x = data(arg)
        return _h(ns(x).broadcast_to(x, (np.shape(x)[0],) + tuple(shape)), arg.dtype)

    def create_expand_dims(self, arg, axis):
        x = data(arg)
        axis = axis + np.ndim(x) if axis < 0 else axis + 1
        return _h(ns(x).expand_dims(x, axis), arg.dtype)

    def create_reshape(self, arg, shape, allow_reorder):
        x = data(arg)
        return _h(ns(x).reshape(x, (np.shape(x)[0],) + tuple(shape)), arg.dtype)

    def create_trans(self, arg, perm):
        x = data(arg)
        return _h(ns(x).transpose(x, (0,) + tuple(p + 1 for p in perm)), arg.dtype)

    def create_cat(self, lhs, rhs):
        x, y = _common(data(lhs), data(rhs))
        return _h(ns(x, y).concatenate([x, y], axis=1), lhs.dtype)

    def create_join(self, lhs, rhs):
        x, y = _common(data(lhs), data(rhs))
        return _h(ns(x, y).stack([x, y], axis=-1), lhs.dtype)

    def create_split(self, val):
        x = data(val)
        return _h(x[..., 0], val.dtype), _h(x[..., 1], val.dtype)

    def create_gather(self, src, indices, axis):
        x, idx = data(src), concrete(data(indices), "gather indices")
        b = max(np.shape(x)[0], idx.shape[0])
        x = ns(x).broadcast_to(x, (b,) + tuple(np.shape(x)[1:]))
        idx = np.broadcast_to(idx, (b,) + idx.shape[1:])
        return _h(ns(x).take_along_axis(x, idx, axis=axis + 1), src.dtype)

    def create_addptr(self, ptr, offset):
        isz = max(1, ptr.get_element_ty().primitive_bitwidth // 8)
        off = concrete(data(offset), "a pointer offset")
        return Handle(np.asarray(data(ptr)) + (isz * off.astype(np.int64)).astype(np.uint64),
                      ptr.dtype)

    # -- dot ---------------------------------------------------------------------------------------
    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        from fpx.interop.triton.dot import dot
        prec = str(input_precision).split(".")[-1].lower() if input_precision is not None \
            else "ieee"
        return _h(dot(data(a), data(b), data(d), prec), d.dtype)

    # -- no-ops and checks ----------------------------------------------------------------------
    def create_barrier(self):
        pass

    def create_assert(self, condition, message):
        c = concrete(data(condition), "device_assert")
        if not np.all(c):
            raise AssertionError(message)

    def create_assume(self, condition):
        pass

    def create_print(self, prefix, hex, values, isSigned):
        for v in values:
            print(f"{prefix} {data(v)}")


def _common(x, y):
    """Two values with one program-axis length."""
    b = max(np.shape(x)[0], np.shape(y)[0])
    return (ns(x).broadcast_to(x, (b,) + tuple(np.shape(x)[1:])),
            ns(y).broadcast_to(y, (b,) + tuple(np.shape(y)[1:])))
