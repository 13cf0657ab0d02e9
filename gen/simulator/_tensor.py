"""Register tensors of the simulator: torch CPU tensors with Triton's type-promotion and integer semantics.

A `Tensor` is a torch tensor plus its Gluon dtype and (carried, never interpreted) distributed layout.
Scalars (program ids, runtime int/float kernel arguments, loop counters, reductions to 0-d) are 0-d Tensors,
so int32 arithmetic wraps like on the GPU and `//` / `%` truncate toward zero like PTX, not like Python.
A `PtrTensor` models a (tensor of) global pointer(s) as (flat typed view of a torch storage, int64 element
offsets).
"""
from __future__ import annotations

import math
import numbers

import torch
import triton.language.core as tlc
from triton.experimental.gluon.language._layouts import AutoLayout, DistributedLayout, SliceLayout
from triton.language.semantic import TritonSemantic

from ._dtypes import as_gl, from_torch, to_torch, unwrap
from .errors import SimulationError

_sem = object.__new__(TritonSemantic)  # only its pure type-promotion helpers are used


def _scalar_dtype(x):
    if isinstance(x, bool):
        return tlc.int1
    if isinstance(x, int):
        if -2**31 <= x < 2**31:
            return tlc.int32
        if 2**31 <= x < 2**32:
            return tlc.uint32
        if -2**63 <= x < 2**63:
            return tlc.int64
        if 2**63 <= x < 2**64:
            return tlc.uint64
        raise SimulationError(f"Nonrepresentable integer {x}.")
    if isinstance(x, float):
        a = abs(x)
        if a == float("inf") or a == 0.0 or x != x or 2**-126 <= a <= (2 - 2**-23) * 2**127:
            return tlc.float32
        return tlc.float64
    raise SimulationError(f"cannot convert {x!r} of type {type(x).__name__} to a tensor")


def _is_num(x):
    return isinstance(x, numbers.Number) and not isinstance(x, Tensor)


def _layout_of(x):
    return x.layout if isinstance(x, (Tensor, PtrTensor)) else None


def _concrete(layout):
    return layout is not None and not isinstance(layout, AutoLayout)


def merge_layouts(*layouts):
    """Layout of an elementwise result; raises like the compiler when two concrete layouts differ."""
    out = None
    for lay in layouts:
        if lay is None:
            continue
        if out is None or not _concrete(out):
            out = lay
        elif _concrete(lay) and lay != out:
            raise SimulationError(f"Layout mismatch in broadcast: {out} vs {lay}")
    return out


def broadcast_shapes(*shapes):
    """Triton broadcasting: ranks must match (0-d scalars broadcast to anything)."""
    out = None
    for s in shapes:
        s = list(s)
        if not s:
            continue
        if out is None:
            out = s
            continue
        if len(s) != len(out):
            raise SimulationError(f"Cannot broadcast, rank mismatch: {out}, {s}")
        new = []
        for i, (a, b) in enumerate(zip(out, s)):
            if a == 1:
                new.append(b)
            elif b == 1 or a == b:
                new.append(a)
            else:
                raise SimulationError(f"Cannot broadcast: incompatible dimensions at index {i}: {a} and {b}")
        out = new
    return out or []


class TensorType:
    """Stand-in for gl.distributed_type / a scalar dtype: what kernels read off `x.type`."""

    def __init__(self, dtype, shape, layout):
        self.element_ty = dtype
        self.scalar = dtype
        self.shape = list(shape)
        self.layout = layout

    def is_block(self):
        return bool(self.shape)

    def get_block_shapes(self):
        return list(self.shape)

    @property
    def nbytes(self):
        return math.prod(self.shape) * (self.element_ty.primitive_bitwidth // 8)

    def __repr__(self):
        return f"<{self.shape}, {self.element_ty}, {self.layout}>"


class Tensor:
    __slots__ = ("t", "dtype", "layout")

    def __init__(self, t: torch.Tensor, dtype=None, layout=None):
        if dtype is None:
            dtype = from_torch(t.dtype)
        self.t = t
        self.dtype = dtype
        self.layout = layout

    # ------------------------------------------------------------------ metadata
    @property
    def shape(self):
        return list(self.t.shape)

    @property
    def type(self):
        return TensorType(self.dtype, self.shape, self.layout) if self.t.dim() else self.dtype

    @property
    def numel(self):
        return self.t.numel()

    @property
    def rank(self):
        return self.t.dim()

    def __repr__(self):
        if self.t.dim() == 0:
            return f"Tensor({self.t.item()!r}, {self.dtype})"
        return f"Tensor(shape={self.shape}, {self.dtype}, layout={self.layout})"

    # ------------------------------------------------------------------ python protocol
    def __bool__(self):
        if self.t.numel() != 1:
            raise SimulationError(f"the truth value of a tensor of shape {self.shape} is ambiguous "
                                  "(only scalars can drive `if`/`while`)")
        return bool(self.t.item())

    def __index__(self):
        if self.t.numel() != 1 or not (self.dtype.is_int() or self.dtype.is_bool()):
            raise SimulationError(f"cannot use {self!r} as an integer index")
        return int(self.t.item())

    def __int__(self):
        return int(self.t.item())

    def __float__(self):
        return float(self.t.item())

    __hash__ = object.__hash__

    def __iter__(self):
        raise SimulationError("tensors are not iterable in Gluon")

    def item(self):
        return self.t.item()

    # ------------------------------------------------------------------ casts
    def to(self, dtype, fp_downcast_rounding=None, bitcast=False):
        return cast(self, dtype, fp_downcast_rounding=fp_downcast_rounding, bitcast=bitcast)

    def cast(self, dtype, fp_downcast_rounding=None, bitcast=False):
        return cast(self, dtype, fp_downcast_rounding=fp_downcast_rounding, bitcast=bitcast)

    # ------------------------------------------------------------------ arithmetic
    def __add__(self, o):
        return NotImplemented if isinstance(o, PtrTensor) else arith(self, o, torch.add)

    def __radd__(self, o):
        return arith(o, self, torch.add)

    def __sub__(self, o):
        return NotImplemented if isinstance(o, PtrTensor) else arith(self, o, torch.sub)

    def __rsub__(self, o):
        return arith(o, self, torch.sub)

    def __mul__(self, o):
        return arith(self, o, torch.mul)

    def __rmul__(self, o):
        return arith(o, self, torch.mul)

    def __truediv__(self, o):
        return truediv(self, o)

    def __rtruediv__(self, o):
        return truediv(o, self)

    def __floordiv__(self, o):
        return floordiv(self, o)

    def __rfloordiv__(self, o):
        return floordiv(o, self)

    def __mod__(self, o):
        return mod(self, o)

    def __rmod__(self, o):
        return mod(o, self)

    def __neg__(self):
        if self.dtype.is_bool():
            return arith(0, self, torch.sub)
        return Tensor(torch.neg(self.t), self.dtype, self.layout)

    def __pos__(self):
        return self

    def __invert__(self):
        if self.dtype.is_floating():
            raise SimulationError("~ is not defined on floating point tensors")
        return Tensor(torch.bitwise_not(self.t), self.dtype, self.layout)

    def __abs__(self):
        return abs_(self)

    def __and__(self, o):
        return bitwise(self, o, torch.bitwise_and)

    def __rand__(self, o):
        return bitwise(o, self, torch.bitwise_and)

    def __or__(self, o):
        return bitwise(self, o, torch.bitwise_or)

    def __ror__(self, o):
        return bitwise(o, self, torch.bitwise_or)

    def __xor__(self, o):
        return bitwise(self, o, torch.bitwise_xor)

    def __rxor__(self, o):
        return bitwise(o, self, torch.bitwise_xor)

    def __lshift__(self, o):
        return bitwise(self, o, torch.bitwise_left_shift)

    def __rlshift__(self, o):
        return bitwise(o, self, torch.bitwise_left_shift)

    def __rshift__(self, o):
        return bitwise(self, o, torch.bitwise_right_shift)

    def __rrshift__(self, o):
        return bitwise(o, self, torch.bitwise_right_shift)

    def __lt__(self, o):
        return compare(self, o, torch.lt)

    def __le__(self, o):
        return compare(self, o, torch.le)

    def __gt__(self, o):
        return compare(self, o, torch.gt)

    def __ge__(self, o):
        return compare(self, o, torch.ge)

    def __eq__(self, o):
        return compare(self, o, torch.eq)

    def __ne__(self, o):
        return compare(self, o, torch.ne)

    def logical_and(self, o):
        return logical(self, o, torch.logical_and)

    def logical_or(self, o):
        return logical(self, o, torch.logical_or)

    # ------------------------------------------------------------------ shape manipulation
    def __getitem__(self, slices):
        return getitem(self, slices)

    def expand_dims(self, axis):
        return expand_dims(self, axis)

    def broadcast_to(self, *shape):
        return broadcast_to(self, *shape)

    def reshape(self, *shape, can_reorder=False):
        return reshape(self, *shape, can_reorder=can_reorder)

    def view(self, *shape):
        return reshape(self, *shape)

    def permute(self, *dims):
        return permute(self, *dims)

    def trans(self, *dims):
        return trans(self, *dims)

    @property
    def T(self):
        return trans(self)

    def split(self):
        return split(self)

    def ravel(self):
        return reshape(self, [self.numel])

    # ------------------------------------------------------------------ reductions / math members
    def sum(self, axis=None, keep_dims=False, dtype=None):
        return sum_(self, axis, keep_dims, dtype)

    def max(self, axis=None, return_indices=False, return_indices_tie_break_left=True, keep_dims=False):
        return max_(self, axis, return_indices, return_indices_tie_break_left, keep_dims)

    def min(self, axis=None, return_indices=False, return_indices_tie_break_left=True, keep_dims=False):
        return min_(self, axis, return_indices, return_indices_tie_break_left, keep_dims)

    def reduce(self, axis, combine_fn, keep_dims=False):
        return reduce_(self, axis, combine_fn, keep_dims)

    def exp(self):
        return unary_math(self, "exp")

    def exp2(self):
        return unary_math(self, "exp2")

    def log(self):
        return unary_math(self, "log")

    def log2(self):
        return unary_math(self, "log2")

    def sqrt(self):
        return unary_math(self, "sqrt")

    def abs(self):
        return abs_(self)


class PtrTensor:
    """Global pointer(s): `base` is a flat typed view of a whole torch storage, `offs` int64 element offsets."""
    __slots__ = ("base", "offs", "elem", "layout", "name")

    def __init__(self, base, offs, elem, layout=None, name="ptr"):
        self.base = base
        self.offs = offs
        self.elem = elem
        self.layout = layout
        self.name = name

    @staticmethod
    def from_torch(t: torch.Tensor, name="ptr"):
        st = t.untyped_storage()
        es = t.element_size()
        base = torch.empty(0, dtype=t.dtype).set_(st, 0, (st.nbytes() // es,), (1,))
        return PtrTensor(base, torch.tensor(t.storage_offset(), dtype=torch.int64), from_torch(t.dtype),
                         None, name)

    @property
    def dtype(self):
        return tlc.pointer_type(self.elem)

    @property
    def shape(self):
        return list(self.offs.shape)

    @property
    def type(self):
        if self.offs.dim():
            return TensorType(self.dtype, self.shape, self.layout)
        return self.dtype

    @property
    def numel(self):
        return self.offs.numel()

    def __repr__(self):
        return f"PtrTensor({self.name}, shape={self.shape}, {self.elem})"

    def _with(self, offs, layout):
        return PtrTensor(self.base, offs, self.elem, layout, self.name)

    def _offset(self, o, sign):
        if isinstance(o, PtrTensor):
            raise SimulationError("cannot add two pointers")
        if _is_num(o):
            if isinstance(o, float) or isinstance(o, bool):
                raise SimulationError(f"pointer offset must be an integer, got {o!r}")
            o = Tensor(torch.tensor(o, dtype=torch.int64), tlc.int64)
        if not isinstance(o, Tensor) or not o.dtype.is_int():
            raise SimulationError(f"pointer offset must be an integer tensor, got {o!r}")
        broadcast_shapes(self.shape, o.shape)
        lay = merge_layouts(self.layout, o.layout)
        return self._with(self.offs + sign * o.t.to(torch.int64), lay)

    def __add__(self, o):
        return self._offset(o, 1)

    __radd__ = __add__

    def __sub__(self, o):
        return self._offset(o, -1)

    def __getitem__(self, slices):
        shape = getitem_shape(self.shape, slices)
        return self._with(self.offs.reshape(shape), _expand_layout_for_getitem(self.layout, slices))

    def expand_dims(self, axis):
        return expand_dims(self, axis)

    def broadcast_to(self, *shape):
        return broadcast_to(self, *shape)

    def reshape(self, *shape, can_reorder=False):
        return reshape(self, *shape)

    def permute(self, *dims):
        return permute(self, *dims)

    def __eq__(self, o):
        if isinstance(o, PtrTensor):
            return Tensor(torch.eq(self.offs, o.offs) & (self.base.data_ptr() == o.base.data_ptr()), tlc.int1)
        return NotImplemented

    __hash__ = object.__hash__


# ====================================================================================== conversions

def to_tensor(x, dtype=None) -> Tensor:
    x = unwrap(x)
    if isinstance(x, Tensor):
        return x
    if isinstance(x, PtrTensor):
        raise SimulationError("expected a value tensor, got a pointer")
    if _is_num(x):
        dt = dtype if dtype is not None else _scalar_dtype(x)
        return Tensor(torch.tensor(x, dtype=to_torch(dt)), dt)
    raise SimulationError(f"cannot convert {x!r} of type {type(x).__name__} to a tensor")


def _convert(t: torch.Tensor, src, dst) -> torch.Tensor:
    if src == dst:
        return t
    tdst = to_torch(dst)
    if dst.is_bool():
        return t != 0
    if src.is_floating() and dst.is_int():
        # fptosi/fptoui: truncation toward zero (torch does the same); NaN -> implementation defined
        return t.to(torch.float64).trunc().to(tdst) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) \
            else t.to(tdst)
    return t.to(tdst)


def cast(x, dtype, fp_downcast_rounding=None, bitcast=False):
    x = to_tensor(x)
    dtype = as_gl(dtype)
    if bitcast:
        if x.dtype.primitive_bitwidth != dtype.primitive_bitwidth:
            raise SimulationError(f"Cannot bitcast data-type of size {x.dtype.primitive_bitwidth} to data-type "
                                  f"of size {dtype.primitive_bitwidth}")
        return Tensor(x.t.view(to_torch(dtype)), dtype, x.layout)
    t = x.t
    if fp_downcast_rounding == "rtz" and x.dtype.is_fp32() and dtype.primitive_bitwidth == 16:
        t = _round_toward_zero(t, dtype)
    return Tensor(_convert(t, x.dtype, dtype), dtype, x.layout)


def _round_toward_zero(t, dtype):
    tdst = to_torch(dtype)
    r = t.to(tdst)
    back = r.to(torch.float32)
    too_big = back.abs() > t.abs()
    if too_big.any():
        # step one ulp toward zero
        bits = r.view(torch.int16)
        bits = torch.where(too_big, bits - 1, bits)
        r = bits.view(tdst)
    return r


def _promote(a, b, div_or_mod=False, arithmetic_check=True):
    """Returns (ta, tb, dtype) after Triton's implicit casts; python numbers become 0-d tensors."""
    a, b = unwrap(a), unwrap(b)
    a_sc, b_sc = _is_num(a), _is_num(b)
    A = to_tensor(a)
    B = to_tensor(b)
    if arithmetic_check:
        ret = _sem.computation_type_impl(A.dtype, a_sc, B.dtype, b_sc, div_or_mod)
        for sc, v in ((a_sc, a), (b_sc, b)):
            if sc and ret.is_int():
                if v < 0 and ret.is_int_unsigned():
                    raise SimulationError("Cannot perform a binary operation between an unsigned tensor and a "
                                          "negative scalar.")
                if not (ret.get_int_min_value() <= v <= ret.get_int_max_value()):
                    raise SimulationError(f"Scalar {v} is out of range for type {ret}")
        ta = torch.tensor(a, dtype=to_torch(ret)) if a_sc else _convert(A.t, A.dtype, ret)
        tb = torch.tensor(b, dtype=to_torch(ret)) if b_sc else _convert(B.t, B.dtype, ret)
    else:
        ret = None
        ta, tb = A.t, B.t
    broadcast_shapes(A.shape, B.shape)
    return ta, tb, ret, merge_layouts(_layout_of(a), _layout_of(b))


def arith(a, b, op):
    ta, tb, ty, lay = _promote(a, b)
    if ty.is_bool():
        raise SimulationError(f"arithmetic on int1 tensors is not supported ({op.__name__})")
    return Tensor(op(ta, tb), ty, lay)


def truediv(a, b):
    ta, tb, ty, lay = _promote(a, b, div_or_mod=True)
    if ty.is_int():
        ta, tb, ty = ta.to(torch.float32), tb.to(torch.float32), tlc.float32
    return Tensor(torch.div(ta, tb), ty, lay)


def floordiv(a, b):
    ta, tb, ty, lay = _promote(a, b, div_or_mod=True)
    if not ty.is_int():
        raise SimulationError(f"unexpected type {ty} for // (Triton's floordiv is integer-only)")
    if bool((tb == 0).any()):
        raise SimulationError("integer division by zero")
    return Tensor(torch.div(ta, tb, rounding_mode="trunc"), ty, lay)  # sdiv truncates toward zero


def mod(a, b):
    ta, tb, ty, lay = _promote(a, b, div_or_mod=True)
    if ty.is_int() and bool((tb == 0).any()):
        raise SimulationError("integer modulo by zero")
    return Tensor(torch.fmod(ta, tb), ty, lay)  # srem / frem: sign of the dividend


def bitwise(a, b, op):
    ta, tb, ty, lay = _promote(a, b)
    if not ty.is_int():
        raise SimulationError(f"bitwise operation {op.__name__} on non-integer type {ty}")
    if op in (torch.bitwise_left_shift, torch.bitwise_right_shift) and ty.is_bool():
        raise SimulationError("shift of int1")
    return Tensor(op(ta, tb), ty, lay)


def logical(a, b, op):
    A, B = to_tensor(a), to_tensor(b)
    broadcast_shapes(A.shape, B.shape)
    return Tensor(op(A.t != 0, B.t != 0), tlc.int1, merge_layouts(_layout_of(a), _layout_of(b)))


def compare(a, b, op):
    if isinstance(a, PtrTensor) or isinstance(b, PtrTensor):
        raise SimulationError("pointer comparison is not modelled")
    ta, tb, ty, lay = _promote(a, b)
    return Tensor(op(ta, tb), tlc.int1, lay)


def abs_(x):
    x = to_tensor(x)
    if x.dtype.is_int_unsigned() or x.dtype.is_bool():
        return x
    return Tensor(torch.abs(x.t), x.dtype, x.layout)


_UNARY = {
    "exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "log2": torch.log2, "cos": torch.cos,
    "sin": torch.sin, "sqrt": torch.sqrt, "sqrt_rn": torch.sqrt, "rsqrt": torch.rsqrt, "erf": torch.erf,
    "floor": torch.floor, "ceil": torch.ceil,
}
_FP32_ONLY = {"sqrt_rn"}


def unary_math(x, name):
    x = to_tensor(x)
    allowed = ("fp32",) if name in _FP32_ONLY else ("fp32", "fp64")
    if x.dtype.name not in allowed:
        raise SimulationError(f"Expected dtype {list(allowed)} but got {x.dtype.name} (gl.{name})")
    return Tensor(_UNARY[name](x.t), x.dtype, x.layout)


def fdiv(x, y, ieee_rounding=False):
    X, Y = to_tensor(x), to_tensor(y)
    if not X.dtype.is_floating() or not Y.dtype.is_floating():
        raise SimulationError("both operands of fdiv must have floating scalar type")
    ta, tb, ty, lay = _promote(x, y)
    return Tensor(torch.div(ta, tb), ty, lay)


def div_rn(x, y):
    ta, tb, ty, lay = _promote(x, y)
    if not ty.is_fp32():
        raise SimulationError(f"div_rn expects fp32, got {ty}")
    return Tensor(torch.div(ta, tb), ty, lay)


def fma(x, y, z):
    X, Y, Z = to_tensor(x), to_tensor(y), to_tensor(z)
    shape = broadcast_shapes(X.shape, Y.shape, Z.shape)
    ty = X.dtype
    tt = to_torch(ty)
    r = (X.t.to(torch.float64) * Y.t.to(torch.float64) + Z.t.to(torch.float64)).to(tt)
    return Tensor(r.expand(shape) if shape else r, ty, merge_layouts(X.layout, Y.layout, Z.layout))


def umulhi(x, y):
    ta, tb, ty, lay = _promote(x, y)
    bits = ty.primitive_bitwidth
    if bits == 32:
        a64 = ta.to(torch.int64) & 0xFFFFFFFF if ty.is_int_unsigned() else ta.to(torch.int64)
        b64 = tb.to(torch.int64) & 0xFFFFFFFF if ty.is_int_unsigned() else tb.to(torch.int64)
        return Tensor(((a64 * b64) >> 32).to(to_torch(ty)), ty, lay)
    raise SimulationError("umulhi is only modelled for 32-bit integers")


def maximum(x, y, propagate_nan=None):
    return _minmax(x, y, propagate_nan, True)


def minimum(x, y, propagate_nan=None):
    return _minmax(x, y, propagate_nan, False)


def _minmax(x, y, propagate_nan, is_max):
    ta, tb, ty, lay = _promote(x, y)
    if ty.is_floating():
        pn = unwrap(propagate_nan)
        if pn is not None and getattr(pn, "name", str(pn)).upper().endswith("ALL"):
            op = torch.maximum if is_max else torch.minimum
        else:  # PropagateNan.NONE: maxnum/minnum ignore a NaN operand
            op = torch.fmax if is_max else torch.fmin
    else:
        op = torch.maximum if is_max else torch.minimum
    return Tensor(op(ta, tb), ty, lay)


def clamp(x, min, max, propagate_nan=None):
    return minimum(maximum(x, min, propagate_nan), max, propagate_nan)


def where(condition, x, y):
    C = to_tensor(condition)
    if not C.dtype.is_bool():
        C = cast(C, tlc.int1)
    tx, ty_, dt, lay = _promote(x, y)
    shape = broadcast_shapes(C.shape, list(tx.shape), list(ty_.shape))
    out = torch.where(C.t, tx, ty_)
    if list(out.shape) != shape:
        out = out.expand(shape)
    return Tensor(out, dt, merge_layouts(lay, C.layout))


# ====================================================================================== creation

def arange(start, end, layout=None):
    start, end = int(unwrap(start)), int(unwrap(end))
    if end <= start:
        raise SimulationError(f"arange's end argument must be greater than the start argument ({start}, {end})")
    n = end - start
    if n & (n - 1):
        raise SimulationError(f"arange's range must be a power of 2, got {n}")
    return Tensor(torch.arange(start, end, dtype=torch.int32), tlc.int32, unwrap(layout) or AutoLayout())


def _shape_list(shape):
    shape = unwrap(shape)
    if isinstance(shape, (int, Tensor)):
        shape = [shape]
    return [int(unwrap(s)) for s in shape]


def full(shape, value, dtype, layout=None):
    shape = _shape_list(shape)
    dtype = as_gl(dtype)
    value = unwrap(value)
    if isinstance(value, Tensor):
        v = _convert(value.t, value.dtype, dtype)
        t = v.expand(shape).clone() if shape else v.clone()
    else:
        t = torch.full(shape, value, dtype=to_torch(dtype))
    return Tensor(t, dtype, (unwrap(layout) or AutoLayout()) if shape else None)


def zeros(shape, dtype, layout=None):
    return full(shape, 0, dtype, layout)


def full_like(input, value, shape=None, dtype=None, layout=None):
    return full(input.shape if shape is None else shape, value, input.dtype if dtype is None else dtype,
                input.layout if layout is None else layout)


def zeros_like(input, shape=None, dtype=None, layout=None):
    return full_like(input, 0, shape=shape, dtype=dtype, layout=layout)


# ====================================================================================== shapes

def _axes(axis, rank):
    axis = unwrap(axis)
    axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    out = []
    for a in axes:
        a = int(unwrap(a))
        out.append(a)
    return out


def _expand_layout(layout, axis):
    if isinstance(layout, SliceLayout):
        if layout.dim != axis:
            raise SimulationError(f"expected expand_dims input layout to be sliced in axis {axis} but got "
                                  f"{layout.dim}")
        return layout.parent
    if layout is None or isinstance(layout, AutoLayout):
        return layout
    if isinstance(layout, DistributedLayout):
        raise SimulationError(f"expected expand_dims input to have a SliceLayout, but got: {layout}")
    return None


def expand_dims(x, axis):
    rank = len(x.shape)
    axes = _axes(axis, rank)
    new_rank = rank + len(axes)
    axes = sorted(a + new_rank if a < 0 else a for a in axes)
    shape = list(x.shape)
    layout = x.layout
    for a in axes:
        shape.insert(a, 1)
        layout = _expand_layout(layout, a)
    if isinstance(x, PtrTensor):
        return x._with(x.offs.reshape(shape), layout)
    return Tensor(x.t.reshape(shape), x.dtype, layout)


def getitem_shape(shape, slices):
    if not isinstance(slices, tuple):
        slices = (slices,)
    out = []
    i = 0
    for s in slices:
        if s is None:
            out.append(1)
        elif isinstance(s, slice) and s.start is None and s.stop is None and s.step is None:
            if i >= len(shape):
                raise SimulationError("too many indices")
            out.append(shape[i])
            i += 1
        else:
            raise SimulationError(f"unsupported tensor slice {s!r}: only `:` and `None` are allowed")
    out.extend(shape[i:])
    return out


def _expand_layout_for_getitem(layout, slices):
    if not isinstance(slices, tuple):
        slices = (slices,)
    pos = 0
    for s in slices:
        if s is None:
            layout = _expand_layout(layout, pos)
        pos += 1
    return layout


def getitem(x, slices):
    shape = getitem_shape(x.shape, slices)
    return Tensor(x.t.reshape(shape), x.dtype, _expand_layout_for_getitem(x.layout, slices))


def broadcast_to(x, *shape):
    if len(shape) == 1 and isinstance(unwrap(shape[0]), (list, tuple)):
        shape = unwrap(shape[0])
    shape = _shape_list(shape)
    if x.shape and len(x.shape) != len(shape):
        raise SimulationError(f"Cannot broadcast, rank mismatch: {x.shape}, {shape}")
    broadcast_shapes(x.shape, shape)
    if isinstance(x, PtrTensor):
        return x._with(x.offs.expand(shape), x.layout)
    return Tensor(x.t.expand(shape), x.dtype, x.layout)


def broadcast(a, b):
    A = a if isinstance(a, (Tensor, PtrTensor)) else to_tensor(a)
    B = b if isinstance(b, (Tensor, PtrTensor)) else to_tensor(b)
    shape = broadcast_shapes(A.shape, B.shape)
    return broadcast_to(A, shape), broadcast_to(B, shape)


def reshape(x, *shape, can_reorder=False):
    if len(shape) == 1 and isinstance(unwrap(shape[0]), (list, tuple)):
        shape = unwrap(shape[0])
    shape = _shape_list(shape)
    if math.prod(shape) != x.numel:
        raise SimulationError(f"reshape: cannot reshape {x.shape} into {shape}")
    if isinstance(x, PtrTensor):
        return x._with(x.offs.reshape(shape), None)
    return Tensor(x.t.reshape(shape), x.dtype, None)


def permute(x, *dims):
    if len(dims) == 1 and isinstance(unwrap(dims[0]), (list, tuple)):
        dims = unwrap(dims[0])
    dims = [int(unwrap(d)) for d in dims]
    if sorted(dims) != list(range(len(x.shape))):
        raise SimulationError(f"permute: invalid dims {dims} for shape {x.shape}")
    if isinstance(x, PtrTensor):
        return x._with(x.offs.permute(dims), None)
    return Tensor(x.t.permute(dims), x.dtype, None)


def trans(x, *dims):
    if not dims or (len(dims) == 1 and unwrap(dims[0]) is None):
        dims = list(range(len(x.shape)))[::-1]
    return permute(x, *dims)


def join(a, b):
    A, B = broadcast(a, b)
    if not A.shape:
        raise SimulationError("Cannot join scalars in gluon")
    return Tensor(torch.stack([A.t, B.t.to(A.t.dtype)], dim=-1), A.dtype, None)


def split(x):
    if not x.shape or x.shape[-1] != 2:
        raise SimulationError(f"split expects the last dimension to be 2, got shape {x.shape}")
    return Tensor(x.t[..., 0], x.dtype, None), Tensor(x.t[..., 1], x.dtype, None)


def ravel(x, can_reorder=False):
    return reshape(x, [x.numel])


def convert_layout(value, layout, assert_trivial=False):
    if not isinstance(value, Tensor):
        raise SimulationError(f"expected convert_layout input to be a tensor, got {value!r}")
    layout = unwrap(layout)
    if layout is None:
        # another tensor's `.type.layout` where this simulator left it unknown (after a reshape, permute, split or
        # join the compiler infers the layout): a conversion moves no value, so it is the identity here
        return Tensor(value.t, value.dtype, None)
    if not isinstance(layout, DistributedLayout):
        raise SimulationError(f"expected 'layout' to be a DistributedLayout but got {layout}")
    return Tensor(value.t, value.dtype, layout)


def set_auto_layout(value, layout):
    return Tensor(value.t, value.dtype, unwrap(layout))


# ====================================================================================== reductions

def _reduce_layout(layout, axis, rank):
    if rank <= 1:
        return None
    if layout is None or isinstance(layout, AutoLayout):
        return layout
    if isinstance(layout, DistributedLayout):
        return SliceLayout(axis, layout)
    return None


def _norm_axis(x, axis):
    axis = unwrap(axis)
    if axis is None:
        return None
    axis = int(unwrap(axis))
    rank = len(x.shape)
    if axis < 0:
        axis += rank
    if not 0 <= axis < rank:
        raise SimulationError(f"expected reduction axis to be in the range [0, {rank}) but got {axis}")
    return axis


def _finish(x, r, axis, keep_dims, dtype):
    if axis is None:
        if keep_dims:
            r = r.reshape([1] * len(x.shape))
            return Tensor(r, dtype, x.layout)
        return Tensor(r.reshape([]), dtype, None)
    if keep_dims:
        return Tensor(r.unsqueeze(axis), dtype, x.layout)
    return Tensor(r, dtype, _reduce_layout(x.layout, axis, len(x.shape)))


def sum_(input, axis=None, keep_dims=False, dtype=None):
    x = to_tensor(input)
    axis = _norm_axis(x, axis)
    out = as_gl(dtype) if unwrap(dtype) is not None else None
    if out is None:
        if x.dtype.is_int_signed() and x.dtype.int_bitwidth < 32:
            out = tlc.int32
        elif x.dtype.is_int_unsigned() and x.dtype.int_bitwidth < 32:
            out = tlc.uint32
        elif x.dtype.is_bool():
            out = tlc.int32
        else:
            out = x.dtype
    t = _convert(x.t, x.dtype, out)
    tt = to_torch(out)
    r = t.sum(dtype=tt) if axis is None else t.sum(dim=axis, dtype=tt)
    return _finish(x, r, axis, keep_dims, out)


def _max_min(input, axis, return_indices, tie_left, keep_dims, is_max):
    x = to_tensor(input)
    axis = _norm_axis(x, axis)
    t = x.t
    if return_indices:
        flat = t.reshape(-1) if axis is None else t
        dim = 0 if axis is None else axis
        vals, idx = (torch.max if is_max else torch.min)(flat, dim=dim)
        if not tie_left:
            # last index among ties
            rev = flat.flip(dim)
            _, ridx = (torch.max if is_max else torch.min)(rev, dim=dim)
            idx = flat.shape[dim] - 1 - ridx
        return (_finish(x, vals, axis, keep_dims, x.dtype),
                _finish(x, idx.to(torch.int32), axis, keep_dims, tlc.int32))
    if x.dtype.is_bool():
        t = t.to(torch.int8)
    if axis is None:
        r = t.amax() if is_max else t.amin()
    else:
        r = t.amax(dim=axis) if is_max else t.amin(dim=axis)
    if x.dtype.is_bool():
        r = r != 0
    return _finish(x, r, axis, keep_dims, x.dtype)


def max_(input, axis=None, return_indices=False, return_indices_tie_break_left=True, keep_dims=False):
    return _max_min(input, axis, return_indices, return_indices_tie_break_left, keep_dims, True)


def min_(input, axis=None, return_indices=False, return_indices_tie_break_left=True, keep_dims=False):
    return _max_min(input, axis, return_indices, return_indices_tie_break_left, keep_dims, False)


def xor_sum(input, axis=None, keep_dims=False):
    return reduce_(input, axis, lambda a, b: a ^ b, keep_dims)


def reduce_or(input, axis, keep_dims=False):
    return reduce_(input, axis, lambda a, b: a | b, keep_dims)


def reduce_(input, axis, combine_fn, keep_dims=False):
    """Generic reduction: a pairwise tree of `combine_fn` calls on Tensors (works for tuples of inputs)."""
    single = not isinstance(input, (tuple, list))
    xs = [to_tensor(v) for v in ((input,) if single else input)]
    axis = _norm_axis(xs[0], axis)
    if axis is None:
        xs = [reshape(v, [v.numel]) for v in xs]
        ax = 0
    else:
        ax = axis
    vals = [v.t for v in xs]
    n = vals[0].shape[ax]
    while n > 1:
        half = n // 2
        lo = [Tensor(v.narrow(ax, 0, half), x.dtype, None) for v, x in zip(vals, xs)]
        hi = [Tensor(v.narrow(ax, half, half), x.dtype, None) for v, x in zip(vals, xs)]
        r = combine_fn(*lo, *hi)
        r = list(r) if isinstance(r, (tuple, list)) else [r]
        r = [to_tensor(v) for v in r]
        new = [v.t for v in r]
        if n % 2:
            new = [torch.cat([a, v.narrow(ax, n - 1, 1).to(a.dtype)], dim=ax) for a, v in zip(new, vals)]
            xs = [Tensor(a, rr.dtype, None) for a, rr in zip(new, r)]
            vals = new
            n = half + 1
        else:
            xs = [Tensor(a, rr.dtype, None) for a, rr in zip(new, r)]
            vals = new
            n = half
    src = to_tensor(input if single else input[0])
    outs = []
    for v, x in zip(vals, xs):
        r = v.squeeze(ax)
        if axis is None:
            outs.append(_finish(src, r, None, keep_dims, x.dtype))
        else:
            outs.append(_finish(src, r, axis, keep_dims, x.dtype))
    return outs[0] if single else tuple(outs)


def associative_scan(input, axis, combine_fn, reverse=False):
    single = not isinstance(input, (tuple, list))
    xs = [to_tensor(v) for v in ((input,) if single else input)]
    axis = _norm_axis(xs[0], axis)
    n = xs[0].shape[axis]
    idx = range(n - 1, -1, -1) if reverse else range(n)
    outs = [[] for _ in xs]
    acc = None
    for i in idx:
        cur = [Tensor(x.t.select(axis, i), x.dtype, None) for x in xs]
        if acc is None:
            acc = cur
        else:
            r = combine_fn(*acc, *cur)
            acc = [to_tensor(v) for v in (r if isinstance(r, (tuple, list)) else (r,))]
        for o, a in zip(outs, acc):
            o.append(a.t)
    res = []
    for o, x, a in zip(outs, xs, acc):
        if reverse:
            o = o[::-1]
        res.append(Tensor(torch.stack(o, dim=axis), a.dtype, x.layout))
    return res[0] if single else tuple(res)


def gather(src, index, axis):
    axis = int(unwrap(axis))
    return Tensor(torch.gather(src.t, axis, index.t.to(torch.int64)), src.dtype, index.layout)


def histogram(input, num_bins, mask=None, layout=None):
    v = input.t.to(torch.int64)
    if mask is not None:
        v = v[to_tensor(mask).t.expand(v.shape)]
    v = v[(v >= 0) & (v < num_bins)]
    return Tensor(torch.bincount(v, minlength=int(num_bins)).to(torch.int32), tlc.int32, unwrap(layout))
