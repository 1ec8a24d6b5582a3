"""Exception objects in traced code: raised (and maybe caught) there, or built there (``ValueError("x")``).

An exception the traced code raises travels as an :class:`~tinydynamo.exc.ObservedException` (the
translator follows the code's exception table to an ``except`` that catches it); on the stack it
is an :class:`ExceptionVariable`. One built by calling an exception class whose construction is
Python's own (a builtin exception, or a subclass that defines no ``__init__`` / ``__new__``) keeps
its arguments, so ``raise KeyError(k)``, ``e.args`` and ``StopIteration(v).value`` work. A subclass
with its own Python ``__init__`` (:func:`python_init_exception`) is made as ``BaseException.__new__``
makes it (``args`` = the positional arguments) and its ``__init__`` is inlined on it: attributes it
sets, and ``super().__init__(...)`` resetting ``args``, are traced; methods and properties of the
class are inlined too.

Layer: above lists (``e.args`` is a tuple) and constant.
"""
from __future__ import annotations

import types
from typing import Any

from tinydynamo.exc import ObservedException, unimplemented
from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.functions import UserFunctionVariable, UserMethodVariable
from tinydynamo.variables.lists import TupleVariable

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python


def builtin_construction(cls: type) -> bool:
    """``cls(*args)`` only stores ``args`` (no ``__init__`` / ``__new__`` written in Python on the way)."""
    return issubclass(cls, BaseException) and not any(
        isinstance(k.__dict__.get(name), (types.FunctionType, staticmethod, classmethod))
        for k in cls.__mro__ for name in ("__init__", "__new__", "__setattr__", "__getattribute__"))


def python_init_exception(cls: type) -> bool:
    """An exception class whose instances are plain: builtin exception bases and Python subclasses
    (no real ``__slots__``), a Python ``__init__`` somewhere, no custom ``__new__`` / ``__setattr__`` /
    ``__getattribute__`` / metaclass: ``BaseException.__new__`` then the inlined ``__init__`` build it."""
    if not (isinstance(cls, type) and issubclass(cls, BaseException)) or type(cls) is not type:
        return False
    for k in cls.__mro__:
        if not k.__flags__ & _HEAPTYPE:
            continue  # BaseException, Exception, ValueError...: builtin bases (their dicts are C slots)
        slots = vars(k).get("__slots__")
        if slots is not None and (isinstance(slots, str) or tuple(slots)):
            return False
        if any(name in vars(k) for name in ("__new__", "__setattr__", "__getattribute__", "__getattr__")):
            return False
    return any(isinstance(vars(k).get("__init__"), types.FunctionType) for k in cls.__mro__)


def rebuild_exception(cls: type, args: tuple, attrs: dict) -> BaseException:
    """What the compiled code calls to rebuild an exception made in the frame: ``BaseException.__new__``
    with its arguments (no ``__init__``: its effects are ``attrs``)."""
    exc = BaseException.__new__(cls, *args)
    exc.__dict__.update(attrs)
    return exc


class ExceptionVariable(VariableTracker):
    """An exception object in traced code: its type, message and (when built here) its arguments,
    and the attributes the traced code set on it (kept on the ObservedException, which every tracker
    of this exception shares: the handler that catches it gets a new tracker of the same one)."""

    def __init__(self, exc: ObservedException):
        super().__init__(None)
        self.exc = exc

    @staticmethod
    def create_user(tx, cls: type, args: list[VariableTracker], kwargs: dict) -> "ExceptionVariable":
        """``cls(*args, **kwargs)`` of a :func:`python_init_exception` class: its ``__init__`` inlined."""
        var = ExceptionVariable(ObservedException(cls, ""))
        var.exc.arg_vars = list(args)  # what BaseException.__new__ stores; __init__ may call super().__init__
        var.exc.attr_items = {}
        init = next(vars(k)["__init__"] for k in cls.__mro__ if "__init__" in vars(k))
        if isinstance(init, types.FunctionType):
            UserMethodVariable(init, var).call_function(tx, list(args), dict(kwargs))
        elif kwargs:
            unimplemented(f"{cls.__name__}() takes no keyword arguments")
        return var

    # the attributes set in the frame, as a journaled container (side_effects.mutation rolls them back)
    @property
    def items(self) -> dict:
        if getattr(self.exc, "attr_items", None) is None:
            self.exc.attr_items = {}
        return self.exc.attr_items

    @items.setter
    def items(self, value: dict) -> None:
        self.exc.attr_items = value

    @property
    def version(self) -> int:
        return getattr(self.exc, "attr_version", 0)

    @version.setter
    def version(self, value: int) -> None:
        self.exc.attr_version = value

    def var_setattr(self, tx, name: str, value: VariableTracker) -> None:
        if name in ("args", "__context__", "__cause__", "__traceback__", "__suppress_context__") \
                or name.startswith("__"):
            unimplemented(f"setting {name!r} on the exception {self}")
        tx.output.side_effects.mutation(self)
        self.items[name] = value

    def _class_attribute(self, tx, name: str) -> VariableTracker | None:
        """A method, property or plain attribute a Python class of the exception defines."""
        for k in self.exc.exc_type.__mro__:
            if not k.__flags__ & _HEAPTYPE or name not in vars(k):
                continue
            attr: Any = vars(k)[name]
            if isinstance(attr, types.FunctionType):
                return UserMethodVariable(attr, self)
            if isinstance(attr, staticmethod):
                return UserFunctionVariable(attr.__func__)
            if isinstance(attr, classmethod):
                return UserMethodVariable(attr.__func__, ConstantVariable(self.exc.exc_type))
            if isinstance(attr, property) and attr.fget is not None:
                return UserFunctionVariable(attr.fget).call_function(tx, [self], {})
            if isinstance(attr, (int, float, str, bool, type(None), tuple)):
                return VariableTracker.build_constant(attr)
            unimplemented(f"attribute {name!r} of the exception class {k.__name__}: a {type(attr).__name__}")
        return None

    @staticmethod
    def create(cls: type, args: list[VariableTracker]) -> "ExceptionVariable":
        """``cls(*args)`` built in the frame (``builtin_construction(cls)``)."""
        message = str(args[0].as_python_constant()) if len(args) == 1 and args[0].is_python_constant() else ""
        exc = ObservedException(cls, message)
        exc.arg_vars = list(args)
        return ExceptionVariable(exc)

    def python_type(self):
        return self.exc.exc_type

    def _args(self) -> list[VariableTracker]:
        args = getattr(self.exc, "arg_vars", None)
        real = getattr(self.exc, "real_args", None)  # an operation folded at trace time raised it
        if args is None and real is not None and all(isinstance(a, (str, int, float, bool, type(None))) for a in real):
            args = self.exc.arg_vars = [ConstantVariable(a) for a in real]
        if args is None:
            unimplemented(f"the arguments of {self} (raised by an operation, not built in the frame)")
        return args

    def var_getattr(self, tx, name: str) -> VariableTracker:
        attrs = getattr(self.exc, "attr_items", None)
        if attrs and name in attrs:
            return attrs[name]
        if name == "args":
            return TupleVariable(list(self._args()))
        if name == "value" and issubclass(self.exc.exc_type, StopIteration):
            args = self._args()
            return args[0] if args else ConstantVariable(None)
        if name in ("__context__", "__cause__"):  # set where the traced code raised it (symbolic_convert)
            linked = getattr(self.exc, "context" if name == "__context__" else "cause", None)
            if isinstance(linked, ExceptionVariable) or (linked is not None and linked.is_python_constant()
                                                         and linked.as_python_constant() is None):
                return linked
            if linked is None:
                return ConstantVariable(None)
            unimplemented(f"{name} of {self}: {linked} is not an exception object")
        if name == "__suppress_context__":
            return ConstantVariable(getattr(self.exc, "suppress_context", False))
        if name == "__class__":
            return ConstantVariable(self.exc.exc_type)
        found = self._class_attribute(tx, name)
        if found is not None:
            return found
        unimplemented(f"attribute {name!r} of the exception {self}")

    def reconstruct(self, codegen) -> str:
        args = ", ".join(a.reconstruct(codegen) for a in self._args())
        cls = codegen.constant(self.exc.exc_type, self.exc.exc_type.__name__)
        attrs = getattr(self.exc, "attr_items", None)
        if attrs is None:
            return f"{cls}({args})"
        items = ", ".join(f"{k!r}: {v.reconstruct(codegen)}" for k, v in attrs.items())
        return f"{codegen.constant(rebuild_exception, 'rebuild_exception')}({cls}, ({args}{',' if args else ''}), {{{items}}})"

    def __repr__(self) -> str:
        return f"ExceptionVariable({self.exc.exc_type.__name__})"


class BaseExceptionInitVariable(VariableTracker):
    """``super().__init__(*args)`` reaching a builtin exception's ``__init__``: it sets ``args``."""

    def __init__(self, exc_var: ExceptionVariable):
        super().__init__(None)
        self.exc_var = exc_var

    def call_function(self, tx, args, kwargs):
        if kwargs:
            unimplemented(f"{self.exc_var.exc.exc_type.__name__}.__init__() takes no keyword arguments")
        self.exc_var.exc.arg_vars = list(args)
        return ConstantVariable(None)
