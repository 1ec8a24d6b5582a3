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
