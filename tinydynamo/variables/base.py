"""VariableTracker: what the symbolic interpreter keeps on its stack instead of a real value.

Every value the interpreter meets is one of these: a tensor (an FX node plus a fake example
value), a Python constant, a list, a module, a function to inline... Each subclass knows how
to answer the few questions Python bytecode asks of a value: an attribute, a call, a method
call, iteration, truthiness, and how to rebuild it after the graph has run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from tinydynamo.exc import unimplemented
from tinydynamo.source import Source

if TYPE_CHECKING:
    from tinydynamo.symbolic_convert import InstructionTranslatorBase as Tx


# How trackers are made from Python values. The builder makes every kind of tracker, so it sits above
# them all; trackers call it through this registry, which tinydynamo.variables.builder fills in when it is
# imported (the interpreter, symbolic_convert, imports the builder, so it is set whenever a frame is traced).
_construction: dict[str, Callable[..., Any]] = {}


def register_construction(**functions: Callable[..., Any]) -> None:
    """Called once by the builder module (``build``, ``build_constant``, ``build_fx``) and by the
    builtin module (``BuiltinVariable``)."""
    _construction.update(functions)


def constructor(name: str) -> Any:
    """A tracker class of a module above the caller, registered by that module when it is imported
    (``BuiltinVariable``: a list's ``in`` and a symbolic size's arithmetic are builtin calls)."""
    return _construction[name]


class VariableTracker:
    """Base class. ``source`` says where the value came from (for guards and rebuilding), if known."""

    def __init__(self, source: Source | None = None):
        self.source = source

    # ---- construction (implemented by the builder) -------------------------------------------
    @staticmethod
    def build(tx: "Tx", value: Any, source: Source | None = None) -> "VariableTracker":
        """Wrap a Python value as a tracker, guarded on ``source`` if given (VariableBuilder.wrap)."""
        return _construction["build"](tx, value, source)

    @staticmethod
    def build_constant(value: Any) -> "VariableTracker":
        """Wrap the result of a trace-time (folded) computation: no source, no guards."""
        return _construction["build_constant"](value)

    @staticmethod
    def build_fx(output: Any, node: Any, example: Any) -> "VariableTracker":
        """Wrap what a graph node produced at trace time (its fake value)."""
        return _construction["build_fx"](output, node, example)

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

    def call_function(self, tx: "Tx", args: list["VariableTracker"], kwargs: dict[str, "VariableTracker"]) -> "VariableTracker":
        unimplemented(f"call of {self}")

    def call_method(self, tx: "Tx", name: str, args: list["VariableTracker"], kwargs: dict[str, "VariableTracker"]) -> "VariableTracker":
        unimplemented(f"method {name!r} of {self}")

    def unpack_var_sequence(self, tx: "Tx") -> list["VariableTracker"]:
        unimplemented(f"iterating over {self}")

    def truth(self, tx: "Tx") -> bool:
        """``bool(value)``, for jumps; a value only known at run time cannot answer."""
        unimplemented(f"truth value of {self}")

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


class NullVariable(VariableTracker):
    """The NULL that CPython pushes in one of CALL's two call slots (see tinydynamo.bytecode)."""

    def __repr__(self) -> str:
        return "NULL"


NULL = NullVariable()
