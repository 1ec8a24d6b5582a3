"""The graph cache: a graph compiled once is not compiled again for another module of the same form.

A model's repeated blocks often reach the backend as separate graphs: a graph break inside the
loop over the layers (transformers' LayerDrop draws ``torch.rand([])`` and branches on it in
training) gives one graph per layer, each pinned to its own block. The graphs differ only in
*which* parameters they read, and AOT autograd lifts those to inputs: after that, the traced
joint graph, its partition and the generated kernels of every layer are the same. So the
compiled core (:class:`CachedGraph`: the forward/backward runtime or the inference callable, and
what was learnt about aliasing) is kept under a key of everything the compile depends on, and a
block of the same form binds its own parameters to it. TorchInductor does the same with its
``AOTAutogradCache`` and ``FxGraphCache`` (on disk too); TorchDynamo's ``inline_inbuilt_nn_modules``
reaches one graph for all blocks by not pinning them at all.

The key (:func:`graph_key`) is built from

* the graph's structure: every node's op, target and arguments, with nodes named by position,
  parameters and buffers named by their place in the lifted inputs, and any other attribute the
  graph reads (a constant tensor, a submodule) by its identity: a graph that reads one only
  matches itself;
* every input's metadata (type, shape, strides, offset, dtype, device, requires_grad, view or
  leaf, and which inputs share storage), and which inputs are module state;
* the global state a compile reads (grad mode, autocast, default dtype, deterministic
  algorithms, the oneDNN/cuDNN/TF32 switches), the compilers and partitioner, every tininductor option, and the generation of
  the registries (``tinydynamo.registry.swap``: a learner's decomposition, lowering or VJP rule
  swapped in is never served a graph compiled with another).

``tinydynamo.reset()`` empties it. An entry keeps no module or parameter alive, but its key holds
the constant attributes it names by identity (a constant tensor, a submodule) until the entry is
evicted (the cache keeps the most recent ``capacity`` graphs) or the cache is emptied.

A graph that cannot be keyed (a symbolic size, a tensor subclass) is not cached, and neither
is a compile under CUDA graphs (a recorded graph holds the addresses of one block's parameters)
or freezing (the parameters become constants). ``TINY_GRAPH_CACHE=0`` turns it off.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import operator
from typing import Any, Callable, Hashable

import torch
import torch.fx as fx

from tininductor import config
from tinydynamo import registry
from tinydynamo.eval_frame import reset_hooks
from tinydynamo.utils import Identity


class Uncacheable(Exception):
    """This graph has no key (the message says why)."""


_PLAIN = (int, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _constant(value: Any, nodes: dict) -> Hashable:
    """A node argument as a key part: nodes by position, constants by type and value."""
    if isinstance(value, fx.Node):
        return ("node", nodes[value])
    if isinstance(value, float):
        return (float, repr(value))  # -0.0 and nan compare by their spelling
    if isinstance(value, _PLAIN):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_constant(v, nodes) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, _constant(v, nodes)) for k, v in value.items()))
    if isinstance(value, slice):
        return (slice, _constant(value.start, nodes), _constant(value.stop, nodes), _constant(value.step, nodes))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Uncacheable("a symbolic size in the graph")
    return Identity(value)  # an op overload, a function, any other object: itself


def _target(node: fx.Node, gm: fx.GraphModule, state_index: dict[str, int]) -> Hashable:
    """A parameter or buffer by its place among the lifted inputs; another attribute, a submodule or
    a function by identity; a method by name (a placeholder's own name does not matter)."""
    if node.op == "get_attr":
        if node.target in state_index:
            return ("state", state_index[node.target])
        return Identity(operator.attrgetter(node.target)(gm))
    if node.op == "call_module":
        return Identity(gm.get_submodule(node.target))
    if node.op == "call_function":
        return Identity(node.target)
    return node.target if node.op == "call_method" else None


def _tensor(x: torch.Tensor, storages: dict) -> Hashable:
    if type(x) not in (torch.Tensor, torch.nn.Parameter, torch._subclasses.FakeTensor) or x.is_sparse \
            or x.layout != torch.strided:
        raise Uncacheable(f"a {type(x).__name__} input")
    try:
        storage = x.untyped_storage()
        where = (storage.device, storage.data_ptr()) if storage.data_ptr() else id(storage)
    except (RuntimeError, NotImplementedError):
        raise Uncacheable("an input without a storage") from None
    shared = storages.setdefault(where, len(storages))  # which inputs alias which
    return (tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, x.device, x.requires_grad, x.is_leaf,
            x._is_view(), x.is_conj(), x.is_neg(), x.is_inference(), shared)


def _input(x: Any, storages: dict) -> Hashable:
    if isinstance(x, torch.Tensor):
        return _tensor(x, storages)
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Uncacheable("a symbolic input")
    return _constant(x, {})


def _compiler(fn: Callable | None) -> Hashable:
    """A compiler by what it does: a partial by its function and arguments (compile_fx makes new ones)."""
    if isinstance(fn, functools.partial):
        return (_compiler(fn.func), tuple(_constant(a, {}) for a in fn.args),
                tuple(sorted((k, _constant(v, {})) for k, v in fn.keywords.items())))
    return Identity(fn)


def _global_state() -> Hashable:
    """What a compile reads besides the graph: grad mode, autocast, the default dtype, and the backend
    switches that decide layouts and matmul precision (oneDNN on: channels-last convolutions)."""
    return (torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda"),
            torch.get_autocast_dtype("cpu"), torch.get_autocast_dtype("cuda"), torch.get_default_dtype(),
            torch.are_deterministic_algorithms_enabled(), torch.backends.mkldnn.enabled,
            torch.backends.cudnn.enabled, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
            torch.get_float32_matmul_precision())


def graph_key(gm: torch.nn.Module, state_names: list[str], state: list, example_inputs,
              compilers: tuple) -> Hashable:
    """The key of compiling ``gm`` (see the module docstring); raises :class:`Uncacheable`."""
    if config.freezing or config.triton.cudagraphs or any(
            isinstance(c, functools.partial) and c.keywords.get("cudagraphs") for c in compilers):
        raise Uncacheable("CUDA graphs and freezing compile for one module's parameters")
    if not isinstance(gm, fx.GraphModule):
        raise Uncacheable(f"a {type(gm).__name__}, not a GraphModule")
    state_index = {name: i for i, name in enumerate(state_names)}
    nodes: dict[fx.Node, int] = {}
    structure = []
    for i, node in enumerate(gm.graph.nodes):
        nodes[node] = i
        # of the metadata, AOT autograd reads whether a node computes a tensor (a no-grad region's
        # outputs are detached) and which placeholders are module state
        structure.append((node.op, _target(node, gm, state_index), _constant(node.args, nodes),
                          _constant(node.kwargs, nodes), isinstance(node.meta.get("example_value"), torch.Tensor),
                          bool(node.meta.get("module_state")) if node.op == "placeholder" else None))
    storages: dict = {}
    inputs = tuple(_input(x, storages) for x in [*state, *example_inputs])
    return (tuple(structure), inputs, _global_state(), tuple(_compiler(c) for c in compilers), config.snapshot(),
            registry.generation)


@dataclasses.dataclass
class CachedGraph:
    """A compiled graph without the module it was compiled for: ``bind(gm, owners)`` makes the callable."""

    bind: Callable[[torch.nn.Module, list], Callable]


class GraphCache:
    """Key -> :class:`CachedGraph`, the most recent ``capacity`` entries, with hit/miss counts."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self.stats = collections.Counter()

    def lookup(self, key: Hashable) -> CachedGraph | None:
        entry = self._entries.get(key)
        self.stats["hit" if entry is not None else "miss"] += 1
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def store(self, key: Hashable, entry: CachedGraph) -> None:
        self._entries[key] = entry
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
        self.stats.clear()

    def __len__(self) -> int:
        return len(self._entries)


#: the process's graph cache
cache = GraphCache()
reset_hooks.append(cache.clear)  # tinydynamo.reset() forgets compiled graphs too
