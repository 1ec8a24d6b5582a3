"""DictVariable: a dict whose values are variables, keyed by constants or by hashable variables.

A key is usually a constant (``"a"``, ``3``, ``torch.float32``), stored as itself. A tensor, a
module or a plain user object is a key too: Python hashes those by identity, so the dict stores a
:class:`HashableKey` that hashes by the same identity at trace time (a tensor's fake value, the
module) and keeps the key's tracker, to give the key back (``keys()``, iteration) and to rebuild it
after the graph. Two keys reached through different sources are distinct objects now; a guard keeps
them so (an aliased call recompiles). A key tinydynamo cannot hash this way is a graph break.

Layer: above lists; it registers ``DictVariable`` for functions (``**kwargs``, base.constructor).
"""
from __future__ import annotations

import copy
from typing import Any

from tinydynamo.exc import Unsupported, raise_observed, unimplemented
from tinydynamo.utils import Identity
from tinydynamo.variables.base import VariableTracker, constructor, register_construction
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.lists import TupleVariable
from tinydynamo.variables.misc import GetAttrVariable


class HashableKey:
    """A dict key (or set element) that is not a constant: hashes and compares as the real key would,
    by the identity of ``vt.key_identity()`` (items of a tuple key compare item by item)."""

    __slots__ = ("vt", "ident")

    def __init__(self, vt: VariableTracker, ident: Any):
        self.vt, self.ident = vt, ident

    def __hash__(self) -> int:
        return hash(self.ident)

    def __eq__(self, other) -> bool:
        return isinstance(other, HashableKey) and self.ident == other.ident

    def __repr__(self) -> str:
        return f"HashableKey({self.vt})"


def dict_key(v: VariableTracker) -> Any:
    """The key ``v`` stands for: its value if it is a constant, else a :class:`HashableKey`."""
    if v.is_python_constant():
        key = v.as_python_constant()
        try:
            hash(key)
        except TypeError:
            raise_observed(TypeError, f"unhashable type: {type(key).__name__!r}")
        return key
    return HashableKey(v, _ident(v))


def _ident(v: VariableTracker) -> Any:
    if isinstance(v, TupleVariable) and v.python_type() is tuple:  # a tuple hashes by its items
        return tuple(("const", dict_key(i)) if i.is_python_constant() else _ident(i) for i in v.items)
    obj = v.key_identity()
    if obj is None:
        unimplemented(f"dict key or set element {v}: tinydynamo cannot hash it at trace time")
    return Identity(obj)


def _leaves(v: VariableTracker) -> list[VariableTracker]:
    """The non-constant parts of a key (a tuple key's items), each hashed by identity."""
    if isinstance(v, TupleVariable) and v.python_type() is tuple:
        return [leaf for i in v.items if not i.is_python_constant() for leaf in _leaves(i)]
    return [v]


def key_variable(key: Any) -> VariableTracker:
    """The variable that a stored key stands for (the inverse of :func:`dict_key`)."""
    return key.vt if isinstance(key, HashableKey) else ConstantVariable(key)


def key_code(codegen, key: Any) -> str:
    """An expression that rebuilds a stored key after the graph."""
    return key.vt.reconstruct(codegen) if isinstance(key, HashableKey) else codegen.constant(key)


def constant_keys(keys) -> bool:
    return not any(isinstance(k, HashableKey) for k in keys)


def guard_distinct_keys(tx, key: Any, keys) -> None:
    """``key`` was told apart from the other ``keys`` by identity at trace time: where two of the
    objects compared came from outside the frame (two sources), guard that they stay distinct
    objects (an aliased call would merge the keys: it recompiles instead)."""
    if not isinstance(key, HashableKey):
        return
    mine = [v for v in _leaves(key.vt) if v.source is not None]
    if not mine:
        return
    for other in keys:
        if not isinstance(other, HashableKey) or other is key:
            continue
        for a in mine:
            for b in _leaves(other.vt):
                if b.source is not None and b.source.name() != a.source.name() \
                        and b.key_identity() is not a.key_identity():
                    tx.output.add_guard("ALIAS_MATCH", a.source, (b.source, False))


class DictVariable(VariableTracker):
    version = 0  # bumped by every in-place change (SideEffects.mutation): a loop over it notices

    def __init__(self, items: dict, source=None):
        super().__init__(source)
        self.items = dict(items)  # key (a constant or a HashableKey) -> VariableTracker

    @classmethod
    def from_pairs(cls, tx, pairs, **extra) -> "DictVariable":
        """A new dict of ``(key variable or stored key, value)`` pairs, in order (a later key wins)."""
        new = cls({}, **extra)
        new.add_pairs(tx, [(k if not isinstance(k, VariableTracker) else dict_key(k), v) for k, v in pairs])
        return new

    def add_pairs(self, tx, pairs) -> None:
        """Store ``(stored key, value)`` pairs (no side-effect journal: see ``call_method``'s update)."""
        for k, v in pairs:
            if k not in self.items:
                guard_distinct_keys(tx, k, self.items)
            self.items[k] = v

    def python_type(self):
        return dict

    def _constant_keys(self) -> dict:
        if not constant_keys(self.items):
            unimplemented(f"{self}: a dict keyed by tensors or objects as a constant or graph argument")
        return self.items

    def as_python_constant(self):
        return {k: v.as_python_constant() for k, v in self._constant_keys().items()}

    def as_node_arg(self):
        return {k: v.as_node_arg() for k, v in self._constant_keys().items()}

    def as_example(self):
        return {k: v.as_example() for k, v in self._constant_keys().items()}

    def var_getattr(self, tx, name: str):
        if callable(getattr(self.python_type(), name, None)):
            return GetAttrVariable(self, name)
        return super().var_getattr(tx, name)

    def truth(self, tx) -> bool:
        return bool(self.items)

    def unpack_var_sequence(self, tx):
        return [key_variable(k) for k in self.items]

    def _key(self, v: VariableTracker):
        return dict_key(v)

    def lookup(self, tx, v: VariableTracker) -> tuple[Any, bool]:
        """(the stored key ``v`` stands for, whether the dict has it); a miss on a key told apart
        from the others by identity guards that they stay distinct."""
        key = dict_key(v)
        found = key in self.items
        if not found:
            guard_distinct_keys(tx, key, self.items)
        return key, found

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__":
            key, found = self.lookup(tx, args[0])
            if not found:
                raise_observed(KeyError, f"dict has no key {key!r}")
            return self.items[key]
        if name == "get":
            key, found = self.lookup(tx, args[0])
            return self.items[key] if found else args[1] if len(args) > 1 else ConstantVariable(None)
        if name == "__contains__":
            return ConstantVariable(self.lookup(tx, args[0])[1])
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name == "copy" and not args and not kwargs:  # a new dict of the same kind (a defaultdict keeps its factory)
            new = copy.copy(self)
            new.items, new.source, new.version = dict(self.items), None, 0
            return new
        if name in ("keys", "values", "items") and not args and not kwargs:
            return DictViewVariable(self, name)
        if name in ("__setitem__", "update", "pop", "setdefault", "clear", "__delitem__", "popitem"):
            if name in ("pop", "__delitem__", "setdefault", "__setitem__"):
                key, found = self.lookup(tx, args[0])
            if name in ("pop", "__delitem__") and not found and len(args) < 2:
                raise_observed(KeyError, f"dict has no key {key!r}")
            if name == "popitem" and not self.items:
                raise_observed(KeyError, "popitem(): dictionary is empty")
            if name == "setdefault" and found:
                return self.items[key]
            pairs = []
            if name == "update":
                if len(args) > 1:
                    unimplemented(f"dict.update with {len(args)} arguments")
                pairs = pairs_of(tx, args[0]) if args else []
            # journal the old contents (rollback at a graph break); a dict from outside the frame
            # (self.source) gets its new contents replayed after the graph (tinydynamo.side_effects)
            tx.output.side_effects.mutation(self)
            if name == "__delitem__":
                del self.items[key]
                return ConstantVariable(None)
            if name == "__setitem__":
                self.items[key] = args[1]
            elif name == "update":
                self.add_pairs(tx, pairs)
                self.items.update(kwargs)
            elif name == "pop":
                return self.items.pop(key, *(args[1:2]))
            elif name == "popitem":
                k, v = self.items.popitem()
                return TupleVariable([key_variable(k), v])
            elif name == "setdefault":
                return self.items.setdefault(key, args[1] if len(args) > 1 else ConstantVariable(None))
            else:
                self.items.clear()
            return ConstantVariable(None)
        unimplemented(f"dict.{name}")

    def literal(self, codegen) -> str:
        """A dict display ``{k: v, ...}`` of the current items (subclasses pass it to their class)."""
        return "{" + ", ".join(f"{key_code(codegen, k)}: {v.reconstruct(codegen)}" for k, v in self.items.items()) + "}"

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source_expr(self.source)
        return codegen.shared(self, lambda: self.literal(codegen))

    def __repr__(self) -> str:
        return f"DictVariable({list(self.items)})"


class DictViewVariable(VariableTracker):
    """``d.keys()`` / ``d.values()`` / ``d.items()``: a live view of the dict, as in Python (a key added
    after the view was taken is in it), not a copy; its type is the view type, not ``list``."""

    def __init__(self, dict_var: DictVariable, kind: str):
        super().__init__(None)
        self.dict_var, self.kind = dict_var, kind

    def python_type(self):
        return type(getattr({}, self.kind)())

    def as_python_constant(self):
        if self.kind != "keys":  # values/items views compare by identity: not foldable as a copy
            return super().as_python_constant()
        return dict.fromkeys(self.dict_var._constant_keys()).keys()

    def unpack_var_sequence(self, tx):
        items = self.dict_var.items
        if self.kind == "keys":
            return [key_variable(k) for k in items]
        if self.kind == "values":
            return list(items.values())
        return [TupleVariable([key_variable(k), v]) for k, v in items.items()]

    def truth(self, tx) -> bool:
        return bool(self.dict_var.items)

    def var_getattr(self, tx, name: str):
        if name == "mapping":
            unimplemented("dict view .mapping (a read-only proxy)")
        if callable(getattr(self.python_type(), name, None)):
            return GetAttrVariable(self, name)
        return super().var_getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__" and not args:
            return ConstantVariable(len(self.dict_var.items))
        if name == "__contains__" and self.kind == "keys":
            return self.dict_var.call_method(tx, "__contains__", args, kwargs)
        if name == "__iter__" and not args:
            return constructor("BuiltinVariable")(iter).call_function(tx, [self], {})
        unimplemented(f"dict_{self.kind}.{name}")

    def reconstruct(self, codegen) -> str:
        return f"{self.dict_var.reconstruct(codegen)}.{self.kind}()"

    def __repr__(self) -> str:
        return f"DictViewVariable({self.kind}, {self.dict_var})"


def _type_or_none(v: VariableTracker):
    try:
        return v.python_type()
    except Unsupported:
        return None


def pairs_of(tx, v: VariableTracker) -> list[tuple[Any, VariableTracker]]:
    """(key, value) pairs of what ``dict(v)`` / ``d.update(v)`` take: a dict, a mapping (an object with
    ``keys()``, read through ``keys()`` and ``[]`` as Python does), or an iterable of pairs."""
    if isinstance(v, DictVariable):
        return list(v.items.items())
    if not isinstance(v, DictViewVariable) and hasattr(_type_or_none(v), "keys"):
        keys = v.var_getattr(tx, "keys").call_function(tx, [], {})
        return [(dict_key(k), v.call_method(tx, "__getitem__", [k], {})) for k in keys.unpack_var_sequence(tx)]
    pairs = []
    for pair in v.unpack_var_sequence(tx):
        kv = pair.unpack_var_sequence(tx)
        if len(kv) != 2:
            raise_observed(ValueError, f"dictionary update sequence element has length {len(kv)}; 2 is required")
        pairs.append((dict_key(kv[0]), kv[1]))
    return pairs


register_construction(DictVariable=DictVariable)
