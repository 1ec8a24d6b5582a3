"""Sequences: tuples, lists, ``torch.Size`` and the iterators the interpreter walks in loops.

Layer: above functions and sym_node; ``in`` and a symbolic ``Size.numel`` are builtin calls
(base.constructor); it registers ``TupleVariable`` for functions (``*args``).
"""
from __future__ import annotations

import operator
import types as _types

import torch

from tinydynamo import polyfills
from tinydynamo.exc import raise_folded, unimplemented
from tinydynamo.variables.base import VariableTracker, constructor, register_construction
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.functions import UserFunctionVariable, UserMethodVariable
from tinydynamo.variables.misc import GetAttrVariable
from tinydynamo.variables.sym_node import SliceVariable, SymNodeVariable


class BaseListVariable(VariableTracker):
    container: type = list
    version = 0  # bumped by every in-place change (SideEffects.mutation): a loop over it notices

    def __init__(self, items: list[VariableTracker], source=None):
        super().__init__(source)
        self.items = list(items)

    def python_type(self) -> type:
        return self.container

    def as_python_constant(self):
        return self.container(v.as_python_constant() for v in self.items)

    def is_python_constant(self) -> bool:  # asking must not specialise a symbolic size among the items
        return all(v.is_python_constant() for v in self.items)

    def as_node_arg(self):
        return self.container(v.as_node_arg() for v in self.items)

    def as_example(self):
        return self.container(v.as_example() for v in self.items)

    def var_getattr(self, tx, name: str):
        if callable(getattr(self.python_type(), name, None)):
            return GetAttrVariable(self, name)  # a method: calling it goes to call_method
        return super().var_getattr(tx, name)

    def truth(self, tx) -> bool:
        return len(self.items) > 0

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        return list(self.items)

    def getitem(self, tx, index: VariableTracker) -> VariableTracker:
        if isinstance(index, (SymNodeVariable, SliceVariable)):  # shape[:n], items[n]: n is specialised
            index = ConstantVariable(index.as_python_constant())
        if not index.is_python_constant():
            unimplemented(f"indexing a {self.container.__name__} with {index}")
        i = index.as_python_constant()
        if isinstance(i, slice):
            return self.rebuild(self.items[i])
        try:
            return self.items[i]
        except (IndexError, TypeError) as e:  # the traced code's own error (its except may catch it)
            raise_folded(e, f"{self.container.__name__} index {i!r}")

    def rebuild(self, items: list[VariableTracker]) -> "BaseListVariable":
        return type(self)(items)

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name == "__contains__" and len(args) == 1:
            return constructor("BuiltinVariable").contains(tx, self.items, args[0])
        if name in ("index", "count") and self.is_python_constant() and args[0].is_python_constant():
            return ConstantVariable(getattr(self.as_python_constant(), name)(*[a.as_python_constant() for a in args]))
        unimplemented(f"{self.container.__name__}.{name}")

    def reconstruct(self, codegen) -> str:
        if self.source is not None:  # from outside: the same object (new contents replayed by SideEffects)
            return codegen.source_expr(self.source)
        if self.container is tuple:
            inner = ", ".join(v.reconstruct(codegen) for v in self.items)
            return f"({inner},)" if len(self.items) == 1 else f"({inner})"
        return codegen.shared(self, lambda: f"[{', '.join(v.reconstruct(codegen) for v in self.items)}]")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.items!r})"


class TupleVariable(BaseListVariable):
    container = tuple

    def __init__(self, items, source=None, tuple_cls: type | None = None):
        super().__init__(items, source)
        self.tuple_cls = tuple_cls  # a namedtuple type (e.g. torch.return_types.max), if any

    def rebuild(self, items):
        return TupleVariable(items)

    def python_type(self):
        return self.tuple_cls or tuple  # isinstance(p, Point) on a named tuple

    def reconstruct(self, codegen) -> str:
        """A named tuple is rebuilt as its own type (``NT._make((...))``, ``torch.return_types.max((...))``)."""
        plain = super().reconstruct(codegen)
        if self.tuple_cls is None or self.source is not None:
            return plain
        make = getattr(self.tuple_cls, "_make", None)
        cls = codegen.constant(self.tuple_cls, "tuple_cls")
        return f"{cls}._make({plain})" if make is not None else f"{cls}({plain})"

    def var_getattr(self, tx, name: str):
        """Field access on a named tuple (``torch.max(x, 0).values``); its Python methods and properties."""
        if self.tuple_cls is not None:
            attr = next((vars(b)[name] for b in self.tuple_cls.__mro__ if name in vars(b)), None)
            if isinstance(attr, _types.FunctionType) and not name.startswith("_"):
                return UserMethodVariable(attr, self)
            if isinstance(attr, staticmethod) and isinstance(attr.__func__, _types.FunctionType):
                return UserFunctionVariable(attr.__func__)
            if isinstance(attr, classmethod) and isinstance(attr.__func__, _types.FunctionType) \
                    and not name.startswith("_"):  # (namedtuple's own _make is a C-backed classmethod)
                return UserMethodVariable(attr.__func__, ConstantVariable(self.tuple_cls))
            if isinstance(attr, property) and attr.fget is not None:
                return UserFunctionVariable(attr.fget).call_function(tx, [self], {})
        if self.tuple_cls is not None:
            n = len(self.items)
            make = getattr(self.tuple_cls, "_make", self.tuple_cls)
            try:
                index = getattr(make(tuple(range(n))), name)
            except Exception:
                index = None
            if isinstance(index, int):
                return self.items[index]
        return super().var_getattr(tx, name)  # methods (count, index, torch.Size.numel)


class ListVariable(BaseListVariable):
    container = list

    #: methods that change the list in place (``sort`` too, journaled once its keys are computed)
    MUTATING = ("append", "extend", "pop", "insert", "clear", "reverse", "__setitem__", "__delitem__", "remove")

    def call_method(self, tx, name, args, kwargs):
        if name in self.MUTATING:
            args = self._before_mutation(tx, name, args)
        if name == "append":
            self.items.append(args[0])
            return ConstantVariable(None)
        if name == "extend" and getattr(args[0], "gen", None) is not None:
            # a generator (or map, filter...): each item is appended before the next is made, as
            # CPython does (the generator may read the list it extends)
            while (item := args[0].next_item()) is not None:
                self.items.append(item)
            return ConstantVariable(None)
        if name == "extend":
            self.items.extend(args[0].unpack_var_sequence(tx))
            return ConstantVariable(None)
        if name == "insert":
            self.items.insert(args[0].as_python_constant(), args[1])
            return ConstantVariable(None)
        if name == "pop":
            return self.items.pop(args[0].as_python_constant() if args else -1)
        if name == "reverse":
            self.items.reverse()
            return ConstantVariable(None)
        if name == "clear":
            self.items.clear()
            return ConstantVariable(None)
        if name == "__setitem__":
            key = args[0].as_python_constant()
            if isinstance(key, slice):
                self.items[key] = args[1].unpack_var_sequence(tx)
            else:
                self.items[key] = args[1]
            return ConstantVariable(None)
        if name == "__delitem__":
            del self.items[args[0].as_python_constant()]
            return ConstantVariable(None)
        if name == "sort":  # sorted() (a polyfill, so key= may call traced functions), then in place
            result = UserFunctionVariable(polyfills.sorted_).call_function(tx, [ListVariable(list(self.items))], kwargs)
            tx.output.side_effects.mutation(self)
            self.items[:] = result.unpack_var_sequence(tx)
            return ConstantVariable(None)
        if name == "copy" and not args and not kwargs:  # a new list made in the frame, same items
            return ListVariable(list(self.items))
        if name == "remove":
            value = args[0].as_python_constant()
            for i, v in enumerate(self.items):
                if v.is_python_constant() and v.as_python_constant() == value:
                    del self.items[i]
                    return ConstantVariable(None)
            unimplemented(f"list.remove({value!r}): no equal constant item")
        return super().call_method(tx, name, args, kwargs)

    def _before_mutation(self, tx, name: str, args: list) -> list:
        """Check the index is a constant, read ``extend``'s argument first (``lst.extend(lst)`` reads the old
        items), then journal the old contents: rolled back at a graph break; a list from outside the frame
        (``self.source``) gets its new contents replayed after the graph (tinydynamo.side_effects)."""
        if name in ("pop", "insert", "__setitem__", "__delitem__", "remove") and not all(
                a.is_python_constant() for a in args[:1]):
            unimplemented(f"list.{name} with a non-constant index or value {args[:1]}")
        lazy = name == "extend" and getattr(args[0], "gen", None) is not None
        if name == "extend" and not lazy:
            args = [ListVariable(args[0].unpack_var_sequence(tx))]
        tx.output.side_effects.mutation(self)
        return args


class SizeVariable(TupleVariable):
    """``torch.Size``: a tuple of ints known at trace time (shapes are static, guarded by TENSOR_MATCH)."""

    @classmethod
    def of(cls, size) -> "SizeVariable":
        return cls([ConstantVariable(int(s)) for s in size])

    def python_type(self):
        return torch.Size

    def as_python_constant(self):
        return torch.Size(v.as_python_constant() for v in self.items)

    def as_node_arg(self):
        return tuple(v.as_node_arg() for v in self.items)

    def rebuild(self, items):
        return SizeVariable(items)

    def call_method(self, tx, name, args, kwargs):
        if name == "numel" and self.is_python_constant():
            return ConstantVariable(self.as_python_constant().numel())
        if name == "numel" and not args:  # symbolic sizes: their product
            total = ConstantVariable(1)
            for item in self.items:
                total = constructor("BuiltinVariable").binop(tx, operator.mul, total, item)
            return total
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, codegen) -> str:
        return f"{codegen.constant(torch.Size, 'Size')}({super().reconstruct(codegen)})"


class ListIteratorVariable(VariableTracker):
    """An iterator over already-unpacked items: FOR_ITER takes them one by one (loops unroll)."""

    def __init__(self, items: list[VariableTracker], origin: VariableTracker | None = None, reverse: bool = False,
                 enumerate_start: int | None = None):
        super().__init__(None)
        self.items = list(items)
        self.index = 0
        self.origin = origin  # the list/dict iterated over, to notice it changing under the loop
        self.origin_version = getattr(origin, "version", 0)
        # a loop over a dict or a view of it (``follow_dict_values``): its keys when the loop began, and the
        # values/items view whose values are read live
        self.origin_keys, self.dict_view = None, None
        self.reverse = reverse  # reversed(list): walks down from the last index at creation
        self.enumerate_start = enumerate_start  # enumerate(list, start): items are (start + i, list[i])

    def _live_list(self) -> list | None:
        """The items of the list iterated over, read live (None: not a list). Python's list iterators
        read the list at each step: an append inside ``for x in lst`` is seen; ``reversed(lst)`` walks
        down from the index it started at and stops once that is past the end."""
        return self.origin.items if isinstance(self.origin, ListVariable) else None

    def _remaining(self) -> list[VariableTracker]:
        live = self._live_list()
        if live is None:
            return self.items[self.index:]
        if self.reverse:
            pos = len(self.items) - 1 - self.index  # len(self.items): the list's length when reversed() began
            return [] if pos >= len(live) else [live[i] for i in range(pos, -1, -1)]
        if self.enumerate_start is not None:
            return [TupleVariable([ConstantVariable(self.enumerate_start + i), live[i]])
                    for i in range(self.index, len(live))]
        return live[self.index:]

    def follow_dict_values(self, view: VariableTracker | None) -> "ListIteratorVariable":
        """Iterating over the dict ``self.origin`` (``view``: its values()/items() view, or None for its
        keys): setting a value for a key it has does not stop the loop, which reads values live."""
        self.origin_keys, self.dict_view = list(self.origin.items), view
        return self

    def next_item(self) -> VariableTracker | None:
        if self.origin is not None and self._live_list() is None and \
                getattr(self.origin, "version", 0) != self.origin_version:
            if self.origin_keys is None or list(self.origin.items) != self.origin_keys:
                unimplemented("a dict changed while a loop iterates over it (Python raises RuntimeError)")
            # only values changed (``d[k] = v`` for a key it has): Python's loop goes on, reading them live
            self.origin_version = self.origin.version
            if self.dict_view is not None:
                self.items = self.dict_view.unpack_var_sequence(None)
        rest = self._remaining()
        if not rest:  # exhausted stays exhausted, whatever the list does later
            self.items, self.index, self.origin = [], 0, None
            return None
        self.index += 1
        return rest[0]

    def unpack_var_sequence(self, tx):
        rest = self._remaining()
        self.items, self.index, self.origin = list(rest), len(rest), None
        return rest

    def reconstruct(self, codegen) -> str:  # one iterator, however many places hold it
        return codegen.shared(self, lambda: self.iter_expr(codegen))

    def iter_expr(self, codegen) -> str:
        """A new iterator over the remaining items."""
        return f"iter([{', '.join(v.reconstruct(codegen) for v in self._remaining())}])"

    def call_method(self, tx, name, args, kwargs):
        if name == "__contains__" and len(args) == 1 and not kwargs:
            # ``x in it`` consumes the iterator up to the first item that is ``x`` or equals it, as Python does
            builtin = constructor("BuiltinVariable")
            while (item := self.next_item()) is not None:
                if builtin.is_(tx, item, args[0]) or builtin.binop(tx, operator.eq, item, args[0]).truth(tx):
                    return ConstantVariable(True)
            return ConstantVariable(False)
        return super().call_method(tx, name, args, kwargs)

    def __repr__(self) -> str:
        return f"ListIteratorVariable({self.index}/{len(self.items)})"


def specialized(v: VariableTracker) -> VariableTracker:
    """``v`` with its symbolic sizes replaced by their values (guarded), inside tuples and lists too."""
    if isinstance(v, (SymNodeVariable, SliceVariable)):
        return ConstantVariable(v.as_python_constant())
    if isinstance(v, BaseListVariable) and v.source is None and any(
            isinstance(i, (SymNodeVariable, SliceVariable, BaseListVariable)) for i in v.items):
        return v.rebuild([specialized(i) for i in v.items])
    return v


register_construction(TupleVariable=TupleVariable)
