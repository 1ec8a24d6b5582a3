"""The op tables of tininductor: decompositions, lowerings and VJP rules, with one keying rule.

An :class:`OpRegistry` maps an ATen op to the Python function that handles it. An entry is keyed
by what it was registered for: an ``OpOverloadPacket`` (``aten.add``: every overload) or one
``OpOverload`` (``aten.add.Tensor``). A lookup tries the exact overload first, then its packet,
so an overload's own entry wins over its packet's. The same rule reads a plain dict
(:func:`lookup`), which is how a learner's ``{**DECOMPOSITIONS, op: yours}`` table is read.

PyTorch keeps the same three tables (``torch._decomp.decomposition_table``, inductor's
``lowering.lowerings``, the derivative formulas) but expands a packet into its overloads when
registering (``torch._decomp._add_op_to_registry``, inductor's ``get_overloads``). Resolving the
packet at lookup instead keeps a table short and lets one swap of a packet's entry reach every
overload; :meth:`OpRegistry.overload_table` gives ``make_fx`` the expanded, overload-keyed dict
it wants. Entries are swapped for a while with :meth:`OpRegistry.swap` (tinydynamo's
:func:`~tinydynamo.registry.swap`, the one mechanism every registry of both packages uses).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from tinydynamo.registry import swap

__all__ = ["OpRegistry", "lookup", "overload_table", "swap"]

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket


def lookup(table: Mapping, target, default: Any = None) -> Any:
    """``table``'s entry for ``target``: the exact key, else ``target``'s packet, else ``default``."""
    if dict.__contains__(table, target) if isinstance(table, dict) else target in table:
        return table[target]
    packet = getattr(target, "overloadpacket", None)
    if packet is not None and (dict.__contains__(table, packet) if isinstance(table, dict) else packet in table):
        return table[packet]
    return default


def overload_table(table: Mapping) -> dict:
    """``table`` with every packet key expanded into its overloads (an overload's own entry wins):
    the ``decomposition_table`` that ``make_fx`` looks ops up in, by overload only."""
    out = {}
    for key, fn in table.items():
        if isinstance(key, OpOverloadPacket):
            for name in key.overloads():
                out.setdefault(getattr(key, name), fn)
    for key, fn in table.items():
        if not isinstance(key, OpOverloadPacket):
            out[key] = fn
    return out


class OpRegistry(dict):
    """op (``OpOverload`` or ``OpOverloadPacket``) -> function, read with the keying rule above.

    ``registry[op]``, ``op in registry`` and ``registry.get(op)`` follow the rule; iteration and
    ``{**registry}`` give the keys as registered.
    """

    def __init__(self, name: str = "op registry"):
        super().__init__()
        self.name = name

    def register(self, *ops) -> Callable[[Callable], Callable]:
        """Decorator: ``fn`` handles each of ``ops`` (a packet: all of its overloads)."""
        for op in ops:
            if not isinstance(op, (OpOverload, OpOverloadPacket)):
                raise TypeError(f"{self.name}: cannot register {op!r}: pass an ATen op such as "
                                f"torch.ops.aten.add (every overload) or torch.ops.aten.add.Tensor")

        def wrap(fn: Callable) -> Callable:
            for op in ops:
                self[op] = fn
            return fn

        return wrap

    def lookup(self, target, default: Any = None) -> Any:
        return lookup(self, target, default)

    def __missing__(self, target):
        packet = getattr(target, "overloadpacket", None)
        if packet is not None and dict.__contains__(self, packet):
            return dict.__getitem__(self, packet)
        raise KeyError(target)

    def __contains__(self, target) -> bool:
        return lookup(self, target, _NONE) is not _NONE

    def get(self, target, default: Any = None) -> Any:
        return lookup(self, target, default)

    def overload_table(self) -> dict:
        return overload_table(self)

    def swap(self, entries: Mapping) -> Any:
        """``with registry.swap({op: fn}):`` the entries stand in for the block (see tinydynamo.registry)."""
        return swap(self, entries)


_NONE = object()
