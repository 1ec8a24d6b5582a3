"""Record the ATen ops run on fake tensors as FX nodes: ``make_fx``'s job for static shapes, leaner.

``make_fx`` wraps every traced value in a proxy tensor and, per op, flattens its arguments with
pytree, looks each one's proxy up, snapshots the fake output, extracts a ``TensorMetadata``, and
keeps size expressions (``SymInt``) in the graph. With static shapes most of that is not needed.
:class:`OpRecorder` is a dispatch mode that sits above the fake mode: each op runs on the fake
tensors as it would, and one node is appended to the graph, its arguments found by the identity
of the tensors that were passed. It costs about a third of ``make_fx`` per op, and a first call
of a large model spends seconds tracing: decompose() records each static graph with it (BART's
training graph, 24 layers: 2,753 prims) and so does the joint graph's backward walk (4,400 ops).
Like ``make_fx`` it decomposes by a table, runs the composites autograd would have run, records
``torch.tensor`` constants as ``lift_fresh_copy`` and notes in each node's ``meta["original_aten"]``
the op it was decomposed from.

Sizes must be plain ints: a symbolic size is an expression over the inputs that the graph must
compute, which is what ``make_fx``'s ``SymInt`` tracking is for (:func:`has_symbolic_sizes` says
which one to use). A real tensor that no node produced (a constant) becomes a ``get_attr`` node,
its value kept in :attr:`OpRecorder.constants`.
"""
from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.fx.experimental.symbolic_shapes import has_free_symbols
from torch.utils._python_dispatch import TorchDispatchMode, autograd_would_have_decomposed

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
_SIZE_QUERIES = {torch.ops.aten.size.default, torch.ops.aten.stride.default,
                 torch.ops.aten.storage_offset.default}


def has_symbolic_sizes(values) -> bool:
    """Whether any of ``values`` (tensors, numbers, nested in tuples and lists; anything else is
    skipped) is or holds a symbolic size (torch's ``has_free_symbols``, which takes only those)."""
    for value in values:
        if isinstance(value, (torch.Tensor, *_SYMBOLIC)):
            if has_free_symbols(value):
                return True
        elif isinstance(value, (tuple, list)) and has_symbolic_sizes(value):
            return True
    return False


class OpRecorder(TorchDispatchMode):
    """Append each ATen op that reaches it to ``graph``; enter it inside the fake mode.

    :meth:`bind` says which node a tensor is (the graph's inputs, values already in it); every
    op's outputs are bound to the new node (a multi-output op's to ``getitem`` nodes). An op in
    ``decompositions`` runs its decomposition instead, whose ops are recorded; so does a
    composite op that autograd would have decomposed, as in ``make_fx``.
    """

    def __init__(self, graph: fx.Graph, decompositions: Mapping[Any, Callable] | None = None,
                 constants: dict[str, torch.Tensor] | None = None):
        super().__init__()
        self.graph = graph
        self.decompositions = decompositions or {}
        #: the ``get_attr`` targets of ``graph`` and their values (new constants get names not in it)
        self.constants: dict[str, torch.Tensor] = {} if constants is None else constants
        self._nodes: dict[int, fx.Node] = {}   # id(tensor) -> its node
        self._alive: list[torch.Tensor] = []   # the bound tensors, kept so their ids stay theirs
        self._original = None                  # the op that reached the recorder, while it decomposes

    def bind(self, value, node: fx.Node) -> None:
        """``value`` (a tensor) is what ``node`` computes."""
        if isinstance(value, torch.Tensor):
            self._nodes[id(value)] = node
            self._alive.append(value)

    def node(self, value):
        """The graph argument for ``value``: its node, a new ``get_attr`` for a real constant, or the value."""
        if isinstance(value, torch.Tensor):
            node = self._nodes.get(id(value))
            if node is None:
                node = self._constant(value)
            return node
        if isinstance(value, (list, tuple)):
            return type(value)(self.node(v) for v in value)
        if isinstance(value, _SYMBOLIC):
            raise NotImplementedError(f"OpRecorder records static shapes only, got the size {value}: "
                                      "trace graphs with symbolic sizes with make_fx")
        return value

    def _constant(self, value: torch.Tensor) -> fx.Node:
        if isinstance(value, torch._subclasses.FakeTensor):
            raise RuntimeError("OpRecorder: a fake tensor that no recorded op produced reached an op "
                               "(bind the graph's inputs before running it)")
        prefix = "_param_constant" if isinstance(value, torch.nn.Parameter) else "_tensor_constant"  # as make_fx
        k = 0
        while f"{prefix}{k}" in self.constants:
            k += 1
        name = f"{prefix}{k}"
        self.constants[name] = value
        node = self.graph.get_attr(name)
        node.meta["val"] = value
        self.bind(value, node)
        return node

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.prim.device.default:  # a query, not an op of the graph
            return func(*args, **kwargs)
        if self._original is not None:
            return self._record(func, args, kwargs)
        self._original = func  # each node's meta["original_aten"]: the op it was decomposed from
        try:
            return self._record(func, args, kwargs)
        finally:
            self._original = None

    def _record(self, func, args, kwargs):
        decomposition = self.decompositions.get(func)
        if decomposition is not None:
            with self:
                out = decomposition(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if func not in _SIZE_QUERIES and autograd_would_have_decomposed(func, pytree.tree_leaves((args, kwargs))):
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if func is torch.ops.aten.lift_fresh.default:  # torch.tensor(...): a copy of the constant, as make_fx
            func = torch.ops.aten.lift_fresh_copy.default
        out = func(*args, **kwargs)
        node = self.graph.create_node("call_function", func, self.node(args),
                                      {k: self.node(v) for k, v in kwargs.items()},
                                      name=func.overloadpacket.__name__)
        node.meta["val"] = out
        node.meta["original_aten"] = self._original
        if isinstance(out, (tuple, list)):
            for i, element in enumerate(out):
                if isinstance(element, torch.Tensor):
                    item = self.graph.call_function(operator.getitem, (node, i))
                    item.meta["val"] = element
                    self.bind(element, item)
        else:
            self.bind(out, node)
        return out
