"""The prim set: the small, documented set of ATen ops that every graph is decomposed to.

AOT autograd differentiates these (one VJP rule each) and the lowering turns them into loop
IR (one lowering each). Anything outside the set is run by torch as a fallback kernel, with
the reason logged. Extern ops (matmul, conv) stay calls into torch's libraries on purpose.

This list is the contract between decompositions.py, aot_autograd.py and lowering.py; it may
grow, but every op added needs a decomposition test, a VJP rule and a lowering (or an
explicit fallback). Keep it small: anything that can be written with these ops is a
decomposition instead (``embedding`` is ``index``, ``gelu`` is ``erf`` and ``mul``, ...).

Overloads the course models produce (forward and backward graphs of the TinyBlock and the
GPT, after AOT autograd), i.e. what a lowering sees in practice::

    add.Tensor sub.Tensor mul.Tensor div.Tensor neg exp log erf tanh rsqrt
    eq.Tensor ne.Scalar logical_not where.self prims.convert_element_type clone alias detach
    view expand permute unsqueeze squeeze.dims slice.Tensor
    sum.default sum.dim_IntList mean.dim var.correction amax
    full scalar_tensor arange.start arange.start_step
    index.Tensor index_put (accumulate=True, embedding backward) gather scatter_add (cross-entropy)
    mm bmm

Scalars stay Python numbers in the ``.Tensor`` overloads (``mul.Tensor(x, 0.5)``).
"""
from __future__ import annotations

import torch

from .ops_table import OP_TABLE

aten = torch.ops.aten
prims = torch.ops.prims

#: the aten ops the op table (ops_table.py) lowers to one op each, plus those with a
#: hand-written lowering in lowering.py (alpha, rounding_mode, special exponents, bool casts)
_TABLE = [(op.arity, getattr(aten, t)) for op in OP_TABLE for t in op.aten]
POINTWISE_UNARY = [t for arity, t in _TABLE if arity == 1] + [aten.logical_not]
POINTWISE_BINARY = [t for arity, t in _TABLE if arity == 2] + [
    aten.add, aten.sub, aten.div, aten.pow, aten.logical_and, aten.logical_or,
]
# cat: a where-chain over its inputs; constant_pad_nd: a where between the input and the value
POINTWISE_OTHER = [aten.where, prims.convert_element_type, aten.clone, aten.cat, aten.constant_pad_nd]
VIEWS = [aten.view, aten.expand, aten.permute, aten.unsqueeze, aten.squeeze, aten.slice,
         aten.select, aten.alias, aten.detach]  # detach: an alias that stops gradients
REDUCTIONS = [aten.sum, aten.amax, aten.amin, aten.mean, aten.var]
CREATION = [aten.full, aten.scalar_tensor, aten.arange, aten.empty]
INDEXING = [aten.index, aten.index_put, aten.gather, aten.scatter_add]
EXTERN = [aten.mm, aten.bmm, aten.convolution]

PRIM_SET = frozenset(
    POINTWISE_UNARY + POINTWISE_BINARY + POINTWISE_OTHER + VIEWS + REDUCTIONS + CREATION
    + INDEXING + EXTERN
)


def is_prim(target) -> bool:
    """True when an FX node target (an OpOverload or OpOverloadPacket) belongs to the prim set."""
    packet = getattr(target, "overloadpacket", target)
    return packet in PRIM_SET
