"""Decompose a captured FX graph (torch-level ops) into the prim set (see prims.py).

PLACEHOLDER so the layers below can be built in parallel: it traces with make_fx and torch's
own core-ATen table. The AOT autograd work replaces the table with our own decompositions.
Contract: ``decompose(gm, example_inputs) -> fx.GraphModule`` whose call_function targets
are ATen OpOverloads (prims where possible), with the same calling convention as ``gm``.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx


def decompose(gm: torch.fx.GraphModule, example_inputs) -> torch.fx.GraphModule:
    from torch._decomp import core_aten_decompositions

    return make_fx(gm, decomposition_table=core_aten_decompositions())(*example_inputs)
