"""Objects made inside the frame: instances of user classes, ``super()``, and calling a class.

``Point(x, 2)`` in traced code does not run ``Point.__init__`` for real: the interpreter makes a
:class:`NewObjectVariable` (the class plus a dict of attribute variables) and *inlines*
``__init__`` on it, so ``self.x = x`` stores a TensorVariable. Reads follow Python's lookup
order (data descriptors of the class, then the instance dict, then class attributes, then
``__getattr__``). Nothing happens to real objects unless the new object escapes the frame
(returned, left on the stack at a graph break, stored into an outside object): then it is
rebuilt after the graph from its class and its final attributes (:func:`rebuild_object`).

Calling a class (:func:`call_class`) dispatches on what the class is: a user class (above), a
named tuple (a TupleVariable with its type), a parameterless ``nn.Module`` (built at trace time
and inlined), ``super``, a class from :mod:`tinydynamo.variables.polyfilled`' table (``functools.partial``,
``itertools.chain``, ``collections.deque``...), or a pure class folded over constants
(``torch.finfo``, ``torch.device``, ``torch.Size``...).

Layer: above polyfilled, nn_module and every tracker a class call can make. ConstantVariable
(a class is a constant) reaches ``call_class`` and ``class_attribute`` through base.constructor.
"""
from __future__ import annotations

import enum
import types
from typing import Any

import torch
from torch import nn

from tinydynamo.exc import raise_observed, unimplemented
from tinydynamo.source import AttrSource
from tinydynamo.variables import iter as iter_variables, polyfilled
from tinydynamo.variables.autograd_function import AutogradFunctionApplyVariable
from tinydynamo.variables.base import VariableTracker, register_construction
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.dicts import DictVariable
from tinydynamo.variables.exceptions import (
    BaseExceptionInitVariable,
    ExceptionVariable,
    builtin_construction,
    python_init_exception,
)
from tinydynamo.variables.functions import UserFunctionVariable, UserMethodVariable, bind_arguments
from tinydynamo.variables.list_subclass import ListSubclassVariable, is_traceable_list_subclass
from tinydynamo.variables.lists import TupleVariable
from tinydynamo.variables.misc import GetAttrVariable
from tinydynamo.variables.nn_module import NNModuleVariable
from tinydynamo.variables.torch_function import default_torch_function_variable
from tinydynamo.variables.user_defined import (
    READ_ONLY_BASE_METHODS,
    BaseMethodVariable,
    UserDefinedObjectVariable,
    method_variable,
)

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python (not a C type)


def rebuild_object(cls: type, attrs: dict) -> Any:
    """What the compiled code calls to rebuild an escaping object: its class, no ``__init__``, its attributes."""
    obj = object.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


def is_plain_python_class(cls: type) -> bool:
    """Instances are plain ``__dict__`` objects made by ``object.__new__``: every base but ``object`` is a
    Python class without ``__slots__``, no custom ``__new__``/``__setattr__``/metaclass ``__call__``."""
    if not isinstance(cls, type) or cls is object or type(cls).__call__ is not type.__call__:
        return False
    has_dict = False
    for base in cls.__mro__[:-1]:
        slots = vars(base).get("__slots__")
        if not base.__flags__ & _HEAPTYPE or slots is not None and (isinstance(slots, str) or tuple(slots)):
            return False  # a C base, or real slots (``__slots__ = ()`` as in abc.ABC is fine)
        has_dict = has_dict or slots is None
    setattr_ok = cls.__setattr__ is object.__setattr__ or isinstance(cls.__setattr__, types.FunctionType)
    return has_dict and cls.__new__ is object.__new__ and setattr_ok


def lookup_class_attr(cls: type, name: str) -> tuple[Any, type | None]:
    """``name`` in the class dicts along the MRO (without running descriptors): (value, owner)."""
    for base in cls.__mro__:
        if name in vars(base):
            return vars(base)[name], base
    return None, None


def wrap_class_attr(tx, obj: VariableTracker, cls: type, attr: Any, name: str, source=None) -> VariableTracker:
    """A class attribute reached through ``obj`` (an instance variable): bind it as Python would."""
    if isinstance(attr, staticmethod):
        return VariableTracker.build(tx, attr.__func__, source)
    if isinstance(attr, classmethod):
        return UserMethodVariable(attr.__func__, ConstantVariable(cls))
    if isinstance(attr, property):
        if attr.fget is None:
            unimplemented(f"property {cls.__name__}.{name} has no getter")
        return UserFunctionVariable(attr.fget).call_function(tx, [obj], {})
    if isinstance(attr, types.FunctionType):
        return UserMethodVariable(attr, obj)
    if hasattr(type(attr), "__get__") and not isinstance(attr, (type, types.BuiltinFunctionType)):
        unimplemented(f"descriptor {type(attr).__name__} {cls.__name__}.{name}")
    return VariableTracker.build(tx, attr, source)


class NewObjectVariable(UserDefinedObjectVariable):
    """An instance of a plain Python class created while tracing (see the module docstring).

    ``items`` (attribute name -> variable) is changed in place through ``SideEffects.mutation``,
    so a graph break rolls a half-traced instruction back like it does for lists.
    """

    version = 0
    made_in_frame = True

    def __init__(self, cls: type, cls_source=None):
        VariableTracker.__init__(self, None)
        self.cls = cls
        self.cls_source = cls_source
        self.items: dict[str, VariableTracker] = {}

    @property
    def value(self):
        raise AttributeError("an object made in the frame has no real value at trace time")

    def python_type(self):
        return self.cls

    def _class_source(self, name: str):
        return AttrSource(self.cls_source, name) if self.cls_source is not None else None

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name == "__dict__":
            return ObjectDictVariable(self)
        attr, _ = lookup_class_attr(self.cls, name)
        if hasattr(type(attr), "__set__") and not isinstance(attr, (types.FunctionType, type)):
            return wrap_class_attr(tx, self, self.cls, attr, name)  # a data descriptor (property) wins
        if name in self.items:
            return self.items[name]
        if name == "__class__":
            return ConstantVariable(self.cls, self.cls_source)
        if attr is not None or any(name in vars(b) for b in self.cls.__mro__):
            return wrap_class_attr(tx, self, self.cls, attr, name, self._class_source(name))
        getattr_fn, _ = lookup_class_attr(self.cls, "__getattr__")
        if isinstance(getattr_fn, types.FunctionType):
            return UserMethodVariable(getattr_fn, self).call_function(tx, [ConstantVariable(name)], {})
        raise_observed(AttributeError, f"{self.cls.__name__} object has no attribute {name!r}")

    def var_setattr(self, tx, name: str, value: VariableTracker) -> None:
        if self.cls.__setattr__ is not object.__setattr__:  # a Python __setattr__ (a frozen dataclass raises)

            UserMethodVariable(self.cls.__setattr__, self).call_function(tx, [ConstantVariable(name), value], {})
            return
        self.store(tx, name, value)

    def store(self, tx, name: str, value: VariableTracker) -> None:
        """``object.__setattr__(self, name, value)``: descriptors, then the instance dict."""
        attr, _ = lookup_class_attr(self.cls, name)
        if hasattr(type(attr), "__set__") and not isinstance(attr, (types.FunctionType, type)):
            if isinstance(attr, property) and attr.fset is not None:
                UserFunctionVariable(attr.fset).call_function(tx, [self, value], {})
                return
            unimplemented(f"setting {name!r} on a {self.cls.__name__}: a descriptor of the class")
        tx.output.side_effects.mutation(self)
        self.items[name] = value

    def var_delattr(self, tx, name: str) -> None:
        """``del obj.name``: a Python ``__delattr__`` inlined, a property's deleter called, else the
        attribute leaves ``items`` (AttributeError if it has none, as Python raises)."""
        delattr_fn, _ = lookup_class_attr(self.cls, "__delattr__")
        if isinstance(delattr_fn, types.FunctionType):
            UserMethodVariable(delattr_fn, self).call_function(tx, [ConstantVariable(name)], {})
            return
        attr, _ = lookup_class_attr(self.cls, name)
        if hasattr(type(attr), "__delete__") and not isinstance(attr, (types.FunctionType, type)):
            if isinstance(attr, property) and attr.fdel is not None:
                UserFunctionVariable(attr.fdel).call_function(tx, [self], {})
                return
            unimplemented(f"deleting {name!r} of a {self.cls.__name__}: a descriptor of the class")
        if name not in self.items:
            raise_observed(AttributeError, f"{self.cls.__name__} object has no attribute {name!r}")
        tx.output.side_effects.mutation(self)
        del self.items[name]

    def has_attr(self, name: str) -> bool:
        return name in self.items or any(name in vars(b) for b in self.cls.__mro__)

    def reconstruct(self, codegen) -> str:
        def build():
            if getattr(self, "_rebuilding", False):
                unimplemented(f"a {self.cls.__name__} made in the frame that refers to itself escapes the graph")
            self._rebuilding = True
            attrs = ", ".join(f"{k!r}: {v.reconstruct(codegen)}" for k, v in self.items.items())
            self._rebuilding = False
            return (f"{codegen.constant(rebuild_object, 'rebuild_object')}"
                    f"({codegen.constant(self.cls, 'cls')}, {{{attrs}}})")

        return codegen.shared(self, build)

    def __repr__(self) -> str:
        return f"NewObjectVariable({self.cls.__name__})"


class ObjectDictVariable(DictVariable):
    """``obj.__dict__`` of an object made in the frame: a dict whose contents ARE the object's attributes
    (reads and writes through either are seen by the other, as with the real ``__dict__``)."""

    def __init__(self, obj: NewObjectVariable):
        VariableTracker.__init__(self, None)
        self.obj = obj

    @property
    def items(self) -> dict:
        return self.obj.items

    @items.setter
    def items(self, value: dict) -> None:
        self.obj.items = value

    def reconstruct(self, codegen) -> str:
        return f"{self.obj.reconstruct(codegen)}.__dict__"

    def __repr__(self) -> str:
        return f"ObjectDictVariable({self.obj})"


class SuperVariable(VariableTracker):
    """``super()`` / ``super(cls, obj)``: attribute lookups start after ``cls`` in ``obj``'s MRO."""

    def __init__(self, cls: type, obj: VariableTracker):
        super().__init__(None)
        self.cls = cls
        self.obj = obj

    def var_getattr(self, tx, name: str) -> VariableTracker:
        obj_is_class = isinstance(self.obj, ConstantVariable) and isinstance(self.obj.value, type)
        objtype = self.obj.value if obj_is_class else self.obj.python_type()
        mro = objtype.__mro__
        if self.cls not in mro:
            unimplemented(f"super({self.cls.__name__}, obj): obj is not an instance or subtype")
        for base in mro[mro.index(self.cls) + 1:]:
            if name not in vars(base):
                continue
            attr = vars(base)[name]
            if base is nn.Module and name == "__getattr__" and isinstance(self.obj, NNModuleVariable):
                return ModuleGetattrVariable(self.obj)  # a custom __getattr__ deferring to nn.Module's
            if isinstance(attr, staticmethod):
                return UserFunctionVariable(attr.__func__)
            if isinstance(attr, classmethod):
                default_tf = default_torch_function_variable(attr.__get__(None, objtype))
                if default_tf is not None:  # super().__torch_function__ in a tensor subclass: modelled
                    return default_tf
                return UserMethodVariable(attr.__func__, ConstantVariable(objtype))
            if isinstance(attr, types.FunctionType):
                return UserFunctionVariable(attr) if obj_is_class else method_variable(attr, self.obj)
            if isinstance(attr, property) and attr.fget is not None and not obj_is_class:
                return UserFunctionVariable(attr.fget).call_function(tx, [self.obj], {})
            if base is object and name in ("__init__", "__init_subclass__"):
                return ObjectInitVariable()
            if name == "__init__" and isinstance(self.obj, ExceptionVariable) and issubclass(base, BaseException):
                return BaseExceptionInitVariable(self.obj)  # Exception.__init__(self, *args): sets args
            if base is object and name == "__setattr__" and not obj_is_class:
                return ObjectSetattrVariable(self.obj)

            if (base, name) in READ_ONLY_BASE_METHODS and isinstance(self.obj, UserDefinedObjectVariable):
                return BaseMethodVariable(base, name, self.obj)  # super().get(key) in a dict subclass
            if not (callable(attr) or hasattr(attr, "__get__")):  # a plain class attribute
                return VariableTracker.build(tx, attr)
            unimplemented(f"super().{name}: {type(attr).__name__} of {base.__name__}")
        unimplemented(f"super() has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"SuperVariable({self.cls.__name__}, {self.obj})"


class ModuleGetattrVariable(VariableTracker):
    """``super().__getattr__`` of a module: nn.Module's lookup in its parameter/buffer/submodule tables."""

    def __init__(self, module: NNModuleVariable):
        super().__init__(None)
        self.module = module

    def call_function(self, tx, args, kwargs):
        if len(args) != 1 or kwargs or not args[0].is_python_constant():
            unimplemented("nn.Module.__getattr__ with a name not known at trace time")
        return self.module.module_getattr(tx, args[0].as_python_constant())


class ObjectInitVariable(VariableTracker):
    """``object.__init__`` reached through ``super().__init__()``: does nothing."""

    def call_function(self, tx, args, kwargs):
        return ConstantVariable(None)


def zero_arg_super(tx) -> SuperVariable:
    """``super()`` inside a method: the class from the ``__class__`` cell, the object from the first argument."""
    cell = tx.cells.get("__class__")
    code = tx.code
    if cell is None or code.co_argcount == 0:
        unimplemented("super() without arguments outside a method")
    first = code.co_varnames[0]
    obj = tx.symbolic_locals.get(first) or (tx.cells[first].get() if first in tx.cells else None)
    if obj is None:
        unimplemented("super(): the first argument was deleted")
    cls = cell.get().as_python_constant()
    return SuperVariable(cls, obj)


#: classes folded at trace time when every argument is a constant (pure: no state, no side effects)
PURE_CLASSES = {
    torch.finfo, torch.iinfo, torch.device, torch.Size, torch.dtype, slice, range, frozenset, complex, bytes,
}


def _is_namedtuple_class(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def call_class(tx, cls_var: VariableTracker, args: list[VariableTracker], kwargs: dict) -> VariableTracker:
    """``cls(*args, **kwargs)`` in traced code (see the module docstring for the cases)."""
    cls = cls_var.as_python_constant()
    if cls is super:
        if not args:
            return zero_arg_super(tx)
        if len(args) == 2:
            return SuperVariable(args[0].as_python_constant(), args[1])
        unimplemented("super() with one argument")
    handler = polyfilled.class_handler(cls)
    if handler is not None:
        return handler(tx, args, kwargs)
    constant_args = all(a.is_python_constant() for a in args) and all(v.is_python_constant() for v in kwargs.values())
    if (cls in PURE_CLASSES or isinstance(cls, enum.EnumMeta)) and constant_args:  # Color(1): a member lookup
        try:
            return VariableTracker.build_constant(cls(*[a.as_python_constant() for a in args],
                                            **{k: v.as_python_constant() for k, v in kwargs.items()}))
        except Exception as e:
            unimplemented(f"{cls.__name__}(...) raised {e!r} at trace time")
    if _is_namedtuple_class(cls) and isinstance(cls.__new__, types.FunctionType):
        fields = cls._fields
        defaults = tuple(ConstantVariable(d) for d in (getattr(cls, "_field_defaults", {}) or {}).values())
        code = cls.__new__.__code__  # namedtuple's generated __new__(_cls, a, b): bind like it
        bound = bind_arguments(code, [cls_var, *args], kwargs, defaults, None, cls.__name__)
        return TupleVariable([bound[f] for f in fields], tuple_cls=cls)
    if isinstance(cls, type) and issubclass(cls, nn.Module):
        return _new_module(tx, cls, args, kwargs, constant_args)
    if isinstance(cls, type) and issubclass(cls, torch.Tensor):
        unimplemented(f"creating a {cls.__name__} (a Tensor subclass) in the frame")
    if isinstance(cls, type) and builtin_construction(cls) and not kwargs:  # ValueError("msg"), StopIteration(v)
        return ExceptionVariable.create(cls, args)
    if is_traceable_list_subclass(cls) and not kwargs and len(args) <= 1:  # list.__init__ takes the items
        return ListSubclassVariable(list(args[0].unpack_var_sequence(tx)) if args else [], cls)
    if iter_variables.plain_dict_subclass(cls):  # class Config(OrderedDict): pass
        return iter_variables.dict_subclass(tx, cls, args, kwargs)
    if python_init_exception(cls):  # an exception class with its own Python __init__
        return ExceptionVariable.create_user(tx, cls, args, kwargs)
    if is_plain_python_class(cls):
        if getattr(cls, "__abstractmethods__", None):
            unimplemented(f"{cls.__name__} is abstract (it cannot be instantiated: TypeError)")
        obj = NewObjectVariable(cls, cls_var.source)
        init, _ = lookup_class_attr(cls, "__init__")
        if isinstance(init, types.FunctionType):
            UserMethodVariable(init, obj).call_function(tx, args, kwargs)
        elif args or kwargs:
            unimplemented(f"{cls.__name__}() takes no arguments")
        return obj
    unimplemented(f"creating a {getattr(cls, '__qualname__', cls)} object in the frame "
                  "(a C type, __slots__, or a custom __new__/__setattr__/metaclass)")


def _new_module(tx, cls, args, kwargs, constant_args: bool) -> VariableTracker:
    """``nn.Softmax(dim=1)`` in forward: built at trace time when it has no parameters or buffers
    (its output then only depends on the inputs), else Unsupported (fresh random weights each call)."""
    if not constant_args:
        unimplemented(f"building a {cls.__name__} in the frame from non-constant arguments")
    module = cls(*[a.as_python_constant() for a in args], **{k: v.as_python_constant() for k, v in kwargs.items()})
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        unimplemented(f"building a {cls.__name__} with parameters inside the compiled frame "
                      "(new random weights on every call)", hint="build it in __init__")
    tx.output.side_effects._keepalive.append(module)
    var = NNModuleVariable(module, None)
    var.construction = (cls, tuple(a.as_python_constant() for a in args),
                        {k: v.as_python_constant() for k, v in kwargs.items()})  # to rebuild it if returned
    return var


class ObjectSetattrVariable(VariableTracker):
    """``object.__setattr__`` (what a frozen dataclass's ``__init__`` and ``super().__setattr__`` call):
    the plain store, bypassing the class's own ``__setattr__``."""

    def __init__(self, bound: VariableTracker | None = None):
        super().__init__(None)
        self.bound = bound

    def call_function(self, tx, args, kwargs):
        args = [self.bound, *args] if self.bound is not None else list(args)
        if len(args) != 3 or kwargs or not args[1].is_python_constant():
            unimplemented("object.__setattr__ with unexpected arguments")
        obj, name, value = args
        if isinstance(obj, UserDefinedObjectVariable):  # made in the frame, or from outside: the plain store
            obj.store(tx, name.as_python_constant(), value)
        else:
            obj.var_setattr(tx, name.as_python_constant(), value)
        return ConstantVariable(None)


def class_attribute(tx, cls_var: VariableTracker, name: str, value: Any):
    """``Cls.name``: functions, classmethods and staticmethods are wrapped to be inlined (with a
    guarded source when the class has one); other attributes as values."""
    cls = cls_var.value
    source = AttrSource(cls_var.source, name) if cls_var.source is not None else None
    if cls is object and name == "__setattr__":
        return ObjectSetattrVariable()
    if name == "apply" and _is_autograd_function(cls):
        return AutogradFunctionApplyVariable(cls, source)
    if isinstance(value, (types.FunctionType, types.MethodType)) or (
            not callable(value) and source is not None):
        return VariableTracker.build(tx, value, source)
    if callable(value) and not isinstance(value, type):
        replacement = polyfilled.variable_for(value, source)
        if replacement is not None:
            return replacement
        return GetAttrVariable(cls_var, name)
    return VariableTracker.build_constant(value)


def _is_autograd_function(cls: type) -> bool:
    return issubclass(cls, torch.autograd.Function)


register_construction(call_class=call_class, class_attribute=class_attribute)
