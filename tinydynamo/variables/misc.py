"""Small variables: bound methods of other variables, and Python modules (``torch``, ``math``...).

Layer: just above base.
"""
from __future__ import annotations

import os
import types

from tinydynamo.exc import raise_observed, unimplemented
from tinydynamo.source import AttrSource, CallSource
from tinydynamo.variables.base import VariableTracker

#: modules whose attributes we trust not to be monkeypatched (no guards on them)
TRUSTED_MODULE_PREFIXES = ("torch", "math", "operator", "builtins", "functools", "itertools",
                           "collections", "numbers", "typing", "warnings", "inspect")


class GetAttrVariable(VariableTracker):
    """``obj.name`` where ``name`` is a method: calling it becomes ``obj.call_method(name, ...)``."""

    def __init__(self, obj: VariableTracker, name: str, source=None):
        super().__init__(source)
        self.obj = obj
        self.name = name

    def call_function(self, tx, args, kwargs):
        return self.obj.call_method(tx, self.name, args, kwargs)

    def reconstruct(self, codegen) -> str:
        return f"getattr({self.obj.reconstruct(codegen)}, {self.name!r})"

    def __repr__(self) -> str:
        return f"GetAttrVariable({self.obj!r}.{self.name})"


class PythonModuleVariable(VariableTracker):
    """A Python module object (``torch``, ``torch.nn.functional``, ``math``, a user module)."""

    def __init__(self, module: types.ModuleType, source=None):
        super().__init__(source)
        self.module = module

    def python_type(self):
        return types.ModuleType

    def as_python_constant(self):
        return self.module

    @property
    def trusted(self) -> bool:
        return self.module.__name__.split(".")[0] in TRUSTED_MODULE_PREFIXES

    def var_getattr(self, tx, name: str) -> VariableTracker:
        try:
            value = getattr(self.module, name)
        except AttributeError:
            raise_observed(AttributeError, f"module {self.module.__name__!r} has no attribute {name!r}")
        if self.trusted or self.source is None:
            return VariableTracker.build(tx, value)
        return VariableTracker.build(tx, value, AttrSource(self.source, name))

    def __repr__(self) -> str:
        return f"PythonModuleVariable({self.module.__name__})"


class EnvironVariable(VariableTracker):
    """``os.environ``: reads with constant keys are folded, each guarded by reading the variable again
    (``os.environ.get('X', '0') == '0'``), so a changed environment recompiles."""

    def python_type(self):
        return type(os.environ)

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name in ("get", "__getitem__", "__contains__"):
            return GetAttrVariable(self, name)
        unimplemented(f"os.environ.{name}")

    def call_method(self, tx, name, args, kwargs):
        if kwargs or not all(a.is_python_constant() for a in args) or name not in ("get", "__getitem__", "__contains__"):
            unimplemented(f"os.environ.{name} with non-constant arguments")
        key, *rest = [a.as_python_constant() for a in args]
        default = rest[0] if rest else None
        get = CallSource(tx.output.scope.constant(os.environ.get, "fn"), "os.environ.get", (key, default))
        value = VariableTracker.build(tx, os.environ.get(key, default), get)  # guarded: CONSTANT_MATCH
        if name == "get":
            return value
        present = os.environ.get(key) is not None
        if name == "__contains__":
            return VariableTracker.build_constant(present)
        if not present:
            raise_observed(KeyError, key)
        return value

    def __repr__(self) -> str:
        return "EnvironVariable()"
