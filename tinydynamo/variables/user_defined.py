"""UserDefinedObjectVariable: an instance of a user class (a config object, a dataclass...).

Attribute reads are wrapped with guarded sources; methods are inlined. Writes to plain Python
objects are side effects, recorded by the OutputGraph's SideEffects and replayed after the graph.
"""
from __future__ import annotations

import types

from tinydynamo.exc import unimplemented
from tinydynamo.source import AttrSource
from tinydynamo.variables.base import VariableTracker


class UserDefinedObjectVariable(VariableTracker):
    def __init__(self, value, source=None):
        super().__init__(source)
        self.value = value

    def python_type(self):
        return type(self.value)

    def truth(self, tx) -> bool:
        cls = self.python_type()
        if not hasattr(cls, "__bool__") and not hasattr(cls, "__len__"):
            return True  # plain objects are always true
        for name in ("__bool__", "__len__"):  # Python asks __bool__ first, then __len__
            fn = _python_dunder(cls, name)
            if fn is not None:
                result = self.call_method(tx, name, [], {})
                if result.is_python_constant():
                    return bool(result.as_python_constant())
                return result.truth(tx)
        unimplemented(f"truth value of a {cls.__name__} (it defines __bool__ or __len__ in C)")

    def var_getattr(self, tx, name: str) -> VariableTracker:
        from tinydynamo.variables.builder import VariableBuilder
        from tinydynamo.variables.functions import UserFunctionVariable, UserMethodVariable

        stored = tx.output.side_effects.load_attr(self, self.value, name)
        if stored is not None:  # written earlier in this frame
            return stored
        cls_attr = getattr(type(self.value), name, None)
        if isinstance(cls_attr, property):
            return UserFunctionVariable(cls_attr.fget).call_function(tx, [self], {})
        if name not in getattr(self.value, "__dict__", {}) and isinstance(cls_attr, types.FunctionType):
            return UserMethodVariable(cls_attr, self)
        try:
            value = getattr(self.value, name)
        except AttributeError:
            unimplemented(f"{type(self.value).__name__} has no attribute {name!r}")
        return VariableBuilder(tx, AttrSource(self.source, name) if self.source else None).wrap(value)

    def var_setattr(self, tx, name: str, value: VariableTracker) -> None:
        check_plain_setattr(self.value, name, object.__setattr__)
        tx.output.side_effects.store_attr(self, self.value, name, value)

    def call_function(self, tx, args, kwargs):
        if _python_dunder(self.python_type(), "__call__") is not None:
            return self.call_method(tx, "__call__", args, kwargs)
        unimplemented(*describe_opaque_call(self.value))

    def unpack_var_sequence(self, tx):
        """``for v in obj`` / ``list(obj)``: ``__iter__`` (or the ``__getitem__`` protocol is Unsupported)."""
        if _python_dunder(self.python_type(), "__iter__") is None:
            unimplemented(f"iterating over a {self.python_type().__name__} (no Python __iter__)")
        it = self.call_method(tx, "__iter__", [], {})
        if it is self:
            unimplemented(f"{self.python_type().__name__}.__iter__ returns self (an iterator object with __next__)")
        return it.unpack_var_sequence(tx)

    def call_method(self, tx, name, args, kwargs):
        return self.var_getattr(tx, name).call_function(tx, args, kwargs)

    def __repr__(self) -> str:
        return f"UserDefinedObjectVariable({type(self.value).__name__})"


def check_plain_setattr(obj, name: str, expected_setattr) -> None:
    """Only a plain ``__dict__`` store can be replayed faithfully: no custom ``__setattr__``, no
    property/descriptor for ``name``, an object with a ``__dict__`` (not an unknown C type)."""
    cls = type(obj)
    if getattr(cls, "__setattr__", None) is not expected_setattr:
        unimplemented(f"setting {name!r} on a {cls.__name__}, which defines its own __setattr__")
    if not hasattr(obj, "__dict__"):
        unimplemented(f"setting {name!r} on a {cls.__name__} (no __dict__: a C type or __slots__)")
    if hasattr(getattr(cls, name, None), "__set__"):
        unimplemented(f"setting {name!r} on a {cls.__name__}: it is a property/descriptor of the class")


def describe_opaque_call(value) -> tuple[str, str]:
    """(reason, hint) for a call tinydynamo cannot look inside: name the function and its module,
    since ``call of <object>`` tells a learner nothing about which line to change."""
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or type(value).__name__
    module = getattr(value, "__module__", None) or getattr(type(getattr(value, "__self__", None)), "__module__", "")
    where = f"{module}.{name}" if module and module != "builtins" else name
    if module.split(".")[0] == "numpy" or type(getattr(value, "__self__", None)).__module__.startswith("numpy"):
        return (f"call to {where}: numpy runs outside the graph",
                "use the torch equivalent on tensors (torch.as_tensor, Tensor.sum, torch.where, ...)")
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        return (f"call to {where}, a C function tinydynamo cannot trace into",
                "call it outside the compiled function, or pass its result in as an argument")
    return (f"call of a {type(value).__name__} object ({where})",
            "tinydynamo traces Python functions, torch functions and nn.Modules; wrap others with "
            "tinydynamo.disable to run them outside the graph on purpose")


def _python_dunder(cls: type, name: str):
    """The Python function that defines ``name`` on ``cls`` (found along the MRO), or None."""
    for base in cls.__mro__:
        if name in vars(base):
            fn = vars(base)[name]
            return fn if isinstance(fn, types.FunctionType) else None
    return None
