"""Decompose a captured FX graph (torch-level ops) into the prim set (see prims.py).

``decompose(gm, example_inputs)`` re-traces ``gm`` with ``make_fx`` on fake tensors. While
tracing, every ATen op found in :data:`DECOMPOSITIONS` is replaced by the Python function
registered for it, written against prims only, and that function is traced in turn. What
reaches the graph is therefore prims, plus whatever torch's own CompositeImplicitAutograd
kernels expand to on the way (matmul -> mm/bmm/view, for example). Ops that end up outside
the prim set stay in the graph as *fallbacks* (run by torch), each logged with the reason.

Only ops that reach the dispatcher can be decomposed here. CompositeImplicitAutograd ops
(``linear``, ``layer_norm``, ``matmul``, ``reshape``, ``dropout``, ``softmax.int`` ...) are
expanded by torch's own C++ kernels before any table sees them, so the table holds what
they expand to: ``addmm`` and ``t`` for linear, ``native_layer_norm`` for layer_norm, and so on.

A decomposition may return ``NotImplemented`` to keep the op as it is (``native_dropout``
with ``p > 0`` in training mode, ``add`` without an ``alpha``): that is how one entry normalises
an op's rare forms and leaves its common form alone.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import math
import operator
from typing import Callable

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx import traceback as fx_traceback
from torch.fx._lazy_graph_module import _make_graph_module
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.utils._pytree import tree_flatten, tree_map_only, tree_unflatten

from tininductor import config, ir, lowering
from tininductor.aliasing import fake_copies
from tininductor.op_recorder import OpRecorder, has_symbolic_sizes
from tininductor.prims import is_prim
from tininductor.registry import OpRegistry, lookup, overload_table

log = logging.getLogger(__name__)
aten = torch.ops.aten
prims = torch.ops.prims

#: op -> decomposition function (the registry this module is about): keyed by packet or overload,
#: read exact overload first (tininductor/registry.py); make_fx gets ``DECOMPOSITIONS.overload_table()``.
DECOMPOSITIONS = OpRegistry("decompositions")


def register_decomposition(*ops) -> Callable:
    """Register ``fn`` for each op; an OpOverloadPacket stands for all of its overloads."""
    return DECOMPOSITIONS.register(*ops)


# ----------------------------------------------------------------------------- helpers
def reshape(x: torch.Tensor, shape) -> torch.Tensor:
    """``view`` when the strides allow it, else copy to contiguous first (what reshape does)."""
    if not x.is_contiguous():
        x = aten.clone(x, memory_format=torch.contiguous_format)
    return aten.view(x, list(shape))


def _scalar(value, like: torch.Tensor) -> torch.Tensor:
    """A 0-d tensor holding ``value`` with ``like``'s dtype and device."""
    if isinstance(value, torch.Tensor):
        return prims.convert_element_type(value, like.dtype)
    return aten.scalar_tensor(value, dtype=like.dtype, device=like.device)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Half-precision statistics are computed in float32, as eager does."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return prims.convert_element_type(x, torch.float32)
    return x


# ----------------------------------------------------------------------------- linear algebra
@register_decomposition(aten.addmm)
def addmm(bias, a, b, beta=1, alpha=1):
    y = aten.mm(a, b)
    if alpha != 1:
        y = aten.mul(y, alpha)
    if beta != 1:
        bias = aten.mul(bias, beta)
    return aten.add(y, bias)


def linear(x, weight, bias=None):
    """``x @ weight.T + bias`` as a 2-D ``addmm``/``mm`` over the flattened leading dims: what
    ATen's C++ composite does, for graphs with symbolic sizes, where that composite reads
    ``x.sizes()`` as ints and would specialise a symbolic batch or sequence length (see
    :class:`SymbolicComposites`)."""
    if x.dim() != 3 and x.dim() != 2:
        return aten.matmul(x, aten.t(weight)) if bias is None else aten.add(aten.matmul(x, aten.t(weight)), bias)
    flat = x if x.dim() == 2 else reshape(x, [x.shape[0] * x.shape[1], x.shape[2]])
    out = aten.mm(flat, aten.t(weight)) if bias is None else aten.addmm(bias, flat, aten.t(weight))
    return out if x.dim() == 2 else aten.view(out, [x.shape[0], x.shape[1], weight.shape[0]])


# ----------------------------------------------------------------------------- views
@register_decomposition(aten.t)
def t(x):
    return aten.permute(x, [1, 0]) if x.dim() == 2 else x


@register_decomposition(aten.transpose.int)
def transpose(x, dim0, dim1):
    if x.dim() == 0:
        return x
    order = list(range(x.dim()))
    dim0, dim1 = dim0 % x.dim(), dim1 % x.dim()
    order[dim0], order[dim1] = order[dim1], order[dim0]
    return aten.permute(x, order)


@register_decomposition(aten._unsafe_view)
def _reshape(x, shape):
    return reshape(x, shape)


@register_decomposition(aten.split.Tensor)
def split(x, split_size, dim=0):
    """Pieces of ``split_size``, the last one shorter. With symbolic sizes only the number of pieces
    is fixed (a guard on it, as torch's), not the size being split (``range`` over it would be)."""
    size = x.shape[dim]
    pieces = int((size + split_size - 1) // split_size) if split_size else 1
    if pieces <= 1:
        return split_with_sizes(x, [size], dim)
    return split_with_sizes(x, [split_size] * (pieces - 1) + [size - split_size * (pieces - 1)], dim)


@register_decomposition(aten.split_with_sizes)
def split_with_sizes(x, split_sizes, dim=0):
    pieces, start = [], 0
    for length in split_sizes:
        pieces.append(aten.slice(x, dim, start, start + length))
        start += length
    return pieces


@register_decomposition(aten.stack)
def stack(tensors, dim=0):
    """Stack = unsqueeze each, then ``cat`` (a prim: lowered to one where-chain, or stores into slices)."""
    dim = dim % (tensors[0].dim() + 1)
    return aten.cat([aten.unsqueeze(t, dim) for t in tensors], dim)


@register_decomposition(aten.roll)
def roll(x, shifts, dims=()):
    """``roll`` as the two slices of each rolled dim joined by ``cat``: a kernel that fuses with its
    neighbours, where the library op is one more launch and copy (Swin Transformer's shifted windows
    roll twice per block). No ``dims``: the flattened tensor rolls."""
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:
        if len(shifts) != 1:
            return NotImplemented  # the op's own error message
        return aten.view(roll(reshape(x, [-1]), shifts, [0]), list(x.shape))
    if len(shifts) != len(dims):
        return NotImplemented
    out = x
    for shift, dim in zip(shifts, dims):
        n = out.shape[dim]
        if not isinstance(n, int) or not isinstance(shift, int):
            return NotImplemented  # a symbolic size: the op itself
        if n == 0 or shift % n == 0:
            continue
        start = n - shift % n
        out = aten.cat([aten.slice(out, dim, start, n), aten.slice(out, dim, 0, start)], dim)
    return aten.clone(x) if out is x else out


@register_decomposition(aten.constant_pad_nd)
def constant_pad_nd(x, pad, value=0):
    """A negative pad crops: that part is a slice (the op's own decomposition of a crop needs
    concrete sizes); the rest is padding (NotImplemented: the op itself, with pads >= 0)."""
    if not any(p < 0 for p in pad):
        return NotImplemented
    for i in range(len(pad) // 2):
        dim, before, after = x.dim() - 1 - i, pad[2 * i], pad[2 * i + 1]
        if before < 0 or after < 0:
            start = max(-before, 0)
            x = aten.slice(x, dim, start, x.shape[dim] - max(-after, 0))
    return aten.constant_pad_nd(x, [max(p, 0) for p in pad], value)


@register_decomposition(aten.unbind.int)
def unbind(x, dim=0):
    return [aten.select(x, dim, i) for i in range(x.shape[dim])]


@register_decomposition(aten.lift_fresh)
def lift_fresh(x):
    return aten.alias(x)


@register_decomposition(aten.lift_fresh_copy)
def lift_fresh_copy(x):
    return aten.clone(x)


# ----------------------------------------------------------------------------- pointwise
@register_decomposition(aten.add.Tensor, aten.add.Scalar)
def add(x, y, alpha=1):
    """Keep plain ``add``; fold a non-1 ``alpha`` into a ``mul`` so the prim has no alpha."""
    if alpha == 1:
        return NotImplemented
    return aten.add(x, aten.mul(y, alpha))


@register_decomposition(aten.sub.Tensor, aten.sub.Scalar)
def sub(x, y, alpha=1):
    if alpha == 1:
        return NotImplemented
    return aten.sub(x, aten.mul(y, alpha))


@register_decomposition(aten.rsub)
def rsub(x, y, alpha=1):
    return aten.sub(y, aten.mul(x, alpha) if alpha != 1 else x)


@register_decomposition(aten.silu)
def silu(x):
    return aten.mul(x, aten.sigmoid(x))


@register_decomposition(aten.gelu)
def gelu(x, approximate="none"):
    """GELU, exact (erf) or the tanh approximation."""
    if approximate == "tanh":
        inner = aten.mul(aten.add(x, aten.mul(aten.mul(aten.mul(x, x), x), 0.044715)),
                         math.sqrt(2.0 / math.pi))
        return aten.mul(aten.mul(x, 0.5), aten.add(aten.tanh(inner), 1.0))
    return aten.mul(aten.mul(x, 0.5), aten.add(aten.erf(aten.mul(x, 1.0 / math.sqrt(2.0))), 1.0))


@register_decomposition(aten.clamp)
def clamp(x, min=None, max=None):
    if min is not None:
        x = aten.maximum(x, _scalar(min, x))
    if max is not None:
        x = aten.minimum(x, _scalar(max, x))
    return x


@register_decomposition(aten.clamp_min)
def clamp_min(x, min):
    return aten.maximum(x, _scalar(min, x))


@register_decomposition(aten.clamp_max)
def clamp_max(x, max):
    return aten.minimum(x, _scalar(max, x))


@register_decomposition(aten.bitwise_not)
def bitwise_not(x):
    """``~mask`` on a bool tensor is logical not; integer bit flips stay a fallback."""
    return aten.logical_not(x) if x.dtype == torch.bool else NotImplemented


@register_decomposition(aten.masked_fill)
def masked_fill(x, mask, value):
    return aten.where(mask, _scalar(value, x), x)


def _make_triangle(lower: bool) -> Callable:
    def triangle(x, diagonal=0):
        """Keep the entries with ``col - row <= diagonal`` (tril) or ``>= diagonal`` (triu)."""
        rows, cols = x.shape[-2], x.shape[-1]
        r = aten.unsqueeze(aten.arange(rows, device=x.device), 1)
        c = aten.unsqueeze(aten.arange(cols, device=x.device), 0)
        offset = aten.sub(c, r)
        keep = aten.le(offset, diagonal) if lower else aten.ge(offset, diagonal)
        return aten.where(keep, x, _scalar(0, x))

    return triangle


register_decomposition(aten.tril)(_make_triangle(lower=True))
register_decomposition(aten.triu)(_make_triangle(lower=False))


@register_decomposition(aten._to_copy)
def _to_copy(x, dtype=None, device=None, layout=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if device is not None and torch.device(device) != x.device:
        return NotImplemented  # a device copy stays a (logged) fallback
    return prims.convert_element_type(aten.clone(x), dtype if dtype is not None else x.dtype)


# ----------------------------------------------------------------------------- creation
# Factories are called by overload (``aten.full.default``): resolving the packet ``aten.full``
# matches the SymInt sizes against ``full.names`` too, and torch 2.11 specialises them doing so
# (a dynamic length recompiled per size).
def _full(shape, value, like, dtype=None, device=None):
    return aten.full.default(list(shape), value, dtype=dtype or like.dtype, device=device or like.device)


@register_decomposition(aten.zeros)
def zeros(size, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.full.default(list(size), 0, dtype=dtype or torch.get_default_dtype(), device=device)


@register_decomposition(aten.ones)
def ones(size, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.full.default(list(size), 1, dtype=dtype or torch.get_default_dtype(), device=device)


@register_decomposition(aten.zeros_like)
def zeros_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _full(x.shape, 0, x, dtype, device)


@register_decomposition(aten.ones_like)
def ones_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _full(x.shape, 1, x, dtype, device)


@register_decomposition(aten.full_like)
def full_like(x, value, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None):
    return _full(x.shape, value, x, dtype, device)


@register_decomposition(aten.new_zeros)
def new_zeros(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 0, x, dtype, device)


@register_decomposition(aten.new_ones)
def new_ones(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 1, x, dtype, device)


@register_decomposition(aten.new_full)
def new_full(x, size, value, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, value, x, dtype, device)


# ----------------------------------------------------------------------------- normalisation
@register_decomposition(aten._weight_norm_interface)
def _weight_norm_interface(v, g, dim=0):
    """``torch.nn.utils.weight_norm``'s ``v * (g / ||v||)``, the norm over every dim but ``dim``
    (kept, and returned too, as the ATen op does)."""
    dims = [i for i in range(v.dim()) if i != dim]
    norm = aten.linalg_vector_norm(v, 2, dims, keepdim=True)
    return aten.mul(v, aten.div(g, norm)), norm


@register_decomposition(aten.native_layer_norm)
def native_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(x - mean) * rsqrt(var + eps) * weight + bias over the last len(normalized_shape) dims.

    Returns ``(out, mean, rstd)`` like the ATen op; the statistics keep the reduced dims and,
    as in eager, are not differentiable outputs (``detach``).
    """
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    xf = _upcast(x)
    mean = aten.mean(xf, dims, keepdim=True)
    var = aten.var(xf, dims, correction=0, keepdim=True)
    rstd = aten.rsqrt(aten.add(var, eps))
    out = aten.mul(aten.sub(xf, mean), rstd)
    if weight is not None:
        out = aten.mul(out, weight)
    if bias is not None:
        out = aten.add(out, bias)
    out = prims.convert_element_type(out, x.dtype) if out.dtype != x.dtype else out
    return out, aten.detach(mean), aten.detach(rstd)


# Batch norm (``config.decompose_batch_norm``): a reduction for the batch statistics (training) and
# one pointwise expression for the normalisation, so it fuses with the convolution's consumers (the
# ReLU, the residual add) instead of running as one ATen call per layer. Its gradient then comes
# from AD over these prims. Statistics are computed in float32 for half-precision inputs, as eager.
def _channel_shape(x: torch.Tensor) -> list[int]:
    """``[1, C, 1, 1]`` for an ``(N, C, H, W)`` input: a per-channel vector broadcast over the rest."""
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


def _per_channel(v, x: torch.Tensor):
    return aten.view(_upcast(v), _channel_shape(x)) if v is not None else None


def _normalize(x, mean, rstd, weight, bias, xf=None):
    """``(x - mean) * rstd * weight + bias`` in float32 for half inputs, cast back to ``x``'s dtype.
    ``xf``: ``x`` already upcast (training): one cast, so that AD sums the gradients reaching ``x``
    through the statistics and through the normalisation in float32 before rounding them once,
    as ``native_batch_norm_backward`` does (two casts would round each half-precision part first,
    and the parts nearly cancel)."""
    out = aten.mul(aten.sub(_upcast(x) if xf is None else xf, mean), rstd)
    if weight is not None:
        out = aten.mul(out, _per_channel(weight, x))
    if bias is not None:
        out = aten.add(out, _per_channel(bias, x))
    return prims.convert_element_type(out, x.dtype) if out.dtype != x.dtype else out


def _batch_moments(xf, dims):
    """Per-channel mean and (biased) variance over ``dims``, keepdim.

    Where the backend would split a reduction over all of ``dims`` (few channels over a long range:
    ``lowering.reduction_split_point``), they come in two levels (Chan's parallel variance): each
    sample's mean and sum of squared deviations over its own map, one program per (sample,
    channel) over a contiguous row; then over the batch, ``M2 = sum(M2_n) + m * sum((mean_n -
    mean)^2)`` with ``m`` values per map. Split, the two-pass variance would be four kernels (its
    second pass needs the full mean); this is two. Elsewhere one level is one kernel."""
    sizes = list(xf.shape)
    static = all(isinstance(n, int) for n in sizes)
    if len(sizes) > 2 and static and sizes[0] > 1 and lowering.reduction_split_point(
            [sizes[1]], [sizes[d] for d in dims], xf.device) is not None:
        maps = list(range(2, len(sizes)))
        per_map = math.prod(sizes[2:])
        mean_n = aten.mean(xf, maps, keepdim=True)
        m2_n = aten.sum(aten.mul(aten.sub(xf, mean_n), aten.sub(xf, mean_n)), maps, keepdim=True)
        mean = aten.mean(mean_n, [0], keepdim=True)
        spread = aten.sub(mean_n, mean)
        m2 = aten.add(aten.sum(m2_n, [0], keepdim=True), aten.mul(aten.sum(aten.mul(spread, spread), [0], keepdim=True),
                                                                  per_map))
        return mean, aten.div(m2, sizes[0] * per_map)
    return aten.mean(xf, dims, keepdim=True), aten.var(xf, dims, correction=0, keepdim=True)


def _batch_norm_training(x, weight, bias, running_mean, running_var, momentum, eps):
    """Normalise by the batch's statistics; returns ``(out, save_mean, save_rstd, new_running_mean,
    new_running_var)`` (the last two None without running statistics). The running statistics
    move towards the batch's (variance unbiased) outside autograd, as eager updates them."""
    dims = [0] + list(range(2, x.dim()))
    xf = _upcast(x)
    mean, var = _batch_moments(xf, dims)
    rstd = aten.rsqrt(aten.add(var, eps))
    out = _normalize(x, mean, rstd, weight, bias, xf)
    save_mean, save_rstd = aten.squeeze(mean, dims), aten.squeeze(rstd, dims)
    new_mean = new_var = None
    if running_mean is not None:
        n = x.numel() // x.shape[1]
        batch_mean = aten.detach(save_mean)
        batch_var = aten.mul(aten.detach(aten.squeeze(var, dims)), n / max(n - 1, 1))
        new_mean = aten.add(aten.mul(_upcast(running_mean), 1 - momentum), aten.mul(batch_mean, momentum))
        new_var = aten.add(aten.mul(_upcast(running_var), 1 - momentum), aten.mul(batch_var, momentum))
        new_mean = prims.convert_element_type(new_mean, running_mean.dtype)
        new_var = prims.convert_element_type(new_var, running_var.dtype)
    return out, aten.detach(save_mean), aten.detach(save_rstd), new_mean, new_var


def _batch_norm_inference(x, weight, bias, running_mean, running_var, eps):
    """Normalise by the running statistics: one pointwise expression."""
    rstd = aten.rsqrt(aten.add(_per_channel(running_var, x), eps))
    return _normalize(x, _per_channel(running_mean, x), rstd, weight, bias)


def _empty_stats(x):
    return aten.full.default([0], 0, dtype=_upcast(x).dtype, device=x.device)


def _bn_enabled(training: bool = False) -> bool:
    """Whether batch norm decomposes here. Training mode waits until after AD when a backward
    follows: AD then takes the op's VJP rule, ``native_batch_norm_backward``, whose decomposition
    below is ATen's formula (TorchInductor's order too), and the joint graph decomposes the forward.
    AD over the forward's decomposition would give the same gradient in another order of float32
    operations, further from eager's in bf16 through a deep network."""
    if training and (not config.decompose_batch_norm_training or _tracing_for_ad):
        return False
    return config.decompose_batch_norm


@register_decomposition(aten.native_batch_norm_backward)
def native_batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train,
                               eps, output_mask):
    """ATen's formula in float32 (half inputs upcast once): with ``g`` the output's gradient and
    ``xhat = (x - mean) * invstd``, per channel over the other dims,
    ``grad_x = (g - mean(g) - xhat * mean(g * xhat)) * invstd * weight`` (training; eval mode has
    constant statistics, so ``grad_x = g * invstd * weight``), ``grad_weight = sum(g * xhat)`` and
    ``grad_bias = sum(g)``. Two reductions over the batch, which the scheduler fuses."""
    if not _bn_enabled(training=bool(train)):
        return NotImplemented
    dims = [0] + list(range(2, x.dim()))
    xf, g = _upcast(x), _upcast(grad_out)
    if train:
        mean, invstd = _per_channel(save_mean, x), _per_channel(save_invstd, x)
    else:
        mean = _per_channel(running_mean, x)
        invstd = aten.rsqrt(aten.add(_per_channel(running_var, x), eps))
    n = x.numel() // x.shape[1]
    centered = aten.sub(xf, mean)
    g_sum = aten.sum(g, dims, keepdim=True)
    dot = aten.sum(aten.mul(g, centered), dims, keepdim=True)
    scale = invstd if weight is None else aten.mul(invstd, _per_channel(weight, x))
    if train:
        proj = aten.mul(centered, aten.mul(aten.div(dot, n), aten.mul(invstd, invstd)))
        grad_x = aten.mul(aten.sub(aten.sub(g, proj), aten.div(g_sum, n)), scale)
    else:
        grad_x = aten.mul(g, scale)
    grad_x = prims.convert_element_type(grad_x, x.dtype) if grad_x.dtype != x.dtype else grad_x
    param_dtype = weight.dtype if weight is not None else x.dtype
    grad_w = grad_b = None
    if output_mask[1]:
        grad_w = aten.squeeze(aten.mul(dot, invstd), dims)
        grad_w = prims.convert_element_type(grad_w, param_dtype) if grad_w.dtype != param_dtype else grad_w
    if output_mask[2]:
        grad_b = aten.squeeze(g_sum, dims)
        grad_b = prims.convert_element_type(grad_b, param_dtype) if grad_b.dtype != param_dtype else grad_b
    return grad_x if output_mask[0] else None, grad_w, grad_b


@register_decomposition(aten._native_batch_norm_legit_no_training)
def _native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    if not _bn_enabled():
        return NotImplemented
    return _batch_norm_inference(x, weight, bias, running_mean, running_var, eps), _empty_stats(x), _empty_stats(x)


@register_decomposition(aten._native_batch_norm_legit_functional)
def _native_batch_norm_legit_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if not _bn_enabled(training=True) or not training:
        return NotImplemented
    return _batch_norm_training(x, weight, bias, running_mean, running_var, momentum, eps)


def _write_running_stats(running_mean, running_var, new_mean, new_var) -> None:
    """The in-place update of the ATen op, as ``copy_`` into the inputs: the functional graph
    returns the new values (aliasing.strip_input_mutations) and they are written back after it."""
    aten.copy_(running_mean, new_mean)
    aten.copy_(running_var, new_var)


@register_decomposition(aten._native_batch_norm_legit.default)
def _native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training and _tracing_for_ad and config.decompose_batch_norm and config.decompose_batch_norm_training:
        # before AD: the functional op, which AD differentiates by its rule and the joint graph then
        # decomposes, and the running statistics written back as copies into the inputs, which
        # become graph outputs copied back after the call (aliasing.strip_input_mutations)
        out, mean, rstd, new_mean, new_var = aten._native_batch_norm_legit_functional(
            x, weight, bias, running_mean, running_var, training, momentum, eps)
        _write_running_stats(running_mean, running_var, new_mean, new_var)
        return out, mean, rstd
    if not _bn_enabled(training):
        return NotImplemented
    if not training:
        out, *_ = _native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps)
        return out, _empty_stats(x), _empty_stats(x)
    out, mean, rstd, new_mean, new_var = _batch_norm_training(x, weight, bias, running_mean, running_var,
                                                             momentum, eps)
    _write_running_stats(running_mean, running_var, new_mean, new_var)
    return out, mean, rstd


@register_decomposition(aten._native_batch_norm_legit.no_stats)
def _native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps):
    if not _bn_enabled(training=True) or not training:
        return NotImplemented
    return _batch_norm_training(x, weight, bias, None, None, momentum, eps)[:3]


@register_decomposition(aten.native_batch_norm)
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if not _bn_enabled(training):
        return NotImplemented
    if not training or running_mean is None:
        if not training and running_mean is not None:
            out = _batch_norm_inference(x, weight, bias, running_mean, running_var, eps)
            return out, _empty_stats(x), _empty_stats(x)
        return _native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps)
    return _native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps)


def _row_max(x, dim):
    """The row max that (log-)softmax subtracts, detached. It only keeps ``exp`` from overflowing:
    the result does not depend on it, so no gradient goes through it, as none does in eager's
    softmax backward. Differentiated, it would cost the backward two more reductions per row (the
    max's share of the gradient, which is zero but for rounding, and the count of ties). Only a
    graph traced for AD needs the ``detach``; an inference graph is left without it."""
    row_max = aten.amax(x, [dim], True)
    return aten.detach(row_max) if _tracing_for_ad else row_max


@register_decomposition(aten._softmax)
def _softmax(x, dim, half_to_float=False):
    """exp(x - max) / sum(exp(x - max)): subtracting the row max keeps exp from overflowing."""
    xf = _upcast(x) if half_to_float else x
    shifted = aten.sub(xf, _row_max(xf, dim))
    e = aten.exp(shifted)
    return aten.div(e, aten.sum(e, [dim], True))


@register_decomposition(aten._safe_softmax)
def _safe_softmax(x, dim, dtype=None):
    """Softmax whose fully masked rows (every entry ``-inf``) are 0 instead of NaN: what the math
    attention path (``scaled_dot_product_attention`` with a boolean mask) calls. Such a row's max
    is ``-inf``: it is shifted by 0 instead, so its exps are 0, and divided by 1 instead of its sum
    of 0. Nothing in it is NaN, so its gradient is 0 as in eager, and the whole op is one
    reduction kernel with the masking and the scores' producer fused in."""
    xf = prims.convert_element_type(x, dtype) if dtype is not None and dtype != x.dtype else x
    row_max = _row_max(xf, dim)
    shift = aten.where(aten.eq(row_max, -math.inf), _scalar(0, row_max), row_max)
    e = aten.exp(aten.sub(xf, shift))
    total = aten.sum(e, [dim], True)
    return aten.div(e, aten.where(aten.eq(total, 0), _scalar(1, total), total))


@register_decomposition(aten._log_softmax)
def _log_softmax(x, dim, half_to_float=False):
    """x - max - log(sum(exp(x - max)))."""
    xf = _upcast(x) if half_to_float else x
    shifted = aten.sub(xf, _row_max(xf, dim))
    return aten.sub(shifted, aten.log(aten.sum(aten.exp(shifted), [dim], True)))


@register_decomposition(aten.nll_loss_forward)
def nll_loss_forward(logp, target, weight, reduction, ignore_index):
    """Negative log-likelihood of ``target`` under log-probabilities ``logp`` (N, C) or (C,).

    Returns ``(loss, total_weight)`` like the ATen op. Class weights stay a fallback.
    """
    if weight is not None:
        return NotImplemented
    batched = logp.dim() == 2
    if not batched:
        logp, target = aten.unsqueeze(logp, 0), aten.unsqueeze(target, 0)
    keep = aten.ne(target, ignore_index)
    safe_target = aten.where(keep, target, aten.scalar_tensor(0, dtype=target.dtype,
                                                                device=target.device))
    picked = aten.squeeze(aten.gather(logp, 1, aten.unsqueeze(safe_target, 1)), [1])
    losses = aten.where(keep, aten.neg(picked), _scalar(0, logp))
    total_weight = aten.sum(prims.convert_element_type(keep, logp.dtype))
    if reduction == 0:  # none
        return (losses if batched else aten.squeeze(losses, [0])), total_weight
    total = aten.sum(losses)
    if reduction == 1:  # mean
        total = aten.div(total, total_weight)
    return total, total_weight


@register_decomposition(aten.native_dropout)
def native_dropout(x, p, train):
    """Identity plus an all-True keep-mask when nothing is dropped (eval mode or p == 0).

    Random dropout is left alone: ``F.dropout`` in training reaches the graph as torch's own
    expansion, ``bernoulli`` (a logged fallback: there is no random prim) times a scale (on
    CUDA: ``native_dropout``, whose rule calls ``native_dropout_backward``), and AOT autograd
    saves that mask for the backward, so the gradient is exactly the one for the mask drawn.

    How values relate to eager's: the mask is drawn from torch's global generator by the same
    kind of kernel, so it has eager's statistics (each element kept with probability ``1 - p``,
    kept values scaled by ``1 / (1 - p)``), but it is a different draw whenever the compiled
    graph consumes random numbers in another order or amount than eager would; compare
    dropout's statistics, not its values (tests/test_aot_multi_output.py does).
    """
    if p != 0 and train is not False:
        return NotImplemented
    return aten.alias(x), aten.full.default(list(x.shape), True, dtype=torch.bool, device=x.device)


# ----------------------------------------------------------------------------- attention
#: True while :func:`decompose` traces a graph that no backward will differentiate (``inference=True``)
_tracing_inference = False
#: True while :func:`decompose` traces a graph that AD will differentiate next (``inference=False``)
_tracing_for_ad = False


@contextlib.contextmanager
def _inference_trace(inference: bool):
    global _tracing_inference, _tracing_for_ad
    before = _tracing_inference, _tracing_for_ad
    _tracing_inference, _tracing_for_ad = inference, not inference
    try:
        yield
    finally:
        _tracing_inference, _tracing_for_ad = before


def _with_log_sumexp(op):
    """The fused CUDA attention kernels save their logsumexp for the backward only when asked
    (``compute_log_sumexp``), which torch decides from grad mode. Graphs are traced without
    grad, so ask unless the graph is traced for inference: the backward (its VJP rule calls the
    ATen backward op) needs it, an inference call would only allocate and write it."""
    def decomposition(q, k, v, attn_bias, compute_log_sumexp, *args, **kwargs):
        if compute_log_sumexp or _tracing_inference:
            return NotImplemented
        return op(q, k, v, attn_bias, True, *args, **kwargs)
    return decomposition


for _op in (aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_cudnn_attention.default):
    register_decomposition(_op)(_with_log_sumexp(_op))


# ----------------------------------------------------------------------------- multi-head attention fast paths
# nn.MultiheadAttention (batch_first, eval, no grad) and nn.TransformerEncoderLayer (eval) call one
# fused ATen op each. Left whole, the op is a fallback: the projections, the softmax and the output
# projection run inside it, out of reach of fusion and of the graph's matmul handling. Written out as
# linear layers + attention + linear, the projections become library matmuls (with their bias in the
# epilogue where fx_passes/mm_bias.py puts it there), the attention ``scaled_dot_product_attention``
# (its fused kernel) or, where the weights are returned or a mask is given, an explicit softmax that
# fuses with the masking and the scaling.

def _multi_head_mask(mask, mask_type, scores_shape: list):
    """The boolean mask (True: masked out) that ``_native_multi_head_attention`` applies to its
    scores of shape ``[B, heads, T, S]``, broadcastable to them, or None for a form eager rejects.

    The op converts any mask to bool first (a float mask's nonzero entries are masked out) and
    reads it by ``mask_type`` as ``_masked_softmax`` does: 0, an attention mask ``[T, S]``; 1, a
    key-padding mask ``[B, S]``; any other mask (and every mask that is not 2-D) must have the
    scores' own shape."""
    bool_mask = mask if mask.dtype == torch.bool else aten.ne(mask, 0)
    b, _, t, s = scores_shape
    if mask.dim() == 2 and mask_type == 0 and list(mask.shape) == [t, s]:
        return aten.view(bool_mask, [1, 1, t, s])
    if mask.dim() == 2 and mask_type == 1 and list(mask.shape) == [b, s]:
        return aten.view(bool_mask, [b, 1, 1, s])
    if (mask.dim() != 2 or mask_type == 2) and list(mask.shape) == list(scores_shape):
        return bool_mask
    return None


def _in_projection(query, key, value, weight, bias):
    """q, k, v ``[B, T, D]`` each: one matmul with the packed weight where the three inputs are one
    tensor (self-attention), else one per input with its third of the weight."""
    d = query.shape[-1]
    if query is key and key is value:
        return tuple(split(linear(query, weight, bias), d, -1))
    thirds = [(aten.slice(weight, 0, i * d, (i + 1) * d), aten.slice(bias, 0, i * d, (i + 1) * d)) for i in range(3)]
    return tuple(linear(x, w, b) for x, (w, b) in zip((query, key, value), thirds))


@register_decomposition(aten._native_multi_head_attention)
def _native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                 proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                                 mask_type=None):
    """nn.MultiheadAttention's fast path: in-projection, scaled dot-product attention per head,
    out-projection. Returns ``(output [B, T, D], weights)``: the weights are the softmax
    ``[B, heads, T, S]``, averaged over heads with ``average_attn_weights``, and None without
    ``need_weights``, as eager returns (an undefined tensor; the op's meta kernel makes an empty one).

    Without a mask and without weights the heads go to ``scaled_dot_product_attention`` (eager
    does the same). Otherwise the scores are computed explicitly: masked entries are ``-inf``; a row
    masked everywhere is NaN on the CPU and 0 on CUDA, as the op's ``_masked_softmax`` kernels give.
    Declined (the op stays, run by torch): nested tensors, inputs that are not ``[B, T, D]`` of one
    shape, and masks of a shape the op would reject."""
    if query.is_nested or query.dim() != 3 or query.shape[-1] != embed_dim or embed_dim % num_head \
            or list(key.shape) != list(query.shape) or list(value.shape) != list(query.shape):
        return NotImplemented
    b, t, d = query.shape
    head_dim = d // num_head
    bool_mask = None
    if mask is not None:
        bool_mask = _multi_head_mask(mask, mask_type, [b, num_head, t, t])
        if bool_mask is None:
            return NotImplemented
    q, k, v = (aten.permute(aten.view(x, [b, t, num_head, head_dim]), [0, 2, 1, 3])
               for x in _in_projection(query, key, value, qkv_weight, qkv_bias))
    weights = None
    if bool_mask is None and not need_weights:
        context = aten.scaled_dot_product_attention(q, k, v)
    else:
        scores = aten.matmul(aten.mul(q, 1.0 / math.sqrt(head_dim)), aten.transpose(k, -2, -1))
        if bool_mask is None:
            probs = aten._softmax(scores, -1, False)
        else:
            scores = aten.masked_fill(scores, bool_mask, -math.inf)
            probs = aten._safe_softmax(scores, -1) if query.device.type == "cuda" else aten._softmax(scores, -1, False)
        context = aten.matmul(probs, v)
        if need_weights:
            weights = aten.div(aten.sum(probs, [1]), num_head) if average_attn_weights else probs
    merged = reshape(aten.permute(context, [0, 2, 1, 3]), [b, t, d])
    return linear(merged, proj_weight, proj_bias), weights


@register_decomposition(aten._transformer_encoder_layer_fwd)
def _transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                   use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                   norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                   mask_type=None):
    """nn.TransformerEncoderLayer's fast path: self-attention (the op above, no weights) and a
    two-layer feed-forward block (exact GELU or ReLU), each added to its input, layer norm before
    (``norm_first``) or after each. Declined where the attention op is (nested tensors, odd masks)."""
    if src.is_nested or src.dim() != 3:
        return NotImplemented
    if src.numel() == 0:
        return aten.clone(src)

    def norm(x, weight, bias):
        return aten.native_layer_norm(x, [embed_dim], weight, bias, eps)[0]

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    attention = _native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                             proj_bias, mask, False, True, mask_type)
    if attention is NotImplemented:
        return NotImplemented
    x = aten.add(attention[0], src)
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = linear(x, ffn_weight_1, ffn_bias_1)
    hidden = aten.gelu(hidden) if use_gelu else aten.relu(hidden)
    x = aten.add(linear(hidden, ffn_weight_2, ffn_bias_2), residual)
    return norm(x, norm_weight_2, norm_bias_2) if not norm_first else x


# ----------------------------------------------------------------------------- writes into a fresh tensor
# Functionalization turns ``y[:, 1:] = x[:, :-1]`` on a fresh ``y`` (HF BART's decoder inputs, shifted
# right) into ``copy`` and ``slice_scatter``: as pointwise selects they fuse with what feeds them.

@register_decomposition(aten.copy.default)  # the packet also holds TorchScript list copies
def copy(x, src, non_blocking=False):
    """The functional ``x.copy_(src)``: ``src`` broadcast to ``x``'s shape, in ``x``'s dtype. A copy
    across devices stays (a logged fallback)."""
    if src.device != x.device:
        return NotImplemented
    return aten.clone(aten.expand(prims.convert_element_type(src, x.dtype), list(x.shape)))


@register_decomposition(aten.slice_scatter)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    """``x`` with ``x[start:end]`` along ``dim`` replaced by ``src``: ``src`` padded to ``x``'s length
    and picked inside the slice. Steps other than 1 stay (a logged fallback)."""
    dim = dim % x.dim()
    n = x.shape[dim]
    if step != 1 or not isinstance(n, int):
        return NotImplemented
    begin, stop, _ = slice(start, end).indices(n)
    stop = max(begin, stop)
    padded = aten.constant_pad_nd(src, [0, 0] * (x.dim() - 1 - dim) + [begin, n - stop])
    position = aten.view(aten.arange(n, device=x.device), [n] + [1] * (x.dim() - 1 - dim))
    inside = aten.logical_and(aten.ge(position, begin), aten.lt(position, stop))
    return aten.where(inside, padded, x)


# ----------------------------------------------------------------------------- scans
#: longest axis whose cumulative sum is written as a masked reduction (``n * n`` additions per row);
#: past it the op stays a fallback (TorchInductor generates a scan kernel instead)
CUMSUM_MAX_LENGTH = 1024


@register_decomposition(aten.cumsum)
def cumsum(x, dim, dtype=None):
    """Prefix sums along ``dim`` as one reduction: ``out[i] = sum over j of (j <= i ? x[j] : 0)``,
    over a ``[..., n, n, ...]`` masked view that is never stored (the mask and the broadcast fuse
    into the reduction's loads). Short axes only (:data:`CUMSUM_MAX_LENGTH`): position ids from an
    attention mask (HF OPT, XLM) then stop being a library call between kernels. Integers and bools
    sum in int64 as in eager; floats keep their dtype (the sum's order differs from eager's
    sequential one by rounding only)."""
    if x.dim() == 0 or x.is_complex():
        return NotImplemented
    dim = dim % x.dim()
    n = x.shape[dim]
    if not isinstance(n, int) or n == 0 or n > CUMSUM_MAX_LENGTH:
        return NotImplemented
    out_dtype = dtype if dtype is not None else x.dtype if x.is_floating_point() else torch.int64
    x = prims.convert_element_type(x, out_dtype)
    position = aten.arange(n, device=x.device)
    keep = aten.ge(aten.unsqueeze(position, 1), aten.unsqueeze(position, 0))  # [i, j]: j <= i
    keep = aten.view(keep, [n, n] + [1] * (x.dim() - dim - 1))
    masked = aten.where(keep, aten.unsqueeze(x, dim), _scalar(0, x))  # [..., i, j, ...]
    return aten.sum(masked, [dim + 1])


# ----------------------------------------------------------------------------- indexing
@register_decomposition(aten.embedding)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """Rows of ``weight`` picked by ``indices``: plain advanced indexing.

    ``padding_idx``: in eager the padding row gets no gradient. The values are the same rows,
    but where an index is the padding index the row is read through ``detach``, which AD
    treats as a gradient stop. ``scale_grad_by_freq`` / ``sparse`` change only the gradient:
    the op stays (a fallback) and its VJP rule calls ``embedding_dense_backward``.
    """
    if scale_grad_by_freq or sparse:
        return NotImplemented
    rows = aten.index(weight, [indices])
    if padding_idx is None or padding_idx < 0:
        return rows
    keep = aten.unsqueeze(aten.ne(indices, padding_idx), -1)
    return aten.where(keep, rows, aten.detach(rows))


# ----------------------------------------------------------------------------- the pass
def fallback_ops(gm: torch.fx.GraphModule, table: dict | None = None) -> list[tuple[str, str]]:
    """``(op name, reason)`` for every call in ``gm`` that is outside the prim set."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem or is_prim(node.target):
            continue
        name = str(node.target)
        if lookup(DECOMPOSITIONS if table is None else table, node.target) is not None:
            reason = "its decomposition declined these arguments (returned NotImplemented)"
        else:
            reason = "no decomposition registered in tininductor.decompositions"
        found.append((name, reason))
    return found


def fake_inputs(example_inputs):
    """Fake copies of ``example_inputs`` (shape/dtype/device/strides, no data) and their mode.

    Reuses the fake mode of inputs that are already fake (from TorchDynamo, say). In a new mode
    the copies are ``aliasing.fake_copies`` (a parameter's at a third of ``from_tensor``'s cost).
    """
    mode = detect_fake_mode(example_inputs)
    if mode is None:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        return fake_copies(mode, example_inputs), mode
    fakes = [
        mode.from_tensor(x) if isinstance(x, torch.Tensor) and not isinstance(
            x, torch._subclasses.fake_tensor.FakeTensor) else x
        for x in example_inputs
    ]
    return fakes, mode


class SymbolicComposites(torch.overrides.TorchFunctionMode):
    """While tracing a graph with symbolic sizes: run the composite ops whose C++ implementation
    reads sizes as ints (``linear``) as their Python decomposition instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch._C._nn.linear, torch.nn.functional.linear):
            return linear(*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def allow_real_constants(mode):
    """Let ``mode`` take real tensors for the length of a trace. TorchDynamo's fake mode (reused for
    symbolic sizes) refuses them, but a graph may make constants (``torch.tensor(2)`` in BART's
    attention is a real tensor passed through ``lift_fresh``): they are faked where they are used,
    as under the fresh mode a static trace makes."""
    before = mode.allow_non_fake_inputs
    mode.allow_non_fake_inputs = True
    try:
        yield
    finally:
        mode.allow_non_fake_inputs = before


def _record(functional: Callable, fn, fakes: list, table: dict) -> torch.fx.GraphModule:
    """Run ``functional`` on ``fakes`` under an :class:`OpRecorder`: the graph make_fx would trace, with
    its placeholders named as make_fx names them (``x_1`` after a function's parameter ``x``, else ``arg0_1``)."""
    graph = torch.fx.Graph()
    recorder = OpRecorder(graph, table)
    for name, value in zip(_placeholder_names(fn, len(fakes)), fakes):
        node = graph.placeholder(name)
        node.meta["val"] = value
        recorder.bind(value, node)
    with recorder:
        result = functional(*fakes)
    graph.output(tree_map_only(torch.Tensor, recorder.node, result))
    return _make_graph_module(recorder.constants, graph, class_name=getattr(fn, "__name__", "GraphModule"))


def _placeholder_names(fn, count: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values()) if inspect.isfunction(fn) else []
    except (TypeError, ValueError):
        params = []
    if len(params) == count and all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        return [f"{p.name}_1" for p in params]
    return [f"arg{i}_1" for i in range(count)]


def decompose(gm: torch.fx.GraphModule, example_inputs, table: dict | None = None,
              inference: bool = False) -> torch.fx.GraphModule:
    """Re-trace ``gm`` into a graph of prim-set ATen ops with the same calling convention.

    Tracing runs on fake tensors (no real compute) with autograd off: decompositions are
    about meaning, gradients are AOT autograd's business. Static sizes are recorded by the lean
    :class:`OpRecorder`; symbolic ones by ``make_fx``, which keeps the size expressions. Every
    node of the result carries ``meta["val"]``, a fake tensor with the node's shape, dtype and
    device. Ops left outside the prim set are logged and listed in ``result.meta["fallbacks"]``. ``table`` replaces
    :data:`DECOMPOSITIONS` (any op -> function mapping, read with the registry's keying rule; the
    course swaps a learner's entry into the registry itself: ``DECOMPOSITIONS.swap({op: yours})``).
    ``inference``: no backward will differentiate the graph, so nothing is kept for one (the
    attention kernels' logsumexp).
    """
    table = overload_table(DECOMPOSITIONS if table is None else table)
    fakes, mode = fake_inputs(example_inputs)
    # functionalize: in-place ops on intermediates (``y.add_(1)``) become out-of-place ops, so
    # every node is a pure function of its inputs (what AD and fusion assume); a mutated
    # input is written back with a final ``copy_`` (a logged fallback)
    functional = torch.func.functionalize(gm, remove="mutations")
    symbolic = has_symbolic_sizes(fakes)
    # the Python dispatcher makes torch's composite kernels emit functional ops (squeeze, not squeeze_)
    composites = SymbolicComposites() if symbolic else contextlib.nullcontext()
    # each node's ``meta["original_aten"]``: the op it was decomposed from (``aten._softmax`` for the
    # ``amax``, ``sub``, ``exp`` ... it became), which kernel names can follow (``config.descriptive_names``)
    with torch.no_grad(), mode, enable_python_dispatcher(), composites, allow_real_constants(mode), \
            fx_traceback.preserve_node_meta(), _inference_trace(inference):
        # static sizes: the lean recorder; symbolic ones need make_fx to keep size expressions
        out = make_fx(functional, decomposition_table=table)(*fakes) if symbolic \
            else _record(functional, gm, fakes, table)
    if functionalize_inplace_views(out):
        # the in-place op restrided its base's example value too: recompute every node's ``val``
        with torch.no_grad():
            FakeTensorProp(out, mode).propagate_dont_convert_inputs(*fakes)
    out.meta["fallbacks"] = fallback_ops(out, table)
    for name, reason in out.meta["fallbacks"]:
        log.info("fallback to torch for %s: %s", name, reason)
    return out


# ----------------------------------------------------------------------------- as a lowering
class _LowerEach(torch.fx.Interpreter):
    """Run a small ATen graph on IR values: each op through the package's lowering."""

    def call_function(self, target, args, kwargs):
        if target is operator.getitem:
            return args[0][args[1]]
        fn = lowering.lookup(target)
        if fn is None:
            raise lowering.LoweringDeclined(f"{target} has no lowering")
        return fn(*args, **kwargs)


def decomposition_lowering(op) -> Callable:
    """A lowering of ``op`` derived from its decomposition (the op's one definition): trace the
    decomposition on meta tensors shaped like the IR arguments, then lower each op of that small
    graph with its lowering. ``decomposition_lowering(aten.silu.default)`` builds the lowering of
    silu that chapter 7's Exercise 7.1 writes by hand, from ``silu``'s decomposition above."""
    def lower(*args, **kwargs):
        flat, spec = tree_flatten((args, kwargs))
        where = [i for i, a in enumerate(flat) if isinstance(a, ir.IRNode)]

        def call(*tensors):
            values = list(flat)
            for i, t in zip(where, tensors):
                values[i] = t
            args_, kwargs_ = tree_unflatten(values, spec)
            return op(*args_, **kwargs_)

        metas = [torch.empty([int(n) for n in flat[i].get_size()], dtype=flat[i].get_dtype(), device="meta")
                 for i in where]
        gm = make_fx(call, decomposition_table=DECOMPOSITIONS.overload_table())(*metas)
        return _LowerEach(gm).run(*[flat[i] for i in where])

    return lower


def _view_of(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``aten.as_strided_.default`` -> ``aten.as_strided.default``: the view op an in-place view op restrides like."""
    packet = getattr(torch.ops.aten, op.__name__.split(".")[0].rstrip("_"), None)
    return getattr(packet, op._overloadname, None) if packet is not None else None


def functionalize_inplace_views(gm: torch.fx.GraphModule) -> bool:
    """Turn in-place *view* ops on intermediates (``y.as_strided_(size, stride)``, ``y.t_()``) into
    their view ops, and let every later reader of ``y`` read the view.

    Functionalization removes data mutations but leaves metadata mutations in place: ATen's
    ``adaptive_avg_pool2d`` restrides its ``mean`` output with ``as_strided_`` for a channels-last
    input (ConvNeXt, ResNet heads), which AD would otherwise see as an in-place op on a value that
    requires grad. Rebinding the later readers is exactly what the in-place op meant. Inputs are
    left alone (their metadata change must be seen by the caller: aliasing.py's business).
    Returns whether the graph changed.
    """
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
                or torch.Tag.inplace_view not in node.target.tags:
            continue
        base, view = node.args[0], _view_of(node.target)
        if view is None or not isinstance(base, torch.fx.Node) or base.op == "placeholder":
            continue
        node.target = view
        for user in list(base.users):
            if user is not node and order[user] > order[node]:
                user.replace_input_with(base, node)
        changed = True
    if changed:
        gm.recompile()
    return changed
