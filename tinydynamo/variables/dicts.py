"""DictVariable: a dict with constant keys whose values are variables.

Layer: above lists; it registers ``DictVariable`` for functions (``**kwargs``, base.constructor).
"""
from __future__ import annotations

import copy

from tinydynamo.exc import raise_folded, unimplemented
from tinydynamo.variables.base import VariableTracker, constructor, register_construction
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.lists import TupleVariable
from tinydynamo.variables.misc import GetAttrVariable


class DictVariable(VariableTracker):
    version = 0  # bumped by every in-place change (SideEffects.mutation): a loop over it notices

    def __init__(self, items: dict, source=None):
        super().__init__(source)
        self.items = dict(items)  # constant key -> VariableTracker

    def python_type(self):
        return dict

    def as_python_constant(self):
        return {k: v.as_python_constant() for k, v in self.items.items()}

    def as_node_arg(self):
        return {k: v.as_node_arg() for k, v in self.items.items()}

    def as_example(self):
        return {k: v.as_example() for k, v in self.items.items()}

    def var_getattr(self, tx, name: str):
        if callable(getattr(self.python_type(), name, None)):
            return GetAttrVariable(self, name)  # a method: calling it goes to call_method
        return super().var_getattr(tx, name)

    def truth(self, tx) -> bool:
        return bool(self.items)

    def unpack_var_sequence(self, tx):
        return [ConstantVariable(k) for k in self.items]

    def _key(self, v: VariableTracker):
        if not v.is_python_constant():
            unimplemented(f"dict key {v} is not a constant")
        return v.as_python_constant()

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__":
            key = self._key(args[0])
            if key not in self.items:
                raise_folded(KeyError(key), "dict[key]")
            return self.items[key]
        if name == "get":
            return self.items.get(self._key(args[0]), args[1] if len(args) > 1 else ConstantVariable(None))
        if name == "__contains__":
            return ConstantVariable(self._key(args[0]) in self.items)
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name == "copy" and not args and not kwargs:  # a new dict of the same kind (a defaultdict keeps its factory)
            new = copy.copy(self)
            new.items, new.source, new.version = dict(self.items), None, 0
            return new
        if name in ("keys", "values", "items") and not args and not kwargs:
            return DictViewVariable(self, name)
        if name in ("__setitem__", "update", "pop", "setdefault", "clear", "__delitem__"):
            if name in ("pop", "__delitem__") and self._key(args[0]) not in self.items and len(args) < 2:
                raise_folded(KeyError(self._key(args[0])), f"dict.{name}")  # the traced code's own KeyError
            if name == "update" and args and not isinstance(args[0], DictVariable):
                unimplemented(f"dict.update with {args[0]}")
            if name == "setdefault" and self._key(args[0]) in self.items:
                return self.items[self._key(args[0])]
            # journal the old contents (rollback at a graph break); a dict from outside the frame
            # (self.source) gets its new contents replayed after the graph (tinydynamo.side_effects)
            tx.output.side_effects.mutation(self)
            if name == "__delitem__":
                del self.items[self._key(args[0])]
                return ConstantVariable(None)
            if name == "__setitem__":
                self.items[self._key(args[0])] = args[1]
            elif name == "update":
                other = args[0] if args else None
                if isinstance(other, DictVariable):
                    self.items.update(other.items)
                self.items.update(kwargs)
            elif name == "pop":
                return self.items.pop(self._key(args[0]), *(args[1:2]))
            elif name == "setdefault":
                return self.items.setdefault(self._key(args[0]), args[1] if len(args) > 1 else ConstantVariable(None))
            else:
                self.items.clear()
            return ConstantVariable(None)
        unimplemented(f"dict.{name}")

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source_expr(self.source)
        return codegen.shared(self, lambda: "{" + ", ".join(
            f"{codegen.constant(k)}: {v.reconstruct(codegen)}" for k, v in self.items.items()) + "}")

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
        return dict.fromkeys(self.dict_var.items).keys()  # the keys are constants

    def unpack_var_sequence(self, tx):
        items = self.dict_var.items
        if self.kind == "keys":
            return [ConstantVariable(k) for k in items]
        if self.kind == "values":
            return list(items.values())
        return [TupleVariable([ConstantVariable(k), v]) for k, v in items.items()]

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


register_construction(DictVariable=DictVariable)
