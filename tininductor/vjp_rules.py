"""One vector-Jacobian product (VJP) rule per prim: the registry reverse-mode AD runs on.

A rule answers "given the gradient ``grad`` of this op's output, what are the gradients of
its inputs?". It is called as ``rule(grad, out, *args, **kwargs)`` with the same arguments
the forward op got (tensors, Python numbers, lists) plus its output ``out``, and returns one
entry per positional argument: a tensor gradient, or ``None`` where the argument is not
differentiable (an int, a shape, an index tensor, a bool mask).

Rules are written with prims only, so the backward graph that tracing them produces is in
the prim set too. Binary ops broadcast, so each input gradient is summed back to the input's
shape (:func:`sum_to_size`), which is the one subtle step of reverse-mode AD.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

aten = torch.ops.aten
prims = torch.ops.prims

#: OpOverloadPacket -> VJP rule.
VJP_RULES: dict[torch._ops.OpOverloadPacket, Callable] = {}


def register_vjp(*ops) -> Callable:
    def wrap(fn: Callable) -> Callable:
        for op in ops:
            VJP_RULES[getattr(op, "overloadpacket", op)] = fn
        return fn

    return wrap


def get_vjp(target, rules: dict | None = None) -> Callable:
    """The rule for an FX node target (from ``rules``, default the registry), or a clear error."""
    packet = getattr(target, "overloadpacket", target)
    try:
        return (VJP_RULES if rules is None else rules)[packet]
    except KeyError:
        raise NotImplementedError(
            f"no VJP rule for {target}: register one with "
            f"@tininductor.vjp_rules.register_vjp({packet}) (or decompose the op into prims "
            f"that have rules)") from None


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
    return aten.full(list(x.shape), 0, dtype=x.dtype, device=x.device)


def _zeros_like_shape(x, grad):
    """Zeros with ``x``'s shape and ``grad``'s dtype and device."""
    return aten.full(list(x.shape), 0, dtype=grad.dtype, device=grad.device)


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


@register_vjp(aten.sign)
def sign_vjp(grad, out, x):
    return (_zeros(grad),)


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
              aten.logical_or, aten.logical_not)
def not_differentiable(grad, out, *args, **kwargs):
    """Comparisons and logic return bools: nothing flows back."""
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


@register_vjp(aten.var)
def var_vjp(grad, out, x, dim=None, *, correction=None, keepdim=False):
    # d var / dx = 2 (x - mean) / (N - correction)
    dims = _dims(dim, x.dim())
    count = math.prod(x.shape[d] for d in dims) if x.dim() else 1
    correction = 1 if correction is None else correction
    centered = aten.sub(x, aten.mean(x, dims, keepdim=True))
    scale = 2.0 / (count - correction) if count > correction else math.nan
    return aten.mul(aten.mul(_unreduce(grad, x, dims, keepdim), centered), scale), None


# ----------------------------------------------------------------------------- creation
@register_vjp(aten.full, aten.scalar_tensor, aten.arange, aten.empty)
def creation_vjp(grad, out, *args, **kwargs):
    return (None,) * len(args)


# ----------------------------------------------------------------------------- indexing
@register_vjp(aten.index)
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

