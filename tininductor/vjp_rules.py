"""One vector-Jacobian product (VJP) rule per prim: the registry reverse-mode AD runs on.

A rule answers "given the gradient ``grad`` of this op's output, what are the gradients of
its inputs?". It is called as ``rule(grad, out, *args, **kwargs)`` with the same arguments
the forward op got (tensors, Python numbers, lists) plus its output ``out``, and returns one
entry per positional argument: a tensor gradient, or ``None`` where the argument is not
differentiable (an int, a shape, an index tensor, a bool mask).

Rules of prims are written with prims, so the backward graph that tracing them produces is
in the prim set too. Binary ops broadcast, so each input gradient is summed back to the
input's shape (:func:`sum_to_size`), which is the one subtle step of reverse-mode AD.

Ops outside the prim set that real models train through (convolution, batch/group norm, the
fused attention kernels, pooling, losses...) stay fallback/extern calls in the forward, and
their rules call ATen's own backward op (``aten.convolution_backward``...), as TorchInductor
does: short, exactly eager's formula, and the fused kernels keep their speed.

A multi-output op's rule gets ``grads``, a list with one gradient per output (``None`` for
an output no gradient reached), and ``out``, the tuple of its outputs.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch._library.custom_ops import OPDEFS

from tininductor.registry import OpRegistry, lookup

aten = torch.ops.aten
prims = torch.ops.prims

#: op -> VJP rule, keyed by packet (every overload) or overload, read exact overload first
#: (tininductor/registry.py's keying rule).
VJP_RULES = OpRegistry("VJP rules")


def register_vjp(*ops) -> Callable:
    """Register ``fn`` as the VJP rule of each op; an OpOverloadPacket stands for all of its overloads."""
    return VJP_RULES.register(*ops)


def get_vjp(target, rules: dict | None = None) -> Callable:
    """The rule for an FX node target (from ``rules``, default the registry), or a clear error."""
    packet = getattr(target, "overloadpacket", target)
    rule = lookup(VJP_RULES if rules is None else rules, target)
    if rule is None:
        rule = custom_op_vjp(target)
        if rule is not None:
            return rule
        raise NotImplementedError(
            f"no VJP rule for {target}: register one with "
            f"@tininductor.vjp_rules.register_vjp({packet}) (or decompose the op into prims "
            f"that have rules)")
    return rule


class _CustomOpCtx:
    """The ``ctx`` a ``torch.library.register_autograd`` formula expects (what it saves, read back)."""

    def __init__(self, args):
        self.needs_input_grad = tuple(isinstance(a, torch.Tensor) and a.dtype.is_floating_point for a in args)
        self.saved_tensors = ()

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *args):
        pass

    def set_materialize_grads(self, value):
        pass


def custom_op_vjp(target) -> Callable | None:
    """A rule made from a custom op's own autograd formula, or None when it has none.

    An op made with ``torch.library.custom_op`` carries the ``backward`` and ``setup_context``
    given to ``register_autograd`` (transformers' Mixture-of-Experts ``grouped_mm_fallback``,
    for one). Both are written in torch ops, so running them here under tracing records the
    backward, exactly the formula eager autograd would run, as AOTAutograd does for such ops.
    """
    schema = getattr(target, "_schema", None)
    opdef = OPDEFS.get(schema.name) if schema is not None else None
    if opdef is None or getattr(opdef, "_backward_fn", None) is None:
        return None

    def rule(grad, out, *args, **kwargs):
        ctx = _CustomOpCtx(args)
        if opdef._setup_context_fn is not None:
            if kwargs:  # keyword-only inputs go in their own argument
                opdef._setup_context_fn(ctx, args, kwargs, out)
            else:
                opdef._setup_context_fn(ctx, args, out)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        grads = grad if isinstance(out, (tuple, list)) else [grad]
        grads = [aten.zeros_like(o) if g is None and is_tensor(o) else g for g, o in zip(grads, outs)]  # as eager
        result = opdef._backward_fn(ctx, *grads)
        result = list(result) if isinstance(result, (tuple, list)) else [result]
        return tuple(result[:len(args)]) + ((dict(zip(kwargs, result[len(args):])),) if kwargs else ())

    rule.__name__ = f"vjp_from_register_autograd[{schema.name}]"
    return rule


def is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def sum_to_size(grad: torch.Tensor, x) -> torch.Tensor | None:
    """Undo broadcasting: sum ``grad`` over the dims along which ``x`` was broadcast.

    Broadcasting prepends dims and stretches size-1 dims, so the gradient of a broadcast input
    is the sum over the prepended dims and, keeping them, over the stretched ones.
    ``None`` for a non-tensor ``x`` (a Python number has no gradient).
    """
    if not is_tensor(x):
        return None
    shape = list(x.shape)
    if list(grad.shape) == shape:
        return grad
    lead = grad.dim() - len(shape)
    dims = list(range(lead)) + [
        lead + i for i, size in enumerate(shape) if size == 1 and grad.shape[lead + i] != 1
    ]
    if dims:
        grad = aten.sum(grad, dims, keepdim=True)
    return aten.view(grad, shape)


def _zeros(x: torch.Tensor) -> torch.Tensor:
    return aten.full.default(list(x.shape), 0, dtype=x.dtype, device=x.device)


def _zeros_like_shape(x, grad):
    """Zeros with ``x``'s shape and ``grad``'s dtype and device."""
    return aten.full.default(list(x.shape), 0, dtype=grad.dtype, device=grad.device)


def _reshape(x: torch.Tensor, shape) -> torch.Tensor:
    if not x.is_contiguous():
        x = aten.clone(x, memory_format=torch.contiguous_format)
    return aten.view(x, list(shape))


def _dims(dim, ndim: int) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted(d % max(ndim, 1) for d in dims)


def _unreduce(grad: torch.Tensor, x: torch.Tensor, dims: list[int], keepdim: bool) -> torch.Tensor:
    """Put the reduced dims back (size 1) and expand ``grad`` to ``x``'s shape."""
    if not keepdim:
        for d in dims:
            grad = aten.unsqueeze(grad, d)
    return aten.expand(grad, list(x.shape))


# ----------------------------------------------------------------------------- pointwise unary
@register_vjp(aten.neg)
def neg_vjp(grad, out, x):
    return (aten.neg(grad),)


@register_vjp(aten.abs)
def abs_vjp(grad, out, x):
    return (aten.mul(grad, aten.sign(x)),)


@register_vjp(aten.exp)
def exp_vjp(grad, out, x):
    return (aten.mul(grad, out),)


@register_vjp(aten.log)
def log_vjp(grad, out, x):
    return (aten.div(grad, x),)


@register_vjp(aten.log1p)
def log1p_vjp(grad, out, x):
    return (aten.div(grad, aten.add(x, 1)),)


@register_vjp(aten.expm1)
def expm1_vjp(grad, out, x):
    return (aten.mul(grad, aten.add(out, 1)),)


@register_vjp(aten.sqrt)
def sqrt_vjp(grad, out, x):
    return (aten.div(grad, aten.mul(out, 2)),)


@register_vjp(aten.rsqrt)
def rsqrt_vjp(grad, out, x):
    # d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 out^3
    return (aten.mul(grad, aten.mul(aten.mul(aten.mul(out, out), out), -0.5)),)


@register_vjp(aten.reciprocal)
def reciprocal_vjp(grad, out, x):
    return (aten.mul(grad, aten.neg(aten.mul(out, out))),)


@register_vjp(aten.sin)
def sin_vjp(grad, out, x):
    return (aten.mul(grad, aten.cos(x)),)


@register_vjp(aten.cos)
def cos_vjp(grad, out, x):
    return (aten.mul(grad, aten.neg(aten.sin(x))),)


@register_vjp(aten.tanh)
def tanh_vjp(grad, out, x):
    return (aten.mul(grad, aten.add(aten.neg(aten.mul(out, out)), 1)),)


@register_vjp(aten.sigmoid)
def sigmoid_vjp(grad, out, x):
    return (aten.mul(grad, aten.mul(out, aten.add(aten.neg(out), 1))),)


@register_vjp(aten.erf)
def erf_vjp(grad, out, x):
    # d/dx erf(x) = 2/sqrt(pi) exp(-x^2)
    return (aten.mul(grad, aten.mul(aten.exp(aten.neg(aten.mul(x, x))), 2 / math.sqrt(math.pi))),)


@register_vjp(aten.relu)
def relu_vjp(grad, out, x):
    return (aten.where(aten.gt(out, 0), grad, aten.scalar_tensor(0, dtype=grad.dtype,
                                                                  device=grad.device)),)


@register_vjp(aten.sign, aten.sgn, aten.floor, aten.ceil, aten.round, aten.trunc, aten.bernoulli)
def zero_gradient_vjp(grad, out, x, *args, **kwargs):
    """Piecewise-constant ops (and random draws, ``bernoulli``): the output requires grad, as
    in eager, and the gradient is zero."""
    return (_zeros_like_shape(x, grad),) + (None,) * len(args)


# ----------------------------------------------------------------------------- pointwise binary
@register_vjp(aten.add)
def add_vjp(grad, out, a, b, alpha=1):
    gb = grad if alpha == 1 else aten.mul(grad, alpha)
    return sum_to_size(grad, a), sum_to_size(gb, b)


@register_vjp(aten.sub)
def sub_vjp(grad, out, a, b, alpha=1):
    gb = aten.neg(grad) if alpha == 1 else aten.mul(grad, -alpha)
    return sum_to_size(grad, a), sum_to_size(gb, b)


@register_vjp(aten.mul)
def mul_vjp(grad, out, a, b):
    ga = sum_to_size(aten.mul(grad, b), a) if is_tensor(a) else None
    gb = sum_to_size(aten.mul(grad, a), b) if is_tensor(b) else None
    return ga, gb


@register_vjp(aten.div)
def div_vjp(grad, out, a, b, rounding_mode=None):
    if rounding_mode is not None:  # floor/trunc division is piecewise constant
        return (sum_to_size(_zeros(grad), a), sum_to_size(_zeros(grad), b))
    ga = aten.div(grad, b)
    # d(a/b)/db = -a/b^2 = -out/b
    gb = aten.neg(aten.div(aten.mul(grad, out), b)) if is_tensor(b) else None
    return sum_to_size(ga, a), (sum_to_size(gb, b) if gb is not None else None)


@register_vjp(aten.pow)
def pow_vjp(grad, out, base, exponent):
    ga = gb = None
    if is_tensor(base):
        # d/da a^e = e * a^(e-1)
        exponent_minus_1 = aten.sub(exponent, 1) if is_tensor(exponent) else exponent - 1
        ga = aten.mul(grad, aten.mul(aten.pow(base, exponent_minus_1), exponent))
        ga = sum_to_size(ga, base)
    if is_tensor(exponent):
        # d/de a^e = a^e * log(a); define it as 0 where a == 0 (as eager does)
        log_base = aten.log(base) if is_tensor(base) else math.log(base) if base > 0 else 0.0
        gb = aten.mul(grad, aten.mul(out, log_base))
        if is_tensor(base):
            gb = aten.where(aten.eq(base, 0), aten.scalar_tensor(0, dtype=grad.dtype,
                                                                   device=grad.device), gb)
        gb = sum_to_size(gb, exponent)
    return ga, gb


def _minmax_vjp(grad, out, a, b, pick):
    """Gradient flows to the input that won; a tie splits it in half (as eager does)."""
    zero = aten.scalar_tensor(0, dtype=grad.dtype, device=grad.device)
    half = aten.mul(grad, 0.5)
    tie = aten.eq(a, b)
    ga = aten.where(tie, half, aten.where(pick(a, b), grad, zero))
    gb = aten.where(tie, half, aten.where(pick(b, a), grad, zero))
    return sum_to_size(ga, a), sum_to_size(gb, b)


@register_vjp(aten.maximum)
def maximum_vjp(grad, out, a, b):
    return _minmax_vjp(grad, out, a, b, aten.gt)


@register_vjp(aten.minimum)
def minimum_vjp(grad, out, a, b):
    return _minmax_vjp(grad, out, a, b, aten.lt)


@register_vjp(aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge, aten.logical_and,
              aten.logical_or, aten.logical_not, aten.bitwise_and, aten.bitwise_or)
def not_differentiable(grad, out, *args, **kwargs):
    """Comparisons and logic return bools, bitwise ops integers: nothing flows back."""
    return (None,) * len(args)


@register_vjp(aten.where)
def where_vjp(grad, out, cond, a, b):
    zero = aten.scalar_tensor(0, dtype=grad.dtype, device=grad.device)
    return (None, sum_to_size(aten.where(cond, grad, zero), a),
            sum_to_size(aten.where(cond, zero, grad), b))


@register_vjp(prims.convert_element_type)
def convert_element_type_vjp(grad, out, x, dtype):
    if not x.dtype.is_floating_point and not x.dtype.is_complex:
        return None, None
    return prims.convert_element_type(grad, x.dtype), None


@register_vjp(aten.clone, aten.alias)
def identity_vjp(grad, out, x, **kwargs):
    return (grad,)


@register_vjp(aten.detach)
def detach_vjp(grad, out, x):
    return (None,)  # no gradient flows through detach (``torch.no_grad()`` regions become detach)


# ----------------------------------------------------------------------------- views
@register_vjp(aten.view)
def view_vjp(grad, out, x, shape):
    return _reshape(grad, x.shape), None


@register_vjp(aten.expand)
def expand_vjp(grad, out, x, shape, implicit=False):
    return sum_to_size(grad, x), None


@register_vjp(aten.permute)
def permute_vjp(grad, out, x, dims):
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d % len(dims)] = i
    return aten.permute(grad, inverse), None


def _non_overlapping(size, stride) -> bool:
    """Does the view ``(size, stride)`` reach each storage element at most once? (sufficient test:
    dims sorted by stride, each one steps past the whole extent of the smaller ones)"""
    extent = 1
    for st, n in sorted((st, n) for n, st in zip(size, stride) if n != 1):
        if st < extent:
            return False
        extent = st * n
    return True


@register_vjp(aten.as_strided)
def as_strided_vjp(grad, out, x, size, stride, storage_offset=None):
    # each element of the view is one element of x's storage: scatter the gradient back there
    # (zeros_like keeps x's strides, so storage positions mean the same for x and its gradient)
    dense = _non_overlapping(x.shape, x.stride()) and \
        1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride())) == x.numel()
    if not (dense and x.storage_offset() == 0 and _non_overlapping(size, stride)):
        raise NotImplementedError(
            "as_strided of a view, or a view that reads an element twice (its gradient would have to "
            "add up the copies): not differentiated here")
    return aten.as_strided_scatter(aten.zeros_like(x), grad, size, stride, storage_offset), None, None, None


@register_vjp(aten.unsqueeze)
def unsqueeze_vjp(grad, out, x, dim):
    return _reshape(grad, x.shape), None


@register_vjp(aten.squeeze)
def squeeze_vjp(grad, out, x, dim=None):
    return _reshape(grad, x.shape), None


def _scatter_into_zeros(x, dim, index, grad):
    """Zeros shaped like ``x`` with ``grad`` written at positions ``index`` along ``dim``."""
    return aten.index_put(_zeros_like_shape(x, grad), [None] * dim + [index], grad, True)


@register_vjp(aten.slice)
def slice_vjp(grad, out, x, dim=0, start=None, end=None, step=1):
    dim = dim % x.dim()
    size = x.shape[dim]
    start = 0 if start is None else start
    end = size if end is None else end
    start = max(0, min(size, start + size if start < 0 else start))
    end = max(start, min(size, end + size if end < 0 else end))
    index = aten.arange(start, end, step, device=grad.device)
    return (_scatter_into_zeros(x, dim, index, grad),) + (None,) * 4


@register_vjp(aten.select)
def select_vjp(grad, out, x, dim, index):
    dim = dim % x.dim()
    index = index % x.shape[dim]
    rows = aten.arange(index, index + 1, device=grad.device)
    return _scatter_into_zeros(x, dim, rows, aten.unsqueeze(grad, dim)), None, None


# ----------------------------------------------------------------------------- reductions
@register_vjp(aten.sum)
def sum_vjp(grad, out, x, dim=None, keepdim=False, dtype=None):
    g = _unreduce(grad, x, _dims(dim, x.dim()), keepdim)
    if g.dtype != x.dtype:
        g = prims.convert_element_type(g, x.dtype)
    return g, None, None, None


@register_vjp(aten.mean)
def mean_vjp(grad, out, x, dim=None, keepdim=False, dtype=None):
    dims = _dims(dim, x.dim())
    count = math.prod(x.shape[d] for d in dims) if x.dim() else 1
    return aten.div(_unreduce(grad, x, dims, keepdim), count), None, None, None


def _amax_amin_vjp(grad, out, x, dim=(), keepdim=False):
    """The max (min) gets the gradient; ties share it evenly (as eager does)."""
    dims = _dims(dim, x.dim())
    hit = aten.eq(x, _unreduce(out, x, dims, keepdim))
    hits = prims.convert_element_type(hit, grad.dtype)
    count = aten.sum(hits, dims, keepdim=True)
    return aten.div(aten.mul(_unreduce(grad, x, dims, keepdim), hits), count), None, None


register_vjp(aten.amax)(_amax_amin_vjp)
register_vjp(aten.amin)(_amax_amin_vjp)


# ----------------------------------------------------------------------------- creation
@register_vjp(aten.full, aten.scalar_tensor, aten.arange, aten.empty)
def creation_vjp(grad, out, *args, **kwargs):
    return (None,) * len(args)


# ----------------------------------------------------------------------------- indexing
@register_vjp(aten.index, aten._unsafe_index)
def index_vjp(grad, out, x, indices):
    """Scatter-add the gradient back to the rows it was read from (repeats accumulate)."""
    return aten.index_put(_zeros_like_shape(x, grad), indices, grad, True), None


@register_vjp(aten.index_put)
def index_put_vjp(grad, out, x, indices, values, accumulate=False):
    if accumulate:
        gx = grad
    else:  # overwritten places got nothing from x
        gx = aten.index_put(grad, indices, aten.scalar_tensor(0, dtype=grad.dtype,
                                                               device=grad.device))
    gv = sum_to_size(aten.index(grad, indices), values) if is_tensor(values) else None
    return gx, None, gv, None


@register_vjp(aten.gather)
def gather_vjp(grad, out, x, dim, index, sparse_grad=False):
    return aten.scatter_add(_zeros_like_shape(x, grad), dim, index, grad), None, None, None


@register_vjp(aten.scatter_add)
def scatter_add_vjp(grad, out, x, dim, index, src):
    return grad, None, None, aten.gather(grad, dim, index)


# ----------------------------------------------------------------------------- extern
@register_vjp(aten.mm)
def mm_vjp(grad, out, a, b):
    ga = aten.mm(grad, aten.permute(b, [1, 0]))
    if b.dim() == 2 and b.stride(0) == 1 and b.stride(1) != 1:
        # ``b`` is a transposed matrix (``x @ weight.t()`` in a Linear): make its gradient in that
        # layout too, ``(grad^T a)^T``, so the weight's own gradient comes out contiguous, as eager
        # makes it (else autograd copies every such gradient into the weight's layout)
        gb = aten.permute(aten.mm(aten.permute(grad, [1, 0]), a), [1, 0])
    else:
        gb = aten.mm(aten.permute(a, [1, 0]), grad)
    return ga, gb


@register_vjp(aten.bmm)
def bmm_vjp(grad, out, a, b):
    return aten.bmm(grad, aten.permute(b, [0, 2, 1])), aten.bmm(aten.permute(a, [0, 2, 1]), grad)


# ----------------------------------------------------------------------------- fallback ops
# A few ops outside the prim set are common enough in real models that training should work
# through them while the lowering runs them as fallback kernels. Their rules use prims too.
@register_vjp(aten.cat)
def cat_vjp(grad, out, tensors, dim=0):
    """Each input's gradient is its slice of the output gradient."""
    dim = dim % grad.dim()
    grads, start = [], 0
    for t in tensors:
        if t.dim() == 1 and t.shape[0] == 0:  # cat skips legacy empty inputs
            grads.append(None)
            continue
        grads.append(aten.slice(grad, dim, start, start + t.shape[dim]))
        start += t.shape[dim]
    return grads, None



# ----------------------------------------------------------------------------- non-differentiable
#: Ops whose outputs never require grad, as in eager: the ``*_like`` / ``new_*`` creation ops
#: read only a shape, dtype and device. AD treats their outputs as constants
#: (joint_graph.requires_grad_nodes).
NOT_DIFFERENTIABLE: set = {
    aten.empty_like, aten.zeros_like, aten.ones_like, aten.full_like, aten.rand_like,
    aten.randn_like, aten.randint_like, aten.new_empty, aten.new_empty_strided, aten.new_zeros,
    aten.new_ones, aten.new_full, aten.empty_strided,
}


#: In-place ops whose writes are not differentiable in eager: batch norm's running statistics
#: are updated under no_grad (joint_graph.check_no_differentiable_mutation).
NON_DIFFERENTIABLE_MUTATIONS: set = {
    aten._native_batch_norm_legit, aten.native_batch_norm, aten._batch_norm_with_update,
    aten.cudnn_batch_norm, aten.miopen_batch_norm, aten._native_batch_norm_legit_no_training,
}

#: Multi-output op -> indices of its outputs that are not differentiable (eager's
#: ``output_differentiability``): the running-stat outputs of functional batch norm are updated
#: buffers, not functions AD should differentiate.
NON_DIFFERENTIABLE_OUTPUTS: dict = {
    aten._native_batch_norm_legit_functional: {1, 2, 3, 4},
    aten._native_batch_norm_legit: {1, 2},
    aten._native_batch_norm_legit_no_training: {1, 2},
    aten.native_batch_norm: {1, 2},
    aten.native_layer_norm: {1, 2},
    aten._scaled_dot_product_flash_attention_for_cpu: {1},
    aten._scaled_dot_product_flash_attention: set(range(1, 9)),
    aten._scaled_dot_product_efficient_attention: {1, 2, 3},
    aten._scaled_dot_product_cudnn_attention: set(range(1, 9)),
    aten.nll_loss_forward: {1},
    aten.log_sigmoid_forward: {1},
    aten.native_dropout: {1},
    aten.max_pool2d_with_indices: {1},
    aten.adaptive_max_pool2d: {1},
    aten.adaptive_max_pool3d: {1},
    aten.max_pool3d_with_indices: {1},
}


def _first(grads, like):
    """The gradient of output 0 of a multi-output op (zeros if only other outputs got one)."""
    g = grads[0] if isinstance(grads, (list, tuple)) else grads
    return g if g is not None else _zeros(like)


# ----------------------------------------------------------------------------- multi-output
# A multi-output op's rule gets ``grads``: one gradient per output, ``None`` for an output no
# gradient reached. Where ATen has a backward op we call it: the rule stays short and is
# exactly eager's formula; the lowering runs it as a fallback kernel.
def _scatter_selected(grad_values, x, dim, indices, keepdim):
    """Values picked along ``dim`` at ``indices`` (max/min/sort/topk/kthvalue/cummax...): their
    gradient goes back to those positions; repeated indices accumulate (cummax)."""
    if x.dim() == 0:
        return grad_values
    dim = dim % x.dim()
    if not keepdim and indices.dim() < x.dim():
        grad_values, indices = aten.unsqueeze(grad_values, dim), aten.unsqueeze(indices, dim)
    return aten.scatter_add(_zeros_like_shape(x, grad_values), dim, indices, grad_values)


def _max_min_rule(pick):
    """``max``/``min``: ``.dim`` returns (values, indices); ``.default`` reduces everything
    (ties share the gradient, as ``amax``). (``.other`` reaches graphs as maximum/minimum.)"""
    def rule(grads, out, x, *args, **kwargs):
        if isinstance(out, (tuple, list)):  # .dim
            dim = kwargs.get("dim", args[0] if args else None)
            keepdim = kwargs.get("keepdim", args[1] if len(args) > 1 else False)
            return (_scatter_selected(_first(grads, out[0]), x, dim, out[1], keepdim),) + (None,) * len(args)
        if args:  # .other reaches the graph as maximum/minimum; anything else has no rule here
            raise NotImplementedError(f"{pick}: unexpected arguments of max/min: {args}")
        return _amax_amin_vjp(grads, out, x)[:1]
    return rule


register_vjp(aten.max)(_max_min_rule(aten.gt))
register_vjp(aten.min)(_max_min_rule(aten.lt))


@register_vjp(aten.sort)
def sort_vjp(grads, out, x, dim=-1, descending=False, stable=None):
    """``sort`` and ``sort.stable`` (keyword-only ``stable, dim, descending``)."""
    return _scatter_selected(_first(grads, out[0]), x, dim, out[1], True), None, None


@register_vjp(aten.topk)
def topk_vjp(grads, out, x, k, dim=-1, largest=True, sorted=True):
    return _scatter_selected(_first(grads, out[0]), x, dim, out[1], True), None, None, None, None


@register_vjp(aten.kthvalue)
def kthvalue_vjp(grads, out, x, k, dim=-1, keepdim=False):
    return _scatter_selected(_first(grads, out[0]), x, dim, out[1], keepdim), None, None, None


@register_vjp(aten.mode)
def mode_vjp(grads, out, x, dim=-1, keepdim=False):
    return _scatter_selected(_first(grads, out[0]), x, dim, out[1], keepdim), None, None


@register_vjp(aten.median, aten.nanmedian)
def median_vjp(grads, out, x, *args, **kwargs):
    if isinstance(out, (tuple, list)):  # median.dim
        dim, keepdim = (list(args) + [False])[:2] if args else (kwargs["dim"], kwargs.get("keepdim", False))
        return (_scatter_selected(_first(grads, out[0]), x, dim, out[1], keepdim),) + (None,) * len(args)
    # full reduction: like eager (evenly_distribute_backward), the elements equal to the median
    # share the gradient (the NaNs, when the median is NaN)
    grad = grads
    out_b = aten.expand(out, list(x.shape))
    hit = aten.where(aten.ne(out_b, out_b), aten.ne(x, x), aten.eq(x, out_b))
    hits = prims.convert_element_type(hit, grad.dtype)
    return (aten.div(aten.mul(aten.expand(grad, list(x.shape)), hits), aten.sum(hits)),)


@register_vjp(aten.cummax, aten.cummin)
def cummax_vjp(grads, out, x, dim):
    return _scatter_selected(_first(grads, out[0]), x, dim, out[1], True), None


def _var_grad(grad, x, dims, keepdim, correction):
    count = math.prod(x.shape[d] for d in dims) if x.dim() else 1
    centered = aten.sub(x, aten.mean(x, dims, keepdim=True))
    scale = 2.0 / (count - correction) if count > correction else math.nan
    return aten.mul(aten.mul(_unreduce(grad, x, dims, keepdim), centered), scale)


def _correction(args, kwargs, default=1):
    """The correction of var/std's overloads: ``(dim, unbiased, keepdim)`` or ``correction=``."""
    if "correction" in kwargs:
        c = kwargs["correction"]
        return default if c is None else c
    if len(args) >= 2 and isinstance(args[1], bool):  # .dim overload: (dim, unbiased, keepdim)
        return 1 if args[1] else 0
    if len(args) == 1 and isinstance(args[0], bool):  # .default: (unbiased)
        return 1 if args[0] else 0
    return default


def _dim_keepdim(args, kwargs):
    dim = kwargs.get("dim", args[0] if args and not isinstance(args[0], bool) else None)
    keepdim = kwargs.get("keepdim", args[2] if len(args) >= 3 else False)
    return dim, keepdim


@register_vjp(aten.var)
def var_vjp(grad, out, x, *args, **kwargs):
    """d var / dx = 2 (x - mean) / (N - correction), for every overload of ``var``."""
    dim, keepdim = _dim_keepdim(args, kwargs)
    return (_var_grad(grad, x, _dims(dim, x.dim()), keepdim, _correction(args, kwargs)),) + (None,) * len(args)


@register_vjp(aten.std)
def std_vjp(grad, out, x, *args, **kwargs):
    """d std = d var / (2 std)."""
    dim, keepdim = _dim_keepdim(args, kwargs)
    dims = _dims(dim, x.dim())
    g = aten.div(grad, aten.mul(out, 2))
    return (_var_grad(g, x, dims, keepdim, _correction(args, kwargs)),) + (None,) * len(args)


def _mean_grad(grad, x, dims, keepdim):
    count = math.prod(x.shape[d] for d in dims) if x.dim() else 1
    return aten.div(_unreduce(grad, x, dims, keepdim), count)


@register_vjp(aten.var_mean)
def var_mean_vjp(grads, out, x, *args, **kwargs):
    """(var, mean): the sum of both outputs' contributions."""
    dim, keepdim = _dim_keepdim(args, kwargs)
    dims = _dims(dim, x.dim())
    g_var, g_mean = grads
    gx = None
    if g_var is not None:
        gx = _var_grad(g_var, x, dims, keepdim, _correction(args, kwargs))
    if g_mean is not None:
        gm = _mean_grad(g_mean, x, dims, keepdim)
        gx = gm if gx is None else aten.add(gx, gm)
    return (gx,) + (None,) * len(args)


@register_vjp(aten.std_mean)
def std_mean_vjp(grads, out, x, *args, **kwargs):
    dim, keepdim = _dim_keepdim(args, kwargs)
    dims = _dims(dim, x.dim())
    g_std, g_mean = grads
    gx = None
    if g_std is not None:
        gx = _var_grad(aten.div(g_std, aten.mul(out[0], 2)), x, dims, keepdim, _correction(args, kwargs))
    if g_mean is not None:
        gm = _mean_grad(g_mean, x, dims, keepdim)
        gx = gm if gx is None else aten.add(gx, gm)
    return (gx,) + (None,) * len(args)


@register_vjp(aten.logsumexp)
def logsumexp_vjp(grad, out, x, dim, keepdim=False):
    dims = _dims(dim, x.dim())
    return aten.mul(_unreduce(grad, x, dims, keepdim), aten.exp(aten.sub(x, _unreduce(out, x, dims, keepdim)))), None, None


# ----------------------------------------------------------------------------- normalisation
def _mask(*xs):
    return [x is not None for x in xs]


@register_vjp(aten.native_group_norm)
def native_group_norm_vjp(grads, out, x, weight, bias, N, C, HxW, group, eps):
    """Gradients of the output only; ATen's kernel has no formula for gradients of mean/rstd."""
    if grads[1] is not None or grads[2] is not None:
        raise NotImplementedError("native_group_norm: gradients of its mean/rstd outputs are not supported")
    gx, gw, gb = aten.native_group_norm_backward(
        _first(grads, out[0]), x, out[1], out[2], weight, N, C, HxW, group,
        [True, weight is not None, bias is not None])
    return gx, gw, gb, None, None, None, None, None


def _batch_norm_grads(grads, out, x, weight, bias, running_mean, running_var, training, eps):
    """``native_batch_norm_backward`` with the saved statistics (training) or the running ones.
    In training the running stats are not read (ATen ignores them), and not passing them keeps
    them out of the saved tensors: the op updated them in place, so a saved copy would be a
    stale version (autograd's "modified by an inplace operation" at backward)."""
    if training:
        running_mean = running_var = None
    gx, gw, gb = aten.native_batch_norm_backward(
        _first(grads, out[0]), x, weight, running_mean, running_var,
        out[1] if training else None, out[2] if training else None, training, eps,
        [True, weight is not None, bias is not None])
    return gx, gw, gb


@register_vjp(aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional)
def native_batch_norm_legit_vjp(grads, out, x, weight, bias, *args):
    if len(args) == 3:  # .no_stats: (training, momentum, eps)
        training, _, eps = args
        return (*_batch_norm_grads(grads, out, x, weight, bias, None, None, training, eps),) + (None,) * 3
    running_mean, running_var, training, _, eps = args
    return (*_batch_norm_grads(grads, out, x, weight, bias, running_mean, running_var, training, eps),) + (None,) * 5


@register_vjp(aten._native_batch_norm_legit_no_training)
def native_batch_norm_legit_no_training_vjp(grads, out, x, weight, bias, running_mean, running_var, momentum, eps):
    return (*_batch_norm_grads(grads, out, x, weight, bias, running_mean, running_var, False, eps),) + (None,) * 4


# ----------------------------------------------------------------------------- attention
# The fused attention kernels stay extern calls in the forward; their backward is ATen's
# matching backward kernel (what TorchInductor does), fed the forward's saved outputs.
@register_vjp(aten._scaled_dot_product_flash_attention_for_cpu)
def sdpa_flash_cpu_vjp(grads, out, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    grad = _first(grads, out[0])
    gq, gk, gv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out[0], out[1], dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    if attn_mask is None or not attn_mask.is_floating_point():
        return gq, gk, gv, None, None
    return gq, gk, gv, None, None, {"attn_mask": _attn_mask_grad(grad, out[0], out[1], q, k, v, attn_mask,
                                                                 dropout_p, is_causal, scale)}


def _attn_mask_grad(grad, output, logsumexp, q, k, v, attn_mask, dropout_p, is_causal, scale):
    """Gradient of an additive float mask (T5's learned position bias): the gradient of the scores,
    recomputed from the saved logsumexp (the fused backward returns q/k/v's only). Dead code, and
    removed, when the mask needs no gradient."""
    if dropout_p:
        raise NotImplementedError("the gradient of an attention mask under dropout")
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = aten.add(aten.mul(aten.matmul(q, aten.transpose(k, -2, -1)), scale), attn_mask)
    if is_causal:
        L, S = scores.shape[-2], scores.shape[-1]
        keep = aten.tril(aten.ones.default([L, S], dtype=torch.bool, device=q.device))
        scores = aten.where(keep, scores, aten.full.default([], float("-inf"), dtype=scores.dtype, device=q.device))
    probs = aten.exp(aten.sub(scores, aten.unsqueeze(logsumexp, -1)))
    grad_probs = aten.matmul(grad, aten.transpose(v, -2, -1))
    row = aten.sum(aten.mul(grad, output), [-1], True)  # sum_j p_ij dP_ij = g_i . o_i
    grad_scores = aten.mul(probs, aten.sub(grad_probs, row))
    return sum_to_size(grad_scores, attn_mask)


@register_vjp(aten._scaled_dot_product_flash_attention)
def sdpa_flash_vjp(grads, out, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    output, lse, cum_q, cum_k, max_q, max_k, rng_state, unused, _ = out
    gq, gk, gv = aten._scaled_dot_product_flash_attention_backward(
        _first(grads, output), q, k, v, output, lse, cum_q, cum_k, max_q, max_k, dropout_p,
        is_causal, rng_state, unused, scale=scale)
    return gq, gk, gv, None, None, None


@register_vjp(aten._scaled_dot_product_efficient_attention)
def sdpa_efficient_vjp(grads, out, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0,
                       is_causal=False, *, scale=None):
    output, lse, seed, offset = out
    if not compute_log_sumexp:
        raise NotImplementedError(
            "_scaled_dot_product_efficient_attention traced with compute_log_sumexp=False has no "
            "saved logsumexp for its backward")
    # the rule cannot see whether the bias needs a gradient (it is traced on detached values):
    # ask for it whenever there is a float bias; the kernel computes it alongside
    bias_grad = attn_bias is not None and attn_bias.dtype.is_floating_point
    gq, gk, gv, gbias = aten._scaled_dot_product_efficient_attention_backward(
        _first(grads, output), q, k, v, attn_bias, output, lse, seed, offset, dropout_p,
        [True, True, True, bias_grad], is_causal, scale=scale)
    return gq, gk, gv, (gbias if attn_bias is not None else None), None, None, None


@register_vjp(aten._scaled_dot_product_cudnn_attention)
def sdpa_cudnn_vjp(grads, out, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0,
                   is_causal=False, return_debug_mask=False, *, scale=None):
    output, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = out
    if not compute_log_sumexp:
        raise NotImplementedError(
            "_scaled_dot_product_cudnn_attention traced with compute_log_sumexp=False has no "
            "saved logsumexp for its backward")
    gq, gk, gv = aten._scaled_dot_product_cudnn_attention_backward(
        _first(grads, output), q, k, v, output, lse, seed, offset, attn_bias, cum_q, cum_k,
        max_q, max_k, dropout_p, is_causal, scale=scale)
    return gq, gk, gv, None, None, None, None, None


# ----------------------------------------------------------------------------- extern: conv, pool
@register_vjp(aten.convolution)
def convolution_vjp(grad, out, x, weight, bias, stride, padding, dilation, transposed,
                    output_padding, groups):
    gx, gw, gb = aten.convolution_backward(
        grad, x, weight, None if bias is None else list(bias.shape), stride, padding, dilation,
        transposed, output_padding, groups, [True, True, bias is not None])
    return gx, gw, gb, None, None, None, None, None, None


@register_vjp(aten.max_pool2d_with_indices, aten.max_pool3d_with_indices)
def max_pool_with_indices_vjp(grads, out, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    backward = (aten.max_pool2d_with_indices_backward if x.dim() - 2 <= 2 and len(list(kernel_size)) <= 2
                else aten.max_pool3d_with_indices_backward)
    n = 2 if backward is aten.max_pool2d_with_indices_backward else 3
    expand = (lambda v: [v] * n if isinstance(v, int) else list(v))
    gx = backward(_first(grads, out[0]), x, expand(kernel_size), expand(stride) or expand(kernel_size),
                  expand(padding), expand(dilation), ceil_mode, out[1])
    return gx, None, None, None, None, None


@register_vjp(aten.avg_pool2d)
def avg_pool2d_vjp(grad, out, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                   count_include_pad=True, divisor_override=None):
    return (aten.avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode,
                                     count_include_pad, divisor_override),) + (None,) * 6


@register_vjp(aten._adaptive_avg_pool2d)
def adaptive_avg_pool2d_vjp(grad, out, x, output_size):
    return aten._adaptive_avg_pool2d_backward(grad, x), None


# ----------------------------------------------------------------------------- activations
def _backward_op_rule(backward, n_extra: int = 0):
    """A rule ``backward(grad, x, *extra)`` for an elementwise op ``op(x, *extra)``."""
    def rule(grad, out, x, *args):
        return (backward(grad, x, *args[:n_extra]),) + (None,) * len(args)
    rule.__name__ = f"{backward._opname}_rule" if hasattr(backward, "_opname") else "rule"
    return rule


register_vjp(aten.mish)(_backward_op_rule(aten.mish_backward))
register_vjp(aten.hardswish)(_backward_op_rule(aten.hardswish_backward))
register_vjp(aten.hardsigmoid)(_backward_op_rule(aten.hardsigmoid_backward))
register_vjp(aten.softplus)(_backward_op_rule(aten.softplus_backward, 2))
register_vjp(aten.hardtanh)(_backward_op_rule(aten.hardtanh_backward, 2))


@register_vjp(aten.leaky_relu)
def leaky_relu_vjp(grad, out, x, negative_slope=0.01):
    return aten.leaky_relu_backward(grad, x, negative_slope, False), None


@register_vjp(aten.elu)
def elu_vjp(grad, out, x, alpha=1, scale=1, input_scale=1):
    return aten.elu_backward(grad, alpha, scale, input_scale, False, x), None, None, None


@register_vjp(aten.glu)
def glu_vjp(grad, out, x, dim=-1):
    return aten.glu_backward(grad, x, dim), None


@register_vjp(aten.frac)
def frac_vjp(grad, out, x):
    return (grad,)


@register_vjp(aten.native_dropout)
def native_dropout_vjp(grads, out, x, p, train):
    """Dropout's saved mask, scaled by 1/(1-p), as eager's ``native_dropout_backward``."""
    if not train:
        return _first(grads, out[0]), None, None
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    return aten.native_dropout_backward(_first(grads, out[0]), out[1], scale), None, None


# ----------------------------------------------------------------------------- scans
@register_vjp(aten.cumsum)
def cumsum_vjp(grad, out, x, dim, dtype=None):
    """The gradient of a running sum is the reversed running sum of the gradient."""
    if x.dim() == 0:
        return grad, None, None
    g = aten.flip(aten.cumsum(aten.flip(grad, [dim]), dim), [dim])
    if g.dtype != x.dtype:
        g = prims.convert_element_type(g, x.dtype)
    return g, None, None


@register_vjp(aten.cumprod)
def cumprod_vjp(grad, out, x, dim, dtype=None):
    g = aten.cumprod_backward(grad, x, dim, out)
    if g.dtype != x.dtype:
        g = prims.convert_element_type(g, x.dtype)
    return g, None, None


# ----------------------------------------------------------------------------- indexing, more
@register_vjp(aten.embedding)
def embedding_vjp(grad, out, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """Rows accumulate their uses' gradients; the ``padding_idx`` row gets none (as eager)."""
    if sparse:
        raise NotImplementedError("embedding(sparse=True): sparse gradients are not supported")
    return (aten.embedding_dense_backward(grad, indices, weight.shape[0], padding_idx, scale_grad_by_freq),
            None, None, None, None)


@register_vjp(aten.index_select)
def index_select_vjp(grad, out, x, dim, index):
    if x.dim() == 0:
        return grad, None, None
    return aten.index_add(_zeros_like_shape(x, grad), dim, index, grad), None, None


@register_vjp(aten.index_add)
def index_add_vjp(grad, out, x, dim, index, source, alpha=1):
    gs = aten.index_select(grad, dim, index) if grad.dim() else grad
    if alpha != 1:
        gs = aten.mul(gs, alpha)
    return grad, None, None, _reshape(gs, source.shape) if source.dim() != gs.dim() else gs


@register_vjp(aten.scatter)
def scatter_vjp(grad, out, x, dim, index, src, *, reduce=None):
    if reduce is not None:
        raise NotImplementedError(f"scatter(reduce={reduce!r}): no VJP rule")
    gx = aten.scatter(grad, dim, index, 0)
    gs = aten.gather(grad, dim, index) if is_tensor(src) else None
    return gx, None, None, gs


@register_vjp(aten.flip)
def flip_vjp(grad, out, x, dims):
    return aten.flip(grad, dims), None


# ----------------------------------------------------------------------------- pad, interpolate
@register_vjp(aten.constant_pad_nd)
def constant_pad_nd_vjp(grad, out, x, pad, value=0):
    """Padding's gradient is the crop back to ``x``'s place: a slice per padded dim (eager's formula,
    a negative padding, says the same, but its decomposition needs concrete sizes). A negative
    pad cropped ``x``: the cropped elements' gradient is a zero padding first."""
    if any(p < 0 for p in pad):
        grad = aten.constant_pad_nd(grad, [max(-p, 0) for p in pad])
    for i in range(len(pad) // 2):
        dim, before, after = x.dim() - 1 - i, max(pad[2 * i], 0), max(pad[2 * i + 1], 0)
        if before or after:
            grad = aten.slice(grad, dim, before, before + x.shape[dim])
    return grad, None, None


def _pad_backward_rule(backward):
    def rule(grad, out, x, padding):
        return backward(grad, x, padding), None
    return rule


for _n in (1, 2, 3):
    for _kind in ("reflection", "replication"):
        register_vjp(getattr(aten, f"{_kind}_pad{_n}d"))(
            _pad_backward_rule(getattr(aten, f"{_kind}_pad{_n}d_backward")))


def _upsample_rule(backward):
    """``upsample_*(x, output_size, *rest)`` -> ``upsample_*_backward(grad, output_size, input_size, *rest)``."""
    def rule(grad, out, x, output_size, *rest):
        if output_size is None or (rest and isinstance(rest[-1], (list, tuple))):  # .vec overload
            raise NotImplementedError("upsample .vec overload: decompose to the sized overload first")
        return (backward(grad, list(out.shape[2:]), list(x.shape), *rest),) + (None,) * (1 + len(rest))
    return rule


# interpolate's other modes reach the graph decomposed by torch itself (``_unsafe_index`` and
# arithmetic); the antialiased ones stay fused ops
for _name in ("_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"):
    if hasattr(aten, _name) and hasattr(aten, _name + "_backward"):
        register_vjp(getattr(aten, _name))(_upsample_rule(getattr(aten, _name + "_backward")))


# ----------------------------------------------------------------------------- more pointwise math
def _unary(formula):
    """A rule from ``d out / d x`` written as ``formula(x, out)``."""
    def rule(grad, out, x, *args):
        return (aten.mul(grad, formula(x, out)),) + (None,) * len(args)
    return rule


def _one_minus_sq(x):
    return aten.add(aten.neg(aten.mul(x, x)), 1)


register_vjp(aten.log2)(_unary(lambda x, out: aten.reciprocal(aten.mul(x, math.log(2.0)))))
register_vjp(aten.log10)(_unary(lambda x, out: aten.reciprocal(aten.mul(x, math.log(10.0)))))
register_vjp(aten.exp2)(_unary(lambda x, out: aten.mul(out, math.log(2.0))))
register_vjp(aten.tan)(_unary(lambda x, out: aten.add(aten.mul(out, out), 1)))
register_vjp(aten.sinh)(_unary(lambda x, out: aten.cosh(x)))
register_vjp(aten.cosh)(_unary(lambda x, out: aten.sinh(x)))
register_vjp(aten.asin)(_unary(lambda x, out: aten.rsqrt(_one_minus_sq(x))))
register_vjp(aten.acos)(_unary(lambda x, out: aten.neg(aten.rsqrt(_one_minus_sq(x)))))
register_vjp(aten.atan)(_unary(lambda x, out: aten.reciprocal(aten.add(aten.mul(x, x), 1))))
register_vjp(aten.asinh)(_unary(lambda x, out: aten.rsqrt(aten.add(aten.mul(x, x), 1))))
register_vjp(aten.acosh)(_unary(lambda x, out: aten.reciprocal(
    aten.mul(aten.sqrt(aten.sub(x, 1)), aten.sqrt(aten.add(x, 1))))))
register_vjp(aten.atanh)(_unary(lambda x, out: aten.reciprocal(_one_minus_sq(x))))
register_vjp(aten.erfc)(_unary(lambda x, out: aten.mul(aten.exp(aten.neg(aten.mul(x, x))), -2 / math.sqrt(math.pi))))
register_vjp(aten.erfinv)(_unary(lambda x, out: aten.mul(aten.exp(aten.mul(out, out)), math.sqrt(math.pi) / 2)))
register_vjp(aten.lgamma)(_unary(lambda x, out: aten.digamma(x)))
register_vjp(aten.digamma)(_unary(lambda x, out: aten.polygamma(1, x)))
register_vjp(aten.deg2rad)(_unary(lambda x, out: math.pi / 180))
register_vjp(aten.rad2deg)(_unary(lambda x, out: 180 / math.pi))


@register_vjp(aten.logit)
def logit_vjp(grad, out, x, eps=None):
    return aten.logit_backward(grad, x, eps), None


@register_vjp(aten.atan2)
def atan2_vjp(grad, out, a, b):
    denom = aten.add(aten.mul(a, a), aten.mul(b, b))
    return (sum_to_size(aten.mul(grad, aten.div(b, denom)), a),
            sum_to_size(aten.mul(grad, aten.div(aten.neg(a), denom)), b))


@register_vjp(aten.hypot)
def hypot_vjp(grad, out, a, b):
    return sum_to_size(aten.mul(grad, aten.div(a, out)), a), sum_to_size(aten.mul(grad, aten.div(b, out)), b)


@register_vjp(aten.logaddexp)
def logaddexp_vjp(grad, out, a, b):
    return (sum_to_size(aten.mul(grad, aten.exp(aten.sub(a, out))), a),
            sum_to_size(aten.mul(grad, aten.exp(aten.sub(b, out))), b))


@register_vjp(aten.xlogy)
def xlogy_vjp(grad, out, a, b):
    """d/da = log(b) (0 where a == 0 and b is not NaN, as eager); d/db = a / b."""
    ga = gb = None
    if is_tensor(a):
        log_b = aten.log(b) if is_tensor(b) else math.log(b)
        zero = aten.scalar_tensor(0, dtype=grad.dtype, device=grad.device)
        keep = aten.logical_or(aten.ne(a, 0), aten.ne(b, b)) if is_tensor(b) else aten.ne(a, 0)
        ga = sum_to_size(aten.where(keep, aten.mul(grad, log_b), zero), a)
    if is_tensor(b):
        gb = sum_to_size(aten.mul(grad, aten.div(a, b)), b)
    return ga, gb


@register_vjp(aten.lerp)
def lerp_vjp(grad, out, start, end, weight):
    """out = start + weight * (end - start)."""
    g_end = aten.mul(grad, weight)
    g_start = aten.sub(grad, g_end)
    gw = sum_to_size(aten.mul(grad, aten.sub(end, start)), weight) if is_tensor(weight) else None
    return sum_to_size(g_start, start), sum_to_size(g_end, end), gw


@register_vjp(aten.celu)
def celu_vjp(grad, out, x, alpha=1.0):
    return aten.elu_backward(grad, alpha, 1, 1.0 / alpha, False, x), None


@register_vjp(aten.threshold)
def threshold_vjp(grad, out, x, threshold, value):
    return aten.threshold_backward(grad, x, threshold), None, None


@register_vjp(aten.log_sigmoid_forward)
def log_sigmoid_forward_vjp(grads, out, x):
    return (aten.log_sigmoid_backward(_first(grads, out[0]), x, out[1]),)


@register_vjp(aten.nansum)
def nansum_vjp(grad, out, x, dim=None, keepdim=False, dtype=None):
    zero = aten.scalar_tensor(0, dtype=grad.dtype, device=grad.device)
    g = _unreduce(grad, x, _dims(dim, x.dim()), keepdim)
    return aten.where(aten.ne(x, x), zero, g), None, None, None


@register_vjp(aten.linalg_vector_norm)
def linalg_vector_norm_vjp(grad, out, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """For a finite ``ord >= 1``: ``grad * sign(x) |x|^(ord-1) / norm^(ord-1)``, 0 where the norm is 0."""
    if not (isinstance(ord, (int, float)) and math.isfinite(ord) and ord >= 1) or x.is_complex():
        raise NotImplementedError(f"linalg_vector_norm(ord={ord}): no VJP rule for this order")
    dims = _dims(dim, x.dim())
    norm = _unreduce(out, x, dims, keepdim)
    g = _unreduce(grad, x, dims, keepdim)
    if ord == 1:
        scaled = aten.sign(x)
    elif ord == 2:
        scaled = aten.div(x, norm)
    else:
        scaled = aten.div(aten.mul(aten.sign(x), aten.pow(aten.abs(x), ord - 1)), aten.pow(norm, ord - 1))
    zero = aten.scalar_tensor(0, dtype=grad.dtype, device=grad.device)
    result = aten.where(aten.eq(norm, 0), zero, aten.mul(g, scaled))
    return (prims.convert_element_type(result, x.dtype) if result.dtype != x.dtype else result), None, None, None


# ----------------------------------------------------------------------------- more linear algebra
@register_vjp(aten.dot, aten.vdot)
def dot_vjp(grad, out, a, b):
    if a.is_complex():
        raise NotImplementedError("dot/vdot of complex tensors: no VJP rule")
    return aten.mul(grad, b), aten.mul(grad, a)


@register_vjp(aten.mv)
def mv_vjp(grad, out, m, v):
    return aten.mul(aten.unsqueeze(grad, 1), aten.unsqueeze(v, 0)), aten.mv(aten.permute(m, [1, 0]), grad)


def _scaled(g, factor):
    return g if factor == 1 else aten.mul(g, factor)


@register_vjp(aten.baddbmm)
def baddbmm_vjp(grad, out, bias, b1, b2, *, beta=1, alpha=1):
    ga = _scaled(grad, alpha)
    return (sum_to_size(_scaled(grad, beta), bias) if beta != 0 else _zeros_like_shape(bias, grad),
            aten.bmm(ga, aten.permute(b2, [0, 2, 1])), aten.bmm(aten.permute(b1, [0, 2, 1]), ga))


@register_vjp(aten.addbmm)
def addbmm_vjp(grad, out, bias, b1, b2, *, beta=1, alpha=1):
    ga = aten.expand(aten.unsqueeze(_scaled(grad, alpha), 0), [b1.shape[0], *grad.shape])
    return (sum_to_size(_scaled(grad, beta), bias) if beta != 0 else _zeros_like_shape(bias, grad),
            aten.bmm(ga, aten.permute(b2, [0, 2, 1])), aten.bmm(aten.permute(b1, [0, 2, 1]), ga))


@register_vjp(aten.addmv)
def addmv_vjp(grad, out, bias, m, v, *, beta=1, alpha=1):
    ga = _scaled(grad, alpha)
    return (sum_to_size(_scaled(grad, beta), bias) if beta != 0 else _zeros_like_shape(bias, grad),
            aten.mul(aten.unsqueeze(ga, 1), aten.unsqueeze(v, 0)), aten.mv(aten.permute(m, [1, 0]), ga))


@register_vjp(aten.addr)
def addr_vjp(grad, out, bias, v1, v2, *, beta=1, alpha=1):
    ga = _scaled(grad, alpha)
    return (sum_to_size(_scaled(grad, beta), bias) if beta != 0 else _zeros_like_shape(bias, grad),
            aten.mv(ga, v2), aten.mv(aten.permute(ga, [1, 0]), v1))


@register_vjp(aten.addcmul)
def addcmul_vjp(grad, out, x, t1, t2, *, value=1):
    gv = _scaled(grad, value)
    return sum_to_size(grad, x), sum_to_size(aten.mul(gv, t2), t1), sum_to_size(aten.mul(gv, t1), t2)


@register_vjp(aten.addcdiv)
def addcdiv_vjp(grad, out, x, t1, t2, *, value=1):
    gv = _scaled(grad, value)
    return (sum_to_size(grad, x), sum_to_size(aten.div(gv, t2), t1),
            sum_to_size(aten.neg(aten.div(aten.mul(gv, t1), aten.mul(t2, t2))), t2))


# ----------------------------------------------------------------------------- more shape ops
@register_vjp(aten.transpose_copy)
def transpose_vjp(grad, out, x, dim0, dim1):
    if x.dim() == 0:
        return grad, None, None
    order = list(range(x.dim()))
    order[dim0 % x.dim()], order[dim1 % x.dim()] = order[dim1 % x.dim()], order[dim0 % x.dim()]
    return aten.permute(grad, order), None, None


register_vjp(aten.view_copy)(lambda grad, out, x, shape: view_vjp(grad, out, x, shape))
register_vjp(aten.unsqueeze_copy)(lambda grad, out, x, dim: unsqueeze_vjp(grad, out, x, dim))
register_vjp(aten.squeeze_copy)(lambda grad, out, x, *args: (_reshape(grad, x.shape),) + (None,) * len(args))
register_vjp(aten.permute_copy)(lambda grad, out, x, dims: permute_vjp(grad, out, x, dims))
register_vjp(aten.expand_copy)(lambda grad, out, x, shape, implicit=False: expand_vjp(grad, out, x, shape))
register_vjp(aten.alias_copy)(lambda grad, out, x: (grad,))
register_vjp(aten.t_copy)(lambda grad, out, x: (aten.permute(grad, [1, 0]) if x.dim() == 2 else grad,))


@register_vjp(aten.diagonal, aten.diagonal_copy)
def diagonal_vjp(grad, out, x, offset=0, dim1=0, dim2=1):
    return aten.diagonal_backward(grad, list(x.shape), offset, dim1, dim2), None, None, None


@register_vjp(aten.diag_embed)
def diag_embed_vjp(grad, out, x, offset=0, dim1=-2, dim2=-1):
    return aten.diagonal(grad, offset, dim1, dim2), None, None, None


@register_vjp(aten.unfold)
def unfold_vjp(grad, out, x, dimension, size, step):
    return aten.unfold_backward(grad, list(x.shape), dimension, size, step), None, None, None


@register_vjp(aten.repeat)
def repeat_vjp(grad, out, x, repeats):
    """Sum the gradient over the tiles: view it as (r0, s0, r1, s1, ...) and sum the r's."""
    lead = len(repeats) - x.dim()
    shape = [1] * lead + list(x.shape)
    split, dims = [], []
    for i, (r, s) in enumerate(zip(repeats, shape)):
        split += [r, s]
        dims.append(2 * i)
    g = aten.sum(_reshape(grad, split), dims)
    return _reshape(g, x.shape), None


@register_vjp(aten.pixel_shuffle)
def pixel_shuffle_vjp(grad, out, x, factor):
    return aten.pixel_unshuffle(grad, factor), None


@register_vjp(aten.pixel_unshuffle)
def pixel_unshuffle_vjp(grad, out, x, factor):
    return aten.pixel_shuffle(grad, factor), None


@register_vjp(aten.rot90)
def rot90_vjp(grad, out, x, k=1, dims=(0, 1)):
    return aten.rot90(grad, -k, list(dims)), None, None


@register_vjp(aten.unsafe_split, aten.split_with_sizes_copy, aten.unsafe_split_with_sizes)
def unsafe_split_vjp(grads, out, x, split, dim=0):
    pieces = [g if g is not None else _zeros(o) for g, o in zip(grads, out)]
    return aten.cat(pieces, dim), None, None


# ----------------------------------------------------------------------------- losses
def _loss_rule(backward, target_antisymmetric: bool, *defaults):
    """``loss(x, target, reduction=1, *extra)`` -> ``backward(grad, x, target, reduction, *extra)``
    (``defaults`` fill the arguments the call left out); for losses of ``x - target`` the
    target's gradient is the negation of ``x``'s."""
    def rule(grad, out, x, target, *args):
        full = list(args) + list(defaults[len(args):])
        gx = backward(grad, x, target, *full)
        gt = aten.neg(gx) if target_antisymmetric and is_tensor(target) else None
        return (gx, gt) + (None,) * len(args)
    return rule


register_vjp(aten.mse_loss)(_loss_rule(aten.mse_loss_backward, True, 1))
register_vjp(aten.smooth_l1_loss)(_loss_rule(aten.smooth_l1_loss_backward, True, 1, 1.0))
register_vjp(aten.huber_loss)(_loss_rule(aten.huber_loss_backward, True, 1, 1.0))
register_vjp(aten.soft_margin_loss)(_loss_rule(aten.soft_margin_loss_backward, False, 1))


@register_vjp(aten.binary_cross_entropy)
def binary_cross_entropy_vjp(grad, out, x, target, weight=None, reduction=1):
    return aten.binary_cross_entropy_backward(grad, x, target, weight, reduction), None, None, None


@register_vjp(aten.nll_loss_forward)
def nll_loss_forward_vjp(grads, out, logp, target, weight, reduction, ignore_index):
    return (aten.nll_loss_backward(_first(grads, out[0]), logp, target, weight, reduction, ignore_index, out[1]),
            None, None, None, None)


# ----------------------------------------------------------------------------- more pooling, sampling
@register_vjp(aten.adaptive_max_pool2d, aten.adaptive_max_pool3d)
def adaptive_max_pool_vjp(grads, out, x, output_size):
    backward = aten.adaptive_max_pool2d_backward if len(list(output_size)) == 2 else aten.adaptive_max_pool3d_backward
    return backward(_first(grads, out[0]), x, out[1]), None


@register_vjp(aten.avg_pool3d)
def avg_pool3d_vjp(grad, out, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                   count_include_pad=True, divisor_override=None):
    return (aten.avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode,
                                     count_include_pad, divisor_override),) + (None,) * 6


@register_vjp(aten._adaptive_avg_pool3d)
def adaptive_avg_pool3d_vjp(grad, out, x, output_size):
    return aten._adaptive_avg_pool3d_backward(grad, x), None


@register_vjp(aten.grid_sampler_2d)
def grid_sampler_2d_vjp(grad, out, x, grid, interpolation_mode, padding_mode, align_corners):
    gx, ggrid = aten.grid_sampler_2d_backward(grad, x, grid, interpolation_mode, padding_mode,
                                              align_corners, [True, True])
    return gx, ggrid, None, None, None


@register_vjp(aten.im2col)
def im2col_vjp(grad, out, x, kernel_size, dilation, padding, stride):
    return (aten.col2im(grad, list(x.shape[-2:]), kernel_size, dilation, padding, stride),) + (None,) * 4


@register_vjp(aten._cdist_forward)
def cdist_vjp(grad, out, x1, x2, p, compute_mode=None):
    g1 = aten._cdist_backward(grad, x1, x2, p, out)
    g2 = aten._cdist_backward(aten.permute(grad, [*range(grad.dim() - 2), grad.dim() - 1, grad.dim() - 2]),
                              x2, x1, p, aten.permute(out, [*range(out.dim() - 2), out.dim() - 1, out.dim() - 2]))
    return g1, g2, None, None


# ----------------------------------------------------------------------------- scatter-style writes
@register_vjp(aten.slice_scatter)
def slice_scatter_vjp(grad, out, x, src, dim=0, start=None, end=None, step=1):
    """``x`` with a slice replaced by ``src``: ``x`` gets the gradient outside the slice."""
    zeros = _zeros_like_shape(src, grad)
    return (aten.slice_scatter(grad, zeros, dim, start, end, step),
            aten.slice(grad, dim, start, end, step), None, None, None, None)


@register_vjp(aten.select_scatter)
def select_scatter_vjp(grad, out, x, src, dim, index):
    return (aten.select_scatter(grad, _zeros_like_shape(src, grad), dim, index),
            aten.select(grad, dim, index), None, None)


@register_vjp(aten.index_fill)
def index_fill_vjp(grad, out, x, dim, index, value):
    gv = None
    if is_tensor(value):  # every filled position once (repeated indices fill it once)
        filled = aten.index_fill(_zeros_like_shape(x, grad), dim, index, 1)
        gv = aten.sum(aten.mul(grad, filled))
    if gv is not None and gv.dtype != value.dtype:
        gv = prims.convert_element_type(gv, value.dtype)
    return aten.index_fill(grad, dim, index, 0), None, None, gv


@register_vjp(aten.index_copy)
def index_copy_vjp(grad, out, x, dim, index, source):
    return (aten.index_fill(grad, dim, index, 0), None, None,
            aten.index_select(grad, dim, index) if grad.dim() else grad)


@register_vjp(aten.polygamma)
def polygamma_vjp(grad, out, n, x):
    return None, aten.mul(grad, aten.polygamma(n + 1, x))


@register_vjp(aten.i0)
def i0_vjp(grad, out, x):
    return (aten.mul(grad, aten.special_i1(x)),)


# ----------------------------------------------------------------------------- odds and ends
@register_vjp(aten.fill, aten.zero)
def fill_vjp(grad, out, x, *args):
    """Overwritten: ``x`` gets no gradient (a tensor fill value gets the sum)."""
    value_grad = aten.sum(grad) if args and is_tensor(args[0]) else None
    return (_zeros_like_shape(x, grad),) + ((value_grad,) if args else ())


@register_vjp(aten.trace)
def trace_vjp(grad, out, x):
    eye = aten.eq(aten.unsqueeze(aten.arange(x.shape[0], device=x.device), 1),
                  aten.unsqueeze(aten.arange(x.shape[1], device=x.device), 0))
    zero = aten.scalar_tensor(0, dtype=grad.dtype, device=grad.device)
    return (aten.where(eye, aten.expand(grad, list(x.shape)), zero),)


@register_vjp(aten.take)
def take_vjp(grad, out, x, index):
    """Scatter-add back into the flattened input (negative indices count from the end)."""
    flat_index = aten.remainder(_reshape(index, [-1]), max(x.numel(), 1))
    flat = aten.index_put(aten.full.default([x.numel()], 0, dtype=grad.dtype, device=grad.device), [flat_index],
                          _reshape(grad, [-1]), True)
    return _reshape(flat, x.shape), None


@register_vjp(aten.fmax, aten.fmin)
def fmax_fmin_vjp(grad, out, a, b):
    """The input equal to the result gets the gradient (NaNs are ignored); a tie goes to ``a``."""
    zero = aten.scalar_tensor(0, dtype=grad.dtype, device=grad.device)
    pick_a = aten.logical_or(aten.eq(a, out), aten.logical_and(aten.ne(a, a), aten.ne(out, out)))
    return (sum_to_size(aten.where(pick_a, grad, zero), a),
            sum_to_size(aten.where(pick_a, zero, grad), b))


@register_vjp(aten.remainder, aten.fmod)
def remainder_fmod_vjp(grad, out, a, b):
    """``a - q * b`` with ``q`` piecewise constant: d/da = 1, d/db = -q."""
    ga = sum_to_size(grad, a) if is_tensor(a) else None
    gb = None
    if is_tensor(b):
        q = aten.div(aten.sub(a, out), b)  # the integer quotient the op used
        gb = sum_to_size(aten.mul(aten.neg(grad), aten.round(q)), b)
    return ga, gb


@register_vjp(aten.nan_to_num)
def nan_to_num_vjp(grad, out, x, nan=None, posinf=None, neginf=None):
    """Gradient only where ``x`` was finite (replaced values are constants), as eager."""
    zero = aten.scalar_tensor(0, dtype=grad.dtype, device=grad.device)
    finite = aten.logical_and(aten.eq(x, x), aten.ne(aten.abs(x), math.inf))
    return aten.where(finite, grad, zero), None, None, None


@register_vjp(aten._prelu_kernel)
def prelu_vjp(grad, out, x, weight):
    gx, gw = aten._prelu_kernel_backward(grad, x, weight)
    return gx, sum_to_size(gw, weight)  # the kernel's weight gradient is per element
