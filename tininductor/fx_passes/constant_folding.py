"""Constant folding of input-independent subgraphs (``config.constant_folding``, on by default).

A part of a graph that reads no graph input computes the same value in every call: Swin
Transformer's shifted-window attention mask, built from ``x.new_zeros((H, W))`` and nine
``mask[h, w] = count`` stores, is such a part (its sizes come from the input's shape, which the
guards fix, not from its data). Run as kernels it costs, in every call, a fill and two
``slice_scatter`` copies per store, each a launch (and host time) of its own. Folded, it is one
tensor computed here, at compile time, and passed to the compiled code like a parameter.

Which nodes fold: every pure, deterministic op whose inputs are all constant (``get_attr``
tensors, or other such ops); a placeholder (a tensor, or a size symbol of dynamic shapes) is never
constant, nor is a random op or one that writes to an argument. Only the *frontier* is stored:
the constant nodes that a non-constant node (or the output) reads. A frontier is left in the graph
when folding would only store what a kernel computes for free (a chain of factories and views,
``torch.ones(n).expand(...)``, reads no constant tensor) or costs more memory than
``config.constant_folding_max_bytes``.

Unlike freezing (fx_passes/freezing.py) nothing here reads a parameter: parameters are graph
inputs, so the compiled code still follows later changes to the weights. TorchInductor folds the
same kind of subgraph in its joint-graph passes (``constant_fold_uniform_value``) and, under
freezing, everything that depends only on parameters.
"""
from __future__ import annotations

import logging
import operator

import torch
from torch import fx

from .. import config

log = logging.getLogger(__name__)


def _pure(node: fx.Node) -> bool:
    """An op whose value depends only on its arguments and that changes none of them."""
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return not (target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags
                or torch.Tag.nondeterministic_bitwise in target.tags or "out" in node.kwargs)


def _is_view(node: fx.Node) -> bool:
    return node.target is operator.getitem or getattr(node.target, "is_view", False)


def constant_nodes(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes whose value reads no graph input: ``get_attr`` and pure ops over such nodes."""
    const: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr" or (_pure(node) and all(n in const for n in node.all_input_nodes)):
            const.add(node)
    return const


def _cone(node: fx.Node, const: set[fx.Node]) -> list[fx.Node]:
    """The constant nodes ``node``'s value is computed from (itself included)."""
    seen, stack = {node}, [node]
    while stack:
        for n in stack.pop().all_input_nodes:
            if n in const and n not in seen:
                seen.add(n)
                stack.append(n)
    return list(seen)


def _worth_folding(node: fx.Node, const: set[fx.Node]) -> bool:
    """Folding pays when the value is computed from a constant tensor by at least one op that is
    not a view (a mask built by stores into a buffer), not from factories alone."""
    cone = _cone(node, const)
    reads_constant = any(n.op == "get_attr" for n in cone)
    computes = any(n.op == "call_function" and not _is_view(n) for n in cone)
    return reads_constant and computes


def fold_input_independent(gm: fx.GraphModule, max_bytes: int | None = None) -> int:
    """Replace each frontier of the input-independent part of ``gm`` by a ``get_attr`` constant holding
    its value, computed now (then dead code goes). Returns how many nodes were folded."""
    max_bytes = config.constant_folding_max_bytes if max_bytes is None else max_bytes
    const = constant_nodes(gm)
    frontier = [n for n in gm.graph.nodes if n in const and n.op == "call_function"
                and any(u not in const for u in n.users) and _worth_folding(n, const)]
    if not frontier:
        return 0
    needed: set[fx.Node] = set()
    for node in frontier:
        needed.update(_cone(node, const))
    env: dict[fx.Node, object] = {}
    folded = 0
    with torch.no_grad():
        for node in gm.graph.nodes:
            if node not in needed:
                continue
            if node.op == "get_attr":
                env[node] = _fetch(gm, node.target)
                continue
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            try:
                env[node] = node.target(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - the nodes stay, the compiled graph computes them
                log.debug("not folding past %s: %s", node, e)
                return folded
    for node in frontier:
        value = env[node]
        if not isinstance(value, torch.Tensor) or value.numel() * value.element_size() > max_bytes:
            continue
        value = value.clone()  # its own memory, not a view of a bigger temporary
        if value.stride() != env[node].stride():
            continue  # overlapping (an expand): the graph's strides cannot be kept in compact memory
        name = _free_name(gm, "_folded_constant")
        gm.register_buffer(name, value)
        with gm.graph.inserting_before(node):
            attr = gm.graph.get_attr(name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        folded += 1
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return folded


def _fetch(gm: fx.GraphModule, target: str):
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _free_name(gm: fx.GraphModule, hint: str) -> str:
    name, k = hint, 0
    while hasattr(gm, name):
        k += 1
        name = f"{hint}{k}"
    return name
