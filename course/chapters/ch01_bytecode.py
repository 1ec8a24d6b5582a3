"""Chapter 1's helpers: display only (not exercises).

``StackMachine(verbose=True)`` prints each instruction with the value stack after it, drawn by
:func:`show_stack`.
"""
from __future__ import annotations

import types
from typing import Any


def show_stack(stack: list) -> str:
    """The value stack in one short line: tensors by shape, functions by dotted name."""
    def one(v: Any) -> str:
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            return f"Tensor{list(v.shape)}"
        if isinstance(v, types.ModuleType):
            return f"module {v.__name__}"
        if callable(v) and hasattr(v, "__name__"):
            owner = getattr(v, "__self__", None)
            if hasattr(owner, "shape"):
                return f"Tensor.{v.__name__} (bound)"
            module = getattr(v, "__module__", None)
            return f"{module}.{v.__name__}" if module and module != "builtins" else v.__name__
        text = repr(v)
        return text if len(text) <= 24 else text[:21] + "..."

    return "[" + ", ".join(one(v) for v in stack) + "]"
