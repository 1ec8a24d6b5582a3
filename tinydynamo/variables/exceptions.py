"""Exception objects in traced code: raised (and maybe caught) there, or built there (``ValueError("x")``).

An exception the traced code raises travels as an :class:`~tinydynamo.exc.ObservedException` (the
translator follows the code's exception table to an ``except`` that catches it); on the stack it
is an :class:`ExceptionVariable`. One built by calling an exception class whose construction is
Python's own (a builtin exception, or a subclass that defines no ``__init__`` / ``__new__``) keeps
its arguments, so ``raise KeyError(k)``, ``e.args`` and ``StopIteration(v).value`` work.

Layer: above lists (``e.args`` is a tuple) and constant.
"""
from __future__ import annotations

import types

from tinydynamo.exc import ObservedException, unimplemented
from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.lists import TupleVariable


def builtin_construction(cls: type) -> bool:
    """``cls(*args)`` only stores ``args`` (no ``__init__`` / ``__new__`` written in Python on the way)."""
    return issubclass(cls, BaseException) and not any(
        isinstance(k.__dict__.get(name), (types.FunctionType, staticmethod, classmethod))
        for k in cls.__mro__ for name in ("__init__", "__new__", "__setattr__", "__getattribute__"))


class ExceptionVariable(VariableTracker):
    """An exception object in traced code: its type, message and (when built here) its arguments."""

    def __init__(self, exc: ObservedException):
        super().__init__(None)
        self.exc = exc

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
        unimplemented(f"attribute {name!r} of the exception {self}")

    def reconstruct(self, codegen) -> str:
        args = ", ".join(a.reconstruct(codegen) for a in self._args())
        return f"{codegen.constant(self.exc.exc_type, self.exc.exc_type.__name__)}({args})"

    def __repr__(self) -> str:
        return f"ExceptionVariable({self.exc.exc_type.__name__})"
