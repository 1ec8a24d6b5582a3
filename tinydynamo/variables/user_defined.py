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
        cls = type(self.value)
        if not hasattr(cls, "__bool__") and not hasattr(cls, "__len__"):
            return True  # plain objects are always true
        unimplemented(f"truth value of a {cls.__name__} (it defines __bool__ or __len__)")

    def var_getattr(self, tx, name: str) -> VariableTracker:
        from tinydynamo.variables.builder import VariableBuilder, guard_class_lookup
        from tinydynamo.variables.functions import UserFunctionVariable, UserMethodVariable

        stored = tx.output.side_effects.load_attr(self, self.value, name)
        if stored is not None:  # written earlier in this frame
            return stored
        cls_attr = getattr(type(self.value), name, None)
        if isinstance(cls_attr, property):  # inline the getter: its reads are guarded as they happen
            cls_source = guard_class_lookup(tx, self.value, self.source, name, cls_attr)
            fget_source = AttrSource(cls_source, "fget") if cls_source is not None else None
            return UserFunctionVariable(cls_attr.fget, fget_source).call_function(tx, [self], {})
        if name not in getattr(self.value, "__dict__", {}) and isinstance(cls_attr, types.FunctionType):
            return UserMethodVariable(cls_attr, self, guard_class_lookup(tx, self.value, self.source, name, cls_attr))
        try:
            value = getattr(self.value, name)
        except AttributeError:
            unimplemented(f"{type(self.value).__name__} has no attribute {name!r}")
        return VariableBuilder(tx, AttrSource(self.source, name) if self.source else None).wrap(value)

    def var_setattr(self, tx, name: str, value: VariableTracker) -> None:
        check_plain_setattr(self.value, name, object.__setattr__)
        tx.output.side_effects.store_attr(self, self.value, name, value)

    def call_function(self, tx, args, kwargs):
        unimplemented(*describe_opaque_call(self.value))

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
