"""PolyfilledFunctionVariable: a library function traced through its Python reimplementation.

Calling it inlines the polyfill (``tinydynamo.polyfills``); everywhere else it is the original
function: ``fn is functools.reduce`` holds, and after a graph break the compiled code calls the
original natively (calling the polyfill there would trace it again, and again).
"""
from __future__ import annotations

import types

from tinydynamo.variables.functions import UserFunctionVariable


class PolyfilledFunctionVariable(UserFunctionVariable):
    def __init__(self, original, polyfill: types.FunctionType, source=None):
        super().__init__(polyfill, None)  # the polyfill's defaults/closure are not the user's: no source
        self.original = original
        self.original_source = source

    def as_python_constant(self):
        return self.original

    def reconstruct(self, codegen) -> str:
        if self.original_source is not None:
            return codegen.source_expr(self.original_source)
        return codegen.constant(self.original, "fn")

    def __repr__(self) -> str:
        return f"PolyfilledFunctionVariable({getattr(self.original, '__qualname__', self.original)})"
