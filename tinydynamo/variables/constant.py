"""ConstantVariable: a Python value known at trace time (numbers, strings, None, dtypes, ranges...).

Operations on constants are folded: the interpreter simply runs them.
"""
from __future__ import annotations

import inspect
import types
from typing import Any

from tinydynamo.exc import raise_observed, unimplemented
from tinydynamo.variables.base import VariableTracker

#: methods of constants safe to run at trace time (no side effects on shared state)
_PURE_TYPES = (int, float, bool, str, bytes, complex, type(None), range, slice, tuple, frozenset, type(Ellipsis),
               types.MappingProxyType, inspect.Signature, inspect.Parameter)


class ConstantVariable(VariableTracker):
    def __init__(self, value: Any, source=None):
        super().__init__(source)
        self.value = value

    def python_type(self) -> type:
        return type(self.value)

    def as_python_constant(self) -> Any:
        return self.value

    def is_python_constant(self) -> bool:
        return True

    def truth(self, tx) -> bool:
        return bool(self.value)

    def var_getattr(self, tx, name: str):
        from tinydynamo.variables.builder import wrap_constant_result

        try:
            value = getattr(self.value, name)
        except AttributeError as e:
            raise_observed(AttributeError, f"{type(self.value).__name__} has no attribute {name!r}: {e}")
        if isinstance(value, (types.MappingProxyType, inspect.Signature, inspect.Parameter)):
            return ConstantVariable(value)  # read-only views of a signature: constants like their owner
        if isinstance(self.value, type) and not isinstance(value, (types.BuiltinFunctionType, types.WrapperDescriptorType,
                                                                   types.MethodDescriptorType)):
            # a class's attribute (a function, a classmethod bound to it, a class constant): the real value
            from tinydynamo.source import AttrSource
            from tinydynamo.variables.builder import VariableBuilder

            return VariableBuilder(tx, AttrSource(self.source, name) if self.source is not None else None).wrap(value)
        if callable(value) and not isinstance(value, type):
            from tinydynamo.variables.misc import GetAttrVariable

            return GetAttrVariable(self, name)
        return wrap_constant_result(value)

    def call_method(self, tx, name, args, kwargs):
        from tinydynamo.variables.builder import wrap_constant_result

        if not isinstance(self.value, _PURE_TYPES) and not _is_torch_constant(self.value):
            unimplemented(f"method {name!r} of constant {type(self.value).__name__}")
        if all(a.is_python_constant() for a in args) and all(v.is_python_constant() for v in kwargs.values()):
            result = getattr(self.value, name)(*[a.as_python_constant() for a in args],
                                               **{k: v.as_python_constant() for k, v in kwargs.items()})
            return wrap_constant_result(result)
        unimplemented(f"{type(self.value).__name__}.{name} with non-constant arguments")

    def unpack_var_sequence(self, tx):
        if isinstance(self.value, (range, tuple, str, frozenset, bytes)):
            return [ConstantVariable(v) for v in self.value]
        unimplemented(f"iterating over {type(self.value).__name__}")

    def __repr__(self) -> str:
        return f"ConstantVariable({self.value!r})"


def _is_torch_constant(v: Any) -> bool:
    import torch

    return isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format))
