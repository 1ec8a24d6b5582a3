"""A matmul's bias added by the library's epilogue where no generated kernel would take it in
(``config.mm_bias_epilogue``; TorchInductor keeps ``addmm`` as an extern kernel for the same reason).

Decomposition turns ``addmm(bias, a, b)`` into ``mm`` + ``add``, so that the add fuses into the
kernel that reads the product anyway (the activation after a linear layer, the copy that reshapes
queries for attention). Where nothing but library kernels, fallbacks and graph outputs read the sum,
through views only (GPT-2's fused QKV projection, read by the fused attention kernel), the add
would be a kernel of its own, one more pass over the product: there the pair goes back to
``addmm``, whose bias cuBLAS adds in the matmul's epilogue.

It runs on the prim graph before lowering, after ``pad_mm`` (a padded product is sliced, and is
left alone).
"""
from __future__ import annotations

import operator

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..lowering import EXTERN_OPS, lookup

aten = torch.ops.aten

#: ops that only view their input: the tensor read through them is the same buffer
VIEWS = {aten.view.default, aten._unsafe_view.default, aten.permute.default, aten.slice.Tensor,
         aten.split.Tensor, aten.split_with_sizes.default, aten.unsqueeze.default, aten.squeeze.dim,
         aten.squeeze.dims, aten.expand.default, aten.alias.default, aten.select.int, aten.unbind.int,
         operator.getitem}


def _read_by_library_only(node: fx.Node) -> bool:
    """Whether every reader of ``node``, looking through views, is an extern or fallback kernel or
    the graph's output: no generated kernel loads it, so none could add a bias on the way."""
    for user in node.users:
        if user.op == "output":
            continue
        if user.op != "call_function":
            return False
        if user.target in VIEWS:
            if not _read_by_library_only(user):
                return False
        elif getattr(user.target, "overloadpacket", None) not in EXTERN_OPS and lookup(user.target) is not None:
            return False
    return True


def _bias_of(add: fx.Node, mm: fx.Node) -> fx.Node | None:
    """The other operand of ``add`` if it is a row of the product's width, of the product's dtype."""
    if add.kwargs or len(add.args) != 2:
        return None
    bias = add.args[1] if add.args[0] is mm else add.args[0]
    val, out = bias.meta.get("val") if isinstance(bias, fx.Node) else None, mm.meta.get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(out, torch.Tensor):
        return None
    if val.dim() != 1 or val.dtype != out.dtype or val.device != out.device:
        return None
    if not statically_known_true(val.shape[0] == out.shape[-1]):  # symbolic sizes: no guard is added
        return None
    return bias


def mm_bias_epilogue(gm: fx.GraphModule) -> bool:
    """Rewrite ``add(mm(a, b), bias)`` read only by library kernels as ``addmm(bias, a, b)`` in
    place; True when something changed."""
    changed = False
    for mm in list(gm.graph.nodes):
        if mm.op != "call_function" or mm.target is not aten.mm.default or len(mm.users) != 1:
            continue
        add = next(iter(mm.users))
        if add.op != "call_function" or add.target is not aten.add.Tensor:
            continue
        bias = _bias_of(add, mm)
        if bias is None or not _read_by_library_only(add):
            continue
        with gm.graph.inserting_before(add):
            addmm = gm.graph.call_function(aten.addmm.default, (bias, *mm.args))
        addmm.meta["val"] = add.meta.get("val")
        add.replace_all_uses_with(addmm)
        gm.graph.erase_node(add)
        gm.graph.erase_node(mm)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed
