"""Context managers that change nothing the graph can see: ``torch.profiler.record_function``,
``contextlib.nullcontext``. ``with`` blocks over them are traced straight through (TorchDynamo
also ignores ``record_function`` in the graph, with a warning)."""
from __future__ import annotations

from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.constant import ConstantVariable


class NullContextVariable(VariableTracker):
    def __init__(self, what: str, enter_result: VariableTracker | None = None):
        super().__init__(None)
        self.what = what
        self.enter_result = enter_result or ConstantVariable(None)

    def enter(self, tx) -> VariableTracker:
        return self.enter_result

    def exit(self, tx) -> VariableTracker:
        return ConstantVariable(None)

    def call_method(self, tx, name, args, kwargs):
        if name == "__enter__":
            return self.enter(tx)
        if name == "__exit__":
            return self.exit(tx)
        return super().call_method(tx, name, args, kwargs)

    def __repr__(self) -> str:
        return f"NullContextVariable({self.what})"


def record_function(tx, args, kwargs):
    return NullContextVariable("record_function")


def nullcontext(tx, args, kwargs):
    return NullContextVariable("nullcontext", args[0] if args else kwargs.get("enter_result"))


class GradModeWrappedVariable(VariableTracker):
    """A function decorated in the frame with ``torch.no_grad()`` / ``enable_grad()``: calling it
    enters the mode, inlines the function, and leaves the mode."""

    def __init__(self, mode: bool, fn: VariableTracker):
        super().__init__(None)
        self.mode = mode
        self.fn = fn

    def call_function(self, tx, args, kwargs):
        from tinydynamo.variables.ctx_manager import GradModeVariable

        ctx = GradModeVariable(self.mode)
        ctx.enter(tx)
        result = self.fn.call_function(tx, args, kwargs)
        ctx.exit(tx)
        return result


class UserContextManagerVariable(VariableTracker):
    """``with obj:`` on a user object whose class defines ``__enter__``/``__exit__`` in Python: both are
    inlined (a graph break inside the block is not resumable: the frame runs eagerly)."""

    def __init__(self, obj: VariableTracker):
        super().__init__(None)
        self.obj = obj

    def enter(self, tx) -> VariableTracker:
        return self.obj.call_method(tx, "__enter__", [], {})

    def exit(self, tx) -> VariableTracker:
        none = ConstantVariable(None)
        return self.obj.call_method(tx, "__exit__", [none, none, none], {})
