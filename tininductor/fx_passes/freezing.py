"""Freezing (``config.freezing``, off by default as in torch.compile): an inference graph's
parameters and buffers become constants of the graph, so what depends only on them is computed
once, at compile time, instead of in every call.

Two steps, on the prim graph AOT autograd hands the inference compiler:

* **constant folding**: a node whose inputs are all constants is run once and replaced by its
  value (``rsqrt(running_var + eps) * weight``: batch norm's per-channel scale);
* **convolution folding**: a per-output-channel affine chain right after a convolution
  (``(conv(x) - mean) * scale + shift``, which is what an eval-mode batch norm is once folded)
  is folded into the convolution's weight and bias: the batch norm disappears.

The compiled function then ignores later changes to those parameters (as TorchInductor's
freezing does): it is for inference of a model whose weights are fixed.
"""
from __future__ import annotations

import logging
import operator

import torch
from torch import fx

aten = torch.ops.aten
prims = torch.ops.prims
log = logging.getLogger(__name__)

#: ops whose value constant folding may compute once (pure, no randomness, no fresh memory of a
#: size that does not come from their inputs)
_AFFINE = {aten.add.Tensor: "add", aten.sub.Tensor: "sub", aten.mul.Tensor: "mul", aten.div.Tensor: "div"}


def freeze(gm: fx.GraphModule, inputs: list, frozen: list[int]) -> fx.GraphModule:
    """Make the placeholders at positions ``frozen`` constants holding ``inputs``' values, fold
    what depends only on them, and fold batch norms into convolutions. The calling convention is
    kept (the frozen arguments are still passed, and unused)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i in frozen:
        node = placeholders[i]
        if not node.users or not isinstance(inputs[i], torch.Tensor):
            continue
        with gm.graph.inserting_after(placeholders[-1]):
            const = _constant(gm, inputs[i].detach(), f"frozen_param{i}")
        const.meta = dict(node.meta)
        node.replace_all_uses_with(const)
    constant_fold(gm)
    fold_convolution_affine(gm)
    constant_fold(gm)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return gm


def _constant(gm: fx.GraphModule, value: torch.Tensor, hint: str) -> fx.Node:
    name = hint
    k = 0
    while hasattr(gm, name):
        k += 1
        name = f"{hint}_{k}"
    gm.register_buffer(name, value)
    node = gm.graph.get_attr(name)
    node.meta["val"] = value
    return node


def _value(gm, node):
    return getattr(gm, node.target) if isinstance(node, fx.Node) and node.op == "get_attr" else None


def _foldable(node: fx.Node) -> bool:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return target is operator.getitem and node.op == "call_function"
    return not (target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags
                or target.overloadpacket in (aten.convolution, aten.mm, aten.bmm, aten.addmm))


def constant_fold(gm: fx.GraphModule) -> None:
    """Replace each node whose tensor inputs are all constants by its value, computed now. Ops
    without tensor inputs (``full``) stay: folding them would only store what a kernel computes
    for free; and a result larger than its inputs together (an ``expand``) stays a node too."""
    for node in list(gm.graph.nodes):
        if not _foldable(node):
            continue
        inputs = node.all_input_nodes
        if not inputs or any(n.op != "get_attr" for n in inputs):
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: _value(gm, n))
        try:
            value = node.target(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - leave the node to the compiled graph
            log.debug("not folding %s: %s", node, e)
            continue
        if not isinstance(value, torch.Tensor):
            continue
        if value.numel() > sum(_value(gm, n).numel() for n in inputs):
            continue
        with gm.graph.inserting_before(node):
            const = _constant(gm, value.contiguous() if value._base is not None else value, "folded")
        node.replace_all_uses_with(const)
        gm.graph.erase_node(node)


def _per_channel(value, out_dim: int, channels: int):
    """``value`` as a ``[C]`` vector when it broadcasts over an ``(N, C, ...)`` tensor by channel
    (shape ``[1, C, 1, 1]``, ``[C, 1, 1]`` or a scalar), else None."""
    if isinstance(value, (int, float)):
        return torch.full([channels], float(value), dtype=torch.float64)
    if not isinstance(value, torch.Tensor) or value.dim() > out_dim:
        return None
    shape = [1] * (out_dim - value.dim()) + list(value.shape)
    if value.numel() == 1:
        return value.reshape([]).double().expand(channels)
    if shape[1] != channels or any(s != 1 for d, s in enumerate(shape) if d != 1):
        return None
    return value.reshape(channels).double()


def fold_convolution_affine(gm: fx.GraphModule) -> None:
    """Fold ``conv(x, w, b)`` followed by per-channel ``+ - * /`` with constants (and dtype
    casts) into ``conv(x, w * s, b * s + t)``."""
    for conv in list(gm.graph.nodes):
        if conv.op != "call_function" or conv.target is not aten.convolution.default:
            continue
        w_node, b_node = conv.args[1:3]
        transposed = conv.args[6]
        weight, bias = _value(gm, w_node), _value(gm, b_node) if b_node is not None else None
        if transposed or weight is None or (b_node is not None and bias is None):
            continue
        scale, shift, last = _affine_chain(gm, conv, weight.shape[0], weight.dim())
        if last is None:
            continue
        _fold_into_convolution(gm, conv, weight, bias, scale, shift, last)
        gm.graph.eliminate_dead_code()


def _affine_chain(gm: fx.GraphModule, conv: fx.Node, channels: int, out_dim: int):
    """``(scale, shift, last)``: the per-channel ``y * scale + shift`` that the single-user chain of
    ``+ - * /`` by constants after ``conv`` computes, and its last node (None: no such op follows)."""
    scale = torch.ones(channels, dtype=torch.float64)
    shift = torch.zeros(channels, dtype=torch.float64)
    cur, last = conv, None
    while len(cur.users) == 1:
        user = next(iter(cur.users))
        if user.op == "call_function" and user.target is prims.convert_element_type.default:
            cur = user
            continue
        kind = _AFFINE.get(user.target) if user.op == "call_function" else None
        if kind is None or len(user.args) != 2 or user.kwargs:
            break
        a, b = user.args
        mine_first = a is cur
        other = b if mine_first else a
        if other is cur:
            break
        c = _per_channel(_value(gm, other) if isinstance(other, fx.Node) else other, out_dim, channels)
        if c is None:
            break
        if kind == "add":
            shift = shift + c
        elif kind == "sub" and mine_first:
            shift = shift - c
        elif kind == "sub":
            scale, shift = -scale, c - shift
        elif kind == "mul":
            scale, shift = scale * c, shift * c
        elif kind == "div" and mine_first:
            scale, shift = scale / c, shift / c
        else:
            break
        cur = last = user
    return scale, shift, last


def _fold_into_convolution(gm: fx.GraphModule, conv: fx.Node, weight, bias, scale, shift, last: fx.Node) -> None:
    """Give ``conv`` the folded weight and bias as constants, and let it (cast to the chain's dtype)
    replace the chain's last node."""
    channels, out_dim = weight.shape[0], weight.dim()
    view = [channels] + [1] * (out_dim - 1)
    new_w = (weight.double() * scale.view(view)).to(weight.dtype)
    new_b = ((bias.double() if bias is not None else 0) * scale + shift).to(weight.dtype)
    with gm.graph.inserting_before(conv):
        w_const = _constant(gm, new_w, "folded_conv_weight")
        b_const = _constant(gm, new_b, "folded_conv_bias")
    conv.args = (conv.args[0], w_const, b_const, *conv.args[3:])
    out = conv
    want = last.meta["val"].dtype
    if conv.meta["val"].dtype != want:
        with gm.graph.inserting_after(conv):
            out = gm.graph.call_function(prims.convert_element_type.default, (conv, want))
        out.meta["val"] = last.meta["val"]
    last.replace_all_uses_with(out)
