"""Lowerings: one function per prim, turning FX-level ops on IR values into loop IR.

A lowering receives IR nodes (for tensor arguments) and plain Python values, and returns
an IR node (or a tuple of them). Pointwise ops build a ``Pointwise`` whose ``inner_fn``
loads each input at the broadcast index and combines them with ``ops.*``; views build
index arithmetic; reductions build a ``Reduction`` and realize it. The registry
``lowerings`` maps an ATen overload (or its packet, for all overloads) to its lowering.

A lowering that cannot handle its arguments raises ``LoweringDeclined(reason)``; the graph
lowering then calls the op through torch as a fallback kernel and logs the reason.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Promote, elementwise_dtypes

from . import config, ir
from .codegen.common import get_scheduling
from .indexing import FloorDiv, ModularIndexing, contiguous_strides, flatten, is_static, prod, size_expr, unflatten
from .ops_table import OP_TABLE, REDUCTION_TYPES
from .registry import OpRegistry
from .virtualized import V, ops, symbolic_constant

aten = torch.ops.aten
prims = torch.ops.prims

#: target (OpOverload or OpOverloadPacket) -> lowering function, read exact overload first
#: (tininductor/registry.py's keying rule)
lowerings = OpRegistry("lowerings")
#: targets that are extern calls by design (library kernels beat generated code)
EXTERN_OPS = {aten.mm, aten.bmm, aten.addmm, aten.baddbmm, aten.convolution}
#: dtypes generated kernels hold (codegen/triton.py's TRITON_TYPES, codegen/cpp.py's CPP_DTYPES);
#: an op on any other (complex) tensor runs in torch (graph.py)
KERNEL_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16,
                 torch.int32, torch.int64, torch.uint8, torch.bool}


class LoweringDeclined(Exception):
    """This lowering cannot handle these arguments; the op runs in torch instead.

    GraphLowering catches it and calls the op as a fallback kernel, logging the message as the
    reason (a whole-graph refusal, raised outside any lowering, makes the graph run eagerly).
    PyTorch's inductor has no exception for this: a lowering declines by returning
    ``fallback_handler(op)(...)``, and an op with no lowering is ``MissingOperatorWithoutDecomp``
    (torch/_inductor/exc.py). Not to be confused with tinydynamo's ``Unsupported`` (a graph break).
    """


def register_lowering(*targets):
    """Decorator: ``@register_lowering(aten.add)`` registers for every overload of aten.add."""

    return lowerings.register(*targets)


def lookup(target):
    """The lowering of an FX node target (its overload's entry, else its packet's), or None."""
    return lowerings.lookup(target)


# --------------------------------------------------------------------------- helpers


def is_ir(x) -> bool:
    return isinstance(x, ir.IRNode)


def _meta(x):
    """A meta tensor (or the scalar itself) standing for ``x`` in dtype/shape computations."""
    if is_ir(x):
        return torch.empty([s if is_static(s) else 2 for s in x.get_size()], dtype=x.get_dtype(), device="meta")
    if isinstance(x, sympy.Basic):  # a symbolic size used as a scalar: an int, or a float (ToFloat(s0))
        return 2 if x.is_integer else 2.0
    return x


def broadcast_shapes(*shapes) -> list[int]:
    if all(is_static(s) for shape in shapes for s in shape):
        return list(torch.broadcast_shapes(*[tuple(int(s) for s in shape) for shape in shapes]))
    out = []
    for d in range(max(len(s) for s in shapes)):
        sizes = {size_expr(shape[len(shape) - 1 - d]) for shape in shapes if d < len(shape)} - {1}
        if len(sizes) > 1:
            raise LoweringDeclined(f"broadcast of symbolic sizes {sorted(map(str, sizes))}: not known to be equal")
        out.append(sizes.pop() if sizes else 1)
    return list(reversed(out))


def broadcast_loader(x, out_size: Sequence[int]) -> Callable:
    """A loader for ``x`` read at indices of the (broadcast) output: size-1 dims read index 0."""
    size = x.get_size()
    load = x.make_loader()
    skip = len(out_size) - len(size)

    def loader(index):
        return load([sympy.Integer(0) if s == 1 else index[skip + i] for i, s in enumerate(size)])

    return loader


def cast(value, src: torch.dtype, dst: torch.dtype):
    """``ops.to_dtype`` when the dtypes differ (no cast is printed otherwise)."""
    return value if src == dst else ops.to_dtype(value, dst)


def _is_cpu_scalar(a) -> bool:
    return a.get_device().type == "cpu" and len(a.get_size()) == 0


def device_of(args) -> torch.device:
    """The device a kernel over ``args`` runs on, picked as eager picks it: a 0-dim CPU tensor may
    join an op on another device (it is read as a scalar), so the other tensors decide."""
    tensors = [a for a in args if is_ir(a)]
    if not tensors:
        raise LoweringDeclined("no tensor argument to take the device from")
    return next((a.get_device() for a in tensors if not _is_cpu_scalar(a)), tensors[0].get_device())


def to_device(a, device: torch.device):
    """``a`` readable by a kernel on ``device``: a 0-dim CPU tensor that joins a CUDA op (deberta's
    ``torch.tensor(size)`` scale) is copied there first, one scalar through ``aten._to_copy``
    (TorchInductor passes such a tensor to the kernel as a scalar argument instead)."""
    if is_ir(a) and a.get_device() != device:
        return V.graph.extern_kernel(aten._to_copy.default, (a,), {"device": device},
                                     f"extern: a 0-dim {a.get_device().type} tensor read on {device}")
    return a


def pointwise(fn: Callable, *args, promote=Promote.DEFAULT, returns_bool=False, out_dtype=None) -> ir.StorageBox:
    """Build a Pointwise node applying ``fn`` (written with ``ops``) to broadcast ``args``.

    Inputs are cast to the *computation* dtype (fp32 for fp16/bf16, as eager's opmath does)
    and the result to the *result* dtype, so chains round exactly where eager rounds.
    """
    device = device_of(args)
    args = [to_device(a, device) for a in args]
    tensors = [a for a in args if is_ir(a)]
    compute, result = elementwise_dtypes(*[_meta(a) for a in args], type_promotion_kind=promote)
    if out_dtype is not None:
        result = out_dtype
    size = broadcast_shapes(*[t.get_size() for t in tensors])
    loaders = []
    for a in args:
        if is_ir(a):
            src = a.get_dtype()
            loaders.append(lambda index, load=broadcast_loader(a, size), src=src: cast(load(index), src, compute))
        elif isinstance(a, sympy.Basic):  # a symbolic scalar (``x * x.shape[0]``): from the kernel's size arguments
            loaders.append(lambda index, value=a: symbolic_scalar(value, compute))
        else:
            loaders.append(lambda index, value=a: ops.constant(value, compute))
    fn_dtype = torch.bool if returns_bool else compute

    def inner_fn(index):
        return cast(fn(*[load(index) for load in loaders]), fn_dtype, result)

    return ir.StorageBox(ir.Pointwise(device, result, inner_fn, size))


def symbolic_scalar(expr: sympy.Expr, dtype: torch.dtype):
    """``ops`` computing a scalar that depends on sizes: an integer expression (``s0 - 1``) is an
    index expression cast to ``dtype``; float arithmetic over sizes (``2.0 / ToFloat(s0)``, from
    ``x / x.shape[-1]``) becomes ops on those."""
    if expr.is_integer:
        return cast(ops.index_expr(expr, torch.int64), torch.int64, dtype)
    if expr.is_Number:
        return ops.constant(float(expr), dtype)
    name = type(expr).__name__
    args = [symbolic_scalar(a, dtype) for a in expr.args] if name != "ToFloat" else []
    if name == "ToFloat":
        return symbolic_scalar(expr.args[0], dtype)
    if name in ("FloatTrueDiv", "IntTrueDiv"):
        return ops.truediv(*args)
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        op = ops.add if isinstance(expr, sympy.Add) else ops.mul
        out = args[0]
        for a in args[1:]:
            out = op(out, a)
        return out
    raise LoweringDeclined(f"symbolic scalar {expr} has no lowering")


symbolic_constant["fn"] = symbolic_scalar  # ops.constant of a size expression (virtualized.py)


def register_pointwise(target, op_name=None, promote=Promote.DEFAULT, returns_bool=False):
    """Lower ``target`` to one ``ops.<op_name>`` over its broadcast, promoted arguments."""
    name = op_name or target.__name__

    @register_lowering(target)
    def lowering(*args):
        return pointwise(getattr(ops, name), *args, promote=promote, returns_bool=returns_bool)

    return lowering


#: the op table's dtype rule -> PyTorch's type promotion kind
_PROMOTION = {"same": Promote.DEFAULT, "float": Promote.INT_TO_FLOAT, "bool": Promote.ALWAYS_BOOL}

# The plain pointwise lowerings, one per aten op that the op table maps to an op.
for _op in OP_TABLE:
    for _target in _op.aten:
        register_pointwise(getattr(aten, _target), _op.name, promote=_PROMOTION[_op.dtype],
                           returns_bool=_op.dtype == "bool")


@register_lowering(aten.bitwise_not)
def bitwise_not(x):
    if x.get_dtype() == torch.bool:
        return pointwise(ops.logical_not, x, promote=Promote.ALWAYS_BOOL, returns_bool=True)
    return pointwise(ops.bitwise_not, x)


def register_bitwise(target, name):
    """``bitwise_and/or`` of integer or bool tensors (and Python ints/bools): one ``ops.<name>``
    over the promoted operands; on bools it is the logical op (attention masks combined with ``&``)."""
    @register_lowering(target)
    def lowering(a, b):
        dtypes = [x.get_dtype() for x in (a, b) if is_ir(x)]
        if any(d.is_floating_point or d.is_complex for d in dtypes):
            raise LoweringDeclined(f"{target} of a floating-point tensor (torch raises)")
        if all(d == torch.bool for d in dtypes) and all(is_ir(x) or isinstance(x, bool) for x in (a, b)):
            return pointwise(getattr(ops, name.replace("bitwise", "logical")), a, b, promote=Promote.ALWAYS_BOOL,
                             returns_bool=True)
        return pointwise(getattr(ops, name), a, b)

    return lowering


for _name in "bitwise_and bitwise_or".split():
    register_bitwise(getattr(aten, _name), _name)


def register_logical(target, name):
    @register_lowering(target)
    def lowering(*args):
        bools = [to_dtype(a, torch.bool) if is_ir(a) else bool(a) for a in args]
        return pointwise(getattr(ops, name), *bools, promote=Promote.ALWAYS_BOOL, returns_bool=True)

    return lowering


for _name in "logical_and logical_or logical_not".split():
    register_logical(getattr(aten, _name), _name)


@register_lowering(aten.add)
def add(a, b, alpha=1):
    return pointwise(ops.add, a, mul(b, alpha) if alpha != 1 else b)


@register_lowering(aten.sub)
def sub(a, b, alpha=1):
    return pointwise(ops.sub, a, mul(b, alpha) if alpha != 1 else b)


def mul(a, b):
    return pointwise(ops.mul, a, b)


@register_lowering(aten.rsub)
def rsub(a, b, alpha=1):
    return pointwise(ops.sub, b, mul(a, alpha) if alpha != 1 else a)


@register_lowering(aten.div)
def div(a, b, rounding_mode=None):
    if rounding_mode is not None:
        raise LoweringDeclined(f"div with rounding_mode={rounding_mode!r} has no lowering yet")
    return pointwise(ops.truediv, a, b, promote=Promote.INT_TO_FLOAT)


@register_lowering(aten.pow)
def pow_(a, b):
    if not is_ir(b) and b in (2, 3, 4):  # GELU's x ** 3: multiplications, not a libm pow
        def power(x, n=int(b)):
            out = x
            for _ in range(n - 1):
                out = ops.mul(out, x)
            return out

        return pointwise(power, a, promote=Promote.DEFAULT, out_dtype=_pow_dtype(a, b))
    if not is_ir(b) and b == 0.5:
        return pointwise(ops.sqrt, a, promote=Promote.INT_TO_FLOAT)
    out = _pow_dtype(a, b)
    if not out.is_floating_point:
        raise LoweringDeclined("integer pow has no lowering")
    return pointwise(ops.pow, a, b)


def _pow_dtype(a, b):
    return elementwise_dtypes(_meta(a), _meta(b), type_promotion_kind=Promote.DEFAULT)[1]


@register_lowering(aten.where)
def where(cond, a, b):
    _, result = elementwise_dtypes(_meta(a), _meta(b), type_promotion_kind=Promote.NO_OPMATH)
    a = a if is_ir(a) else full_like_scalar(a, result, cond)
    b = b if is_ir(b) else full_like_scalar(b, result, cond)
    device = device_of([cond, a, b])
    cond, a, b = (to_device(t, device) for t in (cond, a, b))
    cond = to_dtype(cond, torch.bool)
    size = broadcast_shapes(cond.get_size(), a.get_size(), b.get_size())
    lc, la, lb = (broadcast_loader(t, size) for t in (cond, a, b))
    da, db = a.get_dtype(), b.get_dtype()

    def inner_fn(index):
        return ops.where(lc(index), cast(la(index), da, result), cast(lb(index), db, result))

    return ir.StorageBox(ir.Pointwise(device, result, inner_fn, size))


def full_like_scalar(value, dtype, like) -> ir.StorageBox:
    return ir.StorageBox(ir.Pointwise(like.get_device(), dtype, lambda index: ops.constant(value, dtype), []))


@register_lowering(aten.clamp)
def clamp(x, min=None, max=None):
    if is_ir(min) or is_ir(max):
        raise LoweringDeclined("clamp with tensor bounds")
    if min is not None:
        x = pointwise(ops.maximum, x, min)
    if max is not None:
        x = pointwise(ops.minimum, x, max)
    return x


# Hard activations: ReLU6 (``hardtanh(x, 0, 6)``, MobileNetV2's), hardswish and hardsigmoid
# (MobileNetV3's), and the backward ops their VJP rules call. Pointwise lowerings, so that each fuses
# with the batch norm before it instead of running as an ATen kernel of its own. They stay ops of the
# graph (no decomposition into clamp before AD): their gradient is then ATen's backward formula, zero
# at the kinks (``x == 0`` and ``x == 6`` for ReLU6) as in eager, where a clamp's maximum/minimum
# would split a tie in half. The formulas are ATen's, in its order of operations.
@register_lowering(aten.hardtanh)
def hardtanh(x, min_val=-1.0, max_val=1.0):
    return clamp(x, min_val, max_val)


@register_lowering(aten.hardtanh_backward)
def hardtanh_backward(grad, x, min_val, max_val):
    def fn(g, v, lo, hi, zero):
        return ops.where(ops.logical_or(ops.le(v, lo), ops.ge(v, hi)), zero, g)

    return pointwise(fn, grad, x, min_val, max_val, 0.0)


@register_lowering(aten.hardsigmoid)
def hardsigmoid(x):
    def fn(v, zero, three, six):
        return ops.truediv(ops.minimum(ops.maximum(ops.add(v, three), zero), six), six)

    return pointwise(fn, x, 0.0, 3.0, 6.0)


@register_lowering(aten.hardsigmoid_backward)
def hardsigmoid_backward(grad, x):
    def fn(g, v, zero, three, sixth):
        inside = ops.logical_and(ops.gt(v, ops.neg(three)), ops.lt(v, three))
        return ops.where(inside, ops.mul(g, sixth), zero)

    return pointwise(fn, grad, x, 0.0, 3.0, 1.0 / 6.0)


@register_lowering(aten.hardswish)
def hardswish(x):
    def fn(v, zero, three, six):
        return ops.truediv(ops.mul(v, ops.minimum(ops.maximum(ops.add(v, three), zero), six)), six)

    return pointwise(fn, x, 0.0, 3.0, 6.0)


@register_lowering(aten.hardswish_backward)
def hardswish_backward(grad, x):
    def fn(g, v, zero, three, half):
        slope = ops.mul(g, ops.add(ops.truediv(v, three), half))
        return ops.where(ops.le(v, ops.neg(three)), zero, ops.where(ops.lt(v, three), slope, g))

    return pointwise(fn, grad, x, 0.0, 3.0, 0.5)


@register_lowering(prims.convert_element_type)
def to_dtype(x, dtype: torch.dtype):
    """An explicit cast: one ``ops.to_dtype`` around the input's body."""
    if x.get_dtype() == dtype:
        return x
    load, src = x.make_loader(), x.get_dtype()
    if dtype == torch.bool:
        fn = lambda index: ops.ne(load(index), ops.constant(0, src))
    else:
        fn = lambda index: ops.to_dtype(load(index), dtype)
    return ir.StorageBox(ir.Pointwise(x.get_device(), dtype, fn, x.get_size()))


@register_lowering(aten._to_copy)
def _to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    if device is not None and torch.device(device) != x.get_device():
        raise LoweringDeclined("device copy")
    return clone(to_dtype(x, dtype) if dtype is not None else x)


@register_lowering(aten.clone, aten.alias, aten.lift_fresh_copy, aten.detach, aten.contiguous)
def clone(x, memory_format=None):
    """A copy is a Pointwise reading the input: realized only if something needs it in memory."""
    return ir.StorageBox(ir.Pointwise(x.get_device(), x.get_dtype(), x.make_loader(), x.get_size()))


# --------------------------------------------------------------------------- creation


@register_lowering(aten.full)
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    device = torch.device(device or "cpu")
    return ir.StorageBox(ir.Pointwise(device, dtype, lambda index: ops.constant(fill_value, dtype), list(size)))


@register_lowering(aten.scalar_tensor)
def scalar_tensor(value, dtype=None, layout=None, device=None, pin_memory=None):
    return full([], value, dtype=dtype, device=device)


@register_lowering(aten.empty, aten.zeros)
def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return full(size, 0, dtype=dtype, device=device)  # zero-filled: cheap and deterministic


@register_lowering(aten.arange)
def arange(*args, dtype=None, layout=None, device=None, pin_memory=None):
    if V.graph.current_node is not None and "val" in V.graph.current_node.meta:
        dtype = V.graph.current_node.meta["val"].dtype
    start, end, step = (0, args[0], 1) if len(args) == 1 else (list(args) + [1])[:3]
    if all(is_static(v) for v in (start, end, step)):
        n = max(0, math.ceil((end - start) / step))
    elif is_static(start) and is_static(step) and step > 0:  # arange(s0): a symbolic length
        n = size_expr(end - start) if step == 1 else size_expr(FloorDiv(end - start + step - 1, step))
    else:
        raise LoweringDeclined(f"arange({start}, {end}, {step}) with symbolic start or step")
    dtype = dtype or torch.int64

    def inner_fn(index):
        value = ops.index_expr(index[0], torch.int64)
        if dtype == torch.int64 and start == 0 and step == 1:
            return value
        return ops.add(ops.mul(ops.to_dtype(value, dtype), ops.constant(step, dtype)), ops.constant(start, dtype))

    return ir.StorageBox(ir.Pointwise(torch.device(device or "cpu"), dtype, inner_fn, [n]))


# --------------------------------------------------------------------------- views


def _view_of(x, size, reindex, strided_layout: Callable | None):
    """Build a view: a ReinterpretView when ``x`` is in memory, else index arithmetic."""
    storage = x
    if isinstance(x, ir.StorageBox) and x.is_realized():
        storage = x.data
    if strided_layout is not None and isinstance(storage, (ir.Buffer, ir.ReinterpretView)):
        base = storage.data if isinstance(storage, ir.ReinterpretView) else storage
        layout = strided_layout(storage.layout)
        if layout is not None:
            return ir.ReinterpretView(base, layout)
    return ir.View(x, size, reindex, strided_layout)


def _restride(layout: ir.Layout, size, stride, offset) -> ir.Layout:
    return ir.Layout(layout.device, layout.dtype, [size_expr(s) for s in size], [size_expr(s) for s in stride],
                     size_expr(offset))


@register_lowering(aten.permute)
def permute(x, dims):
    dims = [d % max(len(x.get_size()), 1) for d in dims]
    size = [x.get_size()[d] for d in dims]
    return _view_of(
        x, size, permute_reindex(dims),
        lambda lay: _restride(lay, size, [lay.stride[d] for d in dims], lay.offset),
    )


def permute_reindex(dims: Sequence[int]) -> Callable[[list], list]:
    """Index arithmetic of ``permute(dims)``: output index -> input index (output dim ``i`` is
    input dim ``dims[i]``, so input dim ``d`` reads output dim ``dims.index(d)``)."""
    inverse = [list(dims).index(i) for i in range(len(dims))]
    return lambda index: [index[inverse[i]] for i in range(len(dims))]


@register_lowering(aten.expand)
def expand(x, size, implicit=False):
    old = x.get_size()
    size = [o if s == -1 else s for s, o in zip(size, [None] * (len(size) - len(old)) + old)]
    skip = len(size) - len(old)

    def layout(lay):
        stride = [0] * skip + [0 if old[i] == 1 and size[skip + i] != 1 else lay.stride[i] for i in range(len(old))]
        return _restride(lay, size, stride, lay.offset)

    return _view_of(x, size, expand_reindex(old, size), layout)


def expand_reindex(old: Sequence, size: Sequence) -> Callable[[list], list]:
    """Index arithmetic of expanding ``old`` to ``size`` (no ``-1`` left): output index -> input
    index. New leading dims are dropped; a size-1 dim broadcast to more reads index 0."""
    skip = len(size) - len(old)
    return lambda index: [sympy.Integer(0) if old[i] == 1 and size[skip + i] != 1 else index[skip + i]
                          for i in range(len(old))]


@register_lowering(aten.unsqueeze)
def unsqueeze(x, dim):
    size = x.get_size()
    dim = dim % (len(size) + 1)
    new = size[:dim] + [1] + size[dim:]

    def layout(lay):
        st = lay.stride[dim] * lay.size[dim] if dim < len(size) else 1
        return _restride(lay, new, lay.stride[:dim] + [st] + lay.stride[dim:], lay.offset)

    return _view_of(x, new, lambda index: index[:dim] + index[dim + 1:], layout)


@register_lowering(aten.squeeze)
def squeeze(x, dim=None):
    size = x.get_size()
    if dim is None:
        dims = [i for i, s in enumerate(size) if s == 1]
    else:
        dims = [d % max(len(size), 1) for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
        dims = [d for d in dims if d < len(size) and size[d] == 1]
    keep = [i for i in range(len(size)) if i not in dims]
    new = [size[i] for i in keep]

    def reindex(index):
        out, it = [], iter(index)
        for i in range(len(size)):
            out.append(sympy.Integer(0) if i in dims else next(it))
        return out

    return _view_of(x, new, reindex, lambda lay: _restride(lay, new, [lay.stride[i] for i in keep], lay.offset))


@register_lowering(aten.slice)
def slice_(x, dim=0, start=None, end=None, step=1):
    size = x.get_size()
    dim = dim % len(size)
    n = size[dim]
    start, end = size_expr(0 if start is None else start), size_expr(n if end is None else end)
    if is_static(n) and is_static(start) and is_static(end):
        start = start + n if start < 0 else start
        end = end + n if end < 0 else end
        start, end = min(max(start, 0), n), min(max(end, 0), n)
        length = max(0, (end - start + step - 1) // step)
    else:  # symbolic: the usual forms x[a:], x[:b], x[a:s0 - c], in range as dynamo guarded them
        if is_static(end) and end >= 2 ** 62:
            end = n
        start, end = (s + n if is_static(s) and s < 0 else s for s in (start, end))
        length = size_expr(end - start) if step == 1 else size_expr(FloorDiv(end - start + step - 1, step))
    new = size[:dim] + [length] + size[dim + 1:]

    def reindex(index):
        return index[:dim] + [index[dim] * step + start] + index[dim + 1:]

    def layout(lay):
        stride = list(lay.stride)
        stride[dim] = lay.stride[dim] * step
        return _restride(lay, new, stride, lay.offset + start * lay.stride[dim])

    return _view_of(x, new, reindex, layout)


@register_lowering(aten.select)
def select(x, dim, index):
    size = x.get_size()
    dim = dim % len(size)
    index = index + size[dim] if index < 0 else index
    new = size[:dim] + size[dim + 1:]

    def layout(lay):
        return _restride(lay, new, lay.stride[:dim] + lay.stride[dim + 1:], lay.offset + index * lay.stride[dim])

    return _view_of(x, new, lambda idx: idx[:dim] + [sympy.Integer(index)] + idx[dim:], layout)


def _smaller(a, b) -> str | None:
    """Which of two products of sizes is the smaller, "old" (``a``) or "new" (``b``), when one
    divides the other (always decidable for ints; for symbolic sizes, when the quotient is a
    polynomial), else None."""
    if is_static(a) and is_static(b):
        return "old" if a < b else "new"
    for which, small, big in (("old", a, b), ("new", b, a)):
        quotient = sympy.cancel(sympy.sympify(big) / small)
        if sympy.fraction(quotient)[1] == 1:
            return which
    return None


@register_lowering(aten.view, aten._unsafe_view, aten.reshape)
def view(x, size):
    old = x.get_size()
    size = _view_size(old, size)
    if is_static(prod(size)) and is_static(prod(old)) and prod(size) != prod(old):
        raise LoweringDeclined(f"view of {old} as {size}: element counts differ")
    # symbolic counts: the traced graph's fake tensors checked them, under the ShapeEnv's guards
    # (``s0 * (s1 // 2) * 2 == s0 * s1`` holds for the even s1 the guards admit; sympy cannot see it)
    if prod(old) == 0:
        return full(size, 0, dtype=x.get_dtype(), device=x.get_device())
    return _view_of(x, size, _view_reindex(old, size), _view_layout(size))


@register_lowering(aten.as_strided)
def as_strided(x, size, stride, storage_offset=None):
    """A view of the memory ``x`` is stored in, with the given sizes and strides: a ReinterpretView
    of the buffer ``x`` is realized into. ATen's adaptive average pooling restrides its ``(N, C, 1, 1)``
    output so, to its input's memory format (ConvNeXt's and Swin's heads).

    ``as_strided`` addresses the *storage*, so it means the same here as in eager only where the
    buffer is laid out as eager laid out that value (the traced strides) and owns its storage (a
    buffer computed by this graph, not an input, which may be a view into a larger storage); anything
    else runs as the ATen op."""
    node = V.graph.current_node
    traced = node.args[0].meta.get("val") if node is not None and isinstance(node.args[0], torch.fx.Node) else None
    stored = ir.realize_input(x)
    base = stored.data if isinstance(stored, ir.ReinterpretView) else stored
    if isinstance(base, ir.InputBuffer) or not isinstance(traced, torch.Tensor):
        raise LoweringDeclined("as_strided of a graph input (its storage is not this graph's)")
    if [size_expr(n) for n in traced.stride()] != list(stored.layout.stride) or traced.storage_offset() != 0 \
            or stored.layout.offset != 0:
        raise LoweringDeclined("as_strided of a value stored with other strides than eager's")
    layout = _restride(base.layout, size, stride, 0 if storage_offset is None else storage_offset)
    extent = base.layout.storage_size()
    if not (is_static(layout.storage_size()) and is_static(extent)) or layout.storage_size() > extent \
            or extent != prod(base.layout.size):  # a buffer with holes: eager's holes hold other data
        raise LoweringDeclined("as_strided beyond the buffer's elements")
    return ir.ReinterpretView(base, layout)


def _view_size(old, size) -> list:
    """The view's sizes as expressions, its ``-1`` (if any) worked out from the element count."""
    size = [size_expr(s) for s in size]
    if -1 in size:
        known = prod(s for s in size if s != -1)
        size[size.index(-1)] = (prod(old) // known if known else 0) if is_static(prod(old)) else \
            size_expr(sympy.cancel(prod(old) / known))
    return size


def _view_reindex(old, size):
    """``reindex(index of the view) -> index of the input``: the dims are split into groups whose
    products match, and each group is mapped flat -> flat."""

    def reindex(index):
        out, i, j = [], 0, 0
        while i < len(old) or j < len(size):
            gi, gj = [i], [j]
            pi = old[i] if i < len(old) else 1
            pj = size[j] if j < len(size) else 1
            while sympy.expand(pi - pj) != 0:
                smaller = _smaller(pi, pj)
                if smaller is None:  # symbolic sizes that do not nest: one group for the rest
                    gi, gj = list(range(i, len(old))), list(range(j, len(size)))
                    i, j = len(old), len(size)
                    break
                if smaller == "old":
                    i += 1
                    gi.append(i)
                    pi *= old[i]
                else:
                    j += 1
                    gj.append(j)
                    pj *= size[j]
            gi = [k for k in gi if k < len(old)]
            gj = [k for k in gj if k < len(size)]
            if len(gi) == 1 and len(gj) == 1:
                out.append(index[gj[0]])
            elif gi:
                flat = flatten([index[k] for k in gj], [size[k] for k in gj])
                out.extend(unflatten(flat, [old[k] for k in gi]))
            i, j = i + 1, j + 1
        return out

    return reindex


def _view_layout(size):
    """``layout(input's layout) -> the view's layout``, or None where the view needs a copy."""

    def layout(lay):
        if not (lay.is_static() and all(is_static(s) for s in size)):
            # symbolic: a contiguous layout views as contiguous; anything else is copied
            if all(sympy.expand(a - b) == 0 for a, b, n in zip(lay.stride, contiguous_strides(lay.size), lay.size)
                   if n != 1):
                return _restride(lay, size, contiguous_strides(size), lay.offset)
            return None
        # let torch's stride rules decide whether this view needs no copy
        base = torch.empty(lay.storage_size() + 1, device="meta").as_strided(lay.size, lay.stride, lay.offset)
        try:
            v = base.view(size)
        except RuntimeError:
            return None
        return _restride(lay, v.size(), v.stride(), v.storage_offset())

    return layout


@register_lowering(aten.split_with_sizes)
def split_with_sizes(x, sizes, dim=0):
    out, start = [], 0
    for n in sizes:
        out.append(slice_(x, dim, start, start + n))
        start += n
    return tuple(out)


@register_lowering(aten.split)
def split(x, size, dim=0):
    n = x.get_size()[dim % len(x.get_size())]
    if isinstance(size, (list, tuple)):
        return split_with_sizes(x, size, dim)
    return split_with_sizes(x, [min(size, n - s) for s in range(0, n, size)] or [0], dim)


@register_lowering(aten.t)
def t(x):
    return permute(x, list(reversed(range(len(x.get_size())))))


@register_lowering(aten.transpose)
def transpose(x, dim0, dim1):
    nd = max(len(x.get_size()), 1)
    dims = list(range(nd))
    dims[dim0 % nd], dims[dim1 % nd] = dims[dim1 % nd], dims[dim0 % nd]
    return permute(x, dims)


# --------------------------------------------------------------------------- cat
# ``cat`` is written by its producers instead of an ATen call that copies finished inputs: with a
# few inputs it is a Pointwise choosing, per output element, which input to read (the inputs'
# bodies inline into it, and it inlines into its consumers: HF Llama's rotary ``cat((-x2, x1))``
# becomes part of the kernel that uses it); with many, each input is stored straight into its
# slice of the output (an ``ir.ScatterBuffer`` per input, TorchInductor's ConcatKernel).


def _cat_inputs(tensors, dim):
    """The inputs that contribute elements (cat skips legacy 1-D empty tensors, and size-0 slices
    add nothing), the normalised dim, the output size and dtype."""
    tensors = [t for t in tensors if is_ir(t)]
    shaped = [t for t in tensors if not (len(t.get_size()) == 1 and t.get_size()[0] == 0)]
    if not shaped:
        return [], 0, [0], functools.reduce(torch.promote_types, [t.get_dtype() for t in tensors])
    nd = len(shaped[0].get_size())
    dim = dim % nd
    size = list(shaped[0].get_size())
    size[dim] = sum((t.get_size()[dim] for t in shaped), sympy.Integer(0))
    dtype = functools.reduce(torch.promote_types, [t.get_dtype() for t in tensors])
    parts = [t for t in shaped if t.get_size()[dim] != 0]
    return parts, dim, [size_expr(s) for s in size], dtype


@register_lowering(aten.cat)
def cat(tensors, dim=0):
    parts, dim, size, dtype = _cat_inputs(tensors, dim)
    device = device_of(tensors)
    if not parts or prod(size) == 0:
        return full(size, 0, dtype=dtype, device=device)
    if len(parts) == 1:
        return to_dtype(clone(parts[0]), dtype)
    masked = getattr(get_scheduling(device), "masked_loads", False)
    limit = config.max_pointwise_cat_inputs_masked if masked else config.max_pointwise_cat_inputs
    if len(parts) <= limit:
        return _pointwise_cat(parts, dim, size, dtype, device)
    return _concat_kernel(parts, dim, size, dtype, device)


def _pointwise_cat(parts, dim, size, dtype, device) -> ir.StorageBox:
    """``out[.., j, ..] = parts[k][.., j - start_k, ..]`` for the ``k`` whose slice holds ``j``: a
    chain of ``masked(start_k <= j < end_k, load_k, ...)``. On Triton each input's loads are masked
    to its own slice, so every element is read once; a backend without masked loads evaluates every
    input at every element (a ``where``), so each index along ``dim`` is kept inside its bounds by a
    modulo, exact where the element is its own: ``(j + c) % n_k`` with ``c = -start_k`` modulo
    ``n_k`` (non-negative)."""
    loaders, starts, ends, start = [], [], [], sympy.Integer(0)
    for t in parts:
        n = size_expr(t.get_size()[dim])
        shift = sympy.Integer(int(-start) % int(n)) if is_static(start) and is_static(n) else start * (n - 1)
        load, src = t.make_loader(), t.get_dtype()

        def loader(index, load=load, src=src, shift=shift, n=n):
            local = ModularIndexing(index[dim] + shift, n) if n != 1 else sympy.Integer(0)
            return cast(load(list(index[:dim]) + [local] + list(index[dim + 1:])), src, dtype)

        loaders.append(loader)
        starts.append(start)
        start = size_expr(start + n)
        ends.append(start)

    def inner_fn(index):
        j = ops.index_expr(index[dim], torch.int64)
        value = ops.constant(0, dtype)
        for k in reversed(range(len(loaders))):
            inside = ops.lt(j, _int_value(ends[k])) if k == 0 else \
                ops.ge(j, _int_value(starts[k])) if k == len(loaders) - 1 else \
                ops.logical_and(ops.ge(j, _int_value(starts[k])), ops.lt(j, _int_value(ends[k])))
            value = ops.masked(inside, functools.partial(loaders[k], index), value)
        return value

    return ir.StorageBox(ir.Pointwise(device, dtype, inner_fn, size))


def _int_value(expr):
    return ops.constant(int(expr), torch.int64) if is_static(expr) else ops.index_expr(expr, torch.int64)


def _concat_kernel(parts, dim, size, dtype, device):
    """A fresh output buffer and, per input, a store of its elements into its slice (the input's
    own body inlined into that store: a pointwise producer writes the slice directly)."""
    out = V.graph.extern_kernel(aten.empty.memory_format, (size,), {"dtype": dtype, "device": device},
                                "extern: cat's output, allocated (each input stores its slice)")
    start = sympy.Integer(0)
    for t in parts:
        load, src = t.make_loader(), t.get_dtype()
        body = ir.Pointwise(device, dtype, lambda idx, load=load, src=src: cast(load(idx), src, dtype), t.get_size())
        position = lambda idx, start=start: list(idx[:dim]) + [idx[dim] + start] + list(idx[dim + 1:])
        V.graph.register_buffer(ir.ScatterBuffer(None, out, body, position))
        start = size_expr(start + t.get_size()[dim])
    return out


@register_lowering(aten.constant_pad_nd)
def constant_pad_nd(x, pad, value=0):
    """``value`` around ``x`` (``pad`` lists (before, after) from the last dim backwards, all >= 0:
    crops are slices by then, decompositions.py). A Pointwise: where the index falls inside ``x``
    it reads ``x``, elsewhere ``value``; the read is kept in bounds everywhere by a modulo, exact
    inside (``where`` evaluates both sides)."""
    if any(p < 0 for p in pad):
        raise LoweringDeclined("negative padding (a crop)")
    size = [size_expr(s) for s in x.get_size()]
    nd = len(size)
    before = {nd - 1 - i: pad[2 * i] for i in range(len(pad) // 2)}
    out_size = [s + before.get(d, 0) + (pad[2 * (nd - 1 - d) + 1] if d in before else 0) for d, s in enumerate(size)]
    out_size = [size_expr(s) for s in out_size]
    if any(not is_static(before[d]) for d in before):
        raise LoweringDeclined("symbolic padding")
    load, dtype = x.make_loader(), x.get_dtype()
    padded = [d for d in sorted(before) if before[d] or out_size[d] != size[d]]

    def inner_fn(index):
        local = list(index)
        inside = None
        for d in padded:
            n, b = size[d], int(before[d])
            if not is_static(n):
                raise LoweringDeclined("padding a dim of symbolic size")
            if int(n) == 0:
                return ops.constant(value, dtype)
            local[d] = ModularIndexing(index[d] + (-b) % int(n), n) if n != 1 else sympy.Integer(0)
            j = ops.index_expr(index[d], torch.int64)
            ok = ops.logical_and(ops.ge(j, ops.constant(b, torch.int64)), ops.lt(j, ops.constant(b + int(n), torch.int64)))
            inside = ok if inside is None else ops.logical_and(inside, ok)
        if inside is None:
            return load(local)
        return ops.where(inside, load(local), ops.constant(value, dtype))

    if any(not is_static(size[d]) for d in padded):
        raise LoweringDeclined("padding a dim of symbolic size")
    return ir.StorageBox(ir.Pointwise(x.get_device(), dtype, inner_fn, out_size))


# --------------------------------------------------------------------------- pooling


def _pair(value, name: str) -> list[int]:
    """A pooling argument as (height, width): ``3`` and ``[3]`` are ``[3, 3]``."""
    value = [value] if isinstance(value, int) else list(value)
    if len(value) == 1:
        value = value * 2
    if len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise LoweringDeclined(f"{name}={value}: two static ints expected")
    return value


def pooling_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    """Outputs along one dim of a pooling window sliding over ``size`` (ATen's ``pooling_output_shape``):
    with ``ceil_mode`` a last partial window counts, unless it would start inside the right padding."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def _window_reuse(x, kernel: Sequence[int]) -> None:
    """A window op reads each input element up to ``kh * kw`` times, so an inlined producer would be
    recomputed that often: a cheap one (a ReLU) stays inlined, a costly one (a batch norm's five
    reads) is realized first, by the rule for a producer with that many users (``mark_reuse``).
    TorchInductor's pooling lowerings ask the same of their input (``realize_hint``)."""
    if isinstance(x, ir.StorageBox):
        x.mark_reuse(prod(kernel))


def _window_element(load, index, k, size, out_hw, stride, padding, dilation):
    """Element ``k = (kh, kw)`` of the pooling window of output ``index = (..., i, j)``: its load, and a
    bool op saying whether it lies inside the input (None where it does for every output). A read in
    the padding is kept in bounds by a modulo (exact inside), as ``constant_pad_nd`` keeps its own."""
    *outer, i, j = index
    coords, inside = [], None
    for dim, (out_index, kd) in enumerate(((i, k[0]), (j, k[1]))):
        n, s = size[dim], stride[dim]
        offset = kd * dilation[dim] - padding[dim]
        if offset >= 0 and (out_hw[dim] - 1) * s + offset < n:
            coords.append(out_index * s + offset)
            continue
        coords.append(ModularIndexing(out_index * s + offset % n, n))
        pos = ops.index_expr(out_index * s + offset, torch.int64)
        ok = ops.logical_and(ops.ge(pos, ops.constant(0, torch.int64)), ops.lt(pos, ops.constant(n, torch.int64)))
        inside = ok if inside is None else ops.logical_and(inside, ok)
    return load([*outer, *coords]), inside


@register_lowering(aten.max_pool2d_with_indices)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Max pooling as Pointwise nodes (TorchInductor lowers it so too): each output element compares
    the ``kh * kw`` elements of its window, one load each, in the order ATen's kernels visit them
    (row by row), and takes an element that is greater than the best so far or NaN, so ties and NaNs
    pick eager's element. Window elements in the padding are skipped: their loads are kept in bounds
    by a modulo and never taken.

    Two nodes share that body: the maxima, and the indices (the flat position ``h * W + w`` of each
    maximum in its input plane, which the backward op reads); an inference graph uses only the
    maxima, so the indices are never computed. The maxima fuse with their neighbours: a cheap
    producer (a ReLU) is inlined into the window, a costly one (a ResNet's batch norm) is stored
    first (:func:`_window_reuse`); the consumer after it (a residual add) reads the maxima inline."""
    if len(x.get_size()) not in (3, 4) or not all(is_static(n) for n in x.get_size()):
        raise LoweringDeclined("max pooling of a 3-D or 4-D input of static size only")
    kernel, padding, dilation = _pair(kernel_size, "kernel_size"), _pair(padding, "padding"), _pair(dilation, "dilation")
    stride = _pair(stride, "stride") if stride else list(kernel)
    *batch, height, width = [int(n) for n in x.get_size()]
    out_hw = [pooling_output_size(n, k, s, p, d, ceil_mode)
              for n, k, s, p, d in zip((height, width), kernel, stride, padding, dilation)]
    dtype, acc = x.get_dtype(), _acc_dtype(x.get_dtype())
    _window_reuse(x, kernel)
    load = x.make_loader()

    def window_max(index, with_indices: bool):
        """ATen's loop: ``if (val > best || isnan(val)) best = val, best_index = position``, from
        ``best = -inf`` and (for the indices) the window's first element inside the input."""
        i, j = index[-2:]
        best = ops.constant(-math.inf, acc)
        best_index = ops.constant(-1, torch.int64)  # no element taken yet: the first inside is taken
        for kh in range(kernel[0]):
            for kw in range(kernel[1]):
                value, inside = _window_element(load, index, (kh, kw), (height, width), out_hw, stride, padding,
                                                dilation)
                value = cast(value, dtype, acc)
                take = ops.logical_or(ops.gt(value, best), ops.ne(value, value))
                if with_indices:
                    take = ops.logical_or(take, ops.eq(best_index, ops.constant(-1, torch.int64)))
                if inside is not None:
                    take = ops.logical_and(inside, take)
                best = ops.where(take, value, best)
                if with_indices:
                    flat = (i * stride[0] + kh * dilation[0] - padding[0]) * width \
                        + j * stride[1] + kw * dilation[1] - padding[1]
                    best_index = ops.where(take, ops.index_expr(flat, torch.int64), best_index)
        return best_index if with_indices else cast(best, acc, dtype)

    size = [*batch, *out_hw]
    values = ir.Pointwise(x.get_device(), dtype, lambda index: window_max(index, False), size)
    indices = ir.Pointwise(x.get_device(), torch.int64, lambda index: window_max(index, True), size)
    return ir.StorageBox(values), ir.StorageBox(indices)


@register_lowering(aten.max_pool2d_with_indices_backward)
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """The gradient of max pooling, gathered instead of scattered: input element ``(h, w)`` sums the
    gradients of the (at most ``kh * kw``) windows that contain it and whose recorded maximum is
    it. Window ``(kh, kw)`` holds ``(h, w)`` as its element for the output ``oh = (h + p - kh * d) / s``
    when that divides and lies in the output; reads are kept in bounds by a modulo. One Pointwise,
    fused with the gradient's producer (TorchInductor lowers it so too)."""
    if len(x.get_size()) not in (3, 4) or not all(is_static(n) for n in [*x.get_size(), *grad.get_size()]):
        raise LoweringDeclined("max pooling backward of a 3-D or 4-D input of static size only")
    kernel, padding, dilation = _pair(kernel_size, "kernel_size"), _pair(padding, "padding"), _pair(dilation, "dilation")
    stride = _pair(stride, "stride") if stride else list(kernel)
    *batch, height, width = [int(n) for n in x.get_size()]
    out_hw = [int(n) for n in grad.get_size()[-2:]]
    dtype, acc = grad.get_dtype(), _acc_dtype(grad.get_dtype())
    load_grad, load_index = grad.make_loader(), indices.make_loader()

    def int_(value):
        return ops.constant(value, torch.int64)

    def inner_fn(index):
        *outer, h, w = index
        total = ops.constant(0, acc)
        # windows in the order of their outputs (kh descending is oh ascending), as eager accumulates
        for kh in reversed(range(kernel[0])):
            for kw in reversed(range(kernel[1])):
                coords, ok = [], None
                for dim, (pos, k) in enumerate(((h, kh), (w, kw))):
                    s, n_out = stride[dim], out_hw[dim]
                    c = k * dilation[dim] - padding[dim]   # the window element sits at out * s + c
                    shift = s * -(-max(c, 0) // s)         # a multiple of s that keeps pos - c + shift >= 0
                    numerator = pos - c + shift
                    out = FloorDiv(numerator, s) - shift // s
                    coords.append(ModularIndexing(FloorDiv(numerator, s) + (-(shift // s)) % n_out, n_out))
                    out_value = ops.index_expr(out, torch.int64)
                    cond = ops.logical_and(ops.ge(out_value, int_(0)), ops.lt(out_value, int_(n_out)))
                    if s != 1:
                        cond = ops.logical_and(cond, ops.eq(ops.index_expr(ModularIndexing(numerator, s), torch.int64),
                                                            int_(0)))
                    ok = cond if ok is None else ops.logical_and(ok, cond)
                at = [*outer, *coords]
                mine = ops.eq(load_index(at), ops.index_expr(h * width + w, torch.int64))
                value = cast(load_grad(at), dtype, acc)
                total = ops.add(total, ops.where(ops.logical_and(ok, mine), value, ops.constant(0, acc)))
        return cast(total, acc, dtype)

    return ir.StorageBox(ir.Pointwise(x.get_device(), dtype, inner_fn, [*batch, height, width]))


@register_lowering(aten.avg_pool2d)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    """Average pooling as one Pointwise (DenseNet's transitions): the window's elements inside the
    input summed in row order in the accumulation dtype, divided as ATen's kernel divides: by
    ``divisor_override``, else by the window's size clipped to the padded input
    (``count_include_pad``), else by the number of its elements inside the input."""
    if len(x.get_size()) not in (3, 4) or not all(is_static(n) for n in x.get_size()):
        raise LoweringDeclined("average pooling of a 3-D or 4-D input of static size only")
    kernel, padding = _pair(kernel_size, "kernel_size"), _pair(padding, "padding")
    stride = _pair(stride, "stride") if stride else list(kernel)
    *batch, height, width = [int(n) for n in x.get_size()]
    out_hw = [pooling_output_size(n, k, s, p, 1, ceil_mode)
              for n, k, s, p in zip((height, width), kernel, stride, padding)]
    dtype, acc = x.get_dtype(), _acc_dtype(x.get_dtype())
    _window_reuse(x, kernel)
    load = x.make_loader()

    def int_(value):
        return ops.constant(value, torch.int64)

    def inner_fn(index):
        i, j = index[-2:]
        total = ops.constant(0, acc)
        for kh in range(kernel[0]):
            for kw in range(kernel[1]):
                value, inside = _window_element(load, index, (kh, kw), (height, width), out_hw, stride, padding,
                                                (1, 1))
                value = cast(value, dtype, acc)
                total = ops.add(total, value if inside is None else ops.where(inside, value, ops.constant(0, acc)))
        if divisor_override:
            return cast(ops.truediv(total, ops.constant(divisor_override, acc)), acc, dtype)
        count = None
        for out_index, k, n, s, p in ((i, kernel[0], height, stride[0], padding[0]),
                                      (j, kernel[1], width, stride[1], padding[1])):
            start = ops.index_expr(out_index * s - p, torch.int64)
            end = ops.minimum(ops.add(start, int_(k)), int_(n + p))
            if not count_include_pad:
                start, end = ops.maximum(start, int_(0)), ops.minimum(end, int_(n))
            extent = ops.sub(end, start)
            count = extent if count is None else ops.mul(count, extent)
        return cast(ops.truediv(total, ops.to_dtype(count, acc)), acc, dtype)

    return ir.StorageBox(ir.Pointwise(x.get_device(), dtype, inner_fn, [*batch, *out_hw]))


# --------------------------------------------------------------------------- reductions


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype.is_floating_point:
        return torch.float64 if dtype == torch.float64 else torch.float32
    return torch.int64


def reduction(x, dims, keepdim: bool, reduction_type: str, acc_dtype=None) -> ir.StorageBox:
    """A realized Reduction of ``x`` over ``dims``, computed (and stored) in ``acc_dtype``."""
    if reduction_type not in REDUCTION_TYPES:
        raise ValueError(f"reduction type {reduction_type!r} is not one of the op table's "
                         f"{REDUCTION_TYPES} (ops_table.py); every kernel backend implements those")
    size = x.get_size()
    nd = len(size)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(nd))
    dims = sorted({d % max(nd, 1) for d in (dims if isinstance(dims, (list, tuple)) else [dims])})
    if nd == 0:
        dims = []
    acc_dtype = acc_dtype or _acc_dtype(x.get_dtype())
    kept = [i for i in range(nd) if i not in dims]
    k = reduction_split_point([size[i] for i in kept], [size[i] for i in dims], x.get_device())
    if k is not None:  # per outer index over the inner dims, then over the outer ones (and the inner, now 1)
        partial = reduction(x, dims[k:], True, reduction_type, acc_dtype)
        return reduction(partial, dims, keepdim, reduction_type, acc_dtype)
    ranges = [1 if i in dims else size[i] for i in range(nd)] if keepdim else [size[i] for i in kept]
    rranges = [size[i] for i in dims]
    load, src = x.make_loader(), x.get_dtype()

    def inner_fn(index, rindex):
        full_index = [None] * nd
        kept_index = [index[i] for i in kept] if keepdim else list(index)
        for i, v in zip(kept, kept_index):
            full_index[i] = v
        for i, v in zip(dims, rindex):
            full_index[i] = v
        return cast(load(full_index), src, acc_dtype)

    node = ir.Reduction(x.get_device(), acc_dtype, inner_fn, ranges, rranges, reduction_type, acc_dtype)
    box = ir.StorageBox(node)
    box.realize()
    return box


#: A reduction is split when it leaves fewer outputs than this (a Triton program each)...
SPLIT_BELOW_OUTPUTS = 1024
#: ...over at least this many elements each, and its inner part keeps at least ``SPLIT_MIN_INNER``.
SPLIT_ABOVE_RNUMEL = 4096
SPLIT_MIN_INNER = 256


def reduction_split_point(kept_sizes, reduced_sizes, device) -> int | None:
    """Where a two-stage reduction cuts the reduced dims (outer ``[:k]``, inner ``[k:]``), or None.

    ``sum(x, [0, 2, 3])`` of an ``(N, C, H, W)`` tensor is ``C`` programs of ``N*H*W`` elements each;
    cut at 1 it is ``N*C`` programs over ``H*W`` (contiguous rows), then ``C`` over ``N`` partials.
    The first cut that gives ``SPLIT_BELOW_OUTPUTS`` programs is taken, else the last whose inner
    part is long enough. Every reduction type of the op table is associative, so the two stages give
    the sum, product, max or min of the same elements (in another order of additions)."""
    if not (config.split_reductions and len(reduced_sizes) >= 2 and getattr(get_scheduling(device), "splits_reductions", False)):
        return None
    if not all(is_static(s) for s in (*kept_sizes, *reduced_sizes)):
        return None
    outputs = prod(kept_sizes)
    if outputs >= SPLIT_BELOW_OUTPUTS or prod(reduced_sizes) < SPLIT_ABOVE_RNUMEL:
        return None
    chosen = None
    for k in range(1, len(reduced_sizes)):
        if prod(reduced_sizes[k:]) < SPLIT_MIN_INNER or prod(reduced_sizes[:k]) < 2:
            continue
        chosen = k
        if outputs * prod(reduced_sizes[:k]) >= SPLIT_BELOW_OUTPUTS:
            break
    return chosen


@register_lowering(aten.sum)
def sum_(x, dim=None, keepdim=False, dtype=None):
    out = dtype or (torch.int64 if not x.get_dtype().is_floating_point else x.get_dtype())
    return to_dtype(reduction(x, dim, keepdim, "sum", _acc_dtype(out)), out)


@register_lowering(aten.prod)
def prod_(x, dim=None, keepdim=False, dtype=None):
    out = dtype or (torch.int64 if not x.get_dtype().is_floating_point else x.get_dtype())
    return to_dtype(reduction(x, dim, keepdim, "prod", _acc_dtype(out)), out)


@register_lowering(aten.amax)
def amax(x, dim=(), keepdim=False):
    return _max_or_min(x, dim, keepdim, "max")


@register_lowering(aten.amin)
def amin(x, dim=(), keepdim=False):
    return _max_or_min(x, dim, keepdim, "min")


def _max_or_min(x, dim, keepdim, kind):
    if prod(x.get_size()) == 0:
        raise LoweringDeclined("max/min of an empty tensor (eager raises)")
    acc = x.get_dtype() if x.get_dtype() != torch.bool else torch.int8
    return to_dtype(reduction(x, dim, keepdim, kind, _acc_dtype(acc) if acc.is_floating_point else acc), x.get_dtype())


def _numel_of(x, dims) -> int:
    size = x.get_size()
    if dims is None or len(dims) == 0:
        return prod(size)
    return prod(size[d % len(size)] for d in dims)


@register_lowering(aten.mean)
def mean(x, dim=None, keepdim=False, dtype=None):
    out = dtype or x.get_dtype()
    if not out.is_floating_point:
        raise LoweringDeclined("mean of an integer tensor")
    total = reduction(x, dim, keepdim, "sum", _acc_dtype(out))
    n = _numel_of(x, dim)
    return to_dtype(pointwise(ops.truediv, total, _count(n)), out)


def _count(n):
    """An element count as a divisor: a float, or the symbolic size itself (read at run time)."""
    if not is_static(n):
        return n
    return float(n) if n else float("nan")


@register_lowering(aten.var)
def var(x, dim=None, *, correction=None, keepdim=False):
    if not x.get_dtype().is_floating_point:
        raise LoweringDeclined("var of an integer tensor")
    correction = 1 if correction is None else correction
    n = _numel_of(x, dim)
    acc = _acc_dtype(x.get_dtype())
    xf = to_dtype(x, acc)
    mu = pointwise(ops.truediv, reduction(xf, dim, True, "sum"), _count(n))
    centered = pointwise(ops.sub, xf, mu)
    sq = reduction(pointwise(lambda v: ops.mul(v, v), centered), dim, keepdim, "sum")
    dof = float(max(n - correction, 0)) if is_static(n) else size_expr(n - correction)
    return to_dtype(pointwise(ops.truediv, sq, dof), x.get_dtype())


# --------------------------------------------------------------------------- indirect indexing
# ``ops.indirect_indexing(value, size)`` turns a loaded integer into an index variable (a sympy
# symbol the backend binds to that value, negative indices wrapped), so a load can use it.


def _check_indirect(x) -> None:
    """Indexing lowers to indirect loads/stores only where ``x``'s kernel backend has them
    (``supports_indirect_indexing`` on its scheduling class: codegen/common.py); elsewhere the
    op runs in torch, with the reason logged."""
    if not config.indirect_indexing:
        raise LoweringDeclined("config.indirect_indexing is off")
    backend = get_scheduling(x.get_device())
    if not getattr(backend, "supports_indirect_indexing", False):
        raise LoweringDeclined(f"the {type(backend).__name__} kernel backend has no ops.indirect_indexing "
                          "(it does not declare supports_indirect_indexing = True)")


@register_lowering(aten.embedding)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    _check_indirect(weight)
    if len(weight.get_size()) != 2:
        raise LoweringDeclined("embedding with a non-2-D weight")
    rows, dim = weight.get_size()
    load_w, load_i = weight.make_loader(), indices.make_loader()
    isize = indices.get_size()

    def inner_fn(index):
        row = ops.indirect_indexing(load_i(index[: len(isize)]), rows)
        return load_w([row, index[-1]])

    return ir.StorageBox(ir.Pointwise(weight.get_device(), weight.get_dtype(), inner_fn, isize + [dim]))


@register_lowering(aten.gather)
def gather(x, dim, index, sparse_grad=False):
    _check_indirect(x)
    size = x.get_size()
    if len(size) == 0:
        raise LoweringDeclined("gather from a 0-d tensor")
    dim = dim % len(size)
    load_x, load_i = x.make_loader(), index.make_loader()

    def inner_fn(idx):
        pos = ops.indirect_indexing(load_i(idx), size[dim])
        return load_x(list(idx[:dim]) + [pos] + list(idx[dim + 1:]))

    return ir.StorageBox(ir.Pointwise(x.get_device(), x.get_dtype(), inner_fn, index.get_size()))


class _NotAffine(Exception):
    pass


class _AffineHandler:
    """Runs an index tensor's body symbolically: an ``arange`` (times a step, plus a start)
    comes out as a sympy expression of the loop index; anything else (a load) raises."""

    def index_expr(self, expr, dtype):
        return sympy.sympify(expr)

    def constant(self, value, dtype):
        if isinstance(value, bool) or int(value) != value:
            raise _NotAffine
        return sympy.Integer(int(value))

    def to_dtype(self, x, dtype, *args, **kwargs):
        if dtype.is_floating_point or dtype == torch.bool:
            raise _NotAffine
        return x

    def add(self, a, b):
        return a + b

    def sub(self, a, b):
        return a - b

    def mul(self, a, b):
        return a * b

    def __getattr__(self, name):
        raise _NotAffine


def affine_index(x) -> tuple[int, int, int] | None:
    """``(start, step, n)`` when the 1-D integer tensor ``x`` is ``start + step * arange(n)`` in
    the IR (not yet in memory), else None. Such an index needs no load and no runtime check:
    a slice's or select's gradient, ``wpe(arange(T))``."""
    if not is_ir(x) or len(x.get_size()) != 1 or x.get_dtype() not in (torch.int64, torch.int32):
        return None
    i = sympy.Symbol("i_affine", integer=True)
    try:
        with V.set_ops_handler(_AffineHandler()):
            expr = sympy.expand(sympy.sympify(x.make_loader()([i])))
    except (_NotAffine, TypeError, RuntimeError, AttributeError):
        return None
    if expr.free_symbols - {i} or sympy.degree(expr, i) > 1:
        return None
    step, start = expr.coeff(i, 1), expr.coeff(i, 0)
    if not (step.is_Integer and start.is_Integer):
        return None
    return int(start), int(step), size_expr(x.get_size()[0])


def _affine_in_bounds(affine, size) -> bool:
    start, step, n = affine
    if not (is_static(n) and is_static(size)):  # symbolic: in bounds only if it holds for every size
        last = sympy.expand(start + step * (n - 1) - size)
        return step >= 0 and 0 <= start and (size - start) != 0 and last.is_negative is True
    return n == 0 or (0 <= start < size and 0 <= start + step * (n - 1) < size)


def _index_plan(size, indices):
    """Advanced indexing's shape rule: ``(out_size, position)`` where ``position(idx)`` is the
    index into ``x`` (indirect for the indexed dims) of element ``idx`` of ``x[indices]``.

    The index tensors broadcast together; their dims replace the indexed dims in place when
    the indexed dims are adjacent, and go first otherwise (NumPy's rule).
    """
    indices = list(indices) + [None] * (len(size) - len(indices))
    pos = [d for d, t in enumerate(indices) if t is not None]
    if any(indices[d].get_dtype() == torch.bool for d in pos):
        raise LoweringDeclined("boolean-mask indexing (data-dependent output shape)")
    bshape = broadcast_shapes(*[indices[d].get_size() for d in pos])
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    before = [d for d in range(pos[0]) if indices[d] is None] if adjacent else []
    after = [d for d in range(len(size)) if indices[d] is None and d not in before]
    out_size = [size[d] for d in before] + bshape + [size[d] for d in after]
    loaders = {d: broadcast_loader(indices[d], bshape) for d in pos}
    # an arange-like index tensor (in bounds) is index arithmetic, not a load
    direct = {}
    for d in pos:
        affine = affine_index(indices[d]) if len(bshape) == 1 else None
        if affine is not None and _affine_in_bounds(affine, size[d]) and indices[d].get_size() == bshape:
            direct[d] = affine

    def position(idx):
        nb, nk = len(before), len(bshape)
        full = [None] * len(size)
        for k, d in enumerate(before):
            full[d] = idx[k]
        for k, d in enumerate(after):
            full[d] = idx[nb + nk + k]
        for d in pos:
            if d in direct:
                start, step, _ = direct[d]
                full[d] = start + step * idx[nb]
            else:
                full[d] = ops.indirect_indexing(loaders[d](idx[nb:nb + nk]), size[d])
        return full

    return out_size, position


@register_lowering(aten.index)
def index(x, indices):
    """Advanced indexing ``x[i0, :, i2]``: each index tensor becomes an indirect load."""
    _check_indirect(x)
    if all(t is None for t in indices):
        return clone(x)
    out_size, position = _index_plan(x.get_size(), indices)
    load_x = x.make_loader()
    return ir.StorageBox(ir.Pointwise(x.get_device(), x.get_dtype(), lambda idx: load_x(position(idx)), out_size))


# --------------------------------------------------------------------------- scatters
# index_put / scatter_add / the embedding backward write at loaded indices: a fresh buffer (a
# copy of the input, or zeros), then an ``ir.ScatterBuffer`` that stores or atomically adds
# into it (its own kernel; see ir.py). Low-precision adds accumulate in float32, then round
# once, as TorchInductor's decomposition does (many bf16 adds into one row would lose bits).


def _accumulate_dtype(dtype: torch.dtype, accumulate: bool) -> torch.dtype:
    return torch.float32 if accumulate and dtype in (torch.float16, torch.bfloat16) else dtype


def _scatter(x, size, device, dtype, ranges, position, value_fn, accumulate: bool, init=None):
    """``out = init or zeros``; ``out[position(i)] (+)= value_fn(i)`` for ``i`` in ``ranges``.

    ``x`` gives the initial contents when ``init`` is None and ``x`` is an IR node; the result
    is ``out`` cast back to ``dtype``.
    """
    acc = _accumulate_dtype(dtype, accumulate)
    if x is None:
        start = ir.Pointwise(device, acc, lambda idx: ops.constant(0, acc), list(size))
    else:
        load = x.make_loader()
        start = ir.Pointwise(device, acc, lambda idx: cast(load(idx), x.get_dtype(), acc), list(size))
    target = ir.StorageBox(start).realize()   # always a fresh buffer: the op is functional
    body = ir.Pointwise(device, acc, lambda idx: value_fn(idx, acc), list(ranges))
    scatter = ir.ScatterBuffer(None, target, body, position, "atomic_add" if accumulate else None)
    V.graph.register_buffer(scatter)
    if acc == dtype:
        return target
    return to_dtype(target, dtype)


@register_lowering(aten.index_put)
def index_put(x, indices, values, accumulate=False):
    """``x[indices] = values`` (or ``+=`` with ``accumulate``) on a copy of ``x``."""
    _check_indirect(x)
    if all(t is None for t in indices):
        raise LoweringDeclined("index_put without index tensors")
    plain = _index_put_as_select(x, indices, values, bool(accumulate))
    if plain is not None:
        return plain
    out_size, position = _index_plan(x.get_size(), indices)
    if is_ir(values):
        load_v = broadcast_loader(values, out_size)
        value_fn = lambda idx, acc: cast(load_v(idx), values.get_dtype(), acc)
    else:
        value_fn = lambda idx, acc: ops.constant(values, acc)
    return _scatter(x, x.get_size(), x.get_device(), x.get_dtype(), out_size, position, value_fn, bool(accumulate))


def _index_put_as_select(x, indices, values, accumulate: bool):
    """``index_put`` along one dim ``d`` with an in-bounds ``start + step * arange(n)`` index
    (``step > 0``: each place hit at most once) is pointwise: place ``j`` takes
    ``values[(j_d - start) // step]`` where it is hit, ``x[j]`` elsewhere (``x[j] + value`` with
    ``accumulate``). That is a slice's or select's gradient: it fuses into the kernel that uses
    it instead of a fill and a scatter. None when the index is anything else."""
    size = x.get_size()
    pos = [d for d, t in enumerate(indices) if t is not None]
    if len(pos) != 1 or not is_ir(values) and not isinstance(values, (int, float)):
        return None
    d = pos[0]
    affine = affine_index(indices[d])
    if affine is None or affine[1] <= 0 or not _affine_in_bounds(affine, size[d]):
        return None
    start, step, n = affine
    if n == 0:
        return None
    vsize = list(size[:d]) + [n] + list(size[d + 1:])
    if is_ir(values) and broadcast_shapes(values.get_size(), vsize) != vsize:
        return None
    dtype = x.get_dtype()
    load_x = x.make_loader()
    load_v = broadcast_loader(values, vsize) if is_ir(values) else None

    def inner_fn(idx):
        j = ops.index_expr(idx[d], torch.int64)
        offset = ops.sub(j, ops.constant(start, torch.int64))
        hit = ops.logical_and(ops.ge(offset, ops.constant(0, torch.int64)),
                              ops.lt(offset, ops.constant(step * (n - 1) + 1, torch.int64)))
        # clamped into [0, step * (n - 1)] (where the place is not hit its row is never used), so
        # the division below has non-negative operands (floor and truncation agree)
        clamped = ops.minimum(ops.maximum(offset, ops.constant(0, torch.int64)),
                              ops.constant(step * (n - 1), torch.int64))
        k = ops.floordiv(clamped, ops.constant(step, torch.int64)) if step != 1 else clamped
        if step != 1:
            hit = ops.logical_and(hit, ops.eq(clamped, ops.mul(k, ops.constant(step, torch.int64))))
        old = load_x(idx)
        if load_v is None:
            new = ops.constant(values, dtype)
        else:
            row = ops.indirect_indexing(k, n, False)
            new = cast(load_v(list(idx[:d]) + [row] + list(idx[d + 1:])), values.get_dtype(), dtype)
        if accumulate:
            new = ops.add(old, new)
        return ops.where(hit, new, old)

    return ir.StorageBox(ir.Pointwise(x.get_device(), dtype, inner_fn, list(size)))


@register_lowering(aten.scatter_add)
def scatter_add(x, dim, index, src):
    """``out[..., index[i], ...] += src[i]`` along ``dim``, on a copy of ``x``."""
    _check_indirect(x)
    size = x.get_size()
    if len(size) == 0:
        raise LoweringDeclined("scatter_add into a 0-d tensor")
    dim = dim % len(size)
    load_i, load_s = index.make_loader(), src.make_loader()

    def position(idx):
        return list(idx[:dim]) + [ops.indirect_indexing(load_i(idx), size[dim])] + list(idx[dim + 1:])

    value_fn = lambda idx, acc: cast(load_s(idx), src.get_dtype(), acc)
    return _scatter(x, size, x.get_device(), x.get_dtype(), index.get_size(), position, value_fn, True)


@register_lowering(aten.embedding_dense_backward)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The embedding's weight gradient: each index's gradient row added into its weight row
    (atomic adds), none for ``padding_idx``."""
    _check_indirect(grad_output)
    if scale_grad_by_freq:
        raise LoweringDeclined("embedding backward with scale_grad_by_freq")
    isize = indices.get_size()
    dim = grad_output.get_size()[-1]
    load_i, load_g = indices.make_loader(), grad_output.make_loader()
    ranges = list(isize) + [dim]

    def position(idx):
        return [ops.indirect_indexing(load_i(idx[:len(isize)]), num_weights), idx[-1]]

    def value_fn(idx, acc):
        grad = cast(load_g(idx), grad_output.get_dtype(), acc)
        if padding_idx is None or padding_idx < 0:
            return grad
        is_pad = ops.eq(load_i(idx[:len(isize)]), ops.constant(padding_idx, indices.get_dtype()))
        return ops.where(is_pad, ops.constant(0, acc), grad)

    return _scatter(None, [num_weights, dim], grad_output.get_device(), grad_output.get_dtype(),
                    ranges, position, value_fn, True)
