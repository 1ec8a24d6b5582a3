"""Matmul operands padded to aligned sizes (``config.shape_padding``; TorchInductor's ``pad_mm``).

Library matmul kernels are fastest when every leading dimension is a multiple of 16 bytes: an odd
size (GPT-2's 50257-token LM head) makes cuBLAS fall back to kernels without vectorised loads and
stores, several times slower. Padding with zeros changes nothing in the product: zeros along the
reduced dim ``K`` add nothing, and extra rows/columns (``M``, ``N``) are sliced off the result
(the slice is a view; a pointwise consumer reads through it, a graph output is copied out with
eager's strides).

It runs on the prim graph before lowering, on ``mm`` and ``bmm`` (``addmm`` is ``mm`` + ``add``
by then). By default only where it pays: on CUDA, in half precision, for a matmul big enough that
the padding copies are small next to it and each dim grows by at most ``pad_mm_max_growth``.
``config.force_shape_padding`` pads every unaligned matmul (tests; CPU).
"""
from __future__ import annotations

import torch
from torch import fx

from .. import config

aten = torch.ops.aten

#: elements per 16 bytes
_ALIGN = {torch.float16: 8, torch.bfloat16: 8, torch.float32: 4}
#: below this many multiply-adds a matmul is not worth two padding copies
MIN_FLOPS = 2 ** 27


def _aligned(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _worth_it(sizes: dict[str, int], padded: dict[str, int], dtype, device) -> bool:
    if config.force_shape_padding:
        return True
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    m, k, n = sizes["m"], sizes["k"], sizes["n"]
    if m * k * n * sizes.get("b", 1) < MIN_FLOPS:
        return False
    return all(padded[d] <= sizes[d] * (1 + config.pad_mm_max_growth) for d in padded)


def _fake(node: fx.Node):
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) else None


def _call(graph: fx.Graph, target, args, val):
    """A new node with its example value (``val``: the op run on the fake example values)."""
    node = graph.call_function(target, args)
    node.meta["val"] = val
    return node


def _pad(graph: fx.Graph, node: fx.Node, fake: torch.Tensor, rows: int, cols: int) -> fx.Node:
    """``node`` (a matrix, or a batch of them) with ``rows`` zero rows and ``cols`` zero columns
    added. A transposed operand (a linear layer's ``weight.t()``) is padded in its own memory
    order and transposed back, so the copy reads and writes rows, not columns."""
    if fake.dim() >= 2 and fake.stride(-2) == 1 and fake.stride(-1) != 1:
        order = list(range(fake.dim() - 2)) + [fake.dim() - 1, fake.dim() - 2]
        t = _call(graph, aten.permute.default, (node, order), fake.permute(order))
        p = _call(graph, aten.constant_pad_nd.default, (t, [0, rows, 0, cols]),
                  torch.constant_pad_nd(t.meta["val"], [0, rows, 0, cols]))
        return _call(graph, aten.permute.default, (p, order), p.meta["val"].permute(order))
    return _call(graph, aten.constant_pad_nd.default, (node, [0, cols, 0, rows]),
                 torch.constant_pad_nd(fake, [0, cols, 0, rows]))


def pad_mm(gm: fx.GraphModule) -> bool:
    """Pad the unaligned ``mm``/``bmm`` of ``gm`` in place; True when something changed."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.bmm.default):
            continue
        a, b = node.args
        fa, fb, out = _fake(a), _fake(b), _fake(node)
        if fa is None or fb is None or out is None or fa.dtype not in _ALIGN:
            continue
        sizes_ = [*fa.shape, fb.shape[-1]]
        if not all(isinstance(s, int) for s in sizes_):  # symbolic sizes: left alone
            continue
        batched = node.target is aten.bmm.default
        m, k, n = fa.shape[-2], fa.shape[-1], fb.shape[-1]
        align = _ALIGN[fa.dtype]
        sizes = {"m": m, "k": k, "n": n, **({"b": fa.shape[0]} if batched else {})}
        padded = {d: _aligned(sizes[d], align) for d in ("m", "k", "n") if sizes[d] % align and sizes[d] > 1}
        if not padded or not _worth_it(sizes, padded, fa.dtype, fa.device):
            continue
        pm, pk, pn = (padded.get(d, sizes[d]) - sizes[d] for d in ("m", "k", "n"))
        graph = gm.graph
        with graph.inserting_before(node):
            if pk or pm:
                a = _pad(graph, a, fa, pm, pk)
            if pk or pn:
                b = _pad(graph, b, fb, pk, pn)
            fa2, fb2 = _fake(a), _fake(b)
            mm = _call(graph, node.target, (a, b), node.target(fa2, fb2))
            result, fr = mm, mm.meta["val"]
            for dim, (extra, length) in ((-2, (pm, m)), (-1, (pn, n))):
                if extra:
                    result = _call(graph, aten.slice.Tensor, (result, fr.dim() + dim, 0, length),
                                   aten.slice.Tensor(fr, fr.dim() + dim, 0, length))
                    fr = result.meta["val"]
        if result is not mm:  # read as the unpadded product was (a graph output keeps eager's strides)
            result.meta["val"] = out
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed
