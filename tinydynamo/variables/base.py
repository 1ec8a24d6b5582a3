"""VariableTracker: what the symbolic interpreter keeps on its stack instead of a real value.

Every value the interpreter meets is one of these: a tensor (an FX node plus a fake example
value), a Python constant, a list, a module, a function to inline... Each subclass knows how
to answer the few questions Python bytecode asks of a value: an attribute, a call, a method
call, iteration, truthiness, and how to rebuild it after the graph has run.

Layer: the bottom of the values layer; every tracker module imports it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from tinydynamo.exc import unimplemented
from tinydynamo.source import Source

if TYPE_CHECKING:
    from tinydynamo.symbolic_convert import InstructionTranslatorBase as Tx


# ---- trackers made by a higher layer ------------------------------------------------------------
# The trackers are layered (tinydynamo.LAYERS): each module imports only the ones below it. Yet a tracker
# sometimes has to make one of a higher layer: folding a value met at trace time wraps it (the builder
# makes every kind of tracker), a list's ``in`` is a builtin call, ``*args`` of an inlined function is a
# tuple, calling a class makes a new object. The module that makes it registers it here by name when it
# is imported, and the lower module asks for it by that name. The package's __init__ (which Python runs
# before any module of the package) imports them all, so every name is registered before a tracker is used.
#: name -> the module that registers it
REGISTERED_BY = {
    "build": "builder", "build_constant": "builder", "build_fx": "builder",
    "call_class": "objects", "class_attribute": "objects",
    "BuiltinVariable": "builtin", "tensor_numpy": "numpy", "DictVariable": "dicts", "TupleVariable": "lists",
}
_construction: dict[str, Callable[..., Any]] = {}


def register_construction(**functions: Callable[..., Any]) -> None:
    """Called by the modules of :data:`REGISTERED_BY` when they are imported."""
    _construction.update(functions)


def constructor(name: str) -> Any:
    """The tracker class or function ``name`` of a module above the caller (see :data:`REGISTERED_BY`)."""
    try:
        return _construction[name]
    except KeyError:
        module = REGISTERED_BY.get(name, "?")
        raise LookupError(f"{name} is registered by tinydynamo.variables.{module} when it is imported, which "
                          "tinydynamo/variables/__init__.py does: was a module of the package loaded on its own?") from None


class VariableTracker:
    """Base class. ``source`` says where the value came from (for guards and rebuilding), if known."""

    def __init__(self, source: Source | None = None):
        self.source = source

    # ---- construction (implemented by the builder) -------------------------------------------
    @staticmethod
    def build(tx: "Tx", value: Any, source: Source | None = None) -> "VariableTracker":
        """Wrap a Python value as a tracker, guarded on ``source`` if given (VariableBuilder.wrap)."""
        return constructor("build")(tx, value, source)

    @staticmethod
    def build_constant(value: Any) -> "VariableTracker":
        """Wrap the result of a trace-time (folded) computation: no source, no guards."""
        return constructor("build_constant")(value)

    @staticmethod
    def build_fx(output: Any, node: Any, example: Any) -> "VariableTracker":
        """Wrap what a graph node produced at trace time (its fake value)."""
        return constructor("build_fx")(output, node, example)

    # ---- what is it? ------------------------------------------------------------------------
    def python_type(self) -> type:
        unimplemented(f"python_type of {self}")

    def is_python_constant(self) -> bool:
        try:
            self.as_python_constant()
            return True
        except Exception:
            return False

    def as_python_constant(self) -> Any:
        unimplemented(f"{self} is not a Python constant")

    # ---- the questions bytecode asks ---------------------------------------------------------
    def var_getattr(self, tx: "Tx", name: str) -> "VariableTracker":
        unimplemented(f"attribute {name!r} of {self}")

    def var_setattr(self, tx: "Tx", name: str, value: "VariableTracker") -> None:
        """``self.name = value`` (STORE_ATTR): recorded as a side effect where it can be replayed."""
        unimplemented(f"setting attribute {name!r} on {self} (a side effect outside the graph)")

    def var_delattr(self, tx: "Tx", name: str) -> None:
        """``del self.name`` / ``delattr(self, name)`` (DELETE_ATTR): a side effect, like a store."""
        unimplemented(f"deleting attribute {name!r} of {self}")

    def call_function(self, tx: "Tx", args: list["VariableTracker"], kwargs: dict[str, "VariableTracker"]) -> "VariableTracker":
        unimplemented(f"call of {self}")

    def call_method(self, tx: "Tx", name: str, args: list["VariableTracker"], kwargs: dict[str, "VariableTracker"]) -> "VariableTracker":
        unimplemented(f"method {name!r} of {self}")

    def unpack_var_sequence(self, tx: "Tx") -> list["VariableTracker"]:
        unimplemented(f"iterating over {self}")

    def truth(self, tx: "Tx") -> bool:
        """``bool(value)``, for jumps; a value only known at run time cannot answer."""
        unimplemented(f"truth value of {self}")

    def key_identity(self) -> Any:
        """The object this value hashes by as a dict key or set element when it is not a constant
        (a tensor, a module, a plain user object hash by identity), or None: not usable as a key
        at trace time (see ``dicts.dict_key``)."""
        return None

    # ---- graph plumbing -------------------------------------------------------------------------
    def as_node_arg(self) -> Any:
        """This value as an argument of an FX node (nodes for tensors, plain values otherwise)."""
        return self.as_python_constant()

    def as_example(self) -> Any:
        """This value with tensors replaced by their fake example values (to run ops at trace time)."""
        return self.as_python_constant()

    def reconstruct(self, codegen) -> str:
        """A Python expression that rebuilds this value after the graph ran (see OutputGraph)."""
        if self.source is not None:
            return codegen.source_expr(self.source)
        if self.is_python_constant():
            return codegen.constant(self.as_python_constant())
        if hasattr(self, "fn") and not hasattr(self, "code"):  # builtins, torch functions
            return codegen.constant(self.fn, "fn")
        unimplemented(f"returning {self} from a compiled frame")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


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


class DeletedAttribute(VariableTracker):
    """What ``obj.name`` holds after ``del obj.name`` in the frame: nothing (a read finds the class
    attribute or raises AttributeError); replayed after the graph as ``obj.__dict__.pop(name, None)``."""

    def reconstruct(self, codegen) -> str:
        raise AssertionError("a deleted attribute is replayed as a pop, never rebuilt")

    def __repr__(self) -> str:
        return "DeletedAttribute()"


DELETED = DeletedAttribute()


class NullVariable(VariableTracker):
    """The NULL that CPython pushes in one of CALL's two call slots (see tinydynamo.bytecode)."""

    def __repr__(self) -> str:
        return "NULL"


NULL = NullVariable()
