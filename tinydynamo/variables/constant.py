"""ConstantVariable: a Python value known at trace time (numbers, strings, None, dtypes, ranges...).

Operations on constants are folded: the interpreter simply runs them.

Layer: above base and misc. Calling a class and reading a class's attribute make trackers of
objects.py (above), reached through base.constructor.
"""
from __future__ import annotations

import inspect
import types
from typing import Any

import torch

from tinydynamo.exc import raise_folded, raise_observed, unimplemented
from tinydynamo.polyfills import constant_object_types, python_number
from tinydynamo.variables.base import VariableTracker, check_plain_setattr, constructor
from tinydynamo.variables.misc import GetAttrVariable

#: methods of constants safe to run at trace time (no side effects on shared state)
_PURE_TYPES = (int, float, bool, str, bytes, complex, type(None), range, slice, tuple, frozenset, type(Ellipsis),
               types.MappingProxyType, inspect.Signature, inspect.Parameter)


def _is_tensor_type(v: VariableTracker) -> bool:
    try:
        t = v.python_type()
    except Exception:  # noqa: BLE001 - a tracker that cannot say its type is not a tensor
        return False
    return isinstance(t, type) and issubclass(t, torch.Tensor)


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

    def as_node_arg(self) -> Any:
        """The value in a graph node; a NumPy number as the Python number it holds (torch ops take both
        alike, and the graph's code can only spell the latter)."""
        return python_number(self.value)

    def var_setattr(self, tx, name: str, value) -> None:
        """``Cls.count += 1``: a store on a class from outside the frame, replayed after the graph."""
        if not isinstance(self.value, type) or self.source is None:
            return super().var_setattr(tx, name, value)
        check_plain_setattr(self.value, name, type.__setattr__)
        tx.output.side_effects.store_attr(self, self.value, name, value)

    def var_getattr(self, tx, name: str):
        if isinstance(self.value, type) and tx is not None:
            stored = tx.output.side_effects.load_attr(self, self.value, name)
            if stored is not None:  # ``Cls.count`` written earlier in this frame
                return stored

        try:
            value = getattr(self.value, name)
        except AttributeError as e:
            raise_observed(AttributeError, f"{type(self.value).__name__} has no attribute {name!r}: {e}")
        if isinstance(value, (types.MappingProxyType, inspect.Signature, inspect.Parameter)):
            return ConstantVariable(value)  # read-only views of a signature: constants like their owner
        if isinstance(self.value, type) and not _is_torch_constant(self.value):
            return constructor("class_attribute")(tx, self, name, value)
        if callable(value) and not isinstance(value, type):
            return GetAttrVariable(self, name)
        return VariableTracker.build_constant(value)

    def call_method(self, tx, name, args, kwargs):
        if self.value is torch.Tensor and args and _is_tensor_type(args[0]):
            # ``torch.Tensor.abs_(x)``: the unbound method called on a tensor is ``x.abs_()``
            return args[0].call_method(tx, name, list(args[1:]), kwargs)
        if not isinstance(self.value, _PURE_TYPES + constant_object_types()) and not _is_torch_constant(self.value):
            unimplemented(f"method {name!r} of constant {type(self.value).__name__}")
        if all(a.is_python_constant() for a in args) and all(v.is_python_constant() for v in kwargs.values()):
            result = getattr(self.value, name)(*[a.as_python_constant() for a in args],
                                               **{k: v.as_python_constant() for k, v in kwargs.items()})
            return VariableTracker.build_constant(result)
        unimplemented(f"{type(self.value).__name__}.{name} with non-constant arguments")

    def call_function(self, tx, args, kwargs):
        if isinstance(self.value, type):  # calling a class: a new object, a folded constant... (see objects.py)
            return constructor("call_class")(tx, self, args, kwargs)
        return super().call_function(tx, args, kwargs)

    def unpack_var_sequence(self, tx):
        if isinstance(self.value, (range, tuple, str, frozenset, bytes)):
            return [ConstantVariable(v) for v in self.value]
        if isinstance(self.value, (int, float, complex, type(None))):  # never iterable: eager's TypeError
            raise_folded(TypeError(f"'{type(self.value).__name__}' object is not iterable"), "iter()")
        unimplemented(f"iterating over {type(self.value).__name__}")

    def __repr__(self) -> str:
        return f"ConstantVariable({self.value!r})"


def _is_torch_constant(v: Any) -> bool:
    return isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format))
