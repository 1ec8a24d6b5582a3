"""Instances of list subclasses that add Python methods (``class Processors(list)`` with a ``__call__``).

The items live in a :class:`ListVariable`, so list's own methods, ``len``, iteration, indexing and
the replay of changes to a list from outside the frame work as for a list; the attributes the
subclass defines in Python (methods, properties, a ``clear`` that does nothing) are looked up as
Python looks them up, with ``self`` bound to this same tracker. A subclass that changes how the list
itself behaves (its own ``__iter__``, ``__len__``, ``__getitem__``, ``__init__``...) is not modelled here.

Layer: with user_defined (its class-attribute lookup), above lists.
"""
from __future__ import annotations

import inspect

from tinydynamo.exc import raise_observed, unimplemented
from tinydynamo.source import AttrSource
from tinydynamo.variables.base import VariableTracker, check_plain_setattr
from tinydynamo.variables.lists import ListVariable
from tinydynamo.variables.misc import GetAttrVariable
from tinydynamo.variables.user_defined import MISSING, class_attribute_variable

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python

#: methods a subclass may not define for its instances to behave as the list of their items
LIST_PROTOCOL = frozenset({
    "__new__", "__init__", "__iter__", "__reversed__", "__len__", "__bool__", "__getitem__", "__setitem__",
    "__delitem__", "__contains__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__",
    "__add__", "__radd__", "__iadd__", "__mul__", "__rmul__", "__imul__", "__getattribute__", "__getattr__",
    "__setattr__", "__delattr__", "__class__", "__slots__", "__copy__", "__deepcopy__", "__reduce__",
    "__reduce_ex__"})


def is_traceable_list_subclass(cls) -> bool:
    """A Python subclass of ``list`` (plain metaclass, no ``__slots__``) whose classes above ``list``
    leave the list protocol alone."""
    if not isinstance(cls, type) or cls is list or not issubclass(cls, list) or type(cls) is not type:
        return False
    for base in cls.__mro__:
        if base is list:
            return all(b is object for b in cls.__mro__[cls.__mro__.index(list) + 1:])
        if not base.__flags__ & _HEAPTYPE or LIST_PROTOCOL & set(vars(base)):
            return False
    return False


def _python_attribute(cls: type, name: str):
    """``cls.<name>`` if a class above ``list`` in the MRO defines it, else MISSING."""
    for base in cls.__mro__:
        if base is list:
            return MISSING
        if name in vars(base):
            return inspect.getattr_static(cls, name)
    return MISSING


class ListSubclassVariable(ListVariable):
    """A list subclass instance: ``value`` the real object (one from outside the frame) or None (made here)."""

    def __init__(self, items, cls: type, value=None, source=None):
        super().__init__(items, source)
        self.cls, self.value = cls, value

    def python_type(self) -> type:
        return self.cls

    def as_python_constant(self):
        return self.cls(v.as_python_constant() for v in self.items)

    def rebuild(self, items):  # a slice of a list subclass is a plain list
        return ListVariable(items)

    def var_getattr(self, tx, name: str):
        if self.value is not None:
            stored = tx.output.side_effects.load_attr(self, self.value, name)
            if stored is not None:
                return stored
        source = AttrSource(self.source, name) if self.source is not None else None
        attr = _python_attribute(self.cls, name)
        instance_dict = getattr(self.value, "__dict__", {})
        if attr is not MISSING and (isinstance(attr, property) or name not in instance_dict):
            return class_attribute_variable(tx, self, self.cls, name, attr, source)
        if name in instance_dict:
            return VariableTracker.build(tx, instance_dict[name], source)
        if callable(getattr(list, name, None)):
            return GetAttrVariable(self, name)  # list's own method: call_method below
        raise_observed(AttributeError, f"{self.cls.__name__} has no attribute {name!r}")

    def call_method(self, tx, name, args, kwargs):
        if _python_attribute(self.cls, name) is not MISSING:  # the subclass's own (``clear`` overridden)
            return self.var_getattr(tx, name).call_function(tx, args, kwargs)
        return super().call_method(tx, name, args, kwargs)

    def call_function(self, tx, args, kwargs):
        if _python_attribute(self.cls, "__call__") is MISSING:
            raise_observed(TypeError, f"'{self.cls.__name__}' object is not callable")
        return self.call_method(tx, "__call__", args, kwargs)

    def var_setattr(self, tx, name: str, value) -> None:
        if self.value is None:
            unimplemented(f"setting attribute {name!r} on a {self.cls.__name__} made in the frame")
        check_plain_setattr(self.value, name, object.__setattr__)
        tx.output.side_effects.store_attr(self, self.value, name, value)

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source_expr(self.source)
        cls = codegen.constant(self.cls, "cls")  # list.__init__ (not overridden) takes the items
        return codegen.shared(self, lambda: f"{cls}([{', '.join(v.reconstruct(codegen) for v in self.items)}])")

    def __repr__(self) -> str:
        return f"ListSubclassVariable({self.cls.__name__}, {self.items!r})"
