"""DataclassVariable: an instance of a dataclass created inside the frame (a model's output record).

A dataclass with its generated ``__init__`` is only its fields: the variable keeps one tracker per
field, answers attribute reads and writes from them, and is rebuilt after the graph by calling the
class with the fields as keywords. Hugging Face's ``ModelOutput`` (an OrderedDict subclass whose
``__post_init__`` stores every non-None field as a key too, and whose integer indexing reads the
tuple of non-None fields) is modelled with those semantics, as TorchDynamo does for it.

Layer: beside the builder (its fields are wrapped by it), above every tracker module.
"""
from __future__ import annotations

import dataclasses

from tinydynamo.exc import raise_observed, unimplemented
from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.builder import VariableBuilder
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.functions import UserFunctionVariable, UserMethodVariable
from tinydynamo.variables.lists import ListIteratorVariable, TupleVariable
from tinydynamo.variables.misc import GetAttrVariable
from tinydynamo.variables.tensor import TensorVariable


def _is_generated_init(cls: type) -> bool:
    init = cls.__dict__.get("__init__") or getattr(cls, "__init__", None)
    return getattr(getattr(init, "__code__", None), "co_filename", None) == "<string>"  # made by dataclasses


def is_model_output(cls: type) -> bool:
    """Hugging Face's ModelOutput (without importing transformers): a dataclass OrderedDict with ``to_tuple``."""
    return any(k.__name__ == "ModelOutput" and k.__module__.startswith("transformers.") for k in cls.__mro__)


def can_model(cls: type) -> bool:
    """Dataclasses built by their generated ``__init__`` (and no custom ``__post_init__``, except ModelOutput's)."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return False
    if is_model_output(cls):
        return True
    return _is_generated_init(cls) and not hasattr(cls, "__post_init__") \
        and cls.__setattr__ is object.__setattr__ and not issubclass(cls, dict)


class DataclassVariable(VariableTracker):
    def __init__(self, cls: type, fields: dict[str, VariableTracker]):
        super().__init__(None)
        self.cls = cls
        self.fields = fields  # every init field, in order (None where unset)
        self.model_output = is_model_output(cls)

    @classmethod
    def create(cls, tx, klass: type, args, kwargs) -> "DataclassVariable":
        names = [f.name for f in dataclasses.fields(klass) if f.init]
        if len(args) > len(names):
            unimplemented(f"{klass.__name__}() takes {len(names)} arguments, {len(args)} given")
        values: dict[str, VariableTracker] = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in values:
                unimplemented(f"{klass.__name__}() got an unexpected or repeated argument {k!r}")
            values[k] = v
        for f in dataclasses.fields(klass):
            if not f.init and f.default_factory is not dataclasses.MISSING:
                unimplemented(f"{klass.__name__}(): field {f.name!r} with init=False and a default_factory")
            if f.name in values or not f.init:
                continue
            if f.default is not dataclasses.MISSING:
                values[f.name] = ConstantVariable(f.default)
            elif f.default_factory is not dataclasses.MISSING:  # field(default_factory=list): a new value per object
                values[f.name] = VariableBuilder(tx, None).wrap(f.default_factory).call_function(tx, [], {})
            else:
                unimplemented(f"{klass.__name__}(): field {f.name!r} without a constant default")
        var = cls(klass, {n: values[n] for n in names})
        if var.model_output:
            var._check_model_output()
        return var

    def _check_model_output(self) -> None:
        """ModelOutput.__post_init__'s other branch (a first field that is a dict or an iterable of pairs)."""
        items = list(self.fields.values())
        if items and not isinstance(items[0], TensorVariable) and not _is_none(items[0]) \
                and all(_is_none(v) for v in items[1:]):
            unimplemented(f"{self.cls.__name__} built from a non-tensor first field (ModelOutput's iterable form)")

    # ---- what Python code asks of it --------------------------------------------------------------------
    def python_type(self):
        return self.cls

    def truth(self, tx) -> bool:
        return len(self._keys()) > 0 if self.model_output else True

    def _keys(self) -> list[str]:
        """The dict keys of a ModelOutput: its non-None fields, in order."""
        return [k for k, v in self.fields.items() if not _is_none(v)]

    def _to_tuple(self):
        return TupleVariable([self.fields[k] for k in self._keys()])

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name in self.fields:
            return self.fields[name]
        if self.model_output and name in ("to_tuple", "keys", "values", "items", "get", "__getitem__",
                                           "__contains__", "__len__", "__setitem__"):
            return GetAttrVariable(self, name)
        attr = getattr(self.cls, name, None)
        if isinstance(attr, property):
            return UserFunctionVariable(attr.fget).call_function(tx, [self], {})
        if callable(attr) and hasattr(attr, "__code__"):
            return UserMethodVariable(attr, self)
        if attr is None and not hasattr(self.cls, name):
            raise_observed(AttributeError, f"{self.cls.__name__} has no attribute {name!r}")
        return VariableBuilder(tx, None).wrap(attr)

    def var_setattr(self, tx, name: str, value: VariableTracker) -> None:
        if name not in self.fields:
            unimplemented(f"setting {name!r}, not a field of {self.cls.__name__}")
        self.fields[name] = value  # a new object of this frame: nothing to replay

    def call_method(self, tx, name, args, kwargs):
        if not self.model_output:
            return self.var_getattr(tx, name).call_function(tx, args, kwargs)
        if name == "to_tuple":
            return self._to_tuple()
        if name == "__getitem__":
            key = args[0].as_python_constant()
            if isinstance(key, str):
                if key not in self._keys():
                    raise_observed(KeyError, key)
                return self.fields[key]
            return self._to_tuple().call_method(tx, "__getitem__", args, kwargs)
        if name == "__setitem__":
            self.var_setattr(tx, args[0].as_python_constant(), args[1])
            return ConstantVariable(None)
        if name == "__contains__":
            return ConstantVariable(args[0].as_python_constant() in self._keys())
        if name == "__len__":
            return ConstantVariable(len(self._keys()))
        if name == "get":
            key = args[0].as_python_constant()
            return self.fields[key] if key in self._keys() else (args[1] if len(args) > 1 else ConstantVariable(None))
        if name == "keys":
            return ListIteratorVariable([ConstantVariable(k) for k in self._keys()])
        if name == "values":
            return ListIteratorVariable([self.fields[k] for k in self._keys()])
        if name == "items":
            return ListIteratorVariable([TupleVariable([ConstantVariable(k), self.fields[k]]) for k in self._keys()])
        return self.var_getattr(tx, name).call_function(tx, args, kwargs)

    def unpack_var_sequence(self, tx):
        if self.model_output:  # iterating a dict: its keys
            return [ConstantVariable(k) for k in self._keys()]
        unimplemented(f"iterating over a {self.cls.__name__}")

    def reconstruct(self, codegen) -> str:
        def build():  # one object however many places hold it
            cls = codegen.constant(self.cls, "cls")
            kwargs = ", ".join(f"{k}={v.reconstruct(codegen)}" for k, v in self.fields.items())
            return f"{cls}({kwargs})"

        return codegen.shared(self, build)

    def __repr__(self) -> str:
        return f"DataclassVariable({self.cls.__name__})"


def _is_none(v: VariableTracker) -> bool:
    return isinstance(v, ConstantVariable) and v.value is None
